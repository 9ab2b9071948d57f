/* Synthetic events (eventgen.h). */
#include "eventgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <stdbool.h>

#include "contract.h"
#include "datakey.h"
#include "error.h"
#include "publish.h"
#include "xmalloc.h"

const sp_event_type_t sp_eventgen_lifecycle[5] = {
    SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED,
    SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED,
    SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED,
    SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED,
    SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED,
};

static int finish(sp_envelope_t *env, const char *worker, sp_eventgen_msg_t *out)
{
    sp_envelope_stamp(env, out->event_id);
    int rc = sp_envelope_subject(env, worker, out->subject, sizeof(out->subject));
    if (rc < 0)
        return rc;
    return sp_publish_pack(env, &out->data, &out->len);
}

int sp_eventgen_sandbox(sp_event_type_t type, const char *tenant, const char *sandbox,
                        const char *worker, sp_eventgen_msg_t *out)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SandboxCreateRequested create = SPACE__V1__SANDBOX_CREATE_REQUESTED__INIT;
    Space__V1__Resources res = SPACE__V1__RESOURCES__INIT;
    Space__V1__KeyValue kv = SPACE__V1__KEY_VALUE__INIT;
    Space__V1__KeyValue *kvs[1] = {&kv};
    Space__V1__SandboxPlaced placed = SPACE__V1__SANDBOX_PLACED__INIT;
    Space__V1__SandboxStarted started = SPACE__V1__SANDBOX_STARTED__INIT;
    Space__V1__SandboxPaused paused = SPACE__V1__SANDBOX_PAUSED__INIT;
    Space__V1__SandboxResumed resumed = SPACE__V1__SANDBOX_RESUMED__INIT;
    Space__V1__SandboxDeleted deleted = SPACE__V1__SANDBOX_DELETED__INIT;
    Space__V1__SandboxDeleteRequested delreq = SPACE__V1__SANDBOX_DELETE_REQUESTED__INIT;
    Space__V1__SandboxPauseRequested pausereq = SPACE__V1__SANDBOX_PAUSE_REQUESTED__INIT;
    char *w = (char *)(worker ? worker : "");

    memset(out, 0, sizeof(*out));
    agg.kind = "sandbox";
    agg.id = (char *)sandbox;
    env.aggregate = &agg;
    env.tenant = (char *)tenant;
    env.payload_case = type;
    switch (type) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED:
        env.actor = "key_demo";
        create.template_ = "tiny";
        create.timeout_s = 300;
        res.vcpu = 1;
        res.memory_mb = 256;
        create.resources = &res;
        kv.key = "purpose";
        kv.value = "demo";
        create.metadata = kvs;
        create.n_metadata = 1;
        env.sandbox_create_requested = &create;
        worker = NULL; /* not placed yet */
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED:
        env.actor = "svc:scheduler";
        placed.worker = w;
        placed.scheduler = "scheduler-1";
        env.sandbox_placed = &placed;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED:
        env.actor = "svc:worker";
        started.worker = w;
        started.runtime = "gvisor";
        started.start_ms = 61;
        env.sandbox_started = &started;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED:
        env.actor = "svc:worker";
        paused.took_ms = 45;
        env.sandbox_paused = &paused;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED:
        env.actor = "svc:worker";
        resumed.worker = w;
        resumed.took_ms = 44;
        env.sandbox_resumed = &resumed;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED:
        env.actor = "key_demo";
        delreq.reason = "api";
        env.sandbox_delete_requested = &delreq;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED:
        env.actor = "key_demo";
        env.sandbox_pause_requested = &pausereq;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED:
        env.actor = "svc:worker";
        deleted.reason = "api";
        env.sandbox_deleted = &deleted;
        break;
    default:
        return -EINVAL;
    }
    env.correlation_id = "eventgen";
    return finish(&env, worker, out);
}

