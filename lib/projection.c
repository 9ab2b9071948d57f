/* Projection cache and its PostgreSQL load/flush (projection.h). */
#include "projection.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "db.h"
#include "error.h"
#include "log.h"
#include "xmalloc.h"

const char *const sp_projection_tables[] = {"sandboxes", "workers"};
const size_t sp_projection_n_tables =
    sizeof(sp_projection_tables) / sizeof(sp_projection_tables[0]);

/* Open-addressing map from id to row index; ids are short and batches small. */
typedef struct {
    uint32_t *slots; /* index + 1; 0 = empty */
    size_t cap;      /* power of two */
} idmap_t;

typedef struct {
    sp_sandbox_t row;
    int dirty;
} sbx_entry_t;

typedef struct {
    sp_worker_t row;
    int dirty;
} wkr_entry_t;

struct sp_projection {
    char *schema;
    sbx_entry_t *sbx;
    size_t n_sbx, cap_sbx;
    idmap_t sbx_map;
    wkr_entry_t *wkr;
    size_t n_wkr, cap_wkr;
    idmap_t wkr_map;
};

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

/* Returns the slot for id: either holding it or empty. get_id(i) names the row at index i. */
static uint32_t *map_slot(idmap_t *m, const char *id, const char *(*get_id)(void *, uint32_t),
                          void *ctx)
{
    size_t mask = m->cap - 1;
    for (size_t i = fnv1a(id) & mask;; i = (i + 1) & mask) {
        uint32_t *s = &m->slots[i];
        if (*s == 0 || strcmp(get_id(ctx, *s - 1), id) == 0)
            return s;
    }
}

static void map_grow(idmap_t *m, size_t n, const char *(*get_id)(void *, uint32_t), void *ctx)
{
    if (m->cap && n * 2 < m->cap)
        return;
    idmap_t nm = {.cap = m->cap ? m->cap * 2 : 64};
    nm.slots = sp_xcalloc(nm.cap, sizeof(uint32_t));
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i])
            *map_slot(&nm, get_id(ctx, m->slots[i] - 1), get_id, ctx) = m->slots[i];
    free(m->slots);
    *m = nm;
}

static const char *sbx_id(void *ctx, uint32_t i)
{
    return ((sp_projection_t *)ctx)->sbx[i].row.id;
}

static const char *wkr_id(void *ctx, uint32_t i)
{
    return ((sp_projection_t *)ctx)->wkr[i].row.id;
}

sp_projection_t *sp_projection_new(const char *schema)
{
    sp_projection_t *p = sp_xcalloc(1, sizeof(*p));
    p->schema = sp_xstrdup(schema ? schema : "public");
    return p;
}

void sp_projection_clear(sp_projection_t *p)
{
    for (size_t i = 0; i < p->n_sbx; i++)
        sp_sandbox_dispose(&p->sbx[i].row);
    for (size_t i = 0; i < p->n_wkr; i++)
        sp_worker_dispose(&p->wkr[i].row);
    p->n_sbx = p->n_wkr = 0;
    if (p->sbx_map.slots)
        memset(p->sbx_map.slots, 0, p->sbx_map.cap * sizeof(uint32_t));
    if (p->wkr_map.slots)
        memset(p->wkr_map.slots, 0, p->wkr_map.cap * sizeof(uint32_t));
}

void sp_projection_retain(sp_projection_t *p, size_t max_rows)
{
    bool dirty = false;
    for (size_t i = 0; i < p->n_sbx && !dirty; i++)
        dirty = p->sbx[i].dirty;
    for (size_t i = 0; i < p->n_wkr && !dirty; i++)
        dirty = p->wkr[i].dirty;
    if (dirty || p->n_sbx + p->n_wkr > max_rows)
        sp_projection_clear(p);
}

void sp_projection_free(sp_projection_t *p)
{
    if (!p)
        return;
    sp_projection_clear(p);
    free(p->sbx);
    free(p->wkr);
    free(p->sbx_map.slots);
    free(p->wkr_map.slots);
    free(p->schema);
    free(p);
}

