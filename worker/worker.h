/* space-worker internals: the daemon around worker_runtime.h. */
#ifndef SPACE_WORKER_H
#define SPACE_WORKER_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "cred.h"
#include "db.h"
#include "envelope.h"
#include "hash.h"
#include "request.h"
#include "verifier.h"
#include "worker_agent.h"
#include "worker_runtime.h"

typedef struct {
    char *id;
    char *nats_url;
    char *identity; /* busid.h */
    char *creds_dir;
    char *verify_signatures; /* verifier.h */
    char *keyring_dir;
    char *pg_url;
    char *state_dir;
    char *volume_dir;
    int64_t image_mb;
    char *runsc;
    char *agent;
    char *ca_cert;
    char *runsc_platform;
    char *net_prefix;
    int64_t egress_proxy_port; /* egressd's ports on the host (worker_runtime.h) */
    int64_t egress_dns_port;
    char *templates;          /* comma-separated, prepared at start */
    char *template_defs;      /* where <name>.sh definitions are ("": the installed ones) */
    char *template_cache;     /* the host's template cache ("": none) */
    char *snapshot_dir;       /* dir store: the store (shared); nats store: this worker's cache */
    char *snapshot_store;     /* "dir" or "nats" (worker_snapstore.c) */
    char *snapshot_bucket;    /* the nats store's bucket */
    int64_t snapshot_sweep_s; /* wk_snap_sweep's period */
    int64_t kept_disk_s;      /* a suspended sandbox's disk stays on its host so long (0: not) */
    int64_t vcpu_total;       /* 0: the host's CPUs */
    int64_t memory_mb_total;  /* 0: the host's memory */
    int64_t disk_mb_default;  /* per-sandbox limits when a create says 0 (docs/faults.md) */
    int64_t disk_reserve_mb;
    bool disk_quota;
    int64_t pids_default;
    int64_t file_call_ms;  /* a data-plane file call is answered (pending if need be) within */
    int64_t file_op_max_s; /* a remove or move the agent has not finished by then fails */
    int64_t heartbeat_ms;
    int64_t sample_ms; /* each running sandbox's usage is sampled this often (worker_samples.c) */
    int64_t ack_wait_ms;
    int64_t batch_max;
    int64_t parallel;            /* sandboxes created or deleted at once */
    int64_t pool_size;           /* warm pool per template (worker_pool.c); 0: pools off */
    int64_t pool_refill_ms;      /* pause after each refill create */
    int64_t pool_max_age_s;      /* a pooled sandbox older than this is made again */
    int64_t agent_lost_grace_ms; /* commands of a broken agent channel wait this long for it */
    bool teardown;
    int64_t audit_cap; /* bytes of a command's output recorded in the log; 0: none */
    bool seal_output;  /* seal recorded output under the sandbox's data key (docs/audit.md) */
    int64_t datakey_timeout_ms;
    char *log_level;
    char *log_format;
    char *metrics_addr; /* metrics.h */
    char *metrics_port_file;
} wk_config_t;

typedef struct wk wk_t;

/* The worker's metric families (worker_metrics.c, docs/metrics.md). */
typedef struct {
    sp_metric_t *sandboxes, *pool_ready, *pool_target, *runsc, *cpu, *memory, *disk, *vcpus,
        *memory_host, *disk_host;
} wk_metrics_t;
typedef struct wk_pool wk_pool_t;
#define WK_GIVEN_UP_MAX 64
/* Idle PostgreSQL connections kept (sp_db_idle_t): the handler threads that read at once. */
#define WK_DB_IDLE_KEEP 4

/* Command facts (worker_factq.c): published from a thread of their own, in the order queued,
 * each batch retried whole until the stream has it (message ids make that idempotent). A fact
 * waits for its hold to end, or goes out earlier with a later fact whose hold ends first:
 * CommandOutput waits up to WK_FACT_HOLD_MS for its CommandExited, which waits WK_FACT_END_MS
 * (the gateway's answer from the IoExit leaves meanwhile). Before that, worker_commands.c holds
 * a command's start and first output WK_FACT_HOLD_MS itself: a command that ends within it is
 * one CommandExited with them inside. At most WK_FACT_ITEMS facts or WK_FACT_BYTES bytes wait;
 * a push then blocks. */
