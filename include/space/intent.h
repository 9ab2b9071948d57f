/* Intents: what a client asks of the platform, checked in one place (docs/platforms.md).
 *
 * Two doors publish intents: the HTTP API (space-gateway, for every tenant) and internal
 * platforms, which sign them on the bus themselves (identity "platform-<name>", contract.h).
 * Both go through sp_intent_check: the gateway before it publishes (its 400s use the limits
 * below), the scheduler before it acts on a create or a delete, whoever sent it (a refusal
 * there is a SandboxRequestRejected fact with the code and the reason).
 *
 * sp_envelope_validate (envelope.h) is the bus's schema: the wire shape every consumer needs
 * before it can store or look at an envelope (ids, UTF-8 text within its length, list sizes,
 * environment names, network entries). The values a sandbox is made from (template name,
 * time limits, resources, on_timeout, project) are this file's: a create that is well formed
 * but asks for what the platform does not give is stored, and then refused in the open.
 * SandboxPlaced carries the create it places, so its schema includes these checks: a worker
 * never sees an unchecked request.
 *
 * Nothing here allocates or keeps state; every function is thread-safe.
 */
#ifndef SPACE_INTENT_H
#define SPACE_INTENT_H

#include <stdbool.h>

#include "envelope.h"

#define SP_INTENT_TIMEOUT_MAX_S      2592000 /* timeout_s, idle_suspend_s: 30 days */
#define SP_INTENT_METADATA_MAX       64      /* entries */
#define SP_INTENT_METADATA_KEY_MAX   64      /* bytes */
#define SP_INTENT_METADATA_VALUE_MAX 512     /* bytes */
#define SP_INTENT_ENV_MAX            128     /* environment variables of a sandbox or command */
#define SP_INTENT_ENV_NAME_MAX       128     /* bytes of one name */
#define SP_INTENT_VCPU_MAX           64
#define SP_INTENT_MEMORY_MB_MAX      (1024 * 1024) /* 1 TiB */
/* resources.disk_mb: what a sandbox may write beyond its template (0: the worker's default,
 * docs/faults.md "Limits"); below the minimum a sandbox could not even take its agent. */
#define SP_INTENT_DISK_MB_MIN 16
#define SP_INTENT_DISK_MB_MAX (16 * 1024 * 1024) /* 16 TiB */

/* Codes of a refusal (SandboxRequestRejected.reason, the API's error code). */
#define SP_INTENT_INVALID       "invalid_field"   /* a value outside its limits */
#define SP_INTENT_ENV_REFUSED   "env_not_allowed" /* env from a door without a data plane */
#define SP_INTENT_NOT_AN_INTENT "not_an_intent"

/* [A-Za-z_][A-Za-z0-9_]*, 1..SP_INTENT_ENV_NAME_MAX bytes. */
bool sp_intent_env_name_ok(const char *s);
/* "delete" or "suspend" ("" on the bus means delete). */
bool sp_intent_on_timeout_ok(const char *s);

/* The values of a create, whoever sent it: template name (an id, ids.h), timeout_s and
 * idle_suspend_s at most SP_INTENT_TIMEOUT_MAX_S, on_timeout, resources (0 means the default),
 * project (a credential scope name, cred.h). 0, or SP_ESCHEMA with a one-line reason naming
 * the field. */
int sp_intent_check_create(const Space__V1__SandboxCreateRequested *p, char reason[SP_REASON_MAX]);

/* The whole check of an intent envelope: the schema (sp_envelope_validate), the values
 * (sp_intent_check_create for a create), and what the signer's door allows:
 *   - a platform (signer "platform-<name>") may give no env_names: the values of environment
 *     variables travel only on the data plane (the gateway keeps them and adds them to each
 *     command), which platforms do not have, so such a sandbox could never receive them.
 * The signer is taken as the envelope names it; whether it signed is sp_trust_check's job.
 * 0, or a negative code (SP_ESCHEMA, SP_ENOTALLOWED for a door's rule, SP_ETYPE for an event
 * that is no intent) with the reason and *ret_code (one of the SP_INTENT_* codes above, a
 * static string). reason and ret_code may be NULL. */
int sp_intent_check(const sp_envelope_t *env, char reason[SP_REASON_MAX], const char **ret_code);

#endif
