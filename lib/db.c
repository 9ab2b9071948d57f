/* PostgreSQL helpers and migrations (db.h). */
#include "db.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db_migrations.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

/* pg_advisory_xact_lock key for migrations: "SPACEMIG" as an int8. */
#define MIGRATION_LOCK_KEY "6003360185432762695"

int sp_db_check(PGresult *res, ExecStatusType expected)
{
    if (!res)
        return SP_EDB;
    ExecStatusType st = PQresultStatus(res);
    if (st == expected)
        return 0;
    if (expected == PGRES_COMMAND_OK && st == PGRES_TUPLES_OK)
        return 0;
    return SP_EDB;
}

int sp_db_exec(PGconn *conn, const char *sql)
{
    PGresult *res = PQexec(conn, sql);
    int rc = sp_db_check(res, PGRES_COMMAND_OK);
    if (rc < 0)
        sp_log(SP_LOG_DEBUG, "db exec failed", SP_KS("error", PQerrorMessage(conn)));
    PQclear(res);
    return rc;
}

/* The statements prepared per connection, by a hash of their text: the connection (with its
 * backend's pid, so a new connection at a freed one's address is not taken for it) and the
 * statement. Full, a statement runs unprepared: correct, only planned each time. */
#define PREPARED_MAX 256
static struct {
    const PGconn *conn;
    int pid;
    uint64_t hash;
} prepared[PREPARED_MAX];
static size_t n_prepared;
static pthread_mutex_t prepared_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

PGresult *sp_db_exec_prepared(PGconn *conn, const char *sql, int nparams, const char *const *params,
                              int result_format)
{
    uint64_t h = fnv1a(sql);
    int pid = PQbackendPID(conn);
    char name[24];
    snprintf(name, sizeof(name), "sp_%016llx", (unsigned long long)h);
    pthread_mutex_lock(&prepared_mu);
    size_t i, slot = PREPARED_MAX;
    for (i = 0; i < n_prepared; i++) {
        if (prepared[i].conn == conn && prepared[i].hash == h) {
            if (prepared[i].pid == pid)
                break;
            slot = i; /* that address's earlier connection: this one has not got it */
        }
    }
    int known = i < n_prepared;
    if (!known && slot == PREPARED_MAX && n_prepared < PREPARED_MAX)
        slot = n_prepared;
    pthread_mutex_unlock(&prepared_mu);
    if (!known && slot == PREPARED_MAX)
        return PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, result_format);
    if (!known) {
        PGresult *r = PQprepare(conn, name, sql, nparams, NULL);
        if (sp_db_check(r, PGRES_COMMAND_OK) < 0)
            return r; /* the caller reports it as the statement's failure */
        PQclear(r);
        pthread_mutex_lock(&prepared_mu);
        if (slot == n_prepared && n_prepared < PREPARED_MAX)
            n_prepared++;
        prepared[slot].conn = conn;
        prepared[slot].pid = pid;
        prepared[slot].hash = h;
        pthread_mutex_unlock(&prepared_mu);
    }
    return PQexecPrepared(conn, name, nparams, params, NULL, NULL, result_format);
}

/* Server NOTICEs ("relation already exists, skipping") would go to stderr unformatted; they
 * are debug information. */
static void on_notice(void *arg, const char *message)
{
    (void)arg;
    sp_log(SP_LOG_DEBUG, "postgres notice", SP_KS("message", message));
}

