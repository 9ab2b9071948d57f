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
    SP_CFG_INT_OPT("stream-max-age-s", sp_stack_config_t, stream_max_age_s, -1, 315360000,
                   "3024000",
                   "SPACE_EVENTS keeps messages this long (-1: no limit; docs/audit.md, Bounds)"),
    SP_CFG_INT_OPT("stream-max-bytes", sp_stack_config_t, stream_max_bytes, -1, INT64_MAX,
                   "4294967296",
                   "and at most this many bytes, the oldest dropped first (-1: no "
                   "limit)"),
    SP_CFG_INT_OPT("nats-nodes", sp_stack_config_t, nats_nodes, 1, 5, "1",
                   "nats-server nodes `up` runs, as one JetStream cluster when more than 1 "
                   "(docs/operations.md)"),
    SP_CFG_INT_OPT("stream-replicas", sp_stack_config_t, stream_replicas, 0, 5, "0",
                   "copies of each stream on the cluster (0: min(3, nats-nodes)); for servers "
                   "`up` does not run, the cluster's size or less"),
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
            "  create [TEMPLATE] [opts]   create a sandbox, print its id (--template, --timeout,\n"
            "                             --metadata K=V, --env K=V, --allow, --deny, --json)\n"
            "  ls [--json]                list your sandboxes (aligned columns)\n"
            "  rm ID...                   delete sandboxes\n"
            "  exec ID [opts] [--] CMD [ARG...]  run a command, stream its output, exit with its\n"
            "                             code; stdin forwarded (--env, --cwd, --user, --timeout,\n"
            "                             -t for a pty, -n)\n"
            "  cp [-r] LOCAL ID:PATH      copy a file (-r: a directory) into a sandbox\n"
            "  cp [-r] ID:PATH LOCAL      copy a file (-r: a directory) out of a sandbox\n"
            "  events [--follow] [ID]     the event log (of one sandbox), one line per event\n"
            "  identity add KIND [INSTANCE]  credentials of an identity on the bus under\n"
            "                  $SPACE_HOME/creds (kept if they exist); with this home's\n"
            "                  nats-server running, nats.conf is reloaded with it\n"
            "  identity ls [--json]  the identities that have credentials\n"
            "  identity conf   nats.conf's authorization block for them (for a cluster)\n"
            "  identity rotate NAME [--grace SECONDS]  a new signing key for NAME; the old\n"
            "                  one counts for messages published within SECONDS (3600);\n"
            "                  this home's daemons that run as NAME restart with the new key\n"
            "  platform add NAME --tenants T1,T2  an internal platform: identity\n"
            "                  platform-NAME and the tenants it may act for\n"
            "  platform ls [--json]  the platforms and their tenants\n"
            "  platform publish NAME --tenant T create TEMPLATE [--timeout S] | delete ID |\n"
            "                  pause ID | resume ID | suspend ID | timeout ID --timeout S\n"
            "                  [--wait-s N]: a signed intent as the platform, then its outcome\n"
            "                  (docs/platforms.md)\n"
            "  creds add|ls|rm|rotate     credentials injected by egressd (value on stdin;\n"
            "                             `space creds` for the syntax)\n"
            "  creds rotate-master        a new master key, credentials re-wrapped while\n"
            "                             credstore serves\n"
            "  keys create --tenant T [--name N] [--admin]  a new API key (printed once)\n"
            "  keys ls [--tenant T]       the keys: id, tenant, role, times (never a key)\n"
            "  keys revoke ID             revoke a key (refused everywhere within a second)\n"
            "                             (keys: with the admin key of space.env)\n"
            "\n"
            "`space <command> --help` (or `space help <command>`) prints that command's usage.\n"
            "The client commands (create ... keys) take --home and read SPACE_API_URL,\n"
            "SPACE_API_KEY, else $SPACE_HOME/space.env. Options of up, down, status, env, demo:\n"
            "\n");
    sp_config_usage(out, "space <command>", options, N_OPTIONS);
}

