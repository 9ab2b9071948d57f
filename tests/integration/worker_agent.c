/* The agent channel for real: two sandboxes from the "tiny" template with space-agent as their
 * PID 1 ($SPACE_BIN_DIR/space-agent), driven through worker_agent.h: Hello, exit codes and
 * signals, env, cwd, uid, stdin, timeouts, 50 commands at once, a 50 MB flood next to a short
 * command, the command limit, a guest writing garbage into the channel, a guest trying to
 * kill the agent, and a destroy with the channel open. Then nothing may be left on the host.
 *
 * Needs root (skipped otherwise). The CTest fixture's stack is not used; everything lives in
 * a temp dir under /tmp that the group teardown removes, after destroying every sandbox, also
 * when a test failed midway.
 *
 * Latency: SPACE_AGENT_BENCH=N (default 200) round trips of `echo hi` over the channel and
 * through `runsc exec`, printed as median and p99.
 */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "worker_agent.h"
#include "worker_runtime.h"

#define WORKER_ID   "it-worker-agent"
#define NET_PREFIX  "10.214"
#define MEMORY_MB   512
#define IMAGE_BYTES (2ull << 30)
#define RECS_MAX    1024
#define CAPTURE     4096
#define FLOOD_BYTES 50000000ull
#define BENCH_MAX   2000

static char tmpdir[64];
static char state_dir[128], vol_dir[128];
static char tag[9];
static char agent_path[512];
static wk_host_t *host;
static int not_root;

/* ---- what the callbacks saw, per channel ---- */

typedef struct {
    char id[65];
    bool started, done, failed;
    uint32_t pid;
    char out[CAPTURE], err[CAPTURE];
    uint64_t out_total, err_total;
    bool flood;         /* check stdout against "y\n" repeated */
    uint64_t flood_bad; /* bytes that broke the pattern */
    int exit_code, sig;
    bool timed_out;
    char message[512];
    int64_t t_sent, t_started, t_first, t_done; /* monotonic us */
} rec_t;

typedef struct {
    const char *name;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    rec_t *recs;
    size_t n;
    bool lost;
    char lost_why[256];
    int unknown;    /* callbacks for ids we never sent: must stay 0 */
    int after_lost; /* callbacks after on_lost: must stay 0 */
} chan_t;

typedef struct {
    char id[SP_SANDBOX_ID_LEN + 1];
    wk_agent_t *agent;
    chan_t ch;
    int seq;
} box_t;

static box_t box_a = {.ch = {.name = "a"}}, box_b = {.ch = {.name = "b"}},
             box_c = {.ch = {.name = "c"}};

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

static rec_t *rec_find(chan_t *ch, const char *id)
{
    for (size_t i = ch->n; i-- > 0;) {
        if (strcmp(ch->recs[i].id, id) == 0)
            return &ch->recs[i];
    }
    return NULL;
}

/* Under mu: the record a callback is about, or NULL (counted) for an id never sent. */
static rec_t *rec_cb(chan_t *ch, const char *id)
{
    if (ch->lost)
        ch->after_lost++;
    rec_t *r = rec_find(ch, id);
    if (!r || r->done)
        ch->unknown++;
    return r && !r->done ? r : NULL;
}

static void cb_started(void *arg, const char *cmd_id, uint32_t pid)
{
    chan_t *ch = arg;
    pthread_mutex_lock(&ch->mu);
    rec_t *r = rec_cb(ch, cmd_id);
    if (r) {
        r->started = true;
        r->pid = pid;
        r->t_started = mono_us();
    }
    pthread_cond_broadcast(&ch->cond);
    pthread_mutex_unlock(&ch->mu);
}

static void cb_output(void *arg, const char *cmd_id, int stream, const uint8_t *data, size_t len)
{
    chan_t *ch = arg;
    pthread_mutex_lock(&ch->mu);
    rec_t *r = rec_cb(ch, cmd_id);
    if (r) {
        if (!r->t_first)
            r->t_first = mono_us();
        char *buf = stream == 1 ? r->out : r->err;
        uint64_t *total = stream == 1 ? &r->out_total : &r->err_total;
        if (r->flood && stream == 1) {
            for (size_t k = 0; k < len; k++)
                r->flood_bad += data[k] != ((*total + k) % 2 == 0 ? 'y' : '\n');
        }
        if (*total < CAPTURE - 1) {
            size_t n = CAPTURE - 1 - (size_t)*total;
            if (n > len)
                n = len;
            memcpy(buf + *total, data, n);
            buf[*total + n] = '\0';
        }
        *total += len;
    }
    pthread_cond_broadcast(&ch->cond);
    pthread_mutex_unlock(&ch->mu);
}

static void cb_exited(void *arg, const char *cmd_id, int exit_code, int sig, bool timed_out,
                      const char *oom)
{
    (void)oom;
    chan_t *ch = arg;
    pthread_mutex_lock(&ch->mu);
    rec_t *r = rec_cb(ch, cmd_id);
    if (r) {
        r->exit_code = exit_code;
        r->sig = sig;
        r->timed_out = timed_out;
        r->t_done = mono_us();
        r->done = true;
    }
    pthread_cond_broadcast(&ch->cond);
    pthread_mutex_unlock(&ch->mu);
}

