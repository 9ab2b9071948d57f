/* Sandboxes, their policies and DNS attributions, and the decisions (docs/egress.md).
 *
 * What egressd knows comes only from its worker's subject (space.ev.sbx.<worker>.>):
 * SandboxPlaced carries the create request and so the policy, SandboxStarted the address,
 * NetworkPolicyUpdateRequested a new policy (answered with NetworkPolicyChanged),
 * SandboxDeleted / SandboxFailed the end. A sandbox without a known policy gets deny_all. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "egressd.h"
#include "error.h"
#include "log.h"
#include "publish.h"
#include "xmalloc.h"

#define ATTRS_MAX 4096 /* per sandbox: beyond this the oldest attributions go first */

int64_t eg_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

eg_sbx_t *eg_sbx_by_id(eg_t *eg, const char *id)
{
    for (size_t i = 0; i < eg->n_sbx; i++)
        if (strcmp(eg->sbx[i]->id, id) == 0)
            return eg->sbx[i];
    return NULL;
}

eg_sbx_t *eg_sbx_by_addr(eg_t *eg, uint32_t addr_be)
{
    if (!addr_be)
        return NULL;
    for (size_t i = 0; i < eg->n_sbx; i++)
        if (eg->sbx[i]->addr_be == addr_be)
            return eg->sbx[i];
    return NULL;
}

static void strv_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static void policy_clear(eg_sbx_t *s)
{
    strv_free(s->allow_text, s->n_allow);
    strv_free(s->deny_text, s->n_deny);
    free(s->allow);
    free(s->deny);
    s->allow_text = s->deny_text = NULL;
    s->allow = s->deny = NULL;
    s->n_allow = s->n_deny = 0;
    s->mode = SP_NET_DENY_ALL;
}

static void sbx_free(eg_sbx_t *s)
{
    policy_clear(s);
    free(s->attrs);
    free(s);
}

void eg_sbx_free_all(eg_t *eg)
{
    for (size_t i = 0; i < eg->n_sbx; i++)
        sbx_free(eg->sbx[i]);
    free(eg->sbx);
    eg->sbx = NULL;
    eg->n_sbx = eg->cap_sbx = 0;
}

static eg_sbx_t *sbx_get_or_add(eg_t *eg, const char *id, const char *tenant)
{
    eg_sbx_t *s = eg_sbx_by_id(eg, id);
    if (s)
        return s;
    if (eg->n_sbx == eg->cap_sbx) {
        eg->cap_sbx = eg->cap_sbx ? eg->cap_sbx * 2 : 64;
        eg->sbx = sp_xreallocarray(eg->sbx, eg->cap_sbx, sizeof(eg_sbx_t *));
    }
    s = sp_xcalloc(1, sizeof(*s));
    snprintf(s->id, sizeof(s->id), "%s", id);
    snprintf(s->tenant, sizeof(s->tenant), "%s", tenant);
    s->mode = SP_NET_DENY_ALL;
    eg->sbx[eg->n_sbx++] = s;
    return s;
}

static void sbx_remove(eg_t *eg, const char *id)
{
    for (size_t i = 0; i < eg->n_sbx; i++) {
        if (strcmp(eg->sbx[i]->id, id) == 0) {
            sbx_free(eg->sbx[i]);
            eg->sbx[i] = eg->sbx[--eg->n_sbx];
            return;
        }
    }
}

/* The event was validated (lib/envelope.c parsed every entry once already); an entry that
 * fails here anyway is skipped, which can only make the policy stricter. */
static void policy_set(eg_sbx_t *s, const Space__V1__NetworkPolicy *p)
{
    policy_clear(s);
    /* Validated already; a value that is not valid anyway means the default. */
    s->rate[EG_UP] = p && sp_netpolicy_rate_valid(p->up_bytes_per_s) ? p->up_bytes_per_s : 0;
    s->rate[EG_DOWN] = p && sp_netpolicy_rate_valid(p->down_bytes_per_s) ? p->down_bytes_per_s : 0;
    if (!p || sp_netmode_parse(p->mode, &s->mode) < 0) {
        s->mode = SP_NET_DENY_ALL;
        return;
    }
    s->allow = sp_xcalloc(p->n_allow + 1, sizeof(*s->allow));
    s->allow_text = sp_xcalloc(p->n_allow + 1, sizeof(char *));
    for (size_t i = 0; i < p->n_allow; i++)
        if (sp_netentry_parse(p->allow[i], &s->allow[s->n_allow]) == 0)
            s->allow_text[s->n_allow++] = sp_xstrdup(p->allow[i]);
    s->deny = sp_xcalloc(p->n_deny + 1, sizeof(*s->deny));
    s->deny_text = sp_xcalloc(p->n_deny + 1, sizeof(char *));
    for (size_t i = 0; i < p->n_deny; i++)
        if (sp_netentry_parse(p->deny[i], &s->deny[s->n_deny]) == 0)
            s->deny_text[s->n_deny++] = sp_xstrdup(p->deny[i]);
}

