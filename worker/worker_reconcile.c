/* Start-up reconciliation: the log (the sandboxes projection) says what this worker owns; the
 * host says what exists. Running in both: adopted. Live in the log but not running here: lost
 * (its leftovers released, SandboxFailed). On the host but dead in the log (or unknown to it):
 * released. A sandbox placed but not started yet is left alone: its SandboxPlaced was never
 * acknowledged and comes back, and the create runs then. A sandbox caught in a suspend ends
 * either suspended (the checkpoint wrote its image: the suspend is completed) or running
 * (SandboxSuspendFailed), never in between. One caught in a resume is adopted when the restore
 * had finished, else resumed again from its placement (wk_take_placements). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bus.h"
#include "daemon.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "reduce.h"
#include "worker.h"
#include "xmalloc.h"

typedef struct {
    char **v;
    size_t n;
} idlist_t;

static void idlist_add(idlist_t *l, const char *id)
{
    l->v = sp_xreallocarray(l->v, l->n + 1, sizeof(char *));
    l->v[l->n++] = sp_xstrdup(id);
}

static void idlist_free(idlist_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
}

int wk_publish_restart_fact(wk_t *w, const char *tenant, const char *sbx, const char *what,
                            sp_envelope_t *env, Space__V1__Aggregate *agg)
{
    char id[37], msg_id[128];
    agg->kind = "sandbox";
    agg->id = (char *)sbx;
    env->aggregate = agg;
    env->tenant = (char *)tenant;
    env->actor = "svc:worker";
    /* One per sandbox and worker start: the host's boot-unique pid is not stable, the time is. */
    snprintf(msg_id, sizeof(msg_id), "%s:%s:%lld", what, sbx, (long long)(sp_now_us() / 1000000));
    return sp_publish_event_retry(w->bus, env, id, w->cfg->id, msg_id, SP_PUBLISH_FACT_BUDGET_MS);
}

#define RECONCILED_PER_EVENT 256

static size_t slice(const idlist_t *l, size_t off, char ***ret)
{
    *ret = off < l->n ? l->v + off : NULL;
    size_t left = off < l->n ? l->n - off : 0;
    return left < RECONCILED_PER_EVENT ? left : RECONCILED_PER_EVENT;
}

static int publish_reconciled(wk_t *w, const idlist_t *adopted, const idlist_t *lost,
                              const idlist_t *cleaned, size_t off)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__WorkerReconciled rec = SPACE__V1__WORKER_RECONCILED__INIT;
    char id[37];

    agg.kind = "worker";
    agg.id = w->cfg->id;
    env.aggregate = &agg;
    env.actor = "svc:worker";
    rec.worker = w->cfg->id;
    rec.n_adopted = slice(adopted, off, &rec.adopted);
    rec.n_lost = slice(lost, off, &rec.lost);
    rec.n_cleaned = slice(cleaned, off, &rec.cleaned);
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_WORKER_RECONCILED;
    env.worker_reconciled = &rec;
    return sp_publish_event(w->bus, &env, id, NULL, NULL, NULL);
}

/* How long a start waits for the log to store what the stream holds: past the 30 s or more an
 * event log can take to recreate its consumer after a NATS node died (docs/operations.md), and
 * well inside the scheduler's worker-lost-s. No heartbeat goes out meanwhile, so nothing is
 * placed here; and while the log is behind, no answer a client waits for is stored anyway. */
#define LOG_CATCH_UP_MS 120000

/* Waits, bounded, until the log has stored every message the stream held when this worker
 * started, its previous process's facts among them. Reconciled against an older projection, a
 * sandbox whose SandboxStarted was still on its way when the host went down was taken for
 * placed (left to its placement, which then found it answered): nobody recorded it lost, and
 * the log said it ran on a host that did not have it (integration.cluster, 2026-12: the log
 * 40 messages and more than 15 s behind after a NATS node's death). */
static void wait_for_log(wk_t *w, PGconn *db)
{
    uint64_t last = 0, head = 0;
    int rc = sp_bus_stream_info(w->bus, &last, NULL);
    if (rc < 0) {
        sp_log(SP_LOG_WARN,
               "cannot read the stream's last sequence: reconciling with the log as is",
               SP_KS("error", sp_strerror(rc)));
        return;
    }
    int64_t t0 = sp_mono_ns(), said = t0;
    while ((rc = sp_db_log_head(db, &head)) == 0 && head < last && !sp_daemon_stopping) {
        int64_t now = sp_mono_ns();
        if (now - t0 > LOG_CATCH_UP_MS * 1000000LL) {
            sp_log(SP_LOG_WARN, "the log is behind the stream: reconciling with it as is",
                   SP_KU("log_head", head), SP_KU("stream_last", last));
            return;
        }
        if (now - said > 10000000000LL) {
            sp_log(SP_LOG_INFO, "waiting for the log to store the stream before reconciling",
                   SP_KU("log_head", head), SP_KU("stream_last", last));
            said = now;
        }
        sp_daemon_sleep_ms(100);
    }
    if (rc == 0 && sp_mono_ns() - t0 > 100000000LL)
        sp_log(SP_LOG_INFO, "waited for the log to store the stream",
               SP_KU("ms", (uint64_t)((sp_mono_ns() - t0) / 1000000)), SP_KU("seq", last));
}

