/* /v1/sandboxes, /v1/templates, /healthz: reads from the PostgreSQL projections, writes only
 * intents to the bus, and waits for the projection to show the outcome of an intent before it
 * answers (read-your-writes: a 201 means GET will show the sandbox running).
 *
 * Waiting: every waiter (a create or delete that published its intent) sits in one list on the
 * loop. Whenever the event log announces a new head (NOTIFY), a waiter is added, or a second
 * passes, one check job reads the rows of all waiting sandboxes in a single query and answers
 * those whose outcome is there. A waiter is always checked after it is registered, so an
 * outcome committed before the registration is not missed. */
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "db.h"
#include "envelope.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "xmalloc.h"

#define LIST_LIMIT_DEFAULT 100
#define LIST_LIMIT_MAX     1000

static PGresult *query(PGconn *db, const char *sql, int n, const char *const *params)
{
    return PQexecParams(db, sql, n, NULL, params, NULL, NULL, 0);
}

static void log_db_error(const char *what, PGconn *db)
{
    sp_log(SP_LOG_WARN, "query failed", SP_KS("query", what), SP_KS("error", PQerrorMessage(db)));
}

static void overloaded(gw_req_t *rq)
{
    gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
}

static void db_unavailable(gw_req_t *rq)
{
    gw_respond_error(rq, 503, "unavailable", NULL, "the database is not available; retry");
}

/* ---- sandbox JSON ---- */

void gw_json_time(sp_buf_t *b, int64_t us)
{
    if (us <= 0) {
        sp_buf_puts(b, "null");
        return;
    }
    time_t secs = (time_t)(us / 1000000);
    struct tm tm;
    if (!gmtime_r(&secs, &tm)) {
        sp_buf_puts(b, "null");
        return;
    }
    sp_buf_printf(b, "\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\"", tm.tm_year + 1900, tm.tm_mon + 1,
                  tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(us % 1000000 / 1000));
}

