/* Nothing secret in the log, and a way to forget (docs/audit.md), on a real stack (eventlog,
 * scheduler, worker with --seal-output, credstore, egressd, gateway). A sandbox is given a
 * secret env value; a command prints it whole, and once more split across two writes (two
 * chunks of output). What a security team would check:
 *   - the value is in no row of events in any encoding (raw bytes of every column, base64 at
 *     the three alignments, hex both cases) and in no message of the event stream;
 *   - the recorded output is sealed: timeline shows "<encrypted N bytes>";
 *   - timeline --decrypt and export --decrypt (the master key) show the output, the value
 *     replaced by [redacted:API_SECRET] both times;
 *   - the data key lives wrapped in data_keys (not the value, not the raw key);
 *   - after space-replay forget --sandbox, --decrypt reads "<forgotten: ...>", never the text,
 *     and verify still passes (the chain covers the ciphertext).
 * Command lines too (docs/audit.md, "Sealed command lines"): a second secret typed literally
 * into two commands (cmd and argv forms) is in no row and no stream message either; the
 * intents say sealed, the timeline shows "<encrypted N bytes>" for each CommandStarted's line
 * and, with --decrypt, the lines as typed; after forget, "<forgotten: ...>". And the event log
 * of a sealing deployment refuses plaintext output and command lines that a worker or gateway
 * key signed (stored rejected with the reason). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "b64.h"
#include "buf.h"
#include "bus.h"
#include "envelope.h"
#include "harness.h"
#include "ids.h"
#include "xmalloc.h"

#define OUT_MAX (8u << 20)

static int port;
static const char *key;
static PGconn *db;
static char sbx[64];
static char secret[64];
static char typed[64]; /* typed into command lines, never in an env */
static char *out;

/* Every encoding of a secret a store could hold it in: the env value's (set 0) and the typed
 * one's (set 1). */
#define ENCODINGS 6
static sp_buf_t needles[2][ENCODINGS];
static size_t n_needles[2];

static void add_needle(int set, const void *p, size_t n)
{
    sp_buf_init(&needles[set][n_needles[set]]);
    sp_buf_append(&needles[set][n_needles[set]++], p, n);
}

static void make_needles(int set, const char *value)
{
    size_t n = strlen(value);
    add_needle(set, value, n);
    /* base64 at the three alignments: the middle of each encoding is fixed whatever precedes. */
    for (size_t shift = 0; shift < 3; shift++) {
        uint8_t tmp[96];
        memset(tmp, 'A', shift);
        for (size_t i = 0; i < n; i++)
            tmp[shift + i] = (uint8_t)value[i];
        sp_buf_t b;
        sp_buf_init(&b);
        sp_b64_encode(&b, tmp, shift + n);
        /* Skip the characters that mix in the prefix, and the last 4 (padding). */
        size_t from = (shift * 4 + 2) / 3 + 2, to = b.len - 4;
        add_needle(set, b.data + from, to - from);
        sp_buf_dispose(&b);
    }
    char hex[160], HEX[160];
    for (size_t i = 0; i < n; i++) {
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)value[i]);
        snprintf(HEX + 2 * i, 3, "%02X", (unsigned char)value[i]);
    }
    add_needle(set, hex, 2 * n);
    add_needle(set, HEX, 2 * n);
}

static const char *found_in_set(int set, const void *p, size_t n)
{
    static const char *names[2][ENCODINGS] = {
        {"raw", "base64+0", "base64+1", "base64+2", "hex", "HEX"},
        {"typed raw", "typed base64+0", "typed base64+1", "typed base64+2", "typed hex",
         "typed HEX"},
    };
    for (size_t i = 0; i < n_needles[set]; i++)
        if (memmem(p, n, needles[set][i].data, needles[set][i].len))
            return names[set][i];
    return NULL;
}

/* The env value. */
static const char *found_in(const void *p, size_t n)
{
    return found_in_set(0, p, n);
}

/* Either secret: what the stores must hold of neither. */
static const char *found_any(const void *p, size_t n)
{
    const char *how = found_in_set(0, p, n);
    return how ? how : found_in_set(1, p, n);
}

