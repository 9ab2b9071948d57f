/* Per-sandbox limits (issue 17, docs/faults.md "Limits"), as a user sees them through HTTP:
 * disk (a btrfs qgroup per sandbox, the worker's reserve), processes (RLIMIT_NPROC in the
 * guest) and memory (the agent's guard kills the process that grows past memory_mb; what no
 * process holds ends the sandbox at the host cgroup's limit, and the API says "oom").
 * Stack: eventlog + scheduler + worker + gateway, on a 2 GiB volume image with a 512 MiB
 * reserve (tests/CMakeLists.txt). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "buf.h"
#include "harness.h"
#include "json.h"

static int port;
static const char *key;

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    return 0;
}

static void create(const char *body, char out[64])
{
    sp_test_create_sandbox_body(port, key, body, out);
}

/* Runs cmd (a shell string) and returns its JSON answer (status 200 asserted). */
static sp_test_cmd_t sh(const char *id, const char *cmd, int timeout_s)
{
    char body[1024];
    snprintf(body, sizeof(body), "{\"cmd\":\"%s\",\"timeout_s\":%d}", cmd, timeout_s);
    sp_test_cmd_t r = sp_test_run(port, key, id, body);
    if (r.status != 200)
        fail_msg("command in %s: %d %s", id, r.status, r.error ? r.error : "");
    return r;
}

static void expect_echo(const char *id)
{
    sp_test_cmd_t r = sh(id, "echo alive", 10);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(r.stdout_s, "alive\n");
    sp_test_cmd_free(&r);
}

static void delete_sandbox(const char *id)
{
    char path[128];
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
    sp_test_http_free(&r);
}

/* GET /v1/sandboxes/{id} until its state is want (30 s at most); the failure reason into
 * reason. */
static void wait_state(const char *id, const char *want, char reason[128])
{
    char path[128], state[32] = "";
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    for (int i = 0; i < 300; i++) {
        sp_test_http_resp_t r;
        sp_test_http(port, "GET", path, key, NULL, NULL, 0, &r);
        if (r.status == 200) {
            sp_json_doc_t *doc = sp_test_json(&r);
            const sp_json_t *root = sp_json_root(doc);
            const char *s = sp_json_str(sp_json_get(root, "state"), NULL);
            const char *why = sp_json_str(sp_json_get(root, "failure_reason"), NULL);
            snprintf(state, sizeof(state), "%s", s ? s : "");
            snprintf(reason, 128, "%s", why ? why : "");
            sp_json_doc_free(doc);
        }
        sp_test_http_free(&r);
        if (strcmp(state, want) == 0)
            return;
        usleep(100 * 1000);
    }
    fail_msg("sandbox %s: state %s, not %s", id, state, want);
}

/* GET /v1/sandboxes/{id}'s resources.disk_mb. */
static int64_t disk_mb_of(const char *id)
{
    char path[128];
    int64_t v = -1;
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    sp_test_http(port, "GET", path, key, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 200);
    sp_json_doc_t *doc = sp_test_json(&r);
    const sp_json_t *res = sp_json_get(sp_json_root(doc), "resources");
    assert_true(sp_json_int(sp_json_get(res, "disk_mb"), 0, 1LL << 40, &v) == 0);
    sp_json_doc_free(doc);
    sp_test_http_free(&r);
    return v;
}

/* A sandbox with disk_mb 64 fills it: its writes fail with EDQUOT, while a neighbour writes
 * and a new sandbox is created. Then the reserve: a create whose limit does not fit beside it
 * is refused, clearly. */
