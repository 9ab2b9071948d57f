/* The gVisor driver: the OCI bundle, runsc calls, and the cgroup directories runsc leaves.
 *
 * Every runsc call has a timeout (WK_RUNSC_TIMEOUT_MS) and never shares the worker's stdio:
 * `runsc create` hands its own stdin/stdout/stderr to the container's init (runtime-notes.md),
 * so create gets the two pipes of the agent channel as stdin and stdout (or /dev/null when
 * there is no agent) and a capture pipe for stderr, which the worker closes once create has
 * exited. A guest that writes to /proc/1/fd/2 later gets EPIPE, and nothing of the guest
 * reaches a host file; what it writes to /proc/1/fd/1 reaches the agent channel, which
 * trusts none of it (worker_agent.c).
 */
#include <dirent.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "error.h"
#include "ids.h"
#include "json.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

#define ERR_CAPTURE  4096
#define LIST_CAPTURE (4u << 20)
#define CPU_PERIOD   100000

/* The capability set container engines give root in a container (Docker's default set);
 * runsc spec's three are not enough for `cp -a` (runtime-notes.md). */
static const char *const CAPS[] = {
    "CAP_CHOWN",   "CAP_DAC_OVERRIDE", "CAP_FOWNER",  "CAP_FSETID",      "CAP_KILL",
    "CAP_SETGID",  "CAP_SETUID",       "CAP_SETPCAP", "CAP_SETFCAP",     "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW", "CAP_SYS_CHROOT",   "CAP_MKNOD",   "CAP_AUDIT_WRITE",
};

/* The init when the host has no agent (wk_host_config_t.agent_path NULL). `sleep & wait` so
 * SIGTERM ends it at once instead of after the sleep. */
static const char *const INIT_ARGS[] = {
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done",
};

static void json_strv(sp_buf_t *b, const char *const *v, size_t n)
{
    sp_buf_putc(b, '[');
    for (size_t i = 0; i < n; i++) {
        if (i)
            sp_buf_putc(b, ',');
        sp_buf_json_str(b, v[i]);
    }
    sp_buf_putc(b, ']');
}