int sp_db_connect(const char *url, const char *application_name, int timeout_ms, PGconn **ret_conn)
{
    const char *keys[] = {"dbname", "application_name", "connect_timeout", NULL};
    const char *vals[] = {url, application_name, "5", NULL};
    int64_t deadline = sp_mono_ns() + (int64_t)timeout_ms * 1000000;

    for (;;) {
        /* expand_dbname = 1: "dbname" may be a full connection string or URI. */
        PGconn *c = PQconnectdbParams(keys, vals, 1);
        if (c && PQstatus(c) == CONNECTION_OK) {
            PQsetNoticeProcessor(c, on_notice, NULL);
            *ret_conn = c;
            return 0;
        }
        sp_log(SP_LOG_DEBUG, "db connect failed", SP_KS("error", c ? PQerrorMessage(c) : "oom"));
        PQfinish(c);
        if (sp_mono_ns() >= deadline)
            return timeout_ms > 0 ? SP_ETIMEOUT : SP_EDB;
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
}

struct sp_db_idle {
    char *url, *application_name;
    pthread_mutex_t mu;
    size_t keep, n;
    PGconn **conns; /* the idle ones, the most recently given last */
};

sp_db_idle_t *sp_db_idle_new(const char *url, const char *application_name, size_t keep)
{
    sp_db_idle_t *idle = sp_xcalloc(1, sizeof(*idle));
    idle->url = sp_xstrdup(url);
    idle->application_name = sp_xstrdup(application_name);
    idle->keep = keep;
    idle->conns = sp_xcalloc(keep ? keep : 1, sizeof(PGconn *));
    pthread_mutex_init(&idle->mu, NULL);
    return idle;
}

/* Alive: the server answers an empty query. (PQstatus alone still says CONNECTION_OK for a
 * connection whose backend is gone until something is sent on it.) */
static bool idle_alive(PGconn *c)
{
    if (PQstatus(c) != CONNECTION_OK)
        return false;
    PGresult *r = PQexec(c, "");
    bool ok = r && PQresultStatus(r) == PGRES_EMPTY_QUERY;
    PQclear(r);
    return ok && PQstatus(c) == CONNECTION_OK;
}

int sp_db_idle_take(sp_db_idle_t *idle, int timeout_ms, PGconn **ret_conn)
{
    for (;;) {
        PGconn *c = NULL;
        pthread_mutex_lock(&idle->mu);
        if (idle->n > 0)
            c = idle->conns[--idle->n];
        pthread_mutex_unlock(&idle->mu);
        if (!c)
            break;
        if (idle_alive(c)) {
            *ret_conn = c;
            return 0;
        }
        sp_log(SP_LOG_DEBUG, "idle connection dropped by the server: closed",
               SP_KS("application_name", idle->application_name));
        PQfinish(c);
    }
    PGconn *c = NULL;
    int rc = sp_db_connect(idle->url, idle->application_name, timeout_ms, &c);
    if (rc < 0) {
        PQfinish(c);
        return rc;
    }
    *ret_conn = c;
    return 0;
}

void sp_db_idle_give(sp_db_idle_t *idle, PGconn *conn)
{
    if (!conn)
        return;
    if (PQstatus(conn) == CONNECTION_OK && PQtransactionStatus(conn) == PQTRANS_IDLE) {
        pthread_mutex_lock(&idle->mu);
        bool kept = idle->n < idle->keep;
        if (kept)
            idle->conns[idle->n++] = conn;
        pthread_mutex_unlock(&idle->mu);
        if (kept)
            return;
    }
    PQfinish(conn);
}

void sp_db_idle_free(sp_db_idle_t *idle)
{
    if (!idle)
        return;
    for (size_t i = 0; i < idle->n; i++)
        PQfinish(idle->conns[i]);
    pthread_mutex_destroy(&idle->mu);
    free(idle->conns);
    free(idle->url);
    free(idle->application_name);
    free(idle);
}

int sp_db_schema_version(void)
{
    return sp_db_migrations[sp_db_n_migrations - 1].version;
}

int sp_db_migrate(PGconn *conn)
{
    int rc;
    int current = 0;

    /* One transaction under an advisory lock: daemons starting together would otherwise race
     * even on CREATE TABLE IF NOT EXISTS (a unique violation in pg_type). */
    if ((rc = sp_db_exec(conn, "BEGIN")) < 0)
        return rc;
    if ((rc = sp_db_exec(conn, "SELECT pg_advisory_xact_lock(" MIGRATION_LOCK_KEY ")")) < 0 ||
        (rc = sp_db_exec(conn, "CREATE TABLE IF NOT EXISTS schema_migrations ("
                               " version integer PRIMARY KEY, name text NOT NULL,"
                               " applied_at timestamptz NOT NULL DEFAULT now())")) < 0)
        goto fail;
    for (size_t i = 0; i < sp_db_n_migrations; i++) {
        const sp_db_migration_t *m = &sp_db_migrations[i];
        char vbuf[16];
        const char *params[2] = {vbuf, m->name};
        snprintf(vbuf, sizeof(vbuf), "%d", m->version);

        PGresult *res = PQexecParams(conn, "SELECT 1 FROM schema_migrations WHERE version = $1", 1,
                                     NULL, params, NULL, NULL, 0);
        if ((rc = sp_db_check(res, PGRES_TUPLES_OK)) < 0) {
            PQclear(res);
            goto fail;
        }
        int applied = PQntuples(res) > 0;
        PQclear(res);
        if (!applied) {
            if ((rc = sp_db_exec(conn, m->sql)) < 0)
                goto fail;
            res =
                PQexecParams(conn, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                             2, NULL, params, NULL, NULL, 0);
            rc = sp_db_check(res, PGRES_COMMAND_OK);
            PQclear(res);
            if (rc < 0)
                goto fail;
        }
        current = m->version;
    }
    if ((rc = sp_db_exec(conn, "COMMIT")) < 0)
        return rc;
    return current;
fail:
    sp_db_exec(conn, "ROLLBACK");
    return rc;
}

/* search_path as a transaction-local setting: set_config(..., true). */
static int set_search_path(PGconn *conn, const char *value)
{
    const char *params[1] = {value};
    PGresult *res = PQexecParams(conn, "SELECT set_config('search_path', $1, true)", 1, NULL,
                                 params, NULL, NULL, 0);
    int rc = sp_db_check(res, PGRES_TUPLES_OK);
    PQclear(res);
    return rc;
}

int sp_db_create_schema(PGconn *conn, const char *schema)
{
    char *quoted = PQescapeIdentifier(conn, schema, strlen(schema));
    char *saved = NULL;
    char sql[256];
    int rc = SP_EDB;

    if (!quoted)
        return SP_EDB;
    PGresult *res = PQexec(conn, "SELECT current_setting('search_path')");
    if (sp_db_check(res, PGRES_TUPLES_OK) == 0 && PQntuples(res) == 1)
        saved = sp_xstrdup(PQgetvalue(res, 0, 0));
    PQclear(res);
    if (!saved || snprintf(sql, sizeof(sql), "CREATE SCHEMA %s", quoted) >= (int)sizeof(sql))
        goto out;
    /* The migrations name their tables without a schema: they land in the first one on the
     * path. */
    if ((rc = sp_db_exec(conn, sql)) < 0 || (rc = set_search_path(conn, quoted)) < 0)
        goto out;
    for (size_t i = 0; i < sp_db_n_migrations && rc >= 0; i++)
        rc = sp_db_exec(conn, sp_db_migrations[i].sql);
    int restored = set_search_path(conn, saved);
    if (rc >= 0)
        rc = restored;
out:
    free(saved);
    PQfreemem(quoted);
    return rc;
}

void sp_db_put_i64(char out[8], int64_t v)
{
    uint64_t u = (uint64_t)v;
    for (int i = 7; i >= 0; i--) {
        out[i] = (char)(u & 0xff);
        u >>= 8;
    }
}

int64_t sp_db_get_i64(const char *in)
{
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = (u << 8) | (uint8_t)in[i];
    return (int64_t)u;
}

int sp_db_last_sandbox_event(PGconn *conn, const char *id, const char *type,
                             sp_envelope_t **ret_event)
{
    const char *p[2] = {id, type};
    PGresult *r = PQexecParams(conn,
                               "SELECT payload FROM events WHERE aggregate_kind = 'sandbox' AND "
                               "aggregate_id = $1 AND type = $2 AND status = 'accepted' "
                               "ORDER BY stream_seq DESC LIMIT 1",
                               2, NULL, p, NULL, NULL, 1);
    char why[SP_REASON_MAX];
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc == 0 &&
        (PQntuples(r) != 1 || sp_envelope_decode((const uint8_t *)PQgetvalue(r, 0, 0),
                                                 (size_t)PQgetlength(r, 0, 0), ret_event, why) < 0))
        rc = SP_ENOTFOUND;
    PQclear(r);
    return rc;
}

