/* Projections in PostgreSQL (tables sandboxes and workers), maintained by the reducers.
 *
 * A sp_projection_t is a write-back cache of the rows one transaction touches: load the rows a
 * batch of events needs (one query per table), apply the events in order (reduce.h), then flush
 * the changed rows (one upsert per table) inside the same transaction that stores the events.
 * After a rollback, clear it. After a commit, clear it too, unless the process is the tables'
 * only writer (the event log, under its writer lock): then sp_projection_retain keeps the
 * rows, which are then what the tables hold, and the next batch loads only the others.
 *
 * schema names where the tables live ("public" normally; replay rebuilds into a scratch
 * schema). Not thread-safe: one per thread.
 */
#ifndef SPACE_PROJECTION_H
#define SPACE_PROJECTION_H

#include <libpq-fe.h>
#include <stddef.h>

#include "reduce.h"

typedef struct sp_projection sp_projection_t;

/* The tables sp_projection_flush writes, each keyed by its text column "id". */
extern const char *const sp_projection_tables[];
extern const size_t sp_projection_n_tables;

sp_projection_t *sp_projection_new(const char *schema);
void sp_projection_free(sp_projection_t *p);
void sp_projection_clear(sp_projection_t *p);
/* After a commit that flushed every changed row: keeps the rows for the next transaction, or
 * clears them when any is still unflushed or there are more than max_rows. */
void sp_projection_retain(sp_projection_t *p, size_t max_rows);

/* Loads the rows for these aggregate ids that are not cached yet; ids absent from the table
 * become rows in state "none" (not existing). */
int sp_projection_load_sandboxes(sp_projection_t *p, PGconn *db, const char *const *ids, size_t n);
int sp_projection_load_workers(sp_projection_t *p, PGconn *db, const char *const *ids, size_t n);

/* Applies an event to its cached row (which must have been loaded, or the projection is
 * in-memory only, see below). Returns 0 or SP_ETRANSITION with a reason; on refusal the row is
 * unchanged. */
int sp_projection_apply(sp_projection_t *p, const sp_envelope_t *env, uint64_t seq,
                        char reason[SP_REASON_MAX]);

/* Writes every changed row (upsert). */
int sp_projection_flush(sp_projection_t *p, PGconn *db);

/* Read access to cached rows (NULL if not cached or not existing); borrowed until clear/free. */
const sp_sandbox_t *sp_projection_sandbox(sp_projection_t *p, const char *id);
const sp_worker_t *sp_projection_worker(sp_projection_t *p, const char *id);
/* Visits every existing cached sandbox in insertion order. */
void sp_projection_each_sandbox(sp_projection_t *p, void (*fn)(const sp_sandbox_t *s, void *arg),
                                void *arg);

#endif
