/* Envelope encode/decode/validate. Everything decoded here came from the bus and is untrusted:
 * size first, then protobuf, then every field against its limit (STYLE.md, untrusted input). */
#include "envelope.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "contract.h"
#include "cred.h"
#include "error.h"
#include "fspath.h"
#include "ids.h"
#include "intent.h"
#include "netpolicy.h"
#include "text.h"
#include "xmalloc.h"

#define ID_MAX             64
#define ACTOR_MAX          128
#define CORR_MAX           128
#define TEXT_MAX           256
#define METADATA_MAX       SP_INTENT_METADATA_MAX
#define METADATA_KEY_MAX   SP_INTENT_METADATA_KEY_MAX
#define METADATA_VALUE_MAX SP_INTENT_METADATA_VALUE_MAX
#define ENV_NAMES_MAX      SP_INTENT_ENV_MAX
#define LIST_MAX           256
#define ARTIFACTS_MAX      16
#define ARGV_MAX           256
#define ARG_MAX_BYTES      4096
#define CMD_MAX_BYTES      16384
#define FILE_PATH_MAX      SP_FSPATH_MAX
#define SIG_LEN            64 /* Ed25519 (sign.h) */
/* Envelope.signature (11), sig_proof (12), sig_index (13), sig_count (14), sig_leaves (15),
 * sig_head (16): what the signature adds, never what it covers. */
#define SIG_FIELD_FIRST 11
#define SIG_FIELD_LAST  16
/* sign.h's SP_SIG_BATCH_MAX and SP_SIG_PROOF_MAX (envelope.h does not include sign.h). */
#define SIG_BATCH_MAX 4096
#define SIG_PROOF_MAX (12 * 32)
/* 2020-01-01 .. 2100-01-01 in microseconds: anything outside is a bug or a forgery. */
#define TIME_MIN_US 1577836800000000LL
#define TIME_MAX_US 4102444800000000LL

static const ProtobufCFieldDescriptor *payload_field(sp_event_type_t t)
{
    const ProtobufCMessageDescriptor *d = &space__v1__envelope__descriptor;
    if (t == SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET)
        return NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->id == (uint32_t)t && f->type == PROTOBUF_C_TYPE_MESSAGE &&
            (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            return f;
    }
    return NULL;
}

const char *sp_event_type_name(sp_event_type_t t)
{
    const ProtobufCFieldDescriptor *f = payload_field(t);
    if (!f)
        return NULL;
    return ((const ProtobufCMessageDescriptor *)f->descriptor)->short_name;
}

sp_event_type_t sp_event_type_from_name(const char *name)
{
    const ProtobufCMessageDescriptor *d = &space__v1__envelope__descriptor;
    if (!name)
        return SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE || !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        const char *sn = ((const ProtobufCMessageDescriptor *)f->descriptor)->short_name;
        if (sn && strcmp(sn, name) == 0)
            return (sp_event_type_t)f->id;
    }
    return SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET;
}

int sp_event_is_worker(sp_event_type_t t)
{
    return t == SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_WORKER_STOPPED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_WORKER_RECONCILED;
}

int sp_event_is_egress(sp_event_type_t t)
{
    return t == SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_CHANGED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_ALLOWED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED;
}

int sp_event_is_cred(sp_event_type_t t)
{
    return t == SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_CREATED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_ROTATED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DELETED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_USED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DENIED;
}

int sp_event_is_io(sp_event_type_t t)
{
    return t == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_FILE_WRITTEN ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_FILE_REMOVED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_FILE_MOVED ||
           t == SPACE__V1__ENVELOPE__PAYLOAD_DIR_CREATED;
}

void sp_envelope_stamp(sp_envelope_t *env, char id_buf[37])
{
    sp_uuid7_str(id_buf);
    env->event_id = id_buf;
    env->occurred_at_us = sp_now_us();
    env->schema_version = SP_SCHEMA_VERSION;
    const char *name = sp_event_type_name(env->payload_case);
    /* The generated struct has no const; the envelope never writes through it. */
    env->type = (char *)(name ? name : "");
}

static int fail(char reason[SP_REASON_MAX], int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char reason[SP_REASON_MAX], int err, const char *fmt, ...)
{
    if (reason) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(reason, SP_REASON_MAX, fmt, ap);
        va_end(ap);
    }
    return err;
}

static int text_ok(const char *s, size_t max)
{
    return sp_text_valid(s, max, 0);
}

static int script_ok(const char *s, size_t max)
{
    return sp_text_valid(s, max, SP_TEXT_SPACE_CONTROLS);
}

static int env_name_ok(const char *s)
{
    return sp_intent_env_name_ok(s);
}

#define CHECK_TEXT(field, max, name)                                                               \
    do {                                                                                           \
        if (!text_ok((field), (max)))                                                              \
            return fail(reason, SP_ESCHEMA, "%s: not UTF-8 text of at most %d bytes", (name),      \
                        (int)(max));                                                               \
    } while (0)
#define CHECK_ID(field, name)                                                                      \
    do {                                                                                           \
        if (!sp_id_valid(field))                                                                   \
            return fail(reason, SP_ESCHEMA, "%s: not an id ([a-z0-9_-], 1..64 chars)", (name));    \
    } while (0)
#define CHECK_OPT_ID(field, name)                                                                  \
    do {                                                                                           \
        if ((field)[0] && !sp_id_valid(field))                                                     \
            return fail(reason, SP_ESCHEMA, "%s: not an id ([a-z0-9_-], 1..64 chars)", (name));    \
    } while (0)

/* A path inside a sandbox as the files API records it: absolute, normalised, text. */
#define CHECK_PATH(field, name)                                                                    \
    do {                                                                                           \
        if (!sp_fspath_canonical(field))                                                           \
            return fail(reason, SP_ESCHEMA,                                                        \
                        "%s: not an absolute normalised path of at most %d "                       \
                        "bytes of text",                                                           \
                        (name), FILE_PATH_MAX);                                                    \
    } while (0)
#define CHECK_USER(field)                                                                          \
    do {                                                                                           \
        if ((field)[0] && strcmp((field), "root") != 0 && strcmp((field), "user") != 0)            \
            return fail(reason, SP_ESCHEMA, "user: root or user");                                 \
    } while (0)
