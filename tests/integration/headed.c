/* Headed batches in the event log (sign.h, sighead.h, docs/trust.md "Headed batches"): a
 * worker's command facts signed as one head listing every member's leaf, members carrying only
 * their place and their head's id. The log accepts the members of an accepted head that comes
 * before them, also when it was restarted between the head and its members (the head is then
 * read back from the table); it stores rejected, and changes no projection for, a member whose
 * content was changed, one naming a head that does not exist, members published before their
 * head, and a batch of the wrong worker. A member's row is a few dozen bytes over unsigned,
 * not the ~260 of a Merkle member. space-replay verify reaches the same verdicts and catches a
 * member's payload rewritten with the chain recomputed. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "eventgen.h"
#include "harness.h"
#include "ids.h"
#include "sign.h"
#include "xmalloc.h"

static sp_bus_t *bus;
static PGconn *db;
static sp_sign_key_t *k_gateway, *k_scheduler, *k_w1, *k_w2;
static uint64_t s_member;  /* an accepted member whose payload the second test rewrites */
static int64_t n_accepted; /* accepted rows after the first test */

#define N 6 /* members per batch, the head included */

static void publish(const sp_eventgen_msg_t *m, const char *msg_id)
{
    assert_int_equal(
        sp_bus_publish_async(bus, m->subject, m->data, m->len, msg_id ? msg_id : m->event_id), 0);
}

static uint64_t last_seq(void)
{
    return sp_test_stream_last(bus);
}

#define expect_row(seq, status, needle)     sp_test_expect_row(db, (seq), (status), (needle), true)
#define expect_row_has(seq, status, needle) sp_test_expect_row(db, (seq), (status), (needle), false)

/* N CommandOutput facts of sandbox sbx on worker, signed by identity as one headed batch; the
 * plain (unsigned) sizes in plain when not NULL. */
static void make_batch(sp_eventgen_msg_t *m, const char *sbx, const char *worker,
                       const char *identity, const sp_sign_key_t *key, size_t *plain)
{
    sp_eventgen_msg_t *p[N];
    char cmd[32];
    snprintf(cmd, sizeof(cmd), "cmd_%s", sbx + 4);
    for (size_t i = 0; i < N; i++) {
        char line[32];
        int n = snprintf(line, sizeof(line), "line %zu of %s\n", i, sbx);
        assert_int_equal(sp_eventgen_output("t1", sbx, worker, cmd, i * 32, (const uint8_t *)line,
                                            (size_t)n, NULL, &m[i]),
                         0);
        if (plain)
            plain[i] = m[i].len;
        p[i] = &m[i];
    }
    assert_int_equal(sp_eventgen_sign_headed(p, N, identity, key), 0);
}

static void dispose(sp_eventgen_msg_t *m, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sp_eventgen_msg_dispose(&m[i]);
}

/* A copy of member raw with its event id and output changed, its signature fields kept (what
 * a forger holding a real member can make). */
static void forge_member(const sp_eventgen_msg_t *from, sp_eventgen_msg_t *to)
{
    char reason[SP_REASON_MAX], id[37];
    sp_envelope_t *e = NULL;
    assert_int_equal(sp_envelope_decode(from->data, from->len, &e, reason), 0);
    sp_uuid7_str(id);
    char *saved_id = e->event_id;
    ProtobufCBinaryData saved_data = e->command_output->data;
    e->event_id = id;
    e->command_output->data.data = (uint8_t *)"rm -rf /\n";
    e->command_output->data.len = 9;
    to->len = space__v1__envelope__get_packed_size(e);
    to->data = sp_xmalloc(to->len);
    space__v1__envelope__pack(e, to->data);
    snprintf(to->subject, sizeof(to->subject), "%s", from->subject);
    snprintf(to->event_id, sizeof(to->event_id), "%s", id);
    e->event_id = saved_id;
    e->command_output->data = saved_data;
    sp_envelope_free(e);
}

