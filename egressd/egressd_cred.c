/* Credentials at the network layer (docs/credentials.md). For every allowed request head,
 * plain or inside terminated TLS, egressd asks space-credstore which credentials the sandbox's
 * request to that host may carry (space.io.cred.lookup), keeps the answer for at most
 * cred_cache_ms (1 s; a CredChanged from credstore, a rotation or a deletion, drops every
 * cached answer at once), and rewrites the head: the credentials that won their target are
 * injected (the guest's header of that name, or query parameter, dropped first), placeholders
 * "space-cred:<name>" replaced by the value of the credential of that name, and a placeholder
 * left over (another host's credential, an unknown name, another case) refuses the request
 * (credential_scope). An expired credential refuses the request it would go into
 * (credential_expired); a credential over its rate (a token bucket per credential, per
 * egressd: requests per minute, a minute's worth of burst) answers 429 (rate_limited).
 * credstore not answering refuses the request (credstore_unavailable, 503): a request never
 * leaves without the credentials it should carry. For a second after a failed lookup egressd
 * does not ask again (so a dead credstore costs one timeout per second, not one per request).
 * credstore answering "not_placed" (its projection does not place the sandbox on this host)
 * refuses that sandbox's request (credential_not_placed, 503) after a few quick retries
 * (NOT_PLACED_WAIT_MS); the answer is cached as a grant would be, the credstore is not
 * marked down for the other sandboxes.
 *
 * Values live in the cached answers (wiped when dropped) and in the rewritten head (wiped by
 * the caller once sent). Nothing here logs a value or puts one in an event. Every use and
 * refusal is a CredentialUsed / CredentialDenied, identical ones aggregated per audit flush
 * with a count, as EgressAllowed is. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "b64.h"
#include "buf.h"
#include "request.h"
#include "cred.h"
#include "credstore.pb-c.h"
#include "egressd.h"
#include "error.h"
#include "log.h"
#include "publish.h"
#include "redact.h"
#include "xmalloc.h"

#define CACHE_MAX 4096
#define USES_MAX  1024
#define DOWN_MS   1000
/* "not_placed" (the projection does not place the sandbox on this host yet: a resume here
 * may be milliseconds ahead of it): asked again after 25, 50, 100, 200 ms, at most this
 * long in all, on the loop's thread. */
#define NOT_PLACED_WAIT_MS 400
#define LOOKUP_MAX         (1024 * 1024)

typedef struct {
    char sandbox[65];
    char host[254];
    int64_t at_ms;
    uint64_t gen;
    Space__Cred__V1__CredLookupReply *reply; /* NULL in a used slot: "not_placed" */
} centry_t;

typedef struct {
    char id[65];
    double tokens;
    uint64_t at_ms;
    uint32_t rate;
} bucket_t;

typedef struct {
    bool used;
    char sandbox[65], tenant[65], cred[65], name[SP_CRED_NAME_MAX + 1];
    uint32_t version;
    char host[254], method[16], path[257], reason[32];
    uint32_t count;
    int64_t first_us, last_us;
} use_t;

struct eg_cred {
    centry_t *cache;
    size_t n_cache;
    bucket_t *buckets;
    size_t n_buckets, cap_buckets;
    use_t uses[USES_MAX];
    size_t n_uses;
    uint64_t uses_dropped;
    int64_t down_until_ms;
    _Atomic uint64_t gen; /* bumped by CredChanged (a cnats thread) */
    sp_bus_sub_t *changed_sub;
};

static int64_t wall_us(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

static void reply_free(Space__Cred__V1__CredLookupReply *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_grants; i++)
        if (r->grants[i]->value.len)
            explicit_bzero(r->grants[i]->value.data, r->grants[i]->value.len);
    space__cred__v1__cred_lookup_reply__free_unpacked(r, NULL);
}

static void on_changed(void *arg, const char *subject, const char *reply, const uint8_t *data,
                       size_t len)
{
    eg_cred_t *cr = arg;
    atomic_fetch_add(&cr->gen, 1);
}

