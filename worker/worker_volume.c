/* btrfs volumes: the mount that holds templates and sandbox disks, and subvolume operations
 * through libbtrfsutil (snapshot ioctl ~7 ms where the `btrfs` command takes 20+ ms,
 * runtime-notes.md).
 *
 * Disk limits (docs/faults.md, "Limits"): quotas are enabled on the volume when it is opened,
 * and every sandbox's subvolume gets a qgroup limit on its EXCLUSIVE bytes, what it wrote
 * beyond the template it shares. A write past it fails with EDQUOT in that sandbox only
 * (gVisor's gofer passes the host's errno through). Quotas cost ~1.2 ms per snapshot here
 * (docs/machine-notes.md). */
#include <btrfsutil.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "error.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

/* mkfs.btrfs refuses devices smaller than about 114 MiB with the default profiles. */
#define MIN_IMAGE_BYTES (256ull << 20)

static int is_btrfs(const char *path)
{
    struct statfs sf;
    if (statfs(path, &sf) < 0)
        return -errno;
    return sf.f_type == BTRFS_SUPER_MAGIC;
}

/* libbtrfsutil reports its own code and leaves errno from the failing syscall. */
static int btrfs_fail(char *err, enum btrfs_util_error e, const char *what, const char *path)
{
    int rc = errno > 0 ? -errno : -EIO;
    if (e == BTRFS_UTIL_ERROR_NOT_BTRFS)
        rc = -ENOTSUP;
    return wk__fail(err, rc, "%s %s: %s (%s)", what, path, btrfs_util_strerror(e), strerror(-rc));
}

static int make_image(const char *image, uint64_t bytes, char err[WK_ERR_MAX])
{
    int rc = 0;
    char *tmp = sp_xasprintf("%s.tmp", image);
    char *mkfs = NULL;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = wk__fail(err, -errno, "create %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (ftruncate(fd, (off_t)bytes) < 0) {
        rc = wk__fail(err, -errno, "size %s: %s", tmp, strerror(errno));
        close(fd);
        goto out;
    }
    close(fd);
    rc = wk__find_program("mkfs.btrfs", &mkfs);
    if (rc < 0) {
        rc = wk__fail(err, rc, "mkfs.btrfs not found (Debian package btrfs-progs)");
        goto out;
    }
    char out[512];
    const char *argv[] = {mkfs, "-q", "-f", tmp, NULL};
    wk__cmd_t c = {.argv = argv,
                   .timeout_ms = 120000,
                   .out_mode = WK_OUT_BOTH,
                   .out = out,
                   .out_len = sizeof(out)};
    int ex = 0;
    rc = wk__run(&c, &ex);
    if (rc < 0 || ex != 0) {
        char line[160];
        wk__last_line(out, line, sizeof(line));
        rc = wk__fail(err, rc < 0 ? rc : -EIO, "mkfs.btrfs %s failed: %s", tmp,
                      rc < 0 ? sp_strerror(rc) : line);
        goto out;
    }
    /* Only a finished file system gets the final name: a crash above leaves a .tmp that the
     * next open overwrites. */
    if (rename(tmp, image) < 0)
        rc = wk__fail(err, -errno, "rename %s: %s", tmp, strerror(errno));
out:
    if (rc < 0)
        unlink(tmp);
    free(mkfs);
    free(tmp);
    return rc;
}

/* Idempotent: the kernel answers 0 when quotas are on already. On a volume with data the
 * kernel starts a rescan; limits apply meanwhile, usage numbers settle when it ends. */