int wk__runsc_write_config(const wk_host_t *h, const wk__bundle_t *bd, const char *bundle_dir,
                           char err[WK_ERR_MAX])
{
    uint32_t vcpu = bd->vcpu ? bd->vcpu : 1;
    uint32_t mem_mb = bd->memory_mb ? bd->memory_mb : 512;
    size_t ncaps = sizeof(CAPS) / sizeof(CAPS[0]);
    sp_buf_t b;
    sp_buf_init(&b);

    sp_buf_puts(&b, "{\"ociVersion\":\"1.0.2\",\"process\":{\"terminal\":false,"
                    "\"user\":{\"uid\":0,\"gid\":0},\"args\":");
    if (bd->init)
        json_strv(&b, &bd->init, 1);
    else
        json_strv(&b, INIT_ARGS, sizeof(INIT_ARGS) / sizeof(INIT_ARGS[0]));
    sp_buf_puts(&b, ",\"env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:"
                    "/bin\",\"HOME=/root\"");
    if (h->ca_pem) {
        /* The deployment CA (worker_trust.c) for the init's environment. */
        for (size_t i = 0; i < WK_TRUST_ENV_N; i++) {
            sp_buf_putc(&b, ',');
            sp_buf_json_str(&b, wk__trust_env[i]);
        }
    }
    /* The agent also has CAP_SYS_ADMIN, for the hostname it is given at a pool claim or after
     * a copy's restore; it keeps it to itself (proto/agent.proto, Claim). */
    const char *caps[sizeof(CAPS) / sizeof(CAPS[0]) + 1];
    memcpy(caps, CAPS, sizeof(CAPS));
    if (bd->claimable)
        caps[ncaps++] = "CAP_SYS_ADMIN";
    sp_buf_puts(&b, "],\"cwd\":\"/\",\"capabilities\":{\"bounding\":");
    json_strv(&b, caps, ncaps);
    sp_buf_puts(&b, ",\"effective\":");
    json_strv(&b, caps, ncaps);
    sp_buf_puts(&b, ",\"permitted\":");
    json_strv(&b, caps, ncaps);
    /* Processes: RLIMIT_NPROC, counted per uid by gVisor's kernel, so a fork bomb gets EAGAIN
     * inside. Not the host's pids cgroup: it counts the Sentry's and the ptrace stubs' host
     * threads (~10 per guest process here), and a Sentry that cannot make a thread dies with
     * the whole sandbox (docs/machine-notes.md). Root in the guest lacks CAP_SYS_RESOURCE, so
     * it cannot raise the limit. */
    uint32_t pids = bd->pids ? bd->pids : WK_PIDS_DEFAULT;
    sp_buf_printf(&b,
                  "},\"rlimits\":[{\"type\":\"RLIMIT_NOFILE\",\"hard\":65536,\"soft\":65536},"
                  "{\"type\":\"RLIMIT_NPROC\",\"hard\":%u,\"soft\":%u}]},"
                  "\"root\":{\"path\":",
                  pids, pids);
    sp_buf_json_str(&b, bd->rootfs);
    sp_buf_puts(&b, ",\"readonly\":false},\"hostname\":");
    sp_buf_json_str(&b, bd->hostname ? bd->hostname : bd->id);
    sp_buf_puts(&b, ",\"mounts\":["
                    "{\"destination\":\"/proc\",\"type\":\"proc\",\"source\":\"proc\"},"
                    "{\"destination\":\"/dev\",\"type\":\"tmpfs\",\"source\":\"tmpfs\"},"
                    "{\"destination\":\"/sys\",\"type\":\"sysfs\",\"source\":\"sysfs\","
                    "\"options\":[\"nosuid\",\"noexec\",\"nodev\",\"ro\"]}");
    if (bd->chan_dir) {
        /* Read-only: the sandbox can connect to the worker's socket there (--host-uds=open),
         * not create files on the host. */
        sp_buf_puts(&b, ",{\"destination\":\"/.space/chan\",\"type\":\"bind\",\"source\":");
        sp_buf_json_str(&b, bd->chan_dir);
        sp_buf_puts(&b, ",\"options\":[\"rbind\",\"ro\",\"nosuid\",\"nodev\",\"noexec\"]}");
    }
    sp_buf_puts(&b, "],"
                    "\"linux\":{\"namespaces\":[{\"type\":\"pid\"},{\"type\":\"network\","
                    "\"path\":");
    sp_buf_json_str(&b, bd->netns_path);
    sp_buf_puts(&b, "},{\"type\":\"ipc\"},{\"type\":\"uts\"},{\"type\":\"mount\"}],"
                    "\"cgroupsPath\":");
    char cg[128];
    snprintf(cg, sizeof(cg), "/space-%s/%s", h->tag, bd->id);
    sp_buf_json_str(&b, cg);
    sp_buf_printf(&b, ",\"resources\":{\"memory\":{\"limit\":%llu}",
                  (unsigned long long)mem_mb << 20);
    if (!bd->cpu_unlimited)
        sp_buf_printf(&b, ",\"cpu\":{\"quota\":%llu,\"period\":%u}",
                      (unsigned long long)vcpu * CPU_PERIOD, CPU_PERIOD);
    sp_buf_puts(&b, "}}}\n");

    int rc = 0;
    char *path = sp_xasprintf("%s/config.json", bundle_dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = wk__fail(err, -errno, "create %s: %s", path, strerror(errno));
        goto out;
    }
    size_t off = 0;
    while (off < b.len) {
        ssize_t n = write(fd, b.data + off, b.len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = wk__fail(err, -errno, "write %s: %s", path, strerror(errno));
            break;
        }
        off += (size_t)n;
    }
    if (close(fd) < 0 && rc == 0)
        rc = wk__fail(err, -errno, "close %s: %s", path, strerror(errno));
out:
    free(path);
    sp_buf_dispose(&b);
    return rc;
}

enum {
    CALL_NET = 1 << 0,    /* --network=sandbox --platform=..., for create and start */
    CALL_WRAP = 1 << 1,   /* in the netns wrapper (wk__cmd_t.netns_wrapper) */
    CALL_REAPER = 1 << 2, /* under a reaper (wk__cmd_t.reaper): the call leaves a sandbox */
};

/* The duration of a runsc call into the histogram, by its verb (a fixed list). */
static void observe(const wk_host_t *h, const char *verb, int64_t t0_ns)
{
    static const char *const ops[] = {"create", "start", "pause", "resume", "checkpoint", "restore",
                                      "delete", "exec",  "list",  "kill",   "state"};
    if (!h->runsc_seconds)
        return;
    const char *op = "other";
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
        if (strcmp(verb, ops[i]) == 0)
            op = ops[i];
    sp_series_observe(sp_metric_series1(h->runsc_seconds, op),
                      (double)(sp_mono_ns() - t0_ns) / 1e9);
}

