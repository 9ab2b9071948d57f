/* The worker runtime on this host, for real: runsc (gVisor, ptrace), btrfs on a sparse loop
 * image, network namespaces and veths. Three sandboxes are created at once from the "tiny"
 * template, checked for isolation, destroyed, and the host is checked for leftovers.
 *
 * Needs root (skipped otherwise). The CTest fixture's NATS/PostgreSQL stack is not used.
 * Everything lives in a temp dir under /tmp; the group teardown destroys every sandbox this
 * test may have made, unmounts the image and removes the dir even when a test failed midway.
 *
 * The firewall (worker_nft.c): its table and per-sandbox elements follow creates, destroys and
 * a reopen; a fake sandbox (a plain netns + veth with our prefix) shows spoofed sources and
 * other sandboxes' gateways dropped; element add/remove is timed.
 *
 * Latency: SPACE_WK_BENCH=N runs N extra create/destroy rounds (default 10) and prints
 * medians; with SPACE_WK_DEBUG=1 the runtime's debug lines give the per-step breakdown.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <btrfsutil.h>
#include <cmocka.h>

#include "error.h"
#include "harness.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "worker_runtime.h"
#include "worker_runtime_int.h"

#define N_PAR       3
#define BENCH_MAX   50
#define WORKER_ID   "it-worker-runtime"
#define NET_PREFIX  "10.213"
#define MEMORY_MB   256
#define IMAGE_BYTES (2ull << 30)

extern char **environ;

static char tmpdir[64];
static char state_dir[128], vol_dir[128];
static char tag[9];
static wk_host_t *host;
static char ids[N_PAR][SP_SANDBOX_ID_LEN + 1];
static char bench_ids[BENCH_MAX][SP_SANDBOX_ID_LEN + 1];
static char bad_id[SP_SANDBOX_ID_LEN + 1];
static char base_id[SP_SANDBOX_ID_LEN + 1];
static int not_root;

/* Skips without root; fails when the host did not open (the reason is on stderr). */
#define NEED_HOST()                                                                                \
    do {                                                                                           \
        if (not_root)                                                                              \
            skip();                                                                                \
        if (!host)                                                                                 \
            fail_msg("host did not open (see stderr)");                                            \
    } while (0)

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Names in dir starting with prefix (dot entries skipped), space-separated into out;
 * returns how many. A missing dir has none. */
static int entries(const char *dir, const char *prefix, char *out, size_t len)
{
    if (out && len)
        out[0] = '\0';
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || strncmp(de->d_name, prefix, strlen(prefix)) != 0)
            continue;
        n++;
        size_t used = out ? strlen(out) : 0;
        if (out && used + strlen(de->d_name) + 2 < len)
            snprintf(out + used, len - used, "%s ", de->d_name);
    }
    closedir(d);
    return n;
}

/* Sandbox cgroup directories under every controller's space-<tag>. */
static int cgroup_dirs(char *out, size_t len)
{
    char names[4096];
    int n = 0;
    out[0] = '\0';
    entries("/sys/fs/cgroup", "", names, sizeof(names));
    for (char *save = NULL, *c = strtok_r(names, " ", &save); c; c = strtok_r(NULL, " ", &save)) {
        char dir[256], sub[1024];
        snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s/space-%s", c, tag);
        DIR *d = opendir(dir);
        if (!d)
            continue;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_type != DT_DIR || de->d_name[0] == '.')
                continue;
            n++;
            size_t used = strlen(out);
            snprintf(sub, sizeof(sub), "%s/%s ", dir, de->d_name);
            if (used + strlen(sub) + 1 < len)
                snprintf(out + used, len - used, "%s", sub);
        }
        closedir(d);
    }
    return n;
}

/* Runs argv on the host and captures stdout+stderr; returns the exit status. */
static int host_run(const char *const *argv, char *out, size_t len)
{
    int p[2];
    out[0] = '\0';
    if (pipe(p) < 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    size_t got = 0;
    ssize_t r;
    while ((r = read(p[0], out + got, len - 1 - got)) > 0 && got + (size_t)r < len - 1)
        got += (size_t)r;
    if (r > 0)
        got += (size_t)r;
    out[got] = '\0';
    close(p[0]);
    if (rc != 0)
        return -1;
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The loop device behind our image, if one is still attached: its name into out. */
static int loop_left(char *out, size_t len)
{
    char names[4096];
    int n = 0;
    out[0] = '\0';
    entries("/sys/block", "loop", names, sizeof(names));
    for (char *save = NULL, *l = strtok_r(names, " ", &save); l; l = strtok_r(NULL, " ", &save)) {
        char path[256], back[512] = "";
        snprintf(path, sizeof(path), "/sys/block/%s/loop/backing_file", l);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(back, sizeof(back), f) && strncmp(back, tmpdir, strlen(tmpdir)) == 0) {
            n++;
            snprintf(out, len, "%s", l);
        }
        fclose(f);
    }
    return n;
}

static int run(const char *id, char *out, size_t len, const char *arg0, ...)
{
    const char *argv[16];
    size_t n = 0;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && n < 15; a = va_arg(ap, const char *))
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    int ex = -1;
    int rc = wk_sandbox_exec(host, id, argv, out, len, &ex);
    if (rc < 0)
        fail_msg("exec %s in %s: rc=%d out=%s", arg0, id, rc, out);
    return ex;
}

static void usage_is(size_t want)
{
    wk_host_usage_t u;
    assert_int_equal(wk_host_usage(host, &u), 0);
    if (u.containers != want || u.subvolumes != want || u.netns != want || u.veths != want ||
        u.cgroups != want)
        fail_msg("usage containers=%zu subvolumes=%zu netns=%zu veths=%zu cgroups=%zu, want %zu",
                 u.containers, u.subvolumes, u.netns, u.veths, u.cgroups, want);
}

