/* space-gateway commands end to end: POST /v1/sandboxes/{id}/commands over a real stack (NATS,
 * PostgreSQL, space-eventlog), with the worker's side of the data plane played by a fake on
 * space.io.wkr.w-test.exec. The sandboxes are made by publishing their lifecycle facts. Covers
 * the JSON answer and the SSE events, exit codes, stdin, environment values kept out of the
 * event log, the CommandRequested event, refusals (tenant, state, body, background, worker
 * refusals, no responder), the 16 MiB JSON cap under a 62.5 MiB flood, a slow and a vanishing
 * SSE client, lost output, a worker that never ends, and the exec round trip. The test starts
 * its own gateway on an ephemeral port. */
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
#include "buf.h"
#include "dataplane.pb-c.h"
#include "envelope.h"
#include "eventgen.h"
#include "harness.h"
#include "hash.h"
#include "ids.h"
#include "json.h"
#include "request.h"
#include "verifier.h"
#include "xmalloc.h"

#define WORKER      "w-test"
#define SBX         "sbx_cmdtest1"
#define SBX_PAUSED  "sbx_cmdpaused"
#define SBX_NOBODY  "sbx_cmdnobody"
#define SBX_MOVING  "sbx_cmdmoving"
#define GRACE_S     "3" /* the gateway's command-grace-s */
#define FLOOD_N     2000
#define FLOOD_CHUNK (32 * 1024)
#define JSON_CAP    (16 * 1024 * 1024)

static sp_bus_t *bus;
static PGconn *db;
static char *key1, *key2;
static char key1_id[SP_APIKEY_ID_LEN + 1];
static int port;
static pid_t gw_pid;
static char tmpdir[64];
static sp_bus_sub_t *exec_sub;
static atomic_int players; /* output threads still publishing */

/* What the fake worker saw last (under seen_mu). */
static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char cmd_id[80], tenant[80], sandbox[80], intent[80], corr[80], user[16];
    char env0[256];
    size_t n_env, stdin_len;
    uint32_t timeout_s;
} seen;

/* ---- the fake worker ---- */

typedef struct {
    char cmd_id[80];
    char mode[32];
    uint8_t *data; /* stdin or the env value to echo */
    size_t len;
} play_t;

static void pub_chunk(const char *cmd_id, uint64_t seq, uint32_t stream, const void *p, size_t n)
{
    Space__Io__V1__IoChunk m = SPACE__IO__V1__IO_CHUNK__INIT;
    char subject[128];
    m.cmd_id = (char *)cmd_id;
    m.seq = seq;
    m.stream = stream;
    m.data.data = (uint8_t *)p;
    m.data.len = n;
    size_t len = space__io__v1__io_chunk__get_packed_size(&m);
    uint8_t *buf = sp_xmalloc(len);
    space__io__v1__io_chunk__pack(&m, buf);
    snprintf(subject, sizeof(subject), "space.io.cmd.%s.out", cmd_id);
    if (sp_bus_publish_core(bus, subject, buf, len) < 0)
        fprintf(stderr, "fake worker: cannot publish a chunk\n");
    free(buf);
}

static void pub_exit(const char *cmd_id, int32_t code, uint64_t out_bytes, uint64_t err_bytes,
                     uint64_t last_seq)
{
    Space__Io__V1__IoExit m = SPACE__IO__V1__IO_EXIT__INIT;
    char subject[128];
    m.cmd_id = (char *)cmd_id;
    m.exit_code = code;
    m.stdout_bytes = out_bytes;
    m.stderr_bytes = err_bytes;
    m.last_seq = last_seq;
    m.duration_ms = 1;
    size_t len = space__io__v1__io_exit__get_packed_size(&m);
    uint8_t *buf = sp_xmalloc(len);
    space__io__v1__io_exit__pack(&m, buf);
    snprintf(subject, sizeof(subject), "space.io.cmd.%s.exit", cmd_id);
    if (sp_bus_publish_core(bus, subject, buf, len) < 0)
        fprintf(stderr, "fake worker: cannot publish the exit\n");
    free(buf);
}

static void *play_main(void *arg)
{
    play_t *p = arg;
    const char *id = p->cmd_id;

    if (strcmp(p->mode, "echo hi") == 0) {
        pub_chunk(id, 1, 1, "hi\n", 3);
        pub_exit(id, 0, 3, 0, 1);
    } else if (strcmp(p->mode, "exit 3") == 0) {
        pub_exit(id, 3, 0, 0, 0);
    } else if (strcmp(p->mode, "cat") == 0 || strcmp(p->mode, "printenv") == 0) {
        uint64_t seq = 0;
        for (size_t off = 0; off < p->len; off += 65536) {
            size_t n = p->len - off < 65536 ? p->len - off : 65536;
            pub_chunk(id, ++seq, 1, p->data + off, n);
        }
        pub_exit(id, 0, p->len, 0, seq);
    } else if (strcmp(p->mode, "flood") == 0) {
        uint8_t *chunk = sp_xmalloc(FLOOD_CHUNK);
        for (uint64_t i = 0; i < FLOOD_N; i++) {
            memset(chunk, 'a' + (int)(i % 26), FLOOD_CHUNK);
            pub_chunk(id, i + 1, 1, chunk, FLOOD_CHUNK);
        }
        free(chunk);
        pub_exit(id, 0, (uint64_t)FLOOD_N * FLOOD_CHUNK, 0, FLOOD_N);
    } else if (strcmp(p->mode, "gap") == 0) {
        pub_chunk(id, 1, 1, "a", 1);
        pub_chunk(id, 2, 1, "b", 1);
        pub_chunk(id, 4, 1, "d", 1); /* 3 never comes */
        pub_exit(id, 0, 4, 0, 4);
    } else if (strcmp(p->mode, "split") == 0) {
        /* "é" (c3 a9) cut between two chunks, and some stderr. */
        pub_chunk(id, 1, 1, "h\xc3", 2);
        pub_chunk(id, 2, 2, "warn\n", 5);
        pub_chunk(id, 3, 1, "\xa9llo\n", 5);
        pub_exit(id, 0, 7, 5, 3);
    } else if (strcmp(p->mode, "binary") == 0) {
        pub_chunk(id, 1, 1, "\xff\x00\x01", 3);
        pub_exit(id, 0, 3, 0, 1);
    } else if (strcmp(p->mode, "silent") != 0) {
        /* Anything else ends at once with nothing to say ("silent" is accepted and then never
         * heard of: the gateway must give up on its own). */
        pub_exit(id, 0, 0, 0, 0);
    }
    free(p->data);
    free(p);
    atomic_fetch_sub(&players, 1);
    return NULL;
}

static void reply(const char *to, bool accepted, const char *error, const char *detail)
{
    Space__Io__V1__ExecReply r = SPACE__IO__V1__EXEC_REPLY__INIT;
    r.accepted = accepted;
    r.error = (char *)(error ? error : "");
    r.detail = (char *)(detail ? detail : "");
    size_t len = space__io__v1__exec_reply__get_packed_size(&r);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    space__io__v1__exec_reply__pack(&r, buf);
    if (sp_bus_publish_core(bus, to, buf, len) < 0)
        fprintf(stderr, "fake worker: cannot reply\n");
    free(buf);
}

/* The fake worker checks what a worker checks: the gateway's signed request (request.h). */
static sp_verifier_t *verifier;
static sp_request_guard_t *guard;

