/* The transparent TCP proxy (docs/egress.md). The worker's nftables redirect every TCP
 * connection of a sandbox here; the original destination comes from SO_ORIGINAL_DST, the
 * sandbox from the source address (trustworthy thanks to anti-spoofing).
 *
 * Decision, in this order:
 *   1. a deny CIDR[:port] matching the destination: deny;
 *   2. an allow CIDR[:port] (or mode allow_all without name denies): connect to that
 *      destination as it is, no content inspected ("other TCP");
 *   3. otherwise the first bytes must be a TLS ClientHello (SNI required, no ECH) or an HTTP/1.x
 *      request head (exactly one Host, strict syntax); the name must be allowed and the
 *      destination address must have been given to THIS sandbox for THAT name by egressd's
 *      DNS. Then:
 *      - TLS is terminated here with a leaf for the SNI minted from the deployment CA
 *        (egressd_tls.c); the decrypted request head must carry Host == SNI; egressd connects
 *        to the address it resolved itself for the name, speaks TLS to it verifying the
 *        upstream certificate against the configured bundle and the name, and relays;
 *      - plain HTTP: egressd connects to the address it resolved for the Host and relays.
 *      In both, every request on the connection is parsed (head, then exactly Content-Length
 *      body bytes, or a chunked body parsed strictly as it flows) and must carry the same
 *      Host: a second request cannot reach another site that shares the server (the red
 *      team's shared-IP case). A CONNECT after the first request is refused.
 *      A WebSocket handshake (Upgrade: websocket, the first request of its connection) is
 *      checked like any request; the guest's next bytes wait until the upstream's response
 *      head, and a 101 turns the connection into a byte relay both ways (RFC 6455 4.1); any
 *      other status keeps HTTP: the waiting bytes are the next request head.
 * Anything else: closed (HTTP, and TLS after termination, get a 403 with the reason). Every
 * decision is audited.
 *
 * TLS runs over memory BIOs: bytes read from a socket are written into the SSL's input BIO,
 * whatever the SSL writes into its output BIO is written to the socket with uv_write. Nothing
 * blocks; back-pressure is the same as for plain bytes (reading from one side stops while the
 * other side has more than WRITE_HIGH_WATER queued).
 *
 * Bandwidth (egressd_rate.c): every byte read from either socket is taken from the
 * sandbox's bucket for that direction; a bucket in debt pauses reading on that socket (a
 * timer per side resumes it), so the limit holds over all the sandbox's connections and
 * memory stays bounded. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter_ipv4.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "contract.h"
#include "daemon.h"
#include "dataplane.pb-c.h"
#include "egress_parse.h"
#include "egressd.h"
#include "error.h"
#include "finlog.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define WRITE_HIGH_WATER (1u << 20)
#define READ_CHUNK       65536
#define FLUSH_AT         (256u << 10)

typedef enum {
    C_FIRST = 0,  /* reading the ClientHello or the request head */
    C_TLS_ACCEPT, /* handshake with the guest (our leaf) */
    C_TLS_HEAD,   /* reading the first decrypted request head */
    C_RESOLVING,  /* CONNECT: egressd looks the name up itself */
    C_CONNECTING, /* TCP to the upstream address egressd resolved */
    C_UP_TLS,     /* handshake with the upstream (verified) */
    C_SPLICE,     /* relaying (requests checked one by one unless K_TCP) */
    C_CLOSING,
} cstate_t;

typedef enum {
    K_TCP = 0, /* a CIDR rule: bytes as they are */
    K_HTTP,    /* plain HTTP: requests checked */
    K_TLS,     /* terminated TLS: requests checked inside */
} ckind_t;

/* What the guest's next bytes are, while splicing K_HTTP or K_TLS. */
typedef enum {
    B_HEAD = 0,  /* a request head */
    B_LENGTH,    /* body_left bytes of a Content-Length body */
    B_CHUNKED,   /* a chunked body (chunk) */
    B_AWAIT_101, /* after a WebSocket handshake: held in first until the response head */
    B_RELAY,     /* after a 101: bytes as they are */
} body_t;

typedef struct conn conn_t;
typedef struct {
    uv_tcp_t tcp;
    uv_timer_t rate_timer; /* resumes reading once the sandbox's bucket has paid its debt */
    conn_t *c;
    bool reading, eof, shut;
    uint64_t shut_ns; /* when its half-close was done (uv_hrtime); 0: asked for, not done yet */
    bool want_read;   /* reading wanted by the state and back-pressure ... */
    bool throttled;   /* ... but paused by the bandwidth limit */
    SSL *ssl;         /* TLS on this side (K_TLS), with its memory BIOs */
    BIO *in, *out;
} side_t;

struct conn {
    eg_t *eg;
    side_t client, up;
    uv_timer_t timer;
    uv_connect_t connect_req;
    cstate_t state;
    ckind_t kind;
    int open_handles;
    char sandbox[65];
    uint32_t dst_be, up_be;
    uint16_t dst_port;
    char name[254]; /* the SNI or the first Host: every request must carry it */
    eg_verdict_t v; /* the name's verdict (rule for audits) */
    uint8_t *first; /* ClientHello / request head bytes; then the next request head */
    size_t first_len, first_cap;
    uint8_t *pending; /* the first request (head + body bytes read with it) for the upstream */
    size_t pending_len;
    body_t body;
    int64_t body_left;  /* B_LENGTH: body bytes still to forward before the next head */
    sp_chunked_t chunk; /* B_CHUNKED */
    unsigned requests;  /* request heads forwarded */
    uint8_t *resp;      /* B_AWAIT_101: the upstream's response head so far */
    size_t resp_len;
    bool counted;
    uint64_t drain_since; /* loop ms when the guest-first close began waiting (close_after_drain) */
    bool tunnel;          /* after a CONNECT: the tunnel must carry TLS for exactly that name */
    bool proxied;         /* a forward-proxy request (absolute-form, plain HTTP): egressd
                           * resolves the name itself, as for a CONNECT */
    bool deny_held;       /* refused, its 403 on the way out: counted in s->denied_held */
    bool guest_fin_first; /* the upstream ended after the guest's FIN reached this host */
    uint32_t peer_be;     /* the guest's address */
    /* Credentials this connection's requests carried, masked in what goes back to the guest
     * (egressd_cred.c); NULL until a request carries one. Held bytes that may begin a value
     * go out when more comes, at the upstream's end, or when scrub_timer fires (a stall). */
    eg_scrub_t *scrub;
    uv_timer_t scrub_timer;
    uint64_t held_since; /* loop ms when the accept began waiting for the address (UNKNOWN_*) */
    conn_t *prev, *next; /* eg->conns */
};

typedef struct {
    uv_write_t req;
    side_t *from; /* whose reading resumes once the peer's queue drains */
    char *data;
    size_t wipe; /* bytes of data to wipe before it is freed (a head carrying a credential) */
} wreq_t;

static void *memdup(const void *p, size_t n)
{
    void *d = sp_xmalloc(n ? n : 1);
    if (n && p)
        memcpy(d, p, n);
    return d;
}

static void on_close(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->open_handles == 0) {
        if (c->prev)
            c->prev->next = c->next;
        else
            c->eg->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        SSL_free(c->client.ssl); /* frees its BIOs too */
        SSL_free(c->up.ssl);
        free(c->first);
        if (c->pending)
            explicit_bzero(c->pending, c->pending_len); /* may carry a credential */
        free(c->pending);
        free(c->resp);
        eg_scrub_free(c->scrub); /* wipes the values */
        free(c);
    }
}

/* The connection no longer counts against its sandbox's limit of live connections. */
static void release_slot(conn_t *c)
{
    if (!c->counted)
        return;
    c->counted = false;
    eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
    if (s && s->conns > 0)
        s->conns--;
}

/* When its sandbox last closed a connection (egressd_finlog.c, when log messages are lost). */
static void note_close(conn_t *c)
{
    eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
    if (s)
        s->closed_ms = eg_now_ms();
}

/* Closes both sides. reset_guest: the guest's side with an RST rather than a FIN. A guest
 * that closed first and then got our FIN would keep its end in TIME_WAIT for a minute, and
 * gVisor refuses to checkpoint a sandbox holding any TCP endpoint that is not closed (on
 * this runsc, TIME_WAIT included): an RST ends the guest's endpoint at once. */
