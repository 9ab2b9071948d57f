/* Signed checkpoints of the event log (docs/audit.md): what the log's head was, said by the
 * eventlog with its own identity key, kept outside PostgreSQL (the JetStream stream
 * SP_CKPT_STREAM and, optionally, a file a witness copies), so that a database superuser who
 * truncates, deletes or rewrites rows and recomputes the hash chain cannot make the log agree
 * with them again.
 *
 * One checkpoint is one line of text, the same bytes in the stream and in the file:
 *
 *   space-ckpt v1 signer=eventlog seq=1234 rows=1234 head=<64 hex> at=2026-01-02T03:04:05.123456Z
 *     verify_from=17 sig=<128 hex>\n                                          (one line)
 *
 *   seq          the last stream_seq the log had stored (committed) when it was made
 *   rows         the number of rows of events with stream_seq <= seq
 *   head         the hash column of the row at seq (the chain's head)
 *   at           when it was made (the eventlog's clock)
 *   verify_from  the first stream_seq this eventlog process stored with signature
 *                verification on (so every row accepted in verify_from..seq passed it); 0
 *                when it does not verify
 *   sig          Ed25519 of the signer over "SPACE-C ckpt v1\0" || the line's bytes before
 *                " sig=" (the domain string keeps the eventlog's key from meaning anything
 *                else: envelopes sign "SPACE-C sig v1\0", requests "SPACE-C req v1\0")
 *
 * Fields come in that order, each once, decimal without leading zeros, lower-case hex; the
 * parser accepts nothing else. Nothing here allocates; thread-safe. */
#ifndef SPACE_CHECKPOINT_H
#define SPACE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "contract.h"
#include "hash.h"
#include "sign.h"

#define SP_CKPT_STREAM   "SPACE_CHECKPOINTS"
#define SP_CKPT_SUBJECTS "space.ckpt.>"
#define SP_CKPT_SUBJECT  "space.ckpt.log"
#define SP_CKPT_LINE_MAX 512
/* Where `space up` has the event log write its checkpoint file, under SPACE_HOME. */
#define SP_CKPT_FILE_DEFAULT "audit/checkpoints.log"

typedef struct {
    char signer[SP_IDENTITY_MAX + 1];
    uint64_t seq;
    uint64_t rows;
    uint8_t head[SP_SHA256_LEN];
    int64_t at_us;
    uint64_t verify_from;
} sp_ckpt_t;

/* The line of c (signer included), signed with key, newline-terminated, into out. Returns its
 * length, or -EINVAL when c->signer is not an eventlog identity or signing fails. */
int sp_ckpt_format(const sp_ckpt_t *c, const sp_sign_key_t *key, char out[SP_CKPT_LINE_MAX]);

/* Parses a line (len bytes; one trailing newline allowed) and verifies its signature with the
 * signer's key from kr. 0; SP_EDECODE when it is not a checkpoint line as above, SP_ENOTALLOWED
 * when the signer is no eventlog identity, SP_ESIGNER when kr does not know it, SP_ESIGNATURE.
 * *ret is written when the line parses, whatever the signature says. */
int sp_ckpt_verify(const sp_keyring_t *kr, const char *line, size_t len, sp_ckpt_t *ret);

#endif
