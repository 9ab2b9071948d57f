/* Audit of egress decisions: one EgressAllowed / EgressDenied event per distinct (sandbox,
 * verdict, protocol, name, address, port, rule, reason) per flush interval, with a count. A
 * guest that floods (a query loop, a connect loop) produces at most audit_keys_max events per
 * interval in total; what does not fit is counted in the log line of the flush, not lost
 * silently. Events are published asynchronously so the loop never waits for the bus. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "egressd.h"
#include "error.h"
#include "log.h"
#include "publish.h"
#include "xmalloc.h"

typedef struct {
    char sandbox[65], tenant[65];
    bool allowed;
    const char *protocol; /* static */
    char name[254];
    char address[16];
    uint16_t port;
    char rule[300];
    char reason[64];
    uint32_t count;
    int64_t first_us, last_us;
} entry_t;

struct eg_audit {
    entry_t *v;
    size_t n, cap;
    uint64_t dropped;
    uv_timer_t timer;
};

static int64_t wall_us(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

void eg_audit(eg_t *eg, const eg_sbx_t *s, bool allowed, const char *protocol, const char *name,
              uint32_t addr_be, uint16_t port, const char *rule, const char *reason)
{
    eg_audit_t *a = eg->audit;
    char addr[16] = "";
    eg_metrics_decision(eg, allowed, protocol, reason);
    if (addr_be) {
        struct in_addr in = {.s_addr = addr_be};
        inet_ntop(AF_INET, &in, addr, sizeof(addr));
    }
    int64_t now = wall_us();
    for (size_t i = 0; i < a->n; i++) {
        entry_t *e = &a->v[i];
        if (e->allowed == allowed && e->port == port && strcmp(e->sandbox, s->id) == 0 &&
            strcmp(e->protocol, protocol) == 0 && strcmp(e->name, name) == 0 &&
            strcmp(e->address, addr) == 0 && strcmp(e->reason, reason) == 0 &&
            strcmp(e->rule, rule) == 0) {
            e->count++;
            e->last_us = now;
            return;
        }
    }
    if (a->n >= (size_t)eg->cfg->audit_keys_max) {
        a->dropped++;
        return;
    }
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->v = sp_xreallocarray(a->v, a->cap, sizeof(*a->v));
    }
    entry_t *e = &a->v[a->n++];
    memset(e, 0, sizeof(*e));
    snprintf(e->sandbox, sizeof(e->sandbox), "%s", s->id);
    snprintf(e->tenant, sizeof(e->tenant), "%s", s->tenant);
    e->allowed = allowed;
    e->protocol = protocol;
    snprintf(e->name, sizeof(e->name), "%s", name);
    snprintf(e->address, sizeof(e->address), "%s", addr);
    e->port = port;
    snprintf(e->rule, sizeof(e->rule), "%s", rule);
    snprintf(e->reason, sizeof(e->reason), "%s", reason);
    e->count = 1;
    e->first_us = e->last_us = now;
    sp_log(allowed ? SP_LOG_DEBUG : SP_LOG_INFO, allowed ? "egress allowed" : "egress denied",
           SP_KS("sandbox", s->id), SP_KS("protocol", protocol), SP_KS("name", name),
           SP_KS("address", addr), SP_KU("port", port), SP_KS("rule", rule),
           SP_KS("reason", reason));
}

void eg_audit_flush(eg_t *eg)
{
    eg_audit_t *a = eg->audit;
    sp_burst_t burst;
    sp_burst_init(&burst);
    for (size_t i = 0; i < a->n; i++) {
        entry_t *e = &a->v[i];
        sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
        Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
        Space__V1__EgressDecision d = SPACE__V1__EGRESS_DECISION__INIT;
        Space__V1__EgressAllowed al = SPACE__V1__EGRESS_ALLOWED__INIT;
        Space__V1__EgressDenied de = SPACE__V1__EGRESS_DENIED__INIT;
        agg.kind = "sandbox";
        agg.id = e->sandbox;
        env.aggregate = &agg;
        env.tenant = e->tenant;
        env.actor = "svc:egressd";
        d.protocol = (char *)e->protocol;
        d.name = e->name;
        d.address = e->address;
        d.port = e->port;
        d.rule = e->rule;
        d.reason = e->reason;
        d.count = e->count;
        d.first_at_us = e->first_us;
        d.last_at_us = e->last_us;
        if (e->allowed) {
            al.decision = &d;
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_ALLOWED;
            env.egress_allowed = &al;
        } else {
            de.decision = &d;
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED;
            env.egress_denied = &de;
        }
        int rc = sp_burst_add(&burst, &env, NULL);
        if (rc < 0)
            sp_log(SP_LOG_WARN, "audit event not published", SP_KS("sandbox", e->sandbox),
                   SP_KS("error", sp_strerror(rc)));
    }
    /* One signed batch for the whole flush (sign.h): one Ed25519 signature, not one each. */
    int brc = sp_burst_publish_async(eg->bus, &burst);
    if (brc < 0)
        sp_log(SP_LOG_WARN, "audit events not all published", SP_KS("error", sp_strerror(brc)));
    sp_burst_dispose(&burst);
    if (a->dropped)
        sp_log(SP_LOG_WARN, "audit records over the per-interval limit", SP_KU("records", a->n),
               SP_KU("dropped_decisions", a->dropped));
    a->n = 0;
    a->dropped = 0;
}

static void on_flush(uv_timer_t *t)
{
    eg_audit_flush(t->data);
    eg_cred_flush(t->data);
}

int eg_audit_start(eg_t *eg)
{
    eg->audit = sp_xcalloc(1, sizeof(*eg->audit));
    uv_timer_init(eg->loop, &eg->audit->timer);
    eg->audit->timer.data = eg;
    return uv_timer_start(&eg->audit->timer, on_flush, (uint64_t)eg->cfg->audit_flush_ms,
                          (uint64_t)eg->cfg->audit_flush_ms);
}

static void on_closed(uv_handle_t *h)
{
    eg_audit_t *a = h->data;
    free(a->v);
    free(a);
}

void eg_audit_stop(eg_t *eg)
{
    if (!eg->audit)
        return;
    eg_audit_flush(eg);
    uv_timer_stop(&eg->audit->timer);
    eg->audit->timer.data = eg->audit;
    uv_close((uv_handle_t *)&eg->audit->timer, on_closed);
    eg->audit = NULL;
}
