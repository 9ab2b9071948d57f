/* The sandbox and worker reducers (reduce.h). The state machine is DESIGN.md's:
 *   requested -> placed -> running <-> paused;
 *   running|paused -> suspending -> suspended -> resuming -> running (on any worker);
 *   any -> deleted (terminal); any live state -> failed.
 * Intents (...Requested) do not move the state: they are recorded against an existing sandbox
 * and the owner answers with a fact or a SandboxRequestRejected. */
#include "reduce.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "error.h"
#include "xmalloc.h"

static const char *const state_names[] = {
    [SP_SBX_NONE] = "none",           [SP_SBX_REQUESTED] = "requested",
    [SP_SBX_PLACED] = "placed",       [SP_SBX_RUNNING] = "running",
    [SP_SBX_PAUSED] = "paused",       [SP_SBX_SUSPENDING] = "suspending",
    [SP_SBX_SUSPENDED] = "suspended", [SP_SBX_RESUMING] = "resuming",
    [SP_SBX_DELETED] = "deleted",     [SP_SBX_FAILED] = "failed",
};

const char *sp_sbx_state_name(sp_sbx_state_t s)
{
    if ((unsigned)s >= sizeof(state_names) / sizeof(state_names[0]))
        return "invalid";
    return state_names[s];
}

sp_sbx_state_t sp_sbx_state_from_name(const char *name)
{
    for (unsigned i = 1; i < sizeof(state_names) / sizeof(state_names[0]); i++)
        if (strcmp(state_names[i], name) == 0)
            return (sp_sbx_state_t)i;
    return SP_SBX_NONE;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

void sp_sandbox_init(sp_sandbox_t *s, const char *id)
{
    memset(s, 0, sizeof(*s));
    copy_str(s->id, sizeof(s->id), id);
}

void sp_sandbox_dispose(sp_sandbox_t *s)
{
    free(s->metadata_json);
    free(s->env_names_json);
    s->metadata_json = NULL;
    s->env_names_json = NULL;
}

void sp_sandbox_copy(sp_sandbox_t *dst, const sp_sandbox_t *src)
{
    *dst = *src;
    dst->metadata_json = src->metadata_json ? sp_xstrdup(src->metadata_json) : NULL;
    dst->env_names_json = src->env_names_json ? sp_xstrdup(src->env_names_json) : NULL;
}

static int refuse(char reason[SP_REASON_MAX], const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int refuse(char reason[SP_REASON_MAX], const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, SP_REASON_MAX, fmt, ap);
    va_end(ap);
    return SP_ETRANSITION;
}

static char *json_array(char **items, size_t n)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_putc(&b, '[');
    for (size_t i = 0; i < n; i++) {
        if (i)
            sp_buf_putc(&b, ',');
        sp_buf_json_str(&b, items[i]);
    }
    sp_buf_putc(&b, ']');
    return sp_buf_take(&b);
}

/* {"<template>": ready, ...}: a heartbeat's pool levels (docs/pools.md). */
static char *json_pools(Space__V1__PoolLevel **v, size_t n)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_putc(&b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i)
            sp_buf_putc(&b, ',');
        sp_buf_json_str(&b, v[i]->template_);
        sp_buf_printf(&b, ":%u", v[i]->ready);
    }
    sp_buf_putc(&b, '}');
    return sp_buf_take(&b);
}

static char *json_metadata(Space__V1__KeyValue **kv, size_t n)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_putc(&b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i)
            sp_buf_putc(&b, ',');
        sp_buf_json_str(&b, kv[i]->key);
        sp_buf_putc(&b, ':');
        sp_buf_json_str(&b, kv[i]->value);
    }
    sp_buf_putc(&b, '}');
    return sp_buf_take(&b);
}

