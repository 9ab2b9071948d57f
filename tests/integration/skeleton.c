/* The walking skeleton, through HTTP only: real isolated gVisor sandboxes created, listed and
 * deleted through the API, with the host left clean and the log telling the story; bad input
 * refused with the right 4xx; a worker killed with SIGKILL reconciles on restart.
 * Stack: eventlog + scheduler + worker + gateway, started by `space up` (the fixture). */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "buf.h"
#include "harness.h"
#include "json.h"
#include "xmalloc.h"

#define N 10

static int port;
static const char *key;

/* The JSON body of r, parsed; fails the test when it is not JSON. */
static sp_json_doc_t *body_json(const sp_test_http_resp_t *r)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (sp_json_parse(r->body, r->body_len, NULL, &doc, err) < 0)
        fail_msg("not JSON (%s): %s", err, r->body);
    return doc;
}

static const char *str_field(const sp_json_doc_t *doc, const char *name)
{
    const char *s = sp_json_str(sp_json_get(sp_json_root(doc), name), NULL);
    return s ? s : "";
}

/* Runs a shell command and returns its stdout (heap). */
static char *sh(const char *cmd)
{
    FILE *p = popen(cmd, "r"); /* NOLINT(cert-env33-c): host-side checks as an operator would */
    char buf[65536];
    size_t n = p ? fread(buf, 1, sizeof(buf) - 1, p) : 0;
    buf[n] = '\0';
    if (p)
        pclose(p);
    return sp_xstrdup(buf);
}

/* The runsc container of sandbox id: a sandbox claimed from a warm pool keeps its pool id's
 * (docs/pools.md: bundles/<id> links to it). */
static void container_of(const char *id, char out[80])
{
    char *link = sp_xasprintf("%s/worker/bundles/%s", sp_test_env("SPACE_HOME"), id);
    ssize_t n = readlink(link, out, 79);
    free(link);
    if (n > 0)
        out[n] = '\0';
    else
        snprintf(out, 80, "%s", id);
}

static char *runsc_exec(const char *id, const char *cmd)
{
    char cid[80];
    container_of(id, cid);
    char *c = sp_xasprintf("runsc --root='%s/worker/runsc' exec %s /bin/sh -c '%s' 2>&1",
                           sp_test_env("SPACE_HOME"), cid, cmd);
    char *out = sh(c);
    free(c);
    return out;
}

typedef struct {
    char id[64];
    int status;
    char state[32];
} created_t;

static void *create_one(void *arg)
{
    created_t *c = arg;
    sp_test_http_resp_t r;
    const char *body = "{\"template\":\"tiny\",\"metadata\":{\"suite\":\"skeleton\"},"
                       "\"resources\":{\"vcpu\":1,\"memory_mb\":256}}";
    sp_test_http(port, "POST", "/v1/sandboxes", key, NULL, body, strlen(body), &r);
    c->status = r.status;
    if (r.status == 201) {
        sp_json_doc_t *doc = body_json(&r);
        snprintf(c->id, sizeof(c->id), "%s", str_field(doc, "id"));
        snprintf(c->state, sizeof(c->state), "%s", str_field(doc, "state"));
        sp_json_doc_free(doc);
    } else {
        print_message("create: %d %s\n", r.status, r.body);
    }
    sp_test_http_free(&r);
    return NULL;
}

static void *delete_one(void *arg)
{
    created_t *c = arg;
    sp_test_http_resp_t r;
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", c->id);
    sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
    c->status = r.status;
    sp_test_http_free(&r);
    return NULL;
}

static void wait_template(const char *name)
{
    for (int i = 0; i < 600; i++) {
        sp_test_http_resp_t r;
        sp_test_http(port, "GET", "/v1/templates", key, NULL, NULL, 0, &r);
        char want[64];
        snprintf(want, sizeof(want), "\"%s\"", name);
        int found = r.status == 200 && strstr(r.body, want);
        sp_test_http_free(&r);
        if (found)
            return;
        usleep(100 * 1000);
    }
    fail_msg("template %s never became available", name);
}

