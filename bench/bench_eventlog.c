/* space-bench eventlog: how fast the event log persists, against baselines run side by side.
 *
 * Throughput: publish N events as fast as JetStream acks them, time from the first publish
 * until space-eventlog has committed the last one. Side by side, in the same run and on the
 * same stack:
 *   - "jetstream publish only": the time to publish and get every ack (the bus alone; the log
 *     cannot beat it),
 *   - "insert per event": the same event bytes stored one autocommit INSERT per event into a
 *     scratch table (the obvious design without batching, chain or projections).
 * Latency: publish at a fixed rate (1,000 events/s by default) and read, per stored row, the
 * time from the stream accepting the message (published_at, JetStream's timestamp) to the row
 * being written (stored_at, clock_timestamp() inside the storing transaction; its commit
 * follows within the same batch). Both clocks are this machine's.
 *
 * Every number is a distribution over several runs (p50/p90/p99 and the spread), printed as a
 * table and as one JSON line for machines. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "db.h"
#include "error.h"
#include "eventgen.h"
#include "ids.h"
#include "xmalloc.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_pct(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    /* Nearest rank (the value at or above the p-th percent of the sample). */
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return v[k == 0 ? 0 : k - 1];
}

/* Builds n distinct valid events: n/5 sandbox lifecycles, each a fresh sandbox id. */
static sp_eventgen_msg_t *make_events(size_t n, unsigned run)
{
    sp_eventgen_msg_t *m = sp_xcalloc(n, sizeof(*m));
    for (size_t i = 0; i < n; i++) {
        char sbx[48];
        snprintf(sbx, sizeof(sbx), "sbx_bench%u_%06zu", run, i / 5);
        if (sp_eventgen_sandbox(sp_eventgen_lifecycle[i % 5], "bench", sbx, "w1", &m[i]) < 0) {
            fprintf(stderr, "space-bench: cannot build event %zu\n", i);
            exit(1);
        }
    }
    return m;
}

static void free_events(sp_eventgen_msg_t *m, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sp_eventgen_msg_dispose(&m[i]);
    free(m);
}

