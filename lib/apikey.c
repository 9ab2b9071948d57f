/* API keys (apikey.h). */
#include "apikey.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "xmalloc.h"

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static int random_text(char *out, size_t n)
{
    uint8_t raw[64];
    if (n > sizeof(raw) || RAND_bytes(raw, (int)n) != 1)
        return -EIO;
    for (size_t i = 0; i < n; i++)
        out[i] = alphabet[raw[i] & 63];
    out[n] = '\0';
    OPENSSL_cleanse(raw, sizeof(raw));
    return 0;
}

static int valid_chars(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!s[i] || !strchr(alphabet, s[i]))
            return 0;
    return 1;
}

int sp_apikey_mint(PGconn *db, const char *tenant, const char *name, bool admin, char **ret_key,
                   char ret_id[SP_APIKEY_ID_LEN + 1])
{
    char id[SP_APIKEY_ID_LEN + 1], secret[44];
    uint8_t hash[SP_SHA256_LEN];
    int rc;

    if (!tenant || !sp_id_valid(tenant) || (name && strlen(name) > SP_APIKEY_NAME_MAX))
        return -EINVAL;
    if ((rc = random_text(id, SP_APIKEY_ID_LEN)) < 0 || (rc = random_text(secret, 43)) < 0)
        return rc;
    char *key = sp_xasprintf("sk_%s.%s", id, secret);
    explicit_bzero(secret, sizeof(secret));
    sp_sha256(key, strlen(key), hash);

    const char *params[5] = {id, tenant, (const char *)hash, name ? name : "", admin ? "t" : "f"};
    int lens[5] = {0, 0, SP_SHA256_LEN, 0, 0};
    int fmts[5] = {0, 0, 1, 0, 0};
    PGresult *r = PQexecParams(db,
                               "INSERT INTO api_keys (id, tenant, hash, name, admin) VALUES ($1, "
                               "$2, $3, $4, $5)",
                               5, NULL, params, lens, fmts, 0);
    rc = sp_db_check(r, PGRES_COMMAND_OK);
    PQclear(r);
    if (rc < 0) {
        explicit_bzero(key, strlen(key));
        free(key);
        return rc;
    }
    memcpy(ret_id, id, sizeof(id));
    *ret_key = key;
    return 0;
}

int sp_apikey_create(PGconn *db, const char *tenant, const char *name, char **ret_key,
                     char ret_id[SP_APIKEY_ID_LEN + 1])
{
    return sp_apikey_mint(db, tenant, name, false, ret_key, ret_id);
}

/* The live row of id: tenant, admin and (binary) hash. */
static int live_row(PGconn *db, const char *id, sp_apikey_t *ret, uint8_t hash[SP_SHA256_LEN])
{
    const char *params[1] = {id};
    int rc = SP_ENOTFOUND;
    PGresult *r = PQexecParams(db,
                               "SELECT tenant, admin, hash FROM api_keys WHERE id = $1 AND "
                               "revoked_at IS NULL",
                               1, NULL, params, NULL, NULL, 1 /* binary: hash as raw bytes */);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        rc = SP_EDB;
    } else if (PQntuples(r) == 1 && PQgetlength(r, 0, 2) == SP_SHA256_LEN &&
               PQgetlength(r, 0, 1) == 1 && PQgetlength(r, 0, 0) <= SP_APIKEY_TENANT_MAX) {
        memset(ret, 0, sizeof(*ret));
        memcpy(ret->id, id, SP_APIKEY_ID_LEN);
        memcpy(ret->tenant, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
        ret->admin = PQgetvalue(r, 0, 1)[0] != 0;
        memcpy(hash, PQgetvalue(r, 0, 2), SP_SHA256_LEN);
        rc = 0;
    }
    PQclear(r);
    return rc;
}

int sp_apikey_check(PGconn *db, const char *key, sp_apikey_t *ret)
{
    char id[SP_APIKEY_ID_LEN + 1];
    uint8_t hash[SP_SHA256_LEN], stored[SP_SHA256_LEN];
    sp_apikey_t k;

    if (!key || strlen(key) != SP_APIKEY_LEN || strncmp(key, "sk_", 3) != 0 ||
        key[3 + SP_APIKEY_ID_LEN] != '.' || !valid_chars(key + 3, SP_APIKEY_ID_LEN) ||
        !valid_chars(key + 4 + SP_APIKEY_ID_LEN, 43))
        return SP_ENOTFOUND;
    memcpy(id, key + 3, SP_APIKEY_ID_LEN);
    id[SP_APIKEY_ID_LEN] = '\0';
    sp_sha256(key, strlen(key), hash);
    int rc = live_row(db, id, &k, stored);
    if (rc < 0)
        return rc;
    if (CRYPTO_memcmp(stored, hash, SP_SHA256_LEN) != 0)
        return SP_ENOTFOUND;
    *ret = k;
    return 0;
}

int sp_apikey_verify(PGconn *db, const char *key, char **ret_tenant,
                     char ret_id[SP_APIKEY_ID_LEN + 1])
{
    sp_apikey_t k;
    int rc = sp_apikey_check(db, key, &k);
    if (rc < 0)
        return rc;
    *ret_tenant = sp_xstrdup(k.tenant);
    memcpy(ret_id, k.id, sizeof(k.id));
    return 0;
}

int sp_apikey_lookup(PGconn *db, const char *id, sp_apikey_t *ret)
{
    uint8_t stored[SP_SHA256_LEN];
    if (!id || strlen(id) != SP_APIKEY_ID_LEN || !valid_chars(id, SP_APIKEY_ID_LEN))
        return SP_ENOTFOUND;
    return live_row(db, id, ret, stored);
}

/* An UPDATE of one live key; SP_ENOTFOUND when it changed no row. */
static int update_live(PGconn *db, const char *sql, const char *id)
{
    const char *params[1] = {id};
    PGresult *r = PQexecParams(db, sql, 1, NULL, params, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_COMMAND_OK);
    if (rc == 0 && strcmp(PQcmdTuples(r), "1") != 0)
        rc = SP_ENOTFOUND;
    PQclear(r);
    return rc;
}

int sp_apikey_touch(PGconn *db, const char *id)
{
    return update_live(db,
                       "UPDATE api_keys SET last_used_at = now() WHERE id = $1 AND revoked_at "
                       "IS NULL",
                       id);
}

int sp_apikey_revoke(PGconn *db, const char *id)
{
    if (!id || strlen(id) != SP_APIKEY_ID_LEN || !valid_chars(id, SP_APIKEY_ID_LEN))
        return SP_ENOTFOUND;
    return update_live(db,
                       "UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS "
                       "NULL",
                       id);
}

int sp_apikey_set_admin(PGconn *db, const char *id)
{
    return update_live(db, "UPDATE api_keys SET admin = true WHERE id = $1 AND revoked_at IS NULL",
                       id);
}
