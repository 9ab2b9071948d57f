/* space-agent: directory watches (proto/agent.proto, FILE_OP_WATCH and WatchEvents).
 *
 * One inotify instance per watch, its fd in the agent's poll loop. A recursive watch adds a
 * watch descriptor for every directory under the root, and for every directory that appears
 * later (created or moved in): the directory is watched first and read second, and what it
 * already holds is reported as created, so a file made right after its directory is not missed
 * between the mkdir and the new watch. A directory moved away stops being watched (its
 * descriptors would report under a stale path); moved back in, it is watched again.
 *
 * Event types follow what E2B's envd reports (through fsnotify): IN_CREATE and IN_MOVED_TO are
 * create, IN_MODIFY write, IN_DELETE remove, IN_MOVED_FROM rename, IN_ATTRIB chmod. An upload
 * (agent_files.c: a temporary file renamed onto the target) shows as envd's in-place write
 * does: create (when the target is new) and write of the target, the temporary name never.
 *
 * Bounds, all per watch: at most DIRS_MAX directories; events go through a token bucket of
 * RATE per second (BURST at once) and a queue of PENDING_MAX events or PENDING_BYTES bytes; an
 * event that finds no room is dropped and the loss is one WATCH_EVENT_OVERFLOW at the place it
 * happened, as the kernel's own IN_Q_OVERFLOW is. A repeat of the event just queued (same type
 * and path: a file written in many pieces) is coalesced into it. The inotify fd is always
 * drained (at most READ_MAX bytes per turn), so a flood costs the guest's kernel no queue and
 * the agent bounded memory; the queue is sent only while the channel's output has room.
 * AGENT_MAX_WATCHES watches at once (the worker allows as many per sandbox).
 *
 * A watch ends on CLOSE (answered with a FileResult), when its directory is removed or moved
 * (its remaining events, then FileFailed "not_found"), or when the channel breaks: the next
 * channel starts with none. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent_files.h"

#define DIRS_MAX      4096 /* watched directories per recursive watch */
#define PENDING_MAX   1024 /* events queued per watch */
#define PENDING_BYTES (256 * 1024)
#define RATE          2000.0 /* events per second per watch, sustained */
#define BURST         4000.0
#define READ_MAX      (64 * 1024) /* bytes read from an inotify fd per turn */
#define FRAME_EVENTS  1024        /* events per WatchEvents frame (worker_agent.h) */
#define FRAME_BYTES   (96 * 1024)
#define PATH_MAX_LEN  4096
#define MASK                                                                                       \
    (IN_CREATE | IN_MODIFY | IN_ATTRIB | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |                 \
     IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK)

typedef Space__Agent__V1__WatchEventType type_t;
#define T_CREATE   SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_CREATE
#define T_WRITE    SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_WRITE
#define T_REMOVE   SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_REMOVE
#define T_RENAME   SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_RENAME
#define T_CHMOD    SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_CHMOD
#define T_OVERFLOW SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_OVERFLOW

typedef struct {
    int wd;
    char *path;
} dir_t;

typedef struct {
    type_t type;
    char *path;
} event_t;

typedef struct {
    uint64_t id;
    int fd;
    bool recursive;
    char *root;  /* the watched directory */
    dir_t *dirs; /* sorted by wd */
    size_t n_dirs;
    int root_wd;
    event_t *q; /* pending events, oldest first */
    size_t n_q, q_bytes;
    double tokens;
    int64_t refill_ms;
    bool ended; /* the root went away: send what is queued, then FileFailed */
    const char *end_why;
    uint32_t upload_cookie; /* IN_MOVED_FROM of an upload's temporary file (0: none) */
} watch_t;

static watch_t *watches[AGENT_MAX_WATCHES];
static size_t n_watches;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p)
        abort();
    return p;
}

/* ---- the queue ---- */

static void q_push(watch_t *w, type_t type, const char *path)
{
    if (w->n_q % 64 == 0) {
        event_t *q = realloc(w->q, (w->n_q + 64) * sizeof(*q));
        if (!q)
            abort();
        w->q = q;
    }
    w->q[w->n_q].type = type;
    w->q[w->n_q].path = xstrdup(path);
    w->n_q++;
    w->q_bytes += strlen(path) + 16;
}

/* The loss of one or more events, once per run of losses (the queue may go one over its bound
 * for it). */
static void q_overflow(watch_t *w)
{
    if (w->n_q > 0 && w->q[w->n_q - 1].type == T_OVERFLOW)
        return;
    q_push(w, T_OVERFLOW, "");
}

