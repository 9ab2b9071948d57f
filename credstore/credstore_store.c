/* The credentials: rows in PostgreSQL (the durable copy, migration 5), a table in memory
 * (what lookups read), values sealed under the master key (cred.h) and opened only to answer
 * a lookup. The caller holds cs->mu. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "credstore.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "json.h"
#include "log.h"
#include "xmalloc.h"

#define CANARY     "space-credstore canary v1"
#define CANARY_LEN (sizeof(CANARY) - 1)

void cs_cred_free(cs_cred_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_hosts; i++)
        free(c->hosts[i]);
    free(c->hosts);
    free(c->parsed);
    if (c->ct)
        explicit_bzero(c->ct, c->ct_len);
    free(c->ct);
    free(c);
}

void cs_cred_meta(const cs_cred_t *c, Space__Cred__V1__CredMeta *m)
{
    Space__Cred__V1__CredMeta init = SPACE__CRED__V1__CRED_META__INIT;
    *m = init;
    m->id = (char *)c->id;
    m->tenant = (char *)c->tenant;
    m->name = (char *)c->name;
    m->scope_kind = (char *)c->scope_kind;
    m->scope_id = (char *)c->scope_id;
    m->hosts = c->hosts;
    m->n_hosts = c->n_hosts;
    m->inject_type = (char *)sp_cred_inject_name(c->inject);
    m->inject_name = (char *)c->inject_name;
    m->inject_user = (char *)c->inject_user;
    m->rate_per_minute = c->rate_per_minute;
    m->expires_at_us = c->expires_at_us;
    m->version = c->version;
    m->created_at_us = c->created_at_us;
    m->rotated_at_us = c->rotated_at_us;
    m->key_id = (char *)c->key_id;
}

static void table_add(cs_t *cs, cs_cred_t *c)
{
    if (cs->n_creds == cs->cap_creds) {
        cs->cap_creds = cs->cap_creds ? cs->cap_creds * 2 : 64;
        cs->creds = sp_xreallocarray(cs->creds, cs->cap_creds, sizeof(cs_cred_t *));
    }
    cs->creds[cs->n_creds++] = c;
}

cs_cred_t *cs_store_find(cs_t *cs, const char *tenant, const char *id)
{
    for (size_t i = 0; i < cs->n_creds; i++)
        if (strcmp(cs->creds[i]->id, id) == 0 && strcmp(cs->creds[i]->tenant, tenant) == 0)
            return cs->creds[i];
    return NULL;
}

static int seal(const sp_cred_key_t *key, cs_cred_t *c, const uint8_t *value, size_t len)
{
    uint8_t aad[96];
    size_t al = sp_cred_aad(c->id, c->version, aad);
    uint8_t *ct = sp_xmalloc(len + SP_CRED_TAG_LEN);
    int rc = sp_cred_seal(key, aad, al, value, len, c->nonce, ct);
    if (rc < 0) {
        free(ct);
        return rc;
    }
    if (c->ct)
        explicit_bzero(c->ct, c->ct_len);
    free(c->ct);
    c->ct = ct;
    c->ct_len = len + SP_CRED_TAG_LEN;
    snprintf(c->key_id, sizeof(c->key_id), "%s", key->id);
    return 0;
}

static int open_with(const sp_cred_key_t *key, const cs_cred_t *c, uint8_t *out)
{
    if (!c->ct || c->ct_len < SP_CRED_TAG_LEN || c->ct_len - SP_CRED_TAG_LEN > SP_CRED_VALUE_MAX)
        return -EBADMSG;
    uint8_t aad[96];
    size_t al = sp_cred_aad(c->id, c->version, aad);
    int rc = sp_cred_open(key, aad, al, c->nonce, c->ct, c->ct_len, out);
    return rc < 0 ? rc : (int)(c->ct_len - SP_CRED_TAG_LEN);
}

int cs_store_open_value(cs_t *cs, const cs_cred_t *c, uint8_t *out)
{
    if (cs->have_previous && strcmp(c->key_id, cs->previous.id) == 0)
        return open_with(&cs->previous, c, out);
    return open_with(&cs->key, c, out);
}

static int64_t col_i64(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static int bytea_get(const PGresult *r, int row, int col, uint8_t **ret, size_t *ret_len)
{
    if (PQgetisnull(r, row, col))
        return -ENOENT;
    size_t n = 0;
    unsigned char *b = PQunescapeBytea((const unsigned char *)PQgetvalue(r, row, col), &n);
    if (!b)
        return -ENOMEM;
    *ret = sp_xmalloc(n ? n : 1);
    memcpy(*ret, b, n);
    explicit_bzero(b, n);
    PQfreemem(b);
    *ret_len = n;
    return 0;
}

/* The canary of key: made if this key has none, checked otherwise. A database whose
 * credentials are sealed under some other key and no canary of ours means the wrong key. */
