/* DELETE /v1/sandboxes/{id}: SandboxDeleteRequested to the owner (the scheduler while it is on
 * no worker), 204 once deleted.
 *
 * POST /v1/sandboxes/{id}/timeout {timeout_s}: a new deadline, timeout_s from now, for a running
 * or paused sandbox (SandboxTimeoutRequested: the log's reducer moves it, the scheduler acts on
 * it); answered once the log stored it.
 *
 * POST /v1/sandboxes/{id}/pause | resume | suspend: the state is checked here first (a 409
 * with the state for a transition that cannot be), then the intent goes to the sandbox's
 * owner (its worker; the scheduler for a suspended sandbox, which lives on no worker), and the
 * answer waits for the outcome in the projection like create and delete do: 200 with the
 * sandbox once it is paused / running / suspended, 409 when the owner refused, 500 when it
 * tried and failed (with the reason), 504 past the deadline. `?wait=false` answers 202 as soon
 * as the intent is on the bus. */
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db.h"
#include "envelope.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "xmalloc.h"

typedef enum { OP_PAUSE = 0, OP_RESUME, OP_SUSPEND, OP_TIMEOUT, OP_DELETE } op_t;

#define CONNECT_SUSPENDING_WAIT_MS 60000
#define CONNECT_SUSPENDING_POLL_MS 100

typedef enum { L_PUBLISHED = 1, L_NOT_FOUND, L_STATE, L_DB_ERROR, L_BUS_ERROR } outcome_t;

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    op_t op;
    bool wait;
    char id[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char actor[SP_ID_MAX + 1];
    char request_id[GW_REQUEST_ID_MAX + 1];
    char event_id[GW_EVENT_ID_LEN + 1];
    char state[32];
    char template_[SP_ID_MAX + 1];
    uint32_t timeout_s;
    bool e2b_connect; /* E2B's connect {"timeout"}: a running sandbox's deadline only grows */
    outcome_t outcome;
    int bus_rc;
} lc_job_t;

static const char *const OP_NAMES[] = {"pause", "resume", "suspend", "set the timeout of",
                                       "delete"};

/* Whether op can start from state, and to whom the intent goes ("" = the scheduler). */
static bool allowed(op_t op, sp_sbx_state_t st, bool *ret_to_scheduler)
{
    *ret_to_scheduler = false;
    switch (op) {
    case OP_PAUSE:
        return st == SP_SBX_RUNNING;
    case OP_SUSPEND:
        return st == SP_SBX_RUNNING || st == SP_SBX_PAUSED;
    case OP_RESUME:
        *ret_to_scheduler = st == SP_SBX_SUSPENDED;
        return st == SP_SBX_PAUSED || st == SP_SBX_SUSPENDED;
    case OP_TIMEOUT:
        return st == SP_SBX_RUNNING || st == SP_SBX_PAUSED;
    case OP_DELETE:
        return true; /* whatever state it is in (the owner refuses what it cannot do) */
    }
    return false;
}

/* The sandbox's state, worker, template and whether its deadline is sooner than timeout_s from
 * now, into l; 0 or the outcome that ends the job. */
static outcome_t lookup(lc_job_t *l, PGconn *db, char worker[SP_ID_MAX + 1], bool *ret_sooner)
{
    char secs[16];
    snprintf(secs, sizeof(secs), "%" PRIu32, l->timeout_s);
    const char *p[3] = {l->id, l->tenant, secs};
    PGresult *r = PQexecParams(db,
                               "SELECT state, coalesce(worker, ''), template, "
                               "timeout_at IS NOT NULL AND timeout_at < now() + "
                               "make_interval(secs => $3::int) FROM sandboxes "
                               "WHERE id = $1 AND tenant = $2",
                               3, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        sp_log(SP_LOG_WARN, "query failed", SP_KS("query", "lifecycle lookup"),
               SP_KS("error", PQerrorMessage(db)));
        PQclear(r);
        return L_DB_ERROR;
    }
    if (PQntuples(r) != 1 || strcmp(PQgetvalue(r, 0, 0), "deleted") == 0) {
        PQclear(r);
        return L_NOT_FOUND;
    }
    snprintf(l->state, sizeof(l->state), "%s", PQgetvalue(r, 0, 0));
    snprintf(worker, SP_ID_MAX + 1, "%s", PQgetvalue(r, 0, 1));
    snprintf(l->template_, sizeof(l->template_), "%s", PQgetvalue(r, 0, 2));
    *ret_sooner = strcmp(PQgetvalue(r, 0, 3), "t") == 0;
    PQclear(r);
    return 0;
}