static void conn_close_how(conn_t *c, bool reset_guest)
{
    if (c->state == C_CLOSING)
        return;
    if (c->state == C_RESOLVING)
        eg_dns_cancel(c->eg, c);
    c->state = C_CLOSING;
    note_close(c);
    release_slot(c);
    if (c->deny_held) {
        eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
        if (s && s->denied_held > 0)
            s->denied_held--;
        c->deny_held = false;
    }
    if (!reset_guest || uv_tcp_close_reset(&c->client.tcp, on_close) < 0)
        uv_close((uv_handle_t *)&c->client.tcp, on_close);
    uv_close((uv_handle_t *)&c->up.tcp, on_close);
    uv_close((uv_handle_t *)&c->timer, on_close);
    uv_close((uv_handle_t *)&c->client.rate_timer, on_close);
    uv_close((uv_handle_t *)&c->up.rate_timer, on_close);
    uv_close((uv_handle_t *)&c->scrub_timer, on_close);
}

/* The kernel's TCP state of a side's socket (TCP_ESTABLISHED...), or -1. */
static int tcp_state(side_t *s)
{
    uv_os_fd_t fd;
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    if (uv_fileno((uv_handle_t *)&s->tcp, &fd) < 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
        return -1;
    return ti.tcpi_state;
}

/* Whether the guest has closed its sending side: egressd read its end, or its FIN reached this
 * host's kernel and waits behind bytes egressd has not read yet (CLOSE_WAIT, or LAST_ACK once
 * egressd's own FIN went out after it). */
static bool guest_closed(conn_t *c)
{
    if (c->client.eof)
        return true;
    int st = tcp_state(&c->client);
    return st == TCP_CLOSE_WAIT || st == TCP_LAST_ACK;
}

/* The guest's FIN reached this host after egressd's FIN had left and before the guest had
 * acknowledged it: both ends closed at once. The guest's endpoint goes through CLOSING into
 * TIME_WAIT, where no RST ends it, and runsc refuses to checkpoint a sandbox holding it: the
 * worker hears of it (EgressResetReply.time_wait_ms) and refuses the suspend instead of losing
 * the sandbox. Seen only while this host's socket is still in CLOSING, so not every time. */
static void closes_crossed(conn_t *c)
{
    eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
    if (s)
        eg_sbx_time_wait(s, eg_now_ms(), "socket_state");
}

/* The guest's end came after egressd asked for its own FIN to the guest: did the two cross?
 * Certainly when this host's socket is in CLOSING. But it leaves CLOSING as soon as the
 * guest's ACK of our FIN arrives, which can be before egressd reads the guest's end. The FIN
 * log (egressd_finlog.c) tells every case from the segments themselves. Without it, timing
 * guesses, conservatively: also when our FIN was not out yet (the half-close still queued) or
 * went out less than CROSS_WINDOW_NS ago (a guest that reacts to our FIN needs longer than that
 * to get its own out). That misses a crossing egressd reads late (a busy loop; CI lost a
 * sandbox so in integration.egress on 2026-12-05) and refuses some suspends for nothing. */
#define CROSS_WINDOW_NS (2ull * 1000 * 1000)

static bool fins_may_have_crossed(conn_t *c)
{
    if (tcp_state(&c->client) == TCP_CLOSING)
        return true;
    if (eg_finlog_running(c->eg))
        return false;
    return c->client.shut_ns == 0 || uv_hrtime() - c->client.shut_ns < CROSS_WINDOW_NS;
}

/* The guest's side is reset when the guest has closed its own already (see above). */
static void conn_close(conn_t *c)
{
    conn_close_how(c, guest_closed(c));
}

static void on_timeout(uv_timer_t *t)
{
    conn_close(t->data);
}

/* Bytes written to the guest's socket that the guest has not acknowledged yet. */
static int unacked_to_guest(conn_t *c)
{
    uv_os_fd_t fd;
    int n = 0;
    if (uv_fileno((uv_handle_t *)&c->client.tcp, &fd) < 0 || ioctl(fd, SIOCOUTQ, &n) < 0)
        return 0;
    return n;
}

#define DRAIN_POLL_MS 5
#define DRAIN_MAX_MS  2000

/* The guest closed first and the upstream is done: once the guest has everything (our queue
 * and the kernel's are empty), its side ends with an RST instead of a FIN. */
static void on_drain_check(uv_timer_t *t)
{
    conn_t *c = t->data;
    uint64_t waited = uv_now(c->eg->loop) - c->drain_since;
    if ((c->client.tcp.write_queue_size == 0 && unacked_to_guest(c) == 0) || waited >= DRAIN_MAX_MS)
        conn_close_how(c, true);
}

static void close_after_drain(conn_t *c)
{
    c->drain_since = uv_now(c->eg->loop);
    uv_timer_start(&c->timer, on_drain_check, 0, DRAIN_POLL_MS);
}

static void arm_idle(conn_t *c)
{
    uv_timer_start(&c->timer, on_timeout, (uint64_t)c->eg->cfg->idle_timeout_s * 1000, 0);
}

static side_t *peer(side_t *s)
{
    return s == &s->c->client ? &s->c->up : &s->c->client;
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    size_t n = READ_CHUNK;
    /* The guest's first bytes are read into first and never more than it has room for: what
     * came after a request head in the same read (the start of a body) would be lost. Full:
     * decide_first has refused it already (head_too_large); a buffer of 0 ends the read. */
    if (c->state == C_FIRST && h == (uv_handle_t *)&c->client.tcp &&
        c->first_cap - c->first_len < n)
        n = c->first_cap - c->first_len;
    buf->base = sp_xmalloc(n ? n : 1);
    buf->len = n;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void decide_first(conn_t *c);

static void start_reading(side_t *s)
{
    s->want_read = true;
    if (!s->throttled && !s->reading && !s->eof &&
        uv_read_start((uv_stream_t *)&s->tcp, alloc_cb, on_read) == 0)
        s->reading = true;
}

static void stop_reading(side_t *s)
{
    s->want_read = false;
    if (s->reading)
        uv_read_stop((uv_stream_t *)&s->tcp);
    s->reading = false;
}

static void on_rate_timer(uv_timer_t *t);

/* Waits (reading paused) wait_ns before asking the bucket again. */
static void throttle(side_t *s, uint64_t wait_ns)
{
    if (s->reading)
        uv_read_stop((uv_stream_t *)&s->tcp);
    s->reading = false;
    s->throttled = true;
    uv_timer_start(&s->rate_timer, on_rate_timer, (wait_ns + 999999) / 1000000, 0);
}

/* n bytes read from s: taken from its sandbox's bucket for that direction. */
static void charge(side_t *s, size_t n)
{
    conn_t *c = s->c;
    if (c->state == C_CLOSING)
        return;
    eg_sbx_t *sb = eg_sbx_by_id(c->eg, c->sandbox);
    if (!sb)
        return;
    int dir = s == &c->client ? EG_UP : EG_DOWN;
    uint64_t wait = eg_bucket_take(&sb->bucket[dir], eg_rate_of(c->eg, sb, dir), uv_hrtime(), n);
    if (wait && c->state == C_SPLICE && !s->throttled)
        throttle(s, wait);
}

static void on_rate_timer(uv_timer_t *t)
{
    /* The timer's data is the connection, as for every handle of it (on_close). */
    side_t *s = (side_t *)(void *)((char *)t - offsetof(side_t, rate_timer));
    conn_t *c = s->c;
    if (c->state == C_CLOSING)
        return;
    eg_sbx_t *sb = eg_sbx_by_id(c->eg, c->sandbox);
    int dir = s == &c->client ? EG_UP : EG_DOWN;
    /* Other connections of the sandbox may have taken what came in meanwhile. */
    uint64_t wait =
        sb ? eg_bucket_take(&sb->bucket[dir], eg_rate_of(c->eg, sb, dir), uv_hrtime(), 0) : 0;
    if (wait) {
        throttle(s, wait);
        return;
    }
    s->throttled = false;
    if (s->want_read)
        start_reading(s);
}

static void on_written(uv_write_t *req, int status)
{
    wreq_t *w = (wreq_t *)req;
    side_t *from = w->from;
    conn_t *c = from->c;
    if (w->wipe)
        explicit_bzero(w->data, w->wipe);
    free(w->data);
    free(w);
    if (c->state == C_CLOSING)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    if (c->state == C_SPLICE && peer(from)->tcp.write_queue_size < WRITE_HIGH_WATER / 2)
        start_reading(from);
}

/* Writes data (taken) to the socket of to; reading from its peer stops while to lags. wipe:
 * data holds a secret, wiped once written. */
static int tcp_write_wipe(side_t *to, char *data, size_t len, bool wipe)
{
    side_t *from = peer(to);
    wreq_t *w = sp_xmalloc(sizeof(*w));
    w->from = from;
    w->data = data;
    w->wipe = wipe ? len : 0;
    uv_buf_t b = uv_buf_init(data, (unsigned)len);
    int rc = uv_write(&w->req, (uv_stream_t *)&to->tcp, &b, 1, on_written);
    if (rc < 0) {
        if (wipe)
            explicit_bzero(data, len);
        free(data);
        free(w);
        return rc;
    }
    if (to->tcp.write_queue_size > WRITE_HIGH_WATER)
        stop_reading(from);
    return 0;
}

static int tcp_write(side_t *to, char *data, size_t len)
{
    return tcp_write_wipe(to, data, len, false);
}

/* What the SSL of s has written into its output BIO goes to the socket of s. */
static int flush_tls(side_t *s)
{
    size_t n;
    while ((n = BIO_ctrl_pending(s->out)) > 0) {
        char *b = sp_xmalloc(n);
        int got = BIO_read(s->out, b, (int)n);
        if (got <= 0) {
            free(b);
            return -EIO;
        }
        int rc = tcp_write(s, b, (size_t)got);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Plaintext to side to (copied): through its TLS when it has one. */
static int send_to(side_t *to, const void *data, size_t len)
{
    if (len == 0)
        return 0;
    if (!to->ssl)
        return tcp_write(to, memdup(data, len), len);
    /* A memory BIO never blocks: SSL_write takes everything at once (no partial writes). The
     * records collect in the BIO and go out in one write at the end of the callback
     * (flush_both), or earlier once there is a lot of them. */
    if (SSL_write(to->ssl, data, (int)len) != (int)len) {
        ERR_clear_error();
        return -EIO;
    }
    return BIO_ctrl_pending(to->out) >= FLUSH_AT ? flush_tls(to) : 0;
}

/* A head carrying a credential to the upstream: its plaintext copy is wiped once written
 * (inside TLS, OpenSSL encrypts it at once). */
static int send_secret(side_t *to, const uint8_t *data, size_t len)
{
    if (len == 0 || to->ssl)
        return send_to(to, data, len);
    return tcp_write_wipe(to, memdup(data, len), len, true);
}

/* How long bytes that may begin a credential's value wait for the rest of it: a response
 * that happens to end in such a prefix is delayed this much, once. */
#define SCRUB_STALL_MS 30

static void on_scrub_stall(uv_timer_t *t);

/* What the scrubber let out goes to the guest; the stall timer runs while it holds bytes. */
static int scrubbed_to_guest(conn_t *c, sp_buf_t *out)
{
    int rc = send_to(&c->client, out->data, out->len);
    sp_buf_dispose(out);
    if (eg_scrub_held(c->scrub))
        uv_timer_start(&c->scrub_timer, on_scrub_stall, SCRUB_STALL_MS, 0);
    else
        uv_timer_stop(&c->scrub_timer);
    return rc;
}

/* Upstream bytes (plaintext) to the guest: through the connection's scrubber once a request
 * on it carried a credential (a site may echo it back: docs/credentials.md). */
static int to_guest(conn_t *c, const uint8_t *data, size_t len)
{
    if (!c->scrub)
        return send_to(&c->client, data, len);
    sp_buf_t out;
    sp_buf_init(&out);
    eg_scrub_feed(c->scrub, data, len, &out);
    return scrubbed_to_guest(c, &out);
}

/* The upstream's end: what the scrubber held goes out before the end does. */
static int scrub_flush_to_guest(conn_t *c)
{
    if (!c->scrub)
        return 0;
    sp_buf_t out;
    sp_buf_init(&out);
    eg_scrub_flush(c->scrub, &out);
    return scrubbed_to_guest(c, &out);
}

static void flush_both(conn_t *c);

static void on_scrub_stall(uv_timer_t *t)
{
    conn_t *c = t->data;
    if (c->state == C_CLOSING || !c->scrub)
        return;
    sp_buf_t out;
    sp_buf_init(&out);
    eg_scrub_release(c->scrub, &out);
    if (scrubbed_to_guest(c, &out) < 0) {
        conn_close(c);
        return;
    }
    flush_both(c);
}

/* What either SSL has written and not yet sent: at the end of every libuv callback that may
 * have produced records. */
static void flush_both(conn_t *c)
{
    if (c->state == C_CLOSING)
        return;
    if ((c->client.ssl && flush_tls(&c->client) < 0) || (c->up.ssl && flush_tls(&c->up) < 0))
        conn_close(c);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    side_t *s = req->data;
    if (status == 0)
        s->shut_ns = uv_hrtime();
    free(req);
}

/* No more output to s: close_notify first when s speaks TLS and notify (the end is a clean
 * one), then a TCP half-close. */
static void end_output(side_t *s, bool notify)
{
    if (s->shut)
        return;
    s->shut = true;
    if (s == &s->c->client)
        note_close(s->c);
    if (notify && s->ssl && SSL_is_init_finished(s->ssl)) {
        (void)SSL_shutdown(s->ssl);
        ERR_clear_error();
        (void)flush_tls(s);
    }
    uv_shutdown_t *req = sp_xmalloc(sizeof(*req));
    req->data = s;
    if (uv_shutdown(req, (uv_stream_t *)&s->tcp, on_shutdown) < 0)
        free(req);
}

/* An input side reached its end: clean is a TLS close_notify, or a TCP EOF on a side without
 * TLS. A TLS peer that just closed its TCP connection may have been cut short: the other side
 * then gets no close_notify either (RFC 8446 6.1), only the TCP end, so a guest can still tell
 * a truncated response from a complete one. */
static void input_ended(side_t *s, bool clean)
{
    conn_t *c = s->c;
    s->eof = true;
    stop_reading(s);
    /* What the scrubber held goes out before the end, and inside TLS as records now: an
     * unclean end (no close_notify) sends no more records before the TCP half-close. */
    if (s == &c->up && c->state == C_SPLICE && c->scrub &&
        (scrub_flush_to_guest(c) < 0 || (c->client.ssl && flush_tls(&c->client) < 0))) {
        conn_close(c);
        return;
    }
    if (c->state != C_SPLICE) {
        conn_close(c);
        return;
    }
    if (s == &c->up && (c->client.eof || guest_closed(c))) {
        /* The guest closed first: no FIN to it (conn_close_how). Its end may still be on its
         * way through bytes egressd has not read: relayed first, then the drain. */
        c->guest_fin_first = true;
        if (c->client.eof)
            close_after_drain(c);
        return;
    }
    if (s == &c->client && c->client.shut && fins_may_have_crossed(c))
        closes_crossed(c);
    end_output(peer(s), clean);
    if (peer(s)->eof) {
        if (c->guest_fin_first)
            close_after_drain(c);
        else
            conn_close(c);
    }
}

static void deny_status(conn_t *c, eg_sbx_t *s, const char *proto, const char *name,
                        const char *reason, int status);

static void deny(conn_t *c, eg_sbx_t *s, const char *proto, const char *name, const char *reason)
{
    deny_status(c, s, proto, name, reason, 403);
}

static void deny_status(conn_t *c, eg_sbx_t *s, const char *proto, const char *name,
                        const char *reason, int status)
{
    c->eg->conns_denied++;
    if (s)
        eg_audit(c->eg, s, false, proto, name, c->dst_be, c->dst_port,
                 c->v.rule[0] ? c->v.rule : "proxy", reason);
    /* HTTP, and TLS once terminated, get an answer saying why. The connection is done with:
     * while its answer drains it no longer counts against the sandbox's connections (a burst
     * of refusals must not refuse the sandbox's allowed connections), but against a limit of
     * its own; past that, refusals close at once without an answer. */
    release_slot(c);
    bool answer =
        strcmp(proto, "http") == 0 || (c->client.ssl && SSL_is_init_finished(c->client.ssl));
    if (answer && s && s->denied_held >= c->eg->cfg->max_conns)
        answer = false;
    if (answer && s) {
        s->denied_held++;
        c->deny_held = true;
    }
    if (answer) {
        const char *text = status == 429   ? "Too Many Requests"
                           : status == 503 ? "Service Unavailable"
                                           : "Forbidden";
        char *body =
            sp_xasprintf("HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\n"
                         "Connection: close\r\nContent-Length: %zu\r\n\r\n"
                         "egress denied: %s\n",
                         status, text, strlen("egress denied: \n") + strlen(reason), reason);
        /* Sent as if from the upstream; the connection closes once it is out. */
        c->state = C_SPLICE;
        stop_reading(&c->client);
        stop_reading(&c->up);
        c->up.eof = true;
        int rc = send_to(&c->client, body, strlen(body));
        free(body);
        if (rc == 0) {
            end_output(&c->client, true);
            uv_timer_start(&c->timer, on_timeout, 1000, 0);
            if (c->deny_held)
                start_reading(&c->client);
            return;
        }
    }
    conn_close(c);
}

static const char *proto_of(const conn_t *c)
{
    return c->kind == K_TLS ? "https" : "http";
}

/* What no request may ask for, first or not: NULL, or the reason. A WebSocket handshake is a
 * GET without a body, HTTP/1.1 (RFC 6455 4.1), and only the first request of its connection:
 * then the first bytes from the upstream are its response, so egressd knows when a 101
 * switches the connection without parsing every response's framing. */
static const char *request_refusal(const conn_t *c, const sp_http_head_t *hh)
{
    const char *target = sp_http_target_refusal(hh, c->kind == K_TLS, c->dst_port);
    if (target)
        return target;
    if (hh->upgrade == SP_UPGRADE_OTHER)
        return "upgrade_unsupported";
    if (hh->upgrade == SP_UPGRADE_WEBSOCKET) {
        if (c->requests > 0)
            return "upgrade_not_first";
        if (strcmp(hh->method, "GET") != 0 || hh->http10 || hh->chunked || hh->content_length > 0)
            return "bad_upgrade_request";
    }
    if (hh->host_port && hh->host_port != c->dst_port)
        return "host_port_mismatch";
    return NULL;
}

/* The name the audit of a refused request names: the request target's host when it is not
 * the Host's (the name a server would have answered for, RFC 9112 3.2.2). */
static const char *audit_name(const sp_http_head_t *hh)
{
    return hh->target_host[0] && strcmp(hh->target_host, hh->host) != 0 ? hh->target_host
                                                                        : hh->host;
}

/* A request head on an established connection (plain or decrypted): the same strict parser,
 * and the Host of every request must be the connection's name. 0 = forward it. */
static int check_request(conn_t *c, eg_sbx_t *s, const sp_http_head_t *hh, const char **reason)
{
    *reason = hh->is_connect ? "connect_unsupported" : request_refusal(c, hh);
    if (!*reason && strcmp(hh->host, c->name) != 0)
        *reason = c->kind == K_TLS ? "host_sni_mismatch" : "host_changed";
    if (*reason)
        return -1;
    /* The policy may have changed since the connection opened. */
    eg_verdict_t v;
    eg_decide_name(s, hh->host, c->dst_port, &v);
    if (!v.allow) {
        *reason = v.reason;
        return -1;
    }
    return 0;
}

/* The request whose head hh was allowed: audited, counted, and what follows its head is
 * read as its body. */
static void begin_request(conn_t *c, eg_sbx_t *s, const sp_http_head_t *hh)
{
    eg_audit(c->eg, s, true, proto_of(c), c->name, c->dst_be, c->dst_port, c->v.rule, c->v.reason);
    c->requests++;
    c->body = B_HEAD;
    if (hh->upgrade == SP_UPGRADE_WEBSOCKET) {
        c->body = B_AWAIT_101;
        c->resp = sp_xmalloc(c->first_cap);
        c->resp_len = 0;
    } else if (hh->chunked) {
        c->body = B_CHUNKED;
        sp_chunked_init(&c->chunk);
    } else if (hh->content_length > 0) {
        c->body = B_LENGTH;
        c->body_left = hh->content_length;
    }
}

/* A request refused while splicing: a response may still be on its way, so no 403 in the
 * middle of it, just the end. */
static void refuse_later(conn_t *c, const char *name, const char *reason, const char *why)
{
    eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
    if (why)
        sp_log(SP_LOG_INFO, "bad request", SP_KS("sandbox", c->sandbox), SP_KS("why", why));
    c->eg->conns_denied++;
    if (s)
        eg_audit(c->eg, s, false, proto_of(c), name, c->dst_be, c->dst_port,
                 c->v.rule[0] ? c->v.rule : "proxy", reason);
    conn_close(c);
}

/* How many of the have bytes at b belong to the current body (0 < n <= have); < 0: the
 * connection was closed (a malformed chunked body). */
static ssize_t body_bytes(conn_t *c, const uint8_t *b, size_t have)
{
    if (c->body == B_RELAY)
        return (ssize_t)have;
    if (c->body == B_LENGTH) {
        size_t n = (int64_t)have > c->body_left ? (size_t)c->body_left : have;
        if ((c->body_left -= (int64_t)n) == 0)
            c->body = B_HEAD;
        return (ssize_t)n;
    }
    size_t n = 0;
    const char *why = NULL;
    int rc = sp_chunked_feed(&c->chunk, b, have, &n, &why);
    if (rc < 0) {
        refuse_later(c, c->name, "bad_chunked_body", why);
        return -1;
    }
    if (rc == SP_PARSE_OK)
        c->body = B_HEAD; /* what follows is the next request head */
    return (ssize_t)n;
}

/* An allowed request's head (at the start of first) to the upstream, in origin-form, with its
 * credentials (egressd_cred.c). -1: refused (a response may be in flight: the connection just
 * ends, audited); -2: the upstream write failed. */
static int send_head(conn_t *c, eg_sbx_t *s, const sp_http_head_t *hh)
{
    uint8_t *out = NULL;
    size_t len = 0;
    int status = 0;
    const char *reason = NULL;
    int rw =
        eg_cred_rewrite(c->eg, s, c->name, c->first, hh, &c->scrub, &out, &len, &status, &reason);
    if (rw < 0) {
        refuse_later(c, c->name, reason, NULL);
        return -1;
    }
    int rc = send_secret(&c->up, out, len);
    explicit_bzero(out, len);
    free(out);
    return rc < 0 ? -2 : 0;
}

/* Decrypted (K_TLS) or plain (K_HTTP) bytes from the guest while splicing: request heads are
 * parsed and checked, bodies are forwarded by their framing, nothing else passes. Bytes not
 * yet forwarded wait in first (a partial head, what followed a head, or anything sent
 * before the answer to a WebSocket handshake). */
static void from_guest(conn_t *c, const uint8_t *data, size_t len)
{
    while (c->state == C_SPLICE) {
        if (c->body == B_AWAIT_101) {
            /* A client waits for the 101 (RFC 6455 4.1); a little is held, more is an error. */
            if (len > c->first_cap - c->first_len) {
                refuse_later(c, c->name, "upgrade_early_data", NULL);
                return;
            }
            if (len && data)
                memcpy(c->first + c->first_len, data, len);
            c->first_len += len;
            return;
        }
        if (c->body != B_HEAD) {
            const uint8_t *b = c->first_len ? c->first : data;
            size_t have = c->first_len ? c->first_len : len;
            if (have == 0)
                return;
            ssize_t n = body_bytes(c, b, have);
            if (n < 0)
                return;
            if (send_to(&c->up, b, (size_t)n) < 0) {
                conn_close(c);
                return;
            }
            if (c->first_len) {
                memmove(c->first, c->first + n, c->first_len - (size_t)n);
                c->first_len -= (size_t)n;
            } else {
                data += n;
                len -= (size_t)n;
            }
            continue;
        }
        /* The next request head, accumulated in first. */
        size_t room = c->first_cap - c->first_len;
        size_t n = len < room ? len : room;
        if (n && data) {
            memcpy(c->first + c->first_len, data, n);
            c->first_len += n;
            data += n;
            len -= n;
        }
        if (c->first_len == 0)
            return;
        sp_http_head_t hh;
        const char *why = NULL, *reason = NULL;
        int rc = sp_http_request_head(c->first, c->first_len, &hh, &why);
        if (rc == SP_PARSE_MORE && c->first_len < c->first_cap)
            return; /* all of data is in first: wait for more */
        eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
        if (!s) {
            conn_close(c);
            return;
        }
        if (rc != SP_PARSE_OK || check_request(c, s, &hh, &reason) < 0) {
            if (!reason)
                reason = rc == SP_PARSE_MORE ? "head_too_large" : "bad_http_head";
            refuse_later(c, rc == SP_PARSE_OK ? audit_name(&hh) : c->name, reason, why);
            return;
        }
        begin_request(c, s, &hh);
        int sent = send_head(c, s, &hh);
        if (sent < 0) {
            if (sent == -2)
                conn_close(c);
            return;
        }
        memmove(c->first, c->first + hh.head_len, c->first_len - hh.head_len);
        c->first_len -= hh.head_len;
    }
}

/* Plaintext from the upstream on its way to the guest (already sent): after a WebSocket
 * handshake, its response heads are read until the final one. 101: the connection becomes a
 * relay; 1xx: an interim response, the next head follows; anything else: HTTP goes on, and
 * what the guest sent meanwhile is its next request. */
static void from_upstream(conn_t *c, const uint8_t *data, size_t len)
{
    if (c->body != B_AWAIT_101 || c->state != C_SPLICE)
        return;
    size_t n = len < c->first_cap - c->resp_len ? len : c->first_cap - c->resp_len;
    memcpy(c->resp + c->resp_len, data, n);
    c->resp_len += n;
    for (;;) {
        int status = 0;
        size_t hl = 0;
        int rc = sp_http_response_head(c->resp, c->resp_len, &status, &hl);
        if (rc == SP_PARSE_MORE && c->resp_len < c->first_cap)
            return;
        if (rc != SP_PARSE_OK) {
            /* Not an HTTP response: what it means for the next bytes is unknown. */
            sp_log(SP_LOG_INFO, "upstream answered a WebSocket handshake with no HTTP response",
                   SP_KS("sandbox", c->sandbox), SP_KS("name", c->name));
            conn_close(c);
            return;
        }
        if (status >= 100 && status < 200 && status != 101) {
            memmove(c->resp, c->resp + hl, c->resp_len - hl);
            c->resp_len -= hl;
            continue;
        }
        free(c->resp);
        c->resp = NULL;
        c->resp_len = 0;
        c->body = status == 101 ? B_RELAY : B_HEAD;
        from_guest(c, NULL, 0);
        return;
    }
}

static void connect_up(conn_t *c);
static void up_tls_drive(conn_t *c);

/* The first request's head, with its credentials (egressd_cred.c), goes to the upstream once
 * it is connected; what came with it (its body, maybe more requests) stays in first, read by
 * from_guest once splicing starts. < 0: refused and answered (403, 429, 503). */
static int take_first_head(conn_t *c, eg_sbx_t *s, const char *proto, const sp_http_head_t *hh)
{
    int status = 0;
    const char *reason = NULL;
    if (eg_cred_rewrite(c->eg, s, c->name, c->first, hh, &c->scrub, &c->pending, &c->pending_len,
                        &status, &reason) < 0) {
        deny_status(c, s, proto, c->name, reason, status);
        return -1;
    }
    memmove(c->first, c->first + hh->head_len, c->first_len - hh->head_len);
    c->first_len -= hh->head_len;
    return 0;
}

/* The guest's TLS: handshake, then decrypted bytes. */
static void client_tls_drive(conn_t *c)
{
    side_t *cl = &c->client;
    eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
    if (!s) {
        conn_close(c);
        return;
    }
    if (c->state == C_TLS_ACCEPT) {
        int r = SSL_do_handshake(cl->ssl);
        if (flush_tls(cl) < 0) {
            conn_close(c);
            return;
        }
        if (r <= 0) {
            int e = SSL_get_error(cl->ssl, r);
            ERR_clear_error();
            if (e == SSL_ERROR_WANT_READ)
                return;
            /* The guest does not trust the deployment CA, offered no http/1.1, or sent
             * garbage after its ClientHello. */
            deny(c, s, "tls", c->name, "tls_handshake_failed");
            return;
        }
        c->state = C_TLS_HEAD;
        c->first_len = 0;
        /* The request head is due as the ClientHello was. */
        uv_timer_start(&c->timer, on_timeout, (uint64_t)c->eg->cfg->first_bytes_timeout_ms, 0);
    }
    uint8_t buf[16384];
    while (c->state == C_TLS_HEAD || c->state == C_SPLICE) {
        /* While the first head is read, never more than first has room for. */
        size_t want = sizeof(buf);
        if (c->state == C_TLS_HEAD && c->first_cap - c->first_len < want)
            want = c->first_cap - c->first_len;
        int r = want ? SSL_read(cl->ssl, buf, (int)want) : 0;
        if (want && r <= 0) {
            int e = SSL_get_error(cl->ssl, r);
            ERR_clear_error();
            (void)flush_tls(cl);
            if (e == SSL_ERROR_WANT_READ)
                return;
            if (e == SSL_ERROR_ZERO_RETURN) { /* close_notify */
                input_ended(cl, true);
                return;
            }
            conn_close(c);
            return;
        }
        if (c->state == C_SPLICE) {
            from_guest(c, buf, (size_t)r);
            continue;
        }
        /* C_TLS_HEAD: the first request decides where to go. */
        if (r > 0) {
            memcpy(c->first + c->first_len, buf, (size_t)r);
            c->first_len += (size_t)r;
        }
        sp_http_head_t hh;
        const char *why = NULL, *reason = NULL;
        int rc = sp_http_request_head(c->first, c->first_len, &hh, &why);
        if (rc == SP_PARSE_MORE && c->first_len < c->first_cap)
            continue;
        if (rc != SP_PARSE_OK || check_request(c, s, &hh, &reason) < 0) {
            if (!reason)
                reason = rc == SP_PARSE_MORE ? "head_too_large" : "bad_http_head";
            if (why)
                sp_log(SP_LOG_INFO, "bad request head", SP_KS("sandbox", c->sandbox),
                       SP_KS("why", why));
            deny(c, s, "https", rc == SP_PARSE_OK ? audit_name(&hh) : c->name, reason);
            return;
        }
        begin_request(c, s, &hh);
        if (take_first_head(c, s, "https", &hh) < 0)
            return;
        connect_up(c);
        return;
    }
}

/* Bytes held back while upstream was being set up: the first request, then whatever the guest
 * sent after it. */
static void start_splice(conn_t *c)
{
    c->state = C_SPLICE;
    arm_idle(c);
    if (c->pending_len) {
        uint8_t *p = c->pending;
        size_t n = c->pending_len;
        c->pending = NULL;
        c->pending_len = 0;
        int rc = send_secret(&c->up, p, n);
        explicit_bzero(p, n);
        free(p);
        if (rc < 0) {
            conn_close(c);
            return;
        }
    }
    start_reading(&c->up);
    if (c->kind != K_TCP) {
        /* The start of the next request read together with the first. */
        from_guest(c, NULL, 0);
        if (c->state != C_SPLICE)
            return;
    }
    start_reading(&c->client);
    if (c->kind == K_TLS)
        client_tls_drive(c); /* records already decrypted into the SSL's buffer */
}

static void up_tls_drive(conn_t *c)
{
    side_t *up = &c->up;
    eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
    if (!s) {
        conn_close(c);
        return;
    }
    if (c->state == C_UP_TLS) {
        int r = SSL_do_handshake(up->ssl);
        if (flush_tls(up) < 0) {
            conn_close(c);
            return;
        }
        if (r <= 0) {
            int e = SSL_get_error(up->ssl, r);
            unsigned long err = ERR_peek_last_error();
            ERR_clear_error();
            if (e == SSL_ERROR_WANT_READ)
                return;
            long vr = SSL_get_verify_result(up->ssl);
            char ebuf[160] = "";
            if (err)
                ERR_error_string_n(err, ebuf, sizeof(ebuf));
            sp_log(SP_LOG_INFO, "upstream TLS failed", SP_KS("sandbox", c->sandbox),
                   SP_KS("name", c->name),
                   SP_KS("verify", vr != X509_V_OK ? X509_verify_cert_error_string(vr) : "ok"),
                   SP_KS("error", ebuf));
            deny(c, s, "https", c->name,
                 vr != X509_V_OK ? "upstream_cert_invalid" : "upstream_tls_failed");
            return;
        }
        start_splice(c);
        if (c->state != C_SPLICE)
            return;
    }
    uint8_t buf[16384];
    while (c->state == C_SPLICE) {
        int r = SSL_read(up->ssl, buf, sizeof(buf));
        if (r <= 0) {
            int e = SSL_get_error(up->ssl, r);
            ERR_clear_error();
            (void)flush_tls(up);
            if (e == SSL_ERROR_WANT_READ)
                return;
            if (e == SSL_ERROR_ZERO_RETURN) {
                input_ended(up, true);
                return;
            }
            conn_close(c);
            return;
        }
        int rc = to_guest(c, buf, (size_t)r);
        if (rc == 0)
            from_upstream(c, buf, (size_t)r);
        /* The plaintext as the site sent it may hold an echoed value. */
        if (c->scrub)
            explicit_bzero(buf, (size_t)r);
        if (rc < 0) {
            conn_close(c);
            return;
        }
    }
}

static void on_read_data(side_t *s, ssize_t nread, const uv_buf_t *buf);

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    side_t *s = (side_t *)st;
    on_read_data(s, nread, buf);
    if (nread > 0) {
        eg_metrics_bytes(s->c->eg, s == &s->c->client ? EG_UP : EG_DOWN, (size_t)nread);
        charge(s, (size_t)nread);
    }
}

static void on_read_data(side_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->c;
    if (c->state == C_CLOSING || nread == 0) {
        free(buf->base);
        return;
    }
    if (c->deny_held) {
        /* Refused, its answer on the way (deny): what the guest sends is dropped, and its end
         * ends the connection at once rather than at the timer. */
        free(buf->base);
        if (nread < 0)
            conn_close(c);
        return;
    }
    if (nread < 0) {
        free(buf->base);
        if (nread != UV_EOF) {
            conn_close(c);
            return;
        }
        input_ended(s, s->ssl == NULL);
        return;
    }
    if (c->state == C_FIRST && s == &c->client) {
        size_t n = (size_t)nread;
        if (c->first_len + n > c->first_cap)
            n = c->first_cap - c->first_len;
        memcpy(c->first + c->first_len, buf->base, n);
        c->first_len += n;
        free(buf->base);
        decide_first(c);
        flush_both(c);
        return;
    }
    if (s->ssl) {
        /* Into the SSL's input; decrypted (or handshake) progress follows. */
        int w = BIO_write(s->in, buf->base, (int)nread);
        free(buf->base);
        if (w != (int)nread) {
            conn_close(c);
            return;
        }
        if (c->state == C_SPLICE)
            arm_idle(c);
        if (s == &c->client)
            client_tls_drive(c);
        else
            up_tls_drive(c);
        flush_both(c);
        return;
    }
    if (c->state != C_SPLICE) {
        free(buf->base);
        return;
    }
    arm_idle(c);
    if (s == &c->client && c->kind == K_HTTP) {
        from_guest(c, (const uint8_t *)buf->base, (size_t)nread);
        free(buf->base);
        return;
    }
    if (s == &c->up && c->kind == K_HTTP) {
        /* It only looks: the bytes go to the guest as they are (scrubbed of credentials). */
        from_upstream(c, (const uint8_t *)buf->base, (size_t)nread);
        if (c->state == C_CLOSING) {
            free(buf->base);
            return;
        }
        if (c->scrub) {
            int rc = to_guest(c, (const uint8_t *)buf->base, (size_t)nread);
            explicit_bzero(buf->base, (size_t)nread); /* as the site sent it: may hold a value */
            free(buf->base);
            if (rc < 0)
                conn_close(c);
            return;
        }
    }
    if (tcp_write(peer(s), buf->base, (size_t)nread) < 0)
        conn_close(c);
}

static void on_connected(uv_connect_t *req, int status)
{
    conn_t *c = req->data;
    if (c->state == C_CLOSING)
        return;
    if (status < 0) {
        sp_log(SP_LOG_INFO, "upstream connect failed", SP_KS("sandbox", c->sandbox),
               SP_KS("error", uv_strerror(status)));
        eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
        if (c->kind == K_TLS && s) {
            deny(c, s, "https", c->name, "upstream_unreachable");
            return;
        }
        conn_close(c);
        return;
    }
    if (c->kind != K_TLS) {
        start_splice(c);
        return;
    }
    const char *why = NULL;
    c->up.ssl = eg_tls_upstream_new(c->eg, c->name, &why);
    if (!c->up.ssl) {
        eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
        if (s)
            deny(c, s, "https", c->name, why);
        else
            conn_close(c);
        return;
    }
    c->up.in = BIO_new(BIO_s_mem());
    c->up.out = BIO_new(BIO_s_mem());
    SSL_set_bio(c->up.ssl, c->up.in, c->up.out);
    c->state = C_UP_TLS;
    uv_timer_start(&c->timer, on_timeout, (uint64_t)c->eg->cfg->connect_timeout_ms, 0);
    start_reading(&c->up);
    up_tls_drive(c);
    flush_both(c);
}

static void connect_up(conn_t *c)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(c->dst_port)};
    sa.sin_addr.s_addr = c->up_be;
    c->state = C_CONNECTING;
    stop_reading(&c->client);
    uv_timer_start(&c->timer, on_timeout, (uint64_t)c->eg->cfg->connect_timeout_ms, 0);
    c->connect_req.data = c;
    if (uv_tcp_connect(&c->connect_req, &c->up.tcp, (const struct sockaddr *)&sa, on_connected) < 0)
        conn_close(c);
}

/* The address egressd is about to connect to, whatever chose it (egressd_policy.c,
 * eg_addr_refusal): 0, or refused (audited with that address, answered) and -1. */
static int check_addr(conn_t *c, eg_sbx_t *s, const char *proto, const char *name, uint32_t addr_be)
{
    const char *why = eg_addr_refusal(c->eg, s, addr_be, c->dst_port);
    if (!why)
        return 0;
    c->dst_be = addr_be;
    deny(c, s, proto, name, why);
    return -1;
}

/* Name-based decision shared by HTTP and TLS: 0 = go (upstream address in c->up_be). */
static int check_name(conn_t *c, eg_sbx_t *s, const char *proto, const char *name)
{
    eg_decide_name(s, name, c->dst_port, &c->v);
    if (!c->v.allow) {
        deny(c, s, proto, name, c->v.reason);
        return -1;
    }
    if (s->mode == SP_NET_ALLOW_ALL) {
        /* Nothing to attribute against: the guest's destination is the only one there is. */
        c->up_be = c->dst_be;
    } else {
        if (!eg_attributed(s, name, c->dst_be) || !(c->up_be = eg_resolved_addr(s, name))) {
            deny(c, s, proto, name, "not_attributed");
            return -1;
        }
    }
    if (check_addr(c, s, proto, name, c->up_be) < 0)
        return -1;
    snprintf(c->name, sizeof(c->name), "%s", name);
    return 0;
}

/* TLS from the guest for c->name (decided): terminated with the name's leaf. */
static void start_termination(conn_t *c, eg_sbx_t *s)
{
    c->kind = K_TLS;
    const char *why = NULL;
    c->client.ssl = eg_tls_server_new(c->eg, c->name, &why);
    if (!c->client.ssl) {
        deny(c, s, "tls", c->name, why);
        return;
    }
    c->client.in = BIO_new(BIO_s_mem());
    c->client.out = BIO_new(BIO_s_mem());
    SSL_set_bio(c->client.ssl, c->client.in, c->client.out);
    /* The ClientHello read so far is the start of the handshake. */
    if (BIO_write(c->client.in, c->first, (int)c->first_len) != (int)c->first_len) {
        conn_close(c);
        return;
    }
    c->first_len = 0;
    c->state = C_TLS_ACCEPT;
    client_tls_drive(c);
}

/* A forward-proxy request whose name egressd has resolved (its head is still in first): on
 * as any plain request, to that address. */
static void proxy_go(conn_t *c, eg_sbx_t *s)
{
    sp_http_head_t hh;
    if (sp_http_request_head(c->first, c->first_len, &hh, NULL) != SP_PARSE_OK) {
        conn_close(c);
        return;
    }
    c->kind = K_HTTP;
    begin_request(c, s, &hh);
    if (take_first_head(c, s, "http", &hh) < 0)
        return;
    connect_up(c);
}

static void on_resolved(eg_t *eg, void *arg, uint32_t addr_be)
{
    conn_t *c = arg;
    if (c->state != C_RESOLVING)
        return;
    eg_sbx_t *s = eg_sbx_by_id(eg, c->sandbox);
    if (!s) {
        conn_close(c);
        return;
    }
    if (!addr_be) {
        deny(c, s, "http", c->name, "resolve_failed");
        return;
    }
    if (check_addr(c, s, "http", c->name, addr_be) < 0)
        return;
    c->up_be = c->dst_be = addr_be;
    if (c->proxied) {
        proxy_go(c, s);
        return;
    }
    eg_audit(eg, s, true, "http", c->name, c->dst_be, c->dst_port, c->v.rule, c->v.reason);
    static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    if (tcp_write(&c->client, memdup(ok, sizeof(ok) - 1), sizeof(ok) - 1) < 0) {
        conn_close(c);
        return;
    }
    /* The tunnel's first bytes are read as a connection's first bytes are. */
    c->state = C_FIRST;
    memset(&c->v, 0, sizeof(c->v));
    eg_decide_name(s, c->name, c->dst_port, &c->v);
    uv_timer_start(&c->timer, on_timeout, (uint64_t)eg->cfg->first_bytes_timeout_ms, 0);
    start_reading(&c->client);
    if (c->first_len)
        decide_first(c);
}

/* egressd looks c->name up itself (a CONNECT, a forward-proxy request); on_resolved goes on. */
static void resolve_name(conn_t *c, eg_sbx_t *s)
{
    stop_reading(&c->client);
    c->state = C_RESOLVING;
    uv_timer_start(&c->timer, on_timeout, (uint64_t)c->eg->cfg->connect_timeout_ms, 0);
    uint32_t a = s->mode == SP_NET_ALLOW_ALL ? 0 : eg_resolved_addr(s, c->name);
    if (a) {
        on_resolved(c->eg, c, a);
        return;
    }
    if (eg_dns_resolve(c->eg, s, c->name, on_resolved, c) < 0)
        deny(c, s, "http", c->name, "resolve_failed");
}

/* HTTP CONNECT through the proxy (RFC 9110 9.3.6), checked like an SNI: the authority's name
 * and port must be allowed, Host must name the same authority, and egressd resolves the name
 * itself (the guest's destination, some "proxy" address, plays no part). The tunnel must then
 * carry TLS for that very name, which is terminated like any other. */
static void connect_request(conn_t *c, eg_sbx_t *s, const sp_http_head_t *hh)
{
    const char *name = hh->target_host;
    uint16_t port = hh->target_port;
    if (hh->target_form != SP_TARGET_AUTHORITY) {
        deny(c, s, "http", "", "bad_connect_target");
        return;
    }
    if (strcmp(hh->host, name) != 0 || (hh->host_port && hh->host_port != port)) {
        deny(c, s, "http", name, "host_connect_mismatch");
        return;
    }
    if (hh->content_length > 0 || hh->chunked) {
        deny(c, s, "http", name, "bad_http_head");
        return;
    }
    c->dst_port = port;
    eg_decide_name(s, name, port, &c->v);
    if (!c->v.allow) {
        deny(c, s, "http", name, c->v.reason);
        return;
    }
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->tunnel = true;
    /* A client may send its ClientHello before the 200: it stays in first. */
    memmove(c->first, c->first + hh->head_len, c->first_len - hh->head_len);
    c->first_len -= hh->head_len;
    resolve_name(c, s);
}

/* Whether an absolute-form request goes to the very destination its target names (its port,
 * and an address egressd's DNS gave this sandbox for the name): then it is decided as any
 * other request is. */
static bool at_target(const conn_t *c, eg_sbx_t *s, const sp_http_head_t *hh)
{
    uint16_t port = hh->target_port ? hh->target_port : 80;
    return port == c->dst_port &&
           (s->mode == SP_NET_ALLOW_ALL || eg_attributed(s, hh->target_host, c->dst_be));
}

/* A plain-HTTP request in absolute-form to some other destination: a client with HTTP_PROXY
 * set, talking to its "proxy" (every TCP connection reaches egressd). As for a CONNECT, the
 * target's name and port decide, the Host must name the same authority, and egressd resolves
 * the name itself: the guest's destination plays no part. */
static void proxy_request(conn_t *c, eg_sbx_t *s, const sp_http_head_t *hh)
{
    c->dst_port = hh->target_port ? hh->target_port : 80;
    const char *refusal = request_refusal(c, hh);
    if (refusal) {
        deny(c, s, "http", audit_name(hh), refusal);
        return;
    }
    eg_decide_name(s, hh->host, c->dst_port, &c->v);
    if (!c->v.allow) {
        deny(c, s, "http", hh->host, c->v.reason);
        return;
    }
    snprintf(c->name, sizeof(c->name), "%s", hh->host);
    c->proxied = true;
    resolve_name(c, s);
}

static void decide_first(conn_t *c)
{
    eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
    if (!s) {
        conn_close(c);
        return;
    }
    if (c->first[0] == 0x16) {
        sp_tls_hello_t h;
        int rc = sp_tls_client_hello(c->first, c->first_len, &h);
        if (rc == SP_PARSE_MORE && c->first_len < c->first_cap)
            return;
        if (rc != SP_PARSE_OK) {
            deny(c, s, "tls", "", "bad_client_hello");
            return;
        }
        if (h.ech || h.multiple || !h.sni[0]) {
            deny(c, s, "tls", h.sni, h.ech ? "ech" : h.multiple ? "multiple_sni" : "no_sni");
            return;
        }
        if (c->tunnel) {
            /* Decided at the CONNECT, resolved by egressd: the SNI must be that name. */
            if (strcmp(h.sni, c->name) != 0) {
                deny(c, s, "tls", h.sni, "sni_connect_mismatch");
                return;
            }
        } else if (check_name(c, s, "tls", h.sni) < 0) {
            return;
        }
        start_termination(c, s);
        return;
    }
    if (c->tunnel) {
        /* A CONNECT tunnel carries TLS, which is terminated and checked, or nothing. */
        deny(c, s, "tls", c->name, "not_tls");
        return;
    }
    sp_http_head_t hh;
    const char *why = NULL;
    int rc = sp_http_request_head(c->first, c->first_len, &hh, &why);
    if (rc == SP_PARSE_MORE && c->first_len < c->first_cap)
        return;
    if (rc != SP_PARSE_OK) {
        if (c->dst_port == 443) {
            deny(c, s, "tls", "", "not_tls");
            return;
        }
        /* Not HTTP at all (no method token) is "tcp"; a head that started like HTTP and
         * broke a rule is "http" (the why goes to the log). */
        bool not_http = why && strcmp(why, "not an HTTP request") == 0;
        if (why && !not_http)
            sp_log(SP_LOG_INFO, "bad request head", SP_KS("sandbox", c->sandbox),
                   SP_KS("why", why));
        deny(c, s, not_http ? "tcp" : "http", "",
             rc == SP_PARSE_MORE ? "head_too_large"
             : not_http          ? "no_rule"
                                 : "bad_http_head");
        return;
    }
    if (c->dst_port == 443) {
        deny(c, s, "tls", hh.host, "not_tls");
        return;
    }
    if (hh.is_connect) {
        connect_request(c, s, &hh);
        return;
    }
    if (hh.target_form == SP_TARGET_ABSOLUTE && !hh.target_https && !at_target(c, s, &hh)) {
        proxy_request(c, s, &hh);
        return;
    }
    const char *refusal = request_refusal(c, &hh);
    if (refusal) {
        deny(c, s, "http", audit_name(&hh), refusal);
        return;
    }
    if (check_name(c, s, "http", hh.host) < 0)
        return;
    c->kind = K_HTTP;
    begin_request(c, s, &hh);
    if (take_first_head(c, s, "http", &hh) < 0)
        return;
    connect_up(c);
}

/* A connection from an address of the pool that no sandbox has (yet) is held this long, its
 * source looked up again every UNKNOWN_POLL_MS (on_accept). */
#define UNKNOWN_HOLD_MS 1000
#define UNKNOWN_POLL_MS 5

static void accept_as(conn_t *c, eg_sbx_t *s);
static void on_held(uv_timer_t *t);

static void on_accept(uv_stream_t *server, int status)
{
    eg_t *eg = server->data;
    if (status < 0)
        return;
    conn_t *c = sp_xcalloc(1, sizeof(*c));
    c->eg = eg;
    c->next = eg->conns;
    if (eg->conns)
        eg->conns->prev = c;
    eg->conns = c;
    c->client.c = c->up.c = c;
    uv_tcp_init(eg->loop, &c->client.tcp);
    uv_tcp_init(eg->loop, &c->up.tcp);
    uv_timer_init(eg->loop, &c->timer);
    uv_timer_init(eg->loop, &c->client.rate_timer);
    uv_timer_init(eg->loop, &c->up.rate_timer);
    uv_timer_init(eg->loop, &c->scrub_timer);
    c->client.tcp.data = c->up.tcp.data = c->timer.data = c;
    c->client.rate_timer.data = c->up.rate_timer.data = c->scrub_timer.data = c;
    c->open_handles = 6;
    if (uv_accept(server, (uv_stream_t *)&c->client.tcp) < 0) {
        conn_close(c);
        return;
    }
    eg->conns_total++;
    struct sockaddr_in peer_addr, orig;
    int len = sizeof(peer_addr);
    socklen_t olen = sizeof(orig);
    uv_os_fd_t fd;
    if (uv_tcp_getpeername(&c->client.tcp, (struct sockaddr *)&peer_addr, &len) < 0 ||
        peer_addr.sin_family != AF_INET || uv_fileno((uv_handle_t *)&c->client.tcp, &fd) < 0 ||
        getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &orig, &olen) < 0) {
        conn_close(c);
        return;
    }
    c->peer_be = peer_addr.sin_addr.s_addr;
    eg_finlog_accepted(eg, c->peer_be, peer_addr.sin_port);
    c->dst_be = orig.sin_addr.s_addr;
    c->dst_port = ntohs(orig.sin_port);
    eg_sbx_t *s = eg_sbx_by_addr(eg, c->peer_be);
    if (!s && (ntohl(c->peer_be) & eg->pool.mask) == eg->pool.net) {
        /* An address of the worker's pool that no event has named yet: a sandbox started (or
         * claimed from a warm pool, docs/pools.md) a moment ago whose SandboxStarted this
         * egressd is about to read. Held, not refused, for a bounded while: its policy then
         * decides (until then nothing of it went anywhere). */
        c->held_since = uv_now(eg->loop);
        uv_timer_start(&c->timer, on_held, UNKNOWN_POLL_MS, UNKNOWN_POLL_MS);
        return;
    }
    accept_as(c, s);
}