#define WK_FACT_HOLD_MS    100
#define WK_FACT_END_MS     5
#define WK_FACT_ITEMS      4096
#define WK_FACT_BYTES      (16 * 1024 * 1024)
#define WK_FACT_MSG_ID_MAX 160
typedef struct wk_factq wk_factq_t;
typedef struct wk_waits wk_waits_t;
/* Starts the publisher thread. bus must outlive the queue; worker: the subject's token;
 * journal: the file queued facts are kept in until published (NULL: none), whose leftovers
 * from a previous process are published first (worker_factq.c). */
int wk_factq_new(sp_bus_t *bus, const char *worker, const char *journal, wk_factq_t **ret);
/* Stamps env now (occurred_at, event id), validates and encodes it, and queues it to go out
 * within hold_ms; msg_id NULL: the event id. Any thread but the publisher's; blocks while the
 * queue is full. SP_ESCHEMA when env does not validate, -ECANCELED once the queue is
 * stopping. */
int wk_factq_push(wk_factq_t *q, sp_envelope_t *env, const char *msg_id, int hold_ms);
/* Releases every held fact and waits until all queued so far are published: a fact published
 * next (synchronously, elsewhere) lands after them. SP_ETIMEOUT after timeout_ms. */
int wk_factq_sync(wk_factq_t *q, int timeout_ms);
/* Publishes what is queued (giving up after a bounded wait, logged), stops, frees. NULL ok. */
void wk_factq_free(wk_factq_t *q);

#define WK_FILE_SUBS 4 /* file calls handled at once (different transfers) */
typedef struct wk_cmd wk_cmd_t;
typedef struct wk_xfer wk_xfer_t;
typedef struct wk_watch wk_watch_t;
typedef struct wk_samples wk_samples_t;
#define WK_WATCH_MAX 16 /* watched directories per sandbox (agent_files.h AGENT_MAX_WATCHES) */

/* A sandbox this worker owns. Heap, reference-counted: the owned table holds one reference,
 * every user (an exec request on a NATS thread, the agent's callbacks) takes its own. */
typedef struct {
    wk_t *w;
    char id[65];
    char tenant[65];
    char template_[65];
    uint32_t vcpu, memory_mb;
    int refs; /* under w->mu */

    pthread_mutex_t mu; /* guards what follows */
    /* CLOCK_MONOTONIC, with mu: a command's pinned output was attached for (worker_commands.c) */
    pthread_cond_t pin_cv;
    wk_agent_t *agent; /* NULL: no channel (adopted after a worker restart, or lost) */
    bool agent_lost;
    int64_t lost_at_ns;
    char lost_why[WK_ERR_MAX];
    /* While restoring: the host id the restore makes it under (wk_sandbox_restore_host_id),
     * whose channel socket the agent connects back on; "": id's own. */
    char host_id[65];
    bool listening;   /* a thread waits for the agent to connect back (worker_chan.c) */
    bool gone;        /* out of the owned table: being deleted or failed */
    bool paused;      /* runsc paused (worker_lifecycle.c) */
    bool restoring;   /* runsc restore in progress: not running yet, not dead either */
    wk_cmd_t *cmds;   /* running commands */
    sp_cred_key_t dk; /* the data key of its output (dk_state 1), wiped when released */
    int dk_state;     /* 0 not asked yet, 1 held, 2 forgotten (space-replay forget) */
    size_t n_cmds;
    wk_cmd_t *done;   /* ended commands, newest first, kept a while for list and attach */
    wk_xfer_t *xfers; /* file operations and transfers (worker_files.c) */
    size_t n_xfers;
    wk_watch_t *watches; /* directory watches (worker_watch.c) */
    size_t n_watches;
    wk_samples_t *samples; /* usage samples (worker_samples.c); NULL until the first */
} wk_box_t;

