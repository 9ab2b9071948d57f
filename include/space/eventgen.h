/* Synthetic, valid events: the sandbox lifecycle as a worker and scheduler would emit it. For
 * the demo (`space demo`), integration tests and benchmarks; never used on a real request
 * path. */
#ifndef SPACE_EVENTGEN_H
#define SPACE_EVENTGEN_H

#include <stddef.h>
#include <stdint.h>

#include "cred.h"
#include "envelope.h"
#include "sign.h"

typedef struct {
    uint8_t *data; /* encoded envelope, heap */
    size_t len;
    char subject[192];
    char event_id[37];
} sp_eventgen_msg_t;

/* One sandbox event of the given type. worker names the worker for placed/started/resumed/
 * resuming and the subject's worker token (NULL: "_"). Returns 0 or a negative error. */
int sp_eventgen_sandbox(sp_event_type_t type, const char *tenant, const char *sandbox,
                        const char *worker, sp_eventgen_msg_t *out);
/* A heartbeat of a worker with these templates, sandboxes_running and interval. */
int sp_eventgen_heartbeat(const char *worker, const char *const *templates, size_t n_templates,
                          uint32_t running, uint32_t interval_ms, sp_eventgen_msg_t *out);
void sp_eventgen_msg_dispose(sp_eventgen_msg_t *m);
/* A CommandOutput of len bytes of stdout at offset, as a worker records it: plaintext, or
 * sealed under dk (datakey.h) when dk is not NULL. */
int sp_eventgen_output(const char *tenant, const char *sandbox, const char *worker,
                       const char *cmd_id, uint64_t offset, const uint8_t *data, size_t len,
                       const sp_cred_key_t *dk, sp_eventgen_msg_t *out);

/* Re-encodes msgs[0..n) (1..SP_SIG_BATCH_MAX) in place as one batch signed by signer (sign.h),
 * as a producer publishing a burst would. On failure the messages are unchanged. */
int sp_eventgen_sign(sp_eventgen_msg_t *const *msgs, size_t n, const char *signer,
                     const sp_sign_key_t *key);
/* The same as one headed batch (sign.h): msgs[0] becomes the head, which must reach the stream
 * before the others. n: 2..SP_SIG_BATCH_MAX. */
int sp_eventgen_sign_headed(sp_eventgen_msg_t *const *msgs, size_t n, const char *signer,
                            const sp_sign_key_t *key);
/* The identity a single-instance stack would have sign this event type: "gateway" for intents,
 * "scheduler" for what only the scheduler emits, "worker-<worker>" for worker facts. */
const char *sp_eventgen_signer(sp_event_type_t type, const char *worker, char *buf, size_t len);

/* The five events of a short life: create, placed, started, paused, deleted. */
extern const sp_event_type_t sp_eventgen_lifecycle[5];

#endif
