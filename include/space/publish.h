/* Publishing events: stamp, validate, encode (signed), pick the subject, publish with a message
 * id. The one way daemons put facts and intents on the bus.
 *
 * Signing (docs/trust.md): a process that has an identity (busid.h) registers its name and
 * signing key once at startup with sp_publish_signer_set; from then on every envelope encoded
 * here (sp_publish_pack, and through it sp_publish_encode, sp_publish_event and eventgen.h)
 * carries signer = that name and its Ed25519 signature. Without a signer envelopes go out
 * unsigned (a process without credentials, tests that forge events on purpose). */
#ifndef SPACE_PUBLISH_H
#define SPACE_PUBLISH_H

#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "envelope.h"

/* Fills event_id (into id_buf), occurred_at, schema_version and type, then publishes env on
 * its subject (worker: the worker token for sandbox events, NULL for "_") and waits for the
 * stream's ack. msg_id is the Nats-Msg-Id: pass a key derived from the event this one answers
 * ("placed:<intent id>") so that a retry after a crash is dropped by the stream's duplicate
 * window; NULL uses the event id. *ret_seq (optional): the stream sequence; a duplicate
 * reports the original's. SP_ESCHEMA if the envelope does not validate. */
int sp_publish_event(sp_bus_t *bus, sp_envelope_t *env, char id_buf[37], const char *worker,
                     const char *msg_id, uint64_t *ret_seq);

/* sp_publish_event with sp_bus_publish_retry (bus.h): the same envelope bytes and Nats-Msg-Id
 * again while the bus fails, for at most budget_ms. Facts use SP_PUBLISH_FACT_BUDGET_MS (a
 * worker's fact must not be lost to a NATS node's death); the gateway's lifecycle, create,
 * network and snapshot intents SP_PUBLISH_INTENT_BUDGET_MS: short, since each try holds one of
 * its pool's threads while a client waits (a command's intent goes through the bus lane, one
 * thread for all commands, and is not retried: a client asks again after its 503). */
#define SP_PUBLISH_FACT_BUDGET_MS   30000
#define SP_PUBLISH_INTENT_BUDGET_MS 3000
int sp_publish_event_retry(sp_bus_t *bus, sp_envelope_t *env, char id_buf[37], const char *worker,
                           const char *msg_id, int budget_ms);

/* The first half of sp_publish_event, for a caller that publishes later (in order, from a
 * thread of its own): stamps env as sp_publish_event does (occurred_at is now), writes its
 * subject and encodes it into a heap buffer (caller frees). SP_ESCHEMA if it does not
 * validate. */
#define SP_PUBLISH_SUBJECT_MAX 256
int sp_publish_encode(sp_envelope_t *env, char id_buf[37], const char *worker,
                      char subject[SP_PUBLISH_SUBJECT_MAX], uint8_t **ret_buf, size_t *ret_len);

#include "sign.h"

/* Registers the process's identity and signing key (both borrowed: they must live until the
 * process stops publishing; NULL key: unsigned again). Call before any thread publishes: the
 * signer is read without a lock. */
void sp_publish_signer_set(const char *identity, const sp_sign_key_t *key);
/* The registered identity, or NULL. */
const char *sp_publish_signer(void);
/* Signs n encoded envelopes as one Merkle batch (sign.h) by signer with key: each of bufs[i]
 * (as sp_envelope_encode made it, or signed before: its signature fields are replaced) is
 * replaced by its signed encoding (the old buffer freed). n: 1..SP_SIG_BATCH_MAX. On failure
 * (bytes that do not decode, SP_ETOOBIG) nothing is changed. */
int sp_envelope_sign_encoded(uint8_t **bufs, size_t *lens, size_t n, const char *signer,
                             const sp_sign_key_t *key);
/* The same as one headed batch (sign.h): bufs[0] becomes the head. n: 2..SP_SIG_BATCH_MAX. */
int sp_envelope_sign_encoded_headed(uint8_t **bufs, size_t *lens, size_t n, const char *signer,
                                    const sp_sign_key_t *key);
