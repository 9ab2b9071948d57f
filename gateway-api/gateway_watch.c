/* GET /v1/sandboxes/{id}/files/watch?path=&recursive=&user= (SSE) and E2B's
 * filesystem.Filesystem/WatchDir (a Connect stream): a directory of a running sandbox,
 * followed until the client goes away (proto/dataplane.proto, "watches").
 *
 * The flow mirrors a command's (gateway_commands.c): a pool job finds the sandbox's worker
 * (404 unknown, 409 not running); a bus job subscribes to space.io.watch.<watch_id>.> and
 * flushes, then asks the worker to start the watch (WatchCall "start"), which answers once the
 * agent has it in place; then the response starts with a start record. WatchBatches arrive on a
 * cnats thread, are checked (size, watch id, seq, every event's type and path: canonical and
 * under the watched directory) and queued under the watch's mutex, and the loop is woken. The
 * loop writes them as records through the stream writer (gateway_sse.c), one write at a time.
 *
 * SSE: `event: start` {path, recursive}, then `event: fs` {path, type} per event (type create,
 * write, remove, rename or chmod), `event: overflow` {path} where events were lost (the agent's
 * or the worker's bounds, a gap in the batches' seq, or a client reading slower than the events
 * come: past BUF_MAX bytes unsent), `event: end` {code, message} when the worker ended the
 * watch (the directory went away, the sandbox stopped), and comment keepalives.
 * E2B: {"start":{}}, {"filesystem":{name, type: EVENT_TYPE_*}} with name relative to the
 * watched directory, {"keepalive":{}}, then the end-stream message; an overflow has no E2B
 * form and is dropped there (counted).
 *
 * The watch lives as long as its response: when h2o says the client is gone (stop) or the
 * gateway stops, a bus job tells the worker (WatchCall "stop") and unsubscribes. While it lives
 * a renew call every RENEW_S keeps its lease on the worker, so a gateway that dies leaves no
 * watch behind for longer than the worker's lease.
 *
 * E2B's polling form (CreateWatcher, GetWatcherEvents, RemoveWatcher: its Python sync SDK) is
 * the same watch without a response. CreateWatcher answers {watcherId} once the worker
 * confirmed the start; the id is unguessable (128 random bits) and found again only with the
 * sandbox and tenant that made it. The watch then sits in gw->watches and keeps E2B's event
 * objects in a bounded buffer (POLL_EVENTS_MAX, POLL_BYTES_MAX; past them events are dropped
 * and counted, as overflows are) that each GetWatcherEvents empties. It ends on RemoveWatcher,
 * when nobody polled it for watcher-idle-s (the tick), or when the gateway stops; when the
 * worker ends it, the next poll still gets what was buffered, the one after that the error,
 * and then the id is unknown (not_found). */
#include "contract.h"
#include "request.h"
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fspath.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "sse.h"
#include "xmalloc.h"

#define CALL_TIMEOUT_MS  35000 /* a recursive start walks the tree in the guest */
#define STOP_TIMEOUT_MS  5000
#define FLUSH_TIMEOUT_MS 5000
#define RENEW_S          15 /* the worker's lease is 60 s (worker_watch.c) */
#define BATCH_MAX        (2 * 1024 * 1024)
#define QUEUE_MAX        4096         /* events waiting for the loop */
#define BUF_MAX          (256 * 1024) /* SSE bytes not yet written to the client */
#define TEXT_MAX         256
#define POLL_EVENTS_MAX  4096         /* E2B watcher: events waiting for GetWatcherEvents */
#define POLL_BYTES_MAX   (256 * 1024) /* and their JSON */
#define WATCHER_ID_BYTES 16

typedef enum { PH_LOOKUP = 1, PH_START, PH_LIVE, PH_DONE } phase_t;

typedef struct wev wev_t;
struct wev {
    wev_t *next;
    const char *type; /* one of the known names (static) */
    char path[];
};

