/* Publishing events (publish.h). */
#include "publish.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"
#include "error.h"
#include "xmalloc.h"

/* Set once at startup, before publishing threads exist (publish.h). */
static const char *signer_name;
static const sp_sign_key_t *signer_key;

void sp_publish_signer_set(const char *identity, const sp_sign_key_t *key)
{
    signer_name = key ? identity : NULL;
    signer_key = key;
}

const char *sp_publish_signer(void)
{
    return signer_name;
}

const sp_sign_key_t *sp_publish_signer_key(void)
{
    return signer_key;
}

int sp_publish_pack(sp_envelope_t *env, uint8_t **ret_buf, size_t *ret_len)
{
    if (signer_key)
        return sp_envelope_encode_signed(env, signer_name, signer_key, ret_buf, ret_len);
    return sp_envelope_encode(env, ret_buf, ret_len);
}

int sp_publish_encode(sp_envelope_t *env, char id_buf[37], const char *worker,
                      char subject[SP_PUBLISH_SUBJECT_MAX], uint8_t **ret_buf, size_t *ret_len)
{
    int rc;

    sp_envelope_stamp(env, id_buf);
    if ((rc = sp_envelope_subject(env, worker, subject, SP_PUBLISH_SUBJECT_MAX)) < 0)
        return rc;
    return sp_publish_pack(env, ret_buf, ret_len);
}

/* Encodes env and publishes it, trying again for budget_ms (0: once). */
static int publish(sp_bus_t *bus, sp_envelope_t *env, char id_buf[37], const char *worker,
                   const char *msg_id, int budget_ms, uint64_t *ret_seq)
{
    char subject[SP_PUBLISH_SUBJECT_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc;

    if ((rc = sp_publish_encode(env, id_buf, worker, subject, &buf, &len)) < 0)
        return rc;
    rc = sp_bus_publish_retry(bus, subject, buf, len, msg_id ? msg_id : env->event_id, budget_ms,
                              ret_seq);
    free(buf);
    return rc;
}

int sp_publish_event(sp_bus_t *bus, sp_envelope_t *env, char id_buf[37], const char *worker,
                     const char *msg_id, uint64_t *ret_seq)
{
    return publish(bus, env, id_buf, worker, msg_id, 0, ret_seq);
}

int sp_publish_event_retry(sp_bus_t *bus, sp_envelope_t *env, char id_buf[37], const char *worker,
                           const char *msg_id, int budget_ms)
{
    return publish(bus, env, id_buf, worker, msg_id, budget_ms, NULL);
}

void sp_envelope_answer(sp_envelope_t *env, Space__V1__Aggregate *agg, const sp_envelope_t *cause,
                        const char *actor)
{
    space__v1__envelope__init(env);
    space__v1__aggregate__init(agg);
    agg->kind = cause->aggregate->kind;
    agg->id = cause->aggregate->id;
    env->aggregate = agg;
    env->tenant = cause->tenant;
    env->actor = (char *)actor;
    env->correlation_id = cause->correlation_id;
    env->causation_id = cause->event_id;
}

static int sign_encoded(uint8_t **in, size_t *in_lens, size_t n, const char *signer,
                        const sp_sign_key_t *key, bool headed)
{
    sp_envelope_t **envs;
    uint8_t **bufs;
    size_t *lens, decoded = 0;
    char reason[SP_REASON_MAX];
    int rc = 0;

    if (!in || !in_lens || n == 0 || n > SP_SIG_BATCH_MAX)
        return -EINVAL;
    envs = sp_xcalloc(n, sizeof(sp_envelope_t *));
    bufs = sp_xcalloc(n, sizeof(*bufs));
    lens = sp_xcalloc(n, sizeof(*lens));
    for (; decoded < n; decoded++)
        if ((rc = sp_envelope_decode(in[decoded], in_lens[decoded], &envs[decoded], reason)) < 0)
            goto out;
    /* Signing points the decoded envelopes' signature fields elsewhere; keep what the
     * unpacker allocated so that it frees its own. */
    sp_envelope_t *saved = sp_xcalloc(n, sizeof(*saved));
    for (size_t i = 0; i < n; i++)
        saved[i] = *envs[i];
    rc = headed ? sp_envelope_encode_signed_headed(envs, n, signer, key, bufs, lens)
                : sp_envelope_encode_signed_batch(envs, n, signer, key, bufs, lens);
    for (size_t i = 0; i < n; i++) {
        envs[i]->signer = saved[i].signer;
        envs[i]->signature = saved[i].signature;
        envs[i]->sig_proof = saved[i].sig_proof;
        envs[i]->sig_index = saved[i].sig_index;
        envs[i]->sig_count = saved[i].sig_count;
        envs[i]->sig_leaves = saved[i].sig_leaves;
        envs[i]->sig_head = saved[i].sig_head;
    }
    free(saved);
    if (rc < 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        free(in[i]);
        in[i] = bufs[i];
        in_lens[i] = lens[i];
    }
out:
    for (size_t i = 0; i < decoded; i++)
        sp_envelope_free(envs[i]);
    free(envs);
    free(bufs);
    free(lens);
    return rc;
}

int sp_envelope_sign_encoded(uint8_t **in, size_t *in_lens, size_t n, const char *signer,
                             const sp_sign_key_t *key)
{
    return sign_encoded(in, in_lens, n, signer, key, false);
}

int sp_envelope_sign_encoded_headed(uint8_t **in, size_t *in_lens, size_t n, const char *signer,
                                    const sp_sign_key_t *key)
{
    return sign_encoded(in, in_lens, n, signer, key, true);
}

/* Whether every subject is one only the event log reads (contract.h). */
static bool all_log_only(const char *const *subjects, size_t n)
{
    if (!subjects)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!sp_subject_log_only(subjects[i]))
            return false;
    return true;
}

