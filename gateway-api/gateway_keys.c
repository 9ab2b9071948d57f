/* API keys through the API, for admin keys only (any other key: 403):
 *
 *   POST   /v1/keys {tenant, name?, admin?}  201 {id, tenant, name, admin, created_at, key}:
 *                                            the key is in this answer and nowhere else
 *   GET    /v1/keys[?tenant=T]               200 {keys: [{id, tenant, name, admin, created_at,
 *                                            last_used_at, revoked_at}]}, oldest first: never
 *                                            a key, revoked ones included
 *   DELETE /v1/keys/{id}                     204; 404 when no live key has that id
 *
 * A tenant exists once a key names it; its name follows sp_id_valid (the rule of tenants on the
 * bus). The key leaves this process only in the 201's body: the answer buffer is wiped once h2o
 * has it, and no log line or event carries it (the log line names the key's id). A revocation
 * reaches every gateway's auth cache through the NOTIFY of api_keys' trigger (gateway_auth.c). */
#include "gateway.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apikey.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define LIST_MAX 10000 /* keys in one list answer; beyond, "truncated": true */

typedef enum { K_CREATE = 1, K_LIST, K_REVOKE } keys_op_t;

typedef struct {
    gw_job_t job;
    gw_req_t *rq; /* holds a reference */
    keys_op_t op;
    char tenant[SP_ID_MAX + 1]; /* create: the new key's; list: the filter ("" = every tenant) */
    char name[SP_APIKEY_NAME_MAX + 1];
    bool admin;
    char id[SP_ID_MAX + 1];
    int rc;
    char *key; /* create: the new key (wiped) */
    sp_buf_t out;
} keys_job_t;

static int64_t col_us(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

#define KEY_COLUMNS                                                                                \
    "id, tenant, name, admin, (extract(epoch FROM created_at) * 1000000)::int8, "                  \
    "(extract(epoch FROM last_used_at) * 1000000)::int8, "                                         \
    "(extract(epoch FROM revoked_at) * 1000000)::int8"

/* A row of KEY_COLUMNS, without the closing brace (create adds the key). */
static void key_json(sp_buf_t *b, const PGresult *r, int row)
{
    sp_buf_puts(b, "{\"id\":");
    sp_buf_json_str(b, PQgetvalue(r, row, 0));
    sp_buf_puts(b, ",\"tenant\":");
    sp_buf_json_str(b, PQgetvalue(r, row, 1));
    sp_buf_puts(b, ",\"name\":");
    sp_buf_json_str(b, PQgetvalue(r, row, 2));
    sp_buf_printf(b, ",\"admin\":%s,\"created_at\":",
                  strcmp(PQgetvalue(r, row, 3), "t") == 0 ? "true" : "false");
    gw_json_time(b, col_us(r, row, 4));
    sp_buf_puts(b, ",\"last_used_at\":");
    gw_json_time(b, col_us(r, row, 5));
    sp_buf_puts(b, ",\"revoked_at\":");
    gw_json_time(b, col_us(r, row, 6));
}

static void keys_run(gw_job_t *job, PGconn *db)
{
    keys_job_t *j = (keys_job_t *)job;
    PGresult *r = NULL;
    char id[SP_APIKEY_ID_LEN + 1];

    switch (j->op) {
    case K_CREATE: {
        j->rc = sp_apikey_mint(db, j->tenant, j->name, j->admin, &j->key, id);
        if (j->rc < 0)
            return;
        const char *p[1] = {id};
        r = PQexecParams(db, "SELECT " KEY_COLUMNS " FROM api_keys WHERE id = $1", 1, NULL, p, NULL,
                         NULL, 0);
        if (sp_db_check(r, PGRES_TUPLES_OK) < 0 || PQntuples(r) != 1) {
            j->rc = SP_EDB;
            break;
        }
        key_json(&j->out, r, 0);
        sp_buf_puts(&j->out, ",\"key\":");
        sp_buf_json_str(&j->out, j->key);
        sp_buf_putc(&j->out, '}');
        snprintf(j->id, sizeof(j->id), "%s", id);
        break;
    }
    case K_LIST: {
        char lim[16];
        snprintf(lim, sizeof(lim), "%d", LIST_MAX + 1);
        const char *p[2] = {j->tenant, lim};
        r = PQexecParams(db,
                         "SELECT " KEY_COLUMNS " FROM api_keys WHERE ($1 = '' OR tenant = $1) "
                         "ORDER BY created_at, id LIMIT $2",
                         2, NULL, p, NULL, NULL, 0);
        if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
            j->rc = SP_EDB;
            break;
        }
        int n = PQntuples(r), shown = n > LIST_MAX ? LIST_MAX : n;
        sp_buf_puts(&j->out, "{\"keys\":[");
        for (int i = 0; i < shown; i++) {
            if (i)
                sp_buf_putc(&j->out, ',');
            key_json(&j->out, r, i);
            sp_buf_putc(&j->out, '}');
        }
        sp_buf_printf(&j->out, "],\"truncated\":%s}", n > LIST_MAX ? "true" : "false");
        break;
    }
    case K_REVOKE:
        j->rc = sp_apikey_revoke(db, j->id);
        break;
    }
    PQclear(r);
}

