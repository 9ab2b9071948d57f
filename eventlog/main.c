/* space-eventlog: the durable consumer of SPACE_EVENTS that appends every message to the
 * PostgreSQL event log, hash-chained, and keeps the projections in step (DESIGN.md, eventlog/).
 *
 * Exactly-once without trusting the consumer's delivery state: the position lives in
 * PostgreSQL (the last stored stream sequence), written in the same transaction as the rows.
 * At start, and after any failure, the durable consumer is recreated to start right after that
 * position, so messages arrive in stream order with nothing pending; a message at or below it
 * (a redelivery) is acknowledged and skipped. One writer at a time: a session advisory lock;
 * a second instance waits as a hot standby.
 *
 * Trust (docs/trust.md): with verify-signatures on, every message passes sp_trust_check against
 * the keyring of keyring-dir before it becomes an accepted row; refused ones are stored
 * rejected with the refusal's name. The default, auto, is on only when keyring-dir exists, so
 * a stack whose producers do not sign yet keeps working: the start line says which it is. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bus.h"
#include "busid.h"
#include "checkpoint.h"
#include "config.h"
#include "daemon.h"
#include "db.h"
#include "error.h"
#include "eventlog.h"
#include "ids.h"
#include "log.h"
#include "sign.h"
#include "xmalloc.h"

/* pg_advisory_lock key held by the active writer: "SPACELOG" as an int8. */
#define WRITER_LOCK_KEY "6003360185432762183"

typedef struct {
    char *nats_url;
    char *nats_user;
    char *nats_password;
    char *identity;
    char *creds_dir;
    char *pg_url;
    char *durable;
    int64_t batch_max;
    int64_t fetch_timeout_ms;
    int64_t linger_ms;
    int64_t ack_wait_ms;
    int64_t stats_interval_s;
    char *log_level;
    char *log_format;
    char *keyring_dir;
    char *verify_signatures;
    int64_t sig_cache_slots;
    int64_t verify_threads;
    int64_t checkpoint_events;
    int64_t checkpoint_ms;
    char *checkpoint_file;
    bool seal_output;
    bool synchronous_commit;
    char *metrics_addr; /* metrics.h */
    char *metrics_port_file;
} el_config_t;

