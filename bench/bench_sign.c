/* space-bench sign: what signing and verifying envelopes cost on this machine, next to the
 * baseline of encoding and decoding the same envelope, in one run and on one core. No stack
 * needed. The event log's end-to-end throughput with signing on vs off is the next
 * increment's measurement (bench eventlog, once the daemons sign). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "envelope.h"
#include "ids.h"
#include "sign.h"
#include "xmalloc.h"
#include "trust.h"

static double now_s(void)
{
    return (double)sp_mono_ns() / 1e9;
}

static int placed_on_w1(void *arg, const char *tenant, const char *sandbox, char worker[65])
{
    memcpy(worker, "w1", 3);
    return 1;
}

int bench_sign(bench_ctx_t *c)
{
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SandboxStarted st = SPACE__V1__SANDBOX_STARTED__INIT;
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    uint8_t seed[32], pub[SP_PUBKEY_LEN], *buf = NULL;
    char id[37], subject[256], reason[SP_REASON_MAX];
    sp_sign_key_t *key = NULL;
    sp_keyring_t *kr = NULL;
    size_t len, n = c->events;
    double dn = (double)n;
    double t0, base, sign, verify;
    int code = 1;

    agg.kind = "sandbox";
    agg.id = "sbx_06h2jklr3poqj6pggtebd5879o";
    st.worker = "w1";
    st.runtime = "gvisor";
    st.address = "10.200.0.2";
    st.start_ms = 312;
    env.aggregate = &agg;
    env.tenant = "default";
    env.actor = "svc:worker";
    env.correlation_id = "req-0123456789";
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED;
    env.sandbox_started = &st;
    sp_envelope_stamp(&env, id);
    sp_random_bytes(seed, sizeof(seed));
    if (sp_sign_key_from_raw(seed, &key) < 0 || sp_sign_key_public(key, pub) < 0 ||
        sp_keyring_new(&kr) < 0 || sp_keyring_add(kr, "worker-w1", pub) < 0)
        goto out;
    sp_envelope_subject(&env, "w1", subject, sizeof(subject));
    sp_trust_t t = {.keyring = kr, .placement = placed_on_w1};

    /* Baseline: what every producer and consumer does today, encode and decode. */
    t0 = now_s();
    for (size_t i = 0; i < n; i++) {
        sp_envelope_t *e = NULL;
        if (sp_envelope_encode(&env, &buf, &len) < 0 ||
            sp_envelope_decode(buf, len, &e, reason) < 0)
            goto out;
        sp_envelope_free(e);
        free(buf);
    }
    base = now_s() - t0;

    t0 = now_s();
    for (size_t i = 0; i < n; i++) {
        if (sp_envelope_encode_signed(&env, "worker-w1", key, &buf, &len) < 0)
            goto out;
        free(buf);
    }
    sign = now_s() - t0;

    if (sp_envelope_encode_signed(&env, "worker-w1", key, &buf, &len) < 0)
        goto out;
    t0 = now_s();
    for (size_t i = 0; i < n; i++) {
        sp_envelope_t *e = NULL;
        if (sp_envelope_decode(buf, len, &e, reason) < 0 ||
            sp_trust_check(&t, e, buf, len, subject, 0, reason) < 0) {
            fprintf(stderr, "space-bench: %s\n", reason);
            sp_envelope_free(e);
            free(buf);
            goto out;
        }
        sp_envelope_free(e);
    }
    verify = now_s() - t0;
    free(buf);

    /* Batches of 256 (one root, each member with its 8-hash proof), checked with the cache
     * as the event log does: one Ed25519 verification per batch. */
    enum { B = 256 };
    sp_envelope_t *envs[B];
    char ids[B][37];
    uint8_t *bbufs[B];
    size_t blens[B], blen_sum = 0;
    sp_sigcache_t *cache = NULL;
    double bsign, bverify;
    sp_sigcache_new(4096, &cache);
    t.cache = cache;
    sp_envelope_t *copies = sp_xcalloc(B, sizeof(*copies));
    for (size_t i = 0; i < B; i++) {
        copies[i] = env;
        sp_envelope_stamp(&copies[i], ids[i]);
        envs[i] = &copies[i];
    }
    size_t rounds = n / B ? n / B : 1;
    t0 = now_s();
    for (size_t r = 0; r < rounds; r++) {
        if (sp_envelope_encode_signed_batch(envs, B, "worker-w1", key, bbufs, blens) < 0)
            goto out;
        for (size_t i = 0; i < B; i++)
            free(bbufs[i]);
    }
    bsign = now_s() - t0;
    bverify = 0;
    for (size_t r = 0; r < rounds; r++) {
        if (sp_envelope_encode_signed_batch(envs, B, "worker-w1", key, bbufs, blens) < 0)
            goto out;
        t0 = now_s();
        for (size_t i = 0; i < B; i++) {
            sp_envelope_t *e = NULL;
            if (sp_envelope_decode(bbufs[i], blens[i], &e, reason) < 0 ||
                sp_trust_check(&t, e, bbufs[i], blens[i], subject, 0, reason) < 0) {
                fprintf(stderr, "space-bench: %s\n", reason);
                goto out;
            }
            sp_envelope_free(e);
        }
        bverify += now_s() - t0;
        for (size_t i = 0; i < B; i++) {
            blen_sum += blens[i];
            free(bbufs[i]);
        }
    }
    free(copies);
    sp_sigcache_free(cache);
    double bn = (double)(rounds * B);

    printf("envelopes: %zu, %zu bytes signed alone, %.0f bytes in batches of %d, one core\n", n,
           len, (double)blen_sum / bn, B);
    printf("%-34s %12s %10s\n", "", "per second", "us each");
    printf("%-34s %12.0f %10.2f\n", "baseline encode+decode", dn / base, base / dn * 1e6);
    printf("%-34s %12.0f %10.2f\n", "encode+sign (producer)", dn / sign, sign / dn * 1e6);
    printf("%-34s %12.0f %10.2f\n", "decode+trust check (consumer)", dn / verify,
           verify / dn * 1e6);
    printf("%-34s %12.0f %10.2f\n", "signed path, both ends", dn / (sign + verify),
           (sign + verify) / dn * 1e6);
    printf("%-34s %12.0f %10.2f\n", "encode+sign, batches of 256", bn / bsign, bsign / bn * 1e6);
    printf("%-34s %12.0f %10.2f\n", "decode+trust check, batches", bn / bverify,
           bverify / bn * 1e6);
    code = 0;
out:
    sp_keyring_free(kr);
    sp_sign_key_free(key);
    return code;
}