/* runsc <global flags> <sub...>; stdio (NULL or {stdin, stdout}) for create. */
static int runsc_call(const wk_host_t *h, const char *const *sub, size_t nsub, unsigned flags,
                      const int *stdio, wk_out_mode_t mode, char *out, size_t out_len,
                      int *ret_exit)
{
    char *root = sp_xasprintf("--root=%s", h->runsc_root);
    char *platform = sp_xasprintf("--platform=%s", h->platform);
    const char **argv = sp_xcalloc(nsub + 6, sizeof(*argv));
    size_t n = 0;
    argv[n++] = h->runsc;
    argv[n++] = root;
    if (flags & CALL_NET) {
        argv[n++] = "--network=sandbox";
        argv[n++] = platform;
        argv[n++] = "--host-uds=open"; /* the agent's channel socket (worker_agent.h) */
    }
    for (size_t i = 0; i < nsub; i++)
        argv[n++] = sub[i];
    argv[n] = NULL;
    wk__cmd_t c = {.argv = argv,
                   .timeout_ms = WK_RUNSC_TIMEOUT_MS,
                   .netns_wrapper = (flags & CALL_WRAP) != 0,
                   .reaper = (flags & CALL_REAPER) != 0,
                   .out_mode = mode,
                   .out = out,
                   .out_len = out_len};
    if (stdio) {
        c.pass_stdio = true;
        c.stdin_fd = stdio[0];
        c.stdout_fd = stdio[1];
    }
    int64_t t0 = sp_mono_ns();
    int rc = wk__run(&c, ret_exit);
    observe(h, sub[0], t0);
    free(argv);
    free(platform);
    free(root);
    return rc;
}

/* Turns a failed call into rc and "runsc <what>: <reason>". */
static int call_failed(char *err, int rc, int ex, const char *what, const char *out)
{
    char line[WK_ERR_MAX];
    wk__last_line(out, line, sizeof(line));
    if (rc < 0)
        return wk__fail(err, rc, "runsc %s: %s", what, sp_strerror(rc));
    return wk__fail(err, -EIO, "runsc %s: exit %d: %s", what, ex, line[0] ? line : "no output");
}

int wk__runsc_create(const wk_host_t *h, const char *id, const char *bundle_dir, int stdin_fd,
                     int stdout_fd, char err[WK_ERR_MAX])
{
    char *out = sp_xmalloc(ERR_CAPTURE);
    const char *sub[] = {"create", "--bundle", bundle_dir, id};
    int stdio[2] = {stdin_fd, stdout_fd};
    int ex = 0;
    int rc = runsc_call(h, sub, 4, CALL_NET | CALL_WRAP | CALL_REAPER,
                        stdin_fd >= 0 && stdout_fd >= 0 ? stdio : NULL, WK_OUT_STDERR, out,
                        ERR_CAPTURE, &ex);
    if (rc < 0 || ex != 0)
        rc = call_failed(err, rc, ex, "create", out);
    else if ((rc = wk__cgroup_memory_headroom(h, id)) < 0)
        rc = wk__fail(err, rc, "cannot give the memory cgroup its headroom: %s", sp_strerror(rc));
    free(out);
    return rc;
}

int wk__runsc_start(const wk_host_t *h, const char *id, char err[WK_ERR_MAX])
{
    char *out = sp_xmalloc(ERR_CAPTURE);
    const char *sub[] = {"start", id};
    int ex = 0;
    int rc =
        runsc_call(h, sub, 2, CALL_NET | CALL_WRAP, NULL, WK_OUT_STDERR, out, ERR_CAPTURE, &ex);
    if (rc < 0 || ex != 0)
        rc = call_failed(err, rc, ex, "start", out);
    free(out);
    return rc;
}

/* pause, resume (of a paused container), checkpoint: one verb on a container. */
int wk__runsc_verb(const wk_host_t *h, const char *verb, const char *id, const char *image_dir,
                   char err[WK_ERR_MAX])
{
    char *out = sp_xmalloc(ERR_CAPTURE);
    char *img = image_dir ? sp_xasprintf("--image-path=%s", image_dir) : NULL;
    const char *sub[] = {verb, img ? img : id, id};
    int ex = 0;
    int rc = runsc_call(h, sub, img ? 3 : 2, 0, NULL, WK_OUT_STDERR, out, ERR_CAPTURE, &ex);
    if (rc < 0 || ex != 0)
        rc = call_failed(err, rc, ex, verb, out);
    free(img);
    free(out);
    return rc;
}