static int check_canary(cs_t *cs, const sp_cred_key_t *key, bool create, const char **why)
{
    const char *p[1] = {key->id};
    PGresult *r = PQexecParams(cs->db, "SELECT nonce, canary FROM credstore_keys WHERE key_id = $1",
                               1, NULL, p, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc < 0) {
        *why = "cannot read credstore_keys";
        goto out;
    }
    if (PQntuples(r) == 1) {
        uint8_t *nonce = NULL, *ct = NULL;
        size_t nl = 0, cl = 0;
        uint8_t pt[64];
        rc = bytea_get(r, 0, 0, &nonce, &nl);
        if (rc == 0)
            rc = bytea_get(r, 0, 1, &ct, &cl);
        if (rc == 0 && (nl != SP_CRED_NONCE_LEN || cl != CANARY_LEN + SP_CRED_TAG_LEN))
            rc = -EBADMSG;
        if (rc == 0)
            rc = sp_cred_open(key, (const uint8_t *)key->id, strlen(key->id), nonce, ct, cl, pt);
        if (rc == 0 && memcmp(pt, CANARY, CANARY_LEN) != 0)
            rc = -EBADMSG;
        free(nonce);
        free(ct);
        if (rc < 0)
            *why = "the master key does not open its canary (the key file or the database was "
                   "altered)";
        goto out;
    }
    if (!create) {
        rc = SP_ENOTFOUND;
        *why = "no canary for this key";
        goto out;
    }
    PQclear(r);
    /* Rows sealed under another key: this is not the key they need. */
    r = PQexecParams(cs->db,
                     "SELECT key_id FROM credentials WHERE deleted_at IS NULL AND key_id <> $1 "
                     "UNION SELECT key_id FROM credstore_keys WHERE key_id <> $1 LIMIT 1",
                     1, NULL, p, NULL, NULL, 0);
    if ((rc = sp_db_check(r, PGRES_TUPLES_OK)) < 0) {
        *why = "cannot read credentials";
        goto out;
    }
    if (PQntuples(r) > 0) {
        rc = -EKEYREJECTED;
        *why = "wrong master key: the credentials were sealed under another key (give it as "
               "--previous-master-key-file to re-wrap them under this one)";
        goto out;
    }
    {
        uint8_t nonce[SP_CRED_NONCE_LEN], ct[CANARY_LEN + SP_CRED_TAG_LEN];
        rc = sp_cred_seal(key, (const uint8_t *)key->id, strlen(key->id), (const uint8_t *)CANARY,
                          CANARY_LEN, nonce, ct);
        if (rc < 0) {
            *why = "cannot seal the canary";
            goto out;
        }
        const char *v[3] = {key->id, (const char *)nonce, (const char *)ct};
        int lens[3] = {0, SP_CRED_NONCE_LEN, (int)sizeof(ct)};
        int fmts[3] = {0, 1, 1};
        PQclear(r);
        r = PQexecParams(cs->db,
                         "INSERT INTO credstore_keys (key_id, nonce, canary) VALUES ($1, $2, $3) "
                         "ON CONFLICT DO NOTHING",
                         3, NULL, v, lens, fmts, 0);
        if ((rc = sp_db_check(r, PGRES_COMMAND_OK)) < 0)
            *why = "cannot store the canary";
    }
out:
    PQclear(r);
    return rc;
}

