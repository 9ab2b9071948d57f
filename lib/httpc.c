/* The tools' HTTP client (httpc.h). */
#include "httpc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "buf.h"
#include "error.h"
#include "ids.h"
#include "xmalloc.h"

/* Waits for fd to be ready for events until deadline (monotonic ns). */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = (deadline - sp_mono_ns()) / 1000000;
        if (left <= 0)
            return SP_ETIMEOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)(left > 60000 ? 60000 : left));
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -errno;
    }
}

/* Sends everything unless the server stops reading (it may answer early, e.g. 413 to a body
 * it will not take, and close): then the response is what counts. */
static int send_all(int fd, const char *p, size_t n, int64_t deadline)
{
    while (n > 0) {
        int rc = wait_fd(fd, POLLOUT, deadline);
        if (rc < 0)
            return rc;
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
            return 1;
        if (w <= 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Streams the request body from req->body_read: exactly body_read_len bytes. */
static int send_stream(int fd, const sp_httpc_req_t *req, int64_t deadline)
{
    static __thread char buf[65536];
    unsigned long long left = req->body_read_len;
    while (left > 0) {
        size_t want = left < sizeof(buf) ? (size_t)left : sizeof(buf);
        long long n = req->body_read(req->body_arg, buf, want);
        if (n < 0)
            return (int)n;
        if (n == 0 || (size_t)n > want)
            return -EIO; /* the source ended early (or lied): Content-Length cannot hold */
        int rc = send_all(fd, buf, (size_t)n, deadline);
        if (rc != 0)
            return rc; /* 1: the server answered early; its answer is what counts */
        left -= (unsigned long long)n;
    }
    return 0;
}

/* De-chunks body in place (RFC 9112 section 7.1); SP_EDECODE when malformed. */
static int dechunk(char *body, size_t len, size_t *ret_len)
{
    size_t in = 0, out = 0;
    for (;;) {
        char *end = NULL;
        if (in >= len)
            return SP_EDECODE;
        unsigned long long n = strtoull(body + in, &end, 16);
        char *crlf = memmem(body + in, len - in, "\r\n", 2);
        if (!crlf || end == body + in)
            return SP_EDECODE;
        in = (size_t)(crlf - body) + 2;
        if (n == 0)
            break;
        if (n > len - in)
            return SP_EDECODE;
        memmove(body + out, body + in, n);
        out += n;
        in += n + 2;
    }
    body[out] = '\0';
    *ret_len = out;
    return 0;
}

/* Connects and sends the request; the socket (>= 0), or < 0. */
static int open_and_send(const sp_httpc_req_t *req, int64_t deadline)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)req->port)};
    sp_buf_t out;
    int rc;

    if (inet_pton(AF_INET, req->host, &sa.sin_addr) != 1)
        return -EINVAL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    sp_buf_init(&out);
    sp_buf_printf(&out, "%s %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n", req->method,
                  req->path, req->host, req->port);
    if (req->key)
        sp_buf_printf(&out, "Authorization: Bearer %s\r\n", req->key);
    const char *ctype = req->content_type ? req->content_type : "application/json";
    if (req->body_read)
        sp_buf_printf(&out, "Content-Type: %s\r\nContent-Length: %llu\r\n", ctype,
                      req->body_read_len);
    else if (req->body)
        sp_buf_printf(&out, "Content-Type: %s\r\nContent-Length: %zu\r\n", ctype, req->body_len);
    if (req->extra_headers)
        sp_buf_puts(&out, req->extra_headers);
    sp_buf_puts(&out, "\r\n");
    rc = send_all(fd, out.data, out.len, deadline);
    if (rc == 0 && req->body_read)
        rc = send_stream(fd, req, deadline);
    else if (rc == 0 && req->body)
        rc = send_all(fd, req->body, req->body_len, deadline);
    explicit_bzero(out.data, out.len); /* it held the key */
    sp_buf_dispose(&out);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

typedef struct {
    const sp_httpc_req_t *req;
    int rc;
} sink_t;

static int to_sink(void *arg, const char *data, size_t len)
{
    sink_t *k = arg;
    k->rc = k->req->body_sink(k->req->sink_arg, data, len);
    return k->rc < 0;
}

