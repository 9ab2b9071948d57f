/* Hostile input on the bus: malformed envelopes are stored as rejected with a reason (never
 * dropped, never a crash), the chain still covers them, and valid events keep flowing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "db.h"
#include "eventgen.h"
#include "harness.h"
#include "xmalloc.h"

static sp_bus_t *bus;
static PGconn *db;

/* Hostile bytes as they are; an envelope signed by the identity that would emit it, so that
 * what is checked after the signature (schema, state machine) is what the test shows. */
static uint64_t publish(const char *subject, const void *data, size_t len)
{
    uint64_t seq = 0;
    int dup = 0;
    uint8_t *signed_data = len ? sp_xmalloc(len) : NULL;
    size_t signed_len = len;
    if (len)
        memcpy(signed_data, data, len);
    if (len && sp_test_sign(subject, &signed_data, &signed_len) == 0) {
        data = signed_data;
        len = signed_len;
    }
    assert_int_equal(sp_bus_publish(bus, subject, data, len, NULL, &seq, &dup), 0);
    free(signed_data);
    assert_false(dup);
    return seq;
}

#define expect_row(seq, status, needle) sp_test_expect_row(db, (seq), (status), (needle), false)

/* Packs an envelope without the encoder's validation, as a careless or hostile publisher. */
static uint8_t *pack_raw(sp_envelope_t *env, size_t *len)
{
    *len = space__v1__envelope__get_packed_size(env);
    uint8_t *buf = sp_xmalloc(*len);
    space__v1__envelope__pack(env, buf);
    return buf;
}

static void test_rejects(void **state)
{
    sp_eventgen_msg_t good, other;
    sp_envelope_t *env;
    char reason[SP_REASON_MAX];
    size_t len;
    uint8_t *raw;

    sp_test_stack_load();
    bus = sp_test_bus();
    db = sp_test_db();
    int pid = sp_test_daemon_pid("space-eventlog");
    assert_true(pid > 0);

    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                         "t1", "sbx_bad1", NULL, &good),
                     0);

    /* Truncated. */
    uint64_t s_trunc = publish(good.subject, good.data, good.len / 2);
    /* Oversized (the server takes it; the envelope limit is ours). */
    size_t big = 70 * 1024;
    uint8_t *junk = sp_xcalloc(1, big);
    uint64_t s_big = publish(good.subject, junk, big);
    free(junk);
    /* Empty. */
    uint64_t s_empty = publish(good.subject, "", 0);

    /* Unknown type (no payload this version knows). */
    assert_int_equal(sp_envelope_decode(good.data, good.len, &env, reason), 0);
    char *orig_type = env->type;
    env->type = "SandboxTeleported";
    env->payload_case = SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET;
    raw = pack_raw(env, &len);
    env->payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED;
    env->type = orig_type;
    sp_envelope_free(env);
    uint64_t s_type = publish("space.ev.sbx._.sbx_bad1.SandboxTeleported", raw, len);
    free(raw);

    /* Wrong schema version. */
    assert_int_equal(sp_envelope_decode(good.data, good.len, &env, reason), 0);
    env->schema_version = 7;
    raw = pack_raw(env, &len);
    sp_envelope_free(env);
    uint64_t s_version = publish(good.subject, raw, len);
    free(raw);

    /* A valid event on another sandbox's subject. */
    uint64_t s_subject =
        publish("space.ev.sbx._.sbx_victim.SandboxCreateRequested", good.data, good.len);

    /* A fact about a sandbox that was never created. */
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "t1",
                                         "sbx_ghost", "w1", &other),
                     0);
    uint64_t s_ghost = publish(other.subject, other.data, other.len);
    sp_eventgen_msg_dispose(&other);

    /* The valid create, then a different event reusing its id. */
    uint64_t s_good = publish(good.subject, good.data, good.len);
    assert_int_equal(sp_envelope_decode(good.data, good.len, &env, reason), 0);
    env->sandbox_create_requested->timeout_s = 999;
    raw = pack_raw(env, &len);
    sp_envelope_free(env);
    uint64_t s_reuse = publish(good.subject, raw, len);
    free(raw);

    /* A second tenant trying to delete the first tenant's sandbox. */
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED,
                                         "t2", "sbx_bad1", NULL, &other),
                     0);
    uint64_t s_tenant = publish(other.subject, other.data, other.len);
    sp_eventgen_msg_dispose(&other);

    /* Bytes that are not UTF-8 in the subject: stored escaped, not a COPY failure. */
    uint64_t s_bytes = publish("space.ev.sbx._.\xff\xfe.Sandbox", "junk", 4);

    expect_row(s_bytes, "rejected", "");
    char sql[128];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE stream_seq = %llu AND subject = "
             "'space.ev.sbx._.\\xff\\xfe.Sandbox'",
             (unsigned long long)s_bytes);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    expect_row(s_trunc, "rejected", "");
    expect_row(s_big, "rejected", "exceeds");
    expect_row(s_empty, "rejected", "empty");
    expect_row(s_type, "rejected", "unknown event type");
    expect_row(s_version, "rejected", "schema_version");
    expect_row(s_subject, "rejected", "subject");
    /* A worker's fact for a sandbox nobody placed: the trust check answers before the state
     * machine would (no worker may speak for it). */
    expect_row(s_ghost, "rejected", "not_own");
    expect_row(s_good, "accepted", "");
    expect_row(s_reuse, "rejected", "reused");
    expect_row(s_tenant, "rejected", "tenant");

    /* Rejected events left the projection alone; the accepted one made the sandbox. */
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM sandboxes"), 1);
    assert_int_equal(sp_test_db_scalar(db, "SELECT timeout_s FROM sandboxes WHERE id = "
                                           "'sbx_bad1'"),
                     300);
    /* Same process, still serving, and the chain covers the rejected rows too. */
    assert_int_equal(sp_test_daemon_pid("space-eventlog"), pid);
    char out[4096];
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "chain intact: 11 events"));

    sp_eventgen_msg_dispose(&good);
    PQfinish(db);
    sp_bus_free(bus);
}