static int64_t col_i64(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return 0;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static void json_opt_str(sp_buf_t *b, const char *s)
{
    if (s && s[0])
        sp_buf_json_str(b, s);
    else
        sp_buf_puts(b, "null");
}

void gw_sandbox_json(const PGresult *r, int row, sp_buf_t *b)
{
    int64_t created = col_i64(r, row, 11), started = col_i64(r, row, 12);
    int64_t timeout_s = col_i64(r, row, 5);
    const char *state = PQgetvalue(r, row, 3);

    sp_buf_puts(b, "{\"id\":");
    sp_buf_json_str(b, PQgetvalue(r, row, 0));
    sp_buf_puts(b, ",\"tenant\":");
    sp_buf_json_str(b, PQgetvalue(r, row, 1));
    sp_buf_puts(b, ",\"template\":");
    sp_buf_json_str(b, PQgetvalue(r, row, 2));
    sp_buf_puts(b, ",\"state\":");
    sp_buf_json_str(b, state);
    sp_buf_puts(b, ",\"worker\":");
    json_opt_str(b, PQgetvalue(r, row, 4));
    sp_buf_puts(b, ",\"created_at\":");
    gw_json_time(b, created);
    sp_buf_puts(b, ",\"started_at\":");
    gw_json_time(b, started);
    /* The deadline the scheduler acts on (null: none: timeout_s 0, or suspended). */
    sp_buf_puts(b, ",\"timeout_at\":");
    gw_json_time(b, col_i64(r, row, 13));
    sp_buf_printf(b, ",\"timeout_s\":%" PRId64 ",\"on_timeout\":", timeout_s);
    sp_buf_json_str(b, PQgetvalue(r, row, 14));
    sp_buf_printf(b, ",\"idle_suspend_s\":%" PRId64 ",\"last_activity_at\":", col_i64(r, row, 15));
    gw_json_time(b, col_i64(r, row, 16));
    /* jsonb's own output: valid JSON, built by the reducer from validated event fields. */
    sp_buf_puts(b, ",\"metadata\":");
    sp_buf_puts(b, PQgetisnull(r, row, 8) ? "{}" : PQgetvalue(r, row, 8));
    sp_buf_puts(b, ",\"env_names\":");
    sp_buf_puts(b, PQgetisnull(r, row, 9) ? "[]" : PQgetvalue(r, row, 9));
    /* disk_mb: the limit the sandbox got (0 before it started without asking: the worker's
     * default, not known yet). */
    sp_buf_printf(b,
                  ",\"resources\":{\"vcpu\":%" PRId64 ",\"memory_mb\":%" PRId64
                  ",\"disk_mb\":%" PRId64 "}",
                  col_i64(r, row, 6), col_i64(r, row, 7), col_i64(r, row, 17));
    sp_buf_puts(b, ",\"failure_reason\":");
    json_opt_str(b, PQgetvalue(r, row, 10));
    sp_buf_puts(b, ",\"network\":null}");
}

/* ---- waiters ---- */

typedef struct {
    char id[SP_ID_MAX + 1];
    char template_[SP_ID_MAX + 1];
    sp_sbx_state_t state;
    char failure_reason[SP_REASON_MAX];
    char *json;
} view_t;

typedef struct {
    char event_id[GW_EVENT_ID_LEN + 1];
    char corr[GW_REQUEST_ID_MAX + 1];
    bool failed; /* SandboxSuspendFailed / SandboxResumeFailed: tried, and it did not work */
    char reason[SP_REASON_MAX];
    char detail[SP_REASON_MAX];
    /* Not a refusal: SandboxSnapshotted / SnapshotDeleted, the outcome a snapshot waiter
     * wants (docs/snapshots.md). */
    bool done;
    char *json; /* the snapshot (SandboxSnapshotted) */
    char *e2b;  /* the same in E2B's shape */
} reject_t;

typedef struct {
    gw_job_t job;
    sp_buf_t ids;       /* text[] literal of the waiting sandboxes */
    sp_buf_t event_ids; /* uuid[] literal of the intents waited for, but creates' ("{}") */
    sp_buf_t corr_ids;  /* text[] literal of their request ids */
    bool any_intent;
    bool failed;
    view_t *rows;
    size_t n_rows;
    reject_t *rejects;
    size_t n_rejects;
    char (*stored)[GW_EVENT_ID_LEN + 1]; /* intents the log has, and whether it took them */
    bool *stored_ok;
    size_t n_stored;
} check_job_t;

static void check_stored(check_job_t *c, PGconn *db);

static int view_cmp(const void *a, const void *b)
{
    return strcmp(((const view_t *)a)->id, ((const view_t *)b)->id);
}

static void check_run(gw_job_t *job, PGconn *db)
{
    check_job_t *c = (check_job_t *)job;
    const char *p1[1] = {c->ids.data};
    PGresult *r =
        query(db, "SELECT " GW_SBX_COLUMNS " FROM sandboxes WHERE id = ANY($1::text[])", 1, p1);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        log_db_error("waiters", db);
        c->failed = true;
        PQclear(r);
        return;
    }
    c->n_rows = (size_t)PQntuples(r);
    c->rows = sp_xcalloc(c->n_rows ? c->n_rows : 1, sizeof(*c->rows));
    for (size_t i = 0; i < c->n_rows; i++) {
        view_t *v = &c->rows[i];
        sp_buf_t b;
        snprintf(v->id, sizeof(v->id), "%s", PQgetvalue(r, (int)i, 0));
        snprintf(v->template_, sizeof(v->template_), "%s", PQgetvalue(r, (int)i, 2));
        v->state = sp_sbx_state_from_name(PQgetvalue(r, (int)i, 3));
        snprintf(v->failure_reason, sizeof(v->failure_reason), "%s", PQgetvalue(r, (int)i, 10));
        sp_buf_init(&b);
        gw_sandbox_json(r, (int)i, &b);
        v->json = sp_buf_take(&b);
    }
    PQclear(r);
    qsort(c->rows, c->n_rows, sizeof(*c->rows), view_cmp);
    if (!c->any_intent)
        return;
    check_stored(c, db);

    /* A refused intent answers with SandboxRequestRejected naming it as causation, a suspend
     * that failed on the way with SandboxSuspendFailed (causation too), a resume from suspend
     * that failed with SandboxResumeFailed (it answers the placement: matched by the request's
     * correlation). */
    const char *p2[3] = {c->ids.data, c->event_ids.data, c->corr_ids.data};
    r = PQexecParams(db,
                     "SELECT coalesce(causation_id::text, ''), payload, coalesce(correlation_id, "
                     "'') FROM events WHERE aggregate_kind = 'sandbox' AND aggregate_id = "
                     "ANY($1::text[]) AND status = 'accepted' AND ((type IN "
                     "('SandboxRequestRejected', 'SandboxSuspendFailed', "
                     "'SandboxSnapshotted', 'SnapshotDeleted') AND causation_id = "
                     "ANY($2::uuid[])) OR (type = 'SandboxResumeFailed' AND correlation_id = "
                     "ANY($3::text[])))",
                     3, NULL, p2, NULL, NULL, 1);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        log_db_error("rejections", db);
        PQclear(r);
        return;
    }
    c->rejects = sp_xcalloc((size_t)PQntuples(r) + 1, sizeof(*c->rejects));
    /* (The intents themselves, for waiters that only need them stored: read below.) */
    for (int i = 0; i < PQntuples(r); i++) {
        sp_envelope_t *env = NULL;
        char why[SP_REASON_MAX];
        if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 1), (size_t)PQgetlength(r, i, 1),
                               &env, why) < 0)
            continue;
        reject_t *x = &c->rejects[c->n_rejects++];
        snprintf(x->event_id, sizeof(x->event_id), "%s", PQgetvalue(r, i, 0));
        snprintf(x->corr, sizeof(x->corr), "%s", PQgetvalue(r, i, 2));
        const char *reason = "", *detail = "";
        if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED) {
            reason = env->sandbox_request_rejected->reason;
            detail = env->sandbox_request_rejected->detail;
        } else if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_FAILED) {
            reason = env->sandbox_suspend_failed->reason;
            /* tcp_time_wait: refused before the checkpoint, for a while (409, retry later). */
            x->failed = strcmp(reason, "tcp_time_wait") != 0;
            detail = env->sandbox_suspend_failed->detail;
        } else if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_FAILED) {
            x->failed = true;
            reason = env->sandbox_resume_failed->reason;
            detail = env->sandbox_resume_failed->detail;
        } else if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOTTED) {
            x->done = true;
            sp_buf_t b;
            sp_buf_init(&b);
            gw_snapshot_json(env, env->occurred_at_us, &b);
            x->json = sp_buf_take(&b);
            sp_buf_init(&b);
            gw_snapshot_json_e2b(env, &b);
            x->e2b = sp_buf_take(&b);
        } else if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED) {
            x->done = true;
        }
        snprintf(x->reason, sizeof(x->reason), "%s", reason);
        snprintf(x->detail, sizeof(x->detail), "%s", detail);
        sp_envelope_free(env);
    }
    PQclear(r);
}

/* Which waited-for intents the log has stored, and with which status. */
static void check_stored(check_job_t *c, PGconn *db)
{
    const char *p[1] = {c->event_ids.data};
    PGresult *r = PQexecParams(db,
                               "SELECT event_id::text, status FROM events WHERE event_id = "
                               "ANY($1::uuid[])",
                               1, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        log_db_error("stored intents", db);
        PQclear(r);
        return;
    }
    c->n_stored = (size_t)PQntuples(r);
    c->stored = sp_xcalloc(c->n_stored + 1, sizeof(*c->stored));
    c->stored_ok = sp_xcalloc(c->n_stored + 1, sizeof(*c->stored_ok));
    for (size_t i = 0; i < c->n_stored; i++) {
        snprintf(c->stored[i], sizeof(c->stored[i]), "%s", PQgetvalue(r, (int)i, 0));
        c->stored_ok[i] = strcmp(PQgetvalue(r, (int)i, 1), "accepted") == 0;
    }
    PQclear(r);
}

