/* The sandbox firewall: one nftables table per worker, built over nf_tables netlink with
 * libnftnl + libmnl (no `nft` process in the data path). docs/egress.md explains the rule set.
 *
 *   table inet space_<tag>
 *     set sbx  { type ifname . ipv4_addr }   one element per sandbox: (host veth, its address)
 *     chain pre   filter prerouting -150: from our veths: IPv6 dropped; a source that is not
 *                 the sandbox's own (iifname . saddr not in @sbx) dropped; TCP accepted (nat
 *                 redirects it); UDP 53 accepted whatever its destination (nat redirects it);
 *                 ICMP echo-request only to the address of the veth itself (fib daddr . iif
 *                 type local: the gateway .1); the rest dropped
 *     chain nat   nat prerouting -100: TCP -> redirect to :proxy_port, UDP 53 to any address
 *                 -> :dns_port (REDIRECT rewrites the destination to the veth's own address,
 *                 the gateway; SO_ORIGINAL_DST gives the proxy the address the guest chose,
 *                 and conntrack answers a DNS query from the address it was sent to)
 *     chain in    filter input 0: from our veths only tcp :proxy_port, udp :dns_port, icmp
 *                 echo-request; everything else that would reach a host socket is dropped
 *                 (the guests' FINs to :proxy_port are logged to egressd first, finlog.h)
 *     chain out   filter output -300: the proxy's FINs and RSTs to our veths logged to egressd
 *     chain fwd   filter forward 0: nothing is forwarded from or to our veths
 *
 * Every DNS query reaches egressd's resolver, whichever resolver the guest names: the template's
 * resolv.conf (8.8.8.8, say) or one written for an earlier gateway (a sandbox resumed into a
 * new /30, on this host or another) works unchanged, and no query leaves the host. Without a
 * DNS port nothing rewrites it, and "in" (to the gateway) or "fwd" (anywhere else) drops it.
 * TCP 53 is TCP like any other: the proxy gets it and closes it (egressd's DNS is UDP only).
 *
 * Our veths are matched by their name prefix "spv<tag[0..4)>" (worker_runtime_int.h), so the
 * chains are static and a sandbox costs one set element: adding or removing one is a single
 * netlink batch of one message, atomic and O(1). Until its element exists, a sandbox can send
 * nothing (its source is "spoofed"): fail closed.
 *
 * nfnetlink processes a batch synchronously inside sendmsg(), so every answer is queued on
 * the socket when sendto() returns: reading until EAGAIN collects them without a timeout.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <libmnl/libmnl.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/expr.h>
#include <libnftnl/rule.h>
#include <libnftnl/set.h>
#include <libnftnl/table.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "finlog.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_RST 0x04

#define NFT_BUF_SIZE (256 * 1024)
#define SET_NAME     "sbx"
/* nft's datatype ids (include/datatype.h): a concatenation's type is (a << 6) | b. */
#define NFT_TYPE_IPADDR 7
#define NFT_TYPE_IFNAME 41
#define SET_KEY_LEN     (IFNAMSIZ + 4)

typedef struct {
    struct mnl_socket *nl;
    struct mnl_nlmsg_batch *b;
    char *buf;
    uint32_t seq;
    int msgs;
} nft_batch_t;

void wk__nft_table_name(const wk_host_t *h, char out[WK_NFT_NAME_MAX])
{
    snprintf(out, WK_NFT_NAME_MAX, "space_%s", h->tag);
}

static int batch_open(nft_batch_t *t)
{
    memset(t, 0, sizeof(*t));
    t->nl = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
    if (!t->nl)
        return -errno;
    if (mnl_socket_bind(t->nl, 0, MNL_SOCKET_AUTOPID) < 0) {
        int rc = -errno;
        mnl_socket_close(t->nl);
        t->nl = NULL;
        return rc;
    }
    t->buf = sp_xmalloc(NFT_BUF_SIZE);
    t->b = mnl_nlmsg_batch_start(t->buf, NFT_BUF_SIZE);
    t->seq = (uint32_t)time(NULL);
    nftnl_batch_begin(mnl_nlmsg_batch_current(t->b), t->seq++);
    mnl_nlmsg_batch_next(t->b);
    return 0;
}

static void batch_close(nft_batch_t *t)
{
    if (t->b)
        mnl_nlmsg_batch_stop(t->b);
    if (t->nl)
        mnl_socket_close(t->nl);
    free(t->buf);
    memset(t, 0, sizeof(*t));
}

