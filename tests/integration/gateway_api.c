/* space-gateway end to end: the HTTP API over a real stack (NATS, PostgreSQL, space-eventlog),
 * with the scheduler and the worker played by a fake owner on the bus. Covers create/read/list/
 * delete with read-your-writes, tenant isolation, validation, body limits, authentication,
 * Idempotency-Key, concurrency, SSE resume without loss or repetition, /healthz, /metrics, the
 * web console's files and a graceful SIGTERM. The test starts its own gateway on an ephemeral
 * port. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "apikey.h"
#include "eventgen.h"
#include "buf.h"
#include "envelope.h"
#include "harness.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"

#define WORKER "w-test"

static sp_bus_t *bus;
static PGconn *db;
static char *key1, *key2;
static char key1_id[SP_APIKEY_ID_LEN + 1];
static int port;
static pid_t gw_pid;
static char tmpdir[64];
static pthread_t owner_thread;
static atomic_bool owner_stop;

/* ---- the fake owner: scheduler and worker in one ---- */

static void publish_fact(const sp_envelope_t *intent, sp_envelope_t *env)
{
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    char id[37], subject[192];
    uint8_t *data = NULL;
    size_t len = 0;

    agg.kind = "sandbox";
    agg.id = intent->aggregate->id;
    env->aggregate = &agg;
    env->tenant = intent->tenant;
    env->actor = "svc:fake-owner";
    env->correlation_id = intent->correlation_id;
    env->causation_id = intent->event_id;
    sp_envelope_stamp(env, id);
    /* A refusal of an unplaced sandbox is the scheduler's, on the unplaced subject. */
    bool refusal = env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED;
    if (sp_envelope_subject(env, refusal ? NULL : WORKER, subject, sizeof(subject)) < 0 ||
        sp_envelope_encode(env, &data, &len) < 0 || sp_test_sign(subject, &data, &len) < 0 ||
        sp_bus_publish(bus, subject, data, len, id, NULL, NULL) < 0)
        fprintf(stderr, "fake owner: cannot publish %s for %s\n", env->type, agg.id);
    free(data);
}

static void answer(const sp_envelope_t *in)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;

    /* Bulk events the slow-client test publishes tell their own story. */
    if (strncmp(in->aggregate->id, "sbx_bulk", 8) == 0)
        return;

    if (in->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED) {
        if (strcmp(in->sandbox_create_requested->template_, "nope") == 0) {
            Space__V1__SandboxRequestRejected rej = SPACE__V1__SANDBOX_REQUEST_REJECTED__INIT;
            rej.request_type = "SandboxCreateRequested";
            rej.reason = "unknown_template";
            rej.detail = "no worker has template nope";
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED;
            env.sandbox_request_rejected = &rej;
            publish_fact(in, &env);
            return;
        }
        Space__V1__SandboxPlaced placed = SPACE__V1__SANDBOX_PLACED__INIT;
        placed.worker = WORKER;
        placed.scheduler = "fake-owner";
        placed.request = in->sandbox_create_requested;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED;
        env.sandbox_placed = &placed;
        publish_fact(in, &env);
        sp_envelope_t env2 = SPACE__V1__ENVELOPE__INIT;
        Space__V1__SandboxStarted started = SPACE__V1__SANDBOX_STARTED__INIT;
        started.worker = WORKER;
        started.runtime = "gvisor";
        started.start_ms = 1;
        env2.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED;
        env2.sandbox_started = &started;
        publish_fact(in, &env2);
    } else if (in->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED) {
        Space__V1__SandboxDeleted del = SPACE__V1__SANDBOX_DELETED__INIT;
        del.reason = "api";
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED;
        env.sandbox_deleted = &del;
        publish_fact(in, &env);
    }
}

static void *owner_main(void *arg)
{
    sp_bus_consumer_t *c = NULL;
    uint64_t last = 0, msgs = 0;
    (void)arg;

    if (sp_bus_stream_info(bus, &last, &msgs) < 0 ||
        sp_bus_consumer_open(bus, "fake-owner", "space.ev.sbx.>", last + 1, 5000, &c) < 0) {
        fprintf(stderr, "fake owner: cannot open its consumer\n");
        return NULL;
    }
    while (!atomic_load(&owner_stop)) {
        sp_bus_batch_t *b = NULL;
        if (sp_bus_fetch(c, 256, 200, &b) < 0) {
            sp_bus_batch_free(b);
            continue;
        }
        for (size_t i = 0; i < sp_bus_batch_len(b); i++) {
            const sp_bus_msg_t *m = sp_bus_batch_msg(b, i);
            sp_envelope_t *env = NULL;
            char reason[SP_REASON_MAX];
            if (sp_envelope_decode(m->data, m->len, &env, reason) < 0)
                continue;
            answer(env);
            sp_envelope_free(env);
        }
        sp_bus_batch_ack(b);
        sp_bus_batch_free(b);
    }
    sp_bus_consumer_free(c);
    return NULL;
}

/* ---- a minimal HTTP/1.1 client (127.0.0.1 only) ---- */

typedef struct {
    int status;
    char *head; /* status line and headers */
    char *body;
    size_t len;
    sp_json_doc_t *doc; /* when the body is JSON */
} resp_t;

static void resp_free(resp_t *r)
{
    free(r->head);
    free(r->body);
    sp_json_doc_free(r->doc);
    memset(r, 0, sizeof(*r));
}

static int connect_local(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 60};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Writes everything it can; a server that answers early (413) may close before the end. */
static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* Case-insensitive header value from a head block, copied into out; NULL if absent. */
static const char *header_of(const char *head, const char *name, char *out, size_t outlen)
{
    size_t n = strlen(name);
    for (const char *l = strstr(head, "\r\n"); l; l = strstr(l + 2, "\r\n")) {
        const char *s = l + 2;
        if (strncasecmp(s, name, n) == 0 && s[n] == ':') {
            s += n + 1;
            while (*s == ' ')
                s++;
            size_t vlen = strcspn(s, "\r\n");
            snprintf(out, outlen, "%.*s", (int)vlen, s);
            return out;
        }
    }
    return NULL;
}

static const char *resp_header(const resp_t *r, const char *name, char *out, size_t outlen)
{
    return r->head ? header_of(r->head, name, out, outlen) : NULL;
}

static void dechunk_all(const char *p, size_t n, sp_buf_t *out)
{
    size_t off = 0;
    while (off < n) {
        const char *crlf = memmem(p + off, n - off, "\r\n", 2);
        if (!crlf)
            return;
        size_t sz = strtoul(p + off, NULL, 16);
        off = (size_t)(crlf - p) + 2;
        if (sz == 0 || off + sz > n)
            return;
        sp_buf_append(out, p + off, sz);
        off += sz + 2;
    }
}