static void waiter_unlink(gw_t *gw, gw_waiter_t *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        gw->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    gw->n_waiters--;
}

static void waiter_free(gw_t *gw, gw_waiter_t *w)
{
    waiter_unlink(gw, w);
    gw_req_unref(w->rq);
    free(w);
}

static void answer_create(gw_waiter_t *w, const view_t *v)
{
    gw_req_t *rq = w->rq;
    char extra[128];
    snprintf(extra, sizeof(extra), "\"sandbox_id\":\"%s\"", w->sandbox_id);

    if (v->state == SP_SBX_RUNNING && rq->dialect == GW_DIALECT_E2B) {
        gw_metrics_create_latency(&rq->gw->metrics, (double)(sp_mono_ns() - rq->start_ns) / 1e9);
        gw_e2b_answer_sandbox(rq, 201, w->sandbox_id, v->template_);
    } else if (v->state == SP_SBX_RUNNING) {
        char loc[128];
        int n = snprintf(loc, sizeof(loc), "/v1/sandboxes/%s", w->sandbox_id);
        h2o_iovec_t l = h2o_strdup(&rq->req->pool, loc, (size_t)n);
        h2o_add_header(&rq->req->pool, &rq->req->res.headers, H2O_TOKEN_LOCATION, NULL, l.base,
                       l.len);
        gw_metrics_create_latency(&rq->gw->metrics, (double)(sp_mono_ns() - rq->start_ns) / 1e9);
        gw_respond(rq, 201, "application/json", v->json, strlen(v->json));
    } else if (strcmp(v->failure_reason, "unknown_template") == 0) {
        gw_respond_error(rq, 400, "unknown_template", extra,
                         "no worker offers this template (sandbox %s failed)", w->sandbox_id);
    } else if (strcmp(v->failure_reason, "no_capacity") == 0) {
        gw_respond_error(rq, 503, "no_capacity", extra,
                         "no worker has room for this sandbox now (sandbox %s failed); retry",
                         w->sandbox_id);
    } else if (v->state == SP_SBX_DELETED) {
        gw_respond_error(rq, 409, "sandbox_deleted", extra,
                         "sandbox %s was deleted before it started", w->sandbox_id);
    } else {
        gw_respond_error(rq, 500, "sandbox_failed", extra, "sandbox %s failed: %s", w->sandbox_id,
                         v->failure_reason[0] ? v->failure_reason : "unknown");
    }
}

/* The outcome of a waiter if the rows show one: true when answered. */
static bool settle(gw_waiter_t *w, const check_job_t *c)
{
    view_t key;
    snprintf(key.id, sizeof(key.id), "%s", w->sandbox_id);
    const view_t *v = bsearch(&key, c->rows, c->n_rows, sizeof(*c->rows), view_cmp);

    if (!gw_req_live(w->rq))
        return true; /* nobody to answer */
    if (w->kind == GW_WAIT_CREATE) {
        if (!v ||
            (v->state != SP_SBX_RUNNING && v->state != SP_SBX_FAILED && v->state != SP_SBX_DELETED))
            return false;
        answer_create(w, v);
        return true;
    }
    if (w->kind == GW_WAIT_SNAPSHOT || w->kind == GW_WAIT_SNAPSHOT_DELETE) {
        /* The answer to the intent, whatever the state of the sandbox (a snapshot of a deleted
         * sandbox may still be deleted). */
        for (size_t i = 0; i < c->n_rejects; i++) {
            const reject_t *x = &c->rejects[i];
            if (strcmp(x->event_id, w->event_id) != 0)
                continue;
            const char *json = w->rq->dialect == GW_DIALECT_E2B ? x->e2b : x->json;
            if (x->done && w->kind == GW_WAIT_SNAPSHOT && json)
                gw_respond(w->rq, 201, "application/json", json, strlen(json));
            else if (x->done)
                gw_respond(w->rq, 204, "application/json", NULL, 0);
            else
                gw_respond_error(w->rq, 409, x->reason, NULL, "the snapshot was refused: %s",
                                 x->detail[0] ? x->detail : x->reason);
            return true;
        }
        if (w->kind == GW_WAIT_SNAPSHOT && v && v->state == SP_SBX_FAILED) {
            gw_respond_error(w->rq, 500, "sandbox_failed", NULL,
                             "the sandbox failed during its snapshot: %s", v->failure_reason);
            return true;
        }
        return false;
    }
    if (w->kind == GW_WAIT_DELETE && v && v->state == SP_SBX_DELETED) {
        gw_respond(w->rq, 204, "application/json", NULL, 0);
        return true;
    }
    sp_sbx_state_t target = w->kind == GW_WAIT_PAUSE     ? SP_SBX_PAUSED
                            : w->kind == GW_WAIT_SUSPEND ? SP_SBX_SUSPENDED
                                                         : SP_SBX_RUNNING;
    if (w->kind == GW_WAIT_STORED) {
        for (size_t i = 0; i < c->n_stored; i++) {
            if (strcmp(c->stored[i], w->event_id) != 0)
                continue;
            if (c->stored_ok[i] && v && w->rq->dialect == GW_DIALECT_E2B &&
                strcmp(w->rq->path_action, "resume") == 0) /* E2B's connect that extended */
                gw_e2b_answer_sandbox(w->rq, 200, w->sandbox_id, v->template_);
            else if (c->stored_ok[i] && v && w->rq->dialect == GW_DIALECT_E2B)
                gw_respond(w->rq, 204, "application/json", NULL, 0); /* E2B's setTimeout */
            else if (c->stored_ok[i] && v)
                gw_respond(w->rq, 200, "application/json", v->json, strlen(v->json));
            else
                gw_respond_error(w->rq, 409, "illegal_transition", NULL,
                                 "the event log refused the request (the sandbox's state "
                                 "changed): GET /v1/sandboxes/%s",
                                 w->sandbox_id);
            return true;
        }
        return false;
    }
    if (w->kind != GW_WAIT_DELETE && v && v->state == target) {
        if (w->rq->dialect != GW_DIALECT_E2B)
            gw_respond(w->rq, 200, "application/json", v->json, strlen(v->json));
        else if (w->kind == GW_WAIT_SUSPEND) /* E2B's pause */
            gw_respond(w->rq, 204, "application/json", NULL, 0);
        else /* E2B's connect / resume */
            gw_e2b_answer_sandbox(w->rq, 201, w->sandbox_id, v->template_);
        return true;
    }
    static const char *const what[] = {[GW_WAIT_DELETE] = "delete",
                                       [GW_WAIT_PAUSE] = "pause",
                                       [GW_WAIT_RESUME] = "resume",
                                       [GW_WAIT_SUSPEND] = "suspend"};
    for (size_t i = 0; i < c->n_rejects; i++) {
        const reject_t *x = &c->rejects[i];
        if (x->done ||
            (strcmp(x->event_id, w->event_id) != 0 && strcmp(x->corr, w->rq->request_id) != 0))
            continue;
        char extra[128];
        snprintf(extra, sizeof(extra), "\"sandbox_id\":\"%s\"", w->sandbox_id);
        if (x->failed)
            gw_respond_error(w->rq, 500, x->reason, extra, "the %s failed: %s", what[w->kind],
                             x->detail[0] ? x->detail : x->reason);
        else
            gw_respond_error(w->rq, 409, x->reason, extra, "the %s was refused: %s", what[w->kind],
                             x->detail[0] ? x->detail : x->reason);
        return true;
    }
    if (w->kind != GW_WAIT_DELETE && v &&
        (v->state == SP_SBX_FAILED || v->state == SP_SBX_DELETED)) {
        char extra[128];
        snprintf(extra, sizeof(extra), "\"sandbox_id\":\"%s\"", w->sandbox_id);
        gw_respond_error(w->rq, 409,
                         v->state == SP_SBX_FAILED ? "sandbox_failed" : "sandbox_deleted", extra,
                         "the sandbox is %s%s%s", sp_sbx_state_name(v->state),
                         v->failure_reason[0] ? ": " : "", v->failure_reason);
        return true;
    }
    return false;
}

