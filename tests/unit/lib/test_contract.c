/* The contract's tables and the trust check: who may say what, on which subject, for whom. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"
#include "envelope.h"
#include "error.h"
#include "sign.h"
#include "trust.h"
#include "xmalloc.h"

/* ---- identities ---- */

static void test_identity_parse(void **state)
{
    sp_identity_t id;

    assert_int_equal(sp_identity_parse("gateway", &id), 0);
    assert_int_equal(id.kind, SP_KIND_GATEWAY);
    assert_string_equal(id.instance, "");
    assert_int_equal(sp_identity_parse("gateway-2", &id), 0);
    assert_string_equal(id.instance, "2");
    assert_int_equal(sp_identity_parse("worker-w-1", &id), 0);
    assert_int_equal(id.kind, SP_KIND_WORKER);
    assert_string_equal(id.instance, "w-1");
    assert_int_equal(sp_identity_parse("platform-acme", &id), 0);
    assert_int_equal(id.kind, SP_KIND_PLATFORM);
    /* Instances are required where the contract binds them. */
    assert_int_equal(sp_identity_parse("worker", &id), -EINVAL);
    assert_int_equal(sp_identity_parse("egressd", &id), -EINVAL);
    assert_int_equal(sp_identity_parse("platform", &id), -EINVAL);
    assert_int_equal(sp_identity_parse("workers-w1", &id), -EINVAL);
    assert_int_equal(sp_identity_parse("worker-", &id), -EINVAL);
    assert_int_equal(sp_identity_parse("worker-W1", &id), -EINVAL);
    assert_int_equal(sp_identity_parse("worker-w1.x", &id), -EINVAL);
    assert_int_equal(sp_identity_parse("", &id), -EINVAL);
    assert_int_equal(sp_identity_format(SP_KIND_EGRESSD, "w1", &id), 0);
    assert_string_equal(id.name, "egressd-w1");
    for (unsigned k = 0; k < SP_KIND__COUNT; k++)
        assert_non_null(sp_kind_name((sp_kind_t)k));
    assert_null(sp_kind_name(SP_KIND__COUNT));
}

/* ---- subjects ---- */

static void test_subject_build(void **state)
{
    char b[256];

    assert_int_equal(sp_subject_build(b, sizeof(b), SP_SUBJ_IO_EXEC, "w1", NULL, NULL), 20);
    assert_string_equal(b, "space.io.wkr.w1.exec");
    assert_true(sp_subject_build(b, sizeof(b), SP_SUBJ_IO_CMD, "c1", "out", NULL) > 0);
    assert_string_equal(b, "space.io.cmd.c1.out");
    /* Fewer args: a filter. */
    assert_true(sp_subject_build(b, sizeof(b), SP_SUBJ_EV_SBX, "w1", NULL, NULL) > 0);
    assert_string_equal(b, "space.ev.sbx.w1.>");
    assert_true(sp_subject_build(b, sizeof(b), SP_SUBJ_EV_SBX, "_", NULL, NULL) > 0);
    assert_string_equal(b, "space.ev.sbx._.>");
    assert_true(sp_subject_build(b, sizeof(b), SP_SUBJ_IO_CMD, "c1", NULL, NULL) > 0);
    assert_string_equal(b, "space.io.cmd.c1.>");
    assert_true(sp_subject_build(b, sizeof(b), SP_SUBJ_EV_SBX, "w1", "sbx_1", "SandboxStarted") >
                0);
    assert_string_equal(b, "space.ev.sbx.w1.sbx_1.SandboxStarted");
    /* A token cannot smuggle subject syntax in. */
    assert_int_equal(sp_subject_build(b, sizeof(b), SP_SUBJ_IO_EXEC, "w1.exec", NULL, NULL),
                     -EINVAL);
    assert_int_equal(sp_subject_build(b, sizeof(b), SP_SUBJ_IO_EXEC, "*", NULL, NULL), -EINVAL);
    assert_int_equal(sp_subject_build(b, sizeof(b), SP_SUBJ_IO_EXEC, ">", NULL, NULL), -EINVAL);
    assert_int_equal(sp_subject_build(b, sizeof(b), SP_SUBJ_IO_EXEC, "a b", NULL, NULL), -EINVAL);
    assert_int_equal(sp_subject_build(b, 10, SP_SUBJ_IO_EXEC, "w1", NULL, NULL), -ENOBUFS);
    assert_int_equal(sp_subject_build(b, sizeof(b), SP_SUBJ__COUNT, "w1", NULL, NULL), -EINVAL);
}

