/* Redaction of known values from a stream (redact.h). */
#include "redact.h"

#include <stdlib.h>
#include <string.h>

#include "xmalloc.h"

typedef struct {
    char name[65];
    uint8_t *v;
    size_t len;
} rvalue_t;

struct sp_redactor {
    rvalue_t *vals;
    size_t n;
    size_t longest;
    size_t min_len;
    bool mask_mode; /* same length (mask) rather than "[redacted:NAME]" */
    uint8_t mask;
    bool first[256]; /* first bytes of the values: every other byte is skipped at once */
    sp_redact_match_cb on_match;
    void *on_match_arg;
    /* Bytes fed and not yet dropped: the first sent of them are out already (released at a
     * stall, kept to finish a value they began), the rest may begin a value. */
    uint8_t *hold;
    size_t len, cap, sent;
};

static sp_redactor_t *redactor_new(bool mask_mode, uint8_t mask, size_t min_len)
{
    sp_redactor_t *r = sp_xcalloc(1, sizeof(*r));
    r->mask_mode = mask_mode;
    r->mask = mask;
    r->min_len = min_len ? min_len : 1;
    return r;
}

sp_redactor_t *sp_redactor_new(void)
{
    return redactor_new(false, 0, SP_REDACT_MIN);
}

sp_redactor_t *sp_redactor_new_mask(uint8_t mask, size_t min_len)
{
    return redactor_new(true, mask, min_len);
}

void sp_redactor_on_match(sp_redactor_t *r, sp_redact_match_cb cb, void *arg)
{
    r->on_match = cb;
    r->on_match_arg = arg;
}

bool sp_redactor_add(sp_redactor_t *r, const char *name, const void *value, size_t len)
{
    if (len < r->min_len || len > SP_REDACT_VALUE_MAX || r->n >= SP_REDACT_VALUES_MAX)
        return false;
    for (size_t i = 0; i < r->n; i++)
        if (r->vals[i].len == len && memcmp(r->vals[i].v, value, len) == 0)
            return true;
    r->vals = sp_xrealloc(r->vals, (r->n + 1) * sizeof(*r->vals));
    rvalue_t *v = &r->vals[r->n++];
    size_t k = 0;
    for (; name && name[k] && k < sizeof(v->name) - 1; k++) {
        char c = name[k];
        bool ok =
            (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
        v->name[k] = c;
        if (!ok)
            v->name[k] = '_';
    }
    v->name[k] = 0;
    v->v = sp_xmalloc(len);
    memcpy(v->v, value, len);
    v->len = len;
    r->first[v->v[0]] = true;
    if (len > r->longest)
        r->longest = len;
    return true;
}

void sp_redactor_add_env(sp_redactor_t *r, char *const *env, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *eq = env[i] ? strchr(env[i], '=') : NULL;
        if (!eq)
            continue;
        char name[65];
        size_t nl = (size_t)(eq - env[i]);
        memcpy(name, env[i], nl < 64 ? nl : 64);
        name[nl < 64 ? nl : 64] = '\0';
        (void)sp_redactor_add(r, name, eq + 1, strlen(eq + 1));
    }
}

size_t sp_redactor_min(const sp_redactor_t *r)
{
    return r->min_len;
}

size_t sp_redactor_count(const sp_redactor_t *r)
{
    return r->n;
}

/* At p (avail bytes): the longest value matching whole (its index), -1 if none; *partial
 * says whether the avail bytes are a proper prefix of a longer value. */
static long match_at(const sp_redactor_t *r, const uint8_t *p, size_t avail, bool *partial)
{
    long best = -1;
    *partial = false;
    for (size_t i = 0; i < r->n; i++) {
        const rvalue_t *v = &r->vals[i];
        if (v->len <= avail) {
            if (memcmp(p, v->v, v->len) == 0 && (best < 0 || v->len > r->vals[best].len))
                best = (long)i;
        } else if (memcmp(p, v->v, avail) == 0) {
            *partial = true;
        }
    }
    return best;
}