struct gw_watch {
    gw_sse_t sse;     /* the streamed response (SSE or Connect) */
    uv_async_t async; /* cnats thread -> loop; closed last */
    gw_t *gw;
    gw_req_t *rq; /* holds a reference */
    bool connect; /* E2B: Connect envelopes instead of SSE records */
    bool recursive;
    phase_t phase;
    char id[SP_ID_MAX + 1];
    char sandbox[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char request_id[GW_REQUEST_ID_MAX + 1];
    char worker[SP_ID_MAX + 1];
    char path[SP_FSPATH_MAX + 1];
    char prefix[96]; /* "space.io.watch.<id>." */

    /* The bus job in flight (at most one). */
    gw_bus_job_t job;
    void (*bus_run)(gw_watch_t *x);
    void (*bus_done)(gw_watch_t *x);
    bool bus_busy;
    sp_bus_sub_t *sub;
    int bus_rc;
    bool stop_owed; /* the worker holds the watch: tell it when the response ends */
    bool polling;   /* E2B's polling watcher (below) */
    bool ended;     /* polling: the worker ended the watch (or lost it), end_* say why */
    char reply_error[64];
    char reply_detail[TEXT_MAX];
    char watcher_id[4 + 2 * WATCHER_ID_BYTES + 1]; /* polling: "wch_<hex>" once started */
    int64_t renew_at_ns;

    /* Loop side of the response. In polling mode resp_done means the watcher is gone for its
     * clients (removed, expired, errored, the gateway stopping). */
    bool async_closing, resp_done, buf_lost;

    /* Polling mode (E2B's CreateWatcher): no response, rq is released once created. (Its
     * flags and id sit with the other bytes above: no padding.) */
    int64_t polled_ns;
    sp_buf_t poll_buf; /* E2B event objects, comma-separated */
    size_t poll_n;
    uint64_t poll_dropped;

    /* Shared with the cnats thread: under mu. */
    pthread_mutex_t mu;
    wev_t *head, *tail;
    size_t queued;
    uint64_t next_seq;
    bool closed;
    bool have_end;
    char end_error[64];
    char end_detail[TEXT_MAX];

    gw_watch_t *prev, *next;
};

/* ---- bus jobs and lifetime ---- */

static void job_run(gw_bus_job_t *job)
{
    gw_watch_t *x = job->arg;
    x->bus_run(x);
}

static void job_done(gw_bus_job_t *job)
{
    gw_watch_t *x = job->arg;
    x->bus_busy = false;
    x->bus_done(x);
}

static void bus_submit(gw_watch_t *x, void (*run)(gw_watch_t *), void (*done)(gw_watch_t *))
{
    x->bus_run = run;
    x->bus_done = done;
    x->bus_busy = true;
    x->job.arg = x;
    x->job.run = job_run;
    x->job.done = job_done;
    gw_bus_submit(x->gw, &x->gw->bus_lane, &x->job);
}

static void free_queue(gw_watch_t *x)
{
    while (x->head) {
        wev_t *n = x->head->next;
        free(x->head);
        x->head = n;
    }
    x->tail = NULL;
    x->queued = 0;
}

static void on_async_closed(uv_handle_t *h)
{
    gw_watch_t *x = h->data;
    gw_t *gw = x->gw;
    if (x->prev)
        x->prev->next = x->next;
    else
        gw->watches = x->next;
    if (x->next)
        x->next->prev = x->prev;
    gw->n_watches--;
    free_queue(x);
    gw_sse_dispose(&x->sse);
    sp_buf_dispose(&x->poll_buf);
    pthread_mutex_destroy(&x->mu);
    gw_req_unref(x->rq);
    free(x);
}

static void call(gw_watch_t *x, const char *op, int timeout_ms)
{
    Space__Io__V1__WatchCall q = SPACE__IO__V1__WATCH_CALL__INIT;
    char subject[128];
    uint8_t *rep = NULL;
    size_t rep_len = 0;
    q.sandbox = x->sandbox;
    q.tenant = x->tenant;
    q.correlation_id = x->request_id;
    q.op = (char *)op;
    q.watch_id = x->id;
    q.path = x->path;
    q.recursive = x->recursive;
    size_t len = space__io__v1__watch_call__get_packed_size(&q);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    space__io__v1__watch_call__pack(&q, buf);
    x->reply_error[0] = x->reply_detail[0] = '\0';
    x->bus_rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_WATCH, x->worker, NULL, NULL);
    if (x->bus_rc >= 0)
        x->bus_rc = sp_request_send(x->gw->bus, subject, buf, len, timeout_ms, &rep, &rep_len);
    free(buf);
    if (x->bus_rc < 0)
        return;
    /* The reply is untrusted: size first, then decode. */
    Space__Io__V1__WatchReply *r =
        rep_len <= 4096 ? space__io__v1__watch_reply__unpack(NULL, rep_len, rep) : NULL;
    free(rep);
    if (!r) {
        snprintf(x->reply_error, sizeof(x->reply_error), "bad_reply");
        snprintf(x->reply_detail, sizeof(x->reply_detail), "the worker's reply is unreadable");
        return;
    }
    if (!r->ok) {
        sp_buf_t safe;
        sp_buf_init(&safe);
        sp_buf_safe_text(&safe, r->error[0] ? r->error : "worker_error", sizeof(x->reply_error));
        snprintf(x->reply_error, sizeof(x->reply_error), "%s", safe.data);
        sp_buf_reset(&safe);
        sp_buf_safe_text(&safe, r->detail, sizeof(x->reply_detail));
        snprintf(x->reply_detail, sizeof(x->reply_detail), "%s", safe.data ? safe.data : "");
        sp_buf_dispose(&safe);
    }
    space__io__v1__watch_reply__free_unpacked(r, NULL);
}

