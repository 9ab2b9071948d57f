/* PostgreSQL's binary COPY format (lib/pgcopy.c), byte by byte as the PostgreSQL docs (COPY,
 * "Binary Format") and each type's recv function read it. The round trip through a real
 * PostgreSQL is tests/integration/eventlog_copy.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "pgcopy.h"

static void expect(const sp_buf_t *b, const void *want, size_t len)
{
    assert_int_equal(b->len, len);
    assert_memory_equal(b->data, want, len);
}

static void test_header_trailer(void **state)
{
    (void)state;
    sp_buf_t b;
    static const uint8_t header[19] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xff, '\r', '\n',
                                       0,   0,   0,   0,   0,   0,   0,    0,    0};
    sp_buf_init(&b);
    sp_pgcopy_header(&b);
    expect(&b, header, sizeof(header));
    sp_buf_reset(&b);
    sp_pgcopy_trailer(&b);
    expect(&b, "\xff\xff", 2);
    sp_buf_reset(&b);
    sp_pgcopy_tuple(&b, 21);
    expect(&b, "\x00\x15", 2);
    sp_buf_dispose(&b);
}

static void test_fields(void **state)
{
    (void)state;
    sp_buf_t b;
    sp_buf_init(&b);
    sp_pgcopy_null(&b);
    expect(&b, "\xff\xff\xff\xff", 4);
    sp_buf_reset(&b);
    sp_pgcopy_int2(&b, -2);
    expect(&b, "\x00\x00\x00\x02\xff\xfe", 6);
    sp_buf_reset(&b);
    sp_pgcopy_int4(&b, 0x01020304);
    expect(&b, "\x00\x00\x00\x04\x01\x02\x03\x04", 8);
    sp_buf_reset(&b);
    sp_pgcopy_int8(&b, INT64_MIN);
    expect(&b, "\x00\x00\x00\x08\x80\x00\x00\x00\x00\x00\x00\x00", 12);
    /* bytea and text: the bytes themselves, NUL and 0xff included; empty is not NULL. */
    sp_buf_reset(&b);
    assert_int_equal(sp_pgcopy_bytes(&b, "\x00\xff\\", 3), 0);
    expect(&b, "\x00\x00\x00\x03\x00\xff\\", 7);
    sp_buf_reset(&b);
    assert_int_equal(sp_pgcopy_bytes(&b, NULL, 0), 0);
    expect(&b, "\x00\x00\x00\x00", 4);
    sp_buf_reset(&b);
    assert_int_equal(sp_pgcopy_text(&b, "é\t\n"), 0);
    expect(&b, "\x00\x00\x00\x04\xc3\xa9\t\n", 8);
    sp_buf_reset(&b);
    assert_int_equal(sp_pgcopy_text(&b, NULL), 0);
    expect(&b, "\xff\xff\xff\xff", 4);
    sp_buf_reset(&b);
    assert_int_equal(sp_pgcopy_bytes(&b, "", (size_t)INT32_MAX + 1), -E2BIG);
    assert_int_equal(b.len, 0);
    sp_buf_dispose(&b);
}

static void test_timestamptz(void **state)
{
    (void)state;
    sp_buf_t b;
    sp_buf_init(&b);
    /* 2000-01-01 00:00:00 UTC is PostgreSQL's zero; the Unix epoch is before it. */
    sp_pgcopy_timestamptz_us(&b, 946684800000000LL);
    expect(&b, "\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00", 12);
    sp_buf_reset(&b);
    sp_pgcopy_timestamptz_us(&b, 946684800000001LL);
    expect(&b, "\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x01", 12);
    sp_buf_reset(&b);
    sp_pgcopy_timestamptz_us(&b, 0);
    expect(&b, "\x00\x00\x00\x08\xff\xfc\xa2\xfe\xc4\xc8\x20\x00", 12); /* -946684800000000 */
    sp_buf_reset(&b);
    sp_pgcopy_timestamptz_us(&b, INT64_MIN); /* no overflow; PostgreSQL refuses the value */
    assert_int_equal(b.len, 12);
    sp_buf_dispose(&b);
}

static void test_uuid(void **state)
{
    (void)state;
    sp_buf_t b;
    sp_buf_init(&b);
    assert_int_equal(sp_pgcopy_uuid(&b, "0190F5A2-7b3c-7d4e-8f60-abcdefabcdef"), 0);
    expect(&b, "\x00\x00\x00\x10\x01\x90\xf5\xa2\x7b\x3c\x7d\x4e\x8f\x60\xab\xcd\xef\xab\xcd\xef",
           20);
    sp_buf_reset(&b);
    assert_int_equal(sp_pgcopy_uuid(&b, NULL), 0);
    expect(&b, "\xff\xff\xff\xff", 4);
    sp_buf_reset(&b);
    assert_int_equal(sp_pgcopy_uuid(&b, ""), -EINVAL);
    assert_int_equal(sp_pgcopy_uuid(&b, "0190f5a2-7b3c-7d4e-8f60-abcdefabcdeg"), -EINVAL);
    assert_int_equal(sp_pgcopy_uuid(&b, "0190f5a27b3c7d4e8f60abcdefabcdef"), -EINVAL);
    assert_int_equal(b.len, 0);
    sp_buf_dispose(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_trailer),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_timestamptz),
        cmocka_unit_test(test_uuid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
