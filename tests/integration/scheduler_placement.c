/* The scheduler places each create intent exactly once, on a live worker that has the
 * template, spreading a burst over workers; refuses what cannot be placed with a reason; two
 * schedulers share the work; a scheduler killed mid-stream leaves nothing unplaced or doubly
 * placed after its restart. Workers are played by heartbeats on the bus. */
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

static void heartbeat(const char *worker, const char *const *tmpl, size_t n)
{
    sp_eventgen_msg_t m;
    assert_int_equal(sp_eventgen_heartbeat(worker, tmpl, n, 0, 60000, &m), 0);
    assert_int_equal(sp_test_sign(m.subject, &m.data, &m.len), 0);
    assert_int_equal(sp_bus_publish(bus, m.subject, m.data, m.len, m.event_id, NULL, NULL), 0);
    sp_eventgen_msg_dispose(&m);
}

static void create(const char *sbx, const char *tmpl)
{
    sp_eventgen_msg_t m;
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                         "t1", sbx, NULL, &m),
                     0);
    /* eventgen's creates ask for "tiny"; re-encode for another template. */
    if (strcmp(tmpl, "tiny") != 0) {
        sp_envelope_t *e = NULL;
        char reason[SP_REASON_MAX];
        assert_int_equal(sp_envelope_decode(m.data, m.len, &e, reason), 0);
        char *old = e->sandbox_create_requested->template_;
        e->sandbox_create_requested->template_ = (char *)tmpl;
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
    char out[4096];
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 0);
    PQfinish(db);
    sp_bus_free(bus);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_placement)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