static void cb_error(void *arg, const char *cmd_id, const char *message)
{
    chan_t *ch = arg;
    pthread_mutex_lock(&ch->mu);
    rec_t *r = rec_cb(ch, cmd_id);
    if (r) {
        snprintf(r->message, sizeof(r->message), "%s", message);
        r->failed = true;
        r->t_done = mono_us();
        r->done = true;
    }
    pthread_cond_broadcast(&ch->cond);
    pthread_mutex_unlock(&ch->mu);
}

static void cb_lost(void *arg, const char *why)
{
    chan_t *ch = arg;
    pthread_mutex_lock(&ch->mu);
    if (ch->lost)
        ch->after_lost++;
    ch->lost = true;
    snprintf(ch->lost_why, sizeof(ch->lost_why), "%s", why);
    pthread_cond_broadcast(&ch->cond);
    pthread_mutex_unlock(&ch->mu);
}

/* ---- driving commands ---- */

typedef struct {
    const char *const *env;
    const char *cwd;
    uint32_t uid, gid, timeout_ms;
    const void *stdin_data;
    size_t stdin_len;
    bool stdin_open;
    bool flood;
} opts_t;

/* Sends an Exec; *ret_rc gets wk_agent_exec's result. The record exists before the frame
 * goes out (callbacks can come first). */
static rec_t *exec_rc(box_t *b, const char *const *argv, const opts_t *o, int *ret_rc)
{
    static const opts_t none;
    if (!o)
        o = &none;
    chan_t *ch = &b->ch;
    pthread_mutex_lock(&ch->mu);
    if (ch->n == RECS_MAX) {
        pthread_mutex_unlock(&ch->mu);
        fail_msg("too many records");
    }
    rec_t *r = &ch->recs[ch->n++];
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "c%d", ++b->seq);
    r->flood = o->flood;
    r->t_sent = mono_us();
    pthread_mutex_unlock(&ch->mu);

    Space__Agent__V1__Exec e = SPACE__AGENT__V1__EXEC__INIT;
    size_t argc = 0, envc = 0;
    while (argv[argc])
        argc++;
    while (o->env && o->env[envc])
        envc++;
    e.cmd_id = r->id;
    e.argv = (char **)argv;
    e.n_argv = argc;
    e.env = (char **)o->env;
    e.n_env = envc;
    if (o->cwd)
        e.cwd = (char *)o->cwd;
    e.uid = o->uid;
    e.gid = o->gid;
    e.timeout_ms = o->timeout_ms;
    e.stdin_data.data = (uint8_t *)o->stdin_data;
    e.stdin_data.len = o->stdin_len;
    e.stdin_open = o->stdin_open;
    *ret_rc = wk_agent_exec(b->agent, &e);
    return r;
}

static rec_t *exec_ok(box_t *b, const char *const *argv, const opts_t *o)
{
    int rc;
    rec_t *r = exec_rc(b, argv, o, &rc);
    if (rc < 0)
        fail_msg("wk_agent_exec %s: %d", argv[0], rc);
    return r;
}

/* Waits until r is done (or, with started_only, started); false on timeout. */
static bool wait_rec(box_t *b, rec_t *r, int timeout_ms, bool started_only)
{
    chan_t *ch = &b->ch;
    int64_t end = mono_us() + (int64_t)timeout_ms * 1000;
    pthread_mutex_lock(&ch->mu);
    while (!(r->done || (started_only && r->started)) && mono_us() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&ch->cond, &ch->mu, &ts);
    }
    bool ok = r->done || (started_only && r->started);
    pthread_mutex_unlock(&ch->mu);
    return ok;
}

static int runsc_run(box_t *b, char *out, size_t len, const char *const *argv);

static void wait_done(box_t *b, rec_t *r, int timeout_ms)
{
    if (!wait_rec(b, r, timeout_ms, false)) {
        char ps[8192];
        const char *argv[] = {"ps", "-o", "pid,ppid,stat,args", NULL};
        runsc_run(b, ps, sizeof(ps), argv);
        fprintf(stderr, "%s: started=%d pid=%u; processes in the sandbox:\n%s", r->id, r->started,
                r->pid, ps);
        fail_msg("%s: command %s not done within %d ms (out=%s err=%s)", b->ch.name, r->id,
                 timeout_ms, r->out, r->err);
    }
}

/* Runs argv to completion and checks exit 0 and stdout. */
static void expect_out(box_t *b, const char *const *argv, const opts_t *o, const char *want)
{
    rec_t *r = exec_ok(b, argv, o);
    wait_done(b, r, 10000);
    if (r->failed)
        fail_msg("%s: error: %s", argv[0], r->message);
    if (r->exit_code != 0 || strcmp(r->out, want) != 0)
        fail_msg("%s: exit %d signal %d out '%s' (want '%s') err '%s'", argv[0], r->exit_code,
                 r->sig, r->out, want, r->err);
}

