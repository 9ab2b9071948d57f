/* space-eventlog internals: the batch store (eventlog_store.c) used by main.c. */
#ifndef SPACE_EVENTLOG_H
#define SPACE_EVENTLOG_H

#include <libpq-fe.h>
#include <stdint.h>

#include "bus.h"
#include "hash.h"
#include "projection.h"

/* Where the log ends: the last stored stream sequence and its hash (genesis when empty). */
typedef struct {
    uint64_t seq;
    uint8_t hash[SP_SHA256_LEN];
} el_head_t;

typedef struct {
    uint64_t accepted, rejected, duplicates, skipped;
} el_counts_t;

typedef struct {
    PGconn *db;
    sp_projection_t *proj;
    el_head_t head;
    el_counts_t counts;
    char last_error[256]; /* the database's message for the last failed store */
} el_store_t;

/* Reads the head from the events table. */
int el_store_load_head(el_store_t *st);

/* Stores messages (in stream order) in one transaction: every message with a sequence past
 * the head becomes one events row (accepted, or rejected with a reason) chained to the
 * previous one, except exact duplicates of an accepted event (same event_id, same bytes),
 * which are counted and skipped. Projections are updated in the same transaction. On success
 * the head moves to the last sequence; on failure nothing is stored, the head is unchanged
 * and st->last_error says why. */
int el_store_msgs(el_store_t *st, const sp_bus_msg_t *const *msgs, size_t n);

/* Stores the whole batch; if the database refuses it while the connection is fine (a message
 * it cannot take), stores the messages one at a time and records each one the database still
 * refuses as rejected ("not storable: ..."), so one bad message can never stall the log. */
int el_store_batch(el_store_t *st, const sp_bus_batch_t *batch);

#endif
