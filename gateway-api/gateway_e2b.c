/* The E2B control plane (../../shared/e2b-compat.md, section 2) on the API's own port, so the
 * official E2B SDKs work unchanged with E2B_API_URL pointing here:
 *
 *   POST /sandboxes, POST /v2/sandboxes            create   -> POST /v1/sandboxes's code path
 *   GET  /sandboxes, GET /v2/sandboxes              list (metadata, state, template and
 *                                                   startedAfter filters, order by start:
 *                                                   newest first unless order=asc, paging)
 *   GET  /sandboxes/{id}                            get
 *   DELETE /sandboxes/{id}                          kill     -> SandboxDeleteRequested
 *   POST /sandboxes/{id}/timeout                    timeout  (validated; see below)
 *   POST /sandboxes/{id}/pause                      pause    -> SandboxSuspendRequested
 *   POST /[v2/]sandboxes/{id}/connect, .../resume   connect  -> SandboxResumeRequested if paused
 *   PUT  /sandboxes/{id}/network                    updateNetwork -> PUT /v1/.../network's path
 *   GET  /sandboxes/{id}/metrics                    metrics  (the worker's usage samples:
 *                                                   gateway_samples.c)
 *
 * Nothing here is a second implementation: a create's E2B body is translated into our body and
 * goes through gw_sandbox_create_body (validation, the SandboxCreateRequested intent, the wait);
 * kill, pause and connect publish the same intents as our routes and wait for the same facts.
 * What differs is the JSON: E2B's field names, and errors {"code": <HTTP status>, "message"}
 * (gw_respond_error with GW_DIALECT_E2B), from which the SDKs decide "not found" (404) and
 * "already paused" (409).
 *
 * Keys: E2B's X-API-KEY is one of our API keys (Authorization: Bearer works too). A sandbox's
 * envdAccessToken is a token of that sandbox alone, "<sandbox id>.<key id>.<signature>"
 * (gateway_auth.c): the envd routes (gateway_e2b_envd.c) read the sandbox from it, so one token
 * serves Python's Sandbox.connect (which sends only the token). It opens that sandbox's envd
 * routes and nothing else (no create, list, kill, other sandboxes), dies with the key that
 * asked for it, holds nothing of the key's secret, and is never logged.
 *
 * E2B's states: our running is "running"; paused, suspending, suspended and resuming are
 * "paused" (E2B pause keeps the sandbox restorable with its resources released: our suspend).
 *
 * autoPause at create (SDK 2.51: lifecycle.onTimeout "pause") is our on_timeout "suspend", kept
 * in the create intent and the projection and shown as lifecycle.onTimeout "pause".
 *
 * The timeout: POST .../timeout is our SandboxTimeoutRequested (a new deadline from now), and
 * connect {"timeout"} on a running sandbox the same when it moves the deadline later; endAt is
 * the deadline the log keeps (timeout_at). */
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "ids.h"
#include "log.h"
#include "text.h"
#include "xmalloc.h"

#define E2B_ENVD_VERSION "0.5.7" /* the first with closeStdin and octet-stream uploads */
#define E2B_CLIENT_ID    "space"
#define E2B_TIMEOUT_MAX  SP_INTENT_TIMEOUT_MAX_S
#define LIST_LIMIT_MAX   1000
#define LIST_LIMIT_DEF   100

/* ---- keys and tokens ---- */

/* The sandbox's access token for the key that asked (gateway_auth.c): a JSON string. */
static void json_token(sp_buf_t *b, gw_t *gw, const char *sandbox, const char *tenant,
                       const char *key_id)
{
    sp_buf_t t;
    sp_buf_init(&t);
    if (gw_access_token(gw, sandbox, tenant, key_id, &t) < 0) {
        sp_buf_puts(b, "null");
    } else {
        /* The SDK signs /files URLs with it: index it to find their sandbox (gateway_signed.c). */
        gw_signed_note(&gw->signed_urls, sandbox, t.data, t.len);
        sp_buf_putc(b, '"');
        sp_buf_append(b, t.data, t.len); /* [a-zA-Z0-9_.=-] */
        sp_buf_putc(b, '"');
        explicit_bzero(t.data, t.len);
    }
    sp_buf_dispose(&t);
}

/* ---- JSON ---- */

void gw_e2b_sandbox_json(const gw_req_t *rq, const char *sandbox_id, const char *template_,
                         sp_buf_t *b)
{
    sp_buf_puts(b, "{\"sandboxID\":");
    sp_buf_json_str(b, sandbox_id);
    sp_buf_puts(b, ",\"templateID\":");
    sp_buf_json_str(b, template_);
    sp_buf_puts(b, ",\"alias\":");
    sp_buf_json_str(b, template_);
    sp_buf_puts(b, ",\"clientID\":\"" E2B_CLIENT_ID "\",\"envdVersion\":\"" E2B_ENVD_VERSION
                   "\",\"envdAccessToken\":");
    json_token(b, rq->gw, sandbox_id, rq->tenant, rq->key_id);
    sp_buf_puts(b, ",\"trafficAccessToken\":null,\"domain\":null}");
}

