/* Reading the FIN segments the worker's nftables log for this egressd (finlog.h, docs/egress.md
 * "Both ends closing at once"): a close whose FINs crossed leaves the guest's endpoint in
 * TIME_WAIT for a minute, during which runsc cannot checkpoint the sandbox, so a suspend is
 * refused (EgressResetReply.time_wait_ms) instead of losing it.
 *
 * The group is bound over NETLINK_NETFILTER (NFULNL_MSG_CONFIG), each packet is sent to the
 * socket as it passes the rule (queue threshold 1), and the socket is read on the loop and
 * before every answer that depends on it (a reset request, an accepted connection). When the
 * kernel drops messages (ENOBUFS), the closes in them are unknown: every sandbox that closed a
 * connection in the last minute counts as crossed, conservatively. When the group cannot be
 * bound (another process holds it), egressd falls back to timing (egressd_proxy.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <stdlib.h>
#include <string.h>

#include "egressd.h"
#include "error.h"
#include "finlog.h"
#include "log.h"
#include "xmalloc.h"

/* What the kernel may hold for us between two reads: about 8,000 logged segments. */
#define RCVBUF_BYTES (8 * 1024 * 1024)
/* Each message in an skb of its own size, not the default 4 KiB one (more fit the buffer). */
#define NLBUFSIZ 512

struct eg_finlog {
    struct mnl_socket *nl;
    uv_poll_t poll;
    sp_finlog_t *table;
    uint16_t group;
    int64_t expired_ms;
    uint64_t crossed, clean, lost;
};

static int send_config(struct mnl_socket *nl, unsigned portid, uint16_t group, uint32_t seq,
                       void (*put)(struct nlmsghdr *))
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
    nlh->nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
    nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
    nlh->nlmsg_seq = seq;
    struct nfgenmsg *g = mnl_nlmsg_put_extra_header(nlh, sizeof(*g));
    g->nfgen_family = AF_UNSPEC;
    g->version = NFNETLINK_V0;
    g->res_id = htons(group);
    put(nlh);
    if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0)
        return -errno;
    ssize_t n = mnl_socket_recvfrom(nl, buf, sizeof(buf));
    if (n < 0)
        return -errno;
    return mnl_cb_run(buf, (size_t)n, seq, portid, NULL, NULL) < 0 ? -errno : 0;
}

static void put_bind(struct nlmsghdr *nlh)
{
    struct nfulnl_msg_config_cmd cmd = {.command = NFULNL_CFG_CMD_BIND};
    mnl_attr_put(nlh, NFULA_CFG_CMD, sizeof(cmd), &cmd);
}

static void put_mode(struct nlmsghdr *nlh)
{
    struct nfulnl_msg_config_mode mode = {.copy_range = htonl(SP_FINLOG_SNAPLEN),
                                          .copy_mode = NFULNL_COPY_PACKET};
    mnl_attr_put(nlh, NFULA_CFG_MODE, sizeof(mode), &mode);
    mnl_attr_put_u32(nlh, NFULA_CFG_QTHRESH, htonl(1));
    mnl_attr_put_u32(nlh, NFULA_CFG_NLBUFSIZ, htonl(NLBUFSIZ));
}

void eg_sbx_time_wait(eg_sbx_t *s, int64_t now_ms, const char *seen_by)
{
    bool told = s->time_wait_until_ms > now_ms + SP_FINLOG_TIME_WAIT_MS - 1000;
    s->time_wait_until_ms = now_ms + SP_FINLOG_TIME_WAIT_MS;
    if (!told) /* one line for a crossing both the log and the socket's state showed */
        sp_log(SP_LOG_INFO, "both ends closed at once: the guest's end stays in TIME_WAIT",
               SP_KS("sandbox", s->id), SP_KS("seen_by", seen_by),
               SP_KU("seconds", SP_FINLOG_TIME_WAIT_MS / 1000));
}

/* Sandboxes that closed a connection in the last minute: one of their closes may have been
 * in what the kernel dropped. */
static void lost_messages(eg_t *eg)
{
    int64_t now = eg_now_ms();
    size_t marked = 0;
    for (size_t i = 0; i < eg->n_sbx; i++) {
        eg_sbx_t *s = eg->sbx[i];
        if (s->closed_ms && now - s->closed_ms <= SP_FINLOG_TIME_WAIT_MS) {
            eg_sbx_time_wait(s, now, "log_overflow");
            marked++;
        }
    }
    eg->finlog->lost++;
    eg_metrics_close(eg, "log_overflow");
    sp_log(SP_LOG_WARN, "FIN log overflowed: recent closes count as crossed",
           SP_KU("sandboxes", marked));
}

static void on_packet(eg_t *eg, const uint8_t *pkt, size_t len, uint8_t hook)
{
    struct eg_finlog *fl = eg->finlog;
    uint32_t addr_be = 0;
    int64_t now = eg_now_ms();
    sp_finlog_verdict_t v = sp_finlog_packet(fl->table, pkt, len, hook == NF_INET_LOCAL_OUT,
                                             (uint16_t)eg->cfg->proxy_port, now, &addr_be);
    if (v == SP_FINLOG_CLEAN) {
        fl->clean++;
        eg_metrics_close(eg, "clean");
        return;
    }
    if (v != SP_FINLOG_CROSSED)
        return;
    fl->crossed++;
    eg_metrics_close(eg, "crossed");
    eg_sbx_t *s = eg_sbx_by_addr(eg, addr_be);
    if (s)
        eg_sbx_time_wait(s, now, "fin_log");
}

