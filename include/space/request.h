/* Signed data-plane requests (docs/trust.md, "The data plane").
 *
 * Every request on a request/reply subject of the contract (space.io.wkr.<worker>.exec|ctl|
 * file|watch, space.io.egress.<worker>.reset, space.io.cred.admin|lookup) travels inside a
 * SignedRequest (dataplane.proto) that names the requesting identity. The signature is Ed25519
 * by that identity's key (the process's signer, publish.h) over
 *
 *   "SPACE-C req v1\0" || u8 len || subject || u8 len || signer || int64be issued_at_us
 *                      || nonce (16 bytes) || SHA-256(body)
 *
 * so it binds the request to the subject it was sent on and to the moment it was made. A
 * responder opens it with sp_request_open, which refuses, in this order:
 *   - bytes that are no SignedRequest, a subject that is not the one it arrived on
 *     (SP_ESCHEMA), a body over SP_REQUEST_BODY_MAX (SP_ETOOBIG);
 *   - a signer that is no identity, or whose kind may not send on this subject: the subject
 *     table's publishers (contract.h: pub_any, or pub_own with its own {worker} token)
 *     (SP_ESIGNER, SP_ENOTALLOWED, SP_ENOTOWN);
 *   - a missing or bad signature, an unknown signer (SP_EUNSIGNED, SP_ESIGNATURE, SP_ESIGNER);
 *   - a request issued more than SP_REQUEST_WINDOW_US from the responder's clock, or whose
 *     nonce it saw within the window (SP_ESTALE: a replay).
 * With the responder's verifier off (a deployment without credentials) the wrapper is opened
 * and nothing is checked; in log mode the answer is 1 (acted on, reason given).
 */
#ifndef SPACE_REQUEST_H
#define SPACE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "bus.h"
#include "contract.h"
#include "verifier.h"

/* How far a request's issued_at may be from the responder's clock (either way): hosts' clocks
 * are NTP-synchronised; a request older than this is not a live one. */
#define SP_REQUEST_WINDOW_US (30LL * 1000000)
#define SP_REQUEST_NONCE_LEN 16
/* The largest body: a file chunk (256 KiB) or stdin (1 MiB) with its fields, under the bus's
 * message limit. */
#define SP_REQUEST_BODY_MAX (SP_BUS_MAX_MSG - 1024)

/* Wraps body for subject, signed by the process's signer (unsigned when there is none): the
 * bytes to send. SP_ETOOBIG, -EINVAL (subject too long). */
int sp_request_seal(const char *subject, const void *body, size_t len, uint8_t **ret_buf,
                    size_t *ret_len);
/* The same with an explicit signer and key (NULL: unsigned) and issue time: for programs that
 * are not a daemon with a process signer (platforms' tools, tests). */
int sp_request_seal_as(const char *subject, const void *body, size_t len, const char *signer,
                       const sp_sign_key_t *key, int64_t issued_at_us, uint8_t **ret_buf,
                       size_t *ret_len);
/* sp_request_seal, then sp_bus_request: what every requester calls. */
int sp_request_send(sp_bus_t *bus, const char *subject, const void *body, size_t len,
                    int timeout_ms, uint8_t **ret_data, size_t *ret_len);

/* A responder's checks: its verifier (borrowed) and the nonces it has seen within the window.
 * Thread-safe. */
typedef struct sp_request_guard sp_request_guard_t;
int sp_request_guard_new(sp_verifier_t *v, sp_request_guard_t **ret_g);
void sp_request_guard_free(sp_request_guard_t *g);

typedef struct {
    const uint8_t *body; /* into the opened wrapper: valid until sp_request_dispose */
    size_t len;
    char signer[SP_IDENTITY_MAX + 1]; /* "" when unsigned (verifier off) */
    void *msg_;
} sp_request_t;

/* Opens raw, received on subject: 0 (act), 1 (log mode: would be refused, reason filled) or
 * a refusal (< 0, reason filled: sp_trust_refusal_name + detail). ret is set in all cases
 * where the wrapper decoded (dispose it always; a zeroed one is fine). */
int sp_request_open(sp_request_guard_t *g, const char *subject, const uint8_t *raw, size_t len,
                    sp_request_t *ret, char reason[SP_REASON_MAX]);
void sp_request_dispose(sp_request_t *r);

/* What a responder calls: sp_request_open, and for a refusal (< 0) the RequestRefused answer
 * on reply_to (sp_request_refuse). Same answers; the caller logs a non-zero one. */
int sp_request_take(sp_request_guard_t *g, sp_bus_t *bus, const char *subject, const char *reply_to,
                    const uint8_t *raw, size_t len, sp_request_t *ret, char reason[SP_REASON_MAX]);

/* Answers a refused request on reply_to (nothing when NULL) with RequestRefused
 * {ok: false, error: "unauthorized", detail: reason}: every reply type's fields 1-3 are
 * (ok, error, detail) (dataplane.proto), so the requester decodes it as its own reply. */
void sp_request_refuse(sp_bus_t *bus, const char *reply_to, const char *reason);

#endif