/* The strings the daemons used to format by hand, each from the contract. */
static void test_subject_builders_match_old_literals(void **state)
{
    char b[256], want[256];
    const char *w = "it-worker_1";

    snprintf(want, sizeof(want), "space.io.wkr.%s.exec", w);
    sp_subject_build(b, sizeof(b), SP_SUBJ_IO_EXEC, w, NULL, NULL);
    assert_string_equal(b, want);
    snprintf(want, sizeof(want), "space.io.wkr.%s.ctl", w);
    sp_subject_build(b, sizeof(b), SP_SUBJ_IO_CTL, w, NULL, NULL);
    assert_string_equal(b, want);
    snprintf(want, sizeof(want), "space.io.wkr.%s.file", w);
    sp_subject_build(b, sizeof(b), SP_SUBJ_IO_FILE, w, NULL, NULL);
    assert_string_equal(b, want);
    snprintf(want, sizeof(want), "space.io.wkr.%s.watch", w);
    sp_subject_build(b, sizeof(b), SP_SUBJ_IO_WATCH, w, NULL, NULL);
    assert_string_equal(b, want);
    snprintf(want, sizeof(want), "space.io.wkr.%s.metrics", w);
    sp_subject_build(b, sizeof(b), SP_SUBJ_IO_METRICS, w, NULL, NULL);
    assert_string_equal(b, want);
    snprintf(want, sizeof(want), "space.io.egress.%s.reset", w);
    sp_subject_build(b, sizeof(b), SP_SUBJ_IO_EGRESS_RST, w, NULL, NULL);
    assert_string_equal(b, want);
    snprintf(want, sizeof(want), "space.io.cmd.%s.%s", "cmd_1", "exit");
    sp_subject_build(b, sizeof(b), SP_SUBJ_IO_CMD, "cmd_1", "exit", NULL);
    assert_string_equal(b, want);
    snprintf(want, sizeof(want), "space.io.watch.%s.%s", "wat_1", "ev");
    sp_subject_build(b, sizeof(b), SP_SUBJ_IO_WATCH_EV, "wat_1", "ev", NULL);
    assert_string_equal(b, want);
    snprintf(want, sizeof(want), "space.ev.sbx.%s.>", w);
    sp_subject_build(b, sizeof(b), SP_SUBJ_EV_SBX, w, NULL, NULL);
    assert_string_equal(b, want);
    sp_subject_build(b, sizeof(b), SP_SUBJ_EV_SBX, "_", NULL, NULL);
    assert_string_equal(b, "space.ev.sbx._.>");
}

static void test_subject_match(void **state)
{
    char w[SP_INSTANCE_MAX + 1];

    assert_true(sp_subject_match(SP_SUBJ_EV_SBX, "space.ev.sbx.w1.sbx_1.SandboxStarted", w));
    assert_string_equal(w, "w1");
    assert_true(sp_subject_match(SP_SUBJ_EV_SBX, "space.ev.sbx._.sbx_1.SandboxCreateRequested", w));
    assert_string_equal(w, "_");
    assert_false(sp_subject_match(SP_SUBJ_EV_SBX, "space.ev.sbx.w1.sbx_1", w));
    assert_false(sp_subject_match(SP_SUBJ_EV_SBX, "space.ev.sbx.w1.sbx_1.A.B", w));
    assert_false(sp_subject_match(SP_SUBJ_EV_SBX, "space.ev.sbx.*.sbx_1.A", w));
    assert_false(sp_subject_match(SP_SUBJ_EV_SBX, "space.ev.io.w1.sbx_1.A", w));
    assert_true(sp_subject_match(SP_SUBJ_EV_EGRESS, "space.ev.egress.sbx_1.EgressDenied", w));
    assert_string_equal(w, "");
    assert_true(sp_subject_match(SP_SUBJ_IO_EXEC, "space.io.wkr.w2.exec", w));
    assert_string_equal(w, "w2");
}

