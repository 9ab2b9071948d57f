/* The event log's metrics (docs/metrics.md). Counters are the store's own counts (el_counts_t),
 * copied after each committed batch by the consuming thread; the lag is read at scrape time
 * from the stream, on the listener's thread. */
#include "eventlog.h"

/* Events per stored batch: 1 to batch-max (1000 by default, at most 10000). */
static const double batch_bounds[] = {1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000};
/* One batch's transaction: rows, projection, checkpoint note, commit. */
static const double store_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                      0.1,    0.25,  0.5,    1,     2.5,  5,     10};

static void collect(sp_metrics_t *reg, void *arg)
{
    el_metrics_t *m = arg;
    uint64_t last = 0;
    (void)reg;
    if (sp_bus_stream_info(m->bus, &last, NULL) < 0)
        return; /* the gauges keep their last values */
    double stored = sp_series_value(sp_metric_only(m->stored_seq));
    sp_series_set(sp_metric_only(m->stream_seq), (double)last);
    sp_series_set(sp_metric_only(m->lag), (double)last > stored ? (double)last - stored : 0);
}

int el_metrics_init(el_metrics_t *m, sp_metrics_t *reg, sp_bus_t *bus)
{
    m->bus = bus;
    m->events = sp_metrics_add(reg, SP_METRIC_COUNTER, "space_eventlog_events_total",
                               "Rows stored in the log, by outcome (accepted, rejected).",
                               "outcome", NULL, 0, 2);
    m->rejected = sp_metrics_add(reg, SP_METRIC_COUNTER, "space_eventlog_rejected_total",
                                 "Rows stored rejected, by class of reason: invalid, refused, "
                                 "duplicate, reused_id, contract, unstorable, plaintext.",
                                 "class", NULL, 0, EL_REJ_CLASSES);
    m->signatures = sp_metrics_add(reg, SP_METRIC_COUNTER, "space_eventlog_signatures_total",
                                   "Signature verdicts on stored rows (verify-signatures on or "
                                   "log), by result (verified, failed).",
                                   "result", NULL, 0, 2);
    m->batch = sp_metrics_add(reg, SP_METRIC_HISTOGRAM, "space_eventlog_batch_events",
                              "Messages per stored batch.", NULL, batch_bounds,
                              sizeof(batch_bounds) / sizeof(batch_bounds[0]), 1);
    m->store = sp_metrics_add(reg, SP_METRIC_HISTOGRAM, "space_eventlog_store_seconds",
                              "Time to store one batch in PostgreSQL, commit included.", NULL,
                              store_bounds, sizeof(store_bounds) / sizeof(store_bounds[0]), 1);
    m->stored_seq =
        sp_metrics_add(reg, SP_METRIC_GAUGE, "space_eventlog_stored_seq",
                       "The last stream sequence stored (the log's head).", NULL, NULL, 0, 1);
    m->stream_seq = sp_metrics_add(reg, SP_METRIC_GAUGE, "space_eventlog_stream_seq",
                                   "The last sequence of the SPACE_EVENTS stream, read at scrape.",
                                   NULL, NULL, 0, 1);
    m->lag = sp_metrics_add(reg, SP_METRIC_GAUGE, "space_eventlog_lag_events",
                            "Messages in the stream not stored yet (stream_seq - stored_seq), "
                            "read at scrape.",
                            NULL, NULL, 0, 1);
    m->lingers = sp_metrics_add(reg, SP_METRIC_COUNTER, "space_eventlog_lingers_total",
                                "Batches of command events that waited for their commands' ends "
                                "(linger-ms), by outcome: joined (the ends or another message "
                                "came), expired (stored without them).",
                                "outcome", NULL, 0, 2);
    if (!m->events || !m->rejected || !m->signatures || !m->batch || !m->store || !m->stored_seq ||
        !m->stream_seq || !m->lag || !m->lingers)
        return -1;
    (void)sp_metric_series1(m->events, "accepted");
    (void)sp_metric_series1(m->events, "rejected");
    for (size_t k = 0; k < EL_REJ_CLASSES; k++)
        (void)sp_metric_series1(m->rejected, el_reject_class_names[k]);
    (void)sp_metric_series1(m->signatures, "verified");
    (void)sp_metric_series1(m->signatures, "failed");
    (void)sp_metric_series1(m->lingers, "joined");
    (void)sp_metric_series1(m->lingers, "expired");
    sp_metrics_on_collect(reg, collect, m);
    return 0;
}

void el_metrics_stored(el_metrics_t *m, const el_store_t *st, size_t n, double seconds)
{
    const el_counts_t *c = &st->counts;
    sp_series_set(sp_metric_series1(m->events, "accepted"), (double)c->accepted);
    sp_series_set(sp_metric_series1(m->events, "rejected"), (double)c->rejected);
    for (size_t k = 0; k < EL_REJ_CLASSES; k++)
        sp_series_set(sp_metric_series1(m->rejected, el_reject_class_names[k]),
                      (double)c->rejected_by[k]);
    sp_series_set(sp_metric_series1(m->signatures, "verified"), (double)c->sig_verified);
    sp_series_set(sp_metric_series1(m->signatures, "failed"), (double)c->sig_failed);
    sp_series_observe(sp_metric_only(m->batch), (double)n);
    sp_series_observe(sp_metric_only(m->store), seconds);
    sp_series_set(sp_metric_only(m->stored_seq), (double)st->head.seq);
}
