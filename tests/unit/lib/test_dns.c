/* The DNS wire code egressd uses on hostile input (dns.h): a strict query parser, the answer
 * reader (compression only backwards, bounded), and the messages it builds. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

#include "dns.h"

static size_t query(uint8_t *b, const char *name, uint16_t type)
{
    size_t n = sp_dns_build_query(b, SP_DNS_MSG_MAX, 0x1234, name, type);
    assert_true(n > 12);
    return n;
}

static void test_query_round_trip(void **state)
{
    uint8_t b[SP_DNS_MSG_MAX];
    sp_dns_query_t q;
    size_t n = query(b, "Www.Example.COM", SP_DNS_TYPE_A);
    assert_int_equal(sp_dns_parse_query(b, n, &q), 0);
    assert_string_equal(q.name, "www.example.com");
    assert_int_equal(q.id, 0x1234);
    assert_int_equal(q.qtype, SP_DNS_TYPE_A);
    assert_int_equal(q.qclass, SP_DNS_CLASS_IN);
    assert_true(q.rd);
}

static void test_query_hostile(void **state)
{
    uint8_t b[SP_DNS_MSG_MAX + 16];
    sp_dns_query_t q;
    size_t n = query(b, "a.example", SP_DNS_TYPE_A);
    /* Every truncation fails. */
    for (size_t i = 0; i < n; i++)
        assert_int_equal(sp_dns_parse_query(b, i, &q), -EINVAL);
    /* Trailing bytes. */
    b[n] = 0;
    assert_int_equal(sp_dns_parse_query(b, n + 1, &q), -EINVAL);
    /* A response, another opcode, two questions, an answer record. */
    uint8_t c[SP_DNS_MSG_MAX] = {0};
    memcpy(c, b, n);
    c[2] |= 0x80;
    assert_int_equal(sp_dns_parse_query(c, n, &q), -EINVAL);
    memcpy(c, b, n);
    c[2] |= 0x08;
    assert_int_equal(sp_dns_parse_query(c, n, &q), -EINVAL);
    memcpy(c, b, n);
    c[5] = 2;
    assert_int_equal(sp_dns_parse_query(c, n, &q), -EINVAL);
    memcpy(c, b, n);
    c[7] = 1;
    assert_int_equal(sp_dns_parse_query(c, n, &q), -EINVAL);
    /* A compression pointer in a query (a loop onto itself). */
    uint8_t ptr[] = {0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1};
    assert_int_equal(sp_dns_parse_query(ptr, sizeof(ptr), &q), -EINVAL);
    /* Label longer than 63, label running past the end, bytes outside [A-Za-z0-9_-]. */
    uint8_t longl[12 + 1 + 64 + 1 + 4] = {0, 1, 1, 0, 0, 1};
    longl[12] = 64;
    memset(longl + 13, 'a', 64);
    assert_int_equal(sp_dns_parse_query(longl, sizeof(longl), &q), -EINVAL);
    uint8_t past[] = {0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 9, 'a', 'b'};
    assert_int_equal(sp_dns_parse_query(past, sizeof(past), &q), -EINVAL);
    uint8_t odd[] = {0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'a', '.', 'b', 0, 0, 1, 0, 1};
    assert_int_equal(sp_dns_parse_query(odd, sizeof(odd), &q), -EINVAL);
    uint8_t nul[] = {0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'a', 0, 'b', 0, 0, 1, 0, 1};
    assert_int_equal(sp_dns_parse_query(nul, sizeof(nul), &q), -EINVAL);
    /* The root name, and a name over 253 characters. */
    uint8_t root[] = {0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1};
    assert_int_equal(sp_dns_parse_query(root, sizeof(root), &q), -EINVAL);
    uint8_t big[SP_DNS_MSG_MAX] = {0, 1, 1, 0, 0, 1};
    size_t off = 12;
    for (int i = 0; i < 5; i++) {
        big[off++] = 60;
        memset(big + off, 'x', 60);
        off += 60;
    }
    big[off++] = 0;
    big[off + 1] = 1;
    big[off + 3] = 1;
    assert_int_equal(sp_dns_parse_query(big, off + 4, &q), -EINVAL);
    /* EDNS OPT is accepted and ignored; any other additional record is not. */
    memcpy(c, b, n);
    c[11] = 1;
    uint8_t opt[] = {0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0};
    memcpy(c + n, opt, sizeof(opt));
    assert_int_equal(sp_dns_parse_query(c, n + sizeof(opt), &q), 0);
    c[n + 2] = 1;
    assert_int_equal(sp_dns_parse_query(c, n + sizeof(opt), &q), -EINVAL);
    assert_int_equal(sp_dns_header_id(b, 11), -1);
    assert_int_equal(sp_dns_header_id(b, 12), 0x1234);
}

