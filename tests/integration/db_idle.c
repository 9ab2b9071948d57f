/* Idle PostgreSQL connections (db.h, sp_db_idle_t; the worker's resume reads its snapshot's
 * record through it) against the stack's real PostgreSQL, watched from pg_stat_activity:
 *   - a connection given back is the one taken next (same backend), so a second use pays no
 *     connect;
 *   - no more than keep stay open, and free closes them all;
 *   - one the server dropped while idle (pg_terminate_backend: what a PostgreSQL restart does
 *     to it) is not handed out: the next take gives a working connection on a new backend;
 *   - one given back inside a transaction is closed, not kept (its next user would run in it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "db.h"
#include "harness.h"

#define APP "space-test-idle"

static long long open_backends(PGconn *admin)
{
    return sp_test_db_scalar(admin, "SELECT count(*) FROM pg_stat_activity WHERE "
                                    "application_name = '" APP "'");
}

/* The backends of APP gone: pg_stat_activity lags a closed connection by a moment. */
static void wait_backends(PGconn *admin, long long n)
{
    assert_int_equal(sp_test_db_wait_scalar(admin,
                                            "SELECT count(*) FROM pg_stat_activity WHERE "
                                            "application_name = '" APP "'",
                                            n, 10000),
                     n);
}

static long long one(PGconn *c)
{
    PGresult *r = PQexec(c, "SELECT 41 + 1");
    long long v =
        PQresultStatus(r) == PGRES_TUPLES_OK ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
    PQclear(r);
    return v;
}

static void test_reused_bounded_and_checked(void **state)
{
    (void)state;
    sp_test_stack_load();
    PGconn *admin = sp_test_db();
    sp_db_idle_t *idle = sp_db_idle_new(sp_test_env("SPACE_PG_URL"), APP, 2);

    PGconn *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(sp_db_idle_take(idle, 5000, &a), 0);
    int pid_a = PQbackendPID(a);
    sp_db_idle_give(idle, a);
    assert_int_equal(sp_db_idle_take(idle, 5000, &a), 0);
    assert_int_equal(PQbackendPID(a), pid_a); /* the same backend: no new connection */
    assert_int_equal(one(a), 42);

    /* Three at once, given back: two stay open. */
    assert_int_equal(sp_db_idle_take(idle, 5000, &b), 0);
    assert_int_equal(sp_db_idle_take(idle, 5000, &c), 0);
    assert_int_not_equal(PQbackendPID(b), pid_a);
    wait_backends(admin, 3);
    sp_db_idle_give(idle, a);
    sp_db_idle_give(idle, b);
    sp_db_idle_give(idle, c);
    wait_backends(admin, 2);

    /* Both idle ones killed by the server: the take still answers, on a new backend. */
    assert_int_equal(sp_test_db_scalar(admin,
                                       "SELECT count(pg_terminate_backend(pid)) FROM "
                                       "pg_stat_activity WHERE application_name = '" APP "'"),
                     2);
    wait_backends(admin, 0);
    assert_int_equal(sp_db_idle_take(idle, 5000, &a), 0);
    assert_int_equal(one(a), 42);
    assert_int_equal(open_backends(admin), 1);

    /* Given back inside a transaction: closed. */
    assert_int_equal(sp_db_exec(a, "BEGIN"), 0);
    sp_db_idle_give(idle, a);
    wait_backends(admin, 0);

    assert_int_equal(sp_db_idle_take(idle, 5000, &a), 0);
    sp_db_idle_give(idle, a);
    wait_backends(admin, 1);
    sp_db_idle_free(idle);
    wait_backends(admin, 0);
    PQfinish(admin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reused_bounded_and_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
