/* Forgeries with a valid NATS identity change nothing (issue 14, docs/trust.md). The stack
 * runs with credentials (space up made them), so every daemon verifies what it acts on. The
 * test connects as the operator, who may publish on any subject, and re-does the attacks of
 * the issue with a missing signature, a signature by the wrong identity's key, an identity
 * the keyring does not know, and a replay of a real signed event: each is stored rejected by
 * the event log, and the running sandbox, the projection and the worker table are unchanged.
 * On the data plane, an exec request that is not signed, signed by the wrong key, too old, or
 * a copy of one already run is refused by the worker with its reason, and the command runs
 * only for the one valid request. */
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
#include "dataplane.pb-c.h"
#include "eventgen.h"
#include "harness.h"
#include "ids.h"
#include "request.h"
#include "sign.h"
#include "xmalloc.h"

static sp_bus_t *bus; /* the operator's: may publish anything, signs nothing */
static PGconn *db;
static char *key, worker[80], sbx[64];
static int port;
static sp_sign_key_t *k_gateway, *k_worker;

static sp_sign_key_t *load_key(const char *identity)
{
    char *path = sp_xasprintf("%s/%s.key", sp_test_env("SPACE_CREDS_DIR"), identity);
    sp_sign_key_t *k = NULL;
    if (sp_sign_key_load(path, &k) < 0)
        fail_msg("cannot load %s", path);
    free(path);
    return k;
}

static uint64_t publish(const char *subject, const uint8_t *data, size_t len, const char *msg_id)
{
    uint64_t seq = 0;
    assert_int_equal(sp_bus_publish(bus, subject, data, len, msg_id, &seq, NULL), 0);
    assert_true(seq > 0);
    return seq;
}

/* One sandbox event, signed by identity with k (NULL: unsigned), published. */
static uint64_t forge(sp_event_type_t type, const char *id, const char *on_worker,
                      const char *identity, const sp_sign_key_t *k)
{
    sp_eventgen_msg_t m;
    sp_eventgen_msg_t *one[1] = {&m};
    assert_int_equal(sp_eventgen_sandbox(type, "t1", id, on_worker, &m), 0);
    if (k)
        assert_int_equal(sp_eventgen_sign(one, 1, identity, k), 0);
    uint64_t seq = publish(m.subject, m.data, m.len, m.event_id);
    sp_eventgen_msg_dispose(&m);
    return seq;
}

#define expect_rejected(seq, needle) sp_test_expect_row(db, (seq), "rejected", (needle), true)

static char *state_of(const char *id)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT state FROM sandboxes WHERE id = '%s'", id);
    PGresult *r = PQexec(db, sql);
    char *s = sp_xstrdup(
        PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return s;
}

/* The sandbox runs and answers commands: nothing the forgeries said took effect. */
static void assert_running(void)
{
    char *st = state_of(sbx);
    assert_string_equal(st, "running");
    free(st);
    sp_test_cmd_t r = sp_test_run(port, key, sbx, "{\"cmd\":\"echo alive\"}");
    assert_int_equal(r.status, 200);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(r.stdout_s, "alive\n");
    sp_test_cmd_free(&r);
}

static void settle(void)
{
    /* Long enough for the scheduler and the worker to have acted on a message they took. */
    nanosleep(&(struct timespec){.tv_sec = 2}, NULL);
}

static int setup(void **state)
{
    char key_id[SP_APIKEY_ID_LEN + 1];
    (void)state;
    sp_test_stack_load();
    bus = sp_test_bus();
    db = sp_test_db();
    port = sp_test_api_port();
    snprintf(worker, sizeof(worker), "%s", sp_test_env("SPACE_ID"));
    k_gateway = load_key("gateway");
    char wid[96];
    snprintf(wid, sizeof(wid), "worker-%s", worker);
    k_worker = load_key(wid);
    assert_int_equal(sp_apikey_create(db, "t1", "forgery test", &key, key_id), 0);
    sp_test_create_sandbox(port, key, "tiny", sbx);
    assert_running();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    sp_sign_key_free(k_gateway);
    sp_sign_key_free(k_worker);
    free(key);
    PQfinish(db);
    sp_bus_free(bus);
    return 0;
}

