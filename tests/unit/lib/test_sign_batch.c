/* Batch signatures (sign.h): one Ed25519 signature over an RFC 6962 Merkle root, each member
 * verifying alone through its proof; what a forger can do with members, proofs and counts. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "envelope.h"
#include "error.h"
#include "hash.h"
#include "sign.h"
#include "xmalloc.h"

#define N_MAX 300

typedef struct {
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxCreateRequested create;
    char id[37], sbx[32];
} member_t;

typedef struct {
    member_t *m;
    sp_envelope_t **envs;
    uint8_t **bufs;
    size_t *lens;
    size_t n;
} batch_t;

static sp_sign_key_t *key, *other_key;
static sp_keyring_t *ring;

static int setup(void **state)
{
    uint8_t seed[32] = {1}, seed2[32] = {2}, pub[SP_PUBKEY_LEN];
    if (sp_sign_key_from_raw(seed, &key) < 0 || sp_sign_key_from_raw(seed2, &other_key) < 0 ||
        sp_sign_key_public(key, pub) < 0 || sp_keyring_new(&ring) < 0 ||
        sp_keyring_add(ring, "worker-w1", pub) < 0 || sp_sign_key_public(other_key, pub) < 0 ||
        sp_keyring_add(ring, "gateway", pub) < 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    sp_sign_key_free(key);
    sp_sign_key_free(other_key);
    sp_keyring_free(ring);
    return 0;
}

static void batch_make(batch_t *b, size_t n, const char *tag, const sp_sign_key_t *k)
{
    b->n = n;
    b->m = sp_xcalloc(n, sizeof(*b->m));
    b->envs = sp_xcalloc(n, sizeof(sp_envelope_t *));
    b->bufs = sp_xcalloc(n, sizeof(*b->bufs));
    b->lens = sp_xcalloc(n, sizeof(*b->lens));
    for (size_t i = 0; i < n; i++) {
        member_t *m = &b->m[i];
        space__v1__envelope__init(&m->env);
        space__v1__aggregate__init(&m->agg);
        space__v1__sandbox_create_requested__init(&m->create);
        snprintf(m->sbx, sizeof(m->sbx), "sbx_%s%04zu", tag, i);
        m->agg.kind = "sandbox";
        m->agg.id = m->sbx;
        m->create.template_ = "base";
        m->env.aggregate = &m->agg;
        m->env.tenant = "acme";
        m->env.actor = "key_123";
        m->env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED;
        m->env.sandbox_create_requested = &m->create;
        sp_envelope_stamp(&m->env, m->id);
        b->envs[i] = &m->env;
    }
    assert_int_equal(sp_envelope_encode_signed_batch(b->envs, n, "worker-w1", k, b->bufs, b->lens),
                     0);
}

static void batch_free(batch_t *b)
{
    for (size_t i = 0; i < b->n; i++)
        free(b->bufs[i]);
    free(b->m);
    free(b->envs);
    free(b->bufs);
    free(b->lens);
}

/* Decodes raw and verifies it: the envelope's verdict, or the decoder's. */
static int verify(const uint8_t *raw, size_t len, sp_sigcache_t *cache)
{
    char reason[SP_REASON_MAX];
    sp_envelope_t *e = NULL;
    int rc = sp_envelope_decode(raw, len, &e, reason);
    if (rc < 0)
        return rc;
    rc = sp_envelope_verify(ring, cache, e, raw, len, 0);
    sp_envelope_free(e);
    return rc;
}

/* RFC 6962 2.1's Merkle Tree Hash, recursively, as the reference for the iterative tree. */
static void mth(const uint8_t (*leaf)[32], size_t n, uint8_t out[32])
{
    if (n == 1) {
        memcpy(out, leaf[0], 32);
        return;
    }
    size_t k = 1;
    while (k * 2 < n)
        k *= 2;
    uint8_t b[65];
    b[0] = 0x01;
    mth(leaf, k, b + 1);
    mth(leaf + k, n - k, b + 33);
    sp_sha256(b, sizeof(b), out);
}

