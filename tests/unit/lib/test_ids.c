/* UUIDv7 layout and ordering (RFC 9562), sandbox ids, id shape, clocks. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ids.h"

static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_uuid7_version_and_variant(void **state)
{
    uint8_t u[16];

    for (int i = 0; i < 1000; i++) {
        sp_uuid7(u);
        assert_int_equal(u[6] >> 4, 7);   /* version 7 */
        assert_int_equal(u[8] >> 6, 0x2); /* variant 10 */
    }
}

/* Strictly increasing, as bytes and as text, including many ids in the same millisecond. */
static void test_uuid7_ordering_100k(void **state)
{
    enum { N = 100000 };
    uint8_t prev[16], cur[16];
    char sprev[SP_UUID_STR_LEN + 1], scur[SP_UUID_STR_LEN + 1];

    sp_uuid7(prev);
    sp_uuid_format(prev, sprev);
    for (int i = 0; i < N; i++) {
        sp_uuid7(cur);
        sp_uuid_format(cur, scur);
        if (memcmp(prev, cur, 16) >= 0)
            fail_msg("id %d not after its predecessor: %s then %s", i, sprev, scur);
        assert_true(strcmp(sprev, scur) < 0);
        memcpy(prev, cur, 16);
        memcpy(sprev, scur, sizeof(scur));
    }
}

static void test_uuid7_time(void **state)
{
    uint8_t u[16];
    int64_t ms = 0;

    int64_t before = wall_ms();
    sp_uuid7(u);
    int64_t after = wall_ms();
    assert_int_equal(sp_uuid7_time_ms(u, &ms), 0);
    assert_in_range(ms, before, after);

    /* Not a v7, or not the RFC variant: no time, and ret untouched. */
    ms = 42;
    u[6] = (uint8_t)((u[6] & 0x0f) | 0x40);
    assert_int_equal(sp_uuid7_time_ms(u, &ms), -EINVAL);
    assert_int_equal(ms, 42);
    sp_uuid7(u);
    u[8] = (uint8_t)((u[8] & 0x3f) | 0xc0);
    assert_int_equal(sp_uuid7_time_ms(u, &ms), -EINVAL);
}

/* RFC 9562 appendix A.6 example: 017F22E2-79B0-7CC3-98C4-DC0C0C07398F, Tuesday, February 22,
 * 2022 2:22:22.00 PM GMT-05:00. */
static void test_uuid7_rfc_example(void **state)
{
    uint8_t u[16];
    char s[SP_UUID_STR_LEN + 1];
    int64_t ms;

    assert_int_equal(sp_uuid_parse("017F22E2-79B0-7CC3-98C4-DC0C0C07398F", u), 0);
    assert_int_equal(u[0], 0x01);
    assert_int_equal(u[15], 0x8f);
    assert_int_equal(sp_uuid7_time_ms(u, &ms), 0);
    assert_int_equal(ms, INT64_C(1645557742000));
    sp_uuid_format(u, s);
    assert_string_equal(s, "017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
}

static void test_uuid_format_parse_round_trip(void **state)
{
    uint8_t u[16], back[16];
    char s[SP_UUID_STR_LEN + 1];

    for (int i = 0; i < 100; i++) {
        sp_uuid7_str(s);
        assert_int_equal(strlen(s), SP_UUID_STR_LEN);
        assert_int_equal(s[8], '-');
        assert_int_equal(s[13], '-');
        assert_int_equal(s[14], '7');
        assert_int_equal(s[18], '-');
        assert_int_equal(s[23], '-');
        assert_int_equal(sp_uuid_parse(s, u), 0);
        sp_uuid_format(u, s + 0);
        assert_int_equal(sp_uuid_parse(s, back), 0);
        assert_memory_equal(u, back, 16);
    }
}

static void test_uuid_parse_rejects(void **state)
{
    static const char *const bad[] = {
        "",
        "017f22e2-79b0-7cc3-98c4-dc0c0c07398",   /* 35 chars */
        "017f22e2-79b0-7cc3-98c4-dc0c0c07398f0", /* 37 chars */
        "017f22e279b0-7cc3-98c4-dc0c0c07398f0",  /* hyphen missing */
        "017f22e2_79b0-7cc3-98c4-dc0c0c07398f",  /* wrong separator */
        "017f22e2-79b07-cc3-98c4-dc0c0c07398f",  /* hyphen moved */
        "017f22g2-79b0-7cc3-98c4-dc0c0c07398f",  /* not hex */
        "{017f22e2-79b0-7cc3-98c4-dc0c0c0739}",  /* braces */
        "017f22e2-79b0-7cc3-98c4-dc0c0c07398 ",  /* trailing space */
        "017f22e279b07cc398c4dc0c0c07398f",      /* no hyphens */
    };
    uint8_t u[16];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(u, 0x5a, sizeof(u));
        if (sp_uuid_parse(bad[i], u) != -EINVAL)
            fail_msg("accepted '%s'", bad[i]);
        for (int k = 0; k < 16; k++)
            assert_int_equal(u[k], 0x5a);
    }
    assert_int_equal(sp_uuid_parse(NULL, u), -EINVAL);
}

/* Several threads at once: every id unique, each thread's ids increasing. */
enum { THREADS = 4, PER_THREAD = 20000 };
static uint8_t thread_ids[THREADS][PER_THREAD][16];

static void *gen_thread(void *arg)
{
    uint8_t(*mine)[16] = arg;

    for (int i = 0; i < PER_THREAD; i++)
        sp_uuid7(mine[i]);
    return NULL;
}