/* A create nobody signed, or signed "gateway" with the worker's key: never placed, never run. */
static void test_forged_create(void **state)
{
    (void)state;
    char a[SP_SANDBOX_ID_LEN + 1], b[SP_SANDBOX_ID_LEN + 1];
    sp_sandbox_id_new(a);
    sp_sandbox_id_new(b);
    uint64_t s1 = forge(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, a, NULL, NULL, NULL);
    uint64_t s2 =
        forge(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, b, NULL, "gateway", k_worker);
    expect_rejected(s1, "unsigned");
    expect_rejected(s2, "bad_signature");
    settle();
    assert_int_equal(sp_test_events(db, a, "SandboxPlaced", NULL), 0);
    assert_int_equal(sp_test_events(db, b, "SandboxPlaced", NULL), 0);
    char *sa = state_of(a), *sb = state_of(b);
    assert_string_equal(sa, "");
    assert_string_equal(sb, "");
    free(sa);
    free(sb);
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/worker", sp_test_env("SPACE_HOME"));
    assert_false(sp_test_sandbox_held(dir, a));
}

/* "The worker says it is deleted" and "it is paused", unsigned and by an identity nobody
 * knows; "delete it" and "pause it" to the worker, with the gateway's name and the worker's
 * key: the log refuses all, the worker acts on none. */
static void test_forged_lifecycle(void **state)
{
    (void)state;
    sp_sign_key_t *ghost = NULL;
    uint8_t raw[32] = {7};
    assert_int_equal(sp_sign_key_from_raw(raw, &ghost), 0);
    uint64_t s1 = forge(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED, sbx, worker, NULL, NULL);
    uint64_t s2 =
        forge(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED, sbx, worker, "worker-ghost", ghost);
    uint64_t s3 = forge(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED, sbx, worker,
                        "gateway", k_worker);
    uint64_t s4 =
        forge(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED, sbx, worker, NULL, NULL);
    sp_sign_key_free(ghost);
    expect_rejected(s1, "unsigned");
    expect_rejected(s2, "unknown_signer");
    expect_rejected(s3, "bad_signature");
    expect_rejected(s4, "unsigned");
    settle();
    assert_running();
    char out[64];
    /* Not wedged either: a real pause and resume work. */
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "pause", "", out, sizeof(out)), 200);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "resume", "", out, sizeof(out)), 200);
    assert_running();
}

/* A heartbeat of a worker that does not exist attracts no placement: refused, no row. */
static void test_forged_heartbeat(void **state)
{
    (void)state;
    const char *tmpl[] = {"tiny"};
    sp_eventgen_msg_t m;
    sp_eventgen_msg_t *one[1] = {&m};
    assert_int_equal(sp_eventgen_heartbeat("ghost", tmpl, 1, 0, 1000, &m), 0);
    uint64_t s1 = publish(m.subject, m.data, m.len, m.event_id);
    sp_eventgen_msg_dispose(&m);
    assert_int_equal(sp_eventgen_heartbeat("ghost", tmpl, 1, 0, 1000, &m), 0);
    /* The real worker's key under the ghost's name. */
    assert_int_equal(sp_eventgen_sign(one, 1, "worker-ghost", k_worker), 0);
    uint64_t s2 = publish(m.subject, m.data, m.len, m.event_id);
    sp_eventgen_msg_dispose(&m);
    expect_rejected(s1, "unsigned");
    expect_rejected(s2, "unknown_signer");
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM workers WHERE id = 'ghost'"), 0);
}

/* The gateway's real, validly signed pause of this sandbox, published again after the resume:
 * stored rejected as a replay, and the worker does not pause the sandbox a second time. */
