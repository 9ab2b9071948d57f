/* POST /v1/sandboxes/{id}/commands: run a command in a running sandbox and stream its output
 * (proto/dataplane.proto is the contract with the worker).
 *
 * The flow, for one command:
 * 1. On the loop: the body is validated (gateway_command_body.c); a pool job reads the sandbox
 *    (404 for another tenant's, 409 unless running) and the worker it runs on.
 * 2. A bus job (a blocking NATS sequence, on libuv's thread pool without a database connection)
 *    subscribes to space.io.cmd.<cmd_id>.>, then publishes the CommandRequested intent (names,
 *    sizes and digests only) and waits for the stream's ack, which also means the server has
 *    the subscription before anything can be published on it; then sends the ExecRequest (the
 *    values) to space.io.wkr.<worker>.exec, waiting up to 10 s for the ExecReply.
 * 3. Accepted: the response starts (SSE by default, or one JSON answer at the end with
 *    Accept: application/json). IoChunks and the IoExit arrive on a cnats thread; the callback
 *    decodes them, checks their sequence numbers, and appends them to the command's queue under
 *    its mutex, then wakes the loop with the command's uv_async_t. It never blocks and never
 *    touches loop state: when the queue is over its bound it drops and marks the output
 *    truncated.
 * 4. The loop turns queued chunks into SSE records (through the stream writer,
 *    gateway_sse.c: one write at a time, the next after proceed) or into the collected JSON
 *    answer, and ends the response at the IoExit, or with an error when none came within
 *    timeout_s + command-grace-s (30 s).
 * 5. The subscription is drained off the loop (another bus job); when it is gone, no callback
 *    can run, so the async handle is closed and the command freed in its close callback.
 *
 * Loss: core NATS keeps one publisher's order but a subscriber that falls behind loses
 * messages. Every IoChunk carries seq 1, 2, ...; a gap, or an IoExit whose last_seq is not the
 * last seq that arrived, is reported as "output_lost": true, and never waited for.
 *
 * Bounds: SSE buffers at most command-buffer-bytes per command (queued chunks plus unsent
 * records); beyond that the rest of the output is dropped (truncated), the command keeps
 * running, and the exit event still comes. JSON keeps at most 16 MiB per stream, queue
 * included. A client that goes away is not followed further: the command keeps running (no
 * kill in this version). */
#include "contract.h"
#include "request.h"
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "db.h"
#include "b64.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "sse.h"
#include "xmalloc.h"
#include "text.h"

#define EXEC_TIMEOUT_MS   10000
#define FLUSH_TIMEOUT_MS  5000
#define DEFAULT_TIMEOUT_S 60
#define JSON_CAP          (16 * 1024 * 1024) /* bytes per stream in a JSON answer */
#define CHUNK_DATA_MAX    (64 * 1024)        /* dataplane.proto: IoChunk.data */
#define IO_MSG_MAX        (CHUNK_DATA_MAX + 1024)
#define REPLY_MAX         (64 * 1024)
#define TEXT_MAX          256 /* error texts from the worker, kept */

typedef enum { PH_LOOKUP = 1, PH_SETUP, PH_RUNNING, PH_DONE } phase_t;

typedef struct cmd_encoder cmd_encoder_t; /* how the response is written ("output encoders") */

typedef struct io_chunk io_chunk_t;
struct io_chunk {
    io_chunk_t *next;
    uint64_t seq;
    uint32_t stream;
    size_t len;
    uint8_t data[];
};

typedef struct {
    int32_t exit_code;
    uint32_t signal;
    bool timed_out;
    bool truncated;
    uint64_t bytes[3]; /* by stream: [1] stdout, [2] stderr */
    char error[TEXT_MAX];
} exit_info_t;

/* Fields grouped by who uses them rather than packed: ~32 bytes per command in flight. */
struct gw_cmd {       /* NOLINT(clang-analyzer-optin.performance.Padding) */
    gw_sse_t sse;     /* the streamed response (SSE or Connect) */
    uv_async_t async; /* cnats thread -> loop; closed last */
    gw_t *gw;
    gw_req_t *rq;             /* holds a reference */
    sp_json_doc_t *env_doc;   /* the sandbox's create-time environment; spec borrows from it */
    const cmd_encoder_t *enc; /* chosen once, from the route's dialect and Accept */
    bool streaming;           /* enc streams (SSE or Connect); else one JSON answer at the end */
    bool attach;       /* GET .../stream: no intent, no exec; the worker replays what it kept */
    uint64_t from_seq; /* attach: output after this seq */
    bool skipped;      /* attach: output between from_seq and the oldest kept chunk is gone */
    bool start_sent;   /* SSE: the start record is written */
    bool pty; /* runs in a pty: E2B's data.pty (started so, or attached to such a command) */
    phase_t phase;
    gw_cmd_spec_t spec;
    char cmd_id[SP_ID_MAX + 1];
    char sandbox[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char actor[SP_ID_MAX + 1];
    char request_id[GW_REQUEST_ID_MAX + 1];
    char worker[SP_ID_MAX + 1];
    char event_id[GW_EVENT_ID_LEN + 1];
    char prefix[96]; /* "space.io.cmd.<cmd_id>." */

    /* The bus job in flight (at most one per command). */
    gw_bus_job_t job;
    void (*bus_run)(gw_cmd_t *c);
    void (*bus_done)(gw_cmd_t *c);
    bool bus_busy;
    sp_bus_sub_t *sub; /* written by bus jobs, read on the loop after them */

    /* After a NATS reconnection the IoExit may have been lost: the log is asked for the
     * command's CommandExited at log_check_ns (0: not to be asked), by one job at a time. */
    int64_t log_check_ns;
    bool log_busy;

    /* What the setup job found. */
    gw_cmd_outcome_t outcome;
    int bus_rc;
    const char *bus_step;
    double exec_s; /* < 0: no request was sent */
    char reply_error[64];
    char reply_detail[TEXT_MAX];

    /* Loop side of the response. */
    bool resp_done;    /* nothing more will be written (answered, or the client is gone) */
    bool loop_dropped; /* SSE: the unsent backlog passed the bound */
    bool async_closing;
    int64_t deadline_ns;
    sp_buf_t out[3];     /* JSON: collected output by stream */
    uint8_t carry[3][4]; /* SSE: an incomplete UTF-8 sequence at a chunk's end */
    size_t carry_len[3];

    /* Shared with the cnats thread: under mu. */
    pthread_mutex_t mu;
    io_chunk_t *head, *tail;
    size_t queued;     /* bytes of data in the queue */
    size_t loop_bytes; /* SSE bytes pending or in flight on the loop (published by the loop) */
    uint64_t next_seq; /* the seq expected next */
    uint64_t last_seq; /* the highest seq that arrived */
    uint64_t seen[3];  /* bytes that arrived, kept or not */
    uint64_t kept[3];  /* JSON: bytes kept toward JSON_CAP */
    bool closed;       /* the loop wants nothing more */
    bool lost;         /* a gap in seq, or an unreadable message */
    bool dropped;      /* SSE: the bound was hit; the rest is dropped */
    bool capped;       /* JSON: JSON_CAP was hit */
    bool have_exit;
    exit_info_t exit;
    uint32_t pid; /* 0 until the worker's IoStart (or the attach reply) */
    /* Attach: what arrived before the worker's reply, applied after its replay. */
    bool attaching;
    io_chunk_t *held_head, *held_tail;
    size_t held;
    bool held_have_exit;
    exit_info_t held_exit;
    uint64_t held_exit_last_seq;

    gw_cmd_t *prev, *next;
};

/* ---- bus jobs ---- */

static void cmd_job_run(gw_bus_job_t *job)
{
    gw_cmd_t *c = job->arg;
    c->bus_run(c);
}

static void cmd_job_done(gw_bus_job_t *job)
{
    gw_cmd_t *c = job->arg;
    c->bus_busy = false;
    c->bus_done(c);
}

static void bus_submit(gw_cmd_t *c, void (*run)(gw_cmd_t *), void (*done)(gw_cmd_t *))
{
    c->bus_run = run;
    c->bus_done = done;
    c->bus_busy = true;
    c->job.arg = c;
    c->job.run = cmd_job_run;
    c->job.done = cmd_job_done;
    gw_bus_submit(c->gw, &c->gw->bus_lane, &c->job);
}

/* ---- lifetime ---- */

static void free_chunks(io_chunk_t *q)
{
    while (q) {
        io_chunk_t *n = q->next;
        free(q);
        q = n;
    }
}

static void free_queue(gw_cmd_t *c)
{
    free_chunks(c->head);
    c->head = c->tail = NULL;
    c->queued = 0;
    free_chunks(c->held_head);
    c->held_head = c->held_tail = NULL;
    c->held = 0;
}

static io_chunk_t *chunk_new(uint64_t seq, uint32_t stream, const uint8_t *data, size_t len)
{
    io_chunk_t *q = sp_xmalloc(sizeof(*q) + len);
    q->next = NULL;
    q->seq = seq;
    q->stream = stream;
    q->len = len;
    memcpy(q->data, data, len);
    return q;
}

static void on_async_closed(uv_handle_t *h)
{
    gw_cmd_t *c = h->data;
    gw_t *gw = c->gw;

    if (c->prev)
        c->prev->next = c->next;
    else
        gw->commands = c->next;
    if (c->next)
        c->next->prev = c->prev;
    gw->n_commands--;
    gw->metrics.commands_running--;
    free_queue(c);
    gw_sse_dispose(&c->sse);
    for (int i = 0; i < 3; i++)
        sp_buf_dispose(&c->out[i]);
    gw_cmd_spec_dispose(&c->spec);
    sp_json_doc_free(c->env_doc);
    pthread_mutex_destroy(&c->mu);
    gw_req_unref(c->rq);
    free(c);
}

/* Frees once the response is over and no callback can run any more. */
static void maybe_free(gw_cmd_t *c)
{
    /* bus_busy first: c->sub belongs to the bus job while one runs (TSan). */
    if (!c->resp_done || c->bus_busy || c->log_busy || c->sub || c->async_closing)
        return;
    c->async_closing = true;
    uv_close((uv_handle_t *)&c->async, on_async_closed);
}

static void unsub_run(gw_cmd_t *c)
{
    sp_bus_unsubscribe(c->sub);
    c->sub = NULL;
}

static void unsub_done(gw_cmd_t *c)
{
    maybe_free(c);
}

/* Stops taking output and drains the subscription off the loop. */
static void drop_sub(gw_cmd_t *c)
{
    pthread_mutex_lock(&c->mu);
    c->closed = true;
    free_queue(c);
    pthread_mutex_unlock(&c->mu);
    if (c->sub && !c->bus_busy)
        bus_submit(c, unsub_run, unsub_done);
}

/* The response is over (answered with an error, or the client is gone). */
static void resp_over(gw_cmd_t *c)
{
    c->resp_done = true;
    maybe_free(c);
}

/* ---- text ---- */

/* The length of the longest well-formed prefix; *ret_tail_partial when what follows it is the
 * start of a sequence cut by the end of the buffer. */
static size_t utf8_prefix(const uint8_t *p, size_t n, bool *ret_tail_partial)
{
    size_t i = 0;
    *ret_tail_partial = false;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        bool partial;
        size_t k = sp_utf8_seq(p + i, n - i, &partial);
        if (k == 0) {
            *ret_tail_partial = partial;
            return i;
        }
        i += k;
    }
    return n;
}

