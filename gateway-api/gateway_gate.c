/* The gate: every request head is read strictly, routed and authenticated before h2o reads
 * the request's body.
 *
 * h2o 2.2 has no hook between a request's head and its body: it reads the whole body (into a
 * file-backed buffer beyond 4 MiB, up to max_request_entity_size, the largest limit of any
 * route) and only then calls the handler. Its socket, though, calls one read callback
 * (h2o_socket_t._cb.read, h2o's reqread_on_read) for every read. The gate stands in front of
 * that callback on every connection:
 *
 * - while a head arrives it keeps the bytes from h2o; a head that is malformed, ambiguous in
 *   its framing (gateway_head.c) or too large is answered here, 400/431 JSON, written on the
 *   socket directly, and h2o is then told the read failed so that it closes the connection.
 *   h2o never dispatches such a request.
 * - a good head goes to h2o. When the body is complete at once (no body, or a small one in
 *   the same read), h2o dispatches as usual. Otherwise the gate stops reading the socket (the
 *   body waits in the kernel, the client is held by TCP flow control), routes the request and
 *   checks its API key (gw_auth) on h2o's request, and answers 401, 404, 405, ... or 413 (the
 *   announced length over the route's own limit) without reading the body; only an allowed
 *   request is read on, and a chunked body is cut at the route's limit as it arrives. An
 *   `Expect: 100-continue` is kept from h2o (its name rewritten in the buffer) so that the
 *   100 is sent only after these checks.
 * - an answer sent before the body was read closes the connection, lingering: the socket is
 *   half-closed after the answer and what the client still sends is read and dropped for up
 *   to two seconds, so that a client still sending sees the answer rather than a reset.
 *
 * h2o puts its own callback back after every response (keep-alive), so the gate installs
 * itself again before the loop next polls (a uv_prepare_t). A pipelined request h2o starts on
 * its own from bytes already buffered is checked by on_req, or by the next read. */
#include "gateway.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define LINGER_MS        2000
#define LINGER_MAX_BYTES (64u << 20)

typedef enum {
    G_HEAD = 0, /* reading a head: h2o has not seen it */
    G_HELD,     /* the head is h2o's, the body waits until route and key allow it */
    G_BODY,     /* allowed: h2o reads the body */
    G_DONE      /* dispatched or answered: the gate passes reads through */
} gate_state_t;

struct gw_gate {
    gw_t *gw;
    h2o_socket_t *sock;
    h2o_req_t *req; /* h2o's request of this connection (h2o reuses it for every request) */
    gate_state_t state;
    gw_head_scan_t scan;
    gw_head_t head;
    bool checked;       /* the current request's head passed gw_head_parse */
    bool bad_head;      /* it did not, and on_req must answer that */
    bool dispatched;    /* h2o called on_req for the current request */
    bool closed;        /* h2o closed the socket: sock is gone */
    bool continue_sent; /* by h2o, for a pipelined head it took on its own */
    const char *bad_why;
    gw_req_t *rq; /* the context made while the body waits */
    int linger_fd;
    bool queued;
    gw_gate_t *next_queued;
    char *raw; /* a response written by the gate itself */
};

/* h2o's own read callback (reqread_on_read), taken from the first connection. */
static h2o_socket_cb h2o_reqread;
static gw_gate_t *rewrap_queue;
static uv_prepare_t rewrap_prepare;
static bool rewrap_started;

static void gate_on_read(h2o_socket_t *sock, const char *err);
static void head_read(gw_gate_t *g);
static bool h2o_answered(const h2o_req_t *req);

/* ---- lingering close ---- */

typedef struct {
    uv_poll_t poll;
    uv_timer_t timer;
    int fd;
    int open_handles;
    size_t drained;
} linger_t;

static void linger_closed(uv_handle_t *h)
{
    linger_t *l = h->data;
    if (--l->open_handles == 0) {
        close(l->fd);
        free(l);
    }
}

static void linger_end(linger_t *l)
{
    if (uv_is_closing((uv_handle_t *)&l->timer))
        return;
    uv_poll_stop(&l->poll);
    uv_timer_stop(&l->timer);
    uv_close((uv_handle_t *)&l->poll, linger_closed);
    uv_close((uv_handle_t *)&l->timer, linger_closed);
}

static void linger_timeout(uv_timer_t *t)
{
    linger_end(t->data);
}

static void linger_readable(uv_poll_t *p, int status, int events)
{
    linger_t *l = p->data;
    char buf[16384];
    (void)events;
    if (status < 0) {
        linger_end(l);
        return;
    }
    for (;;) {
        ssize_t n = recv(l->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
            l->drained += (size_t)n;
            if (l->drained > LINGER_MAX_BYTES)
                break;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0 && errno == EINTR)
            continue;
        break; /* EOF or an error: the client is done */
    }
    linger_end(l);
}

