/* Commands in real sandboxes, through HTTP only: the guest agent, the worker's data plane and
 * the gateway together. Stack: eventlog + scheduler + worker + gateway. */
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <libpq-fe.h>

#include "buf.h"
#include "envelope.h"
#include "harness.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "sse.h"
#include "xmalloc.h"

static int port;
static const char *key;
static char sbx[3][64]; /* [2]: the long background command's own */

static sp_json_doc_t *body_json(const sp_test_http_resp_t *r)
{
    return sp_test_json(r);
}

static void create(char out[64])
{
    sp_test_create_sandbox(port, key, "tiny", out);
}

typedef sp_test_cmd_t result_t;

/* Runs body (JSON) as a command in sandbox id and returns the JSON answer. */
static result_t run(const char *id, const char *body)
{
    return sp_test_run(port, key, id, body);
}

static void result_free(result_t *r)
{
    sp_test_cmd_free(r);
}

/* ---- background commands, streams, stdin, signals, pty ---- */

/* POSTs body (JSON) and returns the status; *ret_doc gets the parsed answer. */
static int post(const char *path, const char *body, sp_json_doc_t **ret_doc)
{
    sp_test_http_resp_t r;
    sp_test_http(port, "POST", path, key, NULL, body, strlen(body), &r);
    int status = r.status;
    if (ret_doc)
        *ret_doc = body_json(&r);
    sp_test_http_free(&r);
    return status;
}

/* Starts a background command; its id into cid. */
static void start_bg(const char *id, const char *body, char cid[64])
{
    char path[128];
    sp_json_doc_t *doc;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    int status = post(path, body, &doc);
    const char *c = sp_json_str(sp_json_get(sp_json_root(doc), "cmd_id"), NULL);
    if (status != 202 || !c)
        fail_msg("background start: %d", status);
    snprintf(cid, 64, "%s", c);
    sp_json_doc_free(doc);
}

/* What one SSE connection to a command's stream saw. */
typedef struct {
    int status;
    sp_buf_t out; /* stdout text, in order */
    uint64_t first_id, last_id;
    size_t n_out;      /* stdout events */
    size_t stop_after; /* 0: read to the end; else disconnect after this many stdout events */
    bool exited, started, skipped, bad;
    int64_t exit_code, signal, pid;
} watch_t;

static int on_watch_event(void *arg, const sp_sse_event_t *ev)
{
    watch_t *w = arg;
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (sp_json_parse(ev->data, ev->data_len, NULL, &doc, err) < 0) {
        w->bad = true;
        return 1;
    }
    const sp_json_t *root = sp_json_root(doc);
    int stop = 0;
    if (strcmp(ev->event, "start") == 0) {
        w->started = true;
        sp_json_int(sp_json_get(root, "pid"), 0, 1 << 22, &w->pid);
        sp_json_bool(sp_json_get(root, "output_skipped"), &w->skipped);
    } else if (strcmp(ev->event, "stdout") == 0) {
        size_t n = 0;
        const char *t = sp_json_str(sp_json_get(root, "text"), &n);
        uint64_t id = strtoull(ev->id, NULL, 10);
        if (!t || id == 0 || id <= w->last_id)
            w->bad = true;
        if (w->n_out++ == 0)
            w->first_id = id;
        w->last_id = id;
        sp_buf_append(&w->out, t ? t : "", n);
        stop = w->stop_after && w->n_out >= w->stop_after;
    } else if (strcmp(ev->event, "exit") == 0) {
        w->exited = true;
        sp_json_int(sp_json_get(root, "exit_code"), -1, 255, &w->exit_code);
        sp_json_int(sp_json_get(root, "signal"), 0, 64, &w->signal);
    }
    sp_json_doc_free(doc);
    return stop;
}

static int on_watch_data(void *arg, const char *p, size_t n)
{
    return sp_sse_feed(arg, p, n);
}

/* GET .../commands/{cid}/stream, after last_event_id when nonzero. */
static void watch(const char *id, const char *cid, uint64_t last_event_id, watch_t *w)
{
    char path[256], extra[64] = "";
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands/%s/stream", id, cid);
    if (last_event_id)
        snprintf(extra, sizeof(extra), "Last-Event-ID: %llu\r\n",
                 (unsigned long long)last_event_id);
    sp_sse_reader_t sse;
    sp_sse_init(&sse, on_watch_event, w);
    sp_httpc_req_t req = {.host = "127.0.0.1",
                          .port = port,
                          .method = "GET",
                          .path = path,
                          .key = key,
                          .extra_headers = extra,
                          .timeout_ms = 120000};
    sp_httpc_resp_t r;
    if (sp_httpc_stream(&req, &r, on_watch_data, &sse) < 0)
        w->bad = true;
    w->status = r.status;
    sp_httpc_resp_free(&r);
    sp_sse_dispose(&sse);
}

static void watch_free(watch_t *w)
{
    sp_buf_dispose(&w->out);
}

/* The long one: a 20 s background command (40 ticks, one each 0.5 s: about as long as the
 * other tests of this file take beside it) whose watcher disconnects after three ticks and
 * comes back three seconds later with Last-Event-ID. It runs in a thread from setup on, beside
 * the other tests (cmocka's asserts are not for other threads: it records what it found), and
 * test_background_reattached checks it at the end. */
static pthread_t long_thread;
static char long_failure[512];
static watch_t long_first, long_second;
static char long_cid[64];

