/* The fault tests' workload (workload.h). */
#include "workload.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "buf.h"
#include "error.h"
#include "harness.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"

#define THREADS_MAX 16
#define CALLS_MAX   64

static const char *const op_names[SP_TEST_OP__COUNT] = {"create",  "command", "write",
                                                        "suspend", "resume",  "delete"};

typedef struct {
    pthread_t t;
    sp_test_workload_t *w;
    int n;
    sp_test_call_t calls[CALLS_MAX];
    int ncalls;
    char own[64];   /* its sandbox, "" when it has none */
    bool suspended; /* own is suspended */
} thread_t;

struct sp_test_workload {
    sp_test_workload_cfg_t cfg;
    int run; /* this process's n-th workload: in the paths it writes, so each is written once */
    atomic_bool stop;
    thread_t th[THREADS_MAX];
    const sp_test_call_t *all[THREADS_MAX * CALLS_MAX];
    const char *own[THREADS_MAX];
};

static int64_t now_ms(void)
{
    return sp_mono_ns() / 1000000;
}

/* The answer's field (a string), and whether it is the API's error shape. */
static void json_field(const sp_httpc_resp_t *r, const char *field, char out[64], bool *ret_err)
{
    out[0] = '\0';
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (!r->body || sp_json_parse(r->body, r->body_len, NULL, &doc, err) < 0)
        return;
    const sp_json_t *root = sp_json_root(doc);
    *ret_err = sp_json_get(root, "code") && sp_json_get(root, "message");
    const sp_json_t *v = field ? sp_json_get(root, field) : NULL;
    const char *s = v ? sp_json_str(v, NULL) : NULL;
    snprintf(out, 64, "%s", s ? s : "");
    sp_json_doc_free(doc);
}

static void call(const sp_test_workload_t *w, sp_test_call_t *c, const char *method,
                 const char *path, const char *hdrs, const char *body, const char *ctype,
                 const char *field)
{
    sp_httpc_req_t req = {.host = "127.0.0.1",
                          .port = w->cfg.port,
                          .method = method,
                          .path = path,
                          .key = w->cfg.key,
                          .extra_headers = hdrs,
                          .body = body,
                          .body_len = body ? strlen(body) : 0,
                          .content_type = ctype,
                          .timeout_ms = w->cfg.client_ms};
    sp_httpc_resp_t r = {0};
    char id[64];
    int64_t t0 = now_ms();
    c->rc = sp_httpc_do(&req, &r);
    c->ms = now_ms() - t0;
    if (c->rc < 0)
        return;
    c->status = r.status;
    json_field(&r, field, id, &c->json_error);
    if (field && id[0])
        snprintf(c->id, sizeof(c->id), "%s", id);
    snprintf(c->body, sizeof(c->body), "%.*s",
             (int)(r.body_len < sizeof(c->body) ? r.body_len : sizeof(c->body) - 1),
             r.body ? r.body : "");
    sp_httpc_resp_free(&r);
}

/* The kind of call i of thread t: the allowed kinds in turn, shifted by the thread's number,
 * then adjusted to what the thread has. */
static sp_test_op_t next_op(const thread_t *t, int i)
{
    sp_test_op_t allowed[SP_TEST_OP__COUNT];
    int n = 0;
    for (int op = 0; op < SP_TEST_OP__COUNT; op++)
        if (t->w->cfg.ops & SP_TEST_OP_BIT(op))
            allowed[n++] = (sp_test_op_t)op;
    sp_test_op_t op = allowed[(t->n + i) % n];
    bool needs_own = op == SP_TEST_OP_SUSPEND || op == SP_TEST_OP_RESUME ||
                     op == SP_TEST_OP_DELETE ||
                     ((op == SP_TEST_OP_COMMAND || op == SP_TEST_OP_WRITE) && !t->w->cfg.busy[0]);
    if (needs_own && !t->own[0])
        return SP_TEST_OP_CREATE;
    if (op == SP_TEST_OP_CREATE && t->own[0])
        return t->w->cfg.ops & SP_TEST_OP_BIT(SP_TEST_OP_DELETE) ? SP_TEST_OP_DELETE
                                                                 : SP_TEST_OP_COMMAND;
    if (op == SP_TEST_OP_SUSPEND && t->suspended)
        return SP_TEST_OP_RESUME;
    if (op == SP_TEST_OP_RESUME && !t->suspended)
        return SP_TEST_OP_SUSPEND;
    if ((op == SP_TEST_OP_COMMAND || op == SP_TEST_OP_WRITE) && !t->w->cfg.busy[0] && t->suspended)
        return SP_TEST_OP_RESUME;
    return op;
}

