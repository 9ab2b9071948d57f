/* The host side of sandboxes (worker_runtime.h): host setup, create/destroy/exec of one
 * sandbox, and what the host shows (scan, usage). The parts live in worker_volume.c (btrfs),
 * worker_template.c, worker_net.c (netns, veth, addresses), worker_runsc.c and
 * worker_spawn.c (running programs).
 *
 * Create order: bundle directory (the marker that an id is in use: mkdir fails for a second
 * create of the same id, and destroy removes it last), disk snapshot, network, the agent
 * binary into the snapshot, config.json, runsc create (with the agent channel's pipes as the
 * init's stdin and stdout), runsc start. Any failure after the marker destroys the id
 * completely, which is exact because everything named after the id was made by this create.
 */
#include <dirent.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

#define MAX_VCPU      256
#define MAX_MEMORY_MB (1u << 20)
#define MAX_DISK_MB   (1u << 30) /* 1 PiB */
#define MAX_PIDS      (1u << 22) /* gVisor's PID namespace limit */
/* Where the agent lives in every sandbox (relative to its root) and runs from. */
#define AGENT_DIR         ".space"
#define AGENT_FILE        "agent"
#define AGENT_GUEST_PATH  "/.space/agent"
#define AGENT_CHAN_DIR    "chan"       /* bundle/chan on the host, /.space/chan inside */
#define AGENT_CHAN_SOCKET "agent.sock" /* space-agent's CHAN_SOCKET */
/* Pipe buffer of the channel: fewer wake-ups per 64 KiB Output frame (best effort). */
#define AGENT_PIPE_BYTES (1 << 20)

/* ---- files ---- */

int wk__mkdir_p(const char *path, mode_t mode)
{
    char *p = sp_xstrdup(path);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, mode) < 0 && errno != EEXIST) {
            rc = -errno;
            break;
        }
        *s = c;
        if (c == '\0')
            break;
    }
    free(p);
    if (rc == 0) {
        struct stat st;
        if (stat(path, &st) < 0)
            rc = -errno;
        else if (!S_ISDIR(st.st_mode))
            rc = -ENOTDIR;
    }
    return rc;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int r = flag == FTW_DP ? rmdir(path) : unlink(path);
    return r < 0 && errno != ENOENT ? errno : 0;
}

int wk__rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    /* FTW_MOUNT: never descend into another file system mounted below. */
    int r = nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    if (r < 0)
        return errno == ENOENT ? 0 : -errno;
    return r > 0 ? -r : 0;
}

void wk__last_line(const char *text, char *out, size_t out_len)
{
    out[0] = '\0';
    if (!text || out_len == 0)
        return;
    size_t len = strlen(text);
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
        len--;
    size_t start = len;
    while (start > 0 && text[start - 1] != '\n')
        start--;
    size_t n = len - start;
    if (n >= out_len)
        n = out_len - 1;
    /* Control bytes would break the one-line reason. */
    for (size_t i = 0; i < n; i++) {
        char ch = text[start + i];
        if ((unsigned char)ch < 0x20 || ch == 0x7f)
            ch = '?';
        out[i] = ch;
    }
    out[n] = '\0';
}

/* ---- host ---- */

/* One decimal octet, 0-255, no sign, no leading zeros beyond "0" itself. */
static const char *parse_octet(const char *s, uint8_t *ret)
{
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
        return NULL;
    unsigned v = 0;
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (++digits > 3)
            return NULL;
        v = v * 10 + (unsigned)(*s - '0');
    }
    if (v > 255)
        return NULL;
    *ret = (uint8_t)v;
    return s;
}

static int parse_prefix(const char *s, uint8_t *a, uint8_t *b)
{
    if (!s || !(s = parse_octet(s, a)) || *s++ != '.' || !(s = parse_octet(s, b)) || *s != '\0')
        return -EINVAL;
    return 0;
}

static bool platform_valid(const char *p)
{
    if (!p || !*p || strlen(p) > 32)
        return false;
    for (; *p; p++) {
        if (*p < 'a' || *p > 'z')
            return false;
    }
    return true;
}

#define IDENTITIES_FILE "identities"
#define IDENTITIES_MAX  (64 * 1024)

/* The whole identities file of state_dir (NUL-terminated heap text, "" when there is none). */
static int identities_read(int fd, char **ret_text)
{
    char *text = sp_xmalloc(IDENTITIES_MAX + 1);
    size_t len = 0;
    for (;;) {
        ssize_t n = pread(fd, text + len, IDENTITIES_MAX + 1 - len, (off_t)len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int rc = -errno;
            free(text);
            return rc;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > IDENTITIES_MAX) {
            free(text);
            return -EFBIG;
        }
    }
    text[len] = '\0';
    *ret_text = text;
    return 0;
}

/* Adds this host's line to state_dir/identities unless it is there, before anything of this
 * identity exists on the host: a teardown finds it even after a crash half-way through. */
static int identity_record(const wk_host_t *h, char err[WK_ERR_MAX])
{
    char *path = sp_xasprintf("%s/" IDENTITIES_FILE, h->state_dir);
    char *line = sp_xasprintf("%s %s %s\n", h->tag, h->worker_id, h->volume_dir);
    char *text = NULL;
    int rc = 0;
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = wk__fail(err, -errno, "open %s: %s", path, strerror(errno));
        goto out;
    }
    /* Two workers on one state directory are an error anyway; the lock keeps the file whole. */
    if (flock(fd, LOCK_EX) < 0 || (rc = identities_read(fd, &text)) < 0) {
        rc = wk__fail(err, rc < 0 ? rc : -errno, "read %s: %s", path,
                      strerror(rc < 0 ? -rc : errno));
        goto out;
    }
    size_t len = strlen(line);
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) + 1 : strlen(p);
        if (n == len && memcmp(p, line, len) == 0)
            goto out; /* recorded already */
        p += n;
    }
    errno = 0;
    if (write(fd, line, len) != (ssize_t)len || fsync(fd) < 0) {
        int e = errno ? errno : EIO;
        rc = wk__fail(err, -e, "write %s: %s", path, strerror(e));
    }
out:
    if (fd >= 0)
        close(fd);
    free(text);
    free(line);
    free(path);
    return rc;
}

void wk_host_identities_free(wk_host_identity_t *ids, size_t n)
{
    for (size_t i = 0; ids && i < n; i++) {
        free(ids[i].worker_id);
        free(ids[i].volume_dir);
    }
    free(ids);
}

int wk_host_identities(const char *state_dir, wk_host_identity_t **ret_ids, size_t *ret_n,
                       char err[WK_ERR_MAX])
{
    char *path = sp_xasprintf("%s/" IDENTITIES_FILE, state_dir);
    char *text = NULL;
    wk_host_identity_t *ids = NULL;
    size_t n = 0, lineno = 0;
    int rc = 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        rc = errno == ENOENT ? 0 : wk__fail(err, -errno, "open %s: %s", path, strerror(errno));
        goto out;
    }
    if ((rc = identities_read(fd, &text)) < 0) {
        rc = wk__fail(err, rc, "read %s: %s", path, strerror(-rc));
        goto out;
    }
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        lineno++;
        /* "<8 hex> <worker id> <absolute volume dir, the rest of the line>" */
        char *id = strchr(l, ' '), *vol = id ? strchr(id + 1, ' ') : NULL;
        if (!id || !vol || id - l != WK_TAG_LEN || strspn(l, "0123456789abcdef") != WK_TAG_LEN ||
            vol[1] != '/') {
            rc = wk__fail(err, -EBADMSG, "%s:%zu: not \"<tag> <worker id> <volume dir>\"", path,
                          lineno);
            goto out;
        }
        *id++ = '\0';
        *vol++ = '\0';
        if (!sp_id_valid(id)) {
            rc = wk__fail(err, -EBADMSG, "%s:%zu: invalid worker id", path, lineno);
            goto out;
        }
        ids = sp_xrealloc(ids, (n + 1) * sizeof(*ids));
        memcpy(ids[n].tag, l, WK_TAG_LEN + 1);
        ids[n].worker_id = sp_xstrdup(id);
        ids[n].volume_dir = sp_xstrdup(vol);
        n++;
    }
out:
    if (fd >= 0)
        close(fd);
    free(text);
    free(path);
    if (rc < 0) {
        wk_host_identities_free(ids, n);
        return rc;
    }
    *ret_ids = ids;
    *ret_n = n;
    return 0;
}

