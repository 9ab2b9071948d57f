/* The scheduler places each create intent exactly once, on a live worker that has the
 * template, spreading a burst over workers; refuses what cannot be placed with a reason; two
 * schedulers share the work; a scheduler killed mid-stream leaves nothing unplaced or doubly
 * placed after its restart; a worker without the create's disk_mb free beside its reserve is
 * skipped. Workers are played by heartbeats on the bus. */
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

#include "eventgen.h"
#include "harness.h"

static sp_bus_t *bus;
static PGconn *db;

typedef struct {
    uint64_t total, free_mb, reserve;
    uint32_t dflt;
} disk_t;

/* A heartbeat, with the volume's numbers when disk is not NULL. */
static void heartbeat_disk(const char *worker, const char *const *tmpl, size_t n,
                           const disk_t *disk)
{
    sp_eventgen_msg_t m;
    assert_int_equal(sp_eventgen_heartbeat(worker, tmpl, n, 0, 60000, &m), 0);
    if (disk) {
        sp_envelope_t *e = NULL;
        char reason[SP_REASON_MAX];
        assert_int_equal(sp_envelope_decode(m.data, m.len, &e, reason), 0);
        e->worker_heartbeat->disk_mb_total = disk->total;
        e->worker_heartbeat->disk_mb_free = disk->free_mb;
        e->worker_heartbeat->disk_mb_reserve = disk->reserve;
        e->worker_heartbeat->disk_mb_default = disk->dflt;
        sp_eventgen_msg_dispose(&m);
        assert_int_equal(sp_envelope_encode(e, &m.data, &m.len), 0);
        sp_envelope_free(e);
    }
    assert_int_equal(sp_test_sign(m.subject, &m.data, &m.len), 0);
    assert_int_equal(sp_bus_publish(bus, m.subject, m.data, m.len, m.event_id, NULL, NULL), 0);
    sp_eventgen_msg_dispose(&m);
}

/* A heartbeat of worker with running sandboxes and `ready` warm-pool sandboxes of tiny
 * (docs/pools.md): eventgen's, re-encoded with its pool level. */
static void heartbeat_pool(const char *worker, uint32_t running, uint32_t ready)
{
    const char *tiny[] = {"tiny"};
    sp_eventgen_msg_t m;
    assert_int_equal(sp_eventgen_heartbeat(worker, tiny, 1, running, 60000, &m), 0);
    sp_envelope_t *e = NULL;
    char reason[SP_REASON_MAX];
    assert_int_equal(sp_envelope_decode(m.data, m.len, &e, reason), 0);
    Space__V1__PoolLevel lv = SPACE__V1__POOL_LEVEL__INIT, *lvp = &lv;
    lv.template_ = "tiny";
    lv.ready = ready;
    lv.size = 2;
    e->worker_heartbeat->pools = &lvp;
    e->worker_heartbeat->n_pools = 1;
    sp_eventgen_msg_dispose(&m);
    assert_int_equal(sp_envelope_encode(e, &m.data, &m.len), 0);
    snprintf(m.event_id, sizeof(m.event_id), "%s", e->event_id);
    e->worker_heartbeat->pools = NULL;
    e->worker_heartbeat->n_pools = 0;
    sp_envelope_free(e);
    assert_int_equal(sp_test_sign(m.subject, &m.data, &m.len), 0);
    assert_int_equal(sp_bus_publish(bus, m.subject, m.data, m.len, m.event_id, NULL, NULL), 0);
    sp_eventgen_msg_dispose(&m);
}

static void heartbeat(const char *worker, const char *const *tmpl, size_t n)
{
    heartbeat_disk(worker, tmpl, n, NULL);
}

/* A create of tmpl asking disk_mb (0: none). */
static void create_disk(const char *sbx, const char *tmpl, uint32_t disk_mb)
{
    sp_eventgen_msg_t m;
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                         "t1", sbx, NULL, &m),
                     0);
    /* eventgen's creates ask for "tiny" and no disk; re-encode for others. */
    if (strcmp(tmpl, "tiny") != 0 || disk_mb) {
        sp_envelope_t *e = NULL;
        char reason[SP_REASON_MAX];
        assert_int_equal(sp_envelope_decode(m.data, m.len, &e, reason), 0);
        char *old = e->sandbox_create_requested->template_;
        e->sandbox_create_requested->template_ = (char *)tmpl;
        if (e->sandbox_create_requested->resources)
            e->sandbox_create_requested->resources->disk_mb = disk_mb;
        sp_eventgen_msg_dispose(&m);
        assert_int_equal(sp_envelope_encode(e, &m.data, &m.len), 0);
        snprintf(m.event_id, sizeof(m.event_id), "%s", e->event_id);
        e->sandbox_create_requested->template_ = old;
        sp_envelope_free(e);
    }
    assert_int_equal(sp_test_sign(m.subject, &m.data, &m.len), 0);
    assert_int_equal(sp_bus_publish(bus, m.subject, m.data, m.len, m.event_id, NULL, NULL), 0);
    sp_eventgen_msg_dispose(&m);
}