int wk__runsc_checkpoint(const wk_host_t *h, const char *id, const char *image_dir,
                         const char *rc_path, char err[WK_ERR_MAX])
{
    char *out = sp_xmalloc(ERR_CAPTURE);
    char *root = sp_xasprintf("--root=%s", h->runsc_root);
    char *img = sp_xasprintf("--image-path=%s", image_dir);
    /* The shell outlives a worker killed meanwhile (nothing here dies with its parent) and
     * writes runsc's exit status where a restarted worker looks (renamed in: whole or absent). */
    const char *argv[] = {"/bin/sh",
                          "-c",
                          "rc=$1; shift; \"$@\"; echo $? > \"$rc.tmp\" && mv \"$rc.tmp\" \"$rc\"",
                          "sh",
                          rc_path,
                          h->runsc,
                          root,
                          "checkpoint",
                          img,
                          id,
                          NULL};
    wk__cmd_t c = {.argv = argv,
                   .timeout_ms = WK_RUNSC_TIMEOUT_MS,
                   .out_mode = WK_OUT_STDERR,
                   .out = out,
                   .out_len = ERR_CAPTURE};
    int64_t t0 = sp_mono_ns();
    int ex = 0, rc = wk__run(&c, &ex);
    observe(h, "checkpoint", t0);
    int status = rc == 0 ? wk__checkpoint_status(rc_path) : rc;
    if (rc < 0 || ex != 0 || status != 0)
        rc = call_failed(err, rc < 0 ? rc : 0, rc == 0 && ex == 0 ? status : ex, "checkpoint", out);
    free(img);
    free(root);
    free(out);
    return rc;
}

int wk__checkpoint_status(const char *rc_path)
{
    FILE *f = fopen(rc_path, "r");
    if (!f)
        return -errno;
    char line[16] = "";
    bool got = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    char *end = NULL;
    long v = got ? strtol(line, &end, 10) : -1;
    if (!got || end == line || (*end && *end != '\n') || v < 0 || v > 255)
        return -EIO;
    return (int)v;
}

static int write_u64(const char *path, uint64_t v)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char buf[32];
    int n = snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    int rc = write(fd, buf, (size_t)n) == n ? 0 : -errno;
    close(fd);
    return rc;
}

/* Whether the host has the cgroup v1 cpu controller, where runsc puts the sandbox's quota
 * (cgroup v2 hosts: the spec's quota, as before). */
static bool cpu_controller(void)
{
    return access(WK_CGROUP_ROOT "/cpu/cpu.cfs_quota_us", W_OK) == 0;
}

/* The sandbox's CPU quota, as the spec would have had runsc set it: vcpu CPUs per period. */
static int cgroup_cpu_quota(const wk_host_t *h, const char *id, uint32_t vcpu)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/cpu/space-%s/%s/cpu.cfs_period_us", WK_CGROUP_ROOT, h->tag,
             id);
    int rc = write_u64(path, CPU_PERIOD);
    if (rc == 0) {
        snprintf(path, sizeof(path), "%s/cpu/space-%s/%s/cpu.cfs_quota_us", WK_CGROUP_ROOT, h->tag,
                 id);
        rc = write_u64(path, (uint64_t)(vcpu ? vcpu : 1) * CPU_PERIOD);
    }
    return rc;
}

int wk__runsc_restore(const wk_host_t *h, const wk__bundle_t *bd, const char *bundle_dir,
                      const char *image_dir, char err[WK_ERR_MAX])
{
    /* Restoring is the Sentry's work on every thread it has; under a 1-CPU quota it took
     * x1.3-1.4 as long. The quota comes once the restore is done (the guest has run for the
     * moment in between), and the config is written again with it, as a create's. */
    wk__bundle_t unlimited = *bd;
    unlimited.cpu_unlimited = cpu_controller();
    int rc = wk__runsc_write_config(h, &unlimited, bundle_dir, err);
    if (rc < 0)
        return rc;
    char *out = sp_xmalloc(ERR_CAPTURE);
    char *img = sp_xasprintf("--image-path=%s", image_dir);
    /* --detach: the sandbox outlives the call (under the reaper, like create); its init's
     * stdio is /dev/null, so the agent finds its channel closed and connects back. */
    const char *sub[] = {"restore", "--detach", img, "--bundle", bundle_dir, bd->id};
    int ex = 0;
    rc = runsc_call(h, sub, 6, CALL_NET | CALL_WRAP | CALL_REAPER, NULL, WK_OUT_STDERR, out,
                    ERR_CAPTURE, &ex);
    if (rc < 0 || ex != 0)
        rc = call_failed(err, rc, ex, "restore", out);
    else if ((rc = wk__cgroup_memory_headroom(h, bd->id)) < 0)
        rc = wk__fail(err, rc, "cannot give the memory cgroup its headroom: %s", sp_strerror(rc));
    else if (unlimited.cpu_unlimited && (rc = cgroup_cpu_quota(h, bd->id, bd->vcpu)) < 0)
        rc = wk__fail(err, rc, "cannot set the sandbox's CPU quota: %s", sp_strerror(rc));
    else if (unlimited.cpu_unlimited)
        rc = wk__runsc_write_config(h, bd, bundle_dir, err);
    free(img);
    free(out);
    return rc;
}