static void test_eventlog_headed(void **state)
{
    sp_eventgen_msg_t life[3], ok[N], late[N], bad[3], wrong[N], after[N];
    size_t plain[N];
    char log_path[4096];
    (void)state;

    sp_test_stack_load();
    bus = sp_test_bus();
    db = sp_test_db();
    char *dir = sp_xasprintf("%s/creds", sp_test_env("SPACE_HOME"));
    mkdir(dir, 0700);
    k_gateway = sp_test_identity(dir, "gateway");
    k_scheduler = sp_test_identity(dir, "scheduler");
    k_w1 = sp_test_identity(dir, "worker-w1");
    k_w2 = sp_test_identity(dir, "worker-w2");
    free(dir);
    sp_test_daemon_stop("space-eventlog", SIGTERM);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    snprintf(log_path, sizeof(log_path),
             "grep -q 'verifying signatures' '%s/log/space-eventlog.log'",
             sp_test_env("SPACE_HOME"));
    assert_int_equal(system(log_path), 0); /* NOLINT(cert-env33-c) */

    /* sbx_hd1 created, placed on w1 and started there. */
    static const sp_event_type_t types[3] = {SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                             SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED,
                                             SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED};
    static const char *const signers[3] = {"gateway", "scheduler", "worker-w1"};
    sp_sign_key_t *keys[3] = {k_gateway, k_scheduler, k_w1};
    for (size_t i = 0; i < 3; i++) {
        sp_eventgen_msg_t *one[1] = {&life[i]};
        assert_int_equal(sp_eventgen_sandbox(types[i], "t1", "sbx_hd1", i ? "w1" : NULL, &life[i]),
                         0);
        assert_int_equal(sp_eventgen_sign(one, 1, signers[i], keys[i]), 0);
        publish(&life[i], NULL);
    }
    uint64_t s_life = last_seq();

    /* A headed batch as the worker publishes it: the head acked first, then the members. */
    make_batch(ok, "sbx_hd1", "w1", "worker-w1", k_w1, plain);
    publish(&ok[0], NULL);
    uint64_t s_ok_head = last_seq();
    for (size_t i = 1; i < N; i++)
        publish(&ok[i], NULL);
    uint64_t s_ok_last = last_seq();
    s_member = s_ok_head + 2;

    /* A member with its content (and event id) changed, its signature fields kept. */
    forge_member(&ok[3], &bad[0]);
    publish(&bad[0], NULL);
    uint64_t s_tampered = last_seq();
    /* A member naming a head that was never published: the member of a batch whose head the
     * forger keeps back. */
    sp_eventgen_msg_t held[N];
    make_batch(held, "sbx_hd1", "w1", "worker-w1", k_w1, NULL);
    publish(&held[2], NULL);
    uint64_t s_nohead = last_seq();
    /* Members before their head: refused; the head after them is accepted. */
    make_batch(late, "sbx_hd1", "w1", "worker-w1", k_w1, NULL);
    publish(&late[1], NULL);
    publish(&late[2], NULL);
    uint64_t s_early = last_seq();
    publish(&late[0], NULL);
    uint64_t s_late_head = last_seq();
    /* worker-w2's batch for a sandbox placed on w1: validly signed, not its own. */
    make_batch(wrong, "sbx_hd1", "w1", "worker-w2", k_w2, NULL);
    publish(&wrong[0], NULL);
    uint64_t s_wrong_head = last_seq();
    publish(&wrong[1], NULL);
    uint64_t s_wrong_member = last_seq();

    for (uint64_t s = s_life - 2; s <= s_life; s++)
        expect_row(s, "accepted", "");
    for (uint64_t s = s_ok_head; s <= s_ok_last; s++)
        expect_row(s, "accepted", "");
    expect_row(s_tampered, "rejected", "bad_signature:");
    expect_row_has(s_tampered, "rejected", "is not member 3 of the batch head");
    expect_row_has(s_nohead, "rejected", "which is not an accepted head before it");
    expect_row_has(s_early - 1, "rejected", "which is not an accepted head before it");
    expect_row_has(s_early, "rejected", "which is not an accepted head before it");
    expect_row(s_late_head, "accepted", "");
    expect_row(s_wrong_head, "rejected", "not_own:");
    /* Its head was refused, so it is not an accepted head: refused before its placement. */
    expect_row(s_wrong_member, "rejected", "bad_signature:");

    /* What a member costs in the row: its place and its head's id, not a signature and a
     * proof. The head carries the list (32 bytes per member). */
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT length(payload) FROM events WHERE stream_seq = %llu",
             (unsigned long long)s_ok_head + 1);
    int64_t member_len = sp_test_db_scalar(db, sql);
    snprintf(sql, sizeof(sql), "SELECT length(payload) FROM events WHERE stream_seq = %llu",
             (unsigned long long)s_ok_head);
    int64_t head_len = sp_test_db_scalar(db, sql);
    print_message("member row %lld bytes (unsigned %zu), head %lld (unsigned %zu)\n",
                  (long long)member_len, plain[1], (long long)head_len, plain[0]);
    assert_true(member_len > (int64_t)plain[1] && member_len <= (int64_t)plain[1] + 60);
    assert_true(head_len >= (int64_t)(plain[0] + SP_SIG_LEN + N * 32));

    /* The log restarted between a head and its members: the head is read back from the
     * table. */
    make_batch(after, "sbx_hd1", "w1", "worker-w1", k_w1, NULL);
    publish(&after[0], NULL);
    uint64_t s_after_head = last_seq();
    expect_row(s_after_head, "accepted", "");
    sp_test_daemon_stop("space-eventlog", SIGTERM);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    for (size_t i = 1; i < N; i++)
        publish(&after[i], NULL);
    uint64_t s_after_last = last_seq();
    for (uint64_t s = s_after_head + 1; s <= s_after_last; s++)
        expect_row(s, "accepted", "");

    /* No refused member touched anything: the command's output rows are exactly the accepted
     * ones. */
    n_accepted = sp_test_db_scalar(db, "SELECT count(*) FROM events WHERE status = 'accepted'");
    assert_int_equal(n_accepted, 3 + N + 1 + N);
    dispose(life, 3);
    dispose(ok, N);
    dispose(held, N);
    dispose(late, N);
    dispose(bad, 1);
    dispose(wrong, N);
    dispose(after, N);
}