int wk_host_open(const wk_host_config_t *cfg, wk_host_t **ret_host, char err[WK_ERR_MAX])
{
    uint8_t a, b;
    if (!cfg || !ret_host)
        return wk__fail(err, -EINVAL, "no config");
    if (!cfg->worker_id || !sp_id_valid(cfg->worker_id))
        return wk__fail(err, SP_ECONFIG, "invalid worker_id");
    if (!cfg->state_dir || cfg->state_dir[0] != '/' || !cfg->volume_dir ||
        cfg->volume_dir[0] != '/')
        return wk__fail(err, SP_ECONFIG, "state_dir and volume_dir must be absolute paths");
    if (strchr(cfg->volume_dir, '\n'))
        return wk__fail(err, SP_ECONFIG, "volume_dir holds a newline");
    if (parse_prefix(cfg->net_prefix, &a, &b) < 0)
        return wk__fail(err, SP_ECONFIG, "net_prefix must be two octets like 10.200");
    const char *platform = cfg->runsc_platform ? cfg->runsc_platform : "ptrace";
    if (!platform_valid(platform))
        return wk__fail(err, SP_ECONFIG, "invalid runsc_platform");
    if (cfg->agent_path && (cfg->agent_path[0] != '/' || access(cfg->agent_path, R_OK) < 0))
        return wk__fail(err, SP_ECONFIG, "agent %s: %s", cfg->agent_path,
                        cfg->agent_path[0] != '/' ? "not an absolute path" : strerror(errno));
    char *runsc = NULL;
    int rc = wk__find_program(cfg->runsc ? cfg->runsc : "runsc", &runsc);
    if (rc < 0)
        return wk__fail(err, SP_ECONFIG, "runsc program %s not found",
                        cfg->runsc ? cfg->runsc : "runsc");

    wk_host_t *h = sp_xcalloc(1, sizeof(*h));
    h->worker_id = sp_xstrdup(cfg->worker_id);
    h->state_dir = sp_xstrdup(cfg->state_dir);
    h->volume_dir = sp_xstrdup(cfg->volume_dir);
    h->runsc = runsc;
    h->platform = sp_xstrdup(platform);
    h->net_a = a;
    h->net_b = b;
    /* The tag names this worker's host resources: from its id and its state directory, so
     * two stacks on one host whose workers share an id (each its own `worker-1`) never take
     * each other's sandboxes for their own. */
    uint8_t d[SP_SHA256_LEN];
    char hex[SP_SHA256_HEX_LEN + 1];
    sp_buf_t key;
    sp_buf_init(&key);
    sp_buf_puts(&key, cfg->worker_id);
    sp_buf_putc(&key, '\n');
    sp_buf_puts(&key, h->state_dir); /* absolute, as configured */
    sp_sha256(key.data, key.len, d);
    sp_buf_dispose(&key);
    sp_hex_encode(d, SP_SHA256_LEN, hex);
    memcpy(h->tag, hex, WK_TAG_LEN);
    h->tag[WK_TAG_LEN] = '\0';
    h->runsc_root = sp_xasprintf("%s/runsc", h->state_dir);
    h->bundles_dir = sp_xasprintf("%s/bundles", h->state_dir);
    h->templates_dir = sp_xasprintf("%s/templates", h->volume_dir);
    h->sandboxes_dir = sp_xasprintf("%s/sandboxes", h->volume_dir);
    h->agent_path = cfg->agent_path ? sp_xstrdup(cfg->agent_path) : NULL;
    h->template_defs = sp_xstrdup(cfg->template_defs ? cfg->template_defs : WK_TEMPLATES_DIR);
    h->template_cache =
        cfg->template_cache && cfg->template_cache[0] ? sp_xstrdup(cfg->template_cache) : NULL;
    h->cancel = cfg->cancel;
    h->runsc_seconds = cfg->runsc_seconds;
    if (cfg->ca_cert_path && (rc = wk__trust_load(cfg->ca_cert_path, &h->ca_pem, err)) < 0) {
        wk_host_close(h);
        return rc;
    }
    pthread_mutex_init(&h->pool_lock, NULL);
    pthread_mutex_init(&h->tmpl_lock, NULL);
    pthread_cond_init(&h->tmpl_cond, NULL);
    pthread_mutex_init(&h->rel_lock, NULL);
    pthread_cond_init(&h->rel_cond, NULL);

    const char *dirs[] = {h->state_dir, h->runsc_root, h->bundles_dir};
    for (size_t i = 0; i < 3; i++) {
        rc = wk__mkdir_p(dirs[i], i == 0 ? 0755 : 0700);
        if (rc < 0) {
            rc = wk__fail(err, rc, "mkdir %s: %s", dirs[i], strerror(-rc));
            goto fail;
        }
    }
    /* Recorded before the volume, the firewall table or any sandbox exists. */
    if ((rc = identity_record(h, err)) < 0)
        goto fail;
    rc = wk__volume_open(cfg, err);
    if (rc < 0)
        goto fail;
    const char *vdirs[] = {h->templates_dir, h->sandboxes_dir};
    for (size_t i = 0; i < 2; i++) {
        if (mkdir(vdirs[i], 0700) < 0 && errno != EEXIST) {
            rc = wk__fail(err, -errno, "mkdir %s: %s", vdirs[i], strerror(errno));
            goto fail;
        }
    }
    rc = wk__net_prepare();
    if (rc < 0) {
        rc = wk__fail(err, rc, "prepare %s: %s", WK_NETNS_DIR, strerror(-rc));
        goto fail;
    }
    h->disk_mb_default = cfg->disk_mb_default ? cfg->disk_mb_default : WK_DISK_MB_DEFAULT;
    h->disk_reserve_mb = cfg->disk_reserve_mb;
    h->disk_quota_off = cfg->disk_quota_off;
    h->pids_default = cfg->pids_default ? cfg->pids_default : WK_PIDS_DEFAULT;
    h->egress_proxy_port = cfg->egress_proxy_port;
    h->egress_dns_port = cfg->egress_dns_port;
    int64_t t0 = wk__now_us();
    rc = wk__nft_setup(h, err);
    if (rc < 0)
        goto fail;
    sp_log(SP_LOG_DEBUG, "firewall ready", SP_KF("ms", (double)(wk__now_us() - t0) / 1000.0));
    *ret_host = h;
    return 0;
fail:
    wk_host_close(h);
    return rc;
}

void wk_host_close(wk_host_t *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->rel_lock);
    while (h->releasing)
        pthread_cond_wait(&h->rel_cond, &h->rel_lock);
    pthread_mutex_unlock(&h->rel_lock);
    pthread_mutex_destroy(&h->rel_lock);
    pthread_cond_destroy(&h->rel_cond);
    pthread_mutex_destroy(&h->pool_lock);
    pthread_mutex_destroy(&h->tmpl_lock);
    pthread_cond_destroy(&h->tmpl_cond);
    wk_strv_free(h->building, h->n_building);
    free(h->worker_id);
    free(h->state_dir);
    free(h->volume_dir);
    free(h->runsc);
    free(h->platform);
    free(h->runsc_root);
    free(h->bundles_dir);
    free(h->templates_dir);
    free(h->template_defs);
    free(h->template_cache);
    free(h->sandboxes_dir);
    free(h->agent_path);
    free(h->ca_pem);
    free(h);
}

/* ---- sandboxes ---- */