static long long scalar(PGconn *db, const char *sql)
{
    PGresult *r = PQexec(db, sql);
    long long v = -1;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

/* Waits until the log's head reaches seq; returns the monotonic time it was seen (ns) or -1. */
static int64_t wait_stored(PGconn *db, uint64_t seq, int timeout_s)
{
    int64_t deadline = sp_mono_ns() + (int64_t)timeout_s * 1000000000LL;
    while (sp_mono_ns() < deadline) {
        long long head = scalar(db, "SELECT max(stream_seq) FROM events");
        if (head >= (long long)seq)
            return sp_mono_ns();
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    return -1;
}

static int publish_all(sp_bus_t *bus, sp_eventgen_msg_t *m, size_t n, uint64_t *ret_last)
{
    for (size_t i = 0; i < n; i++)
        if (sp_bus_publish_async(bus, m[i].subject, m[i].data, m[i].len, m[i].event_id) < 0)
            return -1;
    if (sp_bus_publish_async_complete(bus, 60000) != 0)
        return -1;
    uint64_t last = 0, msgs = 0;
    if (sp_bus_stream_info(bus, &last, &msgs) < 0)
        return -1;
    *ret_last = last;
    return 0;
}

static double run_eventlog(bench_ctx_t *c, size_t n, unsigned run, double *ret_publish_eps)
{
    sp_eventgen_msg_t *m = make_events(n, run);
    uint64_t last = 0;
    int64_t t0 = sp_mono_ns();
    if (publish_all(c->bus, m, n, &last) < 0) {
        fprintf(stderr, "space-bench: publish failed\n");
        exit(1);
    }
    int64_t t_pub = sp_mono_ns();
    int64_t t_end = wait_stored(c->db, last, 300);
    free_events(m, n);
    if (t_end < 0) {
        fprintf(stderr, "space-bench: the event log did not catch up within 300 s\n");
        exit(1);
    }
    *ret_publish_eps = (double)n / ((double)(t_pub - t0) / 1e9);
    return (double)n / ((double)(t_end - t0) / 1e9);
}

static double run_insert_baseline(bench_ctx_t *c, size_t n, unsigned run)
{
    sp_eventgen_msg_t *m = make_events(n, run + 1000);
    PQclear(PQexec(c->db, "CREATE TABLE IF NOT EXISTS bench_naive (id uuid PRIMARY KEY, "
                          "subject text NOT NULL, payload bytea NOT NULL)"));
    PQclear(PQexec(c->db, "TRUNCATE bench_naive"));
    int64_t t0 = sp_mono_ns();
    for (size_t i = 0; i < n; i++) {
        const char *params[3] = {m[i].event_id, m[i].subject, (const char *)m[i].data};
        int lens[3] = {0, 0, (int)m[i].len};
        int fmts[3] = {0, 0, 1};
        PGresult *r = PQexecParams(c->db,
                                   "INSERT INTO bench_naive (id, subject, payload) VALUES "
                                   "($1, $2, $3)",
                                   3, NULL, params, lens, fmts, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            fprintf(stderr, "space-bench: baseline insert failed: %s", PQerrorMessage(c->db));
            exit(1);
        }
        PQclear(r);
    }
    int64_t t1 = sp_mono_ns();
    PQclear(PQexec(c->db, "DROP TABLE bench_naive"));
    free_events(m, n);
    return (double)n / ((double)(t1 - t0) / 1e9);
}

/* Publishes at rate events/s for seconds, then reads the per-row lag from the log. */
static size_t run_latency(bench_ctx_t *c, unsigned rate, unsigned seconds, unsigned run,
                          double **ret_ms)
{
    size_t n = (size_t)rate * seconds;
    sp_eventgen_msg_t *m = make_events(n, run + 2000);
    uint64_t first = 0, msgs = 0, last = 0;
    sp_bus_stream_info(c->bus, &first, &msgs);
    int64_t period = 1000000000LL / rate;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (size_t i = 0; i < n; i++) {
        if (sp_bus_publish_async(c->bus, m[i].subject, m[i].data, m[i].len, m[i].event_id) < 0) {
            fprintf(stderr, "space-bench: publish failed\n");
            exit(1);
        }
        next.tv_nsec += period;
        while (next.tv_nsec >= 1000000000L) {
            next.tv_nsec -= 1000000000L;
            next.tv_sec++;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
    if (sp_bus_publish_async_complete(c->bus, 60000) != 0 ||
        sp_bus_stream_info(c->bus, &last, &msgs) < 0 || wait_stored(c->db, last, 300) < 0) {
        fprintf(stderr, "space-bench: latency run did not complete\n");
        exit(1);
    }
    free_events(m, n);

    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT extract(epoch from (stored_at - published_at)) * 1000 FROM events "
             "WHERE stream_seq > %" PRIu64 " AND stream_seq <= %" PRIu64,
             first, last);
    PGresult *r = PQexec(c->db, sql);
    size_t rows = (size_t)PQntuples(r);
    double *ms = sp_xcalloc(rows ? rows : 1, sizeof(double));
    for (size_t i = 0; i < rows; i++)
        ms[i] = strtod(PQgetvalue(r, (int)i, 0), NULL);
    PQclear(r);
    *ret_ms = ms;
    return rows;
}

static void print_row(const char *what, const char *unit, double *v, size_t n, double base)
{
    double p50 = bench_pct(v, n, 50), p90 = bench_pct(v, n, 90), p99 = bench_pct(v, n, 99);
    printf("  %-34s %10.0f %10.0f %10.0f  %-9s", what, p50, p90, p99, unit);
    if (base > 0)
        printf(" x%.2f", p50 / base);
    printf("\n");
}

int bench_eventlog(bench_ctx_t *c)
{
    unsigned runs = c->runs;
    size_t n = c->events;
    double *log_eps = sp_xcalloc(runs, sizeof(double));
    double *pub_eps = sp_xcalloc(runs, sizeof(double));
    double *ins_eps = sp_xcalloc(runs, sizeof(double));
    size_t ins_n = n / 10 > 0 ? n / 10 : 1; /* per-row INSERT is slow: a tenth is enough */

    printf("eventlog throughput: %u runs of %zu events (baseline: %zu per-row inserts)\n", runs, n,
           ins_n);
    for (unsigned r = 0; r < runs; r++) {
        log_eps[r] = run_eventlog(c, n, r, &pub_eps[r]);
        ins_eps[r] = run_insert_baseline(c, ins_n, r);
        printf("  run %u: eventlog %.0f ev/s, publish-only %.0f ev/s, insert-per-event %.0f "
               "ev/s\n",
               r + 1, log_eps[r], pub_eps[r], ins_eps[r]);
    }
    double ins_p50 = bench_pct(ins_eps, runs, 50);
    double pub_p50 = bench_pct(pub_eps, runs, 50);
    double log_p50 = bench_pct(log_eps, runs, 50);
    printf("\n  %-34s %10s %10s %10s  %-9s %s\n", "throughput (over runs)", "p50", "p90", "p99",
           "unit", "vs insert-per-event");
    print_row("space-eventlog (stored, chained)", "ev/s", log_eps, runs, ins_p50);
    print_row("jetstream publish only", "ev/s", pub_eps, runs, ins_p50);
    print_row("insert per event (baseline)", "ev/s", ins_eps, runs, ins_p50);

    double *lat = NULL;
    size_t nl = 0;
    for (unsigned r = 0; r < runs; r++) {
        double *ms = NULL;
        size_t k = run_latency(c, c->rate, c->seconds, r, &ms);
        lat = sp_xreallocarray(lat, nl + k, sizeof(double));
        memcpy(lat + nl, ms, k * sizeof(double));
        nl += k;
        free(ms);
    }
    double l50 = bench_pct(lat, nl, 50), l90 = bench_pct(lat, nl, 90), l99 = bench_pct(lat, nl, 99),
           lmax = nl ? lat[nl - 1] : NAN;
    printf("\n  publish-to-persisted lag at %u ev/s, %zu events: p50 %.2f ms, p90 %.2f ms, "
           "p99 %.2f ms, max %.2f ms\n",
           c->rate, nl, l50, l90, l99, lmax);
    printf("\nJSON {\"bench\":\"eventlog\",\"events_per_run\":%zu,\"runs\":%u,"
           "\"eventlog_eps_p50\":%.0f,\"publish_only_eps_p50\":%.0f,"
           "\"insert_per_event_eps_p50\":%.0f,\"ratio_vs_insert\":%.2f,"
           "\"ratio_vs_publish_only\":%.2f,\"lag_rate\":%u,\"lag_ms_p50\":%.3f,"
           "\"lag_ms_p90\":%.3f,\"lag_ms_p99\":%.3f,\"lag_ms_max\":%.3f}\n",
           n, runs, log_p50, pub_p50, ins_p50, log_p50 / ins_p50, log_p50 / pub_p50, c->rate, l50,
           l90, l99, lmax);
    free(log_eps);
    free(pub_eps);
    free(ins_eps);
    free(lat);
    return 0;
}
