/* What the subcommands share: walking the log page by page, the snapshot they read in, and
 * time in RFC 3339 (replay.h). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buf.h"
#include "db.h"
#include "error.h"
#include "envelope.h"
#include "ids.h"
#include "replay.h"
#include "xmalloc.h"

enum {
    C_SEQ,
    C_ACCEPTED,
    C_REASON,
    C_EVENT_ID,
    C_TYPE,
    C_AGG_KIND,
    C_AGG_ID,
    C_TENANT,
    C_ACTOR,
    C_OCCURRED_US,
    C_STORED_US,
    C_CORR,
    C_CAUSE,
    C_PREV,
    C_HASH,
    C_PAYLOAD,
    C_STATUS,
    C_SUBJECT,
    C_VERSION,
    C_CHAIN_V,
    C_PAYLOAD_SIZE,
    C_PAYLOAD_SHA,
    C_PUBLISHED_US,
};

/* Binary results: integers come back big-endian, text as its bytes, bytea as raw bytes. A
 * NULL filter parameter matches every row. */
static const char walk_sql[] =
    "SELECT stream_seq, status = 'accepted', reject_reason, event_id::text, type,"
    " aggregate_kind, aggregate_id, tenant, actor,"
    " (extract(epoch from occurred_at) * 1000000)::bigint,"
    " (extract(epoch from stored_at) * 1000000)::bigint, correlation_id, causation_id::text,"
    " prev_hash, hash, payload, status, subject, schema_version::bigint, chain_v::bigint,"
    " payload_size, payload_sha256, (extract(epoch from published_at) * 1000000)::bigint"
    " FROM events"
    " WHERE stream_seq > $1::bigint AND stream_seq <= $2::bigint"
    " AND ($3::text IS NULL OR tenant = $3)"
    " AND ($4::text IS NULL OR aggregate_kind = $4)"
    " AND ($5::text IS NULL OR aggregate_id = $5)"
    " AND ($6::text IS NULL OR type = $6)"
    " AND ($7::bool IS NULL OR status = 'accepted')"
    " ORDER BY stream_seq LIMIT $8::bigint";

static const char *text_col(PGresult *r, int row, int c)
{
    return PQgetisnull(r, row, c) ? NULL : PQgetvalue(r, row, c);
}

static int64_t i64_col(PGresult *r, int row, int c)
{
    return PQgetisnull(r, row, c) || PQgetlength(r, row, c) != 8
               ? 0
               : sp_db_get_i64(PQgetvalue(r, row, c));
}

/* 0, or -1 when the column is not 32 bytes (out is then zero). */
static int hash_col(PGresult *r, int row, int c, uint8_t out[32])
{
    memset(out, 0, 32);
    if (PQgetisnull(r, row, c) || PQgetlength(r, row, c) != 32)
        return -1;
    memcpy(out, PQgetvalue(r, row, c), 32);
    return 0;
}

static const char *nonempty(const char *s)
{
    return s && s[0] ? s : NULL;
}