static void on_exec(void *arg, const char *subject, const char *reply_to, const uint8_t *raw,
                    size_t raw_len)
{
    (void)arg;
    sp_request_t rq;
    char why[SP_REASON_MAX];
    if (sp_request_take(guard, bus, subject, reply_to, raw, raw_len, &rq, why) != 0) {
        fprintf(stderr, "fake worker: request refused: %s\n", why);
        sp_request_dispose(&rq);
        return;
    }
    Space__Io__V1__ExecRequest *req = space__io__v1__exec_request__unpack(NULL, rq.len, rq.body);
    sp_request_dispose(&rq);
    if (!req || !reply_to) {
        fprintf(stderr, "fake worker: not an ExecRequest\n");
        return;
    }
    pthread_mutex_lock(&seen_mu);
    snprintf(seen.cmd_id, sizeof(seen.cmd_id), "%s", req->cmd_id);
    snprintf(seen.tenant, sizeof(seen.tenant), "%s", req->tenant);
    snprintf(seen.sandbox, sizeof(seen.sandbox), "%s", req->sandbox);
    snprintf(seen.intent, sizeof(seen.intent), "%s", req->intent_event_id);
    snprintf(seen.corr, sizeof(seen.corr), "%s", req->correlation_id);
    snprintf(seen.user, sizeof(seen.user), "%s", req->user);
    snprintf(seen.env0, sizeof(seen.env0), "%s", req->n_env ? req->env[0] : "");
    seen.n_env = req->n_env;
    seen.stdin_len = req->stdin.len;
    seen.timeout_s = req->timeout_s;
    pthread_mutex_unlock(&seen_mu);

    const char *what = req->n_argv > 0 ? req->argv[0] : req->cmd;
    if (req->n_argv == 2 && strcmp(req->argv[0], "echo") == 0 && strcmp(req->argv[1], "hi") == 0)
        what = "echo hi";
    if (strcmp(what, "refuse_busy") == 0) {
        reply(reply_to, false, "too_many_commands", "64 commands run");
    } else if (strcmp(what, "refuse_agent") == 0) {
        reply(reply_to, false, "agent_unavailable", "the agent does not answer");
    } else if (strcmp(what, "refuse_weird") == 0) {
        reply(reply_to, false, "disk_on_fire", "smoke\x01 everywhere");
    } else {
        play_t *p = sp_xcalloc(1, sizeof(*p));
        snprintf(p->cmd_id, sizeof(p->cmd_id), "%s", req->cmd_id);
        snprintf(p->mode, sizeof(p->mode), "%s", what);
        if (strncmp(what, "printenv ", 9) == 0) {
            /* Echo the value of the named variable: proof the value travelled. */
            snprintf(p->mode, sizeof(p->mode), "printenv");
            char pre[160];
            int pl = snprintf(pre, sizeof(pre), "%s=", what + 9);
            for (size_t i = 0; i < req->n_env && pl > 0; i++)
                if (strlen(req->env[i]) >= (size_t)pl &&
                    memcmp(req->env[i], pre, (size_t)pl) == 0) {
                    p->data = (uint8_t *)sp_xasprintf("%s\n", req->env[i] + pl);
                    p->len = strlen((char *)p->data);
                }
        } else if (strcmp(what, "cat") == 0 && req->stdin.len) {
            p->data = sp_xmalloc(req->stdin.len);
            memcpy(p->data, req->stdin.data, req->stdin.len);
            p->len = req->stdin.len;
        }
        reply(reply_to, true, NULL, NULL);
        pthread_t t;
        atomic_fetch_add(&players, 1);
        if (pthread_create(&t, NULL, play_main, p) != 0) {
            atomic_fetch_sub(&players, 1);
            free(p->data);
            free(p);
        } else {
            pthread_detach(t);
        }
    }
    space__io__v1__exec_request__free_unpacked(req, NULL);
}

/* ---- sandboxes, made from their facts ---- */

static void publish_gen(sp_event_type_t type, const char *tenant, const char *sbx,
                        const char *worker)
{
    sp_eventgen_msg_t m;
    assert_int_equal(sp_eventgen_sandbox(type, tenant, sbx, worker, &m), 0);
    assert_int_equal(sp_test_sign(m.subject, &m.data, &m.len), 0);
    assert_int_equal(sp_bus_publish(bus, m.subject, m.data, m.len, m.event_id, NULL, NULL), 0);
    sp_eventgen_msg_dispose(&m);
}

static void make_sandbox(const char *tenant, const char *sbx, const char *worker, bool paused)
{
    char sql[256];
    publish_gen(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, tenant, sbx, NULL);
    publish_gen(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED, tenant, sbx, worker);
    publish_gen(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, tenant, sbx, worker);
    if (paused)
        publish_gen(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED, tenant, sbx, worker);
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = '%s'",
             sbx, paused ? "paused" : "running");
    if (sp_test_db_wait_scalar(db, sql, 1, 20000) != 1)
        fail_msg("sandbox %s did not reach its state", sbx);
}

/* ---- a minimal HTTP/1.1 client (127.0.0.1 only) ---- */

typedef struct {
    int status;
    char *head;
    char *body;
    size_t len;
    sp_json_doc_t *doc;
} resp_t;

static void resp_free(resp_t *r)
{
    free(r->head);
    free(r->body);
    sp_json_doc_free(r->doc);
    memset(r, 0, sizeof(*r));
}

static int connect_local(int rcvbuf)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 90};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

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

static void send_request(int fd, const char *method, const char *path, const char *key,
                         const char *headers, const char *body, size_t len)
{
    sp_buf_t req;
    sp_buf_init(&req);
    sp_buf_printf(&req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, path);
    if (key)
        sp_buf_printf(&req, "Authorization: Bearer %s\r\n", key);
    if (headers)
        sp_buf_puts(&req, headers);
    if (body)
        sp_buf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", len);
    else
        sp_buf_puts(&req, "\r\n");
    write_all(fd, req.data, req.len);
    if (body)
        write_all(fd, body, len);
    sp_buf_dispose(&req);
}

/* Reads the whole response (the server closes: Connection: close) and parses it. */
static int read_response(int fd, resp_t *r)
{
    sp_buf_t in;
    char buf[65536];
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
    const char *hend = memmem(start, (size_t)(end - start), "\r\n\r\n", 4);
    if (!hend || strncmp(start, "HTTP/1.1 ", 9) != 0) {
        sp_buf_dispose(&in);
        r->head = sp_xstrdup("");
        r->body = sp_xstrdup("");
        return 0;
    }
    r->status = (int)strtol(start + 9, NULL, 10);
    r->head = sp_xstrndup(start, (size_t)(hend - start) + 2);
    start = hend + 4;
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
        sp_json_limits_t lim = {.max_bytes = r->len + 1, .max_string = r->len + 1};
        if (sp_json_parse(r->body, r->len, &lim, &r->doc, err) < 0)
            fail_msg("response is not JSON (%s): %.300s", err, r->body);
    }
    return r->status;
}

static int http(const char *method, const char *path, const char *key, const char *headers,
                const char *body, size_t len, resp_t *r)
{
    memset(r, 0, sizeof(*r));
    int fd = connect_local(0);
    if (fd < 0) {
        r->head = sp_xstrdup("");
        r->body = sp_xstrdup("");
        return 0;
    }
    send_request(fd, method, path, key, headers, body, len);
    return read_response(fd, r);
}

