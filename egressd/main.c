/* space-egressd: one per host, next to its worker. Per-sandbox DNS allowlist and transparent
 * TCP proxy behind the worker's nftables rules (docs/egress.md). Policies come from the
 * worker's event subject; decisions go to the log as EgressAllowed / EgressDenied. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "busid.h"
#include "config.h"
#include "daemon.h"
#include "egressd.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "tlsca.h"
#include "xmalloc.h"

static const sp_cfg_opt_t options[] = {
    SP_CFG_STR_OPT("id", eg_config_t, worker_id, "worker-1",
                   "the worker whose sandboxes this egressd serves (its --id)"),
    SP_BUSID_CFG_OPTS(eg_config_t, identity, creds_dir),
    SP_VERIFIER_CFG_OPTS(eg_config_t, verify_signatures, keyring_dir),
    SP_CFG_STR_OPT("nats-url", eg_config_t, nats_url, "nats://127.0.0.1:4222", "NATS URL(s)"),
    SP_CFG_STR_OPT("listen-host", eg_config_t, listen_host, "0.0.0.0",
                   "address of the proxy and DNS sockets (the worker's redirect lands on the "
                   "sandbox gateway addresses)"),
    SP_CFG_INT_OPT("egress-proxy-port", eg_config_t, proxy_port, 1, 65535, "15001",
                   "transparent TCP port (the worker's --egress-proxy-port)"),
    SP_CFG_INT_OPT("egress-dns-port", eg_config_t, dns_port, 1, 65535, "15053",
                   "DNS port (the worker's --egress-dns-port)"),
    SP_CFG_STR_OPT("upstream-dns", eg_config_t, upstream_dns, "",
                   "resolver egressd asks for allowed names, a.b.c.d[:port] (empty: none, "
                   "allowed names answer SERVFAIL)"),
    SP_CFG_INT_OPT("dns-ttl-max-s", eg_config_t, dns_ttl_max_s, 1, 86400, "300",
                   "TTL cap of answers given to sandboxes"),
    SP_CFG_INT_OPT("dns-timeout-ms", eg_config_t, dns_timeout_ms, 100, 30000, "3000",
                   "upstream resolver timeout"),
    SP_CFG_INT_OPT("attribution-grace-s", eg_config_t, attribution_grace_s, 0, 3600, "60",
                   "how long past its TTL an address stays attributed to a name"),
    SP_CFG_INT_OPT("max-conns", eg_config_t, max_conns, 1, 1000000, "256",
                   "concurrent proxied connections per sandbox"),
    SP_CFG_INT_OPT("head-max-bytes", eg_config_t, head_max_bytes, 1024, 65536, "16384",
                   "bytes read to find a ClientHello or an HTTP request head"),
    SP_CFG_INT_OPT("first-bytes-timeout-ms", eg_config_t, first_bytes_timeout_ms, 100, 600000,
                   "10000", "time a guest has to send its ClientHello or request head"),
    SP_CFG_INT_OPT("connect-timeout-ms", eg_config_t, connect_timeout_ms, 100, 600000, "10000",
                   "upstream connect timeout"),
    SP_CFG_INT_OPT("idle-timeout-s", eg_config_t, idle_timeout_s, 1, 86400, "300",
                   "a proxied connection idle this long is closed"),
    SP_CFG_INT_OPT("audit-flush-ms", eg_config_t, audit_flush_ms, 100, 60000, "1000",
                   "audit events are aggregated over this interval"),
    SP_CFG_INT_OPT("audit-keys-max", eg_config_t, audit_keys_max, 16, 1000000, "1024",
                   "distinct audit records per interval (the rest is counted in the log)"),
    SP_CFG_STR_OPT("ca-cert", eg_config_t, ca_cert, NULL,
                   "the deployment CA certificate TLS is terminated with (default: "
                   "$SPACE_HOME/ca/ca.crt; without either, TLS connections are refused)"),
    SP_CFG_STR_OPT("ca-key", eg_config_t, ca_key, NULL,
                   "its private key (default: ca.key next to ca-cert)"),
    SP_CFG_STR_OPT("upstream-ca-file", eg_config_t, upstream_ca_file, "",
                   "PEM bundle upstream certificates must chain to (empty: OpenSSL's default "
                   "paths, the system store); re-read when it changes"),
    SP_CFG_INT_OPT("leaf-days", eg_config_t, leaf_days, 1, 397, "7",
                   "validity of the leaf certificates minted per name"),
    SP_CFG_INT_OPT("leaf-cache-max", eg_config_t, leaf_cache_max, 16, 1000000, "4096",
                   "leaf certificates (and keys) kept in memory"),
    SP_CFG_INT_OPT("up-bytes-per-s", eg_config_t, up_bytes_per_s, 0, SP_NETPOLICY_RATE_MAX, "0",
                   "default bandwidth of a sandbox towards the internet, bytes per second over "
                   "all its connections (0: unlimited; 1024 at least; a policy's "
                   "up_bytes_per_s replaces it)"),
    SP_CFG_INT_OPT("down-bytes-per-s", eg_config_t, down_bytes_per_s, 0, SP_NETPOLICY_RATE_MAX, "0",
                   "default bandwidth of a sandbox from the internet, bytes per second (0: "
                   "unlimited; 1024 at least; a policy's down_bytes_per_s replaces it)"),
    SP_CFG_STR_OPT("net-prefix", eg_config_t, net_prefix, "10.200",
                   "first two octets of the worker's sandbox address pool (its --net-prefix): "
                   "never a destination"),
    SP_CFG_BOOL_OPT("credentials", eg_config_t, credentials, "true",
                    "ask space-credstore for the credentials of every allowed request "
                    "(docs/credentials.md); false: none are injected and a placeholder is "
                    "refused"),
    SP_CFG_INT_OPT("cred-timeout-ms", eg_config_t, cred_timeout_ms, 10, 10000, "250",
                   "how long a credential lookup may take before the request is refused"),
    SP_CFG_INT_OPT("cred-cache-ms", eg_config_t, cred_cache_ms, 0, 1000, "1000",
                   "how long a lookup's answer is used: a revocation takes effect within it"),
    SP_CFG_STR_OPT("log-level", eg_config_t, log_level, "info", "debug|info|warn|error"),
    SP_CFG_STR_OPT("log-format", eg_config_t, log_format, "kv", "kv|json"),
    SP_METRICS_CFG_OPTS(eg_config_t, metrics_addr, metrics_port_file),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* The process's identity on the bus: lives as long as the process publishes. */
