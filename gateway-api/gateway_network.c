/* Network policies through the API: the "network" member of a create body and
 * PUT /v1/sandboxes/{id}/network (docs/egress.md).
 *
 *   {"mode": "deny_all" | "allow_all" | "allowlist", "allow": [entry...], "deny": [entry...],
 *    "up_bytes_per_s": N, "down_bytes_per_s": N}
 *
 * The two limits (optional) are the sandbox's bandwidth over all its connections, guest ->
 * internet and back, replacing space-egressd's default for it.
 *
 * Entries are checked with lib/netpolicy.c, the same code egressd and the event validator use.
 * A PUT becomes a NetworkPolicyUpdateRequested on the owning worker's subject (where that
 * host's space-egressd consumes it); the answer waits until the log holds the
 * NetworkPolicyChanged that egressd publishes in response (causation = the intent), so a 200
 * means the new policy is enforced for new connections and queries. */
#include "gateway.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "envelope.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "json.h"
#include "log.h"
#include "netpolicy.h"
#include "publish.h"
#include "xmalloc.h"

#define APPLY_TIMEOUT_MS 10000
#define APPLY_POLL_MS    20

static int parse_list(const sp_json_t *v, const char *name, char ***ret, size_t *ret_n,
                      gw_verr_t *e)
{
    if (sp_json_type(v) != SP_JSON_ARRAY)
        return gw_bad(e, "invalid_field", "network.%s must be an array of strings", name);
    size_t n = sp_json_len(v);
    if (n > SP_NETPOLICY_ENTRIES_MAX)
        return gw_bad(e, "invalid_field", "network.%s has %zu entries, at most %d", name, n,
                      SP_NETPOLICY_ENTRIES_MAX);
    char **items = sp_xcalloc(n ? n : 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        const char *s = sp_json_str(sp_json_at(v, i), NULL);
        sp_netentry_t ent;
        if (!s || sp_netentry_parse(s, &ent) < 0) {
            free(items);
            return gw_bad(e, "invalid_field",
                          "network.%s[%zu] must be a lowercase DNS name, *.name or IPv4 "
                          "CIDR, optionally with :port",
                          name, i);
        }
        items[i] = (char *)s;
    }
    *ret = items;
    *ret_n = n;
    return 0;
}

static int parse_rate(const sp_json_t *v, const char *name, uint64_t *ret, gw_verr_t *e)
{
    int64_t x = 0;
    if (sp_json_int(v, SP_NETPOLICY_RATE_MIN, SP_NETPOLICY_RATE_MAX, &x) < 0)
        return gw_bad(e, "invalid_field",
                      "network.%s must be an integer from %d to %lld (bytes per second)", name,
                      SP_NETPOLICY_RATE_MIN, (long long)SP_NETPOLICY_RATE_MAX);
    *ret = (uint64_t)x;
    return 0;
}

