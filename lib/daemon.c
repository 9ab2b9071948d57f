/* Signals and stoppable sleeps for the daemons (daemon.h). */
#include "daemon.h"

#include <errno.h>
#include <time.h>

atomic_int sp_daemon_stopping;

static void on_stop(int sig)
{
    (void)sig;
    sp_daemon_stopping = 1;
}

void sp_daemon_signals(void)
{
    struct sigaction sa = {.sa_handler = on_stop};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void sp_daemon_sleep_ms(int ms)
{
    /* In slices, so that a stop is noticed even if the signal lands between two checks. */
    while (ms > 0 && !sp_daemon_stopping) {
        int slice = ms < 50 ? ms : 50;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)slice * 1000000};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR && !sp_daemon_stopping)
            ;
        ms -= slice;
    }
}
