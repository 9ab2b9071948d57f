/* The host side of sandboxes on one worker: the gVisor (runsc) runtime driver, btrfs volumes
 * and templates, the per-sandbox network namespace, and cleanup. No bus, no events: the worker
 * daemon (worker/main.c) drives this module and reports what happened.
 *
 * Threads: every function may be called from several threads at once for DIFFERENT sandbox
 * ids (the daemon runs creates in parallel); calls for the same id must not overlap. The
 * address pool and template builds are locked inside.
 *
 * Errors: < 0 (negative errno or SP_E*), with a one-line human reason in err (WK_ERR_MAX)
 * where the signature has one. Nothing here logs above debug.
 */
#ifndef SPACE_WORKER_RUNTIME_H
#define SPACE_WORKER_RUNTIME_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

#define WK_ERR_MAX 256

/* Per-sandbox limits when neither the spec nor the host config says (docs/faults.md). */
#define WK_DISK_MB_DEFAULT 2048
#define WK_PIDS_DEFAULT    1024

typedef struct {
    const char *worker_id;      /* sp_id_valid; names runsc ids, netns and cgroups it owns */
    const char *state_dir;      /* e.g. $SPACE_HOME/worker-<id>: runsc root, bundles, image */
    const char *volume_dir;     /* btrfs mount point for templates and sandbox disks; if it is not
                                   btrfs, a sparse loop image under state_dir is mounted there */
    uint64_t image_bytes;       /* size of that loop image (sparse) */
    const char *runsc;          /* runsc program */
    const char *runsc_platform; /* "ptrace" (default here) or "kvm" */
    const char *net_prefix;     /* first two octets of the sandbox /30 pool, e.g. "10.200" */
    const char *agent_path;     /* the static space-agent binary (worker/agent/), copied into
                                   every sandbox as its init; NULL: a placeholder init and no
                                   agent channel */
    /* egressd's transparent TCP listener and DNS server, on the host (worker_nft.c redirects
     * every TCP connection and every DNS query of a sandbox there). 0: dropped instead. */
    uint16_t egress_proxy_port;
    uint16_t egress_dns_port;
    /* The deployment CA certificate (PEM, certificates only) every new sandbox trusts
     * (worker_trust.c); NULL: sandboxes get no CA. */
    const char *ca_cert_path;
    /* Disk limits (docs/faults.md, "Limits"): what a sandbox may write beyond its template
     * when its spec says 0, and what the volume keeps free: a create that could leave less
     * than disk_reserve_mb free (free - its own limit) is refused with SP_ENOSPACE. */
    uint32_t disk_mb_default; /* 0: WK_DISK_MB_DEFAULT */
    bool disk_quota_off;      /* no qgroups: sandboxes share the volume unlimited (bench) */
    uint32_t disk_reserve_mb;
    /* Processes per user id inside a sandbox (RLIMIT_NPROC, enforced by gVisor's kernel)
     * when its spec says 0. */
    uint32_t pids_default; /* 0: WK_PIDS_DEFAULT */
    /* Template definitions: <template_defs>/<name>.sh builds template <name> (base.sh is
     * "base"); NULL: the worker's installed templates directory. */
    const char *template_defs;
    /* The host's template cache, shared by every worker of this host whatever its volume
     * (absolute; NULL or "": none): a finished template is kept there as a btrfs send
     * stream named by the content that defines it, and a worker that lacks the template
     * receives it instead of building it (docs/faults.md, "Templates"). */
    const char *template_cache;
    /* Long host work (template builds) stops soon after *cancel becomes nonzero (NULL:
     * never), e.g. &sp_daemon_stopping. */
    const atomic_int *cancel;
    /* Histogram family with one label, op: every runsc call's duration (create, start, pause,
     * resume, checkpoint, restore, delete, exec, list, other). NULL: not measured. */
    sp_metric_t *runsc_seconds;
} wk_host_config_t;

typedef struct wk_host wk_host_t;

/* Prepares the host: directories, the btrfs volume (mounting the loop image if needed),
 * runsc root. Idempotent across restarts; does not touch existing sandboxes. */
