/* space-replay verify: recompute the hash chain over the whole log, check that every row's
 * columns say what its stored envelope says, and check the chain against what lies outside
 * PostgreSQL (docs/audit.md): the event log's signed checkpoints (the stream SPACE_CHECKPOINTS
 * and the checkpoint file) and the event stream itself. Any UPDATE or DELETE made by hand,
 * with or without the hashes recomputed, shows up as the first row where one of these fails:
 *   - prev_hash differs from the previous row's hash     (a row deleted or inserted)
 *   - hash differs from the row's chain formula          (payload, hash, status, reject
 *                                                          reason, subject or stream_seq edited)
 *   - stream_seq is not the one after the previous row   (a row deleted, the chain recomputed)
 *   - a column differs from the decoded payload          (type, tenant, ... edited)
 *   - an accepted row's payload does not decode/validate (status edited)
 *   - the head at a checkpoint's seq is not the signed one, or the row count differs
 *                                                         (rows rewritten or renumbered and
 *                                                          the chain recomputed; the row is
 *                                                          found by comparing the rows since
 *                                                          the last good checkpoint with the
 *                                                          stream's messages)
 *   - the log ends before a checkpoint's seq or before the stream's last sequence
 *                                                         (the newest rows deleted)
 * and the witnesses agree: every checkpoint in the file is in the stream (a stream that lost
 * some, or was deleted, is a truncated witness).
 *
 * A superuser can recompute the hashes after rewriting a payload; not the signatures. So every
 * accepted row's stored envelope is verified again (sp_envelope_verify, keyring from
 * --keyring-dir, default $SPACE_HOME/creds): "signed" rows verify, "unsigned" ones are rows
 * from before signing (reported, never counted as trusted; bad when a checkpoint says the log
 * verified signatures when it stored them), "bad" ones fail, and the first of them is named.
 * A headed batch's member (sign.h) is verified against the accepted head before it, by the
 * event log's own rule (sighead.h).
 * Rejected rows are not verified: they changed nothing. Without a keyring neither the
 * signatures nor the checkpoints can be verified, and verify says so. Whether the signer was
 * allowed to say what it said (the contract) is the event log's check at store time and is not
 * repeated here. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "buf.h"
#include "bus.h"
#include "busid.h"
#include "checkpoint.h"
#include "contract.h"
#include "db.h"
#include "envelope.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "replay.h"
#include "sighead.h"
#include "sign.h"
#include "xmalloc.h"

typedef struct {
    const sp_keyring_t *kr; /* NULL: no keyring, signatures not verified */
    sp_sigcache_t *cache;
    uint64_t signed_ok, unsigned_rows, unverified, bad;
    uint64_t bad_seq;
    char bad_id[37];
    const char *bad_reason;
    char bad_reason_buf[SP_REASON_MAX];
    /* Headed batches (sighead.h): the heads verified so far, and the log to read older ones
     * from, by the event log's own rule. */
    sp_sighead_ring_t heads;
    PGconn *db;
} sigs_t;

/* One checkpoint, from the file, the stream or both (matched by the line's bytes). */
typedef struct {
    sp_ckpt_t c;
    uint8_t line_sha[SP_SHA256_LEN];
    bool in_file, in_stream;
} ckpt_t;

typedef struct {
    ckpt_t *v;
    size_t n;
    uint64_t file_lines, stream_msgs;
    bool file_read, stream_read, stream_missing;
    const char *file; /* the path read, or NULL */
    /* The first problem with the witnesses themselves (a line that is no valid checkpoint,
     * the stream shorter than the file); seq: the log sequence it concerns. */
    const char *bad;
    char bad_buf[256];
    uint64_t bad_seq;
    uint64_t file_only, stream_only;
    /* Rows accepted while the log verified signatures: merged [from, to] ranges. */
    uint64_t (*vf)[2];
    size_t nvf;
} anchors_t;

/* A lost row's range ("lost: A-B"), for the stream check afterwards. */
typedef struct {
    uint64_t from, to;
} range_t;

typedef struct {
    uint8_t running[SP_SHA256_LEN];
    uint64_t head, n;
    uint64_t next_seq; /* the stream_seq the next row must have (0: any: before chain v2) */
    bool saw_v2;
    uint64_t v1_gaps; /* sequences missing between rows from before chain v2 */
    uint64_t broken_seq;
    const char *broken; /* why the chain broke at broken_seq; NULL while intact */
    char broken_buf[320];
    sigs_t sigs;
    anchors_t *a;
    size_t ci; /* next checkpoint (a->v sorted by seq) */
    size_t vfi;
    uint64_t ckpt_ok, good_seq;      /* checkpoints matched; seq of the last one matched */
    uint64_t anchor_from, anchor_to; /* a checkpoint mismatch: the rows it concerns */
    range_t *lost;
    size_t nlost;
    uint64_t lost_seqs;
} chain_t;

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