static void linger_start(gw_t *gw, int fd)
{
    linger_t *l = sp_xcalloc(1, sizeof(*l));
    l->fd = fd;
    /* The answer is in the kernel's send buffer (h2o closes after its write completed): the
     * FIN goes after it. */
    shutdown(fd, SHUT_WR);
    if (uv_poll_init(gw->loop, &l->poll, fd) != 0) {
        close(fd);
        free(l);
        return;
    }
    uv_timer_init(gw->loop, &l->timer);
    l->poll.data = l->timer.data = l;
    l->open_handles = 2;
    uv_poll_start(&l->poll, UV_READABLE | UV_DISCONNECT, linger_readable);
    uv_timer_start(&l->timer, linger_timeout, LINGER_MS, 0);
}

static void arm_linger(gw_gate_t *g)
{
    if (g->linger_fd >= 0 || g->closed)
        return;
    int fd = h2o_socket_get_fd(g->sock);
    if (fd >= 0)
        g->linger_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

/* ---- installing the gate in front of h2o ---- */

static void unqueue(gw_gate_t *g)
{
    for (gw_gate_t **p = &rewrap_queue; *p; p = &(*p)->next_queued) {
        if (*p == g) {
            *p = g->next_queued;
            break;
        }
    }
    g->queued = false;
    g->next_queued = NULL;
}

static void on_rewrap(uv_prepare_t *p)
{
    (void)p;
    gw_gate_t *later = NULL;
    while (rewrap_queue) {
        gw_gate_t *g = rewrap_queue;
        rewrap_queue = g->next_queued;
        g->queued = false;
        g->next_queued = NULL;
        if (g->closed)
            continue;
        if (g->sock->_cb.write) {
            /* h2o is writing (a response's end, its 100 Continue): it reads again after. */
            g->queued = true;
            g->next_queued = later;
            later = g;
            continue;
        }
        if (g->sock->_cb.read != h2o_reqread)
            continue;
        g->sock->_cb.read = gate_on_read;
        /* A pipelined head h2o parsed from what was buffered, its body awaited: checked now,
         * not at a next read that may never come. */
        if (g->state == G_HEAD && g->req->input.method.base && !g->dispatched &&
            !h2o_answered(g->req))
            head_read(g);
    }
    rewrap_queue = later;
    if (!rewrap_queue)
        uv_prepare_stop(&rewrap_prepare);
}

static void queue_rewrap(gw_gate_t *g)
{
    if (g->queued || g->closed)
        return;
    g->queued = true;
    g->next_queued = rewrap_queue;
    rewrap_queue = g;
    uv_prepare_start(&rewrap_prepare, on_rewrap);
}

static void on_sock_close(void *data)
{
    gw_gate_t *g = data;
    g->closed = true;
    g->sock = NULL;
    unqueue(g);
    if (g->linger_fd >= 0) {
        linger_start(g->gw, g->linger_fd);
        g->linger_fd = -1;
    }
    free(g->raw);
    g->raw = NULL;
}

gw_gate_t *gw_gate_attach(gw_t *gw, h2o_socket_t *sock)
{
    if (!rewrap_started) {
        uv_prepare_init(gw->loop, &rewrap_prepare);
        uv_unref((uv_handle_t *)&rewrap_prepare);
        rewrap_started = true;
    }
    if (!h2o_reqread)
        h2o_reqread = sock->_cb.read;
    if (!sock->_cb.read || sock->_cb.read != h2o_reqread || sock->on_close.cb)
        return NULL; /* not an HTTP/1 connection in its reading state: left to h2o */
    gw_gate_t *g = sp_xcalloc(1, sizeof(*g));
    g->gw = gw;
    g->sock = sock;
    g->linger_fd = -1;
    g->req = gw__find_req(gw, sock);
    if (!g->req) {
        free(g);
        return NULL;
    }
    sock->on_close.cb = on_sock_close;
    sock->on_close.data = g;
    sock->_cb.read = gate_on_read;
    return g;
}

void gw_gate_free(gw_gate_t *g)
{
    if (!g)
        return;
    if (g->queued)
        unqueue(g);
    if (g->linger_fd >= 0)
        close(g->linger_fd);
    free(g->raw);
    free(g);
}

void gw_gate_dispose(void)
{
    if (rewrap_started && !uv_is_closing((uv_handle_t *)&rewrap_prepare))
        uv_close((uv_handle_t *)&rewrap_prepare, NULL);
    rewrap_queue = NULL;
}

gw_gate_t *gw_gate_of(h2o_req_t *req)
{
    if (!req->conn || !req->conn->callbacks->get_socket)
        return NULL;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    if (!sock || sock->on_close.cb != on_sock_close)
        return NULL;
    gw_gate_t *g = sock->on_close.data;
    return g->req == req ? g : NULL;
}

/* ---- answers of the gate's own ---- */

static void raw_written(h2o_socket_t *sock, const char *err)
{
    (void)err;
    /* h2o closes the connection on a read error: the request it never dispatched ends. */
    h2o_reqread(sock, "space-gateway: request refused");
}

static const char *status_text(int status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 431:
        return "Request Header Fields Too Large";
    default:
        return "Error";
    }
}

