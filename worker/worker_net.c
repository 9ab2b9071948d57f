/* The per-sandbox network: a named netns, a veth pair and a /30 from net_prefix.0.0/16,
 * configured over rtnetlink (libmnl) rather than by running `ip` several times per create.
 *
 * The netns is made the way `ip netns add` makes it: a short-lived thread unshares its network
 * namespace and bind-mounts /proc/thread-self/ns/net onto /run/netns/<name>; the thread also
 * opens the netlink socket used to configure the inside (a socket stays in the namespace it was
 * created in), so the calling thread never changes namespace.
 *
 * Address pool: the state is what exists on the host. A /30 is in use when any host interface
 * has an address in it; the lowest free one is taken under pool_lock, which is held until the
 * host side of the new veth carries its .1. A restart therefore never reuses a live /30.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "hash.h"
#include "log.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

#define POOL_SLOTS  16384 /* /30s in a /16 */
#define NL_BUF_SIZE 32768 /* larger than any dump message the kernel builds (NLMSG_GOODSIZE) */
#define PEER_IFNAME "eth0"

typedef struct {
    struct mnl_socket *nl;
    uint32_t portid;
    uint32_t seq;
} nl_t;

static int nl_open(nl_t *n)
{
    n->nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
    if (!n->nl)
        return -errno;
    if (mnl_socket_bind(n->nl, 0, MNL_SOCKET_AUTOPID) < 0) {
        int rc = -errno;
        mnl_socket_close(n->nl);
        n->nl = NULL;
        return rc;
    }
    n->portid = mnl_socket_get_portid(n->nl);
    n->seq = (uint32_t)time(NULL);
    return 0;
}

static void nl_close(nl_t *n)
{
    if (n->nl)
        mnl_socket_close(n->nl);
    n->nl = NULL;
}

/* Sends one request (NLM_F_ACK or NLM_F_DUMP set by the caller) and runs cb on every reply
 * until the ACK or NLMSG_DONE. A kernel error comes back as its negative errno. */
