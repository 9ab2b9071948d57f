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
 *      DNS; egressd then connects to the address it resolved itself for the name, sends the
 *      bytes it read and splices. Plain HTTP gets one request per connection (head plus
 *      Content-Length body; further bytes are not forwarded) so that a second request cannot
 *      carry another Host to the same server; chunked request bodies are refused for now.
 * Anything else: closed (HTTP gets a 403 with the reason). Every decision is audited. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter_ipv4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress_parse.h"
#include "egressd.h"
#include "error.h"
#include "log.h"
#include "xmalloc.h"

#define WRITE_HIGH_WATER (1u << 20)
#define READ_CHUNK       65536

typedef enum { C_FIRST = 0, C_CONNECTING, C_SPLICE, C_CLOSING } cstate_t;

typedef struct conn conn_t;
typedef struct {
    uv_tcp_t tcp;
    conn_t *c;
    bool reading, eof, shut;
} side_t;

struct conn {
    eg_t *eg;
    side_t client, up;
    uv_timer_t timer;
    uv_connect_t connect_req;
    cstate_t state;
    int open_handles;
    char sandbox[65];
    uint32_t dst_be;
    uint16_t dst_port;
    uint8_t *first;
    size_t first_len, first_cap;
    bool http;
    int64_t body_left; /* HTTP: request body bytes still to forward; then client input ends */
    bool counted;
};

typedef struct {
    uv_write_t req;
    side_t *from; /* whose reading resumes once the peer's queue drains */
    char *data;
} wreq_t;

static void on_close(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->open_handles == 0) {
        free(c->first);
        free(c);
    }
}

static void conn_close(conn_t *c)
{
    if (c->state == C_CLOSING)
        return;
    c->state = C_CLOSING;
    if (c->counted) {
        eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
        if (s && s->conns > 0)
            s->conns--;
    }
    uv_close((uv_handle_t *)&c->client.tcp, on_close);
    uv_close((uv_handle_t *)&c->up.tcp, on_close);
    uv_close((uv_handle_t *)&c->timer, on_close);
}

static void on_timeout(uv_timer_t *t)
{
    conn_close(t->data);
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
    buf->base = sp_xmalloc(READ_CHUNK);
    buf->len = READ_CHUNK;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

static void on_written(uv_write_t *req, int status)
{
    wreq_t *w = (wreq_t *)req;
    side_t *from = w->from;
    conn_t *c = from->c;
    free(w->data);
    free(w);
    if (c->state == C_CLOSING)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    side_t *to = peer(from);
    if (!from->reading && !from->eof && to->tcp.write_queue_size < WRITE_HIGH_WATER / 2) {
        if (uv_read_start((uv_stream_t *)&from->tcp, alloc_cb, on_read) == 0)
            from->reading = true;
    }
}

/* Writes data (taken) to the peer of from; stops reading from when the peer lags. */
static int relay(side_t *from, char *data, size_t len)
{
    side_t *to = peer(from);
    wreq_t *w = sp_xmalloc(sizeof(*w));
    w->from = from;
    w->data = data;
    uv_buf_t b = uv_buf_init(data, (unsigned)len);
    int rc = uv_write(&w->req, (uv_stream_t *)&to->tcp, &b, 1, on_written);
    if (rc < 0) {
        free(data);
        free(w);
        return rc;
    }
    if (to->tcp.write_queue_size > WRITE_HIGH_WATER && from->reading) {
        uv_read_stop((uv_stream_t *)&from->tcp);
        from->reading = false;
    }
    return 0;
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    free(req);
}

static void half_close(side_t *s)
{
    if (s->shut)
        return;
    s->shut = true;
    uv_shutdown_t *req = sp_xmalloc(sizeof(*req));
    if (uv_shutdown(req, (uv_stream_t *)&s->tcp, on_shutdown) < 0)
        free(req);
}

static void stop_reading(side_t *s)
{
    if (s->reading)
        uv_read_stop((uv_stream_t *)&s->tcp);
    s->reading = false;
}

static void decide_first(conn_t *c);

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    side_t *s = (side_t *)st;
    conn_t *c = s->c;
    if (c->state == C_CLOSING || nread == 0) {
        free(buf->base);
        return;
    }
    if (nread < 0) {
        free(buf->base);
        if (nread != UV_EOF || c->state != C_SPLICE) {
            conn_close(c);
            return;
        }
        s->eof = true;
        stop_reading(s);
        half_close(peer(s));
        if (peer(s)->eof)
            conn_close(c);
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
        return;
    }
    if (c->state != C_SPLICE) {
        free(buf->base);
        return;
    }
    arm_idle(c);
    size_t len = (size_t)nread;
    if (s == &c->client && c->http) {
        /* One request per connection: the rest of the declared body, then nothing. */
        if (c->body_left <= 0) {
            free(buf->base);
            stop_reading(s);
            return;
        }
        if ((int64_t)len > c->body_left)
            len = (size_t)c->body_left;
        c->body_left -= (int64_t)len;
    }
    if (relay(s, buf->base, len) < 0)
        conn_close(c);
}

