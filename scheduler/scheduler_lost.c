/* The lost-worker controller (scheduler.h): a worker whose last heartbeat is older than
 * worker-lost-s is taken for gone with its host. Once per tick:
 * - the worker is marked stopped (WorkerStopped, reason "lost: ..."), so it is no longer
 *   listed as up;
 * - each of its live sandboxes gets the outcome it can still have: one being resumed there
 *   goes back to suspended (SandboxResumeFailed: its snapshot is in the store, it can resume
 *   elsewhere); any other (placed, running, paused, suspending: its memory and disk were on that
 *   host) fails with reason worker_lost and host_lost set, which leaves it on no worker, so its
 *   delete is answered by the scheduler.
 * A worker that comes back after that releases what is left on its host (its start-up
 * reconciliation: on the host but dead in the log). Message ids are made of the sandbox (or
 * worker) and the last heartbeat they answer, so several schedulers act once. */
#include <stdio.h>
#include <string.h>

#include "db.h"
#include "error.h"
#include "log.h"
#include "publish.h"
#include "scheduler.h"

static int fail_sandbox(sched_t *s, const char *id, const char *tenant, const char *worker,
                        const char *state, const char *hb_us, const char *detail)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SandboxFailed failed = SPACE__V1__SANDBOX_FAILED__INIT;
    Space__V1__SandboxResumeFailed resume = SPACE__V1__SANDBOX_RESUME_FAILED__INIT;
    char event_id[37], msg_id[160];
    agg.kind = "sandbox";
    agg.id = (char *)id;
    env.aggregate = &agg;
    env.tenant = (char *)tenant;
    env.actor = "svc:scheduler";
    bool resuming = strcmp(state, "resuming") == 0;
    if (resuming) {
        resume.reason = "worker_lost";
        resume.detail = (char *)detail;
        resume.worker = (char *)worker;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_FAILED;
        env.sandbox_resume_failed = &resume;
    } else {
        failed.reason = "worker_lost";
        failed.detail = (char *)detail;
        failed.host_lost = true;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED;
        env.sandbox_failed = &failed;
    }
    snprintf(msg_id, sizeof(msg_id), "lost:%s:%s", id, hb_us);
    int rc = sp_publish_event(s->bus, &env, event_id, worker, msg_id, NULL);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot record a sandbox of a lost worker", SP_KS("sandbox", id),
               SP_KS("worker", worker), SP_KS("error", sp_strerror(rc)));
    else
        sched_metrics_action(s, resuming ? "resume_lost" : "sandbox_lost");
    if (rc >= 0)
        sp_log(SP_LOG_WARN,
               resuming ? "resume given up: worker lost" : "sandbox lost with its worker",
               SP_KS("sandbox", id), SP_KS("worker", worker), SP_KS("state", state));
    return rc;
}

static int stop_worker(sched_t *s, const char *worker, const char *hb_us, const char *detail)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__WorkerStopped stopped = SPACE__V1__WORKER_STOPPED__INIT;
    char event_id[37], msg_id[160];
    agg.kind = "worker";
    agg.id = (char *)worker;
    env.aggregate = &agg;
    env.actor = "svc:scheduler";
    stopped.worker = (char *)worker;
    stopped.reason = (char *)detail;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_WORKER_STOPPED;
    env.worker_stopped = &stopped;
    snprintf(msg_id, sizeof(msg_id), "lost:%s:%s", worker, hb_us);
    int rc = sp_publish_event(s->bus, &env, event_id, NULL, msg_id, NULL);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot mark a lost worker", SP_KS("worker", worker),
               SP_KS("error", sp_strerror(rc)));
    else
        sched_metrics_action(s, "worker_lost");
    if (rc >= 0)
        sp_log(SP_LOG_WARN, "worker lost", SP_KS("worker", worker), SP_KS("detail", detail));
    return rc;
}

int sched_lost_tick(sched_t *s)
{
    char lost_s[32], detail[160];
    snprintf(lost_s, sizeof(lost_s), "%lld", (long long)s->cfg->worker_lost_s);
    const char *p[1] = {lost_s};
    PGresult *r = PQexecParams(s->db,
                               "SELECT id, (extract(epoch FROM last_heartbeat_at) * 1000000)::int8,"
                               " (extract(epoch FROM now() - last_heartbeat_at))::int8"
                               " FROM workers WHERE state = 'up' AND last_heartbeat_at <"
                               " now() - make_interval(secs => $1::int) LIMIT 100",
                               1, NULL, p, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    for (int i = 0; rc == 0 && i < PQntuples(r); i++) {
        snprintf(detail, sizeof(detail), "lost: no heartbeat for %s s", PQgetvalue(r, i, 2));
        (void)stop_worker(s, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), detail);
    }
    PQclear(r);
    if (rc < 0)
        return rc;
    /* Whatever state the worker is in (a clean stop leaves sandboxes running for the next
     * start to adopt): what counts is that nothing was heard from it for that long. */
    r = PQexecParams(s->db,
                     "SELECT s.id, s.tenant, s.worker, s.state,"
                     " (extract(epoch FROM w.last_heartbeat_at) * 1000000)::int8,"
                     " (extract(epoch FROM now() - w.last_heartbeat_at))::int8"
                     " FROM sandboxes s JOIN workers w ON w.id = s.worker"
                     " WHERE s.state IN ('placed', 'running', 'paused', 'suspending', 'resuming')"
                     " AND w.last_heartbeat_at < now() - make_interval(secs => $1::int)"
                     " ORDER BY w.last_heartbeat_at LIMIT 100",
                     1, NULL, p, NULL, NULL, 0);
    rc = sp_db_check(r, PGRES_TUPLES_OK);
    for (int i = 0; rc == 0 && i < PQntuples(r); i++) {
        snprintf(detail, sizeof(detail), "worker %s sent no heartbeat for %s s",
                 PQgetvalue(r, i, 2), PQgetvalue(r, i, 5));
        (void)fail_sandbox(s, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
                           PQgetvalue(r, i, 3), PQgetvalue(r, i, 4), detail);
    }
    PQclear(r);
    return rc;
}
