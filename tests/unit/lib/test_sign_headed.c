/* Headed batches (sign.h, docs/trust.md "Headed batches"): a head that lists every member's
 * leaf under one signature, members that carry only their place and their head's event_id;
 * what a forger can do with heads, lists and members; which subjects producers sign this way
 * (contract.h, sp_subject_log_only); and what it saves on the wire. The ring and the lookup in
 * the log (sighead.h) are tested against PostgreSQL in tests/integration/headed.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"
#include "envelope.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "publish.h"
#include "sign.h"
#include "xmalloc.h"

typedef struct {
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__CommandOutput out;
    char id[37], sbx[32], data[64];
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
    uint8_t seed[32] = {3}, seed2[32] = {4}, pub[SP_PUBKEY_LEN];
    (void)state;
    if (sp_sign_key_from_raw(seed, &key) < 0 || sp_sign_key_from_raw(seed2, &other_key) < 0 ||
        sp_sign_key_public(key, pub) < 0 || sp_keyring_new(&ring) < 0 ||
        sp_keyring_add(ring, "worker-w1", pub) < 0 || sp_sign_key_public(other_key, pub) < 0 ||
        sp_keyring_add(ring, "worker-w2", pub) < 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    sp_sign_key_free(key);
    sp_sign_key_free(other_key);
    sp_keyring_free(ring);
    return 0;
}

static void members_make(batch_t *b, size_t n, const char *tag)
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
        space__v1__command_output__init(&m->out);
        snprintf(m->sbx, sizeof(m->sbx), "sbx_%s%04zu", tag, i % 3);
        snprintf(m->data, sizeof(m->data), "line %zu of %s\n", i, tag);
        m->agg.kind = "sandbox";
        m->agg.id = m->sbx;
        m->out.cmd_id = "cmd_0123456789abcdef";
        m->out.stream = 1;
        m->out.offset = i * 16;
        m->out.data.data = (uint8_t *)m->data;
        m->out.data.len = strlen(m->data);
        m->env.aggregate = &m->agg;
        m->env.tenant = "acme";
        m->env.actor = "svc:worker";
        m->env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT;
        m->env.command_output = &m->out;
        sp_envelope_stamp(&m->env, m->id);
        b->envs[i] = &m->env;
    }
}

static void headed_make(batch_t *b, size_t n, const char *tag, const char *signer,
                        const sp_sign_key_t *k)
{
    members_make(b, n, tag);
    assert_int_equal(sp_envelope_encode_signed_headed(b->envs, n, signer, k, b->bufs, b->lens), 0);
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

static sp_envelope_t *decode(const uint8_t *raw, size_t len)
{
    char reason[SP_REASON_MAX];
    sp_envelope_t *e = NULL;
    assert_int_equal(sp_envelope_decode(raw, len, &e, reason), 0);
    return e;
}

/* What the log concludes about member raw of the batch whose head is head_raw: the head's own
 * verification, then the member's place in its list. */
static int judge(const uint8_t *head_raw, size_t head_len, const uint8_t *raw, size_t len,
                 sp_sigcache_t *cache)
{
    char reason[SP_REASON_MAX];
    sp_envelope_t *head = NULL, *e = NULL;
    uint8_t leaf[SP_SIG_HASH_LEN];
    int rc = sp_envelope_decode(head_raw, head_len, &head, reason);
    if (rc < 0)
        return rc;
    rc = sp_envelope_verify(ring, cache, head, head_raw, head_len, 0);
    if (rc == 0 && head_raw != raw) {
        rc = sp_envelope_decode(raw, len, &e, reason);
        if (rc == 0) {
            rc = sp_envelope_verify(ring, cache, e, raw, len, 0);
            assert_true(rc == SP_EHEADED || rc < 0);
            if (rc == SP_EHEADED && (rc = sp_envelope_leaf(raw, len, leaf)) == 0)
                rc = sp_sig_member_check(head, e, leaf);
        }
    }
    sp_envelope_free(head);
    sp_envelope_free(e);
    return rc;
}

/* Every member belongs to its head; the head costs one Ed25519, members none; the head lists
 * its own leaf first and every member's leaf at its index. */