static void maybe_free(gw_watch_t *x)
{
    if (!x->resp_done || x->sub || x->bus_busy || x->async_closing)
        return;
    x->async_closing = true;
    uv_close((uv_handle_t *)&x->async, on_async_closed);
}

/* Bus thread: the watch is over for us; the worker forgets it, the subscription goes. */
static void stop_run(gw_watch_t *x)
{
    if (x->stop_owed)
        call(x, "stop", STOP_TIMEOUT_MS);
    x->stop_owed = false;
    sp_bus_unsubscribe(x->sub);
    x->sub = NULL;
}

static void stop_done(gw_watch_t *x)
{
    maybe_free(x);
}

/* Stops taking events; the worker is told off the loop (once no other job runs). */
static void wind_down(gw_watch_t *x)
{
    pthread_mutex_lock(&x->mu);
    x->closed = true;
    free_queue(x);
    pthread_mutex_unlock(&x->mu);
    if ((x->sub || x->stop_owed) && !x->bus_busy)
        bus_submit(x, stop_run, stop_done);
    maybe_free(x);
}

/* ---- the response (loop) ---- */

/* The response is over: after the end record, or the client went away. */
static void on_closed(gw_sse_t *w)
{
    gw_watch_t *x = H2O_STRUCT_FROM_MEMBER(gw_watch_t, sse, w);
    if (x->phase == PH_LIVE)
        sp_log(SP_LOG_INFO, "watch client gone", SP_KS("watch", x->id),
               SP_KS("sandbox", x->sandbox), SP_KS("request_id", x->request_id));
    x->phase = PH_DONE;
    x->resp_done = true;
    wind_down(x);
}

static void json_guest(sp_buf_t *b, const char *s)
{
    sp_buf_t safe;
    sp_buf_init(&safe);
    sp_buf_safe_text(&safe, s, SP_FSPATH_MAX * 4);
    sp_buf_json_str(b, safe.data ? safe.data : "");
    sp_buf_dispose(&safe);
}

static void connect_keepalive(gw_sse_t *w)
{
    gw_connect_envelope(&w->pending, 0, "{\"keepalive\":{}}", 16);
}

/* A watch's reader sends nothing after its request: a hang-up is looked for at every tick. */
static const gw_sse_ops_t sse_ops = {.closed = on_closed, .poll_hangup = true};
static const gw_sse_ops_t connect_ops = {
    .keepalive = connect_keepalive, .closed = on_closed, .poll_hangup = true};

static void record_start(gw_watch_t *x)
{
    sp_buf_t *b = &x->sse.pending;
    if (x->connect) {
        gw_connect_envelope(b, 0, "{\"start\":{}}", 12);
        return;
    }
    sp_sse_record_begin(b, 0, "start");
    sp_buf_puts(b, "{\"path\":");
    sp_buf_json_str(b, x->path);
    sp_buf_printf(b, ",\"recursive\":%s}", x->recursive ? "true" : "false");
    sp_sse_record_end(b);
}

/* E2B's FilesystemEvent {name, type} of one of our events (not an overflow). */
static void e2b_event(gw_watch_t *x, sp_buf_t *b, const char *type, const char *path)
{
    /* E2B names an event's path relative to the watched directory. */
    size_t n = strlen(x->path);
    const char *rel = strcmp(x->path, "/") == 0 ? path + 1 : path + n + (path[n] == '/');
    char upper[16];
    size_t k = 0;
    for (; type[k] && k + 1 < sizeof(upper); k++)
        upper[k] = (char)(type[k] - 'a' + 'A');
    upper[k] = '\0';
    sp_buf_puts(b, "{\"name\":");
    json_guest(b, rel[0] ? rel : ".");
    sp_buf_printf(b, ",\"type\":\"EVENT_TYPE_%s\"}", upper);
}