static const sp_cfg_opt_t options[] = {
    SP_METRICS_CFG_OPTS(el_config_t, metrics_addr, metrics_port_file),
    SP_CFG_STR_OPT("nats-url", el_config_t, nats_url, "nats://127.0.0.1:4222",
                   "NATS server URL(s)"),
    SP_CFG_STR_OPT("nats-user", el_config_t, nats_user, NULL, "NATS user"),
    SP_CFG_STR_OPT("nats-password", el_config_t, nats_password, NULL, "NATS password"),
    SP_BUSID_CFG_OPTS(el_config_t, identity, creds_dir),
    SP_CFG_STR_OPT("pg-url", el_config_t, pg_url, "postgresql:///space", "PostgreSQL URI"),
    SP_CFG_STR_OPT("durable", el_config_t, durable, "eventlog", "JetStream durable name"),
    SP_CFG_INT_OPT("batch-max", el_config_t, batch_max, 1, 10000, "1000",
                   "most events stored per transaction"),
    SP_CFG_INT_OPT("fetch-timeout-ms", el_config_t, fetch_timeout_ms, 1, 60000, "1000",
                   "longest wait for the next batch"),
    SP_CFG_INT_OPT("linger-ms", el_config_t, linger_ms, 0, 1000, "50",
                   "longest wait of a batch of command events for the ends of its commands, so "
                   "that a short command is stored in one transaction (0: never wait)"),
    SP_CFG_INT_OPT("ack-wait-ms", el_config_t, ack_wait_ms, 1000, 600000, "30000",
                   "redelivery timeout of unacknowledged events"),
    SP_CFG_INT_OPT("stats-interval-s", el_config_t, stats_interval_s, 0, 86400, "60",
                   "seconds between counter log lines (0: never)"),
    SP_CFG_STR_OPT("log-level", el_config_t, log_level, "info", "debug|info|warn|error"),
    SP_CFG_STR_OPT("log-format", el_config_t, log_format, "kv", "kv|json"),
    SP_CFG_STR_OPT("keyring-dir", el_config_t, keyring_dir, NULL,
                   "directory of the identities' <identity>.pub (default $SPACE_HOME/creds)"),
    SP_CFG_STR_OPT("verify-signatures", el_config_t, verify_signatures, "auto",
                   "on|off|log|auto (auto: on when keyring-dir exists, else off)"),
    SP_CFG_INT_OPT("sig-cache-slots", el_config_t, sig_cache_slots, 1, 65536, "4096",
                   "verified batch signatures remembered"),
    SP_CFG_INT_OPT("verify-threads", el_config_t, verify_threads, 0, 64, "0",
                   "threads decoding and verifying the next batch (0: online CPUs, at most 4)"),
    SP_CFG_INT_OPT("checkpoint-events", el_config_t, checkpoint_events, 0, 10000000, "1000",
                   "sign a checkpoint of the head every this many rows (0: not by count; "
                   "docs/audit.md)"),
    SP_CFG_INT_OPT("checkpoint-ms", el_config_t, checkpoint_ms, 0, 3600000, "5000",
                   "and at least this often while the head moves (0: not by time; both 0: no "
                   "checkpoints)"),
    SP_CFG_BOOL_OPT("seal-output", el_config_t, seal_output, "false",
                    "refuse plaintext command output and command lines: the deployment seals "
                    "them (docs/audit.md; space up: with space-credstore)"),
    SP_CFG_BOOL_OPT("synchronous-commit", el_config_t, synchronous_commit, "true",
                    "wait for each batch's WAL flush before acknowledging it (false: PostgreSQL "
                    "may lose the last ~0.6 s of stored batches in a crash; they are stored "
                    "again from the stream: docs/operations.md, \"synchronous_commit\")"),
    SP_CFG_STR_OPT("checkpoint-file", el_config_t, checkpoint_file, NULL,
                   "also append each checkpoint to this file, for a witness to copy (empty: "
                   "none)"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* Waits for the writer lock, polling so that a stop request is honoured. */
static int take_writer_lock(PGconn *db)
{
    bool announced = false;
    while (!sp_daemon_stopping) {
        PGresult *r = PQexec(db, "SELECT pg_try_advisory_lock(" WRITER_LOCK_KEY ")");
        int rc = sp_db_check(r, PGRES_TUPLES_OK);
        bool got = rc == 0 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
        PQclear(r);
        if (rc < 0)
            return rc;
        if (got)
            return 0;
        if (!announced)
            sp_log(SP_LOG_INFO, "another eventlog holds the writer lock; standing by");
        announced = true;
        sp_daemon_sleep_ms(500);
    }
    return -EINTR;
}

static int open_db(const el_config_t *cfg, PGconn **ret_db)
{
    PGconn *db = NULL;
    int rc = sp_db_connect(cfg->pg_url, "space-eventlog", 30000, &db);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot connect to PostgreSQL", SP_KS("error", sp_strerror(rc)));
        return rc;
    }
    int version = sp_db_migrate(db);
    if (version < 0) {
        sp_log(SP_LOG_ERROR, "schema migration failed", SP_KS("error", PQerrorMessage(db)));
        PQfinish(db);
        return version;
    }
    if ((rc = take_writer_lock(db)) < 0) {
        PQfinish(db);
        return rc;
    }
    /* The store path's statements are prepared (sp_db_exec_prepared); left to choose,
     * PostgreSQL plans `= ANY($1)` with a short array anew on every call, which cost more than
     * running it (docs/machine-notes.md, "exec, fourth pass"). Their generic plans are index
     * lookups. */
    if ((rc = sp_db_exec(db, "SET plan_cache_mode = force_generic_plan")) < 0) {
        sp_log(SP_LOG_ERROR, "cannot set plan_cache_mode", SP_KS("error", PQerrorMessage(db)));
        PQfinish(db);
        return rc;
    }
    /* Off: the commit returns before its WAL is flushed. A crash of PostgreSQL may then take
     * the newest batches back; the head goes back with them, and they are fetched and stored
     * again from the stream, the same rows (docs/operations.md, "synchronous_commit"). */
    if (!cfg->synchronous_commit && (rc = sp_db_exec(db, "SET synchronous_commit = off")) < 0) {
        sp_log(SP_LOG_ERROR, "cannot set synchronous_commit", SP_KS("error", PQerrorMessage(db)));
        PQfinish(db);
        return rc;
    }
    sp_log(SP_LOG_INFO, "database ready", SP_KI("schema_version", version),
           SP_KS("synchronous_commit", cfg->synchronous_commit ? "on" : "off"));
    *ret_db = db;
    return 0;
}

static void log_stats(el_store_t *st, const char *msg)
{
    uint64_t hits = 0, verified = 0;
    sp_sigcache_stats(st->trust.cache, &hits, &verified);
    sp_log(SP_LOG_INFO, msg, SP_KU("head_seq", st->head.seq),
           SP_KU("accepted", st->counts.accepted), SP_KU("rejected", st->counts.rejected),
           SP_KU("refused", st->counts.refused), SP_KU("duplicates", st->counts.duplicates),
           SP_KU("redelivered", st->counts.skipped), SP_KU("lost", st->counts.lost),
           SP_KU("checkpoints", el_ckpt_made(st->ckpt)), SP_KU("sig_verified", verified),
           SP_KU("sig_cache_hits", hits));
}

/* verify-signatures and keyring-dir into st; the keyring into *ret_kr. Logs, once, loudly
 * when nothing is verified. */
static int setup_trust(const el_config_t *cfg, el_store_t *st, sp_keyring_t **ret_kr,
                       sp_sigcache_t **ret_cache)
{
    const char *home = getenv("SPACE_HOME");
    char *dir = cfg->keyring_dir[0] ? sp_xstrdup(cfg->keyring_dir)
                                    : sp_xasprintf("%s/creds", home && home[0] ? home : ".");
    const char *mode = cfg->verify_signatures;
    struct stat sb;
    bool exists = stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode);
    int rc = 0;

    if (strcmp(mode, "auto") == 0)
        st->verify = exists ? EL_VERIFY_ON : EL_VERIFY_OFF;
    else if (strcmp(mode, "on") == 0)
        st->verify = EL_VERIFY_ON;
    else if (strcmp(mode, "log") == 0)
        st->verify = EL_VERIFY_LOG;
    else if (strcmp(mode, "off") == 0)
        st->verify = EL_VERIFY_OFF;
    else {
        sp_log(SP_LOG_ERROR, "verify-signatures: on, off, log or auto", SP_KS("value", mode));
        rc = -EINVAL;
        goto out;
    }
    if (st->verify == EL_VERIFY_OFF) {
        sp_log(SP_LOG_WARN,
               "SIGNATURES NOT VERIFIED: every well-formed event is accepted whoever sent it",
               SP_KS("verify_signatures", mode), SP_KS("keyring_dir", dir),
               SP_KS("why", strcmp(mode, "off") == 0 ? "verify-signatures=off"
                                                     : "keyring-dir does not exist"));
        goto out;
    }
    if ((rc = sp_keyring_load(dir, ret_kr)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot load the keyring", SP_KS("keyring_dir", dir),
               SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    sp_sigcache_new((size_t)cfg->sig_cache_slots, ret_cache);
    st->trust.keyring = *ret_kr;
    *ret_kr = NULL; /* the store's now: it may replace it (el_store_t.keyring_dir) */
    st->keyring_dir = dir;
    dir = NULL;
    st->trust.cache = *ret_cache;
    sp_log(st->verify == EL_VERIFY_ON ? SP_LOG_INFO : SP_LOG_WARN,
           st->verify == EL_VERIFY_ON ? "verifying signatures: refused events are stored rejected"
                                      : "verifying signatures, LOG ONLY: refused events are "
                                        "still accepted",
           SP_KS("keyring_dir", st->keyring_dir),
           SP_KU("identities", sp_keyring_size(st->trust.keyring)));
out:
    free(dir);
    return rc;
}

/* The checkpointer (docs/audit.md), with the identity's key: without an identity nothing can
 * be signed, and the log says so. The checkpoint stream is the operator's to create (`space
 * up`); without it the checkpoints still go to the file, and the log says that too. */
static int setup_checkpoints(const el_config_t *cfg, sp_bus_t *bus, const sp_busid_t *busid,
                             el_store_t *st)
{
    if (cfg->checkpoint_events == 0 && cfg->checkpoint_ms == 0) {
        sp_log(SP_LOG_WARN, "CHECKPOINTS OFF: the log's head is not anchored outside PostgreSQL",
               SP_KS("why", "checkpoint-events=0 and checkpoint-ms=0"));
        return 0;
    }
    if (!busid->key) {
        sp_log(SP_LOG_WARN, "CHECKPOINTS OFF: the log's head is not anchored outside PostgreSQL",
               SP_KS("why", "no identity (creds-dir) to sign them with"));
        return 0;
    }
    int rc = sp_bus_ensure_ckpt_stream(bus);
    if (rc < 0)
        sp_log(SP_LOG_ERROR, "no checkpoint stream: checkpoints will not be anchored on the bus",
               SP_KS("stream", SP_CKPT_STREAM), SP_KS("error", sp_strerror(rc)),
               SP_KS("fix", "space up (as the operator) creates it"));
    el_ckpt_opts_t o = {.every_events = cfg->checkpoint_events,
                        .interval_ms = cfg->checkpoint_ms,
                        .file = cfg->checkpoint_file,
                        .signer = busid->name,
                        .key = busid->key,
                        .bus = bus};
    if ((rc = el_ckpt_new(&o, &st->ckpt)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot start the checkpointer", SP_KS("file", cfg->checkpoint_file),
               SP_KS("error", sp_strerror(rc)));
        return rc;
    }
    sp_log(SP_LOG_INFO, "checkpoints", SP_KI("every_events", cfg->checkpoint_events),
           SP_KI("every_ms", cfg->checkpoint_ms), SP_KS("stream", SP_CKPT_STREAM),
           SP_KS("file", cfg->checkpoint_file[0] ? cfg->checkpoint_file : "(none)"),
           SP_KS("signer", busid->name));
    return 0;
}

/* Stores a prepared batch and acknowledges it; < 0 when nothing of it was stored (it is not
 * acknowledged, the caller starts over from the head). The checkpointer learns the new head.
 *
 * The ack is held (sp_bus_batch_ack_deferred) until ACK_HOLD_MS after the first batch it
 * covers, or until it covers batch-max messages (half of what the durable lets wait
 * unacknowledged), or the log goes idle (an empty fetch), or it stops: a short command's
 * batch cost nats-server an ack and a rewrite of the durable's state file each. What a held
 * ack costs: a log that dies meanwhile is sent those messages again, which its head
 * filters. */
#define ACK_HOLD_MS 250
static el_metrics_t metrics;
static size_t ack_hold_msgs; /* batch-max */
static int ack_hold_ms;      /* ACK_HOLD_MS, or 0 with an ack wait too short for holding */

static int store_and_ack(el_store_t *st, el_batch_t *b)
{
    int64_t t0 = sp_mono_ns();
    int rc = el_store_batch(st, b);
    if (rc < 0)
        return rc;
    el_metrics_stored(&metrics, st, b->n, (double)(sp_mono_ns() - t0) / 1e9);
    el_ckpt_note(st->ckpt, st->head.seq, st->rows, st->head.hash, st->verify_from);
    /* Stored: a lost ack only causes a redelivery, which the head filters out. */
    if (sp_bus_batch_ack_deferred(b->batch, ack_hold_ms, ack_hold_msgs) < 0)
        sp_log(SP_LOG_WARN, "ack failed; stored events will be redelivered and skipped");
    return 0;
}

/* Facts nobody waits to see in the log: what happens inside sandboxes (space.ev.io), a
 * worker's heartbeat (every heartbeat-ms: ending the linger on it made one short command in
 * ten or twenty cost two transactions again on a slower machine), and egress decisions. */
static bool unawaited(sp_event_type_t t)
{
    return sp_event_is_io(t) || t == SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_ALLOWED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED;
}

/* Commands whose intent is in the batch and whose end is not, when the batch holds only facts
 * nobody waits on; 0 when it holds anything else. By subject: a hint for the linger only. */
static long open_commands(const sp_bus_batch_t *b)
{
    long open = 0;
    for (size_t i = 0; i < sp_bus_batch_len(b); i++) {
        sp_event_type_t t = sp_subject_event_type(sp_bus_batch_msg(b, i)->subject);
        if (!unawaited(t))
            return 0;
        if (t == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED)
            open++;
        else if (t == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED)
            open--;
    }
    return open;
}

/* The linger (docs/architecture.md, "One transaction per command"). A command's intent comes
 * alone, and its facts (CommandStarted, CommandOutput, CommandExited) a few milliseconds
 * later; stored as they come, each command costs two transactions, each with its commit,
 * projection upsert and NOTIFY. So a batch of command events only, with a command whose end
 * is not in it, waits up to linger-ms for more and takes what comes. Nothing waits on these
 * rows: the gateway answers a command from the worker's data plane, not from the log, and
 * any other message ends the wait as it arrives (a create's read-your-writes does not pay
 * it). A long command's intent is stored linger-ms late. */
static void linger(const el_config_t *cfg, sp_bus_consumer_t *c, sp_bus_batch_t *b)
{
    if (open_commands(b) <= 0)
        return;
    const int64_t until = sp_mono_ns() + cfg->linger_ms * 1000000;
    const char *outcome = "joined"; /* the ends came, or something else did */
    size_t n;
    while ((n = sp_bus_batch_len(b)) < (size_t)cfg->batch_max && open_commands(b) > 0) {
        int64_t left_ms = (until - sp_mono_ns()) / 1000000;
        sp_bus_batch_t *more = NULL;
        /* A failed fetch is met again by the next one; what is here is stored meanwhile. */
        if (left_ms <= 0 || sp_bus_fetch(c, (size_t)cfg->batch_max - n, (int)left_ms, &more) < 0 ||
            sp_bus_batch_len(more) == 0) {
            sp_bus_batch_free(more);
            outcome = "expired";
            break;
        }
        (void)sp_bus_batch_merge(b, &more);
    }
    sp_series_inc(sp_metric_series1(metrics.lingers, outcome));
}

/* Consumes until stopped or until something fails that needs a fresh start from the head.
 *
 * The durable is pushed (sp_bus_consumer_push; docs/architecture.md, "The event log's consumer
 * is pushed"): the server sends events as they are stored, at most two batches' worth
 * unacknowledged, and one ack per stored batch acknowledges it all. A fetch is a wait on what
 * has arrived here, with no request to the server.
 *
 * Pipelined (docs/trust.md, "Cost in the event log"): while the log is behind (the server
 * said, with the last message it sent, that more are waiting, or more are queued here), the
 * next batch is taken and handed to the verifier pool before the current one is stored, so
 * decoding and signature verification overlap PostgreSQL's work. When it keeps up, a batch is
 * stored as soon as it is prepared: waiting for the next first would add that wait to every
 * event's lag. Either way a batch is acknowledged only after its commit, and a failure drops
 * every batch not yet stored, unacknowledged, to be delivered again from the head. With a
 * batch waiting to be stored, the next fetch takes only what has arrived (READY_WAIT_MS). */
#define READY_WAIT_MS 0

/* The first stream sequence missing between *after and the batch's messages, 0 for none;
 * *after moves to the last one in order. Redeliveries (at or below *after) are no gap. */
static uint64_t delivery_gap(const sp_bus_batch_t *b, uint64_t *after)
{
    for (size_t i = 0; i < sp_bus_batch_len(b); i++) {
        uint64_t seq = sp_bus_batch_msg(b, i)->stream_seq;
        if (seq <= *after)
            continue;
        if (seq > *after + 1)
            return *after + 1;
        *after = seq;
    }
    return 0;
}

/* Whether the stream still holds seq: then a gap before it is a delivery lost in flight (a
 * consumer's leader that died with messages on their way, which the new leader redelivers
 * only after the ack wait), not messages the stream's limits dropped, and must not be stored
 * as lost. Unknown (the stream cannot be asked) counts as held: reading again is safe. */
static bool stream_holds(sp_bus_t *bus, uint64_t seq)
{
    sp_bus_stream_state_t ss;
    return sp_bus_stream_state(bus, SP_BUS_STREAM, &ss) < 0 || ss.first_seq <= seq;
}

static int consume(const el_config_t *cfg, sp_bus_t *bus, el_store_t *st, el_pool_t *pool)
{
    sp_bus_consumer_t *c = NULL;
    const uint64_t had = st->head.seq; /* what this process stored before, 0 at start */
    int rc = el_store_load_head(st);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot read the log head", SP_KS("error", PQerrorMessage(st->db)));
        return rc;
    }
    /* Commits taken back by a crash of PostgreSQL (synchronous-commit off, or a lost disk
     * cache): they are fetched and stored again from the stream. */
    if (st->head.seq < had)
        sp_log(SP_LOG_WARN, "the log's head went back; storing those events again from the stream",
               SP_KU("stored_before", had), SP_KU("head", st->head.seq));
    sp_series_set(sp_metric_only(metrics.stored_seq), (double)st->head.seq);
    /* Rows from here on are stored with this process's verification (the checkpoints say
     * from where: a row accepted after it passed sp_trust_verify). */
    if (st->verify == EL_VERIFY_ON && st->verify_from == 0)
        st->verify_from = st->head.seq + 1;
    rc = sp_bus_consumer_push(bus, cfg->durable, SP_BUS_SUBJECTS, st->head.seq + 1,
                              (int)cfg->ack_wait_ms, 2 * (size_t)cfg->batch_max, &c);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot open the consumer", SP_KS("error", sp_strerror(rc)));
        return rc;
    }
    sp_log(SP_LOG_INFO, "consuming", SP_KU("from_seq", st->head.seq + 1),
           SP_KS("durable", cfg->durable));
    /* A held ack goes at the latest one fetch timeout after the hold (an empty fetch): far
     * inside the ack wait, or nothing is held. */
    ack_hold_msgs = (size_t)cfg->batch_max;
    ack_hold_ms = cfg->ack_wait_ms >= 4 * (ACK_HOLD_MS + cfg->fetch_timeout_ms) ? ACK_HOLD_MS : 0;

    int64_t next_stats = sp_mono_ns() + cfg->stats_interval_s * 1000000000LL;
    const sp_trust_t *trust = st->verify == EL_VERIFY_OFF ? NULL : &st->trust;
    el_batch_t *ready = NULL; /* prepared, to be stored before the next one */
    uint64_t pending = 0; /* waiting after the last fetched message: not sent yet, or queued here */
    uint64_t seen = st->head.seq; /* the last sequence delivered in order */
    int bus_errors = 0;
    uint64_t reconnects = sp_bus_reconnects(bus);
    bool again = false;
    while (!sp_daemon_stopping) {
        /* Reconnected: what the server sent into the dropped connection would come back only
         * after the ack wait. Starting over from the head gets it now (sp_bus_reconnects). */
        if (sp_bus_reconnects(bus) != reconnects) {
            if (ready && (rc = store_and_ack(st, ready)) < 0)
                break;
            sp_log(SP_LOG_INFO, "reconnected to NATS: reading again from the log head");
            again = true;
            break;
        }
        sp_bus_batch_t *fetched = NULL;
        el_batch_t *next = NULL;
        rc = sp_bus_fetch(c, (size_t)cfg->batch_max,
                          ready ? READY_WAIT_MS : (int)cfg->fetch_timeout_ms, &fetched);
        if (rc < 0) {
            sp_log(SP_LOG_WARN, "fetch failed", SP_KS("error", sp_strerror(rc)));
            sp_bus_batch_free(fetched);
            /* What was prepared is stored first: it was fetched fine. */
            if (ready && (rc = store_and_ack(st, ready)) < 0)
                break;
            el_batch_free(ready);
            ready = NULL;
            /* cnats reconnects by itself; after repeated failures start over from the head. */
            if (++bus_errors >= 5) {
                rc = SP_EBUS;
                break;
            }
            sp_daemon_sleep_ms(200 * bus_errors);
            continue;
        }
        bus_errors = 0;
        if (sp_bus_batch_len(fetched) == 0)
            (void)sp_bus_consumer_ack_flush(c); /* idle: what is held goes now */
        /* The linger is for a log that keeps up: what this fetch took is all there was. A
         * batch prepared before it (its own count was above 0) is stored first, so that it
         * does not wait with the command; the fetched one then waits for the command's end
         * as a first batch would (a short command's intent and facts in one transaction). */
        if (cfg->linger_ms > 0 && sp_bus_batch_pending(fetched) == 0 &&
            open_commands(fetched) > 0) {
            if (ready) {
                rc = store_and_ack(st, ready);
                el_batch_free(ready);
                ready = NULL;
                if (rc < 0) {
                    sp_bus_batch_free(fetched);
                    break;
                }
            }
            linger(cfg, c, fetched);
        }
        /* A gap the stream can still fill: what came before it is stored, then everything
         * is read again from the head (the stream's limits are the only reason to store a
         * gap, as lost rows). */
        uint64_t missing = delivery_gap(fetched, &seen);
        if (missing && stream_holds(bus, missing)) {
            sp_log(SP_LOG_WARN,
                   "a delivery skipped messages the stream holds; reading again "
                   "from the log head",
                   SP_KU("missing_seq", missing));
            sp_bus_batch_free(fetched);
            if (ready && (rc = store_and_ack(st, ready)) < 0)
                break;
            again = true;
            break;
        }
        pending = sp_bus_batch_pending(fetched);
        next = el_batch_new(&fetched);
        if (next->n > 0)
            el_pool_start(pool, next, trust);
        if (ready) {
            rc = store_and_ack(st, ready);
            el_batch_free(ready);
            ready = NULL;
        }
        if (next->n > 0) {
            el_pool_wait(pool);
            el_store_recheck_signers(st, next);
        }
        if (rc < 0) {
            /* Nothing of that batch was stored, so nothing after it may be: start over. */
            el_batch_free(next);
            break;
        }
        /* Behind: fetch the next one before storing this one. */
        if (next->n > 0 && pending > 0) {
            ready = next;
        } else {
            if (next->n > 0)
                rc = store_and_ack(st, next);
            el_batch_free(next);
            if (rc < 0)
                break;
        }
        if (cfg->stats_interval_s > 0 && sp_mono_ns() >= next_stats) {
            log_stats(st, "progress");
            next_stats = sp_mono_ns() + cfg->stats_interval_s * 1000000000LL;
        }
    }
    /* Stopping or failing: a prepared batch not stored is not acknowledged (redelivered);
     * the held ack covers stored batches only. */
    el_batch_free(ready);
    (void)sp_bus_consumer_ack_flush(c);
    sp_bus_consumer_free(c);
    return sp_daemon_stopping || again ? 0 : (rc < 0 ? rc : SP_EBUS);
}