static struct nlmsghdr *batch_hdr(nft_batch_t *t, uint16_t type, uint16_t flags)
{
    t->msgs++;
    return nftnl_nlmsg_build_hdr(mnl_nlmsg_batch_current(t->b), type, NFPROTO_INET,
                                 flags | NLM_F_ACK, t->seq++);
}

static void batch_next(nft_batch_t *t)
{
    /* The buffer holds the largest batch built here many times over; running out would be
     * a bug in this file, not an input. */
    if (!mnl_nlmsg_batch_next(t->b))
        abort();
}

/* Sends the batch and returns the first error the kernel reported (the whole batch is then
 * rolled back), or 0. */
static int batch_send(nft_batch_t *t)
{
    nftnl_batch_end(mnl_nlmsg_batch_current(t->b), t->seq++);
    mnl_nlmsg_batch_next(t->b);
    if (mnl_socket_sendto(t->nl, mnl_nlmsg_batch_head(t->b), mnl_nlmsg_batch_size(t->b)) < 0)
        return -errno;
    int rc = 0, fd = mnl_socket_get_fd(t->nl);
    uint32_t portid = mnl_socket_get_portid(t->nl);
    char *rbuf = sp_xmalloc(MNL_SOCKET_BUFFER_SIZE);
    int acks = 0;
    for (;;) {
        ssize_t n = recv(fd, rbuf, MNL_SOCKET_BUFFER_SIZE, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        /* Each message of ours answers with one NLMSG_ERROR (0 = ack). */
        for (struct nlmsghdr *nh = (struct nlmsghdr *)rbuf; mnl_nlmsg_ok(nh, (int)n);
             nh = mnl_nlmsg_next(nh, (int *)&n)) {
            if (nh->nlmsg_type != NLMSG_ERROR || nh->nlmsg_pid != portid)
                continue;
            const struct nlmsgerr *e = mnl_nlmsg_get_payload(nh);
            acks++;
            if (e->error < 0 && rc == 0)
                rc = e->error;
        }
    }
    free(rbuf);
    if (rc == 0 && acks < t->msgs)
        rc = -EPROTO;
    return rc;
}

/* ---- expressions ---- */

static void e_meta(struct nftnl_rule *r, uint32_t key, uint32_t dreg)
{
    struct nftnl_expr *e = nftnl_expr_alloc("meta");
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_KEY, key);
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_DREG, dreg);
    nftnl_rule_add_expr(r, e);
}

static void e_cmp(struct nftnl_rule *r, uint32_t sreg, uint32_t op, const void *data, uint32_t len)
{
    struct nftnl_expr *e = nftnl_expr_alloc("cmp");
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_SREG, sreg);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_OP, op);
    nftnl_expr_set(e, NFTNL_EXPR_CMP_DATA, data, len);
    nftnl_rule_add_expr(r, e);
}

static void e_payload(struct nftnl_rule *r, uint32_t base, uint32_t off, uint32_t len,
                      uint32_t dreg)
{
    struct nftnl_expr *e = nftnl_expr_alloc("payload");
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_BASE, base);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_OFFSET, off);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_LEN, len);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_DREG, dreg);
    nftnl_rule_add_expr(r, e);
}

static void e_verdict(struct nftnl_rule *r, int verdict)
{
    struct nftnl_expr *e = nftnl_expr_alloc("immediate");
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG_VERDICT);
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_VERDICT, (uint32_t)verdict);
    nftnl_rule_add_expr(r, e);
}

/* iifname / oifname == "spv<tag4>*" (eq) or != (neq): a prefix compare. */
static void m_ifprefix(const wk_host_t *h, struct nftnl_rule *r, uint32_t key, uint32_t op)
{
    char prefix[IFNAMSIZ];
    int n = snprintf(prefix, sizeof(prefix), "spv%.4s", h->tag);
    e_meta(r, key, NFT_REG_1);
    e_cmp(r, NFT_REG_1, op, prefix, (uint32_t)n);
}

static void m_l4proto(struct nftnl_rule *r, uint8_t proto)
{
    e_meta(r, NFT_META_L4PROTO, NFT_REG_1);
    e_cmp(r, NFT_REG_1, NFT_CMP_EQ, &proto, 1);
}

