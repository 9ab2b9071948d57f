/* Network policy of a sandbox (docs/egress.md): a mode and lists of allow and deny entries.
 * Shared by the gateway (validation of the API body), lib/envelope.c (validation of events)
 * and space-egressd (decisions), so that all three read an entry the same way.
 *
 * Modes: "deny_all" (nothing leaves), "allow_all" (any name or address, deny list still
 * applies), "allowlist" (only what an allow entry matches). Deny wins over allow.
 *
 * Entries (at most SP_NETPOLICY_ENTRIES_MAX per list), each optionally followed by ":port":
 *   "example.com"      exactly this DNS name (lowercase a-z 0-9 '-', labels of 1..63 bytes,
 *                      at most 253 bytes, at least two labels, no trailing dot)
 *   "*.example.com"    any name strictly below example.com (not example.com itself)
 *   "203.0.113.0/24"   IPv4 CIDR (host bits must be zero), or one address "203.0.113.7"
 * Names are matched case-insensitively (DNS is), entries must be written in lowercase.
 */
#ifndef SPACE_NETPOLICY_H
#define SPACE_NETPOLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SP_NETPOLICY_ENTRIES_MAX 256
/* Bandwidth limits of a policy (bytes per second, each way); 0 means "the platform's". */
#define SP_NETPOLICY_RATE_MIN 1024
#define SP_NETPOLICY_RATE_MAX 100000000000LL /* 100 GB/s */
#define SP_DNS_NAME_MAX       253

typedef enum { SP_NET_DENY_ALL = 0, SP_NET_ALLOW_ALL, SP_NET_ALLOWLIST } sp_netmode_t;
typedef enum { SP_NETE_NAME = 0, SP_NETE_WILDCARD, SP_NETE_CIDR } sp_netentry_kind_t;

typedef struct {
    sp_netentry_kind_t kind;
    char name[SP_DNS_NAME_MAX + 1]; /* NAME: the name; WILDCARD: the suffix without "*." */
    uint32_t net, mask;             /* CIDR, host byte order */
    uint16_t port;                  /* 0: any port */
} sp_netentry_t;

/* 0, or -EINVAL for anything else than the three mode names. */
int sp_netmode_parse(const char *s, sp_netmode_t *ret_mode);
const char *sp_netmode_name(sp_netmode_t m);
/* True when v is a policy's bandwidth value: 0, or RATE_MIN..RATE_MAX. */
bool sp_netpolicy_rate_valid(uint64_t v);
/* 0 and *ret, or -EINVAL (the entry is not one of the forms above). */
int sp_netentry_parse(const char *s, sp_netentry_t *ret);
/* True when s is a DNS name as accepted in entries (lowercase or not: case_ok). */
bool sp_dns_name_valid(const char *s, bool case_ok);

/* Does entry e match the name (any case) on port (0 = do not look at ports, as DNS does)? */
bool sp_netentry_match_name(const sp_netentry_t *e, const char *name, uint16_t port);
/* Does entry e (a CIDR) match the IPv4 address (host order) on port? */
bool sp_netentry_match_addr(const sp_netentry_t *e, uint32_t addr, uint16_t port);

#endif
