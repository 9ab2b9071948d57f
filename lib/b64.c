/* Base64 (RFC 4648 sections 4 and 5, padded), strict on decode (b64.h). */
#include "b64.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "xmalloc.h"

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static const char b64url_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static void encode(sp_buf_t *out, const uint8_t *p, size_t n, const char *alphabet)
{
    char q[4];
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        q[0] = alphabet[v >> 18];
        q[1] = alphabet[(v >> 12) & 63];
        q[2] = alphabet[(v >> 6) & 63];
        q[3] = alphabet[v & 63];
        sp_buf_append(out, q, 4);
    }
    if (i < n) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
        q[0] = alphabet[v >> 18];
        q[1] = alphabet[(v >> 12) & 63];
        q[2] = '=';
        q[3] = '=';
        if (i + 1 < n)
            q[2] = alphabet[(v >> 6) & 63];
        sp_buf_append(out, q, 4);
    }
}

static int b64_value(char c, bool url)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == (url ? '-' : '+'))
        return 62;
    if (c == (url ? '_' : '/'))
        return 63;
    return -1;
}

/* Strict: a multiple of 4 characters of the alphabet, padding only at the end, and the unused
 * bits of the last group zero (RFC 4648 section 3.5), so one byte string has one encoding. */
static int decode(const char *s, size_t n, bool url, uint8_t **ret, size_t *ret_len)
{
    if (n % 4 != 0)
        return -EINVAL;
    size_t pad = 0;
    if (n >= 4 && s[n - 1] == '=')
        pad = s[n - 2] == '=' ? 2 : 1;
    uint8_t *out = sp_xmalloc(n / 4 * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        bool last = i + 4 == n;
        int v[4];
        for (int k = 0; k < 4; k++) {
            bool padded = last && k >= 4 - (int)pad;
            v[k] = padded ? 0 : b64_value(s[i + (size_t)k], url);
            if (v[k] < 0) {
                free(out);
                return -EINVAL;
            }
        }
        uint32_t x =
            (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        if (last && ((pad == 2 && (x & 0xffff)) || (pad == 1 && (x & 0xff)))) {
            free(out);
            return -EINVAL;
        }
        out[o++] = (uint8_t)(x >> 16);
        if (!last || pad < 2)
            out[o++] = (uint8_t)(x >> 8);
        if (!last || pad < 1)
            out[o++] = (uint8_t)x;
    }
    *ret = out;
    *ret_len = o;
    return 0;
}

void sp_b64_encode(sp_buf_t *out, const uint8_t *p, size_t n)
{
    encode(out, p, n, b64_alphabet);
}

int sp_b64_decode(const char *s, size_t n, uint8_t **ret, size_t *ret_len)
{
    return decode(s, n, false, ret, ret_len);
}

void sp_b64url_encode(sp_buf_t *out, const uint8_t *p, size_t n)
{
    encode(out, p, n, b64url_alphabet);
}

int sp_b64url_decode(const char *s, size_t n, uint8_t **ret, size_t *ret_len)
{
    return decode(s, n, true, ret, ret_len);
}
