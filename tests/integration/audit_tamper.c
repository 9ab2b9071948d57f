/* The audit trail as evidence (issue 16, docs/audit.md), on a real stack (eventlog, scheduler,
 * worker, gateway) with credentials: every event signed, the event log signing checkpoints of
 * its head into SPACE_CHECKPOINTS and $SPACE_HOME/audit/checkpoints.log.
 *
 * First a real log: a sandbox, commands ("sleep"), a forged unsigned create (a rejected row),
 * a 900 KB hostile message (stored as its first 64 KiB, its size and its SHA-256). A clean log
 * verifies, and keeps verifying across an eventlog restart and a failover to a standby
 * eventlog (SIGKILL of the active one).
 *
 * Then, with the producers stopped and the last checkpoint covering the head, each tampering a
 * database superuser can make, each on a fresh copy of the log (a schema of its own, which
 * space-replay reads through search_path), and `space-replay verify` must exit 2 naming the
 * first bad sequence:
 *   1. the tail truncated (the last rows deleted)
 *   2. a rejected row flipped to accepted
 *   3. a middle row deleted and every later hash recomputed
 *   4. a row deleted, the later rows renumbered and rehashed
 *   5. a command rewritten ("sleep" -> "Xleep") and the chain recomputed
 *   6. a middle row deleted
 *   7. a payload byte changed
 *   8. a column (tenant) changed
 *   9. a reject reason rewritten
 * and the witness itself: the checkpoint stream deleted (missing), then made again and so
 * shorter than the file.
 *
 * Last the bounds' trade-off: messages the stream's limits drop before the eventlog stored
 * them (the eventlog stopped, the limits lowered) become one "lost" row, and verify reports
 * them without calling the chain broken. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "eventgen.h"
#include "harness.h"
#include "hash.h"
#include "xmalloc.h"

#define OUT_MAX  (1u << 20)
#define BIG_SIZE (900 * 1024)

static sp_bus_t *bus; /* the operator's */
static PGconn *db;
static const char *key;
static int port;
static char sbx[64];
static char *out;
static long long rejected_seq, big_seq, sleep_seq;