static int nl_talk(nl_t *n, struct nlmsghdr *nlh, mnl_cb_t cb, void *data)
{
    nlh->nlmsg_seq = ++n->seq;
    if (mnl_socket_sendto(n->nl, nlh, nlh->nlmsg_len) < 0)
        return -errno;
    char *buf = sp_xmalloc(NL_BUF_SIZE);
    int rc;
    for (;;) {
        ssize_t len = mnl_socket_recvfrom(n->nl, buf, NL_BUF_SIZE);
        if (len < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        errno = 0;
        int r = mnl_cb_run(buf, (size_t)len, n->seq, n->portid, cb, data);
        if (r < 0) {
            rc = errno ? -errno : -EIO;
            break;
        }
        if (r == MNL_CB_STOP) {
            rc = 0;
            break;
        }
    }
    free(buf);
    return rc;
}

static struct nlmsghdr *msg_start(char *buf, uint16_t type, uint16_t flags)
{
    struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST | flags;
    return nlh;
}

/* ---- names ---- */

void wk__netns_name(const wk_host_t *h, const char *id, char out[WK_NETNS_NAME_MAX])
{
    snprintf(out, WK_NETNS_NAME_MAX, "sp-%s-%s", h->tag, id);
}

void wk__veth_name(const wk_host_t *h, const char *id, char out[IFNAMSIZ])
{
    uint8_t d[SP_SHA256_LEN];
    char hex[9];
    sp_sha256(id, strlen(id), d);
    sp_hex_encode(d, 4, hex);
    snprintf(out, IFNAMSIZ, "spv%.4s%s", h->tag, hex);
}

/* ---- /run/netns ---- */

int wk__net_prepare(void)
{
    if (mkdir(WK_NETNS_DIR, 0755) < 0 && errno != EEXIST)
        return -errno;
    /* Like iproute2: make /run/netns a shared mount point, so a netns unmounted here is
     * unmounted in every mount namespace that copied it. */
    if (mount("", WK_NETNS_DIR, "none", MS_SHARED | MS_REC, NULL) == 0)
        return 0;
    if (errno != EINVAL)
        return -errno;
    if (mount(WK_NETNS_DIR, WK_NETNS_DIR, "none", MS_BIND | MS_REC, NULL) < 0)
        return -errno;
    if (mount("", WK_NETNS_DIR, "none", MS_SHARED | MS_REC, NULL) < 0)
        return -errno;
    return 0;
}

typedef struct {
    const char *path;
    int ns_fd;
    nl_t inside;
    bool mounted;
    int rc;
    const char *what;
} ns_job_t;

static void *ns_thread(void *arg)
{
    ns_job_t *j = arg;
    if (unshare(CLONE_NEWNET) < 0) {
        j->rc = -errno;
        j->what = "unshare(CLONE_NEWNET)";
        return NULL;
    }
    int fd = open(j->path, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0);
    if (fd < 0) {
        j->rc = -errno;
        j->what = "create netns file";
        return NULL;
    }
    close(fd);
    if (mount("/proc/thread-self/ns/net", j->path, "none", MS_BIND, NULL) < 0) {
        j->rc = -errno;
        j->what = "bind-mount netns";
        unlink(j->path);
        return NULL;
    }
    j->mounted = true;
    j->ns_fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (j->ns_fd < 0) {
        j->rc = -errno;
        j->what = "open netns";
        return NULL;
    }
    j->rc = nl_open(&j->inside);
    if (j->rc < 0)
        j->what = "netlink socket in netns";
    return NULL;
}

/* ---- address pool ---- */

typedef struct {
    uint32_t net; /* a.b.0.0, host order */
    uint8_t used[POOL_SLOTS / 8];
} pool_scan_t;

static int addr_attr_cb(const struct nlattr *attr, void *data)
{
    pool_scan_t *p = data;
    uint16_t type = mnl_attr_get_type(attr);
    if ((type == IFA_ADDRESS || type == IFA_LOCAL) && mnl_attr_validate(attr, MNL_TYPE_U32) == 0) {
        uint32_t a = ntohl(mnl_attr_get_u32(attr));
        if ((a & 0xffff0000u) == p->net) {
            uint32_t slot = (a & 0xffffu) >> 2;
            p->used[slot / 8] |= (uint8_t)(1u << (slot % 8));
        }
    }
    return MNL_CB_OK;
}

static int addr_msg_cb(const struct nlmsghdr *nlh, void *data)
{
    const struct ifaddrmsg *ifa = mnl_nlmsg_get_payload(nlh);
    if (ifa->ifa_family == AF_INET)
        mnl_attr_parse(nlh, sizeof(*ifa), addr_attr_cb, data);
    return MNL_CB_OK;
}

static int pool_pick(nl_t *host, uint8_t a, uint8_t b, uint32_t *ret_slot)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh = msg_start(buf, RTM_GETADDR, NLM_F_DUMP);
    struct ifaddrmsg *ifa = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifa));
    ifa->ifa_family = AF_INET;
    pool_scan_t *p = sp_xcalloc(1, sizeof(*p));
    p->net = ((uint32_t)a << 24) | ((uint32_t)b << 16);
    int rc = nl_talk(host, nlh, addr_msg_cb, p);
    if (rc == 0) {
        rc = -ENOSPC;
        for (uint32_t s = 0; s < POOL_SLOTS; s++) {
            if (!(p->used[s / 8] & (1u << (s % 8)))) {
                *ret_slot = s;
                rc = 0;
                break;
            }
        }
    }
    free(p);
    return rc;
}

/* ---- links, addresses, routes ---- */