static void test_replayed_intent(void **state)
{
    (void)state;
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT subject, payload FROM events WHERE aggregate_id = '%s' AND type ="
             " 'SandboxPauseRequested' AND status = 'accepted' ORDER BY stream_seq DESC LIMIT 1",
             sbx);
    PGresult *r = PQexecParams(db, sql, 0, NULL, NULL, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 1);
    char *subject = sp_xstrndup(PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
    uint64_t seq = publish(subject, (const uint8_t *)PQgetvalue(r, 0, 1),
                           (size_t)PQgetlength(r, 0, 1), "replay-of-pause");
    PQclear(r);
    free(subject);
    expect_rejected(seq, "replayed");
    settle();
    assert_running();
}

/* Exec requests straight onto the worker's subject. */
static Space__Io__V1__ExecReply *exec_raw(const uint8_t *data, size_t len)
{
    char subject[128];
    uint8_t *rep = NULL;
    size_t n = 0;
    snprintf(subject, sizeof(subject), "space.io.wkr.%s.exec", worker);
    assert_int_equal(sp_bus_request(bus, subject, data, len, 5000, &rep, &n), 0);
    Space__Io__V1__ExecReply *x = space__io__v1__exec_reply__unpack(NULL, n, rep);
    free(rep);
    assert_non_null(x);
    return x;
}

static void seal(const uint8_t *body, size_t len, const char *signer, const sp_sign_key_t *k,
                 int64_t at_us, uint8_t **ret, size_t *ret_len)
{
    char subject[128];
    snprintf(subject, sizeof(subject), "space.io.wkr.%s.exec", worker);
    assert_int_equal(sp_request_seal_as(subject, body, len, signer, k, at_us, ret, ret_len), 0);
}

static void expect_refused(const uint8_t *data, size_t len, const char *why)
{
    Space__Io__V1__ExecReply *x = exec_raw(data, len);
    assert_false(x->accepted);
    assert_string_equal(x->error, "unauthorized");
    if (strncmp(x->detail, why, strlen(why)) != 0)
        fail_msg("refused with '%s', expected '%s...'", x->detail, why);
    space__io__v1__exec_reply__free_unpacked(x, NULL);
}

