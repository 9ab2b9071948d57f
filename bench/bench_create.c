/* space-bench create: sandbox create latency through the HTTP API (POST /v1/sandboxes until
 * the 201, i.e. the sandbox is running on a worker and the log says so), next to the floor
 * without our platform measured in the same run: `runsc run` of the same template directly
 * (create + start + run /bin/true + exit, network none). Creates and baseline runs alternate
 * so both see the same machine. Each sandbox is deleted after its measurement (not timed).
 *
 * Three parts in one run (docs/pools.md):
 *   cold    the worker's warm pools off (bench/run.sh starts the stack with SPACE_POOL_SIZE=0):
 *           every create is made from scratch;
 *   pooled  the worker restarted with pools of --warm-pool N, the pool full, creates arriving no
 *           faster than it refills (each waits until the worker has a pooled sandbox of tiny
 *           ready again, as the host shows it), so each is a claim;
 *   burst   3x the pool size at once with the pool full: the first ones claim, the rest are
 *           made from scratch beside the refill; how that degrades.
 * Whether each create was a claim is read back from its SandboxStarted (from_pool) in the
 * log, not assumed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "buf.h"
#include "envelope.h"
#include "error.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"

#define TEMPLATE_BODY "{\"template\":\"tiny\",\"metadata\":{\"bench\":\"create\"}}"

/* One `runsc run` in ms. */
static double runsc_run(const char *root, const char *bundle, unsigned i)
{
    char id[64];
    snprintf(id, sizeof(id), "bench-baseline-%06u", i);
    char *argv[] = {"runsc",        "--root", (char *)root, "--network=none", "run", "--bundle",
                    (char *)bundle, id,       NULL};
    int64_t t0 = sp_mono_ns();
    int rc = bench_run_quiet(argv);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    char *del[] = {"runsc", "--root", (char *)root, "delete", "--force", id, NULL};
    bench_run_quiet(del);
    if (rc != 0) {
        fprintf(stderr, "space-bench: runsc run failed (%d)\n", rc);
        exit(1);
    }
    return ms;
}

/* One create through the API in ms; the sandbox id into id (deleted later by the caller). */
static double api_create(bench_ctx_t *c, char id[80])
{
    sp_httpc_resp_t r;
    int64_t t0 = sp_mono_ns();
    int rc = bench_http(c, "POST", "/v1/sandboxes", NULL, TEMPLATE_BODY, &r);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    if (rc < 0 || r.status != 201) {
        fprintf(stderr, "space-bench: create failed: %s %d %s\n", sp_strerror(rc), r.status,
                r.body ? r.body : "");
        exit(1);
    }
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    const char *s = NULL;
    if (sp_json_parse(r.body, r.body_len, NULL, &doc, err) == 0)
        s = sp_json_str(sp_json_get(sp_json_root(doc), "id"), NULL);
    snprintf(id, 80, "%s", s ? s : "");
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    return ms;
}

static void api_delete(bench_ctx_t *c, const char *id)
{
    if (!id[0])
        return;
    char path[160];
    sp_httpc_resp_t d;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    if (bench_http(c, "DELETE", path, NULL, NULL, &d) == 0)
        sp_httpc_resp_free(&d);
}

/* 1 when the log's SandboxStarted of id says from_pool, 0 when not, -1 when there is none. */
static int started_from_pool(bench_ctx_t *c, const char *id)
{
    const char *p[1] = {id};
    for (int i = 0; i < 100; i++) {
        PGresult *r = PQexecParams(c->db,
                                   "SELECT payload FROM events WHERE aggregate_id = $1 AND type = "
                                   "'SandboxStarted' AND status = 'accepted'",
                                   1, NULL, p, NULL, NULL, 1);
        int v = -1;
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) >= 1) {
            sp_envelope_t *ev = NULL;
            char reason[SP_REASON_MAX];
            if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, 0, 0),
                                   (size_t)PQgetlength(r, 0, 0), &ev, reason) == 0)
                v = ev->sandbox_started->from_pool ? 1 : 0;
            sp_envelope_free(ev);
        }
        PQclear(r);
        if (v >= 0)
            return v;
        usleep(20 * 1000);
    }
    return -1;
}

