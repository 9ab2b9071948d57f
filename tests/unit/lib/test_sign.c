/* Ed25519 keys on disk, the keyring, canonical bytes and signed envelopes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "envelope.h"
#include "error.h"
#include "hash.h"
#include "sign.h"
#include "xmalloc.h"

static char dir[] = "/tmp/test_sign_XXXXXX";

static int setup(void **state)
{
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char *cmd = sp_xasprintf("rm -rf '%s'", dir);
    int rc = system(cmd); /* NOLINT(cert-env33-c) */
    free(cmd);
    return rc == 0 ? 0 : -1;
}

static char *path(const char *name)
{
    return sp_xasprintf("%s/%s", dir, name);
}

/* What a batch of one signs (sign.h): the domain, count 1 and the leaf of the canonical bytes. */
static int verify_single(const uint8_t pub[SP_PUBKEY_LEN], const uint8_t *canon, size_t clen,
                         const uint8_t sig[SP_SIG_LEN])
{
    uint8_t leaf[SP_SIG_HASH_LEN], msg[SP_SIG_MSG_LEN];
    sp_sig_leaf(canon, clen, leaf);
    sp_sig_message(1, leaf, msg);
    return sp_verify_raw(pub, msg, sizeof(msg), sig);
}

static void sign_single(const sp_sign_key_t *k, const uint8_t *canon, size_t clen,
                        uint8_t sig[SP_SIG_LEN])
{
    uint8_t leaf[SP_SIG_HASH_LEN], msg[SP_SIG_MSG_LEN];
    sp_sig_leaf(canon, clen, leaf);
    sp_sig_message(1, leaf, msg);
    assert_int_equal(sp_sign(k, msg, sizeof(msg), sig), 0);
}

typedef struct {
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxCreateRequested create;
    char id[37];
} fixture_t;

static void make_create(fixture_t *f)
{
    memset(f, 0, sizeof(*f));
    space__v1__envelope__init(&f->env);
    space__v1__aggregate__init(&f->agg);
    space__v1__sandbox_create_requested__init(&f->create);
    f->agg.kind = "sandbox";
    f->agg.id = "sbx_test0001";
    f->create.template_ = "base";
    f->env.aggregate = &f->agg;
    f->env.tenant = "acme";
    f->env.actor = "key_123";
    f->env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED;
    f->env.sandbox_create_requested = &f->create;
    sp_envelope_stamp(&f->env, f->id);
}

