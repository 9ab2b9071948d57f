/* The files API in real sandboxes, through HTTP only: gateway, worker data plane, agent
 * channel and space-agent together. Stack: eventlog + scheduler + worker + gateway.
 *
 * The 200 MB case streams a seeded PRNG up and hashes the download as it arrives: the test
 * never holds the file; it samples the gateway's and the worker's memory meanwhile. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "apikey.h"
#include "buf.h"
#include "envelope.h"
#include "harness.h"
#include "hash.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"

#define BIG_BYTES    200000000ULL
#define RSS_LIMIT_KB (32 * 1024)

static int port;
static const char *key;
static char sbx[2][64];

static sp_json_doc_t *body_json(const sp_httpc_resp_t *r)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    sp_json_limits_t lim = {.max_bytes = 16u << 20};
    if (sp_json_parse(r->body, r->body_len, &lim, &doc, err) < 0)
        fail_msg("not JSON (%s): %.300s", err, r->body);
    return doc;
}

static void create(char out[64])
{
    sp_test_create_sandbox(port, key, "tiny", out);
}

/* One request to /v1/sandboxes/<id><rest> with an optional raw body. */
static sp_httpc_resp_t req(const char *method, const char *id, const char *rest, const char *ctype,
                           const void *body, size_t len, const char *k)
{
    char path[8192];
    sp_httpc_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s%s", id, rest);
    sp_httpc_req_t q = {.host = "127.0.0.1",
                        .port = port,
                        .method = method,
                        .path = path,
                        .key = k ? k : key,
                        .body = body,
                        .body_len = len,
                        .content_type = ctype,
                        .timeout_ms = 60000};
    int rc = sp_httpc_do(&q, &r);
    if (rc < 0)
        fail_msg("%s %s: %d", method, path, rc);
    return r;
}

static int status_of(const char *method, const char *id, const char *rest, const char *ctype,
                     const char *body, char *code, size_t code_len)
{
    sp_httpc_resp_t r = req(method, id, rest, ctype, body, body ? strlen(body) : 0, NULL);
    int st = r.status;
    if (code) {
        code[0] = '\0';
        if (st >= 400) {
            sp_json_doc_t *doc = body_json(&r);
            const char *c = sp_json_str(sp_json_get(sp_json_root(doc), "code"), NULL);
            snprintf(code, code_len, "%s", c ? c : "");
            sp_json_doc_free(doc);
        }
    }
    sp_httpc_resp_free(&r);
    return st;
}

/* Runs cmd in sandbox id and returns its stdout (heap). */
static char *run(const char *id, const char *cmd)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"cmd\":");
    sp_buf_json_str(&b, cmd);
    sp_buf_putc(&b, '}');
    char path[128];
    sp_httpc_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    sp_test_http(port, "POST", path, key, "Accept: application/json\r\n", b.data, b.len, &r);
    sp_buf_dispose(&b);
    assert_int_equal(r.status, 200);
    sp_json_doc_t *doc = body_json(&r);
    const char *s = sp_json_str(sp_json_get(sp_json_root(doc), "stdout"), NULL);
    char *out = sp_xstrdup(s ? s : "");
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    return out;
}

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    create(sbx[0]);
    create(sbx[1]);
    return 0;
}

/* ---- small files ---- */