/* Which states a fact may arrive in, as a bit set over sp_sbx_state_t. */
#define BIT(s) (1u << (s))
#define LIVE                                                                                       \
    (BIT(SP_SBX_REQUESTED) | BIT(SP_SBX_PLACED) | BIT(SP_SBX_RUNNING) | BIT(SP_SBX_PAUSED) |       \
     BIT(SP_SBX_SUSPENDING) | BIT(SP_SBX_SUSPENDED) | BIT(SP_SBX_RESUMING))

static unsigned allowed_from(sp_event_type_t t)
{
    switch (t) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED:
        /* A create is placed once; a suspended sandbox is placed again to resume it. */
        return BIT(SP_SBX_REQUESTED) | BIT(SP_SBX_SUSPENDED);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED:
        return BIT(SP_SBX_PLACED);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED:
        return LIVE;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED:
        return BIT(SP_SBX_RUNNING);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED:
        return BIT(SP_SBX_PAUSED) | BIT(SP_SBX_RESUMING);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDING:
        return BIT(SP_SBX_RUNNING) | BIT(SP_SBX_PAUSED);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED:
        return BIT(SP_SBX_SUSPENDING);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMING:
        return BIT(SP_SBX_SUSPENDED);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_FAILED:
        return BIT(SP_SBX_SUSPENDING);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_FAILED:
        return BIT(SP_SBX_SUSPENDED) | BIT(SP_SBX_RESUMING);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED:
        return LIVE | BIT(SP_SBX_FAILED);
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_ADOPTED:
        return BIT(SP_SBX_RUNNING) | BIT(SP_SBX_PAUSED);
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED:
        return BIT(SP_SBX_RUNNING);
    case SPACE__V1__ENVELOPE__PAYLOAD_NETWORK_POLICY_UPDATE_REQUESTED:
        return LIVE;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_TIMEOUT_REQUESTED:
        return BIT(SP_SBX_RUNNING) | BIT(SP_SBX_PAUSED);
    default:
        /* Intents and refusals: any existing sandbox. Command facts too: a command may
         * finish while its sandbox is being paused or deleted. */
        return LIVE | BIT(SP_SBX_FAILED) | BIT(SP_SBX_DELETED);
    }
}

static void apply_create(sp_sandbox_t *s, const sp_envelope_t *env)
{
    const Space__V1__SandboxCreateRequested *p = env->sandbox_create_requested;
    copy_str(s->tenant, sizeof(s->tenant), env->tenant);
    copy_str(s->template_, sizeof(s->template_), p->template_);
    s->timeout_s = p->timeout_s;
    copy_str(s->on_timeout, sizeof(s->on_timeout), p->on_timeout[0] ? p->on_timeout : "delete");
    s->idle_suspend_s = p->idle_suspend_s;
    if (p->resources) {
        s->vcpu = p->resources->vcpu;
        s->memory_mb = p->resources->memory_mb;
        s->disk_mb = p->resources->disk_mb;
    }
    free(s->metadata_json);
    free(s->env_names_json);
    s->metadata_json = json_metadata(p->metadata, p->n_metadata);
    s->env_names_json = json_array(p->env_names, p->n_env_names);
    s->created_at_us = env->occurred_at_us;
    s->state = SP_SBX_REQUESTED;
}

