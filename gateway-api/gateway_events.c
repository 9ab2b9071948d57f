/* Server-sent events (the WHATWG HTML "server-sent events" format): /v1/events and
 * /v1/sandboxes/{id}/events, read from the events table, the tenant's sandbox rows only.
 *
 * Every record is `id: <stream_seq>`, `event: <type>`, `data: {"seq":..,"status":..,
 * "event":{...}}`, so a client resumes exactly where it stopped with Last-Event-ID. A stream
 * has a cursor (every row up to it was examined) and reads pages after it on a pool thread:
 * - catching up (the last page may not have been the end): the next page is read only once
 *   the client took the previous one (the pending buffer is empty), so a resume from far back
 *   is paced by the client and held to about two pages of memory;
 * - live (the last read reached the head): a read follows each NOTIFY of the event log.
 * Output goes through the gateway's stream writer (gateway_sse.c): one h2o_send at a time, the
 * next after proceed(). What accumulates meanwhile is the client's lag; past
 * sse-max-lag-bytes, or with a write stuck for sse-write-timeout-s, the connection is shut
 * down: the client reconnects with Last-Event-ID and loses nothing. Nothing is ever buffered
 * without bound.
 *
 * Each stream reads for itself: a shared reader for live streams would save queries when
 * there are many streams (known limit of this first version; max-streams bounds it). */
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "envelope.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "sse.h"
#include "xmalloc.h"

#define PAGE_ROWS  500
#define PAGE_BYTES (256 * 1024) /* payload bytes per page, plus at most one row over */
#define GW_STR_(x) #x
#define GW_STR(x)  GW_STR_(x)

struct gw_stream {
    gw_sse_t sse;
    gw_t *gw;
    gw_req_t *rq; /* holds a reference */
    char tenant[SP_ID_MAX + 1];
    char sandbox[SP_ID_MAX + 1]; /* "" for all of the tenant's sandboxes */
    uint64_t cursor;
    bool caught_up;
    bool fetching;
    bool ended;
    gw_stream_t *prev, *next;
};

static void stream_free(gw_stream_t *s)
{
    gw_sse_dispose(&s->sse);
    gw_req_unref(s->rq);
    free(s);
}

/* The response is over: unlinks the stream; it is freed now or when its read job comes back. */
static void on_closed(gw_sse_t *w)
{
    gw_stream_t *s = H2O_STRUCT_FROM_MEMBER(gw_stream_t, sse, w);
    gw_t *gw = s->gw;
    s->ended = true;
    if (s->prev)
        s->prev->next = s->next;
    else
        gw->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    gw->n_streams--;
    if (!s->fetching)
        stream_free(s);
}

static void maybe_fetch(gw_stream_t *s);

/* The client took a write: a stream catching up reads its next page. */
static void on_written(gw_sse_t *w)
{
    maybe_fetch(H2O_STRUCT_FROM_MEMBER(gw_stream_t, sse, w));
}

static const gw_sse_ops_t stream_ops = {.written = on_written, .closed = on_closed};

/* ---- reading pages ---- */

typedef struct {
    gw_job_t job;
    gw_stream_t *s;
    char tenant[SP_ID_MAX + 1];
    char sandbox[SP_ID_MAX + 1];
    uint64_t cursor;
    bool failed;
    bool caught_up;
    uint64_t new_cursor;
    sp_buf_t text;
} fetch_job_t;

static void append_record(sp_buf_t *b, uint64_t seq, const char *status, const char *reason,
                          const sp_envelope_t *env)
{
    sp_sse_record_begin(b, seq, env->type);
    sp_buf_printf(b, "{\"seq\":%" PRIu64 ",\"status\":\"%s\"", seq, status);
    if (reason && reason[0]) {
        sp_buf_t safe;
        sp_buf_init(&safe);
        sp_buf_safe_text(&safe, reason, SP_REASON_MAX);
        sp_buf_puts(b, ",\"reason\":");
        sp_buf_json_str(b, safe.data ? safe.data : "");
        sp_buf_dispose(&safe);
    }
    sp_buf_puts(b, ",\"event\":");
    sp_envelope_to_json(env, b);
    sp_buf_putc(b, '}');
    sp_sse_record_end(b);
}

