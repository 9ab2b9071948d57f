/* API keys and tenants end to end, on a stack with a worker: the admin key `space up` keeps in
 * space.env creates, lists and revokes keys through /v1/keys and `space keys`; a revoked key
 * is refused within a second although the gateway had it cached; a key that is not an admin
 * key gets 403 on every key route; a key of one tenant sees nothing of another's; no key value
 * reaches a log file of the stack or a row of `events`; `space up` run again keeps the key and
 * space.env never loses its API lines meanwhile; an E2B access token opens its own sandbox's
 * envd routes and nothing else. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "b64.h"
#include "buf.h"
#include "config.h"
#include "harness.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"

static int port;
static const char *admin_key;
static PGconn *db;
/* Every key value this test saw: none may be in a log or an event. */
static char *seen[32];
static size_t n_seen;
static char creator_id[32]; /* a key that made a sandbox: its id is the events' actor */

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    port = sp_test_api_port();
    admin_key = sp_test_env("SPACE_API_KEY");
    db = sp_test_db();
    seen[n_seen++] = sp_xstrdup(admin_key);
    return 0;
}

static int status_of(const char *method, const char *path, const char *key, const char *extra,
                     const char *body)
{
    sp_test_http_resp_t r;
    sp_test_http(port, method, path, key, extra, body, body ? strlen(body) : 0, &r);
    int st = r.status;
    sp_test_http_free(&r);
    return st;
}

