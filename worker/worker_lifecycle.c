/* Pause, resume, suspend (worker.h). The worker owns its sandboxes' state machine: an intent
 * it cannot carry out in the sandbox's current state is refused with SandboxRequestRejected
 * ("illegal_transition"), everything it does is a fact with its timing.
 *
 *   pause   runsc pause: processes, memory and connections stay; nothing runs.
 *   resume  of a paused sandbox: runsc resume.
 *   suspend SandboxSuspending; the agent channel is closed (commands keep running inside and
 *           are followed again after the resume); runsc checkpoint; the disk as a
 *           `btrfs send -p <template>` delta; both zstd-compressed into the snapshot store with
 *           their SHA-256; SandboxSuspended {artifacts} and only then every host resource is
 *           released. A checkpoint that fails leaves the sandbox running (SandboxSuspendFailed).
 *   resume  of a suspended sandbox: the scheduler places it (SandboxPlaced without a create
 *           request); SandboxResuming; every artifact's digest is checked against the recorded
 *           one before anything is made (SandboxResumeFailed "digest_mismatch" otherwise, the
 *           snapshot kept); runsc restore; the agent connects back on its channel socket;
 *           SandboxResumed. The snapshot is removed once the sandbox runs again.
 *
 * The artifacts go to the snapshot store (worker_snapstore.c: a shared directory, or a NATS
 * object-store bucket with a local cache) under <sandbox>/<snapshot>/<artifact>. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "contract.h"
#include "request.h"
#include "dataplane.pb-c.h"
#include "db.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "worker.h"
#include "xmalloc.h"

#define ARTIFACTS     2
#define AGENT_BACK_MS 5000 /* a resume waits this long for the agent's channel */
/* A restarted worker waits this long for a checkpoint its predecessor's runsc still writes. */
#define CHECKPOINT_WAIT_MS (5 * 60 * 1000)
#define EGRESS_RESET_MS    2000 /* space-egressd's answer to a reset */
#define RESET_SETTLE_MS    20

static const char *const ARTIFACT_NAMES[ARTIFACTS] = {"checkpoint.img.zst", "rootfs.btrfs.zst"};

static int64_t ms_since(int64_t t0_ns)
{
    return (sp_mono_ns() - t0_ns) / 1000000;
}

/* An intent refused: the sandbox's state does not allow it here and now. */
static int reject(wk_t *w, const sp_envelope_t *ev, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int reject(wk_t *w, const sp_envelope_t *ev, const char *reason, const char *fmt, ...)
{
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxRequestRejected rr = SPACE__V1__SANDBOX_REQUEST_REJECTED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    rr.request_type = (char *)ev->type;
    rr.reason = (char *)reason;
    rr.detail = detail;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED;
    env.sandbox_request_rejected = &rr;
    sp_log(SP_LOG_INFO, "intent refused", SP_KS("type", ev->type), SP_KS("sandbox", agg.id),
           SP_KS("reason", reason), SP_KS("detail", detail), SP_KS("corr", ev->correlation_id));
    return wk_publish_fact(w, &env, "rejected", ev->event_id);
}

/* runsc pause (pause) or resume of the box's sandbox. true once done, with the time it
 * took; false when the intent was refused instead (not on this worker, a resume of a sandbox
 * that is not paused, runsc failed), with the refusal's publish result in *ret_rc. Pausing a
 * paused sandbox is done at once. */
static bool switch_pause(wk_t *w, const sp_envelope_t *ev, bool pause, uint32_t *ret_ms,
                         int *ret_rc)
{
    const char *sbx = ev->aggregate->id;
    char err[WK_ERR_MAX] = "";
    wk_box_t *b = wk_owned_get(w, sbx);
    if (!b) {
        *ret_rc =
            reject(w, ev, "not_running", "sandbox %s does not run on worker %s", sbx, w->cfg->id);
        return false;
    }
    int64_t t0 = sp_mono_ns();
    pthread_mutex_lock(&b->mu);
    bool paused = b->paused;
    pthread_mutex_unlock(&b->mu);
    if (!pause && !paused) {
        wk_box_put(b);
        *ret_rc = reject(w, ev, "illegal_transition", "sandbox %s is running, not paused", sbx);
        return false;
    }
    if (paused != pause && wk_sandbox_pause(w->host, sbx, pause, err) < 0) {
        wk_box_put(b);
        sp_log(SP_LOG_WARN, pause ? "pause failed" : "resume failed", SP_KS("sandbox", sbx),
               SP_KS("error", err));
        *ret_rc = reject(w, ev, pause ? "pause_failed" : "resume_failed", "%s", err);
        return false;
    }
    pthread_mutex_lock(&b->mu);
    b->paused = pause;
    pthread_mutex_unlock(&b->mu);
    wk_box_put(b);
    *ret_ms = (uint32_t)ms_since(t0);
    sp_log(SP_LOG_INFO, pause ? "paused" : "resumed", SP_KS("sandbox", sbx), SP_KU("ms", *ret_ms));
    return true;
}

int wk_on_pause(wk_t *w, const sp_envelope_t *ev)
{
    int rc = 0;
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxPaused p = SPACE__V1__SANDBOX_PAUSED__INIT;
    if (!switch_pause(w, ev, true, &p.took_ms, &rc))
        return rc;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED;
    env.sandbox_paused = &p;
    return wk_publish_fact(w, &env, "paused", ev->event_id);
}

/* A resume intent on this worker's subject: the sandbox is here, paused. */
int wk_on_resume(wk_t *w, const sp_envelope_t *ev)
{
    int rc = 0;
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxResumed r = SPACE__V1__SANDBOX_RESUMED__INIT;
    if (!switch_pause(w, ev, false, &r.took_ms, &rc))
        return rc;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    r.worker = w->cfg->id;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED;
    env.sandbox_resumed = &r;
    return wk_publish_fact(w, &env, "resumed", ev->event_id);
}

/* The artifacts' store keys: <sandbox>/<snapshot>/<artifact>. */
static void artifact_keys(const char *sbx, const char *snap, char key[ARTIFACTS][256])
{
    for (int i = 0; i < ARTIFACTS; i++)
        snprintf(key[i], sizeof(key[i]), "%s/%s/%s", sbx, snap, ARTIFACT_NAMES[i]);
}

/* The snapshot id of a suspend's artifacts (their keys: artifact_keys) into snap, "" when they
 * do not have that form. */
static void snapshot_of_key(const Space__V1__SandboxSuspended *sd, const char *sbx,
                            char snap[SP_SANDBOX_ID_LEN + 1])
{
    snap[0] = '\0';
    size_t n = strlen(sbx);
    for (size_t i = 0; i < sd->n_artifacts; i++) {
        const char *k = sd->artifacts[i]->store_key;
        if (strncmp(k, sbx, n) != 0 || k[n] != '/')
            continue;
        const char *rest = k + n + 1, *slash = strchr(rest, '/');
        if (!slash || (size_t)(slash - rest) > SP_SANDBOX_ID_LEN ||
            strcmp(slash + 1, ARTIFACT_NAMES[1]) != 0)
            continue;
        snprintf(snap, SP_SANDBOX_ID_LEN + 1, "%.*s", (int)(slash - rest), rest);
        if (!sp_id_valid(snap))
            snap[0] = '\0';
    }
}

/* A suspend's keep_snap (wk_sandbox_checkpoint): its snapshot, unless kept-disk-s is 0. */
static const char *keep_disk(const wk_t *w, const char *snap)
{
    return w->cfg->kept_disk_s > 0 ? snap : NULL;
}

static void forget_snapshot(wk_t *w, const char *sbx, const char *snap)
{
    char key[ARTIFACTS][256];
    const char *keys[ARTIFACTS];
    artifact_keys(sbx, snap, key);
    for (int i = 0; i < ARTIFACTS; i++)
        keys[i] = key[i];
    wk_snap_forget(w, keys, ARTIFACTS);
}

/* ---- suspend ---- */

static int suspend_failed(wk_t *w, const sp_envelope_t *ev, wk_box_t *b, const char *reason,
                          const char *detail, bool paused)
{
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxSuspendFailed f = SPACE__V1__SANDBOX_SUSPEND_FAILED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    f.reason = (char *)reason;
    f.detail = (char *)detail;
    f.state = paused ? "paused" : "running";
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_FAILED;
    env.sandbox_suspend_failed = &f;
    sp_log(SP_LOG_WARN, "suspend failed", SP_KS("sandbox", b->id), SP_KS("reason", reason),
           SP_KS("detail", detail));
    return wk_publish_fact(w, &env, "suspend-failed", ev->event_id);
}

/* Asks this host's space-egressd to reset every TCP connection of the sandbox (and new ones
 * until it runs again): gVisor refuses to checkpoint a sandbox holding a TCP endpoint that is
 * not closed, and a refused checkpoint stops the sandbox for good. How many were reset; 0 when
 * no egressd answers (without one, sandbox TCP is dropped at the host: there is none).
 * *time_wait_ms: > 0 when egressd saw a close from both ends at once leave an endpoint of the
 * guest in TIME_WAIT, which no reset ends, for about that long. */
static uint32_t egress_reset(wk_t *w, const char *sbx, uint32_t *time_wait_ms)
{
    *time_wait_ms = 0;
    char subject[128];
    Space__Io__V1__EgressReset req = SPACE__IO__V1__EGRESS_RESET__INIT;
    req.sandbox = (char *)sbx;
    uint8_t buf[128], *reply = NULL;
    size_t len = space__io__v1__egress_reset__pack(&req, buf), reply_len = 0;
    int rc =
        sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_EGRESS_RST, w->cfg->id, NULL, NULL);
    if (rc >= 0)
        rc = sp_request_send(w->bus, subject, buf, len, EGRESS_RESET_MS, &reply, &reply_len);
    uint32_t n = 0;
    if (rc == 0) {
        Space__Io__V1__EgressResetReply *r =
            reply_len <= 64 ? space__io__v1__egress_reset_reply__unpack(NULL, reply_len, reply)
                            : NULL;
        n = r ? r->reset : 0;
        if (r) {
            *time_wait_ms = r->time_wait_ms;
            space__io__v1__egress_reset_reply__free_unpacked(r, NULL);
        }
    } else if (rc != SP_ENOTFOUND) {
        sp_log(SP_LOG_WARN, "space-egressd did not answer the reset before a checkpoint",
               SP_KS("sandbox", sbx), SP_KS("error", sp_strerror(rc)));
    }
    free(reply);
    if (n > 0)
        usleep(RESET_SETTLE_MS * 1000); /* the RSTs reach the guest's network stack */
    return n;
}