/* Runs sql (params p, binary results: payload first) and calls fn with each decodable
 * envelope: 1 when fn said 1 for one of them, 0 when for none, SP_EDB. */
static int payloads_each(PGconn *conn, const char *sql, int n, const char *const *p,
                         int (*fn)(void *arg, const sp_envelope_t *e), void *arg)
{
    PGresult *r = PQexecParams(conn, sql, n, NULL, p, NULL, NULL, 1);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    bool hit = false;
    for (int i = 0; rc == 0 && i < PQntuples(r); i++) {
        sp_envelope_t *e = NULL;
        char why[SP_REASON_MAX];
        if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 0), (size_t)PQgetlength(r, i, 0),
                               &e, why) < 0)
            continue;
        hit |= fn(arg, e) == 1;
        sp_envelope_free(e);
    }
    PQclear(r);
    return rc < 0 ? rc : hit;
}

typedef struct {
    const char *snapshot_id;
    char *worker;
    size_t worker_len;
} snap_query_t;

static int taker_of(void *arg, const sp_envelope_t *e)
{
    snap_query_t *q = arg;
    if (e->payload_case != SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOTTED ||
        strcmp(e->sandbox_snapshotted->snapshot_id, q->snapshot_id) != 0)
        return 0;
    snprintf(q->worker, q->worker_len, "%s", e->sandbox_snapshotted->worker);
    return 1;
}