static int quota_enable(const char *volume_dir, char err[WK_ERR_MAX])
{
    int fd = open(volume_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return wk__fail(err, -errno, "open %s: %s", volume_dir, strerror(errno));
    struct btrfs_ioctl_quota_ctl_args a;
    memset(&a, 0, sizeof(a));
    a.cmd = BTRFS_QUOTA_CTL_ENABLE;
    int rc = ioctl(fd, BTRFS_IOC_QUOTA_CTL, &a) < 0 ? -errno : 0;
    close(fd);
    if (rc < 0)
        return wk__fail(err, rc, "enable btrfs quotas on %s (sandbox disk limits): %s", volume_dir,
                        strerror(-rc));
    return 0;
}

/* ---- stale qgroups ---- */

/* Whether the root tree still has subvolume id (live, or deleted and not yet dropped by the
 * cleaner): 1, 0, or -errno. */
static int root_exists(int fd, uint64_t id)
{
    struct btrfs_ioctl_search_args a;
    memset(&a, 0, sizeof(a));
    a.key.tree_id = BTRFS_ROOT_TREE_OBJECTID;
    a.key.min_objectid = a.key.max_objectid = id;
    a.key.min_type = a.key.max_type = BTRFS_ROOT_ITEM_KEY;
    a.key.max_offset = UINT64_MAX;
    a.key.max_transid = UINT64_MAX;
    a.key.nr_items = 1;
    if (ioctl(fd, BTRFS_IOC_TREE_SEARCH, &a) < 0)
        return -errno;
    return a.key.nr_items > 0;
}

/* The level-0 qgroups of subvolumes (ids >= 256; 0/5 is the top level) whose subvolume is
 * gone, at most max into ids. Their count, or -errno (-ENOENT: quotas are off). */
static int stale_qgroups(int fd, uint64_t *ids, size_t max)
{
    struct btrfs_ioctl_search_args a;
    memset(&a, 0, sizeof(a));
    a.key.tree_id = BTRFS_QUOTA_TREE_OBJECTID;
    a.key.min_type = a.key.max_type = BTRFS_QGROUP_INFO_KEY;
    a.key.min_offset = BTRFS_FIRST_FREE_OBJECTID;
    a.key.max_offset = (1ULL << 48) - 1; /* level 0: the level is the id's top 16 bits */
    a.key.max_transid = UINT64_MAX;
    size_t n = 0;
    for (;;) {
        a.key.nr_items = 512;
        if (ioctl(fd, BTRFS_IOC_TREE_SEARCH, &a) < 0)
            return -errno;
        if (a.key.nr_items == 0)
            break;
        size_t off = 0;
        uint64_t last = 0;
        for (uint32_t i = 0; i < a.key.nr_items; i++) {
            struct btrfs_ioctl_search_header h;
            memcpy(&h, a.buf + off, sizeof(h));
            off += sizeof(h) + h.len;
            last = h.offset;
            if (h.type != BTRFS_QGROUP_INFO_KEY)
                continue;
            int r = root_exists(fd, h.offset);
            if (r < 0)
                return r;
            if (r == 0 && n < max)
                ids[n++] = h.offset;
        }
        if (last == UINT64_MAX || last >= a.key.max_offset)
            break;
        a.key.min_offset = last + 1;
    }
    return (int)n;
}

static int qgroup_destroy(int fd, uint64_t id)
{
    struct btrfs_ioctl_qgroup_create_args a = {.create = 0, .qgroupid = id};
    return ioctl(fd, BTRFS_IOC_QGROUP_CREATE, &a) < 0 ? -errno : 0;
}

#define STALE_MAX 4096 /* per sweep; the next one takes the rest */

int wk__qgroup_sweep(const char *volume_dir, bool rescan, unsigned *ret_removed, unsigned *ret_left,
                     char err[WK_ERR_MAX])
{
    *ret_removed = *ret_left = 0;
    int fd = open(volume_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return wk__fail(err, -errno, "open %s: %s", volume_dir, strerror(errno));
    uint64_t *ids = sp_xcalloc(STALE_MAX, sizeof(*ids));
    int rc = 0;
    for (int round = 0; round < 2; round++) {
        int n = stale_qgroups(fd, ids, STALE_MAX);
        if (n == -ENOENT) { /* no quota tree: quotas are off */
            n = 0;
        } else if (n < 0) {
            rc = wk__fail(err, n, "list qgroups of %s: %s", volume_dir, strerror(-n));
            break;
        }
        unsigned busy = 0;
        for (int i = 0; i < n; i++) {
            int r = qgroup_destroy(fd, ids[i]);
            if (r == 0 || r == -ENOENT)
                (*ret_removed)++;
            else
                busy++;
        }
        *ret_left = busy;
        if (busy == 0 || !rescan || round == 1)
            break;
        /* Usage the kernel left on them (it does not account a dropped subtree past its
         * drop_subtree_threshold): a rescan recounts, then they go. */
        struct btrfs_ioctl_quota_rescan_args ra;
        memset(&ra, 0, sizeof(ra));
        if (ioctl(fd, BTRFS_IOC_QUOTA_RESCAN, &ra) < 0 && errno != EINPROGRESS) {
            rc = wk__fail(err, -errno, "rescan qgroups of %s: %s", volume_dir, strerror(errno));
            break;
        }
        while (ioctl(fd, BTRFS_IOC_QUOTA_RESCAN_WAIT) < 0 && errno == EINTR)
            ;
    }
    free(ids);
    close(fd);
    return rc;
}

int wk__volume_free(const char *volume_dir, uint64_t *ret_bytes)
{
    struct statvfs sv;
    if (statvfs(volume_dir, &sv) < 0)
        return -errno;
    *ret_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
    return 0;
}

int wk__volume_size(const char *volume_dir, uint64_t *ret_bytes)
{
    struct statvfs sv;
    if (statvfs(volume_dir, &sv) < 0)
        return -errno;
    *ret_bytes = (uint64_t)sv.f_blocks * sv.f_frsize;
    return 0;
}

int wk__subvol_usage(const char *path, uint64_t *ret_exclusive, uint64_t *ret_referenced)
{
    uint64_t id = 0;
    if (btrfs_util_subvolume_id(path, &id) != BTRFS_UTIL_OK)
        return errno ? -errno : -EINVAL;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* The level-0 qgroup's info item (0/<id>): one item, found by its key. */
    struct btrfs_ioctl_search_args a;
    memset(&a, 0, sizeof(a));
    a.key.tree_id = BTRFS_QUOTA_TREE_OBJECTID;
    a.key.min_type = a.key.max_type = BTRFS_QGROUP_INFO_KEY;
    a.key.min_offset = a.key.max_offset = id;
    a.key.max_transid = UINT64_MAX;
    a.key.nr_items = 1;
    int rc = ioctl(fd, BTRFS_IOC_TREE_SEARCH, &a) < 0 ? -errno : 0;
    close(fd);
    if (rc < 0)
        return rc; /* -ENOENT: quotas are off */
    struct btrfs_ioctl_search_header hd;
    struct btrfs_qgroup_info_item info;
    if (a.key.nr_items < 1)
        return -ENOENT;
    memcpy(&hd, a.buf, sizeof(hd));
    if (hd.type != BTRFS_QGROUP_INFO_KEY || hd.offset != id || hd.len < sizeof(info))
        return -ENOENT;
    memcpy(&info, a.buf + sizeof(hd), sizeof(info));
    *ret_exclusive = le64toh(info.excl);
    *ret_referenced = le64toh(info.rfer);
    return 0;
}

int wk__subvol_max_exclusive(const char *path, uint64_t *ret_max)
{
    uint64_t id = 0;
    if (btrfs_util_subvolume_id(path, &id) != BTRFS_UTIL_OK)
        return errno ? -errno : -EINVAL;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* The level-0 qgroup's limit item (0/<id>), found by its key as the info item is. */
    struct btrfs_ioctl_search_args a;
    memset(&a, 0, sizeof(a));
    a.key.tree_id = BTRFS_QUOTA_TREE_OBJECTID;
    a.key.min_type = a.key.max_type = BTRFS_QGROUP_LIMIT_KEY;
    a.key.min_offset = a.key.max_offset = id;
    a.key.max_transid = UINT64_MAX;
    a.key.nr_items = 1;
    int rc = ioctl(fd, BTRFS_IOC_TREE_SEARCH, &a) < 0 ? -errno : 0;
    close(fd);
    if (rc < 0)
        return rc;
    struct btrfs_ioctl_search_header hd;
    struct btrfs_qgroup_limit_item lim;
    if (a.key.nr_items < 1)
        return -ENOENT;
    memcpy(&hd, a.buf, sizeof(hd));
    if (hd.type != BTRFS_QGROUP_LIMIT_KEY || hd.offset != id || hd.len < sizeof(lim))
        return -ENOENT;
    memcpy(&lim, a.buf + sizeof(hd), sizeof(lim));
    if (!(le64toh(lim.flags) & BTRFS_QGROUP_LIMIT_MAX_EXCL) || !le64toh(lim.max_excl))
        return -ENOENT;
    *ret_max = le64toh(lim.max_excl);
    return 0;
}

int wk__subvol_limit(const char *path, uint64_t max_exclusive, char err[WK_ERR_MAX])
{
    uint64_t id = 0;
    errno = 0;
    enum btrfs_util_error e = btrfs_util_subvolume_id(path, &id);
    if (e != BTRFS_UTIL_OK)
        return btrfs_fail(err, e, "subvolume id of", path);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return wk__fail(err, -errno, "open %s: %s", path, strerror(errno));
    /* Level-0 qgroup 0/<id>, made by the kernel with the subvolume. */
    struct btrfs_ioctl_qgroup_limit_args a;
    memset(&a, 0, sizeof(a));
    a.qgroupid = id;
    a.lim.flags = BTRFS_QGROUP_LIMIT_MAX_EXCL;
    a.lim.max_excl = max_exclusive;
    int rc = ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &a) < 0 ? -errno : 0;
    close(fd);
    if (rc < 0)
        return wk__fail(err, rc, "limit the disk of %s: %s", path, strerror(-rc));
    return 0;
}

int wk__volume_open(const wk_host_config_t *cfg, char err[WK_ERR_MAX])
{
    int rc = wk__mkdir_p(cfg->volume_dir, 0755);
    if (rc < 0)
        return wk__fail(err, rc, "mkdir %s: %s", cfg->volume_dir, strerror(-rc));
    rc = is_btrfs(cfg->volume_dir);
    if (rc < 0)
        return wk__fail(err, rc, "statfs %s: %s", cfg->volume_dir, strerror(-rc));
    if (rc == 1) /* btrfs already, or our image mounted by an earlier run */
        return cfg->disk_quota_off ? 0 : quota_enable(cfg->volume_dir, err);

    if (cfg->image_bytes < MIN_IMAGE_BYTES)
        return wk__fail(err, SP_ECONFIG, "image_bytes %llu below %llu",
                        (unsigned long long)cfg->image_bytes, MIN_IMAGE_BYTES);
    char *image = sp_xasprintf("%s/volumes.img", cfg->state_dir);
    char *mountp = NULL;
    if (access(image, F_OK) < 0) {
        rc = make_image(image, cfg->image_bytes, err);
        if (rc < 0)
            goto out;
    }
    rc = wk__find_program("mount", &mountp);
    if (rc < 0) {
        rc = wk__fail(err, rc, "mount not found");
        goto out;
    }
    /* util-linux sets up the loop device with autoclear: umount releases it. */
    char out[512];
    const char *argv[] = {mountp, "-t", "btrfs", "-o", "loop", image, cfg->volume_dir, NULL};
    wk__cmd_t c = {.argv = argv,
                   .timeout_ms = 60000,
                   .out_mode = WK_OUT_BOTH,
                   .out = out,
                   .out_len = sizeof(out)};
    int ex = 0;
    rc = wk__run(&c, &ex);
    if (rc < 0 || ex != 0) {
        char line[160];
        wk__last_line(out, line, sizeof(line));
        rc = wk__fail(err, rc < 0 ? rc : -EIO, "mount %s: %s", image,
                      rc < 0 ? sp_strerror(rc) : line);
        goto out;
    }
    rc = is_btrfs(cfg->volume_dir);
    if (rc != 1)
        rc = wk__fail(err, -EIO, "%s is not btrfs after mounting %s", cfg->volume_dir, image);
    else
        rc = cfg->disk_quota_off ? 0 : quota_enable(cfg->volume_dir, err);
out:
    free(mountp);
    free(image);
    return rc;
}

int wk__subvol_create(const char *path, char err[WK_ERR_MAX])
{
    errno = 0;
    enum btrfs_util_error e = btrfs_util_create_subvolume(path, 0, NULL, NULL);
    if (e != BTRFS_UTIL_OK)
        return btrfs_fail(err, e, "create subvolume", path);
    return 0;
}

int wk__subvol_snapshot(const char *src, const char *dst, bool read_only, char err[WK_ERR_MAX])
{
    errno = 0;
    enum btrfs_util_error e = btrfs_util_create_snapshot(
        src, dst, read_only ? BTRFS_UTIL_CREATE_SNAPSHOT_READ_ONLY : 0, NULL, NULL);
    if (e != BTRFS_UTIL_OK)
        return btrfs_fail(err, e, "snapshot to", dst);
    return 0;
}

int wk__subvol_made_s(const char *path, int64_t *ret_s)
{
    struct btrfs_util_subvolume_info info;
    errno = 0;
    if (btrfs_util_subvolume_info(path, 0, &info) != BTRFS_UTIL_OK)
        return errno ? -errno : -EINVAL;
    *ret_s = (int64_t)info.otime.tv_sec;
    return 0;
}

int wk__subvol_delete(const char *path, char err[WK_ERR_MAX])
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : wk__fail(err, -errno, "stat %s: %m", path);
    errno = 0;
    enum btrfs_util_error e = btrfs_util_delete_subvolume(path, 0);
    if (e == BTRFS_UTIL_ERROR_NOT_SUBVOLUME) {
        /* A plain directory left where a subvolume was meant to be (a crash between mkdir
         * and the ioctl cannot happen, but an operator's cp -r can). */
        int rc = wk__rm_rf(path);
        return rc < 0 ? wk__fail(err, rc, "remove %s: %s", path, strerror(-rc)) : 0;
    }
    if (e != BTRFS_UTIL_OK)
        return errno == ENOENT ? 0 : btrfs_fail(err, e, "delete subvolume", path);
    return 0;
}

