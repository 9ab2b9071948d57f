/* The event log's write path: decode and validate each message, mark exact duplicates, apply
 * the reducers, extend the hash chain, COPY the rows and upsert the projections, all in one
 * transaction so the events and the state derived from them never disagree. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "buf.h"
#include "contract.h"
#include "db.h"
#include "envelope.h"
#include "ids.h"
#include "error.h"
#include "eventlog.h"
#include "log.h"
#include "pgcopy.h"
#include "trust.h"
#include "xmalloc.h"

#define REJECTS_LOGGED_PER_BATCH 10
/* Projection rows kept between batches (sp_projection_retain): a few MB at most. */
#define PROJECTION_ROWS_KEPT 4096

typedef enum { M_SKIP = 0, M_ACCEPT, M_REJECT } disposition_t;

/* One message in one attempt to store a batch; what the pool found (prep) is not changed, so a
 * batch the database refused can be tried again message by message. */
typedef struct {
    const sp_bus_msg_t *msg;
    const sp_envelope_t *env; /* borrowed from prep; NULL when undecodable or invalid */
    const el_prep_t *prep;
    disposition_t disp;
    int duplicate;
    int quarantine; /* store as rejected without decoding (the database refused it) */
    int refused;    /* by the trust check */
    int reused;     /* its event_id names other content */
    int plaintext;  /* user content in plaintext that seal-output keeps only sealed */
    char reason[SP_REASON_MAX];
} item_t;

const char *const el_reject_class_names[EL_REJ_CLASSES] = {
    [EL_REJ_INVALID] = "invalid",     [EL_REJ_REFUSED] = "refused",
    [EL_REJ_DUPLICATE] = "duplicate", [EL_REJ_REUSED_ID] = "reused_id",
    [EL_REJ_CONTRACT] = "contract",   [EL_REJ_UNSTORABLE] = "unstorable",
    [EL_REJ_PLAINTEXT] = "plaintext",
};

/* The class of a rejected item, from where it was rejected. */
static el_reject_class_t reject_class(const item_t *it)
{
    if (it->quarantine)
        return EL_REJ_UNSTORABLE;
    if (it->prep->rc < 0)
        return EL_REJ_INVALID;
    if (it->plaintext)
        return EL_REJ_PLAINTEXT;
    if (it->duplicate)
        return EL_REJ_DUPLICATE;
    if (it->reused)
        return EL_REJ_REUSED_ID;
    if (it->refused)
        return EL_REJ_REFUSED;
    return EL_REJ_CONTRACT;
}

static void remember_error(el_store_t *st, const char *what)
{
    snprintf(st->last_error, sizeof(st->last_error), "%s: %s", what, PQerrorMessage(st->db));
    st->last_error[strcspn(st->last_error, "\n")] = '\0';
    sp_log(SP_LOG_ERROR, "store failed", SP_KS("error", st->last_error));
}

int el_store_load_head(el_store_t *st)
{
    /* The head is read after every (re)connect: the writer lock may have been another
     * process's meanwhile, and the rows it wrote are not what was kept. */
    sp_projection_clear(st->proj);
    PGresult *r = PQexec(st->db, "SELECT stream_seq, hash, (SELECT count(*) FROM events) FROM "
                                 "events ORDER BY stream_seq DESC LIMIT 1");
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc < 0)
        goto out;
    if (PQntuples(r) == 0) {
        st->head.seq = 0;
        st->rows = 0;
        memcpy(st->head.hash, SP_CHAIN_GENESIS, SP_SHA256_LEN);
        goto out;
    }
    st->head.seq = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
    st->rows = strtoull(PQgetvalue(r, 0, 2), NULL, 10);
    /* bytea in text form: \x + 64 hex digits */
    const char *h = PQgetvalue(r, 0, 1);
    if (strncmp(h, "\\x", 2) != 0 || sp_hex_decode(h + 2, st->head.hash, SP_SHA256_LEN) < 0)
        rc = SP_ECHAIN;
out:
    PQclear(r);
    return rc;
}

/* The events table's columns as the rows are COPYed, in this order (lib/db_migrations.c has
 * their types). */
#define COPY_COLUMNS                                                                               \
    "stream_seq, event_id, subject, type, aggregate_kind, aggregate_id, tenant, actor,"            \
    " occurred_at, published_at, correlation_id, causation_id, schema_version, status,"            \
    " reject_reason, payload, prev_hash, hash, chain_v, payload_size, payload_sha256"
#define COPY_FIELDS 21

