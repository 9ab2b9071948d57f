/* The bus against a real nats-server with JetStream: stream creation, idempotent publish,
 * bounded async publish, ordered delivery from a chosen sequence, redelivery of unacked
 * batches, reading one message back.
 *
 * The stack may be shared with running daemons (the event log consumes SPACE_EVENTS and may
 * append rejections), so every subject lives under a per-run prefix, every durable has a
 * per-run name, and sequences are compared with the ones this test saw, never assumed to be
 * contiguous in the stream. The stack is the one the CTest fixture started (harness.h).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "bus.h"
#include "error.h"
#include "harness.h"

#define N_BULK 5000

static sp_bus_t *bus;
static char run[32];
static uint64_t bulk_seq[N_BULK];

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* "space.ev.test.<run>.<suffix>" in a static rotating buffer. */
static const char *subj(const char *suffix)
{
    static char bufs[4][128];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof(bufs[0]), "space.ev.test.%s.%s", run, suffix);
    return b;
}

static const char *durable(const char *what)
{
    static char bufs[4][64];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof(bufs[0]), "test_%s_%s", run, what);
    return b;
}

static int setup(void **state)
{
    sp_test_stack_load();
    snprintf(run, sizeof(run), "r%ld_%ld", (long)getpid(), (long)time(NULL));
    /* As the test identity (harness.h): the operator, which may use any subject. */
    bus = sp_test_bus();
    return 0;
}

static int teardown(void **state)
{
    if (bus) {
        const char *names[] = {"empty",     "dup",     "bulk", "bulk2",
                               "redeliver", "ackwait", "wake", "retry"};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            sp_bus_consumer_delete(bus, durable(names[i]));
    }
    sp_bus_free(bus);
    bus = NULL;
    return 0;
}

static void test_ensure_stream_idempotent(void **state)
{
    uint64_t last1, msgs1, last2, msgs2;

    assert_int_equal(sp_bus_ensure_stream(bus), 0);
    assert_int_equal(sp_bus_stream_info(bus, &last1, &msgs1), 0);
    assert_int_equal(sp_bus_ensure_stream(bus), 0);
    assert_int_equal(sp_bus_stream_info(bus, &last2, &msgs2), 0);
    /* Left alone: nothing purged (daemons on a shared stack may only add). */
    assert_true(last2 >= last1);
    assert_true(msgs2 >= msgs1);
}

