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
 * Snapshot store: a directory (snapshot-dir), <sandbox>/<snapshot>/<artifact>, shared by the
 * workers that may resume each other's sandboxes. Files land under .staging and are renamed in
 * once whole, so a key names complete bytes or nothing. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int wk_on_pause(wk_t *w, const sp_envelope_t *ev)
{
    const char *sbx = ev->aggregate->id;
    char err[WK_ERR_MAX] = "";
    wk_box_t *b = wk_owned_get(w, sbx);
    if (!b)
        return reject(w, ev, "not_running", "sandbox %s does not run on worker %s", sbx,
                      w->cfg->id);
    int64_t t0 = sp_mono_ns();
    pthread_mutex_lock(&b->mu);
    bool paused = b->paused;
    pthread_mutex_unlock(&b->mu);
    if (!paused && wk_sandbox_pause(w->host, sbx, true, err) < 0) {
        wk_box_put(b);
        sp_log(SP_LOG_WARN, "pause failed", SP_KS("sandbox", sbx), SP_KS("error", err));
        return reject(w, ev, "pause_failed", "%s", err);
    }
    pthread_mutex_lock(&b->mu);
    b->paused = true;
    pthread_mutex_unlock(&b->mu);
    wk_box_put(b);
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxPaused p = SPACE__V1__SANDBOX_PAUSED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    p.took_ms = (uint32_t)ms_since(t0);
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED;
    env.sandbox_paused = &p;
    sp_log(SP_LOG_INFO, "paused", SP_KS("sandbox", sbx), SP_KU("ms", p.took_ms));
    return wk_publish_fact(w, &env, "paused", ev->event_id);
}

/* A resume intent on this worker's subject: the sandbox is here, paused. */
int wk_on_resume(wk_t *w, const sp_envelope_t *ev)
{
    const char *sbx = ev->aggregate->id;
    char err[WK_ERR_MAX] = "";
    wk_box_t *b = wk_owned_get(w, sbx);
    if (!b)
        return reject(w, ev, "not_running", "sandbox %s is not on worker %s", sbx, w->cfg->id);
    int64_t t0 = sp_mono_ns();
    pthread_mutex_lock(&b->mu);
    bool paused = b->paused;
    pthread_mutex_unlock(&b->mu);
    if (!paused) {
        wk_box_put(b);
        return reject(w, ev, "illegal_transition", "sandbox %s is running, not paused", sbx);
    }
    if (wk_sandbox_pause(w->host, sbx, false, err) < 0) {
        wk_box_put(b);
        sp_log(SP_LOG_WARN, "resume failed", SP_KS("sandbox", sbx), SP_KS("error", err));
        return reject(w, ev, "resume_failed", "%s", err);
    }
    pthread_mutex_lock(&b->mu);
    b->paused = false;
    pthread_mutex_unlock(&b->mu);
    wk_box_put(b);
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxResumed r = SPACE__V1__SANDBOX_RESUMED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    r.worker = w->cfg->id;
    r.took_ms = (uint32_t)ms_since(t0);
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED;
    env.sandbox_resumed = &r;
    sp_log(SP_LOG_INFO, "resumed", SP_KS("sandbox", sbx), SP_KU("ms", r.took_ms));
    return wk_publish_fact(w, &env, "resumed", ev->event_id);
}

/* ---- the snapshot store (a directory) ---- */

static char *store_path(wk_t *w, const char *key)
{
    return sp_xasprintf("%s/%s", w->cfg->snapshot_dir, key);
}

/* SHA-256 and size of a file. */
static int digest_file(const char *path, uint8_t out[SP_SHA256_LEN], uint64_t *ret_size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    sp_sha256_ctx_t *ctx = sp_sha256_new();
    static __thread uint8_t buf[1 << 16];
    uint64_t size = 0;
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            break;
        }
        if (n == 0)
            break;
        sp_sha256_update(ctx, buf, (size_t)n);
        size += (uint64_t)n;
    }
    sp_sha256_final(ctx, out);
    close(fd);
    *ret_size = size;
    return rc;
}

