/* Per-sandbox bandwidth (docs/egress.md): one token bucket each way, shared by all the
 * sandbox's connections. The proxy takes what it has read from the bucket after each read; a
 * bucket in debt stops reading on that socket (uv_read_stop) until the debt is paid, so what a
 * limited sandbox sends or receives waits in the kernel's socket buffers and in TCP's window,
 * never in egressd's memory. */
#include "egressd.h"

/* The bucket holds at most this many seconds of traffic: a connection that was quiet may
 * burst this much, and then runs at the rate. */
#define BURST_S 0.125
/* But never less than a read (egressd_proxy.c reads 64 KiB at most): a bucket smaller than
 * one read would be in debt after each. */
#define BURST_MIN 65536.0

uint64_t eg_rate_of(const eg_t *eg, const eg_sbx_t *s, int dir)
{
    if (s->rate[dir])
        return s->rate[dir];
    return (uint64_t)(dir == EG_UP ? eg->cfg->up_bytes_per_s : eg->cfg->down_bytes_per_s);
}

uint64_t eg_bucket_take(eg_bucket_t *b, uint64_t rate, uint64_t now_ns, size_t n)
{
    if (rate == 0) {
        b->at_ns = 0; /* a limit set later starts with a full bucket */
        return 0;
    }
    double burst = (double)rate * BURST_S;
    if (burst < BURST_MIN)
        burst = BURST_MIN;
    if (b->at_ns == 0 || now_ns < b->at_ns)
        b->tokens = burst;
    else
        b->tokens += (double)rate * (double)(now_ns - b->at_ns) / 1e9;
    if (b->tokens > burst)
        b->tokens = burst;
    b->at_ns = now_ns;
    b->tokens -= (double)n;
    if (b->tokens >= 0)
        return 0;
    return (uint64_t)(-b->tokens / (double)rate * 1e9) + 1;
}
