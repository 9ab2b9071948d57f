/* space-worker internals: the daemon around worker_runtime.h. */
#ifndef SPACE_WORKER_H
#define SPACE_WORKER_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "worker_runtime.h"

typedef struct {
    char *id;
    char *nats_url;
    char *pg_url;
    char *state_dir;
    char *volume_dir;
    int64_t image_mb;
    char *runsc;
    char *runsc_platform;
    char *net_prefix;
    char *templates;         /* comma-separated, prepared at start */
    int64_t vcpu_total;      /* 0: the host's CPUs */
    int64_t memory_mb_total; /* 0: the host's memory */
    int64_t heartbeat_ms;
    int64_t ack_wait_ms;
    int64_t batch_max;
    int64_t parallel; /* sandboxes created or deleted at once */
    bool teardown;
    char *log_level;
    char *log_format;
} wk_config_t;

/* A sandbox this worker owns. */
typedef struct {
    char id[65];
    uint32_t vcpu, memory_mb;
} wk_owned_t;

typedef struct {
    const wk_config_t *cfg;
    sp_bus_t *bus;
    wk_host_t *host;
    char hostname[256];
    uint32_t vcpu_total;
    uint64_t memory_mb_total;

    pthread_mutex_t mu; /* guards owned and templates */
    wk_owned_t *owned;
    size_t n_owned, cap_owned;
    char **templates;
    size_t n_templates;
} wk_t;

/* Compares what the log says this worker owns with what the host shows: adopts sandboxes
 * still running (SandboxAdopted), fails the ones that are gone (SandboxFailed "lost"),
 * releases host resources of sandboxes the log says are gone, and records it all in one
 * WorkerReconciled event. */
int wk_reconcile(wk_t *w, PGconn *db);

/* Consumes space.ev.sbx.<id>.> until *stop: creates, deletes, answers with facts. */
int wk_serve(wk_t *w, volatile int *stop);

/* Publishes one heartbeat. */
int wk_heartbeat(wk_t *w);

/* Owned-sandbox table (locks inside). */
int wk_owned_add(wk_t *w, const char *id, uint32_t vcpu, uint32_t memory_mb);
int wk_owned_remove(wk_t *w, const char *id);
int wk_owned_has(wk_t *w, const char *id);

#endif
