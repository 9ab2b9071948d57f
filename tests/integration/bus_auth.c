/* Identities and NATS permissions live (docs/trust.md), against the stack's real nats-server
 * that `space up` configured: anonymous connections refused, each identity refused outside
 * its permissions, the stream neither purgeable nor deletable but by the operator (purge not
 * even by it), data-plane traffic unreadable without rights, and every daemon's events in the
 * log signed by its identity.
 *
 * A refused publish is dropped by the server (it answers -ERR to the connection), so a
 * JetStream publish of it gets no ack and times out, and nothing reaches the stream; a refused
 * subscription receives nothing. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "busid.h"
#include "envelope.h"
#include "error.h"
#include "eventgen.h"
#include "harness.h"
#include "publish.h"
#include "xmalloc.h"

#define REFUSED_MS 1500 /* how long a refused request or publish waits for its answer */

static char creds[512], stack_worker[80], url[256];
static PGconn *db;

/* A connection as identity (no signer registered: what is published here is raw bytes). */
static sp_bus_t *bus_as(const char *identity, sp_busid_t *id)
{
    sp_bus_opts_t o = {.url = url, .name = identity, .timeout_ms = REFUSED_MS};
    char err[SP_BUSID_ERR_MAX];
    sp_bus_t *bus = NULL;

    if (sp_busid_setup(creds, identity, NULL, id, &o, err) < 0)
        fail_msg("identity %s: %s", identity, err);
    sp_publish_signer_set(NULL, NULL);
    int rc = sp_bus_connect(&o, &bus);
    if (rc < 0)
        fail_msg("%s cannot connect: %s", identity, sp_strerror(rc));
    return bus;
}

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    snprintf(creds, sizeof(creds), "%s", sp_test_env("SPACE_CREDS_DIR"));
    snprintf(url, sizeof(url), "%s", sp_test_env("SPACE_NATS_URL"));
    snprintf(stack_worker, sizeof(stack_worker), "worker-%s", sp_test_env("SPACE_ID"));
    db = sp_test_db();
    /* Two workers of other hosts, made as an operator adds hosts (nats.conf reloaded). */
    assert_int_equal(sp_test_space("identity add worker wa >/dev/null"), 0);
    assert_int_equal(sp_test_space("identity add worker wb >/dev/null"), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    PQfinish(db);
    return 0;
}

static void test_anonymous_refused(void **state)
{
    (void)state;
    sp_bus_opts_t o = {.url = url, .name = "anonymous", .timeout_ms = 2000};
    sp_bus_t *bus = NULL;
    int rc = sp_bus_connect(&o, &bus);
    assert_true(rc < 0);
    assert_null(bus);

    /* A known name with another identity's key is no better: the seed must match. */
    char wrong[600];
    snprintf(wrong, sizeof(wrong), "%s/worker-wa.nk", creds);
    char pub[SP_NKEY_PUB_LEN + 1];
    assert_int_equal(sp_natsauth_nkey_public(creds, "worker-wb", pub), 0);
    sp_bus_opts_t o2 = {.url = url, .nkey = pub, .nkey_seed_file = wrong, .timeout_ms = 2000};
    assert_true(sp_bus_connect(&o2, &bus) < 0);
}

static int js_call(sp_bus_t *bus, const char *subject, const char *body);

/* Whether the stream holds a message on subject (the daemons publish all the time, so the
 * stream's last sequence says nothing). */
static bool stored(sp_bus_t *op, const char *subject)
{
    char body[320];
    snprintf(body, sizeof(body), "{\"last_by_subj\":\"%s\"}", subject);
    int rc = js_call(op, "$JS.API.STREAM.MSG.GET.SPACE_EVENTS", body);
    assert_true(rc >= 0);
    return rc == 0;
}

/* An envelope of type t for sandbox sbx, encoded (unsigned: the test is about NATS). */
static void fact(sp_event_type_t t, const char *sbx, char subject[256], const char *worker,
                 uint8_t **ret, size_t *ret_len)
{
    sp_eventgen_msg_t m;
    assert_int_equal(sp_eventgen_sandbox(t, "default", sbx, worker, &m), 0);
    snprintf(subject, 256, "%s", m.subject);
    *ret = m.data;
    *ret_len = m.len;
    m.data = NULL;
    sp_eventgen_msg_dispose(&m);
}

