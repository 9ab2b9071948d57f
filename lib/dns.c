/* DNS wire format for space-egressd (dns.h). RFC 1035 sections 4.1.1 (header), 4.1.2
 * (question), 4.1.3 (resource records), 4.1.4 (compression). */
#include "dns.h"

#include <errno.h>
#include <string.h>
#include <stdio.h>
#include <strings.h>

#define HDR_LEN       12
#define MAX_JUMPS     16
#define CNAME_CHAIN   8
#define NAME_TEXT_MAX 253

static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t rd32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static bool label_char_ok(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* Reads the name at *off into out (lowercase text). allow_ptr: compression pointers may be
 * followed (answers), each strictly backwards. *off moves past the name as it appears at
 * *off. 0 or -EINVAL. */
static int read_name(const uint8_t *msg, size_t len, size_t *off, bool allow_ptr,
                     char out[NAME_TEXT_MAX + 1])
{
    size_t pos = *off, text = 0, end = 0;
    bool jumped = false;
    int jumps = 0;
    for (;;) {
        if (pos >= len)
            return -EINVAL;
        uint8_t l = msg[pos];
        if ((l & 0xc0) == 0xc0) {
            if (!allow_ptr || pos + 1 >= len || ++jumps > MAX_JUMPS)
                return -EINVAL;
            size_t target = ((size_t)(l & 0x3f) << 8) | msg[pos + 1];
            if (target >= pos) /* only backwards: no loops */
                return -EINVAL;
            if (!jumped)
                end = pos + 2;
            jumped = true;
            pos = target;
            continue;
        }
        if (l & 0xc0)
            return -EINVAL; /* 0x40 / 0x80: extended label types (RFC 6891) are not names */
        if (l == 0) {
            if (!jumped)
                end = pos + 1;
            break;
        }
        if (pos + 1 + l > len || l > 63)
            return -EINVAL;
        if (text + (text ? 1 : 0) + l > NAME_TEXT_MAX)
            return -EINVAL;
        if (text)
            out[text++] = '.';
        for (size_t i = 0; i < l; i++) {
            uint8_t c = msg[pos + 1 + i];
            if (!label_char_ok(c))
                return -EINVAL;
            out[text++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        }
        pos += 1 + l;
    }
    if (text == 0)
        return -EINVAL; /* the root: nothing egressd would resolve */
    out[text] = '\0';
    *off = end;
    return 0;
}

int sp_dns_header_id(const uint8_t *msg, size_t len)
{
    return len < HDR_LEN ? -1 : rd16(msg);
}

int sp_dns_parse_query(const uint8_t *msg, size_t len, sp_dns_query_t *ret)
{
    sp_dns_query_t q;
    memset(&q, 0, sizeof(q));
    if (!msg || len < HDR_LEN || len > SP_DNS_MSG_MAX + 512)
        return -EINVAL;
    uint16_t flags = rd16(msg + 2);
    /* QR=0, opcode QUERY, no AA/TC, Z bits clear, RCODE 0. */
    if ((flags & 0x8000) || ((flags >> 11) & 0xf) != 0 || (flags & 0x0400) || (flags & 0x0200) ||
        (flags & 0x0040) || (flags & 0x000f))
        return -EINVAL;
    if (rd16(msg + 4) != 1 || rd16(msg + 6) != 0 || rd16(msg + 8) != 0 || rd16(msg + 10) > 1)
        return -EINVAL;
    q.id = rd16(msg);
    q.rd = (flags & 0x0100) != 0;
    size_t off = HDR_LEN;
    if (read_name(msg, len, &off, false, q.name) < 0 || off + 4 > len)
        return -EINVAL;
    q.qtype = rd16(msg + off);
    q.qclass = rd16(msg + off + 2);
    off += 4;
    if (rd16(msg + 10) == 1) {
        /* One EDNS OPT record (RFC 6891 6.1.2): root owner, type 41, then class, TTL, rdata. */
        if (off + 11 > len || msg[off] != 0 || rd16(msg + off + 1) != 41)
            return -EINVAL;
        size_t rdlen = rd16(msg + off + 9);
        off += 11 + rdlen;
        if (off > len)
            return -EINVAL;
    }
    if (off != len)
        return -EINVAL; /* trailing bytes: a smuggling channel, refuse */
    *ret = q;
    return 0;
}

static size_t put_name(uint8_t *buf, size_t cap, size_t off, const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > NAME_TEXT_MAX || off + n + 2 > cap)
        return 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && name[i] != '.') {
            if (!label_char_ok((uint8_t)name[i]))
                return 0;
            continue;
        }
        size_t l = i - start;
        if (l == 0 || l > 63)
            return 0;
        buf[off++] = (uint8_t)l;
        memcpy(buf + off, name + start, l);
        off += l;
        start = i + 1;
    }
    buf[off++] = 0;
    return off;
}