/* ---- fixture ---- */

static int open_host(char err[WK_ERR_MAX])
{
    wk_host_config_t cfg = {.worker_id = WORKER_ID,
                            .state_dir = state_dir,
                            .volume_dir = vol_dir,
                            .image_bytes = IMAGE_BYTES,
                            /* Each sandbox's own disk limit must fit in what the small test
                             * volume has free (the reserve check, docs/faults.md). */
                            .disk_mb_default = 256,
                            .runsc = "runsc",
                            .runsc_platform = "ptrace",
                            .net_prefix = NET_PREFIX};
    return wk_host_open(&cfg, &host, err);
}

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "worker_runtime: not root, skipping\n");
        not_root = 1;
        return 0;
    }
    if (getenv("SPACE_WK_DEBUG"))
        sp_log_init("it_worker_runtime", SP_LOG_DEBUG, SP_LOG_KV);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/space-wk-XXXXXX");
    if (!mkdtemp(tmpdir) || chmod(tmpdir, 0755) < 0) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    snprintf(state_dir, sizeof(state_dir), "%s/state", tmpdir);
    snprintf(vol_dir, sizeof(vol_dir), "%s/vol", tmpdir);
    char err[WK_ERR_MAX] = "";
    int rc = open_host(err);
    if (rc < 0) {
        fprintf(stderr, "wk_host_open: %d %s\n", rc, err);
        host = NULL;
    } else {
        /* The name of this host's resources (from the worker id and the state directory). */
        snprintf(tag, sizeof(tag), "%s", wk_host_tag(host));
    }
    return 0; /* the tests fail on !host; teardown still cleans up */
}

static void destroy_quiet(const char *id)
{
    char err[WK_ERR_MAX];
    if (id[0] && wk_sandbox_destroy(host, id, err) < 0)
        fprintf(stderr, "teardown: destroy %s: %s\n", id, err);
}

/* Set by the group teardown when the host kept something of this test: cmocka (1.1) prints a
 * failed group teardown but leaves it out of the exit status. */
static int teardown_failed;

