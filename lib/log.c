/* Structured logging: one line per event, key=value or JSON, on stderr.
 *
 * Every string that reaches a line (message, values, even keys) goes through one escaper, so
 * input from a client or a guest cannot add a field, end the line early or hide itself behind
 * terminal control sequences. Lines are capped at SP_LOG_LINE_MAX: a line that would be longer
 * is cut at a character boundary, its open string closed and a truncated=true field added, so
 * even a cut line parses.
 */
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* Room kept after the body for a closing quote, the truncation marker, '}' and '\n'. */
#define TAIL_MAX 32
#define BODY_MAX (SP_LOG_LINE_MAX - TAIL_MAX)

static const char *_Atomic log_daemon = "space";
static _Atomic int log_min_level = SP_LOG_INFO;
static _Atomic int log_format = SP_LOG_KV;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void sp_log_init(const char *daemon, sp_log_level_t min_level, sp_log_format_t format)
{
    atomic_store_explicit(&log_daemon, daemon, memory_order_relaxed);
    atomic_store_explicit(&log_min_level, (int)min_level, memory_order_relaxed);
    atomic_store_explicit(&log_format, (int)format, memory_order_relaxed);
}

int sp_log_level_parse(const char *s, sp_log_level_t *ret_level)
{
    for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
        if (s && strcmp(s, level_names[i]) == 0) {
            *ret_level = (sp_log_level_t)i;
            return 0;
        }
    }
    return -EINVAL;
}

int sp_log_format_parse(const char *s, sp_log_format_t *ret_format)
{
    if (s && strcmp(s, "kv") == 0) {
        *ret_format = SP_LOG_KV;
        return 0;
    }
    if (s && strcmp(s, "json") == 0) {
        *ret_format = SP_LOG_JSON;
        return 0;
    }
    return -EINVAL;
}

int sp_log_enabled(sp_log_level_t level)
{
    return (int)level >= atomic_load_explicit(&log_min_level, memory_order_relaxed);
}

/* The line being rendered. pos counts every byte of the line; only those that fit in buf
 * (leaving room for the NUL) are stored, which gives sp_log_format_line snprintf's contract. */
typedef struct {
    char *buf;
    size_t len;
    size_t pos;
    size_t nfields;
    bool full; /* the body reached BODY_MAX: nothing more is added */
} line_t;

static void put(line_t *l, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++, l->pos++)
        if (l->pos + 1 < l->len)
            l->buf[l->pos] = s[i];
}

static bool fits(const line_t *l, size_t n)
{
    return !l->full && l->pos + n <= BODY_MAX;
}

/* Decodes one UTF-8 sequence (RFC 3629 section 4: no overlong forms, no surrogates, nothing
 * above U+10FFFF). Returns its length, or 0 when s[0] does not start a valid sequence. A NUL
 * fails as a continuation byte, so this never reads past the string. */
static size_t utf8_decode(const unsigned char *s, uint32_t *ret_cp)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xbf;
    uint32_t cp;
    size_t n;

    if (c < 0x80) {
        *ret_cp = c;
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        cp = c & 0x0f;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        cp = c & 0x07;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if (s[i] < lo || s[i] > hi)
            return 0;
        lo = 0x80;
        hi = 0xbf;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    *ret_cp = cp;
    return n;
}

/* Code points escaped even though they are valid text: C0 and C1 controls and DEL (terminal
 * escape sequences), U+2028/U+2029 (line breaks to JavaScript and some viewers) and the bidi
 * embedding, override and isolate controls that can make a line read differently than it is. */
