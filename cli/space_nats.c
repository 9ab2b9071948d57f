/* nats-server with JetStream for the local stack. Its configuration is generated on every start
 * (nats/nats.conf); it always writes a ports file (run/nats-server_<pid>.ports), so the real
 * port is known whether SPACE_NATS_PORT named one or 0 asked for a free one. */
#include "space_stack.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <sys/stat.h>

#include "bus.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "space_proc.h"
#include "xmalloc.h"

#define NATS_COMM             "nats-server"
#define NATS_START_TIMEOUT_MS 20000
#define NATS_STOP_TIMEOUT_MS  10000
#define SP_NATS_NODES_MAX     5 /* the bound of --nats-nodes (main.c) */

/* Where clients connect: a wildcard bind address is reached through loopback. */
static const char *connect_host(const sp_stack_config_t *cfg)
{
    if (strcmp(cfg->nats_host, "0.0.0.0") == 0)
        return "127.0.0.1";
    if (strcmp(cfg->nats_host, "::") == 0)
        return "::1";
    return cfg->nats_host;
}

static char *nats_url(const sp_stack_config_t *cfg, int port)
{
    const char *host = connect_host(cfg);

    if (strchr(host, ':'))
        return sp_xasprintf("nats://[%s]:%d", host, port);
    return sp_xasprintf("nats://%s:%d", host, port);
}

/* Looks for name in $PATH, then in the sbin directories a root-less PATH misses (Debian puts
 * nats-server in /usr/sbin). Returns a heap path or NULL. */
static char *find_program(const char *name)
{
    const char *path = getenv("PATH");
    const char *extra[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin"};
    char *dirs, *dir, *save = NULL, *cand;

    if (strchr(name, '/'))
        return access(name, X_OK) == 0 ? sp_xstrdup(name) : NULL;
    dirs = sp_xstrdup(path ? path : "");
    for (dir = strtok_r(dirs, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        cand = sp_xasprintf("%s/%s", *dir ? dir : ".", name);
        if (access(cand, X_OK) == 0) {
            free(dirs);
            return cand;
        }
        free(cand);
    }
    free(dirs);
    for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++) {
        cand = sp_xasprintf("%s/%s", extra[i], name);
        if (access(cand, X_OK) == 0)
            return cand;
        free(cand);
    }
    return NULL;
}

static char *ports_file(const sp_stack_t *st, pid_t pid)
{
    return sp_xasprintf("%s/%s_%d.ports", st->run_dir, NATS_COMM, (int)pid);
}

/* Reads the client port from the ports file, {"nats":["nats://127.0.0.1:4222", ...]}.
 * Returns the port, 0 when the file is not there (yet), -errno on failure. */
static int read_ports_file(const char *path)
{
    char buf[4096], *url, *end, *colon;
    long port;
    ssize_t n;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    url = strstr(buf, "\"nats://");
    if (!url)
        return 0; /* written but not complete yet */
    url++;
    end = strchr(url, '"');
    if (!end)
        return 0;
    *end = '\0';
    colon = strrchr(url, ':');
    if (!colon)
        return -EIO;
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (errno || *end || port < 1 || port > 65535)
        return -EIO;
    return (int)port;
}

/* Ports files of servers that were killed stay behind: removed, and the port the last of
 * them names is returned (0: none), so that a server started again after a crash listens
 * where the running daemons reconnect to. */
static int remove_stale_ports_files(const sp_stack_t *st)
{
    size_t prefix = strlen(NATS_COMM "_");
    struct dirent *de;
    int last = 0;
    DIR *d;

    d = opendir(st->run_dir);
    if (!d)
        return 0;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);

        if (len > prefix + 6 && strncmp(de->d_name, NATS_COMM "_", prefix) == 0 &&
            strcmp(de->d_name + len - 6, ".ports") == 0) {
            char *path = sp_xasprintf("%s/%s", st->run_dir, de->d_name);
            int port = read_ports_file(path);
            if (port > 0)
                last = port;
            free(path);
            unlinkat(dirfd(d), de->d_name, 0);
        }
    }
    closedir(d);
    return last;
}

