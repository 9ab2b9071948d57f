/* The worker's end of the agent channel against a lying agent, for file frames: the test plays
 * the agent on two pipes (no sandbox needed) and sends what a hostile guest could write to
 * /proc/1/fd/1. Every violation must close the channel with a reason; frames for a transfer
 * that is over are dropped without harm. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent.pb-c.h"
#include "worker_agent.h"

typedef Space__Agent__V1__AgentFrame frame_t;

typedef struct {
    pthread_mutex_t mu;
    char lost[256];
    int results, failed, acks, data_frames;
    size_t data_bytes;
    bool data_done;
} seen_t;

static seen_t seen;

static void on_lost(void *arg, const char *why)
{
    (void)arg;
    pthread_mutex_lock(&seen.mu);
    snprintf(seen.lost, sizeof(seen.lost), "%s", why);
    pthread_mutex_unlock(&seen.mu);
}

static void on_result(void *arg, uint64_t x, const Space__Agent__V1__FileResult *r)
{
    (void)arg, (void)x, (void)r;
    pthread_mutex_lock(&seen.mu);
    seen.results++;
    pthread_mutex_unlock(&seen.mu);
}

static void on_failed(void *arg, uint64_t x, const char *code, const char *msg)
{
    (void)arg, (void)x, (void)code, (void)msg;
    pthread_mutex_lock(&seen.mu);
    seen.failed++;
    pthread_mutex_unlock(&seen.mu);
}

static void on_ack(void *arg, uint64_t x, uint64_t acked)
{
    (void)arg, (void)x, (void)acked;
    pthread_mutex_lock(&seen.mu);
    seen.acks++;
    pthread_mutex_unlock(&seen.mu);
}

static void on_data(void *arg, uint64_t x, uint64_t off, const uint8_t *d, size_t len, bool eof,
                    bool done)
{
    (void)arg, (void)x, (void)off, (void)d, (void)eof;
    pthread_mutex_lock(&seen.mu);
    seen.data_frames++;
    seen.data_bytes += len;
    seen.data_done = done;
    pthread_mutex_unlock(&seen.mu);
}

typedef struct {
    int to_agent[2], from_agent[2]; /* [0] read end, [1] write end */
    wk_agent_t *a;
} chan_t;

static void put(int fd, const frame_t *f)
{
    size_t n = space__agent__v1__agent_frame__get_packed_size(f);
    uint8_t *buf = malloc(n + 4);
    buf[0] = (uint8_t)(n >> 24);
    buf[1] = (uint8_t)(n >> 16);
    buf[2] = (uint8_t)(n >> 8);
    buf[3] = (uint8_t)n;
    space__agent__v1__agent_frame__pack(f, buf + 4);
    assert_int_equal(write(fd, buf, n + 4), (ssize_t)(n + 4));
    free(buf);
}

/* The next frame the worker sent to the agent. */
static frame_t *take(int fd)
{
    uint8_t h[4];
    assert_int_equal(read(fd, h, 4), 4);
    uint32_t n = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    uint8_t *buf = malloc(n ? n : 1);
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        assert_true(r > 0);
        got += (size_t)r;
    }
    frame_t *f = space__agent__v1__agent_frame__unpack(NULL, n, buf);
    free(buf);
    assert_non_null(f);
    return f;
}

static void chan_open(chan_t *c)
{
    static const wk_agent_callbacks_t cb = {.on_lost = on_lost,
                                            .on_file_result = on_result,
                                            .on_file_failed = on_failed,
                                            .on_file_ack = on_ack,
                                            .on_file_data = on_data};
    memset(&seen, 0, sizeof(seen));
    pthread_mutex_init(&seen.mu, NULL);
    assert_int_equal(pipe(c->to_agent), 0);
    assert_int_equal(pipe(c->from_agent), 0);
    Space__Agent__V1__Hello h = SPACE__AGENT__V1__HELLO__INIT;
    h.protocol = 1;
    h.version = "fake";
    h.pid = 1;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_HELLO;
    f.hello = &h;
    put(c->from_agent[1], &f);
    assert_int_equal(wk_agent_open(c->to_agent[1], c->from_agent[0], "sbx_fake", &cb, 2000, &c->a),
                     0);
}

static void chan_close(chan_t *c)
{
    wk_agent_close(c->a);
    close(c->to_agent[0]);
    close(c->from_agent[1]);
}

static bool wait_lost(const char *want)
{
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&seen.mu);
        bool got = seen.lost[0] != '\0';
        char why[256];
        snprintf(why, sizeof(why), "%s", seen.lost);
        pthread_mutex_unlock(&seen.mu);
        if (got) {
            print_message("channel closed: %s\n", why);
            return strstr(why, want) != NULL;
        }
        usleep(10000);
    }
    return false;
}

