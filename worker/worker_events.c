/* The worker's event loop: SandboxPlaced -> create -> SandboxStarted | SandboxFailed;
 * SandboxDeleteRequested -> destroy -> SandboxDeleted. Everything arriving on the worker's
 * subjects is validated like any input. Facts carry message ids derived from the event they
 * answer ("started:<placed id>"), so a redelivery after a crash cannot produce a second one
 * within the stream's duplicate window, and handlers are idempotent beyond it (the owned
 * table and the host say what already exists).
 *
 * A batch is split by sandbox: each sandbox's messages run in order on one thread, different
 * sandboxes in parallel (at most cfg->parallel threads), and the batch is acknowledged once
 * all are done. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "contract.h"
#include "daemon.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "worker.h"
#include "xmalloc.h"

/* A placement is normally taken within milliseconds; one older than this waited for a worker
 * that was away, and the log may have given up on the sandbox meanwhile. */
#define STALE_PLACEMENT_US (2 * 1000000LL)

/* Whether this process failed the placement (event id) lately (wk_t.given_up). */
static bool given_up(wk_t *w, const char *id)
{
    bool found = false;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < WK_GIVEN_UP_MAX && !found; i++)
        found = strcmp(w->given_up[i], id) == 0;
    pthread_mutex_unlock(&w->mu);
    return found;
}

static void give_up(wk_t *w, const char *id)
{
    pthread_mutex_lock(&w->mu);
    snprintf(w->given_up[w->given_up_next++ % WK_GIVEN_UP_MAX], sizeof(w->given_up[0]), "%s", id);
    pthread_mutex_unlock(&w->mu);
}

/* Whether a placement that waited for this worker, or comes again, is still wanted: not when
 * the log has the sandbox failed or deleted (the scheduler's lost-worker controller gave up on
 * it while this worker was away) or on another worker (placed again elsewhere), nor when the
 * log has this worker's answer to it already: a redelivery whose ack was lost with a NATS
 * node, after the sandbox was started and maybe suspended since (it is not owned then, and
 * would be started a second time: tests/integration/cluster.c). A resume the log has begun
 * here (SandboxResuming, still resuming on this worker) but that nobody holds is wanted again,
 * *began set: the previous process died in it and its start-up released the leftovers
 * (wk_resume_after_restart), so the same placement resumes it and answers the intent. Anything
 * else, the database unreachable included, goes ahead as before: the log refuses facts it
 * cannot take. */
static bool placement_wanted(wk_t *w, const sp_envelope_t *ev, bool redelivered, bool *began)
{
    *began = false;
    if (given_up(w, ev->event_id)) {
        sp_log(SP_LOG_INFO, "placement failed here before: not acted on again",
               SP_KS("sandbox", ev->aggregate->id), SP_KS("corr", ev->correlation_id));
        return false;
    }
    if (!redelivered && sp_now_us() - ev->occurred_at_us < STALE_PLACEMENT_US)
        return true;
    PGconn *db = NULL;
    if (sp_db_idle_take(w->db, 5000, &db) < 0)
        return true;
    const char *p[2] = {ev->aggregate->id, ev->event_id};
    PGresult *r = PQexecParams(
        db,
        "SELECT state, worker, EXISTS (SELECT 1 FROM events WHERE aggregate_kind = 'sandbox' AND "
        "aggregate_id = $1 AND causation_id = $2::uuid AND status = 'accepted' AND type IN "
        "('SandboxStarted', 'SandboxFailed', 'SandboxResumed', 'SandboxResumeFailed')), "
        "EXISTS (SELECT 1 FROM events WHERE aggregate_kind = 'sandbox' AND aggregate_id = $1 AND "
        "causation_id = $2::uuid AND status = 'accepted' AND type = 'SandboxResuming') "
        "FROM sandboxes WHERE id = $1",
        2, NULL, p, NULL, NULL, 0);
    bool wanted = true;
    if (sp_db_check(r, PGRES_TUPLES_OK) == 0 && PQntuples(r) == 1) {
        const char *state = PQgetvalue(r, 0, 0), *owner = PQgetvalue(r, 0, 1);
        bool answered = PQgetvalue(r, 0, 2)[0] == 't';
        bool resuming_here = strcmp(state, "resuming") == 0 && strcmp(owner, w->cfg->id) == 0;
        *began = PQgetvalue(r, 0, 3)[0] == 't';
        /* Begun but no longer resuming here: given up (suspended again) or done elsewhere. */
        answered |= *began && !resuming_here;
        wanted = !answered && strcmp(state, "failed") != 0 && strcmp(state, "deleted") != 0 &&
                 (!owner[0] || strcmp(owner, w->cfg->id) == 0);
        if (!wanted)
            sp_log(SP_LOG_WARN,
                   answered ? "placement answered before: a redelivery, not acted on again"
                            : "placement given up by the log: not acted on",
                   SP_KS("sandbox", ev->aggregate->id), SP_KS("state", state),
                   SP_KS("worker", owner), SP_KS("corr", ev->correlation_id));
        else if (*began)
            sp_log(SP_LOG_INFO, "a resume begun before this worker started: done again",
                   SP_KS("sandbox", ev->aggregate->id), SP_KS("corr", ev->correlation_id));
    }
    PQclear(r);
    sp_db_idle_give(w->db, db);
    return wanted;
}