int wk__subvol_is(const char *path, bool *ret_read_only)
{
    errno = 0;
    enum btrfs_util_error e = btrfs_util_is_subvolume(path);
    if (e == BTRFS_UTIL_ERROR_NOT_SUBVOLUME || e == BTRFS_UTIL_ERROR_NOT_BTRFS)
        return 0;
    if (e != BTRFS_UTIL_OK)
        return errno == ENOENT ? 0 : (errno > 0 ? -errno : -EIO);
    if (ret_read_only) {
        bool ro = false;
        e = btrfs_util_get_subvolume_read_only(path, &ro);
        if (e != BTRFS_UTIL_OK)
            return errno > 0 ? -errno : -EIO;
        *ret_read_only = ro;
    }
    return 1;
}

int wk__subvol_received_uuid(const char *path, uint8_t ret_uuid[16])
{
    struct btrfs_util_subvolume_info info;
    errno = 0;
    enum btrfs_util_error e = btrfs_util_subvolume_info(path, 0, &info);
    if (e != BTRFS_UTIL_OK)
        return errno > 0 ? -errno : -EIO;
    memcpy(ret_uuid, info.received_uuid, 16);
    return 0;
}

int wk__subvol_seal(const char *path, const uint8_t uuid[16], char err[WK_ERR_MAX])
{
    /* The kernel takes a received UUID only on a writable subvolume (EROFS otherwise), and a
     * snapshot does not inherit it: set it on the final subvolume, then make that read-only. */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return wk__fail(err, -errno, "open %s: %m", path);
    struct btrfs_ioctl_received_subvol_args a;
    memset(&a, 0, sizeof(a));
    memcpy(a.uuid, uuid, 16);
    a.stransid = 1;
    int rc = ioctl(fd, BTRFS_IOC_SET_RECEIVED_SUBVOL, &a) < 0 ? -errno : 0;
    close(fd);
    if (rc < 0)
        return wk__fail(err, rc, "set the received UUID of %s: %s", path, strerror(-rc));
    errno = 0;
    enum btrfs_util_error e = btrfs_util_set_subvolume_read_only(path, true);
    if (e != BTRFS_UTIL_OK)
        return btrfs_fail(err, e, "make read-only", path);
    return 0;
}
