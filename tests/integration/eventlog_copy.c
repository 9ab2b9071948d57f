/* The event log's binary COPY (eventlog/eventlog_store.c, lib/pgcopy.c) against a real
 * PostgreSQL: rows with every field at its limits (empty, NULL, the longest each column gets,
 * non-ASCII text and the characters the text format had to escape, payloads holding every
 * byte 0x00..0xff, timestamps on both sides of PostgreSQL's 2000 epoch) read back through
 * libpq byte for byte as they were given, and a value a column cannot hold fails its row
 * without leaving a partial one in the buffer.
 *
 * The rows go through the eventlog's own copy_row and copy_in into a temporary table named
 * events: temporary tables come first in the search path, so the statement copy_in sends lands
 * there and the running log's table is untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../eventlog/eventlog_store.c"  /* NOLINT(bugprone-suspicious-include) */
#include "../../eventlog/eventlog_verify.c" /* NOLINT(bugprone-suspicious-include) */
#include "harness.h"

#define UUID_UPPER "0190F5A2-7B3C-7D4E-8F60-ABCDEFABCDEF"
#define UUID_LOWER "0190f5a2-7b3c-7d4e-8f60-abcdefabcdef"
#define CAUSE      "00000000-0000-0000-0000-000000000000"
/* 2020-01-01 and 2100-01-01, the bounds sp_envelope_validate allows for occurred_at. */
#define TIME_MIN 1577836800000000LL
#define TIME_MAX 4102444800000000LL

static PGconn *db;

/* n bytes of text: a pattern of 1-, 2-, 3- and 4-byte UTF-8 characters and the characters
 * the text COPY escaped (backslash, tab, newline, carriage return), cut at a character. */
static char *text_of(size_t n)
{
    static const char *const parts[] = {"a", "\\", "\t", "\n", "\r", "é", "日", "🚀", "\"'", " "};
    char *s = sp_xmalloc(n + 1);
    size_t len = 0;
    for (size_t i = 0;; i++) {
        const char *p = parts[i % (sizeof(parts) / sizeof(parts[0]))];
        size_t pl = strlen(p);
        if (len + pl > n)
            break;
        memcpy(s + len, p, pl);
        len += pl;
    }
    while (len < n)
        s[len++] = 'z';
    s[len] = '\0';
    return s;
}

/* Every byte value, repeated: 0x00..0xff, 0x00..0xff, ... */
static uint8_t *bytes_of(size_t n)
{
    uint8_t *b = sp_xmalloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)i;
    return b;
}

static PGresult *read_rows(void)
{
    /* Binary results: text columns arrive as their bytes, bytea as its bytes; the rest is cast
     * to text so the comparison does not lean on this file's own binary encoders. */
    PGresult *r = PQexecParams(
        db,
        "SELECT stream_seq::text AS stream_seq, event_id::text AS event_id, subject, type,"
        " aggregate_kind, aggregate_id, tenant, actor,"
        " (extract(epoch FROM occurred_at) * 1000000)::bigint::text AS occurred_at,"
        " (extract(epoch FROM published_at) * 1000000)::bigint::text AS published_at,"
        " correlation_id, causation_id::text AS causation_id,"
        " schema_version::text AS schema_version, status, reject_reason, payload, prev_hash,"
        " hash, chain_v::text AS chain_v, payload_size::text AS payload_size, payload_sha256"
        " FROM pg_temp.events ORDER BY events.stream_seq",
        0, NULL, NULL, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    return r;
}

static void expect_null(const PGresult *r, int row, int col)
{
    if (!PQgetisnull(r, row, col))
        fail_msg("row %d column %s: want NULL", row, PQfname(r, col));
}

static void expect_bytes(const PGresult *r, int row, int col, const void *want, size_t len)
{
    if (PQgetisnull(r, row, col))
        fail_msg("row %d column %s: NULL, want %zu bytes", row, PQfname(r, col), len);
    size_t got = (size_t)PQgetlength(r, row, col);
    if (got != len || (len && memcmp(PQgetvalue(r, row, col), want, len) != 0))
        fail_msg("row %d column %s: %zu bytes differ from the %zu given", row, PQfname(r, col), got,
                 len);
}

static void expect_text(const PGresult *r, int row, int col, const char *want)
{
    expect_bytes(r, row, col, want, strlen(want));
}

static void expect_i64(const PGresult *r, int row, int col, long long want)
{
    char s[32];
    snprintf(s, sizeof(s), "%lld", want);
    expect_text(r, row, col, s);
}

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    db = sp_test_db();
    PGresult *r = PQexec(db, "CREATE TEMP TABLE events (LIKE public.events INCLUDING DEFAULTS"
                             " INCLUDING CONSTRAINTS)");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    PQfinish(db);
    return 0;
}