int eg_cred_start(eg_t *eg)
{
    eg->cred = sp_xcalloc(1, sizeof(*eg->cred));
    eg->cred->cache = sp_xcalloc(CACHE_MAX, sizeof(centry_t));
    if (!eg->cfg->credentials)
        return 0;
    return sp_bus_subscribe(eg->bus, SP_CRED_SUBJECT_CHANGED, NULL, on_changed, eg->cred,
                            &eg->cred->changed_sub);
}

void eg_cred_stop(eg_t *eg)
{
    eg_cred_t *cr = eg->cred;
    if (!cr)
        return;
    sp_bus_unsubscribe(cr->changed_sub);
    eg_cred_flush(eg);
    for (size_t i = 0; i < cr->n_cache; i++)
        reply_free(cr->cache[i].reply);
    free(cr->cache);
    free(cr->buckets);
    free(cr);
    eg->cred = NULL;
}

static void record(eg_t *eg, const eg_sbx_t *s, bool used, const char *cred, const char *name,
                   uint32_t version, const char *host, const char *method, const uint8_t *path,
                   size_t path_len, const char *reason)
{
    eg_cred_t *cr = eg->cred;
    char p[257];
    eg_metrics_credential(eg, used, cred, reason);
    size_t pl = path_len < sizeof(p) - 1 ? path_len : sizeof(p) - 1;
    /* The path as text the event can carry (the guest chose it): visible ASCII only. */
    for (size_t i = 0; i < pl; i++)
        p[i] = (char)(path[i] > 0x20 && path[i] < 0x7f ? path[i] : '?');
    p[pl] = '\0';
    int64_t now = wall_us();
    for (size_t i = 0; i < cr->n_uses; i++) {
        use_t *u = &cr->uses[i];
        if (u->used == used && u->version == version && strcmp(u->sandbox, s->id) == 0 &&
            strcmp(u->cred, cred) == 0 && strcmp(u->host, host) == 0 &&
            strcmp(u->method, method) == 0 && strcmp(u->path, p) == 0 &&
            strcmp(u->reason, reason) == 0 && strcmp(u->name, name) == 0) {
            u->count++;
            u->last_us = now;
            return;
        }
    }
    if (cr->n_uses == USES_MAX) {
        cr->uses_dropped++;
        return;
    }
    use_t *u = &cr->uses[cr->n_uses++];
    memset(u, 0, sizeof(*u));
    u->used = used;
    snprintf(u->sandbox, sizeof(u->sandbox), "%s", s->id);
    snprintf(u->tenant, sizeof(u->tenant), "%s", s->tenant);
    snprintf(u->cred, sizeof(u->cred), "%s", cred);
    snprintf(u->name, sizeof(u->name), "%s", name);
    u->version = version;
    snprintf(u->host, sizeof(u->host), "%s", host);
    snprintf(u->method, sizeof(u->method), "%s", method);
    snprintf(u->path, sizeof(u->path), "%s", p);
    snprintf(u->reason, sizeof(u->reason), "%s", reason);
    u->count = 1;
    u->first_us = u->last_us = now;
    sp_log(used ? SP_LOG_DEBUG : SP_LOG_INFO, used ? "credential used" : "credential denied",
           SP_KS("sandbox", s->id), SP_KS("credential", cred), SP_KS("name", name),
           SP_KS("host", host), SP_KS("method", method), SP_KS("reason", reason));
}

