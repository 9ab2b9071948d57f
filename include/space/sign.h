/* Ed25519 signing keys, a keyring of public keys, and signed envelopes (docs/trust.md).
 *
 * One signing key per identity (contract.h), made together with its NATS credentials
 * (natsauth.h). Files:
 *   <dir>/<identity>.key      private key, PKCS#8 PEM, mode 0600, never logged
 *   <dir>/<identity>.pub      public key, SubjectPublicKeyInfo PEM
 *   <dir>/<identity>.tenants  platforms only: the tenant ids it may act for, one per line
 * A keyring is the set of .pub (and .tenants) files of a directory, loaded once; it is
 * immutable afterwards and may be used from any thread.
 *
 * Signatures go through OpenSSL's EVP_DigestSign/EVP_DigestVerify with a NULL digest
 * (Ed25519 is one-shot, RFC 8032 PureEdDSA).
 */
#ifndef SPACE_SIGN_H
#define SPACE_SIGN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "envelope.h"

#define SP_SIG_LEN    64
#define SP_PUBKEY_LEN 32
/* What a signature adds to an encoded envelope: key (1 byte), length (1), 64 bytes. */
#define SP_SIG_FIELD_LEN (2 + SP_SIG_LEN)

typedef struct sp_sign_key sp_sign_key_t;
typedef struct sp_keyring sp_keyring_t;

/* Makes a new key pair: priv_path (0600, created exclusively: -EEXIST if it exists) and
 * pub_path (0644, replaced). Negative errno or SP_ECONFIG (OpenSSL failure). */
int sp_sign_keygen(const char *priv_path, const char *pub_path);
/* Loads a private key. -EPERM if the file is readable by group or others (it is a secret);
 * SP_ECONFIG if it is not an Ed25519 PEM key. Free with sp_sign_key_free (accepts NULL). */
int sp_sign_key_load(const char *priv_path, sp_sign_key_t **ret_key);
/* A key from 32 raw private bytes (tests and tools). */
int sp_sign_key_from_raw(const uint8_t priv[32], sp_sign_key_t **ret_key);
void sp_sign_key_free(sp_sign_key_t *key);
/* The raw public key. */
int sp_sign_key_public(const sp_sign_key_t *key, uint8_t out[SP_PUBKEY_LEN]);

/* Signs data (any length). Thread-safe for one key. */
int sp_sign(const sp_sign_key_t *key, const void *data, size_t len, uint8_t sig[SP_SIG_LEN]);
/* 0 when sig is pub's signature of data, SP_ESIGNATURE otherwise. */
int sp_verify_raw(const uint8_t pub[SP_PUBKEY_LEN], const void *data, size_t len,
                  const uint8_t sig[SP_SIG_LEN]);

/* ---- keyring ---- */
int sp_keyring_new(sp_keyring_t **ret_kr);
/* Reads every <identity>.pub of dir (files whose name is not an identity are skipped) and the
 * .tenants of platforms. SP_ECONFIG for a malformed key or tenants file. */
int sp_keyring_load(const char *dir, sp_keyring_t **ret_kr);
/* Adds (or replaces) an identity's public key; -EINVAL if identity is not an identity name. */
int sp_keyring_add(sp_keyring_t *kr, const char *identity, const uint8_t pub[SP_PUBKEY_LEN]);
/* Adds a tenant to a platform identity already in the keyring. */
int sp_keyring_add_tenant(sp_keyring_t *kr, const char *identity, const char *tenant);
/* Whether the identity is in the keyring. */
bool sp_keyring_has(const sp_keyring_t *kr, const char *identity);
/* Whether tenant is one of the identity's tenants. */
bool sp_keyring_has_tenant(const sp_keyring_t *kr, const char *identity, const char *tenant);
/* SP_ESIGNER if identity is not in the keyring, SP_ESIGNATURE if sig does not verify, else 0. */
int sp_keyring_verify(const sp_keyring_t *kr, const char *identity, const void *data, size_t len,
                      const uint8_t sig[SP_SIG_LEN]);
size_t sp_keyring_size(const sp_keyring_t *kr);
void sp_keyring_free(sp_keyring_t *kr);

/* ---- envelopes ---- */

/* Encodes env signed by signer: sets env->signer (borrowing signer), clears env->signature,
 * encodes as sp_envelope_encode does (same errors; SP_ETOOBIG also when the signature would
 * not fit under SP_ENVELOPE_MAX), signs those bytes and appends the signature field (11).
 * The result's canonical bytes (sp_envelope_canonical) are exactly what was signed. */
int sp_envelope_encode_signed(sp_envelope_t *env, const char *signer, const sp_sign_key_t *key,
                              uint8_t **ret_buf, size_t *ret_len);

#endif