/* POST /v1/keys as key: the new key (heap) and its id. */
static char *create_key(const char *key, const char *tenant, bool admin, char id[32])
{
    char body[256];
    snprintf(body, sizeof(body), "{\"tenant\":\"%s\",\"name\":\"keys test\",\"admin\":%s}", tenant,
             admin ? "true" : "false");
    sp_test_http_resp_t r;
    sp_test_http(port, "POST", "/v1/keys", key, "Content-Type: application/json\r\n", body,
                 strlen(body), &r);
    if (r.status != 201)
        fail_msg("POST /v1/keys: %d %s", r.status, r.body);
    sp_json_doc_t *doc = sp_test_json(&r);
    const sp_json_t *o = sp_json_root(doc);
    char *k = sp_xstrdup(sp_json_str(sp_json_get(o, "key"), NULL));
    snprintf(id, 32, "%s", sp_json_str(sp_json_get(o, "id"), NULL));
    assert_string_equal(sp_json_str(sp_json_get(o, "tenant"), NULL), tenant);
    bool a = !admin;
    assert_int_equal(sp_json_bool(sp_json_get(o, "admin"), &a), 0);
    assert_true(a == admin);
    sp_json_doc_free(doc);
    sp_test_http_free(&r);
    assert_true(n_seen < sizeof(seen) / sizeof(seen[0]));
    seen[n_seen++] = sp_xstrdup(k);
    return k;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Runs `space <args>` with the environment of the stack and captures its stdout. */
static int space_out(const char *args, char *out, size_t cap)
{
    char *cmd = sp_xasprintf("'%s/space' %s", sp_test_env("SPACE_BIN_DIR"), args);
    FILE *p = popen(cmd, "r"); /* NOLINT(cert-env33-c): the CLI as a user runs it */
    free(cmd);
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_create_use_list_revoke(void **state)
{
    (void)state;
    char id[32], out[16384];
    char *key = create_key(admin_key, "tenant-a", false, id);

    /* Use it: the gateway now has it in its cache (10 s). */
    for (int i = 0; i < 3; i++)
        assert_int_equal(status_of("GET", "/v1/sandboxes", key, NULL, NULL), 200);

    /* The list names it, without its value; ?tenant= narrows it. */
    sp_test_http_resp_t r;
    sp_test_http(port, "GET", "/v1/keys?tenant=tenant-a", admin_key, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, id));
    assert_null(strstr(r.body, key));
    assert_null(strstr(r.body, key + 4 + 16)); /* not even the secret part */
    assert_null(strstr(r.body, "\"tenant\":\"default\""));
    assert_non_null(strstr(r.body, "\"last_used_at\":\"")); /* it was used */
    sp_test_http_free(&r);
    sp_test_http(port, "GET", "/v1/keys", admin_key, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"tenant\":\"default\""));
    assert_null(strstr(r.body, admin_key));
    sp_test_http_free(&r);

    /* The CLI: a header line, then one key per line, its id first, never a key. */
    assert_int_equal(space_out("keys ls --tenant tenant-a", out, sizeof(out)), 0);
    assert_true(strncmp(out, "ID ", 3) == 0);
    const char *line = strchr(out, '\n');
    assert_non_null(line);
    assert_true(strncmp(line + 1, id, strlen(id)) == 0);
    assert_null(strstr(out, key));
    assert_null(strstr(out, "sk_"));

    /* Revoke: the next request gets 401, the cache notwithstanding. */
    char path[64];
    snprintf(path, sizeof(path), "/v1/keys/%s", id);
    assert_int_equal(status_of("DELETE", path, admin_key, NULL, NULL), 204);
    assert_int_equal(status_of("GET", "/v1/sandboxes", key, NULL, NULL), 401);
    /* Stays refused (past the cache's 10 s the answer is the same), and the list shows it. */
    assert_int_equal(status_of("GET", "/v1/sandboxes", key, NULL, NULL), 401);
    assert_int_equal(status_of("DELETE", path, admin_key, NULL, NULL), 404);
    sp_test_http(port, "GET", "/v1/keys?tenant=tenant-a", admin_key, NULL, NULL, 0, &r);
    assert_non_null(strstr(r.body, "\"revoked_at\":\""));
    sp_test_http_free(&r);

    /* The CLI's create prints the key alone; revoke takes the id. */
    assert_int_equal(
        space_out("keys create --tenant tenant-c --name cli 2>/dev/null", out, sizeof(out)), 0);
    out[strcspn(out, "\n")] = '\0';
    assert_int_equal(strlen(out), 63);
    assert_true(strncmp(out, "sk_", 3) == 0);
    seen[n_seen++] = sp_xstrdup(out);
    assert_int_equal(status_of("GET", "/v1/sandboxes", out, NULL, NULL), 200);
    char cmd[128], idc[17];
    memcpy(idc, out + 3, 16);
    idc[16] = '\0';
    snprintf(cmd, sizeof(cmd), "keys revoke %s", idc);
    char out2[256];
    assert_int_equal(space_out(cmd, out2, sizeof(out2)), 0);
    assert_int_equal(status_of("GET", "/v1/sandboxes", out, NULL, NULL), 401);
    /* Tenant names follow the rule of every tenant. */
    assert_int_equal(space_out("keys create --tenant 'No Such!' 2>/dev/null", out2, sizeof(out2)),
                     2);
    assert_int_equal(status_of("POST", "/v1/keys", admin_key, "Content-Type: application/json\r\n",
                               "{\"tenant\":\"Upper\"}"),
                     400);
    assert_int_equal(status_of("POST", "/v1/keys", admin_key, "Content-Type: application/json\r\n",
                               "{\"tenant\":\"ok\",\"role\":\"x\"}"),
                     400);
    free(key);
}

/* A key revoked behind the gateway's back (by hand in PostgreSQL, by another gateway): the
 * NOTIFY of api_keys' trigger empties the cache within a second. */
