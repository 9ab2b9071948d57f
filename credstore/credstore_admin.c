/* space.io.cred.admin: the gateway's create, list, get, rotate and delete (docs/credentials.md).
 * A value arrives in a create or a rotate, is sealed, and is wiped from every buffer this
 * process held it in (the request as decoded and the message as received); no reply, log line
 * or event ever carries it. Everything in a request is checked here again: the gateway is a
 * client like any other (the bus only proves it is a gateway identity). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "credstore.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define ADMIN_MAX (64 * 1024)

typedef Space__Cred__V1__CredAdminRequest req_t;
typedef Space__Cred__V1__CredAdminReply rep_t;

static int invalid(rep_t *rep, char *detail, size_t cap, const char *what)
{
    snprintf(detail, cap, "%s", what);
    rep->error = "invalid";
    rep->detail = detail;
    return -EINVAL;
}

/* The rules a credential must meet, whoever sent it. */
static int check_meta(const Space__Cred__V1__CredMeta *m, const ProtobufCBinaryData *value,
                      rep_t *rep, char *detail, size_t cap)
{
    if (!m)
        return invalid(rep, detail, cap, "the credential is missing");
    if (!sp_cred_name_valid(m->name, strlen(m->name)))
        return invalid(rep, detail, cap,
                       "name must be 1..64 of [A-Za-z0-9_.-], starting with a letter or digit");
    int rank = sp_cred_scope_rank(m->scope_kind);
    if (rank < 0)
        return invalid(rep, detail, cap, "scope must be tenant, project or sandbox");
    if (rank == 2 && m->scope_id[0])
        return invalid(rep, detail, cap, "a tenant scope has no id");
    if (rank == 1 && !sp_cred_name_valid(m->scope_id, strlen(m->scope_id)))
        return invalid(rep, detail, cap, "scope.project must be 1..64 of [A-Za-z0-9_.-]");
    if (rank == 0 && !sp_id_valid(m->scope_id))
        return invalid(rep, detail, cap, "scope.sandbox must be a sandbox id");
    if (m->n_hosts == 0 || m->n_hosts > SP_CRED_HOSTS_MAX)
        return invalid(rep, detail, cap, "hosts must have 1 to 32 entries");
    for (size_t i = 0; i < m->n_hosts; i++) {
        sp_cred_host_t h;
        if (sp_cred_host_parse(m->hosts[i], &h) < 0) {
            snprintf(detail, cap,
                     "hosts[%zu] must be \"[METHOD[,METHOD...] ]name[/path-prefix]\" with a "
                     "lowercase DNS name or *.name",
                     i);
            rep->error = "invalid";
            rep->detail = detail;
            return -EINVAL;
        }
    }
    sp_cred_inject_t t = sp_cred_inject_parse(m->inject_type);
    if (!t)
        return invalid(rep, detail, cap, "inject.type must be header, bearer, basic or query");
    if (t == SP_CRED_HEADER && !sp_cred_header_name_valid(m->inject_name))
        return invalid(rep, detail, cap, "inject.name must be a header name (a token)");
    if (t == SP_CRED_QUERY && !sp_cred_param_name_valid(m->inject_name))
        return invalid(rep, detail, cap, "inject.name must be 1..64 of [A-Za-z0-9_.-]");
    if ((t == SP_CRED_BEARER || t == SP_CRED_BASIC) && m->inject_name[0])
        return invalid(rep, detail, cap, "inject.name is only for header and query");
    if (t == SP_CRED_BASIC && !sp_cred_user_valid(m->inject_user))
        return invalid(rep, detail, cap,
                       "inject.user must be visible ASCII without ':' (basic needs a user)");
    if (t != SP_CRED_BASIC && m->inject_user[0])
        return invalid(rep, detail, cap, "inject.user is only for basic");
    if (m->rate_per_minute > SP_CRED_RATE_MAX)
        return invalid(rep, detail, cap, "rate_per_minute must be 0 to 1000000");
    if (m->expires_at_us < 0)
        return invalid(rep, detail, cap, "expires_at must be a time");
    if (value && !sp_cred_value_valid(value->data, value->len))
        return invalid(rep, detail, cap,
                       "inject.value must be 1..4096 bytes of visible ASCII or spaces (no "
                       "control characters, no leading or trailing space)");
    return 0;
}

