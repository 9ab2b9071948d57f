/* space-eventlog internals: the batch store (eventlog_store.c) used by main.c. */
#ifndef SPACE_EVENTLOG_H
#define SPACE_EVENTLOG_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "hash.h"
#include "metrics.h"
#include "projection.h"
#include "sighead.h"
#include "sign.h"
#include "trust.h"

/* What the log does with envelope signatures (config verify-signatures, docs/trust.md). */
typedef enum {
    EL_VERIFY_OFF, /* store as before: signatures are not looked at */
    EL_VERIFY_ON,  /* refused messages (sp_trust_check) are stored rejected with the reason */
    EL_VERIFY_LOG, /* verify and log refusals, but store as if off (a migration aid) */
} el_verify_t;

/* Where the log ends: the last stored stream sequence and its hash (genesis when empty). */
typedef struct {
    uint64_t seq;
    uint8_t hash[SP_SHA256_LEN];
} el_head_t;

/* Why a row was stored rejected, in classes (the reason itself is in the row): the label of
 * space_eventlog_rejected_total (docs/metrics.md). */
typedef enum {
    EL_REJ_INVALID,    /* undecodable, or the subject does not match the envelope */
    EL_REJ_REFUSED,    /* the trust check (signature, signer, placement) */
    EL_REJ_DUPLICATE,  /* an exact copy of an accepted event (a retry or a replay) */
    EL_REJ_REUSED_ID,  /* an event_id already used for other content */
    EL_REJ_CONTRACT,   /* the projection refused it (contract.h: a transition not allowed) */
    EL_REJ_UNSTORABLE, /* the database refused the message: stored as rejected, undecoded */
    EL_REJ_PLAINTEXT,  /* seal-output: user content in plaintext (docs/audit.md) */
    EL_REJ_CLASSES,
} el_reject_class_t;
extern const char *const el_reject_class_names[EL_REJ_CLASSES];

typedef struct {
    uint64_t accepted, rejected, duplicates, skipped;
    uint64_t rejected_by[EL_REJ_CLASSES]; /* of rejected */
    uint64_t sig_verified, sig_failed;    /* signature verdicts on stored rows (verify on/log) */
    uint64_t refused; /* of rejected: by the trust check (or, in log mode, only logged) */
    uint64_t lost;    /* stream sequences the stream no longer held (SP_CHAIN_LOST_PREFIX) */
    uint64_t rows;    /* rows written */
} el_counts_t;

typedef struct {
    PGconn *db;
    sp_projection_t *proj;
    el_verify_t verify;
    /* Refuse user content in plaintext that the workers and gateways seal (seal-output,
     * sp_envelope_plaintext_content): stored rejected with the reason. */
    bool seal_output;
    /* keyring and signature cache (borrowed); placement is the store's own, from the
     * projection including the batch in progress. */
    sp_trust_t trust;
    /* Where the keyring comes from: re-read when a signer it does not know has a public key
     * there, so an identity added to a running deployment (space identity add) is known
     * without a restart. trust.keyring is owned by the store. */
    const char *keyring_dir;
    el_head_t head;
    uint64_t rows;        /* rows of events up to head (the checkpoints' row count) */
    uint64_t verify_from; /* the first seq this process stored verifying signatures; 0: none */
    struct el_ckpt *ckpt; /* the checkpointer (NULL: no checkpoints) */
    /* Heads of headed batches accepted lately (sighead.h): their members are verified against
     * them in the storing transaction, in stream order. */
    sp_sighead_ring_t heads;
    el_counts_t counts;
    char last_error[256]; /* the database's message for the last failed store */
} el_store_t;

/* One fetched message as the verifier pool prepared it (eventlog_verify.c), before any
 * transaction: decoded, its subject checked and, with verification on, its signature
 * verified. Read-only for the store, which may try a batch more than once. */
typedef struct {
    const sp_bus_msg_t *msg;
    sp_envelope_t *env; /* NULL when undecodable or invalid (rc < 0) */
    int rc;             /* decode or subject check: 0, or < 0 and reason says why */
    int sig_rc;         /* sp_trust_verify's result (0 when verification is off) */
    /* sig_rc SP_EHEADED (a headed batch's member): its leaf, for the store to find in the
     * list of its head (sighead.h), which may be earlier in this very batch. */
    uint8_t leaf[SP_SIG_HASH_LEN];
    char reason[SP_REASON_MAX];
} el_prep_t;

/* A fetched batch and what the pool made of it. Owned by the consuming thread. */
typedef struct {
    sp_bus_batch_t *batch;
    el_prep_t *items;
    size_t n;
} el_batch_t;

/* Takes a fetched batch (*batch is set to NULL); nothing prepared yet. */
el_batch_t *el_batch_new(sp_bus_batch_t **batch);
/* Frees the envelopes and the bus batch (unacknowledged messages are redelivered). NULL ok. */
void el_batch_free(el_batch_t *b);

