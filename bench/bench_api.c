/* space-bench api: the latency an operator sees from a deployment, over its public /v1 HTTP
 * API alone (no runsc, no database, no NATS here), docs/bench.md.
 *
 * Each iteration is one sandbox's life: create (template chosen), the commands, pause and
 * resume, suspend and resume, delete; each step one timed operation. --concurrency workers
 * run iterations side by side. With --rate the iterations are scheduled open-loop: iteration
 * i is due at i / rate seconds, and its create's latency counts from that moment, not from
 * when a worker got to it; a server that falls behind shows as latency (and queued_ms), not
 * as a lower rate that hides the wait (coordinated omission). Without --rate each worker runs
 * iterations back to back (closed loop).
 *
 * Every sandbox carries metadata space_bench=<run id> and a timeout_s, so it is found and
 * deleted at the end whatever happened to the iteration that made it (a failed operation, a
 * create whose answer never came, SIGINT), and the platform deletes it by itself should this
 * process be killed outright. Failed operations are counted per operation, status and
 * reason; they never stop the run. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "buf.h"
#include "config.h"
#include "error.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"

typedef struct {
    char *api_url;
    char *key_file;
    int64_t concurrency;
    char *rate;
    int64_t count;
    int64_t duration;
    char *template_name;
    char *ops;
    int64_t execs;
    char *cmd;
    char *out;
    int64_t request_timeout_ms;
    int64_t sandbox_timeout;
} api_config_t;

static const sp_cfg_opt_t options[] = {
    SP_CFG_STR_OPT("api-url", api_config_t, api_url, "http://127.0.0.1:8080",
                   "the deployment's API, http://HOST:PORT (space.env's SPACE_API_URL)"),
    SP_CFG_STR_OPT("api-key-file", api_config_t, key_file, NULL,
                   "file holding the API key; else SPACE_API_KEY from the environment"),
    SP_CFG_INT_OPT("concurrency", api_config_t, concurrency, 1, 256, "1",
                   "workers running iterations side by side"),
    SP_CFG_STR_OPT("rate", api_config_t, rate, NULL,
                   "iterations started per second, open loop (may be fractional); none: each "
                   "worker back to back"),
    SP_CFG_INT_OPT("count", api_config_t, count, 0, 1000000, "0",
                   "iterations (sandboxes) in all; 0: --rate x --duration, or 20"),
    SP_CFG_INT_OPT("duration", api_config_t, duration, 0, 86400, "0",
                   "seconds after which no iteration starts; 0: no limit"),
    SP_CFG_STR_OPT("template", api_config_t, template_name, "tiny", "template of the sandboxes"),
    SP_CFG_STR_OPT("ops", api_config_t, ops, "exec,pause,suspend",
                   "between create and delete, in this order: exec (the commands), pause (pause "
                   "+ resume), suspend (suspend + resume); \"none\" for none"),
    SP_CFG_INT_OPT("execs", api_config_t, execs, 1, 1000, "1", "commands per sandbox (exec)"),
    SP_CFG_STR_OPT("cmd", api_config_t, cmd, "echo ok", "the command (exec; exit 0 is success)"),
    SP_CFG_STR_OPT("out", api_config_t, out, "space-bench-api",
                   "writes OUT.json (every sample, the summary) and OUT.svg (the plot)"),
    SP_CFG_INT_OPT("request-timeout-ms", api_config_t, request_timeout_ms, 100, 3600000, "120000",
                   "longest wait for one answer"),
    SP_CFG_INT_OPT("sandbox-timeout", api_config_t, sandbox_timeout, 60, 86400, "1800",
                   "timeout_s of each sandbox: the platform deletes what a killed bench left"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static const char *const op_names[] = {
    "create", "exec", "pause", "resume_paused", "suspend", "resume_suspended", "delete"};
#define N_OPS (sizeof(op_names) / sizeof(op_names[0]))

#define ID_MAX 80

typedef struct {
    bench_ctx_t c; /* the API's address and key, read by every worker */
    double rate;   /* iterations per second; 0: closed loop */
    size_t count;  /* 0: until the duration */
    int64_t duration_ns;
    bool op_exec, op_pause, op_suspend;
    size_t execs;
    char run_id[40];
    char *create_body, *exec_body;
    int64_t t0;
    atomic_size_t next; /* the next iteration */
    atomic_bool stop;   /* SIGINT: no new operation, every sandbox deleted */
    atomic_bool done;
    size_t left; /* sandboxes of this run still listed after the cleanup */
    size_t swept;
    double wall_s;
    pthread_mutex_t mu; /* the two arrays below */
    bench_sample_t *samples;
    size_t n_samples, cap_samples;
    char (*live)[ID_MAX]; /* created and not yet deleted */
    size_t n_live, cap_live;
    char reasons[32][64]; /* transport errors' texts, kept for the samples that point here */
    size_t n_reasons;
    unsigned workers;
} api_run_t;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: space-bench api [options]\n"
            "Latency of a deployment through its /v1 HTTP API only: per iteration one sandbox is\n"
            "created, runs the commands, is paused and resumed, suspended and resumed, and\n"
            "deleted. Prints p50/p90/p99/max per operation and writes OUT.json and OUT.svg.\n"
            "The key: --api-key-file F, or SPACE_API_KEY in the environment (never give it on\n"
            "the command line, where ps shows it).\n"
            "Open loop: with --rate R, iteration i is due at i/R seconds and its create counts\n"
            "from then, not from when a worker was free; a slow server shows as latency (and\n"
            "queued_ms in the JSON), not as a lower rate. Without --rate the workers run back to\n"
            "back (closed loop). Every sandbox is deleted at the end, also after errors or\n"
            "SIGINT (a second SIGINT leaves at once).\n"
            "exit: 0 done (errors are counted, not fatal), 1 could not run or sandboxes left,\n"
            "2 bad usage, 130 interrupted\n\n");
    sp_config_usage(out, "space-bench api", options, N_OPTIONS);
}