void gw_e2b_answer_sandbox(gw_req_t *rq, int status, const char *sandbox_id, const char *template_)
{
    sp_buf_t b;
    if (!gw_req_live(rq))
        return;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"sandboxID\":");
    sp_buf_json_str(&b, sandbox_id);
    sp_buf_puts(&b, ",\"templateID\":");
    sp_buf_json_str(&b, template_);
    sp_buf_puts(&b, ",\"alias\":");
    sp_buf_json_str(&b, template_);
    sp_buf_puts(&b, ",\"clientID\":\"" E2B_CLIENT_ID "\",\"envdVersion\":\"" E2B_ENVD_VERSION
                    "\",\"envdAccessToken\":");
    json_token(&b, rq->gw, sandbox_id, rq->tenant, rq->key_id);
    sp_buf_puts(&b, ",\"trafficAccessToken\":null,\"domain\":null}");
    gw_respond_json(rq, status, &b);
    explicit_bzero(b.data, b.len); /* the access token is a bearer secret */
    sp_buf_dispose(&b);
}

static const char *e2b_state(const char *ours)
{
    if (strcmp(ours, "paused") == 0 || strcmp(ours, "suspending") == 0 ||
        strcmp(ours, "suspended") == 0 || strcmp(ours, "resuming") == 0)
        return "paused";
    return "running";
}

static int64_t col_i64(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* A row of GW_SBX_COLUMNS as E2B's ListedSandbox, or SandboxDetail with detail. */
static void sandbox_row(sp_buf_t *b, const PGresult *r, int row, bool detail, gw_t *gw,
                        const char *key_id)
{
    const char *id = PQgetvalue(r, row, 0), *tpl = PQgetvalue(r, row, 2);
    int64_t created = col_i64(r, row, 11), started = col_i64(r, row, 12);
    int64_t timeout_s = col_i64(r, row, 5), timeout_at = col_i64(r, row, 13);
    int64_t from = started > 0 ? started : created;

    sp_buf_puts(b, "{\"sandboxID\":");
    sp_buf_json_str(b, id);
    sp_buf_puts(b, ",\"templateID\":");
    sp_buf_json_str(b, tpl);
    sp_buf_puts(b, ",\"alias\":");
    sp_buf_json_str(b, tpl);
    sp_buf_printf(b,
                  ",\"clientID\":\"" E2B_CLIENT_ID "\",\"cpuCount\":%" PRId64
                  ",\"memoryMB\":%" PRId64 ",\"diskSizeMB\":%" PRId64
                  ",\"envdVersion\":\"" E2B_ENVD_VERSION "\",\"metadata\":",
                  col_i64(r, row, 6), col_i64(r, row, 7), col_i64(r, row, 17));
    /* jsonb's own output of validated event fields. */
    sp_buf_puts(b, PQgetisnull(r, row, 8) ? "{}" : PQgetvalue(r, row, 8));
    sp_buf_puts(b, ",\"startedAt\":");
    gw_json_time(b, from);
    sp_buf_puts(b, ",\"endAt\":");
    /* The deadline the log keeps (moved by timeout, resume and connect), else the one at start. */
    gw_json_time(b, timeout_at > 0  ? timeout_at
                    : timeout_s > 0 ? from + timeout_s * 1000000
                                    : from + 86400LL * 1000000 * 365);
    sp_buf_puts(b, ",\"state\":");
    sp_buf_json_str(b, e2b_state(PQgetvalue(r, row, 3)));
    if (detail) {
        sp_buf_puts(b, ",\"domain\":null,\"envdAccessToken\":");
        json_token(b, gw, id, PQgetvalue(r, row, 1), key_id);
        /* autoPause at create is our on_timeout "suspend" (the create intent and the
         * projection keep it); a resume is always explicit here (connect). */
        sp_buf_puts(b, ",\"lifecycle\":{\"onTimeout\":");
        sp_buf_json_str(b, strcmp(PQgetvalue(r, row, 14), "suspend") == 0 ? "pause" : "kill");
        sp_buf_puts(b, ",\"autoResume\":false}");
    }
    sp_buf_putc(b, '}');
}

/* ---- reads: get and list ---- */

typedef enum { R_GET = 1, R_LIST } read_kind_t;

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    read_kind_t kind;
    char id[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char *filter; /* list: jsonb containment */
    char *states; /* list: text[] literal */
    char cursor[SP_ID_MAX + 1];
    bool ascending;                /* list: by start, oldest first (E2B's default: newest first) */
    char started_after[24];        /* list: microseconds since the epoch, "" = no bound */
    char template_[SP_ID_MAX + 1]; /* list: "" = any */
    char key_id[SP_ID_MAX + 1];    /* get: the key that asks, for the access token */
    gw_t *gw;
    int limit;
    bool failed;
    int n;
    sp_buf_t out;
    char next[SP_ID_MAX + 1];
} read_job_t;

static void read_run(gw_job_t *job, PGconn *db)
{
    read_job_t *j = (read_job_t *)job;
    PGresult *r;
    if (j->kind == R_LIST) {
        char lim[24];
        snprintf(lim, sizeof(lim), "%d", j->limit + 1);
        const char *p[7] = {j->tenant, j->filter,        j->states,   j->cursor,
                            lim,       j->started_after, j->template_};
        /* Ids sort by creation time (UUIDv7), which is when E2B's startedAt is: the order and
         * the page cursor are the id's. */
        r = PQexecParams(db,
                         j->ascending
                             ? "SELECT " GW_SBX_COLUMNS " FROM sandboxes WHERE tenant = $1 AND "
                               "metadata @> $2::jsonb AND state = ANY($3::text[]) AND id > $4 "
                               "AND ($6 = '' OR coalesce(started_at, created_at) > "
                               "to_timestamp($6::float8 / 1e6)) "
                               "AND ($7 = '' OR template = $7) ORDER BY id LIMIT $5"
                             : "SELECT " GW_SBX_COLUMNS " FROM sandboxes WHERE tenant = $1 AND "
                               "metadata @> $2::jsonb AND state = ANY($3::text[]) AND ($4 = '' "
                               "OR id < $4) AND ($6 = '' OR coalesce(started_at, created_at) > "
                               "to_timestamp($6::float8 / 1e6)) AND ($7 = '' OR template = $7) "
                               "ORDER BY id DESC LIMIT $5",
                         7, NULL, p, NULL, NULL, 0);
    } else {
        const char *p[2] = {j->id, j->tenant};
        r = PQexecParams(db,
                         "SELECT " GW_SBX_COLUMNS " FROM sandboxes WHERE id = $1 AND tenant = $2 "
                         "AND state NOT IN ('deleted', 'failed')",
                         2, NULL, p, NULL, NULL, 0);
    }
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        sp_log(SP_LOG_WARN, "query failed", SP_KS("query", "e2b read"),
               SP_KS("error", PQerrorMessage(db)));
        j->failed = true;
        PQclear(r);
        return;
    }
    j->n = PQntuples(r);
    if (j->kind == R_GET && j->n == 1) {
        sandbox_row(&j->out, r, 0, true, j->gw, j->key_id);
    } else if (j->kind == R_LIST) {
        int shown = j->n > j->limit ? j->limit : j->n;
        sp_buf_putc(&j->out, '[');
        for (int i = 0; i < shown; i++) {
            if (i)
                sp_buf_putc(&j->out, ',');
            sandbox_row(&j->out, r, i, false, NULL, NULL);
        }
        sp_buf_putc(&j->out, ']');
        if (j->n > j->limit)
            snprintf(j->next, sizeof(j->next), "%s", PQgetvalue(r, shown - 1, 0));
    }
    PQclear(r);
}

