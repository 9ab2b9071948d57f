/* Warm pools (worker.h, docs/pools.md): per prepared template, up to cfg->pool_size sandboxes
 * made ahead of any request: disk snapshot, netns + veth + firewall element, runsc created
 * and started, agent connected (its Hello received). Each is made under a pool id and held by
 * a box that is not in the owned table (gone: no event is ever published about it), so it
 * belongs to no tenant and egressd knows no policy for its address (deny_all). A create that
 * finds one claims it: the runtime maps the sandbox id to the pool id (wk_sandbox_claim), the
 * agent sets the hostname (wk_agent_claim), and the box takes the sandbox's identity and joins
 * the owned table. A pooled sandbox is claimed once; a failed claim destroys it.
 *
 * One refill thread per worker makes one pooled sandbox at a time, and waits pool_refill_ms
 * after each before the next, so refills take at most one core's share of creates and never
 * run beside each other; it also recycles a pooled sandbox older than pool_max_age_s. At stop
 * the unclaimed ones are destroyed; a killed worker's are released by the next one at start
 * (wk_reconcile: pool ids are not in the log). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "worker.h"
#include "xmalloc.h"

#define CLAIM_TIMEOUT_MS 2000
#define FAIL_BACKOFF_MS  2000
#define IDLE_WAIT_MS     1000

typedef struct {
    wk_box_t *box; /* the pool's reference; box->id is the pool id until the claim */
    char pool_id[WK_POOL_ID_LEN + 1];
    char address[16];
    int64_t made_ns;
} entry_t;

typedef struct {
    char name[65];
    entry_t *v;
    size_t n;
    bool making; /* the refill thread is making one for it */
} tmpl_pool_t;

struct wk_pool {
    wk_t *w;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    tmpl_pool_t *t;
    size_t n_t;
    bool stopping;
    pthread_t thread;
    uint64_t made, claimed, recycled, failed; /* counters for the log */
};

static void cond_wait_ms(wk_pool_t *p, int ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&p->cond, &p->mu, &dl);
}

/* Destroys a pooled sandbox that was never claimed (its box, its host resources). */
static void discard(wk_pool_t *p, entry_t *e, const char *why)
{
    char err[WK_ERR_MAX] = "";
    wk_box_put(e->box); /* closes the agent channel first */
    if (wk_sandbox_destroy(p->w->host, e->pool_id, err) < 0)
        sp_log(SP_LOG_ERROR, "cannot release a pooled sandbox", SP_KS("pool_id", e->pool_id),
               SP_KS("error", err));
    else
        sp_log(SP_LOG_DEBUG, "pooled sandbox released", SP_KS("pool_id", e->pool_id),
               SP_KS("why", why));
}

/* Makes one pooled sandbox of tmpl; 0 and *ret filled, or < 0 (logged). */
static int make_one(wk_pool_t *p, const char *tmpl, entry_t *ret)
{
    wk_t *w = p->w;
    char err[WK_ERR_MAX] = "";
    wk_sandbox_info_t info = {.agent_to_fd = -1, .agent_from_fd = -1};
    entry_t e;
    memset(&e, 0, sizeof(e));
    wk_pool_id_new(e.pool_id);
    wk_sandbox_spec_t spec = {.id = e.pool_id,
                              .template_ = tmpl,
                              .vcpu = WK_POOL_VCPU,
                              .memory_mb = WK_POOL_MEMORY_MB,
                              .pooled = true};
    int64_t t0 = sp_mono_ns();
    int rc = wk_sandbox_create(w->host, &spec, &info, err);
    if (rc < 0) {
        sp_log(SP_LOG_WARN, "pool refill failed", SP_KS("template", tmpl), SP_KS("error", err));
        return rc;
    }
    /* Not owned, so never reported: gone until its claim. */
    e.box = wk_box_new(w, e.pool_id, "", tmpl, WK_POOL_VCPU, WK_POOL_MEMORY_MB);
    e.box->gone = true;
    if ((rc = wk_box_attach_agent(e.box, info.agent_to_fd, info.agent_from_fd)) < 0) {
        sp_log(SP_LOG_WARN, "pool refill: the agent did not connect", SP_KS("template", tmpl),
               SP_KS("pool_id", e.pool_id), SP_KS("error", sp_strerror(rc)));
        discard(p, &e, "no agent");
        return rc;
    }
    snprintf(e.address, sizeof(e.address), "%s", info.address);
    e.made_ns = sp_mono_ns();
    sp_log(SP_LOG_DEBUG, "pooled sandbox ready", SP_KS("template", tmpl),
           SP_KS("pool_id", e.pool_id), SP_KI("ms", (e.made_ns - t0) / 1000000));
    *ret = e;
    return 0;
}