static bool utf8_valid(const uint8_t *p, size_t n)
{
    bool partial;
    return utf8_prefix(p, n, &partial) == n;
}

/* An error text from the worker (untrusted) or ours, as a JSON value: null when empty. */
static void json_error(sp_buf_t *b, const char *s)
{
    if (!s || !s[0]) {
        sp_buf_puts(b, "null");
        return;
    }
    sp_buf_t safe;
    sp_buf_init(&safe);
    sp_buf_safe_text(&safe, s, TEXT_MAX);
    sp_buf_json_str(b, safe.data ? safe.data : "");
    sp_buf_dispose(&safe);
}

static const char *stream_name(uint32_t stream)
{
    return stream == 2 ? "stderr" : "stdout";
}

/* ---- the data plane (cnats thread) ---- */

/* One chunk in sequence (c->mu held): checks its seq against what came before, applies the
 * bounds, queues it for the loop. Whether the loop needs waking. */
static bool accept_chunk(gw_cmd_t *c, uint64_t seq, uint32_t stream, const uint8_t *data,
                         size_t len)
{
    if (seq < c->next_seq)
        return false; /* a repeat (a replayed chunk that also came live), or out of order */
    if (seq != c->next_seq)
        c->lost = true;
    c->next_seq = seq + 1;
    c->last_seq = seq;
    c->seen[stream] += len;
    size_t keep = len;
    if (!c->streaming) {
        uint64_t room = JSON_CAP - c->kept[stream];
        if (keep > room) {
            keep = (size_t)room;
            c->capped = true;
        }
        c->kept[stream] += keep;
    } else if (c->dropped ||
               c->queued + c->loop_bytes + keep > (size_t)c->gw->cfg->command_buffer_bytes) {
        /* Never wait for the loop here: past the bound the rest of the output is dropped. */
        c->dropped = true;
        keep = 0;
    }
    if (keep == 0)
        return false;
    io_chunk_t *q = chunk_new(seq, stream, data, keep);
    if (c->tail)
        c->tail->next = q;
    else
        c->head = q;
    c->tail = q;
    c->queued += keep;
    return true;
}

/* The IoExit (c->mu held). Whether the loop needs waking. */
static bool accept_exit(gw_cmd_t *c, const exit_info_t *ex, uint64_t last_seq)
{
    if (c->have_exit)
        return false;
    c->have_exit = true;
    c->exit = *ex;
    if (last_seq != c->last_seq)
        c->lost = true;
    return true;
}

static void on_chunk(gw_cmd_t *c, const uint8_t *data, size_t len)
{
    Space__Io__V1__IoChunk *m = NULL;
    bool bad = len > IO_MSG_MAX;
    bool wake = false;

    if (!bad)
        m = space__io__v1__io_chunk__unpack(NULL, len, data);
    bad = bad || !m || strcmp(m->cmd_id, c->cmd_id) != 0 || (m->stream != 1 && m->stream != 2) ||
          m->data.len > CHUNK_DATA_MAX || m->seq == 0;

    pthread_mutex_lock(&c->mu);
    if (c->closed || c->have_exit)
        goto out;
    if (bad) {
        /* Whatever it carried cannot be shown: the output has a hole. */
        c->lost = true;
        goto out;
    }
    if (c->attaching) {
        /* Until the worker's replay is in, live chunks wait (bounded like the queue). */
        if (c->held + m->data.len > (size_t)c->gw->cfg->command_buffer_bytes) {
            c->lost = true;
            goto out;
        }
        io_chunk_t *q = chunk_new(m->seq, m->stream, m->data.data, m->data.len);
        if (c->held_tail)
            c->held_tail->next = q;
        else
            c->held_head = q;
        c->held_tail = q;
        c->held += m->data.len;
        goto out;
    }
    wake = accept_chunk(c, m->seq, m->stream, m->data.data, m->data.len);
out:
    pthread_mutex_unlock(&c->mu);
    if (m)
        space__io__v1__io_chunk__free_unpacked(m, NULL);
    if (wake)
        uv_async_send(&c->async);
}

static void exit_info_from(exit_info_t *ex, const Space__Io__V1__IoExit *m)
{
    memset(ex, 0, sizeof(*ex));
    ex->exit_code = m->exit_code;
    ex->signal = m->signal;
    ex->timed_out = m->timed_out;
    ex->truncated = m->truncated;
    ex->bytes[1] = m->stdout_bytes;
    ex->bytes[2] = m->stderr_bytes;
    snprintf(ex->error, sizeof(ex->error), "%s", m->error);
}

