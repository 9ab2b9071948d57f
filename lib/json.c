/* Strict JSON parser for untrusted input (json.h, RFC 8259).
 *
 * The parser is iterative: open arrays and objects live on an explicit heap stack bounded by
 * max_depth, so no input, however deep, can exhaust the C stack. Values that are complete but
 * whose container is still open wait on a second heap stack (the slots); when the container
 * closes its slots are copied into the document arena in one piece and popped. Both stacks and
 * the string decoding buffer are freed when sp_json_parse returns; the document keeps only the
 * arena.
 *
 * Decisions the RFC leaves to the implementation (RFC 8259 section 9 allows limits):
 * - A byte order mark is rejected (section 8.1 forbids sending one).
 * - A number's source text is at most NUMBER_MAX bytes, and a number whose magnitude overflows
 *   a double (1e400) is rejected with SP_ETOOBIG. Underflow (1e-400) is accepted and rounds
 *   towards zero, as any decimal-to-binary conversion rounds.
 * - sp_json_int accepts a number whose exact decimal value is an integer, however it is
 *   written: "3", "-0", "3.0", "1e3" and "0.5e1" are integers, "3.5" and "1e-1" are not. The
 *   check works on the source text, never on the double, so 2^53 + 1 is exact.
 */
#include "json.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "xmalloc.h"
#include "text.h"

#define DEFAULT_MAX_BYTES  ((size_t)1 << 20)
#define DEFAULT_MAX_DEPTH  32
#define DEFAULT_MAX_NODES  100000
#define DEFAULT_MAX_STRING ((size_t)64 << 10)

/* Longest number source text. A double needs 17 significant digits; 256 bytes leaves room for
 * any sensible spelling and keeps strtod's work per number bounded. */
#define NUMBER_MAX 256

/* Objects with at most this many members are checked for duplicate keys pair by pair; larger
 * ones are sorted, so a hostile object with 50000 keys costs n log n, not n^2. */
#define DUP_PAIRWISE_MAX 16

#define ARENA_FIRST_CHUNK ((size_t)4 << 10)
#define ARENA_MAX_CHUNK   ((size_t)256 << 10)

struct sp_json_member {
    const char *key;
    size_t key_len;
    const sp_json_t *val;
};

struct sp_json {
    sp_json_type_t type;
    size_t len; /* string bytes, number text bytes, element or member count */
    union {
        bool b;
        const char *str; /* NUL-terminated */
        struct {
            const char *text; /* source text, NUL-terminated */
            double d;
        } num;
        const sp_json_t **items;
        const struct sp_json_member *members;
    } u;
};

struct arena_chunk {
    struct arena_chunk *next;
    size_t used;
    size_t cap;
    alignas(max_align_t) unsigned char data[];
};

struct sp_json_doc {
    struct arena_chunk *chunks; /* the first one is the one being filled */
    size_t next_cap;
    const sp_json_t *root;
};

/* An open array or object. */
struct frame {
    sp_json_t *node;
    size_t first_slot;
    bool is_object;
};

/* A complete value waiting for its container to close; key is NULL in arrays. In objects the
 * key is pushed first with val NULL, and val is set when the member's value is complete. */
struct slot {
    const char *key;
    size_t key_len;
    size_t key_off; /* offset of the key's opening quote, for the duplicate-key error */
    const sp_json_t *val;
};

struct parser {
    const unsigned char *s;
    size_t len;
    size_t pos;
    size_t max_depth;
    size_t max_nodes;
    size_t max_string;
    size_t nodes;
    sp_json_doc_t *doc;
    struct frame *frames;
    size_t depth;
    size_t frames_cap;
    struct slot *slots;
    size_t nslots;
    size_t slots_cap;
    char *sbuf; /* string being decoded */
    size_t sbuf_cap;
    const struct slot **order; /* duplicate-key sort */
    size_t order_cap;
    char *err;
};

/* Values without payload are shared by every document: they are never written. */
static const sp_json_t json_null = {.type = SP_JSON_NULL};
static const sp_json_t json_true = {.type = SP_JSON_BOOL, .u.b = true};
static const sp_json_t json_false = {.type = SP_JSON_BOOL, .u.b = false};

/* Allocation sizes are bounded by the input length, which is far from SIZE_MAX; a size near
 * it can only come from a bug, and aborts like any failed sp_x* allocation. */