/* A message the database refuses (here a trigger plays a constraint the eventlog did not
 * foresee) must not stall the log: its batch is stored one message at a time, the refused one
 * is recorded as rejected ("not storable") and the ones around it are accepted. */
static void test_unstorable_message(void **state)
{
    sp_eventgen_msg_t m[3];
    uint64_t seq[3];
    const char *ids[3] = {"sbx_before", "sbx_poison", "sbx_after"};

    sp_test_stack_load();
    bus = sp_test_bus();
    db = sp_test_db();
    PQclear(PQexec(db, "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$"
                       " BEGIN IF NEW.status = 'accepted' AND NEW.aggregate_id = 'sbx_poison'"
                       " THEN RAISE EXCEPTION 'poison refused'; END IF; RETURN NEW; END $$"));
    PGresult *r = PQexec(db, "CREATE TRIGGER refuse_poison BEFORE INSERT ON events FOR EACH "
                             "ROW EXECUTE FUNCTION refuse_poison()");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);

    /* Published back to back so they travel in one batch. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                             "t1", ids[i], NULL, &m[i]),
                         0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sp_test_sign(m[i].subject, &m[i].data, &m[i].len), 0);
        assert_int_equal(
            sp_bus_publish_async(bus, m[i].subject, m[i].data, m[i].len, m[i].event_id), 0);
    }
    assert_int_equal(sp_bus_publish_async_complete(bus, 10000), 0);
    uint64_t last = 0, msgs = 0;
    assert_int_equal(sp_bus_stream_info(bus, &last, &msgs), 0);
    for (int i = 0; i < 3; i++)
        seq[i] = last - 2 + (uint64_t)i;

    expect_row(seq[0], "accepted", "");
    expect_row(seq[1], "rejected", "not storable");
    expect_row(seq[1], "rejected", "poison refused");
    expect_row(seq[2], "accepted", "");
    PQclear(PQexec(db, "DROP TRIGGER refuse_poison ON events"));
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM sandboxes WHERE id IN "
                                           "('sbx_before', 'sbx_after')"),
                     2);
    char out[4096];
    assert_int_equal(sp_test_replay("verify", out, sizeof(out)), 0);
    for (int i = 0; i < 3; i++)
        sp_eventgen_msg_dispose(&m[i]);
    PQfinish(db);
    sp_bus_free(bus);
}

/* The event log's store path runs its statements prepared (sp_db_exec_prepared): the answer
 * is the statement's on every call, on a new connection (which must prepare it again, even at
 * a freed connection's address), and past the cache's size, where statements run unprepared. */
static long long prepared_value(PGconn *c, const char *sql, const char *arg)
{
    const char *params[1] = {arg};
    PGresult *r = sp_db_exec_prepared(c, sql, 1, params, 0);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    long long v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

static void test_prepared_statements(void **state)
{
    (void)state;
    const char *sql = "SELECT $1::int8 * 2";
    for (int round = 0; round < 3; round++) {
        PGconn *c = sp_test_db();
        assert_int_equal(prepared_value(c, sql, "21"), 42);
        assert_int_equal(prepared_value(c, sql, "5"), 10);
        PQfinish(c); /* the next connection may get this one's address */
    }
    PGconn *c = sp_test_db();
    for (int i = 0; i < 300; i++) {
        char q[64], arg[16];
        snprintf(q, sizeof(q), "SELECT $1::int8 + %d", i);
        snprintf(arg, sizeof(arg), "%d", i);
        assert_int_equal(prepared_value(c, q, arg), 2LL * i);
        assert_int_equal(prepared_value(c, q, arg), 2LL * i);
    }
    /* A statement that cannot be prepared fails as running it would. */
    const char *params[1] = {"1"};
    PGresult *r = sp_db_exec_prepared(c, "SELECT $1::int8 FROM no_such_table", 1, params, 0);
    assert_int_not_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    PQclear(r);
    PQfinish(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rejects),
                                       cmocka_unit_test(test_unstorable_message),
                                       cmocka_unit_test(test_prepared_statements)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
