/* space-bench signed: what an E2B signed URL costs (docs/e2b-signed-urls.md). --execs GETs of
 * a 1 KiB file through the envd route /files, three ways taking turns request by request:
 * - header: X-Access-Token and E2b-Sandbox-Id, what the SDK's own fetch sends (the baseline);
 * - signed: the SDK's downloadUrl() with no header at all, as a browser or curl opens it: the
 *   gateway finds the sandbox by the signature (one SHA-256 per indexed token);
 * - signed, expiring: the same with signature_expiration (useSignatureExpiration).
 * Then p50/p90/p99 of each and their ratios to the baseline. The index holds the tokens this
 * gateway handed out; the bench's sandbox is the only one, so this is the lookup's floor; its
 * worst case is --signed-url-index (1,024) SHA-256s, ~0.3 us each on these machines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

#include "bench.h"
#include "error.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"

#define FILE_PATH "/root/signed-bench"
#define KINDS     3

/* "v1_" + base64(sha256(raw)) without '=' (the SDK's getSignature). */
static void signature(const char *raw, char out[64])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    unsigned char b64[48];
    EVP_Digest(raw, strlen(raw), md, &mdlen, EVP_sha256(), NULL);
    int n = EVP_EncodeBlock(b64, md, (int)mdlen);
    while (n > 0 && b64[n - 1] == '=')
        n--;
    snprintf(out, 64, "v1_%.*s", n, (const char *)b64);
}

/* The same '/' -> %2F, '+' -> %2B and '=' -> %3D escaping a URL query needs for these. */
static void query_escape(const char *in, char *out, size_t len)
{
    size_t o = 0;
    for (; *in && o + 4 < len; in++) {
        if (*in == '/' || *in == '+' || *in == '=')
            o += (size_t)snprintf(out + o, len - o, "%%%02X", (unsigned char)*in);
        else
            out[o++] = *in;
    }
    out[o] = '\0';
}

static double timed_get(bench_ctx_t *c, const char *path, const char *headers)
{
    sp_httpc_req_t req = {.host = c->api_host,
                          .port = c->api_port,
                          .method = "GET",
                          .path = path,
                          .extra_headers = headers,
                          .timeout_ms = c->timeout_ms};
    sp_httpc_resp_t r;
    int64_t t0 = sp_mono_ns();
    int rc = sp_httpc_do(&req, &r);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    if (rc < 0 || r.status != 200 || r.body_len != 1024) {
        fprintf(stderr, "space-bench: GET %.120s: %s %d %.200s\n", path, sp_strerror(rc),
                rc < 0 ? 0 : r.status, rc < 0 || !r.body ? "" : r.body);
        exit(1);
    }
    sp_httpc_resp_free(&r);
    return ms;
}

