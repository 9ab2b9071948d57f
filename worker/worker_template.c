/* Templates: read-only btrfs subvolumes under volume_dir/templates/<name>.
 *
 * A build happens in a writable subvolume templates/.build-<name>; only a finished build
 * becomes templates/<name>, as a read-only snapshot, so a template that exists is complete
 * (a crash mid-build leaves a .build- subvolume that the next build deletes). Builds of one
 * name are serialised; different names build in parallel.
 *
 * Identity across hosts: a suspended sandbox's disk is a `btrfs send -p <template>` delta,
 * and `btrfs receive` on another host must find the same template there. Each host builds its
 * own template (a different subvolume UUID), so the finished template carries a received UUID
 * derived from its name and the digest of its content (paths, modes, owners, bytes, link
 * targets; not times): equal content on two hosts means the same identity, and a delta made on
 * one applies on the other; a template built differently is not found, and the resume fails
 * instead of restoring memory over a different disk.
 *
 * "tiny" is assembled here (busybox-static and its applet links, a passwd with root and user,
 * ~1 MB, well under a second). Any other template is a script, <template_defs>/<name>.sh:
 * "base" is templates/base.sh (debootstrap; minutes).
 *
 * The host's cache (template_cache, e.g. /var/cache/space/templates): a template made here is
 * sent there as a btrfs stream, <name>-<key>.btrfs, key the hash of what defines it
 * (recipe_key); a worker of another SPACE_HOME on this host that lacks the template receives
 * that stream instead of building it: seconds for base instead of minutes, the same content and
 * the same identity (docs/faults.md, "Templates"). Makers of one entry take its lock in turn,
 * so two homes starting together build once.
 */
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

#define BUSYBOX  "/bin/busybox"
#define USER_UID 1000
#define LIST_MAX 65536

/* ---- tiny ---- */

static int write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return -errno;
    size_t len = strlen(text), off = 0;
    int rc = 0;
    while (off < len) {
        ssize_t n = write(fd, text + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            break;
        }
        off += (size_t)n;
    }
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

static int copy_file(const char *src, const char *dst, mode_t mode)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -errno;
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (out < 0) {
        int rc = -errno;
        close(in);
        return rc;
    }
    int rc = 0;
    char buf[65536];
    for (;;) {
        ssize_t n = read(in, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = n < 0 ? -errno : 0;
            break;
        }
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                rc = -errno;
                break;
            }
            off += w;
        }
        if (rc < 0)
            break;
    }
    close(in);
    if (close(out) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* The tiny rootfs has no libc: a dynamically linked busybox (Debian "busybox" rather than
 * "busybox-static") would not run in it. Refuse early with a clear reason. */
static int check_static(const char *path, char err[WK_ERR_MAX])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wk__fail(err, -errno, "%s: %s (install busybox-static)", path, strerror(errno));
    Elf64_Ehdr eh;
    int rc = 0;
    if (pread(fd, &eh, sizeof(eh), 0) != (ssize_t)sizeof(eh) ||
        memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 64) {
        rc = wk__fail(err, -ENOEXEC, "%s is not a 64-bit ELF executable", path);
        goto out;
    }
    for (unsigned i = 0; i < eh.e_phnum; i++) {
        Elf64_Phdr ph;
        off_t at = (off_t)(eh.e_phoff + (Elf64_Off)i * sizeof(ph));
        if (pread(fd, &ph, sizeof(ph), at) != (ssize_t)sizeof(ph)) {
            rc = wk__fail(err, -ENOEXEC, "%s: short program header", path);
            goto out;
        }
        if (ph.p_type == PT_INTERP) {
            rc = wk__fail(err, -ENOEXEC, "%s is dynamically linked (install busybox-static)", path);
            goto out;
        }
    }
out:
    close(fd);
    return rc;
}

