/* space-bench exec: the round trip of `echo hi` in a running sandbox through the HTTP API
 * (POST /v1/sandboxes/{id}/commands with Accept: application/json, until the answer with the
 * exit code), next to `runsc exec` of the same command in the same sandbox, alternating in
 * the same run. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "error.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "metrics.h"
#include "xmalloc.h"

static double api_exec(bench_ctx_t *c, const char *path)
{
    sp_httpc_resp_t r;
    const char *body = "{\"cmd\":\"echo hi\"}";
    int64_t t0 = sp_mono_ns();
    int rc = bench_http(c, "POST", path, "Accept: application/json\r\n", body, &r);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    if (rc < 0 || r.status != 200 || !strstr(r.body, "\"stdout\":\"hi\\n\"")) {
        fprintf(stderr, "space-bench: exec failed: %s %d %s\n", sp_strerror(rc), r.status,
                r.body ? r.body : "");
        exit(1);
    }
    sp_httpc_resp_free(&r);
    return ms;
}

static double runsc_exec(const char *root, const char *id)
{
    int64_t t0 = sp_mono_ns();
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_RDWR);
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execlp("runsc", "runsc", "--root", root, "exec", id, "/bin/echo", "hi", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "space-bench: runsc exec failed\n");
        exit(1);
    }
    return (double)(sp_mono_ns() - t0) / 1e6;
}

/* ---- CPU time per command, by process ---- */

#define CPU_PARTS 8
static const char *const cpu_names[CPU_PARTS] = {
    "nats-server",  "postgres",      "space-eventlog", "space-scheduler",
    "space-worker", "space-egressd", "space-gateway",  "sandbox (runsc)"};

/* CPU ticks so far of the stack's daemons (postgres with its backends) and of the processes
 * of sandbox id (every process whose command line names it: runsc's sandbox and gofer). */
static void cpu_snapshot(const char *home, const char *id, long long out[CPU_PARTS])
{
    long pids[CPU_PARTS - 1];
    for (int i = 0; i < CPU_PARTS - 1; i++) {
        pids[i] = bench_pid_file(home, cpu_names[i]);
        out[i] = pids[i] ? bench_proc_ticks(pids[i], NULL) : 0;
    }
    out[CPU_PARTS - 1] = 0;
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d));) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        long ppid = 0;
        long long t = bench_proc_ticks(pid, &ppid);
        if (pids[1] && ppid == pids[1]) {
            out[1] += t; /* a postgres backend */
            continue;
        }
        char path[64], cmd[4096];
        snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, cmd, sizeof(cmd) - 1);
        close(fd);
        for (ssize_t k = 0; k < n; k++)
            if (!cmd[k])
                cmd[k] = ' ';
        cmd[n > 0 ? n : 0] = '\0';
        if (strstr(cmd, "runsc") && strstr(cmd, id))
            out[CPU_PARTS - 1] += t;
    }
    if (d)
        closedir(d);
}

/* What one block of commands measured with one build. */
typedef struct {
    double *api, *base, *b2b; /* ms: API, runsc exec (alternating), API back to back */
    size_t n, m;
    long long cpu[CPU_PARTS]; /* ticks over the back-to-back commands */
    long long events;         /* messages the stream stored over them */
    long long sandbox_events; /* of them, rows in the log about the sandbox (aggregate id) */
    double batches;           /* transactions the event log committed over them */
    double store_s;           /* seconds the event log spent in them */
} exec_run_t;

/* The event log's batch count (its transactions) and the seconds spent storing them, from its
 * metrics (docs/metrics.md: the port in run/space-eventlog.metrics); false when unreadable. */
static bool eventlog_batches(bench_ctx_t *c, double *ret_batches, double *ret_store_s)
{
    long port = bench_run_file(c->home, "space-eventlog", SP_METRICS_PORT_SUFFIX);
    if (port <= 0 || port > 65535)
        return false;
    sp_httpc_req_t req = {
        .host = "127.0.0.1", .port = (int)port, .method = "GET", .path = "/metrics"};
    sp_httpc_resp_t r = {0};
    bool ok = false;
    if (sp_httpc_do(&req, &r) == 0 && r.status == 200 && r.body) {
        const char *b = strstr(r.body, "\nspace_eventlog_batch_events_count ");
        const char *t = strstr(r.body, "\nspace_eventlog_store_seconds_sum ");
        if (b && t) {
            *ret_batches = strtod(strchr(b + 1, ' '), NULL);
            *ret_store_s = strtod(strchr(t + 1, ' '), NULL);
            ok = true;
        }
    }
    sp_httpc_resp_free(&r);
    return ok;
}