/* One request on its own connection (Connection: close); returns the status, 0 if the
 * connection failed. */
static int http(const char *method, const char *path, const char *key, const char *headers,
                const char *body, size_t len, bool chunked, resp_t *r)
{
    sp_buf_t req, in;
    char buf[65536];
    memset(r, 0, sizeof(*r));
    int fd = connect_local();
    if (fd < 0)
        return 0;
    sp_buf_init(&req);
    sp_buf_printf(&req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, path);
    if (key)
        sp_buf_printf(&req, "Authorization: Bearer %s\r\n", key);
    if (headers)
        sp_buf_puts(&req, headers);
    if (body && chunked)
        sp_buf_puts(&req, "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    else if (body)
        sp_buf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", len);
    else
        sp_buf_puts(&req, "\r\n");
    write_all(fd, req.data, req.len);
    if (body && chunked) {
        for (size_t off = 0; off < len; off += 16384) {
            size_t n = len - off < 16384 ? len - off : 16384;
            char hdr[32];
            snprintf(hdr, sizeof(hdr), "%zx\r\n", n);
            write_all(fd, hdr, strlen(hdr));
            write_all(fd, body + off, n);
            write_all(fd, "\r\n", 2);
        }
        write_all(fd, "0\r\n\r\n", 5);
    } else if (body) {
        write_all(fd, body, len);
    }
    sp_buf_dispose(&req);

    sp_buf_init(&in);
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        sp_buf_append(&in, buf, (size_t)n);
    }
    close(fd);
    const char *start = in.data ? in.data : "";
    const char *end = start + in.len;
    /* Skip interim 1xx answers (100 Continue). */
    for (;;) {
        const char *hend = memmem(start, (size_t)(end - start), "\r\n\r\n", 4);
        if (!hend || strncmp(start, "HTTP/1.1 ", 9) != 0 ||
            (r->status = (int)strtol(start + 9, NULL, 10)) <= 0) {
            r->status = 0;
            sp_buf_dispose(&in);
            return 0;
        }
        if (r->status >= 200) {
            r->head = sp_xstrndup(start, (size_t)(hend - start) + 2);
            start = hend + 4;
            break;
        }
        start = hend + 4;
    }
    char v[64];
    sp_buf_t b;
    sp_buf_init(&b);
    if (header_of(r->head, "transfer-encoding", v, sizeof(v)) && strcasecmp(v, "chunked") == 0)
        dechunk_all(start, (size_t)(end - start), &b);
    else
        sp_buf_append(&b, start, (size_t)(end - start));
    r->len = b.len;
    r->body = b.data ? sp_buf_take(&b) : sp_xstrdup("");
    sp_buf_dispose(&in);
    if (header_of(r->head, "content-type", v, sizeof(v)) && strstr(v, "json") && r->len > 0) {
        char err[SP_JSON_ERR_MAX];
        if (sp_json_parse(r->body, r->len, NULL, &r->doc, err) < 0)
            fail_msg("response is not JSON (%s): %s", err, r->body);
    }
    return r->status;
}

static const char *jstr(const resp_t *r, const char *k)
{
    return sp_json_str(sp_json_get(sp_json_root(r->doc), k), NULL);
}

static void expect_error(const resp_t *r, int status, const char *code)
{
    if (r->status != status || !r->doc || !jstr(r, "code") || strcmp(jstr(r, "code"), code) != 0)
        fail_msg("expected %d %s, got %d %s", status, code, r->status, r->body ? r->body : "");
    assert_non_null(jstr(r, "message"));
}

static void create_ok(const char *key, const char *body, char id[64])
{
    resp_t r;
    http("POST", "/v1/sandboxes", key, NULL, body, strlen(body), false, &r);
    if (r.status != 201)
        fail_msg("create: %d %s", r.status, r.body ? r.body : "");
    assert_string_equal(jstr(&r, "state"), "running");
    snprintf(id, 64, "%s", jstr(&r, "id"));
    resp_free(&r);
}

/* ---- the gateway process ---- */

static void start_gateway(void)
{
    char port_file[128], log_file[128], bin[4096];
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/gwtest.XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    snprintf(port_file, sizeof(port_file), "%s/space-gateway.port", tmpdir);
    snprintf(log_file, sizeof(log_file), "%s/space-gateway.log", tmpdir);
    snprintf(bin, sizeof(bin), "%s/space-gateway", sp_test_env("SPACE_BIN_DIR"));

    gw_pid = fork();
    assert_true(gw_pid >= 0);
    if (gw_pid == 0) {
        int fd = open(log_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            dup2(fd, 1);
        }
        /* SPACE_NATS_URL and SPACE_PG_URL come from the stack's space.env. */
        execl(bin, "space-gateway", "--listen-host", "127.0.0.1", "--port", "0", "--port-file",
              port_file, "--create-timeout-s", "20", "--sse-keepalive-s", "1",
              "--sse-write-timeout-s", "3", (char *)NULL);
        _exit(127);
    }
    port = sp_test_port_file(port_file, log_file);
}

