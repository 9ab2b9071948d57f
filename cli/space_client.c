/* `space create | ls | rm | exec | cp` (cp: space_cp.c): the API from a terminal or a script,
 * through the gateway named in $SPACE_HOME/space.env (or SPACE_API_URL and SPACE_API_KEY in
 * the environment). exec streams the command's output as it comes (the SSE of POST
 * .../commands) and exits with its exit code (128 + signal when killed), so scripts can use it
 * like a local command. */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "b64.h"
#include "buf.h"
#include "config.h"
#include "error.h"
#include "httpc.h"
#include "json.h"
#include "space_stack.h"
#include "sse.h"
#include "xmalloc.h"

typedef struct {
    char host[64];
    int port;
    const char *key;
} api_t;

static int api_open(const sp_stack_config_t *cfg, api_t *api)
{
    char home[PATH_MAX];
    if (!getenv("SPACE_API_URL") && realpath(cfg->home, home)) {
        char *env = sp_xasprintf("%s/space.env", home);
        sp_env_file_export(env);
        free(env);
    }
    const char *url = getenv("SPACE_API_URL");
    api->key = getenv("SPACE_API_KEY");
    if (!url || !api->key ||
        sp_httpc_parse_url(url, api->host, sizeof(api->host), &api->port) < 0) {
        fprintf(stderr, "space: no API: set SPACE_API_URL and SPACE_API_KEY, or run `space up`\n");
        return -1;
    }
    return 0;
}

static int call(const api_t *api, const char *method, const char *path, const char *accept,
                const char *body, sp_httpc_resp_t *r)
{
    char *extra = accept ? sp_xasprintf("Accept: %s\r\n", accept) : NULL;
    sp_httpc_req_t req = {.host = api->host,
                          .port = api->port,
                          .method = method,
                          .path = path,
                          .key = api->key,
                          .extra_headers = extra,
                          .body = body,
                          .body_len = body ? strlen(body) : 0,
                          .timeout_ms = 24 * 3600 * 1000};
    int rc = sp_httpc_do(&req, r);
    free(extra);
    if (rc < 0)
        fprintf(stderr, "space: %s %s: %s\n", method, path, sp_strerror(rc));
    return rc;
}

/* Prints the API's error message for a failed answer. */
static int api_error(const sp_httpc_resp_t *r)
{
    fprintf(stderr, "space: HTTP %d: %s\n", r->status, r->body);
    return SP_STACK_EXIT_FAIL;
}

static const char *field(const sp_json_t *o, const char *name)
{
    const char *s = sp_json_str(sp_json_get(o, name), NULL);
    return s ? s : "-";
}

static int cmd_create(const api_t *api, int argc, char **argv)
{
    sp_buf_t body;
    sp_httpc_resp_t r;
    sp_buf_init(&body);
    sp_buf_puts(&body, "{\"template\":");
    sp_buf_json_str(&body, argc > 0 ? argv[0] : "tiny");
    sp_buf_putc(&body, '}');
    int rc = call(api, "POST", "/v1/sandboxes", NULL, body.data, &r);
    sp_buf_dispose(&body);
    if (rc < 0)
        return SP_STACK_EXIT_FAIL;
    int code = SP_STACK_EXIT_OK;
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (r.status != 201 || sp_json_parse(r.body, r.body_len, NULL, &doc, err) < 0)
        code = api_error(&r);
    else
        printf("%s\n", field(sp_json_root(doc), "id"));
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    return code;
}

static int cmd_ls(const api_t *api)
{
    sp_httpc_resp_t r;
    if (call(api, "GET", "/v1/sandboxes?limit=1000", NULL, NULL, &r) < 0)
        return SP_STACK_EXIT_FAIL;
    int code = SP_STACK_EXIT_OK;
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (r.status != 200 || sp_json_parse(r.body, r.body_len, NULL, &doc, err) < 0) {
        code = api_error(&r);
    } else {
        const sp_json_t *list = sp_json_get(sp_json_root(doc), "sandboxes");
        printf("%-32s %-10s %-10s %-12s %s\n", "ID", "STATE", "TEMPLATE", "WORKER", "CREATED");
        for (size_t i = 0; i < sp_json_len(list); i++) {
            const sp_json_t *s = sp_json_at(list, i);
            printf("%-32s %-10s %-10s %-12s %s\n", field(s, "id"), field(s, "state"),
                   field(s, "template"), field(s, "worker"), field(s, "created_at"));
        }
    }
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    return code;
}

static int cmd_rm(const api_t *api, int argc, char **argv)
{
    int code = SP_STACK_EXIT_OK;
    if (argc < 1) {
        fprintf(stderr, "usage: space rm ID...\n");
        return SP_STACK_EXIT_USAGE;
    }
    for (int i = 0; i < argc; i++) {
        char *path = sp_xasprintf("/v1/sandboxes/%s", argv[i]);
        sp_httpc_resp_t r;
        if (call(api, "DELETE", path, NULL, NULL, &r) < 0)
            code = SP_STACK_EXIT_FAIL;
        else if (r.status != 204)
            code = api_error(&r);
        if (r.headers)
            sp_httpc_resp_free(&r);
        free(path);
    }
    return code;
}

/* ---- exec: the command's SSE stream, printed as it comes ---- */

typedef struct {
    bool exited;
    int64_t exit_code, signal;
    char error[256];
    bool bad; /* an event that could not be read */
} exec_state_t;

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* a closed pipe: the output has nowhere to go */
        p += w;
        n -= (size_t)w;
    }
}

