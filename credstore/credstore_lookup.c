/* space.io.cred.lookup: egressd asks which credentials a request of sandbox (tenant, project)
 * to host may carry (docs/credentials.md). Of the live credentials whose scope covers the
 * sandbox (its tenant, its project, itself) and one of whose host entries covers the host:
 * per name the nearest scope (sandbox, then project, then tenant); among those, per injection
 * target (a header name in any case, Authorization for bearer and basic, a query parameter)
 * the nearest scope again, then the smaller name, is injected without a placeholder. Every
 * grant carries its value, so a placeholder may name any of them. An expired credential is
 * answered without its value. With verification on, only for a sandbox the projection places
 * on the asker's host (signer egressd-<worker>; else "not_placed", nothing else in the reply).
 * The reply goes to the asker's inbox only, and its buffers are wiped once sent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "credstore.h"
#include "natsauth.h"
#include "envelope.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define LOOKUP_MAX 4096
#define GRANTS_MAX 64

bool cs_caller_allowed(cs_t *cs, cs_caller_t kind, const char *signer, const char *reply)
{
    /* Behind the NATS permissions (only gateways publish admin requests, only egressd
     * lookups; each identity reads only its own inbox) and the signed request: the answer
     * (values, for a lookup) goes only to the signer's own inbox. That a lookup's sandbox
     * lives on the asking egressd's host (and a data key's on the asking worker) is checked
     * after this, against the projection (cs_placed_on). */
    if (sp_verifier_mode(cs->verifier) == SP_VERIFY_OFF)
        return true;
    sp_identity_t id;
    char want[SP_INBOX_MAX + 2];
    if (!signer || sp_identity_parse(signer, &id) < 0 ||
        id.kind != (kind == CS_CALLER_GATEWAY  ? SP_KIND_GATEWAY
                    : kind == CS_CALLER_WORKER ? SP_KIND_WORKER
                                               : SP_KIND_EGRESSD))
        return false;
    snprintf(want, sizeof(want), "_INBOX.%s.", id.name);
    return reply && strncmp(reply, want, strlen(want)) == 0;
}

bool cs_request_open(cs_t *cs, const char *subject, const char *reply, const uint8_t *data,
                     size_t len, sp_request_t *rq)
{
    char reason[SP_REASON_MAX];
    int rc = sp_request_take(cs->guard, cs->bus, subject, reply, data, len, rq, reason);
    if (rc != 0)
        sp_log(rc < 0 ? SP_LOG_WARN : SP_LOG_INFO,
               rc < 0 ? "request refused" : "request would be refused (verify-signatures=log)",
               SP_KS("subject", subject), SP_KS("signer", rq->signer), SP_KS("reason", reason));
    if (rc < 0) {
        pthread_mutex_lock(&cs->mu);
        cs->denied_callers++;
        pthread_mutex_unlock(&cs->mu);
        sp_series_inc(sp_metric_only(cs->m_refused));
    }
    return rc >= 0;
}

static bool applies(const cs_cred_t *c, const Space__Cred__V1__CredLookupRequest *q)
{
    if (strcmp(c->tenant, q->tenant) != 0)
        return false;
    switch (sp_cred_scope_rank(c->scope_kind)) {
    case 2:
        return true;
    case 1:
        return q->project[0] && strcmp(c->scope_id, q->project) == 0;
    case 0:
        return strcmp(c->scope_id, q->sandbox) == 0;
    default:
        return false;
    }
}

static void target_of(const cs_cred_t *c, char *out, size_t cap)
{
    if (c->inject == SP_CRED_BEARER || c->inject == SP_CRED_BASIC)
        snprintf(out, cap, "h:authorization");
    else if (c->inject == SP_CRED_HEADER) {
        snprintf(out, cap, "h:%s", c->inject_name);
        for (char *p = out; *p; p++)
            *p = (char)((*p >= 'A' && *p <= 'Z') ? *p + 32 : *p);
    } else
        snprintf(out, cap, "q:%s", c->inject_name);
}

/* a before b: nearer scope, then the smaller name. */
static bool better(const cs_cred_t *a, const cs_cred_t *b)
{
    int ra = sp_cred_scope_rank(a->scope_kind), rb = sp_cred_scope_rank(b->scope_kind);
    return ra != rb ? ra < rb : strcmp(a->name, b->name) < 0;
}

