/* The heads of headed batches (sign.h, docs/trust.md "Headed batches"), as the event log and
 * space-replay look them up: a member is verified against the accepted head that precedes it in
 * the log. The same rule at store time (the event log) and at audit time (space-replay verify),
 * so both reach the same verdict: recent heads from a ring filled in stream order, older ones
 * from the events table, verified again when read. */
#ifndef SPACE_SIGHEAD_H
#define SPACE_SIGHEAD_H

#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>

#include "envelope.h"
#include "sign.h"

/* Heads kept: a producer's members follow their head closely (it waits for the head's ack,
 * then publishes them), so a few recent heads per producer cover nearly every member. */
#define SP_SIGHEAD_RING 128

typedef struct {
    sp_envelope_t *env[SP_SIGHEAD_RING]; /* verified heads, decoded (owned) */
    uint64_t seq[SP_SIGHEAD_RING];       /* the stream sequence each was accepted at */
    size_t next;
} sp_sighead_ring_t;

void sp_sighead_ring_init(sp_sighead_ring_t *r);
void sp_sighead_ring_dispose(sp_sighead_ring_t *r);
/* Keeps a head accepted at seq: raw is its message, which verified (sp_envelope_verify) and
 * has a list (sig_leaves). SP_EDECODE / SP_ESCHEMA when raw is no such head. */
int sp_sighead_ring_add(sp_sighead_ring_t *r, const uint8_t *raw, size_t len, uint64_t seq);
/* Forgets heads kept at a sequence after seq (their store was rolled back). */
void sp_sighead_ring_drop_after(sp_sighead_ring_t *r, uint64_t seq);

/* Verifies env, a headed member (sp_envelope_verify said SP_EHEADED) at stream sequence seq
 * whose leaf is leaf (sp_envelope_leaf), against its head: the accepted head with its sig_head
 * as event_id at a sequence before seq, from the ring, else from db's events table (its
 * signature verified again with kr and cache, at the time it was published, then kept in the
 * ring). 0; SP_ESIGNATURE (no such head, or the member is not in its list) with reason set;
 * SP_EDB when the table cannot be read (reason set). */
int sp_sighead_verify_member(sp_sighead_ring_t *r, PGconn *db, const sp_keyring_t *kr,
                             sp_sigcache_t *cache, const sp_envelope_t *env,
                             const uint8_t leaf[SP_SIG_HASH_LEN], uint64_t seq,
                             char reason[SP_REASON_MAX]);

#endif
