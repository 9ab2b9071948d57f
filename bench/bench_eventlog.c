/* space-bench eventlog: how fast the event log persists, against baselines run side by side.
 *
 * Throughput: publish N events as fast as JetStream acks them, time from the first publish
 * until space-eventlog has committed the last one. Side by side, in the same run and on the
 * same stack:
 *   - "jetstream publish only": the time to publish and get every ack (the bus alone; the log
 *     cannot beat it),
 *   - "insert per event": the same event bytes stored one autocommit INSERT per event into a
 *     scratch table (the obvious design without batching, chain or projections).
 * Drain (the log's capacity): N events published while the log is stopped, then the log starts
 * and stores the backlog; the rate is taken from the rows' own stored_at, first to last, so
 * neither the publisher nor the log's start shares the window. Each run also reports the
 * longest pause between two consecutive rows: a fetch held by the server shows there
 * (docs/machine-notes.md, "A fetch held to its expiry").
 * Latency: publish at a fixed rate (1,000 events/s by default) and read, per stored row, the
 * time from the stream accepting the message (published_at, JetStream's timestamp) to the row
 * being written (stored_at, clock_timestamp() inside the storing transaction; its commit
 * follows within the same batch). Both clocks are this machine's.
 *
 * Signing (issue 14, docs/trust.md), in the same invocation: the eventlog is restarted with
 * verify-signatures=off for the unsigned runs and =on (a keyring of the bench's own gateway,
 * scheduler and worker-w1 keys under $SPACE_HOME/bench-keyring) for the signed ones, whose
 * events the publisher pre-signs the way bursting producers would: each producer's next
 * --sign-batch events under one Merkle root, and the worst case, every event signed alone.
 * Signing happens before the clock starts (its cost per event is printed apart); verification
 * is inside the measured time. A sixth mode signs the same events as headed batches of
 * SP_SIG_HEADED_DEFAULT (sign.h: one head listing its members' leaves, members carrying only
 * their place and the head's id), the form producers use for the subjects only the log reads
 * (command facts, egress and credential audit, heartbeats); here the lifecycle events take that
 * form too, so that the two signed forms are compared on the same events. The publisher sends
 * every message asynchronously in order on one connection (a head is stored before its
 * members); a real producer also waits for its head's ack, one round trip per batch, on its
 * publishing thread. Each run does all the modes back to back, in an order that
 * rotates from run to run; the ratios to unsigned are given both as the ratio of the p50s and
 * as the p50 of each run's own ratio (the machine's load changes less within a run).
 *
 * Checkpoints (issue 16, docs/audit.md): on in those three modes (the default), and off in a
 * fourth, the batch mode again with checkpoint-events=0 and checkpoint-ms=0, so that the cost
 * of anchoring is the ratio of two modes of the same invocation.
 *
 * Sealed output (issue 16 part 2, docs/audit.md), in the same invocation: CommandOutput events
 * of 1 KiB, as the worker records them, plaintext or redacted and sealed under a data key
 * (AES-256-GCM), each with checkpoints on and off, verify-signatures off: four modes whose
 * ratios to "plaintext, checkpoints off" are what encryption and anchoring cost the log. The
 * producer's redaction and sealing happen before the clock (their cost per event is printed
 * apart), as the worker does them on its own threads.
 *
 * Every number is a distribution over several runs (p50/p90/p99 and the spread), printed as a
 * table and as one JSON line for machines. */
#include <inttypes.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "contract.h"
#include "datakey.h"
#include "db.h"
#include "error.h"
#include "eventgen.h"
#include "ids.h"
#include "sign.h"
#include "xmalloc.h"

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

/* ---- signing modes ---- */

/* Checkpoints (docs/audit.md) are on in every mode but MODE_NOCKPT, the batch mode with them
 * off: its ratio to the batch mode is what the anchoring costs. MODE_BYTES is the batch mode's
 * events (signed, 420 bytes) with verification off: against unsigned it is what the bytes a
 * signed event carries cost, against the batch mode what verifying them costs. */
enum { MODE_OFF, MODE_BATCH, MODE_SINGLE, MODE_NOCKPT, MODE_BYTES, MODE_HEADED, N_MODES };
static const char *const mode_name[N_MODES] = {
    "unsigned, verify off",        "signed, batches",
    "signed, batch of 1",          "signed, batches, no ckpt",
    "signed, batches, verify off", "signed, headed batches"};

typedef struct {
    char dir[4096];
    const char *identity[3];
    sp_sign_key_t *key[3];
} bench_keys_t;

static int keys_make(bench_ctx_t *c, bench_keys_t *k)
{
    static const char *const ids[3] = {"gateway", "scheduler", "worker-w1"};
    snprintf(k->dir, sizeof(k->dir), "%s/bench-keyring", c->home);
    if (mkdir(k->dir, 0700) < 0 && errno != EEXIST)
        return -errno;
    for (int i = 0; i < 3; i++) {
        char *priv = sp_xasprintf("%s/%s.key", k->dir, ids[i]);
        char *pub = sp_xasprintf("%s/%s.pub", k->dir, ids[i]);
        int rc = sp_sign_keygen(priv, pub);
        if (rc == -EEXIST)
            rc = 0;
        if (rc == 0)
            rc = sp_sign_key_load(priv, &k->key[i]);
        free(priv);
        free(pub);
        if (rc < 0)
            return rc;
        k->identity[i] = ids[i];
    }
    return 0;
}

static void keys_free(bench_keys_t *k)
{
    for (int i = 0; i < 3; i++)
        sp_sign_key_free(k->key[i]);
}

/* Which of the three producers emits an event type. */
static int producer_of(sp_event_type_t t)
{
    unsigned who = sp_event_emitters(t);
    if (who & SP_KIND_BIT(SP_KIND_WORKER))
        return 2;
    return (who & SP_KIND_BIT(SP_KIND_GATEWAY)) ? 0 : 1;
}

/* Signs m[0..n) as three producers would: each one's events in publish order, batch at a
 * time, as Merkle batches or headed ones (MODE_HEADED; a lone event is signed alone). Returns
 * the seconds it took. */
