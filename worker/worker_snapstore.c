/* The snapshot store (worker.h): where a suspended sandbox's artifacts live until it resumes,
 * on this worker or another one.
 *
 *   dir   snapshot-dir is the store itself, <sandbox>/<snapshot>/<artifact>, a directory every
 *         worker that may resume the sandbox can read (one host, or a shared file system).
 *   nats  the NATS JetStream object store (objstore.h) in bucket snapshot-bucket, reachable
 *         from every host that reaches NATS; snapshot-dir is then this worker's own cache of
 *         it, so a resume on the worker that suspended the sandbox reads local files.
 *
 * Either way a file lands under .staging and is renamed in whole, so a cache key names complete
 * bytes or nothing, and every artifact is checked against the digest recorded in the event
 * log, never against what the store says of itself: a store that lies is a digest mismatch. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "contract.h"
#include "db.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "objstore.h"
#include "worker.h"
#include "xmalloc.h"

bool wk_snap_remote(const wk_t *w)
{
    return strcmp(w->cfg->snapshot_store, "nats") == 0;
}

int wk_snap_open(wk_t *w)
{
    if (strcmp(w->cfg->snapshot_store, "dir") != 0 && !wk_snap_remote(w)) {
        sp_log(SP_LOG_ERROR, "snapshot-store is neither dir nor nats",
               SP_KS("snapshot_store", w->cfg->snapshot_store));
        return -EINVAL;
    }
    if (!wk_snap_remote(w))
        return 0;
    int rc = sp_obj_bucket_ensure(w->bus, w->cfg->snapshot_bucket);
    if (rc < 0)
        sp_log(SP_LOG_ERROR, "cannot open the snapshot bucket",
               SP_KS("bucket", w->cfg->snapshot_bucket), SP_KS("error", sp_strerror(rc)));
    return rc;
}

void wk_snap_store_name(const wk_t *w, char out[WK_SNAP_STORE_MAX])
{
    if (wk_snap_remote(w))
        snprintf(out, WK_SNAP_STORE_MAX, "nats:%s", w->cfg->snapshot_bucket);
    else
        snprintf(out, WK_SNAP_STORE_MAX, "dir");
}

/* A store key as the event log holds it: <sandbox>/<snapshot>/<artifact>, nothing that climbs
 * out of the store's directory. */
static bool key_ok(const char *key)
{
    return key[0] && key[0] != '/' && !strstr(key, "..") && strlen(key) < SP_OBJ_NAME_MAX;
}

/* SHA-256 and size of a file. */
static int digest_file(const char *path, uint8_t out[SP_SHA256_LEN], uint64_t *ret_size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    sp_sha256_ctx_t *ctx = sp_sha256_new();
    static __thread uint8_t buf[1 << 16];
    uint64_t size = 0;
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            break;
        }
        if (n == 0)
            break;
        sp_sha256_update(ctx, buf, (size_t)n);
        size += (uint64_t)n;
    }
    sp_sha256_final(ctx, out);
    close(fd);
    *ret_size = size;
    return rc;
}

int wk_snap_put(wk_t *w, const char *key, const char *src, uint8_t sha[SP_SHA256_LEN],
                uint64_t *ret_size, char err[WK_ERR_MAX])
{
    uint64_t size = 0;
    int rc;
    if (!key_ok(key)) {
        snprintf(err, WK_ERR_MAX, "store key '%.64s' is not one", key);
        return -EINVAL;
    }
    if (wk_snap_remote(w)) {
        /* One read: the upload computes the size and SHA-256 the record carries. */
        int fd = open(src, O_RDONLY | O_CLOEXEC);
        sp_obj_info_t info = {0};
        rc = fd < 0 ? -errno : sp_obj_put(w->bus, w->cfg->snapshot_bucket, key, fd, &info);
        if (fd >= 0)
            close(fd);
        if (rc < 0) {
            snprintf(err, WK_ERR_MAX, "store %s in bucket %s: %s", key, w->cfg->snapshot_bucket,
                     sp_strerror(rc));
            return rc;
        }
        memcpy(sha, info.sha256, SP_SHA256_LEN);
        size = info.size;
    } else if ((rc = digest_file(src, sha, &size)) < 0) {
        snprintf(err, WK_ERR_MAX, "read %s: %s", src, strerror(-rc));
        return rc;
    }
    char *dst = sp_xasprintf("%s/%s", w->cfg->snapshot_dir, key);
    char *dir = sp_xstrdup(dst);
    *strrchr(dir, '/') = '\0';
    if (wk_mkdir_p(dir) < 0 || rename(src, dst) < 0) {
        rc = -errno;
        snprintf(err, WK_ERR_MAX, "store %s: %s", key, strerror(errno));
    }
    free(dir);
    free(dst);
    *ret_size = size;
    return rc;
}