int wk_host_open(const wk_host_config_t *cfg, wk_host_t **ret_host, char err[WK_ERR_MAX]);
/* Releases memory and fds; leaves sandboxes, mounts and templates in place. Accepts NULL. */
void wk_host_close(wk_host_t *h);

/* Every identity that has opened a state directory, recorded there by wk_host_open before it
 * makes anything on the host (<state_dir>/identities, one "<tag> <worker_id> <volume_dir>" line
 * each): what a teardown must release, whatever id and volume directory it is itself given. */
typedef struct {
    char tag[8 + 1]; /* wk_host_tag */
    char *worker_id;
    char *volume_dir;
} wk_host_identity_t;
/* The recorded identities in the order they first opened state_dir (heap array; free with
 * wk_host_identities_free); *ret_n 0 for a state directory from before the record. A line that
 * does not parse is an error (-EBADMSG): a teardown must not guess. */
int wk_host_identities(const char *state_dir, wk_host_identity_t **ret_ids, size_t *ret_n,
                       char err[WK_ERR_MAX]);
void wk_host_identities_free(wk_host_identity_t *ids, size_t n);

/* Templates are read-only btrfs subvolumes under volume_dir/templates/<name>:
 *   "tiny": built in (busybox-static), well under a second;
 *   any <template_defs>/<name>.sh, run as `sh <name>.sh DIR STATX_SHIM_C` into an empty
 *           subvolume DIR (its output in <state_dir>/template-<name>.log); "base.sh": Debian
 *           bookworm minbase via debootstrap with bash, coreutils, iproute2, curl,
 *           ca-certificates, python3, the statx shim (runtime-notes.md) and user "user" with
 *           /home/user; minutes, needs the Debian mirror.
 * wk_template_ensure makes one if missing (serialised per name; from the host's template cache
 * when it holds the same definition, else built and then stored there): 0 when it was ready,
 * WK_TEMPLATE_BUILT or WK_TEMPLATE_CACHED when this call made it; < 0 with err on failure
 * (SP_ENOTFOUND: no such template; -ECANCELED: *cancel was set). */
#define WK_TEMPLATE_BUILT  1
#define WK_TEMPLATE_CACHED 2
int wk_template_ensure(wk_host_t *h, const char *name, char err[WK_ERR_MAX]);
/* Names of templates that are ready (heap array of heap strings; free with
 * wk_strv_free). */
int wk_template_list(wk_host_t *h, char ***ret_names, size_t *ret_n);
void wk_strv_free(char **v, size_t n);

typedef struct {
    const char *id;        /* sandbox id (sp_id_valid) */
    const char *template_; /* must be ready */
    uint32_t vcpu;         /* 0 = 1 */
    uint32_t memory_mb;    /* 0 = 512 */
    uint32_t disk_mb;      /* bytes written beyond the template, in MiB; 0 = disk_mb_default */
    uint32_t pids;         /* processes per uid in the guest; 0 = pids_default */
    /* A warm-pool sandbox (docs/pools.md): id is a pool id (wk_pool_id_new) and its init may
     * set the hostname once, at its claim (wk_sandbox_claim, wk_agent_claim). */
    bool pooled;
    /* wk_sandbox_restore only: the sandbox the checkpoint was taken of, whose name its disk
     * stream carries; NULL = id (a resume). Another id makes a new sandbox from a named
     * snapshot (docs/snapshots.md). */
    const char *image_of;
    /* wk_sandbox_restore only: the snapshot whose disk this host may have kept (a resume on
     * the host that suspended it): when it is there the disk starts from it, and rootfs_zst is
     * not read; NULL or not there: received from rootfs_zst. */
    const char *kept_snap;
    /* wk_sandbox_restore only: the id its host resources are made under
     * (wk_sandbox_restore_host_id); NULL = id. */
    const char *host_id;
} wk_sandbox_spec_t;

typedef struct {
    char address[16];   /* the sandbox's IPv4 address inside its netns */
    uint32_t create_ms; /* snapshot + netns + runsc create + start, as measured */
    /* The host ends of the agent channel (worker_agent.h): agent_to_fd writes to the agent's
     * stdin, agent_from_fd reads its stdout. Owned by the caller from then on (close them, or
     * hand them to wk_agent_open); -1 when the host has no agent_path. */
    int agent_to_fd;
    int agent_from_fd;
    uint32_t disk_mb; /* the disk limit applied, MiB beyond the template (0: quotas off) */
    bool disk_kept;   /* wk_sandbox_restore: the disk came from the kept one (spec.kept_snap) */
} wk_sandbox_info_t;