static void *long_background(void *arg)
{
    (void)arg;
    sp_buf_init(&long_first.out);
    sp_buf_init(&long_second.out);
    long_first.stop_after = 3;
    watch(sbx[2], long_cid, 0, &long_first);
    sleep(3);
    watch(sbx[2], long_cid, long_first.last_id, &long_second);
    return NULL;
}

static void start_long_background(void)
{
    start_bg(sbx[2],
             "{\"cmd\":\"i=0; while [ $i -lt 40 ]; do echo tick $i; i=$((i+1)); sleep 0.5; done\","
             "\"background\":true}",
             long_cid);
    if (pthread_create(&long_thread, NULL, long_background, NULL) != 0)
        snprintf(long_failure, sizeof(long_failure), "no thread");
}

static void test_background_reattached(void **state)
{
    pthread_join(long_thread, NULL);
    assert_string_equal(long_failure, "");
    assert_int_equal(long_first.status, 200);
    assert_int_equal(long_second.status, 200);
    assert_false(long_first.bad || long_second.bad);
    assert_true(long_first.started && long_second.started);
    assert_false(long_first.exited); /* it left early */
    assert_int_equal(long_first.n_out, 3);
    /* The second connection starts right after what the first saw, misses nothing of what
     * came while nobody watched, and ends with the exit. */
    assert_int_equal(long_second.first_id, long_first.last_id + 1);
    assert_false(long_second.skipped);
    assert_true(long_second.exited);
    assert_int_equal(long_second.exit_code, 0);
    sp_buf_t want, got;
    sp_buf_init(&want);
    sp_buf_init(&got);
    for (int i = 0; i < 40; i++)
        sp_buf_printf(&want, "tick %d\n", i);
    sp_buf_append(&got, long_first.out.data, long_first.out.len);
    sp_buf_append(&got, long_second.out.data, long_second.out.len);
    assert_string_equal(got.data, want.data);
    sp_buf_dispose(&want);
    sp_buf_dispose(&got);
    watch_free(&long_first);
    watch_free(&long_second);

    /* Ended, it is still listed and can be read again in full. */
    watch_t again = {.stop_after = 0};
    sp_buf_init(&again.out);
    watch(sbx[2], long_cid, 0, &again);
    assert_true(again.exited);
    assert_int_equal(again.n_out, 40);
    watch_free(&again);
}

static void ctl(const char *id, const char *cid, const char *action, const char *body,
                int want_status, const char *want_code)
{
    char path[256];
    sp_json_doc_t *doc;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands/%s/%s", id, cid, action);
    int status = post(path, body, &doc);
    const char *code = sp_json_str(sp_json_get(sp_json_root(doc), "code"), NULL);
    if (status != want_status || (want_code && (!code || strcmp(code, want_code) != 0)))
        fail_msg("%s %s: %d %s, wanted %d %s", action, body, status, code ? code : "-", want_status,
                 want_code ? want_code : "");
    sp_json_doc_free(doc);
}

/* GET /v1/sandboxes/{id}/commands, parsed. */
static sp_json_doc_t *list_commands(const char *id)
{
    char path[256];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    sp_json_doc_t *doc;
    sp_test_http_resp_t r;
    sp_test_http(port, "GET", path, key, NULL, NULL, 0, &r);
    doc = body_json(&r);
    sp_test_http_free(&r);
    return doc;
}

/* Waits (polling the list) until command cid has written at least one chunk. */
static void wait_output(const char *id, const char *cid)
{
    for (int i = 0; i < 500; i++) {
        sp_json_doc_t *doc = list_commands(id);
        const sp_json_t *list = sp_json_get(sp_json_root(doc), "commands");
        int64_t seq = 0;
        for (size_t k = 0; k < sp_json_len(list); k++) {
            const sp_json_t *c = sp_json_at(list, k);
            if (strcmp(sp_json_str(sp_json_get(c, "cmd_id"), NULL), cid) == 0)
                sp_json_int(sp_json_get(c, "last_seq"), 0, INT64_MAX, &seq);
        }
        sp_json_doc_free(doc);
        if (seq > 0)
            return;
        usleep(10 * 1000);
    }
    fail_msg("command %s wrote nothing in 5 s", cid);
}