static int validate_network(const Space__V1__NetworkPolicy *p, char reason[SP_REASON_MAX]);

/* The wire shape of a create: what the event log and the projection need to store it. Its
 * values (template name, time limits, resources, on_timeout, project) are the intent check's
 * (intent.h): a well-formed create that asks for what the platform does not give is stored
 * and then refused by the scheduler as SandboxRequestRejected, visible to whoever sent it. */
static int validate_create(const Space__V1__SandboxCreateRequested *p, char reason[SP_REASON_MAX])
{
    if (!p->template_[0])
        return fail(reason, SP_ESCHEMA, "template: missing");
    CHECK_TEXT(p->template_, ID_MAX, "template");
    if (p->n_metadata > METADATA_MAX)
        return fail(reason, SP_ESCHEMA, "metadata: %zu entries, at most %d", p->n_metadata,
                    METADATA_MAX);
    for (size_t i = 0; i < p->n_metadata; i++) {
        if (!p->metadata[i] || !p->metadata[i]->key[0])
            return fail(reason, SP_ESCHEMA, "metadata[%zu]: empty key", i);
        CHECK_TEXT(p->metadata[i]->key, METADATA_KEY_MAX, "metadata key");
        CHECK_TEXT(p->metadata[i]->value, METADATA_VALUE_MAX, "metadata value");
    }
    if (p->n_env_names > ENV_NAMES_MAX)
        return fail(reason, SP_ESCHEMA, "env_names: %zu entries, at most %d", p->n_env_names,
                    ENV_NAMES_MAX);
    for (size_t i = 0; i < p->n_env_names; i++)
        if (!env_name_ok(p->env_names[i]))
            return fail(reason, SP_ESCHEMA, "env_names[%zu]: not an environment variable name", i);
    CHECK_TEXT(p->idempotency_key, CORR_MAX, "idempotency_key");
    CHECK_TEXT(p->on_timeout, 16, "on_timeout");
    CHECK_TEXT(p->project, SP_CRED_NAME_MAX, "project");
    if (p->snapshot[0] && !sp_snapshot_id_valid(p->snapshot))
        return fail(reason, SP_ESCHEMA, "snapshot: not a snapshot id");
    return validate_network(p->network, reason);
}

static int validate_network(const Space__V1__NetworkPolicy *p, char reason[SP_REASON_MAX])
{
    sp_netmode_t mode;
    sp_netentry_t e;
    if (!p)
        return 0;
    if (sp_netmode_parse(p->mode, &mode) < 0)
        return fail(reason, SP_ESCHEMA, "network.mode: deny_all, allow_all or allowlist");
    if (p->n_allow > SP_NETPOLICY_ENTRIES_MAX || p->n_deny > SP_NETPOLICY_ENTRIES_MAX)
        return fail(reason, SP_ESCHEMA, "network: at most %d allow and %d deny entries",
                    SP_NETPOLICY_ENTRIES_MAX, SP_NETPOLICY_ENTRIES_MAX);
    for (size_t i = 0; i < p->n_allow; i++)
        if (sp_netentry_parse(p->allow[i], &e) < 0)
            return fail(reason, SP_ESCHEMA, "network.allow[%zu]: not a name, *.name or CIDR", i);
    for (size_t i = 0; i < p->n_deny; i++)
        if (sp_netentry_parse(p->deny[i], &e) < 0)
            return fail(reason, SP_ESCHEMA, "network.deny[%zu]: not a name, *.name or CIDR", i);
    if (!sp_netpolicy_rate_valid(p->up_bytes_per_s) ||
        !sp_netpolicy_rate_valid(p->down_bytes_per_s))
        return fail(reason, SP_ESCHEMA, "network: bytes per second 0 or %d..%lld",
                    SP_NETPOLICY_RATE_MIN, (long long)SP_NETPOLICY_RATE_MAX);
    return 0;
}

static int validate_decision(const Space__V1__EgressDecision *d, char reason[SP_REASON_MAX])
{
    if (!d)
        return fail(reason, SP_ESCHEMA, "decision: missing");
    if (strcmp(d->protocol, "dns") != 0 && strcmp(d->protocol, "http") != 0 &&
        strcmp(d->protocol, "tls") != 0 && strcmp(d->protocol, "https") != 0 &&
        strcmp(d->protocol, "tcp") != 0)
        return fail(reason, SP_ESCHEMA, "decision.protocol: dns, http, tls, https or tcp");
    /* The name is whatever the guest sent (escaped by egressd): any text, bounded. */
    CHECK_TEXT(d->name, TEXT_MAX, "decision.name");
    CHECK_TEXT(d->address, 16, "decision.address");
    if (d->port > 65535)
        return fail(reason, SP_ESCHEMA, "decision.port: over 65535");
    CHECK_TEXT(d->rule, TEXT_MAX, "decision.rule");
    CHECK_TEXT(d->reason, ID_MAX, "decision.reason");
    if (d->count == 0)
        return fail(reason, SP_ESCHEMA, "decision.count: at least 1");
    return 0;
}

static int validate_cred_use(const Space__V1__CredentialUse *u, char reason[SP_REASON_MAX])
{
    if (!u)
        return fail(reason, SP_ESCHEMA, "use: missing");
    CHECK_ID(u->sandbox, "use.sandbox");
    CHECK_TEXT(u->host, TEXT_MAX, "use.host");
    CHECK_TEXT(u->method, 16, "use.method");
    CHECK_TEXT(u->path, TEXT_MAX, "use.path");
    CHECK_ID(u->reason, "use.reason");
    CHECK_TEXT(u->name, SP_CRED_NAME_MAX, "use.name");
    if (u->count == 0)
        return fail(reason, SP_ESCHEMA, "use.count: at least 1");
    return 0;
}