static void size_overflow(void)
{
    static const char msg[] = "space: json arena: size overflow\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)w;
    abort();
}

static void *arena_alloc(sp_json_doc_t *doc, size_t n, size_t align)
{
    struct arena_chunk *c = doc->chunks;
    if (n > SIZE_MAX / 4)
        size_overflow();
    if (c) {
        size_t off = (c->used + align - 1) & ~(align - 1);
        if (off <= c->cap && n <= c->cap - off) {
            c->used = off + n;
            return c->data + off;
        }
    }
    /* A large request gets a chunk of its own, linked behind the current one, so the space left
     * in the current chunk is not thrown away. */
    if (c && n > doc->next_cap / 2) {
        struct arena_chunk *big = sp_xmalloc(sizeof(*big) + n);
        big->used = big->cap = n;
        big->next = c->next;
        c->next = big;
        return big->data;
    }
    size_t cap = doc->next_cap;
    while (cap < n)
        cap *= 2;
    c = sp_xmalloc(sizeof(*c) + cap);
    c->cap = cap;
    c->used = n;
    c->next = doc->chunks;
    doc->chunks = c;
    if (doc->next_cap < ARENA_MAX_CHUNK)
        doc->next_cap *= 2;
    return c->data;
}

static void *arena_array(sp_json_doc_t *doc, size_t n, size_t size, size_t align)
{
    if (size && n > SIZE_MAX / 4 / size)
        size_overflow();
    return arena_alloc(doc, n * size, align);
}

static char *arena_strdup(sp_json_doc_t *doc, const void *s, size_t n)
{
    char *p = arena_alloc(doc, n + 1, 1);
    if (n)
        memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

__attribute__((format(printf, 4, 5))) static int fail(struct parser *p, int code, size_t off,
                                                      const char *fmt, ...)
{
    if (!p->err)
        return code;
    int n = snprintf(p->err, SP_JSON_ERR_MAX, "offset %zu: ", off);
    if (n > 0 && n < SP_JSON_ERR_MAX) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + n, SP_JSON_ERR_MAX - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* A byte for an error message: 'x' when printable ASCII, 0xNN otherwise (never raw input). */
static const char *describe(unsigned char c, char out[8])
{
    if (c > 0x20 && c < 0x7f && c != '\'')
        snprintf(out, 8, "'%c'", c);
    else
        snprintf(out, 8, "0x%02x", c);
    return out;
}

/* "unexpected end of input" at the end, "expected <what>, found <byte>" elsewhere. */
static int fail_expected(struct parser *p, const char *what)
{
    char b[8];
    if (p->pos >= p->len)
        return fail(p, -EINVAL, p->pos, "unexpected end of input, expected %s", what);
    return fail(p, -EINVAL, p->pos, "expected %s, found %s", what, describe(p->s[p->pos], b));
}

/* RFC 8259 section 2: the four whitespace characters, nothing else. */
static void skip_ws(struct parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int count_node(struct parser *p, size_t off)
{
    if (p->nodes >= p->max_nodes)
        return fail(p, SP_ETOOBIG, off, "more than %zu values", p->max_nodes);
    p->nodes++;
    return 0;
}

static int hex4(const unsigned char *s, uint32_t *ret)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        uint32_t d;
        if (c >= '0' && c <= '9')
            d = (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (uint32_t)(c - 'A' + 10);
        else
            return -EINVAL;
        v = v << 4 | d;
    }
    *ret = v;
    return 0;
}

/* Room for n more decoded bytes; the limit is checked here so no string grows past it. */
static int sbuf_reserve(struct parser *p, size_t used, size_t n, size_t start)
{
    if (n > p->max_string || used > p->max_string - n)
        return fail(p, SP_ETOOBIG, start, "string longer than %zu bytes", p->max_string);
    if (used + n <= p->sbuf_cap)
        return 0;
    size_t cap = p->sbuf_cap ? p->sbuf_cap : 256;
    while (cap < used + n)
        cap *= 2;
    p->sbuf = sp_xrealloc(p->sbuf, cap);
    p->sbuf_cap = cap;
    return 0;
}

/* A \u escape at p->pos (RFC 8259 section 7): a code point, or a UTF-16 surrogate pair written
 * as two escapes. Lone surrogates and U+0000 are errors; the result is written as UTF-8. */
static int parse_u_escape(struct parser *p, unsigned char out[4], size_t *ret_n)
{
    size_t at = p->pos;
    uint32_t cp;
    uint32_t lo;

    if (p->len - at < 6 || hex4(p->s + at + 2, &cp) < 0)
        return fail(p, -EINVAL, at, "\\u must be followed by four hex digits");
    if (cp >= 0xdc00 && cp <= 0xdfff)
        return fail(p, -EINVAL, at, "lone low surrogate \\u%04x", (unsigned)cp);
    if (cp >= 0xd800 && cp <= 0xdbff) {
        if (p->len - at < 12 || p->s[at + 6] != '\\' || p->s[at + 7] != 'u' ||
            hex4(p->s + at + 8, &lo) < 0 || lo < 0xdc00 || lo > 0xdfff)
            return fail(p, -EINVAL, at, "high surrogate \\u%04x not followed by a low surrogate",
                        (unsigned)cp);
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        p->pos += 12;
    } else {
        if (cp == 0)
            return fail(p, -EINVAL, at, "\\u0000 is not allowed");
        p->pos += 6;
    }
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        *ret_n = 1;
    } else if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        *ret_n = 2;
    } else if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        *ret_n = 3;
    } else {
        out[0] = (unsigned char)(0xf0 | cp >> 18);
        out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        out[3] = (unsigned char)(0x80 | (cp & 0x3f));
        *ret_n = 4;
    }
    return 0;
}