/* Moves a finished artifact into the store under <sandbox>/<snap>/<name> (renamed in whole,
 * so the key names complete bytes or nothing) and describes it. */
static int store_put(wk_t *w, const char *sbx, const char *snap, const char *name, const char *src,
                     Space__V1__SnapshotArtifact *a, uint8_t sha[SP_SHA256_LEN], char *key,
                     size_t key_len, char err[WK_ERR_MAX])
{
    uint64_t size = 0;
    int rc = digest_file(src, sha, &size);
    if (rc < 0) {
        snprintf(err, WK_ERR_MAX, "read %s: %s", src, strerror(-rc));
        return rc;
    }
    snprintf(key, key_len, "%s/%s/%s", sbx, snap, name);
    char *dir = sp_xasprintf("%s/%s/%s", w->cfg->snapshot_dir, sbx, snap);
    char *dst = store_path(w, key);
    rc = 0;
    if (wk_mkdir_p(dir) < 0 || rename(src, dst) < 0) {
        rc = -errno;
        snprintf(err, WK_ERR_MAX, "store %s: %s", key, strerror(errno));
    }
    free(dst);
    free(dir);
    space__v1__snapshot_artifact__init(a);
    a->name = (char *)name;
    a->store_key = key;
    a->size = size;
    a->sha256 = (ProtobufCBinaryData){SP_SHA256_LEN, sha};
    return rc;
}