struct wk {
    const wk_config_t *cfg;
    sp_bus_t *bus;
    /* What the worker acts on is checked first (docs/trust.md): intents and placements on its
     * durable (worker_events.c), requests on its data-plane subjects (wk_request_open). */
    sp_verifier_t *verifier;
    sp_request_guard_t *guard;
    wk_factq_t *facts; /* command facts (worker_factq.c) */
    wk_waits_t *waits; /* requesters waiting for a short command's end (worker_commands.c) */
    wk_host_t *host;
    /* PostgreSQL for the handlers' short reads (a resume's snapshot record, an old placement):
     * connections kept open between them (db.h, sp_db_idle_t). */
    sp_db_idle_t *db;
    char hostname[256];
    uint32_t vcpu_total;
    uint64_t memory_mb_total;

    pthread_mutex_t mu; /* guards owned, refs, templates and given_up */
    wk_box_t **owned;
    size_t n_owned, cap_owned;
    /* The last placements (event ids) this process failed: one taken again (from the log
     * after a reconnect, or redelivered) before the log has the failure must not create the
     * sandbox. A new placement of the same sandbox has an id of its own. A ring. */
    char given_up[WK_GIVEN_UP_MAX][65];
    unsigned given_up_next;
    char **templates;
    size_t n_templates;
    sp_bus_sub_t *ctl_sub;                 /* space.io.wkr.<id>.ctl */
    atomic_int listeners;                  /* agent listener threads alive (worker_chan.c) */
    sp_bus_sub_t *exec_sub;                /* space.io.wkr.<id>.exec */
    sp_bus_sub_t *file_subs[WK_FILE_SUBS]; /* space.io.wkr.<id>.file, one queue group */
    sp_bus_sub_t *watch_sub;               /* space.io.wkr.<id>.watch */
    sp_bus_sub_t *metrics_sub;             /* space.io.wkr.<id>.metrics */
    pthread_t sampler;
    bool sampler_started;
    pthread_t files_reaper;
    bool files_reaper_started;
    wk_pool_t *pool; /* NULL: pools off (worker_pool.c) */
    wk_metrics_t metrics;
};

/* Adds the families to reg (-1 on a programming error); metrics.runsc goes into the host's
 * config before it opens. */
int wk_metrics_init(wk_t *w, sp_metrics_t *reg);
/* Registers the scrape-time reading of w (its owned table, pool and host): once all of them
 * are set up, before the listener starts. */
void wk_metrics_serve_collect(wk_t *w, sp_metrics_t *reg);

/* Compares what the log says this worker owns with what the host shows: adopts sandboxes
 * still running (SandboxAdopted), fails the ones that are gone (SandboxFailed "lost"),
 * releases host resources of sandboxes the log says are gone, and records it all in one
 * WorkerReconciled event. */
int wk_reconcile(wk_t *w, PGconn *db);

/* After wk_reconcile: the sandboxes the log has placed on this worker and not started (it
 * died while creating them) are created now from their stored SandboxPlaced, instead of
 * after the placement's ack wait. Their leftovers are released by the create itself. The
 * redelivery that comes later finds them owned (or failed) and changes nothing. */
int wk_take_placements(wk_t *w, PGconn *db);

/* Consumes space.ev.sbx.<id>.> until a stop is asked for (daemon.h): creates, deletes,
 * answers with facts. */
int wk_serve(wk_t *w);

/* Opens a request that arrived on one of the worker's data-plane subjects (request.h): true
 * when it may be acted on (rq's body is the request; dispose rq in every case). A refusal is
 * logged and answered on reply_to (RequestRefused). */
bool wk_request_open(wk_t *w, const char *subject, const char *reply_to, const uint8_t *data,
                     size_t len, sp_request_t *rq);

/* Warm pools (worker_pool.c, docs/pools.md). The shape every pooled sandbox is made with
 * (the API's defaults): a create asking for another vcpu or memory_mb is made from scratch,
 * since the guest kernel sizes itself when it boots. */
