/* space-replay rebuild: proves the projections were derived from the log and nothing else.
 * Every projection the eventlog maintains (sp_projection_tables) is rebuilt into a scratch
 * schema made by the same migrations, by replaying the accepted events through the same
 * sp_projection_t the eventlog uses (load, apply the reducers, flush, page by page), then
 * compared with the live tables (schema public) row by row and column by column.
 *
 * Every column is compared: the reducers take every value from the events (times are the
 * events' occurred_at, never a clock), so no column differs by nature.
 *
 * All of it runs in one REPEATABLE READ transaction: the log and the live projections are
 * read in the same snapshot (the eventlog commits both together), and the scratch schema is
 * rolled back at the end, so an interrupted rebuild leaves nothing behind; --keep commits it
 * instead. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "db.h"
#include "error.h"
#include "projection.h"
#include "replay.h"
#include "xmalloc.h"

typedef struct {
    const replay_config_t *cfg;
    sp_projection_t *proj;
    PGconn *db;
    const char *table;
    uint64_t events, head, differences;
    sp_buf_t line;
} rebuild_t;

static void report(rebuild_t *rb, const char *table, const char *key, const char *column,
                   const char *live, const char *rebuilt)
{
    sp_buf_t *b = &rb->line;
    sp_buf_reset(b);
    if (rb->cfg->json) {
        sp_buf_puts(b, "{\"table\":");
        sp_buf_json_str(b, table);
        sp_buf_puts(b, ",\"key\":");
        sp_buf_json_str(b, key);
        sp_buf_puts(b, ",\"column\":");
        sp_buf_json_str(b, column);
        sp_buf_puts(b, ",\"live\":");
        sp_buf_json_str(b, live);
        sp_buf_puts(b, ",\"rebuilt\":");
        sp_buf_json_str(b, rebuilt);
        sp_buf_putc(b, '}');
    } else {
        /* Values are quoted (JSON strings, null for SQL NULL): they may hold spaces. */
        sp_buf_printf(b, "differs: table=%s key=", table);
        sp_buf_json_str(b, key);
        sp_buf_printf(b, " column=%s live=", column);
        sp_buf_json_str(b, live);
        sp_buf_puts(b, " rebuilt=");
        sp_buf_json_str(b, rebuilt);
    }
    puts(b->data);
    rb->differences++;
}

static int replay_page(replay_event_t *evs, size_t n, void *arg)
{
    rebuild_t *rb = arg;
    const char **sbx = sp_xcalloc(n, sizeof(char *));
    const char **wkr = sp_xcalloc(n, sizeof(char *));
    size_t ns = 0, nw = 0;
    char reason[SP_REASON_MAX], seq[24];
    int rc;

    /* As the eventlog does for a batch: load the rows the page touches, apply, write back. */
    for (size_t i = 0; i < n; i++) {
        if (!evs[i].env || sp_event_is_cred(evs[i].env->payload_case))
            continue;
        if (sp_event_is_worker(evs[i].env->payload_case))
            wkr[nw++] = evs[i].env->aggregate->id;
        else
            sbx[ns++] = evs[i].env->aggregate->id;
    }
    rc = sp_projection_load_sandboxes(rb->proj, rb->db, sbx, ns);
    if (rc >= 0)
        rc = sp_projection_load_workers(rb->proj, rb->db, wkr, nw);
    for (size_t i = 0; i < n && rc >= 0; i++) {
        const replay_event_t *ev = &evs[i];
        snprintf(seq, sizeof(seq), "%" PRIu64, ev->seq);
        rb->events++;
        rb->head = ev->seq;
        if (!ev->env)
            report(rb, "events", seq, "payload", "accepted", ev->decode_error);
        else if (sp_projection_apply(rb->proj, ev->env, ev->seq, reason) < 0)
            report(rb, "events", seq, "status", "accepted", reason);
    }
    if (rc >= 0)
        rc = sp_projection_flush(rb->proj, rb->db);
    sp_projection_clear(rb->proj);
    free(sbx);
    free(wkr);
    return rc;
}

/* Runs sql in single-row mode (constant memory, however many rows differ). */
static int each_row(PGconn *db, const char *sql, void (*fn)(PGresult *r, rebuild_t *rb),
                    rebuild_t *rb)
{
    if (!PQsendQuery(db, sql) || !PQsetSingleRowMode(db))
        return SP_EDB;
    int rc = 0;
    PGresult *r;
    while ((r = PQgetResult(db)) != NULL) {
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_SINGLE_TUPLE)
            fn(r, rb);
        else if (st != PGRES_TUPLES_OK)
            rc = SP_EDB;
        PQclear(r);
    }
    return rc;
}

static const char *value(PGresult *r, int c)
{
    return PQgetisnull(r, 0, c) ? NULL : PQgetvalue(r, 0, c);
}

static void on_missing(PGresult *r, rebuild_t *rb)
{
    int live = strcmp(PQgetvalue(r, 0, 1), "t") == 0;
    report(rb, rb->table, PQgetvalue(r, 0, 0), "(row)", live ? "present" : NULL,
           live ? NULL : "present");
}

static void on_column(PGresult *r, rebuild_t *rb)
{
    report(rb, rb->table, PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1), value(r, 2), value(r, 3));
}