static long long scalar(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static long long scalar(const char *fmt, ...)
{
    char sql[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    return sp_test_db_scalar(db, sql);
}

static void exec_sql(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void exec_sql(const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    PGresult *r = PQexec(db, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(db));
    PQclear(r);
}

/* space-replay verify on the log of schema (NULL: the live one); its exit status, stdout in
 * out. */
static int verify(const char *schema, const char *extra)
{
    const char *bin = getenv("SPACE_BIN_DIR");
    char *url =
        schema ? sp_xasprintf("%s&options=-csearch_path%%3D%s", sp_test_env("SPACE_PG_URL"), schema)
               : sp_xstrdup(sp_test_env("SPACE_PG_URL"));
    char *cmd = sp_xasprintf("'%s/space-replay' --pg-url '%s' verify %s", bin ? bin : ".", url,
                             extra ? extra : "");
    FILE *p = popen(cmd, "r"); /* NOLINT(cert-env33-c): as a security team would run it */
    free(cmd);
    free(url);
    assert_non_null(p);
    size_t n = fread(out, 1, OUT_MAX - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    print_message("verify%s%s: %s", schema ? " " : "", schema ? schema : "", out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_broken(const char *schema, long long seq)
{
    char want[64];
    assert_int_equal(verify(schema, "--wait-s 1"), 2);
    snprintf(want, sizeof(want), "BROKEN at stream_seq %lld ", seq);
    if (!strstr(out, want))
        fail_msg("verify did not name stream_seq %lld first", seq);
}

static long long head(void)
{
    return scalar("SELECT coalesce(max(stream_seq), 0) FROM events");
}

/* The seq of the last checkpoint in the file (0: none). */
static long long last_checkpoint(void)
{
    char *path = sp_xasprintf("%s/%s", sp_test_env("SPACE_HOME"), SP_CKPT_FILE_DEFAULT);
    FILE *f = fopen(path, "re");
    char line[SP_CKPT_LINE_MAX + 2];
    long long seq = 0;
    free(path);
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, " seq=");
        if (p)
            seq = strtoll(p + 5, NULL, 10);
    }
    fclose(f);
    return seq;
}

/* Waits until the log stored everything the stream holds and a checkpoint covers it. */
static void wait_anchored(void)
{
    for (int i = 0; i < 300; i++) {
        uint64_t last = 0, msgs = 0;
        assert_int_equal(sp_bus_stream_info(bus, &last, &msgs), 0);
        long long h = head();
        if (h == (long long)last && last_checkpoint() == h)
            return;
        usleep(100 * 1000);
    }
    fail_msg("no checkpoint covered the head within 30 s (head %lld, checkpoint %lld)", head(),
             last_checkpoint());
}

static void run_cmd(const char *cmd)
{
    char body[256];
    snprintf(body, sizeof(body), "{\"cmd\":\"%s\"}", cmd);
    sp_test_cmd_t r = sp_test_run(port, key, sbx, body);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.exit_code, 0);
    sp_test_cmd_free(&r);
}

static long long publish(const char *subject, const void *data, size_t len)
{
    uint64_t seq = 0;
    assert_int_equal(sp_bus_publish(bus, subject, data, len, NULL, &seq, NULL), 0);
    return (long long)seq;
}

static int setup(void **state)
{
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    db = sp_test_db();
    bus = sp_test_bus();
    out = sp_xmalloc(OUT_MAX);
    sp_test_create_sandbox(port, key, "tiny", sbx);
    assert_int_equal(sp_test_db_wait_scalar(
                         db, "SELECT count(*) FROM sandboxes WHERE state = 'running'", 1, 30000),
                     1);
    run_cmd("sleep 0.1; echo one");
    sleep_seq = scalar("SELECT min(stream_seq) FROM events WHERE type = 'CommandRequested' AND "
                       "position('\\x736c656570'::bytea IN payload) > 0");
    assert_true(sleep_seq > 0);
    /* A forged create (unsigned): stored rejected. */
    sp_eventgen_msg_t forged;
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                         "default", "sbx_forged", NULL, &forged),
                     0);
    rejected_seq = publish(forged.subject, forged.data, forged.len);
    sp_eventgen_msg_dispose(&forged);
    sp_test_expect_row(db, (uint64_t)rejected_seq, "rejected", "unsigned", true);
    return 0;
}

static int teardown(void **state)
{
    sp_bus_free(bus);
    PQfinish(db);
    free(out);
    return 0;
}

/* Bounds: a 900 KB hostile message is stored as its first 64 KiB, its size and SHA-256. */
static void test_big_reject(void **state)
{
    uint8_t *big = sp_xmalloc(BIG_SIZE), digest[SP_SHA256_LEN];
    char hex[SP_SHA256_HEX_LEN + 1], sql[512];
    for (size_t i = 0; i < BIG_SIZE; i++)
        big[i] = (uint8_t)(i * 7 + 3);
    sp_sha256(big, BIG_SIZE, digest);
    sp_hex_encode(digest, SP_SHA256_LEN, hex);
    big_seq = publish("space.ev.sbx._.sbx_big.SandboxCreateRequested", big, BIG_SIZE);
    free(big);
    sp_test_expect_row(db, (uint64_t)big_seq, "rejected", "exceeds", false);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE stream_seq = %lld AND octet_length(payload) = "
             "65536 AND payload_size = %d AND payload_sha256 = '\\x%s'::bytea",
             big_seq, BIG_SIZE, hex);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    print_message("900 KB message at seq %lld stored as 64 KiB + size + sha256 %s\n", big_seq, hex);
}

/* A clean log verifies: now, after a restart of the eventlog, and after a failover to a
 * standby eventlog (the active one SIGKILLed). */
static void test_clean_restart_failover(void **state)
{
    wait_anchored();
    assert_int_equal(verify(NULL, NULL), 0);
    assert_non_null(strstr(out, "chain intact: "));
    assert_null(strstr(out, "NO CHECKPOINTS"));
    assert_null(strstr(out, " matched, last at seq 0"));

    /* A restart (SIGTERM: the last head gets its checkpoint), and events after it. */
    sp_test_daemon_stop("space-eventlog", SIGTERM);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    run_cmd("echo after-restart");
    wait_anchored();
    assert_int_equal(verify(NULL, NULL), 0);

    /* A standby waits on the writer lock; the active one dies; the standby takes over. */
    char *log = sp_xasprintf("%s/log/standby-eventlog.log", sp_test_env("SPACE_HOME"));
    char *file = sp_xasprintf("%s/%s", sp_test_env("SPACE_HOME"), SP_CKPT_FILE_DEFAULT);
    char *prog = sp_xasprintf("%s/space-eventlog", getenv("SPACE_BIN_DIR"));
    pid_t standby = fork();
    assert_true(standby >= 0);
    if (standby == 0) {
        FILE *f = freopen(log, "a", stderr);
        (void)f;
        setenv("SPACE_IDENTITY", "eventlog", 1);
        execl(prog, "space-eventlog", "--checkpoint-file", file, (char *)NULL);
        _exit(127);
    }
    sleep(1);
    long long before = head();
    sp_test_daemon_kill9("space-eventlog");
    run_cmd("echo after-failover");
    wait_anchored();
    assert_true(head() > before);
    assert_int_equal(verify(NULL, NULL), 0);
    print_message("failover: the standby stored seq %lld..%lld\n", before + 1, head());
    kill(standby, SIGTERM);
    int st = 0;
    waitpid(standby, &st, 0);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    free(log);
    free(file);
    free(prog);
}

