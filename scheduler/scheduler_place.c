/* Placement: a create intent goes to the least loaded live worker that has the template and
 * room on its disk for the sandbox's limit beside its reserve, or is refused with a reason the
 * API can show. State comes from the projections (PostgreSQL),
 * never from memory that a restart would lose, so a restarted or second scheduler decides the
 * same way. The placement's message id is derived from the intent ("placed:<intent id>"):
 * if a scheduler dies between publishing and acking, the redelivered intent is placed again
 * and the stream's duplicate window drops the second placement, so an intent is placed once.
 *
 * Every create and delete passes the intent check first (intent.h), the same the HTTP API
 * applies before it publishes: an internal platform publishes on the bus directly, and what it
 * asks is refused here, in the open, with SandboxRequestRejected (reason = the check's code,
 * detail = which field and why), never silently dropped. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "error.h"
#include "intent.h"
#include "log.h"
#include "publish.h"
#include "reduce.h"
#include "scheduler.h"
#include "xmalloc.h"

/* Publishes an answer to an intent: into the burst of the batch being handled (main.c signs
 * it as one batch and waits for its acks before acknowledging the intents), or alone and
 * acknowledged by the stream before this returns when there is no burst. */
static int emit(sched_t *s, sp_envelope_t *env, char id[37], const char *worker, const char *msg_id)
{
    if (s->burst)
        return sp_burst_add_msg(s->burst, env, worker, msg_id, id);
    return sp_publish_event(s->bus, env, id, worker, msg_id, NULL);
}

/* The projection's state of a sandbox, SP_SBX_NONE when absent (also: not stored yet) or,
 * with tenant, when another tenant owns it: an intent naming a tenant acts only on that
 * tenant's sandboxes (a platform may name any of its tenants, so its signature alone does not
 * say whose sandbox it is; the event log refuses the rest as well, but workers act on the
 * stream before the log stores anything). */
static int sandbox_state(sched_t *s, const char *id, const char *tenant, sp_sbx_state_t *ret_state,
                         char *worker, size_t worker_len)
{
    const char *params[2] = {id, tenant};
    PGresult *r = PQexecParams(s->db,
                               "SELECT state, worker FROM sandboxes WHERE id = $1"
                               " AND ($2::text IS NULL OR tenant = $2)",
                               2, NULL, params, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc == 0) {
        *ret_state = PQntuples(r) ? sp_sbx_state_from_name(PQgetvalue(r, 0, 0)) : SP_SBX_NONE;
        snprintf(worker, worker_len, "%s", PQntuples(r) ? PQgetvalue(r, 0, 1) : "");
    }
    PQclear(r);
    return rc;
}

static sched_recent_t *recent_for(sched_t *s, const char *worker, int64_t heartbeat_us)
{
    for (size_t i = 0; i < s->n_recent; i++) {
        sched_recent_t *e = &s->recent[i];
        if (strcmp(e->worker, worker) != 0)
            continue;
        if (e->heartbeat_us != heartbeat_us) {
            /* A newer heartbeat counts the earlier placements itself. */
            e->heartbeat_us = heartbeat_us;
            e->placed = 0;
        }
        return e;
    }
    s->recent = sp_xreallocarray(s->recent, s->n_recent + 1, sizeof(*s->recent));
    sched_recent_t *e = &s->recent[s->n_recent++];
    snprintf(e->worker, sizeof(e->worker), "%s", worker);
    e->heartbeat_us = heartbeat_us;
    e->placed = 0;
    return e;
}

typedef enum { PICK_OK, PICK_NO_WORKER, PICK_NO_TEMPLATE, PICK_NO_CAPACITY, PICK_NO_DISK } pick_t;

/* Whether a worker whose heartbeat says free/reserve/default (MiB) has room for a sandbox of
 * disk_mb (0: the worker's default): the worker's own check at create (worker_runtime.c
 * disk_room), made here so that a full worker is not chosen while another has room. Limits are
 * overcommitted: free space now counts, not the sum of the limits. A worker that reports no
 * disk (total 0) is not judged. */
static bool disk_fits(uint64_t total, uint64_t free_mb, uint64_t reserve, uint32_t dflt,
                      uint32_t disk_mb)
{
    uint64_t need = disk_mb ? disk_mb : dflt;
    return total == 0 || free_mb >= need + reserve;
}

