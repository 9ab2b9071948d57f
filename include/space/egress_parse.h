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

/* The Upgrade header field of a request (RFC 9110 7.8). */
typedef enum {
    SP_UPGRADE_NONE = 0,
    SP_UPGRADE_WEBSOCKET, /* exactly "websocket" (any case), RFC 6455 4.1 */
    SP_UPGRADE_OTHER,     /* anything else (h2c, a list, ...) */
} sp_upgrade_t;

/* The form of a request's target (RFC 9112 3.2). */
typedef enum {
    SP_TARGET_ORIGIN = 0, /* "/path?query" */
    SP_TARGET_ABSOLUTE,   /* "http://host[:port]/path?query" (proxy requests, RFC 9112 3.2.2) */
    SP_TARGET_AUTHORITY,  /* "host:port" (CONNECT only, RFC 9112 3.2.3) */
    SP_TARGET_ASTERISK,   /* "*" (OPTIONS only, RFC 9112 3.2.4) */
} sp_target_form_t;

typedef struct {
    char method[16];
    char host[254];         /* Host without port, lowercase */
    uint16_t host_port;     /* 0 when the Host header has none */
    size_t head_len;        /* bytes of the request line and headers, final CRLF included */
    int64_t content_length; /* -1: none */
    bool chunked;
    bool is_connect;
    bool http10;          /* HTTP/1.0 (else HTTP/1.1) */
    sp_upgrade_t upgrade; /* what an Upgrade field asks for */
    sp_target_form_t target_form;
    bool target_https;     /* absolute-form: the scheme is https (else http) */
    bool target_userinfo;  /* absolute-form: the authority has "user@" */
    char target_host[254]; /* absolute- and authority-form: the host, lowercase */
    uint16_t target_port;  /* absolute-form: 0 when the authority has none; authority-form: set */
    size_t target_off;     /* where the request target starts in the head ... */
    size_t target_len;     /* ... and its length */
    size_t path_off;       /* absolute-form: where its path starts, from target_off (may equal
                            * target_len: an empty path, which is "/") */
} sp_http_head_t;

/* RFC 9112: request line, header fields, empty line, all CRLF-terminated. Refused: bare LF or
 * CR, obs-fold, header names that are not tokens, control characters in values, no Host or
 * more than one, a Host that is not a DNS name[:port], Content-Length that is not all digits
 * or repeated, Content-Length together with Transfer-Encoding, any Transfer-Encoding other
 * than exactly "chunked", Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1: its framing
 * is faulty), more than one Upgrade field, more than SP_HTTP_HEADERS_MAX fields, HTTP versions
 * other than 1.0 and 1.1; a request target that is none of the four forms: origin-form,
 * absolute-form with scheme http or https (any case) and an authority that is a DNS
 * name[:port] (with or without userinfo, which is flagged), authority-form (a DNS name and a
 * port), or "*". Which form a method may use is sp_http_target_refusal's business.
 * SP_PARSE_OK, SP_PARSE_MORE, or -EINVAL with why (a static string). */
int sp_http_request_head(const uint8_t *buf, size_t len, sp_http_head_t *ret, const char **why);

/* Whether a parsed request's target may go, as it is or rewritten, to the site the
 * connection is for (https: inside terminated TLS; port: the site's port), given that its Host
 * has been checked. NULL, or the refusal reason (a static string, audited):
 *   CONNECT must use authority-form ("bad_connect_target"), any other method may not
 *   ("authority_form_not_connect"); "*" only with OPTIONS ("asterisk_not_options");
 *   absolute-form only with the connection's scheme ("target_scheme_mismatch"), without
 *   userinfo ("target_userinfo"), with the Host's name ("target_host_mismatch") and with the
 *   port of both the Host and the connection, a missing port being the scheme's default
 *   ("target_port_mismatch"). RFC 9112 3.2.2 tells a server to take the authority of an
 *   absolute-form target over Host: the two must agree or a shared server answers for
 *   another name. */
const char *sp_http_target_refusal(const sp_http_head_t *hh, bool https, uint16_t port);

/* The head of an allowed request as it is forwarded: an absolute-form target rewritten to
 * origin-form (its path, "/" when empty), everything else as it came. Writes at most
 * hh->head_len + 1 bytes into out; returns how many. */
size_t sp_http_head_forward(const uint8_t *head, const sp_http_head_t *hh, uint8_t *out);

