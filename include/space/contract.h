/* The bus contract beside proto/: who may say what, defined once (docs/trust.md).
 *
 * Three tables, compiled into libspace and read by both ends and by the NATS permission
 * generator (natsperm.h):
 *   - identity kinds (operator, gateway, ..., platform) and how an identity is named;
 *   - every subject on the bus (stream events and the core-NATS data plane), with the kinds
 *     that publish and subscribe each, either on any instance's subject or only on their own;
 *   - every event type (payload case of space.proto) with the kinds that may emit it.
 * Subject strings in daemons come from sp_subject_build, not from literals.
 *
 * The trust check (sp_trust_check, trust.h) applies these tables to a signed envelope.
 * Nothing here allocates; every function is thread-safe.
 */
#ifndef SPACE_CONTRACT_H
#define SPACE_CONTRACT_H

#include <stdbool.h>
#include <stddef.h>

#include "envelope.h"

typedef enum {
    SP_KIND_OPERATOR,  /* manages JetStream (streams, consumers); emits no events */
    SP_KIND_GATEWAY,   /* HTTP API: intents; data-plane requests to workers */
    SP_KIND_SCHEDULER, /* placement and controllers: SandboxPlaced, some intents and facts */
    SP_KIND_EVENTLOG,  /* reads everything, emits no events; publishes its signed checkpoints */
    SP_KIND_WORKER,    /* "worker-<id>": facts for the sandboxes placed on it */
    SP_KIND_EGRESSD,   /* "egressd-<id>" (id = its host's worker id): egress facts */
    SP_KIND_CREDSTORE, /* answers egressd's credential requests */
    SP_KIND_READER,    /* space-replay and other read-only tools */
    SP_KIND_PLATFORM,  /* "platform-<name>": an internal platform, intents for its tenants */
    SP_KIND__COUNT
} sp_kind_t;

#define SP_KIND_BIT(k) (1u << (unsigned)(k))
#define SP_KIND_ALL    ((1u << SP_KIND__COUNT) - 1)

/* "platform-" + a 64-byte id. */
#define SP_IDENTITY_MAX 80
#define SP_INSTANCE_MAX 64

/* An identity's name is its kind ("gateway"), optionally followed by "-<instance>"
 * ("gateway-2"); worker, egressd and platform identities require the instance, which is the
 * worker id (egressd: the worker id of its host) or the platform's name. The instance is a
 * valid id (ids.h), so the name is safe as a NATS user name, a subject token and a file name. */
typedef struct {
    sp_kind_t kind;
    char name[SP_IDENTITY_MAX + 1];
    char instance[SP_INSTANCE_MAX + 1]; /* "" when there is none */
} sp_identity_t;

/* "gateway", "worker", ...; NULL for a value out of range. */
const char *sp_kind_name(sp_kind_t k);
/* Parses an identity name. -EINVAL when it is not one (unknown kind, missing or bad instance,
 * too long). ret is written only on success. */
int sp_identity_parse(const char *name, sp_identity_t *ret);
/* Writes "<kind>[-<instance>]" into ret (instance NULL or "" for none), checking it parses. */
int sp_identity_format(sp_kind_t kind, const char *instance, sp_identity_t *ret);

/* ---- subjects ---- */

typedef enum {
    SP_SUBJ_EV_SBX,          /* space.ev.sbx.{worker}.{sandbox}.{type} */
    SP_SUBJ_EV_IO,           /* space.ev.io.{worker}.{sandbox}.{type} */
    SP_SUBJ_EV_WKR,          /* space.ev.wkr.{worker}.{type} */
    SP_SUBJ_EV_EGRESS,       /* space.ev.egress.{sandbox}.{type} */
    SP_SUBJ_EV_CRED,         /* space.ev.cred.{tenant}.{type} */
    SP_SUBJ_IO_EXEC,         /* space.io.wkr.{worker}.exec */
    SP_SUBJ_IO_CTL,          /* space.io.wkr.{worker}.ctl */
    SP_SUBJ_IO_FILE,         /* space.io.wkr.{worker}.file */
    SP_SUBJ_IO_WATCH,        /* space.io.wkr.{worker}.watch */
    SP_SUBJ_IO_METRICS,      /* space.io.wkr.{worker}.metrics: a sandbox's usage samples */
    SP_SUBJ_IO_CMD,          /* space.io.cmd.{cmd}.{part}: start, out, exit */
    SP_SUBJ_IO_WATCH_EV,     /* space.io.watch.{watch}.{part}: ev, end */
    SP_SUBJ_IO_EGRESS_RST,   /* space.io.egress.{worker}.reset */
    SP_SUBJ_IO_CRED_ADMIN,   /* space.io.cred.admin: the gateway's credential calls */
    SP_SUBJ_IO_CRED_LOOKUP,  /* space.io.cred.lookup: egressd asks for a request's credentials */
    SP_SUBJ_IO_CRED_CHANGED, /* space.io.cred.changed: caches emptied at once */
    SP_SUBJ_IO_CRED_DATAKEY, /* space.io.cred.datakey: a worker asks for a sandbox's data key */
    SP_SUBJ_CKPT,            /* space.ckpt.log: the event log's signed checkpoints (checkpoint.h),
                                stored in their own stream SP_CKPT_STREAM */
    SP_SUBJ__COUNT
} sp_subject_id_t;