static double ms_since(int64_t t_us)
{
    return (double)(wk__now_us() - t_us) / 1000.0;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

static int disk_room(wk_host_t *h, const char *id, uint32_t disk_mb, char err[WK_ERR_MAX]);

/* ---- warm-pool ids and the claim map (worker_runtime_int.h) ---- */

void wk_pool_id_new(char out[WK_POOL_ID_LEN + 1])
{
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuv";
    uint8_t r[26];
    sp_random_bytes(r, sizeof(r));
    size_t plen = strlen(WK_POOL_PREFIX);
    memcpy(out, WK_POOL_PREFIX, plen);
    for (size_t i = 0; i < 26; i++)
        out[plen + i] = alphabet[r[i] & 31];
    out[WK_POOL_ID_LEN] = '\0';
}

bool wk_pool_id_is(const char *id)
{
    return id && strlen(id) == WK_POOL_ID_LEN &&
           strncmp(id, WK_POOL_PREFIX, strlen(WK_POOL_PREFIX)) == 0 && sp_id_valid(id);
}

/* The pool id bundles/<id> links to (out), 1; 0 when it is no such link. */
static int claim_target(const wk_host_t *h, const char *id, char out[65])
{
    char *link = sp_xasprintf("%s/%s", h->bundles_dir, id);
    char buf[80];
    ssize_t n = readlink(link, buf, sizeof(buf) - 1);
    free(link);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    if (!wk_pool_id_is(buf))
        return 0;
    memcpy(out, buf, (size_t)n + 1);
    return 1;
}

void wk__host_id(const wk_host_t *h, const char *id, char out[65])
{
    if (wk_pool_id_is(id) || !claim_target(h, id, out))
        snprintf(out, 65, "%s", id);
}

uint32_t wk_sandbox_disk_mb(const wk_host_t *h, uint32_t disk_mb)
{
    return h->disk_quota_off ? 0 : disk_mb ? disk_mb : h->disk_mb_default;
}

int wk_sandbox_claim(wk_host_t *h, const char *pool_id, const wk_sandbox_spec_t *spec,
                     uint32_t *ret_disk_mb, char err[WK_ERR_MAX])
{
    if (!h || !wk_pool_id_is(pool_id) || !spec || !spec->id || !sp_id_valid(spec->id) ||
        wk_pool_id_is(spec->id))
        return wk__fail(err, -EINVAL, "invalid pool or sandbox id");
    if (spec->disk_mb > MAX_DISK_MB)
        return wk__fail(err, -EINVAL, "disk_mb out of range");
    char *bundle = sp_xasprintf("%s/%s", h->bundles_dir, pool_id);
    char *rootfs = sp_xasprintf("%s/%s", h->sandboxes_dir, pool_id);
    char *link = sp_xasprintf("%s/%s", h->bundles_dir, spec->id);
    int rc = 0;
    struct stat st;
    if (lstat(bundle, &st) < 0 || !S_ISDIR(st.st_mode)) {
        rc = wk__fail(err, -ENOENT, "pooled sandbox %s is gone", pool_id);
        goto out;
    }
    /* The limit the pooled sandbox was made with is the default: only another one is set. */
    uint32_t disk_mb = spec->disk_mb ? spec->disk_mb : h->disk_mb_default;
    if (disk_mb != h->disk_mb_default) {
        if ((rc = disk_room(h, spec->id, disk_mb, err)) < 0)
            goto out;
        if (!h->disk_quota_off && (rc = wk__subvol_limit(rootfs, (uint64_t)disk_mb << 20, err)) < 0)
            goto out;
    }
    /* Atomic: the sandbox is spec->id's from here on, for a worker restarted at any moment. */
    if (symlink(pool_id, link) < 0) {
        rc = wk__fail(err, -errno, "sandbox %s: %s", spec->id,
                      errno == EEXIST ? "exists" : strerror(errno));
        goto out;
    }
    if (ret_disk_mb)
        *ret_disk_mb = wk_sandbox_disk_mb(h, spec->disk_mb);
out:
    free(link);
    free(rootfs);
    free(bundle);
    return rc;
}

/* Copies the agent binary to <rootfs>/.space/agent, root-owned, mode 0755. The rootfs is a
 * snapshot of a template, which may in time come from a guest: nothing in it is followed
 * (no symlink for .space or agent), and an existing agent is replaced, not written through. */
static int install_agent(const wk_host_t *h, const char *rootfs, char err[WK_ERR_MAX])
{
    int rc = 0, root = -1, dir = -1, in = -1, out = -1;
    char *buf = NULL;
    root = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        rc = wk__fail(err, -errno, "open %s: %s", rootfs, strerror(errno));
        goto out;
    }
    if (mkdirat(root, AGENT_DIR, 0755) < 0 && errno != EEXIST) {
        rc = wk__fail(err, -errno, "mkdir /%s in the sandbox: %s", AGENT_DIR, strerror(errno));
        goto out;
    }
    dir = openat(root, AGENT_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dir < 0 || fstat(dir, &st) < 0) {
        rc = wk__fail(err, -errno, "open /%s in the sandbox: %s", AGENT_DIR, strerror(errno));
        goto out;
    }
    if ((st.st_uid != 0 || st.st_gid != 0) && fchown(dir, 0, 0) < 0) {
        rc = wk__fail(err, -errno, "chown /%s in the sandbox: %s", AGENT_DIR, strerror(errno));
        goto out;
    }
    if ((st.st_mode & 07777) != 0755 && fchmod(dir, 0755) < 0) {
        rc = wk__fail(err, -errno, "chmod /%s in the sandbox: %s", AGENT_DIR, strerror(errno));
        goto out;
    }
    /* The mount point of the channel directory (runsc needs it in the rootfs). */
    if (mkdirat(dir, AGENT_CHAN_DIR, 0755) < 0 && errno != EEXIST) {
        rc = wk__fail(err, -errno, "mkdir %s/%s in the sandbox: %s", AGENT_DIR, AGENT_CHAN_DIR,
                      strerror(errno));
        goto out;
    }
    if (unlinkat(dir, AGENT_FILE, 0) < 0 && errno != ENOENT) {
        rc = wk__fail(err, -errno, "replace %s in the sandbox: %s", AGENT_GUEST_PATH,
                      strerror(errno));
        goto out;
    }
    in = open(h->agent_path, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        rc = wk__fail(err, -errno, "open agent %s: %s", h->agent_path, strerror(errno));
        goto out;
    }
    out = openat(dir, AGENT_FILE, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0700);
    if (out < 0) {
        rc = wk__fail(err, -errno, "create %s in the sandbox: %s", AGENT_GUEST_PATH,
                      strerror(errno));
        goto out;
    }
    buf = sp_xmalloc(1 << 16);
    for (;;) {
        ssize_t n = read(in, buf, 1 << 16);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = wk__fail(err, -errno, "read agent %s: %s", h->agent_path, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                rc = wk__fail(err, -errno, "write %s in the sandbox: %s", AGENT_GUEST_PATH,
                              strerror(errno));
                goto out;
            }
            off += w;
        }
    }
    if (fchown(out, 0, 0) < 0 || fchmod(out, 0755) < 0) {
        rc =
            wk__fail(err, -errno, "chmod %s in the sandbox: %s", AGENT_GUEST_PATH, strerror(errno));
        goto out;
    }
    int fd = out;
    out = -1;
    if (close(fd) < 0)
        rc =
            wk__fail(err, -errno, "close %s in the sandbox: %s", AGENT_GUEST_PATH, strerror(errno));
out:
    free(buf);
    close_fd(&out);
    close_fd(&in);
    close_fd(&dir);
    close_fd(&root);
    return rc;
}

/* The reserve (docs/faults.md, "Limits"): a sandbox that filled its own limit must still
 * leave disk_reserve_mb free on the volume, so that creates, restores and the other sandboxes'
 * small writes keep working. Limits are overcommitted (most sandboxes write little), so this
 * looks at what is free now, not at the sum of the limits. -ENOSPC: the caller reports
 * no_capacity. */
int wk_host_disk(wk_host_t *h, wk_host_disk_t *ret)
{
    uint64_t free_b = 0, size_b = 0;
    int rc = wk__volume_free(h->volume_dir, &free_b);
    if (rc == 0)
        rc = wk__volume_size(h->volume_dir, &size_b);
    if (rc < 0)
        return rc;
    ret->total_mb = size_b >> 20;
    ret->free_mb = free_b >> 20 < ret->total_mb ? free_b >> 20 : ret->total_mb;
    ret->reserve_mb = h->disk_reserve_mb < ret->total_mb ? h->disk_reserve_mb : ret->total_mb;
    ret->default_mb = h->disk_mb_default;
    return 0;
}

int wk_host_qgroup_sweep(wk_host_t *h, bool rescan, unsigned *ret_removed, unsigned *ret_left,
                         char err[WK_ERR_MAX])
{
    *ret_removed = *ret_left = 0;
    if (h->disk_quota_off)
        return 0;
    return wk__qgroup_sweep(h->volume_dir, rescan, ret_removed, ret_left, err);
}

static int disk_room(wk_host_t *h, const char *id, uint32_t disk_mb, char err[WK_ERR_MAX])
{
    uint64_t free_b = 0;
    int rc = wk__volume_free(h->volume_dir, &free_b);
    if (rc < 0)
        return wk__fail(err, rc, "statvfs %s: %s", h->volume_dir, strerror(-rc));
    uint64_t need = ((uint64_t)disk_mb + h->disk_reserve_mb) << 20;
    if (free_b < need)
        return wk__fail(err, -ENOSPC,
                        "sandbox %s: this worker's disk has %llu MiB free; the sandbox may write "
                        "%u MiB and %u MiB are kept in reserve",
                        id, (unsigned long long)(free_b >> 20), disk_mb, h->disk_reserve_mb);
    return 0;
}