static void test_stdin_signal_pty(void **state)
{
    char cid[64];
    watch_t w;

    /* Stdin kept open, written in two requests (text, then bytes in base64 with the end). The
     * command lives on 2 s past the end of its stdin, so that the late write meets a closed
     * stdin and not an ended command (it did, once, on a loaded host). */
    start_bg(sbx[1],
             "{\"cmd\":\"cat; sleep 2; echo done\",\"background\":true,\"stdin_open\":true}", cid);
    ctl(sbx[1], cid, "stdin", "{\"data\":\"hello\\n\"}", 200, NULL);
    ctl(sbx[1], cid, "stdin", "{\"data_b64\":\"d29ybGQK\",\"eof\":true}", 200, NULL);
    ctl(sbx[1], cid, "stdin", "{\"data\":\"late\"}", 409, "stdin_closed");
    memset(&w, 0, sizeof(w));
    sp_buf_init(&w.out);
    watch(sbx[1], cid, 0, &w);
    assert_true(w.exited);
    assert_string_equal(w.out.data, "hello\nworld\ndone\n");
    assert_true(w.pid > 1);
    watch_free(&w);

    /* A signal by name ends it; the command is then not running. */
    start_bg(sbx[1], "{\"cmd\":\"sleep 100\",\"background\":true}", cid);
    ctl(sbx[1], cid, "stdin", "{\"data\":\"x\"}", 409, "stdin_closed");
    ctl(sbx[1], cid, "signal", "{\"signal\":\"SIGTERM\"}", 200, NULL);
    memset(&w, 0, sizeof(w));
    sp_buf_init(&w.out);
    watch(sbx[1], cid, 0, &w);
    assert_true(w.exited);
    assert_int_equal(w.signal, 15);
    watch_free(&w);
    ctl(sbx[1], cid, "signal", "{\"signal\":9}", 409, "command_not_running");
    ctl(sbx[1], cid, "signal", "{\"signal\":\"NOPE\"}", 400, "invalid_field");
    ctl(sbx[1], "cmd_nosuchcommand", "signal", "{\"signal\":9}", 404, "not_found");
    ctl(sbx[1], cid, "resize", "{\"rows\":10,\"cols\":10}", 409, "command_not_running");

    /* A pty: a terminal of the given size, resized while it runs; input is echoed. */
    start_bg(sbx[1],
             "{\"cmd\":\"echo $(tty) $(stty size); read x; echo got $x; stty size\","
             "\"background\":true,\"pty\":{\"rows\":30,\"cols\":100}}",
             cid);
    wait_output(sbx[1], cid); /* the first size is read before the resize */
    ctl(sbx[1], cid, "resize", "{\"rows\":50,\"cols\":132}", 200, NULL);
    ctl(sbx[1], cid, "stdin", "{\"data\":\"abc\\n\"}", 200, NULL);
    memset(&w, 0, sizeof(w));
    sp_buf_init(&w.out);
    watch(sbx[1], cid, 0, &w);
    assert_true(w.exited);
    assert_int_equal(w.exit_code, 0);
    assert_string_equal(w.out.data, "/dev/pts/0 30 100\r\nabc\r\ngot abc\r\n50 132\r\n");
    watch_free(&w);
    start_bg(sbx[1], "{\"cmd\":\"sleep 1\",\"background\":true}", cid);
    ctl(sbx[1], cid, "resize", "{\"rows\":10,\"cols\":10}", 409, "not_a_pty");

    /* The list shows them, newest first among the ended. */
    char path[256];
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", sbx[1]);
    sp_test_http(port, "GET", path, key, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    sp_json_doc_t *doc = body_json(&r);
    const sp_json_t *list = sp_json_get(sp_json_root(doc), "commands");
    assert_true(sp_json_len(list) >= 4);
    bool found = false;
    for (size_t i = 0; i < sp_json_len(list); i++) {
        const sp_json_t *c = sp_json_at(list, i);
        if (strcmp(sp_json_str(sp_json_get(c, "cmd_id"), NULL), cid) == 0) {
            found = true;
            assert_string_equal(sp_json_str(sp_json_get(c, "cmd"), NULL), "sleep 1");
        }
    }
    assert_true(found);
    sp_json_doc_free(doc);
    sp_test_http_free(&r);

    /* A stream of an unknown command, a bad Last-Event-ID. */
    memset(&w, 0, sizeof(w));
    sp_buf_init(&w.out);
    watch(sbx[1], "cmd_nosuchcommand", 0, &w);
    assert_int_equal(w.status, 404);
    watch_free(&w);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands/%s/stream", sbx[1], cid);
    sp_test_http(port, "GET", path, key, "Last-Event-ID: x1\r\n", NULL, 0, &r);
    assert_int_equal(r.status, 400);
    sp_test_http_free(&r);
}

static int setup(void **state)
{
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    create(sbx[0]);
    create(sbx[1]);
    create(sbx[2]);
    start_long_background();
    return 0;
}

static void test_basics(void **state)
{
    result_t r = run(sbx[0], "{\"cmd\":\"echo hi\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.stdout_s, "hi\n");
    assert_int_equal(r.exit_code, 0);
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"echo oops >&2; exit 3\"}");
    assert_int_equal(r.exit_code, 3);
    assert_string_equal(r.stderr_s, "oops\n");
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"kill -9 $$\"}");
    assert_int_equal(r.signal, 9);
    result_free(&r);

    /* The value reaches the process (shown only in part: printed output is recorded for
     * audit, and the whole value must be in no event). */
    r = run(sbx[0], "{\"argv\":[\"/bin/sh\",\"-c\",\"echo ${GREETING%-value} in $(pwd)\"],"
                    "\"env\":{\"GREETING\":\"hello-secret-value\"},\"cwd\":\"/tmp\"}");
    assert_string_equal(r.stdout_s, "hello-secret in /tmp\n");
    result_free(&r);

    /* TLS clients find the deployment CA (egressd's leaves) unless the caller says otherwise. */
    r = run(sbx[0], "{\"cmd\":\"echo $SSL_CERT_FILE $NODE_EXTRA_CA_CERTS\"}");
    assert_string_equal(
        r.stdout_s, "/etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/space-deployment-ca.pem\n");
    result_free(&r);
    r = run(sbx[0], "{\"cmd\":\"echo $SSL_CERT_FILE\",\"env\":{\"SSL_CERT_FILE\":\"/mine.pem\"}}");
    assert_string_equal(r.stdout_s, "/mine.pem\n");
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"cat\",\"stdin\":\"round trip\\n\"}");
    assert_string_equal(r.stdout_s, "round trip\n");
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"id -u\",\"user\":\"user\"}");
    assert_string_equal(r.stdout_s, "1000\n");
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"sleep 30\",\"timeout_s\":1}");
    assert_true(r.timed_out);
    result_free(&r);

    /* A file written by one command is there for the next one, not in the other sandbox. */
    r = run(sbx[0], "{\"cmd\":\"echo kept > /kept && cat /kept\"}");
    assert_string_equal(r.stdout_s, "kept\n");
    result_free(&r);
    r = run(sbx[1], "{\"cmd\":\"cat /kept 2>/dev/null || echo absent\"}");
    assert_string_equal(r.stdout_s, "absent\n");
    result_free(&r);

    /* The env value is in no event; the command and its digests are. */
    PGconn *db = sp_test_db();
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE position("
                                           "'hello-secret-value'::bytea in payload) > 0"),
                     0);
    assert_true(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE type = "
                                      "'CommandExited' AND status = 'accepted'") >= 8);
    PQfinish(db);
}