static void on_exit_msg(gw_cmd_t *c, const uint8_t *data, size_t len)
{
    Space__Io__V1__IoExit *m = NULL;
    bool wake = false;

    if (len <= REPLY_MAX)
        m = space__io__v1__io_exit__unpack(NULL, len, data);
    pthread_mutex_lock(&c->mu);
    if (!c->closed && !c->have_exit) {
        if (!m || strcmp(m->cmd_id, c->cmd_id) != 0) {
            /* Unreadable: the deadline ends the command. */
            c->lost = true;
        } else if (c->attaching) {
            c->held_have_exit = true;
            exit_info_from(&c->held_exit, m);
            c->held_exit_last_seq = m->last_seq;
        } else {
            exit_info_t ex;
            exit_info_from(&ex, m);
            wake = accept_exit(c, &ex, m->last_seq);
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (m)
        space__io__v1__io_exit__free_unpacked(m, NULL);
    if (wake)
        uv_async_send(&c->async);
}

static void on_start_msg(gw_cmd_t *c, const uint8_t *data, size_t len)
{
    Space__Io__V1__IoStart *m =
        len <= REPLY_MAX ? space__io__v1__io_start__unpack(NULL, len, data) : NULL;
    bool wake = false;
    pthread_mutex_lock(&c->mu);
    if (m && strcmp(m->cmd_id, c->cmd_id) == 0 && !c->closed && c->pid == 0) {
        c->pid = m->pid;
        wake = true;
    }
    pthread_mutex_unlock(&c->mu);
    if (m)
        space__io__v1__io_start__free_unpacked(m, NULL);
    if (wake)
        uv_async_send(&c->async);
}

static void on_msg(void *arg, const char *subject, const char *reply, const uint8_t *data,
                   size_t len)
{
    gw_cmd_t *c = arg;
    size_t n = strlen(c->prefix);
    (void)reply;

    if (strncmp(subject, c->prefix, n) != 0)
        return;
    if (strcmp(subject + n, "out") == 0)
        on_chunk(c, data, len);
    else if (strcmp(subject + n, "exit") == 0)
        on_exit_msg(c, data, len);
    else if (strcmp(subject + n, "start") == 0)
        on_start_msg(c, data, len);
}

/* ---- SSE output (loop) ---- */

static void publish_loop_bytes(gw_cmd_t *c)
{
    pthread_mutex_lock(&c->mu);
    c->loop_bytes = gw_sse_backlog(&c->sse);
    if (c->loop_dropped)
        c->dropped = true; /* nothing more needs queueing */
    pthread_mutex_unlock(&c->mu);
}

static void on_written(gw_sse_t *w)
{
    publish_loop_bytes(H2O_STRUCT_FROM_MEMBER(gw_cmd_t, sse, w));
}

/* The response is over: after the exit record, or the client went away. */
static void on_closed(gw_sse_t *w)
{
    gw_cmd_t *c = H2O_STRUCT_FROM_MEMBER(gw_cmd_t, sse, w);
    if (c->phase == PH_RUNNING) {
        /* The client went away: the command keeps running, unwatched. */
        c->phase = PH_DONE;
        c->gw->metrics.command_ends[GW_CMD_END_CLIENT]++;
        sp_log(SP_LOG_INFO, "command client gone", SP_KS("cmd_id", c->cmd_id),
               SP_KS("sandbox", c->sandbox), SP_KS("request_id", c->request_id));
        drop_sub(c);
    }
    resp_over(c);
}

/* ---- output encoders ----
 *
 * How a command's response is written, chosen once when the command starts (cmd_start), from
 * the route's dialect and the Accept header: SSE records (ours, by default), one JSON answer at
 * the end (ours, Accept: application/json) or Connect streaming envelopes (E2B envd's
 * Process.Start and Connect). Every place that writes command output calls the encoder. */

/* What the end of a command reports besides its IoExit. */
typedef struct {
    bool truncated, lost;
    uint64_t last_seq;
} cmd_totals_t;

struct cmd_encoder {
    /* The streamed response's type and writer callbacks; NULL: one answer at the end. */
    const char *content_type;
    const gw_sse_ops_t *ops;
    /* A background command's output still streams here (E2B: Start answers with its output);
     * else the answer to a background command is 202 and the client attaches. */
    bool follows_background;
    /* Without timeout_s the command is not bounded by a default one (envd: only
     * Connect-Timeout-Ms bounds it). */
    bool unbounded;
    /* The start record (pid 0: not known yet); NULL: none. Once, before any output. */
    void (*start)(gw_cmd_t *c, uint32_t pid);
    /* One chunk of output, in seq order. */
    void (*output)(gw_cmd_t *c, uint64_t seq, uint32_t stream, const uint8_t *p, size_t n);
    /* The end (ex: the worker's IoExit, or one the gateway made): the last records, and the
     * response ends. */
    void (*end)(gw_cmd_t *c, gw_cmd_end_t how, const exit_info_t *ex, const cmd_totals_t *t);
};

static void connect_event(gw_cmd_t *c, const char *json, size_t len)
{
    gw_connect_envelope(&c->sse.pending, 0, json, len);
}

/* E2B: the start event must be the first message; keepalives only after it. */
static void connect_keepalive(gw_sse_t *w)
{
    static const char ka[] = "{\"event\":{\"keepalive\":{}}}";
    gw_cmd_t *c = H2O_STRUCT_FROM_MEMBER(gw_cmd_t, sse, w);
    if (c->start_sent)
        connect_event(c, ka, sizeof(ka) - 1);
}

/* The x-command-id header of every answer that names a command (SSE, JSON, 202). */
static void command_id_header(h2o_req_t *req, const char *cmd_id)
{
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-command-id"), 0, NULL,
                          cmd_id, strlen(cmd_id));
}

static void add_command_id(gw_sse_t *w, h2o_req_t *req)
{
    command_id_header(req, H2O_STRUCT_FROM_MEMBER(gw_cmd_t, sse, w)->cmd_id);
}

static const gw_sse_ops_t sse_ops = {
    .headers = add_command_id, .written = on_written, .closed = on_closed};
static const gw_sse_ops_t connect_ops = {.keepalive = connect_keepalive,
                                         .headers = add_command_id,
                                         .written = on_written,
                                         .closed = on_closed};

static void connect_data(gw_cmd_t *c, uint32_t stream, const uint8_t *p, size_t n)
{
    sp_buf_t b;
    sp_buf_init(&b);
    /* A pty's output is one stream (1): E2B calls it "pty". */
    sp_buf_printf(&b, "{\"event\":{\"data\":{\"%s\":\"",
                  c->pty        ? "pty"
                  : stream == 2 ? "stderr"
                                : "stdout");
    sp_b64_encode(&b, p, n);
    sp_buf_puts(&b, "\"}}}");
    connect_event(c, b.data, b.len);
    sp_buf_dispose(&b);
}

/* An output record; its id is the seq of the chunk, so a client that reconnects with
 * Last-Event-ID gets what came after. */
static void sse_record(gw_cmd_t *c, uint64_t seq, const char *event, const uint8_t *p, size_t n,
                       bool b64)
{
    sp_buf_t *b = &c->sse.pending;
    sp_sse_record_begin(b, seq, event);
    sp_buf_printf(b, "{\"%s\":", b64 ? "b64" : "text");
    if (b64) {
        sp_buf_putc(b, '"');
        sp_b64_encode(b, p, n);
        sp_buf_putc(b, '"');
    } else {
        sp_buf_json_strn(b, p, n);
    }
    sp_buf_putc(b, '}');
    sp_sse_record_end(b);
}

/* The client reads slower than the command writes: past command-buffer-bytes of backlog, what
 * this chunk added (from before) is taken back and the rest of the output is dropped. */
static void bound_backlog(gw_cmd_t *c, uint32_t stream, size_t before)
{
    sp_buf_t *pending = &c->sse.pending;
    if (gw_sse_backlog(&c->sse) <= (size_t)c->gw->cfg->command_buffer_bytes)
        return;
    pending->len = before;
    if (pending->data)
        pending->data[before] = '\0';
    c->carry_len[stream] = 0;
    c->loop_dropped = true;
}

/* SSE: one chunk as records, text while it is well-formed UTF-8 (a sequence cut by the chunk's
 * end waits for the next chunk of its stream), else base64. */
static void sse_output(gw_cmd_t *c, uint64_t seq, uint32_t stream, const uint8_t *data, size_t len)
{
    uint8_t *joined = NULL;
    const uint8_t *p = data;
    size_t n = len, before = c->sse.pending.len;
    bool partial;

    if (c->loop_dropped)
        return;
    if (c->carry_len[stream] > 0) {
        joined = sp_xmalloc(c->carry_len[stream] + len);
        memcpy(joined, c->carry[stream], c->carry_len[stream]);
        memcpy(joined + c->carry_len[stream], data, len);
        p = joined;
        n = c->carry_len[stream] + len;
        c->carry_len[stream] = 0;
    }
    size_t ok = utf8_prefix(p, n, &partial);
    if (ok == n) {
        sse_record(c, seq, stream_name(stream), p, n, false);
    } else if (partial && n - ok < 4) {
        if (ok > 0)
            sse_record(c, seq, stream_name(stream), p, ok, false);
        memcpy(c->carry[stream], p + ok, n - ok);
        c->carry_len[stream] = n - ok;
    } else {
        sse_record(c, seq, stream_name(stream), p, n, true);
    }
    free(joined);
    bound_backlog(c, stream, before);
}

/* Connect: one chunk, one ProcessEvent.data (base64, as protobuf's JSON has bytes). */
static void connect_output(gw_cmd_t *c, uint64_t seq, uint32_t stream, const uint8_t *p, size_t n)
{
    size_t before = c->sse.pending.len;
    (void)seq;
    if (c->loop_dropped)
        return;
    connect_data(c, stream, p, n);
    bound_backlog(c, stream, before);
}

/* JSON: collected until the end (bounded by JSON_CAP on the cnats thread). */
static void json_collect(gw_cmd_t *c, uint64_t seq, uint32_t stream, const uint8_t *p, size_t n)
{
    (void)seq;
    sp_buf_append(&c->out[stream], p, n);
}

static void json_exit_fields(sp_buf_t *b, const exit_info_t *ex, bool truncated, bool lost)
{
    sp_buf_printf(b, "\"exit_code\":%" PRId32 ",\"signal\":%" PRIu32 ",\"timed_out\":%s,\"error\":",
                  ex->exit_code, ex->signal, ex->timed_out ? "true" : "false");
    json_error(b, ex->error);
    sp_buf_printf(b,
                  ",\"truncated\":%s,\"stdout_bytes\":%" PRIu64 ",\"stderr_bytes\":%" PRIu64
                  ",\"output_lost\":%s",
                  truncated ? "true" : "false", ex->bytes[1], ex->bytes[2],
                  lost ? "true" : "false");
}

/* The start record, once, before any output: with the pid when the worker has told it. */
static void send_start(gw_cmd_t *c)
{
    if (!c->enc->start || c->start_sent)
        return;
    c->start_sent = true;
    pthread_mutex_lock(&c->mu);
    uint32_t pid = c->pid;
    pthread_mutex_unlock(&c->mu);
    c->enc->start(c, pid);
}

static void sse_start(gw_cmd_t *c, uint32_t pid)
{
    sp_buf_t *b = &c->sse.pending;
    sp_sse_record_begin(b, 0, "start");
    sp_buf_puts(b, "{\"cmd_id\":");
    sp_buf_json_str(b, c->cmd_id);
    if (pid)
        sp_buf_printf(b, ",\"pid\":%" PRIu32, pid);
    else
        sp_buf_puts(b, ",\"pid\":null");
    if (c->attach)
        sp_buf_printf(b, ",\"attached\":true,\"from_seq\":%" PRIu64 ",\"output_skipped\":%s",
                      c->from_seq, c->skipped ? "true" : "false");
    sp_buf_putc(b, '}');
    sp_sse_record_end(b);
}

static void connect_start(gw_cmd_t *c, uint32_t pid)
{
    char ev[64];
    int n = snprintf(ev, sizeof(ev), "{\"event\":{\"start\":{\"pid\":%" PRIu32 "}}}", pid);
    connect_event(c, ev, (size_t)n);
}

static void json_output(sp_buf_t *b, const char *name, const sp_buf_t *o)
{
    const uint8_t *p = (const uint8_t *)(o->data ? o->data : "");
    sp_buf_printf(b, ",\"%s\":", name);
    if (utf8_valid(p, o->len)) {
        sp_buf_json_strn(b, p, o->len);
        return;
    }
    /* Not UTF-8 (binary, or a character cut by the cap): null, and the bytes in base64. */
    sp_buf_printf(b, "null,\"%s_b64\":\"", name);
    sp_b64_encode(b, p, o->len);
    sp_buf_putc(b, '"');
}

/* E2B's end event (ProcessEvent.end, as envd's Go os.ProcessState words it) and the
 * end-stream message. A non-zero exit carries an error, which the SDK raises. */
static void connect_end(gw_cmd_t *c, const exit_info_t *ex)
{
    char status[TEXT_MAX + 32];
    sp_buf_t b;
    bool exited = ex->signal == 0 && !ex->error[0];
    if (ex->error[0])
        snprintf(status, sizeof(status), "%s", ex->error);
    else if (ex->signal == 9)
        snprintf(status, sizeof(status), "signal: killed");
    else if (ex->signal == 15)
        snprintf(status, sizeof(status), "signal: terminated");
    else if (ex->signal)
        snprintf(status, sizeof(status), "signal: %" PRIu32, ex->signal);
    else
        snprintf(status, sizeof(status), "exit status %" PRId32, ex->exit_code);
    sp_buf_init(&b);
    sp_buf_printf(&b, "{\"event\":{\"end\":{\"exitCode\":%" PRId32 ",\"exited\":%s,\"status\":",
                  exited ? ex->exit_code : -1, exited ? "true" : "false");
    json_error(&b, status);
    if (!exited || ex->exit_code != 0) {
        sp_buf_puts(&b, ",\"error\":");
        json_error(&b, status);
    }
    sp_buf_puts(&b, "}}}");
    connect_event(c, b.data, b.len);
    gw_connect_envelope(&c->sse.pending, GW_CONNECT_END_STREAM, "{}", 2);
    sp_buf_dispose(&b);
}

static void connect_finish(gw_cmd_t *c, gw_cmd_end_t how, const exit_info_t *ex,
                           const cmd_totals_t *t)
{
    (void)t;
    if (how == GW_CMD_END_EXIT && ex->exit_code == -1 && !ex->signal &&
        strcmp(ex->error, SP_CMD_ERROR_SANDBOX_DELETED) == 0) {
        /* E2B: the sandbox's VM is gone, and with it the connection: no end event, no
         * end-stream. The SDK then probes /health, which must say gone at once (even while
         * the log has not stored the delete yet), and raises TimeoutError. */
        gw_gone_note(c->gw, c->sandbox);
        send_start(c);
        gw_sse_cut(&c->sse, SP_CMD_ERROR_SANDBOX_DELETED);
        publish_loop_bytes(c);
        return;
    }
    send_start(c);
    connect_end(c, ex);
    gw_sse_end(&c->sse);
    publish_loop_bytes(c);
}

static void sse_finish(gw_cmd_t *c, gw_cmd_end_t how, const exit_info_t *ex, const cmd_totals_t *t)
{
    (void)how;
    for (uint32_t s = 1; s <= 2; s++)
        if (c->carry_len[s] > 0 && !c->loop_dropped)
            sse_record(c, t->last_seq, stream_name(s), c->carry[s], c->carry_len[s], true);
    send_start(c);
    sp_sse_record_begin(&c->sse.pending, 0, "exit");
    sp_buf_putc(&c->sse.pending, '{');
    json_exit_fields(&c->sse.pending, ex, t->truncated, t->lost);
    sp_buf_putc(&c->sse.pending, '}');
    sp_sse_record_end(&c->sse.pending);
    gw_sse_end(&c->sse);
    publish_loop_bytes(c);
}

static void json_finish(gw_cmd_t *c, gw_cmd_end_t how, const exit_info_t *ex, const cmd_totals_t *t)
{
    if (how == GW_CMD_END_SHUTDOWN) {
        sp_buf_t extra;
        sp_buf_init(&extra);
        sp_buf_puts(&extra, "\"cmd_id\":");
        sp_buf_json_str(&extra, c->cmd_id);
        gw_respond_error(c->rq, 503, "shutting_down", extra.data,
                         "the gateway is stopping; the command keeps running");
        sp_buf_dispose(&extra);
        c->resp_done = true;
        return;
    }
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"cmd_id\":");
    sp_buf_json_str(&b, c->cmd_id);
    json_output(&b, "stdout", &c->out[1]);
    sp_buf_dispose(&c->out[1]);
    json_output(&b, "stderr", &c->out[2]);
    sp_buf_dispose(&c->out[2]);
    sp_buf_putc(&b, ',');
    json_exit_fields(&b, ex, t->truncated, t->lost);
    sp_buf_putc(&b, '}');
    if (gw_req_live(c->rq))
        command_id_header(c->rq->req, c->cmd_id);
    gw_respond_json(c->rq, 200, &b);
    sp_buf_dispose(&b);
    c->resp_done = true;
}