/* Whether the log has an answer to this intent already (an accepted event it caused, other
 * than one saying the work began): a redelivery of an intent whose handling a previous process
 * of this worker finished, or that its successor completed at start-up (wk_suspend_complete),
 * is not acted on again. Acted on again, a suspend request redelivered after the sandbox was
 * resumed suspended it a second time, under a running command. Asked only of a redelivery or
 * an intent that waited (the log is then seconds ahead of it); false when the log cannot be
 * asked: the handlers are idempotent for what the host and the owned table show. */
static bool intent_answered(wk_t *w, const sp_envelope_t *ev, bool redelivered)
{
    if (!redelivered && sp_now_us() - ev->occurred_at_us < STALE_PLACEMENT_US)
        return false;
    PGconn *db = NULL;
    if (sp_db_idle_take(w->db, 5000, &db) < 0)
        return false;
    const char *p[3] = {ev->aggregate->kind, ev->aggregate->id, ev->event_id};
    PGresult *r = PQexecParams(
        db,
        "SELECT type FROM events WHERE aggregate_kind = $1 AND aggregate_id = $2 AND "
        "causation_id = $3::uuid AND status = 'accepted' AND type NOT IN ('SandboxSuspending', "
        "'SandboxResuming') LIMIT 1",
        3, NULL, p, NULL, NULL, 0);
    bool answered = sp_db_check(r, PGRES_TUPLES_OK) == 0 && PQntuples(r) == 1;
    if (answered)
        sp_log(SP_LOG_INFO, "intent answered before: a redelivery, not acted on again",
               SP_KS("type", ev->type), SP_KS("sandbox", ev->aggregate->id),
               SP_KS("answer", PQgetvalue(r, 0, 0)), SP_KS("corr", ev->correlation_id));
    PQclear(r);
    sp_db_idle_give(w->db, db);
    return answered;
}