static double sign_events(const bench_keys_t *k, sp_eventgen_msg_t *m, size_t n, size_t batch,
                          bool headed)
{
    sp_eventgen_msg_t **pending[3];
    size_t np[3] = {0};
    int64_t t0 = sp_mono_ns();

    for (int p = 0; p < 3; p++)
        pending[p] = sp_xcalloc(batch, sizeof(sp_eventgen_msg_t *));
    for (size_t i = 0; i <= n; i++) {
        for (int p = 0; p < 3; p++) {
            if (np[p] == 0 || (np[p] < batch && i < n))
                continue;
            int rc = headed && np[p] >= 2
                         ? sp_eventgen_sign_headed(pending[p], np[p], k->identity[p], k->key[p])
                         : sp_eventgen_sign(pending[p], np[p], k->identity[p], k->key[p]);
            if (rc < 0) {
                fprintf(stderr, "space-bench: cannot sign\n");
                exit(1);
            }
            np[p] = 0;
        }
        if (i == n)
            break;
        char reason[SP_REASON_MAX];
        sp_envelope_t *e = NULL;
        if (sp_envelope_decode(m[i].data, m[i].len, &e, reason) < 0)
            exit(1);
        int p = producer_of(e->payload_case);
        sp_envelope_free(e);
        pending[p][np[p]++] = &m[i];
    }
    for (int p = 0; p < 3; p++)
        free(pending[p]);
    return (double)(sp_mono_ns() - t0) / 1e9;
}

static long long scalar(PGconn *db, const char *sql);
static int64_t wait_stored(PGconn *db, uint64_t seq, int timeout_s);

/* Restarts the eventlog in $SPACE_HOME with verify-signatures=mode (on/off), the bench's
 * keyring and checkpoints on or off, from the stack's own build or (bin_dir) another one's
 * space-eventlog, and waits until it stores again (one probe event). */
static void restart_eventlog_from(bench_ctx_t *c, const bench_keys_t *k, const char *mode,
                                  bool checkpoints, const char *bin_dir)
{
    static const char *const eventlog[] = {"space-eventlog"};
    setenv("SPACE_VERIFY_SIGNATURES", mode, 1);
    setenv("SPACE_KEYRING_DIR", k->dir, 1);
    if (checkpoints) {
        unsetenv("SPACE_CHECKPOINT_EVENTS");
        unsetenv("SPACE_CHECKPOINT_MS");
    } else {
        setenv("SPACE_CHECKPOINT_EVENTS", "0", 1);
        setenv("SPACE_CHECKPOINT_MS", "0", 1);
    }
    int rc = bench_restart_daemons(c, eventlog, 1, bin_dir);
    sp_eventgen_msg_t probe;
    uint64_t last = 0, msgs = 0;
    if (rc != 0 ||
        sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED, "bench",
                            "sbx_probe", NULL, &probe) < 0 ||
        sp_bus_publish_async(c->bus, probe.subject, probe.data, probe.len, probe.event_id) < 0 ||
        sp_bus_publish_async_complete(c->bus, 30000) != 0 ||
        sp_bus_stream_info(c->bus, &last, &msgs) < 0 || wait_stored(c->db, last, 60) < 0) {
        fprintf(stderr, "space-bench: the eventlog did not come back (verify-signatures=%s)\n",
                mode);
        exit(1);
    }
    sp_eventgen_msg_dispose(&probe);
}

static void restart_eventlog(bench_ctx_t *c, const bench_keys_t *k, const char *mode,
                             bool checkpoints)
{
    restart_eventlog_from(c, k, mode, checkpoints, NULL);
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

/* How a run's events are signed: keys NULL for unsigned. sign_s accumulates the producers'
 * signing time, n_signed the events signed. */
typedef struct {
    const bench_keys_t *keys;
    size_t batch;
    double sign_s;
    size_t n_signed;
    uint64_t rejected;    /* rows of the measured events the log rejected (should be 0) */
    size_t bytes, n_msgs; /* the measured messages' bytes as published (signatures included) */
    bool headed;          /* headed batches (sign.h) instead of Merkle ones */
} signing_t;

static void maybe_sign(signing_t *sg, sp_eventgen_msg_t *m, size_t n)
{
    if (!sg->keys)
        return;
    sg->sign_s += sign_events(sg->keys, m, n, sg->batch, sg->headed);
    sg->n_signed += n;
}

static void count_rejected(bench_ctx_t *c, signing_t *sg, uint64_t first, uint64_t last)
{
    char sql[192];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE status = 'rejected' AND stream_seq > %" PRIu64
             " AND stream_seq <= %" PRIu64,
             first, last);
    long long r = scalar(c->db, sql);
    sg->rejected += r > 0 ? (uint64_t)r : 0;
}

/* The CPU the stack spends on events, per process that handles them (bench_daemon_ticks),
 * without the bench's own PostgreSQL backend (it polls the log's head every millisecond, so
 * its share grows with the run's length): unlike throughput, it hardly moves when other work
 * shares the cores. */
#define CPU_PARTS 3
static const char *const cpu_part[CPU_PARTS] = {"space-eventlog", "postgres", "nats-server"};

static void cpu_ticks(const bench_ctx_t *c, long long t[CPU_PARTS])
{
    for (int i = 0; i < CPU_PARTS; i++)
        t[i] = bench_daemon_ticks(c->home, cpu_part[i], PQbackendPID(c->db));
}

/* One measured run: returns events per second from the first publish to the last stored;
 * *ret_publish_eps the publish rate, ret_cpu_us[i] the microseconds of CPU cpu_part[i] spent
 * per event meanwhile. */
