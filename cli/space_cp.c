/* `space cp LOCAL ID:PATH` and `space cp ID:PATH LOCAL`: files in and out of a sandbox through
 * the files API, streamed both ways (lib/httpc.c reads the local file as it sends and writes
 * the download as it arrives). A download lands in a temporary file next to LOCAL, renamed
 * into place once complete. With stderr on a terminal, transfers over 1 MiB show a progress
 * line. On an error the server's message is printed and the exit status is 1. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buf.h"
#include "error.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "reduce.h"
#include "space_stack.h"
#include "xmalloc.h"

#define PROGRESS_MIN (1u << 20)

typedef struct {
    int fd;
    unsigned long long done, total;
    bool show;
    int64_t t0, last;
    const char *what;
} xfer_t;

static void progress(xfer_t *x, bool end)
{
    if (!x->show)
        return;
    int64_t now = sp_mono_ns();
    if (!end && now - x->last < 200000000LL)
        return;
    x->last = now;
    double s = (double)(now - x->t0) / 1e9;
    double mb = (double)x->done / 1e6;
    if (x->total)
        fprintf(stderr, "\r%s %.1f / %.1f MB (%3.0f%%) %.1f MB/s ", x->what, mb,
                (double)x->total / 1e6, 100.0 * (double)x->done / (double)x->total,
                s > 0 ? mb / s : 0.0);
    else
        fprintf(stderr, "\r%s %.1f MB %.1f MB/s ", x->what, mb, s > 0 ? mb / s : 0.0);
    if (end)
        fputc('\n', stderr);
}

static long long read_local(void *arg, void *buf, size_t len)
{
    xfer_t *x = arg;
    for (;;) {
        ssize_t n = read(x->fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        x->done += (unsigned long long)n;
        progress(x, false);
        return n;
    }
}

static int write_local(void *arg, const void *data, size_t len)
{
    xfer_t *x = arg;
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(x->fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        p += n;
        len -= (size_t)n;
        x->done += (unsigned long long)n;
    }
    progress(x, false);
    return 0;
}

/* "ID:PATH" with a valid id: the id is copied, *ret_path points after the colon. */
static bool remote(const char *arg, char id[SP_ID_MAX + 1], const char **ret_path)
{
    const char *colon = strchr(arg, ':');
    if (!colon || colon == arg || (size_t)(colon - arg) > SP_ID_MAX)
        return false;
    memcpy(id, arg, (size_t)(colon - arg));
    id[colon - arg] = '\0';
    *ret_path = colon + 1;
    return sp_id_valid(id) && colon[1];
}

/* /v1/sandboxes/ID/files[sub]?path=<percent-encoded>[extra] */
static char *files_url(const char *id, const char *sub, const char *path, const char *extra)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_printf(&b, "/v1/sandboxes/%s/files%s?path=", id, sub);
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
            strchr("-._~/", *p))
            sp_buf_putc(&b, (char)*p);
        else
            sp_buf_printf(&b, "%%%02X", *p);
    }
    if (extra)
        sp_buf_puts(&b, extra);
    return sp_buf_take(&b);
}

/* The server's message for a failed answer (its JSON "message", else the body). */
static int fail(const char *what, const sp_httpc_resp_t *r)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    const char *msg = NULL;
    if (r->body && sp_json_parse(r->body, r->body_len, NULL, &doc, err) == 0)
        msg = sp_json_str(sp_json_get(sp_json_root(doc), "message"), NULL);
    fprintf(stderr, "space cp: %s: HTTP %d: %s\n", what, r->status, msg ? msg : r->body);
    sp_json_doc_free(doc);
    return SP_STACK_EXIT_FAIL;
}

static int upload(const char *host, int port, const char *key, const char *local, const char *id,
                  const char *path)
{
    struct stat st;
    int fd = open(local, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "space cp: %s: %s\n", local,
                fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return SP_STACK_EXIT_FAIL;
    }
    char extra[32];
    snprintf(extra, sizeof(extra), "&mode=%04o", (unsigned)(st.st_mode & 07777));
    char *url = files_url(id, "", path, extra);
    xfer_t x = {.fd = fd,
                .total = (unsigned long long)st.st_size,
                .show = isatty(2) && st.st_size > PROGRESS_MIN,
                .t0 = sp_mono_ns(),
                .what = "upload"};
    sp_httpc_req_t q = {.host = host,
                        .port = port,
                        .method = "PUT",
                        .path = url,
                        .key = key,
                        .content_type = "application/octet-stream",
                        .body_read = read_local,
                        .body_read_len = (unsigned long long)st.st_size,
                        .body_arg = &x,
                        .timeout_ms = 24 * 3600 * 1000};
    sp_httpc_resp_t r;
    int rc = sp_httpc_do(&q, &r);
    close(fd);
    free(url);
    progress(&x, true);
    if (rc < 0) {
        fprintf(stderr, "space cp: %s: %s\n", local, sp_strerror(rc));
        return SP_STACK_EXIT_FAIL;
    }
    int code = r.status == 200 ? SP_STACK_EXIT_OK : fail(path, &r);
    sp_httpc_resp_free(&r);
    return code;
}