static void test_sizes(void **state)
{
    static const size_t sizes[] = {2, 3, 17, 64, 256, 300};
    (void)state;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t n = sizes[s];
        sp_sigcache_t *cache = NULL;
        uint64_t hits, verified;
        batch_t b;
        headed_make(&b, n, "s", "worker-w1", key);
        assert_int_equal(sp_sigcache_new(64, &cache), 0);
        sp_envelope_t *head = decode(b.bufs[0], b.lens[0]);
        assert_int_equal(head->sig_leaves.len, n * 32);
        assert_int_equal(head->sig_count, n);
        assert_int_equal(head->signature.len, SP_SIG_LEN);
        for (size_t i = 0; i < n; i++) {
            uint8_t leaf[32];
            assert_int_equal(sp_envelope_leaf(b.bufs[i], b.lens[i], leaf), 0);
            assert_memory_equal(head->sig_leaves.data + i * 32, leaf, 32);
            assert_int_equal(judge(b.bufs[0], b.lens[0], b.bufs[i], b.lens[i], cache), 0);
            if (i > 0) {
                sp_envelope_t *e = decode(b.bufs[i], b.lens[i]);
                assert_int_equal(e->signature.len, 0);
                assert_int_equal(e->sig_proof.len, 0);
                assert_int_equal(e->sig_index, i);
                assert_int_equal(e->sig_count, n);
                char hid[37];
                sp_sig_head_id(e, hid);
                assert_string_equal(hid, head->event_id);
                assert_string_equal(e->signer, "worker-w1");
                sp_envelope_free(e);
            }
        }
        sp_sigcache_stats(cache, &hits, &verified);
        assert_int_equal(verified, 1);
        sp_envelope_free(head);
        sp_sigcache_free(cache);
        batch_free(&b);
    }
}

/* Any byte of a member's canonical bytes changed: not in the list. Any byte of the head's
 * canonical bytes or of its list changed: the head does not verify. */
static void test_tamper(void **state)
{
    batch_t b;
    (void)state;
    headed_make(&b, 4, "t", "worker-w1", key);
    for (size_t i = 0; i < b.n; i++) {
        uint8_t *canon = sp_xmalloc(b.lens[i]);
        size_t clen;
        assert_int_equal(sp_envelope_canonical(b.bufs[i], b.lens[i], canon, &clen), 0);
        free(canon);
        /* The head: its list too (it follows the canonical bytes and the signature). */
        size_t upto = i == 0 ? b.lens[i] : clen;
        for (size_t off = 0; off < upto; off++) {
            uint8_t *t = sp_xmalloc(b.lens[i]);
            memcpy(t, b.bufs[i], b.lens[i]);
            t[off] ^= 0x01;
            if (i == 0)
                assert_int_not_equal(judge(t, b.lens[0], t, b.lens[0], NULL), 0);
            else
                assert_int_not_equal(judge(b.bufs[0], b.lens[0], t, b.lens[i], NULL), 0);
            free(t);
        }
    }
    batch_free(&b);
}

/* A member checked against another batch's head, one claiming another index, one whose
 * signer is not its head's, a head whose list does not start with its own leaf, and a head
 * signed with the Merkle domain (the same list, another meaning). */