static void create(const char *sbx, const char *tmpl)
{
    create_disk(sbx, tmpl, 0);
}

/* Whether sandbox sbx's projection row satisfies cond (SQL over its columns). */
static long long sbx_where(const char *sbx, const char *cond)
{
    char sql[512];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM sandboxes WHERE id = '%s' AND %s", sbx, cond);
    return sp_test_db_scalar(db, sql);
}

static void wait_state(const char *sbx, const char *state)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = '%s'",
             sbx, state);
    if (sp_test_db_wait_scalar(db, sql, 1, 20000) != 1)
        fail_msg("%s did not reach state %s", sbx, state);
}

static void test_placement(void **state)
{
    const char *tiny[] = {"tiny"}, *both[] = {"base", "tiny"};
    char sbx[32];

    sp_test_stack_load();
    bus = sp_test_bus();
    db = sp_test_db();
    assert_true(sp_test_daemon_pid("space-scheduler") > 0);

    /* No worker yet: refused for capacity. */
    create("sbx_early", "tiny");
    wait_state("sbx_early", "failed");
    assert_int_equal(sbx_where("sbx_early", "failure_reason = 'no_capacity'"), 1);

    heartbeat("w-a", tiny, 1);
    heartbeat("w-b", both, 2);
    assert_int_equal(
        sp_test_db_wait_scalar(db, "SELECT count(*) FROM workers WHERE state = 'up'", 2, 20000), 2);

    /* A burst of 10 spreads over both workers before their heartbeats catch up. */
    for (int i = 0; i < 10; i++) {
        snprintf(sbx, sizeof(sbx), "sbx_burst%02d", i);
        create(sbx, "tiny");
    }
    for (int i = 0; i < 10; i++) {
        snprintf(sbx, sizeof(sbx), "sbx_burst%02d", i);
        wait_state(sbx, "placed");
    }
    long long on_a = sp_test_db_scalar(
        db, "SELECT count(*) FROM sandboxes WHERE id LIKE 'sbx_burst%' AND worker = 'w-a'");
    assert_int_equal(on_a, 5);

    /* Only w-b has base; nobody has nope. */
    create("sbx_base", "base");
    wait_state("sbx_base", "placed");
    assert_int_equal(sbx_where("sbx_base", "worker = 'w-b'"), 1);
    create("sbx_nope", "nope");
    wait_state("sbx_nope", "failed");
    assert_int_equal(sbx_where("sbx_nope", "failure_reason = 'unknown_template'"), 1);

    /* Deleting a sandbox no worker owns: the scheduler answers. */
    sp_eventgen_msg_t del;
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED,
                                         "t1", "sbx_nope", NULL, &del),
                     0);
    assert_int_equal(sp_test_sign(del.subject, &del.data, &del.len), 0);
    assert_int_equal(sp_bus_publish(bus, del.subject, del.data, del.len, del.event_id, NULL, NULL),
                     0);
    sp_eventgen_msg_dispose(&del);
    wait_state("sbx_nope", "deleted");

    /* Two schedulers, then one of them killed while intents keep coming, then restarted:
     * every intent placed exactly once. */
    pid_t second = fork();
    if (second == 0) {
        char prog[4096];
        snprintf(prog, sizeof(prog), "%s/space-scheduler", sp_test_env("SPACE_BIN_DIR"));
        execl(prog, "space-scheduler", "--name", "scheduler-2", "--log-level", "warn", NULL);
        _exit(127);
    }
    for (int i = 0; i < 40; i++) {
        snprintf(sbx, sizeof(sbx), "sbx_pair%02d", i);
        create(sbx, "tiny");
        if (i == 20)
            sp_test_daemon_kill9("space-scheduler");
    }
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    for (int i = 0; i < 40; i++) {
        snprintf(sbx, sizeof(sbx), "sbx_pair%02d", i);
        wait_state(sbx, "placed");
    }
    kill(second, SIGTERM);
    int st = 0;
    waitpid(second, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* One accepted placement per intent, and no second placement even tried to get in. */
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE type = "
                                           "'SandboxPlaced' AND status = 'accepted' AND "
                                           "aggregate_id LIKE 'sbx_pair%'"),
                     40);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE type = "
                                           "'SandboxPlaced' AND status = 'rejected'"),
                     0);
    /* Warm pools: a busier worker whose heartbeat has two pooled sandboxes of tiny ready
     * takes the next two creates (claims), the idle one without a pool the third. */
    heartbeat_pool("w-a", 10, 2);
    heartbeat_pool("w-b", 0, 0);
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM workers WHERE (id = 'w-a' AND "
                                            "(pools ->> 'tiny')::int = 2 AND sandboxes_running = "
                                            "10) OR (id = 'w-b' AND sandboxes_running = 0)",
                                            2, 20000),
                     2);
    for (int i = 0; i < 3; i++) {
        snprintf(sbx, sizeof(sbx), "sbx_pool%d", i);
        create(sbx, "tiny");
        wait_state(sbx, "placed");
    }
    assert_int_equal(sbx_where("sbx_pool0", "worker = 'w-a'"), 1);
    assert_int_equal(sbx_where("sbx_pool1", "worker = 'w-a'"), 1);
    assert_int_equal(sbx_where("sbx_pool2", "worker = 'w-b'"), 1);
    char out[4096];
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 0);
    PQfinish(db);
    sp_bus_free(bus);
}

