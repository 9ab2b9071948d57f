/* The sandboxes' DNS server (docs/egress.md). Queries reach it on dns_port after the worker's
 * nftables redirect of <gateway>:53; the sandbox is known by the source address (anti-spoofing
 * makes that trustworthy), and a source that is no sandbox gets no answer at all.
 *
 * A name the policy does not allow is answered REFUSED and nothing is sent upstream (no DNS
 * tunnelling through the gateway). An allowed A query is resolved by egressd ITSELF with a
 * fresh query (new id, no guest bytes forwarded) to the configured upstream; the A records
 * (CNAMEs flattened) are attributed to (sandbox, name) for their TTL plus a grace period,
 * which the proxy requires of every destination. AAAA and every other type of an allowed
 * name: an empty NOERROR answer (IPv6 is dropped anyway; TXT and friends are tunnels). */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "dns.h"
#include "egressd.h"
#include "error.h"
#include "log.h"
#include "xmalloc.h"

#define PENDING_MAX     1024
#define PENDING_PER_SBX 64
#define ANSWERS_MAX     16
/* Queries from an address of the worker's pool that no event has named yet (a sandbox that
 * just started, or was just claimed from a warm pool: docs/pools.md) wait this long for it,
 * at most HELD_MAX of them, looked at again after every batch of events and every tick. */
#define HELD_MAX     64
#define HELD_WAIT_MS 1000

typedef struct {
    bool used;
    struct sockaddr_in from;
    int64_t deadline_ms;
    size_t len;
    uint8_t msg[SP_DNS_MSG_MAX];
} held_t;

typedef struct {
    bool used;
    uint16_t up_id;
    sp_dns_query_t q;
    struct sockaddr_in client;
    char sandbox[65];
    int64_t deadline_ms;
    eg_resolve_cb cb; /* a lookup of egressd's own (CONNECT): no guest to answer */
    void *cb_arg;
} pending_t;

struct eg_dns {
    uv_udp_t server;
    uv_udp_t upstream;
    bool have_upstream;
    int closed; /* close callbacks run (eg_dns_stop) */
    struct sockaddr_in upstream_addr;
    pending_t pending[PENDING_MAX];
    size_t n_pending;
    held_t held[HELD_MAX];
    size_t n_held;
    uint8_t rbuf[2][SP_DNS_MSG_MAX * 2];
};

typedef struct {
    uv_udp_send_t req;
    uint8_t data[SP_DNS_MSG_MAX];
} send_t;

static void on_sent(uv_udp_send_t *req, int status)
{
    free(req->data);
}

static void reply(eg_t *eg, const struct sockaddr_in *to, const uint8_t *msg, size_t len)
{
    send_t *s = sp_xmalloc(sizeof(*s));
    memcpy(s->data, msg, len);
    s->req.data = s;
    uv_buf_t b = uv_buf_init((char *)s->data, (unsigned)len);
    if (uv_udp_send(&s->req, &eg->dns->server, &b, 1, (const struct sockaddr *)to, on_sent) < 0)
        free(s);
}

static void answer(eg_t *eg, const struct sockaddr_in *to, const sp_dns_query_t *q, int rcode,
                   const sp_dns_a_t *a, size_t n)
{
    uint8_t buf[SP_DNS_MSG_MAX];
    size_t len =
        sp_dns_build_response(buf, sizeof(buf), q, rcode, a, n, (uint32_t)eg->cfg->dns_ttl_max_s);
    if (len)
        reply(eg, to, buf, len);
}

static void formerr(eg_t *eg, const struct sockaddr_in *to, const uint8_t *msg, size_t len)
{
    int id = sp_dns_header_id(msg, len);
    if (id < 0)
        return;
    uint8_t buf[12] = {0};
    buf[0] = (uint8_t)(id >> 8);
    buf[1] = (uint8_t)id;
    buf[2] = 0x80;
    buf[3] = SP_DNS_FORMERR;
    reply(eg, to, buf, sizeof(buf));
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    eg_t *eg = h->data;
    int which = h == (uv_handle_t *)&eg->dns->server ? 0 : 1;
    *buf = uv_buf_init((char *)eg->dns->rbuf[which], sizeof(eg->dns->rbuf[which]));
}

/* Sends an A query for name upstream and takes a pending slot; NULL when there is no
 * upstream, no room (per sandbox or in all), or the send failed. */
