/* PostgreSQL killed (SIGKILL on the postmaster; again with the event log's synchronous-commit
 * off), or stopped fast (SIGINT, as `pg_ctl restart -m fast` does first), while a bounded workload
 * runs in threads (creates, commands, file writes, deletes), and started again by `space up` some
 * seconds later (issue 18). What must hold:
 * - during the outage the API answers, and what it cannot do it refuses with a 503 and a JSON
 *   error: no 500, no answer past the client's deadline, no dropped connection;
 * - no daemon is restarted: every daemon's pid is the same afterwards;
 * - after PostgreSQL is back, creates, commands and file writes work again within 60 s;
 * - every 2xx answer has its fact in the log (SandboxStarted for a 201, CommandExited for a
 *   command's 200, FileWritten for a write's 200, SandboxDeleted for a 204), the stream's last
 *   sequence equals the log's highest stream_seq (the eventlog stored what the stream held while
 *   PostgreSQL was away: nothing acknowledged is lost), no sandbox is left in a transient state,
 *   and space-replay verify is clean. */
#include <setjmp.h>
#include <signal.h>
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
#include "bus.h"
#include "error.h"
#include "harness.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "workload.h"
#include "xmalloc.h"

#define THREADS        4
#define OPS_PER_THREAD 40
#define OPS_MIN        8
#define OUTAGE_MS      4000
#define CLIENT_MS      60000 /* a client's deadline: no answer may take longer */
#define RECOVER_MS     60000

static PGconn *db;
static char *key;
static int port;
static char busy[2][64]; /* running sandboxes the commands and writes go to */

static int64_t now_ms(void)
{
    return sp_mono_ns() / 1000000;
}

/* One call outside the workload (the probes and the recovery check): its status, and whether a
 * non-2xx answer had the API's JSON error. */
static int probe(const char *method, const char *path, const char *hdrs, const char *body,
                 const char *ctype, bool *ret_json_error, char *out, size_t out_len)
{
    sp_httpc_req_t req = {.host = "127.0.0.1",
                          .port = port,
                          .method = method,
                          .path = path,
                          .key = key,
                          .extra_headers = hdrs,
                          .body = body,
                          .body_len = body ? strlen(body) : 0,
                          .content_type = ctype,
                          .timeout_ms = CLIENT_MS};
    sp_httpc_resp_t r = {0};
    int rc = sp_httpc_do(&req, &r);
    if (rc < 0)
        return rc;
    if (ret_json_error) {
        sp_json_doc_t *doc = NULL;
        char err[SP_JSON_ERR_MAX];
        *ret_json_error = r.body && sp_json_parse(r.body, r.body_len, NULL, &doc, err) == 0 &&
                          sp_json_get(sp_json_root(doc), "code") &&
                          sp_json_get(sp_json_root(doc), "message");
        sp_json_doc_free(doc);
    }
    if (out)
        snprintf(out, out_len, "%.*s", (int)(r.body_len < out_len ? r.body_len : out_len - 1),
                 r.body ? r.body : "");
    rc = r.status;
    sp_httpc_resp_free(&r);
    return rc;
}

