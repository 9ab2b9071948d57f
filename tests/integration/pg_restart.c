/* PostgreSQL killed (SIGKILL on the postmaster), or stopped fast (SIGINT, as `pg_ctl restart -m
 * fast` does first), while a bounded workload runs in threads
 * (creates, commands, file writes, deletes), and started again by `space up` some seconds
 * later (issue 18). What must hold:
 * - during the outage the API answers, and what it cannot do it refuses with a 503 and a JSON
 *   error: no 500, no answer past the client's deadline, no dropped connection;
 * - no daemon is restarted: every daemon's pid is the same afterwards;
 * - after PostgreSQL is back, creates, commands and file writes work again within 60 s;
 * - every 2xx answer has its fact in the log (SandboxStarted for a 201, CommandExited for a
 *   command's 200, FileWritten for a write's 200, SandboxDeleted for a 204), the stream's last
 *   sequence equals the log's highest stream_seq (the eventlog stored what the stream held while
 *   PostgreSQL was away: nothing acknowledged is lost), no sandbox is left in a transient state,
 *   and space-replay verify is clean. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
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
#include "xmalloc.h"

#define THREADS        4
#define OPS_PER_THREAD 40
#define OPS_MIN        8
#define OUTAGE_MS      4000
#define CLIENT_MS      60000 /* a client's deadline: no answer may take longer */
#define RECOVER_MS     60000

enum { OP_CREATE, OP_COMMAND, OP_WRITE, OP_DELETE };
static const char *const op_names[] = {"create", "command", "write", "delete"};

typedef struct {
    int op;
    int rc; /* sp_httpc_do's: < 0 when the exchange itself failed */
    int status;
    int64_t ms;
    bool json_error; /* a non-2xx answer carried {"error": {...}} */
    char id[64];     /* the sandbox (create, delete, write) or the command's cmd_id */
    char path[64];   /* a write's path */
    char body[256];
} call_t;

typedef struct {
    pthread_t t;
    call_t calls[OPS_PER_THREAD];
    int n;
    int ncalls;
} worker_t;

static PGconn *db;
static char *key;
static int port;
static char busy[2][64]; /* running sandboxes the commands and writes go to */
static atomic_bool stop;

static int64_t now_ms(void)
{
    return sp_mono_ns() / 1000000;
}

static void json_field(const sp_httpc_resp_t *r, const char *field, char out[64], bool *ret_err)
{
    out[0] = '\0';
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (!r->body || sp_json_parse(r->body, r->body_len, NULL, &doc, err) < 0)
        return;
    const sp_json_t *root = sp_json_root(doc);
    /* The API's error shape: {"code", "message", ...}. */
    if (ret_err)
        *ret_err = sp_json_get(root, "code") && sp_json_get(root, "message");
    const sp_json_t *v = sp_json_get(root, field);
    const char *s = v ? sp_json_str(v, NULL) : NULL;
    snprintf(out, 64, "%s", s ? s : "");
    sp_json_doc_free(doc);
}