static void q_add(watch_t *w, type_t type, const char *path)
{
    if (w->n_q > 0 && w->q[w->n_q - 1].type == type && strcmp(w->q[w->n_q - 1].path, path) == 0)
        return; /* a repeat: coalesced */
    int64_t now = mono_ms();
    w->tokens += (double)(now - w->refill_ms) * RATE / 1000.0;
    if (w->tokens > BURST)
        w->tokens = BURST;
    w->refill_ms = now;
    if (w->tokens < 1.0 || w->n_q >= PENDING_MAX || w->q_bytes + strlen(path) > PENDING_BYTES) {
        q_overflow(w);
        return;
    }
    w->tokens -= 1.0;
    q_push(w, type, path);
}

static void q_clear(watch_t *w)
{
    for (size_t i = 0; i < w->n_q; i++)
        free(w->q[i].path);
    free(w->q);
    w->q = NULL;
    w->n_q = w->q_bytes = 0;
}

/* ---- directories ---- */

static dir_t *dir_find(watch_t *w, int wd)
{
    size_t lo = 0, hi = w->n_dirs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (w->dirs[mid].wd == wd)
            return &w->dirs[mid];
        if (w->dirs[mid].wd < wd)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Records (or renames: inotify gives a directory moved within the tree its old wd) wd. */
static void dir_set(watch_t *w, int wd, const char *path)
{
    dir_t *d = dir_find(w, wd);
    if (d) {
        free(d->path);
        d->path = xstrdup(path);
        return;
    }
    if (w->n_dirs % 64 == 0) {
        dir_t *dirs = realloc(w->dirs, (w->n_dirs + 64) * sizeof(*dirs));
        if (!dirs)
            abort();
        w->dirs = dirs;
    }
    size_t at = w->n_dirs;
    while (at > 0 && w->dirs[at - 1].wd > wd)
        at--;
    memmove(&w->dirs[at + 1], &w->dirs[at], (w->n_dirs - at) * sizeof(*w->dirs));
    w->dirs[at].wd = wd;
    w->dirs[at].path = xstrdup(path);
    w->n_dirs++;
}

static void dir_forget(watch_t *w, dir_t *d)
{
    size_t at = (size_t)(d - w->dirs);
    free(d->path);
    memmove(d, d + 1, (w->n_dirs - at - 1) * sizeof(*d));
    w->n_dirs--;
}

/* Whether path is under (or is) dir. */
static bool under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    if (strcmp(dir, "/") == 0)
        return true;
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

/* Stops watching dir and what is under it (a directory moved away). */
static void forget_tree(watch_t *w, const char *dir)
{
    for (size_t i = 0; i < w->n_dirs;) {
        if (w->dirs[i].wd != w->root_wd && under(w->dirs[i].path, dir)) {
            (void)inotify_rm_watch(w->fd, w->dirs[i].wd);
            dir_forget(w, &w->dirs[i]);
            continue;
        }
        i++;
    }
}

static int join(char out[PATH_MAX_LEN + 1], const char *dir, const char *name)
{
    int n = snprintf(out, PATH_MAX_LEN + 1, "%s/%s", strcmp(dir, "/") ? dir : "", name);
    return n < 0 || n > PATH_MAX_LEN ? -ENAMETOOLONG : 0;
}

/* Watches top and, breadth first, the directories under it (not following symlinks). With
 * report, what they hold is queued as created (a directory that just appeared). 0, or an errno
 * when top itself cannot be watched; directories beyond DIRS_MAX are an overflow. */
static int add_tree(watch_t *w, const char *top, bool report)
{
    char **todo = malloc(sizeof(char *));
    size_t n_todo = 1, cap = 1;
    int rc = 0;
    if (!todo)
        abort();
    todo[0] = xstrdup(top);
    for (size_t k = 0; k < n_todo; k++) {
        const char *dir = todo[k];
        if (w->n_dirs >= DIRS_MAX) {
            q_overflow(w);
            break;
        }
        /* The root may be a symlink to a directory; nothing under it is followed. */
        bool is_root = k == 0 && !report;
        int wd = inotify_add_watch(w->fd, dir, MASK | (is_root ? 0 : IN_DONT_FOLLOW));
        if (wd < 0) {
            if (k == 0)
                rc = errno;
            continue; /* gone meanwhile, or not readable: not watched */
        }
        if (is_root)
            w->root_wd = wd;
        dir_set(w, wd, dir);
        if (!w->recursive)
            break;
        DIR *d = opendir(dir);
        if (!d)
            continue;
        struct dirent *e;
        char path[PATH_MAX_LEN + 1];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
                join(path, dir, e->d_name) < 0)
                continue;
            if (report)
                q_add(w, T_CREATE, path);
            bool is_dir = e->d_type == DT_DIR;
            if (e->d_type == DT_UNKNOWN) {
                struct stat st;
                is_dir = lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
            }
            if (!is_dir || n_todo >= DIRS_MAX)
                continue;
            if (n_todo == cap) {
                cap *= 2;
                char **t = realloc(todo, cap * sizeof(char *));
                if (!t)
                    abort();
                todo = t;
            }
            todo[n_todo++] = xstrdup(path);
        }
        closedir(d);
    }
    for (size_t k = 0; k < n_todo; k++)
        free(todo[k]);
    free(todo);
    return rc;
}