/* The checkpoint stopped the sandbox and it cannot come back: released, and failed. */
static int suspend_lost(wk_t *w, const sp_envelope_t *ev, const char *sbx, const char *detail)
{
    char e2[WK_ERR_MAX];
    (void)wk_sandbox_destroy(w->host, sbx, e2);
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxFailed f = SPACE__V1__SANDBOX_FAILED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    f.reason = "suspend_failed";
    f.detail = (char *)detail;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED;
    env.sandbox_failed = &f;
    return wk_publish_fact(w, &env, "failed", ev->event_id);
}

/* From a checkpoint in staging on: the artifacts into the store, SandboxSuspended recorded,
 * then every host resource released (a worker that dies in between leaves a suspended
 * sandbox whose leftovers the next reconcile cleans). staging is removed. */
static int suspend_store(wk_t *w, const sp_envelope_t *ev, const char *sbx, const char *snap,
                         wk_checkpoint_t *ck, const char *staging, uint32_t reset, int64_t t0)
{
    char err[WK_ERR_MAX] = "";
    Space__V1__SnapshotArtifact art[ARTIFACTS], *arts[ARTIFACTS];
    uint8_t sha[ARTIFACTS][SP_SHA256_LEN];
    char key[ARTIFACTS][256];
    const char *src[ARTIFACTS] = {ck->image_path, ck->rootfs_path};
    int rc = 0;
    artifact_keys(sbx, snap, key);
    for (int i = 0; i < ARTIFACTS && rc == 0; i++) {
        space__v1__snapshot_artifact__init(&art[i]);
        art[i].name = (char *)ARTIFACT_NAMES[i];
        art[i].store_key = key[i];
        art[i].sha256 = (ProtobufCBinaryData){SP_SHA256_LEN, sha[i]};
        rc = wk_snap_put(w, key[i], src[i], sha[i], &art[i].size, err);
        arts[i] = &art[i];
    }
    wk_rm_rf(staging);
    if (rc < 0) {
        forget_snapshot(w, sbx, snap);
        return suspend_lost(w, ev, sbx, err);
    }
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxSuspended sd = SPACE__V1__SANDBOX_SUSPENDED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    char store[WK_SNAP_STORE_MAX];
    wk_snap_store_name(w, store);
    sd.artifacts = arts;
    sd.n_artifacts = ARTIFACTS;
    sd.worker = w->cfg->id;
    sd.store = store;
    sd.took_ms = (uint32_t)ms_since(t0);
    sd.connections_reset = reset;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED;
    env.sandbox_suspended = &sd;
    rc = wk_publish_fact(w, &env, "suspended", ev->event_id);
    /* Before the release, which takes the checkpoint over (and clears it). */
    sp_log(SP_LOG_INFO, "suspended", SP_KS("sandbox", sbx), SP_KU("ms", sd.took_ms),
           SP_KU("image_bytes", art[0].size), SP_KU("rootfs_bytes", art[1].size),
           SP_KU("checkpoint_ms", ck->checkpoint_ms), SP_KU("rootfs_ms", ck->rootfs_ms),
           SP_KU("connections_reset", reset));
    /* In the background: a resume asked for now need not wait for it (wk_sandbox_restore's
     * host_id). */
    if (rc == 0 && wk_sandbox_release_checkpointed(w->host, sbx, ck, err) < 0)
        sp_log(SP_LOG_ERROR, "cannot release a suspended sandbox", SP_KS("sandbox", sbx),
               SP_KS("error", err));
    return rc;
}

