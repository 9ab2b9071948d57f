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
 * fact that could not be published within the bus timeout was dropped at once.
 *
 * The journal: a fact is appended to a file in the worker's state directory when it is
 * queued, before the gateway hears of what it records (worker_commands.c queues CommandExited
 * before the IoExit), and the file is emptied whenever everything queued is published. A
 * worker killed with facts queued publishes the journal's facts at its next start, the same
 * bytes with the same message ids: the stream drops those it has (within its duplicate
 * window; beyond it the event log stores a copy as rejected, "replayed"). write() without
 * fsync: it survives the process (kill -9, a crash), not the host; a host that dies takes
 * its sandboxes and their commands with it. A journal past JOURNAL_COMPACT_BYTES while the
 * queue never empties is rewritten with only what is still queued. Record: u32 length of the
 * rest, u16 subject length, subject, u16 message id length, message id, the envelope. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "fdio.h"
#include "log.h"
#include "publish.h"
#include "worker.h"
#include "xmalloc.h"

#define BATCH_MAX             256
#define STALL_MIN_MS          100
#define STALL_MAX_MS          2000
#define STOP_DRAIN_MS         5000
#define ACK_WAIT_MS           5000
#define JOURNAL_COMPACT_BYTES (64 * 1024 * 1024)

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
    int journal;        /* -1: none */
    char *journal_path; /* for the compaction's rename */
    uint64_t journal_bytes;
    fact_t *inflight; /* the batch being published (still journaled) */
    bool dropped;     /* a batch was given up at the stop: the journal is kept whole */
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

/* ---- the journal ---- */

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Appends f to fd; the bytes written. */
static int journal_append(int fd, const fact_t *f, uint64_t *ret_bytes)
{
    size_t ls = strlen(f->subject), lm = strlen(f->msg_id);
    size_t rest = 2 + ls + 2 + lm + f->len;
    uint8_t *rec = sp_xmalloc(4 + rest), *p = rec;
    put_u32(p, (uint32_t)rest);
    p += 4;
    *p++ = (uint8_t)(ls >> 8), *p++ = (uint8_t)ls;
    memcpy(p, f->subject, ls);
    p += ls;
    *p++ = (uint8_t)(lm >> 8), *p++ = (uint8_t)lm;
    memcpy(p, f->msg_id, lm);
    p += lm;
    memcpy(p, f->data, f->len);
    int rc = sp_write_all(fd, rec, 4 + rest);
    free(rec);
    if (rc == 0)
        *ret_bytes += 4 + rest;
    return rc;
}

