/* DNS messages (RFC 1035) as space-egressd needs them: strict parsing of a guest's query,
 * building the query egressd sends upstream itself, reading A records out of the upstream's
 * answer, and building the answer the guest gets. Every input here is hostile: lengths are
 * checked before every read, compression pointers only in answers and only backwards, with a
 * bounded number of jumps; nothing is ever read past len.
 *
 * Names are returned as text: labels joined by '.', no trailing dot, lowercase (DNS names
 * compare case-insensitively, RFC 4343), and only letters, digits, '-' and '_' in labels: any
 * other byte makes the message invalid (egressd never resolves what it cannot print). */
#ifndef SPACE_DNS_H
#define SPACE_DNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SP_DNS_MSG_MAX    512 /* UDP without EDNS (RFC 1035 4.2.1): all egressd speaks */
#define SP_DNS_TYPE_A     1
#define SP_DNS_TYPE_CNAME 5
#define SP_DNS_TYPE_AAAA  28
#define SP_DNS_CLASS_IN   1

enum {
    SP_DNS_NOERROR = 0,
    SP_DNS_FORMERR = 1,
    SP_DNS_SERVFAIL = 2,
    SP_DNS_NXDOMAIN = 3,
    SP_DNS_NOTIMP = 4,
    SP_DNS_REFUSED = 5,
};

typedef struct {
    uint16_t id;
    bool rd; /* recursion desired */
    uint16_t qtype, qclass;
    char name[254]; /* lowercase text form */
} sp_dns_query_t;

/* A standard query: QR=0, opcode 0, one question, no answer or authority records, at most
 * one additional record (an EDNS OPT, ignored), nothing after it. 0, or -EINVAL (answer
 * FORMERR when at least the 12-byte header was there: sp_dns_header_id). */
int sp_dns_parse_query(const uint8_t *msg, size_t len, sp_dns_query_t *ret);
/* The id of a message with at least a header; -1 if shorter. */
int sp_dns_header_id(const uint8_t *msg, size_t len);

typedef struct {
    uint32_t addr_be; /* network order */
    uint32_t ttl;
} sp_dns_a_t;

/* Reads the upstream's answer to the query (id, name) built by sp_dns_build_query: it must
 * be a response with that id and exactly that question; A records are taken from the answer
 * section when their owner is the name or a CNAME target reached from it (chain of at most 8).
 * *ret_rcode gets the response code; at most max records go to out. 0 or -EINVAL. */
int sp_dns_parse_response(const uint8_t *msg, size_t len, uint16_t id, const char *name,
                          sp_dns_a_t *out, size_t max, size_t *ret_n, int *ret_rcode);

/* A recursive query for name/qtype (no EDNS). Returns the length, or 0 if cap is too small or
 * the name is not a valid text name. */
size_t sp_dns_build_query(uint8_t *buf, size_t cap, uint16_t id, const char *name, uint16_t qtype);

/* The answer to q: rcode, and the A records (owner = q's name, TTL capped at ttl_cap) when q
 * asked for A. Returns the length, or 0 if it does not fit in cap. */
size_t sp_dns_build_response(uint8_t *buf, size_t cap, const sp_dns_query_t *q, int rcode,
                             const sp_dns_a_t *a, size_t n, uint32_t ttl_cap);

#endif
