/* Which sandbox TCP closes leave the guest's endpoint in TIME_WAIT, told from the FIN segments
 * themselves (docs/egress.md, "Both ends closing at once").
 *
 * runsc cannot checkpoint a sandbox while its netstack holds an endpoint in TIME_WAIT (gVisor
 * ignores an RST there for a minute, RFC 1337). A guest ends in TIME_WAIT exactly when it is the
 * side that closed first: when its FIN left before our FIN (space-egressd's, the host end of
 * every sandbox connection) reached it. gVisor sets a FIN's acknowledgement number when it sends
 * it, so the first FIN from the guest tells which: if it acknowledges our FIN, the guest had
 * our FIN (it went CLOSE_WAIT, LAST_ACK, CLOSED); if not, the two crossed (or the guest closed
 * first and our FIN followed) and the guest's endpoint goes through CLOSING or FIN_WAIT_2 into
 * TIME_WAIT. No timing is involved, so a busy host neither misses a crossing nor sees a false one.
 *
 * The segments come from the worker's nftables table: every TCP segment with FIN between a
 * sandbox's veth and the proxy port (and every RST from the host) is logged (NFLOG) to the
 * group SP_FINLOG_GROUP(proxy port), the IPv4 packet's headers copied; egressd reads that group
 * (egressd_finlog.c) and feeds the packets here. This module is the pure part: parsing and the
 * per-connection table.
 */
#ifndef SPACE_FINLOG_H
#define SPACE_FINLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The NFLOG group the worker logs FIN segments to, and egressd reads: the proxy port, which
 * already names one egressd on a host (nothing else may bind it). */
#define SP_FINLOG_GROUP(proxy_port) ((uint16_t)(proxy_port))
/* Bytes of each packet copied to the log: the longest IPv4 and TCP headers. */
#define SP_FINLOG_SNAPLEN 120
/* How long a half-seen close is remembered, and how long a guest's endpoint stays in TIME_WAIT
 * (gVisor's tcp.DefaultTCPTimeWaitTimeout, 60 s, plus a margin for the guest's clock). */
#define SP_FINLOG_TIME_WAIT_MS (62 * 1000)
/* Connections with one FIN seen, at most; past that a new one counts as crossed (conservative). */
#define SP_FINLOG_MAX 65536

typedef struct sp_finlog sp_finlog_t;

sp_finlog_t *sp_finlog_new(void);
void sp_finlog_free(sp_finlog_t *f);

/* What one logged segment showed. */
typedef enum {
    SP_FINLOG_IGNORED = 0, /* not an IPv4 TCP FIN of the proxy port, or nothing decided yet */
    SP_FINLOG_CLEAN,       /* both FINs seen: the guest had ours when it sent its own */
    SP_FINLOG_CROSSED,     /* the guest's endpoint is in TIME_WAIT for a minute */
} sp_finlog_verdict_t;

/* One logged IPv4 packet (from its IP header on): a FIN from either side, or an RST from this
 * host (it ends a half-seen close). to_guest: sent by this host (the output hook) rather than
 * received from a guest. proxy_port: the host end's port, in host order. On a verdict
 * other than IGNORED, *guest_addr_be is the guest's address (network order). A packet whose
 * headers are truncated or malformed is IGNORED. */
sp_finlog_verdict_t sp_finlog_packet(sp_finlog_t *f, const uint8_t *pkt, size_t len, bool to_guest,
                                     uint16_t proxy_port, int64_t now_ms, uint32_t *guest_addr_be);

/* A new connection from guest addr:port (network order): whatever an earlier one on the same
 * pair left unfinished is dropped (a guest that closed cleanly may reuse its port at once). */
void sp_finlog_forget(sp_finlog_t *f, uint32_t addr_be, uint16_t port_be);

/* Drops what was seen more than SP_FINLOG_TIME_WAIT_MS before now. */
void sp_finlog_expire(sp_finlog_t *f, int64_t now_ms);

/* Connections with one FIN seen and not yet expired. */
size_t sp_finlog_pending(const sp_finlog_t *f);

#endif