/* Creates and starts a sandbox: writable btrfs snapshot of the template, netns + veth with a
 * /30 from the pool (no egress yet: the host side has no route out), runsc create + start
 * with CPU and memory limits. The init is space-agent (agent_path, copied to /.space/agent
 * in the sandbox's disk) with two pipes as its stdin and stdout, whose host ends come back in
 * ret_info (when ret_info is NULL they are closed); without agent_path, a long-running
 * placeholder init. runsc create runs under a small detached process ("space-reaper") that reaps
 * the sandbox's runsc processes as soon as they exit (PID 1 here reaps orphans only about once a
 * second, which made every destroy wait). On failure everything it made is released before
 * it returns. */
int wk_sandbox_create(wk_host_t *h, const wk_sandbox_spec_t *spec, wk_sandbox_info_t *ret_info,
                      char err[WK_ERR_MAX]);

/* Warm pools (docs/pools.md). Pool ids are WK_POOL_PREFIX + 26 random base32hex chars: never
 * a sandbox id ("sbx_..."), unguessable, fixed length (runsc matches ids by prefix). */
#define WK_POOL_PREFIX "pool_"
#define WK_POOL_ID_LEN 31
void wk_pool_id_new(char out[WK_POOL_ID_LEN + 1]);
bool wk_pool_id_is(const char *id);
/* Makes the pooled sandbox pool_id the sandbox spec->id (a sandbox id): sets its disk limit to
 * spec->disk_mb (0: the default; the limit in force into *ret_disk_mb, 0 with quotas off,
 * as wk_sandbox_info_t.disk_mb) and records the map from spec->id to pool_id (the
 * bundles/<spec->id> symlink), after which every call here takes spec->id and finds the
 * pooled sandbox's resources. -EEXIST when spec->id is in use here. On failure nothing
 * changed. The guest side (hostname) is the agent's: wk_agent_claim. */
/* The disk limit (MiB) a sandbox asking disk_mb (0: none) gets: what SandboxStarted says; 0
 * when quotas are off. */
uint32_t wk_sandbox_disk_mb(const wk_host_t *h, uint32_t disk_mb);
int wk_sandbox_claim(wk_host_t *h, const char *pool_id, const wk_sandbox_spec_t *spec,
                     uint32_t *ret_disk_mb, char err[WK_ERR_MAX]);

/* Stops and releases everything of a sandbox: runsc container and state, subvolume, netns,
 * veth, address, cgroup directories left by runsc. Idempotent: releasing what is already gone
 * is success. */
int wk_sandbox_destroy(wk_host_t *h, const char *id, char err[WK_ERR_MAX]);
/* wk_sandbox_destroy after a checkpoint into ck: without runsc's delete when ck says the
 * container went already. */
typedef struct wk_checkpoint wk_checkpoint_t;
int wk_sandbox_destroy_checkpointed(wk_host_t *h, const char *id, wk_checkpoint_t *ck,
                                    char err[WK_ERR_MAX]);
/* wk_sandbox_destroy_checkpointed in the background, at a low priority: returns at once, and
 * takes ck over (it is left empty). A destroy of id, and the link of a restore of id made
 * under another host id, wait for it; so does wk_host_close. */
int wk_sandbox_release_checkpointed(wk_host_t *h, const char *id, wk_checkpoint_t *ck,
                                    char err[WK_ERR_MAX]);
/* The host id a restore of id begun now is to use (wk_sandbox_spec_t.host_id): id itself, or
 * a new one of the pool's form while id's release after its suspend still runs, so that the
 * restore need not wait for the old container's names to be free
 * (docs/architecture.md). */
void wk_sandbox_restore_host_id(wk_host_t *h, const char *id, char out[65]);
/* The environment that points a sandbox's TLS clients at the deployment CA ("NAME=value":
 * SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS); 0 entries without a CA. */
size_t wk_host_trust_env(const wk_host_t *h, const char *const **ret);