/* Finds or adds (state none) the cached row for id. */
static sbx_entry_t *sbx_get(sp_projection_t *p, const char *id, int add)
{
    if (p->sbx_map.cap) {
        uint32_t *s = map_slot(&p->sbx_map, id, sbx_id, p);
        if (*s)
            return &p->sbx[*s - 1];
    }
    if (!add)
        return NULL;
    map_grow(&p->sbx_map, p->n_sbx + 1, sbx_id, p);
    if (!p->sbx || p->n_sbx == p->cap_sbx) {
        p->cap_sbx = p->cap_sbx ? p->cap_sbx * 2 : 64;
        p->sbx = sp_xreallocarray(p->sbx, p->cap_sbx, sizeof(*p->sbx));
    }
    sbx_entry_t *e = &p->sbx[p->n_sbx];
    sp_sandbox_init(&e->row, id);
    e->dirty = 0;
    *map_slot(&p->sbx_map, id, sbx_id, p) = (uint32_t)++p->n_sbx;
    return e;
}

static wkr_entry_t *wkr_get(sp_projection_t *p, const char *id, int add)
{
    if (p->wkr_map.cap) {
        uint32_t *s = map_slot(&p->wkr_map, id, wkr_id, p);
        if (*s)
            return &p->wkr[*s - 1];
    }
    if (!add)
        return NULL;
    map_grow(&p->wkr_map, p->n_wkr + 1, wkr_id, p);
    if (!p->wkr || p->n_wkr == p->cap_wkr) {
        p->cap_wkr = p->cap_wkr ? p->cap_wkr * 2 : 16;
        p->wkr = sp_xreallocarray(p->wkr, p->cap_wkr, sizeof(*p->wkr));
    }
    wkr_entry_t *e = &p->wkr[p->n_wkr];
    sp_worker_init(&e->row, id);
    e->dirty = 0;
    *map_slot(&p->wkr_map, id, wkr_id, p) = (uint32_t)++p->n_wkr;
    return e;
}

const sp_sandbox_t *sp_projection_sandbox(sp_projection_t *p, const char *id)
{
    sbx_entry_t *e = sbx_get(p, id, 0);
    return e && e->row.state != SP_SBX_NONE ? &e->row : NULL;
}

const sp_worker_t *sp_projection_worker(sp_projection_t *p, const char *id)
{
    wkr_entry_t *e = wkr_get(p, id, 0);
    return e && e->row.known ? &e->row : NULL;
}

void sp_projection_each_sandbox(sp_projection_t *p, void (*fn)(const sp_sandbox_t *s, void *arg),
                                void *arg)
{
    for (size_t i = 0; i < p->n_sbx; i++)
        if (p->sbx[i].row.state != SP_SBX_NONE)
            fn(&p->sbx[i].row, arg);
}

int sp_projection_apply(sp_projection_t *p, const sp_envelope_t *env, uint64_t seq,
                        char reason[SP_REASON_MAX])
{
    int rc;
    if (sp_event_is_cred(env->payload_case))
        return 0; /* no projection: the log keeps them (docs/credentials.md) */
    if (sp_event_is_worker(env->payload_case)) {
        wkr_entry_t *e = wkr_get(p, env->aggregate->id, 1);
        sp_worker_t next;
        sp_worker_copy(&next, &e->row);
        rc = sp_reduce_worker(&next, env, seq, reason);
        if (rc < 0) {
            sp_worker_dispose(&next);
            return rc;
        }
        sp_worker_dispose(&e->row);
        e->row = next;
        e->dirty = 1;
        return 0;
    }
    sbx_entry_t *e = sbx_get(p, env->aggregate->id, 1);
    sp_sandbox_t next;
    sp_sandbox_copy(&next, &e->row);
    rc = sp_reduce_sandbox(&next, env, seq, reason);
    /* Refused, or accepted with the row as it was (activity within its step): nothing to
     * write. */
    if (rc < 0 || next.version == e->row.version) {
        sp_sandbox_dispose(&next);
        return rc;
    }
    sp_sandbox_dispose(&e->row);
    e->row = next;
    e->dirty = 1;
    return 0;
}

