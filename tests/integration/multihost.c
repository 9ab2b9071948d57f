/* Suspend on one worker, resume on another: two space-workers, each with its own state
 * directory, btrfs volume, runsc root, firewall table and snapshot cache, sharing only NATS,
 * PostgreSQL and the snapshot store, which here is the NATS object store (the stack runs with
 * SPACE_SNAPSHOT_STORE=nats). The stack's worker is one; the test starts the second.
 *
 *   - a sandbox counting in memory and holding a file is suspended on its worker, that worker
 *     is stopped (a host gone), and the resume lands on the other worker, which fetches the
 *     artifacts from the bucket: the counter goes on, the file is there, the bucket and both
 *     caches are empty afterwards (the stopped worker sweeps its stale copy when it returns);
 *   - with both workers up, a resume goes back to the worker that has the snapshot cached,
 *     although the other one is less loaded;
 *   - an artifact replaced in the bucket by other bytes (the store lies) fails the resume with
 *     digest_mismatch, keeps the snapshot, and once the bytes are right again it resumes. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "error.h"
#include "harness.h"
#include "objstore.h"
#include "xmalloc.h"

#define BUCKET "space-snapshots"

static int port;
static const char *key;
static char w1[64], w2[64]; /* the stack's worker, the test's */
static char w1_dir[512], w2_dir[512];
static pid_t w2_pid;
static PGconn *db;
static sp_bus_t *bus;

/* ---- the second worker ---- */

static void w2_args(char **argv, const char *extra)
{
    int n = 0;
    char *bin = sp_xasprintf("%s/space-worker", sp_test_env("SPACE_BIN_DIR"));
    argv[n++] = bin;
    argv[n++] = "--id";
    argv[n++] = w2;
    argv[n++] = "--state-dir";
    argv[n++] = w2_dir;
    argv[n++] = "--snapshot-store";
    argv[n++] = "nats";
    argv[n++] = "--heartbeat-ms";
    argv[n++] = "1000";
    argv[n++] = "--snapshot-sweep-s";
    argv[n++] = "2";
    if (extra)
        argv[n++] = (char *)extra;
    argv[n] = NULL;
}

static pid_t w2_spawn(const char *extra)
{
    char *argv[16];
    w2_args(argv, extra);
    char *log = sp_xasprintf("%s/log/space-worker-2.log", sp_test_env("SPACE_HOME"));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    free(log);
    free(argv[0]);
    return pid;
}

static void w2_stop(void)
{
    if (w2_pid <= 0)
        return;
    kill(w2_pid, SIGTERM);
    int status = 0;
    waitpid(w2_pid, &status, 0);
    w2_pid = 0;
}

/* Whether worker id heartbeats now (within 3 s) and offers tiny. */
static bool live(const char *id)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM workers WHERE id = '%s' AND templates ? 'tiny' AND "
             "last_heartbeat_at > now() - interval '3 seconds'",
             id);
    return sp_test_db_scalar(db, sql) == 1;
}

static void wait_live(const char *id, bool want)
{
    /* The scheduler counts a worker dead after 3 missed heartbeats (2 s each by default). */
    for (int i = 0; i < 600 && live(id) != want; i++)
        usleep(100 * 1000);
    assert_true(live(id) == want);
    if (!want)
        sleep(7); /* until the scheduler's own view agrees */
}

static void stop_worker(const char *id)
{
    if (strcmp(id, w2) == 0)
        w2_stop();
    else
        sp_test_daemon_stop("space-worker", SIGTERM);
    wait_live(id, false);
}

static void start_worker(const char *id)
{
    if (strcmp(id, w2) == 0)
        w2_pid = w2_spawn(NULL);
    else
        assert_int_equal(sp_test_space("up"), 0);
    wait_live(id, true);
}

static int setup(void **state)
{
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    const char *home = sp_test_env("SPACE_HOME");
    snprintf(w1, sizeof(w1), "%s", sp_test_env("SPACE_ID"));
    snprintf(w2, sizeof(w2), "%.60s-w2", w1);
    snprintf(w1_dir, sizeof(w1_dir), "%s/worker", home);
    snprintf(w2_dir, sizeof(w2_dir), "%s/worker2", home);
    db = sp_test_db();
    bus = sp_test_bus();
    /* The second worker is an identity of its own, worker-<w2>: credentials, a line in
     * nats.conf (reloaded) and its durable, as on a host added to a deployment. */
    char add[128];
    snprintf(add, sizeof(add), "identity add worker %s >/dev/null", w2);
    assert_int_equal(sp_test_space(add), 0);
    w2_pid = w2_spawn(NULL);
    wait_live(w1, true);
    wait_live(w2, true);
    return 0;
}

/* The second worker is stopped and releases everything it holds (its sandboxes, its volume),
 * so `space down --purge` can remove the stack's directory. */