/* ---- setup ---- */

/* The key from the file (first line, trailing white space dropped), heap; NULL when it
 * cannot be read or is empty. */
static char *read_key(const char *path)
{
    FILE *f = fopen(path, "r");
    char buf[1024];
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    n = strlen(buf);
    while (n > 0 && (buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        buf[--n] = '\0';
    char *key = n ? sp_xstrdup(buf) : NULL;
    explicit_bzero(buf, sizeof(buf));
    return key;
}

/* A host name in host becomes its first IPv4 address (httpc connects to addresses only). */
static int resolve_host(char *host, size_t len)
{
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) == 1)
        return 0;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return -1;
    const struct sockaddr_in *sin = (const struct sockaddr_in *)res->ai_addr;
    int rc = inet_ntop(AF_INET, &sin->sin_addr, host, (socklen_t)len) ? 0 : -1;
    freeaddrinfo(res);
    return rc;
}

static int parse_ops(api_run_t *r, const char *list)
{
    if (strcmp(list, "none") == 0)
        return 0;
    char *copy = sp_xstrdup(list), *save = NULL;
    int rc = 0;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "exec") == 0)
            r->op_exec = true;
        else if (strcmp(t, "pause") == 0)
            r->op_pause = true;
        else if (strcmp(t, "suspend") == 0)
            r->op_suspend = true;
        else
            rc = -1;
    }
    free(copy);
    return rc;
}

/* ---- the bookkeeping workers share ---- */

static void add_sample(api_run_t *r, const bench_sample_t *s)
{
    pthread_mutex_lock(&r->mu);
    if (r->n_samples == r->cap_samples) {
        r->cap_samples = r->cap_samples ? 2 * r->cap_samples : 256;
        r->samples = sp_xrealloc(r->samples, r->cap_samples * sizeof(*r->samples));
    }
    r->samples[r->n_samples++] = *s;
    pthread_mutex_unlock(&r->mu);
}

static void live_add(api_run_t *r, const char *id)
{
    pthread_mutex_lock(&r->mu);
    if (r->n_live == r->cap_live) {
        r->cap_live = r->cap_live ? 2 * r->cap_live : 64;
        r->live = sp_xrealloc(r->live, r->cap_live * sizeof(*r->live));
    }
    snprintf(r->live[r->n_live++], ID_MAX, "%s", id);
    pthread_mutex_unlock(&r->mu);
}

