/* space-bench density: the memory an idle sandbox costs the host, next to a bare runsc
 * container of the same rootfs in the same run (issue 21 part 4).
 *
 * --sandboxes N `tiny` sandboxes are created through the API and N bare containers with
 * `runsc run --detach` (the template's rootfs, read-only, no network, a shell sleeping in a
 * loop), all left running together; after --seconds of idling, the proportional set size
 * (PSS, /proc/PID/smaps_rollup: shared pages split between the processes that map them) of
 * each one's host processes is summed:
 *   - the sentry (`runsc-sandbox`, the guest kernel: guest memory is its memory file) and its
 *     descendants (the ptrace platform's stub processes, one per guest address space);
 *   - the gofer (`runsc-gofer`, the file server);
 *   - ours only: the reaper the worker keeps per sandbox (`space-reaper`, the subreaper of
 *     runsc's processes).
 * A process belongs to a sandbox when its command line names the sandbox's bundle directory.
 * Both sets run at the same time, so the pages every runsc process shares (the runsc binary,
 * libc) are split over all of them alike. Warm pools are off (bench/run.sh): a claimed pool
 * sandbox is the same processes under its pool id. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "json.h"
#include "xmalloc.h"

enum { PART_SENTRY, PART_STUBS, PART_GOFER, PART_REAPER, N_PARTS };
static const char *const part_name[N_PARTS] = {"sentry (runsc-sandbox)", "stubs (guest spaces)",
                                               "gofer (runsc-gofer)", "reaper (space-reaper)"};

typedef struct {
    long pid, ppid;
    char comm[32];
    char *cmdline;
} proc_t;

static char *read_small(const char *path, size_t max, size_t *ret_len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    char *b = sp_xmalloc(max + 1);
    size_t n = fread(b, 1, max, f);
    fclose(f);
    b[n] = '\0';
    if (ret_len)
        *ret_len = n;
    return b;
}

/* Every process now: pid, parent, name and command line (NULs as spaces). */
static proc_t *procs_read(size_t *ret_n)
{
    proc_t *v = NULL;
    size_t n = 0, cap = 0;
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d));) {
        char *end, path[64];
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        size_t len = 0;
        snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
        char *cmd = read_small(path, 4096, &len);
        if (!cmd)
            continue;
        for (size_t k = 0; k < len; k++)
            if (!cmd[k])
                cmd[k] = ' ';
        if (n == cap)
            v = sp_xreallocarray(v, cap = cap ? 2 * cap : 512, sizeof(*v));
        proc_t *p = &v[n++];
        memset(p, 0, sizeof(*p));
        p->pid = pid;
        p->cmdline = cmd;
        (void)bench_proc_ticks(pid, &p->ppid);
        snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
        char *comm = read_small(path, sizeof(p->comm) - 1, NULL);
        if (comm) {
            comm[strcspn(comm, "\n")] = '\0';
            snprintf(p->comm, sizeof(p->comm), "%s", comm);
            free(comm);
        }
    }
    if (d)
        closedir(d);
    *ret_n = n;
    return v;
}

static void procs_free(proc_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].cmdline);
    free(v);
}

static double pss_kb(long pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/smaps_rollup", pid);
    char *b = read_small(path, 4096, NULL);
    const char *p = b ? strstr(b, "\nPss:") : NULL;
    double kb = p ? strtod(p + 5, NULL) : 0;
    free(b);
    return kb;
}

static bool descends_from(const proc_t *v, size_t n, long pid, long root)
{
    for (int depth = 0; depth < 16 && pid > 1; depth++) {
        if (pid == root)
            return true;
        long parent = 0;
        for (size_t i = 0; i < n; i++)
            if (v[i].pid == pid)
                parent = v[i].ppid;
        pid = parent;
    }
    return false;
}

/* The PSS (kB) of each part of the sandbox whose processes name bundle. */
static void measure(const proc_t *v, size_t n, const char *bundle, double part[N_PARTS])
{
    memset(part, 0, N_PARTS * sizeof(double));
    long sentry = 0;
    for (size_t i = 0; i < n; i++) {
        if (!strstr(v[i].cmdline, bundle))
            continue;
        if (strncmp(v[i].cmdline, "runsc-sandbox", 13) == 0) {
            sentry = v[i].pid;
            part[PART_SENTRY] += pss_kb(v[i].pid);
        } else if (strncmp(v[i].cmdline, "runsc-gofer", 11) == 0) {
            part[PART_GOFER] += pss_kb(v[i].pid);
            /* The worker's reaper is the parent of what `runsc create` leaves running. */
            for (size_t k = 0; k < n; k++)
                if (v[k].pid == v[i].ppid && strcmp(v[k].comm, "space-reaper") == 0)
                    part[PART_REAPER] += pss_kb(v[k].pid);
        }
    }
    for (size_t i = 0; sentry && i < n; i++)
        if (v[i].pid != sentry && descends_from(v, n, v[i].pid, sentry))
            part[PART_STUBS] += pss_kb(v[i].pid);
}

static double sum_parts(const double part[N_PARTS])
{
    double s = 0;
    for (int k = 0; k < N_PARTS; k++)
        s += part[k];
    return s;
}