static void read_free(read_job_t *j)
{
    if (j->out.data)
        explicit_bzero(j->out.data, j->out.len); /* may hold an access token */
    sp_buf_dispose(&j->out);
    free(j->filter);
    free(j->states);
    free(j);
}

static void read_done(gw_job_t *job)
{
    read_job_t *j = (read_job_t *)job;
    gw_req_t *rq = j->rq;

    if (j->failed) {
        gw_respond_error(rq, 503, "unavailable", NULL, "the database is not available; retry");
    } else if (j->kind != R_LIST && j->n != 1) {
        gw_respond_error(rq, 404, "not_found", NULL, "sandbox %s not found", j->id);
    } else {
        if (j->next[0] && gw_req_live(rq)) {
            h2o_iovec_t v = h2o_strdup(&rq->req->pool, j->next, strlen(j->next));
            h2o_add_header_by_str(&rq->req->pool, &rq->req->res.headers, H2O_STRLIT("x-next-token"),
                                  0, NULL, v.base, v.len);
        }
        gw_respond_json(rq, 200, &j->out);
    }
    gw_req_unref(rq);
    read_free(j);
}

static void read_submit(gw_req_t *rq, read_job_t *j)
{
    j->rq = rq;
    snprintf(j->id, sizeof(j->id), "%s", rq->path_id);
    snprintf(j->tenant, sizeof(j->tenant), "%s", rq->tenant);
    sp_buf_init(&j->out);
    j->gw = rq->gw;
    snprintf(j->key_id, sizeof(j->key_id), "%s", rq->key_id);
    j->job.run = read_run;
    j->job.done = read_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &j->job) < 0) {
        gw_req_unref(rq);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
        read_free(j);
    }
}

static void read_one(gw_req_t *rq, read_kind_t kind)
{
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "sandbox not found");
        return;
    }
    read_job_t *j = sp_xcalloc(1, sizeof(*j));
    j->kind = kind;
    read_submit(rq, j);
}

static void e2b_get(gw_req_t *rq)
{
    read_one(rq, R_GET);
}

/* metadata=k1%3Dv1%26k2%3Dv2: after the query's own decoding, "k1=v1&k2=v2" in
 * x-www-form-urlencoded form, whose keys and values the JS SDKs encodeURIComponent once more
 * before: a third decoding, when it is one, gives the values back. */
static char *decode_twice(h2o_mem_pool_t *pool, const char *s, size_t n)
{
    char *once = gw_url_decode(pool, s, n);
    char *twice = once && strchr(once, '%') ? gw_url_decode(pool, once, strlen(once)) : NULL;
    return twice ? twice : once;
}

static int metadata_filter(gw_req_t *rq, const char *v, sp_buf_t *out)
{
    size_t n = 0;
    const char *p = v;
    while (*p) {
        const char *amp = strchr(p, '&');
        size_t seg = amp ? (size_t)(amp - p) : strlen(p);
        const char *eq = memchr(p, '=', seg);
        if (seg > 0) {
            if (!eq)
                return -EINVAL;
            char *k = decode_twice(&rq->req->pool, p, (size_t)(eq - p));
            char *val = decode_twice(&rq->req->pool, eq + 1, seg - (size_t)(eq - p) - 1);
            if (!k || !val || !k[0] || !gw_text_ok(k, 64) || !gw_text_ok(val, 512) || ++n > 64)
                return -EINVAL;
            sp_buf_puts(out, n > 1 ? "," : "");
            sp_buf_json_str(out, k);
            sp_buf_putc(out, ':');
            sp_buf_json_str(out, val);
        }
        p += seg + (amp ? 1 : 0);
    }
    return 0;
}