static void live_remove(api_run_t *r, const char *id)
{
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n_live; i++)
        if (strcmp(r->live[i], id) == 0) {
            memcpy(r->live[i], r->live[--r->n_live], ID_MAX);
            break;
        }
    pthread_mutex_unlock(&r->mu);
}

/* text (sp_strerror's, which may live in the calling thread's buffer) as a string that lives
 * as long as the run. */
static const char *keep_reason(api_run_t *r, const char *text)
{
    const char *kept = "transport error";
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n_reasons; i++)
        if (strncmp(r->reasons[i], text, sizeof(r->reasons[i]) - 1) == 0) {
            kept = r->reasons[i];
            goto out;
        }
    if (r->n_reasons < sizeof(r->reasons) / sizeof(r->reasons[0])) {
        snprintf(r->reasons[r->n_reasons], sizeof(r->reasons[0]), "%s", text);
        kept = r->reasons[r->n_reasons++];
    }
out:
    pthread_mutex_unlock(&r->mu);
    return kept;
}

/* ---- one operation ---- */

typedef struct {
    const char *op;
    const char *method;
    const char *path;
    const char *extra; /* headers */
    const char *body;
    const char *want_state; /* the sandbox's state in the answer, or NULL */
    int want;               /* the status of success */
    bool want_exit0;        /* a command's answer: exit_code 0 */
} op_t;

/* Runs o, counted from from_ns (queued_ns of it spent waiting for a worker); records the
 * sample; true when it succeeded. ret_id (or NULL) gets the answer's id. */
static bool run_op(api_run_t *r, size_t it, const op_t *o, int64_t from_ns, int64_t queued_ns,
                   char ret_id[ID_MAX])
{
    sp_httpc_resp_t resp = {0};
    int rc = bench_http(&r->c, o->method, o->path, o->extra, o->body, &resp);
    int64_t end = sp_mono_ns();
    bench_sample_t s = {.op = o->op,
                        .iteration = it,
                        .start_ms = (double)(from_ns - r->t0) / 1e6,
                        .latency_ms = (double)(end - from_ns) / 1e6,
                        .queued_ms = (double)queued_ns / 1e6,
                        .status = rc < 0 ? 0 : resp.status};
    if (rc < 0) {
        s.error = keep_reason(r, sp_strerror(rc));
    } else if (resp.status != o->want) {
        s.error = "status";
    } else if (o->want_state || o->want_exit0 || ret_id) {
        sp_json_doc_t *doc = NULL;
        char err[SP_JSON_ERR_MAX];
        const sp_json_t *root = NULL;
        if (sp_json_parse(resp.body, resp.body_len, NULL, &doc, err) == 0)
            root = sp_json_root(doc);
        const char *state = sp_json_str(sp_json_get(root, "state"), NULL);
        int64_t code = -1;
        if (!root)
            s.error = "bad answer";
        else if (o->want_state && (!state || strcmp(state, o->want_state) != 0))
            s.error = "state";
        else if (o->want_exit0 &&
                 (sp_json_int(sp_json_get(root, "exit_code"), -1, 255, &code) < 0 || code != 0))
            s.error = "exit";
        if (ret_id) {
            const char *id = sp_json_str(sp_json_get(root, "id"), NULL);
            snprintf(ret_id, ID_MAX, "%s", id && sp_id_valid(id) ? id : "");
            if (!ret_id[0] && !s.error)
                s.error = "bad answer";
        }
        sp_json_doc_free(doc);
    }
    if (rc >= 0)
        sp_httpc_resp_free(&resp);
    add_sample(r, &s);
    return s.error == NULL;
}

/* Sleeps until the monotonic time t; false when the run was stopped meanwhile. */
static bool sleep_until(api_run_t *r, int64_t t)
{
    for (;;) {
        if (atomic_load(&r->stop))
            return false;
        int64_t now = sp_mono_ns(), d = t - now;
        if (d <= 0)
            return true;
        if (d > 50000000)
            d = 50000000; /* a look at the stop flag every 50 ms */
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)d};
        nanosleep(&ts, NULL);
    }
}