void eg_cred_flush(eg_t *eg)
{
    eg_cred_t *cr = eg->cred;
    sp_burst_t burst;
    if (!cr)
        return;
    sp_burst_init(&burst);
    for (size_t i = 0; i < cr->n_uses; i++) {
        use_t *u = &cr->uses[i];
        sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
        Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
        Space__V1__CredentialUse cu = SPACE__V1__CREDENTIAL_USE__INIT;
        Space__V1__CredentialUsed ok = SPACE__V1__CREDENTIAL_USED__INIT;
        Space__V1__CredentialDenied no = SPACE__V1__CREDENTIAL_DENIED__INIT;
        agg.kind = "credential";
        agg.id = u->cred[0] ? u->cred : "none";
        env.aggregate = &agg;
        env.tenant = u->tenant;
        env.actor = "svc:egressd";
        cu.sandbox = u->sandbox;
        cu.host = u->host;
        cu.method = u->method;
        cu.path = u->path;
        cu.reason = u->reason;
        cu.count = u->count;
        cu.first_at_us = u->first_us;
        cu.last_at_us = u->last_us;
        cu.name = u->name;
        cu.version = u->version;
        if (u->used) {
            ok.use = &cu;
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_USED;
            env.credential_used = &ok;
        } else {
            no.use = &cu;
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DENIED;
            env.credential_denied = &no;
        }
        int rc = sp_burst_add(&burst, &env, NULL);
        if (rc < 0)
            sp_log(SP_LOG_WARN, "credential event not published", SP_KS("sandbox", u->sandbox),
                   SP_KS("error", sp_strerror(rc)));
    }
    /* One signed batch for the whole flush (sign.h): one Ed25519 signature, not one each. */
    int brc = sp_burst_publish_async(eg->bus, &burst);
    if (brc < 0)
        sp_log(SP_LOG_WARN, "credential events not all published",
               SP_KS("error", sp_strerror(brc)));
    sp_burst_dispose(&burst);
    if (cr->uses_dropped)
        sp_log(SP_LOG_WARN, "credential uses over the per-interval limit",
               SP_KU("dropped", cr->uses_dropped));
    cr->n_uses = 0;
    cr->uses_dropped = 0;
}

/* The cached answer for (s, host), asked for on a miss. NULL: refused, *why the reason
 * (credstore_unavailable, credential_not_placed). */
static const Space__Cred__V1__CredLookupReply *lookup(eg_t *eg, const eg_sbx_t *s, const char *host,
                                                      const char **why)
{
    eg_cred_t *cr = eg->cred;
    int64_t now = eg_now_ms();
    uint64_t gen = atomic_load(&cr->gen);
    centry_t *slot = NULL;
    for (size_t i = 0; i < cr->n_cache; i++) {
        centry_t *e = &cr->cache[i];
        if (strcmp(e->sandbox, s->id) != 0 || strcmp(e->host, host) != 0)
            continue;
        if (e->gen == gen && now - e->at_ms < eg->cfg->cred_cache_ms) {
            *why = "credential_not_placed"; /* when there is no reply */
            return e->reply;
        }
        slot = e;
        break;
    }
    if (!slot) {
        /* A free slot, a stale one, or the oldest. */
        size_t pick = 0;
        for (size_t i = 0; i < cr->n_cache; i++) {
            if (now - cr->cache[i].at_ms >= eg->cfg->cred_cache_ms || cr->cache[i].gen != gen) {
                pick = i;
                break;
            }
            if (cr->cache[i].at_ms < cr->cache[pick].at_ms)
                pick = i;
        }
        slot = cr->n_cache < CACHE_MAX ? &cr->cache[cr->n_cache++] : &cr->cache[pick];
    }
    reply_free(slot->reply);
    slot->reply = NULL;
    slot->sandbox[0] = '\0';
    *why = "credstore_unavailable";
    if (now < cr->down_until_ms)
        return NULL;
    Space__Cred__V1__CredLookupRequest q = SPACE__CRED__V1__CRED_LOOKUP_REQUEST__INIT;
    q.tenant = (char *)s->tenant;
    q.project = (char *)s->project;
    q.sandbox = (char *)s->id;
    q.host = (char *)host;
    q.egressd = eg->cfg->worker_id;
    uint8_t buf[1024];
    size_t len = space__cred__v1__cred_lookup_request__get_packed_size(&q);
    if (len > sizeof(buf))
        return NULL;
    space__cred__v1__cred_lookup_request__pack(&q, buf);
    Space__Cred__V1__CredLookupReply *r = NULL;
    int rc;
    for (int wait_ms = 25, waited = 0;; waited += wait_ms, wait_ms *= 2) {
        uint8_t *data = NULL;
        size_t dlen = 0;
        rc = sp_request_send(eg->bus, SP_CRED_SUBJECT_LOOKUP, buf, len,
                             (int)eg->cfg->cred_timeout_ms, &data, &dlen);
        if (rc == 0 && dlen <= LOOKUP_MAX)
            r = space__cred__v1__cred_lookup_reply__unpack(NULL, dlen, data);
        if (data) {
            explicit_bzero(data, dlen);
            free(data);
        }
        if (!r || r->ok || strcmp(r->error, "not_placed") != 0)
            break;
        if (waited + wait_ms > NOT_PLACED_WAIT_MS) {
            /* This sandbox's answer, cached (the credstore is up). */
            sp_log(SP_LOG_WARN,
                   "space-credstore does not place the sandbox on this host: its requests "
                   "are refused",
                   SP_KS("sandbox", s->id), SP_KS("host", host));
            reply_free(r);
            snprintf(slot->sandbox, sizeof(slot->sandbox), "%s", s->id);
            snprintf(slot->host, sizeof(slot->host), "%s", host);
            slot->at_ms = eg_now_ms();
            slot->gen = gen;
            *why = "credential_not_placed";
            return NULL;
        }
        reply_free(r);
        r = NULL;
        struct timespec ts = {0, (long)wait_ms * 1000000};
        nanosleep(&ts, NULL);
    }
    if (!r || !r->ok) {
        sp_log(SP_LOG_WARN, "space-credstore did not answer a lookup: requests are refused",
               SP_KS("sandbox", s->id), SP_KS("host", host),
               SP_KS("error", rc < 0 ? sp_strerror(rc)
                              : r    ? r->error
                                     : "malformed reply"));
        reply_free(r);
        cr->down_until_ms = now + DOWN_MS;
        return NULL;
    }
    snprintf(slot->sandbox, sizeof(slot->sandbox), "%s", s->id);
    snprintf(slot->host, sizeof(slot->host), "%s", host);
    slot->at_ms = now;
    slot->gen = gen;
    slot->reply = r;
    return r;
}

