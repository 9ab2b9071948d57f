/* clang-format off */
/* cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSPACE_FUZZ=ON && cmake --build build-fuzz --target fuzz && build-fuzz/bin/json_fuzz -max_total_time=30 -max_len=4096 tests/fuzz/corpus/json_fuzz */
/* clang-format on */
/* libFuzzer target for sp_json_parse (json.h). Built with -DSPACE_FUZZ=ON
 * (tests/fuzz/CMakeLists.txt); scripts/test.sh runs it for 30 s. The first input byte picks the
 * limits (defaults, or small ones so every limit is hit often); the rest is the JSON text.
 *
 * Beyond "no crash, no leak, no undefined behaviour" it checks the contract:
 * - a failure has a known code and an "offset N: reason" message with N <= input length;
 * - a parsed document has valid types, NUL-terminated strings of the stated length that are
 *   valid UTF-8 without NUL, unique object keys that sp_json_get finds, and sp_json_int agrees
 *   with sp_json_double;
 * - writing the document back as JSON and parsing that gives an equal document.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "buf.h"
#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The rewrite uses the project's own writer: sp_buf_json_str (strings hold no NUL, so the
 * length is implied). */
static void out_put(sp_buf_t *o, const void *p, size_t n)
{
    sp_buf_append(o, p, n);
}

static void out_str(sp_buf_t *o, const char *s, size_t n)
{
    (void)n;
    sp_buf_json_str(o, s);
}

/* RFC 3629 validity, written independently of the parser's check. */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k;
        if (s[i] < 0x80) {
            cp = s[i];
            k = 1;
        } else if ((s[i] & 0xe0) == 0xc0) {
            cp = s[i] & 0x1fu;
            k = 2;
        } else if ((s[i] & 0xf0) == 0xe0) {
            cp = s[i] & 0x0fu;
            k = 3;
        } else if ((s[i] & 0xf8) == 0xf0) {
            cp = s[i] & 0x07u;
            k = 4;
        } else {
            return false;
        }
        if (i + k > n)
            return false;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3fu);
        }
        static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k;
    }
    return true;
}

static void check_and_write(const sp_json_t *v, sp_buf_t *o)
{
    size_t n = 0;
    const char *s;
    double d;
    int64_t i;
    bool b;

    switch (sp_json_type(v)) {
    case SP_JSON_NULL:
        out_put(o, "null", 4);
        break;
    case SP_JSON_BOOL:
        if (sp_json_bool(v, &b) != 0)
            abort();
        out_put(o, b ? "true" : "false", b ? 4 : 5);
        break;
    case SP_JSON_NUMBER: {
        char num[40];
        if (sp_json_double(v, &d) != 0 || d != d || d - d != 0)
            abort(); /* never NaN or infinite */
        if (sp_json_int(v, INT64_MIN, INT64_MAX, &i) == 0 && i > -(1LL << 53) && i < (1LL << 53) &&
            (double)i != d)
            abort();
        int k = snprintf(num, sizeof(num), "%.17g", d);
        out_put(o, num, (size_t)k);
        break;
    }
    case SP_JSON_STRING:
        s = sp_json_str(v, &n);
        if (!s || strlen(s) != n || !valid_utf8((const unsigned char *)s, n))
            abort();
        out_str(o, s, n);
        break;
    case SP_JSON_ARRAY:
        out_put(o, "[", 1);
        for (size_t k = 0; k < sp_json_len(v); k++) {
            if (k)
                out_put(o, ",", 1);
            check_and_write(sp_json_at(v, k), o);
        }
        if (sp_json_at(v, sp_json_len(v)) || sp_json_key_at(v, 0) || sp_json_get(v, ""))
            abort();
        out_put(o, "]", 1);
        break;
    case SP_JSON_OBJECT:
        out_put(o, "{", 1);
        for (size_t k = 0; k < sp_json_len(v); k++) {
            const char *key = sp_json_key_at(v, k);
            if (!key || !valid_utf8((const unsigned char *)key, strlen(key)))
                abort();
            /* Keys are unique, so lookup by key finds this very member. */
            if (sp_json_get(v, key) != sp_json_at(v, k))
                abort();
            if (k)
                out_put(o, ",", 1);
            out_str(o, key, strlen(key));
            out_put(o, ":", 1);
            check_and_write(sp_json_at(v, k), o);
        }
        if (sp_json_at(v, sp_json_len(v)) || sp_json_key_at(v, sp_json_len(v)))
            abort();
        out_put(o, "}", 1);
        break;
    default:
        abort();
    }
}