/* One sandbox's life; due_ns its scheduled start (0: now). */
static void iteration(api_run_t *r, size_t it, int64_t due_ns)
{
    int64_t now = sp_mono_ns();
    int64_t from = due_ns ? due_ns : now, queued = due_ns && now > due_ns ? now - due_ns : 0;
    char id[ID_MAX] = "", path[160], cmds[200];
    op_t create = {.op = "create",
                   .method = "POST",
                   .path = "/v1/sandboxes",
                   .body = r->create_body,
                   .want = 201,
                   .want_state = "running"};
    bool ok = run_op(r, it, &create, from, queued, id);
    if (!id[0])
        return; /* nothing to delete here; the sweep finds what a lost answer made */
    live_add(r, id);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    snprintf(cmds, sizeof(cmds), "/v1/sandboxes/%s/commands", id);
    char *pause = sp_xasprintf("%s/pause", path), *resume = sp_xasprintf("%s/resume", path),
         *suspend = sp_xasprintf("%s/suspend", path);
    const op_t steps[] = {
        {"exec", "POST", cmds, "Accept: application/json\r\n", r->exec_body, NULL, 200, true},
        {"pause", "POST", pause, NULL, NULL, "paused", 200, false},
        {"resume_paused", "POST", resume, NULL, NULL, "running", 200, false},
        {"suspend", "POST", suspend, NULL, NULL, "suspended", 200, false},
        {"resume_suspended", "POST", resume, NULL, NULL, "running", 200, false},
    };
    /* After a failure the rest of the life is skipped (a resume after a failed pause only
     * measures the refusal); the delete always runs. */
    for (size_t k = 0; ok && r->op_exec && k < r->execs && !atomic_load(&r->stop); k++)
        ok = run_op(r, it, &steps[0], sp_mono_ns(), 0, NULL);
    for (size_t k = 1; ok && r->op_pause && k <= 2 && !atomic_load(&r->stop); k++)
        ok = run_op(r, it, &steps[k], sp_mono_ns(), 0, NULL);
    for (size_t k = 3; ok && r->op_suspend && k <= 4 && !atomic_load(&r->stop); k++)
        ok = run_op(r, it, &steps[k], sp_mono_ns(), 0, NULL);
    op_t del = {.op = "delete", .method = "DELETE", .path = path, .want = 204};
    if (run_op(r, it, &del, sp_mono_ns(), 0, NULL))
        live_remove(r, id);
    free(pause);
    free(resume);
    free(suspend);
}

static void *worker_main(void *arg)
{
    api_run_t *r = arg;
    while (!atomic_load(&r->stop)) {
        size_t i = atomic_fetch_add(&r->next, 1);
        if (r->count && i >= r->count)
            break;
        int64_t due = 0;
        if (r->rate > 0) {
            due = r->t0 + (int64_t)((double)i * 1e9 / r->rate);
            if (r->duration_ns && due - r->t0 >= r->duration_ns)
                break;
            if (!sleep_until(r, due))
                break;
        } else if (r->duration_ns && sp_mono_ns() - r->t0 >= r->duration_ns) {
            break;
        }
        iteration(r, i, due);
    }
    return NULL;
}

/* ---- the end: every sandbox of this run deleted ---- */

static void delete_quiet(api_run_t *r, const char *id)
{
    char path[160];
    sp_httpc_resp_t resp;
    snprintf(path, sizeof(path), "/v1/sandboxes/%.79s", id);
    if (bench_http(&r->c, "DELETE", path, NULL, NULL, &resp) == 0)
        sp_httpc_resp_free(&resp);
}

/* The ids of this run's sandboxes the API lists (first 100) into ids; how many, or -1 when
 * the list cannot be had. */
static int list_own(api_run_t *r, char (*ids)[ID_MAX], int max)
{
    char path[200];
    sp_httpc_resp_t resp;
    snprintf(path, sizeof(path), "/v1/sandboxes?metadata.space_bench=%s&limit=%d", r->run_id, max);
    if (bench_http(&r->c, "GET", path, NULL, NULL, &resp) < 0)
        return -1;
    int n = -1;
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (resp.status == 200 && sp_json_parse(resp.body, resp.body_len, NULL, &doc, err) == 0) {
        const sp_json_t *list = sp_json_get(sp_json_root(doc), "sandboxes");
        n = 0;
        for (size_t i = 0; i < sp_json_len(list) && n < max; i++) {
            const char *id = sp_json_str(sp_json_get(sp_json_at(list, i), "id"), NULL);
            if (id && sp_id_valid(id))
                snprintf(ids[n++], ID_MAX, "%s", id);
        }
    }
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&resp);
    return n;
}