static int group_teardown(void **state)
{
    (void)state;
    if (!tmpdir[0])
        return 0;
    if (host) {
        for (int i = 0; i < N_PAR; i++)
            destroy_quiet(ids[i]);
        for (int i = 0; i < BENCH_MAX; i++)
            destroy_quiet(bench_ids[i]);
        destroy_quiet(bad_id);
        destroy_quiet(base_id);
        char e2[WK_ERR_MAX];
        if (wk__nft_teardown(host, e2) < 0)
            fprintf(stderr, "teardown: %s\n", e2);
        wk_host_close(host);
        host = NULL;
    }
    int rc = 0;
    if (tag[0] && sp_test_nft_table_left(tag))
        rc = -1;
    /* The image mount (its loop device goes with it: autoclear). */
    for (int i = 0; i < 50; i++) {
        if (umount2(vol_dir, 0) == 0 || errno == EINVAL || errno == ENOENT)
            break;
        usleep(100 * 1000);
    }
    /* The per-worker cgroup parents runsc made (empty once the sandboxes are gone). */
    char names[4096], left[256];
    entries("/sys/fs/cgroup", "", names, sizeof(names));
    for (char *save = NULL, *c = strtok_r(names, " ", &save); c; c = strtok_r(NULL, " ", &save)) {
        char dir[256];
        snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s/space-%s", c, tag);
        (void)rmdir(dir);
    }
    if (nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
        fprintf(stderr, "teardown: cannot remove %s: %s\n", tmpdir, strerror(errno));
    if (loop_left(left, sizeof(left)))
        fprintf(stderr, "teardown: loop device left: %s\n", left);
    teardown_failed = rc < 0;
    return rc;
}

/* ---- tests ---- */

static void test_template_tiny(void **state)
{
    (void)state;
    NEED_HOST();
    char err[WK_ERR_MAX] = "";
    int64_t t0 = mono_us();
    int rc = wk_template_ensure(host, "tiny", err);
    if (rc < 0)
        fail_msg("ensure tiny: %d %s", rc, err);
    fprintf(stderr, "tiny template built in %.1f ms\n", (double)(mono_us() - t0) / 1000.0);
    assert_int_equal(wk_template_ensure(host, "tiny", err), 0); /* ready: no rebuild */

    char **names = NULL;
    size_t n = 0;
    assert_int_equal(wk_template_list(host, &names, &n), 0);
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found |= strcmp(names[i], "tiny") == 0;
    wk_strv_free(names, n);
    assert_true(found);

    assert_true(wk_template_ensure(host, "nosuch", err) < 0);
    assert_true(err[0] != '\0');
    assert_true(wk_template_ensure(host, "../etc", err) < 0);

    /* Opening again over the mounted volume (a worker restart) is fine. */
    wk_host_close(host);
    host = NULL;
    assert_int_equal(open_host(err), 0);
    assert_int_equal(wk_template_ensure(host, "tiny", err), 0);
}

typedef struct {
    const char *id;
    wk_sandbox_info_t info;
    char err[WK_ERR_MAX];
    int rc;
} create_job_t;

static void *create_thread(void *arg)
{
    create_job_t *j = arg;
    wk_sandbox_spec_t spec = {.id = j->id, .template_ = "tiny", .vcpu = 1, .memory_mb = MEMORY_MB};
    j->rc = wk_sandbox_create(host, &spec, &j->info, j->err);
    return NULL;
}

static create_job_t jobs[N_PAR];

static void test_create_parallel(void **state)
{
    (void)state;
    NEED_HOST();
    pthread_t t[N_PAR];
    for (int i = 0; i < N_PAR; i++) {
        sp_sandbox_id_new(ids[i]);
        jobs[i].id = ids[i];
    }
    for (int i = 0; i < N_PAR; i++)
        assert_int_equal(pthread_create(&t[i], NULL, create_thread, &jobs[i]), 0);
    for (int i = 0; i < N_PAR; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < N_PAR; i++) {
        if (jobs[i].rc < 0)
            fail_msg("create %s: %d %s", ids[i], jobs[i].rc, jobs[i].err);
        fprintf(stderr, "created %s address=%s create_ms=%u (3 at once)\n", ids[i],
                jobs[i].info.address, jobs[i].info.create_ms);
        assert_true(strncmp(jobs[i].info.address, NET_PREFIX ".", strlen(NET_PREFIX) + 1) == 0);
        for (int k = 0; k < i; k++)
            assert_string_not_equal(jobs[i].info.address, jobs[k].info.address);
    }
    usage_is(N_PAR);

    wk_host_sandbox_t *list = NULL;
    size_t n = 0;
    assert_int_equal(wk_host_scan(host, &list, &n), 0);
    assert_int_equal(n, N_PAR);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(list[i].state, WK_RUNNING);
    free(list);

    /* A second create of a live id fails and must not harm the first. */
    char err[WK_ERR_MAX] = "";
    wk_sandbox_spec_t spec = {.id = ids[0], .template_ = "tiny"};
    assert_int_equal(wk_sandbox_create(host, &spec, NULL, err), -EEXIST);
    char out[256];
    assert_int_equal(run(ids[0], out, sizeof(out), "echo", "still", NULL), 0);
    assert_string_equal(out, "still\n");
    usage_is(N_PAR);
}

static void test_exec_isolation(void **state)
{
    (void)state;
    NEED_HOST();
    if (!ids[N_PAR - 1][0])
        fail_msg("no sandboxes");
    char out[8192], want[128];
    for (int i = 0; i < N_PAR; i++) {
        assert_int_equal(run(ids[i], out, sizeof(out), "echo", "hi", NULL), 0);
        assert_string_equal(out, "hi\n");

        /* hostname is the id */
        assert_int_equal(run(ids[i], out, sizeof(out), "hostname", NULL), 0);
        snprintf(want, sizeof(want), "%s\n", ids[i]);
        assert_string_equal(out, want);

        /* its own address on eth0, default route via .1 */
        assert_int_equal(run(ids[i], out, sizeof(out), "ip", "-4", "addr", "show", "eth0", NULL),
                         0);
        snprintf(want, sizeof(want), "inet %s/30", jobs[i].info.address);
        if (!strstr(out, want))
            fail_msg("%s: no %s in: %s", ids[i], want, out);
        assert_int_equal(run(ids[i], out, sizeof(out), "ip", "route", NULL), 0);
        if (!strstr(out, "default via " NET_PREFIX "."))
            fail_msg("%s: no default route in: %s", ids[i], out);

        /* ps sees only the sandbox: init, its sleep, ps itself */
        assert_int_equal(run(ids[i], out, sizeof(out), "ps", NULL), 0);
        int lines = 0;
        for (const char *p = out; *p; p++)
            lines += *p == '\n';
        if (lines > 6 || strstr(out, "runsc") || strstr(out, "it_worker_runtime") ||
            strstr(out, "process_api") || !strstr(out, "sleep 3600"))
            fail_msg("%s: ps shows more than the sandbox:\n%s", ids[i], out);

        /* the memory limit is what the guest kernel reports */
        assert_int_equal(run(ids[i], out, sizeof(out), "cat", "/proc/meminfo", NULL), 0);
        const char *m = strstr(out, "MemTotal:");
        assert_non_null(m);
        unsigned long kb = strtoul(m + strlen("MemTotal:"), NULL, 10);
        assert_int_equal(kb, (unsigned long)MEMORY_MB * 1024);
    }

    /* A file written in one sandbox is in its disk only. */
    assert_int_equal(run(ids[0], out, sizeof(out), "sh", "-c", "echo secret > /root/marker", NULL),
                     0);
    assert_int_equal(run(ids[0], out, sizeof(out), "cat", "/root/marker", NULL), 0);
    assert_string_equal(out, "secret\n");
    for (int i = 1; i < N_PAR; i++)
        assert_int_not_equal(run(ids[i], out, sizeof(out), "cat", "/root/marker", NULL), 0);
    char path[256];
    snprintf(path, sizeof(path), "%s/sandboxes/%s/root/marker", vol_dir, ids[0]);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof(path), "%s/templates/tiny/root/marker", vol_dir);
    assert_int_not_equal(access(path, F_OK), 0);

    /* A background process that keeps the output pipe open does not hold exec up. */
    int64_t t0 = mono_us();
    assert_int_equal(run(ids[2], out, sizeof(out), "sh", "-c", "sleep 30 & echo bg", NULL), 0);
    assert_string_equal(out, "bg\n");
    assert_true(mono_us() - t0 < 10 * 1000000);
    assert_int_equal(run(ids[2], out, sizeof(out), "sh", "-c", "exit 3", NULL), 3);

    /* Bounded output: a long output is cut, not overflowed. */
    char small[8];
    assert_int_equal(run(ids[1], small, sizeof(small), "echo", "0123456789", NULL), 0);
    assert_string_equal(small, "0123456");
}

static void no_leftovers(void)
{
    usage_is(0);
    wk_host_sandbox_t *list = NULL;
    size_t n = 0;
    assert_int_equal(wk_host_scan(host, &list, &n), 0);
    free(list);
    assert_int_equal(n, 0);

    /* And as the host shows it, looked at directly. */
    char out[4096], root[192];
    snprintf(root, sizeof(root), "--root=%s/runsc", state_dir);
    const char *argv[] = {"runsc", root, "list", "-quiet", NULL};
    assert_int_equal(host_run(argv, out, sizeof(out)), 0);
    if (out[0])
        fail_msg("runsc list not empty: %s", out);
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "sp-%s-", tag);
    if (entries("/run/netns", prefix, out, sizeof(out)))
        fail_msg("netns left: %s", out);
    snprintf(prefix, sizeof(prefix), "spv%.4s", tag);
    if (entries("/sys/class/net", prefix, out, sizeof(out)))
        fail_msg("veth left: %s", out);
    if (cgroup_dirs(out, sizeof(out)))
        fail_msg("cgroup dirs left: %s", out);
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/bundles", state_dir);
    if (entries(dir, "", out, sizeof(out)))
        fail_msg("bundles left: %s", out);
    snprintf(dir, sizeof(dir), "%s/sandboxes", vol_dir);
    if (entries(dir, "", out, sizeof(out)))
        fail_msg("disks left: %s", out);
}

