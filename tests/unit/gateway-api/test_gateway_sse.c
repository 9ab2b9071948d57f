/* The gateway's stream writer (gateway-api/gateway_sse.c) against a fake h2o: one write in
 * flight and what queues meanwhile leaves at proceed, the three ways to end (after what is
 * queued, after the write in flight, now), the client going away, keepalives, the write
 * timeout, and the hang-up poll. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../../gateway-api/gateway_sse.c" /* NOLINT(bugprone-suspicious-include) */

#include <unistd.h>

#define SEC 1000000000LL

/* ---- the fake h2o and gateway: every write is recorded ---- */

static struct {
    sp_buf_t sent;  /* the bytes of every h2o_send, "|" after each, "FINAL" for the end */
    int sends;      /* h2o_send calls in progress state */
    int finals;     /* h2o_send calls in final state */
    int in_flight;  /* h2o_send calls not yet proceeded */
    int started;    /* h2o_start_response calls */
    int logged;     /* gw_log_request calls with 200 */
    int counted;    /* gw_metrics_request calls with 200 */
    int fd;         /* what gw_req_fd returns */
    char ctype[64]; /* the content type the response started with */
    h2o_generator_t *gen;
} fake;

void h2o_send(h2o_req_t *req, h2o_iovec_t *bufs, size_t bufcnt, h2o_send_state_t state)
{
    (void)req;
    for (size_t i = 0; i < bufcnt; i++)
        sp_buf_append(&fake.sent, bufs[i].base, bufs[i].len);
    if (state == H2O_SEND_STATE_FINAL) {
        sp_buf_puts(&fake.sent, "FINAL");
        fake.finals++;
        return;
    }
    sp_buf_putc(&fake.sent, '|');
    fake.sends++;
    fake.in_flight++;
}

void h2o_start_response(h2o_req_t *req, h2o_generator_t *generator)
{
    (void)req;
    fake.started++;
    fake.gen = generator;
}

void gw_add_common_headers(gw_req_t *rq, const char *content_type)
{
    (void)rq;
    snprintf(fake.ctype, sizeof(fake.ctype), "%s", content_type);
}

void gw_req_mark_streaming(gw_req_t *rq)
{
    rq->responded = true;
}

void gw_metrics_request(gw_metrics_t *m, gw_route_t route, int status)
{
    (void)m;
    (void)route;
    fake.counted += status == 200;
}

void gw_log_request(gw_req_t *rq, int status)
{
    (void)rq;
    fake.logged += status == 200;
}

int gw_req_fd(h2o_req_t *req)
{
    (void)req;
    return fake.fd;
}

/* h2o took the write in flight. */
static void proceed(void)
{
    assert_int_equal(fake.in_flight, 1);
    fake.in_flight--;
    fake.gen->proceed(fake.gen, NULL);
}

/* h2o says the client is gone. */
static void stop(void)
{
    fake.in_flight = 0;
    fake.gen->stop(fake.gen, NULL);
}

/* ---- an owner ---- */

typedef struct {
    gw_sse_t sse;
    int closed, written, keepalives, headers;
} owner_t;

static void on_closed(gw_sse_t *w)
{
    owner_t *o = H2O_STRUCT_FROM_MEMBER(owner_t, sse, w);
    assert_null(w->req);
    o->closed++;
}

static void on_written(gw_sse_t *w)
{
    H2O_STRUCT_FROM_MEMBER(owner_t, sse, w)->written++;
}

static void on_headers(gw_sse_t *w, h2o_req_t *req)
{
    (void)req;
    H2O_STRUCT_FROM_MEMBER(owner_t, sse, w)->headers++;
}

static void own_keepalive(gw_sse_t *w)
{
    H2O_STRUCT_FROM_MEMBER(owner_t, sse, w)->keepalives++;
    sp_buf_puts(&w->pending, "K");
}

static const gw_sse_ops_t plain_ops = {
    .headers = on_headers, .written = on_written, .closed = on_closed};
static const gw_sse_ops_t own_ops = {.keepalive = own_keepalive, .closed = on_closed};
static const gw_sse_ops_t hangup_ops = {.closed = on_closed, .poll_hangup = true};

static gw_config_t cfg = {.sse_keepalive_s = 15, .sse_write_timeout_s = 60};
static gw_t gw;
static gw_req_t rq;
static h2o_req_t req;

static int setup(void **state)
{
    (void)state;
    sp_buf_dispose(&fake.sent);
    memset(&fake, 0, sizeof(fake));
    fake.fd = -1;
    sp_buf_init(&fake.sent);
    memset(&gw, 0, sizeof(gw));
    gw.cfg = &cfg;
    memset(&rq, 0, sizeof(rq));
    rq.gw = &gw;
    rq.req = &req;
    memset(&req, 0, sizeof(req));
    req.http1_is_persistent = 1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    sp_buf_dispose(&fake.sent);
    return 0;
}