static bool cp_needs_escape(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
           (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

/* Renders the character at s in its escaped form into out; *ret_n gets how many input bytes it
 * used. kv writes ASCII controls and invalid bytes as \xNN, JSON (RFC 8259 section 7) writes
 * controls as \u00NN and replaces invalid bytes with U+FFFD so the line stays valid UTF-8. */
static size_t escape_one(sp_log_format_t fmt, const unsigned char *s, size_t *ret_n, char *out,
                         size_t outlen)
{
    uint32_t cp;
    size_t n = utf8_decode(s, &cp);
    int w;

    if (n == 0) {
        *ret_n = 1;
        if (fmt == SP_LOG_JSON)
            w = snprintf(out, outlen, "\\ufffd");
        else
            w = snprintf(out, outlen, "\\x%02x", s[0]);
        return (size_t)w;
    }
    *ret_n = n;
    switch (cp) {
    case '"':
        return (size_t)snprintf(out, outlen, "\\\"");
    case '\\':
        return (size_t)snprintf(out, outlen, "\\\\");
    case '\n':
        return (size_t)snprintf(out, outlen, "\\n");
    case '\r':
        return (size_t)snprintf(out, outlen, "\\r");
    case '\t':
        return (size_t)snprintf(out, outlen, "\\t");
    default:
        break;
    }
    if (cp_needs_escape(cp)) {
        if (fmt == SP_LOG_KV && cp < 0x80)
            w = snprintf(out, outlen, "\\x%02x", (unsigned)cp);
        else
            w = snprintf(out, outlen, "\\u%04x", (unsigned)cp);
        return (size_t)w;
    }
    memcpy(out, s, n);
    return n;
}

/* A kv value goes bare only when it is plain ASCII without space, quote, '=' or backslash;
 * anything else is quoted and escaped, so it always reads back as exactly one value. */
static bool kv_needs_quotes(const char *s)
{
    if (!*s)
        return true;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p <= ' ' || *p >= 0x7f || *p == '"' || *p == '=' || *p == '\\')
            return true;
    return false;
}

/* Puts an escaped string; stops at the character that would not fit and marks the line full. */
static void put_escaped(line_t *l, sp_log_format_t fmt, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    char esc[16];
    size_t used;

    while (*p) {
        size_t n = escape_one(fmt, p, &used, esc, sizeof(esc));
        if (!fits(l, n)) {
            l->full = true;
            return;
        }
        put(l, esc, n);
        p += used;
    }
}

/* Starts a field: separator and key. Keys come from code, but are cleaned like values: kv keys
 * keep [A-Za-z0-9_.-] and turn anything else into '_'. Returns false, having put nothing, when
 * the start does not fit together with extra bytes of value. */
static bool field_begin(line_t *l, sp_log_format_t fmt, const char *key, size_t extra)
{
    size_t mark = l->pos;

    if (l->full)
        return false;
    if (l->nfields > 0)
        put(l, fmt == SP_LOG_JSON ? "," : " ", 1);
    if (fmt == SP_LOG_JSON) {
        put(l, "\"", 1);
        put_escaped(l, fmt, key ? key : "");
        put(l, "\":", 2);
    } else if (!key || !*key) {
        put(l, "_=", 2);
    } else {
        for (const char *k = key; *k; k++) {
            char c = *k;
            bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '.' || c == '-';
            put(l, ok ? k : "_", 1);
        }
        put(l, "=", 1);
    }
    if (l->full || l->pos + extra > BODY_MAX) {
        l->pos = mark;
        l->full = true;
        return false;
    }
    l->nfields++;
    return true;
}

static void field_str(line_t *l, sp_log_format_t fmt, const char *key, const char *val)
{
    bool quote;

    if (fmt == SP_LOG_JSON && !val) {
        if (field_begin(l, fmt, key, 4))
            put(l, "null", 4);
        return;
    }
    if (!val)
        val = "";
    quote = fmt == SP_LOG_JSON || kv_needs_quotes(val);
    /* The closing quote is covered by TAIL_MAX, so a cut value can always be closed. */
    if (!field_begin(l, fmt, key, quote ? 1 : 0))
        return;
    if (quote)
        put(l, "\"", 1);
    put_escaped(l, fmt, val);
    if (quote)
        put(l, "\"", 1);
}

/* Numbers are never cut: a field whose number does not fit is left out whole. */
static void field_raw(line_t *l, sp_log_format_t fmt, const char *key, const char *val)
{
    size_t n = strlen(val);

    if (field_begin(l, fmt, key, n))
        put(l, val, n);
}

/* Shortest of %.15g and %.17g that reads back as the same double. JSON has no NaN or infinity
 * (RFC 8259 section 6), so they become null there. */
static void format_double(char *out, size_t len, double d, sp_log_format_t fmt)
{
    if (!isfinite(d)) {
        if (fmt == SP_LOG_JSON)
            snprintf(out, len, "null");
        else
            snprintf(out, len, "%s", isnan(d) ? "nan" : d > 0 ? "+inf" : "-inf");
        return;
    }
    snprintf(out, len, "%.15g", d);
    if (strtod(out, NULL) != d)
        snprintf(out, len, "%.17g", d);
}

/* RFC 3339 UTC with milliseconds: 2026-11-29T23:59:01.123Z. */
static void format_ts(char *out, size_t len)
{
    struct timespec ts;
    struct tm tm;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000));
}

