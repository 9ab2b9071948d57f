/* The timeout and idleness controller (scheduler.h): once per tick, the sandboxes whose deadline
 * passed (running or paused; timeout_at, moved by the log's reducer at start, resume and
 * SandboxTimeoutRequested) get their on_timeout intent (delete or suspend), and running ones
 * without activity (commands, file changes; last_activity_at) for their idle_suspend_s (or the
 * platform default) get a suspend. The intents go to the sandbox's worker with message ids made
 * of the sandbox and the deadline or activity time they answer, so several schedulers, or one
 * that restarts, ask once: everything comes from the projection, nothing from memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "reduce.h"
#include "scheduler.h"

#define TICK_LIMIT 100 /* sandboxes acted on per query and tick */

static int ask(sched_t *s, const char *id, const char *tenant, const char *worker, bool suspend,
               const char *why, const char *key_time)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SandboxDeleteRequested del = SPACE__V1__SANDBOX_DELETE_REQUESTED__INIT;
    Space__V1__SandboxSuspendRequested sus = SPACE__V1__SANDBOX_SUSPEND_REQUESTED__INIT;
    char event_id[37], msg_id[160], corr[64];
    agg.kind = "sandbox";
    agg.id = (char *)id;
    env.aggregate = &agg;
    env.tenant = (char *)tenant;
    env.actor = "svc:scheduler";
    snprintf(corr, sizeof(corr), "%s-%s", why, key_time);
    env.correlation_id = corr;
    if (suspend) {
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED;
        env.sandbox_suspend_requested = &sus;
    } else {
        del.reason = (char *)why;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED;
        env.sandbox_delete_requested = &del;
    }
    snprintf(msg_id, sizeof(msg_id), "%s:%s:%s", why, id, key_time);
    int rc = sp_publish_event(s->bus, &env, event_id, worker[0] ? worker : NULL, msg_id, NULL);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot ask", SP_KS("sandbox", id), SP_KS("why", why),
               SP_KS("error", sp_strerror(rc)));
    else
        sched_metrics_action(s, strcmp(why, "idle") == 0 ? "idle_suspend"
                                : suspend                ? "timeout_suspend"
                                                         : "timeout_delete");
    if (rc >= 0)
        sp_log(SP_LOG_INFO, suspend ? "suspend asked" : "delete asked", SP_KS("sandbox", id),
               SP_KS("why", why));
    return rc;
}

int sched_timeouts_tick(sched_t *s)
{
    char idle[32], grain[16];
    snprintf(idle, sizeof(idle), "%lld", (long long)s->cfg->idle_suspend_s);
    snprintf(grain, sizeof(grain), "%d", SP_ACTIVITY_GRAIN_S);
    const char *p[2] = {idle, grain};
    /* Deadlines passed. */
    PGresult *r = PQexec(s->db, "SELECT id, tenant, coalesce(worker, ''), on_timeout,"
                                " (extract(epoch FROM timeout_at) * 1000000)::int8"
                                " FROM sandboxes WHERE state IN ('running', 'paused')"
                                " AND timeout_at < now() ORDER BY timeout_at LIMIT 100");
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    for (int i = 0; rc == 0 && i < PQntuples(r); i++)
        (void)ask(s, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
                  strcmp(PQgetvalue(r, i, 3), "suspend") == 0, "timeout", PQgetvalue(r, i, 4));
    PQclear(r);
    if (rc < 0)
        return rc;
    /* Idle: running, and nothing happened in it for its (or the default) idle time. The
     * recorded activity may be up to a step older than the last (SP_ACTIVITY_GRAIN_S): the
     * step is added, so that no sandbox is suspended early. */
    r = PQexecParams(s->db,
                     "SELECT id, tenant, coalesce(worker, ''),"
                     " (extract(epoch FROM last_activity_at) * 1000000)::int8"
                     " FROM sandboxes WHERE state = 'running' AND last_activity_at IS NOT NULL"
                     " AND last_activity_at < now() - make_interval(secs => CASE WHEN"
                     " idle_suspend_s > 0 THEN idle_suspend_s ELSE $1::int END + $2::int)"
                     " ORDER BY last_activity_at LIMIT 100",
                     2, NULL, p, NULL, NULL, 0);
    rc = sp_db_check(r, PGRES_TUPLES_OK);
    for (int i = 0; rc == 0 && i < PQntuples(r); i++)
        (void)ask(s, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), true, "idle",
                  PQgetvalue(r, i, 3));
    PQclear(r);
    return rc;
}