static bool wait_lost(box_t *b, int timeout_ms)
{
    chan_t *ch = &b->ch;
    int64_t end = mono_us() + (int64_t)timeout_ms * 1000;
    pthread_mutex_lock(&ch->mu);
    while (!ch->lost && mono_us() < end) {
        pthread_mutex_unlock(&ch->mu);
        usleep(5000);
        pthread_mutex_lock(&ch->mu);
    }
    bool lost = ch->lost;
    pthread_mutex_unlock(&ch->mu);
    return lost;
}

/* `runsc exec` (not the channel): exit code, output into out. */
static int runsc_run(box_t *b, char *out, size_t len, const char *const *argv)
{
    int ex = -1;
    int rc = wk_sandbox_exec(host, b->id, argv, out, len, &ex);
    if (rc < 0)
        fail_msg("runsc exec %s: %d %s", argv[0], rc, out);
    return ex;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += de->d_name[0] != '.';
    if (d)
        closedir(d);
    return n - 1; /* the DIR's own */
}

/* ---- fixture ---- */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "worker_agent: not root, skipping\n");
        not_root = 1;
        return 0;
    }
    /* wk_agent_* assume SIGPIPE is ignored, as the daemon does (worker_agent.c). */
    signal(SIGPIPE, SIG_IGN);
    if (getenv("SPACE_WK_DEBUG"))
        sp_log_init("it_worker_agent", SP_LOG_DEBUG, SP_LOG_KV);
    const char *bin = getenv("SPACE_BIN_DIR");
    snprintf(agent_path, sizeof(agent_path), "%s/space-agent", bin ? bin : ".");
    box_t *boxes[] = {&box_a, &box_b, &box_c};
    for (int i = 0; i < 3; i++) {
        boxes[i]->ch.recs = calloc(RECS_MAX, sizeof(rec_t));
        pthread_mutex_init(&boxes[i]->ch.mu, NULL);
        pthread_cond_init(&boxes[i]->ch.cond, NULL);
    }
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/space-wka-XXXXXX");
    if (!mkdtemp(tmpdir) || chmod(tmpdir, 0755) < 0) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        tmpdir[0] = '\0';
        return -1;
    }
    snprintf(state_dir, sizeof(state_dir), "%s/state", tmpdir);
    snprintf(vol_dir, sizeof(vol_dir), "%s/vol", tmpdir);
    wk_host_config_t cfg = {.worker_id = WORKER_ID,
                            .state_dir = state_dir,
                            .volume_dir = vol_dir,
                            .image_bytes = IMAGE_BYTES,
                            /* Each sandbox's own disk limit must fit in what the small test
                             * volume has free (the reserve check, docs/faults.md). */
                            .disk_mb_default = 256,
                            .runsc = "runsc",
                            .runsc_platform = "ptrace",
                            .net_prefix = NET_PREFIX,
                            .agent_path = agent_path};
    char err[WK_ERR_MAX] = "";
    int rc = wk_host_open(&cfg, &host, err);
    if (rc == 0)
        snprintf(tag, sizeof(tag), "%s", wk_host_tag(host));
    if (rc < 0) {
        fprintf(stderr, "wk_host_open: %d %s\n", rc, err);
        host = NULL;
    }
    return 0; /* the tests fail on !host; teardown still cleans up */
}

/* Set by the group teardown when the host kept something of this test: cmocka (1.1) prints a
 * failed group teardown but leaves it out of the exit status. */
static int teardown_failed;

static int group_teardown(void **state)
{
    (void)state;
    if (!tmpdir[0])
        return 0;
    box_t *boxes[] = {&box_a, &box_b, &box_c};
    for (int i = 0; i < 3; i++) {
        wk_agent_close(boxes[i]->agent);
        boxes[i]->agent = NULL;
    }
    int rc = 0;
    if (host) {
        char err[WK_ERR_MAX];
        for (int i = 0; i < 3; i++) {
            if (boxes[i]->id[0] && wk_sandbox_destroy(host, boxes[i]->id, err) < 0)
                fprintf(stderr, "teardown: destroy %s: %s\n", boxes[i]->id, err);
        }
        /* What `space down --purge` runs: whatever else the host made, its nftables table
         * included, which outlives this process and hooks every packet of the machine. Closing
         * the host alone left one `space_<tag>` table behind per run. */
        if (wk_host_teardown(host, err) < 0) {
            fprintf(stderr, "teardown: %s\n", err);
            rc = -1;
        }
        wk_host_close(host);
        host = NULL;
    }
    if (tag[0] && sp_test_nft_table_left(tag))
        rc = -1;
    for (int i = 0; i < 50; i++) {
        if (umount2(vol_dir, 0) == 0 || errno == EINVAL || errno == ENOENT)
            break;
        usleep(100 * 1000);
    }
    /* The per-worker cgroup parents runsc made (empty once the sandboxes are gone). */
    DIR *d = opendir("/sys/fs/cgroup");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char dir[512];
        snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s/space-%s", de->d_name, tag);
        (void)rmdir(dir);
    }
    if (d)
        closedir(d);
    if (nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
        fprintf(stderr, "teardown: cannot remove %s: %s\n", tmpdir, strerror(errno));
    for (int i = 0; i < 3; i++)
        free(boxes[i]->ch.recs);
    teardown_failed = rc < 0;
    return rc;
}

