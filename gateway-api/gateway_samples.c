/* GET /v1/sandboxes/{id}/metrics?start=&end= and E2B's GET /sandboxes/{id}/metrics (the SDK's
 * getMetrics): a sandbox's usage samples, which its worker keeps (worker_samples.c: CPU, memory
 * and disk every sample-ms, an hour's worth) and answers on the data plane
 * (space.io.wkr.<worker>.metrics, MetricsCall -> MetricsReply, proto/dataplane.proto).
 *
 * A pool job finds the sandbox and its worker; a bus job asks the worker; the loop answers.
 * start and end are Unix seconds (what the E2B SDK sends), both optional and inclusive. A
 * sandbox that is not on a worker now (suspended, being created or resumed) has no samples:
 * the answer is an empty list, never an error, so the SDK's poll of a paused sandbox works; a
 * worker that no longer has it (it was just suspended) answers the same way. Only a deleted or
 * unknown sandbox is 404 (E2B: SandboxNotFoundError).
 *
 * Ours: {"sandbox_id", "state", "samples": [{at, cpu_count, cpu_used_pct, memory_used_bytes,
 * memory_total_bytes, disk_used_bytes, disk_total_bytes, memory_cache_bytes}]}. E2B's:
 * [{timestamp, timestampUnix, cpuCount, cpuUsedPct, memUsed, memTotal, diskUsed, diskTotal,
 * memCache}]. The cache is the guest's own (its /proc/meminfo Cached, from the agent): the
 * host's cgroup, whose figure is memUsed, cannot tell it apart. It is absent from a sample
 * taken before the agent answered (or whose agent cannot: made before it could).
 *
 * The reply is untrusted: its size is checked before decoding, the count against
 * SP_METRICS_SAMPLES_MAX, and every number is bounded before it is printed. */
#include "contract.h"
#include "request.h"
#include "gateway.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane.pb-c.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define CALL_TIMEOUT_MS 5000
/* A full ring is SP_METRICS_SAMPLES_MAX samples of at most ~70 bytes each. */
#define REPLY_MAX (SP_METRICS_SAMPLES_MAX * 96 + 4096)
/* Unix seconds beyond this (year 5138) are no time a sample has. */
#define SECONDS_MAX 100000000000LL