/* Pooled sandboxes of this worker ready on the host: bundles pool_* that no sandbox links to
 * and whose agent is up (its channel directory holds nothing yet; the refill writes the
 * bundle's config.json before runsc create, and the pool counts a sandbox only once its
 * agent said Hello: config.json + a running container is the host's view of that). */
static int pooled_ready(bench_ctx_t *c)
{
    char *bundles = sp_xasprintf("%s/worker/bundles", c->home);
    char *cmd = sp_xasprintf("runsc --root=%s/worker/runsc list 2>/dev/null", c->home);
    FILE *f = popen(cmd, "r"); /* NOLINT(cert-env33-c): as an operator would look */
    char running[64][80];
    int nr = 0;
    char line[512];
    while (f && nr < 64 && fgets(line, sizeof(line), f)) {
        /* "ID PID STATUS BUNDLE CREATED OWNER" */
        char *save = NULL, *cid = strtok_r(line, " \t", &save);
        char *pid = cid ? strtok_r(NULL, " \t", &save) : NULL;
        char *state = pid ? strtok_r(NULL, " \t", &save) : NULL;
        if (state && strncmp(cid, "pool_", 5) == 0 && strcmp(state, "running") == 0)
            snprintf(running[nr++], sizeof(running[0]), "%s", cid);
    }
    if (f)
        pclose(f);
    int n = 0;
    DIR *d = opendir(bundles);
    struct dirent *de;
    char links[256][80];
    int nl = 0;
    while (d && (de = readdir(d))) {
        char *p = sp_xasprintf("%s/%s", bundles, de->d_name);
        char t[80];
        ssize_t k = readlink(p, t, sizeof(t) - 1);
        free(p);
        if (k > 0 && nl < 256) {
            t[k] = '\0';
            snprintf(links[nl++], sizeof(links[0]), "%s", t);
        }
    }
    for (int i = 0; i < nr; i++) {
        bool linked = false;
        for (int k = 0; k < nl; k++)
            linked |= strcmp(links[k], running[i]) == 0;
        n += !linked;
    }
    if (d)
        closedir(d);
    free(cmd);
    free(bundles);
    return n;
}

/* Waits (at most timeout_ms) until `want` pooled sandboxes are ready; then a moment more, for
 * the last one's agent channel (ready for the pool only after its Hello). */
static bool wait_pool(bench_ctx_t *c, int want, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 50) {
        if (pooled_ready(c) >= want) {
            usleep(30 * 1000);
            return true;
        }
        usleep(50 * 1000);
    }
    return false;
}

/* Stops the stack's worker and starts it again with SPACE_POOL_SIZE=pool (space up starts
 * what is not running, with this process's environment). */
static int restart_worker(bench_ctx_t *c, size_t pool)
{
    char *pidfile = sp_xasprintf("%s/run/space-worker.pid", c->home);
    FILE *f = fopen(pidfile, "r");
    char line[32] = "";
    if (f && !fgets(line, sizeof(line), f))
        line[0] = '\0';
    if (f)
        fclose(f);
    long pid = strtol(line, NULL, 10);
    free(pidfile);
    if (pid > 1 && kill((pid_t)pid, SIGTERM) == 0)
        for (int i = 0; i < 300 && kill((pid_t)pid, 0) == 0; i++)
            usleep(50 * 1000);
    char size[24];
    snprintf(size, sizeof(size), "%zu", pool);
    setenv("SPACE_POOL_SIZE", size, 1);
    const char *bin = getenv("SPACE_BIN_DIR");
    char *space = sp_xasprintf("%s/space", bin && *bin ? bin : ".");
    char *argv[] = {space, "up", NULL};
    int rc = bench_run_quiet(argv);
    free(space);
    return rc == 0 ? 0 : -1;
}