int gw_network_parse(const sp_json_t *v, gw_netpol_t *p, gw_verr_t *e)
{
    Space__V1__NetworkPolicy init = SPACE__V1__NETWORK_POLICY__INIT;
    p->msg = init;
    if (sp_json_type(v) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_field", "network must be an object");
    int rc = 0;
    bool have_mode = false;
    for (size_t i = 0; i < sp_json_len(v) && rc == 0; i++) {
        const char *k = sp_json_key_at(v, i);
        const sp_json_t *x = sp_json_at(v, i);
        sp_netmode_t mode;
        if (strcmp(k, "mode") == 0) {
            const char *m = sp_json_str(x, NULL);
            if (!m || sp_netmode_parse(m, &mode) < 0)
                rc = gw_bad(e, "invalid_field",
                            "network.mode must be deny_all, allow_all or allowlist");
            else
                p->msg.mode = (char *)m, have_mode = true;
        } else if (strcmp(k, "allow") == 0 && !p->msg.allow) {
            rc = parse_list(x, "allow", &p->msg.allow, &p->msg.n_allow, e);
        } else if (strcmp(k, "deny") == 0 && !p->msg.deny) {
            rc = parse_list(x, "deny", &p->msg.deny, &p->msg.n_deny, e);
        } else if (strcmp(k, "up_bytes_per_s") == 0 && !p->msg.up_bytes_per_s) {
            rc = parse_rate(x, k, &p->msg.up_bytes_per_s, e);
        } else if (strcmp(k, "down_bytes_per_s") == 0 && !p->msg.down_bytes_per_s) {
            rc = parse_rate(x, k, &p->msg.down_bytes_per_s, e);
        } else {
            rc = gw_bad(e, "unknown_field", "unknown field network.%s", k);
        }
    }
    if (rc == 0 && !have_mode)
        rc = gw_bad(e, "missing_field", "network.mode is required");
    if (rc == 0 && p->msg.n_allow && strcmp(p->msg.mode, "allowlist") != 0)
        rc = gw_bad(e, "invalid_field", "network.allow needs mode allowlist");
    if (rc < 0)
        gw_network_dispose(p);
    return rc;
}

void gw_network_default(const gw_t *gw, gw_netpol_t *p)
{
    Space__V1__NetworkPolicy init = SPACE__V1__NETWORK_POLICY__INIT;
    p->msg = init;
    p->msg.mode = gw->cfg->network_default;
}

void gw_network_dispose(gw_netpol_t *p)
{
    free(p->msg.allow);
    free(p->msg.deny);
    p->msg.allow = p->msg.deny = NULL;
    p->msg.n_allow = p->msg.n_deny = 0;
}

static void policy_json(sp_buf_t *b, const Space__V1__NetworkPolicy *p)
{
    sp_buf_printf(b, "{\"mode\":");
    sp_buf_json_str(b, p->mode);
    const char *names[2] = {"allow", "deny"};
    char **lists[2] = {p->allow, p->deny};
    size_t ns[2] = {p->n_allow, p->n_deny};
    for (int l = 0; l < 2; l++) {
        sp_buf_printf(b, ",\"%s\":[", names[l]);
        for (size_t i = 0; i < ns[l]; i++) {
            if (i)
                sp_buf_putc(b, ',');
            sp_buf_json_str(b, lists[l][i]);
        }
        sp_buf_putc(b, ']');
    }
    if (p->up_bytes_per_s)
        sp_buf_printf(b, ",\"up_bytes_per_s\":%llu", (unsigned long long)p->up_bytes_per_s);
    if (p->down_bytes_per_s)
        sp_buf_printf(b, ",\"down_bytes_per_s\":%llu", (unsigned long long)p->down_bytes_per_s);
    sp_buf_putc(b, '}');
}

/* ---- PUT /v1/sandboxes/{id}/network ---- */

typedef enum { N_APPLIED = 1, N_NOT_FOUND, N_NOT_LIVE, N_TIMEOUT, N_DB, N_BUS } net_outcome_t;

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    sp_json_doc_t *doc; /* the policy's strings point into it */
    gw_netpol_t pol;
    char id[SP_ID_MAX + 1], tenant[SP_ID_MAX + 1], actor[SP_ID_MAX + 1];
    char request_id[GW_REQUEST_ID_MAX + 1];
    char event_id[GW_EVENT_ID_LEN + 1];
    char state[32];
    net_outcome_t outcome;
    int bus_rc;
} net_job_t;