static int create_veth(nl_t *host, const char *host_if, const char *alias, int ns_fd)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh = msg_start(buf, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK);
    /* No IFF_UP here: veth_open fails with ENOTCONN while the pair is half made. */
    struct ifinfomsg *ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
    ifm->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, host_if);
    mnl_attr_put_strz(nlh, IFLA_IFALIAS, alias);
    struct nlattr *linkinfo = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
    mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
    struct nlattr *data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
    struct nlattr *peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
    /* The peer's attributes follow its own ifinfomsg (drivers/net/veth.c, veth_newlink). */
    struct ifinfomsg *pifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*pifm));
    pifm->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, PEER_IFNAME);
    mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, (uint32_t)ns_fd);
    mnl_attr_nest_end(nlh, peer);
    mnl_attr_nest_end(nlh, data);
    mnl_attr_nest_end(nlh, linkinfo);
    return nl_talk(host, nlh, NULL, NULL);
}

static int link_up(nl_t *n, const char *ifname)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh = msg_start(buf, RTM_NEWLINK, NLM_F_ACK);
    struct ifinfomsg *ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
    ifm->ifi_family = AF_UNSPEC;
    ifm->ifi_flags = IFF_UP;
    ifm->ifi_change = IFF_UP;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, ifname);
    return nl_talk(n, nlh, NULL, NULL);
}

static int link_index_cb(const struct nlmsghdr *nlh, void *data)
{
    const struct ifinfomsg *ifm = mnl_nlmsg_get_payload(nlh);
    if (nlh->nlmsg_type == RTM_NEWLINK)
        *(int *)data = ifm->ifi_index;
    return MNL_CB_OK;
}

static int link_index(nl_t *n, const char *ifname, int *ret_index)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh = msg_start(buf, RTM_GETLINK, NLM_F_ACK);
    struct ifinfomsg *ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
    ifm->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, ifname);
    int index = 0;
    int rc = nl_talk(n, nlh, link_index_cb, &index);
    if (rc < 0)
        return rc;
    if (index <= 0)
        return -ENODEV;
    *ret_index = index;
    return 0;
}

static int link_delete(nl_t *n, const char *ifname)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh = msg_start(buf, RTM_DELLINK, NLM_F_ACK);
    struct ifinfomsg *ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
    ifm->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, ifname);
    return nl_talk(n, nlh, NULL, NULL);
}

static int addr_add(nl_t *n, int ifindex, uint32_t addr_be, uint8_t prefixlen)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh = msg_start(buf, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK);
    struct ifaddrmsg *ifa = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifa));
    ifa->ifa_family = AF_INET;
    ifa->ifa_prefixlen = prefixlen;
    ifa->ifa_scope = RT_SCOPE_UNIVERSE;
    ifa->ifa_index = (uint32_t)ifindex;
    mnl_attr_put_u32(nlh, IFA_LOCAL, addr_be);
    mnl_attr_put_u32(nlh, IFA_ADDRESS, addr_be);
    return nl_talk(n, nlh, NULL, NULL);
}

static int route_default(nl_t *n, int ifindex, uint32_t gw_be)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh = msg_start(buf, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK);
    struct rtmsg *rtm = mnl_nlmsg_put_extra_header(nlh, sizeof(*rtm));
    rtm->rtm_family = AF_INET;
    rtm->rtm_dst_len = 0;
    rtm->rtm_table = RT_TABLE_MAIN;
    rtm->rtm_protocol = RTPROT_BOOT;
    rtm->rtm_scope = RT_SCOPE_UNIVERSE;
    rtm->rtm_type = RTN_UNICAST;
    mnl_attr_put_u32(nlh, RTA_GATEWAY, gw_be);
    mnl_attr_put_u32(nlh, RTA_OIF, (uint32_t)ifindex);
    return nl_talk(n, nlh, NULL, NULL);
}

/* ---- create / destroy ---- */

