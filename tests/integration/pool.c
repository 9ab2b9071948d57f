/* Warm pools (docs/pools.md), end to end: a create claims a sandbox the worker made ahead and
 * gives it its own identity: its hostname is its id, commands see its env and run as the user
 * asked, its network policy is its own (an allow_all claim reaches a test address; the deny_all
 * claim after it, maybe on the same /30, does not), and nothing of an earlier claim (a file)
 * is in a later one. The pool refills after claims; pause, suspend, resume and delete treat a
 * claimed sandbox like any other; a worker SIGKILLed with a full pool leaves none of its pooled
 * sandboxes on the host once `space up` restarted it, and keeps its claimed one; with
 * SPACE_POOL_SIZE=0 a create is made from scratch as before pools existed.
 *
 * Safety: the one address probed (ECHO_IP, a 198.18.0.0/15 benchmarking address) is routed on
 * the host into a network namespace this test makes, where a TCP echo server answers, BEFORE
 * the first probe; egressd's upstream resolver is an address in that namespace too. Nothing
 * leaves this machine. Stack: eventlog, scheduler, worker (pool size 2), credstore, egressd,
 * gateway (tests/CMakeLists.txt). */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "envelope.h"
#include "harness.h"
#include "json.h"
#include "xmalloc.h"

#define NS      "plt-inet"
#define VETH    "plt-h"
#define ECHO_IP "198.18.211.10"
#define POOL    2

static int port;
static const char *key;
static PGconn *db;
static char state_dir[512];
static char claimed[64]; /* a claimed sandbox that lives through the worker's restart */

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int rc = system(cmd); /* NOLINT(cert-env33-c): ip(8), as an operator would */
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void net_down(void)
{
    sh("ip netns pids " NS " 2>/dev/null | xargs -r kill -9 2>/dev/null; "
       "ip route del 198.18.211.0/24 2>/dev/null; ip link del " VETH " 2>/dev/null; "
       "ip netns del " NS " 2>/dev/null");
}

/* The namespace, its route, and a TCP echo server on ECHO_IP:7777 ("pool-echo:" + the data). */
static void net_up(void)
{
    net_down();
    if (sh("ip netns add " NS " && ip link add " VETH " type veth peer name eth0 netns " NS
           " && ip addr add 198.18.210.1/30 dev " VETH " && ip link set " VETH " up"
           " && ip -n " NS " link set lo up && ip -n " NS " addr add 198.18.210.2/30 dev eth0"
           " && ip -n " NS " link set eth0 up && ip -n " NS " addr add " ECHO_IP "/32 dev eth0"
           " && ip -n " NS " route add default via 198.18.210.1"
           " && ip route add 198.18.211.0/24 via 198.18.210.2 dev " VETH) != 0)
        fail_msg("cannot make the test namespace");
    if (sh("ip route get " ECHO_IP " | grep -q 'dev " VETH "'") != 0)
        fail_msg(ECHO_IP " is not routed into the test namespace: not probing");
    sh("ip netns exec " NS " python3 -c '"
       "import socketserver\n"
       "class H(socketserver.BaseRequestHandler):\n"
       "    def handle(self):\n"
       "        d = self.request.recv(1024)\n"
       "        self.request.sendall(b\"pool-echo:\" + d)\n"
       "socketserver.ThreadingTCPServer.allow_reuse_address = True\n"
       "socketserver.ThreadingTCPServer((\"" ECHO_IP "\", 7777), H).serve_forever()\n"
       "' >/dev/null 2>&1 &");
    for (int i = 0; i < 100; i++) {
        if (sh("ip netns exec " NS " python3 -c 'import socket\n"
               "s = socket.create_connection((\"" ECHO_IP "\", 7777), 1)\n"
               "s.sendall(b\"x\")\n"
               "assert s.recv(64).startswith(b\"pool-echo\")' 2>/dev/null") == 0)
            return;
        usleep(100 * 1000);
    }
    fail_msg("the test echo server did not start");
}

static void create(const char *body, char out[64])
{
    sp_test_create_sandbox_body(port, key, body, out);
}

