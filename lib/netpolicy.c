/* Network policy entries (netpolicy.h). Input comes from API clients and from the bus: every
 * form is parsed strictly, with no normalisation beyond what the header says. */
#include "netpolicy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const mode_names[] = {"deny_all", "allow_all", "allowlist"};

int sp_netmode_parse(const char *s, sp_netmode_t *ret_mode)
{
    for (size_t i = 0; i < sizeof(mode_names) / sizeof(mode_names[0]); i++) {
        if (s && strcmp(s, mode_names[i]) == 0) {
            *ret_mode = (sp_netmode_t)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *sp_netmode_name(sp_netmode_t m)
{
    return (unsigned)m < sizeof(mode_names) / sizeof(mode_names[0]) ? mode_names[m] : "invalid";
}

bool sp_dns_name_valid(const char *s, bool case_ok)
{
    size_t len = strlen(s), label = 0, labels = 0;
    if (len == 0 || len > SP_DNS_NAME_MAX)
        return false;
    for (size_t i = 0; i <= len; i++) {
        char c = s[i];
        if (c == '.' || c == '\0') {
            /* RFC 1035 2.3.1 (with RFC 1123 2.1 letting a label start with a digit). */
            if (label == 0 || label > 63 || s[i - 1] == '-')
                return false;
            labels++;
            label = 0;
            continue;
        }
        bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  (case_ok && c >= 'A' && c <= 'Z') || (c == '-' && label > 0) || c == '_';
        if (!ok)
            return false;
        label++;
    }
    /* A top-level label is never all digits (RFC 3696 2): "10.0.0.1" is an address. */
    const char *last = strrchr(s, '.');
    return labels >= 2 && strspn(last + 1, "0123456789") != strlen(last + 1);
}

static int parse_u32(const char *s, size_t len, uint32_t max, uint32_t *ret)
{
    uint32_t v = 0;
    if (len == 0 || len > 5 || (len > 1 && s[0] == '0'))
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        v = v * 10 + (uint32_t)(s[i] - '0');
    }
    if (v > max)
        return -EINVAL;
    *ret = v;
    return 0;
}

static int parse_ipv4(const char *s, size_t len, uint32_t *ret)
{
    uint32_t a = 0;
    int parts = 0;
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && s[i] != '.')
            continue;
        uint32_t v;
        if (parts == 4 || i - start > 3 || parse_u32(s + start, i - start, 255, &v) < 0)
            return -EINVAL;
        a = (a << 8) | v;
        parts++;
        start = i + 1;
    }
    if (parts != 4)
        return -EINVAL;
    *ret = a;
    return 0;
}

int sp_netentry_parse(const char *s, sp_netentry_t *ret)
{
    sp_netentry_t e;
    memset(&e, 0, sizeof(e));
    if (!s)
        return -EINVAL;
    size_t len = strlen(s);
    if (len == 0 || len > SP_DNS_NAME_MAX + 8)
        return -EINVAL;
    const char *colon = strchr(s, ':');
    if (colon) {
        uint32_t p;
        if (strchr(colon + 1, ':') || parse_u32(colon + 1, strlen(colon + 1), 65535, &p) < 0 ||
            p == 0)
            return -EINVAL;
        e.port = (uint16_t)p;
        len = (size_t)(colon - s);
    }
    char host[SP_DNS_NAME_MAX + 8];
    memcpy(host, s, len);
    host[len] = '\0';

    bool digits_dots_slash = strspn(host, "0123456789./") == len;
    if (digits_dots_slash) {
        const char *slash = strchr(host, '/');
        uint32_t prefix = 32;
        size_t alen = slash ? (size_t)(slash - host) : len;
        if (slash && parse_u32(slash + 1, strlen(slash + 1), 32, &prefix) < 0)
            return -EINVAL;
        if (parse_ipv4(host, alen, &e.net) < 0)
            return -EINVAL;
        e.mask = prefix == 0 ? 0 : 0xffffffffu << (32 - prefix);
        if (e.net & ~e.mask)
            return -EINVAL; /* host bits set: almost certainly a mistake */
        e.kind = SP_NETE_CIDR;
    } else if (strncmp(host, "*.", 2) == 0) {
        if (!sp_dns_name_valid(host + 2, false))
            return -EINVAL;
        e.kind = SP_NETE_WILDCARD;
        memcpy(e.name, host + 2, strlen(host + 2) + 1); /* valid: at most 253 bytes */
    } else {
        if (!sp_dns_name_valid(host, false))
            return -EINVAL;
        e.kind = SP_NETE_NAME;
        memcpy(e.name, host, len + 1); /* valid: at most 253 bytes */
    }
    *ret = e;
    return 0;
}

bool sp_netentry_match_name(const sp_netentry_t *e, const char *name, uint16_t port)
{
    if (e->port && port && e->port != port)
        return false;
    if (e->kind == SP_NETE_NAME)
        return strcasecmp(e->name, name) == 0;
    if (e->kind == SP_NETE_WILDCARD) {
        size_t n = strlen(name), k = strlen(e->name);
        return n > k + 1 && name[n - k - 1] == '.' && strcasecmp(name + n - k, e->name) == 0;
    }
    return false;
}

bool sp_netentry_match_addr(const sp_netentry_t *e, uint32_t addr, uint16_t port)
{
    if (e->kind != SP_NETE_CIDR || (e->port && e->port != port))
        return false;
    return (addr & e->mask) == e->net;
}

bool sp_netpolicy_rate_valid(uint64_t v)
{
    return v == 0 || (v >= SP_NETPOLICY_RATE_MIN && v <= (uint64_t)SP_NETPOLICY_RATE_MAX);
}
