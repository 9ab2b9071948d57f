/* `space demo`: a short tour of what runs today. It plays the parts of the services that do not
 * exist yet (gateway, scheduler, worker) by publishing a sandbox's life onto the bus, adds one
 * forged event, waits for space-eventlog to store them, and shows what the log now says with
 * space-replay. Nothing here is on a request path; the events come from lib/eventgen.c. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bus.h"
#include "config.h"
#include "db.h"
#include "error.h"
#include "eventgen.h"
#include "ids.h"
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

int sp_stack_demo(const sp_stack_config_t *cfg, const char *bin)
{
    char home[PATH_MAX], *env_path = NULL;
    sp_bus_t *bus = NULL;
    PGconn *db = NULL;
    char sbx[SP_SANDBOX_ID_LEN + 1];
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
    sp_bus_opts_t bo = {.url = getenv("SPACE_NATS_URL"), .name = "space-demo", .timeout_ms = 5000};
    if ((rc = sp_bus_connect(&bo, &bus)) < 0 || (rc = sp_bus_ensure_stream(bus)) < 0) {
        fprintf(stderr, "space demo: NATS: %s\n", sp_strerror(rc));
        goto out;
    }
    if ((rc = sp_db_connect(getenv("SPACE_PG_URL"), "space-demo", 5000, &db)) < 0) {
        fprintf(stderr, "space demo: PostgreSQL: %s\n", sp_strerror(rc));
        goto out;
    }

    sp_sandbox_id_new(sbx);
    printf("A sandbox's life as the services will publish it (the gateway, scheduler and worker\n"
           "are not built yet; the demo speaks for them), then one forged event:\n\n");
    for (size_t i = 0; i < 5; i++) {
        sp_eventgen_msg_t m;
        if (sp_eventgen_sandbox(sp_eventgen_lifecycle[i], "demo", sbx, "worker-1", &m) < 0)
            goto out;
        rc = publish(bus, &m, sp_event_type_name(sp_eventgen_lifecycle[i]), &seq);
        sp_eventgen_msg_dispose(&m);
        if (rc < 0)
            goto out;
    }
    /* Another tenant claims to have started this sandbox: the log must refuse it. */
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
    PQfinish(db);
    sp_bus_free(bus);
    free(env_path);
    return code;
}