int wk__net_create(wk_host_t *h, const char *id, char ret_addr[16], char err[WK_ERR_MAX])
{
    char name[WK_NETNS_NAME_MAX], veth[IFNAMSIZ];
    wk__netns_name(h, id, name);
    wk__veth_name(h, id, veth);
    char *path = sp_xasprintf("%s/%s", WK_NETNS_DIR, name);
    char *alias = sp_xasprintf("space %s %s", h->worker_id, id);
    nl_t host = {0};
    ns_job_t job = {.path = path, .ns_fd = -1};
    bool made = false;
    int rc;

    pthread_t t;
    rc = -pthread_create(&t, NULL, ns_thread, &job);
    if (rc < 0) {
        rc = wk__fail(err, rc, "netns thread: %s", strerror(-rc));
        goto out;
    }
    pthread_join(t, NULL);
    made = job.mounted; /* an EEXIST file is someone else's: leave it alone */
    if (job.rc < 0) {
        rc = wk__fail(err, job.rc, "%s %s: %s", job.what, path, strerror(-job.rc));
        goto out;
    }

    rc = nl_open(&host);
    if (rc < 0) {
        rc = wk__fail(err, rc, "netlink socket: %s", strerror(-rc));
        goto out;
    }
    uint32_t slot = 0;
    pthread_mutex_lock(&h->pool_lock);
    rc = pool_pick(&host, h->net_a, h->net_b, &slot);
    if (rc < 0) {
        pthread_mutex_unlock(&h->pool_lock);
        rc = wk__fail(err, rc, "address pool %u.%u.0.0/16: %s", h->net_a, h->net_b,
                      rc == -ENOSPC ? "exhausted" : strerror(-rc));
        goto out;
    }
    uint32_t base = ((uint32_t)h->net_a << 24) | ((uint32_t)h->net_b << 16) | (slot << 2);
    uint32_t host_be = htonl(base | 1), guest_be = htonl(base | 2);
    rc = create_veth(&host, veth, alias, job.ns_fd);
    int host_index = 0;
    if (rc == 0)
        rc = link_index(&host, veth, &host_index);
    if (rc == 0)
        rc = addr_add(&host, host_index, host_be, 30);
    if (rc == 0)
        rc = link_up(&host, veth);
    pthread_mutex_unlock(&h->pool_lock);
    if (rc == 0) {
        /* Before anything runs inside: until this element exists the sandbox's packets are
         * dropped as spoofed. */
        char e2[WK_ERR_MAX];
        int64_t t0 = wk__now_us();
        rc = wk__nft_sandbox_add(h, veth, guest_be, e2);
        if (rc < 0) {
            rc = wk__fail(err, rc, "%s", e2);
            goto out;
        }
        sp_log(SP_LOG_DEBUG, "firewall element added", SP_KS("sandbox", id),
               SP_KF("ms", (double)(wk__now_us() - t0) / 1000.0));
    }
    if (rc < 0) {
        rc = wk__fail(err, rc, "veth %s: %s", veth, strerror(-rc));
        goto out;
    }

    int eth_index = 0;
    rc = link_up(&job.inside, "lo");
    if (rc == 0)
        rc = link_index(&job.inside, PEER_IFNAME, &eth_index);
    if (rc == 0)
        rc = addr_add(&job.inside, eth_index, guest_be, 30);
    if (rc == 0)
        rc = link_up(&job.inside, PEER_IFNAME);
    if (rc == 0)
        rc = route_default(&job.inside, eth_index, host_be);
    if (rc < 0) {
        rc = wk__fail(err, rc, "configure %s in netns %s: %s", PEER_IFNAME, name, strerror(-rc));
        goto out;
    }
    struct in_addr ga = {.s_addr = guest_be};
    inet_ntop(AF_INET, &ga, ret_addr, 16);
out:
    nl_close(&host);
    nl_close(&job.inside);
    if (job.ns_fd >= 0)
        close(job.ns_fd);
    if (rc < 0 && made)
        (void)wk__net_destroy(h, id, NULL);
    free(alias);
    free(path);
    return rc;
}