/* The same with the process's signer, for any n: a producer that publishes a burst calls it
 * once. When every subjects[i] (bufs[i]'s subject; subjects NULL: unknown) is one only the
 * event log reads (sp_subject_log_only) and n >= 2, headed batches of at most
 * SP_SIG_HEADED_DEFAULT (one Ed25519 signature each, ~45 bytes per member), and heads[i] (n
 * entries; may be NULL) is set for each head, which must reach the stream before the rest of
 * its batch (sp_publish_burst_async does that); else Merkle batches of at most
 * SP_SIG_BATCH_DEFAULT. Without a signer: nothing is changed. */
int sp_publish_sign_burst(uint8_t **bufs, size_t *lens, const char *const *subjects, size_t n,
                          bool *heads);
/* Signs a burst (sp_publish_sign_burst) and publishes it in order, asynchronously; the caller
 * waits for the acks (sp_bus_publish_async_complete). bufs[i] are replaced by their signed
 * bytes (the caller frees them). With wait_heads, each head is published synchronously (its
 * ack received before its members go) and after a head that failed nothing more is published
 * (its members would be refused): for a caller that publishes the burst again on failure (the
 * message ids drop what the stream has). Without, heads go in order with the rest (the stream
 * stores one connection's messages in order), for a caller that must not block. 0, or the
 * first failure. */
int sp_publish_burst_async(sp_bus_t *bus, uint8_t **bufs, size_t *lens, const char *const *subjects,
                           const char *const *msg_ids, size_t n, bool wait_heads);
/* A burst: events a producer emits at one moment (egressd's audit flush, the scheduler's
 * answers to one fetched batch of intents), published as one signed batch. Add each (stamped,
 * its subject made, encoded; env is not kept), then publish them all asynchronously
 * (sp_bus_publish_async) after one sp_publish_sign_burst; the burst is emptied either way.
 * The caller waits for the acks (sp_bus_publish_async_complete) before it counts them
 * stored. */
#define SP_PUBLISH_MSGID_MAX 80
typedef struct {
    uint8_t **bufs;
    size_t *lens;
    char (*subjects)[SP_PUBLISH_SUBJECT_MAX];
    char (*msg_ids)[SP_PUBLISH_MSGID_MAX];
    size_t n, cap;
} sp_burst_t;
void sp_burst_init(sp_burst_t *b);
/* Message id = the event id. */
int sp_burst_add(sp_burst_t *b, sp_envelope_t *env, const char *worker);
/* With the Nats-Msg-Id msg_id (as sp_publish_event's; NULL: the event id; -EINVAL when it
 * does not fit SP_PUBLISH_MSGID_MAX). The event id is written into id_buf (may be NULL). */
int sp_burst_add_msg(sp_burst_t *b, sp_envelope_t *env, const char *worker, const char *msg_id,
                     char id_buf[37]);
/* 0, or the first failure (the others were still published: each stands alone). */
int sp_burst_publish_async(sp_bus_t *bus, sp_burst_t *b);
void sp_burst_dispose(sp_burst_t *b);
/* Its key (NULL when unsigned): signed data-plane requests use it too (request.h). */
const sp_sign_key_t *sp_publish_signer_key(void);

/* Encodes env for the bus: sp_envelope_encode_signed with the registered signer, else
 * sp_envelope_encode (same errors). env must be stamped already. The one place an envelope
 * bound for the bus is encoded. */
int sp_publish_pack(sp_envelope_t *env, uint8_t **ret_buf, size_t *ret_len);

/* Starts an envelope that answers cause (same tenant, aggregate and correlation; causation =
 * cause's event id) as actor. The caller sets payload_case and the payload. Borrowed strings:
 * cause must outlive env. */
void sp_envelope_answer(sp_envelope_t *env, Space__V1__Aggregate *agg, const sp_envelope_t *cause,
                        const char *actor);

#endif
