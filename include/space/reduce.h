/* Reducers: the pure functions that fold events into projection rows. The event log applies
 * them in the same transaction that stores the event; space-replay applies the same functions
 * to rebuild state at any instant. Deterministic: same rows + same events -> same result.
 *
 * A reducer either applies the event (returns 0, row updated) or refuses it (returns
 * SP_ETRANSITION with a reason, row untouched): an event that breaks the state machine is
 * recorded as rejected, never silently applied. One kind of accepted event may leave the row
 * as it was (returns 0, version unchanged): activity (a command, a file change, an allowed
 * connection) within SP_ACTIVITY_GRAIN_US of the activity the row already records.
 */
#ifndef SPACE_REDUCE_H
#define SPACE_REDUCE_H

#include <stdint.h>

#include "envelope.h"

#define SP_ID_MAX 64

/* last_activity_at moves in steps of at least this: activity less than a second after the
 * recorded one changes no row, so a sandbox running commands back to back costs its
 * projection one write a second, not one per command (docs/architecture.md, "Activity in
 * steps of a second"). The recorded time is never later than the true last activity, and at
 * most this much earlier: whatever acts on idleness adds it (scheduler_timeouts.c). */
#define SP_ACTIVITY_GRAIN_US 1000000
#define SP_ACTIVITY_GRAIN_S  1

typedef enum {
    SP_SBX_NONE = 0, /* no such sandbox (yet) */
    SP_SBX_REQUESTED,
    SP_SBX_PLACED,
    SP_SBX_RUNNING,
    SP_SBX_PAUSED,
    SP_SBX_SUSPENDING,
    SP_SBX_SUSPENDED,
    SP_SBX_RESUMING,
    SP_SBX_DELETED,
    SP_SBX_FAILED,
} sp_sbx_state_t;

const char *sp_sbx_state_name(sp_sbx_state_t s);
/* SP_SBX_NONE for an unknown name. */
sp_sbx_state_t sp_sbx_state_from_name(const char *name);

/* One row of the sandboxes projection. Strings are fixed-size: a row can be copied with `=`
 * except metadata_json and env_names_json, which are heap strings owned by the row. */
typedef struct {
    char id[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char template_[SP_ID_MAX + 1];
    char worker[SP_ID_MAX + 1];
    sp_sbx_state_t state;
    uint32_t timeout_s, vcpu, memory_mb;
    /* The disk limit its worker applied; before it started, what the create asked (0: the
     * worker's default). */
    uint32_t disk_mb;
    char *metadata_json;  /* JSON object text */
    char *env_names_json; /* JSON array text */
    char failure_reason[SP_REASON_MAX];
    int64_t created_at_us, started_at_us, updated_at_us, deleted_at_us; /* 0 = unset */
    /* Timeouts: the deadline (0 = none), what happens then, and idleness. */
    int64_t timeout_at_us;
    char on_timeout[16];      /* "delete" or "suspend" */
    uint32_t idle_suspend_s;  /* 0: the platform's default */
    int64_t last_activity_us; /* the first activity of its step (SP_ACTIVITY_GRAIN_US) */
    uint32_t version;         /* events that changed the row */
    uint64_t last_seq;        /* the last of them */
} sp_sandbox_t;

void sp_sandbox_init(sp_sandbox_t *s, const char *id);
void sp_sandbox_dispose(sp_sandbox_t *s);
/* Deep copy into an initialised or disposed dst. */
void sp_sandbox_copy(sp_sandbox_t *dst, const sp_sandbox_t *src);

/* Applies a validated sandbox event stored at stream sequence seq. */
int sp_reduce_sandbox(sp_sandbox_t *s, const sp_envelope_t *env, uint64_t seq,
                      char reason[SP_REASON_MAX]);

typedef struct {
    char id[SP_ID_MAX + 1];
    char host[SP_REASON_MAX];
    int up; /* 1 after a heartbeat, 0 after WorkerStopped */
    int known;
    uint32_t vcpu_total, vcpu_used, sandboxes_running, interval_ms;
    uint64_t memory_mb_total, memory_mb_used;
    uint64_t disk_mb_total, disk_mb_free, disk_mb_reserve; /* 0: not reported */
    uint32_t disk_mb_default;
    char *templates_json, *runtimes_json; /* JSON arrays, owned */
    char *pools_json; /* warm pools: JSON object template -> sandboxes ready, owned */
    char version_string[SP_ID_MAX + 1];
    int64_t last_heartbeat_us;
    uint32_t version;
    uint64_t last_seq;
} sp_worker_t;

void sp_worker_init(sp_worker_t *w, const char *id);
void sp_worker_dispose(sp_worker_t *w);
void sp_worker_copy(sp_worker_t *dst, const sp_worker_t *src);
int sp_reduce_worker(sp_worker_t *w, const sp_envelope_t *env, uint64_t seq,
                     char reason[SP_REASON_MAX]);

#endif
