/* What a consumer of the bus owns to apply the trust check (trust.h) to what it receives:
 * the keyring of a directory (re-read when a signer it does not know has a public key there
 * now), a cache of verified batch signatures, and the mode (docs/trust.md):
 *
 *   verify-signatures = on | off | log | auto     auto: on when keyring-dir exists
 *   keyring-dir       = <dir>                     empty: the daemon's creds-dir (busid.h)
 *
 * Every daemon that acts on bus messages (scheduler, worker, egressd; the event log) has the
 * same two options (SP_VERIFIER_CFG_OPTS) and the same answer for each message:
 *   0   act on it;
 *   < 0 refuse it (SP_EUNSIGNED ... SP_ETENANT, reason filled: sp_trust_refusal_name);
 *   1   log mode: it would have been refused (reason filled), act on it anyway.
 * Thread-safe: checks from several threads share the keyring under a read lock; a reload
 * takes the write lock. The placement hook runs on the calling thread.
 */
#ifndef SPACE_VERIFIER_H
#define SPACE_VERIFIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "sign.h"
#include "trust.h"

#define SP_VERIFIER_ERR_MAX 512

#define SP_VERIFIER_CFG_OPTS(st, fm, fd)                                                           \
    SP_CFG_STR_OPT("verify-signatures", st, fm, "auto",                                            \
                   "on|off|log|auto: act only on messages whose signer, signature and permission " \
                   "check (auto: on when keyring-dir exists)"),                                    \
        SP_CFG_STR_OPT("keyring-dir", st, fd, NULL,                                                \
                       "the identities' public keys (<identity>.pub); empty: creds-dir")

typedef enum {
    SP_VERIFY_OFF, /* every well-formed message is acted on, whoever sent it */
    SP_VERIFY_ON,
    SP_VERIFY_LOG, /* checked, refusals reported (1), acted on anyway: a migration aid */
} sp_verify_mode_t;

typedef struct sp_verifier sp_verifier_t;

/* mode: "on", "off", "log", "auto"; keyring_dir: empty or NULL for fallback_dir (the
 * daemon's creds-dir; NULL or empty too: no directory, so auto is off and on fails). Loads the
 * keyring unless the mode is off. cache_slots: sp_sigcache_new's (0: 4096). On failure
 * (unknown mode, on without a readable directory, a malformed key file) a message in err. */
int sp_verifier_new(const char *mode, const char *keyring_dir, const char *fallback_dir,
                    size_t cache_slots, sp_verifier_t **ret_v, char err[SP_VERIFIER_ERR_MAX]);
void sp_verifier_free(sp_verifier_t *v);

sp_verify_mode_t sp_verifier_mode(const sp_verifier_t *v);
/* "on", "off", "log". */
const char *sp_verifier_mode_name(const sp_verifier_t *v);
/* One line for the daemon's start log (INFO when on, WARN otherwise): what is checked. */
const char *sp_verifier_summary(const sp_verifier_t *v);
/* The keyring directory ("" when off without one). */
const char *sp_verifier_dir(const sp_verifier_t *v);
/* Identities in the keyring now; cache hits and Ed25519 verifications so far. */
size_t sp_verifier_identities(sp_verifier_t *v);
void sp_verifier_stats(const sp_verifier_t *v, uint64_t *ret_hits, uint64_t *ret_verified);

/* The trust check (sp_trust_check) of env, decoded from raw, received on subject, published at
 * at_ns (the stream's timestamp; 0: now), with the caller's placement hook (NULL: worker and
 * egressd sandbox events are refused). A signature that does not verify while the keyring's
 * directory changed (a key rotated) is checked again against the directory read anew. */
int sp_verifier_check(sp_verifier_t *v, const sp_envelope_t *env, const uint8_t *raw,
                      size_t raw_len, const char *subject, int64_t at_ns,
                      sp_trust_placement_fn placement, void *placement_arg,
                      char reason[SP_REASON_MAX]);
/* Its halves (trust.h): a consumer whose state lives on another thread verifies where the
 * message arrives and authorizes where the state is. Same answers. */
int sp_verifier_verify(sp_verifier_t *v, const sp_envelope_t *env, const uint8_t *raw,
                       size_t raw_len, int64_t at_ns, char reason[SP_REASON_MAX]);
int sp_verifier_authorize(sp_verifier_t *v, const sp_envelope_t *env, const char *subject,
                          sp_trust_placement_fn placement, void *placement_arg,
                          char reason[SP_REASON_MAX]);

/* ---- replays ----
 * A validly signed message published again (under another message id, past JetStream's
 * duplicate window) verifies like the original. sp_verifier_once lets a consumer act on each
 * event id once, at the stream sequence the event log accepted it at:
 *   - an event id it has seen at another sequence (a table of the last ones it acted on) is a
 *     replay;
 *   - one it has not seen, older than SP_VERIFIER_FRESH_US (a restart emptied the table, or
 *     the copy came later), is looked up in the event log (lookup: the accepted row's
 *     stream_seq; the caller's PostgreSQL): accepted at another sequence is a replay; not in
 *     the log (yet: it lags) is acted on.
 * 0 act (and remembered), SP_ESTALE refused (reason filled), 1 in log mode. The mode off: 0.
 * lookup: 1 and *ret_seq when the log has the event accepted, 0 when not, < 0 on failure
 * (acted on: availability over a check that cannot be made; logged by the caller's lookup). */
#define SP_VERIFIER_FRESH_US (2 * 1000000LL)
typedef int (*sp_verifier_lookup_fn)(void *arg, const char *event_id, uint64_t *ret_seq);
int sp_verifier_once(sp_verifier_t *v, const sp_envelope_t *env, uint64_t stream_seq,
                     sp_verifier_lookup_fn lookup, void *lookup_arg, char reason[SP_REASON_MAX]);

/* What a consumer calls for a message it is about to act on: sp_verifier_check (at
 * published_ns), then (when that lets it through) sp_verifier_once. Same answers: 0 act, 1
 * log mode, < 0 refused. */
int sp_verifier_admit(sp_verifier_t *v, const sp_envelope_t *env, const uint8_t *raw,
                      size_t raw_len, const char *subject, uint64_t stream_seq,
                      int64_t published_ns, sp_trust_placement_fn placement, void *placement_arg,
                      sp_verifier_lookup_fn lookup, void *lookup_arg, char reason[SP_REASON_MAX]);

/* A plain signature by signer over data (signed data-plane requests, request.h): 0, 1 (log
 * mode) or < 0 as above (SP_EUNSIGNED for an empty signer, SP_ESIGNER, SP_ESIGNATURE). */
int sp_verifier_verify_raw(sp_verifier_t *v, const char *signer, const void *data, size_t len,
                           const uint8_t sig[SP_SIG_LEN], char reason[SP_REASON_MAX]);

#endif