/* Whether nothing listens on host:port now (a bind succeeds). */
static bool port_free(const char *host, int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        return false;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* "Any free port" (SPACE_NATS_PORT=0): one below the kernel's ephemeral range, free now.
 * Not one the kernel picks: that is in the ephemeral range, and while the server is down
 * (killed, restarting on the same port) any outgoing connection may be given it as its local
 * port, among them the daemons' own reconnection attempts, which then connect to themselves
 * (TCP self-connect) and keep the port: the server came back elsewhere, and every daemon had
 * to be restarted (seen in integration.worker_crash). -1 when none is found (the server then
 * picks). */
static int pick_port(const char *host)
{
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) /* NOLINT(cert-err34-c): kernel-written */
            lo = 32768;
        fclose(f);
    }
    int first = 20000, last = lo - 1; /* above the fixed ports of tests and examples (15xxx) */
    if (last - first < 1000)
        return -1;
    static unsigned seed; /* kept: several ports picked within one millisecond differ */
    if (!seed)
        seed = ((unsigned)getpid() ^ (unsigned)sp_proc_now_ms()) | 1u;
    for (int tries = 0; tries < 200; tries++) {
        int port = first + (int)(rand_r(&seed) % (unsigned)(last - first + 1));
        if (port_free(host, port))
            return port;
    }
    return -1;
}

/* One nats-server of the stack. With one node (the default) the files are those of the
 * single server (nats/nats.conf, nats/ as the store, log/nats.log, run/nats-server.pid);
 * node i of a cluster (SPACE_NATS_NODES > 1) has nats/n<i>/ (its nats.conf and store),
 * log/nats-<i>.log and run/nats-server-<i>.pid. */
typedef struct {
    int index; /* 1..nodes */
    bool cluster;
    char *dir, *conf, *log, *pidfile, *name;
} node_t;

/* A cluster's ports, chosen at its first start and kept in nats/cluster.ports, so that a
 * node restarted after a crash listens where the others route to and the daemons reconnect
 * to; and the password of its route connections (nats/cluster.secret, mode 0600): a process
 * that reaches a route port without it is refused, or it could inject messages as a server. */
typedef struct {
    int client[SP_NATS_NODES_MAX + 1], route[SP_NATS_NODES_MAX + 1], http[SP_NATS_NODES_MAX + 1];
    char secret[65];
} cluster_t;

static int n_nodes(const sp_stack_t *st)
{
    return st->cfg->nats_nodes > 1 ? (int)st->cfg->nats_nodes : 1;
}

static void node_init(const sp_stack_t *st, int i, node_t *n)
{
    n->index = i;
    n->cluster = n_nodes(st) > 1;
    if (!n->cluster) {
        n->dir = sp__stack_path(st, "nats");
        n->conf = sp__stack_path(st, "nats/nats.conf");
        n->log = sp__stack_path(st, "log/nats.log");
        n->pidfile = sp__stack_path(st, "run/nats-server.pid");
        n->name = sp_xstrdup(NATS_COMM);
        return;
    }
    n->dir = sp_xasprintf("%s/nats/n%d", st->home, i);
    n->conf = sp_xasprintf("%s/nats/n%d/nats.conf", st->home, i);
    n->log = sp_xasprintf("%s/nats-%d.log", st->log_dir, i);
    n->pidfile = sp_xasprintf("%s/%s-%d.pid", st->run_dir, NATS_COMM, i);
    n->name = sp_xasprintf("%s-%d", NATS_COMM, i);
}

static void node_dispose(node_t *n)
{
    free(n->dir);
    free(n->conf);
    free(n->log);
    free(n->pidfile);
    free(n->name);
}

/* Reads nats/cluster.ports and nats/cluster.secret, or (first start) picks and writes them.
 * A configured SPACE_NATS_PORT is node 1's client port, the next ones the others'. */
