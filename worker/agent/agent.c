/* space-agent: PID 1 of every sandbox. It runs the worker's commands and reaps every process
 * of the sandbox.
 *
 * The channel (proto/agent.proto): frames from the worker on fd 0, frames to the worker on
 * fd 1, each a 4-byte big-endian length and one AgentFrame of at most FRAME_MAX bytes. The
 * agent uses fd 0 and 1 themselves, never copies: `runsc restore` rebinds a restored
 * process' fd 0/1/2 to new pipes (runtime-notes.md), which is how a channel can follow a
 * sandbox through checkpoint and restore.
 *
 * One thread, one poll loop over the channel, a self-pipe for SIGCHLD and the stdin, stdout
 * and stderr pipes of every command. Nothing blocks in the loop except a clone until its exec:
 * frames for the worker wait in a queue (out) that fd 1 drains as the worker reads, and while
 * that queue is above OUT_HIGH the agent stops reading the commands' output, so a command
 * that floods waits for the pipe instead of growing the queue. Each turn reads at most
 * DATA_MAX bytes from each pipe, so one flooding command cannot starve the frames of the
 * others. Stdin for commands is queued the same way; while one command has more than
 * STDIN_HIGH bytes of stdin waiting, the agent stops reading fd 0 (back-pressure to the
 * worker, whose writes then wait).
 *
 * File operations (FileRequest, FileWrite, FileRead) are carried out in agent_files.c, in
 * the same loop; directory watches in agent_watch.c, whose inotify fds are polled here too and
 * whose events are sent only while the output queue is below OUT_HIGH.
 *
 * As PID 1 it must not exit: a bad frame is answered with an Error frame and skipped. A broken
 * channel (EOF on its input, an error writing its output: the worker restarted, or closed the
 * channel on a protocol violation) is dropped, the commands keep running (their output while
 * no channel is up is discarded), and the agent connects again (RECONNECT_MS) to
 * CHAN_SOCKET, the worker's Unix socket for this sandbox (a host socket bind-mounted read-only
 * into the sandbox; runsc --host-uds=open). A new channel starts with a Hello that lists the
 * commands still running, so the worker can follow them again.
 *
 * Built static (glibc or musl), with no NSS: it runs in every template whatever its libc, and
 * reads /etc/passwd itself for a user's home directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "agent.pb-c.h"
#include "agent_files.h"

#ifndef AGENT_VERSION
#define AGENT_VERSION "0"
#endif

#define PROTOCOL        1
#define FRAME_MAX       (128 * 1024) /* proto/agent.proto; worker_agent.h WK_AGENT_FRAME_MAX */
#define DATA_MAX        (64 * 1024)  /* data bytes of one Output frame */
#define MAX_CMDS        256          /* worker_agent.h WK_AGENT_MAX_COMMANDS */
#define CMD_ID_MAX      64
#define OUT_HIGH        (1u << 20)
#define STDIN_HIGH      (1u << 20)
#define IN_READ_MAX     (256 * 1024) /* bytes read from fd 0 per turn */
#define EXIT_GRACE_MS   200
#define GRACE_POLL_MS   50
#define REAP_RETRY_MS   20
#define REAP_SWEEP_MS   1000
#define CHILD_STACK     (64 * 1024)
#define ERR_MSG_MAX     512
#define DEFAULT_PATH    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define PTY_TERM        "xterm-256color" /* envd's TERM in a pty */
#define ARGV_KEPT_N     64               /* agent.proto Running.argv */
#define ARGV_KEPT_BYTES 4096
#define CHAN_SOCKET     "/.space/chan/agent.sock"
/* Connect attempts after a channel broke: every RECONNECT_FAST_MS for the first
 * RECONNECT_FAST_N, then every RECONNECT_MS. A suspend closes the channel moments before the
 * checkpoint freezes the agent, so after the restore it is still in the fast attempts and
 * comes back within a few ms (at 50 ms it took 20-35 ms of every resume); a worker gone for
 * longer costs a failed connect() every RECONNECT_MS. */
#define RECONNECT_MS      50
#define RECONNECT_FAST_MS 5
#define RECONNECT_FAST_N  200

typedef Space__Agent__V1__AgentFrame frame_t;

extern char **environ;

typedef struct {
    uint8_t *p;
    size_t off, len, cap; /* live bytes are p[off .. off + len) */
} bytes_t;

typedef struct {
    char id[CMD_ID_MAX + 1];
    pid_t pid;        /* also the process group: the child calls setsid() */
    bool pty;         /* out_fd[0] and in_fd are the pty's master (out_fd[1] is -1) */
    int out_fd[2];    /* stdout, stderr read ends; -1 after EOF */
    int in_fd;        /* stdin write end; -1 once closed */
    bytes_t in;       /* stdin waiting for the child */
    bool in_eof;      /* close stdin once `in` is written */
    bool reaped;      /* waitpid returned the child; status is valid */
    int status;       /* wait status */
    bool timed_out;   /* killed for its timeout */
    int64_t deadline; /* ms on the monotonic clock; 0 = no timeout */
    int64_t reaped_at;
    unsigned reap_tries; /* loop turns that found its output over but no exit yet */
    /* Its Exec's argv (the first ARGV_KEPT_N within ARGV_KEPT_BYTES) and cwd, for the Hello of
     * a later channel: the worker lists the command by them after a reconnection. */
    char *argv_kept[ARGV_KEPT_N];
    size_t n_argv_kept;
    char *cwd_kept;
    char oom[160]; /* what the memory guard killed of it, for its Exited; "" none */
} cmd_t;

static bytes_t out_q;   /* frames for the worker */
static int chan_in = 0; /* the channel: fds 0 and 1 (pipes) at first, then a socket */
static int chan_out = 1;
static bool out_dead;        /* no channel to write to: frames are dropped */
static bool in_eof;          /* no channel to read from */
static int64_t reconnect_at; /* when down: the next connect attempt (monotonic ms) */
static int reconnect_tries;  /* attempts since the channel broke */
static bytes_t in_buf;       /* bytes from fd 0 not yet a whole frame */
static uint64_t in_skip;     /* bytes of an oversized frame still to discard */
static int sig_pipe[2] = {-1, -1};
static int64_t sweep_at; /* the next waitpid sweep while commands run (monotonic ms) */
static bool sig_seen;    /* the SIGCHLD pipe polled readable this turn: drain it */
static bool reap_more;   /* reap(false) stopped at a zombie: look for more */
static cmd_t *cmds[MAX_CMDS];
static size_t n_cmds;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- byte queues ---- */

