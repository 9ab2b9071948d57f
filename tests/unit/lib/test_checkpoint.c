/* Checkpoint lines (checkpoint.h): signed and verified round trip, and every way a line can
 * be wrong: a field changed, the signature of another key, a signer that is no eventlog or
 * that the keyring does not know, and text the strict parser refuses. */
#include <setjmp.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "error.h"

static sp_sign_key_t *k_eventlog, *k_other, *k_gateway;
static sp_keyring_t *ring;

static int setup(void **state)
{
    uint8_t s1[32] = {1}, s2[32] = {2}, s3[32] = {3}, pub[SP_PUBKEY_LEN];
    sp_keyring_new(&ring);
    if (sp_sign_key_from_raw(s1, &k_eventlog) < 0 || sp_sign_key_from_raw(s2, &k_other) < 0 ||
        sp_sign_key_from_raw(s3, &k_gateway) < 0)
        return -1;
    sp_sign_key_public(k_eventlog, pub);
    sp_keyring_add(ring, "eventlog", pub);
    sp_sign_key_public(k_gateway, pub);
    sp_keyring_add(ring, "gateway", pub);
    return 0;
}

static int teardown(void **state)
{
    sp_sign_key_free(k_eventlog);
    sp_sign_key_free(k_other);
    sp_sign_key_free(k_gateway);
    sp_keyring_free(ring);
    return 0;
}

static sp_ckpt_t sample(void)
{
    sp_ckpt_t c = {.signer = "eventlog",
                   .seq = 1234,
                   .rows = 1230,
                   .at_us = 1764643200123456LL,
                   .verify_from = 17};
    for (int i = 0; i < SP_SHA256_LEN; i++)
        c.head[i] = (uint8_t)(i * 9);
    return c;
}

static void test_round_trip(void **state)
{
    char line[SP_CKPT_LINE_MAX];
    sp_ckpt_t c = sample(), got;
    int n = sp_ckpt_format(&c, k_eventlog, line);
    assert_true(n > 0 && line[n - 1] == '\n');
    assert_int_equal(
        strncmp(line, "space-ckpt v1 signer=eventlog seq=1234 rows=1230 head=0009", 58), 0);
    assert_non_null(strstr(line, " at=2025-12-02T02:40:00.123456Z verify_from=17 sig="));
    assert_int_equal(sp_ckpt_verify(ring, line, (size_t)n, &got), 0);
    assert_int_equal(got.seq, 1234);
    assert_int_equal(got.rows, 1230);
    assert_int_equal(got.at_us, c.at_us);
    assert_int_equal(got.verify_from, 17);
    assert_memory_equal(got.head, c.head, SP_SHA256_LEN);
    assert_string_equal(got.signer, "eventlog");
    /* Without the newline too. */
    assert_int_equal(sp_ckpt_verify(ring, line, (size_t)n - 1, &got), 0);
}

/* Replaces the first occurrence of from by to (same length) in a copy of line. */
static int verify_edited(const char *line, const char *from, const char *to)
{
    char copy[SP_CKPT_LINE_MAX + 8];
    sp_ckpt_t got;
    snprintf(copy, sizeof(copy), "%s", line);
    char *p = strstr(copy, from);
    assert_non_null(p);
    size_t fl = strlen(from), tl = strlen(to);
    memmove(p + tl, p + fl, strlen(p + fl) + 1);
    memcpy(p, to, tl);
    return sp_ckpt_verify(ring, copy, strlen(copy), &got);
}

