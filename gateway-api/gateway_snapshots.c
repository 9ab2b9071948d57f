/* Named snapshots (docs/snapshots.md).
 *
 * POST /v1/sandboxes/{id}/snapshots {"name"?}: a running sandbox of the tenant; the gateway
 *   picks the snapshot id, sends SandboxSnapshotRequested to the sandbox's worker and answers
 *   201 with the snapshot once SandboxSnapshotted answers it (409 with the reason when the
 *   worker refused, 504 past the create timeout).
 * GET /v1/snapshots: the tenant's snapshots, from the log (db.h sp_db_snapshot_each).
 * DELETE /v1/snapshots/{id}: SnapshotDeleteRequested to the worker that took it; 204 once
 *   SnapshotDeleted (its artifacts are gone). From the moment the intent is in the log, no
 *   create may use the snapshot.
 * POST /v1/sandboxes {"snapshot": "<id>"} is the create (gateway_sandboxes.c). */
#include "gateway.h"

#include <errno.h>
#include <stdarg.h>
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

typedef enum { S_PUBLISHED = 1, S_NOT_FOUND, S_STATE, S_DB_ERROR, S_BUS_ERROR, S_LISTED } outcome_t;

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    char sandbox_id[SP_ID_MAX + 1];
    char snapshot_id[SP_SNAPSHOT_ID_LEN + 1];
    char name[SP_SNAPSHOT_NAME_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char actor[SP_ID_MAX + 1];
    char request_id[GW_REQUEST_ID_MAX + 1];
    char event_id[GW_EVENT_ID_LEN + 1];
    char state[32];
    outcome_t outcome;
    int bus_rc;
    sp_buf_t out; /* the list */
    /* E2B's list is paged (the SDK's SnapshotPaginator): the matching snapshots are gathered,
     * ordered by id, and limit of those after the cursor (an id, the nextToken) answered; the
     * last one's id is the next token when more follow. Ordering by id keeps a page boundary
     * stable when snapshots are added or deleted between pages. */
    struct snap_item {
        char id[SP_SNAPSHOT_ID_LEN + 1];
        sp_buf_t json;
    } * items;
    size_t n_items, cap_items;
    int64_t limit;
    char cursor[SP_SNAPSHOT_ID_LEN + 1];
    char next[SP_SNAPSHOT_ID_LEN + 1];
} snap_job_t;

#define SNAP_LIMIT_DEF 100
#define SNAP_LIMIT_MAX 1000

void gw_snapshot_json(const sp_envelope_t *ev, int64_t at_us, sp_buf_t *b)
{
    const Space__V1__SandboxSnapshotted *sd = ev->sandbox_snapshotted;
    uint64_t size = 0;
    for (size_t i = 0; i < sd->n_artifacts; i++)
        size += sd->artifacts[i]->size;
    sp_buf_puts(b, "{\"snapshot_id\":");
    sp_buf_json_str(b, sd->snapshot_id);
    sp_buf_puts(b, ",\"name\":");
    sp_buf_json_str(b, sd->name);
    sp_buf_puts(b, ",\"sandbox_id\":");
    sp_buf_json_str(b, ev->aggregate->id);
    sp_buf_puts(b, ",\"template\":");
    sp_buf_json_str(b, sd->template_);
    sp_buf_printf(b, ",\"size_bytes\":%llu,\"created_at\":", (unsigned long long)size);
    gw_json_time(b, at_us);
    sp_buf_putc(b, '}');
}

void gw_snapshot_json_e2b(const sp_envelope_t *ev, sp_buf_t *b)
{
    sp_buf_puts(b, "{\"snapshotID\":");
    sp_buf_json_str(b, ev->sandbox_snapshotted->snapshot_id);
    sp_buf_puts(b, ",\"names\":[");
    sp_buf_json_str(b, ev->sandbox_snapshotted->name);
    sp_buf_puts(b, "]}");
}

/* Publishes env (stamped here) on the subject of worker; the outcome into s. */
static void publish(snap_job_t *s, sp_envelope_t *env, const char *worker)
{
    char subject[192];
    uint8_t *data = NULL;
    size_t len = 0;
    env->tenant = s->tenant;
    env->actor = s->actor;
    env->correlation_id = s->request_id;
    sp_envelope_stamp(env, s->event_id);
    int rc = sp_envelope_subject(env, worker, subject, sizeof(subject));
    if (rc >= 0)
        rc = sp_publish_pack(env, &data, &len);
    if (rc >= 0)
        rc = sp_bus_publish_retry(s->job.gw->bus, subject, data, len, s->event_id,
                                  SP_PUBLISH_INTENT_BUDGET_MS, NULL);
    free(data);
    s->bus_rc = rc;
    s->outcome = rc < 0 ? S_BUS_ERROR : S_PUBLISHED;
}

