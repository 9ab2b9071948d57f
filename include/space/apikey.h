/* API keys: "sk_<id>.<secret>", id 16 and secret 43 URL-safe chars. Stored in api_keys as
 * (id, tenant, SHA-256 of the whole key, name, admin); the key itself is shown once, at
 * creation. A tenant exists when a key names it; its name follows sp_id_valid (ids.h), the
 * rule of every tenant on the bus. An admin key is a key of its tenant that may also manage
 * the keys of every tenant (POST/GET/DELETE /v1/keys). */
#ifndef SPACE_APIKEY_H
#define SPACE_APIKEY_H

#include <libpq-fe.h>
#include <stdbool.h>

#define SP_APIKEY_ID_LEN     16
#define SP_APIKEY_LEN        (3 + SP_APIKEY_ID_LEN + 1 + 43)
#define SP_APIKEY_TENANT_MAX 64  /* sp_id_valid's longest */
#define SP_APIKEY_NAME_MAX   128 /* bytes of a key's name (UTF-8 text, no control characters) */
/* NOTIFY channel of a revocation (payload: the key id), sent by the trigger of migration 6. */
#define SP_APIKEY_CHANNEL "space_api_keys"

/* What a live key is. */
typedef struct {
    char id[SP_APIKEY_ID_LEN + 1];
    char tenant[SP_APIKEY_TENANT_MAX + 1];
    bool admin;
} sp_apikey_t;

/* Creates a key for tenant (-EINVAL unless sp_id_valid) and stores its hash; *ret_key (heap)
 * is the only copy of the secret: the caller shows it and wipes it (explicit_bzero) and frees
 * it. */
int sp_apikey_mint(PGconn *db, const char *tenant, const char *name, bool admin, char **ret_key,
                   char ret_id[SP_APIKEY_ID_LEN + 1]);
/* sp_apikey_mint of a key that is not an admin key. */
int sp_apikey_create(PGconn *db, const char *tenant, const char *name, char **ret_key,
                     char ret_id[SP_APIKEY_ID_LEN + 1]);

/* Checks a presented key (from an Authorization header: untrusted). Returns 0 with *ret
 * filled when the key exists, is not revoked and its hash matches (constant-time compare);
 * SP_ENOTFOUND for any bad key (malformed, unknown, revoked, wrong secret: one answer, so a
 * caller learns nothing); SP_EDB when the database fails. */
int sp_apikey_check(PGconn *db, const char *key, sp_apikey_t *ret);
/* sp_apikey_check with the tenant as a heap string. */
int sp_apikey_verify(PGconn *db, const char *key, char **ret_tenant,
                     char ret_id[SP_APIKEY_ID_LEN + 1]);
/* The live (not revoked) key of that id, without its secret: for what a key signed off on
 * (an E2B access token names its key by id). SP_ENOTFOUND, SP_EDB. */
int sp_apikey_lookup(PGconn *db, const char *id, sp_apikey_t *ret);
/* Records that the key was used (last_used_at = now()). */
int sp_apikey_touch(PGconn *db, const char *id);
/* Revokes the key (revoked_at = now()); every gateway hears of it on SP_APIKEY_CHANNEL.
 * SP_ENOTFOUND when there is no live key of that id. */
int sp_apikey_revoke(PGconn *db, const char *id);
/* Makes the live key id an admin key (space up's key, made before keys had roles). */
int sp_apikey_set_admin(PGconn *db, const char *id);

#endif
