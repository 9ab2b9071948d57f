/* The body of POST /v1/sandboxes, checked field by field, then turned into the
 * SandboxCreateRequested intent. Everything is validated before anything is published: the
 * JSON parser is strict (json.h), unknown fields and wrong types are refused, the limits are
 * intent.h's, and sp_intent_check, which the scheduler applies to every create on the bus
 * (an internal platform's too), is the final word.
 *
 * Environment values: only the NAMES go into the event (env_names), because the event log is
 * kept forever and shown to auditors. The values are handed back to the caller, which keeps
 * them in the sandbox_env table (not the log) and adds them to every command's ExecRequest on
 * the data plane. */
#include "gateway.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "cred.h"
#include "error.h"
#include "ids.h"
#include "intent.h"
#include "json.h"
#include "publish.h"
#include "xmalloc.h"

#define TIMEOUT_MAX_S      SP_INTENT_TIMEOUT_MAX_S
#define TIMEOUT_DEFAULT_S  300
#define METADATA_KEY_MAX   SP_INTENT_METADATA_KEY_MAX
#define METADATA_VALUE_MAX SP_INTENT_METADATA_VALUE_MAX
#define ENV_NAME_MAX       SP_INTENT_ENV_NAME_MAX
#define VCPU_MAX           SP_INTENT_VCPU_MAX
#define MEMORY_MB_MAX      SP_INTENT_MEMORY_MB_MAX
#define VCPU_DEFAULT       1
#define MEMORY_MB_DEFAULT  512

static int get_uint(const sp_json_t *v, const char *name, int64_t min, int64_t max, uint32_t *ret,
                    gw_verr_t *e)
{
    int64_t x;
    int rc = sp_json_int(v, min, max, &x);
    if (rc == -ERANGE)
        return gw_bad(e, "invalid_field", "%s must be within %lld..%lld", name, (long long)min,
                      (long long)max);
    if (rc < 0)
        return gw_bad(e, "invalid_field", "%s must be an integer", name);
    *ret = (uint32_t)x;
    return 0;
}

typedef struct {
    const char *template_;
    uint32_t timeout_s, vcpu, memory_mb, idle_suspend_s;
    uint32_t disk_mb; /* 0: the worker's default (its disk-mb-default) */
    const char *on_timeout;
    const char *project; /* credentials scoped to it apply (docs/credentials.md) */
    size_t n_metadata, n_env;
    Space__V1__KeyValue kv[GW_METADATA_MAX];
    Space__V1__KeyValue *kvp[GW_METADATA_MAX];
    char *env_names[GW_ENV_MAX];
    const sp_json_t *env;
    gw_netpol_t net;
    bool have_net;
    const char *snapshot; /* a named snapshot to restore from (docs/snapshots.md) */
    bool have_resources;
} spec_t;

