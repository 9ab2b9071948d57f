/* What egressd reads from a guest's first bytes (egress_parse.h) and the policy entries it
 * matches them against (netpolicy.h). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* A fixed pseudo-random sequence (xorshift32): the same mutations on every run. */
static uint32_t prng_state = 2463534242u;
static uint32_t prng(void)
{
    prng_state ^= prng_state << 13;
    prng_state ^= prng_state >> 17;
    prng_state ^= prng_state << 5;
    return prng_state;
}

#include "egress_parse.h"
#include "netpolicy.h"

/* A ClientHello record with the given extensions block (already length-prefixed). */
static size_t hello(uint8_t *b, const uint8_t *ext, size_t ext_len)
{
    uint8_t body[4096];
    size_t n = 0;
    body[n++] = 3;
    body[n++] = 3; /* legacy_version */
    memset(body + n, 0x11, 32);
    n += 32;
    body[n++] = 0; /* session id */
    body[n++] = 0;
    body[n++] = 2;
    body[n++] = 0x13;
    body[n++] = 0x01; /* one cipher suite */
    body[n++] = 1;
    body[n++] = 0; /* compression: null */
    memcpy(body + n, ext, ext_len);
    n += ext_len;
    size_t hs = n + 4;
    b[0] = 0x16;
    b[1] = 3;
    b[2] = 1;
    b[3] = (uint8_t)(hs >> 8);
    b[4] = (uint8_t)hs;
    b[5] = 1;
    b[6] = 0;
    b[7] = (uint8_t)(n >> 8);
    b[8] = (uint8_t)n;
    memcpy(b + 9, body, n);
    return 9 + n;
}

static size_t sni_ext(uint8_t *e, const char *name, bool ech)
{
    size_t l = strlen(name), n = 2;
    e[n++] = 0;
    e[n++] = 0; /* server_name */
    e[n++] = (uint8_t)((l + 5) >> 8);
    e[n++] = (uint8_t)(l + 5);
    e[n++] = (uint8_t)((l + 3) >> 8);
    e[n++] = (uint8_t)(l + 3);
    e[n++] = 0;
    e[n++] = (uint8_t)(l >> 8);
    e[n++] = (uint8_t)l;
    memcpy(e + n, name, l);
    n += l;
    if (ech) {
        e[n++] = 0xfe;
        e[n++] = 0x0d;
        e[n++] = 0;
        e[n++] = 1;
        e[n++] = 0;
    }
    e[0] = (uint8_t)((n - 2) >> 8);
    e[1] = (uint8_t)(n - 2);
    return n;
}

static void test_tls(void **state)
{
    uint8_t b[8192], e[1024];
    sp_tls_hello_t h;
    size_t n = hello(b, e, sni_ext(e, "API.Example.com", false));
    assert_int_equal(sp_tls_client_hello(b, n, &h), SP_PARSE_OK);
    assert_string_equal(h.sni, "api.example.com");
    assert_false(h.ech);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sp_tls_client_hello(b, i, &h), SP_PARSE_MORE);
    n = hello(b, e, sni_ext(e, "a.example", true));
    assert_int_equal(sp_tls_client_hello(b, n, &h), SP_PARSE_OK);
    assert_true(h.ech);
    /* No extensions: no SNI. */
    n = hello(b, e, 0);
    assert_int_equal(sp_tls_client_hello(b, n, &h), SP_PARSE_OK);
    assert_string_equal(h.sni, "");
    /* A name that is not a DNS name, an inner length past the extension. */
    n = hello(b, e, sni_ext(e, "bad name", false));
    assert_int_equal(sp_tls_client_hello(b, n, &h), -EINVAL);
    n = hello(b, e, sni_ext(e, "a.example", false));
    b[9 + 2 + 32 + 1 + 2 + 2 + 2 + 2 + 2 + 2 + 1] = 0xff; /* host_name length */
    assert_int_equal(sp_tls_client_hello(b, n, &h), -EINVAL);
    /* Not TLS at all. */
    assert_int_equal(sp_tls_client_hello((const uint8_t *)"GET / HTTP/1.1\r\n", 16, &h), -EINVAL);
    /* Random mutations never crash. */
    uint8_t c[8192];
    n = hello(b, e, sni_ext(e, "a.example", false));
    for (int i = 0; i < 20000; i++) {
        memcpy(c, b, n);
        for (int k = 0; k < 3; k++)
            c[prng() % n] = (uint8_t)prng();
        (void)sp_tls_client_hello(c, n, &h);
    }
}