static void test_forgeries(void **state)
{
    batch_t a, b, c;
    char reason[SP_REASON_MAX];
    (void)state;
    headed_make(&a, 3, "a", "worker-w1", key);
    headed_make(&b, 3, "b", "worker-w1", key);
    headed_make(&c, 3, "c", "worker-w2", other_key);
    sp_envelope_t *ha = decode(a.bufs[0], a.lens[0]), *hb = decode(b.bufs[0], b.lens[0]);
    sp_envelope_t *hc = decode(c.bufs[0], c.lens[0]);
    sp_envelope_t *m1 = decode(a.bufs[1], a.lens[1]);
    uint8_t leaf[32];
    assert_int_equal(sp_envelope_leaf(a.bufs[1], a.lens[1], leaf), 0);
    assert_int_equal(sp_sig_member_check(ha, m1, leaf), 0);
    /* another head: it does not name it, nor is its leaf there */
    assert_int_equal(sp_sig_member_check(hb, m1, leaf), SP_ESIGNATURE);
    /* names that head (sig_head is outside the canonical bytes, so a forger can) */
    uint8_t saved[16], hb_id[16];
    memcpy(saved, m1->sig_head.data, 16);
    assert_int_equal(sp_uuid_parse(hb->event_id, hb_id), 0);
    memcpy(m1->sig_head.data, hb_id, 16);
    assert_int_equal(sp_sig_member_check(hb, m1, leaf), SP_ESIGNATURE);
    memcpy(m1->sig_head.data, saved, 16);
    /* another index of the same list */
    m1->sig_index = 2;
    assert_int_equal(sp_sig_member_check(ha, m1, leaf), SP_ESIGNATURE);
    m1->sig_index = 0;
    assert_int_equal(sp_sig_member_check(ha, m1, leaf), SP_ESIGNATURE);
    m1->sig_index = 1;
    m1->sig_count = 4;
    assert_int_equal(sp_sig_member_check(ha, m1, leaf), SP_ESIGNATURE);
    m1->sig_count = 3;
    /* a head of another signer listing the same leaf at that index */
    memcpy(hc->sig_leaves.data + 32, leaf, 32);
    char *hc_id = hc->event_id;
    hc->event_id = ha->event_id;
    assert_int_equal(sp_sig_member_check(hc, m1, leaf), SP_ESIGNATURE);
    hc->event_id = hc_id;

    /* A head whose list's first leaf is not its own: b's list signed honestly over a's
     * members would need a's key for the list; here a's head carries b's list and signature. */
    uint8_t *t = sp_xmalloc(a.lens[0]);
    memcpy(t, a.bufs[0], a.lens[0]);
    size_t tail = 64 + 2 + 2 + 2 + 3 * 32; /* 11, 14, 15 after the canonical bytes */
    assert_true(b.lens[0] >= tail && a.lens[0] >= tail);
    memcpy(t + a.lens[0] - tail, b.bufs[0] + b.lens[0] - tail, tail);
    sp_envelope_t *te = decode(t, a.lens[0]);
    assert_int_equal(sp_envelope_verify(ring, NULL, te, t, a.lens[0], 0), SP_ESIGNATURE);
    sp_envelope_free(te);
    free(t);

    /* The list's signature made over the Merkle message of the same bytes: refused. */
    uint8_t msg[SP_SIG_MSG_LEN], sig[SP_SIG_LEN], root[32];
    sp_sha256(ha->sig_leaves.data, ha->sig_leaves.len, root);
    sp_sig_message(3, root, msg);
    assert_int_equal(sp_sign(key, msg, sizeof(msg), sig), 0);
    t = sp_xmalloc(a.lens[0]);
    memcpy(t, a.bufs[0], a.lens[0]);
    uint8_t *sigpos = memmem(t, a.lens[0], ha->signature.data, SP_SIG_LEN);
    assert_non_null(sigpos);
    memcpy(sigpos, sig, SP_SIG_LEN);
    te = decode(t, a.lens[0]);
    assert_int_equal(sp_envelope_verify(ring, NULL, te, t, a.lens[0], 0), SP_ESIGNATURE);
    sp_envelope_free(te);
    free(t);

    /* A member is no signature on its own: SP_EHEADED for a known signer, refused as unknown
     * otherwise; the trust check's name for it is bad_signature. */
    assert_int_equal(sp_envelope_verify(ring, NULL, m1, a.bufs[1], a.lens[1], 0), SP_EHEADED);
    assert_string_equal(sp_trust_refusal_name(SP_EHEADED), "bad_signature");
    char *signer = m1->signer;
    m1->signer = "worker-w9";
    assert_int_equal(sp_envelope_verify(ring, NULL, m1, a.bufs[1], a.lens[1], 0), SP_ESIGNER);
    m1->signer = signer;
    (void)reason;
    sp_envelope_free(ha);
    sp_envelope_free(hb);
    sp_envelope_free(hc);
    sp_envelope_free(m1);
    batch_free(&a);
    batch_free(&b);
    batch_free(&c);
}

/* The schema bounds the new fields before any hashing. */
static void test_schema(void **state)
{
    char reason[SP_REASON_MAX];
    batch_t a;
    (void)state;
    headed_make(&a, 3, "v", "worker-w1", key);
    sp_envelope_t *h = decode(a.bufs[0], a.lens[0]), *m = decode(a.bufs[1], a.lens[1]);
    assert_int_equal(sp_envelope_validate(h, reason), 0);
    assert_int_equal(sp_envelope_validate(m, reason), 0);
    h->sig_count = 4; /* the list says 3 */
    assert_int_equal(sp_envelope_validate(h, reason), SP_ESCHEMA);
    h->sig_count = 3;
    h->sig_leaves.len = 33;
    assert_int_equal(sp_envelope_validate(h, reason), SP_ESCHEMA);
    h->sig_leaves.len = 96;
    ProtobufCBinaryData h_head = h->sig_head;
    h->sig_head = m->sig_head; /* a head that names a head */
    assert_int_equal(sp_envelope_validate(h, reason), SP_ESCHEMA);
    h->sig_head = h_head;
    m->signature = h->signature; /* a member with a signature and a head */
    assert_int_equal(sp_envelope_validate(m, reason), SP_ESCHEMA);
    m->signature.len = 0;
    m->signature.data = NULL;
    m->sig_head.len = 15; /* not an event id */
    assert_int_equal(sp_envelope_validate(m, reason), SP_ESCHEMA);
    m->sig_head.len = 16;
    sp_envelope_free(h);
    sp_envelope_free(m);
    batch_free(&a);
}

