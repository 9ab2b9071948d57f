/* The worker's table of the sandboxes it owns (wk_t.owned, under wk_t.mu; each wk_box_t
 * counted by refs) and the helpers that publish the worker's facts: one place for both, so the
 * consumer (worker_events.c), the data plane and reconciliation share them without depending on
 * each other. Lock order: docs/worker-locks.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "error.h"
#include "log.h"
#include "publish.h"
#include "worker.h"
#include "xmalloc.h"

#define FACTS_FIRST_MS 5000

wk_box_t *wk_box_new(wk_t *w, const char *id, const char *tenant, const char *tmpl, uint32_t vcpu,
                     uint32_t memory_mb)
{
    wk_box_t *b = sp_xcalloc(1, sizeof(*b));
    b->w = w;
    snprintf(b->id, sizeof(b->id), "%s", id);
    snprintf(b->tenant, sizeof(b->tenant), "%s", tenant);
    snprintf(b->template_, sizeof(b->template_), "%s", tmpl ? tmpl : "");
    b->vcpu = vcpu;
    b->memory_mb = memory_mb;
    b->refs = 1;
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->pin_cv, &ca);
    pthread_condattr_destroy(&ca);
    return b;
}

bool wk_owned_insert(wk_t *w, wk_box_t *b)
{
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->n_owned; i++) {
        if (strcmp(w->owned[i]->id, b->id) == 0) {
            pthread_mutex_unlock(&w->mu);
            return false;
        }
    }
    if (w->n_owned == w->cap_owned) {
        w->cap_owned = w->cap_owned ? w->cap_owned * 2 : 32;
        w->owned = sp_xreallocarray(w->owned, w->cap_owned, sizeof(wk_box_t *));
    }
    b->refs++; /* the table's */
    w->owned[w->n_owned++] = b;
    pthread_mutex_unlock(&w->mu);
    return true;
}

wk_box_t *wk_owned_add(wk_t *w, const char *id, const char *tenant, const char *tmpl, uint32_t vcpu,
                       uint32_t memory_mb)
{
    wk_box_t *b = wk_box_new(w, id, tenant, tmpl, vcpu, memory_mb);
    if (!wk_owned_insert(w, b)) {
        pthread_cond_destroy(&b->pin_cv);
        pthread_mutex_destroy(&b->mu);
        free(b);
        return NULL;
    }
    return b;
}

wk_box_t *wk_owned_get(wk_t *w, const char *id)
{
    wk_box_t *b = NULL;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->n_owned && !b; i++) {
        if (strcmp(w->owned[i]->id, id) == 0) {
            b = w->owned[i];
            b->refs++;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return b;
}

wk_box_t *wk_owned_remove(wk_t *w, const char *id)
{
    wk_box_t *b = NULL;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->n_owned; i++) {
        if (strcmp(w->owned[i]->id, id) == 0) {
            b = w->owned[i];
            w->owned[i] = w->owned[--w->n_owned];
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
    if (b) {
        pthread_mutex_lock(&b->mu);
        b->gone = true;
        pthread_mutex_unlock(&b->mu);
    }
    return b;
}

/* The command facts queued before a fact go to the stream before it: the log keeps the order
 * in which the worker decided them (a CommandExited "sandbox released" before the
 * SandboxDeleted). Past the wait, the fact goes out anyway. */
static void facts_first(wk_t *w)
{
    int rc = wk_factq_sync(w->facts, FACTS_FIRST_MS);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "command facts still unpublished; the next fact goes first",
               SP_KS("error", sp_strerror(rc)));
}

int wk_publish_box_event(wk_box_t *b, sp_envelope_t *env, const char *msg_id)
{
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    char id[37];
    facts_first(b->w);
    agg.kind = "sandbox";
    agg.id = b->id;
    env->aggregate = &agg;
    env->tenant = b->tenant;
    env->actor = "svc:worker";
    int rc = sp_publish_event_retry(b->w->bus, env, id, b->w->cfg->id, msg_id,
                                    SP_PUBLISH_FACT_BUDGET_MS);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot record a sandbox event", SP_KS("type", env->type),
               SP_KS("sandbox", b->id), SP_KS("error", sp_strerror(rc)));
    env->aggregate = NULL;
    return rc;
}

