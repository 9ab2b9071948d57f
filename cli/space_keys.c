/* `space keys create|ls|revoke`: API keys through the API (/v1/keys, gateway-api/gateway_keys.c)
 * with the admin key of space.env (or SPACE_API_URL and SPACE_API_KEY), like `space creds`: one
 * code path for every key but the first (`space up` mints that one in PostgreSQL), the same
 * checks and the same immediate revocation whoever asks, and it works from any host that can
 * reach the API, without PostgreSQL's superuser. The new key is printed once, alone on stdout
 * (for a script to capture); its id goes to stderr. `ls` never shows a key, only its id. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "error.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "space_stack.h"
#include "xmalloc.h"

static int usage(void)
{
    sp_client_usage("keys", stderr);
    return SP_STACK_EXIT_USAGE;
}

static const char *str(const sp_json_t *o, const char *name)
{
    const char *s = sp_json_str(sp_json_get(o, name), NULL);
    return s && s[0] ? s : "-";
}

/* A time of the API ("2026-01-02T03:04:05.678Z", or null) to the second. */
static const char *when(const sp_json_t *o, const char *name, char out[24])
{
    const char *s = sp_json_str(sp_json_get(o, name), NULL);
    if (!s)
        return "-";
    snprintf(out, 24, "%.19sZ", s);
    return out;
}

static int print_list(const sp_httpc_resp_t *r)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (sp_json_parse(r->body, r->body_len, NULL, &doc, err) < 0) {
        fprintf(stderr, "space keys: the answer is not JSON: %s\n", err);
        return SP_STACK_EXIT_FAIL;
    }
    const sp_json_t *root = sp_json_root(doc), *list = sp_json_get(root, "keys");
    enum { NCOLS = 7 };
    static const char *const HEADS[NCOLS] = {"ID",        "TENANT",  "ADMIN", "CREATED",
                                             "LAST_USED", "REVOKED", "NAME"};
    size_t rows = sp_json_len(list) + 1;
    const char **cells = sp_xcalloc(rows * NCOLS, sizeof(*cells));
    char(*times)[3][24] = sp_xcalloc(rows, sizeof(*times));
    memcpy(cells, HEADS, sizeof(HEADS));
    for (size_t i = 1; i < rows; i++) {
        const sp_json_t *k = sp_json_at(list, i - 1);
        const char **row = cells + i * NCOLS;
        bool admin = false;
        (void)sp_json_bool(sp_json_get(k, "admin"), &admin);
        row[0] = str(k, "id");
        row[1] = str(k, "tenant");
        row[2] = admin ? "yes" : "no";
        row[3] = when(k, "created_at", times[i][0]);
        row[4] = when(k, "last_used_at", times[i][1]);
        row[5] = when(k, "revoked_at", times[i][2]);
        row[6] = str(k, "name");
    }
    sp__table_print(stdout, cells, rows, NCOLS);
    free(cells);
    free(times);
    bool truncated = false;
    if (sp_json_bool(sp_json_get(root, "truncated"), &truncated) == 0 && truncated)
        fprintf(stderr, "space keys: the list is truncated; narrow it with --tenant\n");
    sp_json_doc_free(doc);
    return SP_STACK_EXIT_OK;
}

static int print_created(const sp_httpc_resp_t *r)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    int code = SP_STACK_EXIT_OK;
    if (sp_json_parse(r->body, r->body_len, NULL, &doc, err) < 0) {
        fprintf(stderr, "space keys: the answer is not JSON: %s\n", err);
        return SP_STACK_EXIT_FAIL;
    }
    const sp_json_t *root = sp_json_root(doc);
    size_t n = 0;
    const char *key = sp_json_str(sp_json_get(root, "key"), &n);
    if (!key) {
        fprintf(stderr, "space keys: the answer has no key\n");
        code = SP_STACK_EXIT_FAIL;
    } else {
        bool admin = false;
        (void)sp_json_bool(sp_json_get(root, "admin"), &admin);
        fprintf(stderr, "key %s for tenant %s%s (shown once: keep it now)\n", str(root, "id"),
                str(root, "tenant"), admin ? " (admin)" : "");
        fflush(stderr);
        printf("%s\n", key);
        explicit_bzero((char *)key, n);
    }
    sp_json_doc_free(doc);
    return code;
}

