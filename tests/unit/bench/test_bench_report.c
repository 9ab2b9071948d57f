/* bench_report.c: nearest-rank percentiles over the successful samples only, the JSON's nulls
 * when nothing succeeded, and an SVG that stays well-formed with a hostile title and with
 * no samples at all. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../../bench/bench_report.c" /* NOLINT(bugprone-suspicious-include) */

static const char *const ops[] = {"create", "exec", "delete"};

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* A new empty file from the template path (XXXXXX replaced). */
static void new_file(char *path)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

static void test_pct_nearest_rank(void **state)
{
    (void)state;
    double v[10] = {10, 1, 9, 2, 8, 3, 7, 4, 6, 5};
    assert_true(bench_pct(v, 10, 50) == 5);
    assert_true(bench_pct(v, 10, 90) == 9);
    assert_true(bench_pct(v, 10, 99) == 10);
    assert_true(bench_pct(v, 10, 100) == 10);
    assert_true(bench_pct(v, 10, 0) == 1);
    assert_true(isnan(bench_pct(v, 0, 50)));
}

static void test_stats_leave_errors_out(void **state)
{
    (void)state;
    /* A fast refusal must not make the operation look fast. */
    bench_sample_t s[] = {
        {.op = "create", .latency_ms = 100, .status = 201},
        {.op = "create", .latency_ms = 300, .status = 201},
        {.op = "create", .latency_ms = 1, .status = 503, .error = "status"},
        {.op = "exec", .latency_ms = 5, .status = 200, .error = "exit"},
    };
    bench_op_stats_t st;
    bench_op_stats("create", s, 4, 2.0, &st);
    assert_int_equal(st.n, 3);
    assert_int_equal(st.errors, 1);
    assert_true(st.p50 == 100 && st.max == 300);
    assert_true(st.rate == 1.5);
    bench_op_stats("exec", s, 4, 2.0, &st);
    assert_int_equal(st.errors, 1);
    assert_true(isnan(st.p50));
    bench_op_stats("delete", s, 4, 2.0, &st);
    assert_int_equal(st.n, 0);

    char path[] = "/tmp/test_bench_report.XXXXXX";
    new_file(path);
    assert_int_equal(bench_report_json(path, "{}", ops, 3, s, 4, 2.0), 0);
    const char *j = slurp(path);
    assert_non_null(strstr(j, "\"exec\":{\"n\":1,\"errors\":1,\"p50_ms\":null"));
    assert_null(strstr(j, "\"delete\""));
    assert_non_null(strstr(j, "\"error\":\"status\""));
    assert_non_null(strstr(j, "\"error\":null"));
    unlink(path);
}

static void test_svg_escapes_and_empty(void **state)
{
    (void)state;
    bench_sample_t s[] = {{.op = "create", .start_ms = 500, .latency_ms = 40, .status = 201},
                          {.op = "exec", .start_ms = 900, .latency_ms = 9, .error = "x"}};
    char path[] = "/tmp/test_bench_report.XXXXXX";
    new_file(path);
    assert_int_equal(bench_report_svg(path, "a <b> & \"c\" 'd'", ops, 3, s, 2, 1.0), 0);
    const char *x = slurp(path);
    assert_non_null(strstr(x, "a &lt;b&gt; &amp; &quot;c&quot; &apos;d&apos;"));
    assert_non_null(strstr(x, "id=\"op-create\""));
    assert_non_null(strstr(x, "id=\"op-exec\""));
    assert_null(strstr(x, "id=\"op-delete\""));
    assert_non_null(strstr(x, "no operation succeeded")); /* exec's panel */
    assert_null(strstr(x, "nan"));
    assert_int_equal(bench_report_svg(path, "t", ops, 3, s, 0, 0), 0);
    x = slurp(path);
    assert_non_null(strstr(x, "no samples"));
    assert_non_null(strstr(x, "</svg>"));
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pct_nearest_rank),
        cmocka_unit_test(test_stats_leave_errors_out),
        cmocka_unit_test(test_svg_escapes_and_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