/* Polling mode: into the buffer GetWatcherEvents empties, within its bounds. */
static void poll_record(gw_watch_t *x, const char *type, const char *path)
{
    if (strcmp(type, "overflow") == 0)
        return; /* E2B has no such event */
    if (x->poll_n >= POLL_EVENTS_MAX || x->poll_buf.len >= POLL_BYTES_MAX) {
        x->poll_dropped++;
        return;
    }
    if (x->poll_n)
        sp_buf_putc(&x->poll_buf, ',');
    e2b_event(x, &x->poll_buf, type, path);
    x->poll_n++;
}

static void record_event(gw_watch_t *x, const char *type, const char *path)
{
    sp_buf_t *pending = &x->sse.pending;
    bool overflow = strcmp(type, "overflow") == 0;
    if (x->connect) {
        if (overflow)
            return; /* E2B has no such event */
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_puts(&b, "{\"filesystem\":");
        e2b_event(x, &b, type, path);
        sp_buf_putc(&b, '}');
        gw_connect_envelope(pending, 0, b.data, b.len);
        sp_buf_dispose(&b);
        return;
    }
    sp_sse_record_begin(pending, 0, overflow ? "overflow" : "fs");
    sp_buf_puts(pending, "{\"path\":");
    json_guest(pending, path);
    if (!overflow)
        sp_buf_printf(pending, ",\"type\":\"%s\"", type);
    sp_buf_putc(pending, '}');
    sp_sse_record_end(pending);
}

/* The last record, and the end of the response once it is written. */
static void record_end(gw_watch_t *x, const char *code, const char *detail)
{
    sp_buf_t *pending = &x->sse.pending;
    sp_buf_t b;
    sp_buf_init(&b);
    if (x->connect) {
        if (code[0]) {
            int st;
            sp_buf_puts(&b, "{\"error\":{\"code\":");
            sp_buf_json_str(&b,
                            gw_connect_code(strcmp(code, "not_found") == 0 ? 404 : 503, code, &st));
            sp_buf_puts(&b, ",\"message\":");
            json_guest(&b, detail);
            sp_buf_puts(&b, "}}");
        } else {
            sp_buf_puts(&b, "{}");
        }
        gw_connect_envelope(pending, GW_CONNECT_END_STREAM, b.data, b.len);
    } else if (code[0]) {
        sp_sse_record_begin(pending, 0, "end");
        sp_buf_puts(pending, "{\"code\":");
        json_guest(pending, code);
        sp_buf_puts(pending, ",\"message\":");
        json_guest(pending, detail);
        sp_buf_putc(pending, '}');
        sp_sse_record_end(pending);
    }
    sp_buf_dispose(&b);
    gw_sse_end(&x->sse);
}

/* The worker ended the watch (or no longer has it): the response's last record, or in polling
 * mode what the poll after the buffered events answers. */
static void finish_live(gw_watch_t *x, const char *code, const char *detail)
{
    if (!x->polling) {
        record_end(x, code, detail);
        return;
    }
    /* end_* are the cnats thread's too until have_end is set (on_end, lost watch). */
    pthread_mutex_lock(&x->mu);
    x->have_end = true;
    snprintf(x->end_error, sizeof(x->end_error), "%s", code[0] ? code : "ended");
    snprintf(x->end_detail, sizeof(x->end_detail), "%s", detail[0] ? detail : "the watch ended");
    pthread_mutex_unlock(&x->mu);
    x->ended = true;
    wind_down(x);
}

/* Moves what the cnats thread queued into the response (polling mode: the buffer). */
static void process(gw_watch_t *x)
{
    if (x->phase != PH_LIVE || (!x->polling && !x->sse.req))
        return;
    pthread_mutex_lock(&x->mu);
    wev_t *q = x->head;
    x->head = x->tail = NULL;
    x->queued = 0;
    bool end = x->have_end;
    char code[64], detail[TEXT_MAX];
    snprintf(code, sizeof(code), "%s", x->end_error);
    snprintf(detail, sizeof(detail), "%s", x->end_detail);
    pthread_mutex_unlock(&x->mu);
    while (q) {
        wev_t *n = q->next;
        if (x->polling) {
            poll_record(x, q->type, q->path);
        } else if (gw_sse_backlog(&x->sse) > BUF_MAX) {
            /* The client reads slower than the events come: they are lost, and it is told. */
            x->buf_lost = true;
        } else {
            if (x->buf_lost) {
                record_event(x, "overflow", x->path);
                x->buf_lost = false;
            }
            record_event(x, q->type, q->path);
        }
        free(q);
        q = n;
    }
    if (end) {
        x->phase = PH_DONE;
        x->stop_owed = false; /* the worker ended it */
        finish_live(x, code, detail);
    }
    if (!x->polling)
        gw_sse_flush(&x->sse);
}