static int setup(void **state)
{
    char key_id[SP_APIKEY_ID_LEN + 1];
    (void)state;

    sp_test_stack_load();
    bus = sp_test_bus();
    db = sp_test_db();
    /* This test plays scheduler and worker itself: its stack runs only the event log. */
    assert_int_equal(sp_test_daemon_pid("space-scheduler"), 0);
    assert_int_equal(sp_test_daemon_pid("space-worker"), 0);
    /* The eventlog has migrated the schema once it runs; wait for the keys table. */
    if (sp_test_db_wait_scalar(db, "SELECT count(*) FROM schema_migrations WHERE version = 2", 1,
                               20000) != 1)
        fail_msg("schema not migrated");
    assert_int_equal(sp_apikey_create(db, "t1", "gateway test", &key1, key1_id), 0);
    assert_int_equal(sp_apikey_create(db, "t2", "gateway test", &key2, key_id), 0);
    atomic_store(&owner_stop, false);
    assert_int_equal(pthread_create(&owner_thread, NULL, owner_main, NULL), 0);
    start_gateway();
    resp_t r;
    for (int i = 0; i < 100; i++) {
        if (http("GET", "/healthz", NULL, NULL, NULL, 0, false, &r) == 200)
            break;
        resp_free(&r);
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
    assert_int_equal(r.status, 200);
    resp_free(&r);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (gw_pid > 0) {
        kill(gw_pid, SIGKILL);
        waitpid(gw_pid, NULL, 0);
    }
    atomic_store(&owner_stop, true);
    pthread_join(owner_thread, NULL);
    explicit_bzero(key1, strlen(key1));
    explicit_bzero(key2, strlen(key2));
    free(key1);
    free(key2);
    PQfinish(db);
    sp_bus_free(bus);
    if (!getenv("SPACE_TEST_KEEP")) {
        char path[128];
        snprintf(path, sizeof(path), "%s/space-gateway.log", tmpdir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/space-gateway.port", tmpdir);
        unlink(path);
        rmdir(tmpdir);
    }
    return 0;
}

/* ---- scenarios ---- */

static void test_health_and_auth(void **state)
{
    resp_t r;
    char v[128];
    (void)state;

    assert_int_equal(http("GET", "/healthz", NULL, NULL, NULL, 0, false, &r), 200);
    assert_string_equal(jstr(&r, "status"), "ok");
    assert_non_null(resp_header(&r, "x-request-id", v, sizeof(v)));
    resp_free(&r);

    /* No key, a malformed one, an unknown one, another scheme. */
    http("GET", "/v1/sandboxes", NULL, NULL, NULL, 0, false, &r);
    expect_error(&r, 401, "unauthorized");
    resp_free(&r);
    http("GET", "/v1/sandboxes", "not-a-key", NULL, NULL, 0, false, &r);
    expect_error(&r, 401, "unauthorized");
    resp_free(&r);
    char forged[SP_APIKEY_LEN + 1];
    snprintf(forged, sizeof(forged), "%.*sX", SP_APIKEY_LEN - 1, key1);
    if (strcmp(forged, key1) == 0)
        forged[SP_APIKEY_LEN - 1] = 'Y';
    http("GET", "/v1/sandboxes", forged, NULL, NULL, 0, false, &r);
    expect_error(&r, 401, "unauthorized");
    resp_free(&r);
    http("GET", "/v1/sandboxes", NULL, "Authorization: Basic dTpw\r\n", NULL, 0, false, &r);
    expect_error(&r, 401, "unauthorized");
    resp_free(&r);

    /* A valid X-Request-Id is echoed; a bad one is replaced. */
    http("GET", "/v1/sandboxes", key1, "X-Request-Id: req_test-1\r\n", NULL, 0, false, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(resp_header(&r, "x-request-id", v, sizeof(v)), "req_test-1");
    resp_free(&r);
    http("GET", "/v1/sandboxes", key1, "X-Request-Id: bad id!\r\n", NULL, 0, false, &r);
    assert_int_equal(r.status, 200);
    assert_string_not_equal(resp_header(&r, "x-request-id", v, sizeof(v)), "bad id!");
    resp_free(&r);

    /* Unknown route, wrong method. Under /v1 our error shape; elsewhere the clients are E2B's
     * SDKs, whose shape is {"code": 404, "message"} (a number). */
    http("GET", "/v1/nothing", key1, NULL, NULL, 0, false, &r);
    expect_error(&r, 404, "not_found");
    resp_free(&r);
    http("GET", "/v2/nothing", key1, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 404);
    assert_non_null(r.doc);
    int64_t code = 0;
    assert_int_equal(sp_json_int(sp_json_get(sp_json_root(r.doc), "code"), 0, 999, &code), 0);
    assert_int_equal(code, 404);
    assert_non_null(jstr(&r, "message"));
    resp_free(&r);
    http("PUT", "/v1/sandboxes", key1, NULL, NULL, 0, false, &r);
    expect_error(&r, 405, "method_not_allowed");
    assert_string_equal(resp_header(&r, "allow", v, sizeof(v)), "GET, POST");
    resp_free(&r);
}

static void test_lifecycle(void **state)
{
    resp_t r, r2;
    char a[64], b[64], path[160];
    (void)state;

    /* Create: 201 once the projection shows it running, with every field. */
    const char *body = "{\"template\":\"base\",\"timeout_s\":120,\"metadata\":{\"team\":\"a\","
                       "\"purpose\":\"lifecycle\"},\"env\":{\"FOO\":\"s3cr3t-env-value\"},"
                       "\"resources\":{\"vcpu\":2,\"memory_mb\":256}}";
    http("POST", "/v1/sandboxes", key1, "X-Request-Id: lifecycle-create-1\r\n", body, strlen(body),
         false, &r);
    if (r.status != 201)
        fail_msg("create: %d %s", r.status, r.body);
    const sp_json_t *root = sp_json_root(r.doc);
    snprintf(a, sizeof(a), "%s", jstr(&r, "id"));
    assert_int_equal(strncmp(a, "sbx_", 4), 0);
    assert_string_equal(jstr(&r, "state"), "running");
    assert_string_equal(jstr(&r, "tenant"), "t1");
    assert_string_equal(jstr(&r, "template"), "base");
    assert_string_equal(jstr(&r, "worker"), WORKER);
    assert_non_null(jstr(&r, "created_at"));
    assert_non_null(jstr(&r, "started_at"));
    assert_non_null(jstr(&r, "timeout_at"));
    assert_string_equal(sp_json_str(sp_json_get(sp_json_get(root, "metadata"), "team"), NULL), "a");
    assert_string_equal(sp_json_str(sp_json_at(sp_json_get(root, "env_names"), 0), NULL), "FOO");
    int64_t x = 0;
    assert_int_equal(sp_json_int(sp_json_get(sp_json_get(root, "resources"), "vcpu"), 0, 99, &x),
                     0);
    assert_int_equal(x, 2);
    assert_int_equal(sp_json_type(sp_json_get(root, "network")), SP_JSON_NULL);
    char loc[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", a);
    assert_string_equal(resp_header(&r, "location", loc, sizeof(loc)), path);
    resp_free(&r);
    /* The intent names the key as actor and the request as correlation. */
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = "
             "'SandboxCreateRequested' AND actor = '%s' AND correlation_id = "
             "'lifecycle-create-1' AND tenant = 't1' AND status = 'accepted'",
             a, key1_id);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    /* The env value is in no event. */
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE position("
                                           "'s3cr3t-env-value'::bytea IN payload) > 0"),
                     0);

    /* Read it back; another tenant sees "not found", exactly like an unknown id. */
    assert_int_equal(http("GET", path, key1, NULL, NULL, 0, false, &r), 200);
    assert_string_equal(jstr(&r, "id"), a);
    assert_string_equal(jstr(&r, "state"), "running");
    resp_free(&r);
    http("GET", path, key2, NULL, NULL, 0, false, &r);
    expect_error(&r, 404, "not_found");
    http("GET", "/v1/sandboxes/sbx_doesnotexist", key2, NULL, NULL, 0, false, &r2);
    assert_string_equal(r.body, r2.body);
    resp_free(&r);
    resp_free(&r2);

    /* List with filters and pagination. */
    create_ok(key1,
              "{\"template\":\"base\",\"metadata\":{\"team\":\"b\",\"purpose\":\"lifecycle\"}}", b);
    http("GET", "/v1/sandboxes?metadata.purpose=lifecycle", key1, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(sp_json_len(sp_json_get(sp_json_root(r.doc), "sandboxes")), 2);
    resp_free(&r);
    http("GET", "/v1/sandboxes?metadata.purpose=lifecycle&metadata.team=a", key1, NULL, NULL, 0,
         false, &r);
    const sp_json_t *list = sp_json_get(sp_json_root(r.doc), "sandboxes");
    assert_int_equal(sp_json_len(list), 1);
    assert_string_equal(sp_json_str(sp_json_get(sp_json_at(list, 0), "id"), NULL), a);
    resp_free(&r);
    http("GET", "/v1/sandboxes?state=running&metadata.purpose=lifecycle&limit=1", key1, NULL, NULL,
         0, false, &r);
    list = sp_json_get(sp_json_root(r.doc), "sandboxes");
    assert_int_equal(sp_json_len(list), 1);
    const char *cursor = jstr(&r, "next_cursor");
    assert_non_null(cursor);
    char first[64], url[256];
    snprintf(first, sizeof(first), "%s", sp_json_str(sp_json_get(sp_json_at(list, 0), "id"), NULL));
    snprintf(url, sizeof(url),
             "/v1/sandboxes?state=running&metadata.purpose=lifecycle&limit=1&cursor=%s", cursor);
    resp_free(&r);
    http("GET", url, key1, NULL, NULL, 0, false, &r);
    list = sp_json_get(sp_json_root(r.doc), "sandboxes");
    assert_int_equal(sp_json_len(list), 1);
    const char *second = sp_json_str(sp_json_get(sp_json_at(list, 0), "id"), NULL);
    assert_string_not_equal(first, second);
    assert_true(strcmp(first, second) < 0);
    assert_int_equal(sp_json_type(sp_json_get(sp_json_root(r.doc), "next_cursor")), SP_JSON_NULL);
    resp_free(&r);
    http("GET", "/v1/sandboxes?metadata.purpose=lifecycle", key2, NULL, NULL, 0, false, &r);
    assert_int_equal(sp_json_len(sp_json_get(sp_json_root(r.doc), "sandboxes")), 0);
    resp_free(&r);
    http("GET", "/v1/sandboxes?state=sleeping", key1, NULL, NULL, 0, false, &r);
    expect_error(&r, 400, "invalid_query");
    resp_free(&r);

    /* Delete: 204 once deleted; then GET shows it deleted, the default list leaves it out. */
    http("DELETE", path, key2, NULL, NULL, 0, false, &r);
    expect_error(&r, 404, "not_found");
    resp_free(&r);
    http("DELETE", path, key1, NULL, NULL, 0, false, &r);
    if (r.status != 204)
        fail_msg("delete: %d %s", r.status, r.body);
    resp_free(&r);
    http("GET", path, key1, NULL, NULL, 0, false, &r);
    assert_string_equal(jstr(&r, "state"), "deleted");
    resp_free(&r);
    http("GET", "/v1/sandboxes?metadata.purpose=lifecycle", key1, NULL, NULL, 0, false, &r);
    list = sp_json_get(sp_json_root(r.doc), "sandboxes");
    assert_int_equal(sp_json_len(list), 1);
    assert_string_equal(sp_json_str(sp_json_get(sp_json_at(list, 0), "id"), NULL), b);
    resp_free(&r);
    http("GET", "/v1/sandboxes?state=deleted&metadata.purpose=lifecycle", key1, NULL, NULL, 0,
         false, &r);
    list = sp_json_get(sp_json_root(r.doc), "sandboxes");
    assert_int_equal(sp_json_len(list), 1);
    assert_string_equal(sp_json_str(sp_json_get(sp_json_at(list, 0), "id"), NULL), a);
    resp_free(&r);
    http("DELETE", path, key1, NULL, NULL, 0, false, &r);
    expect_error(&r, 404, "not_found");
    resp_free(&r);

    /* Templates: the union over live workers' heartbeats. */
    const char *const tmpl_a[] = {"base", "tiny"}, *const tmpl_b[] = {"base", "py312"};
    sp_eventgen_msg_t m;
    assert_int_equal(sp_eventgen_heartbeat("w-tmpl-a", tmpl_a, 2, 0, 60000, &m), 0);
    assert_int_equal(sp_test_sign(m.subject, &m.data, &m.len), 0);
    assert_int_equal(sp_bus_publish(bus, m.subject, m.data, m.len, m.event_id, NULL, NULL), 0);
    sp_eventgen_msg_dispose(&m);
    assert_int_equal(sp_eventgen_heartbeat("w-tmpl-b", tmpl_b, 2, 0, 60000, &m), 0);
    assert_int_equal(sp_test_sign(m.subject, &m.data, &m.len), 0);
    assert_int_equal(sp_bus_publish(bus, m.subject, m.data, m.len, m.event_id, NULL, NULL), 0);
    sp_eventgen_msg_dispose(&m);
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM workers WHERE id IN "
                                            "('w-tmpl-a', 'w-tmpl-b') AND state = 'up'",
                                            2, 20000),
                     2);
    assert_int_equal(http("GET", "/v1/templates", key1, NULL, NULL, 0, false, &r), 200);
    const sp_json_t *tl = sp_json_get(sp_json_root(r.doc), "templates");
    assert_int_equal(sp_json_len(tl), 3);
    assert_string_equal(sp_json_str(sp_json_get(sp_json_at(tl, 0), "name"), NULL), "base");
    assert_string_equal(sp_json_str(sp_json_get(sp_json_at(tl, 1), "name"), NULL), "py312");
    assert_string_equal(sp_json_str(sp_json_get(sp_json_at(tl, 2), "name"), NULL), "tiny");
    resp_free(&r);
}

static void test_refusals(void **state)
{
    resp_t r;
    (void)state;

    const char *nope = "{\"template\":\"nope\"}";
    http("POST", "/v1/sandboxes", key1, NULL, nope, strlen(nope), false, &r);
    expect_error(&r, 400, "unknown_template");
    assert_non_null(jstr(&r, "sandbox_id"));
    resp_free(&r);

    static const struct {
        const char *body, *code;
    } bad[] = {
        {"{\"template\":", "invalid_json"},
        {"{\"template\":\"base\",}", "invalid_json"},
        {"[\"base\"]", "invalid_json"},
        {"{\"template\":\"base\",\"colour\":\"red\"}", "unknown_field"},
        {"{\"template\":\"base\",\"resources\":{\"gpu\":1}}", "unknown_field"},
        {"{\"template\":42}", "invalid_field"},
        {"{\"template\":\"base\",\"timeout_s\":\"300\"}", "invalid_field"},
        {"{\"template\":\"base\",\"timeout_s\":2592001}", "invalid_field"},
        {"{\"template\":\"base\",\"metadata\":{\"k\":1}}", "invalid_field"},
        {"{\"template\":\"base\",\"env\":{\"BAD-NAME\":\"v\"}}", "invalid_field"},
        {"{\"template\":\"Base Image\"}", "invalid_field"},
        {"{\"timeout_s\":60}", "missing_field"},
        {"", "invalid_json"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        http("POST", "/v1/sandboxes", key1, NULL, bad[i].body, strlen(bad[i].body), false, &r);
        expect_error(&r, 400, bad[i].code);
        resp_free(&r);
    }

    /* 2 MB, announced and chunked: 413, and the gateway keeps serving. */
    size_t big = 2 * 1024 * 1024;
    char *junk = sp_xmalloc(big);
    memset(junk, ' ', big);
    junk[0] = '{';
    junk[big - 1] = '}';
    http("POST", "/v1/sandboxes", key1, NULL, junk, big, false, &r);
    expect_error(&r, 413, "body_too_large");
    resp_free(&r);
    http("POST", "/v1/sandboxes", key1, NULL, junk, big, true, &r);
    expect_error(&r, 413, "body_too_large");
    resp_free(&r);
    free(junk);
    assert_int_equal(http("GET", "/healthz", NULL, NULL, NULL, 0, false, &r), 200);
    resp_free(&r);
}

static void test_idempotency(void **state)
{
    resp_t r;
    char first[64];
    (void)state;
    const char *body = "{\"template\":\"base\",\"metadata\":{\"purpose\":\"idem\"}}";
    const char *other = "{\"template\":\"base\",\"metadata\":{\"purpose\":\"idem2\"}}";
    const char *hdr = "Idempotency-Key: create-once-1\r\n";

    http("POST", "/v1/sandboxes", key1, hdr, body, strlen(body), false, &r);
    assert_int_equal(r.status, 201);
    snprintf(first, sizeof(first), "%s", jstr(&r, "id"));
    resp_free(&r);
    http("POST", "/v1/sandboxes", key1, hdr, body, strlen(body), false, &r);
    assert_int_equal(r.status, 201);
    assert_string_equal(jstr(&r, "id"), first);
    resp_free(&r);
    http("POST", "/v1/sandboxes", key1, hdr, other, strlen(other), false, &r);
    expect_error(&r, 409, "idempotency_key_reused");
    resp_free(&r);
    /* Keys are per tenant: t2 may use the same one. */
    http("POST", "/v1/sandboxes", key2, hdr, body, strlen(body), false, &r);
    assert_int_equal(r.status, 201);
    assert_string_not_equal(jstr(&r, "id"), first);
    resp_free(&r);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM sandboxes WHERE metadata @> "
                                           "'{\"purpose\":\"idem\"}' AND tenant = 't1'"),
                     1);
}

