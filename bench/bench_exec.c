/* space-bench exec: the round trip of `echo hi` in a running sandbox through the HTTP API
 * (POST /v1/sandboxes/{id}/commands with Accept: application/json, until the answer with the
 * exit code), next to `runsc exec` of the same command in the same sandbox, alternating in
 * the same run. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "error.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
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
    size_t n = c->execs;
    double *api = sp_xcalloc(n, sizeof(double)), *base = sp_xcalloc(n, sizeof(double));
    printf("exec round trip: %zu x `echo hi` through HTTP, alternating with %zu x `runsc exec` "
           "into the same sandbox\n",
           n, n);
    api_exec(c, path);
    runsc_exec(root, id);
    for (size_t i = 0; i < n; i++) {
        api[i] = api_exec(c, path);
        base[i] = runsc_exec(root, id);
    }
    double a50 = bench_pct(api, n, 50), a90 = bench_pct(api, n, 90), a99 = bench_pct(api, n, 99);
    double b50 = bench_pct(base, n, 50), b90 = bench_pct(base, n, 90), b99 = bench_pct(base, n, 99);
    /* Back to back: each command also pays for what the one before left to do (its facts
     * stored, acked, written to PostgreSQL), on the same two cores. The CPU each process spent
     * per command says where a command's cost goes. */
    size_t m = n / 2 ? n / 2 : 1;
    double *b2b = sp_xcalloc(m, sizeof(double));
    long long cpu0[CPU_PARTS], cpu1[CPU_PARTS];
    cpu_snapshot(c->home, id, cpu0);
    for (size_t i = 0; i < m; i++)
        b2b[i] = api_exec(c, path);
    cpu_snapshot(c->home, id, cpu1);

    printf("\n  %-44s %9s %9s %9s\n", "", "p50 ms", "p90 ms", "p99 ms");
    printf("  %-44s %9.2f %9.2f %9.2f\n", "POST .../commands echo hi -> exit (HTTP)", a50, a90,
           a99);
    printf("  %-44s %9.2f %9.2f %9.2f\n", "runsc exec echo hi (baseline)", b50, b90, b99);
    printf("  %-44s %9.2f %9.2f %9.2f\n", "ratio API / baseline", a50 / b50, a90 / b90, a99 / b99);
    double c50 = bench_pct(b2b, m, 50), c90 = bench_pct(b2b, m, 90), c99 = bench_pct(b2b, m, 99);
    printf("  %-44s %9.2f %9.2f %9.2f\n", "POST .../commands back to back (no runsc)", c50, c90,
           c99);
    double tick_ms = 1000.0 / (double)sysconf(_SC_CLK_TCK), all = 0;
    printf("\n  CPU per command, back to back (%zu commands, from /proc):\n", m);
    for (int i = 0; i < CPU_PARTS; i++) {
        double ms = (double)(cpu1[i] - cpu0[i]) * tick_ms / (double)m;
        all += ms;
        printf("    %-20s %6.2f ms\n", cpu_names[i], ms);
    }
    printf("    %-20s %6.2f ms (two cores here)\n", "all", all);
    printf("\nJSON {\"bench\":\"exec\",\"n\":%zu,\"api_ms_p50\":%.2f,\"api_ms_p90\":%.2f,"
           "\"api_ms_p99\":%.2f,\"runsc_exec_ms_p50\":%.2f,\"runsc_exec_ms_p90\":%.2f,"
           "\"runsc_exec_ms_p99\":%.2f,\"back_to_back_ms_p50\":%.2f,\"cpu_ms_per_command\":%.2f}\n",
           n, a50, a90, a99, b50, b90, b99, c50, all);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    if (bench_http(c, "DELETE", path, NULL, NULL, &r) == 0)
        sp_httpc_resp_free(&r);
    free(api);
    free(base);
    free(b2b);
    free(root);
    return 0;
}
