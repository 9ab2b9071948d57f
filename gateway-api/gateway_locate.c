/* Where a sandbox runs: the lookup every command, stdin/signal, watch, file call and envd
 * health check makes before it talks to the sandbox's worker.
 *
 * Running sandboxes are answered from a cache (gw_loc_cache_t) without PostgreSQL; any other
 * state, an unknown id or another tenant's id goes to PostgreSQL as before. The cache is kept
 * true by the trigger of migration 11: every change of a sandbox's state or worker is
 * NOTIFYed on SP_SANDBOX_CHANNEL at its commit and the LISTEN thread (gateway_db.c) drops the
 * entry. Two races, both closed by the epoch:
 *   - a lookup reads "running", the sandbox is paused and its notification heard, then the
 *     lookup would cache the old state: every drop bumps the epoch and a lookup caches only
 *     when the epoch it read before its query is still current;
 *   - notifications lost with the LISTEN connection: the thread empties the cache and keeps
 *     it off (live false) until it listens again.
 * What stays: between a commit and the moment the LISTEN thread hears of it (about a
 * millisecond) a request may be sent to the worker the sandbox was on, which is the window a
 * query just before the commit had too; the worker refuses what it no longer runs.
 * The environment values of a sandbox are secrets and are never cached: only whether there
 * are any, so a sandbox created without env costs no query at all. */
#include "gateway.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "xmalloc.h"

