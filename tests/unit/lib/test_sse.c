/* sp_sse: the event-stream reader the CLI and tests use on the gateway's SSE: line ends of
 * every kind, multi-line data, comments, ids that persist, input split at every byte, and the
 * bound on a line; and the record writer the gateway uses, read back by the reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "buf.h"
#include "error.h"
#include "sse.h"

/* Each event as "id|event|data;" */
static int collect(void *arg, const sp_sse_event_t *ev)
{
    sp_buf_t *b = arg;
    assert_int_equal(strlen(ev->data), ev->data_len);
    sp_buf_printf(b, "%s|%s|%s;", ev->id, ev->event, ev->data);
    return 0;
}

static const char STREAM[] = ": keepalive\r\n\r\n"
                             "event: start\ndata: {\"cmd_id\":\"c\"}\n\n"
                             "id: 1\revent: stdout\rdata: line one\rdata: line two\r\r"
                             "id: 2\r\nevent:stderr\r\ndata:x\r\n\r\n"
                             "data: no name\n\n"
                             "event: ignored-without-data\n\n"
                             "unknown: field\nretry: 10\ndata\n\n";

static void test_stream(void **state)
{
    sp_buf_t got;
    sp_buf_init(&got);
    sp_sse_reader_t r;
    sp_sse_init(&r, collect, &got);
    assert_int_equal(sp_sse_feed(&r, STREAM, sizeof(STREAM) - 1), 0);
    assert_string_equal(got.data, "|start|{\"cmd_id\":\"c\"};1|stdout|line one\nline two;"
                                  "2|stderr|x;2|message|no name;2|message|;");
    sp_sse_dispose(&r);
    sp_buf_dispose(&got);
}

/* Any split of the input gives the same events (a CR at the end of one piece and its LF at
 * the start of the next included). */
static void test_splits(void **state)
{
    sp_buf_t whole;
    sp_buf_init(&whole);
    sp_sse_reader_t r;
    sp_sse_init(&r, collect, &whole);
    sp_sse_feed(&r, STREAM, sizeof(STREAM) - 1);
    sp_sse_dispose(&r);
    for (size_t cut = 0; cut < sizeof(STREAM) - 1; cut++) {
        sp_buf_t got;
        sp_buf_init(&got);
        sp_sse_init(&r, collect, &got);
        assert_int_equal(sp_sse_feed(&r, STREAM, cut), 0);
        assert_int_equal(sp_sse_feed(&r, STREAM + cut, sizeof(STREAM) - 1 - cut), 0);
        assert_string_equal(got.data, whole.data);
        sp_sse_dispose(&r);
        sp_buf_dispose(&got);
    }
    sp_buf_dispose(&whole);
}

static int stop_at_second(void *arg, const sp_sse_event_t *ev)
{
    int *n = arg;
    (void)ev;
    return ++*n == 2 ? 7 : 0;
}

static void test_stop_and_bound(void **state)
{
    int n = 0;
    sp_sse_reader_t r;
    sp_sse_init(&r, stop_at_second, &n);
    assert_int_equal(sp_sse_feed(&r, "data: a\n\ndata: b\n\ndata: c\n\n", 27), 7);
    assert_int_equal(n, 2);
    sp_sse_dispose(&r);

    sp_sse_init(&r, stop_at_second, &n);
    static char big[1 << 20];
    memset(big, 'x', sizeof(big));
    int rc = 0;
    for (size_t total = 0; total <= SP_SSE_LINE_MAX && rc == 0; total += sizeof(big))
        rc = sp_sse_feed(&r, big, sizeof(big));
    assert_int_equal(rc, SP_ETOOBIG);
    sp_sse_dispose(&r);
}

/* The gateway's records, byte for byte, and what a reader makes of them. */
static void test_write(void **state)
{
    sp_buf_t b, got;
    sp_buf_init(&b);
    sp_buf_init(&got);
    sp_sse_record_begin(&b, 0, "start");
    sp_buf_puts(&b, "{\"cmd_id\":\"c\"}");
    sp_sse_record_end(&b);
    sp_buf_puts(&b, SP_SSE_KEEPALIVE);
    sp_sse_record_begin(&b, 18446744073709551615u, "stdout");
    sp_buf_puts(&b, "{\"text\":\"a\\nb\"}");
    sp_sse_record_end(&b);
    assert_string_equal(b.data, "event: start\ndata: {\"cmd_id\":\"c\"}\n\n"
                                ": keepalive\n\n"
                                "id: 18446744073709551615\nevent: stdout\n"
                                "data: {\"text\":\"a\\nb\"}\n\n");
    sp_sse_reader_t r;
    sp_sse_init(&r, collect, &got);
    assert_int_equal(sp_sse_feed(&r, b.data, b.len), 0);
    assert_string_equal(got.data, "|start|{\"cmd_id\":\"c\"};"
                                  "18446744073709551615|stdout|{\"text\":\"a\\nb\"};");
    sp_sse_dispose(&r);
    sp_buf_dispose(&got);
    sp_buf_dispose(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_splits),
        cmocka_unit_test(test_stop_and_bound),
        cmocka_unit_test(test_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