static bucket_t *bucket_of(eg_cred_t *cr, const char *id, uint32_t rate)
{
    for (size_t i = 0; i < cr->n_buckets; i++)
        if (strcmp(cr->buckets[i].id, id) == 0) {
            cr->buckets[i].rate = rate;
            return &cr->buckets[i];
        }
    if (cr->n_buckets == cr->cap_buckets) {
        cr->cap_buckets = cr->cap_buckets ? cr->cap_buckets * 2 : 64;
        cr->buckets = sp_xreallocarray(cr->buckets, cr->cap_buckets, sizeof(bucket_t));
    }
    bucket_t *b = &cr->buckets[cr->n_buckets++];
    memset(b, 0, sizeof(*b));
    snprintf(b->id, sizeof(b->id), "%s", id);
    b->rate = rate;
    b->tokens = rate;
    b->at_ms = (uint64_t)eg_now_ms();
    return b;
}

/* Refilled to now: rate per minute, at most a minute's worth. */
static bucket_t *bucket_now(eg_cred_t *cr, const char *id, uint32_t rate)
{
    bucket_t *b = bucket_of(cr, id, rate);
    uint64_t now = (uint64_t)eg_now_ms();
    b->tokens += (double)(now - b->at_ms) * rate / 60000.0;
    if (b->tokens > rate)
        b->tokens = rate;
    b->at_ms = now;
    return b;
}

static bool rules_allow(const Space__Cred__V1__CredGrant *g, const char *method,
                        const uint8_t *path, size_t path_len)
{
    char p[1024];
    size_t pl = path_len < sizeof(p) ? path_len : sizeof(p) - 1;
    memcpy(p, path, pl);
    for (size_t i = 0; i < g->n_rules; i++) {
        sp_cred_host_t h;
        if (sp_cred_host_parse(g->rules[i], &h) == 0 && sp_cred_host_allows(&h, method, p, pl))
            return true;
    }
    return false;
}

/* Whether two grants inject into the same place: a header of the same name in any case
 * (bearer and basic: Authorization), or the same query parameter. */
static void target_key(const Space__Cred__V1__CredGrant *g, char *out, size_t cap)
{
    sp_cred_inject_t t = sp_cred_inject_parse(g->inject_type);
    if (t == SP_CRED_BEARER || t == SP_CRED_BASIC)
        snprintf(out, cap, "h:authorization");
    else
        snprintf(out, cap, "%c:%s", t == SP_CRED_QUERY ? 'q' : 'h', g->inject_name);
    if (t != SP_CRED_QUERY)
        for (char *p = out; *p; p++)
            *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
}

