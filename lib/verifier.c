/* A consumer's trust check with its keyring, cache and mode (verifier.h). */
#include "verifier.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "contract.h"
#include "error.h"
#include "ids.h"
#include "xmalloc.h"

/* Event ids acted on, with their stream sequence: open addressing, a few probes, the oldest
 * of them replaced when all are taken. */
#define ONCE_SLOTS 65536
#define ONCE_PROBE 8
typedef struct {
    char event_id[37];
    uint64_t seq; /* 0: empty */
} once_slot_t;

struct sp_verifier {
    sp_verify_mode_t mode;
    pthread_mutex_t once_mu;
    once_slot_t *once;
    char *dir;
    pthread_rwlock_t lock; /* over keyring (replaced by a reload) */
    sp_keyring_t *keyring;
    sp_sigcache_t *cache;
};

static int fail(char err[SP_VERIFIER_ERR_MAX], int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char err[SP_VERIFIER_ERR_MAX], int rc, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, SP_VERIFIER_ERR_MAX, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int sp_verifier_new(const char *mode, const char *keyring_dir, const char *fallback_dir,
                    size_t cache_slots, sp_verifier_t **ret_v, char err[SP_VERIFIER_ERR_MAX])
{
    const char *dir = keyring_dir && keyring_dir[0] ? keyring_dir : fallback_dir;
    struct stat sb;
    bool exists = dir && dir[0] && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode);
    sp_verify_mode_t m;
    int rc;

    if (!mode || strcmp(mode, "auto") == 0)
        m = exists ? SP_VERIFY_ON : SP_VERIFY_OFF;
    else if (strcmp(mode, "on") == 0)
        m = SP_VERIFY_ON;
    else if (strcmp(mode, "log") == 0)
        m = SP_VERIFY_LOG;
    else if (strcmp(mode, "off") == 0)
        m = SP_VERIFY_OFF;
    else
        return fail(err, -EINVAL, "verify-signatures is on, off, log or auto, not '%.64s'", mode);
    if (m != SP_VERIFY_OFF && !exists)
        return fail(err, -ENOENT,
                    "verify-signatures=%s but the keyring directory '%.256s' "
                    "does not exist",
                    mode, dir ? dir : "");

    sp_verifier_t *v = sp_xcalloc(1, sizeof(*v));
    v->mode = m;
    v->dir = sp_xstrdup(exists ? dir : "");
    pthread_rwlock_init(&v->lock, NULL);
    pthread_mutex_init(&v->once_mu, NULL);
    if (m != SP_VERIFY_OFF) {
        v->once = sp_xcalloc(ONCE_SLOTS, sizeof(*v->once));
        if ((rc = sp_keyring_load(v->dir, &v->keyring)) < 0) {
            sp_verifier_free(v);
            return fail(err, rc, "cannot load the keyring of %.256s: %s", dir, sp_strerror(rc));
        }
        sp_sigcache_new(cache_slots ? cache_slots : 4096, &v->cache);
    }
    *ret_v = v;
    return 0;
}

void sp_verifier_free(sp_verifier_t *v)
{
    if (!v)
        return;
    sp_keyring_free(v->keyring);
    sp_sigcache_free(v->cache);
    pthread_rwlock_destroy(&v->lock);
    pthread_mutex_destroy(&v->once_mu);
    free(v->once);
    free(v->dir);
    free(v);
}

sp_verify_mode_t sp_verifier_mode(const sp_verifier_t *v)
{
    return v ? v->mode : SP_VERIFY_OFF;
}

const char *sp_verifier_mode_name(const sp_verifier_t *v)
{
    switch (sp_verifier_mode(v)) {
    case SP_VERIFY_ON:
        return "on";
    case SP_VERIFY_LOG:
        return "log";
    default:
        return "off";
    }
}

const char *sp_verifier_summary(const sp_verifier_t *v)
{
    switch (sp_verifier_mode(v)) {
    case SP_VERIFY_ON:
        return "verifying signatures: messages refused by the trust check are not acted on";
    case SP_VERIFY_LOG:
        return "verifying signatures, LOG ONLY: refused messages are still acted on";
    default:
        return "SIGNATURES NOT VERIFIED: every well-formed message is acted on whoever sent it";
    }
}

const char *sp_verifier_dir(const sp_verifier_t *v)
{
    return v ? v->dir : "";
}

size_t sp_verifier_identities(sp_verifier_t *v)
{
    if (!v || !v->keyring)
        return 0;
    pthread_rwlock_rdlock(&v->lock);
    size_t n = sp_keyring_size(v->keyring);
    pthread_rwlock_unlock(&v->lock);
    return n;
}

