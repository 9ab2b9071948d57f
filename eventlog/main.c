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

#include "bus.h"
#include "busid.h"
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
    int64_t ack_wait_ms;
    int64_t stats_interval_s;
    char *log_level;
    char *log_format;
    char *keyring_dir;
    char *verify_signatures;
    int64_t sig_cache_slots;
} el_config_t;

static const sp_cfg_opt_t options[] = {
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
    sp_log(SP_LOG_INFO, "database ready", SP_KI("schema_version", version));
    *ret_db = db;
    return 0;
}

static void log_stats(const el_store_t *st, const char *msg)
{
    uint64_t hits = 0, verified = 0;
    sp_sigcache_stats(st->trust.cache, &hits, &verified);
    sp_log(SP_LOG_INFO, msg, SP_KU("head_seq", st->head.seq),
           SP_KU("accepted", st->counts.accepted), SP_KU("rejected", st->counts.rejected),
           SP_KU("refused", st->counts.refused), SP_KU("duplicates", st->counts.duplicates),
           SP_KU("redelivered", st->counts.skipped), SP_KU("sig_verified", verified),
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

/* Consumes until stopped or until something fails that needs a fresh start from the head. */
static int consume(const el_config_t *cfg, sp_bus_t *bus, el_store_t *st)
{
    sp_bus_consumer_t *c = NULL;
    int rc = el_store_load_head(st);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot read the log head", SP_KS("error", PQerrorMessage(st->db)));
        return rc;
    }
    rc = sp_bus_consumer_open(bus, cfg->durable, SP_BUS_SUBJECTS, st->head.seq + 1,
                              (int)cfg->ack_wait_ms, &c);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot open the consumer", SP_KS("error", sp_strerror(rc)));
        return rc;
    }
    sp_log(SP_LOG_INFO, "consuming", SP_KU("from_seq", st->head.seq + 1),
           SP_KS("durable", cfg->durable));

    int64_t next_stats = sp_mono_ns() + cfg->stats_interval_s * 1000000000LL;
    int bus_errors = 0;
    while (!sp_daemon_stopping) {
        sp_bus_batch_t *b = NULL;
        rc = sp_bus_fetch(c, (size_t)cfg->batch_max, (int)cfg->fetch_timeout_ms, &b);
        if (rc < 0) {
            sp_log(SP_LOG_WARN, "fetch failed", SP_KS("error", sp_strerror(rc)));
            sp_bus_batch_free(b);
            /* cnats reconnects by itself; after repeated failures start over from the head. */
            if (++bus_errors >= 5)
                break;
            sp_daemon_sleep_ms(200 * bus_errors);
            continue;
        }
        bus_errors = 0;
        if (sp_bus_batch_len(b) > 0) {
            rc = el_store_batch(st, b);
            if (rc < 0) {
                /* Nothing of the batch was stored; do not ack, start over from the head. */
                sp_bus_batch_free(b);
                break;
            }
            /* Stored: a lost ack only causes a redelivery, which the head filters out. */
            if (sp_bus_batch_ack(b) < 0)
                sp_log(SP_LOG_WARN, "ack failed; stored events will be redelivered and skipped");
        }
        sp_bus_batch_free(b);
        if (cfg->stats_interval_s > 0 && sp_mono_ns() >= next_stats) {
            log_stats(st, "progress");
            next_stats = sp_mono_ns() + cfg->stats_interval_s * 1000000000LL;
        }
    }
    sp_bus_consumer_free(c);
    return sp_daemon_stopping ? 0 : (rc < 0 ? rc : SP_EBUS);
}

int main(int argc, char **argv)
{
    el_config_t cfg = {0};
    char *err = NULL;
    int argi = 0;
    int rc = sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err);
    int exit_code = 1;
    sp_bus_t *bus = NULL;
    sp_busid_t busid = {0};
    el_store_t st = {0};
    sp_log_level_t level;
    sp_log_format_t format;
    sp_keyring_t *keyring = NULL;
    sp_sigcache_t *sigcache = NULL;

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
    st.proj = sp_projection_new("public");
    if (setup_trust(&cfg, &st, &keyring, &sigcache) < 0)
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
        rc = consume(&cfg, bus, &st);
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
    exit_code = 0;
out:
    sp_projection_free(st.proj);
    sp_sigcache_free(sigcache);
    sp_keyring_free(keyring);
    sp_keyring_free((sp_keyring_t *)st.trust.keyring);
    free((char *)st.keyring_dir);
    PQfinish(st.db);
    sp_bus_free(bus);
    sp_busid_dispose(&busid);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return exit_code;
}