static void *refill_main(void *arg)
{
    wk_pool_t *p = arg;
    const wk_config_t *cfg = p->w->cfg;
    int64_t max_age_ns = (int64_t)cfg->pool_max_age_s * 1000000000LL;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        /* One whose agent channel broke (the sandbox ended) or the oldest beyond its age
         * goes first: recycled, then made again below. */
        entry_t old = {0};
        for (size_t i = 0; i < p->n_t && !old.box; i++) {
            tmpl_pool_t *t = &p->t[i];
            for (size_t k = 0; k < t->n && !old.box; k++) {
                wk_box_t *b = t->v[k].box;
                pthread_mutex_lock(&b->mu);
                bool lost = b->agent_lost;
                pthread_mutex_unlock(&b->mu);
                if (lost || (k == 0 && sp_mono_ns() - t->v[0].made_ns > max_age_ns)) {
                    old = t->v[k];
                    memmove(t->v + k, t->v + k + 1, (t->n - k - 1) * sizeof(*t->v));
                    t->n--;
                }
            }
        }
        if (old.box) {
            p->recycled++;
            pthread_mutex_unlock(&p->mu);
            discard(p, &old, "recycled (max age, or its agent is gone)");
            pthread_mutex_lock(&p->mu);
            continue;
        }
        tmpl_pool_t *t = NULL;
        for (size_t i = 0; i < p->n_t && !t; i++)
            if (p->t[i].n < (size_t)cfg->pool_size)
                t = &p->t[i];
        if (!t) {
            cond_wait_ms(p, IDLE_WAIT_MS);
            continue;
        }
        char name[65];
        snprintf(name, sizeof(name), "%s", t->name);
        t->making = true;
        pthread_mutex_unlock(&p->mu);
        entry_t e;
        int rc = make_one(p, name, &e);
        pthread_mutex_lock(&p->mu);
        t->making = false;
        if (rc == 0 && p->stopping) {
            pthread_mutex_unlock(&p->mu);
            discard(p, &e, "worker stopping");
            pthread_mutex_lock(&p->mu);
        } else if (rc == 0) {
            t->v = sp_xreallocarray(t->v, t->n + 1, sizeof(*t->v));
            t->v[t->n++] = e;
            p->made++;
        } else {
            p->failed++;
        }
        pthread_cond_broadcast(&p->cond);
        /* The bound on the refill rate: a pause after every create, longer after a failure. */
        if (!p->stopping)
            cond_wait_ms(p, rc == 0 ? (int)cfg->pool_refill_ms : FAIL_BACKOFF_MS);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int wk_pool_start(wk_t *w)
{
    if (w->cfg->pool_size <= 0)
        return 0;
    wk_pool_t *p = sp_xcalloc(1, sizeof(*p));
    p->w = w;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_lock(&w->mu);
    p->t = sp_xcalloc(w->n_templates ? w->n_templates : 1, sizeof(*p->t));
    for (size_t i = 0; i < w->n_templates; i++)
        snprintf(p->t[p->n_t++].name, sizeof(p->t[0].name), "%s", w->templates[i]);
    pthread_mutex_unlock(&w->mu);
    if (pthread_create(&p->thread, NULL, refill_main, p) != 0) {
        sp_log(SP_LOG_ERROR, "cannot start the pool refill thread");
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cond);
        free(p->t);
        free(p);
        return -EAGAIN;
    }
    w->pool = p;
    sp_log(SP_LOG_INFO, "warm pools", SP_KI("size", w->cfg->pool_size), SP_KU("templates", p->n_t),
           SP_KI("refill_ms", w->cfg->pool_refill_ms), SP_KI("max_age_s", w->cfg->pool_max_age_s));
    return 0;
}

void wk_pool_stop(wk_t *w)
{
    wk_pool_t *p = w->pool;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    size_t n = 0;
    for (size_t i = 0; i < p->n_t; i++) {
        for (size_t k = 0; k < p->t[i].n; k++, n++)
            discard(p, &p->t[i].v[k], "worker stopping");
        free(p->t[i].v);
    }
    sp_log(SP_LOG_INFO, "warm pools released", SP_KU("released", n), SP_KU("made", p->made),
           SP_KU("claimed", p->claimed), SP_KU("recycled", p->recycled),
           SP_KU("failed", p->failed));
    free(p->t);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cond);
    free(p);
    w->pool = NULL;
}

