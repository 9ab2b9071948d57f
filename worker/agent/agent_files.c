/* space-agent: file operations (proto/agent.proto, FileRequest / FileWrite / FileRead).
 *
 * The worker sends absolute, normalised paths and a transfer id per request; every request
 * gets exactly one final reply (FileResult or FileFailed) and every FileWrite one FileAck (or a
 * FileFailed that ends its transfer). The agent runs as root inside the sandbox: these are the
 * guest's own files, so there is nothing to confine here; what matters is that the agent, as
 * PID 1, never exits or blocks on a bad request.
 *
 * Writes go to a temporary file in the target's directory (created with its parents, owned by
 * the requested uid/gid), and COMMIT renames it onto the target: a reader never sees a half
 * written file, and an abandoned transfer leaves no target behind. Reads keep the file open
 * and answer FileRead with pread, in frames of at most DATA_MAX bytes.
 *
 * A recursive remove of a directory runs in a child process (fork; its result when the agent
 * reaps it, agent_files_reaped): it can take a long time (~15 s for 100,000 files in gVisor)
 * and the loop keeps serving commands and other files meanwhile. At most MAX_REMOVERS at once;
 * beyond, or when fork fails, the remove runs in the loop as before.
 *
 * Bounds: at most MAX_XFERS transfers open at once; a FileRead covers at most READ_MAX bytes;
 * a list stops at max_entries (at most LIST_MAX) with truncated set, and a listed path longer
 * than PATH_MAX_LEN is skipped. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent_files.h"

#define MAX_XFERS     64
#define DATA_MAX      (64 * 1024)
#define READ_MAX      (256 * 1024)
#define LIST_MAX      10000
#define DEPTH_MAX     16
#define PATH_MAX_LEN  4096
#define ENTRIES_FRAME (96 * 1024) /* packed FileInfo bytes per FileEntries frame */
#define ERR_MSG_MAX   512
#define MAX_REMOVERS  4

typedef Space__Agent__V1__AgentFrame frame_t;
typedef Space__Agent__V1__FileInfo info_t;

typedef struct {
    uint64_t id;
    bool write;
    int fd;
    uint64_t offset;             /* write: bytes written so far */
    char tmp[PATH_MAX_LEN + 64]; /* write: the temporary file */
    char path[PATH_MAX_LEN + 1];
    uint32_t mode, uid, gid;
} xfer_t;

static xfer_t *xfers[MAX_XFERS];
static size_t n_xfers;

static xfer_t *xfer_find(uint64_t id, size_t *ret_i)
{
    for (size_t i = 0; i < n_xfers; i++) {
        if (xfers[i]->id == id) {
            if (ret_i)
                *ret_i = i;
            return xfers[i];
        }
    }
    return NULL;
}

static void xfer_drop(size_t i)
{
    xfer_t *x = xfers[i];
    if (x->fd >= 0)
        close(x->fd);
    if (x->write && x->tmp[0])
        (void)unlink(x->tmp);
    free(x);
    xfers[i] = xfers[--n_xfers];
}

/* ---- replies ---- */

const char *agent_errno_code(int e)
{
    switch (e) {
    case ENOENT:
        return "not_found";
    case EEXIST:
        return "exists";
    case EISDIR:
        return "is_directory";
    case ENOTDIR:
        return "not_directory";
    case ENOTEMPTY:
        return "not_empty";
    case EACCES:
    case EPERM:
    case EROFS:
        return "permission";
    case ENAMETOOLONG:
    case EINVAL:
    case ELOOP:
        return "bad_path";
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return "no_space";
    default:
        return "io";
    }
}