/* Credential injection (docs/credentials.md): the head of an allowed request rewritten as it
 * is forwarded. Edits set a header (every field of that name the guest sent, in any case, is
 * dropped first) or a query parameter (every parameter of that name dropped first, the new one
 * appended, its value percent-encoded). Substitutions replace each placeholder
 * "space-cred:<name>" in a header value (by the value as it is) and in the query string (also
 * when written "space-cred%3A<name>"; by the value percent-encoded). Values must be valid
 * (sp_cred_value_valid: no CR, LF or NUL). An absolute-form target becomes origin-form as
 * with sp_http_head_forward.
 *
 * Writes at most cap bytes into out and returns the length of the whole rewritten head
 * (larger than cap: call again with a buffer that large; out then holds nothing useful), or
 * -EACCES with *why "credential_scope" when a placeholder (any case, either spelling) is left
 * anywhere in the target or a header value: one for a name no substitution has, which must
 * not leave the host. *ret_used (optional) gets a bit per substitution that was used. */
typedef struct {
    const char *header; /* the header's name, or NULL ... */
    const char *param;  /* ... the query parameter's name */
    const uint8_t *value;
    size_t value_len;
} sp_head_edit_t;

typedef struct {
    const char *name; /* what follows "space-cred:" */
    const uint8_t *value;
    size_t value_len;
} sp_head_subst_t;

#define SP_HEAD_SUBST_MAX 32

long sp_http_head_rewrite(const uint8_t *head, const sp_http_head_t *hh,
                          const sp_head_edit_t *edits, size_t n_edits, const sp_head_subst_t *subst,
                          size_t n_subst, uint8_t *out, size_t cap, uint32_t *ret_used,
                          const char **why);

/* How sp_http_head_rewrite percent-encodes a value byte c for the query string (RFC 3986
 * 2.3: unreserved bytes as they are, every other byte "%XX", upper-case hex): into e; returns
 * 1 or 3. What an injected query value looks like on the wire (egressd scrubs that form too). */
size_t sp_http_pct_byte(uint8_t c, char e[3]);

/* Whether the head holds a placeholder at all (any case, either spelling), in its target or
 * a header value: a cheap test before asking for credentials. */
bool sp_http_head_has_placeholder(const uint8_t *head, size_t head_len);

/* A chunked request body (RFC 9112 7.1) parsed as it flows through, so that the proxy knows
 * exactly where it ends and where the next request head begins (no smuggling past the
 * per-request check). Strict: chunk-size is 1 to SP_CHUNK_SIZE_DIGITS hex digits (leading
 * zeros count; the value cannot overflow), no whitespace around it; chunk extensions start
 * with ';' right after the size, hold visible ASCII, SP and HTAB only and are at most
 * SP_CHUNK_EXT_MAX bytes; every line ends in CRLF (a bare CR or LF is refused), chunk data is
 * followed by exactly CRLF; trailer fields are "token: value" lines without control
 * characters, at most SP_HTTP_HEADERS_MAX of them and SP_CHUNK_TRAILERS_MAX bytes in all. */
#define SP_CHUNK_SIZE_DIGITS  15 /* < 2^60 bytes */
#define SP_CHUNK_EXT_MAX      256
#define SP_CHUNK_TRAILERS_MAX 8192

typedef struct {
    int state;
    uint64_t size;   /* the chunk being read: its size so far, then the data bytes left */
    size_t line;     /* bytes of the current size line's digits or extension, or trailer line */
    size_t trailers; /* trailer bytes so far */
    unsigned fields; /* trailer fields so far */
    bool name_done;  /* in a trailer line: the ':' was seen */
} sp_chunked_t;

/* Starts a body (a zeroed struct is started too). */
void sp_chunked_init(sp_chunked_t *st);
/* Feeds the next bytes of the body. *ret_used is how many of them belong to it (the caller
 * forwards exactly those). SP_PARSE_MORE: all of them do and the body goes on; SP_PARSE_OK:
 * the body ended after *ret_used bytes (the rest is the next request); -EINVAL with why (a
 * static string): malformed, *ret_used undefined. */
int sp_chunked_feed(sp_chunked_t *st, const uint8_t *buf, size_t len, size_t *ret_used,
                    const char **why);

/* The status of an HTTP/1.x response head (RFC 9112 4): "HTTP/1.x" SP 3DIGIT SP reason CRLF,
 * header lines, CRLF. Only as strict as needed to know whether a server switched protocols:
 * *ret_status and *ret_head_len (the empty line included) on SP_PARSE_OK; SP_PARSE_MORE;
 * -EINVAL when the bytes are no response head. */
int sp_http_response_head(const uint8_t *buf, size_t len, int *ret_status, size_t *ret_head_len);

#endif