static int cmp_uuid(const void *a, const void *b)
{
    return memcmp(a, b, 16);
}

static void test_uuid7_threads_unique(void **state)
{
    pthread_t t[THREADS];

    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, gen_thread, thread_ids[i]), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < THREADS; i++)
        for (int k = 1; k < PER_THREAD; k++)
            assert_true(memcmp(thread_ids[i][k - 1], thread_ids[i][k], 16) < 0);

    uint8_t(*all)[16] = malloc(sizeof(thread_ids));
    assert_non_null(all);
    memcpy(all, thread_ids, sizeof(thread_ids));
    qsort(all, (size_t)THREADS * PER_THREAD, 16, cmp_uuid);
    for (int k = 1; k < THREADS * PER_THREAD; k++)
        assert_true(memcmp(all[k - 1], all[k], 16) < 0);
    free(all);
}

/* A forked child must not repeat the parent's next ids. */
static void test_uuid7_fork_differs(void **state)
{
    uint8_t parent[16], child[16];
    int fds[2], status;

    sp_uuid7(parent); /* the generator has state before the fork */
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        sp_uuid7(child);
        _exit(write(fds[1], child, 16) == 16 ? 0 : 1);
    }
    sp_uuid7(parent);
    assert_int_equal(read(fds[0], child, 16), 16);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_memory_not_equal(parent, child, 16);
    close(fds[0]);
    close(fds[1]);
}

static int b32hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'v')
        return c - 'a' + 10;
    return -1;
}

/* The 26 chars decode back to a UUIDv7 of now: 48-bit time, version 7, variant, zero padding. */
static void test_sandbox_id_shape(void **state)
{
    char id[SP_SANDBOX_ID_LEN + 1];
    uint8_t u[17];

    int64_t before = wall_ms();
    sp_sandbox_id_new(id);
    int64_t after = wall_ms();

    assert_int_equal(strlen(id), SP_SANDBOX_ID_LEN);
    assert_int_equal(SP_SANDBOX_ID_LEN, 30);
    assert_memory_equal(id, "sbx_", 4);
    assert_true(sp_id_valid(id));

    memset(u, 0, sizeof(u));
    for (int g = 0; g < 26; g++) {
        int v = b32hex_value(id[4 + g]);
        if (v < 0)
            fail_msg("'%c' in %s is not in the base32hex alphabet", id[4 + g], id);
        for (int k = 0; k < 5; k++) {
            int bit = g * 5 + k;
            if ((v >> (4 - k)) & 1)
                u[bit / 8] |= (uint8_t)(0x80 >> (bit % 8));
        }
    }
    assert_int_equal(u[16], 0); /* the two pad bits */
    int64_t ms;
    assert_int_equal(sp_uuid7_time_ms(u, &ms), 0);
    assert_in_range(ms, before, after);
}

static void test_sandbox_id_sorted_and_alphabet(void **state)
{
    char prev[SP_SANDBOX_ID_LEN + 1], cur[SP_SANDBOX_ID_LEN + 1];

    sp_sandbox_id_new(prev);
    for (int i = 0; i < 20000; i++) {
        sp_sandbox_id_new(cur);
        for (int k = 4; k < SP_SANDBOX_ID_LEN; k++)
            assert_true(b32hex_value(cur[k]) >= 0);
        if (strcmp(prev, cur) >= 0)
            fail_msg("%s not after %s", cur, prev);
        memcpy(prev, cur, sizeof(cur));
    }
}

static void test_id_valid(void **state)
{
    char longest[65], too_long[66];

    memset(longest, 'a', 64);
    longest[64] = '\0';
    memset(too_long, 'a', 65);
    too_long[65] = '\0';

    static const char *const good[] = {"a", "0", "sbx_0123abcd", "worker-1", "tpl_base-py3"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (!sp_id_valid(good[i]))
            fail_msg("rejected '%s'", good[i]);
    assert_true(sp_id_valid(longest));

    static const char *const bad[] = {
        "",    "_",  "-",   "_a", "-rf", "A",   "sbx_ABC",     "a.b",
        "a/b", "..", "a b", "a*", "a>",  "a\n", "caf\xc3\xa9",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (sp_id_valid(bad[i]))
            fail_msg("accepted '%s'", bad[i]);
    assert_false(sp_id_valid(too_long));
    assert_false(sp_id_valid(NULL));
}

static void test_clocks(void **state)
{
    int64_t us = sp_now_us();
    int64_t ms = wall_ms();
    assert_true(us / 1000 >= ms - 1000 && us / 1000 <= ms + 1000);

    int64_t a = sp_mono_ns();
    struct timespec d = {0, 2000000};
    nanosleep(&d, NULL);
    int64_t b = sp_mono_ns();
    assert_true(b - a >= 2000000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uuid7_version_and_variant),
        cmocka_unit_test(test_uuid7_ordering_100k),
        cmocka_unit_test(test_uuid7_time),
        cmocka_unit_test(test_uuid7_rfc_example),
        cmocka_unit_test(test_uuid_format_parse_round_trip),
        cmocka_unit_test(test_uuid_parse_rejects),
        cmocka_unit_test(test_uuid7_threads_unique),
        cmocka_unit_test(test_uuid7_fork_differs),
        cmocka_unit_test(test_sandbox_id_shape),
        cmocka_unit_test(test_sandbox_id_sorted_and_alphabet),
        cmocka_unit_test(test_id_valid),
        cmocka_unit_test(test_clocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