static long long scalar_ll(PGconn *db, const char *sql, const char *arg)
{
    const char *params[1] = {arg};
    PGresult *q = PQexecParams(db, sql, arg ? 1 : 0, NULL, params, NULL, NULL, 0);
    long long v = -1;
    if (PQresultStatus(q) == PGRES_TUPLES_OK && PQntuples(q) == 1 && !PQgetisnull(q, 0, 0))
        v = strtoll(PQgetvalue(q, 0, 0), NULL, 10);
    PQclear(q);
    return v;
}

/* The stream's last sequence, once the event log has stored it (up to 30 s). */
static uint64_t stream_settled(bench_ctx_t *c)
{
    uint64_t last = 0, msgs = 0;
    for (int i = 0; i < 300; i++) {
        if (sp_bus_stream_info(c->bus, &last, &msgs) < 0)
            return 0;
        if (scalar_ll(c->db, "SELECT coalesce(max(stream_seq), 0) FROM events", NULL) >=
            (long long)last)
            break;
        nanosleep(&(struct timespec){.tv_nsec = 100000000}, NULL);
    }
    return last;
}

/* The first command after a restart: the worker adopts the sandbox again and the gateway
 * finds it; up to 60 s. */
static void exec_ready(bench_ctx_t *c, const char *path)
{
    char last[256] = "";
    for (int i = 0; i < 600; i++) {
        sp_httpc_resp_t r;
        const char *body = "{\"cmd\":\"echo hi\"}";
        int rc = bench_http(c, "POST", path, "Accept: application/json\r\n", body, &r);
        bool ok = rc == 0 && r.status == 200 && strstr(r.body, "\"stdout\":\"hi\\n\"");
        if (rc == 0) {
            snprintf(last, sizeof(last), "%d %.200s", r.status, r.body ? r.body : "");
            sp_httpc_resp_free(&r);
        } else {
            snprintf(last, sizeof(last), "%s", sp_strerror(rc));
        }
        if (ok)
            return;
        nanosleep(&(struct timespec){.tv_nsec = 100000000}, NULL);
    }
    fprintf(stderr, "space-bench: the sandbox does not answer commands after the restart: %s\n",
            last);
    exit(1);
}

static void exec_block(bench_ctx_t *c, const char *id, const char *path, const char *root, size_t n,
                       size_t m, exec_run_t *x)
{
    for (size_t i = 0; i < n; i++) {
        x->api[x->n + i] = api_exec(c, path);
        x->base[x->n + i] = runsc_exec(root, id);
    }
    x->n += n;
    /* Back to back: each command also pays for what the one before left to do (its facts
     * stored, acked, written to PostgreSQL), on the same two cores. The CPU each process spent
     * per command says where a command's cost goes. */
    long long cpu0[CPU_PARTS], cpu1[CPU_PARTS];
    double tx0 = 0, tx1 = 0, st0 = 0, st1 = 0;
    uint64_t seq0 = stream_settled(c);
    bool tx = eventlog_batches(c, &tx0, &st0);
    long long sb0 = scalar_ll(c->db, "SELECT count(*) FROM events WHERE aggregate_id = $1", id);
    cpu_snapshot(c->home, id, cpu0);
    for (size_t i = 0; i < m; i++)
        x->b2b[x->m + i] = api_exec(c, path);
    /* The last command's facts may still be held by the worker (worker_factq.c). */
    nanosleep(&(struct timespec){.tv_nsec = 300000000}, NULL);
    uint64_t seq1 = stream_settled(c);
    cpu_snapshot(c->home, id, cpu1);
    long long sb1 = scalar_ll(c->db, "SELECT count(*) FROM events WHERE aggregate_id = $1", id);
    if (tx && eventlog_batches(c, &tx1, &st1)) {
        x->batches += tx1 - tx0;
        x->store_s += st1 - st0;
    } else {
        x->batches = x->store_s = NAN;
    }
    x->m += m;
    for (int i = 0; i < CPU_PARTS; i++)
        x->cpu[i] += cpu1[i] - cpu0[i];
    x->events += (long long)(seq1 - seq0);
    x->sandbox_events += sb1 - sb0;
}

