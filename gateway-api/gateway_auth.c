/* Authentication: an API key (`Authorization: Bearer <key>`, RFC 6750 section 2.1; E2B's
 * X-API-KEY) checked with sp_apikey_check on a pool thread, or an E2B envd access token (below).
 * Positive answers are cached for 10 s, keyed by SHA-256 of what was presented (the key itself
 * is kept only as long as the check runs, then wiped). The cache is direct-mapped and
 * fixed-size: a flood of distinct keys can only evict, never grow it.
 *
 * Revocation is immediate, not 10 s late: the gateway that revokes a key empties its cache
 * before it answers (so the next request is refused), and the revoke's UPDATE fires a NOTIFY
 * on SP_APIKEY_CHANNEL (migration 6's trigger, whoever revokes) that every gateway's LISTEN
 * thread counts (gw_listener_t), after which its loop empties its cache (gw_auth_sync, also at
 * every request, before the cache is read). A check that was running meanwhile may have read the
 * row before the revocation committed: the cache's epoch changes with every flush, and an answer
 * from an older epoch is used for its own request but not cached. After a reconnect of the
 * LISTEN connection (notifications may have been lost) the cache is emptied too. Requests that
 * were authenticated before (an SSE stream already open) are not cut.
 *
 * E2B access tokens (envdAccessToken): "<sandbox>.<key id>.<signature>", the signature being
 * the gateway identity's Ed25519 signature (deterministic, RFC 8032) over a domain string, the
 * sandbox, the tenant and the key id of the key that asked for the sandbox. Every gateway of
 * the deployment signs with the same identity key, so every one can recompute and compare it;
 * nothing is stored. A token authenticates only the envd routes of its own sandbox (the cache
 * entry is scoped to it, and an API key route never takes it: it is not an sk_ key), lives as
 * long as its key (the key id must name a live key; revoking the key kills its tokens) and
 * carries nothing secret of the key. */
#include "gateway.h"

#include <openssl/crypto.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "apikey.h"
#include "b64.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "sign.h"
#include "xmalloc.h"

#define KEY_MAX       256 /* longer is not a key of ours: refused without a lookup */
#define TOKEN_DOMAIN  "space envd access token v1"
#define TOKEN_SIG_B64 88 /* base64url of 64 bytes, padded (sp_b64url_encode) */

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    char *key; /* heap copy, wiped after use */
    uint8_t hash[SP_SHA256_LEN];
    bool token;
    char scope[SP_ID_MAX + 1]; /* the token's sandbox */
    uint64_t epoch;
    int rc;
    sp_apikey_t k;
} auth_job_t;

static size_t slot_of(const uint8_t hash[SP_SHA256_LEN])
{
    return ((size_t)hash[0] | (size_t)hash[1] << 8) % GW_AUTH_CACHE_SLOTS;
}

static void set_identity(gw_req_t *rq, const char *tenant, const char *key_id, bool admin)
{
    snprintf(rq->tenant, sizeof(rq->tenant), "%s", tenant);
    snprintf(rq->key_id, sizeof(rq->key_id), "%s", key_id);
    rq->admin = admin;
}

static bool cache_get(gw_auth_cache_t *c, const uint8_t hash[SP_SHA256_LEN], const char *scope,
                      gw_req_t *rq)
{
    size_t i = slot_of(hash);
    if (c->slot[i].expires_ns <= sp_mono_ns() ||
        CRYPTO_memcmp(c->slot[i].hash, hash, SP_SHA256_LEN) != 0 ||
        strcmp(c->slot[i].scope, scope) != 0)
        return false;
    set_identity(rq, c->slot[i].tenant, c->slot[i].key_id, c->slot[i].admin);
    return true;
}

static void cache_put(gw_auth_cache_t *c, const uint8_t hash[SP_SHA256_LEN], const char *scope,
                      const sp_apikey_t *k)
{
    size_t i = slot_of(hash);
    memcpy(c->slot[i].hash, hash, SP_SHA256_LEN);
    snprintf(c->slot[i].scope, sizeof(c->slot[i].scope), "%s", scope);
    snprintf(c->slot[i].tenant, sizeof(c->slot[i].tenant), "%s", k->tenant);
    snprintf(c->slot[i].key_id, sizeof(c->slot[i].key_id), "%s", k->id);
    c->slot[i].admin = k->admin;
    c->slot[i].expires_ns = sp_mono_ns() + GW_AUTH_TTL_NS;
}

