/* The event log stores every event exactly once, in stream order, hash-chained, even when
 * publishers retry and the eventlog is SIGKILLed mid-batch; space-replay verify then holds,
 * and detects a row altered by hand.
 *
 * 2,000 sandboxes x 5 lifecycle events = 10,000 distinct events. Of them, 500 are published a
 * second time with the same Nats-Msg-Id (the stream's duplicate window drops them) and 300 a
 * second time under a different msg id (they reach the stream twice; the eventlog must store
 * them once). The eventlog is killed with SIGKILL while it is consuming and restarted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eventgen.h"
#include "harness.h"
#include "ids.h"
#include "xmalloc.h"

#define SANDBOXES 2000
#define N         (SANDBOXES * 5)

static sp_eventgen_msg_t *msgs;

static void publish_all(sp_bus_t *bus, PGconn *db)
{
    int killed = 0;
    for (int i = 0; i < N; i++) {
        sp_eventgen_msg_t *m = &msgs[i];
        assert_int_equal(sp_bus_publish_async(bus, m->subject, m->data, m->len, m->event_id), 0);
        /* A retried publish (same msg id): the duplicate window drops it. */
        if (i % 20 == 7)
            assert_int_equal(sp_bus_publish_async(bus, m->subject, m->data, m->len, m->event_id),
                             0);
        /* A publisher that lost its msg id: the same event reaches the stream twice. */
        if (i % 33 == 5 && i / 33 < 300) {
            char other[64];
            snprintf(other, sizeof(other), "retry-%s", m->event_id);
            assert_int_equal(sp_bus_publish_async(bus, m->subject, m->data, m->len, other), 0);
        }
        if (i % 1000 == 999)
            assert_int_equal(sp_bus_publish_async_complete(bus, 30000), 0);
        /* Kill the eventlog once it is busy storing (some rows are in, more are coming). */
        if (!killed && i >= 6000) {
            long long stored = sp_test_db_wait_scalar(db, "SELECT count(*) FROM events", -2, 0);
            if (stored > 0) {
                sp_test_daemon_kill9("space-eventlog");
                killed = 1;
                print_message("killed space-eventlog with %lld rows stored, %d published\n", stored,
                              i + 1);
            }
        }
    }
    assert_int_equal(sp_bus_publish_async_complete(bus, 30000), 0);
    assert_true(killed);
}