static int on_placed(wk_t *w, const sp_envelope_t *ev, bool redelivered)
{
    const Space__V1__SandboxPlaced *p = ev->sandbox_placed;
    const char *sbx = ev->aggregate->id;
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    char err[WK_ERR_MAX] = "";
    int rc;

    if (strcmp(p->worker, w->cfg->id) != 0) {
        sp_log(SP_LOG_WARN, "placement names another worker", SP_KS("sandbox", sbx),
               SP_KS("worker", p->worker), SP_KS("corr", ev->correlation_id));
        return 0;
    }
    if (wk_owned_has(w, sbx))
        return 0; /* created before: a redelivery */
    bool began = false;
    if (!placement_wanted(w, ev, redelivered, &began))
        return 0;
    if (!p->request) /* a suspended sandbox, placed here to resume */
        return wk_on_resume_placed(w, ev, began);
    wk_sandbox_spec_t spec = {
        .id = sbx,
        .template_ = p->request->template_,
        .vcpu = p->request->resources ? p->request->resources->vcpu : 0,
        .memory_mb = p->request->resources ? p->request->resources->memory_mb : 0,
        .disk_mb = p->request->resources ? p->request->resources->disk_mb : 0,
    };
    if (spec.vcpu == 0)
        spec.vcpu = 1;
    if (spec.memory_mb == 0)
        spec.memory_mb = 512;
    wk_sandbox_info_t info = {0};
    int64_t t0 = sp_mono_ns();
    bool from_snapshot = p->request->snapshot[0] != '\0';
    /* A warm pool's sandbox when one is ready (worker_pool.c); else made from scratch; from a
     * named snapshot, restored (owned already when it worked). */
    wk_box_t *box = from_snapshot ? NULL : wk_pool_claim(w, &spec, ev->tenant, &info);
    if (from_snapshot)
        rc = wk_create_from_snapshot(w, ev, &spec, &info, err);
    else
        rc = box ? 0 : wk_template_ensure(w->host, spec.template_, err);
    if (rc >= 0 && !box && !from_snapshot)
        rc = wk_sandbox_create(w->host, &spec, &info, err);
    if (rc == -EEXIST && !from_snapshot) {
        /* Leftovers of this id that nobody owns: a worker killed while creating it (its
         * placement came back). Released, and the create starts over once. Never a live
         * sandbox: an owned one returned above, and one id's placement runs on one thread. */
        char derr[WK_ERR_MAX] = "";
        sp_log(SP_LOG_WARN, "leftovers of an earlier create: released first", SP_KS("sandbox", sbx),
               SP_KS("corr", ev->correlation_id));
        rc = wk_sandbox_destroy(w->host, sbx, derr);
        if (rc < 0)
            snprintf(err, sizeof(err), "leftovers not released: %.200s", derr);
        else
            rc = wk_sandbox_create(w->host, &spec, &info, err);
    }
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    if (rc < 0) {
        Space__V1__SandboxFailed failed = SPACE__V1__SANDBOX_FAILED__INIT;
        /* The disk reserve (wk_sandbox_create): the scheduler may place it elsewhere. */
        failed.reason = rc == -ENOSPC                         ? "no_capacity"
                        : from_snapshot && rc == SP_ENOTFOUND ? "snapshot_not_found"
                        : from_snapshot                       ? "restore_failed"
                                                              : "create_failed";
        failed.detail = err;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED;
        env.sandbox_failed = &failed;
        sp_log(SP_LOG_WARN, "create failed", SP_KS("sandbox", sbx), SP_KS("error", err),
               SP_KS("corr", ev->correlation_id));
        give_up(w, ev->event_id);
        return wk_publish_fact(w, &env, "failed", ev->event_id);
    }
    bool from_pool = box != NULL;
    if (!box && !from_snapshot) {
        box = wk_owned_add(w, sbx, ev->tenant, spec.template_, spec.vcpu, spec.memory_mb);
        if (box && wk_box_attach_agent(box, info.agent_to_fd, info.agent_from_fd) < 0)
            sp_log(SP_LOG_WARN, "no agent channel: commands will be refused", SP_KS("sandbox", sbx),
                   SP_KS("corr", ev->correlation_id));
    }
    wk_box_put(box);
    Space__V1__SandboxStarted started = SPACE__V1__SANDBOX_STARTED__INIT;
    started.worker = w->cfg->id;
    started.runtime = "gvisor";
    started.address = info.address;
    started.disk_mb = info.disk_mb;
    started.start_ms = (uint32_t)((sp_mono_ns() - t0) / 1000000);
    started.from_pool = from_pool;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED;
    env.sandbox_started = &started;
    sp_log(SP_LOG_INFO, "started", SP_KS("sandbox", sbx), SP_KU("ms", started.start_ms),
           SP_KS("address", info.address), SP_KS("from_pool", from_pool ? "true" : "false"),
           SP_KS("corr", ev->correlation_id));
    return wk_publish_fact(w, &env, "started", ev->event_id);
}