int bench_signed(bench_ctx_t *c)
{
    /* E2B's create: its answer carries the envdAccessToken the signatures are made with. */
    char hdr[512], id[80] = "", token[512] = "";
    snprintf(hdr, sizeof(hdr), "X-API-KEY: %s\r\n", c->api_key ? c->api_key : "");
    sp_httpc_req_t req = {.host = c->api_host,
                          .port = c->api_port,
                          .method = "POST",
                          .path = "/sandboxes",
                          .extra_headers = hdr,
                          .body = "{\"templateID\":\"tiny\"}",
                          .body_len = strlen("{\"templateID\":\"tiny\"}"),
                          .timeout_ms = c->timeout_ms};
    sp_httpc_resp_t r;
    if (sp_httpc_do(&req, &r) < 0 || r.status != 201) {
        fprintf(stderr, "space-bench: E2B create failed: %d %s\n", r.status, r.body ? r.body : "");
        return 1;
    }
    sp_json_doc_t *doc = NULL;
    char jerr[SP_JSON_ERR_MAX];
    if (sp_json_parse(r.body, r.body_len, NULL, &doc, jerr) == 0) {
        snprintf(id, sizeof(id), "%s",
                 sp_json_str(sp_json_get(sp_json_root(doc), "sandboxID"), NULL));
        snprintf(token, sizeof(token), "%s",
                 sp_json_str(sp_json_get(sp_json_root(doc), "envdAccessToken"), NULL));
    }
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    if (!id[0] || !token[0]) {
        fprintf(stderr, "space-bench: the create answer has no sandboxID or envdAccessToken\n");
        return 1;
    }
    /* The file, through our API. */
    static char kib[1024];
    memset(kib, 'x', sizeof(kib));
    char path[512];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=" FILE_PATH, id);
    sp_httpc_req_t put = {.host = c->api_host,
                          .port = c->api_port,
                          .method = "PUT",
                          .path = path,
                          .key = c->api_key,
                          .body = kib,
                          .body_len = sizeof(kib),
                          .content_type = "application/octet-stream",
                          .timeout_ms = c->timeout_ms};
    if (sp_httpc_do(&put, &r) < 0 || (r.status != 200 && r.status != 201)) {
        fprintf(stderr, "space-bench: PUT the file: %d %s\n", r.status, r.body ? r.body : "");
        return 1;
    }
    sp_httpc_resp_free(&r);

    char raw[1024], sig[64], esig[128], header_path[256], signed_path[512], exp_path[512];
    char headers[1024];
    snprintf(raw, sizeof(raw), FILE_PATH ":read:root:%s", token);
    signature(raw, sig);
    query_escape(sig, esig, sizeof(esig));
    snprintf(header_path, sizeof(header_path),
             "/files?path=%%2Froot%%2Fsigned-bench&username=root");
    snprintf(signed_path, sizeof(signed_path), "%s&signature=%s", header_path, esig);
    long long exp = (long long)time(NULL) + 3600;
    snprintf(raw, sizeof(raw), FILE_PATH ":read:root:%s:%lld", token, exp);
    signature(raw, sig);
    query_escape(sig, esig, sizeof(esig));
    snprintf(exp_path, sizeof(exp_path), "%s&signature=%s&signature_expiration=%lld", header_path,
             esig, exp);
    snprintf(headers, sizeof(headers), "X-Access-Token: %s\r\nE2b-Sandbox-Id: %s\r\n", token, id);

    size_t n = c->execs;
    double *v[KINDS];
    for (int k = 0; k < KINDS; k++)
        v[k] = sp_xcalloc(n, sizeof(double));
    /* Warm: the first signed request may fill the index from PostgreSQL. */
    (void)timed_get(c, header_path, headers);
    (void)timed_get(c, signed_path, NULL);
    printf("signed: %zu x GET of a 1 KiB file through /files, three ways taking turns\n", n);
    for (size_t i = 0; i < n; i++) {
        for (int j = 0; j < KINDS; j++) {
            int k = (int)((i + (size_t)j) % KINDS); /* the order rotates */
            v[k][i] = k == 0   ? timed_get(c, header_path, headers)
                      : k == 1 ? timed_get(c, signed_path, NULL)
                               : timed_get(c, exp_path, NULL);
        }
    }
    printf("\n  %-48s %9s %9s %9s\n", "", "p50 ms", "p90 ms", "p99 ms");
    bench_row("X-Access-Token + E2b-Sandbox-Id (baseline)", v[0], n);
    bench_row("signed URL, no header", v[1], n);
    bench_row("signed URL with expiration, no header", v[2], n);
    double b50 = bench_pct(v[0], n, 50), b99 = bench_pct(v[0], n, 99);
    printf("\n  ratio to the baseline: signed p50 x%.2f p99 x%.2f; expiring p50 x%.2f p99 x%.2f\n",
           bench_pct(v[1], n, 50) / b50, bench_pct(v[1], n, 99) / b99, bench_pct(v[2], n, 50) / b50,
           bench_pct(v[2], n, 99) / b99);
    printf("\nJSON {\"bench\":\"signed\",\"n\":%zu,\"header_ms_p50\":%.3f,\"header_ms_p99\":%.3f,"
           "\"signed_ms_p50\":%.3f,\"signed_ms_p99\":%.3f,\"expiring_ms_p50\":%.3f,"
           "\"expiring_ms_p99\":%.3f}\n",
           n, b50, b99, bench_pct(v[1], n, 50), bench_pct(v[1], n, 99), bench_pct(v[2], n, 50),
           bench_pct(v[2], n, 99));
    for (int k = 0; k < KINDS; k++)
        free(v[k]);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    if (bench_http(c, "DELETE", path, NULL, NULL, &r) == 0)
        sp_httpc_resp_free(&r);
    return 0;
}