int sp_eventgen_output(const char *tenant, const char *sandbox, const char *worker,
                       const char *cmd_id, uint64_t offset, const uint8_t *data, size_t len,
                       const sp_cred_key_t *dk, sp_eventgen_msg_t *out)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__CommandOutput o = SPACE__V1__COMMAND_OUTPUT__INIT;
    uint8_t nonce[SP_CRED_NONCE_LEN];

    memset(out, 0, sizeof(*out));
    if (len > SP_COMMAND_OUTPUT_CHUNK_MAX)
        return -EINVAL;
    agg.kind = "sandbox";
    agg.id = (char *)sandbox;
    env.aggregate = &agg;
    env.tenant = (char *)tenant;
    env.actor = "svc:worker";
    env.correlation_id = "eventgen";
    o.cmd_id = (char *)cmd_id;
    o.stream = 1;
    o.offset = offset;
    uint8_t *ct = NULL;
    if (dk) {
        ct = sp_xmalloc(len + SP_CRED_TAG_LEN);
        if (sp_output_seal(dk, sandbox, cmd_id, 1, offset, data, len, nonce, ct) < 0) {
            free(ct);
            return -EIO;
        }
        o.ciphertext = (ProtobufCBinaryData){len + SP_CRED_TAG_LEN, ct};
        o.nonce = (ProtobufCBinaryData){SP_CRED_NONCE_LEN, nonce};
        o.key_id = (char *)dk->id;
    } else {
        o.data = (ProtobufCBinaryData){len, (uint8_t *)data};
    }
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT;
    env.command_output = &o;
    int rc = finish(&env, worker, out);
    free(ct);
    return rc;
}

int sp_eventgen_heartbeat(const char *worker, const char *const *templates, size_t n_templates,
                          uint32_t running, uint32_t interval_ms, sp_eventgen_msg_t *out)
{
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__WorkerHeartbeat hb = SPACE__V1__WORKER_HEARTBEAT__INIT;
    char *runtimes[] = {"gvisor"};

    memset(out, 0, sizeof(*out));
    agg.kind = "worker";
    agg.id = (char *)worker;
    env.aggregate = &agg;
    env.actor = "svc:worker";
    hb.worker = (char *)worker;
    hb.host = "localhost";
    hb.vcpu_total = 2;
    hb.memory_mb_total = 24576;
    hb.sandboxes_running = running;
    hb.templates = (char **)templates;
    hb.n_templates = n_templates;
    hb.runtimes = runtimes;
    hb.n_runtimes = 1;
    hb.interval_ms = interval_ms;
    hb.version = "0.1.0";
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT;
    env.worker_heartbeat = &hb;
    return finish(&env, NULL, out);
}

void sp_eventgen_msg_dispose(sp_eventgen_msg_t *m)
{
    free(m->data);
    m->data = NULL;
    m->len = 0;
}

static int sign_msgs(sp_eventgen_msg_t *const *msgs, size_t n, const char *signer,
                     const sp_sign_key_t *key, bool headed)
{
    if (!msgs || n < (headed ? 2 : 1) || n > SP_SIG_BATCH_MAX)
        return -EINVAL;
    uint8_t **bufs = sp_xcalloc(n, sizeof(*bufs));
    size_t *lens = sp_xcalloc(n, sizeof(*lens));
    for (size_t i = 0; i < n; i++) {
        bufs[i] = msgs[i]->data;
        lens[i] = msgs[i]->len;
    }
    int rc = headed ? sp_envelope_sign_encoded_headed(bufs, lens, n, signer, key)
                    : sp_envelope_sign_encoded(bufs, lens, n, signer, key);
    if (rc == 0) {
        for (size_t i = 0; i < n; i++) {
            msgs[i]->data = bufs[i];
            msgs[i]->len = lens[i];
        }
    }
    free(bufs);
    free(lens);
    return rc;
}

int sp_eventgen_sign(sp_eventgen_msg_t *const *msgs, size_t n, const char *signer,
                     const sp_sign_key_t *key)
{
    return sign_msgs(msgs, n, signer, key, false);
}

int sp_eventgen_sign_headed(sp_eventgen_msg_t *const *msgs, size_t n, const char *signer,
                            const sp_sign_key_t *key)
{
    return sign_msgs(msgs, n, signer, key, true);
}

const char *sp_eventgen_signer(sp_event_type_t type, const char *worker, char *buf, size_t len)
{
    unsigned who = sp_event_emitters(type);

    if (who & SP_KIND_BIT(SP_KIND_WORKER))
        snprintf(buf, len, "worker-%s", worker && worker[0] ? worker : "w1");
    else if (who & SP_KIND_BIT(SP_KIND_GATEWAY))
        snprintf(buf, len, "gateway");
    else
        snprintf(buf, len, "scheduler");
    return buf;
}
