/* Metrics of a daemon in the Prometheus text exposition format, version 0.0.4
 * (docs/metrics.md), and the small HTTP listener that serves them at GET /metrics.
 *
 * A registry holds families (a name, a help text, a type, up to SP_METRICS_LABELS_MAX label
 * names); a family holds series, one per tuple of label values, at most the family's
 * max_series: a series past that is refused (NULL), never allocated, so a label can never grow
 * without bound. Label values come from a fixed enum of the daemon, or are ids the daemon
 * bounds itself (the sandboxes of one worker, registered credentials): never user text.
 *
 * Threads: every function is safe from any thread. Counter and gauge updates are atomic
 * (lock-free on the value), a histogram observation takes the series' mutex. A series pointer
 * stays valid until sp_metric_reset of its family or sp_metrics_free: families that are reset
 * (those filled at scrape time, e.g. per sandbox) are written only from a collect callback.
 */
#ifndef SPACE_METRICS_H
#define SPACE_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "config.h"

#define SP_METRICS_LABELS_MAX 4
/* A label value longer than this is refused (ids are at most 64 bytes). */
#define SP_METRICS_VALUE_MAX   128
#define SP_METRICS_BUCKETS_MAX 32
#define SP_METRICS_ERR_MAX     256

typedef enum { SP_METRIC_COUNTER = 1, SP_METRIC_GAUGE, SP_METRIC_HISTOGRAM } sp_metric_type_t;

typedef struct sp_metrics sp_metrics_t;
typedef struct sp_metric sp_metric_t;
typedef struct sp_series sp_series_t;

sp_metrics_t *sp_metrics_new(void);
/* Stops nothing: free the server first. Accepts NULL. */
void sp_metrics_free(sp_metrics_t *r);

/* Adds a family. name must match [a-zA-Z_:][a-zA-Z0-9_:]* and end in its unit (_total for
 * counters, _seconds, _bytes, ...: the caller's part of the contract); labels is a
 * comma-separated list of label names or NULL; bounds (histograms only) are n_bounds strictly
 * increasing finite upper bounds, the +Inf bucket is implicit. max_series caps the series
 * (1 for a family without labels). A family with no labels has its one series from the start.
 * Returns NULL on a bad argument (a programming error: the daemon exits); the registry owns
 * the family. Families are written in the order they are added. */
sp_metric_t *sp_metrics_add(sp_metrics_t *r, sp_metric_type_t type, const char *name,
                            const char *help, const char *labels, const double *bounds,
                            size_t n_bounds, size_t max_series);

/* The series of these label values (as many as the family has label names; NULL when it has
 * none), made on first use (at value 0). NULL when the family is at max_series or a value is
 * empty, longer than SP_METRICS_VALUE_MAX or not valid UTF-8: the caller counts nothing. */
sp_series_t *sp_metric_series(sp_metric_t *m, const char *const *values);
/* Shorthand for a family with one label. */
sp_series_t *sp_metric_series1(sp_metric_t *m, const char *value);
/* The one series of a family without labels. */
sp_series_t *sp_metric_only(sp_metric_t *m);
/* Removes every series of m (those of a gone sandbox, say: a collect callback resets the
 * family and adds what exists). Pointers to them become invalid. */
void sp_metric_reset(sp_metric_t *m);
/* Removes the series of these values, if it exists. */
void sp_metric_remove(sp_metric_t *m, const char *const *values);

/* Updates; NULL s does nothing (a refused series). */
void sp_series_inc(sp_series_t *s);
void sp_series_add(sp_series_t *s, double v);     /* counters: v >= 0 (else ignored) */
void sp_series_set(sp_series_t *s, double v);     /* gauges, and counters read from elsewhere */
void sp_series_observe(sp_series_t *s, double v); /* histograms */
double sp_series_value(const sp_series_t *s);     /* counters and gauges; 0 for NULL */

/* Called at every scrape, before the text is written, on the listener's thread, in the order
 * added; for gauges read from elsewhere (cgroups, queues). It must not block for long: the
 * scrape waits for it. */
typedef void (*sp_metrics_collect_fn)(sp_metrics_t *r, void *arg);
void sp_metrics_on_collect(sp_metrics_t *r, sp_metrics_collect_fn fn, void *arg);

/* Runs the collect callbacks, then appends every family to out (text format 0.0.4). Scrapes
 * are serialized. */
void sp_metrics_scrape(sp_metrics_t *r, sp_buf_t *out);
/* The text only, without the callbacks (tests, and the gateway which collects itself). */
void sp_metrics_write(sp_metrics_t *r, sp_buf_t *out);
/* Appends s as a label value escaped per the format: backslash, double quote, newline. */
void sp_metrics_escape(sp_buf_t *out, const char *s);

/* ---- the listener ---- */

/* Options every daemon takes (the struct fields are char *): metrics-addr, host:port to serve
 * GET /metrics on ("" or "off": no listener; port 0 picks one), and metrics-port-file, where
 * the bound port is written (default: $SPACE_HOME/run/<program>.metrics when SPACE_HOME is
 * set). */
#define SP_METRICS_CFG_OPTS(st, fa, ff)                                                            \
    SP_CFG_STR_OPT("metrics-addr", st, fa, NULL,                                                   \
                   "serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9101 (port "   \
                   "0: any free port; empty or off: none; docs/metrics.md)"),                      \
        SP_CFG_STR_OPT("metrics-port-file", st, ff, NULL,                                          \
                       "where the metrics port is written (default: "                              \
                       "$SPACE_HOME/run/<program>.metrics)")

/* The port file's default place: $SPACE_HOME/run/<program> SP_METRICS_PORT_SUFFIX, beside the
 * pid file `space up` writes. */
#define SP_METRICS_PORT_SUFFIX ".metrics"

typedef struct sp_metrics_server sp_metrics_server_t;

/* Limits of the listener: a request head larger than this is answered 431; a client that has
 * not sent its head within the timeout, or not read the answer within it, is dropped. */
#define SP_METRICS_HEAD_MAX   8192
#define SP_METRICS_TIMEOUT_MS 2000
#define SP_METRICS_CONNS_MAX  4

/* Starts a thread that serves r on addr ("host:port", IPv4 or [IPv6]; a host other than a
 * loopback address is allowed: the operator asked for it). An empty addr or "off" serves
 * nothing: returns 0 with *ret NULL. The bound port goes to port_file (written atomically,
 * "PORT\n"), or to $SPACE_HOME/run/<program>.metrics when port_file is empty and SPACE_HOME is
 * set. Only GET /metrics is answered (200); other paths 404, other methods 405; one request per
 * connection. At most SP_METRICS_CONNS_MAX connections at once: a new one closes the oldest.
 * Returns 0, or a negative errno with err filled. */
int sp_metrics_serve(sp_metrics_t *r, const char *program, const char *addr, const char *port_file,
                     sp_metrics_server_t **ret, char err[SP_METRICS_ERR_MAX]);
/* The port served on (0 for NULL). */
int sp_metrics_server_port(const sp_metrics_server_t *s);
/* Stops and joins the thread, removes the port file it wrote. Accepts NULL. */
void sp_metrics_server_free(sp_metrics_server_t *s);

#endif
