/* Log lines: every line read back with an independent strict parser (logfmt and RFC 8259 JSON
 * below), so a hostile value that forged a field, a line or broke the JSON would show up as a
 * wrong key list or a parse failure. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define MAXF 4096

typedef struct {
    char *key[MAXF];
    char *val[MAXF]; /* decoded; NULL for JSON null */
    bool str[MAXF];  /* JSON: value was a string */
    size_t n;
} fields_t;

static void fields_free(fields_t *f)
{
    for (size_t i = 0; i < f->n; i++) {
        free(f->key[i]);
        free(f->val[i]);
    }
    f->n = 0;
}

static const char *field(const fields_t *f, const char *key)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->key[i], key) == 0)
            return f->val[i] ? f->val[i] : "(null)";
    return NULL;
}

/* Growable decoded string. */
typedef struct {
    char *s;
    size_t n, cap;
} str_t;

static void str_put(str_t *b, char c)
{
    if (b->n + 2 > b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->s = realloc(b->s, b->cap);
        assert_non_null(b->s);
    }
    b->s[b->n++] = c;
    b->s[b->n] = '\0';
}

static void str_put_utf8(str_t *b, unsigned cp)
{
    if (cp < 0x80) {
        str_put(b, (char)cp);
    } else if (cp < 0x800) {
        str_put(b, (char)(0xc0 | cp >> 6));
        str_put(b, (char)(0x80 | (cp & 0x3f)));
    } else {
        str_put(b, (char)(0xe0 | cp >> 12));
        str_put(b, (char)(0x80 | ((cp >> 6) & 0x3f)));
        str_put(b, (char)(0x80 | (cp & 0x3f)));
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool hex_n(const char *p, int n, unsigned *ret)
{
    unsigned v = 0;
    for (int i = 0; i < n; i++) {
        int h = hexval(p[i]);
        if (h < 0)
            return false;
        v = v << 4 | (unsigned)h;
    }
    *ret = v;
    return true;
}

/* Decodes UTF-8 (RFC 3629); returns false at the first invalid sequence. With strict, also
 * rejects the code points a log line must never carry raw: C0/C1 controls, DEL, U+2028/U+2029
 * and the bidi overrides that make text read differently than it is. */
static bool utf8_check(const unsigned char *s, size_t n, bool strict)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        unsigned cp;
        size_t k;
        if (c < 0x80) {
            k = 1;
            cp = c;
        } else if (c >= 0xc2 && c <= 0xdf) {
            k = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + k > n)
            return false;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        if (strict && (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
                       (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)))
            return false;
        i += k;
    }
    return true;
}

static bool clean_utf8(const unsigned char *s, size_t n)
{
    return utf8_check(s, n, true);
}

static bool valid_utf8(const char *s)
{
    return utf8_check((const unsigned char *)s, strlen(s), false);
}

/* logfmt as sp_log writes it: key=bare or key="escaped", one space between fields, '\n' at the
 * end and nowhere else. Returns false on any deviation. */