/* A member's canonical bytes with signature fields of the caller's choosing appended. */
static uint8_t *rebuild(const uint8_t *raw, size_t len, const uint8_t *sig, const uint8_t *proof,
                        size_t plen, uint64_t index, uint64_t count, size_t *ret_len)
{
    uint8_t *out = sp_xmalloc(len + 128 + plen), *p;
    size_t clen;
    assert_int_equal(sp_envelope_canonical(raw, len, out, &clen), 0);
    p = out + clen;
    *p++ = (11 << 3) | 2;
    *p++ = SP_SIG_LEN;
    memcpy(p, sig, SP_SIG_LEN);
    p += SP_SIG_LEN;
    if (plen) {
        *p++ = (12 << 3) | 2;
        uint64_t v = plen;
        while (v >= 0x80) {
            *p++ = (uint8_t)(v | 0x80);
            v >>= 7;
        }
        *p++ = (uint8_t)v;
        memcpy(p, proof, plen);
        p += plen;
    }
    uint64_t fields[2][2] = {{13, index}, {14, count}};
    for (int f = 0; f < 2; f++) {
        uint64_t v = fields[f][1];
        *p++ = (uint8_t)(fields[f][0] << 3);
        while (v >= 0x80) {
            *p++ = (uint8_t)(v | 0x80);
            v >>= 7;
        }
        *p++ = (uint8_t)v;
    }
    *ret_len = (size_t)(p - out);
    return out;
}

static sp_envelope_t *decode(const uint8_t *raw, size_t len)
{
    char reason[SP_REASON_MAX];
    sp_envelope_t *e = NULL;
    assert_int_equal(sp_envelope_decode(raw, len, &e, reason), 0);
    return e;
}

/* Every member verifies alone; the cache makes the batch one Ed25519 verification; the root
 * every proof leads to is RFC 6962's. */
static void check_size(size_t n)
{
    uint8_t(*leaves)[32] = sp_xcalloc(n, 32);
    uint8_t want[32], root[32];
    sp_sigcache_t *cache = NULL;
    uint64_t hits, verified;
    batch_t b;

    batch_make(&b, n, "s", key);
    for (size_t i = 0; i < n; i++) {
        uint8_t *canon = sp_xmalloc(b.lens[i]);
        size_t clen;
        assert_int_equal(sp_envelope_canonical(b.bufs[i], b.lens[i], canon, &clen), 0);
        sp_sig_leaf(canon, clen, leaves[i]);
        free(canon);
        assert_int_equal(verify(b.bufs[i], b.lens[i], NULL), 0);
    }
    mth((const uint8_t(*)[32])leaves, n, want);
    for (size_t i = 0; i < n; i++) {
        sp_envelope_t *e = decode(b.bufs[i], b.lens[i]);
        assert_int_equal(e->sig_index, i);
        assert_int_equal(e->sig_count, n == 1 ? 0 : n);
        assert_int_equal(sp_sig_proof_root(leaves[i], e->sig_index, n, e->sig_proof.data,
                                           e->sig_proof.len, root),
                         0);
        assert_memory_equal(root, want, 32);
        sp_envelope_free(e);
    }
    assert_int_equal(sp_sigcache_new(64, &cache), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(verify(b.bufs[i], b.lens[i], cache), 0);
    sp_sigcache_stats(cache, &hits, &verified);
    assert_int_equal(verified, 1);
    assert_int_equal(hits, n - 1);
    sp_sigcache_free(cache);
    batch_free(&b);
    free(leaves);
}

static void test_sizes(void **state)
{
    static const size_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 17, 255, 256, 257, 300};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        check_size(sizes[i]);
}

/* A batch of one is a plain signature: no proof, index or count on the wire. */
static void test_batch_of_one_is_plain(void **state)
{
    batch_t b;
    uint8_t *buf = NULL;
    size_t len;

    batch_make(&b, 1, "one", key);
    assert_int_equal(sp_envelope_encode_signed(b.envs[0], "worker-w1", key, &buf, &len), 0);
    assert_int_equal(len, b.lens[0]);
    /* Ed25519 is deterministic (RFC 8032): the same bytes either way. */
    assert_memory_equal(buf, b.bufs[0], len);
    sp_envelope_t *e = decode(buf, len);
    assert_int_equal(e->sig_proof.len, 0);
    assert_int_equal(e->sig_count, 0);
    sp_envelope_free(e);
    assert_int_equal(verify(buf, len, NULL), 0);
    free(buf);
    batch_free(&b);
}

