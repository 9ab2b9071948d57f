/* Which sandbox TCP closes leave the guest in TIME_WAIT, from the FIN segments (finlog.h).
 *
 * One table entry per connection with one FIN seen so far, keyed by the guest's address and
 * port: open addressing with linear probing and backward-shift deletion (no tombstones, so a
 * busy host's churn never degrades the probes). It is grown by doubling up to SP_FINLOG_MAX
 * entries at half load; expiry scans it (egressd calls that once a second). */
#include <stdlib.h>
#include <string.h>

#include "finlog.h"
#include "xmalloc.h"

#define HAVE_OURS  1u
#define HAVE_GUEST 2u

typedef struct {
    uint64_t key;         /* addr_be << 16 | port_be, +1 (0: an empty slot) */
    uint32_t our_fin_end; /* the sequence number after our FIN */
    uint32_t guest_ack;   /* the acknowledgement number of the guest's first FIN */
    uint8_t have;
    uint8_t guest_acked; /* the guest's FIN had the ACK flag */
    int64_t at_ms;       /* when the first FIN was seen */
} entry_t;

struct sp_finlog {
    entry_t *slot;
    size_t cap; /* a power of two */
    size_t n;
};

sp_finlog_t *sp_finlog_new(void)
{
    sp_finlog_t *f = sp_xcalloc(1, sizeof(*f));
    f->cap = 256;
    f->slot = sp_xcalloc(f->cap, sizeof(entry_t));
    return f;
}

void sp_finlog_free(sp_finlog_t *f)
{
    if (!f)
        return;
    free(f->slot);
    free(f);
}

size_t sp_finlog_pending(const sp_finlog_t *f)
{
    return f->n;
}

static uint64_t key_of(uint32_t addr_be, uint16_t port_be)
{
    return (((uint64_t)addr_be << 16) | port_be) + 1;
}

static size_t home_of(const sp_finlog_t *f, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & (f->cap - 1);
}

static entry_t *find(sp_finlog_t *f, uint64_t key)
{
    for (size_t i = home_of(f, key);; i = (i + 1) & (f->cap - 1)) {
        if (f->slot[i].key == key)
            return &f->slot[i];
        if (f->slot[i].key == 0)
            return NULL;
    }
}

/* Backward-shift deletion: later entries of the run move into the hole when their home allows. */
static void remove_at(sp_finlog_t *f, entry_t *e)
{
    size_t mask = f->cap - 1, hole = (size_t)(e - f->slot);
    for (size_t j = (hole + 1) & mask; f->slot[j].key != 0; j = (j + 1) & mask) {
        size_t home = home_of(f, f->slot[j].key);
        /* j's entry may fill the hole if its home is not in (hole, j] (cyclically). */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            f->slot[hole] = f->slot[j];
            hole = j;
        }
    }
    memset(&f->slot[hole], 0, sizeof(entry_t));
    f->n--;
}

static void put(sp_finlog_t *f, const entry_t *e)
{
    size_t i = home_of(f, e->key);
    while (f->slot[i].key != 0)
        i = (i + 1) & (f->cap - 1);
    f->slot[i] = *e;
    f->n++;
}

static void grow(sp_finlog_t *f)
{
    entry_t *old = f->slot;
    size_t old_cap = f->cap;
    f->cap *= 2;
    f->slot = sp_xcalloc(f->cap, sizeof(entry_t));
    f->n = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key != 0)
            put(f, &old[i]);
    free(old);
}

void sp_finlog_forget(sp_finlog_t *f, uint32_t addr_be, uint16_t port_be)
{
    entry_t *e = find(f, key_of(addr_be, port_be));
    if (e)
        remove_at(f, e);
}

void sp_finlog_expire(sp_finlog_t *f, int64_t now_ms)
{
    /* Removing shifts later entries back, possibly into slots already passed: look at a slot
     * again until what is there stays. */
    for (size_t i = 0; i < f->cap; i++) {
        while (f->slot[i].key != 0 && now_ms - f->slot[i].at_ms > SP_FINLOG_TIME_WAIT_MS)
            remove_at(f, &f->slot[i]);
    }
}

static uint16_t be16_at(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t be32_at(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

sp_finlog_verdict_t sp_finlog_packet(sp_finlog_t *f, const uint8_t *pkt, size_t len, bool to_guest,
                                     uint16_t proxy_port, int64_t now_ms, uint32_t *guest_addr_be)
{
    if (len < 20 || (pkt[0] >> 4) != 4 || pkt[9] != 6)
        return SP_FINLOG_IGNORED;
    size_t ihl = (size_t)(pkt[0] & 0x0f) * 4, total = be16_at(pkt + 2);
    if (ihl < 20 || total < ihl || len < ihl + 20 || (be16_at(pkt + 6) & 0x1fff) != 0)
        return SP_FINLOG_IGNORED; /* a fragment after the first has no TCP header */
    const uint8_t *tcp = pkt + ihl;
    size_t doff = (size_t)(tcp[12] >> 4) * 4;
    uint8_t flags = tcp[13];
    bool reset = to_guest && (flags & TCP_RST);
    if (doff < 20 || total < ihl + doff || (flags & TCP_SYN) || (!(flags & TCP_FIN) && !reset))
        return SP_FINLOG_IGNORED;
    uint16_t sport = be16_at(tcp), dport = be16_at(tcp + 2);
    if ((to_guest ? sport : dport) != proxy_port)
        return SP_FINLOG_IGNORED;
    uint32_t addr_be, saddr_be, daddr_be;
    memcpy(&saddr_be, pkt + 12, 4);
    memcpy(&daddr_be, pkt + 16, 4);
    addr_be = to_guest ? daddr_be : saddr_be;
    uint16_t port_be;
    memcpy(&port_be, to_guest ? tcp + 2 : tcp, 2);

    uint64_t key = key_of(addr_be, port_be);
    entry_t *e = find(f, key);
    if (reset) {
        /* Our RST ends whatever the guest's endpoint was in, TIME_WAIT aside, and TIME_WAIT
         * needs both FINs, which would have decided already. */
        if (e)
            remove_at(f, e);
        return SP_FINLOG_IGNORED;
    }
    if (!e) {
        if (f->n >= SP_FINLOG_MAX) {
            /* No room to wait for the other FIN: take the close as crossed. */
            *guest_addr_be = addr_be;
            return SP_FINLOG_CROSSED;
        }
        if (f->n + 1 > f->cap / 2)
            grow(f);
        entry_t fresh = {.key = key, .at_ms = now_ms};
        put(f, &fresh);
        e = find(f, key);
    }
    /* Only the first FIN of each side counts: a retransmission of the guest's may acknowledge
     * ours by then, although the guest closed first. */
    if (to_guest && !(e->have & HAVE_OURS)) {
        e->our_fin_end = be32_at(tcp + 4) + (uint32_t)(total - ihl - doff) + 1;
        e->have |= HAVE_OURS;
    } else if (!to_guest && !(e->have & HAVE_GUEST)) {
        e->guest_ack = be32_at(tcp + 8);
        e->guest_acked = (flags & TCP_ACK) != 0;
        e->have |= HAVE_GUEST;
    }
    if (e->have != (HAVE_OURS | HAVE_GUEST))
        return SP_FINLOG_IGNORED;
    bool clean = e->guest_acked && (int32_t)(e->guest_ack - e->our_fin_end) >= 0;
    remove_at(f, e);
    *guest_addr_be = addr_be;
    return clean ? SP_FINLOG_CLEAN : SP_FINLOG_CROSSED;
}