typedef struct {
    double *api, *base;
    int *pooled;
    double *sched, *worker, *logged; /* where a create's time went, from the log (ms) */
    size_t n;
} series_t;

/* The create's path in the log's timestamps (one clock, this host): intent -> placement (the
 * scheduler), placement -> SandboxStarted (the worker: its fetch and the create or claim),
 * SandboxStarted -> stored (the event log); the rest of the API time is the gateway's and
 * HTTP's. */
static void path_of(bench_ctx_t *c, const char *id, series_t *s, size_t i)
{
    const char *p[1] = {id};
    PGresult *r = PQexecParams(
        c->db,
        "SELECT type, extract(epoch FROM occurred_at) * 1000, extract(epoch FROM stored_at) * "
        "1000 FROM events WHERE aggregate_id = $1 AND status = 'accepted' AND type IN "
        "('SandboxCreateRequested', 'SandboxPlaced', 'SandboxStarted')",
        1, NULL, p, NULL, NULL, 0);
    double req = 0, placed = 0, started = 0, stored = 0;
    for (int k = 0; PQresultStatus(r) == PGRES_TUPLES_OK && k < PQntuples(r); k++) {
        const char *t = PQgetvalue(r, k, 0);
        double occ = strtod(PQgetvalue(r, k, 1), NULL), st = strtod(PQgetvalue(r, k, 2), NULL);
        if (strcmp(t, "SandboxCreateRequested") == 0)
            req = occ;
        else if (strcmp(t, "SandboxPlaced") == 0)
            placed = occ;
        else {
            started = occ;
            stored = st;
        }
    }
    PQclear(r);
    s->sched[i] = req && placed ? placed - req : 0;
    s->worker[i] = placed && started ? started - placed : 0;
    s->logged[i] = started && stored ? stored - started : 0;
}

static void series_init(series_t *s, size_t n)
{
    s->api = sp_xcalloc(n, sizeof(double));
    s->base = sp_xcalloc(n, sizeof(double));
    s->pooled = sp_xcalloc(n, sizeof(int));
    s->sched = sp_xcalloc(n, sizeof(double));
    s->worker = sp_xcalloc(n, sizeof(double));
    s->logged = sp_xcalloc(n, sizeof(double));
    s->n = n;
}

static void series_free(series_t *s)
{
    free(s->api);
    free(s->base);
    free(s->pooled);
    free(s->sched);
    free(s->worker);
    free(s->logged);
}

static size_t count_pooled(const series_t *s)
{
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        k += s->pooled[i] == 1;
    return k;
}

typedef struct {
    bench_ctx_t *c;
    double ms;
    char id[80];
    pthread_t t;
} burst_t;

static void *burst_main(void *arg)
{
    burst_t *b = arg;
    b->ms = api_create(b->c, b->id);
    return NULL;
}