static void sweep(api_run_t *r)
{
    /* What the iterations made and could not delete, then whatever the API still lists
     * under this run's id (a create answered after its timeout here, a delete refused). */
    for (size_t i = 0; i < r->n_live; i++) {
        delete_quiet(r, r->live[i]);
        r->swept++;
    }
    /* A create that got no answer may still be running on the server: then the list must
     * stay empty for a few seconds before this run's sandboxes count as gone. */
    int unanswered = 0;
    for (size_t i = 0; i < r->n_samples; i++)
        unanswered += strcmp(r->samples[i].op, "create") == 0 && r->samples[i].status == 0;
    char ids[100][ID_MAX];
    int n = -1, quiet = 0;
    for (int round = 0; round < 60; round++) {
        n = list_own(r, ids, 100);
        if (n == 0 && ++quiet >= (unanswered ? 5 : 1))
            break;
        if (n > 0)
            quiet = 0;
        for (int i = 0; i < n; i++) {
            delete_quiet(r, ids[i]);
            r->swept++;
        }
        sleep(1);
    }
    r->left = n < 0 ? r->n_live : (size_t)n;
}

static void *runner_main(void *arg)
{
    api_run_t *r = arg;
    pthread_t *t = sp_xcalloc(r->workers, sizeof(*t));
    r->t0 = sp_mono_ns();
    for (unsigned i = 0; i < r->workers; i++)
        pthread_create(&t[i], NULL, worker_main, r);
    for (unsigned i = 0; i < r->workers; i++)
        pthread_join(t[i], NULL);
    r->wall_s = (double)(sp_mono_ns() - r->t0) / 1e9;
    free(t);
    sweep(r);
    atomic_store(&r->done, true);
    return NULL;
}

/* Waits for the runner with SIGINT and SIGTERM blocked in every thread; the first stops the
 * run (the cleanup still runs), the second leaves at once. 1 when interrupted. */
static int wait_runner(api_run_t *r, const sigset_t *set)
{
    int interrupted = 0;
    while (!atomic_load(&r->done)) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 200000000};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig < 0)
            continue;
        if (interrupted++) {
            fprintf(stderr,
                    "space-bench: interrupted again: sandboxes of this run may be left; list "
                    "them with GET /v1/sandboxes?metadata.space_bench=%s\n",
                    r->run_id);
            _exit(130);
        }
        fprintf(stderr,
                "space-bench: interrupted: finishing the requests in flight and deleting the "
                "sandboxes of run %s (again to leave at once)\n",
                r->run_id);
        atomic_store(&r->stop, true);
    }
    return interrupted ? 1 : 0;
}

/* The preflight: the key is taken and the template offered; a message and -1 otherwise. */
static int preflight(api_run_t *r, const char *template_name)
{
    sp_httpc_resp_t resp;
    int rc = bench_http(&r->c, "GET", "/v1/templates", NULL, NULL, &resp);
    if (rc < 0) {
        fprintf(stderr, "space-bench: the API at %s:%d: %s\n", r->c.api_host, r->c.api_port,
                sp_strerror(rc));
        return -1;
    }
    int ret = 0;
    if (resp.status == 401 || resp.status == 403) {
        fprintf(stderr, "space-bench: the API refused the key (%d)\n", resp.status);
        ret = -1;
    } else if (resp.status != 200) {
        fprintf(stderr, "space-bench: GET /v1/templates answered %d\n", resp.status);
        ret = -1;
    } else {
        sp_json_doc_t *doc = NULL;
        char err[SP_JSON_ERR_MAX];
        bool found = false;
        if (sp_json_parse(resp.body, resp.body_len, NULL, &doc, err) == 0) {
            const sp_json_t *list = sp_json_get(sp_json_root(doc), "templates");
            for (size_t i = 0; i < sp_json_len(list); i++) {
                const char *name = sp_json_str(sp_json_get(sp_json_at(list, i), "name"), NULL);
                found |= name && strcmp(name, template_name) == 0;
            }
        }
        sp_json_doc_free(doc);
        if (!found) {
            fprintf(stderr,
                    "space-bench: no live worker offers template '%s' (GET "
                    "/v1/templates)\n",
                    template_name);
            ret = -1;
        }
    }
    sp_httpc_resp_free(&resp);
    return ret;
}

