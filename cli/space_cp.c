/* `space cp LOCAL ID:PATH` and `space cp ID:PATH LOCAL`: files in and out of a sandbox through
 * the files API, streamed both ways (lib/httpc.c reads the local file as it sends and writes
 * the download as it arrives). A download lands in a temporary file next to LOCAL, renamed
 * into place once complete. With stderr on a terminal, transfers over 1 MiB show a progress
 * line. On an error the server's message is printed and the exit status is 1. */
#include <errno.h>
#include <dirent.h>
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
    char *who = sp_xasprintf("space cp: %s", what);
    int code = sp__api_error(who, r);
    free(who);
    return code;
}

/* GET .../files<sub>?path=P<extra> as JSON: SP_STACK_EXIT_OK and *ret_doc, or the exit code
 * of the failure (printed). */
static int get_json(const sp_api_t *api, const char *id, const char *sub, const char *path,
                    const char *extra, sp_json_doc_t **ret_doc)
{
    char *url = files_url(id, sub, path, extra);
    sp_httpc_resp_t r;
    char err[SP_JSON_ERR_MAX];
    int rc = sp__api_call(api, "GET", url, NULL, NULL, 0, 60000, &r);
    free(url);
    if (rc < 0)
        return SP_STACK_EXIT_FAIL;
    int code = SP_STACK_EXIT_OK;
    if (r.status != 200) {
        code = fail(path, &r);
    } else if (sp_json_parse(r.body, r.body_len, NULL, ret_doc, err) < 0) {
        fprintf(stderr, "space cp: %s: the answer is not JSON: %s\n", path, err);
        code = SP_STACK_EXIT_FAIL;
    }
    sp_httpc_resp_free(&r);
    return code;
}

static int upload(const sp_api_t *api, const char *local, const char *id, const char *path)
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
    sp_httpc_req_t q = {.host = api->host,
                        .port = api->port,
                        .method = "PUT",
                        .path = url,
                        .key = api->key,
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

static int download(const sp_api_t *api, const char *id, const char *path, const char *local)
{
    /* The size first, for the progress line (and a clear error before any file is made). */
    int64_t size = 0;
    sp_json_doc_t *doc = NULL;
    int rc = get_json(api, id, "/stat", path, NULL, &doc);
    if (rc != SP_STACK_EXIT_OK)
        return rc;
    sp_json_int(sp_json_get(sp_json_root(doc), "size"), 0, INT64_MAX, &size);
    /* The file's permission bits ("0755") less our umask, as cp gives a new file; the owner
     * stays ours. Without them, the temporary file's 0600. */
    const char *mode_s = sp_json_str(sp_json_get(sp_json_root(doc), "mode"), NULL);
    char *mode_end = NULL;
    unsigned long mode = mode_s ? strtoul(mode_s, &mode_end, 8) : 0;
    bool have_mode = mode_s && mode_s[0] && *mode_end == '\0' && mode <= 0777;
    sp_json_doc_free(doc);
    sp_httpc_resp_t r;

    char *tmp = sp_xasprintf("%s.space-cp-XXXXXX", local);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "space cp: %s: %s\n", local, strerror(errno));
        free(tmp);
        return SP_STACK_EXIT_FAIL;
    }
    char *url = files_url(id, "", path, NULL);
    xfer_t x = {.fd = fd,
                .total = (unsigned long long)size,
                .show = isatty(2) && size > PROGRESS_MIN,
                .t0 = sp_mono_ns(),
                .what = "download"};
    sp_httpc_req_t g = {.host = api->host,
                        .port = api->port,
                        .method = "GET",
                        .path = url,
                        .key = api->key,
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
    if (code == SP_STACK_EXIT_OK && have_mode) {
        mode_t mask = umask(0);
        umask(mask);
        (void)fchmod(fd, (mode_t)mode & ~mask);
    }
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

/* ---- -r: a directory, walked with the files API (it has no tar route) ---- */

/* Every directory and regular file under local, depth first: a mkdir for each directory, an
 * upload for each file. Symbolic links and other kinds are skipped with a note (the files API
 * makes files and directories only). */
static int upload_tree(const sp_api_t *api, const char *local, const char *id, const char *path)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"path\":");
    sp_buf_json_str(&b, path);
    sp_buf_putc(&b, '}');
    char *url = sp_xasprintf("/v1/sandboxes/%s/files/mkdir", id);
    sp_httpc_resp_t r;
    int rc = sp__api_call(api, "POST", url, NULL, b.data, b.len, 60000, &r);
    free(url);
    sp_buf_dispose(&b);
    if (rc < 0)
        return SP_STACK_EXIT_FAIL;
    int code = r.status == 200 || r.status == 201 ? SP_STACK_EXIT_OK : fail(path, &r);
    sp_httpc_resp_free(&r);
    if (code != SP_STACK_EXIT_OK)
        return code;

    DIR *d = opendir(local);
    if (!d) {
        fprintf(stderr, "space cp: %s: %s\n", local, strerror(errno));
        return SP_STACK_EXIT_FAIL;
    }
    struct dirent *e;
    while (code == SP_STACK_EXIT_OK && (errno = 0, e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *lp = sp_xasprintf("%s/%s", local, e->d_name);
        char *rp = sp_xasprintf("%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(lp, &st) < 0) {
            fprintf(stderr, "space cp: %s: %s\n", lp, strerror(errno));
            code = SP_STACK_EXIT_FAIL;
        } else if (S_ISDIR(st.st_mode)) {
            code = upload_tree(api, lp, id, rp);
        } else if (S_ISREG(st.st_mode)) {
            code = upload(api, lp, id, rp);
        } else {
            fprintf(stderr, "space cp: %s: skipped (not a file or directory)\n", lp);
        }
        free(lp);
        free(rp);
    }
    if (code == SP_STACK_EXIT_OK && errno) {
        fprintf(stderr, "space cp: %s: %s\n", local, strerror(errno));
        code = SP_STACK_EXIT_FAIL;
    }
    closedir(d);
    return code;
}