static void test_small_round_trip(void **state)
{
    (void)state;
    const char text[] = "hello, files\n";
    sp_httpc_resp_t r = req("PUT", sbx[0], "/files?path=notes/hello.txt&user=user&mode=0600",
                            "application/octet-stream", text, strlen(text), NULL);
    assert_int_equal(r.status, 200);
    sp_json_doc_t *doc = body_json(&r);
    const sp_json_t *root = sp_json_root(doc);
    uint8_t d[SP_SHA256_LEN];
    char hex[SP_SHA256_HEX_LEN + 1];
    sp_sha256(text, strlen(text), d);
    sp_hex_encode(d, sizeof(d), hex);
    assert_string_equal(sp_json_str(sp_json_get(root, "path"), NULL), "/home/user/notes/hello.txt");
    assert_string_equal(sp_json_str(sp_json_get(root, "sha256"), NULL), hex);
    int64_t size = 0;
    sp_json_int(sp_json_get(root, "size"), 0, 1 << 30, &size);
    assert_int_equal(size, strlen(text));
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);

    r = req("GET", sbx[0], "/files?path=/home/user/notes/hello.txt", NULL, NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, strlen(text));
    assert_memory_equal(r.body, text, strlen(text));
    sp_httpc_resp_free(&r);

    /* Owner, mode, directories created with the same owner: as the guest sees them. */
    char *out = run(sbx[0], "stat -c '%u %a' /home/user/notes/hello.txt /home/user/notes");
    assert_string_equal(out, "1000 600\n1000 755\n");
    free(out);

    /* Binary: every byte value, NULs included. */
    uint8_t bin[4096];
    for (size_t i = 0; i < sizeof(bin); i++)
        bin[i] = (uint8_t)(i * 7 + (i >> 8));
    r = req("PUT", sbx[0], "/files?path=/root/bin.dat", "application/octet-stream", bin,
            sizeof(bin), NULL);
    assert_int_equal(r.status, 200);
    sp_httpc_resp_free(&r);
    r = req("GET", sbx[0], "/files?path=bin.dat", NULL, NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, sizeof(bin));
    assert_memory_equal(r.body, bin, sizeof(bin));
    sp_httpc_resp_free(&r);

    /* Empty file, then overwrite. */
    r = req("PUT", sbx[0], "/files?path=/root/empty", "application/octet-stream", "", 0, NULL);
    assert_int_equal(r.status, 200);
    sp_httpc_resp_free(&r);
    r = req("GET", sbx[0], "/files?path=/root/empty", NULL, NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 0);
    sp_httpc_resp_free(&r);
    r = req("PUT", sbx[0], "/files?path=/root/empty", "application/octet-stream", "now", 3, NULL);
    sp_httpc_resp_free(&r);
    out = run(sbx[0], "cat /root/empty; ls -a /root | grep -c space-upload || true");
    assert_string_equal(out, "now0\n"); /* no temporary file left behind */
    free(out);

    /* Multipart: two file parts into a directory. */
    const char mp[] = "--XyZ\r\n"
                      "Content-Disposition: form-data; name=\"a\"; filename=\"one.txt\"\r\n"
                      "Content-Type: text/plain\r\n\r\n"
                      "first\r\n--XyZ\r\n"
                      "Content-Disposition: form-data; name=\"b\"; filename=\"two.txt\"\r\n\r\n"
                      "second\r\n\r\n--XyZ--\r\n";
    r = req("PUT", sbx[0], "/files?path=/root/up", "multipart/form-data; boundary=XyZ", mp,
            strlen(mp), NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "/root/up/two.txt"));
    sp_httpc_resp_free(&r);
    r = req("GET", sbx[0], "/files?path=/root/up/two.txt", NULL, NULL, 0, NULL);
    assert_int_equal(r.body_len, 8);
    assert_memory_equal(r.body, "second\r\n", 8); /* the part's own CRLF is content */
    sp_httpc_resp_free(&r);
    out = run(sbx[0], "cat /root/up/one.txt");
    assert_string_equal(out, "first");
    free(out);
    char code[64];
    const char *bad = "--XyZ\r\nContent-Disposition: form-data; name=\"a\"; "
                      "filename=\"../x\"\r\n\r\nx\r\n--XyZ--\r\n";
    assert_int_equal(status_of("PUT", sbx[0], "/files?path=/root/up",
                               "multipart/form-data; boundary=XyZ", bad, code, sizeof(code)),
                     400);
    assert_string_equal(code, "invalid_multipart");
}

/* ---- semantics and errors ---- */

