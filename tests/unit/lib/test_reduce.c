/* The sandbox state machine and worker reducer, as DESIGN.md states them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "reduce.h"

/* A minimal envelope of a given type for sandbox "sbx_a" of tenant "t1". Payload messages are
 * zero-initialised by their generated init so every string is "". */
typedef struct {
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    union {
        Space__V1__SandboxCreateRequested create;
        Space__V1__SandboxPlaced placed;
        Space__V1__SandboxStarted started;
        Space__V1__SandboxFailed failed;
        Space__V1__SandboxResumed resumed;
        Space__V1__SandboxResuming resuming;
        Space__V1__SandboxRequestRejected rejected;
        Space__V1__WorkerHeartbeat hb;
        Space__V1__WorkerStopped stopped;
        Space__V1__SandboxDeleted deleted;
        Space__V1__SandboxPaused paused;
        Space__V1__SandboxSuspending suspending;
        Space__V1__CommandRequested cmd;
        Space__V1__CommandExited exited;
        Space__V1__SandboxSuspended suspended;
        Space__V1__EgressAllowed egress;
    } p;
    Space__V1__EgressDecision decision;
    char id[37];
} ev_t;

static sp_envelope_t *ev(ev_t *e, sp_event_type_t t, const char *worker)
{
    memset(e, 0, sizeof(*e));
    space__v1__envelope__init(&e->env);
    space__v1__aggregate__init(&e->agg);
    e->agg.kind = "sandbox";
    e->agg.id = "sbx_a";
    e->env.aggregate = &e->agg;
    e->env.tenant = "t1";
    e->env.actor = "test";
    e->env.payload_case = t;
    switch (t) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED:
        space__v1__sandbox_create_requested__init(&e->p.create);
        e->p.create.template_ = "base";
        e->env.sandbox_create_requested = &e->p.create;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED:
        space__v1__sandbox_placed__init(&e->p.placed);
        e->p.placed.worker = (char *)worker;
        e->env.sandbox_placed = &e->p.placed;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED:
        space__v1__sandbox_started__init(&e->p.started);
        e->p.started.worker = (char *)worker;
        e->env.sandbox_started = &e->p.started;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED:
        space__v1__sandbox_paused__init(&e->p.paused);
        e->env.sandbox_paused = &e->p.paused;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED:
        space__v1__sandbox_resumed__init(&e->p.resumed);
        e->p.resumed.worker = (char *)worker;
        e->env.sandbox_resumed = &e->p.resumed;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDING:
        space__v1__sandbox_suspending__init(&e->p.suspending);
        e->env.sandbox_suspending = &e->p.suspending;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED:
        space__v1__sandbox_suspended__init(&e->p.suspended);
        e->env.sandbox_suspended = &e->p.suspended;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMING:
        space__v1__sandbox_resuming__init(&e->p.resuming);
        e->p.resuming.worker = (char *)worker;
        e->env.sandbox_resuming = &e->p.resuming;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED:
        space__v1__sandbox_deleted__init(&e->p.deleted);
        e->env.sandbox_deleted = &e->p.deleted;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED:
        space__v1__sandbox_failed__init(&e->p.failed);
        e->p.failed.reason = "image_missing";
        e->env.sandbox_failed = &e->p.failed;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED:
        space__v1__sandbox_request_rejected__init(&e->p.rejected);
        e->p.rejected.request_type = "SandboxCreateRequested";
        e->p.rejected.reason = "no_capacity";
        e->env.sandbox_request_rejected = &e->p.rejected;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED:
        space__v1__command_requested__init(&e->p.cmd);
        e->env.command_requested = &e->p.cmd;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED:
        space__v1__command_exited__init(&e->p.exited);
        e->env.command_exited = &e->p.exited;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_ALLOWED:
        space__v1__egress_allowed__init(&e->p.egress);
        space__v1__egress_decision__init(&e->decision);
        e->decision.protocol = "https";
        e->decision.name = "example.test";
        e->decision.count = 1;
        e->p.egress.decision = &e->decision;
        e->env.egress_allowed = &e->p.egress;
        break;
    default:
        fail_msg("unexpected type");
    }
    sp_envelope_stamp(&e->env, e->id);
    return &e->env;
}