/* Host resources that still name one of ids: runsc containers, netns, cgroup directories,
 * subvolumes. Returns a description, empty when clean (heap). */
static char *leftovers(created_t *c, size_t n)
{
    char *cmd = sp_xasprintf("runsc --root='%s/worker/runsc' list -quiet 2>/dev/null; "
                             "ls /sys/fs/cgroup/*/space-*/ /run/netns 2>/dev/null; "
                             "ls '%s/worker/volumes/sandboxes' 2>/dev/null",
                             sp_test_env("SPACE_HOME"), sp_test_env("SPACE_HOME"));
    char *host = sh(cmd);
    free(cmd);
    sp_buf_t found;
    sp_buf_init(&found);
    for (size_t i = 0; i < n; i++)
        if (c[i].id[0] && strstr(host, c[i].id))
            sp_buf_printf(&found, "%s ", c[i].id);
    free(host);
    return sp_buf_take(&found);
}

static void test_ten_sandboxes(void **state)
{
    created_t c[N] = {0};
    pthread_t t[N];
    sp_test_http_resp_t r;

    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    sp_test_http(port, "GET", "/healthz", NULL, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    sp_test_http_free(&r);
    wait_template("tiny");

    for (int i = 0; i < N; i++)
        pthread_create(&t[i], NULL, create_one, &c[i]);
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < N; i++) {
        assert_int_equal(c[i].status, 201);
        assert_string_equal(c[i].state, "running");
        for (int k = 0; k < i; k++)
            assert_string_not_equal(c[i].id, c[k].id);
    }

    /* Isolation: a file written in one sandbox is absent in the others; a sandbox sees only
     * its own processes, and its own hostname. */
    char *out = runsc_exec(c[0].id, "echo secret-0 > /marker && cat /marker");
    assert_non_null(strstr(out, "secret-0"));
    free(out);
    for (int i = 1; i < N; i++) {
        out = runsc_exec(c[i].id, "cat /marker 2>/dev/null || echo absent");
        assert_non_null(strstr(out, "absent"));
        assert_null(strstr(out, "secret-0"));
        free(out);
    }
    out = runsc_exec(c[3].id, "ps -o pid,comm");
    assert_null(strstr(out, "nats-server"));
    assert_null(strstr(out, "postgres"));
    assert_null(strstr(out, "space-"));
    free(out);
    out = runsc_exec(c[4].id, "hostname");
    assert_non_null(strstr(out, c[4].id));
    free(out);

    /* The API lists them as running. */
    sp_test_http(port, "GET", "/v1/sandboxes?state=running&metadata.suite=skeleton", key, NULL,
                 NULL, 0, &r);
    assert_int_equal(r.status, 200);
    sp_json_doc_t *doc = body_json(&r);
    assert_int_equal(sp_json_len(sp_json_get(sp_json_root(doc), "sandboxes")), N);
    sp_json_doc_free(doc);
    sp_test_http_free(&r);

    for (int i = 0; i < N; i++)
        pthread_create(&t[i], NULL, delete_one, &c[i]);
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < N; i++)
        assert_int_equal(c[i].status, 204);

    char *left = leftovers(c, N);
    if (left[0])
        fail_msg("host resources left for: %s", left);
    free(left);

    /* The log tells the story. */
    char cmdout[65536], args[128];
    snprintf(args, sizeof(args), "timeline --sandbox %s", c[0].id);
    assert_int_equal(sp_test_replay(args, cmdout, sizeof(cmdout)), 0);
    const char *story[] = {"SandboxCreateRequested", "SandboxPlaced", "SandboxStarted",
                           "SandboxDeleteRequested", "SandboxDeleted"};
    const char *at = cmdout;
    for (size_t i = 0; i < 5; i++) {
        at = strstr(at, story[i]);
        if (!at)
            fail_msg("timeline lacks %s (in order):\n%s", story[i], cmdout);
    }
    assert_int_equal(sp_test_replay("verify", cmdout, sizeof(cmdout)), 0);
}