/* Writes a complete error answer on the socket and has h2o close the connection: for heads
 * h2o has not dispatched and must never dispatch. */
static void reject_raw(gw_gate_t *g, int status, const char *code, const char *why)
{
    char rid[GW_REQUEST_ID_MAX + 1];
    sp_buf_t body, out;

    sp_uuid7_str(rid);
    sp_buf_init(&body);
    sp_buf_puts(&body, "{\"code\":");
    sp_buf_json_str(&body, code);
    sp_buf_puts(&body, ",\"message\":");
    sp_buf_json_str(&body, why);
    sp_buf_putc(&body, '}');
    sp_buf_init(&out);
    sp_buf_printf(&out,
                  "HTTP/1.1 %d %s\r\nConnection: close\r\nServer: %s\r\n"
                  "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                  "Cache-Control: no-store\r\nX-Request-Id: %s\r\n\r\n",
                  status, status_text(status), GW_DAEMON, body.len, rid);
    sp_buf_append(&out, body.data, body.len);
    sp_buf_dispose(&body);

    gw_metrics_request(&g->gw->metrics, GW_R_OTHER, status);
    sp_log(SP_LOG_INFO, "request refused before dispatch", SP_KI("status", status),
           SP_KS("code", code), SP_KS("reason", why), SP_KS("request_id", rid));

    h2o_socket_read_stop(g->sock);
    g->state = G_DONE;
    arm_linger(g);
    free(g->raw);
    g->raw = sp_buf_take(&out);
    h2o_iovec_t v = h2o_iovec_init(g->raw, strlen(g->raw));
    h2o_socket_write(g->sock, &v, 1, raw_written);
}

static void reject_head(gw_gate_t *g, const char *why)
{
    if (g->head.too_large)
        reject_raw(g, 431, "header_fields_too_large", why);
    else
        reject_raw(g, 400, "bad_request", why);
}

/* ---- the reads ---- */

static bool h2o_answered(const h2o_req_t *req)
{
    return req->_generator != NULL || req->res.status != 0;
}

/* The fields h2o sets when it processes a request (setup_before_processing in h2o's
 * lib/core/request.c), set early so the router can read them; h2o sets them again, to the
 * same values, when it dispatches. */
static void prepare_req(gw_gate_t *g)
{
    h2o_req_t *req = g->req;
    h2o_hostconf_t *host = g->gw->h2o_config.hosts[0];
    req->scheme = req->input.scheme;
    req->method = req->input.method;
    if (!req->input.authority.base)
        req->input.authority = host->authority.hostport;
    req->authority = req->input.authority;
    req->path = req->input.path;
    const char *q = memchr(req->path.base, '?', req->path.len);
    req->query_at = q ? (size_t)(q - req->path.base) : SIZE_MAX;
    h2o_req_bind_conf(req, host, &host->fallback_path);
}

static void hold(gw_gate_t *g)
{
    h2o_socket_read_stop(g->sock);
    g->state = G_HELD;
    prepare_req(g);
    gw__route_head(g->gw, g->req, g);
}

static void body_read(gw_gate_t *g)
{
    h2o_reqread(g->sock, NULL);
    if (g->closed || g->dispatched || g->state != G_BODY)
        return;
    if (h2o_answered(g->req)) {
        g->state = G_DONE;
        return;
    }
    /* h2o decodes chunks in place: what it holds past the head is the decoded body. */
    if (g->head.chunked && g->rq &&
        (int64_t)(g->sock->input->size - g->head.len) > g->rq->body_limit) {
        h2o_socket_read_stop(g->sock);
        g->state = G_HELD;
        gw_respond_error(g->rq, 413, "body_too_large", NULL,
                         "the body exceeds this route's limit of %lld bytes",
                         (long long)g->rq->body_limit);
    }
}