static void *thread_main(void *arg)
{
    thread_t *t = arg;
    const sp_test_workload_cfg_t *cfg = &t->w->cfg;
    for (int i = 0; i < cfg->max_calls && (i < cfg->min_calls || !atomic_load(&t->w->stop)); i++) {
        sp_test_call_t *c = &t->calls[t->ncalls++];
        char path[256], body[512], cmd[256];
        const char *target = cfg->busy[0] ? cfg->busy[(t->n + i) % (cfg->busy[1] ? 2 : 1)] : t->own;
        c->op = next_op(t, i);
        switch (c->op) {
        case SP_TEST_OP_CREATE:
            snprintf(body, sizeof(body), "{\"template\":\"%s\"}",
                     cfg->template_id ? cfg->template_id : "tiny");
            call(t->w, c, "POST", "/v1/sandboxes", NULL, body, NULL, "id");
            if (c->status == 201) {
                snprintf(t->own, sizeof(t->own), "%s", c->id);
                t->suspended = false;
            }
            break;
        case SP_TEST_OP_COMMAND:
            if (cfg->command)
                snprintf(cmd, sizeof(cmd), "%s", cfg->command);
            else
                snprintf(cmd, sizeof(cmd), "echo w%d-%d", t->n, i);
            sp_buf_t b;
            sp_buf_init(&b);
            sp_buf_puts(&b, "{\"cmd\":");
            sp_buf_json_str(&b, cmd);
            sp_buf_puts(&b, ",\"timeout_s\":5}");
            snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", target);
            call(t->w, c, "POST", path, "Accept: application/json\r\n", b.data, NULL, "cmd_id");
            sp_buf_dispose(&b);
            break;
        case SP_TEST_OP_WRITE:
            snprintf(c->path, sizeof(c->path), "wl-%d-%d-%d.txt", t->w->run, t->n, i);
            snprintf(c->id, sizeof(c->id), "%s", target);
            snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=%s", target, c->path);
            call(t->w, c, "PUT", path, NULL, "written by the workload\n",
                 "application/octet-stream", NULL);
            break;
        case SP_TEST_OP_SUSPEND:
        case SP_TEST_OP_RESUME:
            snprintf(c->id, sizeof(c->id), "%s", t->own);
            snprintf(path, sizeof(path), "/v1/sandboxes/%s/%s", t->own,
                     c->op == SP_TEST_OP_SUSPEND ? "suspend" : "resume");
            call(t->w, c, "POST", path, NULL, NULL, NULL, NULL);
            if (c->status >= 200 && c->status < 300)
                t->suspended = c->op == SP_TEST_OP_SUSPEND;
            break;
        default:
            snprintf(c->id, sizeof(c->id), "%s", t->own);
            snprintf(path, sizeof(path), "/v1/sandboxes/%s", t->own);
            call(t->w, c, "DELETE", path, NULL, NULL, NULL, NULL);
            if (c->status == 204 || c->status == 404)
                t->own[0] = '\0';
            break;
        }
        if (cfg->pause_ms > 0)
            nanosleep(&(struct timespec){.tv_sec = cfg->pause_ms / 1000,
                                         .tv_nsec = (long)(cfg->pause_ms % 1000) * 1000000},
                      NULL);
    }
    return NULL;
}

sp_test_workload_t *sp_test_workload_start(const sp_test_workload_cfg_t *cfg)
{
    assert_true(cfg->threads >= 1 && cfg->threads <= THREADS_MAX);
    assert_true(cfg->max_calls >= cfg->min_calls && cfg->max_calls <= CALLS_MAX);
    assert_true(cfg->ops != 0);
    static int runs;
    sp_test_workload_t *w = sp_xcalloc(1, sizeof(*w));
    w->cfg = *cfg;
    w->run = runs++;
    if (!w->cfg.client_ms)
        w->cfg.client_ms = 60000;
    atomic_init(&w->stop, false);
    for (int i = 0; i < cfg->threads; i++) {
        w->th[i].w = w;
        w->th[i].n = i;
        assert_int_equal(pthread_create(&w->th[i].t, NULL, thread_main, &w->th[i]), 0);
    }
    return w;
}

void sp_test_workload_stop(sp_test_workload_t *w)
{
    atomic_store(&w->stop, true);
    for (int i = 0; i < w->cfg.threads; i++)
        pthread_join(w->th[i].t, NULL);
}

size_t sp_test_workload_calls(sp_test_workload_t *w, const sp_test_call_t *const **ret)
{
    size_t n = 0;
    for (int t = 0; t < w->cfg.threads; t++)
        for (int i = 0; i < w->th[t].ncalls; i++)
            w->all[n++] = &w->th[t].calls[i];
    *ret = w->all;
    return n;
}

