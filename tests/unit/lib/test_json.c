/* sp_json: strict RFC 8259 parsing of hostile input, limits, accessors and sp_json_int's exact
 * integer rule. The rejection cases follow JSONTestSuite's n_* files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "json.h"

static sp_json_doc_t *parse_ok_n(const char *text, size_t len, const sp_json_limits_t *lim)
{
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX] = "unset";
    int r = sp_json_parse(text, len, lim, &doc, err);
    if (r != 0)
        print_error("unexpected failure %d for %.60s: %s\n", r, text, err);
    assert_int_equal(r, 0);
    assert_non_null(doc);
    assert_string_equal(err, "");
    return doc;
}

static sp_json_doc_t *parse_ok(const char *text)
{
    return parse_ok_n(text, strlen(text), NULL);
}

/* Expects failure with code; returns the offset from the message, checking its format. */
static size_t parse_fail_n(const char *text, size_t len, const sp_json_limits_t *lim, int code,
                           const char *reason)
{
    sp_json_doc_t *doc = (sp_json_doc_t *)0x1;
    char err[SP_JSON_ERR_MAX] = "";
    char *end = NULL;
    int r = sp_json_parse(text, len, lim, &doc, err);
    if (r != code)
        print_error("input %.60s: got %d (%s), want %d\n", text, r, err, code);
    assert_int_equal(r, code);
    assert_ptr_equal(doc, (sp_json_doc_t *)0x1); /* untouched on failure */
    /* "offset N: reason" */
    assert_int_equal(strncmp(err, "offset ", 7), 0);
    assert_true(err[7] >= '0' && err[7] <= '9');
    size_t off = (size_t)strtoull(err + 7, &end, 10);
    assert_int_equal(strncmp(end, ": ", 2), 0);
    assert_true(end[2] != '\0');
    if (reason && !strstr(err, reason)) {
        print_error("input %.60s: error \"%s\" lacks \"%s\"\n", text, err, reason);
        fail();
    }
    return off;
}

static size_t parse_fail(const char *text, int code, const char *reason)
{
    return parse_fail_n(text, strlen(text), NULL, code, reason);
}

static char *repeat(const char *open, size_t n, const char *mid, const char *close)
{
    size_t lo = strlen(open), lm = strlen(mid), lc = strlen(close);
    char *s = malloc(n * (lo + lc) + lm + 1);
    char *p = s;
    assert_non_null(s);
    for (size_t i = 0; i < n; i++, p += lo)
        memcpy(p, open, lo);
    memcpy(p, mid, lm);
    p += lm;
    for (size_t i = 0; i < n; i++, p += lc)
        memcpy(p, close, lc);
    *p = '\0';
    return s;
}

static void test_scalars(void **state)
{
    sp_json_doc_t *doc;
    bool b = false;
    double d = 0;
    int64_t i = 0;
    size_t len = 99;

    doc = parse_ok(" \t\r\nnull\n ");
    assert_int_equal(sp_json_type(sp_json_root(doc)), SP_JSON_NULL);
    sp_json_doc_free(doc);

    doc = parse_ok("true");
    assert_int_equal(sp_json_bool(sp_json_root(doc), &b), 0);
    assert_true(b);
    sp_json_doc_free(doc);

    doc = parse_ok("false");
    assert_int_equal(sp_json_type(sp_json_root(doc)), SP_JSON_BOOL);
    assert_int_equal(sp_json_bool(sp_json_root(doc), &b), 0);
    assert_false(b);
    sp_json_doc_free(doc);

    doc = parse_ok("-12.5e-1");
    assert_int_equal(sp_json_type(sp_json_root(doc)), SP_JSON_NUMBER);
    assert_int_equal(sp_json_double(sp_json_root(doc), &d), 0);
    assert_true(d == -1.25);
    assert_int_equal(sp_json_int(sp_json_root(doc), INT64_MIN, INT64_MAX, &i), -EINVAL);
    sp_json_doc_free(doc);

    doc = parse_ok("42");
    assert_int_equal(sp_json_int(sp_json_root(doc), 0, 100, &i), 0);
    assert_int_equal(i, 42);
    assert_int_equal(sp_json_double(sp_json_root(doc), &d), 0);
    assert_true(d == 42.0);
    sp_json_doc_free(doc);

    doc = parse_ok("\"hi\"");
    assert_int_equal(sp_json_type(sp_json_root(doc)), SP_JSON_STRING);
    assert_string_equal(sp_json_str(sp_json_root(doc), &len), "hi");
    assert_int_equal(len, 2);
    assert_string_equal(sp_json_str(sp_json_root(doc), NULL), "hi");
    sp_json_doc_free(doc);

    doc = parse_ok("\"\"");
    assert_string_equal(sp_json_str(sp_json_root(doc), &len), "");
    assert_int_equal(len, 0);
    sp_json_doc_free(doc);

    /* Numbers of every grammatical shape. */
    static const struct {
        const char *text;
        double want;
    } nums[] = {
        {"0", 0},         {"-0", -0.0},  {"0.5", 0.5},
        {"1E2", 100},     {"1e+2", 100}, {"1e-2", 0.01},
        {"-0.0e0", 0},    {"10", 10},    {"123456789", 123456789},
        {"1.5E+3", 1500}, {"0e0", 0},    {"2.25", 2.25},
        {"1e-400", 0},
    };
    for (size_t k = 0; k < sizeof(nums) / sizeof(nums[0]); k++) {
        doc = parse_ok(nums[k].text);
        assert_int_equal(sp_json_double(sp_json_root(doc), &d), 0);
        assert_true(d == nums[k].want);
        sp_json_doc_free(doc);
    }
}