static const wk_agent_callbacks_t *callbacks(chan_t *ch)
{
    static wk_agent_callbacks_t cb[3];
    wk_agent_callbacks_t *c = &cb[ch == &box_a.ch ? 0 : ch == &box_b.ch ? 1 : 2];
    *c = (wk_agent_callbacks_t){.on_started = cb_started,
                                .on_output = cb_output,
                                .on_exited = cb_exited,
                                .on_error = cb_error,
                                .on_lost = cb_lost,
                                .arg = ch};
    return c;
}

/* ---- tests ---- */

/* Creates a sandbox with the agent and opens its channel. */
static void create_box(box_t *b)
{
    char err[WK_ERR_MAX] = "";
    int fds_before = count_fds();
    sp_sandbox_id_new(b->id);
    wk_sandbox_spec_t spec = {.id = b->id, .template_ = "tiny", .memory_mb = MEMORY_MB};
    wk_sandbox_info_t info;
    int rc = wk_sandbox_create(host, &spec, &info, err);
    if (rc < 0)
        fail_msg("create: %d %s", rc, err);
    /* Exactly the two host ends are new in this process. */
    assert_true(info.agent_to_fd >= 0 && info.agent_from_fd >= 0);
    assert_int_equal(count_fds(), fds_before + 2);
    int64_t t0 = mono_us();
    rc = wk_agent_open(info.agent_to_fd, info.agent_from_fd, b->id, callbacks(&b->ch), 5000,
                       &b->agent);
    if (rc < 0)
        fail_msg("wk_agent_open: %d", rc);
    fprintf(stderr, "sandbox %s created in %u ms, Hello %.2f ms after\n", b->id, info.create_ms,
            (double)(mono_us() - t0) / 1000.0);
    assert_true(wk_agent_alive(b->agent));
}

static void test_create_and_hello(void **state)
{
    (void)state;
    NEED_HOST();
    char err[WK_ERR_MAX] = "";
    int rc = wk_template_ensure(host, "tiny", err);
    if (rc < 0)
        fail_msg("ensure tiny: %d %s", rc, err);
    create_box(&box_a);
    create_box(&box_b);
    /* The agent is PID 1, installed root-owned 0755. */
    char out[4096];
    const char *st[] = {"stat", "-c", "%a %u %g", "/.space/agent", NULL};
    assert_int_equal(runsc_run(&box_a, out, sizeof(out), st), 0);
    assert_string_equal(out, "755 0 0\n");
    const char *cmdline[] = {"cat", "/proc/1/cmdline", NULL};
    assert_int_equal(runsc_run(&box_a, out, sizeof(out), cmdline), 0);
    assert_string_equal(out, "/.space/agent");
}

static void test_exit_codes(void **state)
{
    (void)state;
    NEED_HOST();
    if (!box_a.agent)
        fail_msg("no channel");
    const char *echo[] = {"echo", "hi", NULL};
    expect_out(&box_a, echo, NULL, "hi\n");

    const char *ex3[] = {"sh", "-c", "exit 3", NULL};
    rec_t *r = exec_ok(&box_a, ex3, NULL);
    wait_done(&box_a, r, 10000);
    assert_int_equal(r->exit_code, 3);
    assert_int_equal(r->sig, 0);
    assert_false(r->timed_out);

    const char *k9[] = {"sh", "-c", "kill -9 $$", NULL};
    r = exec_ok(&box_a, k9, NULL);
    wait_done(&box_a, r, 10000);
    assert_int_equal(r->exit_code, -1);
    assert_int_equal(r->sig, 9);
    assert_false(r->timed_out);

    const char *both[] = {"sh", "-c", "echo out; echo err >&2; exit 1", NULL};
    r = exec_ok(&box_a, both, NULL);
    wait_done(&box_a, r, 10000);
    assert_int_equal(r->exit_code, 1);
    assert_string_equal(r->out, "out\n");
    assert_string_equal(r->err, "err\n");
    assert_true(r->started && r->pid > 1);

    /* What the agent cannot start is an Error, not an exit. */
    const char *nosuch[] = {"/no/such/program", NULL};
    r = exec_ok(&box_a, nosuch, NULL);
    wait_done(&box_a, r, 10000);
    assert_true(r->failed && !r->started);
    fprintf(stderr, "missing program: %s\n", r->message);
    assert_non_null(strstr(r->message, "exec"));

    /* The worker side refuses what it cannot send. */
    int rc;
    const char *empty[] = {NULL};
    exec_rc(&box_a, empty, NULL, &rc);
    assert_int_equal(rc, -EINVAL);
    assert_int_equal(wk_agent_signal(box_a.agent, "nosuch", SIGTERM), -ENOENT);
    assert_int_equal(wk_agent_stdin(box_a.agent, "nosuch", (const uint8_t *)"x", 1, true), -ENOENT);
}