static void answer_update(eg_t *eg, const sp_envelope_t *ev)
{
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__NetworkPolicyChanged ch = SPACE__V1__NETWORK_POLICY_CHANGED__INIT;
    char id[37], msg_id[96];
    sp_envelope_answer(&env, &agg, ev, "svc:egressd");
    ch.network = ev->network_policy_update_requested->network;
    ch.egressd = eg->cfg->worker_id;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_CHANGED;
    env.network_policy_changed = &ch;
    snprintf(msg_id, sizeof(msg_id), "netpol:%s", ev->event_id);
    int rc = sp_publish_event_retry(eg->bus, &env, id, NULL, msg_id, SP_PUBLISH_FACT_BUDGET_MS);
    if (rc < 0)
        sp_log(SP_LOG_ERROR, "cannot publish NetworkPolicyChanged",
               SP_KS("sandbox", ev->aggregate->id), SP_KS("error", sp_strerror(rc)),
               SP_KS("corr", ev->correlation_id));
}

/* The sandbox's source address from now on (its start, or its resume in a new netns). */
static void set_address(eg_t *eg, const sp_envelope_t *ev, const char *address)
{
    struct in_addr a;
    if (inet_pton(AF_INET, address, &a) != 1)
        return;
    eg_sbx_t *s = sbx_get_or_add(eg, ev->aggregate->id, ev->tenant);
    /* An address is one sandbox's at a time: a stale holder (deleted while we were not
     * listening) loses it. */
    eg_sbx_t *old = eg_sbx_by_addr(eg, a.s_addr);
    if (old && old != s)
        old->addr_be = 0;
    s->addr_be = a.s_addr;
    sp_log(SP_LOG_INFO, "sandbox address", SP_KS("sandbox", ev->aggregate->id),
           SP_KS("address", address), SP_KS("mode", sp_netmode_name(s->mode)));
}

int eg_placement(void *arg, const char *tenant, const char *sandbox,
                 char worker[SP_INSTANCE_MAX + 1])
{
    eg_t *eg = arg;
    eg_sbx_t *s = eg_sbx_by_id(eg, sandbox);
    if (!s || strcmp(s->tenant, tenant) != 0)
        return 0;
    if (!s->placed_here)
        return 2;
    snprintf(worker, SP_INSTANCE_MAX + 1, "%s", eg->cfg->worker_id);
    return 1;
}

void eg_apply_event(eg_t *eg, const sp_envelope_t *ev, uint64_t seq)
{
    const char *id = ev->aggregate->id;
    eg_sbx_t *s;
    switch (ev->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED:
        if (strcmp(ev->sandbox_placed->worker, eg->cfg->worker_id) != 0)
            return;
        s = sbx_get_or_add(eg, id, ev->tenant);
        s->placed_here = true;
        /* A placement for resume has no request: the policy it had stays. */
        if (ev->sandbox_placed->request) {
            policy_set(s, ev->sandbox_placed->request->network);
            snprintf(s->project, sizeof(s->project), "%s", ev->sandbox_placed->request->project);
        }
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED:
        set_address(eg, ev, ev->sandbox_started->address);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_FAILED:
        /* It runs on: its connections are its own again (eg_reset_drain froze them). */
        if ((s = eg_sbx_by_id(eg, id)))
            s->frozen_until_ms = 0;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED:
        if ((s = eg_sbx_by_id(eg, id)))
            s->frozen_until_ms = 0;
        /* From suspend, in a new netns (from pause: no address, nothing changed). */
        if (ev->sandbox_resumed->address[0] &&
            strcmp(ev->sandbox_resumed->worker, eg->cfg->worker_id) == 0)
            set_address(eg, ev, ev->sandbox_resumed->address);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOTTED:
        /* A named snapshot (docs/snapshots.md): restored in place, in a new netns. */
        if ((s = eg_sbx_by_id(eg, id)))
            s->frozen_until_ms = 0;
        if (ev->sandbox_snapshotted->address[0] &&
            strcmp(ev->sandbox_snapshotted->worker, eg->cfg->worker_id) == 0)
            set_address(eg, ev, ev->sandbox_snapshotted->address);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED:
        /* Its address goes back to the pool; the policy stays for the resume. The checkpoint
         * held no endpoint in TIME_WAIT. */
        if ((s = eg_sbx_by_id(eg, id))) {
            s->addr_be = 0;
            s->time_wait_until_ms = 0;
            s->placed_here = false; /* its resume is placed again, maybe elsewhere */
        }
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_UPDATE_REQUESTED:
        s = eg_sbx_by_id(eg, id);
        if (!s)
            return;
        policy_set(s, ev->network_policy_update_requested->network);
        sp_log(SP_LOG_INFO, "policy changed", SP_KS("sandbox", id),
               SP_KS("mode", sp_netmode_name(s->mode)), SP_KU("allow", s->n_allow),
               SP_KU("deny", s->n_deny), SP_KS("corr", ev->correlation_id));
        if (seq > eg->live_from_seq)
            answer_update(eg, ev);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED:
        sbx_remove(eg, id);
        break;
    default:
        break;
    }
}