static cs_cred_t *cred_from(const req_t *q)
{
    const Space__Cred__V1__CredMeta *m = q->meta;
    cs_cred_t *c = sp_xcalloc(1, sizeof(*c));
    snprintf(c->tenant, sizeof(c->tenant), "%s", q->tenant);
    snprintf(c->name, sizeof(c->name), "%s", m->name);
    snprintf(c->scope_kind, sizeof(c->scope_kind), "%s", m->scope_kind);
    snprintf(c->scope_id, sizeof(c->scope_id), "%s", m->scope_id);
    c->n_hosts = m->n_hosts;
    c->hosts = sp_xcalloc(m->n_hosts, sizeof(char *));
    c->parsed = sp_xcalloc(m->n_hosts, sizeof(sp_cred_host_t));
    for (size_t i = 0; i < m->n_hosts; i++) {
        c->hosts[i] = sp_xstrdup(m->hosts[i]);
        (void)sp_cred_host_parse(c->hosts[i], &c->parsed[i]);
    }
    c->inject = sp_cred_inject_parse(m->inject_type);
    snprintf(c->inject_name, sizeof(c->inject_name), "%s", m->inject_name);
    snprintf(c->inject_user, sizeof(c->inject_user), "%s", m->inject_user);
    c->rate_per_minute = m->rate_per_minute;
    c->expires_at_us = m->expires_at_us;
    return c;
}

static void changed(cs_t *cs, const char *tenant, const char *id)
{
    Space__Cred__V1__CredChanged ch = SPACE__CRED__V1__CRED_CHANGED__INIT;
    ch.tenant = (char *)tenant;
    ch.id = (char *)id;
    uint8_t buf[256];
    if (space__cred__v1__cred_changed__get_packed_size(&ch) <= sizeof(buf)) {
        size_t n = space__cred__v1__cred_changed__pack(&ch, buf);
        (void)sp_bus_publish_core(cs->bus, SP_CRED_SUBJECT_CHANGED, buf, n);
    }
}

static void do_create(cs_t *cs, const req_t *q, rep_t *rep, Space__Cred__V1__CredMeta *out,
                      char *detail, size_t cap)
{
    if (check_meta(q->meta, &q->value, rep, detail, cap) < 0)
        return;
    cs_cred_t *c = cred_from(q);
    int rc = cs_store_create(cs, c, q->value.data, q->value.len);
    if (rc < 0) {
        rep->error = rc == -EEXIST ? "exists" : "db_unavailable";
        snprintf(detail, cap, "%s",
                 rc == -EEXIST ? "a credential of that name and scope exists"
                               : "the credential could not be stored");
        rep->detail = detail;
        cs_cred_free(c);
        return;
    }
    Space__V1__Envelope env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__CredentialCreated ev = SPACE__V1__CREDENTIAL_CREATED__INIT;
    Space__V1__CredentialScope sc = SPACE__V1__CREDENTIAL_SCOPE__INIT;
    sc.kind = c->scope_kind;
    sc.id = c->scope_id;
    ev.name = c->name;
    ev.scope = &sc;
    ev.hosts = c->hosts;
    ev.n_hosts = c->n_hosts;
    ev.inject_type = (char *)sp_cred_inject_name(c->inject);
    ev.inject_name = c->inject_name;
    ev.inject_user = c->inject_user;
    ev.rate_per_minute = c->rate_per_minute;
    ev.expires_at_us = c->expires_at_us;
    ev.version = c->version;
    ev.key_id = c->key_id;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_CREATED;
    env.credential_created = &ev;
    (void)cs_publish(cs, &env, c->tenant, c->id, q->actor, q->correlation_id);
    /* Cached answers from before it existed (egressd keeps them up to a second) are dropped
     * too: a new credential applies from the next request, as a rotation or a delete does. */
    changed(cs, c->tenant, c->id);
    sp_log(SP_LOG_INFO, "credential created", SP_KS("credential", c->id),
           SP_KS("tenant", c->tenant), SP_KS("name", c->name), SP_KS("scope", c->scope_kind),
           SP_KS("corr", q->correlation_id));
    cs_cred_meta(c, out);
    rep->ok = true;
}