static int on_delete(wk_t *w, const sp_envelope_t *ev)
{
    const char *sbx = ev->aggregate->id;
    char err[WK_ERR_MAX] = "";
    /* Commands first: their callers hear why, and the agent channel closes before the
     * sandbox under it goes. */
    wk_box_t *box = wk_owned_remove(w, sbx);
    if (box) {
        wk_box_fail_commands(box, SP_CMD_ERROR_SANDBOX_DELETED);
        wk_box_fail_files(box, SP_CMD_ERROR_SANDBOX_DELETED);
        wk_box_put(box);
    }
    int rc = wk_sandbox_destroy(w->host, sbx, err);
    if (rc < 0) {
        /* Leave it for redelivery: a half-released sandbox must not be reported deleted. */
        sp_log(SP_LOG_ERROR, "destroy failed", SP_KS("sandbox", sbx), SP_KS("error", err),
               SP_KS("corr", ev->correlation_id));
        return rc;
    }
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxDeleted del = SPACE__V1__SANDBOX_DELETED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    del.reason = ev->sandbox_delete_requested->reason;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED;
    env.sandbox_deleted = &del;
    sp_log(SP_LOG_INFO, "deleted", SP_KS("sandbox", sbx), SP_KS("corr", ev->correlation_id));
    return wk_publish_fact(w, &env, "deleted", ev->event_id);
}

/* sp_verifier_once's lookup for a message that is not fresh: a connection of this call's own
 * (the handlers run on several threads; old messages are rare: after a restart or a replay). */
static int log_lookup(void *arg, const char *event_id, uint64_t *ret_seq)
{
    wk_t *w = arg;
    PGconn *db = NULL;
    int rc = sp_db_idle_take(w->db, 5000, &db);
    if (rc >= 0)
        rc = sp_db_accepted_seq(db, event_id, ret_seq);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot ask the log whether an event is a replay: acted on",
               SP_KS("event_id", event_id), SP_KS("error", sp_strerror(rc)));
    sp_db_idle_give(w->db, db);
    return rc;
}

/* 0: done (ack); < 0: retry later. */
static int handle(wk_t *w, const sp_bus_msg_t *m)
{
    sp_envelope_t *ev = NULL;
    char reason[SP_REASON_MAX];
    int rc = 0;
    bool acted_on = false;

    if (sp_envelope_decode(m->data, m->len, &ev, reason) < 0 ||
        sp_envelope_check_subject(ev, m->subject, reason) < 0) {
        sp_log(SP_LOG_WARN, "ignoring invalid event", SP_KU("seq", m->stream_seq),
               SP_KS("reason", reason));
        sp_envelope_free(ev);
        return 0;
    }
    switch (ev->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOT_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETE_REQUESTED:
        /* What the worker acts on: intents and placements (the gateway's, the scheduler's,
         * a platform's), never a worker's fact, so no placement hook is needed. */
        acted_on = true;
        rc = sp_verifier_admit(w->verifier, ev, m->data, m->len, m->subject, m->stream_seq,
                               m->published_ns, NULL, NULL, log_lookup, w, reason);
        if (rc != 0) {
            sp_log(rc < 0 ? SP_LOG_WARN : SP_LOG_INFO,
                   rc < 0 ? "refused: not acted on" : "would be refused (verify-signatures=log)",
                   SP_KU("seq", m->stream_seq), SP_KS("type", ev->type),
                   SP_KS("sandbox", ev->aggregate->id), SP_KS("signer", ev->signer),
                   SP_KS("reason", reason));
            if (rc < 0) {
                sp_envelope_free(ev);
                return 0; /* done: the event log stores it rejected */
            }
            rc = 0;
        }
        break;
    default:
        break; /* our own facts, and intents of later issues */
    }
    /* An intent acts on its tenant's sandbox only: a platform may name any of its tenants
     * (docs/platforms.md), so a valid signature does not say whose sandbox it is. */
    if (acted_on && ev->payload_case != SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED) {
        wk_box_t *b = wk_owned_get(w, ev->aggregate->id);
        bool other = b && strcmp(b->tenant, ev->tenant) != 0;
        wk_box_put(b);
        if (other) {
            sp_log(SP_LOG_WARN, "refused: not acted on", SP_KU("seq", m->stream_seq),
                   SP_KS("type", ev->type), SP_KS("sandbox", ev->aggregate->id),
                   SP_KS("signer", ev->signer), SP_KS("reason", "another tenant's sandbox"));
            sp_envelope_free(ev);
            return 0; /* the event log stores it rejected (the tenant owns no such sandbox) */
        }
    }
    /* Placements have checks of their own (placement_wanted); an answered intent is done. */
    if (acted_on && ev->payload_case != SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED &&
        intent_answered(w, ev, m->delivered > 1)) {
        sp_envelope_free(ev);
        return 0;
    }
    switch (ev->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED:
        rc = on_placed(w, ev, m->delivered > 1);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED:
        rc = on_delete(w, ev);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED:
        rc = wk_on_pause(w, ev);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED:
        rc = wk_on_resume(w, ev);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED:
        rc = wk_on_suspend(w, ev);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOT_REQUESTED:
        rc = wk_on_snapshot(w, ev);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETE_REQUESTED:
        rc = wk_on_snapshot_delete(w, ev);
        break;
    default:
        break; /* our own facts, and intents of later issues */
    }
    sp_envelope_free(ev);
    return rc;
}

