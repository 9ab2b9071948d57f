/* The strict reading of a request head (RFC 9112), before h2o sees it.
 *
 * picohttpparser, under h2o 2.2, is lenient where leniency lets two parsers disagree about
 * where a request ends: the first of two Content-Length fields wins, Transfer-Encoding beats
 * Content-Length silently, obs-fold continues a value, a bare LF ends a line. Behind a load
 * balancer that reads the other way, that is request smuggling. This reading accepts only one
 * framing per request and refuses the rest with a reason, so the gate (gateway_gate.c) answers
 * 400 and closes before h2o dispatches anything. */
#include "gateway.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

/* RFC 9110 section 5.6.2: tchar. */
static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* field-vchar / SP / HTAB (RFC 9110 section 5.5), obs-text included. */
static bool is_value_char(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static bool name_is(const char *p, size_t n, const char *name)
{
    return strlen(name) == n && strncasecmp(p, name, n) == 0;
}

static int bad(const char **ret_why, const char *why)
{
    *ret_why = why;
    return -EINVAL;
}

int gw_head_scan(gw_head_scan_t *s, const char *p, size_t n, const char **ret_why)
{
    for (size_t i = s->scanned; i < n; i++) {
        if (p[i] == '\r' && i + 1 < n && p[i + 1] != '\n')
            return bad(ret_why, "a CR that does not end a line");
        if (p[i] != '\n')
            continue;
        if (i == 0 || p[i - 1] != '\r')
            return bad(ret_why, "a line ends with a bare LF (CRLF required)");
        bool empty = i - 1 == s->line_start;
        s->line_start = i + 1;
        if (!empty) {
            s->lines++;
            continue;
        }
        /* RFC 9112 section 2.2: empty lines before the request line are ignored. */
        if (s->lines == 0)
            continue;
        s->scanned = i + 1;
        return 1;
    }
    s->scanned = n > 0 && p[n - 1] == '\r' ? n - 1 : n;
    return 0;
}

int gw_head_parse(const char *p, size_t n, gw_head_t *h, const char **ret_why)
{
    memset(h, 0, sizeof(*h));
    h->content_length = -1;
    h->expect_at = SIZE_MAX;
    h->len = n;
    size_t i = 0;
    while (i + 1 < n && p[i] == '\r' && p[i + 1] == '\n')
        i += 2;

    /* request-line = method SP request-target SP HTTP-version (RFC 9112 section 3) */
    const char *eol = memchr(p + i, '\r', n - i);
    if (!eol)
        return bad(ret_why, "no request line");
    size_t m = i;
    while (m < (size_t)(eol - p) && is_tchar((unsigned char)p[m]))
        m++;
    if (m == i || m >= (size_t)(eol - p) || p[m] != ' ')
        return bad(ret_why, "malformed request line (method)");
    size_t t = m + 1, te = t;
    while (te < (size_t)(eol - p) && (unsigned char)p[te] > 0x20 && (unsigned char)p[te] < 0x7f)
        te++;
    if (te == t || te >= (size_t)(eol - p) || p[te] != ' ')
        return bad(ret_why, "malformed request line (target)");
    const char *v = p + te + 1;
    size_t vlen = (size_t)(eol - v);
    if (vlen != 8 || memcmp(v, "HTTP/1.", 7) != 0 || (v[7] != '0' && v[7] != '1'))
        return bad(ret_why, "unsupported HTTP version (HTTP/1.0 or HTTP/1.1 only)");
    h->minor = v[7] - '0';
    i = (size_t)(eol - p) + 2;

    size_t hosts = 0, cls = 0, tes = 0;
    while (i < n) {
        const char *le = memchr(p + i, '\r', n - i);
        if (!le)
            return bad(ret_why, "unterminated header line");
        size_t ll = (size_t)(le - (p + i));
        if (ll == 0) {
            h->len = i + 2;
            break;
        }
        if (p[i] == ' ' || p[i] == '\t')
            return bad(ret_why, "obs-fold (a header line continued on the next) is refused");
        if (++h->fields > GW_HEAD_FIELDS_MAX) {
            h->too_large = true;
            return bad(ret_why, "too many header fields");
        }
        size_t ne = i;
        while (ne < i + ll && is_tchar((unsigned char)p[ne]))
            ne++;
        if (ne == i || ne >= i + ll || p[ne] != ':')
            return bad(ret_why, ne < i + ll && (p[ne] == ' ' || p[ne] == '\t')
                                    ? "whitespace between a field name and its colon"
                                    : "malformed header field name");
        const char *name = p + i;
        size_t nlen = ne - i;
        size_t vs = ne + 1, ve = i + ll;
        for (size_t k = vs; k < ve; k++)
            if (!is_value_char((unsigned char)p[k]))
                return bad(ret_why, "a control character in a header field value");
        while (vs < ve && (p[vs] == ' ' || p[vs] == '\t'))
            vs++;
        while (ve > vs && (p[ve - 1] == ' ' || p[ve - 1] == '\t'))
            ve--;
        const char *val = p + vs;
        size_t len = ve - vs;

        if (name_is(name, nlen, "host")) {
            hosts++;
        } else if (name_is(name, nlen, "content-length")) {
            /* RFC 9112 section 6.3: several Content-Length fields, even equal ones, are
             * refused (a list "5, 5" as well): one message, one length. */
            if (++cls > 1)
                return bad(ret_why, "more than one Content-Length");
            if (len == 0 || len > 18)
                return bad(ret_why, "malformed Content-Length");
            int64_t cl = 0;
            for (size_t k = 0; k < len; k++) {
                if (val[k] < '0' || val[k] > '9')
                    return bad(ret_why, "malformed Content-Length");
                cl = cl * 10 + (val[k] - '0');
            }
            h->content_length = cl;
        } else if (name_is(name, nlen, "transfer-encoding")) {
            /* Only "chunked", alone (RFC 9112 section 6.1): no other coding is supported and
             * a list could hide a second framing. */
            if (++tes > 1)
                return bad(ret_why, "more than one Transfer-Encoding");
            if (!name_is(val, len, "chunked"))
                return bad(ret_why, "Transfer-Encoding other than chunked");
            h->chunked = true;
        } else if (name_is(name, nlen, "expect")) {
            if (name_is(val, len, "100-continue"))
                h->expect_continue = true;
            else
                h->expect_other = true;
            h->expect_at = (size_t)(name - p);
        }
        i += ll + 2;
    }
    if (h->len == n && (n < 4 || memcmp(p + n - 4, "\r\n\r\n", 4) != 0))
        return bad(ret_why, "unterminated head");
    if (h->chunked && cls > 0)
        return bad(ret_why, "Content-Length together with Transfer-Encoding");
    /* RFC 9112 section 6.1: Transfer-Encoding in HTTP/1.0 means faulty framing. */
    if (h->chunked && h->minor == 0)
        return bad(ret_why, "Transfer-Encoding in an HTTP/1.0 request");
    /* RFC 9112 section 3.2: exactly one Host in HTTP/1.1, at most one in 1.0. */
    if (hosts > 1 || (hosts == 0 && h->minor == 1))
        return bad(ret_why, hosts ? "more than one Host" : "no Host header");
    h->has_body = h->chunked || h->content_length > 0;
    return 0;
}