static void lookup(cs_t *cs, const char *subject, const char *reply, const uint8_t *data,
                   size_t len, const char *signer)
{
    Space__Cred__V1__CredLookupRequest *q =
        len <= LOOKUP_MAX ? space__cred__v1__cred_lookup_request__unpack(NULL, len, data) : NULL;
    if (!q || !reply) {
        sp_log(SP_LOG_WARN, "ignoring a bad lookup", SP_KS("subject", subject));
        cs_metrics_lookup(cs, CS_LOOKUP_MALFORMED);
        if (q)
            space__cred__v1__cred_lookup_request__free_unpacked(q, NULL);
        return;
    }
    Space__Cred__V1__CredLookupReply rep = SPACE__CRED__V1__CRED_LOOKUP_REPLY__INIT;
    Space__Cred__V1__CredGrant grant_store[GRANTS_MAX];
    Space__Cred__V1__CredGrant *grants[GRANTS_MAX];
    const cs_cred_t *picked[GRANTS_MAX];
    char *rules[GRANTS_MAX][SP_CRED_HOSTS_MAX];
    uint8_t *values[GRANTS_MAX] = {0};
    size_t n = 0;
    if (!cs_caller_allowed(cs, CS_CALLER_EGRESSD, signer, reply)) {
        rep.error = "forbidden";
        cs_metrics_lookup(cs, CS_LOOKUP_FORBIDDEN);
        goto send;
    }
    if (!sp_id_valid(q->tenant) || !sp_id_valid(q->sandbox) || !q->host[0]) {
        rep.error = "invalid";
        cs_metrics_lookup(cs, CS_LOOKUP_INVALID);
        goto send;
    }
    pthread_mutex_lock(&cs->mu);
    if (sp_verifier_mode(cs->verifier) != SP_VERIFY_OFF) {
        /* Only for a sandbox the projection places on the signer's host (egressd-<worker>):
         * an egressd never reads another host's credentials. */
        sp_identity_t id;
        int rc = sp_identity_parse(signer, &id) < 0
                     ? 0
                     : cs_placed_on(cs, q->tenant, q->sandbox, id.instance);
        if (rc != 1) {
            pthread_mutex_unlock(&cs->mu);
            rep.error = rc == 0 ? "not_placed" : "db_unavailable";
            cs_metrics_lookup(cs, rc == 0 ? CS_LOOKUP_NOT_PLACED : CS_LOOKUP_UNAVAILABLE);
            sp_log(SP_LOG_WARN, "lookup refused", SP_KS("signer", signer),
                   SP_KS("tenant", q->tenant), SP_KS("sandbox", q->sandbox),
                   SP_KS("error", rep.error));
            goto send;
        }
    }
    cs->lookups++;
    for (size_t i = 0; i < cs->n_creds; i++) {
        const cs_cred_t *c = cs->creds[i];
        if (!applies(c, q))
            continue;
        bool covers = false;
        for (size_t h = 0; h < c->n_hosts && !covers; h++)
            covers = sp_cred_host_covers(&c->parsed[h], q->host);
        if (!covers)
            continue;
        /* Per name, the nearest scope. */
        size_t j = 0;
        while (j < n && strcmp(picked[j]->name, c->name) != 0)
            j++;
        if (j < n) {
            if (better(c, picked[j]))
                picked[j] = c;
            continue;
        }
        if (n < GRANTS_MAX)
            picked[n++] = c;
    }
    int64_t now = sp_now_us();
    for (size_t i = 0; i < n; i++) {
        const cs_cred_t *c = picked[i];
        Space__Cred__V1__CredGrant *g = &grant_store[i];
        Space__Cred__V1__CredGrant init = SPACE__CRED__V1__CRED_GRANT__INIT;
        *g = init;
        grants[i] = g;
        g->id = (char *)c->id;
        g->name = (char *)c->name;
        g->version = c->version;
        g->scope_kind = (char *)c->scope_kind;
        g->inject_type = (char *)sp_cred_inject_name(c->inject);
        g->inject_name = (char *)c->inject_name;
        g->inject_user = (char *)c->inject_user;
        g->rate_per_minute = c->rate_per_minute;
        g->expires_at_us = c->expires_at_us;
        size_t nr = 0;
        for (size_t h = 0; h < c->n_hosts; h++)
            if (sp_cred_host_covers(&c->parsed[h], q->host))
                rules[i][nr++] = c->hosts[h];
        g->rules = rules[i];
        g->n_rules = nr;
        char ti[80], tj[80];
        target_of(c, ti, sizeof(ti));
        g->inject = true;
        for (size_t j = 0; j < n && g->inject; j++) {
            if (j == i)
                continue;
            target_of(picked[j], tj, sizeof(tj));
            if (strcasecmp(ti, tj) == 0 && better(picked[j], c))
                g->inject = false;
        }
        if (c->expires_at_us && c->expires_at_us <= now)
            continue; /* no value for an expired credential */
        values[i] = sp_xmalloc(SP_CRED_VALUE_MAX);
        int vl = cs_store_open_value(cs, c, values[i]);
        if (vl < 0) {
            sp_log(SP_LOG_ERROR, "a credential does not open", SP_KS("credential", c->id));
            continue;
        }
        g->value.data = values[i];
        g->value.len = (size_t)vl;
    }
    rep.grants = grants;
    rep.n_grants = n;
    rep.ok = true;
    cs_metrics_lookup(cs, n ? CS_LOOKUP_GRANTED : CS_LOOKUP_NONE);
    {
        size_t plen = space__cred__v1__cred_lookup_reply__get_packed_size(&rep);
        uint8_t *buf = sp_xmalloc(plen ? plen : 1);
        space__cred__v1__cred_lookup_reply__pack(&rep, buf);
        pthread_mutex_unlock(&cs->mu);
        (void)sp_bus_publish_core(cs->bus, reply, buf, plen);
        explicit_bzero(buf, plen);
        free(buf);
        for (size_t i = 0; i < n; i++) {
            if (values[i])
                explicit_bzero(values[i], SP_CRED_VALUE_MAX);
            free(values[i]);
        }
    }
    space__cred__v1__cred_lookup_request__free_unpacked(q, NULL);
    return;
send : {
    size_t plen = space__cred__v1__cred_lookup_reply__get_packed_size(&rep);
    uint8_t buf[128];
    if (plen <= sizeof(buf)) {
        space__cred__v1__cred_lookup_reply__pack(&rep, buf);
        (void)sp_bus_publish_core(cs->bus, reply, buf, plen);
    }
}
    space__cred__v1__cred_lookup_request__free_unpacked(q, NULL);
}

static void on_lookup(void *arg, const char *subject, const char *reply, const uint8_t *data,
                      size_t len)
{
    sp_request_t rq;
    if (cs_request_open(arg, subject, reply, data, len, &rq))
        lookup(arg, subject, reply, rq.body, rq.len, rq.signer);
    sp_request_dispose(&rq);
}

int cs_lookup_start(cs_t *cs)
{
    return sp_bus_subscribe(cs->bus, SP_CRED_SUBJECT_LOOKUP, SP_CRED_QUEUE, on_lookup, cs,
                            &cs->lookup_sub);
}
