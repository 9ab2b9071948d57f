/* The bus contract (contract.h): identity kinds, subjects, durables, event emitters.
 *
 * Each table below is the only definition of what it says. The emitters of each event type
 * were taken from the daemons as they are (which one sets which payload case): the gateway
 * only sends intents; an internal platform only creates and deletes (below); the scheduler places
 * (SandboxPlaced), sends the intents of its controllers (delete on timeout, suspend when idle) and
 * the facts of its lost-worker controller (SandboxFailed, SandboxDeleted, SandboxResumeFailed,
 * WorkerStopped) and refuses (SandboxRequestRejected); a worker sends the facts of its sandboxes,
 * its refusals and its worker events; egressd sends egress facts. tests/unit/lib/test_contract.c
 * checks that every payload case of space.proto has emitters, so a new event type cannot be added
 * without saying who may send it.
 */
#include "contract.h"

#include "checkpoint.h"
#include "cred.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "ids.h"

#define K(x) SP_KIND_BIT(SP_KIND_##x)

static const char *const kind_names[SP_KIND__COUNT] = {
    [SP_KIND_OPERATOR] = "operator",   [SP_KIND_GATEWAY] = "gateway",
    [SP_KIND_SCHEDULER] = "scheduler", [SP_KIND_EVENTLOG] = "eventlog",
    [SP_KIND_WORKER] = "worker",       [SP_KIND_EGRESSD] = "egressd",
    [SP_KIND_CREDSTORE] = "credstore", [SP_KIND_READER] = "reader",
    [SP_KIND_PLATFORM] = "platform",
};

/* Kinds whose identity names an instance that the contract binds to ({worker} tokens, the
 * platform's tenants). */
#define INSTANCE_REQUIRED (K(WORKER) | K(EGRESSD) | K(PLATFORM))

const char *sp_kind_name(sp_kind_t k)
{
    if ((unsigned)k >= SP_KIND__COUNT)
        return NULL;
    return kind_names[k];
}

int sp_identity_format(sp_kind_t kind, const char *instance, sp_identity_t *ret)
{
    char name[SP_IDENTITY_MAX + 2];
    const char *kn = sp_kind_name(kind);
    int n;

    if (!kn || !ret)
        return -EINVAL;
    if (instance && *instance)
        n = snprintf(name, sizeof(name), "%s-%s", kn, instance);
    else
        n = snprintf(name, sizeof(name), "%s", kn);
    if (n < 0 || (size_t)n > SP_IDENTITY_MAX)
        return -EINVAL;
    return sp_identity_parse(name, ret);
}

int sp_identity_parse(const char *name, sp_identity_t *ret)
{
    size_t len;

    if (!name || !ret)
        return -EINVAL;
    len = strlen(name);
    if (len == 0 || len > SP_IDENTITY_MAX)
        return -EINVAL;
    for (unsigned k = 0; k < SP_KIND__COUNT; k++) {
        size_t kl = strlen(kind_names[k]);
        const char *inst;

        if (strncmp(name, kind_names[k], kl) != 0 || (name[kl] != '\0' && name[kl] != '-'))
            continue;
        inst = name[kl] == '-' ? name + kl + 1 : "";
        if (name[kl] == '-' && !sp_id_valid(inst))
            return -EINVAL;
        if (!*inst && (SP_KIND_BIT(k) & INSTANCE_REQUIRED))
            return -EINVAL;
        if (strlen(inst) > SP_INSTANCE_MAX)
            return -EINVAL;
        ret->kind = (sp_kind_t)k;
        memcpy(ret->name, name, len + 1);
        memcpy(ret->instance, inst, strlen(inst) + 1);
        return 0;
    }
    return -EINVAL;
}

/* ---- subjects ----
 * S(id, name, pattern, stream, request, pub_any, pub_own, sub_any, sub_own, what).
 * Stream subjects: publishers come from the event types (sp_event_emitters), readers from
 * the durables. Data-plane replies go to the requester's inbox (natsauth.c). */
#define S(i, n, p, st, rq, pa, po, sa, so, w)                                                      \
    [(i)] = {.id = (i),                                                                            \
             .name = (n),                                                                          \
             .pattern = (p),                                                                       \
             .stream = (st),                                                                       \
             .request = (rq),                                                                      \
             .pub_any = (pa),                                                                      \
             .pub_own = (po),                                                                      \
             .sub_any = (sa),                                                                      \
             .sub_own = (so),                                                                      \
             .what = (w)}
