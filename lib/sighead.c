/* Heads of headed batches (sighead.h). */
#include "sighead.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "error.h"

void sp_sighead_ring_init(sp_sighead_ring_t *r)
{
    memset(r, 0, sizeof(*r));
}

void sp_sighead_ring_dispose(sp_sighead_ring_t *r)
{
    for (size_t i = 0; i < SP_SIGHEAD_RING; i++)
        sp_envelope_free(r->env[i]);
    memset(r, 0, sizeof(*r));
}

int sp_sighead_ring_add(sp_sighead_ring_t *r, const uint8_t *raw, size_t len, uint64_t seq)
{
    char reason[SP_REASON_MAX];
    sp_envelope_t *env = NULL;
    int rc = sp_envelope_decode(raw, len, &env, reason);
    if (rc < 0)
        return rc;
    if (env->sig_leaves.len == 0) {
        sp_envelope_free(env);
        return SP_ESCHEMA;
    }
    size_t slot = r->next++ % SP_SIGHEAD_RING;
    sp_envelope_free(r->env[slot]);
    r->env[slot] = env;
    r->seq[slot] = seq;
    return 0;
}

void sp_sighead_ring_drop_after(sp_sighead_ring_t *r, uint64_t seq)
{
    for (size_t i = 0; i < SP_SIGHEAD_RING; i++) {
        if (r->env[i] && r->seq[i] > seq) {
            sp_envelope_free(r->env[i]);
            r->env[i] = NULL;
        }
    }
}

/* The newest kept head named id before seq. */
static const sp_envelope_t *ring_find(const sp_sighead_ring_t *r, const char *id, uint64_t seq)
{
    for (size_t k = 0; k < SP_SIGHEAD_RING; k++) {
        size_t i = (r->next + SP_SIGHEAD_RING - 1 - k) % SP_SIGHEAD_RING;
        if (r->env[i] && r->seq[i] < seq && strcmp(r->env[i]->event_id, id) == 0)
            return r->env[i];
    }
    return NULL;
}

/* The accepted head named id before seq from the events table, verified again; NULL (none, or
 * one that does not verify) or SP_EDB in *ret_rc. */
static const sp_envelope_t *load(sp_sighead_ring_t *r, PGconn *db, const sp_keyring_t *kr,
                                 sp_sigcache_t *cache, const char *id, uint64_t seq, int *ret_rc)
{
    char seq_txt[24];
    const char *params[2] = {id, seq_txt};
    const sp_envelope_t *head = NULL;

    *ret_rc = 0;
    if (!db)
        return NULL;
    snprintf(seq_txt, sizeof(seq_txt), "%" PRIu64, seq);
    PGresult *res = sp_db_exec_prepared(
        db,
        "SELECT payload, stream_seq, (extract(epoch FROM published_at) * 1000000)::bigint "
        "FROM events WHERE status = 'accepted' AND event_id = $1::uuid AND stream_seq < $2",
        2, params, 1 /* binary */);
    if (sp_db_check(res, PGRES_TUPLES_OK) < 0) {
        PQclear(res);
        *ret_rc = SP_EDB;
        return NULL;
    }
    if (PQntuples(res) == 1) {
        const uint8_t *raw = (const uint8_t *)PQgetvalue(res, 0, 0);
        size_t len = (size_t)PQgetlength(res, 0, 0);
        uint64_t rseq = 0;
        int64_t us = 0;
        const uint8_t *p = (const uint8_t *)PQgetvalue(res, 0, 1);
        for (int b = 0; b < 8; b++)
            rseq = rseq << 8 | p[b];
        p = (const uint8_t *)PQgetvalue(res, 0, 2);
        for (int b = 0; b < 8; b++)
            us = (int64_t)((uint64_t)us << 8 | p[b]);
        char reason[SP_REASON_MAX];
        sp_envelope_t *env = NULL;
        if (sp_envelope_decode(raw, len, &env, reason) == 0 && env->sig_leaves.len &&
            sp_envelope_verify(kr, cache, env, raw, len, us * 1000) == 0 &&
            sp_sighead_ring_add(r, raw, len, rseq) == 0)
            head = ring_find(r, id, seq);
        sp_envelope_free(env);
    }
    PQclear(res);
    return head;
}

int sp_sighead_verify_member(sp_sighead_ring_t *r, PGconn *db, const sp_keyring_t *kr,
                             sp_sigcache_t *cache, const sp_envelope_t *env,
                             const uint8_t leaf[SP_SIG_HASH_LEN], uint64_t seq,
                             char reason[SP_REASON_MAX])
{
    const sp_envelope_t *head;
    char id[37];
    int rc = 0;

    sp_sig_head_id(env, id);
    if (!id[0]) {
        snprintf(reason, SP_REASON_MAX, "bad_signature: %s %s names no batch head", env->type,
                 env->event_id);
        return SP_ESIGNATURE;
    }
    head = ring_find(r, id, seq);
    if (!head)
        head = load(r, db, kr, cache, id, seq, &rc);
    if (rc < 0) {
        snprintf(reason, SP_REASON_MAX, "batch head %s of %s %s: cannot read the log", id,
                 env->type, env->event_id);
        return rc;
    }
    if (!head) {
        snprintf(reason, SP_REASON_MAX,
                 "bad_signature: %s %s names batch head %s, which is not an accepted head "
                 "before it",
                 env->type, env->event_id, id);
        return SP_ESIGNATURE;
    }
    if (sp_sig_member_check(head, env, leaf) < 0) {
        snprintf(reason, SP_REASON_MAX,
                 "bad_signature: %s %s is not member %u of the batch head %s signed by %s",
                 env->type, env->event_id, env->sig_index, head->event_id, head->signer);
        return SP_ESIGNATURE;
    }
    return 0;
}
