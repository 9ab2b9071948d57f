/* `space create | ls | rm | exec | cp | events | creds | keys` (exec, cp, events, creds and keys
 * each in its own space_<command>.c): the API from a terminal or a script, through the gateway
 * named in $SPACE_HOME/space.env (or SPACE_API_URL and SPACE_API_KEY in the environment). Every
 * request goes through sp__api_call here, so the connection setup and the error report are
 * written once. Each command has its own usage (--help), and every listing takes --json: the
 * API's answer as it came, for scripts (jq). */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "config.h"
#include "error.h"
#include "httpc.h"
#include "json.h"
#include "space_stack.h"
#include "sse.h"
#include "xmalloc.h"

#define DAY_MS (24 * 3600 * 1000)

static const struct {
    const char *cmd, *usage;
} USAGES[] = {
    {"create", "usage: space create [TEMPLATE] [--template T] [--timeout S] [--metadata K=V]...\n"
               "                    [--env K=V]... [--allow ENTRY]... [--deny ENTRY]...\n"
               "                    [--network deny_all|allow_all|allowlist] [--json]\n"
               "  Creates a sandbox (default template tiny) and prints its id once it runs.\n"
               "  --timeout S     seconds until it is deleted (0: none; the API's default 300)\n"
               "  --metadata K=V  a metadata entry (repeatable; `space ls` filters need them)\n"
               "  --env K=V       an environment variable of every command (repeatable);\n"
               "                  --env K alone: the value of K here (kept out of argv)\n"
               "  --allow ENTRY   egress allowed to ENTRY (name, *.name, IPv4 CIDR, [:port]);\n"
               "                  any --allow makes the policy an allowlist\n"
               "  --deny ENTRY    egress denied to ENTRY; --deny alone means allow_all minus\n"
               "                  the denied entries\n"
               "  --network MODE  the policy mode, said explicitly (docs/egress.md)\n"
               "  --json          print the sandbox as the API answered it\n"},
    {"ls", "usage: space ls [--state S] [--metadata K=V]... [--json]\n"
           "  Lists your sandboxes: ID, STATE, TEMPLATE, WORKER, CREATED (aligned columns).\n"
           "  --json prints the API's answer ({\"sandboxes\": [...]}).\n"},
    {"rm", "usage: space rm ID...\n  Deletes sandboxes (each answered once its resources are "
           "released).\n"},
    {"exec",
     "usage: space exec [--home H] ID [options] [--] CMD [ARG...]\n"
     "  Runs CMD in sandbox ID, streams its output, exits with its exit code (128 + signal).\n"
     "  stdin is forwarded (with its EOF) unless it is a terminal; -t forwards the terminal.\n"
     "  --env K=V       environment variable of the command (repeatable); --env K alone:\n"
     "                  the value of K here (so it is not in argv for ps to show)\n"
     "  --cwd DIR       working directory\n"
     "  --user U        root (default) or user\n"
     "  --timeout S     kill the command after S seconds (default 86400)\n"
     "  -t, --tty       run on a pseudo-terminal of the local terminal's size, resized with it\n"
     "                  (the local terminal in raw mode meanwhile)\n"
     "  -n, --no-stdin  do not forward stdin (the command reads EOF)\n"},
    {"cp", "usage: space cp [-r] LOCAL ID:PATH    upload\n"
           "       space cp [-r] ID:PATH LOCAL    download\n"
           "  -r  a directory and everything under it (its contents land in the destination,\n"
           "      which is created); walked with the files API, one request per file\n"
           "  A progress bar goes to stderr when it is a terminal (transfers over 1 MiB).\n"},
    {"events", "usage: space events [--follow|-f] [--json] [ID]\n"
               "  The event log (of one sandbox), one line per event; --follow keeps waiting;\n"
               "  --json: each event as the API sent it, one JSON object a line.\n"},
    {"creds",
     "usage: space creds add NAME HOST[,HOST...] TYPE [project=P|sandbox=ID] [rate=N]\n"
     "                       [expires=YYYY-MM-DDTHH:MM:SSZ]   (the value on stdin)\n"
     "         TYPE: header:NAME | bearer | basic:USER | query:PARAM\n"
     "       space creds ls [--json] | rm ID | rotate ID   (rotate: the new value on stdin)\n"
     "       space creds rotate-master   (a new master key; credstore re-wraps while serving)\n"},
    {"keys", "usage: space keys create --tenant T [--name N] [--admin]   (prints the key)\n"
             "       space keys ls [--tenant T] [--json]\n"
             "       space keys revoke [--] ID\n"},
};