#define APPLY(s, t, w) sp_reduce_sandbox((s), ev(&e, (t), (w)), ++seq, reason)

static void test_full_lifecycle(void **state)
{
    sp_sandbox_t s;
    ev_t e;
    char reason[SP_REASON_MAX];
    uint64_t seq = 0;

    sp_sandbox_init(&s, "sbx_a");
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, NULL), 0);
    assert_int_equal(s.state, SP_SBX_REQUESTED);
    assert_string_equal(s.tenant, "t1");
    assert_string_equal(s.template_, "base");
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED, "w1"), 0);
    assert_int_equal(s.state, SP_SBX_PLACED);
    assert_string_equal(s.worker, "w1");
    /* Only the worker it was placed on may start it. */
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "w2"), SP_ETRANSITION);
    assert_int_equal(s.state, SP_SBX_PLACED);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "w1"), 0);
    assert_int_equal(s.state, SP_SBX_RUNNING);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED, NULL), 0);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED, NULL), SP_ETRANSITION);
    assert_non_null(strstr(reason, "illegal transition"));
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDING, NULL), 0);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED, NULL), 0);
    assert_int_equal(s.state, SP_SBX_SUSPENDED);
    assert_string_equal(s.worker, "");
    /* Resumed on another host. */
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED, "w2"), 0);
    assert_int_equal(s.state, SP_SBX_SUSPENDED);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMING, "w2"), 0);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED, "w2"), 0);
    assert_int_equal(s.state, SP_SBX_RUNNING);
    assert_string_equal(s.worker, "w2");
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED, NULL), 0);
    assert_int_equal(s.state, SP_SBX_DELETED);
    /* Deleted is terminal. */
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "w2"), SP_ETRANSITION);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED, NULL), SP_ETRANSITION);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED, NULL), SP_ETRANSITION);
    assert_int_equal(s.version, 10);
    sp_sandbox_dispose(&s);
}

/* Requested, placed on w1, started there. */
static void make_running(sp_sandbox_t *s, uint64_t *seq)
{
    ev_t e;
    char reason[SP_REASON_MAX];
    sp_sandbox_init(s, "sbx_a");
    assert_int_equal(
        sp_reduce_sandbox(s, ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, NULL),
                          ++*seq, reason),
        0);
    assert_int_equal(sp_reduce_sandbox(s, ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED, "w1"),
                                       ++*seq, reason),
                     0);
    assert_int_equal(sp_reduce_sandbox(s,
                                       ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "w1"),
                                       ++*seq, reason),
                     0);
    assert_int_equal(s->state, SP_SBX_RUNNING);
}

/* A worker failure keeps the sandbox on its worker (the worker releases it); a lost host
 * (host_lost, from the lost-worker controller) takes it off, so its delete goes to the
 * scheduler. */
static void test_failed_host_lost(void **state)
{
    sp_sandbox_t s;
    ev_t e;
    char reason[SP_REASON_MAX];
    uint64_t seq = 0;
    make_running(&s, &seq);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED, NULL), 0);
    assert_int_equal(s.state, SP_SBX_FAILED);
    assert_string_equal(s.worker, "w1");
    sp_sandbox_dispose(&s);

    seq = 0;
    make_running(&s, &seq);
    sp_envelope_t *f = ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED, NULL);
    e.p.failed.reason = "worker_lost";
    e.p.failed.host_lost = 1;
    assert_int_equal(sp_reduce_sandbox(&s, f, ++seq, reason), 0);
    assert_int_equal(s.state, SP_SBX_FAILED);
    assert_string_equal(s.failure_reason, "worker_lost");
    assert_string_equal(s.worker, "");
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED, NULL), 0);
    sp_sandbox_dispose(&s);
}

/* Connections let out count as activity (idle auto-suspend looks at it). */
static void test_egress_is_activity(void **state)
{
    sp_sandbox_t s;
    ev_t e;
    char reason[SP_REASON_MAX];
    uint64_t seq = 0;
    make_running(&s, &seq);
    int64_t before = s.last_activity_us;
    sp_envelope_t *env = ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_ALLOWED, NULL);
    env->occurred_at_us = before + 5000000;
    assert_int_equal(sp_reduce_sandbox(&s, env, ++seq, reason), 0);
    assert_int_equal(s.last_activity_us, before + 5000000);
    assert_int_equal(s.state, SP_SBX_RUNNING);
    sp_sandbox_dispose(&s);
}

