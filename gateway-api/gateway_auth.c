/* API key authentication: `Authorization: Bearer <key>` (RFC 6750 section 2.1), checked with
 * sp_apikey_verify on a pool thread. Positive answers are cached for 10 s, keyed by SHA-256 of
 * the key (the key itself is kept only as long as the check runs, then wiped). A revoked key
 * therefore keeps working for up to 10 s on a gateway that saw it recently. The cache is
 * direct-mapped and fixed-size: a flood of distinct keys can only evict, never grow it. */
#include "gateway.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "apikey.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define KEY_MAX 256 /* longer is not a key of ours: refused without a lookup */

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    char *key; /* heap copy, wiped after use */
    uint8_t hash[SP_SHA256_LEN];
    int rc;
    char *tenant;
    char key_id[SP_APIKEY_ID_LEN + 1];
} auth_job_t;

static size_t slot_of(const uint8_t hash[SP_SHA256_LEN])
{
    return ((size_t)hash[0] | (size_t)hash[1] << 8) % GW_AUTH_CACHE_SLOTS;
}

static bool cache_get(gw_auth_cache_t *c, const uint8_t hash[SP_SHA256_LEN], gw_req_t *rq)
{
    size_t i = slot_of(hash);
    if (c->slot[i].expires_ns <= sp_mono_ns() ||
        CRYPTO_memcmp(c->slot[i].hash, hash, SP_SHA256_LEN) != 0)
        return false;
    snprintf(rq->tenant, sizeof(rq->tenant), "%s", c->slot[i].tenant);
    snprintf(rq->key_id, sizeof(rq->key_id), "%s", c->slot[i].key_id);
    return true;
}

static void cache_put(gw_auth_cache_t *c, const uint8_t hash[SP_SHA256_LEN], const char *tenant,
                      const char *key_id)
{
    size_t i = slot_of(hash);
    memcpy(c->slot[i].hash, hash, SP_SHA256_LEN);
    snprintf(c->slot[i].tenant, sizeof(c->slot[i].tenant), "%s", tenant);
    snprintf(c->slot[i].key_id, sizeof(c->slot[i].key_id), "%s", key_id);
    c->slot[i].expires_ns = sp_mono_ns() + GW_AUTH_TTL_NS;
}

static void unauthorized(gw_req_t *rq, const char *why)
{
    if (gw_req_live(rq) && rq->dialect == GW_DIALECT_V1)
        h2o_add_header(&rq->req->pool, &rq->req->res.headers, H2O_TOKEN_WWW_AUTHENTICATE, NULL,
                       H2O_STRLIT("Bearer realm=\"space\""));
    gw_respond_error(rq, 401, "unauthorized", NULL, "%s", why);
}

static void auth_run(gw_job_t *job, PGconn *db)
{
    auth_job_t *a = (auth_job_t *)job;
    a->rc = sp_apikey_verify(db, a->key, &a->tenant, a->key_id);
    explicit_bzero(a->key, strlen(a->key));
}

static void auth_done(gw_job_t *job)
{
    auth_job_t *a = (auth_job_t *)job;
    gw_req_t *rq = a->rq;

    if (a->rc == 0) {
        cache_put(&rq->gw->auth, a->hash, a->tenant, a->key_id);
        snprintf(rq->tenant, sizeof(rq->tenant), "%s", a->tenant);
        snprintf(rq->key_id, sizeof(rq->key_id), "%s", a->key_id);
        if (gw_req_live(rq))
            rq->after_auth(rq);
    } else if (a->rc == SP_ENOTFOUND) {
        unauthorized(rq, "the API key is not valid");
    } else {
        sp_log(SP_LOG_WARN, "API key check failed", SP_KS("error", sp_strerror(a->rc)),
               SP_KS("request_id", rq->request_id));
        gw_respond_error(rq, 503, "unavailable", NULL, "cannot check the API key now");
    }
    free(a->key);
    free(a->tenant);
    gw_req_unref(rq);
    free(a);
}

void gw_auth(gw_req_t *rq)
{
    bool dup = false;
    const h2o_iovec_t *h = gw_req_header(rq, "authorization", &dup);
    static const char scheme[] = "bearer ";
    const size_t slen = sizeof(scheme) - 1;

    const char *k;
    size_t klen;
    if (rq->auth_key.base) {
        /* The E2B routes found the key elsewhere (X-API-KEY, an envd access token). */
        k = rq->auth_key.base;
        klen = rq->auth_key.len;
    } else if (!h) {
        unauthorized(rq, "missing Authorization: Bearer <API key>");
        return;
    } else if (dup || h->len <= slen || strncasecmp(h->base, scheme, slen) != 0) {
        unauthorized(rq, "expected Authorization: Bearer <API key>");
        return;
    } else {
        k = h->base + slen;
        klen = h->len - slen;
    }
    while (klen > 0 && *k == ' ') {
        k++;
        klen--;
    }
    if (klen == 0 || klen > KEY_MAX || memchr(k, '\0', klen)) {
        unauthorized(rq, "the API key is not valid");
        return;
    }
    uint8_t hash[SP_SHA256_LEN];
    sp_sha256(k, klen, hash);
    if (cache_get(&rq->gw->auth, hash, rq)) {
        rq->after_auth(rq);
        return;
    }
    auth_job_t *a = sp_xcalloc(1, sizeof(*a));
    a->rq = rq;
    a->key = sp_xstrndup(k, klen);
    memcpy(a->hash, hash, sizeof(hash));
    a->job.run = auth_run;
    a->job.done = auth_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &a->job) < 0) {
        explicit_bzero(a->key, klen);
        free(a->key);
        free(a);
        gw_req_unref(rq);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
    }
}
