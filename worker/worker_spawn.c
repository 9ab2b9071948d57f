/* Running helper programs (runsc, mount, mkfs.btrfs, template scripts) from a threaded daemon.
 *
 * Between fork and exec the child calls only async-signal-safe functions (POSIX 2017, 2.4.3):
 * everything it needs (argv, fds) is prepared by the parent. Every descriptor the worker
 * opens is O_CLOEXEC and the child closes all but 0-2 besides, so a concurrent create in
 * another thread never leaks its pipes into this child (and its sandbox). Signals are
 * blocked around fork and reset to their defaults in the child, as posix_spawn does, so a
 * daemon's handler never runs in the child.
 *
 * The parent waits with a pidfd (Linux 5.3) and a deadline; on timeout it SIGKILLs the child's
 * process group. It waits for the child only, never for EOF on the capture pipe: runsc hands
 * its stdio to the container, which keeps the write end open for its whole life.
 *
 * `runsc create` also gets the two pipes of the agent channel as its stdin and stdout
 * (wk__cmd_t.pass_stdio), which it hands to the container's init: they are dup2'd onto 0 and
 * 1 in the child only, stay close-on-exec in the worker, and the reaper closes everything but
 * its status pipe, so the only holders of the agent's ends are the sandbox and the caller
 * until it closes them.
 *
 * For `runsc create` the command runs under a reaper (reaper_main): a detached process that is
 * a child subreaper for the sandbox and gofer processes create leaves behind, so they are
 * reaped the moment they die. Orphaned to PID 1 instead, a killed sandbox stays a zombie until
 * PID 1 gets to it, and `runsc delete` polls until the pid is gone: on this project's VMs,
 * whose PID 1 reaps about once a second, destroy took 1.1-2 s instead of ~140 ms.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

extern char **environ;

/* A hostile writer could keep a capture pipe full forever; stop draining after this much. */
#define DRAIN_MAX (1u << 20)