static int cluster_load(const sp_stack_t *st, bool create, cluster_t *c)
{
    char *ports = sp__stack_path(st, "nats/cluster.ports");
    char *secret = sp__stack_path(st, "nats/cluster.secret");
    int nodes = n_nodes(st), r = -1;
    FILE *f;

    memset(c, 0, sizeof(*c));
    if ((f = fopen(ports, "re"))) {
        int i, a, b, h;
        /* NOLINTNEXTLINE(cert-err34-c): a file this program wrote, each number range-checked */
        while (fscanf(f, "%d %d %d %d", &i, &a, &b, &h) == 4)
            if (i >= 1 && i <= SP_NATS_NODES_MAX && a > 0 && a < 65536 && b > 0 && b < 65536 &&
                h > 0 && h < 65536)
                c->client[i] = a, c->route[i] = b, c->http[i] = h;
        fclose(f);
    }
    if ((f = fopen(secret, "re"))) {
        if (!fgets(c->secret, sizeof(c->secret), f))
            c->secret[0] = '\0';
        c->secret[strcspn(c->secret, "\n")] = '\0';
        fclose(f);
    }
    bool complete = strlen(c->secret) == 64;
    for (int i = 1; i <= nodes; i++)
        complete = complete && c->client[i] > 0;
    if (complete) {
        r = 0;
        goto out;
    }
    if (!create) {
        r = 1;
        goto out;
    }
    /* First start (or more nodes than before): pick what is missing, all distinct. */
    for (int i = 1; i <= nodes; i++) {
        if (c->client[i] > 0)
            continue;
        int *slots[3] = {&c->client[i], &c->route[i], &c->http[i]};
        for (int k = 0; k < 3; k++) {
            int port = -1;
            for (int tries = 0; tries < 50 && port < 0; tries++) {
                port = k == 0 && st->cfg->nats_port > 0 ? (int)st->cfg->nats_port + i - 1
                                                        : pick_port(st->cfg->nats_host);
                for (int j = 1; j <= nodes && port > 0; j++)
                    if ((j != i || k > 0) &&
                        (c->client[j] == port || c->route[j] == port || c->http[j] == port))
                        port = -1;
            }
            if (port < 0) {
                fprintf(stderr, "space: no free port for nats-server node %d\n", i);
                goto out;
            }
            *slots[k] = port;
        }
    }
    if (strlen(c->secret) != 64) {
        uint8_t raw[32];
        sp_random_bytes(raw, sizeof(raw));
        for (size_t i = 0; i < sizeof(raw); i++)
            snprintf(c->secret + 2 * i, 3, "%02x", raw[i]);
        OPENSSL_cleanse(raw, sizeof(raw));
        int fd = open(secret, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || write(fd, c->secret, 64) != 64 || fsync(fd) < 0) {
            fprintf(stderr, "space: cannot write %s: %s\n", secret, strerror(errno));
            if (fd >= 0)
                close(fd);
            goto out;
        }
        close(fd);
    }
    if (!(f = fopen(ports, "we"))) {
        fprintf(stderr, "space: cannot write %s: %s\n", ports, strerror(errno));
        goto out;
    }
    for (int i = 1; i <= SP_NATS_NODES_MAX; i++)
        if (c->client[i] > 0)
            fprintf(f, "%d %d %d %d\n", i, c->client[i], c->route[i], c->http[i]);
    if (ferror(f) | (fclose(f) != 0)) {
        fprintf(stderr, "space: cannot write %s\n", ports);
        goto out;
    }
    r = 0;
out:
    free(ports);
    free(secret);
    return r;
}

/* Whether prog takes `sync_interval: "always"` (nats-server 2.10 and later; Debian 12's
 * 2.9.10 refuses the field): asked once with `--version`. */
