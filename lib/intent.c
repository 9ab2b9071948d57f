/* The check of an intent (intent.h), one for the HTTP API and for platforms on the bus. */
#include "intent.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "contract.h"
#include "cred.h"
#include "error.h"
#include "ids.h"

static int refuse(char reason[SP_REASON_MAX], const char **ret_code, const char *code, int err,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int refuse(char reason[SP_REASON_MAX], const char **ret_code, const char *code, int err,
                  const char *fmt, ...)
{
    if (reason) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(reason, SP_REASON_MAX, fmt, ap);
        va_end(ap);
    }
    if (ret_code)
        *ret_code = code;
    return err;
}

bool sp_intent_env_name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;

    if (n == 0 || n > SP_INTENT_ENV_NAME_MAX || (s[0] >= '0' && s[0] <= '9'))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return false;
    }
    return true;
}

bool sp_intent_on_timeout_ok(const char *s)
{
    return s && (strcmp(s, "delete") == 0 || strcmp(s, "suspend") == 0);
}

int sp_intent_check_create(const Space__V1__SandboxCreateRequested *p, char reason[SP_REASON_MAX])
{
#define BAD(...) refuse(reason, NULL, SP_INTENT_INVALID, SP_ESCHEMA, __VA_ARGS__)
    if (!p)
        return BAD("missing create request");
    if (!sp_id_valid(p->template_))
        return BAD("template: not a template name ([a-z0-9][a-z0-9_-], 1..64 chars)");
    if (p->timeout_s > SP_INTENT_TIMEOUT_MAX_S)
        return BAD("timeout_s: %u is over %d (30 days)", p->timeout_s, SP_INTENT_TIMEOUT_MAX_S);
    if (p->idle_suspend_s > SP_INTENT_TIMEOUT_MAX_S)
        return BAD("idle_suspend_s: %u is over %d (30 days)", p->idle_suspend_s,
                   SP_INTENT_TIMEOUT_MAX_S);
    if (p->on_timeout[0] && !sp_intent_on_timeout_ok(p->on_timeout))
        return BAD("on_timeout: \"delete\" or \"suspend\"");
    if (p->resources && p->resources->vcpu > SP_INTENT_VCPU_MAX)
        return BAD("resources.vcpu: %u is over %d", p->resources->vcpu, SP_INTENT_VCPU_MAX);
    if (p->resources && p->resources->memory_mb > SP_INTENT_MEMORY_MB_MAX)
        return BAD("resources.memory_mb: %u is over %d (1 TiB)", p->resources->memory_mb,
                   SP_INTENT_MEMORY_MB_MAX);
    if (p->resources && p->resources->disk_mb &&
        (p->resources->disk_mb < SP_INTENT_DISK_MB_MIN ||
         p->resources->disk_mb > SP_INTENT_DISK_MB_MAX))
        return BAD("resources.disk_mb: %u is outside %d..%d", p->resources->disk_mb,
                   SP_INTENT_DISK_MB_MIN, SP_INTENT_DISK_MB_MAX);
    if (p->project[0] && !sp_cred_name_valid(p->project, strlen(p->project)))
        return BAD("project: 1..64 of [A-Za-z0-9_.-], starting with a letter or digit");
    return 0;
#undef BAD
}

int sp_intent_check(const sp_envelope_t *env, char reason[SP_REASON_MAX], const char **ret_code)
{
    char why[SP_REASON_MAX];
    sp_identity_t signer;

    if (!env || env->payload_case < 100 || env->payload_case >= 200)
        return refuse(reason, ret_code, SP_INTENT_NOT_AN_INTENT, SP_ETYPE, "%s is not an intent",
                      env && env->type ? env->type : "(none)");
    if (sp_envelope_validate(env, why) < 0)
        return refuse(reason, ret_code, SP_INTENT_INVALID, SP_ESCHEMA, "%s", why);
    if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED &&
        sp_intent_check_create(env->sandbox_create_requested, why) < 0)
        return refuse(reason, ret_code, SP_INTENT_INVALID, SP_ESCHEMA, "%s", why);

    /* The door's rules. A platform has no data plane: the gateway is the only keeper of
     * environment values (sandbox_env), so names without values would start a sandbox whose
     * commands never get them. Refused rather than half done. */
    if (env->signer && sp_identity_parse(env->signer, &signer) == 0 &&
        signer.kind == SP_KIND_PLATFORM &&
        env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED &&
        env->sandbox_create_requested->n_env_names > 0)
        return refuse(reason, ret_code, SP_INTENT_ENV_REFUSED, SP_ENOTALLOWED,
                      "env_names: %s cannot set environment variables (their values travel only "
                      "on the data plane, which platforms do not have); use the HTTP API",
                      signer.name);
    return 0;
}
