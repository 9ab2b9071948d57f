/* Redaction of known values from a stream (lib/redact.c): the worker's "[redacted:NAME]"
 * markers and egressd's same-length mask, values split across feeds at every place (two and
 * three feeds), overlapping and adjacent values, prefixes that never complete passed through
 * byte for byte, the release at a stall, output exactly as long as input in mask mode, and
 * memory that does not grow with the stream. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

/* The .c itself, to look at how much it holds (hold's capacity). */
#include "../../../lib/redact.c" /* NOLINT(bugprone-suspicious-include) */

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

/* ---- markers (the worker's captured output) ---- */

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

/* ---- the mask (egressd's responses) ---- */

static unsigned matches;
static char last_match[65];

static void count_match(void *arg, const char *name)
{
    (void)arg;
    matches++;
    snprintf(last_match, sizeof(last_match), "%s", name);
}

static sp_redactor_t *masker(void)
{
    sp_redactor_t *r = sp_redactor_new_mask('*', 8);
    sp_redactor_on_match(r, count_match, NULL);
    matches = 0;
    last_match[0] = '\0';
    return r;
}

/* A whole value becomes as many '*' as it has bytes; a short value is refused. */
static void test_mask_whole(void **state)
{
    (void)state;
    sp_redactor_t *r = masker();
    assert_int_equal(sp_redactor_min(r), 8);
    assert_false(sp_redactor_add(r, "s", "1234567", 7));
    assert_true(sp_redactor_add(r, "crd_A", "ghp_TOPSECRET", 13));
    assert_int_equal(sp_redactor_count(r), 1);
    char *got = redact_chunks(r, "{\"Authorization\": \"Bearer ghp_TOPSECRET\"}", NULL, 0);
    assert_string_equal(got, "{\"Authorization\": \"Bearer *************\"}");
    assert_int_equal(matches, 1);
    assert_string_equal(last_match, "crd_A");
    free(got);
    sp_redactor_free(r);
}

/* Every split into two and three feeds gives the same output, as long as the input, with
 * both values masked whole: adjacent, repeated, and behind a prefix of one of them. */
static void test_mask_split_everywhere(void **state)
{
    (void)state;
    const char *text = "x ghp_TOPSECRET dXNlcjpTRUNSRVQ=ghp_TOPSECRET ghp_TOP ghp_TOPSECRET";
    const char *want = "x ************* ***************************** ghp_TOP *************";
    size_t len = strlen(text);
    assert_int_equal(strlen(want), len);
    for (size_t a = 0; a <= len; a++) {
        for (size_t b = a; b <= len; b++) {
            sp_redactor_t *r = masker();
            assert_true(sp_redactor_add(r, "crd_A", "ghp_TOPSECRET", 13));
            assert_true(sp_redactor_add(r, "crd_B", "dXNlcjpTRUNSRVQ=", 16));
            size_t cuts[2] = {a, b};
            char *got = redact_chunks(r, text, cuts, 2);
            assert_int_equal(strlen(got), len);
            assert_string_equal(got, want);
            assert_int_equal(matches, 4);
            free(got);
            /* The same with one cut. */
            got = redact_chunks(r, text, cuts, 1);
            assert_string_equal(got, want);
            free(got);
            sp_redactor_free(r);
        }
    }
}

/* Overlapping values: the first place wins (the longest value there); the other is cut by
 * the mask, so neither is ever whole in the output. */
static void test_mask_overlap(void **state)
{
    (void)state;
    const char *text = "<ABCDEFGHIJKLMN>";
    size_t len = strlen(text);
    for (size_t a = 0; a <= len; a++) {
        sp_redactor_t *r = masker();
        assert_true(sp_redactor_add(r, "x", "ABCDEFGHIJ", 10));
        assert_true(sp_redactor_add(r, "y", "EFGHIJKLMN", 10));
        assert_true(sp_redactor_add(r, "z", "ABCDEFGH", 8)); /* shorter, same place */
        char *got = redact_chunks(r, text, &a, 1);
        assert_string_equal(got, "<**********KLMN>");
        assert_null(strstr(got, "EFGHIJKLMN"));
        free(got);
        sp_redactor_free(r);
    }
}