/* Chooses a worker for template/vcpu/disk_mb; fills worker. prefer (optional): that worker
 * whenever it can take the sandbox at all, whatever the others' load (it has the sandbox's
 * snapshot cached). Otherwise a worker with a warm-pool sandbox of the template ready
 * (docs/pools.md: its last heartbeat's level, less what was placed there since) goes before
 * the others, the least loaded of them first: its create is a claim of milliseconds instead of
 * a whole one. */
static int pick_worker(sched_t *s, const char *tmpl, uint32_t vcpu, uint32_t disk_mb,
                       const char *prefer, char worker[65], pick_t *ret_pick)
{
    char misses[16];
    const char *params[2] = {tmpl, misses};
    snprintf(misses, sizeof(misses), "%lld", (long long)s->cfg->heartbeat_misses);
    /* Live: a heartbeat within `misses` intervals. */
    PGresult *r =
        PQexecParams(s->db,
                     "SELECT id, templates ? $1, vcpu_total, vcpu_used, sandboxes_running,"
                     " (extract(epoch from last_heartbeat_at) * 1000000)::bigint,"
                     " disk_mb_total, disk_mb_free, disk_mb_reserve, disk_mb_default,"
                     " COALESCE((pools ->> $1)::int, 0)"
                     " FROM workers WHERE state = 'up' AND last_heartbeat_at >"
                     " now() - interval_ms * $2::int * interval '1 millisecond' ORDER BY id",
                     2, NULL, params, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc < 0) {
        PQclear(r);
        return rc;
    }
    int best = -1, with_template = 0, short_of_disk = 0;
    uint32_t best_load = UINT32_MAX;
    bool best_pooled = false;
    for (int i = 0; i < PQntuples(r); i++) {
        if (strcmp(PQgetvalue(r, i, 1), "t") != 0)
            continue;
        with_template++;
        uint32_t total = (uint32_t)strtoul(PQgetvalue(r, i, 2), NULL, 10);
        uint32_t used = (uint32_t)strtoul(PQgetvalue(r, i, 3), NULL, 10);
        uint32_t running = (uint32_t)strtoul(PQgetvalue(r, i, 4), NULL, 10);
        int64_t hb = strtoll(PQgetvalue(r, i, 5), NULL, 10);
        sched_recent_t *rec = recent_for(s, PQgetvalue(r, i, 0), hb);
        /* vCPUs are overcommitted (sandboxes idle most of the time): refuse only a request
         * larger than the whole worker. */
        if (vcpu > total)
            continue;
        if (!disk_fits(strtoull(PQgetvalue(r, i, 6), NULL, 10),
                       strtoull(PQgetvalue(r, i, 7), NULL, 10),
                       strtoull(PQgetvalue(r, i, 8), NULL, 10),
                       (uint32_t)strtoul(PQgetvalue(r, i, 9), NULL, 10), disk_mb)) {
            short_of_disk++;
            continue;
        }
        uint32_t load = running + rec->placed;
        uint32_t ready = (uint32_t)strtoul(PQgetvalue(r, i, 10), NULL, 10);
        bool pooled = ready > rec->placed;
        (void)used;
        if (prefer && prefer[0] && strcmp(PQgetvalue(r, i, 0), prefer) == 0) {
            best = i;
            break;
        }
        if ((pooled && !best_pooled) || (pooled == best_pooled && load < best_load)) {
            best_load = load;
            best = i;
            best_pooled = pooled;
        }
    }
    if (best >= 0) {
        snprintf(worker, 65, "%s", PQgetvalue(r, best, 0));
        recent_for(s, worker, strtoll(PQgetvalue(r, best, 5), NULL, 10))->placed++;
        *ret_pick = PICK_OK;
    } else if (PQntuples(r) == 0) {
        *ret_pick = PICK_NO_WORKER;
    } else {
        *ret_pick = !with_template  ? PICK_NO_TEMPLATE
                    : short_of_disk ? PICK_NO_DISK
                                    : PICK_NO_CAPACITY;
    }
    PQclear(r);
    return 0;
}

static int reject(sched_t *s, const sp_envelope_t *intent, const char *reason, const char *detail)
{
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxRequestRejected rej = SPACE__V1__SANDBOX_REQUEST_REJECTED__INIT;
    char id[37], msg_id[64];

    sp_envelope_answer(&env, &agg, intent, "svc:scheduler");
    rej.request_type = intent->type;
    rej.reason = (char *)reason;
    rej.detail = (char *)detail;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED;
    env.sandbox_request_rejected = &rej;
    snprintf(msg_id, sizeof(msg_id), "rejected:%s", intent->event_id);
    int rc = emit(s, &env, id, NULL, msg_id);
    if (rc >= 0)
        sched_metrics_placement(s, reason);
    sp_log(SP_LOG_INFO, "intent refused", SP_KS("type", intent->type),
           SP_KS("sandbox", intent->aggregate->id), SP_KS("reason", reason),
           SP_KS("detail", detail), SP_KS("signer", intent->signer),
           SP_KS("corr", intent->correlation_id));
    return rc;
}