/* The type an event subject names, read before decoding (the event log's linger): only on
 * that type's own stream subject. */
static void test_subject_event_type(void **state)
{
    (void)state;
    assert_int_equal(sp_subject_event_type("space.ev.io.w1.sbx_1.CommandRequested"),
                     SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED);
    assert_int_equal(sp_subject_event_type("space.ev.io._.sbx_1.CommandExited"),
                     SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED);
    assert_int_equal(sp_subject_event_type("space.ev.sbx.w1.sbx_1.SandboxStarted"),
                     SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED);
    assert_int_equal(sp_subject_event_type("space.ev.wkr.w1.WorkerHeartbeat"),
                     SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT);
    /* A command's type on the sandbox subject, an unknown type, not an event subject. */
    assert_int_equal(sp_subject_event_type("space.ev.sbx.w1.sbx_1.CommandRequested"),
                     SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET);
    assert_int_equal(sp_subject_event_type("space.ev.io.w1.sbx_1.NoSuchType"),
                     SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET);
    assert_int_equal(sp_subject_event_type("space.io.wkr.w2.CommandExited"),
                     SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET);
    assert_int_equal(sp_subject_event_type("CommandExited"), SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET);
    assert_int_equal(sp_subject_event_type(NULL), SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET);
}

/* Every event type of space.proto has emitters and a subject, and the subject the envelope
 * module formats is one the contract's pattern matches. */
static void test_every_event_type_has_owners(void **state)
{
    const ProtobufCMessageDescriptor *d = &space__v1__envelope__descriptor;
    unsigned n = 0;

    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        sp_event_type_t t = (sp_event_type_t)f->id;
        const char *name = sp_event_type_name(t);
        if (!sp_event_emitters(t))
            fail_msg("%s has no emitters in lib/contract.c", name);
        /* Nobody but the operator's tools manage; the operator emits nothing, nor do the
         * readers or the event log. */
        assert_int_equal(sp_event_emitters(t) &
                             (SP_KIND_BIT(SP_KIND_OPERATOR) | SP_KIND_BIT(SP_KIND_READER) |
                              SP_KIND_BIT(SP_KIND_EVENTLOG)),
                         0);
        /* Intents (100-199) come from gateways; platforms create, delete, pause, resume,
         * suspend and set timeouts (all to the scheduler, which checks them and forwards what a
         * worker does; commands, policies and snapshots need the data plane or the gateway).
         * Neither emits anything else. */
        unsigned front = SP_KIND_BIT(SP_KIND_GATEWAY) | SP_KIND_BIT(SP_KIND_PLATFORM);
        bool platform_may = t == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED ||
                            t == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED ||
                            t == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED ||
                            t == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED ||
                            t == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED ||
                            t == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_TIMEOUT_REQUESTED;
        if (f->id >= 100 && f->id < 200)
            assert_int_equal(sp_event_emitters(t) & front,
                             platform_may ? front : SP_KIND_BIT(SP_KIND_GATEWAY));
        else
            assert_int_equal(sp_event_emitters(t) & front, 0);

        sp_subject_id_t sid = sp_event_subject_id(t);
        assert_true(sid < SP_SUBJ__COUNT);
        assert_true(sp_subject(sid)->stream);
        char subject[256];
        Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
        sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
        agg.kind = sp_event_is_worker(t) ? "worker"
                   : sp_event_is_cred(t) ? "credential"
                                         : "sandbox";
        agg.id = sp_event_is_worker(t) ? "w1" : sp_event_is_cred(t) ? "cred_1" : "sbx_1";
        env.aggregate = &agg;
        env.tenant = "t1";
        env.payload_case = t;
        env.type = (char *)name;
        assert_true(sp_envelope_subject(&env, "w1", subject, sizeof(subject)) > 0);
        if (!sp_subject_match(sid, subject, NULL))
            fail_msg("%s: %s does not match %s", name, subject, sp_subject(sid)->pattern);
        n++;
    }
    assert_true(n >= 36);
    assert_int_equal(sp_event_emitters(SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET), 0);
}