static int replay(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int replay(const char *fmt, ...)
{
    char args[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    return sp_test_replay(args, out, OUT_MAX);
}

static long count(const char *hay, const char *needle)
{
    long n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* /v1/sandboxes/<sbx><route>[?path=<path>] */
static const char *files_path(char *buf, size_t len, const char *route, const char *path)
{
    snprintf(buf, len, "/v1/sandboxes/%s%s%s%s", sbx, route, path ? "?path=" : "",
             path ? path : "");
    return buf;
}

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    db = sp_test_db();
    out = sp_xmalloc(OUT_MAX);
    uint8_t rnd[12];
    sp_random_bytes(rnd, sizeof(rnd));
    int at = snprintf(secret, sizeof(secret), "sekret-");
    for (size_t i = 0; i < sizeof(rnd); i++)
        at += snprintf(secret + at, sizeof(secret) - (size_t)at, "%02x", rnd[i]);
    make_needles(0, secret);
    sp_random_bytes(rnd, sizeof(rnd));
    at = snprintf(typed, sizeof(typed), "typed-");
    for (size_t i = 0; i < sizeof(rnd); i++)
        at += snprintf(typed + at, sizeof(typed) - (size_t)at, "%02x", rnd[i]);
    make_needles(1, typed);

    char body[512];
    snprintf(body, sizeof(body), "{\"template\":\"tiny\",\"env\":{\"API_SECRET\":\"%s\"}}", secret);
    sp_test_create_sandbox_body(port, key, body, sbx);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = "
             "'running'",
             sbx);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 1, 60000), 1);

    /* Whole, then split over two writes 300 ms apart (two chunks for the worker). */
    sp_test_cmd_t r = sp_test_run(port, key, sbx,
                                  "{\"cmd\":\"echo \\\"start $API_SECRET end\\\"; "
                                  "v=$API_SECRET; h=${v%????????}; printf 'split %s' \\\"$h\\\"; "
                                  "sleep 0.3; printf '%s done\\\\n' \\\"${v#$h}\\\"\"}");
    assert_int_equal(r.status, 200);
    assert_int_equal(r.exit_code, 0);
    /* The caller itself gets what the command printed: only the log is redacted. */
    assert_non_null(strstr(r.stdout_s, secret));
    sp_test_cmd_free(&r);
    /* The typed secret, in both forms of a command line; neither prints it. */
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "{\"cmd\":\"test -n %s && echo typed-ok\"}", typed);
    r = sp_test_run(port, key, sbx, cmd);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(r.stdout_s, "typed-ok\n");
    sp_test_cmd_free(&r);
    snprintf(cmd, sizeof(cmd), "{\"argv\":[\"/bin/sh\",\"-c\",\"true %s\"]}", typed);
    r = sp_test_run(port, key, sbx, cmd);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.exit_code, 0);
    sp_test_cmd_free(&r);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = 'CommandExited'",
             sbx);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 3, 20000), 3);

    /* And in file paths: mkdir, upload, move, remove, each a file event. */
    char path[512], body2[512];
    sp_test_http_resp_t h;
    snprintf(body2, sizeof(body2), "{\"path\":\"/tmp/%s\"}", typed);
    sp_test_http(port, "POST", files_path(path, sizeof(path), "/files/mkdir", NULL), key, NULL,
                 body2, strlen(body2), &h);
    assert_int_equal(h.status, 201);
    sp_test_http_free(&h);
    snprintf(body2, sizeof(body2), "/tmp/%s/a.txt", typed);
    sp_test_http(port, "PUT", files_path(path, sizeof(path), "/files", body2), key, NULL, "hello",
                 5, &h);
    assert_int_equal(h.status, 200);
    sp_test_http_free(&h);
    snprintf(body2, sizeof(body2), "{\"from\":\"/tmp/%s/a.txt\",\"to\":\"/tmp/%s/b.txt\"}", typed,
             typed);
    sp_test_http(port, "POST", files_path(path, sizeof(path), "/files/move", NULL), key, NULL,
                 body2, strlen(body2), &h);
    assert_int_equal(h.status, 200);
    sp_test_http_free(&h);
    snprintf(body2, sizeof(body2), "/tmp/%s/b.txt", typed);
    sp_test_http(port, "DELETE", files_path(path, sizeof(path), "/files", body2), key, NULL, NULL,
                 0, &h);
    assert_int_equal(h.status, 204);
    sp_test_http_free(&h);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type IN ('DirCreated', "
             "'FileWritten', 'FileMoved', 'FileRemoved')",
             sbx);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 4, 20000), 4);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    PQfinish(db);
    free(out);
    for (int set = 0; set < 2; set++)
        for (size_t i = 0; i < n_needles[set]; i++)
            sp_buf_dispose(&needles[set][i]);
    return 0;
}