/* Only the subjects the event log alone reads are signed this way; the scheduler's, the
 * workers' and egressd's durables read the sandbox subjects. */
static void test_log_only(void **state)
{
    (void)state;
    assert_true(sp_subject_log_only("space.ev.io.w1.sbx_1.CommandOutput"));
    assert_true(sp_subject_log_only("space.ev.wkr.w1.WorkerHeartbeat"));
    assert_true(sp_subject_log_only("space.ev.egress.sbx_1.EgressAllowed"));
    assert_true(sp_subject_log_only("space.ev.cred.acme.CredentialUsed"));
    assert_false(sp_subject_log_only("space.ev.sbx.w1.sbx_1.SandboxStarted"));
    assert_false(sp_subject_log_only("space.ev.sbx._.sbx_1.SandboxCreateRequested"));
    assert_false(sp_subject_log_only("space.io.wkr.w1.exec"));
    assert_false(sp_subject_log_only("space.ev"));
    assert_false(sp_subject_log_only(NULL));
}

/* The producer's choice (sp_publish_sign_burst): all log-only -> headed chunks of
 * SP_SIG_HEADED_DEFAULT; any other subject -> Merkle batches; and the bytes per member. */
static void test_burst_choice(void **state)
{
    const size_t n = SP_SIG_HEADED_DEFAULT + 3;
    const char **subj = sp_xcalloc(n, sizeof(*subj));
    bool *heads = sp_xcalloc(n, sizeof(*heads));
    batch_t b, m;
    (void)state;
    members_make(&b, n, "p");
    members_make(&m, n, "q");
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(sp_envelope_encode(b.envs[i], &b.bufs[i], &b.lens[i]), 0);
        assert_int_equal(sp_envelope_encode(m.envs[i], &m.bufs[i], &m.lens[i]), 0);
        subj[i] = "space.ev.io.w1.sbx_p.CommandOutput";
    }
    size_t *plain = sp_xcalloc(n, sizeof(*plain));
    for (size_t i = 0; i < n; i++)
        plain[i] = b.lens[i];
    sp_publish_signer_set("worker-w1", key);
    assert_int_equal(sp_publish_sign_burst(b.bufs, b.lens, subj, n, heads), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(heads[i], i == 0 || i == SP_SIG_HEADED_DEFAULT);
    assert_int_equal(judge(b.bufs[0], b.lens[0], b.bufs[5], b.lens[5], NULL), 0);
    assert_int_equal(judge(b.bufs[SP_SIG_HEADED_DEFAULT], b.lens[SP_SIG_HEADED_DEFAULT],
                           b.bufs[n - 1], b.lens[n - 1], NULL),
                     0);
    subj[7] = "space.ev.sbx.w1.sbx_q.SandboxStarted";
    assert_int_equal(sp_publish_sign_burst(m.bufs, m.lens, subj, n, heads), 0);
    for (size_t i = 0; i < n; i++) {
        assert_false(heads[i]);
        sp_envelope_t *e = decode(m.bufs[i], m.lens[i]);
        assert_int_equal(e->signature.len, SP_SIG_LEN);
        assert_int_equal(sp_envelope_verify(ring, NULL, e, m.bufs[i], m.lens[i], 0), 0);
        sp_envelope_free(e);
    }
    sp_publish_signer_set(NULL, NULL);
    /* What signing adds per event, the heads (a list of 32 bytes per member) included,
     * against the same events' Merkle batches of 64 (66 + 6 x 32 + index and count). */
    size_t headed = 0, merkle = 0;
    for (size_t i = 0; i < n; i++) {
        headed += b.lens[i] - plain[i];
        merkle += m.lens[i] - plain[i];
    }
    print_message("bytes per event over unsigned: headed +%.1f, Merkle +%.1f\n",
                  (double)headed / (double)n, (double)merkle / (double)n);
    assert_true(headed < (size_t)100 * n);
    assert_true(merkle > (size_t)240 * n);
    free(plain);
    free(subj);
    free(heads);
    batch_free(&b);
    batch_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),     cmocka_unit_test(test_tamper),
        cmocka_unit_test(test_forgeries), cmocka_unit_test(test_schema),
        cmocka_unit_test(test_log_only),  cmocka_unit_test(test_burst_choice),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