int wk__fail(char *err, int rc, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, WK_ERR_MAX, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int64_t wk__now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int wk__find_program(const char *name, char **ret_path)
{
    if (!name || !*name)
        return -EINVAL;
    if (strchr(name, '/')) {
        if (access(name, X_OK) < 0)
            return -errno;
        *ret_path = sp_xstrdup(name);
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    /* Daemons started by init often lack the sbin directories where mkfs.btrfs lives. */
    char *all = sp_xasprintf("%s:/usr/sbin:/sbin:/usr/bin:/bin", path);
    int rc = -ENOENT;
    for (char *save = NULL, *dir = strtok_r(all, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        if (*dir != '/')
            continue;
        char *cand = sp_xasprintf("%s/%s", dir, name);
        if (access(cand, X_OK) == 0) {
            *ret_path = cand;
            rc = 0;
            break;
        }
        free(cand);
    }
    free(all);
    return rc;
}

/* Moves fd to a number >= 3 (close-on-exec), so dup2 onto 0-2 in the child cannot clobber
 * another source descriptor even when the daemon runs with 0-2 closed. */
static int fd_high(int fd)
{
    if (fd < 0 || fd > 2)
        return fd;
    int nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    int saved = errno;
    close(fd);
    errno = saved;
    return nfd;
}

/* In a forked child (before exec, and in the reaper for its whole life) the calls go to the
 * kernel directly, not through libc: a sanitizer intercepts _exit, prctl, write, dup2 and
 * waitpid, and its interceptors take the runtime's locks, which another thread of the worker
 * may have held at the moment of the fork (_Fork runs no atfork handler). Under TSan the
 * child then waited on that lock forever, still holding every descriptor of the worker,
 * other sandboxes' agent channels included (docs/machine-notes.md, "A forked child under
 * TSan"). Without a sanitizer these are the same system calls. */
__attribute__((noreturn)) static void raw_exit(int code)
{
    for (;;)
        (void)syscall(SYS_exit_group, code);
}

static ssize_t raw_write(int fd, const void *p, size_t n)
{
    return (ssize_t)syscall(SYS_write, fd, p, n);
}

static void raw_close_range(unsigned first, unsigned last)
{
    (void)syscall(SYS_close_range, first, last, 0);
}

static void child_fail(const char *what)
{
    /* Only async-signal-safe calls here. */
    const char *e = strerrordesc_np(errno);
    (void)raw_write(2, "space-worker: ", 14);
    (void)raw_write(2, what, strlen(what));
    (void)raw_write(2, ": ", 2);
    if (e)
        (void)raw_write(2, e, strlen(e));
    (void)raw_write(2, "\n", 1);
    raw_exit(127);
}

__attribute__((noreturn)) static void child_exec(const wk__cmd_t *c, int in_fd, int out_fd,
                                                 int err_fd)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP)
            (void)sigaction(sig, &sa, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    (void)syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, (size_t)(_NSIG / 8));
    (void)syscall(SYS_setpgid, 0, 0);

    /* The three are >= 3 (fd_high), so dup3 never sees equal descriptors. */
    if (syscall(SYS_dup3, in_fd, 0, 0) < 0 || syscall(SYS_dup3, out_fd, 1, 0) < 0 ||
        syscall(SYS_dup3, err_fd, 2, 0) < 0)
        raw_exit(127);
    raw_close_range(3, ~0u);

    if (c->netns_wrapper) {
        if (unshare(CLONE_NEWNS) < 0)
            child_fail("unshare(CLONE_NEWNS)");
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            child_fail("make / private");
        if (mount("tmpfs", "/proc/sys/net", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
            child_fail("tmpfs on /proc/sys/net");
    }
    execve(c->argv[0], (char *const *)c->argv, environ);
    child_fail(c->argv[0]);
    raw_exit(127);
}

typedef struct {
    char *out;
    size_t len, cap; /* cap = out_len - 1 */
    size_t total;
} capture_t;

/* Reads what is available; returns 1 on EOF, 0 when it would block, < 0 on error. */
static int capture_read(int fd, capture_t *cap, bool nonblock_drain)
{
    char scratch[4096];
    for (;;) {
        char *dst = scratch;
        size_t want = sizeof(scratch);
        if (cap->out && cap->len < cap->cap) {
            dst = cap->out + cap->len;
            want = cap->cap - cap->len;
        }
        ssize_t n = read(fd, dst, want);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return 0;
            return -errno;
        }
        if (n == 0)
            return 1;
        if (dst != scratch)
            cap->len += (size_t)n;
        cap->total += (size_t)n;
        if (!nonblock_drain || cap->total > DRAIN_MAX)
            return 0;
    }
}

static int pidfd_open_compat(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    errno = ENOSYS;
    return -1;
#endif
}

static void write_all(int fd, const void *p, size_t n)
{
    while (n > 0) {
        ssize_t w = raw_write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p = (const char *)p + w;
        n -= (size_t)w;
    }
}

/* The reaper (wk__cmd_t.reaper): runs in the forked child, async-signal-safe calls only.
 * It detaches (double fork, so the worker never waits for it and it outlives a worker
 * restart), becomes a child subreaper, runs the command as its child W, reports W's pid and
 * then its wait status on status_fd, and reaps whatever is orphaned below it until nothing is
 * left: the sandbox and gofer processes `runsc create` leaves behind. */
__attribute__((noreturn)) static void reaper_main(const wk__cmd_t *c, int in_fd, int out_fd,
                                                  int err_fd, int status_fd)
{
    pid_t s = _Fork();
    if (s != 0)
        raw_exit(s < 0 ? 127 : 0);
    (void)syscall(SYS_setsid);
    (void)syscall(SYS_chdir, "/");
    (void)syscall(SYS_prctl, PR_SET_NAME, "space-reaper", 0, 0, 0);
    (void)syscall(SYS_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    pid_t w = _Fork();
    if (w == 0)
        child_exec(c, in_fd, out_fd, err_fd);
    /* Keep only the status pipe: the reaper lives as long as the sandbox and must not hold
     * the worker's descriptors (other creates' pipes, netns fds, netlink sockets). */
    raw_close_range(0, (unsigned)status_fd - 1);
    raw_close_range((unsigned)status_fd + 1, ~0u);
    int32_t msg = w < 0 ? -1 : (int32_t)w;
    write_all(status_fd, &msg, sizeof(msg));
    if (w < 0)
        raw_exit(127);
    int st = 0;
    while (syscall(SYS_wait4, w, &st, 0, NULL) < 0 && errno == EINTR)
        ;
    msg = st;
    write_all(status_fd, &msg, sizeof(msg));
    (void)syscall(SYS_close, status_fd);
    for (;;) {
        if (syscall(SYS_wait4, -1, NULL, 0, NULL) < 0 && errno == ECHILD)
            raw_exit(0);
    }
}

static int exit_code(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

int wk__run(const wk__cmd_t *c, int *ret_exit)
{
    int rc = 0;
    int devnull = -1, pipefd[2] = {-1, -1}, statfd[2] = {-1, -1}, pidfd = -1;
    int copies[2] = {-1, -1}; /* pass_stdio fds that were 0-2, moved up for the dup2s */
    capture_t cap = {.out = c->out, .cap = c->out_len ? c->out_len - 1 : 0};
    if (c->out && c->out_len)
        c->out[0] = '\0';

    devnull = fd_high(open("/dev/null", O_RDWR | O_CLOEXEC));
    if (devnull < 0)
        return -errno;
    int out_fd = devnull, err_fd = devnull;
    if (c->out_mode == WK_OUT_STDOUT || c->out_mode == WK_OUT_STDERR ||
        c->out_mode == WK_OUT_BOTH) {
        if (pipe2(pipefd, O_CLOEXEC) < 0) {
            rc = -errno;
            goto out;
        }
        pipefd[0] = fd_high(pipefd[0]);
        pipefd[1] = fd_high(pipefd[1]);
        if (pipefd[0] < 0 || pipefd[1] < 0) {
            rc = -EMFILE;
            goto out;
        }
        if (c->out_mode != WK_OUT_STDOUT)
            err_fd = pipefd[1];
        if (c->out_mode != WK_OUT_STDERR)
            out_fd = pipefd[1];
    } else if (c->out_mode == WK_OUT_FD) {
        if (c->out_fd < 0) {
            rc = -EBADF;
            goto out;
        }
        out_fd = err_fd = c->out_fd;
    }
    int in_fd = devnull;
    if (c->pass_stdio) {
        if (c->stdin_fd < 0 || c->stdout_fd < 0 ||
            (c->out_mode != WK_OUT_STDERR && c->out_mode != WK_OUT_NULL)) {
            rc = -EINVAL;
            goto out;
        }
        /* Below 3, the child's dup2 onto 0-2 could overwrite one before it is copied. */
        for (int i = 0; i < 2; i++) {
            int fd = i == 0 ? c->stdin_fd : c->stdout_fd;
            if (fd < 3) {
                copies[i] = fcntl(fd, F_DUPFD_CLOEXEC, 3);
                if (copies[i] < 0) {
                    rc = -errno;
                    goto out;
                }
                fd = copies[i];
            }
            if (i == 0)
                in_fd = fd;
            else
                out_fd = fd;
        }
    }
    if (c->reaper) {
        if (pipe2(statfd, O_CLOEXEC) < 0) {
            rc = -errno;
            goto out;
        }
        statfd[0] = fd_high(statfd[0]);
        statfd[1] = fd_high(statfd[1]);
        if (statfd[0] < 0 || statfd[1] < 0) {
            rc = -EMFILE;
            goto out;
        }
    }

    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    /* _Fork: no atfork handlers, and async-signal-safe, so the reaper may fork again. */
    pid_t pid = _Fork();
    if (pid == 0) {
        if (c->reaper)
            reaper_main(c, in_fd, out_fd, err_fd, statfd[1]);
        child_exec(c, in_fd, out_fd, err_fd);
    }
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        rc = -fork_errno;
        goto out;
    }
    if (pipefd[1] >= 0) {
        close(pipefd[1]);
        pipefd[1] = -1;
    }
    if (statfd[1] >= 0) {
        close(statfd[1]);
        statfd[1] = -1;
    }

    /* With a reaper, pid is the intermediate that exits at once; W's pid and status arrive
     * on the status pipe. Without, pid is the command itself, watched through a pidfd. */
    pid_t cmd = pid;
    int32_t smsg[2];
    size_t sgot = 0;
    if (c->reaper) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        pid = -1;
        cmd = -1;
    } else {
        pidfd = pidfd_open_compat(pid);
    }
    int64_t deadline = wk__now_us() + (int64_t)c->timeout_ms * 1000;
    bool exited = false, timed_out = false;
    int status = 0;
    while (!exited) {
        int64_t left_ms = (deadline - wk__now_us()) / 1000;
        if (left_ms <= 0) {
            timed_out = true;
            break;
        }
        if (c->cancel && *c->cancel) {
            rc = -ECANCELED;
            timed_out = true; /* killed as on a timeout */
            break;
        }
        struct pollfd pfd[2];
        nfds_t n = 0;
        int pi = -1, wi = -1;
        int watch = c->reaper ? statfd[0] : pidfd;
        if (watch >= 0) {
            wi = (int)n;
            pfd[n].fd = watch;
            pfd[n++].events = POLLIN;
        }
        if (pipefd[0] >= 0) {
            pi = (int)n;
            pfd[n].fd = pipefd[0];
            pfd[n++].events = POLLIN;
        }
        /* Without a pidfd, poll in short ticks and ask waitpid. */
        int tick = watch >= 0 ? (int)(left_ms > 1000 ? 1000 : left_ms) : 5;
        int pr = n ? poll(pfd, n, tick) : poll(NULL, 0, tick);
        if (pr < 0 && errno != EINTR) {
            rc = -errno;
            timed_out = true; /* cannot wait any more: kill it */
            break;
        }
        if (pi >= 0 && pr > 0 && (pfd[pi].revents & (POLLIN | POLLHUP | POLLERR))) {
            if (capture_read(pipefd[0], &cap, false) != 0) {
                close(pipefd[0]);
                pipefd[0] = -1;
            }
        }
        if (c->reaper) {
            if (pr > 0 && (pfd[wi].revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t r = read(statfd[0], (char *)smsg + sgot, sizeof(smsg) - sgot);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r <= 0) {
                    rc = -ECHILD; /* the reaper died before it reported */
                    break;
                }
                sgot += (size_t)r;
                if (sgot >= sizeof(smsg[0]))
                    cmd = smsg[0];
                if (sgot == sizeof(smsg)) {
                    status = smsg[1];
                    exited = true;
                }
                if (cmd < 0 && sgot >= sizeof(smsg[0])) {
                    rc = -ECHILD; /* the reaper could not fork */
                    break;
                }
            }
        } else if (pidfd >= 0) {
            if (pr > 0 && (pfd[wi].revents & (POLLIN | POLLHUP)))
                exited = true;
        } else {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                status = st;
                pid = -1;
                exited = true;
            }
        }
    }
    if (timed_out && cmd > 0) {
        kill(-cmd, SIGKILL);
        kill(cmd, SIGKILL);
    }
    if (pid > 0) {
        int st = 0;
        pid_t w;
        do {
            w = waitpid(pid, &st, 0);
        } while (w < 0 && errno == EINTR);
        if (w == pid)
            status = st;
    }
    if (exited && rc == 0 && ret_exit)
        *ret_exit = exit_code(status);
    if (pipefd[0] >= 0) {
        /* What the child wrote before it exited is in the pipe already. */
        int fl = fcntl(pipefd[0], F_GETFL);
        if (fl >= 0 && fcntl(pipefd[0], F_SETFL, fl | O_NONBLOCK) == 0)
            (void)capture_read(pipefd[0], &cap, true);
    }
    if (timed_out && rc == 0)
        rc = SP_ETIMEOUT;

out:
    if (cap.out && c->out_len)
        cap.out[cap.len] = '\0';
    if (pidfd >= 0)
        close(pidfd);
    for (int i = 0; i < 2; i++) {
        if (pipefd[i] >= 0)
            close(pipefd[i]);
        if (statfd[i] >= 0)
            close(statfd[i]);
    }
    for (int i = 0; i < 2; i++) {
        if (copies[i] >= 0)
            close(copies[i]);
    }
    if (devnull >= 0)
        close(devnull);
    return rc;
}

bool wk__process_mentions(const char *needle)
{
    DIR *d = opendir("/proc");
    if (!d)
        return false;
    bool found = false;
    static __thread char buf[8192];
    for (struct dirent *e; !found && (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char path[64];
        snprintf(path, sizeof(path), "/proc/%.20s/cmdline", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        for (ssize_t off = 0; off < n && !found; off += (ssize_t)strlen(buf + off) + 1)
            found = strstr(buf + off, needle) != NULL;
    }
    closedir(d);
    return found;
}