int sp_httpc_do(const sp_httpc_req_t *req, sp_httpc_resp_t *ret)
{
    if (req->body_sink) {
        /* A 2xx body goes to the sink as it arrives (sp_httpc_stream, whole-exchange timeout
         * taken as the idle limit). */
        sink_t k = {.req = req, .rc = 0};
        int rc = sp_httpc_stream(req, ret, to_sink, &k);
        if (k.rc < 0 || rc < 0)
            sp_httpc_resp_free(ret); /* a failed exchange leaves nothing to free */
        return k.rc < 0 ? k.rc : rc;
    }
    int64_t deadline =
        sp_mono_ns() + (int64_t)(req->timeout_ms ? req->timeout_ms : 120000) * 1000000;
    size_t max = req->max_response ? req->max_response : 64u * 1024 * 1024;
    sp_buf_t in;
    int fd = -1, rc;

    memset(ret, 0, sizeof(*ret));
    sp_buf_init(&in);
    fd = open_and_send(req, deadline);
    if (fd < 0) {
        rc = fd;
        goto out;
    }

    char chunk[65536];
    for (;;) {
        if ((rc = wait_fd(fd, POLLIN, deadline)) < 0)
            goto out;
        ssize_t n = recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0 && errno == ECONNRESET && in.len > 0)
            break; /* answered, then reset because we were still sending */
        if (n < 0) {
            rc = -errno;
            goto out;
        }
        if (n == 0)
            break;
        if (in.len + (size_t)n > max) {
            rc = SP_ETOOBIG;
            goto out;
        }
        sp_buf_append(&in, chunk, (size_t)n);
    }

    char *sep = in.data ? strstr(in.data, "\r\n\r\n") : NULL;
    if (!sep || sscanf(in.data, "HTTP/1.%*d %3d", &ret->status) != 1) { /* NOLINT(cert-err34-c) */
        rc = SP_EDECODE;
        goto out;
    }
    ret->headers = sp_xstrndup(in.data, (size_t)(sep - in.data) + 2);
    size_t blen = in.len - (size_t)(sep + 4 - in.data);
    ret->body = sp_xmalloc(blen + 1);
    memcpy(ret->body, sep + 4, blen);
    ret->body[blen] = '\0';
    ret->body_len = blen;
    char te[64];
    if (sp_httpc_header(ret, "transfer-encoding", te, sizeof(te)) == 0 &&
        strcasecmp(te, "chunked") == 0 && (rc = dechunk(ret->body, blen, &ret->body_len)) < 0) {
        sp_httpc_resp_free(ret);
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    sp_buf_dispose(&in);
    return rc;
}

/* ---- streaming ---- */

/* Incremental de-chunking (RFC 9112 section 7.1). */
typedef struct {
    bool chunked;
    int st;        /* 0 size line, 1 data, 2 CRLF after data, 3 trailers, 4 done */
    uint64_t left; /* data bytes left in this chunk */
    char line[64]; /* the size line so far */
    size_t line_len;
} dechunk_t;

/* Feeds n bytes; calls fn with body bytes. 1 when the body is complete, 0 for more, < 0 on a
 * malformed stream, -ECANCELED when fn asked to stop. */
static int feed(dechunk_t *d, const char *p, size_t n, sp_httpc_data_fn fn, void *arg)
{
    if (!d->chunked)
        return n && fn(arg, p, n) ? -ECANCELED : 0;
    while (n > 0) {
        if (d->st == 1) {
            size_t take = n < d->left ? n : (size_t)d->left;
            if (fn(arg, p, take))
                return -ECANCELED;
            p += take;
            n -= take;
            d->left -= take;
            if (d->left == 0) {
                d->st = 2;
                d->line_len = 0;
            }
            continue;
        }
        if (d->st == 4)
            return 1;
        /* A line: size line, the CRLF after data, or a trailer line. */
        char ch = *p++;
        n--;
        if (ch != '\n') {
            if (d->line_len + 1 >= sizeof(d->line))
                return SP_EDECODE;
            d->line[d->line_len++] = ch;
            continue;
        }
        if (d->line_len && d->line[d->line_len - 1] == '\r')
            d->line_len--;
        d->line[d->line_len] = '\0';
        if (d->st == 2) {
            if (d->line_len != 0)
                return SP_EDECODE;
            d->st = 0;
        } else if (d->st == 3) {
            if (d->line_len == 0)
                d->st = 4;
        } else {
            char *end = NULL;
            unsigned long long size = strtoull(d->line, &end, 16);
            if (end == d->line || (*end && *end != ';'))
                return SP_EDECODE;
            d->left = size;
            d->st = size ? 1 : 3;
        }
        d->line_len = 0;
    }
    return d->st == 4 ? 1 : 0;
}