int wk_sandbox_create(wk_host_t *h, const wk_sandbox_spec_t *spec, wk_sandbox_info_t *ret_info,
                      char err[WK_ERR_MAX])
{
    if (!h || !spec || !spec->id || !sp_id_valid(spec->id) ||
        spec->pooled != wk_pool_id_is(spec->id))
        return wk__fail(err, -EINVAL, "invalid sandbox id");
    if (!spec->template_ || !sp_id_valid(spec->template_))
        return wk__fail(err, -EINVAL, "invalid template name");
    if (spec->vcpu > MAX_VCPU || spec->memory_mb > MAX_MEMORY_MB || spec->disk_mb > MAX_DISK_MB ||
        spec->pids > MAX_PIDS)
        return wk__fail(err, -EINVAL, "vcpu, memory_mb, disk_mb or pids out of range");
    const char *id = spec->id;
    int64_t t0 = wk__now_us();
    char *tmpl = sp_xasprintf("%s/%s", h->templates_dir, spec->template_);
    char *bundle = sp_xasprintf("%s/%s", h->bundles_dir, id);
    char *rootfs = sp_xasprintf("%s/%s", h->sandboxes_dir, id);
    char *chan = NULL;
    char netns[WK_NETNS_NAME_MAX];
    wk__netns_name(h, id, netns);
    char *netns_path = sp_xasprintf("%s/%s", WK_NETNS_DIR, netns);
    wk_sandbox_info_t info;
    memset(&info, 0, sizeof(info));
    info.agent_to_fd = info.agent_from_fd = -1;
    /* The agent channel: to[1] and from[0] are the host's ends, to[0] and from[1] the init's
     * stdin and stdout, which only runsc create's child gets (close-on-exec here). */
    int to[2] = {-1, -1}, from[2] = {-1, -1};
    bool marked = false;
    double snap_ms = 0, net_ms = 0, agent_ms = 0, create_ms = 0, start_ms = 0;
    int rc;

    bool ro = false;
    rc = wk__subvol_is(tmpl, &ro);
    if (rc <= 0 || !ro) {
        rc = wk__fail(err, rc < 0 ? rc : SP_ENOTFOUND, "template %s is not ready", spec->template_);
        goto out;
    }
    if (mkdir(bundle, 0700) < 0) {
        rc = wk__fail(err, -errno, "sandbox %s: %s", id,
                      errno == EEXIST ? "exists" : strerror(errno));
        goto out;
    }
    marked = true;
    /* The agent's way back after its first channel broke (worker_agent.h). */
    chan = sp_xasprintf("%s/%s", bundle, AGENT_CHAN_DIR);
    if (mkdir(chan, 0700) < 0) {
        rc = wk__fail(err, -errno, "mkdir %s: %s", chan, strerror(errno));
        goto out;
    }

    uint32_t disk_mb = spec->disk_mb ? spec->disk_mb : h->disk_mb_default;
    if ((rc = disk_room(h, id, disk_mb, err)) < 0)
        goto out;
    info.disk_mb = wk_sandbox_disk_mb(h, spec->disk_mb);
    int64_t t = wk__now_us();
    rc = wk__subvol_snapshot(tmpl, rootfs, false, err);
    if (rc >= 0 && !h->disk_quota_off)
        rc = wk__subvol_limit(rootfs, (uint64_t)disk_mb << 20, err);
    if (rc < 0)
        goto out;
    snap_ms = ms_since(t);
    rc = wk__trust_install(h, rootfs, err);
    if (rc < 0)
        goto out;

    t = wk__now_us();
    rc = wk__net_create(h, id, info.address, err);
    if (rc < 0)
        goto out;
    net_ms = ms_since(t);
    /* Its gateway is the .1 of its /30 (the sandbox the .2): the resolver for a template that
     * names none (worker_resolv.c). Not at restore: the rootfs must stay as checkpointed. */
    struct in_addr guest;
    if (inet_pton(AF_INET, info.address, &guest) != 1) {
        rc = wk__fail(err, -EINVAL, "sandbox %s: bad address %s", id, info.address);
        goto out;
    }
    rc = wk__resolv_install(rootfs, htonl(ntohl(guest.s_addr) - 1), err);
    if (rc < 0)
        goto out;
    if (rc == 1)
        sp_log(SP_LOG_DEBUG, "resolver written", SP_KS("sandbox", id));

    if (h->agent_path) {
        t = wk__now_us();
        rc = install_agent(h, rootfs, err);
        if (rc < 0)
            goto out;
        if (pipe2(to, O_CLOEXEC) < 0 || pipe2(from, O_CLOEXEC) < 0) {
            rc = wk__fail(err, -errno, "agent pipes: %s", strerror(errno));
            goto out;
        }
        (void)fcntl(from[0], F_SETPIPE_SZ, AGENT_PIPE_BYTES);
        (void)fcntl(to[1], F_SETPIPE_SZ, AGENT_PIPE_BYTES);
        agent_ms = ms_since(t);
    }

    wk__bundle_t bd = {.id = id,
                       .rootfs = rootfs,
                       .netns_path = netns_path,
                       .vcpu = spec->vcpu,
                       .memory_mb = spec->memory_mb,
                       .pids = spec->pids ? spec->pids : h->pids_default,
                       .init = h->agent_path ? AGENT_GUEST_PATH : NULL,
                       .chan_dir = h->agent_path ? chan : NULL,
                       .claimable = h->agent_path != NULL};
    rc = wk__runsc_write_config(h, &bd, bundle, err);
    if (rc < 0)
        goto out;

    t = wk__now_us();
    rc = wk__runsc_create(h, id, bundle, to[0], from[1], err);
    /* The sandbox holds the init's ends now; ours would keep the channel from ever seeing
     * EOF when the sandbox ends. */
    close_fd(&to[0]);
    close_fd(&from[1]);
    if (rc < 0)
        goto out;
    create_ms = ms_since(t);

    t = wk__now_us();
    rc = wk__runsc_start(h, id, err);
    if (rc < 0)
        goto out;
    start_ms = ms_since(t);

    info.create_ms = (uint32_t)((wk__now_us() - t0) / 1000);
    sp_log(SP_LOG_DEBUG, "sandbox created", SP_KS("sandbox", id), SP_KS("address", info.address),
           SP_KF("snapshot_ms", snap_ms), SP_KF("net_ms", net_ms), SP_KF("agent_ms", agent_ms),
           SP_KF("runsc_create_ms", create_ms), SP_KF("runsc_start_ms", start_ms),
           SP_KU("total_ms", info.create_ms));
    if (ret_info) {
        info.agent_to_fd = to[1];
        info.agent_from_fd = from[0];
        to[1] = from[0] = -1;
        *ret_info = info;
    }
out:
    for (int i = 0; i < 2; i++) {
        close_fd(&to[i]);
        close_fd(&from[i]);
    }
    if (rc < 0 && marked)
        (void)wk_sandbox_destroy(h, id, NULL);
    free(netns_path);
    free(chan);
    free(rootfs);
    free(bundle);
    free(tmpl);
    return rc;
}

int wk_sandbox_running(wk_host_t *h, const char *sandbox)
{
    char id[65];
    wk__host_id(h, sandbox, id);
    wk_host_sandbox_t *list = NULL;
    size_t n = 0;
    int rc = wk__runsc_list(h, &list, &n);
    if (rc < 0)
        return rc;
    int running = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i].id, id) == 0)
            running = list[i].state == WK_RUNNING || list[i].state == WK_PAUSED;
    free(list);
    return running;
}

char *wk_sandbox_chan_socket(const wk_host_t *h, const char *id)
{
    if (!h->agent_path || !sp_id_valid(id))
        return NULL;
    char hid[65];
    wk__host_id(h, id, hid);
    return sp_xasprintf("%s/%s/%s/%s", h->bundles_dir, hid, AGENT_CHAN_DIR, AGENT_CHAN_SOCKET);
}

static void release_wait(wk_host_t *h, const char *sandbox);

/* sandbox's resources, which carry the host id id. container_gone: runsc deleted the container
 * already (wk_checkpoint_container_gone). */
static int destroy_as(wk_host_t *h, const char *sandbox, const char *id, bool container_gone,
                      char err[WK_ERR_MAX])
{
    int64_t t0 = wk__now_us();
    /* A container that will not go away keeps everything else: deleting the disk or the
     * network under a running sandbox would leave it unmanageable. A call a killed worker
     * left running on it goes first: a `runsc create` that ends after our delete would make
     * the container again, with nobody to own it. */
    int rc = wk__runsc_calls_stop(h, id);
    if (rc < 0)
        return wk__fail(err, rc, "runsc calls on %s do not end", id);
    /* Its processes gone first, runsc's delete does not wait 100 ms for them. */
    int killed = container_gone ? 0 : wk__runsc_procs_end(h, id);
    double kill_ms = ms_since(t0);
    rc = container_gone ? 0 : wk__runsc_delete(h, id, err);
    if (rc < 0)
        return rc;
    double runsc_ms = ms_since(t0);

    int r = wk__cgroup_remove(h, id);
    if (r < 0)
        rc = wk__fail(err, r, "remove cgroups of %s: %s", id, strerror(-r));
    char e2[WK_ERR_MAX];
    r = wk__net_destroy(h, id, e2);
    if (r < 0 && rc == 0)
        rc = wk__fail(err, r, "%s", e2);
    char *p = sp_xasprintf("%s/%s", h->sandboxes_dir, id);
    r = wk__subvol_delete(p, e2);
    if (r < 0 && rc == 0)
        rc = wk__fail(err, r, "%s", e2);
    free(p);
    /* The marker goes last, and only when everything else went. */
    if (rc == 0) {
        p = sp_xasprintf("%s/%s", h->bundles_dir, id);
        r = wk__rm_rf(p);
        if (r < 0)
            rc = wk__fail(err, r, "remove %s: %s", p, strerror(-r));
        free(p);
    }
    if (rc == 0 && strcmp(id, sandbox) != 0) {
        p = sp_xasprintf("%s/%s", h->bundles_dir, sandbox);
        if (unlink(p) < 0 && errno != ENOENT)
            rc = wk__fail(err, -errno, "remove %s: %s", p, strerror(errno));
        free(p);
    }
    sp_log(SP_LOG_DEBUG, "sandbox destroyed", SP_KS("sandbox", sandbox), SP_KS("host_id", id),
           SP_KI("rc", rc), SP_KI("killed_first", killed), SP_KF("kill_ms", kill_ms),
           SP_KF("runsc_ms", runsc_ms), SP_KF("total_ms", ms_since(t0)),
           SP_KS("container", container_gone ? "deleted_before" : "deleted"));
    return rc;
}

static int sandbox_destroy(wk_host_t *h, const char *sandbox, bool container_gone,
                           char err[WK_ERR_MAX])
{
    if (!h || !sandbox || !sp_id_valid(sandbox))
        return wk__fail(err, -EINVAL, "invalid sandbox id");
    release_wait(h, sandbox);
    /* A claimed pool sandbox: its resources carry the pool id; the map goes after them. */
    char id[65];
    wk__host_id(h, sandbox, id);
    return destroy_as(h, sandbox, id, container_gone, err);
}

