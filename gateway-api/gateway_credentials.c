/* Credentials through the API (docs/credentials.md): POST/GET /v1/credentials,
 * GET/PUT/DELETE /v1/credentials/{id}. The gateway checks the body's shape strictly (types,
 * unknown fields, sizes) and space-credstore checks the rest (names, hosts, values: one set
 * of rules, lib/cred.c) and answers with a clear message. The tenant is the API key's. A
 * value goes from the request body into one CredAdminRequest to credstore (a bus job), and
 * every copy this process made is wiped once it is sent: the body as h2o read it, the parsed
 * document's string, the packed request. No answer, log line or error carries it. */
#include "gateway.h"
#include "request.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cred.h"
#include "credstore.pb-c.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "text.h"
#include "xmalloc.h"

#define CRED_TIMEOUT_MS 5000

typedef struct {
    gw_bus_job_t bus;
    gw_req_t *rq; /* holds a reference */
    Space__Cred__V1__CredAdminRequest q;
    Space__Cred__V1__CredMeta meta;
    char op[8];
    char tenant[SP_ID_MAX + 1], actor[SP_ID_MAX + 1], corr[GW_REQUEST_ID_MAX + 1];
    char id[SP_ID_MAX + 1];
    char name[SP_CRED_NAME_MAX + 1], scope_kind[8], scope_id[SP_ID_MAX + 1];
    char *hosts[SP_CRED_HOSTS_MAX];
    size_t n_hosts;
    char inject_type[8], inject_name[65], inject_user[257];
    uint8_t *value;
    size_t value_len;
    int rc;
    Space__Cred__V1__CredAdminReply *reply;
    int created; /* 201 on success */
} cred_job_t;

static void job_free(cred_job_t *x)
{
    for (size_t i = 0; i < x->n_hosts; i++)
        free(x->hosts[i]);
    if (x->value) {
        explicit_bzero(x->value, x->value_len);
        free(x->value);
    }
    if (x->reply)
        space__cred__v1__cred_admin_reply__free_unpacked(x->reply, NULL);
    free(x);
}

static void bus_run(gw_bus_job_t *job)
{
    cred_job_t *x = job->arg;
    Space__Cred__V1__CredAdminRequest *q = &x->q;
    q->op = x->op;
    q->tenant = x->tenant;
    q->actor = x->actor;
    q->correlation_id = x->corr;
    q->id = x->id;
    if (strcmp(x->op, "create") == 0) {
        x->meta.name = x->name;
        x->meta.scope_kind = x->scope_kind;
        x->meta.scope_id = x->scope_id;
        x->meta.hosts = x->hosts;
        x->meta.n_hosts = x->n_hosts;
        x->meta.inject_type = x->inject_type;
        x->meta.inject_name = x->inject_name;
        x->meta.inject_user = x->inject_user;
        q->meta = &x->meta;
    }
    q->value = (ProtobufCBinaryData){x->value_len, x->value};
    size_t len = space__cred__v1__cred_admin_request__get_packed_size(q);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    space__cred__v1__cred_admin_request__pack(q, buf);
    uint8_t *reply = NULL;
    size_t reply_len = 0;
    x->rc = sp_request_send(x->rq->gw->bus, SP_CRED_SUBJECT_ADMIN, buf, len, CRED_TIMEOUT_MS,
                            &reply, &reply_len);
    explicit_bzero(buf, len);
    free(buf);
    if (x->value) {
        explicit_bzero(x->value, x->value_len);
        free(x->value);
        x->value = NULL;
    }
    if (x->rc == 0) {
        x->reply = reply_len <= SP_BUS_MAX_MSG
                       ? space__cred__v1__cred_admin_reply__unpack(NULL, reply_len, reply)
                       : NULL;
        if (!x->reply)
            x->rc = -EPROTO;
    }
    free(reply);
}

static void time_json(sp_buf_t *b, const char *key, int64_t us)
{
    if (!us) {
        sp_buf_printf(b, ",\"%s\":null", key);
        return;
    }
    time_t t = (time_t)(us / 1000000);
    struct tm tm;
    char s[40];
    gmtime_r(&t, &tm);
    strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%SZ", &tm);
    sp_buf_printf(b, ",\"%s\":\"%s\"", key, s);
}