/* Whether bytes of got_size with SHA-256 got are the recorded artifact: 0, or -EBADMSG with
 * err naming the artifact and both digests. */
static int compare(const char *key, const uint8_t got[SP_SHA256_LEN], uint64_t got_size,
                   const uint8_t sha[SP_SHA256_LEN], uint64_t size, char err[WK_ERR_MAX])
{
    if (got_size == size && memcmp(got, sha, SP_SHA256_LEN) == 0)
        return 0;
    char want_hex[SP_SHA256_HEX_LEN + 1], got_hex[SP_SHA256_HEX_LEN + 1];
    sp_hex_encode(sha, SP_SHA256_LEN, want_hex);
    sp_hex_encode(got, SP_SHA256_LEN, got_hex);
    snprintf(err, WK_ERR_MAX, "artifact %s: sha256 %s (%llu bytes), recorded %s (%llu)", key,
             got_hex, (unsigned long long)got_size, want_hex, (unsigned long long)size);
    return -EBADMSG;
}

/* Whether the cached file at path is the recorded artifact: 0, -EBADMSG (other bytes, err
 * says which) or a negative errno (missing, unreadable). */
static int check(const char *path, const char *key, uint64_t size, const uint8_t sha[SP_SHA256_LEN],
                 char err[WK_ERR_MAX])
{
    uint8_t got[SP_SHA256_LEN];
    uint64_t got_size = 0;
    int rc = digest_file(path, got, &got_size);
    if (rc < 0) {
        snprintf(err, WK_ERR_MAX, "artifact %s: %s", key, strerror(-rc));
        return rc;
    }
    return compare(key, got, got_size, sha, size, err);
}

int wk_snap_fetch(wk_t *w, const char *key, uint64_t size, const uint8_t sha[SP_SHA256_LEN],
                  char **ret_path, bool *ret_downloaded, char err[WK_ERR_MAX])
{
    if (!key_ok(key)) {
        snprintf(err, WK_ERR_MAX, "artifact key '%.64s' is not a store key", key);
        return -EINVAL;
    }
    char *path = sp_xasprintf("%s/%s", w->cfg->snapshot_dir, key);
    int rc = check(path, key, size, sha, err);
    *ret_downloaded = false;
    if (rc == 0 || !wk_snap_remote(w)) {
        if (rc == 0)
            *ret_path = path;
        else
            free(path);
        return rc;
    }
    if (rc == -EBADMSG)
        sp_log(SP_LOG_WARN, "cached artifact differs from its record: fetched again",
               SP_KS("key", key), SP_KS("detail", err));
    /* Not here (or damaged): from the bucket, into .staging, checked, then renamed in. */
    char *dir = sp_xstrdup(path), *tmp = NULL;
    *strrchr(dir, '/') = '\0';
    char *staging = sp_xasprintf("%s/.staging", w->cfg->snapshot_dir);
    int fd = -1;
    if (wk_mkdir_p(dir) < 0 || wk_mkdir_p(staging) < 0) {
        rc = -errno;
        snprintf(err, WK_ERR_MAX, "mkdir for %s: %s", key, strerror(errno));
        goto out;
    }
    tmp = sp_xasprintf("%s/fetch-XXXXXX", staging);
    if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(err, WK_ERR_MAX, "mkstemp %s: %s", tmp, strerror(errno));
        goto out;
    }
    sp_obj_info_t info;
    rc = sp_obj_get(w->bus, w->cfg->snapshot_bucket, key, size, fd, &info);
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (rc < 0) {
        /* The bucket's own record is not the log's: a replaced object is a mismatch too. */
        if (rc == SP_ETOOBIG)
            rc = -EBADMSG;
        snprintf(err, WK_ERR_MAX, "artifact %s from bucket %s: %s", key, w->cfg->snapshot_bucket,
                 rc == -EBADMSG ? "its bytes do not match the record" : sp_strerror(rc));
        goto out;
    }
    /* sp_obj_get checked the bytes against the bucket's record: they must be the log's. */
    if ((rc = compare(key, info.sha256, info.size, sha, size, err)) < 0)
        goto out;
    if (rename(tmp, path) < 0) {
        rc = -errno;
        snprintf(err, WK_ERR_MAX, "rename into %s: %s", path, strerror(errno));
        goto out;
    }
    *ret_downloaded = true;
    *ret_path = path;
    path = NULL;