/* Prefixes that never complete go out byte for byte (also bytes that are not text). */
static void test_mask_prefix_passes(void **state)
{
    (void)state;
    const uint8_t text[] = {'g', 'h', 'p', '_', 'T', 0,   'g',  'h', 'p', '_', 'T', 'O',
                            'P', 'S', 'E', 'C', 'R', 'E', 0xff, 'g', 'h', 'p', '_'};
    size_t len = sizeof(text);
    for (size_t a = 0; a <= len; a++) {
        for (size_t b = a; b <= len; b++) {
            sp_redactor_t *r = masker();
            assert_true(sp_redactor_add(r, "crd_A", "ghp_TOPSECRET", 13));
            sp_buf_t out;
            sp_buf_init(&out);
            sp_redactor_feed(r, text, a, &out);
            sp_redactor_feed(r, text + a, b - a, &out);
            sp_redactor_feed(r, text + b, len - b, &out);
            assert_true(sp_redactor_held(r) <= 12);
            sp_redactor_flush(r, &out);
            assert_int_equal(out.len, len);
            assert_memory_equal(out.data, text, len);
            assert_int_equal(matches, 0);
            sp_buf_dispose(&out);
            sp_redactor_free(r);
        }
    }
}

/* A stall: what is held goes out, and a value that then completes still has its rest masked
 * (never whole); a response that ends in a prefix is all out after the release. */
static void test_mask_release(void **state)
{
    (void)state;
    sp_redactor_t *r = masker();
    assert_true(sp_redactor_add(r, "crd_A", "ghp_TOPSECRET", 13));
    sp_buf_t out;
    sp_buf_init(&out);
    sp_redactor_feed(r, "abc ghp_TOP", 11, &out);
    assert_int_equal(out.len, 4);
    assert_int_equal(sp_redactor_held(r), 7);
    sp_redactor_release(r, &out);
    assert_int_equal(sp_redactor_held(r), 0);
    assert_string_equal(out.data, "abc ghp_TOP");
    sp_redactor_feed(r, "SECRET xyz", 10, &out);
    assert_string_equal(out.data, "abc ghp_TOP****** xyz");
    assert_int_equal(matches, 1);
    /* The next value after that is whole again. */
    sp_redactor_feed(r, " ghp_TOPSECRET!", 15, &out);
    sp_redactor_flush(r, &out);
    assert_string_equal(out.data, "abc ghp_TOP****** xyz *************!");
    sp_buf_dispose(&out);

    /* Released, then a prefix that does not complete: byte for byte. */
    sp_buf_init(&out);
    sp_redactor_feed(r, "ghp_", 4, &out);
    sp_redactor_release(r, &out);
    assert_string_equal(out.data, "ghp_");
    sp_redactor_feed(r, "ghp_TOPSECRE", 12, &out);
    sp_redactor_release(r, &out);
    sp_redactor_feed(r, "x", 1, &out);
    sp_redactor_flush(r, &out);
    assert_string_equal(out.data, "ghp_ghp_TOPSECREx");
    /* A whole value inside what is released is masked by the release. */
    sp_buf_reset(&out);
    assert_true(sp_redactor_add(r, "crd_L", "ghp_TOPSECRET_LONGER", 20));
    sp_redactor_feed(r, "ghp_TOPSECRET_LON", 17, &out);
    assert_int_equal(out.len, 0);
    sp_redactor_release(r, &out);
    assert_string_equal(out.data, "*************_LON");
    sp_redactor_feed(r, "GER.", 4, &out);
    sp_redactor_flush(r, &out);
    assert_string_equal(out.data, "*************_LON***.");
    sp_buf_dispose(&out);
    sp_redactor_free(r);
}

/* A long stream in small and large feeds, values and prefixes everywhere: the output is as
 * long as the input, holds no value, equals a one-shot scan, and what is held never exceeds
 * the longest value less one byte, nor its buffer what one feed needs. */