static bool parse_kv(const char *line, fields_t *f)
{
    const char *p = line;
    size_t len = strlen(line);

    f->n = 0;
    if (len == 0 || line[len - 1] != '\n' || memchr(line, '\n', len - 1))
        return false;
    if (!clean_utf8((const unsigned char *)line, len - 1))
        return false;
    while (*p != '\n') {
        str_t k = {0}, v = {0};
        if (f->n > 0 && *p++ != ' ')
            goto bad;
        while (*p && *p != '=' && *p != ' ' && *p != '"' && *p != '\n')
            str_put(&k, *p++);
        if (!k.n || *p++ != '=')
            goto bad;
        str_put(&v, 'x'); /* non-NULL even when empty */
        v.n = 0;
        v.s[0] = '\0';
        if (*p == '"') {
            p++;
            for (;;) {
                unsigned cp;
                if (*p == '"')
                    break;
                if (*p == '\n' || !*p)
                    goto bad;
                if (*p != '\\') {
                    str_put(&v, *p++);
                    continue;
                }
                p++;
                switch (*p) {
                case 'n':
                    str_put(&v, '\n');
                    p++;
                    break;
                case 'r':
                    str_put(&v, '\r');
                    p++;
                    break;
                case 't':
                    str_put(&v, '\t');
                    p++;
                    break;
                case '"':
                    str_put(&v, '"');
                    p++;
                    break;
                case '\\':
                    str_put(&v, '\\');
                    p++;
                    break;
                case 'x':
                    if (!hex_n(p + 1, 2, &cp))
                        goto bad;
                    str_put(&v, (char)cp);
                    p += 3;
                    break;
                case 'u':
                    if (!hex_n(p + 1, 4, &cp))
                        goto bad;
                    str_put_utf8(&v, cp);
                    p += 5;
                    break;
                default:
                    goto bad;
                }
            }
            p++;
            if (*p != ' ' && *p != '\n')
                goto bad;
        } else {
            while (*p != ' ' && *p != '\n') {
                if (*p == '"' || *p == '=' || *p == '\\')
                    goto bad;
                str_put(&v, *p++);
            }
        }
        if (f->n == MAXF)
            goto bad;
        f->key[f->n] = k.s;
        f->val[f->n] = v.s;
        f->n++;
        continue;
    bad:
        free(k.s);
        free(v.s);
        fields_free(f);
        return false;
    }
    return true;
}

/* A strict RFC 8259 reader for one flat object of string/number/null values. */
static bool json_string(const char **pp, str_t *out)
{
    const char *p = *pp;

    if (*p++ != '"')
        return false;
    str_put(out, 'x');
    out->n = 0;
    out->s[0] = '\0';
    for (;;) {
        unsigned char c = (unsigned char)*p;
        unsigned cp;
        if (c == '"')
            break;
        if (c < 0x20) /* raw control characters are not allowed (section 7) */
            return false;
        if (c != '\\') {
            str_put(out, (char)c);
            p++;
            continue;
        }
        p++;
        switch (*p) {
        case '"':
        case '\\':
        case '/':
            str_put(out, *p);
            break;
        case 'b':
            str_put(out, '\b');
            break;
        case 'f':
            str_put(out, '\f');
            break;
        case 'n':
            str_put(out, '\n');
            break;
        case 'r':
            str_put(out, '\r');
            break;
        case 't':
            str_put(out, '\t');
            break;
        case 'u':
            if (!hex_n(p + 1, 4, &cp) || (cp >= 0xd800 && cp <= 0xdfff))
                return false;
            str_put_utf8(out, cp);
            p += 4;
            break;
        default:
            return false;
        }
        p++;
    }
    *pp = p + 1;
    return true;
}

static bool json_number(const char **pp, str_t *out)
{
    const char *p = *pp, *start = p;

    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else
        return false;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9'))
            return false;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9'))
            return false;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    for (const char *q = start; q < p; q++)
        str_put(out, *q);
    *pp = p;
    return true;
}

static bool parse_json(const char *line, fields_t *f)
{
    const char *p = line;
    size_t len = strlen(line);

    f->n = 0;
    if (len == 0 || line[len - 1] != '\n' || memchr(line, '\n', len - 1))
        return false;
    if (!clean_utf8((const unsigned char *)line, len - 1))
        return false;
    if (*p++ != '{')
        return false;
    while (*p != '}') {
        str_t k = {0}, v = {0};
        bool is_str = false;
        if (f->n > 0 && *p++ != ',')
            goto bad;
        if (!json_string(&p, &k) || *p++ != ':')
            goto bad;
        if (*p == '"') {
            if (!json_string(&p, &v))
                goto bad;
            is_str = true;
        } else if (strncmp(p, "null", 4) == 0) {
            p += 4;
        } else if (strncmp(p, "true", 4) == 0) {
            str_put(&v, 't');
            p += 4;
        } else if (!json_number(&p, &v)) {
            goto bad;
        }
        for (size_t i = 0; i < f->n; i++)
            if (strcmp(f->key[i], k.s) == 0)
                goto bad; /* duplicate keys: someone forged one */
        if (f->n == MAXF)
            goto bad;
        f->key[f->n] = k.s;
        f->val[f->n] = v.s;
        f->str[f->n] = is_str;
        f->n++;
        continue;
    bad:
        free(k.s);
        free(v.s);
        fields_free(f);
        return false;
    }
    return strcmp(p, "}\n") == 0;
}

