/* Known secret values removed from a stream of bytes, also when a value is split across
 * feeds: the bytes that may begin a value are held back until the next feed, a release or the
 * flush. Two users, one algorithm:
 *   - the worker's captured output (datakey.h, docs/audit.md): a value becomes the marker
 *     "[redacted:NAME]" (sp_redactor_new);
 *   - egressd's responses to the guest (docs/credentials.md, "A site echoes the credential"):
 *     a value becomes as many mask bytes as it has (sp_redactor_new_mask), so the output is
 *     exactly as long as the input and HTTP framing (Content-Length, chunk sizes, WebSocket
 *     frame lengths) stays valid without parsing it.
 *
 * Memory: between calls at most (longest value - 1) bytes are held; during a feed the held
 * bytes and the fed ones. Nothing grows with the length of the stream. Values and held bytes
 * are wiped (explicit_bzero) when they are dropped, also when a buffer grows.
 *
 * Matching is plain byte comparison: at every place the longest value that matches wins.
 * Nothing here logs; no function puts a value into an error string. Not thread-safe: one
 * owner. */
#ifndef SPACE_REDACT_H
#define SPACE_REDACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"

#define SP_REDACT_MIN        4 /* sp_redactor_new: shorter values are ignored (they match anything) */
#define SP_REDACT_VALUE_MAX  12288 /* a credential value (4,096) percent-encoded */
#define SP_REDACT_VALUES_MAX 256

typedef struct sp_redactor sp_redactor_t;

/* Values become "[redacted:NAME]"; values of fewer than SP_REDACT_MIN bytes are ignored. */
sp_redactor_t *sp_redactor_new(void);
/* Values become len copies of mask; values of fewer than min_len bytes (at least 1) are
 * ignored. */
sp_redactor_t *sp_redactor_new_mask(uint8_t mask, size_t min_len);
/* Called once per value replaced, with the name it was added under (borrowed, for the call
 * only). A value straddling a release (below) whose rest is replaced counts too. */
typedef void (*sp_redact_match_cb)(void *arg, const char *name);
void sp_redactor_on_match(sp_redactor_t *r, sp_redact_match_cb cb, void *arg);
/* Adds value (len bytes) under name ([A-Za-z0-9_] is kept, anything else becomes '_'; at most
 * 64 bytes). Returns false when it was ignored: shorter than the minimum, longer than
 * SP_REDACT_VALUE_MAX, or SP_REDACT_VALUES_MAX values already. A value already there is
 * true (its first name stays). */
bool sp_redactor_add(sp_redactor_t *r, const char *name, const void *value, size_t len);
/* Adds every "NAME=VALUE" of env. */
void sp_redactor_add_env(sp_redactor_t *r, char *const *env, size_t n);
/* Bytes of the shortest value that is kept (the minimum above). */
size_t sp_redactor_min(const sp_redactor_t *r);
/* Values held. */
size_t sp_redactor_count(const sp_redactor_t *r);
/* Feeds len bytes and appends to out what can no longer be part of a value: the bytes that
 * may begin one are held back until the next feed, a release or the flush. */
void sp_redactor_feed(sp_redactor_t *r, const void *data, size_t len, sp_buf_t *out);
/* The stream stalls (nothing more came for a while): what is held goes out now, values in it
 * replaced, the rest as it is (it began a value that has not completed). Those bytes are
 * still remembered: if the next feed completes a value they began, the part of it not yet
 * out is replaced, so a value split by a stall never passes whole. */
void sp_redactor_release(sp_redactor_t *r, sp_buf_t *out);
/* The end of the stream: what was held back goes out (redacted where it holds a value), and
 * nothing is remembered. The redactor can start a new stream. */
void sp_redactor_flush(sp_redactor_t *r, sp_buf_t *out);
/* Bytes fed and not yet out. */
size_t sp_redactor_held(const sp_redactor_t *r);
/* Wipes the values and what is held, and frees. NULL is fine. */
void sp_redactor_free(sp_redactor_t *r);

#endif