static void deny(conn_t *c, eg_sbx_t *s, const char *proto, const char *name, const eg_verdict_t *v,
                 const char *reason)
{
    c->eg->conns_denied++;
    if (s)
        eg_audit(c->eg, s, false, proto, name, c->dst_be, c->dst_port, v ? v->rule : "proxy",
                 reason);
    if (strcmp(proto, "http") == 0) {
        char *body = sp_xasprintf("HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n"
                                  "Connection: close\r\nContent-Length: %zu\r\n\r\n"
                                  "egress denied: %s\n",
                                  strlen("egress denied: \n") + strlen(reason), reason);
        /* Written as if relayed from the upstream side; the connection closes once sent. */
        c->state = C_SPLICE;
        stop_reading(&c->client);
        c->up.eof = true;
        if (relay(&c->up, body, strlen(body)) == 0) {
            half_close(&c->client);
            uv_timer_start(&c->timer, on_timeout, 1000, 0);
            return;
        }
    }
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
        conn_close(c);
        return;
    }
    c->state = C_SPLICE;
    arm_idle(c);
    if (c->first_len) {
        size_t len = c->first_len;
        char *data = (char *)c->first;
        c->first = NULL;
        c->first_len = 0;
        if (relay(&c->client, data, len) < 0) {
            conn_close(c);
            return;
        }
    }
    if (uv_read_start((uv_stream_t *)&c->up.tcp, alloc_cb, on_read) == 0)
        c->up.reading = true;
    if (!(c->http && c->body_left <= 0) && !c->client.reading &&
        uv_read_start((uv_stream_t *)&c->client.tcp, alloc_cb, on_read) == 0)
        c->client.reading = true;
}

static void connect_up(conn_t *c, uint32_t addr_be)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(c->dst_port)};
    sa.sin_addr.s_addr = addr_be;
    c->state = C_CONNECTING;
    stop_reading(&c->client);
    uv_timer_start(&c->timer, on_timeout, (uint64_t)c->eg->cfg->connect_timeout_ms, 0);
    c->connect_req.data = c;
    if (uv_tcp_connect(&c->connect_req, &c->up.tcp, (const struct sockaddr *)&sa, on_connected) < 0)
        conn_close(c);
}

/* Name-based decision shared by HTTP and TLS: 0 = go (upstream address in *ret_addr). */
static int check_name(conn_t *c, eg_sbx_t *s, const char *proto, const char *name,
                      uint32_t *ret_addr)
{
    eg_verdict_t v;
    eg_decide_name(s, name, c->dst_port, &v);
    if (!v.allow) {
        deny(c, s, proto, name, &v, v.reason);
        return -1;
    }
    if (s->mode == SP_NET_ALLOW_ALL) {
        /* Nothing to attribute against: the guest's destination is the only one there is. */
        *ret_addr = c->dst_be;
    } else {
        if (!eg_attributed(s, name, c->dst_be)) {
            deny(c, s, proto, name, &v, "not_attributed");
            return -1;
        }
        *ret_addr = eg_resolved_addr(s, name);
        if (!*ret_addr) {
            deny(c, s, proto, name, &v, "not_attributed");
            return -1;
        }
    }
    eg_audit(c->eg, s, true, proto, name, c->dst_be, c->dst_port, v.rule, v.reason);
    return 0;
}