int sp__client_keys(const sp_api_t *api, int argc, char **argv)
{
    if (argc < 1)
        return usage();
    const char *sub = argv[0], *tenant = NULL, *name = NULL;
    bool admin = false, json = false;
    const char *id = NULL;
    /* An id may start with '-' (the key alphabet has it): after revoke it is never an option. */
    int first = 1;
    if (strcmp(sub, "revoke") == 0 && argc >= 2) {
        first = strcmp(argv[1], "--") == 0 ? 3 : 2;
        id = first == 3 ? (argc >= 3 ? argv[2] : NULL) : argv[1];
    }
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "--tenant") == 0 && i + 1 < argc)
            tenant = argv[++i];
        else if (strncmp(argv[i], "--tenant=", 9) == 0)
            tenant = argv[i] + 9;
        else if (strcmp(argv[i], "--name") == 0 && i + 1 < argc)
            name = argv[++i];
        else if (strncmp(argv[i], "--name=", 7) == 0)
            name = argv[i] + 7;
        else if (strcmp(argv[i], "--admin") == 0)
            admin = true;
        else if (strcmp(argv[i], "--json") == 0 && strcmp(sub, "ls") == 0)
            json = true;
        else
            return usage();
    }

    if (tenant && !sp_id_valid(tenant)) {
        /* The rule of every tenant (ids.h); it also keeps the query string plain. */
        fprintf(stderr,
                "space keys: '%s' is not a tenant name: 1 to 64 of [a-z0-9_-], starting "
                "with a letter or digit\n",
                tenant);
        return SP_STACK_EXIT_USAGE;
    }
    sp_buf_t b;
    sp_buf_init(&b);
    const char *method = "GET";
    char *path = NULL;
    int want = 200;
    if (strcmp(sub, "create") == 0 && tenant && !id) {
        method = "POST";
        want = 201;
        path = sp_xstrdup("/v1/keys");
        sp_buf_puts(&b, "{\"tenant\":");
        sp_buf_json_str(&b, tenant);
        if (name) {
            sp_buf_puts(&b, ",\"name\":");
            sp_buf_json_str(&b, name);
        }
        sp_buf_printf(&b, ",\"admin\":%s}", admin ? "true" : "false");
    } else if (strcmp(sub, "ls") == 0 && !id && !name && !admin) {
        path = tenant ? sp_xasprintf("/v1/keys?tenant=%s", tenant) : sp_xstrdup("/v1/keys");
    } else if (strcmp(sub, "revoke") == 0 && id && !tenant && !name && !admin) {
        method = "DELETE";
        want = 204;
        path = sp_xasprintf("/v1/keys/%s", id);
    } else {
        sp_buf_dispose(&b);
        return usage();
    }

    sp_httpc_resp_t r;
    int rc = sp__api_call(api, method, path, NULL, b.len ? b.data : NULL, b.len, 30000, &r);
    sp_buf_dispose(&b);
    free(path);
    if (rc < 0)
        return SP_STACK_EXIT_FAIL;
    int code;
    if (r.status != want) {
        code = sp__api_error("space keys", &r);
    } else if (want == 200 && json) {
        printf("%.*s\n", (int)r.body_len, r.body);
        code = SP_STACK_EXIT_OK;
    } else if (want == 201) {
        code = print_created(&r);
    } else if (want == 200) {
        code = print_list(&r);
    } else {
        printf("revoked %s\n", id);
        code = SP_STACK_EXIT_OK;
    }
    if (r.body)
        explicit_bzero(r.body, r.body_len); /* a create's holds the key */
    sp_httpc_resp_free(&r);
    return code;
}