static void check_done(gw_job_t *job)
{
    check_job_t *c = (check_job_t *)job;
    gw_t *gw = job->gw;

    gw->check_running = false;
    if (!c->failed) {
        gw_waiter_t *w = gw->waiters;
        while (w) {
            gw_waiter_t *next = w->next;
            if (settle(w, c))
                waiter_free(gw, w);
            w = next;
        }
    }
    for (size_t i = 0; i < c->n_rows; i++)
        free(c->rows[i].json);
    free(c->rows);
    for (size_t i = 0; i < c->n_rejects; i++) {
        free(c->rejects[i].json);
        free(c->rejects[i].e2b);
    }
    free(c->rejects);
    free(c->stored);
    free(c->stored_ok);
    sp_buf_dispose(&c->ids);
    sp_buf_dispose(&c->event_ids);
    sp_buf_dispose(&c->corr_ids);
    free(c);
    if (gw->check_again) {
        gw->check_again = false;
        gw_waiters_check(gw);
    }
}

void gw_waiters_check(gw_t *gw)
{
    if (gw->n_waiters == 0)
        return;
    if (gw->check_running) {
        gw->check_again = true;
        return;
    }
    check_job_t *c = sp_xcalloc(1, sizeof(*c));
    sp_buf_init(&c->ids);
    sp_buf_init(&c->event_ids);
    sp_buf_init(&c->corr_ids);
    sp_buf_putc(&c->ids, '{');
    sp_buf_putc(&c->event_ids, '{');
    sp_buf_putc(&c->corr_ids, '{');
    size_t n_ev = 0, n_id = 0;
    for (gw_waiter_t *w = gw->waiters; w; w = w->next) {
        /* Ids, event ids and request ids are [a-z0-9_-] and UUID text: array literals need no
         * quoting. */
        sp_buf_printf(&c->ids, "%s%s", n_id++ ? "," : "", w->sandbox_id);
        if (w->kind != GW_WAIT_CREATE && w->event_id[0]) {
            sp_buf_printf(&c->corr_ids, "%s%s", n_ev ? "," : "", w->rq->request_id);
            sp_buf_printf(&c->event_ids, "%s%s", n_ev++ ? "," : "", w->event_id);
            c->any_intent = true;
        }
    }
    sp_buf_putc(&c->ids, '}');
    sp_buf_putc(&c->event_ids, '}');
    sp_buf_putc(&c->corr_ids, '}');
    c->job.run = check_run;
    c->job.done = check_done;
    if (gw_job_submit(gw, &c->job) < 0) {
        /* The queue is full: the once-a-second tick tries again. */
        sp_buf_dispose(&c->ids);
        sp_buf_dispose(&c->event_ids);
        sp_buf_dispose(&c->corr_ids);
        free(c);
        return;
    }
    gw->check_running = true;
}

void gw_wait_register(gw_t *gw, gw_req_t *rq, gw_wait_kind_t kind, const char *sandbox_id,
                      const char *event_id, int timeout_s)
{
    if (gw->stopping) {
        gw_respond_error(rq, 503, "shutting_down", NULL,
                         "the gateway is stopping; sandbox %s was requested", sandbox_id);
        return;
    }
    gw_waiter_t *w = sp_xcalloc(1, sizeof(*w));
    w->rq = rq;
    gw_req_ref(rq);
    w->kind = kind;
    snprintf(w->sandbox_id, sizeof(w->sandbox_id), "%s", sandbox_id);
    snprintf(w->event_id, sizeof(w->event_id), "%s", event_id ? event_id : "");
    w->deadline_ns = sp_mono_ns() + (int64_t)timeout_s * 1000000000LL;
    w->next = gw->waiters;
    if (gw->waiters)
        gw->waiters->prev = w;
    gw->waiters = w;
    gw->n_waiters++;
    gw_waiters_check(gw);
}