static void take_run(gw_job_t *job, PGconn *db)
{
    (void)db;
    snap_job_t *s = (snap_job_t *)job;
    gw_sandbox_loc_t loc;
    gw_sandbox_locate(job, s->sandbox_id, s->tenant, &loc);
    if (loc.failed) {
        s->outcome = S_DB_ERROR;
        return;
    }
    if (!loc.found || strcmp(loc.state, "deleted") == 0) {
        s->outcome = S_NOT_FOUND;
        return;
    }
    snprintf(s->state, sizeof(s->state), "%s", loc.state);
    const char *worker = loc.worker;
    if (strcmp(s->state, "running") != 0 || !worker[0]) {
        s->outcome = S_STATE;
        return;
    }
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SandboxSnapshotRequested req = SPACE__V1__SANDBOX_SNAPSHOT_REQUESTED__INIT;
    agg.kind = "sandbox";
    agg.id = s->sandbox_id;
    env.aggregate = &agg;
    req.snapshot_id = s->snapshot_id;
    req.name = s->name;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOT_REQUESTED;
    env.sandbox_snapshot_requested = &req;
    publish(s, &env, worker);
}

static void delete_run(gw_job_t *job, PGconn *db)
{
    snap_job_t *s = (snap_job_t *)job;
    sp_envelope_t *se = NULL;
    int rc = sp_db_snapshot_find(db, s->tenant, s->snapshot_id, &se);
    if (rc < 0) {
        s->outcome = rc == SP_ENOTFOUND ? S_NOT_FOUND : S_DB_ERROR;
        return;
    }
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", se->aggregate->id);
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SnapshotDeleteRequested req = SPACE__V1__SNAPSHOT_DELETE_REQUESTED__INIT;
    agg.kind = "sandbox";
    agg.id = s->sandbox_id;
    env.aggregate = &agg;
    req.snapshot_id = s->snapshot_id;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETE_REQUESTED;
    env.snapshot_delete_requested = &req;
    /* To the worker that took it: it stored the artifacts. When it is not live (its host may
     * be gone for good), to a live one, which removes them from the shared store (and its own
     * copy); the log accepts that worker's SnapshotDeleted then (trust.h worker_live). None
     * live: to the taker, for when it comes back. */
    const char *to = se->sandbox_snapshotted->worker;
    char live[SP_INSTANCE_MAX + 1] = "";
    if (sp_db_worker_live(db, to) == 0 && sp_db_live_worker(db, live, sizeof(live)) == 1)
        to = live;
    publish(s, &env, to);
    sp_envelope_free(se);
}

static int list_one(void *arg, const sp_envelope_t *ev, int64_t at_us)
{
    snap_job_t *s = arg;
    /* E2B's filters (listSnapshots({sandboxId, name})) in sandbox_id and name. */
    if ((s->sandbox_id[0] && strcmp(ev->aggregate->id, s->sandbox_id) != 0) ||
        (s->name[0] && strcmp(ev->sandbox_snapshotted->name, s->name) != 0))
        return 0;
    if (s->rq->dialect == GW_DIALECT_E2B) {
        if (s->cursor[0] && strcmp(ev->sandbox_snapshotted->snapshot_id, s->cursor) <= 0)
            return 0; /* on an earlier page */
        if (s->n_items == s->cap_items) {
            s->cap_items = s->cap_items ? s->cap_items * 2 : 16;
            s->items = sp_xrealloc(s->items, s->cap_items * sizeof(*s->items));
        }
        struct snap_item *it = &s->items[s->n_items++];
        snprintf(it->id, sizeof(it->id), "%s", ev->sandbox_snapshotted->snapshot_id);
        sp_buf_init(&it->json);
        gw_snapshot_json_e2b(ev, &it->json);
        return 0;
    }
    if (s->out.len > 1)
        sp_buf_putc(&s->out, ',');
    gw_snapshot_json(ev, at_us, &s->out);
    return 0;
}

static int by_id(const void *a, const void *b)
{
    return strcmp(((const struct snap_item *)a)->id, ((const struct snap_item *)b)->id);
}