static int on_exec_event(void *arg, const sp_sse_event_t *ev)
{
    exec_state_t *st = arg;
    bool out = strcmp(ev->event, "stdout") == 0, err = strcmp(ev->event, "stderr") == 0;
    bool exit_ev = strcmp(ev->event, "exit") == 0;
    if (!out && !err && !exit_ev)
        return 0; /* start, and whatever a newer gateway adds */
    sp_json_doc_t *doc = NULL;
    char jerr[SP_JSON_ERR_MAX];
    sp_json_limits_t lim = {.max_bytes = ev->data_len + 1, .max_string = ev->data_len + 1};
    if (sp_json_parse(ev->data, ev->data_len, &lim, &doc, jerr) < 0) {
        st->bad = true;
        return 0;
    }
    const sp_json_t *root = sp_json_root(doc);
    if (exit_ev) {
        st->exited = true;
        sp_json_int(sp_json_get(root, "exit_code"), -1, 255, &st->exit_code);
        sp_json_int(sp_json_get(root, "signal"), 0, 127, &st->signal);
        const char *e = sp_json_str(sp_json_get(root, "error"), NULL);
        snprintf(st->error, sizeof(st->error), "%s", e ? e : "");
        bool lost = false, truncated = false;
        sp_json_bool(sp_json_get(root, "output_lost"), &lost);
        sp_json_bool(sp_json_get(root, "truncated"), &truncated);
        if (lost || truncated)
            fprintf(stderr, "space exec: output %s\n", lost ? "lost in part" : "truncated");
    } else {
        size_t n = 0;
        const char *text = sp_json_str(sp_json_get(root, "text"), &n);
        const char *b64 = sp_json_str(sp_json_get(root, "b64"), &n);
        uint8_t *bytes = NULL;
        if (text) {
            write_all(out ? 1 : 2, text, n);
        } else if (b64 && sp_b64_decode(b64, n, &bytes, &n) == 0) {
            write_all(out ? 1 : 2, (const char *)bytes, n);
            free(bytes);
        } else {
            st->bad = true;
        }
    }
    sp_json_doc_free(doc);
    return 0;
}

static int on_exec_data(void *arg, const char *data, size_t len)
{
    return sp_sse_feed(arg, data, len);
}

static int cmd_exec(const api_t *api, int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: space exec ID [--] COMMAND [ARG...]\n");
        return SP_STACK_EXIT_USAGE;
    }
    int first = strcmp(argv[1], "--") == 0 ? 2 : 1;
    if (first >= argc) {
        fprintf(stderr, "usage: space exec ID [--] COMMAND [ARG...]\n");
        return SP_STACK_EXIT_USAGE;
    }
    sp_buf_t body;
    sp_buf_init(&body);
    sp_buf_puts(&body, "{\"argv\":[");
    for (int i = first; i < argc; i++) {
        if (i > first)
            sp_buf_putc(&body, ',');
        sp_buf_json_str(&body, argv[i]);
    }
    sp_buf_puts(&body, "],\"timeout_s\":86400}");
    char *path = sp_xasprintf("/v1/sandboxes/%s/commands", argv[0]);
    exec_state_t st = {.exit_code = -1};
    sp_sse_reader_t sse;
    sp_sse_init(&sse, on_exec_event, &st);
    sp_httpc_req_t req = {.host = api->host,
                          .port = api->port,
                          .method = "POST",
                          .path = path,
                          .key = api->key,
                          .extra_headers = "Accept: text/event-stream\r\n",
                          .body = body.data,
                          .body_len = body.len};
    sp_httpc_resp_t r;
    int rc = sp_httpc_stream(&req, &r, on_exec_data, &sse);
    sp_sse_dispose(&sse);
    free(path);
    sp_buf_dispose(&body);

    int code;
    if (r.headers && (r.status < 200 || r.status > 299)) {
        code = api_error(&r);
    } else if (rc < 0 || !st.exited) {
        fprintf(stderr, "space exec: the stream ended before the command did%s%s\n",
                rc < 0 ? ": " : "", rc < 0 ? sp_strerror(rc) : "");
        code = SP_STACK_EXIT_FAIL;
    } else {
        if (st.error[0])
            fprintf(stderr, "space exec: %s\n", st.error);
        if (st.bad)
            fprintf(stderr, "space exec: some output could not be decoded\n");
        code = st.signal           ? 128 + (int)st.signal
               : st.exit_code >= 0 ? (int)st.exit_code
                                   : SP_STACK_EXIT_FAIL;
    }
    sp_httpc_resp_free(&r);
    return code;
}

int sp_client_main(const sp_stack_config_t *cfg, const char *cmd, int argc, char **argv)
{
    api_t api;
    if (api_open(cfg, &api) < 0)
        return SP_STACK_EXIT_FAIL;
    fflush(stdout);
    if (strcmp(cmd, "create") == 0)
        return cmd_create(&api, argc, argv);
    if (strcmp(cmd, "ls") == 0)
        return cmd_ls(&api);
    if (strcmp(cmd, "rm") == 0)
        return cmd_rm(&api, argc, argv);
    if (strcmp(cmd, "cp") == 0)
        return sp__client_cp(api.host, api.port, api.key, argc, argv);
    if (strcmp(cmd, "events") == 0)
        return sp__client_events(api.host, api.port, api.key, argc, argv);
    if (strcmp(cmd, "creds") == 0)
        return sp__client_creds(api.host, api.port, api.key, argc, argv);
    return cmd_exec(&api, argc, argv);
}