/* The 8 hex characters that name this host's resources (cgroup parents space-<tag>, netns
 * sp-<tag>-*, veths spv<4 of tag>*, nft table space_<tag>): from the worker id and the state
 * directory, so stacks on one host never share them. */
const char *wk_host_tag(const wk_host_t *h);

/* mkdir -p (0700; errno set on failure) and rm -rf (not crossing mounts): for the worker's
 * own directories. */
int wk_mkdir_p(const char *path);
int wk_rm_rf(const char *path);

/* runsc pause (pause) or resume (!pause) of a running sandbox: processes and connections stay,
 * nothing runs meanwhile. */
int wk_sandbox_pause(wk_host_t *h, const char *id, bool pause, char err[WK_ERR_MAX]);

/* What a checkpoint left in out_dir: the runtime image and the disk's delta against its
 * template, each zstd-compressed (heap paths). */
struct wk_checkpoint {
    char *image_path;  /* checkpoint.img.zst */
    char *rootfs_path; /* rootfs.btrfs.zst: `btrfs send -p <template>` of the sandbox's disk */
    uint32_t checkpoint_ms, rootfs_ms;
    /* runsc's delete of the stopped container, under way (wk_sandbox_checkpoint) */
    struct wk_container_delete *deleting;
};
/* Checkpoints a running sandbox into out_dir (runsc checkpoint stops it and the container is
 * deleted meanwhile; the rest of its resources stay until wk_sandbox_destroy_checkpointed). On
 * failure the sandbox may still run: the caller asks wk_sandbox_running. */
/* keep_snap (a snapshot id, or NULL): the disk's read-only snapshot, once sent, stays on this
 * host as the kept disk of that snapshot (replacing the sandbox's older one), for a resume
 * here to start from instead of receiving the stream (wk_sandbox_spec_t.kept_snap). */
int wk_sandbox_checkpoint(wk_host_t *h, const char *id, const char *tmpl, const char *out_dir,
                          const char *keep_snap, wk_checkpoint_t *ret, char err[WK_ERR_MAX]);
/* Waits for the container's delete the checkpoint began: true when runsc's container went. */
bool wk_checkpoint_container_gone(wk_checkpoint_t *c);
/* Frees c, after the container's delete the checkpoint began. */
void wk_checkpoint_dispose(wk_checkpoint_t *c);
/* The part of wk_sandbox_checkpoint after runsc's: the disk delta and both compressed, from a
 * checkpoint image already in out_dir (a restarted worker completing its predecessor's). */
int wk_sandbox_checkpoint_finish(wk_host_t *h, const char *id, const char *tmpl,
                                 const char *out_dir, const char *keep_snap, wk_checkpoint_t *ret,
                                 char err[WK_ERR_MAX]);
/* Removes the kept disks (wk_sandbox_checkpoint's keep_snap) for which keep (NULL: none)
 * answers false, and any whose age cannot be read; how many were removed. keep gets the
 * sandbox and snapshot ids and the disk's age (seconds since the suspend made it). */
typedef bool (*wk_kept_keep_fn)(void *ctx, const char *sbx, const char *snap, int64_t age_s);
size_t wk_host_kept_sweep(wk_host_t *h, wk_kept_keep_fn keep, void *ctx);
/* How a checkpoint into out_dir ended, waiting up to wait_ms while its runsc still runs:
 * 1 when runsc wrote the image and said so, 0 otherwise (failed, or never ran). */
int wk_checkpoint_outcome(const char *out_dir, int wait_ms);
/* Makes the sandbox again from a checkpoint: the disk received against this worker's copy of
 * the template, a new netns, runsc restore. Its agent connects back on its channel socket
 * (there are no channel fds in ret_info). On failure everything it made is released. */
int wk_sandbox_restore(wk_host_t *h, const wk_sandbox_spec_t *spec, const char *image_zst,
                       const char *rootfs_zst, const char *work_dir, wk_sandbox_info_t *ret_info,
                       char err[WK_ERR_MAX]);

/* The sandbox's IPv4 address inside its netns, as text. */
int wk_sandbox_address(wk_host_t *h, const char *id, char out[16], char err[WK_ERR_MAX]);
/* 1 when runsc shows the sandbox's container running or paused, 0 when not (stopped, or gone),
 * < 0 when runsc could not be asked. */