static void on_async(uv_async_t *a)
{
    process(a->data);
}

/* ---- the data plane (cnats thread) ---- */

static const char *known_type(const char *t)
{
    static const char *const types[] = {"create", "write", "remove", "rename", "chmod", "overflow"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (strcmp(t, types[i]) == 0)
            return types[i];
    return NULL;
}

/* Queues one event (x->mu held); an overflow right after another is one. */
static void enqueue(gw_watch_t *x, const char *type, const char *path)
{
    bool overflow = strcmp(type, "overflow") == 0;
    if (overflow && x->tail && strcmp(x->tail->type, "overflow") == 0)
        return;
    if (!overflow && x->queued >= QUEUE_MAX) {
        enqueue(x, "overflow", x->path);
        return;
    }
    size_t n = strlen(path);
    wev_t *e = sp_xmalloc(sizeof(*e) + n + 1);
    e->next = NULL;
    e->type = type;
    memcpy(e->path, path, n + 1);
    if (x->tail)
        x->tail->next = e;
    else
        x->head = e;
    x->tail = e;
    x->queued++;
}

static void on_batch(gw_watch_t *x, const uint8_t *data, size_t len)
{
    Space__Io__V1__WatchBatch *m =
        len <= BATCH_MAX ? space__io__v1__watch_batch__unpack(NULL, len, data) : NULL;
    pthread_mutex_lock(&x->mu);
    if (x->closed || x->have_end) {
        pthread_mutex_unlock(&x->mu);
        goto out;
    }
    if (!m || strcmp(m->watch_id, x->id) != 0 || m->seq < x->next_seq) {
        if (!m || strcmp(m->watch_id, x->id) != 0)
            enqueue(x, "overflow", x->path); /* unreadable: its events are lost */
        pthread_mutex_unlock(&x->mu);
        goto out;
    }
    if (m->seq != x->next_seq)
        enqueue(x, "overflow", x->path); /* a batch went missing */
    x->next_seq = m->seq + 1;
    for (size_t i = 0; i < m->n_events; i++) {
        const char *type = known_type(m->events[i]->type);
        const char *path = m->events[i]->path;
        if (!type || !sp_fspath_canonical(path) || !sp_fspath_within(path, x->path))
            continue; /* not an event of this watch: dropped */
        enqueue(x, type, path);
    }
    pthread_mutex_unlock(&x->mu);
    uv_async_send(&x->async);
out:
    if (m)
        space__io__v1__watch_batch__free_unpacked(m, NULL);
}

static void on_end(gw_watch_t *x, const uint8_t *data, size_t len)
{
    Space__Io__V1__WatchEnd *m =
        len <= 8192 ? space__io__v1__watch_end__unpack(NULL, len, data) : NULL;
    bool wake = false;
    pthread_mutex_lock(&x->mu);
    if (m && strcmp(m->watch_id, x->id) == 0 && !x->closed && !x->have_end) {
        if (m->last_seq >= x->next_seq)
            enqueue(x, "overflow", x->path); /* batches it sent did not arrive */
        x->have_end = true;
        sp_buf_t safe;
        sp_buf_init(&safe);
        sp_buf_safe_text(&safe, m->error[0] ? m->error : "ended", sizeof(x->end_error));
        snprintf(x->end_error, sizeof(x->end_error), "%s", safe.data);
        sp_buf_reset(&safe);
        sp_buf_safe_text(&safe, m->detail, sizeof(x->end_detail));
        snprintf(x->end_detail, sizeof(x->end_detail), "%s", safe.data ? safe.data : "");
        sp_buf_dispose(&safe);
        wake = true;
    }
    pthread_mutex_unlock(&x->mu);
    if (m)
        space__io__v1__watch_end__free_unpacked(m, NULL);
    if (wake)
        uv_async_send(&x->async);
}

static void on_msg(void *arg, const char *subject, const char *reply, const uint8_t *data,
                   size_t len)
{
    gw_watch_t *x = arg;
    size_t n = strlen(x->prefix);
    (void)reply;
    if (strncmp(subject, x->prefix, n) != 0)
        return;
    if (strcmp(subject + n, "ev") == 0)
        on_batch(x, data, len);
    else if (strcmp(subject + n, "end") == 0)
        on_end(x, data, len);
}

/* ---- starting ---- */

/* Bus thread: subscribe (before anything can be published), then the start call. */
static void start_run(gw_watch_t *x)
{
    char subject[128];
    x->bus_rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_WATCH_EV, x->id, NULL, NULL);
    if (x->bus_rc >= 0)
        x->bus_rc = sp_bus_subscribe(x->gw->bus, subject, NULL, on_msg, x, &x->sub);
    if (x->bus_rc == 0)
        x->bus_rc = sp_bus_flush(x->gw->bus, FLUSH_TIMEOUT_MS);
    if (x->bus_rc == 0) {
        call(x, "start", CALL_TIMEOUT_MS);
        /* Also when the call timed out: the worker may have it, a stop is harmless. */
        x->stop_owed = x->bus_rc == SP_ETIMEOUT || (x->bus_rc == 0 && !x->reply_error[0]);
    }
}

