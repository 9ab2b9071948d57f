/* space-replay verify: recompute the hash chain over the whole log and check that every row's
 * columns say what its stored envelope says. Any UPDATE or DELETE made by hand shows up as the
 * first row where one of these fails:
 *   - prev_hash differs from the previous row's hash     (a row deleted or inserted)
 *   - hash differs from SHA-256(prev_hash || payload)    (payload or hash edited)
 *   - a column differs from the decoded payload          (type, tenant, ... edited)
 *   - an accepted row's payload does not decode/validate (status edited)
 * Deleting the newest rows leaves a valid, shorter chain: compare the head with the stream
 * (or with a head recorded elsewhere) to detect that.
 *
 * A superuser can recompute the hashes after rewriting a payload; not the signatures. So every
 * accepted row's stored envelope is verified again (sp_envelope_verify, keyring from
 * --keyring-dir, default $SPACE_HOME/creds): "signed" rows verify, "unsigned" ones are rows
 * from before signing (reported, never counted as trusted), "bad" ones fail, and the first of
 * them is named. Rejected rows are not verified: they changed nothing. Without a keyring the
 * signed rows are reported as not verified. Whether the signer was allowed to say what it
 * said (the contract) is the event log's check at store time and is not repeated here. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "contract.h"
#include "db.h"
#include "envelope.h"
#include "error.h"
#include "hash.h"
#include "replay.h"
#include "sign.h"
#include "xmalloc.h"

typedef struct {
    const sp_keyring_t *kr; /* NULL: no keyring, signatures not verified */
    sp_sigcache_t *cache;
    uint64_t signed_ok, unsigned_rows, unverified, bad;
    uint64_t bad_seq;
    char bad_id[37];
    const char *bad_reason;
} sigs_t;

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
                   const uint8_t head[SP_SHA256_LEN], const char *reason, const sigs_t *g)
{
    char hex[SP_SHA256_HEX_LEN + 1];
    sp_hex_encode(head, SP_SHA256_LEN, hex);
    if (cfg->json) {
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_printf(&b, "{\"ok\":%s,\"events\":%" PRIu64 ",",
                      ok && g->bad == 0 ? "true" : "false", n);
        if (ok) {
            sp_buf_printf(&b, "\"head_seq\":%" PRIu64 ",\"head_hash\":\"%s\"", seq, hex);
        } else {
            sp_buf_printf(&b, "\"broken_seq\":%" PRIu64 ",\"reason\":", seq);
            sp_buf_json_str(&b, reason);
        }
        sp_buf_printf(&b,
                      ",\"keyring\":%s,\"signed\":%" PRIu64 ",\"unsigned\":%" PRIu64
                      ",\"unverified\":%" PRIu64 ",\"bad\":%" PRIu64,
                      g->kr ? "true" : "false", g->signed_ok, g->unsigned_rows, g->unverified,
                      g->bad);
        if (g->bad) {
            sp_buf_printf(&b,
                          ",\"first_bad\":{\"stream_seq\":%" PRIu64 ",\"event_id\":", g->bad_seq);
            sp_buf_json_str(&b, g->bad_id);
            sp_buf_puts(&b, ",\"reason\":");
            sp_buf_json_str(&b, g->bad_reason);
            sp_buf_putc(&b, '}');
        }
        sp_buf_putc(&b, '}');
        puts(b.data);
        sp_buf_dispose(&b);
        return;
    }
    if (ok) {
        printf("chain intact: %" PRIu64 " events, head seq %" PRIu64 ", head hash %s\n", n, seq,
               hex);
    } else {
        printf("chain BROKEN at stream_seq %" PRIu64 " (%" PRIu64 " events verified before "
               "it): %s\n",
               seq, n, reason);
    }
    printf("signatures: %" PRIu64 " signed, %" PRIu64
           " unsigned (historical, not trusted), %" PRIu64 " bad",
           g->signed_ok, g->unsigned_rows, g->bad);
    if (!g->kr)
        printf(", %" PRIu64 " NOT VERIFIED (no keyring)", g->unverified);
    printf("\n");
    if (g->bad)
        printf("first bad signature at stream_seq %" PRIu64 " (event %s): %s\n", g->bad_seq,
               g->bad_id, g->bad_reason);
}

/* An accepted row's signature, again. */
static void check_signature(sigs_t *g, const replay_event_t *ev)
{
    const sp_envelope_t *e = ev->env;
    int rc;

    if (!ev->accepted || !e)
        return;
    if (!e->signer[0] && e->signature.len == 0) {
        g->unsigned_rows++;
        return;
    }
    if (!g->kr) {
        g->unverified++;
        return;
    }
    rc = sp_envelope_verify(g->kr, g->cache, e, ev->payload, ev->payload_len);
    if (rc == 0) {
        g->signed_ok++;
        return;
    }
    if (g->bad++ == 0) {
        const char *name = sp_trust_refusal_name(rc);
        g->bad_seq = ev->seq;
        snprintf(g->bad_id, sizeof(g->bad_id), "%s", e->event_id);
        g->bad_reason = name ? name : "bad_signature";
    }
}

typedef struct {
    uint8_t running[SP_SHA256_LEN];
    uint64_t head, n;
    uint64_t broken_seq;
    const char *broken; /* why the chain broke at broken_seq; NULL while intact */
    sigs_t sigs;
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
        check_signature(&c->sigs, ev);
        memcpy(c->running, ev->hash, SP_SHA256_LEN);
        c->head = ev->seq;
        c->n++;
    }
    return 0;
}

/* The keyring, when its directory exists; a directory that exists but does not load is an
 * error (a verification against half a keyring would report good rows as bad). */
static int load_keyring(const replay_config_t *cfg, sp_keyring_t **ret_kr)
{
    const char *home = getenv("SPACE_HOME");
    char *dir = cfg->keyring_dir[0] ? sp_xstrdup(cfg->keyring_dir)
                                    : sp_xasprintf("%s/creds", home && home[0] ? home : ".");
    int rc = sp_keyring_load(dir, ret_kr);

    if (rc == -ENOENT && !cfg->keyring_dir[0]) {
        *ret_kr = NULL;
        rc = 0;
    } else if (rc < 0) {
        fprintf(stderr, "space-replay: keyring %s: %s\n", dir, sp_strerror(rc));
    }
    free(dir);
    return rc;
}

int replay_verify(PGconn *db, const replay_config_t *cfg)
{
    replay_filter_t all = {.since = 0};
    chain_t c = {.n = 0};
    sp_keyring_t *kr = NULL;
    int code = REPLAY_EUSAGE;

    memcpy(c.running, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    if (load_keyring(cfg, &kr) < 0)
        return REPLAY_EUSAGE;
    c.sigs.kr = kr;
    sp_sigcache_new(4096, &c.sigs.cache);
    if (replay_begin(db, true) < 0) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        goto out;
    }
    int rc = replay_walk(db, &all, cfg->page, verify_page, &c);
    sp_db_exec(db, "COMMIT");
    if (rc == CHAIN_BROKEN) {
        report(cfg, 0, c.broken_seq, c.n, c.running, c.broken, &c.sigs);
        code = REPLAY_EBROKEN;
        goto out;
    }
    if (rc < 0) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        goto out;
    }
    report(cfg, 1, c.head, c.n, c.running, NULL, &c.sigs);
    code = c.sigs.bad ? REPLAY_EBROKEN : REPLAY_OK;
out:
    sp_sigcache_free(c.sigs.cache);
    sp_keyring_free(kr);
    return code;
}
