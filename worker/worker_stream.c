/* A suspend's and a resume's byte streams in the worker's own process (worker_runtime_int.h,
 * "streams"): zstd through libzstd, and a disk's `btrfs send` through the kernel's send ioctl
 * into a pipe that is compressed as it is read, so no staging file and no process.
 *
 * Why (issue 21 part 3, docs/machine-notes.md "Suspend's disk in-process"): the `zstd` and
 * `btrfs` tools cost a process each, and this host's page faults are dear: `zstd -1` of the
 * ~1 MB disk delta took 15-17 ms of CPU (555 page faults), most of it making its buffers.
 * Here the contexts and buffers are made once and kept (a small free list), so a second use
 * faults nothing. The frames are the tool's (content checksum on), so either side reads the
 * other's. */
#include <errno.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <zstd.h>

#include <btrfsutil.h>

#include "fdio.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

/* ---- contexts and buffers, kept ---- */

#define KEEP_MAX 4 /* at most this many of each kind wait for reuse */

typedef struct stream_ctx {
    struct stream_ctx *next;
    ZSTD_CCtx *c; /* one of c and d */
    ZSTD_DCtx *d;
    uint8_t *in, *out;
    size_t in_cap, out_cap;
} stream_ctx_t;

static pthread_mutex_t keep_lock = PTHREAD_MUTEX_INITIALIZER;
static stream_ctx_t *kept[2]; /* [0] compressors, [1] decompressors */
static int kept_n[2];

static stream_ctx_t *ctx_get(bool decompress)
{
    int k = decompress ? 1 : 0;
    pthread_mutex_lock(&keep_lock);
    stream_ctx_t *s = kept[k];
    if (s) {
        kept[k] = s->next;
        kept_n[k]--;
    }
    pthread_mutex_unlock(&keep_lock);
    if (s)
        return s;
    s = sp_xcalloc(1, sizeof(*s));
    if (decompress) {
        s->d = ZSTD_createDCtx();
        s->in_cap = ZSTD_DStreamInSize();
        s->out_cap = ZSTD_DStreamOutSize();
    } else {
        s->c = ZSTD_createCCtx();
        s->in_cap = ZSTD_CStreamInSize();
        s->out_cap = ZSTD_CStreamOutSize();
    }
    s->in = sp_xmalloc(s->in_cap);
    s->out = sp_xmalloc(s->out_cap);
    if (!s->c && !s->d) {
        /* As sp_xmalloc does: out of memory ends the process. */
        fputs("space: zstd context: out of memory\n", stderr);
        abort();
    }
    return s;
}

static void ctx_free(stream_ctx_t *s)
{
    ZSTD_freeCCtx(s->c);
    ZSTD_freeDCtx(s->d);
    free(s->in);
    free(s->out);
    free(s);
}

static void ctx_put(stream_ctx_t *s)
{
    int k = s->d ? 1 : 0;
    /* A context that failed midway starts clean. */
    if (s->c)
        (void)ZSTD_CCtx_reset(s->c, ZSTD_reset_session_and_parameters);
    else
        (void)ZSTD_DCtx_reset(s->d, ZSTD_reset_session_and_parameters);
    pthread_mutex_lock(&keep_lock);
    bool keep = kept_n[k] < KEEP_MAX;
    if (keep) {
        s->next = kept[k];
        kept[k] = s;
        kept_n[k]++;
    }
    pthread_mutex_unlock(&keep_lock);
    if (!keep)
        ctx_free(s);
}

/* ---- fds ---- */

static int open_out(const char *path, char err[WK_ERR_MAX])
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return wk__fail(err, -errno, "create %s: %s", path, strerror(errno));
    return fd;
}

/* ---- zstd ---- */