static char line[2 * SP_LOG_LINE_MAX];

static size_t render(sp_log_format_t fmt, const char *msg, const sp_kv_t *kv, size_t nkv)
{
    size_t n = sp_log_format_line(line, sizeof(line), fmt, "space-test", SP_LOG_INFO, msg, kv, nkv);
    assert_int_equal(n, strlen(line));
    assert_true(n <= SP_LOG_LINE_MAX);
    return n;
}

static void expect_keys(const fields_t *f, const char *const *keys, size_t n)
{
    if (f->n != n)
        fail_msg("%zu fields, want %zu: %s", f->n, n, line);
    for (size_t i = 0; i < n; i++)
        if (strcmp(f->key[i], keys[i]) != 0)
            fail_msg("field %zu is '%s', want '%s': %s", i, f->key[i], keys[i], line);
}

static bool ts_ok(const char *ts)
{
    /* 2026-11-29T23:59:01.123Z */
    const char *shape = "dddd-dd-ddTdd:dd:dd.dddZ";
    struct tm tm = {0};

    if (strlen(ts) != strlen(shape))
        return false;
    for (size_t i = 0; shape[i]; i++)
        if (shape[i] == 'd' ? !(ts[i] >= '0' && ts[i] <= '9') : ts[i] != shape[i])
            return false;
    if (!strptime(ts, "%Y-%m-%dT%H:%M:%S", &tm))
        return false;
    time_t t = timegm(&tm);
    return labs((long)(t - time(NULL))) < 10;
}

static void test_kv_basic(void **state)
{
    fields_t f;
    sp_kv_t kv[] = {SP_KU("n", 42), SP_KS("corr", "abc-123"), SP_KI("delta", -7),
                    SP_KF("ratio", 0.25)};

    render(SP_LOG_KV, "batch stored", kv, 4);
    assert_true(parse_kv(line, &f));
    static const char *const keys[] = {"ts", "level", "daemon", "msg",
                                       "n",  "corr",  "delta",  "ratio"};
    expect_keys(&f, keys, 8);
    assert_true(ts_ok(field(&f, "ts")));
    assert_string_equal(field(&f, "level"), "info");
    assert_string_equal(field(&f, "daemon"), "space-test");
    assert_string_equal(field(&f, "msg"), "batch stored");
    assert_string_equal(field(&f, "n"), "42");
    assert_string_equal(field(&f, "corr"), "abc-123");
    assert_string_equal(field(&f, "delta"), "-7");
    assert_string_equal(field(&f, "ratio"), "0.25");
    /* The documented look. */
    assert_non_null(strstr(line, " level=info daemon=space-test msg=\"batch stored\" n=42 "
                                 "corr=abc-123 delta=-7 ratio=0.25\n"));
    assert_memory_equal(line, "ts=", 3);
    fields_free(&f);
}

static const char *const hostile[] = {
    "x\nts=2020-01-01T00:00:00.000Z level=error msg=forged",
    "key=forged",
    " level=error",
    "he said \"hi\" corr=\"x\"",
    "back\\slash\\",
    "\\\" quote",
    "cr\rlf\r\n",
    "tab\there",
    "\x1b[31mred\x1b[0m",
    "del\x7f",
    "\x01\x02\x03\x1f",
    "",
    " ",
    "=",
    "\"",
    "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",        /* valid UTF-8 */
    "bad \xff\xfe utf8 \xc0\xaf \xed\xa0\x80 \xe2\x82", /* invalid: stray, overlong, surrogate, cut
                                                         */
    "line\xe2\x80\xa8sep\xe2\x80\xa9par",               /* U+2028, U+2029 */
    "\u202Eevil",                                       /* U+202E right-to-left override */
    "\xc2\x85next-line",                                /* U+0085 */
    "}{\"level\":\"error\"}",
    "\",\"level\":\"error",
};