static sp_test_cmd_t run(const char *id, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static sp_test_cmd_t run(const char *id, const char *fmt, ...)
{
    char body[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof(body), fmt, ap);
    va_end(ap);
    sp_test_cmd_t r = sp_test_run(port, key, id, body);
    if (r.status != 200)
        fail_msg("command in %s: %d %s", id, r.status, r.error ? r.error : "");
    return r;
}

/* Its stdout without the last newline, into out. */
static void out_of(const char *id, char *out, size_t len, const char *body)
{
    sp_test_cmd_t r = run(id, "%s", body);
    snprintf(out, len, "%s", r.stdout_s ? r.stdout_s : "");
    out[strcspn(out, "\n")] = '\0';
    sp_test_cmd_free(&r);
}

static void delete_sandbox(const char *id)
{
    char path[128];
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
    if (r.status != 204)
        fail_msg("delete %s: %d %s", id, r.status, r.body);
    sp_test_http_free(&r);
}

/* Whether the SandboxStarted of id says from_pool (the stored envelope, decoded). */
static bool from_pool(const char *id)
{
    const char *p[1] = {id};
    for (int i = 0; i < 200; i++) {
        PGresult *r = PQexecParams(db,
                                   "SELECT payload FROM events WHERE aggregate_id = $1 AND type = "
                                   "'SandboxStarted' AND status = 'accepted' ORDER BY stream_seq",
                                   1, NULL, p, NULL, NULL, 1);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
            sp_envelope_t *ev = NULL;
            char reason[SP_REASON_MAX];
            if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, 0, 0),
                                   (size_t)PQgetlength(r, 0, 0), &ev, reason) < 0)
                fail_msg("SandboxStarted of %s does not decode: %s", id, reason);
            bool fp = ev->sandbox_started->from_pool;
            sp_envelope_free(ev);
            PQclear(r);
            return fp;
        }
        PQclear(r);
        usleep(50 * 1000);
    }
    fail_msg("no SandboxStarted for %s", id);
    return false;
}

/* Unclaimed pooled sandboxes on the host: bundles named pool_* that no sandbox links to. */
static int pooled_on_host(char ids[][64], int max)
{
    char links[64][80];
    int nl = 0, n = 0;
    char bundles[600];
    snprintf(bundles, sizeof(bundles), "%s/bundles", state_dir);
    DIR *d = opendir(bundles);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char path[1024], target[80];
        snprintf(path, sizeof(path), "%s/%s", bundles, de->d_name);
        ssize_t k = readlink(path, target, sizeof(target) - 1);
        if (k > 0 && nl < 64) {
            target[k] = '\0';
            snprintf(links[nl++], sizeof(links[0]), "%s", target);
        }
    }
    if (d)
        rewinddir(d);
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, "pool_", 5) != 0)
            continue;
        bool linked = false;
        for (int i = 0; i < nl; i++)
            linked |= strcmp(links[i], de->d_name) == 0;
        if (!linked && n < max && strlen(de->d_name) < 64)
            memcpy(ids[n++], de->d_name, strlen(de->d_name) + 1);
    }
    if (d)
        closedir(d);
    return n;
}

/* The pool id behind a claimed sandbox ("" when it is not one). */
static void pool_id_of(const char *id, char out[64])
{
    char path[800];
    snprintf(path, sizeof(path), "%s/bundles/%s", state_dir, id);
    ssize_t k = readlink(path, out, 63);
    out[k > 0 ? k : 0] = '\0';
}

/* Waits until the host holds want unclaimed pooled sandboxes and the heartbeat says as much. */
static void wait_pooled(int want)
{
    char ids[8][64];
    int n = -1;
    long long v = -1;
    for (int i = 0; i < 600; i++) {
        n = pooled_on_host(ids, 8);
        v = sp_test_db_scalar(
            db, "SELECT COALESCE((pools ->> 'tiny')::int, 0) FROM workers WHERE state = 'up'");
        if (n == want && v == want)
            return;
        usleep(100 * 1000);
    }
    fail_msg("pooled sandboxes: %d on the host, %lld in the heartbeat; want %d", n, v, want);
}

static int setup(void **state)
{
    (void)state;
    if (geteuid() != 0)
        return 0;
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    db = sp_test_db();
    snprintf(state_dir, sizeof(state_dir), "%s/worker", sp_test_env("SPACE_HOME"));
    net_up();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    net_down();
    PQfinish(db);
    return 0;
}

#define NEED_ROOT()                                                                                \
    do {                                                                                           \
        if (geteuid() != 0)                                                                        \
            skip();                                                                                \
    } while (0)

static void test_pool_fills(void **state)
{
    (void)state;
    NEED_ROOT();
    wait_pooled(POOL);
    char ids[8][64];
    assert_int_equal(pooled_on_host(ids, 8), POOL);
    for (int i = 0; i < POOL; i++)
        assert_true(sp_test_sandbox_held(state_dir, ids[i]));
}