/* Opens a read on a fresh transfer as the real agent would answer it. */
static uint64_t open_read(chan_t *c)
{
    uint64_t id = 0;
    assert_int_equal(wk_agent_file_reserve(c->a, &id), 0);
    Space__Agent__V1__FileRequest r = SPACE__AGENT__V1__FILE_REQUEST__INIT;
    r.xfer_id = id;
    r.op = SPACE__AGENT__V1__FILE_OP__FILE_OP_READ_OPEN;
    r.path = "/x";
    assert_int_equal(wk_agent_file_request(c->a, &r), 0);
    frame_t *got = take(c->to_agent[0]);
    assert_int_equal(got->msg_case, SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_REQUEST);
    assert_int_equal(got->file_request->xfer_id, id);
    space__agent__v1__agent_frame__free_unpacked(got, NULL);

    Space__Agent__V1__FileInfo in = SPACE__AGENT__V1__FILE_INFO__INIT;
    in.path = "/x";
    in.type = SPACE__AGENT__V1__FILE_TYPE__FILE_TYPE_FILE;
    in.size = 100;
    Space__Agent__V1__FileResult res = SPACE__AGENT__V1__FILE_RESULT__INIT;
    res.xfer_id = id;
    res.info = &in;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_RESULT;
    f.file_result = &res;
    pthread_mutex_lock(&seen.mu);
    int before = seen.results;
    pthread_mutex_unlock(&seen.mu);
    put(c->from_agent[1], &f);
    /* As the worker does, wait for the open's result before reading. */
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&seen.mu);
        bool done = seen.results > before;
        pthread_mutex_unlock(&seen.mu);
        if (done)
            break;
        usleep(5000);
    }
    return id;
}

static void send_data(chan_t *c, uint64_t id, uint64_t off, size_t len, bool eof)
{
    static uint8_t zeros[80 * 1024];
    Space__Agent__V1__FileData d = SPACE__AGENT__V1__FILE_DATA__INIT;
    d.xfer_id = id;
    d.offset = off;
    d.data.data = zeros;
    d.data.len = len;
    d.eof = eof;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_DATA;
    f.file_data = &d;
    put(c->from_agent[1], &f);
}

static void test_good_read_and_stale_frames(void **state)
{
    (void)state;
    chan_t c;
    chan_open(&c);
    uint64_t id = open_read(&c);
    assert_int_equal(wk_agent_file_read(c.a, id, 0, 100), 0);
    frame_t *got = take(c.to_agent[0]);
    assert_int_equal(got->msg_case, SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_READ);
    space__agent__v1__agent_frame__free_unpacked(got, NULL);
    send_data(&c, id, 0, 60, false);
    send_data(&c, id, 60, 40, true);
    /* Released: what the agent still says about it is dropped, not a violation. */
    for (int i = 0; i < 100 && !seen.data_done; i++)
        usleep(10000);
    wk_agent_file_release(c.a, id);
    send_data(&c, id, 100, 10, true);
    usleep(100000);
    assert_true(wk_agent_alive(c.a));
    pthread_mutex_lock(&seen.mu);
    assert_int_equal(seen.results, 1);
    assert_int_equal(seen.data_frames, 2);
    assert_int_equal(seen.data_bytes, 100);
    assert_true(seen.data_done);
    pthread_mutex_unlock(&seen.mu);
    chan_close(&c);
}

static void test_unknown_transfer(void **state)
{
    (void)state;
    chan_t c;
    chan_open(&c);
    send_data(&c, 999, 0, 10, true); /* never issued */
    assert_true(wait_lost("never issued"));
    assert_false(wk_agent_alive(c.a));
    chan_close(&c);
}

static void test_more_data_than_asked(void **state)
{
    (void)state;
    chan_t c;
    chan_open(&c);
    uint64_t id = open_read(&c);
    assert_int_equal(wk_agent_file_read(c.a, id, 0, 1000), 0);
    frame_t *got = take(c.to_agent[0]);
    space__agent__v1__agent_frame__free_unpacked(got, NULL);
    send_data(&c, id, 0, 2000, false);
    assert_true(wait_lost("FileData of 2000 bytes"));
    chan_close(&c);
}