static const sp_subject_t subjects[SP_SUBJ__COUNT] = {
    S(SP_SUBJ_EV_SBX, "ev.sbx", "space.ev.sbx.{worker}.{sandbox}.{type}", true, false, 0, 0, 0, 0,
      "sandbox lifecycle events; {worker} is _ until placed, then the owner"),
    S(SP_SUBJ_EV_IO, "ev.io", "space.ev.io.{worker}.{sandbox}.{type}", true, false, 0, 0, 0, 0,
      "what happens inside a sandbox: Command*, File*, DirCreated"),
    S(SP_SUBJ_EV_WKR, "ev.wkr", "space.ev.wkr.{worker}.{type}", true, false, 0, 0, 0, 0,
      "worker events: heartbeats, reconciliation, stopped"),
    S(SP_SUBJ_EV_EGRESS, "ev.egress", "space.ev.egress.{sandbox}.{type}", true, false, 0, 0, 0, 0,
      "egressd facts: NetworkPolicyChanged, EgressAllowed, EgressDenied"),
    S(SP_SUBJ_EV_CRED, "ev.cred", "space.ev.cred.{tenant}.{type}", true, false, 0, 0, 0, 0,
      "credential events: Created/Rotated/Deleted (credstore), Used/Denied (egressd)"),
    S(SP_SUBJ_IO_EXEC, "io.exec", "space.io.wkr.{worker}.exec", false, true, K(GATEWAY), 0, 0,
      K(WORKER), "ExecRequest -> ExecReply"),
    S(SP_SUBJ_IO_CTL, "io.ctl", "space.io.wkr.{worker}.ctl", false, true, K(GATEWAY), 0, 0,
      K(WORKER), "CtlRequest -> CtlReply"),
    S(SP_SUBJ_IO_FILE, "io.file", "space.io.wkr.{worker}.file", false, true, K(GATEWAY), 0, 0,
      K(WORKER), "FileCall -> FileReply"),
    S(SP_SUBJ_IO_WATCH, "io.watch", "space.io.wkr.{worker}.watch", false, true, K(GATEWAY), 0, 0,
      K(WORKER), "WatchCall -> WatchReply"),
    S(SP_SUBJ_IO_METRICS, "io.metrics", "space.io.wkr.{worker}.metrics", false, true, K(GATEWAY), 0,
      0, K(WORKER), "MetricsCall -> MetricsReply: a sandbox's usage samples"),
    S(SP_SUBJ_IO_CMD, "io.cmd", "space.io.cmd.{cmd}.{part}", false, false, K(WORKER), 0, K(GATEWAY),
      0, "IoStart, IoChunk, IoExit of a command"),
    S(SP_SUBJ_IO_WATCH_EV, "io.watch.ev", "space.io.watch.{watch}.{part}", false, false, K(WORKER),
      0, K(GATEWAY), 0, "WatchBatch, WatchEnd of a directory watch"),
    S(SP_SUBJ_IO_EGRESS_RST, "io.egress.reset", "space.io.egress.{worker}.reset", false, true, 0,
      K(WORKER), 0, K(EGRESSD), "EgressReset -> EgressResetReply, worker to its egressd"),
    S(SP_SUBJ_IO_CRED_ADMIN, "io.cred.admin", SP_CRED_SUBJECT_ADMIN, false, true, K(GATEWAY), 0,
      K(CREDSTORE), 0, "CredAdmin -> CredAdminReply (docs/credentials.md)"),
    S(SP_SUBJ_IO_CRED_LOOKUP, "io.cred.lookup", SP_CRED_SUBJECT_LOOKUP, false, true, K(EGRESSD), 0,
      K(CREDSTORE), 0, "CredLookup -> CredLookupReply: values, on the asker's inbox only"),
    S(SP_SUBJ_IO_CRED_CHANGED, "io.cred.changed", SP_CRED_SUBJECT_CHANGED, false, false,
      K(CREDSTORE), 0, K(EGRESSD), 0, "a credential rotated or deleted: caches emptied"),
    S(SP_SUBJ_IO_CRED_DATAKEY, "io.cred.datakey", SP_CRED_SUBJECT_DATAKEY, false, true, K(WORKER),
      0, K(CREDSTORE), 0, "DataKeyRequest -> DataKeyReply: a sandbox's data key, to its worker"),
    /* Not in SP_BUS_STREAM (stream false) but in a stream of its own, SP_CKPT_STREAM, read by
     * space-replay through the JetStream API (natsauth.c), never subscribed to. */
    S(SP_SUBJ_CKPT, "ckpt", SP_CKPT_SUBJECT, false, false, K(EVENTLOG), 0, 0, 0,
      "the event log's signed checkpoints (docs/audit.md)"),
};
#undef S

const sp_subject_t *sp_subject(sp_subject_id_t id)
{
    if ((unsigned)id >= SP_SUBJ__COUNT)
        return NULL;
    return &subjects[id];
}

/* One token of a concrete subject: printable ASCII but the separators and wildcards. */
static bool token_ok(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > 128)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c >= 0x7f || c == '.' || c == '*' || c == '>')
            return false;
    }
    return true;
}