static void items_free(snap_job_t *s)
{
    for (size_t i = 0; i < s->n_items; i++)
        sp_buf_dispose(&s->items[i].json);
    free(s->items);
    s->items = NULL;
    s->n_items = s->cap_items = 0;
}

static void list_run(gw_job_t *job, PGconn *db)
{
    snap_job_t *s = (snap_job_t *)job;
    sp_buf_puts(&s->out, "[");
    if (sp_db_snapshot_each(db, s->tenant, list_one, s) < 0) {
        items_free(s);
        s->outcome = S_DB_ERROR;
        return;
    }
    if (s->items) {
        qsort(s->items, s->n_items, sizeof(*s->items), by_id);
        size_t shown = s->n_items < (size_t)s->limit ? s->n_items : (size_t)s->limit;
        for (size_t i = 0; i < shown; i++) {
            if (i)
                sp_buf_putc(&s->out, ',');
            sp_buf_append(&s->out, s->items[i].json.data, s->items[i].json.len);
        }
        if (shown < s->n_items)
            snprintf(s->next, sizeof(s->next), "%s", s->items[shown - 1].id);
        items_free(s);
    }
    sp_buf_puts(&s->out, "]");
    s->outcome = S_LISTED;
}

static void snap_done(gw_job_t *job)
{
    snap_job_t *s = (snap_job_t *)job;
    gw_req_t *rq = s->rq;
    gw_t *gw = job->gw;
    bool deleting = job->run == delete_run;

    switch (s->outcome) {
    case S_LISTED: {
        if (rq->dialect == GW_DIALECT_E2B) { /* a bare array, a page of it */
            if (s->next[0] && gw_req_live(rq))
                h2o_add_header_by_str(
                    &rq->req->pool, &rq->req->res.headers, H2O_STRLIT("x-next-token"), 0, NULL,
                    h2o_strdup(&rq->req->pool, s->next, strlen(s->next)).base, strlen(s->next));
            gw_respond_json(rq, 200, &s->out);
            break;
        }
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_puts(&b, "{\"snapshots\":");
        sp_buf_append(&b, s->out.data, s->out.len);
        sp_buf_putc(&b, '}');
        gw_respond_json(rq, 200, &b);
        sp_buf_dispose(&b);
        break;
    }
    case S_PUBLISHED:
        gw_wait_register(gw, rq, deleting ? GW_WAIT_SNAPSHOT_DELETE : GW_WAIT_SNAPSHOT,
                         s->sandbox_id, s->event_id, (int)gw->cfg->create_timeout_s);
        break;
    case S_NOT_FOUND:
        if (deleting)
            gw_respond_error(rq, 404, "snapshot_not_found", NULL, "no such snapshot");
        else
            gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        break;
    case S_STATE: {
        sp_buf_t extra;
        sp_buf_init(&extra);
        sp_buf_puts(&extra, "\"state\":");
        sp_buf_json_str(&extra, s->state);
        gw_respond_error(rq, 409, "illegal_transition", extra.data,
                         "cannot snapshot a sandbox that is %s (only a running one)", s->state);
        sp_buf_dispose(&extra);
        break;
    }
    case S_BUS_ERROR:
        gw->metrics.publish_failures++;
        sp_log(SP_LOG_WARN, "publish failed", SP_KS("snapshot", s->snapshot_id),
               SP_KS("error", sp_strerror(s->bus_rc)), SP_KS("request_id", rq->request_id));
        gw_respond_error(rq, 503, "bus_unavailable", NULL,
                         "the event bus did not accept the request; retry");
        break;
    case S_DB_ERROR:
    default:
        gw_respond_error(rq, 503, "unavailable", NULL, "the database is not available; retry");
        break;
    }
    gw_req_unref(rq);
    sp_buf_dispose(&s->out);
    free(s);
}

static snap_job_t *snap_new(gw_req_t *rq, void (*run)(gw_job_t *, PGconn *))
{
    snap_job_t *s = sp_xcalloc(1, sizeof(*s));
    s->rq = rq;
    sp_buf_init(&s->out);
    snprintf(s->tenant, sizeof(s->tenant), "%s", rq->tenant);
    snprintf(s->actor, sizeof(s->actor), "%s", rq->key_id);
    snprintf(s->request_id, sizeof(s->request_id), "%s", rq->request_id);
    s->job.run = run;
    s->job.done = snap_done;
    return s;
}

static void snap_submit(gw_req_t *rq, snap_job_t *s)
{
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &s->job) < 0) {
        gw_req_unref(rq);
        sp_buf_dispose(&s->out);
        free(s);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
    }
}

