/* The scheduler's lost-worker controller on a real stack (eventlog, scheduler, worker,
 * gateway; worker-lost-s = 4 here): the worker is killed -9 and stays away. Its running and
 * paused sandboxes, and a create placed on it after its death, fail with worker_lost; a
 * deletion is answered by the scheduler (204); a suspended sandbox is not touched. The worker
 * is marked stopped. When it comes back it releases what was left on its host, does not start
 * the create it finds waiting, is up again, and the suspended sandbox resumes on it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static int port;
static const char *key;

static int setup(void **state)
{
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    return 0;
}

static bool held(const char *id)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/worker", sp_test_env("SPACE_HOME"));
    return sp_test_sandbox_held(dir, id);
}

static void state_of(PGconn *db, const char *id, char *out, size_t len)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT state || ' ' || failure_reason FROM sandboxes WHERE id = '%s'", id);
    PGresult *r = PQexec(db, sql);
    snprintf(out, len, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
}

static void test_lost_worker(void **state)
{
    char running[64], paused[64], suspended[64], st[128], path[128];
    PGconn *db = sp_test_db();
    sp_test_create_sandbox(port, key, "tiny", running);
    sp_test_create_sandbox(port, key, "tiny", paused);
    sp_test_create_sandbox(port, key, "tiny", suspended);
    assert_int_equal(sp_test_lifecycle(port, key, paused, "pause", NULL, st, sizeof(st)), 200);
    assert_int_equal(sp_test_lifecycle(port, key, suspended, "suspend", NULL, st, sizeof(st)), 200);
    /* Alive for longer than worker-lost-s with its heartbeats: nothing happens. */
    sleep(6);
    state_of(db, running, st, sizeof(st));
    assert_string_equal(st, "running ");

    sp_test_daemon_kill9("space-worker");
    /* A create placed on it in the seconds it still looks live: never started. */
    assert_int_equal(sp_test_space("create tiny > /dev/null 2>&1 &"), 0);
    char placed[64] = "";
    for (int i = 0; i < 100 && !placed[0]; i++) {
        PGresult *r = PQexec(db, "SELECT id FROM sandboxes WHERE state = 'placed'");
        if (PQntuples(r) == 1)
            snprintf(placed, sizeof(placed), "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        usleep(50 * 1000);
    }
    if (!placed[0])
        fail_msg("the create was not placed on the dead worker");
    const char *lost[] = {running, paused, placed};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 300; i++) {
            state_of(db, lost[k], st, sizeof(st));
            if (strcmp(st, "failed worker_lost") == 0)
                break;
            usleep(100 * 1000);
        }
        assert_string_equal(st, "failed worker_lost");
    }
    print_message("running, paused and placed sandboxes failed with worker_lost\n");
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM workers WHERE state = 'stopped' "
                                            "AND id = 'it-lost_worker'",
                                            1, 5000),
                     1);
    state_of(db, suspended, st, sizeof(st));
    assert_string_equal(st, "suspended ");
    /* The GET shows why; the delete is answered without the worker. */
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", running);
    sp_test_http(port, "GET", path, key, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    if (!strstr(r.body, "\"failure_reason\":\"worker_lost\""))
        fail_msg("GET: %s", r.body);
    sp_test_http_free(&r);
    sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
    if (r.status != 204)
        fail_msg("DELETE of a sandbox of a lost worker: %d %s", r.status, r.body);
    sp_test_http_free(&r);
    state_of(db, running, st, sizeof(st));
    assert_string_equal(st, "deleted worker_lost");
    /* Its runsc sandbox, disk and netns are still on the host: nobody was there to release
     * them. The worker, back, does. */
    assert_true(held(paused));
    assert_int_equal(sp_test_space("up"), 0);
    for (int i = 0; i < 200 && (held(running) || held(paused)); i++)
        usleep(100 * 1000);
    assert_false(held(running));
    assert_false(held(paused));
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM workers WHERE state = 'up' AND "
                                            "id = 'it-lost_worker'",
                                            1, 10000),
                     1);
    /* The snapshot outlived it all. */
    assert_int_equal(sp_test_lifecycle(port, key, suspended, "resume", NULL, st, sizeof(st)), 200);
    assert_string_equal(st, "running");
    sp_test_cmd_t c = sp_test_run(port, key, suspended, "{\"cmd\":\"echo back\"}");
    assert_int_equal(c.status, 200);
    assert_string_equal(c.stdout_s, "back\n");
    sp_test_cmd_free(&c);
    /* Its placement came back to it and was not acted on: the log had given up on it. */
    assert_false(held(placed));
    assert_int_equal(sp_test_events(db, placed, "SandboxStarted", NULL), 0);
    state_of(db, placed, st, sizeof(st));
    assert_string_equal(st, "failed worker_lost");
    PQfinish(db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_worker),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