static void test_containers(void **state)
{
    const char *text = "{\"name\": \"box\", \"resources\": {\"vcpu\": 2, \"mem\": 512},\n"
                       " \"tags\": [\"a\", 1, true, null, [], {}], \"empty\": \"\"}";
    sp_json_doc_t *doc = parse_ok(text);
    const sp_json_t *root = sp_json_root(doc);
    const sp_json_t *tags = sp_json_get(root, "tags");
    int64_t i = 0;
    bool b = false;

    assert_int_equal(sp_json_type(root), SP_JSON_OBJECT);
    assert_int_equal(sp_json_len(root), 4);
    assert_string_equal(sp_json_key_at(root, 0), "name");
    assert_string_equal(sp_json_key_at(root, 1), "resources");
    assert_string_equal(sp_json_key_at(root, 2), "tags");
    assert_string_equal(sp_json_key_at(root, 3), "empty");
    assert_null(sp_json_key_at(root, 4));
    assert_ptr_equal(sp_json_at(root, 2), tags);
    assert_null(sp_json_at(root, 4));
    assert_string_equal(sp_json_str(sp_json_get(root, "name"), NULL), "box");
    assert_string_equal(sp_json_str(sp_json_at(root, 0), NULL), "box");

    /* Chained lookups, absent at any level. */
    assert_int_equal(sp_json_int(sp_json_get(sp_json_get(root, "resources"), "vcpu"), 1, 64, &i),
                     0);
    assert_int_equal(i, 2);
    assert_null(sp_json_get(sp_json_get(root, "nope"), "vcpu"));
    assert_null(sp_json_get(root, "nam"));
    assert_null(sp_json_get(root, "names"));
    assert_null(sp_json_get(root, NULL));

    assert_int_equal(sp_json_type(tags), SP_JSON_ARRAY);
    assert_int_equal(sp_json_len(tags), 6);
    assert_string_equal(sp_json_str(sp_json_at(tags, 0), NULL), "a");
    assert_int_equal(sp_json_int(sp_json_at(tags, 1), 0, 9, &i), 0);
    assert_int_equal(i, 1);
    assert_int_equal(sp_json_bool(sp_json_at(tags, 2), &b), 0);
    assert_true(b);
    assert_int_equal(sp_json_type(sp_json_at(tags, 3)), SP_JSON_NULL);
    assert_int_equal(sp_json_type(sp_json_at(tags, 4)), SP_JSON_ARRAY);
    assert_int_equal(sp_json_len(sp_json_at(tags, 4)), 0);
    assert_null(sp_json_at(sp_json_at(tags, 4), 0));
    assert_int_equal(sp_json_type(sp_json_at(tags, 5)), SP_JSON_OBJECT);
    assert_int_equal(sp_json_len(sp_json_at(tags, 5)), 0);
    assert_null(sp_json_key_at(sp_json_at(tags, 5), 0));
    assert_null(sp_json_at(tags, 6));
    assert_null(sp_json_at(tags, SIZE_MAX));
    assert_null(sp_json_key_at(tags, 0));
    sp_json_doc_free(doc);

    doc = parse_ok("[[[1]],[2,[3,[4]]]]");
    root = sp_json_root(doc);
    assert_int_equal(sp_json_int(sp_json_at(sp_json_at(sp_json_at(root, 1), 1), 0), 0, 9, &i), 0);
    assert_int_equal(i, 3);
    sp_json_doc_free(doc);
}