static void test_disk(void **state)
{
    (void)state;
    char a[64], b[64], c[64];
    create("{\"template\":\"tiny\",\"resources\":{\"disk_mb\":64}}", a);
    create("{\"template\":\"tiny\"}", b);
    /* The API says the limit each got: asked, or the worker's default (256 here). */
    assert_int_equal(disk_mb_of(a), 64);
    assert_int_equal(disk_mb_of(b), 256);
    /* The worker's heartbeat carries its volume: what the scheduler places by. */
    PGconn *db = sp_test_db();
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM workers WHERE state = 'up' AND "
                                           "disk_mb_total BETWEEN 1024 AND 2048 AND disk_mb_free "
                                           "> 512 AND disk_mb_reserve = 512 AND disk_mb_default "
                                           "= 256"),
                     1);

    sp_test_cmd_t r = sh(a, "fallocate -l 100M /root/big", 30);
    assert_int_not_equal(r.exit_code, 0);
    if (!strstr(r.stderr_s, "Disk quota exceeded"))
        fail_msg("fallocate past disk_mb: %s", r.stderr_s);
    sp_test_cmd_free(&r);
    /* Writing until it stops: it stops at the limit, with EDQUOT. A neighbour's 32 MiB go
     * through meanwhile (the volume is far from full). */
    char bg[160];
    snprintf(bg, sizeof(bg),
             "{\"cmd\":\"dd if=/dev/zero of=/root/n bs=1M count=32 2>&1 && sync "
             "&& echo done\",\"timeout_s\":60}");
    r = sh(a, "dd if=/dev/zero of=/root/fill bs=1M count=200 2>&1; echo rc=$?", 60);
    if (!strstr(r.stdout_s, "Disk quota exceeded") || !strstr(r.stdout_s, "rc=1"))
        fail_msg("dd past disk_mb: %s", r.stdout_s);
    sp_test_cmd_free(&r);
    r = sp_test_run(port, key, b, bg);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.stdout_s, "done"));
    sp_test_cmd_free(&r);
    /* Even a small file fails in the full sandbox, which still answers. */
    r = sh(a, "echo x > /root/small", 10);
    assert_int_not_equal(r.exit_code, 0);
    assert_non_null(strstr(r.stderr_s, "Disk quota exceeded"));
    sp_test_cmd_free(&r);
    expect_echo(a);
    create("{\"template\":\"tiny\"}", c);
    expect_echo(c);
    /* Room again once the sandbox removes what it wrote. */
    r = sh(a, "rm -f /root/fill /root/big && sync && echo x > /root/small && echo ok", 30);
    assert_int_equal(r.exit_code, 0);
    sp_test_cmd_free(&r);

    /* A resumed sandbox has its limit again (a new subvolume, from the suspend's delta). */
    char st[64];
    assert_int_equal(sp_test_lifecycle(port, key, a, "suspend", "", st, sizeof(st)), 200);
    assert_int_equal(sp_test_lifecycle(port, key, a, "resume", "", st, sizeof(st)), 200);
    r = sh(a, "cat /root/small && fallocate -l 100M /root/big", 30);
    assert_int_not_equal(r.exit_code, 0);
    assert_string_equal(r.stdout_s, "x\n");
    if (!strstr(r.stderr_s, "Disk quota exceeded"))
        fail_msg("fallocate past disk_mb after a resume: %s", r.stderr_s);
    sp_test_cmd_free(&r);

    /* The reserve: 4 GiB on a 2 GiB volume cannot fit; the answer says why. */
    const char *big = "{\"template\":\"tiny\",\"resources\":{\"disk_mb\":4096}}";
    sp_test_http_resp_t h;
    sp_test_http(port, "POST", "/v1/sandboxes", key, NULL, big, strlen(big), &h);
    if (h.status != 503 || !strstr(h.body, "no_capacity"))
        fail_msg("create over the disk: %d %s", h.status, h.body);
    /* Refused by the scheduler, which knows the worker's disk: nothing was placed. */
    sp_json_doc_t *doc = sp_test_json(&h);
    const char *refused = sp_json_str(sp_json_get(sp_json_root(doc), "sandbox_id"), NULL);
    assert_non_null(refused);
    assert_int_equal(sp_test_events(db, refused, "SandboxRequestRejected",
                                    "4096 MiB of disk free for disk_mb beside its reserve"),
                     1);
    assert_int_equal(sp_test_events(db, refused, "SandboxPlaced", NULL), 0);
    sp_json_doc_free(doc);
    PQfinish(db);
    sp_test_http_free(&h);
    /* Out of range, refused before anything is placed. */
    const char *tiny = "{\"template\":\"tiny\",\"resources\":{\"disk_mb\":1}}";
    sp_test_http(port, "POST", "/v1/sandboxes", key, NULL, tiny, strlen(tiny), &h);
    assert_int_equal(h.status, 400);
    assert_non_null(strstr(h.body, "disk_mb"));
    sp_test_http_free(&h);
    delete_sandbox(a);
    delete_sandbox(b);
    delete_sandbox(c);
}

/* A fork bomb (bounded: 2,000 sleeps, far past the worker's 256 processes per uid here) is
 * stopped inside: the shell reports "can't fork" and ends; the neighbour answers at once and
 * the sandbox itself once the bomb's processes are gone. */