int wk__net_destroy(wk_host_t *h, const char *id, char err[WK_ERR_MAX])
{
    char name[WK_NETNS_NAME_MAX], veth[IFNAMSIZ];
    wk__netns_name(h, id, name);
    wk__veth_name(h, id, veth);
    int rc = 0;

    /* The firewall element first: it names the veth, which is about to go. */
    char e2[WK_ERR_MAX];
    int64_t t0 = wk__now_us();
    int r = wk__nft_sandbox_del_veth(h, veth, e2);
    if (r < 0)
        rc = wk__fail(err, r, "%s", e2);
    sp_log(SP_LOG_DEBUG, "firewall element removed", SP_KS("sandbox", id),
           SP_KF("ms", (double)(wk__now_us() - t0) / 1000.0));

    /* Delete the veth explicitly: the kernel removes it with the netns, but asynchronously,
     * and a netns still referenced by a process would keep it. */
    nl_t host = {0};
    r = nl_open(&host);
    if (r == 0) {
        r = link_delete(&host, veth);
        if (r == -ENODEV)
            r = 0;
    }
    nl_close(&host);
    if (r < 0 && rc == 0)
        rc = wk__fail(err, r, "delete veth %s: %s", veth, strerror(-r));

    char *path = sp_xasprintf("%s/%s", WK_NETNS_DIR, name);
    if (umount2(path, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT && rc == 0)
        rc = wk__fail(err, -errno, "umount %s: %s", path, strerror(errno));
    if (unlink(path) < 0 && errno != ENOENT && rc == 0)
        rc = wk__fail(err, -errno, "remove %s: %s", path, strerror(errno));
    free(path);
    return rc;
}

/* The host end's IPv4 address of interface ifindex (the sandbox's gateway). */
typedef struct {
    int ifindex;
    uint32_t addr_be;
} addr_of_t;

static int addr_of_cb(const struct nlmsghdr *nlh, void *data)
{
    addr_of_t *a = data;
    const struct ifaddrmsg *ifa = mnl_nlmsg_get_payload(nlh);
    if (ifa->ifa_family != AF_INET || (int)ifa->ifa_index != a->ifindex)
        return MNL_CB_OK;
    const struct nlattr *attr;
    mnl_attr_for_each(attr, nlh, sizeof(*ifa))
    {
        if (mnl_attr_get_type(attr) == IFA_LOCAL && mnl_attr_validate(attr, MNL_TYPE_U32) == 0)
            a->addr_be = mnl_attr_get_u32(attr);
    }
    return MNL_CB_OK;
}

int wk__net_address(wk_host_t *h, const char *id, uint32_t *ret_guest_be, char err[WK_ERR_MAX])
{
    char veth[IFNAMSIZ];
    wk__veth_name(h, id, veth);
    nl_t host = {0};
    addr_of_t a = {0};
    int rc = nl_open(&host);
    if (rc == 0)
        rc = link_index(&host, veth, &a.ifindex);
    if (rc == 0) {
        char buf[MNL_SOCKET_BUFFER_SIZE];
        struct nlmsghdr *nlh = msg_start(buf, RTM_GETADDR, NLM_F_DUMP);
        struct ifaddrmsg *ifa = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifa));
        ifa->ifa_family = AF_INET;
        rc = nl_talk(&host, nlh, addr_of_cb, &a);
    }
    nl_close(&host);
    if (rc == 0 && !a.addr_be)
        rc = -EADDRNOTAVAIL;
    if (rc < 0)
        return wk__fail(err, rc, "address of veth %s: %s", veth, strerror(-rc));
    /* The sandbox is the .2 of the /30 whose .1 the host end holds. */
    *ret_guest_be = htonl(ntohl(a.addr_be) + 1);
    return 0;
}

int wk__net_restore(wk_host_t *h, const char *id, char err[WK_ERR_MAX])
{
    char veth[IFNAMSIZ];
    uint32_t guest_be = 0;
    int rc = wk__net_address(h, id, &guest_be, err);
    if (rc < 0)
        return rc;
    wk__veth_name(h, id, veth);
    return wk__nft_sandbox_add(h, veth, guest_be, err);
}