static void *take(cs_t *cs, const req_t *q, rep_t *rep, char *detail, size_t cap)
{
    cs_cred_t *c = sp_id_valid(q->id) ? cs_store_find(cs, q->tenant, q->id) : NULL;
    if (!c) {
        rep->error = "not_found";
        snprintf(detail, cap, "%s", "no such credential");
        rep->detail = detail;
    }
    return c;
}

static void handle(cs_t *cs, const req_t *q, rep_t *rep, Space__Cred__V1__CredMeta **metas,
                   Space__Cred__V1__CredMeta *meta_store, char *detail, size_t cap)
{
    if (!sp_id_valid(q->tenant)) {
        invalid(rep, detail, cap, "tenant must be an id");
        return;
    }
    if (strcmp(q->op, "create") == 0) {
        do_create(cs, q, rep, &meta_store[0], detail, cap);
        if (rep->ok) {
            metas[0] = &meta_store[0];
            rep->creds = metas;
            rep->n_creds = 1;
        }
        return;
    }
    if (strcmp(q->op, "list") == 0) {
        size_t n = 0;
        for (size_t i = 0; i < cs->n_creds; i++) {
            if (strcmp(cs->creds[i]->tenant, q->tenant) != 0)
                continue;
            cs_cred_meta(cs->creds[i], &meta_store[n]);
            metas[n] = &meta_store[n];
            n++;
        }
        rep->creds = metas;
        rep->n_creds = n;
        rep->ok = true;
        return;
    }
    cs_cred_t *c = NULL;
    if (strcmp(q->op, "get") == 0 || strcmp(q->op, "rotate") == 0 || strcmp(q->op, "delete") == 0) {
        if (!(c = take(cs, q, rep, detail, cap)))
            return;
    } else {
        invalid(rep, detail, cap, "op must be create, list, get, rotate or delete");
        return;
    }
    Space__V1__Envelope env = SPACE__V1__ENVELOPE__INIT;
    if (strcmp(q->op, "rotate") == 0) {
        if (!sp_cred_value_valid(q->value.data, q->value.len)) {
            invalid(rep, detail, cap,
                    "value must be 1..4096 bytes of visible ASCII or spaces (no control "
                    "characters, no leading or trailing space)");
            return;
        }
        if (cs_store_rotate(cs, c, q->value.data, q->value.len) < 0) {
            rep->error = "db_unavailable";
            snprintf(detail, cap, "%s", "the new value could not be stored");
            rep->detail = detail;
            return;
        }
        Space__V1__CredentialRotated ev = SPACE__V1__CREDENTIAL_ROTATED__INIT;
        ev.version = c->version;
        ev.key_id = c->key_id;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_ROTATED;
        env.credential_rotated = &ev;
        (void)cs_publish(cs, &env, c->tenant, c->id, q->actor, q->correlation_id);
        changed(cs, c->tenant, c->id);
        sp_log(SP_LOG_INFO, "credential rotated", SP_KS("credential", c->id),
               SP_KU("version", c->version), SP_KS("corr", q->correlation_id));
    } else if (strcmp(q->op, "delete") == 0) {
        char id[SP_ID_MAX + 1], tenant[SP_ID_MAX + 1];
        snprintf(id, sizeof(id), "%s", c->id);
        snprintf(tenant, sizeof(tenant), "%s", c->tenant);
        if (cs_store_delete(cs, c) < 0) {
            rep->error = "db_unavailable";
            snprintf(detail, cap, "%s", "the credential could not be deleted");
            rep->detail = detail;
            return;
        }
        Space__V1__CredentialDeleted ev = SPACE__V1__CREDENTIAL_DELETED__INIT;
        ev.reason = "api";
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DELETED;
        env.credential_deleted = &ev;
        (void)cs_publish(cs, &env, tenant, id, q->actor, q->correlation_id);
        changed(cs, tenant, id);
        sp_log(SP_LOG_INFO, "credential deleted", SP_KS("credential", id),
               SP_KS("corr", q->correlation_id));
        rep->ok = true;
        rep->n_creds = 0;
        return;
    }
    cs_cred_meta(c, &meta_store[0]);
    metas[0] = &meta_store[0];
    rep->creds = metas;
    rep->n_creds = 1;
    rep->ok = true;
}