static int attr_cb(const struct nlattr *a, void *data)
{
    const struct nlattr **tb = data;
    int type = mnl_attr_get_type(a);
    if (mnl_attr_type_valid(a, NFULA_MAX) > 0)
        tb[type] = a;
    return MNL_CB_OK;
}

static int msg_cb(const struct nlmsghdr *nlh, void *data)
{
    if (nlh->nlmsg_type != ((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET))
        return MNL_CB_OK;
    const struct nlattr *tb[NFULA_MAX + 1] = {0};
    if (mnl_attr_parse(nlh, sizeof(struct nfgenmsg), attr_cb, tb) < 0)
        return MNL_CB_OK;
    if (!tb[NFULA_PACKET_HDR] || !tb[NFULA_PAYLOAD] ||
        mnl_attr_get_payload_len(tb[NFULA_PACKET_HDR]) < sizeof(struct nfulnl_msg_packet_hdr))
        return MNL_CB_OK;
    const struct nfulnl_msg_packet_hdr *ph = mnl_attr_get_payload(tb[NFULA_PACKET_HDR]);
    on_packet(data, mnl_attr_get_payload(tb[NFULA_PAYLOAD]),
              mnl_attr_get_payload_len(tb[NFULA_PAYLOAD]), ph->hook);
    return MNL_CB_OK;
}

void eg_finlog_drain(eg_t *eg)
{
    struct eg_finlog *fl = eg->finlog;
    if (!fl)
        return;
    char buf[MNL_SOCKET_BUFFER_SIZE];
    for (;;) {
        ssize_t n = mnl_socket_recvfrom(fl->nl, buf, sizeof(buf));
        if (n < 0) {
            if (errno == ENOBUFS) {
                lost_messages(eg);
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                sp_log(SP_LOG_WARN, "FIN log", SP_KS("error", strerror(errno)));
            if (errno != EINTR)
                return;
            continue;
        }
        (void)mnl_cb_run(buf, (size_t)n, 0, 0, msg_cb, eg);
    }
}

static void on_readable(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    eg_finlog_drain(p->data);
}

void eg_finlog_accepted(eg_t *eg, uint32_t addr_be, uint16_t port_be)
{
    if (!eg->finlog)
        return;
    eg_finlog_drain(eg); /* an earlier connection's FINs on this pair are read first */
    sp_finlog_forget(eg->finlog->table, addr_be, port_be);
}

void eg_finlog_tick(eg_t *eg)
{
    struct eg_finlog *f = eg->finlog;
    int64_t now = eg_now_ms();
    if (f && now - f->expired_ms >= 1000) {
        f->expired_ms = now;
        sp_finlog_expire(f->table, now);
    }
}

bool eg_finlog_running(const eg_t *eg)
{
    return eg->finlog != NULL;
}

int eg_finlog_start(eg_t *eg)
{
    uint16_t group = SP_FINLOG_GROUP(eg->cfg->proxy_port);
    struct mnl_socket *nl = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
    int rc = nl ? 0 : -errno;
    unsigned portid = 0;
    if (rc == 0 && mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0)
        rc = -errno;
    if (rc == 0) {
        portid = mnl_socket_get_portid(nl);
        int size = RCVBUF_BYTES;
        /* FORCE needs CAP_NET_ADMIN, which binding the group needs anyway; else the default. */
        if (setsockopt(mnl_socket_get_fd(nl), SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size)) < 0)
            (void)setsockopt(mnl_socket_get_fd(nl), SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
        rc = send_config(nl, portid, group, 1, put_bind);
    }
    if (rc == 0)
        rc = send_config(nl, portid, group, 2, put_mode);
    if (rc == 0) {
        int fd = mnl_socket_get_fd(nl);
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
            rc = -errno;
    }
    if (rc < 0) {
        if (nl)
            mnl_socket_close(nl);
        sp_log(SP_LOG_WARN,
               "cannot read the FIN log: crossed closes are told by timing alone (docs/egress.md)",
               SP_KI("group", group), SP_KS("error", strerror(-rc)));
        return 0;
    }
    struct eg_finlog *f = sp_xcalloc(1, sizeof(*f));
    f->nl = nl;
    f->group = group;
    f->table = sp_finlog_new();
    uv_poll_init(eg->loop, &f->poll, mnl_socket_get_fd(nl));
    f->poll.data = eg;
    uv_poll_start(&f->poll, UV_READABLE, on_readable);
    eg->finlog = f;
    sp_log(SP_LOG_INFO, "reading the FIN log", SP_KI("group", group));
    return 0;
}

static void on_poll_closed(uv_handle_t *h)
{
    struct eg_finlog *f = (struct eg_finlog *)((char *)h - offsetof(struct eg_finlog, poll));
    mnl_socket_close(f->nl); /* unbinds the group */
    sp_finlog_free(f->table);
    free(f);
}

void eg_finlog_stop(eg_t *eg)
{
    struct eg_finlog *f = eg->finlog;
    if (!f)
        return;
    eg->finlog = NULL;
    sp_log(SP_LOG_INFO, "FIN log", SP_KU("crossed", f->crossed), SP_KU("clean", f->clean),
           SP_KU("overflows", f->lost));
    uv_close((uv_handle_t *)&f->poll, on_poll_closed);
}