size_t sp_log_format_line(char *buf, size_t len, sp_log_format_t format, const char *daemon,
                          sp_log_level_t level, const char *msg, const sp_kv_t *kv, size_t nkv)
{
    line_t l = {.buf = buf, .len = len};
    char ts[96], num[64];
    const char *lname = (unsigned)level < sizeof(level_names) / sizeof(level_names[0])
                            ? level_names[level]
                            : "unknown";

    if (format != SP_LOG_JSON)
        format = SP_LOG_KV;
    format_ts(ts, sizeof(ts));
    if (format == SP_LOG_JSON)
        put(&l, "{", 1);
    field_str(&l, format, "ts", ts);
    field_str(&l, format, "level", lname);
    field_str(&l, format, "daemon", daemon ? daemon : "");
    field_str(&l, format, "msg", msg ? msg : "");
    for (size_t i = 0; i < nkv && !l.full; i++) {
        switch (kv[i].type) {
        case SP_KV_STR:
            field_str(&l, format, kv[i].key, kv[i].v.s);
            continue;
        case SP_KV_I64:
            snprintf(num, sizeof(num), "%" PRId64, kv[i].v.i);
            break;
        case SP_KV_U64:
            snprintf(num, sizeof(num), "%" PRIu64, kv[i].v.u);
            break;
        case SP_KV_F64:
            format_double(num, sizeof(num), kv[i].v.d, format);
            break;
        default:
            /* A zeroed sp_kv_t or a corrupted type: say so rather than guess at the union. */
            snprintf(num, sizeof(num), "%s", format == SP_LOG_JSON ? "null" : "?");
            break;
        }
        field_raw(&l, format, kv[i].key, num);
    }
    if (l.full) {
        if (format == SP_LOG_JSON)
            put(&l, ",\"truncated\":true", 17);
        else
            put(&l, " truncated=true", 15);
    }
    if (format == SP_LOG_JSON)
        put(&l, "}", 1);
    put(&l, "\n", 1);
    if (len > 0)
        buf[l.pos < len ? l.pos : len - 1] = '\0';
    return l.pos;
}

void sp_log_kv(sp_log_level_t level, const char *msg, const sp_kv_t *kv, size_t nkv)
{
    char buf[SP_LOG_LINE_MAX + 1];
    int saved_errno = errno;
    size_t n;

    if (!sp_log_enabled(level))
        return;
    n = sp_log_format_line(
        buf, sizeof(buf), (sp_log_format_t)atomic_load_explicit(&log_format, memory_order_relaxed),
        atomic_load_explicit(&log_daemon, memory_order_relaxed), level, msg, kv, nkv);
    if (n >= sizeof(buf))
        n = sizeof(buf) - 1;
    /* One write(2) per line keeps lines from concurrent threads whole; the loop only finishes
     * a write that a signal or a full pipe cut short. Logging never changes errno for the
     * caller. */
    for (const char *p = buf; n > 0;) {
        ssize_t w = write(STDERR_FILENO, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        p += w;
        n -= (size_t)w;
    }
    errno = saved_errno;
}
