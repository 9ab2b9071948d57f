/* space-bench lifecycle: pause, resume, suspend and resume from suspend of one sandbox
 * through the HTTP API (each answered once the projection shows the outcome), round after
 * round, with the snapshot sizes; and beside them, in the same run, the raw runsc pause /
 * resume / checkpoint / restore of a bare container over the same template rootfs (no
 * network, no agent, no disk delta, no store, no events): what the platform adds.
 *
 * With the NATS object store as the snapshot store (SPACE_SNAPSHOT_STORE=nats, bench/run.sh
 * lifecycle-nats), each round also suspends once more and empties the worker's cache before
 * the resume: the artifacts come from the bucket, as on a worker on another host. */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "error.h"
#include "ids.h"
#include "xmalloc.h"

static double api_op(bench_ctx_t *c, const char *id, const char *op, const char *want)
{
    char path[160];
    sp_httpc_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/%s", id, op);
    int64_t t0 = sp_mono_ns();
    int rc = bench_http(c, "POST", path, NULL, NULL, &r);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    char needle[64];
    snprintf(needle, sizeof(needle), "\"state\":\"%s\"", want);
    if (rc < 0 || r.status != 200 || !strstr(r.body, needle)) {
        fprintf(stderr, "space-bench: %s failed: %s %d %s\n", op, sp_strerror(rc), r.status,
                r.body ? r.body : "");
        exit(1);
    }
    sp_httpc_resp_free(&r);
    return ms;
}

/* Bytes of the sandbox's snapshot artifacts in the store, by name. */
static void snapshot_sizes(bench_ctx_t *c, const char *id, double *image, double *rootfs)
{
    char *dir = sp_xasprintf("%s/snapshots/%s", c->home, id);
    DIR *d = opendir(dir);
    struct dirent *de;
    *image = *rootfs = 0;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        struct stat st;
        char *p = sp_xasprintf("%s/%s/checkpoint.img.zst", dir, de->d_name);
        if (stat(p, &st) == 0)
            *image = (double)st.st_size;
        free(p);
        p = sp_xasprintf("%s/%s/rootfs.btrfs.zst", dir, de->d_name);
        if (stat(p, &st) == 0)
            *rootfs = (double)st.st_size;
        free(p);
    }
    if (d)
        closedir(d);
    free(dir);
}

static double timed(char *const argv[], const char *what)
{
    int64_t t0 = sp_mono_ns();
    int rc = bench_run_quiet(argv);
    if (rc != 0) {
        fprintf(stderr, "space-bench: %s failed (%d)\n", what, rc);
        exit(1);
    }
    return (double)(sp_mono_ns() - t0) / 1e6;
}