int sp_subject_build(char *buf, size_t len, sp_subject_id_t id, const char *a0, const char *a1,
                     const char *a2)
{
    const sp_subject_t *s = sp_subject(id);
    const char *args[3] = {a0, a1, a2};
    size_t out = 0, ai = 0;
    const char *p;

    if (!s || !buf || len == 0)
        return -EINVAL;
    for (p = s->pattern; *p;) {
        const char *piece;
        size_t plen;

        if (*p == '{') {
            const char *end = strchr(p, '}');
            if (ai >= 3 || !args[ai]) {
                piece = ">";
                plen = 1;
                p = "";
            } else {
                piece = args[ai++];
                if (!token_ok(piece))
                    return -EINVAL;
                plen = strlen(piece);
                p = end + 1;
            }
        } else {
            const char *next = strchr(p, '{');
            plen = next ? (size_t)(next - p) : strlen(p);
            piece = p;
            p += plen;
        }
        if (out + plen >= len)
            return -ENOBUFS;
        memcpy(buf + out, piece, plen);
        out += plen;
    }
    buf[out] = '\0';
    return (int)out;
}

bool sp_subject_match(sp_subject_id_t id, const char *subject, char worker[SP_INSTANCE_MAX + 1])
{
    const sp_subject_t *s = sp_subject(id);
    const char *p, *q = subject;
    char wtok[SP_INSTANCE_MAX + 1] = "";

    if (!s || !subject)
        return false;
    for (p = s->pattern; *p;) {
        if (*p == '{') {
            const char *end = strchr(p, '}');
            const char *dot = strchr(q, '.');
            size_t n = dot ? (size_t)(dot - q) : strlen(q);

            if (n == 0)
                return false;
            for (size_t i = 0; i < n; i++)
                if (q[i] == '*' || q[i] == '>' || (unsigned char)q[i] <= ' ')
                    return false;
            if (strncmp(p, "{worker}", 8) == 0) {
                if (n > SP_INSTANCE_MAX)
                    return false;
                memcpy(wtok, q, n);
                wtok[n] = '\0';
            }
            q += n;
            p = end + 1;
        } else {
            if (*p != *q)
                return false;
            p++;
            q++;
        }
    }
    if (*q != '\0')
        return false;
    if (worker)
        memcpy(worker, wtok, strlen(wtok) + 1);
    return true;
}

/* ---- durables ---- */
static const sp_consumer_def_t consumers[] = {
    {"eventlog", "space.ev.>", SP_KIND_EVENTLOG, true, true, 30000},
    {"scheduler", "space.ev.sbx._.>", SP_KIND_SCHEDULER, false, false, 10000},
    /* Short: the worker tells a long create "in progress" every third of it
     * (worker_events.c), and a delivery lost with a connection comes back this soon. */
    {"worker-{worker}", "space.ev.sbx.{worker}.>", SP_KIND_WORKER, false, false, 15000},
    {"egressd-{worker}", "space.ev.sbx.{worker}.>", SP_KIND_EGRESSD, true, false, 30000},
};

const sp_consumer_def_t *sp_contract_consumers(size_t *ret_n)
{
    *ret_n = sizeof(consumers) / sizeof(consumers[0]);
    return consumers;
}

/* Whether a durable's filter covers a concrete subject: tokens equal, "*" or a {placeholder}
 * any one token, ">" all the rest. */
static bool filter_covers(const char *f, const char *s)
{
    while (*f && *s) {
        size_t fl = strcspn(f, "."), sl = strcspn(s, ".");
        if (fl == 1 && f[0] == '>')
            return sl > 0;
        bool any = (fl == 1 && f[0] == '*') || (fl > 2 && f[0] == '{' && f[fl - 1] == '}');
        if (!any && (fl != sl || memcmp(f, s, fl) != 0))
            return false;
        f += fl;
        s += sl;
        if (*f != *s)
            return false;
        if (*f == '.') {
            f++;
            s++;
        }
    }
    return !*f && !*s;
}

bool sp_subject_log_only(const char *subject)
{
    bool logged = false;
    if (!subject)
        return false;
    for (size_t i = 0; i < sizeof(consumers) / sizeof(consumers[0]); i++) {
        if (!filter_covers(consumers[i].filter, subject))
            continue;
        if (consumers[i].kind != SP_KIND_EVENTLOG)
            return false;
        logged = true;
    }
    return logged;
}

/* ---- event types ----
 * Internal platforms (docs/platforms.md) create, delete, pause, resume, suspend and set the
 * timeout of their tenants' sandboxes, all on the scheduler's subject ("_", natsauth.c gives
 * platforms no other), where the scheduler applies the trust and intent checks before anything
 * happens; what goes to a sandbox's worker, the scheduler forwards in an intent it signs
 * itself (scheduler_place.c). Commands and network policy need the data plane, which
 * platforms do not have. */
