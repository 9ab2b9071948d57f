/* `space create | ls | rm | exec | cp` (cp: space_cp.c): the API from a terminal or a script,
 * through the gateway named in $SPACE_HOME/space.env (or SPACE_API_URL and SPACE_API_KEY in
 * the environment).
 * exec waits for the command and exits with its exit code (128 + signal when killed), so
 * scripts can use it like a local command; its output is printed once the command ends
 * (streaming as it comes is the next step). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "config.h"
#include "error.h"
#include "httpc.h"
#include "json.h"
#include "space_stack.h"
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

/* Writes a JSON answer's stream: the text field, or its base64 twin for binary output. */
static void print_stream(const sp_json_t *root, const char *name, FILE *out)
{
    size_t n = 0;
    const char *s = sp_json_str(sp_json_get(root, name), &n);
    if (s)
        fwrite(s, 1, n, out);
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
    sp_buf_puts(&body, "]}");
    char *path = sp_xasprintf("/v1/sandboxes/%s/commands", argv[0]);
    sp_httpc_resp_t r;
    int rc = call(api, "POST", path, "application/json", body.data, &r);
    free(path);
    sp_buf_dispose(&body);
    if (rc < 0)
        return SP_STACK_EXIT_FAIL;

    int code;
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    sp_json_limits_t lim = {.max_bytes = 64u << 20, .max_string = 32u << 20};
    if (r.status != 200 || sp_json_parse(r.body, r.body_len, &lim, &doc, err) < 0) {
        code = api_error(&r);
    } else {
        const sp_json_t *root = sp_json_root(doc);
        int64_t exit_code = -1, sig = 0;
        print_stream(root, "stdout", stdout);
        print_stream(root, "stderr", stderr);
        sp_json_int(sp_json_get(root, "exit_code"), -1, 255, &exit_code);
        sp_json_int(sp_json_get(root, "signal"), 0, 127, &sig);
        const char *error = sp_json_str(sp_json_get(root, "error"), NULL);
        if (error && *error)
            fprintf(stderr, "space exec: %s\n", error);
        code = sig ? 128 + (int)sig : exit_code >= 0 ? (int)exit_code : SP_STACK_EXIT_FAIL;
    }
    sp_json_doc_free(doc);
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
    return cmd_exec(&api, argc, argv);
}