static void test_tables_consistent(void **state)
{
    size_t n;
    const sp_consumer_def_t *c = sp_contract_consumers(&n);

    for (unsigned i = 0; i < SP_SUBJ__COUNT; i++) {
        const sp_subject_t *s = sp_subject((sp_subject_id_t)i);
        assert_int_equal(s->id, i);
        assert_non_null(s->name);
        assert_non_null(s->what);
        if (i == SP_SUBJ_CKPT) /* its own stream; only the event log publishes there */
            assert_int_equal(s->pub_any | s->pub_own | s->sub_any | s->sub_own,
                             SP_KIND_BIT(SP_KIND_EVENTLOG));
        else
            assert_int_equal(strncmp(s->pattern, s->stream ? "space.ev." : "space.io.", 9), 0);
        /* "own" means the {worker} token: a pattern without one has no own rules. */
        if (!strstr(s->pattern, "{worker}"))
            assert_int_equal(s->pub_own | s->sub_own, 0);
        /* Stream subjects are read through durables, never subscribed to. */
        if (s->stream)
            assert_int_equal(s->sub_any | s->sub_own, 0);
        /* Only gateways send data-plane requests to workers. */
        if (strncmp(s->pattern, "space.io.wkr.", 13) == 0) {
            assert_int_equal(s->pub_any | s->pub_own, SP_KIND_BIT(SP_KIND_GATEWAY));
            assert_int_equal(s->sub_own, SP_KIND_BIT(SP_KIND_WORKER));
            assert_int_equal(s->sub_any, 0);
        }
    }
    assert_true(n >= 4);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(strncmp(c[i].filter, "space.ev.", 9), 0);
    assert_string_equal(sp_trust_refusal_name(SP_ESIGNATURE), "bad_signature");
    assert_null(sp_trust_refusal_name(SP_ESCHEMA));
}

/* ---- the trust check ---- */

enum { GATEWAY, SCHEDULER, W1, W2, EGRESSD_W1, PLATFORM_ACME, N_KEYS };
static const char *const names[N_KEYS] = {"gateway",   "scheduler",  "worker-w1",
                                          "worker-w2", "egressd-w1", "platform-acme"};
static sp_sign_key_t *keys[N_KEYS];
static sp_keyring_t *ring;

static int setup(void **state)
{
    sp_keyring_new(&ring);
    for (int i = 0; i < N_KEYS; i++) {
        uint8_t seed[32] = {(uint8_t)(i + 1), 42}, pub[SP_PUBKEY_LEN];
        if (sp_sign_key_from_raw(seed, &keys[i]) < 0 || sp_sign_key_public(keys[i], pub) < 0 ||
            sp_keyring_add(ring, names[i], pub) < 0)
            return -1;
    }
    return sp_keyring_add_tenant(ring, "platform-acme", "acme");
}

static int teardown(void **state)
{
    for (int i = 0; i < N_KEYS; i++)
        sp_sign_key_free(keys[i]);
    sp_keyring_free(ring);
    return 0;
}

