/* space-replay verify: recompute the hash chain over the whole log and check that every row's
 * columns say what its stored envelope says. Any UPDATE or DELETE made by hand shows up as the
 * first row where one of these fails:
 *   - prev_hash differs from the previous row's hash     (a row deleted or inserted)
 *   - hash differs from SHA-256(prev_hash || payload)    (payload or hash edited)
 *   - a column differs from the decoded payload          (type, tenant, ... edited)
 *   - an accepted row's payload does not decode/validate (status edited)
 * Deleting the newest rows leaves a valid, shorter chain: compare the head with the stream
 * (or with a head recorded elsewhere) to detect that. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "db.h"
#include "envelope.h"
#include "hash.h"
#include "replay.h"

enum {
    C_SEQ,
    C_EVENT_ID,
    C_SUBJECT,
    C_TYPE,
    C_AGG_KIND,
    C_AGG_ID,
    C_TENANT,
    C_ACTOR,
    C_OCCURRED_US,
    C_CORR,
    C_CAUSE,
    C_VERSION,
    C_STATUS,
    C_PAYLOAD,
    C_PREV,
    C_HASH,
};

static const char *col(PGresult *r, int row, int c)
{
    return PQgetisnull(r, row, c) ? NULL : PQgetvalue(r, row, c);
}

static int str_eq(const char *column, const char *field)
{
    /* Empty proto strings are stored as NULL for optional columns. */
    if (!column)
        return field == NULL || field[0] == '\0';
    return field && strcmp(column, field) == 0;
}

/* Returns NULL when the row's columns agree with its payload, else what differs. */
static const char *check_columns(PGresult *r, int row, const uint8_t *payload, size_t len,
                                 char reason[SP_REASON_MAX])
{
    const char *status = col(r, row, C_STATUS);
    sp_envelope_t *e = NULL;
    const char *what = NULL;

    if (!status || (strcmp(status, "accepted") != 0 && strcmp(status, "rejected") != 0))
        return "status is neither accepted nor rejected";
    int decoded = sp_envelope_decode(payload, len, &e, reason) == 0;
    int accepted = strcmp(status, "accepted") == 0;
    int bare = !col(r, row, C_EVENT_ID) && !col(r, row, C_TYPE) && !col(r, row, C_TENANT);
    if (!decoded) {
        if (accepted)
            return "row is accepted but its payload does not validate";
        if (!bare)
            return "columns filled for a payload that does not decode";
        return NULL;
    }
    /* A rejected row the eventlog stored without its envelope's columns (the database refused
     * them: "not storable") carries only the raw bytes, which the chain covers. */
    if (!accepted && bare) {
        sp_envelope_free(e);
        return NULL;
    }
    if (accepted && sp_envelope_check_subject(e, col(r, row, C_SUBJECT), reason) < 0)
        what = "subject does not match the payload";
    else if (!str_eq(col(r, row, C_EVENT_ID), e->event_id))
        what = "event_id differs from the payload";
    else if (!str_eq(col(r, row, C_TYPE), e->type))
        what = "type differs from the payload";
    else if (!str_eq(col(r, row, C_AGG_KIND), e->aggregate->kind) ||
             !str_eq(col(r, row, C_AGG_ID), e->aggregate->id))
        what = "aggregate differs from the payload";
    else if (!col(r, row, C_TENANT) || strcmp(col(r, row, C_TENANT), e->tenant) != 0)
        what = "tenant differs from the payload";
    else if (!str_eq(col(r, row, C_ACTOR), e->actor))
        what = "actor differs from the payload";
    else if (!col(r, row, C_OCCURRED_US) ||
             strtoll(col(r, row, C_OCCURRED_US), NULL, 10) != e->occurred_at_us)
        what = "occurred_at differs from the payload";
    else if (!col(r, row, C_CORR) || strcmp(col(r, row, C_CORR), e->correlation_id) != 0)
        what = "correlation_id differs from the payload";
    else if (!str_eq(col(r, row, C_CAUSE), e->causation_id))
        what = "causation_id differs from the payload";
    else if (!col(r, row, C_VERSION) ||
             strtoul(col(r, row, C_VERSION), NULL, 10) != e->schema_version)
        what = "schema_version differs from the payload";
    sp_envelope_free(e);
    return what;
}

static int decode_bytea(const char *text, uint8_t *out, size_t len)
{
    if (!text || strncmp(text, "\\x", 2) != 0 || strlen(text + 2) != len * 2)
        return -1;
    return sp_hex_decode(text + 2, out, len);
}