static void test_pids(void **state)
{
    (void)state;
    char a[64], b[64];
    create("{\"template\":\"tiny\"}", a);
    create("{\"template\":\"tiny\"}", b);
    /* As the unprivileged user first: root's commands are counted apart and still start. */
    sp_test_cmd_t r = sp_test_run(port, key, a,
                                  "{\"cmd\":\"for i in $(seq 2000); do sleep 5 & done; echo "
                                  "unreachable\",\"user\":\"user\",\"timeout_s\":20}");
    assert_int_equal(r.status, 200);
    /* busybox sh gives up at the first fork that fails (exit 2), saying so. */
    if (r.exit_code == 0 || !strstr(r.stderr_s, "can't fork") || strstr(r.stdout_s, "unreachable"))
        fail_msg("fork bomb not stopped: exit %lld out %s err %s", (long long)r.exit_code,
                 r.stdout_s, r.stderr_s);
    sp_test_cmd_free(&r);
    expect_echo(a);
    r = sh(a, "for i in $(seq 2000); do sleep 5 & done; echo unreachable", 20);
    if (r.exit_code == 0 || !strstr(r.stderr_s, "can't fork") || strstr(r.stdout_s, "unreachable"))
        fail_msg("fork bomb as root not stopped: exit %lld out %s err %s", (long long)r.exit_code,
                 r.stdout_s, r.stderr_s);
    sp_test_cmd_free(&r);
    expect_echo(b);
    /* The bomb's sleeps hold the limit until they end (5 s); meanwhile a new command of the
     * same uid cannot start, and says so. Then the sandbox runs commands again. */
    int ok = 0;
    for (int i = 0; i < 100 && !ok; i++) {
        sp_test_cmd_t e = sp_test_run(port, key, a, "{\"cmd\":\"echo alive\",\"timeout_s\":5}");
        ok =
            e.status == 200 && e.exit_code == 0 && e.stdout_s && strcmp(e.stdout_s, "alive\n") == 0;
        sp_test_cmd_free(&e);
        if (!ok)
            usleep(200 * 1000);
    }
    if (!ok)
        fail_msg("sandbox %s does not run commands after the fork bomb", a);
    delete_sandbox(a);
    delete_sandbox(b);
}

/* A hog past memory_mb: the agent's memory guard kills it (the process with the largest
 * resident set once the guest's MemAvailable runs low) before the host limit, which has
 * headroom above memory_mb, is reached: the command ends with a clear error, the sandbox and
 * what it kept in memory (/tmp, a tmpfs) live, its MemTotal is still memory_mb, and the log's
 * CommandExited says why. What no process holds (a /tmp filled up) still takes the sandbox
 * past the host limit: it fails, and the API says "oom". The neighbour lives through both. */
static void test_memory(void **state)
{
    (void)state;
    char a[64], b[64], c[64], reason[128];
    create("{\"template\":\"tiny\",\"resources\":{\"memory_mb\":128}}", a);
    create("{\"template\":\"tiny\",\"resources\":{\"memory_mb\":128}}", b);
    sp_test_cmd_t r = sh(a, "echo kept > /tmp/marker; grep MemTotal /proc/meminfo", 10);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.stdout_s, "131072 kB"));
    sp_test_cmd_free(&r);

    /* busybox tail keeps all of a line-less input: a process that grows past 128 MiB. */
    r = sh(a, "head -c 419430400 /dev/zero | tail; echo after=$?", 120);
    print_message("hog: exit %lld signal %lld error %s stdout %s", (long long)r.exit_code,
                  (long long)r.signal, r.error ? r.error : "(none)", r.stdout_s);
    const char *why = r.error ? r.error : "(no error)";
    if (!strstr(why, "out of memory: tail") || !strstr(why, "at the sandbox's 128 MiB"))
        fail_msg("the hog's command does not say it was killed for memory: %s", why);
    assert_non_null(strstr(r.stdout_s, "after=137")); /* the shell went on: tail got SIGKILL */
    sp_test_cmd_free(&r);
    r = sh(a, "cat /tmp/marker; grep MemTotal /proc/meminfo", 10);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(strstr(r.stdout_s, "kept\n"));
    assert_non_null(strstr(r.stdout_s, "131072 kB"));
    sp_test_cmd_free(&r);
    wait_state(a, "running", reason);
    PGconn *db = sp_test_db();
    assert_int_equal(sp_test_events(db, a, "CommandExited", "out of memory: tail"), 1);
    PQfinish(db);

    /* A /tmp that fills the memory: no process to blame, the host limit ends the sandbox. */
    create("{\"template\":\"tiny\",\"resources\":{\"memory_mb\":128}}", c);
    r = sp_test_run(port, key, c,
                    "{\"cmd\":\"head -c 419430400 /dev/zero > /tmp/fill\",\"timeout_s\":60}");
    if (r.status == 200 && r.exit_code == 0)
        fail_msg("the tmpfs fill was not stopped: %s", r.stderr_s);
    sp_test_cmd_free(&r);
    wait_state(c, "failed", reason);
    assert_string_equal(reason, "oom");
    expect_echo(a);
    expect_echo(b);
    delete_sandbox(a);
    delete_sandbox(b);
    delete_sandbox(c);
}