static long long intents(PGconn *db, const char *id)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = 'CommandRequested'",
             id);
    return sp_test_db_scalar(db, sql);
}

/* Waits until the log holds the command of sandbox id that came after `before` others
 * (intents() before it ran) and its CommandExited: the log may lag the command's answer.
 * Into last, SQL for the stream_seq of its CommandRequested. */
static void command_logged(PGconn *db, const char *id, long long before, char last[256])
{
    char sql[768];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = 'CommandRequested'",
             id);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, before + 1, 10000), before + 1);
    snprintf(last, 256,
             "(SELECT max(stream_seq) FROM events WHERE aggregate_id = '%s' AND "
             "type = 'CommandRequested')",
             id);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = 'CommandExited' "
             "AND stream_seq > %s",
             id, last);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 1, 10000), 1);
}

/* Transactions that stored that command's CommandRequested and its CommandExited (their
 * distinct xmin: 1 or 2). */
static long long command_transactions(PGconn *db, const char *id, long long before)
{
    char last[256], sql[768];
    command_logged(db, id, before, last);
    snprintf(sql, sizeof(sql),
             "SELECT count(DISTINCT xmin::text) FROM events WHERE aggregate_id = '%s' AND "
             "stream_seq >= %s AND type IN ('CommandRequested', 'CommandExited')",
             id, last);
    return sp_test_db_scalar(db, sql);
}

/* That command's facts as the worker signed them: how many are heads of a headed batch and
 * how many its members (docs/trust.md, "Headed batches": command facts are read by the event
 * log alone); every one of them accepted. A batch's head may be another sandbox's fact (the
 * worker's queue batches across its sandboxes), so a member here need not have its head here. */
static void command_signing(PGconn *db, const char *id, long long before, int *ret_heads,
                            int *ret_members)
{
    char last[256], sql[768];
    command_logged(db, id, before, last);
    snprintf(sql, sizeof(sql),
             "SELECT payload, status FROM events WHERE aggregate_id = '%s' AND stream_seq > %s "
             "AND type LIKE 'Command%%' AND type <> 'CommandRequested'",
             id, last);
    PGresult *r = PQexecParams(db, sql, 0, NULL, NULL, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    *ret_heads = *ret_members = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        char reason[SP_REASON_MAX];
        sp_envelope_t *e = NULL;
        assert_string_equal(PQgetvalue(r, i, 1), "accepted");
        assert_int_equal(sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 0),
                                            (size_t)PQgetlength(r, i, 0), &e, reason),
                         0);
        *ret_heads += e->sig_leaves.len > 0;
        *ret_members += e->sig_head.len > 0;
        sp_envelope_free(e);
    }
    PQclear(r);
}

/* The event log's linger (eventlog/main.c; the stack sets linger-ms to 500 ms so that a busy
 * sanitizer run cannot make a short command longer than it): a short command's intent and
 * its facts are stored in one transaction; a command longer than the linger has its intent
 * stored without waiting for its end. */
static void test_short_command_one_transaction(void **state)
{
    (void)state;
    PGconn *db = sp_test_db();
    long long before = intents(db, sbx[0]);
    result_t r = run(sbx[0], "{\"cmd\":\"echo one-transaction\"}");
    assert_int_equal(r.status, 200);
    result_free(&r);
    assert_int_equal(command_transactions(db, sbx[0], before), 1);

    before = intents(db, sbx[0]);
    r = run(sbx[0], "{\"cmd\":\"sleep 1.5; echo late\"}");
    assert_string_equal(r.stdout_s, "late\n");
    result_free(&r);
    assert_int_equal(command_transactions(db, sbx[0], before), 2);
    /* Its CommandStarted went out alone (signed alone), its output and its end together: a
     * headed batch, whose members are accepted only against their head, accepted before them
     * (the head may be this command's output or another sandbox's fact in the same batch). */
    int heads = 0, members = 0;
    command_signing(db, sbx[0], before, &heads, &members);
    print_message("late command: %d heads, %d members\n", heads, members);
    assert_true(members >= 1);
    PQfinish(db);
}

/* Waits until the log holds n commands of sandbox id, each with its CommandExited (in a burst
 * a command's end may be stored after the next one's intent: its answer does not wait). */
static void all_logged(PGconn *db, const char *id, long long n)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = 'CommandRequested'",
             id);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, n, 10000), n);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = 'CommandExited'",
             id);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, n, 10000), n);
}

/* Activity in steps of a second (docs/architecture.md, "Activity in steps of a second"): a
 * burst of commands moves the sandbox's row about once a second, not per command; what the row
 * says is never after the newest command and at most a second before it; a command a step
 * later moves it; and the live row is what a rebuild from the log makes of it. */