int main(int argc, char **argv)
{
    sp_stack_config_t cfg = {0};
    const char *cmd;
    char **args, *err = NULL, *prog;
    int nargs = 0, argi = 0, r;
    bool purge = false;

    if (argc < 2) {
        usage(stderr);
        return SP_STACK_EXIT_USAGE;
    }
    cmd = argv[1];
    if (strcmp(cmd, "help") == 0 && argc == 3) {
        if (sp_client_usage(argv[2], stdout))
            return SP_STACK_EXIT_OK;
        fprintf(stderr, "space help: '%s' has no usage of its own (see space --help)\n", argv[2]);
        return SP_STACK_EXIT_USAGE;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return SP_STACK_EXIT_OK;
    }
    bool client = strcmp(cmd, "create") == 0 || strcmp(cmd, "ls") == 0 || strcmp(cmd, "rm") == 0 ||
                  strcmp(cmd, "exec") == 0 || strcmp(cmd, "cp") == 0 ||
                  strcmp(cmd, "events") == 0 || strcmp(cmd, "creds") == 0 ||
                  strcmp(cmd, "keys") == 0;
    bool identity = strcmp(cmd, "identity") == 0, platform = strcmp(cmd, "platform") == 0;
    if (!client && !identity && !platform && strcmp(cmd, "up") != 0 && strcmp(cmd, "down") != 0 &&
        strcmp(cmd, "status") != 0 && strcmp(cmd, "env") != 0 && strcmp(cmd, "demo") != 0) {
        fprintf(stderr, "space: unknown command '%s' (see space --help)\n", cmd);
        return SP_STACK_EXIT_USAGE;
    }

    if (identity || platform) {
        for (int i = 2; i < argc; i++)
            if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
                fputs(identity ? SP_STACK_IDENTITY_USAGE : SP_STACK_PLATFORM_USAGE, stdout);
                return SP_STACK_EXIT_OK;
            }
    }
    /* The command plays argv[0] for the option parser. --purge is taken out here rather than
     * put in the table, so that no environment variable or config file can ask for a purge. */
    prog = sp_xasprintf("space %s", cmd);
    args = sp_xcalloc((size_t)argc, sizeof(*args));
    args[nargs++] = prog;
    if (client) {
        /* A client command parses its own options (and prints its own --help); of the stack's
         * options it takes --home only (where space.env is). */
        char **rest = sp_xcalloc((size_t)argc + 1, sizeof(*rest));
        int nrest = 0;
        bool dashdash = false;
        for (int i = 2; i < argc; i++) {
            /* After "--" and, for exec, from its id on (`space exec [--home H] ID ...`): what
             * follows may be the command's own arguments, whatever they hold. */
            if (strcmp(argv[i], "--") == 0 || (argv[i][0] != '-' && strcmp(cmd, "exec") == 0))
                dashdash = true;
            if (!dashdash && strncmp(argv[i], "--home=", 7) == 0)
                args[nargs++] = argv[i];
            else if (!dashdash && strcmp(argv[i], "--home") == 0 && i + 1 < argc) {
                args[nargs++] = argv[i];
                args[nargs++] = argv[++i];
            } else
                rest[nrest++] = argv[i];
        }
        if (sp_config_load(options, N_OPTIONS, &cfg, nargs, args, &argi, &err) < 0) {
            fprintf(stderr, "space %s: %s\n", cmd, err ? err : "bad configuration");
            r = SP_STACK_EXIT_USAGE;
        } else {
            r = sp_client_main(&cfg, cmd, nrest, rest);
        }
        free(rest);
        goto out;
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(cmd, "down") == 0 && strcmp(argv[i], "--purge") == 0)
            purge = true;
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
    if (platform) {
        r = sp_stack_platform(&cfg, nargs - argi, args + argi);
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