/* The test double of a consumer's projection: sbx_a runs on w1, sbx_b on w2. */
static int placement(void *arg, const char *tenant, const char *sandbox,
                     char worker[SP_INSTANCE_MAX + 1])
{
    int *calls = arg;
    (*calls)++;
    if (strcmp(sandbox, "sbx_a") == 0) {
        memcpy(worker, "w1", 3);
        return 1;
    }
    if (strcmp(sandbox, "sbx_b") == 0) {
        memcpy(worker, "w2", 3);
        return 1;
    }
    return 0;
}

#define SNP_ONE "snp_0000000000000000000000one1"

typedef struct {
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxCreateRequested create;
    Space__V1__SandboxStarted started;
    Space__V1__WorkerHeartbeat hb;
    Space__V1__EgressDenied denied;
    Space__V1__EgressDecision decision;
    Space__V1__SnapshotDeleted snap_deleted;
    Space__V1__SandboxPauseRequested pause;
    char id[37];
    uint8_t *raw;
    size_t len;
    char subject[256];
} msg_t;

static void msg_init(msg_t *m, sp_event_type_t t, const char *tenant, const char *aggregate)
{
    memset(m, 0, sizeof(*m));
    space__v1__envelope__init(&m->env);
    space__v1__aggregate__init(&m->agg);
    m->agg.kind = sp_event_is_worker(t) ? "worker" : "sandbox";
    m->agg.id = (char *)aggregate;
    m->env.aggregate = &m->agg;
    m->env.tenant = (char *)tenant;
    m->env.actor = "svc:test";
    m->env.payload_case = t;
    switch (t) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED:
        space__v1__sandbox_create_requested__init(&m->create);
        m->create.template_ = "base";
        m->env.sandbox_create_requested = &m->create;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED:
        space__v1__sandbox_started__init(&m->started);
        m->started.worker = "w1";
        m->env.sandbox_started = &m->started;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT:
        space__v1__worker_heartbeat__init(&m->hb);
        m->hb.worker = (char *)aggregate;
        m->hb.interval_ms = 1000;
        m->env.worker_heartbeat = &m->hb;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED:
        space__v1__egress_denied__init(&m->denied);
        space__v1__egress_decision__init(&m->decision);
        m->decision.protocol = "dns";
        m->decision.count = 1;
        m->denied.decision = &m->decision;
        m->env.egress_denied = &m->denied;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED:
        space__v1__sandbox_pause_requested__init(&m->pause);
        m->env.sandbox_pause_requested = &m->pause;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED:
        space__v1__snapshot_deleted__init(&m->snap_deleted);
        m->snap_deleted.snapshot_id = SNP_ONE;
        m->env.snapshot_deleted = &m->snap_deleted;
        break;
    default:
        fail();
    }
    sp_envelope_stamp(&m->env, m->id);
}

/* Signs as key k and publishes (in the test's imagination) for worker token w. */
static void msg_sign(msg_t *m, int k, const char *w)
{
    char why[SP_REASON_MAX] = "";
    m->env.signer = (char *)names[k];
    if (sp_envelope_validate(&m->env, why) < 0)
        fail_msg("%s", why);
    assert_int_equal(sp_envelope_encode_signed(&m->env, names[k], keys[k], &m->raw, &m->len), 0);
    assert_true(sp_envelope_subject(&m->env, w, m->subject, sizeof(m->subject)) > 0);
}

/* Decodes as a consumer would and runs the check. */
static int check(msg_t *m, const sp_trust_t *t, char reason[SP_REASON_MAX])
{
    sp_envelope_t *e = NULL;
    int rc = sp_envelope_decode(m->raw, m->len, &e, reason);
    if (rc == 0)
        rc = sp_trust_check(t, e, m->raw, m->len, m->subject, 0, reason);
    sp_envelope_free(e);
    free(m->raw);
    m->raw = NULL;
    return rc;
}

