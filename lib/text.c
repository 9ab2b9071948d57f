/* Text validation (text.h): the one UTF-8 decoder of the project. */
#include "text.h"

#include <errno.h>
#include <time.h>

size_t sp_utf8_seq(const uint8_t *p, size_t avail, bool *ret_partial)
{
    uint8_t c = p[0], lo = 0x80, hi = 0xbf;
    size_t need;

    if (ret_partial)
        *ret_partial = false;
    if (avail == 0)
        return 0;
    if (c < 0x80)
        return 1;
    /* RFC 3629 section 4: no overlong forms (C0, C1, E0 80..9F, F0 80..8F), no UTF-16
     * surrogates (ED A0..BF), nothing above U+10FFFF (F4 90.., F5..FF). */
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        return 0;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= avail) {
            if (ret_partial)
                *ret_partial = true;
            return 0;
        }
        uint8_t b = p[i];
        if (i == 1 ? (b < lo || b > hi) : (b & 0xc0) != 0x80)
            return 0;
    }
    return need;
}

static bool control(uint8_t c, unsigned flags)
{
    if (c >= 0x20 && c != 0x7f)
        return false;
    return !((flags & SP_TEXT_SPACE_CONTROLS) && (c == '\n' || c == '\t' || c == '\r'));
}

bool sp_text_valid(const char *s, size_t max, unsigned flags)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t n = 0;
    while (p[n]) {
        if (control(p[n], flags))
            return false;
        /* The NUL terminator stops a truncated sequence: avail need not be exact. */
        size_t k = sp_utf8_seq(p + n, 4, NULL);
        if (k == 0)
            return false;
        n += k;
        if (n > max)
            return false;
    }
    return true;
}

int sp_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int sp_time_parse(const char *s, int64_t *ret_us)
{
    struct tm tm = {0};
    const char *p = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    int64_t frac = 0, offset_s = 0;
    if (!p)
        return -EINVAL;
    if (*p == '.') {
        int digits = 0;
        for (p++; *p >= '0' && *p <= '9'; p++, digits++)
            if (digits < 6)
                frac = frac * 10 + (*p - '0');
        if (digits == 0)
            return -EINVAL;
        for (; digits < 6; digits++)
            frac *= 10;
    }
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if ((*p == '+' || *p == '-') && p[1] >= '0' && p[1] <= '9' && p[2] >= '0' &&
               p[2] <= '9' && p[3] == ':' && p[4] >= '0' && p[4] <= '9' && p[5] >= '0' &&
               p[5] <= '9') {
        int hh = (p[1] - '0') * 10 + (p[2] - '0'), mm = (p[4] - '0') * 10 + (p[5] - '0');
        if (hh > 23 || mm > 59)
            return -EINVAL;
        offset_s = (*p == '-' ? -1 : 1) * (hh * 3600 + mm * 60);
        p += 6;
    } else {
        return -EINVAL;
    }
    if (*p)
        return -EINVAL;
    time_t t = timegm(&tm);
    if (t <= 0)
        return -EINVAL;
    *ret_us = ((int64_t)t - offset_s) * 1000000 + frac;
    return 0;
}