/* The name of entry p of a listing of dir: what follows "dir/" (the API gives full paths), or p
 * itself when relative; NULL for one that is no plain name (a hostile answer: "..", a slash). */
static const char *entry_name(const char *dir, const char *p)
{
    size_t n = strlen(dir);
    if (strncmp(p, dir, n) == 0 && p[n] == '/')
        p += n + 1;
    else if (p[0] == '/') {
        const char *slash = strrchr(p, '/');
        p = slash + 1;
    }
    if (!p[0] || strchr(p, '/') || strcmp(p, ".") == 0 || strcmp(p, "..") == 0)
        return NULL;
    return p;
}

static int download_tree(const sp_api_t *api, const char *id, const char *path, const char *local)
{
    if (mkdir(local, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "space cp: %s: %s\n", local, strerror(errno));
        return SP_STACK_EXIT_FAIL;
    }
    sp_json_doc_t *doc = NULL;
    int code = get_json(api, id, "/list", path, "&depth=1", &doc);
    if (code != SP_STACK_EXIT_OK)
        return code;
    const sp_json_t *root = sp_json_root(doc), *list = sp_json_get(root, "entries");
    bool truncated = false;
    if (sp_json_bool(sp_json_get(root, "truncated"), &truncated) == 0 && truncated) {
        fprintf(stderr, "space cp: %s: more entries than one listing holds (10,000)\n", path);
        code = SP_STACK_EXIT_FAIL;
    }
    for (size_t i = 0; code == SP_STACK_EXIT_OK && i < sp_json_len(list); i++) {
        const sp_json_t *ent = sp_json_at(list, i);
        const char *p = sp_json_str(sp_json_get(ent, "path"), NULL);
        const char *type = sp_json_str(sp_json_get(ent, "type"), NULL);
        const char *name = p ? entry_name(path, p) : NULL;
        if (!name || !type) {
            fprintf(stderr, "space cp: %s: an entry without a plain name, skipped\n", path);
            continue;
        }
        char *rp = sp_xasprintf("%s/%s", path, name);
        char *lp = sp_xasprintf("%s/%s", local, name);
        if (strcmp(type, "dir") == 0)
            code = download_tree(api, id, rp, lp);
        else if (strcmp(type, "file") == 0) {
            code = download(api, id, rp, lp);
            /* The permission bits as the listing gives them ("0755"); the owner stays ours. */
            const char *mode = sp_json_str(sp_json_get(ent, "mode"), NULL);
            char *end = NULL;
            unsigned long m = mode ? strtoul(mode, &end, 8) : 0;
            if (code == SP_STACK_EXIT_OK && mode && *end == '\0' && m <= 0777)
                (void)chmod(lp, (mode_t)m);
        } else
            fprintf(stderr, "space cp: %s: skipped (%s)\n", rp, type);
        free(rp);
        free(lp);
    }
    sp_json_doc_free(doc);
    return code;
}

int sp__client_cp(const sp_api_t *api, int argc, char **argv)
{
    char id[SP_ID_MAX + 1], other[SP_ID_MAX + 1];
    const char *path, *other_path;
    bool recursive = false;
    if (argc >= 1 && (strcmp(argv[0], "-r") == 0 || strcmp(argv[0], "-R") == 0 ||
                      strcmp(argv[0], "--recursive") == 0)) {
        recursive = true;
        argc--;
        argv++;
    }
    if (argc != 2) {
        sp_client_usage("cp", stderr);
        return SP_STACK_EXIT_USAGE;
    }
    if (remote(argv[1], id, &path) && !remote(argv[0], other, &other_path)) {
        struct stat st;
        if (recursive && stat(argv[0], &st) == 0 && S_ISDIR(st.st_mode))
            return upload_tree(api, argv[0], id, path);
        if (!recursive && stat(argv[0], &st) == 0 && S_ISDIR(st.st_mode)) {
            fprintf(stderr, "space cp: %s is a directory (use -r)\n", argv[0]);
            return SP_STACK_EXIT_USAGE;
        }
        return upload(api, argv[0], id, path);
    }
    if (remote(argv[0], id, &path) && !remote(argv[1], other, &other_path))
        return recursive ? download_tree(api, id, path, argv[1]) : download(api, id, path, argv[1]);
    fprintf(stderr, "space cp: exactly one of the two must be ID:PATH (a local name with a ':' "
                    "can be written ./NAME)\n");
    return SP_STACK_EXIT_USAGE;
}