bool sp_client_usage(const char *cmd, FILE *out)
{
    for (size_t i = 0; i < sizeof(USAGES) / sizeof(USAGES[0]); i++)
        if (strcmp(USAGES[i].cmd, cmd) == 0) {
            fputs(USAGES[i].usage, out);
            return true;
        }
    return false;
}

static int usage_error(const char *cmd)
{
    sp_client_usage(cmd, stderr);
    return SP_STACK_EXIT_USAGE;
}

static int api_open(const sp_stack_config_t *cfg, sp_api_t *api)
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

int sp__api_call(const sp_api_t *api, const char *method, const char *path, const char *accept,
                 const char *body, size_t body_len, int timeout_ms, sp_httpc_resp_t *r)
{
    char *extra = accept ? sp_xasprintf("Accept: %s\r\n", accept) : NULL;
    sp_httpc_req_t req = {.host = api->host,
                          .port = api->port,
                          .method = method,
                          .path = path,
                          .key = api->key,
                          .extra_headers = extra,
                          .body = body,
                          .body_len = body ? body_len : 0,
                          .timeout_ms = timeout_ms ? timeout_ms : DAY_MS};
    int rc = sp_httpc_do(&req, r);
    free(extra);
    if (rc < 0)
        fprintf(stderr, "space: %s %s: %s\n", method, path, sp_strerror(rc));
    return rc;
}

static int on_sse_data(void *arg, const char *data, size_t len)
{
    return sp_sse_feed(arg, data, len);
}

int sp__api_sse(const sp_api_t *api, const char *method, const char *path, const char *body,
                size_t body_len, int idle_ms, sp_sse_fn fn, void *arg, sp_httpc_resp_t *r)
{
    sp_sse_reader_t sse;
    sp_sse_init(&sse, fn, arg);
    sp_httpc_req_t req = {.host = api->host,
                          .port = api->port,
                          .method = method,
                          .path = path,
                          .key = api->key,
                          .extra_headers = "Accept: text/event-stream\r\n",
                          .body = body,
                          .body_len = body ? body_len : 0,
                          .timeout_ms = idle_ms};
    int rc = sp_httpc_stream(&req, r, on_sse_data, &sse);
    sp_sse_dispose(&sse);
    return rc;
}

int sp__api_error(const char *who, const sp_httpc_resp_t *r)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    const char *msg = NULL;
    if (r->body && sp_json_parse(r->body, r->body_len, NULL, &doc, err) == 0)
        msg = sp_json_str(sp_json_get(sp_json_root(doc), "message"), NULL);
    fprintf(stderr, "%s: HTTP %d: %s\n", who, r->status, msg ? msg : r->body ? r->body : "");
    sp_json_doc_free(doc);
    return SP_STACK_EXIT_FAIL;
}

const char *sp__opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0' || *i + 1 >= argc || !argv[*i + 1])
        return NULL;
    *i += 1;
    return argv[*i];
}

static const char *field(const sp_json_t *o, const char *name)
{
    const char *s = sp_json_str(sp_json_get(o, name), NULL);
    return s && s[0] ? s : "-";
}

int sp__put_map(sp_buf_t *b, const char *name, char **list, size_t n, bool from_env)
{
    if (!n)
        return 0;
    sp_buf_printf(b, ",\"%s\":{", name);
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(list[i], '='), *v;
        if (eq == list[i] || !list[i][0])
            return -1;
        char *k = eq ? sp_xstrndup(list[i], (size_t)(eq - list[i])) : sp_xstrdup(list[i]);
        v = eq ? eq + 1 : from_env ? getenv(k) : NULL;
        if (!v) {
            fprintf(stderr, "space: %s: %s\n", k,
                    from_env ? "not set here (NAME takes its value from this environment)"
                             : "give KEY=VALUE");
            free(k);
            return -1;
        }
        if (i)
            sp_buf_putc(b, ',');
        sp_buf_json_str(b, k);
        sp_buf_putc(b, ':');
        sp_buf_json_str(b, v);
        free(k);
    }
    sp_buf_putc(b, '}');
    return 0;
}

static void put_list(sp_buf_t *b, const char *name, char **list, size_t n)
{
    sp_buf_printf(b, ",\"%s\":[", name);
    for (size_t i = 0; i < n; i++) {
        if (i)
            sp_buf_putc(b, ',');
        sp_buf_json_str(b, list[i]);
    }
    sp_buf_putc(b, ']');
}