static void expect_status(const char *method, const char *path, const char *k, const char *body,
                          size_t len, int want, const char *code)
{
    sp_test_http_resp_t r;
    sp_test_http(port, method, path, k, NULL, body, len, &r);
    if (r.status != want || (code && !strstr(r.body, code)))
        fail_msg("%s %s: %d %s (want %d %s)", method, path, r.status, r.body, want,
                 code ? code : "");
    sp_test_http_free(&r);
}

static void test_bad_input(void **state)
{
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    const char *bad = "{\"template\": \"tiny\",";
    expect_status("POST", "/v1/sandboxes", key, bad, strlen(bad), 400, NULL);
    const char *unknown = "{\"template\":\"no-such-template\"}";
    expect_status("POST", "/v1/sandboxes", key, unknown, strlen(unknown), 400, NULL);
    expect_status("POST", "/v1/sandboxes", NULL, unknown, strlen(unknown), 401, NULL);
    expect_status("POST", "/v1/sandboxes", "sk_AAAAAAAAAAAAAAAA.nope", unknown, strlen(unknown),
                  401, NULL);
    size_t big = 10 * 1024 * 1024;
    char *huge = sp_xmalloc(big);
    memset(huge, ' ', big);
    huge[0] = '{';
    huge[big - 1] = '}';
    expect_status("POST", "/v1/sandboxes", key, huge, big, 413, NULL);
    free(huge);
    expect_status("GET", "/v1/sandboxes/sbx_doesnotexist0000000000000", key, NULL, 0, 404, NULL);
    /* Nothing was created by any of it. */
    sp_test_http_resp_t r;
    sp_test_http(port, "GET", "/v1/sandboxes?state=running", key, NULL, NULL, 0, &r);
    sp_json_doc_t *doc = body_json(&r);
    assert_int_equal(sp_json_len(sp_json_get(sp_json_root(doc), "sandboxes")), 0);
    sp_json_doc_free(doc);
    sp_test_http_free(&r);
}

static long long events_of(const char *type, const char *sbx)
{
    char sql[256];
    PGconn *db = sp_test_db();
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE status = 'accepted' AND type = '%s' AND "
             "aggregate_id = '%s'",
             type, sbx);
    long long n = sp_test_db_wait_scalar(db, sql, 1, 20000);
    PQfinish(db);
    return n;
}

/* SIGKILL the worker while sandboxes run and lose one of them behind its back: the restarted
 * worker adopts the two still running, reports the lost one, and nothing leaks. */
static void test_worker_restart(void **state)
{
    created_t c[3] = {0};
    char state_json[64];

    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    for (int i = 0; i < 3; i++) {
        create_one(&c[i]);
        assert_int_equal(c[i].status, 201);
    }
    sp_test_daemon_kill9("space-worker");
    char cid[80];
    container_of(c[2].id, cid);
    char *cmd = sp_xasprintf("runsc --root='%s/worker/runsc' delete --force %s 2>&1",
                             sp_test_env("SPACE_HOME"), cid);
    free(sh(cmd));
    free(cmd);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);

    assert_int_equal(events_of("SandboxAdopted", c[0].id), 1);
    assert_int_equal(events_of("SandboxAdopted", c[1].id), 1);
    assert_int_equal(events_of("SandboxFailed", c[2].id), 1);
    for (int i = 0; i < 3; i++) {
        sp_test_http_resp_t r;
        char path[512];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", c[i].id);
        sp_test_http(port, "GET", path, key, NULL, NULL, 0, &r);
        sp_json_doc_t *doc = body_json(&r);
        snprintf(state_json, sizeof(state_json), "%s", str_field(doc, "state"));
        sp_json_doc_free(doc);
        sp_test_http_free(&r);
        assert_string_equal(state_json, i < 2 ? "running" : "failed");
    }
    /* The adopted ones still work. */
    char *out = runsc_exec(c[1].id, "echo alive");
    assert_non_null(strstr(out, "alive"));
    free(out);
    for (int i = 0; i < 3; i++) {
        delete_one(&c[i]);
        assert_int_equal(c[i].status, 204);
    }
    char *left = leftovers(c, 3);
    if (left[0])
        fail_msg("host resources left for: %s", left);
    free(left);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ten_sandboxes),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_worker_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
