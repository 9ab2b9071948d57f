/* Data keys and sealed output (datakey.h, docs/audit.md); redaction is redact.c. */
#include "datakey.h"

#include <errno.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "xmalloc.h"

static size_t datakey_aad(const char *sandbox, uint8_t *out, size_t cap)
{
    int n = snprintf((char *)out, cap, "space-datakey:v1:%.64s", sandbox);
    return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}

/* A data key's id: the first bytes of its SHA-256, in hex (names it without revealing it). */
static void set_key_id(sp_cred_key_t *dk)
{
    uint8_t h[SP_SHA256_LEN];
    sp_sha256(dk->k, SP_CRED_KEY_LEN, h);
    for (int i = 0; i < SP_CRED_KEY_ID_LEN / 2; i++)
        snprintf(dk->id + 2 * i, 3, "%02x", h[i]);
    explicit_bzero(h, sizeof(h));
}

int sp_datakey_generate(sp_cred_key_t *ret_dk)
{
    if (RAND_bytes(ret_dk->k, SP_CRED_KEY_LEN) != 1)
        return -EIO;
    set_key_id(ret_dk);
    return 0;
}

int sp_datakey_wrap(const sp_cred_key_t *master, const char *sandbox, const sp_cred_key_t *dk,
                    uint8_t ret_nonce[SP_CRED_NONCE_LEN],
                    uint8_t ret_wrapped[SP_DATAKEY_WRAPPED_LEN])
{
    uint8_t aad[96];
    size_t al = datakey_aad(sandbox, aad, sizeof(aad));
    return sp_cred_seal(master, aad, al, dk->k, SP_CRED_KEY_LEN, ret_nonce, ret_wrapped);
}

int sp_datakey_unwrap(const sp_cred_key_t *master, const char *sandbox,
                      const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *wrapped, size_t len,
                      sp_cred_key_t *ret_dk)
{
    memset(ret_dk, 0, sizeof(*ret_dk));
    if (len != SP_DATAKEY_WRAPPED_LEN)
        return -EBADMSG;
    uint8_t aad[96];
    size_t al = datakey_aad(sandbox, aad, sizeof(aad));
    int rc = sp_cred_open(master, aad, al, nonce, wrapped, len, ret_dk->k);
    if (rc < 0) {
        explicit_bzero(ret_dk, sizeof(*ret_dk));
        return rc;
    }
    set_key_id(ret_dk);
    return 0;
}

static size_t output_aad(const char *sandbox, const char *cmd_id, uint32_t stream, uint64_t offset,
                         uint8_t *out)
{
    int n = snprintf((char *)out, SP_OUTPUT_AAD_MAX, "space-out:v1:%.64s:%.64s:%u:%llu", sandbox,
                     cmd_id, stream, (unsigned long long)offset);
    return n < 0 ? 0 : (size_t)n >= SP_OUTPUT_AAD_MAX ? SP_OUTPUT_AAD_MAX - 1 : (size_t)n;
}

int sp_output_seal(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                   uint32_t stream, uint64_t offset, const uint8_t *pt, size_t len,
                   uint8_t ret_nonce[SP_CRED_NONCE_LEN], uint8_t *ret_ct)
{
    uint8_t aad[SP_OUTPUT_AAD_MAX];
    size_t al = output_aad(sandbox, cmd_id, stream, offset, aad);
    return sp_cred_seal(dk, aad, al, pt, len, ret_nonce, ret_ct);
}

int sp_output_open(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                   uint32_t stream, uint64_t offset, const uint8_t nonce[SP_CRED_NONCE_LEN],
                   const uint8_t *ct, size_t ct_len, uint8_t *ret_pt)
{
    uint8_t aad[SP_OUTPUT_AAD_MAX];
    size_t al = output_aad(sandbox, cmd_id, stream, offset, aad);
    return sp_cred_open(dk, aad, al, nonce, ct, ct_len, ret_pt);
}