static pending_t *ask_upstream(eg_t *eg, const eg_sbx_t *s, const char *name)
{
    eg_dns_t *d = eg->dns;
    size_t mine = 0;
    for (size_t i = 0; i < PENDING_MAX; i++)
        mine += d->pending[i].used && strcmp(d->pending[i].sandbox, s->id) == 0;
    if (!d->have_upstream || d->n_pending >= PENDING_MAX || mine >= PENDING_PER_SBX)
        return NULL;
    pending_t *p = NULL;
    uint16_t id = 0;
    for (int tries = 0; tries < 8 && !p; tries++) {
        if (getrandom(&id, sizeof(id), 0) != sizeof(id))
            break;
        bool taken = false;
        for (size_t i = 0; i < PENDING_MAX; i++)
            taken = taken || (d->pending[i].used && d->pending[i].up_id == id);
        if (taken)
            continue;
        for (size_t i = 0; i < PENDING_MAX && !p; i++)
            if (!d->pending[i].used)
                p = &d->pending[i];
    }
    if (!p)
        return NULL;
    uint8_t buf[SP_DNS_MSG_MAX];
    size_t len = sp_dns_build_query(buf, sizeof(buf), id, name, SP_DNS_TYPE_A);
    send_t *sr = sp_xmalloc(sizeof(*sr));
    memcpy(sr->data, buf, len);
    sr->req.data = sr;
    uv_buf_t b = uv_buf_init((char *)sr->data, (unsigned)len);
    if (!len || uv_udp_send(&sr->req, &d->upstream, &b, 1,
                            (const struct sockaddr *)&d->upstream_addr, on_sent) < 0) {
        free(sr);
        return NULL;
    }
    memset(p, 0, sizeof(*p));
    p->used = true;
    p->up_id = id;
    snprintf(p->sandbox, sizeof(p->sandbox), "%s", s->id);
    p->deadline_ms = eg_now_ms() + eg->cfg->dns_timeout_ms;
    d->n_pending++;
    return p;
}

static void forward(eg_t *eg, eg_sbx_t *s, const sp_dns_query_t *q, const struct sockaddr_in *from)
{
    pending_t *p = ask_upstream(eg, s, q->name);
    if (!p) {
        answer(eg, from, q, SP_DNS_SERVFAIL, NULL, 0);
        return;
    }
    p->q = *q;
    p->client = *from;
}

int eg_dns_resolve(eg_t *eg, eg_sbx_t *s, const char *name, eg_resolve_cb cb, void *arg)
{
    if (!eg->dns || strlen(name) >= sizeof(((sp_dns_query_t *)0)->name))
        return -EINVAL;
    pending_t *p = ask_upstream(eg, s, name);
    if (!p)
        return -EAGAIN;
    snprintf(p->q.name, sizeof(p->q.name), "%s", name);
    p->q.qtype = SP_DNS_TYPE_A;
    p->cb = cb;
    p->cb_arg = arg;
    return 0;
}

void eg_dns_cancel(eg_t *eg, void *arg)
{
    eg_dns_t *d = eg->dns;
    for (size_t i = 0; d && i < PENDING_MAX; i++) {
        if (d->pending[i].used && d->pending[i].cb && d->pending[i].cb_arg == arg) {
            d->pending[i].used = false;
            d->n_pending--;
        }
    }
}

/* Frees the slot first: the callback may start another lookup. */
static void finish_lookup(eg_t *eg, pending_t *p, uint32_t addr_be)
{
    eg_resolve_cb cb = p->cb;
    void *arg = p->cb_arg;
    p->used = false;
    eg->dns->n_pending--;
    cb(eg, arg, addr_be);
}

static void handle_query(eg_t *eg, eg_sbx_t *s, const struct sockaddr_in *from, const uint8_t *msg,
                         size_t nread);