#define WK_POOL_VCPU      1
#define WK_POOL_MEMORY_MB 512
/* Starts the refill thread (cfg->pool_size > 0): after the reconciliation. */
int wk_pool_start(wk_t *w);
/* Stops it and destroys every unclaimed pooled sandbox. */
void wk_pool_stop(wk_t *w);
/* Whether a create of spec (its id the sandbox's) may be served from a pool. */
bool wk_pool_fits(const wk_t *w, const wk_sandbox_spec_t *spec);
/* Claims a ready pooled sandbox of spec->template_ for the sandbox spec->id of tenant: the
 * host map and disk limit (wk_sandbox_claim), the hostname (wk_agent_claim), then the box takes
 * the identity and joins the owned table. Returns the box with a reference for the caller and
 * fills ret_info (address, disk limit; no channel fds: the box holds the channel), or NULL when
 * none is ready or the claim failed (what it took is released: the caller creates from scratch). */
wk_box_t *wk_pool_claim(wk_t *w, const wk_sandbox_spec_t *spec, const char *tenant,
                        wk_sandbox_info_t *ret_info);
/* The pool levels for the heartbeat, into caller arrays of max entries; how many. The
 * template strings live as long as the pool. */
#define WK_POOL_LEVELS_MAX 64
size_t wk_pool_levels(wk_t *w, Space__V1__PoolLevel *levels, Space__V1__PoolLevel **ptrs,
                      size_t max);

/* The owned table and the fact helpers live in worker_box.c. Publishes one heartbeat. */
int wk_heartbeat(wk_t *w);

/* Owned-sandbox table (worker_box.c; locks inside). add returns the new box with one reference for
 * the caller (NULL if the id is owned already); get takes a reference (NULL if not owned); put
 * drops one; remove takes the box out of the table and hands the table's reference to the
 * caller (NULL if not owned). The last put closes the agent channel and frees. */
wk_box_t *wk_owned_add(wk_t *w, const char *id, const char *tenant, const char *tmpl, uint32_t vcpu,
                       uint32_t memory_mb);
wk_box_t *wk_owned_get(wk_t *w, const char *id);
/* A box outside the table (one reference, the caller's): a warm-pool sandbox's. insert puts
 * it into the table (taking a reference of the table's); false if the id is owned already. */
wk_box_t *wk_box_new(wk_t *w, const char *id, const char *tenant, const char *tmpl, uint32_t vcpu,
                     uint32_t memory_mb);
bool wk_owned_insert(wk_t *w, wk_box_t *b);
wk_box_t *wk_owned_remove(wk_t *w, const char *id);
void wk_box_put(wk_box_t *b);
int wk_owned_has(wk_t *w, const char *id);

/* Commands (worker_commands.c): serve ExecRequests from the data plane. */
int wk_commands_start(wk_t *w);
/* At start, for a sandbox the previous worker had (adopted or lost): every command the log
 * has without its end gets CommandExited {exit_code -1, error "worker_restarted: ..."}, so
 * no command, and no answer the gateway gave for it, is left without an end in the log; and
 * the same IoExit, so a gateway still following it answers at once. */
int wk_commands_reconcile(wk_t *w, PGconn *db, const char *tenant, const char *sbx);
void wk_commands_stop(wk_t *w);
/* After every box is released (their reader threads ask the stopped waits' thread). */
void wk_commands_free(wk_t *w);
/* Attaches the agent channel of a new sandbox (takes the fds; -1 fds: no channel). */
int wk_box_attach_agent(wk_box_t *b, int to_fd, int from_fd);
/* Ends every running command of the box with error (the sandbox is going away). */
void wk_box_fail_commands(wk_box_t *b, const char *error);
/* Ends the running commands and frees every command of the box (its last reference). */
void wk_box_free_commands(wk_box_t *b);
/* wk_agent_open with the box's callbacks (commands, and on_lost: the agent connects back). */
int wk_box_open_agent(wk_box_t *b, int to_fd, int from_fd, int hello_timeout_ms, wk_agent_t **ret);
/* A channel the agent opened again becomes the box's: commands its Hello lists are followed
 * (also ones started under an earlier worker process), the others end with the loss's reason.
 * Returns how many it listed. */
size_t wk_box_adopt_channel(wk_box_t *b, wk_agent_t *a);

/* The agent's way back (worker_chan.c): unless one runs already, a thread listens on the
 * sandbox's channel socket until the agent connects back, the box is gone, or the sandbox is
 * found not running (then it is failed "exited" and released). */