static void test_operations(void **state)
{
    (void)state;
    char code[64];
    const char *json = "application/json";
    assert_int_equal(status_of("POST", sbx[0], "/files/mkdir", json, "{\"path\":\"/root/d/e/f\"}",
                               code, sizeof(code)),
                     201);
    assert_int_equal(status_of("POST", sbx[0], "/files/mkdir", json, "{\"path\":\"/root/d/e/f\"}",
                               code, sizeof(code)),
                     200); /* already there */
    sp_httpc_resp_t r =
        req("PUT", sbx[0], "/files?path=/root/d/e/f/x.txt", "text/plain", "x", 1, NULL);
    sp_httpc_resp_free(&r);
    assert_int_equal(status_of("POST", sbx[0], "/files/mkdir", json,
                               "{\"path\":\"/root/d/e/f/x.txt\"}", code, sizeof(code)),
                     409);
    assert_string_equal(code, "exists");

    /* stat and list. */
    r = req("GET", sbx[0], "/files/stat?path=/root/d/e", NULL, NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"type\":\"dir\""));
    sp_httpc_resp_free(&r);
    r = req("GET", sbx[0], "/files/list?path=/root/d&depth=3", NULL, NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    sp_json_doc_t *doc = body_json(&r);
    const sp_json_t *entries = sp_json_get(sp_json_root(doc), "entries");
    assert_int_equal(sp_json_len(entries), 3); /* e, e/f, e/f/x.txt */
    bool truncated = true;
    sp_json_bool(sp_json_get(sp_json_root(doc), "truncated"), &truncated);
    assert_false(truncated);
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    r = req("GET", sbx[0], "/files/list?path=/root/d&depth=1", NULL, NULL, 0, NULL);
    doc = body_json(&r);
    assert_int_equal(sp_json_len(sp_json_get(sp_json_root(doc), "entries")), 1);
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    char *out = run(sbx[0], "ln -s /etc/hostname /root/link");
    free(out);
    r = req("GET", sbx[0], "/files/stat?path=/root/link", NULL, NULL, 0, NULL);
    assert_non_null(strstr(r.body, "\"target\":\"/etc/hostname\""));
    sp_httpc_resp_free(&r);

    /* move, across filesystems too (/tmp is gVisor's tmpfs). */
    assert_int_equal(status_of("POST", sbx[0], "/files/move", json,
                               "{\"from\":\"/root/d/e/f/x.txt\",\"to\":\"/tmp/m/x.txt\"}", code,
                               sizeof(code)),
                     200);
    assert_int_equal(status_of("POST", sbx[0], "/files/move", json,
                               "{\"from\":\"/tmp/m/x.txt\",\"to\":\"/root/x2.txt\"}", code,
                               sizeof(code)),
                     200);
    assert_int_equal(
        status_of("GET", sbx[0], "/files/stat?path=/tmp/m/x.txt", NULL, NULL, code, sizeof(code)),
        404);
    out = run(sbx[0], "cat /root/x2.txt");
    assert_string_equal(out, "x");
    free(out);

    /* remove: a non-empty directory needs recursive. */
    assert_int_equal(
        status_of("DELETE", sbx[0], "/files?path=/root/d", NULL, NULL, code, sizeof(code)), 409);
    assert_string_equal(code, "not_empty");
    assert_int_equal(status_of("DELETE", sbx[0], "/files?path=/root/d&recursive=true", NULL, NULL,
                               code, sizeof(code)),
                     204);
    assert_int_equal(
        status_of("DELETE", sbx[0], "/files?path=/root/d", NULL, NULL, code, sizeof(code)), 404);

    /* Errors. */
    assert_int_equal(status_of("GET", sbx[0], "/files?path=/nope", NULL, NULL, code, sizeof(code)),
                     404);
    assert_string_equal(code, "not_found");
    assert_int_equal(status_of("GET", sbx[0], "/files?path=/root", NULL, NULL, code, sizeof(code)),
                     409);
    assert_string_equal(code, "is_directory");
    assert_int_equal(
        status_of("PUT", sbx[0], "/files?path=/root", "text/plain", "x", code, sizeof(code)), 409);
    assert_int_equal(
        status_of("GET", sbx[0], "/files/list?path=/root/x2.txt", NULL, NULL, code, sizeof(code)),
        409);
    assert_string_equal(code, "not_directory");
    assert_int_equal(status_of("GET", sbx[0], "/files?path=", NULL, NULL, code, sizeof(code)), 400);
    assert_int_equal(status_of("GET", sbx[0], "/files?path=a%0Ab", NULL, NULL, code, sizeof(code)),
                     400);
    assert_string_equal(code, "bad_path");
    assert_int_equal(status_of("GET", sbx[0], "/files?path=a%00b", NULL, NULL, code, sizeof(code)),
                     400);
    char longpath[5000] = "/files/stat?path=/";
    memset(longpath + strlen(longpath), 'a', 4200);
    assert_int_equal(status_of("GET", sbx[0], longpath, NULL, NULL, code, sizeof(code)), 414);
    /* Past SP_FSPATH_MAX: only a body can say that much. */
    sp_buf_t big;
    sp_buf_init(&big);
    sp_buf_puts(&big, "{\"path\":\"/");
    for (int i = 0; i < 4200; i++)
        sp_buf_putc(&big, 'a');
    sp_buf_puts(&big, "\"}");
    assert_int_equal(status_of("POST", sbx[0], "/files/mkdir", json, big.data, code, sizeof(code)),
                     400);
    assert_string_equal(code, "bad_path");
    sp_buf_dispose(&big);
    assert_int_equal(
        status_of("GET", sbx[0], "/files?path=/x&user=nobody", NULL, NULL, code, sizeof(code)),
        400);
    assert_int_equal(
        status_of("GET", sbx[0], "/files?path=/x&bogus=1", NULL, NULL, code, sizeof(code)), 400);
    assert_int_equal(
        status_of("POST", sbx[0], "/files/mkdir", json, "{\"path\":1}", code, sizeof(code)), 400);
    assert_int_equal(status_of("PATCH", sbx[0], "/files?path=/x", NULL, NULL, code, sizeof(code)),
                     405);
    assert_int_equal(status_of("GET", "sbx_doesnotexist00000000000000", "/files?path=/x", NULL,
                               NULL, code, sizeof(code)),
                     404);
}