static void exec_report(const char *what, const char *build, exec_run_t *x, const exec_run_t *vs,
                        double out[5])
{
    double a[3] = {bench_pct(x->api, x->n, 50), bench_pct(x->api, x->n, 90),
                   bench_pct(x->api, x->n, 99)};
    double b[3] = {bench_pct(x->base, x->n, 50), bench_pct(x->base, x->n, 90),
                   bench_pct(x->base, x->n, 99)};
    double k[3] = {bench_pct(x->b2b, x->m, 50), bench_pct(x->b2b, x->m, 90),
                   bench_pct(x->b2b, x->m, 99)};
    printf("\n%s\n  %-44s %9s %9s %9s\n", what, "", "p50 ms", "p90 ms", "p99 ms");
    printf("  %-44s %9.2f %9.2f %9.2f\n", "POST .../commands echo hi -> exit (HTTP)", a[0], a[1],
           a[2]);
    printf("  %-44s %9.2f %9.2f %9.2f\n", "runsc exec echo hi (baseline)", b[0], b[1], b[2]);
    printf("  %-44s %9.2f %9.2f %9.2f\n", "ratio API / runsc exec", a[0] / b[0], a[1] / b[1],
           a[2] / b[2]);
    printf("  %-44s %9.2f %9.2f %9.2f\n", "POST .../commands back to back (no runsc)", k[0], k[1],
           k[2]);
    double tick_ms = 1000.0 / (double)sysconf(_SC_CLK_TCK), host = 0, all = 0;
    printf("\n  CPU per command, back to back (%zu commands, from /proc):\n", x->m);
    for (int i = 0; i < CPU_PARTS; i++) {
        double ms = (double)x->cpu[i] * tick_ms / (double)x->m;
        all += ms;
        host += i < CPU_PARTS - 1 ? ms : 0;
        if (vs)
            printf("    %-20s %6.2f ms (x%.2f of the baseline build's)\n", cpu_names[i], ms,
                   vs->cpu[i] ? ms / ((double)vs->cpu[i] * tick_ms / (double)vs->m) : 0.0);
        else
            printf("    %-20s %6.2f ms\n", cpu_names[i], ms);
    }
    printf("    %-20s %6.2f ms (the platform's processes, without the sandbox)\n", "host", host);
    printf("    %-20s %6.2f ms (two cores here)\n", "all", all);
    printf("  events per command: %.2f stored in the stream (%.2f about the sandbox)\n",
           (double)x->events / (double)x->m, (double)x->sandbox_events / (double)x->m);
    printf("  event log transactions per command: %.2f, %.3f ms each in the event log (metrics)\n",
           x->batches / (double)x->m, x->store_s * 1e3 / x->batches);
    out[0] = a[0];
    out[1] = b[0];
    out[2] = k[0];
    out[3] = host;
    out[4] = (double)x->events / (double)x->m;
    printf("\nJSON {\"bench\":\"exec\",\"build\":\"%s\",\"n\":%zu,\"api_ms_p50\":%.2f,"
           "\"api_ms_p90\":%.2f,\"api_ms_p99\":%.2f,\"runsc_exec_ms_p50\":%.2f,"
           "\"runsc_exec_ms_p90\":%.2f,\"runsc_exec_ms_p99\":%.2f,\"api_runsc_ratio_p50\":%.3f,"
           "\"back_to_back_ms_p50\":%.2f,\"cpu_ms_per_command\":%.2f,"
           "\"host_cpu_ms_per_command\":%.2f,\"events_per_command\":%.2f,"
           "\"eventlog_tx_per_command\":%.2f}\n",
           build, x->n, a[0], a[1], a[2], b[0], b[1], b[2], a[0] / b[0], k[0], all, host, out[4],
           x->batches / (double)x->m);
}

/* The guest's part of the commands of sandbox id: from the worker taking the ExecRequest to the
 * agent's exit (the worker's "command done" lines, field us; a worker that does not log it
 * counts nothing), in ms into a new array; how many. */
static size_t guest_part(const char *home, const char *id, double **ret)
{
    char *path = sp_xasprintf("%s/log/space-worker.log", home);
    FILE *f = fopen(path, "r");
    free(path);
    size_t n = 0, cap = 0;
    double *v = NULL;
    char line[4096], want[128];
    snprintf(want, sizeof(want), "sandbox=%s ", id);
    while (f && fgets(line, sizeof(line), f)) {
        const char *us = strstr(line, " us=");
        if (!strstr(line, "msg=\"command done\"") || !strstr(line, want) || !us)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            v = sp_xrealloc(v, cap * sizeof(*v));
        }
        v[n++] = strtod(us + 4, NULL) / 1000.0;
    }
    if (f)
        fclose(f);
    *ret = v;
    return n;
}

/* The daemons a command goes through, restarted from the other build between blocks. */
static const char *const cmd_daemons[] = {"space-gateway", "space-worker", "space-eventlog"};