/* A string at p->pos (the opening quote), decoded into the arena. */
static int parse_string(struct parser *p, const char **ret_s, size_t *ret_len)
{
    size_t start = p->pos;
    size_t n = 0;
    int r;

    p->pos++;
    for (;;) {
        if (p->pos >= p->len)
            return fail(p, -EINVAL, start, "unterminated string");
        unsigned char c = p->s[p->pos];
        unsigned char enc[4];
        size_t k = 1;

        if (c == '"')
            break;
        if (c < 0x20)
            /* RFC 8259 section 7: control characters must be escaped. */
            return fail(p, -EINVAL, p->pos, "unescaped control character 0x%02x in string", c);
        if (c == '\\') {
            if (p->pos + 1 >= p->len)
                return fail(p, -EINVAL, start, "unterminated string");
            unsigned char e = p->s[p->pos + 1];
            switch (e) {
            case '"':
            case '\\':
            case '/':
                enc[0] = e;
                break;
            case 'b':
                enc[0] = '\b';
                break;
            case 'f':
                enc[0] = '\f';
                break;
            case 'n':
                enc[0] = '\n';
                break;
            case 'r':
                enc[0] = '\r';
                break;
            case 't':
                enc[0] = '\t';
                break;
            case 'u':
                break;
            default: {
                char b[8];
                return fail(p, -EINVAL, p->pos, "invalid escape \\%s", describe(e, b));
            }
            }
            if (e == 'u') {
                if ((r = parse_u_escape(p, enc, &k)) < 0)
                    return r;
            } else {
                p->pos += 2;
            }
            if ((r = sbuf_reserve(p, n, k, start)) < 0)
                return r;
            memcpy(p->sbuf + n, enc, k);
            n += k;
            continue;
        }
        if (c >= 0x80 &&
            (k = sp_utf8_seq((const uint8_t *)p->s + p->pos, p->len - p->pos, NULL)) == 0)
            return fail(p, -EINVAL, p->pos, "invalid UTF-8 byte 0x%02x in string", c);
        if ((r = sbuf_reserve(p, n, k, start)) < 0)
            return r;
        memcpy(p->sbuf + n, p->s + p->pos, k);
        n += k;
        p->pos += k;
    }
    p->pos++;
    *ret_s = arena_strdup(p->doc, p->sbuf, n);
    *ret_len = n;
    return 0;
}