/* ".." cannot leave the sandbox: it is the guest's own tree; one sandbox's files are not in
 * another; another tenant cannot reach them. */
static void test_isolation(void **state)
{
    (void)state;
    char code[64];
    sp_httpc_resp_t r = req("PUT", sbx[0], "/files?path=../../etc/space-x&user=user", "text/plain",
                            "inside", 6, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"path\":\"/etc/space-x\""));
    sp_httpc_resp_free(&r);
    char *out = run(sbx[0], "cat /etc/space-x");
    assert_string_equal(out, "inside");
    free(out);
    assert_int_not_equal(access("/etc/space-x", F_OK), 0); /* not on the host */
    assert_int_equal(
        status_of("GET", sbx[1], "/files/stat?path=/etc/space-x", NULL, NULL, code, sizeof(code)),
        404);

    PGconn *db = sp_test_db();
    char *other = NULL, id[SP_APIKEY_ID_LEN + 1];
    assert_int_equal(sp_apikey_create(db, "other-tenant", "files test", &other, id), 0);
    r = req("GET", sbx[0], "/files?path=/etc/space-x", NULL, NULL, 0, other);
    assert_int_equal(r.status, 404);
    sp_httpc_resp_free(&r);
    free(other);
    PQfinish(db);
}

/* ---- 200 MB ---- */

typedef struct {
    uint64_t s;
    unsigned long long left;
    sp_sha256_ctx_t *sha;
} prng_t;

static long long prng_read(void *arg, void *buf, size_t len)
{
    prng_t *p = arg;
    uint8_t *o = buf;
    size_t n = len < p->left ? len : (size_t)p->left;
    for (size_t i = 0; i < n; i += 8) {
        p->s ^= p->s >> 12;
        p->s ^= p->s << 25;
        p->s ^= p->s >> 27;
        uint64_t v = p->s * 2685821657736338717ULL;
        memcpy(o + i, &v, n - i < 8 ? n - i : 8);
    }
    sp_sha256_update(p->sha, o, n);
    p->left -= n;
    return (long long)n;
}

typedef struct {
    sp_sha256_ctx_t *sha;
    unsigned long long got;
} sink_t;

static int sink(void *arg, const void *data, size_t len)
{
    sink_t *s = arg;
    sp_sha256_update(s->sha, data, len);
    s->got += len;
    return 0;
}

/* Memory of the gateway and the worker while a transfer runs (kB from /proc/PID/status). */
typedef struct {
    int pid[2];
    long base[2][3], max[2][3]; /* VmRSS, RssAnon, RssFile */
    atomic_bool stop;
} rss_t;