/* Flipping any byte of any member's canonical part fails that member (and only that one). */
static void test_tamper_member(void **state)
{
    batch_t b;
    batch_make(&b, 3, "t", key);
    for (size_t i = 0; i < b.n; i++) {
        uint8_t *canon = sp_xmalloc(b.lens[i]);
        size_t clen;
        assert_int_equal(sp_envelope_canonical(b.bufs[i], b.lens[i], canon, &clen), 0);
        free(canon);
        for (size_t off = 0; off < clen; off++) {
            uint8_t *t = sp_xmalloc(b.lens[i]);
            memcpy(t, b.bufs[i], b.lens[i]);
            t[off] ^= 0x01;
            assert_int_not_equal(verify(t, b.lens[i], NULL), 0);
            free(t);
        }
        for (size_t j = 0; j < b.n; j++)
            assert_int_equal(verify(b.bufs[j], b.lens[j], NULL), 0);
    }
    batch_free(&b);
}

/* Member 0 with member 1's proof, member 0 claiming index 1 (reordering), member 0 with the
 * proof, index and count of another batch (another root), with either batch's signature. */
static void test_swapped_and_foreign_proofs(void **state)
{
    batch_t a, b;
    size_t len;
    uint8_t *t;

    batch_make(&a, 4, "a", key);
    batch_make(&b, 4, "b", key);
    sp_envelope_t *a0 = decode(a.bufs[0], a.lens[0]), *a1 = decode(a.bufs[1], a.lens[1]);
    sp_envelope_t *b0 = decode(b.bufs[0], b.lens[0]);

    t = rebuild(a.bufs[0], a.lens[0], a0->signature.data, a1->sig_proof.data, a1->sig_proof.len, 1,
                4, &len);
    assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
    free(t);
    t = rebuild(a.bufs[0], a.lens[0], a0->signature.data, a1->sig_proof.data, a1->sig_proof.len, 0,
                4, &len);
    assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
    free(t);
    t = rebuild(a.bufs[0], a.lens[0], a0->signature.data, a0->sig_proof.data, a0->sig_proof.len, 1,
                4, &len);
    assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
    free(t);
    /* The same index within a different count: another signed message. */
    t = rebuild(a.bufs[0], a.lens[0], a0->signature.data, a0->sig_proof.data, a0->sig_proof.len, 0,
                3, &len);
    assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
    free(t);
    t = rebuild(a.bufs[0], a.lens[0], b0->signature.data, b0->sig_proof.data, b0->sig_proof.len, 0,
                4, &len);
    assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
    free(t);
    t = rebuild(a.bufs[0], a.lens[0], a0->signature.data, b0->sig_proof.data, b0->sig_proof.len, 0,
                4, &len);
    assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
    free(t);
    /* The untouched member still verifies after all that. */
    t = rebuild(a.bufs[0], a.lens[0], a0->signature.data, a0->sig_proof.data, a0->sig_proof.len, 0,
                4, &len);
    assert_int_equal(verify(t, len, NULL), 0);
    free(t);
    sp_envelope_free(a0);
    sp_envelope_free(a1);
    sp_envelope_free(b0);
    batch_free(&a);
    batch_free(&b);
}

/* A proof one hash short, one hash long, or not a whole number of hashes; an empty proof in a
 * batch of several. */