static void test_fetch_empty_times_out(void **state)
{
    sp_bus_consumer_t *c = NULL;
    sp_bus_batch_t *b = NULL;

    assert_int_equal(sp_bus_consumer_open(bus, durable("empty"), subj("empty"), 0, 0, &c), 0);
    int64_t t0 = mono_ms();
    assert_int_equal(sp_bus_fetch(c, 100, 500, &b), 0);
    int64_t took = mono_ms() - t0;
    assert_non_null(b);
    assert_int_equal(sp_bus_batch_len(b), 0);
    assert_null(sp_bus_batch_msg(b, 0));
    assert_int_equal(sp_bus_batch_ack(b), 0);
    assert_true(took >= 400 && took < 3000);
    sp_bus_batch_free(b);

    /* A batch of one takes the same path. */
    assert_int_equal(sp_bus_fetch(c, 1, 200, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 0);
    sp_bus_batch_free(b);
    sp_bus_consumer_free(c);
}

static void test_duplicate_stored_once(void **state)
{
    char id[96];
    uint64_t seq1 = 0, seq2 = 0;
    int dup1 = -1, dup2 = -1;
    sp_bus_consumer_t *c = NULL;
    sp_bus_batch_t *b = NULL;

    snprintf(id, sizeof(id), "bus-rt-%s-dup", run);
    assert_int_equal(sp_bus_publish(bus, subj("dup"), "first", 5, id, &seq1, &dup1), 0);
    assert_true(seq1 > 0);
    assert_int_equal(dup1, 0);
    assert_int_equal(sp_bus_publish(bus, subj("dup"), "second", 6, id, &seq2, &dup2), 0);
    assert_int_equal(dup2, 1);
    assert_int_equal(seq2, seq1);

    /* Output parameters are optional. */
    assert_int_equal(sp_bus_publish(bus, subj("dup"), "second", 6, id, NULL, NULL), 0);

    assert_int_equal(sp_bus_consumer_open(bus, durable("dup"), subj("dup"), 0, 0, &c), 0);
    assert_int_equal(sp_bus_fetch(c, 10, 1000, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 1);
    const sp_bus_msg_t *m = sp_bus_batch_msg(b, 0);
    assert_int_equal(m->stream_seq, seq1);
    assert_int_equal(m->len, 5);
    assert_memory_equal(m->data, "first", 5);
    assert_string_equal(m->subject, subj("dup"));
    assert_int_equal(m->delivered, 1);
    int64_t skew = m->published_ns - wall_ns();
    assert_true(skew < 5000000000LL && skew > -60000000000LL);
    int64_t fetched_ns = m->published_ns;
    assert_int_equal(sp_bus_batch_ack(b), 0);
    sp_bus_batch_free(b);
    sp_bus_consumer_free(c);

    /* Read back by sequence. */
    char *subject = NULL;
    uint8_t *data = NULL;
    size_t len = 0;
    int64_t pub_ns = 0;
    assert_int_equal(sp_bus_get_msg(bus, seq1, &subject, &data, &len, &pub_ns), 0);
    assert_string_equal(subject, subj("dup"));
    assert_int_equal(len, 5);
    assert_memory_equal(data, "first", 5);
    assert_int_equal(pub_ns, fetched_ns);
    free(subject);
    free(data);

    uint64_t last = 0;
    assert_int_equal(sp_bus_stream_info(bus, &last, NULL), 0);
    subject = NULL;
    assert_int_equal(sp_bus_get_msg(bus, last + 1000000, &subject, &data, &len, &pub_ns),
                     SP_ENOTFOUND);
    assert_null(subject);
}

static void test_async_failure_counted(void **state)
{
    /* No stream captures this subject: the server answers "no responders". */
    char s[128];
    snprintf(s, sizeof(s), "space.test.%s.nostream", run);
    assert_int_equal(sp_bus_publish_async(bus, s, "x", 1, NULL), 0);
    assert_int_equal(sp_bus_publish_async_complete(bus, 5000), 1);
    /* The count is reset once reported. */
    assert_int_equal(sp_bus_publish_async_complete(bus, 5000), 0);
}

/* Fetches until n messages of the given consumer arrived (acking each batch) and checks
 * them against bulk index first..first+n-1. */
static void drain_bulk(sp_bus_consumer_t *c, size_t first, size_t n, int record)
{
    size_t got = 0;
    uint64_t prev = 0;
    int64_t deadline = mono_ms() + 60000;

    while (got < n) {
        sp_bus_batch_t *b = NULL;
        assert_true(mono_ms() < deadline);
        assert_int_equal(sp_bus_fetch(c, 1000, 2000, &b), 0);
        assert_true(sp_bus_batch_len(b) <= 1000);
        for (size_t i = 0; i < sp_bus_batch_len(b); i++) {
            const sp_bus_msg_t *m = sp_bus_batch_msg(b, i);
            size_t k = first + got;
            char want[32];
            int wl = snprintf(want, sizeof(want), "bulk-%zu", k);
            assert_true(got < n);
            assert_int_equal(m->len, (size_t)wl);
            assert_memory_equal(m->data, want, (size_t)wl);
            assert_string_equal(m->subject, subj(k % 2 ? "bulk.odd" : "bulk.even"));
            assert_int_equal(m->delivered, 1);
            assert_true(m->stream_seq > prev);
            prev = m->stream_seq;
            if (record)
                bulk_seq[k] = m->stream_seq;
            else
                assert_int_equal(m->stream_seq, bulk_seq[k]);
            got++;
        }
        assert_int_equal(sp_bus_batch_ack(b), 0);
        sp_bus_batch_free(b);
    }
}

static void test_async_bulk_in_order(void **state)
{
    char id[96], data[32];
    sp_bus_consumer_t *c = NULL;
    sp_bus_batch_t *b = NULL;

    for (size_t i = 0; i < N_BULK; i++) {
        int n = snprintf(data, sizeof(data), "bulk-%zu", i);
        snprintf(id, sizeof(id), "bus-rt-%s-bulk-%zu", run, i);
        assert_int_equal(
            sp_bus_publish_async(bus, subj(i % 2 ? "bulk.odd" : "bulk.even"), data, (size_t)n, id),
            0);
    }
    assert_int_equal(sp_bus_publish_async_complete(bus, 30000), 0);

    assert_int_equal(sp_bus_consumer_open(bus, durable("bulk"), subj("bulk.>"), 0, 0, &c), 0);
    drain_bulk(c, 0, N_BULK, 1);
    /* Everything acked: nothing more. */
    assert_int_equal(sp_bus_fetch(c, 1000, 300, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 0);
    sp_bus_batch_free(b);
    sp_bus_consumer_free(c);

    /* Reopening at a sequence starts exactly there, whatever the durable had acked. */
    size_t k = 2500;
    assert_int_equal(sp_bus_consumer_open(bus, durable("bulk"), subj("bulk.>"), bulk_seq[k], 0, &c),
                     0);
    assert_int_equal(sp_bus_fetch(c, 1, 2000, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 1);
    assert_int_equal(sp_bus_batch_msg(b, 0)->stream_seq, bulk_seq[k]);
    sp_bus_batch_free(b); /* not acked: reopening below discards the delivery state */
    sp_bus_consumer_free(c);

    assert_int_equal(sp_bus_consumer_open(bus, durable("bulk"), subj("bulk.>"), bulk_seq[k], 0, &c),
                     0);
    drain_bulk(c, k, N_BULK - k, 0);
    assert_int_equal(sp_bus_fetch(c, 1000, 300, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 0);
    sp_bus_batch_free(b);
    sp_bus_consumer_free(c);

    /* A start sequence between two of ours (another subject's message, or a gap) starts at
     * the next one that matches the filter. */
    assert_int_equal(
        sp_bus_consumer_open(bus, durable("bulk2"), subj("bulk.odd"), bulk_seq[10], 0, &c), 0);
    assert_int_equal(sp_bus_fetch(c, 2, 2000, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 2);
    assert_int_equal(sp_bus_batch_msg(b, 0)->stream_seq, bulk_seq[11]);
    assert_int_equal(sp_bus_batch_msg(b, 1)->stream_seq, bulk_seq[13]);
    sp_bus_batch_free(b);
    sp_bus_consumer_free(c);
}

/* A batch says how many of the consumer's messages the server still had to deliver after its
 * last one; the event log asks for exactly that backlog (eventlog/main.c, consume). Merged
 * batches say what the later one said. */
static void test_batch_pending(void **state)
{
    char id[96], data[16];
    sp_bus_consumer_t *c = NULL;
    sp_bus_batch_t *b = NULL, *more = NULL;

    for (int i = 0; i < 10; i++) {
        int n = snprintf(data, sizeof(data), "p-%d", i);
        snprintf(id, sizeof(id), "bus-rt-%s-pending-%d", run, i);
        assert_int_equal(sp_bus_publish_async(bus, subj("pending"), data, (size_t)n, id), 0);
    }
    assert_int_equal(sp_bus_publish_async_complete(bus, 30000), 0);
    assert_int_equal(sp_bus_consumer_open(bus, durable("pending"), subj("pending"), 0, 0, &c), 0);

    assert_int_equal(sp_bus_fetch(c, 4, 2000, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 4);
    assert_int_equal(sp_bus_batch_pending(b), 6);
    assert_int_equal(sp_bus_fetch(c, 2, 2000, &more), 0);
    assert_int_equal(sp_bus_batch_pending(more), 4);
    assert_int_equal(sp_bus_batch_merge(b, &more), 0);
    assert_int_equal(sp_bus_batch_len(b), 6);
    assert_int_equal(sp_bus_batch_pending(b), 4);
    assert_int_equal(sp_bus_batch_ack(b), 0);
    sp_bus_batch_free(b);

    /* Asked for exactly what waits: all of it, and nothing left. */
    assert_int_equal(sp_bus_fetch(c, 4, 2000, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 4);
    assert_memory_equal(sp_bus_batch_msg(b, 3)->data, "p-9", 3);
    assert_int_equal(sp_bus_batch_pending(b), 0);
    assert_int_equal(sp_bus_batch_ack(b), 0);
    sp_bus_batch_free(b);

    /* An empty batch has nothing behind it either. */
    assert_int_equal(sp_bus_fetch(c, 10, 200, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 0);
    assert_int_equal(sp_bus_batch_pending(b), 0);
    sp_bus_batch_free(b);
    sp_bus_consumer_free(c);
}

static void test_unacked_redelivered(void **state)
{
    sp_bus_consumer_t *c = NULL;
    sp_bus_batch_t *b = NULL;
    uint64_t seqs[3];

    for (int i = 0; i < 3; i++)
        assert_int_equal(sp_bus_publish(bus, subj("redeliver"), "r", 1, NULL, &seqs[i], NULL), 0);
    assert_int_equal(sp_bus_consumer_open(bus, durable("redeliver"), subj("redeliver"), 0, 500, &c),
                     0);

    /* A partial batch comes back at once, not after the timeout. */
    int64_t t0 = mono_ms();
    assert_int_equal(sp_bus_fetch(c, 1000, 5000, &b), 0);
    assert_true(mono_ms() - t0 < 2000);
    assert_int_equal(sp_bus_batch_len(b), 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(sp_bus_batch_msg(b, i)->stream_seq, seqs[i]);
        assert_int_equal(sp_bus_batch_msg(b, i)->delivered, 1);
    }
    sp_bus_batch_free(b); /* no ack */

    /* After ack_wait (500 ms) the same messages come again, delivered twice. */
    assert_int_equal(sp_bus_fetch(c, 1000, 5000, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(sp_bus_batch_msg(b, i)->stream_seq, seqs[i]);
        assert_int_equal(sp_bus_batch_msg(b, i)->delivered, 2);
    }
    assert_int_equal(sp_bus_batch_ack(b), 0);
    sp_bus_batch_free(b);

    /* Acked: nothing comes back, even after more than ack_wait. */
    assert_int_equal(sp_bus_fetch(c, 10, 1500, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 0);
    sp_bus_batch_free(b);

    /* The consumer may be freed before its last batch, which can still be acked. */
    uint64_t seq4 = 0;
    assert_int_equal(sp_bus_publish(bus, subj("redeliver"), "r", 1, NULL, &seq4, NULL), 0);
    assert_int_equal(sp_bus_fetch(c, 10, 2000, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 1);
    assert_int_equal(sp_bus_batch_msg(b, 0)->stream_seq, seq4);
    sp_bus_consumer_free(c);
    assert_int_equal(sp_bus_batch_ack(b), 0);
    sp_bus_batch_free(b);
}

/* A bound durable that exists keeps the ack wait it was made with, and says which: the worker
 * paces its "in progress" by it (worker_events.c), whatever it asked for. */
static void test_bound_durable_keeps_its_ack_wait(void **state)
{
    sp_bus_consumer_t *c = NULL;
    sp_bus_batch_t *b = NULL;
    (void)state;

    assert_int_equal(sp_bus_consumer_bind(bus, durable("ackwait"), subj("ackwait"), 700, &c), 0);
    assert_int_equal(sp_bus_consumer_ack_wait_ms(c), 700);
    sp_bus_consumer_free(c);
    assert_int_equal(sp_bus_consumer_bind(bus, durable("ackwait"), subj("ackwait"), 9000, &c), 0);
    assert_int_equal(sp_bus_consumer_ack_wait_ms(c), 700);
    /* And 700 ms is what the server does: an unacked message comes again well before 9 s. */
    assert_int_equal(sp_bus_publish(bus, subj("ackwait"), "a", 1, NULL, NULL, NULL), 0);
    assert_int_equal(sp_bus_fetch(c, 10, 2000, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 1);
    sp_bus_batch_free(b);
    int64_t t0 = mono_ms();
    assert_int_equal(sp_bus_fetch(c, 10, 5000, &b), 0);
    assert_int_equal(sp_bus_batch_len(b), 1);
    assert_int_equal(sp_bus_batch_msg(b, 0)->delivered, 2);
    assert_true(mono_ms() - t0 < 4000);
    assert_int_equal(sp_bus_batch_ack(b), 0);
    sp_bus_batch_free(b);
    sp_bus_consumer_free(c);
    /* A durable opened (recreated) has the ack wait asked for; 0 is 30 s. */
    assert_int_equal(sp_bus_consumer_open(bus, durable("ackwait"), subj("ackwait"), 0, 0, &c), 0);
    assert_int_equal(sp_bus_consumer_ack_wait_ms(c), 30000);
    sp_bus_consumer_free(c);
}

static void *publish_later(void *arg)
{
    (void)arg;
    nanosleep(&(struct timespec){.tv_nsec = 300L * 1000 * 1000}, NULL);
    sp_bus_publish(bus, subj("wake"), "w", 1, NULL, NULL, NULL);
    return NULL;
}

static void test_fetch_wakes_on_publish(void **state)
{
    sp_bus_consumer_t *c = NULL;
    sp_bus_batch_t *b = NULL;
    pthread_t th;

    assert_int_equal(sp_bus_consumer_open(bus, durable("wake"), subj("wake"), 0, 0, &c), 0);
    /* Publishing from another thread while this one waits in fetch. */
    assert_int_equal(pthread_create(&th, NULL, publish_later, NULL), 0);
    int64_t t0 = mono_ms();
    assert_int_equal(sp_bus_fetch(c, 1000, 10000, &b), 0);
    int64_t took = mono_ms() - t0;
    pthread_join(th, NULL);
    assert_int_equal(sp_bus_batch_len(b), 1);
    assert_memory_equal(sp_bus_batch_msg(b, 0)->data, "w", 1);
    assert_true(took < 5000);
    assert_int_equal(sp_bus_batch_ack(b), 0);
    sp_bus_batch_free(b);
    sp_bus_consumer_free(c);
}

static void test_publish_core_and_limits(void **state)
{
    char s[128];
    snprintf(s, sizeof(s), "space.io.test.%s", run);
    assert_int_equal(sp_bus_publish_core(bus, s, "io", 2), 0);
    static uint8_t big[SP_BUS_MAX_MSG + 1];
    assert_int_equal(sp_bus_publish(bus, subj("big"), big, sizeof(big), NULL, NULL, NULL),
                     SP_ETOOBIG);
    assert_int_equal(sp_bus_publish_core(bus, s, big, sizeof(big)), SP_ETOOBIG);
}

typedef struct {
    char id[96];
    int rc;
    uint64_t seq;
} retry_t;

static void *retry_main(void *arg)
{
    retry_t *r = arg;
    r->rc = sp_bus_publish_retry(bus, subj("retry"), "kept", 4, r->id, 30000, &r->seq);
    return NULL;
}

/* sp_bus_publish_retry (bus.h) rides out nats-server's death: what was published while it was
 * away is in the stream once it is back, once. Without the bus for longer than its budget, it
 * gives up with a bus error. Last: the server restarts under the other tests' connections. */
static void test_publish_retry_rides_out_a_restart(void **state)
{
    retry_t r = {.rc = 1};
    snprintf(r.id, sizeof(r.id), "bus-rt-%s-retry", run);

    sp_test_daemon_kill9("nats-server");
    int64_t t0 = mono_ms();
    int rc = sp_bus_publish_retry(bus, subj("retry"), "lost", 4, "bus-rt-lost", 1000, NULL);
    assert_true(rc == SP_EBUS || rc == SP_ETIMEOUT);
    assert_true(mono_ms() - t0 < 15000);

    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, retry_main, &r), 0);
    sleep(1);
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    pthread_join(t, NULL);
    assert_int_equal(r.rc, 0);
    assert_true(r.seq > 0);

    /* Stored once, with the bytes sent. (The publish that gave up may be there too: a request
     * cnats held while it reconnected goes out after, and a client's timeout says nothing of
     * the server. That is why a retry keeps its msg_id.) */
    sp_bus_consumer_t *c = NULL;
    sp_bus_batch_t *b = NULL;
    assert_int_equal(sp_bus_consumer_open(bus, durable("retry"), subj("retry"), 0, 0, &c), 0);
    assert_int_equal(sp_bus_fetch(c, 10, 1000, &b), 0);
    int kept = 0;
    for (size_t i = 0; i < sp_bus_batch_len(b); i++) {
        const sp_bus_msg_t *m = sp_bus_batch_msg(b, i);
        assert_int_equal(m->len, 4);
        if (memcmp(m->data, "kept", 4) == 0) {
            kept++;
            assert_int_equal(m->stream_seq, r.seq);
        } else {
            assert_memory_equal(m->data, "lost", 4);
        }
    }
    assert_int_equal(kept, 1);
    assert_int_equal(sp_bus_batch_ack(b), 0);
    sp_bus_batch_free(b);
    sp_bus_consumer_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ensure_stream_idempotent),
        cmocka_unit_test(test_fetch_empty_times_out),
        cmocka_unit_test(test_duplicate_stored_once),
        cmocka_unit_test(test_async_failure_counted),
        cmocka_unit_test(test_async_bulk_in_order),
        cmocka_unit_test(test_batch_pending),
        cmocka_unit_test(test_unacked_redelivered),
        cmocka_unit_test(test_bound_durable_keeps_its_ack_wait),
        cmocka_unit_test(test_fetch_wakes_on_publish),
        cmocka_unit_test(test_publish_core_and_limits),
        cmocka_unit_test(test_publish_retry_rides_out_a_restart),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