/* {"name"?: 1..SP_SNAPSHOT_NAME_MAX printable ASCII}, an empty body too; answers the 4xx
 * itself. */
static int parse_take(gw_req_t *rq, char name[SP_SNAPSHOT_NAME_MAX + 1])
{
    h2o_req_t *req = rq->req;
    const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
    size_t len = req->entity.base ? req->entity.len : 0;
    name[0] = '\0';
    if (len == 0)
        return 0;
    if (ct && !gw_json_content_type(ct)) {
        gw_respond_error(rq, 415, "unsupported_media_type", NULL,
                         "send the body as application/json");
        return -EINVAL;
    }
    char jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;
    sp_json_limits_t lim = {.max_bytes = 4096, .max_depth = 2, .max_nodes = 8, .max_string = 256};
    if (len > 4096 || sp_json_parse(req->entity.base, len, &lim, &doc, jerr) < 0 ||
        sp_json_type(sp_json_root(doc)) != SP_JSON_OBJECT) {
        sp_json_doc_free(doc);
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body must be {\"name\": \"...\"}");
        return -EINVAL;
    }
    const sp_json_t *root = sp_json_root(doc);
    int rc = 0;
    for (size_t i = 0; i < sp_json_len(root) && rc == 0; i++) {
        const char *k = sp_json_key_at(root, i);
        const char *v = sp_json_str(sp_json_at(root, i), NULL);
        if (strcmp(k, "name") != 0) {
            gw_respond_error(rq, 400, "unknown_field", NULL, "unknown field %s", k);
            rc = -EINVAL;
        } else if (!v || !sp_snapshot_name_valid(v)) {
            gw_respond_error(rq, 400, "invalid_field", NULL,
                             "name must be 1..%d printable ASCII characters", SP_SNAPSHOT_NAME_MAX);
            rc = -EINVAL;
        } else {
            snprintf(name, SP_SNAPSHOT_NAME_MAX + 1, "%s", v);
        }
    }
    sp_json_doc_free(doc);
    return rc;
}

void gw_snapshot_take(gw_req_t *rq)
{
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    char name[SP_SNAPSHOT_NAME_MAX + 1];
    if (parse_take(rq, name) < 0)
        return;
    snap_job_t *s = snap_new(rq, take_run);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", rq->path_id);
    sp_snapshot_id_new(s->snapshot_id);
    snprintf(s->name, sizeof(s->name), "%s", name[0] ? name : s->snapshot_id);
    snap_submit(rq, s);
}

void gw_snapshot_list(gw_req_t *rq)
{
    snap_job_t *s = snap_new(rq, list_run);
    gw_query_t q;
    if (gw_query_parse(rq->req, &q) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "the query string is malformed");
        sp_buf_dispose(&s->out);
        free(s);
        return;
    }
    s->limit = SNAP_LIMIT_DEF;
    for (size_t i = 0; i < q.n; i++) {
        const char *k = q.p[i].key, *v = q.p[i].value;
        bool e2b = rq->dialect == GW_DIALECT_E2B;
        if (e2b && strcmp(k, "limit") == 0) {
            char *end = NULL;
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (errno || end == v || *end || x < 1 || x > SNAP_LIMIT_MAX) {
                gw_respond_error(rq, 400, "invalid_query", NULL, "limit must be 1..%d",
                                 SNAP_LIMIT_MAX);
                sp_buf_dispose(&s->out);
                free(s);
                return;
            }
            s->limit = x;
        } else if (e2b && strcmp(k, "nextToken") == 0) {
            if (v[0] && !sp_snapshot_id_valid(v)) {
                gw_respond_error(rq, 400, "invalid_query", NULL, "nextToken is not valid");
                sp_buf_dispose(&s->out);
                free(s);
                return;
            }
            snprintf(s->cursor, sizeof(s->cursor), "%s", v);
        } else if (strcmp(q.p[i].key, "sandboxID") == 0 && rq->dialect == GW_DIALECT_E2B)
            snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%.64s", q.p[i].value);
        else if (strcmp(q.p[i].key, "name") == 0 && rq->dialect == GW_DIALECT_E2B)
            snprintf(s->name, sizeof(s->name), "%.64s", q.p[i].value);
        else if (rq->dialect != GW_DIALECT_E2B) {
            gw_respond_error(rq, 400, "unknown_parameter", NULL, "unknown query parameter %s",
                             q.p[i].key);
            sp_buf_dispose(&s->out);
            free(s);
            return;
        } /* other E2B parameters are ignored, as E2B's API does */
    }
    snap_submit(rq, s);
}