static int build_tiny(const char *dir, char err[WK_ERR_MAX])
{
    static const struct {
        const char *path;
        mode_t mode;
    } DIRS[] = {
        {"bin", 0755},     {"dev", 0755},  {"etc", 0755},      {"home", 0755}, {"home/user", 0755},
        {"proc", 0555},    {"root", 0700}, {"sys", 0555},      {"tmp", 01777}, {"usr", 0755},
        {"usr/bin", 0755}, {"var", 0755},  {"var/tmp", 01777},
    };
    int rc = check_static(BUSYBOX, err);
    if (rc < 0)
        return rc;
    char *p = NULL;
    char *list = NULL;
    for (size_t i = 0; i < sizeof(DIRS) / sizeof(DIRS[0]); i++) {
        free(p);
        p = sp_xasprintf("%s/%s", dir, DIRS[i].path);
        if (mkdir(p, DIRS[i].mode) < 0 || chmod(p, DIRS[i].mode) < 0) {
            rc = wk__fail(err, -errno, "mkdir %s: %s", p, strerror(errno));
            goto out;
        }
    }
    free(p);
    p = sp_xasprintf("%s/home/user", dir);
    if (chown(p, USER_UID, USER_UID) < 0) {
        rc = wk__fail(err, -errno, "chown %s: %s", p, strerror(errno));
        goto out;
    }
    free(p);
    p = sp_xasprintf("%s/bin/busybox", dir);
    rc = copy_file(BUSYBOX, p, 0755);
    if (rc < 0) {
        rc = wk__fail(err, rc, "copy %s: %s", BUSYBOX, strerror(-rc));
        goto out;
    }

    /* Every applet this busybox has, as a link in /bin. */
    list = sp_xmalloc(LIST_MAX);
    const char *argv[] = {BUSYBOX, "--list", NULL};
    wk__cmd_t c = {.argv = argv,
                   .timeout_ms = 10000,
                   .out_mode = WK_OUT_STDOUT,
                   .out = list,
                   .out_len = LIST_MAX};
    int ex = 0;
    rc = wk__run(&c, &ex);
    if (rc < 0 || ex != 0) {
        rc = wk__fail(err, rc < 0 ? rc : -EIO, "%s --list failed", BUSYBOX);
        goto out;
    }
    size_t links = 0;
    for (char *save = NULL, *name = strtok_r(list, "\n", &save); name;
         name = strtok_r(NULL, "\n", &save)) {
        if (!*name || strchr(name, '/') || strcmp(name, "busybox") == 0 || name[0] == '.')
            continue;
        free(p);
        p = sp_xasprintf("%s/bin/%s", dir, name);
        if (symlink("busybox", p) < 0 && errno != EEXIST) {
            rc = wk__fail(err, -errno, "symlink %s: %s", p, strerror(errno));
            goto out;
        }
        links++;
    }
    if (links == 0) {
        rc = wk__fail(err, -EIO, "%s --list printed no applets", BUSYBOX);
        goto out;
    }
    free(p);
    p = sp_xasprintf("%s/usr/bin/env", dir); /* for #!/usr/bin/env scripts */
    if (symlink("../../bin/busybox", p) < 0) {
        rc = wk__fail(err, -errno, "symlink %s: %s", p, strerror(errno));
        goto out;
    }

    static const struct {
        const char *path;
        const char *text;
        mode_t mode;
    } FILES[] = {
        {"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
         0644},
        {"etc/group", "root:x:0:\nuser:x:1000:\n", 0644},
        {"etc/shadow", "root:*:19000:0:99999:7:::\nuser:*:19000:0:99999:7:::\n", 0600},
        {"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost\n", 0644},
    };
    for (size_t i = 0; i < sizeof(FILES) / sizeof(FILES[0]); i++) {
        free(p);
        p = sp_xasprintf("%s/%s", dir, FILES[i].path);
        rc = write_file(p, FILES[i].text, FILES[i].mode);
        if (rc < 0) {
            rc = wk__fail(err, rc, "write %s: %s", p, strerror(-rc));
            goto out;
        }
    }
    rc = 0;
out:
    free(list);
    free(p);
    return rc;
}

/* ---- script templates (base.sh and any <name>.sh in template_defs) ---- */

static void log_tail(const char *path, char *out, size_t out_len)
{
    char buf[1024];
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0) {
        off_t at = st.st_size > (off_t)sizeof(buf) - 1 ? st.st_size - (off_t)sizeof(buf) + 1 : 0;
        ssize_t n = pread(fd, buf, sizeof(buf) - 1, at);
        if (n > 0) {
            buf[n] = '\0';
            wk__last_line(buf, out, out_len);
        }
    }
    close(fd);
}