bool wk_request_open(wk_t *w, const char *subject, const char *reply_to, const uint8_t *data,
                     size_t len, sp_request_t *rq)
{
    char reason[SP_REASON_MAX];
    int rc = sp_request_take(w->guard, w->bus, subject, reply_to, data, len, rq, reason);
    if (rc != 0)
        sp_log(rc < 0 ? SP_LOG_WARN : SP_LOG_INFO,
               rc < 0 ? "request refused" : "request would be refused (verify-signatures=log)",
               SP_KS("subject", subject), SP_KS("signer", rq->signer), SP_KS("reason", reason));
    return rc >= 0;
}

int wk_take_placements(wk_t *w, PGconn *db)
{
    const char *params[1] = {w->cfg->id};
    /* Each sandbox the log has placed here and not started, or placed here to resume (still
     * suspended, or resuming with no process holding it: one that did runs, is adopted and
     * owned): its newest placement as stored (the bytes the worker would have received),
     * through the same checks as from the bus. */
    PGresult *r = PQexecParams(
        db,
        "SELECT e.stream_seq, e.subject, e.payload FROM sandboxes s JOIN LATERAL (SELECT "
        "stream_seq, subject, payload FROM events WHERE aggregate_id = s.id AND type = "
        "'SandboxPlaced' AND status = 'accepted' ORDER BY stream_seq DESC LIMIT 1) e ON true "
        "WHERE s.worker = $1 AND s.state IN ('placed', 'suspended', 'resuming') ORDER BY "
        "e.stream_seq",
        1, NULL, params, NULL, NULL, 1);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot read the placements", SP_KS("error", PQerrorMessage(db)));
        PQclear(r);
        return rc;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        char *subject = sp_xstrndup(PQgetvalue(r, i, 1), (size_t)PQgetlength(r, i, 1));
        sp_bus_msg_t m = {.subject = subject,
                          .data = (const uint8_t *)PQgetvalue(r, i, 2),
                          .len = (size_t)PQgetlength(r, i, 2),
                          .stream_seq = (uint64_t)sp_db_get_i64(PQgetvalue(r, i, 0)),
                          .delivered = 2};
        sp_log(SP_LOG_INFO, "placement taken from the log", SP_KU("seq", m.stream_seq));
        if (handle(w, &m) < 0)
            sp_log(SP_LOG_WARN, "placement left for its redelivery", SP_KU("seq", m.stream_seq));
        free(subject);
    }
    PQclear(r);
    return 0;
}