/* ---- PostgreSQL ---- */

/* Appends one element of a PostgreSQL array literal: quoted, with " and \ escaped. */
static void array_elem(sp_buf_t *b, const char *s)
{
    if (b->len > 1)
        sp_buf_putc(b, ',');
    sp_buf_putc(b, '"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            sp_buf_putc(b, '\\');
        sp_buf_putc(b, *s);
    }
    sp_buf_putc(b, '"');
}

static void array_i64(sp_buf_t *b, int64_t v)
{
    if (b->len > 1)
        sp_buf_putc(b, ',');
    sp_buf_printf(b, "%lld", (long long)v);
}

/* Collects the ids not cached yet into a text[] literal; returns how many. */
static size_t missing_ids(sp_projection_t *p, int workers, const char *const *ids, size_t n,
                          sp_buf_t *arr)
{
    size_t k = 0;
    sp_buf_putc(arr, '{');
    for (size_t i = 0; i < n; i++) {
        int cached = workers ? wkr_get(p, ids[i], 0) != NULL : sbx_get(p, ids[i], 0) != NULL;
        if (cached)
            continue;
        /* Add now (state none) so duplicates in ids are asked once and absent ids stay known
         * as absent; rows found below overwrite them. */
        if (workers)
            wkr_get(p, ids[i], 1);
        else
            sbx_get(p, ids[i], 1);
        array_elem(arr, ids[i]);
        k++;
    }
    sp_buf_putc(arr, '}');
    return k;
}