/* in_fd to its end, compressed at level into out_fd. what names the input in err. */
static int compress_fd(int in_fd, int out_fd, int level, const char *what, char err[WK_ERR_MAX])
{
    stream_ctx_t *s = ctx_get(false);
    int rc = 0;
    size_t e = ZSTD_CCtx_setParameter(s->c, ZSTD_c_compressionLevel, level);
    if (!ZSTD_isError(e))
        e = ZSTD_CCtx_setParameter(s->c, ZSTD_c_checksumFlag, 1);
    if (ZSTD_isError(e))
        rc = wk__fail(err, -EINVAL, "zstd %s: %s", what, ZSTD_getErrorName(e));
    for (bool last = false; rc == 0 && !last;) {
        ssize_t n = sp_read_full(in_fd, s->in, s->in_cap);
        if (n < 0) {
            rc = wk__fail(err, (int)n, "read %s: %s", what, strerror((int)-n));
            break;
        }
        last = (size_t)n < s->in_cap;
        ZSTD_inBuffer in = {s->in, (size_t)n, 0};
        for (bool done = false; rc == 0 && !done;) {
            ZSTD_outBuffer out = {s->out, s->out_cap, 0};
            size_t left =
                ZSTD_compressStream2(s->c, &out, &in, last ? ZSTD_e_end : ZSTD_e_continue);
            if (ZSTD_isError(left)) {
                rc = wk__fail(err, -EIO, "zstd %s: %s", what, ZSTD_getErrorName(left));
                break;
            }
            int w = sp_write_all(out_fd, s->out, out.pos);
            if (w < 0)
                rc = wk__fail(err, w, "write %s compressed: %s", what, strerror(-w));
            done = last ? left == 0 : in.pos == in.size;
        }
    }
    ctx_put(s);
    return rc;
}

/* in_fd (zstd frames) to its end, decompressed into out_fd. */
static int decompress_fd(int in_fd, int out_fd, const char *what, char err[WK_ERR_MAX])
{
    stream_ctx_t *s = ctx_get(true);
    int rc = 0;
    size_t left = 0; /* nonzero: a frame not finished */
    bool any = false;
    for (;;) {
        ssize_t n = sp_read_full(in_fd, s->in, s->in_cap);
        if (n < 0) {
            rc = wk__fail(err, (int)n, "read %s: %s", what, strerror((int)-n));
            break;
        }
        if (n == 0)
            break;
        any = true;
        ZSTD_inBuffer in = {s->in, (size_t)n, 0};
        while (rc == 0 && in.pos < in.size) {
            ZSTD_outBuffer out = {s->out, s->out_cap, 0};
            left = ZSTD_decompressStream(s->d, &out, &in);
            if (ZSTD_isError(left)) {
                rc = wk__fail(err, -EBADMSG, "zstd -d %s: %s", what, ZSTD_getErrorName(left));
                break;
            }
            int w = sp_write_all(out_fd, s->out, out.pos);
            if (w < 0)
                rc = wk__fail(err, w, "write %s: %s", what, strerror(-w));
        }
        if (rc < 0)
            break;
    }
    /* Output the decoder still holds of the last frame. */
    while (rc == 0 && left > 0) {
        ZSTD_inBuffer in = {NULL, 0, 0};
        ZSTD_outBuffer out = {s->out, s->out_cap, 0};
        left = ZSTD_decompressStream(s->d, &out, &in);
        if (ZSTD_isError(left)) {
            rc = wk__fail(err, -EBADMSG, "zstd -d %s: %s", what, ZSTD_getErrorName(left));
            break;
        }
        if (out.pos == 0)
            break; /* no progress without input: truncated */
        int w = sp_write_all(out_fd, s->out, out.pos);
        if (w < 0)
            rc = wk__fail(err, w, "write %s: %s", what, strerror(-w));
    }
    if (rc == 0 && (left > 0 || !any))
        rc = wk__fail(err, -EBADMSG, "zstd -d %s: %s", what, any ? "truncated" : "empty");
    ctx_put(s);
    return rc;
}