static void e2b_list(gw_req_t *rq)
{
    gw_query_t q;
    sp_buf_t filter;
    bool running = true, paused = true, state_given = false;
    int64_t limit = LIST_LIMIT_DEF;
    const char *cursor = "";
    bool ascending = false;
    char started_after[24] = "", tmpl[SP_ID_MAX + 1] = "";

    if (gw_query_parse(rq->req, &q) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "malformed query string");
        return;
    }
    sp_buf_init(&filter);
    sp_buf_putc(&filter, '{');
    for (size_t i = 0; i < q.n; i++) {
        const char *k = q.p[i].key, *v = q.p[i].value;
        if (strcmp(k, "metadata") == 0 || strcmp(k, "query") == 0) {
            if (metadata_filter(rq, v, &filter) < 0) {
                gw_respond_error(rq, 400, "invalid_query", NULL,
                                 "metadata must be key=value pairs joined by &, URL-encoded");
                goto out;
            }
        } else if (strcmp(k, "state") == 0) {
            /* "running,paused", or the parameter repeated. */
            if (!state_given)
                running = paused = false;
            state_given = true;
            for (const char *p = v; *p;) {
                size_t seg = strcspn(p, ",");
                if (seg == 7 && strncmp(p, "running", 7) == 0)
                    running = true;
                else if (seg == 6 && strncmp(p, "paused", 6) == 0)
                    paused = true;
                else {
                    gw_respond_error(rq, 400, "invalid_query", NULL,
                                     "state must be running and/or paused");
                    goto out;
                }
                p += seg + (p[seg] == ',');
            }
        } else if (strcmp(k, "limit") == 0) {
            char *end = NULL;
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (errno || end == v || *end || x < 1 || x > LIST_LIMIT_MAX) {
                gw_respond_error(rq, 400, "invalid_query", NULL, "limit must be 1..%d",
                                 LIST_LIMIT_MAX);
                goto out;
            }
            limit = x;
        } else if (strcmp(k, "nextToken") == 0) {
            if (v[0] && !sp_id_valid(v)) {
                gw_respond_error(rq, 400, "invalid_query", NULL, "nextToken is not valid");
                goto out;
            }
            cursor = v;
        } else if (strcmp(k, "order") == 0) {
            if (strcmp(v, "asc") != 0 && strcmp(v, "desc") != 0) {
                gw_respond_error(rq, 400, "invalid_query", NULL, "order must be asc or desc");
                goto out;
            }
            ascending = strcmp(v, "asc") == 0;
        } else if (strcmp(k, "startedAfter") == 0) {
            int64_t us;
            if (sp_time_parse(v, &us) < 0) {
                gw_respond_error(rq, 400, "invalid_query", NULL,
                                 "startedAfter must be an RFC 3339 time "
                                 "(2026-01-02T03:04:05Z, fractions and offsets allowed)");
                goto out;
            }
            snprintf(started_after, sizeof(started_after), "%lld", (long long)us);
        } else if (strcmp(k, "template") == 0 || strcmp(k, "templateID") == 0) {
            if (!sp_id_valid(v)) {
                gw_respond_error(rq, 400, "invalid_query", NULL, "template is not a template id");
                goto out;
            }
            snprintf(tmpl, sizeof(tmpl), "%s", v);
        } else {
            /* Parameters of newer SDKs that do not narrow the answer are ignored. */
        }
    }
    sp_buf_putc(&filter, '}');
    read_job_t *j = sp_xcalloc(1, sizeof(*j));
    j->kind = R_LIST;
    j->limit = (int)limit;
    j->filter = sp_buf_take(&filter);
    j->states = sp_xasprintf("{%s%s%s}", running ? "running,requested,placed,starting" : "",
                             running && paused ? "," : "",
                             paused ? "paused,suspending,suspended,resuming" : "");
    snprintf(j->cursor, sizeof(j->cursor), "%s", cursor);
    j->ascending = ascending;
    snprintf(j->started_after, sizeof(j->started_after), "%s", started_after);
    snprintf(j->template_, sizeof(j->template_), "%s", tmpl);
    read_submit(rq, j);
out:
    sp_buf_dispose(&filter);
}

/* ---- create ---- */

static const sp_json_t *member(const sp_json_t *o, const char *k)
{
    return sp_json_type(o) == SP_JSON_OBJECT ? sp_json_get(o, k) : NULL;
}

/* An object of strings, copied as it is (our create validates names, sizes and counts). */
static int copy_strings(sp_buf_t *b, const char *name, const sp_json_t *v, char *err)
{
    if (sp_json_type(v) != SP_JSON_OBJECT) {
        snprintf(err, GW_ERR_MSG_MAX, "%s must be an object of strings", name);
        return -EINVAL;
    }
    sp_buf_putc(b, '{');
    for (size_t i = 0; i < sp_json_len(v); i++) {
        size_t n = 0;
        const char *s = sp_json_str(sp_json_at(v, i), &n);
        if (!s) {
            snprintf(err, GW_ERR_MSG_MAX, "%s values must be strings", name);
            return -EINVAL;
        }
        if (i)
            sp_buf_putc(b, ',');
        sp_buf_json_str(b, sp_json_key_at(v, i));
        sp_buf_putc(b, ':');
        sp_buf_json_strn(b, s, n);
    }
    sp_buf_putc(b, '}');
    return 0;
}