typedef struct {
    int status;
    char id[64];
} concurrent_t;

static void *concurrent_create(void *arg)
{
    concurrent_t *c = arg;
    resp_t r;
    const char *body = "{\"template\":\"base\",\"metadata\":{\"purpose\":\"burst\"}}";
    c->status = http("POST", "/v1/sandboxes", key1, NULL, body, strlen(body), false, &r);
    if (r.doc && jstr(&r, "id"))
        snprintf(c->id, sizeof(c->id), "%s", jstr(&r, "id"));
    resp_free(&r);
    return NULL;
}

static void test_concurrent(void **state)
{
    enum { N = 10 };
    pthread_t t[N];
    concurrent_t c[N];
    (void)state;

    memset(c, 0, sizeof(c));
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_create(&t[i], NULL, concurrent_create, &c[i]), 0);
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < N; i++) {
        assert_int_equal(c[i].status, 201);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(c[i].id, c[j].id);
    }
}

/* ---- SSE ---- */

typedef struct {
    int fd;
    sp_buf_t raw, text;
    size_t raw_off, text_off;
    size_t chunk_left;
    bool need_crlf, eof;
} sse_t;

static int sse_open(sse_t *s, const char *path, const char *key, const char *last_id)
{
    char req[1024], v[64];
    memset(s, 0, sizeof(*s));
    sp_buf_init(&s->raw);
    sp_buf_init(&s->text);
    s->fd = connect_local();
    assert_true(s->fd >= 0);
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                     "Accept: text/event-stream\r\n%s%s%s\r\n",
                     path, key, last_id ? "Last-Event-ID: " : "", last_id ? last_id : "",
                     last_id ? "\r\n" : "");
    write_all(s->fd, req, (size_t)n);
    /* Read the head. */
    char buf[4096];
    for (;;) {
        if (s->raw.data && memmem(s->raw.data, s->raw.len, "\r\n\r\n", 4))
            break;
        ssize_t got = recv(s->fd, buf, sizeof(buf), 0);
        if (got <= 0)
            return 0;
        sp_buf_append(&s->raw, buf, (size_t)got);
    }
    int status =
        strncmp(s->raw.data, "HTTP/1.1 ", 9) == 0 ? (int)strtol(s->raw.data + 9, NULL, 10) : 0;
    const char *hend = memmem(s->raw.data, s->raw.len, "\r\n\r\n", 4);
    char *head = sp_xstrndup(s->raw.data, (size_t)(hend - s->raw.data) + 2);
    if (status == 200) {
        assert_non_null(header_of(head, "content-type", v, sizeof(v)));
        assert_string_equal(v, "text/event-stream");
        assert_non_null(header_of(head, "x-request-id", v, sizeof(v)));
    }
    free(head);
    s->raw_off = (size_t)(hend - s->raw.data) + 4;
    return status;
}