struct gw_loc_entry {
    gw_loc_entry_t *next;
    char id[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char worker[SP_ID_MAX + 1];
    bool has_env;
};

static size_t bucket_of(const char *id)
{
    /* FNV-1a: ids are random already; this only spreads them over the buckets. */
    uint64_t h = 14695981039346656037ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (size_t)(h % GW_LOC_BUCKETS);
}

void gw_loc_cache_init(gw_loc_cache_t *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
}

static void clear_locked(gw_loc_cache_t *c)
{
    for (size_t i = 0; i < GW_LOC_BUCKETS; i++) {
        while (c->buckets[i]) {
            gw_loc_entry_t *e = c->buckets[i];
            c->buckets[i] = e->next;
            free(e);
        }
    }
    c->n = 0;
}

/* Empties the cache and keeps it off; the mutex stays usable, so a job that still runs during
 * shutdown only misses. */
void gw_loc_cache_dispose(gw_loc_cache_t *c)
{
    pthread_mutex_lock(&c->mu);
    clear_locked(c);
    c->live = false;
    pthread_mutex_unlock(&c->mu);
}

void gw_loc_cache_drop(gw_loc_cache_t *c, const char *sandbox, bool live)
{
    pthread_mutex_lock(&c->mu);
    c->epoch++;
    c->live = live;
    if (!sandbox) {
        clear_locked(c);
    } else {
        for (gw_loc_entry_t **pp = &c->buckets[bucket_of(sandbox)]; *pp; pp = &(*pp)->next) {
            if (strcmp((*pp)->id, sandbox) == 0) {
                gw_loc_entry_t *e = *pp;
                *pp = e->next;
                free(e);
                c->n--;
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(&c->drops, 1);
}

/* A hit fills loc (state running) and *ret_has_env. On a miss, *ret_epoch is what a later put
 * must still find. */
static bool cache_get(gw_loc_cache_t *c, const char *sandbox, const char *tenant,
                      gw_sandbox_loc_t *loc, bool *ret_has_env, uint64_t *ret_epoch)
{
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    *ret_epoch = c->epoch;
    if (c->live) {
        for (gw_loc_entry_t *e = c->buckets[bucket_of(sandbox)]; e; e = e->next) {
            if (strcmp(e->id, sandbox) == 0) {
                if (strcmp(e->tenant, tenant) == 0) {
                    hit = true;
                    loc->found = true;
                    snprintf(loc->state, sizeof(loc->state), "running");
                    snprintf(loc->worker, sizeof(loc->worker), "%s", e->worker);
                    *ret_has_env = e->has_env;
                }
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(hit ? &c->hits : &c->misses, 1);
    return hit;
}

static void cache_put(gw_loc_cache_t *c, const char *sandbox, const char *tenant,
                      const char *worker, bool has_env, uint64_t epoch)
{
    if (strlen(sandbox) > SP_ID_MAX || strlen(tenant) > SP_ID_MAX || strlen(worker) > SP_ID_MAX ||
        !*worker)
        return;
    gw_loc_entry_t *e = sp_xcalloc(1, sizeof(*e));
    snprintf(e->id, sizeof(e->id), "%s", sandbox);
    snprintf(e->tenant, sizeof(e->tenant), "%s", tenant);
    snprintf(e->worker, sizeof(e->worker), "%s", worker);
    e->has_env = has_env;
    pthread_mutex_lock(&c->mu);
    gw_loc_entry_t **head = &c->buckets[bucket_of(sandbox)];
    bool present = false;
    for (gw_loc_entry_t *x = *head; x; x = x->next)
        present = present || strcmp(x->id, sandbox) == 0;
    if (c->live && c->epoch == epoch && !present) {
        /* Full: start again rather than keep an LRU; the running set refills it in one pass. */
        if (c->n >= GW_LOC_MAX)
            clear_locked(c);
        e->next = *head;
        *head = e;
        c->n++;
        e = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    free(e);
}

static void query_failed(PGconn *db, const char *what, gw_sandbox_loc_t *loc)
{
    sp_log(SP_LOG_WARN, "query failed", SP_KS("query", what), SP_KS("error", PQerrorMessage(db)));
    loc->failed = true;
}

/* The environment values alone, for a cached sandbox that has some. */
static void read_env(PGconn *db, const char *sandbox, const char *tenant, gw_sandbox_loc_t *loc,
                     char **ret_env)
{
    const char *p[2] = {sandbox, tenant};
    PGresult *r = PQexecParams(db,
                               "SELECT env::text FROM sandbox_env WHERE sandbox_id = $1 AND "
                               "tenant = $2",
                               2, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        query_failed(db, "sandbox environment", loc);
    } else if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        char *v = PQgetvalue(r, 0, 0);
        *ret_env = sp_xstrdup(v);
        explicit_bzero(v, strlen(v)); /* the values are secrets to the log and core dumps */
    }
    PQclear(r);
}

/* The location, and with ret_env (not NULL) the create-time environment in the same query: a
 * command needs both, and one round trip to PostgreSQL less is ~0.1 ms of its latency. */
static void locate(gw_job_t *job, const char *sandbox, const char *tenant, gw_sandbox_loc_t *loc,
                   char **ret_env)
{
    gw_loc_cache_t *c = &job->gw->notify.locs;
    PGconn *db = job->db;
    memset(loc, 0, sizeof(*loc));
    bool has_env = false;
    uint64_t epoch = 0;
    if (cache_get(c, sandbox, tenant, loc, &has_env, &epoch)) {
        if (ret_env && has_env)
            read_env(db, sandbox, tenant, loc, ret_env);
        return;
    }
    const char *p[2] = {sandbox, tenant};
    PGresult *r = PQexecParams(db,
                               ret_env ? "SELECT s.state, coalesce(s.worker, ''), e.env::text "
                                         "FROM sandboxes s LEFT JOIN sandbox_env e ON "
                                         "e.sandbox_id = s.id AND e.tenant = s.tenant "
                                         "WHERE s.id = $1 AND s.tenant = $2"
                                       : "SELECT s.state, coalesce(s.worker, ''), "
                                         "EXISTS (SELECT 1 FROM sandbox_env e WHERE "
                                         "e.sandbox_id = s.id AND e.tenant = s.tenant) "
                                         "FROM sandboxes s WHERE s.id = $1 AND s.tenant = $2",
                               2, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        query_failed(db, "sandbox location", loc);
    } else if (PQntuples(r) == 1) {
        loc->found = true;
        snprintf(loc->state, sizeof(loc->state), "%s", PQgetvalue(r, 0, 0));
        snprintf(loc->worker, sizeof(loc->worker), "%s", PQgetvalue(r, 0, 1));
        if (ret_env) {
            has_env = !PQgetisnull(r, 0, 2);
            if (has_env) {
                char *v = PQgetvalue(r, 0, 2);
                *ret_env = sp_xstrdup(v);
                explicit_bzero(v, strlen(v));
            }
        } else {
            has_env = strcmp(PQgetvalue(r, 0, 2), "t") == 0;
        }
        if (strcmp(loc->state, "running") == 0)
            cache_put(c, sandbox, tenant, loc->worker, has_env, epoch);
    }
    PQclear(r);
}

void gw_sandbox_locate(gw_job_t *job, const char *sandbox, const char *tenant,
                       gw_sandbox_loc_t *loc)
{
    locate(job, sandbox, tenant, loc, NULL);
}

void gw_sandbox_locate_env(gw_job_t *job, const char *sandbox, const char *tenant,
                           gw_sandbox_loc_t *loc, char **ret_env_json)
{
    *ret_env_json = NULL;
    locate(job, sandbox, tenant, loc, ret_env_json);
}