static bool same_target(const Space__Cred__V1__CredGrant *a, const Space__Cred__V1__CredGrant *b)
{
    char ka[80], kb[80];
    target_key(a, ka, sizeof(ka));
    target_key(b, kb, sizeof(kb));
    return strcmp(ka, kb) == 0;
}

/* a before b: the nearer scope (sandbox, project, tenant), then the smaller name. */
static bool grant_better(const Space__Cred__V1__CredGrant *a, const Space__Cred__V1__CredGrant *b)
{
    int ra = sp_cred_scope_rank(a->scope_kind), rb = sp_cred_scope_rank(b->scope_kind);
    return ra != rb ? ra < rb : strcmp(a->name, b->name) < 0;
}

/* ---- what a site echoes back (docs/credentials.md, "A site echoes the credential") ----
 *
 * Every credential a request carried (injected or by a placeholder) joins its connection's
 * scrubber for the connection's life: its value as it is (a header, bearer, a placeholder in
 * a header), percent-encoded when that differs (query injection, a placeholder in the query),
 * and for basic the base64 of user:value as it went on the wire. Responses to the guest pass
 * through it (egressd_proxy.c): each of those byte strings becomes as many '*'. */

typedef struct {
    char id[65];
    char name[SP_CRED_NAME_MAX + 1];
    uint32_t version;
    char method[16];
    char path[257];
    bool masked; /* audited once for this connection */
} scred_t;

struct eg_scrub {
    eg_t *eg;
    char sandbox[65];
    char host[254];
    sp_redactor_t *r;
    scred_t *creds;
    size_t n, cap;
};

static void on_scrubbed(void *arg, const char *id)
{
    eg_scrub_t *sc = arg;
    sc->eg->scrubbed++;
    if (!sc->eg->cred)
        return; /* stopping: the uses are published already */
    for (size_t i = 0; i < sc->n; i++) {
        scred_t *k = &sc->creds[i];
        if (strcmp(k->id, id) != 0 || k->masked)
            continue;
        /* Once per connection and credential, not per byte or per response. */
        k->masked = true;
        sp_log(SP_LOG_INFO, "the site echoed a credential: masked for the guest",
               SP_KS("sandbox", sc->sandbox), SP_KS("credential", k->id), SP_KS("name", k->name),
               SP_KS("host", sc->host));
        const eg_sbx_t *s = eg_sbx_by_id(sc->eg, sc->sandbox);
        if (s)
            record(sc->eg, s, true, k->id, k->name, k->version, sc->host, k->method,
                   (const uint8_t *)k->path, strlen(k->path), "scrubbed");
        return;
    }
}

static eg_scrub_t *scrub_new(eg_t *eg, const eg_sbx_t *s, const char *host)
{
    eg_scrub_t *sc = sp_xcalloc(1, sizeof(*sc));
    sc->eg = eg;
    snprintf(sc->sandbox, sizeof(sc->sandbox), "%s", s->id);
    snprintf(sc->host, sizeof(sc->host), "%s", host);
    sc->r = sp_redactor_new_mask(EG_SCRUB_MASK, EG_SCRUB_MIN);
    sp_redactor_on_match(sc->r, on_scrubbed, sc);
    return sc;
}

/* One byte string to mask under the credential's id. Shorter than EG_SCRUB_MIN: not masked
 * (it would match by chance in ordinary responses; docs/credentials.md). < 0: no room. */
static int scrub_value(eg_scrub_t *sc, const char *id, const uint8_t *v, size_t len)
{
    if (len < EG_SCRUB_MIN) {
        sp_log(SP_LOG_DEBUG, "credential form too short to scrub", SP_KS("sandbox", sc->sandbox),
               SP_KS("credential", id), SP_KU("bytes", len));
        return 0;
    }
    return sp_redactor_add(sc->r, id, v, len) ? 0 : -ENOSPC;
}

