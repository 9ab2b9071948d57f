/* space-egressd internals (docs/egress.md). One libuv loop owns everything below; the bus
 * consumer runs on its own thread and hands decoded events to the loop through a queue and a
 * uv_async_t (STYLE.md: never touch loop state from another thread).
 *
 *   egressd_policy.c  sandboxes (by id and by address), their policies, DNS attributions,
 *                     decisions, and the events that change them
 *   egressd_dns.c     the DNS server on the gateway addresses (dns_port after the worker's
 *                     redirect) and the upstream resolver client
 *   egressd_proxy.c   the transparent TCP listener: SO_ORIGINAL_DST, HTTP Host / TLS SNI,
 *                     its own upstream connection, splicing
 *   egressd_audit.c   EgressAllowed / EgressDenied, aggregated per second
 *   egressd_rate.c    per-sandbox bandwidth: a token bucket each way
 *   egressd_cred.c    credentials: asked of space-credstore, cached for a second, injected
 *                     into request heads; rate limits; CredentialUsed / CredentialDenied
 */
#ifndef SPACE_EGRESSD_H
#define SPACE_EGRESSD_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "bus.h"
#include "envelope.h"
#include "metrics.h"
#include "netpolicy.h"
#include "request.h"
#include "verifier.h"

typedef struct {
    char *worker_id; /* the worker whose sandboxes this egressd serves (space.ev.sbx.<id>.>) */
    char *nats_url;
    char *identity; /* busid.h */
    char *creds_dir;
    char *verify_signatures; /* verifier.h */
    char *keyring_dir;
    char *listen_host;
    int64_t proxy_port;
    int64_t dns_port;
    char *upstream_dns; /* "a.b.c.d[:port]"; "" = none (allowed names get SERVFAIL) */
    int64_t dns_ttl_max_s;
    int64_t dns_timeout_ms;
    int64_t attribution_grace_s;
    int64_t max_conns;
    int64_t head_max_bytes;
    int64_t first_bytes_timeout_ms;
    int64_t connect_timeout_ms;
    int64_t idle_timeout_s;
    int64_t audit_flush_ms;
    int64_t audit_keys_max;
    char *ca_cert; /* the deployment CA (tlsca.h); "" = no TLS termination (no_ca) */
    char *ca_key;
    char *upstream_ca_file; /* bundle upstream certificates must chain to; "" = system default */
    int64_t leaf_days;
    int64_t leaf_cache_max;
    int64_t up_bytes_per_s; /* a sandbox's default limit each way; 0 = unlimited */
    int64_t down_bytes_per_s;
    char *net_prefix;        /* the worker's sandbox address pool: <net_prefix>.0.0/16 */
    bool credentials;        /* ask space-credstore before forwarding a request (fail closed) */
    int64_t cred_timeout_ms; /* a lookup's bus round trip, at most */
    int64_t cred_cache_ms;   /* how long a lookup's answer is used (revocation: at most this) */
    char *log_level;
    char *log_format;
    char *metrics_addr; /* metrics.h */
    char *metrics_port_file;
} eg_config_t;

typedef struct {
    char name[254];
    uint32_t addr_be;
    int64_t resolved_ms, expires_ms;
} eg_attr_t;

/* Directions of a sandbox's traffic. */
enum { EG_UP = 0, EG_DOWN = 1 }; /* guest -> internet, internet -> guest */

/* A token bucket (egressd_rate.c): bytes that may pass now; negative while in debt. */
typedef struct {
    double tokens;
    uint64_t at_ns; /* last refill (uv_hrtime); 0: never used, starts full */
} eg_bucket_t;

typedef struct {
    char id[65];
    char tenant[65];
    char project[65]; /* from its create request: credentials of that project apply */
    uint32_t addr_be; /* 0 until SandboxStarted says where it lives */
    sp_netmode_t mode;
    char **allow_text, **deny_text; /* the entries as written (for rule names in audits) */
    sp_netentry_t *allow, *deny;
    size_t n_allow, n_deny;
    eg_attr_t *attrs;
    size_t n_attrs, cap_attrs;
    int conns;
    int denied_held;       /* refused connections whose 403 is still on its way (egressd_proxy.c) */
    uint64_t rate[2];      /* the policy's bytes/s by direction; 0: the configured default */
    eg_bucket_t bucket[2]; /* shared by all its connections */
    /* Being checkpointed: new connections are reset at once until it runs again (an event
     * says so) or until then. */
    int64_t frozen_until_ms;
    /* A close from both ends at once left the guest's endpoint in TIME_WAIT (egressd_proxy.c,
     * input_ended): runsc cannot checkpoint the sandbox before then. */
    int64_t time_wait_until_ms;
    /* When one of its connections last closed or sent the guest a FIN (egressd_finlog.c: what
     * counts as crossed when FIN log messages were lost). */
    int64_t closed_ms;
    /* The scheduler placed it on this egressd's worker (SandboxPlaced) and it has not been
     * suspended, deleted or failed since: only then are the worker's facts about it taken
     * (eg_placement). */
    bool placed_here;
} eg_sbx_t;