static char *run_json(const api_run_t *r, const api_config_t *cfg, int interrupted)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"run_id\":");
    sp_buf_json_str(&b, r->run_id);
    sp_buf_puts(&b, ",\"api_url\":");
    sp_buf_json_str(&b, cfg->api_url);
    sp_buf_puts(&b, ",\"template\":");
    sp_buf_json_str(&b, cfg->template_name);
    sp_buf_printf(&b, ",\"concurrency\":%u,\"rate\":", r->workers);
    if (r->rate > 0)
        sp_buf_printf(&b, "%.3f", r->rate);
    else
        sp_buf_puts(&b, "null");
    sp_buf_printf(&b, ",\"count\":%zu,\"duration_s\":%.3f,\"ops\":", r->count,
                  (double)r->duration_ns / 1e9);
    sp_buf_json_str(&b, cfg->ops);
    sp_buf_printf(&b, ",\"execs\":%zu,\"cmd\":", r->execs);
    sp_buf_json_str(&b, cfg->cmd);
    size_t creates = 0;
    for (size_t i = 0; i < r->n_samples; i++)
        creates += strcmp(r->samples[i].op, "create") == 0;
    sp_buf_printf(&b, ",\"iterations\":%zu,\"interrupted\":%s,\"sandboxes_left\":%zu}", creates,
                  interrupted ? "true" : "false", r->left);
    return sp_buf_take(&b);
}

static void report(api_run_t *r, const api_config_t *cfg, int interrupted, int *code)
{
    /* The achieved rate of starts: creates actually sent (due time + wait for a worker) over
     * the time until the last of them, against the schedule's. */
    size_t creates = 0;
    double queued_max = 0, last_start = 0;
    for (size_t i = 0; i < r->n_samples; i++)
        if (strcmp(r->samples[i].op, "create") == 0) {
            creates++;
            double at = r->samples[i].start_ms + r->samples[i].queued_ms;
            if (at > last_start)
                last_start = at;
            if (r->samples[i].queued_ms > queued_max)
                queued_max = r->samples[i].queued_ms;
        }
    printf("\n%zu iterations, the last started at %.1f s", creates, last_start / 1000);
    if (creates > 1 && last_start > 0)
        printf(": %.2f starts/s", (double)(creates - 1) / (last_start / 1000));
    if (r->rate > 0)
        printf(" (target %.2f/s; longest wait for a free worker %.1f ms)", r->rate, queued_max);
    printf("; run %.1f s\n\n", r->wall_s);
    bench_report_table(stdout, op_names, N_OPS, r->samples, r->n_samples, r->wall_s);
    printf("\ncleanup: %zu delete(s) of this run's sandboxes after the run, %zu left\n", r->swept,
           r->left);

    char *json = run_json(r, cfg, interrupted);
    char *jpath = sp_xasprintf("%s.json", cfg->out), *spath = sp_xasprintf("%s.svg", cfg->out);
    sp_buf_t title;
    sp_buf_init(&title);
    sp_buf_printf(&title, "space-bench api %s: template %s, %u workers, ", cfg->api_url,
                  cfg->template_name, r->workers);
    if (r->rate > 0)
        sp_buf_printf(&title, "open loop at %.2f/s", r->rate);
    else
        sp_buf_puts(&title, "closed loop");
    if (bench_report_json(jpath, json, op_names, N_OPS, r->samples, r->n_samples, r->wall_s) < 0 ||
        bench_report_svg(spath, title.data, op_names, N_OPS, r->samples, r->n_samples, r->wall_s) <
            0) {
        fprintf(stderr, "space-bench: cannot write %s / %s\n", jpath, spath);
        *code = 1;
    } else {
        printf("wrote %s and %s\n", jpath, spath);
    }
    sp_buf_dispose(&title);
    free(jpath);
    free(spath);
    free(json);
}