/* The intent check (intent.h): 1 when it passes, else the refusal is published (0) or could
 * not be (< 0: redelivered later). */
static int checked(sched_t *s, const sp_envelope_t *intent)
{
    char reason[SP_REASON_MAX];
    const char *code = SP_INTENT_INVALID;

    if (sp_intent_check(intent, reason, &code) == 0)
        return 1;
    return reject(s, intent, code, reason);
}

/* intent, which came to the scheduler's subject, to its sandbox's worker owner: in the
 * scheduler's own signed intent of the same type and payload, caused by it (not the request's
 * bytes again: a second copy of a signed event is what a replay looks like, and consumers
 * refuse those, verifier.h). */
static int forward(sched_t *s, const sp_envelope_t *intent, const char *owner)
{
    char id[37], msg_id[64];
    sp_envelope_t fwd;
    Space__V1__Aggregate fagg;
    sp_envelope_answer(&fwd, &fagg, intent, intent->actor);
    /* The same payload (a reason at most), borrowed from intent. */
    fwd.payload_case = intent->payload_case;
    switch (intent->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED:
        fwd.sandbox_delete_requested = intent->sandbox_delete_requested;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED:
        fwd.sandbox_pause_requested = intent->sandbox_pause_requested;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED:
        fwd.sandbox_resume_requested = intent->sandbox_resume_requested;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED:
        fwd.sandbox_suspend_requested = intent->sandbox_suspend_requested;
        break;
    default:
        return -EINVAL;
    }
    snprintf(msg_id, sizeof(msg_id), "forward:%s", intent->event_id);
    return emit(s, &fwd, id, owner, msg_id);
}

/* A pause, suspend or resume on the scheduler's subject (an internal platform's:
 * natsauth.c gives platforms no other): forwarded to the sandbox's worker. A sandbox on no
 * worker has nobody to do it: refused, as the gateway's state check would
 * (gateway_lifecycle.c). */
static int forward_to_owner(sched_t *s, const sp_envelope_t *intent)
{
    char owner[65];
    sp_sbx_state_t state = SP_SBX_NONE;
    int rc = sandbox_state(s, intent->aggregate->id, intent->tenant, &state, owner, sizeof(owner));
    if (rc < 0)
        return rc;
    if (state == SP_SBX_NONE)
        return reject(s, intent, "not_found", "no such sandbox");
    if ((rc = checked(s, intent)) <= 0)
        return rc;
    if (!owner[0] || state == SP_SBX_DELETED)
        return reject(s, intent, "illegal_transition", "the sandbox is on no worker");
    return forward(s, intent, owner);
}

