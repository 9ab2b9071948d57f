/* space-scheduler: places create intents on workers (scheduler_place.c). Consumes the
 * unplaced subjects, space.ev.sbx._.>, through a shared durable: run as many as you like,
 * each intent goes to one of them, and one that dies mid-placement leaves the intent to be
 * redelivered to another (placed once: see scheduler_place.c). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "busid.h"
#include "config.h"
#include "daemon.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "scheduler.h"

static const sp_cfg_opt_t options[] = {
    SP_BUSID_CFG_OPTS(sched_config_t, identity, creds_dir),
    SP_VERIFIER_CFG_OPTS(sched_config_t, verify_signatures, keyring_dir),
    SP_CFG_STR_OPT("nats-url", sched_config_t, nats_url, "nats://127.0.0.1:4222", "NATS URL(s)"),
    SP_CFG_STR_OPT("pg-url", sched_config_t, pg_url, "postgresql:///space", "PostgreSQL URI"),
    SP_CFG_STR_OPT("name", sched_config_t, name, "scheduler", "this instance's name (an id)"),
    SP_CFG_STR_OPT("durable", sched_config_t, durable, "scheduler",
                   "shared JetStream durable of all schedulers"),
    SP_CFG_INT_OPT("batch-max", sched_config_t, batch_max, 1, 1000, "64", "intents per fetch"),
    SP_CFG_INT_OPT("ack-wait-ms", sched_config_t, ack_wait_ms, 1000, 600000, "10000",
                   "redelivery of an intent whose scheduler died"),
    SP_CFG_INT_OPT("heartbeat-misses", sched_config_t, heartbeat_misses, 1, 100, "3",
                   "a worker is live while its last heartbeat is younger than this many intervals"),
    SP_CFG_INT_OPT("idle-suspend-s", sched_config_t, idle_suspend_s, 1, 2592000, "21600",
                   "a running sandbox without activity this long is suspended (per sandbox: "
                   "idle_suspend_s at create)"),
    SP_CFG_INT_OPT("controller-ms", sched_config_t, controller_ms, 100, 60000, "1000",
                   "how often timeouts, idleness and lost workers are checked"),
    SP_CFG_INT_OPT("worker-lost-s", sched_config_t, worker_lost_s, 2, 86400, "300",
                   "a worker without a heartbeat this long is lost: its sandboxes fail "
                   "(worker_lost), one being resumed there goes back to suspended"),
    SP_METRICS_CFG_OPTS(sched_config_t, metrics_addr, metrics_port_file),
    SP_CFG_STR_OPT("log-level", sched_config_t, log_level, "info", "debug|info|warn|error"),
    SP_CFG_STR_OPT("log-format", sched_config_t, log_format, "kv", "kv|json"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* The process's identity on the bus: lives as long as the process publishes. */
static sp_busid_t busid;

static int run(sched_t *s)
{
    sp_bus_consumer_t *c = NULL;
    char filter[64];
    /* The unplaced subjects, space.ev.sbx._.>; the durable is the operator's (`space up`). */
    int rc = sp_subject_build(filter, sizeof(filter), SP_SUBJ_EV_SBX, "_", NULL, NULL);
    if (rc >= 0)
        rc = sp_bus_consumer_bind(s->bus, s->cfg->durable, filter, (int)s->cfg->ack_wait_ms, &c);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot bind the consumer", SP_KS("error", sp_strerror(rc)));
        return rc;
    }
    sp_log(SP_LOG_INFO, "scheduling", SP_KS("name", s->cfg->name));
    int64_t next_tick = 0;
    while (!sp_daemon_stopping) {
        if (sp_mono_ns() >= next_tick) {
            if (PQstatus(s->db) != CONNECTION_OK)
                PQreset(s->db);
            (void)sched_timeouts_tick(s);
            (void)sched_lost_tick(s);
            next_tick = sp_mono_ns() + s->cfg->controller_ms * 1000000;
        }
        sp_bus_batch_t *b = NULL;
        int wait_ms = (int)((next_tick - sp_mono_ns()) / 1000000);
        rc = sp_bus_fetch(c, (size_t)s->cfg->batch_max, wait_ms < 10 ? 10 : wait_ms, &b);
        if (rc < 0) {
            sp_bus_batch_free(b);
            sp_daemon_sleep_ms(200);
            continue;
        }
        /* The answers to the whole batch go out as one signed burst (one Ed25519 signature
         * per SP_SIG_BATCH_DEFAULT answers instead of one each, docs/trust.md), in the order
         * decided; an intent is acknowledged only once the stream has acknowledged them all.
         * When they fail, nothing is acknowledged: the redelivered intents answer again under
         * the same message ids ("placed:<intent id>", ...), which the stream's duplicate
         * window drops for the answers that did get through. */
        sp_burst_t burst;
        size_t handled = 0;
        bool stop = false;
        sp_burst_init(&burst);
        s->burst = &burst;
        for (size_t i = 0; i < sp_bus_batch_len(b); i++) {
            if (PQstatus(s->db) != CONNECTION_OK)
                PQreset(s->db);
            if (sched_handle(s, sp_bus_batch_msg(b, i)) < 0) {
                /* Leave it (and the rest of the batch) for redelivery after ack_wait. */
                stop = true;
                break;
            }
            handled++;
        }
        s->burst = NULL;
        size_t answers = burst.n;
        rc = sp_burst_publish_async(s->bus, &burst);
        /* Even after a failed call, the ones before it are in flight: wait for them too. A
         * count of refused publishes is a failure like any other: acking the intents then
         * lost their placements for good (a create stuck `requested`, seen when a NATS node
         * died in integration.cluster). */
        int failed = answers ? sp_bus_publish_async_complete(s->bus, 0) : 0;
        if (rc == 0 && failed > 0)
            rc = SP_EBUS;
        else if (rc == 0 && failed < 0)
            rc = failed;
        sp_burst_dispose(&burst);
        if (rc < 0) {
            sp_log(SP_LOG_WARN, "answers not published; the intents will be redelivered",
                   SP_KU("answers", answers), SP_KS("error", sp_strerror(rc)));
            stop = true;
        } else {
            for (size_t i = 0; i < handled; i++)
                sp_bus_batch_ack_one(b, i);
        }
        sp_bus_batch_free(b);
        if (stop)
            sp_daemon_sleep_ms(500);
    }
    sp_bus_consumer_free(c);
    return 0;
}