/* The script that defines template name (heap path), or NULL: tiny is built in, and a name
 * without <name>.sh in template_defs is no template. */
static char *script_of(const wk_host_t *h, const char *name)
{
    if (strcmp(name, "tiny") == 0)
        return NULL;
    char *p = sp_xasprintf("%s/%s.sh", h->template_defs, name);
    if (access(p, R_OK) == 0)
        return p;
    free(p);
    return NULL;
}

static int build_script(wk_host_t *h, const char *name, const char *script, const char *dir,
                        char err[WK_ERR_MAX])
{
    char *logp = sp_xasprintf("%s/template-%s.log", h->state_dir, name);
    char *shim = sp_xasprintf("%s/statx_shim.c", h->template_defs);
    int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = 0;
    if (fd < 0) {
        rc = wk__fail(err, -errno, "create %s: %s", logp, strerror(errno));
        goto out;
    }
    const char *argv[] = {"/bin/sh", script, dir, shim, NULL};
    wk__cmd_t c = {.argv = argv,
                   .timeout_ms = WK_TEMPLATE_TIMEOUT_MS,
                   .cancel = h->cancel,
                   .out_mode = WK_OUT_FD,
                   .out_fd = fd};
    int ex = 0;
    rc = wk__run(&c, &ex);
    close(fd);
    if (rc == -ECANCELED) {
        rc = wk__fail(err, rc, "%s.sh: stopped (the worker is stopping)", name);
    } else if (rc < 0 || ex != 0) {
        char line[WK_ERR_MAX / 2];
        log_tail(logp, line, sizeof(line));
        if (rc < 0)
            rc = wk__fail(err, rc, "%s.sh %s (%s): %s", name, sp_strerror(rc), logp, line);
        else
            rc = wk__fail(err, -EIO, "%s.sh exited %d (%s): %s", name, ex, logp, line);
    }
out:
    free(shim);
    free(logp);
    return rc;
}

/* ---- the host's template cache ---- */

static int ready(const wk_host_t *h, const char *name);

/* Bump when build_tiny changes what it makes, or how a script is run. */
#define TINY_RECIPE   "space-template/tiny/1"
#define SCRIPT_RECIPE "space-template/script/1"

/* Feeds what fd reads, to its end, into c (path names it in an error). */
static int hash_fd(sp_sha256_ctx_t *c, int fd, const char *path, char err[WK_ERR_MAX])
{
    static __thread uint8_t buf[1 << 16];
    for (ssize_t k; (k = read(fd, buf, sizeof(buf))) != 0;) {
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return wk__fail(err, -errno, "read %s: %m", path);
        sp_sha256_update(c, buf, (size_t)k);
    }
    return 0;
}

/* Feeds role and the file's bytes into c (a missing file: the role alone). Not its path: the
 * same definition elsewhere is the same template. */
static int hash_file(sp_sha256_ctx_t *c, const char *role, const char *path, char err[WK_ERR_MAX])
{
    sp_sha256_update(c, role, strlen(role) + 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : wk__fail(err, -errno, "open %s: %m", path);
    sp_sha256_update(c, "=", 1);
    int rc = hash_fd(c, fd, path, err);
    close(fd);
    return rc;
}

/* What defines template name, hashed: the recipe and the files it is made from (tiny: the
 * busybox it copies; a script: the script and the statx shim it is given). Not the agent:
 * every sandbox gets it at create, a template never holds it. */
static int recipe_key(const wk_host_t *h, const char *name, const char *script,
                      char hex[SP_SHA256_HEX_LEN + 1], char err[WK_ERR_MAX])
{
    sp_sha256_ctx_t *c = sp_sha256_new();
    uint8_t d[SP_SHA256_LEN];
    const char *recipe = script ? SCRIPT_RECIPE : TINY_RECIPE;
    sp_sha256_update(c, recipe, strlen(recipe) + 1);
    sp_sha256_update(c, name, strlen(name) + 1);
    int rc;
    if (script) {
        char *shim = sp_xasprintf("%s/statx_shim.c", h->template_defs);
        rc = hash_file(c, "script", script, err);
        if (rc == 0)
            rc = hash_file(c, "statx_shim.c", shim, err);
        free(shim);
    } else {
        rc = hash_file(c, "busybox", BUSYBOX, err);
    }
    sp_sha256_final(c, d);
    if (rc == 0)
        sp_hex_encode(d, SP_SHA256_LEN, hex);
    return rc;
}

/* Holds the cache entry's lock (flock on <base>.lock): one maker of an entry at a time on this
 * host, so a second worker waits for the first one's build and then receives it. Polls, to
 * honour *cancel. The lock's fd, or < 0. */
static int cache_lock(const wk_host_t *h, const char *base, char err[WK_ERR_MAX])
{
    char *path = sp_xasprintf("%s.lock", base);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    int rc = fd;
    if (fd < 0)
        rc = wk__fail(err, -errno, "open %s: %m", path);
    for (bool said = false; fd >= 0;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            break;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            rc = wk__fail(err, -errno, "lock %s: %m", path);
            break;
        }
        if (h->cancel && *h->cancel) {
            rc = wk__fail(err, -ECANCELED, "stopped waiting for %s", path);
            break;
        }
        if (!said)
            sp_log(SP_LOG_INFO, "template being made by another worker of this host: waiting",
                   SP_KS("lock", path));
        said = true;
        usleep(200 * 1000);
    }
    if (rc < 0 && fd >= 0)
        close(fd);
    free(path);
    return rc;
}

