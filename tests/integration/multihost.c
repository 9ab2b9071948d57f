/* Suspend on one worker, resume on another: two worker hosts, each in a network namespace of
 * its own with its own state directory, btrfs volume, runsc root, firewall table and snapshot
 * cache (tests/harness/host.h), sharing only NATS, PostgreSQL and the snapshot store, which
 * here is the NATS object store (--snapshot-store nats). The stack runs no worker of its own.
 *
 *   - a sandbox counting in memory and holding a file is suspended on its host, that host's
 *     worker is stopped (a host gone), and the resume lands on the other host, which fetches
 *     the artifacts from the bucket: the counter goes on, the file is there, the bucket and
 *     both caches are empty afterwards (the stopped worker sweeps its stale copy when it
 *     returns);
 *   - with both hosts up, a resume goes back to the host that has the snapshot cached,
 *     although the other one is less loaded;
 *   - an artifact replaced in the bucket by other bytes (the store lies) fails the resume with
 *     digest_mismatch, keeps the snapshot, and once the bytes are right again it resumes. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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

#include "db.h"
#include "envelope.h"
#include "error.h"
#include "harness.h"
#include "host.h"
#include "objstore.h"
#include "xmalloc.h"

#define BUCKET "space-snapshots"

static int port;
static const char *key;
static sp_test_host_t *hosts[2];
static const char *w1, *w2; /* their workers' ids */
static PGconn *db;
static sp_bus_t *bus;

static sp_test_host_t *host_of(const char *id)
{
    return strcmp(id, w2) == 0 ? hosts[1] : hosts[0];
}

/* A host gone (its worker stopped cleanly, as on a machine shut down) and back. */
static void stop_worker(const char *id)
{
    sp_test_host_stop(host_of(id));
    sp_test_host_wait_live(host_of(id), false);
}

static void start_worker(const char *id)
{
    sp_test_host_back(host_of(id));
}

static int setup(void **state)
{
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    db = sp_test_db();
    bus = sp_test_bus();
    static const char *const args[] = {"--snapshot-store", "nats", "--snapshot-sweep-s", "2", NULL};
    for (int i = 0; i < 2; i++)
        hosts[i] = sp_test_host_start(i + 1, args);
    w1 = sp_test_host_id(hosts[0]);
    w2 = sp_test_host_id(hosts[1]);
    return 0;
}

/* The hosts release everything they hold (their sandboxes, their volumes) and leave nothing
 * of their own behind, so `space down --purge` can remove the stack's directory. */
static int teardown(void **state)
{
    int rc = 0;
    for (int i = 0; i < 2; i++)
        rc |= sp_test_host_free(hosts[i]);
    sp_bus_free(bus);
    PQfinish(db);
    return rc;
}

/* Each test begins with both hosts up, whatever the one before left. */
static int both_up(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++)
        sp_test_host_up(hosts[i]);
    return 0;
}

/* ---- helpers ---- */

static void start_counter(const char *id)
{
    sp_test_start_counter(port, key, id);
}

static void assert_intact(const char *id, const sp_test_stop_t *stop)
{
    sp_test_stop_check(stop, port, key, id);
    sp_test_cmd_t r = sp_test_run(port, key, id, "{\"cmd\":\"cat /root/file\"}");
    assert_string_equal(r.stdout_s, "kept\n");
    sp_test_cmd_free(&r);
}

static bool in_cache(const char *state_dir_snapshots, const char *id)
{
    char path[768];
    snprintf(path, sizeof(path), "%s/%s", state_dir_snapshots, id);
    return access(path, F_OK) == 0;
}

static const char *cache_of(const char *worker)
{
    return sp_test_host_cache(host_of(worker));
}

/* ---- scenarios ---- */

