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
} el_store_t;

/* Reads the head from the events table. */
int el_store_load_head(el_store_t *st);

/* Stores a batch in one transaction: every message with a sequence past the head becomes one
 * events row (accepted, or rejected with a reason) chained to the previous one, except exact
 * duplicates of an accepted event (same event_id, same bytes), which are counted and skipped.
 * Projections are updated in the same transaction. On success the head moves to the batch's
 * last sequence; on failure nothing is stored and the head is unchanged. */
int el_store_batch(el_store_t *st, const sp_bus_batch_t *batch);

#endif
