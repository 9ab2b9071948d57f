/* Signed checkpoints of the event log (checkpoint.h). */
#include "checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "text.h"

#define DOMAIN     "SPACE-C ckpt v1"
#define DOMAIN_LEN (sizeof(DOMAIN)) /* with its NUL */
#define PREFIX     "space-ckpt v1 signer="
#define SIG_KEY    " sig="

static int sign_line(const sp_sign_key_t *key, const char *body, size_t len,
                     uint8_t sig[SP_SIG_LEN])
{
    uint8_t msg[DOMAIN_LEN + SP_CKPT_LINE_MAX];

    if (len > SP_CKPT_LINE_MAX)
        return -EINVAL;
    memcpy(msg, DOMAIN, DOMAIN_LEN);
    memcpy(msg + DOMAIN_LEN, body, len);
    return sp_sign(key, msg, DOMAIN_LEN + len, sig);
}

static bool is_eventlog(const char *name)
{
    sp_identity_t id;
    return sp_identity_parse(name, &id) == 0 && id.kind == SP_KIND_EVENTLOG;
}

int sp_ckpt_format(const sp_ckpt_t *c, const sp_sign_key_t *key, char out[SP_CKPT_LINE_MAX])
{
    char head[SP_SHA256_HEX_LEN + 1], at[64], sig_hex[2 * SP_SIG_LEN + 1];
    uint8_t sig[SP_SIG_LEN];
    int64_t sec = c->at_us / 1000000, frac = c->at_us % 1000000;
    struct tm tm;
    time_t t;
    int n;

    if (!c || !key || !is_eventlog(c->signer) || c->at_us < 0)
        return -EINVAL;
    t = (time_t)sec;
    if (!gmtime_r(&t, &tm))
        return -EINVAL;
    snprintf(at, sizeof(at), "%04d-%02d-%02dT%02d:%02d:%02d.%06" PRId64 "Z", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
    sp_hex_encode(c->head, SP_SHA256_LEN, head);
    n = snprintf(out, SP_CKPT_LINE_MAX,
                 PREFIX "%s seq=%" PRIu64 " rows=%" PRIu64 " head=%s at=%s verify_from=%" PRIu64,
                 c->signer, c->seq, c->rows, head, at, c->verify_from);
    if (n < 0 || (size_t)n + sizeof(SIG_KEY) + 2 * SP_SIG_LEN + 1 >= SP_CKPT_LINE_MAX)
        return -EINVAL;
    if (sign_line(key, out, (size_t)n, sig) < 0)
        return -EINVAL;
    sp_hex_encode(sig, SP_SIG_LEN, sig_hex);
    n += snprintf(out + n, SP_CKPT_LINE_MAX - (size_t)n, SIG_KEY "%s\n", sig_hex);
    return n;
}

/* A cursor over the line: each reader consumes what it matched, or fails. */
typedef struct {
    const char *p, *end;
} cur_t;

static bool lit(cur_t *c, const char *s)
{
    size_t n = strlen(s);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, s, n) != 0)
        return false;
    c->p += n;
    return true;
}

/* Decimal without leading zeros (but "0"), up to UINT64_MAX. */
static bool u64(cur_t *c, uint64_t *ret)
{
    uint64_t v = 0;
    const char *s = c->p;

    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        unsigned d = (unsigned)(*c->p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
        c->p++;
    }
    if (c->p == s || (*s == '0' && c->p - s > 1))
        return false;
    *ret = v;
    return true;
}

/* Up to the next space: at most max bytes, into out (NUL-terminated). */
static bool token(cur_t *c, char *out, size_t max)
{
    const char *s = c->p;
    while (c->p < c->end && *c->p != ' ')
        c->p++;
    size_t n = (size_t)(c->p - s);
    if (n == 0 || n > max)
        return false;
    memcpy(out, s, n);
    out[n] = '\0';
    return true;
}

/* Exactly 2 * n lower-case hex digits. */
static bool hex(cur_t *c, uint8_t *out, size_t n)
{
    char buf[2 * SP_SIG_LEN + 1];
    if (2 * n >= sizeof(buf) || (size_t)(c->end - c->p) < 2 * n)
        return false;
    for (size_t i = 0; i < 2 * n; i++)
        if (!((c->p[i] >= '0' && c->p[i] <= '9') || (c->p[i] >= 'a' && c->p[i] <= 'f')))
            return false;
    memcpy(buf, c->p, 2 * n);
    buf[2 * n] = '\0';
    c->p += 2 * n;
    return sp_hex_decode(buf, out, n) == 0;
}

int sp_ckpt_verify(const sp_keyring_t *kr, const char *line, size_t len, sp_ckpt_t *ret)
{
    char at[40];
    uint8_t sig[SP_SIG_LEN], msg[DOMAIN_LEN + SP_CKPT_LINE_MAX];
    sp_ckpt_t c;
    cur_t cur;
    size_t body;

    if (!line || !ret)
        return -EINVAL;
    if (len > 0 && line[len - 1] == '\n')
        len--;
    if (len >= SP_CKPT_LINE_MAX)
        return SP_EDECODE;
    memset(&c, 0, sizeof(c));
    cur.p = line;
    cur.end = line + len;
    if (!lit(&cur, PREFIX) || !token(&cur, c.signer, SP_IDENTITY_MAX) || !lit(&cur, " seq=") ||
        !u64(&cur, &c.seq) || !lit(&cur, " rows=") || !u64(&cur, &c.rows) || !lit(&cur, " head=") ||
        !hex(&cur, c.head, SP_SHA256_LEN) || !lit(&cur, " at=") ||
        !token(&cur, at, sizeof(at) - 1) || sp_time_parse(at, &c.at_us) < 0 ||
        !lit(&cur, " verify_from=") || !u64(&cur, &c.verify_from))
        return SP_EDECODE;
    body = (size_t)(cur.p - line);
    if (!lit(&cur, SIG_KEY) || !hex(&cur, sig, SP_SIG_LEN) || cur.p != cur.end)
        return SP_EDECODE;
    *ret = c;
    if (!is_eventlog(c.signer))
        return SP_ENOTALLOWED;
    memcpy(msg, DOMAIN, DOMAIN_LEN);
    memcpy(msg + DOMAIN_LEN, line, body);
    /* Judged at the time it names: a checkpoint signed before a rotation of the event log's
     * key keeps verifying after the grace (docs/trust.md, "Rotating a key"). */
    return sp_keyring_verify_at(kr, c.signer, msg, DOMAIN_LEN + body, sig, c.at_us * 1000);
}