static void test_keygen_files(void **state)
{
    char *priv = path("gateway.key"), *pub = path("gateway.pub");
    sp_sign_key_t *k = NULL;
    struct stat st;

    assert_int_equal(sp_sign_keygen(priv, pub), 0);
    assert_int_equal(stat(priv, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* Never overwritten: a second keygen would orphan every signature made so far. */
    assert_int_equal(sp_sign_keygen(priv, pub), -EEXIST);
    assert_int_equal(sp_sign_key_load(priv, &k), 0);
    sp_sign_key_free(k);
    /* A private key others can read is refused. */
    assert_int_equal(chmod(priv, 0640), 0);
    assert_int_equal(sp_sign_key_load(priv, &k), -EPERM);
    assert_int_equal(chmod(priv, 0600), 0);
    /* The public file is not a private key. */
    assert_int_equal(chmod(pub, 0600), 0);
    assert_int_equal(sp_sign_key_load(pub, &k), SP_ECONFIG);
    sp_sign_key_free(NULL);
    free(priv);
    free(pub);
}

static void test_sign_verify_raw(void **state)
{
    uint8_t seed[32] = {1, 2, 3}, pub[SP_PUBKEY_LEN], sig[SP_SIG_LEN];
    const char msg[] = "the canonical bytes";
    sp_sign_key_t *k = NULL;

    assert_int_equal(sp_sign_key_from_raw(seed, &k), 0);
    assert_int_equal(sp_sign_key_public(k, pub), 0);
    assert_int_equal(sp_sign(k, msg, sizeof(msg), sig), 0);
    assert_int_equal(sp_verify_raw(pub, msg, sizeof(msg), sig), 0);
    sig[10] ^= 1;
    assert_int_equal(sp_verify_raw(pub, msg, sizeof(msg), sig), SP_ESIGNATURE);
    sig[10] ^= 1;
    assert_int_equal(sp_verify_raw(pub, msg, sizeof(msg) - 1, sig), SP_ESIGNATURE);
    sp_sign_key_free(k);
}

/* RFC 8032, 7.1, TEST 1 and TEST 2: the signatures are the standard's bytes (Ed25519 is
 * deterministic), whichever library does the arithmetic; and a key that OpenSSL wrote as PEM
 * signs what the openssl tool verifies. */
static void test_rfc8032_vectors(void **state)
{
    static const struct {
        const char *seed, *pub, *msg, *sig;
    } v[] = {
        {"9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
         "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
         "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bac"
         "c61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"},
        {"4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
         "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
         "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e"
         "458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        uint8_t seed[32], pub[SP_PUBKEY_LEN], want_pub[SP_PUBKEY_LEN], msg[1];
        uint8_t sig[SP_SIG_LEN], want_sig[SP_SIG_LEN];
        size_t mlen = strlen(v[i].msg) / 2;
        sp_sign_key_t *k = NULL;
        assert_int_equal(sp_hex_decode(v[i].seed, seed, sizeof(seed)), 0);
        assert_int_equal(sp_hex_decode(v[i].pub, want_pub, sizeof(want_pub)), 0);
        assert_int_equal(sp_hex_decode(v[i].sig, want_sig, sizeof(want_sig)), 0);
        if (mlen)
            assert_int_equal(sp_hex_decode(v[i].msg, msg, mlen), 0);
        assert_int_equal(sp_sign_key_from_raw(seed, &k), 0);
        assert_int_equal(sp_sign_key_public(k, pub), 0);
        assert_memory_equal(pub, want_pub, SP_PUBKEY_LEN);
        assert_int_equal(sp_sign(k, mlen ? msg : NULL, mlen, sig), 0);
        assert_memory_equal(sig, want_sig, SP_SIG_LEN);
        assert_int_equal(sp_verify_raw(want_pub, mlen ? msg : NULL, mlen, want_sig), 0);
        want_sig[63] ^= 0x10;
        assert_int_equal(sp_verify_raw(want_pub, mlen ? msg : NULL, mlen, want_sig), SP_ESIGNATURE);
        sp_sign_key_free(k);
    }

    char *priv = path("tool.key"), *pubf = path("tool.pub"), *data = path("tool.data");
    char *sigf = path("tool.sig");
    assert_int_equal(sp_sign_keygen(priv, pubf), 0);
    sp_sign_key_t *k = NULL;
    assert_int_equal(sp_sign_key_load(priv, &k), 0);
    const char text[] = "signed here, verified by the openssl tool";
    uint8_t sig[SP_SIG_LEN];
    assert_int_equal(sp_sign(k, text, sizeof(text) - 1, sig), 0);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, sizeof(text) - 1, f), sizeof(text) - 1);
    fclose(f);
    f = fopen(sigf, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(sig, 1, sizeof(sig), f), sizeof(sig));
    fclose(f);
    char *cmd = sp_xasprintf("openssl pkeyutl -verify -pubin -inkey '%s' -rawin -in '%s' "
                             "-sigfile '%s' >/dev/null 2>&1",
                             pubf, data, sigf);
    assert_int_equal(system(cmd), 0); /* NOLINT(cert-env33-c) */
    free(cmd);
    sp_sign_key_free(k);
    free(priv);
    free(pubf);
    free(data);
    free(sigf);
}

static void test_keyring_dir(void **state)
{
    char *a = path("worker-w1.key"), *ap = path("worker-w1.pub");
    char *b = path("platform-acme.key"), *bp = path("platform-acme.pub");
    char *t = path("platform-acme.tenants"), *junk = path("not an identity.pub");
    sp_keyring_t *kr = NULL;
    sp_sign_key_t *k = NULL;
    uint8_t sig[SP_SIG_LEN];
    FILE *f;

    assert_int_equal(sp_sign_keygen(a, ap), 0);
    assert_int_equal(sp_sign_keygen(b, bp), 0);
    f = fopen(t, "w");
    assert_non_null(f);
    fputs("# acme's tenants\nacme\n\nacme-eu\n", f);
    fclose(f);
    f = fopen(junk, "w");
    assert_non_null(f);
    fputs("skipped: the name is not an identity\n", f);
    fclose(f);

    assert_int_equal(sp_keyring_load(dir, &kr), 0);
    /* gateway.pub from test_keygen_files, worker-w1, platform-acme. */
    assert_int_equal(sp_keyring_size(kr), 3);
    assert_true(sp_keyring_has(kr, "worker-w1"));
    assert_true(sp_keyring_has_tenant(kr, "platform-acme", "acme-eu"));
    assert_false(sp_keyring_has_tenant(kr, "platform-acme", "other"));
    assert_false(sp_keyring_has_tenant(kr, "worker-w1", "acme"));

    assert_int_equal(sp_sign_key_load(a, &k), 0);
    assert_int_equal(sp_sign(k, "x", 1, sig), 0);
    assert_int_equal(sp_keyring_verify(kr, "worker-w1", "x", 1, sig), 0);
    /* Signed by worker-w1, claimed by platform-acme. */
    assert_int_equal(sp_keyring_verify(kr, "platform-acme", "x", 1, sig), SP_ESIGNATURE);
    assert_int_equal(sp_keyring_verify(kr, "worker-w9", "x", 1, sig), SP_ESIGNER);
    sp_sign_key_free(k);
    sp_keyring_free(kr);

    /* A malformed tenants file fails the whole load (a platform must not lose its limits). */
    f = fopen(t, "w");
    fputs("Not A Tenant\n", f);
    fclose(f);
    assert_int_equal(sp_keyring_load(dir, &kr), SP_ECONFIG);
    unlink(t);
    free(a);
    free(ap);
    free(b);
    free(bp);
    free(t);
    free(junk);
}

static void write_tenants(const char *name, const char *text)
{
    char *t = path(name), *tmp = sp_xasprintf("%s.tmp", t);
    FILE *f = fopen(tmp, "w");

    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rename(tmp, t), 0);
    free(tmp);
    free(t);
}