static void fill_event(PGresult *r, int row, replay_event_t *ev)
{
    ev->seq = (uint64_t)i64_col(r, row, C_SEQ);
    ev->accepted = PQgetlength(r, row, C_ACCEPTED) == 1 && PQgetvalue(r, row, C_ACCEPTED)[0];
    ev->status = PQgetvalue(r, row, C_STATUS);
    ev->subject = PQgetvalue(r, row, C_SUBJECT);
    ev->has_schema_version = !PQgetisnull(r, row, C_VERSION);
    ev->schema_version = i64_col(r, row, C_VERSION);
    ev->reject_reason = text_col(r, row, C_REASON);
    ev->event_id = text_col(r, row, C_EVENT_ID);
    ev->type = text_col(r, row, C_TYPE);
    ev->aggregate_kind = text_col(r, row, C_AGG_KIND);
    ev->aggregate_id = text_col(r, row, C_AGG_ID);
    ev->tenant = text_col(r, row, C_TENANT);
    ev->actor = text_col(r, row, C_ACTOR);
    ev->has_occurred_at = !PQgetisnull(r, row, C_OCCURRED_US);
    ev->occurred_at_us = i64_col(r, row, C_OCCURRED_US);
    ev->stored_at_us = i64_col(r, row, C_STORED_US);
    ev->published_at_us = i64_col(r, row, C_PUBLISHED_US);
    ev->correlation_id = text_col(r, row, C_CORR);
    ev->causation_id = text_col(r, row, C_CAUSE);
    ev->hashes_ok =
        hash_col(r, row, C_PREV, ev->prev_hash) == 0 && hash_col(r, row, C_HASH, ev->hash) == 0;
    ev->payload = (const uint8_t *)PQgetvalue(r, row, C_PAYLOAD);
    ev->payload_len = (size_t)PQgetlength(r, row, C_PAYLOAD);
    ev->chain_v = i64_col(r, row, C_CHAIN_V);
    ev->has_payload_size = !PQgetisnull(r, row, C_PAYLOAD_SIZE);
    ev->payload_size = i64_col(r, row, C_PAYLOAD_SIZE);
    ev->has_payload_sha = !PQgetisnull(r, row, C_PAYLOAD_SHA);
    if (ev->has_payload_sha && PQgetlength(r, row, C_PAYLOAD_SHA) == 32)
        memcpy(ev->payload_sha, PQgetvalue(r, row, C_PAYLOAD_SHA), 32);
    else
        memset(ev->payload_sha, 0, 32);
    ev->env = NULL;
    ev->decode_error[0] = '\0';
    /* Decoded like any message from the bus: the stored bytes are no more trusted. */
    if (sp_envelope_decode(ev->payload, ev->payload_len, &ev->env, ev->decode_error) < 0)
        ev->env = NULL;
}

int replay_walk(PGconn *db, const replay_filter_t *f, int64_t page, replay_page_fn fn, void *arg)
{
    char after_s[24], until_s[24], page_s[24];
    const char *params[8] = {after_s,
                             until_s,
                             nonempty(f->tenant),
                             nonempty(f->aggregate_kind),
                             nonempty(f->aggregate_id),
                             nonempty(f->type),
                             f->accepted_only ? "true" : NULL,
                             page_s};
    uint64_t after = f->since ? f->since - 1 : 0;
    int rc = 0;

    snprintf(until_s, sizeof(until_s), "%" PRIu64, f->until ? f->until : (uint64_t)INT64_MAX);
    snprintf(page_s, sizeof(page_s), "%" PRId64, page);
    for (;;) {
        snprintf(after_s, sizeof(after_s), "%" PRIu64, after);
        PGresult *r = PQexecParams(db, walk_sql, 8, NULL, params, NULL, NULL, 1);
        if ((rc = sp_db_check(r, PGRES_TUPLES_OK)) < 0) {
            PQclear(r);
            return rc;
        }
        int rows = PQntuples(r);
        replay_event_t *evs = sp_xcalloc(rows ? (size_t)rows : 1, sizeof(*evs));
        for (int i = 0; i < rows; i++)
            fill_event(r, i, &evs[i]);
        if (rows > 0) {
            rc = fn(evs, (size_t)rows, arg);
            after = evs[rows - 1].seq;
        }
        for (int i = 0; i < rows; i++)
            sp_envelope_free(evs[i].env);
        free(evs);
        PQclear(r);
        if (rc < 0 || rows < page)
            return rc < 0 ? rc : 0;
    }
}

int replay_begin(PGconn *db, bool read_only)
{
    /* One snapshot for the whole walk: the eventlog appends while we read, and it writes the
     * events and the projections in one transaction, so within a snapshot they agree. */
    return sp_db_exec(db, read_only ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                                    : "BEGIN ISOLATION LEVEL REPEATABLE READ");
}

void replay_format_time(char *out, size_t len, int64_t us)
{
    int64_t sec = us / 1000000, frac = us % 1000000;
    if (frac < 0) {
        frac += 1000000;
        sec--;
    }
    time_t t = (time_t)sec;
    struct tm tm;
    if (!gmtime_r(&t, &tm)) {
        snprintf(out, len, "invalid");
        return;
    }
    snprintf(out, len, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long long)frac);
}