static void test_trust_good_ones_pass(void **state)
{
    int calls = 0;
    sp_trust_t t = {.keyring = ring, .placement = placement, .placement_arg = &calls};
    char reason[SP_REASON_MAX] = "";
    msg_t m;

    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "acme", "sbx_new");
    msg_sign(&m, GATEWAY, NULL);
    assert_int_equal(check(&m, &t, reason), 0);

    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "acme", "sbx_new");
    msg_sign(&m, PLATFORM_ACME, NULL);
    assert_int_equal(check(&m, &t, reason), 0);

    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "acme", "sbx_a");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), 0);
    assert_int_equal(calls, 1);

    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT, "", "w1");
    msg_sign(&m, W1, NULL);
    assert_int_equal(check(&m, &t, reason), 0);

    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED, "acme", "sbx_a");
    msg_sign(&m, EGRESSD_W1, NULL);
    assert_int_equal(check(&m, &t, reason), 0);
}

static void test_trust_unsigned(void **state)
{
    sp_trust_t t = {.keyring = ring};
    char reason[SP_REASON_MAX];
    sp_envelope_t *e = NULL;
    msg_t m;

    /* An event as written before signing existed. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "acme", "sbx_new");
    assert_int_equal(sp_envelope_encode(&m.env, &m.raw, &m.len), 0);
    sp_envelope_subject(&m.env, NULL, m.subject, sizeof(m.subject));
    assert_int_equal(sp_envelope_decode(m.raw, m.len, &e, reason), 0);
    assert_int_equal(sp_trust_check(&t, e, m.raw, m.len, m.subject, 0, reason), SP_EUNSIGNED);
    assert_int_equal(strncmp(reason, "unsigned: ", 10), 0);
    sp_envelope_free(e);
    free(m.raw);
}

static void test_trust_tampered_payload(void **state)
{
    sp_trust_t t = {.keyring = ring};
    char reason[SP_REASON_MAX];
    msg_t m;

    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "acme", "sbx_new");
    m.create.template_ = "base";
    msg_sign(&m, GATEWAY, NULL);
    /* "base" -> "base" with one byte changed: still a valid template id, so the schema lets
     * it through and only the signature notices. */
    uint8_t *p = memmem(m.raw, m.len, "base", 4);
    assert_non_null(p);
    p[3] = 'x';
    assert_int_equal(check(&m, &t, reason), SP_ESIGNATURE);
    assert_non_null(strstr(reason, "bad_signature"));
}

static void test_trust_wrong_identity(void **state)
{
    sp_trust_t t = {.keyring = ring};
    char reason[SP_REASON_MAX];
    msg_t m;

    /* Signed with worker-w1's key, claiming to be the gateway. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "acme", "sbx_new");
    m.env.signer = "gateway";
    assert_int_equal(sp_envelope_encode_signed(&m.env, "gateway", keys[W1], &m.raw, &m.len), 0);
    sp_envelope_subject(&m.env, NULL, m.subject, sizeof(m.subject));
    assert_int_equal(check(&m, &t, reason), SP_ESIGNATURE);

    /* An identity nobody knows. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "acme", "sbx_new");
    assert_int_equal(sp_envelope_encode_signed(&m.env, "gateway-9", keys[GATEWAY], &m.raw, &m.len),
                     0);
    sp_envelope_subject(&m.env, NULL, m.subject, sizeof(m.subject));
    assert_int_equal(check(&m, &t, reason), SP_ESIGNER);
}

static void test_trust_worker_on_other_workers_subject(void **state)
{
    int calls = 0;
    sp_trust_t t = {.keyring = ring, .placement = placement, .placement_arg = &calls};
    char reason[SP_REASON_MAX];
    msg_t m;

    /* worker-w1 signs a fact for w2's sandbox on w2's subject. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "acme", "sbx_b");
    m.started.worker = "w2";
    msg_sign(&m, W1, "w2");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
    assert_non_null(strstr(reason, "space.ev.sbx.w2."));

    /* On its own subject, but the sandbox is placed on w2. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "acme", "sbx_b");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
    assert_non_null(strstr(reason, "placed on w2"));

    /* A sandbox placed nowhere. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "acme", "sbx_zzz");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);

    /* Its own sandbox, but naming another worker in the payload. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "acme", "sbx_a");
    m.started.worker = "w2";
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);

    /* A heartbeat for another worker, on that worker's subject. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT, "", "w2");
    msg_sign(&m, W1, NULL);
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);

    /* Without a placement lookup, worker sandbox facts fail closed. */
    sp_trust_t bare = {.keyring = ring};
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "acme", "sbx_a");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &bare, reason), SP_ENOTOWN);

    /* egressd-w1 for a sandbox on w2. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED, "acme", "sbx_b");
    msg_sign(&m, EGRESSD_W1, NULL);
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
}

/* The test double of the log's snapshot lookup: w1 took SNP_ONE of sbx_b (now on w2) and of
 * sbx_gone (placed on no worker: suspended since). */
