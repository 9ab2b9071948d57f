/* space-replay timeline --sandbox ID: every event about one sandbox, in log order, with the
 * state the reducers derive after each one (the same reducers the event log applies, so this
 * is what the projection said at that instant). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "db.h"
#include "envelope.h"
#include "ids.h"
#include "reduce.h"
#include "replay.h"

/* The payload alone, as JSON: the envelope rendering minus the header fields. */
static void payload_json(const sp_envelope_t *e, sp_buf_t *out)
{
    sp_buf_t all;
    sp_buf_init(&all);
    sp_envelope_to_json(e, &all);
    /* The payload is the last member of the envelope object: find its key. */
    const char *name = NULL;
    for (unsigned i = 0; i < e->base.descriptor->n_fields; i++)
        if (e->base.descriptor->fields[i].id == (uint32_t)e->payload_case)
            name = e->base.descriptor->fields[i].name;
    char key[128];
    snprintf(key, sizeof(key), "\"%s\":", name ? name : "");
    const char *p = name ? strstr(all.data, key) : NULL;
    if (p) {
        p += strlen(key);
        sp_buf_append(out, p, strlen(p) - 1); /* drop the envelope's closing brace */
    } else {
        sp_buf_puts(out, "{}");
    }
    sp_buf_dispose(&all);
}

int replay_timeline(PGconn *db, const replay_config_t *cfg)
{
    sp_sandbox_t s;
    sp_buf_t line;
    int code = 0;
    uint64_t n = 0;

    if (!cfg->sandbox || !cfg->sandbox[0] || !sp_id_valid(cfg->sandbox)) {
        fprintf(stderr, "space-replay: timeline needs --sandbox ID\n");
        return 1;
    }
    replay_keys_t *keys = NULL;
    if (replay_keys_open(db, cfg, &keys) < 0)
        return 1;
    sp_sandbox_init(&s, cfg->sandbox);
    sp_buf_init(&line);
    const char *params[1] = {cfg->sandbox};
    /* Binary results: payload comes back as raw bytes. */
    PGresult *r = PQexecParams(db,
                               "SELECT stream_seq::text, status, coalesce(reject_reason, ''),"
                               " payload FROM events WHERE aggregate_kind = 'sandbox' AND"
                               " aggregate_id = $1 ORDER BY events.stream_seq",
                               1, NULL, params, NULL, NULL, 1);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        PQclear(r);
        replay_keys_close(keys);
        return 1;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        uint64_t seq = strtoull(PQgetvalue(r, i, 0), NULL, 10);
        const char *status = PQgetvalue(r, i, 1);
        const char *stored_reason = PQgetvalue(r, i, 2);
        sp_envelope_t *e = NULL;
        char reason[SP_REASON_MAX];
        char when[48];

        if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 3), (size_t)PQgetlength(r, i, 3),
                               &e, reason) < 0) {
            fprintf(stderr, "space-replay: stream_seq %" PRIu64 " does not decode: %s\n", seq,
                    reason);
            code = 2;
            continue;
        }
        int accepted = strcmp(status, "accepted") == 0;
        /* Only accepted events moved the projection; rejected ones are shown, not applied. */
        if (accepted && sp_reduce_sandbox(&s, e, seq, reason) < 0) {
            fprintf(stderr,
                    "space-replay: stream_seq %" PRIu64 " was accepted but the reducer now "
                    "refuses it: %s\n",
                    seq, reason);
            code = 2;
        }
        replay_format_time(when, sizeof(when), e->occurred_at_us);
        sp_buf_reset(&line);
        if (cfg->json) {
            sp_buf_printf(&line, "{\"seq\":%" PRIu64 ",\"status\":", seq);
            sp_buf_json_str(&line, status);
            if (!accepted) {
                sp_buf_puts(&line, ",\"reject_reason\":");
                sp_buf_json_str(&line, stored_reason);
            }
            sp_buf_puts(&line, ",\"state_after\":");
            sp_buf_json_str(&line, sp_sbx_state_name(s.state));
            sp_buf_puts(&line, ",\"event\":");
            sp_envelope_to_json(e, &line);
            replay_sealed_append(keys, cfg->sandbox, e, true, &line);
            sp_buf_putc(&line, '}');
        } else {
            sp_buf_printf(&line, "%s  seq=%-8" PRIu64 " %-24s state=%-10s actor=%s", when, seq,
                          e->type, sp_sbx_state_name(s.state), e->actor);
            if (e->correlation_id[0])
                sp_buf_printf(&line, " corr=%s", e->correlation_id);
            if (!accepted)
                sp_buf_printf(&line, "  REJECTED: %s", stored_reason);
            sp_buf_puts(&line, "  ");
            payload_json(e, &line);
            replay_sealed_append(keys, cfg->sandbox, e, false, &line);
        }
        puts(line.data);
        sp_envelope_free(e);
        n++;
    }
    PQclear(r);
    if (n == 0) {
        fprintf(stderr, "space-replay: no events for sandbox %s\n", cfg->sandbox);
        code = code ? code : 1;
    }
    sp_sandbox_dispose(&s);
    if (line.data)
        explicit_bzero(line.data, line.cap);
    sp_buf_dispose(&line);
    replay_keys_close(keys);
    return code;
}