/* Receives the cached stream as templates/<name> (which must not exist): read-only, with the
 * identity it was sealed with (btrfs send carries a subvolume's received UUID as its own, and
 * receive sets it). Leftovers of a failed receive are deleted. */
static int cache_restore(wk_host_t *h, const char *name, const char *stream, char err[WK_ERR_MAX])
{
    const char *recv[] = {"btrfs", "receive", "-q", "-f", stream, h->templates_dir, NULL};
    int rc = wk__run_tool(recv, "btrfs receive", WK_TEMPLATE_TIMEOUT_MS, err);
    if (rc == 0 && ready(h, name) != 1)
        rc = wk__fail(err, -EBADMSG, "%s did not give a sealed template %s", stream, name);
    if (rc < 0) {
        char *final = sp_xasprintf("%s/%s", h->templates_dir, name);
        (void)wk__subvol_delete(final, NULL);
        free(final);
    }
    return rc;
}

/* Sends templates/<name> into the cache as stream (a temporary file renamed over it). */
static int cache_store(wk_host_t *h, const char *name, const char *stream, char err[WK_ERR_MAX])
{
    char *src = sp_xasprintf("%s/%s", h->templates_dir, name);
    char *tmp = sp_xasprintf("%s.tmp", stream);
    const char *send[] = {"btrfs", "send", "-q", "-f", tmp, src, NULL};
    int rc = wk__run_tool(send, "btrfs send", WK_TEMPLATE_TIMEOUT_MS, err);
    if (rc == 0 && rename(tmp, stream) < 0)
        rc = wk__fail(err, -errno, "rename %s: %m", tmp);
    if (rc < 0)
        (void)unlink(tmp);
    free(tmp);
    free(src);
    return rc;
}

/* ---- ensure / list ---- */

static bool building(const wk_host_t *h, const char *name)
{
    for (size_t i = 0; i < h->n_building; i++) {
        if (strcmp(h->building[i], name) == 0)
            return true;
    }
    return false;
}

/* Built, sealed and carrying its identity (a template made before identities were given
 * has none: it is built again). */
static int ready(const wk_host_t *h, const char *name)
{
    char *path = sp_xasprintf("%s/%s", h->templates_dir, name);
    bool ro = false;
    static const uint8_t none[16];
    uint8_t uuid[16];
    int r = wk__subvol_is(path, &ro);
    if (r == 1 && ro)
        r = wk__subvol_received_uuid(path, uuid) < 0 ? 0 : memcmp(uuid, none, 16) != 0;
    else if (r == 1)
        r = 0;
    free(path);
    return r;
}