int bench_create(bench_ctx_t *c)
{
    size_t n = c->creates, pool = c->pool_size ? c->pool_size : 2;
    series_t cold, warm;
    series_init(&cold, n);
    series_init(&warm, n);
    char *rootfs = sp_xasprintf("%s/worker/volumes/templates/tiny", c->home);
    char *bundle = bench_make_bundle(rootfs, "[\"/bin/true\"]");
    char *root = sp_xasprintf("%s/runsc", bundle);
    char id[80];

    printf("create latency: %zu creates through HTTP (tiny template) with warm pools off, %zu "
           "claims from a full pool of %zu, each alternating with a `runsc run` of the same "
           "rootfs; then a burst of %zu at once\n",
           n, n, pool, 3 * pool);
    if (pooled_ready(c) > 0)
        fprintf(stderr, "space-bench: the worker has pooled sandboxes: start it with "
                        "SPACE_POOL_SIZE=0 (bench/run.sh does) for the cold part\n");
    api_create(c, id); /* warm-up: first connections, caches */
    api_delete(c, id);
    runsc_run(root, bundle, 999999);
    for (size_t i = 0; i < n; i++) {
        cold.api[i] = api_create(c, id);
        cold.pooled[i] = started_from_pool(c, id);
        path_of(c, id, &cold, i);
        api_delete(c, id);
        cold.base[i] = runsc_run(root, bundle, (unsigned)i);
    }

    if (restart_worker(c, pool) < 0 || !wait_pool(c, (int)pool, 120000)) {
        fprintf(stderr, "space-bench: the worker did not come back with a full pool\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        /* No faster than the refill: the pool is full again before each create. */
        if (!wait_pool(c, (int)pool, 30000))
            fprintf(stderr, "space-bench: pool not full before create %zu\n", i);
        warm.api[i] = api_create(c, id);
        warm.pooled[i] = started_from_pool(c, id);
        path_of(c, id, &warm, i);
        api_delete(c, id);
        /* The baseline on a machine as quiet as the cold part's: after the refill. */
        if (!wait_pool(c, (int)pool, 30000))
            fprintf(stderr, "space-bench: pool not full after create %zu\n", i);
        warm.base[i] = runsc_run(root, bundle, (unsigned)(n + i));
    }

    size_t nb = 3 * pool;
    burst_t *bu = sp_xcalloc(nb, sizeof(*bu));
    double *bms = sp_xcalloc(nb, sizeof(double));
    if (!wait_pool(c, (int)pool, 30000))
        fprintf(stderr, "space-bench: pool not full before the burst\n");
    int64_t t0 = sp_mono_ns();
    for (size_t i = 0; i < nb; i++) {
        bu[i].c = c;
        pthread_create(&bu[i].t, NULL, burst_main, &bu[i]);
    }
    for (size_t i = 0; i < nb; i++)
        pthread_join(bu[i].t, NULL);
    double burst_wall = (double)(sp_mono_ns() - t0) / 1e6;
    size_t burst_pooled = 0;
    printf("\nburst: %zu creates at once, pool of %zu full (in order of answer time):\n", nb, pool);
    for (size_t i = 0; i < nb; i++) {
        bms[i] = bu[i].ms;
        int fp = started_from_pool(c, bu[i].id);
        burst_pooled += fp == 1;
    }
    for (size_t i = 0; i < nb; i++)
        api_delete(c, bu[i].id);

    double cp[3] = {bench_pct(cold.api, n, 50), bench_pct(cold.api, n, 90),
                    bench_pct(cold.api, n, 99)};
    double cb[3] = {bench_pct(cold.base, n, 50), bench_pct(cold.base, n, 90),
                    bench_pct(cold.base, n, 99)};
    double wp[3] = {bench_pct(warm.api, n, 50), bench_pct(warm.api, n, 90),
                    bench_pct(warm.api, n, 99)};
    double wb[3] = {bench_pct(warm.base, n, 50), bench_pct(warm.base, n, 90),
                    bench_pct(warm.base, n, 99)};
    double bp[3] = {bench_pct(bms, nb, 50), bench_pct(bms, nb, 90), bench_pct(bms, nb, 100)};
    for (size_t i = 0; i < nb; i++)
        printf("  %7.1f ms%s", bms[i], i + 1 < nb ? "" : "\n");
    printf("  wall %.1f ms, %zu of %zu claimed from the pool\n", burst_wall, burst_pooled, nb);

    printf("\n  %-48s %9s %9s %9s\n", "", "p50 ms", "p90 ms", "p99 ms");
    printf("  %-48s %9.1f %9.1f %9.1f\n", "cold: POST /v1/sandboxes -> 201 (pools off)", cp[0],
           cp[1], cp[2]);
    printf("  %-48s %9.1f %9.1f %9.1f\n", "cold: runsc run /bin/true (baseline)", cb[0], cb[1],
           cb[2]);
    printf("  %-48s %9.2f %9.2f %9.2f\n", "cold: ratio API / baseline", cp[0] / cb[0],
           cp[1] / cb[1], cp[2] / cb[2]);
    printf("  %-48s %9.1f %9.1f %9.1f\n", "pooled: POST /v1/sandboxes -> 201 (claim)", wp[0], wp[1],
           wp[2]);
    printf("  %-48s %9.1f %9.1f %9.1f\n", "pooled: runsc run /bin/true (baseline)", wb[0], wb[1],
           wb[2]);
    printf("  %-48s %9.2f %9.2f %9.2f\n", "pooled: ratio API / baseline", wp[0] / wb[0],
           wp[1] / wb[1], wp[2] / wb[2]);
    printf("  %-48s %9.1f %9.1f %9.1f\n", "burst: POST /v1/sandboxes (p50, p90, max)", bp[0], bp[1],
           bp[2]);
    printf("  %-48s %9.1f %9.1f %9.1f\n", "cold path: intent -> placed (scheduler)",
           bench_pct(cold.sched, n, 50), bench_pct(cold.sched, n, 90),
           bench_pct(cold.sched, n, 99));
    printf("  %-48s %9.1f %9.1f %9.1f\n", "cold path: placed -> started (worker)",
           bench_pct(cold.worker, n, 50), bench_pct(cold.worker, n, 90),
           bench_pct(cold.worker, n, 99));
    printf("  %-48s %9.1f %9.1f %9.1f\n", "pooled path: intent -> placed (scheduler)",
           bench_pct(warm.sched, n, 50), bench_pct(warm.sched, n, 90),
           bench_pct(warm.sched, n, 99));
    printf("  %-48s %9.1f %9.1f %9.1f\n", "pooled path: placed -> started (worker)",
           bench_pct(warm.worker, n, 50), bench_pct(warm.worker, n, 90),
           bench_pct(warm.worker, n, 99));
    printf("  %-48s %9.1f %9.1f %9.1f\n", "pooled path: started -> stored (event log)",
           bench_pct(warm.logged, n, 50), bench_pct(warm.logged, n, 90),
           bench_pct(warm.logged, n, 99));
    printf("  claims: cold %zu of %zu from the pool, pooled %zu of %zu, burst %zu of %zu\n",
           count_pooled(&cold), n, count_pooled(&warm), n, burst_pooled, nb);
    printf("\nJSON {\"bench\":\"create\",\"n\":%zu,\"pool_size\":%zu,"
           "\"cold_ms_p50\":%.1f,\"cold_ms_p90\":%.1f,\"cold_ms_p99\":%.1f,"
           "\"cold_runsc_run_ms_p50\":%.1f,\"cold_runsc_run_ms_p90\":%.1f,"
           "\"cold_ratio_p50\":%.2f,"
           "\"pooled_ms_p50\":%.1f,\"pooled_ms_p90\":%.1f,\"pooled_ms_p99\":%.1f,"
           "\"pooled_runsc_run_ms_p50\":%.1f,\"pooled_runsc_run_ms_p90\":%.1f,"
           "\"pooled_ratio_p50\":%.3f,\"pooled_from_pool\":%zu,"
           "\"burst_n\":%zu,\"burst_ms_p50\":%.1f,\"burst_ms_p90\":%.1f,\"burst_ms_max\":%.1f,"
           "\"burst_wall_ms\":%.1f,\"burst_from_pool\":%zu}\n",
           n, pool, cp[0], cp[1], cp[2], cb[0], cb[1], cp[0] / cb[0], wp[0], wp[1], wp[2], wb[0],
           wb[1], wp[0] / wb[0], count_pooled(&warm), nb, bp[0], bp[1], bp[2], burst_wall,
           burst_pooled);
    char *cfg = sp_xasprintf("%s/config.json", bundle);
    unlink(cfg);
    free(cfg);
    char *rm[] = {"rm", "-rf", bundle, NULL};
    bench_run_quiet(rm);
    free(bu);
    free(bms);
    free(root);
    free(bundle);
    free(rootfs);
    series_free(&cold);
    series_free(&warm);
    return 0;
}