static bool sync_always_supported(const sp_stack_t *st, const char *prog)
{
    static int known = -1;
    if (known >= 0 || !prog)
        return known == 1;
    char *out = sp_xasprintf("%s/nats-server.version", st->run_dir);
    char *argv[] = {NATS_COMM, "--version", NULL};
    sp_proc_spec_t spec = {.path = prog, .argv = argv, .log_path = out};
    char buf[128] = "";
    pid_t pid;
    int status, major = 0, minor = 0;
    unlink(out);
    if (sp_proc_spawn(&spec, &pid) == 0 && sp_proc_wait_exit(pid, 5000, &status) == 0) {
        FILE *f = fopen(out, "re");
        if (f) {
            if (!fgets(buf, sizeof(buf), f))
                buf[0] = '\0';
            fclose(f);
        }
    }
    unlink(out);
    free(out);
    const char *v = strstr(buf, " v");
    /* NOLINTNEXTLINE(cert-err34-c): two small numbers, anything else reads as too old */
    known = v && sscanf(v + 2, "%d.%d", &major, &minor) == 2 &&
            (major > 2 || (major == 2 && minor >= 10));
    return known == 1;
}

/* Writes a node's nats.conf. port: the configured one (-1: any free port) at start; the one
 * it listens on for a reload, which cannot move a listener. The authorization block holds
 * every identity with credentials in $SPACE_HOME/creds (space_identity.c): no user is
 * anonymous, so an anonymous connection is refused. */
static int write_config(const sp_stack_t *st, const node_t *n, const cluster_t *c, int port,
                        bool sync_always)
{
    char *tmp = sp_xasprintf("%s.tmp", n->conf);
    char *creds = sp__identity_dir(st->home);
    const char *host = st->cfg->nats_host;
    sp_buf_t auth;
    FILE *f;
    int r = 0;

    sp_buf_init(&auth);
    if ((r = sp__identity_conf(creds, &auth)) < 0)
        goto out;
    f = fopen(tmp, "we");
    if (!f) {
        r = -errno;
        goto out;
    }
    /* Paths and host were checked for quotes and control bytes (space_stack.c). */
    fprintf(f,
            "# Generated by `space up` on every start: edits are lost.\n"
            "host: \"%s\"\n"
            "port: %d\n"
            "max_payload: 1MB\n"
            "log_file: \"%s\"\n"
            "ports_file_dir: \"%s\"\n",
            host, port, n->log, st->run_dir);
    if (n->cluster) {
        /* The monitoring port (loopback only: it lists connections) tells `space status`
         * which node leads. */
        fprintf(f,
                "server_name: \"n%d\"\n"
                "http: \"%s:%d\"\n"
                "cluster {\n"
                "  name: \"space\"\n"
                "  host: \"%s\"\n"
                "  port: %d\n"
                "  authorization { user: \"route\", password: \"%s\" }\n"
                "  routes: [\n",
                n->index, connect_host(st->cfg), c->http[n->index], host, c->route[n->index],
                c->secret);
        for (int j = 1; j <= n_nodes(st); j++)
            if (j != n->index)
                fprintf(f, "    \"nats-route://route:%s@%s:%d\"\n", c->secret,
                        connect_host(st->cfg), c->route[j]);
        fputs("  ]\n}\n", f);
    }
    fprintf(f, "jetstream {\n  store_dir: \"%s\"\n", n->dir);
    if (sync_always) /* docs/operations.md, Durability */
        fputs("  sync_interval: \"always\"\n", f);
    fputs("}\n", f);
    fputs(auth.data, f);
    if (ferror(f) | (fclose(f) != 0)) {
        r = -EIO;
        unlink(tmp);
        goto out;
    }
    if (chmod(tmp, 0600) < 0 || rename(tmp, n->conf) < 0) { /* it holds the route password */
        r = -errno;
        unlink(tmp);
    }
out:
    sp_buf_dispose(&auth);
    free(creds);
    free(tmp);
    return r;
}

static int configured_port(const sp_stack_t *st)
{
    return st->cfg->nats_port == 0 ? -1 : (int)st->cfg->nats_port;
}