/* An upstream answer: question, CNAME www -> cdn, A cdn 192.0.2.7, A for an unrelated owner. */
static size_t answer(uint8_t *b)
{
    size_t n = sp_dns_build_query(b, SP_DNS_MSG_MAX, 0x4242, "www.example.com", SP_DNS_TYPE_A);
    b[2] |= 0x80;
    b[7] = 3;
    uint8_t
        rr
            [] =
                {
                    0xc0, 12,  0,    5,   0,    1,  0, 0,   0,   60,  0,   6, 3, 'c',
                    'd',  'n', 0xc0, 16, /* cdn.example.com
                                          */
                    3,    'c', 'd',  'n', 0xc0, 16, 0, 1,   0,   1,   0,   0, 0, 30,
                    0,    4,   192,  0,   2,    7,  4, 'e', 'v', 'i', 'l', 0, 0, 1,
                    0,    1,   0,    0,   0,    30, 0, 4,   203, 0,   113, 9,
                };
    memcpy(b + n, rr, sizeof(rr));
    return n + sizeof(rr);
}

static void test_response(void **state)
{
    uint8_t b[SP_DNS_MSG_MAX];
    size_t n = answer(b);
    sp_dns_a_t a[4];
    size_t got = 0;
    int rcode = -1;
    assert_int_equal(sp_dns_parse_response(b, n, 0x4242, "www.example.com", a, 4, &got, &rcode), 0);
    assert_int_equal(rcode, 0);
    assert_int_equal(got, 1); /* the unrelated owner's record is not taken */
    assert_memory_equal(&a[0].addr_be, "\xc0\x00\x02\x07", 4);
    assert_int_equal(a[0].ttl, 30);
    /* Wrong id, wrong name, every truncation. */
    assert_int_equal(sp_dns_parse_response(b, n, 0x4243, "www.example.com", a, 4, &got, &rcode),
                     -EINVAL);
    assert_int_equal(sp_dns_parse_response(b, n, 0x4242, "example.com", a, 4, &got, &rcode),
                     -EINVAL);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(
            sp_dns_parse_response(b, i, 0x4242, "www.example.com", a, 4, &got, &rcode) == 0 &&
                got == 1,
            0);
    /* A forward pointer, a pointer to itself. */
    uint8_t c[SP_DNS_MSG_MAX] = {0};
    memcpy(c, b, n);
    c[12 + 17 + 4 + 1] = 0xff; /* the first RR's owner pointer -> far forward */
    assert_int_equal(sp_dns_parse_response(c, n, 0x4242, "www.example.com", a, 4, &got, &rcode),
                     -EINVAL);
    memcpy(c, b, n);
    size_t rr = 12 + 17 + 4;
    c[rr + 1] = (uint8_t)rr;
    assert_int_equal(sp_dns_parse_response(c, n, 0x4242, "www.example.com", a, 4, &got, &rcode),
                     -EINVAL);
    /* Random bytes never crash (run under ASan in CI). */
    assert_true(n > 12);
    for (int i = 0; i < 20000; i++) {
        memcpy(c, b, n);
        for (int k = 0; k < 3; k++)
            c[prng() % (n ? n : 1)] = (uint8_t)prng();
        (void)sp_dns_parse_response(c, n, 0x4242, "www.example.com", a, 4, &got, &rcode);
        sp_dns_query_t q;
        (void)sp_dns_parse_query(c, (size_t)(prng() % (n ? n : 1)), &q);
    }
}

static void test_build_response(void **state)
{
    uint8_t b[SP_DNS_MSG_MAX], r[SP_DNS_MSG_MAX];
    sp_dns_query_t q;
    size_t n = query(b, "allowed.test", SP_DNS_TYPE_A);
    assert_int_equal(sp_dns_parse_query(b, n, &q), 0);
    sp_dns_a_t a[2] = {{.addr_be = 0x0a01a8c6, .ttl = 9999}, {.addr_be = 0x0b01a8c6, .ttl = 5}};
    size_t rn = sp_dns_build_response(r, sizeof(r), &q, SP_DNS_NOERROR, a, 2, 300);
    sp_dns_a_t back[4];
    size_t got = 0;
    int rcode = -1;
    assert_int_equal(sp_dns_parse_response(r, rn, 0x1234, "allowed.test", back, 4, &got, &rcode),
                     0);
    assert_int_equal(got, 2);
    assert_int_equal(back[0].ttl, 300);
    assert_int_equal(back[1].ttl, 5);
    rn = sp_dns_build_response(r, sizeof(r), &q, SP_DNS_REFUSED, a, 2, 300);
    assert_int_equal(sp_dns_parse_response(r, rn, 0x1234, "allowed.test", back, 4, &got, &rcode),
                     0);
    assert_int_equal(rcode, SP_DNS_REFUSED);
    assert_int_equal(got, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_query_round_trip),
        cmocka_unit_test(test_query_hostile),
        cmocka_unit_test(test_response),
        cmocka_unit_test(test_build_response),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
