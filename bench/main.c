/* space-bench: performance claims, measured as distributions against baselines in the same
 * run (never as timed assertions in tests). Runs against the stack in $SPACE_HOME/space.env,
 * or the URLs given. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "busid.h"
#include "config.h"
#include "db.h"
#include "error.h"
#include "httpc.h"
#include "log.h"
#include "sign.h"
#include "publish.h"

typedef struct {
    char *nats_url;
    char *identity;
    char *creds_dir;
    char *pg_url;
    int64_t runs;
    int64_t events;
    int64_t sign_batch;
    int64_t rate;
    int64_t seconds;
    int64_t creates;
    int64_t pool_size;
    int64_t execs;
    int64_t rounds;
    int64_t sandboxes;
    char *api_url;
    char *api_key;
    char *home;
    char *baseline_bin;
} bench_config_t;

#define STR_(x) #x
#define STR(x)  STR_(x)

static const sp_cfg_opt_t options[] = {
    SP_CFG_STR_OPT("nats-url", bench_config_t, nats_url, "nats://127.0.0.1:4222", "NATS URL"),
    /* Empty identity: the operator, the only one that may publish every producer's events. */
    SP_BUSID_CFG_OPTS(bench_config_t, identity, creds_dir),
    SP_CFG_STR_OPT("pg-url", bench_config_t, pg_url, "postgresql:///space", "PostgreSQL URI"),
    SP_CFG_INT_OPT("runs", bench_config_t, runs, 1, 100, "5", "repetitions of each measurement"),
    SP_CFG_INT_OPT("events", bench_config_t, events, 100, 10000000, "20000",
                   "events per throughput run"),
    /* The producers' default, SP_SIG_BATCH_DEFAULT (sign.h). */
    SP_CFG_INT_OPT("sign-batch", bench_config_t, sign_batch, 1, 4096, STR(SP_SIG_BATCH_DEFAULT),
                   "eventlog: most events a producer signs under one Merkle root"),
    SP_CFG_INT_OPT("rate", bench_config_t, rate, 1, 100000, "1000",
                   "events/s for the latency runs"),
    SP_CFG_INT_OPT("seconds", bench_config_t, seconds, 1, 3600, "5", "length of a latency run"),
    SP_CFG_INT_OPT("warm-pool", bench_config_t, pool_size, 1, 64, "2",
                   "create bench: the worker's pool-size in its pooled part and burst"),
    SP_CFG_INT_OPT("creates", bench_config_t, creates, 1, 100000, "200",
                   "sandboxes created (create bench)"),
    SP_CFG_INT_OPT("execs", bench_config_t, execs, 1, 1000000, "1000", "commands run (exec bench)"),
    SP_CFG_INT_OPT("sandboxes", bench_config_t, sandboxes, 1, 1000, "20",
                   "idle sandboxes, and as many bare containers (density bench)"),
    SP_CFG_INT_OPT("rounds", bench_config_t, rounds, 1, 100000, "20",
                   "pause/resume/suspend/resume rounds (lifecycle bench)"),
    SP_CFG_STR_OPT("api-url", bench_config_t, api_url, "http://127.0.0.1:8080", "the HTTP API"),
    SP_CFG_STR_OPT("api-key", bench_config_t, api_key, NULL,
                   "API key (create, exec, lifecycle; api: SPACE_API_KEY or its --api-key-file)"),
    SP_CFG_STR_OPT("home", bench_config_t, home, "./var", "SPACE_HOME of the stack"),
    SP_CFG_STR_OPT("baseline-bin", bench_config_t, baseline_bin, "",
                   "eventlog: also run each throughput mode with DIR/space-eventlog (another "
                   "build), alternating with this one run by run; exec: the same commands with "
                   "DIR's gateway, worker and event log, in blocks taking turns with this build"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static sp_busid_t busid;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: space-bench [options] COMMAND\n"
            "commands:\n"
            "  eventlog   events published to the stream until the log stored them\n"
            "  create     sandbox creates through the API (--api-url, --api-key)\n"
            "  exec       commands through the API in one sandbox\n"
            "  lifecycle  pause/resume/suspend/resume rounds\n"
            "  fork       fork into 1, 4 and 8 copies, --rounds times, beside a raw runsc "
            "restore\n"
            "  density    PSS of --sandboxes idle sandboxes beside as many bare runsc "
            "containers\n"
            "  sign       event signing and verifying, CPU only\n"
            "  signed     E2B signed URLs against the SDK's headers, --execs GETs of each\n"
            "  api        a deployment's latency over its HTTP API alone, at a concurrency\n"
            "             and an open-loop rate; JSON and an SVG plot (space-bench api --help)\n"
            "exit: 0 done, 1 the bench failed, 2 bad usage\n\n");
    sp_config_usage(out, "space-bench", options, N_OPTIONS);
}

