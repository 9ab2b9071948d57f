/* space-egressd's metrics (docs/metrics.md). Counted where the decision is recorded (eg_audit,
 * the credential use record, the byte accounting): on the loop. Label values come from the
 * fixed lists below: a reason egressd does not list here counts as "other", and nothing the
 * guest sent (names, addresses, paths) is ever a label. */
#include <string.h>

#include "egressd.h"
#include "ids.h"

/* Every reason an egress decision records (policy, parsers, TLS, upstream). */
static const char *const reasons[] = {
    "allow_all",
    "allowed_by_rule",
    "asterisk_not_options",
    "authority_form_not_connect",
    "bad_chunked_body",
    "bad_client_hello",
    "bad_connect_target",
    "bad_http_head",
    "bad_upgrade_request",
    "class_not_in",
    "connect_unsupported",
    "connection_limit",
    "credential_expired",
    "credential_not_placed",
    "credential_scope",
    "credstore_unavailable",
    "denied_by_rule",
    "deny_all",
    "dest_host",
    "dest_link_local",
    "dest_loopback",
    "dest_private",
    "dest_reserved",
    "dest_sandbox",
    "ech",
    "head_too_large",
    "host_changed",
    "host_connect_mismatch",
    "host_port_mismatch",
    "host_sni_mismatch",
    "leaf_mint_failed",
    "malformed_query",
    "multiple_sni",
    "no_ca",
    "no_rule",
    "no_sni",
    "not_allowed",
    "not_attributed",
    "not_tls",
    "rate_limited",
    "resolve_failed",
    "sni_connect_mismatch",
    "target_host_mismatch",
    "target_port_mismatch",
    "target_scheme_mismatch",
    "target_userinfo",
    "tls_handshake_failed",
    "tls_setup_failed",
    "upgrade_early_data",
    "upgrade_not_first",
    "upgrade_unsupported",
    "upstream_ca_unavailable",
    "upstream_cert_invalid",
    "upstream_tls_failed",
    "upstream_unreachable",
};
#define N_REASONS (sizeof(reasons) / sizeof(reasons[0]))

static const char *const protocols[] = {"http", "https", "tls", "tcp"};
#define N_PROTOCOLS (sizeof(protocols) / sizeof(protocols[0]))

static const char *const cred_refusals[] = {"credential_scope",      "credential_expired",
                                            "rate_limited",          "credstore_unavailable",
                                            "credential_not_placed", "scrub_limit"};
#define N_CRED_REFUSALS (sizeof(cred_refusals) / sizeof(cred_refusals[0]))

/* Credential ids as labels: registered credentials only (credstore's grants), at most this
 * many series (past it, uses are not counted by id). */
#define CRED_SERIES_MAX 1024

static const char *pick(const char *const *list, size_t n, const char *s)
{
    for (size_t i = 0; s && i < n; i++)
        if (strcmp(list[i], s) == 0)
            return list[i];
    return "other";
}

int eg_metrics_init(eg_t *eg, sp_metrics_t *reg)
{
    eg->m_requests = sp_metrics_add(
        reg, SP_METRIC_COUNTER, "space_egressd_requests_total",
        "Connections and HTTP requests from sandboxes decided, by protocol (http, https, tls, "
        "tcp), verdict (allowed, denied) and reason.",
        "protocol,verdict,reason", NULL, 0, (N_PROTOCOLS + 1) * 2 * (N_REASONS + 1));
    eg->m_dns = sp_metrics_add(reg, SP_METRIC_COUNTER, "space_egressd_dns_queries_total",
                               "DNS queries from sandboxes decided, by verdict and reason.",
                               "verdict,reason", NULL, 0, 2 * (N_REASONS + 1));
    eg->m_bytes = sp_metrics_add(reg, SP_METRIC_COUNTER, "space_egressd_bytes_total",
                                 "Bytes relayed, by direction: up (read from sandboxes), down "
                                 "(read from upstreams).",
                                 "direction", NULL, 0, 2);
    eg->m_injections = sp_metrics_add(
        reg, SP_METRIC_COUNTER, "space_egressd_credential_injections_total",
        "Requests a credential was injected into, by credential id (never its value).",
        "credential", NULL, 0, CRED_SERIES_MAX);
    eg->m_cred_refusals = sp_metrics_add(
        reg, SP_METRIC_COUNTER, "space_egressd_credential_refusals_total",
        "Requests refused for a credential, by reason.", "reason", NULL, 0, N_CRED_REFUSALS + 1);
    eg->m_masked = sp_metrics_add(
        reg, SP_METRIC_COUNTER, "space_egressd_credential_echoes_masked_total",
        "Connections on which a site echoed an injected credential and egressd masked it for "
        "the guest, by credential id (docs/credentials.md).",
        "credential", NULL, 0, CRED_SERIES_MAX);
    eg->m_closes = sp_metrics_add(
        reg, SP_METRIC_COUNTER, "space_egressd_guest_closes_total",
        "Sandbox TCP closes told apart by the FIN log (egressd_finlog.c), by outcome: clean, "
        "crossed (the guest's end stays in TIME_WAIT: a suspend is refused for a minute), "
        "log_overflow (log messages lost: recent closes counted as crossed).",
        "outcome", NULL, 0, 3);
    if (!eg->m_requests || !eg->m_dns || !eg->m_bytes || !eg->m_injections ||
        !eg->m_cred_refusals || !eg->m_masked || !eg->m_closes)
        return -1;
    (void)sp_metric_series1(eg->m_closes, "clean");
    (void)sp_metric_series1(eg->m_closes, "crossed");
    (void)sp_metric_series1(eg->m_closes, "log_overflow");
    (void)sp_metric_series1(eg->m_bytes, "up");
    (void)sp_metric_series1(eg->m_bytes, "down");
    for (size_t i = 0; i < N_CRED_REFUSALS; i++)
        (void)sp_metric_series1(eg->m_cred_refusals, cred_refusals[i]);
    return 0;
}

void eg_metrics_decision(eg_t *eg, bool allowed, const char *protocol, const char *reason)
{
    const char *verdict = allowed ? "allowed" : "denied";
    const char *r = pick(reasons, N_REASONS, reason);
    if (protocol && strcmp(protocol, "dns") == 0) {
        const char *v[2] = {verdict, r};
        sp_series_inc(sp_metric_series(eg->m_dns, v));
        return;
    }
    const char *v[3] = {pick(protocols, N_PROTOCOLS, protocol), verdict, r};
    sp_series_inc(sp_metric_series(eg->m_requests, v));
}

void eg_metrics_bytes(eg_t *eg, int dir, size_t n)
{
    sp_series_add(sp_metric_series1(eg->m_bytes, dir == EG_UP ? "up" : "down"), (double)n);
}

void eg_metrics_credential(eg_t *eg, bool used, const char *cred, const char *reason)
{
    if (!used) {
        sp_series_inc(
            sp_metric_series1(eg->m_cred_refusals, pick(cred_refusals, N_CRED_REFUSALS, reason)));
        return;
    }
    /* A masked echo is recorded as a use with reason "scrubbed" (egressd_cred.c): not one
     * more injection. */
    bool masked = reason && strcmp(reason, "scrubbed") == 0;
    if (cred && sp_id_valid(cred))
        sp_series_inc(sp_metric_series1(masked ? eg->m_masked : eg->m_injections, cred));
}

void eg_metrics_close(eg_t *eg, const char *outcome)
{
    sp_series_inc(sp_metric_series1(eg->m_closes, outcome));
}
