/* The verifier pool (eventlog.h): decoding and signature verification of the next fetched
 * batch, on threads of their own, while the consuming thread stores the current batch.
 *
 * Why: the consuming thread spends most of a batch waiting for PostgreSQL; verification on it
 * came on top of that wait (~4 us per batch member of hashing, ~180 us per Ed25519 on the
 * measured VM, docs/trust.md "Cost in the event log"). Here it overlaps the wait, and a burst
 * of envelopes signed alone (one Ed25519 each) spreads over the cores.
 *
 * Work goes out in chunks claimed under the pool's mutex, tagged with the job's generation,
 * so a thread that wakes late for a finished job cannot touch the next one. Members of one
 * batch signature verified on several threads at once still cost one Ed25519 between them:
 * the signature cache makes the others wait for the first (sign.h). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "eventlog.h"
#include "xmalloc.h"

/* Most messages a thread claims at once: enough to keep the mutex out of the profile (a
 * chunk is >= 16 x ~4 us), few enough that a 1000-message batch spreads over the threads. */
#define CHUNK_MAX 16

struct el_pool {
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was started, or stop */
    pthread_cond_t idle; /* the job's last message is prepared */
    pthread_t *th;
    size_t n_th;
    bool stop;
    /* The job, under mu. */
    uint64_t gen;
    el_prep_t *items;
    size_t n, next, remaining, chunk;
    const sp_trust_t *trust;
};

el_batch_t *el_batch_new(sp_bus_batch_t **batch)
{
    el_batch_t *b = sp_xcalloc(1, sizeof(*b));

    b->batch = *batch;
    *batch = NULL;
    b->n = sp_bus_batch_len(b->batch);
    b->items = sp_xcalloc(b->n ? b->n : 1, sizeof(*b->items));
    for (size_t i = 0; i < b->n; i++)
        b->items[i].msg = sp_bus_batch_msg(b->batch, i);
    return b;
}

void el_batch_free(el_batch_t *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->n; i++)
        sp_envelope_free(b->items[i].env);
    free(b->items);
    sp_bus_batch_free(b->batch);
    free(b);
}

void el_prep_one(el_prep_t *it, const sp_trust_t *trust)
{
    const sp_bus_msg_t *m = it->msg;

    it->sig_rc = 0;
    it->rc = sp_envelope_decode(m->data, m->len, &it->env, it->reason);
    if (it->rc < 0)
        return;
    it->rc = sp_envelope_check_subject(it->env, m->subject, it->reason);
    if (it->rc < 0 || !trust)
        return;
    el_prep_verify(it, trust);
}

void el_prep_verify(el_prep_t *it, const sp_trust_t *trust)
{
    const sp_bus_msg_t *m = it->msg;

    it->sig_rc = sp_trust_verify(trust, it->env, m->data, m->len, m->published_ns, it->reason);
    if (it->sig_rc == SP_EHEADED && sp_envelope_leaf(m->data, m->len, it->leaf) < 0)
        it->sig_rc = SP_ESIGNATURE; /* cannot happen: it decoded */
}

/* Claims the next chunk of job gen: false when the job is done or another one runs. */
static bool claim(el_pool_t *p, uint64_t gen, size_t *ret_lo, size_t *ret_hi)
{
    bool got = false;

    pthread_mutex_lock(&p->mu);
    if (p->gen == gen && p->next < p->n) {
        *ret_lo = p->next;
        p->next = p->next + p->chunk < p->n ? p->next + p->chunk : p->n;
        *ret_hi = p->next;
        got = true;
    }
    pthread_mutex_unlock(&p->mu);
    return got;
}

/* Prepares chunks of job gen until none is left. items and trust belong to that job; claim()
 * keeps them valid: the job cannot end before the chunks it handed out are reported done. */
static void run_job(el_pool_t *p, uint64_t gen, el_prep_t *items, const sp_trust_t *trust)
{
    size_t lo, hi;

    while (claim(p, gen, &lo, &hi)) {
        for (size_t i = lo; i < hi; i++)
            el_prep_one(&items[i], trust);
        pthread_mutex_lock(&p->mu);
        p->remaining -= hi - lo;
        if (p->remaining == 0)
            pthread_cond_broadcast(&p->idle);
        pthread_mutex_unlock(&p->mu);
    }
}

static void *pool_main(void *arg)
{
    el_pool_t *p = arg;
    uint64_t seen = 0;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && (p->gen == seen || p->next >= p->n))
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        el_prep_t *items = p->items;
        const sp_trust_t *trust = p->trust;
        pthread_mutex_unlock(&p->mu);
        run_job(p, seen, items, trust);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int el_pool_new(size_t threads, el_pool_t **ret_pool)
{
    el_pool_t *p;

    if (threads == 0 || threads > 64 || !ret_pool)
        return -EINVAL;
    p = sp_xcalloc(1, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    p->th = sp_xcalloc(threads, sizeof(*p->th));
    for (; p->n_th < threads; p->n_th++) {
        int rc = pthread_create(&p->th[p->n_th], NULL, pool_main, p);
        if (rc != 0) {
            el_pool_free(p);
            return -rc;
        }
    }
    *ret_pool = p;
    return 0;
}

void el_pool_free(el_pool_t *p)
{
    if (!p)
        return;
    el_pool_wait(p);
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->n_th; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p);
}

void el_pool_start(el_pool_t *p, el_batch_t *b, const sp_trust_t *trust)
{
    /* Small chunks for small batches, so that even a few envelopes signed alone (one Ed25519
     * each) are verified on several threads. */
    size_t chunk = b->n / (4 * (p->n_th + 1));

    pthread_mutex_lock(&p->mu);
    p->gen++;
    p->items = b->items;
    p->n = b->n;
    p->next = 0;
    p->remaining = b->n;
    p->chunk = chunk < 1 ? 1 : chunk > CHUNK_MAX ? CHUNK_MAX : chunk;
    p->trust = trust;
    if (b->n > 0)
        pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
}

void el_pool_wait(el_pool_t *p)
{
    uint64_t gen;
    el_prep_t *items;
    const sp_trust_t *trust;

    pthread_mutex_lock(&p->mu);
    gen = p->gen;
    items = p->items;
    trust = p->trust;
    pthread_mutex_unlock(&p->mu);
    /* The consuming thread has nothing better to do than to help. */
    run_job(p, gen, items, trust);
    pthread_mutex_lock(&p->mu);
    while (p->remaining > 0)
        pthread_cond_wait(&p->idle, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