static void refuse(gw_watch_t *x)
{
    static const struct {
        const char *error;
        int status;
    } map[] = {{"not_found", 404},         {"not_directory", 400},    {"bad_path", 400},
               {"permission", 403},        {"too_many_watches", 429}, {"sandbox_not_running", 409},
               {"agent_unavailable", 503}, {"agent_error", 502}};
    gw_req_t *rq = x->rq;
    if (x->bus_rc == SP_ENOTFOUND || x->bus_rc == SP_ETIMEOUT) {
        gw_respond_error(rq, 503, "worker_unavailable", NULL, "worker %s did not answer (%s)",
                         x->worker, sp_strerror(x->bus_rc));
        return;
    }
    if (x->bus_rc < 0) {
        gw_respond_error(rq, 503, "bus_unavailable", NULL, "the data plane failed: %s",
                         sp_strerror(x->bus_rc));
        return;
    }
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        if (strcmp(x->reply_error, map[i].error) == 0) {
            gw_respond_error(rq, map[i].status, map[i].error, NULL, "%s", x->reply_detail);
            return;
        }
    }
    sp_log(SP_LOG_WARN, "worker refused a watch", SP_KS("worker", x->worker),
           SP_KS("error", x->reply_error), SP_KS("detail", x->reply_detail),
           SP_KS("request_id", x->request_id));
    gw_respond_error(rq, 500, "worker_error", NULL, "the worker refused: %s", x->reply_detail);
}

/* CreateWatcher's answer: the watch is in place, the id names it from now on. */
static void watcher_created(gw_watch_t *x)
{
    uint8_t r[WATCHER_ID_BYTES];
    char hex[2 * WATCHER_ID_BYTES + 1];
    sp_random_bytes(r, sizeof(r));
    sp_hex_encode(r, sizeof(r), hex);
    snprintf(x->watcher_id, sizeof(x->watcher_id), "wch_%s", hex);
    x->polled_ns = sp_mono_ns();
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"watcherId\":");
    sp_buf_json_str(&b, x->watcher_id);
    sp_buf_putc(&b, '}');
    gw_respond_json(x->rq, 200, &b);
    sp_buf_dispose(&b);
    sp_log(SP_LOG_INFO, "watcher created", SP_KS("watch", x->id), SP_KS("sandbox", x->sandbox),
           SP_KS("request_id", x->request_id));
    /* Not tied to the request from here on. */
    gw_req_unref(x->rq);
    x->rq = NULL;
    process(x);
}

static void start_done(gw_watch_t *x)
{
    gw_t *gw = x->gw;
    bool ok = x->bus_rc == 0 && !x->reply_error[0];
    if (!ok || gw->stopping || !gw_req_live(x->rq)) {
        if (!ok)
            refuse(x);
        else if (gw_req_live(x->rq))
            gw_respond_error(x->rq, 503, "shutting_down", NULL, "the gateway is stopping");
        x->phase = PH_DONE;
        x->resp_done = true;
        wind_down(x);
        return;
    }
    x->phase = PH_LIVE;
    x->renew_at_ns = sp_mono_ns() + (int64_t)RENEW_S * 1000000000;
    if (x->polling) {
        watcher_created(x);
        return;
    }
    if (x->connect)
        gw_sse_start(&x->sse, x->rq, "application/connect+json", &connect_ops);
    else
        gw_sse_start(&x->sse, x->rq, "text/event-stream", &sse_ops);
    record_start(x);
    process(x);
    gw_sse_flush(&x->sse);
}

typedef struct {
    gw_job_t job;
    gw_watch_t *x;
    gw_sandbox_loc_t loc;
} lookup_job_t;

static void lookup_run(gw_job_t *job, PGconn *db)
{
    (void)db;
    lookup_job_t *l = (lookup_job_t *)job;
    gw_sandbox_locate(job, l->x->sandbox, l->x->tenant, &l->loc);
}