static void test_env_cwd_uid(void **state)
{
    (void)state;
    NEED_HOST();
    if (!box_a.agent)
        fail_msg("no channel");
    const char *env1[] = {"FOO=bar baz", NULL};
    const char *foo[] = {"sh", "-c", "echo \"$FOO:$(pwd)\"", NULL};
    opts_t o = {.env = env1, .cwd = "/tmp"};
    expect_out(&box_a, foo, &o, "bar baz:/tmp\n");

    /* The env given, plus what a login sets that it lacks: a default PATH, and HOME, USER
     * and LOGNAME from /etc/passwd (HOME alone, "/", for a uid it does not name). */
    const char *env2[] = {"A=1", NULL};
    const char *envp[] = {"env", NULL};
    o = (opts_t){.env = env2};
    expect_out(&box_a, envp, &o,
               "A=1\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
               "HOME=/root\nUSER=root\nLOGNAME=root\n");
    const char *env3[] = {"PATH=/bin", "B=2", "HOME=/tmp", NULL};
    o = (opts_t){.env = env3};
    expect_out(&box_a, envp, &o, "PATH=/bin\nB=2\nHOME=/tmp\nUSER=root\nLOGNAME=root\n");
    const char *env4[] = {"PATH=/bin", NULL};
    o = (opts_t){.env = env4, .uid = 1000, .gid = 1000};
    expect_out(&box_a, envp, &o, "PATH=/bin\nHOME=/home/user\nUSER=user\nLOGNAME=user\n");
    o = (opts_t){.env = env4, .uid = 4242, .gid = 4242};
    expect_out(&box_a, envp, &o, "PATH=/bin\nHOME=/\n");

    /* cwd "": the user's home from /etc/passwd. */
    const char *pwd[] = {"pwd", NULL};
    expect_out(&box_a, pwd, NULL, "/root\n");
    o = (opts_t){.uid = 1000, .gid = 1000};
    expect_out(&box_a, pwd, &o, "/home/user\n");
    o = (opts_t){.uid = 4242, .gid = 4242};
    expect_out(&box_a, pwd, &o, "/\n");

    const char *id[] = {"id", NULL};
    o = (opts_t){.uid = 1000, .gid = 1000};
    expect_out(&box_a, id, &o, "uid=1000(user) gid=1000(user) groups=1000(user)\n");
    const char *idu[] = {"id", "-u", NULL};
    expect_out(&box_a, idu, &o, "1000\n");
    expect_out(&box_a, idu, NULL, "0\n");
    /* uid 1000 cannot write to /root. */
    const char *touch[] = {"touch", "/root/x", NULL};
    rec_t *r = exec_ok(&box_a, touch, &o);
    wait_done(&box_a, r, 10000);
    assert_int_equal(r->exit_code, 1);

    o = (opts_t){.cwd = "/no/such/dir"};
    r = exec_ok(&box_a, pwd, &o);
    wait_done(&box_a, r, 10000);
    assert_true(r->failed && !r->started);
    fprintf(stderr, "missing cwd: %s\n", r->message);
    assert_non_null(strstr(r->message, "cwd"));
}

static void test_stdin(void **state)
{
    (void)state;
    NEED_HOST();
    if (!box_a.agent)
        fail_msg("no channel");
    const char *cat[] = {"cat", NULL};
    opts_t o = {.stdin_data = "hello\nworld\n", .stdin_len = 12};
    expect_out(&box_a, cat, &o, "hello\nworld\n");
    /* No stdin_data, not open: EOF at once. */
    expect_out(&box_a, cat, NULL, "");

    /* More than a pipe buffer in the Exec itself. */
    static uint8_t big[300 * 1024];
    memset(big, 'x', sizeof(big));
    const char *wc[] = {"wc", "-c", NULL};
    o = (opts_t){.stdin_data = big, .stdin_len = 100 * 1024};
    expect_out(&box_a, wc, &o, "102400\n");

    /* Open stdin: chunks (one of them split into several frames), then EOF. */
    o = (opts_t){.stdin_open = true};
    rec_t *r = exec_ok(&box_a, wc, &o);
    assert_int_equal(wk_agent_stdin(box_a.agent, r->id, (const uint8_t *)"abc", 3, false), 0);
    assert_int_equal(wk_agent_stdin(box_a.agent, r->id, big, sizeof(big), false), 0);
    assert_int_equal(wk_agent_stdin(box_a.agent, r->id, NULL, 0, true), 0);
    wait_done(&box_a, r, 10000);
    assert_int_equal(r->exit_code, 0);
    assert_string_equal(r->out, "307203\n");

    o = (opts_t){.stdin_open = true};
    r = exec_ok(&box_a, cat, &o);
    assert_int_equal(wk_agent_stdin(box_a.agent, r->id, (const uint8_t *)"ab", 2, false), 0);
    assert_int_equal(wk_agent_stdin(box_a.agent, r->id, (const uint8_t *)"cd", 2, true), 0);
    wait_done(&box_a, r, 10000);
    assert_string_equal(r->out, "abcd");
}

