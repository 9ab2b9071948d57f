/* What every daemon's main does with signals: SIGTERM and SIGINT ask for a stop (the daemon
 * finishes what it is doing and exits 0), SIGPIPE is ignored (writes to a closed pipe or
 * socket fail with EPIPE instead of killing the process). */
#ifndef SPACE_DAEMON_H
#define SPACE_DAEMON_H

#include <signal.h>
#include <stdatomic.h>

/* Set to 1 by SIGTERM or SIGINT once sp_daemon_signals has run. Atomic, not only
 * sig_atomic_t: the handler runs on whichever thread the signal lands on, and every thread
 * reads it (a lock-free atomic is async-signal-safe; TSan saw the race). */
extern atomic_int sp_daemon_stopping;

void sp_daemon_signals(void);
/* Asks for a stop as SIGTERM does: sets sp_daemon_stopping and ends every sp_daemon_sleep_ms
 * at once. Async-signal-safe. */
void sp_daemon_stop(void);
/* Sleeps ms milliseconds, returning early when a stop is asked for (sp_daemon_stop, or a
 * signal once sp_daemon_signals has run). */
void sp_daemon_sleep_ms(int ms);
/* Keeps the daemon's memory (keys, credential values, data keys) out of core dumps: the soft
 * core size limit goes to 0 (the hard one stays, so a child such as a sandbox may raise its
 * own again), and the process is made non-dumpable, which also holds where the host pipes
 * cores to a helper and ignores the limit. Not dumpable is set only in builds without ASan or
 * TSan: LeakSanitizer stops the process's threads through ptrace. Every daemon's main calls it
 * before it loads a secret. */
void sp_daemon_no_core(void);

#endif