/* Feeds dir's tree (rel is its path inside the template) into c, entries in name order. */
static int digest_tree(sp_sha256_ctx_t *c, const char *dir, const char *rel, int depth,
                       char err[WK_ERR_MAX])
{
    if (depth > 64)
        return wk__fail(err, -ELOOP, "template tree deeper than 64 at %s", rel);
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    if (n < 0)
        return wk__fail(err, -errno, "scan %s: %m", dir);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *e = names[i]->d_name;
        if (rc < 0 || strcmp(e, ".") == 0 || strcmp(e, "..") == 0)
            continue;
        char *path = sp_xasprintf("%s/%s", dir, e), *sub = sp_xasprintf("%s/%s", rel, e);
        struct stat st;
        if (lstat(path, &st) < 0) {
            rc = wk__fail(err, -errno, "stat %s: %m", path);
            goto next;
        }
        uint32_t meta[3] = {(uint32_t)st.st_mode, (uint32_t)st.st_uid, (uint32_t)st.st_gid};
        sp_sha256_update(c, sub, strlen(sub) + 1);
        sp_sha256_update(c, meta, sizeof(meta));
        if (S_ISDIR(st.st_mode)) {
            rc = digest_tree(c, path, sub, depth + 1, err);
        } else if (S_ISLNK(st.st_mode)) {
            char target[4096];
            ssize_t k = readlink(path, target, sizeof(target));
            if (k < 0)
                rc = wk__fail(err, -errno, "readlink %s: %m", path);
            else
                sp_sha256_update(c, target, (size_t)k);
        } else if (S_ISREG(st.st_mode)) {
            uint64_t size = (uint64_t)st.st_size;
            sp_sha256_update(c, &size, sizeof(size));
            int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
            if (fd < 0) {
                rc = wk__fail(err, -errno, "open %s: %m", path);
            } else {
                rc = hash_fd(c, fd, path, err);
                close(fd);
            }
        } else {
            uint64_t dev = (uint64_t)st.st_rdev;
            sp_sha256_update(c, &dev, sizeof(dev));
        }
    next:
        free(path);
        free(sub);
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* The template's identity: the first 16 bytes of SHA-256("space-template/1", name, content). */
static int identity(const char *dir, const char *name, uint8_t uuid[16], char err[WK_ERR_MAX])
{
    sp_sha256_ctx_t *c = sp_sha256_new();
    uint8_t content[SP_SHA256_LEN], id[SP_SHA256_LEN];
    int rc = digest_tree(c, dir, "", 0, err);
    sp_sha256_final(c, content);
    if (rc < 0)
        return rc;
    c = sp_sha256_new();
    sp_sha256_update(c, "space-template/1", sizeof("space-template/1"));
    sp_sha256_update(c, name, strlen(name) + 1);
    sp_sha256_update(c, content, sizeof(content));
    sp_sha256_final(c, id);
    memcpy(uuid, id, 16);
    char hex[SP_SHA256_HEX_LEN + 1];
    sp_hex_encode(content, SP_SHA256_LEN, hex);
    sp_log(SP_LOG_DEBUG, "template content", SP_KS("template", name), SP_KS("sha256", hex));
    return 0;
}

static int build(wk_host_t *h, const char *name, const char *script, char err[WK_ERR_MAX])
{
    char *tmp = sp_xasprintf("%s/.build-%s", h->templates_dir, name);
    char *final = sp_xasprintf("%s/%s", h->templates_dir, name);
    int rc = wk__subvol_delete(tmp, err);
    if (rc == 0)
        rc = wk__subvol_create(tmp, err);
    if (rc == 0)
        rc = script ? build_script(h, name, script, tmp, err) : build_tiny(tmp, err);
    uint8_t uuid[16];
    if (rc == 0)
        rc = identity(tmp, name, uuid, err);
    if (rc == 0)
        rc = wk__subvol_snapshot(tmp, final, false, err);
    if (rc == 0)
        rc = wk__subvol_seal(final, uuid, err);
    (void)wk__subvol_delete(tmp, NULL);
    free(final);
    free(tmp);
    return rc;
}

/* Makes templates/<name>: from the host's cache when it holds this definition, else built (and
 * then stored in the cache; a cache that cannot be written only costs the next home a build). */
static int make(wk_host_t *h, const char *name, const char *script, char err[WK_ERR_MAX])
{
    char *final = sp_xasprintf("%s/%s", h->templates_dir, name);
    int rc = wk__subvol_delete(final, err); /* a writable leftover is not a template */
    free(final);
    if (rc < 0)
        return rc;
    char key[SP_SHA256_HEX_LEN + 1];
    if (!h->template_cache || wk__mkdir_p(h->template_cache, 0700) < 0 ||
        recipe_key(h, name, script, key, err) < 0) {
        if (h->template_cache)
            sp_log(SP_LOG_WARN, "template cache not used", SP_KS("template", name),
                   SP_KS("cache", h->template_cache), SP_KS("error", err));
        rc = build(h, name, script, err);
        return rc < 0 ? rc : WK_TEMPLATE_BUILT;
    }
    char *base = sp_xasprintf("%s/%s-%.32s", h->template_cache, name, key);
    char *stream = sp_xasprintf("%s.btrfs", base);
    int lock = cache_lock(h, base, err);
    if (lock < 0) {
        rc = lock;
        goto out;
    }
    if (access(stream, R_OK) == 0) {
        char cerr[WK_ERR_MAX] = "";
        if (cache_restore(h, name, stream, cerr) == 0) {
            rc = WK_TEMPLATE_CACHED;
            goto out;
        }
        sp_log(SP_LOG_WARN, "cached template unusable: building it", SP_KS("template", name),
               SP_KS("stream", stream), SP_KS("error", cerr));
        (void)unlink(stream);
    }
    rc = build(h, name, script, err);
    if (rc == 0) {
        char cerr[WK_ERR_MAX] = "";
        if (cache_store(h, name, stream, cerr) < 0)
            sp_log(SP_LOG_WARN, "template not cached", SP_KS("template", name),
                   SP_KS("stream", stream), SP_KS("error", cerr));
        rc = WK_TEMPLATE_BUILT;
    }
out:
    if (lock >= 0)
        close(lock);
    free(stream);
    free(base);
    return rc;
}

int wk_template_ensure(wk_host_t *h, const char *name, char err[WK_ERR_MAX])
{
    if (!h || !name || !sp_id_valid(name))
        return wk__fail(err, -EINVAL, "invalid template name");
    int r = ready(h, name);
    if (r != 0)
        return r < 0 ? wk__fail(err, r, "template %s: %s", name, strerror(-r)) : 0;
    char *script = script_of(h, name);
    if (!script && strcmp(name, "tiny") != 0)
        return wk__fail(err, SP_ENOTFOUND, "unknown template %s (no %s/%s.sh)", name,
                        h->template_defs, name);

    pthread_mutex_lock(&h->tmpl_lock);
    while (building(h, name))
        pthread_cond_wait(&h->tmpl_cond, &h->tmpl_lock);
    r = ready(h, name);
    if (r != 0) {
        pthread_mutex_unlock(&h->tmpl_lock);
        free(script);
        return r < 0 ? wk__fail(err, r, "template %s: %s", name, strerror(-r)) : 0;
    }
    h->building = sp_xreallocarray(h->building, h->n_building + 1, sizeof(*h->building));
    h->building[h->n_building++] = sp_xstrdup(name);
    pthread_mutex_unlock(&h->tmpl_lock);

    int64_t t0 = wk__now_us();
    int rc = make(h, name, script, err);
    sp_log(SP_LOG_DEBUG, "template made", SP_KS("template", name), SP_KI("rc", rc),
           SP_KF("ms", (double)(wk__now_us() - t0) / 1000.0));
    free(script);

    pthread_mutex_lock(&h->tmpl_lock);
    for (size_t i = 0; i < h->n_building; i++) {
        if (strcmp(h->building[i], name) == 0) {
            free(h->building[i]);
            h->building[i] = h->building[--h->n_building];
            break;
        }
    }
    pthread_cond_broadcast(&h->tmpl_cond);
    pthread_mutex_unlock(&h->tmpl_lock);
    return rc;
}

int wk_template_list(wk_host_t *h, char ***ret_names, size_t *ret_n)
{
    DIR *d = opendir(h->templates_dir);
    if (!d)
        return -errno;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !sp_id_valid(de->d_name) || ready(h, de->d_name) != 1)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            names = sp_xreallocarray(names, cap, sizeof(*names));
        }
        names[n++] = sp_xstrdup(de->d_name);
    }
    closedir(d);
    *ret_names = names;
    *ret_n = n;
    return 0;
}

void wk_strv_free(char **v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}