static void lookup_done(gw_job_t *job)
{
    lookup_job_t *l = (lookup_job_t *)job;
    gw_watch_t *x = l->x;
    if (gw_sandbox_loc_ok(x->rq, &l->loc)) {
        snprintf(x->worker, sizeof(x->worker), "%s", l->loc.worker);
        x->phase = PH_START;
        bus_submit(x, start_run, start_done);
    } else {
        x->phase = PH_DONE;
        x->resp_done = true;
        maybe_free(x);
    }
    free(l);
}

/* ---- renewing, ticking, closing ---- */

static void renew_run(gw_watch_t *x)
{
    call(x, "renew", STOP_TIMEOUT_MS);
}

static void renew_done(gw_watch_t *x)
{
    if (x->phase == PH_LIVE && strcmp(x->reply_error, "unknown_watch") == 0) {
        /* The worker no longer has it (its lease ran out, or it restarted). */
        x->phase = PH_DONE;
        x->stop_owed = false;
        finish_live(x, "watch_lost", "the worker no longer follows this directory");
    } else if (x->phase == PH_DONE) {
        wind_down(x);
    }
    maybe_free(x);
}

/* A polling watcher is over for its clients: the worker is told, the id is unknown from now. */
static void retire(gw_watch_t *x, const char *why)
{
    sp_log(SP_LOG_INFO, "watcher ends", SP_KS("watch", x->id), SP_KS("sandbox", x->sandbox),
           SP_KS("reason", why), SP_KU("dropped", x->poll_dropped),
           SP_KS("request_id", x->request_id));
    x->phase = PH_DONE;
    x->resp_done = true;
    wind_down(x);
}

void gw_watches_tick(gw_t *gw)
{
    int64_t now = sp_mono_ns();
    int64_t idle_ns = gw->cfg->watcher_idle_s * 1000000000LL;
    for (gw_watch_t *x = gw->watches; x; x = x->next) {
        /* retire only starts closing: x is freed later (on_async_closed), the walk goes on. */
        if (x->polling && x->watcher_id[0] && !x->resp_done && now - x->polled_ns > idle_ns)
            retire(x, "not polled");
        if (x->phase == PH_LIVE && !x->bus_busy && now >= x->renew_at_ns) {
            x->renew_at_ns = now + (int64_t)RENEW_S * 1000000000;
            bus_submit(x, renew_run, renew_done);
        }
        gw_sse_tick(&x->sse, now);
    }
}

void gw_watches_close_all(gw_t *gw, bool force)
{
    for (gw_watch_t *x = gw->watches; x; x = x->next) {
        if (x->polling && x->watcher_id[0] && !x->resp_done)
            retire(x, "shutting down");
        if (x->phase == PH_LIVE && x->sse.req) {
            x->phase = PH_DONE;
            record_end(x, "shutting_down", "the gateway is stopping");
        }
        if (force)
            gw_sse_abort(&x->sse, "shutdown");
    }
}

/* ---- the request ---- */

static void watch_new(gw_req_t *rq, const char *path, const char *user, bool recursive,
                      bool polling)
{
    gw_t *gw = rq->gw;
    char resolved[SP_FSPATH_MAX + 1];
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    int rc = path ? sp_fspath_resolve(path, sp_fspath_home(user), resolved) : -EINVAL;
    if (rc == -ENAMETOOLONG) {
        gw_respond_error(rq, 400, "bad_path", NULL, "path: longer than %d bytes", SP_FSPATH_MAX);
        return;
    }
    if (rc < 0) {
        gw_respond_error(rq, 400, "bad_path", NULL,
                         "path: a non-empty absolute or home-relative path of UTF-8 text");
        return;
    }
    if (gw->n_watches >= (size_t)gw->cfg->max_streams) {
        gw_respond_error(rq, 429, "too_many_streams", NULL,
                         "this gateway follows at most %lld watches at once; retry later",
                         (long long)gw->cfg->max_streams);
        return;
    }
    gw_watch_t *x = sp_xcalloc(1, sizeof(*x));
    char fresh[SP_SANDBOX_ID_LEN + 1];
    sp_sandbox_id_new(fresh);
    snprintf(x->id, sizeof(x->id), "wat_%s", fresh + 4);
    x->gw = gw;
    x->rq = rq;
    gw_req_ref(rq);
    x->connect = rq->dialect == GW_DIALECT_CONNECT_STREAM;
    x->polling = polling;
    sp_buf_init(&x->poll_buf);
    x->recursive = recursive;
    x->phase = PH_LOOKUP;
    x->next_seq = 1;
    snprintf(x->sandbox, sizeof(x->sandbox), "%s", rq->path_id);
    snprintf(x->tenant, sizeof(x->tenant), "%s", rq->tenant);
    snprintf(x->request_id, sizeof(x->request_id), "%s", rq->request_id);
    snprintf(x->path, sizeof(x->path), "%s", resolved);
    /* The filter space.io.watch.<id>.> without its ">" (the id is ours: always a token). */
    int plen =
        sp_subject_build(x->prefix, sizeof(x->prefix), SP_SUBJ_IO_WATCH_EV, x->id, NULL, NULL);
    x->prefix[plen > 0 ? plen - 1 : 0] = '\0';
    gw_sse_init(&x->sse);
    pthread_mutex_init(&x->mu, NULL);
    uv_async_init(gw->loop, &x->async, on_async);
    x->async.data = x;
    x->next = gw->watches;
    if (gw->watches)
        gw->watches->prev = x;
    gw->watches = x;
    gw->n_watches++;

    lookup_job_t *l = sp_xcalloc(1, sizeof(*l));
    l->x = x;
    l->job.run = lookup_run;
    l->job.done = lookup_done;
    if (gw_job_submit(gw, &l->job) < 0) {
        free(l);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
        x->phase = PH_DONE;
        x->resp_done = true;
        maybe_free(x);
    }
}

