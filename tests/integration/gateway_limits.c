/* space-gateway faults and limits, as a client sees them (raw bytes over 127.0.0.1): a body is
 * authenticated and held to its route's own limit before it is read (a 400 MB unauthenticated
 * POST is 401 at once, without the gateway's memory or its temporary files growing), framing
 * that two parsers could read two ways is refused (400, connection closed), and every error
 * the gateway sends itself is JSON {"code", "message"}. The test starts its own gateway (small
 * max-file-bytes, its own tmp-dir) on an ephemeral port; the stack runs only the event log. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
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
#include "harness.h"
#include "json.h"
#include "xmalloc.h"

#define FILE_LIMIT       (8 << 20) /* --max-file-bytes */
#define SIGNED_BURST     "3"       /* --signed-url-fail-burst, with --signed-url-fail-per-s 1 */
#define GW_HEAD_TEST_MAX 100000

static PGconn *db;
static char *key;
static int port;
static pid_t gw_pid;
static char tmpdir[64], bodydir[96];

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int connect_local(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void send_str(int fd, const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

/* One response read from fd (within timeout_ms): status, head and body; 1xx answers are
 * skipped and counted. Returns the status, 0 if none arrived. */
typedef struct {
    int status;
    int interim;
    char head[4096];
    sp_buf_t body;
    sp_json_doc_t *doc;
    bool closed; /* the server closed the connection after the response */
    int err;     /* errno of the read that ended it */
    size_t got;  /* bytes received */
} resp_t;

static void resp_free(resp_t *r)
{
    sp_buf_dispose(&r->body);
    sp_json_doc_free(r->doc);
    memset(r, 0, sizeof(*r));
}

static bool head_value(const char *head, const char *name, char *out, size_t outlen)
{
    size_t n = strlen(name);
    for (const char *l = strstr(head, "\r\n"); l; l = strstr(l + 2, "\r\n")) {
        if (strncasecmp(l + 2, name, n) == 0 && l[2 + n] == ':') {
            const char *s = l + 3 + n;
            while (*s == ' ')
                s++;
            snprintf(out, outlen, "%.*s", (int)strcspn(s, "\r\n"), s);
            return true;
        }
    }
    return false;
}

/* Bytes past a response (a pipelined one's answer can arrive in the same read): the next
 * read_resp on the same descriptor starts with them. */
static sp_buf_t carry;
static int carry_fd = -1;

static int read_resp(int fd, int timeout_ms, resp_t *r)
{
    sp_buf_t in;
    char buf[16384];
    int64_t deadline = now_ms() + timeout_ms;
    memset(r, 0, sizeof(*r));
    sp_buf_init(&r->body);
    sp_buf_init(&in);
    if (carry_fd == fd && carry.len)
        sp_buf_append(&in, carry.data, carry.len);
    sp_buf_reset(&carry);
    carry_fd = -1;
    size_t need = SIZE_MAX, hlen = 0;
    for (;;) {
        if (hlen == 0) {
            const char *e = in.len ? memmem(in.data, in.len, "\r\n\r\n", 4) : NULL;
            while (e && in.len >= 12 && strncmp(in.data, "HTTP/1.1 1", 10) == 0) {
                r->interim++;
                size_t skip = (size_t)(e - in.data) + 4;
                memmove(in.data, in.data + skip, in.len - skip);
                in.len -= skip;
                e = in.len ? memmem(in.data, in.len, "\r\n\r\n", 4) : NULL;
            }
            if (e) {
                hlen = (size_t)(e - in.data) + 4;
                snprintf(r->head, sizeof(r->head), "%.*s", (int)hlen, in.data);
                r->status = (int)strtol(in.data + 9, NULL, 10);
                char v[32];
                if (head_value(r->head, "content-length", v, sizeof(v)))
                    need = hlen + strtoull(v, NULL, 10);
            }
        }
        if (hlen && in.len >= need)
            break;
        int left = (int)(deadline - now_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
            r->closed = true;
            r->err = n < 0 ? errno : 0;
            break;
        }
        sp_buf_append(&in, buf, (size_t)n);
    }
    r->got = in.len;
    if (hlen && need != SIZE_MAX && in.len > need) {
        sp_buf_append(&carry, in.data + need, in.len - need);
        carry_fd = fd;
    }
    if (hlen) {
        size_t blen = (need == SIZE_MAX ? in.len : need) - hlen;
        sp_buf_append(&r->body, in.data + hlen, blen);
        char ct[128], err[SP_JSON_ERR_MAX];
        if (head_value(r->head, "content-type", ct, sizeof(ct)) && strstr(ct, "json") && blen)
            (void)sp_json_parse(r->body.data, r->body.len, NULL, &r->doc, err);
    }
    sp_buf_dispose(&in);
    return r->status;
}

/* After a response: whether the server closes the connection within timeout_ms. */
static bool closes(int fd, int timeout_ms)
{
    char buf[4096];
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        int left = (int)(deadline - now_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return false;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0)
            return true;
    }
}

static void expect_json_error(const resp_t *r, int status, const char *code)
{
    const char *c = r->doc ? sp_json_str(sp_json_get(sp_json_root(r->doc), "code"), NULL) : NULL;
    if (r->status != status || !c || strcmp(c, code) != 0 ||
        !sp_json_str(sp_json_get(sp_json_root(r->doc), "message"), NULL))
        fail_msg("expected %d {\"code\":\"%s\"}, got %d %.*s (%zu bytes, %s)", status, code,
                 r->status, (int)r->body.len, r->body.data ? r->body.data : "", r->got,
                 r->err ? strerror(r->err) : "closed");
    char ct[64];
    assert_true(head_value(r->head, "content-type", ct, sizeof(ct)));
    assert_string_equal(ct, "application/json");
}

/* A whole exchange on a fresh connection: the raw request, one response. */
static void exchange(const char *raw, int status, const char *code, bool must_close)
{
    resp_t r;
    int fd = connect_local();
    send_str(fd, raw);
    read_resp(fd, 5000, &r);
    expect_json_error(&r, status, code);
    if (must_close && !r.closed && !closes(fd, 3000))
        fail_msg("the connection stayed open after %d for: %.60s", status, raw);
    resp_free(&r);
    close(fd);
}

/* ---- the gateway's resources ---- */

static long rss_kib(void)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)gw_pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = strtol(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return kib;
}

