/* The CLI's aligned columns (cli/space_table.c): every column starts at the same offset on
 * every line whatever the lengths of the cells, two spaces apart, the last column unpadded,
 * NULL cells shown as "-", and a table wider than SP_TABLE_MAX_COLS printed not at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../../cli/space_table.c" /* NOLINT(bugprone-suspicious-include) */

#include <stdlib.h>

static char *print(const char *const *cells, size_t rows, size_t cols)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    assert_non_null(f);
    sp__table_print(f, cells, rows, cols);
    fclose(f);
    return out;
}

static void test_long_cells_move_the_columns(void **state)
{
    (void)state;
    const char *cells[] = {
        "ID",    "TENANT",
        "NAME",  "k1",
        "short", "a",
        "k2",    "a-tenant-name-of-sixty-four-characters-which-is-the-longest-one",
        "x"};
    char *out = print(cells, 3, 3);
    assert_string_equal(
        out, "ID  TENANT                                                           NAME\n"
             "k1  short                                                            a\n"
             "k2  a-tenant-name-of-sixty-four-characters-which-is-the-longest-one  x\n");
    free(out);
}

static void test_null_is_a_dash_and_no_trailing_blanks(void **state)
{
    (void)state;
    const char *cells[] = {"A", "B", NULL, "value"};
    char *out = print(cells, 2, 2);
    assert_string_equal(out, "A  B\n-  value\n");
    free(out);
}

static void test_too_many_columns_prints_nothing(void **state)
{
    (void)state;
    const char *cells[SP_TABLE_MAX_COLS + 1] = {0};
    char *out = print(cells, 1, SP_TABLE_MAX_COLS + 1);
    assert_string_equal(out, "");
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_cells_move_the_columns),
        cmocka_unit_test(test_null_is_a_dash_and_no_trailing_blanks),
        cmocka_unit_test(test_too_many_columns_prints_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