/* key's canary, unless it has one. */
static int store_canary(cs_t *cs, const sp_cred_key_t *key)
{
    uint8_t nonce[SP_CRED_NONCE_LEN], ct[CANARY_LEN + SP_CRED_TAG_LEN];
    int rc = sp_cred_seal(key, (const uint8_t *)key->id, strlen(key->id), (const uint8_t *)CANARY,
                          CANARY_LEN, nonce, ct);
    if (rc < 0)
        return rc;
    const char *v[3] = {key->id, (const char *)nonce, (const char *)ct};
    int lens[3] = {0, SP_CRED_NONCE_LEN, (int)sizeof(ct)};
    int fmts[3] = {0, 1, 1};
    PGresult *r = PQexecParams(cs->db,
                               "INSERT INTO credstore_keys (key_id, nonce, canary) "
                               "VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                               3, NULL, v, lens, fmts, 0);
    rc = sp_db_check(r, PGRES_COMMAND_OK);
    PQclear(r);
    return rc;
}

/* c's value opened with from and sealed under to (same id and version: the additional data
 * does not change), written back; c changes only once the row did. */
static int rewrap_one(cs_t *cs, cs_cred_t *c, const sp_cred_key_t *from, const sp_cred_key_t *to)
{
    uint8_t pt[SP_CRED_VALUE_MAX];
    int n = open_with(from, c, pt);
    if (n < 0)
        return n;
    cs_cred_t next = *c;
    next.ct = NULL;
    int rc = seal(to, &next, pt, (size_t)n);
    explicit_bzero(pt, sizeof(pt));
    if (rc < 0)
        return rc;
    const char *v[4] = {c->id, next.key_id, (const char *)next.nonce, (const char *)next.ct};
    int lens[4] = {0, 0, SP_CRED_NONCE_LEN, (int)next.ct_len};
    int fmts[4] = {0, 0, 1, 1};
    PGresult *u = PQexecParams(cs->db,
                               "UPDATE credentials SET key_id = $2, nonce = $3, ciphertext = $4 "
                               "WHERE id = $1",
                               4, NULL, v, lens, fmts, 0);
    rc = sp_db_check(u, PGRES_COMMAND_OK);
    PQclear(u);
    if (rc < 0) {
        explicit_bzero(next.ct, next.ct_len);
        free(next.ct);
        return rc;
    }
    explicit_bzero(c->ct, c->ct_len);
    free(c->ct);
    *c = next;
    return 0;
}

int cs_store_rewrap_live(cs_t *cs, const sp_cred_key_t *next, const char **why)
{
    pthread_mutex_lock(&cs->mu);
    if (cs->have_previous && strcmp(next->id, cs->key.id) != 0) {
        pthread_mutex_unlock(&cs->mu);
        *why = "a re-wrap under another key is not finished (restart credstore)";
        return -EBUSY;
    }
    if (!cs->have_previous) {
        if (strcmp(next->id, cs->key.id) == 0) {
            pthread_mutex_unlock(&cs->mu);
            *why = "the next key is the current one";
            return -EINVAL;
        }
        if (store_canary(cs, next) < 0) {
            pthread_mutex_unlock(&cs->mu);
            *why = "cannot store the next key's canary";
            return SP_EDB;
        }
        cs->previous = cs->key;
        cs->key = *next;
        cs->have_previous = true;
    }
    pthread_mutex_unlock(&cs->mu);
    int count = 0, rc = 0;
    for (;;) {
        /* One row per hold of mu: a lookup waits for one UPDATE at most. */
        pthread_mutex_lock(&cs->mu);
        cs_cred_t *c = NULL;
        for (size_t i = 0; i < cs->n_creds && !c; i++)
            if (strcmp(cs->creds[i]->key_id, cs->key.id) != 0)
                c = cs->creds[i];
        if (c) {
            rc = strcmp(c->key_id, cs->previous.id) == 0
                     ? rewrap_one(cs, c, &cs->previous, &cs->key)
                     : -EKEYREJECTED;
            if (rc < 0) {
                sp_log(SP_LOG_ERROR, "a credential cannot be re-wrapped",
                       SP_KS("credential", c->id), SP_KS("key_id", c->key_id),
                       SP_KS("error", sp_strerror(rc)));
                *why = "a credential could not be re-wrapped (see the log)";
            }
        }
        pthread_mutex_unlock(&cs->mu);
        if (!c || rc < 0)
            break;
        count++;
    }
    if (rc < 0)
        return rc;
    /* The data keys of captured output too (docs/audit.md): one left under the previous key
     * would not open once it is gone. previous and key change only here, under mu. */
    sp_cred_key_t from = cs->previous, to = cs->key;
    rc = cs_datakeys_rewrap(cs, &from, &to, true);
    sp_cred_key_wipe(&from);
    sp_cred_key_wipe(&to);
    if (rc < 0) {
        *why = "a data key could not be re-wrapped (see the log)";
        return rc;
    }
    pthread_mutex_lock(&cs->mu);
    const char *p[1] = {cs->previous.id};
    PGresult *r = PQexecParams(cs->db, "DELETE FROM credstore_keys WHERE key_id = $1", 1, NULL, p,
                               NULL, NULL, 0);
    PQclear(r);
    sp_cred_key_wipe(&cs->previous);
    cs->have_previous = false;
    pthread_mutex_unlock(&cs->mu);
    return count;
}

static int load(cs_t *cs, const sp_cred_key_t *previous, const char **why)
{
    PGresult *r =
        PQexec(cs->db, "SELECT id, tenant, name, scope_kind, scope_id, hosts::text, inject_type, "
                       "inject_name, inject_user, rate_per_minute, "
                       "(extract(epoch FROM expires_at) * 1000000)::int8, version, key_id, nonce, "
                       "ciphertext, (extract(epoch FROM created_at) * 1000000)::int8, "
                       "(extract(epoch FROM rotated_at) * 1000000)::int8 "
                       "FROM credentials WHERE deleted_at IS NULL ORDER BY created_at");
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc < 0) {
        *why = "cannot read credentials";
        PQclear(r);
        return rc;
    }
    size_t rewrapped = 0;
    for (int i = 0; i < PQntuples(r) && rc >= 0; i++) {
        cs_cred_t *c = sp_xcalloc(1, sizeof(*c));
        snprintf(c->id, sizeof(c->id), "%s", PQgetvalue(r, i, 0));
        snprintf(c->tenant, sizeof(c->tenant), "%s", PQgetvalue(r, i, 1));
        snprintf(c->name, sizeof(c->name), "%s", PQgetvalue(r, i, 2));
        snprintf(c->scope_kind, sizeof(c->scope_kind), "%s", PQgetvalue(r, i, 3));
        snprintf(c->scope_id, sizeof(c->scope_id), "%s", PQgetvalue(r, i, 4));
        const char *hosts = PQgetvalue(r, i, 5);
        sp_json_doc_t *doc = NULL;
        char jerr[SP_JSON_ERR_MAX];
        sp_json_limits_t lim = {
            .max_bytes = strlen(hosts) + 1, .max_depth = 2, .max_nodes = 1024, .max_string = 1024};
        if (sp_json_parse(hosts, strlen(hosts), &lim, &doc, jerr) == 0) {
            const sp_json_t *a = sp_json_root(doc);
            c->n_hosts = sp_json_len(a);
            c->hosts = sp_xcalloc(c->n_hosts ? c->n_hosts : 1, sizeof(char *));
            c->parsed = sp_xcalloc(c->n_hosts ? c->n_hosts : 1, sizeof(sp_cred_host_t));
            for (size_t h = 0; h < c->n_hosts; h++) {
                const char *s = sp_json_str(sp_json_at(a, h), NULL);
                c->hosts[h] = sp_xstrdup(s ? s : "");
                if (sp_cred_host_parse(c->hosts[h], &c->parsed[h]) < 0)
                    memset(&c->parsed[h], 0, sizeof(c->parsed[h])); /* matches nothing */
            }
        }
        sp_json_doc_free(doc);
        c->inject = sp_cred_inject_parse(PQgetvalue(r, i, 6));
        snprintf(c->inject_name, sizeof(c->inject_name), "%s", PQgetvalue(r, i, 7));
        snprintf(c->inject_user, sizeof(c->inject_user), "%s", PQgetvalue(r, i, 8));
        c->rate_per_minute = (uint32_t)col_i64(r, i, 9);
        c->expires_at_us = col_i64(r, i, 10);
        c->version = (uint32_t)col_i64(r, i, 11);
        snprintf(c->key_id, sizeof(c->key_id), "%s", PQgetvalue(r, i, 12));
        uint8_t *nonce = NULL;
        size_t nl = 0;
        if (bytea_get(r, i, 13, &nonce, &nl) == 0 && nl == SP_CRED_NONCE_LEN)
            memcpy(c->nonce, nonce, nl);
        free(nonce);
        (void)bytea_get(r, i, 14, &c->ct, &c->ct_len);
        c->created_at_us = col_i64(r, i, 15);
        c->rotated_at_us = col_i64(r, i, 16);
        if (strcmp(c->key_id, cs->key.id) != 0) {
            /* Sealed under the previous key: re-wrapped under this one, same id and version
             * (the additional data does not change), then written back. */
            uint8_t pt[SP_CRED_VALUE_MAX];
            int n = previous && strcmp(c->key_id, previous->id) == 0 ? open_with(previous, c, pt)
                                                                     : -EKEYREJECTED;
            if (n >= 0) {
                rc = seal(&cs->key, c, pt, (size_t)n);
                explicit_bzero(pt, sizeof(pt));
            } else {
                rc = n;
            }
            if (rc == 0) {
                const char *v[4] = {c->id, c->key_id, (const char *)c->nonce, (const char *)c->ct};
                int lens[4] = {0, 0, SP_CRED_NONCE_LEN, (int)c->ct_len};
                int fmts[4] = {0, 0, 1, 1};
                PGresult *u = PQexecParams(cs->db,
                                           "UPDATE credentials SET key_id = $2, nonce = $3, "
                                           "ciphertext = $4 WHERE id = $1",
                                           4, NULL, v, lens, fmts, 0);
                rc = sp_db_check(u, PGRES_COMMAND_OK);
                PQclear(u);
                rewrapped++;
            }
            if (rc < 0) {
                sp_log(SP_LOG_ERROR, "credential sealed under an unknown key",
                       SP_KS("credential", c->id), SP_KS("key_id", c->key_id));
                *why = "a credential is sealed under a key this credstore does not have";
            }
        }
        table_add(cs, c);
    }
    PQclear(r);
    if (rewrapped)
        sp_log(SP_LOG_INFO, "credentials re-wrapped under the master key",
               SP_KU("count", rewrapped), SP_KS("key_id", cs->key.id));
    return rc;
}

