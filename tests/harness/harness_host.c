/* A worker host in a network namespace of its own (host.h). */
#include "host.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "hash.h"
#include "xmalloc.h"

#define HOST_NET       "10.201" /* the hosts' /30s; sandboxes use 10.200 (worker --net-prefix) */
#define HOST_SLOTS     16384    /* /30s in the /16 */
#define HOST_LOCK_FILE "/run/lock/space-test-hosts.lock" /* one address pick at a time */
#define MAX_ARGS       32

struct sp_test_host {
    int n;
    char id[64];
    char netns[32];   /* space-h-<hex> */
    char veth[16];    /* sph<hex>, the machine side; also the nftables table's name */
    char outside[16]; /* the machine side's address (.1) */
    char inside[16];  /* the host's (.2) */
    char dir[512], cache[600], log[600], egress_log[600];
    bool egressd;
    const char *args[MAX_ARGS];
    pid_t worker_pid, egressd_pid;
    bool net_up;
};

static void must(int rc, const char *what)
{
    if (rc != 0)
        fail_msg("host: %s failed (%d)", what, rc);
}

/* Whether any interface of the machine's namespace has an address in slot's /30. */
static bool slot_used(uint32_t base)
{
    struct ifaddrs *ifs = NULL, *i;
    bool used = false;
    if (getifaddrs(&ifs) < 0)
        fail_msg("getifaddrs: %s", strerror(errno));
    for (i = ifs; i && !used; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
            uint32_t a = ntohl(((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr.s_addr);
            used = (a & ~3u) == base;
        }
    freeifaddrs(ifs);
    return used;
}

/* The client ports of the stack's nats-server nodes, from SPACE_NATS_URL
 * ("nats://127.0.0.1:P[,nats://127.0.0.1:P...]"): into ports, their count returned. */
static int nats_ports(int ports[8])
{
    const char *p = sp_test_env("SPACE_NATS_URL");
    int n = 0;
    while (*p && n < 8) {
        size_t k = strcspn(p, ",");
        const char *colon = memrchr(p, ':', k);
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (port <= 0 || port > 65535 || end != p + k)
            fail_msg("SPACE_NATS_URL: no port in '%.*s'", (int)k, p);
        ports[n++] = (int)port;
        p += k;
        p += *p == ',';
    }
    return n;
}

/* The same server list as the host dials it: the machine side's address. */
static char *inside_nats_url(const sp_test_host_t *h)
{
    int ports[8], n = nats_ports(ports);
    size_t cap = 64 * (size_t)n + 1, len = 0;
    char *url = sp_xcalloc(cap, 1);
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(url + len, cap - len, "%snats://%s:%d", i ? "," : "", h->outside,
                                ports[i]);
    return url;
}

/* The namespace, the veth pair with its /30, and the forwarding of the NATS ports. */
static void net_up(sp_test_host_t *h)
{
    int lock = open(HOST_LOCK_FILE, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock < 0 || flock(lock, LOCK_EX) < 0)
        fail_msg("%s: %s", HOST_LOCK_FILE, strerror(errno));
    uint8_t sha[SP_SHA256_LEN];
    char seed[700];
    snprintf(seed, sizeof(seed), "%s/%d", sp_test_env("SPACE_HOME"), h->n);
    sp_sha256(seed, strlen(seed), sha);
    uint32_t slot = ((uint32_t)sha[0] << 8 | sha[1]) % HOST_SLOTS, base = 0;
    struct in_addr net;
    inet_pton(AF_INET, HOST_NET ".0.0", &net);
    for (int tries = 0; tries < HOST_SLOTS; tries++, slot = (slot + 1) % HOST_SLOTS) {
        base = ntohl(net.s_addr) + slot * 4;
        if (!slot_used(base))
            break;
    }
    struct in_addr a = {.s_addr = htonl(base + 1)}, b = {.s_addr = htonl(base + 2)};
    inet_ntop(AF_INET, &a, h->outside, sizeof(h->outside));
    inet_ntop(AF_INET, &b, h->inside, sizeof(h->inside));
    snprintf(h->netns, sizeof(h->netns), "space-h-%02x%02x%02x%02x", sha[2], sha[3], sha[4],
             sha[5]);
    snprintf(h->veth, sizeof(h->veth), "sph%02x%02x%02x%02x", sha[2], sha[3], sha[4], sha[5]);
    /* Left over by an interrupted run of the same stack: gone first. */
    (void)sp_test_sh("ip netns del %s 2>/dev/null; ip link del %s 2>/dev/null; "
                     "nft delete table ip %s 2>/dev/null",
                     h->netns, h->veth, h->veth);
    h->net_up = true;
    must(sp_test_sh("ip netns add %s", h->netns), "ip netns add");
    must(sp_test_sh("ip link add %s type veth peer name eth0 netns %s && "
                    "ip addr add %s/30 dev %s && ip link set %s up && "
                    "ip -n %s addr add %s/30 dev eth0 && ip -n %s link set eth0 up && "
                    "ip -n %s link set lo up && ip -n %s route add default via %s",
                    h->veth, h->netns, h->outside, h->veth, h->veth, h->netns, h->inside, h->netns,
                    h->netns, h->netns, h->outside),
         "veth");
    (void)flock(lock, LOCK_UN);
    close(lock);

    /* Only the NATS client ports of the machine's loopback answer on the machine side. */
    int ports[8], n = nats_ports(ports);
    char set[128] = "";
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(set + len, sizeof(set) - len, "%s%d", i ? ", " : "", ports[i]);
    must(sp_test_sh("sysctl -q -w net.ipv4.conf.%s.route_localnet=1", h->veth), "route_localnet");
    must(sp_test_sh(
             "nft 'add table ip %s; add chain ip %s pre { type nat hook prerouting priority "
             "dstnat; policy accept; }; add rule ip %s pre iifname \"%s\" ip daddr %s tcp dport "
             "{ %s } dnat to 127.0.0.1'",
             h->veth, h->veth, h->veth, h->veth, h->outside, set),
         "nft forwarding");
}

static void net_down(sp_test_host_t *h)
{
    if (!h->net_up)
        return;
    (void)sp_test_sh("ip netns del %s 2>/dev/null; ip link del %s 2>/dev/null; "
                     "nft delete table ip %s 2>/dev/null",
                     h->netns, h->veth, h->veth);
    h->net_up = false;
}

/* What tests/harness/hosts-down.sh needs to remove the host when the test could not (killed at
 * its timeout): $SPACE_HOME/run/host-<n>.state, shell assignments; rewritten whenever a daemon
 * starts. */
static char *record_path(const sp_test_host_t *h)
{
    return sp_xasprintf("%s/run/host-%d.state", sp_test_env("SPACE_HOME"), h->n);
}

static void record(const sp_test_host_t *h)
{
    char *path = record_path(h);
    FILE *f = fopen(path, "w");
    if (!f)
        fail_msg("%s: %s", path, strerror(errno));
    fprintf(f, "netns=%s\nveth=%s\ndir='%s'\nworker_pid=%d\negressd_pid=%d\n", h->netns, h->veth,
            h->dir, (int)h->worker_pid, (int)h->egressd_pid);
    fclose(f);
    free(path);
}

/* Forks argv[0] inside the host's namespace, env set, output into log. */
static pid_t spawn_inside(const sp_test_host_t *h, const char *identity, const char *log,
                          const char *const *argv)
{
    char *url = inside_nats_url(h), *ns = sp_xasprintf("/run/netns/%s", h->netns);
    pid_t pid = fork();
    if (pid < 0)
        fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(ns, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET) < 0)
            _exit(125);
        int out = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (out < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0)
            _exit(126);
        setenv("SPACE_NATS_URL", url, 1);
        setenv("SPACE_IDENTITY", identity, 1);
        unsetenv("SPACE_ID");
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    free(url);
    free(ns);
    return pid;
}

static void daemons_up(sp_test_host_t *h)
{
    char *wbin = sp_xasprintf("%s/space-worker", sp_test_env("SPACE_BIN_DIR"));
    char *ident = sp_xasprintf("worker-%s", h->id);
    const char *argv[MAX_ARGS + 16] = {
        wbin,     "--id",           h->id,  "--state-dir", h->dir, "--snapshot-dir",
        h->cache, "--heartbeat-ms", "1000", NULL};
    size_t k = 9;
    for (size_t i = 0; h->args[i] && k < MAX_ARGS + 15; i++)
        argv[k++] = h->args[i];
    argv[k] = NULL;
    h->worker_pid = spawn_inside(h, ident, h->log, argv);
    free(ident);
    free(wbin);
    if (h->egressd) {
        char *ebin = sp_xasprintf("%s/space-egressd", sp_test_env("SPACE_BIN_DIR"));
        char *eid = sp_xasprintf("egressd-%s", h->id);
        const char *eargv[] = {ebin, "--id", h->id, NULL};
        h->egressd_pid = spawn_inside(h, eid, h->egress_log, eargv);
        free(eid);
        free(ebin);
    }
    record(h);
}

static void reap(pid_t *pid, int sig, int wait_s)
{
    if (*pid <= 0)
        return;
    kill(*pid, sig);
    int status;
    for (int i = 0; i < wait_s * 10; i++) {
        if (waitpid(*pid, &status, WNOHANG) == *pid) {
            *pid = 0;
            return;
        }
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
    kill(*pid, SIGKILL);
    waitpid(*pid, &status, 0);
    *pid = 0;
}

sp_test_host_t *sp_test_host_start(int n, const char *const *worker_args)
{
    assert_true(n >= 1 && n <= 16);
    sp_test_host_t *h = sp_xcalloc(1, sizeof(*h));
    const char *home = sp_test_env("SPACE_HOME");
    h->n = n;
    snprintf(h->id, sizeof(h->id), "%.56s-h%d", sp_test_env("SPACE_ID"), n);
    snprintf(h->dir, sizeof(h->dir), "%.480s/host-%d", home, n);
    snprintf(h->cache, sizeof(h->cache), "%s/snapshots", h->dir);
    snprintf(h->log, sizeof(h->log), "%.480s/log/host-%d-worker.log", home, n);
    snprintf(h->egress_log, sizeof(h->egress_log), "%.480s/log/host-%d-egressd.log", home, n);
    const char *daemons = getenv("SPACE_DAEMONS");
    h->egressd = daemons && strstr(daemons, "space-egressd");
    for (size_t i = 0; worker_args && worker_args[i] && i < MAX_ARGS - 1; i++)
        h->args[i] = worker_args[i];

    /* Its identities, as on a machine added to a deployment: credentials, a NATS user on
     * every node (nats.conf reloaded), its durables. */
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "identity add worker %s >/dev/null", h->id);
    assert_int_equal(sp_test_space(cmd), 0);
    if (h->egressd) {
        snprintf(cmd, sizeof(cmd), "identity add egressd %s >/dev/null", h->id);
        assert_int_equal(sp_test_space(cmd), 0);
    }
    net_up(h);
    daemons_up(h);
    sp_test_host_wait_live(h, true);
    return h;
}

const char *sp_test_host_id(const sp_test_host_t *h)
{
    return h->id;
}
const char *sp_test_host_dir(const sp_test_host_t *h)
{
    return h->dir;
}
const char *sp_test_host_cache(const sp_test_host_t *h)
{
    return h->cache;
}
const char *sp_test_host_log(const sp_test_host_t *h)
{
    return h->log;
}

static bool worker_live(const char *id)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM workers WHERE id = '%s' AND templates ? 'tiny' AND "
             "last_heartbeat_at > now() - interval '3 seconds'",
             id);
    PGconn *db = sp_test_db();
    bool live = sp_test_db_scalar(db, sql) == 1;
    PQfinish(db);
    return live;
}

