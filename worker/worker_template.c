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
 * ~1 MB, well under a second). "base" runs templates/base.sh (debootstrap; minutes).
 */
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

#ifndef WK_TEMPLATES_DIR
#define WK_TEMPLATES_DIR "/usr/share/space/worker/templates"
#endif
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

/* ---- base ---- */

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

static int build_base(wk_host_t *h, const char *dir, char err[WK_ERR_MAX])
{
    char *logp = sp_xasprintf("%s/template-base.log", h->state_dir);
    int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = 0;
    if (fd < 0) {
        rc = wk__fail(err, -errno, "create %s: %s", logp, strerror(errno));
        goto out;
    }
    const char *argv[] = {"/bin/sh", WK_TEMPLATES_DIR "/base.sh", dir,
                          WK_TEMPLATES_DIR "/statx_shim.c", NULL};
    wk__cmd_t c = {
        .argv = argv, .timeout_ms = WK_TEMPLATE_TIMEOUT_MS, .out_mode = WK_OUT_FD, .out_fd = fd};
    int ex = 0;
    rc = wk__run(&c, &ex);
    close(fd);
    if (rc < 0 || ex != 0) {
        char line[WK_ERR_MAX / 2];
        log_tail(logp, line, sizeof(line));
        rc = wk__fail(err, rc < 0 ? rc : -EIO, "base.sh %s (%s): %s",
                      rc < 0 ? sp_strerror(rc) : "failed", logp, line);
    }
out:
    free(logp);
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
    static __thread uint8_t buf[1 << 16];
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
            if (fd < 0)
                rc = wk__fail(err, -errno, "open %s: %m", path);
            for (ssize_t k; fd >= 0 && (k = read(fd, buf, sizeof(buf))) != 0;) {
                if (k < 0 && errno == EINTR)
                    continue;
                if (k < 0) {
                    rc = wk__fail(err, -errno, "read %s: %m", path);
                    break;
                }
                sp_sha256_update(c, buf, (size_t)k);
            }
            if (fd >= 0)
                close(fd);
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

static int build(wk_host_t *h, const char *name, char err[WK_ERR_MAX])
{
    char *tmp = sp_xasprintf("%s/.build-%s", h->templates_dir, name);
    char *final = sp_xasprintf("%s/%s", h->templates_dir, name);
    int rc = wk__subvol_delete(tmp, err);
    if (rc == 0)
        rc = wk__subvol_delete(final, err); /* a writable leftover is not a template */
    if (rc == 0)
        rc = wk__subvol_create(tmp, err);
    if (rc == 0) {
        if (strcmp(name, "tiny") == 0)
            rc = build_tiny(tmp, err);
        else
            rc = build_base(h, tmp, err);
    }
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

int wk_template_ensure(wk_host_t *h, const char *name, char err[WK_ERR_MAX])
{
    if (!h || !name || !sp_id_valid(name))
        return wk__fail(err, -EINVAL, "invalid template name");
    int r = ready(h, name);
    if (r != 0)
        return r < 0 ? wk__fail(err, r, "template %s: %s", name, strerror(-r)) : 0;
    if (strcmp(name, "tiny") != 0 && strcmp(name, "base") != 0)
        return wk__fail(err, SP_ENOTFOUND, "unknown template %s", name);

    pthread_mutex_lock(&h->tmpl_lock);
    while (building(h, name))
        pthread_cond_wait(&h->tmpl_cond, &h->tmpl_lock);
    r = ready(h, name);
    if (r != 0) {
        pthread_mutex_unlock(&h->tmpl_lock);
        return r < 0 ? wk__fail(err, r, "template %s: %s", name, strerror(-r)) : 0;
    }
    h->building = sp_xreallocarray(h->building, h->n_building + 1, sizeof(*h->building));
    h->building[h->n_building++] = sp_xstrdup(name);
    pthread_mutex_unlock(&h->tmpl_lock);

    int64_t t0 = wk__now_us();
    int rc = build(h, name, err);
    sp_log(SP_LOG_DEBUG, "template build", SP_KS("template", name), SP_KI("rc", rc),
           SP_KF("ms", (double)(wk__now_us() - t0) / 1000.0));

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