/* ---- the anchors: checkpoints from the file and the stream ---- */

static void anchor_bad(anchors_t *a, uint64_t seq, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void anchor_bad(anchors_t *a, uint64_t seq, const char *fmt, ...)
{
    va_list ap;
    if (a->bad && a->bad_seq <= seq)
        return;
    va_start(ap, fmt);
    vsnprintf(a->bad_buf, sizeof(a->bad_buf), fmt, ap);
    va_end(ap);
    a->bad = a->bad_buf;
    a->bad_seq = seq;
}

/* Adds one line from a witness (file or stream); a line that is no valid checkpoint of a
 * known eventlog identity is a tampered witness. */
static void add_line(anchors_t *a, const sp_keyring_t *kr, const char *line, size_t len,
                     bool from_file, uint64_t where)
{
    sp_ckpt_t c;
    uint8_t sha[SP_SHA256_LEN];
    int rc;

    if (len > 0 && line[len - 1] == '\n')
        len--;
    rc = sp_ckpt_verify(kr, line, len, &c);
    if (rc < 0) {
        anchor_bad(a, rc == SP_EDECODE ? 0 : c.seq, "%s %" PRIu64 " is no valid checkpoint: %s",
                   from_file ? "checkpoint file line" : "checkpoint stream message", where,
                   rc == SP_EDECODE       ? "malformed"
                   : rc == SP_ENOTALLOWED ? "signer is not an eventlog identity"
                   : rc == SP_ESIGNER     ? "signer unknown to the keyring"
                                          : "bad signature");
        return;
    }
    sp_sha256(line, len, sha);
    for (size_t i = 0; i < a->n; i++)
        if (memcmp(a->v[i].line_sha, sha, SP_SHA256_LEN) == 0) {
            a->v[i].in_file |= from_file;
            a->v[i].in_stream |= !from_file;
            return;
        }
    a->v = sp_xreallocarray(a->v, a->n + 1, sizeof(*a->v));
    ckpt_t *k = &a->v[a->n++];
    memset(k, 0, sizeof(*k));
    k->c = c;
    memcpy(k->line_sha, sha, SP_SHA256_LEN);
    k->in_file = from_file;
    k->in_stream = !from_file;
}

static int read_file(anchors_t *a, const sp_keyring_t *kr, const char *path, bool required)
{
    FILE *f = fopen(path, "re");
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;

    if (!f) {
        if (errno == ENOENT && !required)
            return 0;
        fprintf(stderr, "space-replay: checkpoint file %s: %s\n", path, strerror(errno));
        return -1;
    }
    a->file_read = true;
    a->file = path;
    while ((len = getline(&line, &cap, f)) > 0) {
        a->file_lines++;
        add_line(a, kr, line, (size_t)len, true, a->file_lines);
    }
    free(line);
    fclose(f);
    return 0;
}

/* Every message of the checkpoint stream. */
static int read_stream(anchors_t *a, const sp_keyring_t *kr, sp_bus_t *bus)
{
    sp_bus_stream_state_t st;
    int rc = sp_bus_stream_state(bus, SP_CKPT_STREAM, &st);

    if (rc == SP_ENOTFOUND) {
        a->stream_missing = true;
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "space-replay: %s: %s\n", SP_CKPT_STREAM, sp_strerror(rc));
        return -1;
    }
    a->stream_read = true;
    for (uint64_t seq = st.first_seq; seq > 0 && seq <= st.last_seq; seq++) {
        uint8_t *data = NULL;
        size_t len = 0;
        rc = sp_bus_get_stream_msg(bus, SP_CKPT_STREAM, seq, NULL, &data, &len, NULL);
        if (rc == SP_ENOTFOUND)
            continue;
        if (rc < 0) {
            fprintf(stderr, "space-replay: %s message %" PRIu64 ": %s\n", SP_CKPT_STREAM, seq,
                    sp_strerror(rc));
            return -1;
        }
        a->stream_msgs++;
        add_line(a, kr, (const char *)data, len, false, seq);
        free(data);
    }
    return 0;
}

static int cmp_ckpt(const void *x, const void *y)
{
    const ckpt_t *a = x, *b = y;
    return a->c.seq < b->c.seq ? -1 : a->c.seq > b->c.seq;
}