static int validate_cred_created(const Space__V1__CredentialCreated *p, char reason[SP_REASON_MAX])
{
    if (!sp_cred_name_valid(p->name, strlen(p->name)))
        return fail(reason, SP_ESCHEMA, "name: 1..64 of [A-Za-z0-9_.-]");
    if (!p->scope || sp_cred_scope_rank(p->scope->kind) < 0)
        return fail(reason, SP_ESCHEMA, "scope.kind: tenant, project or sandbox");
    CHECK_TEXT(p->scope->id, ID_MAX, "scope.id");
    if (p->n_hosts == 0 || p->n_hosts > SP_CRED_HOSTS_MAX)
        return fail(reason, SP_ESCHEMA, "hosts: 1..%d", SP_CRED_HOSTS_MAX);
    for (size_t i = 0; i < p->n_hosts; i++) {
        sp_cred_host_t h;
        if (sp_cred_host_parse(p->hosts[i], &h) < 0)
            return fail(reason, SP_ESCHEMA, "hosts[%zu]: not a host entry", i);
    }
    if (!sp_cred_inject_parse(p->inject_type))
        return fail(reason, SP_ESCHEMA, "inject_type: header, bearer, basic or query");
    CHECK_TEXT(p->inject_name, ID_MAX, "inject_name");
    CHECK_TEXT(p->inject_user, TEXT_MAX, "inject_user");
    CHECK_TEXT(p->key_id, ID_MAX, "key_id");
    return 0;
}

bool sp_envelope_file_paths(sp_envelope_t *env, sp_file_paths_t *ret)
{
    switch (env->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_WRITTEN:
        *ret = (sp_file_paths_t){&env->file_written->path, NULL, &env->file_written->sealed};
        return true;
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_REMOVED:
        *ret = (sp_file_paths_t){&env->file_removed->path, NULL, &env->file_removed->sealed};
        return true;
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_MOVED:
        *ret = (sp_file_paths_t){&env->file_moved->from, &env->file_moved->to,
                                 &env->file_moved->sealed};
        return true;
    case SPACE__V1__ENVELOPE__PAYLOAD_DIR_CREATED:
        *ret = (sp_file_paths_t){&env->dir_created->path, NULL, &env->dir_created->sealed};
        return true;
    default:
        return false;
    }
}

const char *sp_envelope_plaintext_content(const sp_envelope_t *env)
{
    sp_file_paths_t fp;
    /* The accessor takes the envelope to write through; nothing is written here. */
    if (sp_envelope_file_paths((sp_envelope_t *)env, &fp))
        return (*fp.path)[0] ? "file path" : NULL;
    switch (env->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED:
        return env->command_requested->sealed ? NULL : "command line";
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT:
        return env->command_output->data.len ? "command output" : NULL;
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED: /* a short command's, with its output */
        for (size_t i = 0; i < env->command_exited->n_output; i++)
            if (env->command_exited->output[i]->data.len)
                return "command output";
        return NULL;
    default:
        return NULL;
    }
}

/* A sealed field (docs/audit.md): AES-256-GCM under a data key, so a whole 12-byte nonce, a
 * ciphertext of at least its 16-byte tag and at most plain_max + 16 bytes, and the key's
 * fingerprint. prefix names the fields in the reason ("cmdline_" -> cmdline_nonce). */
static int check_sealed(size_t ct_len, size_t plain_max, size_t nonce_len, const char *key_id,
                        const char *prefix, char reason[SP_REASON_MAX])
{
    if (nonce_len != 12)
        return fail(reason, SP_ESCHEMA, "%snonce: %zu bytes, want 12", prefix, nonce_len);
    if (ct_len < 16 || ct_len > plain_max + 16)
        return fail(reason, SP_ESCHEMA, "%sciphertext: %zu bytes, want 16..%zu", prefix, ct_len,
                    plain_max + 16);
    if (strlen(key_id) != 16 || strspn(key_id, "0123456789abcdef") != 16)
        return fail(reason, SP_ESCHEMA, "%skey_id: want 16 lower-case hex characters", prefix);
    return 0;
}

/* A file event's paths: in the clear and canonical, or only sealed. */
static int check_file_paths(const sp_envelope_t *e, char reason[SP_REASON_MAX])
{
    sp_file_paths_t fp;
    (void)sp_envelope_file_paths((sp_envelope_t *)e, &fp);
    const Space__V1__SealedPaths *sp = *fp.sealed;
    if (sp) {
        if ((*fp.path)[0] || (fp.to && (*fp.to)[0]))
            return fail(reason, SP_ESCHEMA, "sealed: the paths must not be in the clear too");
        return check_sealed(sp->ciphertext.len, SP_FILE_PATHS_SEALED_MAX, sp->nonce.len, sp->key_id,
                            "sealed.", reason);
    }
    CHECK_PATH(*fp.path, fp.to ? "from" : "path");
    if (fp.to)
        CHECK_PATH(*fp.to, "to");
    return 0;
}

static int validate_started(const Space__V1__CommandStarted *p, char reason[SP_REASON_MAX])
{
    CHECK_ID(p->cmd_id, "cmd_id");
    if (p->cmdline_ciphertext.len || p->cmdline_nonce.len || p->cmdline_key_id[0])
        return check_sealed(p->cmdline_ciphertext.len, SP_COMMAND_LINE_SEALED_MAX,
                            p->cmdline_nonce.len, p->cmdline_key_id, "cmdline_", reason);
    return 0;
}

static int validate_output(const Space__V1__CommandOutput *p, char reason[SP_REASON_MAX])
{
    CHECK_ID(p->cmd_id, "cmd_id");
    if (p->stream != 1 && p->stream != 2)
        return fail(reason, SP_ESCHEMA, "stream: %u, want 1 or 2", p->stream);
    if (p->data.len > SP_COMMAND_OUTPUT_CHUNK_MAX)
        return fail(reason, SP_ESCHEMA, "data: %zu bytes, at most %d", p->data.len,
                    SP_COMMAND_OUTPUT_CHUNK_MAX);
    /* Sealed output (docs/audit.md): never next to plaintext, a whole nonce and tag. */
    if (p->ciphertext.len || p->nonce.len || p->key_id[0]) {
        if (p->data.len)
            return fail(reason, SP_ESCHEMA, "data: plaintext next to a ciphertext");
        return check_sealed(p->ciphertext.len, SP_COMMAND_OUTPUT_CHUNK_MAX, p->nonce.len, p->key_id,
                            "", reason);
    }
    return 0;
}