size_t sp_test_workload_own(sp_test_workload_t *w, const char *const **ret)
{
    size_t n = 0;
    for (int t = 0; t < w->cfg.threads; t++)
        if (w->th[t].own[0])
            w->own[n++] = w->th[t].own;
    *ret = w->own;
    return n;
}

/* The query that finds call c's fact (the count of its accepted rows). */
static const char *fact_of(const sp_test_call_t *c, char *sql, size_t len)
{
    static const char *const facts[SP_TEST_OP__COUNT] = {"SandboxStarted", "CommandExited",
                                                         "FileWritten",    "SandboxSuspended",
                                                         "SandboxResumed", "SandboxDeleted"};
    const char *what = facts[c->op];
    if (c->op == SP_TEST_OP_COMMAND)
        snprintf(sql, len,
                 "SELECT count(*) FROM events WHERE type = 'CommandExited' AND status = "
                 "'accepted' AND position(convert_to('%s', 'UTF8') in payload) > 0",
                 c->id);
    else if (c->op == SP_TEST_OP_WRITE)
        snprintf(sql, len,
                 "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = "
                 "'FileWritten' AND status = 'accepted' AND position(convert_to('%s', 'UTF8') in "
                 "payload) > 0",
                 c->id, c->path);
    else
        snprintf(sql, len,
                 "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = '%s' AND "
                 "status = 'accepted'",
                 c->id, what);
    return what;
}

int sp_test_workload_check(sp_test_workload_t *w, PGconn *db, sp_test_answers_t answers,
                           int timeout_ms)
{
    const sp_test_call_t *const *all;
    size_t n = sp_test_workload_calls(w, &all);
    int by[SP_TEST_OP__COUNT][6] = {{0}}; /* op x {calls, 2xx, 4xx, 503, none, other 5xx} */
    int64_t slowest = 0;
    int ok = 0;

    for (size_t i = 0; i < n; i++) {
        const sp_test_call_t *c = all[i];
        int *row = by[c->op];
        row[0]++;
        slowest = c->ms > slowest ? c->ms : slowest;
        if (c->rc < 0 && answers != SP_TEST_ANSWERS_ANY)
            fail_msg("%s %s: the exchange failed (%s) after %lld ms", op_names[c->op], c->id,
                     sp_strerror(c->rc), (long long)c->ms);
        if (c->rc >= 0 && c->status >= 200 && c->status < 300) {
            row[1]++;
            ok++;
            /* A command's end is the real one: the worker's, or the log's when the IoExit was
             * lost with a connection; never one the gateway made up at its deadline. */
            if (c->op == SP_TEST_OP_COMMAND && strstr(c->body, "timeout waiting for the worker"))
                fail_msg("command %s answered from the gateway's deadline: %s", c->id, c->body);
            continue;
        }
        if (c->rc < 0)
            row[4]++;
        else if (c->status == 503)
            row[3]++;
        else if (c->status >= 500)
            row[5]++;
        else
            row[2]++;
        if (answers == SP_TEST_ANSWERS_ANY)
            continue;
        if (!c->json_error)
            fail_msg("%s answered %d without a JSON error: %s", op_names[c->op], c->status,
                     c->body);
        if (c->status >= 500 && !(c->status == 503 && answers == SP_TEST_ANSWERS_OUTAGE))
            fail_msg("%s %s answered %d: %s", op_names[c->op], c->id, c->status, c->body);
    }
    for (int op = 0; op < SP_TEST_OP__COUNT; op++)
        if (by[op][0])
            fprintf(stderr,
                    "%-8s %2d calls: %2d 2xx, %2d 4xx, %2d 503, %d other 5xx, %d no answer\n",
                    op_names[op], by[op][0], by[op][1], by[op][2], by[op][3], by[op][5], by[op][4]);
    fprintf(stderr, "slowest answer: %lld ms\n", (long long)slowest);
    if (answers != SP_TEST_ANSWERS_ANY && slowest > w->cfg.client_ms)
        fail_msg("an answer took %lld ms, past the client's %d ms", (long long)slowest,
                 w->cfg.client_ms);

    int64_t t0 = now_ms();
    for (size_t i = 0; i < n; i++) {
        const sp_test_call_t *c = all[i];
        if (c->status < 200 || c->status >= 300)
            continue;
        char sql[512];
        const char *what = fact_of(c, sql, sizeof(sql));
        int64_t left = timeout_ms - (now_ms() - t0);
        if (sp_test_db_wait_scalar(db, sql, 1, left > 2000 ? (int)left : 2000) < 1)
            fail_msg("%s %s answered %d but its %s is not in the log", op_names[c->op], c->id,
                     c->status, what);
    }
    return ok;
}

void sp_test_workload_free(sp_test_workload_t *w)
{
    free(w);
}