static void test_revoke_elsewhere(void **state)
{
    (void)state;
    char id[32];
    char *key = create_key(admin_key, "tenant-a", false, id);
    for (int i = 0; i < 3; i++)
        assert_int_equal(status_of("GET", "/v1/sandboxes", key, NULL, NULL), 200);
    const char *p[1] = {id};
    double t0 = now_ms();
    PGresult *r = PQexecParams(db, "UPDATE api_keys SET revoked_at = now() WHERE id = $1", 1, NULL,
                               p, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    int st, n = 0;
    while ((st = status_of("GET", "/v1/sandboxes", key, NULL, NULL)) == 200 &&
           now_ms() - t0 < 5000) {
        n++;
        usleep(1000);
    }
    double took = now_ms() - t0;
    fprintf(stderr, "keys: revoked in PostgreSQL, refused %.1f ms later (%d requests passed)\n",
            took, n);
    assert_int_equal(st, 401);
    assert_true(took < 1000);
    free(key);
}

static void test_non_admin_forbidden(void **state)
{
    (void)state;
    char id[32], id2[32];
    char *key = create_key(admin_key, "tenant-a", false, id);
    char *other = create_key(admin_key, "tenant-a", false, id2);
    char path[64];
    snprintf(path, sizeof(path), "/v1/keys/%s", id2);
    const char *json = "Content-Type: application/json\r\n";
    struct {
        const char *method, *path, *body;
    } calls[] = {{"GET", "/v1/keys", NULL},
                 {"GET", "/v1/keys?tenant=tenant-a", NULL},
                 {"POST", "/v1/keys", "{\"tenant\":\"tenant-a\",\"admin\":true}"},
                 {"DELETE", path, NULL}};
    for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
        sp_test_http_resp_t r;
        sp_test_http(port, calls[i].method, calls[i].path, key, json, calls[i].body,
                     calls[i].body ? strlen(calls[i].body) : 0, &r);
        assert_int_equal(r.status, 403);
        sp_json_doc_t *doc = sp_test_json(&r);
        assert_string_equal(sp_json_str(sp_json_get(sp_json_root(doc), "code"), NULL), "forbidden");
        sp_json_doc_free(doc);
        sp_test_http_free(&r);
    }
    /* The other key is still live, and the CLI with a plain key fails the same way. */
    assert_int_equal(status_of("GET", "/v1/sandboxes", other, NULL, NULL), 200);
    char *cmd = sp_xasprintf("env SPACE_API_KEY='%s' '%s/space' keys ls >/dev/null 2>&1", key,
                             sp_test_env("SPACE_BIN_DIR"));
    int st = system(cmd); /* NOLINT(cert-env33-c) */
    free(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    /* An admin key made through the API can manage keys. */
    char ida[32];
    char *adm = create_key(admin_key, "ops", true, ida);
    assert_int_equal(status_of("GET", "/v1/keys", adm, NULL, NULL), 200);
    assert_int_equal(status_of("DELETE", path, adm, NULL, NULL), 204);
    free(adm);
    free(key);
    free(other);
}

/* A key of tenant B sees nothing of tenant A's sandboxes (gateway_api.c covers events and
 * idempotency keys), and an admin key is no exception: admin is about keys, not sandboxes. */
static void test_tenants(void **state)
{
    (void)state;
    char ida[32], idb[32], sbx[64], path[128];
    char *ka = create_key(admin_key, "tenant-a", false, ida);
    char *kb = create_key(admin_key, "tenant-b", false, idb);
    snprintf(creator_id, sizeof(creator_id), "%s", ida);
    sp_test_create_sandbox(port, ka, "tiny", sbx);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    assert_int_equal(status_of("GET", path, ka, NULL, NULL), 200);
    assert_int_equal(status_of("GET", path, kb, NULL, NULL), 404);
    assert_int_equal(status_of("GET", path, admin_key, NULL, NULL), 404);
    sp_test_http_resp_t r;
    sp_test_http(port, "GET", "/v1/sandboxes", kb, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_null(strstr(r.body, sbx));
    sp_test_http_free(&r);
    sp_test_http(port, "GET", "/sandboxes", NULL, NULL, NULL, 0, &r); /* E2B list, no key */
    assert_int_equal(r.status, 401);
    sp_test_http_free(&r);
    char *hb = sp_xasprintf("X-API-KEY: %s\r\n", kb);
    sp_test_http(port, "GET", "/v2/sandboxes", NULL, hb, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    assert_null(strstr(r.body, sbx));
    sp_test_http_free(&r);
    free(hb);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", sbx);
    assert_int_equal(
        status_of("POST", path, kb, "Content-Type: application/json\r\n", "{\"cmd\":\"echo hi\"}"),
        404);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    assert_int_equal(status_of("DELETE", path, kb, NULL, NULL), 404);
    assert_int_equal(status_of("DELETE", path, ka, NULL, NULL), 204);
    free(ka);
    free(kb);
}

/* E2B create: the sandbox id and its envdAccessToken. */
static void e2b_create(const char *key, char id[64], char **ret_token)
{
    char *h = sp_xasprintf("X-API-KEY: %s\r\nContent-Type: application/json\r\n", key);
    const char *body = "{\"templateID\":\"tiny\",\"timeout\":300}";
    sp_test_http_resp_t r;
    for (int i = 0; i < 100; i++) {
        sp_test_http(port, "POST", "/v2/sandboxes", NULL, h, body, strlen(body), &r);
        if (r.status == 201)
            break;
        sp_test_http_free(&r);
        usleep(100 * 1000);
    }
    free(h);
    if (r.status != 201)
        fail_msg("E2B create: %d %s", r.status, r.body);
    sp_json_doc_t *doc = sp_test_json(&r);
    const sp_json_t *o = sp_json_root(doc);
    snprintf(id, 64, "%s", sp_json_str(sp_json_get(o, "sandboxID"), NULL));
    *ret_token = sp_xstrdup(sp_json_str(sp_json_get(o, "envdAccessToken"), NULL));
    sp_json_doc_free(doc);
    sp_test_http_free(&r);
}

/* Process.List (Connect unary) on the envd routes with these headers. */
static int envd_list(const char *headers)
{
    char *h = sp_xasprintf("%sContent-Type: application/json\r\nConnect-Protocol-Version: 1\r\n",
                           headers);
    int st = status_of("POST", "/process.Process/List", NULL, h, "{}");
    free(h);
    return st;
}

static void test_e2b_access_token(void **state)
{
    (void)state;
    char kid[32], a[64], b[64], hdr[512];
    char *key = create_key(admin_key, "tenant-e", false, kid);
    char *ta = NULL, *tb = NULL;
    e2b_create(key, a, &ta);
    e2b_create(key, b, &tb);
    seen[n_seen++] = sp_xstrdup(ta);
    /* A token holds nothing of the key. */
    assert_null(strstr(ta, key));
    assert_null(strstr(ta, key + 4 + 16));
    assert_true(strncmp(ta, a, strlen(a)) == 0);
    assert_string_not_equal(ta, tb);

    /* Its own sandbox: yes, alone or with E2b-Sandbox-Id. */
    snprintf(hdr, sizeof(hdr), "X-Access-Token: %s\r\n", ta);
    assert_int_equal(envd_list(hdr), 200);
    snprintf(hdr, sizeof(hdr), "X-Access-Token: %s\r\nE2b-Sandbox-Id: %s\r\n", ta, a);
    assert_int_equal(envd_list(hdr), 200);
    /* Sandbox B with A's token: no way. */
    snprintf(hdr, sizeof(hdr), "X-Access-Token: %s\r\nE2b-Sandbox-Id: %s\r\n", ta, b);
    assert_int_equal(envd_list(hdr), 401);
    /* A's signature under B's name. */
    char *forged = sp_xasprintf("%s%s", b, ta + strlen(a));
    snprintf(hdr, sizeof(hdr), "X-Access-Token: %s\r\n", forged);
    assert_int_equal(envd_list(hdr), 401);
    free(forged);
    /* As an API key: on the E2B control plane (create, list, kill) and on ours. */
    snprintf(hdr, sizeof(hdr), "X-API-KEY: %s\r\nContent-Type: application/json\r\n", ta);
    assert_int_equal(status_of("POST", "/v2/sandboxes", NULL, hdr, "{\"templateID\":\"tiny\"}"),
                     401);
    assert_int_equal(status_of("GET", "/v2/sandboxes", NULL, hdr, NULL), 401);
    char path[128];
    snprintf(path, sizeof(path), "/sandboxes/%s", a);
    assert_int_equal(status_of("DELETE", path, NULL, hdr, NULL), 401);
    assert_int_equal(status_of("GET", "/v1/sandboxes", ta, NULL, NULL), 401);
    assert_int_equal(status_of("POST", "/v1/sandboxes", ta, "Content-Type: application/json\r\n",
                               "{\"template\":\"tiny\"}"),
                     401);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", a);
    assert_int_equal(
        status_of("POST", path, ta, "Content-Type: application/json\r\n", "{\"cmd\":\"echo hi\"}"),
        401);
    /* Even right after it was used on envd (the cache entry is the sandbox's alone). */
    snprintf(hdr, sizeof(hdr), "X-Access-Token: %s\r\n", ta);
    assert_int_equal(envd_list(hdr), 200);
    assert_int_equal(status_of("GET", "/v1/sandboxes", ta, NULL, NULL), 401);

    /* The token dies with its key. */
    snprintf(path, sizeof(path), "/v1/keys/%s", kid);
    assert_int_equal(status_of("DELETE", path, admin_key, NULL, NULL), 204);
    assert_int_equal(envd_list(hdr), 401);
    /* The sandboxes stay to their timeout (their key is gone); `space down --purge` ends them. */
    free(ta);
    free(tb);
    free(key);
}

/* space.env holds both API lines at every moment of an `up`, which keeps the key. */
static atomic_bool watch_stop;
static atomic_int watch_reads, watch_missing;

static void *watch_env(void *arg)
{
    const char *path = arg;
    while (!atomic_load(&watch_stop)) {
        char *url = NULL, *key = NULL;
        int a = sp_env_file_get(path, "SPACE_API_URL", &url);
        int b = sp_env_file_get(path, "SPACE_API_KEY", &key);
        atomic_fetch_add(&watch_reads, 1);
        if (a < 0 || b < 0)
            atomic_fetch_add(&watch_missing, 1);
        free(url);
        free(key);
        usleep(1000);
    }
    return NULL;
}

/* A rotation of the gateway's key (`space identity rotate gateway`, docs/trust.md): a token
 * handed out before keeps opening its sandbox while the old key's grace runs, and not after;
 * a token made after the rotation (the new key) opens it too. */
static void test_e2b_token_across_rotation(void **state)
{
    (void)state;
    char kid[32], a[64], hdr[512];
    char *key = create_key(admin_key, "tenant-r", false, kid);
    char *told = NULL, *tnew = NULL;
    e2b_create(key, a, &told);
    seen[n_seen++] = sp_xstrdup(told);
    snprintf(hdr, sizeof(hdr), "X-Access-Token: %s\r\n", told);
    assert_int_equal(envd_list(hdr), 200);

    time_t rotated = time(NULL);
    assert_int_equal(sp_test_space("identity rotate gateway --grace 5"), 0);
    sp_test_stack_load(); /* the restarted gateway's API URL (SPACE_API_PORT=0: a new port) */
    port = sp_test_api_port();
    /* Within the grace: the old token still opens its sandbox. */
    assert_int_equal(envd_list(hdr), 200);
    /* A token of the new key for another sandbox of the same key. */
    char b[64];
    e2b_create(key, b, &tnew);
    seen[n_seen++] = sp_xstrdup(tnew);
    assert_string_not_equal(tnew + strlen(b), told + strlen(a));
    char hdr_new[512];
    snprintf(hdr_new, sizeof(hdr_new), "X-Access-Token: %s\r\n", tnew);
    assert_int_equal(envd_list(hdr_new), 200);
    /* Past it: the old token is refused (the gateway's auth cache keeps an answer 10 s at most,
     * so ask after that too), the new one still opens. */
    while (time(NULL) <= rotated + 5 + 11)
        usleep(250 * 1000);
    assert_int_equal(envd_list(hdr), 401);
    assert_int_equal(envd_list(hdr_new), 200);
    free(told);
    free(tnew);
    free(key);
}

static void test_up_keeps_key(void **state)
{
    (void)state;
    char *path = sp_xasprintf("%s/space.env", sp_test_env("SPACE_HOME"));
    char *before = NULL, *after = NULL;
    assert_int_equal(sp_env_file_get(path, "SPACE_API_KEY", &before), 0);
    long long live = sp_test_db_scalar(db, "SELECT count(*) FROM api_keys WHERE revoked_at IS "
                                           "NULL");
    pthread_t t;
    atomic_store(&watch_stop, false);
    assert_int_equal(pthread_create(&t, NULL, watch_env, path), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(sp_test_space("up >/dev/null"), 0);
    atomic_store(&watch_stop, true);
    pthread_join(t, NULL);
    fprintf(stderr, "keys: space.env read %d times during two `space up`, %d without the API\n",
            atomic_load(&watch_reads), atomic_load(&watch_missing));
    assert_true(atomic_load(&watch_reads) > 10);
    assert_int_equal(atomic_load(&watch_missing), 0);
    assert_int_equal(sp_env_file_get(path, "SPACE_API_KEY", &after), 0);
    assert_string_equal(before, after);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM api_keys WHERE revoked_at IS "
                                           "NULL"),
                     live);
    /* It is the deployment's admin key, and still works. */
    assert_int_equal(status_of("GET", "/v1/keys", after, NULL, NULL), 200);
    free(before);
    free(after);
    free(path);
}

/* Last: no key value this test saw (the admin key, every key it made, an access token) is in
 * a log file of the stack or a row of events, as text, hex or base64. */
static void test_no_key_in_logs_or_events(void **state)
{
    (void)state;
    char *logs = sp_xasprintf("%s/log", sp_test_env("SPACE_HOME"));
    for (size_t i = 0; i < n_seen; i++) {
        const char *v = seen[i];
        /* The whole value, and its secret part alone (a key's after "sk_<id>."). */
        const char *parts[2] = {v, strncmp(v, "sk_", 3) == 0 ? v + 4 + 16 : v};
        for (int p = 0; p < 2; p++) {
            char *cmd = sp_xasprintf("grep -rqF -- '%s' '%s'", parts[p], logs);
            int st = system(cmd); /* NOLINT(cert-env33-c) */
            free(cmd);
            assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1); /* 1: no match */
            sp_buf_t b64;
            sp_buf_init(&b64);
            sp_b64_encode(&b64, (const uint8_t *)parts[p], strlen(parts[p]));
            char *b64s = sp_xstrndup(b64.data, b64.len);
            const char *q[2] = {parts[p], b64s};
            PGresult *r = PQexecParams(
                db,
                "SELECT count(*) FROM events e WHERE position(convert_to($1, 'UTF8') IN "
                "e.payload) > 0 OR position($1 IN e::text) > 0 OR position(encode(convert_to($1, "
                "'UTF8'), 'hex') IN e::text) > 0 OR position($2 IN e::text) > 0 OR "
                "position(convert_to($2, 'UTF8') IN e.payload) > 0",
                2, NULL, q, NULL, NULL, 0);
            assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
            assert_string_equal(PQgetvalue(r, 0, 0), "0");
            PQclear(r);
            free(b64s);
            sp_buf_dispose(&b64);
        }
    }
    /* The search can find what is there: a key's id is in events (as the actor). */
    char *q = sp_xasprintf("SELECT count(*) FROM events WHERE actor = '%s'", creator_id);
    fprintf(stderr, "keys: %zu values searched in %s and %lld events\n", n_seen, logs,
            sp_test_db_scalar(db, "SELECT count(*) FROM events"));
    assert_true(sp_test_db_scalar(db, q) > 0);
    free(q);
    free(logs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_use_list_revoke),
        cmocka_unit_test(test_revoke_elsewhere),
        cmocka_unit_test(test_non_admin_forbidden),
        cmocka_unit_test(test_tenants),
        cmocka_unit_test(test_e2b_access_token),
        cmocka_unit_test(test_e2b_token_across_rotation),
        cmocka_unit_test(test_up_keeps_key),
        cmocka_unit_test(test_no_key_in_logs_or_events),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