int bench_density(bench_ctx_t *c)
{
    size_t n = c->sandboxes;
    char(*ids)[80] = sp_xcalloc(n, sizeof(*ids));
    char **bare = sp_xcalloc(n, sizeof(char *)), **bare_root = sp_xcalloc(n, sizeof(char *));
    double *ours[N_PARTS + 1], *base[N_PARTS + 1];
    for (int k = 0; k <= N_PARTS; k++) {
        ours[k] = sp_xcalloc(n, sizeof(double));
        base[k] = sp_xcalloc(n, sizeof(double));
    }
    char *rootfs = sp_xasprintf("%s/worker/volumes/templates/tiny", c->home);
    printf("density: %zu idle tiny sandboxes through the API beside %zu bare runsc containers "
           "of the same rootfs, all running together; PSS after %u s idle\n",
           n, n, c->seconds);
    for (size_t i = 0; i < n; i++)
        if (bench_create_sandbox(c, ids[i]) < 0) {
            fprintf(stderr, "space-bench: create %zu failed\n", i);
            return 1;
        }
    for (size_t i = 0; i < n; i++) {
        char cid[64];
        snprintf(cid, sizeof(cid), "bench-density-%06zu", i);
        bare[i] =
            bench_make_bundle(rootfs, "[\"/bin/sh\",\"-c\",\"while true; do sleep 1; done\"]");
        bare_root[i] = sp_xasprintf("%s/runsc", bare[i]);
        char *run[] = {"runsc", "--root",   bare_root[i], "--network=none",
                       "run",   "--detach", "--bundle",   bare[i],
                       cid,     NULL};
        if (bench_run_quiet(run) != 0) {
            fprintf(stderr, "space-bench: runsc run %s failed\n", cid);
            return 1;
        }
    }
    sleep(c->seconds);

    size_t np = 0;
    proc_t *procs = procs_read(&np);
    for (size_t i = 0; i < n; i++) {
        double p[N_PARTS];
        char bundle[160];
        snprintf(bundle, sizeof(bundle), "/bundles/%s", ids[i]);
        measure(procs, np, bundle, p);
        for (int k = 0; k < N_PARTS; k++)
            ours[k][i] = p[k] / 1024;
        ours[N_PARTS][i] = sum_parts(p) / 1024;
        measure(procs, np, bare[i], p);
        for (int k = 0; k < N_PARTS; k++)
            base[k][i] = p[k] / 1024;
        base[N_PARTS][i] = sum_parts(p) / 1024;
    }
    procs_free(procs, np);
    size_t found = 0;
    for (size_t i = 0; i < n; i++)
        found += ours[PART_SENTRY][i] > 0 && base[PART_SENTRY][i] > 0;

    /* Leave nothing behind: the bare containers, then our sandboxes through the API. */
    for (size_t i = 0; i < n; i++) {
        char cid[64];
        snprintf(cid, sizeof(cid), "bench-density-%06zu", i);
        char *del[] = {"runsc", "--root", bare_root[i], "delete", "--force", cid, NULL};
        bench_run_quiet(del);
        char *rm[] = {"rm", "-rf", bare[i], NULL};
        bench_run_quiet(rm);
        char path[160];
        sp_httpc_resp_t r;
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", ids[i]);
        if (bench_http(c, "DELETE", path, NULL, NULL, &r) == 0)
            sp_httpc_resp_free(&r);
    }
    if (found != n) {
        fprintf(stderr, "space-bench: the processes of %zu of %zu pairs were not found\n",
                n - found, n);
        return 1;
    }

    printf("\n  %-48s %9s %9s %9s\n", "PSS per sandbox, MiB", "p50", "p90", "p99");
    double ours_p50 = bench_pct(ours[N_PARTS], n, 50), base_p50 = bench_pct(base[N_PARTS], n, 50);
    bench_row("space sandbox (tiny, idle), all parts", ours[N_PARTS], n);
    bench_row("bare runsc container (baseline)", base[N_PARTS], n);
    double op[N_PARTS], bp[N_PARTS];
    printf("\n  %-48s %9s %9s\n", "p50 by part, MiB", "space", "bare");
    for (int k = 0; k < N_PARTS; k++) {
        op[k] = bench_pct(ours[k], n, 50);
        bp[k] = bench_pct(base[k], n, 50);
        printf("  %-48s %9.2f %9.2f\n", part_name[k], op[k], bp[k]);
    }
    printf("\n  p50 ratio to a bare runsc container: x%.2f\n", ours_p50 / base_p50);
    printf("\nJSON {\"bench\":\"density\",\"n\":%zu,\"pss_mib_p50\":%.2f,\"pss_mib_p90\":%.2f,"
           "\"bare_pss_mib_p50\":%.2f,\"bare_pss_mib_p90\":%.2f,\"ratio_p50\":%.3f,"
           "\"parts_mib_p50\":{\"sentry\":[%.2f,%.2f],\"stubs\":[%.2f,%.2f],"
           "\"gofer\":[%.2f,%.2f],\"reaper\":[%.2f,%.2f]}}\n",
           n, ours_p50, bench_pct(ours[N_PARTS], n, 90), base_p50, bench_pct(base[N_PARTS], n, 90),
           ours_p50 / base_p50, op[0], bp[0], op[1], bp[1], op[2], bp[2], op[3], bp[3]);
    for (int k = 0; k <= N_PARTS; k++) {
        free(ours[k]);
        free(base[k]);
    }
    for (size_t i = 0; i < n; i++) {
        free(bare[i]);
        free(bare_root[i]);
    }
    free(bare);
    free(bare_root);
    free(ids);
    free(rootfs);
    return 0;
}
