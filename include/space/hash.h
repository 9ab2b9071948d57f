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

/* Chain v2: the rows the event log writes since schema 6 (events.chain_v = 2). The hash covers
 * what the row says about its message beyond the bytes, so that a status flipped from rejected
 * to accepted, a reject reason rewritten or a row renumbered breaks the chain by itself:
 *
 *   hash_n = SHA-256("SPACE-C chain v2\0" || hash_{n-1} || u64be(stream_seq)
 *                    || u32be(len(subject)) || subject || u64be(payload_size)
 *                    || SHA-256(payload) || u8(accepted) || u8(reason != NULL)
 *                    || u32be(len(reason)) || reason)
 *
 * payload_size and SHA-256(payload) are those of the whole message, also when the row keeps
 * only its first SP_CHAIN_PAYLOAD_KEEP bytes (a rejected message larger than that: the row
 * stores the size and the digest beside the prefix). subject and reason are the columns'
 * bytes exactly as stored. */
#define SP_CHAIN_V2           2
#define SP_CHAIN_PAYLOAD_KEEP (64 * 1024)
/* The reject reason of the row that stands for stream sequences the stream no longer held when
 * the log asked for them (its limits dropped them first): "lost: FROM-TO ...", at stream_seq
 * FROM, with an empty payload. The next row is at TO + 1. */
#define SP_CHAIN_LOST_PREFIX "lost: "
typedef struct {
    uint64_t seq;
    const char *subject;
    size_t subject_len;
    uint64_t payload_size;
    const uint8_t *payload_sha256; /* SP_SHA256_LEN bytes */
    int accepted;                  /* 1 accepted, 0 rejected */
    const char *reason;            /* NULL for none */
    size_t reason_len;
} sp_chain_row_t;
/* out may be the same buffer as prev. */
void sp_chain2_next(const uint8_t prev[SP_SHA256_LEN], const sp_chain_row_t *row,
                    uint8_t out[SP_SHA256_LEN]);

/* Lower-case hex, NUL-terminated (out holds 2*len+1 bytes). */
void sp_hex_encode(const uint8_t *in, size_t len, char *out);
/* Strict hex decode: in must be a string of exactly 2*len hex digits (either case) and nothing
 * else; -EINVAL otherwise, and out is then left untouched. */
int sp_hex_decode(const char *in, uint8_t *out, size_t len);

#endif
