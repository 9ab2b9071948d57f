/* space-replay state: the sandboxes as they were at an instant, folded from the accepted
 * events up to it by the reducers the eventlog uses (lib/reduce.c, through an in-memory
 * sp_projection_t). An instant is a prefix of the log: --at TIME is the last event the log
 * stored at or before TIME (stored_at, the order the log saw), --at-seq N that sequence. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "db.h"
#include "projection.h"
#include "replay.h"

typedef struct {
    sp_projection_t *proj;
    int code;
} fold_t;

typedef struct {
    const replay_config_t *cfg;
    uint64_t seq;
    sp_buf_t line;
} print_t;

static int fold_page(replay_event_t *evs, size_t n, void *arg)
{
    fold_t *f = arg;
    char reason[SP_REASON_MAX];
    for (size_t i = 0; i < n; i++) {
        if (!evs[i].env) {
            fprintf(stderr,
                    "space-replay: stream_seq %" PRIu64 " is accepted but does not "
                    "decode: %s\n",
                    evs[i].seq, evs[i].decode_error);
            f->code = REPLAY_EBROKEN;
            continue;
        }
        if (sp_projection_apply(f->proj, evs[i].env, evs[i].seq, reason) < 0) {
            fprintf(stderr,
                    "space-replay: stream_seq %" PRIu64 " was accepted but the reducer "
                    "now refuses it: %s\n",
                    evs[i].seq, reason);
            f->code = REPLAY_EBROKEN;
        }
    }
    return 0;
}

static void print_sandbox(const sp_sandbox_t *s, void *arg)
{
    print_t *p = arg;
    sp_buf_t *b = &p->line;
    if (s->state == SP_SBX_DELETED && !p->cfg->all)
        return;
    sp_buf_reset(b);
    if (p->cfg->json) {
        sp_buf_puts(b, "{\"id\":");
        sp_buf_json_str(b, s->id);
        sp_buf_puts(b, ",\"state\":");
        sp_buf_json_str(b, sp_sbx_state_name(s->state));
        sp_buf_puts(b, ",\"worker\":");
        sp_buf_json_str(b, s->worker);
        sp_buf_puts(b, ",\"template\":");
        sp_buf_json_str(b, s->template_);
        sp_buf_puts(b, ",\"tenant\":");
        sp_buf_json_str(b, s->tenant);
        sp_buf_puts(b, ",\"failure_reason\":");
        sp_buf_json_str(b, s->failure_reason);
        sp_buf_printf(b, ",\"last_seq\":%" PRIu64 ",\"as_of_seq\":%" PRIu64 "}", s->last_seq,
                      p->seq);
    } else {
        /* The reason is free text: quoted, so the line still splits into six fields. */
        sp_buf_printf(b, "%s %-10s %-16s %-12s %-16s ", s->id, sp_sbx_state_name(s->state),
                      s->worker[0] ? s->worker : "-", s->template_, s->tenant);
        sp_buf_json_str(b, s->failure_reason);
    }
    puts(b->data);
}

/* The last stream_seq stored at or before us; 0 when the log was empty then. */
static int seq_at(PGconn *db, int64_t us, uint64_t *ret_seq)
{
    char us_s[24];
    const char *params[1] = {us_s};
    snprintf(us_s, sizeof(us_s), "%" PRId64, us);
    PGresult *r = PQexecParams(db,
                               "SELECT coalesce(max(stream_seq), 0) FROM events WHERE stored_at"
                               " <= 'epoch'::timestamptz + $1::bigint * interval '1 microsecond'",
                               1, NULL, params, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc >= 0 && PQntuples(r) == 1)
        *ret_seq = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return rc;
}

int replay_state_check(const replay_config_t *cfg)
{
    int64_t at_us;
    if (!cfg->at[0] == !cfg->at_seq) {
        fprintf(stderr, "space-replay: state needs exactly one of --at TIME and --at-seq N\n");
        return REPLAY_EUSAGE;
    }
    if (cfg->at[0] && replay_parse_time(cfg->at, &at_us) < 0)
        return replay_bad_option("at", cfg->at,
                                 "not an RFC 3339 time (2026-11-30T11:09:00Z, ...) nor now");
    return replay_check_filters(cfg);
}

int replay_state(PGconn *db, const replay_config_t *cfg)
{
    fold_t fold = {.code = REPLAY_OK};
    print_t pr = {.cfg = cfg};
    replay_filter_t f = {.tenant = cfg->tenant,
                         .aggregate_kind = "sandbox",
                         .aggregate_id = cfg->sandbox,
                         .accepted_only = true};
    int64_t at_us = 0;
    int code = REPLAY_EUSAGE;

    if (cfg->at[0] && replay_parse_time(cfg->at, &at_us) < 0)
        return REPLAY_EUSAGE; /* replay_state_check said why */
    if (replay_begin(db, true) < 0)
        goto db_error;
    pr.seq = (uint64_t)cfg->at_seq;
    if (cfg->at[0] && seq_at(db, at_us, &pr.seq) < 0)
        goto db_error;
    if (!cfg->json)
        printf("# sandboxes as of stream_seq %" PRIu64 ": id state worker template tenant "
               "failure_reason\n",
               pr.seq);
    if (pr.seq == 0) {
        code = REPLAY_OK; /* the log was empty then */
        goto out;
    }
    f.until = pr.seq;
    fold.proj = sp_projection_new(NULL);
    if (replay_walk(db, &f, cfg->page, fold_page, &fold) < 0)
        goto db_error;
    sp_buf_init(&pr.line);
    sp_projection_each_sandbox(fold.proj, print_sandbox, &pr);
    sp_buf_dispose(&pr.line);
    code = fold.code;
    goto out;
db_error:
    fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
out:
    sp_db_exec(db, "COMMIT");
    sp_projection_free(fold.proj);
    return code;
}