static int parse_metadata(const sp_json_t *v, spec_t *s, gw_verr_t *e)
{
    if (sp_json_type(v) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_field", "metadata must be an object of strings");
    size_t n = sp_json_len(v);
    if (n > GW_METADATA_MAX)
        return gw_bad(e, "invalid_field", "metadata has %zu entries, at most %d", n,
                      GW_METADATA_MAX);
    for (size_t i = 0; i < n; i++) {
        const char *k = sp_json_key_at(v, i);
        const char *val = sp_json_str(sp_json_at(v, i), NULL);
        if (!k || !k[0] || !gw_text_ok(k, METADATA_KEY_MAX))
            return gw_bad(e, "invalid_field",
                          "metadata keys must be 1..%d bytes of text without control characters",
                          METADATA_KEY_MAX);
        if (!val)
            return gw_bad(e, "invalid_field", "metadata.%s must be a string", k);
        if (!gw_text_ok(val, METADATA_VALUE_MAX))
            return gw_bad(e, "invalid_field",
                          "metadata.%s must be at most %d bytes of text without control characters",
                          k, METADATA_VALUE_MAX);
        Space__V1__KeyValue init = SPACE__V1__KEY_VALUE__INIT;
        s->kv[i] = init;
        s->kv[i].key = (char *)k;
        s->kv[i].value = (char *)val;
        s->kvp[i] = &s->kv[i];
    }
    s->n_metadata = n;
    return 0;
}

static int parse_env(const sp_json_t *v, spec_t *s, gw_verr_t *e)
{
    if (sp_json_type(v) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_field", "env must be an object of strings");
    size_t n = sp_json_len(v);
    if (n > GW_ENV_MAX)
        return gw_bad(e, "invalid_field", "env has %zu entries, at most %d", n, GW_ENV_MAX);
    for (size_t i = 0; i < n; i++) {
        const char *k = sp_json_key_at(v, i);
        size_t vlen = 0;
        if (!k || !sp_intent_env_name_ok(k))
            return gw_bad(e, "invalid_field",
                          "env names must match [A-Za-z_][A-Za-z0-9_]* (at most %d chars)",
                          ENV_NAME_MAX);
        /* The value is checked (a string within the limit) and goes no further. */
        if (!sp_json_str(sp_json_at(v, i), &vlen))
            return gw_bad(e, "invalid_field", "env.%s must be a string", k);
        if (vlen > GW_ENV_VALUE_MAX)
            return gw_bad(e, "invalid_field", "env.%s is over %d bytes", k, GW_ENV_VALUE_MAX);
        s->env_names[i] = (char *)k;
    }
    s->n_env = n;
    s->env = v;
    return 0;
}

static int parse_resources(const sp_json_t *v, spec_t *s, gw_verr_t *e)
{
    int rc;
    if (sp_json_type(v) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_field", "resources must be an object");
    for (size_t i = 0; i < sp_json_len(v); i++) {
        const char *k = sp_json_key_at(v, i);
        const sp_json_t *x = sp_json_at(v, i);
        if (strcmp(k, "vcpu") == 0)
            rc = get_uint(x, "resources.vcpu", 1, VCPU_MAX, &s->vcpu, e);
        else if (strcmp(k, "memory_mb") == 0)
            rc = get_uint(x, "resources.memory_mb", 1, MEMORY_MB_MAX, &s->memory_mb, e);
        else if (strcmp(k, "disk_mb") == 0)
            rc = get_uint(x, "resources.disk_mb", SP_INTENT_DISK_MB_MIN, SP_INTENT_DISK_MB_MAX,
                          &s->disk_mb, e);
        else
            rc = gw_bad(e, "unknown_field", "unknown field resources.%s", k);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int parse_body(const sp_json_t *root, spec_t *s, gw_verr_t *e)
{
    int rc = 0;

    if (sp_json_type(root) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_json", "the body must be a JSON object");
    s->timeout_s = TIMEOUT_DEFAULT_S;
    s->vcpu = VCPU_DEFAULT;
    s->memory_mb = MEMORY_MB_DEFAULT;
    for (size_t i = 0; i < sp_json_len(root) && rc == 0; i++) {
        const char *k = sp_json_key_at(root, i);
        const sp_json_t *v = sp_json_at(root, i);
        if (strcmp(k, "template") == 0) {
            s->template_ = sp_json_str(v, NULL);
            if (!s->template_)
                rc = gw_bad(e, "invalid_field", "template must be a string");
            else if (!sp_id_valid(s->template_)) /* as sp_intent_check_create */
                rc = gw_bad(e, "invalid_field",
                            "template must be a template name ([a-z0-9][a-z0-9_-], 1..64 chars)");
        } else if (strcmp(k, "timeout_s") == 0) {
            rc = get_uint(v, "timeout_s", 0, TIMEOUT_MAX_S, &s->timeout_s, e);
        } else if (strcmp(k, "idle_suspend_s") == 0) {
            rc = get_uint(v, "idle_suspend_s", 0, TIMEOUT_MAX_S, &s->idle_suspend_s, e);
        } else if (strcmp(k, "project") == 0) {
            s->project = sp_json_str(v, NULL);
            if (!s->project || !sp_cred_name_valid(s->project, strlen(s->project)))
                rc = gw_bad(e, "invalid_field",
                            "project must be 1..64 of [A-Za-z0-9_.-], starting with a letter or "
                            "digit");
        } else if (strcmp(k, "on_timeout") == 0) {
            s->on_timeout = sp_json_str(v, NULL);
            if (!sp_intent_on_timeout_ok(s->on_timeout))
                rc = gw_bad(e, "invalid_field", "on_timeout must be \"delete\" or \"suspend\"");
        } else if (strcmp(k, "metadata") == 0) {
            rc = parse_metadata(v, s, e);
        } else if (strcmp(k, "env") == 0) {
            rc = parse_env(v, s, e);
        } else if (strcmp(k, "resources") == 0) {
            rc = parse_resources(v, s, e);
            s->have_resources = true;
        } else if (strcmp(k, "snapshot") == 0) {
            s->snapshot = sp_json_str(v, NULL);
            if (!s->snapshot || !sp_snapshot_id_valid(s->snapshot))
                rc = gw_bad(e, "invalid_field", "snapshot must be a snapshot id (snp_...)");
        } else if (strcmp(k, "network") == 0 && !s->have_net) {
            rc = gw_network_parse(v, &s->net, e);
            s->have_net = rc == 0;
        } else {
            rc = gw_bad(e, "unknown_field", "unknown field %s", k);
        }
    }
    if (rc == 0 && !s->template_ && !s->snapshot)
        rc = gw_bad(e, "missing_field", "template is required");
    if (rc == 0 && s->snapshot && s->have_resources)
        rc = gw_bad(e, "invalid_field",
                    "resources come from the snapshot (its memory image is of that size)");
    return rc;
}

int gw_create_build(const gw_req_t *rq, const char *body, size_t len, const char *sandbox_id,
                    const char *idempotency_key, const gw_create_base_t *base,
                    char base_wanted[SP_SNAPSHOT_ID_LEN + 1], uint8_t **ret_buf, size_t *ret_len,
                    char ret_subject[192], char ret_event_id[GW_EVENT_ID_LEN + 1],
                    char **ret_env_json, const char **ret_code, char err[GW_ERR_MSG_MAX])
{
    gw_verr_t e = {.code = NULL, .msg = err};
    sp_json_doc_t *doc = NULL;
    char jerr[SP_JSON_ERR_MAX];
    char reason[SP_REASON_MAX];
    spec_t *s = NULL;
    int rc;

    sp_json_limits_t lim = {
        .max_bytes = len + 1, .max_depth = 4, .max_nodes = 2048, .max_string = GW_ENV_VALUE_MAX};
    if (len == 0) {
        rc = gw_bad(&e, "invalid_json", "the body is empty; expected a JSON object");
        goto out;
    }
    if (sp_json_parse(body, len, &lim, &doc, jerr) < 0) {
        rc = gw_bad(&e, "invalid_json", "the body is not valid JSON: %s", jerr);
        goto out;
    }
    s = sp_xcalloc(1, sizeof(*s));
    if ((rc = parse_body(sp_json_root(doc), s, &e)) < 0)
        goto out;
    if (s->snapshot && !base) {
        snprintf(base_wanted, SP_SNAPSHOT_ID_LEN + 1, "%s", s->snapshot);
        rc = 1;
        goto out;
    }
    if (s->snapshot) {
        /* The snapshot's template and resources: its disk is a delta against that template,
         * its memory image is of that size. */
        if (strcmp(base->snapshot_id, s->snapshot) != 0) {
            rc = gw_bad(&e, "invalid_field", "snapshot changed while it was looked up");
            goto out;
        }
        if (s->template_ && strcmp(s->template_, base->template_) != 0) {
            rc = gw_bad(&e, "invalid_field", "snapshot %s is of template %s, not %s", s->snapshot,
                        base->template_, s->template_);
            goto out;
        }
        s->template_ = base->template_;
        s->vcpu = base->vcpu ? base->vcpu : s->vcpu;
        s->memory_mb = base->memory_mb ? base->memory_mb : s->memory_mb;
        s->disk_mb = base->disk_mb;
    }

    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SandboxCreateRequested create = SPACE__V1__SANDBOX_CREATE_REQUESTED__INIT;
    Space__V1__Resources res = SPACE__V1__RESOURCES__INIT;
    agg.kind = "sandbox";
    agg.id = (char *)sandbox_id;
    create.template_ = (char *)s->template_;
    create.timeout_s = s->timeout_s;
    create.on_timeout = (char *)(s->on_timeout ? s->on_timeout : "delete");
    create.idle_suspend_s = s->idle_suspend_s;
    create.project = (char *)(s->project ? s->project : "");
    create.metadata = s->kvp;
    create.n_metadata = s->n_metadata;
    create.env_names = s->env_names;
    create.n_env_names = s->n_env;
    res.vcpu = s->vcpu;
    res.memory_mb = s->memory_mb;
    res.disk_mb = s->disk_mb;
    create.resources = &res;
    create.idempotency_key = (char *)(idempotency_key ? idempotency_key : "");
    create.snapshot = (char *)(s->snapshot ? s->snapshot : "");
    if (!s->have_net && !(base && base->network))
        gw_network_default(rq->gw, &s->net);
    create.network = !s->have_net && base && base->network
                         ? (Space__V1__NetworkPolicy *)base->network
                         : &s->net.msg;
    env.aggregate = &agg;
    env.tenant = (char *)rq->tenant;
    env.actor = (char *)rq->key_id;
    env.correlation_id = (char *)rq->request_id;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED;
    env.sandbox_create_requested = &create;
    sp_envelope_stamp(&env, ret_event_id);
    /* The check the scheduler applies on the bus: one definition of a valid create. */
    const char *code = NULL;
    if (sp_intent_check(&env, reason, &code) < 0) {
        rc = gw_bad(&e, code, "%s", reason);
        goto out;
    }
    if ((rc = sp_envelope_subject(&env, NULL, ret_subject, 192)) < 0 ||
        (rc = sp_publish_pack(&env, ret_buf, ret_len)) < 0) {
        rc = gw_bad(&e, "invalid_field", "the request does not fit in an event (%s)",
                    sp_strerror(rc));
        goto out;
    }
    if (ret_env_json && s->n_env > 0) {
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_putc(&b, '{');
        for (size_t i = 0; i < s->n_env; i++) {
            size_t vlen = 0;
            const char *val = sp_json_str(sp_json_at(s->env, i), &vlen);
            if (i)
                sp_buf_putc(&b, ',');
            sp_buf_json_str(&b, s->env_names[i]);
            sp_buf_putc(&b, ':');
            sp_buf_json_strn(&b, val, vlen);
        }
        sp_buf_putc(&b, '}');
        *ret_env_json = sp_buf_take(&b);
    }
    rc = 0;
out:
    *ret_code = e.code ? e.code : "invalid_json";
    if (s)
        gw_network_dispose(&s->net);
    free(s);
    sp_json_doc_free(doc);
    return rc;
}
