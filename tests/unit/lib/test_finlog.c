/* Telling a crossed close from a clean one by the FIN segments (lib/finlog.c): packets built
 * byte by byte as the worker's nftables log them (IPv4 header on, headers only). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <string.h>

#include "finlog.h"

#define PROXY 15001
#define GUEST 0x0ac80002u /* 10.200.0.2 */
#define GW    0x0ac80001u /* 10.200.0.1 */

enum { FIN = 0x01, SYN = 0x02, RST = 0x04, ACK = 0x10 };

/* One IPv4/TCP segment's headers; total length counts payload bytes not copied (snaplen). */
static size_t segment(uint8_t *p, bool to_guest, uint16_t guest_port, uint32_t seq, uint32_t ack,
                      uint8_t flags, uint16_t payload)
{
    memset(p, 0, 40);
    p[0] = 0x45;
    uint16_t total = htons((uint16_t)(40 + payload));
    memcpy(p + 2, &total, 2);
    p[8] = 64;
    p[9] = 6;
    uint32_t src = htonl(to_guest ? GW : GUEST), dst = htonl(to_guest ? GUEST : GW);
    memcpy(p + 12, &src, 4);
    memcpy(p + 16, &dst, 4);
    uint16_t sp = htons(to_guest ? PROXY : guest_port), dp = htons(to_guest ? guest_port : PROXY);
    memcpy(p + 20, &sp, 2);
    memcpy(p + 22, &dp, 2);
    uint32_t s = htonl(seq), a = htonl(ack);
    memcpy(p + 24, &s, 4);
    memcpy(p + 28, &a, 4);
    p[32] = 5 << 4;
    p[33] = flags;
    return 40;
}

static sp_finlog_verdict_t feed(sp_finlog_t *f, bool to_guest, uint16_t port, uint32_t seq,
                                uint32_t ack, uint8_t flags, uint16_t payload, int64_t now)
{
    uint8_t p[64];
    size_t n = segment(p, to_guest, port, seq, ack, flags, payload);
    uint32_t addr = 0;
    sp_finlog_verdict_t v = sp_finlog_packet(f, p, n, to_guest, PROXY, now, &addr);
    if (v != SP_FINLOG_IGNORED)
        assert_int_equal(addr, htonl(GUEST));
    return v;
}

/* Our FIN (seq 1000 after 5 payload bytes: it is sequence 1005), then the guest's. */
static void test_guest_had_our_fin(void **state)
{
    sp_finlog_t *f = sp_finlog_new();
    assert_int_equal(feed(f, true, 40000, 1000, 7000, FIN | ACK, 5, 0), SP_FINLOG_IGNORED);
    assert_int_equal(sp_finlog_pending(f), 1);
    /* It acknowledges 1006: it had our FIN. */
    assert_int_equal(feed(f, false, 40000, 7000, 1006, FIN | ACK, 0, 1), SP_FINLOG_CLEAN);
    assert_int_equal(sp_finlog_pending(f), 0);
    sp_finlog_free(f);
}

static void test_crossed(void **state)
{
    sp_finlog_t *f = sp_finlog_new();
    /* The guest's FIN acknowledges our data but not our FIN (1005). */
    assert_int_equal(feed(f, true, 40001, 1000, 7000, FIN | ACK, 5, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, false, 40001, 7000, 1005, FIN | ACK, 0, 1), SP_FINLOG_CROSSED);
    /* The same, logged in the other order (the guest's FIN reached the log first). */
    assert_int_equal(feed(f, false, 40002, 7000, 1005, FIN | ACK, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, true, 40002, 1000, 7000, FIN | ACK, 5, 1), SP_FINLOG_CROSSED);
    /* Only the first FIN of the guest counts: its retransmission acknowledging ours changes
     * nothing (the guest closed first all the same). */
    assert_int_equal(feed(f, false, 40003, 7000, 1005, FIN | ACK, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, false, 40003, 7000, 1006, FIN | ACK, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, true, 40003, 1000, 7001, FIN | ACK, 5, 1), SP_FINLOG_CROSSED);
    /* Sequence numbers wrap. */
    assert_int_equal(feed(f, true, 40004, 0xfffffffeu, 7000, FIN | ACK, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, false, 40004, 7000, 0xffffffffu, FIN | ACK, 0, 0), SP_FINLOG_CLEAN);
    assert_int_equal(feed(f, true, 40005, 0xfffffffeu, 7000, FIN | ACK, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, false, 40005, 7000, 0xfffffffeu, FIN | ACK, 0, 0), SP_FINLOG_CROSSED);
    assert_int_equal(sp_finlog_pending(f), 0);
    sp_finlog_free(f);
}

/* The guest closed first and our RST ended it: nothing stays, and a new connection on the same
 * port starts afresh. */