/* strtod follows LC_NUMERIC, which a process may have set to a locale whose decimal point is
 * ','; JSON's is always '.', so numbers are converted in the C locale. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void)
{
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!c_locale) {
        static const char msg[] = "space: json: cannot create the C locale\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)w;
        abort();
    }
}

static bool is_digit(const struct parser *p)
{
    return p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9';
}

/* RFC 8259 section 6: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static int parse_number(struct parser *p, const sp_json_t **ret)
{
    size_t start = p->pos;

    if (p->s[p->pos] == '-')
        p->pos++;
    if (!is_digit(p))
        return fail_expected(p, "a digit");
    if (p->s[p->pos] == '0') {
        p->pos++;
        if (is_digit(p))
            return fail(p, -EINVAL, p->pos - 1, "leading zeros are not allowed");
    } else {
        while (is_digit(p))
            p->pos++;
    }
    if (p->pos < p->len && p->s[p->pos] == '.') {
        p->pos++;
        if (!is_digit(p))
            return fail_expected(p, "a digit after '.'");
        while (is_digit(p))
            p->pos++;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
            p->pos++;
        if (!is_digit(p))
            return fail_expected(p, "a digit in the exponent");
        while (is_digit(p))
            p->pos++;
    }

    size_t n = p->pos - start;
    if (n > NUMBER_MAX)
        return fail(p, SP_ETOOBIG, start, "number longer than %d bytes", NUMBER_MAX);
    char *text = arena_strdup(p->doc, p->s + start, n);
    char *end = NULL;
    pthread_once(&c_locale_once, c_locale_init);
    double d = strtod_l(text, &end, c_locale);
    if (end != text + n)
        return fail(p, -EINVAL, start, "malformed number");
    if (isinf(d))
        return fail(p, SP_ETOOBIG, start, "number out of the range of a double");

    sp_json_t *v = arena_alloc(p->doc, sizeof(*v), alignof(sp_json_t));
    v->type = SP_JSON_NUMBER;
    v->len = n;
    v->u.num.text = text;
    v->u.num.d = d;
    *ret = v;
    return 0;
}

static int parse_literal(struct parser *p, const sp_json_t **ret)
{
    static const struct {
        const char *word;
        size_t len;
        const sp_json_t *val;
    } lits[] = {
        {"null", 4, &json_null},
        {"true", 4, &json_true},
        {"false", 5, &json_false},
    };
    for (size_t i = 0; i < sizeof(lits) / sizeof(lits[0]); i++) {
        if (p->s[p->pos] != (unsigned char)lits[i].word[0])
            continue;
        if (p->len - p->pos < lits[i].len || memcmp(p->s + p->pos, lits[i].word, lits[i].len) != 0)
            return fail(p, -EINVAL, p->pos, "invalid literal, expected '%s'", lits[i].word);
        p->pos += lits[i].len;
        *ret = lits[i].val;
        return 0;
    }
    return fail_expected(p, "a value");
}

static struct slot *push_slot(struct parser *p)
{
    if (p->nslots == p->slots_cap) {
        p->slots_cap = p->slots_cap ? p->slots_cap * 2 : 64;
        p->slots = sp_xreallocarray(p->slots, p->slots_cap, sizeof(*p->slots));
    }
    struct slot *s = &p->slots[p->nslots++];
    *s = (struct slot){0};
    return s;
}

/* An object key and the ':' after it; p->pos is at the expected opening quote. */
static int parse_member_key(struct parser *p)
{
    const char *key = NULL;
    size_t key_len = 0;
    size_t off = p->pos;
    int r;

    if (p->pos >= p->len || p->s[p->pos] != '"')
        return fail_expected(p, "'\"' to start an object key");
    if ((r = parse_string(p, &key, &key_len)) < 0)
        return r;
    skip_ws(p);
    if (p->pos >= p->len || p->s[p->pos] != ':')
        return fail_expected(p, "':' after object key");
    p->pos++;
    struct slot *s = push_slot(p);
    s->key = key;
    s->key_len = key_len;
    s->key_off = off;
    return 0;
}

static int slot_key_cmp(const void *a, const void *b)
{
    const struct slot *x = *(const struct slot *const *)a;
    const struct slot *y = *(const struct slot *const *)b;
    if (x->key_len != y->key_len)
        return x->key_len < y->key_len ? -1 : 1;
    int c = memcmp(x->key, y->key, x->key_len);
    if (c)
        return c;
    /* Equal keys in document order, so the second of a run is the first repetition. */
    return x->key_off < y->key_off ? -1 : x->key_off > y->key_off;
}

static bool same_key(const struct slot *a, const struct slot *b)
{
    return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0;
}

/* RFC 8259 section 4 only says names SHOULD be unique; duplicates let two readers of one body
 * see different values, so they are rejected. The error names the first repeated key in
 * document order. */