static void test_mask_long_stream_bounded(void **state)
{
    (void)state;
    const char *vals[] = {"ghp_TOPSECRET", "dXNlcjpTRUNSRVQ=", "ghp%5FTOPSECRET"};
    size_t total = 1u << 20;
    char *text = malloc(total + 1);
    assert_non_null(text);
    srandom(7);
    for (size_t i = 0; i < total;) {
        long k = random() % 8;
        const char *v = vals[random() % 3];
        size_t vl = strlen(v);
        size_t n = k == 0 ? vl : k == 1 ? (size_t)(random() % (long)vl) : 0;
        if (n > total - i)
            n = total - i;
        if (n) {
            memcpy(text + i, v, n); /* a value, or a prefix of one */
            i += n;
        } else {
            text[i++] = "ghp_dXsECRT%5 \r\n"[random() % 16];
        }
    }
    text[total] = '\0';

    sp_redactor_t *one = masker();
    for (size_t i = 0; i < 3; i++)
        assert_true(sp_redactor_add(one, "v", vals[i], strlen(vals[i])));
    sp_buf_t want;
    sp_buf_init(&want);
    sp_redactor_feed(one, text, total, &want);
    sp_redactor_flush(one, &want);
    sp_redactor_free(one);
    assert_int_equal(want.len, total);

    sp_redactor_t *r = masker();
    for (size_t i = 0; i < 3; i++)
        assert_true(sp_redactor_add(r, "v", vals[i], strlen(vals[i])));
    sp_buf_t out;
    sp_buf_init(&out);
    size_t at = 0, biggest_feed = 0;
    while (at < total) {
        size_t n = (size_t)(random() % 5000) + 1;
        if (n > total - at)
            n = total - at;
        if (n > biggest_feed)
            biggest_feed = n;
        sp_redactor_feed(r, text + at, n, &out);
        at += n;
        assert_true(sp_redactor_held(r) <= 15);
        assert_int_equal(out.len + sp_redactor_held(r), at);
        assert_true(r->cap <= 2 * (biggest_feed + 16) + 256);
    }
    sp_redactor_flush(r, &out);
    assert_int_equal(out.len, total);
    assert_memory_equal(out.data, want.data, total);
    for (size_t i = 0; i < 3; i++)
        assert_null(memmem(out.data, out.len, vals[i], strlen(vals[i])));
    assert_true(matches > 1000);
    free(text);
    sp_buf_dispose(&out);
    sp_buf_dispose(&want);
    sp_redactor_free(r);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* What the scrubber costs egressd per byte (printed, not asserted: the machine is shared):
 * 64 KiB reads of an ordinary text response holding the value twice, with 4 values, and the
 * worst case a site can choose, every byte the first byte of a value. */
static void test_mask_throughput(void **state)
{
    (void)state;
    const char *vals[] = {"sv0123456789abcdef01234567-hdr", "c3YwMTIzNDU2Nzg5YWJjZGVm",
                          "sv0123456789abcdef%2Fq%2Bk", "ghp_TOPSECRETTOPSECRET"};
    size_t total = 32u << 20, chunk = 65536;
    char *text = malloc(total);
    assert_non_null(text);
    for (int pass = 0; pass < 2; pass++) {
        const char *line = "{\"args\": {}, \"headers\": {\"Accept\": \"*/*\", \"Host\": "
                           "\"api.example.test\", \"User-Agent\": \"curl/8.5.0\"}}\n";
        size_t ll = strlen(line);
        if (pass == 0)
            for (size_t i = 0; i < total; i++)
                text[i] = line[i % ll];
        else
            memset(text, 's', total);
        if (pass == 0) {
            memcpy(text + 1000, vals[0], strlen(vals[0]));
            memcpy(text + total / 2, vals[1], strlen(vals[1]));
        }
        sp_redactor_t *r = masker();
        for (size_t i = 0; i < 4; i++)
            assert_true(sp_redactor_add(r, "v", vals[i], strlen(vals[i])));
        sp_buf_t out;
        sp_buf_init(&out);
        double t0 = now_s();
        for (size_t at = 0; at < total; at += chunk) {
            sp_redactor_feed(r, text + at, chunk, &out);
            out.len = 0;
        }
        sp_redactor_flush(r, &out);
        double s = now_s() - t0;
        fprintf(stderr, "redact mask: %s, 4 values, 64 KiB feeds: %.0f MB/s\n",
                pass == 0 ? "a JSON echo" : "every byte a value's first", (double)total / s / 1e6);
        if (pass == 0)
            assert_int_equal(matches, 2);
        sp_buf_dispose(&out);
        sp_redactor_free(r);
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redact_whole),
        cmocka_unit_test(test_redact_longest_and_names),
        cmocka_unit_test(test_redact_split),
        cmocka_unit_test(test_mask_whole),
        cmocka_unit_test(test_mask_split_everywhere),
        cmocka_unit_test(test_mask_overlap),
        cmocka_unit_test(test_mask_prefix_passes),
        cmocka_unit_test(test_mask_release),
        cmocka_unit_test(test_mask_long_stream_bounded),
        cmocka_unit_test(test_mask_throughput),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
