/* The worker's template status file: what the worker writes `space up` reads back, and a file
 * that is not one is refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tmplstat.h"

static char path[64];

static int setup(void **state)
{
    (void)state;
    snprintf(path, sizeof(path), "/tmp/test_tmplstat.%d", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

static void write_text(const char *text)
{
    FILE *f = fopen(path, "we");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_round_trip(void **state)
{
    (void)state;
    sp_tmplstat_t w[3] = {
        {.name = "tiny", .state = SP_TMPL_READY, .since_ms = 1700000000000, .took_ms = 88},
        {.name = "base", .state = SP_TMPL_BUILDING, .since_ms = 1700000000100},
        {.name = "broken", .state = SP_TMPL_FAILED, .since_ms = 1, .took_ms = 2},
    };
    snprintf(w[0].detail, sizeof(w[0].detail), "cache");
    snprintf(w[1].detail, sizeof(w[1].detail), "log /var/x/template-base.log");
    snprintf(w[2].detail, sizeof(w[2].detail), "broken.sh exited 3:\nsecond line");
    assert_int_equal(sp_tmplstat_write(path, 4242, w, 3), 0);

    sp_tmplstat_t r[4];
    int pid = 0;
    size_t n = 0;
    assert_int_equal(sp_tmplstat_read(path, &pid, r, 4, &n), 0);
    assert_int_equal(pid, 4242);
    assert_int_equal(n, 3);
    assert_string_equal(r[0].name, "tiny");
    assert_int_equal(r[0].state, SP_TMPL_READY);
    assert_int_equal(r[0].since_ms, 1700000000000);
    assert_int_equal(r[0].took_ms, 88);
    assert_string_equal(r[0].detail, "cache");
    assert_int_equal(r[1].state, SP_TMPL_BUILDING);
    assert_string_equal(r[1].detail, "log /var/x/template-base.log");
    assert_int_equal(r[2].state, SP_TMPL_FAILED);
    assert_string_equal(r[2].detail, "broken.sh exited 3: second line"); /* one line */

    /* max bounds what is read. */
    assert_int_equal(sp_tmplstat_read(path, &pid, r, 1, &n), 0);
    assert_int_equal(n, 1);
    /* No templates at all is a valid file. */
    assert_int_equal(sp_tmplstat_write(path, 7, NULL, 0), 0);
    assert_int_equal(sp_tmplstat_read(path, &pid, r, 4, &n), 0);
    assert_int_equal(pid, 7);
    assert_int_equal(n, 0);
}

static void test_refused(void **state)
{
    (void)state;
    sp_tmplstat_t r[4];
    int pid = 0;
    size_t n = 0;
    unlink(path);
    assert_int_equal(sp_tmplstat_read(path, &pid, r, 4, &n), -ENOENT);
    static const char *const bad[] = {
        "",                                  /* no pid line */
        "pid x\n",                           /* not a number */
        "pid 0\n",                           /* no such writer */
        "pid 12\ntiny ready 1 2\n",          /* no detail: fine, see below */
        "pid 12\ntiny sleeping 1 2 cache\n", /* unknown state */
        "pid 12\ntiny ready 1x 2 cache\n",   /* bad time */
        "pid 12\ntiny ready 1 2 cache",      /* cut short */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_text(bad[i]);
        int rc = sp_tmplstat_read(path, &pid, r, 4, &n);
        if (i == 3) {
            assert_int_equal(rc, 0);
            assert_string_equal(r[0].detail, "");
        } else {
            assert_int_equal(rc, -EBADMSG);
        }
    }
    sp_tmplstat_t many[SP_TMPLSTAT_MAX + 1];
    memset(many, 0, sizeof(many));
    assert_int_equal(sp_tmplstat_write(path, 1, many, SP_TMPLSTAT_MAX + 1), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