static void m_dport(struct nftnl_rule *r, uint16_t port)
{
    uint16_t be = htons(port);
    e_payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, NFT_REG_1);
    e_cmp(r, NFT_REG_1, NFT_CMP_EQ, &be, 2);
}

static void m_sport(struct nftnl_rule *r, uint16_t port)
{
    uint16_t be = htons(port);
    e_payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2, NFT_REG_1);
    e_cmp(r, NFT_REG_1, NFT_CMP_EQ, &be, 2);
}

/* tcp flags & mask != 0 */
static void m_tcp_flags_any(struct nftnl_rule *r, uint8_t mask)
{
    uint8_t zero = 0;
    e_payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 13, 1, NFT_REG_1);
    struct nftnl_expr *e = nftnl_expr_alloc("bitwise");
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_SREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_DREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_LEN, 1);
    nftnl_expr_set(e, NFTNL_EXPR_BITWISE_MASK, &mask, 1);
    nftnl_expr_set(e, NFTNL_EXPR_BITWISE_XOR, &zero, 1);
    nftnl_rule_add_expr(r, e);
    e_cmp(r, NFT_REG_1, NFT_CMP_NEQ, &zero, 1);
}

/* log group SP_FINLOG_GROUP(proxy port) snaplen SP_FINLOG_SNAPLEN queue-threshold 1: each
 * packet reaches egressd's socket as it passes (finlog.h). Not a verdict: the rules go on. */
static void e_finlog(const wk_host_t *h, struct nftnl_rule *r)
{
    struct nftnl_expr *e = nftnl_expr_alloc("log");
    nftnl_expr_set_u16(e, NFTNL_EXPR_LOG_GROUP, SP_FINLOG_GROUP(h->egress_proxy_port));
    nftnl_expr_set_u32(e, NFTNL_EXPR_LOG_SNAPLEN, SP_FINLOG_SNAPLEN);
    nftnl_expr_set_u16(e, NFTNL_EXPR_LOG_QTHRESHOLD, 1);
    nftnl_rule_add_expr(r, e);
}

static void m_icmp_echo(struct nftnl_rule *r)
{
    uint8_t type = 8; /* echo-request (RFC 792) */
    m_l4proto(r, IPPROTO_ICMP);
    e_payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 0, 1, NFT_REG_1);
    e_cmp(r, NFT_REG_1, NFT_CMP_EQ, &type, 1);
}

/* fib daddr . iif type local: the destination is an address of the interface the packet
 * came in on, i.e. the host end of this sandbox's veth (its gateway). */
static void m_to_gateway(struct nftnl_rule *r)
{
    uint32_t local = RTN_LOCAL;
    struct nftnl_expr *e = nftnl_expr_alloc("fib");
    nftnl_expr_set_u32(e, NFTNL_EXPR_FIB_FLAGS, NFTA_FIB_F_DADDR | NFTA_FIB_F_IIF);
    nftnl_expr_set_u32(e, NFTNL_EXPR_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE);
    nftnl_expr_set_u32(e, NFTNL_EXPR_FIB_DREG, NFT_REG_1);
    nftnl_rule_add_expr(r, e);
    e_cmp(r, NFT_REG_1, NFT_CMP_EQ, &local, 4);
}

static void e_redirect(struct nftnl_rule *r, uint16_t port)
{
    uint16_t be = htons(port);
    struct nftnl_expr *e = nftnl_expr_alloc("immediate");
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG_1);
    nftnl_expr_set(e, NFTNL_EXPR_IMM_DATA, &be, 2);
    nftnl_rule_add_expr(r, e);
    e = nftnl_expr_alloc("redir");
    nftnl_expr_set_u32(e, NFTNL_EXPR_REDIR_REG_PROTO_MIN, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_REDIR_REG_PROTO_MAX, NFT_REG_1);
    nftnl_rule_add_expr(r, e);
}

/* ---- building the table ---- */

typedef struct {
    const wk_host_t *h;
    nft_batch_t *t;
    const char *table;
} ctx_t;

static struct nftnl_rule *rule_new(const ctx_t *c, const char *chain)
{
    struct nftnl_rule *r = nftnl_rule_alloc();
    nftnl_rule_set_u32(r, NFTNL_RULE_FAMILY, NFPROTO_INET);
    nftnl_rule_set_str(r, NFTNL_RULE_TABLE, c->table);
    nftnl_rule_set_str(r, NFTNL_RULE_CHAIN, chain);
    return r;
}

