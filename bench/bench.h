/* space-bench: latency and throughput harness (docs/bench.md). */
#ifndef SPACE_BENCH_H
#define SPACE_BENCH_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

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
    size_t sandboxes; /* density */
    const char *home; /* SPACE_HOME: the worker's template rootfs for the baseline */
    /* eventlog, exec: a directory holding another build's daemons to compare with; NULL: none */
    const char *baseline_bin;
    char api_host[64];
    int api_port;
    const char *api_key;
    int timeout_ms; /* of one API request; 0 = httpc's default (120 s) */
} bench_ctx_t;

/* ---- numbers and reports (bench_report.c) ---- */

/* p-th percentile (nearest rank) of v; sorts v in place. NaN when n is 0. */
double bench_pct(double *v, size_t n, double p);

/* One timed operation. op is a static name; error NULL when it succeeded, else a reason that
 * outlives the samples ("status", "state", "exit", or the transport error's text when no
 * answer came). */
typedef struct {
    const char *op;
    size_t iteration;  /* which sandbox's life it belongs to */
    double start_ms;   /* from the run's start: for an open-loop create its scheduled start */
    double latency_ms; /* from start_ms until the answer */
    double queued_ms;  /* of latency_ms: waiting for a free worker after the scheduled start */
    int status;        /* HTTP status, 0 when no answer */
    const char *error;
} bench_sample_t;

typedef struct {
    size_t n, errors;
    double p50, p90, p99, max; /* ms, of the successful ones; NaN when none */
    double rate;               /* operations (all) per second of the run's wall time */
} bench_op_stats_t;

void bench_op_stats(const char *op, const bench_sample_t *s, size_t n, double wall_s,
                    bench_op_stats_t *ret);
/* The table per operation (ops in this order, those without samples left out), then the
 * errors counted per operation, status and reason. */
void bench_report_table(FILE *out, const char *const *ops, size_t n_ops, const bench_sample_t *s,
                        size_t n, double wall_s);
/* {"run": run_json (a JSON object, as given), "wall_s", "summary": {op: {n, errors, p50_ms,
 * p90_ms, p99_ms, max_ms, rate_per_s}}, "samples": [{op, iteration, start_ms, latency_ms,
 * queued_ms, status, error}]} into path; 0, or -1 when it cannot be written. */
int bench_report_json(const char *path, const char *run_json, const char *const *ops, size_t n_ops,
                      const bench_sample_t *s, size_t n, double wall_s);
/* An SVG: per operation with samples a panel of its latency over time (one point per
 * sample, errors as crosses) with the p50/p90/p99 lines; title escaped. 0, or -1. */
int bench_report_svg(const char *path, const char *title, const char *const *ops, size_t n_ops,
                     const bench_sample_t *s, size_t n, double wall_s);

/* space-bench api: drives a deployment over its /v1 API alone (bench_api.c). argv[0] is "api";
 * global_key is --api-key / SPACE_API_KEY of the global options (may be empty). The exit
 * status: 0, 1 (could not run, or sandboxes left), 2 bad usage, 130 interrupted. */
int bench_api(int argc, char **argv, const char *global_key);

int bench_eventlog(bench_ctx_t *c);
int bench_create(bench_ctx_t *c);
int bench_exec(bench_ctx_t *c);
int bench_lifecycle(bench_ctx_t *c);
int bench_fork(bench_ctx_t *c);
int bench_signed(bench_ctx_t *c);
int bench_density(bench_ctx_t *c);
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
/* Stops the stack's daemon name (SIGTERM, waits for it to exit); bench_restart_daemons or
 * `space up` starts it again. */
void bench_stop_daemon(bench_ctx_t *c, const char *name);
/* Stops the stack's daemons names[0..n) (SIGTERM to run/NAME.pid, waiting until each is gone)
 * and starts them again with `space up` (it starts what is not running), from bin_dir's
 * build, or NULL: the stack's own SPACE_BIN_DIR as the bench found it. Sets SPACE_HOME and
 * SPACE_BIN_DIR in the bench's environment. 0, or -1 when space up keeps failing. */
int bench_restart_daemons(bench_ctx_t *c, const char *const *names, size_t n, const char *bin_dir);
/* One table row: name, p50, p90, p99 of v (sorted in place). */
void bench_row(const char *name, double *v, size_t n);
/* utime + stime of pid in clock ticks (0 when it cannot be read); *ret_ppid its parent. */
long long bench_proc_ticks(long pid, long *ret_ppid);
/* The pid in $home/run/<name>.pid, 0 for none. */
long bench_pid_file(const char *home, const char *name);
/* The number in $home/run/<name><suffix> (a pid, a port), 0 for none. */
long bench_run_file(const char *home, const char *name, const char *suffix);
/* The CPU ticks so far of the stack's daemon name (postgres: with its live backends but the
 * one whose pid is except, e.g. the bench's own: PQbackendPID). */
long long bench_daemon_ticks(const char *home, const char *name, long except);

#endif
