/* The checkpointer (eventlog.h, docs/audit.md): signs the log's head with the eventlog's own
 * key every checkpoint-events rows or checkpoint-ms, and publishes it outside PostgreSQL: to
 * SP_CKPT_STREAM, then, once the stream has it, to the checkpoint file.
 *
 * On a thread of its own, so that the storing thread never waits for a publish or an fsync:
 * it only notes the head after each commit (a copy under a mutex). A checkpoint names a head
 * that is committed, never one in progress.
 *
 * The file gets a line only after the stream acknowledged it (written, not synced: the stream
 * is the durable copy), so the file never holds a
 * checkpoint the stream lacks unless the stream lost it (what verify reports as a truncated
 * witness). A publish that failed is retried with the same line (same message id, so a publish
 * that did land but whose ack was lost is deduplicated by the stream) until a newer head
 * replaces it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "error.h"
#include "eventlog.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define RETRY_MS 1000

struct el_ckpt {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool running, stop;
    el_ckpt_opts_t o;
    int fd; /* the file, -1 for none */
    /* Under mu: the last head noted, and what was published last. */
    sp_ckpt_t noted;
    bool have;
    uint64_t published_seq;
    int64_t last_try_ns; /* monotonic: the last checkpoint published or tried */
    uint64_t made, failed;
};

/* Signs c, publishes it and appends it to the file. The line (kept in *line between calls)
 * is made once per checkpoint, so a retry sends the same bytes. */
static int publish(el_ckpt_t *k, const sp_ckpt_t *c, char line[SP_CKPT_LINE_MAX], int *len)
{
    char msg_id[64];
    int rc;

    if (*len <= 0 && (*len = sp_ckpt_format(c, k->o.key, line)) < 0)
        return *len;
    snprintf(msg_id, sizeof(msg_id), "ckpt-%" PRIu64 "-%" PRId64, c->seq, c->at_us);
    if ((rc = sp_bus_publish(k->o.bus, SP_CKPT_SUBJECT, line, (size_t)*len, msg_id, NULL, NULL)) <
        0)
        return rc;
    /* No fsync per line: the stream is the durable copy (the file follows it, and may lag
     * it after a crash of the host), and an fdatasync here would contend with PostgreSQL's
     * WAL flushes on the same disk. The file is synced when the log stops. */
    if (k->fd >= 0) {
        ssize_t w = write(k->fd, line, (size_t)*len);
        if (w != *len)
            sp_log(SP_LOG_WARN, "cannot append the checkpoint to the file",
                   SP_KS("file", k->o.file), SP_KS("error", strerror(w < 0 ? errno : EIO)),
                   SP_KU("seq", c->seq));
    }
    return 0;
}

static void *ckpt_main(void *arg)
{
    el_ckpt_t *k = arg;
    char line[SP_CKPT_LINE_MAX];
    int len = 0;       /* > 0: line holds pending, made but not published yet */
    sp_ckpt_t pending; /* the checkpoint of line */

    memset(&pending, 0, sizeof(pending));
    pthread_mutex_lock(&k->mu);
    for (;;) {
        int64_t now = sp_mono_ns();
        bool fresh = k->have && k->noted.seq > k->published_seq;
        bool by_count =
            k->o.every_events > 0 && k->noted.seq - k->published_seq >= (uint64_t)k->o.every_events;
        bool by_time = k->o.interval_ms > 0 && now - k->last_try_ns >= k->o.interval_ms * 1000000LL;
        /* After a failure, wait RETRY_MS before the next try (stopping: one more try). */
        bool backoff = len > 0 && now - k->last_try_ns < RETRY_MS * 1000000LL;
        if (fresh && (k->stop || (!backoff && (by_count || by_time || len > 0)))) {
            if (len == 0 || pending.seq != k->noted.seq) {
                /* A newer head: a new line replaces one never published. */
                pending = k->noted;
                pending.at_us = sp_now_us();
                len = 0;
            }
            sp_ckpt_t c = pending;
            pthread_mutex_unlock(&k->mu);
            int rc = publish(k, &c, line, &len);
            pthread_mutex_lock(&k->mu);
            k->last_try_ns = sp_mono_ns();
            if (rc == 0) {
                k->published_seq = c.seq;
                k->made++;
                len = 0;
                sp_log(SP_LOG_DEBUG, "checkpoint", SP_KU("seq", c.seq), SP_KU("rows", c.rows));
            } else {
                if (len < 0)
                    len = 0; /* not even signed: nothing to retry with */
                if (k->failed++ % 60 == 0)
                    sp_log(SP_LOG_WARN, "cannot publish a checkpoint; retrying",
                           SP_KS("error", sp_strerror(rc)), SP_KU("seq", c.seq),
                           SP_KU("failures", k->failed));
                if (k->stop)
                    break; /* stopping: the last try was made */
            }
            continue;
        }
        if (k->stop)
            break;
        /* Wake for the next interval (or a retry); a count threshold signals. */
        int64_t wait_ms = k->o.interval_ms > 0 ? k->o.interval_ms : RETRY_MS;
        if (len > 0 && wait_ms > RETRY_MS)
            wait_ms = RETRY_MS;
        int64_t due = k->last_try_ns + wait_ms * 1000000LL - now;
        if (due < 1000000)
            due = 1000000;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = (int64_t)ts.tv_nsec + due;
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&k->cv, &k->mu, &ts);
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

int el_ckpt_new(const el_ckpt_opts_t *o, el_ckpt_t **ret)
{
    el_ckpt_t *k;
    int rc;

    if (!o || !o->bus || !o->key || !o->signer || !ret)
        return -EINVAL;
    k = sp_xcalloc(1, sizeof(*k));
    k->o = *o;
    k->fd = -1;
    if (o->file && o->file[0]) {
        /* The directory of a default path (space up: $SPACE_HOME/audit) may not exist yet. */
        char *dir = sp_xstrdup(o->file), *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
            *slash = '\0';
            (void)mkdir(dir, 0755);
        }
        free(dir);
        k->fd = open(o->file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (k->fd < 0) {
            rc = -errno;
            free(k);
            return rc;
        }
    }
    snprintf(k->noted.signer, sizeof(k->noted.signer), "%s", o->signer);
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->last_try_ns = sp_mono_ns();
    if ((rc = pthread_create(&k->th, NULL, ckpt_main, k)) != 0) {
        el_ckpt_free(k);
        return -rc;
    }
    k->running = true;
    *ret = k;
    return 0;
}

void el_ckpt_note(el_ckpt_t *k, uint64_t seq, uint64_t rows, const uint8_t head[SP_SHA256_LEN],
                  uint64_t verify_from)
{
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    k->noted.seq = seq;
    k->noted.rows = rows;
    memcpy(k->noted.head, head, SP_SHA256_LEN);
    k->noted.verify_from = verify_from;
    k->have = true;
    if (k->o.every_events > 0 && seq - k->published_seq >= (uint64_t)k->o.every_events)
        pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

uint64_t el_ckpt_made(el_ckpt_t *k)
{
    uint64_t n = 0;
    if (!k)
        return 0;
    pthread_mutex_lock(&k->mu);
    n = k->made;
    pthread_mutex_unlock(&k->mu);
    return n;
}

void el_ckpt_free(el_ckpt_t *k)
{
    if (!k)
        return;
    if (k->running) {
        pthread_mutex_lock(&k->mu);
        k->stop = true;
        pthread_cond_signal(&k->cv);
        pthread_mutex_unlock(&k->mu);
        pthread_join(k->th, NULL);
    }
    if (k->fd >= 0) {
        (void)fdatasync(k->fd);
        close(k->fd);
    }
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k);
}
