/* Commands in real sandboxes, through HTTP only: the guest agent, the worker's data plane and
 * the gateway together. Stack: eventlog + scheduler + worker + gateway. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "buf.h"
#include "harness.h"
#include "json.h"
#include "xmalloc.h"

static int port;
static const char *key;
static char sbx[2][64];

static sp_json_doc_t *body_json(const sp_test_http_resp_t *r)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    /* Command answers carry up to 16 MiB per stream. */
    sp_json_limits_t lim = {.max_bytes = 64u << 20, .max_string = 32u << 20};
    if (sp_json_parse(r->body, r->body_len, &lim, &doc, err) < 0)
        fail_msg("not JSON (%s): %.300s", err, r->body);
    return doc;
}

static void create(char out[64])
{
    sp_test_http_resp_t r;
    const char *body = "{\"template\":\"tiny\"}";
    for (int i = 0; i < 100; i++) {
        sp_test_http(port, "POST", "/v1/sandboxes", key, NULL, body, strlen(body), &r);
        if (r.status != 400)
            break; /* 400 unknown_template until the worker's first heartbeat */
        sp_test_http_free(&r);
        usleep(100 * 1000);
    }
    if (r.status != 201)
        fail_msg("create: %d %s", r.status, r.body);
    sp_json_doc_t *doc = body_json(&r);
    snprintf(out, 64, "%s", sp_json_str(sp_json_get(sp_json_root(doc), "id"), NULL));
    sp_json_doc_free(doc);
    sp_test_http_free(&r);
}

typedef struct {
    int status;
    char *stdout_s, *stderr_s, *error;
    int64_t exit_code, signal;
    bool timed_out, truncated;
} result_t;

/* Runs body (JSON) as a command in sandbox id and returns the JSON answer. */
static result_t run(const char *id, const char *body)
{
    char path[128];
    result_t res = {0};
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    sp_test_http(port, "POST", path, key, "Accept: application/json\r\n", body, strlen(body), &r);
    res.status = r.status;
    if (r.status == 200) {
        sp_json_doc_t *doc = body_json(&r);
        const sp_json_t *root = sp_json_root(doc);
        const char *s;
        res.stdout_s = sp_xstrdup((s = sp_json_str(sp_json_get(root, "stdout"), NULL)) ? s : "");
        res.stderr_s = sp_xstrdup((s = sp_json_str(sp_json_get(root, "stderr"), NULL)) ? s : "");
        res.error = sp_xstrdup((s = sp_json_str(sp_json_get(root, "error"), NULL)) ? s : "");
        sp_json_int(sp_json_get(root, "exit_code"), -1000, 1000, &res.exit_code);
        sp_json_int(sp_json_get(root, "signal"), 0, 1000, &res.signal);
        sp_json_bool(sp_json_get(root, "timed_out"), &res.timed_out);
        sp_json_bool(sp_json_get(root, "truncated"), &res.truncated);
        sp_json_doc_free(doc);
    } else {
        res.error = sp_xstrdup(r.body);
    }
    sp_test_http_free(&r);
    return res;
}

static void result_free(result_t *r)
{
    free(r->stdout_s);
    free(r->stderr_s);
    free(r->error);
}

static int setup(void **state)
{
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    create(sbx[0]);
    create(sbx[1]);
    return 0;
}

static void test_basics(void **state)
{
    result_t r = run(sbx[0], "{\"cmd\":\"echo hi\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.stdout_s, "hi\n");
    assert_int_equal(r.exit_code, 0);
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"echo oops >&2; exit 3\"}");
    assert_int_equal(r.exit_code, 3);
    assert_string_equal(r.stderr_s, "oops\n");
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"kill -9 $$\"}");
    assert_int_equal(r.signal, 9);
    result_free(&r);

    /* The value reaches the process (shown only in part: printed output is recorded for
     * audit, and the whole value must be in no event). */
    r = run(sbx[0], "{\"argv\":[\"/bin/sh\",\"-c\",\"echo ${GREETING%-value} in $(pwd)\"],"
                    "\"env\":{\"GREETING\":\"hello-secret-value\"},\"cwd\":\"/tmp\"}");
    assert_string_equal(r.stdout_s, "hello-secret in /tmp\n");
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"cat\",\"stdin\":\"round trip\\n\"}");
    assert_string_equal(r.stdout_s, "round trip\n");
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"id -u\",\"user\":\"user\"}");
    assert_string_equal(r.stdout_s, "1000\n");
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"sleep 30\",\"timeout_s\":1}");
    assert_true(r.timed_out);
    result_free(&r);

    /* A file written by one command is there for the next one, not in the other sandbox. */
    r = run(sbx[0], "{\"cmd\":\"echo kept > /kept && cat /kept\"}");
    assert_string_equal(r.stdout_s, "kept\n");
    result_free(&r);
    r = run(sbx[1], "{\"cmd\":\"cat /kept 2>/dev/null || echo absent\"}");
    assert_string_equal(r.stdout_s, "absent\n");
    result_free(&r);

    /* The env value is in no event; the command and its digests are. */
    PGconn *db = sp_test_db();
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE position("
                                           "'hello-secret-value'::bytea in payload) > 0"),
                     0);
    assert_true(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE type = "
                                      "'CommandExited' AND status = 'accepted'") >= 8);
    PQfinish(db);
}