static int download(const char *host, int port, const char *key, const char *id, const char *path,
                    const char *local)
{
    /* The size first, for the progress line (and a clear error before any file is made). */
    char *url = files_url(id, "/stat", path, NULL);
    sp_httpc_req_t q = {.host = host, .port = port, .method = "GET", .path = url, .key = key};
    sp_httpc_resp_t r;
    int rc = sp_httpc_do(&q, &r);
    free(url);
    if (rc < 0) {
        fprintf(stderr, "space cp: %s: %s\n", path, sp_strerror(rc));
        return SP_STACK_EXIT_FAIL;
    }
    if (r.status != 200) {
        int code = fail(path, &r);
        sp_httpc_resp_free(&r);
        return code;
    }
    int64_t size = 0;
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (sp_json_parse(r.body, r.body_len, NULL, &doc, err) == 0)
        sp_json_int(sp_json_get(sp_json_root(doc), "size"), 0, INT64_MAX, &size);
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);

    char *tmp = sp_xasprintf("%s.space-cp-XXXXXX", local);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "space cp: %s: %s\n", local, strerror(errno));
        free(tmp);
        return SP_STACK_EXIT_FAIL;
    }
    url = files_url(id, "", path, NULL);
    xfer_t x = {.fd = fd,
                .total = (unsigned long long)size,
                .show = isatty(2) && size > PROGRESS_MIN,
                .t0 = sp_mono_ns(),
                .what = "download"};
    sp_httpc_req_t g = {.host = host,
                        .port = port,
                        .method = "GET",
                        .path = url,
                        .key = key,
                        .body_sink = write_local,
                        .sink_arg = &x,
                        .timeout_ms = 24 * 3600 * 1000};
    rc = sp_httpc_do(&g, &r);
    free(url);
    progress(&x, true);
    int code = SP_STACK_EXIT_OK;
    if (rc < 0) {
        fprintf(stderr, "space cp: %s: %s\n", path, sp_strerror(rc));
        code = SP_STACK_EXIT_FAIL;
    } else if (r.status != 200) {
        code = fail(path, &r);
    } else if (x.done != (unsigned long long)size && size >= 0) {
        /* The file changed between stat and read, or the stream was cut. */
        char cl[32];
        if (sp_httpc_header(&r, "content-length", cl, sizeof(cl)) < 0 ||
            strtoull(cl, NULL, 10) != x.done) {
            fprintf(stderr, "space cp: %s: incomplete download\n", path);
            code = SP_STACK_EXIT_FAIL;
        }
    }
    if (rc == 0)
        sp_httpc_resp_free(&r);
    if (close(fd) < 0 && code == SP_STACK_EXIT_OK) {
        fprintf(stderr, "space cp: %s: %s\n", local, strerror(errno));
        code = SP_STACK_EXIT_FAIL;
    }
    if (code == SP_STACK_EXIT_OK && rename(tmp, local) < 0) {
        fprintf(stderr, "space cp: %s: %s\n", local, strerror(errno));
        code = SP_STACK_EXIT_FAIL;
    }
    if (code != SP_STACK_EXIT_OK)
        unlink(tmp);
    free(tmp);
    return code;
}

int sp__client_cp(const char *host, int port, const char *key, int argc, char **argv)
{
    char id[SP_ID_MAX + 1];
    const char *path;
    if (argc != 2) {
        fprintf(stderr, "usage: space cp LOCAL ID:PATH | space cp ID:PATH LOCAL\n");
        return SP_STACK_EXIT_USAGE;
    }
    char other[SP_ID_MAX + 1];
    const char *other_path;
    if (remote(argv[1], id, &path) && !remote(argv[0], other, &other_path))
        return upload(host, port, key, argv[0], id, path);
    if (remote(argv[0], id, &path) && !remote(argv[1], other, &other_path))
        return download(host, port, key, id, path, argv[1]);
    fprintf(stderr, "space cp: exactly one of the two must be ID:PATH (a local name with a ':' "
                    "can be written ./NAME)\n");
    return SP_STACK_EXIT_USAGE;
}