static void send_failed(uint64_t id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void send_failed(uint64_t id, const char *code, const char *fmt, ...)
{
    char msg[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    Space__Agent__V1__FileFailed m = SPACE__AGENT__V1__FILE_FAILED__INIT;
    m.xfer_id = id;
    m.code = (char *)code;
    m.message = msg;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_FAILED;
    f.file_failed = &m;
    agent_send_frame(&f);
}

static void send_errno(uint64_t id, int e, const char *what, const char *path)
{
    send_failed(id, agent_errno_code(e), "%s %.300s: %s", what, path, strerror(e));
}

static Space__Agent__V1__FileType type_of(mode_t m)
{
    if (S_ISREG(m))
        return SPACE__AGENT__V1__FILE_TYPE__FILE_TYPE_FILE;
    if (S_ISDIR(m))
        return SPACE__AGENT__V1__FILE_TYPE__FILE_TYPE_DIR;
    if (S_ISLNK(m))
        return SPACE__AGENT__V1__FILE_TYPE__FILE_TYPE_SYMLINK;
    return SPACE__AGENT__V1__FILE_TYPE__FILE_TYPE_OTHER;
}

/* Fills info from st; target (PATH_MAX_LEN + 1 bytes) receives a symlink's target. */
static void info_fill(info_t *in, const char *path, const struct stat *st, char *target)
{
    space__agent__v1__file_info__init(in);
    in->path = (char *)path;
    in->type = type_of(st->st_mode);
    in->size = (uint64_t)st->st_size;
    in->mode = (uint32_t)(st->st_mode & 07777);
    in->mtime_us = (int64_t)st->st_mtim.tv_sec * 1000000 + st->st_mtim.tv_nsec / 1000;
    in->uid = (uint32_t)st->st_uid;
    in->gid = (uint32_t)st->st_gid;
    target[0] = '\0';
    if (S_ISLNK(st->st_mode)) {
        ssize_t n = readlink(path, target, PATH_MAX_LEN);
        if (n > 0)
            target[n] = '\0';
    }
    in->target = target;
}

static void send_result(uint64_t id, const info_t *info, bool truncated, bool existed)
{
    Space__Agent__V1__FileResult r = SPACE__AGENT__V1__FILE_RESULT__INIT;
    r.xfer_id = id;
    r.info = (info_t *)info;
    r.truncated = truncated;
    r.existed = existed;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_RESULT;
    f.file_result = &r;
    agent_send_frame(&f);
}

/* A result describing path (lstat), or a failure when it cannot be described. */
static void send_stat_result(uint64_t id, const char *path, bool existed)
{
    struct stat st;
    static char target[PATH_MAX_LEN + 1];
    if (lstat(path, &st) < 0) {
        send_errno(id, errno, "stat", path);
        return;
    }
    info_t in;
    info_fill(&in, path, &st, target);
    send_result(id, &in, false, existed);
}

/* ---- paths ---- */

static bool path_ok(const char *p)
{
    size_t n = strlen(p);
    return n > 0 && n <= PATH_MAX_LEN && p[0] == '/';
}

/* mkdir -p of dir, chowning what it creates to uid:gid. 0 or an errno. */
static int make_dirs(const char *dir, uint32_t uid, uint32_t gid, mode_t mode)
{
    char buf[PATH_MAX_LEN + 1];
    struct stat st;
    size_t n = strlen(dir);
    if (n > PATH_MAX_LEN)
        return ENAMETOOLONG;
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, mode) == 0) {
            if (uid || gid)
                (void)chown(buf, uid, gid);
        } else if (errno != EEXIST) {
            return errno;
        } else if (stat(buf, &st) == 0 && !S_ISDIR(st.st_mode)) {
            return ENOTDIR;
        }
        buf[i] = saved;
    }
    return 0;
}

/* The directory part of an absolute path ("/" for "/x"). */
static void dir_of(const char *path, char out[PATH_MAX_LEN + 1])
{
    const char *slash = strrchr(path, '/');
    size_t n = slash && slash != path ? (size_t)(slash - path) : 1;
    memcpy(out, path, n);
    out[n] = '\0';
}

/* ---- operations ---- */

static void op_write_open(const Space__Agent__V1__FileRequest *r)
{
    char dir[PATH_MAX_LEN + 1];
    struct stat st;
    if (n_xfers >= MAX_XFERS) {
        send_failed(r->xfer_id, "io", "too many open transfers (%d)", MAX_XFERS);
        return;
    }
    if (lstat(r->path, &st) == 0 && S_ISDIR(st.st_mode)) {
        send_failed(r->xfer_id, "is_directory", "%.300s is a directory", r->path);
        return;
    }
    dir_of(r->path, dir);
    int e = make_dirs(dir, r->uid, r->gid, 0755);
    if (e) {
        send_errno(r->xfer_id, e, "mkdir", dir);
        return;
    }
    xfer_t *x = calloc(1, sizeof(*x));
    if (!x)
        abort();
    x->id = r->xfer_id;
    x->write = true;
    x->mode = r->mode & 07777;
    x->uid = r->uid;
    x->gid = r->gid;
    snprintf(x->path, sizeof(x->path), "%s", r->path);
    snprintf(x->tmp, sizeof(x->tmp), "%s/" AGENT_UPLOAD_TMP_PREFIX "%llu-XXXXXX",
             strcmp(dir, "/") ? dir : "", (unsigned long long)r->xfer_id);
    x->fd = mkostemp(x->tmp, O_CLOEXEC);
    if (x->fd < 0) {
        e = errno;
        x->tmp[0] = '\0';
        send_errno(r->xfer_id, e, "create in", dir);
        free(x);
        return;
    }
    xfers[n_xfers++] = x;
    send_result(r->xfer_id, NULL, false, false);
}

