/* Counters for /metrics, in the Prometheus text exposition format (version 0.0.4). Loop
 * thread only: no atomics needed. */
#include "gateway.h"

#include <inttypes.h>

static const char *const route_names[GW_R_COUNT] = {
    [GW_R_HEALTHZ] = "healthz",
    [GW_R_METRICS] = "metrics",
    [GW_R_SANDBOX_CREATE] = "sandbox_create",
    [GW_R_SANDBOX_LIST] = "sandbox_list",
    [GW_R_SANDBOX_GET] = "sandbox_get",
    [GW_R_SANDBOX_DELETE] = "sandbox_delete",
    [GW_R_SANDBOX_EVENTS] = "sandbox_events",
    [GW_R_EVENTS] = "events",
    [GW_R_TEMPLATES] = "templates",
    [GW_R_OTHER] = "other",
};

/* Upper bounds in seconds of the create latency histogram: a create is a publish, a placement,
 * a start (hundreds of ms with gVisor) and a projection update. */
static const double create_bounds[GW_CREATE_BUCKETS] = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
};

void gw_metrics_request(gw_metrics_t *m, gw_route_t route, int status)
{
    if ((unsigned)route >= GW_R_COUNT)
        route = GW_R_OTHER;
    if (status < 100 || status > 599)
        status = 500;
    m->requests[route][status]++;
}

void gw_metrics_create_latency(gw_metrics_t *m, double seconds)
{
    size_t i = 0;
    while (i < GW_CREATE_BUCKETS && seconds > create_bounds[i])
        i++;
    m->create_buckets[i]++;
    m->create_sum += seconds;
    m->create_count++;
}

void gw_metrics_render(const gw_metrics_t *m, sp_buf_t *out)
{
    sp_buf_puts(out, "# HELP space_gateway_requests_total HTTP requests answered, by route and "
                     "status.\n# TYPE space_gateway_requests_total counter\n");
    for (int r = 0; r < GW_R_COUNT; r++)
        for (int s = 100; s < 600; s++)
            if (m->requests[r][s])
                sp_buf_printf(
                    out, "space_gateway_requests_total{route=\"%s\",status=\"%d\"} %" PRIu64 "\n",
                    route_names[r], s, m->requests[r][s]);
    sp_buf_printf(out,
                  "# HELP space_gateway_requests_in_flight Requests being processed (streams "
                  "excluded).\n# TYPE space_gateway_requests_in_flight gauge\n"
                  "space_gateway_requests_in_flight %" PRId64 "\n",
                  m->in_flight);
    sp_buf_printf(out,
                  "# HELP space_gateway_sse_streams Open server-sent event streams.\n"
                  "# TYPE space_gateway_sse_streams gauge\nspace_gateway_sse_streams %" PRId64 "\n",
                  m->streams);
    sp_buf_printf(out,
                  "# HELP space_gateway_sse_streams_closed_slow_total Streams closed because the "
                  "client fell behind.\n# TYPE space_gateway_sse_streams_closed_slow_total "
                  "counter\nspace_gateway_sse_streams_closed_slow_total %" PRIu64 "\n",
                  m->streams_closed_slow);
    sp_buf_printf(out,
                  "# HELP space_gateway_publish_failures_total Intent events the bus did not "
                  "accept.\n# TYPE space_gateway_publish_failures_total counter\n"
                  "space_gateway_publish_failures_total %" PRIu64 "\n",
                  m->publish_failures);
    sp_buf_puts(out, "# HELP space_gateway_create_seconds POST /v1/sandboxes answered 201, from "
                     "request to response.\n# TYPE space_gateway_create_seconds histogram\n");
    uint64_t cum = 0;
    for (size_t i = 0; i < GW_CREATE_BUCKETS; i++) {
        cum += m->create_buckets[i];
        sp_buf_printf(out, "space_gateway_create_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
                      create_bounds[i], cum);
    }
    cum += m->create_buckets[GW_CREATE_BUCKETS];
    sp_buf_printf(out, "space_gateway_create_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", cum);
    sp_buf_printf(out, "space_gateway_create_seconds_sum %.6f\n", m->create_sum);
    sp_buf_printf(out, "space_gateway_create_seconds_count %" PRIu64 "\n", m->create_count);
}
