/* The tests' HTTP client (harness.h). Loopback only. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "buf.h"
#include "harness.h"
#include "xmalloc.h"

/* Sends everything, unless the server stops reading (it may answer early, e.g. 413 to a body
 * it will not take, and close): then the response is what counts. */
static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
            return;
        if (w <= 0)
            fail_msg("http: write failed: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
    }
}

/* De-chunks body in place (RFC 9112 section 7.1); returns the new length. */
static size_t dechunk(char *body, size_t len)
{
    size_t in = 0, out = 0;
    while (in < len) {
        char *end = NULL;
        unsigned long n = strtoul(body + in, &end, 16);
        char *crlf = strstr(body + in, "\r\n");
        if (!crlf)
            break;
        in = (size_t)(crlf - body) + 2;
        if (n == 0 || in + n > len)
            break;
        memmove(body + out, body + in, n);
        out += n;
        in += n + 2;
        (void)end;
    }
    body[out] = '\0';
    return out;
}

int sp_test_http(int port, const char *method, const char *path, const char *key,
                 const char *extra_headers, const char *body, size_t body_len,
                 sp_test_http_resp_t *ret)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {.tv_sec = 120};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        fail_msg("http: cannot connect to 127.0.0.1:%d: %s", port, strerror(errno));

    sp_buf_t req, resp;
    sp_buf_init(&req);
    sp_buf_init(&resp);
    sp_buf_printf(&req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n", method,
                  path, port);
    if (key)
        sp_buf_printf(&req, "Authorization: Bearer %s\r\n", key);
    if (body)
        sp_buf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    if (extra_headers)
        sp_buf_puts(&req, extra_headers);
    sp_buf_puts(&req, "\r\n");
    write_all(fd, req.data, req.len);
    if (body)
        write_all(fd, body, body_len);

    char chunk[65536];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == ECONNRESET && resp.len > 0)
            break; /* answered, then reset because we were still sending */
        if (n < 0)
            fail_msg("http: read failed: %s", strerror(errno));
        if (n == 0)
            break;
        sp_buf_append(&resp, chunk, (size_t)n);
    }
    close(fd);
    sp_buf_dispose(&req);

    memset(ret, 0, sizeof(*ret));
    char *sep = resp.data ? strstr(resp.data, "\r\n\r\n") : NULL;
    if (!sep || sscanf(resp.data, "HTTP/1.%*d %d", &ret->status) != 1)
        fail_msg("http: malformed response to %s %s", method, path);
    ret->headers = sp_xstrndup(resp.data, (size_t)(sep - resp.data) + 2);
    size_t blen = resp.len - (size_t)(sep + 4 - resp.data);
    ret->body = sp_xmalloc(blen + 1);
    memcpy(ret->body, sep + 4, blen);
    ret->body[blen] = '\0';
    ret->body_len = blen;
    char te[64];
    if (sp_test_http_header(ret, "transfer-encoding", te, sizeof(te)) == 0 &&
        strcasecmp(te, "chunked") == 0)
        ret->body_len = dechunk(ret->body, blen);
    sp_buf_dispose(&resp);
    return 0;
}

void sp_test_http_free(sp_test_http_resp_t *r)
{
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof(*r));
}

int sp_test_http_header(const sp_test_http_resp_t *r, const char *name, char *out, size_t len)
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
    return -1;
}

int sp_test_api_port(void)
{
    const char *url = sp_test_env("SPACE_API_URL");
    const char *colon = strrchr(url, ':');
    int port = colon ? atoi(colon + 1) : 0;
    if (port <= 0 || strncmp(url, "http://127.0.0.1:", 17) != 0)
        fail_msg("SPACE_API_URL %s is not a loopback URL", url);
    return port;
}
