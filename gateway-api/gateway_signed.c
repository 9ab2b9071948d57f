/* E2B signed /files URLs (docs/e2b-signed-urls.md): the SDK's downloadUrl() and uploadUrl()
 * give a URL that works without any header,
 *
 *   GET|POST <base>/files?path=P[&username=U]&signature=v1_S[&signature_expiration=E]
 *
 * where S = base64(SHA-256("P:op:U:token[:E]")) without '=' padding, op "read" (GET) or
 * "write" (POST), U empty when no username is sent (getSignature sets an undefined user to
 * ""), and token the sandbox's envdAccessToken (gateway_auth.c). With
 * E2B_SANDBOX_URL set nothing in the request names the sandbox: it is found by its signature.
 *
 * Finding it: a signature can only be checked against a token, and a token is derived (one
 * Ed25519 signature), not stored. So each gateway keeps an index of the tokens it computed:
 * those it handed out (E2B create, connect, get, fork answers) and those a fill read from
 * PostgreSQL (running sandboxes times the live keys of their tenant, at most
 * SIGNED_KEYS_PER_SANDBOX keys each). A request hashes its string once per candidate: the
 * entries of the sandbox it names (E2b-Sandbox-Id, Host 49983-<id>.<domain>) when it names
 * one, else every entry, and there are at most signed-url-index (the bound of the work one
 * request buys: ~0.3 us per hash here, docs/e2b-signed-urls.md). A miss may fill the index
 * once (the named sandbox's tokens; or, at most every SIGNED_FILL_EVERY_NS per gateway, the
 * newest running sandboxes') and look again.
 *
 * The index only finds: a match is then authenticated as an X-Access-Token would be (the
 * token's key must be live, the token recomputed and compared, gw_auth), so a revoked key's
 * entries open nothing, and the files operation runs for that key's tenant only.
 *
 * Order of the checks: signature_expiration first (an expired URL costs no hashing and
 * answers E2B's exact 401 body), then the rate of failed lookups (a client address may fail
 * signed-url-fail-per-s a second with a burst of signed-url-fail-burst, the gateway as a
 * whole signed-url-global-per-s; past that 429 with Retry-After before any hashing), then the
 * candidates, compared with CRYPTO_memcmp. No match: 401 "invalid signature" (envd's words).
 *
 * Secrets: tokens live in this memory only (wiped when evicted and at exit); a signature is
 * a bearer credential too, so the request line's log shows the query with its value replaced
 * (gw_log_path, gateway_http.c), and no error message quotes it. */
#include "gateway.h"

#include <inttypes.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "b64.h"
#include "db.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define SIG_PREFIX              "v1_"
#define SIG_B64_LEN             43 /* base64 of 32 bytes without its one '=' */
#define SIG_LEN                 (sizeof(SIG_PREFIX) - 1 + SIG_B64_LEN)
#define SIGNED_FILL_EVERY_NS    (5LL * 1000 * 1000 * 1000)
#define SIGNED_KEYS_PER_SANDBOX 16

/* ---- the index ---- */

void gw_signed_init(gw_signed_t *s, const gw_config_t *cfg)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    s->n = (size_t)cfg->signed_url_index;
    s->e = sp_xcalloc(s->n, sizeof(*s->e));
    s->fail_per_s = (double)cfg->signed_url_fail_per_s;
    s->fail_burst = (double)cfg->signed_url_fail_burst;
    s->global_per_s = (double)cfg->signed_url_global_per_s;
    s->global_burst = (double)cfg->signed_url_global_burst;
    s->global.tokens = s->global_burst;
    for (size_t i = 0; i < GW_SIGNED_CLIENTS; i++)
        s->client[i].tokens = s->fail_burst;
}

void gw_signed_dispose(gw_signed_t *s)
{
    if (s->e)
        explicit_bzero(s->e, s->n * sizeof(*s->e));
    free(s->e);
    s->e = NULL;
    s->n = 0;
    pthread_mutex_destroy(&s->mu);
}