typedef struct {
    bool allow;
    const char *reason;
    char rule[300];
} eg_verdict_t;

typedef struct eg_event eg_event_t;
struct eg_event {
    sp_envelope_t *env;
    char *subject; /* for the contract check on the loop (eg_placement's state is there) */
    uint64_t seq;
    eg_event_t *next;
};

/* A reset request from the bus (egressd_proxy.c), queued for the loop. */
typedef struct eg_reset eg_reset_t;
struct eg_reset {
    char sandbox[65];
    char *reply;
    eg_reset_t *next;
};

typedef struct eg_audit eg_audit_t;
typedef struct eg_cred eg_cred_t;
typedef struct eg_dns eg_dns_t;
typedef struct eg_tls eg_tls_t;

typedef struct {
    const eg_config_t *cfg;
    uv_loop_t *loop;
    sp_bus_t *bus;
    uint64_t live_from_seq; /* intents at or below were applied before this start: no answer */

    eg_sbx_t **sbx;
    size_t n_sbx, cap_sbx;

    pthread_mutex_t q_mu;
    eg_event_t *q_head, *q_tail;
    eg_reset_t *resets; /* under q_mu, like the events; the same async wakes the loop */
    uv_async_t q_async;
    sp_bus_sub_t *reset_sub;
    /* What egressd acts on is checked first (docs/trust.md): events (signature on the events
     * thread, contract on the loop) and reset requests. */
    sp_verifier_t *verifier;
    sp_request_guard_t *guard;

    eg_dns_t *dns;
    uv_tcp_t listener;
    struct conn *conns; /* live proxy connections (egressd_proxy.c), closed at stop */
    eg_audit_t *audit;
    eg_cred_t *cred;
    eg_tls_t *tls;
    struct eg_finlog *finlog; /* NULL: not read (egressd_finlog.c) */
    uv_timer_t tick;          /* shutdown check, DNS and attribution expiry */
    uint64_t conns_total, conns_denied;
    uint64_t scrubbed;    /* credential values masked in responses (egressd_cred.c) */
    sp_netentry_t pool;   /* the sandbox address pool (a CIDR), from net_prefix */
    uint32_t *host_addrs; /* this host's IPv4 addresses, network order (eg_addr_refusal) */
    size_t n_host_addrs;
    int64_t host_addrs_ms; /* when they were read: again at most once a second */
    /* egressd_metrics.c */
    sp_metric_t *m_requests, *m_dns, *m_bytes, *m_injections, *m_cred_refusals, *m_masked;
    sp_metric_t *m_closes;
} eg_t;

/* ---- metrics (egressd_metrics.c, docs/metrics.md) ---- */
int eg_metrics_init(eg_t *eg, sp_metrics_t *reg);
/* One decision as eg_audit records it: protocol "dns" counts as a DNS query. A reason not in
 * egressd's list counts as "other". */
void eg_metrics_decision(eg_t *eg, bool allowed, const char *protocol, const char *reason);
/* n bytes read in direction dir (EG_UP, EG_DOWN). */
void eg_metrics_bytes(eg_t *eg, int dir, size_t n);
/* A credential injected (used: by its id) or a request refused for one (the reason). */
void eg_metrics_credential(eg_t *eg, bool used, const char *cred, const char *reason);
/* A close the FIN log told apart: "clean", "crossed", or "log_overflow". */
void eg_metrics_close(eg_t *eg, const char *outcome);

int64_t eg_now_ms(void);

/* ---- policy (egressd_policy.c) ---- */
eg_sbx_t *eg_sbx_by_id(eg_t *eg, const char *id);
/* The placement hook of the trust check (trust.h) from the policies: 1 (and this egressd's
 * worker) for a sandbox of tenant placed here, 2 for one known here but placed nowhere now,
 * 0 otherwise. On the loop. */
int eg_placement(void *arg, const char *tenant, const char *sandbox,
                 char worker[SP_INSTANCE_MAX + 1]);