static void start(owner_t *o, const gw_sse_ops_t *ops)
{
    memset(o, 0, sizeof(*o));
    gw_sse_init(&o->sse);
    gw_sse_start(&o->sse, &rq, "text/event-stream", ops);
}

static void queue(owner_t *o, const char *record)
{
    sp_buf_puts(&o->sse.pending, record);
}

/* Started, with the record "a" in flight. */
static void start_writing(owner_t *o, const gw_sse_ops_t *ops)
{
    start(o, ops);
    queue(o, "a");
    assert_true(gw_sse_flush(&o->sse));
    assert_int_equal(fake.in_flight, 1);
}

/* ---- the tests ---- */

static void test_start(void **state)
{
    (void)state;
    owner_t o;
    start(&o, &plain_ops);
    assert_int_equal(req.res.status, 200);
    assert_string_equal(req.res.reason, "OK");
    assert_string_equal(fake.ctype, "text/event-stream");
    assert_int_equal(o.headers, 1);
    assert_true(rq.responded);
    assert_int_equal(gw.metrics.streams, 1);
    assert_ptr_equal(fake.gen, &o.sse.gen);
    assert_true(gw_sse_flush(&o.sse)); /* nothing queued: nothing sent */
    assert_int_equal(fake.sends, 0);
    assert_false(gw_sse_close(&o.sse));
    gw_sse_dispose(&o.sse);
}

/* One write in flight; what is queued meanwhile leaves in one write at proceed. */
static void test_one_write_in_flight(void **state)
{
    (void)state;
    owner_t o;
    start_writing(&o, &plain_ops);
    queue(&o, "b");
    assert_true(gw_sse_flush(&o.sse));
    queue(&o, "c");
    assert_true(gw_sse_flush(&o.sse));
    assert_int_equal(fake.sends, 1);
    assert_int_equal(gw_sse_backlog(&o.sse), 3);
    proceed();
    assert_int_equal(fake.sends, 2);
    assert_int_equal(o.written, 1);
    assert_int_equal(gw_sse_backlog(&o.sse), 2);
    proceed();
    assert_int_equal(fake.sends, 2);
    assert_int_equal(o.written, 2);
    assert_int_equal(gw_sse_backlog(&o.sse), 0);
    assert_string_equal(fake.sent.data, "a|bc|");
    assert_int_equal(o.closed, 0);
    gw_sse_close(&o.sse);
    gw_sse_dispose(&o.sse);
}

/* gw_sse_end: everything queued is written first, then the end, and the connection is kept;
 * closed runs once. */
static void test_end_after_queued(void **state)
{
    (void)state;
    owner_t o;
    start_writing(&o, &plain_ops);
    queue(&o, "last");
    assert_true(gw_sse_end(&o.sse));
    assert_int_equal(fake.finals, 0);
    proceed();
    assert_int_equal(fake.finals, 0);
    assert_int_equal(o.closed, 0);
    proceed();
    assert_string_equal(fake.sent.data, "a|last|FINAL");
    /* The headers promised keep-alive: the connection stays for the client's next request. */
    assert_int_equal(req.http1_is_persistent, 1);
    assert_int_equal(o.closed, 1);
    assert_int_equal(o.written, 1); /* not after the end */
    assert_int_equal(gw.metrics.streams, 0);
    assert_int_equal(fake.logged, 1);
    assert_int_equal(fake.counted, 1);
    assert_false(gw_sse_flush(&o.sse));
    assert_false(gw_sse_tick(&o.sse, 1000 * SEC));
    gw_sse_abort(&o.sse, "late");
    assert_int_equal(o.closed, 1);
    gw_sse_dispose(&o.sse);

    /* Nothing in flight: it ends at once. */
    start(&o, &plain_ops);
    assert_false(gw_sse_end(&o.sse));
    assert_int_equal(o.closed, 1);
    gw_sse_dispose(&o.sse);
}

/* gw_sse_close: after the write in flight; what was not handed to h2o is dropped. */
static void test_close_drops_queued(void **state)
{
    (void)state;
    owner_t o;
    start_writing(&o, &plain_ops);
    queue(&o, "dropped");
    assert_true(gw_sse_close(&o.sse));
    queue(&o, "too late");
    assert_true(gw_sse_flush(&o.sse));
    proceed();
    assert_string_equal(fake.sent.data, "a|FINAL");
    assert_int_equal(o.closed, 1);
    gw_sse_dispose(&o.sse);
}

/* gw_sse_abort: now; a write in flight is failed by shutting the socket down, and the end
 * comes with h2o's stop. */
