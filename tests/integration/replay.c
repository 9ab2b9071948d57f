/* space-replay export, state and rebuild on a real stack (eventlog, scheduler, worker,
 * gateway), after what a user does through the HTTP API: two sandboxes, one paused and
 * resumed, the other deleted. Then what a security team would check: the export is the whole
 * log, line for line, and its filters select exactly; the state at an instant between the
 * second sandbox's create and delete shows it running, and now shows it deleted only on
 * request; a rebuild of the projections matches the live ones, and a row changed by hand is
 * named with its column and both values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "json.h"
#include "xmalloc.h"

#define OUT_MAX (16u << 20)
/* Scratch schemas left behind by a rebuild (as a format: % doubled). */
#define SCRATCH_SCHEMAS "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'replay%%'"

static int port;
static const char *key;
static PGconn *db;
static char kept[64], gone[64]; /* paused and resumed; deleted */
static char mid_time[64];       /* after gone is running, before its delete */
static long long head;          /* the log's last stream_seq after the activity */
static char *out;

static long long scalar(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static long long scalar(const char *fmt, ...)
{
    char sql[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    return sp_test_db_scalar(db, sql);
}

/* Runs space-replay; the whole stdout must fit. */
static int replay(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int replay(const char *fmt, ...)
{
    char args[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    int rc = sp_test_replay(args, out, OUT_MAX);
    assert_true(strlen(out) < OUT_MAX - 1);
    return rc;
}

static void wait_state(const char *id, const char *state)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = '%s'",
             id, state);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 1, 30000), 1);
}

static int setup(void **state)
{
    char st[64], path[128];
    sp_test_http_resp_t r;

    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    db = sp_test_db();
    out = sp_xmalloc(OUT_MAX);
    sp_test_create_sandbox(port, key, "tiny", kept);
    sp_test_create_sandbox(port, key, "tiny", gone);
    wait_state(kept, "running");
    wait_state(gone, "running");
    assert_int_equal(sp_test_lifecycle(port, key, kept, "pause", NULL, st, sizeof(st)), 200);
    assert_int_equal(sp_test_lifecycle(port, key, kept, "resume", NULL, st, sizeof(st)), 200);
    wait_state(kept, "running");
    /* An instant with the log on both sides of it. */
    usleep(300 * 1000);
    /* The database's clock: the one stored_at is read from. */
    PGresult *now = PQexec(db, "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC',"
                               " 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')");
    assert_int_equal(PQresultStatus(now), PGRES_TUPLES_OK);
    snprintf(mid_time, sizeof(mid_time), "%s", PQgetvalue(now, 0, 0));
    PQclear(now);
    usleep(300 * 1000);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", gone);
    sp_test_http(port, "DELETE", path, key, NULL, NULL, 0, &r);
    assert_int_equal(r.status, 204);
    sp_test_http_free(&r);
    wait_state(gone, "deleted");
    head = scalar("SELECT max(stream_seq) FROM events");
    return 0;
}

static int teardown(void **state)
{
    PQfinish(db);
    free(out);
    return 0;
}

/* Calls fn on each line of out (NUL-terminated in place); returns the number of lines. */
static long each_line(void (*fn)(const sp_json_t *obj, void *arg), void *arg)
{
    long n = 0;
    for (char *line = out, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        sp_json_doc_t *doc = NULL;
        char err[SP_JSON_ERR_MAX];
        sp_json_limits_t lim = {.max_bytes = 1u << 20};
        if (sp_json_parse(line, strlen(line), &lim, &doc, err) < 0)
            fail_msg("export line %ld is not JSON (%s): %.300s", n + 1, err, line);
        fn(sp_json_root(doc), arg);
        sp_json_doc_free(doc);
        n++;
    }
    return n;
}

static const char *str(const sp_json_t *o, const char *k)
{
    return sp_json_str(sp_json_get(o, k), NULL);
}

static bool is_time(const char *s)
{
    struct tm tm;
    /* 2026-11-30T11:09:00.123456Z: RFC 3339, UTC, microseconds. */
    return s && strlen(s) == 27 && strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) == s + 19 &&
           s[19] == '.' && strspn(s + 20, "0123456789") == 6 && s[26] == 'Z';
}

static bool is_hash(const char *s)
{
    return s && strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64;
}

typedef struct {
    int64_t last_seq;
    char last_hash[65];
    const char *want_sandbox, *want_type;
    int64_t min_seq, max_seq;
} walk_t;