static void test_resume_on_another_worker(void **state)
{
    char sbx[64], st[64], keys[2][256], sql[512];
    sp_test_create_sandbox(port, key, "tiny", sbx);
    start_counter(sbx);
    char *origin = sp_test_worker_of(db, sbx);
    const char *other = strcmp(origin, w1) == 0 ? w2 : w1;
    const char *origin_dir = sp_test_host_dir(host_of(origin));
    print_message("sandbox %s on %s; resuming on %s\n", sbx, origin, other);

    sp_test_stop_t stop;
    sp_test_stop_begin(&stop, port, key, sbx);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "suspend", NULL, st, sizeof(st)), 200);
    sp_test_stop_held(&stop);
    for (int i = 0; i < 100 && sp_test_sandbox_held(origin_dir, sbx); i++)
        usleep(50 * 1000);
    assert_false(sp_test_sandbox_held(origin_dir, sbx));
    /* The record names the store and the worker with the cache; the bucket has both. */
    assert_int_equal(sp_test_events(db, sbx, "SandboxSuspended", "nats:" BUCKET), 1);
    assert_int_equal(sp_test_events(db, sbx, "SandboxSuspended", origin), 1);
    sp_test_snapshot_keys(db, sbx, keys);
    sp_obj_info_t info;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(sp_obj_stat(bus, BUCKET, keys[i], &info), 0);
        print_message("%s: %llu bytes in the bucket\n", keys[i], (unsigned long long)info.size);
    }
    assert_true(in_cache(cache_of(origin), sbx));
    assert_int_equal(sp_test_kept_disks(origin_dir, sbx), 1);

    stop_worker(origin); /* the host is gone */
    sp_test_stop_ending(&stop);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "resume", NULL, st, sizeof(st)), 200);
    assert_string_equal(st, "running");
    char *now = sp_test_worker_of(db, sbx);
    assert_string_equal(now, other);
    free(now);
    assert_intact(sbx, &stop);
    assert_int_equal(sp_test_events(db, sbx, "SandboxResumed", other), 1);
    /* The snapshot served: gone from the bucket and from the resuming worker's cache. */
    for (int i = 0; i < 2; i++)
        assert_int_equal(sp_obj_stat(bus, BUCKET, keys[i], NULL), SP_ENOTFOUND);
    assert_false(in_cache(cache_of(other), sbx));

    /* The first host comes back: its stale copy is swept at start, and the disk it kept for
     * a resume there too (the sandbox runs elsewhere). */
    start_worker(origin);
    assert_false(in_cache(cache_of(origin), sbx));
    assert_int_equal(sp_test_kept_disks(origin_dir, sbx), 0);
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
        char *w = sp_test_worker_of(db, sbx);
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
    sp_test_stop_t stop;
    sp_test_stop_begin(&stop, port, key, sbx);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "suspend", NULL, st, sizeof(st)), 200);
    sp_test_stop_held(&stop);
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
    sp_test_stop_ending(&stop);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "resume", NULL, st, sizeof(st)), 200);
    char *w = sp_test_worker_of(db, sbx);
    assert_string_equal(w, w2);
    free(w);
    assert_intact(sbx, &stop);
}

/* The bucket's object replaced by other bytes: refused against the log's digest, kept. */
static void test_store_that_lies(void **state)
{
    char sbx[64], st[64], keys[2][256], sql[512];
    sp_test_create_sandbox(port, key, "tiny", sbx);
    start_counter(sbx);
    char *origin = sp_test_worker_of(db, sbx);
    assert_int_equal(sp_test_lifecycle(port, key, sbx, "suspend", NULL, st, sizeof(st)), 200);
    sp_test_snapshot_keys(db, sbx, keys);
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
    sp_test_snapshot_keys(db, sbx, keys);
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

/* A named snapshot whose host is gone (its worker stopped): the delete goes to the live host,
 * which removes the artifacts from the shared bucket, and the log accepts that worker's
 * SnapshotDeleted (before: 504, the taker's alone was accepted and it was away); the taker,
 * back, sweeps its own copy. */
static void test_snapshot_of_a_gone_host(void **state)
{
    (void)state;
    char sbx[64], path[160], snap[64] = "";
    sp_test_create_sandbox(port, key, "tiny", sbx);
    char *taker = sp_test_worker_of(db, sbx);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/snapshots", sbx);
    sp_test_http_resp_t r;
    sp_test_http(port, "POST", path, key, "Content-Type: application/json\r\n",
                 "{\"name\":\"gone-host\"}", strlen("{\"name\":\"gone-host\"}"), &r);
    assert_int_equal(r.status, 201);
    const char *p = strstr(r.body, "\"snapshot_id\":\"");
    assert_non_null(p);
    snprintf(snap, sizeof(snap), "%.30s", p + strlen("\"snapshot_id\":\""));
    sp_test_http_free(&r);
    print_message("snapshot %s of %s taken by %s\n", snap, sbx, taker);
    sp_envelope_t *se = NULL;
    assert_int_equal(sp_db_snapshot_find(db, "default", snap, &se), 0);
    const Space__V1__SandboxSnapshotted *sd = se->sandbox_snapshotted;
    assert_int_equal(sd->n_artifacts, 2);
    for (size_t k = 0; k < sd->n_artifacts; k++)
        assert_int_equal(sp_obj_stat(bus, BUCKET, sd->artifacts[k]->store_key, NULL), 0);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
    assert_true(r.status < 300);
    sp_test_http_free(&r);

    stop_worker(taker);
    snprintf(path, sizeof(path), "/v1/snapshots/%s", snap);
    sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
    print_message("DELETE %s with its host gone: %d %s\n", path, r.status, r.body ? r.body : "");
    assert_int_equal(r.status, 204);
    sp_test_http_free(&r);
    for (size_t k = 0; k < sd->n_artifacts; k++)
        assert_int_equal(sp_obj_stat(bus, BUCKET, sd->artifacts[k]->store_key, NULL), SP_ENOTFOUND);
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE type = 'SnapshotDeleted' AND status = "
             "'accepted' AND aggregate_id = '%s' AND subject NOT LIKE 'space.ev.sbx.%s.%%'",
             sbx, taker);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    /* Gone from the list; a create from it is refused. */
    sp_test_http(port, "GET", "/v1/snapshots", key, NULL, NULL, 0, &r);
    assert_null(strstr(r.body, snap));
    sp_test_http_free(&r);
    sp_envelope_free(se);
    /* The taker back: its own copy goes at its first sweep (every 2 s here). */
    char named[160];
    snprintf(named, sizeof(named), "named/%s", snap);
    assert_true(in_cache(cache_of(taker), named));
    start_worker(taker);
    bool gone = false;
    for (int i = 0; i < 150 && !gone; i++) {
        gone = !in_cache(cache_of(taker), named);
        if (!gone)
            usleep(100 * 1000);
    }
    assert_true(gone);
    free(taker);
}

