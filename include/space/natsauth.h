/* NATS users for the identities of the contract (contract.h, docs/trust.md): NKey
 * credentials and the nats-server `authorization` block generated from the contract's tables.
 *
 * Credentials of an identity, made by sp_natsauth_creds_create in a directory (mode 0700):
 *   <identity>.nk     the NKey seed ("SU..."), mode 0600: the NATS login secret
 *   <identity>.nkpub  the public NKey ("U..."): goes into nats.conf
 *   <identity>.key    the Ed25519 signing key (sign.h), mode 0600
 *   <identity>.pub    its public key: the keyring of every verifier
 * The two keys are separate on purpose: a NATS login signs a nonce the server chooses, and
 * a key that signed arbitrary server nonces must not also sign envelopes.
 *
 * nats-server keeps only public NKeys; no secret is in nats.conf. Every identity but the
 * operator connects with the inbox prefix sp_natsauth_inbox gives it and may subscribe only
 * below it, so no identity reads another's replies.
 */
#ifndef SPACE_NATSAUTH_H
#define SPACE_NATSAUTH_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "contract.h"

#define SP_NKEY_PUB_LEN  56 /* base32 of prefix byte + 32 bytes + CRC-16 */
#define SP_NKEY_SEED_LEN 58 /* base32 of 2 prefix bytes + 32 bytes + CRC-16 */
#define SP_INBOX_MAX     (7 + SP_IDENTITY_MAX)

/* The user NKey pair of a 32-byte Ed25519 seed, in the NKeys text forms. */
void sp_nkey_encode(const uint8_t seed[32], char pub[SP_NKEY_PUB_LEN + 1],
                    char seed_text[SP_NKEY_SEED_LEN + 1]);

/* Reads an NKey user seed file (the seed text on its first line), checks its prefix and
 * CRC, and writes the 32-byte Ed25519 seed (the caller wipes it). SP_ECONFIG when malformed,
 * -EPERM when the file is readable by group or others. */
int sp_nkey_seed_load(const char *seed_file, uint8_t seed[32]);

/* Makes the four credential files of identity in dir (which must exist). -EEXIST when the
 * identity already has credentials there (nothing is replaced), -EINVAL for a bad identity. */
int sp_natsauth_creds_create(const char *dir, const char *identity);
/* Reads <dir>/<identity>.nkpub. */
int sp_natsauth_nkey_public(const char *dir, const char *identity, char pub[SP_NKEY_PUB_LEN + 1]);

/* "_INBOX.<identity>": the inbox prefix of the identity's connections. */
void sp_natsauth_inbox(const char *identity, char out[SP_INBOX_MAX + 1]);

typedef struct {
    const char *identity; /* an identity name (contract.h) */
    const char *nkey;     /* its public NKey */
} sp_natsauth_user_t;

/* Appends `authorization { users = [ ... ] }` for the users, each with the permissions the
 * contract gives its kind (and instance): publish/subscribe allow lists, a deny list of
 * JetStream stream management for all but the operator, allow_responses for identities that
 * answer requests. -EINVAL for a bad identity or NKey (out is then unchanged). */
int sp_natsauth_write(sp_buf_t *out, const sp_natsauth_user_t *users, size_t n);

#endif