int main(int argc, char **argv)
{
    sp_daemon_no_core(); /* before any secret is read */
    el_config_t cfg = {0};
    char *err = NULL;
    int argi = 0;
    int rc = sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err);
    int exit_code = 1;
    sp_bus_t *bus = NULL;
    sp_busid_t busid = {0};
    el_store_t st = {0};
    sp_sighead_ring_init(&st.heads);
    sp_log_level_t level;
    sp_log_format_t format;
    sp_keyring_t *keyring = NULL;
    sp_sigcache_t *sigcache = NULL;
    el_pool_t *pool = NULL;
    sp_metrics_t *reg = sp_metrics_new();
    sp_metrics_server_t *msrv = NULL;

    if (rc < 0) {
        fprintf(stderr, "space-eventlog: %s\n", err ? err : sp_strerror(rc));
        goto out;
    }
    if (argi < 0) {
        exit_code = 0;
        goto out;
    }
    if (argi < argc) {
        fprintf(stderr, "space-eventlog: unexpected argument '%s'\n", argv[argi]);
        goto out;
    }
    if (sp_log_level_parse(cfg.log_level, &level) < 0 ||
        sp_log_format_parse(cfg.log_format, &format) < 0) {
        fprintf(stderr, "space-eventlog: bad --log-level or --log-format\n");
        goto out;
    }
    sp_log_init("space-eventlog", level, format);

    sp_daemon_signals();

    sp_bus_opts_t bo = {.url = cfg.nats_url,
                        .name = "space-eventlog",
                        .user = cfg.nats_user[0] ? cfg.nats_user : NULL,
                        .password = cfg.nats_password[0] ? cfg.nats_password : NULL,
                        .timeout_ms = 30000};
    char iderr[SP_BUSID_ERR_MAX];
    if (sp_busid_setup(cfg.creds_dir, cfg.identity, "eventlog", &busid, &bo, iderr) < 0) {
        sp_log(SP_LOG_ERROR, "bad identity", SP_KS("error", iderr));
        goto out;
    }
    if ((rc = sp_bus_connect(&bo, &bus)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot connect to NATS", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    if ((rc = sp_bus_ensure_stream(bus)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot set up the stream", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    char merr[SP_METRICS_ERR_MAX] = "bad metric families";
    if (el_metrics_init(&metrics, reg, bus) < 0 ||
        sp_metrics_serve(reg, "space-eventlog", cfg.metrics_addr, cfg.metrics_port_file, &msrv,
                         merr) < 0) {
        sp_log(SP_LOG_ERROR, "cannot serve metrics", SP_KS("error", merr));
        goto out;
    }
    st.proj = sp_projection_new("public");
    if (setup_trust(&cfg, &st, &keyring, &sigcache) < 0)
        goto out;
    st.seal_output = cfg.seal_output;
    if (st.seal_output)
        sp_log(SP_LOG_INFO, "seal-output: plaintext command output and command lines are "
                            "stored rejected");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t threads = cfg.verify_threads > 0 ? (size_t)cfg.verify_threads
                                            : (size_t)(cpus < 1   ? 1
                                                       : cpus > 4 ? 4
                                                                  : cpus);
    if ((rc = el_pool_new(threads, &pool)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot start the verifier threads", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    sp_log(SP_LOG_INFO, "verifier pool", SP_KU("threads", threads));
    if (setup_checkpoints(&cfg, bus, &busid, &st) < 0)
        goto out;

    int failures = 0;
    while (!sp_daemon_stopping) {
        if (!st.db || PQstatus(st.db) != CONNECTION_OK) {
            PQfinish(st.db);
            st.db = NULL;
            if (open_db(&cfg, &st.db) < 0) {
                sp_daemon_sleep_ms(1000);
                continue;
            }
        }
        rc = consume(&cfg, bus, &st, pool);
        if (rc < 0 && !sp_daemon_stopping) {
            failures++;
            sp_log(SP_LOG_WARN, "restarting from the log head", SP_KS("error", sp_strerror(rc)),
                   SP_KI("failures", failures));
            sp_daemon_sleep_ms(failures < 10 ? 100 * failures : 1000);
            /* Drop a connection that may be stuck in a failed state; reconnect above. */
            if (PQstatus(st.db) != CONNECTION_OK || PQtransactionStatus(st.db) != PQTRANS_IDLE) {
                PQfinish(st.db);
                st.db = NULL;
            }
        } else {
            failures = 0;
        }
    }
    log_stats(&st, "stopped");
    el_ckpt_free(st.ckpt);
    st.ckpt = NULL;
    exit_code = 0;
out:
    /* First: its scrapes read the bus. */
    sp_metrics_server_free(msrv);
    sp_metrics_free(reg);
    el_ckpt_free(st.ckpt); /* the last head gets its checkpoint */
    el_pool_free(pool);
    sp_projection_free(st.proj);
    sp_sigcache_free(sigcache);
    sp_keyring_free(keyring);
    sp_sighead_ring_dispose(&st.heads);
    sp_keyring_free((sp_keyring_t *)st.trust.keyring);
    free((char *)st.keyring_dir);
    PQfinish(st.db);
    sp_bus_free(bus);
    sp_busid_dispose(&busid);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return exit_code;
}
