/* The worker's in-process zstd (worker/worker_stream.c): what it compresses comes back byte for
 * byte, at sizes around its buffers' edges; its frames are the zstd tool's both ways (the tool
 * reads what it wrote, it reads what the tool wrote); a truncated, corrupt or empty input is
 * refused and leaves no output behind; contexts are reused after a failure. The btrfs send half
 * needs a btrfs volume: integration.worker_runtime (test_kept_disk, the received disk) and the
 * suspends of integration.lifecycle cover it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../../worker/worker_stream.c" /* NOLINT(bugprone-suspicious-include) */

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "wk_fail_stub.h"

static char dir[] = "/tmp/test_worker_stream.XXXXXX";

static char *path(const char *name)
{
    return sp_xasprintf("%s/%s", dir, name);
}

/* n bytes, half text-like (compressible), half from a small PRNG (not). */
static uint8_t *sample(size_t n)
{
    uint8_t *b = sp_xmalloc(n ? n : 1);
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (i / 4096) % 2 ? (uint8_t)x : (uint8_t)("sandbox "[i % 8]);
    }
    return b;
}

static void write_bytes(const char *p, const uint8_t *b, size_t n)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(sp_write_all(fd, b, n), 0);
    close(fd);
}

static uint8_t *read_bytes(const char *p, size_t *n)
{
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    uint8_t *b = sp_xmalloc((size_t)st.st_size + 1);
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(sp_read_full(fd, b, (size_t)st.st_size), st.st_size);
    close(fd);
    *n = (size_t)st.st_size;
    return b;
}

static bool exists(const char *p)
{
    return access(p, F_OK) == 0;
}

static int run(const char *cmd)
{
    int st = system(cmd); /* NOLINT(cert-env33-c) */
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_round_trip_sizes(void **state)
{
    (void)state;
    const size_t sizes[] = {1,
                            4096,
                            ZSTD_CStreamInSize() - 1,
                            ZSTD_CStreamInSize(),
                            ZSTD_CStreamInSize() + 1,
                            3 * ZSTD_DStreamOutSize() + 7,
                            (1 << 20) + 13};
    char *raw = path("raw"), *zst = path("raw.zst"), *back = path("back");
    char err[WK_ERR_MAX];
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        uint8_t *b = sample(sizes[k]);
        write_bytes(raw, b, sizes[k]);
        assert_int_equal(wk__zstd_file(raw, zst, WK_ZSTD_LEVEL, err), 0);
        assert_int_equal(wk__unzstd_file(zst, back, err), 0);
        size_t n = 0;
        uint8_t *got = read_bytes(back, &n);
        assert_int_equal(n, sizes[k]);
        assert_memory_equal(got, b, n);
        struct stat st;
        assert_int_equal(stat(zst, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        free(got);
        free(b);
    }
    free(raw);
    free(zst);
    free(back);
}

/* The tool reads ours, and we read the tool's (a stored snapshot may have been made by either;
 * a template cache's streams still pass through the tool). */
static void test_frames_are_the_tools(void **state)
{
    (void)state;
    char *raw = path("t.raw"), *ours = path("t.ours.zst"), *tools = path("t.tool.zst");
    char *back = path("t.back"), *cmd = NULL;
    char err[WK_ERR_MAX];
    uint8_t *b = sample(300000);
    write_bytes(raw, b, 300000);
    assert_int_equal(wk__zstd_file(raw, ours, WK_ZSTD_LEVEL, err), 0);
    cmd = sp_xasprintf("zstd -q -t %s && zstd -q -d -c %s | cmp -s - %s", ours, ours, raw);
    assert_int_equal(run(cmd), 0);
    free(cmd);
    cmd = sp_xasprintf("zstd -q -1 -f %s -o %s", raw, tools);
    assert_int_equal(run(cmd), 0);
    assert_int_equal(wk__unzstd_file(tools, back, err), 0);
    size_t n = 0;
    uint8_t *got = read_bytes(back, &n);
    assert_int_equal(n, 300000);
    assert_memory_equal(got, b, n);
    free(got);
    free(cmd);
    free(b);
    free(raw);
    free(ours);
    free(tools);
    free(back);
}

static void test_bad_input_refused(void **state)
{
    (void)state;
    char *raw = path("b.raw"), *zst = path("b.zst"), *bad = path("b.bad"), *out = path("b.out");
    char err[WK_ERR_MAX];
    uint8_t *b = sample(200000);
    write_bytes(raw, b, 200000);
    assert_int_equal(wk__zstd_file(raw, zst, WK_ZSTD_LEVEL, err), 0);
    size_t n = 0;
    uint8_t *z = read_bytes(zst, &n);

    /* Cut short: refused, and nothing left where the output was to be. */
    write_bytes(bad, z, n / 2);
    assert_int_equal(wk__unzstd_file(bad, out, err), -EBADMSG);
    assert_non_null(strstr(err, "truncated"));
    assert_false(exists(out));
    /* The frame's checksum (its last 4 bytes) wrong. */
    z[n - 1] ^= 0x5a;
    write_bytes(bad, z, n);
    assert_int_equal(wk__unzstd_file(bad, out, err), -EBADMSG);
    assert_false(exists(out));
    /* Not zstd at all, and empty. */
    write_bytes(bad, b, 1000);
    assert_int_equal(wk__unzstd_file(bad, out, err), -EBADMSG);
    write_bytes(bad, b, 0);
    assert_int_equal(wk__unzstd_file(bad, out, err), -EBADMSG);
    assert_non_null(strstr(err, "empty"));
    assert_false(exists(out));
    /* A missing input names itself. */
    char *none = path("none");
    assert_int_equal(wk__unzstd_file(none, out, err), -ENOENT);
    assert_non_null(strstr(err, none));
    assert_int_equal(wk__zstd_file(none, out, WK_ZSTD_LEVEL, err), -ENOENT);
    free(none);

    /* The contexts that failed serve again. */
    z[n - 1] ^= 0x5a;
    write_bytes(bad, z, n);
    assert_int_equal(wk__unzstd_file(bad, out, err), 0);
    size_t m = 0;
    uint8_t *got = read_bytes(out, &m);
    assert_int_equal(m, 200000);
    assert_memory_equal(got, b, m);
    free(got);
    free(z);
    free(b);
    free(raw);
    free(zst);
    free(bad);
    free(out);
}

static int setup(void **state)
{
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char *cmd = sp_xasprintf("rm -rf %s", dir);
    int rc = run(cmd);
    free(cmd);
    return rc;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_sizes),
        cmocka_unit_test(test_frames_are_the_tools),
        cmocka_unit_test(test_bad_input_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