/* Under mu: the journal holds exactly what is queued or in flight again (a rewrite). */
static void journal_compact(wk_factq_t *q)
{
    char *tmp = sp_xasprintf("%s.new", q->journal_path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    uint64_t bytes = 0;
    int rc = fd < 0 ? -errno : 0;
    for (const fact_t *f = q->inflight; f && rc == 0; f = f->next)
        rc = journal_append(fd, f, &bytes);
    for (const fact_t *f = q->head; f && rc == 0; f = f->next)
        rc = journal_append(fd, f, &bytes);
    if (rc == 0 && rename(tmp, q->journal_path) < 0)
        rc = -errno;
    if (rc == 0) {
        close(q->journal);
        q->journal = fd;
        (void)lseek(fd, 0, SEEK_END);
        q->journal_bytes = bytes;
    } else {
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        sp_log(SP_LOG_WARN, "cannot compact the facts journal", SP_KS("error", sp_strerror(rc)));
    }
    free(tmp);
}

/* Publishes what a previous process left in the journal at path, then empties it. Each
 * record as it was queued, in order; the stream drops duplicates by message id. */
static int journal_replay(sp_bus_t *bus, const char *path, int fd)
{
    off_t size = lseek(fd, 0, SEEK_END);
    if (size <= 0)
        return 0;
    uint8_t *buf = sp_xmalloc((size_t)size);
    if (pread(fd, buf, (size_t)size, 0) != size) {
        free(buf);
        return -EIO;
    }
    size_t off = 0, n = 0, bad = 0;
    int rc = 0;
    while (off + 4 <= (size_t)size && rc == 0) {
        size_t rest = get_u32(buf + off);
        if (rest < 4 || off + 4 + rest > (size_t)size) {
            bad++; /* a record cut short by the kill: it was never acknowledged to anyone */
            break;
        }
        const uint8_t *p = buf + off + 4, *end = p + rest;
        size_t ls = (size_t)p[0] << 8 | p[1];
        char subject[SP_PUBLISH_SUBJECT_MAX], msg_id[WK_FACT_MSG_ID_MAX];
        if (2 + ls + 2 > rest || ls >= sizeof(subject)) {
            bad++;
            break;
        }
        memcpy(subject, p + 2, ls);
        subject[ls] = '\0';
        p += 2 + ls;
        size_t lm = (size_t)p[0] << 8 | p[1];
        if (p + 2 + lm > end || lm >= sizeof(msg_id)) {
            bad++;
            break;
        }
        memcpy(msg_id, p + 2, lm);
        msg_id[lm] = '\0';
        p += 2 + lm;
        /* Journaled unsigned: signed (alone, a replay is rare) as it goes out. */
        size_t blen = (size_t)(end - p);
        uint8_t *one = sp_xmalloc(blen ? blen : 1);
        memcpy(one, p, blen);
        rc = sp_publish_sign_burst(&one, &blen, NULL, 1, NULL);
        if (rc == 0)
            rc = sp_bus_publish(bus, subject, one, blen, msg_id, NULL, NULL);
        free(one);
        n++;
        off += 4 + rest;
    }
    free(buf);
    sp_log(rc < 0 ? SP_LOG_ERROR : SP_LOG_INFO,
           rc < 0 ? "facts of the previous run not published: kept for the next start"
                  : "facts of the previous run published",
           SP_KS("journal", path), SP_KU("facts", n), SP_KU("cut_short", bad),
           SP_KS("error", rc < 0 ? sp_strerror(rc) : ""));
    if (rc == 0 && ftruncate(fd, 0) < 0)
        rc = -errno;
    return rc;
}

/* Signs a batch as bursts and publishes it pipelined (sp_publish_burst_async: command facts
 * are read by the event log alone, so they go as headed batches, each head acked before its
 * members) and waits for its acks: 0, or < 0 when any failed. The queued facts stay unsigned
 * (a retry signs again). */
static int publish_batch(wk_factq_t *q, const fact_t *batch)
{
    size_t n = 0, k = 0;
    for (const fact_t *f = batch; f; f = f->next)
        n++;
    uint8_t **bufs = sp_xcalloc(n ? n : 1, sizeof(*bufs));
    size_t *lens = sp_xcalloc(n ? n : 1, sizeof(*lens));
    const char **subjects = sp_xcalloc(n ? n : 1, sizeof(*subjects));
    const char **msg_ids = sp_xcalloc(n ? n : 1, sizeof(*msg_ids));
    for (const fact_t *f = batch; f; f = f->next, k++) {
        bufs[k] = sp_xmalloc(f->len);
        memcpy(bufs[k], f->data, f->len);
        lens[k] = f->len;
        subjects[k] = f->subject;
        msg_ids[k] = f->msg_id;
    }
    int rc = sp_publish_burst_async(q->bus, bufs, lens, subjects, msg_ids, n, true);
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(lens);
    free(subjects);
    free(msg_ids);
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
        q->inflight = batch;
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
                   "command facts not published: the worker stops and NATS does not take "
                   "them (the journal keeps them for the next start)",
                   SP_KU("facts", n), SP_KS("error", sp_strerror(rc)));
        else
            stall_ms = STALL_MIN_MS;
        pthread_mutex_lock(&q->mu);
        q->inflight = NULL;
        q->dropped |= rc < 0;
        free_list(batch);
        q->items -= n;
        q->bytes -= bytes;
        q->done += n;
        /* Everything queued is published (or, stopping, given up: logged above): the journal
         * has nothing left to say. */
        if (q->journal >= 0 && q->items == 0 && q->journal_bytes > 0 && !q->dropped) {
            if (ftruncate(q->journal, 0) == 0)
                q->journal_bytes = 0;
        } else if (q->journal >= 0 && !q->dropped && q->journal_bytes > JOURNAL_COMPACT_BYTES) {
            journal_compact(q);
        }
        pthread_cond_broadcast(&q->room);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int wk_factq_new(sp_bus_t *bus, const char *worker, const char *journal, wk_factq_t **ret)
{
    wk_factq_t *q = sp_xcalloc(1, sizeof(*q));
    q->bus = bus;
    q->journal = -1;
    if (journal) {
        q->journal = open(journal, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        int jr = q->journal < 0 ? -errno : journal_replay(bus, journal, q->journal);
        if (jr < 0) {
            if (q->journal >= 0)
                close(q->journal);
            free(q);
            return jr;
        }
        q->journal_path = sp_xstrdup(journal);
    }
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
        if (q->journal >= 0)
            close(q->journal);
        free(q->journal_path);
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
    /* Unsigned here: the publisher signs each batch it sends as one (sp_publish_sign_burst),
     * so a command's facts cost one Ed25519 signature between them, not one each. */
    sp_envelope_stamp(env, id);
    int rc = sp_envelope_subject(env, q->worker, subject, sizeof(subject));
    if (rc >= 0)
        rc = sp_envelope_encode(env, &buf, &len);
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
    if (q->journal >= 0 && (rc = journal_append(q->journal, f, &q->journal_bytes)) < 0)
        sp_log(SP_LOG_WARN, "cannot journal a fact: a crash before it is published loses it",
               SP_KS("error", sp_strerror(rc)));
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
    /* What is left was given up (logged): the journal keeps it for the next start. */
    if (q->journal >= 0)
        close(q->journal);
    free(q->journal_path);
    free_list(q->head);
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->room);
    pthread_mutex_destroy(&q->mu);
    free(q);
}
