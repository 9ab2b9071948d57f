/* A worker, or nats-server, killed (SIGKILL) in the middle of parallel creates and commands
 * leaks nothing (issue 17): after `space up` restarts it, within 60 s no sandbox is left in a
 * transient state, the host holds exactly the sandboxes the log says run (runsc container,
 * bundle, disk, netns, cgroup), every 2xx answer has its fact in the log (SandboxStarted for a
 * 201, CommandExited for a command's 200), and space-replay verify and rebuild are clean.
 * nats-server comes back on the port it had, and the other daemons reconnect to it without
 * being restarted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "apikey.h"
#include "harness.h"
#include "ids.h"
#include "json.h"
#include "workload.h"
#include "xmalloc.h"

#define THREADS 6

static PGconn *db;
static char *key;
static int port;
static char busy[2][64]; /* running sandboxes the commands go to */

static int setup(void **state)
{
    char key_id[SP_APIKEY_ID_LEN + 1];
    (void)state;
    sp_test_stack_load();
    db = sp_test_db();
    port = sp_test_api_port();
    assert_int_equal(sp_apikey_create(db, "t1", "crash test", &key, key_id), 0);
    for (int i = 0; i < 2; i++)
        sp_test_create_sandbox(port, key, "tiny", busy[i]);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(key);
    PQfinish(db);
    return 0;
}

static void killed_mid_work(const char *daemon)
{
    /* Six threads, each a create and a command (sleep 0.3 s, so that some are running when the
     * daemon dies), all at once. */
    sp_test_workload_cfg_t cfg = {
        .port = port,
        .key = key,
        .threads = THREADS,
        .min_calls = 2,
        .max_calls = 2,
        .ops = SP_TEST_OP_BIT(SP_TEST_OP_CREATE) | SP_TEST_OP_BIT(SP_TEST_OP_COMMAND),
        .busy = {busy[0], busy[1]},
        .command = "sleep 0.3; echo done",
    };
    sp_test_workload_t *wl = sp_test_workload_start(&cfg);
    nanosleep(&(struct timespec){.tv_nsec = 400 * 1000 * 1000}, NULL);
    sp_test_daemon_kill9(daemon);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    int64_t up_ns = sp_mono_ns(); /* the checks below hold within 60 s of this */
    sp_test_workload_stop(wl);

    /* Nothing transient after 60 s. */
    long long transient = sp_test_db_wait_scalar(
        db,
        "SELECT count(*) FROM sandboxes WHERE tenant = 't1' AND state IN ('requested', "
        "'placed', 'suspending', 'resuming')",
        0, 60000);
    assert_int_equal(transient, 0);

    /* The host holds exactly what the log says runs. */
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/worker", sp_test_env("SPACE_HOME"));
    PGresult *r = PQexec(db, "SELECT id, state FROM sandboxes WHERE tenant = 't1'");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    int running = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *id = PQgetvalue(r, i, 0), *st = PQgetvalue(r, i, 1);
        bool live = strcmp(st, "running") == 0;
        running += live;
        if (sp_test_sandbox_held(dir, id) != live)
            fail_msg("sandbox %s is %s in the log but %s on the host", id, st,
                     live ? "not held" : "still held");
    }
    PQclear(r);
    /* One bundle per running sandbox (a claimed one's is a link to its pool id's,
     * docs/pools.md); besides those, only the pool ids behind such links and the restarted
     * worker's own pool (at most its size, 2 per template). */
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "test $(ls %s/bundles | grep -vc '^pool_') -eq %d", dir, running);
    assert_int_equal(system(cmd), 0); /* NOLINT(cert-env33-c): as an operator would look */
    snprintf(cmd, sizeof(cmd),
             "test $(ls %s/bundles | grep -c '^pool_') -le $(($(find %s/bundles -maxdepth 1 "
             "-type l | wc -l) + 2))",
             dir, dir);
    assert_int_equal(system(cmd), 0); /* NOLINT(cert-env33-c): as an operator would look */

    /* Every 2xx with its fact (CommandExited: the worker's end, or the log's when the IoExit
     * was lost with the connection, never the gateway's deadline). Other answers are counted:
     * a call in flight when its daemon died may fail in any way a client would see. */
    int64_t left = 60000 - (sp_mono_ns() - up_ns) / 1000000;
    int ok = sp_test_workload_check(wl, db, SP_TEST_ANSWERS_ANY, left > 1000 ? (int)left : 1000);
    fprintf(stderr, "%d of %d calls answered 2xx\n", ok, 2 * THREADS);
    sp_test_workload_free(wl);

    char out[4096];
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 0);
    assert_int_equal(sp_test_replay("rebuild", out, sizeof(out)), 0);
}

static void test_worker_killed_mid_work(void **state)
{
    (void)state;
    killed_mid_work("space-worker");
}

/* The NATS URL as space.env has it. */
static void nats_url(char out[256])
{
    char path[512], line[512];
    snprintf(path, sizeof(path), "%s/space.env", sp_test_env("SPACE_HOME"));
    FILE *f = fopen(path, "re");
    out[0] = '\0';
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, "SPACE_NATS_URL=", 15) == 0)
            snprintf(out, 256, "%.*s", (int)strcspn(line + 15, "\n"), line + 15);
    if (f)
        fclose(f);
}

static void test_nats_killed_mid_work(void **state)
{
    (void)state;
    char before[256], after[256];
    nats_url(before);
    int gateway = sp_test_daemon_pid("space-gateway"),
        eventlog = sp_test_daemon_pid("space-eventlog");
    killed_mid_work("nats-server");
    nats_url(after);
    assert_string_equal(before, after);
    /* Reconnected, not restarted. */
    assert_int_equal(sp_test_daemon_pid("space-gateway"), gateway);
    assert_int_equal(sp_test_daemon_pid("space-eventlog"), eventlog);
    char id[64];
    sp_test_create_sandbox(port, key, "tiny", id);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_killed_mid_work),
        cmocka_unit_test(test_nats_killed_mid_work),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