static void test_exactly_once(void **state)
{
    sp_test_stack_load();
    sp_bus_t *bus = sp_test_bus();
    PGconn *db = sp_test_db();

    msgs = sp_xcalloc(N, sizeof(*msgs));
    for (int s = 0; s < SANDBOXES; s++) {
        char sbx[32];
        snprintf(sbx, sizeof(sbx), "sbx_it%05d", s);
        for (int k = 0; k < 5; k++)
            assert_int_equal(sp_eventgen_sandbox(sp_eventgen_lifecycle[k], "tenant-a", sbx, "w1",
                                                 &msgs[s * 5 + k]),
                             0);
    }
    /* Interleave lifecycles the way many concurrent sandboxes would: event k of every sandbox
     * comes before event k+1 of any. Ids were generated per sandbox, so reorder by k. */
    /* Each signed by the daemon that would emit it (gateway, scheduler, worker-w1). */
    for (int i = 0; i < N; i++)
        assert_int_equal(sp_test_sign(msgs[i].subject, &msgs[i].data, &msgs[i].len), 0);
    sp_eventgen_msg_t *ordered = sp_xcalloc(N, sizeof(*ordered));
    for (int k = 0, j = 0; k < 5; k++)
        for (int s = 0; s < SANDBOXES; s++)
            ordered[j++] = msgs[s * 5 + k];
    free(msgs);
    msgs = ordered;

    assert_true(sp_test_daemon_pid("space-eventlog") > 0);
    publish_all(bus, db);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    assert_true(sp_test_daemon_pid("space-eventlog") > 0);

    uint64_t last_seq = 0, stream_msgs = 0;
    assert_int_equal(sp_bus_stream_info(bus, &last_seq, &stream_msgs), 0);
    /* 10,000 + 300 second copies under other msg ids; the 500 same-id retries were dropped. */
    assert_int_equal(stream_msgs, N + 300);

    long long got = sp_test_db_wait_scalar(
        db, "SELECT count(*) FROM events WHERE status = 'accepted'", N, 60000);
    assert_int_equal(got, N);
    /* The 300 second copies are signed replays of accepted events: each stored, rejected as
     * such, changing nothing (docs/trust.md). */
    assert_int_equal(sp_test_db_wait_scalar(db, "SELECT count(*) FROM events", N + 300, 60000),
                     N + 300);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE status = "
                                           "'rejected' AND reject_reason LIKE 'replayed%'"),
                     300);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(DISTINCT event_id) FROM events"), N);

    /* Stream order: accepted rows by stream_seq carry the event ids in publish order. */
    PGresult *r = PQexec(db, "SELECT event_id::text FROM events WHERE status = 'accepted' "
                             "ORDER BY stream_seq");
    assert_int_equal(PQntuples(r), N);
    for (int i = 0; i < N; i++)
        if (strcmp(PQgetvalue(r, i, 0), msgs[i].event_id) != 0)
            fail_msg("row %d holds %s, expected %s", i, PQgetvalue(r, i, 0), msgs[i].event_id);
    PQclear(r);

    /* Projections were maintained in the same transactions: every sandbox went through its
     * five events exactly once. */
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM sandboxes WHERE state = "
                                           "'deleted' AND version = 5 AND worker = 'w1'"),
                     SANDBOXES);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM sandboxes"), SANDBOXES);

    char out[8192];
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "chain intact: 10300 events"));

    /* Alter a column by hand: verify names the row. */
    long long mid = sp_test_db_scalar(db, "SELECT stream_seq FROM events ORDER BY stream_seq "
                                          "OFFSET 4321 LIMIT 1");
    char sql[256], want[64];
    snprintf(sql, sizeof(sql), "UPDATE events SET tenant = 'tenant-b' WHERE stream_seq = %lld",
             mid);
    PQclear(PQexec(db, sql));
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 2);
    snprintf(want, sizeof(want), "BROKEN at stream_seq %lld ", mid);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "tenant"));
    snprintf(sql, sizeof(sql), "UPDATE events SET tenant = 'tenant-a' WHERE stream_seq = %lld",
             mid);
    PQclear(PQexec(db, sql));
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 0);

    /* Rewrite one payload byte: the hash no longer matches. */
    snprintf(sql, sizeof(sql),
             "UPDATE events SET payload = set_byte(payload, 20, get_byte(payload, 20) # 1) "
             "WHERE stream_seq = %lld",
             mid);
    PQclear(PQexec(db, sql));
    assert_int_equal(sp_test_replay("--json verify", out, sizeof(out)), 2);
    snprintf(want, sizeof(want), "\"broken_seq\":%lld", mid);
    assert_non_null(strstr(out, want));

    /* Delete a row: the next row's prev_hash no longer links. */
    snprintf(sql, sizeof(sql),
             "UPDATE events SET payload = set_byte(payload, 20, get_byte(payload, 20) # 1) "
             "WHERE stream_seq = %lld",
             mid);
    PQclear(PQexec(db, sql));
    PQclear(PQexec(db, "DELETE FROM events WHERE stream_seq = (SELECT stream_seq FROM events "
                       "ORDER BY stream_seq OFFSET 100 LIMIT 1)"));
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "prev_hash"));

    /* The timeline of one sandbox tells its story. */
    assert_int_equal(sp_test_replay("timeline --sandbox sbx_it00042", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "SandboxCreateRequested"));
    assert_non_null(strstr(out, "state=deleted"));

    for (int i = 0; i < N; i++)
        sp_eventgen_msg_dispose(&msgs[i]);
    free(msgs);
    PQfinish(db);
    sp_bus_free(bus);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_exactly_once)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
