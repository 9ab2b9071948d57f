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
    [GW_R_SANDBOX_COMMANDS] = "sandbox_commands",
    [GW_R_COMMAND_LIST] = "command_list",
    [GW_R_COMMAND_STREAM] = "command_stream",
    [GW_R_COMMAND_CTL] = "command_ctl",
    [GW_R_SANDBOX_FILES] = "sandbox_files",
    [GW_R_SANDBOX_NETWORK] = "sandbox_network",
    [GW_R_SANDBOX_LIFECYCLE] = "sandbox_lifecycle",
    [GW_R_SNAPSHOTS] = "snapshots",
    [GW_R_SANDBOX_METRICS] = "sandbox_metrics",
    [GW_R_CREDENTIALS] = "credentials",
    [GW_R_KEYS] = "keys",
    [GW_R_OPENAPI] = "openapi",
    [GW_R_CONSOLE] = "console",
    [GW_R_E2B_API] = "e2b_api",
    [GW_R_E2B_ENVD] = "e2b_envd",
    [GW_R_OTHER] = "other",
};

/* Upper bounds in seconds of the create latency histogram: a create is a publish, a placement,
 * a start (hundreds of ms with gVisor) and a projection update. */
static const double create_bounds[GW_CREATE_BUCKETS] = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
};

static const char *const outcome_names[GW_CMD_OUTCOMES] = {
    [GW_CMD_ACCEPTED] = "accepted",
    [GW_CMD_WORKER_UNAVAILABLE] = "worker_unavailable",
    [GW_CMD_SANDBOX_NOT_RUNNING] = "sandbox_not_running",
    [GW_CMD_AGENT_UNAVAILABLE] = "agent_unavailable",
    [GW_CMD_TOO_MANY] = "too_many_commands",
    [GW_CMD_WORKER_ERROR] = "worker_error",
    [GW_CMD_BUS_ERROR] = "bus_error",
    [GW_CMD_NOT_FOUND] = "not_found",
};

static const char *const end_names[GW_CMD_ENDS] = {
    [GW_CMD_END_EXIT] = "exit",
    [GW_CMD_END_TIMEOUT] = "timeout",
    [GW_CMD_END_CLIENT] = "client_gone",
    [GW_CMD_END_SHUTDOWN] = "shutdown",
};

/* Upper bounds in seconds of the exec round trip (ExecRequest to ExecReply): a NATS round trip
 * to the worker and its hand-off to the agent; 10 s is the gateway's timeout. */
static const double exec_bounds[GW_EXEC_BUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
};

void gw_metrics_exec_latency(gw_metrics_t *m, double seconds)
{
    size_t i = 0;
    while (i < GW_EXEC_BUCKETS && seconds > exec_bounds[i])
        i++;
    m->exec_buckets[i]++;
    m->exec_sum += seconds;
    m->exec_count++;
}

static void render_commands(const gw_metrics_t *m, sp_buf_t *out)
{
    sp_buf_puts(out, "# HELP space_gateway_commands_total Command requests that reached a worker "
                     "(or tried to), by outcome.\n# TYPE space_gateway_commands_total counter\n");
    for (int i = 0; i < GW_CMD_OUTCOMES; i++)
        sp_buf_printf(out, "space_gateway_commands_total{outcome=\"%s\"} %" PRIu64 "\n",
                      outcome_names[i], m->commands[i]);
    sp_buf_puts(out, "# HELP space_gateway_command_ends_total Accepted commands whose response "
                     "ended, by how.\n# TYPE space_gateway_command_ends_total counter\n");
    for (int i = 0; i < GW_CMD_ENDS; i++)
        sp_buf_printf(out, "space_gateway_command_ends_total{how=\"%s\"} %" PRIu64 "\n",
                      end_names[i], m->command_ends[i]);
    sp_buf_printf(out,
                  "# HELP space_gateway_commands_in_progress Command requests being handled.\n"
                  "# TYPE space_gateway_commands_in_progress gauge\n"
                  "space_gateway_commands_in_progress %" PRId64 "\n",
                  m->commands_running);
    sp_buf_printf(out,
                  "# HELP space_gateway_command_output_lost_total Commands whose output had a "
                  "gap (data-plane messages lost).\n# TYPE space_gateway_command_output_lost_total "
                  "counter\nspace_gateway_command_output_lost_total %" PRIu64 "\n",
                  m->commands_output_lost);
    sp_buf_printf(out,
                  "# HELP space_gateway_command_output_truncated_total Commands whose output was "
                  "cut (a cap, or a client slower than the command).\n# TYPE "
                  "space_gateway_command_output_truncated_total counter\n"
                  "space_gateway_command_output_truncated_total %" PRIu64 "\n",
                  m->commands_truncated);
    sp_buf_puts(out, "# HELP space_gateway_exec_seconds ExecRequest to ExecReply round trip.\n"
                     "# TYPE space_gateway_exec_seconds histogram\n");
    uint64_t cum = 0;
    for (size_t i = 0; i < GW_EXEC_BUCKETS; i++) {
        cum += m->exec_buckets[i];
        sp_buf_printf(out, "space_gateway_exec_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
                      exec_bounds[i], cum);
    }
    cum += m->exec_buckets[GW_EXEC_BUCKETS];
    sp_buf_printf(out, "space_gateway_exec_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", cum);
    sp_buf_printf(out, "space_gateway_exec_seconds_sum %.6f\n", m->exec_sum);
    sp_buf_printf(out, "space_gateway_exec_seconds_count %" PRIu64 "\n", m->exec_count);
}

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
    render_commands(m, out);
}

void gw_metrics_render_locs(gw_loc_cache_t *c, sp_buf_t *out)
{
    sp_buf_printf(out,
                  "# HELP space_gateway_locate_total Lookups of where a sandbox runs, by whether "
                  "the location cache answered.\n# TYPE space_gateway_locate_total counter\n"
                  "space_gateway_locate_total{result=\"hit\"} %" PRIu64 "\n"
                  "space_gateway_locate_total{result=\"miss\"} %" PRIu64 "\n",
                  atomic_load(&c->hits), atomic_load(&c->misses));
    sp_buf_printf(out,
                  "# HELP space_gateway_locate_drops_total Location cache entries dropped on a "
                  "sandbox's move (or all, on a lost LISTEN connection).\n"
                  "# TYPE space_gateway_locate_drops_total counter\n"
                  "space_gateway_locate_drops_total %" PRIu64 "\n",
                  atomic_load(&c->drops));
}