/* A platform's tenants change while a consumer runs (space platform add again): the keyring
 * says it is stale, a new load has the new tenants; no change, no reload. */
static void test_keyring_stale(void **state)
{
    char *t = path("platform-acme.tenants");
    sp_keyring_t *kr = NULL, *kr2 = NULL;

    /* platform-acme.pub is left by test_keyring_dir; no tenants file now. */
    assert_int_equal(sp_keyring_load(dir, &kr), 0);
    assert_false(sp_keyring_stale(kr));
    write_tenants("platform-acme.tenants", "acme\n");
    assert_true(sp_keyring_stale(kr)); /* appeared */
    sp_keyring_free(kr);

    assert_int_equal(sp_keyring_load(dir, &kr), 0);
    assert_true(sp_keyring_has_tenant(kr, "platform-acme", "acme"));
    assert_false(sp_keyring_stale(kr));
    write_tenants("platform-acme.tenants", "globex\n");
    assert_true(sp_keyring_stale(kr)); /* replaced (by rename, as space platform add does) */
    assert_int_equal(sp_keyring_load(dir, &kr2), 0);
    assert_false(sp_keyring_has_tenant(kr2, "platform-acme", "acme"));
    assert_true(sp_keyring_has_tenant(kr2, "platform-acme", "globex"));
    assert_false(sp_keyring_stale(kr2));
    unlink(t);
    assert_true(sp_keyring_stale(kr2)); /* removed: no tenants any more */
    sp_keyring_free(kr);
    sp_keyring_free(kr2);

    /* A keyring not read from a directory is never stale. */
    assert_int_equal(sp_keyring_new(&kr), 0);
    assert_false(sp_keyring_stale(kr));
    assert_false(sp_keyring_stale(NULL));
    sp_keyring_free(kr);
    free(t);
}