size_t sp_dns_build_query(uint8_t *buf, size_t cap, uint16_t id, const char *name, uint16_t qtype)
{
    if (cap < HDR_LEN)
        return 0;
    memset(buf, 0, HDR_LEN);
    wr16(buf, id);
    wr16(buf + 2, 0x0100); /* RD */
    wr16(buf + 4, 1);
    size_t off = put_name(buf, cap, HDR_LEN, name);
    if (off == 0 || off + 4 > cap)
        return 0;
    wr16(buf + off, qtype);
    wr16(buf + off + 2, SP_DNS_CLASS_IN);
    return off + 4;
}

int sp_dns_parse_response(const uint8_t *msg, size_t len, uint16_t id, const char *name,
                          sp_dns_a_t *out, size_t max, size_t *ret_n, int *ret_rcode)
{
    char qn[NAME_TEXT_MAX + 1], owner[NAME_TEXT_MAX + 1];
    char chain[CNAME_CHAIN + 1][NAME_TEXT_MAX + 1];
    size_t n_chain = 1, n = 0;
    if (!msg || len < HDR_LEN || rd16(msg) != id)
        return -EINVAL;
    uint16_t flags = rd16(msg + 2);
    if (!(flags & 0x8000) || ((flags >> 11) & 0xf) != 0 || (flags & 0x0200))
        return -EINVAL; /* not a response, not QUERY, or truncated (no TCP fallback here) */
    if (rd16(msg + 4) != 1)
        return -EINVAL;
    size_t an = rd16(msg + 6), off = HDR_LEN;
    if (read_name(msg, len, &off, true, qn) < 0 || off + 4 > len || strcasecmp(qn, name) != 0 ||
        rd16(msg + off + 2) != SP_DNS_CLASS_IN)
        return -EINVAL;
    off += 4;
    snprintf(chain[0], sizeof(chain[0]), "%s", qn);
    for (size_t i = 0; i < an; i++) {
        if (read_name(msg, len, &off, true, owner) < 0 || off + 10 > len)
            return -EINVAL;
        uint16_t type = rd16(msg + off), klass = rd16(msg + off + 2);
        uint32_t ttl = rd32(msg + off + 4);
        size_t rdlen = rd16(msg + off + 8);
        off += 10;
        if (off + rdlen > len)
            return -EINVAL;
        bool ours = false;
        for (size_t c = 0; c < n_chain; c++)
            ours = ours || strcmp(owner, chain[c]) == 0;
        if (klass == SP_DNS_CLASS_IN && ours) {
            if (type == SP_DNS_TYPE_A) {
                if (rdlen != 4)
                    return -EINVAL;
                if (n < max) {
                    memcpy(&out[n].addr_be, msg + off, 4);
                    out[n].ttl = ttl > 0x7fffffffu ? 0 : ttl; /* RFC 2181 8 */
                    n++;
                }
            } else if (type == SP_DNS_TYPE_CNAME && n_chain <= CNAME_CHAIN) {
                size_t roff = off;
                if (read_name(msg, off + rdlen, &roff, true, chain[n_chain]) < 0 ||
                    roff != off + rdlen)
                    return -EINVAL;
                n_chain++;
            }
        }
        off += rdlen;
    }
    *ret_n = n;
    *ret_rcode = flags & 0xf;
    return 0;
}

size_t sp_dns_build_response(uint8_t *buf, size_t cap, const sp_dns_query_t *q, int rcode,
                             const sp_dns_a_t *a, size_t n, uint32_t ttl_cap)
{
    if (cap < HDR_LEN)
        return 0;
    memset(buf, 0, HDR_LEN);
    wr16(buf, q->id);
    wr16(buf + 2, (uint16_t)(0x8000 | (q->rd ? 0x0100 : 0) | 0x0080 | (rcode & 0xf)));
    wr16(buf + 4, 1);
    size_t off = put_name(buf, cap, HDR_LEN, q->name);
    if (off == 0 || off + 4 > cap)
        return 0;
    wr16(buf + off, q->qtype);
    wr16(buf + off + 2, q->qclass);
    off += 4;
    uint16_t an = 0;
    if (q->qtype == SP_DNS_TYPE_A && rcode == SP_DNS_NOERROR) {
        for (size_t i = 0; i < n; i++) {
            if (off + 16 > cap)
                break;
            wr16(buf + off, 0xc000 | HDR_LEN); /* the question's name */
            wr16(buf + off + 2, SP_DNS_TYPE_A);
            wr16(buf + off + 4, SP_DNS_CLASS_IN);
            uint32_t ttl = a[i].ttl < ttl_cap ? a[i].ttl : ttl_cap;
            buf[off + 6] = (uint8_t)(ttl >> 24);
            buf[off + 7] = (uint8_t)(ttl >> 16);
            buf[off + 8] = (uint8_t)(ttl >> 8);
            buf[off + 9] = (uint8_t)ttl;
            wr16(buf + off + 10, 4);
            memcpy(buf + off + 12, &a[i].addr_be, 4);
            off += 16;
            an++;
        }
    }
    wr16(buf + 6, an);
    return off;
}