static int copy_list(sp_buf_t *b, const sp_json_t *v, bool skip_all, size_t *ret_n, char *err)
{
    size_t n = 0;
    sp_buf_putc(b, '[');
    for (size_t i = 0; i < sp_json_len(v); i++) {
        const char *s = sp_json_str(sp_json_at(v, i), NULL);
        if (!s) {
            snprintf(err, GW_ERR_MSG_MAX, "network lists hold strings");
            return -EINVAL;
        }
        if (skip_all && strcmp(s, "0.0.0.0/0") == 0)
            continue;
        sp_buf_puts(b, n++ ? "," : "");
        sp_buf_json_str(b, s);
    }
    sp_buf_putc(b, ']');
    *ret_n = n;
    return 0;
}

/* allow_internet_access (aia) and {allowOut, denyOut} (net) as our policy, after prefix: an
 * allowOut list is an allowlist (denyOut still applies, "0.0.0.0/0" there being E2B's way to
 * say "nothing else"); denyOut "0.0.0.0/0" alone, or no internet, is deny_all; internet (or a
 * denyOut list) is allow_all with that deny list. Nothing said: nothing written (the gateway's
 * network-default applies). The same translation serves a create's body and updateNetwork's. */
static int network_policy(sp_buf_t *b, const char *prefix, const sp_json_t *net,
                          const sp_json_t *aia, char *err)
{
    const sp_json_t *allow = member(net, "allowOut"), *deny = member(net, "denyOut");
    bool internet = true, have_internet = aia != NULL, deny_everything = false;
    if (aia && sp_json_bool(aia, &internet) < 0) {
        snprintf(err, GW_ERR_MSG_MAX, "allow_internet_access must be a boolean");
        return -EINVAL;
    }
    if ((net && sp_json_type(net) != SP_JSON_OBJECT) ||
        (allow && sp_json_type(allow) != SP_JSON_ARRAY) ||
        (deny && sp_json_type(deny) != SP_JSON_ARRAY)) {
        snprintf(err, GW_ERR_MSG_MAX, "network.allowOut and network.denyOut are arrays");
        return -EINVAL;
    }
    for (size_t i = 0; deny && i < sp_json_len(deny); i++) {
        const char *s = sp_json_str(sp_json_at(deny, i), NULL);
        deny_everything |= s && strcmp(s, "0.0.0.0/0") == 0;
    }
    size_t n_allow = allow ? sp_json_len(allow) : 0, n_deny = deny ? sp_json_len(deny) : 0;
    if (!have_internet && n_allow == 0 && n_deny == 0)
        return 0;
    sp_buf_puts(b, prefix);
    sp_buf_puts(b, "{\"mode\":");
    size_t n = 0;
    if (n_allow > 0) {
        sp_buf_puts(b, "\"allowlist\",\"allow\":");
        if (copy_list(b, allow, false, &n, err) < 0)
            return -EINVAL;
    } else if (deny_everything || !internet) {
        sp_buf_puts(b, "\"deny_all\"}");
        return 0;
    } else {
        sp_buf_puts(b, "\"allow_all\"");
    }
    if (n_deny > 0) {
        sp_buf_puts(b, ",\"deny\":");
        if (copy_list(b, deny, true, &n, err) < 0)
            return -EINVAL;
    }
    sp_buf_putc(b, '}');
    return 0;
}

/* autoPause (SDK 2.51: lifecycle.onTimeout "pause") as our on_timeout "suspend": at the
 * deadline the scheduler suspends the sandbox (memory, processes and disk kept) instead of
 * deleting it, and connect resumes it. What E2B has beyond that is refused, not ignored:
 * autoPauseMemory false (a pause keeping only the filesystem, which a suspend here is not) and
 * autoResume (a resume by incoming traffic: this server resumes on connect only). */
static int auto_pause(sp_buf_t *b, const sp_json_t *root, char *err)
{
    const sp_json_t *ap = member(root, "autoPause"), *mem = member(root, "autoPauseMemory");
    const sp_json_t *ar = member(root, "autoResume");
    bool on = false, keep_memory = true, resume = false;
    if (ap && sp_json_type(ap) != SP_JSON_NULL && sp_json_bool(ap, &on) < 0) {
        snprintf(err, GW_ERR_MSG_MAX, "autoPause must be a boolean");
        return -EINVAL;
    }
    if (mem && sp_json_type(mem) != SP_JSON_NULL && sp_json_bool(mem, &keep_memory) < 0) {
        snprintf(err, GW_ERR_MSG_MAX, "autoPauseMemory must be a boolean");
        return -EINVAL;
    }
    if (ar && sp_json_type(ar) != SP_JSON_NULL &&
        (sp_json_type(ar) != SP_JSON_OBJECT ||
         (member(ar, "enabled") && sp_json_bool(member(ar, "enabled"), &resume) < 0))) {
        snprintf(err, GW_ERR_MSG_MAX, "autoResume must be {\"enabled\": boolean}");
        return -EINVAL;
    }
    if (!keep_memory) {
        snprintf(err, GW_ERR_MSG_MAX,
                 "autoPauseMemory false is not served: a pause here keeps memory, processes "
                 "and files (leave keepMemory out)");
        return -ENOTSUP;
    }
    if (resume) {
        snprintf(err, GW_ERR_MSG_MAX,
                 "autoResume is not served: a paused sandbox resumes on Sandbox.connect()");
        return -ENOTSUP;
    }
    if (on)
        sp_buf_puts(b, ",\"on_timeout\":\"suspend\"");
    return 0;
}

