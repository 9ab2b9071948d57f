/* space: the one entry point for people. Brings the local stack up and down (space_stack.h).
 *
 *   space <command> [--option=value ...]
 *
 * Exit codes: 0 success, 1 failure, 2 bad usage or configuration, 3 `status` found a component
 * that is not running. */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "space_stack.h"
#include "xmalloc.h"

static const sp_cfg_opt_t options[] = {
    SP_CFG_STR_OPT("home", sp_stack_config_t, home, "./var",
                   "stack directory: data, logs, pid files, space.env (made absolute)"),
    SP_CFG_STR_OPT("nats-host", sp_stack_config_t, nats_host, "127.0.0.1",
                   "address nats-server listens on"),
    SP_CFG_INT_OPT("nats-port", sp_stack_config_t, nats_port, 0, 65535, "4222",
                   "NATS client port; 0 lets nats-server pick a free one"),
    SP_CFG_STR_OPT("nats-server", sp_stack_config_t, nats_server, "nats-server",
                   "nats-server program (looked up in PATH, then /usr/sbin)"),
    SP_CFG_INT_OPT("pg-port", sp_stack_config_t, pg_port, 1, 65535, "5432",
                   "PostgreSQL port: names the unix socket only, nothing listens on TCP"),
    SP_CFG_STR_OPT("pg-user", sp_stack_config_t, pg_user, "space",
                   "PostgreSQL superuser that initdb creates"),
    SP_CFG_STR_OPT("pg-db", sp_stack_config_t, pg_db, "space", "database the daemons use"),
    SP_CFG_STR_OPT("pg-bin-dir", sp_stack_config_t, pg_bin_dir, "/usr/lib/postgresql/15/bin",
                   "where initdb and postgres are"),
    SP_CFG_STR_OPT("pg-os-user", sp_stack_config_t, pg_os_user, "postgres",
                   "OS user PostgreSQL runs as when space runs as root"),
    SP_CFG_STR_OPT("bin-dir", sp_stack_config_t, bin_dir, NULL,
                   "where the SPACE daemons are (default: the directory of this program)"),
    SP_CFG_STR_OPT("log-format", sp_stack_config_t, log_format, "kv",
                   "log format handed to the daemons: kv or json"),
    SP_CFG_STR_OPT("daemons", sp_stack_config_t, daemons,
                   "space-eventlog,space-scheduler,space-worker,space-credstore,space-egressd,"
                   "space-gateway",
                   "which SPACE daemons `up` starts (comma-separated)"),
    SP_CFG_INT_OPT("api-port", sp_stack_config_t, api_port, 0, 65535, "8080",
                   "port of the HTTP API (space-gateway, on 127.0.0.1); 0: any free port"),
    SP_CFG_STR_OPT("id", sp_stack_config_t, worker_id, "worker-1",
                   "id of the worker and egressd `up` runs (their --id): names their identities "
                   "worker-<id>, egressd-<id>"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static void usage(FILE *out)
{
    fprintf(out,
            "space <command> [options]: the local SPACE stack\n"
            "\n"
            "commands:\n"
            "  up              start nats-server, PostgreSQL and the SPACE daemons under\n"
            "                  $SPACE_HOME (each only if it is not running) and write space.env\n"
            "  down [--purge]  stop them; --purge also deletes $SPACE_HOME\n"
            "  status          one line per component; exit 0 if all run, 3 otherwise\n"
            "  env             print $SPACE_HOME/space.env (SPACE_NATS_URL, SPACE_PG_URL)\n"
            "  demo            a sandbox through the API, a forged event, the log's timeline\n"
            "  create [TEMPLATE]          create a sandbox (default tiny), print its id\n"
            "  ls                         list your sandboxes\n"
            "  rm ID...                   delete sandboxes\n"
            "  exec ID [--] CMD [ARG...]  run a command, print its output, exit with its code\n"
            "  cp LOCAL ID:PATH           copy a file into a sandbox (streamed)\n"
            "  cp ID:PATH LOCAL           copy a file out of a sandbox (streamed)\n"
            "  events [--follow] [ID]     the event log (of one sandbox), one line per event\n"
            "  identity add KIND [INSTANCE]  credentials of an identity on the bus under\n"
            "                  $SPACE_HOME/creds (kept if they exist); with this home's\n"
            "                  nats-server running, nats.conf is reloaded with it\n"
            "  identity ls     the identities that have credentials\n"
            "  identity conf   nats.conf's authorization block for them (for a cluster)\n"
            "  creds add|ls|rm|rotate     credentials injected by egressd (value on stdin;\n"
            "                             `space creds` for the syntax)\n"
            "\n");
    sp_config_usage(out, "space <command>", options, N_OPTIONS);
}

int main(int argc, char **argv)
{
    sp_stack_config_t cfg = {0};
    const char *cmd;
    char **args, *err = NULL, *prog;
    int nargs = 0, argi = 0, r;
    bool purge = false, follow = false;

    if (argc < 2) {
        usage(stderr);
        return SP_STACK_EXIT_USAGE;
    }
    cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return SP_STACK_EXIT_OK;
    }
    bool client = strcmp(cmd, "create") == 0 || strcmp(cmd, "ls") == 0 || strcmp(cmd, "rm") == 0 ||
                  strcmp(cmd, "exec") == 0 || strcmp(cmd, "cp") == 0 ||
                  strcmp(cmd, "events") == 0 || strcmp(cmd, "creds") == 0;
    bool identity = strcmp(cmd, "identity") == 0;
    if (!client && !identity && strcmp(cmd, "up") != 0 && strcmp(cmd, "down") != 0 &&
        strcmp(cmd, "status") != 0 && strcmp(cmd, "env") != 0 && strcmp(cmd, "demo") != 0) {
        fprintf(stderr, "space: unknown command '%s' (see space --help)\n", cmd);
        return SP_STACK_EXIT_USAGE;
    }

    /* The command plays argv[0] for the option parser. --purge is taken out here rather than
     * put in the table, so that no environment variable or config file can ask for a purge. */
    prog = sp_xasprintf("space %s", cmd);
    args = sp_xcalloc((size_t)argc, sizeof(*args));
    args[nargs++] = prog;
    for (int i = 2; i < argc; i++) {
        if (strcmp(cmd, "down") == 0 && strcmp(argv[i], "--purge") == 0)
            purge = true;
        else if (strcmp(cmd, "events") == 0 &&
                 (strcmp(argv[i], "--follow") == 0 || strcmp(argv[i], "-f") == 0))
            follow = true; /* not a configuration option: handed to the command */
        else
            args[nargs++] = argv[i];
    }
    if (sp_config_load(options, N_OPTIONS, &cfg, nargs, args, &argi, &err) < 0) {
        fprintf(stderr, "space %s: %s\n", cmd, err ? err : "bad configuration");
        r = SP_STACK_EXIT_USAGE;
        goto out;
    }
    if (argi < 0) {
        r = SP_STACK_EXIT_OK; /* --help was printed */
        goto out;
    }
    if (identity) {
        r = sp_stack_identity(&cfg, nargs - argi, args + argi);
        goto out;
    }
    if (client) {
        /* Positional arguments follow the options: ID, the command line of exec. */
        if (follow)
            args[nargs++] = "--follow"; /* after the positional arguments: ID [--follow] */
        r = sp_client_main(&cfg, cmd, nargs - argi, args + argi);
        goto out;
    }
    if (argi < nargs) {
        fprintf(stderr, "space %s: unexpected argument '%s' (see space --help)\n", cmd, args[argi]);
        r = SP_STACK_EXIT_USAGE;
        goto out;
    }

    if (strcmp(cmd, "up") == 0)
        r = sp_stack_up(&cfg);
    else if (strcmp(cmd, "down") == 0)
        r = sp_stack_down(&cfg, purge);
    else if (strcmp(cmd, "status") == 0)
        r = sp_stack_status(&cfg);
    else if (strcmp(cmd, "env") == 0)
        r = sp_stack_env(&cfg);
    else {
        char *bin = sp_stack_bin_dir(&cfg);
        r = sp_stack_demo(&cfg, bin);
        free(bin);
    }
out:
    free(err);
    free(args);
    free(prog);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    fflush(stdout);
    return r;
}