/* A batch being handled. Its messages are acknowledged by the group threads as each is done,
 * and told "in progress" by the fetching thread every ack wait / 3 while not done, so the ack
 * wait can be short (a delivery lost with a dropped connection comes back soon) however long a
 * create or a resume takes. mu keeps one message from being acked and told in progress at once
 * (cnats' message is not thread-safe). */
typedef struct {
    sp_bus_batch_t *b;
    pthread_mutex_t mu;
    bool *done; /* acked, or given up for its redelivery */
} acks_t;

typedef struct {
    wk_t *w;
    acks_t *acks;
    size_t *idx; /* this group's message indexes, in stream order */
    size_t n;
    pthread_t thread;
    int failed;
} group_t;

static void *run_group(void *arg)
{
    group_t *g = arg;
    acks_t *a = g->acks;
    for (size_t i = 0; i < g->n; i++) {
        int rc = handle(g->w, sp_bus_batch_msg(a->b, g->idx[i]));
        pthread_mutex_lock(&a->mu);
        if (rc >= 0)
            sp_bus_batch_ack_one(a->b, g->idx[i]);
        /* A failure leaves the rest of this sandbox to the redelivery too. */
        for (size_t j = i; j < (rc < 0 ? g->n : i + 1); j++)
            a->done[g->idx[j]] = true;
        pthread_mutex_unlock(&a->mu);
        if (rc < 0) {
            g->failed = 1;
            break;
        }
    }
    return NULL;
}

static void tell_in_progress(acks_t *a)
{
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < sp_bus_batch_len(a->b); i++)
        if (!a->done[i])
            (void)sp_bus_batch_in_progress(a->b, i);
    pthread_mutex_unlock(&a->mu);
}

/* The sandbox token of space.ev.sbx.<worker>.<sandbox>.<type>. */
static void sandbox_of(const char *subject, char *out, size_t len)
{
    const char *p = subject;
    for (int dots = 0; *p && dots < 4; p++)
        if (*p == '.')
            dots++;
    size_t n = strcspn(p, ".");
    if (n >= len)
        n = len - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

/* ack_wait_ms: the durable's (sp_bus_consumer_ack_wait_ms), which the "in progress" must beat. */
static void process_batch(wk_t *w, sp_bus_batch_t *b, int64_t ack_wait_ms)
{
    size_t n = sp_bus_batch_len(b);
    acks_t acks = {.b = b, .done = sp_xcalloc(n ? n : 1, sizeof(bool))};
    pthread_mutex_init(&acks.mu, NULL);
    int64_t every_ms = ack_wait_ms / 3 > 0 ? ack_wait_ms / 3 : 1;
    group_t *groups = sp_xcalloc(n ? n : 1, sizeof(*groups));
    char(*keys)[65] = sp_xcalloc(n ? n : 1, sizeof(*keys));
    size_t ng = 0;

    for (size_t i = 0; i < n; i++) {
        char key[65];
        sandbox_of(sp_bus_batch_msg(b, i)->subject, key, sizeof(key));
        size_t g = 0;
        while (g < ng && strcmp(keys[g], key) != 0)
            g++;
        if (g == ng) {
            snprintf(keys[ng], sizeof(keys[ng]), "%s", key);
            groups[ng] = (group_t){.w = w, .acks = &acks, .idx = sp_xcalloc(n, sizeof(size_t))};
            ng++;
        }
        groups[g].idx[groups[g].n++] = i;
    }
    /* Waves of at most `parallel` threads. */
    size_t wave = (size_t)w->cfg->parallel;
    for (size_t start = 0; start < ng; start += wave) {
        size_t end = start + wave < ng ? start + wave : ng;
        for (size_t g = start; g < end; g++)
            if (pthread_create(&groups[g].thread, NULL, run_group, &groups[g]) != 0)
                run_group(&groups[g]), groups[g].thread = 0;
        for (size_t g = start; g < end; g++) {
            while (groups[g].thread) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until); /* pthread_timedjoin_np's clock */
                until.tv_sec += every_ms / 1000;
                until.tv_nsec += (every_ms % 1000) * 1000000;
                if (until.tv_nsec >= 1000000000) {
                    until.tv_sec++;
                    until.tv_nsec -= 1000000000;
                }
                int jr = pthread_timedjoin_np(groups[g].thread, NULL, &until);
                if (jr == ETIMEDOUT) {
                    tell_in_progress(&acks);
                    continue;
                }
                if (jr != 0)
                    pthread_join(groups[g].thread, NULL);
                groups[g].thread = 0;
            }
        }
    }
    for (size_t g = 0; g < ng; g++)
        free(groups[g].idx);
    free(groups);
    free(keys);
    pthread_mutex_destroy(&acks.mu);
    free(acks.done);
}