static void admin(cs_t *cs, const char *subject, const char *reply, const uint8_t *data, size_t len,
                  const char *signer)
{
    req_t *q =
        len <= ADMIN_MAX ? space__cred__v1__cred_admin_request__unpack(NULL, len, data) : NULL;
    /* The message as received may hold a value: wiped once decoded (cnats lends it for the
     * call and frees it after). */
    if (len)
        explicit_bzero((void *)data, len);
    if (!q || !reply) {
        sp_log(SP_LOG_WARN, "ignoring a bad admin request", SP_KS("subject", subject));
        if (q)
            space__cred__v1__cred_admin_request__free_unpacked(q, NULL);
        return;
    }
    rep_t rep = SPACE__CRED__V1__CRED_ADMIN_REPLY__INIT;
    char detail[256] = "";
    bool allowed = cs_caller_allowed(cs, CS_CALLER_GATEWAY, signer, reply);
    if (!allowed) {
        rep.error = "forbidden";
        rep.detail = "not a caller of the admin subject";
    }
    pthread_mutex_lock(&cs->mu);
    size_t cap = cs->n_creds + 1;
    Space__Cred__V1__CredMeta **metas = sp_xcalloc(cap, sizeof(Space__Cred__V1__CredMeta *));
    Space__Cred__V1__CredMeta *store = sp_xcalloc(cap, sizeof(*store));
    if (allowed)
        handle(cs, q, &rep, metas, store, detail, sizeof(detail));
    size_t n = space__cred__v1__cred_admin_reply__get_packed_size(&rep);
    uint8_t *buf = sp_xmalloc(n ? n : 1);
    space__cred__v1__cred_admin_reply__pack(&rep, buf);
    pthread_mutex_unlock(&cs->mu);
    (void)sp_bus_publish_core(cs->bus, reply, buf, n);
    free(buf);
    free(metas);
    free(store);
    if (q->value.len)
        explicit_bzero(q->value.data, q->value.len);
    space__cred__v1__cred_admin_request__free_unpacked(q, NULL);
}

static void on_admin(void *arg, const char *subject, const char *reply, const uint8_t *data,
                     size_t len)
{
    sp_request_t rq;
    if (cs_request_open(arg, subject, reply, data, len, &rq))
        admin(arg, subject, reply, rq.body, rq.len, rq.signer);
    sp_request_dispose(&rq); /* wipes the body: it may hold a value */
    /* The message as received holds it too: wiped (cnats lends it for the call). */
    if (len)
        explicit_bzero((void *)data, len);
}

int cs_admin_start(cs_t *cs)
{
    return sp_bus_subscribe(cs->bus, SP_CRED_SUBJECT_ADMIN, SP_CRED_QUEUE, on_admin, cs,
                            &cs->admin_sub);
}