static void test_tampered(void **state)
{
    char line[SP_CKPT_LINE_MAX];
    sp_ckpt_t c = sample();
    assert_true(sp_ckpt_format(&c, k_eventlog, line) > 0);
    assert_int_equal(verify_edited(line, "seq=1234", "seq=1235"), SP_ESIGNATURE);
    assert_int_equal(verify_edited(line, "rows=1230", "rows=1231"), SP_ESIGNATURE);
    assert_int_equal(verify_edited(line, "head=0009", "head=0109"), SP_ESIGNATURE);
    assert_int_equal(verify_edited(line, "verify_from=17", "verify_from=0"), SP_ESIGNATURE);
    assert_int_equal(verify_edited(line, ".123456Z", ".123457Z"), SP_ESIGNATURE);
    /* Strict text: leading zeros, upper-case hex, a field missing or added, junk after. */
    assert_int_equal(verify_edited(line, "seq=1234", "seq=01234"), SP_EDECODE);
    assert_int_equal(verify_edited(line, "head=0009", "head=0A09"), SP_EDECODE);
    assert_int_equal(verify_edited(line, " rows=1230", ""), SP_EDECODE);
    assert_int_equal(verify_edited(line, " verify_from=17", " verify_from=17 x=1"), SP_EDECODE);
    assert_int_equal(verify_edited(line, "\n", " \n"), SP_EDECODE);
    assert_int_equal(verify_edited(line, "space-ckpt v1", "space-ckpt v2"), SP_EDECODE);
    assert_int_equal(verify_edited(line, "seq=1234", "seq=99999999999999999999"), SP_EDECODE);
}

static void test_signers(void **state)
{
    char line[SP_CKPT_LINE_MAX];
    sp_ckpt_t c = sample(), got;
    /* Another key under the eventlog's name. */
    int n = sp_ckpt_format(&c, k_other, line);
    assert_int_equal(sp_ckpt_verify(ring, line, (size_t)n, &got), SP_ESIGNATURE);
    /* An eventlog identity the keyring does not know. */
    snprintf(c.signer, sizeof(c.signer), "eventlog-2");
    n = sp_ckpt_format(&c, k_eventlog, line);
    assert_int_equal(sp_ckpt_verify(ring, line, (size_t)n, &got), SP_ESIGNER);
    /* Only eventlog identities sign checkpoints: not even a known gateway. */
    snprintf(c.signer, sizeof(c.signer), "gateway");
    assert_int_equal(sp_ckpt_format(&c, k_gateway, line), -EINVAL);
    c = sample();
    assert_true(sp_ckpt_format(&c, k_eventlog, line) > 0);
    assert_int_equal(verify_edited(line, "signer=eventlog", "signer=gateway"), SP_ENOTALLOWED);
}

/* Chain v2 covers each field of the row. */
static void test_chain_v2(void **state)
{
    uint8_t prev[SP_SHA256_LEN] = {7}, sha[SP_SHA256_LEN] = {9}, base[SP_SHA256_LEN],
            h[SP_SHA256_LEN];
    sp_chain_row_t r = {.seq = 5,
                        .subject = "space.ev.x",
                        .subject_len = 10,
                        .payload_size = 100,
                        .payload_sha256 = sha,
                        .accepted = 0,
                        .reason = "unsigned",
                        .reason_len = 8};
    sp_chain2_next(prev, &r, base);
    sp_chain_row_t v = r;
    v.seq = 6;
    sp_chain2_next(prev, &v, h);
    assert_memory_not_equal(h, base, SP_SHA256_LEN);
    v = r;
    v.accepted = 1;
    v.reason = NULL;
    v.reason_len = 0;
    sp_chain2_next(prev, &v, h);
    assert_memory_not_equal(h, base, SP_SHA256_LEN);
    v = r;
    v.reason = "";
    v.reason_len = 0;
    sp_chain2_next(prev, &v, h);
    assert_memory_not_equal(h, base, SP_SHA256_LEN);
    v = r;
    v.payload_size = 101;
    sp_chain2_next(prev, &v, h);
    assert_memory_not_equal(h, base, SP_SHA256_LEN);
    v = r;
    v.subject_len = 9;
    sp_chain2_next(prev, &v, h);
    assert_memory_not_equal(h, base, SP_SHA256_LEN);
    /* In place. */
    memcpy(h, prev, SP_SHA256_LEN);
    sp_chain2_next(h, &r, h);
    assert_memory_equal(h, base, SP_SHA256_LEN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_tampered),
        cmocka_unit_test(test_signers),
        cmocka_unit_test(test_chain_v2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