/* Compares public.<table> with <schema>.<table> over the columns the migrations define. */
static int diff_table(rebuild_t *rb, const char *schema, const char *table)
{
    PGconn *db = rb->db;
    const char *params[2] = {schema, table};
    char *qs = PQescapeIdentifier(db, schema, strlen(schema));
    char *qt = PQescapeIdentifier(db, table, strlen(table));
    sp_buf_t sql;
    int rc = SP_EDB;

    sp_buf_init(&sql);
    rb->table = table;
    PGresult *cols = PQexecParams(db,
                                  "SELECT column_name FROM information_schema.columns WHERE"
                                  " table_schema = $1 AND table_name = $2 AND column_name <> 'id'"
                                  " ORDER BY ordinal_position",
                                  2, NULL, params, NULL, NULL, 0);
    if (!qs || !qt || sp_db_check(cols, PGRES_TUPLES_OK) < 0 || PQntuples(cols) == 0)
        goto out;
    sp_buf_printf(&sql,
                  "SELECT coalesce(l.id, r.id), l.id IS NOT NULL FROM public.%s l FULL JOIN %s.%s"
                  " r ON l.id = r.id WHERE l.id IS NULL OR r.id IS NULL ORDER BY 1",
                  qt, qs, qt);
    if ((rc = each_row(db, sql.data, on_missing, rb)) < 0)
        goto out;
    /* One (column, live, rebuilt) triple per column, as text, compared NULL-safely. */
    sp_buf_reset(&sql);
    sp_buf_puts(&sql, "SELECT l.id, v.col, v.lv, v.rv FROM public.");
    sp_buf_printf(&sql, "%s l JOIN %s.%s r ON l.id = r.id CROSS JOIN LATERAL (VALUES ", qt, qs, qt);
    for (int i = 0; i < PQntuples(cols); i++) {
        const char *name = PQgetvalue(cols, i, 0);
        char *qc = PQescapeIdentifier(db, name, strlen(name));
        char *lit = PQescapeLiteral(db, name, strlen(name));
        if (qc && lit)
            sp_buf_printf(&sql, "%s(%s, l.%s::text, r.%s::text)", i ? ", " : "", lit, qc, qc);
        PQfreemem(qc);
        PQfreemem(lit);
        if (!qc || !lit) {
            rc = SP_EDB;
            goto out;
        }
    }
    sp_buf_puts(&sql, ") AS v(col, lv, rv) WHERE v.lv IS DISTINCT FROM v.rv ORDER BY 1, 2");
    rc = each_row(db, sql.data, on_column, rb);
out:
    PQclear(cols);
    PQfreemem(qs);
    PQfreemem(qt);
    sp_buf_dispose(&sql);
    return rc;
}

/* A scratch schema name: a plain lower-case identifier, never one PostgreSQL or the live
 * tables use (a rebuild must not write where the eventlog writes). */
static int schema_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63 || !((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return strcmp(s, "public") != 0 && strncmp(s, "pg_", 3) != 0 &&
           strcmp(s, "information_schema") != 0;
}

int replay_rebuild_check(const replay_config_t *cfg)
{
    if (cfg->schema[0] && !schema_name_ok(cfg->schema))
        return replay_bad_option("schema", cfg->schema,
                                 "not a scratch schema name ([a-z_][a-z0-9_]*, at most 63"
                                 " characters, not public, pg_* or information_schema)");
    return 0;
}

int replay_rebuild(PGconn *db, const replay_config_t *cfg)
{
    rebuild_t rb = {.cfg = cfg, .db = db};
    replay_filter_t all = {.accepted_only = true};
    char schema[64];
    int code = REPLAY_EUSAGE;

    if (cfg->schema[0])
        snprintf(schema, sizeof(schema), "%s", cfg->schema);
    else
        snprintf(schema, sizeof(schema), "replay_%ld", (long)getpid());
    sp_buf_init(&rb.line);
    if (replay_begin(db, false) < 0 || sp_db_create_schema(db, schema) < 0)
        goto db_error;
    rb.proj = sp_projection_new(schema);
    if (replay_walk(db, &all, cfg->page, replay_page, &rb) < 0)
        goto db_error;
    for (size_t i = 0; i < sp_projection_n_tables; i++)
        if (diff_table(&rb, schema, sp_projection_tables[i]) < 0)
            goto db_error;
    if (cfg->json)
        printf("{\"events\":%" PRIu64 ",\"head_seq\":%" PRIu64 ",\"differences\":%" PRIu64
               ",\"schema\":\"%s\",\"kept\":%s}\n",
               rb.events, rb.head, rb.differences, schema, cfg->keep ? "true" : "false");
    else
        printf("rebuild: %" PRIu64 " accepted events replayed (through stream_seq %" PRIu64
               ") into schema %s; %" PRIu64 " difference%s with the live projections%s\n",
               rb.events, rb.head, schema, rb.differences, rb.differences == 1 ? "" : "s",
               cfg->keep ? "; schema kept" : "");
    if (sp_db_exec(db, cfg->keep ? "COMMIT" : "ROLLBACK") < 0)
        goto db_error;
    code = rb.differences ? REPLAY_EDIFF : REPLAY_OK;
    goto out;
db_error:
    fprintf(stderr, "space-replay: rebuild into schema %s: %s", schema, PQerrorMessage(db));
    sp_db_exec(db, "ROLLBACK");
out:
    sp_projection_free(rb.proj);
    sp_buf_dispose(&rb.line);
    return code;
}