static int setup(void **state)
{
    char key_id[SP_APIKEY_ID_LEN + 1];
    (void)state;
    sp_test_stack_load();
    db = sp_test_db();
    port = sp_test_api_port();
    assert_int_equal(sp_apikey_create(db, "t1", "pg restart test", &key, key_id), 0);
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

static const char *const daemons[] = {"space-eventlog", "space-scheduler", "space-worker",
                                      "space-gateway", "nats-server"};
#define N_DAEMONS (sizeof(daemons) / sizeof(daemons[0]))

/* Until create, command and file write all answer 2xx: the ms it took. */
static int64_t wait_working(void)
{
    int64_t t0 = now_ms();
    char path[256];
    while (now_ms() - t0 < RECOVER_MS) {
        int c =
            probe("POST", "/v1/sandboxes", NULL, "{\"template\":\"tiny\"}", NULL, NULL, NULL, 0);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", busy[0]);
        int d = probe("POST", path, "Accept: application/json\r\n", "{\"cmd\":\"echo back\"}", NULL,
                      NULL, NULL, 0);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=back.txt", busy[1]);
        int e = probe("PUT", path, NULL, "back\n", "application/octet-stream", NULL, NULL, 0);
        if (c == 201 && d == 200 && e == 200)
            return now_ms() - t0;
        nanosleep(&(struct timespec){.tv_nsec = 250 * 1000 * 1000}, NULL);
    }
    fail_msg("create, command and write did not all work again within %d ms", RECOVER_MS);
    return -1;
}

/* sig: SIGKILL (a crash: the backends follow the postmaster, the server recovers from its WAL
 * at the next start) or SIGINT (`pg_ctl stop -m fast`: every session is told FATAL
 * "terminating connection due to administrator command" and the server stops cleanly). */
static void postgres_lost_under_load(int sig)
{
    int pids[N_DAEMONS];
    for (size_t i = 0; i < N_DAEMONS; i++) {
        pids[i] = sp_test_daemon_pid(daemons[i]);
        assert_true(pids[i] > 0);
    }
    sp_test_workload_cfg_t cfg = {.port = port,
                                  .key = key,
                                  .threads = THREADS,
                                  .min_calls = OPS_MIN,
                                  .max_calls = OPS_PER_THREAD,
                                  .ops = SP_TEST_OPS_BASIC,
                                  .busy = {busy[0], busy[1]},
                                  .pause_ms = 100,
                                  .client_ms = CLIENT_MS};
    sp_test_workload_t *wl = sp_test_workload_start(&cfg);
    nanosleep(&(struct timespec){.tv_nsec = 500 * 1000 * 1000}, NULL);

    /* The outage: the postmaster killed, its backends follow it (they watch its death). */
    PQfinish(db);
    db = NULL;
    sp_test_daemon_stop("postgres", sig);
    int64_t down_at = now_ms();
    int probes = 0;
    while (now_ms() - down_at < OUTAGE_MS) {
        bool json_error = false;
        char body[256];
        int64_t t0 = now_ms();
        int status =
            probe("GET", "/v1/sandboxes", NULL, NULL, NULL, &json_error, body, sizeof(body));
        if (status < 0)
            fail_msg("GET /v1/sandboxes during the outage: %s", sp_strerror(status));
        if (status != 503 || !json_error)
            fail_msg("GET /v1/sandboxes during the outage answered %d: %s", status, body);
        if (now_ms() - t0 > 20000)
            fail_msg("GET /v1/sandboxes during the outage took %lld ms",
                     (long long)(now_ms() - t0));
        probes++;
        nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
    }
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    int64_t recovered_ms = wait_working();
    sp_test_workload_stop(wl);
    fprintf(stderr,
            "outage probes: %d, all 503 with a JSON error; working again %lld ms after "
            "`space up`\n",
            probes, (long long)recovered_ms);

    /* Nobody restarted. */
    for (size_t i = 0; i < N_DAEMONS - 1; i++)
        if (sp_test_daemon_pid(daemons[i]) != pids[i])
            fail_msg("%s was restarted (pid %d, now %d)", daemons[i], pids[i],
                     sp_test_daemon_pid(daemons[i]));
    assert_int_equal(sp_test_daemon_pid("nats-server"), pids[N_DAEMONS - 1]);

    /* Every answer clear (2xx, or a refusal with a JSON error that is not a 500; none past the
     * deadline, no connection dropped), every 2xx with its fact. */
    db = sp_test_db();
    sp_test_workload_check(wl, db, SP_TEST_ANSWERS_OUTAGE, RECOVER_MS);
    sp_test_workload_free(wl);

    /* Nothing transient. */
    long long transient = sp_test_db_wait_scalar(
        db,
        "SELECT count(*) FROM sandboxes WHERE tenant = 't1' AND state IN ('requested', "
        "'placed', 'suspending', 'resuming')",
        0, RECOVER_MS);
    assert_int_equal(transient, 0);

    /* The stream's last sequence is the log's: nothing the stream holds is missing. */
    sp_bus_stream_state_t st;
    assert_int_equal(sp_bus_stream_state(sp_test_bus(), SP_BUS_STREAM, &st), 0);
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT coalesce(max(stream_seq), 0) FROM events");
    long long head = sp_test_db_wait_scalar(db, sql, (long long)st.last_seq, 30000);
    if (head < (long long)st.last_seq)
        fail_msg("the stream's last sequence is %llu, the log's %lld",
                 (unsigned long long)st.last_seq, head);

    char out[4096];
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 0);
}

static void test_postgres_killed_under_load(void **state)
{
    (void)state;
    postgres_lost_under_load(SIGKILL);
}

static void test_postgres_stopped_fast_under_load(void **state)
{
    (void)state;
    postgres_lost_under_load(SIGINT);
}

/* The event log with synchronous-commit off (docs/operations.md, "synchronous_commit"): a
 * crash may take back the newest commits with the WAL not yet flushed; the head goes back with
 * them and the event log stores them again from the stream. The same checks hold: every 2xx
 * has its fact, the log reaches the stream's last sequence, verify is clean. */
static void test_postgres_killed_async_commit(void **state)
{
    (void)state;
    setenv("SPACE_SYNCHRONOUS_COMMIT", "false", 1);
    sp_test_daemon_kill9("space-eventlog");
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    unsetenv("SPACE_SYNCHRONOUS_COMMIT");
    assert_int_equal(sp_test_sh("grep -q 'synchronous_commit=off' %s/log/space-eventlog.log",
                                sp_test_env("SPACE_HOME")),
                     0);
    postgres_lost_under_load(SIGKILL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_postgres_killed_under_load),
        cmocka_unit_test(test_postgres_stopped_fast_under_load),
        cmocka_unit_test(test_postgres_killed_async_commit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