int wk_on_suspend(wk_t *w, const sp_envelope_t *ev)
{
    const char *sbx = ev->aggregate->id;
    char err[WK_ERR_MAX] = "", snap[SP_SANDBOX_ID_LEN + 1];
    wk_box_t *b = wk_owned_get(w, sbx);
    if (!b)
        return reject(w, ev, "not_running", "sandbox %s does not run on worker %s", sbx,
                      w->cfg->id);
    int64_t t0 = sp_mono_ns();
    pthread_mutex_lock(&b->mu);
    bool paused = b->paused;
    pthread_mutex_unlock(&b->mu);

    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxSuspending sing = SPACE__V1__SANDBOX_SUSPENDING__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDING;
    env.sandbox_suspending = &sing;
    int rc = wk_publish_fact(w, &env, "suspending", ev->event_id);
    if (rc < 0) {
        wk_box_put(b);
        return rc;
    }
    /* A paused sandbox is resumed for its checkpoint (it comes back running). */
    if (paused && wk_sandbox_pause(w->host, sbx, false, err) < 0) {
        rc = suspend_failed(w, ev, b, "resume_failed", err, true);
        wk_box_put(b);
        return rc;
    }
    uint32_t time_wait_ms;
    uint32_t reset = egress_reset(w, sbx, &time_wait_ms);
    if (time_wait_ms > 0) {
        /* Refused before anything is taken down: commands and files carry on, and a sandbox
         * that was paused is paused again. */
        char e2[WK_ERR_MAX];
        bool repaused = paused && wk_sandbox_pause(w->host, sbx, true, e2) == 0;
        pthread_mutex_lock(&b->mu);
        b->paused = repaused;
        pthread_mutex_unlock(&b->mu);
        snprintf(err, sizeof(err),
                 "a TCP connection of the sandbox was closed from both ends at once: its end "
                 "inside stays in TIME_WAIT, which the checkpoint cannot save, for %u more s; "
                 "retry then",
                 (time_wait_ms + 999) / 1000);
        rc = suspend_failed(w, ev, b, "tcp_time_wait", err, repaused);
        wk_box_put(b);
        return rc;
    }
    /* The box leaves the table: no command, file call or agent listener from here on. The
     * commands keep running inside; after the resume the agent lists them again. */
    wk_box_t *owned = wk_owned_remove(w, sbx);
    wk_box_put(owned);
    wk_box_fail_files(b, "the sandbox is being suspended");
    wk_box_forget_commands(b);
    pthread_mutex_lock(&b->mu);
    wk_agent_t *agent = b->agent;
    b->agent = NULL;
    pthread_mutex_unlock(&b->mu);
    wk_agent_close(agent);

    sp_sandbox_id_new(snap);
    char *staging = sp_xasprintf("%s/.staging/%s-%s", w->cfg->snapshot_dir, sbx, snap);
    wk_checkpoint_t ck = {0};
    rc = wk_mkdir_p(staging) < 0 ? -errno : 0;
    if (rc < 0)
        snprintf(err, sizeof(err), "mkdir %s: %s", staging, strerror(-rc));
    else
        rc = wk_sandbox_checkpoint(w->host, sbx, b->template_, staging, keep_disk(w, snap), &ck,
                                   err);
    if (rc < 0) {
        wk_rm_rf(staging);
        free(staging);
        if (wk_sandbox_running(w->host, sbx) == 1) {
            /* Still there: take it back; its agent connects back. */
            wk_box_t *again = wk_owned_add(w, sbx, b->tenant, b->template_, b->vcpu, b->memory_mb);
            if (again) {
                wk_box_listen(again);
                wk_box_put(again);
            }
            rc = suspend_failed(w, ev, b, "checkpoint_failed", err, false);
        } else {
            rc = suspend_lost(w, ev, sbx, err);
        }
        wk_box_put(b);
        return rc;
    }

    rc = suspend_store(w, ev, sbx, snap, &ck, staging, reset, t0);
    wk_checkpoint_dispose(&ck);
    free(staging);
    wk_box_put(b);
    return rc;
}

int wk_suspend_complete(wk_t *w, PGconn *db, const char *sbx, const char *tmpl)
{
    /* Its staging directory: <snapshot-dir>/.staging/<sandbox>-<snapshot>. */
    char *dir = sp_xasprintf("%s/.staging", w->cfg->snapshot_dir), snap[SP_SANDBOX_ID_LEN + 1] = "";
    size_t n = strlen(sbx);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strncmp(e->d_name, sbx, n) == 0 && e->d_name[n] == '-' &&
            sp_id_valid(e->d_name + n + 1))
            snprintf(snap, sizeof(snap), "%s", e->d_name + n + 1);
    if (d)
        closedir(d);
    char *staging = snap[0] ? sp_xasprintf("%s/%s-%s", dir, sbx, snap) : NULL;
    free(dir);
    if (!staging)
        return 0; /* the checkpoint never began */
    int64_t t0 = sp_mono_ns();
    int done = 0, rc = 0;
    sp_envelope_t *ev = NULL;
    wk_checkpoint_t ck = {0};
    char err[WK_ERR_MAX] = "";
    if (wk_checkpoint_outcome(staging, CHECKPOINT_WAIT_MS) != 1 ||
        sp_db_last_sandbox_event(db, sbx, "SandboxSuspendRequested", &ev) < 0 ||
        ev->payload_case != SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED) {
        wk_rm_rf(staging); /* no image: the sandbox runs on, or it is lost */
        goto out;
    }
    sp_log(SP_LOG_INFO, "completing a suspend the previous worker began", SP_KS("sandbox", sbx),
           SP_KS("snapshot", snap));
    if (wk_sandbox_checkpoint_finish(w->host, sbx, tmpl, staging, keep_disk(w, snap), &ck, err) <
        0) {
        wk_rm_rf(staging);
        rc = suspend_lost(w, ev, sbx, err);
    } else {
        rc = suspend_store(w, ev, sbx, snap, &ck, staging, 0, t0);
    }
    done = 1;