static int head(const char *s, sp_http_head_t *h)
{
    const char *why = NULL;
    return sp_http_request_head((const uint8_t *)s, strlen(s), h, &why);
}

static void test_http(void **state)
{
    sp_http_head_t h;
    assert_int_equal(head("GET /x HTTP/1.1\r\nHost: Allowed.Test:8080\r\nAccept: */*\r\n\r\n", &h),
                     SP_PARSE_OK);
    assert_string_equal(h.host, "allowed.test");
    assert_int_equal(h.host_port, 8080);
    assert_int_equal(h.content_length, -1);
    assert_int_equal(head("POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 12\r\n\r\nbody", &h),
                     SP_PARSE_OK);
    assert_int_equal(h.content_length, 12);
    assert_int_equal(head("GET / HTTP/1.1\r\nHost: a.test\r\n", &h), SP_PARSE_MORE);
    const char *bad[] = {
        "GET / HTTP/1.1\r\n\r\n",                                       /* no Host */
        "GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",       /* two */
        "GET / HTTP/1.1\r\nHost: a.test\r\nX: y\r\n z\r\n\r\n",         /* obs-fold */
        "GET / HTTP/1.1\nHost: a.test\r\n\r\n",                         /* bare LF */
        "GET / HTTP/1.1\r\nHost: a.test\rX: y\r\n\r\n",                 /* bare CR */
        "GET / HTTP/1.1\r\nHost: a.test\r\nContent-Length: +5\r\n\r\n", /* sign */
        "GET / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n", /* not a name */
        "GET / HTTP/1.1\r\nHost: a.test@b.test\r\n\r\n",
        "GET / HTTP/1.1\r\nHost : a.test\r\n\r\n", /* not a token */
        "GET / HTTP/2.0\r\nHost: a.test\r\n\r\n",
        "GET /\x01 HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a.test\r\nX: a\x01\r\n\r\n",
        "\x16\x03\x01",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (head(bad[i], &h) != -EINVAL)
            fail_msg("accepted bad[%zu]: %s", i, bad[i]);
    assert_int_equal(head("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n", &h),
                     SP_PARSE_OK);
    assert_true(h.is_connect);
    /* Upgrade: websocket (any case) or something else; never twice. */
    assert_int_equal(head("GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: WebSocket\r\n\r\n", &h),
                     SP_PARSE_OK);
    assert_int_equal(h.upgrade, SP_UPGRADE_WEBSOCKET);
    assert_int_equal(head("GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: h2c\r\n\r\n", &h),
                     SP_PARSE_OK);
    assert_int_equal(h.upgrade, SP_UPGRADE_OTHER);
    assert_int_equal(head("GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket, h2c\r\n\r\n", &h),
                     SP_PARSE_OK);
    assert_int_equal(h.upgrade, SP_UPGRADE_OTHER);
    assert_int_equal(head("GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\n"
                          "Upgrade: websocket\r\n\r\n",
                          &h),
                     -EINVAL);
    assert_int_equal(head("GET / HTTP/1.0\r\nHost: a.test\r\n\r\n", &h), SP_PARSE_OK);
    assert_true(h.http10);
    assert_int_equal(
        head("POST / HTTP/1.0\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n", &h), -EINVAL);
    assert_int_equal(
        head("POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n", &h),
        SP_PARSE_OK);
    assert_true(h.chunked);
}

/* What a request target of each form says, whether it may go to the connection's site (the
 * red team's absolute-form bypasses, RFC 9112 3.2), and how an allowed one is forwarded. */
static const char *target(const char *req, bool https, uint16_t port)
{
    static sp_http_head_t h;
    if (head(req, &h) != SP_PARSE_OK)
        return "unparsed";
    return sp_http_target_refusal(&h, https, port);
}

static void test_http_target(void **state)
{
    sp_http_head_t h;
    assert_int_equal(
        head("GET HTTP://Allowed.Test:8080/a?b=c HTTP/1.1\r\nHost: a.test\r\n\r\n", &h),
        SP_PARSE_OK);
    assert_int_equal(h.target_form, SP_TARGET_ABSOLUTE);
    assert_false(h.target_https);
    assert_string_equal(h.target_host, "allowed.test");
    assert_int_equal(h.target_port, 8080);
    assert_int_equal(h.target_off, 4);
    assert_int_equal(h.target_len, strlen("HTTP://Allowed.Test:8080/a?b=c"));
    /* Allowed: origin-form; absolute-form naming the Host, the scheme and the port. */
    assert_null(target("GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n", false, 80));
    assert_null(target("GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n", false, 80));
    assert_null(target("GET http://A.TEST:80 HTTP/1.1\r\nHost: a.test:80\r\n\r\n", false, 80));
    assert_null(target("GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", true, 443));
    assert_null(
        target("GET http://a.test:8080/ HTTP/1.1\r\nHost: a.test:8080\r\n\r\n", false, 8080));
    assert_null(target("OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n", false, 80));
    assert_null(target("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n", false, 80));
    /* The red team's variants, and the rest of the rules. */
    struct {
        const char *req, *why;
        bool https;
        uint16_t port;
    } no[] = {
        {"GET http://evil.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "target_host_mismatch", false,
         0},
        {"GET HTTP://EVIL.TEST/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "target_host_mismatch", false,
         0},
        {"GET http://a.test@evil.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "target_userinfo", false,
         0},
        {"GET http://u:p@a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "target_userinfo", false, 0},
        {"GET https://evil.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "target_host_mismatch", true,
         443},
        {"GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "target_scheme_mismatch", false,
         0},
        {"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "target_scheme_mismatch", true,
         443},
        {"GET http://a.test:81/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "target_port_mismatch", false,
         0},
        {"GET http://a.test:81/ HTTP/1.1\r\nHost: a.test:81\r\n\r\n", "target_port_mismatch", false,
         0},
        {"GET http://a.test/ HTTP/1.1\r\nHost: a.test:8080\r\n\r\n", "target_port_mismatch", false,
         8080},
        {"GET a.test:80 HTTP/1.1\r\nHost: a.test\r\n\r\n", "authority_form_not_connect", false, 0},
        {"GET * HTTP/1.1\r\nHost: a.test\r\n\r\n", "asterisk_not_options", false, 0},
        {"CONNECT http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "bad_connect_target", false, 0},
        {"CONNECT /x HTTP/1.1\r\nHost: a.test\r\n\r\n", "bad_connect_target", false, 0},
        /* No known form at all: refused by the parser. */
        {"GET ftp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "unparsed", false, 0},
        {"GET http://10.0.0.1/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "unparsed", false, 0},
        {"GET http:///x HTTP/1.1\r\nHost: a.test\r\n\r\n", "unparsed", false, 0},
        {"GET /x#frag HTTP/1.1\r\nHost: a.test\r\n\r\n", "unparsed", false, 0},
        {"GET a.test HTTP/1.1\r\nHost: a.test\r\n\r\n", "unparsed", false, 0},
        {"CONNECT a.test HTTP/1.1\r\nHost: a.test\r\n\r\n", "unparsed", false, 0},
    };
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        const char *why = target(no[i].req, no[i].https, no[i].port ? no[i].port : 80);
        if (!why || strcmp(why, no[i].why) != 0)
            fail_msg("%s: %s, not %s", no[i].req, why ? why : "allowed", no[i].why);
    }
    /* Forwarded: absolute-form becomes origin-form, nothing else changes. */
    const struct {
        const char *in, *out;
    } fw[] = {
        {"GET http://a.test/x?y HTTP/1.1\r\nHost: a.test\r\n\r\n",
         "GET /x?y HTTP/1.1\r\nHost: a.test\r\n\r\n"},
        {"GET http://a.test HTTP/1.1\r\nHost: a.test\r\n\r\n",
         "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"},
        {"HEAD http://a.test:80?q HTTP/1.0\r\nHost: a.test\r\n\r\n",
         "HEAD /?q HTTP/1.0\r\nHost: a.test\r\n\r\n"},
        {"GET /same HTTP/1.1\r\nHost: a.test\r\n\r\n",
         "GET /same HTTP/1.1\r\nHost: a.test\r\n\r\n"},
    };
    for (size_t i = 0; i < sizeof(fw) / sizeof(fw[0]); i++) {
        uint8_t out[256];
        assert_int_equal(head(fw[i].in, &h), SP_PARSE_OK);
        size_t n = sp_http_head_forward((const uint8_t *)fw[i].in, &h, out);
        assert_true(n <= h.head_len + 1);
        if (n != strlen(fw[i].out) || memcmp(out, fw[i].out, n) != 0)
            fail_msg("forwarded %s as %.*s", fw[i].in, (int)n, out);
    }
    /* A long target (a signed URL) is fine: only the head's size bounds it. */
    char big[4096];
    snprintf(big, sizeof(big), "GET /%0*d HTTP/1.1\r\nHost: a.test\r\n\r\n", 3000, 7);
    assert_int_equal(head(big, &h), SP_PARSE_OK);
    assert_int_equal(h.target_len, 3001);
}

/* Feeds s whole, then byte by byte: the same outcome and the same end both ways. */
static int chunked(const char *s, size_t *used)
{
    sp_chunked_t st;
    const char *why = NULL;
    size_t len = strlen(s), u = 0;
    sp_chunked_init(&st);
    int whole = sp_chunked_feed(&st, (const uint8_t *)s, len, &u, &why);
    *used = u;
    sp_chunked_init(&st);
    int rc = SP_PARSE_MORE;
    size_t i = 0;
    for (; i < len && rc == SP_PARSE_MORE; i++) {
        rc = sp_chunked_feed(&st, (const uint8_t *)s + i, 1, &u, &why);
        if (rc >= 0)
            assert_int_equal(u, 1);
    }
    assert_int_equal(rc, whole);
    if (whole == SP_PARSE_OK)
        assert_int_equal(i, *used);
    return whole;
}

static void test_chunked(void **state)
{
    size_t used = 0;
    const char *body = "5\r\nhello\r\n1A;name=\"v a\"\r\nabcdefghijklmnopqrstuvwxyz\r\n"
                       "0\r\nX-Sum: 1\r\nY: \r\n\r\n";
    char buf[512];
    snprintf(buf, sizeof(buf), "%sGET / HTTP/1.1\r\n", body);
    assert_int_equal(chunked(buf, &used), SP_PARSE_OK);
    assert_int_equal(used, strlen(body)); /* the next request is not the body's */
    assert_int_equal(chunked("0\r\n\r\n", &used), SP_PARSE_OK);
    assert_int_equal(used, 5);
    assert_int_equal(chunked("000000000000004\r\nabcd\r\n0\r\n\r\n", &used), SP_PARSE_OK);
    assert_int_equal(chunked("4\r\nab", &used), SP_PARSE_MORE);
    assert_int_equal(used, 5);
    assert_int_equal(chunked("fffffffffffffff\r\n", &used), SP_PARSE_MORE);

    char ext[400] = "1;";
    memset(ext + 2, 'e', SP_CHUNK_EXT_MAX);
    snprintf(ext + 2 + SP_CHUNK_EXT_MAX, sizeof(ext) - 2 - SP_CHUNK_EXT_MAX, "e\r\nx\r\n0\r\n\r\n");
    char trailers[SP_CHUNK_TRAILERS_MAX + 64] = "0\r\n";
    size_t tl = strlen(trailers);
    while (tl < SP_CHUNK_TRAILERS_MAX)
        tl += (size_t)snprintf(trailers + tl, sizeof(trailers) - tl, "X-Pad: 0123456789abcdef\r\n");
    snprintf(trailers + tl, sizeof(trailers) - tl, "\r\n");
    const char *bad[] = {
        "g\r\n",           /* not hex */
        "\r\n",            /* no size */
        " 5\r\nhello\r\n", /* whitespace */
        "5 \r\nhello\r\n",
        "+5\r\nhello\r\n",
        "0x5\r\nhello\r\n",
        "1000000000000000\r\n", /* 16 digits: could overflow */
        "ffffffffffffffffff\r\n",
        "5\nhello\r\n",    /* bare LF */
        "5\rhello\r\n",    /* bare CR */
        "5\r\nhelloX\r\n", /* data longer than its size */
        "5\r\nhello\n0\r\n\r\n",
        "5;a\x01\r\nhello\r\n", /* control character in an extension */
        "5;a\nb\r\nhello\r\n",
        ext,                   /* extension too long */
        "0\r\nX Y: 1\r\n\r\n", /* trailer name not a token */
        "0\r\nX-Y 1\r\n\r\n",  /* no colon */
        "0\r\nX: 1\n\r\n",     /* bare LF in the trailers */
        "0\r\nX: \x7f\r\n\r\n",
        "0\r\n\rX",
        trailers, /* trailers too large */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (chunked(bad[i], &used) != -EINVAL)
            fail_msg("accepted bad chunked[%zu]: %.60s", i, bad[i]);
    ext[2 + SP_CHUNK_EXT_MAX] = '\r';
    snprintf(ext + 2 + SP_CHUNK_EXT_MAX, sizeof(ext) - 2 - SP_CHUNK_EXT_MAX, "\r\nx\r\n0\r\n\r\n");
    assert_int_equal(chunked(ext, &used), SP_PARSE_OK); /* exactly at the limit */

    /* Random corruption of a valid body never crashes, and what is accepted ends in place. */
    for (int round = 0; round < 20000; round++) {
        char m[128];
        snprintf(m, sizeof(m), "%s", body);
        size_t ml = strlen(m);
        for (int k = 0; k < 3; k++)
            m[prng() % ml] = (char)(prng() % 255 + 1);
        sp_chunked_t st;
        const char *why = NULL;
        sp_chunked_init(&st);
        int rc = sp_chunked_feed(&st, (const uint8_t *)m, ml, &used, &why);
        if (rc == SP_PARSE_OK)
            assert_true(used <= ml);
        else if (rc < 0)
            assert_non_null(why);
    }
}

static void test_response_head(void **state)
{
    int st = 0;
    size_t hl = 0;
    const char *ok = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x02hi";
    assert_int_equal(sp_http_response_head((const uint8_t *)ok, strlen(ok), &st, &hl), SP_PARSE_OK);
    assert_int_equal(st, 101);
    assert_int_equal(hl, strlen(ok) - 4);
    assert_int_equal(sp_http_response_head((const uint8_t *)"HTTP/1.0 200\r\n\r\n", 18, &st, &hl),
                     SP_PARSE_OK);
    assert_int_equal(st, 200);
    assert_int_equal(sp_http_response_head((const uint8_t *)"HTTP/1.1 10", 11, &st, &hl),
                     SP_PARSE_MORE);
    const char *bad[] = {"HTTP/2 101 x\r\n\r\n", "HTTP/1.1 1O1 x\r\n\r\n", "http/1.1 101 x\r\n\r\n",
                         "HTTP/1.1  101 x\r\n\r\n", "SSH-2.0-x\r\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(sp_http_response_head((const uint8_t *)bad[i], strlen(bad[i]), &st, &hl),
                         -EINVAL);
}

static void test_netpolicy(void **state)
{
    sp_netentry_t e;
    assert_int_equal(sp_netentry_parse("api.example.com", &e), 0);
    assert_true(sp_netentry_match_name(&e, "API.example.com", 443));
    assert_false(sp_netentry_match_name(&e, "x.api.example.com", 443));
    assert_int_equal(sp_netentry_parse("*.example.com:443", &e), 0);
    assert_true(sp_netentry_match_name(&e, "a.b.example.com", 443));
    assert_true(sp_netentry_match_name(&e, "a.example.com", 0)); /* DNS ignores ports */
    assert_false(sp_netentry_match_name(&e, "a.example.com", 80));
    assert_false(sp_netentry_match_name(&e, "example.com", 443));
    assert_false(sp_netentry_match_name(&e, "badexample.com", 443));
    assert_int_equal(sp_netentry_parse("203.0.113.0/24:5432", &e), 0);
    assert_true(sp_netentry_match_addr(&e, 0xcb007107, 5432));
    assert_false(sp_netentry_match_addr(&e, 0xcb007107, 5433));
    assert_false(sp_netentry_match_addr(&e, 0xcb007207, 5432));
    assert_int_equal(sp_netentry_parse("0.0.0.0/0", &e), 0);
    assert_true(sp_netentry_match_addr(&e, 0x01020304, 1));
    const char *bad[] = {"",       "Example.com", "example",     "*.com.",      "a..b",
                         "-a.b",   "a-.b",        "*.*.b.c",     "a.b:0",       "a.b:65536",
                         "a.b:+1", "a.b:1:2",     "10.0.0.1/33", "10.0.0.1/24", "256.0.0.1",
                         "1.2.3",  "1.2.3.4.5",   "01.2.3.4/32", "a b.c",       "http://a.b"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (sp_netentry_parse(bad[i], &e) == 0)
            fail_msg("accepted entry: '%s'", bad[i]);
    sp_netmode_t m;
    assert_int_equal(sp_netmode_parse("allowlist", &m), 0);
    assert_int_equal(m, SP_NET_ALLOWLIST);
    assert_int_equal(sp_netmode_parse("allow", &m), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tls),           cmocka_unit_test(test_http),
        cmocka_unit_test(test_http_target),   cmocka_unit_test(test_chunked),
        cmocka_unit_test(test_response_head), cmocka_unit_test(test_netpolicy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