static void test_forged_exec(void **state)
{
    (void)state;
    Space__Io__V1__ExecRequest q = SPACE__IO__V1__EXEC_REQUEST__INIT;
    char intent[SP_UUID_STR_LEN + 1];
    sp_uuid7_str(intent);
    q.sandbox = sbx;
    q.tenant = "t1";
    q.cmd_id = "forgery-1";
    q.intent_event_id = intent;
    q.correlation_id = "forgery";
    q.cmd = "echo ran >> /root/forged";
    size_t blen = space__io__v1__exec_request__get_packed_size(&q);
    uint8_t *body = sp_xmalloc(blen), *m = NULL;
    size_t n = 0;
    space__io__v1__exec_request__pack(&q, body);

    /* An ExecRequest as it was before: no wrapper at all. */
    Space__Io__V1__ExecReply *x = exec_raw(body, blen);
    assert_false(x->accepted);
    assert_string_equal(x->error, "unauthorized");
    space__io__v1__exec_reply__free_unpacked(x, NULL);
    /* Wrapped, but unsigned; the gateway's name with the worker's key; a worker may not ask
     * for exec even with its own key; the gateway's key, a minute old. */
    seal(body, blen, "gateway", NULL, sp_now_us(), &m, &n);
    expect_refused(m, n, "unsigned");
    free(m);
    seal(body, blen, "gateway", k_worker, sp_now_us(), &m, &n);
    expect_refused(m, n, "bad_signature");
    free(m);
    char wid[96];
    snprintf(wid, sizeof(wid), "worker-%s", worker);
    seal(body, blen, wid, k_worker, sp_now_us(), &m, &n);
    expect_refused(m, n, "type_not_allowed");
    free(m);
    seal(body, blen, "gateway", k_gateway, sp_now_us() - 60 * 1000000LL, &m, &n);
    expect_refused(m, n, "stale_or_replayed");
    free(m);
    /* The one valid request runs; the same bytes again are a replay. */
    seal(body, blen, "gateway", k_gateway, sp_now_us(), &m, &n);
    x = exec_raw(m, n);
    if (!x->accepted)
        fail_msg("the valid request was refused: %s %s", x->error, x->detail);
    space__io__v1__exec_reply__free_unpacked(x, NULL);
    expect_refused(m, n, "stale_or_replayed");
    free(m);
    free(body);
    settle();
    sp_test_cmd_t r = sp_test_run(port, key, sbx, "{\"cmd\":\"cat /root/forged\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.stdout_s, "ran\n");
    sp_test_cmd_free(&r);
}

/* A MetricsCall on the worker's metrics subject (raw bytes), decoded as its reply: a refusal
 * (RequestRefused) reads as one, not ok, error "unauthorized". */
static Space__Io__V1__MetricsReply *metrics_raw(const uint8_t *data, size_t len)
{
    char subject[128];
    uint8_t *rep = NULL;
    size_t n = 0;
    snprintf(subject, sizeof(subject), "space.io.wkr.%s.metrics", worker);
    assert_int_equal(sp_bus_request(bus, subject, data, len, 5000, &rep, &n), 0);
    Space__Io__V1__MetricsReply *x = space__io__v1__metrics_reply__unpack(NULL, n, rep);
    free(rep);
    assert_non_null(x);
    return x;
}

static Space__Io__V1__MetricsReply *metrics_as(const char *tenant, const char *signer,
                                               const sp_sign_key_t *k)
{
    Space__Io__V1__MetricsCall q = SPACE__IO__V1__METRICS_CALL__INIT;
    char subject[128];
    q.sandbox = sbx;
    q.tenant = (char *)tenant;
    q.correlation_id = "forgery";
    size_t blen = space__io__v1__metrics_call__get_packed_size(&q);
    uint8_t *body = sp_xmalloc(blen), *m = NULL;
    size_t n = 0;
    space__io__v1__metrics_call__pack(&q, body);
    snprintf(subject, sizeof(subject), "space.io.wkr.%s.metrics", worker);
    if (signer) {
        assert_int_equal(sp_request_seal_as(subject, body, blen, signer, k, sp_now_us(), &m, &n),
                         0);
    } else {
        m = body, n = blen, body = NULL;
    }
    Space__Io__V1__MetricsReply *x = metrics_raw(m, n);
    free(m);
    free(body);
    return x;
}

/* The usage samples are a sandbox's own: the worker answers only the gateway's signed call,
 * and only for the sandbox's tenant. */
static void test_forged_metrics(void **state)
{
    (void)state;
    char wid[96];
    snprintf(wid, sizeof(wid), "worker-%s", worker);
    Space__Io__V1__MetricsReply *x = metrics_as("t1", NULL, NULL);
    assert_false(x->ok);
    assert_string_equal(x->error, "unauthorized");
    space__io__v1__metrics_reply__free_unpacked(x, NULL);
    x = metrics_as("t1", wid, k_worker);
    assert_false(x->ok);
    assert_string_equal(x->error, "unauthorized");
    assert_non_null(strstr(x->detail, "type_not_allowed"));
    space__io__v1__metrics_reply__free_unpacked(x, NULL);
    x = metrics_as("t2", "gateway", k_gateway);
    assert_false(x->ok);
    assert_string_equal(x->error, "sandbox_not_running");
    assert_int_equal(x->n_samples, 0);
    space__io__v1__metrics_reply__free_unpacked(x, NULL);
    x = metrics_as("t1", "gateway", k_gateway);
    if (!x->ok)
        fail_msg("the valid call was refused: %s %s", x->error, x->detail);
    space__io__v1__metrics_reply__free_unpacked(x, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forged_create),    cmocka_unit_test(test_forged_lifecycle),
        cmocka_unit_test(test_forged_heartbeat), cmocka_unit_test(test_replayed_intent),
        cmocka_unit_test(test_forged_exec),      cmocka_unit_test(test_forged_metrics),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