static void decide_first(conn_t *c)
{
    eg_sbx_t *s = eg_sbx_by_id(c->eg, c->sandbox);
    if (!s) {
        conn_close(c);
        return;
    }
    uint32_t addr = 0;
    if (c->first[0] == 0x16) {
        sp_tls_hello_t h;
        int rc = sp_tls_client_hello(c->first, c->first_len, &h);
        if (rc == SP_PARSE_MORE && c->first_len < c->first_cap)
            return;
        if (rc != SP_PARSE_OK) {
            deny(c, s, "tls", "", NULL, "bad_client_hello");
            return;
        }
        if (h.ech || h.multiple || !h.sni[0]) {
            deny(c, s, "tls", h.sni, NULL, h.ech ? "ech" : h.multiple ? "multiple_sni" : "no_sni");
            return;
        }
        if (check_name(c, s, "tls", h.sni, &addr) < 0)
            return;
        c->http = false;
        connect_up(c, addr);
        return;
    }
    sp_http_head_t hh;
    const char *why = NULL;
    int rc = sp_http_request_head(c->first, c->first_len, &hh, &why);
    if (rc == SP_PARSE_MORE && c->first_len < c->first_cap)
        return;
    if (rc != SP_PARSE_OK) {
        if (c->dst_port == 443) {
            deny(c, s, "tls", "", NULL, "not_tls");
            return;
        }
        /* Not HTTP at all (no method token) is "tcp"; a head that started like HTTP and
         * broke a rule is "http" (the why goes to the log). */
        bool not_http = why && strcmp(why, "not an HTTP request") == 0;
        if (why && !not_http)
            sp_log(SP_LOG_INFO, "bad request head", SP_KS("sandbox", c->sandbox),
                   SP_KS("why", why));
        deny(c, s, not_http ? "tcp" : "http", "", NULL,
             rc == SP_PARSE_MORE ? "head_too_large"
             : not_http          ? "no_rule"
                                 : "bad_http_head");
        return;
    }
    if (c->dst_port == 443) {
        deny(c, s, "tls", hh.host, NULL, "not_tls");
        return;
    }
    if (hh.is_connect) {
        deny(c, s, "http", hh.host, NULL, "connect_unsupported");
        return;
    }
    if (hh.chunked) {
        deny(c, s, "http", hh.host, NULL, "chunked_body_unsupported");
        return;
    }
    if (hh.host_port && hh.host_port != c->dst_port) {
        deny(c, s, "http", hh.host, NULL, "host_port_mismatch");
        return;
    }
    if (check_name(c, s, "http", hh.host, &addr) < 0)
        return;
    c->http = true;
    /* What was read beyond the head is body, counted against Content-Length; anything past
     * the body is dropped. */
    int64_t cl = hh.content_length > 0 ? hh.content_length : 0;
    size_t after = c->first_len - hh.head_len;
    if ((int64_t)after > cl)
        c->first_len = hh.head_len + (size_t)cl;
    c->body_left = cl - (int64_t)(c->first_len - hh.head_len);
    connect_up(c, addr);
}

static void on_accept(uv_stream_t *server, int status)
{
    eg_t *eg = server->data;
    if (status < 0)
        return;
    conn_t *c = sp_xcalloc(1, sizeof(*c));
    c->eg = eg;
    c->client.c = c->up.c = c;
    uv_tcp_init(eg->loop, &c->client.tcp);
    uv_tcp_init(eg->loop, &c->up.tcp);
    uv_timer_init(eg->loop, &c->timer);
    c->client.tcp.data = c->up.tcp.data = c->timer.data = c;
    c->open_handles = 3;
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
    eg_sbx_t *s = eg_sbx_by_addr(eg, peer_addr.sin_addr.s_addr);
    if (!s) {
        conn_close(c); /* not one of our sandboxes */
        return;
    }
    snprintf(c->sandbox, sizeof(c->sandbox), "%s", s->id);
    c->dst_be = orig.sin_addr.s_addr;
    c->dst_port = ntohs(orig.sin_port);
    if (s->conns >= eg->cfg->max_conns) {
        deny(c, s, "tcp", "", NULL, "connection_limit");
        return;
    }
    s->conns++;
    c->counted = true;

    eg_verdict_t v;
    eg_decide_addr(s, c->dst_be, c->dst_port, &v);
    bool by_addr = v.allow && (s->mode != SP_NET_ALLOW_ALL || !eg_has_name_denies(s));
    if (!v.allow && strcmp(v.reason, "denied_by_rule") == 0) {
        deny(c, s, "tcp", "", &v, v.reason);
        return;
    }
    if (by_addr) {
        eg_audit(eg, s, true, "tcp", "", c->dst_be, c->dst_port, v.rule, v.reason);
        connect_up(c, c->dst_be);
        return;
    }
    c->first_cap = (size_t)eg->cfg->head_max_bytes;
    c->first = sp_xmalloc(c->first_cap);
    uv_timer_start(&c->timer, on_timeout, (uint64_t)eg->cfg->first_bytes_timeout_ms, 0);
    if (uv_read_start((uv_stream_t *)&c->client.tcp, alloc_cb, on_read) == 0)
        c->client.reading = true;
    else
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
    /* Never initialised when an earlier start step failed (uv_tcp_init sets the loop). */
    if (eg->listener.loop && !uv_is_closing((uv_handle_t *)&eg->listener))
        uv_close((uv_handle_t *)&eg->listener, NULL);
}