/* What a waiter waits for, in its timeout's message. */
static const char *wait_name(gw_wait_kind_t kind)
{
    switch (kind) {
    case GW_WAIT_DELETE:
        return "delete";
    case GW_WAIT_PAUSE:
        return "pause";
    case GW_WAIT_SUSPEND:
        return "suspend";
    case GW_WAIT_STORED:
        return "request";
    case GW_WAIT_SNAPSHOT:
        return "snapshot";
    case GW_WAIT_SNAPSHOT_DELETE:
        return "snapshot's delete";
    default:
        return "resume";
    }
}

void gw_waiters_expire(gw_t *gw)
{
    int64_t now = sp_mono_ns();
    gw_waiter_t *w = gw->waiters;
    while (w) {
        gw_waiter_t *next = w->next;
        if (!gw_req_live(w->rq)) {
            waiter_free(gw, w);
        } else if (now >= w->deadline_ns) {
            char extra[128];
            snprintf(extra, sizeof(extra), "\"sandbox_id\":\"%s\"", w->sandbox_id);
            if (w->kind == GW_WAIT_CREATE)
                gw_respond_error(w->rq, 504, "timeout", extra,
                                 "sandbox %s did not start within %lld s; it may still start: "
                                 "GET /v1/sandboxes/%s",
                                 w->sandbox_id, (long long)gw->cfg->create_timeout_s,
                                 w->sandbox_id);
            else
                gw_respond_error(w->rq, 504, "timeout", extra,
                                 "sandbox %s: the %s did not complete in time; it may still "
                                 "happen: GET /v1/sandboxes/%s",
                                 w->sandbox_id, wait_name(w->kind), w->sandbox_id);
            waiter_free(gw, w);
        }
        w = next;
    }
}

void gw_waiters_abort_all(gw_t *gw)
{
    gw_waiter_t *w = gw->waiters;
    while (w) {
        gw_waiter_t *next = w->next;
        char extra[128];
        snprintf(extra, sizeof(extra), "\"sandbox_id\":\"%s\"", w->sandbox_id);
        gw_respond_error(w->rq, 503, "shutting_down", extra,
                         "the gateway is stopping; the request for sandbox %s may still complete",
                         w->sandbox_id);
        waiter_free(gw, w);
        w = next;
    }
}

void gw_gone_note(gw_t *gw, const char *sandbox_id)
{
    if (!sandbox_id[0] || gw_gone_known(gw, sandbox_id))
        return;
    snprintf(gw->gone[gw->gone_next], sizeof(gw->gone[0]), "%s", sandbox_id);
    gw->gone_next = (gw->gone_next + 1) % GW_GONE_MAX;
    gw_signed_forget(&gw->signed_urls, sandbox_id);
}

bool gw_gone_known(const gw_t *gw, const char *sandbox_id)
{
    for (size_t i = 0; i < GW_GONE_MAX && gw->gone[i][0]; i++)
        if (strcmp(gw->gone[i], sandbox_id) == 0)
            return true;
    return false;
}

/* ---- POST /v1/sandboxes ---- */

typedef enum { C_PUBLISHED = 1, C_REPLAY, C_CONFLICT, C_DB_ERROR, C_BUS_ERROR } create_outcome_t;

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    uint8_t *data;
    size_t len;
    char subject[192];
    char event_id[GW_EVENT_ID_LEN + 1];
    char sandbox_id[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char *idem_key; /* NULL without Idempotency-Key */
    char *env_json; /* environment values, NULL without env: wiped */
    char body_hash[SP_SHA256_HEX_LEN + 1];
    create_outcome_t outcome;
    char existing_id[SP_ID_MAX + 1];
    int bus_rc;
    /* A create from a named snapshot: looked up first (snapshot_run), then built. */
    char *body;
    size_t body_len;
    gw_create_base_t base;
    int base_rc; /* 0 found, SP_ENOTFOUND, SP_EDB */
} create_job_t;

/* Claims the Idempotency-Key for this request, or finds the request that claimed it. Returns
 * 0 when claimed, 1 when answered (replay or conflict), <0 on database failure. */
static int claim_key(create_job_t *c, PGconn *db)
{
    const char *p[4] = {c->tenant, c->idem_key, c->sandbox_id, c->body_hash};
    PGresult *r = query(db,
                        "INSERT INTO idempotency_keys (tenant, key, sandbox_id, request_sha256) "
                        "VALUES ($1, $2, $3, decode($4, 'hex')) ON CONFLICT (tenant, key) DO "
                        "NOTHING RETURNING sandbox_id",
                        4, p);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        log_db_error("idempotency insert", db);
        PQclear(r);
        return SP_EDB;
    }
    int claimed = PQntuples(r) == 1;
    PQclear(r);
    if (claimed)
        return 0;
    r = query(db,
              "SELECT sandbox_id, encode(request_sha256, 'hex') FROM idempotency_keys WHERE "
              "tenant = $1 AND key = $2",
              2, p);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0 || PQntuples(r) != 1) {
        log_db_error("idempotency select", db);
        PQclear(r);
        return SP_EDB;
    }
    snprintf(c->existing_id, sizeof(c->existing_id), "%s", PQgetvalue(r, 0, 0));
    c->outcome = strcmp(PQgetvalue(r, 0, 1), c->body_hash) == 0 ? C_REPLAY : C_CONFLICT;
    PQclear(r);
    return 1;
}