bool wk_pool_fits(const wk_t *w, const wk_sandbox_spec_t *spec)
{
    return w->pool && spec->vcpu == WK_POOL_VCPU && spec->memory_mb == WK_POOL_MEMORY_MB &&
           spec->pids == 0;
}

wk_box_t *wk_pool_claim(wk_t *w, const wk_sandbox_spec_t *spec, const char *tenant,
                        wk_sandbox_info_t *ret_info)
{
    wk_pool_t *p = w->pool;
    if (!wk_pool_fits(w, spec))
        return NULL;
    entry_t e = {0};
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_t && !e.box; i++) {
        tmpl_pool_t *t = &p->t[i];
        if (strcmp(t->name, spec->template_) != 0 || t->n == 0)
            continue;
        /* The newest: the oldest is the next to be recycled anyway. */
        e = t->v[--t->n];
    }
    if (e.box)
        pthread_cond_broadcast(&p->cond); /* the refill thread has work */
    pthread_mutex_unlock(&p->mu);
    if (!e.box)
        return NULL;

    wk_box_t *b = e.box;
    char err[WK_ERR_MAX] = "";
    pthread_mutex_lock(&b->mu);
    wk_agent_t *a = b->agent_lost ? NULL : b->agent;
    pthread_mutex_unlock(&b->mu);
    int rc = a && wk_agent_alive(a) ? 0 : -EPIPE;
    if (rc < 0) {
        discard(p, &e, "agent channel lost while pooled");
        return NULL;
    }
    /* The host first (the map is what a restarted worker finds), then the guest. */
    int64_t t0 = sp_mono_ns();
    uint32_t disk_mb = 0;
    if (wk_sandbox_claim(w->host, e.pool_id, spec, &disk_mb, err) < 0) {
        sp_log(SP_LOG_WARN, "pool claim failed", SP_KS("sandbox", spec->id),
               SP_KS("pool_id", e.pool_id), SP_KS("error", err));
        discard(p, &e, "claim failed");
        return NULL;
    }
    int64_t t1 = sp_mono_ns();
    if ((rc = wk_agent_claim(a, spec->id, CLAIM_TIMEOUT_MS, err)) < 0) {
        sp_log(SP_LOG_WARN, "pool claim: the agent did not take the identity",
               SP_KS("sandbox", spec->id), SP_KS("pool_id", e.pool_id), SP_KS("error", err),
               SP_KS("code", sp_strerror(rc)));
        wk_box_put(b);
        char derr[WK_ERR_MAX] = "";
        if (wk_sandbox_destroy(w->host, spec->id, derr) < 0)
            sp_log(SP_LOG_ERROR, "cannot release a failed claim", SP_KS("sandbox", spec->id),
                   SP_KS("error", derr));
        return NULL;
    }
    pthread_mutex_lock(&b->mu);
    snprintf(b->id, sizeof(b->id), "%s", spec->id);
    snprintf(b->tenant, sizeof(b->tenant), "%s", tenant);
    b->gone = false;
    pthread_mutex_unlock(&b->mu);
    if (!wk_owned_insert(w, b)) {
        /* Cannot happen (on_placed checked, one thread per sandbox id); never two owners. */
        sp_log(SP_LOG_ERROR, "claimed sandbox owned already", SP_KS("sandbox", spec->id));
        pthread_mutex_lock(&b->mu);
        b->gone = true;
        pthread_mutex_unlock(&b->mu);
        wk_box_put(b);
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
    p->claimed++;
    pthread_mutex_unlock(&p->mu);
    sp_log(SP_LOG_DEBUG, "pool claim", SP_KS("sandbox", spec->id), SP_KS("pool_id", e.pool_id),
           SP_KF("host_ms", (double)(t1 - t0) / 1e6),
           SP_KF("agent_ms", (double)(sp_mono_ns() - t1) / 1e6));
    snprintf(ret_info->address, sizeof(ret_info->address), "%s", e.address);
    ret_info->disk_mb = disk_mb;
    ret_info->agent_to_fd = ret_info->agent_from_fd = -1; /* the box has the channel */
    return b; /* the pool's reference is the caller's now */
}

size_t wk_pool_levels(wk_t *w, Space__V1__PoolLevel *levels, Space__V1__PoolLevel **ptrs,
                      size_t max)
{
    wk_pool_t *p = w->pool;
    if (!p)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_t && n < max; i++, n++) {
        space__v1__pool_level__init(&levels[n]);
        levels[n].template_ = p->t[i].name; /* lives as long as the pool */
        levels[n].ready = (uint32_t)p->t[i].n;
        levels[n].size = (uint32_t)w->cfg->pool_size;
        ptrs[n] = &levels[n];
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}