/* An optional text column: empty is NULL. */
static int copy_opt(sp_buf_t *b, const char *s)
{
    return sp_pgcopy_text(b, s && s[0] ? s : NULL);
}

static int copy_opt_uuid(sp_buf_t *b, const char *s)
{
    return sp_pgcopy_uuid(b, s && s[0] ? s : NULL);
}

/* One row as the chain sees it (hash.h, chain v2). */
typedef struct {
    uint64_t seq;
    const char *subject;
    const sp_envelope_t *env; /* the columns' source; NULL: none (undecodable, lost) */
    int64_t published_us;
    int accepted;
    const char *reason; /* rejected rows only */
    const uint8_t *data;
    size_t len;
} row_t;

/* Appends the row in binary COPY form (pgcopy.h) and moves head (the previous row's hash) to
 * its hash. Bytes that came from the network (the subject, a reason quoting it) are stored as
 * safe text, since invalid UTF-8 would make PostgreSQL refuse the whole COPY; the chain covers
 * them as stored. A rejected message over SP_CHAIN_PAYLOAD_KEEP keeps its first that many
 * bytes, with its size and SHA-256: hostile input cannot make a row hold more. An envelope's
 * ids are validated UUIDs (sp_envelope_validate); one that is not fails the row (-EINVAL, head
 * unchanged) as PostgreSQL's refusal failed the text COPY before, so the batch is stored one
 * message at a time and this one recorded as not storable. */
static int copy_row(sp_buf_t *b, sp_buf_t *tmp, const row_t *row, uint8_t head[SP_SHA256_LEN])
{
    const sp_envelope_t *e = row->env;
    uint8_t digest[SP_SHA256_LEN], next[SP_SHA256_LEN];
    size_t subject_len, keep = row->len, start = b->len;
    bool cut = !row->accepted && row->len > SP_CHAIN_PAYLOAD_KEEP;
    int bad = 0;

    sp_buf_reset(tmp);
    sp_buf_safe_text(tmp, row->subject, 1024);
    subject_len = tmp->len;
    sp_buf_putc(tmp, '\0');
    if (!row->accepted)
        sp_buf_safe_text(tmp, row->reason, SP_REASON_MAX);
    const char *subject = tmp->data ? tmp->data : "";
    const char *reason = row->accepted ? NULL : tmp->data + subject_len + 1;
    sp_sha256(row->data, row->len, digest);
    sp_chain_row_t cr = {.seq = row->seq,
                         .subject = subject,
                         .subject_len = subject_len,
                         .payload_size = row->len,
                         .payload_sha256 = digest,
                         .accepted = row->accepted,
                         .reason = reason,
                         .reason_len = reason ? strlen(reason) : 0};
    if (cut)
        keep = SP_CHAIN_PAYLOAD_KEEP;
    sp_chain2_next(head, &cr, next);

    sp_pgcopy_tuple(b, COPY_FIELDS);
    sp_pgcopy_int8(b, (int64_t)row->seq);
    bad |= copy_opt_uuid(b, e ? e->event_id : NULL) < 0;
    bad |= sp_pgcopy_text(b, subject) < 0;
    bad |= copy_opt(b, e ? e->type : NULL) < 0;
    bad |= copy_opt(b, e ? e->aggregate->kind : NULL) < 0;
    bad |= copy_opt(b, e ? e->aggregate->id : NULL) < 0;
    bad |= sp_pgcopy_text(b, e ? e->tenant : NULL) < 0;
    bad |= copy_opt(b, e ? e->actor : NULL) < 0;
    if (e)
        sp_pgcopy_timestamptz_us(b, e->occurred_at_us);
    else
        sp_pgcopy_null(b);
    sp_pgcopy_timestamptz_us(b, row->published_us);
    bad |= sp_pgcopy_text(b, e ? e->correlation_id : NULL) < 0;
    bad |= copy_opt_uuid(b, e ? e->causation_id : NULL) < 0;
    if (e && e->schema_version <= INT32_MAX)
        sp_pgcopy_int4(b, (int32_t)e->schema_version);
    else if (e)
        bad = 1; /* out of the integer column's range, as its text was */
    else
        sp_pgcopy_null(b);
    bad |= sp_pgcopy_text(b, row->accepted ? "accepted" : "rejected") < 0;
    bad |= sp_pgcopy_text(b, reason) < 0;
    bad |= sp_pgcopy_bytes(b, row->data, keep) < 0;
    bad |= sp_pgcopy_bytes(b, head, SP_SHA256_LEN) < 0;
    bad |= sp_pgcopy_bytes(b, next, SP_SHA256_LEN) < 0;
    sp_pgcopy_int2(b, SP_CHAIN_V2);
    if (cut) {
        sp_pgcopy_int8(b, (int64_t)row->len);
        bad |= sp_pgcopy_bytes(b, digest, SP_SHA256_LEN) < 0;
    } else {
        sp_pgcopy_null(b);
        sp_pgcopy_null(b);
    }
    if (bad) {
        b->len = start;
        return -EINVAL;
    }
    memcpy(head, next, SP_SHA256_LEN);
    return 0;
}

