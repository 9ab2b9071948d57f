/* `space events [--follow] [ID]`: the event log as it streams from the gateway (the SSE of
 * GET /v1/events, or /v1/sandboxes/{id}/events), one line per event: sequence, time, type,
 * sandbox, and the log's verdict when it refused the event. From the first event; without
 * --follow it stops once the history is out (a second without a new event), with --follow it
 * goes on (keepalives keep the connection up) until interrupted. --json: each event as the API
 * sent it (JSON lines), for jq. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "httpc.h"
#include "json.h"
#include "space_stack.h"
#include "sse.h"
#include "xmalloc.h"

#define IDLE_MS 1000 /* without --follow: the history is out once the stream is this quiet */

typedef struct {
    unsigned long long n;
    bool json; /* each event's JSON (the SSE data) on a line of its own */
} events_t;

static int on_event(void *arg, const sp_sse_event_t *ev)
{
    events_t *e = arg;
    if (e->json) {
        printf("%.*s\n", (int)ev->data_len, ev->data);
        fflush(stdout);
        e->n++;
        return 0;
    }
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    sp_json_limits_t lim = {.max_bytes = ev->data_len + 1, .max_string = ev->data_len + 1};
    if (sp_json_parse(ev->data, ev->data_len, &lim, &doc, err) < 0) {
        printf("%s ? (unreadable: %s)\n", ev->id, err);
        return 0;
    }
    const sp_json_t *root = sp_json_root(doc), *env = sp_json_get(root, "event");
    const char *status = sp_json_str(sp_json_get(root, "status"), NULL);
    const char *reason = sp_json_str(sp_json_get(root, "reason"), NULL);
    const char *type = sp_json_str(sp_json_get(env, "type"), NULL);
    const char *agg = sp_json_str(sp_json_get(sp_json_get(env, "aggregate"), "id"), NULL);
    int64_t us = 0;
    char when[32] = "-";
    if (sp_json_int(sp_json_get(env, "occurred_at_us"), 0, INT64_MAX, &us) == 0) {
        time_t t = (time_t)(us / 1000000);
        struct tm tm;
        gmtime_r(&t, &tm);
        size_t n = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(when + n, sizeof(when) - n, ".%03dZ", (int)(us / 1000 % 1000));
    }
    printf("%-8s %-24s %-26s %s%s%s\n", ev->id, when, type ? type : ev->event, agg ? agg : "-",
           status && strcmp(status, "accepted") != 0 ? "  REJECTED: " : "",
           status && strcmp(status, "accepted") != 0 ? (reason ? reason : status) : "");
    fflush(stdout);
    e->n++;
    sp_json_doc_free(doc);
    return 0;
}

int sp__client_events(const sp_api_t *api, int argc, char **argv)
{
    bool follow = false, json = false;
    const char *id = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--follow") == 0 || strcmp(argv[i], "-f") == 0)
            follow = true;
        else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (!id && argv[i][0] != '-')
            id = argv[i];
        else {
            sp_client_usage("events", stderr);
            return SP_STACK_EXIT_USAGE;
        }
    }
    char *path =
        id ? sp_xasprintf("/v1/sandboxes/%s/events?from=0", id) : sp_xstrdup("/v1/events?from=0");
    events_t e = {.json = json};
    sp_httpc_resp_t r;
    int rc = sp__api_sse(api, "GET", path, NULL, 0, follow ? 0 : IDLE_MS, on_event, &e, &r);
    free(path);
    int code = SP_STACK_EXIT_OK;
    if (r.headers && (r.status < 200 || r.status > 299)) {
        code = sp__api_error("space events", &r);
    } else if (rc < 0 && !(rc == SP_ETIMEOUT && !follow && r.headers)) {
        fprintf(stderr, "space events: %s\n", sp_strerror(rc));
        code = SP_STACK_EXIT_FAIL;
    }
    sp_httpc_resp_free(&r);
    return code;
}