static void rss_read(int pid, long out[3])
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "re");
    out[0] = out[1] = out[2] = 0;
    while (f && fgets(line, sizeof(line), f)) {
        sscanf(line, "VmRSS: %ld", &out[0]);   /* NOLINT(cert-err34-c) */
        sscanf(line, "RssAnon: %ld", &out[1]); /* NOLINT(cert-err34-c) */
        sscanf(line, "RssFile: %ld", &out[2]); /* NOLINT(cert-err34-c) */
    }
    if (f)
        fclose(f);
}

static void *rss_main(void *arg)
{
    rss_t *r = arg;
    while (!atomic_load(&r->stop)) {
        for (int i = 0; i < 2; i++) {
            long v[3];
            rss_read(r->pid[i], v);
            for (int k = 0; k < 3; k++)
                if (v[k] > r->max[i][k])
                    r->max[i][k] = v[k];
        }
        usleep(20 * 1000);
    }
    return NULL;
}

static void rss_start(rss_t *r, pthread_t *t)
{
    memset(r, 0, sizeof(*r));
    r->pid[0] = sp_test_daemon_pid("space-gateway");
    r->pid[1] = sp_test_daemon_pid("space-worker");
    assert_true(r->pid[0] > 0 && r->pid[1] > 0);
    for (int i = 0; i < 2; i++) {
        rss_read(r->pid[i], r->base[i]);
        memcpy(r->max[i], r->base[i], sizeof(r->base[i]));
    }
    pthread_create(t, NULL, rss_main, r);
}

static void rss_stop(rss_t *r, pthread_t t, const char *what)
{
    atomic_store(&r->stop, true);
    pthread_join(t, NULL);
    static const char *names[2] = {"gateway", "worker"};
    for (int i = 0; i < 2; i++)
        print_message("%s %s: VmRSS %ld -> max %ld kB, RssAnon %ld -> %ld kB, RssFile %ld -> %ld "
                      "kB\n",
                      what, names[i], r->base[i][0], r->max[i][0], r->base[i][1], r->max[i][1],
                      r->base[i][2], r->max[i][2]);
}

static void test_big_file(void **state)
{
    (void)state;
    char path[256];
    uint8_t up[SP_SHA256_LEN], down[SP_SHA256_LEN];
    char up_hex[SP_SHA256_HEX_LEN + 1], down_hex[SP_SHA256_HEX_LEN + 1];
    rss_t rss;
    pthread_t t;

    prng_t p = {.s = 0x5eed5eed5eedULL, .left = BIG_BYTES, .sha = sp_sha256_new()};
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=/root/big.bin", sbx[0]);
    sp_httpc_req_t q = {.host = "127.0.0.1",
                        .port = port,
                        .method = "PUT",
                        .path = path,
                        .key = key,
                        .content_type = "application/octet-stream",
                        .body_read = prng_read,
                        .body_read_len = BIG_BYTES,
                        .body_arg = &p,
                        .timeout_ms = 600000};
    sp_httpc_resp_t r;
    rss_start(&rss, &t);
    int64_t t0 = sp_mono_ns();
    assert_int_equal(sp_httpc_do(&q, &r), 0);
    double up_s = (double)(sp_mono_ns() - t0) / 1e9;
    rss_stop(&rss, t, "upload");
    long up_gw_anon = rss.max[0][1] - rss.base[0][1], up_wk_rss = rss.max[1][0] - rss.base[1][0];
    if (r.status != 200)
        fail_msg("upload: %d %s", r.status, r.body);
    sp_sha256_final(p.sha, up);
    sp_hex_encode(up, sizeof(up), up_hex);
    assert_non_null(strstr(r.body, up_hex));
    sp_httpc_resp_free(&r);

    sink_t s = {.sha = sp_sha256_new()};
    sp_httpc_req_t g = {.host = "127.0.0.1",
                        .port = port,
                        .method = "GET",
                        .path = path,
                        .key = key,
                        .body_sink = sink,
                        .sink_arg = &s,
                        .timeout_ms = 600000};
    rss_start(&rss, &t);
    t0 = sp_mono_ns();
    assert_int_equal(sp_httpc_do(&g, &r), 0);
    double down_s = (double)(sp_mono_ns() - t0) / 1e9;
    rss_stop(&rss, t, "download");
    assert_int_equal(r.status, 200);
    sp_httpc_resp_free(&r);
    sp_sha256_final(s.sha, down);
    sp_hex_encode(down, sizeof(down), down_hex);
    assert_int_equal(s.got, BIG_BYTES);
    assert_string_equal(down_hex, up_hex);
    print_message("200 MB: upload %.2f s (%.1f MB/s), download %.2f s (%.1f MB/s)\n", up_s,
                  BIG_BYTES / 1e6 / up_s, down_s, BIG_BYTES / 1e6 / down_s);

    /* The guest sees the same bytes. */
    char *out = run(sbx[0], "sha256sum /root/big.bin");
    assert_int_equal(strncmp(out, up_hex, SP_SHA256_HEX_LEN), 0);
    free(out);

    /* Bounded memory: the body waits in a file-backed buffer, not the gateway's heap. Not under
     * AddressSanitizer: its quarantine keeps freed memory resident (up to 256 MiB by default),
     * so there the growth measures ASan, not the code (the -Werror build asserts it). */
#if !defined(__SANITIZE_ADDRESS__)
    assert_true(up_gw_anon < RSS_LIMIT_KB);
    assert_true(up_wk_rss < RSS_LIMIT_KB);
    assert_true(rss.max[0][1] - rss.base[0][1] < RSS_LIMIT_KB);
    assert_true(rss.max[1][0] - rss.base[1][0] < RSS_LIMIT_KB);
#else
    print_message("under ASan: growth gateway anon %ld KiB, worker %ld KiB: not asserted\n",
                  up_gw_anon, up_wk_rss);
#endif
}