static void test_timeout_and_signal(void **state)
{
    (void)state;
    NEED_HOST();
    if (!box_a.agent)
        fail_msg("no channel");
    const char *sleep10[] = {"sleep", "10", NULL};
    opts_t o = {.timeout_ms = 500};
    rec_t *r = exec_ok(&box_a, sleep10, &o);
    wait_done(&box_a, r, 5000);
    double ms = (double)(r->t_done - r->t_sent) / 1000.0;
    fprintf(stderr, "sleep 10 with a 500 ms timeout ended after %.1f ms\n", ms);
    assert_true(r->timed_out);
    assert_int_equal(r->exit_code, -1);
    assert_int_equal(r->sig, 9);
    assert_true(ms >= 490 && ms < 1000);

    /* The timeout kills the whole group, also a child the command left behind. */
    const char *bg[] = {"sh", "-c", "sleep 10 & sleep 10", NULL};
    r = exec_ok(&box_a, bg, &o);
    wait_done(&box_a, r, 5000);
    assert_true(r->timed_out);
    assert_true(r->t_done - r->t_sent < 1000 * 1000);

    r = exec_ok(&box_a, sleep10, NULL);
    assert_true(wait_rec(&box_a, r, 5000, true));
    int64_t t0 = mono_us();
    assert_int_equal(wk_agent_signal(box_a.agent, r->id, SIGTERM), 0);
    wait_done(&box_a, r, 5000);
    assert_int_equal(r->sig, SIGTERM);
    assert_false(r->timed_out);
    assert_true(mono_us() - t0 < 1000 * 1000);

    /* A background process that keeps the output pipe open does not hold the command up for
     * longer than the agent's exit grace. */
    const char *daemon[] = {"sh", "-c", "sleep 30 & echo bg", NULL};
    r = exec_ok(&box_a, daemon, NULL);
    wait_done(&box_a, r, 5000);
    assert_string_equal(r->out, "bg\n");
    assert_int_equal(r->exit_code, 0);
    fprintf(stderr, "command with a background child holding stdout: %.1f ms\n",
            (double)(r->t_done - r->t_sent) / 1000.0);
}

static void test_concurrent(void **state)
{
    (void)state;
    NEED_HOST();
    if (!box_a.agent)
        fail_msg("no channel");
    enum { N = 50 };
    rec_t *r[N];
    char arg[N][16];
    int64_t t0 = mono_us();
    for (int i = 0; i < N; i++) {
        snprintf(arg[i], sizeof(arg[i]), "%d", i);
        const char *argv[] = {"sh", "-c",   "echo out-$1; sleep 0.2; echo err-$1 >&2",
                              "sh", arg[i], NULL};
        r[i] = exec_ok(&box_a, argv, NULL);
    }
    for (int i = 0; i < N; i++) {
        wait_done(&box_a, r[i], 30000);
        char want[32];
        snprintf(want, sizeof(want), "out-%d\n", i);
        assert_string_equal(r[i]->out, want);
        snprintf(want, sizeof(want), "err-%d\n", i);
        assert_string_equal(r[i]->err, want);
        assert_int_equal(r[i]->exit_code, 0);
    }
    fprintf(stderr, "%d concurrent commands done in %.1f ms\n", N,
            (double)(mono_us() - t0) / 1000.0);

    /* The command limit, and a duplicate id. */
    rec_t *s[WK_AGENT_MAX_COMMANDS];
    const char *sleep30[] = {"sleep", "30", NULL};
    t0 = mono_us();
    for (int i = 0; i < WK_AGENT_MAX_COMMANDS; i++)
        s[i] = exec_ok(&box_a, sleep30, NULL);
    int rc;
    exec_rc(&box_a, sleep30, NULL, &rc);
    assert_int_equal(rc, -EBUSY);
    Space__Agent__V1__Exec e = SPACE__AGENT__V1__EXEC__INIT;
    e.cmd_id = s[0]->id;
    e.argv = (char **)sleep30;
    e.n_argv = 2;
    assert_int_equal(wk_agent_exec(box_a.agent, &e), -EEXIST);
    for (int i = 0; i < WK_AGENT_MAX_COMMANDS; i++) {
        if (!wait_rec(&box_a, s[i], 30000, true))
            fail_msg("sleep %d did not start", i);
    }
    fprintf(stderr, "%d sleeps started in %.1f ms\n", WK_AGENT_MAX_COMMANDS,
            (double)(mono_us() - t0) / 1000.0);
    for (int i = 0; i < WK_AGENT_MAX_COMMANDS; i++)
        assert_int_equal(wk_agent_signal(box_a.agent, s[i]->id, SIGKILL), 0);
    for (int i = 0; i < WK_AGENT_MAX_COMMANDS; i++) {
        wait_done(&box_a, s[i], 30000);
        assert_int_equal(s[i]->sig, SIGKILL);
    }
}