/* The last uploads' targets and whether a file was there (agent_files_upload_replaced): a
 * watch reads them when the rename of a temporary file reaches it, after the commit. */
#define UPLOADS_REMEMBERED 8
static struct {
    char path[PATH_MAX_LEN + 1];
    bool replaced;
} uploads[UPLOADS_REMEMBERED];
static size_t uploads_next;

static void upload_remember(const char *path, bool replaced)
{
    snprintf(uploads[uploads_next].path, sizeof(uploads[uploads_next].path), "%s", path);
    uploads[uploads_next].replaced = replaced;
    uploads_next = (uploads_next + 1) % UPLOADS_REMEMBERED;
}

int agent_files_upload_replaced(const char *path)
{
    for (size_t k = 1; k <= UPLOADS_REMEMBERED; k++) {
        size_t i = (uploads_next + UPLOADS_REMEMBERED - k) % UPLOADS_REMEMBERED;
        if (uploads[i].path[0] && strcmp(uploads[i].path, path) == 0)
            return uploads[i].replaced ? 1 : 0;
    }
    return -1;
}

static void op_commit(const Space__Agent__V1__FileRequest *r)
{
    size_t i;
    xfer_t *x = xfer_find(r->xfer_id, &i);
    if (!x || !x->write) {
        send_failed(r->xfer_id, "io", "commit: no open write %llu", (unsigned long long)r->xfer_id);
        return;
    }
    if (fchmod(x->fd, x->mode) < 0 || ((x->uid || x->gid) && fchown(x->fd, x->uid, x->gid) < 0) ||
        close(x->fd) < 0) {
        x->fd = -1;
        send_errno(r->xfer_id, errno, "commit", x->path);
        xfer_drop(i);
        return;
    }
    x->fd = -1;
    struct stat st;
    upload_remember(x->path, lstat(x->path, &st) == 0);
    if (rename(x->tmp, x->path) < 0) {
        send_errno(r->xfer_id, errno, "rename onto", x->path);
        xfer_drop(i);
        return;
    }
    x->tmp[0] = '\0';
    send_stat_result(r->xfer_id, x->path, false);
    xfer_drop(i);
}

static void op_read_open(const Space__Agent__V1__FileRequest *r)
{
    struct stat st;
    static char target[PATH_MAX_LEN + 1];
    if (n_xfers >= MAX_XFERS) {
        send_failed(r->xfer_id, "io", "too many open transfers (%d)", MAX_XFERS);
        return;
    }
    int fd = open(r->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        send_errno(r->xfer_id, errno, "open", r->path);
        return;
    }
    if (fstat(fd, &st) < 0) {
        send_errno(r->xfer_id, errno, "stat", r->path);
        close(fd);
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        send_failed(r->xfer_id, "is_directory", "%.300s is a directory", r->path);
        close(fd);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        /* A fifo or a device could block the loop or never end. */
        send_failed(r->xfer_id, "bad_path", "%.300s is not a regular file", r->path);
        close(fd);
        return;
    }
    xfer_t *x = calloc(1, sizeof(*x));
    if (!x)
        abort();
    x->id = r->xfer_id;
    x->fd = fd;
    snprintf(x->path, sizeof(x->path), "%s", r->path);
    xfers[n_xfers++] = x;
    info_t in;
    info_fill(&in, r->path, &st, target);
    send_result(r->xfer_id, &in, false, false);
}

static void op_close(const Space__Agent__V1__FileRequest *r)
{
    size_t i;
    if (xfer_find(r->xfer_id, &i))
        xfer_drop(i);
    else
        (void)agent_watch_close(r->xfer_id);
    send_result(r->xfer_id, NULL, false, false);
}

static void op_mkdir(const Space__Agent__V1__FileRequest *r)
{
    struct stat st;
    bool existed = stat(r->path, &st) == 0;
    if (existed && !S_ISDIR(st.st_mode)) {
        send_failed(r->xfer_id, "exists", "%.300s exists and is not a directory", r->path);
        return;
    }
    int e = make_dirs(r->path, r->uid, r->gid, r->mode ? (mode_t)(r->mode & 07777) : 0755);
    if (e) {
        send_errno(r->xfer_id, e, "mkdir", r->path);
        return;
    }
    send_stat_result(r->xfer_id, r->path, existed);
}