static void test_worker_own_subjects_only(void **state)
{
    (void)state;
    sp_busid_t ida, idop;
    sp_bus_t *wa = bus_as("worker-wa", &ida), *op = bus_as("operator", &idop);
    char subject[256];
    uint8_t *data;
    size_t len;
    uint64_t seq = 0;

    /* Its own fact: stored. */
    fact(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "sbx_busauthown", subject, "wa", &data,
         &len);
    assert_int_equal(sp_bus_publish(wa, subject, data, len, NULL, &seq, NULL), 0);
    assert_true(seq > 0);
    assert_true(stored(op, subject));
    free(data);

    /* The same fact on worker-wb's subject: refused, nothing stored; the refusal is heard,
     * naming the subject (and logged), not only seen as a publish that timed out. */
    fact(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "sbx_busauthother", subject, "wb", &data,
         &len);
    uint64_t refusals = sp_bus_refusals(NULL, 0);
    assert_true(sp_bus_publish(wa, subject, data, len, NULL, NULL, NULL) < 0);
    assert_false(stored(op, subject));
    char last[256] = "";
    for (int i = 0; i < 20 && sp_bus_refusals(last, sizeof(last)) == refusals; i++)
        usleep(100 * 1000);
    print_message("refusal heard: %s\n", last);
    assert_true(sp_bus_refusals(NULL, 0) > refusals);
    assert_non_null(strstr(last, subject));
    free(data);
    /* An intent is no worker's either. */
    fact(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "sbx_busauthint", subject, NULL,
         &data, &len);
    assert_true(sp_bus_publish(wa, subject, data, len, NULL, NULL, NULL) < 0);
    assert_false(stored(op, subject));
    free(data);

    /* Nor its durable: worker-wb's cannot be bound, and one wider than its own subjects
     * cannot be created. */
    sp_bus_consumer_t *c = NULL;
    assert_true(sp_bus_consumer_bind(wa, "worker-wb", "space.ev.sbx.wb.>", 5000, &c) < 0);
    assert_true(sp_bus_consumer_bind(wa, "worker-wa", "space.ev.>", 5000, &c) < 0);
    assert_null(c);

    sp_bus_free(wa);
    sp_bus_free(op);
    sp_busid_dispose(&ida);
    sp_busid_dispose(&idop);
}

static void test_gateway_publishes_intents_only(void **state)
{
    (void)state;
    sp_busid_t idg, idop;
    sp_bus_t *gw = bus_as("gateway", &idg), *op = bus_as("operator", &idop);
    char subject[256];
    uint8_t *data;
    size_t len;
    uint64_t seq = 0;

    /* Facts (a worker's, the scheduler's): refused. */
    fact(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "sbx_busauthgw", subject, stack_worker + 7,
         &data, &len);
    assert_true(sp_bus_publish(gw, subject, data, len, NULL, NULL, NULL) < 0);
    assert_false(stored(op, subject));
    free(data);
    fact(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED, "sbx_busauthgw", subject, stack_worker + 7,
         &data, &len);
    assert_true(sp_bus_publish(gw, subject, data, len, NULL, NULL, NULL) < 0);
    assert_false(stored(op, subject));
    free(data);
    /* An intent: stored (the scheduler then answers it like any other). */
    fact(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED, "sbx_busauthgw", subject, NULL,
         &data, &len);
    assert_int_equal(sp_bus_publish(gw, subject, data, len, NULL, &seq, NULL), 0);
    assert_true(seq > 0);
    assert_true(stored(op, subject));
    free(data);

    sp_bus_free(gw);
    sp_bus_free(op);
    sp_busid_dispose(&idg);
    sp_busid_dispose(&idop);
}

/* Whether the JetStream API answered subject at all, and if so whether with an error. */
static int js_call(sp_bus_t *bus, const char *subject, const char *body)
{
    uint8_t *rep = NULL;
    size_t len = 0;
    int rc = sp_bus_request(bus, subject, body, strlen(body), REFUSED_MS, &rep, &len);
    if (rc < 0)
        return rc; /* refused by NATS permissions: no answer */
    bool err = memmem(rep, len, "\"error\"", 7) != NULL;
    free(rep);
    return err ? 1 : 0;
}

/* What no daemon identity may do to the stream, each asked by its own thread: a refused call
 * is one that waits its whole REFUSED_MS unanswered, so 28 of them one after another took 42 s. */
static const char *const stream_ops[][2] = {
    {"$JS.API.STREAM.PURGE.SPACE_EVENTS", "{}"},
    {"$JS.API.STREAM.DELETE.SPACE_EVENTS", ""},
    {"$JS.API.STREAM.MSG.DELETE.SPACE_EVENTS", "{\"seq\":1}"},
    {"$JS.API.STREAM.UPDATE.SPACE_EVENTS", "{}"}};
