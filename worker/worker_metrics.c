/* The worker's metrics (docs/metrics.md): its sandboxes by state, its warm pools, the duration
 * of runsc calls (timed in worker_runsc.c), each owned sandbox's CPU, memory and disk, and the
 * host's capacity as the heartbeat reports it. Everything but the runsc histogram is read at
 * scrape time, on the listener's thread: the owned table under w->mu (a reference per box, as
 * every user takes), each box's flags under its own mu, the cgroup and qgroup numbers with no
 * lock held. The per-sandbox series are rebuilt at every scrape, so a deleted sandbox's go
 * with it. */
#include <stdlib.h>
#include <string.h>

#include "worker.h"
#include "xmalloc.h"

/* One runsc call: from milliseconds (state, list) to the 30 s timeout (create, restore). */
static const double runsc_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1,     2.5,  5,     10,   20,  30};

/* Sandboxes a worker can hold at once, as labels: far above what one host runs. */
#define SANDBOX_SERIES_MAX 4096

static sp_metric_t *gauge(sp_metrics_t *r, const char *name, const char *help, const char *labels,
                          size_t max)
{
    return sp_metrics_add(r, SP_METRIC_GAUGE, name, help, labels, NULL, 0, max);
}

static void set2(sp_metric_t *m, const char *v, double x)
{
    sp_series_set(sp_metric_series1(m, v), x);
}

static void collect(sp_metrics_t *reg, void *arg)
{
    wk_t *w = arg;
    wk_metrics_t *m = &w->metrics;
    (void)reg;

    /* The boxes, each with a reference, and the allocation the heartbeat reports. */
    pthread_mutex_lock(&w->mu);
    size_t n = w->n_owned;
    wk_box_t **boxes = sp_xcalloc(n ? n : 1, sizeof(wk_box_t *));
    uint64_t vcpu = 0, mem_mb = 0;
    for (size_t i = 0; i < n; i++) {
        boxes[i] = w->owned[i];
        boxes[i]->refs++;
        vcpu += boxes[i]->vcpu;
        mem_mb += boxes[i]->memory_mb;
    }
    pthread_mutex_unlock(&w->mu);

    size_t running = 0, paused = 0, restoring = 0;
    sp_metric_reset(m->cpu);
    sp_metric_reset(m->memory);
    sp_metric_reset(m->disk);
    for (size_t i = 0; i < n; i++) {
        wk_box_t *b = boxes[i];
        char id[65];
        pthread_mutex_lock(&b->mu);
        bool gone = b->gone, is_paused = b->paused, is_restoring = b->restoring;
        memcpy(id, b->id, sizeof(id));
        pthread_mutex_unlock(&b->mu);
        wk_box_put(b);
        if (gone)
            continue;
        if (is_restoring)
            restoring++;
        else if (is_paused)
            paused++;
        else
            running++;
        wk_sandbox_usage_t u;
        if (wk_sandbox_usage(w->host, id, &u) < 0)
            continue;
        if (u.has_cpu)
            set2(m->cpu, id, u.cpu_seconds);
        if (u.has_memory)
            set2(m->memory, id, (double)u.memory_bytes);
        if (u.has_disk)
            set2(m->disk, id, (double)u.disk_bytes);
    }
    free(boxes);
    set2(m->sandboxes, "running", (double)running);
    set2(m->sandboxes, "paused", (double)paused);
    set2(m->sandboxes, "restoring", (double)restoring);

    /* The pools, as the heartbeat reports them (the pool's lock, never under w->mu). */
    Space__V1__PoolLevel levels[WK_POOL_LEVELS_MAX];
    Space__V1__PoolLevel *lp[WK_POOL_LEVELS_MAX];
    size_t np = wk_pool_levels(w, levels, lp, WK_POOL_LEVELS_MAX);
    size_t pooled = 0;
    sp_metric_reset(m->pool_ready);
    sp_metric_reset(m->pool_target);
    for (size_t i = 0; i < np; i++) {
        set2(m->pool_ready, levels[i].template_, levels[i].ready);
        set2(m->pool_target, levels[i].template_, levels[i].size);
        pooled += levels[i].ready;
    }
    set2(m->sandboxes, "pooled", (double)pooled);

    set2(m->vcpus, "total", w->vcpu_total);
    set2(m->vcpus, "allocated", (double)vcpu);
    set2(m->memory_host, "total", (double)w->memory_mb_total * 1024 * 1024);
    set2(m->memory_host, "allocated", (double)mem_mb * 1024 * 1024);
    wk_host_disk_t disk;
    if (wk_host_disk(w->host, &disk) == 0) {
        set2(m->disk_host, "total", (double)disk.total_mb * 1024 * 1024);
        set2(m->disk_host, "free", (double)disk.free_mb * 1024 * 1024);
        set2(m->disk_host, "reserve", (double)disk.reserve_mb * 1024 * 1024);
    }
}

