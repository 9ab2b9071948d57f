/* The event log verifies before it accepts (issue 14, docs/trust.md): with a keyring in
 * $SPACE_HOME/creds the eventlog (restarted to pick it up) stores every message that fails
 * sp_trust_check as rejected with the refusal's name and changes no projection: unsigned, a
 * broken signature, the wrong identity's key, an unknown identity, a worker speaking for a
 * sandbox placed elsewhere, a gateway emitting a fact, a replay of a signed event. Signed
 * batches from the identities the contract allows are accepted, the placement made earlier in
 * the same batch included. Then space-replay verify re-verifies every signature: counts signed
 * and unsigned rows, and catches a payload a database superuser rewrote with the chain hashes
 * recomputed. */
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
#include "sign.h"
#include "xmalloc.h"

static sp_bus_t *bus;
static PGconn *db;
static sp_sign_key_t *k_gateway, *k_scheduler, *k_w1, *k_w2;
static uint64_t s_forged; /* an accepted create whose payload the second test rewrites */

/* One event signed alone (a batch of one) by identity with key. */
static void make_signed(sp_event_type_t type, const char *sbx, const char *worker,
                        const char *identity, const sp_sign_key_t *key, sp_eventgen_msg_t *m)
{
    sp_eventgen_msg_t *one[1] = {m};
    assert_int_equal(sp_eventgen_sandbox(type, "t1", sbx, worker, m), 0);
    assert_int_equal(sp_eventgen_sign(one, 1, identity, key), 0);
}

static void publish(const sp_eventgen_msg_t *m, const char *msg_id)
{
    assert_int_equal(
        sp_bus_publish_async(bus, m->subject, m->data, m->len, msg_id ? msg_id : m->event_id), 0);
}

static uint64_t last_seq(void)
{
    return sp_test_stream_last(bus);
}

#define expect_row(seq, status, needle) sp_test_expect_row(db, (seq), (status), (needle), true)