#define N_STREAM_OPS (sizeof(stream_ops) / sizeof(stream_ops[0]))

typedef struct {
    sp_bus_t *bus;
    size_t op;
    int rc;
    pthread_t t;
} stream_try_t;

static void *stream_try_main(void *arg)
{
    stream_try_t *a = arg;
    a->rc = js_call(a->bus, stream_ops[a->op][0], stream_ops[a->op][1]);
    return NULL;
}

static void test_stream_not_purged_or_deleted(void **state)
{
    (void)state;
    char egressd[80];
    snprintf(egressd, sizeof(egressd), "egressd-%s", sp_test_env("SPACE_ID"));
    const char *who[] = {"gateway", "scheduler", "eventlog", stack_worker,
                         egressd,   "reader",    "worker-wa"};
#define N_WHO (sizeof(who) / sizeof(who[0]))
    sp_busid_t idop, ids[N_WHO];
    sp_bus_t *op = bus_as("operator", &idop), *buses[N_WHO];
    stream_try_t tries[N_WHO][N_STREAM_OPS];
    uint64_t before = 0, msgs0 = 0;
    assert_int_equal(sp_bus_stream_info(op, &before, &msgs0), 0);
    assert_true(before > 0);

    for (size_t i = 0; i < N_WHO; i++) {
        buses[i] = bus_as(who[i], &ids[i]); /* one at a time: it sets the process's signer */
        for (size_t k = 0; k < N_STREAM_OPS; k++) {
            tries[i][k] = (stream_try_t){.bus = buses[i], .op = k, .rc = 1};
            assert_int_equal(pthread_create(&tries[i][k].t, NULL, stream_try_main, &tries[i][k]),
                             0);
        }
    }
    for (size_t i = 0; i < N_WHO; i++) {
        for (size_t k = 0; k < N_STREAM_OPS; k++)
            pthread_join(tries[i][k].t, NULL);
        print_message("%s: purge, delete, message delete, update refused\n", who[i]);
        for (size_t k = 0; k < N_STREAM_OPS; k++)
            if (tries[i][k].rc >= 0)
                fail_msg("%s: %s was answered (%d), not refused", who[i], stream_ops[k][0],
                         tries[i][k].rc);
        sp_bus_free(buses[i]);
        sp_busid_dispose(&ids[i]);
    }
#undef N_WHO
    /* The operator reaches the API, and the stream itself refuses (deny_purge, deny_delete). */
    assert_int_equal(js_call(op, "$JS.API.STREAM.PURGE.SPACE_EVENTS", "{}"), 1);
    assert_int_equal(js_call(op, "$JS.API.STREAM.MSG.DELETE.SPACE_EVENTS", "{\"seq\":1}"), 1);
    uint64_t last = 0, msgs = 0;
    assert_int_equal(sp_bus_stream_info(op, &last, &msgs), 0);
    assert_true(last >= before);
    assert_true(msgs >= before);
    sp_bus_free(op);
    sp_busid_dispose(&idop);
}

typedef struct {
    atomic_int n;
} counter_t;

static void on_msg(void *arg, const char *subject, const char *reply, const uint8_t *data,
                   size_t len)
{
    (void)subject, (void)reply, (void)data, (void)len;
    atomic_fetch_add(&((counter_t *)arg)->n, 1);
}