/* Each claim has its own identity, policy and disk. */
static void test_claims_are_their_own(void **state)
{
    (void)state;
    NEED_ROOT();
    char a[64], b[64], pa[64], pb[64], out[512];
    wait_pooled(POOL);
    create("{\"template\":\"tiny\",\"env\":{\"WHO\":\"first\"},\"network\":{\"mode\":"
           "\"allow_all\"},\"metadata\":{\"claim\":\"a\"}}",
           a);
    /* allow_all: the test address answers (through egressd), at the first try after the
     * claim answered: the policy was in force by then (egressd holds a connection from an
     * address it has not seen named yet until it has: docs/pools.md). */
    out_of(a, out, sizeof(out), "{\"cmd\":\"echo hi | nc -w 3 " ECHO_IP " 7777\"}");
    if (!strstr(out, "pool-echo:hi"))
        fail_msg("allow_all claim could not reach " ECHO_IP ": %s", out);
    assert_true(from_pool(a));
    pool_id_of(a, pa);
    assert_int_equal(strncmp(pa, "pool_", 5), 0);
    out_of(a, out, sizeof(out), "{\"cmd\":\"hostname\"}");
    assert_string_equal(out, a);
    out_of(a, out, sizeof(out), "{\"cmd\":\"echo $WHO\"}");
    assert_string_equal(out, "first");
    out_of(a, out, sizeof(out), "{\"cmd\":\"id -u\",\"user\":\"user\"}");
    assert_string_not_equal(out, "0");
    out_of(a, out, sizeof(out), "{\"cmd\":\"id -u\",\"user\":\"root\"}");
    assert_string_equal(out, "0");
    /* What a command can do with its capabilities: the claim's CAP_SYS_ADMIN is gone. */
    out_of(a, out, sizeof(out), "{\"cmd\":\"hostname evil 2>/dev/null; hostname\"}");
    assert_string_equal(out, a);
    out_of(a, out, sizeof(out), "{\"cmd\":\"echo secret-a > /root/mark; cat /root/mark\"}");
    assert_string_equal(out, "secret-a");
    delete_sandbox(a);
    for (int i = 0; i < 100 && sp_test_sandbox_held(state_dir, pa); i++)
        usleep(50 * 1000);
    assert_false(sp_test_sandbox_held(state_dir, a));
    assert_false(sp_test_sandbox_held(state_dir, pa));

    /* The next claim: deny_all (the default), another env, nothing of a's. */
    create("{\"template\":\"tiny\",\"env\":{\"WHO\":\"second\"}}", b);
    assert_true(from_pool(b));
    pool_id_of(b, pb);
    assert_string_not_equal(pa, pb);
    out_of(b, out, sizeof(out), "{\"cmd\":\"hostname\"}");
    assert_string_equal(out, b);
    out_of(b, out, sizeof(out), "{\"cmd\":\"echo $WHO\"}");
    assert_string_equal(out, "second");
    out_of(b, out, sizeof(out), "{\"cmd\":\"cat /root/mark 2>/dev/null || echo absent\"}");
    assert_string_equal(out, "absent");
    /* Pause, suspend and resume like any other; the identity survives the suspend. */
    char st[64];
    assert_int_equal(sp_test_lifecycle(port, key, b, "pause", NULL, st, sizeof(st)), 200);
    assert_int_equal(sp_test_lifecycle(port, key, b, "resume", NULL, st, sizeof(st)), 200);
    assert_int_equal(sp_test_lifecycle(port, key, b, "suspend", NULL, st, sizeof(st)), 200);
    assert_string_equal(st, "suspended");
    for (int i = 0; i < 100 && sp_test_sandbox_held(state_dir, pb); i++)
        usleep(50 * 1000);
    assert_false(sp_test_sandbox_held(state_dir, pb));
    assert_int_equal(sp_test_lifecycle(port, key, b, "resume", NULL, st, sizeof(st)), 200);
    assert_string_equal(st, "running");
    /* A resume answers once the agent is back, or after 5 s without it (worker_lifecycle.c);
     * on a loaded host the agent may take longer: its commands wait for it here. */
    sp_test_cmd_t rr = {0};
    for (int i = 0; i < 100; i++) {
        rr = sp_test_run(port, key, b, "{\"cmd\":\"hostname\"}");
        if (rr.status != 503 || !rr.error || !strstr(rr.error, "agent_unavailable"))
            break;
        sp_test_cmd_free(&rr);
        usleep(100 * 1000);
    }
    assert_int_equal(rr.status, 200);
    snprintf(out, sizeof(out), "%s", rr.stdout_s ? rr.stdout_s : "");
    out[strcspn(out, "\n")] = '\0';
    sp_test_cmd_free(&rr);
    assert_string_equal(out, b);
    /* deny_all: the address a's policy let through is not reachable from b (a TCP connection
     * attempt last: a suspend would wait for its TIME_WAIT). */
    out_of(b, out, sizeof(out), "{\"cmd\":\"echo hi | nc -w 2 " ECHO_IP " 7777; echo rc=$?\"}");
    if (strstr(out, "pool-echo"))
        fail_msg("deny_all claim reached " ECHO_IP ": %s", out);
    snprintf(claimed, sizeof(claimed), "%s", b);
}