static const sp_json_t *jget(const resp_t *r, const char *k)
{
    return sp_json_get(sp_json_root(r->doc), k);
}

static const char *jstr(const resp_t *r, const char *k)
{
    return sp_json_str(jget(r, k), NULL);
}

static int64_t jint(const sp_json_t *v)
{
    int64_t x = -12345;
    if (sp_json_int(v, INT64_MIN, INT64_MAX, &x) < 0)
        fail_msg("not an integer");
    return x;
}

static bool jbool(const sp_json_t *v)
{
    bool b = false;
    if (sp_json_bool(v, &b) < 0)
        fail_msg("not a boolean");
    return b;
}

static void expect_error(const resp_t *r, int status, const char *code)
{
    if (r->status != status || !r->doc || !jstr(r, "code") || strcmp(jstr(r, "code"), code) != 0)
        fail_msg("expected %d %s, got %d %.300s", status, code, r->status, r->body ? r->body : "");
    assert_non_null(jstr(r, "message"));
}

static char cmd_path[128];

/* A command in JSON mode. */
static int run_json(const char *key, const char *sbx, const char *body, const char *rid, resp_t *r)
{
    char path[128], headers[256];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", sbx);
    snprintf(headers, sizeof(headers), "Accept: application/json\r\n%s%s%s",
             rid ? "X-Request-Id: " : "", rid ? rid : "", rid ? "\r\n" : "");
    return http("POST", path, key, headers, body, strlen(body), r);
}

/* ---- SSE parsing ---- */

typedef struct {
    char type[32];
    char *data;
} sse_ev_t;

typedef struct {
    sse_ev_t *ev;
    size_t n;
    size_t comments;
} sse_list_t;

static void sse_parse(const char *text, size_t len, sse_list_t *out)
{
    memset(out, 0, sizeof(*out));
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *blk = memmem(p, (size_t)(end - p), "\n\n", 2);
        if (!blk)
            break;
        sse_ev_t e = {{0}, NULL};
        bool any = false;
        for (const char *l = p; l < blk;) {
            const char *nl = memchr(l, '\n', (size_t)(blk - l));
            size_t n = nl ? (size_t)(nl - l) : (size_t)(blk - l);
            if (n > 7 && strncmp(l, "event: ", 7) == 0) {
                snprintf(e.type, sizeof(e.type), "%.*s", (int)(n - 7), l + 7);
                any = true;
            } else if (n > 6 && strncmp(l, "data: ", 6) == 0) {
                e.data = sp_xstrndup(l + 6, n - 6);
            } else if (n > 0 && l[0] == ':') {
                out->comments++;
            }
            l += n + 1;
        }
        if (any) {
            out->ev = sp_xreallocarray(out->ev, out->n + 1, sizeof(*out->ev));
            out->ev[out->n++] = e;
        } else {
            free(e.data);
        }
        p = blk + 2;
    }
}

static void sse_free(sse_list_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->ev[i].data);
    free(l->ev);
    memset(l, 0, sizeof(*l));
}

/* Event i, or (after failing the test) an empty one. */
static const sse_ev_t *ev_at(const sse_list_t *l, size_t i)
{
    static const sse_ev_t none = {"(none)", NULL};
    if (i >= l->n || !l->ev) {
        fail_msg("no event %zu (of %zu)", i, l->n);
        return &none;
    }
    return &l->ev[i];
}

static sp_json_doc_t *sse_json(const sse_ev_t *e)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (!e || !e->data) {
        fail_msg("event without data");
        return NULL;
    }
    size_t n = strlen(e->data);
    sp_json_limits_t lim = {.max_bytes = n + 1, .max_string = n + 1};
    if (sp_json_parse(e->data, n, &lim, &doc, err) < 0)
        fail_msg("event %s: data is not JSON: %.200s", e->type, e->data);
    return doc;
}

static int b64v(char c)
{
    const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = strchr(a, c);
    return c && p ? (int)(p - a) : -1;
}

static void b64_decode_into(const char *s, sp_buf_t *out)
{
    size_t n = strlen(s);
    assert_int_equal(n % 4, 0);
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + (size_t)k] == '=') {
                v[k] = 0;
                pad++;
            } else {
                v[k] = b64v(s[i + (size_t)k]);
                assert_true(v[k] >= 0);
            }
        }
        uint32_t x =
            (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        char b[3] = {(char)(x >> 16), (char)(x >> 8), (char)x};
        sp_buf_append(out, b, (size_t)(3 - pad));
    }
}

/* The output of stdout (1) or stderr (2) from the events, text and base64 alike. */
static void sse_output(const sse_list_t *l, int stream, sp_buf_t *out)
{
    const char *name = stream == 1 ? "stdout" : "stderr";
    for (size_t i = 0; i < l->n; i++) {
        const sse_ev_t *e = ev_at(l, i);
        if (strcmp(e->type, name) != 0)
            continue;
        sp_json_doc_t *d = sse_json(e);
        size_t n = 0;
        const char *t = sp_json_str(sp_json_get(sp_json_root(d), "text"), &n);
        const char *b = sp_json_str(sp_json_get(sp_json_root(d), "b64"), NULL);
        if (t)
            sp_buf_append(out, t, n);
        else if (b)
            b64_decode_into(b, out);
        else
            fail_msg("%s event without text or b64: %s", name, e->data);
        sp_json_doc_free(d);
    }
}

/* ---- the gateway process ---- */

static void start_gateway(void)
{
    char port_file[128], log_file[128], bin[4096];
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/gwcmdtest.XXXXXX");
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
        execl(bin, "space-gateway", "--listen-host", "127.0.0.1", "--port", "0", "--port-file",
              port_file, "--sse-keepalive-s", "1", "--sse-write-timeout-s", "20",
              "--command-grace-s", GRACE_S,
              /* This file's worker answers at once and streams live, the path of SSE and of
               * workers older than reply waits; the waiting answer is tested with the real
               * worker (integration.commands, test_reply_wait). */
              "--command-reply-wait-ms", "0", (char *)NULL);
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
    assert_int_equal(sp_test_daemon_pid("space-worker"), 0);
    if (sp_test_db_wait_scalar(db, "SELECT count(*) FROM schema_migrations WHERE version = 2", 1,
                               20000) != 1)
        fail_msg("schema not migrated");
    assert_int_equal(sp_apikey_create(db, "t1", "commands test", &key1, key1_id), 0);
    assert_int_equal(sp_apikey_create(db, "t2", "commands test", &key2, key_id), 0);
    char verr[SP_VERIFIER_ERR_MAX];
    if (sp_verifier_new("auto", NULL, sp_test_env("SPACE_CREDS_DIR"), 0, &verifier, verr) < 0)
        fail_msg("verifier: %s", verr);
    sp_request_guard_new(verifier, &guard);
    assert_int_equal(
        sp_bus_subscribe(bus, "space.io.wkr." WORKER ".exec", NULL, on_exec, NULL, &exec_sub), 0);
    assert_int_equal(sp_bus_flush(bus, 5000), 0);
    make_sandbox("t1", SBX, WORKER, false);
    make_sandbox("t1", SBX_PAUSED, WORKER, true);
    make_sandbox("t1", SBX_NOBODY, "w-none", false);
    snprintf(cmd_path, sizeof(cmd_path), "/v1/sandboxes/%s/commands", SBX);
    start_gateway();
    resp_t r;
    for (int i = 0; i < 100; i++) {
        if (http("GET", "/healthz", NULL, NULL, NULL, 0, &r) == 200)
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
    sp_bus_unsubscribe(exec_sub);
    for (int i = 0; i < 600 && atomic_load(&players) > 0; i++)
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    sp_request_guard_free(guard);
    sp_verifier_free(verifier);
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

static long long metric(const char *name)
{
    resp_t r;
    long long v = -1;
    if (http("GET", "/metrics", NULL, NULL, NULL, 0, &r) == 200) {
        char line[200];
        snprintf(line, sizeof(line), "\n%s ", name);
        const char *p = strstr(r.body, line);
        if (p)
            v = strtoll(p + strlen(line), NULL, 10);
    }
    resp_free(&r);
    return v;
}

/* The stored CommandRequested of a request id (waits for the event log). */
static sp_envelope_t *stored_intent(const char *rid)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE type = 'CommandRequested' AND correlation_id = "
             "'%s' AND status = 'accepted'",
             rid);
    if (sp_test_db_wait_scalar(db, sql, 1, 10000) != 1)
        fail_msg("no accepted CommandRequested for %s", rid);
    const char *p[1] = {rid};
    PGresult *r = PQexecParams(db,
                               "SELECT payload FROM events WHERE type = 'CommandRequested' AND "
                               "correlation_id = $1",
                               1, NULL, p, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 1);
    sp_envelope_t *env = NULL;
    char why[SP_REASON_MAX];
    assert_int_equal(sp_envelope_decode((const uint8_t *)PQgetvalue(r, 0, 0),
                                        (size_t)PQgetlength(r, 0, 0), &env, why),
                     0);
    PQclear(r);
    return env;
}

