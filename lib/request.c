/* Signed data-plane requests (request.h). */
#include "request.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane.pb-c.h"
#include "envelope.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "publish.h"
#include "xmalloc.h"

#define DOMAIN     "SPACE-C req v1"
#define DOMAIN_LEN (sizeof(DOMAIN)) /* with its NUL */
#define TOKEN_MAX  255
#define MSG_MAX    (DOMAIN_LEN + 1 + TOKEN_MAX + 1 + TOKEN_MAX + 8 + SP_REQUEST_NONCE_LEN + 32)

/* A length byte, then the token's bytes (at most TOKEN_MAX, checked by the callers). */
static size_t put_token(uint8_t *out, const char *s)
{
    size_t len = strlen(s);
    out[0] = (uint8_t)len;
    for (size_t i = 0; i < len; i++)
        out[1 + i] = (uint8_t)s[i];
    return len + 1;
}

/* The bytes the signature covers (request.h); their length. */
static size_t signed_bytes(const char *subject, const char *signer, int64_t issued_at_us,
                           const uint8_t nonce[SP_REQUEST_NONCE_LEN], const uint8_t *body,
                           size_t len, uint8_t out[MSG_MAX])
{
    size_t n = 0;
    memcpy(out, DOMAIN, DOMAIN_LEN);
    n += DOMAIN_LEN;
    n += put_token(out + n, subject);
    n += put_token(out + n, signer);
    for (int i = 7; i >= 0; i--)
        out[n++] = (uint8_t)((uint64_t)issued_at_us >> (i * 8));
    memcpy(out + n, nonce, SP_REQUEST_NONCE_LEN);
    n += SP_REQUEST_NONCE_LEN;
    sp_sha256(body, len, out + n);
    return n + SP_SHA256_LEN;
}

int sp_request_seal_as(const char *subject, const void *body, size_t len, const char *signer,
                       const sp_sign_key_t *key, int64_t issued_at_us, uint8_t **ret_buf,
                       size_t *ret_len)
{
    uint8_t nonce[SP_REQUEST_NONCE_LEN], sig[SP_SIG_LEN], msg[MSG_MAX];
    Space__Io__V1__SignedRequest r = SPACE__IO__V1__SIGNED_REQUEST__INIT;

    if (!signer)
        signer = "";
    if (!subject || strlen(subject) > TOKEN_MAX || strlen(signer) > TOKEN_MAX)
        return -EINVAL;
    if (len > SP_REQUEST_BODY_MAX)
        return SP_ETOOBIG;
    r.body.data = (uint8_t *)body;
    r.body.len = len;
    r.subject = (char *)subject;
    r.signer = (char *)signer;
    r.issued_at_us = issued_at_us;
    if (key) {
        sp_random_bytes(nonce, sizeof(nonce));
        size_t n = signed_bytes(subject, signer, r.issued_at_us, nonce, body, len, msg);
        int rc = sp_sign(key, msg, n, sig);
        if (rc < 0)
            return rc;
        r.nonce.data = nonce;
        r.nonce.len = sizeof(nonce);
        r.signature.data = sig;
        r.signature.len = sizeof(sig);
    }
    size_t n = space__io__v1__signed_request__get_packed_size(&r);
    uint8_t *buf = sp_xmalloc(n ? n : 1);
    space__io__v1__signed_request__pack(&r, buf);
    *ret_buf = buf;
    *ret_len = n;
    return 0;
}

int sp_request_seal(const char *subject, const void *body, size_t len, uint8_t **ret_buf,
                    size_t *ret_len)
{
    const sp_sign_key_t *key = sp_publish_signer_key();
    return sp_request_seal_as(subject, body, len, key ? sp_publish_signer() : "", key, sp_now_us(),
                              ret_buf, ret_len);
}

int sp_request_send(sp_bus_t *bus, const char *subject, const void *body, size_t len,
                    int timeout_ms, uint8_t **ret_data, size_t *ret_len)
{
    uint8_t *buf = NULL;
    size_t n = 0;
    int rc = sp_request_seal(subject, body, len, &buf, &n);
    if (rc < 0)
        return rc;
    rc = sp_bus_request(bus, subject, buf, n, timeout_ms, ret_data, ret_len);
    /* The body may hold environment values or stdin: nothing of it stays in freed memory. */
    explicit_bzero(buf, n);
    free(buf);
    return rc;
}

/* ---- the responder's side ---- */