static void test_flood(void **state)
{
    (void)state;
    NEED_HOST();
    if (!box_a.agent)
        fail_msg("no channel");
    const char *yes[] = {"sh", "-c", "yes | head -c 50000000", NULL};
    opts_t o = {.flood = true};
    rec_t *f = exec_ok(&box_a, yes, &o);
    /* Wait until the flood is well under way. */
    for (int i = 0; i < 2000; i++) {
        pthread_mutex_lock(&box_a.ch.mu);
        uint64_t got = f->out_total;
        pthread_mutex_unlock(&box_a.ch.mu);
        if (got > (4u << 20))
            break;
        usleep(5000);
    }
    const char *echo[] = {"echo", "beside", NULL};
    rec_t *e = exec_ok(&box_a, echo, NULL);
    wait_done(&box_a, e, 10000);
    double echo_ms = (double)(e->t_done - e->t_sent) / 1000.0;
    pthread_mutex_lock(&box_a.ch.mu);
    uint64_t at = f->out_total;
    pthread_mutex_unlock(&box_a.ch.mu);
    assert_string_equal(e->out, "beside\n");
    wait_done(&box_a, f, 120000);
    double secs = (double)(f->t_done - f->t_sent) / 1e6;
    fprintf(stderr,
            "flood: %llu bytes in %.2f s (%.1f MB/s); echo beside it (at %.1f MB) took %.1f ms\n",
            (unsigned long long)f->out_total, secs, (double)f->out_total / 1e6 / secs,
            (double)at / 1e6, echo_ms);
    assert_true(at < FLOOD_BYTES); /* it really ran beside the flood */
    assert_true(echo_ms < 2000);
    assert_int_equal(f->exit_code, 0);
    assert_int_equal(f->out_total, FLOOD_BYTES);
    assert_int_equal(f->flood_bad, 0);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_latency(void **state)
{
    (void)state;
    NEED_HOST();
    if (!box_a.agent)
        fail_msg("no channel");
    const char *e = getenv("SPACE_AGENT_BENCH");
    long n = e ? strtol(e, NULL, 10) : 200;
    if (n <= 0)
        skip();
    if (n > BENCH_MAX)
        n = BENCH_MAX;
    static int64_t ch_us[BENCH_MAX], rs_us[BENCH_MAX], start_us[BENCH_MAX];
    const char *echo[] = {"echo", "hi", NULL};
    /* Records are reused per round: RECS_MAX bounds what one channel keeps. */
    for (long i = 0; i < n; i++) {
        pthread_mutex_lock(&box_a.ch.mu);
        if (box_a.ch.n > RECS_MAX - 8)
            box_a.ch.n = 0;
        pthread_mutex_unlock(&box_a.ch.mu);
        rec_t *r = exec_ok(&box_a, echo, NULL);
        wait_done(&box_a, r, 10000);
        assert_string_equal(r->out, "hi\n");
        ch_us[i] = r->t_done - r->t_sent;
        start_us[i] = r->t_started - r->t_sent;
    }
    char out[64];
    for (long i = 0; i < n; i++) {
        int64_t t0 = mono_us();
        assert_int_equal(runsc_run(&box_a, out, sizeof(out), echo), 0);
        rs_us[i] = mono_us() - t0;
        assert_string_equal(out, "hi\n");
    }
    qsort(ch_us, (size_t)n, sizeof(int64_t), cmp_i64);
    qsort(rs_us, (size_t)n, sizeof(int64_t), cmp_i64);
    qsort(start_us, (size_t)n, sizeof(int64_t), cmp_i64);
    long mid = n / 2, p99 = (n * 99 + 99) / 100 - 1, last = n - 1;
    fprintf(stderr,
            "echo hi round trip over %ld runs: agent channel median %.2f ms p99 %.2f ms "
            "(min %.2f max %.2f); runsc exec median %.1f ms p99 %.1f ms (min %.1f max %.1f)\n",
            n, (double)ch_us[mid] / 1e3, (double)ch_us[p99] / 1e3, (double)ch_us[0] / 1e3,
            (double)ch_us[last] / 1e3, (double)rs_us[mid] / 1e3, (double)rs_us[p99] / 1e3,
            (double)rs_us[0] / 1e3, (double)rs_us[last] / 1e3);
    fprintf(stderr, "of which Exec sent -> Started (clone + exec in the guest): median %.2f ms\n",
            (double)start_us[mid] / 1e3);
}

/* Any root process in the guest can write to /proc/1/fd/1: the worker drops the channel with
 * a reason and keeps going. */
static void test_garbage(void **state)
{
    (void)state;
    NEED_HOST();
    if (!box_a.agent)
        fail_msg("no channel");
    char out[4096];
    const char *garbage[] = {"sh", "-c", "head -c 1000 /dev/urandom > /proc/1/fd/1", NULL};
    int ex = runsc_run(&box_a, out, sizeof(out), garbage);
    fprintf(stderr, "garbage writer: exit %d %s\n", ex, out);
    assert_int_equal(ex, 0);
    if (!wait_lost(&box_a, 5000))
        fail_msg("channel not lost after garbage");
    fprintf(stderr, "after garbage: on_lost(\"%s\")\n", box_a.ch.lost_why);
    assert_non_null(strstr(box_a.ch.lost_why, "protocol"));
    assert_false(wk_agent_alive(box_a.agent));
    int rc;
    const char *echo[] = {"echo", "hi", NULL};
    exec_rc(&box_a, echo, NULL, &rc);
    assert_int_equal(rc, -EPIPE);
    /* The agent itself is fine: the sandbox still runs commands. */
    assert_int_equal(runsc_run(&box_a, out, sizeof(out), echo), 0);
    wk_agent_close(box_a.agent);
    box_a.agent = NULL;
    assert_int_equal(box_a.ch.unknown, 0);
    assert_int_equal(box_a.ch.after_lost, 0);
}

static void test_kill_agent(void **state)
{
    (void)state;
    NEED_HOST();
    if (!box_b.agent)
        fail_msg("no channel");
    char out[4096];
    const char *echo[] = {"echo", "hi", NULL};
    expect_out(&box_b, echo, NULL, "hi\n");

    /* Signals the agent ignores, from one of its own commands (root). */
    const char *soft[] = {"sh", "-c", "kill -TERM 1; kill -HUP 1; kill -INT 1; echo sent", NULL};
    expect_out(&box_b, soft, NULL, "sent\n");
    expect_out(&box_b, echo, NULL, "hi\n");

    /* SIGSTOP cannot be ignored: does the guest stop its own PID 1? */
    const char *stop[] = {"sh", "-c", "kill -STOP 1; echo stopped", NULL};
    rec_t *r = exec_ok(&box_b, stop, NULL);
    bool done = wait_rec(&box_b, r, 2000, false);
    fprintf(stderr, "kill -STOP 1 from a command: %s\n",
            done ? "ignored (the command's Exited arrived)" : "the agent stopped");
    if (!done) {
        const char *cont[] = {"kill", "-CONT", "1", NULL};
        int ex = runsc_run(&box_b, out, sizeof(out), cont);
        bool resumed = wait_rec(&box_b, r, 5000, false);
        fprintf(stderr, "kill -CONT 1 via runsc exec: exit %d; the command's Exited %s\n", ex,
                resumed ? "arrived" : "never arrived");
    }
    if (!wait_lost(&box_b, 0))
        expect_out(&box_b, echo, NULL, "hi\n");

    /* SIGKILL from a guest process (runsc exec, root). */
    const char *kill9[] = {"kill", "-9", "1", NULL};
    int64_t t0 = mono_us();
    int ex = runsc_run(&box_b, out, sizeof(out), kill9);
    bool lost = wait_lost(&box_b, 5000);
    fprintf(stderr, "kill -9 1 via runsc exec: exit %d; channel %s%s (%.1f ms)\n", ex,
            lost ? "lost: " : "alive", lost ? box_b.ch.lost_why : "",
            (double)(mono_us() - t0) / 1000.0);
    wk_host_sandbox_t *list = NULL;
    size_t n = 0;
    assert_int_equal(wk_host_scan(host, &list, &n), 0);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(list[i].id, box_b.id) == 0)
            fprintf(stderr, "sandbox state after kill -9 1: %s\n",
                    list[i].state == WK_RUNNING   ? "running"
                    : list[i].state == WK_STOPPED ? "stopped"
                                                  : "partial");
    }
    free(list);
    if (lost)
        assert_null(strstr(box_b.ch.lost_why, "protocol"));
    else
        expect_out(&box_b, echo, NULL, "hi\n");
    assert_int_equal(box_b.ch.unknown, 0);
    assert_int_equal(box_b.ch.after_lost, 0);
}

