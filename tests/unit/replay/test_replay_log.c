/* What the replay subcommands share (replay/replay_log.c) that needs no database: RFC 3339
 * times in and out, and the filter checks that turn hostile options into usage errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../../replay/replay_log.c" /* NOLINT(bugprone-suspicious-include) */

#define T_2026_11_30 1795996800LL /* 2026-11-30T00:00:00Z in seconds */

static void test_parse_time(void **state)
{
    int64_t us = 0;
    assert_int_equal(replay_parse_time("2026-11-30T00:00:00Z", &us), 0);
    assert_int_equal(us, T_2026_11_30 * 1000000);
    assert_int_equal(replay_parse_time("2026-11-30t00:00:00.5z", &us), 0);
    assert_int_equal(us, T_2026_11_30 * 1000000 + 500000);
    assert_int_equal(replay_parse_time("2026-11-30T00:00:00.123456789Z", &us), 0);
    assert_int_equal(us, T_2026_11_30 * 1000000 + 123456);
    /* An offset is the local time that far from UTC: 02:00+02:00 is midnight UTC. */
    assert_int_equal(replay_parse_time("2026-11-30T02:00:00+02:00", &us), 0);
    assert_int_equal(us, T_2026_11_30 * 1000000);
    assert_int_equal(replay_parse_time("2026-11-29T22:30:00-01:30", &us), 0);
    assert_int_equal(us, T_2026_11_30 * 1000000);
    assert_int_equal(replay_parse_time("2024-02-29T00:00:00Z", &us), 0);
    assert_int_equal(replay_parse_time("now", &us), 0);
    assert_true(us > T_2026_11_30 * 1000000 / 2);

    static const char *const bad[] = {
        "",
        "2026-11-30",
        "2026-11-30T00:00:00",      /* no zone */
        "2026-11-30 00:00:00Z",     /* space for T */
        "2026-11-30T00:00:00Zjunk", /* trailing bytes */
        "2026-11-30T00:00:00.Z",    /* empty fraction */
        "2026-02-30T00:00:00Z",     /* no such day */
        "2025-02-29T00:00:00Z",     /* not a leap year */
        "2026-13-01T00:00:00Z",
        "2026-11-30T24:00:00Z",
        "2026-11-30T00:60:00Z",
        "2026-11-30T00:00:00+2:00", /* offset digits */
        "2026-11-30T00:00:00+24:00",
        "1969-12-31T23:59:59Z",
        "+026-11-30T00:00:00Z",
        "2026-11-30T00:00:00\nZ",
        "NOW",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        us = 42;
        if (replay_parse_time(bad[i], &us) != -EINVAL)
            fail_msg("accepted '%s'", bad[i]);
        assert_int_equal(us, 42); /* untouched on error */
    }
    assert_int_equal(replay_parse_time(NULL, &us), -EINVAL);
}

static void test_format_time(void **state)
{
    char t[48];
    int64_t back = 0;
    replay_format_time(t, sizeof(t), 0);
    assert_string_equal(t, "1970-01-01T00:00:00.000000Z");
    replay_format_time(t, sizeof(t), T_2026_11_30 * 1000000 + 7);
    assert_string_equal(t, "2026-11-30T00:00:00.000007Z");
    /* What export writes, state --at reads back to the microsecond. */
    assert_int_equal(replay_parse_time(t, &back), 0);
    assert_int_equal(back, T_2026_11_30 * 1000000 + 7);
}

static void test_check_filters(void **state)
{
    char empty[] = "", tenant[] = "tenant-a", bad_id[] = "sbx x;", type[] = "SandboxPlaced",
         bad_type[] = "sandboxplaced";
    replay_config_t c = {.tenant = empty, .sandbox = empty, .type = empty};
    assert_int_equal(replay_check_filters(&c), 0);
    c.tenant = tenant;
    c.type = type;
    c.since = 5;
    c.until = 5;
    assert_int_equal(replay_check_filters(&c), 0);
    c.until = 4;
    assert_int_equal(replay_check_filters(&c), REPLAY_EUSAGE);
    c.until = 0; /* no upper bound */
    assert_int_equal(replay_check_filters(&c), 0);
    c.sandbox = bad_id;
    assert_int_equal(replay_check_filters(&c), REPLAY_EUSAGE);
    c.sandbox = empty;
    c.tenant = bad_id;
    assert_int_equal(replay_check_filters(&c), REPLAY_EUSAGE);
    c.tenant = empty;
    c.type = bad_type;
    assert_int_equal(replay_check_filters(&c), REPLAY_EUSAGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_time),
        cmocka_unit_test(test_format_time),
        cmocka_unit_test(test_check_filters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
