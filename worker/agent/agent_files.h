/* space-agent internals shared by agent.c (the channel and commands) and agent_files.c (file
 * operations). Single-threaded: everything runs on the agent's one poll loop. */
#ifndef SPACE_AGENT_FILES_H
#define SPACE_AGENT_FILES_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent.pb-c.h"

/* Queues one frame for the worker (agent.c). */
void agent_send_frame(const Space__Agent__V1__AgentFrame *f);

/* Carries out a file frame (FileRequest, FileWrite, FileRead) and queues its replies. False
 * when f is not a file frame. */
bool agent_files_handle(const Space__Agent__V1__AgentFrame *f);

/* A child the agent reaped (pid 1 reaps all): when it was a recursive remove's, its result
 * is queued and true is returned. */
bool agent_files_reaped(pid_t pid, int status);
/* Whether such children run (the loop then looks for their exits without waiting for
 * SIGCHLD). */
bool agent_files_children(void);

/* An upload writes "<target's dir>/" AGENT_UPLOAD_TMP_PREFIX "<xfer>-XXXXXX" and renames it
 * onto the target at commit: watches hide these names and report the target instead. */
#define AGENT_UPLOAD_TMP_PREFIX ".space-upload-"
/* Whether the newest of the last uploads committed onto path replaced a file there: 1 yes,
 * 0 no (it created the file), -1 none of them was to path. */
int agent_files_upload_replaced(const char *path);

/* The memory guard (agent_memory.c): when the next look at the guest's free memory is due
 * (monotonic ms; -1: never, sysinfo fails), busy when a command runs (looks come sooner), and
 * the look itself, due or not (it returns at once when not). A kill is reported through
 * killed: the victim, its session (the command it belongs to, whose pid is its session), its
 * name, its resident KiB and the guest's total in KiB; pid 0 once when memory is low but no
 * process is large enough to be the cause. */
typedef void (*agent_oom_fn)(pid_t pid, pid_t sid, const char *comm, uint64_t rss_kib,
                             uint64_t total_kib);
int64_t agent_memory_next(bool busy);
void agent_memory_look(int64_t now, bool busy, agent_oom_fn killed);

/* The agent.proto FileFailed code of an errno (agent_files.c). */
const char *agent_errno_code(int e);

/* Watches (agent_watch.c). */
/* FILE_OP_WATCH: opens the watch (FileResult) or refuses it (FileFailed). */
void agent_watch_open(const Space__Agent__V1__FileRequest *r);
/* Ends watch id without a reply (CLOSE answers for it); false when id is no watch. */
bool agent_watch_close(uint64_t id);
/* Ends every watch (the channel broke). */
void agent_watch_stop_all(void);
/* Fills pfd with the inotify fds to poll (at most max); how many. */
size_t agent_watch_pollfds(struct pollfd *pfd, size_t max);
/* Reads what the inotify fd has (bounded) into its watch's queue. */
void agent_watch_ready(int fd);
/* Sends queued events, about budget bytes of frames at most, and ends the watches whose
 * directory went away once their events are out. */
void agent_watch_send(size_t budget);
#define AGENT_MAX_WATCHES 16 /* per sandbox; worker.h WK_WATCH_MAX */

#endif
