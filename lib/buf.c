/* Growable buffer and JSON string escaping (buf.h). */
#include "buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "hash.h"
#include "text.h"
#include "xmalloc.h"

void sp_buf_init(sp_buf_t *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void sp_buf_dispose(sp_buf_t *b)
{
    free(b->data);
    sp_buf_init(b);
}

void sp_buf_reset(sp_buf_t *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

static void reserve(sp_buf_t *b, size_t extra)
{
    if (extra >= SIZE_MAX - b->len - 1) {
        fputs("sp_buf: size overflow\n", stderr);
        abort();
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    b->data = sp_xrealloc(b->data, cap);
    b->cap = cap;
}

void sp_buf_append(sp_buf_t *b, const void *data, size_t len)
{
    reserve(b, len);
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void sp_buf_puts(sp_buf_t *b, const char *s)
{
    sp_buf_append(b, s, strlen(s));
}

void sp_buf_putc(sp_buf_t *b, char c)
{
    sp_buf_append(b, &c, 1);
}

void sp_buf_printf(sp_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *sp_buf_take(sp_buf_t *b)
{
    char *s = b->data ? b->data : sp_xstrdup("");
    sp_buf_init(b);
    return s;
}

void sp_buf_json_str(sp_buf_t *b, const char *s)
{
    if (!s) {
        sp_buf_puts(b, "null");
        return;
    }
    sp_buf_json_strn(b, s, strlen(s));
}

void sp_buf_json_strn(sp_buf_t *b, const void *data, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = data;
    size_t run = 0;

    sp_buf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f)
            continue;
        sp_buf_append(b, p + run, i - run);
        run = i + 1;
        switch (c) {
        case '"':
            sp_buf_puts(b, "\\\"");
            break;
        case '\\':
            sp_buf_puts(b, "\\\\");
            break;
        case '\n':
            sp_buf_puts(b, "\\n");
            break;
        case '\r':
            sp_buf_puts(b, "\\r");
            break;
        case '\t':
            sp_buf_puts(b, "\\t");
            break;
        default: {
            char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xf]};
            sp_buf_append(b, esc, sizeof(esc));
        }
        }
    }
    sp_buf_append(b, p + run, n - run);
    sp_buf_putc(b, '"');
}

void sp_buf_safe_text(sp_buf_t *b, const char *s, size_t max)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t used = 0;
    while (*p && used < max) {
        /* Control characters (C0, DEL, C1) are escaped like invalid bytes. */
        size_t k = (*p < 0x20 || *p == 0x7f) ? 0 : sp_utf8_seq(p, 4, NULL);
        if (k == 2 && p[0] == 0xc2 && p[1] < 0xa0)
            k = 0;
        if (k > 0) {
            sp_buf_append(b, p, k);
            p += k;
            used += k;
        } else {
            sp_buf_printf(b, "\\x%02x", *p);
            p++;
            used++;
        }
    }
}

void sp_buf_hex(sp_buf_t *b, const uint8_t *data, size_t len)
{
    reserve(b, len * 2);
    sp_hex_encode(data, len, b->data + b->len); /* writes the NUL too */
    b->len += len * 2;
}