/* Disk: w-c has 1,500 MiB free and keeps 1,024, w-d 10,000 and 1,024; both default to 2,048.
 * Only template "disk" is theirs, so the workers above play no part. */
static void test_disk(void **state)
{
    (void)state;
    const char *disk[] = {"disk"};
    bus = sp_test_bus();
    db = sp_test_db();
    heartbeat_disk("w-c", disk, 1, &(disk_t){20480, 1500, 1024, 2048});
    heartbeat_disk("w-d", disk, 1, &(disk_t){20480, 10000, 1024, 2048});
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM workers WHERE id IN "
                                            "('w-c', 'w-d') AND disk_mb_total = 20480 AND "
                                            "disk_mb_reserve = 1024 AND disk_mb_default = 2048",
                                            2, 20000),
                     2);

    /* The default (2,048) fits on w-d only, whatever the load; so does 8,000 MiB. */
    create_disk("sbx_disk_default", "disk", 0);
    create_disk("sbx_disk_8000", "disk", 8000);
    wait_state("sbx_disk_default", "placed");
    wait_state("sbx_disk_8000", "placed");
    assert_int_equal(sbx_where("sbx_disk_default", "worker = 'w-d' AND disk_mb = 0"), 1);
    assert_int_equal(sbx_where("sbx_disk_8000", "worker = 'w-d' AND disk_mb = 8000"), 1);
    /* 100 MiB fits on both: the less loaded, w-c. */
    create_disk("sbx_disk_100", "disk", 100);
    wait_state("sbx_disk_100", "placed");
    assert_int_equal(sbx_where("sbx_disk_100", "worker = 'w-c'"), 1);
    /* 9,500 MiB fits nowhere: refused, and the refusal says why. */
    create_disk("sbx_disk_9500", "disk", 9500);
    wait_state("sbx_disk_9500", "failed");
    assert_int_equal(sbx_where("sbx_disk_9500", "failure_reason = 'no_capacity'"), 1);
    assert_int_equal(sp_test_events(db, "sbx_disk_9500", "SandboxRequestRejected",
                                    "9500 MiB of disk free for disk_mb beside its reserve"),
                     1);
    /* A worker that reports no disk (an older one) is not judged by it. */
    heartbeat_disk("w-e", (const char *[]){"disk-old"}, 1, NULL);
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM workers WHERE id = 'w-e' AND "
                                            "state = 'up' AND disk_mb_total = 0",
                                            1, 20000),
                     1);
    create_disk("sbx_disk_old", "disk-old", 9500);
    wait_state("sbx_disk_old", "placed");
    PQfinish(db);
    sp_bus_free(bus);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_placement),
                                       cmocka_unit_test(test_disk)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