static void rule_put(const ctx_t *c, struct nftnl_rule *r)
{
    struct nlmsghdr *nh = batch_hdr(c->t, NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND);
    nftnl_rule_nlmsg_build_payload(nh, r);
    batch_next(c->t);
    nftnl_rule_free(r);
}

/* A base chain, created if missing, then emptied: the rules that follow replace whatever an
 * earlier worker (or version) put there, in the same transaction. */
static void chain_put(const ctx_t *c, const char *name, const char *type, uint32_t hook, int prio)
{
    struct nftnl_chain *ch = nftnl_chain_alloc();
    nftnl_chain_set_str(ch, NFTNL_CHAIN_TABLE, c->table);
    nftnl_chain_set_str(ch, NFTNL_CHAIN_NAME, name);
    nftnl_chain_set_str(ch, NFTNL_CHAIN_TYPE, type);
    nftnl_chain_set_u32(ch, NFTNL_CHAIN_HOOKNUM, hook);
    nftnl_chain_set_s32(ch, NFTNL_CHAIN_PRIO, prio);
    nftnl_chain_set_u32(ch, NFTNL_CHAIN_POLICY, NF_ACCEPT);
    struct nlmsghdr *nh = batch_hdr(c->t, NFT_MSG_NEWCHAIN, NLM_F_CREATE);
    nftnl_chain_nlmsg_build_payload(nh, ch);
    batch_next(c->t);
    nftnl_chain_free(ch);

    struct nftnl_rule *r = nftnl_rule_alloc();
    nftnl_rule_set_u32(r, NFTNL_RULE_FAMILY, NFPROTO_INET);
    nftnl_rule_set_str(r, NFTNL_RULE_TABLE, c->table);
    nftnl_rule_set_str(r, NFTNL_RULE_CHAIN, name);
    nh = batch_hdr(c->t, NFT_MSG_DELRULE, 0);
    nftnl_rule_nlmsg_build_payload(nh, r);
    batch_next(c->t);
    nftnl_rule_free(r);
}

static void build_pre(const ctx_t *c)
{
    const wk_host_t *h = c->h;
    chain_put(c, "pre", "filter", NF_INET_PRE_ROUTING, -150);

    struct nftnl_rule *r = rule_new(c, "pre");
    m_ifprefix(h, r, NFT_META_IIFNAME, NFT_CMP_NEQ);
    e_verdict(r, NFT_RETURN);
    rule_put(c, r);

    /* IPv6: none at all (the sandbox has no IPv6 address; neighbour discovery included). */
    uint8_t v6 = NFPROTO_IPV6;
    r = rule_new(c, "pre");
    e_meta(r, NFT_META_NFPROTO, NFT_REG_1);
    e_cmp(r, NFT_REG_1, NFT_CMP_EQ, &v6, 1);
    e_verdict(r, NF_DROP);
    rule_put(c, r);

    /* Anti-spoofing: iifname . ip saddr must be this sandbox's pair. */
    r = rule_new(c, "pre");
    e_meta(r, NFT_META_IIFNAME, NFT_REG32_00);
    e_payload(r, NFT_PAYLOAD_NETWORK_HEADER, 12, 4, NFT_REG32_04);
    struct nftnl_expr *e = nftnl_expr_alloc("lookup");
    nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_SREG, NFT_REG32_00);
    nftnl_expr_set_str(e, NFTNL_EXPR_LOOKUP_SET, SET_NAME);
    nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
    nftnl_rule_add_expr(r, e);
    e_verdict(r, NF_DROP);
    rule_put(c, r);

    r = rule_new(c, "pre");
    m_l4proto(r, IPPROTO_TCP);
    e_verdict(r, NF_ACCEPT);
    rule_put(c, r);

    /* DNS to any address: nat redirects it to egressd's resolver on the gateway. */
    r = rule_new(c, "pre");
    m_l4proto(r, IPPROTO_UDP);
    m_dport(r, 53);
    e_verdict(r, NF_ACCEPT);
    rule_put(c, r);

    r = rule_new(c, "pre");
    m_icmp_echo(r);
    m_to_gateway(r);
    e_verdict(r, NF_ACCEPT);
    rule_put(c, r);

    r = rule_new(c, "pre");
    e_verdict(r, NF_DROP);
    rule_put(c, r);
}