static double run_eventlog(bench_ctx_t *c, size_t n, unsigned run, signing_t *sg,
                           double *ret_publish_eps, double ret_cpu_us[CPU_PARTS])
{
    sp_eventgen_msg_t *m = make_events(n, run);
    uint64_t first = 0, msgs = 0, last = 0;
    long long cpu0[CPU_PARTS], cpu1[CPU_PARTS];
    maybe_sign(sg, m, n);
    for (size_t i = 0; i < n; i++)
        sg->bytes += m[i].len;
    sg->n_msgs += n;
    sp_bus_stream_info(c->bus, &first, &msgs);
    cpu_ticks(c, cpu0);
    int64_t t0 = sp_mono_ns();
    if (publish_all(c->bus, m, n, &last) < 0) {
        fprintf(stderr, "space-bench: publish failed\n");
        exit(1);
    }
    int64_t t_pub = sp_mono_ns();
    int64_t t_end = wait_stored(c->db, last, 300);
    cpu_ticks(c, cpu1);
    double tick_us = 1e6 / (double)sysconf(_SC_CLK_TCK);
    for (int i = 0; i < CPU_PARTS; i++)
        ret_cpu_us[i] = (double)(cpu1[i] - cpu0[i]) * tick_us / (double)n;
    free_events(m, n);
    if (t_end < 0) {
        fprintf(stderr, "space-bench: the event log did not catch up within 300 s\n");
        exit(1);
    }
    count_rejected(c, sg, first, last);
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
                          signing_t *sg, double **ret_ms)
{
    size_t n = (size_t)rate * seconds;
    sp_eventgen_msg_t *m = make_events(n, run + 2000);
    uint64_t first = 0, msgs = 0, last = 0;
    maybe_sign(sg, m, n);
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
    count_rejected(c, sg, first, last);

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

/* ratio: the p50 of this row's per-run ratios to the unsigned run of the same run (< 0: none).
 * Modes of one run ran back to back, so a per-run ratio sees the same machine load. */
static void print_row(const char *what, const char *unit, double *v, size_t n, double base,
                      double ratio)
{
    double p50 = bench_pct(v, n, 50), p90 = bench_pct(v, n, 90), p99 = bench_pct(v, n, 99);
    printf("  %-34s %10.0f %10.0f %10.0f  %-9s", what, p50, p90, p99, unit);
    if (base > 0)
        printf(" x%.2f", p50 / base);
    if (ratio >= 0)
        printf("       x%.2f", ratio);
    printf("\n");
}

/* The p50 over runs of mode's throughput divided by the unsigned one of the same run. */
static double run_ratio_p50(const double *mode, const double *unsigned_eps, unsigned runs)
{
    double *r = sp_xcalloc(runs ? runs : 1, sizeof(double));
    for (unsigned i = 0; i < runs; i++)
        r[i] = mode[i] / unsigned_eps[i];
    double p = bench_pct(r, runs, 50);
    free(r);
    return p;
}

/* The k-th mode of run r. A plain rotation keeps each mode's predecessor the same in every run
 * (the batch mode would always follow the unsigned one, the fastest, and the batch mode
 * without checkpoints always the slowest): the two batch modes, whose ratio is the cost of
 * checkpoints, swap places every run, behind a rotation of the other two. */
static int mode_at(unsigned r, int k)
{
    static const int order[2][N_MODES] = {
        {MODE_OFF, MODE_SINGLE, MODE_BATCH, MODE_HEADED, MODE_BYTES, MODE_NOCKPT},
        {MODE_BYTES, MODE_HEADED, MODE_SINGLE, MODE_OFF, MODE_NOCKPT, MODE_BATCH}};
    return order[r % 2][k];
}

typedef struct {
    double *log_eps, *pub_eps, *lat;
    double *cpu_us[CPU_PARTS + 1]; /* per run: each part's CPU per event, then their sum */
    double *drain_eps;             /* per run: the backlog's drain rate (run_drain) */
    double *drain_pause_ms;        /* per run: the longest pause between two stored rows */
    size_t nl;
    signing_t sg;
} mode_result_t;

/* Runs one mode once and keeps its numbers as run r of *m. */
static void run_mode(bench_ctx_t *c, size_t n, unsigned r, unsigned seed, mode_result_t *m)
{
    double cpu[CPU_PARTS];
    m->log_eps[r] = run_eventlog(c, n, seed, &m->sg, &m->pub_eps[r], cpu);
    m->cpu_us[CPU_PARTS][r] = 0;
    for (int i = 0; i < CPU_PARTS; i++) {
        m->cpu_us[i][r] = cpu[i];
        m->cpu_us[CPU_PARTS][r] += cpu[i];
    }
}

/* The event log's capacity, run r of mode m: n events are published while the log is stopped,
 * then it starts (verify-signatures=verify, checkpoints on or off) and stores the backlog.
 * The rate is from the first measured row's stored_at to the last one's (clock_timestamp() per
 * row): the log's start, its connections and the publishing are outside it, and no publisher
 * shares the cores meanwhile, so what it measures is what each event costs the log's pipeline
 * (fetch, decode, verification, COPY, projections, chain, acks) when it is always behind.
 * bin_dir: another build's event log (NULL: this one's). No CPU per event here: any window
 * /proc can be read around holds the restart (`space up`, the log's start), which cost more
 * than the drain itself; the throughput runs above measure it. */
static void run_drain(bench_ctx_t *c, const bench_keys_t *k, size_t n, unsigned r, unsigned seed,
                      const char *verify, bool checkpoints, const char *bin_dir, mode_result_t *m)
{
    sp_eventgen_msg_t *ev = make_events(n, seed);
    uint64_t first = 0, msgs = 0, last = 0;
    maybe_sign(&m->sg, ev, n);
    bench_stop_daemon(c, "space-eventlog");
    sp_bus_stream_info(c->bus, &first, &msgs);
    if (publish_all(c->bus, ev, n, &last) < 0) {
        fprintf(stderr, "space-bench: publish failed\n");
        exit(1);
    }
    free_events(ev, n);
    restart_eventlog_from(c, k, verify, checkpoints, bin_dir); /* returns once all is stored */
    count_rejected(c, &m->sg, first, last);

    /* And the longest pause between two rows in stream order: a stalled fetch shows here. */
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT count(*), extract(epoch from max(stored_at) - min(stored_at)), "
             "coalesce(max(gap), 0) FROM (SELECT stored_at, extract(epoch from stored_at - "
             "lag(stored_at) OVER (ORDER BY stream_seq)) * 1000 AS gap FROM events "
             "WHERE stream_seq > %" PRIu64 " AND stream_seq <= %" PRIu64 ") x",
             first, last);
    PGresult *res = PQexec(c->db, sql);
    long long rows = 0;
    double secs = 0;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
        rows = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        secs = strtod(PQgetvalue(res, 0, 1), NULL);
        m->drain_pause_ms[r] = strtod(PQgetvalue(res, 0, 2), NULL);
    }
    PQclear(res);
    if (rows != (long long)n || secs <= 0) {
        fprintf(stderr, "space-bench: drain stored %lld of %zu events\n", rows, n);
        exit(1);
    }
    m->drain_eps[r] = (double)(rows - 1) / secs;
}

static void mode_alloc(mode_result_t *m, unsigned runs)
{
    m->log_eps = sp_xcalloc(runs, sizeof(double));
    m->pub_eps = sp_xcalloc(runs, sizeof(double));
    m->drain_eps = sp_xcalloc(runs, sizeof(double));
    m->drain_pause_ms = sp_xcalloc(runs, sizeof(double));
    for (int i = 0; i <= CPU_PARTS; i++)
        m->cpu_us[i] = sp_xcalloc(runs, sizeof(double));
}

static void mode_dispose(mode_result_t *m)
{
    free(m->log_eps);
    free(m->pub_eps);
    free(m->lat);
    free(m->drain_eps);
    free(m->drain_pause_ms);
    for (int i = 0; i <= CPU_PARTS; i++)
        free(m->cpu_us[i]);
}

/* ---- sealed output ---- */

#define OUT_MODES 4
static const char *const out_mode_name[OUT_MODES] = {
    "plaintext, checkpoints off", "plaintext, checkpoints on", "sealed, checkpoints off",
    "sealed, checkpoints on"};

/* n CommandOutput events of 1 KiB each (a secret value in each, redacted first when sealed);
 * *ret_prep_s: the producer's redaction and sealing time. */