int cs_store_open(cs_t *cs, const sp_cred_key_t *previous, const char **why)
{
    if (previous) {
        int rc = check_canary(cs, previous, false, why);
        if (rc < 0 && rc != SP_ENOTFOUND) {
            *why = "the previous master key does not open its canary";
            return rc;
        }
        /* Our key's canary first, even though rows still name the previous key. */
        (void)store_canary(cs, &cs->key);
    }
    int rc = check_canary(cs, &cs->key, true, why);
    if (rc < 0)
        return rc;
    rc = load(cs, previous, why);
    if (rc == 0 && previous) {
        int n = cs_datakeys_rewrap(cs, previous, &cs->key, false);
        if (n < 0) {
            *why = "a data key could not be re-wrapped (see the log)";
            rc = n;
        }
    }
    if (rc == 0 && previous) {
        const char *p[1] = {previous->id};
        PGresult *r = PQexecParams(cs->db, "DELETE FROM credstore_keys WHERE key_id = $1", 1, NULL,
                                   p, NULL, NULL, 0);
        PQclear(r);
    }
    return rc;
}

void cs_store_close(cs_t *cs)
{
    for (size_t i = 0; i < cs->n_creds; i++)
        cs_cred_free(cs->creds[i]);
    free(cs->creds);
    cs->creds = NULL;
    cs->n_creds = cs->cap_creds = 0;
}

