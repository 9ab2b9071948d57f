/* space-bench: latency and throughput harness (bench/README.md). */
#ifndef SPACE_BENCH_H
#define SPACE_BENCH_H

#include <libpq-fe.h>
#include <stddef.h>

#include "bus.h"

typedef struct {
    sp_bus_t *bus;
    PGconn *db;
    unsigned runs;
    size_t events;
    unsigned rate;
    unsigned seconds;
    /* create */
    size_t creates;
    size_t execs;
    const char *home; /* SPACE_HOME: the worker's template rootfs for the baseline */
    char api_host[64];
    int api_port;
    const char *api_key;
} bench_ctx_t;

/* p-th percentile (nearest rank) of v; sorts v in place. */
double bench_pct(double *v, size_t n, double p);

int bench_eventlog(bench_ctx_t *c);
int bench_create(bench_ctx_t *c);
int bench_exec(bench_ctx_t *c);

#endif