static sp_eventgen_msg_t *make_output_events(size_t n, unsigned run, bool sealed,
                                             double *ret_prep_s)
{
    static const char secret[] = "bench-secret-value-0123456789";
    sp_eventgen_msg_t *m = sp_xcalloc(n, sizeof(*m));
    uint8_t chunk[1024];
    for (size_t i = 0; i < sizeof(chunk); i++)
        chunk[i] = (uint8_t)('a' + i % 26);
    memcpy(chunk + 100, secret, sizeof(secret) - 1);
    sp_cred_key_t dk;
    if (sp_datakey_generate(&dk) < 0)
        exit(1);
    char sbx[64], cmd[64];
    snprintf(sbx, sizeof(sbx), "bench-out-%u", run);
    snprintf(cmd, sizeof(cmd), "cmd-%u", run);
    double prep = 0;
    sp_buf_t red;
    sp_buf_init(&red);
    for (size_t i = 0; i < n; i++) {
        int64_t t0 = sp_mono_ns();
        const uint8_t *data = chunk;
        size_t len = sizeof(chunk);
        if (sealed) {
            sp_redactor_t *r = sp_redactor_new();
            (void)sp_redactor_add(r, "API_SECRET", secret, sizeof(secret) - 1);
            sp_buf_reset(&red);
            sp_redactor_feed(r, chunk, sizeof(chunk), &red);
            sp_redactor_flush(r, &red);
            sp_redactor_free(r);
            data = (const uint8_t *)red.data;
            len = red.len;
        }
        if (sp_eventgen_output("bench", sbx, "w1", cmd, (uint64_t)i * sizeof(chunk), data, len,
                               sealed ? &dk : NULL, &m[i]) < 0) {
            fprintf(stderr, "space-bench: cannot make an output event\n");
            exit(1);
        }
        prep += (double)(sp_mono_ns() - t0) / 1e9;
    }
    sp_buf_dispose(&red);
    sp_cred_key_wipe(&dk);
    *ret_prep_s = prep;
    return m;
}

static double run_output(bench_ctx_t *c, size_t n, unsigned run, bool sealed, double *prep_s,
                         uint64_t *rejected)
{
    double prep = 0;
    /* The sandbox the output belongs to exists first (the log refuses output of an unknown
     * one), outside the measured window. */
    char sbx[64];
    snprintf(sbx, sizeof(sbx), "bench-out-%u", run);
    sp_eventgen_msg_t life[3];
    for (int i = 0; i < 3; i++)
        if (sp_eventgen_sandbox(sp_eventgen_lifecycle[i], "bench", sbx, "w1", &life[i]) < 0)
            exit(1);
    uint64_t first = 0, msgs = 0, last = 0;
    if (publish_all(c->bus, life, 3, &last) < 0 || wait_stored(c->db, last, 60) < 0) {
        fprintf(stderr, "space-bench: cannot create the output's sandbox\n");
        exit(1);
    }
    for (int i = 0; i < 3; i++)
        sp_eventgen_msg_dispose(&life[i]);
    sp_eventgen_msg_t *m = make_output_events(n, run, sealed, &prep);
    *prep_s += prep;
    sp_bus_stream_info(c->bus, &first, &msgs);
    int64_t t0 = sp_mono_ns();
    if (publish_all(c->bus, m, n, &last) < 0) {
        fprintf(stderr, "space-bench: publish failed\n");
        exit(1);
    }
    int64_t t_end = wait_stored(c->db, last, 300);
    free_events(m, n);
    if (t_end < 0) {
        fprintf(stderr, "space-bench: the event log did not catch up within 300 s\n");
        exit(1);
    }
    signing_t sg = {0};
    count_rejected(c, &sg, first, last);
    if (sg.rejected && !*rejected) {
        /* Rejected rows measure another path: say why, once. */
        PGresult *q = PQexec(c->db, "SELECT reject_reason FROM events WHERE status = 'rejected' "
                                    "ORDER BY stream_seq DESC LIMIT 1");
        if (PQresultStatus(q) == PGRES_TUPLES_OK && PQntuples(q) == 1)
            fprintf(stderr, "space-bench: output events rejected: %s\n", PQgetvalue(q, 0, 0));
        PQclear(q);
    }
    *rejected += sg.rejected;
    return (double)n / ((double)(t_end - t0) / 1e9);
}

static void bench_output(bench_ctx_t *c, const bench_keys_t *keys)
{
    unsigned runs = c->runs;
    size_t n = c->events;
    double *eps[OUT_MODES], prep[OUT_MODES] = {0};
    uint64_t rejected[OUT_MODES] = {0};
    for (int md = 0; md < OUT_MODES; md++)
        eps[md] = sp_xcalloc(runs, sizeof(double));
    printf("\nsealed output: %u runs of %zu CommandOutput events of 1 KiB per mode\n", runs, n);
    for (unsigned r = 0; r < runs; r++) {
        for (int k = 0; k < OUT_MODES; k++) {
            int md = (k + (int)r) % OUT_MODES; /* the order rotates from run to run */
            restart_eventlog(c, keys, "off", md & 1);
            eps[md][r] =
                run_output(c, n, r * 10 + (unsigned)md + 5000, md >= 2, &prep[md], &rejected[md]);
        }
        for (int md = 0; md < OUT_MODES; md++)
            printf("  run %u %-28s %.0f ev/s (x%.2f)\n", r + 1, out_mode_name[md], eps[md][r],
                   eps[md][r] / eps[0][r]);
        fflush(stdout);
    }
    double run_ratio[OUT_MODES];
    for (int md = 0; md < OUT_MODES; md++)
        run_ratio[md] = run_ratio_p50(eps[md], eps[0], runs);
    double base = bench_pct(eps[0], runs, 50);
    printf("\n  %-34s %10s %10s %10s  %-9s %s\n", "output throughput (over runs)", "p50", "p90",
           "p99", "unit", "vs plaintext, ckpt off: p50s, per-run p50");
    double p50[OUT_MODES];
    for (int md = 0; md < OUT_MODES; md++) {
        p50[md] = bench_pct(eps[md], runs, 50);
        print_row(out_mode_name[md], "ev/s", eps[md], runs, base, run_ratio[md]);
    }
    printf("  producer redaction + sealing (before the clock): %.2f us/event (plaintext "
           "event making %.2f us/event)\n",
           prep[2] / (double)(runs * n) * 1e6, prep[0] / (double)(runs * n) * 1e6);
    printf("  rejected rows among the measured events: %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
           "\n",
           rejected[0], rejected[1], rejected[2], rejected[3]);
    printf("\nJSON {\"bench\":\"eventlog-output\",\"events_per_run\":%zu,\"runs\":%u,"
           "\"eps_p50\":{\"plain\":%.0f,\"plain_ckpt\":%.0f,\"sealed\":%.0f,"
           "\"sealed_ckpt\":%.0f},\"run_ratio_p50\":{\"plain_ckpt\":%.3f,\"sealed\":%.3f,"
           "\"sealed_ckpt\":%.3f},\"seal_us_per_event\":%.3f}\n",
           n, runs, p50[0], p50[1], p50[2], p50[3], run_ratio[1], run_ratio[2], run_ratio[3],
           prep[2] / (double)(runs * n) * 1e6);
    for (int md = 0; md < OUT_MODES; md++)
        free(eps[md]);
}