int wk_serve(wk_t *w)
{
    char filter[128];
    sp_bus_consumer_t *c = NULL;
    char durable[96];

    /* The durable of the contract (contract.c), created by the operator (`space up`). */
    snprintf(durable, sizeof(durable), "worker-%s", w->cfg->id);
    int rc = sp_subject_build(filter, sizeof(filter), SP_SUBJ_EV_SBX, w->cfg->id, NULL, NULL);
    if (rc >= 0)
        rc = sp_bus_consumer_bind(w->bus, durable, filter, (int)w->cfg->ack_wait_ms, &c);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot bind the consumer", SP_KS("error", sp_strerror(rc)));
        return rc;
    }
    /* The durable the operator made (`space up`) has the contract's ack wait (contract.c);
     * ack-wait-ms applies only to one this worker creates. "In progress" paced by the wrong
     * one (ack-wait-ms above three times the durable's) let a long create be redelivered
     * while it ran. */
    int64_t ack_wait_ms = sp_bus_consumer_ack_wait_ms(c);
    if (ack_wait_ms != w->cfg->ack_wait_ms)
        sp_log(SP_LOG_WARN, "the durable's ack wait is not ack-wait-ms; it is used",
               SP_KS("durable", durable), SP_KI("ack_wait_ms", ack_wait_ms),
               SP_KI("configured_ms", w->cfg->ack_wait_ms));
    sp_log(SP_LOG_INFO, "serving", SP_KS("worker", w->cfg->id), SP_KS("filter", filter),
           SP_KI("ack_wait_ms", ack_wait_ms));
    /* Reconnected to NATS: a placement the server sent into the dropped connection would come
     * back only after the ack wait (sp_bus_reconnects). The log has it, or soon will (the
     * event log may have lost it the same way and reads it again): it is taken from there a
     * few times over the next seconds. Between batches, so no placement is handled twice at
     * once; one already handled finds its sandbox owned or given up. */
    static const int64_t take_after_ms[] = {0, 2000, 5000, 10000};
    uint64_t reconnects = sp_bus_reconnects(w->bus);
    int64_t reconnected_ns = 0;
    size_t takes = sizeof(take_after_ms) / sizeof(take_after_ms[0]);
    while (!sp_daemon_stopping) {
        if (sp_bus_reconnects(w->bus) != reconnects) {
            reconnects = sp_bus_reconnects(w->bus);
            reconnected_ns = sp_mono_ns();
            takes = 0;
        }
        if (takes < sizeof(take_after_ms) / sizeof(take_after_ms[0]) &&
            sp_mono_ns() - reconnected_ns >= take_after_ms[takes] * 1000000) {
            takes++;
            PGconn *db = NULL;
            if (sp_db_idle_take(w->db, 5000, &db) == 0)
                (void)wk_take_placements(w, db);
            sp_db_idle_give(w->db, db);
        }
        sp_bus_batch_t *b = NULL;
        rc = sp_bus_fetch(c, (size_t)w->cfg->batch_max, 500, &b);
        if (rc < 0) {
            sp_bus_batch_free(b);
            sp_daemon_sleep_ms(200);
            continue;
        }
        if (sp_bus_batch_len(b) > 0)
            process_batch(w, b, ack_wait_ms);
        sp_bus_batch_free(b);
    }
    sp_bus_consumer_free(c);
    return 0;
}
