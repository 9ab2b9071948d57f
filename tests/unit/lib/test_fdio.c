/* Whole reads and writes (lib/fdio.c): through a pipe that takes and gives less than asked at a
 * time, the bytes arrive whole and in order; a read stops short only at the end; a write to a
 * pipe nobody reads is an error, not a signal that ends the process. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "fdio.h"

#define N (3 * 65536 + 17) /* more than a pipe holds */

typedef struct {
    int fd;
    const uint8_t *buf;
    int rc;
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    w->rc = sp_write_all(w->fd, w->buf, N);
    close(w->fd);
    return NULL;
}

static void test_whole_through_a_pipe(void **state)
{
    (void)state;
    static uint8_t out[N], in[N + 100];
    for (size_t i = 0; i < N; i++)
        out[i] = (uint8_t)(i * 31 + 7);
    int p[2];
    assert_int_equal(pipe(p), 0);
    writer_t w = {.fd = p[1], .buf = out};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, writer_main, &w), 0);
    /* Asked for more than will come: all of it, then the end. */
    assert_int_equal(sp_read_full(p[0], in, sizeof(in)), N);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(w.rc, 0);
    assert_memory_equal(in, out, N);
    assert_int_equal(sp_read_full(p[0], in, sizeof(in)), 0);
    close(p[0]);
}

static void test_errors(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    int p[2];
    assert_int_equal(pipe(p), 0);
    close(p[0]);
    assert_int_equal(sp_write_all(p[1], "x", 1), -EPIPE);
    close(p[1]);
    uint8_t b[4];
    assert_int_equal(sp_read_full(-1, b, sizeof(b)), -EBADF);
    assert_int_equal(sp_write_all(-1, b, sizeof(b)), -EBADF);
    assert_int_equal(sp_write_all(-1, b, 0), 0); /* nothing to write: nothing done */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_through_a_pipe),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