/* ---- watches ---- */

static void watch_free(size_t i)
{
    watch_t *w = watches[i];
    if (w->fd >= 0)
        close(w->fd);
    free(w->root);
    for (size_t k = 0; k < w->n_dirs; k++)
        free(w->dirs[k].path);
    free(w->dirs);
    q_clear(w);
    free(w);
    watches[i] = watches[--n_watches];
}

static void send_failed(uint64_t id, const char *code, const char *message)
{
    Space__Agent__V1__FileFailed m = SPACE__AGENT__V1__FILE_FAILED__INIT;
    m.xfer_id = id;
    m.code = (char *)code;
    m.message = (char *)message;
    Space__Agent__V1__AgentFrame f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_FAILED;
    f.file_failed = &m;
    agent_send_frame(&f);
}

void agent_watch_open(const Space__Agent__V1__FileRequest *r)
{
    char msg[512];
    struct stat st;
    if (n_watches >= AGENT_MAX_WATCHES) {
        snprintf(msg, sizeof(msg), "%d directories are watched already", AGENT_MAX_WATCHES);
        send_failed(r->xfer_id, "busy", msg);
        return;
    }
    if (stat(r->path, &st) < 0) {
        int e = errno;
        snprintf(msg, sizeof(msg), "watch %.300s: %s", r->path, strerror(e));
        send_failed(r->xfer_id, agent_errno_code(e), msg);
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(msg, sizeof(msg), "%.300s is not a directory", r->path);
        send_failed(r->xfer_id, "not_directory", msg);
        return;
    }
    watch_t *w = calloc(1, sizeof(*w));
    if (!w)
        abort();
    w->id = r->xfer_id;
    w->root = xstrdup(r->path);
    w->root_wd = -1;
    w->recursive = r->recursive;
    w->tokens = BURST;
    w->refill_ms = mono_ms();
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    int e = w->fd < 0 ? errno : 0;
    if (!e)
        e = add_tree(w, r->path, false);
    watches[n_watches++] = w;
    if (e) {
        /* ENOSPC and EMFILE are inotify's own limits: busy, not a full disk. */
        snprintf(msg, sizeof(msg), "watch %.300s: %s", r->path, strerror(e));
        send_failed(r->xfer_id, e == ENOSPC || e == EMFILE ? "busy" : agent_errno_code(e), msg);
        watch_free(n_watches - 1);
        return;
    }
    /* Losses while adding a large tree are reported with the first events. */
    Space__Agent__V1__FileResult res = SPACE__AGENT__V1__FILE_RESULT__INIT;
    res.xfer_id = r->xfer_id;
    Space__Agent__V1__AgentFrame f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_RESULT;
    f.file_result = &res;
    agent_send_frame(&f);
}

bool agent_watch_close(uint64_t id)
{
    for (size_t i = 0; i < n_watches; i++) {
        if (watches[i]->id == id) {
            watch_free(i);
            return true;
        }
    }
    return false;
}

void agent_watch_stop_all(void)
{
    while (n_watches > 0)
        watch_free(n_watches - 1);
}

/* ---- events ---- */