static void test_reset_and_reuse(void **state)
{
    sp_finlog_t *f = sp_finlog_new();
    assert_int_equal(feed(f, false, 40010, 7000, 1000, FIN | ACK, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, true, 40010, 1000, 7001, RST | ACK, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(sp_finlog_pending(f), 0);
    /* Guest FIN of an earlier connection left behind, then the pair is reused. */
    assert_int_equal(feed(f, false, 40011, 7000, 1000, FIN | ACK, 0, 0), SP_FINLOG_IGNORED);
    sp_finlog_forget(f, htonl(GUEST), htons(40011));
    assert_int_equal(feed(f, true, 40011, 5000, 100, FIN | ACK, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, false, 40011, 100, 5001, FIN | ACK, 0, 0), SP_FINLOG_CLEAN);
    sp_finlog_free(f);
}

/* What is not a FIN of the proxy's port, or cannot be read, changes nothing. */
static void test_ignored(void **state)
{
    sp_finlog_t *f = sp_finlog_new();
    uint8_t p[64];
    uint32_t addr = 0;
    size_t n = segment(p, false, 40020, 7000, 1000, FIN | ACK, 0);
    assert_int_equal(sp_finlog_packet(f, p, n, false, PROXY + 1, 0, &addr), SP_FINLOG_IGNORED);
    assert_int_equal(sp_finlog_packet(f, p, 39, false, PROXY, 0, &addr), SP_FINLOG_IGNORED);
    p[32] = 4 << 4; /* data offset below 20 bytes */
    assert_int_equal(sp_finlog_packet(f, p, n, false, PROXY, 0, &addr), SP_FINLOG_IGNORED);
    n = segment(p, false, 40020, 7000, 1000, FIN | ACK, 0);
    p[6] = 0x00, p[7] = 0x10; /* a later fragment */
    assert_int_equal(sp_finlog_packet(f, p, n, false, PROXY, 0, &addr), SP_FINLOG_IGNORED);
    n = segment(p, false, 40020, 7000, 1000, FIN | ACK, 0);
    p[9] = 17; /* UDP */
    assert_int_equal(sp_finlog_packet(f, p, n, false, PROXY, 0, &addr), SP_FINLOG_IGNORED);
    (void)segment(p, false, 40020, 7000, 1000, FIN | ACK, 0);
    p[0] = 0x46; /* an IP option announced that the copy does not hold */
    assert_int_equal(sp_finlog_packet(f, p, 40, false, PROXY, 0, &addr), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, false, 40020, 7000, 1000, ACK, 3, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, false, 40020, 7000, 1000, RST, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(feed(f, true, 40020, 7000, 1000, SYN | FIN, 0, 0), SP_FINLOG_IGNORED);
    assert_int_equal(sp_finlog_pending(f), 0);
    sp_finlog_free(f);
}

/* Half-seen closes are forgotten after the guest's TIME_WAIT, and the table grows, shrinks and
 * keeps finding what it holds through many removals (backward-shift deletion). */
static void test_expiry_and_churn(void **state)
{
    sp_finlog_t *f = sp_finlog_new();
    for (uint16_t p = 1; p <= 20000; p++)
        assert_int_equal(feed(f, true, p, 1000, 1, FIN | ACK, 0, p % 2 ? 0 : 30000),
                         SP_FINLOG_IGNORED);
    assert_int_equal(sp_finlog_pending(f), 20000);
    sp_finlog_expire(f, SP_FINLOG_TIME_WAIT_MS + 10000);
    assert_int_equal(sp_finlog_pending(f), 10000); /* those seen at 0 are gone */
    for (uint16_t p = 2; p <= 20000; p += 2)
        assert_int_equal(feed(f, false, p, 1, p % 4 ? 1001 : 1000, FIN | ACK, 0, 40000),
                         p % 4 ? SP_FINLOG_CLEAN : SP_FINLOG_CROSSED);
    assert_int_equal(sp_finlog_pending(f), 0);
    /* An odd port's our-FIN was forgotten: its guest FIN waits alone now. */
    assert_int_equal(feed(f, false, 1, 1, 1001, FIN | ACK, 0, 40000), SP_FINLOG_IGNORED);
    assert_int_equal(sp_finlog_pending(f), 1);
    sp_finlog_free(f);
}

/* A full table cannot wait for the other FIN: the close counts as crossed (conservative). */
static void test_full(void **state)
{
    sp_finlog_t *f = sp_finlog_new();
    uint8_t p[64];
    uint32_t addr = 0;
    for (uint32_t i = 0; i < SP_FINLOG_MAX; i++) {
        size_t n = segment(p, true, (uint16_t)(i % 60000 + 1), 1000, 1, FIN | ACK, 0);
        uint32_t dst = htonl(GUEST + (i / 60000) * 4); /* more guests past 60,000 ports */
        memcpy(p + 16, &dst, 4);
        assert_int_equal(sp_finlog_packet(f, p, n, true, PROXY, 0, &addr), SP_FINLOG_IGNORED);
    }
    assert_int_equal(sp_finlog_pending(f), SP_FINLOG_MAX);
    assert_int_equal(feed(f, false, 65535, 7000, 1000, FIN | ACK, 0, 0), SP_FINLOG_CROSSED);
    assert_int_equal(sp_finlog_pending(f), SP_FINLOG_MAX);
    sp_finlog_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guest_had_our_fin), cmocka_unit_test(test_crossed),
        cmocka_unit_test(test_reset_and_reuse),   cmocka_unit_test(test_ignored),
        cmocka_unit_test(test_expiry_and_churn),  cmocka_unit_test(test_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
