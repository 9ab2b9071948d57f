/* A sandbox's usage over time (GET /v1/sandboxes/{id}/metrics, E2B's getMetrics): a thread
 * samples every owned running sandbox's cgroup and subvolume (wk_sandbox_usage, the numbers
 * the Prometheus page reads at scrape time) every sample-ms into a ring in its box, and the
 * data plane's space.io.wkr.<id>.metrics answers a sandbox's ring to the gateway
 * (proto/dataplane.proto, "usage samples"). Nothing here is an event: one sample per sandbox
 * every 5 s would flood the log, and a sample is worth nothing once the sandbox is gone.
 *
 * CPU is the time the cgroup charged since the previous sample over the wall time between
 * them and the sandbox's vCPUs (0..100, E2B's cpuUsedPct); the first sample of a sandbox, or
 * the first after a pause, has only a baseline and is not kept. A paused sandbox keeps its
 * ring and adds nothing; a suspend or a delete takes the box, and its ring, away.
 *
 * Locks: the owned table under w->mu only to take references (as the Prometheus collector
 * does), the ring under the box's mu; the cgroup and qgroup reads hold no lock. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "contract.h"
#include "daemon.h"
#include "dataplane.pb-c.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "worker.h"
#include "xmalloc.h"

#define CALL_MAX   4096 /* a MetricsCall is a few ids */
#define DETAIL_MAX 256

typedef struct {
    int64_t at_us;
    uint32_t cpu_count;
    double cpu_used_pct;
    uint64_t mem_used, mem_total, disk_used, disk_total;
    uint64_t mem_cache;
    bool has_mem_cache;
} sample_t;

struct wk_samples {
    sample_t ring[SP_METRICS_SAMPLES_MAX];
    size_t next, n; /* the newest is at next - 1; n <= SP_METRICS_SAMPLES_MAX */
    bool has_prev;  /* a baseline for the next CPU share */
    double prev_cpu_s;
    int64_t prev_ns;
};

void wk_samples_free(wk_samples_t *s)
{
    free(s);
}

static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- sampling ---- */

static void sample_box(wk_t *w, wk_box_t *b, uint64_t volume_bytes)
{
    char id[65];
    pthread_mutex_lock(&b->mu);
    bool skip = b->gone || b->restoring || b->paused;
    if (b->paused && b->samples)
        b->samples->has_prev = false; /* the next share must not span the pause */
    memcpy(id, b->id, sizeof(id));
    uint32_t vcpu = b->vcpu, memory_mb = b->memory_mb;
    /* The guest's page cache: the agent's answer to the previous sample's question (under the
     * box's lock, which keeps the channel from being closed meanwhile; it never waits). */
    wk_agent_meminfo_t mi;
    bool has_mi = !skip && b->agent && !b->agent_lost && wk_agent_meminfo(b->agent, &mi) == 0;
    pthread_mutex_unlock(&b->mu);
    if (skip)
        return;

    wk_sandbox_usage_t u;
    if (wk_sandbox_usage(w->host, id, &u) < 0 || !u.has_cpu)
        return; /* no cgroup (yet): nothing to say */
    int64_t now_ns = sp_mono_ns();
    sample_t s = {.at_us = wall_us(),
                  .cpu_count = vcpu ? vcpu : 1,
                  .mem_used = u.has_memory ? u.memory_bytes : 0,
                  .mem_total = (uint64_t)memory_mb << 20,
                  .disk_used = u.has_disk ? u.disk_bytes : 0,
                  .disk_total = u.has_disk_limit ? u.disk_limit_bytes : volume_bytes,
                  .mem_cache = has_mi ? mi.cached : 0,
                  .has_mem_cache = has_mi};

    pthread_mutex_lock(&b->mu);
    if (!b->samples)
        b->samples = sp_xcalloc(1, sizeof(*b->samples));
    wk_samples_t *r = b->samples;
    bool keep = r->has_prev && now_ns > r->prev_ns && u.cpu_seconds >= r->prev_cpu_s;
    if (keep) {
        double wall_s = (double)(now_ns - r->prev_ns) / 1e9;
        double pct = (u.cpu_seconds - r->prev_cpu_s) / wall_s / s.cpu_count * 100.0;
        s.cpu_used_pct = pct > 100.0 ? 100.0 : pct;
        r->ring[r->next] = s;
        r->next = (r->next + 1) % SP_METRICS_SAMPLES_MAX;
        if (r->n < SP_METRICS_SAMPLES_MAX)
            r->n++;
    }
    r->has_prev = true;
    r->prev_cpu_s = u.cpu_seconds;
    r->prev_ns = now_ns;
    pthread_mutex_unlock(&b->mu);
}

static void sample_all(wk_t *w)
{
    pthread_mutex_lock(&w->mu);
    size_t n = w->n_owned;
    wk_box_t **boxes = sp_xcalloc(n ? n : 1, sizeof(wk_box_t *));
    for (size_t i = 0; i < n; i++) {
        boxes[i] = w->owned[i];
        boxes[i]->refs++;
    }
    pthread_mutex_unlock(&w->mu);

    /* Without quotas a sandbox's disk is bounded by the volume alone. */
    uint64_t volume_bytes = 0;
    wk_host_disk_t disk;
    if (n && wk_host_disk(w->host, &disk) == 0)
        volume_bytes = disk.total_mb << 20;
    for (size_t i = 0; i < n; i++) {
        sample_box(w, boxes[i], volume_bytes);
        wk_box_put(boxes[i]);
    }
    free(boxes);
}