/* Nonces seen within the window: open addressing over a fixed table, probing a few slots; a
 * slot is free when empty or older than the window. When every probed slot is fresh the
 * oldest of them is replaced: a flood beyond the table's size within one window can push a
 * nonce out early, which only the responder itself (the one subscriber of its subjects) could
 * then replay. */
#define NONCE_SLOTS 65536
#define NONCE_PROBE 8

typedef struct {
    uint8_t nonce[SP_REQUEST_NONCE_LEN];
    int64_t at_us; /* 0: empty */
} nonce_slot_t;

struct sp_request_guard {
    sp_verifier_t *v;
    pthread_mutex_t mu;
    nonce_slot_t *slots;
};

int sp_request_guard_new(sp_verifier_t *v, sp_request_guard_t **ret_g)
{
    sp_request_guard_t *g = sp_xcalloc(1, sizeof(*g));
    g->v = v;
    pthread_mutex_init(&g->mu, NULL);
    g->slots = sp_xcalloc(NONCE_SLOTS, sizeof(*g->slots));
    *ret_g = g;
    return 0;
}

void sp_request_guard_free(sp_request_guard_t *g)
{
    if (!g)
        return;
    pthread_mutex_destroy(&g->mu);
    free(g->slots);
    free(g);
}

/* true when nonce was seen within the window; otherwise remembers it. */
static bool nonce_seen(sp_request_guard_t *g, const uint8_t nonce[SP_REQUEST_NONCE_LEN],
                       int64_t now_us)
{
    uint32_t h;
    memcpy(&h, nonce, sizeof(h)); /* random bytes: any four are a hash */
    pthread_mutex_lock(&g->mu);
    nonce_slot_t *put = NULL, *oldest = NULL;
    for (uint32_t i = 0; i < NONCE_PROBE; i++) {
        nonce_slot_t *s = &g->slots[(h + i) % NONCE_SLOTS];
        bool fresh = s->at_us && now_us - s->at_us <= 2 * SP_REQUEST_WINDOW_US;
        if (fresh && memcmp(s->nonce, nonce, SP_REQUEST_NONCE_LEN) == 0) {
            pthread_mutex_unlock(&g->mu);
            return true;
        }
        if (!fresh && !put)
            put = s;
        else if (fresh && (!oldest || s->at_us < oldest->at_us))
            oldest = s;
    }
    if (!put)
        put = oldest;
    memcpy(put->nonce, nonce, SP_REQUEST_NONCE_LEN);
    put->at_us = now_us;
    pthread_mutex_unlock(&g->mu);
    return false;
}

