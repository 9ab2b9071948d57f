/* Internals shared by the files that implement worker_runtime.h (worker_*.c). Not a contract
 * for anyone else: the worker daemon includes worker_runtime.h only.
 *
 * Naming of host resources (all derived from the worker id, so two workers on one host never
 * touch each other's, and from the sandbox id, so every resource maps back to its sandbox):
 *   tag      8 hex chars of SHA-256(worker_id "\n" state_dir), recorded with the id and the
 *            volume_dir in <state_dir>/identities before anything is made (wk_host_identities)
 *   netns    /run/netns/sp-<tag>-<id>
 *   veth     spv<tag[0..4)><8 hex of SHA-256(id)> (IFNAMSIZ-1 = 15 chars), peer "eth0" in the
 *            netns; its ifalias is "space <worker_id> <id>"
 *   cgroups  /sys/fs/cgroup/<controller>/space-<tag>/<id> (linux.cgroupsPath)
 *   runsc    --root=<state_dir>/runsc, container id = sandbox id
 *   disk     <volume_dir>/sandboxes/<id>, templates in <volume_dir>/templates/<name>
 *   bundle   <state_dir>/bundles/<id>: made first and removed last, so it marks an id in use
 *
 * A warm-pool sandbox (docs/pools.md) is made under a pool id (WK_POOL_PREFIX + 26 random
 * chars), and every resource above keeps that name for its whole life: runsc cannot rename a
 * container. Its claim adds <state_dir>/bundles/<sandbox id> as a symlink to the pool id: the
 * persisted map from the API's id to the host's, which every entry point of worker_runtime.h
 * resolves first (wk__host_id), and which wk_host_scan reads backwards. A restore begun while
 * the same sandbox's release after its suspend still runs (wk_sandbox_restore_host_id) is
 * made under such an id too, and linked the same way once that release has ended: an id of
 * this form without its link is never a live sandbox (a restarted worker releases it).
 */
#ifndef SPACE_WORKER_RUNTIME_INT_H
#define SPACE_WORKER_RUNTIME_INT_H

#include <net/if.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker_runtime.h"

#define WK_TAG_LEN        8
#define WK_NETNS_DIR      "/run/netns"
#define WK_NETNS_NAME_MAX 96
#define WK_NFT_NAME_MAX   32
#define WK_CGROUP_ROOT    "/sys/fs/cgroup"
/* The host memory cgroup's headroom above memory_mb: a quarter, within these (bytes). */
#define WK_MEMORY_HEADROOM_MIN (64ULL << 20)
#define WK_MEMORY_HEADROOM_MAX (2ULL << 30)
#define WK_RUNSC_TIMEOUT_MS    30000
/* debootstrap of "base" downloads ~100 MB; allow a slow mirror. */
#define WK_TEMPLATE_TIMEOUT_MS (30 * 60 * 1000)
#ifndef WK_TEMPLATES_DIR
#define WK_TEMPLATES_DIR "/usr/share/space/worker/templates" /* template definitions */
#endif

struct wk_host {
    char *worker_id;
    char *state_dir;
    char *volume_dir;
    char *runsc; /* absolute path, resolved at open */
    char *platform;
    uint8_t net_a, net_b; /* net_prefix */
    char tag[WK_TAG_LEN + 1];
    char *runsc_root;
    char *bundles_dir;
    char *templates_dir;
    char *sandboxes_dir;
    char *agent_path;                            /* NULL: placeholder init, no agent channel */
    uint16_t egress_proxy_port, egress_dns_port; /* 0: TCP / DNS dropped, not redirected */
    char *ca_pem; /* the deployment CA certificate put into every sandbox; NULL: none */
    uint32_t disk_mb_default, disk_reserve_mb, pids_default;
    bool disk_quota_off;
    char *template_defs;  /* where <name>.sh template definitions are */
    char *template_cache; /* NULL: no cache */
    const atomic_int *cancel;
    sp_metric_t *runsc_seconds; /* NULL: runsc calls are not timed */