static void sse_close(sse_t *s)
{
    close(s->fd);
    sp_buf_dispose(&s->raw);
    sp_buf_dispose(&s->text);
}

static void sse_dechunk(sse_t *s)
{
    for (;;) {
        const char *p = s->raw.data + s->raw_off;
        size_t avail = s->raw.len - s->raw_off;
        if (s->chunk_left > 0) {
            size_t n = avail < s->chunk_left ? avail : s->chunk_left;
            if (n == 0)
                return;
            sp_buf_append(&s->text, p, n);
            s->raw_off += n;
            s->chunk_left -= n;
            s->need_crlf = s->chunk_left == 0;
            continue;
        }
        if (s->need_crlf) {
            if (avail < 2)
                return;
            s->raw_off += 2;
            s->need_crlf = false;
            continue;
        }
        const char *crlf = avail ? memmem(p, avail, "\r\n", 2) : NULL;
        if (!crlf)
            return;
        size_t sz = strtoul(p, NULL, 16);
        s->raw_off += (size_t)(crlf - p) + 2;
        if (sz == 0) {
            s->eof = true;
            return;
        }
        s->chunk_left = sz;
    }
}

/* The next event: 1 with its id, type and data; 0 on timeout; -1 when the stream ended. */
static int sse_next(sse_t *s, uint64_t *id, char *type, size_t typelen, sp_buf_t *data,
                    int timeout_ms)
{
    int64_t deadline = sp_mono_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        const char *t = s->text.data ? s->text.data + s->text_off : "";
        size_t avail = s->text.len - s->text_off;
        const char *end = avail ? memmem(t, avail, "\n\n", 2) : NULL;
        if (end) {
            bool have_id = false;
            sp_buf_reset(data);
            type[0] = '\0';
            for (const char *l = t; l < end;) {
                const char *nl = memchr(l, '\n', (size_t)(end - l));
                size_t len = nl ? (size_t)(nl - l) : (size_t)(end - l);
                if (len > 4 && strncmp(l, "id: ", 4) == 0) {
                    *id = strtoull(l + 4, NULL, 10);
                    have_id = true;
                } else if (len > 7 && strncmp(l, "event: ", 7) == 0) {
                    snprintf(type, typelen, "%.*s", (int)(len - 7), l + 7);
                } else if (len > 6 && strncmp(l, "data: ", 6) == 0) {
                    sp_buf_append(data, l + 6, len - 6);
                }
                l += len + 1;
            }
            s->text_off = (size_t)(end - s->text.data) + 2;
            if (have_id)
                return 1;
            continue; /* a comment (keepalive) */
        }
        if (s->eof)
            return -1;
        int left = (int)((deadline - sp_mono_ns()) / 1000000);
        if (left <= 0)
            return 0;
        struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
        if (poll(&pfd, 1, left) <= 0)
            return 0;
        char buf[16384];
        ssize_t got = recv(s->fd, buf, sizeof(buf), 0);
        if (got <= 0) {
            s->eof = true;
            continue;
        }
        sp_buf_append(&s->raw, buf, (size_t)got);
        sse_dechunk(s);
    }
}