typedef struct {
    gw_job_t job; /* first: the pool job */
    gw_bus_job_t bus;
    gw_req_t *rq;
    char sandbox[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    int64_t start_us, end_us;
    gw_sandbox_loc_t loc;
    int bus_rc;
    Space__Io__V1__MetricsReply *reply;
} samples_t;

static void samples_free(samples_t *x)
{
    if (x->reply)
        space__io__v1__metrics_reply__free_unpacked(x->reply, NULL);
    gw_req_unref(x->rq);
    free(x);
}

/* ---- the answer ---- */

static void json_v1(sp_buf_t *b, const samples_t *x)
{
    sp_buf_puts(b, "{\"sandbox_id\":");
    sp_buf_json_str(b, x->sandbox);
    sp_buf_puts(b, ",\"state\":");
    sp_buf_json_str(b, x->loc.state);
    sp_buf_puts(b, ",\"samples\":[");
}

/* One sample, bounded: a worker's numbers are not trusted to be sane. */
static bool sample_ok(const Space__Io__V1__MetricsSample *s)
{
    return s->at_us > 0 && s->at_us < SECONDS_MAX * 1000000 && isfinite(s->cpu_used_pct) &&
           s->cpu_used_pct >= 0 && s->cpu_used_pct <= 100 && s->cpu_count <= 4096;
}

static void json_sample(sp_buf_t *b, const Space__Io__V1__MetricsSample *s, bool e2b)
{
    bool cache = s->has_mem_cache && s->mem_cache <= s->mem_total; /* else not shown */
    if (e2b) {
        sp_buf_puts(b, "{\"timestamp\":");
        gw_json_time(b, s->at_us);
        sp_buf_printf(b,
                      ",\"timestampUnix\":%" PRId64 ",\"cpuCount\":%" PRIu32
                      ",\"cpuUsedPct\":%.2f,\"memUsed\":%" PRIu64 ",\"memTotal\":%" PRIu64
                      ",\"diskUsed\":%" PRIu64 ",\"diskTotal\":%" PRIu64,
                      s->at_us / 1000000, s->cpu_count, s->cpu_used_pct, s->mem_used, s->mem_total,
                      s->disk_used, s->disk_total);
        if (cache)
            sp_buf_printf(b, ",\"memCache\":%" PRIu64, s->mem_cache);
        sp_buf_putc(b, '}');
        return;
    }
    sp_buf_puts(b, "{\"at\":");
    gw_json_time(b, s->at_us);
    sp_buf_printf(b,
                  ",\"cpu_count\":%" PRIu32 ",\"cpu_used_pct\":%.2f,\"memory_used_bytes\":%" PRIu64
                  ",\"memory_total_bytes\":%" PRIu64 ",\"disk_used_bytes\":%" PRIu64
                  ",\"disk_total_bytes\":%" PRIu64,
                  s->cpu_count, s->cpu_used_pct, s->mem_used, s->mem_total, s->disk_used,
                  s->disk_total);
    if (cache)
        sp_buf_printf(b, ",\"memory_cache_bytes\":%" PRIu64, s->mem_cache);
    sp_buf_putc(b, '}');
}

static void respond(samples_t *x)
{
    gw_req_t *rq = x->rq;
    bool e2b = rq->dialect == GW_DIALECT_E2B;
    sp_buf_t b;
    sp_buf_init(&b);
    if (e2b)
        sp_buf_putc(&b, '[');
    else
        json_v1(&b, x);
    size_t shown = 0;
    for (size_t i = 0; x->reply && x->reply->ok && i < x->reply->n_samples; i++) {
        const Space__Io__V1__MetricsSample *s = x->reply->samples[i];
        if (!sample_ok(s))
            continue;
        if (shown++)
            sp_buf_putc(&b, ',');
        json_sample(&b, s, e2b);
    }
    sp_buf_puts(&b, e2b ? "]" : "]}");
    gw_respond_json(rq, 200, &b);
    sp_buf_dispose(&b);
}

/* ---- the worker ---- */

static void bus_run(gw_bus_job_t *job)
{
    samples_t *x = job->arg;
    Space__Io__V1__MetricsCall q = SPACE__IO__V1__METRICS_CALL__INIT;
    char subject[128];
    uint8_t *rep = NULL, buf[512];
    size_t rep_len = 0;
    q.sandbox = x->sandbox;
    q.tenant = x->tenant;
    q.correlation_id = x->rq->request_id;
    q.start_us = x->start_us;
    q.end_us = x->end_us;
    size_t len = space__io__v1__metrics_call__get_packed_size(&q);
    if (len > sizeof(buf)) {
        x->bus_rc = SP_ETOOBIG;
        return;
    }
    space__io__v1__metrics_call__pack(&q, buf);
    x->bus_rc =
        sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_METRICS, x->loc.worker, NULL, NULL);
    if (x->bus_rc >= 0)
        x->bus_rc =
            sp_request_send(x->rq->gw->bus, subject, buf, len, CALL_TIMEOUT_MS, &rep, &rep_len);
    if (x->bus_rc < 0)
        return;
    x->reply =
        rep_len <= REPLY_MAX ? space__io__v1__metrics_reply__unpack(NULL, rep_len, rep) : NULL;
    free(rep);
    if (!x->reply || x->reply->n_samples > SP_METRICS_SAMPLES_MAX)
        x->bus_rc = SP_EDECODE;
}

