/* Per-sandbox bandwidth (egressd/egressd_rate.c): the token bucket's arithmetic and which
 * limit applies, the policy's or the configured default. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../../egressd/egressd_rate.c" /* NOLINT(bugprone-suspicious-include) */

#define MS 1000000ull

static void test_bucket(void **state)
{
    eg_bucket_t b = {0};
    const uint64_t rate = 1000000; /* 1 MB/s: a burst of 125,000 bytes */
    uint64_t t = 5000 * MS;
    /* A new bucket is full: a burst passes at once, the next read goes into debt. */
    assert_int_equal(eg_bucket_take(&b, rate, t, 125000), 0);
    uint64_t wait = eg_bucket_take(&b, rate, t, 65536);
    assert_in_range(wait, 65 * MS, 66 * MS); /* 65,536 bytes at 1 MB/s */
    /* Half the wait pays half the debt; all of it pays it all. */
    assert_in_range(eg_bucket_take(&b, rate, t + wait / 2, 0), 32 * MS, 34 * MS);
    assert_int_equal(eg_bucket_take(&b, rate, t + wait, 0), 0);
    /* A quiet second refills no more than the burst. */
    t += 10000 * MS;
    assert_int_equal(eg_bucket_take(&b, rate, t, 125000), 0);
    assert_true(eg_bucket_take(&b, rate, t, 1) > 0);
    /* Over a long transfer, the time is the bytes over the rate (less the burst). */
    eg_bucket_t c = {0};
    uint64_t now = 1 * MS;
    for (uint64_t sent = 0; sent < 5000000; sent += 65536) {
        uint64_t w;
        while ((w = eg_bucket_take(&c, rate, now, 0)) > 0)
            now += w;
        (void)eg_bucket_take(&c, rate, now, 65536);
    }
    assert_in_range(now - 1 * MS, 4800 * MS, 5000 * MS);
    /* Rate 0: no limit, whatever was taken. */
    assert_int_equal(eg_bucket_take(&b, 0, t, 1u << 30), 0);
    /* A small rate still lets a whole read through a full bucket. */
    eg_bucket_t d = {0};
    assert_int_equal(eg_bucket_take(&d, 1024, t, 65536), 0);
}

static void test_rate_of(void **state)
{
    eg_config_t cfg = {.up_bytes_per_s = 0, .down_bytes_per_s = 2000000};
    eg_t eg = {.cfg = &cfg};
    eg_sbx_t s = {0};
    assert_int_equal(eg_rate_of(&eg, &s, EG_UP), 0);
    assert_int_equal(eg_rate_of(&eg, &s, EG_DOWN), 2000000);
    s.rate[EG_UP] = 5000;
    s.rate[EG_DOWN] = 3000000; /* the policy's replaces the default, either way */
    assert_int_equal(eg_rate_of(&eg, &s, EG_UP), 5000);
    assert_int_equal(eg_rate_of(&eg, &s, EG_DOWN), 3000000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket),
        cmocka_unit_test(test_rate_of),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