static int sh(const char *cmd, char *out, size_t len)
{
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    return host_run(argv, out, len);
}

static void nft_set(char *out, size_t len)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "nft list set inet space_%s sbx", tag);
    if (sh(cmd, out, len) != 0)
        fail_msg("%s: %s", cmd, out);
}

/* The table exists, each sandbox has its element, the guest reaches its gateway by ping but
 * nothing else (no egressd here: proxy and DNS ports 0, so TCP is dropped). A reopen (worker
 * restart) keeps the elements; restoring one is idempotent. */
static void test_firewall(void **state)
{
    (void)state;
    NEED_HOST();
    if (!ids[N_PAR - 1][0])
        fail_msg("no sandboxes");
    char out[8192], cmd[256], gw[N_PAR][16];
    nft_set(out, sizeof(out));
    for (int i = 0; i < N_PAR; i++) {
        if (!strstr(out, jobs[i].info.address))
            fail_msg("no element for %s in: %s", jobs[i].info.address, out);
        snprintf(gw[i], sizeof(gw[i]), "%s", jobs[i].info.address);
        char *dot = strrchr(gw[i], '.');
        snprintf(dot + 1, sizeof(gw[i]) - (size_t)(dot + 1 - gw[i]), "%ld",
                 strtol(dot + 1, NULL, 10) - 1);
    }
    /* gVisor gives the guest no raw sockets (runsc without --net-raw): no ICMP at all, and no
     * hand-made packets with a forged source from inside a real sandbox. */
    run(ids[0], out, sizeof(out), "ping", "-c", "1", "-W", "1", gw[0], NULL);
    if (!strstr(out, "permission denied"))
        fail_msg("ping from the guest: %s", out);
    /* TCP to the gateway (sshd or anything on the host), to another sandbox's gateway and to
     * another sandbox, with no proxy: all dropped. */
    const char *dst[] = {gw[0], gw[1], jobs[1].info.address};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof(cmd), "nc -w 2 %s 22 </dev/null; echo rc=$?", dst[i]);
        run(ids[0], out, sizeof(out), "sh", "-c", cmd, NULL);
        if (!strstr(out, "rc=1"))
            fail_msg("tcp to %s:22 answered: %s", dst[i], out);
    }

    char err[WK_ERR_MAX] = "";
    wk_host_close(host);
    host = NULL;
    assert_int_equal(open_host(err), 0);
    nft_set(out, sizeof(out));
    for (int i = 0; i < N_PAR; i++)
        if (!strstr(out, jobs[i].info.address))
            fail_msg("element for %s lost by a reopen: %s", jobs[i].info.address, out);
    assert_int_equal(wk_sandbox_net_restore(host, ids[0], err), 0);
    nft_set(out, sizeof(out));
    assert_non_null(strstr(out, jobs[0].info.address));
}

/* A fake sandbox made with ip(8): a netns behind a veth with our name prefix. The guest is
 * root in its netns (like raw sockets in a real guest, which gVisor refuses without
 * --net-raw), so it can pick any source address: only its own passes. */
