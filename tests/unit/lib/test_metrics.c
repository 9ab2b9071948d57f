/* sp_metrics: the exact text of a small registry, label escaping, histogram bucketing, the
 * series cap, exact totals from concurrent threads, and the listener's answers to good and
 * hostile clients on loopback. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"

static void test_exact_text(void **state)
{
    (void)state;
    sp_metrics_t *r = sp_metrics_new();
    sp_metric_t *c = sp_metrics_add(r, SP_METRIC_COUNTER, "space_t_events_total",
                                    "Events.\nSecond line \\ here.", "outcome", NULL, 0, 4);
    sp_metric_t *g = sp_metrics_add(r, SP_METRIC_GAUGE, "space_t_lag", "Lag.", NULL, NULL, 0, 1);
    static const double b[] = {0.1, 1, 2.5};
    sp_metric_t *h =
        sp_metrics_add(r, SP_METRIC_HISTOGRAM, "space_t_op_seconds", "Ops.", "op", b, 3, 2);
    assert_non_null(c);
    assert_non_null(g);
    assert_non_null(h);
    sp_series_inc(sp_metric_series1(c, "stored"));
    sp_series_add(sp_metric_series1(c, "stored"), 2);
    sp_series_add(sp_metric_series1(c, "rejected"), 0);
    sp_series_add(sp_metric_series1(c, "rejected"), -5); /* ignored: counters only grow */
    sp_series_set(sp_metric_only(g), 1.5);
    sp_series_t *hs = sp_metric_series1(h, "create");
    sp_series_observe(hs, 0.05);
    sp_series_observe(hs, 0.1); /* le: the bound itself is inside */
    sp_series_observe(hs, 2);
    sp_series_observe(hs, 100);
    sp_buf_t out;
    sp_buf_init(&out);
    sp_metrics_scrape(r, &out);
    assert_string_equal(out.data, "# HELP space_t_events_total Events.\\nSecond line \\\\ here.\n"
                                  "# TYPE space_t_events_total counter\n"
                                  "space_t_events_total{outcome=\"stored\"} 3\n"
                                  "space_t_events_total{outcome=\"rejected\"} 0\n"
                                  "# HELP space_t_lag Lag.\n"
                                  "# TYPE space_t_lag gauge\n"
                                  "space_t_lag 1.5\n"
                                  "# HELP space_t_op_seconds Ops.\n"
                                  "# TYPE space_t_op_seconds histogram\n"
                                  "space_t_op_seconds_bucket{op=\"create\",le=\"0.1\"} 2\n"
                                  "space_t_op_seconds_bucket{op=\"create\",le=\"1\"} 2\n"
                                  "space_t_op_seconds_bucket{op=\"create\",le=\"2.5\"} 3\n"
                                  "space_t_op_seconds_bucket{op=\"create\",le=\"+Inf\"} 4\n"
                                  "space_t_op_seconds_sum{op=\"create\"} 102.15\n"
                                  "space_t_op_seconds_count{op=\"create\"} 4\n");
    sp_buf_dispose(&out);
    sp_metrics_free(r);
}

static void test_escaping(void **state)
{
    (void)state;
    sp_metrics_t *r = sp_metrics_new();
    sp_metric_t *g = sp_metrics_add(r, SP_METRIC_GAUGE, "space_t_g", "G.", "a,b", NULL, 0, 4);
    const char *v[2] = {"x\\y\"z\nw", "\xc3\xa9"};
    sp_series_set(sp_metric_series(g, v), 7);
    sp_buf_t out;
    sp_buf_init(&out);
    sp_metrics_write(r, &out);
    assert_non_null(strstr(out.data, "space_t_g{a=\"x\\\\y\\\"z\\nw\",b=\"\xc3\xa9\"} 7\n"));
    sp_buf_dispose(&out);
    sp_metrics_free(r);
}