static void bus_done(gw_bus_job_t *job)
{
    samples_t *x = job->arg;
    gw_req_t *rq = x->rq;
    if (x->bus_rc == SP_ENOTFOUND || x->bus_rc == SP_ETIMEOUT) {
        gw_respond_error(rq, 503, "worker_unavailable", NULL, "worker %s did not answer (%s)",
                         x->loc.worker, sp_strerror(x->bus_rc));
    } else if (x->bus_rc < 0) {
        sp_log(SP_LOG_WARN, "metrics call failed", SP_KS("worker", x->loc.worker),
               SP_KS("error", sp_strerror(x->bus_rc)), SP_KS("request_id", rq->request_id));
        gw_respond_error(rq, 502, "worker_error", NULL, "the worker's answer was unusable (%s)",
                         sp_strerror(x->bus_rc));
    } else {
        /* Not ok: sandbox_not_running (it left the worker since the lookup) has no samples;
         * anything else is logged and answered the same, the samples being a best effort. */
        if (!x->reply->ok && strcmp(x->reply->error, "sandbox_not_running") != 0)
            sp_log(SP_LOG_WARN, "worker refused a metrics call", SP_KS("worker", x->loc.worker),
                   SP_KS("error", x->reply->error), SP_KS("request_id", rq->request_id));
        respond(x);
    }
    samples_free(x);
}

/* ---- the sandbox ---- */

static void lookup_run(gw_job_t *job, PGconn *db)
{
    (void)db;
    samples_t *x = (samples_t *)job;
    gw_sandbox_locate(job, x->sandbox, x->tenant, &x->loc);
}

static void lookup_done(gw_job_t *job)
{
    samples_t *x = (samples_t *)job;
    gw_req_t *rq = x->rq;
    const char *st = x->loc.state;
    if (rq->gw->stopping) {
        gw_respond_error(rq, 503, "shutting_down", NULL, "the gateway is stopping");
    } else if (x->loc.failed) {
        gw_respond_error(rq, 503, "unavailable", NULL, "the database is not available; retry");
    } else if (!x->loc.found || (rq->dialect == GW_DIALECT_E2B &&
                                 (strcmp(st, "deleted") == 0 || strcmp(st, "failed") == 0))) {
        gw_respond_error(rq, 404, "not_found", NULL, "sandbox %s not found", x->sandbox);
    } else if ((strcmp(st, "running") == 0 || strcmp(st, "paused") == 0) &&
               sp_id_valid(x->loc.worker) && gw_req_live(rq)) {
        x->bus.arg = x;
        x->bus.run = bus_run;
        x->bus.done = bus_done;
        gw_bus_submit(rq->gw, &rq->gw->bus_lane, &x->bus);
        return;
    } else {
        respond(x); /* on no worker now: no samples */
    }
    samples_free(x);
}

/* Unix seconds, digits only; 0 when absent. */
static int parse_seconds(const char *v, int64_t *ret_us, bool end)
{
    if (!v[0] || strlen(v) > 12 || strspn(v, "0123456789") != strlen(v))
        return -1;
    long long s = strtoll(v, NULL, 10);
    if (s > SECONDS_MAX)
        return -1;
    *ret_us = (int64_t)s * 1000000 + (end ? 999999 : 0);
    return 0;
}

void gw_sandbox_metrics(gw_req_t *rq)
{
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "sandbox not found");
        return;
    }
    gw_query_t q;
    int64_t start_us = 0, end_us = 0;
    if (gw_query_parse(rq->req, &q) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "malformed query string");
        return;
    }
    for (size_t i = 0; i < q.n; i++) {
        const char *k = q.p[i].key;
        bool is_end = strcmp(k, "end") == 0;
        if ((strcmp(k, "start") == 0 || is_end) &&
            parse_seconds(q.p[i].value, is_end ? &end_us : &start_us, is_end) < 0) {
            gw_respond_error(rq, 400, "invalid_query", NULL,
                             "%s must be Unix seconds (digits only)", k);
            return;
        }
    }
    if (start_us && end_us && start_us > end_us) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "start is after end");
        return;
    }
    samples_t *x = sp_xcalloc(1, sizeof(*x));
    x->rq = rq;
    gw_req_ref(rq);
    snprintf(x->sandbox, sizeof(x->sandbox), "%s", rq->path_id);
    snprintf(x->tenant, sizeof(x->tenant), "%s", rq->tenant);
    x->start_us = start_us;
    x->end_us = end_us;
    x->job.run = lookup_run;
    x->job.done = lookup_done;
    if (gw_job_submit(rq->gw, &x->job) < 0) {
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
        samples_free(x);
    }
}