int main(int argc, char **argv)
{
    sp_daemon_no_core(); /* before any secret is read */
    sched_config_t cfg = {0};
    sched_t s = {.cfg = &cfg};
    char *err = NULL;
    int argi = 0, code = 1, rc;
    sp_log_level_t level;
    sp_log_format_t format;
    sp_metrics_t *reg = sp_metrics_new();
    sp_metrics_server_t *msrv = NULL;

    if (sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err) < 0) {
        fprintf(stderr, "space-scheduler: %s\n", err ? err : "bad options");
        goto out;
    }
    if (argi < 0) {
        code = 0;
        goto out;
    }
    if (argi < argc || sp_log_level_parse(cfg.log_level, &level) < 0 ||
        sp_log_format_parse(cfg.log_format, &format) < 0 || !sp_id_valid(cfg.name)) {
        fprintf(stderr, "space-scheduler: bad arguments (see --help)\n");
        goto out;
    }
    sp_log_init("space-scheduler", level, format);
    sp_daemon_signals();

    char merr[SP_METRICS_ERR_MAX] = "bad metric families";
    if (sched_metrics_init(&s, reg) < 0 ||
        sp_metrics_serve(reg, "space-scheduler", cfg.metrics_addr, cfg.metrics_port_file, &msrv,
                         merr) < 0) {
        sp_log(SP_LOG_ERROR, "cannot serve metrics", SP_KS("error", merr));
        goto out;
    }

    sp_bus_opts_t bo = {.url = cfg.nats_url, .name = "space-scheduler", .timeout_ms = 30000};
    char iderr[SP_BUSID_ERR_MAX];
    if (sp_busid_setup(cfg.creds_dir, cfg.identity, "scheduler", &busid, &bo, iderr) < 0) {
        sp_log(SP_LOG_ERROR, "bad identity", SP_KS("error", iderr));
        goto out;
    }
    char verr[SP_VERIFIER_ERR_MAX];
    if (sp_verifier_new(cfg.verify_signatures, cfg.keyring_dir, cfg.creds_dir, 0, &s.verifier,
                        verr) < 0) {
        sp_log(SP_LOG_ERROR, "cannot check signatures", SP_KS("error", verr));
        goto out;
    }
    sp_log(sp_verifier_mode(s.verifier) == SP_VERIFY_ON ? SP_LOG_INFO : SP_LOG_WARN,
           sp_verifier_summary(s.verifier), SP_KS("keyring_dir", sp_verifier_dir(s.verifier)));
    if ((rc = sp_bus_connect(&bo, &s.bus)) < 0 || (rc = sp_bus_ensure_stream(s.bus)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot reach NATS", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    if ((rc = sp_db_connect(cfg.pg_url, "space-scheduler", 30000, &s.db)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot reach PostgreSQL", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    if ((rc = sp_db_migrate(s.db)) < 0) {
        sp_log(SP_LOG_ERROR, "schema migration failed", SP_KS("error", sp_strerror(rc)),
               SP_KS("detail", PQerrorMessage(s.db)));
        goto out;
    }
    run(&s);
    code = 0;
out:
    sp_metrics_server_free(msrv);
    sp_metrics_free(reg);
    free(s.recent);
    PQfinish(s.db);
    sp_bus_free(s.bus);
    sp_verifier_free(s.verifier);
    sp_busid_dispose(&busid);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return code;
}