static int sink_then_hang_up(void *arg, const void *data, size_t len)
{
    size_t *got = arg;
    (void)data;
    *got += len;
    return *got > 300 * 1024 ? -ECANCELED : 0;
}

/* Clients that vanish in the middle of a download: each abandoned transfer must be closed in
 * the worker, or the sandbox's 16 slots would fill up and refuse the next operation. */
static void test_abandoned_downloads(void **state)
{
    (void)state;
    char path[256], code[64];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=/root/big.bin", sbx[0]);
    for (int i = 0; i < 24; i++) {
        size_t got = 0;
        sp_httpc_resp_t r;
        sp_httpc_req_t g = {.host = "127.0.0.1",
                            .port = port,
                            .method = "GET",
                            .path = path,
                            .key = key,
                            .body_sink = sink_then_hang_up,
                            .sink_arg = &got,
                            .timeout_ms = 60000};
        assert_int_equal(sp_httpc_do(&g, &r), -ECANCELED);
        int st = 0;
        for (int k = 0; k < 100; k++) { /* the close travels after the hang-up */
            st = status_of("GET", sbx[0], "/files/stat?path=/root/big.bin", NULL, NULL, code,
                           sizeof(code));
            if (st != 429)
                break;
            usleep(20000);
        }
        assert_int_equal(st, 200);
    }
    sp_httpc_resp_t r = req("GET", sbx[0], "/files?path=/root/bin.dat", NULL, NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 4096);
    sp_httpc_resp_free(&r);
}

/* ---- the event log ---- */