/* n decimal digits at s, into *ret. */
static int digits(const char *s, int n, int *ret)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -EINVAL;
        v = v * 10 + (s[i] - '0');
    }
    *ret = v;
    return 0;
}

int replay_parse_time(const char *s, int64_t *ret_us)
{
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int year, mon, day, hour, min, sec, oh = 0, om = 0;
    int64_t frac = 0;

    if (!s)
        return -EINVAL;
    if (strcmp(s, "now") == 0) {
        *ret_us = sp_now_us();
        return 0;
    }
    /* full-date "T" partial-time: YYYY-MM-DDTHH:MM:SS (RFC 3339 section 5.6). */
    if (strlen(s) < 20 || digits(s, 4, &year) < 0 || s[4] != '-' || digits(s + 5, 2, &mon) < 0 ||
        s[7] != '-' || digits(s + 8, 2, &day) < 0 || (s[10] != 'T' && s[10] != 't') ||
        digits(s + 11, 2, &hour) < 0 || s[13] != ':' || digits(s + 14, 2, &min) < 0 ||
        s[16] != ':' || digits(s + 17, 2, &sec) < 0)
        return -EINVAL;
    if (year < 1970 || mon < 1 || mon > 12 || day < 1 || day > mdays[mon - 1] || hour > 23 ||
        min > 59 || sec > 60)
        return -EINVAL;
    const char *p = s + 19;
    if (*p == '.') {
        int n = 0;
        for (p++; isdigit((unsigned char)*p); p++, n++)
            if (n < 6)
                frac = frac * 10 + (*p - '0');
        if (n == 0)
            return -EINVAL;
        for (; n < 6; n++)
            frac *= 10;
    }
    int sign = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        sign = *p == '-' ? -1 : 1;
        if (digits(p + 1, 2, &oh) < 0 || p[3] != ':' || digits(p + 4, 2, &om) < 0 || oh > 23 ||
            om > 59)
            return -EINVAL;
        p += 6;
    } else {
        return -EINVAL;
    }
    if (*p != '\0')
        return -EINVAL;
    struct tm tm = {.tm_year = year - 1900,
                    .tm_mon = mon - 1,
                    .tm_mday = day,
                    .tm_hour = hour,
                    .tm_min = min,
                    .tm_sec = sec > 59 ? 59 : sec};
    time_t t = timegm(&tm);
    if (t == (time_t)-1)
        return -EINVAL;
    /* timegm normalises 31 February into March: refuse dates that do not exist. */
    if (tm.tm_mday != day)
        return -EINVAL;
    *ret_us = ((int64_t)t - sign * (int64_t)(oh * 3600 + om * 60)) * 1000000 + frac;
    return 0;
}

int replay_bad_option(const char *option, const char *value, const char *what)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_json_str(&b, value); /* quoted and escaped: the value may hold anything */
    fprintf(stderr, "space-replay: --%s %s: %s\n", option, b.data, what);
    sp_buf_dispose(&b);
    return REPLAY_EUSAGE;
}

int replay_check_filters(const replay_config_t *cfg)
{
    if (cfg->tenant[0] && !sp_id_valid(cfg->tenant))
        return replay_bad_option("tenant", cfg->tenant, "not a tenant id");
    if (cfg->sandbox[0] && !sp_id_valid(cfg->sandbox))
        return replay_bad_option("sandbox", cfg->sandbox, "not a sandbox id");
    if (cfg->type[0] && sp_event_type_from_name(cfg->type) == SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET)
        return replay_bad_option("type", cfg->type, "not an event type (SandboxPlaced, ...)");
    if (cfg->since && cfg->until && cfg->since > cfg->until) {
        fprintf(stderr, "space-replay: --since %" PRId64 " is after --until %" PRId64 "\n",
                cfg->since, cfg->until);
        return REPLAY_EUSAGE;
    }
    return 0;
}
