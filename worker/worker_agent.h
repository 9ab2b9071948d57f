/* The worker's end of the agent channel of one sandbox: length-prefixed AgentFrame messages
 * (proto/agent.proto; 4-byte big-endian length) over two pipes that are the stdin and stdout
 * of the sandbox's PID 1, space-agent (worker/agent/).
 *
 * Everything read from the agent is untrusted (any root process in the guest can write to
 * /proc/1/fd/1): every frame is size-checked before decoding (WK_AGENT_FRAME_MAX), decoded,
 * validated (known cmd_id, stream 1 or 2, data within limits, Exited once per command), and
 * rate-limited; a violation closes the channel and reports it through on_lost with a reason.
 * Output beyond the per-command cap is dropped and counted, never buffered.
 *
 * Threads: a reader thread per channel runs the callbacks (one at a time, in frame order);
 * wk_agent_exec/stdin/signal may be called from any thread. Callbacks must not call
 * wk_agent_close.
 */
#ifndef SPACE_WORKER_AGENT_H
#define SPACE_WORKER_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent.pb-c.h"

#define WK_AGENT_FRAME_MAX (128 * 1024) /* a frame larger than this is a protocol violation */
#define WK_AGENT_DATA_MAX  (64 * 1024)  /* data bytes of one Output frame */

typedef struct wk_agent wk_agent_t;

typedef struct {
    void (*on_started)(void *arg, const char *cmd_id, uint32_t pid);
    /* stream 1 = stdout, 2 = stderr; data borrowed for the call. */
    void (*on_output)(void *arg, const char *cmd_id, int stream, const uint8_t *data, size_t len);
    /* Last callback of a command: no on_output for it follows. oom: "" or what the agent's
     * memory guard killed of it (sanitized text), borrowed for the call. */
    void (*on_exited)(void *arg, const char *cmd_id, int exit_code, int signal, bool timed_out,
                      const char *oom);
    /* The agent could not carry out a request for cmd_id (bad cwd, exec failed, ...); the
     * command is over: no other callback for it follows. */
    void (*on_error)(void *arg, const char *cmd_id, const char *message);
    /* The channel is gone (EOF, read error, protocol violation: why says which). Commands
     * still running are lost; no other callback follows. */
    void (*on_lost)(void *arg, const char *why);

    /* Files (one transfer id per request; see wk_agent_file_request). Everything passed is
     * borrowed for the call and already checked against what was asked: */
    /* The final reply to a FileRequest: info may be NULL. */
    void (*on_file_result)(void *arg, uint64_t xfer, const Space__Agent__V1__FileResult *r);
    /* A FileRequest, a write or a read failed; the agent holds nothing for xfer any more.
     * code is one of the agent.proto codes, message sanitized text. */
    void (*on_file_failed)(void *arg, uint64_t xfer, const char *code, const char *message);
    /* Bytes [0, acked) of a write are written. */
    void (*on_file_ack)(void *arg, uint64_t xfer, uint64_t acked);
    /* Bytes of a read, in order; done when the read's length is covered or eof. */
    void (*on_file_data)(void *arg, uint64_t xfer, uint64_t offset, const uint8_t *data, size_t len,
                         bool eof, bool done);
    /* Part of a list, before its on_file_result. */
    void (*on_file_entries)(void *arg, uint64_t xfer, Space__Agent__V1__FileInfo **entries,
                            size_t n);
    /* Watches (a FILE_OP_WATCH transfer; these replace the on_file_* callbacks for it): the
     * agent opened it; events, 1..WK_AGENT_WATCH_EVENTS of them, each of a known type with a
     * path of 1..WK_AGENT_PATH_MAX bytes (not checked against the watched directory: the
     * caller knows it); the agent refused or ended it (the transfer is over; not called for the
     * CLOSE the caller asked for, nor for events crossing that CLOSE). */
    void (*on_watch_started)(void *arg, uint64_t xfer);
    void (*on_watch_events)(void *arg, uint64_t xfer, Space__Agent__V1__WatchEvent **events,
                            size_t n);
    void (*on_watch_ended)(void *arg, uint64_t xfer, const char *code, const char *message);
    void *arg;
} wk_agent_callbacks_t;

/* Takes ownership of the two fds (closed by wk_agent_close, or before it returns when it
 * fails), starts the reader thread and waits up to hello_timeout_ms for the agent's Hello:
 * SP_ETIMEOUT without one, -EPROTO when the first frame is not a valid Hello, -EPIPE when the
 * channel closed first. */
int wk_agent_open(int to_agent_fd, int from_agent_fd, const char *sandbox_id,
                  const wk_agent_callbacks_t *cb, int hello_timeout_ms, wk_agent_t **ret_agent);
/* Sends an Exec (the caller fills it; cmd_id must be unique on this channel). -EBUSY when
 * WK_AGENT_MAX_COMMANDS are running; -EPIPE when the channel is lost. */