out:
    wk_checkpoint_dispose(&ck);
    sp_envelope_free(ev);
    free(staging);
    return rc < 0 ? rc : done;
}

/* ---- resume of a suspended sandbox ---- */

typedef struct {
    char tenant[65], template_[65];
    uint32_t vcpu, memory_mb, disk_mb;
    sp_envelope_t *suspended; /* the newest SandboxSuspended */
} snapshot_info_t;

static int load_snapshot(wk_t *w, const char *sbx, snapshot_info_t *si, char err[WK_ERR_MAX])
{
    PGconn *db = NULL;
    int rc = sp_db_idle_take(w->db, 10000, &db);
    if (rc < 0) {
        snprintf(err, WK_ERR_MAX, "PostgreSQL: %s", sp_strerror(rc));
        return rc;
    }
    const char *p[1] = {sbx};
    PGresult *r = PQexecParams(db,
                               "SELECT tenant, template, vcpu, memory_mb, disk_mb FROM sandboxes"
                               " WHERE id = $1",
                               1, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0 || PQntuples(r) != 1) {
        snprintf(err, WK_ERR_MAX, "sandbox %s is not in the projection", sbx);
        rc = SP_ENOTFOUND;
        goto out;
    }
    snprintf(si->tenant, sizeof(si->tenant), "%s", PQgetvalue(r, 0, 0));
    snprintf(si->template_, sizeof(si->template_), "%s", PQgetvalue(r, 0, 1));
    si->vcpu = (uint32_t)strtoul(PQgetvalue(r, 0, 2), NULL, 10);
    si->memory_mb = (uint32_t)strtoul(PQgetvalue(r, 0, 3), NULL, 10);
    /* The limit it got when it started (0: the worker's default). */
    si->disk_mb = (uint32_t)strtoul(PQgetvalue(r, 0, 4), NULL, 10);
    PQclear(r);
    r = NULL;
    if (sp_db_last_sandbox_event(db, sbx, "SandboxSuspended", &si->suspended) < 0 ||
        si->suspended->payload_case != SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED) {
        snprintf(err, WK_ERR_MAX, "no readable SandboxSuspended for %s", sbx);
        rc = SP_ENOTFOUND;
        goto out;
    }
    rc = 0;
out:
    PQclear(r);
    sp_db_idle_give(w->db, db);
    return rc;
}

static int resume_failed(wk_t *w, const sp_envelope_t *ev, const char *reason, const char *detail)
{
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxResumeFailed f = SPACE__V1__SANDBOX_RESUME_FAILED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    f.reason = (char *)reason;
    f.detail = (char *)detail;
    f.worker = w->cfg->id;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_FAILED;
    env.sandbox_resume_failed = &f;
    sp_log(SP_LOG_WARN, "resume failed", SP_KS("sandbox", ev->aggregate->id),
           SP_KS("reason", reason), SP_KS("detail", detail));
    return wk_publish_fact(w, &env, "resume-failed", ev->event_id);
}

/* Every artifact, checked against its recorded digest: local paths of the two (heap); how many
 * had to be downloaded from the store into *ret_downloaded. */
static int fetch_artifacts(wk_t *w, const Space__V1__SandboxSuspended *sd, char *paths[ARTIFACTS],
                           int *ret_downloaded, char err[WK_ERR_MAX])
{
    *ret_downloaded = 0;
    for (int i = 0; i < ARTIFACTS; i++) {
        const Space__V1__SnapshotArtifact *a = NULL;
        for (size_t k = 0; k < sd->n_artifacts; k++)
            if (strcmp(sd->artifacts[k]->name, ARTIFACT_NAMES[i]) == 0)
                a = sd->artifacts[k];
        if (!a) {
            snprintf(err, WK_ERR_MAX, "artifact %s: missing from the snapshot record",
                     ARTIFACT_NAMES[i]);
            return -ENOENT;
        }
        bool downloaded = false;
        int rc =
            wk_snap_fetch(w, a->store_key, a->size, a->sha256.data, &paths[i], &downloaded, err);
        if (rc < 0)
            return rc;
        *ret_downloaded += downloaded;
    }
    return 0;
}

/* Waits (bounded) for the agent of b to connect back; whether it did. */
static bool agent_back(wk_box_t *b)
{
    bool back = false;
    for (int i = 0; i < AGENT_BACK_MS && !back; i++) {
        pthread_mutex_lock(&b->mu);
        back = b->agent != NULL && !b->agent_lost;
        pthread_mutex_unlock(&b->mu);
        if (!back)
            usleep(1000);
    }
    return back;
}

