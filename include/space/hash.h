/* SHA-256 and the event log's hash chain.
 *
 * The chain: hash_n = SHA-256(hash_{n-1} || envelope_bytes_n), with hash_0 = 32 zero bytes
 * (SP_CHAIN_GENESIS). envelope_bytes are the message bytes exactly as stored in the stream.
 */
#ifndef SPACE_HASH_H
#define SPACE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define SP_SHA256_LEN     32
#define SP_SHA256_HEX_LEN 64

extern const uint8_t SP_CHAIN_GENESIS[SP_SHA256_LEN];

void sp_sha256(const void *data, size_t len, uint8_t out[SP_SHA256_LEN]);

/* Incremental SHA-256 (for streams such as command output). final writes the digest and frees
 * the context. Out of memory aborts, like sp_xmalloc. */
typedef struct sp_sha256_ctx sp_sha256_ctx_t;
sp_sha256_ctx_t *sp_sha256_new(void);
void sp_sha256_update(sp_sha256_ctx_t *c, const void *data, size_t len);
void sp_sha256_final(sp_sha256_ctx_t *c, uint8_t out[SP_SHA256_LEN]);
/* out may be the same buffer as prev. */
void sp_chain_next(const uint8_t prev[SP_SHA256_LEN], const void *data, size_t len,
                   uint8_t out[SP_SHA256_LEN]);
/* Lower-case hex, NUL-terminated (out holds 2*len+1 bytes). */
void sp_hex_encode(const uint8_t *in, size_t len, char *out);
/* Strict hex decode: in must be a string of exactly 2*len hex digits (either case) and nothing
 * else; -EINVAL otherwise, and out is then left untouched. */
int sp_hex_decode(const char *in, uint8_t *out, size_t len);

#endif