static int teardown(void **state)
{
    w2_stop();
    pid_t pid = w2_spawn("--teardown");
    int status = 0;
    waitpid(pid, &status, 0);
    sp_bus_free(bus);
    PQfinish(db);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ---- helpers ---- */

static char *worker_of(const char *id)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT coalesce(worker, '') FROM sandboxes WHERE id = '%s'", id);
    PGresult *r = PQexec(db, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 1);
    char *w = sp_xstrdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return w;
}

static void start_counter(const char *id)
{
    sp_test_start_counter(port, key, id);
}

static long count(const char *id)
{
    return sp_test_counter(port, key, id);
}

static void assert_intact(const char *id, long before)
{
    long after = count(id);
    print_message("counter: %ld before the suspend, %ld after the resume\n", before, after);
    assert_true(after >= before && after < before + 8);
    sp_test_cmd_t r = sp_test_run(port, key, id, "{\"cmd\":\"cat /root/file\"}");
    assert_string_equal(r.stdout_s, "kept\n");
    sp_test_cmd_free(&r);
}

/* The store keys of the sandbox's newest snapshot, from the SandboxSuspended in the log. */
static void snapshot_keys(const char *id, char keys[2][256])
{
    static const char *names[2] = {"checkpoint.img.zst", "rootfs.btrfs.zst"};
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT substring(encode(payload, 'escape') from '%s/([a-z0-9_]+)/checkpoint') "
             "FROM events WHERE aggregate_id = '%s' AND type = 'SandboxSuspended' "
             "ORDER BY stream_seq DESC LIMIT 1",
             id, id);
    PGresult *r = PQexec(db, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 1);
    for (int i = 0; i < 2; i++)
        snprintf(keys[i], 256, "%s/%s/%s", id, PQgetvalue(r, 0, 0), names[i]);
    PQclear(r);
}

static bool in_cache(const char *state_dir_snapshots, const char *id)
{
    char path[768];
    snprintf(path, sizeof(path), "%s/%s", state_dir_snapshots, id);
    return access(path, F_OK) == 0;
}

/* The stack passes the worker its snapshot directory (SPACE_HOME/snapshots); the second
 * worker keeps the default, <state-dir>/snapshots. */
static const char *cache_of(const char *worker)
{
    static char c1[600], c2[600];
    snprintf(c1, sizeof(c1), "%s/snapshots", sp_test_env("SPACE_HOME"));
    snprintf(c2, sizeof(c2), "%s/snapshots", w2_dir);
    return strcmp(worker, w2) == 0 ? c2 : c1;
}

/* ---- scenarios ---- */

static void test_resume_on_another_worker(void **state)
{
    char sbx[64], st[64], keys[2][256], sql[512];
    sp_test_create_sandbox(port, key, "tiny", sbx);
    start_counter(sbx);
    char *origin = worker_of(sbx);
    const char *other = strcmp(origin, w1) == 0 ? w2 : w1;
    const char *origin_dir = strcmp(origin, w1) == 0 ? w1_dir : w2_dir;
    print_message("sandbox %s on %s; resuming on %s\n", sbx, origin, other);

    long before = count(sbx);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "suspend", NULL, st, sizeof(st)), 200);
    for (int i = 0; i < 100 && sp_test_sandbox_held(origin_dir, sbx); i++)
        usleep(50 * 1000);
    assert_false(sp_test_sandbox_held(origin_dir, sbx));
    /* The record names the store and the worker with the cache; the bucket has both. */
    assert_int_equal(sp_test_events(db, sbx, "SandboxSuspended", "nats:" BUCKET), 1);
    assert_int_equal(sp_test_events(db, sbx, "SandboxSuspended", origin), 1);
    snapshot_keys(sbx, keys);
    sp_obj_info_t info;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(sp_obj_stat(bus, BUCKET, keys[i], &info), 0);
        print_message("%s: %llu bytes in the bucket\n", keys[i], (unsigned long long)info.size);
    }
    assert_true(in_cache(cache_of(origin), sbx));

    stop_worker(origin); /* the host is gone */
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "resume", NULL, st, sizeof(st)), 200);
    assert_string_equal(st, "running");
    char *now = worker_of(sbx);
    assert_string_equal(now, other);
    free(now);
    assert_intact(sbx, before);
    assert_int_equal(sp_test_events(db, sbx, "SandboxResumed", other), 1);
    /* The snapshot served: gone from the bucket and from the resuming worker's cache. */
    for (int i = 0; i < 2; i++)
        assert_int_equal(sp_obj_stat(bus, BUCKET, keys[i], NULL), SP_ENOTFOUND);
    assert_false(in_cache(cache_of(other), sbx));

    /* The first host comes back: its stale copy is swept at start. */
    start_worker(origin);
    assert_false(in_cache(cache_of(origin), sbx));
    free(origin);
    sp_test_http_resp_t r;
    snprintf(sql, sizeof(sql), "/v1/sandboxes/%s", sbx);
    sp_test_http(port, "DELETE", sql, key, NULL, NULL, 0, &r);
    assert_true(r.status < 300);
    sp_test_http_free(&r);
}

/* Both up: the resume goes where the snapshot is cached, though placement by load would
 * choose the other. */