/* A destroy with the channel open ends it with EOF (so nothing else holds the agent's end
 * of the pipe), then nothing is left on the host. */
static void test_destroy(void **state)
{
    (void)state;
    NEED_HOST();
    char err[WK_ERR_MAX] = "";
    /* A and B have lost their channels by now: a third sandbox, with a working one. */
    create_box(&box_c);
    const char *echo[] = {"echo", "hi", NULL};
    expect_out(&box_c, echo, NULL, "hi\n");
    box_t *boxes[] = {&box_a, &box_b, &box_c};
    for (int i = 0; i < 3; i++) {
        box_t *b = boxes[i];
        if (!b->id[0])
            continue;
        bool was_alive = b->agent && wk_agent_alive(b->agent);
        int64_t t0 = mono_us();
        int rc = wk_sandbox_destroy(host, b->id, err);
        if (rc < 0)
            fail_msg("destroy %s: %d %s", b->id, rc, err);
        if (was_alive) {
            if (!wait_lost(b, 5000))
                fail_msg("%s: no on_lost after destroy", b->ch.name);
            fprintf(stderr, "destroy with the channel open: on_lost(\"%s\") after %.1f ms\n",
                    b->ch.lost_why, (double)(mono_us() - t0) / 1000.0);
            assert_null(strstr(b->ch.lost_why, "protocol"));
        }
        wk_agent_close(b->agent);
        b->agent = NULL;
        b->id[0] = '\0';
    }
    wk_host_usage_t u;
    assert_int_equal(wk_host_usage(host, &u), 0);
    if (u.containers || u.subvolumes || u.netns || u.veths || u.cgroups)
        fail_msg("left: containers=%zu subvolumes=%zu netns=%zu veths=%zu cgroups=%zu",
                 u.containers, u.subvolumes, u.netns, u.veths, u.cgroups);
    wk_host_sandbox_t *list = NULL;
    size_t n = 0;
    assert_int_equal(wk_host_scan(host, &list, &n), 0);
    free(list);
    assert_int_equal(n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_and_hello),
        cmocka_unit_test(test_exit_codes),
        cmocka_unit_test(test_env_cwd_uid),
        cmocka_unit_test(test_stdin),
        cmocka_unit_test(test_timeout_and_signal),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_flood),
        cmocka_unit_test(test_latency),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_kill_agent),
        cmocka_unit_test(test_destroy),
    };
    int failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
    return failed ? failed : teardown_failed;
}