/* Every form of g's value that went on the wire, for the rest of the connection. */
static int scrub_add(eg_scrub_t *sc, const Space__Cred__V1__CredGrant *g, const char *method,
                     const uint8_t *path, size_t path_len)
{
    bool known = false;
    for (size_t i = 0; i < sc->n && !known; i++)
        known = strcmp(sc->creds[i].id, g->id) == 0 && sc->creds[i].version == g->version;
    if (!known) {
        if (sc->n == SP_REDACT_VALUES_MAX)
            return -ENOSPC;
        if (sc->n == sc->cap) {
            sc->cap = sc->cap ? sc->cap * 2 : 4;
            sc->creds = sp_xreallocarray(sc->creds, sc->cap, sizeof(*sc->creds));
        }
        scred_t *k = &sc->creds[sc->n++];
        memset(k, 0, sizeof(*k));
        snprintf(k->id, sizeof(k->id), "%s", g->id);
        snprintf(k->name, sizeof(k->name), "%s", g->name);
        k->version = g->version;
        snprintf(k->method, sizeof(k->method), "%s", method);
        size_t pl = path_len < sizeof(k->path) - 1 ? path_len : sizeof(k->path) - 1;
        for (size_t i = 0; i < pl; i++)
            k->path[i] = (char)(path[i] > 0x20 && path[i] < 0x7f ? path[i] : '?');
        k->path[pl] = '\0';
    }
    const uint8_t *v = g->value.data;
    size_t vl = g->value.len;
    int rc = scrub_value(sc, g->id, v, vl);
    /* The query's form (query injection, a placeholder in the query string). */
    sp_buf_t b;
    sp_buf_init(&b);
    for (size_t i = 0; i < vl; i++) {
        char e[3];
        size_t k = sp_http_pct_byte(v[i], e);
        sp_buf_append(&b, e, k);
    }
    if (rc == 0 && (b.len != vl || memcmp(b.data, v, vl) != 0))
        rc = scrub_value(sc, g->id, (const uint8_t *)b.data, b.len);
    if (b.data)
        explicit_bzero(b.data, b.cap);
    sp_buf_reset(&b);
    if (rc == 0 && sp_cred_inject_parse(g->inject_type) == SP_CRED_BASIC) {
        /* RFC 7617 2: what went into Authorization (the decoded user:value holds the value). */
        size_t ul = strlen(g->inject_user);
        uint8_t *up = sp_xmalloc(ul + 1 + vl);
        memcpy(up, g->inject_user, ul);
        up[ul] = ':';
        memcpy(up + ul + 1, v, vl);
        sp_b64_encode(&b, up, ul + 1 + vl);
        explicit_bzero(up, ul + 1 + vl);
        free(up);
        rc = scrub_value(sc, g->id, (const uint8_t *)b.data, b.len);
    }
    if (b.data)
        explicit_bzero(b.data, b.cap);
    sp_buf_dispose(&b);
    return rc;
}

void eg_scrub_feed(eg_scrub_t *sc, const uint8_t *data, size_t len, sp_buf_t *out)
{
    sp_redactor_feed(sc->r, data, len, out);
}

void eg_scrub_release(eg_scrub_t *sc, sp_buf_t *out)
{
    sp_redactor_release(sc->r, out);
}

void eg_scrub_flush(eg_scrub_t *sc, sp_buf_t *out)
{
    sp_redactor_flush(sc->r, out);
}

size_t eg_scrub_held(const eg_scrub_t *sc)
{
    return sp_redactor_held(sc->r);
}

void eg_scrub_free(eg_scrub_t *sc)
{
    if (!sc)
        return;
    sp_redactor_free(sc->r); /* wipes the values and what it held */
    free(sc->creds);
    free(sc);
}

