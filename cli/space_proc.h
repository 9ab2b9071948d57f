/* Process tools for the local stack: start a program detached from the caller, remember it in a
 * pid file, tell whether it still runs, wait for it to accept connections, stop it with a
 * timeout. Self-contained (libc and Linux /proc only) so it can move to lib/ later.
 *
 * Calls that can fail return 0 (or a documented positive value) on success and a negative errno
 * on failure. Nothing here prints or logs; callers explain failures to the person.
 * Not thread-safe: meant for single-threaded command-line tools.
 */
#ifndef SPACE_CLI_PROC_H
#define SPACE_CLI_PROC_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#define SP_PROC_MAX_GROUPS 64

/* An identity to run a child as, resolved once in the parent (NSS lookups do not belong in a
 * forked child). */
typedef struct {
    uid_t uid;
    gid_t gid;
    int ngroups;
    gid_t groups[SP_PROC_MAX_GROUPS];
} sp_proc_user_t;

/* Looks up a user name; -ENOENT when there is no such user. */
int sp_proc_user_lookup(const char *name, sp_proc_user_t *ret_user);
/* In a child: switches to user for good (groups, gid, uid). -errno on failure. */
int sp_proc_become(const sp_proc_user_t *user);

typedef struct {
    const char *path;         /* program, absolute path; executed as is (no PATH search) */
    char *const *argv;        /* NULL-terminated; argv[0] is what the process sees */
    char *const *envp;        /* NULL: the caller's environment */
    const char *cwd;          /* NULL: "/" */
    const char *log_path;     /* stdout and stderr appended here (created 0640); NULL: /dev/null */
    const sp_proc_user_t *as; /* NULL: keep the caller's identity */
    bool detach;              /* new session (setsid): survives the caller, gets no tty signals */
} sp_proc_spec_t;

/* Forks and executes spec. The child gets stdin from /dev/null, default signal dispositions, an
 * empty signal mask and no file descriptors but 0, 1 and 2, whatever the caller had open.
 * Returns 0 and the pid once the program has been executed; if anything fails before that
 * (log file, cwd, identity, exec), the child's errno is returned and the child is reaped. */
int sp_proc_spawn(const sp_proc_spec_t *spec, pid_t *ret_pid);

/* For a child of this process: 1 and its wait status if it has exited (it is reaped), 0 if it
 * still runs, -errno on failure (-ECHILD: not our child). */
int sp_proc_reap(pid_t pid, int *ret_status);
/* Waits up to timeout_ms (-1: forever) for a child to exit; -ETIMEDOUT if it did not. */
int sp_proc_wait_exit(pid_t pid, int timeout_ms, int *ret_status);

/* True when pid is a live (not zombie) process whose kernel name (comm, 15 bytes at most) is
 * the base name of comm. Pass comm to guard against pid reuse; NULL accepts any name. */
bool sp_proc_alive(pid_t pid, const char *comm);

/* Writes "<pid>\n<start>\n" to path atomically (temporary file + rename), mode 0644, where
 * start is the process' start time in clock ticks since boot (/proc/<pid>/stat field 22): the
 * first line is a plain pid for shell tools, the second tells a reused pid from the original. */
int sp_proc_pidfile_write(const char *path, pid_t pid);
/* Reads the pid on the first line of path (a SPACE pid file or e.g. postmaster.pid) and returns
 * 1 with the pid when that process is alive, has the name comm and, if the file has a start
 * time on its second line, started at that time. Returns 0 when the file is missing or stale,
 * -errno on other failures. */
int sp_proc_pidfile_check(const char *path, const char *comm, pid_t *ret_pid);

/* Sends sig to pid (if it is still alive with name comm), waits up to timeout_ms for it to go,
 * then sends SIGKILL and waits up to 5 s more. Returns 0 when it ended after sig, 1 when it
 * needed SIGKILL, 0 too when it was not running, -ETIMEDOUT when it survived SIGKILL (stuck in
 * the kernel), -errno when it could not be signalled. */
int sp_proc_stop(pid_t pid, const char *comm, int sig, int timeout_ms);

/* Tries one TCP connection to host:port; 0 when it was accepted. */
int sp_proc_tcp_probe(const char *host, int port);

/* Copies the last max_bytes (at most 64 KiB) of the file at path to out, starting at a line
 * boundary; does nothing when the file cannot be read. */
void sp_proc_log_tail(const char *path, size_t max_bytes, FILE *out);

/* Monotonic milliseconds and a sleep, for polling loops. */
long long sp_proc_now_ms(void);
void sp_proc_sleep_ms(int ms);

#endif
