/* The API calls most scenarios need (harness.h): make a sandbox, run a command and read its
 * JSON answer. Failures of the exchange fail the test. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "json.h"
#include "xmalloc.h"

sp_json_doc_t *sp_test_json(const sp_test_http_resp_t *r)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    /* Command answers carry up to 16 MiB per stream. */
    sp_json_limits_t lim = {.max_bytes = 64u << 20, .max_string = 32u << 20};
    if (sp_json_parse(r->body, r->body_len, &lim, &doc, err) < 0)
        fail_msg("not JSON (%s): %.300s", err, r->body);
    return doc;
}

void sp_test_create_sandbox(int port, const char *key, const char *tmpl, char out[64])
{
    char body[128];
    snprintf(body, sizeof(body), "{\"template\":\"%s\"}", tmpl);
    sp_test_create_sandbox_body(port, key, body, out);
}

void sp_test_create_sandbox_body(int port, const char *key, const char *body, char out[64])
{
    sp_test_http_resp_t r;
    for (int i = 0; i < 100; i++) {
        sp_test_http(port, "POST", "/v1/sandboxes", key, NULL, body, strlen(body), &r);
        /* 400 unknown_template until the worker's first heartbeat names its templates, 503
         * no_capacity ("retry") before the log has any worker up at all. */
        bool early = (r.status == 400 && strstr(r.body, "unknown_template")) ||
                     (r.status == 503 && strstr(r.body, "no_capacity") && i < 50);
        if (!early)
            break;
        sp_test_http_free(&r);
        usleep(100 * 1000);
    }
    if (r.status != 201)
        fail_msg("create: %d %s", r.status, r.body);
    sp_json_doc_t *doc = sp_test_json(&r);
    snprintf(out, 64, "%s", sp_json_str(sp_json_get(sp_json_root(doc), "id"), NULL));
    sp_json_doc_free(doc);
    sp_test_http_free(&r);
}

sp_test_cmd_t sp_test_run(int port, const char *key, const char *id, const char *body)
{
    char path[128];
    sp_test_cmd_t res = {0};
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    sp_test_http(port, "POST", path, key, "Accept: application/json\r\n", body, strlen(body), &r);
    res.status = r.status;
    if (r.status == 200) {
        sp_json_doc_t *doc = sp_test_json(&r);
        const sp_json_t *root = sp_json_root(doc);
        const char *s;
        res.stdout_s = sp_xstrdup((s = sp_json_str(sp_json_get(root, "stdout"), NULL)) ? s : "");
        res.stderr_s = sp_xstrdup((s = sp_json_str(sp_json_get(root, "stderr"), NULL)) ? s : "");
        res.error = sp_xstrdup((s = sp_json_str(sp_json_get(root, "error"), NULL)) ? s : "");
        sp_json_int(sp_json_get(root, "exit_code"), -1000, 1000, &res.exit_code);
        sp_json_int(sp_json_get(root, "signal"), 0, 1000, &res.signal);
        sp_json_bool(sp_json_get(root, "timed_out"), &res.timed_out);
        sp_json_bool(sp_json_get(root, "truncated"), &res.truncated);
        sp_json_bool(sp_json_get(root, "output_lost"), &res.output_lost);
        sp_json_doc_free(doc);
    } else {
        res.error = sp_xstrdup(r.body);
    }
    sp_test_http_free(&r);
    return res;
}

void sp_test_cmd_free(sp_test_cmd_t *r)
{
    free(r->stdout_s);
    free(r->stderr_s);
    free(r->error);
    memset(r, 0, sizeof(*r));
}

int sp_test_lifecycle(int port, const char *key, const char *id, const char *op, const char *query,
                      char *out, size_t len)
{
    char path[160];
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/%s%s", id, op, query ? query : "");
    sp_test_http(port, "POST", path, key, NULL, NULL, 0, &r);
    int status = r.status;
    sp_json_doc_t *doc = sp_test_json(&r);
    const sp_json_t *root = sp_json_root(doc);
    const char *v = sp_json_str(sp_json_get(root, status == 200 ? "state" : "code"), NULL);
    snprintf(out, len, "%s", v ? v : "");
    if (status >= 300)
        print_message("%s: %d %s\n", op, status, r.body);
    sp_json_doc_free(doc);
    sp_test_http_free(&r);
    return status;
}