static int cmd_create(const sp_api_t *api, int argc, char **argv)
{
    const char *tmpl = NULL, *timeout = NULL, *mode = NULL, *v;
    char **meta = sp_xcalloc((size_t)argc + 1, sizeof(char *));
    char **env = sp_xcalloc((size_t)argc + 1, sizeof(char *));
    char **allow = sp_xcalloc((size_t)argc + 1, sizeof(char *));
    char **deny = sp_xcalloc((size_t)argc + 1, sizeof(char *));
    size_t nmeta = 0, nenv = 0, nallow = 0, ndeny = 0;
    bool json = false;
    int code = SP_STACK_EXIT_USAGE;
    sp_buf_t body;
    sp_buf_init(&body);

    for (int i = 0; i < argc; i++) {
        if ((v = sp__opt_value(argc, argv, &i, "--template")))
            tmpl = v;
        else if ((v = sp__opt_value(argc, argv, &i, "--timeout")))
            timeout = v;
        else if ((v = sp__opt_value(argc, argv, &i, "--metadata")))
            meta[nmeta++] = (char *)v;
        else if ((v = sp__opt_value(argc, argv, &i, "--env")))
            env[nenv++] = (char *)v;
        else if ((v = sp__opt_value(argc, argv, &i, "--allow")))
            allow[nallow++] = (char *)v;
        else if ((v = sp__opt_value(argc, argv, &i, "--deny")))
            deny[ndeny++] = (char *)v;
        else if ((v = sp__opt_value(argc, argv, &i, "--network")))
            mode = v;
        else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (argv[i][0] != '-' && !tmpl)
            tmpl = argv[i];
        else {
            fprintf(stderr, "space create: unexpected argument '%s'\n", argv[i]);
            code = usage_error("create");
            goto out;
        }
    }
    char *end = NULL;
    long long t = timeout ? strtoll(timeout, &end, 10) : 0;
    if (timeout && (!*timeout || *end || t < 0)) {
        fprintf(stderr, "space create: --timeout takes a number of seconds\n");
        goto out;
    }
    sp_buf_puts(&body, "{\"template\":");
    sp_buf_json_str(&body, tmpl ? tmpl : "tiny");
    if (timeout)
        sp_buf_printf(&body, ",\"timeout_s\":%lld", t);
    if (sp__put_map(&body, "metadata", meta, nmeta, false) < 0 ||
        sp__put_map(&body, "env", env, nenv, true) < 0) {
        fprintf(stderr, "space create: --metadata takes KEY=VALUE, --env NAME=VALUE or NAME\n");
        goto out;
    }
    if (mode || nallow || ndeny) {
        sp_buf_puts(&body, ",\"network\":{\"mode\":");
        sp_buf_json_str(&body, mode ? mode : nallow ? "allowlist" : "allow_all");
        if (nallow)
            put_list(&body, "allow", allow, nallow);
        if (ndeny)
            put_list(&body, "deny", deny, ndeny);
        sp_buf_putc(&body, '}');
    }
    sp_buf_putc(&body, '}');
    sp_httpc_resp_t r;
    if (sp__api_call(api, "POST", "/v1/sandboxes", NULL, body.data, body.len, 0, &r) < 0) {
        code = SP_STACK_EXIT_FAIL;
        goto out;
    }
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    code = SP_STACK_EXIT_OK;
    if (r.status != 201 || sp_json_parse(r.body, r.body_len, NULL, &doc, err) < 0)
        code = sp__api_error("space create", &r);
    else if (json)
        printf("%.*s\n", (int)r.body_len, r.body);
    else
        printf("%s\n", field(sp_json_root(doc), "id"));
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
out:
    if (body.data)
        explicit_bzero(body.data, body.len); /* env values */
    sp_buf_dispose(&body);
    free(meta);
    free(env);
    free(allow);
    free(deny);
    return code;
}

/* Appends s percent-encoded for a query string. */
static void put_query(sp_buf_t *b, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
            strchr("-._~", *p))
            sp_buf_putc(b, (char)*p);
        else
            sp_buf_printf(b, "%%%02X", *p);
    }
}