static void on_query(uv_udp_t *h, ssize_t nread, const uv_buf_t *buf, const struct sockaddr *addr,
                     unsigned flags)
{
    eg_t *eg = h->data;
    if (nread <= 0 || !addr || addr->sa_family != AF_INET || (flags & UV_UDP_PARTIAL))
        return;
    const struct sockaddr_in *from = (const struct sockaddr_in *)addr;
    eg_sbx_t *s = eg_sbx_by_addr(eg, from->sin_addr.s_addr);
    if (!s) {
        eg_dns_t *d = eg->dns;
        if ((ntohl(from->sin_addr.s_addr) & eg->pool.mask) != eg->pool.net ||
            d->n_held >= HELD_MAX || (size_t)nread > SP_DNS_MSG_MAX)
            return; /* not a sandbox of ours: no answer, no reflection */
        for (size_t i = 0; i < HELD_MAX; i++) {
            held_t *hq = &d->held[i];
            if (hq->used)
                continue;
            hq->used = true;
            hq->from = *from;
            hq->deadline_ms = eg_now_ms() + HELD_WAIT_MS;
            hq->len = (size_t)nread;
            memcpy(hq->msg, buf->base, (size_t)nread);
            d->n_held++;
            break;
        }
        return;
    }
    handle_query(eg, s, from, (const uint8_t *)buf->base, (size_t)nread);
}

void eg_dns_retry_held(eg_t *eg)
{
    eg_dns_t *d = eg->dns;
    if (!d || d->n_held == 0)
        return;
    int64_t now = eg_now_ms();
    for (size_t i = 0; i < HELD_MAX; i++) {
        held_t *hq = &d->held[i];
        if (!hq->used)
            continue;
        eg_sbx_t *s = eg_sbx_by_addr(eg, hq->from.sin_addr.s_addr);
        if (!s && hq->deadline_ms > now)
            continue;
        hq->used = false;
        d->n_held--;
        if (s)
            handle_query(eg, s, &hq->from, hq->msg, hq->len);
    }
}

/* A query of sandbox s. */
static void handle_query(eg_t *eg, eg_sbx_t *s, const struct sockaddr_in *from, const uint8_t *msg,
                         size_t nread)
{
    sp_dns_query_t q;
    if (sp_dns_parse_query(msg, nread, &q) < 0) {
        eg_audit(eg, s, false, "dns", "", 0, 53, "parser", "malformed_query");
        formerr(eg, from, msg, nread);
        return;
    }
    if (q.qclass != SP_DNS_CLASS_IN) {
        eg_audit(eg, s, false, "dns", q.name, 0, 53, "parser", "class_not_in");
        answer(eg, from, &q, SP_DNS_REFUSED, NULL, 0);
        return;
    }
    eg_verdict_t v;
    eg_decide_name(s, q.name, 0, &v);
    if (!v.allow) {
        eg_audit(eg, s, false, "dns", q.name, 0, 53, v.rule, v.reason);
        answer(eg, from, &q, SP_DNS_REFUSED, NULL, 0);
        return;
    }
    if (q.qtype != SP_DNS_TYPE_A) {
        answer(eg, from, &q, SP_DNS_NOERROR, NULL, 0);
        return;
    }
    eg_audit(eg, s, true, "dns", q.name, 0, 53, v.rule, v.reason);
    forward(eg, s, &q, from);
}

static void on_upstream(uv_udp_t *h, ssize_t nread, const uv_buf_t *buf,
                        const struct sockaddr *addr, unsigned flags)
{
    eg_t *eg = h->data;
    eg_dns_t *d = eg->dns;
    if (nread <= 0 || !addr || addr->sa_family != AF_INET)
        return;
    const struct sockaddr_in *from = (const struct sockaddr_in *)addr;
    if (from->sin_addr.s_addr != d->upstream_addr.sin_addr.s_addr ||
        from->sin_port != d->upstream_addr.sin_port)
        return;
    int id = sp_dns_header_id((const uint8_t *)buf->base, (size_t)nread);
    pending_t *p = NULL;
    for (size_t i = 0; i < PENDING_MAX && !p && id >= 0; i++)
        if (d->pending[i].used && d->pending[i].up_id == (uint16_t)id)
            p = &d->pending[i];
    if (!p)
        return;
    sp_dns_a_t a[ANSWERS_MAX];
    size_t n = 0;
    int rcode = 0;
    int rc = sp_dns_parse_response((const uint8_t *)buf->base, (size_t)nread, p->up_id, p->q.name,
                                   a, ANSWERS_MAX, &n, &rcode);
    if (rc < 0)
        return; /* not the answer (spoofed or broken): the real one may still come */
    eg_sbx_t *s = eg_sbx_by_id(eg, p->sandbox);
    if (s) {
        if (rcode != SP_DNS_NOERROR && rcode != SP_DNS_NXDOMAIN)
            rcode = SP_DNS_SERVFAIL;
        for (size_t i = 0; i < n && rcode == SP_DNS_NOERROR; i++) {
            uint32_t ttl = a[i].ttl < (uint32_t)eg->cfg->dns_ttl_max_s
                               ? a[i].ttl
                               : (uint32_t)eg->cfg->dns_ttl_max_s;
            eg_attribute(eg, s, p->q.name, a[i].addr_be, ttl);
        }
        if (!p->cb)
            answer(eg, &p->client, &p->q, rcode, a, rcode == SP_DNS_NOERROR ? n : 0);
    }
    if (p->cb) {
        finish_lookup(eg, p, s && rcode == SP_DNS_NOERROR ? eg_resolved_addr(s, p->q.name) : 0);
        return;
    }
    p->used = false;
    d->n_pending--;
}