void gw_snapshot_delete(gw_req_t *rq)
{
    if (!sp_snapshot_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "snapshot_not_found", NULL, "no such snapshot");
        return;
    }
    snap_job_t *s = snap_new(rq, delete_run);
    snprintf(s->snapshot_id, sizeof(s->snapshot_id), "%.30s", rq->path_id);
    snap_submit(rq, s);
}

/* ---- fork (docs/snapshots.md, "Fork") ----
 * One anonymous snapshot, then count creates from it, then the snapshot is deleted (the copies
 * share nothing with it or each other: each received its own disk and loaded the image). The
 * whole fork runs as one job on a pool connection, polling the log for each step's outcome. */

#define FORK_POLL_MS 25

typedef struct {
    snap_job_t s;
    uint32_t count;
    int status; /* the answer */
    char code[64];
    sp_buf_t body;
    char (*ids)[SP_SANDBOX_ID_LEN + 1]; /* the copies, and whether each runs */
    bool *running;
    char template_[SP_ID_MAX + 1];
} fork_job_t;

static void fork_fail(fork_job_t *f, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fork_fail(fork_job_t *f, int status, const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    f->status = status;
    snprintf(f->code, sizeof(f->code), "%s", code);
    sp_buf_reset(&f->body);
    sp_buf_puts(&f->body, msg);
}

/* The answer to the snapshot intent: 1 with *ret when SandboxSnapshotted, 0 when refused (f
 * answered), -1 past the deadline or on a database error (f answered). */
static int fork_wait_snapshot(fork_job_t *f, PGconn *db, int64_t deadline_ns, sp_envelope_t **ret)
{
    const char *p[2] = {f->s.event_id, f->s.sandbox_id};
    while (sp_mono_ns() < deadline_ns) {
        PGresult *r = PQexecParams(db,
                                   "SELECT payload FROM events WHERE causation_id = $1::uuid AND "
                                   "status = 'accepted' AND type IN ('SandboxSnapshotted', "
                                   "'SandboxRequestRejected', 'SandboxFailed') AND aggregate_id = "
                                   "$2 LIMIT 1",
                                   2, NULL, p, NULL, NULL, 1);
        if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
            PQclear(r);
            fork_fail(f, 503, "unavailable", "the database is not available; retry");
            return -1;
        }
        sp_envelope_t *e = NULL;
        char why[SP_REASON_MAX];
        if (PQntuples(r) == 1 && sp_envelope_decode((const uint8_t *)PQgetvalue(r, 0, 0),
                                                    (size_t)PQgetlength(r, 0, 0), &e, why) == 0) {
            PQclear(r);
            if (e->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOTTED) {
                *ret = e;
                return 1;
            }
            if (e->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED)
                fork_fail(f, 409, e->sandbox_request_rejected->reason,
                          "the checkpoint of the fork was refused: %s",
                          e->sandbox_request_rejected->detail);
            else
                fork_fail(f, 500, "sandbox_failed", "the sandbox failed during its checkpoint: %s",
                          e->sandbox_failed->detail);
            sp_envelope_free(e);
            return 0;
        }
        PQclear(r);
        usleep(FORK_POLL_MS * 1000);
    }
    fork_fail(f, 504, "timeout", "the checkpoint of the fork did not finish in time");
    return -1;
}

/* Waits until every sandbox of ids (a text[] literal) is out of requested/placed; the count
 * still starting, or < 0 on a database error. */
static int fork_wait_started(PGconn *db, const char *ids, int64_t deadline_ns)
{
    const char *p[1] = {ids};
    int left = -1;
    while (sp_mono_ns() < deadline_ns) {
        /* One statement, one snapshot: the rows appear when the log stored the creates (none at
         * all is not yet either), and two queries could see a row absent in the first and
         * present, still requested, in the second. */
        PGresult *r = PQexecParams(db,
                                   "SELECT count(*) FILTER (WHERE state IN ('requested', "
                                   "'placed')), count(*) FROM sandboxes WHERE id = "
                                   "ANY($1::text[])",
                                   1, NULL, p, NULL, NULL, 0);
        if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
            PQclear(r);
            return SP_EDB;
        }
        left = (int)strtol(PQgetvalue(r, 0, 0), NULL, 10);
        int have = (int)strtol(PQgetvalue(r, 0, 1), NULL, 10);
        PQclear(r);
        size_t want = 1;
        for (const char *c = ids; *c; c++)
            want += *c == ',';
        if (left == 0 && have == (int)want)
            return 0;
        usleep(FORK_POLL_MS * 1000);
    }
    return left < 0 ? 1 : left;
}