/* Back: up to 150 s, since a returning worker sends no heartbeat while it waits (up to 120 s,
 * worker_reconcile.c wait_for_log) for an event log that is behind; gone: up to 60 s. */
static void wait_live(const char *id, pid_t pid, const char *log, bool want)
{
    const int tenths = want ? 1500 : 600;
    for (int i = 0; i < tenths && worker_live(id) != want; i++) {
        int status;
        if (want && pid > 0 && waitpid(pid, &status, WNOHANG) > 0)
            fail_msg("worker %s exited (see %s)", id, log);
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
    if (worker_live(id) != want)
        fail_msg("worker %s is %s after %d s (see %s)", id, want ? "not live" : "live", tenths / 10,
                 log);
    if (!want)
        sleep(7); /* the scheduler counts a worker gone after 3 missed heartbeats (2 s each) */
}

void sp_test_host_wait_live(const sp_test_host_t *h, bool want)
{
    wait_live(h->id, h->worker_pid, h->log, want);
}

void sp_test_host_gone(sp_test_host_t *h)
{
    reap(&h->worker_pid, SIGKILL, 10);
    reap(&h->egressd_pid, SIGKILL, 10);
    /* Its sandboxes go with it: every runsc process of this host (sandbox, gofer) is started
     * with its runsc root. */
    (void)sp_test_sh("pkill -KILL -f -- '--root=%s/runsc( |$)'", h->dir);
    for (int i = 0;
         i < 100 && sp_test_sh("pgrep -f -- '--root=%s/runsc( |$)' >/dev/null", h->dir) == 0; i++)
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    net_down(h);
}

void sp_test_host_stop(sp_test_host_t *h)
{
    reap(&h->worker_pid, SIGTERM, 30);
    reap(&h->egressd_pid, SIGTERM, 30);
}

void sp_test_host_back(sp_test_host_t *h)
{
    assert_true(h->worker_pid == 0);
    if (!h->net_up)
        net_up(h);
    daemons_up(h);
    sp_test_host_wait_live(h, true);
}

void sp_test_host_up(sp_test_host_t *h)
{
    if (h->worker_pid == 0)
        sp_test_host_back(h);
}

int sp_test_host_free(sp_test_host_t *h)
{
    if (!h)
        return 0;
    int rc = 0;
    sp_test_host_stop(h);
    /* The teardown runs where the worker ran: its firewall table is in the host's namespace
     * (made again, empty, when the host is gone). */
    if (!h->net_up) {
        (void)sp_test_sh("ip netns add %s", h->netns);
        h->net_up = true;
    }
    char *bin = sp_xasprintf("%s/space-worker", sp_test_env("SPACE_BIN_DIR"));
    const char *argv[] = {bin, "--teardown", "--state-dir", h->dir, NULL};
    char *ident = sp_xasprintf("worker-%s", h->id);
    pid_t pid = spawn_inside(h, ident, h->log, argv);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "host %d: teardown failed (see %s)\n", h->n, h->log);
        rc = -1;
    }
    free(ident);
    free(bin);
    net_down(h);
    /* Nothing of it left: namespace, veth, forwarding, mounts under its directory. */
    if (sp_test_sh("ip netns list | grep -qw %s", h->netns) == 0 ||
        sp_test_sh("ip link show %s >/dev/null 2>&1", h->veth) == 0 ||
        sp_test_sh("nft list table ip %s >/dev/null 2>&1", h->veth) == 0 ||
        sp_test_sh("grep -q ' %s' /proc/mounts", h->dir) == 0) {
        fprintf(stderr, "host %d: something of %s is left\n", h->n, h->netns);
        rc = -1;
    }
    if (rc == 0) {
        (void)sp_test_sh("rm -rf '%s'", h->dir);
        char *path = record_path(h);
        unlink(path);
        free(path);
    }
    free(h);
    return rc;
}
