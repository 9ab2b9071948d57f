/* Ed25519 signing keys, a keyring of public keys, and signed envelopes (docs/trust.md).
 *
 * One signing key per identity (contract.h), made together with its NATS credentials
 * (natsauth.h). Files:
 *   <dir>/<identity>.key      private key, PKCS#8 PEM, mode 0600, never logged
 *   <dir>/<identity>.pub      public key, SubjectPublicKeyInfo PEM
 *   <dir>/<identity>.tenants  platforms only: the tenant ids it may act for, one per line
 *   <dir>/<identity>@<until>.pub  a retired public key (`space identity rotate`): its
 *                             signatures count for messages published before <until> (unix
 *                             seconds), so that a daemon still signing with it keeps working
 *                             until it restarts and the log written with it keeps verifying
 * A keyring is the set of .pub (and .tenants) files of a directory, loaded once; it is
 * immutable afterwards and may be used from any thread. A consumer that runs for long reads
 * the directory again when sp_keyring_stale says it changed: a platform's tenants (`space
 * platform add` rewrites the file by rename), a key rotated, an identity added.
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
/* Whether it has a retired key that still counts now. */
bool sp_keyring_has_retired(const sp_keyring_t *kr, const char *identity);
/* Whether tenant is one of the identity's tenants. */
bool sp_keyring_has_tenant(const sp_keyring_t *kr, const char *identity, const char *tenant);
/* Adds a retired key to identity (made if absent, then with no current key): signatures by it
 * count for messages published before until_ns (ns since the epoch). At most
 * SP_KEYRING_RETIRED_MAX per identity (SP_ETOOBIG): they are kept for good, since the log
 * written under them is verified with them (space-replay verify). */
#define SP_KEYRING_RETIRED_MAX 256
int sp_keyring_add_retired(sp_keyring_t *kr, const char *identity, const uint8_t pub[SP_PUBKEY_LEN],
                           int64_t until_ns);
/* SP_ESIGNER if identity is not in the keyring, SP_ESIGNATURE if sig does not verify by its
 * current key nor by a retired one still valid now, else 0. */
int sp_keyring_verify(const sp_keyring_t *kr, const char *identity, const void *data, size_t len,
                      const uint8_t sig[SP_SIG_LEN]);
/* The same for data signed at at_ns (0: now): the retired keys that count are those whose
 * until is after it. */
int sp_keyring_verify_at(const sp_keyring_t *kr, const char *identity, const void *data, size_t len,
                         const uint8_t sig[SP_SIG_LEN], int64_t at_ns);
size_t sp_keyring_size(const sp_keyring_t *kr);
/* Whether the directory kr was loaded from changed since: a file made, renamed or removed in
 * it (a key rotated, an identity or a platform added; the tools replace files by rename), or a
 * platform's <identity>.tenants that is not the file it read (another inode, size or
 * modification time). One stat, and one per platform identity; false for a keyring not made
 * by sp_keyring_load. */
bool sp_keyring_stale(const sp_keyring_t *kr);
void sp_keyring_free(sp_keyring_t *kr);

/* ---- batch signatures (docs/trust.md, "Batch signatures") ----
 *
 * A producer signs one Merkle root over a batch of envelopes; each member carries everything
 * needed to verify it alone (a consumer may see only some members):
 *   leaf_i  = SHA-256(0x00 || canonical bytes of member i)            (RFC 6962 2.1)
 *   node    = SHA-256(0x01 || left || right)
 *   root    = RFC 6962 Merkle Tree Hash of leaf_0..leaf_{n-1}; a batch of one: root = leaf_0
 *   signed  = Ed25519 over "SPACE-C sig v1\0" || n (uint32 big-endian) || root  (51 bytes)
 *   member i: signature (11) = that signature, sig_proof (12) = its inclusion path (RFC 9162
 *             2.1.3.1, sibling hashes leaf level first), sig_index (13) = i, sig_count (14) = n;
 *             12-14 are absent when n = 1, so a batch of one is a plain per-envelope signature.
 * The domain string keeps an envelope key's signatures from meaning anything else. */