/* The network policy sandbox sbx runs with now: the last one egressd applied to it
 * (NetworkPolicyChanged), else its create's; NULL when the log has neither. It points into
 * *ret_ev, which the caller frees. */
static const Space__V1__NetworkPolicy *source_policy(PGconn *db, const char *sbx,
                                                     sp_envelope_t **ret_ev)
{
    sp_envelope_t *ev = NULL;
    *ret_ev = NULL;
    if (sp_db_last_sandbox_event(db, sbx, "NetworkPolicyChanged", &ev) == 0 &&
        ev->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_CHANGED &&
        ev->network_policy_changed->network) {
        *ret_ev = ev;
        return ev->network_policy_changed->network;
    }
    sp_envelope_free(ev);
    ev = NULL;
    if (sp_db_last_sandbox_event(db, sbx, "SandboxCreateRequested", &ev) == 0 &&
        ev->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED &&
        ev->sandbox_create_requested->network) {
        *ret_ev = ev;
        return ev->sandbox_create_requested->network;
    }
    sp_envelope_free(ev);
    return NULL;
}

static void fork_run(gw_job_t *job, PGconn *db)
{
    fork_job_t *f = (fork_job_t *)job;
    snap_job_t *s = &f->s;
    gw_t *gw = job->gw;
    int64_t t0 = sp_mono_ns();
    int64_t deadline = t0 + (int64_t)gw->cfg->create_timeout_s * 1000000000LL;
    sp_envelope_t *se = NULL;
    char **ids = NULL;

    take_run(job, db); /* the anonymous snapshot's intent, to the sandbox's worker */
    if (s->outcome == S_NOT_FOUND) {
        fork_fail(f, 404, "not_found", "no such sandbox");
        return;
    }
    if (s->outcome == S_STATE) {
        fork_fail(f, 409, "illegal_transition", "cannot fork a sandbox that is %s", s->state);
        return;
    }
    if (s->outcome != S_PUBLISHED) {
        fork_fail(f, 503, s->outcome == S_BUS_ERROR ? "bus_unavailable" : "unavailable",
                  "the request could not be sent; retry");
        return;
    }
    if (fork_wait_snapshot(f, db, deadline, &se) <= 0)
        return;
    int64_t snapshot_ms = (sp_mono_ns() - t0) / 1000000;
    const Space__V1__SandboxSnapshotted *sd = se->sandbox_snapshotted;
    gw_create_base_t base = {0};
    snprintf(base.snapshot_id, sizeof(base.snapshot_id), "%s", s->snapshot_id);
    snprintf(base.template_, sizeof(base.template_), "%s", sd->template_);
    snprintf(f->template_, sizeof(f->template_), "%s", sd->template_);
    if (sd->resources) {
        base.vcpu = sd->resources->vcpu;
        base.memory_mb = sd->resources->memory_mb;
        base.disk_mb = sd->resources->disk_mb;
    }
    /* The copies: creates from the snapshot, as POST /v1/sandboxes {"snapshot"} makes them,
     * with the source's network policy as it is now (the last one egressd applied, else the
     * create's), and no project: no credential binding follows. */
    sp_envelope_t *pol = NULL;
    base.network = source_policy(db, s->sandbox_id, &pol);
    char body[96];
    int blen = snprintf(body, sizeof(body), "{\"snapshot\":\"%s\"}", s->snapshot_id);
    ids = sp_xcalloc(f->count, sizeof(*ids));
    sp_buf_t lit;
    sp_buf_init(&lit);
    sp_buf_putc(&lit, '{');
    int rc = 0;
    for (uint32_t i = 0; i < f->count && rc == 0; i++) {
        char sbx[SP_SANDBOX_ID_LEN + 1], subject[192], event_id[GW_EVENT_ID_LEN + 1],
            err[GW_ERR_MSG_MAX], wanted[SP_SNAPSHOT_ID_LEN + 1];
        const char *code = NULL;
        uint8_t *data = NULL;
        size_t len = 0;
        char *env_json = NULL;
        sp_sandbox_id_new(sbx);
        ids[i] = sp_xstrdup(sbx);
        snprintf(f->ids[i], sizeof(f->ids[i]), "%s", sbx);
        rc = gw_create_build(s->rq, body, (size_t)blen, sbx, NULL, &base, wanted, &data, &len,
                             subject, event_id, &env_json, &code, err);
        if (rc == 0)
            rc = sp_bus_publish_retry(gw->bus, subject, data, len, event_id,
                                      SP_PUBLISH_INTENT_BUDGET_MS, NULL);
        free(data);
        free(env_json);
        sp_buf_printf(&lit, "%s%s", i ? "," : "", sbx);
    }
    sp_buf_putc(&lit, '}');
    if (rc < 0) {
        fork_fail(f, 503, "bus_unavailable", "the copies could not all be requested; retry");
    } else {
        int left = fork_wait_started(db, lit.data, deadline);
        const char *p[1] = {lit.data};
        PGresult *r = left < 0 ? NULL
                               : PQexecParams(db,
                                              "SELECT " GW_SBX_COLUMNS " FROM sandboxes WHERE id "
                                              "= ANY($1::text[]) ORDER BY id",
                                              1, NULL, p, NULL, NULL, 0);
        if (!r || sp_db_check(r, PGRES_TUPLES_OK) < 0) {
            fork_fail(f, 503, "unavailable", "the database is not available");
        } else {
            int running = 0;
            sp_buf_reset(&f->body);
            sp_buf_puts(&f->body, "{\"snapshot_id\":");
            sp_buf_json_str(&f->body, s->snapshot_id);
            sp_buf_puts(&f->body, ",\"sandbox_ids\":[");
            for (uint32_t i = 0; i < f->count; i++) {
                sp_buf_puts(&f->body, i ? "," : "");
                sp_buf_json_str(&f->body, ids[i]);
            }
            sp_buf_puts(&f->body, "],\"sandboxes\":[");
            for (int i = 0; i < PQntuples(r); i++) {
                if (i)
                    sp_buf_putc(&f->body, ',');
                gw_sandbox_json(r, i, &f->body);
                bool up = strcmp(PQgetvalue(r, i, 3), "running") == 0;
                running += up;
                for (uint32_t k = 0; k < f->count; k++)
                    if (strcmp(f->ids[k], PQgetvalue(r, i, 0)) == 0)
                        f->running[k] = up;
            }
            int64_t ms = (sp_mono_ns() - t0) / 1000000;
            sp_buf_printf(&f->body, "],\"snapshot_ms\":%lld,\"took_ms\":%lld}",
                          (long long)snapshot_ms, (long long)ms);
            f->status = running == (int)f->count ? 201 : left > 0 ? 504 : 500;
            snprintf(f->code, sizeof(f->code), "%s",
                     f->status == 201 ? ""
                     : left > 0       ? "timeout"
                                      : "fork_partial");
            sp_log(SP_LOG_INFO, "forked", SP_KS("sandbox", s->sandbox_id), SP_KU("count", f->count),
                   SP_KI("running", running), SP_KI("snapshot_ms", snapshot_ms), SP_KI("ms", ms));
        }
        PQclear(r);
    }
    sp_buf_dispose(&lit);
    /* The anonymous snapshot has served: the copies have their own disks and memory. */
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SnapshotDeleteRequested del = SPACE__V1__SNAPSHOT_DELETE_REQUESTED__INIT;
    agg.kind = "sandbox";
    agg.id = s->sandbox_id;
    env.aggregate = &agg;
    del.snapshot_id = s->snapshot_id;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETE_REQUESTED;
    env.snapshot_delete_requested = &del;
    char keep_event[GW_EVENT_ID_LEN + 1];
    memcpy(keep_event, s->event_id, sizeof(keep_event));
    publish(s, &env, sd->worker);
    memcpy(s->event_id, keep_event, sizeof(keep_event));
    for (uint32_t i = 0; i < f->count; i++)
        free(ids[i]);
    free(ids);
    sp_envelope_free(pol);
    sp_envelope_free(se);
}