static int snapshot_taker(void *arg, const char *tenant, const char *sandbox,
                          const char *snapshot_id, char worker[SP_INSTANCE_MAX + 1])
{
    int *calls = arg;
    (*calls)++;
    if (strcmp(tenant, "acme") != 0 || strcmp(snapshot_id, SNP_ONE) != 0 ||
        (strcmp(sandbox, "sbx_b") != 0 && strcmp(sandbox, "sbx_gone") != 0))
        return 0;
    memcpy(worker, "w1", 3);
    return 1;
}

/* The test double of sp_db_worker_live: what w1's liveness is. */
static int w1_live;
static int worker_live(void *arg, const char *worker)
{
    (void)arg;
    return strcmp(worker, "w1") == 0 ? w1_live : 1;
}

/* A snapshot's artifacts stay with the worker that took it: its SnapshotDeleted is that
 * worker's to say after the sandbox moved (or went nowhere), and nobody else's. */
static void test_trust_snapshot_deleted_by_taker(void **state)
{
    int calls = 0, taken = 0;
    sp_trust_t t = {.keyring = ring,
                    .placement = placement,
                    .placement_arg = &calls,
                    .snapshot_taker = snapshot_taker,
                    .snapshot_arg = &taken};
    char reason[SP_REASON_MAX] = "";
    msg_t m;

    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_b");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), 0);
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_gone");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), 0);
    assert_int_equal(taken, 2);

    /* The worker the sandbox is on now did not take it. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_b");
    msg_sign(&m, W2, "w2");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
    assert_non_null(strstr(reason, "taken by w1"));
    /* A snapshot the log does not have, another tenant's sandbox. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_b");
    m.snap_deleted.snapshot_id = "snp_00000000000000000000other1";
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "globex", "sbx_b");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
    /* On another worker's subject. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_b");
    msg_sign(&m, W1, "w2");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
    assert_int_equal(calls, 0);

    /* Without the lookup, placement decides, as for the worker's other facts. */
    sp_trust_t placed_only = {.keyring = ring, .placement = placement, .placement_arg = &calls};
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_b");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &placed_only, reason), SP_ENOTOWN);
    assert_non_null(strstr(reason, "placed on w2"));

    /* The taker gone (not live in the log): another worker may say it, the taker too; while it
     * is live, or when its liveness cannot be read, only the taker. */
    t.worker_live = worker_live;
    w1_live = 0;
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_b");
    msg_sign(&m, W2, "w2");
    assert_int_equal(check(&m, &t, reason), 0);
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_gone");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), 0);
    w1_live = 1;
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_b");
    msg_sign(&m, W2, "w2");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
    assert_non_null(strstr(reason, "which is live"));
    w1_live = SP_EDB;
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_b");
    msg_sign(&m, W2, "w2");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
    /* A snapshot that does not exist stays refused whoever is live. */
    w1_live = 0;
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED, "acme", "sbx_b");
    m.snap_deleted.snapshot_id = "snp_00000000000000000000other1";
    msg_sign(&m, W2, "w2");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
}