/* The row standing for stream sequences from..to that the stream no longer held when the log
 * asked for them: dropped by the stream's limits (max age, max bytes; docs/audit.md) before
 * the log stored them. Nothing else can remove a message (deny_delete, deny_purge), so the log
 * says so in the chain instead of leaving a gap that would read as a deletion. */
static int copy_lost_row(sp_buf_t *b, sp_buf_t *tmp, uint64_t from, uint64_t to,
                         uint8_t head[SP_SHA256_LEN])
{
    char reason[SP_REASON_MAX];
    snprintf(reason, sizeof(reason), SP_CHAIN_LOST_PREFIX "%llu-%llu %s", (unsigned long long)from,
             (unsigned long long)to, "dropped by the stream's limits before the log stored them");
    row_t row = {.seq = from, .subject = "", .published_us = sp_now_us(), .reason = reason};
    return copy_row(b, tmp, &row, head);
}

static int cmp_item_id(const void *a, const void *b)
{
    const item_t *x = *(item_t *const *)a, *y = *(item_t *const *)b;
    int c = strcmp(x->env->event_id, y->env->event_id);
    if (c)
        return c;
    return x->msg->stream_seq < y->msg->stream_seq ? -1 : 1;
}

static int same_bytes(const item_t *a, const uint8_t *data, size_t len)
{
    return a->msg->len == len && (len == 0 || memcmp(a->msg->data, data, len) == 0);
}

/* An exact copy of an accepted event (a publisher's retry past JetStream's duplicate window,
 * or a replay: a verifying log cannot tell them apart) is stored rejected, so that every
 * stream sequence has its row and a gap in stream_seq can only mean a deletion. A verifying
 * log names it a replay (a validly signed message sent again is one to record). */
static void mark_copy(const el_store_t *st, item_t *it, const char *stored_id)
{
    it->duplicate = 1;
    it->disp = M_REJECT;
    if (st->verify != EL_VERIFY_ON) {
        snprintf(it->reason, sizeof(it->reason), "duplicate: event_id %s is already %s",
                 it->env->event_id, stored_id ? "accepted" : "in this batch");
        return;
    }
    it->refused = 1;
    snprintf(it->reason, sizeof(it->reason), "replayed: event_id %s is already %s",
             it->env->event_id, stored_id ? "accepted" : "in this batch");
}

/* Marks duplicates: within the batch (a later copy of an earlier message) and, with stored,
 * against accepted rows already stored. A different message reusing a stored event_id is
 * rejected, not deduplicated: the id is the event's identity, and two contents cannot share
 * it.
 *
 * The lookup of stored ids is a round trip per batch that almost never finds anything (a
 * publisher's retries within JetStream's window never reach the stream, redeliveries are
 * below the head). So a batch is first stored without it (stored false), and again with it
 * (ESTORED_ID) when that cannot be the verdict the lookup would give: the unique index on
 * accepted event ids refused the COPY (an id is taken), or something in the batch was
 * rejected (a copy of a stored event may fail the reducers first, and must be named a copy).
 * The second pass records the copy or the reuse as before. */
#define ESTORED_ID     (-EEXIST)
#define EVENT_ID_INDEX "events_event_id_accepted"