static void test_truncated_proofs(void **state)
{
    batch_t a;
    size_t len;
    uint8_t *t, longer[SP_SIG_PROOF_MAX];

    batch_make(&a, 5, "tr", key);
    for (size_t i = 0; i < a.n; i++) {
        sp_envelope_t *e = decode(a.bufs[i], a.lens[i]);
        const uint8_t *p = e->sig_proof.data;
        size_t pl = e->sig_proof.len;
        assert_true(pl >= 32);
        t = rebuild(a.bufs[i], a.lens[i], e->signature.data, p, pl - 32, i, 5, &len);
        assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
        free(t);
        memcpy(longer, p, pl);
        memcpy(longer + pl, p, 32);
        t = rebuild(a.bufs[i], a.lens[i], e->signature.data, longer, pl + 32, i, 5, &len);
        assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
        free(t);
        t = rebuild(a.bufs[i], a.lens[i], e->signature.data, p, pl - 1, i, 5, &len);
        assert_int_equal(verify(t, len, NULL), SP_ESCHEMA);
        free(t);
        t = rebuild(a.bufs[i], a.lens[i], e->signature.data, NULL, 0, i, 5, &len);
        assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
        free(t);
        sp_envelope_free(e);
    }
    batch_free(&a);
}

/* Hostile sizes are refused by the decoder before any hashing, and by the proof walk itself. */
static void test_bounds(void **state)
{
    batch_t a;
    size_t len;
    uint8_t *t, *big = sp_xcalloc(1, SP_SIG_PROOF_MAX + 32), leaf[32] = {0}, root[32];

    batch_make(&a, 2, "bd", key);
    sp_envelope_t *e = decode(a.bufs[0], a.lens[0]);
    t = rebuild(a.bufs[0], a.lens[0], e->signature.data, e->sig_proof.data, e->sig_proof.len, 0,
                (uint64_t)1 << 31, &len);
    assert_int_equal(verify(t, len, NULL), SP_ESCHEMA);
    free(t);
    t = rebuild(a.bufs[0], a.lens[0], e->signature.data, big, SP_SIG_PROOF_MAX + 32, 0,
                SP_SIG_BATCH_MAX, &len);
    assert_int_equal(verify(t, len, NULL), SP_ESCHEMA);
    free(t);
    t = rebuild(a.bufs[0], a.lens[0], e->signature.data, e->sig_proof.data, e->sig_proof.len, 7, 2,
                &len);
    assert_int_equal(verify(t, len, NULL), SP_ESCHEMA);
    free(t);
    /* The largest batch's full proof is within the limit, one more level is not. */
    assert_int_equal(sp_sig_proof_root(leaf, 0, SP_SIG_BATCH_MAX, big, SP_SIG_PROOF_MAX, root), 0);
    assert_int_equal(sp_sig_proof_root(leaf, 0, SP_SIG_BATCH_MAX + 1, big, SP_SIG_PROOF_MAX, root),
                     SP_ESIGNATURE);
    assert_int_equal(sp_sig_proof_root(leaf, 0, 0, NULL, 0, root), SP_ESIGNATURE);
    assert_int_equal(sp_sig_proof_root(leaf, 3, 3, NULL, 0, root), SP_ESIGNATURE);
    assert_int_equal(sp_sig_proof_root(leaf, 0, 1, big, 32, root), SP_ESIGNATURE);
    assert_int_equal(sp_envelope_encode_signed_batch(a.envs, 0, "worker-w1", key, a.bufs, a.lens),
                     -EINVAL);
    assert_int_equal(sp_envelope_encode_signed_batch(a.envs, SP_SIG_BATCH_MAX + 1, "worker-w1", key,
                                                     a.bufs, a.lens),
                     -EINVAL);
    sp_envelope_free(e);
    free(big);
    batch_free(&a);
}

/* The cache holds (key, root, signature): a member with a cached root but a forged signature,
 * or signed by another identity's key, is still refused; unsigned and unknown are named. */