static void test_firewall_spoof(void **state)
{
    (void)state;
    NEED_HOST();
    char veth[IFNAMSIZ], ns[32], cmd[1024], out[4096], err[WK_ERR_MAX] = "";
    snprintf(veth, sizeof(veth), "spv%.4sfeed0001", tag);
    snprintf(ns, sizeof(ns), "spt-%d", (int)getpid());
    snprintf(cmd, sizeof(cmd),
             "set -e; ip netns add %s; ip link add %s type veth peer name eth0 netns %s;"
             "ip addr add " NET_PREFIX ".255.253/30 dev %s; ip link set %s up;"
             "ip -n %s addr add " NET_PREFIX ".255.254/30 dev eth0; ip -n %s link set eth0 up;"
             "ip -n %s link set lo up; ip -n %s addr add 10.99.0.5/32 dev eth0;"
             "ip -n %s route add default via " NET_PREFIX ".255.253",
             ns, veth, ns, veth, veth, ns, ns, ns, ns, ns);
    int rc = sh(cmd, out, sizeof(out));
    if (rc != 0) {
        snprintf(cmd, sizeof(cmd), "ip link del %s; ip netns del %s", veth, ns);
        sh(cmd, out, sizeof(out));
        fail_msg("fake sandbox: %s", out);
    }
    uint32_t addr = inet_addr(NET_PREFIX ".255.254");
    /* Without its element everything is dropped (fail closed). */
    snprintf(cmd, sizeof(cmd), "ip netns exec %s busybox ping -c 1 -W 1 " NET_PREFIX ".255.253",
             ns);
    int before = sh(cmd, out, sizeof(out));
    assert_int_equal(wk__nft_sandbox_add(host, veth, addr, err), 0);
    int own = sh(cmd, out, sizeof(out));
    snprintf(cmd, sizeof(cmd),
             "ip netns exec %s busybox ping -c 1 -W 1 -I 10.99.0.5 " NET_PREFIX ".255.253", ns);
    int spoofed = sh(cmd, out, sizeof(out));
    /* UDP other than DNS to the gateway, and IPv6: dropped (nothing may answer either way,
     * so count the packets the chain dropped instead: the input hook never sees them). */
    snprintf(cmd, sizeof(cmd),
             "ip netns exec %s busybox ping -c 1 -W 1 " NET_PREFIX
             ".255.253 >/dev/null 2>&1 || exit 1;"
             "ip netns exec %s sh -c 'echo x | nc -u -w 1 " NET_PREFIX ".255.253 5353'; exit 0",
             ns, ns);
    sh(cmd, out, sizeof(out));

    /* Cost of the per-sandbox part: add and remove of one element, one batch each. */
    enum { N = 200 };
    int64_t t0 = mono_us();
    for (int i = 0; i < N; i++) {
        char v[IFNAMSIZ];
        snprintf(v, sizeof(v), "spv%.4sb%07d", tag, i);
        assert_int_equal(wk__nft_sandbox_add(host, v, htonl(0x0a630000u + (uint32_t)i), err), 0);
    }
    int64_t t1 = mono_us();
    char v0[IFNAMSIZ];
    snprintf(v0, sizeof(v0), "spv%.4sb%07d", tag, 0);
    assert_int_equal(wk__nft_sandbox_del_veth(host, v0, err), 0);
    int64_t t2 = mono_us();
    for (int i = 1; i < N; i++) {
        char v[IFNAMSIZ];
        snprintf(v, sizeof(v), "spv%.4sb%07d", tag, i);
        assert_int_equal(wk__nft_sandbox_del(host, v, htonl(0x0a630000u + (uint32_t)i), err), 0);
    }
    int64_t t3 = mono_us();
    fprintf(stderr,
            "firewall element: add %.3f ms each, remove %.3f ms each (%d of each); remove by "
            "veth name with %d elements in the set (dump + delete) %.3f ms\n",
            (double)(t1 - t0) / 1000.0 / N, (double)(t3 - t2) / 1000.0 / (N - 1), N, N + N_PAR,
            (double)(t2 - t1) / 1000.0);

    assert_int_equal(wk__nft_sandbox_del_veth(host, veth, err), 0);
    snprintf(cmd, sizeof(cmd), "ip netns exec %s busybox ping -c 1 -W 1 " NET_PREFIX ".255.253",
             ns);
    int after = sh(cmd, out, sizeof(out));
    snprintf(cmd, sizeof(cmd), "ip link del %s; ip netns del %s", veth, ns);
    sh(cmd, out, sizeof(out));
    assert_int_not_equal(before, 0);
    assert_int_equal(own, 0);
    assert_int_not_equal(spoofed, 0);
    assert_int_not_equal(after, 0);
}

/* The sandbox's and gofer's pids in runsc's state file of id (0 when absent). */
static void state_pids_of(const char *id, pid_t pids[2])
{
    char path[512], buf[65536];
    snprintf(path, sizeof(path), "%s/%s_sandbox:%s.state", host->runsc_root, id, id);
    pids[0] = pids[1] = 0;
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *g = strstr(buf, "\"goferPid\":"), *s = strstr(buf, "\"sandbox\":{");
    if (g)
        pids[0] = (pid_t)strtol(g + strlen("\"goferPid\":"), NULL, 10);
    if (s && (s = strstr(s, "\"pid\":")))
        pids[1] = (pid_t)strtol(s + strlen("\"pid\":"), NULL, 10);
}

/* Before runsc's delete, the worker ends the sandbox's processes itself (runsc's delete would
 * poll for them every 100 ms): both go, reaped. And only they: a pid in a state file that
 * now belongs to another process (the kernel reuses pids) is left alone. */
static void test_procs_end(void **state)
{
    (void)state;
    NEED_HOST();
    pid_t pids[2];
    state_pids_of(ids[0], pids);
    assert_true(pids[0] > 1 && pids[1] > 1);
    assert_int_equal(kill(pids[0], 0), 0);
    assert_int_equal(kill(pids[1], 0), 0);
    assert_int_equal(wk__runsc_procs_end(host, ids[0]), 2);
    assert_true(kill(pids[0], 0) < 0 && errno == ESRCH);
    assert_true(kill(pids[1], 0) < 0 && errno == ESRCH);

    /* A state file naming a process of ours that is no runsc process of that sandbox. */
    pid_t decoy = fork();
    assert_true(decoy >= 0);
    if (decoy == 0) {
        execlp("sleep", "sleep", "30", (char *)NULL);
        _exit(127);
    }
    const char *fake = "sbx_decoy000000000000000000";
    char path[512];
    snprintf(path, sizeof(path), "%s/%s_sandbox:%s.state", host->runsc_root, fake, fake);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"id\":\"%s\",\"goferPid\":%d,\"sandbox\":{\"id\":\"%s\",\"pid\":%d}}", fake,
            (int)decoy, fake, (int)decoy);
    fclose(f);
    assert_int_equal(wk__runsc_procs_end(host, fake), 0);
    assert_int_equal(waitpid(decoy, NULL, WNOHANG), 0); /* still running: not even a zombie */
    unlink(path);
    kill(decoy, SIGKILL);
    waitpid(decoy, NULL, 0);
}

/* One checkpoint of sandbox id into a directory of its own, keeping its disk as snap's. */
static void checkpoint_kept(const char *id, const char *snap, wk_checkpoint_t *ck)
{
    char err[WK_ERR_MAX] = "", dir[256];
    snprintf(dir, sizeof(dir), "%s/ck-%s", tmpdir, snap);
    assert_int_equal(mkdir(dir, 0700), 0);
    if (wk_sandbox_checkpoint(host, id, "tiny", dir, snap, ck, err) < 0)
        fail_msg("checkpoint %s: %s", id, err);
    /* runsc's container went during the checkpoint (runsc keeps no state of it); the disk a
     * restarted worker would finish the suspend from is still there. */
    char path[512];
    assert_true(wk_checkpoint_container_gone(ck));
    snprintf(path, sizeof(path), "%s/%s_sandbox:%s.state", host->runsc_root, id, id);
    assert_true(access(path, F_OK) < 0 && errno == ENOENT);
    snprintf(path, sizeof(path), "%s/sandboxes/%s", vol_dir, id);
    assert_int_equal(access(path, F_OK), 0);
    assert_int_equal(wk_sandbox_destroy_checkpointed(host, id, ck, err), 0);
    assert_true(access(path, F_OK) < 0);
}