int bench_lifecycle(bench_ctx_t *c)
{
    size_t n = c->rounds;
    double *v[11];
    const char *store = getenv("SPACE_SNAPSHOT_STORE");
    bool remote = store && strcmp(store, "nats") == 0;
    for (int i = 0; i < 11; i++)
        v[i] = sp_xcalloc(n, sizeof(double));
    char id[80];
    if (bench_create_sandbox(c, id) < 0) {
        fprintf(stderr, "space-bench: create failed\n");
        return 1;
    }
    /* Something alive inside, as in real use: a process that writes now and then. */
    char path[200];
    sp_httpc_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    if (bench_http(c, "POST", path, NULL,
                   "{\"cmd\":\"while true; do date > /tmp/now; sleep 1; done\","
                   "\"background\":true}",
                   &r) == 0)
        sp_httpc_resp_free(&r);

    char *rootfs = sp_xasprintf("%s/worker/volumes/templates/tiny", c->home);
    char *bundle =
        bench_make_bundle(rootfs, "[\"/bin/sh\",\"-c\",\"while true; do sleep 1; done\"]");
    char *root = sp_xasprintf("%s/runsc", bundle);
    char *img = sp_xasprintf("%s/img", bundle);

    printf("lifecycle: %zu rounds of pause, resume, suspend, resume through HTTP; beside each, "
           "raw runsc pause/resume/checkpoint/restore of a bare container\n",
           n);
    for (size_t i = 0; i < n; i++) {
        v[0][i] = api_op(c, id, "pause", "paused");
        v[1][i] = api_op(c, id, "resume", "running");
        v[2][i] = api_op(c, id, "suspend", "suspended");
        snapshot_sizes(c, id, &v[8][i], &v[9][i]);
        v[3][i] = api_op(c, id, "resume", "running");
        if (remote) {
            (void)api_op(c, id, "suspend", "suspended");
            char *cache = sp_xasprintf("%s/snapshots/%s", c->home, id);
            char *evict[] = {"rm", "-rf", cache, NULL};
            bench_run_quiet(evict);
            free(cache);
            v[10][i] = api_op(c, id, "resume", "running");
        }

        char cid[64];
        snprintf(cid, sizeof(cid), "bench-lc-%06zu", i);
        /* A root per round: a restored sandbox's control socket outlives `delete` briefly
         * and the next `run` in the same root would collide with it. */
        free(root);
        root = sp_xasprintf("%s/runsc-%06zu", bundle, i);
        char *run[] = {"runsc", "--root", root, "--network=none", "run", "--detach", "--bundle",
                       bundle,  cid,      NULL};
        char *pause[] = {"runsc", "--root", root, "pause", cid, NULL};
        char *resume[] = {"runsc", "--root", root, "resume", cid, NULL};
        char *ipath = sp_xasprintf("--image-path=%s", img);
        char *ckpt[] = {"runsc", "--root", root, "checkpoint", ipath, cid, NULL};
        char *del[] = {"runsc", "--root", root, "delete", "--force", cid, NULL};
        char *restore[] = {"runsc",   "--root",   root,  "--network=none",
                           "restore", "--detach", ipath, "--bundle",
                           bundle,    cid,        NULL};
        timed(run, "runsc run");
        v[4][i] = timed(pause, "runsc pause");
        v[5][i] = timed(resume, "runsc resume");
        v[6][i] = timed(ckpt, "runsc checkpoint");
        bench_run_quiet(del);
        v[7][i] = timed(restore, "runsc restore");
        bench_run_quiet(del);
        char *rm[] = {"rm", "-rf", img, NULL}; /* checkpoint writes into an empty directory */
        bench_run_quiet(rm);
        free(ipath);
    }
    printf("\n  %-48s %9s %9s %9s\n", "", "p50 ms", "p90 ms", "p99 ms");
    bench_row("pause (HTTP, until paused in the log)", v[0], n);
    bench_row("resume from paused (HTTP)", v[1], n);
    bench_row("suspend (HTTP: checkpoint + disk delta + store)", v[2], n);
    bench_row(remote ? "resume from suspended, cached (HTTP)"
                     : "resume from suspended, same host (HTTP)",
              v[3], n);
    if (remote)
        bench_row("resume from suspended, fetched from the bucket (HTTP)", v[10], n);
    bench_row("runsc pause (baseline)", v[4], n);
    bench_row("runsc resume (baseline)", v[5], n);
    bench_row("runsc checkpoint (baseline)", v[6], n);
    bench_row("runsc restore --detach (baseline)", v[7], n);
    double img50 = bench_pct(v[8], n, 50), root50 = bench_pct(v[9], n, 50);
    printf("\n  snapshot p50: checkpoint.img.zst %.0f KiB, rootfs.btrfs.zst %.0f KiB\n",
           img50 / 1024, root50 / 1024);
    printf("\nJSON "
           "{\"bench\":\"lifecycle\",\"store\":\"%s\",\"n\":%zu,\"pause_ms_p50\":%.1f,\"resume_ms_"
           "p50\":%.1f,"
           "\"suspend_ms_p50\":%.1f,\"suspend_ms_p90\":%.1f,\"resume_suspended_ms_p50\":%.1f,"
           "\"resume_suspended_ms_p90\":%.1f,\"runsc_checkpoint_ms_p50\":%.1f,"
           "\"runsc_restore_ms_p50\":%.1f,\"image_kib_p50\":%.0f,\"rootfs_kib_p50\":%.0f,"
           "\"resume_fetched_ms_p50\":%.1f,\"resume_fetched_ms_p90\":%.1f}\n",
           remote ? "nats" : "dir", n, bench_pct(v[0], n, 50), bench_pct(v[1], n, 50),
           bench_pct(v[2], n, 50), bench_pct(v[2], n, 90), bench_pct(v[3], n, 50),
           bench_pct(v[3], n, 90), bench_pct(v[6], n, 50), bench_pct(v[7], n, 50), img50 / 1024,
           root50 / 1024, remote ? bench_pct(v[10], n, 50) : 0.0,
           remote ? bench_pct(v[10], n, 90) : 0.0);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    if (bench_http(c, "DELETE", path, NULL, NULL, &r) == 0)
        sp_httpc_resp_free(&r);
    char *rm[] = {"rm", "-rf", bundle, NULL};
    bench_run_quiet(rm);
    for (int i = 0; i < 11; i++)
        free(v[i]);
    free(img);
    free(root);
    free(bundle);
    free(rootfs);
    return 0;
}