static void create_run(gw_job_t *job, PGconn *db)
{
    create_job_t *c = (create_job_t *)job;
    int rc;

    if (c->idem_key) {
        rc = claim_key(c, db);
        if (rc < 0) {
            c->outcome = C_DB_ERROR;
            return;
        }
        if (rc > 0)
            return;
    }
    if (c->env_json) {
        /* Before the intent: the first command may come as soon as the sandbox runs. */
        const char *p[3] = {c->sandbox_id, c->tenant, c->env_json};
        PGresult *r = query(db,
                            "INSERT INTO sandbox_env (sandbox_id, tenant, env) VALUES ($1, $2, "
                            "$3::jsonb) ON CONFLICT (sandbox_id) DO NOTHING",
                            3, p);
        int erc = sp_db_check(r, PGRES_COMMAND_OK);
        PQclear(r);
        if (erc < 0) {
            log_db_error("sandbox env insert", db);
            c->outcome = C_DB_ERROR;
            return;
        }
    }
    c->bus_rc = sp_bus_publish_retry(job->gw->bus, c->subject, c->data, c->len, c->event_id,
                                     SP_PUBLISH_INTENT_BUDGET_MS, NULL);
    if (c->bus_rc < 0) {
        c->outcome = C_BUS_ERROR;
        if (c->idem_key) {
            /* Nothing was published: free the key so a retry is not stuck waiting. */
            const char *p[3] = {c->tenant, c->idem_key, c->sandbox_id};
            PQclear(query(db,
                          "DELETE FROM idempotency_keys WHERE tenant = $1 AND key = $2 AND "
                          "sandbox_id = $3",
                          3, p));
        }
        return;
    }
    c->outcome = C_PUBLISHED;
}

static void create_free(create_job_t *c)
{
    free(c->body);
    free(c->data);
    free(c->idem_key);
    if (c->env_json) {
        explicit_bzero(c->env_json, strlen(c->env_json));
        free(c->env_json);
    }
    free(c);
}

static void create_done(gw_job_t *job)
{
    create_job_t *c = (create_job_t *)job;
    gw_req_t *rq = c->rq;
    gw_t *gw = job->gw;

    switch (c->outcome) {
    case C_PUBLISHED:
        sp_log(SP_LOG_DEBUG, "create requested", SP_KS("sandbox", c->sandbox_id),
               SP_KS("event_id", c->event_id), SP_KS("request_id", rq->request_id));
        gw_wait_register(gw, rq, GW_WAIT_CREATE, c->sandbox_id, c->event_id,
                         (int)gw->cfg->create_timeout_s);
        break;
    case C_REPLAY:
        gw_wait_register(gw, rq, GW_WAIT_CREATE, c->existing_id, NULL,
                         (int)gw->cfg->create_timeout_s);
        break;
    case C_CONFLICT:
        gw_respond_error(rq, 409, "idempotency_key_reused", NULL,
                         "this Idempotency-Key was used for another request (sandbox %s)",
                         c->existing_id);
        break;
    case C_BUS_ERROR:
        gw->metrics.publish_failures++;
        sp_log(SP_LOG_WARN, "publish failed", SP_KS("sandbox", c->sandbox_id),
               SP_KS("event_id", c->event_id), SP_KS("error", sp_strerror(c->bus_rc)),
               SP_KS("request_id", rq->request_id));
        gw_respond_error(rq, 503, "bus_unavailable", NULL,
                         "the event bus did not accept the request; retry");
        break;
    case C_DB_ERROR:
    default:
        db_unavailable(rq);
        break;
    }
    gw_req_unref(rq);
    create_free(c);
}

static bool idem_key_ok(const char *s, size_t len)
{
    if (len == 0 || len > GW_IDEM_KEY_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] < 0x20 || s[i] > 0x7e)
            return false;
    return true;
}

bool gw_json_content_type(const h2o_iovec_t *ct)
{
    static const char want[] = "application/json";
    const size_t n = sizeof(want) - 1;
    if (ct->len < n || strncasecmp(ct->base, want, n) != 0)
        return false;
    return ct->len == n || ct->base[n] == ';' || ct->base[n] == ' ';
}

static void create_submit(gw_req_t *rq, create_job_t *c);

/* The named snapshot a create restores from, as the log has it for the tenant. */
static void snapshot_run(gw_job_t *job, PGconn *db)
{
    create_job_t *c = (create_job_t *)job;
    sp_envelope_t *se = NULL;
    c->base_rc = sp_db_snapshot_find(db, c->tenant, c->base.snapshot_id, &se);
    if (c->base_rc == 0) {
        const Space__V1__SandboxSnapshotted *sd = se->sandbox_snapshotted;
        snprintf(c->base.template_, sizeof(c->base.template_), "%s", sd->template_);
        if (sd->resources) {
            c->base.vcpu = sd->resources->vcpu;
            c->base.memory_mb = sd->resources->memory_mb;
            c->base.disk_mb = sd->resources->disk_mb;
        }
    } else if (c->base_rc != SP_ENOTFOUND) {
        log_db_error("snapshot lookup", db);
    }
    sp_envelope_free(se);
}

static void snapshot_done(gw_job_t *job)
{
    create_job_t *c = (create_job_t *)job;
    gw_req_t *rq = c->rq;
    const char *code = NULL;
    char err[GW_ERR_MSG_MAX], wanted[SP_SNAPSHOT_ID_LEN + 1] = "";

    if (!gw_req_live(rq)) {
        gw_req_unref(rq);
        create_free(c);
        return;
    }
    if (c->base_rc == SP_ENOTFOUND) {
        gw_respond_error(rq, 404, "snapshot_not_found", NULL,
                         "no snapshot %s (deleted, or never taken by this tenant)",
                         c->base.snapshot_id);
    } else if (c->base_rc < 0) {
        db_unavailable(rq);
    } else if (gw_create_build(rq, c->body, c->body_len, c->sandbox_id, c->idem_key, &c->base,
                               wanted, &c->data, &c->len, c->subject, c->event_id, &c->env_json,
                               &code, err) < 0) {
        gw_respond_error(rq, 400, code, NULL, "%s", err);
    } else {
        c->job.run = create_run;
        c->job.done = create_done;
        create_submit(rq, c);
        gw_req_unref(rq); /* create_submit took its own */
        return;
    }
    gw_req_unref(rq);
    create_free(c);
}