int bench_api(int argc, char **argv, const char *global_key)
{
    api_config_t cfg = {0};
    api_run_t r = {0};
    char *err = NULL, *key = NULL;
    int argi = 0, code = 1;

    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
    if (sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err) < 0 || argi != argc) {
        fprintf(stderr, "space-bench api: %s\n", err ? err : "unexpected arguments");
        usage(stderr);
        code = 2;
        goto out;
    }
    char *end = NULL;
    if (cfg.rate[0]) {
        r.rate = strtod(cfg.rate, &end);
        if (!end || *end || !(r.rate > 0 && r.rate <= 10000)) {
            fprintf(stderr, "space-bench api: --rate: a number of starts per second, above 0 "
                            "and at most 10000\n");
            code = 2;
            goto out;
        }
    }
    if (parse_ops(&r, cfg.ops) < 0) {
        fprintf(stderr, "space-bench api: --ops: exec, pause, suspend or none\n");
        code = 2;
        goto out;
    }
    if (cfg.key_file[0]) {
        if (!(key = read_key(cfg.key_file))) {
            fprintf(stderr, "space-bench api: cannot read a key from %s\n", cfg.key_file);
            goto out;
        }
    } else if (global_key && global_key[0]) {
        key = sp_xstrdup(global_key);
    } else {
        fprintf(stderr, "space-bench api: no key: --api-key-file F or SPACE_API_KEY\n");
        code = 2;
        goto out;
    }
    if (sp_httpc_parse_url(cfg.api_url, r.c.api_host, sizeof(r.c.api_host), &r.c.api_port) < 0 ||
        resolve_host(r.c.api_host, sizeof(r.c.api_host)) < 0) {
        fprintf(stderr, "space-bench api: --api-url: http://HOST:PORT with a host that resolves "
                        "to IPv4 (no TLS here)\n");
        code = 2;
        goto out;
    }
    r.c.api_key = key;
    r.c.timeout_ms = (int)cfg.request_timeout_ms;
    r.workers = (unsigned)cfg.concurrency;
    r.execs = (size_t)cfg.execs;
    r.duration_ns = cfg.duration * 1000000000LL;
    r.count = (size_t)cfg.count;
    if (!r.count && r.rate > 0 && cfg.duration)
        r.count = (size_t)(r.rate * (double)cfg.duration + 0.5);
    if (!r.count && !cfg.duration)
        r.count = 20;
    snprintf(r.run_id, sizeof(r.run_id), "b%llx-%d", (unsigned long long)time(NULL), getpid());
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"template\":");
    sp_buf_json_str(&b, cfg.template_name);
    sp_buf_printf(&b, ",\"timeout_s\":%lld,\"metadata\":{\"space_bench\":\"%s\"}}",
                  (long long)cfg.sandbox_timeout, r.run_id);
    r.create_body = sp_buf_take(&b);
    sp_buf_puts(&b, "{\"cmd\":");
    sp_buf_json_str(&b, cfg.cmd);
    sp_buf_putc(&b, '}');
    r.exec_body = sp_buf_take(&b);
    sp_buf_dispose(&b);
    if (preflight(&r, cfg.template_name) < 0)
        goto out;

    printf("space-bench api: %s, template %s, %u worker(s), ", cfg.api_url, cfg.template_name,
           r.workers);
    if (r.rate > 0)
        printf("open loop at %.2f iterations/s (latency from each scheduled start)", r.rate);
    else
        printf("closed loop");
    if (r.count)
        printf(", %zu iterations", r.count);
    if (cfg.duration)
        printf(", at most %lld s", (long long)cfg.duration);
    printf("; run %s\n", r.run_id);
    fflush(stdout);

    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    pthread_mutex_init(&r.mu, NULL);
    pthread_t runner;
    pthread_create(&runner, NULL, runner_main, &r);
    int interrupted = wait_runner(&r, &set);
    pthread_join(runner, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_mutex_destroy(&r.mu);

    code = 0;
    report(&r, &cfg, interrupted, &code);
    if (r.left) {
        fprintf(stderr,
                "space-bench: %zu sandbox(es) of this run still listed: GET "
                "/v1/sandboxes?metadata.space_bench=%s\n",
                r.left, r.run_id);
        code = 1;
    }
    if (interrupted)
        code = 130;
out:
    if (key) {
        explicit_bzero(key, strlen(key));
        free(key);
    }
    free(r.samples);
    free(r.live);
    free(r.create_body);
    free(r.exec_body);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return code;
}