static int check_duplicates(struct parser *p, const struct slot *sl, size_t n)
{
    size_t dup = SIZE_MAX;

    if (n <= DUP_PAIRWISE_MAX) {
        for (size_t i = 1; i < n && dup == SIZE_MAX; i++)
            for (size_t j = 0; j < i; j++)
                if (same_key(&sl[i], &sl[j])) {
                    dup = sl[i].key_off;
                    break;
                }
    } else {
        if (n > p->order_cap) {
            p->order_cap = n;
            p->order = sp_xreallocarray(p->order, n, sizeof(const struct slot *));
        }
        for (size_t i = 0; i < n; i++)
            p->order[i] = &sl[i];
        qsort(p->order, n, sizeof(const struct slot *), slot_key_cmp);
        for (size_t i = 1; i < n; i++)
            if (same_key(p->order[i], p->order[i - 1]) && p->order[i]->key_off < dup)
                dup = p->order[i]->key_off;
    }
    if (dup != SIZE_MAX)
        return fail(p, -EINVAL, dup, "duplicate object key");
    return 0;
}

/* Closes the innermost container: its slots move into the arena. */
static int close_container(struct parser *p, const sp_json_t **ret)
{
    struct frame *f = &p->frames[p->depth - 1];
    size_t n = p->nslots - f->first_slot;
    /* No slot yet (an empty container first): p->slots is still NULL, and NULL + 0 is
     * undefined behaviour (found by tests/fuzz/json_fuzz). */
    const struct slot *sl = n ? p->slots + f->first_slot : NULL;
    sp_json_t *node = f->node;
    int r;

    node->len = n;
    if (f->is_object) {
        if ((r = check_duplicates(p, sl, n)) < 0)
            return r;
        struct sp_json_member *m = NULL;
        if (n) {
            m = arena_array(p->doc, n, sizeof(*m), alignof(struct sp_json_member));
            for (size_t i = 0; i < n; i++)
                m[i] = (struct sp_json_member){sl[i].key, sl[i].key_len, sl[i].val};
        }
        node->u.members = m;
    } else {
        const sp_json_t **items = NULL;
        if (n) {
            items = arena_array(p->doc, n, sizeof(const sp_json_t *), alignof(const sp_json_t *));
            for (size_t i = 0; i < n; i++)
                items[i] = sl[i].val;
        }
        node->u.items = items;
    }
    p->nslots = f->first_slot;
    p->depth--;
    *ret = node;
    return 0;
}

static int open_container(struct parser *p, bool is_object)
{
    if (p->depth >= p->max_depth)
        return fail(p, SP_ETOOBIG, p->pos, "nesting deeper than %zu", p->max_depth);
    if (p->depth == p->frames_cap) {
        p->frames_cap = p->frames_cap ? p->frames_cap * 2 : 16;
        p->frames = sp_xreallocarray(p->frames, p->frames_cap, sizeof(*p->frames));
    }
    sp_json_t *node = arena_alloc(p->doc, sizeof(*node), alignof(sp_json_t));
    *node = (sp_json_t){.type = is_object ? SP_JSON_OBJECT : SP_JSON_ARRAY};
    p->frames[p->depth++] = (struct frame){node, p->nslots, is_object};
    p->pos++;
    return 0;
}

/* One value at p->pos. Sets *ret to the value when it is complete (a scalar or an empty
 * container); to NULL when it opened a container whose first element (for an object: the value
 * after the first key, which has been read) comes next. */
static int parse_value(struct parser *p, const sp_json_t **ret)
{
    int r;

    size_t start = p->pos;

    *ret = NULL;
    if (p->pos >= p->len)
        return fail_expected(p, "a value");

    unsigned char c = p->s[p->pos];
    switch (c) {
    case '[':
    case '{': {
        bool is_object = c == '{';
        if ((r = count_node(p, p->pos)) < 0 || (r = open_container(p, is_object)) < 0)
            return r;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == (is_object ? '}' : ']')) {
            p->pos++;
            return close_container(p, ret);
        }
        *ret = NULL;
        return is_object ? parse_member_key(p) : 0;
    }
    case '"': {
        const char *s = NULL;
        size_t n = 0;
        if ((r = count_node(p, p->pos)) < 0 || (r = parse_string(p, &s, &n)) < 0)
            return r;
        sp_json_t *v = arena_alloc(p->doc, sizeof(*v), alignof(sp_json_t));
        *v = (sp_json_t){.type = SP_JSON_STRING, .len = n, .u.str = s};
        *ret = v;
        return 0;
    }
    case '-':
    case '0':
    case '1':
    case '2':
    case '3':
    case '4':
    case '5':
    case '6':
    case '7':
    case '8':
    case '9':
        if ((r = count_node(p, p->pos)) < 0)
            return r;
        return parse_number(p, ret);
    default:
        /* Counted after the match, so "[1,]" is a syntax error under any node limit. */
        if ((r = parse_literal(p, ret)) < 0)
            return r;
        return count_node(p, start);
    }
}