static void test_cache_and_identity(void **state)
{
    sp_sigcache_t *cache = NULL;
    uint8_t bad[SP_SIG_LEN];
    batch_t a, forged;
    size_t len;
    uint8_t *t;

    assert_int_equal(sp_sigcache_new(16, &cache), 0);
    batch_make(&a, 3, "c", key);
    assert_int_equal(verify(a.bufs[0], a.lens[0], cache), 0);
    sp_envelope_t *e = decode(a.bufs[1], a.lens[1]);
    memcpy(bad, e->signature.data, SP_SIG_LEN);
    bad[5] ^= 1;
    t = rebuild(a.bufs[1], a.lens[1], bad, e->sig_proof.data, e->sig_proof.len, 1, 3, &len);
    assert_int_equal(verify(t, len, cache), SP_ESIGNATURE);
    free(t);
    sp_envelope_free(e);
    assert_int_equal(verify(a.bufs[1], a.lens[1], cache), 0);

    /* Signed as worker-w1 with the gateway's key. */
    batch_make(&forged, 2, "f", other_key);
    assert_int_equal(verify(forged.bufs[0], forged.lens[0], cache), SP_ESIGNATURE);
    batch_free(&forged);

    /* Unsigned; an unknown signer. */
    uint8_t *plain = NULL;
    size_t plen;
    a.envs[0]->signer = "";
    a.envs[0]->signature.len = 0;
    a.envs[0]->sig_proof.len = 0;
    a.envs[0]->sig_count = 0;
    a.envs[0]->sig_index = 0;
    assert_int_equal(sp_envelope_encode(a.envs[0], &plain, &plen), 0);
    assert_int_equal(verify(plain, plen, cache), SP_EUNSIGNED);
    free(plain);
    assert_int_equal(sp_envelope_encode_signed(a.envs[0], "worker-w9", key, &plain, &plen), 0);
    assert_int_equal(verify(plain, plen, cache), SP_ESIGNER);
    free(plain);
    assert_int_equal(sp_sigcache_new(0, &cache), -EINVAL);
    batch_free(&a);
    sp_sigcache_free(cache);
}

/* The memo of verified nodes changes no verdict: with every member of a batch verified (every
 * interior node remembered), a member with any one byte of any proof hash changed, or its
 * proof under another count, is refused exactly as a verifier without a cache refuses it; the
 * members themselves cost one Ed25519 between them, in any order. 300: an unbalanced tree. */
static void test_memo_is_exact(void **state)
{
    sp_sigcache_t *cache = NULL;
    uint64_t hits, verified;
    batch_t a;
    size_t len;
    uint8_t *t;

    assert_int_equal(sp_sigcache_new(4096, &cache), 0);
    batch_make(&a, 300, "m", key);
    for (size_t k = 0; k < a.n; k++) {
        size_t i = (k * 7) % a.n; /* not in index order */
        assert_int_equal(verify(a.bufs[i], a.lens[i], cache), 0);
    }
    sp_sigcache_stats(cache, &hits, &verified);
    assert_int_equal(verified, 1);
    assert_int_equal(hits, a.n - 1);
    for (size_t i = 0; i < a.n; i += 13) {
        sp_envelope_t *e = decode(a.bufs[i], a.lens[i]);
        uint8_t proof[SP_SIG_PROOF_MAX];
        size_t plen = e->sig_proof.len;
        for (size_t off = 0; off < plen; off += 7) {
            memcpy(proof, e->sig_proof.data, plen);
            proof[off] ^= 0x80;
            t = rebuild(a.bufs[i], a.lens[i], e->signature.data, proof, plen, i, a.n, &len);
            assert_int_equal(verify(t, len, NULL), SP_ESIGNATURE);
            assert_int_equal(verify(t, len, cache), SP_ESIGNATURE);
            free(t);
        }
        t = rebuild(a.bufs[i], a.lens[i], e->signature.data, e->sig_proof.data, plen, i, a.n + 1,
                    &len);
        assert_int_equal(verify(t, len, cache), SP_ESIGNATURE);
        free(t);
        sp_envelope_free(e);
        assert_int_equal(verify(a.bufs[i], a.lens[i], cache), 0);
    }
    batch_free(&a);
    sp_sigcache_free(cache);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_batch_of_one_is_plain),
        cmocka_unit_test(test_tamper_member),
        cmocka_unit_test(test_swapped_and_foreign_proofs),
        cmocka_unit_test(test_truncated_proofs),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_cache_and_identity),
        cmocka_unit_test(test_memo_is_exact),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