static void fork_done(gw_job_t *job)
{
    fork_job_t *f = (fork_job_t *)job;
    gw_req_t *rq = f->s.rq;
    if (gw_req_live(rq) && rq->dialect == GW_DIALECT_E2B && f->ids[0][0] &&
        (f->status == 201 || (f->body.data && f->body.data[0] == '{'))) {
        /* E2B's fork answer: one entry per copy, {"sandbox"} or {"error"}. */
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_putc(&b, '[');
        for (uint32_t i = 0; i < f->count; i++) {
            sp_buf_puts(&b, i ? "," : "");
            if (f->running[i]) {
                sp_buf_puts(&b, "{\"sandbox\":");
                gw_e2b_sandbox_json(rq, f->ids[i], f->template_, &b);
                sp_buf_putc(&b, '}');
            } else {
                sp_buf_puts(&b, "{\"error\":{\"code\":500,\"message\":\"the copy did not "
                                "start\"}}");
            }
        }
        sp_buf_putc(&b, ']');
        gw_respond_json(rq, 201, &b);
        explicit_bzero(b.data, b.len); /* access tokens */
        sp_buf_dispose(&b);
    } else if (gw_req_live(rq)) {
        if (f->status == 201)
            gw_respond_json(rq, 201, &f->body);
        else if (f->status >= 500 && f->body.data && f->body.len && f->body.data[0] == '{')
            gw_respond(rq, f->status, "application/json", f->body.data, f->body.len);
        else
            gw_respond_error(rq, f->status ? f->status : 500, f->code[0] ? f->code : "internal",
                             NULL, "%s", f->body.data ? f->body.data : "fork failed");
    }
    gw_req_unref(rq);
    sp_buf_dispose(&f->body);
    sp_buf_dispose(&f->s.out);
    free(f->ids);
    free(f->running);
    free(f);
}