static void test_events(void **state)
{
    (void)state;
    PGconn *db = sp_test_db();
    /* Every FileWritten is accepted, carries 32 bytes of digest, and no content. */
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM events WHERE type = "
                                            "'FileWritten' AND status = 'accepted' AND "
                                            "position('/root/big.bin'::bytea in payload) > 0",
                                            1, 10000),
                     1);
    PGresult *res = PQexec(db, "SELECT payload FROM events WHERE type = 'FileWritten' AND "
                               "status = 'accepted' ORDER BY stream_seq");
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    bool saw_big = false, saw_hello = false;
    for (int i = 0; i < PQntuples(res); i++) {
        size_t n = 0;
        unsigned char *raw = PQunescapeBytea((const unsigned char *)PQgetvalue(res, i, 0), &n);
        sp_envelope_t *e = NULL;
        char reason[SP_REASON_MAX];
        assert_int_equal(sp_envelope_decode(raw, n, &e, reason), 0);
        const Space__V1__FileWritten *fw = e->file_written;
        assert_int_equal(fw->sha256.len, 32);
        if (strcmp(fw->path, "/root/big.bin") == 0) {
            saw_big = true;
            assert_int_equal(fw->size, BIG_BYTES);
        }
        if (strcmp(fw->path, "/home/user/notes/hello.txt") == 0) {
            saw_hello = true;
            assert_int_equal(fw->size, 13);
            assert_int_equal(fw->mode, 0600);
            assert_string_equal(fw->user, "user");
        }
        sp_envelope_free(e);
        PQfreemem(raw);
    }
    PQclear(res);
    assert_true(saw_big);
    assert_true(saw_hello);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE "
                                           "position('hello, files'::bytea in payload) > 0"),
                     0);
    assert_true(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE type IN ('FileRemoved', "
                                      "'FileMoved', 'DirCreated') AND status = 'accepted'") >= 4);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE type LIKE 'File%' "
                                           "AND status <> 'accepted'"),
                     0);
    PQfinish(db);
}

/* A recursive delete that takes the agent longer than one data-plane call is answered when it
 * ends, and its FileRemoved is in the log (before: 502 after 30.5 s, no event). The stack's
 * worker answers pending after 1 s (SPACE_FILE_CALL_MS), so this delete of 20,000 files (6 s
 * here; 100,000 took 35 s and added nothing the rounds do not show) goes through many rounds of
 * asking again, as one of 30 s would at the default. The sandbox answers
 * commands meanwhile: the agent removes in a child process. */
typedef struct {
    char path[256];
    atomic_bool done;
    int status;
    double s;
    char body[512];
} remove_job_t;

static void *remove_main(void *arg)
{
    remove_job_t *j = arg;
    sp_httpc_req_t q = {.host = "127.0.0.1",
                        .port = port,
                        .method = "DELETE",
                        .path = j->path,
                        .key = key,
                        .timeout_ms = 900000};
    sp_httpc_resp_t r;
    int64_t t0 = sp_mono_ns();
    j->status = sp_httpc_do(&q, &r) < 0 ? -1 : r.status;
    j->s = (double)(sp_mono_ns() - t0) / 1e9;
    if (j->status >= 0) {
        snprintf(j->body, sizeof(j->body), "%s", r.body ? r.body : "");
        sp_httpc_resp_free(&r);
    }
    atomic_store(&j->done, true);
    return NULL;
}