static void lc_run(gw_job_t *job, PGconn *db)
{
    lc_job_t *l = (lc_job_t *)job;
    char worker[SP_ID_MAX + 1];
    bool sooner = false;
    outcome_t o = lookup(l, db, worker, &sooner);
    /* E2B's connect to a sandbox that is being paused (E2B shows it paused already) waits for
     * the suspend to end and then resumes it, as E2B's connect does: a connect that comes while
     * autoPause suspends the sandbox at its timeout must not fail. A short poll on this pool
     * thread, bounded; past it the 409 says the state. */
    for (int waited = 0; o == 0 && l->e2b_connect && strcmp(l->state, "suspending") == 0 &&
                         waited < CONNECT_SUSPENDING_WAIT_MS;
         waited += CONNECT_SUSPENDING_POLL_MS) {
        usleep(CONNECT_SUSPENDING_POLL_MS * 1000);
        o = lookup(l, db, worker, &sooner);
    }
    if (o != 0) {
        l->outcome = o;
        return;
    }
    /* E2B's connect to a running sandbox with a timeout: the deadline moves to timeout_s from
     * now when that is later (SandboxTimeoutRequested), else the answer is the sandbox. */
    if (l->e2b_connect && l->op == OP_RESUME && l->timeout_s > 0 && sooner &&
        strcmp(l->state, "running") == 0)
        l->op = OP_TIMEOUT;
    bool to_scheduler;
    if (!allowed(l->op, sp_sbx_state_from_name(l->state), &to_scheduler)) {
        l->outcome = L_STATE;
        return;
    }

    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SandboxPauseRequested pause = SPACE__V1__SANDBOX_PAUSE_REQUESTED__INIT;
    Space__V1__SandboxResumeRequested resume = SPACE__V1__SANDBOX_RESUME_REQUESTED__INIT;
    Space__V1__SandboxSuspendRequested suspend = SPACE__V1__SANDBOX_SUSPEND_REQUESTED__INIT;
    Space__V1__SandboxTimeoutRequested timeout = SPACE__V1__SANDBOX_TIMEOUT_REQUESTED__INIT;
    Space__V1__SandboxDeleteRequested del = SPACE__V1__SANDBOX_DELETE_REQUESTED__INIT;
    agg.kind = "sandbox";
    agg.id = l->id;
    env.aggregate = &agg;
    env.tenant = l->tenant;
    env.actor = l->actor;
    env.correlation_id = l->request_id;
    if (l->op == OP_PAUSE) {
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED;
        env.sandbox_pause_requested = &pause;
    } else if (l->op == OP_RESUME) {
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED;
        env.sandbox_resume_requested = &resume;
    } else if (l->op == OP_SUSPEND) {
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED;
        env.sandbox_suspend_requested = &suspend;
    } else if (l->op == OP_TIMEOUT) {
        timeout.timeout_s = l->timeout_s;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_TIMEOUT_REQUESTED;
        env.sandbox_timeout_requested = &timeout;
    } else {
        del.reason = "api";
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED;
        env.sandbox_delete_requested = &del;
    }
    char subject[192];
    uint8_t *data = NULL;
    size_t len = 0;
    sp_envelope_stamp(&env, l->event_id);
    /* The owner's subject: the worker's, or "_" (the scheduler's) while it is on none. */
    int rc = sp_envelope_subject(&env, to_scheduler || !worker[0] ? NULL : worker, subject,
                                 sizeof(subject));
    if (rc >= 0)
        rc = sp_publish_pack(&env, &data, &len);
    if (rc >= 0)
        rc = sp_bus_publish_retry(job->gw->bus, subject, data, len, l->event_id,
                                  SP_PUBLISH_INTENT_BUDGET_MS, NULL);
    free(data);
    l->bus_rc = rc;
    l->outcome = rc < 0 ? L_BUS_ERROR : L_PUBLISHED;
}