/* Room for need bytes in hold. A buffer that grows is copied and the old one wiped: the held
 * bytes may be most of a value. */
static void hold_reserve(sp_redactor_t *r, size_t need)
{
    if (need <= r->cap)
        return;
    size_t cap = r->cap ? r->cap * 2 : 256;
    while (cap < need)
        cap *= 2;
    uint8_t *p = sp_xmalloc(cap);
    if (r->len)
        memcpy(p, r->hold, r->len);
    if (r->hold)
        explicit_bzero(r->hold, r->cap);
    free(r->hold);
    r->hold = p;
    r->cap = cap;
}

static void put_replacement(sp_redactor_t *r, const rvalue_t *v, size_t n, sp_buf_t *out)
{
    if (!r->mask_mode) {
        sp_buf_printf(out, "[redacted:%s]", v->name);
        return;
    }
    uint8_t m[256];
    memset(m, r->mask, sizeof(m));
    while (n) {
        size_t k = n < sizeof(m) ? n : sizeof(m);
        sp_buf_append(out, m, k);
        n -= k;
    }
}

/* Scans hold: values are replaced, everything before the first place that may still begin a
 * value goes out. final: no value can complete any more (the stream ended or stalled).
 * keep: after a final scan, the last bytes are kept (already out) to finish a value they
 * began. */
static void scan(sp_redactor_t *r, sp_buf_t *out, bool final, bool keep)
{
    const uint8_t *d = r->hold;
    size_t len = r->len, i = 0;
    size_t pos = r->sent; /* everything before pos is out */
    while (i < len) {
        if (!r->first[d[i]]) {
            i++;
            continue;
        }
        bool partial;
        long m = match_at(r, d + i, len - i, &partial);
        /* A longer value may still complete here: wait for more bytes. */
        if (partial && !final)
            break;
        if (m < 0) {
            i++;
            continue;
        }
        const rvalue_t *v = &r->vals[m];
        size_t end = i + v->len;
        if (end > pos) {
            /* Begun in bytes released at a stall: only its rest can still be replaced. */
            size_t from = i > pos ? i : pos;
            sp_buf_append(out, d + pos, from - pos);
            put_replacement(r, v, end - from, out);
            pos = end;
            if (r->on_match)
                r->on_match(r->on_match_arg, v->name);
        }
        i = end;
    }
    if (i > pos) {
        sp_buf_append(out, d + pos, i - pos);
        pos = i;
    }
    size_t drop = i;
    if (final && keep) {
        /* Remember what may begin a value, out already. */
        size_t k = r->longest > 1 ? r->longest - 1 : 0;
        drop = len > k ? len - k : 0;
    } else if (final) {
        drop = len;
    }
    size_t rest = len - drop;
    if (drop) {
        memmove(r->hold, r->hold + drop, rest);
        explicit_bzero(r->hold + rest, drop);
    }
    r->len = rest;
    r->sent = pos > drop ? pos - drop : 0;
}

void sp_redactor_feed(sp_redactor_t *r, const void *data, size_t len, sp_buf_t *out)
{
    if (r->n == 0) {
        sp_buf_append(out, data, len);
        return;
    }
    if (len == 0)
        return;
    hold_reserve(r, r->len + len);
    memcpy(r->hold + r->len, data, len);
    r->len += len;
    scan(r, out, false, false);
}

void sp_redactor_release(sp_redactor_t *r, sp_buf_t *out)
{
    scan(r, out, true, true);
}

void sp_redactor_flush(sp_redactor_t *r, sp_buf_t *out)
{
    scan(r, out, true, false);
}

size_t sp_redactor_held(const sp_redactor_t *r)
{
    return r->len - r->sent;
}

void sp_redactor_free(sp_redactor_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        explicit_bzero(r->vals[i].v, r->vals[i].len);
        free(r->vals[i].v);
    }
    free(r->vals);
    if (r->hold)
        explicit_bzero(r->hold, r->cap);
    free(r->hold);
    explicit_bzero(r, sizeof(*r));
    free(r);
}