int sp_db_snapshot_taker(PGconn *conn, const char *tenant, const char *sandbox,
                         const char *snapshot_id, char *worker, size_t worker_len)
{
    const char *p[2] = {sandbox, tenant};
    snap_query_t q = {snapshot_id, worker, worker_len};
    return payloads_each(conn,
                         "SELECT payload FROM events WHERE aggregate_kind = 'sandbox' AND "
                         "aggregate_id = $1 AND tenant = $2 AND type = 'SandboxSnapshotted' AND "
                         "status = 'accepted' ORDER BY stream_seq",
                         2, p, taker_of, &q);
}

static int deletes(void *arg, const sp_envelope_t *e)
{
    const snap_query_t *q = arg;
    const char *gone = e->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETE_REQUESTED
                           ? e->snapshot_delete_requested->snapshot_id
                       : e->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED
                           ? e->snapshot_deleted->snapshot_id
                           : "";
    return strcmp(gone, q->snapshot_id) == 0;
}

int sp_db_snapshot_deleted(PGconn *conn, const char *sandbox, const char *snapshot_id)
{
    const char *p[1] = {sandbox};
    snap_query_t q = {.snapshot_id = snapshot_id};
    return payloads_each(conn,
                         "SELECT payload FROM events WHERE aggregate_kind = 'sandbox' AND "
                         "aggregate_id = $1 AND type IN ('SnapshotDeleteRequested', "
                         "'SnapshotDeleted') AND status = 'accepted'",
                         1, p, deletes, &q);
}

/* The tenant's snapshots from the log, oldest first; an entry a delete names is NULL. */
typedef struct {
    sp_envelope_t **ev;
    int64_t *at_us;
    size_t n;
} snapshots_t;

static void snapshots_free(snapshots_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        sp_envelope_free(s->ev[i]);
    free(s->ev);
    free(s->at_us);
}

static int snapshots_load(PGconn *conn, const char *tenant, snapshots_t *s)
{
    memset(s, 0, sizeof(*s));
    const char *p[1] = {tenant};
    PGresult *r = PQexecParams(conn,
                               "SELECT payload FROM events WHERE tenant = $1 AND type IN "
                               "('SandboxSnapshotted', 'SnapshotDeleteRequested', "
                               "'SnapshotDeleted') AND status = 'accepted' ORDER BY stream_seq",
                               1, NULL, p, NULL, NULL, 1);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc < 0) {
        PQclear(r);
        return rc;
    }
    size_t n = (size_t)PQntuples(r);
    s->ev = sp_xcalloc(n + 1, sizeof(sp_envelope_t *));
    s->at_us = sp_xcalloc(n + 1, sizeof(*s->at_us));
    for (size_t i = 0; i < n; i++) {
        sp_envelope_t *e = NULL;
        char why[SP_REASON_MAX];
        if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, (int)i, 0),
                               (size_t)PQgetlength(r, (int)i, 0), &e, why) < 0)
            continue;
        const char *gone = NULL;
        if (e->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETE_REQUESTED)
            gone = e->snapshot_delete_requested->snapshot_id;
        else if (e->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED)
            gone = e->snapshot_deleted->snapshot_id;
        if (gone) {
            for (size_t k = 0; k < s->n; k++)
                if (s->ev[k] && strcmp(s->ev[k]->sandbox_snapshotted->snapshot_id, gone) == 0) {
                    sp_envelope_free(s->ev[k]);
                    s->ev[k] = NULL;
                }
            sp_envelope_free(e);
            continue;
        }
        if (e->payload_case != SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOTTED ||
            strcmp(e->tenant, tenant) != 0) {
            sp_envelope_free(e);
            continue;
        }
        s->at_us[s->n] = e->occurred_at_us;
        s->ev[s->n++] = e;
    }
    PQclear(r);
    return 0;
}