    /* Held from the address dump until the host side of the new veth has its address, so two
     * creates never pick the same /30. */
    pthread_mutex_t pool_lock;
    /* Guards building[]: names of templates being built; waiters sleep on tmpl_cond. */
    pthread_mutex_t tmpl_lock;
    pthread_cond_t tmpl_cond;
    char **building;
    size_t n_building;
    /* Releases after a checkpoint running in the background (wk_sandbox_release_checkpointed),
     * under rel_lock; rel_cond is signalled as each ends. */
    pthread_mutex_t rel_lock;
    pthread_cond_t rel_cond;
    struct wk_release *releasing;
};

/* The id the host's resources of sandbox id carry (out, 65 bytes): the pool id its
 * bundles/<id> symlink names when it was claimed from a warm pool, else id itself. */
void wk__host_id(const wk_host_t *h, const char *id, char out[65]);

/* Error text into err (WK_ERR_MAX), printf-style; returns rc so callers can
 * `return wk__fail(err, rc, ...)`. err may be NULL. */
int wk__fail(char *err, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int64_t wk__now_us(void);

/* ---- streams: zstd and btrfs send in-process (worker_stream.c) ---- */

/* The level of a suspend's artifacts (`zstd -1`'s). */
#define WK_ZSTD_LEVEL 1
/* in_path compressed into out_path (made 0600, replaced; removed on failure), frames as the
 * zstd tool's (content checksum on). */
int wk__zstd_file(const char *in_path, const char *out_path, int level, char err[WK_ERR_MAX]);
/* zstd frames in in_path decompressed into out_path (made as wk__zstd_file makes it). A
 * truncated, corrupt or empty input is -EBADMSG. */
int wk__unzstd_file(const char *in_path, const char *out_path, char err[WK_ERR_MAX]);
/* `btrfs send -p parent subvol | zstd -<level> > out_path` without either tool: the kernel's
 * send ioctl writes into a pipe that a thread of this process compresses as it reads. subvol
 * and parent are read-only subvolumes of one filesystem. */
int wk__btrfs_send_zstd(const char *subvol, const char *parent, const char *out_path, int level,
                        char err[WK_ERR_MAX]);

/* ---- the deployment CA in sandboxes (worker_trust.c) ---- */

#define WK_TRUST_CA     "/etc/ssl/certs/space-deployment-ca.pem"
#define WK_TRUST_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
#define WK_TRUST_ENV_N  3
/* "SSL_CERT_FILE=...", "REQUESTS_CA_BUNDLE=...", "NODE_EXTRA_CA_CERTS=..." */
extern const char *const wk__trust_env[WK_TRUST_ENV_N];
/* Reads a PEM file of certificates only (anything else in it, a key above all, is refused);
 * *ret_pem is heap text. */
int wk__trust_load(const char *path, char **ret_pem, char err[WK_ERR_MAX]);
/* Writes the CA into the rootfs (the trust store files, profile.d); a no-op without ca_pem. */
int wk__trust_install(const wk_host_t *h, const char *rootfs, char err[WK_ERR_MAX]);

/* ---- the resolver in sandboxes (worker_resolv.c) ---- */

/* Whether resolv.conf text names a nameserver (a line "nameserver <address>", as glibc and musl
 * read it). */
bool wk__resolv_has_nameserver(const char *text, size_t len);
/* At create: writes "nameserver <gateway_be>" as the rootfs's /etc/resolv.conf when the
 * template names no nameserver (the file missing, without such a line, or a link; the
 * template's other lines are kept). Everything relative to the rootfs, no link followed.
 * 1 when written, 0 when left alone (the template has its own nameserver, or /etc or the file
 * is not something to rewrite: a link, a directory, over 64 KiB), < 0 on error. */
int wk__resolv_install(const char *rootfs, uint32_t gateway_be, char err[WK_ERR_MAX]);

/* ---- processes (worker_spawn.c) ---- */

typedef enum {
    WK_OUT_NULL = 0, /* stdout and stderr to /dev/null */
    WK_OUT_STDOUT,   /* capture stdout, stderr to /dev/null */
    WK_OUT_STDERR,   /* capture stderr, stdout to /dev/null */
    WK_OUT_BOTH,     /* capture stdout and stderr into one stream */
    WK_OUT_FD,       /* stdout and stderr to out_fd */
} wk_out_mode_t;

typedef struct {
    const char *const *argv; /* argv[0] is an absolute path */
    int timeout_ms;          /* the child's process group is SIGKILLed after this */
    /* Also killed (within a second) once *cancel is nonzero, -ECANCELED (NULL: never). */
    const atomic_int *cancel;
    /* Run in a private mount namespace with a tmpfs on /proc/sys/net (runtime-notes.md: this
     * runsc takes any netns for the root one on new kernels and refuses to start). */
    bool netns_wrapper;
    /* Run the command under a detached reaper process that is a child subreaper and lives
     * until every process the command left behind has exited (for `runsc create`, whose
     * sandbox and gofer outlive it). Without it they are orphaned to PID 1, and `runsc delete`
     * waits until PID 1 reaps the killed sandbox: about a second on hosts whose init reaps
     * lazily (this project's VMs), milliseconds with the reaper. */
    bool reaper;
    wk_out_mode_t out_mode;
    int out_fd; /* WK_OUT_FD */
    /* The command's stdin and stdout are stdin_fd and stdout_fd (borrowed; dup2'd in the
     * child only) instead of /dev/null: `runsc create` hands them to the container's init,
     * the agent channel. out_mode must then be WK_OUT_STDERR or WK_OUT_NULL (for stderr). */
    bool pass_stdio;
    int stdin_fd, stdout_fd;
    char *out;      /* WK_OUT_STD*, WK_OUT_BOTH: first out_len - 1 bytes, NUL-terminated */
    size_t out_len; /* the rest is read and dropped */
} wk__cmd_t;

/* Runs the command to completion. 0 and *ret_exit (exit status, or 128 + signal) when it ran;
 * SP_ETIMEOUT when it was killed for its timeout; negative errno when it could not start.
 * Only the child's own exit is awaited: a grandchild holding the capture pipe (runsc keeps
 * the container's stdio) does not block the caller. */
int wk__run(const wk__cmd_t *c, int *ret_exit);
/* Looks name up in $PATH (or takes it as is when it has a '/'); heap path in *ret_path. */
int wk__find_program(const char *name, char **ret_path);
/* Runs a host tool (argv[0] looked up in PATH) for at most timeout_ms: 0 when it exited 0,
 * else < 0 with what failed, its exit and the last line it printed in err. */
int wk__run_tool(const char *const *argv, const char *what, int timeout_ms, char err[WK_ERR_MAX]);
/* Whether a process on the host has an argument containing needle (/proc/<pid>/cmdline). */
bool wk__process_mentions(const char *needle);

/* ---- files (worker_runtime.c) ---- */

int wk__mkdir_p(const char *path, mode_t mode);
/* Removes a directory tree without crossing mount points; a missing path is success. */
int wk__rm_rf(const char *path);
/* Last non-empty line of text, without its newline, into out (for error reasons). */
void wk__last_line(const char *text, char *out, size_t out_len);

/* ---- btrfs (worker_volume.c) ---- */

/* Makes volume_dir a btrfs mount: as it is, or by loop-mounting state_dir/volumes.img (made
 * sparse with mkfs.btrfs if missing). Idempotent. */
/* Mounts the volume if needed and enables btrfs quotas on it (sandbox disk limits). */
int wk__volume_open(const wk_host_config_t *cfg, char err[WK_ERR_MAX]);
/* Bytes an unprivileged writer could still allocate on the volume (statvfs f_bavail), and
 * the volume's size. */
int wk__volume_free(const char *volume_dir, uint64_t *ret_bytes);
/* Destroys the stale qgroups of volume_dir: level-0 qgroups whose subvolume is gone (each
 * deleted sandbox leaves one; the kernel removes it itself once the cleaner dropped the
 * subvolume and its numbers reached zero, not when they did not). rescan: those the kernel
 * refuses (usage left on them) are recounted by a quota rescan, waited for, and destroyed then.
 * How many went and how many are left. */
int wk__qgroup_sweep(const char *volume_dir, bool rescan, unsigned *ret_removed, unsigned *ret_left,
                     char err[WK_ERR_MAX]);
int wk__volume_size(const char *volume_dir, uint64_t *ret_bytes);
/* What the subvolume at path holds by its level-0 qgroup: exclusive bytes (what it wrote,
 * what the disk limit counts) and referenced bytes (its template's shared extents too). As of
 * btrfs's last transaction commit. -ENOENT when quotas are off. */
int wk__subvol_usage(const char *path, uint64_t *ret_exclusive, uint64_t *ret_referenced);
/* Limits what the subvolume at path may hold beyond what it shares with others (its qgroup's
 * exclusive bytes): writes past it fail with EDQUOT. */
int wk__subvol_limit(const char *path, uint64_t max_exclusive, char err[WK_ERR_MAX]);
/* The exclusive-bytes limit wk__subvol_limit set; -ENOENT when none (or quotas are off). */
int wk__subvol_max_exclusive(const char *path, uint64_t *ret_max);
int wk__subvol_create(const char *path, char err[WK_ERR_MAX]);
int wk__subvol_snapshot(const char *src, const char *dst, bool read_only, char err[WK_ERR_MAX]);
/* A missing path is success. */
int wk__subvol_delete(const char *path, char err[WK_ERR_MAX]);
/* When the subvolume (or snapshot) at path was made, in seconds since the epoch. */
int wk__subvol_made_s(const char *path, int64_t *ret_s);
/* 1 if path is a subvolume (and *ret_read_only says whether it is read-only, when non-NULL),
 * 0 if it is missing or a plain directory, < 0 on error. */
int wk__subvol_is(const char *path, bool *ret_read_only);
/* The subvolume's received UUID (all zero when it was never set). */
int wk__subvol_received_uuid(const char *path, uint8_t ret_uuid[16]);
/* Makes the writable subvolume path look received from a subvolume with identity uuid, then
 * read-only. A delta sent with it as parent (btrfs send -p) names uuid as the parent, and
 * `btrfs receive` on any host finds the local subvolume carrying the same received UUID. */
int wk__subvol_seal(const char *path, const uint8_t uuid[16], char err[WK_ERR_MAX]);

/* ---- network (worker_net.c) ---- */

/* Makes /run/netns exist and a shared mount point, as `ip netns add` does. */
int wk__net_prepare(void);
void wk__netns_name(const wk_host_t *h, const char *id, char out[WK_NETNS_NAME_MAX]);
void wk__veth_name(const wk_host_t *h, const char *id, char out[IFNAMSIZ]);
/* netns + veth + /30 (host .1, sandbox .2, default route via .1, lo up). On failure
 * whatever it made is removed. */
int wk__net_create(wk_host_t *h, const char *id, char ret_addr[16], char err[WK_ERR_MAX]);
/* Removes the veth and the netns; what is already gone is success. */
int wk__net_destroy(wk_host_t *h, const char *id, char err[WK_ERR_MAX]);

/* Re-adds the firewall element of a sandbox whose veth exists (an adopted sandbox after a
 * worker restart); idempotent. */
/* The sandbox's address (network order), from its veth's host end. */
int wk__net_address(wk_host_t *h, const char *id, uint32_t *ret_guest_be, char err[WK_ERR_MAX]);
int wk__net_restore(wk_host_t *h, const char *id, char err[WK_ERR_MAX]);

/* ---- nftables (worker_nft.c) ---- */

/* "space_<tag>": the worker's table in family inet. */
void wk__nft_table_name(const wk_host_t *h, char out[WK_NFT_NAME_MAX]);
/* Creates the table, its set and chains if missing and replaces the chains' rules, in one
 * transaction; the set's elements (live sandboxes) are kept. Idempotent. */
int wk__nft_setup(wk_host_t *h, char err[WK_ERR_MAX]);
/* One sandbox's element (host veth name, sandbox address): what lets its packets through the
 * anti-spoofing rule. Add is idempotent; delete of a missing element is success. */
int wk__nft_sandbox_add(wk_host_t *h, const char *veth, uint32_t addr_be, char err[WK_ERR_MAX]);
int wk__nft_sandbox_del(wk_host_t *h, const char *veth, uint32_t addr_be, char err[WK_ERR_MAX]);
/* Deletes every element whose veth is this one (when its address is no longer known). */
int wk__nft_sandbox_del_veth(wk_host_t *h, const char *veth, char err[WK_ERR_MAX]);
/* Deletes the table (space down --purge). A missing table is success. */
int wk__nft_teardown(wk_host_t *h, char err[WK_ERR_MAX]);

/* ---- runsc (worker_runsc.c) ---- */

typedef struct {
    const char *id;       /* the container's: the host id */
    const char *hostname; /* NULL: id */
    const char *rootfs;
    const char *netns_path;
    uint32_t vcpu;
    uint32_t memory_mb;
    uint32_t pids;        /* RLIMIT_NPROC of the init, inherited by every guest process */
    const char *init;     /* path of the init inside the sandbox; NULL: the placeholder */
    const char *chan_dir; /* host directory mounted read-only at /.space/chan, or NULL */
    bool claimable;       /* its init (the agent) gets CAP_SYS_ADMIN, to set hostnames */
    bool cpu_unlimited;   /* no CPU quota in the spec (wk__runsc_restore sets it afterwards) */
} wk__bundle_t;

/* Writes <bundle_dir>/config.json (OCI runtime spec). */
int wk__runsc_write_config(const wk_host_t *h, const wk__bundle_t *b, const char *bundle_dir,
                           char err[WK_ERR_MAX]);
/* stdin_fd and stdout_fd (borrowed) become the init's stdin and stdout; -1: /dev/null. */
int wk__runsc_create(const wk_host_t *h, const char *id, const char *bundle_dir, int stdin_fd,
                     int stdout_fd, char err[WK_ERR_MAX]);
int wk__runsc_start(const wk_host_t *h, const char *id, char err[WK_ERR_MAX]);
/* runsc <verb> [--image-path=image_dir] id: pause, resume, checkpoint (image_dir set). */
/* runsc checkpoint into image_dir, with runsc's exit status written to rc_path when it ends
 * (even if the caller is gone by then). */
int wk__runsc_checkpoint(const wk_host_t *h, const char *id, const char *image_dir,
                         const char *rc_path, char err[WK_ERR_MAX]);
/* The exit status in rc_path (>= 0), or -ENOENT while there is none yet. */
int wk__checkpoint_status(const char *rc_path);
int wk__runsc_verb(const wk_host_t *h, const char *verb, const char *id, const char *image_dir,
                   char err[WK_ERR_MAX]);
/* runsc restore --detach from image_dir into a new container bd->id, with bundle_dir's
 * config.json written here from bd. Without the sandbox's CPU quota while runsc restores
 * (docs/machine-notes.md, "Restore under the sandbox's CPU quota"), which is set once it is
 * done; a restore whose quota cannot be set fails. */
int wk__runsc_restore(const wk_host_t *h, const wk__bundle_t *bd, const char *bundle_dir,
                      const char *image_dir, char err[WK_ERR_MAX]);
/* Kills the runsc calls still running on id under our root (a `runsc create` or checkpoint
 * of a worker killed meanwhile: their reapers outlive it) and waits until they are gone.
 * Returns how many, or -ETIMEDOUT. */
int wk__runsc_calls_stop(const wk_host_t *h, const char *id);
/* Kills the sandbox and gofer processes of id (pids from runsc's state file, each checked
 * against its command line first) and waits up to 200 ms until they are reaped. runsc's
 * delete polls for them every 100 ms, and its first look comes right after its own SIGKILL:
 * gone before it starts, the delete does not wait (docs/machine-notes.md, "runsc delete
 * waits 100 ms"). Returns how many, or -ETIMEDOUT (then the delete waits as before). */
int wk__runsc_procs_end(const wk_host_t *h, const char *id);
/* delete --force (kills the sandbox); a container that does not exist is success. */
int wk__runsc_delete(const wk_host_t *h, const char *id, char err[WK_ERR_MAX]);
int wk__runsc_exec(const wk_host_t *h, const char *id, const char *const *argv, char *out,
                   size_t out_len, int *ret_exit);
/* Containers under our runsc root: ids and states (WK_RUNNING, WK_PAUSED or WK_STOPPED). */
int wk__runsc_list(const wk_host_t *h, wk_host_sandbox_t **ret_list, size_t *ret_n);
/* rmdir of space-<tag>/<id> under every cgroup v1 controller (and the unified tree). */
int wk__cgroup_remove(const wk_host_t *h, const char *id);
/* Raises the sandbox's host memory limit (set by runsc from memory_mb) by its headroom
 * (WK_MEMORY_HEADROOM_*), after create and restore: 0, or -errno. No cgroup v1 memory
 * controller: 0, nothing done. */
int wk__cgroup_memory_headroom(const wk_host_t *h, const char *id);
/* Distinct ids that have a cgroup directory under any controller (heap strv). */
int wk__cgroup_ids(const wk_host_t *h, char ***ret_ids, size_t *ret_n);

#endif