void eg_dns_tick(eg_t *eg)
{
    eg_dns_t *d = eg->dns;
    if (!d)
        return;
    eg_dns_retry_held(eg);
    int64_t now = eg_now_ms();
    for (size_t i = 0; i < PENDING_MAX; i++) {
        pending_t *p = &d->pending[i];
        if (p->used && p->deadline_ms <= now) {
            if (p->cb) {
                finish_lookup(eg, p, 0);
                continue;
            }
            if (eg_sbx_by_id(eg, p->sandbox))
                answer(eg, &p->client, &p->q, SP_DNS_SERVFAIL, NULL, 0);
            p->used = false;
            d->n_pending--;
        }
    }
}

static int parse_hostport(const char *s, uint16_t def_port, struct sockaddr_in *out)
{
    char host[64];
    const char *colon = strchr(s, ':');
    size_t hl = colon ? (size_t)(colon - s) : strlen(s);
    if (hl == 0 || hl >= sizeof(host))
        return -EINVAL;
    memcpy(host, s, hl);
    host[hl] = '\0';
    long port = def_port;
    if (colon) {
        char *end = NULL;
        port = strtol(colon + 1, &end, 10);
        if (!end || *end || port < 1 || port > 65535)
            return -EINVAL;
    }
    return uv_ip4_addr(host, (int)port, out);
}

int eg_dns_start(eg_t *eg)
{
    eg_dns_t *d = sp_xcalloc(1, sizeof(*d));
    eg->dns = d;
    uv_udp_init(eg->loop, &d->server);
    uv_udp_init(eg->loop, &d->upstream);
    d->server.data = eg;
    d->upstream.data = eg;
    struct sockaddr_in bind_addr;
    int rc = uv_ip4_addr(eg->cfg->listen_host, (int)eg->cfg->dns_port, &bind_addr);
    if (rc < 0)
        return rc;
    if ((rc = uv_udp_bind(&d->server, (const struct sockaddr *)&bind_addr, 0)) < 0 ||
        (rc = uv_udp_recv_start(&d->server, alloc_cb, on_query)) < 0)
        return rc;
    if (eg->cfg->upstream_dns[0]) {
        if (parse_hostport(eg->cfg->upstream_dns, 53, &d->upstream_addr) < 0) {
            sp_log(SP_LOG_ERROR, "bad --upstream-dns", SP_KS("value", eg->cfg->upstream_dns));
            return -EINVAL;
        }
        struct sockaddr_in any;
        uv_ip4_addr("0.0.0.0", 0, &any);
        if ((rc = uv_udp_bind(&d->upstream, (const struct sockaddr *)&any, 0)) < 0 ||
            (rc = uv_udp_recv_start(&d->upstream, alloc_cb, on_upstream)) < 0)
            return rc;
        d->have_upstream = true;
    }
    return 0;
}

/* Both handles live in d: it is freed after the second close callback, whichever order
 * libuv runs them in (it runs pending closes last-closed first). */
static void on_closed(uv_handle_t *h)
{
    eg_dns_t *d = h->data;
    if (++d->closed == 2)
        free(d);
}

void eg_dns_stop(eg_t *eg)
{
    eg_dns_t *d = eg->dns;
    if (!d)
        return;
    d->server.data = d;
    d->upstream.data = d;
    uv_close((uv_handle_t *)&d->server, on_closed);
    uv_close((uv_handle_t *)&d->upstream, on_closed);
    eg->dns = NULL;
}