/* The output of a shell command (heap), failing the test when it cannot run. */
static char *host_out(const char *cmd)
{
    FILE *f = popen(cmd, "r"); /* NOLINT(cert-env33-c): the test looks at the host as root */
    if (!f)
        fail_msg("cannot run %s", cmd);
    sp_buf_t b;
    char chunk[4096];
    size_t n;
    sp_buf_init(&b);
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        sp_buf_append(&b, chunk, n);
    pclose(f);
    sp_buf_putc(&b, '\0');
    return sp_buf_take(&b);
}

/* The name of sandbox id's subvolume: its own, or the pool id's when it was claimed from a warm
 * pool (docs/pools.md: bundles/<id> links to it). */
static void subvol_of(const char *id, char out[80])
{
    char link[1024];
    snprintf(link, sizeof(link), "%s/worker/bundles/%s", sp_test_env("SPACE_HOME"), id);
    ssize_t n = readlink(link, out, 79);
    if (n > 0)
        out[n] = '\0';
    else
        snprintf(out, 80, "%s", id);
}

/* Deleted sandboxes leave no qgroup on the worker's volume (docs/faults.md, "Stale qgroups"),
 * and the worker's sweeps (every 2 s in this stack, while the tests above wrote to their
 * limits) never touch a live sandbox's. */
static void test_qgroups(void **state)
{
    (void)state;
    char vol[4096], cmd[8192], ids[3][64], live[64];
    snprintf(vol, sizeof(vol), "%s/worker/volumes", sp_test_env("SPACE_HOME"));
    create("{\"template\":\"tiny\",\"resources\":{\"disk_mb\":64}}", live);
    uint64_t qid[3];
    for (int i = 0; i < 3; i++) {
        create("{\"template\":\"tiny\"}", ids[i]);
        sp_test_cmd_t r = sh(ids[i],
                             "seq 1000 > /root/f && mkdir /root/d && cd /root/d && seq "
                             "500 | xargs touch",
                             30);
        assert_int_equal(r.exit_code, 0);
        sp_test_cmd_free(&r);
        char sv[80];
        subvol_of(ids[i], sv);
        snprintf(cmd, sizeof(cmd), "btrfs inspect-internal rootid '%s/sandboxes/%s'", vol, sv);
        char *out = host_out(cmd);
        qid[i] = strtoull(out, NULL, 10);
        free(out);
        assert_true(qid[i] >= 256);
    }
    for (int i = 0; i < 3; i++)
        delete_sandbox(ids[i]);
    /* Their subvolumes are dropped by the kernel's cleaner; then their qgroups go, removed by
     * the kernel itself (6.10 and later) or by the worker's sweep. */
    snprintf(cmd, sizeof(cmd), "btrfs subvolume sync '%s' >/dev/null 2>&1", vol);
    assert_int_equal(system(cmd), 0); /* NOLINT(cert-env33-c) */
    snprintf(cmd, sizeof(cmd), "btrfs qgroup show '%s' 2>&1", vol);
    char *show = NULL;
    bool gone = false;
    for (int t = 0; t < 100 && !gone; t++) {
        free(show);
        show = host_out(cmd);
        gone = !strstr(show, "<stale>");
        for (int i = 0; i < 3 && gone; i++) {
            char q[32];
            snprintf(q, sizeof(q), "0/%llu ", (unsigned long long)qid[i]);
            gone = !strstr(show, q);
        }
        if (!gone)
            usleep(200 * 1000);
    }
    if (!gone)
        fail_msg("qgroups of deleted sandboxes are left:\n%s", show);
    print_message("after 3 deletes:\n%s", show);
    /* The live sandbox keeps its qgroup and its limit. */
    char live_sv[80];
    subvol_of(live, live_sv);
    assert_non_null(strstr(show, live_sv));
    free(show);
    snprintf(cmd, sizeof(cmd), "btrfs qgroup show -e --raw '%s' | grep 'sandboxes/%s'", vol,
             live_sv);
    show = host_out(cmd);
    assert_non_null(strstr(show, "67108864"));
    free(show);
    sp_test_cmd_t r = sh(live, "fallocate -l 100M /root/big 2>&1; echo rc=$?", 30);
    assert_non_null(strstr(r.stdout_s, "Disk quota exceeded"));
    sp_test_cmd_free(&r);
    delete_sandbox(live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disk),
        cmocka_unit_test(test_pids),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_qgroups),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
