/* The scheduler answers a fetched batch of intents as one signed burst (scheduler/main.c,
 * docs/trust.md "Batch signatures"): a burst of creates is placed with SandboxPlaced facts
 * that share one batch signature, every one of them is accepted by the verifying event log,
 * a member edited after signing (its proof and signature kept) is stored rejected as a bad
 * signature and changes no projection, and a member sent again is stored rejected as a
 * replay. The scheduler is stopped while the creates are published, so that it fetches them
 * together. Its worker is played by a heartbeat. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eventgen.h"
#include "harness.h"

#define N_CREATES 12

static sp_bus_t *bus;
static PGconn *db;

static void publish_signed(sp_eventgen_msg_t *m)
{
    assert_int_equal(sp_test_sign(m->subject, &m->data, &m->len), 0);
    assert_int_equal(sp_bus_publish_async(bus, m->subject, m->data, m->len, m->event_id), 0);
}

static void test_burst_placed_and_forgery_refused(void **state)
{
    (void)state;
    const char *tiny[] = {"tiny"};
    char sbx[32];
    sp_eventgen_msg_t m;

    sp_test_stack_load();
    bus = sp_test_bus();
    db = sp_test_db();
    int pid = sp_test_daemon_pid("space-scheduler");
    assert_true(pid > 0);

    assert_int_equal(sp_eventgen_heartbeat("w-a", tiny, 1, 0, 60000, &m), 0);
    publish_signed(&m);
    sp_eventgen_msg_dispose(&m);
    assert_int_equal(sp_bus_publish_async_complete(bus, 10000), 0);
    assert_int_equal(
        sp_test_db_wait_scalar(db, "SELECT count(*) FROM workers WHERE state = 'up'", 1, 20000), 1);

    /* The creates wait in the stream while the scheduler is stopped: it fetches them as one
     * batch when it goes on. */
    assert_int_equal(kill(pid, SIGSTOP), 0);
    for (int i = 0; i < N_CREATES; i++) {
        snprintf(sbx, sizeof(sbx), "sbx_sb%02d", i);
        assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                             "t1", sbx, NULL, &m),
                         0);
        publish_signed(&m);
        sp_eventgen_msg_dispose(&m);
    }
    assert_int_equal(sp_bus_publish_async_complete(bus, 10000), 0);
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM events WHERE type = "
                                            "'SandboxCreateRequested' AND aggregate_id LIKE "
                                            "'sbx_sb%' AND status = 'accepted'",
                                            N_CREATES, 20000),
                     N_CREATES);
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM sandboxes WHERE id LIKE "
                                            "'sbx_sb%' AND state = 'placed' AND worker = 'w-a'",
                                            N_CREATES, 20000),
                     N_CREATES);

    /* Every placement accepted (the log verifies), signed by the scheduler; they share
     * batch signatures. */
    PGresult *r = PQexecParams(db,
                               "SELECT payload, subject, stream_seq::text, aggregate_id FROM "
                               "events WHERE type = 'SandboxPlaced' AND aggregate_id LIKE "
                               "'sbx_sb%' AND status = 'accepted' ORDER BY events.stream_seq",
                               0, NULL, NULL, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), N_CREATES);
    uint32_t largest = 0;
    int in_batches = 0;
    for (int i = 0; i < N_CREATES; i++) {
        sp_envelope_t *e = NULL;
        char reason[SP_REASON_MAX];
        assert_int_equal(sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 0),
                                            (size_t)PQgetlength(r, i, 0), &e, reason),
                         0);
        assert_string_equal(e->signer, "scheduler");
        assert_int_equal(e->signature.len, 64);
        if (e->sig_count > 1)
            in_batches++;
        if (e->sig_count > largest)
            largest = e->sig_count;
        sp_envelope_free(e);
    }
    print_message("%d of %d placements signed in batches, the largest of %u\n", in_batches,
                  N_CREATES, largest);
    assert_true(largest >= 2);
    assert_true(in_batches >= 2);
    long long sig_bad =
        sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE type = 'SandboxPlaced' AND "
                              "aggregate_id LIKE 'sbx_sb%' AND status = 'rejected'");
    assert_int_equal(sig_bad, 0);

    /* A batch member with its worker changed after signing, proof and signature kept. */
    int victim = -1;
    sp_envelope_t *e = NULL;
    for (int i = 0; i < N_CREATES && victim < 0; i++) {
        char reason[SP_REASON_MAX];
        assert_int_equal(sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 0),
                                            (size_t)PQgetlength(r, i, 0), &e, reason),
                         0);
        if (e->sig_count > 1)
            victim = i;
        else
            sp_envelope_free(e);
    }
    assert_true(victim >= 0);
    char *old_worker = e->sandbox_placed->worker;
    e->sandbox_placed->worker = "w-evil";
    uint8_t *forged = NULL;
    size_t flen = 0;
    assert_int_equal(sp_envelope_encode(e, &forged, &flen), 0);
    e->sandbox_placed->worker = old_worker;
    sp_envelope_free(e);
    const char *subject = PQgetvalue(r, victim, 1);
    const char *victim_sbx = PQgetvalue(r, victim, 3);
    uint64_t seq = 0;
    int dup = 0;
    /* Message ids of their own: the stream's duplicate window would drop the event id's. */
    assert_int_equal(sp_bus_publish(bus, subject, forged, flen, "forged-member", &seq, &dup), 0);
    assert_false(dup);
    sp_test_expect_row(db, seq, "rejected", "bad_signature", true);
    free(forged);

    /* The member itself, sent again. */
    assert_int_equal(sp_bus_publish(bus, subject, PQgetvalue(r, victim, 0),
                                    (size_t)PQgetlength(r, victim, 0), "replayed-member", &seq,
                                    &dup),
                     0);
    assert_false(dup);
    sp_test_expect_row(db, seq, "rejected", "replayed", true);

    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM sandboxes WHERE id = '%s' AND worker = 'w-a' AND state = "
             "'placed'",
             victim_sbx);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    PQclear(r);
    PQfinish(db);
    sp_bus_free(bus);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_burst_placed_and_forgery_refused)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
