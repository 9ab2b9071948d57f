/* sp_buf: growth, JSON string escaping, safe text for bytes from the network, and the
 * descriptor-driven envelope JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "buf.h"
#include "eventgen.h"

static void test_growth(void **state)
{
    sp_buf_t b;
    sp_buf_init(&b);
    for (int i = 0; i < 10000; i++)
        sp_buf_printf(&b, "%04d", i % 10000);
    assert_int_equal(b.len, 40000);
    assert_int_equal(strlen(b.data), 40000);
    assert_memory_equal(b.data + 39996, "9999", 4);
    sp_buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    sp_buf_dispose(&b);
}

static void test_json_escaping(void **state)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_json_str(&b, "a\"b\\c\nd\x01\x7f\xc3\xa9");
    assert_string_equal(b.data, "\"a\\\"b\\\\c\\nd\\u0001\\u007f\xc3\xa9\"");
    sp_buf_reset(&b);
    sp_buf_json_str(&b, NULL);
    assert_string_equal(b.data, "null");
    sp_buf_dispose(&b);
}

static void test_safe_text(void **state)
{
    sp_buf_t b;
    sp_buf_init(&b);
    /* Valid multi-byte UTF-8 passes; a stray byte, an overlong '/', a surrogate, a C1 control
     * and a newline are escaped. */
    sp_buf_safe_text(&b, "ok \xc3\xa9 \xff \xc0\xaf \xed\xa0\x80 \xc2\x85 \n", 1024);
    assert_string_equal(b.data, "ok \xc3\xa9 \\xff \\xc0\\xaf \\xed\\xa0\\x80 \\xc2\\x85 \\x0a");
    sp_buf_reset(&b);
    /* Truncated sequence at the end of the string: no read past the NUL. */
    sp_buf_safe_text(&b, "x\xe2\x82", 1024);
    assert_string_equal(b.data, "x\\xe2\\x82");
    sp_buf_reset(&b);
    sp_buf_safe_text(&b, "abcdef", 3);
    assert_string_equal(b.data, "abc");
    sp_buf_dispose(&b);
}

static void test_envelope_json(void **state)
{
    sp_eventgen_msg_t m;
    sp_envelope_t *e = NULL;
    char reason[SP_REASON_MAX];
    sp_buf_t b;

    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
                                         "t1", "sbx_json", NULL, &m),
                     0);
    assert_int_equal(sp_envelope_decode(m.data, m.len, &e, reason), 0);
    sp_buf_init(&b);
    sp_envelope_to_json(e, &b);
    assert_non_null(strstr(b.data, "\"type\":\"SandboxCreateRequested\""));
    assert_non_null(strstr(b.data, "\"aggregate\":{\"kind\":\"sandbox\",\"id\":\"sbx_json\"}"));
    assert_non_null(strstr(b.data, "\"metadata\":[{\"key\":\"purpose\",\"value\":\"demo\"}]"));
    assert_non_null(strstr(b.data, "\"resources\":{\"vcpu\":1,\"memory_mb\":256"));
    /* Only the payload case that is set. */
    assert_null(strstr(b.data, "sandbox_placed"));
    assert_int_equal(b.data[0], '{');
    assert_int_equal(b.data[b.len - 1], '}');
    sp_buf_dispose(&b);
    sp_envelope_free(e);
    sp_eventgen_msg_dispose(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_json_escaping),
        cmocka_unit_test(test_safe_text),
        cmocka_unit_test(test_envelope_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
