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

int sp_apikey_create(PGconn *db, const char *tenant, const char *name, char **ret_key,
                     char ret_id[SP_APIKEY_ID_LEN + 1])
{
    char id[SP_APIKEY_ID_LEN + 1], secret[44];
    uint8_t hash[SP_SHA256_LEN];
    int rc;

    if (!sp_id_valid(tenant))
        return -EINVAL;
    if ((rc = random_text(id, SP_APIKEY_ID_LEN)) < 0 || (rc = random_text(secret, 43)) < 0)
        return rc;
    char *key = sp_xasprintf("sk_%s.%s", id, secret);
    explicit_bzero(secret, sizeof(secret));
    sp_sha256(key, strlen(key), hash);

    const char *params[4] = {id, tenant, (const char *)hash, name ? name : ""};
    int lens[4] = {0, 0, SP_SHA256_LEN, 0};
    int fmts[4] = {0, 0, 1, 0};
    PGresult *r = PQexecParams(db,
                               "INSERT INTO api_keys (id, tenant, hash, name) VALUES ($1, $2, "
                               "$3, $4)",
                               4, NULL, params, lens, fmts, 0);
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

int sp_apikey_verify(PGconn *db, const char *key, char **ret_tenant,
                     char ret_id[SP_APIKEY_ID_LEN + 1])
{
    char id[SP_APIKEY_ID_LEN + 1];
    uint8_t hash[SP_SHA256_LEN];
    int rc = SP_ENOTFOUND;

    if (!key || strlen(key) != SP_APIKEY_LEN || strncmp(key, "sk_", 3) != 0 ||
        key[3 + SP_APIKEY_ID_LEN] != '.' || !valid_chars(key + 3, SP_APIKEY_ID_LEN) ||
        !valid_chars(key + 4 + SP_APIKEY_ID_LEN, 43))
        return SP_ENOTFOUND;
    memcpy(id, key + 3, SP_APIKEY_ID_LEN);
    id[SP_APIKEY_ID_LEN] = '\0';
    sp_sha256(key, strlen(key), hash);

    const char *params[1] = {id};
    PGresult *r = PQexecParams(db,
                               "SELECT tenant, hash FROM api_keys WHERE id = $1 AND revoked_at "
                               "IS NULL",
                               1, NULL, params, NULL, NULL, 1 /* binary: hash as raw bytes */);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        rc = SP_EDB;
    } else if (PQntuples(r) == 1 && PQgetlength(r, 0, 1) == SP_SHA256_LEN &&
               CRYPTO_memcmp(PQgetvalue(r, 0, 1), hash, SP_SHA256_LEN) == 0) {
        *ret_tenant = sp_xstrdup(PQgetvalue(r, 0, 0));
        memcpy(ret_id, id, sizeof(id));
        rc = 0;
    }
    PQclear(r);
    return rc;
}