/* Every column of every row, as bytes (binary payload) and as text (the row's text form holds
 * bytea as hex). */
static void test_no_row_holds_the_value(void **state)
{
    (void)state;
    PGresult *r = PQexecParams(db, "SELECT payload FROM events", 0, NULL, NULL, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_true(PQntuples(r) > 5);
    for (int i = 0; i < PQntuples(r); i++) {
        const char *how = found_any(PQgetvalue(r, i, 0), (size_t)PQgetlength(r, i, 0));
        if (how)
            fail_msg("events row %d's payload holds the secret (%s)", i, how);
    }
    PQclear(r);
    r = PQexec(db, "SELECT e::text FROM events e");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    for (int i = 0; i < PQntuples(r); i++) {
        const char *how = found_any(PQgetvalue(r, i, 0), (size_t)PQgetlength(r, i, 0));
        if (how)
            fail_msg("events row %d holds the secret (%s)", i, how);
    }
    PQclear(r);
    /* Neither the projections of sandboxes nor the data key rows. */
    r = PQexec(db, "SELECT s::text FROM sandboxes s UNION ALL SELECT d::text FROM data_keys d");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    for (int i = 0; i < PQntuples(r); i++)
        assert_null(found_any(PQgetvalue(r, i, 0), (size_t)PQgetlength(r, i, 0)));
    PQclear(r);
    /* The recorded output is sealed: CommandOutput rows exist, none with plaintext. */
    assert_int_equal(replay("export --sandbox %s --type CommandOutput", sbx), 0);
    assert_true(count(out, "\"ciphertext\":\"") >= 2);
    assert_true(count(out, "<encrypted ") >= 2);
}

static void test_no_stream_message_holds_the_value(void **state)
{
    (void)state;
    sp_bus_t *bus = sp_test_bus();
    long long last = sp_test_db_scalar(db, "SELECT max(stream_seq) FROM events");
    long long seen = 0;
    for (long long seq = 1; seq <= last; seq++) {
        uint8_t *data = NULL;
        size_t len = 0;
        if (sp_bus_get_msg(bus, (uint64_t)seq, NULL, &data, &len, NULL) < 0)
            continue;
        seen++;
        const char *how = found_any(data, len);
        free(data);
        if (how)
            fail_msg("stream message %lld holds the secret (%s)", seq, how);
    }
    assert_true(seen > 5);
}

static void test_decrypt_shows_redacted_output(void **state)
{
    (void)state;
    assert_int_equal(replay("timeline --sandbox %s", sbx), 0);
    assert_true(count(out, "output=\"<encrypted ") >= 2);
    assert_null(strstr(out, "redacted"));
    assert_int_equal(replay("timeline --sandbox %s --decrypt", sbx), 0);
    assert_null(found_in(out, strlen(out)));
    assert_non_null(strstr(out, "start [redacted:API_SECRET] end"));
    assert_non_null(strstr(out, "[redacted:API_SECRET] done"));
    assert_int_equal(count(out, "[redacted:API_SECRET]"), 2);
    assert_null(strstr(out, "<encrypted"));
    assert_int_equal(replay("export --sandbox %s --decrypt", sbx), 0);
    assert_null(found_in(out, strlen(out)));
    assert_int_equal(count(out, "[redacted:API_SECRET]"), 2);
    /* A wrong master key opens nothing. */
    char kf[200];
    snprintf(kf, sizeof(kf), "%s/other.key", sp_test_env("SPACE_HOME"));
    unlink(kf);
    uint8_t other[32];
    sp_random_bytes(other, sizeof(other));
    int fd = open(kf, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, other, sizeof(other)), (ssize_t)sizeof(other));
    close(fd);
    assert_int_equal(replay("timeline --sandbox %s --decrypt --master-key-file %s", sbx, kf), 0);
    assert_null(strstr(out, "redacted"));
    assert_true(count(out, "<does not open: ") >= 2);
    unlink(kf);
}

/* A master key rotation while serving re-wraps the data keys with the credentials: the
 * output still opens with the new key, and no data key is left under the old one. */