typedef struct {
    int i;
    result_t r;
} job_t;

static void *run_job(void *arg)
{
    job_t *j = arg;
    char body[128];
    snprintf(body, sizeof(body), "{\"cmd\":\"echo job-%d\"}", j->i);
    j->r = run(sbx[1], body);
    return NULL;
}

static void test_fifty_concurrent(void **state)
{
    job_t jobs[50];
    pthread_t t[50];
    for (int i = 0; i < 50; i++) {
        jobs[i].i = i;
        pthread_create(&t[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < 50; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 50; i++) {
        char want[32];
        snprintf(want, sizeof(want), "job-%d\n", i);
        assert_int_equal(jobs[i].r.status, 200);
        assert_string_equal(jobs[i].r.stdout_s, want);
        result_free(&jobs[i].r);
    }
}

/* A hostile guest: floods stdout, writes garbage to the agent channel. The worker and gateway
 * keep serving, the other sandbox is unaffected, and the broken channel is reported. */
static void test_hostile_guest(void **state)
{
    result_t r = run(sbx[0], "{\"cmd\":\"yes | head -c 50000000 | wc -c\"}");
    assert_string_equal(r.stdout_s, "50000000\n");
    result_free(&r);
    r = run(sbx[0], "{\"cmd\":\"yes flood | head -c 40000000\"}");
    assert_int_equal(r.status, 200);
    assert_true(r.truncated);
    result_free(&r);

    r = run(sbx[0], "{\"cmd\":\"head -c 4096 /dev/urandom > /proc/1/fd/1; sleep 1; echo late\"}");
    assert_int_equal(r.status, 200);
    assert_true(strlen(r.error) > 0);
    print_message("garbage on the channel: %s\n", r.error);
    result_free(&r);
    r = run(sbx[0], "{\"cmd\":\"echo again\"}");
    assert_int_equal(r.status, 503);
    result_free(&r);

    r = run(sbx[1], "{\"cmd\":\"echo still fine\"}");
    assert_string_equal(r.stdout_s, "still fine\n");
    result_free(&r);
}

/* The `space` CLI on the same API: exec's exit status is the command's (128 + signal). */
static void test_cli(void **state)
{
    char args[256];
    snprintf(args, sizeof(args), "exec %s -- sh -c 'echo out; exit 7' >/dev/null", sbx[1]);
    assert_int_equal(sp_test_space(args), 7);
    snprintf(args, sizeof(args), "exec %s -- sh -c 'kill -9 $$' >/dev/null 2>&1", sbx[1]);
    assert_int_equal(sp_test_space(args), 137);
    snprintf(args, sizeof(args), "exec %s -- test -f /bin/busybox", sbx[1]);
    assert_int_equal(sp_test_space(args), 0);
    snprintf(args, sizeof(args), "ls | grep -q %s", sbx[1]);
    assert_int_equal(sp_test_space(args), 0);
    /* A sandbox made and removed by the CLI. */
    assert_int_equal(sp_test_space("create tiny > cli-created.id"), 0);
    assert_int_equal(sp_test_space("rm $(cat cli-created.id)"), 0);
    assert_int_not_equal(sp_test_space("rm $(cat cli-created.id) 2>/dev/null"), 0);
    unlink("cli-created.id");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_basics),
        cmocka_unit_test(test_fifty_concurrent),
        cmocka_unit_test(test_hostile_guest),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