/* The ids t1 may see after start, from the table itself. */
static size_t t1_seqs(uint64_t after, uint64_t *out, size_t max)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT stream_seq FROM events WHERE tenant = 't1' AND aggregate_kind = 'sandbox' "
             "AND stream_seq > %llu ORDER BY stream_seq",
             (unsigned long long)after);
    PGresult *r = PQexec(db, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    size_t n = (size_t)PQntuples(r);
    assert_true(n <= max);
    for (size_t i = 0; i < n; i++)
        out[i] = strtoull(PQgetvalue(r, (int)i, 0), NULL, 10);
    PQclear(r);
    return n;
}

static void check_record(uint64_t id, const char *type, const sp_buf_t *data)
{
    char want[64];
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    snprintf(want, sizeof(want), "\"seq\":%llu,", (unsigned long long)id);
    if (!data->data || !strstr(data->data, want))
        fail_msg("event %llu: data lacks %s: %s", (unsigned long long)id, want,
                 data->data ? data->data : "");
    if (sp_json_parse(data->data, data->len, NULL, &doc, err) < 0)
        fail_msg("event %llu: data is not JSON: %s", (unsigned long long)id, err);
    const sp_json_t *ev = sp_json_get(sp_json_root(doc), "event");
    assert_string_equal(sp_json_str(sp_json_get(ev, "type"), NULL), type);
    assert_string_equal(sp_json_str(sp_json_get(ev, "tenant"), NULL), "t1");
    sp_json_doc_free(doc);
}

static void test_sse_resume(void **state)
{
    enum { MAX = 4096 };
    static uint64_t want[MAX], got[MAX];
    size_t n_got = 0;
    sse_t s;
    uint64_t id = 0;
    char type[64], start[32], idbuf[32];
    sp_buf_t data;
    char sbx[64];
    (void)state;

    sp_buf_init(&data);
    uint64_t from = (uint64_t)sp_test_db_scalar(
        db, "SELECT coalesce(max(stream_seq), 0) FROM events WHERE tenant = 't1'");
    snprintf(start, sizeof(start), "%llu", (unsigned long long)from);

    /* Another tenant's stream from the very beginning never shows t1's events. */
    sse_t other;
    assert_int_equal(sse_open(&other, "/v1/events?from=0", key2, NULL), 200);

    assert_int_equal(sse_open(&s, "/v1/events", key1, start), 200);
    for (int i = 0; i < 3; i++)
        create_ok(key1, "{\"template\":\"base\",\"metadata\":{\"purpose\":\"sse\"}}", sbx);
    /* Read some, then vanish mid-stream. */
    for (int i = 0; i < 4; i++) {
        int rc = sse_next(&s, &id, type, sizeof(type), &data, 10000);
        assert_int_equal(rc, 1);
        check_record(id, type, &data);
        got[n_got++] = id;
    }
    sse_close(&s);

    /* Life goes on while the client is away. */
    for (int i = 0; i < 2; i++)
        create_ok(key1, "{\"template\":\"base\",\"metadata\":{\"purpose\":\"sse\"}}", sbx);
    resp_t r;
    char path[128];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    http("DELETE", path, key1, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 204);
    resp_free(&r);

    /* Resume after the last id seen: everything after it, once, in order. */
    size_t n_want = t1_seqs(from, want, MAX);
    assert_true(n_want >= 3 * 3 + 2 * 3 + 2);
    snprintf(idbuf, sizeof(idbuf), "%llu", (unsigned long long)got[n_got - 1]);
    assert_int_equal(sse_open(&s, "/v1/events", key1, idbuf), 200);
    while (n_got < n_want) {
        int rc = sse_next(&s, &id, type, sizeof(type), &data, 10000);
        if (rc != 1)
            fail_msg("stream ended or stalled after %zu of %zu events", n_got, n_want);
        check_record(id, type, &data);
        got[n_got++] = id;
    }
    /* Nothing more than the table has. */
    assert_int_equal(sse_next(&s, &id, type, sizeof(type), &data, 1500), 0);
    sse_close(&s);
    for (size_t i = 0; i < n_want; i++)
        if (got[i] != want[i])
            fail_msg("event %zu: got seq %llu, the table has %llu", i, (unsigned long long)got[i],
                     (unsigned long long)want[i]);
    print_message("SSE: %zu events across a reconnect, none missing, none repeated\n", n_got);

    /* t2 saw nothing of it (only its own sandbox from the idempotency test, if any). */
    while (sse_next(&other, &id, type, sizeof(type), &data, 500) == 1) {
        if (strstr(data.data, "\"tenant\":\"t1\""))
            fail_msg("t2's stream showed a t1 event: %s", data.data);
    }
    sse_close(&other);

    /* The per-sandbox stream from the beginning: that sandbox's life only. */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/events?from=0", sbx);
    assert_int_equal(sse_open(&s, path, key1, NULL), 200);
    const char *life[] = {"SandboxCreateRequested", "SandboxPlaced", "SandboxStarted",
                          "SandboxDeleteRequested", "SandboxDeleted"};
    for (size_t i = 0; i < sizeof(life) / sizeof(life[0]); i++) {
        assert_int_equal(sse_next(&s, &id, type, sizeof(type), &data, 5000), 1);
        assert_string_equal(type, life[i]);
        assert_non_null(strstr(data.data, sbx));
    }
    sse_close(&s);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/events", sbx);
    assert_int_equal(sse_open(&s, path, key2, NULL), 404);
    sse_close(&s);
    sp_buf_dispose(&data);
}