static int find_duplicates(el_store_t *st, item_t *items, size_t n, bool stored)
{
    item_t **by_id = sp_xcalloc(n ? n : 1, sizeof(item_t *));
    size_t k = 0;
    sp_buf_t arr;
    int rc = 0;

    sp_buf_init(&arr);
    for (size_t i = 0; i < n; i++)
        if (items[i].disp == M_ACCEPT)
            by_id[k++] = &items[i];
    qsort(by_id, k, sizeof(item_t *), cmp_item_id);
    /* Within an id, by_id is in stream order: the first is the leader, later ones copies. */
    for (size_t i = 1, lead = 0; i < k; i++) {
        item_t *first = by_id[lead], *cur = by_id[i];
        if (strcmp(first->env->event_id, cur->env->event_id) != 0) {
            lead = i;
            continue;
        }
        if (same_bytes(first, cur->msg->data, cur->msg->len)) {
            mark_copy(st, cur, NULL);
        } else {
            cur->disp = M_REJECT;
            cur->reused = 1;
            snprintf(cur->reason, sizeof(cur->reason), "event_id %s reused with other content",
                     cur->env->event_id);
        }
    }

    sp_buf_putc(&arr, '{');
    for (size_t i = 0; i < n; i++) {
        if (items[i].disp != M_ACCEPT)
            continue;
        if (arr.len > 1)
            sp_buf_putc(&arr, ',');
        sp_buf_puts(&arr, items[i].env->event_id);
    }
    sp_buf_putc(&arr, '}');
    if (arr.len == 2 || !stored)
        goto out;

    const char *params[1] = {arr.data};
    PGresult *r = sp_db_exec_prepared(st->db,
                                      "SELECT event_id::text, payload FROM events WHERE status = "
                                      "'accepted' AND event_id = ANY($1::uuid[])",
                                      1, params, 1 /* binary results */);
    if ((rc = sp_db_check(r, PGRES_TUPLES_OK)) < 0) {
        remember_error(st, "duplicate lookup");
        PQclear(r);
        goto out;
    }
    for (int row = 0; row < PQntuples(r); row++) {
        const char *id = PQgetvalue(r, row, 0);
        const uint8_t *payload = (const uint8_t *)PQgetvalue(r, row, 1);
        size_t plen = (size_t)PQgetlength(r, row, 1);
        for (size_t i = 0; i < n; i++) {
            item_t *it = &items[i];
            if (it->disp != M_ACCEPT || strcmp(it->env->event_id, id) != 0)
                continue;
            if (same_bytes(it, payload, plen)) {
                mark_copy(st, it, id);
            } else {
                it->disp = M_REJECT;
                it->reused = 1;
                snprintf(it->reason, sizeof(it->reason), "event_id %s reused with other content",
                         id);
            }
        }
    }
    PQclear(r);
out:
    sp_buf_dispose(&arr);
    free(by_id);
    return rc;
}

/* The trust check's placement lookup: the projection as this batch has changed it so far,
 * so a SandboxPlaced stored earlier in the same batch places the sandbox. */
static int placement_from_projection(void *arg, const char *tenant, const char *sandbox,
                                     char worker[SP_INSTANCE_MAX + 1])
{
    const sp_sandbox_t *s = sp_projection_sandbox(arg, sandbox);

    if (!s || strcmp(s->tenant, tenant) != 0)
        return 0;
    if (!s->worker[0])
        return s->state == SP_SBX_REQUESTED ? 0 : 2; /* placed once, on none now */
    snprintf(worker, SP_INSTANCE_MAX + 1, "%s", s->worker);
    return 1;
}

static int snapshot_from_log(void *arg, const char *tenant, const char *sandbox,
                             const char *snapshot_id, char worker[SP_INSTANCE_MAX + 1])
{
    return sp_db_snapshot_taker(arg, tenant, sandbox, snapshot_id, worker, SP_INSTANCE_MAX + 1);
}

static int worker_live_in_log(void *arg, const char *worker)
{
    return sp_db_worker_live(arg, worker);
}

static void refused(const el_store_t *st, item_t *it, const char *reason)
{
    if (st->verify == EL_VERIFY_ON) {
        it->disp = M_REJECT;
        it->refused = 1;
        snprintf(it->reason, sizeof(it->reason), "%s", reason);
        return;
    }
    /* Log mode: what on would have refused, and the event is stored as before. */
    it->refused = 1;
    sp_log(SP_LOG_WARN, "event would be refused (verify-signatures=log)",
           SP_KU("seq", it->msg->stream_seq), SP_KS("event_id", it->env->event_id),
           SP_KS("reason", reason), SP_KS("corr", it->env->correlation_id));
}

/* A signer the keyring does not know but whose public key is now in the keyring directory
 * (an identity added while the log runs: space identity add), a platform whose tenants file
 * changed (space platform add NAME --tenants ...; checked only for a batch with a platform's
 * message, one stat per platform), or a signature that did not verify while the directory
 * changed (a key rotated: space identity rotate; one stat per batch with such a message): the
 * directory is read again and the messages whose signer was unknown or whose signature did not
 * verify are verified once more. A made-up signer costs one failed stat, so a flood of them
 * costs no directory reads. Runs while no pool job is in flight: the keyring it replaces is
 * not in use. */