static const cmd_encoder_t sse_encoder = {.content_type = "text/event-stream",
                                          .ops = &sse_ops,
                                          .start = sse_start,
                                          .output = sse_output,
                                          .end = sse_finish};
static const cmd_encoder_t json_encoder = {.output = json_collect, .end = json_finish};
static const cmd_encoder_t connect_encoder = {.content_type = "application/connect+json",
                                              .ops = &connect_ops,
                                              .follows_background = true,
                                              .unbounded = true,
                                              .start = connect_start,
                                              .output = connect_output,
                                              .end = connect_finish};

/* ---- ending ---- */

/* The answer once the command is over: ex is the worker's IoExit, or one the gateway made. */
static void conclude(gw_cmd_t *c, gw_cmd_end_t how, const exit_info_t *ex)
{
    gw_t *gw = c->gw;
    cmd_totals_t t;

    if (c->phase != PH_RUNNING)
        return;
    c->phase = PH_DONE;
    pthread_mutex_lock(&c->mu);
    t.lost = c->lost;
    t.truncated = ex->truncated || c->dropped || c->capped || c->loop_dropped;
    t.last_seq = c->last_seq;
    pthread_mutex_unlock(&c->mu);
    gw->metrics.command_ends[how]++;
    if (t.lost)
        gw->metrics.commands_output_lost++;
    if (t.truncated)
        gw->metrics.commands_truncated++;
    sp_log(SP_LOG_INFO, "command ended", SP_KS("cmd_id", c->cmd_id), SP_KS("sandbox", c->sandbox),
           SP_KI("exit_code", ex->exit_code), SP_KU("signal", ex->signal),
           SP_KS("error", ex->error), SP_KI("truncated", t.truncated), SP_KI("output_lost", t.lost),
           SP_KS("request_id", c->request_id));
    c->enc->end(c, how, ex, &t);
    drop_sub(c);
    maybe_free(c);
}

static void made_exit(exit_info_t *ex, const gw_cmd_t *c, const char *error)
{
    memset(ex, 0, sizeof(*ex));
    ex->exit_code = -1;
    ex->bytes[1] = c->seen[1];
    ex->bytes[2] = c->seen[2];
    snprintf(ex->error, sizeof(ex->error), "%s", error);
}

