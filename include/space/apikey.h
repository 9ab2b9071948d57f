/* API keys: "sk_<id>.<secret>", id 16 and secret 43 URL-safe chars. Stored in api_keys as
 * (id, tenant, SHA-256 of the whole key); the key itself is shown once, at creation. */
#ifndef SPACE_APIKEY_H
#define SPACE_APIKEY_H

#include <libpq-fe.h>

#define SP_APIKEY_ID_LEN 16
#define SP_APIKEY_LEN    (3 + SP_APIKEY_ID_LEN + 1 + 43)

/* Creates a key for tenant and stores its hash; *ret_key (heap) is the only copy of the
 * secret: the caller shows it and wipes it (explicit_bzero) and frees it. */
int sp_apikey_create(PGconn *db, const char *tenant, const char *name, char **ret_key,
                     char ret_id[SP_APIKEY_ID_LEN + 1]);

/* Checks a presented key (from an Authorization header: untrusted). Returns 0 with the tenant
 * (heap) and key id when the key exists, is not revoked and its hash matches (constant-time
 * compare); SP_ENOTFOUND for any bad key (malformed, unknown, revoked, wrong secret: one
 * answer, so a caller learns nothing); SP_EDB when the database fails. */
int sp_apikey_verify(PGconn *db, const char *key, char **ret_tenant,
                     char ret_id[SP_APIKEY_ID_LEN + 1]);

#endif
