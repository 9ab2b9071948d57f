/* SHA-256 against the FIPS 180-4 example vectors, the event log's chain rule, and strict hex. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"

static void assert_sha256_hex(const void *data, size_t len, const char *want)
{
    uint8_t d[SP_SHA256_LEN];
    char hex[SP_SHA256_HEX_LEN + 1];

    sp_sha256(data, len, d);
    sp_hex_encode(d, sizeof(d), hex);
    assert_string_equal(hex, want);
}

static void test_sha256_vectors(void **state)
{
    assert_sha256_hex("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_sha256_hex(NULL, 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_sha256_hex("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    assert_sha256_hex(two_blocks, strlen(two_blocks),
                      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

    char *million = malloc(1000000);
    assert_non_null(million);
    memset(million, 'a', 1000000);
    assert_sha256_hex(million, 1000000,
                      "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
}

static void test_chain_genesis_is_zero(void **state)
{
    for (size_t i = 0; i < SP_SHA256_LEN; i++)
        assert_int_equal(SP_CHAIN_GENESIS[i], 0);
}

/* hash_n = SHA-256(hash_{n-1} || data): checked against hashing the concatenation directly. */
static void test_chain_next_is_hash_of_concatenation(void **state)
{
    uint8_t buf[SP_SHA256_LEN + 3] = {0}, want[SP_SHA256_LEN], got[SP_SHA256_LEN];

    buf[SP_SHA256_LEN] = 'a';
    buf[SP_SHA256_LEN + 1] = 'b';
    buf[SP_SHA256_LEN + 2] = 'c';
    sp_sha256(buf, sizeof(buf), want);
    sp_chain_next(SP_CHAIN_GENESIS, "abc", 3, got);
    assert_memory_equal(got, want, SP_SHA256_LEN);

    /* Not the plain hash of the data: the previous link matters. */
    sp_sha256("abc", 3, want);
    assert_memory_not_equal(got, want, SP_SHA256_LEN);

    /* An empty envelope still moves the chain. */
    sp_chain_next(SP_CHAIN_GENESIS, NULL, 0, got);
    sp_sha256(SP_CHAIN_GENESIS, SP_SHA256_LEN, want);
    assert_memory_equal(got, want, SP_SHA256_LEN);
}

/* Reordering or changing any event changes every later link. */
static void test_chain_detects_reorder_and_change(void **state)
{
    const char *ev[3] = {"event-1", "event-2", "event-3"};
    uint8_t a[SP_SHA256_LEN], b[SP_SHA256_LEN];

    memcpy(a, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    for (int i = 0; i < 3; i++)
        sp_chain_next(a, ev[i], strlen(ev[i]), a);

    memcpy(b, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    sp_chain_next(b, ev[1], strlen(ev[1]), b);
    sp_chain_next(b, ev[0], strlen(ev[0]), b);
    sp_chain_next(b, ev[2], strlen(ev[2]), b);
    assert_memory_not_equal(a, b, SP_SHA256_LEN);

    memcpy(b, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    sp_chain_next(b, ev[0], strlen(ev[0]), b);
    sp_chain_next(b, "event-X", 7, b);
    sp_chain_next(b, ev[2], strlen(ev[2]), b);
    assert_memory_not_equal(a, b, SP_SHA256_LEN);

    /* Same inputs, same chain (the in-place use above is allowed). */
    memcpy(b, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    for (int i = 0; i < 3; i++)
        sp_chain_next(b, ev[i], strlen(ev[i]), b);
    assert_memory_equal(a, b, SP_SHA256_LEN);
}

static void test_hex_encode_known(void **state)
{
    const uint8_t in[] = {0x00, 0x01, 0x7f, 0x80, 0xab, 0xff};
    char out[2 * sizeof(in) + 1];

    memset(out, 'X', sizeof(out));
    sp_hex_encode(in, sizeof(in), out);
    assert_string_equal(out, "00017f80abff");

    char empty[1] = {'X'};
    sp_hex_encode(in, 0, empty);
    assert_string_equal(empty, "");
}

static void test_hex_round_trip(void **state)
{
    uint8_t in[64], out[64];
    char hex[2 * sizeof(in) + 1];

    uint32_t x = 2463534242u; /* xorshift32: the same bytes on every run */

    for (size_t len = 0; len <= sizeof(in); len++) {
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            in[i] = (uint8_t)x;
        }
        sp_hex_encode(in, len, hex);
        assert_int_equal(strlen(hex), 2 * len);
        memset(out, 0, sizeof(out));
        assert_int_equal(sp_hex_decode(hex, out, len), 0);
        assert_memory_equal(in, out, len);
    }
}

static void test_hex_decode_upper_case(void **state)
{
    uint8_t out[3];

    assert_int_equal(sp_hex_decode("ABcDeF", out, 3), 0);
    assert_int_equal(out[0], 0xab);
    assert_int_equal(out[1], 0xcd);
    assert_int_equal(out[2], 0xef);
}

static void test_hex_decode_rejects(void **state)
{
    static const char *const bad[] = {
        "",         /* too short */
        "abcd",     /* too short */
        "abcdef0",  /* odd, too short */
        "abcdef01", /* too long */
        "abcdeg",   /* not hex */
        "abcde ",   /* trailing space */
        " abcde",   /* leading space */
        "0xabcd",   /* prefix */
        "ab-cde",   /* separator */
        "abcdef\n", /* trailing newline */
        "+bcdef",   /* sign */
    };
    uint8_t out[3];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(out, 0x5a, sizeof(out));
        if (sp_hex_decode(bad[i], out, 3) != -EINVAL)
            fail_msg("accepted '%s'", bad[i]);
        /* Output parameters are written only on success. */
        for (size_t k = 0; k < sizeof(out); k++)
            assert_int_equal(out[k], 0x5a);
    }
    /* An embedded NUL ends the string early. */
    const char nul[] = {'a', 'b', '\0', 'd', 'e', 'f', '\0'};
    assert_int_equal(sp_hex_decode(nul, out, 3), -EINVAL);
    /* Zero bytes: only the empty string. */
    assert_int_equal(sp_hex_decode("", out, 0), 0);
    assert_int_equal(sp_hex_decode("00", out, 0), -EINVAL);
}

/* Incremental hashing in uneven pieces equals the one-shot digest. */
static void test_sha256_incremental(void **state)
{
    (void)state;
    uint8_t data[100000], one[SP_SHA256_LEN], inc[SP_SHA256_LEN];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 131 + 7);
    sp_sha256(data, sizeof(data), one);
    sp_sha256_ctx_t *c = sp_sha256_new();
    size_t at = 0;
    for (size_t step = 1; at < sizeof(data); step = step * 3 + 1) {
        size_t n = step < sizeof(data) - at ? step : sizeof(data) - at;
        sp_sha256_update(c, data + at, n);
        at += n;
    }
    sp_sha256_update(c, data, 0);
    sp_sha256_final(c, inc);
    assert_memory_equal(one, inc, SP_SHA256_LEN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),
        cmocka_unit_test(test_chain_genesis_is_zero),
        cmocka_unit_test(test_chain_next_is_hash_of_concatenation),
        cmocka_unit_test(test_chain_detects_reorder_and_change),
        cmocka_unit_test(test_hex_encode_known),
        cmocka_unit_test(test_hex_round_trip),
        cmocka_unit_test(test_hex_decode_upper_case),
        cmocka_unit_test(test_hex_decode_rejects),
        cmocka_unit_test(test_sha256_incremental),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