void el_store_recheck_signers(el_store_t *st, el_batch_t *b)
{
    bool reload = false, platform = false, bad_sig = false;
    if (st->verify == EL_VERIFY_OFF)
        return;
    for (size_t i = 0; i < b->n && !reload && st->keyring_dir; i++) {
        const sp_envelope_t *e = b->items[i].env;
        sp_identity_t id;
        if (!e || !e->signer || !e->signer[0] || sp_identity_parse(e->signer, &id) < 0)
            continue;
        platform = platform || id.kind == SP_KIND_PLATFORM;
        bad_sig = bad_sig || b->items[i].sig_rc == SP_ESIGNATURE;
        if (b->items[i].sig_rc != SP_ESIGNER || sp_keyring_has(st->trust.keyring, e->signer))
            continue;
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof(path), "%s/%s.pub", st->keyring_dir, id.name);
        reload = stat(path, &sb) == 0;
    }
    if (!reload && (platform || bad_sig))
        reload = sp_keyring_stale(st->trust.keyring);
    if (!reload)
        return;
    sp_keyring_t *kr = NULL;
    int rc = sp_keyring_load(st->keyring_dir, &kr);
    if (rc < 0) {
        sp_log(SP_LOG_WARN, "cannot read the keyring again", SP_KS("keyring_dir", st->keyring_dir),
               SP_KS("error", sp_strerror(rc)));
        return;
    }
    sp_log(SP_LOG_INFO, "keyring read again: a new identity, tenants or key",
           SP_KS("keyring_dir", st->keyring_dir), SP_KU("identities", sp_keyring_size(kr)));
    sp_keyring_free((sp_keyring_t *)st->trust.keyring);
    st->trust.keyring = kr;
    for (size_t i = 0; i < b->n; i++) {
        el_prep_t *it = &b->items[i];
        if (it->sig_rc == SP_ESIGNER || it->sig_rc == SP_ESIGNATURE)
            el_prep_verify(it, &st->trust);
    }
}

/* The pool's verdicts on the signatures (verified outside the transaction, each distinct batch
 * root once through the signature cache), in stream order. */
static void apply_signatures(const el_store_t *st, item_t *items, size_t n)
{
    size_t logged = 0;

    for (size_t i = 0; i < n; i++) {
        item_t *it = &items[i];
        /* A headed member is judged against its head in stream order (verify_member). */
        if (it->disp != M_ACCEPT || it->prep->sig_rc == 0 || it->prep->sig_rc == SP_EHEADED)
            continue;
        if (st->verify == EL_VERIFY_LOG && logged++ >= REJECTS_LOGGED_PER_BATCH)
            it->refused = 1;
        else
            refused(st, it, it->prep->reason);
    }
}

/* A headed batch's member against its head (sighead.h): the accepted head before it, from
 * this batch so far, the ring, or the table. 0 when it belongs; < 0 otherwise (refused, or
 * SP_EDB: the batch is not stored). */
static int verify_member(el_store_t *st, item_t *it)
{
    char reason[SP_REASON_MAX];
    int rc = sp_sighead_verify_member(&st->heads, st->db, st->trust.keyring, st->trust.cache,
                                      it->env, it->prep->leaf, it->msg->stream_seq, reason);
    if (rc == SP_EDB) {
        snprintf(st->last_error, sizeof(st->last_error), "%.120s: %.120s", reason,
                 PQerrorMessage(st->db));
        return rc;
    }
    if (rc < 0)
        refused(st, it, reason);
    return rc;
}

/* What the contract lets the verified signer say, in stream order inside the transaction. */
static void authorize(el_store_t *st, item_t *it)
{
    char reason[SP_REASON_MAX];
    sp_trust_t t = st->trust;

    if (it->refused)
        return; /* log mode: already reported */
    t.placement = placement_from_projection;
    t.placement_arg = st->proj;
    t.snapshot_taker = snapshot_from_log;
    t.worker_live = worker_live_in_log;
    t.snapshot_arg = st->db;
    if (sp_trust_authorize(&t, it->env, it->msg->subject, reason) < 0)
        refused(st, it, reason);
}