static void test_data_plane_unreadable(void **state)
{
    (void)state;
    sp_busid_t idwb, idr, idg, idwa;
    sp_bus_t *wb = bus_as("worker-wb", &idwb), *rd = bus_as("reader", &idr);
    sp_bus_t *gw = bus_as("gateway", &idg), *wa = bus_as("worker-wa", &idwa);
    counter_t cwb = {0}, crd = {0}, cgw = {0};
    sp_bus_sub_t *s1 = NULL, *s2 = NULL, *s3 = NULL;

    /* Subscriptions to another sandbox's command output: refused for a worker and a reader
     * (dropped by the server: nothing arrives), allowed for the gateway (the control). */
    assert_int_equal(sp_bus_subscribe(wb, "space.io.>", NULL, on_msg, &cwb, &s1), 0);
    assert_int_equal(sp_bus_subscribe(rd, "space.io.cmd.*.out", NULL, on_msg, &crd, &s2), 0);
    assert_int_equal(sp_bus_subscribe(gw, "space.io.cmd.*.out", NULL, on_msg, &cgw, &s3), 0);
    sp_bus_flush(wb, 2000);
    sp_bus_flush(rd, 2000);
    sp_bus_flush(gw, 2000);
    /* worker-wa's command output (its data plane), seen by nobody but gateways. */
    for (int i = 0; i < 5; i++)
        assert_int_equal(sp_bus_publish_core(wa, "space.io.cmd.cmd_busauth.out", "secret", 6), 0);
    sp_bus_flush(wa, 2000);
    for (int i = 0; i < 100 && atomic_load(&cgw.n) < 5; i++)
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
    assert_int_equal(atomic_load(&cgw.n), 5);
    assert_int_equal(atomic_load(&cwb.n), 0);
    assert_int_equal(atomic_load(&crd.n), 0);
    /* And another identity's inbox (replies to its requests) is not readable either. */
    counter_t cin = {0};
    sp_bus_sub_t *s4 = NULL;
    assert_int_equal(sp_bus_subscribe(wb, "_INBOX.gateway.>", NULL, on_msg, &cin, &s4), 0);
    sp_bus_flush(wb, 2000);
    sp_busid_t idop;
    sp_bus_t *op = bus_as("operator", &idop);
    assert_int_equal(sp_bus_publish_core(op, "_INBOX.gateway.x", "r", 1), 0);
    sp_bus_flush(op, 2000);
    sp_bus_free(op);
    sp_busid_dispose(&idop);
    nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
    assert_int_equal(atomic_load(&cin.n), 0);

    sp_bus_unsubscribe(s1);
    sp_bus_unsubscribe(s2);
    sp_bus_unsubscribe(s3);
    sp_bus_unsubscribe(s4);
    sp_bus_free(wb);
    sp_bus_free(rd);
    sp_bus_free(gw);
    sp_bus_free(wa);
    sp_busid_dispose(&idwb);
    sp_busid_dispose(&idr);
    sp_busid_dispose(&idg);
    sp_busid_dispose(&idwa);
}

/* The signer of the newest stored event of type (of sandbox, when given) into out; 0 if none. */
static int signer_of(const char *type, const char *sandbox, char *out, size_t outlen)
{
    const char *p[2] = {type, sandbox ? sandbox : ""};
    PGresult *r = PQexecParams(db,
                               "SELECT payload FROM events WHERE type = $1 AND "
                               "($2 = '' OR aggregate_id = $2) ORDER BY stream_seq DESC LIMIT 1",
                               2, NULL, p, NULL, NULL, 1);
    int found = 0;
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("query: %s", PQerrorMessage(db));
    if (PQntuples(r) == 1) {
        sp_envelope_t *env = NULL;
        char reason[SP_REASON_MAX];
        assert_int_equal(sp_envelope_decode((const uint8_t *)PQgetvalue(r, 0, 0),
                                            (size_t)PQgetlength(r, 0, 0), &env, reason),
                         0);
        snprintf(out, outlen, "%s", env->signer ? env->signer : "");
        /* Signed: the signature field is there (verifying it is the event log's, next). */
        assert_int_equal(env->signature.len, SP_SIG_LEN);
        sp_envelope_free(env);
        found = 1;
    }
    PQclear(r);
    return found;
}

static void test_daemons_sign_as_themselves(void **state)
{
    (void)state;
    int port = sp_test_api_port();
    const char *key = sp_test_env("SPACE_API_KEY");
    char id[64], signer[SP_IDENTITY_MAX + 1];

    sp_test_create_sandbox(port, key, "tiny", id);
    /* The gateway's intent, the scheduler's placement, the worker's facts and heartbeats. */
    const struct {
        const char *type, *sandbox, *want;
    } cases[] = {
        {"SandboxCreateRequested", id, "gateway"},
        {"SandboxPlaced", id, "scheduler"},
        {"SandboxStarted", id, stack_worker},
        {"WorkerHeartbeat", NULL, stack_worker},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int found = 0;
        for (int t = 0; t < 200 && !found; t++) {
            found = signer_of(cases[i].type, cases[i].sandbox, signer, sizeof(signer));
            if (!found)
                nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
        }
        if (!found)
            fail_msg("no %s in the log", cases[i].type);
        print_message("%s signed by %s\n", cases[i].type, signer);
        assert_string_equal(signer, cases[i].want);
    }
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    sp_test_http_resp_t r;
    sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
    sp_test_http_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_anonymous_refused),
        cmocka_unit_test(test_worker_own_subjects_only),
        cmocka_unit_test(test_gateway_publishes_intents_only),
        cmocka_unit_test(test_stream_not_purged_or_deleted),
        cmocka_unit_test(test_data_plane_unreadable),
        cmocka_unit_test(test_daemons_sign_as_themselves),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