static void test_oversized_and_unasked(void **state)
{
    (void)state;
    chan_t c;
    chan_open(&c);
    uint64_t id = open_read(&c);
    /* Data nobody asked for (no read in progress). */
    send_data(&c, id, 0, 10, false);
    assert_true(wait_lost("FileData without a read"));
    chan_close(&c);

    chan_open(&c);
    id = open_read(&c);
    assert_int_equal(wk_agent_file_read(c.a, id, 0, 256 * 1024), 0);
    frame_t *got = take(c.to_agent[0]);
    space__agent__v1__agent_frame__free_unpacked(got, NULL);
    send_data(&c, id, 0, 70 * 1024, false); /* over the 64 KiB a frame may carry */
    assert_true(wait_lost("FileData of"));
    chan_close(&c);

    /* A second reply to one request; an ack of bytes never sent. */
    chan_open(&c);
    id = open_read(&c);
    Space__Agent__V1__FileResult res = SPACE__AGENT__V1__FILE_RESULT__INIT;
    res.xfer_id = id;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_RESULT;
    f.file_result = &res;
    put(c.from_agent[1], &f);
    assert_true(wait_lost("FileResult without a request"));
    chan_close(&c);

    chan_open(&c);
    id = open_read(&c);
    Space__Agent__V1__FileAck ack = SPACE__AGENT__V1__FILE_ACK__INIT;
    ack.xfer_id = id;
    ack.offset = 4096;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_ACK;
    f.file_ack = &ack;
    put(c.from_agent[1], &f);
    assert_true(wait_lost("FileAck"));
    chan_close(&c);

    /* A failure code the protocol does not have. */
    chan_open(&c);
    id = open_read(&c);
    Space__Agent__V1__FileFailed ff = SPACE__AGENT__V1__FILE_FAILED__INIT;
    ff.xfer_id = id;
    ff.code = "rm -rf /";
    ff.message = "";
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_FILE_FAILED;
    f.file_failed = &ff;
    put(c.from_agent[1], &f);
    assert_true(wait_lost("unknown code"));
    chan_close(&c);
}

static void put_meminfo(chan_t *c, uint64_t total, uint64_t available, uint64_t cached)
{
    Space__Agent__V1__MemInfo m = SPACE__AGENT__V1__MEM_INFO__INIT;
    m.total = total;
    m.available = available;
    m.cached = cached;
    frame_t f = SPACE__AGENT__V1__AGENT_FRAME__INIT;
    f.msg_case = SPACE__AGENT__V1__AGENT_FRAME__MSG_MEMINFO;
    f.meminfo = &m;
    put(c->from_agent[1], &f);
}

/* The sampler's question and its answer (worker_samples.c): nothing before the first answer,
 * one question open at a time, the answer kept; an answer nobody asked for, or with a part
 * above its total, closes the channel. */
static void test_meminfo(void **state)
{
    (void)state;
    chan_t c;
    wk_agent_meminfo_t mi;
    chan_open(&c);
    assert_int_equal(wk_agent_meminfo(c.a, &mi), -ENODATA);
    frame_t *got = take(c.to_agent[0]);
    assert_int_equal(got->msg_case, SPACE__AGENT__V1__AGENT_FRAME__MSG_MEMINFO_REQUEST);
    space__agent__v1__agent_frame__free_unpacked(got, NULL);
    /* Still unanswered: no second question (the next frame out is asked after the answer). */
    assert_int_equal(wk_agent_meminfo(c.a, &mi), -ENODATA);
    put_meminfo(&c, 512u << 20, 400u << 20, 64u << 20);
    int rc = -ENODATA;
    for (int i = 0; i < 200 && rc == -ENODATA; i++) {
        usleep(5000);
        rc = wk_agent_meminfo(c.a, &mi);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(mi.total, 512u << 20);
    assert_int_equal(mi.available, 400u << 20);
    assert_int_equal(mi.cached, 64u << 20);
    got = take(c.to_agent[0]); /* the question the answered call asked */
    assert_int_equal(got->msg_case, SPACE__AGENT__V1__AGENT_FRAME__MSG_MEMINFO_REQUEST);
    space__agent__v1__agent_frame__free_unpacked(got, NULL);
    put_meminfo(&c, 512u << 20, 0, 600u << 20); /* cached above total */
    assert_true(wait_lost("MemInfo with a part larger"));
    chan_close(&c);

    chan_open(&c);
    put_meminfo(&c, 1, 1, 1); /* never asked */
    assert_true(wait_lost("MemInfo without a MemInfoRequest"));
    chan_close(&c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* worker_agent.c expects it, as the daemon does */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_read_and_stale_frames),
        cmocka_unit_test(test_unknown_transfer),
        cmocka_unit_test(test_more_data_than_asked),
        cmocka_unit_test(test_oversized_and_unasked),
        cmocka_unit_test(test_meminfo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