static void bytes_reserve(bytes_t *b, size_t more)
{
    if (b->off + b->len + more <= b->cap)
        return;
    if (b->off > 0) {
        memmove(b->p, b->p + b->off, b->len);
        b->off = 0;
        if (b->len + more <= b->cap)
            return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        abort(); /* out of memory: nothing sensible is left to do */
    b->p = p;
    b->cap = cap;
}

static void bytes_append(bytes_t *b, const void *data, size_t n)
{
    if (n == 0)
        return;
    bytes_reserve(b, n);
    memcpy(b->p + b->off + b->len, data, n);
    b->len += n;
}

static void bytes_consume(bytes_t *b, size_t n)
{
    b->off += n;
    b->len -= n;
    if (b->len == 0)
        b->off = 0;
}

static void bytes_free(bytes_t *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ---- the channel ---- */

static int64_t now_ms(void);

/* The channel is gone: both directions stop, queued frames and partial input are dropped, and
 * reconnecting starts. The pipes of the first channel are replaced by /dev/null (fds 0 and 1
 * stay taken, so nothing else lands on them). */
static void channel_down(void)
{
    if (in_eof && out_dead)
        return;
    if (chan_in > 1)
        close(chan_in);
    else {
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
            (void)dup3(null, 0, O_CLOEXEC);
            (void)dup3(null, 1, O_CLOEXEC);
            close(null);
        }
    }
    chan_in = chan_out = -1;
    in_eof = out_dead = true;
    /* Nobody follows the watches any more; the next channel starts without them. */
    agent_watch_stop_all();
    bytes_free(&in_buf);
    bytes_free(&out_q);
    in_skip = 0;
    reconnect_at = now_ms();
    reconnect_tries = 0;
}

/* One attempt to connect to the worker's socket; true when a new channel is up. */
static bool channel_connect(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", CHAN_SOCKET);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return false;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS) {
        close(fd);
        return false;
    }
    chan_in = chan_out = fd;
    in_eof = out_dead = false;
    return true;
}

/* ---- frames to the worker ---- */

static void send_frame(const frame_t *f)
{
    if (out_dead)
        return;
    size_t n = space__agent__v1__agent_frame__get_packed_size(f);
    if (n > FRAME_MAX)
        return; /* cannot happen: every frame built here is bounded */
    bytes_reserve(&out_q, n + 4);
    uint8_t *p = out_q.p + out_q.off + out_q.len;
    p[0] = (uint8_t)(n >> 24);
    p[1] = (uint8_t)(n >> 16);
    p[2] = (uint8_t)(n >> 8);
    p[3] = (uint8_t)n;
    space__agent__v1__agent_frame__pack(f, p + 4);
    out_q.len += n + 4;
}

void agent_send_frame(const frame_t *f)
{
    send_frame(f);
}

/* Writes what fd 1 takes now. An error other than "full" means the worker is gone (EPIPE,
 * SIGPIPE is ignored): from then on frames are dropped, the commands run on. */
static void flush_out(void)
{
    while (out_q.len > 0 && !out_dead) {
        ssize_t w = write(chan_out, out_q.p + out_q.off, out_q.len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN)
            return;
        if (w <= 0) {
            channel_down();
            return;
        }
        bytes_consume(&out_q, (size_t)w);
    }
}