static char *hosts_json(const cs_cred_t *c)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_putc(&b, '[');
    for (size_t i = 0; i < c->n_hosts; i++) {
        if (i)
            sp_buf_putc(&b, ',');
        sp_buf_json_str(&b, c->hosts[i]);
    }
    sp_buf_putc(&b, ']');
    return sp_buf_take(&b);
}

static void new_id(char out[SP_ID_MAX + 1])
{
    char sbx[SP_SANDBOX_ID_LEN + 1];
    sp_sandbox_id_new(sbx); /* "sbx_" + 26 sortable characters */
    snprintf(out, SP_ID_MAX + 1, "crd_%s", sbx + 4);
}

int cs_store_create(cs_t *cs, cs_cred_t *c, const uint8_t *value, size_t len)
{
    new_id(c->id);
    c->version = 1;
    c->created_at_us = sp_now_us();
    int rc = seal(&cs->key, c, value, len);
    if (rc < 0)
        return rc;
    char *hosts = hosts_json(c), rate[16], exp[32], created[32];
    snprintf(rate, sizeof(rate), "%u", c->rate_per_minute);
    snprintf(exp, sizeof(exp), "%lld", (long long)c->expires_at_us);
    snprintf(created, sizeof(created), "%lld", (long long)c->created_at_us);
    const char *v[15] = {c->id,
                         c->tenant,
                         c->name,
                         c->scope_kind,
                         c->scope_id,
                         hosts,
                         sp_cred_inject_name(c->inject),
                         c->inject_name,
                         c->inject_user,
                         rate,
                         c->expires_at_us ? exp : NULL,
                         c->key_id,
                         (const char *)c->nonce,
                         (const char *)c->ct,
                         created};
    int lens[15] = {0};
    int fmts[15] = {0};
    lens[12] = SP_CRED_NONCE_LEN;
    lens[13] = (int)c->ct_len;
    fmts[12] = fmts[13] = 1;
    PGresult *r = PQexecParams(
        cs->db,
        "INSERT INTO credentials (id, tenant, name, scope_kind, scope_id, hosts, inject_type, "
        "inject_name, inject_user, rate_per_minute, expires_at, version, key_id, nonce, "
        "ciphertext, created_at) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10::int, "
        "to_timestamp($11::int8 / 1000000.0), 1, $12, $13, $14, "
        "to_timestamp($15::int8 / 1000000.0))",
        15, NULL, v, lens, fmts, 0);
    free(hosts);
    if (PQresultStatus(r) == PGRES_COMMAND_OK) {
        rc = 0;
        table_add(cs, c);
    } else {
        const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        rc = state && strcmp(state, "23505") == 0 ? -EEXIST : SP_EDB;
        if (rc == SP_EDB)
            sp_log(SP_LOG_ERROR, "credential insert failed", SP_KS("credential", c->id),
                   SP_KS("error", PQerrorMessage(cs->db)));
    }
    PQclear(r);
    return rc;
}