int wk_on_resume_placed(wk_t *w, const sp_envelope_t *ev, bool began)
{
    const char *sbx = ev->aggregate->id;
    char err[WK_ERR_MAX] = "";
    snapshot_info_t si = {0};
    char *paths[ARTIFACTS] = {0};
    int64_t t0 = sp_mono_ns();
    int rc;

    if (wk_owned_has(w, sbx))
        return 0; /* resumed before: a redelivery */
    if (load_snapshot(w, sbx, &si, err) < 0) {
        rc = resume_failed(w, ev, "no_snapshot", err);
        goto out;
    }
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxResuming ring = SPACE__V1__SANDBOX_RESUMING__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    ring.worker = w->cfg->id;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMING;
    env.sandbox_resuming = &ring;
    /* Begun by a previous process of this worker: the log says resuming already. */
    if (!began && (rc = wk_publish_fact(w, &env, "resuming", ev->event_id)) < 0)
        goto out;
    int downloaded = 0;
    int64_t t_fetch = sp_mono_ns();
    rc = fetch_artifacts(w, si.suspended->sandbox_suspended, paths, &downloaded, err);
    int64_t fetch_ms = ms_since(t_fetch);
    if (rc < 0) {
        rc = resume_failed(w, ev, rc == -EBADMSG ? "digest_mismatch" : "artifact_missing", err);
        goto out;
    }
    int64_t t_restore = sp_mono_ns();
    wk_box_t *b = wk_owned_add(w, sbx, si.tenant, si.template_, si.vcpu, si.memory_mb);
    if (!b) {
        rc = 0;
        goto out;
    }
    /* Suspended here moments ago: its release may still run, and the restore is made under
     * another host id meanwhile. */
    char hid[65];
    wk_sandbox_restore_host_id(w->host, sbx, hid);
    pthread_mutex_lock(&b->mu);
    b->restoring = true;
    snprintf(b->host_id, sizeof(b->host_id), "%s", hid);
    snprintf(b->lost_why, sizeof(b->lost_why), "the sandbox was suspended");
    pthread_mutex_unlock(&b->mu);
    wk_box_listen(b); /* before the restore: the agent connects back as soon as it runs */
    /* Suspended here: its disk may still be on this host (wk_sandbox_checkpoint's keep_snap). */
    char kept[SP_SANDBOX_ID_LEN + 1] = "";
    const Space__V1__SandboxSuspended *sd = si.suspended->sandbox_suspended;
    if (strcmp(sd->worker, w->cfg->id) == 0)
        snapshot_of_key(sd, sbx, kept);
    wk_sandbox_spec_t spec = {
        .id = sbx,
        .template_ = si.template_,
        .vcpu = si.vcpu,
        .memory_mb = si.memory_mb,
        .disk_mb = si.disk_mb,
        .kept_snap = kept[0] ? kept : NULL,
        .host_id = hid,
    };
    wk_sandbox_info_t info = {0};
    char *work = sp_xasprintf("%s/.staging/restore-%s", w->cfg->snapshot_dir, sbx);
    wk_mkdir_p(work);
    rc = wk_sandbox_restore(w->host, &spec, paths[0], paths[1], work, &info, err);
    wk_rm_rf(work);
    free(work);
    pthread_mutex_lock(&b->mu);
    b->restoring = false;
    b->host_id[0] = '\0'; /* linked: id resolves to it */
    pthread_mutex_unlock(&b->mu);
    if (rc < 0) {
        wk_box_put(wk_owned_remove(w, sbx));
        wk_box_put(b);
        rc = resume_failed(w, ev, "restore_failed", err);
        goto out;
    }
    /* Resumed means usable: wait (bounded) for the agent to connect back. */
    int64_t t_agent = sp_mono_ns();
    if (!agent_back(b))
        sp_log(SP_LOG_WARN, "resumed, but the agent has not connected back yet",
               SP_KS("sandbox", sbx));
    wk_box_put(b);
    Space__V1__SandboxResumed r = SPACE__V1__SANDBOX_RESUMED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    r.worker = w->cfg->id;
    r.took_ms = (uint32_t)ms_since(t0);
    r.address = info.address; /* a new netns: space-egressd learns the sandbox's source */
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED;
    env.sandbox_resumed = &r;
    /* Logged before the fact goes out: whoever reads the answer finds the line. */
    sp_log(SP_LOG_INFO, "resumed from suspend", SP_KS("sandbox", sbx), SP_KU("ms", r.took_ms),
           SP_KU("restore_ms", (uint64_t)ms_since(t_restore)), SP_KI("fetch_ms", fetch_ms),
           SP_KI("agent_wait_ms", ms_since(t_agent)), SP_KI("downloaded", downloaded),
           SP_KS("address", info.address), SP_KS("disk", info.disk_kept ? "kept" : "received"));
    rc = wk_publish_fact(w, &env, "resumed", ev->event_id);
    if (rc == 0) {
        /* It runs again: the snapshot has served (a new suspend makes a new one). */
        const char *keys[ARTIFACTS];
        size_t n = 0;
        for (size_t i = 0; i < sd->n_artifacts && n < ARTIFACTS; i++)
            keys[n++] = sd->artifacts[i]->store_key;
        wk_snap_forget(w, keys, n);
    }
out:
    for (int i = 0; i < ARTIFACTS; i++)
        free(paths[i]);
    sp_envelope_free(si.suspended);
    return rc;
}

int wk_resume_after_restart(wk_t *w, PGconn *db, const char *sbx, const char *tenant, bool alive)
{
    char err[WK_ERR_MAX] = "";
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    char *work = sp_xasprintf("%s/.staging/restore-%s", w->cfg->snapshot_dir, sbx);
    wk_rm_rf(work);
    free(work);
    char addr[16] = "";
    if (alive && wk_sandbox_address(w->host, sbx, addr, err) < 0) {
        sp_log(SP_LOG_WARN, "a restored sandbox without its address: released",
               SP_KS("sandbox", sbx), SP_KS("error", err));
        alive = false;
    }
    if (!alive) {
        /* The restore did not finish: its leftovers go. The sandbox stays resuming here and
         * its placement, taken from the log at start (wk_take_placements) or delivered
         * again, resumes it from the same snapshot and answers the intent: the client
         * waiting on it gets its sandbox, not a timeout. */
        (void)wk_sandbox_destroy(w->host, sbx, err);
        sp_log(SP_LOG_INFO, "a resume the previous worker began did not finish: done again",
               SP_KS("sandbox", sbx));
        return 0;
    }
    /* It runs: the restore finished before the worker died. */
    Space__V1__SandboxResumed r = SPACE__V1__SANDBOX_RESUMED__INIT;
    r.worker = w->cfg->id;
    r.address = addr;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED;
    env.sandbox_resumed = &r;
    int rc = wk_publish_restart_fact(w, tenant, sbx, "resumed", &env, &agg);
    if (rc < 0)
        return rc;
    sp_envelope_t *ev = NULL;
    if (sp_db_last_sandbox_event(db, sbx, "SandboxSuspended", &ev) == 0 &&
        ev->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED) {
        const Space__V1__SandboxSuspended *sd = ev->sandbox_suspended;
        const char *keys[ARTIFACTS];
        size_t n = 0;
        for (size_t i = 0; i < sd->n_artifacts && n < ARTIFACTS; i++)
            keys[n++] = sd->artifacts[i]->store_key;
        wk_snap_forget(w, keys, n);
    }
    sp_envelope_free(ev);
    sp_log(SP_LOG_INFO, "a resume the previous worker began had finished", SP_KS("sandbox", sbx),
           SP_KS("address", addr));
    return 1;
}

/* ---- named snapshots (docs/snapshots.md) ---- */

/* The artifacts' store keys of a named snapshot: named/<snapshot>/<artifact>. */
static void named_keys(const char *snap, char key[ARTIFACTS][256])
{
    for (int i = 0; i < ARTIFACTS; i++)
        snprintf(key[i], sizeof(key[i]), SP_SNAPSHOT_KEY_PREFIX "/%s/%s", snap, ARTIFACT_NAMES[i]);
}

/* A named snapshot's staging directory names the sandbox it is of in this file, so that a
 * restarted worker knows which sandbox a checkpoint left stopped. */
#define STAGING_OWNER "sandbox"

static int staging_mark(const char *staging, const char *sbx)
{
    char *path = sp_xasprintf("%s/" STAGING_OWNER, staging);
    FILE *f = fopen(path, "we");
    int rc = f && fputs(sbx, f) >= 0 ? 0 : -errno;
    if (f && fclose(f) != 0 && rc == 0)
        rc = -errno;
    free(path);
    return rc < 0 ? rc : 0;
}