static int place(sched_t *s, const sp_envelope_t *intent)
{
    const Space__V1__SandboxCreateRequested *req = intent->sandbox_create_requested;
    char worker[65] = "", owner[65];
    sp_sbx_state_t state = SP_SBX_NONE;
    pick_t pick;
    int rc;

    if ((rc = sandbox_state(s, intent->aggregate->id, NULL, &state, owner, sizeof(owner))) < 0)
        return rc;
    if (state != SP_SBX_NONE && state != SP_SBX_REQUESTED)
        return 0; /* placed or refused before (a redelivery) */
    if ((rc = checked(s, intent)) <= 0)
        return rc;
    uint32_t vcpu = req->resources && req->resources->vcpu ? req->resources->vcpu : 1;
    uint32_t disk_mb = req->resources ? req->resources->disk_mb : 0;
    /* From a named snapshot (docs/snapshots.md): the worker that took it first, it has the
     * artifacts (any other reads the shared store or the bucket). */
    char taken_on[65] = "";
    sp_envelope_t *snap = NULL;
    if (req->snapshot[0] && sp_db_snapshot_find(s->db, intent->tenant, req->snapshot, &snap) == 0)
        snprintf(taken_on, sizeof(taken_on), "%s", snap->sandbox_snapshotted->worker);
    sp_envelope_free(snap);
    if ((rc = pick_worker(s, req->template_, vcpu, disk_mb, taken_on, worker, &pick)) < 0)
        return rc;
    char detail[160];
    switch (pick) {
    case PICK_NO_WORKER:
        return reject(s, intent, "no_capacity", "no worker is up");
    case PICK_NO_TEMPLATE:
        return reject(s, intent, "unknown_template", "no live worker has this template");
    case PICK_NO_CAPACITY:
        return reject(s, intent, "no_capacity", "no worker can fit the requested resources");
    case PICK_NO_DISK:
        if (disk_mb)
            snprintf(detail, sizeof(detail),
                     "no worker has %u MiB of disk free for disk_mb beside its reserve", disk_mb);
        else
            snprintf(detail, sizeof(detail),
                     "no worker has its default disk_mb free beside its reserve");
        return reject(s, intent, "no_capacity", detail);
    case PICK_OK:
        break;
    }

    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxPlaced placed = SPACE__V1__SANDBOX_PLACED__INIT;
    char id[37], msg_id[64];
    sp_envelope_answer(&env, &agg, intent, "svc:scheduler");
    placed.worker = worker;
    placed.scheduler = s->cfg->name;
    placed.request = (Space__V1__SandboxCreateRequested *)req;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED;
    env.sandbox_placed = &placed;
    snprintf(msg_id, sizeof(msg_id), "placed:%s", intent->event_id);
    if ((rc = emit(s, &env, id, worker, msg_id)) < 0)
        return rc;
    sched_metrics_placement(s, "placed");
    sp_log(SP_LOG_INFO, "placed", SP_KS("sandbox", intent->aggregate->id), SP_KS("worker", worker),
           SP_KS("corr", intent->correlation_id));
    return 0;
}

/* The worker that made the sandbox's newest snapshot (it keeps the artifacts cached), or ""
 * when that is unknown. */
static void suspended_on(sched_t *s, const char *sbx, char out[65])
{
    sp_envelope_t *ev = NULL;
    if (sp_db_last_sandbox_event(s->db, sbx, "SandboxSuspended", &ev) == 0 &&
        ev->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED)
        snprintf(out, 65, "%s", ev->sandbox_suspended->worker);
    sp_envelope_free(ev);
}

/* A resume of a suspended sandbox: it lives on no worker, so the scheduler places it again,
 * on a live worker with its template (the snapshot store is shared; the worker that made the
 * snapshot first, it has it cached), with a SandboxPlaced that
 * carries no create request: that tells the worker to restore. */
static int place_resume(sched_t *s, const sp_envelope_t *intent)
{
    const char *params[2] = {intent->aggregate->id, intent->tenant};
    PGresult *r = PQexecParams(s->db,
                               "SELECT state, coalesce(worker, ''), template, vcpu, disk_mb"
                               " FROM sandboxes WHERE id = $1 AND tenant = $2",
                               2, NULL, params, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc < 0 || PQntuples(r) != 1) {
        PQclear(r);
        return rc; /* not stored yet, or another tenant's: the log refuses it */
    }
    sp_sbx_state_t state = sp_sbx_state_from_name(PQgetvalue(r, 0, 0));
    bool placed = PQgetvalue(r, 0, 1)[0] != '\0';
    char tmpl[65], worker[65] = "";
    snprintf(tmpl, sizeof(tmpl), "%s", PQgetvalue(r, 0, 2));
    uint32_t vcpu = (uint32_t)strtoul(PQgetvalue(r, 0, 3), NULL, 10);
    uint32_t disk_mb = (uint32_t)strtoul(PQgetvalue(r, 0, 4), NULL, 10);
    PQclear(r);
    if (state == SP_SBX_PAUSED && placed)
        return forward_to_owner(s, intent); /* a platform's resume of a paused sandbox */
    if (state != SP_SBX_SUSPENDED || placed) {
        if (state == SP_SBX_SUSPENDED || state == SP_SBX_RESUMING || state == SP_SBX_RUNNING)
            return 0; /* placed before (a redelivery) */
        return reject(s, intent, "illegal_transition",
                      "only a suspended sandbox is resumed by placement");
    }
    char cached_on[65] = "";
    suspended_on(s, intent->aggregate->id, cached_on);
    pick_t pick;
    if ((rc = pick_worker(s, tmpl, vcpu ? vcpu : 1, disk_mb, cached_on, worker, &pick)) < 0)
        return rc;
    if (pick != PICK_OK)
        return reject(s, intent, "no_capacity",
                      pick == PICK_NO_TEMPLATE ? "no live worker has the sandbox's template"
                      : pick == PICK_NO_DISK   ? "no worker has the sandbox's disk_mb free beside "
                                                 "its reserve"
                                               : "no worker can take the sandbox now");
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxPlaced p = SPACE__V1__SANDBOX_PLACED__INIT;
    char id[37], msg_id[64];
    sp_envelope_answer(&env, &agg, intent, "svc:scheduler");
    p.worker = worker;
    p.scheduler = s->cfg->name;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED;
    env.sandbox_placed = &p;
    snprintf(msg_id, sizeof(msg_id), "placed:%s", intent->event_id);
    if ((rc = emit(s, &env, id, worker, msg_id)) < 0)
        return rc;
    sched_metrics_placement(s, "placed_resume");
    sp_log(SP_LOG_INFO, "placed for resume", SP_KS("sandbox", intent->aggregate->id),
           SP_KS("worker", worker), SP_KS("corr", intent->correlation_id));
    return 0;
}