static void test_strings(void **state)
{
    static const struct {
        const char *json;
        const char *want;
        size_t want_len;
    } cases[] = {
        {"\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", "\" \\ / \b \f \n \r \t", 15},
        {"\"\\u0041\\u00e9\\u00E9\"", "A\xc3\xa9\xc3\xa9", 5},
        {"\"\\u20ac\"", "\xe2\x82\xac", 3},
        {"\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80", 4},           /* U+1F600 via a surrogate pair */
        {"\"\\uDBFF\\uDFFF\"", "\xf4\x8f\xbf\xbf", 4},           /* U+10FFFF, the last code point */
        {"\"\xc3\xa9\xe2\x82\xac\"", "\xc3\xa9\xe2\x82\xac", 5}, /* raw 2- and 3-byte */
        {"\"\xf0\x9f\x98\x80\"", "\xf0\x9f\x98\x80", 4},         /* raw 4-byte */
        {"\"\xf4\x8f\xbf\xbf\"", "\xf4\x8f\xbf\xbf", 4},         /* raw U+10FFFF */
        {"\"\xed\x9f\xbf\xee\x80\x80\"", "\xed\x9f\xbf\xee\x80\x80", 6}, /* around surrogates */
        {"\"\x7f\"", "\x7f", 1},                                         /* DEL needs no escape */
        {"\"\\u0001\"", "\x01", 1},
        {"\"a\\u0000\"", NULL, 0},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        size_t len = 0;
        if (!cases[k].want) {
            parse_fail(cases[k].json, -EINVAL, "\\u0000 is not allowed");
            continue;
        }
        sp_json_doc_t *doc = parse_ok(cases[k].json);
        const char *s = sp_json_str(sp_json_root(doc), &len);
        assert_int_equal(len, cases[k].want_len);
        assert_memory_equal(s, cases[k].want, len + 1); /* NUL-terminated */
        sp_json_doc_free(doc);
    }
}