static void test_rotation_keeps_output_readable(void **state)
{
    (void)state;
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM data_keys d JOIN credstore_keys k ON k.key_id = "
             "d.master_key_id WHERE d.sandbox_id = '%s'",
             sbx);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    long long before = sp_test_db_scalar(db, "SELECT count(DISTINCT master_key_id) FROM data_keys "
                                             "WHERE wrapped IS NOT NULL");
    assert_int_equal(before, 1);
    assert_int_equal(sp_test_space("creds rotate-master >/dev/null"), 0);
    /* Under the new key (the only one credstore keeps), and still readable. */
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    assert_int_equal(sp_test_db_scalar(db, "SELECT count(*) FROM credstore_keys"), 1);
    assert_int_equal(replay("timeline --sandbox %s --decrypt", sbx), 0);
    assert_int_equal(count(out, "[redacted:API_SECRET]"), 2);
    assert_null(strstr(out, "<does not open"));
}

static void test_forget(void **state)
{
    (void)state;
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM data_keys WHERE sandbox_id = '%s' AND wrapped IS NOT NULL", sbx);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);
    assert_int_equal(replay("forget --sandbox %s", sbx), 0);
    assert_non_null(strstr(out, sbx));
    assert_int_equal(sp_test_db_scalar(db, sql), 0);
    assert_int_equal(replay("timeline --sandbox %s --decrypt", sbx), 0);
    assert_null(strstr(out, "redacted"));
    assert_null(strstr(out, "start [redacted"));
    assert_true(count(out, "output=\"<forgotten: ") >= 2);
    assert_int_equal(count(out, "cmdline=\"<forgotten: "), 3);
    assert_int_equal(count(out, "paths=\"<forgotten: "), 4);
    assert_null(found_any(out, strlen(out)));
    assert_int_equal(replay("verify"), 0);
    /* Bad input: both selectors, neither, a hostile id. */
    assert_int_equal(replay("forget --sandbox %s --tenant t", sbx), 1);
    assert_int_equal(replay("forget"), 1);
    assert_int_equal(replay("forget --sandbox \"x';--\""), 1);
    assert_int_equal(replay("forget --sandbox nosuchsandbox"), 1);
}

/* The intents carry no line; each CommandStarted carries it sealed (a short command's inside
 * its CommandExited), opened by the master key as typed (a cmd as a string, argv as an
 * array). */
static void test_command_lines_sealed(void **state)
{
    (void)state;
    assert_int_equal(replay("export --sandbox %s --type CommandRequested", sbx), 0);
    assert_int_equal(count(out, "\"sealed\":true"), 3);
    assert_null(strstr(out, "\"argv\":[\""));
    assert_null(strstr(out, "test -n"));
    assert_int_equal(replay("timeline --sandbox %s", sbx), 0);
    assert_int_equal(count(out, "cmdline=\"<encrypted "), 3);
    assert_null(found_any(out, strlen(out)));
    assert_int_equal(replay("timeline --sandbox %s --decrypt", sbx), 0);
    char want[256];
    snprintf(want, sizeof(want), "cmdline=\"test -n %s && echo typed-ok\"", typed);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof(want), "cmdline=[\"/bin/sh\",\"-c\",\"true %s\"]", typed);
    assert_non_null(strstr(out, want));
    assert_null(strstr(out, "cmdline=\"<"));
    /* In CommandStarted, or inside the CommandExited of a command that ended before its start
     * was recorded (typed-ok's, as a rule: then with its output, which opens too). */
    assert_int_equal(replay("export --sandbox %s --type CommandStarted --decrypt", sbx), 0);
    long lines = count(out, "\"cmdline\":"), typed_n = count(out, typed);
    assert_int_equal(replay("export --sandbox %s --type CommandExited --decrypt", sbx), 0);
    lines += count(out, "\"cmdline\":");
    typed_n += count(out, typed);
    assert_int_equal(lines, 3);
    assert_int_equal(typed_n, 2);
    if (strstr(out, "&& echo typed-ok\""))
        assert_non_null(strstr(out, "\"output\":[\"typed-ok\\n\"]"));
}

/* The file events carry no path in the clear: sealed, shown "<encrypted N bytes>", opened by
 * the master key (a move with both paths). */