/* A credential as the API shows it: everything but its value. */
static void meta_json(sp_buf_t *b, const Space__Cred__V1__CredMeta *m)
{
    sp_buf_puts(b, "{\"id\":");
    sp_buf_json_str(b, m->id);
    sp_buf_puts(b, ",\"name\":");
    sp_buf_json_str(b, m->name);
    sp_buf_puts(b, ",\"scope\":{\"kind\":");
    sp_buf_json_str(b, m->scope_kind);
    if (m->scope_id[0]) {
        sp_buf_printf(b, ",\"%s\":", m->scope_kind);
        sp_buf_json_str(b, m->scope_id);
    }
    sp_buf_puts(b, "},\"hosts\":[");
    for (size_t i = 0; i < m->n_hosts; i++) {
        if (i)
            sp_buf_putc(b, ',');
        sp_buf_json_str(b, m->hosts[i]);
    }
    sp_buf_puts(b, "],\"inject\":{\"type\":");
    sp_buf_json_str(b, m->inject_type);
    if (m->inject_name[0]) {
        sp_buf_puts(b, ",\"name\":");
        sp_buf_json_str(b, m->inject_name);
    }
    if (m->inject_user[0]) {
        sp_buf_puts(b, ",\"user\":");
        sp_buf_json_str(b, m->inject_user);
    }
    sp_buf_printf(b, "},\"rate_per_minute\":%u,\"version\":%u", m->rate_per_minute, m->version);
    time_json(b, "expires_at", m->expires_at_us);
    time_json(b, "created_at", m->created_at_us);
    time_json(b, "rotated_at", m->rotated_at_us);
    sp_buf_puts(b, ",\"placeholder\":");
    char ph[SP_CRED_NAME_MAX + 16];
    snprintf(ph, sizeof(ph), SP_CRED_PLACEHOLDER "%s", m->name);
    sp_buf_json_str(b, ph);
    sp_buf_putc(b, '}');
}

static void bus_done(gw_bus_job_t *job)
{
    cred_job_t *x = job->arg;
    gw_req_t *rq = x->rq;
    const Space__Cred__V1__CredAdminReply *r = x->reply;
    if (x->rc == SP_ENOTFOUND || x->rc == SP_ETIMEOUT) {
        gw_respond_error(rq, 503, "credstore_unavailable", NULL,
                         "space-credstore did not answer; retry");
    } else if (x->rc < 0) {
        gw_respond_error(rq, 502, "credstore_error", NULL, "space-credstore: %s",
                         sp_strerror(x->rc));
    } else if (!r->ok) {
        const char *e = r->error;
        int status = strcmp(e, "not_found") == 0   ? 404
                     : strcmp(e, "exists") == 0    ? 409
                     : strcmp(e, "invalid") == 0   ? 400
                     : strcmp(e, "forbidden") == 0 ? 403
                                                   : 503;
        gw_respond_error(rq, status, status == 400 ? "invalid_field" : e, NULL, "%s",
                         r->detail[0] ? r->detail : e);
    } else {
        sp_buf_t b;
        sp_buf_init(&b);
        if (strcmp(x->op, "list") == 0) {
            sp_buf_puts(&b, "{\"credentials\":[");
            for (size_t i = 0; i < r->n_creds; i++) {
                if (i)
                    sp_buf_putc(&b, ',');
                meta_json(&b, r->creds[i]);
            }
            sp_buf_puts(&b, "]}");
            gw_respond_json(rq, 200, &b);
        } else if (strcmp(x->op, "delete") == 0) {
            gw_respond(rq, 204, "application/json", NULL, 0);
        } else if (r->n_creds == 1) {
            meta_json(&b, r->creds[0]);
            gw_respond_json(rq, x->created ? 201 : 200, &b);
        } else {
            gw_respond_error(rq, 502, "credstore_error", NULL, "an unexpected answer");
        }
        sp_buf_dispose(&b);
    }
    gw_req_unref(rq);
    job_free(x);
}

static cred_job_t *job_new(gw_req_t *rq, const char *op)
{
    cred_job_t *x = sp_xcalloc(1, sizeof(*x));
    Space__Cred__V1__CredAdminRequest qi = SPACE__CRED__V1__CRED_ADMIN_REQUEST__INIT;
    Space__Cred__V1__CredMeta mi = SPACE__CRED__V1__CRED_META__INIT;
    x->q = qi;
    x->meta = mi;
    x->rq = rq;
    snprintf(x->op, sizeof(x->op), "%s", op);
    snprintf(x->tenant, sizeof(x->tenant), "%s", rq->tenant);
    snprintf(x->actor, sizeof(x->actor), "%s", rq->key_id);
    snprintf(x->corr, sizeof(x->corr), "%s", rq->request_id);
    snprintf(x->id, sizeof(x->id), "%s", rq->path_id);
    return x;
}