/* Copies a regular file to `to` (through a temporary file renamed onto it, keeping mode and
 * owner) and removes `from`. 0 or an errno. */
static int copy_file(const char *from, const char *to, const struct stat *st)
{
    static uint8_t buf[DATA_MAX];
    char tmp[PATH_MAX_LEN + 64], dir[PATH_MAX_LEN + 1];
    int e = 0;
    dir_of(to, dir);
    snprintf(tmp, sizeof(tmp), "%s/.space-move-XXXXXX", strcmp(dir, "/") ? dir : "");
    int in = open(from, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (in < 0)
        return errno;
    int out = mkostemp(tmp, O_CLOEXEC);
    if (out < 0) {
        e = errno;
        close(in);
        return e;
    }
    for (;;) {
        ssize_t n = read(in, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            e = n < 0 ? errno : 0;
            break;
        }
        for (ssize_t off = 0; off < n && !e;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                e = w < 0 ? errno : EIO;
            else
                off += w;
        }
        if (e)
            break;
    }
    close(in);
    if (!e && (fchmod(out, st->st_mode & 07777) < 0 || fchown(out, st->st_uid, st->st_gid) < 0))
        e = errno;
    if (close(out) < 0 && !e)
        e = errno;
    if (!e && rename(tmp, to) < 0)
        e = errno;
    if (e) {
        (void)unlink(tmp);
        return e;
    }
    return unlink(from) < 0 ? errno : 0;
}

static void op_move(const Space__Agent__V1__FileRequest *r)
{
    char dir[PATH_MAX_LEN + 1];
    struct stat st;
    if (!path_ok(r->to)) {
        send_failed(r->xfer_id, "bad_path", "move: bad destination");
        return;
    }
    if (lstat(r->path, &st) < 0) {
        send_errno(r->xfer_id, errno, "move", r->path);
        return;
    }
    dir_of(r->to, dir);
    int e = make_dirs(dir, r->uid, r->gid, 0755);
    if (e) {
        send_errno(r->xfer_id, e, "mkdir", dir);
        return;
    }
    if (rename(r->path, r->to) < 0) {
        e = errno;
        /* /tmp is gVisor's own tmpfs, the rest the rootfs: a file moves across by copy. */
        if (e == EXDEV && S_ISREG(st.st_mode))
            e = copy_file(r->path, r->to, &st);
        if (e) {
            send_errno(r->xfer_id, e, "move to", r->to);
            return;
        }
    }
    send_stat_result(r->xfer_id, r->to, false);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int rc = flag == FTW_DP ? rmdir(path) : unlink(path);
    return rc < 0 ? errno : 0;
}

/* Recursive removes in child processes: pid, transfer and path of each. */
static struct {
    pid_t pid;
    uint64_t id;
    char *path;
} removers[MAX_REMOVERS];
static size_t n_removers;

/* The child holds none of the agent's descriptors: a command's stdin pipe kept open here would
 * keep that command from seeing its EOF until the remove ends. */
static void close_inherited(void)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 0U, ~0U, 0U) == 0)
        return;
#endif
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return;
    int self = dirfd(d);
    for (struct dirent *e; (e = readdir(d));) {
        char *end = NULL;
        long fd = strtol(e->d_name, &end, 10);
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && *end == '\0' && fd != self)
            close((int)fd);
    }
    closedir(d);
}

/* Forks the remover of directory path for request id; false when it could not (the caller
 * removes in the loop). */
static bool remove_in_child(const Space__Agent__V1__FileRequest *r)
{
    if (n_removers == MAX_REMOVERS)
        return false;
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        /* It keeps the agent's credentials, CAP_SYS_ADMIN included, and its non-dumpable
         * memory (agent.c, holds_admin); it runs no program of the guest. */
        close_inherited();
        int rc = nftw(r->path, rm_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
        if (rc < 0)
            rc = errno; /* nftw's own failure; else rm_one's errno, or 0 */
        _exit(rc > 0 && rc < 256 ? rc : rc ? EIO : 0);
    }
    removers[n_removers].pid = pid;
    removers[n_removers].id = r->xfer_id;
    removers[n_removers++].path = strdup(r->path);
    return true;
}