static bool listed(const wk_host_t *h, const char *id, int *ret_rc)
{
    wk_host_sandbox_t *list = NULL;
    size_t n = 0;
    *ret_rc = wk__runsc_list(h, &list, &n);
    bool found = false;
    for (size_t i = 0; i < n && !found; i++)
        found = strcmp(list[i].id, id) == 0;
    free(list);
    return found;
}

/* Whether the NUL-separated cmdline is a runsc call (not the runsc-sandbox or runsc-gofer it
 * leaves) under root on container id. */
static bool call_on(const char *cmd, size_t n, const char *runsc, const char *root_flag,
                    const char *id)
{
    const char *base = strrchr(runsc, '/');
    base = base ? base + 1 : runsc;
    const char *a0 = strrchr(cmd, '/'); /* in argv[0]: strrchr stops at its NUL */
    a0 = a0 ? a0 + 1 : cmd;
    if (strcmp(a0, base) != 0)
        return false;
    bool root = false, named = false;
    for (const char *a = cmd + strlen(cmd) + 1; a < cmd + n; a += strlen(a) + 1) {
        root |= strcmp(a, root_flag) == 0;
        named |= strcmp(a, id) == 0;
    }
    return root && named;
}

/* /proc/<pid>/<name> into buf, NUL-terminated: its length, or <= 0 when it cannot be read
 * (the process is gone). */
static ssize_t proc_file(long pid, const char *name, char *buf, size_t size)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/%s", pid, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n > 0)
        buf[n] = '\0';
    return n;
}

/* Whether pid is gone or a zombie (its reaper, not us, waits for it). */
static bool gone(pid_t pid)
{
    char st[256];
    if (proc_file(pid, "stat", st, sizeof(st)) <= 0)
        return true;
    const char *e = strrchr(st, ')'); /* "pid (comm) S ...": comm may hold anything */
    return !e || e[1] == '\0' || e[2] == 'Z' || e[2] == 'X';
}

int wk__runsc_calls_stop(const wk_host_t *h, const char *id)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -errno;
    char *root_flag = sp_xasprintf("--root=%s", h->runsc_root);
    pid_t pids[32];
    int n = 0;
    struct dirent *de;
    char *cmd = sp_xmalloc(8192);
    while ((de = readdir(d)) && n < (int)(sizeof(pids) / sizeof(pids[0]))) {
        char *end = NULL;
        long pid = strtol(de->d_name, &end, 10);
        if (pid <= 0 || *end || pid == (long)getpid())
            continue;
        ssize_t len = proc_file(pid, "cmdline", cmd, 8192);
        if (len <= 0)
            continue;
        if (call_on(cmd, (size_t)len, h->runsc, root_flag, id) && kill((pid_t)pid, SIGKILL) == 0)
            pids[n++] = (pid_t)pid;
    }
    closedir(d);
    free(cmd);
    free(root_flag);
    /* Killed calls end within a few ms; a call stuck in the kernel for 5 s is reported. */
    for (int waited = 0; waited < 500; waited++) {
        bool all = true;
        for (int i = 0; i < n; i++)
            all &= gone(pids[i]);
        if (all)
            return n;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    return -ETIMEDOUT;
}

/* Whether pid runs one of runsc's processes (runsc-sandbox, runsc-gofer) for bundle under our
 * root, by its command line. */
static bool runsc_proc_of(pid_t pid, const char *root_flag, const char *bundle)
{
    char cmd[8192];
    ssize_t len = proc_file(pid, "cmdline", cmd, sizeof(cmd));
    if (len <= 0)
        return false;
    const char *a0 = strrchr(cmd, '/');
    if (strncmp(a0 ? a0 + 1 : cmd, "runsc", 5) != 0)
        return false;
    size_t bl = strlen(bundle);
    bool root = false, ours = false;
    for (const char *a = cmd + strlen(cmd) + 1; a < cmd + len; a += strlen(a) + 1) {
        root |= strcmp(a, root_flag) == 0;
        ours |= strcmp(a, bundle) == 0 ||
                (strncmp(a, "--bundle=", 9) == 0 && strncmp(a + 9, bundle, bl) == 0 && !a[9 + bl]);
    }
    return root && ours;
}

/* The sandbox's and gofer's pids from runsc's state file of root container id (runsc
 * 2022-12: <root>/<id>_sandbox:<id>.state, {"goferPid":N,"sandbox":{"pid":N}}); 0 where
 * absent. */
