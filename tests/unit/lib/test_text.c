/* The one UTF-8 decoder and the text rule every event field follows. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "text.h"

static void test_utf8_seq(void **state)
{
    bool partial;
    (void)state;
    assert_int_equal(sp_utf8_seq((const uint8_t *)"a", 1, NULL), 1);
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xc3\xa9", 2, NULL), 2);
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xe2\x82\xac", 3, NULL), 3);
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xf0\x9f\x98\x80", 4, NULL), 4);
    /* Overlong, surrogate, beyond U+10FFFF, stray continuation, invalid lead bytes. */
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xc0\xaf", 2, NULL), 0);
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xe0\x80\xaf", 3, NULL), 0);
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xed\xa0\x80", 3, NULL), 0);
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xf4\x90\x80\x80", 4, NULL), 0);
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\x80", 1, NULL), 0);
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xff", 1, NULL), 0);
    /* A valid start cut by the end of the buffer is partial; a bad one is not. */
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xe2\x82", 2, &partial), 0);
    assert_true(partial);
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xe2\x41", 2, &partial), 0);
    assert_false(partial);
    /* NUL ends a sequence: a terminated string may be read with avail 4. */
    assert_int_equal(sp_utf8_seq((const uint8_t *)"\xe2\x82", 4, &partial), 0);
}

static void test_text_valid(void **state)
{
    (void)state;
    assert_true(sp_text_valid("plain \xc3\xa9t\xc3\xa9", 64, 0));
    assert_false(sp_text_valid("two\nlines", 64, 0));
    assert_true(sp_text_valid("two\nlines\tand\rcr", 64, SP_TEXT_SPACE_CONTROLS));
    assert_false(sp_text_valid("bell\a", 64, SP_TEXT_SPACE_CONTROLS));
    assert_false(sp_text_valid("del\x7f", 64, SP_TEXT_SPACE_CONTROLS));
    assert_false(sp_text_valid("bad \xff", 64, 0));
    assert_false(sp_text_valid("cut \xe2\x82", 64, 0));
    assert_true(sp_text_valid("12345", 5, 0));
    assert_false(sp_text_valid("123456", 5, 0));
    assert_true(sp_text_valid("", 0, 0));
}

static void test_hex_digit(void **state)
{
    (void)state;
    assert_int_equal(sp_hex_digit('0'), 0);
    assert_int_equal(sp_hex_digit('9'), 9);
    assert_int_equal(sp_hex_digit('a'), 10);
    assert_int_equal(sp_hex_digit('F'), 15);
    assert_int_equal(sp_hex_digit('g'), -1);
    assert_int_equal(sp_hex_digit('\0'), -1);
}

static void test_time_parse(void **state)
{
    (void)state;
    int64_t us = 0;
    assert_int_equal(sp_time_parse("2026-01-02T03:04:05Z", &us), 0);
    assert_int_equal(us, 1767323045LL * 1000000);
    assert_int_equal(sp_time_parse("2026-01-02T03:04:05.678Z", &us), 0);
    assert_int_equal(us, 1767323045LL * 1000000 + 678000);
    assert_int_equal(sp_time_parse("2026-01-02T03:04:05.1234567Z", &us), 0);
    assert_int_equal(us, 1767323045LL * 1000000 + 123456);
    assert_int_equal(sp_time_parse("2026-01-02T05:04:05+02:00", &us), 0);
    assert_int_equal(us, 1767323045LL * 1000000);
    assert_int_equal(sp_time_parse("2026-01-02T01:34:05-01:30", &us), 0);
    assert_int_equal(us, 1767323045LL * 1000000);
    const char *bad[] = {"",
                         "2026-01-02",
                         "2026-01-02T03:04:05",
                         "2026-01-02T03:04:05.Z",
                         "2026-01-02T03:04:05Zx",
                         "2026-01-02T03:04:05+2:00",
                         "2026-01-02T03:04:05+24:00",
                         "1969-12-31T23:59:59Z",
                         "now"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(sp_time_parse(bad[i], &us), -EINVAL);
    assert_int_equal(sp_time_parse(NULL, &us), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_seq),
        cmocka_unit_test(test_text_valid),
        cmocka_unit_test(test_hex_digit),
        cmocka_unit_test(test_time_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