typedef struct {
    const char *name;    /* short name for docs and tools: "ev.sbx", "io.exec" */
    const char *pattern; /* tokens; "{x}" is a placeholder for one token */
    const char *what;
    sp_subject_id_t id;
    /* Kinds that publish / subscribe on any instance's subject, and kinds that may only use
     * the subject whose {worker} token is their own instance. Stream subjects have no core
     * subscribers: they are read through JetStream consumers (sp_contract_consumers), and
     * their publishers are those of each event type (sp_event_emitters), so they are 0 here. */
    unsigned pub_any, pub_own;
    unsigned sub_any, sub_own;
    bool stream;  /* stored in SP_BUS_STREAM (else core NATS, never stored) */
    bool request; /* request/reply: subscribers answer on the request's reply subject */
} sp_subject_t;

/* The table, indexed by sp_subject_id_t. */
const sp_subject_t *sp_subject(sp_subject_id_t id);

/* Builds a subject from the pattern: args fill the placeholders in order. When args run out
 * (a NULL arg, or fewer given), the rest of the pattern from that placeholder on becomes ">",
 * which makes a subscription filter: sp_subject_build(b, n, SP_SUBJ_EV_SBX, "w1", NULL) is
 * "space.ev.sbx.w1.>". "_" is accepted as an arg (the unplaced worker); every other arg must
 * be a valid subject token (no '.', '*', '>', space or control bytes, at most 128 bytes).
 * Returns the length, -EINVAL for a bad token, -ENOBUFS when buf is too small. */
int sp_subject_build(char *buf, size_t len, sp_subject_id_t id, const char *a0, const char *a1,
                     const char *a2);
/* Whether subject (a concrete one, no wildcards) matches the pattern of id; if it does and
 * the pattern has a {worker} token, that token is copied into worker (SP_INSTANCE_MAX+1). */
bool sp_subject_match(sp_subject_id_t id, const char *subject, char worker[SP_INSTANCE_MAX + 1]);

/* A JetStream durable consumer of SP_BUS_STREAM and who reads through it. */
typedef struct {
    const char *durable; /* "{worker}" is the reading identity's instance */
    const char *filter;
    sp_kind_t kind;
    bool recreated;  /* sp_bus_consumer_open (deleted and created on start) vs _bind */
    bool pushed;     /* sp_bus_consumer_push: delivered into the reader's inbox (recreated) */
    int ack_wait_ms; /* the reader's default --ack-wait-ms, for the operator's creation */
} sp_consumer_def_t;

/* The durables of the contract; *ret_n gets their number. */
const sp_consumer_def_t *sp_contract_consumers(size_t *ret_n);
/* Whether subject (concrete) is a stream subject that only the event log reads: no durable of
 * another reader covers it (their {placeholders} taken as any token). Producers sign such
 * events as headed batches (sign.h), which only the log can verify. */
bool sp_subject_log_only(const char *subject);

/* The JetStream object store bucket of the workers' snapshots (objstore.h; the worker's
 * --snapshot-bucket default): stream "OBJ_" SP_SNAPSHOT_BUCKET, subjects $O.<bucket>.>. Workers
 * read, write and purge it; only the operator creates it (a worker allowed to create streams
 * could capture any subject, the data plane included). */
#define SP_SNAPSHOT_BUCKET "space-snapshots"

/* Named snapshots (docs/snapshots.md): ids are "snp_" + 26 chars (sp_snapshot_id_new), a
 * name is 1..SP_SNAPSHOT_NAME_MAX printable ASCII characters. Their artifacts are under
 * SP_SNAPSHOT_KEY_PREFIX "/<snapshot id>/" in the snapshot store, apart from the suspends'
 * "<sandbox>/<snapshot>/" (the store's sweep never takes them: they live until deleted). */
#define SP_SNAPSHOT_NAME_MAX   64
#define SP_SNAPSHOT_KEY_PREFIX "named"
#define SP_SNAPSHOT_ID_LEN     30
/* A fork (POST /v1/sandboxes/{id}/fork {"count"}): one checkpoint, then this many creates from
 * it at most. */
#define SP_FORK_COUNT_MAX 16
void sp_snapshot_id_new(char out[SP_SNAPSHOT_ID_LEN + 1]);
bool sp_snapshot_id_valid(const char *s);
bool sp_snapshot_name_valid(const char *s);

/* The error of the IoExit a worker makes up for each command still running when its sandbox
 * is deleted: the gateway reads it to end an E2B stream as E2B does then (the connection drops,
 * gateway_commands.c). */
#define SP_CMD_ERROR_SANDBOX_DELETED "sandbox deleted"

/* The usage samples a worker keeps per sandbox (an hour at its 5 s default sample-ms) and so
 * the most a MetricsReply carries (proto/dataplane.proto): the gateway refuses a reply with
 * more. */
#define SP_METRICS_SAMPLES_MAX 720

/* ---- event types ---- */

/* The stream subject an event type is published on (SP_SUBJ_EV_SBX, _IO, _WKR, _EGRESS);
 * SP_SUBJ__COUNT for an unknown type. */
sp_subject_id_t sp_event_subject_id(sp_event_type_t t);

/* The event type an event subject names by its last token, read before the message is decoded
 * (the event log's linger); SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET when the subject is not on
 * that type's stream subject. A hint only: what is stored is checked against the envelope. */
sp_event_type_t sp_subject_event_type(const char *subject);

/* Mask of the kinds that may emit this event type; 0 for an unknown type. */
unsigned sp_event_emitters(sp_event_type_t t);

/* The machine-readable name of a trust refusal code (SP_EUNSIGNED ... SP_ETENANT, error.h):
 * "unsigned", "unknown_signer", "bad_signature", "type_not_allowed", "not_own",
 * "tenant_not_allowed"; NULL for any other code. For "...Rejected" records and metrics. */
const char *sp_trust_refusal_name(int code);

#endif
