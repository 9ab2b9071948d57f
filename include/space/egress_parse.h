/* What space-egressd reads from a guest's first bytes on a TCP connection, parsed strictly
 * (the guest is hostile): a TLS ClientHello's server name, or an HTTP/1.x request head. Both
 * functions take the bytes received so far and say whether more are needed. */
#ifndef SPACE_EGRESS_PARSE_H
#define SPACE_EGRESS_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SP_TLS_RECORD_MAX (16384 + 5)

enum {
    SP_PARSE_OK = 0,
    SP_PARSE_MORE = 1, /* a prefix of something valid: read more (up to the caller's limit) */
};

typedef struct {
    char sni[254]; /* lowercase; "" when the ClientHello has no server_name */
    bool ech;      /* encrypted_client_hello (0xfe0d) present: the real name is hidden */
    bool multiple; /* more than one host_name, or two server_name extensions */
} sp_tls_hello_t;

/* RFC 8446 4.1.2 / RFC 6066 3: the first record must be a handshake record holding a whole
 * ClientHello. SP_PARSE_OK, SP_PARSE_MORE, or -EINVAL (not TLS, or malformed). */
int sp_tls_client_hello(const uint8_t *buf, size_t len, sp_tls_hello_t *ret);

#define SP_HTTP_HEADERS_MAX 100

typedef struct {
    char method[16];
    char host[254];         /* Host without port, lowercase */
    uint16_t host_port;     /* 0 when the Host header has none */
    size_t head_len;        /* bytes of the request line and headers, final CRLF included */
    int64_t content_length; /* -1: none */
    bool chunked;
    bool is_connect;
    char target[512]; /* CONNECT: host:port */
} sp_http_head_t;

/* RFC 9112: request line, header fields, empty line, all CRLF-terminated. Refused: bare LF or
 * CR, obs-fold, header names that are not tokens, control characters in values, no Host or
 * more than one, a Host that is not a DNS name[:port], Content-Length that is not all digits
 * or repeated, Content-Length together with Transfer-Encoding, any Transfer-Encoding other
 * than exactly "chunked", more than SP_HTTP_HEADERS_MAX fields, HTTP versions other than 1.0
 * and 1.1. SP_PARSE_OK, SP_PARSE_MORE, or -EINVAL with why (a static string). */
int sp_http_request_head(const uint8_t *buf, size_t len, sp_http_head_t *ret, const char **why);

#endif