/* Moves what the cnats thread queued into the response; ends it at the IoExit. */
static void process_io(gw_cmd_t *c)
{
    io_chunk_t *q;
    bool have_exit;
    exit_info_t ex;

    if (c->phase != PH_RUNNING)
        return;
    pthread_mutex_lock(&c->mu);
    q = c->head;
    c->head = c->tail = NULL;
    c->queued = 0;
    have_exit = c->have_exit;
    if (have_exit)
        ex = c->exit;
    bool start = c->pid != 0 || q || have_exit;
    pthread_mutex_unlock(&c->mu);

    if (start)
        send_start(c);
    while (q) {
        io_chunk_t *next = q->next;
        c->enc->output(c, q->seq, q->stream, q->data, q->len);
        free(q);
        q = next;
    }
    if (c->streaming) {
        gw_sse_flush(&c->sse);
        publish_loop_bytes(c);
    }
    if (have_exit)
        conclude(c, GW_CMD_END_EXIT, &ex);
}

static void on_async(uv_async_t *a)
{
    process_io(a->data);
}

/* ---- starting ---- */

static void start_output(gw_cmd_t *c)
{
    gw_t *gw = c->gw;
    int64_t timeout_s = c->spec.timeout_s ? c->spec.timeout_s : DEFAULT_TIMEOUT_S;

    c->phase = PH_RUNNING;
    /* An attached command's timeout is not known here: it ends with its exit, or the client. */
    c->deadline_ns = c->attach || (c->enc->unbounded && !c->spec.timeout_s)
                         ? INT64_MAX
                         : sp_mono_ns() + (timeout_s + gw->cfg->command_grace_s) * 1000000000LL;
    if (!gw_req_live(c->rq)) {
        c->phase = PH_DONE;
        gw->metrics.command_ends[GW_CMD_END_CLIENT]++;
        drop_sub(c);
        resp_over(c);
        return;
    }
    if (c->streaming)
        gw_sse_start(&c->sse, c->rq, c->enc->content_type, c->enc->ops);
    process_io(c);
}

/* Maps a worker's refusal (untrusted text, kept short) to an outcome. */
static gw_cmd_outcome_t refusal_outcome(gw_cmd_t *c, const char *error, const char *detail)
{
    snprintf(c->reply_error, sizeof(c->reply_error), "%s", error);
    snprintf(c->reply_detail, sizeof(c->reply_detail), "%s", detail);
    if (strcmp(error, "sandbox_not_running") == 0)
        return GW_CMD_SANDBOX_NOT_RUNNING;
    if (strcmp(error, "agent_unavailable") == 0)
        return GW_CMD_AGENT_UNAVAILABLE;
    if (strcmp(error, "too_many_commands") == 0)
        return GW_CMD_TOO_MANY;
    if (strcmp(error, "not_found") == 0)
        return GW_CMD_NOT_FOUND;
    return GW_CMD_WORKER_ERROR;
}

/* The attach is answered (c->mu held): what arrived live meanwhile, then the exit. Whether the
 * loop needs waking. */
static bool release_held(gw_cmd_t *c)
{
    bool wake = false;
    io_chunk_t *held = c->held_head;
    c->held_head = c->held_tail = NULL;
    c->held = 0;
    c->attaching = false;
    for (io_chunk_t *k = held; k; k = k->next)
        wake |= accept_chunk(c, k->seq, k->stream, k->data, k->len);
    free_chunks(held);
    if (c->held_have_exit)
        wake |= accept_exit(c, &c->held_exit, c->held_exit_last_seq);
    return wake;
}

/* Chunks the worker replayed in its answer (c->mu held): unreadable ones are a hole. Whether
 * the loop needs waking. */
static bool accept_replay(gw_cmd_t *c, Space__Io__V1__IoChunk *const *replay, size_t n)
{
    bool wake = false;
    for (size_t i = 0; i < n; i++) {
        const Space__Io__V1__IoChunk *k = replay[i];
        if (k->seq == 0 || (k->stream != 1 && k->stream != 2) || k->data.len > CHUNK_DATA_MAX) {
            c->lost = true;
            continue;
        }
        wake |= accept_chunk(c, k->seq, k->stream, k->data.data, k->data.len);
    }
    return wake;
}

/* Bus thread, attach: the subscription is in place; ask the worker for what it kept after
 * from_seq, apply it, then what arrived live meanwhile (repeats drop out by seq). */
static int attach_request(gw_cmd_t *c)
{
    Space__Io__V1__CtlRequest q = SPACE__IO__V1__CTL_REQUEST__INIT;
    char subject[160];
    uint8_t *req, *reply = NULL;
    size_t reply_len = 0;
    bool wake = false;

    q.sandbox = c->sandbox;
    q.tenant = c->tenant;
    q.op = "attach";
    q.cmd_id = c->cmd_id;
    q.from_seq = c->from_seq;
    size_t len = space__io__v1__ctl_request__get_packed_size(&q);
    req = sp_xmalloc(len);
    space__io__v1__ctl_request__pack(&q, req);
    c->bus_step = "request";
    int64_t t0 = sp_mono_ns();
    int rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_CTL, c->worker, NULL, NULL);
    if (rc >= 0)
        rc = sp_request_send(c->gw->bus, subject, req, len, EXEC_TIMEOUT_MS, &reply, &reply_len);
    c->exec_s = (double)(sp_mono_ns() - t0) / 1e9;
    free(req);
    if (rc == SP_ENOTFOUND || rc == SP_ETIMEOUT) {
        c->outcome = GW_CMD_WORKER_UNAVAILABLE;
        return rc;
    }
    if (rc < 0)
        return rc;
    Space__Io__V1__CtlReply *r = reply_len <= SP_BUS_MAX_MSG
                                     ? space__io__v1__ctl_reply__unpack(NULL, reply_len, reply)
                                     : NULL;
    free(reply);
    if (!r) {
        c->outcome = refusal_outcome(c, "bad_reply", "the worker's reply is unreadable");
        return 0;
    }
    if (!r->ok || r->n_commands != 1 || strcmp(r->commands[0]->cmd_id, c->cmd_id) != 0) {
        c->outcome =
            refusal_outcome(c, r->ok ? "bad_reply" : r->error,
                            r->ok ? "the worker's reply names another command" : r->detail);
        space__io__v1__ctl_reply__free_unpacked(r, NULL);
        return 0;
    }
    c->outcome = GW_CMD_ACCEPTED;
    pthread_mutex_lock(&c->mu);
    if (r->commands[0]->pid)
        c->pid = r->commands[0]->pid; /* else its IoStart is on the way */
    c->next_seq = c->from_seq + 1;
    c->last_seq = c->from_seq;
    if (r->first_kept_seq > c->next_seq) {
        /* Older output did not fit in what the worker keeps: for a command this request
         * started (a reply wait's), output it lacks. */
        c->skipped = true;
        c->lost |= !c->attach;
        c->next_seq = r->first_kept_seq;
        c->last_seq = r->first_kept_seq - 1;
    }
    wake |= accept_replay(c, r->replay, r->n_replay);
    if (r->exit) {
        c->held_have_exit = true;
        exit_info_from(&c->held_exit, r->exit);
        c->held_exit_last_seq = r->exit->last_seq;
    }
    wake |= release_held(c);
    pthread_mutex_unlock(&c->mu);
    space__io__v1__ctl_reply__free_unpacked(r, NULL);
    if (wake)
        uv_async_send(&c->async);
    return 0;
}

/* Bus thread: the worker answered a waiting ExecRequest (reply_wait_ms) with the command's output
 * so far, applied as if it had come live. With the command's end, that is all. Without, the
 * command runs on: followed like an attach of what came after the answer (subscribe, then ask
 * for it; the worker keeps it until asked, worker_commands.c). */
static int waited_reply(gw_cmd_t *c, const Space__Io__V1__ExecReply *r)
{
    char subject[160];
    int rc;

    if (r->exit) {
        if (strcmp(r->exit->cmd_id, c->cmd_id) != 0) {
            c->outcome =
                refusal_outcome(c, "bad_reply", "the worker's reply names another command");
            return 0;
        }
        exit_info_t ex;
        exit_info_from(&ex, r->exit);
        pthread_mutex_lock(&c->mu);
        if (r->pid)
            c->pid = r->pid;
        (void)accept_replay(c, r->replay, r->n_replay);
        (void)accept_exit(c, &ex, r->exit->last_seq);
        pthread_mutex_unlock(&c->mu);
        return 0; /* start_output takes the queue */
    }
    pthread_mutex_lock(&c->mu);
    if (r->pid)
        c->pid = r->pid;
    (void)accept_replay(c, r->replay, r->n_replay);
    c->from_seq = c->last_seq;
    c->attaching = true;
    pthread_mutex_unlock(&c->mu);
    c->bus_step = "subscribe";
    if ((rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_CMD, c->cmd_id, NULL, NULL)) <
            0 ||
        (rc = sp_bus_subscribe(c->gw->bus, subject, NULL, on_msg, c, &c->sub)) < 0)
        return rc;
    c->bus_step = "flush";
    if ((rc = sp_bus_flush(c->gw->bus, FLUSH_TIMEOUT_MS)) < 0)
        return rc;
    double waited_s = c->exec_s;
    rc = attach_request(c);
    c->exec_s = waited_s;
    if (rc < 0 || c->outcome != GW_CMD_ACCEPTED) {
        /* The worker let go of the command since it took it (a suspend, a snapshot or its own
         * stop: the command runs on inside, and its output comes live again once the sandbox
         * is back). Followed live, as a command was before reply waits; what it wrote before
         * is lost. */
        sp_log(SP_LOG_INFO, "a waited command could not be attached: followed live",
               SP_KS("cmd_id", c->cmd_id),
               SP_KS("error", rc < 0 ? sp_strerror(rc) : c->reply_error),
               SP_KS("request_id", c->request_id));
        pthread_mutex_lock(&c->mu);
        c->lost = true;
        (void)release_held(c);
        pthread_mutex_unlock(&c->mu);
        c->outcome = GW_CMD_ACCEPTED;
    }
    return 0;
}