static void test_kv_hostile_values(void **state)
{
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        fields_t f;
        sp_kv_t kv[] = {SP_KS("v", hostile[i]), SP_KI("after", 1)};

        render(SP_LOG_KV, hostile[i], kv, 2);
        if (!parse_kv(line, &f))
            fail_msg("value %zu: line does not parse: %s", i, line);
        static const char *const keys[] = {"ts", "level", "daemon", "msg", "v", "after"};
        expect_keys(&f, keys, 6);
        assert_string_equal(field(&f, "level"), "info");
        assert_string_equal(field(&f, "after"), "1");
        /* kv escapes are lossless: even invalid bytes come back as \xNN. */
        assert_string_equal(field(&f, "v"), hostile[i]);
        assert_string_equal(field(&f, "msg"), hostile[i]);
        fields_free(&f);
    }
}

static void test_kv_quoting(void **state)
{
    sp_kv_t kv[] = {SP_KS("plain", "abc-1.2:3/x"),  SP_KS("empty", ""),  SP_KS("null", NULL),
                    SP_KS("forge", "a key=forged"), SP_KS("nl", "a\nb"), SP_KS("esc", "\x1b")};

    render(SP_LOG_KV, "m", kv, 6);
    assert_non_null(strstr(line, " plain=abc-1.2:3/x "));
    assert_non_null(strstr(line, " empty=\"\" "));
    assert_non_null(strstr(line, " null=\"\" "));
    assert_non_null(strstr(line, " forge=\"a key=forged\" "));
    assert_non_null(strstr(line, " nl=\"a\\nb\" "));
    assert_non_null(strstr(line, " esc=\"\\x1b\"\n"));
}

/* Keys come from code, but a bad one still cannot split a field. */
static void test_kv_key_cleaned(void **state)
{
    fields_t f;
    sp_kv_t kv[] = {SP_KS("a b=c\n\"", "v"), SP_KS("", "w"), SP_KS(NULL, "x")};

    render(SP_LOG_KV, "m", kv, 3);
    assert_true(parse_kv(line, &f));
    static const char *const keys[] = {"ts", "level", "daemon", "msg", "a_b_c__", "_", "_"};
    expect_keys(&f, keys, 7);
    fields_free(&f);
}

static void test_json_basic(void **state)
{
    fields_t f;
    sp_kv_t kv[] = {SP_KU("n", 42),          SP_KS("corr", "abc"),     SP_KS("none", NULL),
                    SP_KI("min", INT64_MIN), SP_KU("max", UINT64_MAX), SP_KF("f", 0.1),
                    SP_KF("nan", NAN),       SP_KF("inf", INFINITY),   SP_KF("big", 1e300)};

    render(SP_LOG_JSON, "batch stored", kv, 9);
    if (!parse_json(line, &f))
        fail_msg("not JSON: %s", line);
    static const char *const keys[] = {"ts",  "level", "daemon", "msg", "n",   "corr", "none",
                                       "min", "max",   "f",      "nan", "inf", "big"};
    expect_keys(&f, keys, 13);
    assert_true(ts_ok(field(&f, "ts")));
    assert_string_equal(field(&f, "level"), "info");
    assert_string_equal(field(&f, "daemon"), "space-test");
    assert_string_equal(field(&f, "msg"), "batch stored");
    assert_string_equal(field(&f, "n"), "42");
    assert_false(f.str[4]); /* a number, not a string */
    assert_string_equal(field(&f, "corr"), "abc");
    assert_string_equal(field(&f, "none"), "(null)");
    assert_string_equal(field(&f, "min"), "-9223372036854775808");
    assert_string_equal(field(&f, "max"), "18446744073709551615");
    assert_true(strtod(field(&f, "f"), NULL) == 0.1);
    assert_string_equal(field(&f, "nan"), "(null)");
    assert_string_equal(field(&f, "inf"), "(null)");
    assert_true(strtod(field(&f, "big"), NULL) == 1e300);
    assert_memory_equal(line, "{\"ts\":\"", 7);
    fields_free(&f);
}