static void check_line(const sp_json_t *o, void *arg)
{
    walk_t *w = arg;
    static const char *const keys[] = {
        "stream_seq",   "status",    "reject_reason", "event_id",    "type",      "aggregate_kind",
        "aggregate_id", "tenant",    "actor",         "occurred_at", "stored_at", "correlation_id",
        "causation_id", "prev_hash", "hash",          "payload"};
    int64_t seq;
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (!sp_json_get(o, keys[i]))
            fail_msg("export line without %s", keys[i]);
    assert_int_equal(sp_json_int(sp_json_get(o, "stream_seq"), 1, INT64_MAX, &seq), 0);
    assert_true(seq > w->last_seq);
    assert_true(seq >= w->min_seq && seq <= w->max_seq);
    assert_true(is_time(str(o, "stored_at")));
    assert_true(is_hash(str(o, "hash")) && is_hash(str(o, "prev_hash")));
    const char *status = str(o, "status");
    assert_true(strcmp(status, "accepted") == 0 || strcmp(status, "rejected") == 0);
    if (sp_json_type(sp_json_get(o, "payload")) == SP_JSON_OBJECT) {
        assert_true(is_time(str(o, "occurred_at")));
        assert_non_null(str(o, "event_id"));
        assert_non_null(str(o, "correlation_id"));
        /* The payload is the envelope the columns were taken from. */
        assert_string_equal(str(sp_json_get(o, "payload"), "event_id"), str(o, "event_id"));
    } else {
        assert_non_null(str(o, "payload_base64"));
        assert_non_null(str(o, "decode_error"));
    }
    /* Unfiltered, the lines are the chain: each one's prev_hash is the hash before it. */
    if (!w->want_sandbox && !w->want_type && w->last_hash[0])
        assert_string_equal(str(o, "prev_hash"), w->last_hash);
    if (w->want_sandbox) {
        assert_string_equal(str(o, "aggregate_kind"), "sandbox");
        assert_string_equal(str(o, "aggregate_id"), w->want_sandbox);
    }
    if (w->want_type)
        assert_string_equal(str(o, "type"), w->want_type);
    w->last_seq = seq;
    snprintf(w->last_hash, sizeof(w->last_hash), "%s", str(o, "hash"));
}

static void test_export(void **state)
{
    walk_t w = {.min_seq = 1, .max_seq = head};
    assert_int_equal(replay("export --until %lld --page 10", head), 0);
    long n = each_line(check_line, &w);
    print_message("export: %ld events through stream_seq %lld\n", n, head);
    assert_int_equal(n, scalar("SELECT count(*) FROM events WHERE stream_seq <= %lld", head));
    assert_int_equal(w.last_seq, head);

    walk_t ws = {.want_sandbox = gone, .min_seq = 1, .max_seq = INT64_MAX};
    assert_int_equal(replay("export --sandbox %s", gone), 0);
    n = each_line(check_line, &ws);
    assert_true(n >= 4);
    assert_int_equal(n, scalar("SELECT count(*) FROM events WHERE aggregate_kind = 'sandbox' AND "
                               "aggregate_id = '%s'",
                               gone));

    walk_t wt = {.want_type = "SandboxPaused", .min_seq = 1, .max_seq = INT64_MAX};
    assert_int_equal(replay("export --type SandboxPaused"), 0);
    n = each_line(check_line, &wt);
    assert_int_equal(n, 1);
    assert_int_equal(n, scalar("SELECT count(*) FROM events WHERE type = 'SandboxPaused'"));

    long long lo = head / 3 + 1, hi = 2 * head / 3;
    walk_t wr = {.min_seq = lo, .max_seq = hi, .last_seq = lo - 1};
    assert_int_equal(replay("export --since %lld --until %lld", lo, hi), 0);
    n = each_line(check_line, &wr);
    assert_true(n > 0);
    assert_int_equal(n, scalar("SELECT count(*) FROM events WHERE stream_seq BETWEEN %lld AND "
                               "%lld",
                               lo, hi));

    assert_int_equal(replay("export --since abc"), 1);
    assert_int_equal(replay("export --since -1"), 1);
    assert_int_equal(replay("export --sandbox 'sbx x;'"), 1);
    assert_int_equal(replay("export --type NoSuchEvent"), 1);
    assert_int_equal(replay("export --since 9 --until 3"), 1);
    assert_string_equal(out, "");
}

/* The line of sandbox id in a state listing, copied into line; false if absent. */
static bool state_line(const char *id, char *line, size_t len)
{
    const char *p = strstr(out, id);
    if (!p)
        return false;
    size_t n = strcspn(p, "\n");
    snprintf(line, len, "%.*s", (int)n, p);
    return true;
}