static void net_run(gw_job_t *job, PGconn *db)
{
    net_job_t *n = (net_job_t *)job;
    const char *p[2] = {n->id, n->tenant};
    PGresult *r =
        PQexecParams(db, "SELECT state, worker FROM sandboxes WHERE id = $1 AND tenant = $2", 2,
                     NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        PQclear(r);
        n->outcome = N_DB;
        return;
    }
    if (PQntuples(r) != 1 || strcmp(PQgetvalue(r, 0, 0), "deleted") == 0) {
        PQclear(r);
        n->outcome = N_NOT_FOUND;
        return;
    }
    snprintf(n->state, sizeof(n->state), "%s", PQgetvalue(r, 0, 0));
    char worker[SP_ID_MAX + 1];
    snprintf(worker, sizeof(worker), "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    /* Only a placed sandbox has an egressd that enforces its policy. */
    if (!worker[0] || strcmp(n->state, "failed") == 0) {
        n->outcome = N_NOT_LIVE;
        return;
    }

    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__NetworkPolicyUpdateRequested upd = SPACE__V1__NETWORK_POLICY_UPDATE_REQUESTED__INIT;
    agg.kind = "sandbox";
    agg.id = n->id;
    upd.network = &n->pol.msg;
    env.aggregate = &agg;
    env.tenant = n->tenant;
    env.actor = n->actor;
    env.correlation_id = n->request_id;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_UPDATE_REQUESTED;
    env.network_policy_update_requested = &upd;
    sp_envelope_stamp(&env, n->event_id);
    char subject[192];
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = sp_envelope_subject(&env, worker, subject, sizeof(subject));
    if (rc >= 0)
        rc = sp_publish_pack(&env, &data, &len);
    if (rc >= 0)
        rc = sp_bus_publish_retry(job->gw->bus, subject, data, len, n->event_id,
                                  SP_PUBLISH_INTENT_BUDGET_MS, NULL);
    free(data);
    if (rc < 0) {
        n->bus_rc = rc;
        n->outcome = N_BUS;
        return;
    }
    /* egressd's answer names the intent as its cause. A short poll on this pool thread: a
     * policy change is rare and the wait is bounded. */
    const char *q[1] = {n->event_id};
    for (int waited = 0; waited < APPLY_TIMEOUT_MS; waited += APPLY_POLL_MS) {
        r = PQexecParams(db,
                         "SELECT 1 FROM events WHERE causation_id = $1::uuid AND "
                         "type = 'NetworkPolicyChanged' AND status = 'accepted' LIMIT 1",
                         1, NULL, q, NULL, NULL, 0);
        int ok = sp_db_check(r, PGRES_TUPLES_OK) == 0;
        int found = ok && PQntuples(r) == 1;
        PQclear(r);
        if (!ok) {
            n->outcome = N_DB;
            return;
        }
        if (found) {
            n->outcome = N_APPLIED;
            return;
        }
        usleep(APPLY_POLL_MS * 1000);
    }
    n->outcome = N_TIMEOUT;
}

static void net_done(gw_job_t *job)
{
    net_job_t *n = (net_job_t *)job;
    gw_req_t *rq = n->rq;
    sp_buf_t b;
    switch (n->outcome) {
    case N_APPLIED:
        sp_buf_init(&b);
        sp_buf_printf(&b, "{\"id\":");
        sp_buf_json_str(&b, n->id);
        sp_buf_printf(&b, ",\"network\":");
        policy_json(&b, &n->pol.msg);
        sp_buf_putc(&b, '}');
        gw_respond_json(rq, 200, &b);
        sp_buf_dispose(&b);
        break;
    case N_NOT_FOUND:
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        break;
    case N_NOT_LIVE:
        gw_respond_error(rq, 409, "illegal_state", NULL,
                         "the sandbox is %s: its network policy cannot change", n->state);
        break;
    case N_TIMEOUT:
        gw_respond_error(rq, 504, "not_applied", NULL,
                         "space-egressd did not confirm the policy within %d ms (intent %s)",
                         APPLY_TIMEOUT_MS, n->event_id);
        break;
    case N_BUS:
        rq->gw->metrics.publish_failures++;
        sp_log(SP_LOG_WARN, "publish failed", SP_KS("sandbox", n->id),
               SP_KS("error", sp_strerror(n->bus_rc)), SP_KS("request_id", rq->request_id));
        gw_respond_error(rq, 503, "bus_unavailable", NULL,
                         "the event bus did not accept the request; retry");
        break;
    case N_DB:
    default:
        gw_respond_error(rq, 503, "db_unavailable", NULL, "the database is unavailable; retry");
        break;
    }
    gw_req_unref(rq);
    gw_network_dispose(&n->pol);
    sp_json_doc_free(n->doc);
    free(n);
}

void gw_sandbox_network_put(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
    if (ct && !gw_json_content_type(ct)) {
        gw_respond_error(rq, 415, "unsupported_media_type", NULL,
                         "send the body as application/json");
        return;
    }
    gw_sandbox_network_put_body(rq, req->entity.base ? req->entity.base : "",
                                req->entity.base ? req->entity.len : 0);
}

void gw_sandbox_network_put_body(gw_req_t *rq, const char *body, size_t len)
{
    char err[GW_ERR_MSG_MAX], jerr[SP_JSON_ERR_MAX];
    gw_verr_t e = {.code = NULL, .msg = err};

    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    if (len > (size_t)rq->gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)rq->gw->cfg->max_body_bytes);
        return;
    }
    net_job_t *n = sp_xcalloc(1, sizeof(*n));
    sp_json_limits_t lim = {
        .max_bytes = len + 1, .max_depth = 4, .max_nodes = 1024, .max_string = 1024};
    if (len == 0 || sp_json_parse(body, len, &lim, &n->doc, jerr) < 0) {
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body is not a JSON object: %s",
                         len == 0 ? "empty" : jerr);
        free(n);
        return;
    }
    if (gw_network_parse(sp_json_root(n->doc), &n->pol, &e) < 0) {
        gw_respond_error(rq, 400, e.code ? e.code : "invalid_field", NULL, "%s", err);
        sp_json_doc_free(n->doc);
        free(n);
        return;
    }
    n->rq = rq;
    snprintf(n->id, sizeof(n->id), "%s", rq->path_id);
    snprintf(n->tenant, sizeof(n->tenant), "%s", rq->tenant);
    snprintf(n->actor, sizeof(n->actor), "%s", rq->key_id);
    snprintf(n->request_id, sizeof(n->request_id), "%s", rq->request_id);
    n->job.run = net_run;
    n->job.done = net_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &n->job) < 0) {
        gw_req_unref(rq);
        gw_network_dispose(&n->pol);
        sp_json_doc_free(n->doc);
        free(n);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
    }
}