static void *sampler_main(void *arg)
{
    wk_t *w = arg;
    while (!sp_daemon_stopping) {
        sample_all(w);
        sp_daemon_sleep_ms((int)w->cfg->sample_ms);
    }
    return NULL;
}

/* ---- the data plane ---- */

static void reply(wk_t *w, const char *to, const Space__Io__V1__MetricsReply *r)
{
    size_t len = space__io__v1__metrics_reply__get_packed_size(r);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    space__io__v1__metrics_reply__pack(r, buf);
    int rc = sp_bus_publish_core(w->bus, to, buf, len);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "metrics reply not sent", SP_KS("error", sp_strerror(rc)));
    free(buf);
}

static void reply_error(wk_t *w, const char *to, const char *error, const char *detail)
{
    Space__Io__V1__MetricsReply r = SPACE__IO__V1__METRICS_REPLY__INIT;
    r.error = (char *)error;
    r.detail = (char *)detail;
    reply(w, to, &r);
}

/* The box's samples within [start_us, end_us] (0: unbounded), oldest first, into the reply's
 * arrays (heap). */
static size_t copy_samples(wk_box_t *b, int64_t start_us, int64_t end_us,
                           Space__Io__V1__MetricsSample *out)
{
    size_t k = 0;
    pthread_mutex_lock(&b->mu);
    const wk_samples_t *r = b->samples;
    for (size_t i = 0; r && i < r->n; i++) {
        const sample_t *s =
            &r->ring[(r->next + SP_METRICS_SAMPLES_MAX - r->n + i) % SP_METRICS_SAMPLES_MAX];
        if ((start_us && s->at_us < start_us) || (end_us && s->at_us > end_us))
            continue;
        space__io__v1__metrics_sample__init(&out[k]);
        out[k].at_us = s->at_us;
        out[k].cpu_count = s->cpu_count;
        out[k].cpu_used_pct = s->cpu_used_pct;
        out[k].mem_used = s->mem_used;
        out[k].mem_total = s->mem_total;
        out[k].disk_used = s->disk_used;
        out[k].disk_total = s->disk_total;
        out[k].mem_cache = s->mem_cache;
        out[k].has_mem_cache = s->has_mem_cache;
        k++;
    }
    pthread_mutex_unlock(&b->mu);
    return k;
}

static void metrics_call(wk_t *w, const char *reply_to, const uint8_t *data, size_t len)
{
    char detail[DETAIL_MAX];
    Space__Io__V1__MetricsCall *q =
        len <= CALL_MAX ? space__io__v1__metrics_call__unpack(NULL, len, data) : NULL;
    if (!q) {
        reply_error(w, reply_to, "bad_request", "not a MetricsCall");
        return;
    }
    if (!sp_id_valid(q->sandbox) || !sp_id_valid(q->tenant) || strlen(q->correlation_id) > 128 ||
        q->start_us < 0 || q->end_us < 0) {
        reply_error(w, reply_to, "bad_request",
                    "sandbox and tenant must be ids, start and end >= 0");
        goto out;
    }
    wk_box_t *b = wk_owned_get(w, q->sandbox);
    if (!b || strcmp(b->tenant, q->tenant) != 0) {
        snprintf(detail, sizeof(detail), "no sandbox %s on worker %s", q->sandbox, w->cfg->id);
        reply_error(w, reply_to, "sandbox_not_running", detail);
        wk_box_put(b);
        goto out;
    }
    Space__Io__V1__MetricsSample *arr = sp_xcalloc(SP_METRICS_SAMPLES_MAX, sizeof(*arr));
    Space__Io__V1__MetricsSample **ptrs =
        sp_xcalloc(SP_METRICS_SAMPLES_MAX, sizeof(Space__Io__V1__MetricsSample *));
    size_t n = copy_samples(b, q->start_us, q->end_us, arr);
    wk_box_put(b);
    for (size_t i = 0; i < n; i++)
        ptrs[i] = &arr[i];
    Space__Io__V1__MetricsReply r = SPACE__IO__V1__METRICS_REPLY__INIT;
    r.ok = true;
    r.n_samples = n;
    r.samples = ptrs;
    reply(w, reply_to, &r);
    free(ptrs);
    free(arr);
out:
    space__io__v1__metrics_call__free_unpacked(q, NULL);
}

/* The subscription's callback: acts only on a request that wk_request_open lets through. */
static void on_metrics_call(void *arg, const char *subject, const char *reply_to,
                            const uint8_t *data, size_t len)
{
    sp_request_t rq;
    if (wk_request_open(arg, subject, reply_to, data, len, &rq) && reply_to && reply_to[0])
        metrics_call(arg, reply_to, rq.body, rq.len);
    sp_request_dispose(&rq);
}

int wk_samples_start(wk_t *w)
{
    char subject[128];
    int rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_METRICS, w->cfg->id, NULL, NULL);
    if (rc >= 0)
        rc = sp_bus_subscribe(w->bus, subject, NULL, on_metrics_call, w, &w->metrics_sub);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot subscribe to metrics calls", SP_KS("error", sp_strerror(rc)));
        return rc;
    }
    if (pthread_create(&w->sampler, NULL, sampler_main, w) != 0) {
        sp_log(SP_LOG_ERROR, "cannot start the usage sampler");
        return -EAGAIN;
    }
    w->sampler_started = true;
    return 0;
}

void wk_samples_stop(wk_t *w)
{
    sp_bus_unsubscribe(w->metrics_sub);
    w->metrics_sub = NULL;
    if (w->sampler_started)
        pthread_join(w->sampler, NULL);
    w->sampler_started = false;
}