static void e2b_create(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    const char *body = req->entity.base ? req->entity.base : "";
    size_t len = req->entity.base ? req->entity.len : 0;
    char err[GW_ERR_MSG_MAX], jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;
    sp_buf_t b;

    sp_buf_init(&b);
    if (len > (size_t)rq->gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)rq->gw->cfg->max_body_bytes);
        goto out;
    }
    sp_json_limits_t lim = {
        .max_bytes = len + 1, .max_depth = 4, .max_nodes = 2048, .max_string = GW_ENV_VALUE_MAX};
    if (len > 0 && sp_json_parse(body, len, &lim, &doc, jerr) < 0) {
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body is not valid JSON: %s", jerr);
        goto out;
    }
    const sp_json_t *root = doc ? sp_json_root(doc) : NULL;
    if (root && sp_json_type(root) != SP_JSON_OBJECT) {
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body must be a JSON object");
        goto out;
    }
    const sp_json_t *tpl = member(root, "templateID"), *to = member(root, "timeout");
    const sp_json_t *md = member(root, "metadata"), *env = member(root, "envVars");
    const char *template_ = tpl ? sp_json_str(tpl, NULL) : "base";
    int64_t timeout = 300;
    if (!template_) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "templateID must be a string");
        goto out;
    }
    if (to && sp_json_int(to, 0, E2B_TIMEOUT_MAX, &timeout) < 0) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "timeout must be 0..%d seconds",
                         E2B_TIMEOUT_MAX);
        goto out;
    }
    /* Sandbox.create(snapshotId): E2B names a snapshot where a template goes. */
    sp_buf_puts(&b, strncmp(template_, "snp_", 4) == 0 ? "{\"snapshot\":" : "{\"template\":");
    sp_buf_json_str(&b, template_);
    sp_buf_printf(&b, ",\"timeout_s\":%" PRId64, timeout);
    if (md && sp_json_type(md) != SP_JSON_NULL) {
        sp_buf_puts(&b, ",\"metadata\":");
        if (copy_strings(&b, "metadata", md, err) < 0) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "%s", err);
            goto out;
        }
    }
    if (env && sp_json_type(env) != SP_JSON_NULL) {
        sp_buf_puts(&b, ",\"env\":");
        if (copy_strings(&b, "envVars", env, err) < 0) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "%s", err);
            goto out;
        }
    }
    if (network_policy(&b, ",\"network\":", member(root, "network"),
                       member(root, "allow_internet_access"), err) < 0 ||
        auto_pause(&b, root, err) < 0) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "%s", err);
        goto out;
    }
    sp_buf_putc(&b, '}');
    gw_sandbox_create_body(rq, b.data, b.len);
out:
    if (b.data)
        explicit_bzero(b.data, b.len); /* environment values */
    sp_buf_dispose(&b);
    sp_json_doc_free(doc);
}

/* updateNetwork: PUT {allowOut, denyOut, allow_internet_access} at the top level, replacing
 * the whole policy ("fields that are omitted are cleared"), translated as a create's network
 * is and applied through PUT /v1/sandboxes/{id}/network's code path (NetworkPolicyUpdate-
 * Requested, answered once egressd enforces it). Nothing said is the gateway's
 * network-default, as at create. egressProxy and rules (E2B's own proxy and per-host header
 * transforms) are refused: a policy here has no such thing. */
static void e2b_network(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    const char *body = req->entity.base ? req->entity.base : "";
    size_t len = req->entity.base ? req->entity.len : 0;
    char err[GW_ERR_MSG_MAX], jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;
    sp_buf_t b;

    sp_buf_init(&b);
    if (len > (size_t)rq->gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)rq->gw->cfg->max_body_bytes);
        goto out;
    }
    sp_json_limits_t lim = {
        .max_bytes = len + 1, .max_depth = 4, .max_nodes = 1024, .max_string = 1024};
    if (len > 0 && sp_json_parse(body, len, &lim, &doc, jerr) < 0) {
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body is not valid JSON: %s", jerr);
        goto out;
    }
    const sp_json_t *root = doc ? sp_json_root(doc) : NULL;
    if (root && sp_json_type(root) != SP_JSON_OBJECT) {
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body must be a JSON object");
        goto out;
    }
    static const char *const unserved[] = {"egressProxy", "rules"};
    for (size_t i = 0; i < sizeof(unserved) / sizeof(unserved[0]); i++) {
        const sp_json_t *v = member(root, unserved[i]);
        if (v && sp_json_type(v) != SP_JSON_NULL) {
            gw_respond_error(rq, 400, "invalid_field", NULL,
                             "network.%s is not served by this server (SPACE-C)", unserved[i]);
            goto out;
        }
    }
    if (network_policy(&b, "", root, member(root, "allow_internet_access"), err) < 0) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "%s", err);
        goto out;
    }
    if (b.len == 0) {
        sp_buf_puts(&b, "{\"mode\":");
        sp_buf_json_str(&b, rq->gw->cfg->network_default);
        sp_buf_putc(&b, '}');
    }
    gw_sandbox_network_put_body(rq, b.data, b.len);
