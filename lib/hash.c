/* SHA-256 through OpenSSL's EVP interface, and the event log's hash chain. */
#include "hash.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <openssl/evp.h>

#include "text.h"

const uint8_t SP_CHAIN_GENESIS[SP_SHA256_LEN] = {0};

/* OpenSSL 3 resolves EVP_sha256() through a provider lookup on every init; fetching the
 * implementation once keeps that lookup off the event log's per-event path. */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

/* Hashing can fail only when OpenSSL cannot allocate or has no SHA-256 provider; both leave the
 * process unable to keep the audit chain, so it stops like on out of memory. */
static _Noreturn void die(const char *what)
{
    fprintf(stderr, "space: %s: SHA-256 is not available from OpenSSL\n", what);
    abort();
}

static void sha256_parts(const void *a, size_t alen, const void *b, size_t blen,
                         uint8_t out[SP_SHA256_LEN])
{
    unsigned int outlen = 0;
    int ok;

    pthread_once(&sha256_once, sha256_fetch);
    if (!sha256_md)
        die("EVP_MD_fetch");
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        die("EVP_MD_CTX_new");
    ok = EVP_DigestInit_ex(ctx, sha256_md, NULL) && EVP_DigestUpdate(ctx, a, alen) &&
         EVP_DigestUpdate(ctx, b, blen) && EVP_DigestFinal_ex(ctx, out, &outlen);
    EVP_MD_CTX_free(ctx);
    if (!ok || outlen != SP_SHA256_LEN)
        die("EVP_Digest");
}

void sp_sha256(const void *data, size_t len, uint8_t out[SP_SHA256_LEN])
{
    sha256_parts(data, len, NULL, 0, out);
}

void sp_chain_next(const uint8_t prev[SP_SHA256_LEN], const void *data, size_t len,
                   uint8_t out[SP_SHA256_LEN])
{
    sha256_parts(prev, SP_SHA256_LEN, data, len, out);
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)(v & 0xff);
}

void sp_chain2_next(const uint8_t prev[SP_SHA256_LEN], const sp_chain_row_t *row,
                    uint8_t out[SP_SHA256_LEN])
{
    static const char domain[] = "SPACE-C chain v2";
    uint8_t seq[8], slen[4], size[8], flags[2], rlen[4];
    unsigned int outlen = 0;

    pthread_once(&sha256_once, sha256_fetch);
    if (!sha256_md)
        die("EVP_MD_fetch");
    put_be(seq, row->seq, 8);
    put_be(slen, row->subject_len, 4);
    put_be(size, row->payload_size, 8);
    flags[0] = row->accepted ? 1 : 0;
    flags[1] = row->reason ? 1 : 0;
    put_be(rlen, row->reason ? row->reason_len : 0, 4);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        die("EVP_MD_CTX_new");
    int ok =
        EVP_DigestInit_ex(ctx, sha256_md, NULL) && EVP_DigestUpdate(ctx, domain, sizeof(domain)) &&
        EVP_DigestUpdate(ctx, prev, SP_SHA256_LEN) && EVP_DigestUpdate(ctx, seq, 8) &&
        EVP_DigestUpdate(ctx, slen, 4) && EVP_DigestUpdate(ctx, row->subject, row->subject_len) &&
        EVP_DigestUpdate(ctx, size, 8) &&
        EVP_DigestUpdate(ctx, row->payload_sha256, SP_SHA256_LEN) &&
        EVP_DigestUpdate(ctx, flags, 2) && EVP_DigestUpdate(ctx, rlen, 4) &&
        (!row->reason || EVP_DigestUpdate(ctx, row->reason, row->reason_len)) &&
        EVP_DigestFinal_ex(ctx, out, &outlen);
    EVP_MD_CTX_free(ctx);
    if (!ok || outlen != SP_SHA256_LEN)
        die("EVP_Digest");
}

void sp_hex_encode(const uint8_t *in, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 0x0f];
    }
    out[2 * len] = '\0';
}

int sp_hex_decode(const char *in, uint8_t *out, size_t len)
{
    /* Validate everything first so out is written only on success. */
    for (size_t i = 0; i < 2 * len; i++)
        if (sp_hex_digit(in[i]) < 0)
            return -EINVAL;
    if (in[2 * len] != '\0')
        return -EINVAL;
    for (size_t i = 0; i < len; i++)
        out[i] = (uint8_t)((unsigned)sp_hex_digit(in[2 * i]) << 4 |
                           (unsigned)sp_hex_digit(in[2 * i + 1]));
    return 0;
}

struct sp_sha256_ctx {
    EVP_MD_CTX *ctx;
};

sp_sha256_ctx_t *sp_sha256_new(void)
{
    pthread_once(&sha256_once, sha256_fetch);
    if (!sha256_md)
        die("EVP_MD_fetch");
    sp_sha256_ctx_t *c = malloc(sizeof(*c));
    if (!c || !(c->ctx = EVP_MD_CTX_new()) || EVP_DigestInit_ex(c->ctx, sha256_md, NULL) != 1)
        die("EVP_DigestInit_ex");
    return c;
}

void sp_sha256_update(sp_sha256_ctx_t *c, const void *data, size_t len)
{
    if (len && EVP_DigestUpdate(c->ctx, data, len) != 1)
        die("EVP_DigestUpdate");
}

void sp_sha256_final(sp_sha256_ctx_t *c, uint8_t out[SP_SHA256_LEN])
{
    unsigned int outlen = 0;
    if (EVP_DigestFinal_ex(c->ctx, out, &outlen) != 1 || outlen != SP_SHA256_LEN)
        die("EVP_DigestFinal_ex");
    EVP_MD_CTX_free(c->ctx);
    free(c);
}
