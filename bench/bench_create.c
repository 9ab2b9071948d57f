/* space-bench create: sandbox create latency through the HTTP API (POST /v1/sandboxes until
 * the 201, i.e. the sandbox is running on a worker and the log says so), next to the floor
 * without our platform measured in the same run: `runsc run` of the same template directly
 * (create + start + run /bin/true + exit, network none). Creates and baseline runs alternate
 * so both see the same machine. Each sandbox is deleted after its measurement (not timed). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "buf.h"
#include "error.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"

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

/* One create through the API in ms; deletes the sandbox afterwards. */
static double api_create(bench_ctx_t *c)
{
    sp_httpc_resp_t r;
    const char *body = "{\"template\":\"tiny\",\"metadata\":{\"bench\":\"create\"}}";
    int64_t t0 = sp_mono_ns();
    int rc = bench_http(c, "POST", "/v1/sandboxes", NULL, body, &r);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    if (rc < 0 || r.status != 201) {
        fprintf(stderr, "space-bench: create failed: %s %d %s\n", sp_strerror(rc), r.status,
                r.body ? r.body : "");
        exit(1);
    }
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    const char *id = NULL;
    if (sp_json_parse(r.body, r.body_len, NULL, &doc, err) == 0)
        id = sp_json_str(sp_json_get(sp_json_root(doc), "id"), NULL);
    if (id) {
        char path[160];
        sp_httpc_resp_t d;
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        if (bench_http(c, "DELETE", path, NULL, NULL, &d) == 0)
            sp_httpc_resp_free(&d);
    }
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    return ms;
}

int bench_create(bench_ctx_t *c)
{
    size_t n = c->creates;
    double *api = sp_xcalloc(n, sizeof(double)), *base = sp_xcalloc(n, sizeof(double));
    char *rootfs = sp_xasprintf("%s/worker/volumes/templates/tiny", c->home);
    char *bundle = bench_make_bundle(rootfs, "[\"/bin/true\"]");
    char *root = sp_xasprintf("%s/runsc", bundle);

    printf("create latency: %zu creates through HTTP (tiny template), alternating with %zu "
           "`runsc run` of the same rootfs\n",
           n, n);
    api_create(c); /* warm-up: first connections, caches */
    runsc_run(root, bundle, 999999);
    for (size_t i = 0; i < n; i++) {
        api[i] = api_create(c);
        base[i] = runsc_run(root, bundle, (unsigned)i);
    }
    double a50 = bench_pct(api, n, 50), a90 = bench_pct(api, n, 90), a99 = bench_pct(api, n, 99);
    double b50 = bench_pct(base, n, 50), b90 = bench_pct(base, n, 90), b99 = bench_pct(base, n, 99);
    printf("\n  %-44s %9s %9s %9s\n", "", "p50 ms", "p90 ms", "p99 ms");
    printf("  %-44s %9.1f %9.1f %9.1f\n", "POST /v1/sandboxes -> 201 (running)", a50, a90, a99);
    printf("  %-44s %9.1f %9.1f %9.1f\n", "runsc run /bin/true (baseline, no platform)", b50, b90,
           b99);
    printf("  %-44s %9.2f %9.2f %9.2f\n", "ratio API / baseline", a50 / b50, a90 / b90, a99 / b99);
    printf("\nJSON {\"bench\":\"create\",\"n\":%zu,\"api_ms_p50\":%.1f,\"api_ms_p90\":%.1f,"
           "\"api_ms_p99\":%.1f,\"runsc_run_ms_p50\":%.1f,\"runsc_run_ms_p90\":%.1f,"
           "\"runsc_run_ms_p99\":%.1f,\"ratio_p50\":%.2f}\n",
           n, a50, a90, a99, b50, b90, b99, a50 / b50);
    char *cfg = sp_xasprintf("%s/config.json", bundle);
    unlink(cfg);
    free(cfg);
    char *rm[] = {"rm", "-rf", bundle, NULL};
    bench_run_quiet(rm);
    free(root);
    free(bundle);
    free(rootfs);
    free(api);
    free(base);
    return 0;
}