static void build_nat(const ctx_t *c)
{
    const wk_host_t *h = c->h;
    chain_put(c, "nat", "nat", NF_INET_PRE_ROUTING, -100);
    /* Without a proxy port there is nowhere to send TCP: "pre" accepted it, "in" drops it
     * because nothing rewrote it to an allowed port. */
    if (h->egress_proxy_port) {
        struct nftnl_rule *r = rule_new(c, "nat");
        m_ifprefix(h, r, NFT_META_IIFNAME, NFT_CMP_EQ);
        m_l4proto(r, IPPROTO_TCP);
        e_redirect(r, h->egress_proxy_port);
        rule_put(c, r);
    }
    /* Whatever address the guest sends its query to: egressd's resolver answers it. */
    if (h->egress_dns_port) {
        struct nftnl_rule *r = rule_new(c, "nat");
        m_ifprefix(h, r, NFT_META_IIFNAME, NFT_CMP_EQ);
        m_l4proto(r, IPPROTO_UDP);
        m_dport(r, 53);
        e_redirect(r, h->egress_dns_port);
        rule_put(c, r);
    }
}

static void build_in(const ctx_t *c)
{
    const wk_host_t *h = c->h;
    chain_put(c, "in", "filter", NF_INET_LOCAL_IN, 0);

    struct nftnl_rule *r = rule_new(c, "in");
    m_ifprefix(h, r, NFT_META_IIFNAME, NFT_CMP_NEQ);
    e_verdict(r, NFT_RETURN);
    rule_put(c, r);
    if (h->egress_proxy_port) {
        /* The guests' FINs to the proxy, for egressd (finlog.h). */
        r = rule_new(c, "in");
        m_l4proto(r, IPPROTO_TCP);
        m_dport(r, h->egress_proxy_port);
        m_tcp_flags_any(r, TCP_FLAG_FIN);
        e_finlog(h, r);
        rule_put(c, r);
        r = rule_new(c, "in");
        m_l4proto(r, IPPROTO_TCP);
        m_dport(r, h->egress_proxy_port);
        e_verdict(r, NF_ACCEPT);
        rule_put(c, r);
    }
    if (h->egress_dns_port) {
        r = rule_new(c, "in");
        m_l4proto(r, IPPROTO_UDP);
        m_dport(r, h->egress_dns_port);
        e_verdict(r, NF_ACCEPT);
        rule_put(c, r);
    }
    r = rule_new(c, "in");
    m_icmp_echo(r);
    e_verdict(r, NF_ACCEPT);
    rule_put(c, r);
    r = rule_new(c, "in");
    e_verdict(r, NF_DROP);
    rule_put(c, r);
}

/* The proxy's FINs and RSTs to the guests, for egressd (finlog.h). Before any other table's
 * output chain (raw's priority): one that drops or changes the segment must not hide it. */
static void build_out(const ctx_t *c)
{
    const wk_host_t *h = c->h;
    chain_put(c, "out", "filter", NF_INET_LOCAL_OUT, -300);
    if (!h->egress_proxy_port)
        return;
    struct nftnl_rule *r = rule_new(c, "out");
    m_ifprefix(h, r, NFT_META_OIFNAME, NFT_CMP_EQ);
    m_l4proto(r, IPPROTO_TCP);
    m_sport(r, h->egress_proxy_port);
    m_tcp_flags_any(r, TCP_FLAG_FIN | TCP_FLAG_RST);
    e_finlog(h, r);
    rule_put(c, r);
}

static void build_fwd(const ctx_t *c)
{
    chain_put(c, "fwd", "filter", NF_INET_FORWARD, 0);
    struct nftnl_rule *r = rule_new(c, "fwd");
    m_ifprefix(c->h, r, NFT_META_IIFNAME, NFT_CMP_EQ);
    e_verdict(r, NF_DROP);
    rule_put(c, r);
    r = rule_new(c, "fwd");
    m_ifprefix(c->h, r, NFT_META_OIFNAME, NFT_CMP_EQ);
    e_verdict(r, NF_DROP);
    rule_put(c, r);
}

static struct nftnl_set *set_new(const char *table)
{
    struct nftnl_set *s = nftnl_set_alloc();
    nftnl_set_set_u32(s, NFTNL_SET_FAMILY, NFPROTO_INET);
    nftnl_set_set_str(s, NFTNL_SET_TABLE, table);
    nftnl_set_set_str(s, NFTNL_SET_NAME, SET_NAME);
    return s;
}

