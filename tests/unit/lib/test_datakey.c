/* Data keys and captured output (datakey.h): wrap/unwrap under the master key (another
 * sandbox, another key, a tampered byte all fail) and output sealing bound to its place.
 * Redaction is tests/unit/lib/test_redact.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "datakey.h"

static void key_of(sp_cred_key_t *k, uint8_t fill)
{
    memset(k, 0, sizeof(*k));
    memset(k->k, fill, sizeof(k->k));
}

static void test_wrap_unwrap(void **state)
{
    (void)state;
    sp_cred_key_t master, other, dk, got;
    key_of(&master, 7);
    key_of(&other, 8);
    assert_int_equal(sp_datakey_generate(&dk), 0);
    assert_int_equal(strlen(dk.id), SP_CRED_KEY_ID_LEN);
    uint8_t nonce[SP_CRED_NONCE_LEN], w[SP_DATAKEY_WRAPPED_LEN];
    assert_int_equal(sp_datakey_wrap(&master, "sbx_a", &dk, nonce, w), 0);
    assert_null(memmem(w, sizeof(w), dk.k, 8));
    assert_int_equal(sp_datakey_unwrap(&master, "sbx_a", nonce, w, sizeof(w), &got), 0);
    assert_memory_equal(got.k, dk.k, SP_CRED_KEY_LEN);
    assert_string_equal(got.id, dk.id);
    assert_int_equal(sp_datakey_unwrap(&other, "sbx_a", nonce, w, sizeof(w), &got), -EBADMSG);
    assert_int_equal(sp_datakey_unwrap(&master, "sbx_b", nonce, w, sizeof(w), &got), -EBADMSG);
    assert_int_equal(sp_datakey_unwrap(&master, "sbx_a", nonce, w, sizeof(w) - 1, &got), -EBADMSG);
    for (size_t i = 0; i < sizeof(w); i++) {
        w[i] ^= 0x20;
        assert_int_equal(sp_datakey_unwrap(&master, "sbx_a", nonce, w, sizeof(w), &got), -EBADMSG);
        w[i] ^= 0x20;
    }
    uint8_t zero[SP_CRED_KEY_LEN] = {0};
    assert_memory_equal(got.k, zero, SP_CRED_KEY_LEN); /* wiped on failure */
}

static void test_output_seal_open(void **state)
{
    (void)state;
    sp_cred_key_t dk, other;
    key_of(&dk, 1);
    key_of(&other, 2);
    const uint8_t pt[] = "hello secret world";
    size_t n = sizeof(pt) - 1;
    uint8_t nonce[SP_CRED_NONCE_LEN], nonce2[SP_CRED_NONCE_LEN], ct[64], ct2[64], out[64];
    assert_int_equal(sp_output_seal(&dk, "sbx_a", "cmd_1", 1, 0, pt, n, nonce, ct), 0);
    assert_null(memmem(ct, n + SP_CRED_TAG_LEN, "secret", 6));
    assert_int_equal(sp_output_open(&dk, "sbx_a", "cmd_1", 1, 0, nonce, ct, n + 16, out), 0);
    assert_memory_equal(out, pt, n);
    /* A fresh nonce per seal: the same text twice seals differently. */
    assert_int_equal(sp_output_seal(&dk, "sbx_a", "cmd_1", 1, 0, pt, n, nonce2, ct2), 0);
    assert_memory_not_equal(nonce, nonce2, SP_CRED_NONCE_LEN);
    /* Bound to key, sandbox, command, stream and offset. */
    assert_int_equal(sp_output_open(&other, "sbx_a", "cmd_1", 1, 0, nonce, ct, n + 16, out),
                     -EBADMSG);
    assert_int_equal(sp_output_open(&dk, "sbx_b", "cmd_1", 1, 0, nonce, ct, n + 16, out), -EBADMSG);
    assert_int_equal(sp_output_open(&dk, "sbx_a", "cmd_2", 1, 0, nonce, ct, n + 16, out), -EBADMSG);
    assert_int_equal(sp_output_open(&dk, "sbx_a", "cmd_1", 2, 0, nonce, ct, n + 16, out), -EBADMSG);
    assert_int_equal(sp_output_open(&dk, "sbx_a", "cmd_1", 1, 16, nonce, ct, n + 16, out),
                     -EBADMSG);
    ct[3] ^= 1;
    assert_int_equal(sp_output_open(&dk, "sbx_a", "cmd_1", 1, 0, nonce, ct, n + 16, out), -EBADMSG);
    assert_int_equal(sp_output_open(&dk, "sbx_a", "cmd_1", 1, 0, nonce, ct, 3, out), -EBADMSG);
    /* Empty output seals to a tag only. */
    assert_int_equal(sp_output_seal(&dk, "sbx_a", "cmd_1", 1, 0, pt, 0, nonce, ct), 0);
    assert_int_equal(sp_output_open(&dk, "sbx_a", "cmd_1", 1, 0, nonce, ct, 16, out), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrap_unwrap),
        cmocka_unit_test(test_output_seal_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
