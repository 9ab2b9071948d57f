/* The worker's end of the agent channel (worker_agent.h).
 *
 * The agent is inside the sandbox and so is everything that can write to its stdout: each
 * frame is checked in layers, as the event log checks the bus (docs/architecture.md): the
 * length prefix before any byte is decoded (WK_AGENT_FRAME_MAX), then the protobuf decode,
 * then the frame against the channel's state: Hello exactly once and first, only agent ->
 * worker messages, a cmd_id this worker started and that has not ended, Started once and
 * before any Output or Exited, stream 1 or 2, 1..WK_AGENT_DATA_MAX bytes of data, an exit
 * that is either a code 0..255 or a signal, messages of bounded size. The first violation
 * ends the channel (on_lost "protocol violation: ..."): after one bad frame the stream
 * cannot be trusted to be in sync. An Error frame without a cmd_id is the agent refusing
 * one of our frames; it is counted and dropped (it cannot name a command to end).
 *
 * File frames are checked the same way against the transfer they name (handle_file): a
 * transfer id this channel issued, a reply only to a request in flight, acknowledgements
 * only of bytes sent, read data only at the offset asked for and never more than asked, at
 * most WK_AGENT_LIST_MAX list entries, paths within WK_AGENT_PATH_MAX. A watch is a transfer
 * too: WatchEvents only for an open watch, 1..WK_AGENT_WATCH_EVENTS events of known types.
 *
 * Frames are rate-limited with a token bucket (RATE_FRAMES per second): beyond it the reader
 * slows down rather than fails, which back-pressures the agent through the pipe, so a guest
 * that floods the channel costs the worker bounded CPU. A command's output beyond OUTPUT_CAP
 * bytes is dropped and counted (never buffered).
 *
 * Writes: one frame at a time under a mutex, non-blocking with poll, so close (or a lost
 * channel) wakes a writer that waits for a full pipe. A write to a pipe whose agent is gone
 * fails with EPIPE and raises SIGPIPE: this module assumes the process ignores SIGPIPE (the
 * daemon does, worker/main.c; so does the integration test). MSG_NOSIGNAL is for sockets
 * only.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "worker_agent.h"
#include "xmalloc.h"

#define PROTOCOL    1
#define CMD_ID_MAX  64
#define VERSION_MAX 64
#define MESSAGE_MAX 4096
#define WHY_MAX     256
#define READ_BUF    (2 * (WK_AGENT_FRAME_MAX + 4))
#define RATE_FRAMES 20000.0        /* frames per second, sustained */
#define RATE_BURST  20000.0        /* frames at once */
#define OUTPUT_CAP  (256ull << 20) /* output bytes per command passed to on_output */

typedef Space__Agent__V1__AgentFrame frame_t;

typedef struct {
    char id[CMD_ID_MAX + 1];
    bool started;
    uint64_t out_bytes; /* passed to on_output */
    uint64_t dropped;   /* beyond OUTPUT_CAP */
} cmd_t;

/* A file transfer as the channel sees it: what the agent may send for it next. */
typedef struct {
    uint64_t id;
    int op;     /* the FileOp awaiting its final reply; 0 = none */
    bool open;  /* the agent holds an open write or read */
    bool write; /* open for writing (else reading) */
    bool watch; /* a watch (FILE_OP_WATCH asked, or open) */
    uint64_t sent, acked;
    uint32_t unacked; /* FileWrite frames not yet acknowledged */
    bool reading;     /* a FileRead in progress */
    uint64_t read_at, read_left;
    uint32_t entries; /* list: entries so far */
} xfer_t;

typedef enum { ST_HELLO = 0, ST_UP, ST_FAILED, ST_LOST } state_t;

struct wk_agent {
    char sandbox_id[65];
    wk_agent_callbacks_t cb;
    int to_fd;   /* writers, under wmu */
    int from_fd; /* the reader thread only */
    int wake_fd; /* eventfd, readable once closing or lost: wakes the reader and writers */
    pthread_t reader;

    pthread_mutex_t wmu; /* one frame at a time on to_fd */

    pthread_mutex_t mu; /* guards what follows */
    pthread_cond_t cond;
    state_t state;
    bool opened;  /* wk_agent_open returned success: callbacks may run */
    bool closing; /* wk_agent_close began: no callback any more */
    bool broken;  /* a write failed midway: the stream is not framed any more */
    char why[WHY_MAX];
    cmd_t *cmds[WK_AGENT_MAX_COMMANDS];
    size_t n_cmds;
    wk_agent_running_t *running; /* from the Hello, set before open returns */
    size_t n_running;
    xfer_t *xfers[WK_AGENT_MAX_XFERS];
    size_t n_xfers;
    uint64_t next_xfer; /* the next transfer id to issue; ids below it were issued */
    int claim;          /* 0: no Claim sent; 1: sent, Claimed awaited; 2: answered */
    char claim_error[WHY_MAX];
    bool meminfo_asked;         /* a MemInfoRequest is unanswered */
    bool has_meminfo;           /* meminfo holds an answer */
    wk_agent_meminfo_t meminfo; /* the latest answer */
    uint64_t dropped_frames;    /* file frames for finished transfers */