/* Bytes in the gateway's temporary body files (unlinked at once by h2o: found through the
 * process's open descriptors). */
static long long tmp_bytes(void)
{
    char dir[64], p[PATH_MAX + 64], target[PATH_MAX];
    long long total = 0;
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)gw_pid);
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        ssize_t n = readlink(p, target, sizeof(target) - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        struct stat st;
        if (strncmp(target, bodydir, strlen(bodydir)) == 0 && stat(p, &st) == 0)
            total += st.st_size;
    }
    closedir(d);
    return total;
}

static void start_gateway(void)
{
    char port_file[128], log_file[128], bin[4096], maxfile[32];
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/gwlimits.XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    snprintf(bodydir, sizeof(bodydir), "%s/body", tmpdir);
    assert_int_equal(mkdir(bodydir, 0700), 0);
    snprintf(port_file, sizeof(port_file), "%s/space-gateway.port", tmpdir);
    snprintf(log_file, sizeof(log_file), "%s/space-gateway.log", tmpdir);
    snprintf(bin, sizeof(bin), "%s/space-gateway", sp_test_env("SPACE_BIN_DIR"));
    snprintf(maxfile, sizeof(maxfile), "%d", FILE_LIMIT);
    gw_pid = fork();
    assert_true(gw_pid >= 0);
    if (gw_pid == 0) {
        int fd = open(log_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            dup2(fd, 1);
        }
        execl(bin, "space-gateway", "--listen-host", "127.0.0.1", "--port", "0", "--port-file",
              port_file, "--max-file-bytes", maxfile, "--tmp-dir", bodydir,
              "--signed-url-fail-per-s", "1", "--signed-url-fail-burst", SIGNED_BURST,
              (char *)NULL);
        _exit(127);
    }
    port = sp_test_port_file(port_file, log_file);
}

