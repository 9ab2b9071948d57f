/* space-eventlog internals: the batch store (eventlog_store.c) used by main.c. */
#ifndef SPACE_EVENTLOG_H
#define SPACE_EVENTLOG_H

#include <libpq-fe.h>
#include <stdint.h>

#include "bus.h"
#include "hash.h"
#include "projection.h"
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

typedef struct {
    uint64_t accepted, rejected, duplicates, skipped;
    uint64_t refused; /* of rejected: by the trust check (or, in log mode, only logged) */
} el_counts_t;

typedef struct {
    PGconn *db;
    sp_projection_t *proj;
    el_verify_t verify;
    /* keyring and signature cache (borrowed); placement is the store's own, from the
     * projection including the batch in progress. */
    sp_trust_t trust;
    /* Where the keyring comes from: re-read when a signer it does not know has a public key
     * there, so an identity added to a running deployment (space identity add) is known
     * without a restart. trust.keyring is owned by the store. */
    const char *keyring_dir;
    el_head_t head;
    el_counts_t counts;
    char last_error[256]; /* the database's message for the last failed store */
} el_store_t;

/* Reads the head from the events table. */
int el_store_load_head(el_store_t *st);

/* Stores messages (in stream order) in one transaction: every message with a sequence past
 * the head becomes one events row (accepted, or rejected with a reason) chained to the
 * previous one, except exact duplicates of an accepted event (same event_id, same bytes),
 * which are counted and skipped; with verification on they are stored rejected as replayed.
 * With verification on, signatures of the whole batch are checked before the transaction
 * starts (each distinct batch root once) and what the contract allows inside it, in stream
 * order, so a SandboxPlaced earlier in the batch counts for the worker facts after it. Projections
 * are updated in the same transaction. On success the head moves to the last sequence; on failure
 * nothing is stored, the head is unchanged and st->last_error says why. */
int el_store_msgs(el_store_t *st, const sp_bus_msg_t *const *msgs, size_t n);

/* Stores the whole batch; if the database refuses it while the connection is fine (a message
 * it cannot take), stores the messages one at a time and records each one the database still
 * refuses as rejected ("not storable: ..."), so one bad message can never stall the log. */
int el_store_batch(el_store_t *st, const sp_bus_batch_t *batch);

#endif