static unsigned emitters(sp_event_type_t t)
{
    switch (t) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED:
        return K(GATEWAY) | K(PLATFORM);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED:
        return K(GATEWAY) | K(PLATFORM) | K(SCHEDULER);
    /* The projection applies it; the timeout controller acts on it (nothing to forward). */
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_TIMEOUT_REQUESTED:
        return K(GATEWAY) | K(PLATFORM);
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_UPDATE_REQUESTED:
    /* Named snapshots (docs/snapshots.md): to the sandbox's worker, to the worker that took it. */
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOT_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETE_REQUESTED:
        return K(GATEWAY);
    /* The scheduler's controllers: delete when the timeout runs out, suspend when idle; and
     * what it forwards of a platform's intents. */
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED:
        return K(GATEWAY) | K(PLATFORM) | K(SCHEDULER);

    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED:
        return K(SCHEDULER);
    /* The lost-worker controller ends what lived on a worker that is gone. */
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_FAILED:
        return K(WORKER) | K(SCHEDULER);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDING:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMING:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_ADOPTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_FAILED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOTTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED:
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT:
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED:
    case SPACE__V1__ENVELOPE__PAYLOAD_AGENT_CHANNEL_LOST:
    case SPACE__V1__ENVELOPE__PAYLOAD_AGENT_CHANNEL_RESTORED:
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_WRITTEN:
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_REMOVED:
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_MOVED:
    case SPACE__V1__ENVELOPE__PAYLOAD_DIR_CREATED:
        return K(WORKER);

    case SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_CHANGED:
    case SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_ALLOWED:
    case SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED:
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_USED:
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DENIED:
        return K(EGRESSD);

    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_CREATED:
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_ROTATED:
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DELETED:
        return K(CREDSTORE);

    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED:
        return K(SCHEDULER) | K(WORKER);

    case SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT:
    case SPACE__V1__ENVELOPE__PAYLOAD_WORKER_RECONCILED:
        return K(WORKER);
    case SPACE__V1__ENVELOPE__PAYLOAD_WORKER_STOPPED:
        return K(WORKER) | K(SCHEDULER);

    case SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET:
    default:
        return 0;
    }
}

sp_subject_id_t sp_event_subject_id(sp_event_type_t t)
{
    if (!sp_event_type_name(t))
        return SP_SUBJ__COUNT;
    if (sp_event_is_worker(t))
        return SP_SUBJ_EV_WKR;
    if (sp_event_is_egress(t))
        return SP_SUBJ_EV_EGRESS;
    if (sp_event_is_io(t))
        return SP_SUBJ_EV_IO;
    if (sp_event_is_cred(t))
        return SP_SUBJ_EV_CRED;
    return SP_SUBJ_EV_SBX;
}

sp_event_type_t sp_subject_event_type(const char *subject)
{
    const char *dot = subject ? strrchr(subject, '.') : NULL;
    if (!dot)
        return SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET;
    sp_event_type_t t = sp_event_type_from_name(dot + 1);
    sp_subject_id_t id = sp_event_subject_id(t);
    if (id == SP_SUBJ__COUNT || !sp_subject_match(id, subject, NULL))
        return SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET;
    return t;
}

unsigned sp_event_emitters(sp_event_type_t t)
{
    return emitters(t);
}

void sp_snapshot_id_new(char out[SP_SNAPSHOT_ID_LEN + 1])
{
    sp_sandbox_id_new(out); /* the same shape, "snp_" instead of "sbx_" */
    out[0] = 's';
    out[1] = 'n';
    out[2] = 'p';
}

bool sp_snapshot_id_valid(const char *s)
{
    return s && strlen(s) == SP_SNAPSHOT_ID_LEN && strncmp(s, "snp_", 4) == 0 && sp_id_valid(s);
}

bool sp_snapshot_name_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > SP_SNAPSHOT_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7e)
            return false;
    return true;
}

const char *sp_trust_refusal_name(int code)
{
    switch (code) {
    case SP_EUNSIGNED:
        return "unsigned";
    case SP_ESIGNER:
        return "unknown_signer";
    case SP_ESIGNATURE:
    case SP_EHEADED: /* where its head cannot be looked up, it cannot be verified */
        return "bad_signature";
    case SP_ENOTALLOWED:
        return "type_not_allowed";
    case SP_ENOTOWN:
        return "not_own";
    case SP_ETENANT:
        return "tenant_not_allowed";
    case SP_ESTALE:
        return "stale_or_replayed";
    default:
        return NULL;
    }
}