static void forget_snapshot(wk_t *w, const char *sbx, const char *snap)
{
    char *dir = sp_xasprintf("%s/%s/%s", w->cfg->snapshot_dir, sbx, snap);
    for (int i = 0; i < ARTIFACTS; i++) {
        char *p = sp_xasprintf("%s/%s", dir, ARTIFACT_NAMES[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
    free(dir);
    dir = sp_xasprintf("%s/%s", w->cfg->snapshot_dir, sbx);
    rmdir(dir); /* only when empty */
    free(dir);
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
        rc = wk_sandbox_checkpoint(w->host, sbx, b->template_, staging, &ck, err);
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
            char e2[WK_ERR_MAX];
            (void)wk_sandbox_destroy(w->host, sbx, e2);
            Space__V1__SandboxFailed f = SPACE__V1__SANDBOX_FAILED__INIT;
            sp_envelope_answer(&env, &agg, ev, "svc:worker");
            f.reason = "suspend_failed";
            f.detail = err;
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED;
            env.sandbox_failed = &f;
            rc = wk_publish_fact(w, &env, "failed", ev->event_id);
        }
        wk_box_put(b);
        return rc;
    }

    Space__V1__SnapshotArtifact art[ARTIFACTS], *arts[ARTIFACTS];
    uint8_t sha[ARTIFACTS][SP_SHA256_LEN];
    char key[ARTIFACTS][256];
    const char *src[ARTIFACTS] = {ck.image_path, ck.rootfs_path};
    for (int i = 0; i < ARTIFACTS && rc == 0; i++) {
        rc = store_put(w, sbx, snap, ARTIFACT_NAMES[i], src[i], &art[i], sha[i], key[i],
                       sizeof(key[i]), err);
        arts[i] = &art[i];
    }
    wk_checkpoint_dispose(&ck);
    wk_rm_rf(staging);
    free(staging);
    if (rc < 0) {
        /* The checkpoint stopped the sandbox: without its artifacts it cannot come back. */
        forget_snapshot(w, sbx, snap);
        char e2[WK_ERR_MAX];
        (void)wk_sandbox_destroy(w->host, sbx, e2);
        Space__V1__SandboxFailed f = SPACE__V1__SANDBOX_FAILED__INIT;
        sp_envelope_answer(&env, &agg, ev, "svc:worker");
        f.reason = "suspend_failed";
        f.detail = err;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED;
        env.sandbox_failed = &f;
        rc = wk_publish_fact(w, &env, "failed", ev->event_id);
        wk_box_put(b);
        return rc;
    }

    /* Recorded first, released after: a worker that dies in between leaves a suspended
     * sandbox whose leftovers the next reconcile cleans. */
    Space__V1__SandboxSuspended sd = SPACE__V1__SANDBOX_SUSPENDED__INIT;
    sp_envelope_answer(&env, &agg, ev, "svc:worker");
    sd.artifacts = arts;
    sd.n_artifacts = ARTIFACTS;
    sd.took_ms = (uint32_t)ms_since(t0);
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED;
    env.sandbox_suspended = &sd;
    rc = wk_publish_fact(w, &env, "suspended", ev->event_id);
    if (rc == 0 && wk_sandbox_destroy(w->host, sbx, err) < 0)
        sp_log(SP_LOG_ERROR, "cannot release a suspended sandbox", SP_KS("sandbox", sbx),
               SP_KS("error", err));
    sp_log(SP_LOG_INFO, "suspended", SP_KS("sandbox", sbx), SP_KU("ms", sd.took_ms),
           SP_KU("image_bytes", art[0].size), SP_KU("rootfs_bytes", art[1].size));
    wk_box_put(b);
    return rc;
}

/* ---- resume of a suspended sandbox ---- */

typedef struct {
    char tenant[65], template_[65];
    uint32_t vcpu, memory_mb;
    sp_envelope_t *suspended; /* the newest SandboxSuspended */
} snapshot_info_t;

static int load_snapshot(wk_t *w, const char *sbx, snapshot_info_t *si, char err[WK_ERR_MAX])
{
    PGconn *db = NULL;
    int rc = sp_db_connect(w->cfg->pg_url, "space-worker", 10000, &db);
    if (rc < 0) {
        snprintf(err, WK_ERR_MAX, "PostgreSQL: %s", sp_strerror(rc));
        return rc;
    }
    const char *p[1] = {sbx};
    PGresult *r = PQexecParams(db,
                               "SELECT tenant, template, vcpu, memory_mb FROM sandboxes WHERE "
                               "id = $1",
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
    PQclear(r);
    r = PQexecParams(db,
                     "SELECT payload FROM events WHERE aggregate_kind = 'sandbox' AND "
                     "aggregate_id = $1 AND type = 'SandboxSuspended' AND status = 'accepted' "
                     "ORDER BY stream_seq DESC LIMIT 1",
                     1, NULL, p, NULL, NULL, 1);
    char why[SP_REASON_MAX];
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0 || PQntuples(r) != 1 ||
        sp_envelope_decode((const uint8_t *)PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0),
                           &si->suspended, why) < 0) {
        snprintf(err, WK_ERR_MAX, "no readable SandboxSuspended for %s", sbx);
        rc = SP_ENOTFOUND;
        goto out;
    }
    rc = 0;
out:
    PQclear(r);
    PQfinish(db);
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

/* Checks every artifact against its recorded digest; the paths of the two (heap). */
static int verify(wk_t *w, const Space__V1__SandboxSuspended *sd, char *paths[ARTIFACTS],
                  char err[WK_ERR_MAX])
{
    for (int i = 0; i < ARTIFACTS; i++) {
        const Space__V1__SnapshotArtifact *a = NULL;
        for (size_t k = 0; k < sd->n_artifacts; k++)
            if (strcmp(sd->artifacts[k]->name, ARTIFACT_NAMES[i]) == 0)
                a = sd->artifacts[k];
        if (!a || strstr(a->store_key, "..") || a->store_key[0] == '/') {
            snprintf(err, WK_ERR_MAX, "artifact %s: missing from the snapshot record",
                     ARTIFACT_NAMES[i]);
            return -ENOENT;
        }
        paths[i] = store_path(w, a->store_key);
        uint8_t sha[SP_SHA256_LEN];
        uint64_t size = 0;
        int rc = digest_file(paths[i], sha, &size);
        if (rc < 0) {
            snprintf(err, WK_ERR_MAX, "artifact %s: %s", a->store_key, strerror(-rc));
            return rc;
        }
        if (size != a->size || memcmp(sha, a->sha256.data, SP_SHA256_LEN) != 0) {
            char want[SP_SHA256_HEX_LEN + 1], got[SP_SHA256_HEX_LEN + 1];
            sp_hex_encode(a->sha256.data, SP_SHA256_LEN, want);
            sp_hex_encode(sha, SP_SHA256_LEN, got);
            snprintf(err, WK_ERR_MAX, "artifact %s: sha256 %s (%llu bytes), recorded %s (%llu)",
                     a->store_key, got, (unsigned long long)size, want,
                     (unsigned long long)a->size);
            return -EBADMSG;
        }
    }
    return 0;
}

int wk_on_resume_placed(wk_t *w, const sp_envelope_t *ev)
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
    if ((rc = wk_publish_fact(w, &env, "resuming", ev->event_id)) < 0)
        goto out;
    rc = verify(w, si.suspended->sandbox_suspended, paths, err);
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
    pthread_mutex_lock(&b->mu);
    b->restoring = true;
    snprintf(b->lost_why, sizeof(b->lost_why), "the sandbox was suspended");
    pthread_mutex_unlock(&b->mu);
    wk_box_listen(b); /* before the restore: the agent connects back as soon as it runs */
    wk_sandbox_spec_t spec = {
        .id = sbx, .template_ = si.template_, .vcpu = si.vcpu, .memory_mb = si.memory_mb};
    wk_sandbox_info_t info = {0};
    char *work = sp_xasprintf("%s/.staging/restore-%s", w->cfg->snapshot_dir, sbx);
    wk_mkdir_p(work);
    rc = wk_sandbox_restore(w->host, &spec, paths[0], paths[1], work, &info, err);
    wk_rm_rf(work);
    free(work);
    pthread_mutex_lock(&b->mu);
    b->restoring = false;
    pthread_mutex_unlock(&b->mu);
    if (rc < 0) {
        wk_box_put(wk_owned_remove(w, sbx));
        wk_box_put(b);
        rc = resume_failed(w, ev, "restore_failed", err);
        goto out;
    }
    /* Resumed means usable: wait (bounded) for the agent to connect back. */
    bool back = false;
    for (int i = 0; i < AGENT_BACK_MS / 5 && !back; i++) {
        pthread_mutex_lock(&b->mu);
        back = b->agent != NULL && !b->agent_lost;
        pthread_mutex_unlock(&b->mu);
        if (!back)
            usleep(5000);
    }
    if (!back)
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
    rc = wk_publish_fact(w, &env, "resumed", ev->event_id);
    sp_log(SP_LOG_INFO, "resumed from suspend", SP_KS("sandbox", sbx), SP_KU("ms", r.took_ms),
           SP_KU("restore_ms", (uint64_t)ms_since(t_restore)), SP_KS("address", info.address));
    if (rc == 0) {
        /* It runs again: the snapshot has served (a new suspend makes a new one). */
        const Space__V1__SandboxSuspended *sd = si.suspended->sandbox_suspended;
        char snap[256] = "";
        if (sd->n_artifacts > 0) {
            const char *k = sd->artifacts[0]->store_key;
            const char *s1 = strchr(k, '/');
            const char *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
            if (s1 && s2 && (size_t)(s2 - s1 - 1) < sizeof(snap))
                snprintf(snap, sizeof(snap), "%.*s", (int)(s2 - s1 - 1), s1 + 1);
        }
        if (snap[0] && sp_id_valid(snap))
            forget_snapshot(w, sbx, snap);
    }
out:
    for (int i = 0; i < ARTIFACTS; i++)
        free(paths[i]);
    sp_envelope_free(si.suspended);
    return rc;
}
