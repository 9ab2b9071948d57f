/* The worker's command facts queue (worker/worker_factq.c) against a real nats-server with
 * JetStream: facts reach the stream in the order they were queued; a fact with a short hold
 * takes the held ones before it along (a command's CommandExited and its CommandStarted and
 * CommandOutput); a held fact waits, and wk_factq_sync or the queue's stop sends it at once; a
 * fact queued twice under one message id is stored once.
 *
 * Holds are long (10 s) where the test shows that something did NOT wait for them, so a busy
 * machine cannot make it pass or fail by timing. Every run uses its own worker token, so its
 * subjects (space.ev.sbx.<token>.> and space.ev.io.<token>.>) are its own in a shared stream.
 */
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
#include "envelope.h"
#include "error.h"
#include "harness.h"
#include "worker.h"

#define LONG_HOLD_MS 10000

static sp_bus_t *bus;
static char run[40];

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    snprintf(run, sizeof(run), "wfq%ld-%ld", (long)getpid(), (long)time(NULL));
    /* As the test identity (harness.h): the operator, which may use any subject. */
    bus = sp_test_bus();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    sp_bus_free(bus);
    bus = NULL;
    return 0;
}

/* A worker token of this run and test (also the durable's name). */
static const char *token(const char *test)
{
    static char buf[64];
    snprintf(buf, sizeof(buf), "%s-%s", run, test);
    return buf;
}

/* Queues one command fact of type pt (CommandStarted, CommandOutput or CommandExited). */
static void push(wk_factq_t *q, Space__V1__Envelope__PayloadCase pt, const char *msg_id,
                 int hold_ms)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__CommandStarted st = SPACE__V1__COMMAND_STARTED__INIT;
    Space__V1__CommandOutput out = SPACE__V1__COMMAND_OUTPUT__INIT;
    Space__V1__CommandExited ex = SPACE__V1__COMMAND_EXITED__INIT;
    agg.kind = "sandbox";
    agg.id = "sbx_factq";
    env.aggregate = &agg;
    env.tenant = "t1";
    env.actor = "svc:worker";
    env.payload_case = pt;
    st.cmd_id = out.cmd_id = ex.cmd_id = "cmd_factq";
    out.stream = 1;
    out.data = (ProtobufCBinaryData){3, (uint8_t *)"hi\n"};
    env.command_started = &st;
    if (pt == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT)
        env.command_output = &out;
    else if (pt == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED)
        env.command_exited = &ex;
    assert_int_equal(wk_factq_push(q, &env, msg_id, hold_ms), 0);
}

/* The types of what the stream holds under the test's token, in stream order, as
 * "Type,Type,...": once it holds at least want messages, or what it holds after timeout_ms. */
static void stored(const char *test, size_t want, int timeout_ms, char *out, size_t len)
{
    char filter[128], durable[64];
    struct timespec t0, now;
    snprintf(filter, sizeof(filter), "space.ev.*.%s.>", token(test)); /* sbx and io */
    snprintf(durable, sizeof(durable), "%s", token(test));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        sp_bus_consumer_t *c = NULL;
        sp_bus_batch_t *b = NULL;
        assert_int_equal(sp_bus_consumer_open(bus, durable, filter, 0, 0, &c), 0);
        assert_int_equal(sp_bus_fetch(c, 100, 200, &b), 0);
        size_t n = sp_bus_batch_len(b);
        out[0] = '\0';
        for (size_t i = 0; i < n; i++) {
            const char *s = sp_bus_batch_msg(b, i)->subject;
            const char *type = strrchr(s, '.');
            snprintf(out + strlen(out), len - strlen(out), "%s%s", i ? "," : "",
                     type ? type + 1 : s);
        }
        sp_bus_batch_free(b);
        sp_bus_consumer_free(c);
        sp_bus_consumer_delete(bus, durable);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (n >= want || ms >= timeout_ms)
            return;
        usleep(20 * 1000);
    }
}

static void test_exit_takes_held_facts_along(void **state)
{
    (void)state;
    wk_factq_t *q = NULL;
    char got[256];
    assert_int_equal(wk_factq_new(bus, token("along"), NULL, &q), 0);
    push(q, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED, "started:a", LONG_HOLD_MS);
    push(q, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT, "out:a:0", LONG_HOLD_MS);
    push(q, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED, "exited:a", 0);
    /* All three well before their 10 s hold, in the order queued. */
    stored("along", 3, 5000, got, sizeof(got));
    assert_string_equal(got, "CommandStarted,CommandOutput,CommandExited");
    wk_factq_free(q);
}

static void test_held_fact_waits_until_sync(void **state)
{
    (void)state;
    wk_factq_t *q = NULL;
    char got[256];
    assert_int_equal(wk_factq_new(bus, token("sync"), NULL, &q), 0);
    push(q, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED, "started:s", LONG_HOLD_MS);
    stored("sync", 0, 0, got, sizeof(got));
    assert_string_equal(got, "");
    assert_int_equal(wk_factq_sync(q, 5000), 0);
    stored("sync", 1, 1000, got, sizeof(got));
    assert_string_equal(got, "CommandStarted");
    wk_factq_free(q);
}

static void test_stop_sends_held_facts(void **state)
{
    (void)state;
    wk_factq_t *q = NULL;
    char got[256];
    assert_int_equal(wk_factq_new(bus, token("stop"), NULL, &q), 0);
    push(q, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED, "started:p", LONG_HOLD_MS);
    push(q, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT, "out:p:0", LONG_HOLD_MS);
    wk_factq_free(q);
    stored("stop", 2, 2000, got, sizeof(got));
    assert_string_equal(got, "CommandStarted,CommandOutput");
}

static void test_same_msg_id_stored_once(void **state)
{
    (void)state;
    wk_factq_t *q = NULL;
    char got[256];
    assert_int_equal(wk_factq_new(bus, token("dup"), NULL, &q), 0);
    /* What a batch retried after a lost ack looks like to the stream. */
    push(q, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED, "exited:d", 0);
    push(q, SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED, "exited:d", 0);
    assert_int_equal(wk_factq_sync(q, 5000), 0);
    stored("dup", 1, 1000, got, sizeof(got));
    assert_string_equal(got, "CommandExited");
    wk_factq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_takes_held_facts_along),
        cmocka_unit_test(test_held_fact_waits_until_sync),
        cmocka_unit_test(test_stop_sends_held_facts),
        cmocka_unit_test(test_same_msg_id_stored_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