static void test_limits_read_back(void **state)
{
    (void)state;
    char *subject = text_of(1024), *longid = text_of(64), *actor = text_of(128);
    char *corr = text_of(128), *reason = text_of(SP_REASON_MAX - 1);
    size_t big = SP_ENVELOPE_MAX, over = SP_CHAIN_PAYLOAD_KEEP + 1000;
    uint8_t *payload = bytes_of(over);
    uint8_t head[SP_SHA256_LEN], want_prev[4][SP_SHA256_LEN], want_hash[4][SP_SHA256_LEN];
    uint8_t digest[SP_SHA256_LEN];
    sp_buf_t rows, tmp, want_subject, want_reason;

    /* The subject and a reason are stored as safe text (control characters as \xNN). */
    sp_buf_init(&want_subject);
    sp_buf_init(&want_reason);
    sp_buf_safe_text(&want_subject, subject, 1024);
    sp_buf_safe_text(&want_reason, reason, SP_REASON_MAX);
    assert_true(want_subject.len >= 1000);
    assert_non_null(strstr(want_reason.data, "é日🚀"));

    /* Row 1: accepted, every envelope text at its longest, non-ASCII, upper-case ids. */
    Space__V1__Aggregate agg1 = SPACE__V1__AGGREGATE__INIT;
    agg1.kind = longid;
    agg1.id = longid;
    Space__V1__Envelope e1 = SPACE__V1__ENVELOPE__INIT;
    e1.event_id = UUID_UPPER;
    e1.type = longid;
    e1.aggregate = &agg1;
    e1.tenant = longid;
    e1.actor = actor;
    e1.occurred_at_us = TIME_MAX;
    e1.correlation_id = corr;
    e1.causation_id = CAUSE;
    e1.schema_version = INT32_MAX;
    /* Row 2: accepted, every optional text empty (stored NULL; tenant and correlation_id stay
     * empty strings), an empty payload, times before PostgreSQL's 2000 epoch. */
    Space__V1__Aggregate agg2 = SPACE__V1__AGGREGATE__INIT;
    agg2.kind = "";
    agg2.id = "";
    Space__V1__Envelope e2 = SPACE__V1__ENVELOPE__INIT;
    e2.event_id = "";
    e2.type = "";
    e2.aggregate = &agg2;
    e2.tenant = "";
    e2.actor = "";
    e2.occurred_at_us = TIME_MIN;
    e2.correlation_id = "";
    e2.causation_id = "";
    e2.schema_version = 0;

    const row_t in[4] = {
        {.seq = 1,
         .subject = subject,
         .env = &e1,
         .published_us = TIME_MAX + 999999,
         .accepted = 1,
         .data = payload,
         .len = big},
        {.seq = 2,
         .subject = "",
         .env = &e2,
         .published_us = 0,
         .accepted = 1,
         .data = payload,
         .len = 0},
        /* Rejected and over the kept size: cut, with its size and digest; the longest reason. */
        {.seq = 3,
         .subject = "a.b",
         .env = NULL,
         .published_us = -1,
         .accepted = 0,
         .reason = reason,
         .data = payload,
         .len = over},
        /* Undecodable from the network: the subject's invalid UTF-8 is stored as safe text. */
        {.seq = (uint64_t)INT64_MAX,
         .subject = "x.\xff\x01.y",
         .env = NULL,
         .published_us = 1,
         .accepted = 0,
         .reason = "",
         .data = payload,
         .len = 256},
    };

    sp_buf_init(&rows);
    sp_buf_init(&tmp);
    memcpy(head, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    for (int i = 0; i < 4; i++) {
        memcpy(want_prev[i], head, SP_SHA256_LEN);
        assert_int_equal(copy_row(&rows, &tmp, &in[i], head), 0);
        memcpy(want_hash[i], head, SP_SHA256_LEN);
    }
    assert_int_equal(begin_copy_in(db, &rows), 0);
    assert_int_equal(sp_db_exec(db, "COMMIT"), 0);

    PGresult *r = read_rows();
    assert_int_equal(PQntuples(r), 4);

    expect_i64(r, 0, 0, 1);
    expect_text(r, 0, 1, UUID_LOWER);
    expect_bytes(r, 0, 2, want_subject.data, want_subject.len);
    for (int c = 3; c <= 6; c++)
        expect_text(r, 0, c, longid);
    expect_text(r, 0, 7, actor);
    expect_i64(r, 0, 8, TIME_MAX);
    expect_i64(r, 0, 9, TIME_MAX + 999999);
    expect_text(r, 0, 10, corr);
    expect_text(r, 0, 11, CAUSE);
    expect_i64(r, 0, 12, INT32_MAX);
    expect_text(r, 0, 13, "accepted");
    expect_null(r, 0, 14);
    expect_bytes(r, 0, 15, payload, big);
    expect_null(r, 0, 19);
    expect_null(r, 0, 20);

    expect_i64(r, 1, 0, 2);
    expect_null(r, 1, 1); /* event_id, type, aggregate kind and id */
    expect_text(r, 1, 2, "");
    expect_null(r, 1, 3);
    expect_null(r, 1, 4);
    expect_null(r, 1, 5);
    expect_text(r, 1, 6, "");
    expect_null(r, 1, 7);
    expect_i64(r, 1, 8, TIME_MIN);
    expect_i64(r, 1, 9, 0);
    expect_text(r, 1, 10, "");
    expect_null(r, 1, 11);
    expect_i64(r, 1, 12, 0);
    expect_bytes(r, 1, 15, "", 0);

    expect_i64(r, 2, 0, 3);
    for (int c = 1; c <= 12; c++)
        if (c != 2 && c != 9 && c != 10)
            expect_null(r, 2, c);
    expect_text(r, 2, 2, "a.b");
    expect_i64(r, 2, 9, -1);
    expect_text(r, 2, 13, "rejected");
    expect_bytes(r, 2, 14, want_reason.data, want_reason.len);
    expect_bytes(r, 2, 15, payload, SP_CHAIN_PAYLOAD_KEEP);
    expect_i64(r, 2, 19, (long long)over);
    sp_sha256(payload, over, digest);
    expect_bytes(r, 2, 20, digest, SP_SHA256_LEN);

    expect_i64(r, 3, 0, INT64_MAX);
    expect_text(r, 3, 2, "x.\\xff\\x01.y");
    expect_text(r, 3, 14, "");
    expect_bytes(r, 3, 15, payload, 256);

    /* The chain as copy_row computed it, each row's prev_hash its predecessor's hash. */
    for (int i = 0; i < 4; i++) {
        expect_bytes(r, i, 16, want_prev[i], SP_SHA256_LEN);
        expect_bytes(r, i, 17, want_hash[i], SP_SHA256_LEN);
        expect_text(r, i, 18, "2");
    }
    PQclear(r);
    sp_buf_dispose(&rows);
    sp_buf_dispose(&tmp);
    sp_buf_dispose(&want_subject);
    sp_buf_dispose(&want_reason);
    free(subject);
    free(longid);
    free(actor);
    free(corr);
    free(reason);
    free(payload);
}

/* An id that is not a UUID, or a schema version over the integer column: the row fails whole
 * (nothing appended, head unchanged), as PostgreSQL's refusal of the text failed it before. */
static void test_unholdable_value_fails_row(void **state)
{
    (void)state;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__Envelope e = SPACE__V1__ENVELOPE__INIT;
    uint8_t head[SP_SHA256_LEN], before[SP_SHA256_LEN];
    sp_buf_t rows, tmp;
    const char *bad_ids[] = {"not-a-uuid", UUID_LOWER "0", "0190f5a2+7b3c-7d4e-8f60-abcdefabcdef"};

    agg.kind = "sandbox";
    agg.id = "sbx_1";
    e.aggregate = &agg;
    e.tenant = "t1";
    e.occurred_at_us = TIME_MIN;
    row_t row = {
        .seq = 9, .subject = "s", .env = &e, .accepted = 1, .data = (const uint8_t *)"x", .len = 1};
    sp_buf_init(&rows);
    sp_buf_init(&tmp);
    memcpy(head, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    memcpy(before, head, SP_SHA256_LEN);
    sp_buf_append(&rows, "prefix", 6);
    for (size_t i = 0; i < 4; i++) {
        e.event_id = i < 3 ? (char *)bad_ids[i] : UUID_LOWER;
        e.causation_id = i < 3 ? "" : (char *)"zz";
        assert_int_equal(copy_row(&rows, &tmp, &row, head), -EINVAL);
        assert_int_equal(rows.len, 6);
        assert_memory_equal(head, before, SP_SHA256_LEN);
    }
    e.causation_id = "";
    e.schema_version = (uint32_t)INT32_MAX + 1;
    assert_int_equal(copy_row(&rows, &tmp, &row, head), -EINVAL);
    assert_int_equal(rows.len, 6);
    e.schema_version = 1;
    assert_int_equal(copy_row(&rows, &tmp, &row, head), 0);
    assert_true(rows.len > 6);
    sp_buf_dispose(&rows);
    sp_buf_dispose(&tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits_read_back),
        cmocka_unit_test(test_unholdable_value_fails_row),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
