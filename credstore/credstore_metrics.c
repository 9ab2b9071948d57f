/* space-credstore's metrics (docs/metrics.md): lookups by outcome, refused requests, and the
 * number of live credentials. Never a credential's name, id or value: outcomes only. */
#include "credstore.h"

static const char *const outcomes[CS_LOOKUP_OUTCOMES] = {
    [CS_LOOKUP_GRANTED] = "granted",         [CS_LOOKUP_NONE] = "none",
    [CS_LOOKUP_FORBIDDEN] = "forbidden",     [CS_LOOKUP_INVALID] = "invalid",
    [CS_LOOKUP_MALFORMED] = "malformed",     [CS_LOOKUP_NOT_PLACED] = "not_placed",
    [CS_LOOKUP_UNAVAILABLE] = "unavailable",
};

/* At scrape: the table's size, under mu (held briefly by lookups and admin requests too). */
static void collect(sp_metrics_t *reg, void *arg)
{
    cs_t *cs = arg;
    (void)reg;
    pthread_mutex_lock(&cs->mu);
    size_t n = cs->n_creds;
    pthread_mutex_unlock(&cs->mu);
    sp_series_set(sp_metric_only(cs->m_credentials), (double)n);
}

int cs_metrics_init(cs_t *cs, sp_metrics_t *reg)
{
    cs->m_lookups = sp_metrics_add(
        reg, SP_METRIC_COUNTER, "space_credstore_lookups_total",
        "Credential lookups from space-egressd, by outcome: granted (one credential or more), "
        "none (no credential covers the host), forbidden (the caller may not ask), invalid (bad "
        "tenant, sandbox or host), malformed (undecodable, or no reply subject), not_placed (the "
        "sandbox is not placed on the asking egressd's host), unavailable (its placement could "
        "not be read).",
        "outcome", NULL, 0, CS_LOOKUP_OUTCOMES);
    cs->m_refused = sp_metrics_add(reg, SP_METRIC_COUNTER, "space_credstore_requests_refused_total",
                                   "Requests of any kind (admin, lookup, data key) refused by "
                                   "the signed-request check (request.h).",
                                   NULL, NULL, 0, 1);
    cs->m_credentials = sp_metrics_add(
        reg, SP_METRIC_GAUGE, "space_credstore_credentials",
        "Live credentials held (sealed) in the table, read at scrape.", NULL, NULL, 0, 1);
    if (!cs->m_lookups || !cs->m_refused || !cs->m_credentials)
        return -1;
    for (size_t i = 0; i < CS_LOOKUP_OUTCOMES; i++)
        (void)sp_metric_series1(cs->m_lookups, outcomes[i]);
    sp_metrics_on_collect(reg, collect, cs);
    return 0;
}

void cs_metrics_lookup(cs_t *cs, cs_lookup_outcome_t o)
{
    if ((unsigned)o < CS_LOOKUP_OUTCOMES)
        sp_series_inc(sp_metric_series1(cs->m_lookups, outcomes[o]));
}