    /* The reader thread's own. */
    double tokens;
    int64_t refill_us;
    uint64_t ignored_errors;
};

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static bool cmd_id_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char ch = s[n];
        if (n >= CMD_ID_MAX ||
            !((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return false;
    }
    return n > 0;
}

/* Under mu. */
static cmd_t *cmd_find(wk_agent_t *a, const char *id, size_t *ret_i)
{
    for (size_t i = 0; i < a->n_cmds; i++) {
        if (strcmp(a->cmds[i]->id, id) == 0) {
            if (ret_i)
                *ret_i = i;
            return a->cmds[i];
        }
    }
    return NULL;
}

/* Under mu. */
static void cmd_remove(wk_agent_t *a, size_t i)
{
    free(a->cmds[i]);
    a->cmds[i] = a->cmds[--a->n_cmds];
}

static void wake_all(wk_agent_t *a)
{
    uint64_t one = 1;
    (void)!write(a->wake_fd, &one, sizeof(one));
}

/* Copies an agent-supplied message for a callback: at most MESSAGE_MAX bytes, control bytes
 * and bytes that are not valid UTF-8 replaced by '?', so it is safe in a log line or an
 * event field. */
static char *sanitize(const char *s)
{
    size_t n = strlen(s);
    char *out = sp_xmalloc(n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80             ? 1
                     : (c & 0xe0) == 0xc0 ? 2
                     : (c & 0xf0) == 0xe0 ? 3
                     : (c & 0xf8) == 0xf0 ? 4
                                          : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++)
            ok = ((unsigned char)s[i + k] & 0xc0) == 0x80;
        if (ok && len == 2)
            ok = c >= 0xc2; /* overlong */
        if (ok && len == 3) {
            unsigned char c1 = (unsigned char)s[i + 1];
            ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0); /* overlong, UTF-16 */
        }
        if (ok && len == 4) {
            unsigned char c1 = (unsigned char)s[i + 1];
            ok = c <= 0xf4 && !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
        }
        if (!ok || (len == 1 && (c < 0x20 || c == 0x7f))) {
            out[o++] = '?';
            i++;
            continue;
        }
        memcpy(out + o, s + i, len);
        o += len;
        i += len;
    }
    out[o] = '\0';
    return out;
}

/* ---- writing ---- */

/* Writes all of buf, waiting for room with poll; -EPIPE when the channel is closing or lost
 * meanwhile, or the agent's end is gone. Under wmu. */
static int write_all(wk_agent_t *a, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(a->to_fd, buf + off, len - off);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN)
            return errno == EPIPE ? -EPIPE : -errno;
        struct pollfd p[2] = {{.fd = a->to_fd, .events = POLLOUT},
                              {.fd = a->wake_fd, .events = POLLIN}};
        int r = poll(p, 2, -1);
        if (r < 0 && errno != EINTR)
            return -errno;
        if (r > 0 && (p[1].revents & POLLIN))
            return -EPIPE;
    }
    return 0;
}

/* Packs and writes one frame. */
static int send_frame(wk_agent_t *a, const frame_t *f)
{
    size_t n = space__agent__v1__agent_frame__get_packed_size(f);
    if (n > WK_AGENT_FRAME_MAX)
        return SP_ETOOBIG;
    uint8_t *buf = sp_xmalloc(n + 4);
    buf[0] = (uint8_t)(n >> 24);
    buf[1] = (uint8_t)(n >> 16);
    buf[2] = (uint8_t)(n >> 8);
    buf[3] = (uint8_t)n;
    space__agent__v1__agent_frame__pack(f, buf + 4);

    pthread_mutex_lock(&a->wmu);
    pthread_mutex_lock(&a->mu);
    bool usable = a->state == ST_UP && !a->closing && !a->broken;
    pthread_mutex_unlock(&a->mu);
    int rc = usable ? write_all(a, buf, n + 4) : -EPIPE;
    if (rc < 0 && usable) {
        /* Part of the frame may be in the pipe: nothing after it would be read right. */
        pthread_mutex_lock(&a->mu);
        a->broken = true;
        pthread_mutex_unlock(&a->mu);
        rc = -EPIPE;
    }
    pthread_mutex_unlock(&a->wmu);
    free(buf);
    return rc;
}

/* A small frame (<= PIPE_BUF) written only if it goes out at once: -EBUSY when another writer
 * holds the channel, -EAGAIN when it is full (the agent does not read: it holds back while a
 * command's stdin is full). A part written (a socket may take less) breaks the stream. */
static int send_frame_now(wk_agent_t *a, const frame_t *f)
{
    uint8_t buf[64];
    size_t n = space__agent__v1__agent_frame__get_packed_size(f);
    if (n + 4 > sizeof(buf))
        return SP_ETOOBIG;
    buf[0] = (uint8_t)(n >> 24);
    buf[1] = (uint8_t)(n >> 16);
    buf[2] = (uint8_t)(n >> 8);
    buf[3] = (uint8_t)n;
    space__agent__v1__agent_frame__pack(f, buf + 4);
    if (pthread_mutex_trylock(&a->wmu) != 0)
        return -EBUSY;
    pthread_mutex_lock(&a->mu);
    bool usable = a->state == ST_UP && !a->closing && !a->broken;
    pthread_mutex_unlock(&a->mu);
    ssize_t w = -1;
    do
        w = usable ? write(a->to_fd, buf, n + 4) : -1;
    while (usable && w < 0 && errno == EINTR);
    int rc = !usable                    ? -EPIPE
             : w == (ssize_t)(n + 4)    ? 0
             : w < 0 && errno == EAGAIN ? -EAGAIN
                                        : -EPIPE;
    if (rc == -EPIPE && usable) {
        pthread_mutex_lock(&a->mu);
        a->broken = true;
        pthread_mutex_unlock(&a->mu);
    }
    pthread_mutex_unlock(&a->wmu);
    return rc;
}

int wk_agent_exec(wk_agent_t *a, const Space__Agent__V1__Exec *exec)
{
    if (!a || !exec || !exec->cmd_id || !cmd_id_valid(exec->cmd_id) || exec->n_argv == 0 ||
        !exec->argv || !exec->argv[0] || !exec->argv[0][0])
        return -EINVAL;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_EXEC;
    f.exec = (Space__Agent__V1__Exec *)exec;
    if (space__agent__v1__agent_frame__get_packed_size(&f) > WK_AGENT_FRAME_MAX)
        return SP_ETOOBIG;

    /* Registered before the frame goes out: Started can arrive before send_frame returns. */
    pthread_mutex_lock(&a->mu);
    int rc = 0;
    if (a->state != ST_UP || a->closing || a->broken)
        rc = -EPIPE;
    else if (cmd_find(a, exec->cmd_id, NULL))
        rc = -EEXIST;
    else if (a->n_cmds >= WK_AGENT_MAX_COMMANDS)
        rc = -EBUSY;
    if (rc == 0) {
        cmd_t *c = sp_xcalloc(1, sizeof(*c));
        snprintf(c->id, sizeof(c->id), "%s", exec->cmd_id);
        a->cmds[a->n_cmds++] = c;
    }
    pthread_mutex_unlock(&a->mu);
    if (rc < 0)
        return rc;

    rc = send_frame(a, &f);
    if (rc < 0) {
        pthread_mutex_lock(&a->mu);
        size_t i;
        if (cmd_find(a, exec->cmd_id, &i))
            cmd_remove(a, i);
        pthread_mutex_unlock(&a->mu);
    }
    return rc;
}