static bool same(const sp_json_t *a, const sp_json_t *b)
{
    size_t na = 0;
    size_t nb = 0;
    double da;
    double db;

    if (sp_json_type(a) != sp_json_type(b) || sp_json_len(a) != sp_json_len(b))
        return false;
    switch (sp_json_type(a)) {
    case SP_JSON_NUMBER:
        sp_json_double(a, &da);
        sp_json_double(b, &db);
        return da == db;
    case SP_JSON_STRING: {
        const char *sa = sp_json_str(a, &na);
        const char *sb = sp_json_str(b, &nb);
        return na == nb && memcmp(sa, sb, na) == 0;
    }
    case SP_JSON_BOOL: {
        bool ba = false;
        bool bb = false;
        sp_json_bool(a, &ba);
        sp_json_bool(b, &bb);
        return ba == bb;
    }
    case SP_JSON_OBJECT:
    case SP_JSON_ARRAY:
        for (size_t k = 0; k < sp_json_len(a); k++) {
            const char *ka = sp_json_key_at(a, k);
            const char *kb = sp_json_key_at(b, k);
            if ((ka || kb) && (!ka || !kb || strcmp(ka, kb) != 0))
                return false;
            if (!same(sp_json_at(a, k), sp_json_at(b, k)))
                return false;
        }
        return true;
    default:
        return true;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sp_json_limits_t lim = {0};
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];

    if (size < 1)
        return 0;
    if (data[0] & 1) {
        lim.max_depth = 1 + (data[0] >> 1 & 7);
        lim.max_nodes = 1 + (size_t)(data[0] >> 4) * 4;
        lim.max_string = 1 + (size_t)(data[0] >> 3 & 15);
    }
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    int r = sp_json_parse(text, len, &lim, &doc, err);
    if (r < 0) {
        char *end = NULL;
        if ((r != -EINVAL && r != SP_ETOOBIG) || doc)
            abort();
        /* "offset N: reason" */
        if (strncmp(err, "offset ", 7) != 0 || err[7] < '0' || err[7] > '9')
            abort();
        unsigned long long off = strtoull(err + 7, &end, 10);
        if (off > len || strncmp(end, ": ", 2) != 0 || end[2] == '\0' ||
            strlen(err) >= SP_JSON_ERR_MAX)
            abort();
        return 0;
    }
    if (r != 0 || !doc || err[0] != '\0')
        abort();

    sp_buf_t o;
    sp_buf_init(&o);
    check_and_write(sp_json_root(doc), &o);

    /* The rewrite may be longer (escapes), never deeper, with no more values or longer
     * strings. */
    sp_json_limits_t lim2 = lim;
    lim2.max_bytes = o.len + 1;
    sp_json_doc_t *doc2 = NULL;
    if (sp_json_parse(o.data, o.len, &lim2, &doc2, err) != 0) {
        fprintf(stderr, "rewrite rejected: %s\n%.*s\n", err, (int)o.len, o.data);
        abort();
    }
    if (!same(sp_json_root(doc), sp_json_root(doc2))) {
        fprintf(stderr, "rewrite differs\n%.*s\n", (int)o.len, o.data);
        abort();
    }
    sp_json_doc_free(doc2);
    sp_json_doc_free(doc);
    sp_buf_dispose(&o);
    return 0;
}