/* bufs[0..n) as Merkle batches of at most SP_SIG_BATCH_DEFAULT by the process's signer. */
static int sign_merkle(uint8_t **bufs, size_t *lens, size_t n)
{
    for (size_t off = 0; off < n; off += SP_SIG_BATCH_DEFAULT) {
        size_t k = n - off < SP_SIG_BATCH_DEFAULT ? n - off : SP_SIG_BATCH_DEFAULT;
        int rc = sp_envelope_sign_encoded(bufs + off, lens + off, k, signer_name, signer_key);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int sp_publish_sign_burst(uint8_t **bufs, size_t *lens, const char *const *subjects, size_t n,
                          bool *heads)
{
    bool headed = n >= 2 && all_log_only(subjects, n);

    if (heads)
        memset(heads, 0, n * sizeof(*heads));
    if (!signer_key)
        return 0;
    if (!headed)
        return sign_merkle(bufs, lens, n);
    for (size_t off = 0; off < n; off += SP_SIG_HEADED_DEFAULT) {
        size_t k = n - off < SP_SIG_HEADED_DEFAULT ? n - off : SP_SIG_HEADED_DEFAULT;
        int rc = SP_ETOOBIG;
        if (k >= 2)
            rc =
                sp_envelope_sign_encoded_headed(bufs + off, lens + off, k, signer_name, signer_key);
        if (rc == 0 && heads)
            heads[off] = true;
        /* A chunk of one, or a head that would not fit with its list: Merkle batches. */
        if (rc == SP_ETOOBIG)
            rc = sign_merkle(bufs + off, lens + off, k);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int sp_publish_burst_async(sp_bus_t *bus, uint8_t **bufs, size_t *lens, const char *const *subjects,
                           const char *const *msg_ids, size_t n, bool wait_heads)
{
    bool *heads = sp_xcalloc(n ? n : 1, sizeof(*heads));
    int first = n ? sp_publish_sign_burst(bufs, lens, subjects, n, heads) : 0;

    for (size_t i = 0; i < n && first == 0; i++) {
        int rc;
        if (heads[i] && wait_heads) {
            /* Acked before its members go: in the stream, a head precedes its batch. */
            rc = sp_bus_publish(bus, subjects[i], bufs[i], lens[i], msg_ids[i], NULL, NULL);
            if (rc < 0) {
                first = rc;
                break; /* its members would be refused: the caller publishes again */
            }
            continue;
        }
        rc = sp_bus_publish_async(bus, subjects[i], bufs[i], lens[i], msg_ids[i]);
        if (rc < 0 && first == 0)
            first = rc;
    }
    free(heads);
    return first;
}

void sp_burst_init(sp_burst_t *b)
{
    memset(b, 0, sizeof(*b));
}

int sp_burst_add_msg(sp_burst_t *b, sp_envelope_t *env, const char *worker, const char *msg_id,
                     char id_buf[37])
{
    char id[37], subject[SP_PUBLISH_SUBJECT_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    if (msg_id && strlen(msg_id) >= SP_PUBLISH_MSGID_MAX)
        return -EINVAL;
    sp_envelope_stamp(env, id);
    int rc = sp_envelope_subject(env, worker, subject, sizeof(subject));
    if (rc >= 0)
        rc = sp_envelope_encode(env, &buf, &len);
    if (rc < 0)
        return rc;
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 16;
        b->bufs = sp_xreallocarray(b->bufs, b->cap, sizeof(*b->bufs));
        b->lens = sp_xreallocarray(b->lens, b->cap, sizeof(*b->lens));
        b->subjects = sp_xreallocarray(b->subjects, b->cap, sizeof(*b->subjects));
        b->msg_ids = sp_xreallocarray(b->msg_ids, b->cap, sizeof(*b->msg_ids));
    }
    b->bufs[b->n] = buf;
    b->lens[b->n] = len;
    memcpy(b->subjects[b->n], subject, sizeof(subject));
    snprintf(b->msg_ids[b->n], sizeof(b->msg_ids[b->n]), "%s", msg_id ? msg_id : id);
    if (id_buf)
        memcpy(id_buf, id, sizeof(id));
    b->n++;
    return 0;
}

int sp_burst_add(sp_burst_t *b, sp_envelope_t *env, const char *worker)
{
    return sp_burst_add_msg(b, env, worker, NULL, NULL);
}

int sp_burst_publish_async(sp_bus_t *bus, sp_burst_t *b)
{
    const char **subjects = sp_xcalloc(b->n ? b->n : 1, sizeof(*subjects));
    const char **msg_ids = sp_xcalloc(b->n ? b->n : 1, sizeof(*msg_ids));
    for (size_t i = 0; i < b->n; i++) {
        subjects[i] = b->subjects[i];
        msg_ids[i] = b->msg_ids[i];
    }
    /* Heads not waited for: in order on the one connection, the stream stores a head before
     * its members; the callers (egressd's flushes on its event loop, the scheduler) do not
     * publish again, so a head lost with the connection costs its members (stored rejected,
     * naming the head) as a lost publish cost the event before, without stalling the loop. */
    int first = sp_publish_burst_async(bus, b->bufs, b->lens, subjects, msg_ids, b->n, false);
    free(subjects);
    free(msg_ids);
    for (size_t i = 0; i < b->n; i++)
        free(b->bufs[i]);
    b->n = 0;
    return first;
}

void sp_burst_dispose(sp_burst_t *b)
{
    for (size_t i = 0; i < b->n; i++)
        free(b->bufs[i]);
    free(b->bufs);
    free(b->lens);
    free(b->subjects);
    free(b->msg_ids);
    memset(b, 0, sizeof(*b));
}
