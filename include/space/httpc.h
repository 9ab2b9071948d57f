/* A small blocking HTTP/1.1 client for the project's own tools (the CLI, the benchmarks, the
 * tests) talking to the gateway: one request per connection (Connection: close), IPv4
 * host:port, optional bearer key, a JSON body, response de-chunked. Not for the open
 * internet: no TLS, no redirects, responses held in memory up to max_response bytes.
 * Files: a request body can be streamed from a callback and a successful (2xx) response body
 * streamed to one, so neither is ever whole in memory. */
#ifndef SPACE_HTTPC_H
#define SPACE_HTTPC_H

#include <stddef.h>

typedef struct {
    int status;
    char *headers; /* raw header block (status line included), heap */
    char *body;    /* heap, NUL-terminated */
    size_t body_len;
} sp_httpc_resp_t;

typedef struct {
    const char *host; /* dotted IPv4, e.g. "127.0.0.1" */
    int port;
    const char *method;
    const char *path;          /* with query */
    const char *key;           /* bearer key or NULL; never logged */
    const char *extra_headers; /* "Name: value\r\n..." or NULL */
    const char *body;          /* sent as application/json, or NULL */
    size_t body_len;
    int timeout_ms;           /* whole exchange; 0 = 120 s */
    size_t max_response;      /* 0 = 64 MiB */
    const char *content_type; /* of body or body_read; NULL = application/json */
    /* Streams the body instead of `body`: called for up to len bytes into buf, returns how many
     * (0 only at the end) or < 0 to abort (that value is returned). Exactly body_read_len bytes
     * are sent (Content-Length). */
    long long (*body_read)(void *arg, void *buf, size_t len);
    unsigned long long body_read_len;
    void *body_arg;
    /* Receives the body of a 2xx response as it arrives (ret->body stays empty); < 0 aborts.
     * Other statuses are kept in ret->body as usual (error JSON). */
    int (*body_sink)(void *arg, const void *data, size_t len);
    void *sink_arg;
} sp_httpc_req_t;

/* 0 and the response, or -errno / SP_ETIMEOUT / SP_ETOOBIG / SP_EDECODE (malformed response).
 * A server that answers before reading the whole body (413) still yields its answer. */
int sp_httpc_do(const sp_httpc_req_t *req, sp_httpc_resp_t *ret);
void sp_httpc_resp_free(sp_httpc_resp_t *r);

/* Streams a response body: fn gets the (de-chunked) bytes as they arrive and returns nonzero
 * to stop early (the connection is then closed: a client that goes away). ret gets the status
 * and headers; a non-2xx answer's body is collected into ret->body instead of streamed.
 * req->timeout_ms is the idle limit between reads here (0 = none). 0 at the end of the body
 * or when fn stopped; < 0 as sp_httpc_do. */
typedef int (*sp_httpc_data_fn)(void *arg, const char *data, size_t len);
int sp_httpc_stream(const sp_httpc_req_t *req, sp_httpc_resp_t *ret, sp_httpc_data_fn fn,
                    void *arg);
/* Header value (case-insensitive name) into out; 0 if found, SP_ENOTFOUND otherwise. */
int sp_httpc_header(const sp_httpc_resp_t *r, const char *name, char *out, size_t len);
/* Splits "http://HOST:PORT[/...]" into host (dotted IPv4) and port. */
int sp_httpc_parse_url(const char *url, char *host, size_t host_len, int *ret_port);

#endif