void sp_verifier_stats(const sp_verifier_t *v, uint64_t *ret_hits, uint64_t *ret_verified)
{
    *ret_hits = *ret_verified = 0;
    if (v && v->cache)
        sp_sigcache_stats(v->cache, ret_hits, ret_verified);
}

/* Takes the read lock; first, when signer is not in the keyring but its public key is in the
 * directory now (an identity added while the daemon runs: space identity add), or is a
 * platform whose tenants file changed (space platform add), re-reads the directory under the
 * write lock. The path comes from a parsed identity name only, and a
 * made-up signer costs one failed stat, so a flood of them reads no directory. */
static void lock_for(sp_verifier_t *v, const char *signer)
{
    sp_identity_t id;
    char path[4096];
    struct stat sb;

    pthread_rwlock_rdlock(&v->lock);
    if (!signer || !signer[0] || sp_identity_parse(signer, &id) < 0)
        return;
    if (sp_keyring_has(v->keyring, signer)) {
        /* A platform's tenants may have changed (space platform add rewrites the file). */
        if (id.kind != SP_KIND_PLATFORM || !sp_keyring_stale(v->keyring))
            return;
    } else {
        snprintf(path, sizeof(path), "%s/%s.pub", v->dir, id.name);
        if (stat(path, &sb) != 0)
            return;
    }
    pthread_rwlock_unlock(&v->lock);
    pthread_rwlock_wrlock(&v->lock);
    sp_keyring_t *kr = NULL;
    if ((!sp_keyring_has(v->keyring, signer) || sp_keyring_stale(v->keyring)) &&
        sp_keyring_load(v->dir, &kr) == 0) {
        sp_keyring_free(v->keyring);
        v->keyring = kr;
    }
    pthread_rwlock_unlock(&v->lock);
    pthread_rwlock_rdlock(&v->lock);
}

static int answer(const sp_verifier_t *v, int rc)
{
    if (rc >= 0)
        return 0;
    return v->mode == SP_VERIFY_LOG ? 1 : rc;
}

/* After a signature that did not verify: when the directory changed since the keyring was
 * read (a key rotated: `space identity rotate`), reads it again. Whether it did. One stat
 * when nothing changed, so a flood of bad signatures reads no directory. */
static bool reload_if_stale(sp_verifier_t *v)
{
    /* Under the shared lock first: a flood of bad signatures costs each thread its stats (the
     * keyring only reads), and only a keyring that did change takes the exclusive lock, which
     * would otherwise serialise every verifying thread behind each bad message. */
    pthread_rwlock_rdlock(&v->lock);
    bool stale = sp_keyring_stale(v->keyring);
    pthread_rwlock_unlock(&v->lock);
    if (!stale)
        return false;
    bool reloaded = false;
    pthread_rwlock_wrlock(&v->lock);
    sp_keyring_t *kr = NULL;
    if (sp_keyring_stale(v->keyring) && sp_keyring_load(v->dir, &kr) == 0) {
        sp_keyring_free(v->keyring);
        v->keyring = kr;
        reloaded = true;
    }
    pthread_rwlock_unlock(&v->lock);
    return reloaded;
}

int sp_verifier_verify(sp_verifier_t *v, const sp_envelope_t *env, const uint8_t *raw,
                       size_t raw_len, int64_t at_ns, char reason[SP_REASON_MAX])
{
    if (!v || v->mode == SP_VERIFY_OFF)
        return 0;
    for (int pass = 0;; pass++) {
        lock_for(v, env ? env->signer : NULL);
        sp_trust_t t = {.keyring = v->keyring, .cache = v->cache};
        int rc = sp_trust_verify(&t, env, raw, raw_len, at_ns, reason);
        pthread_rwlock_unlock(&v->lock);
        if (rc != SP_ESIGNATURE || pass > 0 || !reload_if_stale(v))
            return answer(v, rc);
    }
}

int sp_verifier_authorize(sp_verifier_t *v, const sp_envelope_t *env, const char *subject,
                          sp_trust_placement_fn placement, void *placement_arg,
                          char reason[SP_REASON_MAX])
{
    if (!v || v->mode == SP_VERIFY_OFF)
        return 0;
    pthread_rwlock_rdlock(&v->lock);
    sp_trust_t t = {.keyring = v->keyring,
                    .cache = v->cache,
                    .placement = placement,
                    .placement_arg = placement_arg};
    int rc = sp_trust_authorize(&t, env, subject, reason);
    pthread_rwlock_unlock(&v->lock);
    return answer(v, rc);
}