static void test_histogram_series(void **state)
{
    /* Two series of one histogram: each with its own buckets, _sum and _count. */
    (void)state;
    sp_metrics_t *r = sp_metrics_new();
    static const double b[] = {1};
    sp_metric_t *h =
        sp_metrics_add(r, SP_METRIC_HISTOGRAM, "space_t_h_seconds", "H.", "op", b, 1, 2);
    sp_series_observe(sp_metric_series1(h, "x"), 0.5);
    sp_series_observe(sp_metric_series1(h, "y"), 3);
    sp_series_observe(sp_metric_series1(h, "y"), 4);
    sp_buf_t out;
    sp_buf_init(&out);
    sp_metrics_write(r, &out);
    assert_non_null(strstr(out.data, "space_t_h_seconds_sum{op=\"x\"} 0.5\n"));
    assert_non_null(strstr(out.data, "space_t_h_seconds_count{op=\"x\"} 1\n"));
    assert_non_null(strstr(out.data, "space_t_h_seconds_bucket{op=\"y\",le=\"1\"} 0\n"
                                     "space_t_h_seconds_bucket{op=\"y\",le=\"+Inf\"} 2\n"
                                     "space_t_h_seconds_sum{op=\"y\"} 7\n"));
    assert_null(sp_metric_series1(h, "z")); /* max_series 2 */
    sp_buf_dispose(&out);
    sp_metrics_free(r);
}

static void test_bad_definitions_and_values(void **state)
{
    (void)state;
    sp_metrics_t *r = sp_metrics_new();
    static const double down[] = {2, 1};
    assert_null(sp_metrics_add(r, SP_METRIC_COUNTER, "9bad", "h", NULL, NULL, 0, 1));
    assert_null(sp_metrics_add(r, SP_METRIC_COUNTER, "a-b", "h", NULL, NULL, 0, 1));
    assert_null(sp_metrics_add(r, SP_METRIC_COUNTER, "ok_total", "h", "le", NULL, 0, 1));
    assert_null(sp_metrics_add(r, SP_METRIC_COUNTER, "ok_total", "h", "__x", NULL, 0, 1));
    assert_null(sp_metrics_add(r, SP_METRIC_COUNTER, "ok_total", "h", "a,,b", NULL, 0, 1));
    assert_null(sp_metrics_add(r, SP_METRIC_HISTOGRAM, "ok_seconds", "h", NULL, down, 2, 1));
    assert_null(sp_metrics_add(r, SP_METRIC_HISTOGRAM, "ok_seconds", "h", NULL, NULL, 0, 1));
    sp_metric_t *c = sp_metrics_add(r, SP_METRIC_COUNTER, "ok_total", "h", "id", NULL, 0, 2);
    assert_non_null(c);
    char longv[SP_METRICS_VALUE_MAX + 2];
    memset(longv, 'a', sizeof(longv) - 1);
    longv[sizeof(longv) - 1] = '\0';
    assert_null(sp_metric_series1(c, ""));
    assert_null(sp_metric_series1(c, longv));
    assert_null(sp_metric_series1(c, "\xc3"));         /* truncated UTF-8 */
    assert_null(sp_metric_series1(c, "\xc0\xaf"));     /* overlong */
    assert_null(sp_metric_series1(c, "\xed\xa0\x80")); /* surrogate */
    /* The cap: two series, the third refused, counting into NULL is a no-op. */
    assert_non_null(sp_metric_series1(c, "a"));
    assert_non_null(sp_metric_series1(c, "b"));
    assert_ptr_equal(sp_metric_series1(c, "a"), sp_metric_series1(c, "a"));
    assert_null(sp_metric_series1(c, "c"));
    sp_series_inc(NULL);
    /* A removed series frees its place. */
    const char *va[1] = {"a"};
    sp_metric_remove(c, va);
    assert_non_null(sp_metric_series1(c, "c"));
    sp_buf_t out;
    sp_buf_init(&out);
    sp_metrics_write(r, &out);
    assert_null(strstr(out.data, "id=\"a\""));
    assert_non_null(strstr(out.data, "ok_total{id=\"c\"} 0\n"));
    sp_metric_reset(c);
    sp_buf_reset(&out);
    sp_metrics_write(r, &out);
    assert_string_equal(out.data, "# HELP ok_total h\n# TYPE ok_total counter\n");
    sp_buf_dispose(&out);
    sp_metrics_free(r);
}

#define THREADS 8
#define PER     100000

typedef struct {
    sp_metric_t *c, *h;
} shared_t;

static void *bump(void *arg)
{
    shared_t *sh = arg;
    for (int i = 0; i < PER; i++) {
        sp_series_inc(sp_metric_series1(sh->c, i % 2 ? "odd" : "even"));
        sp_series_observe(sp_metric_only(sh->h), (double)(i % 3));
    }
    return NULL;
}