out:
    if (fd >= 0)
        close(fd);
    if (tmp && rc < 0)
        unlink(tmp);
    free(tmp);
    free(staging);
    free(dir);
    free(path);
    return rc;
}

void wk_snap_forget(wk_t *w, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!key_ok(keys[i]))
            continue;
        char *path = sp_xasprintf("%s/%s", w->cfg->snapshot_dir, keys[i]);
        unlink(path);
        /* Its directories, when empty: <sandbox>/<snapshot>, then <sandbox>. */
        for (int up = 0; up < 2; up++) {
            *strrchr(path, '/') = '\0';
            if (strlen(path) <= strlen(w->cfg->snapshot_dir))
                break;
            rmdir(path);
        }
        free(path);
        if (wk_snap_remote(w)) {
            int rc = sp_obj_delete(w->bus, w->cfg->snapshot_bucket, keys[i]);
            if (rc < 0 && rc != SP_ENOTFOUND)
                sp_log(SP_LOG_WARN, "cannot delete an artifact from the snapshot bucket",
                       SP_KS("key", keys[i]), SP_KS("error", sp_strerror(rc)));
        }
    }
}

/* The sandbox's state in the projection ("" when it has no row); < 0 when the database is
 * away. */
static int sandbox_state(PGconn *db, const char *id, char out[32])
{
    const char *p[1] = {id};
    PGresult *r =
        PQexecParams(db, "SELECT state FROM sandboxes WHERE id = $1", 1, NULL, p, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc == 0)
        snprintf(out, 32, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return rc;
}

/* Snapshots of a sandbox that can never resume (deleted, or failed) may go from the store. */
static bool gone_for_good(const char *state)
{
    return strcmp(state, "deleted") == 0 || strcmp(state, "failed") == 0;
}

/* A sandbox in these states may yet resume from its suspend's snapshot: what a resume here
 * would use (the cache's copy, the kept disk) stays. */
static bool may_resume(const char *state)
{
    return strcmp(state, "suspended") == 0 || strcmp(state, "suspending") == 0 ||
           strcmp(state, "resuming") == 0;
}

typedef struct {
    wk_t *w;
    PGconn *db;
    size_t removed;
} bucket_sweep_t;

static int sweep_object(void *arg, const char *name)
{
    bucket_sweep_t *bs = arg;
    char sbx[SP_SANDBOX_ID_LEN + 1], state[32];
    size_t n = strcspn(name, "/");
    if (n == 0 || n > SP_SANDBOX_ID_LEN || !name[n])
        return 0; /* not one of our keys */
    memcpy(sbx, name, n);
    sbx[n] = '\0';
    if (!sp_id_valid(sbx) || strcmp(sbx, SP_SNAPSHOT_KEY_PREFIX) == 0)
        return 0; /* a named snapshot's: it lives until deleted */
    if (sandbox_state(bs->db, sbx, state) < 0)
        return -EIO; /* the database is away: the next sweep */
    if (gone_for_good(state) && sp_obj_delete(bs->w->bus, bs->w->cfg->snapshot_bucket, name) == 0)
        bs->removed++;
    return 0;
}

/* Named snapshots live until deleted; a delete done while this worker was away (by another
 * worker: its taker gone, docs/snapshots.md) leaves this worker's copy, which goes here. Only
 * a directory that names its sandbox (named_mark, worker_lifecycle.c) is judged. */
static size_t sweep_named(wk_t *w, PGconn *db)
{
    char *root = sp_xasprintf("%s/" SP_SNAPSHOT_KEY_PREFIX, w->cfg->snapshot_dir);
    DIR *d = opendir(root);
    size_t swept = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.' || !sp_id_valid(e->d_name))
            continue;
        char *dir = sp_xasprintf("%s/%s", root, e->d_name), *mark = sp_xasprintf("%s/sandbox", dir);
        char sbx[SP_SANDBOX_ID_LEN + 2] = "";
        FILE *f = fopen(mark, "re");
        if (f) {
            if (!fgets(sbx, sizeof(sbx), f))
                sbx[0] = '\0';
            fclose(f);
        }
        int rc = sp_id_valid(sbx) ? sp_db_snapshot_deleted(db, sbx, e->d_name) : 0;
        if (rc == 1 && wk_rm_rf(dir) == 0)
            swept++;
        free(mark);
        free(dir);
        if (rc < 0)
            break; /* the database is away: the next sweep */
    }
    if (d)
        closedir(d);
    free(root);
    return swept;
}