static void on_event(watch_t *w, const struct inotify_event *ev)
{
    char path[PATH_MAX_LEN + 1];
    if (ev->mask & IN_Q_OVERFLOW) {
        q_overflow(w);
        return;
    }
    dir_t *d = dir_find(w, ev->wd);
    if (!d)
        return; /* a directory forgotten with events still queued */
    bool root = ev->wd == w->root_wd;
    if (ev->mask & IN_IGNORED) {
        dir_forget(w, d);
        if (root && !w->ended) {
            w->ended = true;
            w->end_why = "the watched directory is gone";
        }
        return;
    }
    if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
        /* A subdirectory's own removal or move is its parent's IN_DELETE or IN_MOVED_FROM. */
        if (root && !w->ended) {
            q_add(w, ev->mask & IN_DELETE_SELF ? T_REMOVE : T_RENAME, d->path);
            w->ended = true;
            w->end_why = ev->mask & IN_DELETE_SELF ? "the watched directory was removed"
                                                   : "the watched directory was moved";
        }
        return;
    }
    if (ev->len == 0 || join(path, d->path, ev->name) < 0)
        return;
    bool is_dir = (ev->mask & IN_ISDIR) != 0;
    /* An upload's temporary file is no event of its own (envd writes in place): its rename
     * onto the target is the target's create, or its write when a file was there. */
    if (strncmp(ev->name, AGENT_UPLOAD_TMP_PREFIX, strlen(AGENT_UPLOAD_TMP_PREFIX)) == 0) {
        if (ev->mask & IN_MOVED_FROM)
            w->upload_cookie = ev->cookie;
        return;
    }
    if ((ev->mask & IN_MOVED_TO) && ev->cookie && ev->cookie == w->upload_cookie) {
        w->upload_cookie = 0;
        if (agent_files_upload_replaced(path) != 1)
            q_add(w, T_CREATE, path);
        q_add(w, T_WRITE, path);
        return;
    }
    if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
        q_add(w, T_CREATE, path);
        if (is_dir && w->recursive)
            (void)add_tree(w, path, true);
    } else if (ev->mask & IN_MODIFY) {
        q_add(w, T_WRITE, path);
    } else if (ev->mask & IN_ATTRIB) {
        q_add(w, T_CHMOD, path);
    } else if (ev->mask & IN_DELETE) {
        q_add(w, T_REMOVE, path);
    } else if (ev->mask & IN_MOVED_FROM) {
        q_add(w, T_RENAME, path);
        if (is_dir && w->recursive)
            forget_tree(w, path);
    }
}

size_t agent_watch_pollfds(struct pollfd *pfd, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < n_watches && n < max; i++)
        if (!watches[i]->ended)
            pfd[n++] = (struct pollfd){.fd = watches[i]->fd, .events = POLLIN};
    return n;
}

void agent_watch_ready(int fd)
{
    /* Aligned for struct inotify_event, as inotify(7) does it. */
    static char buf[READ_MAX] __attribute__((aligned(__alignof__(struct inotify_event))));
    watch_t *w = NULL;
    for (size_t i = 0; i < n_watches && !w; i++)
        if (watches[i]->fd == fd)
            w = watches[i];
    if (!w)
        return;
    ssize_t n;
    do {
        n = read(fd, buf, sizeof(buf));
    } while (n < 0 && errno == EINTR);
    for (ssize_t off = 0; n > 0 && off + (ssize_t)sizeof(struct inotify_event) <= n;) {
        const struct inotify_event *ev = (const struct inotify_event *)(buf + off);
        if (off + (ssize_t)sizeof(*ev) + (ssize_t)ev->len > n)
            break;
        on_event(w, ev);
        off += (ssize_t)sizeof(*ev) + (ssize_t)ev->len;
    }
}

/* One WatchEvents frame from the head of w's queue; the bytes it took. */
static size_t send_batch(watch_t *w)
{
    static Space__Agent__V1__WatchEvent evs[FRAME_EVENTS];
    static Space__Agent__V1__WatchEvent *ptrs[FRAME_EVENTS];
    size_t n = 0, bytes = 0;
    while (n < w->n_q && n < FRAME_EVENTS && bytes < FRAME_BYTES) {
        space__agent__v1__watch_event__init(&evs[n]);
        evs[n].type = w->q[n].type;
        /* An overflow names the watched directory. */
        evs[n].path = w->q[n].type == T_OVERFLOW ? w->root : w->q[n].path;
        bytes += strlen(evs[n].path) + 8;
        ptrs[n] = &evs[n];
        n++;
    }
    Space__Agent__V1__WatchEvents m = SPACE__AGENT__V1__WATCH_EVENTS__INIT;
    m.xfer_id = w->id;
    m.events = ptrs;
    m.n_events = n;
    Space__Agent__V1__AgentFrame f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_WATCH_EVENTS;
    f.watch_events = &m;
    agent_send_frame(&f);
    for (size_t i = 0; i < n; i++) {
        w->q_bytes -= strlen(w->q[i].path) + 16;
        free(w->q[i].path);
    }
    memmove(w->q, w->q + n, (w->n_q - n) * sizeof(*w->q));
    w->n_q -= n;
    if (w->n_q == 0)
        q_clear(w);
    return bytes + 16 * n;
}

void agent_watch_send(size_t budget)
{
    for (size_t i = 0; i < n_watches;) {
        watch_t *w = watches[i];
        while (w->n_q > 0 && budget > 0) {
            size_t used = send_batch(w);
            budget = used < budget ? budget - used : 0;
        }
        if (w->ended && w->n_q == 0) {
            send_failed(w->id, "not_found", w->end_why);
            watch_free(i);
            continue;
        }
        i++;
    }
}