int bench_eventlog(bench_ctx_t *c)
{
    unsigned runs = c->runs;
    size_t n = c->events;
    double *ins_eps = sp_xcalloc(runs, sizeof(double));
    size_t ins_n = n / 10 > 0 ? n / 10 : 1; /* per-row INSERT is slow: a tenth is enough */
    mode_result_t res[N_MODES];
    bench_keys_t keys;
    static const char *const verify_mode[N_MODES] = {"off", "on", "on", "on", "off", "on"};

    mode_result_t *base = NULL; /* the baseline build's runs (--baseline-bin) */
    memset(res, 0, sizeof(res));
    memset(&keys, 0, sizeof(keys));
    if (keys_make(c, &keys) < 0) {
        fprintf(stderr, "space-bench: cannot make the bench keyring under %s\n", c->home);
        return 1;
    }
    for (int md = 0; md < N_MODES; md++) {
        mode_alloc(&res[md], runs);
        res[md].sg.keys = md == MODE_OFF ? NULL : &keys;
        res[md].sg.batch = md == MODE_SINGLE   ? 1
                           : md == MODE_HEADED ? SP_SIG_HEADED_DEFAULT
                                               : c->sign_batch;
        res[md].sg.headed = md == MODE_HEADED;
    }
    if (c->baseline_bin) {
        base = sp_xcalloc(N_MODES, sizeof(*base));
        for (int md = 0; md < N_MODES; md++) {
            mode_alloc(&base[md], runs);
            base[md].sg.keys = res[md].sg.keys;
            base[md].sg.batch = res[md].sg.batch;
            base[md].sg.headed = res[md].sg.headed;
        }
        printf("baseline build: %s/space-eventlog, each throughput mode run with both builds\n",
               c->baseline_bin);
    }
    printf("eventlog throughput: %u runs of %zu events per mode (baseline: %zu per-row "
           "inserts); signed modes: producers sign batches of up to %zu, or 1\n",
           runs, n, ins_n, c->sign_batch);
    /* The modes' order changes from run to run (mode_at): no mode always comes right after the
     * previous run's insert baseline, or after the same other mode (whose rows may set off a
     * PostgreSQL checkpoint or an autovacuum inside the next one's window). */
    for (unsigned r = 0; r < runs; r++) {
        for (int k = 0; k < N_MODES; k++) {
            int md = mode_at(r, k);
            /* With a baseline build, each mode runs with both builds back to back, the first
             * alternating from run to run; the baseline's events are other sandboxes. */
            for (int v = 0; v < (base ? 2 : 1); v++) {
                bool other = base && (v ^ (int)(r & 1));
                restart_eventlog_from(c, &keys, verify_mode[md], md != MODE_NOCKPT,
                                      other ? c->baseline_bin : NULL);
                if (other)
                    run_mode(c, n, r, r + 100 * (unsigned)md + 1000, &base[md]);
                else
                    run_mode(c, n, r, r + 100 * (unsigned)md, &res[md]);
            }
        }
        for (int md = 0; md < N_MODES; md++)
            printf("  run %u %-22s eventlog %.0f ev/s (x%.2f), publish-only %.0f ev/s, CPU "
                   "%.1f us/event (x%.2f)\n",
                   r + 1, mode_name[md], res[md].log_eps[r],
                   res[md].log_eps[r] / res[MODE_OFF].log_eps[r], res[md].pub_eps[r],
                   res[md].cpu_us[CPU_PARTS][r],
                   res[md].cpu_us[CPU_PARTS][r] / res[MODE_OFF].cpu_us[CPU_PARTS][r]);
        for (int md = 0; base && md < N_MODES; md++)
            printf("  run %u %-22s baseline build %.0f ev/s (x%.2f), this build x%.2f of it\n",
                   r + 1, mode_name[md], base[md].log_eps[r],
                   base[md].log_eps[r] / base[MODE_OFF].log_eps[r],
                   res[md].log_eps[r] / base[md].log_eps[r]);
        ins_eps[r] = run_insert_baseline(c, ins_n, r);
        printf("  run %u insert-per-event %.0f ev/s\n", r + 1, ins_eps[r]);
        fflush(stdout);
    }
    printf("eventlog drain: %u runs of %zu events per mode, published while the log is "
           "stopped\n",
           runs, n);
    for (unsigned r = 0; r < runs; r++) {
        for (int k = 0; k < N_MODES; k++) {
            int md = mode_at(r, k);
            for (int v = 0; v < (base ? 2 : 1); v++) {
                bool other = base && (v ^ (int)(r & 1));
                run_drain(c, &keys, n, r, r + 100 * (unsigned)md + (other ? 4000 : 3000),
                          verify_mode[md], md != MODE_NOCKPT, other ? c->baseline_bin : NULL,
                          other ? &base[md] : &res[md]);
            }
        }
        for (int md = 0; md < N_MODES; md++)
            printf("  run %u %-22s drain %.0f ev/s (x%.2f), longest pause %.0f ms\n", r + 1,
                   mode_name[md], res[md].drain_eps[r],
                   res[md].drain_eps[r] / res[MODE_OFF].drain_eps[r], res[md].drain_pause_ms[r]);
        for (int md = 0; base && md < N_MODES; md++)
            printf("  run %u %-22s baseline build drain %.0f ev/s (x%.2f), longest pause %.0f "
                   "ms; this build x%.2f of it\n",
                   r + 1, mode_name[md], base[md].drain_eps[r],
                   base[md].drain_eps[r] / base[MODE_OFF].drain_eps[r], base[md].drain_pause_ms[r],
                   res[md].drain_eps[r] / base[md].drain_eps[r]);
        fflush(stdout);
    }
    for (unsigned r = 0; r < runs; r++) {
        for (int k = 0; k < N_MODES; k++) {
            int md = mode_at(r, k);
            for (int v = 0; v < (base ? 2 : 1); v++) {
                bool other = base && (v ^ (int)(r & 1));
                mode_result_t *m = other ? &base[md] : &res[md];
                double *ms = NULL;
                restart_eventlog_from(c, &keys, verify_mode[md], md != MODE_NOCKPT,
                                      other ? c->baseline_bin : NULL);
                size_t got = run_latency(c, c->rate, c->seconds,
                                         r + 100 * (unsigned)md + (other ? 5000 : 0), &m->sg, &ms);
                m->lat = sp_xreallocarray(m->lat, m->nl + got, sizeof(double));
                memcpy(m->lat + m->nl, ms, got * sizeof(double));
                m->nl += got;
                free(ms);
            }
        }
    }
    bench_output(c, &keys);
    /* Leave the stack as the bench found it: verification as configured by its default. */
    unsetenv("SPACE_VERIFY_SIGNATURES");
    unsetenv("SPACE_KEYRING_DIR");
    restart_eventlog(c, &keys, "auto", true);

    double run_ratio[N_MODES], cpu_ratio[N_MODES];
    for (int md = 0; md < N_MODES; md++) {
        run_ratio[md] = run_ratio_p50(res[md].log_eps, res[MODE_OFF].log_eps, runs);
        cpu_ratio[md] =
            run_ratio_p50(res[md].cpu_us[CPU_PARTS], res[MODE_OFF].cpu_us[CPU_PARTS], runs);
    }
    double drain_ratio[N_MODES], drain_p50[N_MODES];
    for (int md = 0; md < N_MODES; md++)
        drain_ratio[md] = run_ratio_p50(res[md].drain_eps, res[MODE_OFF].drain_eps, runs);
    double drain_vs_base[N_MODES], base_drain_ratio[N_MODES];
    for (int md = 0; base && md < N_MODES; md++) {
        drain_vs_base[md] = run_ratio_p50(res[md].drain_eps, base[md].drain_eps, runs);
        base_drain_ratio[md] = run_ratio_p50(base[md].drain_eps, base[MODE_OFF].drain_eps, runs);
    }
    /* This build against the baseline build, mode by mode, and the baseline's own ratios to
     * its unsigned runs (before bench_pct sorts the arrays in place). */
    double vs_base[N_MODES], vs_base_p50s[N_MODES], base_ratio[N_MODES];
    for (int md = 0; base && md < N_MODES; md++) {
        vs_base[md] = run_ratio_p50(res[md].log_eps, base[md].log_eps, runs);
        base_ratio[md] = run_ratio_p50(base[md].log_eps, base[MODE_OFF].log_eps, runs);
    }
    /* What anchoring costs: the batch mode with checkpoints against the same without, run by
     * run (before bench_pct sorts the arrays in place). */
    double ckpt_run_ratio = run_ratio_p50(res[MODE_BATCH].log_eps, res[MODE_NOCKPT].log_eps, runs);
    /* What verification costs on top of the bytes: the batch mode against the same events
     * with verification off, run by run. */
    double bytes_to_batch = run_ratio_p50(res[MODE_BATCH].log_eps, res[MODE_BYTES].log_eps, runs);
    double bytes_to_batch_cpu =
        run_ratio_p50(res[MODE_BATCH].cpu_us[CPU_PARTS], res[MODE_BYTES].cpu_us[CPU_PARTS], runs);
    double ckpt_ratio = bench_pct(res[MODE_BATCH].log_eps, runs, 50) /
                        bench_pct(res[MODE_NOCKPT].log_eps, runs, 50);
    double ins_p50 = bench_pct(ins_eps, runs, 50);
    double base_eps = bench_pct(res[MODE_OFF].log_eps, runs, 50);
    printf("\n  %-34s %10s %10s %10s  %-9s %s\n", "throughput (over runs)", "p50", "p90", "p99",
           "unit", "vs unsigned: p50s, per-run p50");
    for (int md = 0; md < N_MODES; md++) {
        char what[64];
        snprintf(what, sizeof(what), "eventlog, %s", mode_name[md]);
        print_row(what, "ev/s", res[md].log_eps, runs, base_eps, run_ratio[md]);
    }
    for (int md = 0; base && md < N_MODES; md++) {
        char what[64];
        snprintf(what, sizeof(what), "baseline, %s", mode_name[md]);
        vs_base_p50s[md] =
            bench_pct(res[md].log_eps, runs, 50) / bench_pct(base[md].log_eps, runs, 50);
        print_row(what, "ev/s", base[md].log_eps, runs, bench_pct(base[MODE_OFF].log_eps, runs, 50),
                  base_ratio[md]);
    }
    for (int md = 0; base && md < N_MODES; md++)
        printf("  this build vs baseline, %-26s x%.3f (p50s), x%.3f (per-run p50)\n", mode_name[md],
               vs_base_p50s[md], vs_base[md]);
    print_row("jetstream publish only (unsigned)", "ev/s", res[MODE_OFF].pub_eps, runs, base_eps,
              -1);
    print_row("insert per event (baseline)", "ev/s", ins_eps, runs, base_eps, -1);

    /* CPU per event: what signing costs the machine whatever else runs on it. The producers'
     * signing happens before the clock, in this process: added to the signed modes' sums. */
    double sign_us[N_MODES] = {0};
    for (int md = 0; md < N_MODES; md++)
        if (res[md].sg.n_signed)
            sign_us[md] = res[md].sg.sign_s / (double)res[md].sg.n_signed * 1e6;
    double cpu_p50[N_MODES];
    printf("\n  %-34s %9s %9s %9s %9s %9s %6s  %s\n", "CPU us per event (p50 over runs)",
           cpu_part[0], cpu_part[1], cpu_part[2], "sum", "+signing", "bytes",
           "sum vs unsigned: per-run p50, with signing");
    for (int md = 0; md < N_MODES; md++) {
        double p[CPU_PARTS + 1];
        for (int i = 0; i <= CPU_PARTS; i++)
            p[i] = bench_pct(res[md].cpu_us[i], runs, 50);
        cpu_p50[md] = p[CPU_PARTS];
        printf("  %-34s %9.1f %9.1f %9.1f %9.1f %9.1f %6.0f  x%.2f, x%.2f\n", mode_name[md], p[0],
               p[1], p[2], p[CPU_PARTS], p[CPU_PARTS] + sign_us[md],
               res[md].sg.n_msgs ? (double)res[md].sg.bytes / (double)res[md].sg.n_msgs : 0,
               cpu_ratio[md], (p[CPU_PARTS] + sign_us[md]) / cpu_p50[MODE_OFF]);
    }

    printf("\n  %-34s %10s %10s %10s  %-9s %s\n", "drain: the log's capacity", "p50", "p90", "p99",
           "unit", "vs unsigned: p50s, per-run p50");
    double drain_base = bench_pct(res[MODE_OFF].drain_eps, runs, 50);
    for (int md = 0; md < N_MODES; md++) {
        drain_p50[md] = bench_pct(res[md].drain_eps, runs, 50);
        print_row(mode_name[md], "ev/s", res[md].drain_eps, runs, drain_base, drain_ratio[md]);
    }
    for (int md = 0; base && md < N_MODES; md++) {
        char what[64];
        snprintf(what, sizeof(what), "baseline, %s", mode_name[md]);
        print_row(what, "ev/s", base[md].drain_eps, runs,
                  bench_pct(base[MODE_OFF].drain_eps, runs, 50), base_drain_ratio[md]);
    }
    for (int md = 0; base && md < N_MODES; md++)
        printf("  this build vs baseline, drain, %-19s x%.3f (per-run p50)\n", mode_name[md],
               drain_vs_base[md]);
    for (int md = 0; md < N_MODES; md++)
        print_row(md == MODE_OFF ? "longest pause, unsigned" : mode_name[md], "ms",
                  res[md].drain_pause_ms, runs, -1, -1);
    for (int md = 0; base && md < N_MODES; md++) {
        char what[64];
        snprintf(what, sizeof(what), "longest pause, baseline, %s", mode_name[md]);
        print_row(what, "ms", base[md].drain_pause_ms, runs, -1, -1);
    }

    printf("\n  publish-to-persisted lag at %u ev/s   %8s %8s %8s %8s   %s\n", c->rate, "p50",
           "p90", "p99", "max", "p50/p99 vs unsigned");
    double l[N_MODES][4];
    for (int md = 0; md < N_MODES; md++) {
        mode_result_t *m = &res[md];
        l[md][0] = bench_pct(m->lat, m->nl, 50);
        l[md][1] = bench_pct(m->lat, m->nl, 90);
        l[md][2] = bench_pct(m->lat, m->nl, 99);
        l[md][3] = m->nl ? m->lat[m->nl - 1] : NAN;
        printf("  %-36s %6.2fms %6.2fms %6.2fms %6.2fms   x%.2f / x%.2f\n", mode_name[md], l[md][0],
               l[md][1], l[md][2], l[md][3], l[md][0] / l[MODE_OFF][0], l[md][2] / l[MODE_OFF][2]);
    }
    for (int md = 0; base && md < N_MODES; md++) {
        mode_result_t *m = &base[md];
        double p50 = bench_pct(m->lat, m->nl, 50), p90 = bench_pct(m->lat, m->nl, 90),
               p99 = bench_pct(m->lat, m->nl, 99);
        char what[64];
        snprintf(what, sizeof(what), "baseline, %s", mode_name[md]);
        printf("  %-36s %6.2fms %6.2fms %6.2fms %6.2fms   this build x%.2f / x%.2f of it\n", what,
               p50, p90, p99, m->nl ? m->lat[m->nl - 1] : NAN, l[md][0] / p50, l[md][2] / p99);
    }
    printf("\n  producer signing (before the clock): batches %.2f us/event, batch of 1 %.2f "
           "us/event\n",
           res[MODE_BATCH].sg.sign_s / (double)res[MODE_BATCH].sg.n_signed * 1e6,
           res[MODE_SINGLE].sg.sign_s / (double)res[MODE_SINGLE].sg.n_signed * 1e6);
    printf("  rejected rows among the measured events: unsigned %" PRIu64 ", batches %" PRIu64
           ", batch of 1 %" PRIu64 ", no ckpt %" PRIu64 ", verify off %" PRIu64 ", headed %" PRIu64
           "\n",
           res[MODE_OFF].sg.rejected, res[MODE_BATCH].sg.rejected, res[MODE_SINGLE].sg.rejected,
           res[MODE_NOCKPT].sg.rejected, res[MODE_BYTES].sg.rejected, res[MODE_HEADED].sg.rejected);
    printf(
        "  headed batches of %d against unsigned (per-run p50s): throughput x%.3f, CPU x%.3f "
        "(x%.3f with signing), drain x%.3f, lag p50 x%.2f / p99 x%.2f; against Merkle "
        "batches: throughput x%.3f, CPU x%.3f; bytes per event %.0f / %.0f / %.0f "
        "(unsigned / Merkle / headed)\n",
        SP_SIG_HEADED_DEFAULT, run_ratio[MODE_HEADED], cpu_ratio[MODE_HEADED],
        (cpu_p50[MODE_HEADED] + sign_us[MODE_HEADED]) / cpu_p50[MODE_OFF], drain_ratio[MODE_HEADED],
        l[MODE_HEADED][0] / l[MODE_OFF][0], l[MODE_HEADED][2] / l[MODE_OFF][2],
        run_ratio_p50(res[MODE_HEADED].log_eps, res[MODE_BATCH].log_eps, runs),
        run_ratio_p50(res[MODE_HEADED].cpu_us[CPU_PARTS], res[MODE_BATCH].cpu_us[CPU_PARTS], runs),
        (double)res[MODE_OFF].sg.bytes /
            (double)(res[MODE_OFF].sg.n_msgs ? res[MODE_OFF].sg.n_msgs : 1),
        (double)res[MODE_BATCH].sg.bytes /
            (double)(res[MODE_BATCH].sg.n_msgs ? res[MODE_BATCH].sg.n_msgs : 1),
        (double)res[MODE_HEADED].sg.bytes /
            (double)(res[MODE_HEADED].sg.n_msgs ? res[MODE_HEADED].sg.n_msgs : 1));
    printf("  what signing costs, split (signed batches against unsigned = bytes x verification):"
           " throughput x%.3f = x%.3f x x%.3f, CPU x%.3f = x%.3f x x%.3f (per-run p50s)\n",
           run_ratio[MODE_BATCH], run_ratio[MODE_BYTES], bytes_to_batch, cpu_ratio[MODE_BATCH],
           cpu_ratio[MODE_BYTES], bytes_to_batch_cpu);
    printf("  checkpoints on vs off (signed, batches): throughput x%.3f (p50s), x%.3f (per-run "
           "p50); lag p50 x%.2f, p99 x%.2f\n",
           ckpt_ratio, ckpt_run_ratio, l[MODE_BATCH][0] / l[MODE_NOCKPT][0],
           l[MODE_BATCH][2] / l[MODE_NOCKPT][2]);

    printf("\nJSON {\"bench\":\"eventlog\",\"events_per_run\":%zu,\"runs\":%u,"
           "\"sign_batch\":%zu,\"eventlog_eps_p50\":%.0f,\"signed_batch_eps_p50\":%.0f,"
           "\"signed_single_eps_p50\":%.0f,\"ratio_batch\":%.3f,\"ratio_single\":%.3f,"
           "\"run_ratio_batch_p50\":%.3f,\"run_ratio_single_p50\":%.3f,"
           "\"publish_only_eps_p50\":%.0f,\"insert_per_event_eps_p50\":%.0f,"
           "\"lag_rate\":%u,\"lag_ms\":{\"unsigned\":[%.3f,%.3f,%.3f],"
           "\"batch\":[%.3f,%.3f,%.3f],\"single\":[%.3f,%.3f,%.3f],"
           "\"batch_no_ckpt\":[%.3f,%.3f,%.3f]},\"no_ckpt_eps_p50\":%.0f,"
           "\"ratio_ckpt\":%.3f,\"run_ratio_ckpt_p50\":%.3f,"
           "\"rejected\":[%" PRIu64 ",%" PRIu64 ",%" PRIu64 "],"
           "\"cpu_us_per_event_p50\":[%.2f,%.2f,%.2f,%.2f],\"sign_us_per_event\":[%.2f,%.2f],"
           "\"cpu_run_ratio_p50\":[%.3f,%.3f,%.3f],"
           "\"drain_eps_p50\":[%.0f,%.0f,%.0f,%.0f],\"drain_run_ratio_p50\":[%.3f,%.3f,%.3f],"
           "\"drain_pause_ms_max\":[%.1f,%.1f,%.1f,%.1f],"
           "\"verify_off\":{\"eps_p50\":%.0f,\"run_ratio_p50\":%.3f,\"cpu_us_per_event_p50\":%.2f,"
           "\"cpu_run_ratio_p50\":%.3f,\"drain_eps_p50\":%.0f,\"drain_run_ratio_p50\":%.3f,"
           "\"batch_vs_verify_off_run_ratio_p50\":%.3f,\"batch_vs_verify_off_cpu_ratio_p50\":%.3f,"
           "\"lag_ms\":[%.3f,%.3f,%.3f]},"
           "\"headed\":{\"batch\":%d,\"eps_p50\":%.0f,\"run_ratio_p50\":%.3f,"
           "\"cpu_us_per_event_p50\":%.2f,\"cpu_run_ratio_p50\":%.3f,\"sign_us_per_event\":%.2f,"
           "\"drain_eps_p50\":%.0f,\"drain_run_ratio_p50\":%.3f,\"lag_ms\":[%.3f,%.3f,%.3f],"
           "\"rejected\":%" PRIu64 "}}\n",
           n, runs, c->sign_batch, base_eps, bench_pct(res[MODE_BATCH].log_eps, runs, 50),
           bench_pct(res[MODE_SINGLE].log_eps, runs, 50),
           bench_pct(res[MODE_BATCH].log_eps, runs, 50) / base_eps,
           bench_pct(res[MODE_SINGLE].log_eps, runs, 50) / base_eps, run_ratio[MODE_BATCH],
           run_ratio[MODE_SINGLE], bench_pct(res[MODE_OFF].pub_eps, runs, 50), ins_p50, c->rate,
           l[0][0], l[0][1], l[0][2], l[1][0], l[1][1], l[1][2], l[2][0], l[2][1], l[2][2], l[3][0],
           l[3][1], l[3][2], bench_pct(res[MODE_NOCKPT].log_eps, runs, 50), ckpt_ratio,
           ckpt_run_ratio, res[MODE_OFF].sg.rejected, res[MODE_BATCH].sg.rejected,
           res[MODE_SINGLE].sg.rejected, cpu_p50[MODE_OFF], cpu_p50[MODE_BATCH],
           cpu_p50[MODE_SINGLE], cpu_p50[MODE_NOCKPT], sign_us[MODE_BATCH], sign_us[MODE_SINGLE],
           cpu_ratio[MODE_BATCH], cpu_ratio[MODE_SINGLE], cpu_ratio[MODE_NOCKPT],
           drain_p50[MODE_OFF], drain_p50[MODE_BATCH], drain_p50[MODE_SINGLE],
           drain_p50[MODE_NOCKPT], drain_ratio[MODE_BATCH], drain_ratio[MODE_SINGLE],
           drain_ratio[MODE_NOCKPT], bench_pct(res[0].drain_pause_ms, runs, 100),
           bench_pct(res[1].drain_pause_ms, runs, 100), bench_pct(res[2].drain_pause_ms, runs, 100),
           bench_pct(res[3].drain_pause_ms, runs, 100),
           bench_pct(res[MODE_BYTES].log_eps, runs, 50), run_ratio[MODE_BYTES], cpu_p50[MODE_BYTES],
           cpu_ratio[MODE_BYTES], drain_p50[MODE_BYTES], drain_ratio[MODE_BYTES], bytes_to_batch,
           bytes_to_batch_cpu, l[MODE_BYTES][0], l[MODE_BYTES][1], l[MODE_BYTES][2],
           SP_SIG_HEADED_DEFAULT, bench_pct(res[MODE_HEADED].log_eps, runs, 50),
           run_ratio[MODE_HEADED], cpu_p50[MODE_HEADED], cpu_ratio[MODE_HEADED],
           sign_us[MODE_HEADED], drain_p50[MODE_HEADED], drain_ratio[MODE_HEADED],
           l[MODE_HEADED][0], l[MODE_HEADED][1], l[MODE_HEADED][2], res[MODE_HEADED].sg.rejected);
    if (base) {
        printf("JSON {\"bench\":\"eventlog-baseline\",\"baseline_bin\":\"%s\",\"runs\":%u,"
               "\"eps_p50\":[%.0f,%.0f,%.0f,%.0f],\"run_ratio_p50\":[%.3f,%.3f,%.3f,%.3f],"
               "\"vs_baseline_run_ratio_p50\":[%.3f,%.3f,%.3f,%.3f],"
               "\"drain_run_ratio_p50\":[%.3f,%.3f,%.3f,%.3f],"
               "\"drain_vs_baseline_run_ratio_p50\":[%.3f,%.3f,%.3f,%.3f],"
               "\"drain_pause_ms_max\":[%.1f,%.1f,%.1f,%.1f],"
               "\"rejected\":[%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 "]}\n",
               c->baseline_bin, runs, bench_pct(base[0].log_eps, runs, 50),
               bench_pct(base[1].log_eps, runs, 50), bench_pct(base[2].log_eps, runs, 50),
               bench_pct(base[3].log_eps, runs, 50), base_ratio[0], base_ratio[1], base_ratio[2],
               base_ratio[3], vs_base[0], vs_base[1], vs_base[2], vs_base[3], base_drain_ratio[0],
               base_drain_ratio[1], base_drain_ratio[2], base_drain_ratio[3], drain_vs_base[0],
               drain_vs_base[1], drain_vs_base[2], drain_vs_base[3],
               bench_pct(base[0].drain_pause_ms, runs, 100),
               bench_pct(base[1].drain_pause_ms, runs, 100),
               bench_pct(base[2].drain_pause_ms, runs, 100),
               bench_pct(base[3].drain_pause_ms, runs, 100), base[0].sg.rejected,
               base[1].sg.rejected, base[2].sg.rejected, base[3].sg.rejected);
        for (int md = 0; md < N_MODES; md++)
            mode_dispose(&base[md]);
        free(base);
    }
    for (int md = 0; md < N_MODES; md++)
        mode_dispose(&res[md]);
    free(ins_eps);
    keys_free(&keys);
    return 0;
}