/* A delete of a sandbox no worker owns: the scheduler is the owner of unplaced intents. */
static int delete_unplaced(sched_t *s, const sp_envelope_t *intent)
{
    char owner[65], id[37], msg_id[64];
    sp_sbx_state_t state = SP_SBX_NONE;
    int rc = sandbox_state(s, intent->aggregate->id, intent->tenant, &state, owner, sizeof(owner));
    if (rc < 0)
        return rc;
    if (state == SP_SBX_NONE || state == SP_SBX_DELETED)
        return 0;
    if ((rc = checked(s, intent)) <= 0)
        return rc;
    if (owner[0])
        return forward(s, intent, owner); /* placed meanwhile: its owner deletes it */
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxDeleted del = SPACE__V1__SANDBOX_DELETED__INIT;
    sp_envelope_answer(&env, &agg, intent, "svc:scheduler");
    del.reason = intent->sandbox_delete_requested->reason;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED;
    env.sandbox_deleted = &del;
    snprintf(msg_id, sizeof(msg_id), "deleted:%s", intent->event_id);
    return emit(s, &env, id, NULL, msg_id);
}

int sched_handle(sched_t *s, const sp_bus_msg_t *m)
{
    sp_envelope_t *env = NULL;
    char reason[SP_REASON_MAX];
    int rc = 0;

    if (sp_envelope_decode(m->data, m->len, &env, reason) < 0 ||
        sp_envelope_check_subject(env, m->subject, reason) < 0) {
        sp_log(SP_LOG_WARN, "ignoring invalid event", SP_KU("seq", m->stream_seq),
               SP_KS("reason", reason));
        sp_envelope_free(env);
        return 0;
    }
    switch (env->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED:
        /* Intents only (no worker's fact is acted on here): no placement hook. No
         * SandboxRequestRejected for a refused one: the log stores the intent rejected with
         * the reason, and a forged message must not make the platform speak. */
        rc = sp_verifier_admit(s->verifier, env, m->data, m->len, m->subject, m->stream_seq,
                               m->published_ns, NULL, NULL, sp_db_accepted_seq, s->db, reason);
        if (rc != 0) {
            sp_log(rc < 0 ? SP_LOG_WARN : SP_LOG_INFO,
                   rc < 0 ? "refused: not acted on" : "would be refused (verify-signatures=log)",
                   SP_KU("seq", m->stream_seq), SP_KS("type", env->type),
                   SP_KS("sandbox", env->aggregate->id), SP_KS("signer", env->signer),
                   SP_KS("reason", reason));
            if (rc < 0) {
                sp_envelope_free(env);
                return 0;
            }
            rc = 0;
        }
        break;
    default:
        break;
    }
    switch (env->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED:
        rc = place(s, env);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED:
        rc = delete_unplaced(s, env);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED:
        rc = place_resume(s, env);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED:
        rc = forward_to_owner(s, env);
        break;
    default:
        /* Our own answers and other facts on "_": nothing to do. A platform's timeout too:
         * the projection applies it and the timeout controller acts on it. */
        break;
    }
    if (rc < 0)
        sp_log(SP_LOG_WARN, "will retry", SP_KS("sandbox", env->aggregate->id),
               SP_KS("type", env->type), SP_KS("error", sp_strerror(rc)),
               SP_KS("corr", env->correlation_id));
    sp_envelope_free(env);
    return rc;
}
