/* sp_strerror: every SP_E* code has its own message; errnos come from the C library. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>

#include "error.h"

static void test_sp_codes_distinct(void **state)
{
    for (int a = SP_EFIRST; a < SP_ELAST; a++) {
        const char *ma = sp_strerror(a);
        assert_non_null(ma);
        assert_true(strlen(ma) > 0);
        assert_null(strstr(ma, "nknown error"));
        for (int b = a + 1; b < SP_ELAST; b++)
            assert_string_not_equal(ma, sp_strerror(b));
    }
    assert_string_equal(sp_strerror(SP_ECHAIN), "hash chain broken");
}

static void test_errno(void **state)
{
    char want[128];

    assert_string_equal(sp_strerror(-ENOENT), strerror_r(ENOENT, want, sizeof(want)));
    assert_string_equal(sp_strerror(-EINVAL), strerror_r(EINVAL, want, sizeof(want)));
    assert_non_null(strstr(sp_strerror(-9999), "9999"));
    assert_string_equal(sp_strerror(0), "success");
}

static void test_out_of_range(void **state)
{
    assert_non_null(strstr(sp_strerror(INT_MIN), "unknown error"));
    assert_non_null(strstr(sp_strerror(5), "unknown error 5"));
    assert_non_null(strstr(sp_strerror(SP_ELAST), "nknown"));
}

/* The buffer for unknown errnos is per thread: another thread's call does not change ours. */
static void *other_thread(void *arg)
{
    return (void *)sp_strerror(-77777);
}

static void test_thread_local(void **state)
{
    pthread_t t;
    void *theirs;
    const char *mine = sp_strerror(-88888);

    assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
    assert_int_equal(pthread_join(t, &theirs), 0);
    assert_ptr_not_equal(mine, theirs);
    assert_non_null(strstr(mine, "88888"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sp_codes_distinct),
        cmocka_unit_test(test_errno),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_thread_local),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