/* A sweep's keep: records what it was asked and keeps. */
typedef struct {
    char sbx[SP_SANDBOX_ID_LEN + 1], snap[SP_SANDBOX_ID_LEN + 1];
    int64_t age_s;
    int asked;
} kept_seen_t;

static bool keep_and_note(void *ctx, const char *sbx, const char *snap, int64_t age_s)
{
    kept_seen_t *s = ctx;
    snprintf(s->sbx, sizeof(s->sbx), "%s", sbx);
    snprintf(s->snap, sizeof(s->snap), "%s", snap);
    s->age_s = age_s;
    s->asked++;
    return true;
}

/* A suspended sandbox's disk kept on its host: a restore there starts from it (the disk's
 * stream is not read: a path to nothing serves), and the kept disk goes once used; one that
 * the sweep removed is not used (the stream is received), and what was written before the
 * checkpoint is there both times. */
static void test_kept_disk(void **state)
{
    (void)state;
    NEED_HOST();
    char err[WK_ERR_MAX] = "", out[256], id[SP_SANDBOX_ID_LEN + 1], snap[2][SP_SANDBOX_ID_LEN + 1];
    char work[256], kept[2][512];
    sp_sandbox_id_new(id);
    wk_sandbox_spec_t spec = {.id = id, .template_ = "tiny"};
    if (wk_sandbox_create(host, &spec, NULL, err) < 0)
        fail_msg("create: %s", err);
    assert_int_equal(run(id, out, sizeof(out), "sh", "-c", "echo kept > /kept-marker", NULL), 0);
    snprintf(work, sizeof(work), "%s/restore-%s", tmpdir, id);
    wk_checkpoint_t ck[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        sp_sandbox_id_new(snap[i]);
        snprintf(kept[i], sizeof(kept[i]), "%s/sandboxes/.kept-%s-%s", vol_dir, id, snap[i]);
        checkpoint_kept(id, snap[i], &ck[i]);
        assert_int_equal(access(kept[i], F_OK), 0); /* the destroy leaves it */
        if (i == 1) {
            /* The sweep asks about it with its age (since the checkpoint, moments ago), and
             * keeps it when told to; then takes it: received from the stream instead. */
            kept_seen_t seen = {.age_s = -1};
            assert_int_equal(wk_host_kept_sweep(host, keep_and_note, &seen), 0);
            assert_int_equal(seen.asked, 1);
            assert_string_equal(seen.sbx, id);
            assert_string_equal(seen.snap, snap[1]);
            print_message("kept disk's age at the sweep: %lld s\n", (long long)seen.age_s);
            assert_true(seen.age_s >= 0 && seen.age_s < 60);
            assert_int_equal(access(kept[i], F_OK), 0);
            assert_int_equal(wk_host_kept_sweep(host, NULL, NULL), 1);
        }
        spec.kept_snap = snap[i];
        assert_int_equal(mkdir(work, 0700), 0);
        wk_sandbox_info_t info = {0};
        int rc = wk_sandbox_restore(host, &spec, ck[i].image_path,
                                    i == 0 ? "/nonexistent/rootfs.btrfs.zst" : ck[i].rootfs_path,
                                    work, &info, err);
        (void)rmdir(work);
        if (rc < 0)
            fail_msg("restore %d: %s", i, err);
        if (info.agent_to_fd >= 0)
            close(info.agent_to_fd);
        if (info.agent_from_fd >= 0)
            close(info.agent_from_fd);
        assert_int_equal(info.disk_kept, i == 0);
        assert_true(access(kept[i], F_OK) < 0);
        assert_int_equal(run(id, out, sizeof(out), "cat", "/kept-marker", NULL), 0);
        assert_string_equal(out, "kept\n");
    }
    assert_int_equal(wk_sandbox_destroy(host, id, err), 0);
    for (int i = 0; i < 2; i++)
        wk_checkpoint_dispose(&ck[i]);
}

static bool usage_equal(const wk_host_usage_t *a, const wk_host_usage_t *b)
{
    return a->containers == b->containers && a->subvolumes == b->subvolumes &&
           a->netns == b->netns && a->veths == b->veths && a->cgroups == b->cgroups;
}

/* A resume right after a suspend on the same host: the suspended container's release runs in
 * the background, and a restore begun meanwhile is made under another host id, linked to the
 * sandbox's once that release has ended. The sandbox then answers under its own id (its disk,
 * its hostname), the old one's resources are gone, and its destroy leaves nothing of either. */