static int load_rows(el_store_t *st, item_t *items, size_t n)
{
    const char **sbx = sp_xcalloc(n ? n : 1, sizeof(char *));
    const char **wkr = sp_xcalloc(n ? n : 1, sizeof(char *));
    size_t ns = 0, nw = 0;
    for (size_t i = 0; i < n; i++) {
        const sp_envelope_t *e = items[i].env;
        if (items[i].disp != M_ACCEPT)
            continue;
        /* A credential event changes no projection; egressd's uses name the sandbox whose
         * placement the trust check asks about. */
        const char *sb = sp_trust_sandbox_of(e);
        if (sp_event_is_worker(e->payload_case))
            wkr[nw++] = e->aggregate->id;
        else if (!sp_event_is_cred(e->payload_case) || (sb[0] && sb != e->aggregate->id))
            sbx[ns++] = sb;
    }
    int rc = sp_projection_load_sandboxes(st->proj, st->db, sbx, ns);
    if (rc >= 0)
        rc = sp_projection_load_workers(st->proj, st->db, wkr, nw);
    if (rc < 0)
        remember_error(st, "projection load");
    free(sbx);
    free(wkr);
    return rc;
}

/* Opens the batch's transaction and copies its rows in. BEGIN travels with the COPY, one
 * simple query of two statements, so both cost one round trip (libpq hands back each one's
 * result; a failed BEGIN runs no COPY). rows: the tuples only; the binary format's header and
 * trailer are sent around them. */
static int begin_copy_in(PGconn *db, const sp_buf_t *rows)
{
    sp_buf_t head, trailer;
    PGresult *r;
    bool begun = false, copying = false;
    if (!PQsendQuery(db, "BEGIN; COPY events (" COPY_COLUMNS ") FROM STDIN WITH (FORMAT binary)"))
        return SP_EDB;
    /* BEGIN's result, then COPY's; after that one no PQgetResult until the COPY ends. A
     * failure ends the query: its results are read to the end (NULL). */
    while (!copying && (r = PQgetResult(db)) != NULL) {
        ExecStatusType st = PQresultStatus(r);
        PQclear(r);
        if (st == PGRES_COPY_IN)
            copying = true;
        else
            begun = st == PGRES_COMMAND_OK;
    }
    if (!copying)
        return SP_EDB;
    sp_buf_init(&head);
    sp_buf_init(&trailer);
    sp_pgcopy_header(&head);
    sp_pgcopy_trailer(&trailer);
    /* Copying without BEGIN cannot happen (a failed BEGIN runs no COPY); were it to, the COPY
     * is ended with an error like a failed send. */
    int sent = begun && PQputCopyData(db, head.data, (int)head.len) == 1 &&
               PQputCopyData(db, rows->data, (int)rows->len) == 1 &&
               PQputCopyData(db, trailer.data, (int)trailer.len) == 1;
    sp_buf_dispose(&head);
    sp_buf_dispose(&trailer);
    /* A failed send ends the COPY with an error, so the connection leaves the COPY state. */
    if (PQputCopyEnd(db, sent ? NULL : "send failed") != 1)
        return SP_EDB;
    int rc = sent ? 0 : SP_EDB;
    while ((r = PQgetResult(db)) != NULL) {
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
            const char *index = PQresultErrorField(r, PG_DIAG_CONSTRAINT_NAME);
            bool taken =
                state && strcmp(state, "23505") == 0 && index && strcmp(index, EVENT_ID_INDEX) == 0;
            rc = taken && rc == 0 ? ESTORED_ID : SP_EDB;
        }
        PQclear(r);
    }
    return rc;
}