int wk__zstd_file(const char *in_path, const char *out_path, int level, char err[WK_ERR_MAX])
{
    int in = open(in_path, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return wk__fail(err, -errno, "open %s: %s", in_path, strerror(errno));
    int out = open_out(out_path, err);
    int rc = out < 0 ? out : compress_fd(in, out, level, in_path, err);
    if (out >= 0 && close(out) < 0 && rc == 0)
        rc = wk__fail(err, -errno, "close %s: %s", out_path, strerror(errno));
    close(in);
    if (rc < 0)
        unlink(out_path);
    return rc;
}

int wk__unzstd_file(const char *in_path, const char *out_path, char err[WK_ERR_MAX])
{
    int in = open(in_path, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return wk__fail(err, -errno, "open %s: %s", in_path, strerror(errno));
    int out = open_out(out_path, err);
    int rc = out < 0 ? out : decompress_fd(in, out, in_path, err);
    if (out >= 0 && close(out) < 0 && rc == 0)
        rc = wk__fail(err, -errno, "close %s: %s", out_path, strerror(errno));
    close(in);
    if (rc < 0)
        unlink(out_path);
    return rc;
}

/* ---- btrfs send ---- */

typedef struct {
    int subvol_fd, pipe_fd;
    struct btrfs_ioctl_send_args args;
    int rc; /* 0 or -errno of the ioctl */
} send_job_t;

static void *send_main(void *arg)
{
    send_job_t *j = arg;
    /* A reader that stopped early makes the kernel's write fail with EPIPE; the SIGPIPE that
     * comes with it stays pending on this thread, which ends, instead of ending a process that
     * does not ignore it. */
    sigset_t pipe_sig;
    sigemptyset(&pipe_sig);
    sigaddset(&pipe_sig, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_sig, NULL);
    j->rc = ioctl(j->subvol_fd, BTRFS_IOC_SEND, &j->args) < 0 ? -errno : 0;
    /* The end of the stream for the reader. */
    close(j->pipe_fd);
    j->pipe_fd = -1;
    return NULL;
}

int wk__btrfs_send_zstd(const char *subvol, const char *parent, const char *out_path, int level,
                        char err[WK_ERR_MAX])
{
    uint64_t parent_id = 0;
    errno = 0;
    if (btrfs_util_subvolume_id(parent, &parent_id) != BTRFS_UTIL_OK)
        return wk__fail(err, errno ? -errno : -EINVAL, "btrfs send: the id of %s: %s", parent,
                        strerror(errno ? errno : EINVAL));
    int p[2] = {-1, -1}, out = -1, rc = 0;
    send_job_t j = {.subvol_fd = open(subvol, O_RDONLY | O_DIRECTORY | O_CLOEXEC), .pipe_fd = -1};
    if (j.subvol_fd < 0)
        return wk__fail(err, -errno, "btrfs send: open %s: %s", subvol, strerror(errno));
    if ((out = open_out(out_path, err)) < 0) {
        close(j.subvol_fd);
        return out;
    }
    if (pipe2(p, O_CLOEXEC) < 0) {
        rc = wk__fail(err, -errno, "btrfs send: pipe: %s", strerror(errno));
        goto done;
    }
    /* Fewer switches between the kernel's writer and this reader (best effort). */
    (void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
    /* As `btrfs send -p parent`: the parent is also the source its clones refer to. */
    __u64 clone_sources[1] = {parent_id};
    j.pipe_fd = p[1];
    j.args.send_fd = p[1];
    j.args.parent_root = parent_id;
    j.args.clone_sources = clone_sources;
    j.args.clone_sources_count = 1;
    pthread_t th;
    if (pthread_create(&th, NULL, send_main, &j) != 0) {
        close(p[1]);
        rc = wk__fail(err, -EAGAIN, "btrfs send: no thread");
        goto done;
    }
    rc = compress_fd(p[0], out, level, "the btrfs send stream", err);
    /* A reader that stopped early: the writer gets EPIPE and ends (send_main). */
    close(p[0]);
    p[0] = -1;
    pthread_join(th, NULL);
    if (rc == 0 && j.rc < 0)
        rc = wk__fail(err, j.rc, "btrfs send %s: %s", subvol, strerror(-j.rc));
done:
    if (p[0] >= 0)
        close(p[0]);
    if (close(out) < 0 && rc == 0)
        rc = wk__fail(err, -errno, "close %s: %s", out_path, strerror(errno));
    close(j.subvol_fd);
    if (rc < 0)
        unlink(out_path);
    return rc;
}