/* {"count": 1..SP_FORK_COUNT_MAX} (default 1); answers the 4xx itself. */
static int parse_fork(gw_req_t *rq, uint32_t *ret)
{
    h2o_req_t *req = rq->req;
    const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
    size_t len = req->entity.base ? req->entity.len : 0;
    *ret = 1;
    if (len == 0)
        return 0;
    if (ct && !gw_json_content_type(ct)) {
        gw_respond_error(rq, 415, "unsupported_media_type", NULL,
                         "send the body as application/json");
        return -EINVAL;
    }
    char jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;
    sp_json_limits_t lim = {.max_bytes = 4096, .max_depth = 2, .max_nodes = 8, .max_string = 64};
    if (len > 4096 || sp_json_parse(req->entity.base, len, &lim, &doc, jerr) < 0 ||
        sp_json_type(sp_json_root(doc)) != SP_JSON_OBJECT) {
        sp_json_doc_free(doc);
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body must be {\"count\": N}");
        return -EINVAL;
    }
    const sp_json_t *root = sp_json_root(doc);
    int rc = 0;
    for (size_t i = 0; i < sp_json_len(root) && rc == 0; i++) {
        const char *k = sp_json_key_at(root, i);
        int64_t v = 0;
        if (strcmp(k, "timeout") == 0 && rq->dialect == GW_DIALECT_E2B) {
            continue; /* E2B's copies' timeout: ours get the default one */
        } else if (strcmp(k, "count") != 0) {
            gw_respond_error(rq, 400, "unknown_field", NULL, "unknown field %s", k);
            rc = -EINVAL;
        } else if (sp_json_int(sp_json_at(root, i), 1, SP_FORK_COUNT_MAX, &v) < 0) {
            gw_respond_error(rq, 400, "invalid_field", NULL,
                             "count must be an integer within 1..%d", SP_FORK_COUNT_MAX);
            rc = -EINVAL;
        } else {
            *ret = (uint32_t)v;
        }
    }
    sp_json_doc_free(doc);
    return rc;
}

void gw_sandbox_fork(gw_req_t *rq)
{
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    uint32_t count;
    if (parse_fork(rq, &count) < 0)
        return;
    fork_job_t *f = sp_xcalloc(1, sizeof(*f));
    snap_job_t *s = &f->s;
    s->rq = rq;
    sp_buf_init(&s->out);
    sp_buf_init(&f->body);
    f->count = count;
    f->ids = sp_xcalloc(count, sizeof(*f->ids));
    f->running = sp_xcalloc(count, sizeof(*f->running));
    snprintf(s->tenant, sizeof(s->tenant), "%s", rq->tenant);
    snprintf(s->actor, sizeof(s->actor), "%s", rq->key_id);
    snprintf(s->request_id, sizeof(s->request_id), "%s", rq->request_id);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", rq->path_id);
    sp_snapshot_id_new(s->snapshot_id);
    snprintf(s->name, sizeof(s->name), "fork of %.40s", rq->path_id);
    s->job.run = fork_run;
    s->job.done = fork_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &s->job) < 0) {
        gw_req_unref(rq);
        sp_buf_dispose(&f->body);
        sp_buf_dispose(&s->out);
        free(f->ids);
        free(f->running);
        free(f);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
    }
}