static void test_trust_kind_may_not_emit(void **state)
{
    int calls = 0;
    sp_trust_t t = {.keyring = ring, .placement = placement, .placement_arg = &calls};
    char reason[SP_REASON_MAX];
    msg_t m;

    /* The gateway signs a fact. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "acme", "sbx_a");
    msg_sign(&m, GATEWAY, "w1");
    assert_int_equal(check(&m, &t, reason), SP_ENOTALLOWED);
    assert_non_null(strstr(reason, "gateway may not emit SandboxStarted"));

    /* A worker signs an intent. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "acme", "sbx_a");
    msg_sign(&m, W1, "w1");
    assert_int_equal(check(&m, &t, reason), SP_ENOTALLOWED);

    /* egressd signs a heartbeat for its worker. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT, "", "w1");
    msg_sign(&m, EGRESSD_W1, NULL);
    assert_int_equal(check(&m, &t, reason), SP_ENOTALLOWED);

    /* A platform signs a fact, for its own tenant. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "acme", "sbx_a");
    msg_sign(&m, PLATFORM_ACME, "w1");
    assert_int_equal(check(&m, &t, reason), SP_ENOTALLOWED);
    assert_int_equal(calls, 0); /* refused before any lookup */
}

static void test_trust_platform_tenant(void **state)
{
    sp_trust_t t = {.keyring = ring};
    char reason[SP_REASON_MAX];
    msg_t m;

    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "globex", "sbx_new");
    msg_sign(&m, PLATFORM_ACME, NULL);
    assert_int_equal(check(&m, &t, reason), SP_ETENANT);
    assert_non_null(strstr(reason, "globex"));
    /* Its own tenant, on the scheduler's subject: allowed; on a worker's subject: not its own
     * to use, whatever NATS let through. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED, "acme", "sbx_a");
    msg_sign(&m, PLATFORM_ACME, NULL);
    assert_int_equal(check(&m, &t, reason), 0);
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED, "acme", "sbx_a");
    msg_sign(&m, PLATFORM_ACME, "w1");
    assert_int_equal(check(&m, &t, reason), SP_ENOTOWN);
    assert_non_null(strstr(reason, "not the scheduler's"));
    /* The gateway serves every tenant. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "globex", "sbx_new");
    msg_sign(&m, GATEWAY, NULL);
    assert_int_equal(check(&m, &t, reason), 0);
}

static void test_trust_subject_must_agree(void **state)
{
    sp_trust_t t = {.keyring = ring};
    char reason[SP_REASON_MAX];
    msg_t m;

    /* A good signature moved to another sandbox's subject. */
    msg_init(&m, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "acme", "sbx_new");
    msg_sign(&m, GATEWAY, NULL);
    snprintf(m.subject, sizeof(m.subject), "space.ev.sbx._.sbx_victim.SandboxCreateRequested");
    assert_int_equal(check(&m, &t, reason), SP_ESCHEMA);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity_parse),
        cmocka_unit_test(test_subject_build),
        cmocka_unit_test(test_subject_builders_match_old_literals),
        cmocka_unit_test(test_subject_match),
        cmocka_unit_test(test_subject_event_type),
        cmocka_unit_test(test_every_event_type_has_owners),
        cmocka_unit_test(test_tables_consistent),
        cmocka_unit_test(test_trust_good_ones_pass),
        cmocka_unit_test(test_trust_unsigned),
        cmocka_unit_test(test_trust_tampered_payload),
        cmocka_unit_test(test_trust_wrong_identity),
        cmocka_unit_test(test_trust_worker_on_other_workers_subject),
        cmocka_unit_test(test_trust_snapshot_deleted_by_taker),
        cmocka_unit_test(test_trust_kind_may_not_emit),
        cmocka_unit_test(test_trust_platform_tenant),
        cmocka_unit_test(test_trust_subject_must_agree),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