static void test_eventlog_verifies(void **state)
{
    sp_eventgen_msg_t m[16];
    size_t nm = 0;
    char log_path[4096];

    sp_test_stack_load();
    bus = sp_test_bus();
    db = sp_test_db();

    /* What `space up` will create: one key per identity. The eventlog reads the public half. */
    char *dir = sp_xasprintf("%s/creds", sp_test_env("SPACE_HOME"));
    mkdir(dir, 0700);
    k_gateway = sp_test_identity(dir, "gateway");
    k_scheduler = sp_test_identity(dir, "scheduler");
    k_w1 = sp_test_identity(dir, "worker-w1");
    k_w2 = sp_test_identity(dir, "worker-w2");
    free(dir);
    sp_test_daemon_stop("space-eventlog", SIGTERM);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    assert_true(sp_test_daemon_pid("space-eventlog") > 0);
    snprintf(log_path, sizeof(log_path),
             "grep -q 'verifying signatures' '%s/log/space-eventlog.log'",
             sp_test_env("SPACE_HOME"));
    assert_int_equal(system(log_path), 0); /* NOLINT(cert-env33-c) */

    /* A valid burst, each producer's part signed as one batch: two creates (gateway), their
     * placements on w1 and w2 (scheduler), w1 starting its sandbox (placed in this batch). */
    sp_eventgen_msg_t *creates[2] = {&m[0], &m[1]}, *placed[2] = {&m[2], &m[3]};
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                         "t1", "sbx_ok1", NULL, &m[0]),
                     0);
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                         "t1", "sbx_ok2", NULL, &m[1]),
                     0);
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED, "t1",
                                         "sbx_ok1", "w1", &m[2]),
                     0);
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED, "t1",
                                         "sbx_ok2", "w2", &m[3]),
                     0);
    assert_int_equal(sp_eventgen_sign(creates, 2, "gateway", k_gateway), 0);
    assert_int_equal(sp_eventgen_sign(placed, 2, "scheduler", k_scheduler), 0);
    make_signed(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "sbx_ok1", "w1", "worker-w1", k_w1,
                &m[4]);
    nm = 5;
    for (size_t i = 0; i < nm; i++)
        publish(&m[i], NULL);
    uint64_t s_valid_last = last_seq();
    s_forged = s_valid_last - 4;

    /* Unsigned. */
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                         "t1", "sbx_unsigned", NULL, &m[nm]),
                     0);
    publish(&m[nm++], NULL);
    uint64_t s_unsigned = last_seq();
    /* A signature with one bit flipped (the last byte of the message is the signature's). */
    make_signed(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "sbx_badsig", NULL,
                "gateway", k_gateway, &m[nm]);
    m[nm].data[m[nm].len - 1] ^= 0x01;
    publish(&m[nm++], NULL);
    uint64_t s_badsig = last_seq();
    /* Says it is the gateway, signed with worker-w1's key. */
    make_signed(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "sbx_wrongkey", NULL,
                "gateway", k_w1, &m[nm]);
    publish(&m[nm++], NULL);
    uint64_t s_wrongkey = last_seq();
    /* An identity the keyring does not know. */
    make_signed(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "sbx_stranger", NULL,
                "gateway-9", k_gateway, &m[nm]);
    publish(&m[nm++], NULL);
    uint64_t s_stranger = last_seq();
    /* worker-w1, validly signed, starting sbx_ok2, which is placed on w2. */
    make_signed(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "sbx_ok2", "w1", "worker-w1", k_w1,
                &m[nm]);
    publish(&m[nm++], NULL);
    uint64_t s_elsewhere = last_seq();
    /* The gateway emitting a fact. */
    make_signed(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED, "sbx_ok1", "w1", "gateway", k_gateway,
                &m[nm]);
    publish(&m[nm++], NULL);
    uint64_t s_gwfact = last_seq();
    /* The first create again, byte for byte, under another msg id (past the duplicate
     * window, as a replay would be). */
    char other_id[64];
    snprintf(other_id, sizeof(other_id), "replay-%s", m[0].event_id);
    publish(&m[0], other_id);
    uint64_t s_replay = last_seq();
    /* The rightful owner of sbx_ok2 still may. */
    make_signed(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "sbx_ok2", "w2", "worker-w2", k_w2,
                &m[nm]);
    publish(&m[nm++], NULL);
    uint64_t s_owner = last_seq();

    for (uint64_t s = s_valid_last - 4; s <= s_valid_last; s++)
        expect_row(s, "accepted", "");
    expect_row(s_unsigned, "rejected", "unsigned:");
    expect_row(s_badsig, "rejected", "bad_signature:");
    expect_row(s_wrongkey, "rejected", "bad_signature:");
    expect_row(s_stranger, "rejected", "unknown_signer:");
    expect_row(s_elsewhere, "rejected", "not_own:");
    expect_row(s_gwfact, "rejected", "type_not_allowed:");
    expect_row(s_replay, "rejected", "replayed:");
    expect_row(s_owner, "accepted", "");

    /* No refused event touched a projection. */
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM sandboxes"), 2);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM sandboxes WHERE id = 'sbx_ok1' "
                                           "AND state = 'running' AND worker = 'w1'"),
                     1);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM sandboxes WHERE id = 'sbx_ok2' "
                                           "AND state = 'running' AND worker = 'w2'"),
                     1);
    for (size_t i = 0; i < nm; i++)
        sp_eventgen_msg_dispose(&m[i]);
}

/* space-replay verify with the same keyring: every accepted signed row re-verified. Then a
 * superuser rewrites an accepted payload (a longer timeout in a create) and recomputes every
 * hash from there on: the chain is intact again, the signature is not. */
static void test_replay_verifies_signatures(void **state)
{
    char *out = sp_xmalloc(1 << 16);

    /* Before the rewrite: intact, the 6 accepted rows signed, the 8 rejected not looked at. */
    assert_int_equal(sp_test_replay("verify --json", out, 1 << 16), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "\"ok\":true"));
    assert_non_null(strstr(out, "\"signed\":6"));
    assert_non_null(strstr(out, "\"bad\":0"));

    /* The rewrite: the stored create with a longer timeout, its signature fields kept (so the
     * row still looks signed), stored with the chain recomputed from there. */
    sp_envelope_t *e = sp_test_stored_envelope(db, s_forged);
    e->sandbox_create_requested->timeout_s = 86400;
    sp_test_rewrite_row(db, s_forged, e);
    sp_envelope_free(e);

    int rc = sp_test_replay("verify --json", out, 1 << 16);
    print_message("%s", out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "\"ok\":false"));
    char want[96];
    snprintf(want, sizeof(want), "\"stream_seq\":%llu", (unsigned long long)s_forged);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "bad_signature"));
    /* The hashes alone no longer say anything; the signature and the stream's message do. */
    assert_int_equal(sp_test_replay("verify", out, 1 << 16), 2);
    assert_non_null(strstr(out, "bad_signature"));
    assert_non_null(strstr(out, "not the stream's message"));
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_eventlog_verifies),
                                       cmocka_unit_test(test_replay_verifies_signatures)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