/* Activity moves last_activity_at in steps of a second: a command less than a second after
 * the recorded activity (or stamped before it by another host's clock) is accepted and leaves
 * the row as it was, version and last_seq included; one a step later moves it. A command in a
 * sandbox that is not running is refused whatever its time. */
static void test_activity_in_steps(void **state)
{
    sp_sandbox_t s;
    ev_t e;
    char reason[SP_REASON_MAX];
    uint64_t seq = 0;
    (void)state;
    make_running(&s, &seq);
    const int64_t t0 = s.last_activity_us;
    const uint32_t v0 = s.version;
    const uint64_t seq0 = s.last_seq;
    int64_t at[] = {t0 + 1, t0 + SP_ACTIVITY_GRAIN_US - 1, t0 - 5000000};
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        sp_envelope_t *env = ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED, NULL);
        env->occurred_at_us = at[i];
        assert_int_equal(sp_reduce_sandbox(&s, env, ++seq, reason), 0);
        assert_int_equal(s.last_activity_us, t0);
        assert_int_equal(s.version, v0);
        assert_int_equal(s.last_seq, seq0);
    }
    sp_envelope_t *env = ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED, NULL);
    env->occurred_at_us = t0 + SP_ACTIVITY_GRAIN_US;
    assert_int_equal(sp_reduce_sandbox(&s, env, ++seq, reason), 0);
    assert_int_equal(s.last_activity_us, t0 + SP_ACTIVITY_GRAIN_US);
    assert_int_equal(s.version, v0 + 1);
    assert_int_equal(s.last_seq, seq);
    /* Paused: a command is refused, in its step or not. */
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED, NULL), 0);
    env = ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED, NULL);
    env->occurred_at_us = t0 + SP_ACTIVITY_GRAIN_US + 1;
    assert_int_equal(sp_reduce_sandbox(&s, env, ++seq, reason), SP_ETRANSITION);
    sp_sandbox_dispose(&s);
}

static void test_refusals_leave_row_untouched(void **state)
{
    sp_sandbox_t s;
    ev_t e;
    char reason[SP_REASON_MAX];
    uint64_t seq = 0;

    sp_sandbox_init(&s, "sbx_a");
    /* Facts about a sandbox nobody asked for. */
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "w1"), SP_ETRANSITION);
    assert_int_equal(s.state, SP_SBX_NONE);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, NULL), 0);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, NULL),
                     SP_ETRANSITION);
    /* Another tenant cannot touch it. */
    sp_envelope_t *x = ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED, NULL);
    x->tenant = "t2";
    assert_int_equal(sp_reduce_sandbox(&s, x, ++seq, reason), SP_ETRANSITION);
    assert_non_null(strstr(reason, "tenant"));
    assert_int_equal(s.state, SP_SBX_REQUESTED);
    /* A refused create fails the sandbox with the scheduler's reason. */
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED, NULL), 0);
    assert_int_equal(s.state, SP_SBX_FAILED);
    assert_string_equal(s.failure_reason, "no_capacity");
    assert_int_equal(s.version, 2);
    assert_int_equal(s.last_seq, 5);
    sp_sandbox_dispose(&s);
}

/* disk_mb: what the create asked until the worker says what it applied. */
static void test_disk_mb(void **state)
{
    sp_sandbox_t s;
    ev_t e;
    char reason[SP_REASON_MAX];
    uint64_t seq = 0;
    Space__V1__Resources res = SPACE__V1__RESOURCES__INIT;
    (void)state;

    sp_sandbox_init(&s, "sbx_a");
    sp_envelope_t *c = ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, NULL);
    res.disk_mb = 64;
    e.p.create.resources = &res;
    assert_int_equal(sp_reduce_sandbox(&s, c, ++seq, reason), 0);
    assert_int_equal(s.disk_mb, 64);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED, "w1"), 0);
    sp_envelope_t *st = ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "w1");
    e.p.started.disk_mb = 64;
    assert_int_equal(sp_reduce_sandbox(&s, st, ++seq, reason), 0);
    assert_int_equal(s.disk_mb, 64);
    sp_sandbox_dispose(&s);

    /* None asked: 0, then the worker's default once it started; a worker without quotas (0)
     * leaves it. */
    sp_sandbox_init(&s, "sbx_a");
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, NULL), 0);
    assert_int_equal(s.disk_mb, 0);
    assert_int_equal(APPLY(&s, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED, "w1"), 0);
    st = ev(&e, SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "w1");
    e.p.started.disk_mb = 2048;
    assert_int_equal(sp_reduce_sandbox(&s, st, ++seq, reason), 0);
    assert_int_equal(s.disk_mb, 2048);
    sp_sandbox_dispose(&s);
}