static void test_resume_prefers_the_cache(void **state)
{
    char sbx[64], st[64], fill[8][64];
    size_t n_fill = 0;
    /* A sandbox on the second worker (placement takes the least loaded, ties by id). */
    for (;;) {
        assert_true(n_fill < 8);
        sp_test_create_sandbox(port, key, "tiny", sbx);
        char *w = worker_of(sbx);
        bool on_w2 = strcmp(w, w2) == 0;
        free(w);
        if (on_w2)
            break;
        snprintf(fill[n_fill++], 64, "%s", sbx);
    }
    start_counter(sbx);
    /* The first worker's fillers go again. */
    for (size_t i = 0; i < n_fill; i++) {
        sp_test_http_resp_t r;
        char path[128];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", fill[i]);
        sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
        assert_true(r.status < 300);
        sp_test_http_free(&r);
    }
    sleep(3); /* heartbeats carry the new loads */
    long before = count(sbx);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "suspend", NULL, st, sizeof(st)), 200);
    char sql[256];
    long long load[2];
    for (int i = 0; i < 2; i++) {
        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM sandboxes WHERE worker = '%s' AND state = 'running'",
                 i ? w2 : w1);
        load[i] = sp_test_db_scalar(db, sql);
    }
    print_message("running at the resume: %lld on %s, %lld on %s\n", load[0], w1, load[1], w2);
    /* Placement alone would take the first: least loaded, or tied and first by id. */
    assert_true(load[0] <= load[1] && strcmp(w1, w2) < 0);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "resume", NULL, st, sizeof(st)), 200);
    char *w = worker_of(sbx);
    assert_string_equal(w, w2);
    free(w);
    assert_intact(sbx, before);
}

/* The bucket's object replaced by other bytes: refused against the log's digest, kept. */
static void test_store_that_lies(void **state)
{
    char sbx[64], st[64], keys[2][256], sql[512];
    sp_test_create_sandbox(port, key, "tiny", sbx);
    start_counter(sbx);
    char *origin = worker_of(sbx);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "suspend", NULL, st, sizeof(st)), 200);
    snapshot_keys(sbx, keys);
    /* The true bytes kept aside, other bytes stored under the key (as a consistent object,
     * so only the event log's digest can tell), and the cache emptied so the worker must
     * fetch. */
    int good = memfd_create("good", MFD_CLOEXEC), bad = memfd_create("bad", MFD_CLOEXEC);
    assert_int_equal(sp_obj_get(bus, BUCKET, keys[1], UINT64_MAX, good, NULL), 0);
    assert_int_equal(write(bad, "not the rootfs", 14), 14);
    lseek(bad, 0, SEEK_SET);
    assert_int_equal(sp_obj_put(bus, BUCKET, keys[1], bad, NULL), 0);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s/%s'", cache_of(origin), sbx);
    assert_int_equal(system(cmd), 0); /* NOLINT(cert-env33-c) */

    assert_int_equal(sp_test_lifecycle(port, key, sbx, "resume", NULL, st, sizeof(st)), 500);
    assert_string_equal(st, "digest_mismatch");
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = 'suspended'", sbx);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    assert_int_equal(sp_test_events(db, sbx, "SandboxResumeFailed", "rootfs.btrfs.zst"), 1);
    assert_int_equal(sp_obj_stat(bus, BUCKET, keys[0], NULL), 0); /* kept */

    lseek(good, 0, SEEK_SET);
    assert_int_equal(sp_obj_put(bus, BUCKET, keys[1], good, NULL), 0);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "resume", NULL, st, sizeof(st)), 200);
    sp_test_cmd_t r = sp_test_run(port, key, sbx, "{\"cmd\":\"cat /root/file\"}");
    assert_string_equal(r.stdout_s, "kept\n");
    sp_test_cmd_free(&r);
    close(good);
    close(bad);
    free(origin);
}

/* A sandbox deleted while suspended: its objects leave the bucket at the next sweep (every
 * 2 s here: SPACE_SNAPSHOT_SWEEP_S). */
static void test_deleted_while_suspended(void **state)
{
    char sbx[64], st[64], keys[2][256], path[128];
    sp_test_create_sandbox(port, key, "tiny", sbx);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "suspend", NULL, st, sizeof(st)), 200);
    snapshot_keys(sbx, keys);
    assert_int_equal(sp_obj_stat(bus, BUCKET, keys[0], NULL), 0);
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
    assert_true(r.status < 300);
    sp_test_http_free(&r);
    for (int k = 0; k < 2; k++) {
        int rc = 0;
        for (int i = 0; i < 100 && (rc = sp_obj_stat(bus, BUCKET, keys[k], NULL)) == 0; i++)
            usleep(100 * 1000);
        assert_int_equal(rc, SP_ENOTFOUND);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_on_another_worker),
        cmocka_unit_test(test_resume_prefers_the_cache),
        cmocka_unit_test(test_store_that_lies),
        cmocka_unit_test(test_deleted_while_suspended),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