static void head_read(gw_gate_t *g)
{
    h2o_buffer_t *in = g->sock->input;
    const char *why = "malformed request";
    bool h2o_has_it = g->req->input.method.base != NULL;

    int r = gw_head_scan(&g->scan, in->bytes, in->size, &why);
    if (r == 0 && !h2o_has_it) {
        if (in->size > GW_HEAD_MAX) {
            g->head.too_large = true;
            reject_head(g, "the request head is too large");
        }
        return; /* more to come; h2o is not told yet */
    }
    if (r == 1 && g->scan.scanned > GW_HEAD_MAX && !h2o_has_it) {
        g->head.too_large = true;
        reject_head(g, "the request head is too large");
        return;
    }
    if (r == 1 && gw_head_parse(in->bytes, g->scan.scanned, &g->head, &why) == 0) {
        g->checked = true;
    } else if (!h2o_has_it) {
        reject_head(g, why);
        return;
    } else {
        g->bad_head = true;
        g->bad_why = why;
    }

    if (!h2o_has_it) {
        if (g->head.expect_continue && g->head.expect_at != SIZE_MAX)
            memcpy(in->bytes + g->head.expect_at, "x-100c", 6);
        /* h2o gets the head alone: it starts its body reader, which waits (a body's first
         * bytes are not decoded, nor refused, before the request is allowed). */
        size_t size = in->size;
        in->size = g->head.len;
        h2o_reqread(g->sock, NULL);
        if (g->closed)
            return;
        g->sock->input->size = size;
    } else if (g->sock->_cb.write) {
        /* h2o took this pipelined head on its own and is writing its 100 Continue: the gate
         * looks again once it reads (h2o's callback is then wrapped again). */
        g->continue_sent = true;
        queue_rewrap(g);
        return;
    } else if (g->bad_head) {
        reject_head(g, why);
        return;
    }
    if (g->dispatched || h2o_answered(g->req)) {
        g->state = G_DONE;
        return;
    }
    hold(g);
}

static void gate_on_read(h2o_socket_t *sock, const char *err)
{
    gw_gate_t *g = sock->on_close.data;
    if (err) {
        h2o_reqread(sock, err);
        return;
    }
    switch (g->state) {
    case G_HEAD:
        head_read(g);
        return;
    case G_BODY:
        body_read(g);
        return;
    default:
        h2o_reqread(sock, NULL);
        return;
    }
}

/* ---- the request's side ---- */

static void continue_written(h2o_socket_t *sock, const char *err)
{
    gw_gate_t *g = sock->on_close.data;
    if (err) {
        h2o_reqread(sock, err);
        return;
    }
    h2o_socket_read_start(sock, gate_on_read);
    body_read(g);
}

void gw_gate_allowed(gw_gate_t *g, gw_req_t *rq)
{
    if (g->closed || g->state != G_HELD)
        return;
    if (!g->head.chunked && g->head.content_length > rq->body_limit) {
        gw_respond_error(rq, 413, "body_too_large", NULL,
                         "the body (%lld bytes) exceeds this route's limit of %lld bytes",
                         (long long)g->head.content_length, (long long)rq->body_limit);
        return;
    }
    g->state = G_BODY;
    if (g->head.expect_continue && !g->continue_sent) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        h2o_iovec_t v = h2o_iovec_init(cont, sizeof(cont) - 1);
        h2o_socket_write(g->sock, &v, 1, continue_written);
        return;
    }
    h2o_socket_read_start(g->sock, gate_on_read);
    body_read(g);
}

void gw_gate_answering(gw_gate_t *g)
{
    if (g->closed || g->state == G_DONE)
        return;
    if (g->state == G_BODY)
        h2o_socket_read_stop(g->sock);
    g->state = G_DONE;
    g->req->http1_is_persistent = 0;
    arm_linger(g);
}

gw_req_t *gw_gate_dispatched(gw_gate_t *g, const char **ret_bad)
{
    g->dispatched = true;
    g->state = G_DONE;
    *ret_bad = NULL;
    if (g->rq)
        return g->rq;
    if (g->bad_head) {
        *ret_bad = g->bad_why;
    } else if (!g->checked) {
        /* A pipelined request h2o parsed and dispatched on its own: its head is still at the
         * start of the socket's buffer (h2o consumes it after the response). */
        gw_head_scan_t s = {0};
        const char *why = "malformed request";
        h2o_buffer_t *in = g->sock->input;
        if (gw_head_scan(&s, in->bytes, in->size, &why) != 1 ||
            gw_head_parse(in->bytes, s.scanned, &g->head, &why) < 0)
            *ret_bad = why;
        else
            g->checked = true;
    }
    return NULL;
}

void gw_gate_set_req(gw_gate_t *g, gw_req_t *rq)
{
    g->rq = rq;
}

void gw_gate_request_done(gw_gate_t *g)
{
    g->rq = NULL;
    g->state = G_HEAD;
    memset(&g->scan, 0, sizeof(g->scan));
    memset(&g->head, 0, sizeof(g->head));
    g->checked = g->bad_head = g->dispatched = g->continue_sent = false;
    g->bad_why = NULL;
    queue_rewrap(g);
}