static void test_worker_heartbeats(void **state)
{
    sp_worker_t w;
    char reason[SP_REASON_MAX];
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__WorkerHeartbeat hb = SPACE__V1__WORKER_HEARTBEAT__INIT;
    Space__V1__WorkerStopped st = SPACE__V1__WORKER_STOPPED__INIT;
    char *tmpl[] = {"base", "tiny"};
    char id[37];

    agg.kind = "worker";
    agg.id = "w1";
    env.aggregate = &agg;
    env.actor = "svc:worker";
    hb.worker = "w1";
    hb.vcpu_total = 8;
    hb.vcpu_used = 2;
    hb.templates = tmpl;
    hb.n_templates = 2;
    hb.interval_ms = 1000;
    hb.disk_mb_total = 20480;
    hb.disk_mb_free = 9000;
    hb.disk_mb_reserve = 1024;
    hb.disk_mb_default = 2048;
    /* Warm pools (docs/pools.md): the levels become the projection's pools object. */
    Space__V1__PoolLevel lv[2] = {SPACE__V1__POOL_LEVEL__INIT, SPACE__V1__POOL_LEVEL__INIT};
    Space__V1__PoolLevel *lvp[2] = {&lv[0], &lv[1]};
    lv[0].template_ = "base";
    lv[0].size = 2;
    lv[1].template_ = "tiny";
    lv[1].ready = 2;
    lv[1].size = 2;
    hb.pools = lvp;
    hb.n_pools = 2;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT;
    env.worker_heartbeat = &hb;
    sp_envelope_stamp(&env, id);
    assert_int_equal(sp_envelope_validate(&env, reason), 0);
    /* More ready than the pool holds, or a template that is no id: refused. */
    lv[0].ready = 3;
    assert_int_equal(sp_envelope_validate(&env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "pools"));
    lv[0].ready = 0;
    lv[0].template_ = "Base Template";
    assert_int_equal(sp_envelope_validate(&env, reason), SP_ESCHEMA);
    lv[0].template_ = "base";

    sp_worker_init(&w, "w1");
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_WORKER_STOPPED;
    env.worker_stopped = &st;
    assert_int_equal(sp_reduce_worker(&w, &env, 1, reason), SP_ETRANSITION);
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT;
    env.worker_heartbeat = &hb;
    assert_int_equal(sp_reduce_worker(&w, &env, 2, reason), 0);
    assert_true(w.up);
    assert_string_equal(w.templates_json, "[\"base\",\"tiny\"]");
    assert_int_equal(w.disk_mb_total, 20480);
    assert_int_equal(w.disk_mb_free, 9000);
    assert_int_equal(w.disk_mb_reserve, 1024);
    assert_int_equal(w.disk_mb_default, 2048);
    assert_string_equal(w.pools_json, "{\"base\":0,\"tiny\":2}");
    /* An older heartbeat arriving late does not roll capacity back. */
    env.occurred_at_us -= 1000000;
    assert_int_equal(sp_reduce_worker(&w, &env, 3, reason), SP_ETRANSITION);
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_WORKER_STOPPED;
    env.worker_stopped = &st;
    assert_int_equal(sp_reduce_worker(&w, &env, 4, reason), 0);
    assert_false(w.up);
    assert_int_equal(w.vcpu_used, 0);
    sp_worker_dispose(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_lifecycle),
        cmocka_unit_test(test_egress_is_activity),
        cmocka_unit_test(test_failed_host_lost),
        cmocka_unit_test(test_activity_in_steps),
        cmocka_unit_test(test_refusals_leave_row_untouched),
        cmocka_unit_test(test_disk_mb),
        cmocka_unit_test(test_worker_heartbeats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