int wk_agent_claim(wk_agent_t *a, const char *hostname, int timeout_ms, char err[WHY_MAX])
{
    err[0] = '\0';
    if (!a || !hostname)
        return -EINVAL;
    Space__Agent__V1__Claim c = SPACE__AGENT__V1__CLAIM__INIT;
    c.hostname = (char *)hostname;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_CLAIM;
    f.claim = &c;
    pthread_mutex_lock(&a->mu);
    int rc = a->claim ? -EALREADY : 0;
    if (rc == 0)
        a->claim = 1; /* before the frame: the answer may come before send_frame returns */
    pthread_mutex_unlock(&a->mu);
    if (rc < 0)
        return rc;
    if ((rc = send_frame(a, &f)) < 0)
        return rc;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&a->mu);
    while (a->claim == 1 && a->state == ST_UP && !a->closing)
        if (pthread_cond_timedwait(&a->cond, &a->mu, &dl) == ETIMEDOUT)
            break;
    if (a->claim == 2)
        rc = a->claim_error[0] ? -EIO : 0;
    else
        rc = a->state == ST_UP ? SP_ETIMEOUT : -EPIPE;
    snprintf(err, WHY_MAX, "%s", a->claim == 2 ? a->claim_error : a->why);
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int wk_agent_meminfo(wk_agent_t *a, wk_agent_meminfo_t *ret)
{
    if (!a)
        return -EINVAL;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    Space__Agent__V1__MemInfoRequest q = SPACE__AGENT__V1__MEM_INFO_REQUEST__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_MEMINFO_REQUEST;
    f.meminfo_request = &q;
    pthread_mutex_lock(&a->mu);
    int rc = a->has_meminfo ? 0 : -ENODATA;
    if (rc == 0)
        *ret = a->meminfo;
    bool ask = !a->meminfo_asked;
    a->meminfo_asked = true; /* before the frame: the answer may come before send_frame returns */
    pthread_mutex_unlock(&a->mu);
    /* Never behind a writer that waits, nor into a full channel: one guest cannot hold up the
     * sampling of the others. Not sent: the next sample asks again. */
    if (ask && send_frame_now(a, &f) < 0) {
        pthread_mutex_lock(&a->mu);
        a->meminfo_asked = false;
        pthread_mutex_unlock(&a->mu);
    }
    return rc;
}