static void test_activity_in_steps(void **state)
{
    (void)state;
    PGconn *db = sp_test_db();
    char sql[512];
    const char *id = sbx[0];
    snprintf(sql, sizeof(sql), "SELECT version FROM sandboxes WHERE id = '%s'", id);
    /* A step after the commands of the tests before: the burst's first command moves it. */
    usleep(1100 * 1000);
    long long v0 = sp_test_db_scalar(db, sql);
    long long before = intents(db, id);
    int64_t t0 = sp_mono_ns();
    const int n = 12;
    for (int i = 0; i < n; i++) {
        result_t r = run(id, "{\"cmd\":\"true\"}");
        assert_int_equal(r.status, 200);
        result_free(&r);
    }
    double secs = (double)(sp_mono_ns() - t0) / 1e9;
    all_logged(db, id, before + n);
    long long moved = sp_test_db_scalar(db, sql) - v0;
    print_message("%d commands in %.2f s moved the row %lld times\n", n, secs, moved);
    /* 24 events; a step moves it once (two steps where a burst crosses one more second). */
    assert_true(moved >= 1 && moved <= (long long)secs + 2);
    /* Never after the newest activity, at most a step before it. */
    snprintf(sql, sizeof(sql),
             "SELECT (extract(epoch FROM (SELECT max(occurred_at) FROM events WHERE aggregate_id "
             "= '%s' AND type IN ('CommandRequested', 'CommandExited')) - s.last_activity_at) * "
             "1000)::int8 FROM sandboxes s WHERE s.id = '%s'",
             id, id);
    long long behind_ms = sp_test_db_scalar(db, sql);
    assert_true(behind_ms >= 0 && behind_ms < 1000);
    /* A command a step later moves it. */
    snprintf(sql, sizeof(sql),
             "SELECT (extract(epoch FROM last_activity_at) * 1000)::int8 FROM sandboxes WHERE "
             "id = '%s'",
             id);
    long long at = sp_test_db_scalar(db, sql);
    usleep(1100 * 1000);
    before = intents(db, id);
    result_t r = run(id, "{\"cmd\":\"true\"}");
    assert_int_equal(r.status, 200);
    result_free(&r);
    all_logged(db, id, before + 1);
    assert_true(sp_test_db_scalar(db, sql) >= at + 1000);
    PQfinish(db);
    /* The live projection is the log's. */
    char out[4096] = "";
    int st = sp_test_replay("rebuild", out, sizeof(out));
    print_message("%s", out);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, " 0 differences"));
}

/* That command's events (command_logged): their types after its CommandRequested,
 * comma-separated, into types; its CommandExited decoded (sp_envelope_free). */
static sp_envelope_t *newest_command_events(PGconn *db, const char *id, long long before,
                                            char *types, size_t cap)
{
    char last[256], sql[768];
    command_logged(db, id, before, last);
    snprintf(sql, sizeof(sql),
             "SELECT type, payload, status, coalesce(reject_reason, '') FROM events WHERE "
             "aggregate_id = '%s' AND stream_seq > %s ORDER BY stream_seq",
             id, last);
    PGresult *r = PQexecParams(db, sql, 0, NULL, NULL, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    sp_envelope_t *exited = NULL;
    size_t at = 0;
    types[0] = '\0';
    for (int i = 0; i < PQntuples(r); i++) {
        bool ok = strcmp(PQgetvalue(r, i, 2), "accepted") == 0;
        at +=
            (size_t)snprintf(types + at, cap - at, "%s%s%s%s%s", i ? "," : "", PQgetvalue(r, i, 0),
                             ok ? "" : " (", ok ? "" : PQgetvalue(r, i, 3), ok ? "" : ")");
        assert_true(at < cap);
        if (strcmp(PQgetvalue(r, i, 0), "CommandExited") == 0) {
            char reason[SP_REASON_MAX];
            assert_int_equal(sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 1),
                                                (size_t)PQgetlength(r, i, 1), &exited, reason),
                             0);
        }
    }
    PQclear(r);
    assert_non_null(exited);
    return exited;
}

/* Runs body in sandbox id (its stdout: want) until the log records it as one CommandExited
 * (a guest slower than the worker's hold now and then makes a short command several facts:
 * three tries); that event, decoded. */
static sp_envelope_t *run_one_fact(PGconn *db, const char *id, const char *body, const char *want)
{
    char types[512];
    for (int i = 0; i < 3; i++) {
        long long before = intents(db, id);
        result_t r = run(id, body);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.stdout_s, want);
        result_free(&r);
        sp_envelope_t *ex = newest_command_events(db, id, before, types, sizeof(types));
        if (strcmp(types, "CommandExited") == 0)
            return ex;
        print_message("short command recorded as %s\n", types);
        sp_envelope_free(ex);
    }
    fail_msg("no short command recorded as one fact in three tries");
    return NULL;
}

/* A short command is one fact: what its CommandStarted and CommandOutput would hold is inside
 * its CommandExited (docs/architecture.md, "A short command in one fact"). A command that runs
 * on past the worker's hold (100 ms) has them as events of their own, in order, the output
 * written before the hold among them. */