static int store_items(el_store_t *st, const el_prep_t *prep, size_t n, int quarantine,
                       const char *why, bool stored_ids)
{
    item_t *items = sp_xcalloc(n ? n : 1, sizeof(*items));
    el_counts_t counts = {0};
    el_head_t head = st->head;
    sp_buf_t rows, tmp;
    int rc = 0;
    int in_tx = 0;

    sp_buf_init(&rows);
    sp_buf_init(&tmp);
    for (size_t i = 0; i < n; i++) {
        item_t *it = &items[i];
        it->prep = &prep[i];
        it->msg = prep[i].msg;
        /* Redelivered after a crash or a lost ack: already stored. */
        if (it->msg->stream_seq <= head.seq) {
            it->disp = M_SKIP;
            counts.skipped++;
            continue;
        }
        if (quarantine) {
            it->disp = M_REJECT;
            it->quarantine = 1;
            snprintf(it->reason, sizeof(it->reason), "not storable: %s", why);
            continue;
        }
        /* Decoded and subject-checked by the pool (env NULL when undecodable). */
        it->env = prep[i].env;
        if (prep[i].rc < 0) {
            it->disp = M_REJECT;
            snprintf(it->reason, sizeof(it->reason), "%s", prep[i].reason);
            continue;
        }
        /* seal-output (docs/audit.md): user content the deployment keeps only sealed. */
        const char *plain = st->seal_output ? sp_envelope_plaintext_content(it->env) : NULL;
        if (plain) {
            it->disp = M_REJECT;
            it->plaintext = 1;
            snprintf(it->reason, sizeof(it->reason),
                     "plaintext %s: this log keeps it only sealed (seal-output)", plain);
            continue;
        }
        it->disp = M_ACCEPT;
    }
    if (st->verify != EL_VERIFY_OFF)
        apply_signatures(st, items, n);

    /* Read before the transaction: the event log is the only writer of these tables (its
     * advisory lock), so they read the same outside it, and BEGIN rides with the COPY. */
    if ((rc = find_duplicates(st, items, n, stored_ids)) < 0)
        goto out;
    if ((rc = load_rows(st, items, n)) < 0)
        goto out;

    for (size_t i = 0; i < n; i++) {
        item_t *it = &items[i];
        if (it->disp == M_SKIP)
            continue;
        uint64_t seq = it->msg->stream_seq;
        /* Sequences the stream skipped: it no longer held them (its limits). */
        if (seq > head.seq + 1) {
            if ((rc = copy_lost_row(&rows, &tmp, head.seq + 1, seq - 1, head.hash)) < 0)
                goto out; /* cannot happen: a lost row has no envelope */
            counts.lost += seq - 1 - head.seq;
            counts.rows++;
        }
        counts.duplicates += it->duplicate;
        bool sig_ok = it->prep->sig_rc == 0;
        if (it->disp == M_ACCEPT && st->verify != EL_VERIFY_OFF && it->prep->sig_rc == SP_EHEADED) {
            int vrc = verify_member(st, it);
            if (vrc == SP_EDB) {
                rc = vrc;
                goto out;
            }
            sig_ok = vrc == 0;
        }
        if (it->disp == M_ACCEPT && st->verify != EL_VERIFY_OFF)
            authorize(st, it);
        if (it->disp == M_ACCEPT && sp_projection_apply(st->proj, it->env, seq, it->reason) < 0)
            it->disp = M_REJECT;
        /* A head whose signature verified and that is accepted: its members may follow. */
        if (it->disp == M_ACCEPT && st->verify != EL_VERIFY_OFF && it->prep->sig_rc == 0 &&
            it->env->sig_leaves.len)
            sp_sighead_ring_add(&st->heads, it->msg->data, it->msg->len, seq);
        row_t row = {.seq = seq,
                     .subject = it->msg->subject,
                     .env = it->env,
                     .published_us = it->msg->published_ns / 1000,
                     .accepted = it->disp == M_ACCEPT,
                     .reason = it->reason,
                     .data = it->msg->data,
                     .len = it->msg->len};
        if ((rc = copy_row(&rows, &tmp, &row, head.hash)) < 0) {
            snprintf(st->last_error, sizeof(st->last_error),
                     "row for seq %llu: a value its column cannot hold", (unsigned long long)seq);
            sp_log(SP_LOG_ERROR, "store failed", SP_KS("error", st->last_error));
            goto out;
        }
        head.seq = seq;
        counts.rows++;
        if (it->disp == M_ACCEPT) {
            counts.accepted++;
        } else {
            counts.rejected++;
            counts.rejected_by[reject_class(it)]++;
        }
        counts.refused += (unsigned)it->refused;
        /* The pool's verdict on its signature, for what reached the verifier (decoded). */
        if (st->verify != EL_VERIFY_OFF && !it->quarantine && it->prep->rc == 0) {
            if (sig_ok)
                counts.sig_verified++;
            else
                counts.sig_failed++;
        }
    }

    /* A rejection without the stored ids looked up may have a truer reason: a copy of a
     * stored event is a replay before it is, say, a second create of its sandbox. Rare: the
     * batch is walked again with them. */
    if (!stored_ids && counts.rejected > 0) {
        rc = ESTORED_ID;
        goto out;
    }
    /* Nothing to write (every message a redelivery): no transaction. Rows are the only way
     * the projections change (an accepted message is a row). */
    if (rows.len > 0) {
        in_tx = 1;
        if ((rc = begin_copy_in(st->db, &rows)) < 0) {
            if (rc != ESTORED_ID)
                remember_error(st, "COPY events");
            goto out;
        }
        if ((rc = sp_projection_flush(st->proj, st->db)) < 0) {
            remember_error(st, "projection flush");
            goto out;
        }
        /* Readers that need their own write reflected (the gateway answering a create) LISTEN
         * on this channel; PostgreSQL delivers it at commit. One simple query with COMMIT: a
         * failed NOTIFY runs no COMMIT. */
        char end[96];
        snprintf(end, sizeof(end), "NOTIFY " SP_EVENTLOG_CHANNEL ", '%llu'; COMMIT",
                 (unsigned long long)head.seq);
        if ((rc = sp_db_exec(st->db, end)) < 0) {
            remember_error(st, "notify and commit"); /* rolled back below, if still open */
            goto out;
        }
        in_tx = 0;
    }
    st->head = head;
    st->counts.accepted += counts.accepted;
    st->counts.rejected += counts.rejected;
    st->counts.duplicates += counts.duplicates;
    st->counts.skipped += counts.skipped;
    st->counts.refused += counts.refused;
    st->counts.lost += counts.lost;
    for (size_t k = 0; k < EL_REJ_CLASSES; k++)
        st->counts.rejected_by[k] += counts.rejected_by[k];
    st->counts.sig_verified += counts.sig_verified;
    st->counts.sig_failed += counts.sig_failed;
    st->rows += counts.rows;
    if (counts.lost)
        sp_log(SP_LOG_ERROR, "events lost: the stream no longer held them (its limits)",
               SP_KU("lost", counts.lost), SP_KU("head_seq", head.seq));
    /* Every rejection is in the table; the log names the first few of a batch and counts the
     * rest, so a flood of bad messages cannot flood the log. */
    size_t logged = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].disp != M_REJECT || logged++ >= REJECTS_LOGGED_PER_BATCH)
            continue;
        sp_log(SP_LOG_WARN, "event rejected", SP_KU("seq", items[i].msg->stream_seq),
               SP_KS("subject", items[i].msg->subject), SP_KS("reason", items[i].reason),
               SP_KS("corr", items[i].env ? items[i].env->correlation_id : ""));
    }
    if (logged > REJECTS_LOGGED_PER_BATCH)
        sp_log(SP_LOG_WARN, "more events rejected in this batch",
               SP_KU("not_logged", logged - REJECTS_LOGGED_PER_BATCH), SP_KU("last_seq", head.seq));