int wk_metrics_init(wk_t *w, sp_metrics_t *reg)
{
    wk_metrics_t *m = &w->metrics;
    m->sandboxes = gauge(reg, "space_worker_sandboxes",
                         "Sandboxes on this worker by state: running, paused, restoring (owned), "
                         "pooled (warm, not claimed yet).",
                         "state", 4);
    m->pool_ready =
        gauge(reg, "space_worker_pool_ready", "Warm sandboxes ready to be claimed, by template.",
              "template", WK_POOL_LEVELS_MAX);
    m->pool_target = gauge(reg, "space_worker_pool_target",
                           "Warm sandboxes the pool keeps ready, by template (pool-size).",
                           "template", WK_POOL_LEVELS_MAX);
    m->runsc = sp_metrics_add(reg, SP_METRIC_HISTOGRAM, "space_worker_runsc_seconds",
                              "Duration of runsc calls, by operation.", "op", runsc_bounds,
                              sizeof(runsc_bounds) / sizeof(runsc_bounds[0]), 12);
    m->cpu = sp_metrics_add(reg, SP_METRIC_COUNTER, "space_worker_sandbox_cpu_seconds_total",
                            "CPU time a sandbox used (its cgroup), by sandbox id; read at scrape.",
                            "sandbox", NULL, 0, SANDBOX_SERIES_MAX);
    m->memory = gauge(reg, "space_worker_sandbox_memory_bytes",
                      "Memory a sandbox's cgroup charges now (page cache included), by sandbox "
                      "id; read at scrape.",
                      "sandbox", SANDBOX_SERIES_MAX);
    m->disk = gauge(reg, "space_worker_sandbox_disk_bytes",
                    "Bytes a sandbox wrote beyond its template (its subvolume's exclusive bytes, "
                    "what disk_mb limits; as of btrfs's last commit), by sandbox id; read at "
                    "scrape.",
                    "sandbox", SANDBOX_SERIES_MAX);
    m->vcpus = gauge(reg, "space_worker_vcpus",
                     "vCPUs of the host (total) and given to owned sandboxes (allocated; "
                     "overcommitted, may exceed total).",
                     "kind", 2);
    m->memory_host = gauge(reg, "space_worker_memory_bytes",
                           "Memory of the host (total) and given to owned sandboxes "
                           "(allocated).",
                           "kind", 2);
    m->disk_host = gauge(reg, "space_worker_volume_bytes",
                         "The sandbox volume: total, free, and the reserve creates keep free "
                         "(what the heartbeat reports and the scheduler places by).",
                         "kind", 3);
    if (!m->sandboxes || !m->pool_ready || !m->pool_target || !m->runsc || !m->cpu || !m->memory ||
        !m->disk || !m->vcpus || !m->memory_host || !m->disk_host)
        return -1;
    return 0;
}

void wk_metrics_serve_collect(wk_t *w, sp_metrics_t *reg)
{
    sp_metrics_on_collect(reg, collect, w);
}