int cs_store_rotate(cs_t *cs, cs_cred_t *c, const uint8_t *value, size_t len)
{
    cs_cred_t next = *c;
    next.ct = NULL;
    next.version = c->version + 1;
    int rc = seal(&cs->key, &next, value, len);
    if (rc < 0)
        return rc;
    char version[16], rotated[32];
    next.rotated_at_us = sp_now_us();
    snprintf(version, sizeof(version), "%u", next.version);
    snprintf(rotated, sizeof(rotated), "%lld", (long long)next.rotated_at_us);
    const char *v[6] = {
        c->id, version, next.key_id, (const char *)next.nonce, (const char *)next.ct, rotated};
    int lens[6] = {0, 0, 0, SP_CRED_NONCE_LEN, (int)next.ct_len, 0};
    int fmts[6] = {0, 0, 0, 1, 1, 0};
    PGresult *r = PQexecParams(cs->db,
                               "UPDATE credentials SET version = $2::int, key_id = $3, "
                               "nonce = $4, ciphertext = $5, "
                               "rotated_at = to_timestamp($6::int8 / 1000000.0) "
                               "WHERE id = $1 AND deleted_at IS NULL",
                               6, NULL, v, lens, fmts, 0);
    rc = sp_db_check(r, PGRES_COMMAND_OK);
    PQclear(r);
    if (rc < 0) {
        explicit_bzero(next.ct, next.ct_len);
        free(next.ct);
        return rc;
    }
    explicit_bzero(c->ct, c->ct_len);
    free(c->ct);
    *c = next;
    return 0;
}

int cs_store_delete(cs_t *cs, cs_cred_t *c)
{
    const char *v[1] = {c->id};
    PGresult *r = PQexecParams(cs->db,
                               "UPDATE credentials SET deleted_at = now(), nonce = NULL, "
                               "ciphertext = NULL WHERE id = $1",
                               1, NULL, v, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_COMMAND_OK);
    PQclear(r);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < cs->n_creds; i++) {
        if (cs->creds[i] == c) {
            cs->creds[i] = cs->creds[--cs->n_creds];
            break;
        }
    }
    cs_cred_free(c);
    return 0;
}

int cs_placed_on(cs_t *cs, const char *tenant, const char *sandbox, const char *worker)
{
    const char *p[2] = {sandbox, tenant};
    PGresult *r = PQexecParams(cs->db, "SELECT worker FROM sandboxes WHERE id = $1 AND tenant = $2",
                               2, NULL, p, NULL, NULL, 0);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc == 0)
        rc = PQntuples(r) == 1 && (!worker || strcmp(PQgetvalue(r, 0, 0), worker) == 0) ? 1 : 0;
    PQclear(r);
    return rc;
}