static int cmp_range(const void *x, const void *y)
{
    const uint64_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

/* Sorts the checkpoints, compares the witnesses and merges the verified ranges. */
static void anchors_settle(anchors_t *a)
{
    if (a->n > 1)
        qsort(a->v, a->n, sizeof(*a->v), cmp_ckpt);
    for (size_t i = 0; i < a->n; i++) {
        const ckpt_t *k = &a->v[i];
        if (a->stream_read && k->in_file && !k->in_stream) {
            a->file_only++;
            anchor_bad(a, k->c.seq,
                       "the stream witness is truncated: the checkpoint of seq %" PRIu64
                       " in the file is not in %s",
                       k->c.seq, SP_CKPT_STREAM);
        }
        if (a->file_read && k->in_stream && !k->in_file)
            a->stream_only++;
    }
    if (a->stream_missing && a->file_read && a->n > 0)
        anchor_bad(a, a->v[0].c.seq,
                   "the stream witness is missing: %s does not exist but the file holds %zu "
                   "checkpoints",
                   SP_CKPT_STREAM, a->n);
    a->vf = sp_xcalloc(a->n ? a->n : 1, sizeof(*a->vf));
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i].c.verify_from > 0 && a->v[i].c.verify_from <= a->v[i].c.seq) {
            a->vf[a->nvf][0] = a->v[i].c.verify_from;
            a->vf[a->nvf][1] = a->v[i].c.seq;
            a->nvf++;
        }
    if (a->nvf > 1)
        qsort(a->vf, a->nvf, sizeof(*a->vf), cmp_range);
    size_t m = 0;
    for (size_t i = 0; i < a->nvf; i++) {
        if (m > 0 && a->vf[i][0] <= a->vf[m - 1][1] + 1) {
            if (a->vf[i][1] > a->vf[m - 1][1])
                a->vf[m - 1][1] = a->vf[i][1];
        } else {
            a->vf[m][0] = a->vf[i][0];
            a->vf[m][1] = a->vf[i][1];
            m++;
        }
    }
    a->nvf = m;
}

/* ---- the walk ---- */