void wk_box_listen(wk_box_t *b);

/* Lifecycle (worker_lifecycle.c): each handles one event from this worker's subject; 0 when
 * done (the event is acked), < 0 to have it redelivered. */
int wk_on_pause(wk_t *w, const sp_envelope_t *ev);
int wk_on_resume(wk_t *w, const sp_envelope_t *ev);
int wk_on_suspend(wk_t *w, const sp_envelope_t *ev);
/* began: the log has its SandboxResuming from a previous process already (not published
 * again). */
int wk_on_resume_placed(wk_t *w, const sp_envelope_t *ev, bool began);
/* Named snapshots (docs/snapshots.md). wk_on_snapshot: checkpoint of an owned running
 * sandbox, its artifacts into the store under named/<snapshot>/, the sandbox restored in place,
 * SandboxSnapshotted. wk_on_snapshot_delete: the artifacts removed, SnapshotDeleted.
 * wk_create_from_snapshot: the placed create's sandbox restored from its request's snapshot
 * (the tenant's, digests checked) and owned; the caller publishes SandboxStarted or
 * SandboxFailed. */
int wk_on_snapshot(wk_t *w, const sp_envelope_t *ev);
int wk_on_snapshot_delete(wk_t *w, const sp_envelope_t *ev);
int wk_create_from_snapshot(wk_t *w, const sp_envelope_t *ev, const wk_sandbox_spec_t *spec,
                            wk_sandbox_info_t *ret_info, char err[WK_ERR_MAX]);
/* At start, for a sandbox the log says is suspending on this worker: waits for a checkpoint
 * the previous worker's runsc may still be writing; when it wrote an image, completes the
 * suspend (artifacts stored, SandboxSuspended answering the SandboxSuspendRequested, host
 * released) and returns 1. 0 when there is no image (the sandbox runs on, or is lost: the
 * caller looks), < 0 when a fact could not be published. */
int wk_suspend_complete(wk_t *w, PGconn *db, const char *sbx, const char *tmpl);
/* At start, for a sandbox the log says is resuming on this worker: alive (runsc shows it
 * running) means the restore finished: SandboxResumed and its snapshot removed, 1 (the caller
 * adopts it). Otherwise its leftovers are released and it stays resuming, 0: its placement,
 * taken from the log at start, resumes it again. < 0 when a fact could not be published. */
int wk_resume_after_restart(wk_t *w, PGconn *db, const char *sbx, const char *tenant, bool alive);
/* At start, for a sandbox the log says runs on this worker, when the previous worker died in
 * a named snapshot of it: if the host does not run it (!alive) and the checkpoint wrote an
 * image, the sandbox is restored in place from that checkpoint and owned again, 1 (the caller
 * announces it adopted). The unannounced snapshot's staging and artifacts are removed either
 * way (its intent, redelivered, takes it again). 0 otherwise. */
int wk_snapshot_recover(wk_t *w, const char *sbx, const char *tenant, const char *tmpl,
                        uint32_t vcpu, uint32_t memory_mb, bool alive);
/* Publishes a sandbox fact that no intent caused (the worker's restart did); what names it in
 * the message id. */
int wk_publish_restart_fact(wk_t *w, const char *tenant, const char *sbx, const char *what,
                            sp_envelope_t *env, Space__V1__Aggregate *agg);

/* The snapshot store (worker_snapstore.c): a directory, or a NATS object-store bucket with
 * snapshot-dir as this worker's cache. Keys are <sandbox>/<snapshot>/<artifact>. */
#define WK_SNAP_STORE_MAX 80
/* Checks the configuration and makes the bucket (nats); after the bus is connected. */
int wk_snap_open(wk_t *w);
bool wk_snap_remote(const wk_t *w);
/* "dir" or "nats:<bucket>", as SandboxSuspended records it. */
void wk_snap_store_name(const wk_t *w, char out[WK_SNAP_STORE_MAX]);
/* Stores the finished file src as key (moved into the cache or directory, uploaded first when
 * the store is nats); its SHA-256 and size. */
int wk_snap_put(wk_t *w, const char *key, const char *src, uint8_t sha[SP_SHA256_LEN],
                uint64_t *ret_size, char err[WK_ERR_MAX]);