static void test_short_command_one_fact(void **state)
{
    (void)state;
    PGconn *db = sp_test_db();
    char types[512];
    sp_envelope_t *ex =
        run_one_fact(db, sbx[0], "{\"cmd\":\"echo one-fact; echo err-fact >&2\"}", "one-fact\n");
    const Space__V1__CommandExited *e = ex->command_exited;
    assert_non_null(e->started);
    assert_string_equal(e->started->cmd_id, e->cmd_id);
    assert_true(e->started->pid > 0);
    assert_int_equal(e->n_output, 2);
    assert_int_equal(e->output[0]->stream, 1);
    assert_int_equal(e->output[1]->stream, 2);
    /* In the clear or sealed, as the deployment records output (this stack: clear). */
    assert_int_equal(e->output[0]->data.len, 9);
    assert_memory_equal(e->output[0]->data.data, "one-fact\n", 9);
    assert_int_equal(e->output[1]->data.len, 9);
    assert_memory_equal(e->output[1]->data.data, "err-fact\n", 9);
    assert_int_equal(e->stdout_bytes, 9);
    sp_envelope_free(ex);

    /* Past the audit cap (4 KiB for this stack): what is recorded, then the cap's marker. */
    sp_buf_t want;
    sp_buf_init(&want);
    for (int i = 0; i < 2500; i++)
        sp_buf_puts(&want, "a\n");
    ex = run_one_fact(db, sbx[0], "{\"cmd\":\"yes a | head -c 5000\"}", want.data);
    sp_buf_dispose(&want);
    e = ex->command_exited;
    assert_true(e->n_output >= 2);
    size_t recorded = 0;
    for (size_t i = 0; i + 1 < e->n_output; i++) {
        assert_false(e->output[i]->truncated);
        assert_int_equal(e->output[i]->offset, recorded);
        recorded += e->output[i]->data.len;
    }
    assert_int_equal(recorded, 4096);
    assert_true(e->output[e->n_output - 1]->truncated);
    assert_int_equal(e->output[e->n_output - 1]->offset, 4096);
    assert_int_equal(e->stdout_bytes, 5000);
    sp_envelope_free(ex);

    long long before = intents(db, sbx[0]);
    result_t r = run(sbx[0], "{\"cmd\":\"echo early; sleep 0.4; echo late\"}");
    assert_string_equal(r.stdout_s, "early\nlate\n");
    result_free(&r);
    ex = newest_command_events(db, sbx[0], before, types, sizeof(types));
    assert_string_equal(types, "CommandStarted,CommandOutput,CommandOutput,CommandExited");
    assert_null(ex->command_exited->started);
    assert_int_equal(ex->command_exited->n_output, 0);
    sp_envelope_free(ex);
    PQfinish(db);
}

/* The worker answers a JSON command at its end when that comes within the gateway's
 * command-reply-wait-ms (1000 ms for this stack, SPACE_IT_ENV_commands; 25 by default), with all
 * its output and nothing on the live subjects; past the wait, or past what one answer carries
 * (256 KiB), the gateway follows the command like an attach. A client sees the same either
 * way: all of the output, in order, and the exit. */
typedef struct {
    const char *id;
    const char *body;
    result_t r;
} bg_run_t;

static void *bg_run_main(void *arg)
{
    bg_run_t *j = arg;
    j->r = run(j->id, j->body);
    return NULL;
}

/* The id of the command of sandbox id whose command line is cmdline, once it is listed. */
static void find_running(const char *id, const char *cmdline, char cid[64])
{
    for (int i = 0; i < 500; i++) {
        sp_json_doc_t *doc = list_commands(id);
        const sp_json_t *list = sp_json_get(sp_json_root(doc), "commands");
        bool found = false;
        for (size_t k = 0; k < sp_json_len(list) && !found; k++) {
            const sp_json_t *c = sp_json_at(list, k);
            const char *line = sp_json_str(sp_json_get(c, "cmd"), NULL);
            if (line && strstr(line, cmdline)) {
                snprintf(cid, 64, "%s", sp_json_str(sp_json_get(c, "cmd_id"), NULL));
                found = true;
            }
        }
        sp_json_doc_free(doc);
        if (found)
            return;
        usleep(5 * 1000);
    }
    fail_msg("no command \"%s\" listed in 2.5 s", cmdline);
}