/* Re-checks a held connection's source until the address is known or UNKNOWN_HOLD_MS passed. */
static void on_held(uv_timer_t *t)
{
    conn_t *c = t->data;
    if (c->state == C_CLOSING)
        return;
    eg_sbx_t *s = eg_sbx_by_addr(c->eg, c->peer_be);
    if (!s && uv_now(c->eg->loop) - c->held_since < UNKNOWN_HOLD_MS)
        return;
    uv_timer_stop(&c->timer);
    accept_as(c, s);
}

/* An accepted connection of sandbox s (NULL: no sandbox of ours: closed). */
static void accept_as(conn_t *c, eg_sbx_t *s)
{
    eg_t *eg = c->eg;
    if (!s) {
        conn_close(c); /* not one of our sandboxes */
        return;
    }
    if (s->frozen_until_ms > eg_now_ms()) {
        conn_close_how(c, true); /* being checkpointed: the guest's connect fails at once */
        return;
    }
    snprintf(c->sandbox, sizeof(c->sandbox), "%s", s->id);
    uv_tcp_nodelay(&c->client.tcp, 1);
    uv_tcp_nodelay(&c->up.tcp, 1);
    if (s->conns >= eg->cfg->max_conns) {
        deny(c, s, "tcp", "", "connection_limit");
        return;
    }
    s->conns++;
    c->counted = true;

    eg_decide_addr(s, c->dst_be, c->dst_port, &c->v);
    bool by_addr = c->v.allow && (s->mode != SP_NET_ALLOW_ALL || !eg_has_name_denies(s));
    if (!c->v.allow && strcmp(c->v.reason, "denied_by_rule") == 0) {
        deny(c, s, "tcp", "", c->v.reason);
        return;
    }
    if (by_addr) {
        if (check_addr(c, s, "tcp", "", c->dst_be) < 0)
            return;
        eg_audit(eg, s, true, "tcp", "", c->dst_be, c->dst_port, c->v.rule, c->v.reason);
        c->kind = K_TCP;
        c->up_be = c->dst_be;
        connect_up(c);
        return;
    }
    memset(&c->v, 0, sizeof(c->v));
    c->first_cap = (size_t)eg->cfg->head_max_bytes;
    c->first = sp_xmalloc(c->first_cap);
    uv_timer_start(&c->timer, on_timeout, (uint64_t)eg->cfg->first_bytes_timeout_ms, 0);
    start_reading(&c->client);
    if (!c->client.reading)
        conn_close(c);
}