typedef struct {
    PGconn *db;
    int64_t max_s; /* kept-disk-s */
} kept_ctx_t;

/* A suspended sandbox's kept disk (wk_sandbox_checkpoint's keep_snap) stays while the
 * sandbox may resume here from it (may_resume) and for kept-disk-s at most: a sandbox
 * suspended for long resumes from its snapshot, and the host's disk does not fill with
 * sandboxes that never come back. Kept when the database cannot say. */
static bool kept_wanted(void *ctx, const char *sbx, const char *snap, int64_t age_s)
{
    (void)snap; /* a newer suspend here replaced an older one's */
    const kept_ctx_t *k = ctx;
    if (age_s > k->max_s)
        return false;
    char state[32];
    return sandbox_state(k->db, sbx, state) < 0 || may_resume(state);
}

void wk_snap_sweep(wk_t *w, PGconn *db)
{
    /* The directory: with the nats store a cache (kept while the sandbox may resume from it);
     * with the dir store the store itself (a resume removes what it used, so what stays is
     * there for a sandbox deleted while suspended). */
    bool cache = wk_snap_remote(w);
    DIR *d = opendir(w->cfg->snapshot_dir);
    size_t swept = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char state[32];
        /* Named snapshots (docs/snapshots.md) live until deleted: never swept. */
        if (e->d_name[0] == '.' || !sp_id_valid(e->d_name) ||
            strcmp(e->d_name, SP_SNAPSHOT_KEY_PREFIX) == 0)
            continue;
        if (sandbox_state(db, e->d_name, state) < 0)
            break; /* the database is away: try at the next sweep */
        bool drop = cache ? !may_resume(state) : gone_for_good(state);
        if (!drop)
            continue;
        char *dir = sp_xasprintf("%s/%s", w->cfg->snapshot_dir, e->d_name);
        if (wk_rm_rf(dir) == 0)
            swept++;
        free(dir);
    }
    if (d)
        closedir(d);
    bucket_sweep_t bs = {.w = w, .db = db};
    if (cache)
        (void)sp_obj_list(w->bus, w->cfg->snapshot_bucket, sweep_object, &bs);
    size_t named = sweep_named(w, db);
    kept_ctx_t kc = {.db = db, .max_s = w->cfg->kept_disk_s};
    size_t kept = wk_host_kept_sweep(w->host, kept_wanted, &kc);
    if (swept || bs.removed || named || kept)
        sp_log(SP_LOG_INFO, "snapshots swept", SP_KS("dir", w->cfg->snapshot_dir),
               SP_KU("sandboxes", swept), SP_KU("bucket_objects", bs.removed),
               SP_KU("named", named), SP_KU("kept_disks", kept));
}
