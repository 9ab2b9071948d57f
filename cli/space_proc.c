/* Process tools for the local stack (contract in space_proc.h). */
#include "space_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <netdb.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define COMM_MAX 15 /* TASK_COMM_LEN - 1: the kernel truncates process names to this */

extern char **environ;

/* -errno after a failed call, never 0 (which would read as success). */
static int neg_errno(void)
{
    return errno > 0 ? -errno : -EIO;
}

long long sp_proc_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sp_proc_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int sp_proc_user_lookup(const char *name, sp_proc_user_t *ret_user)
{
    struct passwd *pw;
    sp_proc_user_t u = {0};

    errno = 0;
    pw = getpwnam(name);
    if (!pw)
        return errno ? neg_errno() : -ENOENT;
    u.uid = pw->pw_uid;
    u.gid = pw->pw_gid;
    u.ngroups = SP_PROC_MAX_GROUPS;
    if (getgrouplist(name, pw->pw_gid, u.groups, &u.ngroups) < 0)
        return -E2BIG;
    *ret_user = u;
    return 0;
}

int sp_proc_become(const sp_proc_user_t *user)
{
    if (setgroups((size_t)user->ngroups, user->groups) < 0)
        return neg_errno();
    if (setgid(user->gid) < 0)
        return neg_errno();
    if (setuid(user->uid) < 0)
        return neg_errno();
    return 0;
}

/* Runs in the forked child: reports errno through fd (close-on-exec, so an exec that succeeds
 * closes it and the parent reads end-of-file) and never returns. Only async-signal-safe calls
 * here, apart from close_range. */
static void child_exec(const sp_proc_spec_t *spec, int fd) __attribute__((noreturn));
static void child_exec(const sp_proc_spec_t *spec, int fd)
{
    sigset_t none;
    int err, in, out;

    /* The caller (a shell, CTest) may ignore or block signals; a daemon starts clean. */
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    /* Keep the report pipe clear of the descriptors we are about to replace. */
    if (fd <= STDERR_FILENO) {
        int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
        if (moved < 0)
            goto fail;
        fd = moved;
    }
    if (spec->detach && setsid() < 0)
        goto fail;

    in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0)
        goto fail;
    if (spec->log_path)
        out = open(spec->log_path, O_WRONLY | O_CREAT | O_APPEND | O_NOCTTY | O_CLOEXEC, 0640);
    else
        out = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (out < 0)
        goto fail;
    if (dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 || dup2(out, STDERR_FILENO) < 0)
        goto fail;

    /* Whatever the caller had open (a CTest pipe, a lock) must not live on in a daemon: it
     * would keep the caller waiting for end-of-file or hold its lock. */
    if (close_range(STDERR_FILENO + 1, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
        goto fail;

    if (spec->as && sp_proc_become(spec->as) < 0)
        goto fail;
    if (chdir(spec->cwd ? spec->cwd : "/") < 0)
        goto fail;
    execve(spec->path, spec->argv, spec->envp ? spec->envp : environ);

fail:
    err = errno ? errno : EIO;
    while (write(fd, &err, sizeof(err)) < 0 && errno == EINTR)
        ;
    _exit(127);
}

int sp_proc_spawn(const sp_proc_spec_t *spec, pid_t *ret_pid)
{
    int pfd[2], err = 0, r;
    ssize_t n;
    pid_t pid;

    if (pipe2(pfd, O_CLOEXEC) < 0)
        return neg_errno();
    pid = fork();
    if (pid < 0) {
        r = neg_errno();
        close(pfd[0]);
        close(pfd[1]);
        return r;
    }
    if (pid == 0) {
        close(pfd[0]);
        child_exec(spec, pfd[1]);
    }
    close(pfd[1]);
    do
        n = read(pfd[0], &err, sizeof(err));
    while (n < 0 && errno == EINTR);
    close(pfd[0]);
    if (n == (ssize_t)sizeof(err)) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        return -err;
    }
    *ret_pid = pid;
    return 0;
}

int sp_proc_reap(pid_t pid, int *ret_status)
{
    int status;
    pid_t r;

    do
        r = waitpid(pid, &status, WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return neg_errno();
    if (r == 0)
        return 0;
    if (ret_status)
        *ret_status = status;
    return 1;
}

int sp_proc_wait_exit(pid_t pid, int timeout_ms, int *ret_status)
{
    long long deadline = sp_proc_now_ms() + timeout_ms;
    int r;

    for (;;) {
        r = sp_proc_reap(pid, ret_status);
        if (r != 0)
            return r < 0 ? r : 0;
        if (timeout_ms >= 0 && sp_proc_now_ms() >= deadline)
            return -ETIMEDOUT;
        sp_proc_sleep_ms(10);
    }
}

/* Reads name, state and start time (ticks since boot) of pid from /proc/<pid>/stat. */
static int proc_stat(pid_t pid, char comm[COMM_MAX + 1], char *ret_state,
                     unsigned long long *ret_start)
{
    char path[64], buf[1024], *open_paren, *close_paren, *p, *end;
    ssize_t n;
    size_t len;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return neg_errno();
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -EIO;
    buf[n] = '\0';

    /* "pid (comm) S ppid ...": comm may itself hold spaces and parentheses. */
    open_paren = strchr(buf, '(');
    close_paren = strrchr(buf, ')');
    if (!open_paren || !close_paren || close_paren < open_paren || close_paren[1] != ' ')
        return -EIO;
    len = (size_t)(close_paren - open_paren - 1);
    if (len > COMM_MAX)
        len = COMM_MAX;
    memcpy(comm, open_paren + 1, len);
    comm[len] = '\0';
    *ret_state = close_paren[2];

    /* Field 3 is the state; starttime is field 22, i.e. 19 fields further. */
    p = close_paren + 2;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -EIO;
        p++;
    }
    errno = 0;
    *ret_start = strtoull(p, &end, 10);
    if (errno || end == p)
        return -EIO;
    return 0;
}

