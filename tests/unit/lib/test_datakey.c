/* Data keys and captured output (datakey.h): wrap/unwrap under the master key (another
 * sandbox, another key, a tampered byte all fail), output sealing bound to its place, and
 * redaction of values, also split across chunks at every possible place. */
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
#include "envelope.h"

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

/* Sealed command lines: opened as sealed (cmd and argv forms), bound to key, sandbox and
 * command, a long argv cut at an entry and marked, and no line that is not one form. */
static void test_cmdline_seal_open(void **state)
{
    (void)state;
    sp_cred_key_t dk, other;
    key_of(&dk, 3);
    key_of(&other, 4);
    uint8_t nonce[SP_CRED_NONCE_LEN], *ct = NULL;
    size_t ct_len = 0;
    Space__V1__CommandLine *line = NULL;

    assert_int_equal(
        sp_cmdline_seal(&dk, "sbx_a", "cmd_1", NULL, 0, "echo top-secret", nonce, &ct, &ct_len), 0);
    assert_null(memmem(ct, ct_len, "top-secret", 10));
    assert_int_equal(sp_cmdline_open(&dk, "sbx_a", "cmd_1", nonce, ct, ct_len, &line), 0);
    assert_string_equal(line->cmd, "echo top-secret");
    assert_int_equal(line->n_argv, 0);
    assert_false(line->truncated);
    space__v1__command_line__free_unpacked(line, NULL);
    assert_int_equal(sp_cmdline_open(&other, "sbx_a", "cmd_1", nonce, ct, ct_len, &line), -EBADMSG);
    assert_int_equal(sp_cmdline_open(&dk, "sbx_b", "cmd_1", nonce, ct, ct_len, &line), -EBADMSG);
    assert_int_equal(sp_cmdline_open(&dk, "sbx_a", "cmd_2", nonce, ct, ct_len, &line), -EBADMSG);
    ct[ct_len - 1] ^= 1;
    assert_int_equal(sp_cmdline_open(&dk, "sbx_a", "cmd_1", nonce, ct, ct_len, &line), -EBADMSG);
    assert_int_equal(sp_cmdline_open(&dk, "sbx_a", "cmd_1", nonce, ct, 15, &line), -EBADMSG);
    free(ct);

    char *argv[] = {"/bin/echo", "a b", ""};
    assert_int_equal(sp_cmdline_seal(&dk, "sbx_a", "cmd_1", argv, 3, "", nonce, &ct, &ct_len), 0);
    assert_int_equal(sp_cmdline_open(&dk, "sbx_a", "cmd_1", nonce, ct, ct_len, &line), 0);
    assert_int_equal(line->n_argv, 3);
    assert_string_equal(line->argv[1], "a b");
    assert_string_equal(line->argv[2], "");
    assert_string_equal(line->cmd, "");
    space__v1__command_line__free_unpacked(line, NULL);
    free(ct);

    /* 64 entries of 4 KiB: more than SP_COMMAND_LINE_SEALED_MAX, cut at an entry. */
    char *big[64];
    for (size_t i = 0; i < 64; i++) {
        big[i] = malloc(4097);
        memset(big[i], 'a' + (int)(i % 26), 4096);
        big[i][4096] = '\0';
    }
    assert_int_equal(sp_cmdline_seal(&dk, "sbx_a", "cmd_1", big, 64, NULL, nonce, &ct, &ct_len), 0);
    assert_true(ct_len <= SP_COMMAND_LINE_SEALED_MAX + SP_CRED_TAG_LEN);
    assert_int_equal(sp_cmdline_open(&dk, "sbx_a", "cmd_1", nonce, ct, ct_len, &line), 0);
    assert_true(line->truncated);
    assert_true(line->n_argv > 1 && line->n_argv < 64);
    assert_string_equal(line->argv[line->n_argv - 1], big[line->n_argv - 1]);
    space__v1__command_line__free_unpacked(line, NULL);
    free(ct);
    for (size_t i = 0; i < 64; i++)
        free(big[i]);

    /* Exactly one form. */
    assert_int_equal(sp_cmdline_seal(&dk, "sbx_a", "cmd_1", NULL, 0, "", nonce, &ct, &ct_len),
                     -EINVAL);
    assert_int_equal(sp_cmdline_seal(&dk, "sbx_a", "cmd_1", argv, 3, "x", nonce, &ct, &ct_len),
                     -EINVAL);
}