/* JSONTestSuite n_* style: each must fail with -EINVAL at the given offset. */
static void test_rejects(void **state)
{
    static const struct {
        const char *text;
        size_t len; /* 0: strlen */
        size_t off;
        const char *reason;
    } cases[] = {
        {"", 0, 0, "unexpected end of input"},
        {" \n\t ", 0, 4, "unexpected end of input"},
        {"[1,]", 0, 3, "expected a value, found ']'"},
        {"[1,2,]", 0, 5, "expected a value"},
        {"{\"a\":1,}", 0, 7, "object key"},
        {"[,1]", 0, 1, "expected a value"},
        {"{,}", 0, 1, "object key"},
        {"[1 2]", 0, 3, "',' or ']'"},
        {"{\"a\":1 \"b\":2}", 0, 7, "',' or '}'"},
        {"{\"a\" 1}", 0, 5, "expected ':' after object key"},
        {"{\"a\"}", 0, 4, "':'"},
        {"{1:2}", 0, 1, "object key"},
        {"{'a':1}", 0, 1, "object key"},
        {"['a']", 0, 1, "expected a value, found 0x27"},
        {"[1", 0, 2, "unexpected end of input"},
        {"{\"a\":1", 0, 6, "unexpected end of input"},
        {"{\"a\":", 0, 5, "unexpected end of input"},
        {"[", 0, 1, "unexpected end of input"},
        {"]", 0, 0, "expected a value"},
        {"01", 0, 0, "leading zeros"},
        {"-01", 0, 1, "leading zeros"},
        {"[00]", 0, 1, "leading zeros"},
        {"-", 0, 1, "expected a digit"},
        {"-a", 0, 1, "expected a digit"},
        {"1.", 0, 2, "after '.'"},
        {"1.e3", 0, 2, "after '.'"},
        {".5", 0, 0, "expected a value, found '.'"},
        {"+1", 0, 0, "expected a value"},
        {"1e", 0, 2, "exponent"},
        {"1e+", 0, 3, "exponent"},
        {"1E-x", 0, 3, "exponent"},
        {"0x10", 0, 1, "unexpected 'x' after the value"},
        {"1 2", 0, 2, "after the value"},
        {"[] x", 0, 3, "after the value"},
        {"{}}", 0, 2, "after the value"},
        {"\"a\"\"b\"", 0, 3, "after the value"},
        {"nul", 0, 0, "invalid literal"},
        {"tru", 0, 0, "invalid literal"},
        {"falsy", 0, 0, "invalid literal"},
        {"True", 0, 0, "expected a value"},
        {"nulll", 0, 4, "after the value"},
        {"NaN", 0, 0, "expected a value"},
        {"Infinity", 0, 0, "expected a value"},
        {"-Infinity", 0, 1, "expected a digit"},
        {"[1] // c", 0, 4, "after the value"},
        {"/* c */ 1", 0, 0, "expected a value"},
        {"\xef\xbb\xbf{}", 0, 0, "found 0xef"}, /* a byte order mark */
        {"\"abc", 0, 0, "unterminated string"},
        {"\"abc\\", 0, 0, "unterminated string"},
        {"\"a\x01\"", 0, 2, "unescaped control character 0x01"},
        {"\"a\nb\"", 0, 2, "unescaped control character 0x0a"},
        {"\"\t\"", 0, 1, "unescaped control character 0x09"},
        {"\"a\0b\"", 5, 2, "unescaped control character 0x00"},
        {"[1]\0", 4, 3, "unexpected 0x00 after the value"},
        {"\"\\x41\"", 0, 1, "invalid escape \\'x'"},
        {"\"\\a\"", 0, 1, "invalid escape"},
        {"\"\\'\"", 0, 1, "invalid escape \\0x27"},
        {"\"\\U0041\"", 0, 1, "invalid escape"},
        {"\"\\u12\"", 0, 1, "four hex digits"},
        {"\"\\u12g4\"", 0, 1, "four hex digits"},
        {"\"\\u", 0, 1, "four hex digits"},
        {"\"\\ud800\"", 0, 1, "high surrogate \\ud800 not followed"},
        {"\"\\ud800x\"", 0, 1, "not followed by a low surrogate"},
        {"\"\\ud800\\u0041\"", 0, 1, "not followed by a low surrogate"},
        {"\"\\ud800\\ud800\"", 0, 1, "not followed by a low surrogate"},
        {"\"\\ud800\\n\"", 0, 1, "not followed by a low surrogate"},
        {"\"\\udc00\"", 0, 1, "lone low surrogate"},
        {"\"ab\\uDFFF\\uD800\"", 0, 3, "lone low surrogate"},
        {"\"\\u0000\"", 0, 1, "\\u0000"},
        {"\"\xc0\xaf\"", 0, 1, "invalid UTF-8 byte 0xc0"},         /* overlong '/' */
        {"\"\xc1\xbf\"", 0, 1, "invalid UTF-8"},                   /* overlong */
        {"\"\xe0\x80\xaf\"", 0, 1, "invalid UTF-8 byte 0xe0"},     /* overlong 3-byte */
        {"\"\xe0\x9f\xbf\"", 0, 1, "invalid UTF-8"},               /* overlong 3-byte */
        {"\"\xf0\x80\x80\xaf\"", 0, 1, "invalid UTF-8"},           /* overlong 4-byte */
        {"\"\xf0\x8f\xbf\xbf\"", 0, 1, "invalid UTF-8"},           /* overlong 4-byte */
        {"\"\xed\xa0\x80\"", 0, 1, "invalid UTF-8 byte 0xed"},     /* U+D800 in UTF-8 */
        {"\"\xed\xbf\xbf\"", 0, 1, "invalid UTF-8"},               /* U+DFFF in UTF-8 */
        {"\"\xf4\x90\x80\x80\"", 0, 1, "invalid UTF-8 byte 0xf4"}, /* U+110000 */
        {"\"\xf5\x80\x80\x80\"", 0, 1, "invalid UTF-8 byte 0xf5"},
        {"\"\xff\"", 0, 1, "invalid UTF-8 byte 0xff"},
        {"\"\xfe\"", 0, 1, "invalid UTF-8"},
        {"\"a\x80\"", 0, 2, "invalid UTF-8 byte 0x80"}, /* lone continuation byte */
        {"\"\xc3\"", 0, 1, "invalid UTF-8"},            /* truncated before the quote */
        {"\"\xe2\x82\"", 0, 1, "invalid UTF-8"},
        {"\"\xc3", 0, 1, "invalid UTF-8"}, /* truncated at the end of input */
        {"\"\xf0\x9f\x98", 0, 1, "invalid UTF-8"},
        {"\xff", 0, 0, "found 0xff"}, /* non-ASCII outside strings */
        {"[\xc3\xa9]", 0, 1, "found 0xc3"},
        {"{\"a\":1,\"a\":2}", 0, 7, "duplicate object key"},
        {"{\"a\":1,\"b\":{},\"\\u0061\":2}", 0, 14, "duplicate object key"},
        {"[{\"x\":[],\"x\":[]}]", 0, 9, "duplicate object key"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        size_t len = cases[k].len ? cases[k].len : strlen(cases[k].text);
        size_t off = parse_fail_n(cases[k].text, len, NULL, -EINVAL, cases[k].reason);
        if (off != cases[k].off)
            print_error("case %zu (%s): offset %zu, want %zu\n", k, cases[k].text, off,
                        cases[k].off);
        assert_int_equal(off, cases[k].off);
    }
}

/* Keys that look alike but are not duplicates, and the exact error text. */
static void test_keys(void **state)
{
    sp_json_doc_t *doc = parse_ok("{\"a\":1,\"ab\":2,\"A\":3,\"\":4,\"b\":{\"a\":5}}");
    const sp_json_t *root = sp_json_root(doc);
    int64_t i = 0;
    assert_int_equal(sp_json_len(root), 5);
    assert_int_equal(sp_json_int(sp_json_get(root, ""), 0, 9, &i), 0);
    assert_int_equal(i, 4);
    assert_int_equal(sp_json_int(sp_json_get(root, "A"), 0, 9, &i), 0);
    assert_int_equal(i, 3);
    sp_json_doc_free(doc);

    char err[SP_JSON_ERR_MAX];
    sp_json_doc_t *out = NULL;
    const char *text = "{\"resources\": {\"a\" 1}}";
    assert_int_equal(sp_json_parse(text, strlen(text), NULL, &out, err), -EINVAL);
    assert_string_equal(err, "offset 19: expected ':' after object key, found '1'");
    assert_null(out);
    /* err may be NULL; the code still says why. */
    assert_int_equal(sp_json_parse(text, strlen(text), NULL, &out, NULL), -EINVAL);
    assert_int_equal(sp_json_parse(NULL, 1, NULL, &out, err), -EINVAL);
    assert_int_equal(sp_json_parse("1", 1, NULL, NULL, err), -EINVAL);
    assert_int_equal(sp_json_parse(NULL, 0, NULL, &out, err), -EINVAL); /* empty input */
    assert_null(out);
}

/* Objects above the pairwise threshold are checked by sorting: distinct keys pass, and the
 * first repetition in document order is the one reported. */
static void test_large_objects(void **state)
{
    enum { N = 50000 };
    char *text = malloc((size_t)N * 16 + 64);
    size_t len = 0;
    assert_non_null(text);

    text[len++] = '{';
    for (int k = 0; k < N; k++)
        len += (size_t)sprintf(text + len, "%s\"k%d\":%d", k ? "," : "", (k * 7919) % N, k);
    text[len++] = '}';
    sp_json_doc_t *doc = parse_ok_n(text, len, NULL);
    const sp_json_t *root = sp_json_root(doc);
    int64_t i = 0;
    assert_int_equal(sp_json_len(root), N);
    assert_int_equal(sp_json_int(sp_json_get(root, "k7919"), 0, N, &i), 0);
    assert_int_equal(i, 1);
    assert_string_equal(sp_json_key_at(root, N - 1), "k42081"); /* 49999 * 7919 % 50000 */
    sp_json_doc_free(doc);

    /* Two repeated keys; the earlier repetition ("k5" at the second-to-last member) wins. */
    len--;
    size_t second = len + 1;
    len += (size_t)sprintf(text + len, ",\"k5\":1,\"k3\":2}");
    size_t off = parse_fail_n(text, len, NULL, -EINVAL, "duplicate object key");
    assert_int_equal(off, second);

    /* Same below the threshold. */
    off = parse_fail("{\"a\":1,\"b\":2,\"b\":3,\"a\":4}", -EINVAL, "duplicate");
    assert_int_equal(off, 13);
    free(text);
}

static void test_limits(void **state)
{
    sp_json_limits_t lim = {0};
    char *s;

    /* Depth: 32 levels pass by default, 33 do not; objects count like arrays. */
    s = repeat("[", 32, "1", "]");
    sp_json_doc_free(parse_ok(s));
    free(s);
    s = repeat("[", 33, "", "]");
    assert_int_equal(parse_fail(s, SP_ETOOBIG, "nesting deeper than 32"), 32);
    free(s);
    s = repeat("{\"a\":", 33, "1", "}");
    assert_int_equal(parse_fail(s, SP_ETOOBIG, "nesting"), 32 * 5);
    free(s);
    lim.max_depth = 2;
    sp_json_doc_free(parse_ok_n("[{}]", 4, &lim));
    parse_fail_n("[[[]]]", 6, &lim, SP_ETOOBIG, "nesting deeper than 2");
    lim.max_depth = 0;

    /* Input size: 1 MiB passes, one byte more does not. */
    size_t mib = (size_t)1 << 20;
    s = malloc(mib + 2);
    assert_non_null(s);
    memset(s, ' ', mib + 1);
    s[0] = '[';
    s[mib - 1] = ']';
    sp_json_doc_free(parse_ok_n(s, mib, NULL));
    assert_int_equal(parse_fail_n(s, mib + 1, NULL, SP_ETOOBIG, "more than 1048576"), mib);
    lim.max_bytes = 10;
    parse_fail_n("[1, 2, 3, 4]", 12, &lim, SP_ETOOBIG, "input is 12 bytes");
    lim.max_bytes = 0;

    /* String length counts decoded bytes: 64 KiB passes, one more does not. */
    size_t max = (size_t)64 << 10;
    memset(s, 'x', max + 3);
    s[0] = '"';
    s[max + 1] = '"';
    sp_json_doc_free(parse_ok_n(s, max + 2, NULL));
    s[max + 1] = 'x';
    s[max + 2] = '"';
    assert_int_equal(parse_fail_n(s, max + 3, NULL, SP_ETOOBIG, "string longer than 65536"), 0);
    free(s);
    lim.max_string = 4;
    sp_json_doc_free(parse_ok_n("\"\\u00e9\\u00e9\"", 14, &lim)); /* 12 escaped, 4 decoded */
    parse_fail_n("\"\\u00e9\\u00e9a\"", 15, &lim, SP_ETOOBIG, "string longer than 4");
    parse_fail_n("[\"\\ud83d\\ude00\\n\"]", 18, &lim, SP_ETOOBIG, "string longer");
    assert_int_equal(parse_fail_n("{\"abcd\":1,\"abcde\":2}", 20, &lim, SP_ETOOBIG, "string"),
                     10); /* keys too */
    lim.max_string = 0;

    /* Nodes: every value counts, containers included. */
    lim.max_nodes = 3;
    sp_json_doc_free(parse_ok_n("[1,2]", 5, &lim));
    sp_json_doc_free(parse_ok_n("{\"a\":[]}", 8, &lim));
    assert_int_equal(parse_fail_n("[1,2,3]", 7, &lim, SP_ETOOBIG, "more than 3 values"), 5);
    sp_json_doc_free(parse_ok_n("[[[]]]", 6, &lim));
    parse_fail_n("[[[[]]]]", 8, &lim, SP_ETOOBIG, "values");
    parse_fail_n("[1,null,true]", 13, &lim, SP_ETOOBIG, "values");
    /* A syntax error stays a syntax error at the limit. */
    parse_fail_n("[1,2,]", 6, &lim, -EINVAL, "expected a value");
    lim.max_nodes = 0;

    /* The default of 100000 values. */
    s = malloc(200016);
    assert_non_null(s);
    s[0] = '[';
    for (size_t k = 0; k < 100000; k++) {
        s[1 + 2 * k] = '0';
        s[2 + 2 * k] = ',';
    }
    s[2 * 99999] = ']'; /* 99999 zeros and the array */
    sp_json_doc_free(parse_ok_n(s, 2 * 99999 + 1, NULL));
    s[2 * 99999] = ',';
    s[2 * 100000] = ']'; /* 100000 zeros */
    parse_fail_n(s, 2 * 100000 + 1, NULL, SP_ETOOBIG, "more than 100000 values");
    free(s);

    /* Numbers: at most 256 bytes of text, and no overflow to infinity. */
    char num[300];
    memset(num, '1', sizeof(num));
    sp_json_doc_free(parse_ok_n(num, 256, NULL));
    assert_int_equal(parse_fail_n(num, 257, NULL, SP_ETOOBIG, "number longer than 256"), 0);
    parse_fail("1e400", SP_ETOOBIG, "out of the range of a double");
    parse_fail("[-1.5e99999999999999999999]", SP_ETOOBIG, "out of the range");
    sp_json_doc_free(parse_ok("[1e-99999999999999999999, 0e99999999999999999999, 1.7e308]"));
}

/* Far past the limit: an error, no crash. And with the limit lifted, a million levels parse,
 * which a recursive parser could not survive. */
static void test_deep_nesting(void **state)
{
    char *s = repeat("[", 200, "", "]");
    assert_int_equal(parse_fail(s, SP_ETOOBIG, "nesting"), 32);
    free(s);
    s = repeat("{\"a\":[", 200, "", "]}");
    parse_fail(s, SP_ETOOBIG, "nesting");
    free(s);

    size_t n = 1000000;
    sp_json_limits_t lim = {.max_depth = SIZE_MAX, .max_bytes = 3 * n, .max_nodes = 2 * n};
    s = repeat("[", n, "", "]");
    sp_json_doc_t *doc = parse_ok_n(s, 2 * n, &lim);
    const sp_json_t *v = sp_json_root(doc);
    size_t depth = 0;
    while (sp_json_len(v) == 1) {
        v = sp_json_at(v, 0);
        depth++;
    }
    assert_int_equal(depth, n - 1);
    assert_int_equal(sp_json_type(v), SP_JSON_ARRAY);
    sp_json_doc_free(doc);
    /* Unterminated: the error comes at the end, after a million open frames. */
    assert_int_equal(parse_fail_n(s, n, &lim, -EINVAL, "unexpected end of input"), n);
    free(s);
}

static void test_null_and_wrong_types(void **state)
{
    sp_json_doc_t *doc = parse_ok("[\"s\", 1, true, null, {\"k\": 1}]");
    const sp_json_t *root = sp_json_root(doc);
    const sp_json_t *str = sp_json_at(root, 0);
    const sp_json_t *num = sp_json_at(root, 1);
    const sp_json_t *bol = sp_json_at(root, 2);
    const sp_json_t *nul = sp_json_at(root, 3);
    const sp_json_t *obj = sp_json_at(root, 4);
    size_t len = 77;
    int64_t i = 77;
    double d = 77;
    bool b = true;

    /* NULL everywhere answers "absent". */
    sp_json_doc_free(NULL);
    assert_null(sp_json_root(NULL));
    assert_int_equal(sp_json_type(NULL), 0);
    assert_null(sp_json_get(NULL, "k"));
    assert_int_equal(sp_json_len(NULL), 0);
    assert_null(sp_json_at(NULL, 0));
    assert_null(sp_json_key_at(NULL, 0));
    assert_null(sp_json_str(NULL, &len));
    assert_int_equal(sp_json_int(NULL, 0, 10, &i), -EINVAL);
    assert_int_equal(sp_json_double(NULL, &d), -EINVAL);
    assert_int_equal(sp_json_bool(NULL, &b), -EINVAL);

    /* Wrong types, with outputs untouched. */
    const sp_json_t *not_obj[] = {root, str, num, bol, nul};
    for (size_t k = 0; k < 5; k++) {
        assert_null(sp_json_get(not_obj[k], "k"));
        assert_null(sp_json_key_at(not_obj[k], 0));
    }
    const sp_json_t *scalars[] = {str, num, bol, nul};
    for (size_t k = 0; k < 4; k++) {
        assert_int_equal(sp_json_len(scalars[k]), 0);
        assert_null(sp_json_at(scalars[k], 0));
    }
    const sp_json_t *not_str[] = {root, num, bol, nul, obj};
    for (size_t k = 0; k < 5; k++)
        assert_null(sp_json_str(not_str[k], &len));
    const sp_json_t *not_num[] = {root, str, bol, nul, obj};
    for (size_t k = 0; k < 5; k++) {
        assert_int_equal(sp_json_int(not_num[k], INT64_MIN, INT64_MAX, &i), -EINVAL);
        assert_int_equal(sp_json_double(not_num[k], &d), -EINVAL);
    }
    const sp_json_t *not_bool[] = {root, str, num, nul, obj};
    for (size_t k = 0; k < 5; k++)
        assert_int_equal(sp_json_bool(not_bool[k], &b), -EINVAL);
    assert_int_equal(len, 77);
    assert_int_equal(i, 77);
    assert_true(d == 77);
    assert_true(b);

    assert_int_equal(sp_json_len(obj), 1);
    assert_string_equal(sp_json_key_at(obj, 0), "k");
    assert_ptr_equal(sp_json_at(obj, 0), sp_json_get(obj, "k"));
    sp_json_doc_free(doc);
}

static int int_of(const char *text, int64_t min, int64_t max, int64_t *ret)
{
    sp_json_doc_t *doc = parse_ok(text);
    int r = sp_json_int(sp_json_root(doc), min, max, ret);
    sp_json_doc_free(doc);
    return r;
}

static void test_int(void **state)
{
    static const struct {
        const char *text;
        int want_r;
        int64_t want;
    } cases[] = {
        {"3", 0, 3},
        {"-0", 0, 0},
        {"0", 0, 0},
        {"1e3", 0, 1000},
        {"1E+3", 0, 1000},
        {"3.0", 0, 3},
        {"3.000e0", 0, 3},
        {"0.5e1", 0, 5},
        {"1.5e1", 0, 15},
        {"-25e-1", -EINVAL, 0},
        {"250e-1", 0, 25},
        {"0.0", 0, 0},
        {"-0.0e-5", 0, 0},
        {"0e99999999999999999999", 0, 0},
        {"3.5", -EINVAL, 0},
        {"1e-1", -EINVAL, 0},
        {"0.1", -EINVAL, 0},
        {"1e-400", -EINVAL, 0},
        {"1.0000000000000000000001", -EINVAL, 0}, /* as a double it is exactly 1 */
        {"12345678901234567890123e-4", -EINVAL, 0},
        {"100000000000000000000e-2", 0, 1000000000000000000},
        {"0.0000000000000000000000001e25", 0, 1},
        {"9007199254740993", 0, 9007199254740993}, /* 2^53 + 1: not a double */
        {"9223372036854775807", 0, INT64_MAX},
        {"9223372036854775808", -ERANGE, 0},
        {"-9223372036854775808", 0, INT64_MIN},
        {"-9223372036854775809", -ERANGE, 0},
        {"922337203685477580.7e1", 0, INT64_MAX},
        {"92233720368547758080e-1", -ERANGE, 0},
        {"1e18", 0, 1000000000000000000},
        {"1e19", -ERANGE, 0},
        {"-1e19", -ERANGE, 0},
        {"1e308", -ERANGE, 0},
        {"1e-99999999999999999999", -EINVAL, 0}, /* saturated exponent */
        {"1e300", -ERANGE, 0},
        {"99999999999999999999", -ERANGE, 0},
        {"10000000000000000000", -ERANGE, 0},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int64_t v = -77;
        sp_json_doc_t *doc = NULL;
        char err[SP_JSON_ERR_MAX];
        assert_int_equal(sp_json_parse(cases[k].text, strlen(cases[k].text), NULL, &doc, err), 0);
        int r = sp_json_int(sp_json_root(doc), INT64_MIN, INT64_MAX, &v);
        sp_json_doc_free(doc);
        if (r != cases[k].want_r || (r == 0 && v != cases[k].want))
            print_error("%s: got %d/%lld, want %d/%lld\n", cases[k].text, r, (long long)v,
                        cases[k].want_r, (long long)cases[k].want);
        assert_int_equal(r, cases[k].want_r);
        assert_true(v == (r == 0 ? cases[k].want : -77)); /* untouched on failure */
    }

    /* The caller's range. */
    int64_t v = -77;
    assert_int_equal(int_of("10", 0, 10, &v), 0);
    assert_int_equal(v, 10);
    assert_int_equal(int_of("0", 0, 10, &v), 0);
    assert_int_equal(v, 0);
    v = -77;
    assert_int_equal(int_of("11", 0, 10, &v), -ERANGE);
    assert_int_equal(int_of("-1", 0, 10, &v), -ERANGE);
    assert_int_equal(int_of("-0", 1, 10, &v), -ERANGE);
    assert_int_equal(int_of("1e1", 0, 9, &v), -ERANGE);
    assert_int_equal(int_of("5.5", 0, 9, &v), -EINVAL); /* a fraction is not a range error */
    assert_int_equal(v, -77);
    assert_int_equal(int_of("-5", -5, -5, &v), 0);
    assert_int_equal(v, -5);
}

/* The length argument bounds the input: bytes after it are never read. */
static void test_not_nul_terminated(void **state)
{
    const char buf[] = {'[', '1', ']', 'x', 'y'};
    sp_json_doc_free(parse_ok_n(buf, 3, NULL));
    parse_fail_n(buf, 4, NULL, -EINVAL, "unexpected 'x'");
    parse_fail_n("\"abc\"", 4, NULL, -EINVAL, "unterminated string");
    parse_fail_n("true", 3, NULL, -EINVAL, "invalid literal");
    sp_json_doc_free(parse_ok_n("12", 1, NULL));
    parse_fail_n("\"\\u0041\"", 6, NULL, -EINVAL, "four hex digits");
    parse_fail_n("\"\\ud83d\\ude00\"", 12, NULL, -EINVAL, "low surrogate");

    /* An arena spanning many chunks, and strings handed out NUL-terminated at exact lengths. */
    char text[40000];
    size_t len = 0;
    text[len++] = '[';
    for (int k = 0; k < 3000; k++)
        len += (size_t)sprintf(text + len, "%s\"s%d\"", k ? "," : "", k);
    text[len++] = ']';
    sp_json_doc_t *doc = parse_ok_n(text, len, NULL);
    for (size_t k = 0; k < 3000; k++) {
        char want[16];
        size_t n = 0;
        snprintf(want, sizeof(want), "s%zu", k);
        assert_string_equal(sp_json_str(sp_json_at(sp_json_root(doc), k), &n), want);
        assert_int_equal(n, strlen(want));
    }
    sp_json_doc_free(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_containers),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_large_objects),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_null_and_wrong_types),
        cmocka_unit_test(test_int),
        cmocka_unit_test(test_not_nul_terminated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