int eg_cred_rewrite(eg_t *eg, const eg_sbx_t *s, const char *host, const uint8_t *head,
                    const sp_http_head_t *hh, eg_scrub_t **scrub, uint8_t **ret_out,
                    size_t *ret_len, int *ret_status, const char **ret_reason)
{
    /* The request's path, without its query, for rules and events. */
    const uint8_t *t = head + hh->target_off;
    size_t tl = hh->target_len;
    if (hh->target_form == SP_TARGET_ABSOLUTE) {
        t += hh->path_off;
        tl -= hh->path_off;
    }
    const uint8_t *qm = memchr(t, '?', tl);
    size_t path_len = qm ? (size_t)(qm - t) : tl;
    const Space__Cred__V1__CredLookupReply *r = NULL;
    if (eg->cfg->credentials) {
        const char *why = NULL;
        r = lookup(eg, s, host, &why);
        if (!r) {
            record(eg, s, false, "", "", 0, host, hh->method, t, path_len, why);
            *ret_status = 503;
            *ret_reason = why;
            return -EAGAIN;
        }
    }
    sp_head_edit_t edits[SP_HEAD_SUBST_MAX + 1]; /* and Accept-Encoding */
    sp_head_subst_t subst[SP_HEAD_SUBST_MAX];
    const Space__Cred__V1__CredGrant *gs[SP_HEAD_SUBST_MAX], *injected[SP_HEAD_SUBST_MAX];
    uint8_t *tmp[SP_HEAD_SUBST_MAX] = {0};
    size_t tmp_len[SP_HEAD_SUBST_MAX] = {0};
    size_t ne = 0, ns = 0;
    int64_t now_us = wall_us();
    int rc = 0;
    *ret_out = NULL;
    /* The grants for this method and path; per injection target the nearest scope, then the
     * smaller name, is injected (credstore's inject flag judged the host alone). */
    const Space__Cred__V1__CredGrant *ok[SP_HEAD_SUBST_MAX];
    size_t nok = 0;
    for (size_t i = 0; r && i < r->n_grants && nok < SP_HEAD_SUBST_MAX; i++)
        if (rules_allow(r->grants[i], hh->method, t, path_len))
            ok[nok++] = r->grants[i];
    for (size_t i = 0; i < nok; i++) {
        const Space__Cred__V1__CredGrant *g = ok[i];
        bool wins = true;
        for (size_t j = 0; j < nok && wins; j++)
            if (j != i && same_target(g, ok[j]) && grant_better(ok[j], g))
                wins = false;
        bool expired = !g->value.len || (g->expires_at_us && g->expires_at_us <= now_us);
        if (expired && wins) {
            record(eg, s, false, g->id, g->name, g->version, host, hh->method, t, path_len,
                   "expired");
            *ret_status = 403;
            *ret_reason = "credential_expired";
            rc = -EACCES;
            goto out;
        }
        if (expired)
            continue; /* its placeholder stays, and refuses the request if it is used */
        subst[ns] =
            (sp_head_subst_t){.name = g->name, .value = g->value.data, .value_len = g->value.len};
        gs[ns++] = g;
        if (!wins)
            continue;
        sp_cred_inject_t type = sp_cred_inject_parse(g->inject_type);
        sp_head_edit_t *e = &edits[ne];
        memset(e, 0, sizeof(*e));
        if (type == SP_CRED_HEADER) {
            e->header = g->inject_name;
            e->value = g->value.data;
            e->value_len = g->value.len;
        } else if (type == SP_CRED_QUERY) {
            e->param = g->inject_name;
            e->value = g->value.data;
            e->value_len = g->value.len;
        } else if (type == SP_CRED_BEARER || type == SP_CRED_BASIC) {
            sp_buf_t b;
            sp_buf_init(&b);
            if (type == SP_CRED_BEARER) {
                sp_buf_puts(&b, "Bearer ");
                sp_buf_append(&b, g->value.data, g->value.len);
            } else {
                /* RFC 7617 2: base64 of user ":" password. */
                size_t ul = strlen(g->inject_user);
                uint8_t *up = sp_xmalloc(ul + 1 + g->value.len);
                memcpy(up, g->inject_user, ul);
                up[ul] = ':';
                memcpy(up + ul + 1, g->value.data, g->value.len);
                sp_buf_puts(&b, "Basic ");
                sp_b64_encode(&b, up, ul + 1 + g->value.len);
                explicit_bzero(up, ul + 1 + g->value.len);
                free(up);
            }
            tmp_len[ne] = b.len;
            tmp[ne] = (uint8_t *)sp_buf_take(&b);
            e->header = "Authorization";
            e->value = tmp[ne];
            e->value_len = tmp_len[ne];
        } else {
            continue;
        }
        injected[ne++] = g;
    }
    /* A request that carries a credential asks for an answer without compression: a value
     * the site echoes back is only masked where it is in clear (the scrubber above). The cost:
     * no compression of those responses. A placeholder present either is replaced (it carries
     * one) or refuses the request. */
    size_t n_edits = ne;
    if (ne > 0 || (ns > 0 && sp_http_head_has_placeholder(head, hh->head_len))) {
        edits[n_edits++] = (sp_head_edit_t){.header = "Accept-Encoding",
                                            .value = (const uint8_t *)"identity",
                                            .value_len = strlen("identity")};
    }
    uint32_t used = 0;
    const char *why = NULL;
    size_t cap = hh->head_len + 256;
    for (size_t i = 0; i < n_edits; i++)
        cap += strlen(edits[i].header ? edits[i].header : edits[i].param) + 3 * edits[i].value_len;
    for (int attempt = 0; attempt < 2; attempt++) {
        *ret_out = sp_xmalloc(cap);
        long n =
            sp_http_head_rewrite(head, hh, edits, n_edits, subst, ns, *ret_out, cap, &used, &why);
        if (n < 0) {
            free(*ret_out);
            *ret_out = NULL;
            record(eg, s, false, "", "", 0, host, hh->method, t, path_len, "credential_scope");
            *ret_status = 403;
            *ret_reason = "credential_scope";
            rc = -EACCES;
            goto out;
        }
        if ((size_t)n <= cap) {
            *ret_len = (size_t)n;
            break;
        }
        explicit_bzero(*ret_out, cap);
        free(*ret_out);
        *ret_out = NULL;
        cap = (size_t)n;
    }
    if (!*ret_out) {
        *ret_status = 403;
        *ret_reason = "head_too_large";
        rc = -E2BIG;
        goto out;
    }
    /* Rate limits of everything the request carries, then their tokens. */
    const Space__Cred__V1__CredGrant *carried[2 * SP_HEAD_SUBST_MAX];
    const char *how[2 * SP_HEAD_SUBST_MAX];
    size_t nc = 0;
    for (size_t i = 0; i < ne; i++) {
        carried[nc] = injected[i];
        how[nc++] = "injected";
    }
    for (size_t i = 0; i < ns; i++) {
        if (!(used & (1u << i)))
            continue;
        size_t j = 0;
        while (j < nc && carried[j] != gs[i])
            j++;
        /* Injected and named by a placeholder too: one use, recorded as the placeholder's. */
        carried[j] = gs[i];
        how[j] = "placeholder";
        if (j == nc)
            nc++;
    }
    for (size_t i = 0; i < nc; i++) {
        const Space__Cred__V1__CredGrant *g = carried[i];
        if (g->rate_per_minute && bucket_now(eg->cred, g->id, g->rate_per_minute)->tokens < 1.0) {
            record(eg, s, false, g->id, g->name, g->version, host, hh->method, t, path_len,
                   "rate_limited");
            explicit_bzero(*ret_out, *ret_len);
            free(*ret_out);
            *ret_out = NULL;
            *ret_status = 429;
            *ret_reason = "rate_limited";
            rc = -EBUSY;
            goto out;
        }
    }
    /* Whatever the request carries is masked in what comes back on this connection, from
     * now until it closes. No room for more (a connection that carried hundreds of values):
     * refused, the request is not sent. */
    for (size_t i = 0; i < nc; i++) {
        if (!*scrub)
            *scrub = scrub_new(eg, s, host);
        if (scrub_add(*scrub, carried[i], hh->method, t, path_len) < 0) {
            record(eg, s, false, carried[i]->id, carried[i]->name, carried[i]->version, host,
                   hh->method, t, path_len, "scrub_limit");
            explicit_bzero(*ret_out, *ret_len);
            free(*ret_out);
            *ret_out = NULL;
            *ret_status = 403;
            *ret_reason = "scrub_limit";
            rc = -ENOSPC;
            goto out;
        }
    }
    for (size_t i = 0; i < nc; i++) {
        const Space__Cred__V1__CredGrant *g = carried[i];
        if (g->rate_per_minute)
            bucket_now(eg->cred, g->id, g->rate_per_minute)->tokens -= 1.0;
        record(eg, s, true, g->id, g->name, g->version, host, hh->method, t, path_len, how[i]);
    }
out:
    for (size_t i = 0; i < ne; i++) {
        if (tmp[i]) {
            explicit_bzero(tmp[i], tmp_len[i]);
            free(tmp[i]);
        }
    }
    return rc;
}