/* Bus thread: subscribe, publish the intent (an attach flushes instead), send the ExecRequest. */
static void setup_run(gw_cmd_t *c)
{
    sp_bus_t *bus = c->gw->bus;
    char subject[160];
    uint8_t *req = NULL, *reply = NULL;
    size_t req_len = 0, reply_len = 0;
    gw_cmd_intent_t in;
    int rc;

    c->exec_s = -1;
    c->outcome = GW_CMD_BUS_ERROR;
    /* A command answered in one JSON document, which nobody feeds: the worker answers at its
     * end, with its output, when that comes within the wait (no subscription, nothing live). */
    uint32_t wait_ms = 0;
    if (!c->attach && !c->streaming && !c->spec.background && !c->spec.stdin_open &&
        !c->spec.pty_rows)
        wait_ms = (uint32_t)c->gw->cfg->command_reply_wait_ms;
    if ((!c->spec.background || c->enc->follows_background) && !wait_ms) {
        c->bus_step = "subscribe";
        /* The filter of the command's output subjects, space.io.cmd.<cmd_id>.> (contract.h);
         * -EINVAL for a command id that is no subject token. */
        if ((rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_CMD, c->cmd_id, NULL,
                                   NULL)) < 0 ||
            (rc = sp_bus_subscribe(bus, subject, NULL, on_msg, c, &c->sub)) < 0)
            goto out;
        /* The server knows the subscription before anything can cause output on it: it handles
         * one connection's messages in order, so the acknowledged publish of the intent below
         * proves it (one round trip less); an attach publishes nothing and flushes. */
        c->bus_step = "flush";
        if (c->attach && (rc = sp_bus_flush(bus, FLUSH_TIMEOUT_MS)) < 0)
            goto out;
    }
    if (c->attach) {
        rc = attach_request(c);
        goto out;
    }
    c->bus_step = "publish";
    gw_cmd_intent_init(&in, &c->spec, c->sandbox, c->tenant, c->actor, c->request_id, c->cmd_id,
                       c->gw->cfg->seal_output);
    if ((rc = sp_publish_event(bus, &in.env, c->event_id, c->worker, NULL, NULL)) < 0)
        goto out;
    c->bus_step = "request";
    if ((rc = gw_cmd_exec_pack(&c->spec, c->sandbox, c->tenant, c->cmd_id, c->event_id,
                               c->request_id, wait_ms, &req, &req_len)) < 0)
        goto out;
    int64_t t0 = sp_mono_ns();
    rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_EXEC, c->worker, NULL, NULL);
    if (rc >= 0)
        rc = sp_request_send(bus, subject, req, req_len, EXEC_TIMEOUT_MS + (int)wait_ms, &reply,
                             &reply_len);
    c->exec_s = (double)(sp_mono_ns() - t0) / 1e9;
    explicit_bzero(req, req_len);
    free(req);
    if (rc == SP_ENOTFOUND || rc == SP_ETIMEOUT) {
        c->outcome = GW_CMD_WORKER_UNAVAILABLE;
        goto out;
    }
    if (rc < 0)
        goto out;

    /* The reply is untrusted: size first, then decode. */
    Space__Io__V1__ExecReply *r = reply_len <= (wait_ms ? (size_t)SP_BUS_MAX_MSG : REPLY_MAX)
                                      ? space__io__v1__exec_reply__unpack(NULL, reply_len, reply)
                                      : NULL;
    if (!r) {
        c->outcome = GW_CMD_WORKER_ERROR;
        snprintf(c->reply_error, sizeof(c->reply_error), "bad_reply");
        snprintf(c->reply_detail, sizeof(c->reply_detail), "the worker's reply is unreadable");
    } else if (r->accepted) {
        c->outcome = GW_CMD_ACCEPTED;
    } else {
        c->outcome = refusal_outcome(c, r->error, r->detail);
    }
    rc = 0;
    if (r && r->accepted && wait_ms)
        rc = waited_reply(c, r);
    if (r)
        space__io__v1__exec_reply__free_unpacked(r, NULL);
    free(reply);
    if (rc < 0)
        c->outcome =
            rc == SP_ENOTFOUND || rc == SP_ETIMEOUT ? GW_CMD_WORKER_UNAVAILABLE : GW_CMD_BUS_ERROR;
out:
    c->bus_rc = rc;
    if (c->outcome != GW_CMD_ACCEPTED && c->sub) {
        sp_bus_unsubscribe(c->sub);
        c->sub = NULL;
    }
}

static void refusal_extra(sp_buf_t *b, const gw_cmd_t *c)
{
    sp_buf_t safe;
    sp_buf_init(&safe);
    sp_buf_safe_text(&safe, c->reply_error, sizeof(c->reply_error));
    sp_buf_puts(b, "\"cmd_id\":");
    sp_buf_json_str(b, c->cmd_id);
    sp_buf_puts(b, ",\"reason\":");
    sp_buf_json_str(b, safe.data ? safe.data : "");
    sp_buf_dispose(&safe);
}

static void setup_done(gw_cmd_t *c)
{
    gw_t *gw = c->gw;
    gw_req_t *rq = c->rq;
    sp_buf_t extra;

    gw->metrics.commands[c->outcome]++;
    if (c->exec_s >= 0 && !c->attach)
        gw_metrics_exec_latency(&gw->metrics, c->exec_s);
    if (c->outcome == GW_CMD_ACCEPTED && c->spec.background && !c->enc->follows_background) {
        /* Started: the client follows it with GET .../commands/{cid}/stream. */
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_puts(&b, "{\"cmd_id\":");
        sp_buf_json_str(&b, c->cmd_id);
        sp_buf_puts(&b, ",\"sandbox\":");
        sp_buf_json_str(&b, c->sandbox);
        sp_buf_printf(&b,
                      ",\"background\":true,\"stream\":\"/v1/sandboxes/%s/commands/%s/stream\"}",
                      c->sandbox, c->cmd_id);
        if (gw_req_live(rq))
            command_id_header(rq->req, c->cmd_id);
        gw_respond_json(rq, 202, &b);
        sp_buf_dispose(&b);
        c->phase = PH_DONE;
        resp_over(c);
        return;
    }
    if (c->outcome == GW_CMD_ACCEPTED && !gw->stopping) {
        start_output(c);
        return;
    }
    sp_buf_init(&extra);
    refusal_extra(&extra, c);
    switch (c->outcome) {
    case GW_CMD_ACCEPTED:
        gw_respond_error(rq, 503, "shutting_down", extra.data,
                         "the gateway is stopping; the command was started and keeps running");
        break;
    case GW_CMD_WORKER_UNAVAILABLE:
        sp_log(SP_LOG_WARN, "worker unavailable for a command", SP_KS("worker", c->worker),
               SP_KS("sandbox", c->sandbox), SP_KS("cmd_id", c->cmd_id),
               SP_KS("error", sp_strerror(c->bus_rc)), SP_KS("request_id", c->request_id));
        if (c->bus_rc == SP_ETIMEOUT)
            gw_respond_error(rq, 503, "worker_unavailable", extra.data,
                             "worker %s did not answer within %d s", c->worker,
                             EXEC_TIMEOUT_MS / 1000);
        else
            gw_respond_error(rq, 503, "worker_unavailable", extra.data,
                             "worker %s is not listening (no responder)", c->worker);
        break;
    case GW_CMD_SANDBOX_NOT_RUNNING:
        gw_respond_error(rq, 409, "sandbox_not_running", extra.data,
                         "the worker says the sandbox is not running: %s", c->reply_detail);
        break;
    case GW_CMD_AGENT_UNAVAILABLE:
        gw_respond_error(rq, 503, "agent_unavailable", extra.data,
                         "the sandbox's agent is not available: %s", c->reply_detail);
        break;
    case GW_CMD_TOO_MANY:
        gw_respond_error(rq, 429, "too_many_commands", extra.data,
                         "the sandbox runs too many commands; retry later: %s", c->reply_detail);
        break;
    case GW_CMD_NOT_FOUND:
        gw_respond_error(rq, 404, "not_found", extra.data, "%s", c->reply_detail);
        break;
    case GW_CMD_WORKER_ERROR:
        sp_log(SP_LOG_WARN, "worker refused a command", SP_KS("worker", c->worker),
               SP_KS("cmd_id", c->cmd_id), SP_KS("reason", c->reply_error),
               SP_KS("detail", c->reply_detail), SP_KS("request_id", c->request_id));
        gw_respond_error(rq, 500, "worker_error", extra.data, "the worker refused the command: %s",
                         c->reply_detail);
        break;
    case GW_CMD_BUS_ERROR:
    default:
        if (c->bus_step && strcmp(c->bus_step, "publish") == 0)
            gw->metrics.publish_failures++;
        sp_log(SP_LOG_WARN, "command setup failed", SP_KS("step", c->bus_step),
               SP_KS("cmd_id", c->cmd_id), SP_KS("error", sp_strerror(c->bus_rc)),
               SP_KS("request_id", c->request_id));
        gw_respond_error(rq, 503, "bus_unavailable", NULL,
                         "the bus did not take the command (%s); retry", c->bus_step);
        break;
    }
    sp_buf_dispose(&extra);
    c->phase = PH_DONE;
    drop_sub(c); /* accepted while stopping: the subscription is still there */
    resp_over(c);
}