int wk_sandbox_destroy(wk_host_t *h, const char *sandbox, char err[WK_ERR_MAX])
{
    return sandbox_destroy(h, sandbox, false, err);
}

int wk_sandbox_destroy_checkpointed(wk_host_t *h, const char *sandbox, wk_checkpoint_t *ck,
                                    char err[WK_ERR_MAX])
{
    return sandbox_destroy(h, sandbox, ck && wk_checkpoint_container_gone(ck), err);
}

int wk_sandbox_net_restore(wk_host_t *h, const char *id, char err[WK_ERR_MAX])
{
    if (!h || !id || !sp_id_valid(id))
        return wk__fail(err, -EINVAL, "invalid sandbox id");
    char hid[65];
    wk__host_id(h, id, hid);
    return wk__net_restore(h, hid, err);
}

int wk_sandbox_address(wk_host_t *h, const char *id, char out[16], char err[WK_ERR_MAX])
{
    if (!h || !id || !sp_id_valid(id))
        return wk__fail(err, -EINVAL, "invalid sandbox id");
    uint32_t be = 0;
    char hid[65];
    wk__host_id(h, id, hid);
    int rc = wk__net_address(h, hid, &be, err);
    if (rc == 0 && !inet_ntop(AF_INET, &be, out, 16))
        rc = wk__fail(err, -errno, "inet_ntop: %m");
    return rc;
}

int wk_sandbox_exec(wk_host_t *h, const char *sandbox, const char *const *argv, char *out,
                    size_t out_len, int *ret_exit_code)
{
    if (!h || !sandbox || !sp_id_valid(sandbox) || !argv || !argv[0] || !out || out_len == 0)
        return -EINVAL;
    char id[65];
    wk__host_id(h, sandbox, id);
    out[0] = '\0';
    char *bundle = sp_xasprintf("%s/%s", h->bundles_dir, id);
    int present = access(bundle, F_OK) == 0;
    free(bundle);
    if (!present)
        return SP_ENOTFOUND;
    int ex = 0;
    int rc = wk__runsc_exec(h, id, argv, out, out_len, &ex);
    if (rc == 0 && ret_exit_code)
        *ret_exit_code = ex;
    return rc;
}

/* ---- scan and usage ---- */

typedef struct {
    wk_host_sandbox_t *v;
    size_t n, cap;
} sblist_t;

/* Adds id, or updates its state when state is a container state (RUNNING/STOPPED). */
static void sb_add(sblist_t *l, const char *id, wk_state_t state)
{
    for (size_t i = 0; i < l->n; i++) {
        if (strcmp(l->v[i].id, id) == 0) {
            if (state != WK_PARTIAL)
                l->v[i].state = state;
            return;
        }
    }
    if (strlen(id) >= sizeof(l->v[0].id))
        return;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = sp_xreallocarray(l->v, l->cap, sizeof(*l->v));
    }
    wk_host_sandbox_t *s = &l->v[l->n++];
    memset(s, 0, sizeof(*s));
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->state = state;
}

/* Calls fn for each entry of dir whose name starts with prefix and whose remainder is an
 * id; returns how many, or < 0 if dir cannot be read (a missing dir is 0). */
static int each_id(const char *dir, const char *prefix, void (*fn)(void *, const char *), void *ctx)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    size_t plen = strlen(prefix);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, prefix, plen) != 0 || !sp_id_valid(de->d_name + plen))
            continue;
        if (fn)
            fn(ctx, de->d_name + plen);
        n++;
    }
    closedir(d);
    return n;
}

static void add_partial(void *ctx, const char *id)
{
    sb_add(ctx, id, WK_PARTIAL);
}

int wk_host_scan(wk_host_t *h, wk_host_sandbox_t **ret_list, size_t *ret_n)
{
    sblist_t l = {0};
    wk_host_sandbox_t *cont = NULL;
    size_t ncont = 0;
    int rc = wk__runsc_list(h, &cont, &ncont);
    if (rc < 0)
        goto fail;
    char prefix[WK_TAG_LEN + 8];
    snprintf(prefix, sizeof(prefix), "sp-%s-", h->tag);
    int r;
    if ((r = each_id(h->sandboxes_dir, "", add_partial, &l)) < 0 ||
        (r = each_id(h->bundles_dir, "", add_partial, &l)) < 0 ||
        (r = each_id(WK_NETNS_DIR, prefix, add_partial, &l)) < 0) {
        rc = r;
        goto fail;
    }
    char **cg = NULL;
    size_t ncg = 0;
    rc = wk__cgroup_ids(h, &cg, &ncg);
    if (rc < 0)
        goto fail;
    for (size_t i = 0; i < ncg; i++)
        sb_add(&l, cg[i], WK_PARTIAL);
    wk_strv_free(cg, ncg);
    for (size_t i = 0; i < ncont; i++)
        sb_add(&l, cont[i].id, cont[i].state);
    free(cont);
    /* Claimed pool sandboxes are reported under their sandbox ids (the bundles/<id> links),
     * with the state of what carries the pool id; unclaimed ones under their pool ids. */
    sblist_t out = {0};
    char(*target)[65] = sp_xcalloc(l.n ? l.n : 1, sizeof(*target));
    for (size_t i = 0; i < l.n; i++)
        if (wk_pool_id_is(l.v[i].id) || !claim_target(h, l.v[i].id, target[i]))
            target[i][0] = '\0';
    for (size_t i = 0; i < l.n; i++) {
        wk_state_t st = l.v[i].state;
        const char *as = l.v[i].id;
        for (size_t k = 0; k < l.n; k++) {
            if (target[i][0] && strcmp(l.v[k].id, target[i]) == 0 && l.v[k].state != WK_PARTIAL)
                st = l.v[k].state; /* the link: the pool id's state */
            if (wk_pool_id_is(as) && strcmp(target[k], as) == 0)
                as = l.v[k].id; /* the pool id: reported as its link */
        }
        sb_add(&out, as, st);
    }
    free(target);
    free(l.v);
    *ret_list = out.v;
    *ret_n = out.n;
    return 0;
fail:
    free(cont);
    free(l.v);
    return rc;
}

static void count_subvol(void *ctx, const char *id)
{
    void **c = ctx;
    const wk_host_t *h = c[0];
    size_t *n = c[1];
    char *p = sp_xasprintf("%s/%s", h->sandboxes_dir, id);
    if (wk__subvol_is(p, NULL) == 1)
        (*n)++;
    free(p);
}

int wk_host_usage(wk_host_t *h, wk_host_usage_t *ret)
{
    wk_host_usage_t u;
    memset(&u, 0, sizeof(u));
    wk_host_sandbox_t *cont = NULL;
    int rc = wk__runsc_list(h, &cont, &u.containers);
    free(cont);
    if (rc < 0)
        return rc;

    void *ctx[2] = {h, &u.subvolumes};
    int r = each_id(h->sandboxes_dir, "", count_subvol, ctx);
    if (r < 0)
        return r;

    char prefix[WK_TAG_LEN + 8];
    snprintf(prefix, sizeof(prefix), "sp-%s-", h->tag);
    r = each_id(WK_NETNS_DIR, prefix, NULL, NULL);
    if (r < 0)
        return r;
    u.netns = (size_t)r;

    /* Veth names are not ids (hashes): count by prefix. */
    char vprefix[IFNAMSIZ];
    snprintf(vprefix, sizeof(vprefix), "spv%.4s", h->tag);
    DIR *d = opendir("/sys/class/net");
    if (!d)
        return -errno;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, vprefix, strlen(vprefix)) == 0)
            u.veths++;
    }
    closedir(d);

    char **cg = NULL;
    rc = wk__cgroup_ids(h, &cg, &u.cgroups);
    wk_strv_free(cg, u.cgroups);
    if (rc < 0)
        return rc;
    *ret = u;
    return 0;
}

int wk_host_teardown(wk_host_t *h, char err[WK_ERR_MAX])
{
    wk_host_sandbox_t *list = NULL;
    size_t n = 0;
    int rc = wk_host_scan(h, &list, &n);
    if (rc < 0)
        return wk__fail(err, rc, "scan failed");
    for (size_t i = 0; i < n; i++) {
        if ((rc = wk_sandbox_destroy(h, list[i].id, err)) < 0) {
            free(list);
            return rc;
        }
    }
    free(list);
    (void)wk_host_kept_sweep(h, NULL, NULL); /* suspended sandboxes' disks */
    if ((rc = wk__nft_teardown(h, err)) < 0)
        return rc;
    /* The per-worker cgroup parents are empty now. */
    char *pattern = sp_xasprintf("space-%s", h->tag);
    DIR *d = opendir(WK_CGROUP_ROOT);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char *p = sp_xasprintf("%s/%s/%s", WK_CGROUP_ROOT, de->d_name, pattern);
        rmdir(p);
        free(p);
    }
    if (d)
        closedir(d);
    free(pattern);
    /* Our image, loop-mounted with autoclear: unmounting releases the loop device too. A
     * volume_dir that is the host's own btrfs is not ours to unmount. */
    char *image = sp_xasprintf("%s/volumes.img", h->state_dir);
    /* Busy for a while after a worker killed at its stop: the processes of what it was
     * releasing (a gofer, a btrfs tool) are still exiting. Seen under TSan: 10 s of retries. */
    int urc = 0;
    for (int tries = 0; access(image, F_OK) == 0 && tries < 100; tries++) {
        urc = umount2(h->volume_dir, 0) == 0 ? 0 : -errno;
        if (urc != -EBUSY)
            break;
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    }
    errno = -urc;
    if (access(image, F_OK) == 0 && urc < 0 && errno != EINVAL && errno != ENOENT) {
        rc = wk__fail(err, -errno, "umount %s: %s", h->volume_dir, strerror(errno));
        free(image);
        return rc;
    }
    free(image);
    return 0;
}