int sp_reduce_sandbox(sp_sandbox_t *s, const sp_envelope_t *env, uint64_t seq,
                      char reason[SP_REASON_MAX])
{
    sp_event_type_t t = env->payload_case;

    if (sp_event_is_worker(t) || sp_event_is_cred(t))
        return refuse(reason, "%s is not a sandbox event", env->type);
    if (strcmp(s->id, env->aggregate->id) != 0)
        return refuse(reason, "event for %s applied to %s", env->aggregate->id, s->id);
    if (t == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED) {
        if (s->state != SP_SBX_NONE)
            return refuse(reason, "sandbox %s already exists (%s)", s->id,
                          sp_sbx_state_name(s->state));
        apply_create(s, env);
        goto applied;
    }
    if (s->state == SP_SBX_NONE)
        return refuse(reason, "%s for unknown sandbox %s", env->type, s->id);
    /* A sandbox belongs to one tenant forever: an event naming another is a forgery or a bug. */
    if (strcmp(s->tenant, env->tenant) != 0)
        return refuse(reason, "%s: tenant %s does not own sandbox %s", env->type, env->tenant,
                      s->id);
    if (!(allowed_from(t) & BIT(s->state)))
        return refuse(reason, "illegal transition: %s in state %s", env->type,
                      sp_sbx_state_name(s->state));

    switch (t) {
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED:
        copy_str(s->worker, sizeof(s->worker), env->sandbox_placed->worker);
        if (s->state == SP_SBX_REQUESTED)
            s->state = SP_SBX_PLACED;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED:
        if (strcmp(s->worker, env->sandbox_started->worker) != 0)
            return refuse(reason, "SandboxStarted from worker %s, placed on %s",
                          env->sandbox_started->worker, s->worker);
        s->state = SP_SBX_RUNNING;
        s->started_at_us = env->occurred_at_us;
        s->last_activity_us = env->occurred_at_us;
        if (env->sandbox_started->disk_mb)
            s->disk_mb = env->sandbox_started->disk_mb;
        s->timeout_at_us = s->timeout_s ? env->occurred_at_us + (int64_t)s->timeout_s * 1000000 : 0;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED:
        s->state = SP_SBX_FAILED;
        copy_str(s->failure_reason, sizeof(s->failure_reason), env->sandbox_failed->reason);
        if (env->sandbox_failed->host_lost)
            s->worker[0] = '\0';
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED:
        s->state = SP_SBX_PAUSED;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMED:
        copy_str(s->worker, sizeof(s->worker), env->sandbox_resumed->worker);
        /* Back from a suspend, the timeout starts again (as E2B's connect does). */
        if (s->state == SP_SBX_RESUMING)
            s->timeout_at_us =
                s->timeout_s ? env->occurred_at_us + (int64_t)s->timeout_s * 1000000 : 0;
        s->state = SP_SBX_RUNNING;
        s->last_activity_us = env->occurred_at_us;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_TIMEOUT_REQUESTED:
        s->timeout_s = env->sandbox_timeout_requested->timeout_s;
        s->timeout_at_us = env->occurred_at_us + (int64_t)s->timeout_s * 1000000;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED:
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_WRITTEN:
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_REMOVED:
    case SPACE__V1__ENVELOPE__PAYLOAD_FILE_MOVED:
    case SPACE__V1__ENVELOPE__PAYLOAD_DIR_CREATED:
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED:
    case SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_ALLOWED:
        /* Activity: what keeps a sandbox from being suspended for idleness (commands, file
         * changes, and connections space-egressd let out). Within a step of the recorded
         * activity (or before it: another host's clock) the row stays as it is (reduce.h). */
        if (env->occurred_at_us < s->last_activity_us + SP_ACTIVITY_GRAIN_US)
            return 0;
        s->last_activity_us = env->occurred_at_us;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDING:
        s->state = SP_SBX_SUSPENDING;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED:
        /* Every host resource is released: the sandbox lives on no worker until resumed; no
         * timeout runs while it is suspended. */
        s->state = SP_SBX_SUSPENDED;
        s->worker[0] = '\0';
        s->timeout_at_us = 0;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUMING:
        copy_str(s->worker, sizeof(s->worker), env->sandbox_resuming->worker);
        s->state = SP_SBX_RESUMING;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_FAILED:
        s->state = strcmp(env->sandbox_suspend_failed->state, "paused") == 0 ? SP_SBX_PAUSED
                                                                             : SP_SBX_RUNNING;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_FAILED:
        /* The snapshot is kept: it can be resumed again, maybe elsewhere. */
        s->state = SP_SBX_SUSPENDED;
        s->worker[0] = '\0';
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED:
        s->state = SP_SBX_DELETED;
        s->deleted_at_us = env->occurred_at_us;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_ADOPTED:
        if (strcmp(s->worker, env->sandbox_adopted->worker) != 0)
            return refuse(reason, "SandboxAdopted by worker %s, owned by %s",
                          env->sandbox_adopted->worker, s->worker);
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED: {
        const Space__V1__SandboxRequestRejected *p = env->sandbox_request_rejected;
        /* A refused create leaves nothing behind: the sandbox failed before it existed. */
        if (sp_event_type_from_name(p->request_type) ==
                SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED &&
            s->state == SP_SBX_REQUESTED) {
            s->state = SP_SBX_FAILED;
            copy_str(s->failure_reason, sizeof(s->failure_reason), p->reason);
        }
        break;
    }
    default:
        break; /* intents: recorded, no state change */
    }
applied:
    s->updated_at_us = env->occurred_at_us;
    s->version++;
    s->last_seq = seq;
    return 0;
}