static int cmd_ls(const sp_api_t *api, int argc, char **argv)
{
    bool json = false;
    const char *v;
    sp_buf_t path;
    sp_buf_init(&path);
    sp_buf_puts(&path, "/v1/sandboxes?limit=1000");
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if ((v = sp__opt_value(argc, argv, &i, "--state"))) {
            sp_buf_puts(&path, "&state=");
            put_query(&path, v);
        } else if ((v = sp__opt_value(argc, argv, &i, "--metadata")) && strchr(v, '=') &&
                   v[0] != '=') {
            const char *eq = strchr(v, '=');
            char *k = sp_xstrndup(v, (size_t)(eq - v));
            sp_buf_puts(&path, "&metadata.");
            put_query(&path, k);
            sp_buf_putc(&path, '=');
            put_query(&path, eq + 1);
            free(k);
        } else {
            fprintf(stderr, "space ls: unexpected argument '%s'\n", argv[i]);
            sp_buf_dispose(&path);
            return usage_error("ls");
        }
    }
    sp_httpc_resp_t r;
    int rc = sp__api_call(api, "GET", path.data, NULL, NULL, 0, 60000, &r);
    sp_buf_dispose(&path);
    if (rc < 0)
        return SP_STACK_EXIT_FAIL;
    int code = SP_STACK_EXIT_OK;
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (r.status != 200 || sp_json_parse(r.body, r.body_len, NULL, &doc, err) < 0) {
        code = sp__api_error("space ls", &r);
    } else if (json) {
        printf("%.*s\n", (int)r.body_len, r.body);
    } else {
        static const char *const COLS[] = {"id", "state", "template", "worker", "created_at"};
        enum { NCOLS = sizeof(COLS) / sizeof(COLS[0]) };
        const sp_json_t *list = sp_json_get(sp_json_root(doc), "sandboxes");
        size_t rows = sp_json_len(list) + 1;
        const char **cells = sp_xcalloc(rows * NCOLS, sizeof(*cells));
        static const char *const HEADS[NCOLS] = {"ID", "STATE", "TEMPLATE", "WORKER", "CREATED"};
        memcpy(cells, HEADS, sizeof(HEADS));
        for (size_t i = 1; i < rows; i++)
            for (size_t c = 0; c < NCOLS; c++)
                cells[i * NCOLS + c] = field(sp_json_at(list, i - 1), COLS[c]);
        sp__table_print(stdout, cells, rows, NCOLS);
        free(cells);
    }
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    return code;
}

static int cmd_rm(const sp_api_t *api, int argc, char **argv)
{
    int code = SP_STACK_EXIT_OK;
    if (argc < 1)
        return usage_error("rm");
    for (int i = 0; i < argc; i++) {
        char *path = sp_xasprintf("/v1/sandboxes/%s", argv[i]);
        sp_httpc_resp_t r;
        if (sp__api_call(api, "DELETE", path, NULL, NULL, 0, 0, &r) < 0) {
            code = SP_STACK_EXIT_FAIL;
        } else {
            if (r.status != 204)
                code = sp__api_error("space rm", &r);
            sp_httpc_resp_free(&r);
        }
        free(path);
    }
    return code;
}

/* --help among the options of cmd: before "--", and for exec before the command line (the
 * second argument that is no option, the first being the id). */
static bool wants_help(const char *cmd, int argc, char **argv)
{
    bool exec = strcmp(cmd, "exec") == 0;
    int positional = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            return false;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
        if (argv[i][0] != '-' && exec && ++positional > 1)
            return false;
    }
    return false;
}

int sp_client_main(const sp_stack_config_t *cfg, const char *cmd, int argc, char **argv)
{
    sp_api_t api;
    if (wants_help(cmd, argc, argv)) {
        sp_client_usage(cmd, stdout);
        return SP_STACK_EXIT_OK;
    }
    if (strcmp(cmd, "creds") == 0 && argc >= 1 && strcmp(argv[0], "rotate-master") == 0)
        return sp__creds_rotate_master(cfg->home); /* local: the key files, no API */
    if (api_open(cfg, &api) < 0)
        return SP_STACK_EXIT_FAIL;
    fflush(stdout);
    if (strcmp(cmd, "create") == 0)
        return cmd_create(&api, argc, argv);
    if (strcmp(cmd, "ls") == 0)
        return cmd_ls(&api, argc, argv);
    if (strcmp(cmd, "rm") == 0)
        return cmd_rm(&api, argc, argv);
    if (strcmp(cmd, "cp") == 0)
        return sp__client_cp(&api, argc, argv);
    if (strcmp(cmd, "events") == 0)
        return sp__client_events(&api, argc, argv);
    if (strcmp(cmd, "creds") == 0)
        return sp__client_creds(&api, argc, argv);
    if (strcmp(cmd, "keys") == 0)
        return sp__client_keys(&api, argc, argv);
    return sp__client_exec(&api, argc, argv);
}
