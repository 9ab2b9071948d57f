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
        cmocka_unit_test(test_tls),
        cmocka_unit_test(test_http),
        cmocka_unit_test(test_netpolicy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