bool agent_files_reaped(pid_t pid, int status)
{
    for (size_t i = 0; i < n_removers; i++) {
        if (removers[i].pid != pid)
            continue;
        const char *path = removers[i].path ? removers[i].path : "";
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
            send_result(removers[i].id, NULL, false, false);
        else if (WIFEXITED(status))
            send_errno(removers[i].id, WEXITSTATUS(status), "remove", path);
        else
            send_failed(removers[i].id, "io", "remove %.300s: the remover ended by signal %d", path,
                        WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        free(removers[i].path);
        removers[i] = removers[--n_removers];
        return true;
    }
    return false;
}

bool agent_files_children(void)
{
    return n_removers > 0;
}

static void op_remove(const Space__Agent__V1__FileRequest *r)
{
    struct stat st;
    if (strcmp(r->path, "/") == 0) {
        send_failed(r->xfer_id, "permission", "refusing to remove /");
        return;
    }
    if (lstat(r->path, &st) < 0) {
        send_errno(r->xfer_id, errno, "remove", r->path);
        return;
    }
    int rc;
    if (!S_ISDIR(st.st_mode))
        rc = unlink(r->path) < 0 ? errno : 0;
    else if (!r->recursive)
        rc = rmdir(r->path) < 0 ? errno : 0;
    else if (remove_in_child(r))
        return; /* answered when it is reaped */
    else
        rc = nftw(r->path, rm_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    if (rc > 0 || rc < 0) {
        send_errno(r->xfer_id, rc > 0 ? rc : errno, "remove", r->path);
        return;
    }
    send_result(r->xfer_id, NULL, false, false);
}

/* ---- list ---- */

typedef struct {
    uint64_t id;
    uint32_t max;
    uint32_t count;
    bool truncated;
    info_t *batch[512];
    char *paths[512];
    char *targets[512];
    size_t n, bytes;
} lister_t;

static void list_flush(lister_t *l)
{
    if (l->n == 0)
        return;
    Space__Agent__V1__FileEntries m = SPACE__AGENT__V1__FILE_ENTRIES__INIT;
    m.xfer_id = l->id;
    m.entries = l->batch;
    m.n_entries = l->n;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_ENTRIES;
    f.file_entries = &m;
    agent_send_frame(&f);
    for (size_t i = 0; i < l->n; i++) {
        free(l->batch[i]);
        free(l->paths[i]);
        free(l->targets[i]);
    }
    l->n = 0;
    l->bytes = 0;
}

static void list_add(lister_t *l, const char *path, const struct stat *st)
{
    info_t *in = malloc(sizeof(*in));
    char *p = strdup(path), *t = malloc(PATH_MAX_LEN + 1);
    if (!in || !p || !t)
        abort();
    info_fill(in, p, st, t);
    l->batch[l->n] = in;
    l->paths[l->n] = p;
    l->targets[l->n] = t;
    l->n++;
    l->bytes += space__agent__v1__file_info__get_packed_size(in) + 8;
    l->count++;
    if (l->n == sizeof(l->batch) / sizeof(l->batch[0]) || l->bytes >= ENTRIES_FRAME)
        list_flush(l);
}

static void list_dir(lister_t *l, const char *dir, uint32_t depth)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[PATH_MAX_LEN + 1];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (l->count >= l->max) {
            l->truncated = true;
            break;
        }
        int n = snprintf(path, sizeof(path), "%s/%s", strcmp(dir, "/") ? dir : "", e->d_name);
        if (n < 0 || (size_t)n >= sizeof(path))
            continue;
        struct stat st;
        if (lstat(path, &st) < 0)
            continue;
        list_add(l, path, &st);
        if (S_ISDIR(st.st_mode) && depth > 1)
            list_dir(l, path, depth - 1);
        if (l->truncated)
            break;
    }
    closedir(d);
}

static void op_list(const Space__Agent__V1__FileRequest *r)
{
    struct stat st;
    if (stat(r->path, &st) < 0) {
        send_errno(r->xfer_id, errno, "list", r->path);
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        send_failed(r->xfer_id, "not_directory", "%.300s is not a directory", r->path);
        return;
    }
    lister_t *l = calloc(1, sizeof(*l));
    if (!l)
        abort();
    l->id = r->xfer_id;
    l->max = r->max_entries && r->max_entries < LIST_MAX ? r->max_entries : LIST_MAX;
    uint32_t depth = r->depth == 0 ? 1 : r->depth > DEPTH_MAX ? DEPTH_MAX : r->depth;
    list_dir(l, r->path, depth);
    list_flush(l);
    send_result(r->xfer_id, NULL, l->truncated, false);
    free(l);
}

/* ---- data ---- */