/* A copy of the live log in schema t, tampered by sql (on t.events), rehashed from seq when
 * rehash > 0, then verified. */
static void tamper(const char *what, const char *sql, long long rehash, long long want)
{
    print_message("-- tampering: %s\n", what);
    exec_sql("DROP SCHEMA IF EXISTS t CASCADE");
    exec_sql("CREATE SCHEMA t");
    exec_sql("CREATE TABLE t.events AS SELECT * FROM public.events");
    exec_sql("%s", sql);
    if (rehash > 0) {
        exec_sql("SET search_path TO t");
        sp_test_rehash(db, (uint64_t)rehash);
        exec_sql("RESET search_path");
    }
    expect_broken("t", want);
    /* Without the bus (a copy checked offline, the checkpoint file alone) it is caught too,
     * if not always at the same row: a checkpoint's window names where to look. */
    assert_int_equal(verify("t", "--wait-s 0 --nats-url ''"), 2);
}

static void test_tamperings(void **state)
{
    char sql[512];

    /* No producer left: the log and its last checkpoint stand still. */
    sp_test_daemon_stop("space-worker", SIGTERM);
    sp_test_daemon_stop("space-scheduler", SIGTERM);
    wait_anchored();
    long long h = head(), mid = h / 2;
    /* The middle row is an ordinary one (not one the other tamperings use). */
    while (mid == rejected_seq || mid == big_seq || mid == sleep_seq)
        mid++;
    print_message("log: head %lld, rejected %lld, big %lld, sleep %lld, middle %lld\n", h,
                  rejected_seq, big_seq, sleep_seq, mid);
    /* The untouched copy verifies. */
    exec_sql("DROP SCHEMA IF EXISTS t CASCADE");
    exec_sql("CREATE SCHEMA t");
    exec_sql("CREATE TABLE t.events AS SELECT * FROM public.events");
    assert_int_equal(verify("t", NULL), 0);

    snprintf(sql, sizeof(sql), "DELETE FROM t.events WHERE stream_seq > %lld", h - 3);
    tamper("1. the tail truncated", sql, 0, h - 2);

    snprintf(sql, sizeof(sql),
             "UPDATE t.events SET status = 'accepted', reject_reason = NULL WHERE stream_seq = "
             "%lld",
             rejected_seq);
    tamper("2. a rejected row flipped to accepted", sql, 0, rejected_seq);

    snprintf(sql, sizeof(sql), "DELETE FROM t.events WHERE stream_seq = %lld", mid);
    tamper("3. a middle row deleted, the chain recomputed", sql, mid, mid);

    snprintf(sql, sizeof(sql),
             "DELETE FROM t.events WHERE stream_seq = %lld; UPDATE t.events SET stream_seq = "
             "stream_seq - 1 WHERE stream_seq > %lld",
             mid, mid);
    tamper("4. a row deleted, later rows renumbered and rehashed", sql, mid, mid);

    snprintf(sql, sizeof(sql),
             "UPDATE t.events SET payload = overlay(payload placing '\\x58'::bytea from "
             "position('\\x736c656570'::bytea IN payload) for 1) WHERE stream_seq = %lld",
             sleep_seq);
    tamper("5. sleep -> Xleep, the chain recomputed", sql, sleep_seq, sleep_seq);
    assert_non_null(strstr(out, "first bad signature at stream_seq"));
    char want[64];
    snprintf(want, sizeof(want), "first bad signature at stream_seq %lld ", sleep_seq);
    assert_non_null(strstr(out, want));

    snprintf(sql, sizeof(sql), "DELETE FROM t.events WHERE stream_seq = %lld", mid);
    tamper("6. a middle row deleted", sql, 0, mid);

    snprintf(sql, sizeof(sql),
             "UPDATE t.events SET payload = set_byte(payload, 20, get_byte(payload, 20) # 1) "
             "WHERE stream_seq = %lld",
             mid);
    tamper("7. a payload byte changed", sql, 0, mid);

    snprintf(sql, sizeof(sql),
             "UPDATE t.events SET tenant = 'someone-else' WHERE stream_seq = %lld", sleep_seq);
    tamper("8. a column changed", sql, 0, sleep_seq);

    snprintf(sql, sizeof(sql),
             "UPDATE t.events SET reject_reason = 'nothing to see' WHERE stream_seq = %lld",
             rejected_seq);
    tamper("9. a reject reason rewritten", sql, 0, rejected_seq);

    exec_sql("DROP SCHEMA t CASCADE");
    /* The live log was never touched. */
    assert_int_equal(verify(NULL, NULL), 0);
}