static void fetch_run(gw_job_t *job, PGconn *db)
{
    fetch_job_t *f = (fetch_job_t *)job;
    char cursor[24];
    uint64_t head = 0;

    /* The head first: every row up to it is committed (one writer, in stream order), so a page
     * that comes back complete covers everything up to it. */
    if (sp_db_log_head(db, &head) < 0) {
        f->failed = true;
        return;
    }

    snprintf(cursor, sizeof(cursor), "%" PRIu64, f->cursor);
    const char *params[3] = {f->tenant, cursor, f->sandbox};
    /* A page: at most PAGE_ROWS rows and about PAGE_BYTES of payload; the last column tells
     * how many rows the row limit alone would have given (to know if the page is the end). */
    PGresult *r = PQexecParams(
        db,
        "WITH page AS (SELECT stream_seq, type, status, payload, reject_reason, "
        "sum(octet_length(payload)) OVER (ORDER BY stream_seq) AS cum FROM events "
        "WHERE tenant = $1 AND aggregate_kind = 'sandbox' AND stream_seq > $2::int8 "
        "AND ($3::text = '' OR aggregate_id = $3) ORDER BY stream_seq LIMIT " GW_STR(
            PAGE_ROWS) ") "
                       "SELECT stream_seq, status, payload, coalesce(reject_reason, ''), "
                       "(SELECT count(*) FROM page) FROM page WHERE cum - octet_length(payload) "
                       "< " GW_STR(PAGE_BYTES) " ORDER BY stream_seq",
        3, NULL, params, NULL, NULL, 1);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        sp_log(SP_LOG_WARN, "event page query failed", SP_KS("error", PQerrorMessage(db)));
        f->failed = true;
        PQclear(r);
        return;
    }
    int rows = PQntuples(r);
    uint64_t last = f->cursor;
    int64_t inner = 0;
    for (int i = 0; i < rows; i++) {
        sp_envelope_t *env = NULL;
        char why[SP_REASON_MAX];
        uint64_t seq = (uint64_t)sp_db_get_i64(PQgetvalue(r, i, 0));
        const char *status = PQgetvalue(r, i, 1);
        inner = sp_db_get_i64(PQgetvalue(r, i, 4));
        last = seq;
        /* A rejected row whose payload does not decode has nothing to show: skipped. */
        if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 2), (size_t)PQgetlength(r, i, 2),
                               &env, why) < 0)
            continue;
        bool accepted = strcmp(status, "accepted") == 0;
        append_record(&f->text, seq, accepted ? "accepted" : "rejected",
                      accepted ? NULL : PQgetvalue(r, i, 3), env);
        sp_envelope_free(env);
    }
    PQclear(r);
    if (rows == 0 || (rows == inner && inner < PAGE_ROWS)) {
        f->caught_up = true;
        f->new_cursor = last > head ? last : head;
        if (f->new_cursor < f->cursor)
            f->new_cursor = f->cursor;
    } else {
        f->caught_up = false;
        f->new_cursor = last;
    }
}

static void fetch_done(gw_job_t *job)
{
    fetch_job_t *f = (fetch_job_t *)job;
    gw_stream_t *s = f->s;
    gw_t *gw = job->gw;

    s->fetching = false;
    if (s->ended) {
        stream_free(s);
    } else if (f->failed) {
        /* Retried by the next NOTIFY or tick. */
        s->caught_up = true;
    } else {
        if (f->new_cursor > s->cursor)
            s->cursor = f->new_cursor;
        s->caught_up = f->caught_up;
        if (f->text.len)
            sp_buf_append(&s->sse.pending, f->text.data, f->text.len);
        if (gw_sse_backlog(&s->sse) > (size_t)gw->cfg->sse_max_lag_bytes) {
            gw->metrics.streams_closed_slow++;
            gw_sse_abort(&s->sse, "client lags behind");
        } else if (gw_sse_flush(&s->sse)) {
            maybe_fetch(s);
        }
    }
    sp_buf_dispose(&f->text);
    free(f);
}

static void maybe_fetch(gw_stream_t *s)
{
    gw_t *gw = s->gw;
    if (!s->sse.req || s->fetching || s->sse.closing)
        return;
    if (s->caught_up ? s->cursor >= gw->head_seq : s->sse.pending.len > 0)
        return;
    fetch_job_t *f = sp_xcalloc(1, sizeof(*f));
    f->s = s;
    snprintf(f->tenant, sizeof(f->tenant), "%s", s->tenant);
    snprintf(f->sandbox, sizeof(f->sandbox), "%s", s->sandbox);
    f->cursor = s->cursor;
    sp_buf_init(&f->text);
    f->job.run = fetch_run;
    f->job.done = fetch_done;
    if (gw_job_submit(gw, &f->job) < 0) {
        free(f); /* the queue is full: the tick tries again */
        return;
    }
    s->fetching = true;
}

/* ---- opening ---- */

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    char tenant[SP_ID_MAX + 1];
    char sandbox[SP_ID_MAX + 1];
    bool need_head;
    bool failed;
    bool found;
    uint64_t start;
} open_job_t;

static void open_run(gw_job_t *job, PGconn *db)
{
    open_job_t *o = (open_job_t *)job;
    o->found = true;
    if (o->sandbox[0]) {
        const char *p[2] = {o->sandbox, o->tenant};
        PGresult *r = PQexecParams(db, "SELECT 1 FROM sandboxes WHERE id = $1 AND tenant = $2", 2,
                                   NULL, p, NULL, NULL, 0);
        o->failed = sp_db_check(r, PGRES_TUPLES_OK) < 0;
        o->found = !o->failed && PQntuples(r) == 1;
        PQclear(r);
        if (o->failed || !o->found)
            return;
    }
    if (o->need_head) {
        uint64_t head = 0;
        o->failed = sp_db_log_head(db, &head) < 0;
        if (!o->failed)
            o->start = head;
    }
}