out:
    if (in_tx)
        sp_db_exec(st->db, "ROLLBACK");
    if (rc < 0) /* the heads this attempt accepted were not stored */
        sp_sighead_ring_drop_after(&st->heads, st->head.seq);
    /* Committed, the rows are what the tables hold: this process is their only writer (its
     * writer lock), so the next batch need not read them again. */
    if (rc < 0)
        sp_projection_clear(st->proj);
    else
        sp_projection_retain(st->proj, PROJECTION_ROWS_KEPT);
    free(items);
    sp_buf_dispose(&rows);
    sp_buf_dispose(&tmp);
    return rc;
}

int el_store_msgs(el_store_t *st, const el_prep_t *items, size_t n)
{
    int rc = store_items(st, items, n, 0, NULL, false);
    if (rc == ESTORED_ID) {
        sp_log(SP_LOG_DEBUG,
               "a rejection or a taken event id in the batch: storing it again "
               "against the stored ids",
               SP_KU("first_seq", n ? items[0].msg->stream_seq : 0), SP_KU("messages", n));
        rc = store_items(st, items, n, 0, NULL, true);
    }
    return rc;
}

int el_store_batch(el_store_t *st, const el_batch_t *b)
{
    const el_prep_t *msgs = b->items;
    size_t n = b->n;
    int rc;

    rc = el_store_msgs(st, msgs, n);
    if (rc < 0 && PQstatus(st->db) == CONNECTION_OK) {
        sp_log(SP_LOG_WARN, "batch refused; storing its messages one at a time",
               SP_KU("messages", n));
        rc = 0;
        for (size_t i = 0; i < n && rc >= 0; i++) {
            rc = el_store_msgs(st, &msgs[i], 1);
            if (rc < 0 && PQstatus(st->db) == CONNECTION_OK) {
                char why[sizeof(st->last_error)];
                snprintf(why, sizeof(why), "%s", st->last_error);
                sp_log(SP_LOG_ERROR, "message not storable; recording it as rejected",
                       SP_KU("seq", msgs[i].msg->stream_seq), SP_KS("error", why));
                rc = store_items(st, &msgs[i], 1, 1, why, true);
            }
        }
    }
    return rc;
}