void gw_auth_flush(gw_t *gw)
{
    uint64_t epoch = gw->auth.epoch + 1;
    memset(&gw->auth, 0, sizeof(gw->auth));
    gw->auth.epoch = epoch;
}

void gw_auth_sync(gw_t *gw)
{
    uint64_t gen = atomic_load(&gw->notify.keys_gen);
    if (gen != gw->keys_gen) {
        gw->keys_gen = gen;
        gw_auth_flush(gw);
    }
}

/* ---- E2B access tokens ---- */

/* What a token signs. NUL-separated: none of the three can hold a NUL, so the fields cannot
 * run together. */
static void token_msg(sp_buf_t *m, const char *sandbox, const char *tenant, const char *key_id)
{
    sp_buf_append(m, TOKEN_DOMAIN, sizeof(TOKEN_DOMAIN));
    sp_buf_append(m, sandbox, strlen(sandbox) + 1);
    sp_buf_append(m, tenant, strlen(tenant) + 1);
    sp_buf_append(m, key_id, strlen(key_id));
}

static int token_sig(const gw_t *gw, const char *sandbox, const char *tenant, const char *key_id,
                     uint8_t sig[SP_SIG_LEN])
{
    sp_buf_t m;
    sp_buf_init(&m);
    token_msg(&m, sandbox, tenant, key_id);
    int rc = sp_sign(gw->token_key, m.data, m.len, sig);
    sp_buf_dispose(&m);
    return rc;
}

struct gw_token_ring {
    pthread_mutex_t mu;
    char *dir, *identity;
    sp_keyring_t *kr; /* read when first needed, again when the directory changed */
};

gw_token_ring_t *gw_token_ring_new(const char *dir, const char *identity)
{
    gw_token_ring_t *r = sp_xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    r->dir = sp_xstrdup(dir);
    r->identity = sp_xstrdup(identity);
    return r;
}

void gw_token_ring_free(gw_token_ring_t *r)
{
    if (!r)
        return;
    sp_keyring_free(r->kr);
    pthread_mutex_destroy(&r->mu);
    free(r->dir);
    free(r->identity);
    free(r);
}

/* Whether sig (the token's, base64url) is a signature of (sandbox, tenant, key id) by one of
 * the gateway identity's retired keys still valid now: a token handed out before the key was
 * rotated keeps opening its sandbox for the rotation's grace. Pool thread. */
static bool token_retired_ok(const gw_t *gw, const char *sandbox, const char *tenant,
                             const char *key_id, const char *sig_b64)
{
    gw_token_ring_t *r = gw->token_ring;
    uint8_t *sig = NULL;
    size_t sig_len = 0;
    bool ok = false;

    if (!r || sp_b64url_decode(sig_b64, strlen(sig_b64), &sig, &sig_len) < 0)
        return false;
    if (sig_len == SP_SIG_LEN) {
        sp_buf_t m;
        sp_buf_init(&m);
        token_msg(&m, sandbox, tenant, key_id);
        pthread_mutex_lock(&r->mu);
        sp_keyring_t *kr = NULL;
        if ((!r->kr || sp_keyring_stale(r->kr)) && sp_keyring_load(r->dir, &kr) == 0) {
            sp_keyring_free(r->kr);
            r->kr = kr;
        }
        ok = r->kr && sp_keyring_has_retired(r->kr, r->identity) &&
             sp_keyring_verify(r->kr, r->identity, m.data, m.len, sig) == 0;
        pthread_mutex_unlock(&r->mu);
        sp_buf_dispose(&m);
    }
    free(sig);
    return ok;
}

int gw_access_token(const gw_t *gw, const char *sandbox, const char *tenant, const char *key_id,
                    sp_buf_t *out)
{
    uint8_t sig[SP_SIG_LEN];
    int rc = token_sig(gw, sandbox, tenant, key_id, sig);
    if (rc < 0)
        return rc;
    sp_buf_puts(out, sandbox);
    sp_buf_putc(out, '.');
    sp_buf_puts(out, key_id);
    sp_buf_putc(out, '.');
    sp_buf_t b;
    sp_buf_init(&b);
    sp_b64url_encode(&b, sig, sizeof(sig));
    sp_buf_append(out, b.data, b.len);
    sp_buf_dispose(&b);
    return 0;
}