static void test_reply_wait(void **state)
{
    (void)state;
    /* Within the wait: both streams and the exit, from the worker's one answer. */
    result_t r = run(sbx[0], "{\"cmd\":\"echo out; echo err >&2; exit 4\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.stdout_s, "out\n");
    assert_string_equal(r.stderr_s, "err\n");
    assert_int_equal(r.exit_code, 4);
    result_free(&r);

    /* More than one answer carries, written as fast as the guest can: every byte, also those
     * written between the worker's answer and the gateway's attach (600,000 of them once failed
     * here: 73,728 were lost without a word). */
    static const size_t sizes[] = {600000, 4000000};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        char body[96];
        snprintf(body, sizeof(body), "{\"cmd\":\"yes abcdefghi | head -c %zu\"}", sizes[s]);
        r = run(sbx[0], body);
        assert_int_equal(r.status, 200);
        assert_false(r.output_lost);
        assert_false(r.truncated);
        assert_int_equal(strlen(r.stdout_s), sizes[s]);
        for (size_t i = 0; i < sizes[s]; i += 10)
            if (memcmp(r.stdout_s + i, "abcdefghi\n", 10) != 0)
                fail_msg("byte %zu of %zu differs", i, sizes[s]);
        result_free(&r);
    }

    /* The same while the gateway is slow to follow: stopped from before the command writes
     * until long after it would have written everything (the worker holds the output back). */
    int gw = sp_test_daemon_pid("space-gateway");
    assert_true(gw > 0);
    bg_run_t slow = {.id = sbx[0],
                     .body = "{\"cmd\":\"sleep 0.3; yes abcdefghi | head -c 4000000\"}"};
    pthread_t st;
    pthread_create(&st, NULL, bg_run_main, &slow);
    usleep(150 * 1000);
    kill(gw, SIGSTOP);
    usleep(1500 * 1000);
    kill(gw, SIGCONT);
    pthread_join(st, NULL);
    assert_int_equal(slow.r.status, 200);
    assert_false(slow.r.output_lost);
    assert_int_equal(strlen(slow.r.stdout_s), 4000000);
    for (size_t i = 0; i < 4000000; i += 10)
        if (memcmp(slow.r.stdout_s + i, "abcdefghi\n", 10) != 0)
            fail_msg("byte %zu differs (slow follower)", i);
    result_free(&slow.r);

    /* Held back for 5 s at most (a gateway gone for good must not stall the sandbox): a
     * follower slower than that gets the output that is still kept, and is told the rest is
     * lost. */
    slow.r = (result_t){0};
    pthread_create(&st, NULL, bg_run_main, &slow);
    usleep(150 * 1000);
    kill(gw, SIGSTOP);
    usleep(6500 * 1000);
    kill(gw, SIGCONT);
    pthread_join(st, NULL);
    assert_int_equal(slow.r.status, 200);
    assert_true(slow.r.output_lost);
    assert_true(strlen(slow.r.stdout_s) < 4000000);
    assert_int_equal(slow.r.exit_code, 0);
    result_free(&slow.r);

    /* Past the wait: what came before it and after, in order. */
    sp_buf_t want;
    sp_buf_init(&want);
    for (int i = 1; i <= 4000; i++)
        sp_buf_printf(&want, "%d\n", i);
    r = run(sbx[0], "{\"cmd\":\"seq 1 2000; sleep 1.3; seq 2001 4000\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.stdout_s, want.data);
    result_free(&r);
    sp_buf_dispose(&want);

    /* Someone attaches while the worker still holds the answer: from then on the output goes
     * out live, and both see all of it. */
    bg_run_t j = {.id = sbx[0],
                  .body = "{\"cmd\":\"echo first; sleep 0.6; echo second-wait-attach\"}"};
    pthread_t t;
    pthread_create(&t, NULL, bg_run_main, &j);
    char cid[64];
    find_running(sbx[0], "second-wait-attach", cid);
    watch_t w = {0};
    sp_buf_init(&w.out);
    watch(sbx[0], cid, 0, &w);
    pthread_join(t, NULL);
    assert_int_equal(w.status, 200);
    assert_false(w.bad);
    assert_true(w.exited);
    assert_string_equal(w.out.data ? w.out.data : "", "first\nsecond-wait-attach\n");
    assert_int_equal(j.r.status, 200);
    assert_string_equal(j.r.stdout_s, "first\nsecond-wait-attach\n");
    result_free(&j.r);
    watch_free(&w);
}

/* A suspend while the worker holds a waiting answer: the worker lets go of the command (it
 * runs on inside) and answers "running"; the gateway cannot attach to it then and follows it
 * live, as it followed every command before reply waits: the client's answer comes once the
 * sandbox is back and the command ends. */
static void test_reply_wait_suspend(void **state)
{
    (void)state;
    char id[64], out[64];
    create(id);
    bg_run_t j = {.id = id, .body = "{\"cmd\":\"sleep 2; echo after-the-suspend\"}"};
    pthread_t t;
    pthread_create(&t, NULL, bg_run_main, &j);
    char cid[64];
    find_running(id, "after-the-suspend", cid);
    assert_int_equal(sp_test_lifecycle(port, key, id, "suspend", "", out, sizeof(out)), 200);
    assert_int_equal(sp_test_lifecycle(port, key, id, "resume", "", out, sizeof(out)), 200);
    pthread_join(t, NULL);
    assert_int_equal(j.r.status, 200);
    assert_int_equal(j.r.exit_code, 0);
    assert_string_equal(j.r.stdout_s, "after-the-suspend\n");
    result_free(&j.r);
}

typedef struct {
    int i;
    result_t r;
} job_t;

static void *run_job(void *arg)
{
    job_t *j = arg;
    char body[128];
    snprintf(body, sizeof(body), "{\"cmd\":\"echo job-%d\"}", j->i);
    j->r = run(sbx[1], body);
    return NULL;
}

static void test_fifty_concurrent(void **state)
{
    job_t jobs[50];
    pthread_t t[50];
    for (int i = 0; i < 50; i++) {
        jobs[i].i = i;
        pthread_create(&t[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < 50; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 50; i++) {
        char want[32];
        snprintf(want, sizeof(want), "job-%d\n", i);
        assert_int_equal(jobs[i].r.status, 200);
        assert_string_equal(jobs[i].r.stdout_s, want);
        result_free(&jobs[i].r);
    }
}

static long long events_of(PGconn *db, const char *id, const char *type, int want)
{
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = '%s' AND "
             "status = 'accepted'",
             id, type);
    return sp_test_db_wait_scalar(db, sql, want, 10000);
}

/* Runs a command until it answers 200 (the agent may be connecting back), up to 5 s. */
static result_t run_when_back(const char *id, const char *body)
{
    result_t r = {0};
    for (int i = 0; i < 100; i++) {
        r = run(id, body);
        if (r.status != 503)
            break;
        result_free(&r);
        usleep(50 * 1000);
    }
    return r;
}

/* A hostile guest: floods stdout, writes garbage to the agent channel, kills the agent. The
 * worker and gateway keep serving, the broken channel is recorded and comes back, a sandbox
 * whose init was killed is failed with the reason, the other sandbox is unaffected. */
static void test_hostile_guest(void **state)
{
    PGconn *db = sp_test_db();
    result_t r = run(sbx[0], "{\"cmd\":\"yes | head -c 50000000 | wc -c\"}");
    assert_string_equal(r.stdout_s, "50000000\n");
    result_free(&r);
    r = run(sbx[0], "{\"cmd\":\"yes flood | head -c 40000000\"}");
    assert_int_equal(r.status, 200);
    assert_true(r.truncated);
    result_free(&r);

    /* Garbage on the channel: the worker drops it (AgentChannelLost, protocol_violation); the
     * agent connects back on its socket (AgentChannelRestored); the command that wrote it kept
     * running and its end is still reported, with the outage noted. */
    r = run(sbx[0], "{\"cmd\":\"head -c 4096 /dev/urandom > /proc/1/fd/1; sleep 1; echo late\"}");
    assert_int_equal(r.status, 200);
    print_message("garbage on the channel: exit %d, stdout %s, error: %s\n", (int)r.exit_code,
                  r.stdout_s, r.error);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(r.stdout_s, "late\n");
    assert_string_equal(r.error, "output was lost while the agent channel was down");
    result_free(&r);
    assert_int_equal(events_of(db, sbx[0], "AgentChannelLost", 1), 1);
    assert_int_equal(events_of(db, sbx[0], "AgentChannelRestored", 1), 1);
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = "
             "'AgentChannelLost' AND position('protocol violation' in encode(payload, 'escape')) "
             "> 0",
             sbx[0]);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    r = run_when_back(sbx[0], "{\"cmd\":\"echo again\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.stdout_s, "again\n");
    result_free(&r);

    /* Killing the agent (PID 1) from inside ends the sandbox: failed, reason "exited". */
    char victim[64], path[128];
    create(victim);
    r = run(victim, "{\"cmd\":\"kill -9 1; sleep 5\"}");
    assert_int_equal(r.status, 200);
    assert_true(strlen(r.error) > 0);
    result_free(&r);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = 'failed' AND "
             "failure_reason = 'exited'",
             victim);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 1, 15000), 1);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", victim);
    r = run(victim, "{\"cmd\":\"echo x\"}");
    assert_int_equal(r.status, 409);
    result_free(&r);

    r = run(sbx[1], "{\"cmd\":\"echo still fine\"}");
    assert_string_equal(r.stdout_s, "still fine\n");
    result_free(&r);
    PQfinish(db);
}