/* Everything after the headers: validation, the intent, the wait. Takes over c. */
static void create_start(gw_req_t *rq, create_job_t *c, const char *body, size_t len)
{
    const char *code = NULL;
    char err[GW_ERR_MSG_MAX], wanted[SP_SNAPSHOT_ID_LEN + 1] = "";

    sp_sandbox_id_new(c->sandbox_id);
    snprintf(c->tenant, sizeof(c->tenant), "%s", rq->tenant);
    int rc = gw_create_build(rq, body, len, c->sandbox_id, c->idem_key, NULL, wanted, &c->data,
                             &c->len, c->subject, c->event_id, &c->env_json, &code, err);
    if (rc < 0) {
        gw_respond_error(rq, 400, code, NULL, "%s", err);
        create_free(c);
        return;
    }
    c->rq = rq;
    if (rc == 1) {
        /* From a named snapshot: looked up first, then built again with it. */
        snprintf(c->base.snapshot_id, sizeof(c->base.snapshot_id), "%s", wanted);
        c->body = sp_xmalloc(len + 1);
        memcpy(c->body, body, len);
        c->body[len] = '\0';
        c->body_len = len;
        c->job.run = snapshot_run;
        c->job.done = snapshot_done;
    } else {
        c->job.run = create_run;
        c->job.done = create_done;
    }
    create_submit(rq, c);
}

static void create_submit(gw_req_t *rq, create_job_t *c)
{
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &c->job) < 0) {
        gw_req_unref(rq);
        overloaded(rq);
        create_free(c);
    }
}

void gw_sandbox_create_body(gw_req_t *rq, const char *body, size_t len)
{
    create_start(rq, sp_xcalloc(1, sizeof(create_job_t)), body, len);
}

void gw_sandbox_create(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    bool dup = false;
    create_job_t *c = sp_xcalloc(1, sizeof(*c));
    const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
    const h2o_iovec_t *ik = gw_req_header(rq, "idempotency-key", &dup);
    const char *body = req->entity.base ? req->entity.base : "";
    size_t len = req->entity.base ? req->entity.len : 0;

    if (ct && !gw_json_content_type(ct)) {
        gw_respond_error(rq, 415, "unsupported_media_type", NULL,
                         "send the body as application/json");
        goto fail;
    }
    if (len > (size_t)rq->gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)rq->gw->cfg->max_body_bytes);
        goto fail;
    }
    if (ik) {
        if (dup || !idem_key_ok(ik->base, ik->len)) {
            gw_respond_error(rq, 400, "invalid_idempotency_key", NULL,
                             "Idempotency-Key must be 1..%d printable ASCII characters, once",
                             GW_IDEM_KEY_MAX);
            goto fail;
        }
        c->idem_key = sp_xstrndup(ik->base, ik->len);
        uint8_t h[SP_SHA256_LEN];
        sp_sha256(body, len, h);
        sp_hex_encode(h, sizeof(h), c->body_hash);
    }
    create_start(rq, c, body, len);
    return;
fail:
    create_free(c);
}

/* ---- GET /v1/sandboxes/{id} ---- */

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    const char *sql;
    const char *params[6];
    int nparams;
    char *p_owned[6];
    int limit; /* list: rows wanted (one more is fetched to know if there is a next page) */
    bool list;
    bool failed;
    int n;
    sp_buf_t out;
} read_job_t;

static void read_run(gw_job_t *job, PGconn *db)
{
    read_job_t *j = (read_job_t *)job;
    PGresult *r = query(db, j->sql, j->nparams, j->params);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        log_db_error(j->list ? "list" : "read", db);
        j->failed = true;
        PQclear(r);
        return;
    }
    int rows = PQntuples(r);
    j->n = rows;
    if (!j->list) {
        if (rows == 1)
            gw_sandbox_json(r, 0, &j->out);
        PQclear(r);
        return;
    }
    int shown = rows > j->limit ? j->limit : rows;
    sp_buf_puts(&j->out, "{\"sandboxes\":[");
    for (int i = 0; i < shown; i++) {
        if (i)
            sp_buf_putc(&j->out, ',');
        gw_sandbox_json(r, i, &j->out);
    }
    sp_buf_puts(&j->out, "],\"next_cursor\":");
    if (rows > j->limit)
        sp_buf_json_str(&j->out, PQgetvalue(r, shown - 1, 0));
    else
        sp_buf_puts(&j->out, "null");
    sp_buf_putc(&j->out, '}');
    PQclear(r);
}

static void read_done(gw_job_t *job)
{
    read_job_t *j = (read_job_t *)job;
    gw_req_t *rq = j->rq;

    if (j->failed)
        db_unavailable(rq);
    else if (!j->list && j->n != 1)
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
    else
        gw_respond_json(rq, 200, &j->out);
    gw_req_unref(rq);
    sp_buf_dispose(&j->out);
    for (size_t i = 0; i < sizeof(j->p_owned) / sizeof(j->p_owned[0]); i++)
        free(j->p_owned[i]);
    free(j);
}

static void read_submit(gw_req_t *rq, read_job_t *j)
{
    j->rq = rq;
    j->job.run = read_run;
    j->job.done = read_done;
    sp_buf_init(&j->out);
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &j->job) < 0) {
        gw_req_unref(rq);
        overloaded(rq);
        for (size_t i = 0; i < sizeof(j->p_owned) / sizeof(j->p_owned[0]); i++)
            free(j->p_owned[i]);
        free(j);
    }
}

void gw_sandbox_get(gw_req_t *rq)
{
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    read_job_t *j = sp_xcalloc(1, sizeof(*j));
    /* Another tenant's sandbox is "not found", exactly like one that does not exist. */
    j->sql = "SELECT " GW_SBX_COLUMNS " FROM sandboxes WHERE id = $1 AND tenant = $2";
    j->params[0] = rq->path_id;
    j->params[1] = rq->tenant;
    j->nparams = 2;
    read_submit(rq, j);
}

/* ---- GET /v1/sandboxes ---- */

