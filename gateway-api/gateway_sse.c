/* The writer of the gateway's long-lived responses (gateway.h, "streamed responses").
 *
 * Output goes through h2o's generator flow control: one h2o_send at a time, the next after
 * proceed. Records are appended to pending; a flush swaps pending and inflight and hands
 * inflight to h2o, which must keep it untouched until proceed. Nothing here bounds pending:
 * the owner knows what its records are worth and decides (end the stream, drop output, tell
 * the client it lost events).
 *
 * A write stuck for sse-write-timeout-s, or any abort with a write in flight, is ended by
 * shutting the connection's socket down: the write fails, and h2o 2.2 then closes the
 * connection and calls stop (an HTTP/1.1 write that failed never proceeds). */
#include "gateway.h"

#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "ids.h"
#include "log.h"
#include "sse.h"

#define BUF_KEEP_BYTES (64 * 1024) /* larger idle buffers are freed, not kept */

void gw_sse_init(gw_sse_t *w)
{
    memset(w, 0, sizeof(*w));
    sp_buf_init(&w->pending);
    sp_buf_init(&w->inflight);
}

void gw_sse_dispose(gw_sse_t *w)
{
    sp_buf_dispose(&w->pending);
    sp_buf_dispose(&w->inflight);
}

static void trim(sp_buf_t *b)
{
    if (b->cap > BUF_KEEP_BYTES)
        sp_buf_dispose(b);
    else
        sp_buf_reset(b);
}

/* The response is over: the stream stops counting, its request line is logged, the owner
 * hears of it (and may free itself). */
static void closed(gw_sse_t *w)
{
    gw_req_t *rq = w->rq;
    w->req = NULL;
    w->sending = false;
    rq->gw->metrics.streams--;
    gw_metrics_request(&rq->gw->metrics, rq->route, 200);
    gw_log_request(rq, 200);
    w->ops->closed(w);
}

/* Ends the response cleanly (no write in flight). The connection stays open for the client's
 * next request: its headers promised keep-alive, and a client (the SDKs' fetch) puts it back in
 * its pool on the last chunk, so closing it now would race that client's next request. */
static void finish(gw_sse_t *w)
{
    h2o_req_t *req = w->req;
    w->req = NULL;
    h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    closed(w);
}

bool gw_sse_flush(gw_sse_t *w)
{
    if (!w->req)
        return false;
    if (w->sending)
        return true;
    if (w->closing || (w->ending && w->pending.len == 0)) {
        finish(w);
        return false;
    }
    if (w->pending.len == 0)
        return true;
    sp_buf_t t = w->inflight;
    w->inflight = w->pending;
    w->pending = t;
    trim(&w->pending);
    w->sending = true;
    w->sending_since_ns = w->last_write_ns = sp_mono_ns();
    h2o_iovec_t iov = h2o_iovec_init(w->inflight.data, w->inflight.len);
    h2o_send(w->req, &iov, 1, H2O_SEND_STATE_IN_PROGRESS);
    return true;
}

static void on_proceed(h2o_generator_t *gen, h2o_req_t *req)
{
    gw_sse_t *w = (gw_sse_t *)gen;
    (void)req;
    w->sending = false;
    trim(&w->inflight);
    if (gw_sse_flush(w) && w->ops->written)
        w->ops->written(w);
}

static void on_stop(h2o_generator_t *gen, h2o_req_t *req)
{
    gw_sse_t *w = (gw_sse_t *)gen;
    (void)req;
    if (w->req)
        closed(w);
}

void gw_sse_start(gw_sse_t *w, gw_req_t *rq, const char *content_type, const gw_sse_ops_t *ops)
{
    h2o_req_t *req = rq->req;
    w->gen.proceed = on_proceed;
    w->gen.stop = on_stop;
    w->ops = ops;
    w->rq = rq;
    w->req = req;
    req->res.status = 200;
    req->res.reason = "OK";
    gw_add_common_headers(rq, content_type);
    if (ops->headers)
        ops->headers(w, req);
    gw_req_mark_streaming(rq);
    rq->gw->metrics.streams++;
    h2o_start_response(req, &w->gen);
}

bool gw_sse_end(gw_sse_t *w)
{
    w->ending = true;
    return gw_sse_flush(w);
}

bool gw_sse_close(gw_sse_t *w)
{
    w->closing = true;
    return gw_sse_flush(w);
}

void gw_sse_abort(gw_sse_t *w, const char *why)
{
    if (!w->req)
        return;
    sp_log(SP_LOG_INFO, "closing stream", SP_KS("reason", why),
           SP_KS("request_id", w->rq->request_id), SP_KS("tenant", w->rq->tenant),
           SP_KU("backlog_bytes", gw_sse_backlog(w)));
    w->closing = true;
    if (!w->sending) {
        finish(w);
        return;
    }
    int fd = gw_req_fd(w->req);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
}

void gw_sse_cut(gw_sse_t *w, const char *why)
{
    if (!w->req)
        return;
    sp_log(SP_LOG_INFO, "cutting stream", SP_KS("reason", why),
           SP_KS("request_id", w->rq->request_id), SP_KS("tenant", w->rq->tenant));
    w->closing = true;
    if (w->sending) {
        /* The write in flight fails; h2o then closes the connection and calls stop. */
        int fd = gw_req_fd(w->req);
        if (fd >= 0)
            shutdown(fd, SHUT_RDWR);
        return;
    }
    /* H2O_SEND_STATE_ERROR: no last chunk, and the connection is not kept alive, so the client
     * sees the body end early (undici: "terminated"). */
    h2o_req_t *req = w->req;
    w->req = NULL;
    h2o_send(req, NULL, 0, H2O_SEND_STATE_ERROR);
    closed(w);
}

size_t gw_sse_backlog(const gw_sse_t *w)
{
    return w->pending.len + w->inflight.len;
}

static void keepalive(gw_sse_t *w)
{
    if (w->ops->keepalive)
        w->ops->keepalive(w);
    else
        sp_buf_puts(&w->pending, SP_SSE_KEEPALIVE);
}

/* Whether the client hung up (for a client that sends nothing after its request). */
static bool client_gone(h2o_req_t *req)
{
    struct pollfd p = {.fd = gw_req_fd(req), .events = POLLRDHUP};
    return p.fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

bool gw_sse_tick(gw_sse_t *w, int64_t now_ns)
{
    if (!w->req)
        return false;
    const gw_config_t *cfg = w->rq->gw->cfg;
    if (w->ops->poll_hangup && client_gone(w->req)) {
        /* Make the next write now, to a shut socket: it fails and h2o calls stop. */
        shutdown(gw_req_fd(w->req), SHUT_RDWR);
        if (!w->sending && w->pending.len == 0)
            keepalive(w);
        return gw_sse_flush(w);
    }
    if (w->sending && now_ns - w->sending_since_ns > cfg->sse_write_timeout_s * 1000000000LL) {
        w->rq->gw->metrics.streams_closed_slow++;
        gw_sse_abort(w, "write timeout");
    } else if (!w->sending && w->pending.len == 0 &&
               now_ns - w->last_write_ns >= cfg->sse_keepalive_s * 1000000000LL) {
        keepalive(w);
        return gw_sse_flush(w);
    }
    return true;
}