/* Valid UTF-8 comes back exactly (escapes included); invalid bytes become U+FFFD. A hostile key
 * stays one key. */
static void test_json_hostile_values(void **state)
{
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        fields_t f;
        sp_kv_t kv[] = {SP_KS("v", hostile[i]), SP_KS(hostile[i], "k"), SP_KI("after", 1)};

        render(SP_LOG_JSON, hostile[i], kv, 3);
        if (!parse_json(line, &f))
            fail_msg("value %zu: not JSON: %s", i, line);
        if (f.n != 7)
            fail_msg("value %zu: %zu fields: %s", i, f.n, line);
        static const char *const keys[] = {"ts", "level", "daemon", "msg", "v"};
        for (size_t k = 0; k < 5; k++)
            assert_string_equal(f.key[k], keys[k]);
        assert_string_equal(f.key[6], "after");
        assert_string_equal(field(&f, "level"), "info");
        assert_string_equal(f.val[5], "k");
        if (valid_utf8(hostile[i])) {
            assert_string_equal(field(&f, "v"), hostile[i]);
            assert_string_equal(field(&f, "msg"), hostile[i]);
            assert_string_equal(f.key[5], hostile[i]);
        } else {
            assert_non_null(strstr(field(&f, "v"), "\xef\xbf\xbd"));
        }
        fields_free(&f);
    }
}

/* Invalid UTF-8 becomes U+FFFD in JSON and \xNN in kv; escaped code points stay visible. */
static void test_escapes_of_invalid_and_invisible(void **state)
{
    sp_kv_t kv[] = {SP_KS("v", "a\xff"
                               "b\xe2\x80\xae"
                               "c\xc3\xa9")};

    render(SP_LOG_JSON, "m", kv, 1);
    assert_non_null(strstr(line, "\"v\":\"a\\ufffdb\\u202ec\xc3\xa9\"}"));
    render(SP_LOG_KV, "m", kv, 1);
    assert_non_null(strstr(line, " v=\"a\\xffb\\u202ec\xc3\xa9\"\n"));
}

static char *repeat(const char *unit, size_t times)
{
    size_t u = strlen(unit);
    char *s = malloc(u * times + 1);

    assert_non_null(s);
    for (size_t i = 0; i < times; i++)
        memcpy(s + i * u, unit, u);
    s[u * times] = '\0';
    return s;
}

static const char *const long_units[] = {"a",  "\n",   "\xc3\xa9", "\xf0\x9f\x98\x80",
                                         "\"", "\x01", "\xff",     "\xe2\x80\xa8"};

static void check_truncated(sp_log_format_t fmt, const char *unit, const char *s, bool as_msg)
{
    fields_t f = {0};
    sp_kv_t kv[] = {SP_KS("v", s), SP_KI("after", 1)};
    size_t n = render(fmt, as_msg ? s : "m", kv, 2);

    assert_true(n <= SP_LOG_LINE_MAX);
    assert_true(n > SP_LOG_LINE_MAX - 64); /* cut near the limit, not early */
    bool ok = fmt == SP_LOG_JSON ? parse_json(line, &f) : parse_kv(line, &f);
    if (!ok || f.n == 0)
        fail_msg("unit '%s': truncated line does not parse: ...%s", unit, line + n - 80);
    assert_string_equal(f.key[f.n - 1], "truncated");
    assert_null(field(&f, "after"));
    /* What is kept of the value is a whole-character prefix of it. */
    const char *kept = field(&f, as_msg ? "msg" : "v");
    assert_non_null(kept);
    if (fmt == SP_LOG_KV || valid_utf8(unit)) {
        assert_true(strlen(kept) > 1000);
        assert_true(strncmp(kept, s, strlen(kept)) == 0);
        assert_int_equal(strlen(kept) % strlen(unit), 0);
    }
    fields_free(&f);
}