static void state_pids(const wk_host_t *h, const char *id, pid_t pids[2])
{
    pids[0] = pids[1] = 0;
    char *path = sp_xasprintf("%s/%s_sandbox:%s.state", h->runsc_root, id, id);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    if (fd < 0)
        return;
    sp_buf_t b;
    sp_buf_init(&b);
    char chunk[4096];
    ssize_t n;
    while (b.len < (1u << 20) && (n = read(fd, chunk, sizeof(chunk))) > 0)
        sp_buf_append(&b, chunk, (size_t)n);
    close(fd);
    sp_json_doc_t *doc = NULL;
    char jerr[SP_JSON_ERR_MAX];
    if (sp_json_parse((const char *)b.data, b.len, NULL, &doc, jerr) == 0) {
        const sp_json_t *root = sp_json_root(doc);
        int64_t v;
        if (sp_json_int(sp_json_get(root, "goferPid"), 2, INT32_MAX, &v) == 0)
            pids[0] = (pid_t)v;
        if (sp_json_int(sp_json_get(sp_json_get(root, "sandbox"), "pid"), 2, INT32_MAX, &v) == 0)
            pids[1] = (pid_t)v;
    }
    sp_json_doc_free(doc);
    sp_buf_dispose(&b);
}

int wk__runsc_procs_end(const wk_host_t *h, const char *id)
{
    pid_t pids[2], killed[2];
    int n = 0;
    state_pids(h, id, pids);
    char *root_flag = sp_xasprintf("--root=%s", h->runsc_root);
    char *bundle = sp_xasprintf("%s/%s", h->bundles_dir, id);
    for (int i = 0; i < 2; i++)
        if (pids[i] > 1 && runsc_proc_of(pids[i], root_flag, bundle) && kill(pids[i], SIGKILL) == 0)
            killed[n++] = pids[i];
    free(root_flag);
    free(bundle);
    /* Gone means reaped (runsc tests with signal 0, which a zombie still takes): the
     * sandbox's reaper does it at once (worker_spawn.c). */
    for (int waited = 0; waited < 200; waited++) {
        bool all = true;
        for (int i = 0; i < n; i++)
            all &= kill(killed[i], 0) < 0 && errno == ESRCH;
        if (all)
            return n;
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    }
    return -ETIMEDOUT;
}

int wk__runsc_delete(const wk_host_t *h, const char *id, char err[WK_ERR_MAX])
{
    char *out = sp_xmalloc(ERR_CAPTURE);
    const char *sub[] = {"delete", "--force", id};
    int ex = 0;
    int rc = runsc_call(h, sub, 3, 0, NULL, WK_OUT_STDERR, out, ERR_CAPTURE, &ex);
    if (rc < 0 || ex != 0) {
        /* "does not exist" is success; anything else only if the container is gone. */
        int lrc = 0;
        if (listed(h, id, &lrc) || lrc < 0)
            rc = call_failed(err, rc, ex, "delete", out);
        else
            rc = 0;
    }
    free(out);
    return rc;
}

int wk__runsc_exec(const wk_host_t *h, const char *id, const char *const *argv, char *out,
                   size_t out_len, int *ret_exit)
{
    size_t n = 0;
    while (argv[n])
        n++;
    const char **sub = sp_xcalloc(n + 2, sizeof(*sub));
    sub[0] = "exec";
    sub[1] = id;
    for (size_t i = 0; i < n; i++)
        sub[2 + i] = argv[i];
    int rc = runsc_call(h, sub, n + 2, 0, NULL, WK_OUT_BOTH, out, out_len, ret_exit);
    free(sub);
    return rc;
}

/* `runsc list --format=json` prints null or an array of OCI state objects
 * ({"ociVersion":..,"id":..,"status":..,"pid":..,"bundle":..}). Ids are ours (sp_id_valid,
 * no escapes), and a quote inside any JSON string is escaped, so "id":" cannot appear inside
 * a value: scanning for the keys is exact for this output. */
static void list_parse(const char *s, wk_host_sandbox_t **list, size_t *n)
{
    static const char KID[] = "\"id\":\"", KST[] = "\"status\":\"";
    size_t cap = 0;
    const char *p = s;
    while ((p = strstr(p, KID))) {
        p += sizeof(KID) - 1;
        const char *e = strchr(p, '"');
        if (!e)
            break;
        const char *next = strstr(e, KID);
        const char *st = strstr(e, KST);
        wk_state_t state = WK_STOPPED;
        if (st && (!next || st < next) && strncmp(st + sizeof(KST) - 1, "running\"", 8) == 0)
            state = WK_RUNNING;
        else if (st && (!next || st < next) && strncmp(st + sizeof(KST) - 1, "paused\"", 7) == 0)
            state = WK_PAUSED;
        size_t len = (size_t)(e - p);
        if (len > 0 && len < sizeof((*list)->id)) {
            wk_host_sandbox_t sb = {.state = state};
            memcpy(sb.id, p, len);
            sb.id[len] = '\0';
            if (sp_id_valid(sb.id)) {
                if (*n == cap) {
                    cap = cap ? cap * 2 : 16;
                    *list = sp_xreallocarray(*list, cap, sizeof(**list));
                }
                (*list)[(*n)++] = sb;
            }
        }
        p = e;
    }
}