/* ---- the sandbox ---- */

typedef struct {
    gw_job_t job;
    gw_cmd_t *c;
    gw_sandbox_loc_t loc;
    char *env_json; /* the create-time environment, wiped */
} lookup_job_t;

static void lookup_run(gw_job_t *job, PGconn *db)
{
    (void)db;
    lookup_job_t *l = (lookup_job_t *)job;
    if (l->c->attach)
        gw_sandbox_locate(job, l->c->sandbox, l->c->tenant, &l->loc);
    else
        gw_sandbox_locate_env(job, l->c->sandbox, l->c->tenant, &l->loc, &l->env_json);
}

/* The sandbox's create-time environment under the command's own (which wins), up to
 * GW_ENV_MAX names. The values were checked at create. */
static void merge_env(gw_cmd_t *c, const char *json)
{
    char jerr[SP_JSON_ERR_MAX];
    size_t len = strlen(json);
    sp_json_limits_t lim = {.max_bytes = len + 1,
                            .max_depth = 2,
                            .max_nodes = GW_ENV_MAX * 2 + 2,
                            .max_string = GW_ENV_VALUE_MAX};
    if (sp_json_parse(json, len, &lim, &c->env_doc, jerr) < 0)
        return;
    const sp_json_t *root = sp_json_root(c->env_doc);
    gw_cmd_spec_t *s = &c->spec;
    for (size_t i = 0; i < sp_json_len(root) && s->n_env < GW_ENV_MAX; i++) {
        const char *k = sp_json_key_at(root, i);
        const char *v = sp_json_str(sp_json_at(root, i), NULL);
        bool have = false;
        for (size_t j = 0; j < s->n_env && !have; j++)
            have = strcmp(s->env_names[j], k) == 0;
        if (!v || have || !sp_intent_env_name_ok(k))
            continue;
        s->env_names[s->n_env] = k;
        s->env_values[s->n_env] = v;
        s->n_env++;
    }
}

static void lookup_done(gw_job_t *job)
{
    lookup_job_t *l = (lookup_job_t *)job;
    gw_cmd_t *c = l->c;

    if (l->env_json) {
        merge_env(c, l->env_json);
        explicit_bzero(l->env_json, strlen(l->env_json));
        free(l->env_json);
    }
    if (gw_sandbox_loc_ok(c->rq, &l->loc)) {
        snprintf(c->worker, sizeof(c->worker), "%s", l->loc.worker);
        c->phase = PH_SETUP;
        bus_submit(c, setup_run, setup_done);
    } else {
        c->phase = PH_DONE;
        resp_over(c);
    }
    free(l);
}

/* ---- the request ---- */

/* SSE unless the client prefers JSON: the first of the two media types its Accept names wins
 * (q-values are not weighed). */
static bool wants_json(const gw_req_t *rq)
{
    const h2o_iovec_t *a = gw_req_header(rq, "accept", NULL);
    static const char json[] = "application/json", sse[] = "text/event-stream";
    if (!a)
        return false;
    for (size_t i = 0; i < a->len; i++) {
        size_t left = a->len - i;
        if (left >= sizeof(json) - 1 && strncasecmp(a->base + i, json, sizeof(json) - 1) == 0)
            return true;
        if (left >= sizeof(sse) - 1 && strncasecmp(a->base + i, sse, sizeof(sse) - 1) == 0)
            return false;
    }
    return false;
}

/* A command followed by this gateway (run or attach): looks the sandbox up, then the bus job.
 * Takes over spec. */
static void cmd_start(gw_req_t *rq, const char *cmd_id, gw_cmd_spec_t *spec, bool attach,
                      uint64_t from_seq)
{
    gw_t *gw = rq->gw;
    gw_cmd_t *c = sp_xcalloc(1, sizeof(*c));
    c->gw = gw;
    c->rq = rq;
    gw_req_ref(rq);
    c->enc = rq->dialect == GW_DIALECT_CONNECT_STREAM ? &connect_encoder
             : wants_json(rq)                         ? &json_encoder
                                                      : &sse_encoder;
    c->pty = spec->pty_rows != 0;
    c->streaming = c->enc->content_type != NULL;
    c->attach = attach;
    c->attaching = attach;
    c->from_seq = from_seq;
    c->phase = PH_LOOKUP;
    c->spec = *spec;
    snprintf(c->cmd_id, sizeof(c->cmd_id), "%s", cmd_id);
    snprintf(c->sandbox, sizeof(c->sandbox), "%s", rq->path_id);
    snprintf(c->tenant, sizeof(c->tenant), "%s", rq->tenant);
    snprintf(c->actor, sizeof(c->actor), "%s", rq->key_id);
    snprintf(c->request_id, sizeof(c->request_id), "%s", rq->request_id);
    /* What the output subjects start with: the filter space.io.cmd.<cmd_id>.> without its ">"
     * (empty for an id that is no subject token: the subscription then fails). */
    int plen = sp_subject_build(c->prefix, sizeof(c->prefix), SP_SUBJ_IO_CMD, cmd_id, NULL, NULL);
    c->prefix[plen > 0 ? plen - 1 : 0] = '\0';
    c->next_seq = 1;
    gw_sse_init(&c->sse);
    for (int i = 0; i < 3; i++)
        sp_buf_init(&c->out[i]);
    pthread_mutex_init(&c->mu, NULL);
    uv_async_init(gw->loop, &c->async, on_async);
    c->async.data = c;
    c->next = gw->commands;
    if (gw->commands)
        gw->commands->prev = c;
    gw->commands = c;
    gw->n_commands++;
    gw->metrics.commands_running++;

    lookup_job_t *l = sp_xcalloc(1, sizeof(*l));
    l->c = c;
    l->job.run = lookup_run;
    l->job.done = lookup_done;
    if (gw_job_submit(gw, &l->job) < 0) {
        free(l);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
        c->phase = PH_DONE;
        resp_over(c);
    }
}

void gw_command_run(gw_req_t *rq)
{
    gw_t *gw = rq->gw;
    h2o_req_t *req = rq->req;
    const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
    const char *body = req->entity.base ? req->entity.base : "";
    size_t len = req->entity.base ? req->entity.len : 0;

    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    if (ct && !gw_json_content_type(ct)) {
        gw_respond_error(rq, 415, "unsupported_media_type", NULL,
                         "send the body as application/json");
        return;
    }
    if (len > (size_t)gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)gw->cfg->max_body_bytes);
        return;
    }
    gw_command_run_body(rq, body, len);
}