static sp_busid_t busid;

/* ---- events: bus thread -> loop ---- */

typedef struct {
    eg_t *eg;
    pthread_t thread;
    bool started;
} events_t;

/* Logs a trust refusal (rc < 0) or what log mode lets through (rc > 0); true when refused. */
static bool refused(const sp_envelope_t *env, uint64_t seq, int rc, const char *reason)
{
    sp_log(rc < 0 ? SP_LOG_WARN : SP_LOG_INFO,
           rc < 0 ? "refused: not acted on" : "would be refused (verify-signatures=log)",
           SP_KU("seq", seq), SP_KS("type", env->type), SP_KS("sandbox", env->aggregate->id),
           SP_KS("signer", env->signer), SP_KS("reason", reason));
    return rc < 0;
}

static void *events_main(void *arg)
{
    events_t *et = arg;
    eg_t *eg = et->eg;
    char filter[128], durable[128];
    /* Its durable of the contract (contract.c): egressd may delete it and create it again with
     * its own filter only (the filtered create, bus.c), so it starts from the stream's first
     * message every time: the policies live in memory only. */
    snprintf(durable, sizeof(durable), "egressd-%s", eg->cfg->worker_id);
    if (sp_subject_build(filter, sizeof(filter), SP_SUBJ_EV_SBX, eg->cfg->worker_id, NULL, NULL) <
        0) {
        sp_log(SP_LOG_ERROR, "bad worker id", SP_KS("worker", eg->cfg->worker_id));
        return NULL;
    }
    sp_bus_consumer_t *c = NULL;
    while (!sp_daemon_stopping && !c) {
        if (sp_bus_consumer_open(eg->bus, durable, filter, 0, 30000, &c) < 0) {
            c = NULL;
            sp_daemon_sleep_ms(500);
        }
    }
    while (!sp_daemon_stopping) {
        sp_bus_batch_t *b = NULL;
        if (sp_bus_fetch(c, 256, 500, &b) < 0) {
            sp_bus_batch_free(b);
            sp_daemon_sleep_ms(200);
            continue;
        }
        for (size_t i = 0; i < sp_bus_batch_len(b); i++) {
            const sp_bus_msg_t *m = sp_bus_batch_msg(b, i);
            sp_envelope_t *env = NULL;
            char reason[SP_REASON_MAX];
            if (sp_envelope_decode(m->data, m->len, &env, reason) < 0 ||
                sp_envelope_check_subject(env, m->subject, reason) < 0) {
                sp_log(SP_LOG_WARN, "ignoring invalid event", SP_KU("seq", m->stream_seq),
                       SP_KS("reason", reason));
                sp_envelope_free(env);
                continue;
            }
            /* The signature here (the costly half, off the loop); the contract on the loop. */
            int vr =
                sp_verifier_verify(eg->verifier, env, m->data, m->len, m->published_ns, reason);
            /* Replays: egressd reads its subjects from the stream's start at every start, so
             * an original always comes before its copies and no log lookup is needed. */
            if (vr >= 0) {
                int once = sp_verifier_once(eg->verifier, env, m->stream_seq, NULL, NULL,
                                            vr ? NULL : reason);
                vr = once < 0 ? once : (vr | once);
            }
            if (vr != 0 && refused(env, m->stream_seq, vr, reason)) {
                sp_envelope_free(env);
                continue;
            }
            eg_event_t *e = sp_xcalloc(1, sizeof(*e));
            e->env = env;
            e->subject = sp_xstrdup(m->subject);
            e->seq = m->stream_seq;
            pthread_mutex_lock(&eg->q_mu);
            if (eg->q_tail)
                eg->q_tail->next = e;
            else
                eg->q_head = e;
            eg->q_tail = e;
            pthread_mutex_unlock(&eg->q_mu);
        }
        if (sp_bus_batch_len(b)) {
            sp_bus_batch_ack(b);
            uv_async_send(&eg->q_async);
        }
        sp_bus_batch_free(b);
    }
    sp_bus_consumer_free(c);
    return NULL;
}

