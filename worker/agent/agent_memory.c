/* The memory guard (docs/faults.md, "Memory"): the process that takes the sandbox past its
 * memory dies, and the sandbox lives.
 *
 * gVisor has no OOM killer in its kernel. Its guest memory is the Sentry's memory file, charged
 * to the sandbox's host memory cgroup, and past that cgroup's limit the host kills the Sentry:
 * every process and /tmp gone. So the worker gives the host cgroup headroom above memory_mb
 * (the guest still sees MemTotal = memory_mb: runsc reads the limit once, when the sandbox
 * boots) and this guard, on the agent's loop, watches the guest's own free memory: once
 * it falls under a low-water mark it SIGKILLs the process with the largest resident
 * set, before the host limit is reached. What the host limit still catches (memory that is no
 * process's: a /tmp filled up; or one allocation larger than the headroom between two looks)
 * ends the sandbox as before, with reason "oom".
 *
 * How often: often enough that a process growing at up to GROWTH_MIB_S is seen before it is
 * MARGIN_MIB past the guest's total (the host's headroom is at least twice that), so the wait
 * is (free + margin) / rate: ~125 ms when memory is nearly gone, ~2 s in an idle 512 MiB
 * sandbox. Faster growth, or a single allocation larger than the headroom, meets the host
 * limit (the whole sandbox ends, reason oom). With no command running, at most one look every
 * IDLE_MS: what is alive then is what outlived its command. A look is one sysinfo(2) (its
 * freeram is gVisor's MemAvailable: measured equal, tmpfs pages counted as used) and the poll
 * wake-up, ~1.2 ms of the Sentry's CPU under the ptrace platform (docs/faults.md). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "agent_files.h"

#define GROWTH_MIB_S   256  /* the growth the looks keep up with */
#define MARGIN_MIB     32   /* half of the least host headroom (WK_MEMORY_HEADROOM_MIN) */
#define IDLE_MS        5000 /* no command running */
#define AFTER_KILL_MS  100  /* the victim's memory is given back before the next look */
#define LOW_WATER_DIV  64   /* free under total / 64 (and under 2 MiB at least) */
#define LOW_WATER_KIB  2048
#define VICTIM_MIN_DIV 16 /* a process under total / 16 resident is not the cause */

static int64_t last_look = -1, busy_wait = 0, hold_until;
static bool off;       /* sysinfo fails: no guard */
static bool told_none; /* low, with no process large enough to be the cause: said once */

/* Total and free memory of the guest in KiB; false when sysinfo fails. */
static bool guest_memory(uint64_t *total, uint64_t *avail)
{
    struct sysinfo si;
    if (sysinfo(&si) < 0)
        return false;
    uint64_t unit = si.mem_unit ? si.mem_unit : 1;
    *total = (uint64_t)si.totalram * unit / 1024;
    *avail = (uint64_t)si.freeram * unit / 1024;
    return *total > 0;
}

/* Resident pages of pid (the second field of /proc/<pid>/statm), 0 when gone. */
static uint64_t resident_pages(const char *pid)
{
    char path[300], buf[128];
    snprintf(path, sizeof(path), "/proc/%s/statm", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *sp = strchr(buf, ' ');
    return sp ? strtoull(sp + 1, NULL, 10) : 0;
}

/* The process's name (/proc/<pid>/comm) into out. */
static void comm_of(pid_t pid, char *out, size_t len)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
    snprintf(out, len, "?");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, len - 1);
    close(fd);
    if (n <= 0)
        return;
    out[n] = '\0';
    for (char *p = out; *p; p++)
        if (*p == '\n' || !isprint((unsigned char)*p))
            *p = '\0';
}

/* The process with the most resident pages, not the agent itself. */
static pid_t largest(uint64_t *ret_pages)
{
    DIR *d = opendir("/proc");
    pid_t best = 0;
    uint64_t best_pages = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        long pid = strtol(e->d_name, NULL, 10);
        if (pid <= 1 || pid == (long)getpid())
            continue;
        uint64_t pages = resident_pages(e->d_name);
        if (pages > best_pages) {
            best_pages = pages;
            best = (pid_t)pid;
        }
    }
    closedir(d);
    *ret_pages = best_pages;
    return best;
}

int64_t agent_memory_next(bool busy)
{
    if (off)
        return -1;
    if (last_look < 0)
        return 0;
    int64_t next = last_look + (busy || busy_wait > IDLE_MS ? busy_wait : IDLE_MS);
    return next > hold_until ? next : hold_until;
}

void agent_memory_look(int64_t now, bool busy, agent_oom_fn killed)
{
    uint64_t total, avail;
    int64_t due = agent_memory_next(busy);
    if (due < 0 || now < due)
        return;
    if (!guest_memory(&total, &avail)) {
        off = true;
        return;
    }
    last_look = now;
    uint64_t low = total / LOW_WATER_DIV > LOW_WATER_KIB ? total / LOW_WATER_DIV : LOW_WATER_KIB;
    busy_wait = (int64_t)((avail / 1024 + MARGIN_MIB) * 1000 / GROWTH_MIB_S);
    if (avail >= low) {
        told_none = false;
        return;
    }
    uint64_t pages = 0;
    pid_t victim = largest(&pages);
    long page_kib = sysconf(_SC_PAGESIZE) / 1024;
    uint64_t kib = pages * (uint64_t)(page_kib > 0 ? page_kib : 4);
    if (!victim || kib < total / VICTIM_MIN_DIV) {
        /* What fills memory is no process's (a tmpfs): the host limit decides. */
        if (!told_none)
            killed(0, 0, "", kib, total);
        told_none = true;
        return;
    }
    char comm[32];
    comm_of(victim, comm, sizeof(comm));
    pid_t sid = getsid(victim);
    if (kill(victim, SIGKILL) == 0) {
        killed(victim, sid, comm, kib, total);
        hold_until = now + AFTER_KILL_MS;
    }
}