void gw_signed_note(gw_signed_t *s, const char *sandbox, const char *token, size_t len)
{
    if (!sandbox[0] || len == 0 || len > GW_SIGNED_TOKEN_MAX || strlen(sandbox) > SP_ID_MAX)
        return;
    pthread_mutex_lock(&s->mu);
    size_t slot = 0;
    uint64_t oldest = UINT64_MAX;
    for (size_t i = 0; i < s->n; i++) {
        if (s->e[i].stamp != 0 && s->e[i].len == len && memcmp(s->e[i].token, token, len) == 0) {
            slot = i; /* known: only newer now */
            break;
        }
        if (s->e[i].stamp < oldest) {
            oldest = s->e[i].stamp;
            slot = i;
        }
    }
    explicit_bzero(s->e[slot].token, sizeof(s->e[slot].token));
    snprintf(s->e[slot].sandbox, sizeof(s->e[slot].sandbox), "%s", sandbox);
    memcpy(s->e[slot].token, token, len);
    s->e[slot].len = len;
    s->e[slot].stamp = ++s->clock;
    pthread_mutex_unlock(&s->mu);
}

void gw_signed_forget(gw_signed_t *s, const char *sandbox)
{
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++)
        if (s->e[i].stamp != 0 && strcmp(s->e[i].sandbox, sandbox) == 0)
            memset(&s->e[i], 0, sizeof(s->e[i]));
    pthread_mutex_unlock(&s->mu);
}

/* Whether the token of (sandbox, key id) is indexed: its text starts "<sandbox>.<key id>.". */
static bool indexed(gw_signed_t *s, const char *sandbox, const char *key_id)
{
    size_t sl = strlen(sandbox), kl = strlen(key_id);
    bool hit = false;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n && !hit; i++)
        hit = s->e[i].stamp != 0 && s->e[i].len > sl + kl + 2 &&
              memcmp(s->e[i].token, sandbox, sl) == 0 && s->e[i].token[sl] == '.' &&
              memcmp(s->e[i].token + sl + 1, key_id, kl) == 0 && s->e[i].token[sl + 1 + kl] == '.';
    pthread_mutex_unlock(&s->mu);
    return hit;
}

/* ---- one request ---- */

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    void (*serve)(gw_req_t *rq);
    char named[SP_ID_MAX + 1]; /* the sandbox the request names, "" if none */
    sp_buf_t raw;              /* "path:op:user:" then, per candidate, token and suffix */
    size_t prefix_len;
    char suffix[24]; /* ":<expiration>" or "" */
    char sig[SIG_B64_LEN + 1];
    size_t client;
    size_t rows; /* tokens the fill computed */
    bool fill_failed;
} signed_req_t;

static void signed_req_free(signed_req_t *q)
{
    sp_buf_dispose(&q->raw);
    free(q);
}

/* Hashes the request's string with each candidate; on a match the token goes into the
 * request's pool as its access token and the sandbox into path_id. */