/* 0 if cmd_id names a command that has not ended, else < 0. */
static int cmd_known(wk_agent_t *a, const char *cmd_id)
{
    if (!cmd_id || !cmd_id_valid(cmd_id))
        return -EINVAL;
    pthread_mutex_lock(&a->mu);
    int rc = cmd_find(a, cmd_id, NULL) ? 0 : -ENOENT;
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int wk_agent_stdin(wk_agent_t *a, const char *cmd_id, const uint8_t *data, size_t len, bool eof)
{
    if (!a || (len && !data))
        return -EINVAL;
    int rc = cmd_known(a, cmd_id);
    if (rc < 0)
        return rc;
    /* In frames of at most WK_AGENT_DATA_MAX bytes; eof rides on the last. */
    size_t off = 0;
    do {
        size_t n = len - off > WK_AGENT_DATA_MAX ? WK_AGENT_DATA_MAX : len - off;
        Space__Agent__V1__Stdin s = SPACE__AGENT__V1__STDIN__INIT;
        s.cmd_id = (char *)cmd_id;
        s.data.data = (uint8_t *)data + off;
        s.data.len = n;
        s.eof = eof && off + n == len;
        frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
        f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_STDIN;
        f.stdin = &s;
        rc = send_frame(a, &f);
        off += n;
    } while (rc == 0 && off < len);
    return rc;
}

int wk_agent_signal(wk_agent_t *a, const char *cmd_id, int sig)
{
    if (!a || sig <= 0 || sig > 64)
        return -EINVAL;
    int rc = cmd_known(a, cmd_id);
    if (rc < 0)
        return rc;
    Space__Agent__V1__Signal s = SPACE__AGENT__V1__SIGNAL__INIT;
    s.cmd_id = (char *)cmd_id;
    s.signal = (uint32_t)sig;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_SIGNAL;
    f.signal = &s;
    return send_frame(a, &f);
}

int wk_agent_resize(wk_agent_t *a, const char *cmd_id, uint32_t rows, uint32_t cols)
{
    if (!a || rows == 0 || cols == 0 || rows > WK_AGENT_PTY_MAX || cols > WK_AGENT_PTY_MAX)
        return -EINVAL;
    int rc = cmd_known(a, cmd_id);
    if (rc < 0)
        return rc;
    Space__Agent__V1__Resize r = SPACE__AGENT__V1__RESIZE__INIT;
    r.cmd_id = (char *)cmd_id;
    r.rows = rows;
    r.cols = cols;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_RESIZE;
    f.resize = &r;
    return send_frame(a, &f);
}

size_t wk_agent_running(wk_agent_t *a, const wk_agent_running_t **ret)
{
    *ret = a->running;
    return a->n_running;
}

bool wk_agent_alive(wk_agent_t *a)
{
    if (!a)
        return false;
    pthread_mutex_lock(&a->mu);
    bool up = a->state == ST_UP && !a->closing && !a->broken;
    pthread_mutex_unlock(&a->mu);
    return up;
}

/* ---- reading ---- */

/* What the reader does after a frame. */
typedef enum { FRAME_OK = 0, FRAME_BAD } verdict_t;

static verdict_t violation(char why[WHY_MAX], const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static verdict_t violation(char why[WHY_MAX], const char *fmt, ...)
{
    int n = snprintf(why, WHY_MAX, "protocol violation: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + n, WHY_MAX - (size_t)n, fmt, ap);
    va_end(ap);
    return FRAME_BAD;
}

/* Waits for the token bucket; false when the channel is closing meanwhile. */
static bool throttle(wk_agent_t *a)
{
    for (;;) {
        int64_t now = now_us();
        a->tokens += (double)(now - a->refill_us) * RATE_FRAMES / 1e6;
        if (a->tokens > RATE_BURST)
            a->tokens = RATE_BURST;
        a->refill_us = now;
        if (a->tokens >= 1.0) {
            a->tokens -= 1.0;
            return true;
        }
        int ms = (int)((1.0 - a->tokens) * 1000.0 / RATE_FRAMES) + 1;
        struct pollfd p = {.fd = a->wake_fd, .events = POLLIN};
        if (poll(&p, 1, ms) > 0)
            return false;
    }
}

static verdict_t handle_file(wk_agent_t *a, const frame_t *f, char why[WHY_MAX]);

/* Validates one decoded frame against the channel state, updates the state and runs its
 * callback. */
static verdict_t handle(wk_agent_t *a, const frame_t *f, char why[WHY_MAX])
{
    const wk_agent_callbacks_t *cb = &a->cb;
    pthread_mutex_lock(&a->mu);
    state_t st = a->state;
    pthread_mutex_unlock(&a->mu);

    if (st == ST_HELLO) {
        if (f->msg_case != SPACE__AGENT__V1__AGENT_FRAME__MSG_HELLO)
            return violation(why, "first frame is not Hello (case %d)", (int)f->msg_case);
        const Space__Agent__V1__Hello *h = f->hello;
        if (h->protocol != PROTOCOL)
            return violation(why, "protocol %u, want %d", h->protocol, PROTOCOL);
        if (strlen(h->version) > VERSION_MAX)
            return violation(why, "version longer than %d bytes", VERSION_MAX);
        if (h->n_running > WK_AGENT_MAX_COMMANDS)
            return violation(why, "Hello lists %zu running commands", h->n_running);
        for (size_t i = 0; i < h->n_running; i++) {
            const Space__Agent__V1__Running *r = h->running[i];
            if (!cmd_id_valid(r->cmd_id) || r->pid == 0)
                return violation(why, "Hello lists a running command with a bad id or pid");
            for (size_t k = 0; k < i; k++)
                if (strcmp(h->running[k]->cmd_id, r->cmd_id) == 0)
                    return violation(why, "Hello lists command %s twice", r->cmd_id);
        }
        char *version = sanitize(h->version);
        sp_log(SP_LOG_DEBUG, "agent hello", SP_KS("sandbox", a->sandbox_id),
               SP_KS("version", version), SP_KU("pid", h->pid), SP_KU("running", h->n_running));
        free(version);
        pthread_mutex_lock(&a->mu);
        /* Commands of an earlier channel: known (and started) on this one from now on. */
        a->running = sp_xcalloc(h->n_running ? h->n_running : 1, sizeof(*a->running));
        for (size_t i = 0; i < h->n_running; i++) {
            const Space__Agent__V1__Running *r = h->running[i];
            wk_agent_running_t *w = &a->running[a->n_running++];
            snprintf(w->id, sizeof(w->id), "%s", r->cmd_id);
            w->pid = r->pid;
            w->pty = r->pty;
            w->stdin_open = r->stdin_open;
            for (size_t k = 0, at = 0; k < r->n_argv && k < WK_AGENT_ARGV_KEPT_N; k++) {
                size_t len = strlen(r->argv[k]) + 1;
                if (at + len > sizeof(w->argv))
                    break;
                memcpy(w->argv + at, r->argv[k], len);
                at += len;
                w->n_argv++;
            }
            snprintf(w->cwd, sizeof(w->cwd), "%s", r->cwd ? r->cwd : "");
            cmd_t *c = sp_xcalloc(1, sizeof(*c));
            snprintf(c->id, sizeof(c->id), "%s", r->cmd_id);
            c->started = true;
            a->cmds[a->n_cmds++] = c;
        }
        a->state = ST_UP;
        pthread_cond_broadcast(&a->cond);
        /* No callback before wk_agent_open has returned. */
        while (!a->opened && !a->closing)
            pthread_cond_wait(&a->cond, &a->mu);
        pthread_mutex_unlock(&a->mu);
        return FRAME_OK;
    }

    switch (f->msg_case) {
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_RESULT:
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_FAILED:
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_ACK:
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_DATA:
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_ENTRIES:
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_WATCH_EVENTS:
        return handle_file(a, f, why);
    default:
        break;
    }

    const char *id = NULL;
    switch (f->msg_case) {
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_STARTED:
        id = f->started->cmd_id;
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_OUTPUT:
        id = f->output->cmd_id;
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_EXITED:
        id = f->exited->cmd_id;
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_ERROR:
        id = f->error->cmd_id;
        if (strlen(f->error->message) > MESSAGE_MAX)
            return violation(why, "Error message longer than %d bytes", MESSAGE_MAX);
        if (!id[0]) {
            a->ignored_errors++;
            char *m = sanitize(f->error->message);
            sp_log(SP_LOG_DEBUG, "agent refused a frame", SP_KS("sandbox", a->sandbox_id),
                   SP_KS("error", m), SP_KU("count", a->ignored_errors));
            free(m);
            return FRAME_OK;
        }
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_HELLO:
        return violation(why, "second Hello");
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_CLAIMED: {
        /* Only the answer to our one Claim, once. */
        if (strlen(f->claimed->error) > MESSAGE_MAX)
            return violation(why, "Claimed error longer than %d bytes", MESSAGE_MAX);
        char *m = sanitize(f->claimed->error);
        pthread_mutex_lock(&a->mu);
        bool awaited = a->claim == 1;
        if (awaited) {
            a->claim = 2;
            snprintf(a->claim_error, sizeof(a->claim_error), "%s", m);
            pthread_cond_broadcast(&a->cond);
        }
        pthread_mutex_unlock(&a->mu);
        free(m);
        return awaited ? FRAME_OK : violation(why, "Claimed without a Claim");
    }
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_MEMINFO: {
        const Space__Agent__V1__MemInfo *m = f->meminfo;
        if (m->available > m->total || m->cached > m->total)
            return violation(why, "MemInfo with a part larger than its total");
        pthread_mutex_lock(&a->mu);
        bool awaited = a->meminfo_asked;
        if (awaited) {
            a->meminfo_asked = false;
            a->has_meminfo = true;
            a->meminfo = (wk_agent_meminfo_t){
                .total = m->total, .available = m->available, .cached = m->cached};
        }
        pthread_mutex_unlock(&a->mu);
        return awaited ? FRAME_OK : violation(why, "MemInfo without a MemInfoRequest");
    }
    default:
        return violation(why, "unexpected frame (case %d)", (int)f->msg_case);
    }
    if (strlen(id) > CMD_ID_MAX)
        return violation(why, "cmd_id longer than %d bytes", CMD_ID_MAX);

    pthread_mutex_lock(&a->mu);
    size_t i = 0;
    cmd_t *c = cmd_find(a, id, &i);
    verdict_t v = FRAME_OK;
    bool deliver = true;
    switch (f->msg_case) {
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_STARTED:
        if (!c || c->started)
            v = violation(why, "Started for %s command", c ? "a started" : "an unknown");
        else if (f->started->pid == 0)
            v = violation(why, "Started with pid 0");
        else
            c->started = true;
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_OUTPUT: {
        const Space__Agent__V1__Output *o = f->output;
        if (!c || !c->started)
            v = violation(why, "Output for %s command", c ? "an unstarted" : "an unknown");
        else if (o->stream != 1 && o->stream != 2)
            v = violation(why, "Output on stream %u", o->stream);
        else if (o->data.len == 0 || o->data.len > WK_AGENT_DATA_MAX)
            v = violation(why, "Output of %zu bytes", o->data.len);
        else if (c->out_bytes + o->data.len > OUTPUT_CAP) {
            c->dropped += o->data.len;
            deliver = false;
        } else {
            c->out_bytes += o->data.len;
        }
        break;
    }
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_EXITED: {
        const Space__Agent__V1__Exited *e = f->exited;
        bool code = e->exit_code >= 0 && e->exit_code <= 255 && e->signal == 0;
        bool sig = e->exit_code == -1 && e->signal >= 1 && e->signal <= 64;
        if (!c || !c->started)
            v = violation(why, "Exited for %s command", c ? "an unstarted" : "an unknown");
        else if (!code && !sig)
            v = violation(why, "Exited with code %d signal %u", e->exit_code, e->signal);
        else {
            if (c->dropped)
                sp_log(SP_LOG_DEBUG, "agent output over the cap dropped",
                       SP_KS("sandbox", a->sandbox_id), SP_KS("cmd", id),
                       SP_KU("dropped_bytes", c->dropped));
            cmd_remove(a, i);
        }
        break;
    }
    default: /* Error with a cmd_id */
        if (!c || c->started)
            v = violation(why, "Error for %s command", c ? "a started" : "an unknown");
        else
            cmd_remove(a, i);
        break;
    }
    pthread_mutex_unlock(&a->mu);
    if (v != FRAME_OK || !deliver)
        return v;

    switch (f->msg_case) {
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_STARTED:
        if (cb->on_started)
            cb->on_started(cb->arg, id, f->started->pid);
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_OUTPUT:
        if (cb->on_output)
            cb->on_output(cb->arg, id, (int)f->output->stream, f->output->data.data,
                          f->output->data.len);
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_EXITED:
        if (cb->on_exited) {
            char *oom = sanitize(f->exited->oom);
            cb->on_exited(cb->arg, id, f->exited->exit_code, (int)f->exited->signal,
                          f->exited->timed_out, oom);
            free(oom);
        }
        break;
    default: {
        char *m = sanitize(f->error->message);
        if (cb->on_error)
            cb->on_error(cb->arg, id, m);
        free(m);
        break;
    }
    }
    return FRAME_OK;
}

/* Ends the reader: before Hello the opener learns why; after, on_lost does (unless the
 * channel is closing, which wants no callback). */
static void reader_end(wk_agent_t *a, const char *why)
{
    pthread_mutex_lock(&a->mu);
    bool before_hello = a->state == ST_HELLO;
    bool report = !before_hello && !a->closing;
    a->state = before_hello ? ST_FAILED : ST_LOST;
    snprintf(a->why, sizeof(a->why), "%s", why);
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    wake_all(a); /* writers waiting for room give up */
    /* The agent sees EPIPE from now on instead of filling the pipe. */
    close(a->from_fd);
    a->from_fd = -1;
    if (report) {
        sp_log(SP_LOG_DEBUG, "agent channel lost", SP_KS("sandbox", a->sandbox_id),
               SP_KS("why", why));
        if (a->cb.on_lost)
            a->cb.on_lost(a->cb.arg, why);
    }
}

static void *reader_main(void *arg)
{
    wk_agent_t *a = arg;
    uint8_t *buf = sp_xmalloc(READ_BUF);
    size_t len = 0;
    char why[WHY_MAX] = "";
    for (;;) {
        struct pollfd p[2] = {{.fd = a->from_fd, .events = POLLIN},
                              {.fd = a->wake_fd, .events = POLLIN}};
        int r = poll(p, 2, -1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(why, sizeof(why), "agent channel poll: %s", strerror(errno));
            break;
        }
        if (p[1].revents & POLLIN) {
            why[0] = '\0'; /* closing */
            break;
        }
        ssize_t n = read(a->from_fd, buf + len, READ_BUF - len);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0) {
            snprintf(why, sizeof(why), "agent channel read: %s", strerror(errno));
            break;
        }
        if (n == 0) {
            snprintf(why, sizeof(why), "agent channel closed (the agent or its sandbox ended)");
            break;
        }
        len += (size_t)n;

        size_t off = 0;
        verdict_t v = FRAME_OK;
        while (v == FRAME_OK && len - off >= 4) {
            const uint8_t *q = buf + off;
            uint32_t flen =
                (uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | q[3];
            /* The size first: nothing of a frame over the limit is decoded or buffered. */
            if (flen > WK_AGENT_FRAME_MAX) {
                v = violation(why, "frame of %u bytes (limit %d)", flen, WK_AGENT_FRAME_MAX);
                break;
            }
            if (len - off - 4 < flen)
                break;
            if (!throttle(a)) {
                why[0] = '\0';
                v = FRAME_BAD;
                break;
            }
            frame_t *f = space__agent__v1__agent_frame__unpack(NULL, flen, q + 4);
            if (!f) {
                v = violation(why, "undecodable frame of %u bytes", flen);
                break;
            }
            v = handle(a, f, why);
            space__agent__v1__agent_frame__free_unpacked(f, NULL);
            off += 4 + (size_t)flen;
        }
        if (v != FRAME_OK)
            break;
        memmove(buf, buf + off, len - off);
        len -= off;
    }
    free(buf);
    if (!why[0]) /* only when closing: reader_end reports nothing then */
        snprintf(why, sizeof(why), "agent channel closed by the worker");
    reader_end(a, why);
    return NULL;
}

/* ---- files ---- */

/* Under mu. */
static xfer_t *xfer_find(wk_agent_t *a, uint64_t id, size_t *ret_i)
{
    for (size_t i = 0; i < a->n_xfers; i++) {
        if (a->xfers[i]->id == id) {
            if (ret_i)
                *ret_i = i;
            return a->xfers[i];
        }
    }
    return NULL;
}

/* Under mu. */
static void xfer_remove(wk_agent_t *a, size_t i)
{
    free(a->xfers[i]);
    a->xfers[i] = a->xfers[--a->n_xfers];
}

static bool channel_up(wk_agent_t *a)
{
    return a->state == ST_UP && !a->closing && !a->broken;
}

int wk_agent_file_reserve(wk_agent_t *a, uint64_t *ret_xfer)
{
    if (!a || !ret_xfer)
        return -EINVAL;
    int rc = 0;
    pthread_mutex_lock(&a->mu);
    if (!channel_up(a)) {
        rc = -EPIPE;
    } else if (a->n_xfers >= WK_AGENT_MAX_XFERS) {
        rc = -EBUSY;
    } else {
        xfer_t *x = sp_xcalloc(1, sizeof(*x));
        x->id = a->next_xfer++;
        a->xfers[a->n_xfers++] = x;
        *ret_xfer = x->id;
    }
    pthread_mutex_unlock(&a->mu);
    return rc;
}

void wk_agent_file_release(wk_agent_t *a, uint64_t xfer)
{
    if (!a)
        return;
    size_t i;
    pthread_mutex_lock(&a->mu);
    if (xfer_find(a, xfer, &i))
        xfer_remove(a, i);
    pthread_mutex_unlock(&a->mu);
}

int wk_agent_file_request(wk_agent_t *a, const Space__Agent__V1__FileRequest *r)
{
    if (!a || !r || r->op == SPACE__AGENT__V1__FILE_OP__FILE_OP_NONE)
        return -EINVAL;
    bool on_open = r->op == SPACE__AGENT__V1__FILE_OP__FILE_OP_COMMIT ||
                   r->op == SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_REQUEST;
    f.file_request = (Space__Agent__V1__FileRequest *)r;
    if (space__agent__v1__agent_frame__get_packed_size(&f) > WK_AGENT_FRAME_MAX)
        return SP_ETOOBIG;

    pthread_mutex_lock(&a->mu);
    int rc = 0;
    xfer_t *x = xfer_find(a, r->xfer_id, NULL);
    if (!channel_up(a))
        rc = -EPIPE;
    else if (!x || x->op || x->reading || x->open != on_open ||
             (x->watch && r->op != SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE))
        rc = -ENOENT; /* a watch takes nothing but its CLOSE */
    else {
        x->op = (int)r->op; /* before the frame goes out: the reply can beat send_frame */
        x->watch |= r->op == SPACE__AGENT__V1__FILE_OP__FILE_OP_WATCH;
    }
    pthread_mutex_unlock(&a->mu);
    if (rc < 0)
        return rc;
    rc = send_frame(a, &f);
    if (rc < 0) {
        pthread_mutex_lock(&a->mu);
        if ((x = xfer_find(a, r->xfer_id, NULL)) != NULL)
            x->op = 0;
        pthread_mutex_unlock(&a->mu);
    }
    return rc;
}

int wk_agent_file_write(wk_agent_t *a, uint64_t xfer, uint64_t offset, const uint8_t *data,
                        size_t len)
{
    if (!a || (len && !data))
        return -EINVAL;
    size_t off = 0;
    while (off < len) {
        size_t n = len - off > WK_AGENT_DATA_MAX ? WK_AGENT_DATA_MAX : len - off;
        pthread_mutex_lock(&a->mu);
        xfer_t *x = xfer_find(a, xfer, NULL);
        int rc = 0;
        if (!channel_up(a))
            rc = -EPIPE;
        else if (!x || !x->open || !x->write || x->op || x->sent != offset + off)
            rc = -ENOENT;
        else {
            x->sent += n;
            x->unacked++;
        }
        pthread_mutex_unlock(&a->mu);
        if (rc < 0)
            return rc;
        Space__Agent__V1__FileWrite w = SPACE__AGENT__V1__FILE_WRITE__INIT;
        w.xfer_id = xfer;
        w.offset = offset + off;
        w.data.data = (uint8_t *)data + off;
        w.data.len = n;
        frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
        f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_WRITE;
        f.file_write = &w;
        if ((rc = send_frame(a, &f)) < 0)
            return rc;
        off += n;
    }
    return 0;
}

int wk_agent_file_read(wk_agent_t *a, uint64_t xfer, uint64_t offset, uint32_t length)
{
    if (!a || length == 0 || length > WK_AGENT_READ_MAX)
        return -EINVAL;
    pthread_mutex_lock(&a->mu);
    xfer_t *x = xfer_find(a, xfer, NULL);
    int rc = 0;
    if (!channel_up(a))
        rc = -EPIPE;
    else if (!x || !x->open || x->write || x->watch || x->op || x->reading)
        rc = -ENOENT;
    else {
        x->reading = true;
        x->read_at = offset;
        x->read_left = length;
    }
    pthread_mutex_unlock(&a->mu);
    if (rc < 0)
        return rc;
    Space__Agent__V1__FileRead r = SPACE__AGENT__V1__FILE_READ__INIT;
    r.xfer_id = xfer;
    r.offset = offset;
    r.length = length;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_READ;
    f.file_read = &r;
    return send_frame(a, &f);
}

static bool file_code_known(const char *c)
{
    static const char *const codes[] = {"not_found", "exists",     "is_directory", "not_directory",
                                        "not_empty", "permission", "bad_path",     "no_space",
                                        "io",        "busy"};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (strcmp(c, codes[i]) == 0)
            return true;
    return false;
}

static bool info_ok(const Space__Agent__V1__FileInfo *in)
{
    return in && strlen(in->path) <= WK_AGENT_PATH_MAX && strlen(in->target) <= WK_AGENT_PATH_MAX;
}

/* Checks a file frame against its transfer, updates the transfer and runs its callback. A
 * transfer id never issued is a violation; one of a finished transfer is dropped (a reply that
 * crossed a close, or a guest replaying old frames: either way nobody waits for it). */
static verdict_t handle_file(wk_agent_t *a, const frame_t *f, char why[WHY_MAX])
{
    const wk_agent_callbacks_t *cb = &a->cb;
    uint64_t id = 0;
    switch (f->msg_case) {
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_RESULT:
        id = f->file_result->xfer_id;
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_FAILED:
        id = f->file_failed->xfer_id;
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_ACK:
        id = f->file_ack->xfer_id;
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_DATA:
        id = f->file_data->xfer_id;
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_WATCH_EVENTS:
        id = f->watch_events->xfer_id;
        break;
    default:
        id = f->file_entries->xfer_id;
        break;
    }

    pthread_mutex_lock(&a->mu);
    if (id == 0 || id >= a->next_xfer) {
        pthread_mutex_unlock(&a->mu);
        return violation(why, "file frame for transfer %llu, never issued", (unsigned long long)id);
    }
    size_t i = 0;
    xfer_t *x = xfer_find(a, id, &i);
    if (!x) {
        a->dropped_frames++;
        pthread_mutex_unlock(&a->mu);
        return FRAME_OK;
    }
    verdict_t v = FRAME_OK;
    bool done = false, watch = x->watch, deliver = true;
    int op = x->op;
    switch (f->msg_case) {
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_RESULT: {
        const Space__Agent__V1__FileResult *r = f->file_result;
        if (!op)
            v = violation(why, "FileResult without a request");
        else if (r->info && !info_ok(r->info))
            v = violation(why, "FileResult with an oversized path");
        else if (op == SPACE__AGENT__V1__FILE_OP__FILE_OP_READ_OPEN &&
                 (!r->info || r->info->type != SPACE__AGENT__V1__FILE_TYPE__FILE_TYPE_FILE))
            v = violation(why, "FileResult of a read without a regular file");
        else if (op == SPACE__AGENT__V1__FILE_OP__FILE_OP_WRITE_OPEN ||
                 op == SPACE__AGENT__V1__FILE_OP__FILE_OP_READ_OPEN ||
                 op == SPACE__AGENT__V1__FILE_OP__FILE_OP_WATCH) {
            x->op = 0;
            x->open = true;
            x->write = op == SPACE__AGENT__V1__FILE_OP__FILE_OP_WRITE_OPEN;
        } else {
            xfer_remove(a, i);
        }
        break;
    }
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_FAILED: {
        const Space__Agent__V1__FileFailed *e = f->file_failed;
        if (!file_code_known(e->code))
            v = violation(why, "FileFailed with an unknown code");
        else if (strlen(e->message) > MESSAGE_MAX)
            v = violation(why, "FileFailed message longer than %d bytes", MESSAGE_MAX);
        else
            xfer_remove(a, i);
        break;
    }
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_ACK: {
        uint64_t at = f->file_ack->offset;
        if (!x->open || !x->write || x->unacked == 0 || at <= x->acked || at > x->sent)
            v = violation(why, "FileAck at %llu (sent %llu, acked %llu)", (unsigned long long)at,
                          (unsigned long long)x->sent, (unsigned long long)x->acked);
        else {
            x->acked = at;
            x->unacked--;
        }
        break;
    }
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_DATA: {
        const Space__Agent__V1__FileData *d = f->file_data;
        if (!x->open || x->write || !x->reading)
            v = violation(why, "FileData without a read");
        else if (d->offset != x->read_at)
            v = violation(why, "FileData at %llu, expected %llu", (unsigned long long)d->offset,
                          (unsigned long long)x->read_at);
        else if (d->data.len > WK_AGENT_DATA_MAX || d->data.len > x->read_left)
            v = violation(why, "FileData of %zu bytes (%llu asked)", d->data.len,
                          (unsigned long long)x->read_left);
        else if (d->data.len == 0 && !d->eof)
            v = violation(why, "empty FileData");
        else {
            x->read_at += d->data.len;
            x->read_left -= d->data.len;
            done = d->eof || x->read_left == 0;
            if (done)
                x->reading = false;
        }
        break;
    }
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_WATCH_EVENTS: {
        const Space__Agent__V1__WatchEvents *e = f->watch_events;
        if (!watch || (!x->open && op != SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE))
            v = violation(why, "WatchEvents without a watch");
        else if (e->n_events == 0 || e->n_events > WK_AGENT_WATCH_EVENTS)
            v = violation(why, "WatchEvents with %zu events", e->n_events);
        for (size_t k = 0; k < e->n_events && v == FRAME_OK; k++) {
            const Space__Agent__V1__WatchEvent *ev = e->events[k];
            size_t n = strlen(ev->path);
            if (n == 0 || n > WK_AGENT_PATH_MAX ||
                ev->type < SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_CREATE ||
                ev->type > SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_OVERFLOW)
                v = violation(why, "WatchEvents with a bad event");
        }
        /* Events crossing the CLOSE the worker sent: nobody wants them. */
        deliver = op != SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE;
        break;
    }
    default: {
        const Space__Agent__V1__FileEntries *e = f->file_entries;
        if (x->op != SPACE__AGENT__V1__FILE_OP__FILE_OP_LIST)
            v = violation(why, "FileEntries without a list");
        else if (e->n_entries > WK_AGENT_LIST_MAX - x->entries)
            v = violation(why, "more than %d entries", WK_AGENT_LIST_MAX);
        else {
            for (size_t k = 0; k < e->n_entries && v == FRAME_OK; k++)
                if (!info_ok(e->entries[k]))
                    v = violation(why, "FileEntries with an oversized path");
            x->entries += (uint32_t)e->n_entries;
        }
        break;
    }
    }
    pthread_mutex_unlock(&a->mu);
    if (v != FRAME_OK || !deliver)
        return v;

    if (watch) {
        /* A watch's replies: its opening, its end (not the CLOSE asked for), its events. */
        if (f->msg_case == SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_RESULT) {
            if (op == SPACE__AGENT__V1__FILE_OP__FILE_OP_WATCH && cb->on_watch_started)
                cb->on_watch_started(cb->arg, id);
        } else if (f->msg_case == SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_FAILED) {
            if (op != SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE && cb->on_watch_ended) {
                char *m = sanitize(f->file_failed->message);
                cb->on_watch_ended(cb->arg, id, f->file_failed->code, m);
                free(m);
            }
        } else if (cb->on_watch_events) {
            cb->on_watch_events(cb->arg, id, f->watch_events->events, f->watch_events->n_events);
        }
        return FRAME_OK;
    }
    switch (f->msg_case) {
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_RESULT:
        if (cb->on_file_result)
            cb->on_file_result(cb->arg, id, f->file_result);
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_FAILED:
        if (cb->on_file_failed) {
            char *m = sanitize(f->file_failed->message);
            cb->on_file_failed(cb->arg, id, f->file_failed->code, m);
            free(m);
        }
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_ACK:
        if (cb->on_file_ack)
            cb->on_file_ack(cb->arg, id, f->file_ack->offset);
        break;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_DATA:
        if (cb->on_file_data)
            cb->on_file_data(cb->arg, id, f->file_data->offset, f->file_data->data.data,
                             f->file_data->data.len, f->file_data->eof, done);
        break;
    default:
        if (cb->on_file_entries)
            cb->on_file_entries(cb->arg, id, f->file_entries->entries, f->file_entries->n_entries);
        break;
    }
    return FRAME_OK;
}

/* ---- lifecycle ---- */

int wk_agent_open(int to_agent_fd, int from_agent_fd, const char *sandbox_id,
                  const wk_agent_callbacks_t *cb, int hello_timeout_ms, wk_agent_t **ret_agent)
{
    if (to_agent_fd < 0 || from_agent_fd < 0 || !cb || !ret_agent || hello_timeout_ms < 0) {
        if (to_agent_fd >= 0)
            close(to_agent_fd);
        if (from_agent_fd >= 0)
            close(from_agent_fd);
        return -EINVAL;
    }
    wk_agent_t *a = sp_xcalloc(1, sizeof(*a));
    snprintf(a->sandbox_id, sizeof(a->sandbox_id), "%s", sandbox_id ? sandbox_id : "");
    a->cb = *cb;
    a->to_fd = to_agent_fd;
    a->from_fd = from_agent_fd;
    a->tokens = RATE_BURST;
    a->refill_us = now_us();
    a->next_xfer = 1;
    pthread_mutex_init(&a->wmu, NULL);
    pthread_mutex_init(&a->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cond, &ca);
    pthread_condattr_destroy(&ca);

    int rc = 0;
    a->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (a->wake_fd < 0) {
        rc = -errno;
        goto fail;
    }
    /* Our write end only (the agent's read end is another open file description). */
    int fl = fcntl(a->to_fd, F_GETFL);
    if (fl < 0 || fcntl(a->to_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        rc = -errno;
        goto fail;
    }
    rc = -pthread_create(&a->reader, NULL, reader_main, a);
    if (rc < 0)
        goto fail;

    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += hello_timeout_ms / 1000;
    dl.tv_nsec += (long)(hello_timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&a->mu);
    while (a->state == ST_HELLO) {
        if (pthread_cond_timedwait(&a->cond, &a->mu, &dl) == ETIMEDOUT)
            break;
    }
    if (a->state == ST_HELLO)
        rc = SP_ETIMEOUT;
    else if (a->state != ST_UP)
        rc = strstr(a->why, "protocol violation") ? -EPROTO : -EPIPE;
    if (rc == 0) {
        a->opened = true;
        pthread_cond_broadcast(&a->cond);
    } else {
        sp_log(SP_LOG_DEBUG, "agent channel did not open", SP_KS("sandbox", a->sandbox_id),
               SP_KS("why", a->why[0] ? a->why : "no Hello in time"));
    }
    pthread_mutex_unlock(&a->mu);
    if (rc == 0) {
        *ret_agent = a;
        return 0;
    }
    wk_agent_close(a);
    return rc;
fail:
    if (a->wake_fd >= 0)
        close(a->wake_fd);
    a->wake_fd = -1;
    close(a->to_fd);
    close(a->from_fd);
    pthread_mutex_destroy(&a->wmu);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cond);
    free(a);
    return rc;
}

void wk_agent_close(wk_agent_t *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->closing = true;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    wake_all(a);
    pthread_join(a->reader, NULL);
    if (a->from_fd >= 0)
        close(a->from_fd);
    close(a->to_fd);
    close(a->wake_fd);
    for (size_t i = 0; i < a->n_cmds; i++)
        free(a->cmds[i]);
    free(a->running);
    for (size_t i = 0; i < a->n_xfers; i++)
        free(a->xfers[i]);
    pthread_mutex_destroy(&a->wmu);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cond);
    free(a);
}