static void *scrape_loop(void *arg)
{
    sp_metrics_t *r = arg;
    for (int i = 0; i < 50; i++) {
        sp_buf_t out;
        sp_buf_init(&out);
        sp_metrics_scrape(r, &out);
        sp_buf_dispose(&out);
    }
    return NULL;
}

static void test_concurrent_exact(void **state)
{
    (void)state;
    sp_metrics_t *r = sp_metrics_new();
    static const double b[] = {0.5, 1.5};
    shared_t sh = {
        sp_metrics_add(r, SP_METRIC_COUNTER, "space_t_n_total", "N.", "k", NULL, 0, 2),
        sp_metrics_add(r, SP_METRIC_HISTOGRAM, "space_t_v_seconds", "V.", NULL, b, 2, 1),
    };
    pthread_t t[THREADS + 1];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, bump, &sh), 0);
    assert_int_equal(pthread_create(&t[THREADS], NULL, scrape_loop, r), 0);
    for (int i = 0; i <= THREADS; i++)
        pthread_join(t[i], NULL);
    assert_true(sp_series_value(sp_metric_series1(sh.c, "odd")) == (double)THREADS * PER / 2);
    assert_true(sp_series_value(sp_metric_series1(sh.c, "even")) == (double)THREADS * PER / 2);
    sp_buf_t out;
    sp_buf_init(&out);
    sp_metrics_write(r, &out);
    char want[256];
    /* i % 3: 0 -> le 0.5, 1 -> le 1.5, 2 -> +Inf; PER = 3k + 1, so one more 0. */
    int zeros = (PER / 3 + 1) * THREADS, ones = (PER / 3) * THREADS;
    snprintf(want, sizeof(want),
             "space_t_v_seconds_bucket{le=\"0.5\"} %d\nspace_t_v_seconds_bucket{le=\"1.5\"} "
             "%d\nspace_t_v_seconds_bucket{le=\"+Inf\"} %d\n",
             zeros, zeros + ones, THREADS * PER);
    assert_non_null(strstr(out.data, want));
    snprintf(want, sizeof(want), "space_t_v_seconds_count %d\n", THREADS * PER);
    assert_non_null(strstr(out.data, want));
    sp_buf_dispose(&out);
    sp_metrics_free(r);
}

static int collected;

static void collect(sp_metrics_t *r, void *arg)
{
    (void)r;
    collected++;
    sp_series_set(sp_metric_only(arg), 42);
}

/* ---- the listener ---- */

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Sends req, reads until the server closes (5 s at most); the answer into out. */
static void exchange(int port, const char *req, size_t req_len, char *out, size_t cap)
{
    int fd = dial(port);
    size_t n = 0;
    assert_int_equal(send(fd, req, req_len, MSG_NOSIGNAL), (ssize_t)req_len);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&p, 1, 5000), 1);
        ssize_t k = recv(fd, out + n, cap - 1 - n, 0);
        if (k <= 0)
            break;
        n += (size_t)k;
        assert_true(n < cap - 1);
    }
    out[n] = '\0';
    close(fd);
}

static void get(int port, const char *req, char *out, size_t cap)
{
    exchange(port, req, strlen(req), out, cap);
}