static void keys_free(keys_job_t *j)
{
    if (j->key) {
        explicit_bzero(j->key, strlen(j->key));
        free(j->key);
    }
    if (j->out.data)
        explicit_bzero(j->out.data, j->out.len); /* a create's holds the key */
    sp_buf_dispose(&j->out);
    free(j);
}

static void keys_done(gw_job_t *job)
{
    keys_job_t *j = (keys_job_t *)job;
    gw_req_t *rq = j->rq;

    if (j->rc == SP_ENOTFOUND) {
        gw_respond_error(rq, 404, "not_found", NULL, "no live key has id %s", j->id);
    } else if (j->rc < 0) {
        sp_log(SP_LOG_WARN, "key operation failed", SP_KS("error", sp_strerror(j->rc)),
               SP_KS("request_id", rq->request_id));
        gw_respond_error(rq, 503, "unavailable", NULL, "the database is not available; retry");
    } else if (j->op == K_REVOKE) {
        /* Here at once; the other gateways by the NOTIFY of the revocation. */
        gw_auth_flush(rq->gw);
        sp_log(SP_LOG_INFO, "api key revoked", SP_KS("key_id", j->id), SP_KS("by", rq->key_id),
               SP_KS("request_id", rq->request_id));
        gw_respond(rq, 204, "application/json", NULL, 0);
    } else {
        if (j->op == K_CREATE)
            sp_log(SP_LOG_INFO, "api key created", SP_KS("key_id", j->id),
                   SP_KS("key_tenant", j->tenant), SP_KS("admin", j->admin ? "true" : "false"),
                   SP_KS("by", rq->key_id), SP_KS("request_id", rq->request_id));
        gw_respond_json(rq, j->op == K_CREATE ? 201 : 200, &j->out);
    }
    gw_req_unref(rq);
    keys_free(j);
}

static void submit(gw_req_t *rq, keys_job_t *j)
{
    j->rq = rq;
    sp_buf_init(&j->out);
    j->job.run = keys_run;
    j->job.done = keys_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &j->job) < 0) {
        gw_req_unref(rq);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
        keys_free(j);
    }
}

