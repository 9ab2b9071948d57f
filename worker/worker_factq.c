/* The command facts queue (worker.h): CommandStarted, CommandOutput and CommandExited leave
 * the agent's reader thread as encoded envelopes and reach the stream from one thread of
 * their own, in the order they were queued.
 *
 * Why: a command's facts used to be published synchronously on the reader thread, each
 * waiting for the stream's ack, while the command ran. On this project's 2-core machines the
 * cost was not the waits (they overlap the command) but the work they set off at the same time
 * as the guest's process spawn: the stream storing, the event log fetching and committing.
 * Measured through HTTP, `echo hi` took ~1.1 ms longer with those facts than without
 * (docs/machine-notes.md, "exec latency"). So a fact is queued with a hold: it goes out when
 * its hold ends, or earlier with a later fact whose hold ends first. CommandStarted and
 * CommandOutput are held WK_FACT_HOLD_MS, a command's CommandExited only WK_FACT_END_MS: a
 * short command's facts go out together, after the worker has told the gateway that the
 * command ended (IoExit on the data plane) and while the gateway answers, in one pipelined
 * batch the event log stores in one transaction. A long command's CommandStarted reaches the
 * log at most WK_FACT_HOLD_MS late; occurred_at is the time it was queued, not published.
 *
 * Order and exactly once: one thread publishes, a batch at a time, in queue order, pipelined
 * (asynchronous publishes on the one connection, which the server stores in the order it
 * receives them), and waits for every ack of the batch. A batch with any failure (a refusal, a
 * timeout, no JetStream) is published again whole after a backoff: the facts carry message
 * ids derived from the command (worker_commands.c), so the stream drops the ones it already
 * has, and what it lacked lands after the ones before it. This is the worker's only user of
 * asynchronous publishing: sp_bus_publish_async_complete counts the connection's failures.
 *
 * Bounds: at most WK_FACT_ITEMS facts or WK_FACT_BYTES bytes wait; wk_factq_push then blocks
 * until the queue drains (the reader thread stops reading the agent, whose pipe fills: the
 * guest's output waits, nothing is dropped). While NATS is slow or away the queue retries each
 * batch with a backoff (STALL_MIN_MS doubling up to STALL_MAX_MS) for as long as the worker
 * runs; a stopping worker gives the queue STOP_DRAIN_MS, then logs what it drops. Before, a
 * fact that could not be published within the bus timeout was dropped at once. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "log.h"
#include "publish.h"
#include "worker.h"
#include "xmalloc.h"

#define BATCH_MAX     256
#define STALL_MIN_MS  100
#define STALL_MAX_MS  2000
#define STOP_DRAIN_MS 5000
#define ACK_WAIT_MS   5000

typedef struct fact fact_t;
struct fact {
    fact_t *next;
    int64_t ready_ns; /* its hold ends: it goes out then, with every fact queued before it */
    char subject[SP_PUBLISH_SUBJECT_MAX];
    char msg_id[WK_FACT_MSG_ID_MAX];
    size_t len;
    uint8_t data[];
};