static void test_remove_many(void **state)
{
    (void)state;
    const char *id = sbx[1];
    int64_t t0 = sp_mono_ns();
    sp_test_cmd_t c = sp_test_run(port, key, id,
                                  "{\"cmd\":\"mkdir -p /root/many && cd /root/many && seq 20000 | "
                                  "xargs touch && ls | wc -l\",\"timeout_s\":600}");
    assert_int_equal(c.status, 200);
    assert_int_equal(c.exit_code, 0);
    assert_int_equal(strtol(c.stdout_s, NULL, 10), 20000);
    sp_test_cmd_free(&c);
    print_message("20,000 files made in %.1f s\n", (double)(sp_mono_ns() - t0) / 1e9);

    static remove_job_t j;
    snprintf(j.path, sizeof(j.path), "/v1/sandboxes/%s/files?path=/root/many&recursive=true", id);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, remove_main, &j), 0);
    usleep(2000 * 1000);
    bool during = !atomic_load(&j.done);
    int64_t c0 = sp_mono_ns();
    c = sp_test_run(port, key, id, "{\"cmd\":\"echo alive\"}");
    bool still = !atomic_load(&j.done);
    assert_int_equal(c.status, 200);
    assert_string_equal(c.stdout_s, "alive\n");
    sp_test_cmd_free(&c);
    print_message("a command during the delete: %.3f s (delete still running: %s)\n",
                  (double)(sp_mono_ns() - c0) / 1e9,
                  during ? (still ? "yes" : "no") : "it was over");
    if (during)
        assert_true(still); /* the command did not wait for the delete */
    pthread_join(t, NULL);
    print_message("recursive delete of 20,000 files: %d in %.1f s\n", j.status, j.s);
    if (j.status != 204)
        fail_msg("DELETE answered %d: %.300s", j.status, j.body);

    /* The directory is gone. */
    c = sp_test_run(port, key, id, "{\"cmd\":\"ls /root/many 2>&1; echo rc=$?\"}");
    assert_int_equal(c.status, 200);
    assert_non_null(strstr(c.stdout_s, "No such file"));
    sp_test_cmd_free(&c);

    PGconn *db = sp_test_db();
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM events WHERE type = "
                                            "'FileRemoved' AND status = 'accepted' AND "
                                            "position('/root/many'::bytea in payload) > 0",
                                            1, 10000),
                     1);

    /* A client that gives up on a long delete: the delete goes on and is recorded. */
    c = sp_test_run(port, key, id,
                    "{\"cmd\":\"mkdir -p /root/gone && cd /root/gone && seq 10000 | xargs touch\","
                    "\"timeout_s\":600}");
    assert_int_equal(c.status, 200);
    assert_int_equal(c.exit_code, 0);
    sp_test_cmd_free(&c);
    snprintf(j.path, sizeof(j.path), "/v1/sandboxes/%s/files?path=/root/gone&recursive=true", id);
    sp_httpc_req_t q = {.host = "127.0.0.1",
                        .port = port,
                        .method = "DELETE",
                        .path = j.path,
                        .key = key,
                        .timeout_ms = 1000};
    sp_httpc_resp_t r;
    if (sp_httpc_do(&q, &r) == 0) {
        print_message("the 10,000-file delete answered %d within 1 s\n", r.status);
        sp_httpc_resp_free(&r);
    }
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM events WHERE type = "
                                            "'FileRemoved' AND status = 'accepted' AND "
                                            "position('/root/gone'::bytea in payload) > 0",
                                            1, 120000),
                     1);
    c = sp_test_run(port, key, id, "{\"cmd\":\"ls /root/gone 2>&1\"}");
    assert_non_null(strstr(c.stdout_s, "No such file"));
    sp_test_cmd_free(&c);
    PQfinish(db);
}

/* ---- space cp ---- */

static char *slurp(const char *path)
{
    sp_buf_t b;
    char chunk[65536];
    size_t n;
    FILE *f = fopen(path, "re");
    assert_non_null(f);
    sp_buf_init(&b);
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        sp_buf_append(&b, chunk, n);
    fclose(f);
    sp_buf_putc(&b, '\0');
    return sp_buf_take(&b);
}

static void test_cli_cp(void **state)
{
    (void)state;
    char args[512];
    FILE *f = fopen("cp-src.txt", "we");
    assert_non_null(f);
    for (int i = 0; i < 100000; i++)
        fprintf(f, "line %d\n", i);
    fclose(f);
    snprintf(args, sizeof(args), "cp cp-src.txt %s:/root/cp.txt", sbx[1]);
    assert_int_equal(sp_test_space(args), 0);
    snprintf(args, sizeof(args), "cp %s:/root/cp.txt cp-back.txt", sbx[1]);
    assert_int_equal(sp_test_space(args), 0);
    char *a = slurp("cp-src.txt"), *b = slurp("cp-back.txt");
    assert_string_equal(a, b);
    free(a);
    free(b);
    /* An error is the server's message and a non-zero status. */
    snprintf(args, sizeof(args), "cp %s:/root/missing cp-none.txt 2>cp-err.txt", sbx[1]);
    assert_int_not_equal(sp_test_space(args), 0);
    char *e = slurp("cp-err.txt");
    assert_non_null(strstr(e, "No such file"));
    free(e);
    assert_int_not_equal(access("cp-none.txt", F_OK), 0);
    unlink("cp-src.txt");
    unlink("cp-back.txt");
    unlink("cp-err.txt");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_round_trip),    cmocka_unit_test(test_operations),
        cmocka_unit_test(test_isolation),           cmocka_unit_test(test_big_file),
        cmocka_unit_test(test_abandoned_downloads), cmocka_unit_test(test_events),
        cmocka_unit_test(test_remove_many),         cmocka_unit_test(test_cli_cp),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