void gw_sandbox_list(gw_req_t *rq)
{
    gw_query_t q;
    const char *state = NULL, *cursor = NULL;
    int64_t limit = LIST_LIMIT_DEFAULT;
    sp_buf_t filter;
    int rc = gw_query_parse(rq->req, &q);

    if (rc < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL,
                         rc == -E2BIG ? "more than %d query parameters"
                                      : "malformed query string (limit %d parameters)",
                         GW_QUERY_MAX);
        return;
    }
    sp_buf_init(&filter);
    sp_buf_putc(&filter, '{');
    size_t n_filters = 0;
    for (size_t i = 0; i < q.n; i++) {
        const char *k = q.p[i].key, *v = q.p[i].value;
        if (strcmp(k, "state") == 0) {
            if (sp_sbx_state_from_name(v) == SP_SBX_NONE) {
                gw_respond_error(rq, 400, "invalid_query", NULL, "state: unknown state %s", v);
                goto out;
            }
            state = v;
        } else if (strcmp(k, "limit") == 0) {
            char *end = NULL;
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (errno || !end || *end || end == v || x < 1 || x > LIST_LIMIT_MAX) {
                gw_respond_error(rq, 400, "invalid_query", NULL, "limit must be 1..%d",
                                 LIST_LIMIT_MAX);
                goto out;
            }
            limit = x;
        } else if (strcmp(k, "cursor") == 0) {
            if (!sp_id_valid(v)) {
                gw_respond_error(rq, 400, "invalid_query", NULL, "cursor is not valid");
                goto out;
            }
            cursor = v;
        } else if (strncmp(k, "metadata.", 9) == 0 && k[9] && gw_text_ok(k + 9, 64) &&
                   gw_text_ok(v, 512)) {
            sp_buf_printf(&filter, "%s", n_filters++ ? "," : "");
            sp_buf_json_str(&filter, k + 9);
            sp_buf_putc(&filter, ':');
            sp_buf_json_str(&filter, v);
        } else {
            gw_respond_error(rq, 400, "invalid_query", NULL, "unknown or invalid parameter %s", k);
            goto out;
        }
    }
    sp_buf_putc(&filter, '}');

    read_job_t *j = sp_xcalloc(1, sizeof(*j));
    j->list = true;
    j->limit = (int)limit;
    /* Keyset pagination by id: the cursor is the last id of the previous page. Deleted
     * sandboxes are listed only when asked for by state. Metadata filters are jsonb
     * containment, so every pair must match. */
    j->sql = "SELECT " GW_SBX_COLUMNS " FROM sandboxes WHERE tenant = $1 AND "
             "(($2::text IS NULL AND state <> 'deleted') OR state = $2) AND "
             "metadata @> $3::jsonb AND id > $4 ORDER BY id LIMIT $5";
    j->params[0] = rq->tenant;
    j->params[1] = state; /* NULL: any state but deleted */
    j->p_owned[0] = sp_buf_take(&filter);
    j->params[2] = j->p_owned[0];
    j->p_owned[1] = sp_xstrdup(cursor ? cursor : "");
    j->params[3] = j->p_owned[1];
    j->p_owned[2] = sp_xasprintf("%lld", (long long)limit + 1);
    j->params[4] = j->p_owned[2];
    j->nparams = 5;
    read_submit(rq, j);
out:
    sp_buf_dispose(&filter);
}

/* ---- GET /v1/templates ---- */

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    bool failed;
    sp_buf_t out;
} templates_job_t;

static void templates_run(gw_job_t *job, PGconn *db)
{
    templates_job_t *t = (templates_job_t *)job;
    PGresult *r = PQexec(db, "SELECT DISTINCT t FROM workers, jsonb_array_elements_text(templates) "
                             "AS t WHERE state = 'up' ORDER BY t");
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        log_db_error("templates", db);
        t->failed = true;
        PQclear(r);
        return;
    }
    sp_buf_puts(&t->out, "{\"templates\":[");
    for (int i = 0; i < PQntuples(r); i++) {
        sp_buf_puts(&t->out, i ? ",{\"name\":" : "{\"name\":");
        sp_buf_json_str(&t->out, PQgetvalue(r, i, 0));
        sp_buf_putc(&t->out, '}');
    }
    sp_buf_puts(&t->out, "]}");
    PQclear(r);
}

static void templates_done(gw_job_t *job)
{
    templates_job_t *t = (templates_job_t *)job;
    if (t->failed)
        db_unavailable(t->rq);
    else
        gw_respond_json(t->rq, 200, &t->out);
    gw_req_unref(t->rq);
    sp_buf_dispose(&t->out);
    free(t);
}

void gw_templates(gw_req_t *rq)
{
    templates_job_t *t = sp_xcalloc(1, sizeof(*t));
    t->rq = rq;
    sp_buf_init(&t->out);
    t->job.run = templates_run;
    t->job.done = templates_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &t->job) < 0) {
        gw_req_unref(rq);
        free(t);
        overloaded(rq);
    }
}

/* ---- /healthz ---- */

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    bool pg_ok, nats_ok;
} health_job_t;

static void health_run(gw_job_t *job, PGconn *db)
{
    health_job_t *h = (health_job_t *)job;
    uint64_t seq = 0, msgs = 0;
    PGresult *r = PQexec(db, "SELECT 1");
    h->pg_ok = sp_db_check(r, PGRES_TUPLES_OK) == 0;
    PQclear(r);
    /* A JetStream API round trip: the server is reachable and the stream is there. */
    h->nats_ok = sp_bus_stream_info(job->gw->bus, &seq, &msgs) == 0;
}

static void health_done(gw_job_t *job)
{
    health_job_t *h = (health_job_t *)job;
    if (h->pg_ok && h->nats_ok) {
        static const char ok[] = "{\"status\":\"ok\"}";
        gw_respond(h->rq, 200, "application/json", ok, sizeof(ok) - 1);
    } else {
        gw_respond_error(h->rq, 503, "unavailable", "\"status\":\"unavailable\"",
                         "postgres %s, nats %s", h->pg_ok ? "ok" : "unreachable",
                         h->nats_ok ? "ok" : "unreachable");
    }
    gw_req_unref(h->rq);
    free(h);
}

void gw_health(gw_req_t *rq)
{
    health_job_t *h = sp_xcalloc(1, sizeof(*h));
    h->rq = rq;
    h->job.run = health_run;
    h->job.done = health_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &h->job) < 0) {
        gw_req_unref(rq);
        free(h);
        gw_respond_error(rq, 503, "unavailable", "\"status\":\"overloaded\"",
                         "too many requests are waiting");
    }
}