static void stream_start(gw_req_t *rq, const open_job_t *o)
{
    gw_t *gw = rq->gw;
    gw_stream_t *s = sp_xcalloc(1, sizeof(*s));

    gw_sse_init(&s->sse);
    s->gw = gw;
    s->rq = rq;
    gw_req_ref(rq);
    snprintf(s->tenant, sizeof(s->tenant), "%s", o->tenant);
    snprintf(s->sandbox, sizeof(s->sandbox), "%s", o->sandbox);
    s->cursor = o->start;
    s->caught_up = false;
    s->next = gw->streams;
    if (gw->streams)
        gw->streams->prev = s;
    gw->streams = s;
    gw->n_streams++;

    gw_sse_start(&s->sse, rq, "text/event-stream", &stream_ops);
    /* The headers leave with this first record; then the backlog follows. */
    sp_buf_printf(&s->sse.pending, ": stream from %" PRIu64 "\n\n", s->cursor);
    if (gw_sse_flush(&s->sse))
        maybe_fetch(s);
}

static void open_done(gw_job_t *job)
{
    open_job_t *o = (open_job_t *)job;
    gw_req_t *rq = o->rq;
    gw_t *gw = job->gw;

    gw->n_stream_opening--;
    if (o->failed)
        gw_respond_error(rq, 503, "unavailable", NULL, "the database is not available; retry");
    else if (!o->found)
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
    else if (gw->stopping)
        gw_respond_error(rq, 503, "shutting_down", NULL, "the gateway is stopping");
    else if (gw_req_live(rq))
        stream_start(rq, o);
    gw_req_unref(rq);
    free(o);
}

static int parse_seq(const char *s, size_t len, uint64_t *ret)
{
    uint64_t v = 0;
    if (len == 0 || len > 19)
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *ret = v;
    return 0;
}

void gw_events_open(gw_req_t *rq, bool per_sandbox)
{
    gw_t *gw = rq->gw;
    gw_query_t q;
    bool dup = false, have_start = false;
    uint64_t start = 0;

    if (per_sandbox && !sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    if (gw_query_parse(rq->req, &q) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "malformed query string");
        return;
    }
    const h2o_iovec_t *h = gw_req_header(rq, "last-event-id", &dup);
    if (h) {
        if (dup || parse_seq(h->base, h->len, &start) < 0) {
            gw_respond_error(rq, 400, "invalid_last_event_id", NULL,
                             "Last-Event-ID must be an event id (a stream sequence) sent once");
            return;
        }
        have_start = true;
    }
    for (size_t i = 0; i < q.n; i++) {
        const char *k = q.p[i].key, *v = q.p[i].value;
        uint64_t x;
        if (strcmp(k, "last_event_id") != 0 && strcmp(k, "from") != 0) {
            gw_respond_error(rq, 400, "invalid_query", NULL, "unknown parameter %s", k);
            return;
        }
        if (parse_seq(v, strlen(v), &x) < 0) {
            gw_respond_error(rq, 400, "invalid_query", NULL, "%s must be a stream sequence", k);
            return;
        }
        /* The header wins over the query (a browser's EventSource sends the header when it
         * reconnects, with the URL it first used). */
        if (!have_start) {
            start = x;
            have_start = true;
        }
    }
    if (gw->n_streams + gw->n_stream_opening >= (size_t)gw->cfg->max_streams) {
        gw_respond_error(rq, 429, "too_many_streams", NULL,
                         "this gateway serves at most %lld streams; retry later",
                         (long long)gw->cfg->max_streams);
        return;
    }
    open_job_t *o = sp_xcalloc(1, sizeof(*o));
    o->rq = rq;
    snprintf(o->tenant, sizeof(o->tenant), "%s", rq->tenant);
    if (per_sandbox)
        snprintf(o->sandbox, sizeof(o->sandbox), "%s", rq->path_id);
    o->need_head = !have_start;
    o->start = start;
    o->job.run = open_run;
    o->job.done = open_done;
    gw_req_ref(rq);
    if (gw_job_submit(gw, &o->job) < 0) {
        gw_req_unref(rq);
        free(o);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
        return;
    }
    gw->n_stream_opening++;
}

/* ---- driven by the loop ---- */

void gw_events_notify(gw_t *gw)
{
    for (gw_stream_t *s = gw->streams; s; s = s->next)
        maybe_fetch(s);
}

void gw_events_tick(gw_t *gw)
{
    int64_t now = sp_mono_ns();
    gw_stream_t *s = gw->streams;

    while (s) {
        gw_stream_t *next = s->next; /* s may end below */
        if (gw_sse_tick(&s->sse, now))
            maybe_fetch(s);
        s = next;
    }
}

void gw_events_close_all(gw_t *gw, bool force)
{
    gw_stream_t *s = gw->streams;
    while (s) {
        gw_stream_t *next = s->next; /* s may end below */
        if (force)
            gw_sse_abort(&s->sse, "shutdown");
        else
            gw_sse_close(&s->sse);
        s = next;
    }
}