static int refuse(char reason[SP_REASON_MAX], int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(char reason[SP_REASON_MAX], int code, const char *fmt, ...)
{
    if (reason) {
        const char *name = sp_trust_refusal_name(code);
        int n = snprintf(reason, SP_REASON_MAX, "%s: ", name ? name : "invalid");
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && n < SP_REASON_MAX)
            vsnprintf(reason + n, SP_REASON_MAX - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Which request subject of the contract subject is, and its {worker} token. */
static const sp_subject_t *request_subject(const char *subject, char worker[SP_INSTANCE_MAX + 1])
{
    for (int id = 0; id < SP_SUBJ__COUNT; id++) {
        const sp_subject_t *s = sp_subject((sp_subject_id_t)id);
        worker[0] = '\0';
        if (s->request && sp_subject_match((sp_subject_id_t)id, subject, worker))
            return s;
    }
    return NULL;
}

/* The contract: may the signer's kind send on this subject? */
static int may_send(const char *signer, const char *subject, char reason[SP_REASON_MAX])
{
    char worker[SP_INSTANCE_MAX + 1];
    sp_identity_t id;
    if (sp_identity_parse(signer, &id) < 0)
        return refuse(reason, SP_ESIGNER, "%.80s is not an identity", signer);
    const sp_subject_t *s = request_subject(subject, worker);
    if (!s)
        return refuse(reason, SP_ENOTALLOWED, "%.128s is no request subject", subject);
    unsigned bit = SP_KIND_BIT(id.kind);
    if (s->pub_any & bit)
        return 0;
    if (!(s->pub_own & bit))
        return refuse(reason, SP_ENOTALLOWED, "%s may not send %s requests", id.name, s->name);
    if (strcmp(worker, id.instance) != 0)
        return refuse(reason, SP_ENOTOWN, "%s may send %s requests only for itself, not %s",
                      id.name, s->name, worker);
    return 0;
}

int sp_request_open(sp_request_guard_t *g, const char *subject, const uint8_t *raw, size_t len,
                    sp_request_t *ret, char reason[SP_REASON_MAX])
{
    uint8_t msg[MSG_MAX];
    int rc;

    memset(ret, 0, sizeof(*ret));
    if (len > SP_BUS_MAX_MSG)
        return refuse(reason, SP_ETOOBIG, "a request of %zu bytes", len);
    Space__Io__V1__SignedRequest *r = space__io__v1__signed_request__unpack(NULL, len, raw);
    if (!r)
        return refuse(reason, SP_EDECODE, "not a signed request");
    ret->msg_ = r;
    char bad[SP_REASON_MAX];
    if (sp_proto_wire_check(r->base.descriptor, raw, len, bad) < 0)
        return refuse(reason, SP_EDECODE, "%s", bad);
    ret->body = r->body.data;
    ret->len = r->body.len;
    if (r->body.len > SP_REQUEST_BODY_MAX)
        return refuse(reason, SP_ETOOBIG, "a body of %zu bytes", r->body.len);
    if (!subject || strcmp(r->subject, subject) != 0)
        return refuse(reason, SP_ESCHEMA, "signed for %.128s, received on %.128s", r->subject,
                      subject ? subject : "");
    if (strlen(r->signer) <= SP_IDENTITY_MAX)
        snprintf(ret->signer, sizeof(ret->signer), "%s", r->signer);
    if (sp_verifier_mode(g->v) == SP_VERIFY_OFF)
        return 0;

    int soft = 0; /* log mode: what would have been refused */
    char *why = reason;
    if (!r->signer[0] || r->signature.len != SP_SIG_LEN || r->nonce.len != SP_REQUEST_NONCE_LEN)
        rc = refuse(reason, SP_EUNSIGNED, "the request carries no %s",
                    r->signer[0] ? "signature" : "signer");
    else if (strlen(r->signer) > TOKEN_MAX || strlen(subject) > TOKEN_MAX)
        rc = refuse(reason, SP_ESIGNER, "signer or subject too long");
    else if ((rc = may_send(r->signer, subject, reason)) == 0) {
        size_t n = signed_bytes(subject, r->signer, r->issued_at_us, r->nonce.data, r->body.data,
                                r->body.len, msg);
        rc = sp_verifier_verify_raw(g->v, r->signer, msg, n, r->signature.data, reason);
        if (rc > 0) {
            soft = 1;
            why = NULL; /* keep the first reason */
            rc = 0;
        }
        if (rc == 0) {
            int64_t now = sp_now_us(), d = now - r->issued_at_us;
            if (d > SP_REQUEST_WINDOW_US || d < -SP_REQUEST_WINDOW_US)
                rc = refuse(why, SP_ESTALE, "issued %lld ms from now (window %lld s)",
                            (long long)(d / 1000), (long long)(SP_REQUEST_WINDOW_US / 1000000));
            else if (nonce_seen(g, r->nonce.data, now))
                rc = refuse(why, SP_ESTALE, "replayed: this request was received before");
        }
    }
    if (rc < 0 && sp_verifier_mode(g->v) == SP_VERIFY_LOG)
        return 1;
    return rc < 0 ? rc : soft;
}

void sp_request_dispose(sp_request_t *r)
{
    if (!r || !r->msg_)
        return;
    Space__Io__V1__SignedRequest *m = r->msg_;
    if (m->body.len)
        explicit_bzero(m->body.data, m->body.len);
    space__io__v1__signed_request__free_unpacked(m, NULL);
    r->msg_ = NULL;
    r->body = NULL;
    r->len = 0;
}

void sp_request_refuse(sp_bus_t *bus, const char *reply_to, const char *reason)
{
    Space__Io__V1__RequestRefused r = SPACE__IO__V1__REQUEST_REFUSED__INIT;
    uint8_t buf[SP_REASON_MAX + 64];
    r.error = (char *)"unauthorized";
    r.detail = (char *)(reason ? reason : "");
    size_t n = space__io__v1__request_refused__get_packed_size(&r);
    if (!reply_to || n > sizeof(buf))
        return;
    space__io__v1__request_refused__pack(&r, buf);
    (void)sp_bus_publish_core(bus, reply_to, buf, n);
}

int sp_request_take(sp_request_guard_t *g, sp_bus_t *bus, const char *subject, const char *reply_to,
                    const uint8_t *raw, size_t len, sp_request_t *ret, char reason[SP_REASON_MAX])
{
    int rc = sp_request_open(g, subject, raw, len, ret, reason);
    if (rc < 0)
        sp_request_refuse(bus, reply_to, reason);
    return rc;
}