int main(int argc, char **argv)
{
    bench_config_t cfg = {0};
    char *err = NULL;
    int argi = 0, code = 1;
    bench_ctx_t c = {0};

    if (argc > 1 && strcmp(argv[1], "api") == 0) {
        /* api first: the global options (and their SPACE_* variables, some of the same name
         * as api's, like SPACE_RATE) are not read at all; the key is SPACE_API_KEY's. */
        sp_log_init("space-bench", SP_LOG_WARN, SP_LOG_KV);
        return bench_api(argc - 1, argv + 1, getenv("SPACE_API_KEY"));
    }
    /* The global options' --help; api's come after its name and are its own. */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0 && strcmp(argv[i], "api") != 0; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout); /* the commands too, not the options alone */
            return 0;
        }
    if (sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err) < 0) {
        fprintf(stderr, "space-bench: %s\n", err ? err : "bad options");
        code = 2;
        goto out;
    }
    if (argi < 0) {
        code = 0;
        goto out;
    }
    if (argi < argc && strcmp(argv[argi], "api") == 0) {
        /* A deployment over its API alone: no NATS, no database, no runsc here. */
        sp_log_init("space-bench", SP_LOG_WARN, SP_LOG_KV);
        code = bench_api(argc - argi, argv + argi, cfg.api_key);
        goto out;
    }
    if (argi + 1 != argc ||
        (strcmp(argv[argi], "eventlog") != 0 && strcmp(argv[argi], "create") != 0 &&
         strcmp(argv[argi], "exec") != 0 && strcmp(argv[argi], "lifecycle") != 0 &&
         strcmp(argv[argi], "fork") != 0 && strcmp(argv[argi], "sign") != 0 &&
         strcmp(argv[argi], "signed") != 0 && strcmp(argv[argi], "density") != 0)) {
        if (argi < argc)
            fprintf(stderr, "space-bench: unknown command '%s'\n", argv[argi]);
        usage(stderr);
        code = 2;
        goto out;
    }
    sp_log_init("space-bench", SP_LOG_WARN, SP_LOG_KV);
    if (strcmp(argv[argi], "sign") == 0) {
        /* CPU only: no stack to connect to. */
        c.events = (size_t)cfg.events;
        code = bench_sign(&c);
        goto out;
    }
    sp_bus_opts_t bo = {.url = cfg.nats_url, .name = "space-bench", .timeout_ms = 10000};
    char iderr[SP_BUSID_ERR_MAX];
    int rc = sp_busid_setup(cfg.creds_dir, cfg.identity, "operator", &busid, &bo, iderr);
    if (rc < 0) {
        fprintf(stderr, "space-bench: identity: %s\n", iderr);
        goto out;
    }
    /* The synthetic events go out unsigned, as before: the eventlog bench measures the log,
     * and the cost of signing is bench sign's. */
    sp_publish_signer_set(NULL, NULL);
    rc = sp_bus_connect(&bo, &c.bus);
    if (rc >= 0)
        rc = sp_bus_ensure_stream(c.bus);
    if (rc < 0) {
        fprintf(stderr, "space-bench: NATS: %s\n", sp_strerror(rc));
        goto out;
    }
    if ((rc = sp_db_connect(cfg.pg_url, "space-bench", 10000, &c.db)) < 0) {
        fprintf(stderr, "space-bench: PostgreSQL: %s\n", sp_strerror(rc));
        goto out;
    }
    c.runs = (unsigned)cfg.runs;
    c.events = (size_t)cfg.events;
    c.rate = (unsigned)cfg.rate;
    c.sign_batch = (size_t)cfg.sign_batch;
    c.seconds = (unsigned)cfg.seconds;
    c.creates = (size_t)cfg.creates;
    c.pool_size = (size_t)cfg.pool_size;
    c.execs = (size_t)cfg.execs;
    c.rounds = (size_t)cfg.rounds;
    c.sandboxes = (size_t)cfg.sandboxes;
    c.home = cfg.home;
    c.baseline_bin = cfg.baseline_bin && cfg.baseline_bin[0] ? cfg.baseline_bin : NULL;
    c.api_key = cfg.api_key;
    if (strcmp(argv[argi], "eventlog") != 0) {
        if (sp_httpc_parse_url(cfg.api_url, c.api_host, sizeof(c.api_host), &c.api_port) < 0) {
            fprintf(stderr, "space-bench: bad --api-url\n");
            goto out;
        }
        code = strcmp(argv[argi], "create") == 0    ? bench_create(&c)
               : strcmp(argv[argi], "exec") == 0    ? bench_exec(&c)
               : strcmp(argv[argi], "fork") == 0    ? bench_fork(&c)
               : strcmp(argv[argi], "signed") == 0  ? bench_signed(&c)
               : strcmp(argv[argi], "density") == 0 ? bench_density(&c)
                                                    : bench_lifecycle(&c);
    } else {
        code = bench_eventlog(&c);
    }
out:
    PQfinish(c.db);
    sp_bus_free(c.bus);
    sp_busid_dispose(&busid);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return code;
}