/* Waits until nats-server has written its ports file and accepts a TCP connection. child is
 * true when this process started it (then its exit is noticed at once). Returns the port, or
 * -1 after printing why. */
static int wait_ready(const sp_stack_t *st, const node_t *n, pid_t pid, bool child)
{
    long long deadline = sp_proc_now_ms() + NATS_START_TIMEOUT_MS;
    char *ports = ports_file(st, pid);
    int port = 0, status, r = -1;

    for (;;) {
        if (child ? sp_proc_reap(pid, &status) == 1 : !sp_proc_alive(pid, NATS_COMM)) {
            sp__stack_fail_log("nats-server exited during startup", n->log);
            goto out;
        }
        if (port <= 0) {
            port = read_ports_file(ports);
            if (port < 0) {
                fprintf(stderr, "space: cannot read %s: %s\n", ports, strerror(-port));
                goto out;
            }
        }
        if (port > 0 && sp_proc_tcp_probe(connect_host(st->cfg), port) == 0) {
            r = port;
            goto out;
        }
        if (sp_proc_now_ms() >= deadline) {
            char msg[256];

            snprintf(msg, sizeof(msg),
                     "nats-server (pid %d) did not accept connections within %d s", (int)pid,
                     NATS_START_TIMEOUT_MS / 1000);
            sp__stack_fail_log(msg, n->log);
            goto out;
        }
        sp_proc_sleep_ms(10);
    }
out:
    free(ports);
    return r;
}

static int find_running(const node_t *n, pid_t *ret_pid)
{
    return sp_proc_pidfile_check(n->pidfile, NATS_COMM, ret_pid);
}

/* The port a single server listens on when started: the configured one, else (a server of
 * this home ran before, crashed or was killed) its port again when free, so the daemons,
 * which reconnect forever, find it without being restarted; else a free one. */