void wk_box_put(wk_box_t *b)
{
    if (!b)
        return;
    wk_t *w = b->w;
    pthread_mutex_lock(&w->mu);
    int last = --b->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (!last)
        return;
    /* Closing joins the reader thread, whose callbacks hold references of their own: none
     * can be running now. */
    wk_agent_close(b->agent);
    /* The worker stops, the sandbox goes on: its commands did not end (the next worker follows
     * them again), so nothing is published for them. */
    if (sp_daemon_stopping)
        wk_box_forget_commands(b);
    wk_box_free_commands(b);
    wk_box_fail_files(b, "sandbox released");
    pthread_cond_destroy(&b->pin_cv);
    pthread_mutex_destroy(&b->mu);
    sp_cred_key_wipe(&b->dk);
    wk_samples_free(b->samples);
    free(b);
}

int wk_owned_has(wk_t *w, const char *id)
{
    wk_box_t *b = wk_owned_get(w, id);
    wk_box_put(b);
    return b != NULL;
}

int wk_heartbeat(wk_t *w)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__WorkerHeartbeat hb = SPACE__V1__WORKER_HEARTBEAT__INIT;
    char *runtimes[] = {"gvisor"};
    char id[37];
    uint32_t vcpu_used = 0;
    uint64_t mem_used = 0;

    agg.kind = "worker";
    agg.id = w->cfg->id;
    env.aggregate = &agg;
    env.actor = "svc:worker";
    hb.worker = w->cfg->id;
    hb.host = w->hostname;
    hb.vcpu_total = w->vcpu_total;
    hb.memory_mb_total = w->memory_mb_total;
    /* The volume as the create's reserve check sees it: what the scheduler places by. */
    wk_host_disk_t disk;
    if (wk_host_disk(w->host, &disk) == 0) {
        hb.disk_mb_total = disk.total_mb;
        hb.disk_mb_free = disk.free_mb;
        hb.disk_mb_reserve = disk.reserve_mb;
        hb.disk_mb_default = disk.default_mb;
    }
    hb.runtimes = runtimes;
    hb.n_runtimes = 1;
    hb.interval_ms = (uint32_t)w->cfg->heartbeat_ms;
    hb.version = "0.1.0";
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT;
    env.worker_heartbeat = &hb;

    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->n_owned; i++) {
        vcpu_used += w->owned[i]->vcpu;
        mem_used += w->owned[i]->memory_mb;
    }
    hb.sandboxes_running = (uint32_t)w->n_owned;
    /* Overcommitted sandboxes may exceed the totals; the schema wants used <= total. */
    hb.vcpu_used = vcpu_used < w->vcpu_total ? vcpu_used : w->vcpu_total;
    hb.memory_mb_used = mem_used < w->memory_mb_total ? mem_used : w->memory_mb_total;
    /* A copy: the publish below waits for the stream (up to the bus timeout), and the owned
     * table must not wait with it (docs/worker-locks.md). */
    char **tmpls = sp_xcalloc(w->n_templates ? w->n_templates : 1, sizeof(*tmpls));
    for (size_t i = 0; i < w->n_templates; i++)
        tmpls[i] = sp_xstrdup(w->templates[i]);
    hb.templates = tmpls;
    hb.n_templates = w->n_templates;
    pthread_mutex_unlock(&w->mu);
    /* The pool's lock is never taken under w->mu. */
    Space__V1__PoolLevel levels[WK_POOL_LEVELS_MAX];
    Space__V1__PoolLevel *lp[WK_POOL_LEVELS_MAX];
    hb.n_pools = wk_pool_levels(w, levels, lp, WK_POOL_LEVELS_MAX);
    hb.pools = lp;
    int rc = sp_publish_event(w->bus, &env, id, NULL, NULL, NULL);
    for (size_t i = 0; i < hb.n_templates; i++)
        free(tmpls[i]);
    free(tmpls);
    return rc;
}

int wk_publish_fact(wk_t *w, sp_envelope_t *env, const char *prefix, const char *cause_id)
{
    char id[37], msg_id[96];
    snprintf(msg_id, sizeof(msg_id), "%s:%s", prefix, cause_id);
    facts_first(w);
    int rc = sp_publish_event_retry(w->bus, env, id, w->cfg->id, msg_id, SP_PUBLISH_FACT_BUDGET_MS);
    if (rc < 0)
        sp_log(SP_LOG_ERROR, "cannot publish", SP_KS("type", env->type),
               SP_KS("sandbox", env->aggregate->id), SP_KS("error", sp_strerror(rc)),
               SP_KS("corr", env->correlation_id));
    return rc;
}