/* ---- lifecycle: pause, checkpoint, restore ---- */

size_t wk_host_trust_env(const wk_host_t *h, const char *const **ret)
{
    *ret = wk__trust_env;
    return h->ca_pem ? WK_TRUST_ENV_N : 0;
}

const char *wk_host_tag(const wk_host_t *h)
{
    return h->tag;
}

int wk_mkdir_p(const char *path)
{
    int rc = wk__mkdir_p(path, 0700);
    if (rc < 0)
        errno = -rc;
    return rc;
}

int wk_rm_rf(const char *path)
{
    return wk__rm_rf(path);
}

int wk_sandbox_pause(wk_host_t *h, const char *id, bool pause, char err[WK_ERR_MAX])
{
    if (!h || !id || !sp_id_valid(id))
        return wk__fail(err, -EINVAL, "invalid sandbox id");
    char hid[65];
    wk__host_id(h, id, hid);
    return wk__runsc_verb(h, pause ? "pause" : "resume", hid, NULL, err);
}

/* Runs argv (absolute argv[0] looked up in PATH first) with a timeout; its output is the
 * reason on failure. */
int wk__run_tool(const char *const *argv, const char *what, int timeout_ms, char err[WK_ERR_MAX])
{
    char *prog = NULL;
    int rc = wk__find_program(argv[0], &prog);
    if (rc < 0)
        return wk__fail(err, rc, "%s: %s not found", what, argv[0]);
    const char **a = sp_xcalloc(16, sizeof(*a));
    size_t n = 0;
    a[n++] = prog;
    for (size_t i = 1; argv[i] && n < 15; i++)
        a[n++] = argv[i];
    char out[1024] = "";
    int ex = 0;
    wk__cmd_t c = {.argv = a,
                   .timeout_ms = timeout_ms,
                   .out_mode = WK_OUT_BOTH,
                   .out = out,
                   .out_len = sizeof(out)};
    rc = wk__run(&c, &ex);
    if (rc == 0 && ex != 0) {
        char line[WK_ERR_MAX];
        wk__last_line(out, line, sizeof(line));
        rc = wk__fail(err, -EIO, "%s: exit %d: %s", what, ex, line[0] ? line : "no output");
    } else if (rc < 0) {
        rc = wk__fail(err, rc, "%s: %s", what, sp_strerror(rc));
    }
    free(a);
    free(prog);
    return rc;
}

static int run_tool(const char *const *argv, const char *what, char err[WK_ERR_MAX])
{
    return wk__run_tool(argv, what, WK_RUNSC_TIMEOUT_MS, err);
}

/* A file compressed or decompressed (in-process, worker_stream.c) on a thread of its own beside
 * the caller's next steps: a suspend compresses the memory image while it sends the disk, a
 * resume decompresses it while it receives the disk (issue 21 part 3: what is independent runs
 * at once). */
typedef struct {
    const char *in, *out;
    bool decompress;
    pthread_t th;
    bool started;
    int rc;
    char err[WK_ERR_MAX];
} zstd_job_t;

static void *zstd_job_main(void *arg)
{
    zstd_job_t *j = arg;
    j->rc = j->decompress ? wk__unzstd_file(j->in, j->out, j->err)
                          : wk__zstd_file(j->in, j->out, WK_ZSTD_LEVEL, j->err);
    return NULL;
}

/* Starts the job; when no thread can be made it runs here and now. */
static void zstd_job_start(zstd_job_t *j, const char *in, const char *out, bool decompress)
{
    memset(j, 0, sizeof(*j));
    j->in = in;
    j->out = out;
    j->decompress = decompress;
    j->started = pthread_create(&j->th, NULL, zstd_job_main, j) == 0;
    if (!j->started)
        zstd_job_main(j);
}

/* Waits for the job; rc is the caller's own outcome so far: the first failure is the one
 * reported in err. */
static int zstd_job_join(zstd_job_t *j, int rc, char err[WK_ERR_MAX])
{
    if (j->started)
        pthread_join(j->th, NULL);
    j->started = false;
    if (rc == 0 && j->rc < 0) {
        snprintf(err, WK_ERR_MAX, "%s", j->err);
        return j->rc;
    }
    return rc;
}

/* runsc's delete of a checkpointed container, beside the rest of the suspend (the store's
 * put, the fact): at a lower priority (the nice value of a thread is its children's), so what
 * the suspend's answer waits for goes first on a busy host. */
struct wk_container_delete {
    const wk_host_t *h;
    char id[65]; /* its host id */
    pthread_t th;
    bool started, joined;
    int rc;
    int64_t t0, took_us; /* started at, and how long runsc took */
    char err[WK_ERR_MAX];
};

#define DELETE_NICE 10

static void delete_job_run(struct wk_container_delete *j)
{
    (void)wk__runsc_procs_end(j->h, j->id);
    j->rc = wk__runsc_delete(j->h, j->id, j->err);
    j->took_us = wk__now_us() - j->t0;
}

static void *delete_job_main(void *arg)
{
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), DELETE_NICE);
    delete_job_run(arg);
    return NULL;
}

static struct wk_container_delete *delete_job_start(const wk_host_t *h, const char *hid)
{
    struct wk_container_delete *j = sp_xcalloc(1, sizeof(*j));
    j->h = h;
    j->t0 = wk__now_us();
    snprintf(j->id, sizeof(j->id), "%s", hid);
    j->started = pthread_create(&j->th, NULL, delete_job_main, j) == 0;
    if (!j->started)
        delete_job_run(j); /* here and now, at the caller's priority */
    return j;
}

bool wk_checkpoint_container_gone(wk_checkpoint_t *c)
{
    struct wk_container_delete *j = c->deleting;
    if (!j)
        return false;
    if (j->started && !j->joined) {
        int64_t t = wk__now_us();
        pthread_join(j->th, NULL);
        j->joined = true;
        if (j->rc < 0)
            sp_log(SP_LOG_WARN, "a checkpointed container is not deleted", SP_KS("host_id", j->id),
                   SP_KS("error", j->err));
        else
            sp_log(SP_LOG_DEBUG, "checkpointed container deleted", SP_KS("host_id", j->id),
                   SP_KF("runsc_ms", (double)j->took_us / 1000.0),
                   SP_KF("waited_ms", (double)(wk__now_us() - t) / 1000.0));
    }
    return j->rc == 0;
}

/* Where a checkpoint's raw image and runsc's exit status go inside out_dir. */
#define CK_IMAGE_DIR "image"
#define CK_RC_FILE   "image/rc"

int wk_sandbox_checkpoint(wk_host_t *h, const char *id, const char *tmpl, const char *out_dir,
                          const char *keep_snap, wk_checkpoint_t *ret, char err[WK_ERR_MAX])
{
    if (!h || !id || !sp_id_valid(id) || !tmpl || !sp_id_valid(tmpl) || !out_dir)
        return wk__fail(err, -EINVAL, "invalid sandbox id, template or directory");
    memset(ret, 0, sizeof(*ret));
    char hid[65];
    wk__host_id(h, id, hid);
    int64_t t0 = wk__now_us();
    char *img = sp_xasprintf("%s/" CK_IMAGE_DIR, out_dir);
    char *rc_path = sp_xasprintf("%s/" CK_RC_FILE, out_dir);
    int rc = wk__mkdir_p(img, 0700);
    if (rc < 0)
        rc = wk__fail(err, rc, "mkdir %s: %s", img, strerror(-rc));
    /* The runtime first: runsc stops the container once its image is written. */
    else if ((rc = wk__runsc_checkpoint(h, hid, img, rc_path, err)) == 0) {
        uint32_t ms = (uint32_t)ms_since(t0);
        /* Stopped for good, the container is deleted on a thread of its own once its disk
         * and image are compressed, while they go into the store and the fact out: the release
         * after the suspend then waits for less of runsc's ~50 ms, and so does a resume right
         * after. Not earlier: beside the disk's send and the compressions it slowed them by
         * as much (docs/machine-notes.md). The disk stays: a worker that dies from here on
         * finishes the suspend from it and the image (wk_sandbox_checkpoint_finish). */
        rc = wk_sandbox_checkpoint_finish(h, id, tmpl, out_dir, keep_snap, ret, err);
        ret->checkpoint_ms = ms;
        ret->deleting = delete_job_start(h, hid);
        if (rc < 0)
            wk_checkpoint_dispose(ret);
    }
    if (rc < 0)
        (void)wk__rm_rf(img);
    free(rc_path);
    free(img);
    return rc;
}