int wk__runsc_list(const wk_host_t *h, wk_host_sandbox_t **ret_list, size_t *ret_n)
{
    char *out = sp_xmalloc(LIST_CAPTURE);
    const char *sub[] = {"list", "--format=json"};
    int ex = 0;
    int rc = runsc_call(h, sub, 2, 0, NULL, WK_OUT_STDOUT, out, LIST_CAPTURE, &ex);
    if (rc == 0 && ex != 0)
        rc = -EIO;
    if (rc == 0 && strlen(out) >= LIST_CAPTURE - 1)
        rc = SP_ETOOBIG;
    if (rc == 0) {
        wk_host_sandbox_t *list = NULL;
        size_t n = 0;
        list_parse(out, &list, &n);
        *ret_list = list;
        *ret_n = n;
    }
    free(out);
    return rc;
}

/* ---- cgroups ---- */

static void cgroup_kill(const char *dir)
{
    char *path = sp_xasprintf("%s/cgroup.procs", dir);
    FILE *f = fopen(path, "re");
    free(path);
    if (!f)
        return;
    char line[32];
    while (fgets(line, sizeof(line), f)) {
        char *end = NULL;
        long pid = strtol(line, &end, 10);
        if (end != line && pid > 1 && pid != (long)getpid())
            (void)kill((pid_t)pid, SIGKILL);
    }
    fclose(f);
}

int wk__cgroup_remove(const wk_host_t *h, const char *id)
{
    DIR *d = opendir(WK_CGROUP_ROOT);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char *p = sp_xasprintf("%s/%s/space-%s/%s", WK_CGROUP_ROOT, de->d_name, h->tag, id);
        /* A cgroup with a task still exiting is busy for a moment. One whose tasks outlive
         * runsc delete holds strays (a sandbox a dead worker's create left half made): they
         * are killed, the cgroup being the sandbox's own. */
        int r = 0;
        for (int tries = 0; tries < 100; tries++) {
            r = rmdir(p) == 0 ? 0 : -errno;
            if (r != -EBUSY)
                break;
            if (tries == 25)
                cgroup_kill(p);
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (r < 0 && r != -ENOENT && r != -ENOTDIR && rc == 0)
            rc = r;
        free(p);
    }
    closedir(d);
    return rc;
}

/* Headroom of the host memory cgroup above memory_mb (docs/faults.md, "Memory"): runsc sets the
 * limit from the spec and its Sentry reads it once, at create, as the guest's MemTotal; raised
 * after that, the guest still sees memory_mb while the host kills the Sentry only past it plus
 * this, which leaves the agent's memory guard the time to kill the process that grows. */
static uint64_t memory_headroom(uint64_t limit)
{
    uint64_t h = limit / 4;
    return h < WK_MEMORY_HEADROOM_MIN   ? WK_MEMORY_HEADROOM_MIN
           : h > WK_MEMORY_HEADROOM_MAX ? WK_MEMORY_HEADROOM_MAX
                                        : h;
}

int wk__cgroup_memory_headroom(const wk_host_t *h, const char *id)
{
    char dir[320], path[400];
    snprintf(dir, sizeof(dir), "%s/memory/space-%s/%s", WK_CGROUP_ROOT, h->tag, id);
    snprintf(path, sizeof(path), "%s/memory.limit_in_bytes", dir);
    FILE *f = fopen(path, "re");
    if (!f)
        return errno == ENOENT ? 0 : -errno; /* no memory controller (v2 hosts: not done) */
    char line[64] = "";
    bool got = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    char *end = NULL;
    unsigned long long limit = got ? strtoull(line, &end, 10) : 0;
    if (!got || end == line || limit == 0 || limit >= (1ULL << 60))
        return 0; /* no limit to raise */
    uint64_t raised = limit + memory_headroom(limit);
    /* With swap accounting, memory+swap must stay >= memory: raised first. */
    snprintf(path, sizeof(path), "%s/memory.memsw.limit_in_bytes", dir);
    int rc = write_u64(path, raised);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    snprintf(path, sizeof(path), "%s/memory.limit_in_bytes", dir);
    return write_u64(path, raised);
}