static int setup(void **state)
{
    char key_id[SP_APIKEY_ID_LEN + 1];
    (void)state;
    sp_test_stack_load();
    db = sp_test_db();
    if (sp_test_db_wait_scalar(db, "SELECT count(*) FROM schema_migrations WHERE version = 2", 1,
                               20000) != 1)
        fail_msg("schema not migrated");
    assert_int_equal(sp_apikey_create(db, "t1", "gateway limits test", &key, key_id), 0);
    start_gateway();
    for (int i = 0; i < 100; i++) {
        resp_t r;
        int fd = connect_local();
        send_str(fd, "GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        int st = read_resp(fd, 2000, &r);
        resp_free(&r);
        close(fd);
        if (st == 200)
            return 0;
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
    fail_msg("the gateway is not healthy");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (gw_pid > 0) {
        kill(gw_pid, SIGKILL);
        waitpid(gw_pid, NULL, 0);
    }
    explicit_bzero(key, strlen(key));
    free(key);
    sp_buf_dispose(&carry);
    PQfinish(db);
    if (!getenv("SPACE_TEST_KEEP")) {
        char path[160];
        snprintf(path, sizeof(path), "%s/space-gateway.log", tmpdir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/space-gateway.port", tmpdir);
        unlink(path);
        rmdir(bodydir);
        rmdir(tmpdir);
    }
    return 0;
}

/* ---- scenarios ---- */

/* Pushes a body as fast as the gateway takes it (at most cap bytes, for at most ms) until a
 * response is readable; returns when it was (ms after the start), -1 if none came. */
static int64_t push_until_answer(int fd, size_t cap, int ms, size_t *ret_sent)
{
    static char chunk[65536];
    memset(chunk, 'x', sizeof(chunk));
    int64_t t0 = now_ms();
    size_t sent = 0;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int64_t answered = -1;
    while (now_ms() - t0 < ms) {
        struct pollfd p = {.fd = fd, .events = POLLIN | (sent < cap ? POLLOUT : 0)};
        if (poll(&p, 1, 50) < 0)
            break;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            answered = now_ms() - t0;
            break;
        }
        if (p.revents & POLLOUT) {
            size_t n = cap - sent < sizeof(chunk) ? cap - sent : sizeof(chunk);
            ssize_t w = send(fd, chunk, n, MSG_NOSIGNAL);
            if (w > 0)
                sent += (size_t)w;
        }
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *ret_sent = sent;
    return answered;
}

static void test_unauthenticated_big_body(void **state)
{
    (void)state;
    long rss0 = rss_kib();
    long long tmp0 = tmp_bytes();
    int fd = connect_local();
    send_str(fd, "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 "Content-Length: 419430400\r\n\r\n");
    size_t sent = 0;
    int64_t t = push_until_answer(fd, 64u << 20, 3000, &sent);
    long rss1 = rss_kib();
    long long tmp1 = tmp_bytes();
    print_message("unauthenticated 400 MB POST: answer after %lld ms, %zu body bytes pushed; "
                  "gateway RSS %ld -> %ld KiB, temporary body files %lld -> %lld bytes\n",
                  (long long)t, sent, rss0, rss1, tmp0, tmp1);
    resp_t r;
    read_resp(fd, 3000, &r);
    expect_json_error(&r, 401, "unauthorized");
    assert_true(t >= 0 && t < 2000);
    assert_true(rss1 - rss0 < 16 * 1024);
    assert_true(tmp1 - tmp0 < 1024 * 1024);
    assert_true(r.closed || closes(fd, 4000));
    resp_free(&r);
    close(fd);

    /* The same with Expect: 100-continue: no 100, the 401 straight away. */
    fd = connect_local();
    send_str(fd, "PUT /v1/sandboxes/sbx_x/files?path=a HTTP/1.1\r\nHost: t\r\n"
                 "Expect: 100-continue\r\nContent-Length: 419430400\r\n\r\n");
    read_resp(fd, 2000, &r);
    expect_json_error(&r, 401, "unauthorized");
    assert_int_equal(r.interim, 0);
    resp_free(&r);
    close(fd);
}

static void test_route_limits_before_body(void **state)
{
    char req[1024];
    resp_t r;
    (void)state;

    /* Announced lengths over the route's own limit: 413 with no body byte sent. */
    static const struct {
        const char *method, *path;
        long long len;
    } over[] = {
        {"POST", "/v1/sandboxes/sbx_x/timeout", 10LL << 20},
        {"POST", "/v1/sandboxes", 2LL << 20},
        {"POST", "/v1/sandboxes/sbx_x/commands", 2LL << 20},
        {"POST", "/sandboxes/sbx_x/timeout", 10LL << 20},
        {"PUT", "/v1/sandboxes/sbx_x/files?path=a", (long long)FILE_LIMIT + 1},
        {"POST", "/v1/sandboxes/sbx_x/files/mkdir", 2LL << 20},
    };
    for (size_t i = 0; i < sizeof(over) / sizeof(over[0]); i++) {
        int fd = connect_local();
        snprintf(req, sizeof(req),
                 "%s %s HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\nX-Api-Key: %s\r\n"
                 "Content-Type: application/json\r\nContent-Length: %lld\r\n\r\n",
                 over[i].method, over[i].path, key, key, over[i].len);
        send_str(fd, req);
        int64_t t0 = now_ms();
        read_resp(fd, 3000, &r);
        print_message("%s %s Content-Length %lld: %d after %lld ms\n", over[i].method, over[i].path,
                      over[i].len, r.status, (long long)(now_ms() - t0));
        if (strncmp(over[i].path, "/sandboxes", 10) == 0)
            assert_int_equal(r.status, 413); /* E2B shape: {"code": 413, ...} */
        else
            expect_json_error(&r, 413, "body_too_large");
        resp_free(&r);
        close(fd);
    }

    /* Under the upload limit (over max-body-bytes): held for the key, then read; the route
     * then answers for the unknown sandbox. */
    int fd = connect_local();
    snprintf(req, sizeof(req),
             "PUT /v1/sandboxes/sbx_nope/files?path=a HTTP/1.1\r\nHost: t\r\n"
             "Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n",
             key, 2 << 20);
    send_str(fd, req);
    size_t sent = 0;
    push_until_answer(fd, 2u << 20, 10000, &sent);
    assert_int_equal((int)sent, 2 << 20);
    read_resp(fd, 5000, &r);
    expect_json_error(&r, 404, "not_found");
    resp_free(&r);
    close(fd);

    /* Chunked, 10 MB to /timeout: cut at max-body-bytes as it arrives. */
    fd = connect_local();
    snprintf(req, sizeof(req),
             "POST /v1/sandboxes/sbx_x/timeout HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n"
             "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
             key);
    send_str(fd, req);
    static char chunk[65536 + 16];
    int hl = snprintf(chunk, sizeof(chunk), "10000\r\n");
    memset(chunk + hl, ' ', 65536);
    memcpy(chunk + hl + 65536, "\r\n", 2);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    size_t total = 0;
    int64_t t0 = now_ms();
    while (total < (10u << 20) && now_ms() - t0 < 5000) {
        struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT};
        poll(&p, 1, 50);
        if (p.revents & (POLLIN | POLLHUP | POLLERR))
            break;
        if ((p.revents & POLLOUT) && send(fd, chunk, (size_t)hl + 65536 + 2, MSG_NOSIGNAL) > 0)
            total += 65536; /* a partial send breaks the framing: the limit comes first anyway */
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    read_resp(fd, 3000, &r);
    print_message("chunked 10 MB to /timeout: %d after about %zu bytes\n", r.status, total);
    expect_json_error(&r, 413, "body_too_large");
    resp_free(&r);
    close(fd);

    /* Expect: 100-continue on an allowed request: the 100 comes after the checks, then the
     * route answers (unknown sandbox). */
    fd = connect_local();
    snprintf(req, sizeof(req),
             "POST /v1/sandboxes/sbx_nope/timeout HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
             "%s\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
             "Content-Length: 16\r\n\r\n",
             key);
    send_str(fd, req);
    char cont[64] = "";
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 3000), 1);
    ssize_t n = recv(fd, cont, sizeof(cont) - 1, 0);
    assert_true(n > 0);
    assert_non_null(strstr(cont, "HTTP/1.1 100 Continue\r\n\r\n"));
    send_str(fd, "{\"timeout_s\":60}");
    read_resp(fd, 3000, &r);
    expect_json_error(&r, 404, "not_found");
    resp_free(&r);
    close(fd);
}

static void test_framing(void **state)
{
    (void)state;
    static const char *bad[] = {
        /* two Content-Lengths, differing and equal, and as a list */
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 40\r\n"
        "\r\nhello",
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n"
        "\r\nhello",
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: 5, 5\r\n\r\nhello",
        /* Content-Length with Transfer-Encoding, either order */
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
        "Content-Length: 5\r\n\r\n0\r\n\r\n",
        /* Transfer-Encoding other than exactly chunked */
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST /v1/sandboxes HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        /* malformed lengths */
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: +5\r\n\r\nhello",
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: 0x5\r\n\r\nhello",
        "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length : 5\r\n\r\nhello",
        /* obs-fold, bare LF, a control character, no Host, two Hosts */
        "GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n continued\r\n\r\n",
        "GET /healthz HTTP/1.1\nHost: t\n\n",
        "GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: a\x01"
        "b\r\n\r\n",
        "GET /healthz HTTP/1.1\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        /* not a request line h2o would answer at all */
        "GET\r\n\r\n",
        "GET /healthz HTTP/2.0\r\nHost: t\r\n\r\n",
        "G@T /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        exchange(bad[i], 400, "bad_request", true);

    /* A smuggling attempt is not dispatched: the gateway answers one 400, nothing after. */
    int fd = connect_local();
    send_str(fd, "POST /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nContent-Length: 38"
                 "\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    resp_t r;
    read_resp(fd, 3000, &r);
    expect_json_error(&r, 400, "bad_request");
    assert_true(r.closed || closes(fd, 3000));
    resp_free(&r);
    close(fd);
}

static void test_errors_are_json(void **state)
{
    char big[GW_HEAD_TEST_MAX];
    (void)state;
    /* Under /v1 (outside it the E2B SDKs' numeric {"code": 404}: gateway_api.c). */
    exchange("GET /v1/nothing/here HTTP/1.1\r\nHost: t\r\n\r\n", 404, "not_found", false);
    exchange("DELETE /healthz HTTP/1.1\r\nHost: t\r\n\r\n", 405, "method_not_allowed", false);
    exchange("PUT /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n", 405,
             "method_not_allowed", true);
    exchange("GET /v1/sandboxes HTTP/1.1\r\nHost: t\r\n\r\n", 401, "unauthorized", false);
    exchange("POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nExpect: fly\r\nContent-Length: 4\r\n\r\n",
             417, "expectation_failed", true);
    exchange("POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
             401, "unauthorized", true);
    /* A request target over 2048 bytes; a head over 64 KiB. */
    int n = snprintf(big, sizeof(big), "GET /");
    memset(big + n, 'a', 3000);
    snprintf(big + n + 3000, sizeof(big) - (size_t)n - 3000, " HTTP/1.1\r\nHost: t\r\n\r\n");
    exchange(big, 414, "uri_too_long", false);
    n = snprintf(big, sizeof(big), "GET /healthz HTTP/1.1\r\nHost: t\r\n");
    for (int i = 0; i < 80; i++)
        n += snprintf(big + n, sizeof(big) - (size_t)n, "X-Pad-%d: %0900d\r\n", i, 0);
    snprintf(big + n, sizeof(big) - (size_t)n, "\r\n");
    exchange(big, 431, "header_fields_too_large", true);
    n = snprintf(big, sizeof(big), "GET /healthz HTTP/1.1\r\nHost: t\r\n");
    for (int i = 0; i < 101; i++)
        n += snprintf(big + n, sizeof(big) - (size_t)n, "X-F%d: 1\r\n", i);
    snprintf(big + n, sizeof(big) - (size_t)n, "\r\n");
    exchange(big, 431, "header_fields_too_large", true);
}

/* The signed-URL failure rate is configuration: with a burst of 3 (and 1 a second), three
 * wrong signatures from one client are checked (401) and the next is refused before any
 * hashing (429, Retry-After), where the default burst (20) would still check it. */
static void test_signed_url_rate_config(void **state)
{
    static const char bad[] =
        "GET /files?path=/home/user/a&signature=v1_"
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA HTTP/1.1\r\nHost: t\r\n\r\n";
    int codes[5] = {0};
    char v[16];
    (void)state;
    for (int i = 0; i < 5; i++) {
        resp_t r;
        int fd = connect_local();
        send_str(fd, bad);
        read_resp(fd, 5000, &r);
        codes[i] = r.status;
        if (i == 4) {
            assert_true(head_value(r.head, "retry-after", v, sizeof(v)));
            assert_string_equal(v, "1");
        }
        resp_free(&r);
        close(fd);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(codes[i], 401);
    assert_int_equal(codes[3], 429);
    assert_int_equal(codes[4], 429);
}

/* The checks hold on a kept-alive connection and for a pipelined request. */
static void test_keepalive_and_pipelining(void **state)
{
    resp_t r;
    (void)state;
    int fd = connect_local();
    send_str(fd, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    read_resp(fd, 3000, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    send_str(fd, "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: 419430400\r\n\r\n");
    int64_t t0 = now_ms();
    read_resp(fd, 3000, &r);
    expect_json_error(&r, 401, "unauthorized");
    assert_true(now_ms() - t0 < 2000);
    resp_free(&r);
    close(fd);

    fd = connect_local();
    send_str(fd, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
                 "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: 419430400\r\n\r\n");
    read_resp(fd, 3000, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    t0 = now_ms();
    read_resp(fd, 3000, &r);
    expect_json_error(&r, 401, "unauthorized");
    assert_true(now_ms() - t0 < 2000);
    resp_free(&r);
    close(fd);

    fd = connect_local();
    send_str(fd, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
                 "GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n"
                 "\r\nxy");
    read_resp(fd, 3000, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    read_resp(fd, 3000, &r);
    expect_json_error(&r, 400, "bad_request");
    resp_free(&r);
    close(fd);

    /* The gateway still serves. */
    exchange("GET /v1/sandboxes HTTP/1.1\r\nHost: t\r\n\r\n", 401, "unauthorized", false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unauthenticated_big_body),
        cmocka_unit_test(test_route_limits_before_body),
        cmocka_unit_test(test_framing),
        cmocka_unit_test(test_errors_are_json),
        cmocka_unit_test(test_keepalive_and_pipelining),
        cmocka_unit_test(test_signed_url_rate_config),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