int sp_test_metrics_port(const char *daemon)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/run/%s.metrics", sp_test_env("SPACE_HOME"), daemon);
    for (int i = 0; i < 600; i++) {
        FILE *f = fopen(path, "re");
        if (f) {
            char line[16] = "";
            int port = fgets(line, sizeof(line), f) ? (int)strtol(line, NULL, 10) : 0;
            fclose(f);
            if (port > 0)
                return port;
        }
        usleep(100 * 1000);
    }
    fail_msg("%s wrote no metrics port file %s (see its log)", daemon, path);
    return 0;
}

double sp_test_metric(const char *daemon, const char *sample)
{
    sp_test_http_resp_t r;
    sp_test_http(sp_test_metrics_port(daemon), "GET", "/metrics", NULL, NULL, NULL, 0, &r);
    if (r.status != 200)
        fail_msg("%s: GET /metrics answered %d", daemon, r.status);
    char *text = sp_xstrndup(r.body ? r.body : "", r.body_len);
    sp_test_http_free(&r);
    double v = -1;
    size_t n = strlen(sample);
    for (char *line = text; line && *line;) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        if (strncmp(line, sample, n) == 0 && line[n] == ' ')
            v = strtod(line + n + 1, NULL);
        line = next;
    }
    free(text);
    return v;
}

bool sp_test_log_has(const char *path, const char *a, const char *b)
{
    FILE *f = fopen(path, "re");
    char line[8192];
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f))
        found = strstr(line, a) && strstr(line, b);
    if (f)
        fclose(f);
    return found;
}

int sp_test_kept_disks(const char *state_dir, const char *id)
{
    char dir[1024], prefix[64];
    snprintf(dir, sizeof(dir), "%s/volumes/sandboxes", state_dir);
    snprintf(prefix, sizeof(prefix), ".kept-%s-", id);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

bool sp_test_sandbox_held(const char *state_dir, const char *id)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/bundles/%s", state_dir, id);
    if (access(path, F_OK) == 0)
        return true;
    snprintf(path, sizeof(path), "%s/volumes/sandboxes/%s", state_dir, id);
    if (access(path, F_OK) == 0)
        return true;
    snprintf(path, sizeof(path), "runsc --root=%s/runsc list | grep -q %s", state_dir, id);
    if (system(path) == 0) /* NOLINT(cert-env33-c): the test looks as an operator would */
        return true;
    /* Its netns (sp-<tag>-<id>) and cgroup (<controller>/space-<tag>/<id>, cgroup v1 here) are
     * named after the tag of the worker that made them, recorded in the state directory's
     * identities file ("<tag> <worker id> <volume dir>" per line): other workers on the machine
     * have their own. */
    snprintf(path, sizeof(path), "%s/identities", state_dir);
    FILE *f = fopen(path, "r");
    char line[1024], tag[64];
    bool found = false;
    while (!found && f && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%63s", tag) != 1)
            continue;
        snprintf(path, sizeof(path), "/run/netns/sp-%s-%s", tag, id);
        found = access(path, F_OK) == 0;
        snprintf(path, sizeof(path), "ls -d /sys/fs/cgroup/*/space-%s/%s >/dev/null 2>&1", tag, id);
        found = found || system(path) == 0; /* NOLINT(cert-env33-c): as an operator would look */
    }
    if (f)
        fclose(f);
    return found;
}

bool sp_test_nft_table_left(const char *tag)
{
    if (sp_test_sh("nft list table inet space_%s >/dev/null 2>&1", tag) != 0)
        return false;
    fprintf(stderr, "teardown: nftables table inet space_%s left on the host\n", tag);
    (void)sp_test_sh("nft delete table inet space_%s", tag);
    return true;
}

void sp_test_start_counter(int port, const char *key, const char *id)
{
    sp_test_cmd_t r = sp_test_run(port, key, id,
                                  "{\"cmd\":\"i=0; while true; do i=$((i+1)); echo $i > "
                                  "/tmp/count; sleep 0.1; done\",\"background\":true}");
    sp_test_cmd_free(&r);
    r = sp_test_run(port, key, id, "{\"cmd\":\"echo kept > /root/file\"}");
    if (r.status != 200)
        fail_msg("writing /root/file: %d %s", r.status, r.error);
    sp_test_cmd_free(&r);
    usleep(500 * 1000);
}