static void test_restore_beside_release(void **state)
{
    (void)state;
    NEED_HOST();
    char err[WK_ERR_MAX] = "", out[256], id[SP_SANDBOX_ID_LEN + 1], snap[SP_SANDBOX_ID_LEN + 1];
    char dir[256], work[256], link[512], hid[65], target[80];
    wk_host_usage_t before, after;
    assert_int_equal(wk_host_usage(host, &before), 0);
    sp_sandbox_id_new(id);
    sp_sandbox_id_new(snap);
    wk_sandbox_spec_t spec = {.id = id, .template_ = "tiny"};
    if (wk_sandbox_create(host, &spec, NULL, err) < 0)
        fail_msg("create: %s", err);
    assert_int_equal(run(id, out, sizeof(out), "sh", "-c", "echo kept > /kept-marker", NULL), 0);
    snprintf(dir, sizeof(dir), "%s/ck-%s", tmpdir, snap);
    assert_int_equal(mkdir(dir, 0700), 0);
    wk_checkpoint_t ck = {0};
    if (wk_sandbox_checkpoint(host, id, "tiny", dir, snap, &ck, err) < 0)
        fail_msg("checkpoint %s: %s", id, err);
    char *image = strdup(ck.image_path);
    assert_int_equal(wk_sandbox_release_checkpointed(host, id, &ck, err), 0);
    assert_null(ck.image_path); /* taken over */
    /* Asked at once: the release (runsc's delete, the netns, the disk) takes tens of ms. */
    wk_sandbox_restore_host_id(host, id, hid);
    if (!wk_pool_id_is(hid))
        fail_msg("the release had ended before the restore began: host id %s", hid);
    spec.kept_snap = snap;
    spec.host_id = hid;
    snprintf(work, sizeof(work), "%s/restore-%s", tmpdir, id);
    assert_int_equal(mkdir(work, 0700), 0);
    wk_sandbox_info_t info = {0};
    int rc =
        wk_sandbox_restore(host, &spec, image, "/nonexistent/rootfs.btrfs.zst", work, &info, err);
    (void)rmdir(work);
    free(image);
    if (rc < 0)
        fail_msg("restore under %s: %s", hid, err);
    assert_true(info.disk_kept);
    /* The map, as a pool claim's; the old container's resources are gone: one sandbox more. */
    snprintf(link, sizeof(link), "%s/bundles/%s", state_dir, id);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    assert_true(n > 0);
    target[n] = '\0';
    assert_string_equal(target, hid);
    assert_int_equal(wk_host_usage(host, &after), 0);
    before.containers++, before.subvolumes++, before.netns++, before.veths++, before.cgroups++;
    if (!usage_equal(&before, &after))
        fail_msg("after the restore: containers=%zu subvolumes=%zu netns=%zu veths=%zu "
                 "cgroups=%zu, want one more than before",
                 after.containers, after.subvolumes, after.netns, after.veths, after.cgroups);
    assert_int_equal(run(id, out, sizeof(out), "cat", "/kept-marker", NULL), 0);
    assert_string_equal(out, "kept\n");
    assert_int_equal(run(id, out, sizeof(out), "cat", "/proc/sys/kernel/hostname", NULL), 0);
    char want[80];
    snprintf(want, sizeof(want), "%s\n", id);
    assert_string_equal(out, want);
    wk_host_sandbox_t *list = NULL;
    size_t nl = 0;
    assert_int_equal(wk_host_scan(host, &list, &nl), 0);
    bool as_id = false;
    for (size_t i = 0; i < nl; i++) {
        as_id |= strcmp(list[i].id, id) == 0 && list[i].state == WK_RUNNING;
        assert_string_not_equal(list[i].id, hid);
    }
    free(list);
    assert_true(as_id);

    assert_int_equal(wk_sandbox_destroy(host, id, err), 0);
    struct stat st;
    assert_true(lstat(link, &st) < 0 && errno == ENOENT);
    before.containers--, before.subvolumes--, before.netns--, before.veths--, before.cgroups--;
    assert_int_equal(wk_host_usage(host, &after), 0);
    assert_true(usage_equal(&before, &after));
    wk_rm_rf(dir);
}

static void test_destroy(void **state)
{
    (void)state;
    NEED_HOST();
    char err[WK_ERR_MAX] = "";
    for (int i = 0; i < N_PAR; i++) {
        if (!ids[i][0])
            continue;
        int64_t t0 = mono_us();
        int rc = wk_sandbox_destroy(host, ids[i], err);
        if (rc < 0)
            fail_msg("destroy %s: %d %s", ids[i], rc, err);
        fprintf(stderr, "destroyed %s in %.1f ms\n", ids[i], (double)(mono_us() - t0) / 1000.0);
        assert_int_equal(wk_sandbox_destroy(host, ids[i], err), 0); /* twice is fine */
    }
    no_leftovers();
    char set[8192];
    nft_set(set, sizeof(set));
    for (int i = 0; i < N_PAR; i++)
        if (jobs[i].info.address[0] && strstr(set, jobs[i].info.address))
            fail_msg("element for %s left after destroy: %s", jobs[i].info.address, set);
    char out[64];
    const char *argv[] = {"echo", "x", NULL};
    int ex;
    assert_int_equal(wk_sandbox_exec(host, ids[0], argv, out, sizeof(out), &ex), SP_ENOTFOUND);
    assert_int_equal(wk_sandbox_destroy(host, "never-created", err), 0);
}

static void test_unknown_template(void **state)
{
    (void)state;
    NEED_HOST();
    char err[WK_ERR_MAX] = "";
    sp_sandbox_id_new(bad_id);
    wk_sandbox_spec_t spec = {.id = bad_id, .template_ = "nosuch"};
    wk_sandbox_info_t info;
    int rc = wk_sandbox_create(host, &spec, &info, err);
    assert_true(rc < 0);
    assert_true(err[0] != '\0');
    fprintf(stderr, "unknown template: %d %s\n", rc, err);
    spec.id = "../x";
    spec.template_ = "tiny";
    assert_int_equal(wk_sandbox_create(host, &spec, &info, err), -EINVAL);
    no_leftovers();
}

/* A create that fails after runsc made its cgroups (the template has no /bin/sh, so the init
 * cannot start) must leave nothing behind either (runtime-notes.md: a failed create leaves
 * cgroup v1 directories). */