out:
    sp_buf_dispose(&b);
    sp_json_doc_free(doc);
}

/* ---- timeout, pause, connect ---- */

static void e2b_timeout(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    char jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;
    int64_t t;
    size_t len = req->entity.base ? req->entity.len : 0;
    sp_json_limits_t lim = {.max_bytes = 4096, .max_depth = 2, .max_nodes = 16, .max_string = 256};

    if (len > (size_t)rq->gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)rq->gw->cfg->max_body_bytes);
        return;
    }
    if (len == 0 || sp_json_parse(req->entity.base, len, &lim, &doc, jerr) < 0 ||
        sp_json_int(member(sp_json_root(doc), "timeout"), 0, E2B_TIMEOUT_MAX, &t) < 0) {
        gw_respond_error(rq, 400, "invalid_field", NULL,
                         "the body must be {\"timeout\": seconds} with 0..%d", E2B_TIMEOUT_MAX);
        sp_json_doc_free(doc);
        return;
    }
    sp_json_doc_free(doc);
    /* Our timeout: a new deadline t seconds from now (SandboxTimeoutRequested); 204 once the log
     * has it. */
    gw_sandbox_set_timeout(rq, t > 0 ? (uint32_t)t : 1);
}

/* A body's "memory": absent or null is true. -EINVAL when it is not a boolean. E2B's false
 * (SDK keepMemory: false on pause, onResume "reboot" on connect) asks for a filesystem-only
 * snapshot that a resume cold-boots; a suspend here always keeps memory, processes and files
 * together (a checkpoint with its disk), so false is refused with 400 rather than ignored:
 * ignoring it would keep processes the caller asked to lose. */
static int memory_flag(const sp_json_t *root, bool *ret)
{
    const sp_json_t *m = member(root, "memory");
    *ret = true;
    if (!m || sp_json_type(m) == SP_JSON_NULL)
        return 0;
    return sp_json_bool(m, ret);
}

/* E2B pause is our suspend (memory kept); connect (and resume) of a paused sandbox our
 * resume. The body, {"memory": bool} since SDK 2.x, is optional. */
static void e2b_pause(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    char jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;
    bool memory = true;
    size_t len = req->entity.base ? req->entity.len : 0;
    sp_json_limits_t lim = {.max_bytes = 4096, .max_depth = 2, .max_nodes = 16, .max_string = 256};

    if (len > 4096) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds 4096 bytes");
        return;
    }
    if (len > 0 && (sp_json_parse(req->entity.base, len, &lim, &doc, jerr) < 0 ||
                    sp_json_type(sp_json_root(doc)) != SP_JSON_OBJECT ||
                    memory_flag(sp_json_root(doc), &memory) < 0)) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "the body must be {\"memory\": boolean}");
        sp_json_doc_free(doc);
        return;
    }
    sp_json_doc_free(doc);
    if (!memory) {
        gw_respond_error(rq, 400, "invalid_field", NULL,
                         "pause with memory false (keepMemory: false, a filesystem-only "
                         "snapshot) is not served: a pause here keeps memory, processes and "
                         "files; pause without keepMemory, or kill the sandbox");
        return;
    }
    snprintf(rq->path_action, sizeof(rq->path_action), "suspend");
    gw_sandbox_lifecycle(rq);
}

/* Connect {"timeout": s} (the body and the field optional): resume a paused sandbox, or move
 * a running one's deadline to s from now when that is later (E2B's "only extends"). */
static void e2b_connect(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    char jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;
    int64_t t = 0;
    bool memory = true;
    size_t len = req->entity.base ? req->entity.len : 0;
    sp_json_limits_t lim = {.max_bytes = 4096, .max_depth = 2, .max_nodes = 16, .max_string = 256};

    if (len > 4096) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds 4096 bytes");
        return;
    }
    if (len > 0) {
        const sp_json_t *to = NULL;
        if (sp_json_parse(req->entity.base, len, &lim, &doc, jerr) < 0 ||
            sp_json_type(sp_json_root(doc)) != SP_JSON_OBJECT ||
            ((to = member(sp_json_root(doc), "timeout")) && sp_json_type(to) != SP_JSON_NULL &&
             sp_json_int(to, 0, E2B_TIMEOUT_MAX, &t) < 0) ||
            memory_flag(sp_json_root(doc), &memory) < 0) {
            gw_respond_error(rq, 400, "invalid_field", NULL,
                             "the body must be {\"timeout\": seconds with 0..%d, \"memory\": "
                             "boolean}",
                             E2B_TIMEOUT_MAX);
            sp_json_doc_free(doc);
            return;
        }
        sp_json_doc_free(doc);
    }
    if (!memory) {
        gw_respond_error(rq, 400, "invalid_field", NULL,
                         "connect with memory false (onResume: 'reboot', a cold boot from the "
                         "filesystem) is not served: a resume here restores memory and "
                         "processes; connect without onResume");
        return;
    }
    snprintf(rq->path_action, sizeof(rq->path_action), "resume");
    gw_sandbox_connect(rq, (uint32_t)t);
}