static void on_events(uv_async_t *a)
{
    eg_t *eg = a->data;
    pthread_mutex_lock(&eg->q_mu);
    eg_event_t *e = eg->q_head;
    eg->q_head = eg->q_tail = NULL;
    pthread_mutex_unlock(&eg->q_mu);
    while (e) {
        eg_event_t *next = e->next;
        char reason[SP_REASON_MAX];
        int rc = sp_verifier_authorize(eg->verifier, e->env, e->subject, eg_placement, eg, reason);
        if (rc == 0 || !refused(e->env, e->seq, rc, reason))
            eg_apply_event(eg, e->env, e->seq);
        sp_envelope_free(e->env);
        free(e->subject);
        free(e);
        e = next;
    }
    eg_reset_drain(eg); /* after the events: a sandbox's address is known by then */
    eg_dns_retry_held(eg);
}

static void on_tick(uv_timer_t *t)
{
    eg_t *eg = t->data;
    if (sp_daemon_stopping) {
        uv_stop(eg->loop);
        return;
    }
    eg_dns_tick(eg);
    eg_expire_attributions(eg);
    eg_finlog_tick(eg);
}

/* ca-cert defaults to the CA `space up` made in $SPACE_HOME/ca (when it exists), ca-key to
 * ca.key next to ca-cert. */