static void test_pool_refills(void **state)
{
    (void)state;
    NEED_ROOT();
    char x[64], y[64];
    wait_pooled(POOL);
    create("{\"template\":\"tiny\"}", x);
    create("{\"template\":\"tiny\"}", y);
    assert_true(from_pool(x));
    assert_true(from_pool(y));
    /* Both were taken; the refill makes them again in the background. */
    wait_pooled(POOL);
    /* A claimed sandbox is deleted like any other: nothing of it (or its pool id) stays. */
    char px[64];
    pool_id_of(x, px);
    delete_sandbox(x);
    delete_sandbox(y);
    for (int i = 0; i < 100 && sp_test_sandbox_held(state_dir, px); i++)
        usleep(50 * 1000);
    assert_false(sp_test_sandbox_held(state_dir, x));
    assert_false(sp_test_sandbox_held(state_dir, px));
}

/* Killed with a full pool: the restarted worker releases every pooled sandbox of the dead
 * one (they are in no log), makes new ones, and adopts the claimed sandbox as before. */
static void test_kill9_full_pool(void **state)
{
    (void)state;
    NEED_ROOT();
    if (!claimed[0])
        skip();
    char old[8][64], now[8][64], out[256];
    wait_pooled(POOL);
    int n = pooled_on_host(old, 8);
    assert_int_equal(n, POOL);
    sp_test_daemon_kill9("space-worker");
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 200 && sp_test_sandbox_held(state_dir, old[i]); k++)
            usleep(50 * 1000);
        if (sp_test_sandbox_held(state_dir, old[i]))
            fail_msg("pooled sandbox %s of the killed worker is still on the host", old[i]);
    }
    wait_pooled(POOL);
    int m = pooled_on_host(now, 8);
    assert_int_equal(m, POOL);
    for (int i = 0; i < m; i++)
        for (int k = 0; k < n; k++)
            assert_string_not_equal(now[i], old[k]);
    /* The claimed one was adopted: its agent connects back. */
    sp_test_cmd_t r = {0};
    for (int i = 0; i < 100; i++) {
        r = sp_test_run(port, key, claimed, "{\"cmd\":\"hostname\"}");
        if (r.status == 200)
            break;
        sp_test_cmd_free(&r);
        usleep(100 * 1000);
    }
    assert_int_equal(r.status, 200);
    snprintf(out, sizeof(out), "%s", r.stdout_s ? r.stdout_s : "");
    out[strcspn(out, "\n")] = '\0';
    sp_test_cmd_free(&r);
    assert_string_equal(out, claimed);
    delete_sandbox(claimed);
}

/* SPACE_POOL_SIZE=0: no pooled sandbox, a create made from scratch, as before pools. */
static void test_pool_off(void **state)
{
    (void)state;
    NEED_ROOT();
    char id[64], out[256], ids[8][64];
    sp_test_daemon_stop("space-worker", SIGTERM);
    /* A clean stop released the pool. */
    assert_int_equal(pooled_on_host(ids, 8), 0);
    setenv("SPACE_POOL_SIZE", "0", 1);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    create("{\"template\":\"tiny\"}", id);
    assert_false(from_pool(id));
    char pid[64];
    pool_id_of(id, pid);
    assert_string_equal(pid, "");
    out_of(id, out, sizeof(out), "{\"cmd\":\"hostname\"}");
    assert_string_equal(out, id);
    assert_int_equal(pooled_on_host(ids, 8), 0);
    assert_int_equal(
        sp_test_db_wait_scalar(db, "SELECT COALESCE((pools ->> 'tiny')::int, -1) FROM workers", -1,
                               10000),
        -1);
    delete_sandbox(id);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_fills),   cmocka_unit_test(test_claims_are_their_own),
        cmocka_unit_test(test_pool_refills), cmocka_unit_test(test_kill9_full_pool),
        cmocka_unit_test(test_pool_off),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