/* A named snapshot's artifacts in this worker's snapshot directory (the taker's, or a copy a
 * create fetched) name the sandbox it is of the same way, so that the sweep can ask the log
 * whether it was deleted (wk_snap_sweep): the delete may have been done by another worker
 * while this one was away (docs/snapshots.md, "A taker that is gone"). */
static void named_mark(wk_t *w, const char *snap, const char *sbx)
{
    char *dir = sp_xasprintf("%s/" SP_SNAPSHOT_KEY_PREFIX "/%s", w->cfg->snapshot_dir, snap);
    int rc = staging_mark(dir, sbx);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot mark a named snapshot's directory: never swept",
               SP_KS("dir", dir), SP_KS("error", strerror(-rc)));
    free(dir);
}

/* A named snapshot's artifacts gone from this worker and the store, its directory with them. */
static void named_forget(wk_t *w, const char *snap)
{
    char key[ARTIFACTS][256];
    named_keys(snap, key);
    const char *keys[ARTIFACTS] = {key[0], key[1]};
    wk_snap_forget(w, keys, ARTIFACTS);
    char *dir = sp_xasprintf("%s/" SP_SNAPSHOT_KEY_PREFIX "/%s", w->cfg->snapshot_dir, snap);
    wk_rm_rf(dir);
    free(dir);
}

/* The staging directory of an unfinished named snapshot of sbx (heap), and its snapshot id;
 * NULL when there is none. */
static char *staging_of(wk_t *w, const char *sbx, char snap[SP_SNAPSHOT_ID_LEN + 1])
{
    char *dir = sp_xasprintf("%s/.staging", w->cfg->snapshot_dir), *found = NULL;
    const size_t plen = strlen(SP_SNAPSHOT_KEY_PREFIX "-");
    DIR *d = opendir(dir);
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        if (strncmp(e->d_name, SP_SNAPSHOT_KEY_PREFIX "-", plen) != 0 ||
            !sp_snapshot_id_valid(e->d_name + plen))
            continue;
        char *owner = sp_xasprintf("%s/%s/" STAGING_OWNER, dir, e->d_name), line[80] = "";
        FILE *f = fopen(owner, "re");
        if (f) {
            if (!fgets(line, sizeof(line), f))
                line[0] = '\0';
            fclose(f);
        }
        free(owner);
        if (strcmp(line, sbx) == 0) {
            found = sp_xasprintf("%s/%s", dir, e->d_name);
            snprintf(snap, SP_SNAPSHOT_ID_LEN + 1, "%s", e->d_name + plen);
        }
    }
    if (d)
        closedir(d);
    free(dir);
    return found;
}

/* The sandbox's disk limit as it started (0: the worker's default). */
static uint32_t sandbox_disk_mb(wk_t *w, const char *sbx)
{
    PGconn *db = NULL;
    uint32_t mb = 0;
    if (sp_db_idle_take(w->db, 10000, &db) < 0)
        return 0;
    const char *p[1] = {sbx};
    PGresult *r =
        PQexecParams(db, "SELECT disk_mb FROM sandboxes WHERE id = $1", 1, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) == 0 && PQntuples(r) == 1)
        mb = (uint32_t)strtoul(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    sp_db_idle_give(w->db, db);
    return mb;
}

/* A copy (fork, or a sandbox made from a named snapshot) was restored with its source's
 * kernel, hostname included: it takes its own before anything of it runs (proto/agent.proto,
 * Claim). A source whose agent had no CAP_SYS_ADMIN (made before it was given) cannot: its
 * copies keep the source's hostname, which is logged, not a failure. */
static void copy_identity(wk_box_t *b, const wk_sandbox_spec_t *spec)
{
    char err[WK_ERR_MAX] = "";
    pthread_mutex_lock(&b->mu);
    wk_agent_t *a = b->agent_lost ? NULL : b->agent;
    pthread_mutex_unlock(&b->mu);
    int rc = a ? wk_agent_claim(a, spec->id, AGENT_BACK_MS, err) : -EPIPE;
    if (rc < 0)
        sp_log(SP_LOG_WARN, "a copy keeps its source's hostname", SP_KS("sandbox", spec->id),
               SP_KS("source", spec->image_of), SP_KS("code", sp_strerror(rc)),
               SP_KS("error", err));
}

/* Makes sandbox spec->id from the artifacts at paths (image, rootfs) and owns it: the box is
 * in the owned table, listening for its agent. *ret_info has its address. */
static int restore_owned(wk_t *w, const wk_sandbox_spec_t *spec, const char *tenant,
                         char *const paths[ARTIFACTS], wk_sandbox_info_t *ret_info,
                         char err[WK_ERR_MAX])
{
    wk_box_t *b = wk_owned_add(w, spec->id, tenant, spec->template_, spec->vcpu, spec->memory_mb);
    if (!b) {
        snprintf(err, WK_ERR_MAX, "sandbox %s is owned already", spec->id);
        return -EEXIST;
    }
    pthread_mutex_lock(&b->mu);
    b->restoring = true;
    snprintf(b->lost_why, sizeof(b->lost_why), "the sandbox was restored from a snapshot");
    pthread_mutex_unlock(&b->mu);
    wk_box_listen(b); /* before the restore: the agent connects back as soon as it runs */
    char *work = sp_xasprintf("%s/.staging/restore-%s", w->cfg->snapshot_dir, spec->id);
    wk_mkdir_p(work);
    int rc = wk_sandbox_restore(w->host, spec, paths[0], paths[1], work, ret_info, err);
    wk_rm_rf(work);
    free(work);
    pthread_mutex_lock(&b->mu);
    b->restoring = false;
    pthread_mutex_unlock(&b->mu);
    if (rc < 0) {
        wk_box_put(wk_owned_remove(w, spec->id));
        wk_box_put(b);
        return rc;
    }
    if (!agent_back(b))
        sp_log(SP_LOG_WARN, "restored, but the agent has not connected back yet",
               SP_KS("sandbox", spec->id));
    else if (spec->image_of && strcmp(spec->image_of, spec->id) != 0)
        copy_identity(b, spec);
    wk_box_put(b);
    return 0;
}

