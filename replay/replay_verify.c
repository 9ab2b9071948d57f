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

static int str_eq(const char *column, const char *field)
{
    /* Empty proto strings are stored as NULL for optional columns. */
    if (!column)
        return field == NULL || field[0] == '\0';
    return field && strcmp(column, field) == 0;
}

/* Returns NULL when the row's columns agree with its payload, else what differs. */
static const char *check_columns(const replay_event_t *ev)
{
    const sp_envelope_t *e = ev->env;
    char reason[SP_REASON_MAX];

    if (strcmp(ev->status, "accepted") != 0 && strcmp(ev->status, "rejected") != 0)
        return "status is neither accepted nor rejected";
    int bare = !ev->event_id && !ev->type && !ev->tenant;
    if (!e) {
        if (ev->accepted)
            return "row is accepted but its payload does not validate";
        if (!bare)
            return "columns filled for a payload that does not decode";
        return NULL;
    }
    /* A rejected row the eventlog stored without its envelope's columns (the database refused
     * them: "not storable") carries only the raw bytes, which the chain covers. */
    if (!ev->accepted && bare)
        return NULL;
    if (ev->accepted && sp_envelope_check_subject(e, ev->subject, reason) < 0)
        return "subject does not match the payload";
    if (!str_eq(ev->event_id, e->event_id))
        return "event_id differs from the payload";
    if (!str_eq(ev->type, e->type))
        return "type differs from the payload";
    if (!str_eq(ev->aggregate_kind, e->aggregate->kind) ||
        !str_eq(ev->aggregate_id, e->aggregate->id))
        return "aggregate differs from the payload";
    if (!ev->tenant || strcmp(ev->tenant, e->tenant) != 0)
        return "tenant differs from the payload";
    if (!str_eq(ev->actor, e->actor))
        return "actor differs from the payload";
    if (!ev->has_occurred_at || ev->occurred_at_us != e->occurred_at_us)
        return "occurred_at differs from the payload";
    if (!ev->correlation_id || strcmp(ev->correlation_id, e->correlation_id) != 0)
        return "correlation_id differs from the payload";
    if (!str_eq(ev->causation_id, e->causation_id))
        return "causation_id differs from the payload";
    if (!ev->has_schema_version || ev->schema_version != (int64_t)e->schema_version)
        return "schema_version differs from the payload";
    return NULL;
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

typedef struct {
    uint8_t running[SP_SHA256_LEN];
    uint64_t head, n;
    uint64_t broken_seq;
    const char *broken; /* why the chain broke at broken_seq; NULL while intact */
} chain_t;

#define CHAIN_BROKEN (-2) /* stops the walk at the first broken row */

static int verify_page(replay_event_t *evs, size_t n, void *arg)
{
    chain_t *c = arg;
    for (size_t i = 0; i < n; i++) {
        const replay_event_t *ev = &evs[i];
        uint8_t want[SP_SHA256_LEN];
        const char *bad = NULL;

        if (!ev->hashes_ok) {
            bad = "prev_hash or hash is not 32 bytes";
        } else if (memcmp(ev->prev_hash, c->running, SP_SHA256_LEN) != 0) {
            bad = c->n == 0 ? "first row does not start from the genesis hash"
                            : "prev_hash does not match the previous row's hash (a row was "
                              "removed, inserted or rewritten)";
        } else {
            sp_chain_next(ev->prev_hash, ev->payload, ev->payload_len, want);
            if (memcmp(want, ev->hash, SP_SHA256_LEN) != 0)
                bad = "hash is not SHA-256(prev_hash || payload) (payload or hash altered)";
        }
        if (!bad)
            bad = check_columns(ev);
        if (bad) {
            c->broken = bad;
            c->broken_seq = ev->seq;
            return CHAIN_BROKEN;
        }
        memcpy(c->running, ev->hash, SP_SHA256_LEN);
        c->head = ev->seq;
        c->n++;
    }
    return 0;
}

int replay_verify(PGconn *db, const replay_config_t *cfg)
{
    replay_filter_t all = {.since = 0};
    chain_t c = {.n = 0};

    memcpy(c.running, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    if (replay_begin(db, true) < 0) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        return REPLAY_EUSAGE;
    }
    int rc = replay_walk(db, &all, cfg->page, verify_page, &c);
    sp_db_exec(db, "COMMIT");
    if (rc == CHAIN_BROKEN) {
        report(cfg, 0, c.broken_seq, c.n, c.running, c.broken);
        return REPLAY_EBROKEN;
    }
    if (rc < 0) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        return REPLAY_EUSAGE;
    }
    report(cfg, 1, c.head, c.n, c.running, NULL);
    return REPLAY_OK;
}