static int single_port(const sp_stack_t *st)
{
    int want = configured_port(st), before = remove_stale_ports_files(st);
    bool again = false; /* the killed server's sockets may take a moment to go */
    for (int i = 0; want < 0 && before > 0 && i < 40 && !again; i++) {
        again = port_free(st->cfg->nats_host, before);
        if (!again)
            nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    if (again)
        return before;
    return want < 0 ? pick_port(st->cfg->nats_host) : want;
}

/* Starts node n (not running) or has it reload its nats.conf (running); *ret_port is the
 * port it listens on, *ret_started whether it was started. */
static int node_up(const sp_stack_t *st, const node_t *n, const cluster_t *c, const char *prog,
                   pid_t *ret_pid, int *ret_port, bool *ret_started)
{
    bool sync_always = sync_always_supported(st, prog);
    pid_t pid;
    int e, port;

    *ret_started = false;
    if (find_running(n, &pid) == 1) {
        if ((port = wait_ready(st, n, pid, false)) < 0)
            return -1;
        /* Identities made since it started (space identity add, a new SPACE_ID) join. */
        if ((e = write_config(st, n, c, port, sync_always)) < 0) {
            fprintf(stderr, "space: cannot write %s: %s\n", n->conf, strerror(-e));
            return -1;
        }
        if (kill(pid, SIGHUP) < 0) {
            fprintf(stderr, "space: cannot reload %s (pid %d): %s\n", n->name, (int)pid,
                    strerror(errno));
            return -1;
        }
    } else {
        char *argv[] = {NATS_COMM, "-c", n->conf, NULL};
        sp_proc_spec_t spec = {
            .path = prog, .argv = argv, .cwd = n->dir, .log_path = n->log, .detach = true};
        int want = n->cluster ? c->client[n->index] : single_port(st);
        if ((e = sp__stack_mkdir(n->dir, 0750)) < 0 ||
            (e = write_config(st, n, c, want, sync_always)) < 0) {
            fprintf(stderr, "space: cannot write %s: %s\n", n->conf, strerror(-e));
            return -1;
        }
        if ((e = sp_proc_spawn(&spec, &pid)) < 0) {
            fprintf(stderr, "space: cannot start %s: %s\n", prog, strerror(-e));
            return -1;
        }
        /* Fails only when the server died at once, which wait_ready reports with its log. */
        (void)sp_proc_pidfile_write(n->pidfile, pid);
        if ((port = wait_ready(st, n, pid, true)) < 0) {
            sp_proc_stop(pid, NATS_COMM, SIGTERM, 2000);
            unlink(n->pidfile);
            return -1;
        }
        *ret_started = true;
    }
    *ret_pid = pid;
    *ret_port = port;
    return 0;
}

/* GET path of a node's monitoring port into a parsed document; NULL when it does not answer. */
static sp_json_doc_t *monitor_get(const sp_stack_t *st, const cluster_t *c, int i, const char *path)
{
    sp_httpc_req_t req = {.host = connect_host(st->cfg),
                          .port = c->http[i],
                          .method = "GET",
                          .path = path,
                          .timeout_ms = 2000,
                          .max_response = 4 << 20};
    sp_httpc_resp_t resp = {0};
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    sp_json_limits_t lim = {.max_bytes = 4 << 20};

    if (sp_httpc_do(&req, &resp) == 0 && resp.status == 200 &&
        sp_json_parse(resp.body, resp.body_len, &lim, &doc, err) < 0)
        doc = NULL;
    sp_httpc_resp_free(&resp);
    return doc;
}

/* The JetStream meta leader as node i sees it ("n2"), into out; empty when none. */
static void meta_leader(const sp_stack_t *st, const cluster_t *c, int i, char *out, size_t len)
{
    sp_json_doc_t *doc = monitor_get(st, c, i, "/jsz");
    const char *l =
        doc ? sp_json_str(sp_json_get(sp_json_get(sp_json_root(doc), "meta_cluster"), "leader"),
                          NULL)
            : NULL;
    snprintf(out, len, "%s", l ? l : "");
    sp_json_doc_free(doc);
}

/* Where SP_BUS_STREAM's leader is, as node i sees it, into out; empty when unknown. */
static void stream_leader(const sp_stack_t *st, const cluster_t *c, int i, char *out, size_t len)
{
    sp_json_doc_t *doc = monitor_get(st, c, i, "/jsz?streams=true");
    const sp_json_t *accs = doc ? sp_json_get(sp_json_root(doc), "account_details") : NULL;
    out[0] = '\0';
    for (size_t a = 0; a < sp_json_len(accs); a++) {
        const sp_json_t *streams = sp_json_get(sp_json_at(accs, a), "stream_detail");
        for (size_t k = 0; k < sp_json_len(streams); k++) {
            const sp_json_t *sd = sp_json_at(streams, k);
            const char *name = sp_json_str(sp_json_get(sd, "name"), NULL);
            const char *l = sp_json_str(sp_json_get(sp_json_get(sd, "cluster"), "leader"), NULL);
            if (name && l && strcmp(name, SP_BUS_STREAM) == 0)
                snprintf(out, len, "%s", l);
        }
    }
    sp_json_doc_free(doc);
}

/* A cluster's JetStream answers only once its nodes have elected a meta leader. */
static int wait_meta_leader(const sp_stack_t *st, const cluster_t *c)
{
    long long deadline = sp_proc_now_ms() + NATS_START_TIMEOUT_MS;
    char leader[64];
    for (;;) {
        for (int i = 1; i <= n_nodes(st); i++) {
            meta_leader(st, c, i, leader, sizeof(leader));
            if (leader[0])
                return 0;
        }
        if (sp_proc_now_ms() >= deadline) {
            fprintf(stderr, "space: the nats-server cluster elected no JetStream leader in %d s\n",
                    NATS_START_TIMEOUT_MS / 1000);
            return -1;
        }
        sp_proc_sleep_ms(100);
    }
}

/* The client URLs of the nodes, comma-separated (the form SPACE_NATS_URL and lib/bus.c take). */
static char *urls_of(const sp_stack_t *st, const int *ports, int n)
{
    sp_buf_t b;
    sp_buf_init(&b);
    for (int i = 1; i <= n; i++) {
        if (ports[i] <= 0)
            continue;
        char *u = nats_url(st->cfg, ports[i]);
        if (b.len)
            sp_buf_append(&b, ",", 1);
        sp_buf_append(&b, u, strlen(u));
        free(u);
    }
    char *r = b.len ? sp_xstrdup(b.data) : NULL;
    sp_buf_dispose(&b);
    return r;
}

int sp__nats_up(const sp_stack_t *st, sp_stack_part_t *ret_part)
{
    sp_stack_part_t part = {0};
    int nodes = n_nodes(st), ports[SP_NATS_NODES_MAX + 1] = {0}, r = -1;
    cluster_t c = {0};
    char *prog = find_program(st->cfg->nats_server);

    if (!prog) {
        fprintf(stderr,
                "space: %s not found (PATH, /usr/sbin); install the Debian package "
                "'nats-server' or set SPACE_NATS_SERVER\n",
                st->cfg->nats_server);
        goto out;
    }
    if (nodes > 1) {
        char *dir = sp__stack_path(st, "nats"), *single = sp__stack_path(st, "nats/nats.conf");
        int e = sp__stack_mkdir(dir, 0750);
        bool was_single = access(single, F_OK) == 0;
        free(dir);
        free(single);
        if (was_single) {
            fprintf(stderr,
                    "space: %s ran one nats-server: a cluster needs a new home (space down "
                    "--purge, or another SPACE_HOME)\n",
                    st->home);
            goto out;
        }
        if (e < 0 || cluster_load(st, true, &c) != 0)
            goto out;
    }
    for (int i = 1; i <= nodes; i++) {
        node_t n;
        pid_t pid;
        bool started;
        node_init(st, i, &n);
        int e = node_up(st, &n, &c, prog, &pid, &ports[i], &started);
        if (e == 0) {
            sp_stack_part_t line = {.pid = pid, .url = nats_url(st->cfg, ports[i])};
            sp__stack_report(n.name, started ? "started" : "running", &line);
            sp__stack_part_dispose(&line);
            part.started = part.started || started;
            if (i == 1)
                part.pid = pid, part.port = ports[i];
        }
        node_dispose(&n);
        if (e < 0)
            goto out;
    }
    if (nodes > 1 && wait_meta_leader(st, &c) < 0)
        goto out;
    part.url = urls_of(st, ports, nodes);
    *ret_part = part;
    r = 0;
out:
    OPENSSL_cleanse(c.secret, sizeof(c.secret));
    free(prog);
    return r;
}

int sp__nats_reload(const sp_stack_t *st)
{
    int nodes = n_nodes(st), r = 1, e;
    cluster_t c = {0};
    char *prog = find_program(st->cfg->nats_server);
    bool sync_always = sync_always_supported(st, prog);
    free(prog);

    if (nodes > 1 && cluster_load(st, false, &c) != 0)
        return 1;
    for (int i = 1; i <= nodes; i++) {
        node_t n;
        pid_t pid;
        node_init(st, i, &n);
        char *ports = NULL;
        int port = 0;
        if (find_running(&n, &pid) == 1) {
            ports = ports_file(st, pid);
            port = read_ports_file(ports);
        }
        if (port > 0) {
            if ((e = write_config(st, &n, &c, port, sync_always)) < 0) {
                fprintf(stderr, "space: cannot write %s: %s\n", n.conf, strerror(-e));
                r = -1;
            } else if (kill(pid, SIGHUP) < 0) {
                fprintf(stderr, "space: cannot reload %s (pid %d): %s\n", n.name, (int)pid,
                        strerror(errno));
                r = -1;
            } else {
                printf("%-*s reloaded pid %d (nats.conf has every identity of %s/creds)\n",
                       SP_STACK_PART_WIDTH, n.name, (int)pid, st->home);
                if (r == 1)
                    r = 0;
            }
        }
        free(ports);
        node_dispose(&n);
    }
    OPENSSL_cleanse(c.secret, sizeof(c.secret));
    return r;
}

/* The running nodes: pid and port of each (0: not running). */
static void probe_nodes(const sp_stack_t *st, pid_t *pids, int *ports)
{
    for (int i = 1; i <= n_nodes(st); i++) {
        node_t n;
        node_init(st, i, &n);
        pids[i] = 0;
        ports[i] = 0;
        if (find_running(&n, &pids[i]) == 1) {
            char *pf = ports_file(st, pids[i]);
            int port = read_ports_file(pf);
            ports[i] = port > 0 ? port : 0;
            free(pf);
        } else {
            pids[i] = 0;
        }
        node_dispose(&n);
    }
}

void sp__nats_probe(const sp_stack_t *st, sp_stack_part_t *ret_part)
{
    sp_stack_part_t part = {0};
    pid_t pids[SP_NATS_NODES_MAX + 1];
    int ports[SP_NATS_NODES_MAX + 1];

    probe_nodes(st, pids, ports);
    for (int i = n_nodes(st); i >= 1; i--)
        if (pids[i] && ports[i])
            part.pid = pids[i], part.port = ports[i];
    part.url = urls_of(st, ports, n_nodes(st));
    *ret_part = part;
}

bool sp__nats_status(const sp_stack_t *st, bool exists)
{
    pid_t pids[SP_NATS_NODES_MAX + 1] = {0};
    int ports[SP_NATS_NODES_MAX + 1] = {0}, nodes = n_nodes(st);
    cluster_t c = {0};
    bool all = true;

    if (exists)
        probe_nodes(st, pids, ports);
    bool cluster = exists && nodes > 1 && cluster_load(st, false, &c) == 0;
    for (int i = 1; i <= nodes; i++) {
        node_t n;
        node_init(st, i, &n);
        sp_stack_part_t line = {.pid = pids[i],
                                .url = ports[i] ? nats_url(st->cfg, ports[i]) : NULL};
        char meta[64] = "", stream[64] = "", me[16];
        if (cluster && pids[i]) {
            meta_leader(st, &c, i, meta, sizeof(meta));
            stream_leader(st, &c, i, stream, sizeof(stream));
        }
        snprintf(me, sizeof(me), "n%d", i);
        if (cluster && pids[i] && line.url) {
            printf("%-*s %-8s pid %-7d %s  %s%s%s\n", SP_STACK_PART_WIDTH, n.name, "running",
                   (int)pids[i], line.url, me, strcmp(meta, me) == 0 ? ", JetStream leader" : "",
                   strcmp(stream, me) == 0 ? ", " SP_BUS_STREAM " leader" : "");
            fflush(stdout);
        } else {
            sp__stack_report(n.name, pids[i] ? "running" : "stopped", &line);
        }
        all = all && pids[i];
        sp__stack_part_dispose(&line);
        node_dispose(&n);
    }
    OPENSSL_cleanse(c.secret, sizeof(c.secret));
    return all;
}

int sp__nats_down(const sp_stack_t *st)
{
    int r = 0, s;
    pid_t pid;

    for (int i = n_nodes(st); i >= 1; i--) {
        node_t n;
        node_init(st, i, &n);
        if (find_running(&n, &pid) == 1) {
            s = sp_proc_stop(pid, NATS_COMM, SIGTERM, NATS_STOP_TIMEOUT_MS);
            if (s < 0) {
                fprintf(stderr, "space: cannot stop %s (pid %d): %s\n", n.name, (int)pid,
                        strerror(-s));
                r = -1;
                node_dispose(&n);
                continue;
            }
            printf("%-*s stopped  pid %d%s\n", SP_STACK_PART_WIDTH, n.name, (int)pid,
                   s == 1 ? " (killed after 10 s)" : "");
        }
        unlink(n.pidfile);
        node_dispose(&n);
    }
    if (r == 0)
        remove_stale_ports_files(st);
    return r;
}
