/* space-bench fork: POST /v1/sandboxes/{id}/fork {"count": N} for N = 1, 4, 8 (answered once
 * every copy runs: one checkpoint and its in-place restore, then N restores under new ids),
 * round after round, the copies deleted after each; and beside them, in the same run, one raw
 * `runsc restore --detach` of a bare container over the same template rootfs (no network, no
 * agent, no disk, no store, no events): the floor a fork's restores stand on
 * (docs/snapshots.md). --rounds sets the rounds (each makes 13 copies). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "error.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"

#define FORK_SIZES 3
static const unsigned SIZES[FORK_SIZES] = {1, 4, 8};

static double timed_run(char *const argv[], const char *what)
{
    int64_t t0 = sp_mono_ns();
    int rc = bench_run_quiet(argv);
    if (rc != 0) {
        fprintf(stderr, "space-bench: %s failed (%d)\n", what, rc);
        exit(1);
    }
    return (double)(sp_mono_ns() - t0) / 1e6;
}

/* One fork of id into n copies: its latency, the snapshot's part in *snap_ms; the copies are
 * deleted afterwards (not timed). */
static double fork_once(bench_ctx_t *c, const char *id, unsigned n, double *snap_ms)
{
    char path[160], body[32];
    sp_httpc_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/fork", id);
    snprintf(body, sizeof(body), "{\"count\":%u}", n);
    int64_t t0 = sp_mono_ns();
    int rc = bench_http(c, "POST", path, NULL, body, &r);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    if (rc < 0 || r.status != 201) {
        fprintf(stderr, "space-bench: fork of %u failed: %s %d %s\n", n, sp_strerror(rc), r.status,
                r.body ? r.body : "");
        exit(1);
    }
    sp_json_doc_t *doc = NULL;
    char jerr[SP_JSON_ERR_MAX];
    sp_json_limits_t lim = {
        .max_bytes = strlen(r.body) + 1, .max_depth = 8, .max_nodes = 65536, .max_string = 65536};
    if (sp_json_parse(r.body, strlen(r.body), &lim, &doc, jerr) < 0) {
        fprintf(stderr, "space-bench: fork answer: %s\n", jerr);
        exit(1);
    }
    int64_t sm = 0;
    (void)sp_json_int(sp_json_get(sp_json_root(doc), "snapshot_ms"), 0, INT64_MAX, &sm);
    *snap_ms = (double)sm;
    const sp_json_t *ids = sp_json_get(sp_json_root(doc), "sandbox_ids");
    for (size_t i = 0; i < sp_json_len(ids); i++) {
        sp_httpc_resp_t d;
        char dpath[160];
        snprintf(dpath, sizeof(dpath), "/v1/sandboxes/%s", sp_json_str(sp_json_at(ids, i), NULL));
        if (bench_http(c, "DELETE", dpath, NULL, NULL, &d) == 0)
            sp_httpc_resp_free(&d);
    }
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    return ms;
}

int bench_fork(bench_ctx_t *c)
{
    size_t n = c->rounds;
    double *v[FORK_SIZES], *snap[FORK_SIZES], *raw = sp_xcalloc(n, sizeof(double));
    for (int k = 0; k < FORK_SIZES; k++) {
        v[k] = sp_xcalloc(n, sizeof(double));
        snap[k] = sp_xcalloc(n, sizeof(double));
    }
    char id[80];
    if (bench_create_sandbox(c, id) < 0) {
        fprintf(stderr, "space-bench: create failed\n");
        return 1;
    }
    /* The sandbox of the brief: a counter loop in memory. */
    char path[200];
    sp_httpc_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    if (bench_http(c, "POST", path, NULL,
                   "{\"cmd\":\"n=0; while :; do n=$((n+1)); echo $n > /tmp/c; sleep 0.2; done\","
                   "\"background\":true}",
                   &r) == 0)
        sp_httpc_resp_free(&r);

    char *rootfs = sp_xasprintf("%s/worker/volumes/templates/tiny", c->home);
    char *bundle =
        bench_make_bundle(rootfs, "[\"/bin/sh\",\"-c\",\"while true; do sleep 1; done\"]");
    char *img = sp_xasprintf("%s/img", bundle);
    printf("fork: %zu rounds of fork into 1, 4 and 8 copies through HTTP (until every copy "
           "runs); beside each, one raw runsc restore of a bare container\n",
           n);
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < FORK_SIZES; k++)
            v[k][i] = fork_once(c, id, SIZES[k], &snap[k][i]);
        char cid[64];
        snprintf(cid, sizeof(cid), "bench-fork-%06zu", i);
        char *root = sp_xasprintf("%s/runsc-%06zu", bundle, i);
        char *ipath = sp_xasprintf("--image-path=%s", img);
        char *run[] = {"runsc", "--root", root, "--network=none", "run", "--detach", "--bundle",
                       bundle,  cid,      NULL};
        char *ckpt[] = {"runsc", "--root", root, "checkpoint", ipath, cid, NULL};
        char *del[] = {"runsc", "--root", root, "delete", "--force", cid, NULL};
        char *restore[] = {"runsc",   "--root",   root,  "--network=none",
                           "restore", "--detach", ipath, "--bundle",
                           bundle,    cid,        NULL};
        timed_run(run, "runsc run");
        timed_run(ckpt, "runsc checkpoint");
        bench_run_quiet(del);
        raw[i] = timed_run(restore, "runsc restore");
        bench_run_quiet(del);
        char *rm[] = {"rm", "-rf", img, NULL};
        bench_run_quiet(rm);
        free(ipath);
        free(root);
    }
    printf("\n  %-48s %9s %9s %9s\n", "", "p50 ms", "p90 ms", "p99 ms");
    char name[96];
    for (int k = 0; k < FORK_SIZES; k++) {
        snprintf(name, sizeof(name), "fork into %u (HTTP, until all run)", SIZES[k]);
        bench_row(name, v[k], n);
        snprintf(name, sizeof(name), "  of which the checkpoint + in-place restore");
        bench_row(name, snap[k], n);
    }
    bench_row("runsc restore --detach (baseline)", raw, n);
    double base = bench_pct(raw, n, 50);
    printf("\n  p50 ratio to one raw restore: fork 1 %.1fx, fork 4 %.1fx, fork 8 %.1fx\n",
           bench_pct(v[0], n, 50) / base, bench_pct(v[1], n, 50) / base,
           bench_pct(v[2], n, 50) / base);
    printf("\nJSON {\"bench\":\"fork\",\"n\":%zu,\"fork1_ms_p50\":%.1f,\"fork1_ms_p90\":%.1f,"
           "\"fork4_ms_p50\":%.1f,\"fork4_ms_p90\":%.1f,\"fork8_ms_p50\":%.1f,"
           "\"fork8_ms_p90\":%.1f,\"snapshot_ms_p50\":%.1f,\"runsc_restore_ms_p50\":%.1f,"
           "\"runsc_restore_ms_p90\":%.1f}\n",
           n, bench_pct(v[0], n, 50), bench_pct(v[0], n, 90), bench_pct(v[1], n, 50),
           bench_pct(v[1], n, 90), bench_pct(v[2], n, 50), bench_pct(v[2], n, 90),
           bench_pct(snap[0], n, 50), base, bench_pct(raw, n, 90));
    for (int k = 0; k < FORK_SIZES; k++) {
        free(v[k]);
        free(snap[k]);
    }
    free(raw);
    free(img);
    free(bundle);
    free(rootfs);
    return 0;
}