static void test_state(void **state)
{
    char line[512], at_time[8192];

    assert_int_equal(replay("state --at %s", mid_time), 0);
    snprintf(at_time, sizeof(at_time), "%s", out);
    print_message("state at %s:\n%s", mid_time, out);
    assert_true(state_line(gone, line, sizeof(line)));
    assert_non_null(strstr(line, " running "));
    assert_true(state_line(kept, line, sizeof(line)));
    assert_non_null(strstr(line, " running "));

    /* The same instant as a stream sequence: the same answer. */
    long long seq = scalar("SELECT max(stream_seq) FROM events WHERE stored_at <= '%s'", mid_time);
    assert_int_equal(replay("state --at-seq %lld", seq), 0);
    assert_string_equal(out, at_time);
    /* One event earlier is another instant (the header names it). */
    assert_int_equal(replay("state --at-seq %lld", seq - 1), 0);
    assert_string_not_equal(out, at_time);

    assert_int_equal(replay("state --at now"), 0);
    assert_false(state_line(gone, line, sizeof(line)));
    assert_true(state_line(kept, line, sizeof(line)));
    assert_non_null(strstr(line, " running "));
    assert_int_equal(replay("state --at now --all"), 0);
    assert_true(state_line(gone, line, sizeof(line)));
    assert_non_null(strstr(line, " deleted "));

    assert_int_equal(replay("state --at now --json --all --sandbox %s", gone), 0);
    assert_non_null(strstr(out, "\"state\":\"deleted\""));
    assert_null(strstr(out, kept));

    assert_int_equal(replay("state"), 1);
    assert_int_equal(replay("state --at yesterday"), 1);
    assert_int_equal(replay("state --at 2026-02-30T00:00:00Z"), 1);
    assert_int_equal(replay("state --at now --at-seq 3"), 1);
    assert_int_equal(replay("state --at now --since 3"), 1);
}

static void test_rebuild(void **state)
{
    char want[256];

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(replay("rebuild"), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    print_message("%s(%.0f ms)\n", out,
                  (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    assert_non_null(strstr(out, " 0 differences"));
    assert_int_equal(scalar(SCRATCH_SCHEMAS), 0);

    /* Tamper with a live projection row. */
    snprintf(want, sizeof(want), "UPDATE sandboxes SET state = 'paused' WHERE id = '%s'", kept);
    PQclear(PQexec(db, want));
    assert_int_equal(replay("rebuild"), 3);
    print_message("%s", out);
    snprintf(want, sizeof(want),
             "differs: table=sandboxes key=\"%s\" column=state live=\"paused\" "
             "rebuilt=\"running\"",
             kept);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, " 1 difference "));
    assert_int_equal(scalar(SCRATCH_SCHEMAS), 0);

    /* --keep leaves the scratch schema to look at; JSON names the same difference. */
    assert_int_equal(replay("rebuild --schema replay_kept --keep --json"), 3);
    snprintf(want, sizeof(want),
             "{\"table\":\"sandboxes\",\"key\":\"%s\",\"column\":\"state\",\"live\":\"paused\","
             "\"rebuilt\":\"running\"}",
             kept);
    assert_non_null(strstr(out, want));
    assert_int_equal(scalar("SELECT count(*) FROM replay_kept.sandboxes WHERE id = '%s' AND "
                            "state = 'running'",
                            kept),
                     1);
    /* An existing schema is never written into. */
    assert_int_equal(replay("rebuild --schema replay_kept"), 1);
    PQclear(PQexec(db, "DROP SCHEMA replay_kept CASCADE"));

    snprintf(want, sizeof(want), "UPDATE sandboxes SET state = 'running' WHERE id = '%s'", kept);
    PQclear(PQexec(db, want));
    assert_int_equal(replay("rebuild"), 0);

    /* A row the log never made. */
    PQclear(PQexec(db, "INSERT INTO sandboxes (id, tenant, template, state, version, last_seq)"
                       " VALUES ('sbx_forged', 't', 'tiny', 'running', 1, 1)"));
    assert_int_equal(replay("rebuild"), 3);
    assert_non_null(strstr(out, "key=\"sbx_forged\" column=(row) live=\"present\" rebuilt=null"));
    PQclear(PQexec(db, "DELETE FROM sandboxes WHERE id = 'sbx_forged'"));
    assert_int_equal(replay("rebuild"), 0);

    assert_int_equal(replay("rebuild --schema public"), 1);
    assert_int_equal(replay("rebuild --schema 'x; DROP TABLE events'"), 1);
    assert_int_equal(scalar("SELECT count(*) FROM pg_tables WHERE tablename = 'events'"), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export),
        cmocka_unit_test(test_state),
        cmocka_unit_test(test_rebuild),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