void gw_watch_start(gw_req_t *rq, const char *path, const char *user, bool recursive)
{
    watch_new(rq, path, user, recursive, false);
}

void gw_watcher_create(gw_req_t *rq, const char *path, const char *user, bool recursive)
{
    watch_new(rq, path, user, recursive, true);
}

/* The polling watcher id names for the request's sandbox and tenant, or NULL. */
static gw_watch_t *watcher_find(const gw_req_t *rq, const char *id)
{
    for (gw_watch_t *x = rq->gw->watches; x; x = x->next) {
        if (x->polling && x->watcher_id[0] && !x->resp_done && strcmp(x->watcher_id, id) == 0 &&
            strcmp(x->sandbox, rq->path_id) == 0 && strcmp(x->tenant, rq->tenant) == 0)
            return x;
    }
    return NULL;
}

void gw_watcher_events(gw_req_t *rq, const char *watcher_id)
{
    gw_watch_t *x = watcher_find(rq, watcher_id);
    if (!x) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such watcher");
        return;
    }
    process(x); /* what the cnats thread queued since its last wake-up */
    x->polled_ns = sp_mono_ns();
    if (x->ended && x->poll_n == 0) {
        bool gone = strcmp(x->end_error, "not_found") == 0;
        gw_respond_error(rq, gone ? 404 : 503, x->end_error, NULL, "%s", x->end_detail);
        retire(x, x->end_error);
        return;
    }
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"events\":[");
    sp_buf_append(&b, x->poll_buf.data, x->poll_buf.len);
    sp_buf_puts(&b, "]}");
    gw_respond_json(rq, 200, &b);
    sp_buf_dispose(&b);
    sp_buf_reset(&x->poll_buf);
    x->poll_n = 0;
}

void gw_watcher_remove(gw_req_t *rq, const char *watcher_id)
{
    gw_watch_t *x = watcher_find(rq, watcher_id);
    if (!x) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such watcher");
        return;
    }
    retire(x, "removed");
    gw_respond(rq, 200, "application/json", "{}", 2);
}

void gw_watch_run(gw_req_t *rq)
{
    gw_query_t q;
    const char *path = NULL, *user = NULL;
    bool recursive = false;
    if (gw_query_parse(rq->req, &q) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "malformed query string");
        return;
    }
    for (size_t i = 0; i < q.n; i++) {
        const char *k = q.p[i].key, *v = q.p[i].value;
        if (strcmp(k, "path") == 0 && !path) {
            path = v;
        } else if (strcmp(k, "user") == 0 && !user) {
            user = v;
        } else if (strcmp(k, "recursive") == 0) {
            if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0) {
                recursive = true;
            } else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0) {
                recursive = false;
            } else {
                gw_respond_error(rq, 400, "invalid_query", NULL, "recursive: true or false");
                return;
            }
        } else {
            gw_respond_error(rq, 400, "invalid_query", NULL, "unexpected query parameter %.64s", k);
            return;
        }
    }
    if (user && !sp_fspath_home(user)) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "user must be root or user");
        return;
    }
    if (!path) {
        gw_respond_error(rq, 400, "missing_field", NULL, "path is required");
        return;
    }
    gw_watch_start(rq, path, user, recursive);
}