/* "<sandbox>.<key id>.<signature>" of sandbox: the key id into key_id; false for any other
 * shape. */
static bool token_parse(const char *t, const char *sandbox, char key_id[SP_APIKEY_ID_LEN + 1])
{
    size_t sl = strlen(sandbox);
    if (strncmp(t, sandbox, sl) != 0 || t[sl] != '.')
        return false;
    const char *k = t + sl + 1, *dot = strchr(k, '.');
    if (!dot || dot - k != SP_APIKEY_ID_LEN || strlen(dot + 1) != TOKEN_SIG_B64)
        return false;
    memcpy(key_id, k, SP_APIKEY_ID_LEN);
    key_id[SP_APIKEY_ID_LEN] = '\0';
    return true;
}

/* Pool thread: the key the token names must be live, and the token must be the one this
 * deployment makes for (sandbox, that key's tenant, key id). */
static int token_check(const gw_t *gw, PGconn *db, const char *token, const char *sandbox,
                       sp_apikey_t *ret)
{
    char key_id[SP_APIKEY_ID_LEN + 1];
    if (!token_parse(token, sandbox, key_id))
        return SP_ENOTFOUND;
    int rc = sp_apikey_lookup(db, key_id, ret);
    if (rc < 0)
        return rc;
    sp_buf_t want;
    sp_buf_init(&want);
    rc = gw_access_token(gw, sandbox, ret->tenant, key_id, &want);
    if (rc == 0 && (want.len != strlen(token) || CRYPTO_memcmp(want.data, token, want.len) != 0) &&
        !token_retired_ok(gw, sandbox, ret->tenant, key_id, token + strlen(token) - TOKEN_SIG_B64))
        rc = SP_ENOTFOUND;
    sp_buf_dispose(&want);
    return rc;
}

/* ---- the check ---- */

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
    a->rc = a->token ? token_check(a->rq->gw, db, a->key, a->scope, &a->k)
                     : sp_apikey_check(db, a->key, &a->k);
    explicit_bzero(a->key, strlen(a->key));
    /* Only on a cache miss: at most every GW_AUTH_TTL_NS per key and gateway. A failure here
     * only loses a timestamp. */
    if (a->rc == 0 && sp_apikey_touch(db, a->k.id) < 0)
        sp_log(SP_LOG_DEBUG, "cannot record the key's use", SP_KS("key_id", a->k.id));
}

static void auth_done(gw_job_t *job)
{
    auth_job_t *a = (auth_job_t *)job;
    gw_req_t *rq = a->rq;

    if (a->rc == 0) {
        if (a->epoch == rq->gw->auth.epoch)
            cache_put(&rq->gw->auth, a->hash, a->scope, &a->k);
        set_identity(rq, a->k.tenant, a->k.id, a->k.admin);
        if (gw_req_live(rq))
            gw__req_authed(rq);
    } else if (a->rc == SP_ENOTFOUND) {
        unauthorized(rq, a->token ? "the access token is not valid" : "the API key is not valid");
    } else {
        sp_log(SP_LOG_WARN, "API key check failed", SP_KS("error", sp_strerror(a->rc)),
               SP_KS("request_id", rq->request_id));
        gw_respond_error(rq, 503, "unavailable", NULL, "cannot check the API key now");
    }
    free(a->key);
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
        unauthorized(rq,
                     rq->auth_token ? "the access token is not valid" : "the API key is not valid");
        return;
    }
    const char *scope = rq->auth_token ? rq->path_id : "";
    gw_auth_sync(rq->gw);
    uint8_t hash[SP_SHA256_LEN];
    sp_sha256(k, klen, hash);
    if (cache_get(&rq->gw->auth, hash, scope, rq)) {
        gw__req_authed(rq);
        return;
    }
    auth_job_t *a = sp_xcalloc(1, sizeof(*a));
    a->rq = rq;
    a->key = sp_xstrndup(k, klen);
    a->token = rq->auth_token;
    snprintf(a->scope, sizeof(a->scope), "%s", scope);
    a->epoch = rq->gw->auth.epoch;
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