/* Signed envelope: decodes, keeps signer and signature, and its canonical bytes are what was
 * signed: the bytes before the appended signature field. */
static void test_envelope_signed(void **state)
{
    uint8_t seed[32] = {9}, pub[SP_PUBKEY_LEN];
    sp_sign_key_t *k = NULL;
    sp_envelope_t *e = NULL;
    char reason[SP_REASON_MAX];
    uint8_t *buf = NULL, *canon;
    size_t len, clen;
    fixture_t f;

    make_create(&f);
    assert_int_equal(sp_sign_key_from_raw(seed, &k), 0);
    assert_int_equal(sp_sign_key_public(k, pub), 0);
    assert_int_equal(sp_envelope_encode_signed(&f.env, "gateway", k, &buf, &len), 0);
    assert_int_equal(sp_envelope_decode(buf, len, &e, reason), 0);
    assert_string_equal(e->signer, "gateway");
    assert_int_equal(e->signature.len, SP_SIG_LEN);

    canon = sp_xmalloc(len);
    assert_int_equal(sp_envelope_canonical(buf, len, canon, &clen), 0);
    assert_int_equal(clen, len - SP_SIG_FIELD_LEN);
    assert_memory_equal(canon, buf, clen);
    assert_int_equal(verify_single(pub, canon, clen, e->signature.data), 0);

    /* Decode -> re-encode (protobuf-c packs in field-number order, so the signature moves
     * before the payload) -> canonical: the same bytes. */
    size_t n2 = space__v1__envelope__get_packed_size(e);
    uint8_t *re = sp_xmalloc(n2), *canon2 = sp_xmalloc(n2);
    size_t clen2;
    space__v1__envelope__pack(e, re);
    assert_int_equal(n2, len);
    assert_int_equal(sp_envelope_canonical(re, n2, canon2, &clen2), 0);
    assert_int_equal(clen2, clen);
    assert_memory_equal(canon2, canon, clen);
    free(re);
    free(canon2);

    /* A tampered byte anywhere in the canonical part breaks the signature. */
    for (size_t i = 0; i < clen; i += 7) {
        uint8_t *t = sp_xmalloc(len), *tc = sp_xmalloc(len);
        size_t tl;
        memcpy(t, buf, len);
        t[i] ^= 0x20;
        if (sp_envelope_canonical(t, len, tc, &tl) == 0)
            assert_int_equal(verify_single(pub, tc, tl, e->signature.data), SP_ESIGNATURE);
        free(t);
        free(tc);
    }
    sp_envelope_free(e);
    free(canon);
    free(buf);
    sp_sign_key_free(k);
}

/* A field this build does not know, placed where a newer producer packing in field-number
 * order puts it (field 50, before the payload), stays covered by the signature: canonical
 * bytes are the received bytes minus the signature. A re-encoding would not do: protobuf-c
 * packs unknown fields after the known ones, so the re-packed bytes differ from the signed. */