int eg_proxy_start(eg_t *eg)
{
    struct sockaddr_in a;
    int rc = uv_ip4_addr(eg->cfg->listen_host, (int)eg->cfg->proxy_port, &a);
    if (rc < 0)
        return rc;
    uv_tcp_init(eg->loop, &eg->listener);
    eg->listener.data = eg;
    if ((rc = uv_tcp_bind(&eg->listener, (const struct sockaddr *)&a, 0)) < 0)
        return rc;
    return uv_listen((uv_stream_t *)&eg->listener, 1024, on_accept);
}

void eg_proxy_stop(eg_t *eg)
{
    /* Live connections close through their own callbacks (which free them). */
    for (conn_t *c = eg->conns; c; c = c->next)
        conn_close(c);
    /* Also after a failed start: the listener may never have been initialised. */
    if (eg->listener.type == UV_TCP && !uv_is_closing((uv_handle_t *)&eg->listener))
        uv_close((uv_handle_t *)&eg->listener, NULL);
}

/* ---- suspend: every connection of a sandbox reset on its worker's request ---- */

#define FREEZE_MS (60 * 1000) /* at most; SandboxResumed / SandboxSuspendFailed end it */

static void on_reset_request(void *arg, const char *subject, const char *reply, const uint8_t *data,
                             size_t len)
{
    eg_t *eg = arg;
    sp_request_t rq;
    char why[SP_REASON_MAX];
    int rc = sp_request_open(eg->guard, subject, data, len, &rq, why);
    if (rc != 0)
        sp_log(rc < 0 ? SP_LOG_WARN : SP_LOG_INFO,
               rc < 0 ? "reset request refused" : "reset request would be refused (log mode)",
               SP_KS("subject", subject), SP_KS("signer", rq.signer), SP_KS("reason", why));
    /* No answer to a refused one: EgressResetReply has no (ok, error, detail) to carry it, and
     * the worker's bounded wait treats silence as a failed reset. */
    Space__Io__V1__EgressReset *req =
        rc >= 0 && rq.len <= 1024 ? space__io__v1__egress_reset__unpack(NULL, rq.len, rq.body)
                                  : NULL;
    sp_request_dispose(&rq);
    if (rc < 0)
        return;
    if (!req || !reply || !sp_id_valid(req->sandbox)) {
        sp_log(SP_LOG_WARN, "ignoring a bad reset request", SP_KS("subject", subject));
        if (req)
            space__io__v1__egress_reset__free_unpacked(req, NULL);
        return;
    }
    eg_reset_t *r = sp_xcalloc(1, sizeof(*r));
    snprintf(r->sandbox, sizeof(r->sandbox), "%s", req->sandbox);
    r->reply = sp_xstrdup(reply);
    space__io__v1__egress_reset__free_unpacked(req, NULL);
    pthread_mutex_lock(&eg->q_mu);
    r->next = eg->resets;
    eg->resets = r;
    pthread_mutex_unlock(&eg->q_mu);
    uv_async_send(&eg->q_async);
}