int sp_httpc_stream(const sp_httpc_req_t *req, sp_httpc_resp_t *ret, sp_httpc_data_fn fn, void *arg)
{
    int64_t idle_ns = (int64_t)req->timeout_ms * 1000000;
    size_t max = req->max_response ? req->max_response : 64u * 1024 * 1024;
    sp_buf_t head;
    dechunk_t d;
    char chunk[65536];
    int rc, fd;

    memset(ret, 0, sizeof(*ret));
    memset(&d, 0, sizeof(d));
    sp_buf_init(&head);
    fd = open_and_send(req, sp_mono_ns() + (idle_ns ? idle_ns : 120000000000LL));
    if (fd < 0)
        return fd;
    bool in_body = false, collect = false;
    sp_buf_t body;
    sp_buf_init(&body);
    for (;;) {
        if ((rc = wait_fd(fd, POLLIN, idle_ns ? sp_mono_ns() + idle_ns : INT64_MAX)) < 0)
            goto out;
        ssize_t n = recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0) {
            rc = -errno;
            goto out;
        }
        if (n == 0) {
            /* The end of a body without length or chunking is the close. */
            rc = in_body && (!d.chunked || d.st == 4) ? 0 : SP_EDECODE;
            goto out;
        }
        const char *p = chunk;
        size_t len = (size_t)n;
        if (!in_body) {
            if (head.len + len > 65536) {
                rc = SP_EDECODE;
                goto out;
            }
            sp_buf_append(&head, p, len);
            char *sep = strstr(head.data, "\r\n\r\n");
            if (!sep)
                continue;
            size_t hlen = (size_t)(sep - head.data) + 4;
            if (sscanf(head.data, "HTTP/1.%*d %3d", &ret->status) != 1) { /* NOLINT(cert-err34-c) */
                rc = SP_EDECODE;
                goto out;
            }
            ret->headers = sp_xstrndup(head.data, hlen - 2);
            char te[64];
            d.chunked = sp_httpc_header(ret, "transfer-encoding", te, sizeof(te)) == 0 &&
                        strcasecmp(te, "chunked") == 0;
            collect = ret->status < 200 || ret->status > 299;
            in_body = true;
            p = head.data + hlen;
            len = head.len - hlen;
        }
        rc = collect ? 0 : feed(&d, p, len, fn, arg);
        if (collect) {
            if (body.len + len > max) {
                rc = SP_ETOOBIG;
                goto out;
            }
            sp_buf_append(&body, p, len);
        }
        if (rc != 0) {
            rc = rc == 1 ? 0 : rc;
            goto out;
        }
    }
out:
    close(fd);
    sp_buf_dispose(&head);
    if (collect && (rc == 0 || rc == SP_EDECODE)) {
        size_t blen = body.len;
        ret->body = sp_xmalloc(blen + 1);
        memcpy(ret->body, body.data ? body.data : "", blen);
        ret->body[blen] = '\0';
        ret->body_len = blen;
        if (d.chunked && dechunk(ret->body, blen, &ret->body_len) < 0)
            ret->body_len = blen;
        rc = 0;
    }
    sp_buf_dispose(&body);
    return rc == -ECANCELED ? 0 : rc;
}

void sp_httpc_resp_free(sp_httpc_resp_t *r)
{
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof(*r));
}

int sp_httpc_header(const sp_httpc_resp_t *r, const char *name, char *out, size_t len)
{
    size_t n = strlen(name);
    for (const char *p = strstr(r->headers, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
            const char *v = line + n + 1;
            while (*v == ' ')
                v++;
            size_t vl = strcspn(v, "\r\n");
            if (vl >= len)
                vl = len - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return 0;
        }
    }
    return SP_ENOTFOUND;
}

int sp_httpc_parse_url(const char *url, char *host, size_t host_len, int *ret_port)
{
    if (strncmp(url, "http://", 7) != 0)
        return -EINVAL;
    const char *h = url + 7, *colon = strchr(h, ':');
    if (!colon || (size_t)(colon - h) >= host_len)
        return -EINVAL;
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (port <= 0 || port > 65535 || (*end && *end != '/'))
        return -EINVAL;
    memcpy(host, h, (size_t)(colon - h));
    host[colon - h] = '\0';
    *ret_port = (int)port;
    return 0;
}