static void lc_done(gw_job_t *job)
{
    lc_job_t *l = (lc_job_t *)job;
    gw_req_t *rq = l->rq;
    gw_t *gw = job->gw;
    static const gw_wait_kind_t KIND[] = {GW_WAIT_PAUSE, GW_WAIT_RESUME, GW_WAIT_SUSPEND,
                                          GW_WAIT_STORED, GW_WAIT_DELETE};

    switch (l->outcome) {
    case L_PUBLISHED:
        if (l->op == OP_DELETE)
            gw_gone_note(gw, l->id);
        if (!l->wait) {
            sp_buf_t b;
            sp_buf_init(&b);
            sp_buf_puts(&b, "{\"id\":");
            sp_buf_json_str(&b, l->id);
            sp_buf_printf(&b, ",\"requested\":\"%s\",\"event_id\":", OP_NAMES[l->op]);
            sp_buf_json_str(&b, l->event_id);
            sp_buf_putc(&b, '}');
            gw_respond_json(rq, 202, &b);
            sp_buf_dispose(&b);
        } else {
            gw_wait_register(
                gw, rq, KIND[l->op], l->id, l->event_id,
                (int)(l->op == OP_DELETE ? gw->cfg->delete_timeout_s : gw->cfg->create_timeout_s));
        }
        break;
    case L_NOT_FOUND:
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        break;
    case L_STATE: {
        if (rq->dialect == GW_DIALECT_E2B && l->op == OP_RESUME &&
            strcmp(l->state, "running") == 0) {
            gw_e2b_answer_sandbox(rq, 200, l->id, l->template_); /* E2B: connect to a running one */
            break;
        }
        if (rq->dialect == GW_DIALECT_E2B && l->op == OP_SUSPEND &&
            (strcmp(l->state, "suspended") == 0 || strcmp(l->state, "suspending") == 0)) {
            gw_respond_error(rq, 409, "already_paused", NULL, "sandbox %s is already paused",
                             l->id);
            break;
        }
        sp_buf_t extra;
        sp_buf_init(&extra);
        sp_buf_puts(&extra, "\"state\":");
        sp_buf_json_str(&extra, l->state);
        const char *code =
            l->op == OP_PAUSE && strcmp(l->state, "paused") == 0        ? "already_paused"
            : l->op == OP_SUSPEND && strcmp(l->state, "suspended") == 0 ? "already_suspended"
            : l->op == OP_RESUME && strcmp(l->state, "running") == 0    ? "already_running"
                                                                        : "illegal_transition";
        gw_respond_error(rq, 409, code, extra.data, "cannot %s a sandbox that is %s",
                         OP_NAMES[l->op], l->state);
        sp_buf_dispose(&extra);
        break;
    }
    case L_BUS_ERROR:
        gw->metrics.publish_failures++;
        sp_log(SP_LOG_WARN, "publish failed", SP_KS("sandbox", l->id),
               SP_KS("error", sp_strerror(l->bus_rc)), SP_KS("request_id", rq->request_id));
        gw_respond_error(rq, 503, "bus_unavailable", NULL,
                         "the event bus did not accept the request; retry");
        break;
    case L_DB_ERROR:
    default:
        gw_respond_error(rq, 503, "unavailable", NULL, "the database is not available; retry");
        break;
    }
    gw_req_unref(rq);
    free(l);
}