static void test_canonical_keeps_unknown_fields(void **state)
{
    uint8_t seed[32] = {7}, pub[SP_PUBKEY_LEN], sig[SP_SIG_LEN];
    sp_sign_key_t *k = NULL;
    sp_envelope_t *e = NULL;
    char reason[SP_REASON_MAX];
    uint8_t *full = NULL, *head, *buf;
    size_t flen, hlen, len = 0;
    fixture_t f;

    make_create(&f);
    f.env.signer = "gateway";
    assert_int_equal(sp_envelope_encode(&f.env, &full, &flen), 0);
    /* The same envelope without its payload: the bytes before the payload record. */
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET;
    hlen = space__v1__envelope__get_packed_size(&f.env);
    head = sp_xmalloc(hlen);
    space__v1__envelope__pack(&f.env, head);
    assert_true(hlen < flen);
    assert_memory_equal(head, full, hlen);

    buf = sp_xmalloc(flen + 4 + SP_SIG_FIELD_LEN);
    memcpy(buf, head, hlen);
    len = hlen;
    buf[len++] = 0x90; /* key: field 50, varint (400 as a two-byte varint) */
    buf[len++] = 0x03;
    buf[len++] = 0xac;
    buf[len++] = 0x02;
    memcpy(buf + len, full + hlen, flen - hlen);
    len += flen - hlen;
    assert_int_equal(sp_sign_key_from_raw(seed, &k), 0);
    assert_int_equal(sp_sign_key_public(k, pub), 0);
    sign_single(k, buf, len, sig);
    size_t signed_len = len;
    buf[len++] = (11 << 3) | 2;
    buf[len++] = SP_SIG_LEN;
    memcpy(buf + len, sig, SP_SIG_LEN);
    len += SP_SIG_LEN;

    assert_int_equal(sp_envelope_decode(buf, len, &e, reason), 0);
    uint8_t *canon = sp_xmalloc(len);
    size_t clen;
    assert_int_equal(sp_envelope_canonical(buf, len, canon, &clen), 0);
    assert_int_equal(clen, signed_len);
    assert_int_equal(verify_single(pub, canon, clen, e->signature.data), 0);

    /* What a verifier that re-encoded would check: not the signed bytes. */
    size_t rlen = space__v1__envelope__get_packed_size(e);
    uint8_t *re = sp_xmalloc(rlen), *rc = sp_xmalloc(rlen);
    size_t rclen;
    space__v1__envelope__pack(e, re);
    assert_int_equal(sp_envelope_canonical(re, rlen, rc, &rclen), 0);
    assert_int_equal(rclen, clen);
    assert_memory_not_equal(rc, canon, clen);
    assert_int_equal(verify_single(pub, rc, rclen, e->signature.data), SP_ESIGNATURE);

    free(re);
    free(rc);
    free(canon);
    free(head);
    free(full);
    free(buf);
    sp_envelope_free(e);
    sp_sign_key_free(k);
}

static void test_canonical_malformed(void **state)
{
    uint8_t out[16];
    size_t n;
    const uint8_t truncated_len[] = {(2 << 3) | 2, 10, 'a'};
    const uint8_t group[] = {(5 << 3) | 3};
    const uint8_t long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0xff, 0xff, 0x01};

    assert_int_equal(sp_envelope_canonical(truncated_len, sizeof(truncated_len), out, &n),
                     SP_EDECODE);
    assert_int_equal(sp_envelope_canonical(group, sizeof(group), out, &n), SP_EDECODE);
    assert_int_equal(sp_envelope_canonical(long_varint, sizeof(long_varint), out, &n), SP_EDECODE);
    assert_int_equal(sp_envelope_canonical(out, 0, out, &n), 0);
    assert_int_equal(n, 0);
}

static void test_signer_validation(void **state)
{
    char reason[SP_REASON_MAX];
    uint8_t sig[SP_SIG_LEN] = {0};
    fixture_t f;

    make_create(&f);
    f.env.signer = "gateway";
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    f.env.signer = "worker"; /* a worker identity names its worker */
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    f.env.signer = "worker-W1";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    f.env.signer =
        "platform-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    f.env.signer = "";
    f.env.signature.data = sig;
    f.env.signature.len = SP_SIG_LEN;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "without signer"));
    f.env.signer = "gateway";
    f.env.signature.len = 63;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
}