int wk__nft_setup(wk_host_t *h, char err[WK_ERR_MAX])
{
    char table[WK_NFT_NAME_MAX];
    wk__nft_table_name(h, table);
    nft_batch_t t;
    int rc = batch_open(&t);
    if (rc < 0)
        return wk__fail(err, rc, "nf_tables netlink socket: %s", strerror(-rc));
    ctx_t c = {.h = h, .t = &t, .table = table};

    struct nftnl_table *tb = nftnl_table_alloc();
    nftnl_table_set_u32(tb, NFTNL_TABLE_FAMILY, NFPROTO_INET);
    nftnl_table_set_str(tb, NFTNL_TABLE_NAME, table);
    struct nlmsghdr *nh = batch_hdr(&t, NFT_MSG_NEWTABLE, NLM_F_CREATE);
    nftnl_table_nlmsg_build_payload(nh, tb);
    batch_next(&t);
    nftnl_table_free(tb);

    /* Created if missing; an existing set keeps its elements (the sandboxes that outlived
     * a worker restart stay reachable while the chains are replaced). */
    struct nftnl_set *s = set_new(table);
    nftnl_set_set_u32(s, NFTNL_SET_KEY_TYPE, (NFT_TYPE_IFNAME << 6) | NFT_TYPE_IPADDR);
    nftnl_set_set_u32(s, NFTNL_SET_KEY_LEN, SET_KEY_LEN);
    nftnl_set_set_u32(s, NFTNL_SET_ID, 1);
    nh = batch_hdr(&t, NFT_MSG_NEWSET, NLM_F_CREATE);
    nftnl_set_nlmsg_build_payload(nh, s);
    batch_next(&t);
    nftnl_set_free(s);

    build_pre(&c);
    build_nat(&c);
    build_in(&c);
    build_out(&c);
    build_fwd(&c);
    rc = batch_send(&t);
    batch_close(&t);
    if (rc < 0)
        return wk__fail(err, rc, "nftables table %s: %s", table, strerror(-rc));
    return 0;
}

static int element(wk_host_t *h, const char *veth, uint32_t addr_be, bool add, char err[WK_ERR_MAX])
{
    char table[WK_NFT_NAME_MAX];
    wk__nft_table_name(h, table);
    uint8_t key[SET_KEY_LEN];
    memset(key, 0, sizeof(key));
    memcpy(key, veth, strnlen(veth, IFNAMSIZ - 1));
    memcpy(key + IFNAMSIZ, &addr_be, 4);

    nft_batch_t t;
    int rc = batch_open(&t);
    if (rc < 0)
        return wk__fail(err, rc, "nf_tables netlink socket: %s", strerror(-rc));
    struct nftnl_set *s = set_new(table);
    struct nftnl_set_elem *el = nftnl_set_elem_alloc();
    nftnl_set_elem_set(el, NFTNL_SET_ELEM_KEY, key, sizeof(key));
    nftnl_set_elem_add(s, el);
    struct nlmsghdr *nh =
        batch_hdr(&t, add ? NFT_MSG_NEWSETELEM : NFT_MSG_DELSETELEM, add ? NLM_F_CREATE : 0);
    nftnl_set_elems_nlmsg_build_payload(nh, s);
    batch_next(&t);
    nftnl_set_free(s);
    rc = batch_send(&t);
    batch_close(&t);
    if (!add && rc == -ENOENT)
        rc = 0; /* gone already (or the table was never made) */
    if (rc < 0) {
        struct in_addr a = {.s_addr = addr_be};
        char text[16];
        inet_ntop(AF_INET, &a, text, sizeof(text));
        return wk__fail(err, rc, "nftables %s %s . %s: %s", add ? "add" : "delete", veth, text,
                        strerror(-rc));
    }
    return 0;
}

int wk__nft_sandbox_add(wk_host_t *h, const char *veth, uint32_t addr_be, char err[WK_ERR_MAX])
{
    return element(h, veth, addr_be, true, err);
}

int wk__nft_sandbox_del(wk_host_t *h, const char *veth, uint32_t addr_be, char err[WK_ERR_MAX])
{
    return element(h, veth, addr_be, false, err);
}