eg_sbx_t *eg_sbx_by_addr(eg_t *eg, uint32_t addr_be);
/* Applies one event from the bus (owned by the caller). */
void eg_apply_event(eg_t *eg, const sp_envelope_t *env, uint64_t seq);
void eg_sbx_free_all(eg_t *eg);
/* Decisions: by name (DNS, Host, SNI; port 0 = any) and by address (other TCP). */
void eg_decide_name(const eg_sbx_t *s, const char *name, uint16_t port, eg_verdict_t *v);
void eg_decide_addr(const eg_sbx_t *s, uint32_t addr_be, uint16_t port, eg_verdict_t *v);
/* Whether the policy has name entries in its deny list (allow_all must then look at names). */
bool eg_has_name_denies(const eg_sbx_t *s);
/* Whether egressd may open a connection to addr:port for sandbox s, whatever the policy's mode
 * and whoever chose the address (the guest, or DNS for a name): NULL, or why not. Never:
 * loopback, link-local (the metadata address), "this network", multicast and reserved
 * space ("dest_loopback", "dest_link_local", "dest_reserved"), the sandbox address pool and
 * every sandbox egressd knows ("dest_sandbox"), any address of this host ("dest_host").
 * Private ranges (RFC 1918, CGNAT 100.64/10) only when an allow CIDR entry of the policy
 * that lies inside that range covers addr:port ("dest_private" otherwise): a policy must
 * name an internal network to reach it, and 0.0.0.0/0 names none. */
const char *eg_addr_refusal(eg_t *eg, const eg_sbx_t *s, uint32_t addr_be, uint16_t port);
/* Frees what eg_addr_refusal keeps. */
void eg_addr_dispose(eg_t *eg);
void eg_attribute(const eg_t *eg, eg_sbx_t *s, const char *name, uint32_t addr_be, uint32_t ttl);
/* A live attribution of addr to name for this sandbox? */
bool eg_attributed(eg_sbx_t *s, const char *name, uint32_t addr_be);
/* The address egressd itself resolved most recently for name (0 if none is live). */
uint32_t eg_resolved_addr(eg_sbx_t *s, const char *name);
void eg_expire_attributions(eg_t *eg);

/* ---- suspend (egressd_proxy.c) ---- */
/* Listens on space.io.egress.<worker>.reset (a cnats thread queues; the loop answers). */
int eg_reset_start(eg_t *eg);
void eg_reset_stop(eg_t *eg);
/* On the loop: the queued requests carried out and answered. */
void eg_reset_drain(eg_t *eg);

/* ---- DNS (egressd_dns.c) ---- */
int eg_dns_start(eg_t *eg);
void eg_dns_tick(eg_t *eg);
/* Queries held for a source address no event had named yet: answered now that it is known,
 * dropped once their wait is over (after every batch of events, and every tick). */
void eg_dns_retry_held(eg_t *eg);
/* egressd's own A lookup of name for sandbox s (HTTP CONNECT names what to reach; the guest
 * resolved nothing): the answer is attributed to (s, name) as a guest query's would be, then
 * cb gets the address egressd will use (eg_resolved_addr), or 0 on failure or timeout. Never
 * called from within eg_dns_resolve. < 0: no upstream or no room (cb is not called). */
typedef void (*eg_resolve_cb)(eg_t *eg, void *arg, uint32_t addr_be);
int eg_dns_resolve(eg_t *eg, eg_sbx_t *s, const char *name, eg_resolve_cb cb, void *arg);
/* Forgets the lookups made for arg (its callback will not run). */
void eg_dns_cancel(eg_t *eg, void *arg);
void eg_dns_stop(eg_t *eg);

/* ---- proxy (egressd_proxy.c) ---- */
int eg_proxy_start(eg_t *eg);
void eg_proxy_stop(eg_t *eg);

/* ---- the FIN log (egressd_finlog.c, finlog.h) ---- */
/* Binds the worker's FIN log group; when it cannot, logs why and returns 0 (timing decides). */
int eg_finlog_start(eg_t *eg);
void eg_finlog_stop(eg_t *eg);
bool eg_finlog_running(const eg_t *eg);
/* Reads what the kernel queued: before anything that depends on the guests' closes. */
void eg_finlog_drain(eg_t *eg);
/* A new connection from the guest's addr:port (network order). */
void eg_finlog_accepted(eg_t *eg, uint32_t addr_be, uint16_t port_be);
/* A close of s crossed (seen_by: what showed it): its suspends are refused for the guest's
 * TIME_WAIT from now on; logged once however many ways it was seen. */
void eg_sbx_time_wait(eg_sbx_t *s, int64_t now_ms, const char *seen_by);
/* Forgets closes seen only halfway more than a minute ago (at most once a second). */
void eg_finlog_tick(eg_t *eg);

/* ---- TLS (egressd_tls.c) ---- */
#include <openssl/ssl.h>
/* Loads the deployment CA (when ca_cert is set) and the upstream bundle. < 0: the CA is
 * configured but does not load (egressd does not start). */