static int parse_create(keys_job_t *j, const sp_json_t *root, gw_verr_t *e)
{
    if (sp_json_type(root) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_json", "the body must be a JSON object");
    bool have_tenant = false;
    for (size_t i = 0; i < sp_json_len(root); i++) {
        const char *k = sp_json_key_at(root, i);
        const sp_json_t *v = sp_json_at(root, i);
        size_t n = 0;
        const char *s = sp_json_str(v, &n);
        if (strcmp(k, "tenant") == 0) {
            if (!s || n > SP_ID_MAX || memchr(s, '\0', n) || !sp_id_valid(s))
                return gw_bad(e, "invalid_field",
                              "tenant must be 1 to 64 characters of [a-z0-9_-], starting with a "
                              "letter or digit");
            memcpy(j->tenant, s, n + 1);
            have_tenant = true;
        } else if (strcmp(k, "name") == 0) {
            if (!s || memchr(s, '\0', n) || !gw_text_ok(s, SP_APIKEY_NAME_MAX))
                return gw_bad(e, "invalid_field",
                              "name must be text of at most %d bytes without control characters",
                              SP_APIKEY_NAME_MAX);
            memcpy(j->name, s, n + 1);
        } else if (strcmp(k, "admin") == 0) {
            if (sp_json_bool(v, &j->admin) < 0)
                return gw_bad(e, "invalid_field", "admin must be true or false");
        } else {
            return gw_bad(e, "unknown_field", "unknown field %s", k);
        }
    }
    if (!have_tenant)
        return gw_bad(e, "missing_field", "tenant is required");
    return 0;
}

static void create(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
    const char *body = req->entity.base ? req->entity.base : "";
    size_t len = req->entity.base ? req->entity.len : 0;
    char err[GW_ERR_MSG_MAX], jerr[SP_JSON_ERR_MAX];
    gw_verr_t e = {.code = NULL, .msg = err};

    if (ct && !gw_json_content_type(ct)) {
        gw_respond_error(rq, 415, "unsupported_media_type", NULL,
                         "send the body as application/json");
        return;
    }
    sp_json_doc_t *doc = NULL;
    sp_json_limits_t lim = {.max_bytes = 4096, .max_depth = 2, .max_nodes = 16, .max_string = 256};
    if (len == 0 || sp_json_parse(body, len, &lim, &doc, jerr) < 0) {
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body is not a JSON object: %s",
                         len == 0 ? "empty" : jerr);
        return;
    }
    keys_job_t *j = sp_xcalloc(1, sizeof(*j));
    j->op = K_CREATE;
    int rc = parse_create(j, sp_json_root(doc), &e);
    sp_json_doc_free(doc);
    if (rc < 0) {
        gw_respond_error(rq, 400, e.code ? e.code : "invalid_field", NULL, "%s", err);
        free(j);
        return;
    }
    submit(rq, j);
}

static void list(gw_req_t *rq)
{
    gw_query_t q;
    if (gw_query_parse(rq->req, &q) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "malformed query string");
        return;
    }
    keys_job_t *j = sp_xcalloc(1, sizeof(*j));
    j->op = K_LIST;
    for (size_t i = 0; i < q.n; i++) {
        if (strcmp(q.p[i].key, "tenant") != 0) {
            gw_respond_error(rq, 400, "invalid_query", NULL, "unknown parameter %s", q.p[i].key);
            free(j);
            return;
        }
        if (!sp_id_valid(q.p[i].value)) {
            gw_respond_error(rq, 400, "invalid_query", NULL, "tenant is not a tenant name");
            free(j);
            return;
        }
        snprintf(j->tenant, sizeof(j->tenant), "%s", q.p[i].value);
    }
    submit(rq, j);
}

void gw_keys(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    bool one = rq->path_id[0] != '\0';

    if (!rq->admin) {
        gw_respond_error(rq, 403, "forbidden", NULL, "managing keys takes an admin key");
        return;
    }
    if (one && h2o_memis(req->method.base, req->method.len, H2O_STRLIT("DELETE"))) {
        keys_job_t *j = sp_xcalloc(1, sizeof(*j));
        j->op = K_REVOKE;
        snprintf(j->id, sizeof(j->id), "%s", rq->path_id);
        submit(rq, j);
    } else if (!one && h2o_memis(req->method.base, req->method.len, H2O_STRLIT("POST"))) {
        create(rq);
    } else if (!one && h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET"))) {
        list(rq);
    } else {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ALLOW, NULL,
                       one ? "DELETE" : "GET, POST", one ? 6 : 9);
        gw_respond_error(rq, 405, "method_not_allowed", NULL, "allowed: %s",
                         one ? "DELETE" : "GET, POST");
    }
}