int wk_on_snapshot(wk_t *w, const sp_envelope_t *ev)
{
    const Space__V1__SandboxSnapshotRequested *req = ev->sandbox_snapshot_requested;
    const char *sbx = ev->aggregate->id, *snap = req->snapshot_id;
    char err[WK_ERR_MAX] = "", key[ARTIFACTS][256];
    named_keys(snap, key);
    {
        /* A redelivery after the snapshot was stored: done. */
        char *dir = sp_xasprintf("%s/" SP_SNAPSHOT_KEY_PREFIX "/%s", w->cfg->snapshot_dir, snap);
        bool done = access(dir, F_OK) == 0;
        free(dir);
        if (done)
            return 0;
    }
    wk_box_t *b = wk_owned_get(w, sbx);
    if (!b)
        return reject(w, ev, "not_running", "sandbox %s does not run on worker %s", sbx,
                      w->cfg->id);
    int64_t t0 = sp_mono_ns();
    pthread_mutex_lock(&b->mu);
    bool paused = b->paused;
    pthread_mutex_unlock(&b->mu);
    if (paused) {
        wk_box_put(b);
        return reject(w, ev, "illegal_transition", "sandbox %s is paused: resume it first", sbx);
    }
    uint32_t time_wait_ms;
    uint32_t reset = egress_reset(w, sbx, &time_wait_ms);
    if (time_wait_ms > 0) {
        wk_box_put(b);
        return reject(w, ev, "tcp_time_wait",
                      "a TCP connection of the sandbox was closed from both ends at once: its "
                      "end inside stays in TIME_WAIT, which the checkpoint cannot save, for %u "
                      "more s; retry then",
                      (time_wait_ms + 999) / 1000);
    }
    /* The box goes (wk_box_put below) before the restore: spec holds copies, not pointers
     * into it. */
    char template_[sizeof(b->template_)];
    snprintf(template_, sizeof(template_), "%s", b->template_);
    wk_sandbox_spec_t spec = {.id = sbx,
                              .template_ = template_,
                              .vcpu = b->vcpu,
                              .memory_mb = b->memory_mb,
                              .disk_mb = sandbox_disk_mb(w, sbx)};
    char tenant[65];
    snprintf(tenant, sizeof(tenant), "%s", b->tenant);
    /* As for a suspend: out of the table, the agent channel closed (the checkpoint cannot
     * hold it); the commands run on inside, and the agent connects back after the restore. */
    wk_box_t *owned = wk_owned_remove(w, sbx);
    wk_box_put(owned);
    wk_box_fail_files(b, "the sandbox is being snapshotted");
    wk_box_forget_commands(b);
    pthread_mutex_lock(&b->mu);
    wk_agent_t *agent = b->agent;
    b->agent = NULL;
    pthread_mutex_unlock(&b->mu);
    wk_agent_close(agent);

    /* runsc checkpoint stops the sandbox (its --leave-running is a restore of runsc's own,
     * without this worker's netns and cgroup wrapping: docs/machine-notes.md): taken, then
     * restored in place from the stored artifacts. */
    char *staging =
        sp_xasprintf("%s/.staging/" SP_SNAPSHOT_KEY_PREFIX "-%s", w->cfg->snapshot_dir, snap);
    wk_checkpoint_t ck = {0};
    int rc = wk_mkdir_p(staging) < 0 ? -errno : 0;
    if (rc < 0)
        snprintf(err, sizeof(err), "mkdir %s: %s", staging, strerror(-rc));
    else if ((rc = staging_mark(staging, sbx)) < 0)
        snprintf(err, sizeof(err), "%s/" STAGING_OWNER ": %s", staging, strerror(-rc));
    else
        rc = wk_sandbox_checkpoint(w->host, sbx, spec.template_, staging, NULL, &ck, err);
    int64_t checkpoint_ms = ms_since(t0);
    if (rc < 0) {
        wk_rm_rf(staging);
        free(staging);
        if (wk_sandbox_running(w->host, sbx) == 1) {
            wk_box_t *again =
                wk_owned_add(w, sbx, tenant, spec.template_, spec.vcpu, spec.memory_mb);
            if (again) {
                wk_box_listen(again);
                wk_box_put(again);
            }
            rc = reject(w, ev, "checkpoint_failed", "%s", err);
        } else {
            rc = suspend_lost(w, ev, sbx, err);
        }
        wk_box_put(b);
        return rc;
    }
    wk_box_put(b);
    Space__V1__SnapshotArtifact art[ARTIFACTS], *arts[ARTIFACTS];
    uint8_t sha[ARTIFACTS][SP_SHA256_LEN];
    const char *src[ARTIFACTS] = {ck.image_path, ck.rootfs_path};
    char *paths[ARTIFACTS] = {0};
    for (int i = 0; i < ARTIFACTS && rc == 0; i++) {
        space__v1__snapshot_artifact__init(&art[i]);
        art[i].name = (char *)ARTIFACT_NAMES[i];
        art[i].store_key = key[i];
        art[i].sha256 = (ProtobufCBinaryData){SP_SHA256_LEN, sha[i]};
        rc = wk_snap_put(w, key[i], src[i], sha[i], &art[i].size, err);
        arts[i] = &art[i];
    }
    /* The sandbox again, in place, from what was stored (its digests checked on the way).
     * The staging directory stays until then: a worker that dies before the sandbox runs
     * again restores it from there when it starts (wk_snapshot_recover). */
    bool downloaded = false;
    for (int i = 0; i < ARTIFACTS && rc == 0; i++)
        rc = wk_snap_fetch(w, key[i], art[i].size, sha[i], &paths[i], &downloaded, err);
    if (rc == 0)
        named_mark(w, snap, sbx);
    wk_sandbox_info_t info = {0};
    if (rc == 0 && (rc = wk_sandbox_destroy_checkpointed(w->host, sbx, &ck, err)) == 0)
        rc = restore_owned(w, &spec, tenant, paths, &info, err);
    wk_checkpoint_dispose(&ck);
    wk_rm_rf(staging);
    free(staging);
    for (int i = 0; i < ARTIFACTS; i++)
        free(paths[i]);
    if (rc < 0) {
        named_forget(w, snap);
        return suspend_lost(w, ev, sbx, err);
    }
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxSnapshotted sd = SPACE__V1__SANDBOX_SNAPSHOTTED__INIT;
    Space__V1__Resources res = SPACE__V1__RESOURCES__INIT;
    char store[WK_SNAP_STORE_MAX];
    wk_snap_store_name(w, store);
    res.vcpu = spec.vcpu;
    res.memory_mb = spec.memory_mb;
    res.disk_mb = spec.disk_mb;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    sd.snapshot_id = (char *)snap;
    sd.name = req->name;
    sd.artifacts = arts;
    sd.n_artifacts = ARTIFACTS;
    sd.worker = w->cfg->id;
    sd.store = store;
    sd.template_ = (char *)spec.template_;
    sd.resources = &res;
    sd.took_ms = (uint32_t)ms_since(t0);
    sd.address = info.address;
    sd.connections_reset = reset;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOTTED;
    env.sandbox_snapshotted = &sd;
    sp_log(SP_LOG_INFO, "snapshot taken", SP_KS("sandbox", sbx), SP_KS("snapshot", snap),
           SP_KU("ms", sd.took_ms), SP_KI("checkpoint_ms", checkpoint_ms),
           SP_KU("image_bytes", art[0].size), SP_KU("rootfs_bytes", art[1].size),
           SP_KS("address", info.address));
    return wk_publish_fact(w, &env, "snapshotted", ev->event_id);
}