/* The stream witness truncated: deleted (missing), then made again (shorter than the file). */
static void test_witness_truncated(void **state)
{
    long long first = 0;
    char *path = sp_xasprintf("%s/%s", sp_test_env("SPACE_HOME"), SP_CKPT_FILE_DEFAULT);
    FILE *f = fopen(path, "re");
    char line[SP_CKPT_LINE_MAX + 2], want[96];
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    first = strtoll(strstr(line, " seq=") + 5, NULL, 10);
    fclose(f);
    free(path);

    uint8_t *reply = NULL;
    size_t rlen = 0;
    assert_int_equal(
        sp_bus_request(bus, "$JS.API.STREAM.DELETE." SP_CKPT_STREAM, "", 0, 5000, &reply, &rlen),
        0);
    free(reply);
    assert_int_equal(verify(NULL, NULL), 2);
    assert_non_null(strstr(out, "witness is missing"));
    snprintf(want, sizeof(want), "witness BROKEN at stream_seq %lld:", first);
    assert_non_null(strstr(out, want));

    /* Made again (as `space up` would): the eventlog's next checkpoints go there, the older
     * ones are only in the file. A row to checkpoint: a forged event. */
    assert_int_equal(sp_bus_ensure_ckpt_stream(bus), 0);
    sp_eventgen_msg_t forged;
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                         "default", "sbx_forged2", NULL, &forged),
                     0);
    publish(forged.subject, forged.data, forged.len);
    sp_eventgen_msg_dispose(&forged);
    wait_anchored();
    sp_bus_stream_state_t st;
    assert_int_equal(sp_bus_stream_state(bus, SP_CKPT_STREAM, &st), 0);
    assert_true(st.msgs > 0);
    assert_int_equal(verify(NULL, NULL), 2);
    assert_non_null(strstr(out, "witness is truncated"));
    assert_non_null(strstr(out, want));
}

/* The stream's limits (space up gave them), and what they drop before the log stores it. */
static void test_lost_to_limits(void **state)
{
    sp_bus_stream_state_t st;
    assert_int_equal(sp_bus_stream_state(bus, SP_BUS_STREAM, &st), 0);
    assert_int_equal(st.max_age_s, SP_BUS_STREAM_MAX_AGE_S);
    assert_int_equal(st.max_bytes, SP_BUS_STREAM_MAX_BYTES);

    sp_test_daemon_stop("space-eventlog", SIGTERM);
    long long h = head();
    uint8_t *chunk = sp_xcalloc(1, 100 * 1024);
    for (int i = 0; i < 6; i++) {
        chunk[0] = (uint8_t)i;
        publish("space.ev.sbx._.sbx_flood.SandboxCreateRequested", chunk, 100 * 1024);
    }
    free(chunk);
    /* The operator lowers the limit (what a flood past the real one does): the oldest go,
     * stored or not. Only the gateway is asked for, so no daemon starts. */
    assert_int_equal(sp_test_space("up --daemons space-gateway --stream-max-bytes 300000 "
                                   ">/dev/null"),
                     0);
    assert_int_equal(sp_bus_stream_state(bus, SP_BUS_STREAM, &st), 0);
    print_message("stream after the limit: first seq %llu, last %llu; log head %lld\n",
                  (unsigned long long)st.first_seq, (unsigned long long)st.last_seq, h);
    assert_true(st.first_seq > (uint64_t)h + 1);
    /* Back to the configured limits, the eventlog started again. */
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    sp_test_expect_row(db, (uint64_t)h + 1, "rejected", SP_CHAIN_LOST_PREFIX, true);
    char want[64];
    snprintf(want, sizeof(want), "lost: %lld-%llu ", h + 1, (unsigned long long)st.first_seq - 1);
    sp_test_expect_row(db, (uint64_t)h + 1, "rejected", want, true);
    sp_test_expect_row(db, st.last_seq, "rejected", "exceeds", false);
    wait_anchored();
    assert_int_equal(verify(NULL, NULL), 0);
    assert_non_null(strstr(out, "were LOST"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_big_reject),        cmocka_unit_test(test_clean_restart_failover),
        cmocka_unit_test(test_tamperings),        cmocka_unit_test(test_lost_to_limits),
        cmocka_unit_test(test_witness_truncated),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