/* space-replay verify re-verifies every member against its head, by the log's rule; a
 * member's payload rewritten with the chain recomputed is caught. */
static void test_replay_headed(void **state)
{
    char *out = sp_xmalloc(1 << 16);
    char want[96];
    (void)state;

    assert_int_equal(sp_test_replay("verify --json", out, 1 << 16), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "\"ok\":true"));
    snprintf(want, sizeof(want), "\"signed\":%lld", (long long)n_accepted);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "\"bad\":0"));

    /* The rewrite: another output in an accepted member, its fields 13-16 kept. */
    sp_envelope_t *e = sp_test_stored_envelope(db, s_member);
    assert_int_equal(e->sig_head.len, 16);
    ProtobufCBinaryData saved = e->command_output->data;
    e->command_output->data.data = (uint8_t *)"all good\n";
    e->command_output->data.len = 9;
    sp_test_rewrite_row(db, s_member, e);
    e->command_output->data = saved;
    sp_envelope_free(e);

    int rc = sp_test_replay("verify --json", out, 1 << 16);
    print_message("%s", out);
    assert_int_equal(rc, 2);
    snprintf(want, sizeof(want), "\"stream_seq\":%llu", (unsigned long long)s_member);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "is not member"));
    free(out);
    sp_sign_key_free(k_gateway);
    sp_sign_key_free(k_scheduler);
    sp_sign_key_free(k_w1);
    sp_sign_key_free(k_w2);
    PQfinish(db);
    sp_bus_free(bus);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_eventlog_headed),
                                       cmocka_unit_test(test_replay_headed)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