void gw_command_run_body(gw_req_t *rq, const char *body, size_t len)
{
    gw_t *gw = rq->gw;
    const char *code = NULL;
    char err[GW_ERR_MSG_MAX], reason[SP_REASON_MAX];
    gw_cmd_spec_t spec;
    char cmd_id[SP_ID_MAX + 1];

    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    if (gw_cmd_spec_parse(body, len, &spec, &code, err) < 0) {
        gw_respond_error(rq, 400, code, NULL, "%s", err);
        gw_cmd_spec_dispose(&spec);
        return;
    }

    /* cmd_ + the 26 base32hex characters of a fresh sandbox-style id (a UUIDv7). */
    char fresh[SP_SANDBOX_ID_LEN + 1];
    sp_sandbox_id_new(fresh);
    snprintf(cmd_id, sizeof(cmd_id), "cmd_%s", fresh + 4);

    /* The event the log will be asked to accept, checked now so a 400 comes before anything
     * happens; and the ExecRequest must fit in one NATS message. */
    gw_cmd_intent_t in;
    char probe_id[GW_EVENT_ID_LEN + 1];
    /* Checked with its command line, whose limits hold also when it is sealed. */
    gw_cmd_intent_init(&in, &spec, rq->path_id, rq->tenant, rq->key_id, rq->request_id, cmd_id,
                       false);
    sp_envelope_stamp(&in.env, probe_id);
    if (sp_envelope_validate(&in.env, reason) < 0) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "%s", reason);
        gw_cmd_spec_dispose(&spec);
        return;
    }
    uint8_t *probe = NULL;
    size_t probe_len = 0;
    if (gw_cmd_exec_pack(&spec, rq->path_id, rq->tenant, cmd_id, probe_id, rq->request_id, 0,
                         &probe, &probe_len) < 0) {
        gw_respond_error(rq, 413, "request_too_large", NULL,
                         "stdin, env and the command together exceed the data plane's %d bytes",
                         SP_BUS_MAX_MSG);
        gw_cmd_spec_dispose(&spec);
        return;
    }
    explicit_bzero(probe, probe_len);
    free(probe);
    if (gw->n_commands >= (size_t)gw->cfg->max_commands) {
        gw_respond_error(rq, 429, "too_many_commands", NULL,
                         "this gateway runs at most %lld commands at once; retry later",
                         (long long)gw->cfg->max_commands);
        gw_cmd_spec_dispose(&spec);
        return;
    }

    cmd_start(rq, cmd_id, &spec, false, 0);
}

/* A decimal sequence number of 1..18 digits (no int64 overflow); -1 otherwise. */
static int64_t parse_seq(const char *p, size_t n)
{
    int64_t v = 0;
    if (n == 0 || n > 18)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* The Last-Event-ID header, else ?from_seq=N, else 0; -1 when one is not a number. */
static int64_t attach_from(const gw_req_t *rq)
{
    const h2o_iovec_t *h = gw_req_header(rq, "last-event-id", NULL);
    if (h)
        return parse_seq(h->base, h->len);
    gw_query_t q;
    if (gw_query_parse(rq->req, &q) < 0)
        return -1;
    for (size_t i = 0; i < q.n; i++) {
        if (strcmp(q.p[i].key, "from_seq") == 0)
            return parse_seq(q.p[i].value, strlen(q.p[i].value));
    }
    return 0;
}

void gw_command_attach(gw_req_t *rq)
{
    if (!sp_id_valid(rq->path_id) || !sp_id_valid(rq->path_sub_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox or command");
        return;
    }
    int64_t from = attach_from(rq);
    if (from < 0) {
        gw_respond_error(rq, 400, "invalid_field", NULL,
                         "Last-Event-ID and from_seq must be a decimal sequence number");
        return;
    }
    gw_command_attach_from(rq, rq->path_sub_id, (uint64_t)from, false);
}

void gw_command_attach_from(gw_req_t *rq, const char *cmd_id, uint64_t from_seq, bool pty)
{
    if (rq->gw->n_commands >= (size_t)rq->gw->cfg->max_commands) {
        gw_respond_error(rq, 429, "too_many_commands", NULL,
                         "this gateway follows at most %lld commands at once; retry later",
                         (long long)rq->gw->cfg->max_commands);
        return;
    }
    gw_cmd_spec_t none;
    memset(&none, 0, sizeof(none));
    none.pty_rows = pty ? GW_PTY_DEFAULT_ROWS : 0; /* an attach sends no spec: the name only */
    cmd_start(rq, cmd_id, &none, true, from_seq);
}

/* ---- driven by the loop ---- */

/* ---- the end from the log, after a reconnection ---- */

#define LOG_CHECK_FIRST_MS 1000 /* after the reconnection: the worker's facts go out first */
#define LOG_CHECK_EVERY_MS 2000 /* while the log does not have it yet */
#define LOG_CHECK_LAST     200  /* the sandbox's newest command ends looked through */

typedef struct {
    gw_job_t job;
    gw_cmd_t *c;
    bool found;
    exit_info_t ex;
} log_check_t;

static void log_check_run(gw_job_t *job, PGconn *db)
{
    log_check_t *l = (log_check_t *)job;
    const char *params[2] = {l->c->sandbox, l->c->tenant};
    char limit[16];
    snprintf(limit, sizeof(limit), "%d", LOG_CHECK_LAST);
    const char *p3[3] = {params[0], params[1], limit};
    PGresult *r = PQexecParams(db,
                               "SELECT payload FROM events WHERE aggregate_kind = 'sandbox' AND "
                               "aggregate_id = $1 AND tenant = $2 AND type = 'CommandExited' AND "
                               "status = 'accepted' ORDER BY stream_seq DESC LIMIT $3::int",
                               3, NULL, p3, NULL, NULL, 1);
    for (int i = 0; sp_db_check(r, PGRES_TUPLES_OK) == 0 && i < PQntuples(r) && !l->found; i++) {
        sp_envelope_t *env = NULL;
        char reason[SP_REASON_MAX];
        if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 0), (size_t)PQgetlength(r, i, 0),
                               &env, reason) < 0)
            continue;
        const Space__V1__CommandExited *m =
            env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED ? env->command_exited
                                                                             : NULL;
        if (m && strcmp(m->cmd_id, l->c->cmd_id) == 0) {
            l->found = true;
            memset(&l->ex, 0, sizeof(l->ex));
            l->ex.exit_code = m->exit_code;
            l->ex.signal = m->signal;
            l->ex.timed_out = m->timed_out;
            l->ex.truncated = m->output_truncated;
            l->ex.bytes[1] = m->stdout_bytes;
            l->ex.bytes[2] = m->stderr_bytes;
            snprintf(l->ex.error, sizeof(l->ex.error), "%s", m->error);
        }
        sp_envelope_free(env);
    }
    PQclear(r);
}

static void log_check_done(gw_job_t *job)
{
    log_check_t *l = (log_check_t *)job;
    gw_cmd_t *c = l->c;
    c->log_busy = false;
    if (c->phase == PH_RUNNING && l->found) {
        /* The output that went with the lost IoExit may be lost too: whatever did not
         * arrive of the bytes the worker counted says so. */
        bool wake;
        pthread_mutex_lock(&c->mu);
        uint64_t last = c->last_seq;
        if (c->seen[1] != l->ex.bytes[1] || c->seen[2] != l->ex.bytes[2])
            c->lost = true;
        wake = accept_exit(c, &l->ex, last);
        pthread_mutex_unlock(&c->mu);
        if (wake)
            process_io(c);
    } else if (c->phase == PH_RUNNING) {
        c->log_check_ns = sp_mono_ns() + LOG_CHECK_EVERY_MS * 1000000LL;
    }
    free(l);
    maybe_free(c);
}

static void log_check_start(gw_cmd_t *c)
{
    log_check_t *l = sp_xcalloc(1, sizeof(*l));
    l->c = c;
    l->job.run = log_check_run;
    l->job.done = log_check_done;
    c->log_check_ns = 0;
    c->log_busy = true;
    if (gw_job_submit(c->gw, &l->job) < 0) {
        free(l);
        c->log_busy = false;
        c->log_check_ns = sp_mono_ns() + LOG_CHECK_EVERY_MS * 1000000LL;
    }
}

void gw_commands_tick(gw_t *gw)
{
    int64_t now = sp_mono_ns();
    uint64_t reconnects = sp_bus_reconnects(gw->bus);
    bool reconnected = reconnects != gw->bus_reconnects;
    gw->bus_reconnects = reconnects;

    /* Nothing is freed synchronously here (uv_close defers it), so the walk is safe. */
    for (gw_cmd_t *c = gw->commands; c; c = c->next) {
        if (c->phase == PH_RUNNING && reconnected && !c->attach)
            c->log_check_ns = now + LOG_CHECK_FIRST_MS * 1000000LL;
        if (c->phase == PH_RUNNING && c->log_check_ns && now >= c->log_check_ns && !c->log_busy)
            log_check_start(c);
        if (c->phase == PH_RUNNING && now >= c->deadline_ns) {
            process_io(c);
            if (c->phase == PH_RUNNING) {
                exit_info_t ex;
                pthread_mutex_lock(&c->mu);
                made_exit(&ex, c, "timeout waiting for the worker");
                pthread_mutex_unlock(&c->mu);
                conclude(c, GW_CMD_END_TIMEOUT, &ex);
            }
        }
        gw_sse_tick(&c->sse, now);
    }
}

void gw_commands_close_all(gw_t *gw, bool force)
{
    for (gw_cmd_t *c = gw->commands; c; c = c->next) {
        if (c->phase == PH_RUNNING) {
            process_io(c);
            if (c->phase == PH_RUNNING) {
                exit_info_t ex;
                pthread_mutex_lock(&c->mu);
                made_exit(&ex, c, "the gateway is stopping; the command keeps running");
                pthread_mutex_unlock(&c->mu);
                conclude(c, GW_CMD_END_SHUTDOWN, &ex);
            }
        }
        if (force)
            gw_sse_abort(&c->sse, "shutdown");
    }
}