void sp_worker_init(sp_worker_t *w, const char *id)
{
    memset(w, 0, sizeof(*w));
    copy_str(w->id, sizeof(w->id), id);
}

void sp_worker_dispose(sp_worker_t *w)
{
    free(w->templates_json);
    free(w->runtimes_json);
    free(w->pools_json);
    w->templates_json = NULL;
    w->runtimes_json = NULL;
    w->pools_json = NULL;
}

void sp_worker_copy(sp_worker_t *dst, const sp_worker_t *src)
{
    *dst = *src;
    dst->templates_json = src->templates_json ? sp_xstrdup(src->templates_json) : NULL;
    dst->runtimes_json = src->runtimes_json ? sp_xstrdup(src->runtimes_json) : NULL;
    dst->pools_json = src->pools_json ? sp_xstrdup(src->pools_json) : NULL;
}

int sp_reduce_worker(sp_worker_t *w, const sp_envelope_t *env, uint64_t seq,
                     char reason[SP_REASON_MAX])
{
    if (!sp_event_is_worker(env->payload_case))
        return refuse(reason, "%s is not a worker event", env->type);
    if (strcmp(w->id, env->aggregate->id) != 0)
        return refuse(reason, "event for %s applied to %s", env->aggregate->id, w->id);

    if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT) {
        const Space__V1__WorkerHeartbeat *p = env->worker_heartbeat;
        /* Heartbeats may cross on the bus: an older one must not overwrite a newer one. */
        if (w->known && env->occurred_at_us < w->last_heartbeat_us)
            return refuse(reason, "heartbeat older than the last one");
        copy_str(w->host, sizeof(w->host), p->host);
        w->vcpu_total = p->vcpu_total;
        w->vcpu_used = p->vcpu_used;
        w->memory_mb_total = p->memory_mb_total;
        w->memory_mb_used = p->memory_mb_used;
        w->disk_mb_total = p->disk_mb_total;
        w->disk_mb_free = p->disk_mb_free;
        w->disk_mb_reserve = p->disk_mb_reserve;
        w->disk_mb_default = p->disk_mb_default;
        w->sandboxes_running = p->sandboxes_running;
        w->interval_ms = p->interval_ms;
        copy_str(w->version_string, sizeof(w->version_string), p->version);
        free(w->templates_json);
        free(w->runtimes_json);
        w->templates_json = json_array(p->templates, p->n_templates);
        w->runtimes_json = json_array(p->runtimes, p->n_runtimes);
        free(w->pools_json);
        w->pools_json = json_pools(p->pools, p->n_pools);
        w->last_heartbeat_us = env->occurred_at_us;
        w->up = 1;
    } else if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_WORKER_RECONCILED) {
        /* An audit record: the worker's capacity comes with its next heartbeat. */
    } else {
        if (!w->known)
            return refuse(reason, "WorkerStopped for unknown worker %s", w->id);
        w->up = 0;
        w->sandboxes_running = 0;
        w->vcpu_used = 0;
        w->memory_mb_used = 0;
    }
    w->known = 1;
    w->version++;
    w->last_seq = seq;
    return 0;
}