/* ---- routing ---- */

/* E2B's control-plane resources that have no counterpart here (templates are built by the
 * workers, not through an API; volumes and secrets are not served): 501, which the SDK
 * reports as it is (a 404 would read as SandboxNotFoundError). The row's action names the
 * resource. */
static void e2b_unserved(gw_req_t *rq)
{
    gw_respond_error(rq, 501, "not_implemented", NULL,
                     "E2B's %s routes are not served by this server (SPACE-C)", rq->path_action);
}

/* A sandbox's route this server does not serve (the row's action names it). */
static void e2b_unserved_sub(gw_req_t *rq)
{
    gw_respond_error(rq, 501, "not_implemented", NULL,
                     "%s/sandboxes/{id}/%s is not served by this server (SPACE-C)",
                     strncmp(rq->path, "/v2/", 4) == 0 ? "/v2" : "", rq->path_action);
}

/* Anything else under /sandboxes: an id that cannot be one reads as an unknown sandbox. */
static void e2b_no_route(gw_req_t *rq)
{
    const char *p = rq->path + (strncmp(rq->path, "/v2/", 4) == 0 ? 3 : 0) + 10;
    size_t idlen = *p == '/' ? strcspn(p + 1, "/?") : 0;
    if (idlen == 0 || idlen > SP_ID_MAX)
        gw_respond_error(rq, 404, "not_found", NULL, "sandbox not found");
    else
        gw_respond_error(rq, 404, "not_found", NULL, "no such route");
}

/* clang-format off */
#define E2B(m, path, fn) {m, path, GW_DIALECT_E2B, GW_AUTH_E2B_KEY, GW_R_E2B_API, fn, 0, NULL}
#define E2B_UNSERVED(path, name, fn) \
    {"*", path, GW_DIALECT_E2B, GW_AUTH_PUBLIC, GW_R_E2B_API, fn, 0, name}
/* clang-format on */

/* E2B's control plane (api.e2b.app), rows of the one route table (gateway.h). */
const gw_route_def_t gw_e2b_routes[] = {
    /* Snapshots (docs/snapshots.md): the list, and deleteSnapshot's DELETE /templates/{id}
     * with a snapshot id. */
    E2B("GET", "/snapshots", gw_snapshot_list),
    {"DELETE", "/templates/{id}", GW_DIALECT_E2B, GW_AUTH_E2B_KEY, GW_R_E2B_API, gw_snapshot_delete,
     GW_ROUTE_SNAPSHOT, NULL},
    E2B_UNSERVED("/templates/*", "/templates", e2b_unserved),
    E2B_UNSERVED("/v2/templates/*", "/v2/templates", e2b_unserved),
    E2B_UNSERVED("/v3/templates/*", "/v3/templates", e2b_unserved),
    E2B_UNSERVED("/volumes/*", "/volumes", e2b_unserved),
    E2B_UNSERVED("/volumecontent/*", "/volumecontent", e2b_unserved),
    E2B_UNSERVED("/secrets/*", "/secrets", e2b_unserved),
    E2B("POST", "/sandboxes", e2b_create),
    E2B("GET", "/sandboxes", e2b_list),
    E2B("POST", "/sandboxes/", e2b_create),
    E2B("GET", "/sandboxes/", e2b_list),
    E2B("POST", "/v2/sandboxes", e2b_create),
    E2B("GET", "/v2/sandboxes", e2b_list),
    E2B("POST", "/v2/sandboxes/", e2b_create),
    E2B("GET", "/v2/sandboxes/", e2b_list),
    E2B("GET", "/sandboxes/{id}", e2b_get),
    E2B("DELETE", "/sandboxes/{id}", gw_sandbox_delete),
    E2B("GET", "/sandboxes/{id}/", e2b_get),
    E2B("DELETE", "/sandboxes/{id}/", gw_sandbox_delete),
    E2B("POST", "/sandboxes/{id}/connect", e2b_connect),
    E2B("POST", "/v2/sandboxes/{id}/connect", e2b_connect),
    E2B("POST", "/sandboxes/{id}/resume", e2b_connect),
    E2B("POST", "/sandboxes/{id}/pause", e2b_pause),
    E2B("POST", "/sandboxes/{id}/timeout", e2b_timeout),
    E2B("GET", "/sandboxes/{id}/metrics", gw_sandbox_metrics),
    E2B("PUT", "/sandboxes/{id}/network", e2b_network),
    E2B("POST", "/sandboxes/{id}/snapshots", gw_snapshot_take),
    E2B("POST", "/sandboxes/{id}/fork", gw_sandbox_fork),
    E2B_UNSERVED("/sandboxes/{id}/refreshes", "refreshes", e2b_unserved_sub),
    E2B_UNSERVED("/sandboxes/{id}/logs", "logs", e2b_unserved_sub),
    E2B_UNSERVED("/v2/sandboxes/{id}/refreshes", "refreshes", e2b_unserved_sub),
    E2B_UNSERVED("/v2/sandboxes/{id}/logs", "logs", e2b_unserved_sub),
    E2B_UNSERVED("/sandboxes/*", NULL, e2b_no_route),
    E2B_UNSERVED("/v2/sandboxes/*", NULL, e2b_no_route),
};
const size_t gw_n_e2b_routes = sizeof(gw_e2b_routes) / sizeof(gw_e2b_routes[0]);