int wk_checkpoint_outcome(const char *out_dir, int wait_ms)
{
    char *rc_path = sp_xasprintf("%s/" CK_RC_FILE, out_dir);
    /* What a worker that died left running on out_dir (its runsc checkpoint, which names a
     * path inside on its command line; the disk's send and compression ran in the worker and
     * died with it) finishes first. */
    for (int waited = 0; waited < wait_ms && wk__process_mentions(out_dir); waited += 50)
        usleep(50 * 1000);
    int st = wk__checkpoint_status(rc_path);
    free(rc_path);
    return st == 0 ? 1 : 0;
}

/* ---- kept disks: <sandboxes>/.kept-<sandbox>-<snapshot> ---- */

#define KEPT_PREFIX ".kept-"

static char *kept_path(const wk_host_t *h, const char *sbx, const char *snap)
{
    return sp_xasprintf("%s/" KEPT_PREFIX "%s-%s", h->sandboxes_dir, sbx, snap);
}

/* A kept disk's sandbox and snapshot ids, from its name; false for any other name. */
static bool kept_parse(const char *name, char sbx[SP_SANDBOX_ID_LEN + 1],
                       char snap[SP_SANDBOX_ID_LEN + 1])
{
    if (strncmp(name, KEPT_PREFIX, strlen(KEPT_PREFIX)) != 0)
        return false;
    const char *a = name + strlen(KEPT_PREFIX), *dash = strchr(a, '-');
    if (!dash || (size_t)(dash - a) > SP_SANDBOX_ID_LEN || strlen(dash + 1) > SP_SANDBOX_ID_LEN)
        return false;
    snprintf(sbx, SP_SANDBOX_ID_LEN + 1, "%.*s", (int)(dash - a), a);
    snprintf(snap, SP_SANDBOX_ID_LEN + 1, "%s", dash + 1);
    return sp_id_valid(sbx) && sp_id_valid(snap);
}

typedef struct {
    const char *sbx; /* drop this sandbox's kept disks, whatever keep says */
    wk_kept_keep_fn keep;
    void *ctx;
} kept_filter_t;

static size_t kept_drop(wk_host_t *h, const kept_filter_t *f)
{
    DIR *d = opendir(h->sandboxes_dir);
    size_t n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char sbx[SP_SANDBOX_ID_LEN + 1], snap[SP_SANDBOX_ID_LEN + 1];
        if (!kept_parse(e->d_name, sbx, snap))
            continue;
        char *p = kept_path(h, sbx, snap);
        int64_t made = 0;
        bool drop = f->sbx ? strcmp(sbx, f->sbx) == 0
                           : !f->keep || wk__subvol_made_s(p, &made) < 0 ||
                                 !f->keep(f->ctx, sbx, snap, (int64_t)time(NULL) - made);
        if (drop && wk__subvol_delete(p, NULL) == 0)
            n++;
        free(p);
    }
    if (d)
        closedir(d);
    return n;
}

size_t wk_host_kept_sweep(wk_host_t *h, wk_kept_keep_fn keep, void *ctx)
{
    kept_filter_t f = {.keep = keep, .ctx = ctx};
    return kept_drop(h, &f);
}

int wk_sandbox_checkpoint_finish(wk_host_t *h, const char *id, const char *tmpl,
                                 const char *out_dir, const char *keep_snap, wk_checkpoint_t *ret,
                                 char err[WK_ERR_MAX])
{
    if (!h || !id || !sp_id_valid(id) || !tmpl || !sp_id_valid(tmpl) || !out_dir ||
        (keep_snap && !sp_id_valid(keep_snap)))
        return wk__fail(err, -EINVAL, "invalid sandbox id, template or directory");
    memset(ret, 0, sizeof(*ret));
    int64_t t = wk__now_us();
    char hid[65];
    wk__host_id(h, id, hid);
    char *img = sp_xasprintf("%s/" CK_IMAGE_DIR, out_dir);
    /* Named after the sandbox, not its pool id: the name travels in the stream, and the
     * restore (anywhere) receives it as <sandbox>.ro. */
    char *ro = sp_xasprintf("%s/%s.ro", h->sandboxes_dir, id);
    char *rootfs = sp_xasprintf("%s/%s", h->sandboxes_dir, hid);
    char *parent = sp_xasprintf("%s/%s", h->templates_dir, tmpl);
    char *img_file = sp_xasprintf("%s/checkpoint.img", img);
    ret->image_path = sp_xasprintf("%s/checkpoint.img.zst", out_dir);
    ret->rootfs_path = sp_xasprintf("%s/rootfs.btrfs.zst", out_dir);
    /* The disk as a delta against the template: a read-only snapshot, sent with the template
     * as parent and compressed as it is sent. The sandbox is stopped: its disk is what the
     * image saw. The image is compressed meanwhile. */
    zstd_job_t zimg;
    zstd_job_start(&zimg, img_file, ret->image_path, false);
    (void)wk__subvol_delete(ro, NULL);
    int rc = wk__subvol_snapshot(rootfs, ro, true, err);
    int64_t t_send = wk__now_us(), t_keep = 0, t_join = 0;
    if (rc == 0)
        rc = wk__btrfs_send_zstd(ro, parent, ret->rootfs_path, WK_ZSTD_LEVEL, err);
    t_keep = wk__now_us();
    if (rc == 0 && keep_snap) {
        /* Sent: what the stream holds, here already, for a resume on this host. */
        kept_filter_t f = {.sbx = id};
        (void)kept_drop(h, &f);
        char *kept = kept_path(h, id, keep_snap);
        if (rename(ro, kept) < 0)
            sp_log(SP_LOG_WARN, "the suspended disk is not kept", SP_KS("sandbox", id),
                   SP_KS("error", strerror(errno)));
        free(kept);
    }
    (void)wk__subvol_delete(ro, NULL); /* not kept */
    t_join = wk__now_us();
    rc = zstd_job_join(&zimg, rc, err);
    ret->rootfs_ms = (uint32_t)ms_since(t);
    sp_log(SP_LOG_DEBUG, "checkpoint disk steps", SP_KS("sandbox", id),
           SP_KF("snapshot_ms", (double)(t_send - t) / 1000.0),
           SP_KF("send_zstd_ms", (double)(t_keep - t_send) / 1000.0),
           SP_KF("keep_ms", (double)(t_join - t_keep) / 1000.0),
           SP_KF("image_wait_ms", ms_since(t_join)));
    if (rc < 0) {
        free(ret->image_path);
        free(ret->rootfs_path);
        ret->image_path = ret->rootfs_path = NULL;
    } else {
        (void)wk__rm_rf(img); /* compressed: the raw image has served */
    }
    free(img_file);
    free(parent);
    free(rootfs);
    free(ro);
    free(img);
    return rc;
}

void wk_checkpoint_dispose(wk_checkpoint_t *c)
{
    (void)wk_checkpoint_container_gone(c);
    free(c->deleting);
    free(c->image_path);
    free(c->rootfs_path);
    memset(c, 0, sizeof(*c));
}

/* ---- the release after a checkpoint, in the background ---- */

struct wk_release {
    wk_host_t *h;
    char sandbox[65], hid[65]; /* hid: its host id when the release began */
    wk_checkpoint_t ck;
    struct wk_release *next;
};

static bool releasing_locked(const wk_host_t *h, const char *sandbox)
{
    for (const struct wk_release *r = h->releasing; r; r = r->next)
        if (strcmp(r->sandbox, sandbox) == 0)
            return true;
    return false;
}

/* Until no release of sandbox runs in the background. */
static void release_wait(wk_host_t *h, const char *sandbox)
{
    pthread_mutex_lock(&h->rel_lock);
    while (releasing_locked(h, sandbox))
        pthread_cond_wait(&h->rel_cond, &h->rel_lock);
    pthread_mutex_unlock(&h->rel_lock);
}

static void release_run(struct wk_release *r)
{
    wk_host_t *h = r->h;
    char err[WK_ERR_MAX] = "";
    if (destroy_as(h, r->sandbox, r->hid, wk_checkpoint_container_gone(&r->ck), err) < 0)
        sp_log(SP_LOG_ERROR, "cannot release a suspended sandbox", SP_KS("sandbox", r->sandbox),
               SP_KS("error", err));
    wk_checkpoint_dispose(&r->ck);
    pthread_mutex_lock(&h->rel_lock);
    for (struct wk_release **p = &h->releasing; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    pthread_cond_broadcast(&h->rel_cond);
    pthread_mutex_unlock(&h->rel_lock);
    free(r);
}

static void *release_main(void *arg)
{
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), DELETE_NICE);
    release_run(arg);
    return NULL;
}

int wk_sandbox_release_checkpointed(wk_host_t *h, const char *id, wk_checkpoint_t *ck,
                                    char err[WK_ERR_MAX])
{
    if (!h || !id || !sp_id_valid(id) || wk_pool_id_is(id) || !ck)
        return wk__fail(err, -EINVAL, "invalid sandbox id");
    release_wait(h, id); /* one at a time per sandbox: the list names each once */
    struct wk_release *r = sp_xcalloc(1, sizeof(*r));
    r->h = h;
    snprintf(r->sandbox, sizeof(r->sandbox), "%s", id);
    /* Resolved now: a restore under a new host id links id to that one once this has ended. */
    wk__host_id(h, id, r->hid);
    r->ck = *ck;
    memset(ck, 0, sizeof(*ck));
    pthread_mutex_lock(&h->rel_lock);
    r->next = h->releasing;
    h->releasing = r;
    pthread_mutex_unlock(&h->rel_lock);
    pthread_t th;
    if (pthread_create(&th, NULL, release_main, r) == 0)
        pthread_detach(th);
    else
        release_run(r); /* here and now */
    return 0;
}

