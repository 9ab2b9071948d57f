/* The trust check (trust.h). Order: cheap refusals first (unsigned, unknown signer), then the
 * signature (the only costly step: ~180 us of Ed25519 on the measured VM, unless the batch's
 * root is already in the cache), then what the contract lets the signer say. */
#include "trust.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static int refuse(char reason[SP_REASON_MAX], int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(char reason[SP_REASON_MAX], int code, const char *fmt, ...)
{
    if (reason) {
        va_list ap;
        int n =
            snprintf(reason, SP_REASON_MAX,
                     "%s: ", sp_trust_refusal_name(code) ? sp_trust_refusal_name(code) : "invalid");
        va_start(ap, fmt);
        if (n > 0 && n < SP_REASON_MAX)
            vsnprintf(reason + n, SP_REASON_MAX - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* The worker a sandbox fact names in its payload, when it names one: it must be the signer. */
static const char *payload_worker(const sp_envelope_t *e)
{
    switch (e->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED:
        return e->sandbox_started->worker;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED:
        return e->sandbox_resumed->worker;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMING:
        return e->sandbox_resuming->worker;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_ADOPTED:
        return e->sandbox_adopted->worker;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED:
        return e->sandbox_suspended->worker;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_FAILED:
        return e->sandbox_resume_failed->worker;
    case SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_CHANGED:
        return e->network_policy_changed->egressd;
    default:
        return NULL;
    }
}

/* The sandbox an event is about: its aggregate, or for egressd's credential uses (whose
 * aggregate is the credential) the sandbox that made the request. */
const char *sp_trust_sandbox_of(const sp_envelope_t *env)
{
    const Space__V1__CredentialUse *u = NULL;
    if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_USED)
        u = env->credential_used->use;
    else if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DENIED)
        u = env->credential_denied->use;
    else
        return env->aggregate->id;
    return u && u->sandbox ? u->sandbox : "";
}

/* The sandbox must be placed on worker (the signer's own, or its host's for egressd). An
 * egressd's audit facts (egress and credential decisions) flush up to a second after the
 * decision, so they may arrive after the sandbox was suspended or deleted: for those, a
 * sandbox of the tenant that is placed on no worker any more is accepted too (nothing is
 * granted by an audit record; naming its last worker needs that in the projection: next). */
static bool late_audit(const sp_envelope_t *env)
{
    switch (env->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_ALLOWED:
    case SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED:
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_USED:
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DENIED:
        return true;
    default:
        return false;
    }
}

static int check_placed(const sp_trust_t *t, const sp_envelope_t *env, const char *signer,
                        const char *worker, char reason[SP_REASON_MAX])
{
    char placed[SP_INSTANCE_MAX + 1] = "";
    const char *sbx = sp_trust_sandbox_of(env);
    int rc;

    if (!t->placement)
        return refuse(reason, SP_ENOTOWN, "%s: no placement lookup for sandbox %s", signer, sbx);
    rc = sbx[0] ? t->placement(t->placement_arg, env->tenant, sbx, placed) : 0;
    if (rc == 2 && late_audit(env))
        return 0;
    if (rc != 1)
        return refuse(reason, SP_ENOTOWN, "%s: sandbox %s is not placed on any worker", signer,
                      sbx);
    placed[SP_INSTANCE_MAX] = '\0';
    if (strcmp(placed, worker) != 0)
        return refuse(reason, SP_ENOTOWN, "%s: sandbox %s is placed on %s", signer, sbx, placed);
    return 0;
}

/* A SnapshotDeleted: its signer must be the worker that took the snapshot. */
static int check_taker(const sp_trust_t *t, const sp_envelope_t *env, const char *signer,
                       const char *worker, char reason[SP_REASON_MAX])
{
    char taker[SP_INSTANCE_MAX + 1] = "";
    const char *snap = env->snapshot_deleted->snapshot_id;
    int rc = t->snapshot_taker(t->snapshot_arg, env->tenant, env->aggregate->id, snap, taker);

    if (rc != 1)
        return refuse(reason, SP_ENOTOWN, "%s: sandbox %s has no snapshot %.64s", signer,
                      env->aggregate->id, snap);
    taker[SP_INSTANCE_MAX] = '\0';
    if (strcmp(taker, worker) == 0)
        return 0;
    rc = t->worker_live ? t->worker_live(t->snapshot_arg, taker) : 1;
    if (rc < 0)
        return refuse(reason, SP_ENOTOWN, "%s: cannot tell whether worker %s is live", signer,
                      taker);
    if (rc == 0)
        return 0; /* the taker is gone: any worker may say it */
    return refuse(reason, SP_ENOTOWN, "%s: snapshot %.64s was taken by %s, which is live", signer,
                  snap, taker);
}

int sp_trust_verify(const sp_trust_t *t, const sp_envelope_t *env, const uint8_t *raw,
                    size_t raw_len, int64_t at_ns, char reason[SP_REASON_MAX])
{
    int rc;

    if (!t || !env || !raw)
        return refuse(reason, SP_ESCHEMA, "missing argument");
    rc = sp_envelope_verify(t->keyring, t->cache, env, raw, raw_len, at_ns);
    switch (rc) {
    case 0:
        return 0;
    case SP_EUNSIGNED:
        return refuse(reason, rc, "%s %s carries no %s", env->type, env->event_id,
                      env->signer[0] ? "signature" : "signer");
    case SP_ESIGNER:
        return refuse(reason, rc, "%.80s is not a known identity", env->signer);
    case SP_ETOOBIG:
        return refuse(reason, rc, "envelope of %zu bytes", raw_len);
    case SP_EDECODE:
        return refuse(reason, rc, "not a protobuf encoding");
    case SP_EHEADED: {
        char head[37];
        sp_sig_head_id(env, head);
        return refuse(reason, rc,
                      "%s %s is signed through its batch head %s, which only the event log "
                      "looks up",
                      env->type, env->event_id, head);
    }
    default:
        return refuse(reason, SP_ESIGNATURE, "%s %s does not verify for %s", env->type,
                      env->event_id, env->signer);
    }
}

int sp_trust_check(const sp_trust_t *t, const sp_envelope_t *env, const uint8_t *raw,
                   size_t raw_len, const char *subject, int64_t at_ns, char reason[SP_REASON_MAX])
{
    int rc = sp_trust_verify(t, env, raw, raw_len, at_ns, reason);
    return rc < 0 ? rc : sp_trust_authorize(t, env, subject, reason);
}

int sp_trust_authorize(const sp_trust_t *t, const sp_envelope_t *env, const char *subject,
                       char reason[SP_REASON_MAX])
{
    char subj_worker[SP_INSTANCE_MAX + 1] = "";
    sp_identity_t id;
    sp_subject_id_t sid;
    int rc;

    if (!t || !env || !subject)
        return refuse(reason, SP_ESCHEMA, "missing argument");
    if (sp_identity_parse(env->signer, &id) < 0)
        return refuse(reason, SP_ESIGNER, "%.80s is not a known identity", env->signer);

    /* The bytes are the signer's: now what it said, and where. */
    rc = sp_envelope_check_subject(env, subject, reason);
    if (rc < 0)
        return rc;
    if (!(sp_event_emitters(env->payload_case) & SP_KIND_BIT(id.kind)))
        return refuse(reason, SP_ENOTALLOWED, "%s may not emit %s", env->signer, env->type);
    sid = sp_event_subject_id(env->payload_case);
    if (sid == SP_SUBJ__COUNT || !sp_subject_match(sid, subject, subj_worker))
        return refuse(reason, SP_ESCHEMA, "subject %.128s is not a %s subject", subject, env->type);

    switch (id.kind) {
    case SP_KIND_WORKER: {
        const char *pw = payload_worker(env);
        if (sid != SP_SUBJ_EV_EGRESS && strcmp(subj_worker, id.instance) != 0)
            return refuse(reason, SP_ENOTOWN, "%s published on %.128s", env->signer, subject);
        if (sid == SP_SUBJ_EV_WKR)
            return strcmp(env->aggregate->id, id.instance) == 0
                       ? 0
                       : refuse(reason, SP_ENOTOWN, "%s spoke for worker %s", env->signer,
                                env->aggregate->id);
        if (pw && pw[0] && strcmp(pw, id.instance) != 0)
            return refuse(reason, SP_ENOTOWN, "%s names worker %s in %s", env->signer, pw,
                          env->type);
        if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED && t->snapshot_taker)
            return check_taker(t, env, env->signer, id.instance, reason);
        return check_placed(t, env, env->signer, id.instance, reason);
    }
    case SP_KIND_EGRESSD: {
        const char *pw = payload_worker(env);
        if (pw && pw[0] && strcmp(pw, id.instance) != 0)
            return refuse(reason, SP_ENOTOWN, "%s names egressd %s in %s", env->signer, pw,
                          env->type);
        return check_placed(t, env, env->signer, id.instance, reason);
    }
    case SP_KIND_PLATFORM:
        /* Its NATS permissions say so too; here whatever the server's configuration. */
        if (strcmp(subj_worker, "_") != 0)
            return refuse(reason, SP_ENOTOWN, "%s published on %.128s, not the scheduler's",
                          env->signer, subject);
        if (!sp_keyring_has_tenant(t->keyring, env->signer, env->tenant))
            return refuse(reason, SP_ETENANT, "%s may not act for tenant %.64s", env->signer,
                          env->tenant);
        return 0;
    default:
        return 0;
    }
}