static void call(call_t *c, const char *method, const char *path, const char *hdrs,
                 const char *body, const char *ctype, const char *field)
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
    char id[64];
    int64_t t0 = now_ms();
    c->rc = sp_httpc_do(&req, &r);
    c->ms = now_ms() - t0;
    if (c->rc < 0)
        return;
    c->status = r.status;
    json_field(&r, field ? field : "id", id, &c->json_error);
    if (field && id[0])
        snprintf(c->id, sizeof(c->id), "%s", id);
    snprintf(c->body, sizeof(c->body), "%.*s",
             (int)(r.body_len < sizeof(c->body) ? r.body_len : sizeof(c->body) - 1),
             r.body ? r.body : "");
    sp_httpc_resp_free(&r);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    char created[64] = "";
    /* At least OPS_MIN calls (each kind twice), then until PostgreSQL is back and working. */
    for (int i = 0; i < OPS_PER_THREAD && (i < OPS_MIN || !atomic_load(&stop)); i++) {
        call_t *c = &w->calls[w->ncalls++];
        char path[256], body[256];
        const char *sbx = busy[(w->n + i) % 2];
        c->op = (w->n + i) % 4;
        if (c->op == OP_DELETE && !created[0])
            c->op = OP_CREATE;
        switch (c->op) {
        case OP_CREATE:
            call(c, "POST", "/v1/sandboxes", NULL, "{\"template\":\"tiny\"}", NULL, "id");
            if (c->status == 201)
                snprintf(created, sizeof(created), "%s", c->id);
            break;
        case OP_COMMAND:
            snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", sbx);
            snprintf(body, sizeof(body), "{\"cmd\":\"echo w%d-%d\",\"timeout_s\":5}", w->n, i);
            call(c, "POST", path, "Accept: application/json\r\n", body, NULL, "cmd_id");
            break;
        case OP_WRITE:
            snprintf(c->path, sizeof(c->path), "pgr-%d-%d.txt", w->n, i);
            snprintf(c->id, sizeof(c->id), "%s", sbx);
            snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=%s", sbx, c->path);
            call(c, "PUT", path, NULL, "written while postgres restarts\n",
                 "application/octet-stream", NULL);
            break;
        default:
            snprintf(c->id, sizeof(c->id), "%s", created);
            snprintf(path, sizeof(path), "/v1/sandboxes/%s", created);
            call(c, "DELETE", path, NULL, NULL, NULL, NULL);
            if (c->status == 204 || c->status == 404)
                created[0] = '\0';
            break;
        }
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
    return NULL;
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
        call_t c = {0}, d = {0}, e = {0};
        call(&c, "POST", "/v1/sandboxes", NULL, "{\"template\":\"tiny\"}", NULL, "id");
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", busy[0]);
        call(&d, "POST", path, "Accept: application/json\r\n", "{\"cmd\":\"echo back\"}", NULL,
             "cmd_id");
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=back.txt", busy[1]);
        call(&e, "PUT", path, NULL, "back\n", "application/octet-stream", NULL);
        if (c.status == 201 && d.status == 200 && e.status == 200)
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
    worker_t ws[THREADS] = {0};
    for (int i = 0; i < THREADS; i++) {
        ws[i].n = i;
        assert_int_equal(pthread_create(&ws[i].t, NULL, worker_main, &ws[i]), 0);
    }
    nanosleep(&(struct timespec){.tv_nsec = 500 * 1000 * 1000}, NULL);

    /* The outage: the postmaster killed, its backends follow it (they watch its death). */
    PQfinish(db);
    db = NULL;
    sp_test_daemon_stop("postgres", sig);
    int64_t down_at = now_ms();
    int probes = 0;
    while (now_ms() - down_at < OUTAGE_MS) {
        call_t p = {0};
        call(&p, "GET", "/v1/sandboxes", NULL, NULL, NULL, NULL);
        if (p.rc < 0)
            fail_msg("GET /v1/sandboxes during the outage: %s", sp_strerror(p.rc));
        if (p.status != 503 || !p.json_error)
            fail_msg("GET /v1/sandboxes during the outage answered %d: %s", p.status, p.body);
        if (p.ms > 20000)
            fail_msg("GET /v1/sandboxes during the outage took %lld ms", (long long)p.ms);
        probes++;
        nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
    }
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    int64_t recovered_ms = wait_working();
    atomic_store(&stop, true);
    for (int i = 0; i < THREADS; i++)
        pthread_join(ws[i].t, NULL);
    int64_t up_at = now_ms();
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

    db = sp_test_db();
    /* Every answer clear: 2xx, or a refusal with a JSON error ({code, message}) that is not a 500;
     * none past the deadline, no connection dropped. */
    int by_status[4][6] = {{0}}; /* op x {2xx, 4xx, 503, other 5xx, failed, total} */
    int64_t slowest = 0;
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < ws[t].ncalls; i++) {
            const call_t *c = &ws[t].calls[i];
            int *row = by_status[c->op];
            row[5]++;
            slowest = c->ms > slowest ? c->ms : slowest;
            if (c->rc < 0) {
                row[4]++;
                fail_msg("%s: the exchange failed (%s) after %lld ms", op_names[c->op],
                         sp_strerror(c->rc), (long long)c->ms);
            }
            if (c->status >= 200 && c->status < 300) {
                row[0]++;
                continue;
            }
            if (!c->json_error)
                fail_msg("%s answered %d without a JSON error: %s", op_names[c->op], c->status,
                         c->body);
            if (c->status == 503)
                row[2]++;
            else if (c->status >= 500) {
                row[3]++;
                fail_msg("%s answered %d: %s", op_names[c->op], c->status, c->body);
            } else
                row[1]++;
        }
    for (int op = 0; op < 4; op++)
        fprintf(stderr, "%-8s %2d calls: %2d 2xx, %2d 4xx, %2d 503\n", op_names[op],
                by_status[op][5], by_status[op][0], by_status[op][1], by_status[op][2]);
    fprintf(stderr, "slowest answer: %lld ms\n", (long long)slowest);

    /* Every 2xx with its fact. */
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < ws[t].ncalls; i++) {
            const call_t *c = &ws[t].calls[i];
            if (c->status < 200 || c->status >= 300)
                continue;
            char sql[512];
            const char *what = "";
            switch (c->op) {
            case OP_CREATE:
                what = "SandboxStarted";
                snprintf(sql, sizeof(sql),
                         "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = "
                         "'SandboxStarted' AND status = 'accepted'",
                         c->id);
                break;
            case OP_COMMAND:
                what = "CommandExited";
                snprintf(sql, sizeof(sql),
                         "SELECT count(*) FROM events WHERE type = 'CommandExited' AND status = "
                         "'accepted' AND position(convert_to('%s', 'UTF8') in payload) > 0",
                         c->id);
                break;
            case OP_WRITE:
                what = "FileWritten";
                snprintf(sql, sizeof(sql),
                         "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = "
                         "'FileWritten' AND status = 'accepted' AND position(convert_to('%s', "
                         "'UTF8') in payload) > 0",
                         c->id, c->path);
                break;
            default:
                what = "SandboxDeleted";
                snprintf(sql, sizeof(sql),
                         "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = "
                         "'SandboxDeleted' AND status = 'accepted'",
                         c->id);
                break;
            }
            int64_t left = RECOVER_MS - (now_ms() - up_at);
            if (sp_test_db_wait_scalar(db, sql, 1, left > 2000 ? (int)left : 2000) < 1)
                fail_msg("%s %s answered %d but its %s is not in the log", op_names[c->op], c->id,
                         c->status, what);
        }

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
    atomic_store(&stop, false);
    postgres_lost_under_load(SIGINT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_postgres_killed_under_load),
        cmocka_unit_test(test_postgres_stopped_fast_under_load),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