int bench_exec(bench_ctx_t *c)
{
    sp_httpc_resp_t r;
    char id[80];
    if (bench_create_sandbox(c, id) < 0) {
        fprintf(stderr, "space-bench: create failed\n");
        return 1;
    }

    char path[160];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    char *root = sp_xasprintf("%s/worker/runsc", c->home);
    size_t n = c->execs, m = n / 2 ? n / 2 : 1;
    /* With --baseline-bin the gateway, worker and event log of the two builds take turns:
     * blocks of commands, the first build alternating from block to block. */
    size_t blocks = c->baseline_bin ? (n >= 40 ? 4 : 1) : 1;
    exec_run_t x[2];
    memset(x, 0, sizeof(x));
    for (int v = 0; v < (c->baseline_bin ? 2 : 1); v++) {
        x[v].api = sp_xcalloc(n, sizeof(double));
        x[v].base = sp_xcalloc(n, sizeof(double));
        x[v].b2b = sp_xcalloc(m, sizeof(double));
    }
    printf("exec round trip: %zu x `echo hi` through HTTP, alternating with %zu x `runsc exec` "
           "into the same sandbox, then %zu back to back%s%s\n",
           n, n, m, c->baseline_bin ? "; the same with the gateway, worker and event log of " : "",
           c->baseline_bin ? c->baseline_bin : "");
    if (c->baseline_bin) {
        /* The restarted gateway listens where the bench talks to it. */
        char port[16];
        snprintf(port, sizeof(port), "%d", c->api_port);
        setenv("SPACE_API_PORT", port, 1);
    }
    if (c->baseline_bin)
        printf("(in %zu blocks per build, the builds taking turns; the machine may be busy: CPU "
               "time per command is the robust number)\n",
               blocks);
    api_exec(c, path);
    runsc_exec(root, id);
    for (size_t b = 0; b < blocks; b++) {
        size_t bn = n / blocks + (b < n % blocks), bm = m / blocks + (b < m % blocks);
        for (int k = 0; k < (c->baseline_bin ? 2 : 1); k++) {
            int v = c->baseline_bin ? (k ^ (int)(b & 1)) : 0;
            if (c->baseline_bin) {
                if (bench_restart_daemons(c, cmd_daemons, 3, v ? c->baseline_bin : NULL) < 0) {
                    fprintf(stderr, "space-bench: cannot restart the daemons\n");
                    exit(1);
                }
                exec_ready(c, path);
            }
            if (bm)
                exec_block(c, id, path, root, bn, bm, &x[v]);
        }
    }
    double mine[5], other[5];
    if (c->baseline_bin) {
        exec_report("baseline build", "baseline", &x[1], NULL, other);
        exec_report("this build", "this", &x[0], &x[1], mine);
        printf("\nthis build / baseline build: API p50 x%.3f, back to back p50 x%.3f, host CPU "
               "per command x%.3f, events per command %.2f against %.2f\n",
               mine[0] / other[0], mine[2] / other[2], mine[3] / other[3], mine[4], other[4]);
        printf("JSON {\"bench\":\"exec-baseline\",\"baseline_bin\":\"%s\",\"api_p50_ratio\":%.3f,"
               "\"back_to_back_p50_ratio\":%.3f,\"host_cpu_ratio\":%.3f,"
               "\"host_cpu_ms_per_command\":%.2f,\"baseline_host_cpu_ms_per_command\":%.2f,"
               "\"events_per_command\":%.2f,\"baseline_events_per_command\":%.2f}\n",
               c->baseline_bin, mine[0] / other[0], mine[2] / other[2], mine[3] / other[3], mine[3],
               other[3], mine[4], other[4]);
        /* Leave the stack as it was found: this build's daemons. */
        if (bench_restart_daemons(c, cmd_daemons, 3, NULL) < 0)
            fprintf(stderr, "space-bench: cannot restart the daemons\n");
        else
            exec_ready(c, path);
    } else {
        exec_report("this build", "this", &x[0], NULL, mine);
    }
    /* What no work on the host can take away: the guest's own part, beside runsc exec. */
    double *guest = NULL;
    size_t ng = guest_part(c->home, id, &guest);
    if (ng) {
        double g50 = bench_pct(guest, ng, 50), g90 = bench_pct(guest, ng, 90);
        printf("\nthe guest's part (this build's worker: ExecRequest taken -> the agent's exit, "
               "%zu commands): p50 %.2f ms, p90 %.2f ms; x%.3f of runsc exec p50, x%.3f of the "
               "API p50\n",
               ng, g50, g90, g50 / mine[1], g50 / mine[0]);
        printf(
            "JSON {\"bench\":\"exec-guest\",\"n\":%zu,\"guest_ms_p50\":%.2f,"
            "\"guest_ms_p90\":%.2f,\"guest_runsc_ratio_p50\":%.3f,\"guest_api_ratio_p50\":%.3f}\n",
            ng, g50, g90, g50 / mine[1], g50 / mine[0]);
    }
    free(guest);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    if (bench_http(c, "DELETE", path, NULL, NULL, &r) == 0)
        sp_httpc_resp_free(&r);
    for (int v = 0; v < 2; v++) {
        free(x[v].api);
        free(x[v].base);
        free(x[v].b2b);
    }
    free(root);
    return 0;
}
