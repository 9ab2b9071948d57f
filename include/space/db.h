/* PostgreSQL access (libpq) and the schema migrations every daemon applies at start.
 *
 * Migrations live in lib/db_migrations.c as an ordered list; sp_db_migrate applies the missing
 * ones in one transaction each, under an advisory lock so concurrent starters do not race, and
 * records them in schema_migrations. A migration, once released, is never edited: add a new one.
 */
#ifndef SPACE_DB_H
#define SPACE_DB_H

#include <libpq-fe.h>
#include <stdint.h>

#include "envelope.h"

/* The channel space-eventlog NOTIFYs with the new head stream_seq (decimal text) at every
 * commit: LISTEN on it to wait until the projections include a given event. */
#define SP_EVENTLOG_CHANNEL "space_eventlog_head"
/* The channel a trigger on sandboxes NOTIFYs with a sandbox id whenever that sandbox's state or
 * worker changes or its row goes (migration 11): a cache of where sandboxes run listens. */
#define SP_SANDBOX_CHANNEL "space_sandbox_moved"

/* Connects (retrying for up to timeout_ms while the server starts) and sets
 * application_name. url is a libpq connection string or URI. Errors: SP_EDB, SP_ETIMEOUT. */
int sp_db_connect(const char *url, const char *application_name, int timeout_ms, PGconn **ret_conn);
/* Idle connections kept between short uses, for a daemon whose threads each need a connection
 * now and then (the worker's resume reads its snapshot's record: a new connection cost 19.6 ms
 * on the test machines, a query on an open one 0.06 ms). Thread-safe. sp_db_idle_take gives
 * an idle connection after one empty round trip proves it alive (one the server dropped, by a
 * restart or pg_terminate_backend, is closed and the next tried), else a new one
 * (sp_db_connect with timeout_ms). sp_db_idle_give takes it back: kept when it is healthy and
 * outside a transaction and fewer than keep are idle, else closed; NULL is ignored. */
typedef struct sp_db_idle sp_db_idle_t;
sp_db_idle_t *sp_db_idle_new(const char *url, const char *application_name, size_t keep);
int sp_db_idle_take(sp_db_idle_t *idle, int timeout_ms, PGconn **ret_conn);
void sp_db_idle_give(sp_db_idle_t *idle, PGconn *conn);
/* Closes the idle connections (those taken must have been given back or closed). */
void sp_db_idle_free(sp_db_idle_t *idle);

/* Applies pending migrations. Returns the schema version now in force. */
int sp_db_migrate(PGconn *conn);
/* Creates schema and applies every migration inside it: a scratch copy of the tables, made by
 * the same DDL (space-replay rebuilds the projections there). Run it inside a transaction;
 * the session's search_path is as before on return. Errors: SP_EDB (the schema exists, ...). */
int sp_db_create_schema(PGconn *conn, const char *schema);
/* The highest migration version compiled in. */
int sp_db_schema_version(void);

/* Runs one statement without parameters and checks its status (COMMAND_OK or TUPLES_OK). */
int sp_db_exec(PGconn *conn, const char *sql);
/* PQexecParams for a statement run again and again on one connection (the event log's store
 * path): prepared on conn the first time, then executed by name, so PostgreSQL neither parses
 * nor (once it keeps a generic plan) plans it per call. params are text; the result is the
 * caller's to check and clear, as PQexecParams's (a PREPARE that fails is returned as the
 * statement's failure, as running it would have failed). Statements with parameters only. */
PGresult *sp_db_exec_prepared(PGconn *conn, const char *sql, int nparams, const char *const *params,
                              int result_format);
/* 0 when res has status expected (TUPLES_OK also satisfies COMMAND_OK), else SP_EDB; res is
 * not cleared. The error text stays in the connection (PQerrorMessage). */
int sp_db_check(PGresult *res, ExecStatusType expected);

/* The newest accepted event of type (its name, "SandboxSuspended") on sandbox id, decoded and
 * checked like any event from the log (envelope.h; free with sp_envelope_free).
 * SP_ENOTFOUND when there is none or it does not decode; SP_EDB. */
int sp_db_last_sandbox_event(PGconn *conn, const char *id, const char *type,
                             sp_envelope_t **ret_event);

/* Named snapshots (docs/snapshots.md) are read from the log itself: the tenant's accepted
 * SandboxSnapshotted events, less those a SnapshotDeleted names (or being deleted: a
 * SnapshotDeleteRequested, so that nothing starts from a snapshot whose artifacts go).
 * sp_db_snapshot_each calls fn with every live one of tenant, oldest first (a non-zero return
 * stops); sp_db_snapshot_find gets one (SP_ENOTFOUND: none of that tenant, or deleted). The
 * events are decoded and checked like any event from the log. */
int sp_db_snapshot_each(PGconn *conn, const char *tenant,
                        int (*fn)(void *arg, const sp_envelope_t *snapshotted, int64_t at_us),
                        void *arg);
int sp_db_snapshot_find(PGconn *conn, const char *tenant, const char *snapshot_id,
                        sp_envelope_t **ret_snapshotted);

/* The worker that took snapshot_id of sandbox (the tenant's): its accepted SandboxSnapshotted,
 * whether the snapshot was deleted since or not. 1 and the worker's id, 0 when there is none,
 * SP_EDB. The eventlog's sp_trust_snapshot_fn (trust.h). */
int sp_db_snapshot_taker(PGconn *conn, const char *tenant, const char *sandbox,
                         const char *snapshot_id, char *worker, size_t worker_len);

/* Whether the log holds a delete (SnapshotDeleteRequested or SnapshotDeleted) of snapshot_id
 * of sandbox: 1 yes, 0 no, SP_EDB. (By the sandbox's events: indexed, any tenant.) */
int sp_db_snapshot_deleted(PGconn *conn, const char *sandbox, const char *snapshot_id);

/* Whether worker is live: up in the log (no WorkerStopped since its start, which the
 * lost-worker controller also publishes) with a heartbeat within three of its intervals. 1
 * yes, 0 no (or unknown), SP_EDB. One definition for the gateway (where a snapshot delete goes)
 * and the event log (who may say it is done, trust.h worker_live). */
int sp_db_worker_live(PGconn *conn, const char *worker);
/* The live worker with the latest heartbeat: 1 and its id in out, 0 when none is, SP_EDB. */
int sp_db_live_worker(PGconn *conn, char *out, size_t len);

/* The stream sequence at which the log accepted event_id: 1 and *ret_seq, 0 when it has no
 * accepted row of it, < 0 on failure. The lookup of sp_verifier_once (verifier.h), with the
 * connection as arg. */
int sp_db_accepted_seq(void *conn, const char *event_id, uint64_t *ret_seq);

/* The log's head: the highest stream sequence stored (0 when empty). 0 or SP_EDB. */
int sp_db_log_head(PGconn *conn, uint64_t *ret_seq);

/* Big-endian int8 for binary parameters. */
void sp_db_put_i64(char out[8], int64_t v);
int64_t sp_db_get_i64(const char *in);

#endif