static void test_failed_start(void **state)
{
    (void)state;
    NEED_HOST();
    char build[256], tmpl[256], err[WK_ERR_MAX] = "";
    snprintf(build, sizeof(build), "%s/templates/.build-empty", vol_dir);
    snprintf(tmpl, sizeof(tmpl), "%s/templates/empty", vol_dir);
    assert_int_equal(btrfs_util_create_subvolume(build, 0, NULL, NULL), BTRFS_UTIL_OK);
    assert_int_equal(
        btrfs_util_create_snapshot(build, tmpl, BTRFS_UTIL_CREATE_SNAPSHOT_READ_ONLY, NULL, NULL),
        BTRFS_UTIL_OK);
    assert_int_equal(btrfs_util_delete_subvolume(build, 0), BTRFS_UTIL_OK);

    sp_sandbox_id_new(bad_id);
    wk_sandbox_spec_t spec = {.id = bad_id, .template_ = "empty"};
    int rc = wk_sandbox_create(host, &spec, NULL, err);
    fprintf(stderr, "template without /bin/sh: %d %s\n", rc, err);
    assert_true(rc < 0);
    assert_true(err[0] != '\0');
    no_leftovers();
    assert_int_equal(btrfs_util_delete_subvolume(tmpl, 0), BTRFS_UTIL_OK);
}

/* Opt-in (SPACE_WK_BASE=1; minutes, needs the Debian mirror): builds "base" and checks that
 * GNU coreutils work under runsc (the statx shim), python3 runs and user exists. */
static void test_base_template(void **state)
{
    (void)state;
    NEED_HOST();
    if (!getenv("SPACE_WK_BASE"))
        skip();
    char err[WK_ERR_MAX] = "", out[8192], path[256];
    int64_t t0 = mono_us();
    int rc = wk_template_ensure(host, "base", err);
    if (rc < 0)
        fail_msg("ensure base: %d %s", rc, err);
    snprintf(path, sizeof(path), "%s/templates/base", vol_dir);
    const char *du[] = {"du", "-sx", "--block-size=1M", path, NULL};
    host_run(du, out, sizeof(out));
    fprintf(stderr, "base template: %.1f s, %s", (double)(mono_us() - t0) / 1e6, out);

    sp_sandbox_id_new(base_id);
    wk_sandbox_spec_t spec = {.id = base_id, .template_ = "base"};
    wk_sandbox_info_t info;
    rc = wk_sandbox_create(host, &spec, &info, err);
    if (rc < 0)
        fail_msg("create from base: %d %s", rc, err);
    fprintf(stderr, "base sandbox created in %u ms\n", info.create_ms);
    if (run(base_id, out, sizeof(out), "ls", "-la", "/home/user", NULL) != 0)
        fail_msg("ls -la: %s", out);
    if (run(base_id, out, sizeof(out), "stat", "/etc/passwd", NULL) != 0)
        fail_msg("stat: %s", out);
    assert_int_equal(run(base_id, out, sizeof(out), "python3", "-c", "print(6*7)", NULL), 0);
    assert_string_equal(out, "42\n");
    assert_int_equal(run(base_id, out, sizeof(out), "id", "-u", "user", NULL), 0);
    assert_string_equal(out, "1000\n");
    assert_int_equal(
        run(base_id, out, sizeof(out), "bash", "-c", "cp -a /etc /tmp/e && echo ok", NULL), 0);
    assert_string_equal(out, "ok\n");
    assert_int_equal(wk_sandbox_destroy(host, base_id, err), 0);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void test_latency(void **state)
{
    (void)state;
    NEED_HOST();
    const char *e = getenv("SPACE_WK_BENCH");
    long n = e ? strtol(e, NULL, 10) : 10;
    if (n <= 0)
        skip();
    if (n > BENCH_MAX)
        n = BENCH_MAX;
    uint32_t create_ms[BENCH_MAX], first_ms[BENCH_MAX], destroy_ms[BENCH_MAX];
    char err[WK_ERR_MAX] = "", out[64];
    for (int i = 0; i < n; i++) {
        sp_sandbox_id_new(bench_ids[i]);
        wk_sandbox_spec_t spec = {.id = bench_ids[i], .template_ = "tiny"};
        wk_sandbox_info_t info;
        int rc = wk_sandbox_create(host, &spec, &info, err);
        if (rc < 0)
            fail_msg("bench create: %d %s", rc, err);
        create_ms[i] = info.create_ms;
        int64_t t0 = mono_us();
        assert_int_equal(run(bench_ids[i], out, sizeof(out), "echo", "hi", NULL), 0);
        first_ms[i] = (uint32_t)((mono_us() - t0) / 1000);
        t0 = mono_us();
        rc = wk_sandbox_destroy(host, bench_ids[i], err);
        if (rc < 0)
            fail_msg("bench destroy: %d %s", rc, err);
        destroy_ms[i] = (uint32_t)((mono_us() - t0) / 1000);
    }
    qsort(create_ms, (size_t)n, sizeof(uint32_t), cmp_u32);
    qsort(first_ms, (size_t)n, sizeof(uint32_t), cmp_u32);
    qsort(destroy_ms, (size_t)n, sizeof(uint32_t), cmp_u32);
    fprintf(stderr,
            "latency over %ld sequential rounds: create median %u ms (min %u, max %u), "
            "first exec median %u ms, destroy median %u ms (min %u, max %u)\n",
            n, create_ms[n / 2], create_ms[0], create_ms[n - 1], first_ms[n / 2], destroy_ms[n / 2],
            destroy_ms[0], destroy_ms[n - 1]);
    no_leftovers();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template_tiny),  cmocka_unit_test(test_create_parallel),
        cmocka_unit_test(test_exec_isolation), cmocka_unit_test(test_firewall),
        cmocka_unit_test(test_firewall_spoof), cmocka_unit_test(test_procs_end),
        cmocka_unit_test(test_kept_disk),      cmocka_unit_test(test_restore_beside_release),
        cmocka_unit_test(test_destroy),        cmocka_unit_test(test_unknown_template),
        cmocka_unit_test(test_failed_start),   cmocka_unit_test(test_base_template),
        cmocka_unit_test(test_latency),
    };
    int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
    return failed ? failed : teardown_failed;
}