/* After an element of the innermost container: ',' and the next key (objects), or the closing
 * bracket. Returns 1 when a value must follow, 0 when the container was closed. */
static int after_element(struct parser *p)
{
    bool is_object = p->frames[p->depth - 1].is_object;

    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ',') {
        p->pos++;
        skip_ws(p);
        if (is_object) {
            int r = parse_member_key(p);
            return r < 0 ? r : 1;
        }
        return 1;
    }
    if (p->pos < p->len && p->s[p->pos] == (is_object ? '}' : ']')) {
        p->pos++;
        return 0;
    }
    return fail_expected(p, is_object ? "',' or '}' after object member"
                                      : "',' or ']' after array element");
}

static int parse_document(struct parser *p, const sp_json_t **ret_root)
{
    const sp_json_t *v;
    int r;

    for (;;) {
        skip_ws(p);
        if ((r = parse_value(p, &v)) < 0)
            return r;
        if (!v)
            continue; /* a container opened: its first element is next */
        /* Hand the complete value to its container; close containers as they end. */
        for (;;) {
            if (p->depth == 0) {
                skip_ws(p);
                if (p->pos < p->len) {
                    char b[8];
                    return fail(p, -EINVAL, p->pos, "unexpected %s after the value",
                                describe(p->s[p->pos], b));
                }
                *ret_root = v;
                return 0;
            }
            if (p->frames[p->depth - 1].is_object)
                p->slots[p->nslots - 1].val = v;
            else
                push_slot(p)->val = v;
            if ((r = after_element(p)) < 0)
                return r;
            if (r == 1)
                break;
            if ((r = close_container(p, &v)) < 0)
                return r;
        }
    }
}

int sp_json_parse(const char *text, size_t len, const sp_json_limits_t *limits,
                  sp_json_doc_t **ret_doc, char err[SP_JSON_ERR_MAX])
{
    sp_json_limits_t lim = limits ? *limits : (sp_json_limits_t){0};
    struct parser p = {
        .s = (const unsigned char *)text,
        .len = len,
        .max_depth = lim.max_depth ? lim.max_depth : DEFAULT_MAX_DEPTH,
        .max_nodes = lim.max_nodes ? lim.max_nodes : DEFAULT_MAX_NODES,
        .max_string = lim.max_string ? lim.max_string : DEFAULT_MAX_STRING,
        .err = err,
    };
    size_t max_bytes = lim.max_bytes ? lim.max_bytes : DEFAULT_MAX_BYTES;
    const sp_json_t *root = NULL;
    int r;

    if (err)
        err[0] = '\0';
    if (!ret_doc || (!text && len))
        return fail(&p, -EINVAL, 0, "invalid arguments");
    if (len > max_bytes)
        return fail(&p, SP_ETOOBIG, max_bytes, "input is %zu bytes, more than %zu", len, max_bytes);

    p.doc = sp_xcalloc(1, sizeof(*p.doc));
    p.doc->next_cap = ARENA_FIRST_CHUNK;
    r = parse_document(&p, &root);
    free(p.frames);
    free(p.slots);
    free(p.sbuf);
    free(p.order);
    if (r < 0) {
        sp_json_doc_free(p.doc);
        return r;
    }
    p.doc->root = root;
    *ret_doc = p.doc;
    return 0;
}