static void send_error(const char *cmd_id, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void send_error(const char *cmd_id, const char *fmt, ...)
{
    char msg[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    Space__Agent__V1__Error e = SPACE__AGENT__V1__ERROR__INIT;
    e.cmd_id = (char *)cmd_id;
    e.message = msg;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_ERROR;
    f.error = &e;
    send_frame(&f);
}

static void send_hello(void)
{
    static Space__Agent__V1__Running run[MAX_CMDS];
    static Space__Agent__V1__Running *runp[MAX_CMDS];
    Space__Agent__V1__Hello h = SPACE__AGENT__V1__HELLO__INIT;
    h.protocol = PROTOCOL;
    h.version = AGENT_VERSION;
    h.pid = (uint32_t)getpid();
    /* Commands of an earlier channel that have not been reported ended. */
    for (size_t i = 0; i < n_cmds; i++) {
        space__agent__v1__running__init(&run[i]);
        run[i].cmd_id = cmds[i]->id;
        run[i].pid = (uint32_t)cmds[i]->pid;
        run[i].pty = cmds[i]->pty;
        run[i].stdin_open = cmds[i]->in_fd >= 0 && !cmds[i]->in_eof;
        run[i].argv = cmds[i]->argv_kept;
        run[i].n_argv = cmds[i]->n_argv_kept;
        run[i].cwd = cmds[i]->cwd_kept;
        runp[i] = &run[i];
    }
    h.running = runp;
    h.n_running = n_cmds;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_HELLO;
    f.hello = &h;
    send_frame(&f);
}

static void send_started(const cmd_t *c)
{
    Space__Agent__V1__Started s = SPACE__AGENT__V1__STARTED__INIT;
    s.cmd_id = (char *)c->id;
    s.pid = (uint32_t)c->pid;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_STARTED;
    f.started = &s;
    send_frame(&f);
}

static void send_output(const cmd_t *c, int stream, const uint8_t *data, size_t len)
{
    Space__Agent__V1__Output o = SPACE__AGENT__V1__OUTPUT__INIT;
    o.cmd_id = (char *)c->id;
    o.stream = (uint32_t)stream;
    o.data.data = (uint8_t *)data;
    o.data.len = len;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_OUTPUT;
    f.output = &o;
    send_frame(&f);
}

static void send_exited(const cmd_t *c)
{
    Space__Agent__V1__Exited e = SPACE__AGENT__V1__EXITED__INIT;
    e.cmd_id = (char *)c->id;
    if (WIFEXITED(c->status)) {
        e.exit_code = WEXITSTATUS(c->status);
    } else {
        e.exit_code = -1;
        e.signal = WIFSIGNALED(c->status) ? (uint32_t)WTERMSIG(c->status) : 0;
    }
    e.timed_out = c->timed_out;
    e.oom = (char *)c->oom;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_EXITED;
    f.exited = &e;
    send_frame(&f);
}

/* ---- commands ---- */

static bool cmd_id_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char ch = s[n];
        if (n >= CMD_ID_MAX ||
            !((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return false;
    }
    return n > 0;
}

static cmd_t *cmd_find(const char *id)
{
    for (size_t i = 0; i < n_cmds; i++) {
        if (strcmp(cmds[i]->id, id) == 0)
            return cmds[i];
    }
    return NULL;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* Descriptors to close at the end of the loop turn, after the frames are written. */
static int close_q[3 * MAX_CMDS];
static size_t n_close_q;

static void close_later(int *fd)
{
    if (*fd < 0)
        return;
    if (n_close_q == sizeof(close_q) / sizeof(close_q[0]))
        close(*fd);
    else
        close_q[n_close_q++] = *fd;
    *fd = -1;
}

static void close_pending(void)
{
    while (n_close_q > 0)
        close(close_q[--n_close_q]);
}

/* Out of memory aborts, as everywhere in the agent. */
static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        abort();
    return d;
}

static void cmd_free(cmd_t *c)
{
    for (size_t i = 0; i < c->n_argv_kept; i++)
        free(c->argv_kept[i]);
    free(c->cwd_kept);
    close_fd(&c->out_fd[0]);
    close_fd(&c->out_fd[1]);
    close_fd(&c->in_fd);
    bytes_free(&c->in);
    free(c);
}

#define NAME_MAX_LEN 64

/* The home directory and name fields of uid's first entry in /etc/passwd; "" when there is
 * none. name holds NAME_MAX_LEN + 1 bytes. */
static void passwd_home(uint32_t uid, char *out, size_t len, char *name)
{
    out[0] = '\0';
    name[0] = '\0';
    FILE *f = fopen("/etc/passwd", "re");
    if (!f)
        return;
    char line[1024];
    bool partial = false;
    while (fgets(line, sizeof(line), f)) {
        size_t n = strlen(line);
        bool whole = n > 0 && line[n - 1] == '\n';
        bool skip = partial; /* the tail of an over-long line */
        partial = !whole;
        if (skip || !whole)
            continue;
        line[n - 1] = '\0';
        /* name:password:uid:gid:gecos:home:shell */
        char *field[7] = {0};
        char *p = line;
        int k = 0;
        for (; k < 7 && p; k++) {
            field[k] = p;
            p = strchr(p, ':');
            if (p)
                *p++ = '\0';
        }
        if (k < 7 || !field[2][0] || !field[5][0])
            continue;
        char *end = NULL;
        errno = 0;
        unsigned long v = strtoul(field[2], &end, 10);
        if (errno || *end || v != uid)
            continue;
        snprintf(out, len, "%s", field[5]);
        snprintf(name, NAME_MAX_LEN + 1, "%s", field[0]);
        break;
    }
    fclose(f);
}

#define HOME_MAX     256
#define HOMES_CACHED 8

/* What passwd_home found, kept while /etc/passwd keeps its identity (device, inode, size,
 * modification and change times): one stat per command instead of reading the file (four
 * system calls more, each ~40 us in the guest). */
static struct {
    bool valid;
    struct stat id;
    size_t n;
    struct {
        uint32_t uid;
        char home[HOME_MAX];
        char name[NAME_MAX_LEN + 1];
    } e[HOMES_CACHED];
} homes;

static bool same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* The home directory of uid from /etc/passwd ("/" when there is none or it is missing), and
 * its name (NAME_MAX_LEN + 1 bytes; "" when there is none). */
static void home_of(uint32_t uid, char *out, size_t len, char *name)
{
    struct stat st;
    snprintf(out, len, "/");
    name[0] = '\0';
    if (stat("/etc/passwd", &st) < 0)
        return;
    if (!homes.valid || !same_file(&homes.id, &st)) {
        homes.valid = true;
        homes.id = st;
        homes.n = 0;
    }
    const char *home = NULL;
    for (size_t i = 0; i < homes.n && !home; i++) {
        if (homes.e[i].uid == uid) {
            home = homes.e[i].home;
            snprintf(name, NAME_MAX_LEN + 1, "%s", homes.e[i].name);
        }
    }
    if (!home) {
        if (homes.n == HOMES_CACHED)
            homes.n = 0;
        homes.e[homes.n].uid = uid;
        passwd_home(uid, homes.e[homes.n].home, sizeof(homes.e[homes.n].home),
                    homes.e[homes.n].name);
        snprintf(name, NAME_MAX_LEN + 1, "%s", homes.e[homes.n].name);
        home = homes.e[homes.n++].home;
    }
    if (home[0] == '/' && stat(home, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(out, len, "%s", home);
}

enum {
    STAGE_DUP = 1,
    STAGE_CAPS,
    STAGE_SETGROUPS,
    STAGE_SETGID,
    STAGE_SETUID,
    STAGE_CHDIR,
    STAGE_EXEC
};

/* Signals the agent must neither die nor stop from (setup). It catches them with a handler
 * that does nothing rather than ignoring them: an ignored disposition survives execve, a
 * handled one is reset to the default by execve itself, so a command starts with default
 * dispositions without the ten sigaction calls per command that restoring them in the child
 * cost (each system call of the guest is ~40 us under gVisor's ptrace platform). */
static const int IGNORED[] = {SIGPIPE, SIGHUP,  SIGINT,  SIGTERM, SIGQUIT,
                              SIGTSTP, SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2};
#define N_IGNORED (sizeof(IGNORED) / sizeof(IGNORED[0]))

/* The agent's own credentials (setup): a command that runs with them needs no
 * setgroups/setgid/setuid in the child. own_creds is false when the agent could not make its
 * supplementary groups what the child's setgroups would make them ({gid}). */
static uid_t own_uid;
static gid_t own_gid;
static bool own_creds;

/* Everything the child needs, prepared by the parent: the child must not allocate. */
typedef struct {
    const char *path; /* resolved program */
    char **argv;      /* argv[0] as given */
    char **sh_argv;   /* {"/bin/sh", path, argv[1..]}: execvp's fallback for ENOEXEC */
    char **envp;
    const char *cwd;
    uid_t uid;
    gid_t gid;
    bool same_creds; /* uid and gid are the agent's own (and its groups {gid}): keep them */
    int fds[3];
    bool ctty; /* fds[0] is a pty slave: make it the controlling terminal */
    /* Written by the child when it cannot exec; the parent reads them after clone returns
     * (the child shares the parent's memory until it execs or exits). */
    volatile int stage, err;
} spawn_t;

/* CAP_SYS_ADMIN (proto/agent.proto, Claim): the init of every sandbox with an agent is
 * given it, for sethostname when the sandbox takes an identity: a warm-pool sandbox at its
 * claim, a fork or snapshot copy after its restore (the restored kernel keeps the source's
 * hostname). The agent alone keeps it, non-dumpable (setup), so no guest process can ptrace
 * it, read or write its memory or take its descriptors (gVisor applies ptrace(2)'s access
 * rules, docs/snapshots.md); every process it starts drops it from all its sets, the bounding
 * set included, before exec, so not even a setuid-root program gets it back. */
static bool holds_admin;

/* Drops CAP_SYS_ADMIN from the calling task's sets (bounding: CAP_SETPCAP, which every
 * sandbox's init has). System calls and the stack only: a vfork child may call it. */
static int drop_sys_admin(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) < 0 && errno != EINVAL)
        return -errno;
    if (syscall(SYS_capget, &hdr, data) < 0)
        return -errno;
    uint32_t bit = 1u << (CAP_SYS_ADMIN % 32);
    size_t i = CAP_SYS_ADMIN / 32;
    data[i].effective &= ~bit;
    data[i].permitted &= ~bit;
    data[i].inheritable &= ~bit;
    if (syscall(SYS_capset, &hdr, data) < 0)
        return -errno;
    return 0;
}

static bool has_sys_admin(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    if (syscall(SYS_capget, &hdr, data) < 0)
        return false;
    return data[CAP_SYS_ADMIN / 32].effective & (1u << (CAP_SYS_ADMIN % 32));
}

/* The child, sharing the agent's memory until it execs or exits: system calls only, and no
 * writes to memory but s->stage and s->err (and errno). */
__attribute__((noreturn)) static void child_run(spawn_t *s)
{
    (void)setsid();
    int stage = STAGE_DUP;
    for (int i = 0; i < 3; i++) {
        if (dup2(s->fds[i], i) < 0)
            goto fail;
    }
    if (s->ctty && ioctl(0, TIOCSCTTY, 0) < 0)
        goto fail;
    stage = STAGE_CAPS;
    if (holds_admin && drop_sys_admin() < 0)
        goto fail;
    if (!s->same_creds) {
        stage = STAGE_SETGROUPS;
        if (setgroups(1, &s->gid) < 0)
            goto fail;
        stage = STAGE_SETGID;
        if (setgid(s->gid) < 0)
            goto fail;
        stage = STAGE_SETUID;
        if (setuid(s->uid) < 0)
            goto fail;
    }
    stage = STAGE_CHDIR;
    if (chdir(s->cwd) < 0)
        goto fail;
    stage = STAGE_EXEC;
    execve(s->path, s->argv, s->envp);
    if (errno == ENOEXEC)
        execve(s->sh_argv[0], s->sh_argv, s->envp);
fail:
    s->err = errno;
    s->stage = stage;
    _exit(127);
}

static int child_main(void *arg)
{
    child_run(arg);
}

/* The child's stack until it execs (CHILD_STACK bytes; it needs a few hundred). */
static uint8_t child_stack[CHILD_STACK] __attribute__((aligned(16)));

/* name looked up in the PATH of envp as execvp does (a name with a '/' is taken as is): the
 * first regular file with an execute bit. NULL when there is none. */
static const char *resolve(const char *name, char *const *envp, char *buf, size_t len)
{
    if (strchr(name, '/'))
        return name;
    const char *path = "";
    for (size_t i = 0; envp[i]; i++) {
        if (strncmp(envp[i], "PATH=", 5) == 0)
            path = envp[i] + 5;
    }
    for (const char *p = path;;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        int w = n ? snprintf(buf, len, "%.*s/%s", (int)n, p, name) : snprintf(buf, len, "%s", name);
        struct stat st;
        if (w > 0 && (size_t)w < len && stat(buf, &st) == 0 && S_ISREG(st.st_mode) &&
            (st.st_mode & 0111))
            return buf;
        if (!end)
            return NULL;
        p = end + 1;
    }
}

/* A pipe, close-on-exec, with one end non-blocking (the agent's; the child's stays blocking,
 * as programs expect of their stdio). */
static int pipe_nb(int p[2], int nonblock_end)
{
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    (void)fcntl(p[nonblock_end], F_SETFL, O_NONBLOCK);
    return 0;
}

/* A command's three pipes (stdin, stdout, stderr), made ahead by pipes_fill at the end of a
 * loop turn, while the previous command runs or nothing does: a command's start then does not
 * wait for the five system calls they take. The agent's ends are non-blocking. */
static int spare[6] = {-1, -1, -1, -1, -1, -1};

static void pipes_fill(void)
{
    int p[6] = {-1, -1, -1, -1, -1, -1};
    if (spare[0] >= 0)
        return;
    if (pipe_nb(p, 1) < 0 || pipe_nb(p + 2, 0) < 0 || pipe_nb(p + 4, 0) < 0) {
        int saved = errno;
        for (int i = 0; i < 6; i++)
            if (p[i] >= 0)
                close(p[i]);
        errno = saved;
        return;
    }
    memcpy(spare, p, sizeof(spare));
}

/* The spare pipes (made now if there are none); -1 with errno when they cannot be made. */
static int pipes_take(int in[2], int out[2], int err[2])
{
    pipes_fill();
    if (spare[0] < 0)
        return -1;
    in[0] = spare[0];
    in[1] = spare[1];
    out[0] = spare[2];
    out[1] = spare[3];
    err[0] = spare[4];
    err[1] = spare[5];
    for (int i = 0; i < 6; i++)
        spare[i] = -1;
    return 0;
}

/* A new pseudo-terminal of rows x cols: *master non-blocking (the agent's end), *slave for the
 * child. -1 with errno on failure. */
static int pty_open(uint32_t rows, uint32_t cols, int *master, int *slave)
{
    char name[128];
    *master = *slave = -1;
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
    if (m < 0)
        return -1;
    if (grantpt(m) < 0 || unlockpt(m) < 0 || ptsname_r(m, name, sizeof(name)) != 0)
        goto fail;
    struct winsize ws = {.ws_row = (unsigned short)(rows ? rows : 24),
                         .ws_col = (unsigned short)(cols ? cols : 80)};
    if (ioctl(m, TIOCSWINSZ, &ws) < 0)
        goto fail;
    int sl = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (sl < 0)
        goto fail;
    *master = m;
    *slave = sl;
    return 0;
fail:;
    int saved = errno;
    close(m);
    errno = saved;
    return -1;
}

static void do_exec(const Space__Agent__V1__Exec *e)
{
    if (!e->cmd_id || !cmd_id_valid(e->cmd_id)) {
        send_error("", "exec: invalid cmd_id");
        return;
    }
    const char *id = e->cmd_id;
    if (cmd_find(id)) {
        send_error(id, "duplicate cmd_id");
        return;
    }
    if (n_cmds >= MAX_CMDS) {
        send_error(id, "too many commands (%d)", MAX_CMDS);
        return;
    }
    if (e->n_argv == 0 || !e->argv[0][0]) {
        send_error(id, "empty argv");
        return;
    }

    char home[HOME_MAX], path[4096], name[NAME_MAX_LEN + 1];
    char home_env[HOME_MAX + 5], user_env[NAME_MAX_LEN + 6], logname_env[NAME_MAX_LEN + 9];
    spawn_t s;
    memset(&s, 0, sizeof(s));
    home_of(e->uid, home, sizeof(home), name);
    s.cwd = e->cwd;
    if (!s.cwd || !s.cwd[0])
        s.cwd = home;
    s.uid = (uid_t)e->uid;
    s.gid = (gid_t)e->gid;
    s.same_creds = own_creds && s.uid == own_uid && s.gid == own_gid;
    /* argv and env point into the decoded frame, which outlives the child's exec. */
    s.argv = calloc(e->n_argv + 1, sizeof(char *));
    s.sh_argv = calloc(e->n_argv + 2, sizeof(char *));
    s.envp = calloc(e->n_env + 6, sizeof(char *));
    if (!s.argv || !s.sh_argv || !s.envp)
        abort();
    for (size_t i = 0; i < e->n_argv; i++)
        s.argv[i] = e->argv[i];
    /* What a login would set (login(1), envd): PATH, HOME, USER and LOGNAME of the user the
     * command runs as, TERM for a pty; the command's own env wins. */
    bool has_path = false, has_home = false, has_user = false, has_logname = false;
    bool has_term = false;
    for (size_t i = 0; i < e->n_env; i++) {
        s.envp[i] = e->env[i];
        has_path |= strncmp(e->env[i], "PATH=", 5) == 0;
        has_home |= strncmp(e->env[i], "HOME=", 5) == 0;
        has_user |= strncmp(e->env[i], "USER=", 5) == 0;
        has_logname |= strncmp(e->env[i], "LOGNAME=", 8) == 0;
        has_term |= strncmp(e->env[i], "TERM=", 5) == 0;
    }
    size_t ne = e->n_env;
    if (!has_path)
        s.envp[ne++] = DEFAULT_PATH;
    if (!has_home) {
        snprintf(home_env, sizeof(home_env), "HOME=%s", home);
        s.envp[ne++] = home_env;
    }
    if (!has_user && name[0]) {
        snprintf(user_env, sizeof(user_env), "USER=%s", name);
        s.envp[ne++] = user_env;
    }
    if (!has_logname && name[0]) {
        snprintf(logname_env, sizeof(logname_env), "LOGNAME=%s", name);
        s.envp[ne++] = logname_env;
    }
    if (!has_term && e->pty)
        s.envp[ne++] = "TERM=" PTY_TERM;

    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    int master = -1, slave = -1, master_w = -1;
    cmd_t *c = NULL;
    s.path = resolve(s.argv[0], s.envp, path, sizeof(path));
    if (!s.path) {
        send_error(id, "exec %.200s: %s", s.argv[0], strerror(ENOENT));
        goto out;
    }
    s.sh_argv[0] = "/bin/sh";
    s.sh_argv[1] = (char *)s.path;
    for (size_t i = 1; i < e->n_argv; i++)
        s.sh_argv[i + 1] = s.argv[i];
    if (e->pty) {
        if (pty_open(e->rows, e->cols, &master, &slave) < 0 ||
            (master_w = fcntl(master, F_DUPFD_CLOEXEC, 3)) < 0) {
            send_error(id, "pty: %s", strerror(errno));
            goto out;
        }
        s.fds[0] = s.fds[1] = s.fds[2] = slave;
        s.ctty = true;
    } else {
        if (pipes_take(in, out, err) < 0) {
            send_error(id, "pipe: %s", strerror(errno));
            goto out;
        }
        s.fds[0] = in[0];
        s.fds[1] = out[1];
        s.fds[2] = err[1];
    }
    /* CLONE_VM | CLONE_VFORK, as posix_spawn does: under gVisor's ptrace platform every new
     * address space is a host process, and fork + exec makes two where this makes one (half
     * the cost of a command: 6.3 -> 2.9 ms for `echo hi`). The child runs on its own stack and
     * only makes system calls (child_run); the agent is single-threaded, so one stack does. */
    pid_t pid =
        clone(child_main, child_stack + sizeof(child_stack), CLONE_VM | CLONE_VFORK | SIGCHLD, &s);
    if (pid < 0) {
        send_error(id, "fork: %s", strerror(errno));
        goto out;
    }
    /* Here the child has exec'd or exited. When it could not exec, the SIGCHLD handling reaps
     * it as an unknown pid. */
    if (s.stage) {
        const char *what = strerror(s.err);
        switch (s.stage) {
        case STAGE_CHDIR:
            send_error(id, "cwd %.200s: %s", s.cwd, what);
            break;
        case STAGE_EXEC:
            send_error(id, "exec %.200s: %s", s.argv[0], what);
            break;
        case STAGE_SETUID:
            send_error(id, "setuid %u: %s", e->uid, what);
            break;
        case STAGE_DUP:
            send_error(id, "%s: %s", s.ctty ? "controlling tty" : "stdio", what);
            break;
        case STAGE_CAPS:
            send_error(id, "dropping CAP_SYS_ADMIN: %s", what);
            break;
        case STAGE_SETGID:
        case STAGE_SETGROUPS:
            send_error(id, "setgid %u: %s", e->gid, what);
            break;
        default:
            send_error(id, "start: %s", what);
            break;
        }
        goto out;
    }

    c = calloc(1, sizeof(*c));
    if (!c)
        abort();
    snprintf(c->id, sizeof(c->id), "%s", id);
    c->pid = pid;
    for (size_t i = 0, bytes = 0; i < e->n_argv && i < ARGV_KEPT_N; i++) {
        bytes += strlen(e->argv[i]) + 1;
        if (bytes > ARGV_KEPT_BYTES)
            break;
        c->argv_kept[c->n_argv_kept++] = xstrdup(e->argv[i]);
    }
    c->cwd_kept = xstrdup(e->cwd ? e->cwd : "");
    if (e->pty) {
        /* One master, two descriptors: stdin can be closed apart from the output. */
        c->pty = true;
        c->out_fd[0] = master;
        c->out_fd[1] = -1;
        c->in_fd = master_w;
        master = master_w = -1;
    } else {
        c->out_fd[0] = out[0];
        c->out_fd[1] = err[0];
        c->in_fd = in[1];
        out[0] = err[0] = in[1] = -1;
    }
    if (e->timeout_ms)
        c->deadline = now_ms() + e->timeout_ms;
    bytes_append(&c->in, e->stdin_data.data, e->stdin_data.len);
    /* A terminal's input stays open: its end is the ^D the client types. */
    c->in_eof = !e->stdin_open && !e->pty;
    if (c->in_eof && c->in.len == 0)
        close_fd(&c->in_fd);
    cmds[n_cmds++] = c;
    if (n_cmds == 1)
        sweep_at = now_ms() + REAP_SWEEP_MS; /* the sweeps start with the first command */
    send_started(c);
out:
    for (int i = 0; i < 2; i++) {
        close_fd(&in[i]);
        close_fd(&out[i]);
        close_fd(&err[i]);
    }
    close_fd(&master);
    close_fd(&master_w);
    close_fd(&slave);
    free(s.argv);
    free(s.sh_argv);
    free(s.envp);
}

static void do_stdin(const Space__Agent__V1__Stdin *s)
{
    /* A command that has just ended, or an unknown one, is not an error the worker could act
     * on (it would race with Exited): ignored. */
    cmd_t *c = s->cmd_id ? cmd_find(s->cmd_id) : NULL;
    if (!c || c->in_fd < 0 || c->in_eof)
        return;
    bytes_append(&c->in, s->data.data, s->data.len);
    if (s->eof) {
        /* On a terminal the end of input is a ^D in canonical mode (the line discipline turns it
         * into a zero read), not a close: the master stays open for the output. */
        if (c->pty)
            bytes_append(&c->in, "\x04", 1);
        c->in_eof = true;
        if (c->in.len == 0)
            close_fd(&c->in_fd);
    }
}

static void do_resize(const Space__Agent__V1__Resize *r)
{
    cmd_t *c = r->cmd_id ? cmd_find(r->cmd_id) : NULL;
    if (!c || !c->pty || c->out_fd[0] < 0 || r->rows == 0 || r->cols == 0 || r->rows > 10000 ||
        r->cols > 10000)
        return;
    struct winsize ws = {.ws_row = (unsigned short)r->rows, .ws_col = (unsigned short)r->cols};
    /* The kernel sends SIGWINCH to the terminal's foreground group. */
    (void)ioctl(c->out_fd[0], TIOCSWINSZ, &ws);
}

static void do_signal(const Space__Agent__V1__Signal *s)
{
    cmd_t *c = s->cmd_id ? cmd_find(s->cmd_id) : NULL;
    if (!c || s->signal == 0 || s->signal >= (uint32_t)NSIG)
        return;
    (void)kill(-c->pid, (int)s->signal);
}

/* Claim: the sandbox takes its identity, its id as the hostname (holds_admin above). */
static bool hostname_ok(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char ch = s[n];
        if (n >= 64 ||
            !((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return false;
    }
    return n > 0;
}

static void do_claim(const Space__Agent__V1__Claim *c)
{
    char msg[ERR_MSG_MAX] = "";
    const char *name = c->hostname ? c->hostname : "";
    if (!hostname_ok(name))
        snprintf(msg, sizeof(msg), "hostname must be [a-z0-9_-], 1..64 chars");
    else if (sethostname(name, strlen(name)) < 0)
        snprintf(msg, sizeof(msg), "sethostname: %s", strerror(errno));
    Space__Agent__V1__Claimed d = SPACE__AGENT__V1__CLAIMED__INIT;
    d.error = msg;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_CLAIMED;
    f.claimed = &d;
    send_frame(&f);
}

/* MemInfoRequest: /proc/meminfo's MemTotal, MemAvailable and Cached, in bytes. A line that is
 * missing counts 0; values are clamped to MemTotal, as the worker requires. */
static void do_meminfo(void)
{
    static const char *const keys[] = {"MemTotal:", "MemAvailable:", "Cached:"};
    uint64_t v[3] = {0, 0, 0};
    char line[256];
    FILE *f = fopen("/proc/meminfo", "re");
    while (f && fgets(line, sizeof(line), f)) {
        for (size_t i = 0; i < 3; i++) {
            size_t k = strlen(keys[i]);
            if (strncmp(line, keys[i], k) == 0)
                v[i] = strtoull(line + k, NULL, 10) * 1024;
        }
    }
    if (f)
        fclose(f);
    Space__Agent__V1__MemInfo m = SPACE__AGENT__V1__MEM_INFO__INIT;
    m.total = v[0];
    m.available = v[1] < v[0] ? v[1] : v[0];
    m.cached = v[2] < v[0] ? v[2] : v[0];
    frame_t fr = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    fr.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_MEMINFO;
    fr.meminfo = &m;
    send_frame(&fr);
}

static void handle_frame(const uint8_t *p, size_t n)
{
    frame_t *f = space__agent__v1__agent_frame__unpack(NULL, n, p);
    if (!f) {
        send_error("", "undecodable frame of %zu bytes", n);
        return;
    }
    switch (f->msg_case) {
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_EXEC:
        do_exec(f->exec);
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_STDIN:
        do_stdin(f->stdin);
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_SIGNAL:
        do_signal(f->signal);
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_RESIZE:
        do_resize(f->resize);
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_CLAIM:
        do_claim(f->claim);
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_MEMINFO_REQUEST:
        do_meminfo();
        break;
    default:
        /* File operations live in agent_files.c. */
        if (!agent_files_handle(f))
            send_error("", "unexpected frame (case %d)", (int)f->msg_case);
        break;
    }
    space__agent__v1__agent_frame__free_unpacked(f, NULL);
}

/* Reads what fd 0 has (bounded per turn) and handles every whole frame in it. */
static void read_channel(void)
{
    uint8_t tmp[16384];
    size_t budget = IN_READ_MAX;
    while (budget > 0 && !in_eof) {
        uint8_t *dst = tmp;
        size_t want = sizeof(tmp);
        if (in_skip == 0) {
            bytes_reserve(&in_buf, sizeof(tmp));
            dst = in_buf.p + in_buf.off + in_buf.len;
        } else if (want > in_skip) {
            want = (size_t)in_skip;
        }
        ssize_t r = read(chan_in, dst, want);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        if (r <= 0) {
            /* The worker is gone (or the pipe broke): commands keep running, see above. */
            channel_down();
            return;
        }
        budget -= (size_t)r < budget ? (size_t)r : budget;
        if (in_skip > 0) {
            in_skip -= (uint64_t)r;
            continue;
        }
        in_buf.len += (size_t)r;
        while (in_buf.len >= 4) {
            const uint8_t *p = in_buf.p + in_buf.off;
            uint32_t len = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
            if (len > FRAME_MAX) {
                send_error("", "frame of %u bytes exceeds %d: skipped", len, FRAME_MAX);
                size_t have = in_buf.len - 4;
                size_t drop = have < len ? have : len;
                bytes_consume(&in_buf, 4 + drop);
                in_skip = len - drop;
                break;
            }
            if (in_buf.len < 4 + (size_t)len)
                break;
            handle_frame(p + 4, len);
            bytes_consume(&in_buf, 4 + (size_t)len);
        }
        /* A short read took all there was: poll says when more comes (one read less). */
        if ((size_t)r < want)
            return;
    }
}

/* ---- children ---- */

static void on_ignored(int sig)
{
    (void)sig;
}

static void on_sigchld(int sig)
{
    (void)sig;
    int saved = errno;
    (void)!write(sig_pipe[1], "c", 1);
    errno = saved;
}

/* Every zombie in the sandbox is ours to reap (PID 1): commands, and any orphan. With all
 * false it stops at the first one and leaves the rest to the end of the loop turn (reap_more),
 * after the Exited frame it may allow has been written: one waitpid less before it. */
static bool reap(bool all)
{
    bool any = false;
    for (;;) {
        int st = 0;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p < 0 && errno == EINTR)
            continue;
        if (p <= 0)
            return any;
        any = true;
        bool cmd = false;
        for (size_t i = 0; i < n_cmds && !cmd; i++) {
            if (cmds[i]->pid == p && !cmds[i]->reaped) {
                cmds[i]->reaped = true;
                cmds[i]->status = st;
                cmds[i]->reaped_at = now_ms();
                cmd = true;
            }
        }
        if (!cmd)
            (void)agent_files_reaped(p, st);
        if (!all) {
            reap_more = true;
            return true;
        }
    }
}

static void read_output(cmd_t *c, int stream)
{
    static uint8_t buf[DATA_MAX];
    int *fd = &c->out_fd[stream - 1];
    for (;;) {
        ssize_t r = read(*fd, buf, sizeof(buf));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        if (r <= 0) {
            close_fd(fd);
            return;
        }
        send_output(c, stream, buf, (size_t)r);
        return;
    }
}

static void write_stdin(cmd_t *c)
{
    while (c->in.len > 0) {
        ssize_t w = write(c->in_fd, c->in.p + c->in.off, c->in.len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN)
            return;
        if (w <= 0) {
            /* The command closed its stdin: what is left has no reader. */
            bytes_free(&c->in);
            close_fd(&c->in_fd);
            return;
        }
        bytes_consume(&c->in, (size_t)w);
    }
    if (c->in_eof)
        close_fd(&c->in_fd);
}

/* Exited frames for the commands that have exited and whose output is over. */
static void send_ended(void)
{
    for (size_t i = 0; i < n_cmds;) {
        cmd_t *c = cmds[i];
        if (c->reaped && c->out_fd[0] < 0 && c->out_fd[1] < 0) {
            send_exited(c);
            cmd_free(c);
            cmds[i] = cmds[--n_cmds];
            continue;
        }
        i++;
    }
}

/* ---- main loop ---- */

enum { P_SIG, P_IN, P_OUT, P_CMD_STDOUT, P_CMD_STDERR, P_CMD_STDIN, P_WATCH };

static void setup(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_ignored;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    /* SIGPIPE: a write to a command's closed stdin or to a vanished worker is an error
     * return. The others: PID 1 does not stop or end on a job-control or terminal signal. */
    for (size_t i = 0; i < N_IGNORED; i++)
        (void)sigaction(IGNORED[i], &sa, NULL);
    /* Before anything else: no guest process may ptrace the agent or open its memory. */
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    holds_admin = has_sys_admin();
    own_uid = getuid();
    own_gid = getgid();
    own_creds = setgroups(1, &own_gid) == 0;

    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        abort();
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    (void)sigaction(SIGCHLD, &sa, NULL);

    for (int fd = 0; fd <= 2; fd++) {
        int fl = fcntl(fd, F_GETFD);
        if (fl >= 0)
            (void)fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    }
    /* Non-blocking channel: a guest process that reads /proc/1/fd/0 could take the bytes poll
     * announced, and a full fd 1 must not stop the loop. */
    for (int fd = 0; fd <= 1; fd++) {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0)
            (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    }
    (void)!chdir("/");
}

/* The memory guard killed pid (agent_memory.c): the command it belongs to says so when it
 * exits. A process in a session of its own (a daemon a command started) names no command. */
static void on_oom(pid_t pid, pid_t sid, const char *comm, uint64_t rss_kib, uint64_t total_kib)
{
    if (pid == 0)
        return;
    for (size_t i = 0; i < n_cmds; i++) {
        cmd_t *c = cmds[i];
        if (c->pid != sid || c->oom[0])
            continue;
        snprintf(c->oom, sizeof(c->oom),
                 "out of memory: %s (pid %d, %llu MiB resident) was killed at the sandbox's "
                 "%llu MiB",
                 comm, (int)pid, (unsigned long long)(rss_kib / 1024),
                 (unsigned long long)(total_kib / 1024));
        return;
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    setup();
    send_hello();
    flush_out();

    static struct pollfd pfd[3 + 3 * MAX_CMDS + AGENT_MAX_WATCHES];
    static struct {
        int kind;
        cmd_t *c;
    } what[3 + 3 * MAX_CMDS + AGENT_MAX_WATCHES];
    for (;;) {
        nfds_t n = 0;
        pfd[n] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        what[n].c = NULL;
        what[n++].kind = P_SIG;
        bool stdin_full = false;
        for (size_t i = 0; i < n_cmds; i++)
            stdin_full |= cmds[i]->in.len > STDIN_HIGH;
        if (in_eof && out_dead && now_ms() >= reconnect_at) {
            if (channel_connect()) {
                send_hello();
                flush_out();
            } else {
                bool fast = reconnect_tries < RECONNECT_FAST_N;
                reconnect_at = now_ms() + (fast ? RECONNECT_FAST_MS : RECONNECT_MS);
                reconnect_tries += fast;
            }
        }
        if (!in_eof && !stdin_full) {
            pfd[n] = (struct pollfd){.fd = chan_in, .events = POLLIN};
            what[n].c = NULL;
            what[n++].kind = P_IN;
        }
        if (out_q.len > 0 && !out_dead) {
            pfd[n] = (struct pollfd){.fd = chan_out, .events = POLLOUT};
            what[n].c = NULL;
            what[n++].kind = P_OUT;
        }
        bool read_children = out_dead || out_q.len < OUT_HIGH;
        int64_t now = now_ms(), wake = -1;
        for (size_t i = 0; i < n_cmds; i++) {
            cmd_t *c = cmds[i];
            for (int s = 0; s < 2 && read_children; s++) {
                if (c->out_fd[s] < 0)
                    continue;
                pfd[n] = (struct pollfd){.fd = c->out_fd[s], .events = POLLIN};
                what[n].kind = s == 0 ? P_CMD_STDOUT : P_CMD_STDERR;
                what[n++].c = c;
            }
            if (c->in_fd >= 0 && c->in.len > 0) {
                pfd[n] = (struct pollfd){.fd = c->in_fd, .events = POLLOUT};
                what[n].kind = P_CMD_STDIN;
                what[n++].c = c;
            }
            if (c->deadline && !c->timed_out && (wake < 0 || c->deadline < wake))
                wake = c->deadline;
            /* SIGCHLD alone is not trusted to say when a child exits: with CLONE_VFORK,
             * this gVisor (Debian's runsc, 2022-12) left about one in a thousand exits of a
             * short command without a SIGCHLD wake-up, its zombie unreaped (none in 4000
             * runs with fork). So waitpid is retried: soon once a command's output is over,
             * and every REAP_SWEEP_MS while any command runs. */
            if (!c->reaped) {
                int64_t retry = sweep_at;
                if (c->out_fd[0] < 0 && c->out_fd[1] < 0)
                    retry = now + (c->reap_tries++ < 5 ? 1 : REAP_RETRY_MS);
                if (wake < 0 || retry < wake)
                    wake = retry;
            }
            /* After the exit grace, look again every GRACE_POLL_MS for idle pipes. */
            int64_t grace = c->reaped_at + EXIT_GRACE_MS;
            if (c->reaped && grace <= now)
                grace = read_children ? now + GRACE_POLL_MS : -1;
            if (c->reaped && grace >= 0 && (wake < 0 || grace < wake))
                wake = grace;
        }
        for (size_t k = agent_watch_pollfds(pfd + n, AGENT_MAX_WATCHES); k > 0; k--) {
            what[n].c = NULL;
            what[n++].kind = P_WATCH;
        }
        if (agent_files_children() && (wake < 0 || sweep_at < wake))
            wake = sweep_at; /* a remover's exit, found by the sweep below too */
        if (in_eof && out_dead && (wake < 0 || reconnect_at < wake))
            wake = reconnect_at;
        int64_t mem = agent_memory_next(n_cmds > 0);
        if (mem >= 0 && (wake < 0 || mem < wake))
            wake = mem;
        int timeout = -1;
        if (wake >= 0)
            timeout = wake <= now ? 0 : (int)(wake - now > 60000 ? 60000 : wake - now);

        int pr = poll(pfd, n, timeout);
        if (pr < 0 && errno != EINTR)
            pr = 0; /* cannot happen with valid arguments; do not spin on it either */

        for (nfds_t i = 0; pr > 0 && i < n; i++) {
            short re = pfd[i].revents;
            if (!re)
                continue;
            cmd_t *c = what[i].c;
            switch (what[i].kind) {
            case P_SIG:
                /* The pipe is drained at the end of the turn, after the frames are out. */
                sig_seen = true;
                reap(false);
                sweep_at = now_ms() + REAP_SWEEP_MS;
                break;
            case P_IN:
                read_channel();
                break;
            case P_OUT:
                flush_out();
                break;
            case P_CMD_STDOUT:
            case P_CMD_STDERR:
                if (!c->pty && (re & POLLHUP) && !(re & POLLIN)) {
                    /* A pipe with no writer and nothing in it: EOF, without the read that
                     * would say so (a system call on the exit's path), closed once the turn's
                     * frames are out. A pty's master is read to its end. */
                    close_later(&c->out_fd[what[i].kind == P_CMD_STDOUT ? 0 : 1]);
                } else if (out_dead) {
                    /* Nobody to send to: keep the command from blocking on a full pipe. */
                    char sink[DATA_MAX];
                    int *fd = &c->out_fd[what[i].kind == P_CMD_STDOUT ? 0 : 1];
                    ssize_t r = read(*fd, sink, sizeof(sink));
                    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                        close_fd(fd);
                } else {
                    read_output(c, what[i].kind == P_CMD_STDOUT ? 1 : 2);
                }
                break;
            case P_CMD_STDIN:
                if (c->in_fd >= 0)
                    write_stdin(c);
                break;
            case P_WATCH:
                agent_watch_ready(pfd[i].fd);
                break;
            }
        }
        /* waitpid again (not trusting SIGCHLD, see above) when a command's output is over, and
         * every REAP_SWEEP_MS: not after every turn, which cost a system call each. */
        now = now_ms();
        agent_memory_look(now, n_cmds > 0, on_oom);
        bool due = now >= sweep_at;
        for (size_t i = 0; i < n_cmds && !due; i++)
            due = !cmds[i]->reaped && cmds[i]->out_fd[0] < 0 && cmds[i]->out_fd[1] < 0;
        if (due) {
            reap(true);
            sweep_at = now + REAP_SWEEP_MS;
        }

        for (size_t i = 0; i < n_cmds; i++) {
            cmd_t *c = cmds[i];
            /* The timeout covers the whole group, also what the command left running. */
            if (c->deadline && !c->timed_out && now >= c->deadline &&
                (!c->reaped || c->out_fd[0] >= 0 || c->out_fd[1] >= 0)) {
                (void)kill(-c->pid, SIGKILL);
                c->timed_out = true;
            }
            /* The command has exited, but something it started (in another session, or
             * a daemon) still holds its output pipes: after a grace period that found the
             * pipes idle, the command is over. */
            if (c->reaped && now >= c->reaped_at + EXIT_GRACE_MS && read_children) {
                for (int s = 0; s < 2; s++) {
                    bool busy = false;
                    for (nfds_t k = 0; k < n; k++) {
                        if (pfd[k].fd == c->out_fd[s] && what[k].c == c && pr > 0 &&
                            (pfd[k].revents & POLLIN))
                            busy = true;
                    }
                    if (!busy)
                        close_fd(&c->out_fd[s]);
                }
            }
        }
        send_ended();
        if (!out_dead)
            agent_watch_send(out_q.len < OUT_HIGH ? OUT_HIGH - out_q.len : 0);
        flush_out();
        /* What could wait until the frames were out: the rest of the zombies (and the Exited
         * frames they allow), the SIGCHLD pipe, closing pipes found at their end, the next
         * command's pipes. */
        if (reap_more) {
            reap_more = false;
            if (reap(true)) {
                send_ended();
                flush_out();
            }
        }
        if (sig_seen) {
            char drain[64];
            while (read(sig_pipe[0], drain, sizeof(drain)) == (ssize_t)sizeof(drain))
                ;
            sig_seen = false;
        }
        close_pending();
        pipes_fill();
    }
}