static void test_abort(void **state)
{
    (void)state;
    owner_t o;
    int sv[2];
    char c;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fake.fd = sv[0];

    start_writing(&o, &plain_ops);
    gw_sse_abort(&o.sse, "test");
    assert_int_equal(o.closed, 0);
    assert_int_equal(read(sv[1], &c, 1), 0); /* shut down */
    stop();
    assert_int_equal(o.closed, 1);
    assert_int_equal(fake.finals, 0);
    assert_int_equal(gw.metrics.streams, 0);
    gw_sse_dispose(&o.sse);

    /* Idle: it ends at once, cleanly. */
    start(&o, &plain_ops);
    gw_sse_abort(&o.sse, "test");
    assert_int_equal(o.closed, 1);
    assert_int_equal(fake.finals, 1);
    gw_sse_dispose(&o.sse);
    close(sv[0]);
    close(sv[1]);
}

/* The client goes away while a write is in flight: closed once, nothing more is sent. */
static void test_client_gone(void **state)
{
    (void)state;
    owner_t o;
    start_writing(&o, &plain_ops);
    queue(&o, "b");
    stop();
    assert_int_equal(o.closed, 1);
    assert_false(gw_sse_flush(&o.sse));
    assert_false(gw_sse_end(&o.sse));
    assert_int_equal(fake.sends, 1);
    assert_int_equal(fake.finals, 0);
    assert_int_equal(fake.logged, 1);
    gw_sse_dispose(&o.sse);
}

/* Keepalives when idle for sse-keepalive-s (never while a write is in flight or records wait);
 * a write stuck past sse-write-timeout-s is aborted and counted. */
static void test_tick(void **state)
{
    (void)state;
    owner_t o;
    start_writing(&o, &plain_ops);
    int64_t t0 = o.sse.sending_since_ns;
    assert_true(gw_sse_tick(&o.sse, t0 + 20 * SEC)); /* in flight: no keepalive */
    assert_int_equal(fake.sends, 1);
    proceed();
    assert_true(gw_sse_tick(&o.sse, t0 + 14 * SEC));
    assert_int_equal(fake.sends, 1);
    assert_true(gw_sse_tick(&o.sse, t0 + 15 * SEC));
    assert_int_equal(fake.sends, 2);
    assert_string_equal(fake.sent.data, "a|" SP_SSE_KEEPALIVE "|");

    int64_t t1 = o.sse.sending_since_ns;
    assert_true(gw_sse_tick(&o.sse, t1 + 60 * SEC));
    assert_int_equal(gw.metrics.streams_closed_slow, 0);
    assert_true(gw_sse_tick(&o.sse, t1 + 61 * SEC));
    assert_int_equal(gw.metrics.streams_closed_slow, 1);
    assert_true(o.sse.closing);
    stop();
    assert_int_equal(o.closed, 1);
    gw_sse_dispose(&o.sse);

    /* The owner's keepalive record. */
    start(&o, &own_ops);
    assert_true(gw_sse_tick(&o.sse, o.sse.last_write_ns + 15 * SEC));
    assert_int_equal(o.keepalives, 1);
    assert_string_equal(fake.sent.data + fake.sent.len - 2, "K|");
    gw_sse_close(&o.sse);
    proceed();
    gw_sse_dispose(&o.sse);
}

/* poll_hangup: a client that hung up is made to fail a write at the next tick. */
static void test_hangup(void **state)
{
    (void)state;
    owner_t o;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fake.fd = sv[0];
    start(&o, &hangup_ops);
    int64_t now = 1 * SEC; /* not idle for long: no keepalive is due */
    assert_true(gw_sse_tick(&o.sse, now));
    assert_int_equal(fake.sends, 0);
    close(sv[1]);
    assert_true(gw_sse_tick(&o.sse, now));
    assert_int_equal(fake.sends, 1);
    assert_string_equal(fake.sent.data, SP_SSE_KEEPALIVE "|");
    stop();
    assert_int_equal(o.closed, 1);
    gw_sse_dispose(&o.sse);
    close(sv[0]);

    /* Without the option the same tick sends nothing (the hang-up shows at the next write). */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fake.fd = sv[0];
    start(&o, &plain_ops);
    close(sv[1]);
    assert_true(gw_sse_tick(&o.sse, o.sse.last_write_ns + 1 * SEC));
    assert_int_equal(fake.sends, 1);
    assert_false(gw_sse_close(&o.sse));
    gw_sse_dispose(&o.sse);
    close(sv[0]);
}

#define TEST(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_start),
        TEST(test_one_write_in_flight),
        TEST(test_end_after_queued),
        TEST(test_close_drops_queued),
        TEST(test_abort),
        TEST(test_client_gone),
        TEST(test_tick),
        TEST(test_hangup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