/* Copies src to dst (a retired key's file is the current .pub it replaced). */
static void copy_file(const char *src, const char *dst)
{
    char buf[4096];
    FILE *in = fopen(src, "re"), *out = fopen(dst, "we");
    assert_non_null(in);
    assert_non_null(out);
    size_t n = fread(buf, 1, sizeof(buf), in);
    assert_true(n > 0);
    assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* One message signed alone and a batch of three, by key as signer. */
typedef struct {
    fixture_t f[4];
    uint8_t *buf[4];
    size_t len[4];
    sp_envelope_t *env[4];
} signed_set_t;

static void sign_set(signed_set_t *s, const char *signer, const sp_sign_key_t *key)
{
    sp_envelope_t *envs[3];
    char reason[SP_REASON_MAX];

    for (int i = 0; i < 4; i++)
        make_create(&s->f[i]);
    assert_int_equal(sp_envelope_encode_signed(&s->f[0].env, signer, key, &s->buf[0], &s->len[0]),
                     0);
    for (int i = 0; i < 3; i++)
        envs[i] = &s->f[i + 1].env;
    assert_int_equal(sp_envelope_encode_signed_batch(envs, 3, signer, key, s->buf + 1, s->len + 1),
                     0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(sp_envelope_decode(s->buf[i], s->len[i], &s->env[i], reason), 0);
}

static void set_free(signed_set_t *s)
{
    for (int i = 0; i < 4; i++) {
        sp_envelope_free(s->env[i]);
        free(s->buf[i]);
    }
}

/* Every message of the set verifies (want 0) or not (SP_ESIGNATURE) at at_ns, with and without
 * a cache; with the cache twice, so that an entry cached by the first pass cannot let
 * through what the second must refuse. */
static void expect_set(const sp_keyring_t *kr, sp_sigcache_t *cache, const signed_set_t *s,
                       int64_t at_ns, int want)
{
    for (int pass = 0; pass < 3; pass++)
        for (int i = 0; i < 4; i++)
            assert_int_equal(
                sp_envelope_verify(kr, pass ? cache : NULL, s->env[i], s->buf[i], s->len[i], at_ns),
                want);
}

/* Key rotation (space identity rotate, docs/trust.md): the old .pub kept as
 * <identity>@<until>.pub counts for messages published before <until>, never after, whatever
 * the signature cache holds; the new key counts from the start; the directory's change makes
 * the keyring stale; malformed retired names are skipped. */
static void test_keyring_rotation(void **state)
{
    char *key = path("scheduler.key"), *pub = path("scheduler.pub");
    char *oldkey = path("scheduler.key.old");
    sp_sign_key_t *k_old = NULL, *k_new = NULL;
    sp_keyring_t *kr0 = NULL, *kr = NULL;
    sp_sigcache_t *cache = NULL;
    signed_set_t s_old, s_new;
    int64_t now = wall_ns(), until_s = now / 1000000000LL + 100;
    char name[128];

    assert_int_equal(sp_sign_keygen(key, pub), 0);
    assert_int_equal(sp_sign_key_load(key, &k_old), 0);
    sign_set(&s_old, "scheduler", k_old);
    assert_int_equal(sp_keyring_load(dir, &kr0), 0);
    expect_set(kr0, NULL, &s_old, 0, 0);

    /* The rotation: the old public key retired until now + 100 s, a new pair. */
    snprintf(name, sizeof(name), "scheduler@%lld.pub", (long long)until_s);
    char *retired = path(name);
    copy_file(pub, retired);
    assert_int_equal(rename(key, oldkey), 0);
    assert_int_equal(sp_sign_keygen(key, pub), 0);
    assert_int_equal(sp_sign_key_load(key, &k_new), 0);
    sign_set(&s_new, "scheduler", k_new);
    assert_true(sp_keyring_stale(kr0));
    expect_set(kr0, NULL, &s_new, 0, SP_ESIGNATURE); /* the old keyring knows the old key only */

    assert_int_equal(sp_keyring_load(dir, &kr), 0);
    assert_false(sp_keyring_stale(kr));
    assert_int_equal(sp_sigcache_new(64, &cache), 0);
    expect_set(kr, cache, &s_new, 0, 0);
    expect_set(kr, cache, &s_new, (until_s + 1000) * 1000000000LL, 0); /* current: no end */
    expect_set(kr, cache, &s_old, 0, 0);                               /* now: before until */
    expect_set(kr, cache, &s_old, now, 0);
    expect_set(kr, cache, &s_old, until_s * 1000000000LL - 1, 0);
    /* Published at or after until: refused, though the cache verified the same roots. */
    expect_set(kr, cache, &s_old, until_s * 1000000000LL, SP_ESIGNATURE);
    expect_set(kr, cache, &s_old, (until_s + 1) * 1000000000LL, SP_ESIGNATURE);

    /* Plain signatures (the data plane) judge a retired key at now. */
    uint8_t sig[SP_SIG_LEN];
    const char data[] = "an exec request";
    assert_int_equal(sp_sign(k_old, data, sizeof(data), sig), 0);
    assert_int_equal(sp_keyring_verify(kr, "scheduler", data, sizeof(data), sig), 0);
    assert_int_equal(sp_keyring_verify(kr0, "scheduler", data, sizeof(data), sig), 0);
    /* Data that names its time (a checkpoint): judged at it. */
    assert_int_equal(
        sp_keyring_verify_at(kr, "scheduler", data, sizeof(data), sig, until_s * 1000000000LL - 1),
        0);
    assert_int_equal(
        sp_keyring_verify_at(kr, "scheduler", data, sizeof(data), sig, until_s * 1000000000LL),
        SP_ESIGNATURE);
    sp_keyring_free(kr);

    /* Names that are not <identity>@<unix seconds>.pub are skipped, whatever they hold: with
     * only such copies of the old key beside the new one, the old key counts for nothing. */
    static const char *const bad[] = {"scheduler@abc.pub",    "scheduler@0.pub",
                                      "scheduler@-5.pub",     "scheduler@099.pub",
                                      "scheduler@1x.pub",     "scheduler@99999999999999999999.pub",
                                      "nobody@5000000000.pub"};
    const size_t n_bad = sizeof(bad) / sizeof(bad[0]);
    for (size_t i = 0; i < n_bad; i++) {
        char *b = path(bad[i]);
        copy_file(retired, b);
        free(b);
    }
    assert_int_equal(unlink(retired), 0);
    assert_int_equal(sp_keyring_load(dir, &kr), 0);
    expect_set(kr, NULL, &s_old, 0, SP_ESIGNATURE);
    expect_set(kr, NULL, &s_new, 0, 0);
    sp_keyring_free(kr);
    for (size_t i = 0; i < n_bad; i++) {
        char *b = path(bad[i]);
        unlink(b);
        free(b);
    }

    /* A key file that is not a public key fails the load, retired or not. */
    char *past = path("scheduler@1.pub");
    copy_file(oldkey, past);
    assert_int_equal(sp_keyring_load(dir, &kr), SP_ECONFIG);
    unlink(past);

    /* A retired key and no current one (an identity gone for good, whose log is still
     * verified): known, and it counts only for messages published before its until. */
    uint8_t raw_old[SP_PUBKEY_LEN];
    assert_int_equal(sp_sign_key_public(k_old, raw_old), 0);
    assert_int_equal(sp_keyring_new(&kr), 0);
    assert_int_equal(sp_keyring_add_retired(kr, "scheduler", raw_old, 1000000000LL), 0);
    assert_true(sp_keyring_has(kr, "scheduler"));
    expect_set(kr, cache, &s_old, 0, SP_ESIGNATURE);
    expect_set(kr, cache, &s_old, 999999999LL, 0);
    expect_set(kr, cache, &s_new, 999999999LL, SP_ESIGNATURE);
    assert_int_equal(sp_keyring_add_retired(kr, "scheduler", raw_old, 0), -EINVAL);
    assert_int_equal(sp_keyring_add_retired(kr, "not an identity", raw_old, 5), -EINVAL);
    sp_keyring_free(kr);
    free(past);
    free(retired);
    sp_keyring_free(kr0);
    sp_sigcache_free(cache);
    set_free(&s_old);
    set_free(&s_new);
    sp_sign_key_free(k_old);
    sp_sign_key_free(k_new);
    free(key);
    free(pub);
    free(oldkey);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keygen_files),
        cmocka_unit_test(test_sign_verify_raw),
        cmocka_unit_test(test_rfc8032_vectors),
        cmocka_unit_test(test_keyring_dir),
        cmocka_unit_test(test_keyring_stale),
        cmocka_unit_test(test_envelope_signed),
        cmocka_unit_test(test_canonical_keeps_unknown_fields),
        cmocka_unit_test(test_canonical_malformed),
        cmocka_unit_test(test_signer_validation),
        cmocka_unit_test(test_keyring_rotation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