void sp_json_doc_free(sp_json_doc_t *doc)
{
    if (!doc)
        return;
    struct arena_chunk *c = doc->chunks;
    while (c) {
        struct arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(doc);
}

const sp_json_t *sp_json_root(const sp_json_doc_t *doc)
{
    return doc ? doc->root : NULL;
}

sp_json_type_t sp_json_type(const sp_json_t *v)
{
    return v ? v->type : (sp_json_type_t)0;
}

const sp_json_t *sp_json_get(const sp_json_t *v, const char *key)
{
    if (!v || v->type != SP_JSON_OBJECT || !key)
        return NULL;
    /* Keys contain no NUL (\u0000 is rejected), so byte equality with a C string is exact. */
    size_t n = strlen(key);
    for (size_t i = 0; i < v->len; i++) {
        const struct sp_json_member *m = &v->u.members[i];
        if (m->key_len == n && memcmp(m->key, key, n) == 0)
            return m->val;
    }
    return NULL;
}

size_t sp_json_len(const sp_json_t *v)
{
    if (!v || (v->type != SP_JSON_ARRAY && v->type != SP_JSON_OBJECT))
        return 0;
    return v->len;
}

const sp_json_t *sp_json_at(const sp_json_t *v, size_t i)
{
    if (!v || i >= sp_json_len(v))
        return NULL;
    return v->type == SP_JSON_ARRAY ? v->u.items[i] : v->u.members[i].val;
}

const char *sp_json_key_at(const sp_json_t *v, size_t i)
{
    if (!v || v->type != SP_JSON_OBJECT || i >= v->len)
        return NULL;
    return v->u.members[i].key;
}

const char *sp_json_str(const sp_json_t *v, size_t *ret_len)
{
    if (!v || v->type != SP_JSON_STRING)
        return NULL;
    if (ret_len)
        *ret_len = v->len;
    return v->u.str;
}

/* Exact: value = digits * 10^exp, with the digits of the integer and fraction parts joined and
 * exp the written exponent minus the number of fraction digits. After dropping leading and
 * trailing zeros (each trailing zero raises exp), the value is an integer iff exp >= 0, and
 * fits in 64 bits only if it has at most 19 digits. */
int sp_json_int(const sp_json_t *v, int64_t min, int64_t max, int64_t *ret)
{
    if (!v || v->type != SP_JSON_NUMBER)
        return -EINVAL;

    const char *s = v->u.num.text;
    const char *end = s + v->len;
    char digits[NUMBER_MAX];
    size_t nd = 0;
    int64_t exp = 0;
    bool neg = false;

    if (*s == '-') {
        neg = true;
        s++;
    }
    while (s < end && *s >= '0' && *s <= '9')
        digits[nd++] = *s++;
    if (s < end && *s == '.') {
        s++;
        while (s < end && *s >= '0' && *s <= '9') {
            digits[nd++] = *s++;
            exp--;
        }
    }
    if (s < end && (*s == 'e' || *s == 'E')) {
        bool eneg = false;
        int64_t e = 0;
        s++;
        if (*s == '+' || *s == '-')
            eneg = *s++ == '-';
        /* Saturate: past a million the answer no longer depends on the exponent's value, since
         * there are at most NUMBER_MAX digits. */
        while (s < end && *s >= '0' && *s <= '9') {
            if (e < 1000000)
                e = e * 10 + (*s - '0');
            s++;
        }
        exp += eneg ? -e : e;
    }

    size_t first = 0;
    while (first < nd && digits[first] == '0')
        first++;
    uint64_t mag = 0;
    if (first < nd) {
        while (digits[nd - 1] == '0') {
            nd--;
            exp++;
        }
        if (exp < 0)
            return -EINVAL;
        if (exp > 19 || nd - first + (size_t)exp > 19)
            return -ERANGE;
        /* At most 19 digits: below 10^19 < 2^64, no overflow. */
        for (size_t i = first; i < nd; i++)
            mag = mag * 10 + (uint64_t)(digits[i] - '0');
        for (int64_t i = 0; i < exp; i++)
            mag *= 10;
    }

    int64_t val;
    if (!neg) {
        if (mag > (uint64_t)INT64_MAX)
            return -ERANGE;
        val = (int64_t)mag;
    } else {
        if (mag > (uint64_t)INT64_MAX + 1)
            return -ERANGE;
        val = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
    }
    if (val < min || val > max)
        return -ERANGE;
    *ret = val;
    return 0;
}

int sp_json_double(const sp_json_t *v, double *ret)
{
    if (!v || v->type != SP_JSON_NUMBER)
        return -EINVAL;
    *ret = v->u.num.d;
    return 0;
}

int sp_json_bool(const sp_json_t *v, bool *ret)
{
    if (!v || v->type != SP_JSON_BOOL)
        return -EINVAL;
    *ret = v->u.b;
    return 0;
}
