/* `space demo`: a short tour of what runs today, through the same doors a user has. It creates
 * a real gVisor sandbox through the HTTP API, lists it, deletes it, then publishes one forged
 * event straight onto the bus (another tenant claiming the sandbox) and shows with
 * space-replay that the log tells the whole story and refused the forgery. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bus.h"
#include "busid.h"
#include "config.h"
#include "db.h"
#include "error.h"
#include "eventgen.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "publish.h"
#include "space_stack.h"
#include "xmalloc.h"

static int publish(sp_bus_t *bus, sp_eventgen_msg_t *m, const char *what, uint64_t *ret_seq)
{
    int rc = sp_bus_publish(bus, m->subject, m->data, m->len, m->event_id, ret_seq, NULL);
    if (rc < 0) {
        fprintf(stderr, "space demo: publish failed: %s\n", sp_strerror(rc));
        return rc;
    }
    printf("  published %-24s seq %-6llu %s\n", what, (unsigned long long)*ret_seq, m->subject);
    return 0;
}

static int run_replay(const char *bin, const char *const *args)
{
    char *prog = sp_xasprintf("%s/space-replay", bin);
    const char *argv[8] = {prog};
    size_t n = 1;
    for (; args[n - 1] && n < 7; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execv(prog, (char *const *)argv);
        fprintf(stderr, "space demo: cannot run %s: %s\n", prog, strerror(errno));
        _exit(127);
    }
    int st = 0;
    free(prog);
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* One API call, printed like a curl session; returns the status (or -1) and the body. */
static int api(const char *method, const char *path, const char *body, char **ret_body)
{
    char host[64];
    int port;
    const char *url = getenv("SPACE_API_URL"), *key = getenv("SPACE_API_KEY");
    if (!url || !key || sp_httpc_parse_url(url, host, sizeof(host), &port) < 0) {
        fprintf(stderr, "space demo: no SPACE_API_URL/SPACE_API_KEY: is space-gateway running?\n");
        return -1;
    }
    sp_httpc_req_t req = {.host = host,
                          .port = port,
                          .method = method,
                          .path = path,
                          .key = key,
                          .body = body,
                          .body_len = body ? strlen(body) : 0};
    sp_httpc_resp_t r;
    printf("\n$ curl -X %s '%s%s'%s%s%s\n", method, url, path, body ? " -d '" : "",
           body ? body : "", body ? "'" : "");
    fflush(stdout);
    int rc = sp_httpc_do(&req, &r);
    if (rc < 0) {
        fprintf(stderr, "space demo: %s %s: %s\n", method, path, sp_strerror(rc));
        return -1;
    }
    printf("%d %s\n", r.status, r.body);
    if (ret_body)
        *ret_body = sp_xstrdup(r.body);
    int status = r.status;
    sp_httpc_resp_free(&r);
    return status;
}