/* The verifier pool: threads that prepare the next fetched batch while the consuming thread
 * stores the current one in PostgreSQL (the contract check stays in the storing transaction,
 * in stream order). One job at a time; every call is from the consuming thread. */
typedef struct el_pool el_pool_t;
/* threads: 1..64. */
int el_pool_new(size_t threads, el_pool_t **ret_pool);
/* Stops the threads; a job in progress is finished first. NULL ok. */
void el_pool_free(el_pool_t *p);
/* Starts preparing b's messages on the pool and returns at once. trust NULL: signatures are
 * not verified. trust (its keyring and cache) and b must stay valid and unchanged until
 * el_pool_wait returns. */
void el_pool_start(el_pool_t *p, el_batch_t *b, const sp_trust_t *trust);
/* Helps with the job and returns once every message of it is prepared. */
void el_pool_wait(el_pool_t *p);
/* Prepares one message on the calling thread: what a pool thread does for each. */
void el_prep_one(el_prep_t *it, const sp_trust_t *trust);
/* Its signature's part of that, for a decoded message: sig_rc, reason and, for a headed
 * batch's member, its leaf. */
void el_prep_verify(el_prep_t *it, const sp_trust_t *trust);

/* After el_pool_wait, on the consuming thread: a signer the keyring did not know but whose
 * public key is now in keyring_dir makes the store read the directory again and verify
 * those messages once more. */
void el_store_recheck_signers(el_store_t *st, el_batch_t *b);

/* Reads the head from the events table. */
int el_store_load_head(el_store_t *st);

/* Stores prepared messages (in stream order) in one transaction: every message with a sequence
 * past the head becomes one events row (accepted, or rejected with a reason) chained to the
 * previous one (chain v2, hash.h); exact duplicates of an accepted event (same event_id, same
 * bytes) are counted and stored rejected (as replayed when verification is on). Sequences the
 * stream skipped (its limits dropped them before the log asked) get one "lost" row.
 * Signatures were verified by the pool (each distinct batch root once); what the contract
 * allows is checked here, inside the transaction and in stream order, so a SandboxPlaced
 * earlier in the batch counts for the worker facts after it. Projections are updated in the
 * same transaction. On success the head moves to the last sequence; on failure nothing is
 * stored, the head is unchanged and st->last_error says why. */
int el_store_msgs(el_store_t *st, const el_prep_t *items, size_t n);

/* Stores the whole prepared batch; if the database refuses it while the connection is fine (a
 * message it cannot take), stores the messages one at a time and records each one the
 * database still refuses as rejected ("not storable: ..."), so one bad message can never
 * stall the log. */
int el_store_batch(el_store_t *st, const el_batch_t *b);

/* The checkpointer (eventlog_ckpt.c, docs/audit.md): a thread that signs the committed head
 * every every_events rows or interval_ms (whichever comes first, only when the head moved)
 * and publishes it to SP_CKPT_STREAM, then appends it to file. */
typedef struct el_ckpt el_ckpt_t;
typedef struct {
    int64_t every_events;     /* 0: not by count */
    int64_t interval_ms;      /* 0: not by time */
    const char *file;         /* NULL or "": no file */
    const char *signer;       /* the eventlog's identity (borrowed) */
    const sp_sign_key_t *key; /* its signing key (borrowed) */
    sp_bus_t *bus;            /* borrowed; published from the checkpointer's thread */
} el_ckpt_opts_t;
/* Starts the thread; the file is opened (made, with its directory) here: a negative errno when
 * it cannot be. */
int el_ckpt_new(const el_ckpt_opts_t *o, el_ckpt_t **ret);
/* On the consuming thread, after a commit: the head now (NULL k: nothing). */
void el_ckpt_note(el_ckpt_t *k, uint64_t seq, uint64_t rows, const uint8_t head[SP_SHA256_LEN],
                  uint64_t verify_from);
/* Checkpoints published so far. */
uint64_t el_ckpt_made(el_ckpt_t *k);
/* Publishes a checkpoint of the last head noted if none covers it (one try), stops the thread
 * and closes the file. NULL ok. */
void el_ckpt_free(el_ckpt_t *k);

/* The log's metric families (eventlog_metrics.c, docs/metrics.md). */
typedef struct {
    sp_bus_t *bus; /* for the lag, read at scrape */
    sp_metric_t *events, *rejected, *signatures, *batch, *store, *stored_seq, *stream_seq, *lag,
        *lingers;
} el_metrics_t;
/* Adds the families to reg and its collect callback; -1 on a programming error. */
int el_metrics_init(el_metrics_t *m, sp_metrics_t *reg, sp_bus_t *bus);
/* After a committed batch of n messages that took seconds: the counters from st->counts.
 * Consuming thread only. */
void el_metrics_stored(el_metrics_t *m, const el_store_t *st, size_t n, double seconds);

#endif