static void test_truncation(void **state)
{
    for (size_t u = 0; u < sizeof(long_units) / sizeof(long_units[0]); u++) {
        char *s = repeat(long_units[u], (size_t)3 * SP_LOG_LINE_MAX);
        check_truncated(SP_LOG_KV, long_units[u], s, false);
        check_truncated(SP_LOG_KV, long_units[u], s, true);
        check_truncated(SP_LOG_JSON, long_units[u], s, false);
        check_truncated(SP_LOG_JSON, long_units[u], s, true);
        free(s);
    }
    /* Every cut position near the limit, inside 2- and 6-byte escapes and multi-byte
     * characters: always a whole, parseable line. */
    static const char *const tails[] = {"\"", "\x1b", "\xc3\xa9", "\xe2\x80\xa8"};
    for (size_t t = 0; t < sizeof(tails) / sizeof(tails[0]); t++) {
        char *esc = repeat(tails[t], 40);
        for (size_t len = SP_LOG_LINE_MAX - 300; len < SP_LOG_LINE_MAX; len++) {
            char *s = repeat("a", len + strlen(esc));
            fields_t f;
            sp_kv_t kv[] = {SP_KS("v", s)};

            /* Overwrites 'a's inside s: the string keeps its NUL. */
            for (size_t k = 0; esc[k]; k++)
                s[len - 120 + k] = esc[k];
            render(SP_LOG_JSON, "m", kv, 1);
            if (!parse_json(line, &f))
                fail_msg("len %zu: not JSON: ...%s", len, line + strlen(line) - 80);
            fields_free(&f);
            render(SP_LOG_KV, "m", kv, 1);
            if (!parse_kv(line, &f))
                fail_msg("len %zu: not kv: ...%s", len, line + strlen(line) - 80);
            fields_free(&f);
            free(s);
        }
        free(esc);
    }
}

/* Many numeric fields: numbers are never cut in half, they are dropped whole. */
static void test_truncation_many_fields(void **state)
{
    enum { N = 2000 };
    static sp_kv_t kv[N];
    static char names[N][16];
    fields_t f;

    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "c%d", i);
        kv[i] = SP_KI(names[i], INT64_C(-1234567890123));
    }
    for (int fmt = SP_LOG_KV; fmt <= SP_LOG_JSON; fmt++) {
        render((sp_log_format_t)fmt, "m", kv, N);
        assert_true(fmt == SP_LOG_JSON ? parse_json(line, &f) : parse_kv(line, &f));
        assert_true(f.n > 100);
        assert_string_equal(f.key[f.n - 1], "truncated");
        for (size_t i = 4; i < f.n - 1; i++)
            assert_string_equal(f.val[i], "-1234567890123");
        fields_free(&f);
    }
}

/* snprintf's contract: the needed length comes back whatever the buffer. */
static void test_small_buffer(void **state)
{
    char small[16];
    sp_kv_t kv[] = {SP_KS("k", "value")};
    size_t full = sp_log_format_line(line, sizeof(line), SP_LOG_KV, "d", SP_LOG_WARN, "m", kv, 1);

    memset(small, 'X', sizeof(small));
    size_t n = sp_log_format_line(small, sizeof(small), SP_LOG_KV, "d", SP_LOG_WARN, "m", kv, 1);
    assert_int_equal(n, full);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    assert_memory_equal(small, "ts=", 3);
    assert_int_equal(sp_log_format_line(NULL, 0, SP_LOG_KV, "d", SP_LOG_WARN, "m", kv, 1), full);
    assert_non_null(strstr(line, " level=warn daemon=d msg=m k=value\n"));
}

static void test_parse_level_format(void **state)
{
    sp_log_level_t l = SP_LOG_ERROR;
    sp_log_format_t f = SP_LOG_JSON;

    assert_int_equal(sp_log_level_parse("debug", &l), 0);
    assert_int_equal(l, SP_LOG_DEBUG);
    assert_int_equal(sp_log_level_parse("warn", &l), 0);
    assert_int_equal(l, SP_LOG_WARN);
    assert_int_equal(sp_log_level_parse("error", &l), 0);
    assert_int_equal(l, SP_LOG_ERROR);
    assert_int_equal(sp_log_level_parse("info", &l), 0);
    assert_int_equal(l, SP_LOG_INFO);
    assert_int_equal(sp_log_level_parse("verbose", &l), -EINVAL);
    assert_int_equal(sp_log_level_parse("", &l), -EINVAL);
    assert_int_equal(sp_log_level_parse(NULL, &l), -EINVAL);
    assert_int_equal(l, SP_LOG_INFO);

    assert_int_equal(sp_log_format_parse("kv", &f), 0);
    assert_int_equal(f, SP_LOG_KV);
    assert_int_equal(sp_log_format_parse("json", &f), 0);
    assert_int_equal(f, SP_LOG_JSON);
    assert_int_equal(sp_log_format_parse("xml", &f), -EINVAL);
    assert_int_equal(f, SP_LOG_JSON);
}