static bool comm_matches(const char *actual, const char *want)
{
    const char *base = strrchr(want, '/');
    size_t len;

    base = base ? base + 1 : want;
    len = strlen(base);
    if (len > COMM_MAX)
        len = COMM_MAX;
    return strlen(actual) == len && strncmp(actual, base, len) == 0;
}

static bool alive_since(pid_t pid, const char *comm, unsigned long long *ret_start)
{
    char actual[COMM_MAX + 1], state = 0;
    unsigned long long start = 0;

    if (pid <= 0 || proc_stat(pid, actual, &state, &start) < 0)
        return false;
    /* A zombie (Z) or dying (X) process is gone for our purposes; its parent may never reap it
     * (a container's pid 1 is not always a real init). */
    if (state == 'Z' || state == 'X')
        return false;
    if (comm && !comm_matches(actual, comm))
        return false;
    if (ret_start)
        *ret_start = start;
    return true;
}

bool sp_proc_alive(pid_t pid, const char *comm)
{
    return alive_since(pid, comm, NULL);
}

int sp_proc_pidfile_write(const char *path, pid_t pid)
{
    char tmp[PATH_MAX], actual[COMM_MAX + 1], buf[64], state;
    unsigned long long start = 0;
    int fd, len, r;

    r = proc_stat(pid, actual, &state, &start);
    if (r < 0)
        return r;
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    len = snprintf(buf, sizeof(buf), "%d\n%llu\n", (int)pid, start);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return neg_errno();
    if (write(fd, buf, (size_t)len) != len) {
        r = errno ? neg_errno() : -EIO;
        close(fd);
        unlink(tmp);
        return r;
    }
    if (close(fd) < 0 || rename(tmp, path) < 0) {
        r = neg_errno();
        unlink(tmp);
        return r;
    }
    return 0;
}

int sp_proc_pidfile_check(const char *path, const char *comm, pid_t *ret_pid)
{
    char buf[256], *line2, *end;
    unsigned long long want_start = 0, start;
    bool check_start = false;
    long pid;
    ssize_t n;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : neg_errno();
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n < 0)
        return neg_errno();
    buf[n] = '\0';

    errno = 0;
    pid = strtol(buf, &end, 10);
    if (errno || end == buf || (*end != '\n' && *end != '\0') || pid <= 0 || pid > INT_MAX)
        return 0;
    line2 = *end == '\n' ? end + 1 : end;
    if (*line2 >= '0' && *line2 <= '9') {
        errno = 0;
        want_start = strtoull(line2, &end, 10);
        check_start = errno == 0 && (*end == '\n' || *end == '\0');
    }
    if (!alive_since((pid_t)pid, comm, &start))
        return 0;
    if (check_start && start != want_start)
        return 0;
    *ret_pid = (pid_t)pid;
    return 1;
}

static bool wait_gone(pid_t pid, const char *comm, int timeout_ms)
{
    long long deadline = sp_proc_now_ms() + timeout_ms;

    for (;;) {
        /* Reap it if it happens to be our own child; ignore -ECHILD otherwise. */
        (void)sp_proc_reap(pid, NULL);
        if (!sp_proc_alive(pid, comm))
            return true;
        if (sp_proc_now_ms() >= deadline)
            return false;
        sp_proc_sleep_ms(20);
    }
}

int sp_proc_stop(pid_t pid, const char *comm, int sig, int timeout_ms)
{
    if (!sp_proc_alive(pid, comm))
        return 0;
    if (kill(pid, sig) < 0)
        return errno == ESRCH ? 0 : neg_errno();
    if (wait_gone(pid, comm, timeout_ms))
        return 0;
    if (kill(pid, SIGKILL) < 0)
        return errno == ESRCH ? 0 : neg_errno();
    return wait_gone(pid, comm, 5000) ? 1 : -ETIMEDOUT;
}

int sp_proc_tcp_probe(const char *host, int port)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res, *ai;
    char service[16];
    int r = -ECONNREFUSED, fd;

    snprintf(service, sizeof(service), "%d", port);
    if (getaddrinfo(host, service, &hints, &res) != 0)
        return -EHOSTUNREACH;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            r = neg_errno();
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            close(fd);
            r = 0;
            break;
        }
        r = neg_errno();
        close(fd);
    }
    freeaddrinfo(res);
    return r;
}

void sp_proc_log_tail(const char *path, size_t max_bytes, FILE *out)
{
    char buf[65536], *p;
    struct stat st;
    off_t from;
    ssize_t n;
    int fd;

    if (max_bytes > sizeof(buf) - 1)
        max_bytes = sizeof(buf) - 1;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return;
    }
    from = st.st_size > (off_t)max_bytes ? st.st_size - (off_t)max_bytes : 0;
    n = pread(fd, buf, max_bytes, from);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = '\0';
    p = buf;
    if (from > 0) {
        char *nl = strchr(p, '\n');
        p = nl ? nl + 1 : p;
    }
    while (*p) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);

        fprintf(out, "    | %.*s\n", (int)len, p);
        p += len + (nl ? 1 : 0);
    }
}