int sp_verifier_check(sp_verifier_t *v, const sp_envelope_t *env, const uint8_t *raw,
                      size_t raw_len, const char *subject, int64_t at_ns,
                      sp_trust_placement_fn placement, void *placement_arg,
                      char reason[SP_REASON_MAX])
{
    int rc = sp_verifier_verify(v, env, raw, raw_len, at_ns, reason);
    if (rc < 0)
        return rc;
    int ra =
        sp_verifier_authorize(v, env, subject, placement, placement_arg, rc > 0 ? NULL : reason);
    return ra < 0 ? ra : (rc | ra);
}

int sp_verifier_verify_raw(sp_verifier_t *v, const char *signer, const void *data, size_t len,
                           const uint8_t sig[SP_SIG_LEN], char reason[SP_REASON_MAX])
{
    int rc;
    if (!v || v->mode == SP_VERIFY_OFF)
        return 0;
    if (!signer || !signer[0] || !sig) {
        if (reason)
            snprintf(reason, SP_REASON_MAX, "unsigned: the request carries no %s",
                     signer && signer[0] ? "signature" : "signer");
        return answer(v, SP_EUNSIGNED);
    }
    for (int pass = 0;; pass++) {
        lock_for(v, signer);
        rc = sp_keyring_verify(v->keyring, signer, data, len, sig);
        pthread_rwlock_unlock(&v->lock);
        if (rc != SP_ESIGNATURE || pass > 0 || !reload_if_stale(v))
            break;
    }
    if (rc < 0 && reason)
        snprintf(reason, SP_REASON_MAX, "%s: %.80s %s", sp_trust_refusal_name(rc), signer,
                 rc == SP_ESIGNER ? "is not a known identity" : "did not sign this");
    return answer(v, rc);
}

/* The slot of event_id: its own, or where it would go. *ret_found when it is there. */
static once_slot_t *once_slot(sp_verifier_t *v, const char *event_id, bool *ret_found)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = event_id; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    once_slot_t *put = NULL;
    for (uint32_t i = 0; i < ONCE_PROBE; i++) {
        once_slot_t *s = &v->once[(h + i) % ONCE_SLOTS];
        if (s->seq && strcmp(s->event_id, event_id) == 0) {
            *ret_found = true;
            return s;
        }
        if (!put || (put->seq && (!s->seq || s->seq < put->seq)))
            put = s;
    }
    *ret_found = false;
    return put;
}

int sp_verifier_once(sp_verifier_t *v, const sp_envelope_t *env, uint64_t stream_seq,
                     sp_verifier_lookup_fn lookup, void *lookup_arg, char reason[SP_REASON_MAX])
{
    bool found;
    uint64_t logged = 0;
    int rc = 0;

    if (!v || v->mode == SP_VERIFY_OFF || !env || !env->event_id || strlen(env->event_id) > 36)
        return 0;
    pthread_mutex_lock(&v->once_mu);
    once_slot_t *s = once_slot(v, env->event_id, &found);
    uint64_t seen = found ? s->seq : 0;
    pthread_mutex_unlock(&v->once_mu);
    bool replay = seen
                      ? seen != stream_seq
                      : lookup && sp_now_us() - env->occurred_at_us > SP_VERIFIER_FRESH_US &&
                            lookup(lookup_arg, env->event_id, &logged) == 1 && logged != stream_seq;
    if (replay)
        rc = SP_ESTALE;
    if (rc < 0) {
        if (reason)
            snprintf(reason, SP_REASON_MAX,
                     "stale_or_replayed: %s %s was accepted at stream sequence %llu, this copy "
                     "is %llu",
                     env->type, env->event_id, (unsigned long long)(seen ? seen : logged),
                     (unsigned long long)stream_seq);
        return answer(v, rc);
    }
    pthread_mutex_lock(&v->once_mu);
    s = once_slot(v, env->event_id, &found);
    if (!found) {
        snprintf(s->event_id, sizeof(s->event_id), "%s", env->event_id);
        s->seq = stream_seq;
    }
    pthread_mutex_unlock(&v->once_mu);
    return 0;
}

int sp_verifier_admit(sp_verifier_t *v, const sp_envelope_t *env, const uint8_t *raw,
                      size_t raw_len, const char *subject, uint64_t stream_seq,
                      int64_t published_ns, sp_trust_placement_fn placement, void *placement_arg,
                      sp_verifier_lookup_fn lookup, void *lookup_arg, char reason[SP_REASON_MAX])
{
    int rc = sp_verifier_check(v, env, raw, raw_len, subject, published_ns, placement,
                               placement_arg, reason);
    if (rc < 0)
        return rc;
    int once = sp_verifier_once(v, env, stream_seq, lookup, lookup_arg, rc ? NULL : reason);
    return once < 0 ? once : (rc | once);
}