/* A CommandExited, with a short command's start and output inside (space.proto): each as
 * its own event would be, all of the same command, within the carry bounds. */
static int validate_exited(const Space__V1__CommandExited *p, char reason[SP_REASON_MAX])
{
    CHECK_ID(p->cmd_id, "cmd_id");
    CHECK_TEXT(p->error, TEXT_MAX * 4, "error");
    if ((p->stdout_sha256.len != 0 && p->stdout_sha256.len != 32) ||
        (p->stderr_sha256.len != 0 && p->stderr_sha256.len != 32))
        return fail(reason, SP_ESCHEMA, "sha256: want 32 bytes");
    if (p->n_output && !p->started)
        return fail(reason, SP_ESCHEMA, "output: only with started");
    if (p->n_output > SP_COMMAND_EXITED_OUTPUT_MAX)
        return fail(reason, SP_ESCHEMA, "output: %zu entries, at most %d", p->n_output,
                    SP_COMMAND_EXITED_OUTPUT_MAX);
    size_t carried = 0;
    int rc;
    if (p->started) {
        if ((rc = validate_started(p->started, reason)) < 0)
            return rc;
        if (strcmp(p->started->cmd_id, p->cmd_id) != 0)
            return fail(reason, SP_ESCHEMA, "started.cmd_id: not the command's");
        carried += p->started->cmdline_ciphertext.len;
    }
    for (size_t i = 0; i < p->n_output; i++) {
        const Space__V1__CommandOutput *o = p->output[i];
        if ((rc = validate_output(o, reason)) < 0)
            return rc;
        if (strcmp(o->cmd_id, p->cmd_id) != 0)
            return fail(reason, SP_ESCHEMA, "output.cmd_id: not the command's");
        carried += o->data.len + o->ciphertext.len;
    }
    if (carried > SP_COMMAND_EXITED_CARRY_MAX)
        return fail(reason, SP_ESCHEMA, "started and output: %zu bytes, at most %d", carried,
                    SP_COMMAND_EXITED_CARRY_MAX);
    return 0;
}

static int validate_command(const Space__V1__CommandRequested *p, char reason[SP_REASON_MAX])
{
    CHECK_ID(p->cmd_id, "cmd_id");
    /* Sealed (docs/audit.md): the line is recorded by the worker, in CommandStarted. */
    if (p->sealed && (p->n_argv != 0 || p->cmd[0] != '\0'))
        return fail(reason, SP_ESCHEMA, "sealed: argv and cmd must be empty");
    if (!p->sealed && (p->n_argv == 0) == (p->cmd[0] == '\0'))
        return fail(reason, SP_ESCHEMA, "exactly one of argv and cmd");
    if (p->n_argv > ARGV_MAX)
        return fail(reason, SP_ESCHEMA, "argv: %zu entries, at most %d", p->n_argv, ARGV_MAX);
    for (size_t i = 0; i < p->n_argv; i++)
        if (!script_ok(p->argv[i], ARG_MAX_BYTES))
            return fail(reason, SP_ESCHEMA, "argv[%zu]: not UTF-8 text of at most %d bytes", i,
                        ARG_MAX_BYTES);
    if (!script_ok(p->cmd, CMD_MAX_BYTES))
        return fail(reason, SP_ESCHEMA, "cmd: not UTF-8 text of at most %d bytes", CMD_MAX_BYTES);
    if (p->n_env_names > ENV_NAMES_MAX)
        return fail(reason, SP_ESCHEMA, "env_names: %zu entries, at most %d", p->n_env_names,
                    ENV_NAMES_MAX);
    for (size_t i = 0; i < p->n_env_names; i++)
        if (!env_name_ok(p->env_names[i]))
            return fail(reason, SP_ESCHEMA, "env_names[%zu]: not an environment variable name", i);
    CHECK_TEXT(p->cwd, 1024, "cwd");
    if (p->user[0] && strcmp(p->user, "root") != 0 && strcmp(p->user, "user") != 0)
        return fail(reason, SP_ESCHEMA, "user: root or user");
    if (p->timeout_s > 24 * 3600)
        return fail(reason, SP_ESCHEMA, "timeout_s: %u is over 24 h", p->timeout_s);
    if (p->stdin_sha256.len != 0 && p->stdin_sha256.len != 32)
        return fail(reason, SP_ESCHEMA, "stdin_sha256: want 32 bytes");
    return 0;
}

static int validate_list(char **items, size_t n, const char *name, char reason[SP_REASON_MAX])
{
    if (n > LIST_MAX)
        return fail(reason, SP_ESCHEMA, "%s: %zu entries, at most %d", name, n, LIST_MAX);
    for (size_t i = 0; i < n; i++)
        CHECK_ID(items[i], name);
    return 0;
}

