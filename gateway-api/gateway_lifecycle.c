/* POST /v1/sandboxes/{id}/pause | resume | suspend: the state is checked here first (a 409
 * with the state for a transition that cannot be), then the intent goes to the sandbox's
 * owner (its worker; the scheduler for a suspended sandbox, which lives on no worker), and the
 * answer waits for the outcome in the projection like create and delete do: 200 with the
 * sandbox once it is paused / running / suspended, 409 when the owner refused, 500 when it
 * tried and failed (with the reason), 504 past the deadline. `?wait=false` answers 202 as soon
 * as the intent is on the bus. */
#include "gateway.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "envelope.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

typedef enum { OP_PAUSE = 0, OP_RESUME, OP_SUSPEND } op_t;

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
    outcome_t outcome;
    int bus_rc;
} lc_job_t;

static const char *const OP_NAMES[] = {"pause", "resume", "suspend"};

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
    }
    return false;
}

static void lc_run(gw_job_t *job, PGconn *db)
{
    lc_job_t *l = (lc_job_t *)job;
    const char *p[2] = {l->id, l->tenant};
    char worker[SP_ID_MAX + 1];
    PGresult *r = PQexecParams(db,
                               "SELECT state, coalesce(worker, '') FROM sandboxes WHERE id = $1 "
                               "AND tenant = $2",
                               2, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        sp_log(SP_LOG_WARN, "query failed", SP_KS("query", "lifecycle lookup"),
               SP_KS("error", PQerrorMessage(db)));
        PQclear(r);
        l->outcome = L_DB_ERROR;
        return;
    }
    if (PQntuples(r) != 1 || strcmp(PQgetvalue(r, 0, 0), "deleted") == 0) {
        PQclear(r);
        l->outcome = L_NOT_FOUND;
        return;
    }
    snprintf(l->state, sizeof(l->state), "%s", PQgetvalue(r, 0, 0));
    snprintf(worker, sizeof(worker), "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
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
    } else {
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED;
        env.sandbox_suspend_requested = &suspend;
    }
    char subject[192];
    uint8_t *data = NULL;
    size_t len = 0;
    sp_envelope_stamp(&env, l->event_id);
    int rc = sp_envelope_subject(&env, to_scheduler ? NULL : worker, subject, sizeof(subject));
    if (rc >= 0)
        rc = sp_envelope_encode(&env, &data, &len);
    if (rc >= 0)
        rc = sp_bus_publish(job->gw->bus, subject, data, len, l->event_id, NULL, NULL);
    free(data);
    l->bus_rc = rc;
    l->outcome = rc < 0 ? L_BUS_ERROR : L_PUBLISHED;
}

static void lc_done(gw_job_t *job)
{
    lc_job_t *l = (lc_job_t *)job;
    gw_req_t *rq = l->rq;
    gw_t *gw = job->gw;
    static const gw_wait_kind_t KIND[] = {GW_WAIT_PAUSE, GW_WAIT_RESUME, GW_WAIT_SUSPEND};

    switch (l->outcome) {
    case L_PUBLISHED:
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
            gw_wait_register(gw, rq, KIND[l->op], l->id, l->event_id,
                             (int)gw->cfg->create_timeout_s);
        }
        break;
    case L_NOT_FOUND:
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        break;
    case L_STATE: {
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

void gw_sandbox_lifecycle(gw_req_t *rq)
{
    op_t op;
    if (strcmp(rq->path_action, "pause") == 0)
        op = OP_PAUSE;
    else if (strcmp(rq->path_action, "resume") == 0)
        op = OP_RESUME;
    else
        op = OP_SUSPEND;
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
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
    lc_job_t *l = sp_xcalloc(1, sizeof(*l));
    l->rq = rq;
    l->op = op;
    l->wait = wait;
    snprintf(l->id, sizeof(l->id), "%s", rq->path_id);
    snprintf(l->tenant, sizeof(l->tenant), "%s", rq->tenant);
    snprintf(l->actor, sizeof(l->actor), "%s", rq->key_id);
    snprintf(l->request_id, sizeof(l->request_id), "%s", rq->request_id);
    l->job.run = lc_run;
    l->job.done = lc_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &l->job) < 0) {
        gw_req_unref(rq);
        free(l);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
    }
}