static void report(const replay_config_t *cfg, int ok, uint64_t seq, uint64_t n,
                   const uint8_t head[SP_SHA256_LEN], const char *reason)
{
    char hex[SP_SHA256_HEX_LEN + 1];
    sp_hex_encode(head, SP_SHA256_LEN, hex);
    if (cfg->json) {
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_printf(&b, "{\"ok\":%s,\"events\":%" PRIu64 ",", ok ? "true" : "false", n);
        if (ok) {
            sp_buf_printf(&b, "\"head_seq\":%" PRIu64 ",\"head_hash\":\"%s\"}", seq, hex);
        } else {
            sp_buf_printf(&b, "\"broken_seq\":%" PRIu64 ",\"reason\":", seq);
            sp_buf_json_str(&b, reason);
            sp_buf_putc(&b, '}');
        }
        puts(b.data);
        sp_buf_dispose(&b);
    } else if (ok) {
        printf("chain intact: %" PRIu64 " events, head seq %" PRIu64 ", head hash %s\n", n, seq,
               hex);
    } else {
        printf("chain BROKEN at stream_seq %" PRIu64 " (%" PRIu64 " events verified before "
               "it): %s\n",
               seq, n, reason);
    }
}

int replay_verify(PGconn *db, const replay_config_t *cfg)
{
    uint8_t running[SP_SHA256_LEN];
    uint64_t after = 0, n = 0;
    char reason[SP_REASON_MAX];
    char msg[2 * SP_REASON_MAX];

    memcpy(running, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    /* A repeatable-read snapshot: the eventlog may append while we walk. */
    if (sp_db_exec(db, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") < 0) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        return 1;
    }
    for (;;) {
        char after_s[24], limit_s[24];
        const char *params[2] = {after_s, limit_s};
        snprintf(after_s, sizeof(after_s), "%" PRIu64, after);
        snprintf(limit_s, sizeof(limit_s), "%" PRId64, cfg->page);
        PGresult *r = PQexecParams(
            db,
            "SELECT stream_seq, event_id::text, subject, type, aggregate_kind, aggregate_id,"
            " tenant, actor, (extract(epoch from occurred_at) * 1000000)::bigint,"
            " correlation_id, causation_id::text, schema_version, status, payload,"
            " prev_hash::text, hash::text"
            " FROM events WHERE stream_seq > $1 ORDER BY stream_seq LIMIT $2",
            2, NULL, params, NULL, NULL, 0);
        if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
            fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
            PQclear(r);
            return 1;
        }
        int rows = PQntuples(r);
        for (int i = 0; i < rows; i++) {
            uint64_t seq = strtoull(PQgetvalue(r, i, C_SEQ), NULL, 10);
            uint8_t prev[SP_SHA256_LEN], hash[SP_SHA256_LEN], want[SP_SHA256_LEN];
            size_t plen = 0;
            unsigned char *payload =
                PQunescapeBytea((const unsigned char *)PQgetvalue(r, i, C_PAYLOAD), &plen);
            const char *bad = NULL;

            if (!payload) {
                bad = "payload is not bytea";
            } else if (decode_bytea(PQgetvalue(r, i, C_PREV), prev, SP_SHA256_LEN) < 0 ||
                       decode_bytea(PQgetvalue(r, i, C_HASH), hash, SP_SHA256_LEN) < 0) {
                bad = "prev_hash or hash is not 32 bytes";
            } else if (memcmp(prev, running, SP_SHA256_LEN) != 0) {
                bad = n == 0 ? "first row does not start from the genesis hash"
                             : "prev_hash does not match the previous row's hash (a row was "
                               "removed, inserted or rewritten)";
            } else {
                sp_chain_next(prev, payload, plen, want);
                if (memcmp(want, hash, SP_SHA256_LEN) != 0)
                    bad = "hash is not SHA-256(prev_hash || payload) (payload or hash altered)";
            }
            if (!bad)
                bad = check_columns(r, i, payload, plen, reason);
            PQfreemem(payload);
            if (bad) {
                snprintf(msg, sizeof(msg), "%s", bad);
                report(cfg, 0, seq, n, running, msg);
                PQclear(r);
                return 2;
            }
            memcpy(running, hash, SP_SHA256_LEN);
            after = seq;
            n++;
        }
        PQclear(r);
        if (rows < cfg->page)
            break;
    }
    sp_db_exec(db, "COMMIT");
    report(cfg, 1, after, n, running, NULL);
    return 0;
}
