/* space-scheduler internals. */
#ifndef SPACE_SCHEDULER_H
#define SPACE_SCHEDULER_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "envelope.h"
#include "metrics.h"
#include "publish.h"
#include "verifier.h"

typedef struct {
    char *nats_url;
    char *identity; /* busid.h */
    char *creds_dir;
    char *verify_signatures; /* verifier.h */
    char *keyring_dir;
    char *pg_url;
    char *name;
    char *durable;
    int64_t batch_max;
    int64_t ack_wait_ms;
    int64_t heartbeat_misses;
    int64_t idle_suspend_s; /* platform default for sandboxes that set none */
    int64_t controller_ms;  /* timeout/idle/lost-worker controller period */
    int64_t worker_lost_s;  /* a worker silent this long is taken for gone with its host */
    char *log_level;
    char *log_format;
    char *metrics_addr; /* metrics.h */
    char *metrics_port_file;
} sched_config_t;

/* Placements made since a worker's last heartbeat, so that a burst of creates spreads over
 * workers before their heartbeats catch up. Small: one entry per worker seen. */
typedef struct {
    char worker[65];
    int64_t heartbeat_us; /* the heartbeat these counts are relative to */
    uint32_t placed;
} sched_recent_t;

typedef struct {
    const sched_config_t *cfg;
    sp_bus_t *bus;
    PGconn *db;
    sp_verifier_t *verifier; /* intents are acted on only once checked (docs/trust.md) */
    sched_recent_t *recent;
    size_t n_recent;
    sp_metric_t *m_placements, *m_actions; /* scheduler_metrics.c */
    /* While a fetched batch of intents is handled: its answers, published as one signed
     * batch after it (main.c). NULL: each answer is published alone (the controllers). */
    sp_burst_t *burst;
} sched_t;

/* Handles one event from space.ev.sbx._.>: 0 = done (ack once s->burst, when set, is
 * published and acknowledged by the stream), < 0 = could not be handled now (the database or
 * the bus failed: redeliver later). Invalid events, and intents the trust
 * check refuses (unsigned, forged, a signer that may not ask this, a platform outside its
 * tenants), are done without effect: the event log records them as rejected. */
int sched_handle(sched_t *s, const sp_bus_msg_t *m);

/* The scheduler's families in reg (docs/metrics.md); -1 on a programming error. */
int sched_metrics_init(sched_t *s, sp_metrics_t *reg);
/* A decided intent: "placed", "placed_resume" or the refusal's code (others count as
 * "other"). */
void sched_metrics_placement(sched_t *s, const char *outcome);
/* A published controller request: timeout_delete, timeout_suspend, idle_suspend, worker_lost,
 * sandbox_lost, resume_lost. */
void sched_metrics_action(sched_t *s, const char *action);

/* One pass of the timeout and idleness controller (scheduler_timeouts.c). */
int sched_timeouts_tick(sched_t *s);

/* One pass of the lost-worker controller (scheduler_lost.c). */
int sched_lost_tick(sched_t *s);

#endif