/* Reads what sp_log wrote to stderr, through a pipe. */
static size_t capture_stderr(void (*fn)(void), char *buf, size_t len)
{
    int fds[2], saved = dup(STDERR_FILENO);
    ssize_t n;

    assert_true(saved >= 0);
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(dup2(fds[1], STDERR_FILENO), STDERR_FILENO);
    close(fds[1]);
    fn();
    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    n = read(fds[0], buf, len - 1);
    close(fds[0]);
    assert_true(n >= 0);
    buf[n] = '\0';
    return (size_t)n;
}

static void log_some(void)
{
    errno = EAGAIN;
    sp_log(SP_LOG_DEBUG, "hidden");
    sp_log(SP_LOG_INFO, "hidden too", SP_KI("n", 1));
    sp_log(SP_LOG_WARN, "shown", SP_KS("sandbox", "sbx_1\nlevel=error"), SP_KU("n", 2));
    sp_log(SP_LOG_ERROR, "last");
    assert_int_equal(errno, EAGAIN); /* logging leaves errno alone */
}

static void test_sp_log_writes_lines(void **state)
{
    char buf[4096];
    fields_t f;

    sp_log_init("space-unit", SP_LOG_WARN, SP_LOG_KV);
    assert_false(sp_log_enabled(SP_LOG_INFO));
    assert_true(sp_log_enabled(SP_LOG_WARN));
    assert_true(sp_log_enabled(SP_LOG_ERROR));
    capture_stderr(log_some, buf, sizeof(buf));

    char *second = strchr(buf, '\n');
    assert_non_null(second);
    second++;
    assert_non_null(strchr(second, '\n'));
    assert_string_equal(strchr(second, '\n'), "\n"); /* exactly two lines */
    char first[4096];
    memcpy(first, buf, (size_t)(second - buf));
    first[second - buf] = '\0';
    assert_true(parse_kv(first, &f));
    assert_string_equal(field(&f, "daemon"), "space-unit");
    assert_string_equal(field(&f, "level"), "warn");
    assert_string_equal(field(&f, "msg"), "shown");
    assert_string_equal(field(&f, "sandbox"), "sbx_1\nlevel=error");
    fields_free(&f);
    assert_true(parse_kv(second, &f));
    assert_string_equal(field(&f, "level"), "error");
    fields_free(&f);

    sp_log_init("space-unit", SP_LOG_DEBUG, SP_LOG_JSON);
    capture_stderr(log_some, buf, sizeof(buf));
    second = strchr(buf, '\n') + 1;
    memcpy(first, buf, (size_t)(second - buf));
    first[second - buf] = '\0';
    assert_true(parse_json(first, &f));
    assert_string_equal(field(&f, "level"), "debug");
    assert_string_equal(field(&f, "msg"), "hidden");
    fields_free(&f);
    sp_log_init("space-unit", SP_LOG_INFO, SP_LOG_KV);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_basic),
        cmocka_unit_test(test_kv_hostile_values),
        cmocka_unit_test(test_kv_quoting),
        cmocka_unit_test(test_kv_key_cleaned),
        cmocka_unit_test(test_json_basic),
        cmocka_unit_test(test_json_hostile_values),
        cmocka_unit_test(test_escapes_of_invalid_and_invisible),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_truncation_many_fields),
        cmocka_unit_test(test_small_buffer),
        cmocka_unit_test(test_parse_level_format),
        cmocka_unit_test(test_sp_log_writes_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