/* The sandboxes a host's worker log says it started, in order: the n-th (from 0) into id. */
static bool started_nth(const sp_test_host_t *h, size_t n, char id[64])
{
    FILE *f = fopen(sp_test_host_log(h), "r");
    char line[2048];
    size_t seen = 0;
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "msg=started sandbox=");
        if (p && seen++ == n) {
            p += strlen("msg=started sandbox=");
            size_t len = strcspn(p, " \n");
            snprintf(id, 64, "%.*s", (int)(len < 63 ? len : 63), p);
            found = true;
        }
    }
    if (f)
        fclose(f);
    return found;
}

static size_t started_count(const sp_test_host_t *h)
{
    char id[64];
    size_t n = 0;
    while (started_nth(h, n, id))
        n++;
    return n;
}

static void *create_in_background(void *arg)
{
    (void)arg;
    static const char body[] = "{\"template\":\"tiny\"}";
    sp_test_http_resp_t r;
    if (sp_test_http(port, "POST", "/v1/sandboxes", key, "Content-Type: application/json\r\n", body,
                     strlen(body), &r) == 0)
        sp_test_http_free(&r);
    return NULL;
}

static void *continue_later(void *arg)
{
    sleep(3);
    kill(*(pid_t *)arg, SIGCONT);
    return NULL;
}

/* A sandbox started while the event log was behind, and its host gone before the log stored
 * its SandboxStarted: the returning worker waits for the log to hold what the stream held
 * before it reconciles, finds the sandbox its own and gone, and records it lost. (Reconciled
 * against the stale log, it did not: the log said the sandbox ran on a host that did not have
 * it; integration.cluster found it.) */
static void test_started_while_the_log_is_behind(void **state)
{
    (void)state;
    size_t before[2] = {started_count(hosts[0]), started_count(hosts[1])};
    pid_t el = sp_test_daemon_pid("space-eventlog");
    assert_true(el > 0);
    assert_int_equal(kill(el, SIGSTOP), 0);
    pthread_t create, resume;
    assert_int_equal(pthread_create(&create, NULL, create_in_background, NULL), 0);
    char sbx[64] = "";
    int k = -1;
    for (int i = 0; i < 300 && k < 0; i++) {
        for (int j = 0; j < 2 && k < 0; j++)
            if (started_nth(hosts[j], before[j], sbx))
                k = j;
        if (k < 0)
            usleep(100 * 1000);
    }
    if (k < 0)
        kill(el, SIGCONT);
    assert_true(k >= 0);
    print_message("%s started on %s with the event log stopped; that host goes\n", sbx,
                  sp_test_host_id(hosts[k]));
    sp_test_host_gone(hosts[k]);
    /* The log goes on 3 s after the host is back (which waits for its first heartbeat). */
    assert_int_equal(pthread_create(&resume, NULL, continue_later, &el), 0);
    sp_test_host_back(hosts[k]);
    pthread_join(resume, NULL);
    pthread_join(create, NULL);

    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = 'failed' AND "
             "failure_reason = 'lost'",
             sbx);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 1, 30000), 1);
    assert_false(sp_test_sandbox_held(sp_test_host_dir(hosts[k]), sbx));
    char log[256];
    snprintf(log, sizeof(log), "grep -c 'waited for the log to store the stream' '%s'",
             sp_test_host_log(hosts[k]));
    assert_int_equal(sp_test_sh("%s >/dev/null", log), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_resume_on_another_worker, both_up),
        cmocka_unit_test_setup(test_resume_prefers_the_cache, both_up),
        cmocka_unit_test_setup(test_store_that_lies, both_up),
        cmocka_unit_test_setup(test_deleted_while_suspended, both_up),
        cmocka_unit_test_setup(test_snapshot_of_a_gone_host, both_up),
        cmocka_unit_test_setup(test_started_while_the_log_is_behind, both_up),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