/* {"timeout_s": 1..2592000}; answers the 4xx itself. */
static int parse_timeout(gw_req_t *rq, uint32_t *ret)
{
    h2o_req_t *req = rq->req;
    const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
    char jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;
    size_t len = req->entity.base ? req->entity.len : 0;
    if (ct && !gw_json_content_type(ct)) {
        gw_respond_error(rq, 415, "unsupported_media_type", NULL,
                         "send the body as application/json");
        return -EINVAL;
    }
    if (len > (size_t)rq->gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)rq->gw->cfg->max_body_bytes);
        return -EINVAL;
    }
    sp_json_limits_t lim = {.max_bytes = 4096, .max_depth = 2, .max_nodes = 8, .max_string = 64};
    if (len == 0 || len > 4096 || sp_json_parse(req->entity.base, len, &lim, &doc, jerr) < 0 ||
        sp_json_type(sp_json_root(doc)) != SP_JSON_OBJECT) {
        sp_json_doc_free(doc);
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body must be {\"timeout_s\": N}");
        return -EINVAL;
    }
    const sp_json_t *root = sp_json_root(doc);
    int64_t v = 0;
    int rc = 0;
    for (size_t i = 0; i < sp_json_len(root) && rc == 0; i++) {
        const char *k = sp_json_key_at(root, i);
        if (strcmp(k, "timeout_s") != 0) {
            gw_respond_error(rq, 400, "unknown_field", NULL, "unknown field %s", k);
            rc = -EINVAL;
        } else if (sp_json_int(sp_json_at(root, i), 1, 2592000, &v) < 0) {
            gw_respond_error(rq, 400, "invalid_field", NULL,
                             "timeout_s must be an integer within 1..2592000");
            rc = -EINVAL;
        }
    }
    if (rc == 0 && v == 0) {
        gw_respond_error(rq, 400, "missing_field", NULL, "timeout_s is required");
        rc = -EINVAL;
    }
    sp_json_doc_free(doc);
    *ret = (uint32_t)v;
    return rc;
}

static lc_job_t *lc_start(gw_req_t *rq, op_t op, bool wait, uint32_t timeout_s)
{
    lc_job_t *l = sp_xcalloc(1, sizeof(*l));
    l->rq = rq;
    l->op = op;
    l->wait = wait;
    l->timeout_s = timeout_s;
    snprintf(l->id, sizeof(l->id), "%s", rq->path_id);
    snprintf(l->tenant, sizeof(l->tenant), "%s", rq->tenant);
    snprintf(l->actor, sizeof(l->actor), "%s", rq->key_id);
    snprintf(l->request_id, sizeof(l->request_id), "%s", rq->request_id);
    l->job.run = lc_run;
    l->job.done = lc_done;
    return l;
}

static void lc_submit(gw_req_t *rq, lc_job_t *l)
{
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &l->job) < 0) {
        gw_req_unref(rq);
        free(l);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
    }
}

void gw_sandbox_delete(gw_req_t *rq)
{
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    lc_submit(rq, lc_start(rq, OP_DELETE, true, 0));
}

void gw_sandbox_set_timeout(gw_req_t *rq, uint32_t timeout_s)
{
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    lc_submit(rq, lc_start(rq, OP_TIMEOUT, true, timeout_s > 2592000 ? 2592000 : timeout_s));
}

void gw_sandbox_connect(gw_req_t *rq, uint32_t timeout_s)
{
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    lc_job_t *l = lc_start(rq, OP_RESUME, true, timeout_s > 2592000 ? 2592000 : timeout_s);
    l->e2b_connect = true;
    lc_submit(rq, l);
}

void gw_sandbox_lifecycle(gw_req_t *rq)
{
    op_t op;
    if (strcmp(rq->path_action, "pause") == 0)
        op = OP_PAUSE;
    else if (strcmp(rq->path_action, "resume") == 0)
        op = OP_RESUME;
    else if (strcmp(rq->path_action, "suspend") == 0)
        op = OP_SUSPEND;
    else
        op = OP_TIMEOUT;
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    uint32_t timeout_s = 0;
    if (op == OP_TIMEOUT && parse_timeout(rq, &timeout_s) < 0)
        return;
    gw_query_t q;
    bool wait = true;
    if (gw_query_parse(rq->req, &q) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "the query string is malformed");
        return;
    }
    for (size_t i = 0; i < q.n; i++) {
        if (strcmp(q.p[i].key, "wait") != 0) {
            gw_respond_error(rq, 400, "unknown_parameter", NULL, "unknown query parameter %s",
                             q.p[i].key);
            return;
        }
        if (strcmp(q.p[i].value, "false") != 0 && strcmp(q.p[i].value, "true") != 0) {
            gw_respond_error(rq, 400, "invalid_parameter", NULL, "wait must be true or false");
            return;
        }
        wait = strcmp(q.p[i].value, "true") == 0;
    }
    lc_submit(rq, lc_start(rq, op, wait, timeout_s));
}