/* ---- scenarios ---- */

static void test_json_echo(void **state)
{
    resp_t r;
    char v[80];
    (void)state;

    run_json(key1, SBX, "{\"cmd\":\"echo hi\"}", "cmd-json-1", &r);
    if (r.status != 200)
        fail_msg("echo hi: %d %s", r.status, r.body);
    const char *id = jstr(&r, "cmd_id");
    assert_non_null(id);
    assert_int_equal(strncmp(id, "cmd_", 4), 0);
    assert_int_equal(strlen(id), 30);
    assert_string_equal(header_of(r.head, "x-command-id", v, sizeof(v)), id);
    assert_string_equal(jstr(&r, "stdout"), "hi\n");
    assert_string_equal(jstr(&r, "stderr"), "");
    assert_int_equal(jint(jget(&r, "exit_code")), 0);
    assert_int_equal(jint(jget(&r, "signal")), 0);
    assert_false(jbool(jget(&r, "timed_out")));
    assert_false(jbool(jget(&r, "truncated")));
    assert_false(jbool(jget(&r, "output_lost")));
    assert_int_equal(sp_json_type(jget(&r, "error")), SP_JSON_NULL);

    /* What the worker got: this command, for this tenant and sandbox, with the intent's id. */
    pthread_mutex_lock(&seen_mu);
    assert_string_equal(seen.cmd_id, id);
    assert_string_equal(seen.tenant, "t1");
    assert_string_equal(seen.sandbox, SBX);
    assert_string_equal(seen.corr, "cmd-json-1");
    assert_string_equal(seen.user, "root");
    char intent[80];
    snprintf(intent, sizeof(intent), "%s", seen.intent);
    pthread_mutex_unlock(&seen_mu);

    sp_envelope_t *env = stored_intent("cmd-json-1");
    assert_string_equal(env->event_id, intent);
    assert_string_equal(env->actor, key1_id);
    assert_string_equal(env->tenant, "t1");
    assert_string_equal(env->aggregate->id, SBX);
    assert_string_equal(env->command_requested->cmd_id, id);
    assert_string_equal(env->command_requested->cmd, "echo hi");
    assert_int_equal(env->command_requested->stdin_bytes, 0);
    assert_int_equal(env->command_requested->stdin_sha256.len, 0);
    sp_envelope_free(env);
    resp_free(&r);

    /* argv instead of cmd. */
    run_json(key1, SBX, "{\"argv\":[\"echo\",\"hi\"],\"user\":\"user\",\"timeout_s\":5}", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(jstr(&r, "stdout"), "hi\n");
    pthread_mutex_lock(&seen_mu);
    assert_string_equal(seen.user, "user");
    assert_int_equal(seen.timeout_s, 5);
    pthread_mutex_unlock(&seen_mu);
    resp_free(&r);
}

static void test_sse_events(void **state)
{
    resp_t r;
    sse_list_t l;
    char v[80];
    (void)state;

    const char *body = "{\"cmd\":\"echo hi\"}";
    http("POST", cmd_path, key1, NULL, body, strlen(body), &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(header_of(r.head, "content-type", v, sizeof(v)), "text/event-stream");
    sse_parse(r.body, r.len, &l);
    if (l.n != 3)
        fail_msg("want start, stdout, exit; got %zu events: %s", l.n, r.body);
    assert_string_equal(ev_at(&l, 0)->type, "start");
    assert_string_equal(ev_at(&l, 1)->type, "stdout");
    assert_string_equal(ev_at(&l, 2)->type, "exit");
    sp_json_doc_t *d = sse_json(ev_at(&l, 0));
    assert_string_equal(sp_json_str(sp_json_get(sp_json_root(d), "cmd_id"), NULL),
                        header_of(r.head, "x-command-id", v, sizeof(v)));
    sp_json_doc_free(d);
    d = sse_json(ev_at(&l, 1));
    assert_string_equal(sp_json_str(sp_json_get(sp_json_root(d), "text"), NULL), "hi\n");
    sp_json_doc_free(d);
    d = sse_json(ev_at(&l, 2));
    const sp_json_t *x = sp_json_root(d);
    assert_int_equal(jint(sp_json_get(x, "exit_code")), 0);
    assert_int_equal(jint(sp_json_get(x, "stdout_bytes")), 3);
    assert_int_equal(jint(sp_json_get(x, "stderr_bytes")), 0);
    assert_false(jbool(sp_json_get(x, "truncated")));
    assert_false(jbool(sp_json_get(x, "output_lost")));
    assert_false(jbool(sp_json_get(x, "timed_out")));
    assert_int_equal(sp_json_type(sp_json_get(x, "error")), SP_JSON_NULL);
    sp_json_doc_free(d);
    sse_free(&l);
    resp_free(&r);

    /* Explicitly asked for. A character cut between chunks stays text; stderr apart. */
    body = "{\"cmd\":\"split\"}";
    http("POST", cmd_path, key1, "Accept: text/event-stream\r\n", body, strlen(body), &r);
    assert_int_equal(r.status, 200);
    sse_parse(r.body, r.len, &l);
    assert_string_equal(ev_at(&l, 0)->type, "start");
    assert_string_equal(ev_at(&l, l.n - 1)->type, "exit");
    assert_null(strstr(r.body, "\"b64\""));
    sp_buf_t out, err;
    sp_buf_init(&out);
    sp_buf_init(&err);
    sse_output(&l, 1, &out);
    sse_output(&l, 2, &err);
    assert_string_equal(out.data, "h\xc3\xa9llo\n");
    assert_string_equal(err.data, "warn\n");
    sp_buf_dispose(&out);
    sp_buf_dispose(&err);
    sse_free(&l);
    resp_free(&r);

    /* Not UTF-8: base64, in both modes. */
    body = "{\"cmd\":\"binary\"}";
    http("POST", cmd_path, key1, NULL, body, strlen(body), &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "event: stdout\ndata: {\"b64\":\"/wAB\"}\n\n"));
    resp_free(&r);
    run_json(key1, SBX, body, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(sp_json_type(jget(&r, "stdout")), SP_JSON_NULL);
    assert_string_equal(jstr(&r, "stdout_b64"), "/wAB");
    assert_string_equal(jstr(&r, "stderr"), "");
    resp_free(&r);
}

static void test_exit_code(void **state)
{
    resp_t r;
    sse_list_t l;
    (void)state;

    run_json(key1, SBX, "{\"cmd\":\"exit 3\"}", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(jint(jget(&r, "exit_code")), 3);
    assert_string_equal(jstr(&r, "stdout"), "");
    resp_free(&r);

    const char *body = "{\"cmd\":\"exit 3\"}";
    http("POST", cmd_path, key1, NULL, body, strlen(body), &r);
    sse_parse(r.body, r.len, &l);
    assert_int_equal(l.n, 2);
    assert_string_equal(ev_at(&l, 1)->type, "exit");
    sp_json_doc_t *d = sse_json(ev_at(&l, 1));
    assert_int_equal(jint(sp_json_get(sp_json_root(d), "exit_code")), 3);
    sp_json_doc_free(d);
    sse_free(&l);
    resp_free(&r);
}

static void test_stdin(void **state)
{
    resp_t r;
    uint8_t digest[SP_SHA256_LEN];
    (void)state;

    const char *text = "stdin-4b1d: hello, w\xc3\xb6rld\n\ttabbed\n";
    sp_buf_t body;
    sp_buf_init(&body);
    sp_buf_puts(&body, "{\"cmd\":\"cat\",\"stdin\":");
    sp_buf_json_str(&body, text);
    sp_buf_putc(&body, '}');
    run_json(key1, SBX, body.data, "cmd-stdin-1", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(jstr(&r, "stdout"), text);
    resp_free(&r);
    pthread_mutex_lock(&seen_mu);
    assert_int_equal(seen.stdin_len, strlen(text));
    pthread_mutex_unlock(&seen_mu);
    sp_envelope_t *env = stored_intent("cmd-stdin-1");
    assert_int_equal(env->command_requested->stdin_bytes, strlen(text));
    assert_int_equal(env->command_requested->stdin_sha256.len, SP_SHA256_LEN);
    sp_sha256(text, strlen(text), digest);
    assert_memory_equal(env->command_requested->stdin_sha256.data, digest, SP_SHA256_LEN);
    sp_envelope_free(env);
    /* The bytes themselves are in no event. */
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE position("
                                           "'stdin-4b1d'::bytea IN payload) > 0"),
                     0);

    /* Binary stdin (base64 in), 200 KiB: several chunks back, base64 out. */
    size_t n = 200 * 1024;
    uint8_t *bin = sp_xmalloc(n);
    for (size_t i = 0; i < n; i++)
        bin[i] = (uint8_t)(i * 7 + 0x80);
    sp_buf_reset(&body);
    sp_buf_puts(&body, "{\"cmd\":\"cat\",\"stdin_b64\":\"");
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)bin[i] << 16 | (i + 1 < n ? (uint32_t)bin[i + 1] << 8 : 0) |
                     (i + 2 < n ? bin[i + 2] : 0);
        char q[4] = {a[x >> 18], a[(x >> 12) & 63], '=', '='};
        if (i + 1 < n)
            q[2] = a[(x >> 6) & 63];
        if (i + 2 < n)
            q[3] = a[x & 63];
        sp_buf_append(&body, q, 4);
    }
    sp_buf_puts(&body, "\"}");
    run_json(key1, SBX, body.data, "cmd-stdin-2", &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(sp_json_type(jget(&r, "stdout")), SP_JSON_NULL);
    sp_buf_t got;
    sp_buf_init(&got);
    b64_decode_into(jstr(&r, "stdout_b64"), &got);
    assert_int_equal(got.len, n);
    assert_memory_equal(got.data, bin, n);
    assert_int_equal(jint(jget(&r, "stdout_bytes")), (int64_t)n);
    sp_buf_dispose(&got);
    resp_free(&r);
    env = stored_intent("cmd-stdin-2");
    assert_int_equal(env->command_requested->stdin_bytes, n);
    sp_sha256(bin, n, digest);
    assert_memory_equal(env->command_requested->stdin_sha256.data, digest, SP_SHA256_LEN);
    sp_envelope_free(env);
    free(bin);

    /* 900 KiB of stdin round trip; just under the 1 MiB body limit the ExecRequest (stdin plus
     * ids) no longer fits in one NATS message: 413 before anything is published. */
    for (int k = 0; k < 2; k++) {
        size_t len = k == 0 ? 900 * 1024 : 1024 * 1024 - 64;
        sp_buf_reset(&body);
        sp_buf_puts(&body, "{\"cmd\":\"cat\",\"stdin\":\"");
        for (size_t i = 0; i < len; i++)
            sp_buf_putc(&body, (char)('0' + i % 10));
        sp_buf_puts(&body, "\"}");
        assert_true(body.len <= 1024 * 1024);
        run_json(key1, SBX, body.data, NULL, &r);
        if (k == 0) {
            assert_int_equal(r.status, 200);
            size_t got_len = 0;
            const char *o = sp_json_str(jget(&r, "stdout"), &got_len);
            assert_int_equal(got_len, len);
            assert_memory_equal(o, body.data + strlen("{\"cmd\":\"cat\",\"stdin\":\""), len);
        } else {
            expect_error(&r, 413, "request_too_large");
        }
        resp_free(&r);
    }
    sp_buf_dispose(&body);
}

static void test_env_values_stay_out(void **state)
{
    resp_t r;
    char value[64], body[512], sql[256];
    (void)state;

    snprintf(value, sizeof(value), "tok-%08x-secret", (unsigned)getpid() ^ 0x5a5a5a5au);
    snprintf(body, sizeof(body),
             "{\"cmd\":\"printenv SECRET_TOKEN\",\"env\":{\"SECRET_TOKEN\":\"%s\",\"OTHER_1\":"
             "\"%s-2\"},\"cwd\":\"/tmp\"}",
             value, value);
    run_json(key1, SBX, body, "cmd-env-1", &r);
    assert_int_equal(r.status, 200);
    /* The value reached the worker (it echoes it)... */
    char want[80];
    snprintf(want, sizeof(want), "%s\n", value);
    assert_string_equal(jstr(&r, "stdout"), want);
    resp_free(&r);
    pthread_mutex_lock(&seen_mu);
    assert_int_equal(seen.n_env, 2);
    assert_int_equal(strncmp(seen.env0, "SECRET_TOKEN=", 13), 0);
    pthread_mutex_unlock(&seen_mu);
    /* ...the names are in the event, the values in no row of the log. */
    sp_envelope_t *env = stored_intent("cmd-env-1");
    assert_int_equal(env->command_requested->n_env_names, 2);
    assert_string_equal(env->command_requested->env_names[0], "SECRET_TOKEN");
    assert_string_equal(env->command_requested->env_names[1], "OTHER_1");
    assert_string_equal(env->command_requested->cwd, "/tmp");
    sp_envelope_free(env);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE position('%s'::bytea IN payload) > 0", value);
    assert_int_equal(sp_test_db_scalar(db, sql), 0);
    assert_true(sp_test_db_scalar(db, "SELECT count(*) FROM events") > 0);
}

static void expect_400(const char *body, const char *code)
{
    resp_t r;
    run_json(key1, SBX, body, NULL, &r);
    if (r.status != 400 || !jstr(&r, "code") || strcmp(jstr(&r, "code"), code) != 0)
        fail_msg("body %.120s: expected 400 %s, got %d %.300s", body, code, r.status, r.body);
    resp_free(&r);
}

static void test_refusals(void **state)
{
    resp_t r;
    char path[128];
    (void)state;

    /* Another tenant's sandbox, an unknown one, a malformed id: all "not found". */
    run_json(key2, SBX, "{\"cmd\":\"echo hi\"}", NULL, &r);
    expect_error(&r, 404, "not_found");
    resp_free(&r);
    run_json(key1, "sbx_nosuchthing", "{\"cmd\":\"echo hi\"}", NULL, &r);
    expect_error(&r, 404, "not_found");
    resp_free(&r);
    run_json(key1, "SBX_Bad", "{\"cmd\":\"echo hi\"}", NULL, &r);
    expect_error(&r, 404, "not_found");
    resp_free(&r);
    /* Not running: 409 with the state. */
    run_json(key1, SBX_PAUSED, "{\"cmd\":\"echo hi\"}", NULL, &r);
    expect_error(&r, 409, "sandbox_not_running");
    assert_string_equal(jstr(&r, "state"), "paused");
    resp_free(&r);
    /* No key; wrong method; wrong media type. */
    const char *b = "{\"cmd\":\"echo hi\"}";
    http("POST", cmd_path, NULL, NULL, b, strlen(b), &r);
    expect_error(&r, 401, "unauthorized");
    resp_free(&r);
    http("DELETE", cmd_path, key1, NULL, NULL, 0, &r);
    expect_error(&r, 405, "method_not_allowed");
    resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commandz", SBX);
    http("POST", path, key1, NULL, b, strlen(b), &r);
    expect_error(&r, 404, "not_found");
    resp_free(&r);

    /* Bodies. */
    expect_400("", "invalid_json");
    expect_400("[1]", "invalid_json");
    expect_400("{\"cmd\":\"echo hi\",}", "invalid_json");
    expect_400("{\"cmd\":\"echo hi\",\"argv\":[\"echo\"]}", "invalid_field");
    expect_400("{}", "missing_field");
    expect_400("{\"env\":{\"A\":\"b\"}}", "missing_field");
    expect_400("{\"cmd\":\"\"}", "invalid_field");
    /* Newlines and tabs are fine in a script; other control characters are not. */
    expect_400("{\"cmd\":\"echo a\\u0001b\"}", "invalid_field");
    expect_400("{\"cmd\":7}", "invalid_field");
    expect_400("{\"argv\":[]}", "invalid_field");
    expect_400("{\"argv\":[\"\"]}", "invalid_field");
    expect_400("{\"argv\":\"echo\"}", "invalid_field");
    expect_400("{\"argv\":[\"echo\",1]}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"env\":{\"1BAD\":\"v\"}}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"env\":{\"BAD-NAME\":\"v\"}}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"env\":{\"\":\"v\"}}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"env\":{\"A\":1}}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"env\":[\"A=b\"]}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"user\":\"admin\"}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"timeout_s\":86401}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"timeout_s\":-1}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"timeout_s\":1.5}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"stdin\":\"a\",\"stdin_b64\":\"YQ==\"}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"stdin_b64\":\"YQ=\"}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"stdin_b64\":\"Y!==\"}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"stdin_b64\":\"YR==\"}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"background\":\"no\"}", "invalid_field");
    expect_400("{\"cmd\":\"x\",\"shell\":true}", "unknown_field");

    sp_buf_t big;
    sp_buf_init(&big);
    sp_buf_puts(&big, "{\"cmd\":\"");
    for (int i = 0; i < 16385; i++)
        sp_buf_putc(&big, 'x');
    sp_buf_puts(&big, "\"}");
    expect_400(big.data, "invalid_field");
    sp_buf_reset(&big);
    sp_buf_puts(&big, "{\"argv\":[\"a\"");
    for (int i = 0; i < 256; i++)
        sp_buf_puts(&big, ",\"a\"");
    sp_buf_puts(&big, "]}");
    expect_400(big.data, "invalid_field");
    sp_buf_reset(&big);
    sp_buf_puts(&big, "{\"argv\":[\"a\",\"");
    for (int i = 0; i < 4097; i++)
        sp_buf_putc(&big, 'y');
    sp_buf_puts(&big, "\"]}");
    expect_400(big.data, "invalid_field");
    sp_buf_reset(&big);
    sp_buf_puts(&big, "{\"cmd\":\"x\",\"cwd\":\"/");
    for (int i = 0; i < 1024; i++)
        sp_buf_putc(&big, 'd');
    sp_buf_puts(&big, "\"}");
    expect_400(big.data, "invalid_field");
    sp_buf_dispose(&big);

    /* At the limits: accepted. */
    sp_buf_init(&big);
    sp_buf_puts(&big, "{\"argv\":[\"echo\"");
    for (int i = 0; i < 255; i++)
        sp_buf_puts(&big, ",\"hi\"");
    sp_buf_puts(&big, "],\"timeout_s\":86400}");
    run_json(key1, SBX, big.data, NULL, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    sp_buf_dispose(&big);

    /* Background: 202 with the command's id once the worker took it. */
    run_json(key1, SBX, "{\"cmd\":\"echo hi\",\"background\":true}", NULL, &r);
    assert_int_equal(r.status, 202);
    assert_non_null(jstr(&r, "cmd_id"));
    resp_free(&r);
    run_json(key1, SBX, "{\"cmd\":\"echo hi\",\"background\":false}", NULL, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
}

static void test_worker_refusals(void **state)
{
    resp_t r;
    (void)state;

    run_json(key1, SBX, "{\"cmd\":\"refuse_busy\"}", NULL, &r);
    expect_error(&r, 429, "too_many_commands");
    assert_non_null(jstr(&r, "cmd_id"));
    resp_free(&r);
    run_json(key1, SBX, "{\"cmd\":\"refuse_agent\"}", NULL, &r);
    expect_error(&r, 503, "agent_unavailable");
    resp_free(&r);
    run_json(key1, SBX, "{\"cmd\":\"refuse_weird\"}", NULL, &r);
    expect_error(&r, 500, "worker_error");
    assert_string_equal(jstr(&r, "reason"), "disk_on_fire");
    /* The worker's text is escaped, never passed through raw. */
    assert_null(strchr(jstr(&r, "message"), '\x01'));
    resp_free(&r);

    /* Nobody plays w-none: 503 at once (no responders), well within the 10 s budget. */
    int64_t t0 = sp_mono_ns();
    run_json(key1, SBX_NOBODY, "{\"cmd\":\"echo hi\"}", "cmd-nobody-1", &r);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    expect_error(&r, 503, "worker_unavailable");
    assert_true(ms < 11000);
    print_message("no responder: 503 after %.1f ms\n", ms);
    resp_free(&r);
    /* The intent was published before the request: it is in the log all the same. */
    sp_envelope_t *env = stored_intent("cmd-nobody-1");
    sp_envelope_free(env);
    assert_true(metric("space_gateway_commands_total{outcome=\"worker_unavailable\"}") >= 1);
    assert_true(metric("space_gateway_commands_total{outcome=\"too_many_commands\"}") >= 1);
}

/* The status of one command on sbx, polled until it is want (at most 5 s): the location cache
 * hears of a move through a NOTIFY, a moment after the commit the test waited for. Returns the
 * last status seen. */
static void exec_sql(const char *sql)
{
    PGresult *res = PQexec(db, sql);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(db));
    PQclear(res);
}

static int run_until(const char *sbx, int want)
{
    int status = 0;
    for (int i = 0; i < 100; i++) {
        resp_t r;
        status = run_json(key1, sbx, "{\"cmd\":\"echo hi\"}", NULL, &r);
        resp_free(&r);
        if (status == want)
            break;
        usleep(50 * 1000);
    }
    return status;
}

/* Where a sandbox runs is answered from the gateway's cache once it was looked up running, and
 * every move reaches the cache: a pause, a resume, and an UPDATE by hand of the worker (the
 * trigger covers every writer). Another tenant is never answered from the cache. */
static void test_location_cache(void **state)
{
    (void)state;
    const char *hit = "space_gateway_locate_total{result=\"hit\"}";
    make_sandbox("t1", SBX_MOVING, WORKER, false);
    assert_int_equal(run_until(SBX_MOVING, 200), 200);
    long long hits0 = metric(hit);
    assert_true(hits0 >= 0);
    assert_int_equal(run_until(SBX_MOVING, 200), 200);
    assert_int_equal(run_until(SBX_MOVING, 200), 200);
    long long hits1 = metric(hit);
    print_message("location cache: %lld hits after two commands\n", hits1 - hits0);
    assert_true(hits1 - hits0 >= 2);

    /* Cached, and still another tenant's sandbox is not found. */
    resp_t r;
    run_json(key2, SBX_MOVING, "{\"cmd\":\"echo hi\"}", NULL, &r);
    expect_error(&r, 404, "not_found");
    resp_free(&r);

    /* Paused through its fact: refused as not running, not sent to the worker. */
    char sql[256];
    publish_gen(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED, "t1", SBX_MOVING, WORKER);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = 'paused'", SBX_MOVING);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 1, 20000), 1);
    assert_int_equal(run_until(SBX_MOVING, 409), 409);
    /* Resumed through its fact: served again (and cached again). */
    publish_gen(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED, "t1", SBX_MOVING, WORKER);
    assert_int_equal(run_until(SBX_MOVING, 200), 200);
    assert_int_equal(run_until(SBX_MOVING, 200), 200);

    /* By hand, still running but on a worker nobody plays: the command goes there (503), not
     * to the cached one. The UPDATE is repeated until a command sees it: the event log writes
     * its own projection of the row back for a command's event stored meanwhile (a lost update
     * of the test's, not of the cache's); a cache deaf to the trigger answers 200 every time. */
    snprintf(sql, sizeof(sql), "UPDATE sandboxes SET worker = 'w-none' WHERE id = '%s'",
             SBX_MOVING);
    int status = 0;
    for (int i = 0; i < 100 && status != 503; i++) {
        exec_sql(sql);
        usleep(20 * 1000);
        run_json(key1, SBX_MOVING, "{\"cmd\":\"echo hi\"}", NULL, &r);
        status = r.status;
        resp_free(&r);
    }
    assert_int_equal(status, 503);
    long long drops = metric("space_gateway_locate_drops_total");
    print_message("location cache: %lld drops\n", drops);
    assert_true(drops >= 3); /* the pause, the resume, the UPDATE */
}

static void test_flood_json(void **state)
{
    resp_t r;
    (void)state;

    int64_t t0 = sp_mono_ns();
    run_json(key1, SBX, "{\"cmd\":\"flood\"}", NULL, &r);
    double s = (double)(sp_mono_ns() - t0) / 1e9;
    assert_int_equal(r.status, 200);
    size_t n = 0;
    const char *out = sp_json_str(jget(&r, "stdout"), &n);
    assert_non_null(out);
    assert_int_equal(n, JSON_CAP);
    for (size_t i = 0; i < n; i += 4096)
        if (out[i] != 'a' + (int)(i / FLOOD_CHUNK % 26))
            fail_msg("stdout byte %zu is %c", i, out[i]);
    assert_true(jbool(jget(&r, "truncated")));
    assert_false(jbool(jget(&r, "output_lost")));
    assert_int_equal(jint(jget(&r, "stdout_bytes")), (int64_t)FLOOD_N * FLOOD_CHUNK);
    print_message("flood, JSON: %d x %d KiB in %.2f s, answer %zu bytes of stdout\n", FLOOD_N,
                  FLOOD_CHUNK / 1024, s, n);
    resp_free(&r);
}

/* A client that does not read while 62.5 MiB are produced: the gateway holds at most
 * command-buffer-bytes for it, drops the rest, and still ends with the exit event. */
static void test_flood_sse_slow_client(void **state)
{
    resp_t r;
    sse_list_t l;
    sp_buf_t out;
    (void)state;

    memset(&r, 0, sizeof(r));
    int fd = connect_local(4096);
    assert_true(fd >= 0);
    const char *body = "{\"cmd\":\"flood\"}";
    send_request(fd, "POST", cmd_path, key1, NULL, body, strlen(body));
    sleep(3);
    assert_int_equal(read_response(fd, &r), 200);
    sse_parse(r.body, r.len, &l);
    assert_true(l.n >= 2);
    assert_string_equal(ev_at(&l, 0)->type, "start");
    assert_string_equal(ev_at(&l, l.n - 1)->type, "exit");
    sp_json_doc_t *d = sse_json(ev_at(&l, l.n - 1));
    assert_true(jbool(sp_json_get(sp_json_root(d), "truncated")));
    assert_false(jbool(sp_json_get(sp_json_root(d), "output_lost")));
    sp_json_doc_free(d);
    sp_buf_init(&out);
    sse_output(&l, 1, &out);
    assert_true(out.len < (size_t)FLOOD_N * FLOOD_CHUNK);
    /* What came is a prefix of the output, without holes. */
    for (size_t i = 0; i < out.len; i += 4096)
        if (out.data[i] != 'a' + (int)(i / FLOOD_CHUNK % 26))
            fail_msg("slow client: byte %zu is %c", i, out.data[i]);
    print_message("flood, slow SSE client: got %zu of %d bytes, then the exit event\n", out.len,
                  FLOOD_N * FLOOD_CHUNK);
    sp_buf_dispose(&out);
    sse_free(&l);
    resp_free(&r);

    /* A client that reads along gets it all. */
    int64_t t0 = sp_mono_ns();
    http("POST", cmd_path, key1, NULL, body, strlen(body), &r);
    double s = (double)(sp_mono_ns() - t0) / 1e9;
    assert_int_equal(r.status, 200);
    sse_parse(r.body, r.len, &l);
    sp_buf_init(&out);
    sse_output(&l, 1, &out);
    d = sse_json(ev_at(&l, l.n - 1));
    bool truncated = jbool(sp_json_get(sp_json_root(d), "truncated"));
    sp_json_doc_free(d);
    print_message("flood, reading SSE client: %zu of %d bytes in %.2f s (truncated %s)\n", out.len,
                  FLOOD_N * FLOOD_CHUNK, s, truncated ? "true" : "false");
    assert_true(truncated || out.len == (size_t)FLOOD_N * FLOOD_CHUNK);
    sp_buf_dispose(&out);
    sse_free(&l);
    resp_free(&r);
}

static void test_client_disconnect(void **state)
{
    char buf[4096];
    (void)state;

    int fd = connect_local(4096);
    assert_true(fd >= 0);
    const char *body = "{\"cmd\":\"flood\"}";
    send_request(fd, "POST", cmd_path, key1, NULL, body, strlen(body));
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    assert_true(n > 0);
    buf[n] = '\0';
    assert_int_equal(strncmp(buf, "HTTP/1.1 200", 12), 0);
    close(fd);
    /* The gateway lets go of it: nothing left in progress. */
    long long left = -1;
    for (int i = 0; i < 100 && left != 0; i++) {
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
        left = metric("space_gateway_commands_in_progress");
    }
    assert_int_equal(left, 0);
    resp_t r;
    assert_int_equal(http("GET", "/healthz", NULL, NULL, NULL, 0, &r), 200);
    resp_free(&r);
}

static void test_output_lost(void **state)
{
    resp_t r;
    sse_list_t l;
    (void)state;

    run_json(key1, SBX, "{\"cmd\":\"gap\"}", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(jbool(jget(&r, "output_lost")));
    assert_string_equal(jstr(&r, "stdout"), "abd");
    resp_free(&r);
    const char *body = "{\"cmd\":\"gap\"}";
    http("POST", cmd_path, key1, NULL, body, strlen(body), &r);
    sse_parse(r.body, r.len, &l);
    sp_json_doc_t *d = sse_json(ev_at(&l, l.n - 1));
    assert_string_equal(ev_at(&l, l.n - 1)->type, "exit");
    assert_true(jbool(sp_json_get(sp_json_root(d), "output_lost")));
    sp_json_doc_free(d);
    sse_free(&l);
    resp_free(&r);
    assert_true(metric("space_gateway_command_output_lost_total") >= 2);
}

/* A worker that accepts and then says nothing: the answer comes after timeout_s plus the
 * gateway's command-grace-s (3 s here; 30 by default, which cost this test 31 s a run). */
static void test_worker_never_exits(void **state)
{
    resp_t r;
    (void)state;

    int64_t t0 = sp_mono_ns();
    run_json(key1, SBX, "{\"cmd\":\"silent\",\"timeout_s\":1}", NULL, &r);
    double s = (double)(sp_mono_ns() - t0) / 1e9;
    assert_int_equal(r.status, 200);
    assert_string_equal(jstr(&r, "error"), "timeout waiting for the worker");
    assert_int_equal(jint(jget(&r, "exit_code")), -1);
    long grace = strtol(GRACE_S, NULL, 10);
    assert_true(s >= (double)(1 + grace) - 0.5 && s < (double)(1 + grace + 3));
    print_message("silent worker: ended after %.1f s\n", s);
    resp_free(&r);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void test_latency_and_metrics(void **state)
{
    enum { N = 200 };
    double ms[N];
    resp_t r;
    (void)state;

    for (int i = 0; i < N; i++) {
        int64_t t0 = sp_mono_ns();
        run_json(key1, SBX, "{\"cmd\":\"echo hi\"}", NULL, &r);
        ms[i] = (double)(sp_mono_ns() - t0) / 1e6;
        if (r.status != 200)
            fail_msg("echo hi #%d: %d %s", i, r.status, r.body);
        resp_free(&r);
    }
    qsort(ms, N, sizeof(ms[0]), cmp_double);
    print_message("exec round trip through HTTP with the fake worker: p50 %.2f ms, p90 %.2f ms, "
                  "p99 %.2f ms, max %.2f ms (n=%d)\n",
                  ms[N / 2], ms[N * 9 / 10], ms[N * 99 / 100], ms[N - 1], N);

    assert_int_equal(http("GET", "/metrics", NULL, NULL, NULL, 0, &r), 200);
    assert_non_null(strstr(r.body, "space_gateway_requests_total{route=\"sandbox_commands\","
                                   "status=\"200\"}"));
    assert_non_null(strstr(r.body, "space_gateway_exec_seconds_count"));
    assert_non_null(strstr(r.body, "space_gateway_command_ends_total{how=\"exit\"}"));
    assert_non_null(strstr(r.body, "space_gateway_command_ends_total{how=\"client_gone\"} 1"));
    assert_non_null(strstr(r.body, "space_gateway_command_ends_total{how=\"timeout\"} 1"));
    resp_free(&r);
    assert_true(metric("space_gateway_commands_total{outcome=\"accepted\"}") >= N);
    /* The last answer may leave before its subscription is drained: wait for that. */
    long long left = -1;
    for (int i = 0; i < 50 && left != 0; i++) {
        left = metric("space_gateway_commands_in_progress");
        if (left != 0)
            nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    }
    assert_int_equal(left, 0);
    assert_int_equal(metric("space_gateway_sse_streams"), 0);
}

/* SIGTERM with commands in flight: the SSE client gets an exit event that says so, the JSON
 * client a 503 with the command's id, and the gateway exits 0. */
static void test_sigterm(void **state)
{
    resp_t r1, r2;
    sse_list_t l;
    int st = 0;
    (void)state;

    long long before = metric("space_gateway_commands_total{outcome=\"accepted\"}");
    const char *body = "{\"cmd\":\"silent\"}";
    int sse_fd = connect_local(0), json_fd = connect_local(0);
    assert_true(sse_fd >= 0 && json_fd >= 0);
    send_request(sse_fd, "POST", cmd_path, key1, NULL, body, strlen(body));
    send_request(json_fd, "POST", cmd_path, key1, "Accept: application/json\r\n", body,
                 strlen(body));
    long long now = before;
    for (int i = 0; i < 100 && now < before + 2; i++) {
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
        now = metric("space_gateway_commands_total{outcome=\"accepted\"}");
    }
    assert_int_equal(now, before + 2);
    assert_int_equal(kill(gw_pid, SIGTERM), 0);

    memset(&r1, 0, sizeof(r1));
    memset(&r2, 0, sizeof(r2));
    assert_int_equal(read_response(sse_fd, &r1), 200);
    sse_parse(r1.body, r1.len, &l);
    assert_string_equal(ev_at(&l, l.n - 1)->type, "exit");
    sp_json_doc_t *d = sse_json(ev_at(&l, l.n - 1));
    const char *err = sp_json_str(sp_json_get(sp_json_root(d), "error"), NULL);
    assert_non_null(err);
    assert_non_null(strstr(err, "stopping"));
    sp_json_doc_free(d);
    sse_free(&l);
    read_response(json_fd, &r2);
    expect_error(&r2, 503, "shutting_down");
    assert_non_null(jstr(&r2, "cmd_id"));
    resp_free(&r1);
    resp_free(&r2);

    pid_t w = 0;
    for (int i = 0; i < 200 && w == 0; i++) {
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
        cmocka_unit_test(test_json_echo),
        cmocka_unit_test(test_sse_events),
        cmocka_unit_test(test_exit_code),
        cmocka_unit_test(test_stdin),
        cmocka_unit_test(test_env_values_stay_out),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_worker_refusals),
        cmocka_unit_test(test_flood_json),
        cmocka_unit_test(test_flood_sse_slow_client),
        cmocka_unit_test(test_client_disconnect),
        cmocka_unit_test(test_output_lost),
        cmocka_unit_test(test_worker_never_exits),
        cmocka_unit_test(test_latency_and_metrics),
        cmocka_unit_test(test_location_cache),
        cmocka_unit_test(test_sigterm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