int eg_reset_start(eg_t *eg)
{
    char subject[128];
    int rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_EGRESS_RST, eg->cfg->worker_id,
                              NULL, NULL);
    if (rc < 0)
        return rc;
    return sp_bus_subscribe(eg->bus, subject, NULL, on_reset_request, eg, &eg->reset_sub);
}

void eg_reset_stop(eg_t *eg)
{
    sp_bus_unsubscribe(eg->reset_sub);
    eg->reset_sub = NULL;
    eg_reset_drain(eg); /* answers nobody waits for any more: freed */
}

void eg_reset_drain(eg_t *eg)
{
    pthread_mutex_lock(&eg->q_mu);
    eg_reset_t *r = eg->resets;
    eg->resets = NULL;
    pthread_mutex_unlock(&eg->q_mu);
    if (r)
        eg_finlog_drain(eg); /* every close so far is known before the answer */
    while (r) {
        eg_reset_t *next = r->next;
        uint32_t n = 0, time_wait_ms = 0;
        eg_sbx_t *s = eg_sbx_by_id(eg, r->sandbox);
        int64_t now = eg_now_ms();
        if (s && s->time_wait_until_ms > now) {
            /* The checkpoint cannot happen yet and the worker will say so: nothing is reset. */
            time_wait_ms = (uint32_t)(s->time_wait_until_ms - now);
        } else {
            if (s)
                s->frozen_until_ms = now + FREEZE_MS;
            for (conn_t *c = eg->conns; c; c = c->next) {
                if (c->state != C_CLOSING && strcmp(c->sandbox, r->sandbox) == 0) {
                    conn_close_how(c, true);
                    n++;
                }
            }
        }
        if (!sp_daemon_stopping) {
            Space__Io__V1__EgressResetReply rep = SPACE__IO__V1__EGRESS_RESET_REPLY__INIT;
            rep.reset = n;
            rep.time_wait_ms = time_wait_ms;
            uint8_t buf[32];
            size_t len = space__io__v1__egress_reset_reply__pack(&rep, buf);
            (void)sp_bus_publish_core(eg->bus, r->reply, buf, len);
            sp_log(SP_LOG_INFO, "connections reset for a checkpoint", SP_KS("sandbox", r->sandbox),
                   SP_KU("reset", n), SP_KU("time_wait_ms", rep.time_wait_ms));
        }
        free(r->reply);
        free(r);
        r = next;
    }
}