long sp_test_counter(int port, const char *key, const char *id)
{
    /* `echo $i > /tmp/count` truncates before it writes: a read in between finds the file
     * empty (CI once read 0 so), which is not a count; read again. */
    for (int i = 0;; i++) {
        sp_test_cmd_t r = sp_test_run(port, key, id, "{\"cmd\":\"cat /tmp/count\"}");
        if (r.status != 200 || !r.stdout_s)
            fail_msg("count: %d %s", r.status, r.error);
        bool empty = r.stdout_s && r.stdout_s[0] == '\0';
        long n = r.stdout_s ? strtol(r.stdout_s, NULL, 10) : -1; /* fail_msg does not return */
        sp_test_cmd_free(&r);
        if (!empty || i == 20)
            return n;
        usleep(20 * 1000);
    }
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void sp_test_stop_begin(sp_test_stop_t *s, int port, const char *key, const char *id)
{
    *s = (sp_test_stop_t){.t_read = mono_s()};
    s->before = sp_test_counter(port, key, id);
}

void sp_test_stop_held(sp_test_stop_t *s)
{
    s->t_held = mono_s();
}

void sp_test_stop_ending(sp_test_stop_t *s)
{
    s->t_ending = mono_s();
}

long sp_test_stop_check(const sp_test_stop_t *s, int port, const char *key, const char *id)
{
    long after = sp_test_counter(port, key, id);
    double now = mono_s();
    /* The sandbox could run from before the first read until the stop answered, and from
     * the resume asked for until the second read: one tick per 0.1 s at most, and one more
     * for a sleep cut short across the stop. */
    double ran = (s->t_held - s->t_read) + (now - s->t_ending);
    double held = s->t_ending - s->t_held;
    long most = s->before + (long)(ran / 0.1) + 2;
    print_message("counter: %ld before the stop, %ld after it; it could run %.2f s, stopped "
                  "%.2f s between: at most %ld\n",
                  s->before, after, ran, held, most);
    assert_true(s->t_held > 0 && s->t_ending >= s->t_held);
    assert_true(after >= s->before);
    assert_true(after <= most);
    return after;
}

int sp_test_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd); /* NOLINT(cert-env33-c): the test's own command lines */
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *sp_test_worker_of(PGconn *db, const char *id)
{
    const char *params[1] = {id};
    PGresult *r = PQexecParams(db, "SELECT coalesce(worker, '') FROM sandboxes WHERE id = $1", 1,
                               NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        fail_msg("sandbox %s: not in the log (%s)", id, PQerrorMessage(db));
    char *w = sp_xstrdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return w;
}

void sp_test_snapshot_keys(PGconn *db, const char *id, char keys[2][256])
{
    static const char *names[2] = {"checkpoint.img.zst", "rootfs.btrfs.zst"};
    const char *params[1] = {id};
    PGresult *r = PQexecParams(db,
                               "SELECT substring(encode(payload, 'escape') from $1 || "
                               "'/([a-z0-9_]+)/checkpoint') FROM events WHERE aggregate_id = $1 "
                               "AND type = 'SandboxSuspended' ORDER BY stream_seq DESC LIMIT 1",
                               1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 || PQgetisnull(r, 0, 0))
        fail_msg("sandbox %s: no SandboxSuspended with a snapshot (%s)", id, PQerrorMessage(db));
    for (int i = 0; i < 2; i++)
        snprintf(keys[i], 256, "%s/%s/%s", id, PQgetvalue(r, 0, 0), names[i]);
    PQclear(r);
}

void sp_test_put_program(int port, const char *key, const char *id, const char *name,
                         const char *guest_path)
{
    char path[512], url[512];
    snprintf(path, sizeof(path), "%s/%s", sp_test_env("SPACE_BIN_DIR"), name);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("no %s", path);
    struct stat st;
    fstat(fileno(f), &st);
    char *bin = sp_xmalloc((size_t)st.st_size);
    if (fread(bin, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
        fail_msg("read %s", path);
    fclose(f);
    snprintf(url, sizeof(url), "/v1/sandboxes/%s/files?path=%s&mode=0755", id, guest_path);
    sp_test_http_resp_t r;
    sp_test_http(port, "PUT", url, key, "Content-Type: application/octet-stream\r\n", bin,
                 (size_t)st.st_size, &r);
    free(bin);
    if (r.status != 200 && r.status != 201)
        fail_msg("PUT %s: %d %s", name, r.status, r.body);
    sp_test_http_free(&r);
}
