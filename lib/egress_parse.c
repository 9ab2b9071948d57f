/* TLS ClientHello and HTTP/1.x request heads from a hostile guest (egress_parse.h). */
#include "egress_parse.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "netpolicy.h"
#include "text.h"

static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t rd24(const uint8_t *p)
{
    return ((uint32_t)p[0] << 16) | ((uint32_t)p[1] << 8) | p[2];
}

/* Copies a host name into out (lowercase) if it is a DNS name; -EINVAL otherwise. */
static int host_copy(const char *s, size_t n, char out[254])
{
    if (n == 0 || n > SP_DNS_NAME_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        out[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    out[n] = '\0';
    return sp_dns_name_valid(out, false) ? 0 : -EINVAL;
}

int sp_tls_client_hello(const uint8_t *b, size_t len, sp_tls_hello_t *ret)
{
    sp_tls_hello_t h;
    memset(&h, 0, sizeof(h));
    if (len < 5)
        return len > 0 && b[0] != 0x16 ? -EINVAL : SP_PARSE_MORE;
    /* Record: handshake(22), legacy_record_version 3.x, length. */
    if (b[0] != 0x16 || b[1] != 3 || b[2] > 4)
        return -EINVAL;
    size_t rlen = rd16(b + 3);
    if (rlen < 4 || rlen > 16384)
        return -EINVAL;
    if (len < 5 + rlen)
        return SP_PARSE_MORE;
    const uint8_t *p = b + 5, *end;
    if (p[0] != 1) /* client_hello */
        return -EINVAL;
    size_t hlen = rd24(p + 1);
    if (hlen + 4 > rlen)
        return -EINVAL; /* a ClientHello split across records: refused (fail closed) */
    end = p + 4 + hlen;
    p += 4;
    if (end - p < 2 + 32 + 1)
        return -EINVAL;
    p += 2 + 32; /* legacy_version, random */
    size_t sid = *p++;
    if (sid > 32 || (size_t)(end - p) < sid + 2)
        return -EINVAL;
    p += sid;
    size_t cs = rd16(p);
    p += 2;
    if (cs < 2 || cs % 2 || (size_t)(end - p) < cs + 1)
        return -EINVAL;
    p += cs;
    size_t comp = *p++;
    if (comp < 1 || (size_t)(end - p) < comp)
        return -EINVAL;
    p += comp;
    if (p == end) {
        *ret = h; /* no extensions at all: no SNI */
        return SP_PARSE_OK;
    }
    if (end - p < 2)
        return -EINVAL;
    size_t elen = rd16(p);
    p += 2;
    if ((size_t)(end - p) != elen)
        return -EINVAL;
    int seen_sni = 0;
    while (p < end) {
        if (end - p < 4)
            return -EINVAL;
        uint16_t type = rd16(p);
        size_t l = rd16(p + 2);
        p += 4;
        if ((size_t)(end - p) < l)
            return -EINVAL;
        if (type == 0xfe0d) {
            h.ech = true;
        } else if (type == 0) {
            /* server_name (RFC 6066 3): ServerNameList. */
            if (seen_sni++)
                h.multiple = true;
            if (l < 2 || rd16(p) != l - 2)
                return -EINVAL;
            const uint8_t *q = p + 2, *qe = p + l;
            int names = 0;
            while (q < qe) {
                if (qe - q < 3)
                    return -EINVAL;
                uint8_t nt = q[0];
                size_t nl = rd16(q + 1);
                q += 3;
                if ((size_t)(qe - q) < nl)
                    return -EINVAL;
                if (nt == 0) {
                    if (names++) {
                        h.multiple = true;
                    } else if (host_copy((const char *)q, nl, h.sni) < 0) {
                        return -EINVAL;
                    }
                }
                q += nl;
            }
        }
        p += l;
    }
    *ret = h;
    return SP_PARSE_OK;
}

static bool tchar(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int bad(const char **why, const char *msg)
{
    if (why)
        *why = msg;
    return -EINVAL;
}

/* host[:port] into out / *port; -EINVAL if not a DNS name with an optional decimal port. */
static int host_port(const char *s, size_t n, char out[254], uint16_t *port)
{
    const char *colon = memchr(s, ':', n);
    size_t hn = colon ? (size_t)(colon - s) : n;
    *port = 0;
    if (colon) {
        size_t pl = n - hn - 1;
        unsigned v = 0;
        if (pl == 0 || pl > 5)
            return -EINVAL;
        for (size_t i = 0; i < pl; i++) {
            if (colon[1 + i] < '0' || colon[1 + i] > '9')
                return -EINVAL;
            v = v * 10 + (unsigned)(colon[1 + i] - '0');
        }
        if (v == 0 || v > 65535)
            return -EINVAL;
        *port = (uint16_t)v;
    }
    return host_copy(s, hn, out);
}

/* RFC 9112 3.2: which of the four forms t is, and the authority of the two that have one.
 * A fragment ('#') belongs to no form: a client never sends one (RFC 9110 4.2.4). */
static int parse_target(const char *t, size_t n, sp_http_head_t *h)
{
    if (n == 0 || memchr(t, '#', n))
        return -EINVAL;
    if (t[0] == '/') {
        h->target_form = SP_TARGET_ORIGIN;
        return 0;
    }
    if (n == 1 && t[0] == '*') {
        h->target_form = SP_TARGET_ASTERISK;
        return 0;
    }
    const char *end = t + n, *sep = NULL;
    for (const char *p = t; p + 3 <= end && *p != '/'; p++) {
        if (p[0] == ':' && p[1] == '/' && p[2] == '/') {
            sep = p;
            break;
        }
    }
    if (!sep) {
        /* authority-form: a name and a port, nothing else. */
        if (host_port(t, n, h->target_host, &h->target_port) < 0 || h->target_port == 0)
            return -EINVAL;
        h->target_form = SP_TARGET_AUTHORITY;
        return 0;
    }
    size_t sl = (size_t)(sep - t);
    if (sl == 4 && strncasecmp(t, "http", 4) == 0)
        h->target_https = false;
    else if (sl == 5 && strncasecmp(t, "https", 5) == 0)
        h->target_https = true;
    else
        return -EINVAL;
    const char *a = sep + 3, *ae = a;
    while (ae < end && *ae != '/' && *ae != '?')
        ae++;
    /* userinfo "@" host: the last '@' ends it (no '@' is left unencoded in a userinfo). */
    for (const char *p = ae; p > a; p--) {
        if (p[-1] == '@') {
            h->target_userinfo = true;
            a = p;
            break;
        }
    }
    if (host_port(a, (size_t)(ae - a), h->target_host, &h->target_port) < 0)
        return -EINVAL;
    h->path_off = (size_t)(ae - t);
    h->target_form = SP_TARGET_ABSOLUTE;
    return 0;
}

int sp_http_request_head(const uint8_t *buf, size_t len, sp_http_head_t *ret, const char **why)
{
    sp_http_head_t h;
    memset(&h, 0, sizeof(h));
    h.content_length = -1;
    const char *s = (const char *)buf;
    /* The head ends at the first CRLFCRLF; any bare CR or LF before it is refused below. */
    size_t end = 0;
    for (size_t i = 0; i + 3 < len; i++) {
        if (s[i] == '\r' && s[i + 1] == '\n' && s[i + 2] == '\r' && s[i + 3] == '\n') {
            end = i + 4;
            break;
        }
    }
    /* Early refusal of what cannot become a request line: a method is a token. */
    for (size_t i = 0; i < len && s[i] != ' '; i++)
        if (!tchar(s[i]) || i >= sizeof(h.method) - 1)
            return bad(why, "not an HTTP request");
    if (!end)
        return SP_PARSE_MORE;
    h.head_len = end;

    size_t pos = 0;
    int lines = 0, hosts = 0, cls = 0, tes = 0, upgrades = 0;
    while (pos < end - 2) {
        const char *line = s + pos;
        const char *crlf = NULL;
        for (size_t i = pos; i + 1 < end; i++) {
            if (s[i] == '\r' || s[i] == '\n') {
                if (s[i] != '\r' || s[i + 1] != '\n')
                    return bad(why, "bare CR or LF");
                crlf = s + i;
                break;
            }
        }
        if (!crlf)
            return bad(why, "malformed head");
        size_t ll = (size_t)(crlf - line);
        if (lines++ == 0) {
            /* method SP request-target SP HTTP-version */
            const char *sp1 = memchr(line, ' ', ll);
            const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', ll - (size_t)(sp1 + 1 - line)) : NULL;
            if (!sp1 || !sp2 || sp1 == line || sp2 == sp1 + 1 ||
                (size_t)(sp1 - line) >= sizeof(h.method))
                return bad(why, "malformed request line");
            memcpy(h.method, line, (size_t)(sp1 - line));
            size_t tl = (size_t)(sp2 - sp1 - 1);
            size_t vl = ll - (size_t)(sp2 + 1 - line);
            if (!(vl == 8 &&
                  (memcmp(sp2 + 1, "HTTP/1.1", 8) == 0 || memcmp(sp2 + 1, "HTTP/1.0", 8) == 0)))
                return bad(why, "not HTTP/1.0 or HTTP/1.1");
            h.http10 = sp2[8] == '0';
            for (size_t i = 0; i < tl; i++)
                if ((unsigned char)sp1[1 + i] <= 0x20 || sp1[1 + i] == 0x7f)
                    return bad(why, "control character in the request target");
            h.target_off = (size_t)(sp1 + 1 - s);
            h.target_len = tl;
            if (parse_target(sp1 + 1, tl, &h) < 0)
                return bad(why, "request target of no known form");
            h.is_connect = strcmp(h.method, "CONNECT") == 0;
        } else {
            if (lines > SP_HTTP_HEADERS_MAX + 1)
                return bad(why, "too many header fields");
            if (line[0] == ' ' || line[0] == '\t')
                return bad(why, "obs-fold");
            const char *colon = memchr(line, ':', ll);
            if (!colon || colon == line)
                return bad(why, "malformed header field");
            for (const char *c = line; c < colon; c++)
                if (!tchar(*c))
                    return bad(why, "header name is not a token");
            const char *v = colon + 1, *ve = crlf;
            while (v < ve && (*v == ' ' || *v == '\t'))
                v++;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
                ve--;
            for (const char *c = v; c < ve; c++)
                if (((unsigned char)*c < 0x20 && *c != '\t') || *c == 0x7f)
                    return bad(why, "control character in a header value");
            size_t nl = (size_t)(colon - line), vl = (size_t)(ve - v);
            if (nl == 4 && strncasecmp(line, "host", 4) == 0) {
                if (hosts++)
                    return bad(why, "more than one Host");
                if (host_port(v, vl, h.host, &h.host_port) < 0)
                    return bad(why, "Host is not a DNS name[:port]");
            } else if (nl == 14 && strncasecmp(line, "content-length", 14) == 0) {
                if (cls++)
                    return bad(why, "more than one Content-Length");
                if (vl == 0 || vl > 15)
                    return bad(why, "bad Content-Length");
                int64_t x = 0;
                for (size_t i = 0; i < vl; i++) {
                    if (v[i] < '0' || v[i] > '9')
                        return bad(why, "bad Content-Length");
                    x = x * 10 + (v[i] - '0');
                }
                h.content_length = x;
            } else if (nl == 17 && strncasecmp(line, "transfer-encoding", 17) == 0) {
                if (tes++ || vl != 7 || strncasecmp(v, "chunked", 7) != 0)
                    return bad(why, "Transfer-Encoding other than one chunked");
                h.chunked = true;
            } else if (nl == 7 && strncasecmp(line, "upgrade", 7) == 0) {
                if (upgrades++)
                    return bad(why, "more than one Upgrade");
                h.upgrade = vl == 9 && strncasecmp(v, "websocket", 9) == 0 ? SP_UPGRADE_WEBSOCKET
                                                                           : SP_UPGRADE_OTHER;
            }
        }
        pos = (size_t)(crlf - s) + 2;
    }
    if (cls && tes)
        return bad(why, "Content-Length with Transfer-Encoding");
    if (tes && h.http10)
        return bad(why, "Transfer-Encoding in HTTP/1.0");
    if (hosts != 1)
        return bad(why, "no Host");
    *ret = h;
    return SP_PARSE_OK;
}

const char *sp_http_target_refusal(const sp_http_head_t *hh, bool https, uint16_t port)
{
    if (hh->is_connect)
        return hh->target_form == SP_TARGET_AUTHORITY ? NULL : "bad_connect_target";
    switch (hh->target_form) {
    case SP_TARGET_ORIGIN:
        return NULL;
    case SP_TARGET_ASTERISK:
        return strcmp(hh->method, "OPTIONS") == 0 ? NULL : "asterisk_not_options";
    case SP_TARGET_AUTHORITY:
        return "authority_form_not_connect";
    case SP_TARGET_ABSOLUTE:
        break;
    }
    if (hh->target_https != https)
        return "target_scheme_mismatch";
    if (hh->target_userinfo)
        return "target_userinfo";
    if (strcmp(hh->target_host, hh->host) != 0)
        return "target_host_mismatch";
    uint16_t dflt = https ? 443 : 80;
    uint16_t tp = hh->target_port ? hh->target_port : dflt;
    uint16_t hp = hh->host_port ? hh->host_port : dflt;
    if (tp != hp || tp != port)
        return "target_port_mismatch";
    return NULL;
}

size_t sp_http_head_forward(const uint8_t *head, const sp_http_head_t *hh, uint8_t *out)
{
    if (hh->target_form != SP_TARGET_ABSOLUTE) {
        memcpy(out, head, hh->head_len);
        return hh->head_len;
    }
    size_t n = hh->target_off;
    memcpy(out, head, n);
    const uint8_t *path = head + hh->target_off + hh->path_off;
    size_t pl = hh->target_len - hh->path_off;
    /* An empty path is "/" (RFC 9112 3.2.1); so is one that starts with the query. */
    if (pl == 0 || path[0] != '/')
        out[n++] = '/';
    memcpy(out + n, path, pl);
    n += pl;
    size_t rest = hh->target_off + hh->target_len;
    memcpy(out + n, head + rest, hh->head_len - rest);
    return n + hh->head_len - rest;
}

/* ---- credential injection (docs/credentials.md) ---- */

#define PH         "space-cred:"
#define PH_LEN     11
#define PH_ENC     "space-cred%3a" /* the colon percent-encoded, as a query string may carry it */
#define PH_ENC_LEN 13

typedef struct {
    uint8_t *out;
    size_t cap, len;
} wr_t;

static void wr_put(wr_t *w, const void *p, size_t n)
{
    if (w->len + n <= w->cap && n)
        memcpy(w->out + w->len, p, n);
    w->len += n;
}

static bool ph_char(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

/* Where a placeholder starts in p[0..n) (any case, either spelling), or n. *ret_plen gets the
 * length of its prefix. */
static size_t ph_find(const uint8_t *p, size_t n, bool enc, size_t *ret_plen)
{
    for (size_t i = 0; i + PH_LEN <= n; i++) {
        if (strncasecmp((const char *)p + i, PH, PH_LEN) == 0) {
            *ret_plen = PH_LEN;
            return i;
        }
        if (enc && i + PH_ENC_LEN <= n &&
            strncasecmp((const char *)p + i, PH_ENC, PH_ENC_LEN) == 0) {
            *ret_plen = PH_ENC_LEN;
            return i;
        }
    }
    return n;
}

bool sp_http_head_has_placeholder(const uint8_t *head, size_t head_len)
{
    size_t pl;
    return ph_find(head, head_len, true, &pl) < head_len;
}

size_t sp_http_pct_byte(uint8_t c, char e[3])
{
    static const char hex[] = "0123456789ABCDEF";
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~') {
        e[0] = (char)c;
        return 1;
    }
    e[0] = '%';
    e[1] = hex[c >> 4];
    e[2] = hex[c & 15];
    return 3;
}

static void put_pct(wr_t *w, const uint8_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char e[3];
        size_t k = sp_http_pct_byte(v[i], e);
        wr_put(w, e, k);
    }
}

/* Copies p[0..n), replacing placeholders that have a substitution; -1 when one stays (wrong
 * case, unknown name, or the path, where nothing is substituted: subst NULL). */
static int put_subst(wr_t *w, const uint8_t *p, size_t n, bool query, const sp_head_subst_t *subst,
                     size_t n_subst, uint32_t *used)
{
    while (n) {
        size_t plen = 0, at = ph_find(p, n, query, &plen);
        wr_put(w, p, at);
        if (at == n)
            return 0;
        /* Exactly "space-cred:" or "space-cred%3A"/"%3a"; the name follows. */
        bool exact = plen == PH_LEN ? memcmp(p + at, PH, PH_LEN) == 0
                                    : memcmp(p + at, "space-cred%3", 12) == 0 &&
                                          (p[at + 12] == 'A' || p[at + 12] == 'a');
        size_t ns = at + plen, ne = ns;
        while (ne < n && ph_char(p[ne]))
            ne++;
        const sp_head_subst_t *hit = NULL;
        for (size_t i = 0; exact && subst && i < n_subst && !hit; i++)
            if (strlen(subst[i].name) == ne - ns && memcmp(subst[i].name, p + ns, ne - ns) == 0) {
                hit = &subst[i];
                if (i < 32)
                    *used |= 1u << i;
            }
        if (!hit)
            return -1;
        if (query)
            put_pct(w, hit->value, hit->value_len);
        else
            wr_put(w, hit->value, hit->value_len);
        p += ne;
        n -= ne;
    }
    return 0;
}

static bool param_named(const uint8_t *p, size_t n, const char *name)
{
    size_t nl = strlen(name);
    const uint8_t *eq = memchr(p, '=', n);
    size_t kl = eq ? (size_t)(eq - p) : n;
    return kl == nl && memcmp(p, name, nl) == 0;
}

long sp_http_head_rewrite(const uint8_t *head, const sp_http_head_t *hh,
                          const sp_head_edit_t *edits, size_t n_edits, const sp_head_subst_t *subst,
                          size_t n_subst, uint8_t *out, size_t cap, uint32_t *ret_used,
                          const char **why)
{
    wr_t w = {.out = out, .cap = cap, .len = 0};
    uint32_t used = 0;
    *why = "credential_scope";
    /* The request line up to the target, then the target in origin-form. */
    wr_put(&w, head, hh->target_off);
    const uint8_t *t = head + hh->target_off;
    size_t tl = hh->target_len;
    if (hh->target_form == SP_TARGET_ABSOLUTE) {
        t += hh->path_off;
        tl -= hh->path_off;
        if (tl == 0 || t[0] != '/')
            wr_put(&w, "/", 1);
    }
    const uint8_t *q = memchr(t, '?', tl);
    size_t pathl = q ? (size_t)(q - t) : tl;
    if (put_subst(&w, t, pathl, false, NULL, 0, &used) < 0)
        return -EACCES;
    bool any_param = false;
    if (q) {
        const uint8_t *p = q + 1, *end = t + tl;
        while (p <= end) {
            const uint8_t *amp = memchr(p, '&', (size_t)(end - p));
            size_t n = amp ? (size_t)(amp - p) : (size_t)(end - p);
            bool drop = false;
            for (size_t i = 0; i < n_edits && !drop; i++)
                drop = edits[i].param && param_named(p, n, edits[i].param);
            if (!drop && n) {
                wr_put(&w, any_param ? "&" : "?", 1);
                any_param = true;
                if (put_subst(&w, p, n, true, subst, n_subst, &used) < 0)
                    return -EACCES;
            }
            if (!amp)
                break;
            p = amp + 1;
        }
    }
    for (size_t i = 0; i < n_edits; i++) {
        if (!edits[i].param)
            continue;
        wr_put(&w, any_param ? "&" : "?", 1);
        any_param = true;
        wr_put(&w, edits[i].param, strlen(edits[i].param));
        wr_put(&w, "=", 1);
        put_pct(&w, edits[i].value, edits[i].value_len);
    }
    /* The rest of the request line, then the fields. */
    size_t at = hh->target_off + hh->target_len;
    const uint8_t *eol = memchr(head + at, '\n', hh->head_len - at);
    size_t line_end = (size_t)(eol - head) + 1;
    wr_put(&w, head + at, line_end - at);
    at = line_end;
    while (at < hh->head_len) {
        const uint8_t *lf = memchr(head + at, '\n', hh->head_len - at);
        size_t next = (size_t)(lf - head) + 1;
        if (next - at == 2)
            break; /* the empty line */
        const uint8_t *line = head + at;
        const uint8_t *colon = memchr(line, ':', next - at);
        size_t nl = (size_t)(colon - line);
        bool drop = false;
        for (size_t i = 0; i < n_edits && !drop; i++)
            drop = edits[i].header && strlen(edits[i].header) == nl &&
                   strncasecmp((const char *)line, edits[i].header, nl) == 0;
        if (!drop) {
            wr_put(&w, line, nl + 1);
            if (put_subst(&w, colon + 1, next - at - nl - 1, false, subst, n_subst, &used) < 0)
                return -EACCES;
        }
        at = next;
    }
    for (size_t i = 0; i < n_edits; i++) {
        if (!edits[i].header)
            continue;
        wr_put(&w, edits[i].header, strlen(edits[i].header));
        wr_put(&w, ": ", 2);
        wr_put(&w, edits[i].value, edits[i].value_len);
        wr_put(&w, "\r\n", 2);
    }
    wr_put(&w, "\r\n", 2);
    if (ret_used)
        *ret_used = used;
    *why = NULL;
    return (long)w.len;
}

/* ---- chunked bodies (RFC 9112 7.1) ---- */

enum {
    CH_SIZE = 0, /* hex digits of chunk-size */
    CH_EXT,      /* after ';': the extension, up to CR */
    CH_SIZE_LF,  /* CR of the size line seen */
    CH_DATA,     /* chunk data, size bytes left */
    CH_DATA_CR,  /* CRLF after the data */
    CH_DATA_LF,
    CH_TRAILER,  /* at the start of a trailer line (or of the final empty line) */
    CH_FIELD,    /* inside a trailer field */
    CH_FIELD_LF, /* CR of a trailer field seen */
    CH_END_LF,   /* CR of the final empty line seen */
};

void sp_chunked_init(sp_chunked_t *st)
{
    memset(st, 0, sizeof(*st));
}

int sp_chunked_feed(sp_chunked_t *st, const uint8_t *buf, size_t len, size_t *ret_used,
                    const char **why)
{
    size_t i = 0;
    while (i < len) {
        uint8_t c = buf[i];
        switch (st->state) {
        case CH_SIZE: {
            int x = sp_hex_digit((char)c);
            if (x >= 0) {
                if (++st->line > SP_CHUNK_SIZE_DIGITS)
                    return bad(why, "chunk size too long");
                st->size = st->size << 4 | (uint64_t)x;
            } else if (st->line == 0) {
                return bad(why, "chunk size is not hex");
            } else if (c == ';') {
                st->state = CH_EXT;
                st->line = 0;
            } else if (c == '\r') {
                st->state = CH_SIZE_LF;
            } else {
                return bad(why, "bad character after the chunk size");
            }
            i++;
            break;
        }
        case CH_EXT:
            if (c == '\r') {
                st->state = CH_SIZE_LF;
            } else if ((c < 0x20 && c != '\t') || c >= 0x7f) {
                return bad(why, "control character in a chunk extension");
            } else if (++st->line > SP_CHUNK_EXT_MAX) {
                return bad(why, "chunk extension too long");
            }
            i++;
            break;
        case CH_SIZE_LF:
            if (c != '\n')
                return bad(why, "chunk size line without CRLF");
            i++;
            st->line = 0;
            st->state = st->size ? CH_DATA : CH_TRAILER;
            break;
        case CH_DATA: {
            size_t n = len - i;
            if ((uint64_t)n > st->size)
                n = (size_t)st->size;
            st->size -= n;
            i += n;
            if (st->size == 0)
                st->state = CH_DATA_CR;
            break;
        }
        case CH_DATA_CR:
        case CH_DATA_LF:
            if (c != (st->state == CH_DATA_CR ? '\r' : '\n'))
                return bad(why, "chunk data not followed by CRLF");
            st->state = st->state == CH_DATA_CR ? CH_DATA_LF : CH_SIZE;
            i++;
            break;
        case CH_TRAILER:
            if (c == '\r') {
                st->state = CH_END_LF;
            } else if (!tchar((char)c)) {
                return bad(why, "trailer field name is not a token");
            } else {
                if (++st->fields > SP_HTTP_HEADERS_MAX)
                    return bad(why, "too many trailer fields");
                st->state = CH_FIELD;
                st->name_done = false;
            }
            if (++st->trailers > SP_CHUNK_TRAILERS_MAX)
                return bad(why, "trailers too large");
            i++;
            break;
        case CH_FIELD:
            if (c == '\r') {
                if (!st->name_done)
                    return bad(why, "trailer field without ':'");
                st->state = CH_FIELD_LF;
            } else if (!st->name_done && c == ':') {
                st->name_done = true;
            } else if (!st->name_done ? !tchar((char)c) : ((c < 0x20 && c != '\t') || c == 0x7f)) {
                return bad(why, "bad character in a trailer field");
            }
            if (++st->trailers > SP_CHUNK_TRAILERS_MAX)
                return bad(why, "trailers too large");
            i++;
            break;
        case CH_FIELD_LF:
            if (c != '\n')
                return bad(why, "trailer field without CRLF");
            st->state = CH_TRAILER;
            i++;
            break;
        case CH_END_LF:
            if (c != '\n')
                return bad(why, "chunked body not ended by CRLF");
            *ret_used = i + 1;
            sp_chunked_init(st);
            return SP_PARSE_OK;
        default:
            return bad(why, "chunk parser state");
        }
    }
    *ret_used = len;
    return SP_PARSE_MORE;
}

/* ---- response heads ---- */

int sp_http_response_head(const uint8_t *buf, size_t len, int *ret_status, size_t *ret_head_len)
{
    static const char v[] = "HTTP/1.";
    size_t pre = len < 13 ? len : 13;
    /* "HTTP/1.x SSS " must be there before anything else is looked at. */
    for (size_t i = 0; i < pre; i++) {
        uint8_t c = buf[i];
        bool ok = i < 7    ? c == (uint8_t)v[i]
                  : i == 7 ? (c == '0' || c == '1')
                  : i == 8 ? c == ' '
                  /* the reason phrase may be empty, and then its SP is often left out */
                  : i == 12 ? (c == ' ' || c == '\r')
                            : (c >= '0' && c <= '9');
        if (!ok)
            return -EINVAL;
    }
    for (size_t i = 0; i + 3 < len; i++) {
        if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') {
            if (i < 12)
                return -EINVAL;
            *ret_status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
            *ret_head_len = i + 4;
            return SP_PARSE_OK;
        }
    }
    return SP_PARSE_MORE;
}