int wk_snapshot_recover(wk_t *w, const char *sbx, const char *tenant, const char *tmpl,
                        uint32_t vcpu, uint32_t memory_mb, bool alive)
{
    char snap[SP_SNAPSHOT_ID_LEN + 1] = "", err[WK_ERR_MAX] = "";
    char *staging = staging_of(w, sbx, snap);
    if (!staging)
        return 0;
    char *paths[ARTIFACTS] = {sp_xasprintf("%s/checkpoint.img.zst", staging),
                              sp_xasprintf("%s/rootfs.btrfs.zst", staging)};
    char *raw = sp_xasprintf("%s/image/checkpoint.img", staging);
    int rc = 0;
    /* Alive: the restore had run (the staging is its leftover). No image: the checkpoint
     * never stopped the sandbox, or failed. Either way it is what runsc says. */
    if (alive || wk_checkpoint_outcome(staging, CHECKPOINT_WAIT_MS) != 1)
        goto out;
    sp_log(SP_LOG_INFO, "restoring a sandbox the previous worker stopped for a snapshot",
           SP_KS("sandbox", sbx), SP_KS("snapshot", snap));
    if (access(raw, F_OK) == 0) {
        /* Stopped before its artifacts were made (or while): made again from the image. */
        wk_checkpoint_t ck = {0};
        rc = wk_sandbox_checkpoint_finish(w->host, sbx, tmpl, staging, NULL, &ck, err);
        wk_checkpoint_dispose(&ck);
    }
    for (int i = 0; i < ARTIFACTS && rc == 0; i++)
        if (access(paths[i], F_OK) != 0) {
            rc = -errno;
            snprintf(err, sizeof(err), "%s: %s", paths[i], strerror(errno));
        }
    wk_sandbox_spec_t spec = {.id = sbx,
                              .template_ = tmpl,
                              .vcpu = vcpu,
                              .memory_mb = memory_mb,
                              .disk_mb = sandbox_disk_mb(w, sbx)};
    wk_sandbox_info_t info = {0};
    if (rc == 0)
        (void)wk_sandbox_destroy(w->host, sbx, NULL); /* the stopped container, if any */
    if (rc == 0 && (rc = restore_owned(w, &spec, tenant, paths, &info, err)) == 0)
        rc = 1;
out:
    if (rc < 0)
        sp_log(SP_LOG_ERROR, "cannot restore the sandbox stopped for a snapshot",
               SP_KS("sandbox", sbx), SP_KS("snapshot", snap), SP_KS("error", err));
    /* The snapshot was never announced (no SandboxSnapshotted): what it stored goes, and the
     * intent, redelivered, takes it again. */
    named_forget(w, snap);
    wk_rm_rf(staging);
    for (int i = 0; i < ARTIFACTS; i++)
        free(paths[i]);
    free(raw);
    free(staging);
    return rc == 1 ? 1 : 0;
}

int wk_on_snapshot_delete(wk_t *w, const sp_envelope_t *ev)
{
    const char *snap = ev->snapshot_delete_requested->snapshot_id;
    named_forget(w, snap);
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SnapshotDeleted sd = SPACE__V1__SNAPSHOT_DELETED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    sd.snapshot_id = (char *)snap;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED;
    env.snapshot_deleted = &sd;
    sp_log(SP_LOG_INFO, "snapshot deleted", SP_KS("snapshot", snap),
           SP_KS("sandbox", ev->aggregate->id));
    return wk_publish_fact(w, &env, "snapshot-deleted", ev->event_id);
}

int wk_create_from_snapshot(wk_t *w, const sp_envelope_t *ev, const wk_sandbox_spec_t *want,
                            wk_sandbox_info_t *ret_info, char err[WK_ERR_MAX])
{
    const char *snap = ev->sandbox_placed->request->snapshot;
    PGconn *db = NULL;
    sp_envelope_t *se = NULL;
    char *paths[ARTIFACTS] = {0};
    int rc = sp_db_idle_take(w->db, 10000, &db);
    if (rc < 0) {
        snprintf(err, WK_ERR_MAX, "PostgreSQL: %s", sp_strerror(rc));
        goto out;
    }
    /* The tenant's own snapshot only, and not one being deleted. */
    if ((rc = sp_db_snapshot_find(db, ev->tenant, snap, &se)) < 0) {
        snprintf(err, WK_ERR_MAX, "snapshot %s: %s", snap,
                 rc == SP_ENOTFOUND ? "no such snapshot" : sp_strerror(rc));
        goto out;
    }
    /* Not held through the download and the restore. */
    sp_db_idle_give(w->db, db);
    db = NULL;
    const Space__V1__SandboxSnapshotted *sd = se->sandbox_snapshotted;
    for (int i = 0; i < ARTIFACTS && rc == 0; i++) {
        const Space__V1__SnapshotArtifact *a = NULL;
        for (size_t k = 0; k < sd->n_artifacts; k++)
            if (strcmp(sd->artifacts[k]->name, ARTIFACT_NAMES[i]) == 0)
                a = sd->artifacts[k];
        bool downloaded = false;
        if (!a || a->sha256.len != SP_SHA256_LEN) {
            snprintf(err, WK_ERR_MAX, "artifact %s: missing from the snapshot record",
                     ARTIFACT_NAMES[i]);
            rc = -ENOENT;
        } else {
            rc = wk_snap_fetch(w, a->store_key, a->size, a->sha256.data, &paths[i], &downloaded,
                               err);
        }
    }
    if (rc < 0)
        goto out;
    named_mark(w, snap, se->aggregate->id);
    if ((rc = wk_template_ensure(w->host, sd->template_, err)) < 0)
        goto out;
    /* The snapshot's template and resources: its memory image is of that size. */
    wk_sandbox_spec_t spec = *want;
    spec.template_ = sd->template_;
    spec.image_of = se->aggregate->id;
    if (sd->resources) {
        spec.vcpu = sd->resources->vcpu ? sd->resources->vcpu : spec.vcpu;
        spec.memory_mb = sd->resources->memory_mb ? sd->resources->memory_mb : spec.memory_mb;
        spec.disk_mb = sd->resources->disk_mb;
    }
    rc = restore_owned(w, &spec, ev->tenant, paths, ret_info, err);
out:
    for (int i = 0; i < ARTIFACTS; i++)
        free(paths[i]);
    sp_envelope_free(se);
    sp_db_idle_give(w->db, db);
    return rc;
}