/* Sealed file paths: opened as sealed, bound to key, sandbox and event type. */
static void test_paths_seal_open(void **state)
{
    (void)state;
    sp_cred_key_t dk, other;
    key_of(&dk, 5);
    key_of(&other, 6);
    uint8_t nonce[SP_CRED_NONCE_LEN], *ct = NULL;
    size_t ct_len = 0;
    Space__V1__FilePaths *fp = NULL;

    assert_int_equal(sp_paths_seal(&dk, "sbx_a", "FileMoved", "/tmp/secret-a", "/tmp/secret-b",
                                   nonce, &ct, &ct_len),
                     0);
    assert_null(memmem(ct, ct_len, "secret", 6));
    assert_int_equal(sp_paths_open(&dk, "sbx_a", "FileMoved", nonce, ct, ct_len, &fp), 0);
    assert_string_equal(fp->path, "/tmp/secret-a");
    assert_string_equal(fp->to, "/tmp/secret-b");
    space__v1__file_paths__free_unpacked(fp, NULL);
    assert_int_equal(sp_paths_open(&other, "sbx_a", "FileMoved", nonce, ct, ct_len, &fp), -EBADMSG);
    assert_int_equal(sp_paths_open(&dk, "sbx_b", "FileMoved", nonce, ct, ct_len, &fp), -EBADMSG);
    assert_int_equal(sp_paths_open(&dk, "sbx_a", "FileRemoved", nonce, ct, ct_len, &fp), -EBADMSG);
    free(ct);
    assert_int_equal(sp_paths_seal(&dk, "sbx_a", "DirCreated", "/d", NULL, nonce, &ct, &ct_len), 0);
    assert_int_equal(sp_paths_open(&dk, "sbx_a", "DirCreated", nonce, ct, ct_len, &fp), 0);
    assert_string_equal(fp->to, "");
    space__v1__file_paths__free_unpacked(fp, NULL);
    free(ct);
    assert_int_equal(sp_paths_seal(&dk, "sbx_a", "DirCreated", "", NULL, nonce, &ct, &ct_len),
                     -EINVAL);
}

static char *redact_chunks(sp_redactor_t *r, const char *text, const size_t *cuts, size_t n)
{
    sp_buf_t out;
    sp_buf_init(&out);
    size_t len = strlen(text), at = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t end = i < n ? cuts[i] : len;
        sp_redactor_feed(r, text + at, end - at, &out);
        at = end;
    }
    sp_redactor_flush(r, &out);
    assert_int_equal(sp_redactor_held(r), 0);
    return sp_buf_take(&out);
}

static void test_redact_whole(void **state)
{
    (void)state;
    sp_redactor_t *r = sp_redactor_new();
    char *env[] = {"API_TOKEN=s3cr3t-value", "SHORT=abc", "OTHER=zzz-top", "NOEQ"};
    sp_redactor_add_env(r, env, 4);
    char *got = redact_chunks(r, "a s3cr3t-value b abc zzz-top s3cr3t-values\n", NULL, 0);
    assert_string_equal(got, "a [redacted:API_TOKEN] b abc [redacted:OTHER] "
                             "[redacted:API_TOKEN]s\n");
    free(got);
    /* Nothing to redact: bytes pass unchanged, none held. */
    sp_redactor_free(r);
    r = sp_redactor_new();
    got = redact_chunks(r, "plain", NULL, 0);
    assert_string_equal(got, "plain");
    free(got);
    sp_redactor_free(r);
}

static void test_redact_longest_and_names(void **state)
{
    (void)state;
    sp_redactor_t *r = sp_redactor_new();
    assert_true(sp_redactor_add(r, "A", "pass", 4));
    assert_true(sp_redactor_add(r, "B-2", "password1", 9));
    assert_false(sp_redactor_add(r, "C", "pw", 2));
    char *got = redact_chunks(r, "password1 pass passw", NULL, 0);
    assert_string_equal(got, "[redacted:B_2] [redacted:A] [redacted:A]w");
    free(got);
    sp_redactor_free(r);
}

/* The value split at every place, and across three chunks. */
static void test_redact_split(void **state)
{
    (void)state;
    const char *text = "xx TOPSECRET yy TOPSECRET";
    const char *want = "xx [redacted:K] yy [redacted:K]";
    size_t len = strlen(text);
    for (size_t a = 0; a <= len; a++) {
        for (size_t b = a; b <= len; b++) {
            sp_redactor_t *r = sp_redactor_new();
            assert_true(sp_redactor_add(r, "K", "TOPSECRET", 9));
            size_t cuts[2] = {a, b};
            char *got = redact_chunks(r, text, cuts, 2);
            assert_string_equal(got, want);
            free(got);
            sp_redactor_free(r);
        }
    }
    /* A prefix that never completes is held, then let out unchanged. */
    sp_redactor_t *r = sp_redactor_new();
    assert_true(sp_redactor_add(r, "K", "TOPSECRET", 9));
    sp_buf_t out;
    sp_buf_init(&out);
    sp_redactor_feed(r, "abc TOPSEC", 10, &out);
    assert_int_equal(out.len, 4);
    assert_int_equal(sp_redactor_held(r), 6);
    sp_redactor_feed(r, "RET", 3, &out);
    assert_string_equal(out.data, "abc [redacted:K]");
    sp_redactor_feed(r, " TOP", 4, &out);
    sp_redactor_flush(r, &out);
    assert_string_equal(out.data, "abc [redacted:K] TOP");
    sp_buf_dispose(&out);
    sp_redactor_free(r);
    sp_redactor_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrap_unwrap),       cmocka_unit_test(test_output_seal_open),
        cmocka_unit_test(test_cmdline_seal_open), cmocka_unit_test(test_paths_seal_open),
        cmocka_unit_test(test_redact_whole),      cmocka_unit_test(test_redact_longest_and_names),
        cmocka_unit_test(test_redact_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