#define SP_SIG_BATCH_MAX 4096
/* How many envelopes a producer that bursts signs under one root (docs/trust.md, "Cost in the
 * event log"). 64, not more: a member's proof grows by 32 bytes per doubling, and on the
 * measured VM those bytes (moved by JetStream, the COPY and the hash chain) cost the event log
 * more than the Ed25519 share they save (one verification per 64 members: ~2.8 us each, on
 * the verifier pool); smaller batches make that share the larger cost. */
#define SP_SIG_BATCH_DEFAULT 64
#define SP_SIG_PROOF_MAX     (12 * 32) /* ceil(log2(SP_SIG_BATCH_MAX)) hashes */
#define SP_SIG_HASH_LEN      32
#define SP_SIG_MSG_LEN       (15 + 4 + SP_SIG_HASH_LEN)
/* Most that signing adds to an encoded envelope: fields 11-14 with their keys and lengths. */
#define SP_SIG_TRAILER_MAX (SP_SIG_FIELD_LEN + 3 + SP_SIG_PROOF_MAX + 2 * (1 + 5))

/* leaf = SHA-256(0x00 || canonical). */
void sp_sig_leaf(const uint8_t *canonical, size_t len, uint8_t leaf[SP_SIG_HASH_LEN]);
/* The root that leaf at index of a count-member batch leads to through proof (plen bytes).
 * SP_ESIGNATURE when the proof does not have exactly the length and shape of an inclusion path
 * for (index, count), or when count is 0, above SP_SIG_BATCH_MAX or not above index. */
int sp_sig_proof_root(const uint8_t leaf[SP_SIG_HASH_LEN], uint32_t index, uint32_t count,
                      const uint8_t *proof, size_t plen, uint8_t root[SP_SIG_HASH_LEN]);
/* The bytes Ed25519 signs for a batch of count members with this root. */
void sp_sig_message(uint32_t count, const uint8_t root[SP_SIG_HASH_LEN],
                    uint8_t msg[SP_SIG_MSG_LEN]);

/* A cache of batch signatures already verified, so that the members of one batch cost one
 * Ed25519 verification between them. An entry is (signer's public key, count, root,
 * signature): a member with the same root but another signature is verified again. Only
 * successes are cached (a signature that fails evicts nothing); a fixed number of slots, a
 * newer entry replaces an older one in its slot. Thread-safe (one mutex; a lookup is a hash
 * and a compare). A thread that looks up an entry another thread is verifying right now
 * waits for that verification (~180 us) instead of repeating it, so members of one batch
 * verified on several threads at once still cost one Ed25519 between them. */
typedef struct sp_sigcache sp_sigcache_t;
/* slots: 1..65536. */
int sp_sigcache_new(size_t slots, sp_sigcache_t **ret_cache);
void sp_sigcache_free(sp_sigcache_t *c);
/* Hits and Ed25519 verifications (misses) so far. */
void sp_sigcache_stats(const sp_sigcache_t *c, uint64_t *ret_hits, uint64_t *ret_verified);

/* ---- envelopes ---- */

/* Encodes env signed by signer, as a batch of one: sets env->signer (borrowing signer), clears
 * the signature fields, encodes as sp_envelope_encode does (same errors; SP_ETOOBIG also when
 * the signature would not fit under SP_ENVELOPE_MAX), signs and appends the signature field
 * (11). The result's canonical bytes (sp_envelope_canonical) are exactly the bytes before it. */
int sp_envelope_encode_signed(sp_envelope_t *env, const char *signer, const sp_sign_key_t *key,
                              uint8_t **ret_buf, size_t *ret_len);

/* Encodes n (1..SP_SIG_BATCH_MAX) envelopes signed by signer with one signature over their
 * Merkle root: for each, what sp_envelope_encode_signed does (env->signer set, signature fields
 * cleared), then appends fields 11-14. ret_bufs[i] (heap, caller frees each) and ret_lens[i]
 * are written only on success; on failure nothing is allocated. -EINVAL for n out of range;
 * an envelope that does not encode fails the whole batch (SP_ESCHEMA, SP_ETOOBIG). */