int sp_db_snapshot_each(PGconn *conn, const char *tenant,
                        int (*fn)(void *arg, const sp_envelope_t *snapshotted, int64_t at_us),
                        void *arg)
{
    snapshots_t s;
    int rc = snapshots_load(conn, tenant, &s);
    for (size_t i = 0; rc == 0 && i < s.n; i++)
        if (s.ev[i])
            rc = fn(arg, s.ev[i], s.at_us[i]);
    snapshots_free(&s);
    return rc < 0 ? rc : 0;
}

int sp_db_snapshot_find(PGconn *conn, const char *tenant, const char *snapshot_id,
                        sp_envelope_t **ret_snapshotted)
{
    snapshots_t s;
    *ret_snapshotted = NULL;
    int rc = snapshots_load(conn, tenant, &s);
    if (rc < 0)
        return rc;
    rc = SP_ENOTFOUND;
    for (size_t i = 0; i < s.n; i++)
        if (s.ev[i] && strcmp(s.ev[i]->sandbox_snapshotted->snapshot_id, snapshot_id) == 0) {
            *ret_snapshotted = s.ev[i];
            s.ev[i] = NULL;
            rc = 0;
        }
    snapshots_free(&s);
    return rc;
}

/* Live (sp_db_worker_live): up, and a heartbeat within three of its intervals. */
#define WORKER_LIVE                                                                                \
    "state = 'up' AND last_heartbeat_at > now() - greatest(interval_ms, 1) * 3 * "                 \
    "interval '1 millisecond'"

int sp_db_worker_live(PGconn *conn, const char *worker)
{
    const char *p[1] = {worker};
    PGresult *r = PQexecParams(conn, "SELECT 1 FROM workers WHERE id = $1 AND " WORKER_LIVE, 1,
                               NULL, p, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc == 0)
        rc = PQntuples(r) == 1;
    PQclear(r);
    return rc;
}

int sp_db_live_worker(PGconn *conn, char *out, size_t len)
{
    PGresult *r = PQexec(conn, "SELECT id FROM workers WHERE " WORKER_LIVE
                               " ORDER BY last_heartbeat_at DESC LIMIT 1");
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc == 0 && PQntuples(r) == 1 && strlen(PQgetvalue(r, 0, 0)) < len) {
        snprintf(out, len, "%s", PQgetvalue(r, 0, 0));
        rc = 1;
    }
    PQclear(r);
    return rc;
}

int sp_db_log_head(PGconn *conn, uint64_t *ret_seq)
{
    PGresult *r = PQexec(conn, "SELECT coalesce(max(stream_seq), 0) FROM events");
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc == 0 && PQntuples(r) != 1)
        rc = SP_EDB;
    if (rc == 0)
        *ret_seq = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return rc;
}

int sp_db_accepted_seq(void *conn, const char *event_id, uint64_t *ret_seq)
{
    const char *params[1] = {event_id};
    if (!conn)
        return -EINVAL;
    PGresult *r =
        PQexecParams(conn,
                     "SELECT stream_seq FROM events WHERE event_id = $1::uuid AND status ="
                     " 'accepted'",
                     1, NULL, params, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc == 0 && PQntuples(r) == 1) {
        *ret_seq = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
        rc = 1;
    }
    PQclear(r);
    return rc;
}
