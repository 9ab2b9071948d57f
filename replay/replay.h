/* space-replay: subcommands over the event log, and what they share (replay_log.c).
 *
 * Exit codes, for every subcommand:
 *   0  done: the chain is intact (verify), the projections match the log (rebuild)
 *   1  usage or database error (a message on stderr)
 *   2  the log disagrees with itself: a broken chain or an accepted event whose signature
 *      does not verify (verify), an accepted event that does not decode or that the reducers
 *      now refuse (timeline, state)
 *   3  rebuild: the rebuilt projections differ from the live ones (each difference printed)
 */
#ifndef SPACE_REPLAY_H
#define SPACE_REPLAY_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "envelope.h"

enum {
    REPLAY_OK = 0,
    REPLAY_EUSAGE = 1,
    REPLAY_EBROKEN = 2,
    REPLAY_EDIFF = 3,
};

typedef struct {
    char *pg_url;
    bool json;
    char *sandbox;
    int64_t page;
    /* export */
    int64_t since, until; /* stream_seq bounds, inclusive; 0 = none */
    char *tenant;
    char *type;
    /* state */
    char *at;
    int64_t at_seq;
    bool all;
    /* rebuild */
    char *schema;
    bool keep;
    /* verify: the identities' public keys (default $SPACE_HOME/creds) */
    char *keyring_dir;
    /* verify's anchors (docs/audit.md): the bus (empty: the file only) as identity (reader)
     * with the credentials of creds-dir, the checkpoint file (default
     * $SPACE_HOME/audit/checkpoints.log when it exists), how long to wait for the log to store
     * what the stream holds, and how many rows past the last checkpoint to compare with the
     * stream's messages. */
    char *nats_url;
    char *identity;
    char *creds_dir;
    char *checkpoint_file;
    int64_t wait_s;
    int64_t tail_max;
    /* timeline, export: open sealed output (replay_datakey.c) */
    bool decrypt;
    char *master_key_file;
} replay_config_t;

/* The checks of a subcommand's options, run before connecting: 0, or REPLAY_EUSAGE after
 * saying on stderr what is wrong. The subcommands assume their check passed. */
int replay_check_filters(const replay_config_t *cfg); /* export */
/* Says on stderr that --option value (escaped) is bad and why; returns REPLAY_EUSAGE. */
int replay_bad_option(const char *option, const char *value, const char *what);
int replay_state_check(const replay_config_t *cfg);
int replay_rebuild_check(const replay_config_t *cfg);

int replay_verify(PGconn *db, const replay_config_t *cfg);
int replay_timeline(PGconn *db, const replay_config_t *cfg);
int replay_export(PGconn *db, const replay_config_t *cfg);
int replay_state(PGconn *db, const replay_config_t *cfg);
int replay_rebuild(PGconn *db, const replay_config_t *cfg);
int replay_forget_check(const replay_config_t *cfg);
int replay_forget(PGconn *db, const replay_config_t *cfg);

/* Sealed output (replay_datakey.c): the data keys, loaded when cfg->decrypt (else *ret is
 * NULL): 0, or -1 after saying why on stderr. */
typedef struct replay_keys replay_keys_t;
int replay_keys_open(PGconn *db, const replay_config_t *cfg, replay_keys_t **ret);
void replay_keys_close(replay_keys_t *k);
/* Appends the fields a row shows beside its payload, as `,"name":value` (json) or `  name=value`:
 * "output" for a CommandOutput, "cmdline" for a CommandStarted with a sealed command line,
 * "paths" for a file event with sealed paths, and for a short command's CommandExited with
 * its start and output inside, "cmdline" and "output" (an array, one per output entry). Each
 * value is JSON: the output text, the command line (argv as an array, a cmd as a string), the
 * paths ({"path", "to"}) once opened; "<encrypted N bytes>" without keys; "<forgotten: N
 * bytes>", "<no data key: N bytes>", "<does not open: N bytes>". Nothing for other events. */
void replay_sealed_append(replay_keys_t *k, const char *sandbox, const sp_envelope_t *e, bool json,
                          sp_buf_t *out);

/* Which stored events a walk visits. Strings are borrowed; NULL or "" = any. */
typedef struct {
    uint64_t since, until; /* inclusive stream_seq bounds; 0 = none */
    const char *tenant;
    const char *aggregate_kind; /* "sandbox", "worker" */
    const char *aggregate_id;
    const char *type;
    bool accepted_only;
} replay_filter_t;

/* One stored event. Text columns are NULL where the row has NULL (a row whose payload did not
 * decode has no envelope columns). Everything is borrowed for the duration of the callback. */
typedef struct {
    uint64_t seq;
    bool accepted;
    const char *status; /* the column as stored: "accepted", "rejected" */
    const char *reject_reason;
    const char *subject;
    const char *event_id, *type, *aggregate_kind, *aggregate_id, *tenant, *actor;
    const char *correlation_id, *causation_id;
    bool has_occurred_at;
    int64_t occurred_at_us, stored_at_us;
    /* The stream's timestamp of the message: when a retired key's signature counts
     * (sp_envelope_verify). Not in the hash chain; it only ever decides for rows the log
     * accepted, which it verified at the same time. */
    int64_t published_at_us;
    bool has_schema_version;
    int64_t schema_version;
    bool hashes_ok; /* prev_hash and hash are 32 bytes each (else they read as zero) */
    /* A rejected message cut to its first 64 KiB: its whole size and SHA-256. */
    bool has_payload_size, has_payload_sha;
    uint8_t prev_hash[32], hash[32], payload_sha[32];
    const uint8_t *payload;
    size_t payload_len;
    int64_t payload_size;
    int64_t chain_v;    /* 1: hash = SHA-256(prev || payload); 2: hash.h's chain v2 */
    sp_envelope_t *env; /* decoded and validated payload, NULL when it is not */
    char decode_error[SP_REASON_MAX];
} replay_event_t;

/* Called once per page of at most `page` events, in stream order; a negative return stops the
 * walk and is returned by replay_walk. */
typedef int (*replay_page_fn)(replay_event_t *events, size_t n, void *arg);

/* Visits the events f selects, in stream_seq order, `page` rows per query (keyset paging, so
 * memory stays constant whatever the log's size). Run it inside a REPEATABLE READ transaction
 * to see one snapshot. Returns 0, the callback's negative return, or SP_EDB (the message is
 * in PQerrorMessage(db)). */
int replay_walk(PGconn *db, const replay_filter_t *f, int64_t page, replay_page_fn fn, void *arg);

/* Starts the snapshot a subcommand reads (and, for rebuild, writes) in. */
int replay_begin(PGconn *db, bool read_only);

/* RFC 3339 UTC with microseconds ("2026-11-30T11:09:00.123456Z") of microseconds since the
 * epoch, into out (at least 32 bytes). */
void replay_format_time(char *out, size_t len, int64_t us);
/* Strict RFC 3339 date-time (section 5.6: "T" or "t", fraction optional, "Z" or an offset),
 * or "now", into microseconds since the epoch. -EINVAL otherwise. */
int replay_parse_time(const char *s, int64_t *ret_us);

#endif
