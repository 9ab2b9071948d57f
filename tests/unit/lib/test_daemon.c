/* Stoppable sleeps (daemon.h): a stop ends every sleep at once, the ones already sleeping and
 * the ones that start after it; without one, a sleep lasts its time. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "daemon.h"

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *sleeper(void *arg)
{
    int64_t t0 = mono_ms();
    sp_daemon_sleep_ms(60000);
    *(int64_t *)arg = mono_ms() - t0;
    return NULL;
}

static void test_sleep_and_stop(void **state)
{
    (void)state;
    sp_daemon_signals();
    /* No stop: the full time (at least). */
    int64_t t0 = mono_ms();
    sp_daemon_sleep_ms(120);
    assert_true(mono_ms() - t0 >= 120);

    /* Three threads asleep for a minute; a stop from this one wakes them all. */
    pthread_t th[3];
    int64_t slept[3] = {-1, -1, -1};
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, sleeper, &slept[i]), 0);
    sp_daemon_sleep_ms(200);
    assert_int_equal(sp_daemon_stopping, 0);
    sp_daemon_stop();
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_true(slept[i] >= 0 && slept[i] < 30000);
    }
    assert_int_equal(sp_daemon_stopping, 1);
    /* After the stop, a new sleep does not sleep. */
    t0 = mono_ms();
    sp_daemon_sleep_ms(60000);
    assert_true(mono_ms() - t0 < 30000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sleep_and_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