static void report(const replay_config_t *cfg, const chain_t *c, uint64_t stream_last,
                   bool stream_checked, uint64_t tail_compared)
{
    const sigs_t *g = &c->sigs;
    const anchors_t *a = c->a;
    bool ok = !c->broken;
    char hex[SP_SHA256_HEX_LEN + 1];
    uint64_t last_ckpt = a->n ? a->v[a->n - 1].c.seq : 0;

    sp_hex_encode(c->running, SP_SHA256_LEN, hex);
    if (cfg->json) {
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_printf(&b, "{\"ok\":%s,\"events\":%" PRIu64 ",",
                      ok && g->bad == 0 && !a->bad ? "true" : "false", c->n);
        if (ok) {
            sp_buf_printf(&b, "\"head_seq\":%" PRIu64 ",\"head_hash\":\"%s\"", c->head, hex);
        } else {
            sp_buf_printf(&b, "\"broken_seq\":%" PRIu64 ",\"reason\":", c->broken_seq);
            sp_buf_json_str(&b, c->broken);
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
        sp_buf_printf(&b,
                      ",\"checkpoints\":%zu,\"checkpoints_matched\":%" PRIu64
                      ",\"checkpoint_last_seq\":%" PRIu64 ",\"checkpoint_file\":%s"
                      ",\"checkpoint_stream\":%s,\"lost\":%" PRIu64,
                      a->n, c->ckpt_ok, last_ckpt, a->file_read ? "true" : "false",
                      a->stream_read ? "true" : "false", c->lost_seqs);
        if (stream_checked)
            sp_buf_printf(&b, ",\"stream_last_seq\":%" PRIu64 ",\"tail_compared\":%" PRIu64,
                          stream_last, tail_compared);
        if (a->bad) {
            sp_buf_printf(&b,
                          ",\"witness_bad\":{\"stream_seq\":%" PRIu64 ",\"reason\":", a->bad_seq);
            sp_buf_json_str(&b, a->bad);
            sp_buf_putc(&b, '}');
        }
        sp_buf_putc(&b, '}');
        puts(b.data);
        sp_buf_dispose(&b);
        return;
    }
    if (ok) {
        printf("chain intact: %" PRIu64 " events, head seq %" PRIu64 ", head hash %s\n", c->n,
               c->head, hex);
    } else {
        printf("chain BROKEN at stream_seq %" PRIu64 " (%" PRIu64 " events verified before "
               "it): %s\n",
               c->broken_seq, c->n, c->broken);
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
    printf("anchors: %zu checkpoints (file %s, stream %s), %" PRIu64 " matched, last at seq "
           "%" PRIu64,
           a->n, a->file_read ? a->file : "none",
           a->stream_read      ? "read"
           : a->stream_missing ? "MISSING"
                               : "not read (no --nats-url)",
           c->ckpt_ok, last_ckpt);
    if (stream_checked)
        printf("; %s last seq %" PRIu64 ", %" PRIu64 " rows after the last checkpoint compared "
               "with it",
               SP_BUS_STREAM, stream_last, tail_compared);
    printf("\n");
    if (a->n == 0)
        printf("anchors: NO CHECKPOINTS: the head is not anchored outside PostgreSQL, and the "
               "newest rows could be removed unnoticed\n");
    if (a->stream_only)
        printf("anchors: the file lacks %" PRIu64 " checkpoints the stream has (an older copy)\n",
               a->stream_only);
    if (c->v1_gaps)
        printf("note: %" PRIu64 " stream sequences have no row between rows from before chain "
               "v2 (duplicates the log skipped then)\n",
               c->v1_gaps);
    if (c->lost_seqs)
        printf("note: %" PRIu64 " stream sequences were LOST: dropped by the stream's limits "
               "before the log stored them (see the 'lost:' rows)\n",
               c->lost_seqs);
    if (a->bad)
        printf("witness BROKEN at stream_seq %" PRIu64 ": %s\n", a->bad_seq, a->bad);
}

/* An accepted row's signature, again; in a range a checkpoint says was verified, an unsigned
 * row is bad too. */
static void check_signature(chain_t *c, const replay_event_t *ev)
{
    sigs_t *g = &c->sigs;
    const sp_envelope_t *e = ev->env;
    const anchors_t *a = c->a;
    char why[SP_REASON_MAX] = ""; /* a headed member's refusal, in the log's words */
    int rc;

    if (!ev->accepted || !e)
        return;
    while (c->vfi < a->nvf && a->vf[c->vfi][1] < ev->seq)
        c->vfi++;
    bool verified = c->vfi < a->nvf && a->vf[c->vfi][0] <= ev->seq;
    if (!e->signer[0] && e->signature.len == 0) {
        if (!verified) {
            g->unsigned_rows++;
            return;
        }
        rc = SP_EUNSIGNED;
    } else if (!g->kr) {
        g->unverified++;
        return;
    } else {
        rc = sp_envelope_verify(g->kr, g->cache, e, ev->payload, ev->payload_len,
                                ev->published_at_us * 1000);
        if (rc == SP_EHEADED) {
            /* A headed batch's member: against the accepted head before it, as the log did. */
            uint8_t leaf[SP_SIG_HASH_LEN];
            rc = sp_envelope_leaf(ev->payload, ev->payload_len, leaf);
            if (rc == 0)
                rc = sp_sighead_verify_member(&g->heads, g->db, g->kr, g->cache, e, leaf, ev->seq,
                                              why);
        } else if (rc == 0 && e->sig_leaves.len) {
            sp_sighead_ring_add(&g->heads, ev->payload, ev->payload_len, ev->seq);
        }
        if (rc == 0) {
            g->signed_ok++;
            return;
        }
    }
    if (g->bad++ == 0) {
        const char *name = sp_trust_refusal_name(rc);
        g->bad_seq = ev->seq;
        snprintf(g->bad_id, sizeof(g->bad_id), "%s", e->event_id);
        snprintf(g->bad_reason_buf, sizeof(g->bad_reason_buf), "%s", why);
        g->bad_reason = why[0]               ? g->bad_reason_buf
                        : rc == SP_EUNSIGNED ? "unsigned, accepted while the log verified "
                                               "signatures (its checkpoint says so)"
                        : name               ? name
                                             : "bad_signature";
    }
}

#define CHAIN_BROKEN (-2) /* stops the walk at the first broken row */

static int broken(chain_t *c, uint64_t seq, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int broken(chain_t *c, uint64_t seq, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->broken_buf, sizeof(c->broken_buf), fmt, ap);
    va_end(ap);
    c->broken = c->broken_buf;
    c->broken_seq = seq;
    return CHAIN_BROKEN;
}

/* The row's hash as its chain version says, or NULL with why in *bad. */
static const char *check_hash(const replay_event_t *ev, const uint8_t prev[SP_SHA256_LEN])
{
    uint8_t want[SP_SHA256_LEN], digest[SP_SHA256_LEN];

    if (ev->chain_v == 1) {
        if (ev->has_payload_size || ev->has_payload_sha)
            return "a chain v1 row with a payload size or digest";
        sp_chain_next(prev, ev->payload, ev->payload_len, want);
        if (memcmp(want, ev->hash, SP_SHA256_LEN) != 0)
            return "hash is not SHA-256(prev_hash || payload) (payload or hash altered)";
        return NULL;
    }
    if (ev->chain_v != SP_CHAIN_V2)
        return "unknown chain version";
    uint64_t size = ev->payload_len;
    if (ev->has_payload_size || ev->has_payload_sha) {
        /* A rejected message cut to its first 64 KiB: its size and digest stand for it. */
        if (!ev->has_payload_size || !ev->has_payload_sha || ev->accepted ||
            ev->payload_size <= SP_CHAIN_PAYLOAD_KEEP || ev->payload_len != SP_CHAIN_PAYLOAD_KEEP)
            return "payload size and digest do not describe a rejected message cut to 64 KiB";
        size = (uint64_t)ev->payload_size;
        memcpy(digest, ev->payload_sha, SP_SHA256_LEN);
    } else {
        sp_sha256(ev->payload, ev->payload_len, digest);
    }
    sp_chain_row_t row = {.seq = ev->seq,
                          .subject = ev->subject,
                          .subject_len = strlen(ev->subject),
                          .payload_size = size,
                          .payload_sha256 = digest,
                          .accepted = ev->accepted,
                          .reason = ev->accepted ? NULL : ev->reject_reason,
                          .reason_len = ev->reject_reason ? strlen(ev->reject_reason) : 0};
    if (ev->accepted && ev->reject_reason)
        return "an accepted row with a reject reason";
    sp_chain2_next(prev, &row, want);
    if (memcmp(want, ev->hash, SP_SHA256_LEN) != 0)
        return "hash does not cover the row as stored (payload, status, reject reason, subject, "
               "stream_seq or hash altered)";
    return NULL;
}

/* A "lost: A-B ..." row: 0 and its range, or -1. */
static int lost_range(const replay_event_t *ev, uint64_t *ret_to)
{
    const char *r = ev->reject_reason;
    size_t pl = strlen(SP_CHAIN_LOST_PREFIX);
    char *end = NULL;

    if (ev->accepted || ev->chain_v != SP_CHAIN_V2 || !r ||
        strncmp(r, SP_CHAIN_LOST_PREFIX, pl) != 0 || ev->payload_len != 0 || ev->event_id ||
        ev->type)
        return -1;
    errno = 0;
    unsigned long long from = strtoull(r + pl, &end, 10);
    if (errno || *end != '-' || from != ev->seq)
        return -1;
    const char *p = end + 1;
    unsigned long long to = strtoull(p, &end, 10);
    if (errno || end == p || *end != ' ' || to < from)
        return -1;
    *ret_to = to;
    return 0;
}

/* The checkpoints at or before ev's seq: those before it name a row the log does not have;
 * those at it must be the chain's head and row count right after ev. */
static int check_anchors(chain_t *c, const replay_event_t *ev)
{
    anchors_t *a = c->a;
    for (; c->ci < a->n && a->v[c->ci].c.seq <= ev->seq; c->ci++) {
        const sp_ckpt_t *k = &a->v[c->ci].c;
        if (k->seq < ev->seq)
            return broken(c, k->seq,
                          "no row at the seq of the eventlog's signed checkpoint (the next row "
                          "is %" PRIu64 "): rows were removed",
                          ev->seq);
        if (memcmp(k->head, c->running, SP_SHA256_LEN) != 0 || k->rows != c->n) {
            c->anchor_from = c->good_seq + 1;
            c->anchor_to = k->seq;
            return broken(c, k->seq,
                          "the head at this seq is not the eventlog's signed checkpoint (%s): a "
                          "row in %" PRIu64 "..%" PRIu64 " was rewritten and the chain "
                          "recomputed",
                          k->rows != c->n ? "row count differs" : "head hash differs",
                          c->anchor_from, c->anchor_to);
        }
        c->ckpt_ok++;
        c->good_seq = k->seq;
    }
    return 0;
}

static int verify_page(replay_event_t *evs, size_t n, void *arg)
{
    chain_t *c = arg;
    for (size_t i = 0; i < n; i++) {
        const replay_event_t *ev = &evs[i];
        const char *bad = NULL;
        uint64_t lost_to = 0;

        if (!ev->hashes_ok)
            return broken(c, ev->seq, "prev_hash or hash is not 32 bytes");
        /* Every stream sequence has its row since chain v2 (a lost row stands for a range). */
        if (ev->chain_v == SP_CHAIN_V2 && c->next_seq && ev->seq != c->next_seq) {
            if (ev->seq > c->next_seq)
                return broken(c, c->next_seq,
                              "no row for stream_seq %" PRIu64 "..%" PRIu64
                              " (the next row is %" PRIu64 "): rows were deleted%s",
                              c->next_seq, ev->seq - 1, ev->seq,
                              memcmp(ev->prev_hash, c->running, SP_SHA256_LEN) != 0
                                  ? " (and its prev_hash does not match the previous row's hash)"
                                  : " and the chain recomputed");
            return broken(c, ev->seq, "stream_seq out of order");
        }
        if (ev->chain_v == 1 && c->saw_v2)
            return broken(c, ev->seq, "a chain v1 row after chain v2 rows");
        if (ev->chain_v == 1 && c->n > 0 && ev->seq > c->head + 1)
            c->v1_gaps += ev->seq - c->head - 1;
        if (memcmp(ev->prev_hash, c->running, SP_SHA256_LEN) != 0)
            bad = c->n == 0 ? "first row does not start from the genesis hash"
                            : "prev_hash does not match the previous row's hash (a row was "
                              "removed, inserted or rewritten)";
        if (!bad)
            bad = check_hash(ev, ev->prev_hash);
        if (!bad)
            bad = check_columns(ev);
        if (bad)
            return broken(c, ev->seq, "%s", bad);
        check_signature(c, ev);
        memcpy(c->running, ev->hash, SP_SHA256_LEN);
        c->head = ev->seq;
        c->n++;
        c->next_seq = ev->seq + 1;
        if (ev->chain_v == SP_CHAIN_V2) {
            c->saw_v2 = true;
            if (lost_range(ev, &lost_to) == 0) {
                c->lost = sp_xreallocarray(c->lost, c->nlost + 1, sizeof(*c->lost));
                c->lost[c->nlost++] = (range_t){ev->seq, lost_to};
                c->lost_seqs += lost_to - ev->seq + 1;
                c->next_seq = lost_to + 1;
                c->head = lost_to;
            }
        }
        int rc = check_anchors(c, ev);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- the stream as witness of each row ---- */

typedef struct {
    sp_bus_t *bus;
    uint64_t compared, missing;
    uint64_t bad_seq;
    const char *bad;
} cmp_t;

/* Whether the row holds the stream's message of its seq (subject and bytes; a cut payload by
 * its size and digest). Messages the stream no longer holds are counted, not judged. */
static int compare_page(replay_event_t *evs, size_t n, void *arg)
{
    cmp_t *x = arg;
    for (size_t i = 0; i < n; i++) {
        const replay_event_t *ev = &evs[i];
        char *subject = NULL;
        uint8_t *data = NULL, digest[SP_SHA256_LEN];
        size_t len = 0;
        uint64_t to;
        if (lost_range(ev, &to) == 0)
            continue;
        int rc = sp_bus_get_msg(x->bus, ev->seq, &subject, &data, &len, NULL);
        if (rc == SP_ENOTFOUND) {
            x->missing++;
            continue;
        }
        if (rc < 0)
            return rc;
        x->compared++;
        bool same;
        if (ev->has_payload_sha) {
            sp_sha256(data, len, digest);
            same = (int64_t)len == ev->payload_size &&
                   memcmp(digest, ev->payload_sha, SP_SHA256_LEN) == 0 &&
                   memcmp(data, ev->payload, ev->payload_len) == 0;
        } else {
            same = len == ev->payload_len && (len == 0 || memcmp(data, ev->payload, len) == 0);
        }
        /* The stored subject is the safe text of the stream's: compare them as stored, unless
         * it had bytes that are no UTF-8 (the server's JSON answer replaces them; the chain
         * covers the stored subject anyway). */
        if (!strstr(ev->subject, "\\x")) {
            sp_buf_t safe;
            sp_buf_init(&safe);
            sp_buf_safe_text(&safe, subject, 1024);
            same = same && strcmp(safe.data ? safe.data : "", ev->subject) == 0;
            sp_buf_dispose(&safe);
        }
        free(subject);
        free(data);
        if (!same) {
            x->bad_seq = ev->seq;
            x->bad = "the row's message is not the stream's message at this seq (the row was "
                     "rewritten, or rows were renumbered, and the chain recomputed)";
            return CHAIN_BROKEN;
        }
    }
    return 0;
}

/* Compares rows from..to (inclusive) with the stream; the first that differs, if any. */
static int compare_rows(PGconn *db, const replay_config_t *cfg, sp_bus_t *bus, uint64_t from,
                        uint64_t to, cmp_t *x)
{
    replay_filter_t f = {.since = from, .until = to};
    memset(x, 0, sizeof(*x));
    x->bus = bus;
    int rc = replay_walk(db, &f, cfg->page, compare_page, x);
    return rc == CHAIN_BROKEN ? 0 : rc;
}

/* ---- setup ---- */

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

static int connect_bus(const replay_config_t *cfg, sp_busid_t *id, sp_bus_t **ret_bus)
{
    sp_bus_opts_t bo = {.url = cfg->nats_url, .name = "space-replay", .timeout_ms = 5000};
    char err[SP_BUSID_ERR_MAX];
    int rc;

    *ret_bus = NULL;
    if (!cfg->nats_url[0])
        return 0;
    if ((rc = sp_busid_setup(cfg->creds_dir, cfg->identity, "reader", id, &bo, err)) < 0) {
        fprintf(stderr, "space-replay: identity: %s\n", err);
        return rc;
    }
    if ((rc = sp_bus_connect(&bo, ret_bus)) < 0)
        fprintf(stderr,
                "space-replay: cannot connect to NATS at %s: %s (--nats-url '' verifies against "
                "the checkpoint file alone)\n",
                cfg->nats_url, sp_strerror(rc));
    return rc;
}

static int64_t db_head(PGconn *db)
{
    PGresult *r = PQexec(db, "SELECT coalesce(max(stream_seq), 0) FROM events");
    int64_t v = -1;
    if (sp_db_check(r, PGRES_TUPLES_OK) == 0)
        v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

/* The log is written while we read: wait (--wait-s) until it holds what the stream and the
 * checkpoints say exists, so that a log merely behind is not taken for a truncated one. */
static void wait_for_log(PGconn *db, const replay_config_t *cfg, uint64_t target)
{
    int64_t deadline = sp_mono_ns() + cfg->wait_s * 1000000000LL;
    for (;;) {
        int64_t h = db_head(db);
        if (h < 0 || (uint64_t)h >= target || sp_mono_ns() >= deadline)
            return;
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
}

int replay_verify(PGconn *db, const replay_config_t *cfg)
{
    replay_filter_t all = {.since = 0};
    anchors_t a;
    chain_t c;
    sp_keyring_t *kr = NULL;
    sp_busid_t busid = {0};
    sp_bus_t *bus = NULL;
    sp_bus_stream_state_t ev_state = {0};
    bool stream_checked = false;
    uint64_t tail_compared = 0;
    char *file = NULL;
    int code = REPLAY_EUSAGE;

    memset(&a, 0, sizeof(a));
    memset(&c, 0, sizeof(c));
    c.a = &a;
    c.next_seq = 1;
    memcpy(c.running, SP_CHAIN_GENESIS, SP_SHA256_LEN);
    if (load_keyring(cfg, &kr) < 0)
        return REPLAY_EUSAGE;
    c.sigs.kr = kr;
    c.sigs.db = db;
    sp_sighead_ring_init(&c.sigs.heads);
    sp_sigcache_new(4096, &c.sigs.cache);

    /* The anchors first: every checkpoint read names rows already committed, so a checkpoint
     * past the snapshot's head below is a truncation, not a race. */
    const char *home = getenv("SPACE_HOME");
    if (cfg->checkpoint_file[0])
        file = sp_xstrdup(cfg->checkpoint_file);
    else if (home && home[0])
        file = sp_xasprintf("%s/%s", home, SP_CKPT_FILE_DEFAULT);
    if (file && read_file(&a, kr, file, cfg->checkpoint_file[0] != '\0') < 0)
        goto out;
    if (connect_bus(cfg, &busid, &bus) < 0)
        goto out;
    if (bus) {
        if (read_stream(&a, kr, bus) < 0)
            goto out;
        int rc = sp_bus_stream_state(bus, SP_BUS_STREAM, &ev_state);
        if (rc < 0) {
            fprintf(stderr, "space-replay: %s: %s\n", SP_BUS_STREAM, sp_strerror(rc));
            goto out;
        }
        stream_checked = true;
    }
    if (!kr && a.file_lines + a.stream_msgs > 0)
        fprintf(stderr, "space-replay: no keyring: the checkpoints cannot be verified\n");
    anchors_settle(&a);
    uint64_t target = ev_state.last_seq;
    if (a.n && a.v[a.n - 1].c.seq > target)
        target = a.v[a.n - 1].c.seq;
    wait_for_log(db, cfg, target);

    if (replay_begin(db, true) < 0) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        goto out;
    }
    int rc = replay_walk(db, &all, cfg->page, verify_page, &c);
    if (rc < 0 && rc != CHAIN_BROKEN) {
        fprintf(stderr, "space-replay: %s", PQerrorMessage(db));
        sp_db_exec(db, "COMMIT");
        goto out;
    }
    cmp_t x;
    if (rc == CHAIN_BROKEN && c.anchor_to && bus) {
        /* A checkpoint the chain does not reach: the stream names the row. */
        if ((rc = compare_rows(db, cfg, bus, c.anchor_from, c.anchor_to, &x)) < 0)
            goto bus_failed;
        if (x.bad)
            broken(&c, x.bad_seq, "%s", x.bad);
        else if (x.missing == 0)
            broken(&c, c.anchor_to,
                   "the head at this seq is not the eventlog's signed checkpoint, and every row "
                   "of %" PRIu64 "..%" PRIu64 " holds the stream's message: a status or reject "
                   "reason there was rewritten and the chain recomputed",
                   c.anchor_from, c.anchor_to);
    } else if (rc == 0) {
        /* Past the walk: the rows no checkpoint covers yet, and the end of the log. */
        if (c.ci < a.n)
            broken(&c, c.head + 1,
                   "the log ends at %" PRIu64 " but the eventlog's signed checkpoint names seq "
                   "%" PRIu64 ": rows %" PRIu64 "..%" PRIu64 " were deleted",
                   c.head, a.v[a.n - 1].c.seq, c.head + 1, a.v[a.n - 1].c.seq);
        if (bus && c.head > c.good_seq && cfg->tail_max > 0) {
            /* The newest rows: those are what a removal or a rewrite after the last checkpoint
             * touches (without checkpoints, the log's end). */
            uint64_t from = c.good_seq + 1;
            if (c.head - c.good_seq > (uint64_t)cfg->tail_max)
                from = c.head - (uint64_t)cfg->tail_max + 1;
            if ((rc = compare_rows(db, cfg, bus, from, c.head, &x)) < 0)
                goto bus_failed;
            tail_compared = x.compared;
            if (x.bad && (!c.broken || x.bad_seq < c.broken_seq))
                broken(&c, x.bad_seq, "%s", x.bad);
        }
        if (!c.broken && stream_checked && ev_state.last_seq > c.head)
            broken(&c, c.head + 1,
                   "the log ends at %" PRIu64 " but %s holds messages up to %" PRIu64
                   ": rows %" PRIu64 "..%" PRIu64 " were deleted (or the eventlog is %s behind)",
                   c.head, SP_BUS_STREAM, ev_state.last_seq, c.head + 1, ev_state.last_seq,
                   cfg->wait_s > 0 ? "stopped or far" : "");
        /* A lost row claims the stream dropped its range: it must no longer hold it. */
        for (size_t i = 0; !c.broken && stream_checked && i < c.nlost; i++)
            if (c.lost[i].to >= ev_state.first_seq)
                broken(&c, c.lost[i].from,
                       "a 'lost' row for %" PRIu64 "..%" PRIu64 " but %s still holds messages from "
                       "%" PRIu64 ": rows were deleted and the chain recomputed",
                       c.lost[i].from, c.lost[i].to, SP_BUS_STREAM, ev_state.first_seq);
    }
    sp_db_exec(db, "COMMIT");
    report(cfg, &c, ev_state.last_seq, stream_checked, tail_compared);
    code = c.broken || c.sigs.bad || a.bad ? REPLAY_EBROKEN : REPLAY_OK;
    goto out;
bus_failed:
    sp_db_exec(db, "COMMIT");
    fprintf(stderr, "space-replay: reading %s: %s\n", SP_BUS_STREAM,
            rc == SP_EDB ? PQerrorMessage(db) : sp_strerror(rc));
out:
    free(file);
    free(a.v);
    free(a.vf);
    free(c.lost);
    sp_bus_free(bus);
    sp_busid_dispose(&busid);
    sp_sigcache_free(c.sigs.cache);
    sp_sighead_ring_dispose(&c.sigs.heads);
    sp_keyring_free(kr);
    return code;
}