int eg_tls_start(eg_t *eg);
void eg_tls_stop(eg_t *eg);
bool eg_tls_can_terminate(const eg_t *eg);
/* A server-side SSL (accept state) presenting the cached leaf for name (minted on a miss).
 * NULL with *why a static audit reason: no_ca, leaf_mint_failed, tls_setup_failed. */
SSL *eg_tls_server_new(eg_t *eg, const char *name, const char **why);
/* A client-side SSL (connect state) that sends SNI name, offers http/1.1 and verifies the peer
 * against the upstream bundle and name. NULL with *why: upstream_ca_unavailable,
 * tls_setup_failed. */
SSL *eg_tls_upstream_new(eg_t *eg, const char *name, const char **why);

/* ---- bandwidth (egressd_rate.c) ---- */
/* The limit of s in direction dir (EG_UP, EG_DOWN), bytes per second; 0 = none. */
uint64_t eg_rate_of(const eg_t *eg, const eg_sbx_t *s, int dir);
/* Takes n bytes from the bucket at now_ns (refilled first at rate, which 0 makes unlimited);
 * returns how long, in ns, whoever takes from it must wait (0: not at all). The bucket goes
 * into debt rather than refusing, so a read is never split: the wait pays the debt. */
uint64_t eg_bucket_take(eg_bucket_t *b, uint64_t rate, uint64_t now_ns, size_t n);

/* ---- credentials (egressd_cred.c) ---- */
#include "buf.h"
#include "egress_parse.h"

/* A connection's scrubber: every credential a request on it carried is masked in the bytes
 * that go back to the guest (same length, '*'), from that request until the connection
 * closes. Owned by the connection (egressd_proxy.c), on the loop; eg_scrub_free wipes the
 * values. Forms of a value shorter than EG_SCRUB_MIN bytes are not masked: they would match
 * by chance in ordinary responses (docs/credentials.md). */
#define EG_SCRUB_MIN  8
#define EG_SCRUB_MASK '*'
typedef struct eg_scrub eg_scrub_t;
/* Upstream bytes in; out gets what can go to the guest now (bytes that may begin a value are
 * held back: eg_scrub_held). Each credential masked on a connection is audited once: a
 * CredentialUsed with reason "scrubbed" (and eg->scrubbed counts it). */
void eg_scrub_feed(eg_scrub_t *sc, const uint8_t *data, size_t len, sp_buf_t *out);
/* The upstream stalled: what is held goes out (a value completing later still has its rest
 * masked). */
void eg_scrub_release(eg_scrub_t *sc, sp_buf_t *out);
/* The upstream ended: what is held goes out. */
void eg_scrub_flush(eg_scrub_t *sc, sp_buf_t *out);
size_t eg_scrub_held(const eg_scrub_t *sc);
void eg_scrub_free(eg_scrub_t *sc);

int eg_cred_start(eg_t *eg);
void eg_cred_stop(eg_t *eg);
/* The head (head, hh) of an allowed request of sandbox s to host, as it must be forwarded:
 * the credentials credstore grants injected and placeholders replaced (sp_http_head_rewrite),
 * and, when it carries any, Accept-Encoding: identity. Every credential it carries is added
 * to *scrub (the connection's, created here on first need). 0: *ret_out (heap, the caller
 * wipes and frees it) holds *ret_len bytes. < 0: refused, with *ret_status (403, 429, 503) and
 * *ret_reason (static): credential_scope, credential_expired, rate_limited,
 * credstore_unavailable, credential_not_placed (credstore's projection does not place s on this
 * host: asked again for 375 ms first), scrub_limit (the connection's scrubber is full); the
 * refusal is a CredentialDenied. A cache miss asks credstore on the bus and waits (at most
 * cred_timeout_ms): the loop blocks meanwhile. */
int eg_cred_rewrite(eg_t *eg, const eg_sbx_t *s, const char *host, const uint8_t *head,
                    const sp_http_head_t *hh, eg_scrub_t **scrub, uint8_t **ret_out,
                    size_t *ret_len, int *ret_status, const char **ret_reason);
/* Publishes the uses and refusals recorded since the last flush (with the audit's timer). */
void eg_cred_flush(eg_t *eg);

/* ---- audit (egressd_audit.c) ---- */
int eg_audit_start(eg_t *eg);
/* Records one decision; flushed as events every audit_flush_ms. addr_be 0: none. */
void eg_audit(eg_t *eg, const eg_sbx_t *s, bool allowed, const char *protocol, const char *name,
              uint32_t addr_be, uint16_t port, const char *rule, const char *reason);
void eg_audit_flush(eg_t *eg);
void eg_audit_stop(eg_t *eg);

#endif