int wk_sandbox_oom_kills(const wk_host_t *h, const char *sandbox)
{
    if (!h || !sp_id_valid(sandbox))
        return 0;
    char id[65];
    wk__host_id(h, sandbox, id);
    /* cgroup v1 (this host): memory.oom_control has "oom_kill N"; v2: memory.events. */
    static const char *const files[][2] = {{"memory", "memory.oom_control"},
                                           {"unified", "memory.events"}};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char path[320];
        snprintf(path, sizeof(path), "%s/%s/space-%s/%s/%s", WK_CGROUP_ROOT, files[i][0], h->tag,
                 id, files[i][1]);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        char line[128];
        long n = 0;
        while (fgets(line, sizeof(line), f)) {
            if (strncmp(line, "oom_kill ", 9) == 0) {
                n = strtol(line + 9, NULL, 10);
                break;
            }
        }
        fclose(f);
        if (n > 0)
            return n > INT32_MAX ? INT32_MAX : (int)n;
    }
    return 0;
}

/* The first number of a cgroup file, or of its line that starts with key (cpu.stat). */
static bool cgroup_number(const wk_host_t *h, const char *controller, const char *id,
                          const char *file, const char *key, uint64_t *ret)
{
    char path[320];
    snprintf(path, sizeof(path), "%s/%s/space-%s/%s/%s", WK_CGROUP_ROOT, controller, h->tag, id,
             file);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    char line[128];
    bool found = false;
    size_t klen = key ? strlen(key) : 0;
    while (!found && fgets(line, sizeof(line), f)) {
        if (key && (strncmp(line, key, klen) != 0 || line[klen] != ' '))
            continue;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(line + (key ? klen + 1 : 0), &end, 10);
        found = errno == 0 && end != line + (key ? klen + 1 : 0);
        if (found)
            *ret = v;
        if (!key)
            break;
    }
    fclose(f);
    return found;
}

int wk_sandbox_usage(const wk_host_t *h, const char *sandbox, wk_sandbox_usage_t *ret)
{
    if (!h || !sp_id_valid(sandbox))
        return -EINVAL;
    char id[65];
    wk__host_id(h, sandbox, id);
    wk_sandbox_usage_t u = {0};
    uint64_t v = 0;
    /* cgroup v1 (this host's layout): cpuacct.usage in ns; v2: cpu.stat usage_usec. */
    if (cgroup_number(h, "cpuacct", id, "cpuacct.usage", NULL, &v)) {
        u.has_cpu = true;
        u.cpu_seconds = (double)v / 1e9;
    } else if (cgroup_number(h, "unified", id, "cpu.stat", "usage_usec", &v) ||
               cgroup_number(h, "", id, "cpu.stat", "usage_usec", &v)) {
        u.has_cpu = true;
        u.cpu_seconds = (double)v / 1e6;
    }
    if (cgroup_number(h, "memory", id, "memory.usage_in_bytes", NULL, &v) ||
        cgroup_number(h, "unified", id, "memory.current", NULL, &v) ||
        cgroup_number(h, "", id, "memory.current", NULL, &v)) {
        u.has_memory = true;
        u.memory_bytes = v;
    }
    char path[512];
    uint64_t excl = 0, rfer = 0;
    snprintf(path, sizeof(path), "%s/%s", h->sandboxes_dir, id);
    if (wk__subvol_usage(path, &excl, &rfer) == 0) {
        u.has_disk = true;
        u.disk_bytes = excl;
    }
    if (u.has_disk && wk__subvol_max_exclusive(path, &u.disk_limit_bytes) == 0)
        u.has_disk_limit = true;
    *ret = u;
    return 0;
}

int wk__cgroup_ids(const wk_host_t *h, char ***ret_ids, size_t *ret_n)
{
    char **ids = NULL;
    size_t n = 0, cap = 0;
    DIR *d = opendir(WK_CGROUP_ROOT);
    if (!d) {
        *ret_ids = NULL;
        *ret_n = 0;
        return errno == ENOENT ? 0 : -errno;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char *p = sp_xasprintf("%s/%s/space-%s", WK_CGROUP_ROOT, de->d_name, h->tag);
        DIR *c = opendir(p);
        free(p);
        if (!c)
            continue;
        struct dirent *ce;
        while ((ce = readdir(c))) {
            if (ce->d_type != DT_DIR || !sp_id_valid(ce->d_name))
                continue;
            bool dup = false;
            for (size_t i = 0; i < n && !dup; i++)
                dup = strcmp(ids[i], ce->d_name) == 0;
            if (dup)
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                ids = sp_xreallocarray(ids, cap, sizeof(*ids));
            }
            ids[n++] = sp_xstrdup(ce->d_name);
        }
        closedir(c);
    }
    closedir(d);
    *ret_ids = ids;
    *ret_n = n;
    return 0;
}
