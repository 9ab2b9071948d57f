/* The memory guard (docs/faults.md, "Memory"): the process that takes the sandbox past its
 * memory dies, and the sandbox lives.
 *
 * gVisor has no OOM killer in its kernel. Its guest memory is the Sentry's memory file, charged
 * to the sandbox's host memory cgroup, and past that cgroup's limit the host kills the Sentry:
 * every process and /tmp gone. So the worker gives the host cgroup headroom above memory_mb
 * (the guest still sees MemTotal = memory_mb: runsc reads the limit once, when the sandbox
 * boots) and this guard, on the agent's loop, watches the guest's own /proc/meminfo: once
 * MemAvailable falls under a low-water mark it SIGKILLs the process with the largest resident
 * set, before the host limit is reached. What the host limit still catches (memory that is no
 * process's: a /tmp filled up; or one allocation larger than the headroom between two looks)
 * ends the sandbox as before, with reason "oom".
 *
 * Cost: one open/read/close of /proc/meminfo per look; looks come sooner the less memory is
 * left (every MiB available adds a millisecond, 10..200 ms), so an idle sandbox pays ~5 looks
 * a second and a filling one is looked at every 10 ms. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent_files.h"

#define LOOK_MIN_MS    10
#define LOOK_MAX_MS    200
#define AFTER_KILL_MS  100 /* the victim's memory is given back before the next look */
#define LOW_WATER_DIV  64  /* MemAvailable under MemTotal / 64 (and under 2 MiB at least) */
#define LOW_WATER_KIB  2048
#define VICTIM_MIN_DIV 16 /* a process under MemTotal / 16 resident is not the cause */

static int64_t next_look;
static bool off;       /* /proc/meminfo unreadable: no guard (logged to the channel once) */
static bool told_none; /* low, with no process large enough to be the cause: said once */

/* MemTotal and MemAvailable in KiB; false when unreadable. */
static bool meminfo(uint64_t *total, uint64_t *avail)
{
    char buf[2048];
    int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    const char *t = strstr(buf, "MemTotal:"), *a = strstr(buf, "MemAvailable:");
    if (!t || !a)
        return false;
    *total = strtoull(t + 9, NULL, 10);
    *avail = strtoull(a + 13, NULL, 10);
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

int64_t agent_memory_next(void)
{
    return off ? -1 : next_look;
}

void agent_memory_look(int64_t now, agent_oom_fn killed)
{
    uint64_t total, avail;
    if (off || now < next_look)
        return;
    if (!meminfo(&total, &avail)) {
        off = true;
        return;
    }
    uint64_t low = total / LOW_WATER_DIV > LOW_WATER_KIB ? total / LOW_WATER_DIV : LOW_WATER_KIB;
    uint64_t wait = avail / 1024;
    next_look = now + (int64_t)(wait < LOOK_MIN_MS   ? LOOK_MIN_MS
                                : wait > LOOK_MAX_MS ? LOOK_MAX_MS
                                                     : wait);
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
        next_look = now + AFTER_KILL_MS;
    }
}