static long long metric(const char *name)
{
    resp_t r;
    long long v = -1;
    if (http("GET", "/metrics", NULL, NULL, NULL, 0, false, &r) == 200) {
        char line[160];
        snprintf(line, sizeof(line), "\n%s ", name);
        const char *p = strstr(r.body, line);
        if (p)
            v = strtoll(p + strlen(line), NULL, 10);
    }
    resp_free(&r);
    return v;
}

/* A client that stops reading while thousands of events arrive: the gateway holds at most a
 * couple of pages for it, and once its writes stall past sse-write-timeout-s (3 s here) the
 * connection is closed; the gateway keeps serving everyone else. */
static void test_sse_slow_client(void **state)
{
    enum { SANDBOXES = 4000 };
    char start[32], sbx[32];
    sse_t s;
    (void)state;

    uint64_t from = (uint64_t)sp_test_db_scalar(
        db, "SELECT coalesce(max(stream_seq), 0) FROM events WHERE tenant = 't1'");
    snprintf(start, sizeof(start), "%llu", (unsigned long long)from);
    long long closed_before = metric("space_gateway_sse_streams_closed_slow_total");

    /* A tiny receive buffer, set before connecting so the window stays small. */
    memset(&s, 0, sizeof(s));
    sp_buf_init(&s.raw);
    sp_buf_init(&s.text);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    setsockopt(s.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    assert_int_equal(connect(s.fd, (struct sockaddr *)&a, sizeof(a)), 0);
    char req[512];
    int n = snprintf(req, sizeof(req),
                     "GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                     "Last-Event-ID: %s\r\n\r\n",
                     key1, start);
    write_all(s.fd, req, (size_t)n);

    /* 4000 sandboxes x 5 events, about 12 MB of SSE: far more than socket buffers hold. */
    for (int i = 0; i < SANDBOXES; i++) {
        snprintf(sbx, sizeof(sbx), "sbx_bulk%05d", i);
        for (size_t k = 0; k < 5; k++) {
            sp_eventgen_msg_t m;
            assert_int_equal(sp_eventgen_sandbox(sp_eventgen_lifecycle[k], "t1", sbx, WORKER, &m),
                             0);
            assert_int_equal(sp_bus_publish_async(bus, m.subject, m.data, m.len, m.event_id), 0);
            sp_eventgen_msg_dispose(&m);
        }
    }
    assert_int_equal(sp_bus_publish_async_complete(bus, 30000), 0);

    long long closed = closed_before;
    for (int i = 0; i < 100 && closed <= closed_before; i++) {
        nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
        closed = metric("space_gateway_sse_streams_closed_slow_total");
    }
    assert_true(closed > closed_before);
    /* The client finds its stream ended (reset or closed) once it reads again. */
    char buf[65536];
    ssize_t got;
    size_t total = 0;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    while ((got = recv(s.fd, buf, sizeof(buf), 0)) > 0)
        total += (size_t)got;
    assert_true(got == 0 || errno == ECONNRESET);
    print_message("slow client: closed after it had read %zu bytes\n", total);
    sse_close(&s);

    resp_t r;
    assert_int_equal(http("GET", "/healthz", NULL, NULL, NULL, 0, false, &r), 200);
    resp_free(&r);
}

static void test_metrics_and_latency(void **state)
{
    enum { N = 50 };
    double ms[N];
    char id[64];
    resp_t r;
    (void)state;

    for (int i = 0; i < N; i++) {
        int64_t t0 = sp_mono_ns();
        create_ok(key1, "{\"template\":\"base\",\"metadata\":{\"purpose\":\"latency\"}}", id);
        ms[i] = (double)(sp_mono_ns() - t0) / 1e6;
    }
    for (int i = 1; i < N; i++)
        for (int j = i; j > 0 && ms[j - 1] > ms[j]; j--) {
            double t = ms[j];
            ms[j] = ms[j - 1];
            ms[j - 1] = t;
        }
    print_message("create through HTTP with the fake owner: p50 %.2f ms, p90 %.2f ms, max %.2f "
                  "ms (n=%d)\n",
                  ms[N / 2], ms[N * 9 / 10], ms[N - 1], N);

    assert_int_equal(http("GET", "/metrics", NULL, NULL, NULL, 0, false, &r), 200);
    assert_non_null(strstr(r.body, "space_gateway_requests_total{route=\"sandbox_create\","
                                   "status=\"201\"}"));
    assert_non_null(strstr(r.body, "space_gateway_create_seconds_count"));
    assert_non_null(strstr(r.body, "space_gateway_sse_streams"));
    assert_non_null(strstr(r.body, "space_gateway_publish_failures_total 0"));
    assert_non_null(strstr(r.body, "space_gateway_requests_in_flight"));
    resp_free(&r);
}

/* The web console's files (gateway_console.c): answered without a key, each with the
 * security headers, only the compiled-in names, GET only, counted under route="console". */
static void test_console(void **state)
{
    static const char *const pages[] = {"/", "/console/", "/console/index.html"};
    static const struct {
        const char *path, *type;
    } assets[] = {
        {"/console/console.css", "text/css; charset=utf-8"},
        {"/console/api.js", "text/javascript; charset=utf-8"},
        {"/console/view.js", "text/javascript; charset=utf-8"},
        {"/console/console.js", "text/javascript; charset=utf-8"},
    };
    char v[512];
    resp_t r;
    (void)state;

    for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++) {
        assert_int_equal(http("GET", pages[i], NULL, NULL, NULL, 0, false, &r), 200);
        assert_string_equal(resp_header(&r, "content-type", v, sizeof(v)),
                            "text/html; charset=utf-8");
        assert_non_null(strstr(r.body ? r.body : "", "<script src=\"/console/console.js\" defer>"));
        assert_string_equal(resp_header(&r, "content-security-policy", v, sizeof(v)),
                            "default-src 'self'; script-src 'self'; style-src 'self'; img-src "
                            "'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                            "base-uri 'none'; form-action 'self'");
        assert_string_equal(resp_header(&r, "x-content-type-options", v, sizeof(v)), "nosniff");
        assert_string_equal(resp_header(&r, "x-frame-options", v, sizeof(v)), "DENY");
        assert_string_equal(resp_header(&r, "referrer-policy", v, sizeof(v)), "no-referrer");
        assert_string_equal(resp_header(&r, "cache-control", v, sizeof(v)), "no-cache");
        /* One Cache-Control, the console's: no no-store from gw_add_common_headers. */
        assert_non_null(r.head);
        assert_null(strstr(r.head ? r.head : "", "no-store"));
        assert_non_null(resp_header(&r, "x-request-id", v, sizeof(v)));
        resp_free(&r);
    }
    for (size_t i = 0; i < sizeof(assets) / sizeof(assets[0]); i++) {
        assert_int_equal(http("GET", assets[i].path, NULL, NULL, NULL, 0, false, &r), 200);
        assert_string_equal(resp_header(&r, "content-type", v, sizeof(v)), assets[i].type);
        assert_true(r.len > 0);
        assert_string_equal(resp_header(&r, "x-content-type-options", v, sizeof(v)), "nosniff");
        resp_free(&r);
    }
    /* Names outside the table, traversal included, are unknown; nothing is read from disk. */
    http("GET", "/console/missing.js", NULL, NULL, NULL, 0, false, &r);
    expect_error(&r, 404, "not_found");
    assert_string_equal(resp_header(&r, "x-frame-options", v, sizeof(v)), "DENY");
    resp_free(&r);
    http("GET", "/console/%2e%2e%2fmain.c", NULL, NULL, NULL, 0, false, &r);
    expect_error(&r, 404, "not_found");
    resp_free(&r);
    http("GET", "/console/../CMakeLists.txt", NULL, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 404);
    resp_free(&r);
    http("POST", "/", NULL, NULL, "x", 1, false, &r);
    expect_error(&r, 405, "method_not_allowed");
    assert_string_equal(resp_header(&r, "allow", v, sizeof(v)), "GET");
    resp_free(&r);

    assert_int_equal(http("GET", "/metrics", NULL, NULL, NULL, 0, false, &r), 200);
    assert_non_null(strstr(r.body ? r.body : "", "space_gateway_requests_total{route=\"console\","
                                                 "status=\"200\"}"));
    resp_free(&r);
}

/* One route table serves every dialect: a wrong method is a 405 naming the allowed methods
 * (Allow) in the route's own error shape; E2B's resources this server lacks are 501 without a
 * key; unknown paths under E2B's prefixes are E2B's numeric 404. */
static void test_routes_dialects(void **state)
{
    resp_t r;
    char v[128];
    int64_t code = 0;
    (void)state;

    /* E2B's control plane: {"code": 405, "message"}. */
    http("DELETE", "/v2/sandboxes", key1, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 405);
    assert_string_equal(resp_header(&r, "allow", v, sizeof(v)), "POST, GET");
    assert_non_null(r.doc);
    assert_int_equal(sp_json_int(sp_json_get(sp_json_root(r.doc), "code"), 0, 999, &code), 0);
    assert_int_equal(code, 405);
    resp_free(&r);
    http("GET", "/sandboxes/sbx_x/connect", key1, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 405);
    assert_string_equal(resp_header(&r, "allow", v, sizeof(v)), "POST");
    resp_free(&r);
    /* envd's Connect RPC: unary procedures answer Connect's JSON error (405 is unimplemented,
     * HTTP 501 in Connect's table), still naming POST; once, though two rows have the path. */
    http("GET", "/filesystem.Filesystem/Stat", NULL, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 501);
    assert_string_equal(resp_header(&r, "allow", v, sizeof(v)), "POST");
    assert_non_null(r.doc);
    assert_string_equal(jstr(&r, "code"), "unimplemented");
    resp_free(&r);
    http("PUT", "/files", NULL, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 405);
    assert_string_equal(resp_header(&r, "allow", v, sizeof(v)), "GET, POST");
    resp_free(&r);
    /* No procedure of that name: Connect's not_found. */
    http("POST", "/process.Process/Start/more", NULL, NULL, "{}", 2, false, &r);
    assert_int_equal(r.status, 404);
    assert_string_equal(jstr(&r, "code"), "not_found");
    resp_free(&r);

    /* Unserved E2B resources: 501 before any key is asked for. */
    http("GET", "/v3/templates/abc", NULL, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 501);
    assert_non_null(strstr(jstr(&r, "message"), "/v3/templates"));
    resp_free(&r);
    http("POST", "/v2/sandboxes/sbx_x/refreshes", NULL, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 501);
    assert_non_null(strstr(jstr(&r, "message"), "/v2/sandboxes/{id}/refreshes"));
    resp_free(&r);
    /* Unknown routes under /sandboxes: E2B's numeric 404. */
    http("GET", "/v2/sandboxes/sbx_x", key1, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 404);
    assert_int_equal(sp_json_int(sp_json_get(sp_json_root(r.doc), "code"), 0, 999, &code), 0);
    assert_int_equal(code, 404);
    assert_string_equal(jstr(&r, "message"), "no such route");
    resp_free(&r);
    http("GET", "/sandboxes//connect", key1, NULL, NULL, 0, false, &r);
    assert_int_equal(r.status, 404);
    assert_string_equal(jstr(&r, "message"), "sandbox not found");
    resp_free(&r);
}

static void test_sigterm(void **state)
{
    sse_t s;
    uint64_t id;
    char type[64];
    sp_buf_t data;
    int st = 0;
    (void)state;

    /* An open stream ends cleanly, and the process exits 0. */
    sp_buf_init(&data);
    assert_int_equal(sse_open(&s, "/v1/events", key1, NULL), 200);
    assert_int_equal(kill(gw_pid, SIGTERM), 0);
    int rc = 0;
    for (int i = 0; i < 20 && rc != -1; i++)
        rc = sse_next(&s, &id, type, sizeof(type), &data, 500);
    assert_int_equal(rc, -1);
    sse_close(&s);
    sp_buf_dispose(&data);
    pid_t w = 0;
    for (int i = 0; i < 100 && w == 0; i++) {
        w = waitpid(gw_pid, &st, WNOHANG);
        if (w == 0)
            nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    assert_int_equal(w, gw_pid);
    gw_pid = 0;
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_and_auth), cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_refusals),        cmocka_unit_test(test_idempotency),
        cmocka_unit_test(test_concurrent),      cmocka_unit_test(test_sse_resume),
        cmocka_unit_test(test_sse_slow_client), cmocka_unit_test(test_metrics_and_latency),
        cmocka_unit_test(test_console),         cmocka_unit_test(test_routes_dialects),
        cmocka_unit_test(test_sigterm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