int wk_reconcile(wk_t *w, PGconn *db)
{
    wk_host_sandbox_t *host = NULL;
    size_t n_host = 0;
    idlist_t adopted = {0}, lost = {0}, cleaned = {0};
    int rc;

    wait_for_log(w, db);
    if ((rc = wk_host_scan(w->host, &host, &n_host)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot scan the host", SP_KS("error", sp_strerror(rc)));
        return rc;
    }
    const char *params[1] = {w->cfg->id};
    PGresult *r = PQexecParams(db,
                               "SELECT id, tenant, state, vcpu, memory_mb, template FROM "
                               "sandboxes WHERE worker = $1 AND state NOT IN ('deleted', "
                               "'failed', 'suspended')",
                               1, NULL, params, NULL, NULL, 0);
    if ((rc = sp_db_check(r, PGRES_TUPLES_OK)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot read the projection", SP_KS("error", PQerrorMessage(db)));
        PQclear(r);
        free(host);
        return rc;
    }

    for (int i = 0; i < PQntuples(r); i++) {
        const char *sbx = PQgetvalue(r, i, 0), *tenant = PQgetvalue(r, i, 1);
        sp_sbx_state_t state = sp_sbx_state_from_name(PQgetvalue(r, i, 2));
        wk_state_t hs = WK_ABSENT;
        for (size_t k = 0; k < n_host; k++)
            if (strcmp(host[k].id, sbx) == 0)
                hs = host[k].state;
        if (state == SP_SBX_PLACED || state == SP_SBX_REQUESTED)
            continue; /* its placement will be redelivered */
        if (state == SP_SBX_SUSPENDING) {
            /* A suspend the previous worker began: completed when its checkpoint wrote an
             * image (the sandbox is then suspended), else the sandbox is as runsc says. */
            int done = wk_suspend_complete(w, db, sbx, PQgetvalue(r, i, 5));
            if (done < 0) {
                rc = done;
                goto out;
            }
            if (done == 1) {
                idlist_add(&cleaned, sbx);
                continue;
            }
            if ((hs == WK_RUNNING || hs == WK_PAUSED) && wk_sandbox_running(w->host, sbx) != 1)
                hs = WK_STOPPED; /* the checkpoint it waited for stopped it, and failed */
        }
        if (state == SP_SBX_RESUMING) {
            /* A resume the previous worker began: finished (it runs), or its leftovers
             * released and done again from its placement (wk_take_placements). */
            int done =
                wk_resume_after_restart(w, db, sbx, tenant, hs == WK_RUNNING || hs == WK_PAUSED);
            if (done < 0) {
                rc = done;
                goto out;
            }
            if (done == 0) {
                idlist_add(&cleaned, sbx);
                continue;
            }
        }
        /* Stopped by a named snapshot's checkpoint when the previous worker died: restored
         * in place from it, and owned again (by the restore). */
        bool recovered = false;
        if (state == SP_SBX_RUNNING) {
            recovered = wk_snapshot_recover(w, sbx, tenant, PQgetvalue(r, i, 5),
                                            (uint32_t)strtoul(PQgetvalue(r, i, 3), NULL, 10),
                                            (uint32_t)strtoul(PQgetvalue(r, i, 4), NULL, 10),
                                            hs == WK_RUNNING || hs == WK_PAUSED) == 1;
            if (recovered)
                hs = WK_RUNNING;
        }
        sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
        Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
        if ((hs == WK_RUNNING || hs == WK_PAUSED) && state == SP_SBX_SUSPENDING) {
            /* The previous worker died in a suspend before the checkpoint stopped the
             * sandbox: it goes on running, and the intent is answered so (its client hears
             * it; redelivered, it is not acted on: docs/faults.md, step 6). Acted on again,
             * its facts would carry the first attempt's message ids: the stream would drop
             * its SandboxSuspending and the log refuse its SandboxSuspended. */
            Space__V1__SandboxSuspendFailed sf = SPACE__V1__SANDBOX_SUSPEND_FAILED__INIT;
            sf.reason = "worker_restarted";
            sf.detail = "the worker stopped during the suspend; the sandbox kept running";
            sf.state = hs == WK_PAUSED ? "paused" : "running";
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_FAILED;
            env.sandbox_suspend_failed = &sf;
            sp_envelope_t *intent = NULL;
            if (sp_db_last_sandbox_event(db, sbx, "SandboxSuspendRequested", &intent) == 0) {
                env.causation_id = intent->event_id;
                env.correlation_id = intent->correlation_id;
            }
            rc = wk_publish_restart_fact(w, tenant, sbx, "suspend-failed", &env, &agg);
            sp_envelope_free(intent);
            if (rc < 0)
                goto out;
            env = (sp_envelope_t)SPACE__V1__ENVELOPE__INIT;
        }
        if (hs == WK_RUNNING || hs == WK_PAUSED) {
            /* The agent's pipes died with the previous worker: it connects back to the
             * sandbox's channel socket (worker_chan.c); until then commands are refused
             * ("agent_unavailable"). */
            wk_box_t *box = recovered
                                ? NULL
                                : wk_owned_add(w, sbx, tenant, PQgetvalue(r, i, 5),
                                               (uint32_t)strtoul(PQgetvalue(r, i, 3), NULL, 10),
                                               (uint32_t)strtoul(PQgetvalue(r, i, 4), NULL, 10));
            if (box) {
                pthread_mutex_lock(&box->mu);
                snprintf(box->lost_why, sizeof(box->lost_why), "the worker restarted");
                box->paused = hs == WK_PAUSED;
                pthread_mutex_unlock(&box->mu);
                wk_box_listen(box);
            }
            wk_box_put(box);
            /* The chains were rebuilt at open; the element normally survived in the set,
             * and re-adding it is idempotent (it is what lets the sandbox talk at all). */
            char nerr[WK_ERR_MAX] = "";
            if (!recovered && wk_sandbox_net_restore(w->host, sbx, nerr) < 0)
                sp_log(SP_LOG_ERROR, "cannot restore the sandbox firewall: it stays cut off",
                       SP_KS("sandbox", sbx), SP_KS("error", nerr));
            Space__V1__SandboxAdopted ad = SPACE__V1__SANDBOX_ADOPTED__INIT;
            ad.worker = w->cfg->id;
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_ADOPTED;
            env.sandbox_adopted = &ad;
            if ((rc = wk_publish_restart_fact(w, tenant, sbx, "adopted", &env, &agg)) < 0 ||
                (rc = wk_commands_reconcile(w, db, tenant, sbx)) < 0)
                goto out;
            idlist_add(&adopted, sbx);
            continue;
        }
        char err[WK_ERR_MAX] = "";
        if (hs != WK_ABSENT && (rc = wk_sandbox_destroy(w->host, sbx, err)) < 0) {
            sp_log(SP_LOG_ERROR, "cannot release a lost sandbox", SP_KS("sandbox", sbx),
                   SP_KS("error", err));
            goto out;
        }
        Space__V1__SandboxFailed failed = SPACE__V1__SANDBOX_FAILED__INIT;
        failed.reason = "lost";
        failed.detail = hs == WK_ABSENT ? "gone from the host after a worker restart"
                                        : "not running after a worker restart; released";
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED;
        env.sandbox_failed = &failed;
        if ((rc = wk_publish_restart_fact(w, tenant, sbx, "lost", &env, &agg)) < 0 ||
            (rc = wk_commands_reconcile(w, db, tenant, sbx)) < 0)
            goto out;
        idlist_add(&lost, sbx);
    }
    /* Whatever the host has that the log does not hold live. Unclaimed pooled sandboxes of
     * the previous process are not in the log at all (claimed ones are scanned under their
     * sandbox ids): released too, and not reported as sandboxes. */
    size_t pool_released = 0;
    for (size_t k = 0; k < n_host; k++) {
        if (wk_pool_id_is(host[k].id)) {
            char err[WK_ERR_MAX] = "";
            if ((rc = wk_sandbox_destroy(w->host, host[k].id, err)) < 0) {
                sp_log(SP_LOG_ERROR, "cannot release a pooled sandbox",
                       SP_KS("pool_id", host[k].id), SP_KS("error", err));
                goto out;
            }
            pool_released++;
            continue;
        }
        int live = wk_owned_has(w, host[k].id);
        for (int i = 0; i < PQntuples(r) && !live; i++)
            live = strcmp(PQgetvalue(r, i, 0), host[k].id) == 0 &&
                   strcmp(PQgetvalue(r, i, 2), "placed") == 0;
        if (live)
            continue;
        int was_lost = 0;
        for (size_t i = 0; i < lost.n; i++)
            was_lost |= strcmp(lost.v[i], host[k].id) == 0;
        for (size_t i = 0; i < cleaned.n; i++)
            was_lost |= strcmp(cleaned.v[i], host[k].id) == 0; /* a suspend completed above */
        if (was_lost)
            continue;
        char err[WK_ERR_MAX] = "";
        if ((rc = wk_sandbox_destroy(w->host, host[k].id, err)) < 0) {
            sp_log(SP_LOG_ERROR, "cannot release an orphan", SP_KS("sandbox", host[k].id),
                   SP_KS("error", err));
            goto out;
        }
        idlist_add(&cleaned, host[k].id);
    }

    /* Lists are bounded per event (envelope.c): a large host reports in several. */
    for (size_t off = 0; off == 0 || off < adopted.n || off < lost.n || off < cleaned.n;
         off += RECONCILED_PER_EVENT) {
        if ((rc = publish_reconciled(w, &adopted, &lost, &cleaned, off)) < 0)
            goto out;
    }
    sp_log(SP_LOG_INFO, "reconciled", SP_KU("adopted", adopted.n), SP_KU("lost", lost.n),
           SP_KU("cleaned", cleaned.n), SP_KU("pool_released", pool_released));
out:
    PQclear(r);
    free(host);
    idlist_free(&adopted);
    idlist_free(&lost);
    idlist_free(&cleaned);
    return rc;
}