struct wk_factq {
    sp_bus_t *bus;
    char worker[65];
    pthread_t thread;
    pthread_mutex_t mu;  /* guards what follows */
    pthread_cond_t work; /* the publisher: something was queued or released, or the stop */
    pthread_cond_t room; /* pushers and syncers: a batch was published */
    fact_t *head, *tail;
    size_t items, bytes;   /* queued or being published */
    uint64_t pushed, done; /* facts queued and published (or dropped at the stop), ever */
    bool stopping;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* An absolute CLOCK_MONOTONIC time for pthread_cond_timedwait (both condition variables
 * use that clock). */
static struct timespec abs_time(int64_t mono)
{
    return (struct timespec){.tv_sec = mono / 1000000000, .tv_nsec = mono % 1000000000};
}

static void free_list(fact_t *f)
{
    while (f) {
        fact_t *n = f->next;
        free(f);
        f = n;
    }
}

/* Publishes a batch pipelined and waits for its acks: 0, or < 0 when any failed. */
static int publish_batch(wk_factq_t *q, const fact_t *batch)
{
    int rc = 0;
    for (const fact_t *f = batch; f && rc == 0; f = f->next)
        rc = sp_bus_publish_async(q->bus, f->subject, f->data, f->len, f->msg_id);
    /* Even after a failed call, the ones before it are in flight: wait for them too. */
    int failed = sp_bus_publish_async_complete(q->bus, ACK_WAIT_MS);
    if (rc == 0 && failed > 0)
        rc = SP_EBUS;
    else if (rc == 0 && failed < 0)
        rc = failed;
    return rc;
}

/* Under mu: takes the facts that are to go out now off the queue, at most BATCH_MAX: up to the
 * last one whose hold is over (all of them when stopping). NULL when none is; then
 * *ret_wait_ns is when the first hold ends (0: no fact waits). */
static fact_t *take_ready(wk_factq_t *q, int64_t now, int64_t *ret_wait_ns, size_t *ret_n)
{
    fact_t *last = NULL;
    int64_t next = 0;
    for (fact_t *f = q->head; f; f = f->next) {
        if (f->ready_ns <= now || q->stopping)
            last = f;
        else if (next == 0 || f->ready_ns < next)
            next = f->ready_ns;
    }
    *ret_wait_ns = next;
    *ret_n = 0;
    if (!last)
        return NULL;
    fact_t *batch = q->head, *end = batch;
    size_t n = 1;
    while (end != last && n < BATCH_MAX) {
        end = end->next;
        n++;
    }
    q->head = end->next;
    if (!q->head)
        q->tail = NULL;
    end->next = NULL;
    *ret_n = n;
    return batch;
}

static void *publisher_main(void *arg)
{
    wk_factq_t *q = arg;
    int stall_ms = STALL_MIN_MS;
    int64_t stop_deadline = 0;

    pthread_mutex_lock(&q->mu);
    for (;;) {
        int64_t now = mono_ns(), wait_ns = 0;
        size_t n = 0, bytes = 0;
        if (q->stopping && stop_deadline == 0)
            stop_deadline = now + (int64_t)STOP_DRAIN_MS * 1000000;
        fact_t *batch = take_ready(q, now, &wait_ns, &n);
        if (!batch) {
            if (q->stopping)
                break; /* nothing left */
            if (wait_ns) {
                struct timespec ts = abs_time(wait_ns);
                pthread_cond_timedwait(&q->work, &q->mu, &ts);
            } else {
                pthread_cond_wait(&q->work, &q->mu);
            }
            continue;
        }
        for (const fact_t *f = batch; f; f = f->next)
            bytes += f->len;
        pthread_mutex_unlock(&q->mu);

        int rc;
        while ((rc = publish_batch(q, batch)) < 0) {
            if (stop_deadline && mono_ns() >= stop_deadline)
                break;
            sp_log(SP_LOG_WARN, "command facts not recorded yet; retrying", SP_KU("facts", n),
                   SP_KI("retry_ms", stall_ms), SP_KS("error", sp_strerror(rc)));
            nanosleep(&(struct timespec){.tv_sec = stall_ms / 1000,
                                         .tv_nsec = (long)(stall_ms % 1000) * 1000000},
                      NULL);
            stall_ms = stall_ms * 2 > STALL_MAX_MS ? STALL_MAX_MS : stall_ms * 2;
            pthread_mutex_lock(&q->mu);
            if (q->stopping && stop_deadline == 0)
                stop_deadline = mono_ns() + (int64_t)STOP_DRAIN_MS * 1000000;
            pthread_mutex_unlock(&q->mu);
        }
        if (rc < 0)
            sp_log(SP_LOG_ERROR,
                   "command facts dropped: the worker stops and NATS does not take them",
                   SP_KU("facts", n), SP_KS("error", sp_strerror(rc)));
        else
            stall_ms = STALL_MIN_MS;
        free_list(batch);

        pthread_mutex_lock(&q->mu);
        q->items -= n;
        q->bytes -= bytes;
        q->done += n;
        pthread_cond_broadcast(&q->room);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int wk_factq_new(sp_bus_t *bus, const char *worker, wk_factq_t **ret)
{
    wk_factq_t *q = sp_xcalloc(1, sizeof(*q));
    q->bus = bus;
    snprintf(q->worker, sizeof(q->worker), "%s", worker);
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->work, &ca);
    pthread_cond_init(&q->room, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&q->thread, NULL, publisher_main, q);
    if (rc != 0) {
        pthread_cond_destroy(&q->work);
        pthread_cond_destroy(&q->room);
        pthread_mutex_destroy(&q->mu);
        free(q);
        return -rc;
    }
    *ret = q;
    return 0;
}

int wk_factq_push(wk_factq_t *q, sp_envelope_t *env, const char *msg_id, int hold_ms)
{
    char id[37], subject[SP_PUBLISH_SUBJECT_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = sp_publish_encode(env, id, q->worker, subject, &buf, &len);
    if (rc < 0)
        return rc;
    fact_t *f = sp_xmalloc(sizeof(*f) + len);
    memcpy(f->data, buf, len);
    free(buf);
    f->len = len;
    f->next = NULL;
    memcpy(f->subject, subject, sizeof(subject));
    snprintf(f->msg_id, sizeof(f->msg_id), "%s", msg_id ? msg_id : id);
    int64_t now = mono_ns();
    f->ready_ns = now + (int64_t)hold_ms * 1000000;

    pthread_mutex_lock(&q->mu);
    while (!q->stopping && (q->items >= WK_FACT_ITEMS || q->bytes + len > WK_FACT_BYTES))
        pthread_cond_wait(&q->room, &q->mu);
    if (q->stopping) {
        pthread_mutex_unlock(&q->mu);
        free(f);
        return -ECANCELED;
    }
    if (q->tail)
        q->tail->next = f;
    else
        q->head = f;
    q->tail = f;
    q->items++;
    q->bytes += len;
    q->pushed++;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int wk_factq_sync(wk_factq_t *q, int timeout_ms)
{
    if (!q)
        return 0;
    struct timespec deadline = abs_time(mono_ns() + (int64_t)timeout_ms * 1000000);
    int rc = 0;
    pthread_mutex_lock(&q->mu);
    uint64_t want = q->pushed;
    for (fact_t *f = q->head; f; f = f->next)
        f->ready_ns = 0;
    pthread_cond_signal(&q->work);
    while (q->done < want && rc == 0) {
        if (pthread_cond_timedwait(&q->room, &q->mu, &deadline) == ETIMEDOUT && q->done < want)
            rc = SP_ETIMEOUT;
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

void wk_factq_free(wk_factq_t *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stopping = true;
    pthread_cond_broadcast(&q->work);
    pthread_cond_broadcast(&q->room);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    free_list(q->head);
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->room);
    pthread_mutex_destroy(&q->mu);
    free(q);
}
