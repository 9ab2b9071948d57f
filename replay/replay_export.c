/* space-replay export: the log as JSON Lines, one object per stored row in stream order,
 * accepted and rejected alike, for tools that do not speak PostgreSQL or protobuf. Only what
 * the row holds is written: the columns, the hashes, and the payload decoded as timeline
 * --json shows it (or its bytes in base64 with the reason it does not decode). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "b64.h"
#include "buf.h"
#include "db.h"
#include "replay.h"

typedef struct {
    sp_buf_t line;
    uint64_t n;
    replay_keys_t *keys; /* --decrypt */
} export_t;

static void put_str(sp_buf_t *b, const char *key, const char *value)
{
    sp_buf_printf(b, ",\"%s\":", key);
    sp_buf_json_str(b, value);
}

static void put_time(sp_buf_t *b, const char *key, bool set, int64_t us)
{
    char t[48];
    if (!set) {
        sp_buf_printf(b, ",\"%s\":null", key);
        return;
    }
    replay_format_time(t, sizeof(t), us);
    sp_buf_printf(b, ",\"%s\":\"%s\"", key, t);
}

static void put_hash(sp_buf_t *b, const char *key, const uint8_t hash[32])
{
    sp_buf_printf(b, ",\"%s\":\"", key);
    sp_buf_hex(b, hash, 32);
    sp_buf_putc(b, '"');
}

static int export_page(replay_event_t *evs, size_t n, void *arg)
{
    export_t *x = arg;
    for (size_t i = 0; i < n; i++) {
        const replay_event_t *ev = &evs[i];
        sp_buf_t *b = &x->line;
        sp_buf_reset(b);
        sp_buf_printf(b, "{\"stream_seq\":%" PRIu64, ev->seq);
        put_str(b, "status", ev->accepted ? "accepted" : "rejected");
        put_str(b, "reject_reason", ev->reject_reason);
        put_str(b, "event_id", ev->event_id);
        put_str(b, "type", ev->type);
        put_str(b, "aggregate_kind", ev->aggregate_kind);
        put_str(b, "aggregate_id", ev->aggregate_id);
        put_str(b, "tenant", ev->tenant);
        put_str(b, "actor", ev->actor);
        put_time(b, "occurred_at", ev->has_occurred_at, ev->occurred_at_us);
        put_time(b, "stored_at", true, ev->stored_at_us);
        put_str(b, "correlation_id", ev->correlation_id);
        put_str(b, "causation_id", ev->causation_id);
        put_str(b, "subject", ev->subject);
        /* What the chain covers (docs/audit.md), so that an export can be checked on its own:
         * the formula, and for a message cut to 64 KiB its whole size and digest. */
        sp_buf_printf(b, ",\"chain_v\":%" PRId64, ev->chain_v);
        if (ev->has_payload_size && ev->has_payload_sha) {
            sp_buf_printf(b, ",\"payload_size\":%" PRId64, ev->payload_size);
            put_hash(b, "payload_sha256", ev->payload_sha);
        }
        put_hash(b, "prev_hash", ev->prev_hash);
        put_hash(b, "hash", ev->hash);
        sp_buf_puts(b, ",\"payload\":");
        if (ev->env) {
            sp_envelope_to_json(ev->env, b);
            /* Command output and sealed command lines as text (--decrypt) or "<encrypted N
             * bytes>" (docs/audit.md). */
            if (strcmp(ev->aggregate_kind, "sandbox") == 0)
                replay_sealed_append(x->keys, ev->aggregate_id, ev->env, true, b);
        } else {
            sp_buf_puts(b, "null,\"payload_base64\":\"");
            sp_b64_encode(b, ev->payload, ev->payload_len);
            sp_buf_putc(b, '"');
            put_str(b, "decode_error", ev->decode_error);
        }
        sp_buf_puts(b, "}\n");
        if (fwrite(b->data, 1, b->len, stdout) != b->len)
            return -1;
        x->n++;
    }
    return 0;
}

int replay_export(PGconn *db, const replay_config_t *cfg)
{
    replay_filter_t f = {.since = (uint64_t)cfg->since,
                         .until = (uint64_t)cfg->until,
                         .tenant = cfg->tenant,
                         .aggregate_id = cfg->sandbox,
                         .type = cfg->type};
    export_t x = {.n = 0};
    int code = REPLAY_OK;

    if (cfg->sandbox[0])
        f.aggregate_kind = "sandbox";
    if (replay_begin(db, true) < 0) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        return REPLAY_EUSAGE;
    }
    if (replay_keys_open(db, cfg, &x.keys) < 0) {
        sp_db_exec(db, "COMMIT");
        return REPLAY_EUSAGE;
    }
    sp_buf_init(&x.line);
    int rc = replay_walk(db, &f, cfg->page, export_page, &x);
    if (rc == -1 || fflush(stdout) != 0) {
        fprintf(stderr, "space-replay: cannot write to stdout\n");
        code = REPLAY_EUSAGE;
    } else if (rc < 0) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        code = REPLAY_EUSAGE;
    }
    sp_db_exec(db, "COMMIT");
    if (x.line.data)
        explicit_bzero(x.line.data, x.line.cap);
    sp_buf_dispose(&x.line);
    replay_keys_close(x.keys);
    return code;
}