static void test_listener(void **state)
{
    (void)state;
    char dir[] = "/tmp/space-test-metrics.XXXXXX", file[256], err[SP_METRICS_ERR_MAX] = "";
    assert_non_null(mkdtemp(dir));
    snprintf(file, sizeof(file), "%s/x.metrics", dir);
    sp_metrics_t *r = sp_metrics_new();
    sp_metric_t *g = sp_metrics_add(r, SP_METRIC_GAUGE, "space_t_up", "Up.", NULL, NULL, 0, 1);
    sp_metrics_on_collect(r, collect, g);
    sp_metrics_server_t *s = NULL;
    assert_int_equal(sp_metrics_serve(r, "x", "off", NULL, &s, err), 0);
    assert_null(s);
    assert_true(sp_metrics_serve(r, "x", "localhost:1", NULL, &s, err) < 0);
    assert_true(sp_metrics_serve(r, "x", "127.0.0.1:99999", NULL, &s, err) < 0);
    assert_true(sp_metrics_serve(r, "x", "127.0.0.1:+1", NULL, &s, err) < 0);
    assert_int_equal(sp_metrics_serve(r, "x", "127.0.0.1:0", file, &s, err), 0);
    int port = sp_metrics_server_port(s);
    assert_true(port > 0);
    FILE *f = fopen(file, "re");
    assert_non_null(f);
    char line[16] = "", want_line[16];
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    snprintf(want_line, sizeof(want_line), "%d\n", port);
    assert_string_equal(line, want_line);

    static char buf[1 << 16];
    get(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", buf, sizeof(buf));
    assert_true(strncmp(buf, "HTTP/1.1 200 OK\r\n", 17) == 0);
    assert_non_null(strstr(buf, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(buf, "\r\n\r\n# HELP space_t_up Up.\n# TYPE space_t_up gauge\n"
                                "space_t_up 42\n"));
    assert_int_equal(collected, 1);
    get(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n", buf, sizeof(buf));
    assert_true(strncmp(buf, "HTTP/1.1 200 ", 13) == 0);
    get(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", buf, sizeof(buf));
    assert_true(strncmp(buf, "HTTP/1.1 405 ", 13) == 0);
    assert_non_null(strstr(buf, "Allow: GET\r\n"));
    get(port, "GET /other HTTP/1.1\r\n\r\n", buf, sizeof(buf));
    assert_true(strncmp(buf, "HTTP/1.1 404 ", 13) == 0);
    get(port, "GET /metricsx HTTP/1.1\r\n\r\n", buf, sizeof(buf));
    assert_true(strncmp(buf, "HTTP/1.1 404 ", 13) == 0);
    get(port, "GET  /metrics HTTP/1.1\r\n\r\n", buf, sizeof(buf));
    assert_true(strncmp(buf, "HTTP/1.1 400 ", 13) == 0);
    get(port, "GET /metrics HTTP/2\r\n\r\n", buf, sizeof(buf));
    assert_true(strncmp(buf, "HTTP/1.1 400 ", 13) == 0);
    exchange(port, "GET /metrics\0 HTTP/1.1\r\n\r\n", 27, buf, sizeof(buf));
    assert_true(strncmp(buf, "HTTP/1.1 400 ", 13) == 0);
    /* A head that never ends: 431 at 8 KiB, not more memory. */
    static char big[SP_METRICS_HEAD_MAX + 100];
    memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 25);
    memset(big + 25, 'a', sizeof(big) - 25);
    int fd = dial(port);
    (void)send(fd, big, SP_METRICS_HEAD_MAX, MSG_NOSIGNAL);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    ssize_t k = recv(fd, buf, sizeof(buf) - 1, 0);
    assert_true(k > 13);
    assert_true(strncmp(buf, "HTTP/1.1 431 ", 13) == 0);
    close(fd);

    /* Clients that connect and say nothing, more of them than the cap: the scrape after them
     * is answered at once, not after their timeout. */
    int idle[SP_METRICS_CONNS_MAX + 2];
    for (size_t i = 0; i < sizeof(idle) / sizeof(idle[0]); i++)
        idle[i] = dial(port);
    (void)send(idle[0], "GET /met", 8, MSG_NOSIGNAL); /* and one that stops half way */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    get(port, "GET /metrics HTTP/1.1\r\n\r\n", buf, sizeof(buf));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(strncmp(buf, "HTTP/1.1 200 ", 13) == 0);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(took < 1.0);
    /* The oldest idle ones were closed to make room (at once), the newest is dropped at its
     * timeout: the server closes, recv sees the end or a reset. */
    p = (struct pollfd){.fd = idle[0], .events = POLLIN};
    assert_int_equal(poll(&p, 1, 1000), 1);
    assert_true(recv(p.fd, buf, sizeof(buf), 0) <= 0);
    size_t last = sizeof(idle) / sizeof(idle[0]) - 1;
    p = (struct pollfd){.fd = idle[last], .events = POLLIN};
    assert_int_equal(poll(&p, 1, 200), 0);
    assert_int_equal(poll(&p, 1, SP_METRICS_TIMEOUT_MS + 3000), 1);
    assert_true(recv(p.fd, buf, sizeof(buf), 0) <= 0);
    for (size_t i = 0; i < sizeof(idle) / sizeof(idle[0]); i++)
        close(idle[i]);

    sp_metrics_server_free(s);
    assert_int_equal(access(file, F_OK), -1); /* the port file goes with the server */
    rmdir(dir);
    sp_metrics_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_text),       cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_histogram_series), cmocka_unit_test(test_bad_definitions_and_values),
        cmocka_unit_test(test_concurrent_exact), cmocka_unit_test(test_listener),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