int sp_envelope_encode_signed_batch(sp_envelope_t *const *envs, size_t n, const char *signer,
                                    const sp_sign_key_t *key, uint8_t **ret_bufs, size_t *ret_lens);

/* ---- headed batches (docs/trust.md, "Headed batches") ----
 *
 * For subjects only the event log reads (contract.h, sp_subject_log_only): the log sees every
 * member, in stream order, so a member need not carry its proof. The first member (the head)
 * carries the list of all n leaves (field 15, its own first) and the signature
 *   signed = Ed25519 over "SPACE-C lst v1\0" || n (uint32 big-endian) || SHA-256(leaves)
 * (another domain string than a Merkle root's, so neither signature means the other); member
 * i > 0 carries no signature, only sig_index (13) = i, sig_count (14) = n and sig_head (16) =
 * the head's event_id: ~45 bytes instead of a Merkle member's 66 + 32 x log2 n. A member
 * verifies against its head as the log stored it (sighead.h); the producer publishes the head
 * and waits for the stream's ack before the members (publish.h), so a head always precedes
 * its members. Anyone else (a consumer without the log) refuses a member: SP_EHEADED. */
#define SP_SIG_HEADED_DEFAULT 256 /* members per head: the head grows by 32 bytes per member */

/* The bytes Ed25519 signs for a head listing count leaves (count x 32 bytes). */
void sp_sig_list_message(const uint8_t *leaves, uint32_t count, uint8_t msg[SP_SIG_MSG_LEN]);
/* leaf = SHA-256(0x00 || canonical bytes of raw). SP_EDECODE when raw is not protobuf,
 * SP_ETOOBIG over SP_ENVELOPE_MAX. */
int sp_envelope_leaf(const uint8_t *raw, size_t len, uint8_t leaf[SP_SIG_HASH_LEN]);
/* Encodes n (2..SP_SIG_BATCH_MAX) envelopes as one headed batch by signer: envs[0] (stamped:
 * its event_id names the head) becomes the head. Same contract as
 * sp_envelope_encode_signed_batch; SP_ETOOBIG also when the head with its list, or a member
 * with its trailer, would not fit under SP_ENVELOPE_MAX (then sign as a Merkle batch). */
int sp_envelope_encode_signed_headed(sp_envelope_t *const *envs, size_t n, const char *signer,
                                     const sp_sign_key_t *key, uint8_t **ret_bufs,
                                     size_t *ret_lens);
/* The event_id a headed member names as its head (sig_head), as text; "" when it names none. */
void sp_sig_head_id(const sp_envelope_t *env, char out[37]);
/* Whether member env, whose leaf is leaf (sp_envelope_leaf of its bytes), belongs to the
 * batch of head, a head that verified (sp_envelope_verify): it names head, has head's signer
 * and count, and its leaf is the list's entry at its index (> 0). 0 or SP_ESIGNATURE. */
int sp_sig_member_check(const sp_envelope_t *head, const sp_envelope_t *env,
                        const uint8_t leaf[SP_SIG_HASH_LEN]);

/* Verifies the signature of env, decoded (and schema-valid) from raw: canonical bytes -> leaf
 * -> root through the proof -> Ed25519 over the root with the signer's key from kr, looked up
 * in and added to cache (NULL: no cache). The signer's keys that count are its current one
 * and its retired ones whose time runs past at_ns, the time the message was published (the
 * stream's timestamp, which no publisher sets; 0: now). A headed batch's head verifies its
 * list's signature and that its own leaf is the list's first. 0 when it verifies; SP_EUNSIGNED
 * (no signer or no signature), SP_ESIGNER (signer not in kr), SP_EHEADED (a headed member of a
 * known signer: only sp_sig_member_check against its head can say), SP_ESIGNATURE, SP_EDECODE
 * (raw is not protobuf), SP_ETOOBIG (raw over SP_ENVELOPE_MAX). Thread-safe. */
int sp_envelope_verify(const sp_keyring_t *kr, sp_sigcache_t *cache, const sp_envelope_t *env,
                       const uint8_t *raw, size_t len, int64_t at_ns);

#endif
