/* Signals and stoppable sleeps for the daemons (daemon.h). */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "ids.h"

atomic_int sp_daemon_stopping;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

void sp_daemon_no_core(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_CORE, &r) == 0) {
        r.rlim_cur = 0;
        (void)setrlimit(RLIMIT_CORE, &r);
    }
#ifndef UNDER_SANITIZER
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
#endif
}

/* Written once by a stop and never read: its read end stays readable from then on, so every
 * sleeper's poll returns, however many there are and whenever they start. */
static int stop_pipe[2] = {-1, -1};
static pthread_once_t stop_pipe_once = PTHREAD_ONCE_INIT;

static void make_stop_pipe(void)
{
    if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        stop_pipe[0] = stop_pipe[1] = -1; /* sleeps fall back to slices */
}

void sp_daemon_stop(void)
{
    /* Async-signal-safe: the flag is a lock-free atomic, write(2) is on POSIX's list. */
    sp_daemon_stopping = 1;
    int fd = stop_pipe[1];
    if (fd >= 0) {
        int saved = errno;
        ssize_t n = write(fd, "", 1);
        (void)n; /* full (stops before): readable already */
        errno = saved;
    }
}

static void on_stop(int sig)
{
    (void)sig;
    sp_daemon_stop();
}

void sp_daemon_signals(void)
{
    pthread_once(&stop_pipe_once, make_stop_pipe);
    struct sigaction sa = {.sa_handler = on_stop};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void sp_daemon_sleep_ms(int ms)
{
    pthread_once(&stop_pipe_once, make_stop_pipe);
    if (stop_pipe[0] < 0) {
        /* In slices, so that a stop is noticed even if the signal lands between two checks. */
        while (ms > 0 && !sp_daemon_stopping) {
            int slice = ms < 50 ? ms : 50;
            struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)slice * 1000000};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR && !sp_daemon_stopping)
                ;
            ms -= slice;
        }
        return;
    }
    /* One wake-up per sleep, not one every 50 ms: idle threads cost the host wake-ups
     * (docs/machine-notes.md, "exec, ninth pass"). A stop makes the pipe readable. */
    const int64_t end_ms = sp_mono_ns() / 1000000 + ms;
    for (int left = ms; left > 0 && !sp_daemon_stopping;
         left = (int)(end_ms - sp_mono_ns() / 1000000)) {
        struct pollfd p = {.fd = stop_pipe[0], .events = POLLIN};
        if (poll(&p, 1, left) > 0)
            return;
    }
}