static void do_write(const Space__Agent__V1__FileWrite *w)
{
    size_t i;
    xfer_t *x = xfer_find(w->xfer_id, &i);
    if (!x || !x->write) {
        send_failed(w->xfer_id, "io", "write: no open write %llu", (unsigned long long)w->xfer_id);
        return;
    }
    if (w->offset != x->offset || w->data.len > DATA_MAX) {
        send_failed(w->xfer_id, "io", "write at %llu, expected %llu", (unsigned long long)w->offset,
                    (unsigned long long)x->offset);
        xfer_drop(i);
        return;
    }
    size_t off = 0;
    while (off < w->data.len) {
        ssize_t n = write(x->fd, w->data.data + off, w->data.len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            send_errno(w->xfer_id, n < 0 ? errno : EIO, "write", x->path);
            xfer_drop(i);
            return;
        }
        off += (size_t)n;
    }
    x->offset += w->data.len;
    Space__Agent__V1__FileAck a = SPACE__AGENT__V1__FILE_ACK__INIT;
    a.xfer_id = w->xfer_id;
    a.offset = x->offset;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_ACK;
    f.file_ack = &a;
    agent_send_frame(&f);
}

static void send_data(uint64_t id, uint64_t offset, const uint8_t *p, size_t n, bool eof)
{
    Space__Agent__V1__FileData d = SPACE__AGENT__V1__FILE_DATA__INIT;
    d.xfer_id = id;
    d.offset = offset;
    d.data.data = (uint8_t *)p;
    d.data.len = n;
    d.eof = eof;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_DATA;
    f.file_data = &d;
    agent_send_frame(&f);
}

static void do_read(const Space__Agent__V1__FileRead *r)
{
    static uint8_t buf[DATA_MAX];
    size_t i;
    xfer_t *x = xfer_find(r->xfer_id, &i);
    if (!x || x->write) {
        send_failed(r->xfer_id, "io", "read: no open read %llu", (unsigned long long)r->xfer_id);
        return;
    }
    uint64_t off = r->offset;
    size_t left = r->length > READ_MAX ? READ_MAX : r->length;
    do {
        size_t want = left < DATA_MAX ? left : DATA_MAX;
        ssize_t n = pread(x->fd, buf, want, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            send_errno(r->xfer_id, errno, "read", x->path);
            xfer_drop(i);
            return;
        }
        bool eof = (size_t)n < want;
        send_data(r->xfer_id, off, buf, (size_t)n, eof);
        off += (uint64_t)n;
        left -= (size_t)n;
        if (eof)
            return;
    } while (left > 0);
}

static void do_request(const Space__Agent__V1__FileRequest *r)
{
    if (r->xfer_id == 0) {
        send_failed(0, "bad_path", "no transfer id");
        return;
    }
    if (r->op != SPACE__AGENT__V1__FILE_OP__FILE_OP_COMMIT &&
        r->op != SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE && !path_ok(r->path)) {
        send_failed(r->xfer_id, "bad_path", "the path must be absolute, 1..%d bytes", PATH_MAX_LEN);
        return;
    }
    if (xfer_find(r->xfer_id, NULL) && r->op != SPACE__AGENT__V1__FILE_OP__FILE_OP_COMMIT &&
        r->op != SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE) {
        send_failed(r->xfer_id, "io", "transfer %llu is open", (unsigned long long)r->xfer_id);
        return;
    }
    switch (r->op) {
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_STAT:
        send_stat_result(r->xfer_id, r->path, false);
        break;
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_LIST:
        op_list(r);
        break;
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_MKDIR:
        op_mkdir(r);
        break;
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_MOVE:
        op_move(r);
        break;
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_REMOVE:
        op_remove(r);
        break;
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_WRITE_OPEN:
        op_write_open(r);
        break;
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_READ_OPEN:
        op_read_open(r);
        break;
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_COMMIT:
        op_commit(r);
        break;
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE:
        op_close(r);
        break;
    case SPACE__AGENT__V1__FILE_OP__FILE_OP_WATCH:
        agent_watch_open(r);
        break;
    default:
        send_failed(r->xfer_id, "io", "unknown file op %d", (int)r->op);
        break;
    }
}

bool agent_files_handle(const frame_t *f)
{
    switch (f->msg_case) {
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_REQUEST:
        do_request(f->file_request);
        return true;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_WRITE:
        do_write(f->file_write);
        return true;
    case SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_READ:
        do_read(f->file_read);
        return true;
    default:
        return false;
    }
}
