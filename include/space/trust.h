/* The one trust check every consumer applies before acting on a message (docs/trust.md).
 *
 * A message is acted on only if its envelope is signed, the signer is in the keyring, the
 * signature verifies over the canonical bytes (sp_envelope_canonical), the subject agrees with
 * the envelope, and the contract (contract.h) lets the signer's kind emit that type, on that
 * subject, for that tenant:
 *   - a worker: only on subjects whose worker token is its own, only for the sandboxes placed
 *     on it (asked of the caller's projection through the placement hook), and its worker
 *     events only about itself;
 *   - an egressd: only for sandboxes placed on its host's worker;
 *   - a platform: only for its own tenants (the keyring's <identity>.tenants);
 *   - gateway, scheduler: whatever type the contract gives them.
 * Anything else is refused with a code (SP_EUNSIGNED, SP_ESIGNER, SP_ESIGNATURE,
 * SP_ENOTALLOWED, SP_ENOTOWN, SP_ETENANT; sp_trust_refusal_name gives the machine name) and a
 * one-line reason fit for a "...Rejected" record, or SP_ESCHEMA / SP_EDECODE when the subject
 * or the bytes do not agree with the envelope.
 *
 * Replays of a validly signed message are not refused here: the event log's unique index on
 * event_id (accepted rows) already stores a second copy as rejected, and JetStream's duplicate
 * window drops it before that (docs/trust.md).
 */
#ifndef SPACE_TRUST_H
#define SPACE_TRUST_H

#include <stddef.h>
#include <stdint.h>

#include "contract.h"
#include "envelope.h"
#include "sign.h"

/* Which worker the sandbox is placed on, from the caller's own state: 1 and the worker id in
 * worker, 0 if the sandbox is unknown (or not placed), 2 if it is known to this tenant and
 * placed on no worker right now (suspended, deleted, lost with its host), < 0 on failure
 * (refused as not own).
 * Runs on the caller's thread, inside sp_trust_check. */
typedef int (*sp_trust_placement_fn)(void *arg, const char *tenant, const char *sandbox,
                                     char worker[SP_INSTANCE_MAX + 1]);

/* Which worker took snapshot_id of sandbox (the tenant's), from the caller's log: 1 and its id
 * in worker, 0 when no accepted SandboxSnapshotted of that sandbox names it, < 0 on failure.
 * A snapshot's artifacts stay with the worker that took it (SnapshotDeleteRequested goes
 * there), so its SnapshotDeleted is that worker's to say, wherever the sandbox is now
 * (suspended, resumed on another worker, lost with its host). Runs on the caller's thread. */
typedef int (*sp_trust_snapshot_fn)(void *arg, const char *tenant, const char *sandbox,
                                    const char *snapshot_id, char worker[SP_INSTANCE_MAX + 1]);

typedef struct {
    const sp_keyring_t *keyring;     /* borrowed */
    sp_trust_placement_fn placement; /* NULL: worker and egressd sandbox events are refused */
    void *placement_arg;
    /* NULL: a SnapshotDeleted is judged by placement like the worker's other facts. */
    sp_trust_snapshot_fn snapshot_taker;
    /* Whether a worker is live (sp_db_worker_live): 1 yes, 0 no, < 0 failure. With it, a
     * snapshot whose taker is not live may be said deleted by any worker: the gateway sends
     * the delete to a live one (its own artifacts of it, and the shared store's, go), so a
     * host gone for good does not make its snapshots undeletable. NULL: the taker only. Both
     * get snapshot_arg. */
    int (*worker_live)(void *arg, const char *worker);
    void *snapshot_arg;
    /* Batch signatures already verified (sign.h), borrowed; NULL: every envelope costs one
     * Ed25519 verification. */
    sp_sigcache_t *cache;
} sp_trust_t;

/* env is the decoded (and schema-valid) envelope of raw, which arrived on subject, published at
 * at_ns (the stream's timestamp, ns since the epoch; 0: now), the time a retired key of the
 * signer is judged at (sp_envelope_verify). 0 when the message may be acted on; otherwise a
 * refusal code and reason (SP_REASON_MAX bytes). sp_trust_verify then sp_trust_authorize. */
int sp_trust_check(const sp_trust_t *t, const sp_envelope_t *env, const uint8_t *raw,
                   size_t raw_len, const char *subject, int64_t at_ns, char reason[SP_REASON_MAX]);

/* The two halves, for a consumer that verifies a whole batch of messages before it applies
 * them in order (the event log: signatures on the fetched batch, then the contract inside the
 * storing transaction, where placements made earlier in the batch are visible).
 * sp_trust_verify: signed, known signer, signature (through the proof) verifies: 0 or
 * SP_EUNSIGNED, SP_ESIGNER, SP_ESIGNATURE, SP_EDECODE, SP_ETOOBIG. Uses no placement hook;
 * thread-safe when the keyring and cache are (they are).
 * sp_trust_authorize: what the contract lets the (verified) signer say on subject; calls the
 * placement hook on the caller's thread. */
int sp_trust_verify(const sp_trust_t *t, const sp_envelope_t *env, const uint8_t *raw,
                    size_t raw_len, int64_t at_ns, char reason[SP_REASON_MAX]);
int sp_trust_authorize(const sp_trust_t *t, const sp_envelope_t *env, const char *subject,
                       char reason[SP_REASON_MAX]);

/* The sandbox whose placement decides whether a worker or egressd may emit env: its aggregate,
 * or for egressd's CredentialUsed/Denied (aggregate: the credential) the sandbox that made the
 * request ("" when it names none). Borrowed from env. A consumer that preloads placements
 * (the event log's projection) loads this one. */
const char *sp_trust_sandbox_of(const sp_envelope_t *env);

#endif