static void submit(cred_job_t *x)
{
    x->bus.arg = x;
    x->bus.run = bus_run;
    x->bus.done = bus_done;
    gw_req_ref(x->rq);
    gw_bus_submit(x->rq->gw, &x->rq->gw->bus_lane, &x->bus);
}

/* Wipes the request body (h2o's buffer) and the parsed document's copy of the value. */
static void wipe_body(gw_req_t *rq, const sp_json_t *value)
{
    size_t n = 0;
    const char *s = sp_json_str(value, &n);
    if (s && n)
        explicit_bzero((char *)s, n);
    if (rq->req && rq->req->entity.base && rq->req->entity.len)
        explicit_bzero((char *)rq->req->entity.base, rq->req->entity.len);
}

static int copy_str(const sp_json_t *v, char *out, size_t cap, const char *what, gw_verr_t *e)
{
    size_t n = 0;
    const char *s = sp_json_str(v, &n);
    if (!s)
        return gw_bad(e, "invalid_field", "%s must be a string", what);
    if (n >= cap || memchr(s, '\0', n))
        return gw_bad(e, "invalid_field", "%s is longer than %zu bytes", what, cap - 1);
    memcpy(out, s, n);
    out[n] = '\0';
    return 0;
}

static int parse_create(cred_job_t *x, const sp_json_t *root, const sp_json_t **ret_value,
                        gw_verr_t *e)
{
    if (sp_json_type(root) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_json", "the body must be a JSON object");
    snprintf(x->scope_kind, sizeof(x->scope_kind), "tenant");
    bool have_name = false, have_hosts = false, have_inject = false;
    for (size_t i = 0; i < sp_json_len(root); i++) {
        const char *k = sp_json_key_at(root, i);
        const sp_json_t *v = sp_json_at(root, i);
        int rc = 0;
        if (strcmp(k, "name") == 0) {
            rc = copy_str(v, x->name, sizeof(x->name), "name", e);
            have_name = true;
        } else if (strcmp(k, "scope") == 0) {
            if (sp_json_type(v) != SP_JSON_OBJECT)
                return gw_bad(e, "invalid_field", "scope must be an object");
            for (size_t j = 0; j < sp_json_len(v) && rc == 0; j++) {
                const char *sk = sp_json_key_at(v, j);
                if (strcmp(sk, "project") != 0 && strcmp(sk, "sandbox") != 0)
                    return gw_bad(e, "unknown_field", "unknown field scope.%s", sk);
                if (strcmp(x->scope_kind, "tenant") != 0)
                    return gw_bad(e, "invalid_field",
                                  "scope names a project or a sandbox, not both");
                snprintf(x->scope_kind, sizeof(x->scope_kind), "%s", sk);
                rc = copy_str(sp_json_at(v, j), x->scope_id, sizeof(x->scope_id),
                              strcmp(sk, "project") == 0 ? "scope.project" : "scope.sandbox", e);
            }
        } else if (strcmp(k, "hosts") == 0) {
            if (sp_json_type(v) != SP_JSON_ARRAY || sp_json_len(v) == 0 ||
                sp_json_len(v) > SP_CRED_HOSTS_MAX)
                return gw_bad(e, "invalid_field", "hosts must be an array of 1 to %d strings",
                              SP_CRED_HOSTS_MAX);
            for (size_t j = 0; j < sp_json_len(v); j++) {
                char h[SP_CRED_HOST_MAX + 1];
                char what[40];
                snprintf(what, sizeof(what), "hosts[%zu]", j);
                if ((rc = copy_str(sp_json_at(v, j), h, sizeof(h), what, e)) < 0)
                    return rc;
                x->hosts[x->n_hosts++] = sp_xstrdup(h);
            }
            have_hosts = true;
        } else if (strcmp(k, "inject") == 0) {
            if (sp_json_type(v) != SP_JSON_OBJECT)
                return gw_bad(e, "invalid_field", "inject must be an object");
            for (size_t j = 0; j < sp_json_len(v) && rc == 0; j++) {
                const char *ik = sp_json_key_at(v, j);
                const sp_json_t *iv = sp_json_at(v, j);
                if (strcmp(ik, "type") == 0)
                    rc = copy_str(iv, x->inject_type, sizeof(x->inject_type), "inject.type", e);
                else if (strcmp(ik, "name") == 0)
                    rc = copy_str(iv, x->inject_name, sizeof(x->inject_name), "inject.name", e);
                else if (strcmp(ik, "user") == 0)
                    rc = copy_str(iv, x->inject_user, sizeof(x->inject_user), "inject.user", e);
                else if (strcmp(ik, "value") == 0) {
                    if (!sp_json_str(iv, NULL))
                        return gw_bad(e, "invalid_field", "inject.value must be a string");
                    *ret_value = iv;
                } else
                    return gw_bad(e, "unknown_field", "unknown field inject.%s", ik);
            }
            have_inject = true;
        } else if (strcmp(k, "rate_per_minute") == 0) {
            int64_t r = 0;
            if (sp_json_int(v, 0, SP_CRED_RATE_MAX, &r) < 0)
                return gw_bad(e, "invalid_field", "rate_per_minute must be an integer from 0 to %d",
                              SP_CRED_RATE_MAX);
            x->meta.rate_per_minute = (uint32_t)r;
        } else if (strcmp(k, "expires_at") == 0) {
            const char *s = sp_json_str(v, NULL);
            if (sp_time_parse(s, &x->meta.expires_at_us) < 0)
                return gw_bad(e, "invalid_field",
                              "expires_at must be a UTC time like \"2030-01-02T03:04:05Z\"");
        } else {
            return gw_bad(e, "unknown_field", "unknown field %s", k);
        }
        if (rc < 0)
            return rc;
    }
    if (!have_name)
        return gw_bad(e, "missing_field", "name is required");
    if (!have_hosts)
        return gw_bad(e, "missing_field", "hosts is required");
    if (!have_inject || !x->inject_type[0])
        return gw_bad(e, "missing_field", "inject.type is required");
    if (!*ret_value)
        return gw_bad(e, "missing_field", "inject.value is required");
    return 0;
}

static int parse_rotate(const sp_json_t *root, const sp_json_t **ret_value, gw_verr_t *e)
{
    if (sp_json_type(root) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_json", "the body must be a JSON object");
    for (size_t i = 0; i < sp_json_len(root); i++) {
        const char *k = sp_json_key_at(root, i);
        if (strcmp(k, "value") != 0)
            return gw_bad(e, "unknown_field", "unknown field %s (a rotation takes a value)", k);
        if (!sp_json_str(sp_json_at(root, i), NULL))
            return gw_bad(e, "invalid_field", "value must be a string");
        *ret_value = sp_json_at(root, i);
    }
    if (!*ret_value)
        return gw_bad(e, "missing_field", "value is required");
    return 0;
}

static void with_body(gw_req_t *rq, const char *op)
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
    if (len > (size_t)rq->gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)rq->gw->cfg->max_body_bytes);
        return;
    }
    sp_json_doc_t *doc = NULL;
    sp_json_limits_t lim = {
        .max_bytes = len + 1, .max_depth = 4, .max_nodes = 256, .max_string = 8192};
    if (len == 0 || sp_json_parse(body, len, &lim, &doc, jerr) < 0) {
        if (len)
            explicit_bzero((char *)body, len);
        /* The parser's message quotes an offset, never the bytes. */
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body is not a JSON object: %s",
                         len == 0 ? "empty" : jerr);
        return;
    }
    cred_job_t *x = job_new(rq, op);
    const sp_json_t *value = NULL;
    int rc = strcmp(op, "create") == 0 ? parse_create(x, sp_json_root(doc), &value, &e)
                                       : parse_rotate(sp_json_root(doc), &value, &e);
    if (rc == 0) {
        size_t n = 0;
        const char *s = sp_json_str(value, &n);
        x->value = sp_xmalloc(n ? n : 1);
        memcpy(x->value, s, n);
        x->value_len = n;
        x->created = strcmp(op, "create") == 0;
    }
    wipe_body(rq, value);
    sp_json_doc_free(doc);
    if (rc < 0) {
        gw_respond_error(rq, 400, e.code ? e.code : "invalid_field", NULL, "%s", err);
        job_free(x);
        return;
    }
    submit(x);
}

void gw_credentials(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    bool one = rq->path_id[0] != '\0';
    if (one && !sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such credential");
        return;
    }
    if (h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET"))) {
        submit(job_new(rq, one ? "get" : "list"));
    } else if (!one && h2o_memis(req->method.base, req->method.len, H2O_STRLIT("POST"))) {
        with_body(rq, "create");
    } else if (one && h2o_memis(req->method.base, req->method.len, H2O_STRLIT("PUT"))) {
        with_body(rq, "rotate");
    } else if (one && h2o_memis(req->method.base, req->method.len, H2O_STRLIT("DELETE"))) {
        submit(job_new(rq, "delete"));
    } else {
        gw_respond_error(rq, 405, "method_not_allowed", NULL, "allowed: %s",
                         one ? "GET, PUT, DELETE" : "GET, POST");
    }
}