static int validate_payload(const sp_envelope_t *e, char reason[SP_REASON_MAX])
{
    switch (e->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED:
        return validate_create(e->sandbox_create_requested, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED:
        CHECK_TEXT(e->sandbox_delete_requested->reason, TEXT_MAX, "reason");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED:
        CHECK_TEXT(e->sandbox_suspend_requested->reason, TEXT_MAX, "reason");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED:
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDING:
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED:
        CHECK_ID(e->sandbox_placed->worker, "worker");
        CHECK_TEXT(e->sandbox_placed->scheduler, ID_MAX, "scheduler");
        /* The worker makes the sandbox from this request: the scheduler placed it only after
         * the intent check, and a placement that carries anything else is refused here. */
        if (!e->sandbox_placed->request)
            return 0;
        if (validate_create(e->sandbox_placed->request, reason) < 0)
            return SP_ESCHEMA;
        return sp_intent_check_create(e->sandbox_placed->request, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_UPDATE_REQUESTED:
        if (!e->network_policy_update_requested->network)
            return fail(reason, SP_ESCHEMA, "network: missing");
        return validate_network(e->network_policy_update_requested->network, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_CHANGED:
        if (!e->network_policy_changed->network)
            return fail(reason, SP_ESCHEMA, "network: missing");
        CHECK_OPT_ID(e->network_policy_changed->egressd, "egressd");
        return validate_network(e->network_policy_changed->network, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_ALLOWED:
        return validate_decision(e->egress_allowed->decision, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED:
        return validate_decision(e->egress_denied->decision, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_CREATED:
        return validate_cred_created(e->credential_created, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_ROTATED:
        if (e->credential_rotated->version < 2)
            return fail(reason, SP_ESCHEMA, "version: a rotation makes version 2 or later");
        CHECK_TEXT(e->credential_rotated->key_id, ID_MAX, "key_id");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DELETED:
        CHECK_TEXT(e->credential_deleted->reason, TEXT_MAX, "reason");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_USED:
        return validate_cred_use(e->credential_used->use, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_CREDENTIAL_DENIED:
        return validate_cred_use(e->credential_denied->use, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED:
        CHECK_ID(e->sandbox_started->worker, "worker");
        CHECK_OPT_ID(e->sandbox_started->runtime, "runtime");
        CHECK_TEXT(e->sandbox_started->address, ID_MAX, "address");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED:
        CHECK_TEXT(e->sandbox_failed->reason, TEXT_MAX, "reason");
        CHECK_TEXT(e->sandbox_failed->detail, TEXT_MAX * 4, "detail");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED:
        CHECK_ID(e->sandbox_resumed->worker, "worker");
        CHECK_TEXT(e->sandbox_resumed->address, ID_MAX, "address");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED: {
        const Space__V1__SandboxSuspended *p = e->sandbox_suspended;
        if (p->n_artifacts == 0 || p->n_artifacts > ARTIFACTS_MAX)
            return fail(reason, SP_ESCHEMA, "artifacts: %zu, want 1..%d", p->n_artifacts,
                        ARTIFACTS_MAX);
        for (size_t i = 0; i < p->n_artifacts; i++) {
            const Space__V1__SnapshotArtifact *a = p->artifacts[i];
            CHECK_TEXT(a->name, ID_MAX, "artifact name");
            CHECK_TEXT(a->store_key, TEXT_MAX, "artifact store_key");
            if (a->sha256.len != 32)
                return fail(reason, SP_ESCHEMA, "artifacts[%zu].sha256: %zu bytes, want 32", i,
                            a->sha256.len);
        }
        CHECK_OPT_ID(p->worker, "worker");
        CHECK_TEXT(p->store, ID_MAX, "store");
        return 0;
    }
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMING:
        CHECK_ID(e->sandbox_resuming->worker, "worker");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOT_REQUESTED:
        if (!sp_snapshot_id_valid(e->sandbox_snapshot_requested->snapshot_id))
            return fail(reason, SP_ESCHEMA, "snapshot_id: not a snapshot id");
        if (!sp_snapshot_name_valid(e->sandbox_snapshot_requested->name))
            return fail(reason, SP_ESCHEMA, "name: 1..%d printable ASCII characters",
                        SP_SNAPSHOT_NAME_MAX);
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETE_REQUESTED:
        if (!sp_snapshot_id_valid(e->snapshot_delete_requested->snapshot_id))
            return fail(reason, SP_ESCHEMA, "snapshot_id: not a snapshot id");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SNAPSHOT_DELETED:
        if (!sp_snapshot_id_valid(e->snapshot_deleted->snapshot_id))
            return fail(reason, SP_ESCHEMA, "snapshot_id: not a snapshot id");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOTTED: {
        const Space__V1__SandboxSnapshotted *p = e->sandbox_snapshotted;
        if (!sp_snapshot_id_valid(p->snapshot_id))
            return fail(reason, SP_ESCHEMA, "snapshot_id: not a snapshot id");
        if (!sp_snapshot_name_valid(p->name))
            return fail(reason, SP_ESCHEMA, "name: 1..%d printable ASCII characters",
                        SP_SNAPSHOT_NAME_MAX);
        if (p->n_artifacts == 0 || p->n_artifacts > ARTIFACTS_MAX)
            return fail(reason, SP_ESCHEMA, "artifacts: %zu, want 1..%d", p->n_artifacts,
                        ARTIFACTS_MAX);
        for (size_t i = 0; i < p->n_artifacts; i++) {
            const Space__V1__SnapshotArtifact *a = p->artifacts[i];
            CHECK_TEXT(a->name, ID_MAX, "artifact name");
            CHECK_TEXT(a->store_key, TEXT_MAX, "artifact store_key");
            if (a->sha256.len != 32)
                return fail(reason, SP_ESCHEMA, "artifacts[%zu].sha256: %zu bytes, want 32", i,
                            a->sha256.len);
        }
        CHECK_ID(p->worker, "worker");
        CHECK_ID(p->template_, "template");
        CHECK_TEXT(p->store, ID_MAX, "store");
        CHECK_TEXT(p->address, ID_MAX, "address");
        return 0;
    }
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED:
        CHECK_TEXT(e->sandbox_deleted->reason, TEXT_MAX, "reason");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED:
        return validate_command(e->command_requested, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_TIMEOUT_REQUESTED:
        if (e->sandbox_timeout_requested->timeout_s == 0 ||
            e->sandbox_timeout_requested->timeout_s > 2592000)
            return fail(reason, SP_ESCHEMA, "timeout_s: %u, want 1..2592000",
                        e->sandbox_timeout_requested->timeout_s);
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED:
        return validate_started(e->command_started, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT:
        return validate_output(e->command_output, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED:
        return validate_exited(e->command_exited, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_ADOPTED:
        CHECK_ID(e->sandbox_adopted->worker, "worker");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_FAILED: {
        const Space__V1__SandboxSuspendFailed *p = e->sandbox_suspend_failed;
        CHECK_ID(p->reason, "reason");
        CHECK_TEXT(p->detail, TEXT_MAX * 4, "detail");
        if (strcmp(p->state, "running") != 0 && strcmp(p->state, "paused") != 0)
            return fail(reason, SP_ESCHEMA, "state: running or paused");
        return 0;
    }
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_FAILED:
        CHECK_ID(e->sandbox_resume_failed->reason, "reason");
        CHECK_TEXT(e->sandbox_resume_failed->detail, TEXT_MAX * 4, "detail");
        CHECK_OPT_ID(e->sandbox_resume_failed->worker, "worker");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_AGENT_CHANNEL_LOST:
        CHECK_ID(e->agent_channel_lost->reason, "reason");
        CHECK_TEXT(e->agent_channel_lost->detail, TEXT_MAX * 4, "detail");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_AGENT_CHANNEL_RESTORED:
        CHECK_TEXT(e->agent_channel_restored->agent_version, ID_MAX, "agent_version");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_WRITTEN: {
        const Space__V1__FileWritten *p = e->file_written;
        int rc = check_file_paths(e, reason);
        if (rc < 0)
            return rc;
        if (p->sha256.len != 32)
            return fail(reason, SP_ESCHEMA, "sha256: %zu bytes, want 32", p->sha256.len);
        if (p->mode > 07777)
            return fail(reason, SP_ESCHEMA, "mode: %o is not permission bits", p->mode);
        CHECK_USER(p->user);
        return 0;
    }
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_REMOVED:
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_MOVED:
        return check_file_paths(e, reason);
    case SPACE__V1__ENVELOPE__PAYLOAD_DIR_CREATED: {
        int rc = check_file_paths(e, reason);
        if (rc < 0)
            return rc;
        CHECK_USER(e->dir_created->user);
        return 0;
    }
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED: {
        const Space__V1__SandboxRequestRejected *p = e->sandbox_request_rejected;
        if (sp_event_type_from_name(p->request_type) == SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET)
            return fail(reason, SP_ESCHEMA, "request_type: not an event type");
        CHECK_ID(p->reason, "reason");
        CHECK_TEXT(p->detail, TEXT_MAX * 4, "detail");
        return 0;
    }
    case SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT: {
        const Space__V1__WorkerHeartbeat *p = e->worker_heartbeat;
        CHECK_ID(p->worker, "worker");
        if (strcmp(p->worker, e->aggregate->id) != 0)
            return fail(reason, SP_ESCHEMA, "worker: differs from the aggregate id");
        CHECK_TEXT(p->host, TEXT_MAX, "host");
        CHECK_TEXT(p->version, ID_MAX, "version");
        if (p->vcpu_used > p->vcpu_total || p->memory_mb_used > p->memory_mb_total)
            return fail(reason, SP_ESCHEMA, "capacity: used exceeds total");
        if (p->disk_mb_free > p->disk_mb_total || p->disk_mb_reserve > p->disk_mb_total)
            return fail(reason, SP_ESCHEMA, "disk: free or reserve exceeds total");
        if (p->interval_ms == 0 || p->interval_ms > 3600 * 1000)
            return fail(reason, SP_ESCHEMA, "interval_ms: %u, want 1..3600000", p->interval_ms);
        int rc = validate_list(p->templates, p->n_templates, "templates", reason);
        if (rc < 0)
            return rc;
        /* Warm pools (docs/pools.md): one level per template, at most what it is sized for. */
        if (p->n_pools > LIST_MAX)
            return fail(reason, SP_ESCHEMA, "pools: %zu entries, at most %d", p->n_pools, LIST_MAX);
        for (size_t i = 0; i < p->n_pools; i++) {
            if (!p->pools[i])
                return fail(reason, SP_ESCHEMA, "pools: empty entry");
            CHECK_ID(p->pools[i]->template_, "pools.template");
            if (p->pools[i]->ready > p->pools[i]->size)
                return fail(reason, SP_ESCHEMA, "pools: %u ready, sized %u", p->pools[i]->ready,
                            p->pools[i]->size);
        }
        return validate_list(p->runtimes, p->n_runtimes, "runtimes", reason);
    }
    case SPACE__V1__ENVELOPE__PAYLOAD_WORKER_RECONCILED: {
        const Space__V1__WorkerReconciled *p = e->worker_reconciled;
        CHECK_ID(p->worker, "worker");
        if (strcmp(p->worker, e->aggregate->id) != 0)
            return fail(reason, SP_ESCHEMA, "worker: differs from the aggregate id");
        int rc = validate_list(p->adopted, p->n_adopted, "adopted", reason);
        if (rc == 0)
            rc = validate_list(p->lost, p->n_lost, "lost", reason);
        if (rc == 0)
            rc = validate_list(p->cleaned, p->n_cleaned, "cleaned", reason);
        return rc;
    }
    case SPACE__V1__ENVELOPE__PAYLOAD_WORKER_STOPPED:
        CHECK_ID(e->worker_stopped->worker, "worker");
        if (strcmp(e->worker_stopped->worker, e->aggregate->id) != 0)
            return fail(reason, SP_ESCHEMA, "worker: differs from the aggregate id");
        CHECK_TEXT(e->worker_stopped->reason, TEXT_MAX, "reason");
        return 0;
    case SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET:
    default:
        break;
    }
    return fail(reason, SP_ETYPE, "no known payload");
}

int sp_envelope_validate(const sp_envelope_t *e, char reason[SP_REASON_MAX])
{
    uint8_t uuid[16];

    if (e->schema_version != SP_SCHEMA_VERSION)
        return fail(reason, SP_EVERSION, "schema_version %u is not supported (want %d)",
                    e->schema_version, SP_SCHEMA_VERSION);
    if (sp_uuid_parse(e->event_id, uuid) < 0 || (uuid[6] >> 4) != 7)
        return fail(reason, SP_ESCHEMA, "event_id: not a UUIDv7");
    if (!text_ok(e->type, ID_MAX))
        return fail(reason, SP_ETYPE, "type: not text");
    const char *want = sp_event_type_name(e->payload_case);
    if (!want) {
        if (sp_event_type_from_name(e->type) != SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET)
            return fail(reason, SP_ETYPE, "type %s: payload missing", e->type);
        return fail(reason, SP_ETYPE, "type %s: unknown event type", e->type);
    }
    if (strcmp(want, e->type) != 0)
        return fail(reason, SP_ETYPE, "type %s does not match payload %s", e->type, want);
    if (!e->aggregate)
        return fail(reason, SP_ESCHEMA, "aggregate: missing");
    const char *kind = sp_event_is_worker(e->payload_case) ? "worker"
                       : sp_event_is_cred(e->payload_case) ? "credential"
                                                           : "sandbox";
    if (strcmp(e->aggregate->kind, kind) != 0)
        return fail(reason, SP_ESCHEMA, "aggregate.kind: %s events are about a %s", e->type, kind);
    CHECK_ID(e->aggregate->id, "aggregate.id");
    if (sp_event_is_worker(e->payload_case))
        CHECK_OPT_ID(e->tenant, "tenant");
    else
        CHECK_ID(e->tenant, "tenant");
    if (!e->actor[0])
        return fail(reason, SP_ESCHEMA, "actor: missing");
    CHECK_TEXT(e->actor, ACTOR_MAX, "actor");
    if (e->occurred_at_us < TIME_MIN_US || e->occurred_at_us > TIME_MAX_US)
        return fail(reason, SP_ESCHEMA, "occurred_at_us: %lld is outside 2020..2100",
                    (long long)e->occurred_at_us);
    CHECK_TEXT(e->correlation_id, CORR_MAX, "correlation_id");
    if (e->causation_id[0] && sp_uuid_parse(e->causation_id, uuid) < 0)
        return fail(reason, SP_ESCHEMA, "causation_id: not a UUID");
    /* Whether the signature verifies, and whether the signer may say this, is the trust
     * check's (trust.h); the schema only bounds the fields. A signer without a signature is
     * the state sp_envelope_encode_signed encodes before signing. */
    if (e->signer[0]) {
        sp_identity_t id;
        if (sp_identity_parse(e->signer, &id) < 0)
            return fail(reason, SP_ESCHEMA, "signer: not an identity (kind[-id], at most %d bytes)",
                        SP_IDENTITY_MAX);
    }
    if (e->signature.len != 0 && e->signature.len != SIG_LEN)
        return fail(reason, SP_ESCHEMA, "signature: %zu bytes, want %d", e->signature.len, SIG_LEN);
    if (e->signature.len && !e->signer[0])
        return fail(reason, SP_ESCHEMA, "signature: without signer");
    /* Batch fields are bounded here so that no consumer hashes an unbounded proof; whether
     * they lead to the signed root is the signature check's. */
    if (e->sig_count > SIG_BATCH_MAX)
        return fail(reason, SP_ESCHEMA, "sig_count: %u, at most %d", e->sig_count, SIG_BATCH_MAX);
    if (e->sig_index >= (e->sig_count ? e->sig_count : 1))
        return fail(reason, SP_ESCHEMA, "sig_index: %u is not below sig_count %u", e->sig_index,
                    e->sig_count);
    if (e->sig_proof.len > SIG_PROOF_MAX || e->sig_proof.len % 32 != 0)
        return fail(reason, SP_ESCHEMA, "sig_proof: %zu bytes, want a multiple of 32 up to %d",
                    e->sig_proof.len, SIG_PROOF_MAX);
    /* A headed batch (docs/trust.md): the head lists the leaves under its signature, and
     * every other member names its head instead of carrying a signature. */
    if (e->sig_leaves.len) {
        if (!e->signature.len || e->sig_proof.len || e->sig_index != 0 || e->sig_head.len ||
            e->sig_leaves.len % 32 != 0 || e->sig_leaves.len / 32 < 2 ||
            e->sig_leaves.len / 32 != e->sig_count)
            return fail(reason, SP_ESCHEMA,
                        "sig_leaves: %zu bytes, want 32 x sig_count (2..%d) on a signed head at "
                        "index 0 without proof or head",
                        e->sig_leaves.len, SIG_BATCH_MAX);
        return validate_payload(e, reason);
    }
    if (e->sig_head.len) {
        if (e->signature.len || e->sig_proof.len || e->sig_index == 0 || e->sig_count < 2 ||
            !e->signer[0] || e->sig_head.len != 16)
            return fail(reason, SP_ESCHEMA,
                        "sig_head: want a head's 16-byte event_id on an unsigned member with a "
                        "signer, at index 1 or later of at least 2");
        return validate_payload(e, reason);
    }
    if ((e->sig_proof.len || e->sig_count) && !e->signature.len)
        return fail(reason, SP_ESCHEMA, "sig_proof, sig_count: without signature");
    return validate_payload(e, reason);
}

int sp_envelope_encode(const sp_envelope_t *env, uint8_t **ret_buf, size_t *ret_len)
{
    char reason[SP_REASON_MAX];
    int rc = sp_envelope_validate(env, reason);
    if (rc < 0)
        return SP_ESCHEMA;
    size_t n = space__v1__envelope__get_packed_size(env);
    if (n > SP_ENVELOPE_MAX)
        return SP_ETOOBIG;
    uint8_t *buf = sp_xmalloc(n ? n : 1);
    space__v1__envelope__pack(env, buf);
    *ret_buf = buf;
    *ret_len = n;
    return 0;
}

int sp_envelope_decode(const uint8_t *buf, size_t len, sp_envelope_t **ret_env,
                       char reason[SP_REASON_MAX])
{
    if (len > SP_ENVELOPE_MAX)
        return fail(reason, SP_ETOOBIG, "envelope of %zu bytes exceeds %d", len, SP_ENVELOPE_MAX);
    if (len == 0)
        return fail(reason, SP_EDECODE, "empty message");
    sp_envelope_t *e = space__v1__envelope__unpack(NULL, len, buf);
    if (!e)
        return fail(reason, SP_EDECODE, "not a protobuf Envelope (truncated or corrupt)");
    /* What protobuf-c lets through but would not give back: a field numbered 0 (accepted
     * when its key is a non-minimal varint, then packed as a key it refuses) and a string
     * cut at a NUL byte (what a reader sees would differ from the signed bytes). */
    int rc = sp_proto_wire_check(e->base.descriptor, buf, len, reason);
    if (rc == 0)
        rc = sp_envelope_validate(e, reason);
    if (rc < 0) {
        space__v1__envelope__free_unpacked(e, NULL);
        return rc;
    }
    *ret_env = e;
    return 0;
}

void sp_envelope_free(sp_envelope_t *env)
{
    if (env)
        space__v1__envelope__free_unpacked(env, NULL);
}

int sp_envelope_subject(const sp_envelope_t *env, const char *worker, char *buf, size_t len)
{
    int n;
    if (!env->aggregate || !sp_id_valid(env->aggregate->id) || !env->type[0])
        return SP_ESCHEMA;
    if (sp_event_is_worker(env->payload_case)) {
        n = snprintf(buf, len, "space.ev.wkr.%s.%s", env->aggregate->id, env->type);
    } else if (sp_event_is_egress(env->payload_case)) {
        n = snprintf(buf, len, "space.ev.egress.%s.%s", env->aggregate->id, env->type);
    } else if (sp_event_is_cred(env->payload_case)) {
        if (!sp_id_valid(env->tenant))
            return SP_ESCHEMA;
        n = snprintf(buf, len, "space.ev.cred.%s.%s", env->tenant, env->type);
    } else {
        if (worker && worker[0] && !sp_id_valid(worker))
            return SP_ESCHEMA;
        n = snprintf(buf, len, "space.ev.%s.%s.%s.%s",
                     sp_event_is_io(env->payload_case) ? "io" : "sbx",
                     worker && worker[0] ? worker : "_", env->aggregate->id, env->type);
    }
    if (n < 0 || (size_t)n >= len)
        return -ENOBUFS;
    return n;
}

int sp_envelope_check_subject(const sp_envelope_t *env, const char *subject,
                              char reason[SP_REASON_MAX])
{
    char want[256];
    const char *worker = NULL;
    char wbuf[ID_MAX + 1];

    /* The worker token is the one part the envelope does not determine: take it from the
     * subject after checking its shape, then require every other token to agree. */
    const char *prefix = sp_event_is_io(env->payload_case) ? "space.ev.io." : "space.ev.sbx.";
    size_t plen = strlen(prefix);
    if (!sp_event_is_worker(env->payload_case) && strncmp(subject, prefix, plen) == 0) {
        const char *w = subject + plen;
        const char *dot = strchr(w, '.');
        if (!dot || (size_t)(dot - w) > ID_MAX)
            return fail(reason, SP_ESCHEMA, "subject %.128s: malformed", subject);
        memcpy(wbuf, w, (size_t)(dot - w));
        wbuf[dot - w] = '\0';
        if (strcmp(wbuf, "_") != 0) {
            if (!sp_id_valid(wbuf))
                return fail(reason, SP_ESCHEMA, "subject %.128s: bad worker token", subject);
            worker = wbuf;
        }
    }
    if (sp_envelope_subject(env, worker, want, sizeof(want)) < 0 || strcmp(want, subject) != 0)
        return fail(reason, SP_ESCHEMA, "subject %.128s does not match the envelope", subject);
    return 0;
}

/* Reads a base-128 varint (at most 10 bytes) at *p, advancing it; -1 when truncated or too
 * long. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (*p >= end)
            return -1;
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *ret = v;
            return 0;
        }
    }
    return -1;
}

/* Skips the value of a field of wire type wt at *p; on a length-delimited one, *ret_val and
 * *ret_vlen get its bytes. -1 when truncated or of a wire type proto3 does not have. */
static int skip_value(const uint8_t **p, const uint8_t *end, unsigned wt, const uint8_t **ret_val,
                      size_t *ret_vlen)
{
    uint64_t v;
    switch (wt) {
    case 0: /* varint */
        return read_varint(p, end, &v);
    case 1: /* 64-bit */
        if ((size_t)(end - *p) < 8)
            return -1;
        *p += 8;
        return 0;
    case 2: /* length-delimited */
        if (read_varint(p, end, &v) < 0 || v > (uint64_t)(end - *p))
            return -1;
        *ret_val = *p;
        *ret_vlen = (size_t)v;
        *p += v;
        return 0;
    case 5: /* 32-bit */
        if ((size_t)(end - *p) < 4)
            return -1;
        *p += 4;
        return 0;
    default: /* groups (3, 4) are not in proto3, 6 and 7 do not exist */
        return -1;
    }
}

#define WIRE_DEPTH_MAX   32
#define FIELD_NUMBER_MAX 536870911u /* 2^29 - 1 */

static int wire_check(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
                      int depth, char reason[SP_REASON_MAX])
{
    if (depth > WIRE_DEPTH_MAX)
        return fail(reason, SP_EDECODE, "messages nested deeper than %d", WIRE_DEPTH_MAX);
    while (p < end) {
        uint64_t key;
        const uint8_t *val = NULL;
        size_t vlen = 0;
        if (read_varint(&p, end, &key) < 0 || skip_value(&p, end, key & 7, &val, &vlen) < 0)
            return fail(reason, SP_EDECODE, "%s: truncated or corrupt", d->short_name);
        uint64_t num = key >> 3;
        if (num == 0 || num > FIELD_NUMBER_MAX)
            return fail(reason, SP_EDECODE, "%s: field number %llu", d->short_name,
                        (unsigned long long)num);
        const ProtobufCFieldDescriptor *f =
            val ? protobuf_c_message_descriptor_get_field(d, (unsigned)num) : NULL;
        if (!f)
            continue;
        if (f->type == PROTOBUF_C_TYPE_STRING && memchr(val, '\0', vlen))
            return fail(reason, SP_EDECODE, "%s.%s: a string with a NUL byte", d->short_name,
                        f->name);
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            int rc = wire_check(f->descriptor, val, val + vlen, depth + 1, reason);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

int sp_proto_wire_check(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                        char reason[SP_REASON_MAX])
{
    return wire_check(desc, buf, buf + len, 0, reason);
}

int sp_envelope_canonical(const uint8_t *raw, size_t len, uint8_t *out, size_t *ret_len)
{
    const uint8_t *p = raw, *end = raw + len;
    size_t n = 0;

    if ((!raw && len) || !out || !ret_len)
        return -EINVAL;
    if (len == 0) {
        *ret_len = 0;
        return 0;
    }
    while (p < end) {
        const uint8_t *start = p;
        uint64_t key;

        const uint8_t *val;
        size_t vlen;
        if (read_varint(&p, end, &key) < 0 || skip_value(&p, end, key & 7, &val, &vlen) < 0)
            return SP_EDECODE;
        if ((key >> 3) >= SIG_FIELD_FIRST && (key >> 3) <= SIG_FIELD_LAST)
            continue;
        memcpy(out + n, start, (size_t)(p - start));
        n += (size_t)(p - start);
    }
    *ret_len = n;
    return 0;
}