static void test_file_paths_sealed(void **state)
{
    (void)state;
    assert_int_equal(replay("timeline --sandbox %s", sbx), 0);
    assert_int_equal(count(out, "paths=\"<encrypted "), 4);
    assert_null(found_any(out, strlen(out)));
    assert_int_equal(replay("timeline --sandbox %s --decrypt", sbx), 0);
    char want[256];
    snprintf(want, sizeof(want), "paths={\"path\":\"/tmp/%s\"}", typed);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof(want), "paths={\"path\":\"/tmp/%s/a.txt\",\"to\":\"/tmp/%s/b.txt\"}",
             typed, typed);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof(want), "paths={\"path\":\"/tmp/%s/b.txt\"}", typed);
    assert_non_null(strstr(out, want));
    assert_null(strstr(out, "paths=\"<"));
}

/* Signs env as the daemon whose role it is (sp_test_sign), publishes it on its subject and
 * returns the stream sequence. */
static uint64_t publish_signed(sp_envelope_t *env, const char *worker)
{
    char id[37], subject[256];
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t seq = 0;
    sp_envelope_stamp(env, id);
    assert_int_equal(sp_envelope_encode(env, &buf, &len), 0);
    assert_true(sp_envelope_subject(env, worker, subject, sizeof(subject)) > 0);
    assert_int_equal(sp_test_sign(subject, &buf, &len), 0);
    assert_int_equal(sp_bus_publish(sp_test_bus(), subject, buf, len, id, &seq, NULL), 0);
    free(buf);
    return seq;
}

/* A deployment that seals (space up with credstore: seal-output on the event log too) refuses
 * plaintext output and command lines, even signed by the very worker and gateway that would
 * emit them: a worker or gateway run without sealing cannot put them into the log. */
static void test_plaintext_refused(void **state)
{
    (void)state;
    char sql[256], worker[128], tenant[128];
    snprintf(sql, sizeof(sql), "SELECT worker, tenant FROM sandboxes WHERE id = '%s'", sbx);
    PGresult *r = PQexec(db, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 1);
    snprintf(worker, sizeof(worker), "%s", PQgetvalue(r, 0, 0));
    snprintf(tenant, sizeof(tenant), "%s", PQgetvalue(r, 0, 1));
    PQclear(r);

    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    agg.kind = "sandbox";
    agg.id = sbx;
    env.aggregate = &agg;
    env.tenant = tenant;
    env.actor = "test";
    env.correlation_id = "plaintext-refused";

    Space__V1__CommandOutput o = SPACE__V1__COMMAND_OUTPUT__INIT;
    o.cmd_id = "cmd_plaintext";
    o.stream = 1;
    o.data.data = (uint8_t *)"plain output\n";
    o.data.len = 13;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT;
    env.command_output = &o;
    uint64_t seq = publish_signed(&env, worker);
    sp_test_expect_row(db, seq, "rejected", "plaintext command output", true);

    Space__V1__CommandRequested cr = SPACE__V1__COMMAND_REQUESTED__INIT;
    cr.cmd_id = "cmd_plainline";
    cr.cmd = "echo plain";
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED;
    env.command_requested = &cr;
    seq = publish_signed(&env, worker);
    sp_test_expect_row(db, seq, "rejected", "plaintext command line", true);

    Space__V1__DirCreated dc = SPACE__V1__DIR_CREATED__INIT;
    dc.path = "/tmp/plain-dir";
    dc.user = "root";
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_DIR_CREATED;
    env.dir_created = &dc;
    seq = publish_signed(&env, worker);
    sp_test_expect_row(db, seq, "rejected", "plaintext file path", true);

    /* The same intent sealed passes that check (and is accepted: the gateway may say it). */
    cr.cmd_id = "cmd_sealedline";
    cr.cmd = "";
    cr.sealed = true;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED;
    env.command_requested = &cr;
    seq = publish_signed(&env, worker);
    sp_test_expect_row(db, seq, "accepted", "", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_row_holds_the_value),
        cmocka_unit_test(test_no_stream_message_holds_the_value),
        cmocka_unit_test(test_decrypt_shows_redacted_output),
        cmocka_unit_test(test_command_lines_sealed),
        cmocka_unit_test(test_file_paths_sealed),
        cmocka_unit_test(test_plaintext_refused),
        cmocka_unit_test(test_rotation_keeps_output_readable),
        cmocka_unit_test(test_forget),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
