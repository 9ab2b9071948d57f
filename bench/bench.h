/* space-bench: latency and throughput harness (bench/README.md). */
#ifndef SPACE_BENCH_H
#define SPACE_BENCH_H

#include <libpq-fe.h>
#include <stddef.h>

#include "bus.h"
#include "httpc.h"

typedef struct {
    sp_bus_t *bus;
    PGconn *db;
    unsigned runs;
    size_t events;
    size_t sign_batch; /* eventlog: most events a producer signs under one root */
    unsigned rate;
    unsigned seconds;
    /* create */
    size_t creates;
    size_t pool_size; /* create: the warm pool of the pooled part */
    size_t execs;
    size_t rounds;    /* lifecycle */
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
int bench_lifecycle(bench_ctx_t *c);
/* CPU cost of signing and verifying envelopes against encode+decode (no stack). */
int bench_sign(bench_ctx_t *c);

/* ---- shared (bench_util.c) ---- */

/* One API request with the bench's key; 0 and the response, or < 0. */
int bench_http(bench_ctx_t *c, const char *method, const char *path, const char *extra,
               const char *body, sp_httpc_resp_t *r);
/* A tiny sandbox through the API; its id into id. */
int bench_create_sandbox(bench_ctx_t *c, char id[80]);
/* A runsc bundle (temp directory, heap path) over rootfs, read-only, running args_json (a JSON
 * array of strings), no network. */
char *bench_make_bundle(const char *rootfs, const char *args_json);
/* Runs argv with stdio on /dev/null; its exit status, or -1. */
int bench_run_quiet(char *const argv[]);
/* One table row: name, p50, p90, p99 of v (sorted in place). */
void bench_row(const char *name, double *v, size_t n);

#endif