static void rule_text(eg_verdict_t *v, const char *kind, const char *text)
{
    snprintf(v->rule, sizeof(v->rule), "%s:%s", kind, text);
}

/* One destination as the rules see it: a name (DNS, SNI, Host) or an IPv4 address. */
typedef struct {
    const char *name;
    uint32_t addr; /* host order; used when name is NULL */
    uint16_t port;
} eg_dest_t;

static bool entry_matches(const sp_netentry_t *e, const eg_dest_t *d)
{
    return d->name ? sp_netentry_match_name(e, d->name, d->port)
                   : sp_netentry_match_addr(e, d->addr, d->port);
}

/* Deny rules win, then the mode; an allowlist lets through what one of its rules matches.
 * `fallback` is the reason when nothing matched and the mode is not deny_all. */
static void decide(const eg_sbx_t *s, const eg_dest_t *d, const char *fallback, eg_verdict_t *v)
{
    memset(v, 0, sizeof(*v));
    for (size_t i = 0; i < s->n_deny; i++) {
        if (entry_matches(&s->deny[i], d)) {
            v->reason = "denied_by_rule";
            rule_text(v, "deny", s->deny_text[i]);
            return;
        }
    }
    if (s->mode == SP_NET_ALLOW_ALL) {
        v->allow = true;
        v->reason = "allow_all";
        rule_text(v, "mode", "allow_all");
        return;
    }
    if (s->mode == SP_NET_ALLOWLIST) {
        for (size_t i = 0; i < s->n_allow; i++) {
            if (entry_matches(&s->allow[i], d)) {
                v->allow = true;
                v->reason = "allowed_by_rule";
                rule_text(v, "allow", s->allow_text[i]);
                return;
            }
        }
    }
    v->reason = s->mode == SP_NET_DENY_ALL ? "deny_all" : fallback;
    rule_text(v, "mode", sp_netmode_name(s->mode));
}

void eg_decide_name(const eg_sbx_t *s, const char *name, uint16_t port, eg_verdict_t *v)
{
    eg_dest_t d = {.name = name, .port = port};
    decide(s, &d, "not_allowed", v);
}

void eg_decide_addr(const eg_sbx_t *s, uint32_t addr_be, uint16_t port, eg_verdict_t *v)
{
    eg_dest_t d = {.addr = ntohl(addr_be), .port = port};
    decide(s, &d, "no_rule", v);
}

bool eg_has_name_denies(const eg_sbx_t *s)
{
    for (size_t i = 0; i < s->n_deny; i++)
        if (s->deny[i].kind != SP_NETE_CIDR)
            return true;
    return false;
}

void eg_attribute(const eg_t *eg, eg_sbx_t *s, const char *name, uint32_t addr_be, uint32_t ttl)
{
    int64_t now = eg_now_ms();
    int64_t expires = now + ((int64_t)ttl + eg->cfg->attribution_grace_s) * 1000;
    for (size_t i = 0; i < s->n_attrs; i++) {
        eg_attr_t *a = &s->attrs[i];
        if (a->addr_be == addr_be && strcmp(a->name, name) == 0) {
            a->resolved_ms = now;
            if (expires > a->expires_ms)
                a->expires_ms = expires;
            return;
        }
    }
    if (s->n_attrs == ATTRS_MAX) {
        size_t oldest = 0;
        for (size_t i = 1; i < s->n_attrs; i++)
            if (s->attrs[i].expires_ms < s->attrs[oldest].expires_ms)
                oldest = i;
        s->attrs[oldest] = s->attrs[--s->n_attrs];
    }
    if (s->n_attrs == s->cap_attrs) {
        s->cap_attrs = s->cap_attrs ? s->cap_attrs * 2 : 16;
        s->attrs = sp_xreallocarray(s->attrs, s->cap_attrs, sizeof(*s->attrs));
    }
    eg_attr_t *a = &s->attrs[s->n_attrs++];
    snprintf(a->name, sizeof(a->name), "%s", name);
    a->addr_be = addr_be;
    a->resolved_ms = now;
    a->expires_ms = expires;
}

bool eg_attributed(eg_sbx_t *s, const char *name, uint32_t addr_be)
{
    int64_t now = eg_now_ms();
    for (size_t i = 0; i < s->n_attrs; i++)
        if (s->attrs[i].addr_be == addr_be && s->attrs[i].expires_ms > now &&
            strcasecmp(s->attrs[i].name, name) == 0)
            return true;
    return false;
}