/* A local path (heap) holding key's bytes, checked against the recorded size and SHA-256:
 * the cached file, else (nats) downloaded into the cache (*ret_downloaded). -EBADMSG when the
 * bytes differ from the record (err names the artifact and both digests). */
int wk_snap_fetch(wk_t *w, const char *key, uint64_t size, const uint8_t sha[SP_SHA256_LEN],
                  char **ret_path, bool *ret_downloaded, char err[WK_ERR_MAX]);
/* Removes keys from the cache or directory and (nats) the bucket; best effort. */
void wk_snap_forget(wk_t *w, const char *const *keys, size_t n);
/* Snapshot garbage: from the cache (nats store), sandboxes no longer suspended (resumed on
 * another worker, or deleted); from the store (the directory, or the bucket), sandboxes
 * deleted or failed while suspended. Any number of workers may sweep at once. */
void wk_snap_sweep(wk_t *w, PGconn *db);
/* Drops the box's running commands without ending them (the sandbox is being suspended: they
 * go on inside and are followed again after the resume). */
void wk_box_forget_commands(wk_box_t *b);
/* Publishes a fact answering an event, with message id "<prefix>:<cause_id>" (a redelivered
 * cause gives the same id: the stream drops the repeat). Logs a failure. */
int wk_publish_fact(wk_t *w, sp_envelope_t *env, const char *prefix, const char *cause_id);

/* Publishes a fact about the box's sandbox (aggregate, tenant, actor filled in); msg_id NULL:
 * the event id. Logs a failure. */
int wk_publish_box_event(wk_box_t *b, sp_envelope_t *env, const char *msg_id);
/* The data key of b's output (docs/audit.md): held by the box once space-credstore gave it
 * (space.io.cred.datakey), asked for again while it did not answer. 0, -ENOKEY (forgotten:
 * never asked again), or < 0 (unavailable). ret is wiped by the caller. */
int wk_datakey_get(wk_box_t *b, sp_cred_key_t *ret);
/* The same from what the box holds only, never asking (for threads that must not wait on the
 * bus, such as the box's reader): 0, -ENOKEY (forgotten), -EAGAIN (not held). */
int wk_datakey_cached(wk_box_t *b, sp_cred_key_t *ret);

/* Files (worker_files.c): serve FileCalls from the data plane, close idle transfers. */
int wk_files_start(wk_t *w);
void wk_files_stop(wk_t *w);
/* Ends every file operation of the box with error (the channel is lost or the sandbox goes):
 * callers waiting for a reply get it. */
void wk_box_fail_files(wk_box_t *b, const char *error);
/* The channel callbacks for files, with the box as arg. */
void wk_files_callbacks(wk_agent_callbacks_t *cb);

/* Watches (worker_watch.c): serve WatchCalls from the data plane. */
int wk_watches_start(wk_t *w);
void wk_watches_stop(wk_t *w);

/* Usage samples (worker_samples.c): a thread samples every owned running sandbox's CPU, memory
 * and disk every sample-ms into a ring in its box (SP_METRICS_SAMPLES_MAX, the oldest dropped), and
 * space.io.wkr.<id>.metrics answers a sandbox's ring (MetricsCall -> MetricsReply). A box's
 * ring goes with the box (a suspend or a delete forgets it). Samples are never events. start:
 * after the owned table is filled; stop: joins the thread and unsubscribes. */
int wk_samples_start(wk_t *w);
void wk_samples_stop(wk_t *w);
/* Frees a box's ring (its last reference went). */
void wk_samples_free(wk_samples_t *s);
/* The channel callbacks for watches, with the box as arg. */
void wk_watch_callbacks(wk_agent_callbacks_t *cb);
/* Ends every watch of the box (WatchEnd with error; the agent is not asked: its channel is
 * lost or the sandbox goes). wk_box_fail_files calls it. */
void wk_box_fail_watches(wk_box_t *b, const char *error);
/* Ends watches whose lease ran out; answers starts the agent left unanswered (the files
 * reaper, once a second). */
void wk_box_reap_watches(wk_box_t *b);

#endif