static int wait_template(const char *name)
{
    for (int i = 0; i < 100; i++) {
        char *body = NULL;
        char host[64];
        int port;
        const char *url = getenv("SPACE_API_URL");
        if (!url || sp_httpc_parse_url(url, host, sizeof(host), &port) < 0)
            return -1;
        sp_httpc_req_t req = {.host = host,
                              .port = port,
                              .method = "GET",
                              .path = "/v1/templates",
                              .key = getenv("SPACE_API_KEY")};
        sp_httpc_resp_t r;
        if (sp_httpc_do(&req, &r) == 0) {
            body = r.body;
            int found = r.status == 200 && strstr(body, name);
            sp_httpc_resp_free(&r);
            if (found)
                return 0;
        }
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
    return -1;
}

int sp_stack_demo(const sp_stack_config_t *cfg, const char *bin)
{
    char home[PATH_MAX], *env_path = NULL, *created = NULL;
    sp_bus_t *bus = NULL;
    sp_busid_t busid = {0};
    PGconn *db = NULL;
    char sbx[65] = "", path[128];
    sp_json_doc_t *doc = NULL;
    uint64_t seq = 0;
    int code = SP_STACK_EXIT_FAIL, rc;

    if (!realpath(cfg->home, home)) {
        fprintf(stderr, "space demo: %s: %s (run `space up` first)\n", cfg->home, strerror(errno));
        return code;
    }
    env_path = sp_xasprintf("%s/space.env", home);
    if ((rc = sp_env_file_export(env_path)) < 0) {
        fprintf(stderr, "space demo: cannot read %s: %s (run `space up` first)\n", env_path,
                sp_strerror(rc));
        goto out;
    }
    if (wait_template("tiny") < 0) {
        fprintf(stderr,
                "space demo: no worker offers the tiny template; see `space status` and "
                "%s/log/space-worker.log\n",
                home);
        goto out;
    }
    printf("A real sandbox (gVisor, its own btrfs snapshot and network namespace) through the "
           "HTTP API:\n");
    if (api("POST", "/v1/sandboxes", "{\"template\":\"tiny\",\"metadata\":{\"demo\":\"yes\"}}",
            &created) != 201)
        goto out;
    char err[SP_JSON_ERR_MAX];
    if (sp_json_parse(created, strlen(created), NULL, &doc, err) < 0 ||
        !sp_json_str(sp_json_get(sp_json_root(doc), "id"), NULL))
        goto out;
    snprintf(sbx, sizeof(sbx), "%s", sp_json_str(sp_json_get(sp_json_root(doc), "id"), NULL));
    if (api("GET", "/v1/sandboxes?metadata.demo=yes&state=running", NULL, NULL) != 200)
        goto out;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    if (api("DELETE", path, NULL, NULL) != 204)
        goto out;

    sp_bus_opts_t bo = {.url = getenv("SPACE_NATS_URL"), .name = "space-demo", .timeout_ms = 5000};
    /* The forger needs a NATS user: the operator's, the only one that may publish any event
     * (no daemon's permissions would let another tenant's fact through). Unsigned: the forged
     * event carries no signer at all. */
    char iderr[SP_BUSID_ERR_MAX];
    if (sp_busid_setup(getenv("SPACE_CREDS_DIR"), "operator", NULL, &busid, &bo, iderr) < 0) {
        fprintf(stderr, "space demo: identity: %s\n", iderr);
        goto out;
    }
    sp_publish_signer_set(NULL, NULL);
    if ((rc = sp_bus_connect(&bo, &bus)) < 0 || (rc = sp_bus_ensure_stream(bus)) < 0) {
        fprintf(stderr, "space demo: NATS: %s\n", sp_strerror(rc));
        goto out;
    }
    if ((rc = sp_db_connect(getenv("SPACE_PG_URL"), "space-demo", 5000, &db)) < 0) {
        fprintf(stderr, "space demo: PostgreSQL: %s\n", sp_strerror(rc));
        goto out;
    }
    /* Another tenant claims to have started this sandbox: the log must refuse it. */
    printf("\nA forged event published straight onto the bus (tenant \"intruder\" claims the "
           "sandbox):\n");
    sp_eventgen_msg_t forged;
    if (sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_STARTED, "intruder", sbx,
                            "worker-1", &forged) < 0)
        goto out;
    rc = publish(bus, &forged, "SandboxStarted (forged)", &seq);
    sp_eventgen_msg_dispose(&forged);
    if (rc < 0)
        goto out;
    /* Wait for space-eventlog to commit the last one. */
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM events WHERE stream_seq = %llu",
             (unsigned long long)seq);
    int stored = 0;
    for (int i = 0; i < 200 && !stored; i++) {
        PGresult *r = PQexec(db, sql);
        stored = PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "1") == 0;
        PQclear(r);
        if (!stored)
            nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    if (!stored) {
        fprintf(stderr,
                "space demo: space-eventlog did not store seq %llu within 10 s; see "
                "`space status` and %s/log/space-eventlog.log\n",
                (unsigned long long)seq, home);
        goto out;
    }

    printf("\n$ space-replay timeline --sandbox %s\n", sbx);
    const char *timeline[] = {"timeline", "--sandbox", sbx, NULL};
    if (run_replay(bin, timeline) != 0)
        goto out;
    printf("\n$ space-replay verify\n");
    const char *verify[] = {"verify", NULL};
    if (run_replay(bin, verify) != 0)
        goto out;
    printf("\nThe PostgreSQL event log: psql \"$SPACE_PG_URL\" -c 'table events'  "
           "(after: set -a; . %s; set +a)\n",
           env_path);
    code = SP_STACK_EXIT_OK;
out:
    sp_json_doc_free(doc);
    free(created);
    PQfinish(db);
    sp_bus_free(bus);
    sp_busid_dispose(&busid);
    free(env_path);
    return code;
}