/* The worker is killed and started again: it adopts the sandbox, the agent connects back, a
 * command started before the restart is followed to its end, and new commands run. */
static void test_worker_restart(void **state)
{
    char cid[64];
    start_bg(sbx[1], "{\"cmd\":\"sleep 2; echo survived\",\"background\":true}", cid);
    sp_test_daemon_kill9("space-worker");
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    result_t r = run_when_back(sbx[1], "{\"cmd\":\"echo after restart\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.stdout_s, "after restart\n");
    result_free(&r);
    watch_t w;
    memset(&w, 0, sizeof(w));
    sp_buf_init(&w.out);
    watch(sbx[1], cid, 0, &w);
    assert_int_equal(w.status, 200);
    assert_true(w.exited);
    assert_int_equal(w.exit_code, 0);
    assert_string_equal(w.out.data ? w.out.data : "", "survived\n");
    watch_free(&w);
    PGconn *db = sp_test_db();
    assert_int_equal(events_of(db, sbx[1], "AgentChannelRestored", 1), 1);
    PQfinish(db);
}

/* The `space` CLI on the same API: exec's exit status is the command's (128 + signal). */
static void test_cli(void **state)
{
    char args[256];
    snprintf(args, sizeof(args), "exec %s -- sh -c 'echo out; exit 7' >/dev/null", sbx[1]);
    assert_int_equal(sp_test_space(args), 7);
    snprintf(args, sizeof(args), "exec %s -- sh -c 'kill -9 $$' >/dev/null 2>&1", sbx[1]);
    assert_int_equal(sp_test_space(args), 137);
    snprintf(args, sizeof(args), "exec %s -- test -f /bin/busybox", sbx[1]);
    assert_int_equal(sp_test_space(args), 0);
    snprintf(args, sizeof(args), "ls | grep -q %s", sbx[1]);
    assert_int_equal(sp_test_space(args), 0);
    /* The event log of that sandbox, as lines: its start and the commands just run. */
    snprintf(args, sizeof(args), "events %s | grep -q 'SandboxStarted *%s'", sbx[1], sbx[1]);
    assert_int_equal(sp_test_space(args), 0);
    snprintf(args, sizeof(args), "events %s | grep -c CommandExited | grep -qv '^0$'", sbx[1]);
    assert_int_equal(sp_test_space(args), 0);
    /* A sandbox made and removed by the CLI. */
    assert_int_equal(sp_test_space("create tiny > cli-created.id"), 0);
    assert_int_equal(sp_test_space("rm $(cat cli-created.id)"), 0);
    assert_int_not_equal(sp_test_space("rm $(cat cli-created.id) 2>/dev/null"), 0);
    unlink("cli-created.id");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_basics),
        cmocka_unit_test(test_short_command_one_transaction),
        cmocka_unit_test(test_short_command_one_fact),
        cmocka_unit_test(test_activity_in_steps),
        cmocka_unit_test(test_reply_wait),
        cmocka_unit_test(test_fifty_concurrent),
        cmocka_unit_test(test_stdin_signal_pty),
        cmocka_unit_test(test_hostile_guest),
        cmocka_unit_test(test_background_reattached),
        cmocka_unit_test(test_reply_wait_suspend),
        cmocka_unit_test(test_worker_restart),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