int wk__nft_teardown(wk_host_t *h, char err[WK_ERR_MAX])
{
    char table[WK_NFT_NAME_MAX];
    wk__nft_table_name(h, table);
    nft_batch_t t;
    int rc = batch_open(&t);
    if (rc < 0)
        return wk__fail(err, rc, "nf_tables netlink socket: %s", strerror(-rc));
    struct nftnl_table *tb = nftnl_table_alloc();
    nftnl_table_set_u32(tb, NFTNL_TABLE_FAMILY, NFPROTO_INET);
    nftnl_table_set_str(tb, NFTNL_TABLE_NAME, table);
    struct nlmsghdr *nh = batch_hdr(&t, NFT_MSG_DELTABLE, 0);
    nftnl_table_nlmsg_build_payload(nh, tb);
    batch_next(&t);
    nftnl_table_free(tb);
    rc = batch_send(&t);
    batch_close(&t);
    if (rc == -ENOENT)
        rc = 0;
    if (rc < 0)
        return wk__fail(err, rc, "delete nftables table %s: %s", table, strerror(-rc));
    return 0;
}

typedef struct {
    const char *veth;
    uint32_t found[16]; /* addresses of matching elements (one expected) */
    size_t n;
} match_t;

static int elems_cb(const struct nlmsghdr *nlh, void *data)
{
    match_t *m = data;
    struct nftnl_set *s = nftnl_set_alloc();
    if (nftnl_set_elems_nlmsg_parse(nlh, s) == 0) {
        struct nftnl_set_elems_iter *it = nftnl_set_elems_iter_create(s);
        for (struct nftnl_set_elem *el = it ? nftnl_set_elems_iter_next(it) : NULL; el;
             el = nftnl_set_elems_iter_next(it)) {
            uint32_t len = 0;
            const uint8_t *key = nftnl_set_elem_get(el, NFTNL_SET_ELEM_KEY, &len);
            if (!key || len != SET_KEY_LEN)
                continue;
            if (strncmp((const char *)key, m->veth, IFNAMSIZ) == 0 &&
                m->n < sizeof(m->found) / sizeof(m->found[0]))
                memcpy(&m->found[m->n++], key + IFNAMSIZ, 4);
        }
        if (it)
            nftnl_set_elems_iter_destroy(it);
    }
    nftnl_set_free(s);
    return MNL_CB_OK;
}

int wk__nft_sandbox_del_veth(wk_host_t *h, const char *veth, char err[WK_ERR_MAX])
{
    char table[WK_NFT_NAME_MAX];
    wk__nft_table_name(h, table);
    match_t m = {.veth = veth};
    struct mnl_socket *nl = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
    int rc = 0;
    if (!nl || mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
        rc = -errno;
        goto out;
    }
    char *buf = sp_xmalloc(MNL_SOCKET_BUFFER_SIZE);
    uint32_t seq = (uint32_t)time(NULL);
    struct nlmsghdr *nh =
        nftnl_nlmsg_build_hdr(buf, NFT_MSG_GETSETELEM, NFPROTO_INET, NLM_F_DUMP | NLM_F_ACK, seq);
    struct nftnl_set *s = set_new(table);
    nftnl_set_elems_nlmsg_build_payload(nh, s);
    nftnl_set_free(s);
    if (mnl_socket_sendto(nl, nh, nh->nlmsg_len) < 0) {
        rc = -errno;
    } else {
        uint32_t portid = mnl_socket_get_portid(nl);
        for (;;) {
            ssize_t n = mnl_socket_recvfrom(nl, buf, MNL_SOCKET_BUFFER_SIZE);
            if (n < 0) {
                rc = -errno;
                break;
            }
            int r = mnl_cb_run(buf, (size_t)n, seq, portid, elems_cb, &m);
            if (r < 0) {
                rc = -errno;
                break;
            }
            if (r == MNL_CB_STOP)
                break;
        }
    }
    free(buf);
out:
    if (nl)
        mnl_socket_close(nl);
    if (rc == -ENOENT)
        return 0; /* no table or set: nothing to delete */
    if (rc < 0)
        return wk__fail(err, rc, "list nftables set %s: %s", table, strerror(-rc));
    for (size_t i = 0; i < m.n; i++) {
        rc = wk__nft_sandbox_del(h, veth, m.found[i], err);
        if (rc < 0)
            return rc;
    }
    return 0;
}