static bool scan(signed_req_t *q)
{
    gw_signed_t *s = &q->rq->gw->signed_urls;
    uint8_t d[SP_SHA256_LEN];
    sp_buf_t b64;
    bool hit = false;

    sp_buf_init(&b64);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n && !hit; i++) {
        if (s->e[i].stamp == 0 || (q->named[0] && strcmp(s->e[i].sandbox, q->named) != 0))
            continue;
        q->raw.len = q->prefix_len;
        sp_buf_append(&q->raw, s->e[i].token, s->e[i].len);
        sp_buf_puts(&q->raw, q->suffix);
        sp_sha256(q->raw.data, q->raw.len, d);
        sp_buf_reset(&b64);
        sp_b64_encode(&b64, d, sizeof(d));
        if (b64.len == SIG_B64_LEN + 1 && CRYPTO_memcmp(b64.data, q->sig, SIG_B64_LEN) == 0) {
            hit = true;
            gw_req_t *rq = q->rq;
            if (gw_req_live(rq)) {
                char *t = h2o_mem_alloc_pool(&rq->req->pool, s->e[i].len);
                memcpy(t, s->e[i].token, s->e[i].len);
                rq->auth_key = h2o_iovec_init(t, s->e[i].len);
                rq->auth_token = true;
                snprintf(rq->path_id, sizeof(rq->path_id), "%s", s->e[i].sandbox);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    /* The token part only: the prefix serves a second scan after a fill. */
    if (q->raw.len > q->prefix_len)
        explicit_bzero(q->raw.data + q->prefix_len, q->raw.len - q->prefix_len);
    q->raw.len = q->prefix_len;
    sp_buf_dispose(&b64);
    return hit;
}

static void refill(int64_t now, double *tokens, int64_t *at, double rate, double burst)
{
    if (*at)
        *tokens += (double)(now - *at) / 1e9 * rate;
    if (*tokens > burst)
        *tokens = burst;
    *at = now;
}

/* Whether a failed lookup is still allowed for this client and the gateway (loop thread). */
static bool may_fail(gw_signed_t *s, size_t client)
{
    int64_t now = sp_mono_ns();
    refill(now, &s->client[client].tokens, &s->client[client].at_ns, s->fail_per_s, s->fail_burst);
    refill(now, &s->global.tokens, &s->global.at_ns, s->global_per_s, s->global_burst);
    return s->client[client].tokens >= 1.0 && s->global.tokens >= 1.0;
}

static void failed(signed_req_t *q)
{
    gw_signed_t *s = &q->rq->gw->signed_urls;
    s->client[q->client].tokens -= 1.0;
    s->global.tokens -= 1.0;
    s->failures++;
    if (q->fill_failed)
        gw_respond_error(q->rq, 503, "unavailable", NULL, "cannot check the signature now");
    else
        gw_respond_error(q->rq, 401, "unauthorized", NULL, "invalid signature");
}

static void matched(signed_req_t *q)
{
    gw_req_t *rq = q->rq;
    rq->after_auth = q->serve;
    gw_auth(rq);
}

/* Pool thread: the tokens of running sandboxes (the named one, else the newest) for the live
 * keys of their tenant that the index does not hold yet. */
static void fill_run(gw_job_t *job, PGconn *db)
{
    signed_req_t *q = (signed_req_t *)job;
    gw_t *gw = q->rq->gw;
    char limit[16];
    snprintf(limit, sizeof(limit), "%zu", gw->signed_urls.n);
    const char *p[3] = {q->named, limit, NULL};
    char per[16];
    snprintf(per, sizeof(per), "%d", SIGNED_KEYS_PER_SANDBOX);
    p[2] = per;
    PGresult *r = PQexecParams(
        db,
        "SELECT sid, tenant, kid FROM (SELECT s.id AS sid, s.tenant, k.id AS kid, s.started_at, "
        "k.created_at AS kc, row_number() OVER (PARTITION BY s.id ORDER BY k.created_at DESC) "
        "AS n FROM sandboxes s JOIN api_keys k ON k.tenant = s.tenant AND k.revoked_at IS NULL "
        "WHERE s.state = 'running' AND ($1 = '' OR s.id = $1)) c WHERE n <= $3::int "
        "ORDER BY started_at DESC NULLS LAST, kc DESC LIMIT $2::int",
        3, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        sp_log(SP_LOG_WARN, "query failed", SP_KS("query", "signed URL candidates"),
               SP_KS("error", PQerrorMessage(db)));
        q->fill_failed = true;
        PQclear(r);
        return;
    }
    sp_buf_t t;
    sp_buf_init(&t);
    /* Oldest first, so that the newest end up the newest in the index. */
    for (int i = PQntuples(r) - 1; i >= 0; i--) {
        const char *sid = PQgetvalue(r, i, 0), *tenant = PQgetvalue(r, i, 1);
        const char *kid = PQgetvalue(r, i, 2);
        if (indexed(&gw->signed_urls, sid, kid))
            continue;
        sp_buf_reset(&t);
        if (gw_access_token(gw, sid, tenant, kid, &t) == 0) {
            gw_signed_note(&gw->signed_urls, sid, t.data, t.len);
            q->rows++;
        }
        explicit_bzero(t.data, t.len);
    }
    sp_buf_dispose(&t);
    PQclear(r);
}

static void fill_done(gw_job_t *job)
{
    signed_req_t *q = (signed_req_t *)job;
    gw_req_t *rq = q->rq;
    if (!q->named[0])
        rq->gw->signed_urls.filling = false;
    if (gw_req_live(rq)) {
        if (!q->fill_failed && scan(q))
            matched(q);
        else
            failed(q);
    }
    gw_req_unref(rq);
    signed_req_free(q);
}

/* The remote address's bucket of failed lookups. */
static size_t client_slot(const gw_req_t *rq)
{
    struct sockaddr_storage ss;
    char host[NI_MAXHOST];
    h2o_conn_t *conn = rq->req->conn;
    socklen_t n =
        conn->callbacks->get_peername ? conn->callbacks->get_peername(conn, (void *)&ss) : 0;
    size_t hl = n ? h2o_socket_getnumerichost((struct sockaddr *)&ss, n, host) : SIZE_MAX;
    if (hl == SIZE_MAX)
        return 0;
    uint8_t d[SP_SHA256_LEN];
    sp_sha256(host, hl, d);
    return ((size_t)d[0] | (size_t)d[1] << 8) % GW_SIGNED_CLIENTS;
}

void gw_signed_files(gw_req_t *rq, const char *named, void (*serve)(gw_req_t *rq))
{
    gw_signed_t *s = &rq->gw->signed_urls;
    gw_query_t qs;
    const char *path = NULL, *user = NULL, *sig = NULL, *exp = NULL;
    bool get = h2o_memis(rq->req->method.base, rq->req->method.len, H2O_STRLIT("GET"));

    if (gw_query_parse(rq->req, &qs) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "malformed query string");
        return;
    }
    for (size_t i = 0; i < qs.n; i++) {
        const char *k = qs.p[i].key, *v = qs.p[i].value;
        if (strcmp(k, "path") == 0 && !path)
            path = v;
        else if (strcmp(k, "username") == 0 && !user)
            user = v;
        else if (strcmp(k, "signature") == 0 && !sig)
            sig = v;
        else if (strcmp(k, "signature_expiration") == 0 && !exp)
            exp = v;
    }
    if (!sig) {
        gw_respond_error(rq, 401, "unauthorized", NULL,
                         "send X-Access-Token (the sandbox's envdAccessToken) or X-API-KEY, or "
                         "use a signed URL (downloadUrl, uploadUrl)");
        return;
    }
    if (!path) {
        /* The SDK always signs a path: a multipart upload naming its own is not signed. */
        gw_respond_error(rq, 400, "invalid_query", NULL, "a signed URL needs path");
        return;
    }
    if (exp) {
        /* Unix seconds, as the SDK computes them; a negative one is past too. */
        const char *d = exp[0] == '-' ? exp + 1 : exp;
        size_t n = strlen(d);
        bool ok = n > 0 && n <= 18;
        for (size_t i = 0; ok && i < n; i++)
            ok = d[i] >= '0' && d[i] <= '9';
        if (!ok) {
            gw_respond_error(rq, 401, "unauthorized", NULL, "invalid signature_expiration");
            return;
        }
        if (exp[0] == '-' || strtoll(d, NULL, 10) < (long long)time(NULL)) {
            gw_respond_error(rq, 401, "unauthorized", NULL, "signature is already expired");
            return;
        }
    }
    size_t client = client_slot(rq);
    if (!may_fail(s, client)) {
        s->limited++;
        h2o_add_header(&rq->req->pool, &rq->req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL,
                       H2O_STRLIT("1"));
        gw_respond_error(rq, 429, "rate_limited", NULL,
                         "too many failed signature checks from this client; retry later");
        return;
    }
    signed_req_t *q = sp_xcalloc(1, sizeof(*q));
    q->rq = rq;
    q->serve = serve;
    q->client = client;
    snprintf(q->named, sizeof(q->named), "%s", named ? named : "");
    if (exp)
        snprintf(q->suffix, sizeof(q->suffix), ":%s", exp);
    sp_buf_init(&q->raw);
    sp_buf_puts(&q->raw, path);
    sp_buf_puts(&q->raw, get ? ":read:" : ":write:");
    sp_buf_puts(&q->raw, user ? user : "");
    sp_buf_putc(&q->raw, ':');
    q->prefix_len = q->raw.len;
    if (strlen(sig) != SIG_LEN || strncmp(sig, SIG_PREFIX, sizeof(SIG_PREFIX) - 1) != 0) {
        failed(q);
        signed_req_free(q);
        return;
    }
    memcpy(q->sig, sig + sizeof(SIG_PREFIX) - 1, SIG_B64_LEN);
    q->sig[SIG_B64_LEN] = '\0';
    if (scan(q)) {
        matched(q);
        signed_req_free(q);
        return;
    }
    /* A miss: the index may not hold the token yet (another gateway handed it out, or this
     * one restarted). Read the candidates once, then look again. */
    int64_t now = sp_mono_ns();
    if (!q->named[0] && (s->filling || now < s->fill_after_ns)) {
        failed(q);
        signed_req_free(q);
        return;
    }
    if (!q->named[0]) {
        s->filling = true;
        s->fill_after_ns = now + SIGNED_FILL_EVERY_NS;
    }
    q->job.run = fill_run;
    q->job.done = fill_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &q->job) < 0) {
        if (!q->named[0])
            s->filling = false;
        gw_req_unref(rq);
        signed_req_free(q);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
    }
}