#define WK_AGENT_MAX_COMMANDS 256
int wk_agent_exec(wk_agent_t *a, const Space__Agent__V1__Exec *exec);
/* Any len (sent in frames of WK_AGENT_DATA_MAX). stdin and signal: -ENOENT when cmd_id is
 * not running (it may have just exited). */
int wk_agent_stdin(wk_agent_t *a, const char *cmd_id, const uint8_t *data, size_t len, bool eof);
int wk_agent_signal(wk_agent_t *a, const char *cmd_id, int sig);
/* The pty size of a command started with pty (1..WK_AGENT_PTY_MAX each). */
#define WK_AGENT_PTY_MAX 10000
int wk_agent_resize(wk_agent_t *a, const char *cmd_id, uint32_t rows, uint32_t cols);
/* The commands the agent's Hello listed as still running (a channel after the agent's first:
 * it reconnected). They are known on this channel (their output and exit are accepted). The
 * array lives until wk_agent_close. */
#define WK_AGENT_ARGV_KEPT_N     64   /* Running.argv kept: at most so many arguments */
#define WK_AGENT_ARGV_KEPT_BYTES 4096 /* and bytes (NULs included); the rest is dropped */
typedef struct {
    char id[65];
    uint32_t pid;
    bool pty, stdin_open;
    /* What the agent says the command is (the guest's word: text for lists, nothing else):
     * n_argv NUL-terminated strings in argv, and cwd. */
    char argv[WK_AGENT_ARGV_KEPT_BYTES];
    size_t n_argv;
    char cwd[4097];
} wk_agent_running_t;
size_t wk_agent_running(wk_agent_t *a, const wk_agent_running_t **ret);
/* Files. A transfer id is reserved first (so the caller can register it before any reply
 * can arrive), then used for requests. A request gets exactly one final reply (on_file_result
 * or on_file_failed); WRITE_OPEN and READ_OPEN results leave the transfer open for file_write /
 * file_read until a COMMIT or CLOSE result or a failure; any other final reply ends it. A frame
 * naming a transfer id this channel never issued is a protocol violation; one naming an ended
 * or released transfer is dropped. -EBUSY beyond WK_AGENT_MAX_XFERS transfers, -ENOENT for a
 * transfer not in the state the call needs (or busy with another request), -EPIPE when the
 * channel is lost. */
#define WK_AGENT_MAX_XFERS    64
#define WK_AGENT_READ_MAX     (256 * 1024) /* bytes of one file_read */
#define WK_AGENT_LIST_MAX     10000        /* entries of one list */
#define WK_AGENT_PATH_MAX     4096         /* bytes of a path or symlink target */
#define WK_AGENT_WATCH_EVENTS 1024         /* events of one WatchEvents frame */
int wk_agent_file_reserve(wk_agent_t *a, uint64_t *ret_xfer);
/* Forgets a transfer (frames for it are dropped from now on). The agent may still hold it
 * open: send CLOSE instead when it does. */
void wk_agent_file_release(wk_agent_t *a, uint64_t xfer);
/* r->xfer_id: a reserved transfer; COMMIT and CLOSE need it open, other ops need it idle. */
int wk_agent_file_request(wk_agent_t *a, const Space__Agent__V1__FileRequest *r);
/* Sends len bytes at offset (the end of what was sent before) in frames of at most
 * WK_AGENT_DATA_MAX; each is acknowledged through on_file_ack. Blocks while the pipe is full. */
int wk_agent_file_write(wk_agent_t *a, uint64_t xfer, uint64_t offset, const uint8_t *data,
                        size_t len);
/* Asks for length (<= WK_AGENT_READ_MAX) bytes at offset; one read at a time per transfer. */
int wk_agent_file_read(wk_agent_t *a, uint64_t xfer, uint64_t offset, uint32_t length);

/* Gives a sandbox its identity (proto/agent.proto Claim): its hostname, for a warm-pool
 * sandbox at its claim (docs/pools.md) or a copy after its restore. Once per channel
 * (-EALREADY after).
 * 0 when the agent answered that it did; -EIO with its reason in err when it could not;
 * SP_ETIMEOUT without an answer in timeout_ms; -EPIPE when the channel is lost. */
int wk_agent_claim(wk_agent_t *a, const char *hostname, int timeout_ms, char err[256]);

/* The guest's view of its memory (proto/agent.proto MemInfo), bytes. */
typedef struct {
    uint64_t total, available, cached;
} wk_agent_meminfo_t;
/* The agent's latest MemInfo into *ret (-ENODATA when it has answered none yet), and asks
 * for the next one unless a question is open or the channel is busy writing: for a sampler,
 * which reads each time the answer to its previous question. Never waits for the agent. */
int wk_agent_meminfo(wk_agent_t *a, wk_agent_meminfo_t *ret);

/* Whether the channel is still up. */
bool wk_agent_alive(wk_agent_t *a);
/* Stops the reader, closes the fds, frees. Accepts NULL. */
void wk_agent_close(wk_agent_t *a);

#endif