static void ca_defaults(eg_config_t *cfg)
{
    const char *home = getenv("SPACE_HOME");
    if (!cfg->ca_cert[0] && home && home[0]) {
        char *p = sp_xasprintf("%s/ca/" SP_CA_CERT_FILE, home);
        if (access(p, F_OK) == 0) {
            free(cfg->ca_cert);
            cfg->ca_cert = p;
        } else {
            free(p);
        }
    }
    if (cfg->ca_cert[0] && !cfg->ca_key[0]) {
        const char *slash = strrchr(cfg->ca_cert, '/');
        int dir = slash ? (int)(slash - cfg->ca_cert) : 1;
        free(cfg->ca_key);
        cfg->ca_key = sp_xasprintf("%.*s/" SP_CA_KEY_FILE, dir, slash ? cfg->ca_cert : ".");
    }
}

static void close_any(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

int main(int argc, char **argv)
{
    sp_daemon_no_core(); /* before any secret is read */
    eg_config_t cfg = {0};
    eg_t eg = {.cfg = &cfg};
    events_t et = {.eg = &eg};
    char *err = NULL;
    int argi = 0, code = 1, rc;
    sp_log_level_t level;
    sp_log_format_t format;
    uv_loop_t loop;
    sp_metrics_t *reg = sp_metrics_new();
    sp_metrics_server_t *msrv = NULL;

    pthread_mutex_init(&eg.q_mu, NULL);
    if (sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err) < 0) {
        fprintf(stderr, "space-egressd: %s\n", err ? err : "bad options");
        goto out;
    }
    if (argi < 0) {
        code = 0;
        goto out;
    }
    if (!sp_netpolicy_rate_valid((uint64_t)cfg.up_bytes_per_s) ||
        !sp_netpolicy_rate_valid((uint64_t)cfg.down_bytes_per_s)) {
        fprintf(stderr,
                "space-egressd: --up-bytes-per-s and --down-bytes-per-s are 0 or %d..%lld\n",
                SP_NETPOLICY_RATE_MIN, (long long)SP_NETPOLICY_RATE_MAX);
        goto out;
    }
    /* The worker's pool is <a.b>.0.0/16; read as a policy's CIDR entry is. */
    char pool[32];
    if (snprintf(pool, sizeof(pool), "%s.0.0/16", cfg.net_prefix) >= (int)sizeof(pool) ||
        sp_netentry_parse(pool, &eg.pool) < 0 || eg.pool.kind != SP_NETE_CIDR ||
        eg.pool.mask != 0xffff0000) {
        fprintf(stderr, "space-egressd: --net-prefix is two octets, a.b\n");
        goto out;
    }
    if (argi < argc || sp_log_level_parse(cfg.log_level, &level) < 0 ||
        sp_log_format_parse(cfg.log_format, &format) < 0 || !sp_id_valid(cfg.worker_id)) {
        fprintf(stderr, "space-egressd: bad arguments (see --help)\n");
        goto out;
    }
    sp_log_init("space-egressd", level, format);
    ca_defaults(&cfg);
    sp_daemon_signals();
    signal(SIGPIPE, SIG_IGN);

    char merr[SP_METRICS_ERR_MAX] = "bad metric families";
    if (eg_metrics_init(&eg, reg) < 0 || sp_metrics_serve(reg, "space-egressd", cfg.metrics_addr,
                                                          cfg.metrics_port_file, &msrv, merr) < 0) {
        sp_log(SP_LOG_ERROR, "cannot serve metrics", SP_KS("error", merr));
        goto out;
    }

    sp_bus_opts_t bo = {.url = cfg.nats_url, .name = "space-egressd", .timeout_ms = 30000};
    uint64_t msgs = 0;
    char def_id[SP_IDENTITY_MAX + 1], iderr[SP_BUSID_ERR_MAX];
    snprintf(def_id, sizeof(def_id), "egressd-%s", cfg.worker_id);
    if (sp_busid_setup(cfg.creds_dir, cfg.identity, def_id, &busid, &bo, iderr) < 0) {
        sp_log(SP_LOG_ERROR, "bad identity", SP_KS("error", iderr));
        goto out;
    }
    char verr[SP_VERIFIER_ERR_MAX];
    if (sp_verifier_new(cfg.verify_signatures, cfg.keyring_dir, cfg.creds_dir, 0, &eg.verifier,
                        verr) < 0) {
        sp_log(SP_LOG_ERROR, "cannot check signatures", SP_KS("error", verr));
        goto out;
    }
    sp_log(sp_verifier_mode(eg.verifier) == SP_VERIFY_ON ? SP_LOG_INFO : SP_LOG_WARN,
           sp_verifier_summary(eg.verifier), SP_KS("keyring_dir", sp_verifier_dir(eg.verifier)));
    sp_request_guard_new(eg.verifier, &eg.guard);
    if ((rc = sp_bus_connect(&bo, &eg.bus)) < 0 || (rc = sp_bus_ensure_stream(eg.bus)) < 0 ||
        (rc = sp_bus_stream_info(eg.bus, &eg.live_from_seq, &msgs)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot reach NATS", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    uv_loop_init(&loop);
    eg.loop = &loop;
    uv_async_init(&loop, &eg.q_async, on_events);
    eg.q_async.data = &eg;
    uv_timer_init(&loop, &eg.tick);
    eg.tick.data = &eg;
    uv_timer_start(&eg.tick, on_tick, 100, 100);
    if (eg_tls_start(&eg) < 0) {
        /* logged; a configured CA that does not load is an operator's error, not no_ca */
    } else if ((rc = eg_audit_start(&eg)) < 0 || (rc = eg_cred_start(&eg)) < 0 ||
               (rc = eg_dns_start(&eg)) < 0 || (rc = eg_proxy_start(&eg)) < 0 ||
               (rc = eg_finlog_start(&eg)) < 0 || (rc = eg_reset_start(&eg)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot listen",
               SP_KS("error", rc < -1000 ? uv_strerror(rc) : sp_strerror(rc)));
    } else if (pthread_create(&et.thread, NULL, events_main, &et) == 0) {
        et.started = true;
        sp_log(SP_LOG_INFO, "serving", SP_KS("worker", cfg.worker_id),
               SP_KI("proxy_port", cfg.proxy_port), SP_KI("dns_port", cfg.dns_port),
               SP_KS("upstream_dns", cfg.upstream_dns[0] ? cfg.upstream_dns : "none"),
               SP_KS("ca", cfg.ca_cert[0] ? cfg.ca_cert : "none"),
               SP_KS("upstream_ca", cfg.upstream_ca_file[0] ? cfg.upstream_ca_file : "default"),
               SP_KU("live_from_seq", eg.live_from_seq));
        uv_run(&loop, UV_RUN_DEFAULT);
        code = 0;
        sp_log(SP_LOG_INFO, "stopping", SP_KU("connections", eg.conns_total),
               SP_KU("denied", eg.conns_denied), SP_KU("credentials_masked", eg.scrubbed));
    }
    sp_daemon_stop();
    if (et.started)
        pthread_join(et.thread, NULL);
    eg_reset_stop(&eg);
    on_events(&eg.q_async); /* frees what the thread queued last */
    eg_cred_stop(&eg);
    eg_audit_stop(&eg);
    sp_bus_publish_async_complete(eg.bus, 2000);
    eg_proxy_stop(&eg); /* first: a connection waiting on a DNS answer cancels it */
    eg_dns_stop(&eg);
    eg_tls_stop(&eg);
    eg_finlog_stop(&eg);
    uv_walk(&loop, close_any, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    eg_sbx_free_all(&eg);
    eg_addr_dispose(&eg);
out:
    sp_metrics_server_free(msrv);
    sp_metrics_free(reg);
    sp_bus_free(eg.bus);
    sp_request_guard_free(eg.guard);
    sp_verifier_free(eg.verifier);
    sp_busid_dispose(&busid);
    pthread_mutex_destroy(&eg.q_mu);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return code;
}