static int64_t col_us(PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return 0;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static void col_str(char *dst, size_t cap, PGresult *r, int row, int col)
{
    snprintf(dst, cap, "%s", PQgetvalue(r, row, col));
}

static int quoted_schema(PGconn *db, const sp_projection_t *p, char **ret)
{
    char *q = PQescapeIdentifier(db, p->schema, strlen(p->schema));
    if (!q)
        return SP_EDB;
    *ret = q;
    return 0;
}

#define US(col) "(extract(epoch from " col ") * 1000000)::bigint"

int sp_projection_load_sandboxes(sp_projection_t *p, PGconn *db, const char *const *ids, size_t n)
{
    sp_buf_t arr, sql;
    char *schema = NULL;
    int rc;

    sp_buf_init(&arr);
    sp_buf_init(&sql);
    if (missing_ids(p, 0, ids, n, &arr) == 0) {
        rc = 0;
        goto out;
    }
    if ((rc = quoted_schema(db, p, &schema)) < 0)
        goto out;
    /* clang-format off */
    sp_buf_printf(&sql,
        "SELECT id, tenant, template, state, worker, timeout_s, vcpu, memory_mb,"
        " metadata::text, env_names::text, failure_reason, " US("created_at") ","
        " " US("started_at") ", " US("updated_at") ", " US("deleted_at") ", version, last_seq,"
        " " US("timeout_at") ", on_timeout, idle_suspend_s, " US("last_activity_at") ", disk_mb"
        " FROM %s.sandboxes WHERE id = ANY($1::text[])",
        schema);
    /* clang-format on */
    const char *params[1] = {arr.data};
    PGresult *r = sp_db_exec_prepared(db, sql.data, 1, params, 0);
    if ((rc = sp_db_check(r, PGRES_TUPLES_OK)) < 0) {
        PQclear(r);
        goto out;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        sp_sandbox_t *s = &sbx_get(p, PQgetvalue(r, i, 0), 1)->row;
        col_str(s->tenant, sizeof(s->tenant), r, i, 1);
        col_str(s->template_, sizeof(s->template_), r, i, 2);
        s->state = sp_sbx_state_from_name(PQgetvalue(r, i, 3));
        col_str(s->worker, sizeof(s->worker), r, i, 4);
        s->timeout_s = (uint32_t)strtoul(PQgetvalue(r, i, 5), NULL, 10);
        s->vcpu = (uint32_t)strtoul(PQgetvalue(r, i, 6), NULL, 10);
        s->memory_mb = (uint32_t)strtoul(PQgetvalue(r, i, 7), NULL, 10);
        free(s->metadata_json);
        free(s->env_names_json);
        s->metadata_json = sp_xstrdup(PQgetvalue(r, i, 8));
        s->env_names_json = sp_xstrdup(PQgetvalue(r, i, 9));
        col_str(s->failure_reason, sizeof(s->failure_reason), r, i, 10);
        s->created_at_us = col_us(r, i, 11);
        s->started_at_us = col_us(r, i, 12);
        s->updated_at_us = col_us(r, i, 13);
        s->deleted_at_us = col_us(r, i, 14);
        s->version = (uint32_t)strtoul(PQgetvalue(r, i, 15), NULL, 10);
        s->last_seq = strtoull(PQgetvalue(r, i, 16), NULL, 10);
        s->timeout_at_us = col_us(r, i, 17);
        col_str(s->on_timeout, sizeof(s->on_timeout), r, i, 18);
        s->idle_suspend_s = (uint32_t)strtoul(PQgetvalue(r, i, 19), NULL, 10);
        s->last_activity_us = col_us(r, i, 20);
        s->disk_mb = (uint32_t)strtoul(PQgetvalue(r, i, 21), NULL, 10);
    }
    PQclear(r);
out:
    PQfreemem(schema);
    sp_buf_dispose(&arr);
    sp_buf_dispose(&sql);
    return rc;
}

int sp_projection_load_workers(sp_projection_t *p, PGconn *db, const char *const *ids, size_t n)
{
    sp_buf_t arr, sql;
    char *schema = NULL;
    int rc;

    sp_buf_init(&arr);
    sp_buf_init(&sql);
    if (missing_ids(p, 1, ids, n, &arr) == 0) {
        rc = 0;
        goto out;
    }
    if ((rc = quoted_schema(db, p, &schema)) < 0)
        goto out;
    /* clang-format off */
    sp_buf_printf(&sql,
        "SELECT id, host, state, vcpu_total, vcpu_used, memory_mb_total, memory_mb_used,"
        " sandboxes_running, templates::text, runtimes::text, interval_ms,"
        " version_string, " US("last_heartbeat_at") ", version, last_seq,"
        " disk_mb_total, disk_mb_free, disk_mb_reserve, disk_mb_default, pools::text"
        " FROM %s.workers WHERE id = ANY($1::text[])",
        schema);
    /* clang-format on */
    const char *params[1] = {arr.data};
    PGresult *r = PQexecParams(db, sql.data, 1, NULL, params, NULL, NULL, 0);
    if ((rc = sp_db_check(r, PGRES_TUPLES_OK)) < 0) {
        PQclear(r);
        goto out;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        sp_worker_t *w = &wkr_get(p, PQgetvalue(r, i, 0), 1)->row;
        w->known = 1;
        col_str(w->host, sizeof(w->host), r, i, 1);
        w->up = strcmp(PQgetvalue(r, i, 2), "up") == 0;
        w->vcpu_total = (uint32_t)strtoul(PQgetvalue(r, i, 3), NULL, 10);
        w->vcpu_used = (uint32_t)strtoul(PQgetvalue(r, i, 4), NULL, 10);
        w->memory_mb_total = strtoull(PQgetvalue(r, i, 5), NULL, 10);
        w->memory_mb_used = strtoull(PQgetvalue(r, i, 6), NULL, 10);
        w->sandboxes_running = (uint32_t)strtoul(PQgetvalue(r, i, 7), NULL, 10);
        free(w->templates_json);
        free(w->runtimes_json);
        w->templates_json = sp_xstrdup(PQgetvalue(r, i, 8));
        w->runtimes_json = sp_xstrdup(PQgetvalue(r, i, 9));
        w->interval_ms = (uint32_t)strtoul(PQgetvalue(r, i, 10), NULL, 10);
        col_str(w->version_string, sizeof(w->version_string), r, i, 11);
        w->last_heartbeat_us = col_us(r, i, 12);
        w->version = (uint32_t)strtoul(PQgetvalue(r, i, 13), NULL, 10);
        w->last_seq = strtoull(PQgetvalue(r, i, 14), NULL, 10);
        w->disk_mb_total = strtoull(PQgetvalue(r, i, 15), NULL, 10);
        w->disk_mb_free = strtoull(PQgetvalue(r, i, 16), NULL, 10);
        w->disk_mb_reserve = strtoull(PQgetvalue(r, i, 17), NULL, 10);
        w->disk_mb_default = (uint32_t)strtoul(PQgetvalue(r, i, 18), NULL, 10);
        free(w->pools_json);
        w->pools_json = sp_xstrdup(PQgetvalue(r, i, 19));
    }
    PQclear(r);
out:
    PQfreemem(schema);
    sp_buf_dispose(&arr);
    sp_buf_dispose(&sql);
    return rc;
}

/* One upsert per table: every changed row travels as one element of parallel arrays. */

static int flush_sandboxes(sp_projection_t *p, PGconn *db, const char *schema)
{
    enum { NCOL = 22 };
    sp_buf_t col[NCOL], sql;
    size_t k = 0;
    int rc = 0;

    for (int c = 0; c < NCOL; c++) {
        sp_buf_init(&col[c]);
        sp_buf_putc(&col[c], '{');
    }
    for (size_t i = 0; i < p->n_sbx; i++) {
        const sp_sandbox_t *s = &p->sbx[i].row;
        if (!p->sbx[i].dirty)
            continue;
        k++;
        array_elem(&col[0], s->id);
        array_elem(&col[1], s->tenant);
        array_elem(&col[2], s->template_);
        array_elem(&col[3], sp_sbx_state_name(s->state));
        array_elem(&col[4], s->worker);
        array_i64(&col[5], s->timeout_s);
        array_i64(&col[6], s->vcpu);
        array_i64(&col[7], s->memory_mb);
        array_elem(&col[8], s->metadata_json ? s->metadata_json : "{}");
        array_elem(&col[9], s->env_names_json ? s->env_names_json : "[]");
        array_elem(&col[10], s->failure_reason);
        array_i64(&col[11], s->created_at_us);
        array_i64(&col[12], s->started_at_us);
        array_i64(&col[13], s->updated_at_us);
        array_i64(&col[14], s->deleted_at_us);
        array_i64(&col[15], s->version);
        array_i64(&col[16], (int64_t)s->last_seq);
        array_i64(&col[17], s->timeout_at_us);
        array_elem(&col[18], s->on_timeout[0] ? s->on_timeout : "delete");
        array_i64(&col[19], s->idle_suspend_s);
        array_i64(&col[20], s->last_activity_us);
        array_i64(&col[21], s->disk_mb);
    }
    if (k == 0)
        goto out;
    for (int c = 0; c < NCOL; c++)
        sp_buf_putc(&col[c], '}');
    sp_buf_init(&sql);
#define TSCOL(x)                                                                                   \
    "CASE WHEN " x " = 0 THEN NULL ELSE to_timestamp(0) + " x " * interval '1 microsecond' END"
    /* clang-format off */
    sp_buf_printf(&sql,
        "INSERT INTO %s.sandboxes AS t (id, tenant, template, state, worker, timeout_s, vcpu,"
        " memory_mb, metadata, env_names, failure_reason, created_at, started_at, updated_at,"
        " deleted_at, version, last_seq, timeout_at, on_timeout, idle_suspend_s,"
        " last_activity_at, disk_mb)"
        " SELECT id, tenant, template, state, worker, timeout_s, vcpu, memory_mb,"
        " metadata::jsonb, env_names::jsonb, failure_reason, " TSCOL("c") ", " TSCOL("s") ","
        " " TSCOL("u") ", " TSCOL("d") ", version, last_seq, " TSCOL("ta") ", on_timeout,"
        " idle_suspend_s, " TSCOL("la") ", disk_mb"
        " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[],"
        " $7::int[], $8::int[], $9::text[], $10::text[], $11::text[], $12::bigint[],"
        " $13::bigint[], $14::bigint[], $15::bigint[], $16::int[], $17::bigint[],"
        " $18::bigint[], $19::text[], $20::int[], $21::bigint[], $22::int[])"
        " AS x(id, tenant, template, state, worker, timeout_s, vcpu, memory_mb, metadata,"
        " env_names, failure_reason, c, s, u, d, version, last_seq, ta, on_timeout,"
        " idle_suspend_s, la, disk_mb)"
        " ON CONFLICT (id) DO UPDATE SET tenant = EXCLUDED.tenant,"
        " template = EXCLUDED.template, state = EXCLUDED.state, worker = EXCLUDED.worker,"
        " timeout_s = EXCLUDED.timeout_s, vcpu = EXCLUDED.vcpu, memory_mb = EXCLUDED.memory_mb,"
        " metadata = EXCLUDED.metadata, env_names = EXCLUDED.env_names,"
        " failure_reason = EXCLUDED.failure_reason, created_at = EXCLUDED.created_at,"
        " started_at = EXCLUDED.started_at, updated_at = EXCLUDED.updated_at,"
        " deleted_at = EXCLUDED.deleted_at, version = EXCLUDED.version,"
        " last_seq = EXCLUDED.last_seq, timeout_at = EXCLUDED.timeout_at,"
        " on_timeout = EXCLUDED.on_timeout, idle_suspend_s = EXCLUDED.idle_suspend_s,"
        " last_activity_at = EXCLUDED.last_activity_at, disk_mb = EXCLUDED.disk_mb",
        schema);
    /* clang-format on */
    const char *params[NCOL];
    for (int c = 0; c < NCOL; c++)
        params[c] = col[c].data;
    PGresult *r = sp_db_exec_prepared(db, sql.data, NCOL, params, 0);
    rc = sp_db_check(r, PGRES_COMMAND_OK);
    if (rc < 0)
        sp_log(SP_LOG_DEBUG, "sandboxes upsert failed", SP_KS("error", PQerrorMessage(db)));
    PQclear(r);
    sp_buf_dispose(&sql);
out:
    for (int c = 0; c < NCOL; c++)
        sp_buf_dispose(&col[c]);
    return rc;
}

static int flush_workers(sp_projection_t *p, PGconn *db, const char *schema)
{
    enum { NCOL = 20 };
    sp_buf_t col[NCOL], sql;
    size_t k = 0;
    int rc = 0;

    for (int c = 0; c < NCOL; c++) {
        sp_buf_init(&col[c]);
        sp_buf_putc(&col[c], '{');
    }
    for (size_t i = 0; i < p->n_wkr; i++) {
        const sp_worker_t *w = &p->wkr[i].row;
        if (!p->wkr[i].dirty)
            continue;
        k++;
        array_elem(&col[0], w->id);
        array_elem(&col[1], w->host);
        array_elem(&col[2], w->up ? "up" : "stopped");
        array_i64(&col[3], w->vcpu_total);
        array_i64(&col[4], w->vcpu_used);
        array_i64(&col[5], (int64_t)w->memory_mb_total);
        array_i64(&col[6], (int64_t)w->memory_mb_used);
        array_i64(&col[7], w->sandboxes_running);
        array_elem(&col[8], w->templates_json ? w->templates_json : "[]");
        array_elem(&col[9], w->runtimes_json ? w->runtimes_json : "[]");
        array_i64(&col[10], w->interval_ms);
        array_elem(&col[11], w->version_string);
        array_i64(&col[12], w->last_heartbeat_us);
        array_i64(&col[13], w->version);
        array_i64(&col[14], (int64_t)w->last_seq);
        array_i64(&col[15], (int64_t)w->disk_mb_total);
        array_i64(&col[16], (int64_t)w->disk_mb_free);
        array_i64(&col[17], (int64_t)w->disk_mb_reserve);
        array_i64(&col[18], w->disk_mb_default);
        array_elem(&col[19], w->pools_json ? w->pools_json : "{}");
    }
    if (k == 0)
        goto out;
    for (int c = 0; c < NCOL; c++)
        sp_buf_putc(&col[c], '}');
    sp_buf_init(&sql);
    /* clang-format off */
    sp_buf_printf(&sql,
        "INSERT INTO %s.workers AS t (id, host, state, vcpu_total, vcpu_used, memory_mb_total,"
        " memory_mb_used, sandboxes_running, templates, runtimes, interval_ms, version_string,"
        " last_heartbeat_at, version, last_seq, disk_mb_total, disk_mb_free, disk_mb_reserve,"
        " disk_mb_default, pools)"
        " SELECT id, host, state, vcpu_total, vcpu_used, memory_mb_total, memory_mb_used,"
        " sandboxes_running, templates::jsonb, runtimes::jsonb, interval_ms, version_string,"
        " " TSCOL("hb") ", version, last_seq, disk_mb_total, disk_mb_free, disk_mb_reserve,"
        " disk_mb_default, pools::jsonb"
        " FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::int[], $6::bigint[],"
        " $7::bigint[], $8::int[], $9::text[], $10::text[], $11::int[], $12::text[],"
        " $13::bigint[], $14::int[], $15::bigint[], $16::bigint[], $17::bigint[],"
        " $18::bigint[], $19::int[], $20::text[])"
        " AS x(id, host, state, vcpu_total, vcpu_used, memory_mb_total, memory_mb_used,"
        " sandboxes_running, templates, runtimes, interval_ms, version_string, hb, version,"
        " last_seq, disk_mb_total, disk_mb_free, disk_mb_reserve, disk_mb_default, pools)"
        " ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, state = EXCLUDED.state,"
        " vcpu_total = EXCLUDED.vcpu_total, vcpu_used = EXCLUDED.vcpu_used,"
        " memory_mb_total = EXCLUDED.memory_mb_total, memory_mb_used = EXCLUDED.memory_mb_used,"
        " sandboxes_running = EXCLUDED.sandboxes_running, templates = EXCLUDED.templates,"
        " runtimes = EXCLUDED.runtimes, interval_ms = EXCLUDED.interval_ms,"
        " version_string = EXCLUDED.version_string,"
        " last_heartbeat_at = EXCLUDED.last_heartbeat_at, version = EXCLUDED.version,"
        " last_seq = EXCLUDED.last_seq, disk_mb_total = EXCLUDED.disk_mb_total,"
        " disk_mb_free = EXCLUDED.disk_mb_free, disk_mb_reserve = EXCLUDED.disk_mb_reserve,"
        " disk_mb_default = EXCLUDED.disk_mb_default, pools = EXCLUDED.pools",
        schema);
    /* clang-format on */
#undef TSCOL
    const char *params[NCOL];
    for (int c = 0; c < NCOL; c++)
        params[c] = col[c].data;
    PGresult *r = PQexecParams(db, sql.data, NCOL, NULL, params, NULL, NULL, 0);
    rc = sp_db_check(r, PGRES_COMMAND_OK);
    if (rc < 0)
        sp_log(SP_LOG_DEBUG, "workers upsert failed", SP_KS("error", PQerrorMessage(db)));
    PQclear(r);
    sp_buf_dispose(&sql);
out:
    for (int c = 0; c < NCOL; c++)
        sp_buf_dispose(&col[c]);
    return rc;
}

int sp_projection_flush(sp_projection_t *p, PGconn *db)
{
    char *schema = NULL;
    int rc = quoted_schema(db, p, &schema);
    if (rc < 0)
        return rc;
    rc = flush_sandboxes(p, db, schema);
    if (rc >= 0)
        rc = flush_workers(p, db, schema);
    PQfreemem(schema);
    if (rc >= 0) {
        for (size_t i = 0; i < p->n_sbx; i++)
            p->sbx[i].dirty = 0;
        for (size_t i = 0; i < p->n_wkr; i++)
            p->wkr[i].dirty = 0;
    }
    return rc;
}