void wk_sandbox_restore_host_id(wk_host_t *h, const char *id, char out[65])
{
    pthread_mutex_lock(&h->rel_lock);
    bool busy = releasing_locked(h, id);
    pthread_mutex_unlock(&h->rel_lock);
    if (busy)
        wk_pool_id_new(out);
    else
        snprintf(out, 65, "%s", id);
}

int wk_sandbox_restore(wk_host_t *h, const wk_sandbox_spec_t *spec, const char *image_zst,
                       const char *rootfs_zst, const char *work_dir, wk_sandbox_info_t *ret_info,
                       char err[WK_ERR_MAX])
{
    if (!h || !spec || !spec->id || !sp_id_valid(spec->id) || wk_pool_id_is(spec->id) ||
        !spec->template_ || !sp_id_valid(spec->template_) ||
        (spec->image_of && !sp_id_valid(spec->image_of)))
        return wk__fail(err, -EINVAL, "invalid sandbox id or template");
    if (spec->disk_mb > MAX_DISK_MB || spec->pids > MAX_PIDS)
        return wk__fail(err, -EINVAL, "disk_mb or pids out of range");
    if (spec->host_id && strcmp(spec->host_id, spec->id) != 0 && !wk_pool_id_is(spec->host_id))
        return wk__fail(err, -EINVAL, "invalid host id");
    const char *id = spec->id;
    /* Its resources' names: another id's while the release of this one's still runs. */
    const char *hid = spec->host_id ? spec->host_id : id;
    bool aliased = strcmp(hid, id) != 0;
    uint32_t disk_mb = spec->disk_mb ? spec->disk_mb : h->disk_mb_default;
    int64_t t0 = wk__now_us();
    char *bundle = sp_xasprintf("%s/%s", h->bundles_dir, hid);
    char *chan = sp_xasprintf("%s/%s", bundle, AGENT_CHAN_DIR);
    char *rootfs = sp_xasprintf("%s/%s", h->sandboxes_dir, hid);
    const char *of = spec->image_of ? spec->image_of : id;
    /* The stream makes <of>.ro: received into a directory of this restore's own, so that
     * restores of one snapshot under several ids at once do not meet. */
    char *recv_dir = sp_xasprintf("%s/.recv-%s", h->sandboxes_dir, hid);
    char *kept = spec->kept_snap && sp_id_valid(spec->kept_snap) && !spec->image_of
                     ? kept_path(h, id, spec->kept_snap)
                     : NULL;
    bool from_kept = kept && access(kept, F_OK) == 0;
    char *ro = sp_xasprintf("%s/%s.ro", recv_dir, of);
    char *img = sp_xasprintf("%s/image", work_dir);
    char *img_file = sp_xasprintf("%s/checkpoint.img", img);
    char *stream = sp_xasprintf("%s/rootfs.btrfs", work_dir);
    char netns[WK_NETNS_NAME_MAX];
    wk__netns_name(h, hid, netns);
    char *netns_path = sp_xasprintf("%s/%s", WK_NETNS_DIR, netns);
    char *link = aliased ? sp_xasprintf("%s/%s", h->bundles_dir, id) : NULL;
    wk_sandbox_info_t info;
    memset(&info, 0, sizeof(info));
    info.agent_to_fd = info.agent_from_fd = -1;
    bool marked = false;
    int rc;

    if (mkdir(bundle, 0700) < 0) {
        rc = wk__fail(err, -errno, "sandbox %s: %s", id,
                      errno == EEXIST ? "exists on this worker" : strerror(errno));
        goto out;
    }
    marked = true;
    if (mkdir(chan, 0700) < 0 || wk__mkdir_p(img, 0700) < 0) {
        rc = wk__fail(err, -errno, "mkdir %s: %s", chan, strerror(errno));
        goto out;
    }
    /* The disk: the delta received against this worker's template, then a writable snapshot
     * of what it made; or, on the host that suspended it, a writable snapshot of the disk it
     * kept (the same bytes: what the stream was sent from). */
    const char *recv[] = {"btrfs", "receive", "-q", "-f", stream, recv_dir, NULL};
    (void)wk__subvol_delete(ro, NULL);
    (void)rmdir(recv_dir);
    if (mkdir(recv_dir, 0700) < 0) {
        rc = wk__fail(err, -errno, "mkdir %s: %s", recv_dir, strerror(errno));
        goto out;
    }
    /* The image is decompressed while the disk is received and the network made. */
    zstd_job_t zimg;
    zstd_job_start(&zimg, image_zst, img_file, true);
    /* When each step began, for the debug log below. */
    int64_t t_unzip = wk__now_us(), t_recv = 0, t_snap = 0, t_net = 0;
    if (from_kept) {
        /* Kept by this host's suspend: the same bytes the stream would make. */
        t_recv = t_snap = t_unzip;
        rc = wk__subvol_snapshot(kept, rootfs, false, err);
        if (rc < 0) {
            sp_log(SP_LOG_WARN, "the kept disk did not serve: received from the snapshot",
                   SP_KS("sandbox", id), SP_KS("error", err));
            from_kept = false;
            t_snap = 0;
        }
    }
    if (!from_kept && (rc = wk__unzstd_file(rootfs_zst, stream, err)) == 0 &&
        (t_recv = wk__now_us(), rc = run_tool(recv, "btrfs receive", err)) == 0) {
        t_snap = wk__now_us();
        rc = wk__subvol_snapshot(ro, rootfs, false, err);
    }
    if (t_snap) {
        (void)wk__subvol_delete(from_kept ? kept : ro, NULL);
        (void)rmdir(recv_dir);
        /* The new subvolume's qgroup starts without a limit. With the received (or kept) one
         * deleted, what the sandbox wrote before its suspend counts as its own again. */
        if (rc >= 0 && !h->disk_quota_off)
            rc = wk__subvol_limit(rootfs, (uint64_t)disk_mb << 20, err);
    }
    if (rc == 0) {
        info.disk_mb = wk_sandbox_disk_mb(h, spec->disk_mb);
        info.disk_kept = from_kept;
        unlink(stream);
        t_net = wk__now_us();
        rc = wk__net_create(h, hid, info.address, err);
    }
    int64_t t_join = wk__now_us();
    if ((rc = zstd_job_join(&zimg, rc, err)) < 0)
        goto out;
    int64_t t_runsc = wk__now_us();
    wk__bundle_t bd = {.id = hid,
                       .hostname = id,
                       .rootfs = rootfs,
                       .netns_path = netns_path,
                       .vcpu = spec->vcpu,
                       .memory_mb = spec->memory_mb,
                       .pids = spec->pids ? spec->pids : h->pids_default,
                       .init = h->agent_path ? AGENT_GUEST_PATH : NULL,
                       .chan_dir = h->agent_path ? chan : NULL,
                       /* the image's processes keep what they had; the same spec as created */
                       .claimable = h->agent_path != NULL};
    if ((rc = wk__runsc_restore(h, &bd, bundle, img, err)) < 0)
        goto out;
    /* The map from id to its host id, as a pool claim's, once the old resources are gone (by
     * now, mostly: the release began before this restore). Atomic: from here on a restarted
     * worker finds the sandbox under id. */
    int64_t t_link = wk__now_us();
    if (aliased) {
        release_wait(h, id);
        if (symlink(hid, link) < 0) {
            rc = wk__fail(err, -errno, "link %s: %s", link, strerror(errno));
            goto out;
        }
    }
    info.create_ms = (uint32_t)((wk__now_us() - t0) / 1000);
    sp_log(SP_LOG_DEBUG, "restore steps", SP_KS("sandbox", id), SP_KS("host_id", hid),
           SP_KF("unzip_ms", (double)(t_recv - t_unzip) / 1000.0),
           SP_KF("receive_ms", (double)(t_snap - t_recv) / 1000.0),
           SP_KF("snapshot_limit_ms", (double)(t_net - t_snap) / 1000.0),
           SP_KF("net_ms", (double)(t_join - t_net) / 1000.0),
           SP_KF("image_wait_ms", (double)(t_runsc - t_join) / 1000.0),
           SP_KF("runsc_ms", (double)(t_link - t_runsc) / 1000.0),
           SP_KF("link_wait_ms", ms_since(t_link)), SP_KF("total_ms", ms_since(t0)),
           SP_KS("disk", from_kept ? "kept" : "received"));
    if (ret_info)
        *ret_info = info;
out:
    if (rc < 0 && marked)
        (void)wk_sandbox_destroy(h, hid, NULL);
    unlink(stream);
    (void)wk__rm_rf(img);
    (void)wk__subvol_delete(ro, NULL);
    (void)rmdir(recv_dir);
    free(recv_dir);
    free(kept);
    free(link);
    free(netns_path);
    free(stream);
    free(img_file);
    free(img);
    free(ro);
    free(rootfs);
    free(chan);
    free(bundle);
    return rc;
}