uint32_t eg_resolved_addr(eg_sbx_t *s, const char *name)
{
    int64_t now = eg_now_ms(), best = -1;
    uint32_t addr = 0;
    for (size_t i = 0; i < s->n_attrs; i++) {
        const eg_attr_t *a = &s->attrs[i];
        if (a->expires_ms > now && a->resolved_ms > best && strcasecmp(a->name, name) == 0) {
            best = a->resolved_ms;
            addr = a->addr_be;
        }
    }
    return addr;
}

void eg_expire_attributions(eg_t *eg)
{
    int64_t now = eg_now_ms();
    for (size_t k = 0; k < eg->n_sbx; k++) {
        eg_sbx_t *s = eg->sbx[k];
        for (size_t i = 0; i < s->n_attrs;) {
            if (s->attrs[i].expires_ms <= now)
                s->attrs[i] = s->attrs[--s->n_attrs];
            else
                i++;
        }
    }
}

/* ---- destinations no policy opens (eg_addr_refusal) ---- */

typedef struct {
    uint32_t net, mask; /* host order */
    const char *why;
} eg_range_t;

/* RFC 6890's special-purpose blocks that are never a site on the internet, and the private
 * ones a policy may name. 198.18.0.0/15 (benchmarking) and the documentation blocks are left
 * out on purpose: the tests' "internet" lives there. */
static const eg_range_t never[] = {
    {0x00000000, 0xff000000, "dest_reserved"},   /* 0/8 "this network" */
    {0x7f000000, 0xff000000, "dest_loopback"},   /* 127/8 */
    {0xa9fe0000, 0xffff0000, "dest_link_local"}, /* 169.254/16: metadata services */
    {0xe0000000, 0xf0000000, "dest_reserved"},   /* 224/4 multicast */
    {0xf0000000, 0xf0000000, "dest_reserved"},   /* 240/4, broadcast included */
};
static const eg_range_t private_ranges[] = {
    {0x0a000000, 0xff000000, "dest_private"}, /* 10/8 (RFC 1918) */
    {0xac100000, 0xfff00000, "dest_private"}, /* 172.16/12 */
    {0xc0a80000, 0xffff0000, "dest_private"}, /* 192.168/16 */
    {0x64400000, 0xffc00000, "dest_private"}, /* 100.64/10 (CGNAT, RFC 6598) */
};

static void read_host_addrs(eg_t *eg)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) < 0)
        return; /* the last list stays: better than none */
    size_t n = 0, cap = 16;
    uint32_t *v = sp_xmalloc(cap * sizeof(*v));
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        if (n == cap)
            v = sp_xrealloc(v, (cap *= 2) * sizeof(*v));
        v[n++] = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr;
    }
    freeifaddrs(ifs);
    free(eg->host_addrs);
    eg->host_addrs = v;
    eg->n_host_addrs = n;
}

static bool is_host_addr(eg_t *eg, uint32_t addr_be)
{
    int64_t now = eg_now_ms();
    if (!eg->host_addrs || now - eg->host_addrs_ms >= 1000) {
        read_host_addrs(eg);
        eg->host_addrs_ms = now;
    }
    if (!eg->host_addrs)
        return true; /* never read: every address might be one of ours (fail closed) */
    for (size_t i = 0; i < eg->n_host_addrs; i++)
        if (eg->host_addrs[i] == addr_be)
            return true;
    return false;
}

const char *eg_addr_refusal(eg_t *eg, const eg_sbx_t *s, uint32_t addr_be, uint16_t port)
{
    uint32_t a = ntohl(addr_be);
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++)
        if ((a & never[i].mask) == never[i].net)
            return never[i].why;
    if ((a & eg->pool.mask) == eg->pool.net || eg_sbx_by_addr(eg, addr_be))
        return "dest_sandbox";
    if (is_host_addr(eg, addr_be))
        return "dest_host";
    for (size_t i = 0; i < sizeof(private_ranges) / sizeof(private_ranges[0]); i++) {
        const eg_range_t *r = &private_ranges[i];
        if ((a & r->mask) != r->net)
            continue;
        for (size_t k = 0; k < s->n_allow; k++) {
            const sp_netentry_t *e = &s->allow[k];
            if (e->kind == SP_NETE_CIDR && (e->mask & r->mask) == r->mask &&
                (e->net & r->mask) == r->net && sp_netentry_match_addr(e, a, port))
                return NULL;
        }
        return r->why;
    }
    return NULL;
}

void eg_addr_dispose(eg_t *eg)
{
    free(eg->host_addrs);
    eg->host_addrs = NULL;
    eg->n_host_addrs = 0;
}