int wk_sandbox_running(wk_host_t *h, const char *id);
/* How many times the host's memory cgroup of the sandbox OOM-killed one of its processes
 * (the cgroup's oom_kill count); 0 when it has none or it is gone. Under gVisor such a kill
 * is the Sentry's, and it ends the whole sandbox (docs/faults.md, "Limits"). Read it before
 * wk_sandbox_destroy, which removes the cgroup. */
int wk_sandbox_oom_kills(const wk_host_t *h, const char *id);
/* The host path of the Unix socket the sandbox's agent connects to once its first channel
 * broke (heap, freed by the caller; NULL without agent_path). The worker listens there. */
char *wk_sandbox_chan_socket(const wk_host_t *h, const char *id);

/* Puts back the per-sandbox firewall state of a sandbox that outlived a worker restart (the
 * reconciliation calls it for every adopted sandbox). Idempotent. */
int wk_sandbox_net_restore(wk_host_t *h, const char *id, char err[WK_ERR_MAX]);

/* Runs argv inside a running sandbox via `runsc exec` and captures stdout+stderr (at most
 * out_len - 1 bytes, NUL-terminated) and the exit code. For tests and diagnostics: commands
 * go through the agent channel (worker_agent.h). */
int wk_sandbox_exec(wk_host_t *h, const char *id, const char *const *argv, char *out,
                    size_t out_len, int *ret_exit_code);

typedef enum { WK_ABSENT = 0, WK_RUNNING, WK_PAUSED, WK_STOPPED, WK_PARTIAL } wk_state_t;

/* What the host shows for this worker: every sandbox id that has any resource here (runsc
 * container, subvolume, netns), with a state: RUNNING (container running), STOPPED
 * (container exists, not running), PARTIAL (some resources without a container). */
typedef struct {
    char id[65];
    wk_state_t state;
} wk_host_sandbox_t;

/* The volume's disk in MiB, as a create's reserve check sees it: its size and what is free
 * now, the reserve kept free and the limit of a create that names none (the heartbeat's
 * numbers, which the scheduler places by). */
typedef struct {
    uint64_t total_mb, free_mb, reserve_mb;
    uint32_t default_mb;
} wk_host_disk_t;
int wk_host_disk(wk_host_t *h, wk_host_disk_t *ret);
/* Removes the volume's stale qgroups (those of deleted subvolumes the kernel did not remove
 * itself); rescan: recounting first those it refuses (at start: it blocks while the kernel
 * rescans). How many went and how many are left. A no-op without quotas. */
int wk_host_qgroup_sweep(wk_host_t *h, bool rescan, unsigned *ret_removed, unsigned *ret_left,
                         char err[WK_ERR_MAX]);
int wk_host_scan(wk_host_t *h, wk_host_sandbox_t **ret_list, size_t *ret_n);

/* Destroys every sandbox of this worker and unmounts the volume image it mounted: what
 * `space down --purge` needs before it can delete the state directory. The host must not be
 * used afterwards except to close it. */
int wk_host_teardown(wk_host_t *h, char err[WK_ERR_MAX]);

/* What a sandbox uses now, for metrics: CPU time and memory from its cgroup (v1 cpuacct and
 * memory controllers, or v2's cpu.stat and memory.current), disk from its subvolume's qgroup
 * (exclusive bytes, what its disk limit counts; as of btrfs's last commit). Each has_* says
 * whether that number could be read (no cgroup yet, quotas off). 0, or -EINVAL for a bad id. */
typedef struct {
    bool has_cpu, has_memory, has_disk, has_disk_limit;
    double cpu_seconds;
    uint64_t memory_bytes, disk_bytes;
    uint64_t disk_limit_bytes; /* its qgroup's exclusive limit (disk_mb) */
} wk_sandbox_usage_t;
int wk_sandbox_usage(const wk_host_t *h, const char *id, wk_sandbox_usage_t *ret);

/* Counts of host resources belonging to this worker, for leak checks in tests. */
typedef struct {
    size_t containers, subvolumes, netns, veths, cgroups;
} wk_host_usage_t;
int wk_host_usage(wk_host_t *h, wk_host_usage_t *ret);

#endif
