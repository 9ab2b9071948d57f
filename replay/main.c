/* space-replay: the security team's view of the event log.
 *
 *   space-replay verify                  walk the hash chain, report the first broken link;
 *                                        re-verify every accepted event's signature; check
 *                                        the chain against the event log's signed
 *                                        checkpoints and the stream (docs/audit.md)
 *   space-replay timeline --sandbox ID   what happened to one sandbox, and the state after
 *                                        each event (--json: one JSON object per line)
 *   space-replay export                  the log as JSON Lines, every stored row in stream
 *                                        order; --since/--until SEQ, --tenant, --sandbox,
 *                                        --type select rows
 *   space-replay state --at TIME         the sandboxes as they were then (or --at-seq N),
 *                                        folded by the reducers; --all shows deleted ones
 *   space-replay rebuild                 rebuild the projections from the log into a scratch
 *                                        schema and diff them with the live ones
 *   space-replay forget --sandbox ID     destroy the data key(s) of a sandbox (or --tenant):
 *                                        its sealed output unreadable for good, the chain
 *                                        still verifies (replay_datakey.c)
 *
 * Exit codes are in replay.h.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "busid.h"
#include "checkpoint.h"
#include "config.h"
#include "db.h"
#include "error.h"
#include "log.h"
#include "xmalloc.h"
#include "replay.h"

static const sp_cfg_opt_t options[] = {
    SP_CFG_STR_OPT("pg-url", replay_config_t, pg_url, "postgresql:///space", "PostgreSQL URI"),
    SP_CFG_BOOL_OPT("json", replay_config_t, json, "false", "JSON lines output"),
    SP_CFG_STR_OPT("sandbox", replay_config_t, sandbox, NULL,
                   "sandbox id (timeline; a filter for export and state)"),
    SP_CFG_INT_OPT("page", replay_config_t, page, 10, 1000000, "5000",
                   "rows fetched per query while walking the log"),
    SP_CFG_INT_OPT("since", replay_config_t, since, 0, INT64_MAX, "0",
                   "export: first stream_seq, inclusive (0: the start)"),
    SP_CFG_INT_OPT("until", replay_config_t, until, 0, INT64_MAX, "0",
                   "export: last stream_seq, inclusive (0: the end)"),
    SP_CFG_STR_OPT("tenant", replay_config_t, tenant, NULL, "tenant id (export, state)"),
    SP_CFG_STR_OPT("type", replay_config_t, type, NULL, "event type, e.g. SandboxPlaced (export)"),
    SP_CFG_STR_OPT("at", replay_config_t, at, NULL,
                   "state: RFC 3339 time (or now), compared with when the log stored events"),
    SP_CFG_INT_OPT("at-seq", replay_config_t, at_seq, 0, INT64_MAX, "0",
                   "state: the instant as a stream_seq instead of --at"),
    SP_CFG_BOOL_OPT("all", replay_config_t, all, "false", "state: show deleted sandboxes too"),
    SP_CFG_STR_OPT("schema", replay_config_t, schema, NULL,
                   "rebuild: scratch schema (default replay_<pid>)"),
    SP_CFG_BOOL_OPT("keep", replay_config_t, keep, "false",
                    "rebuild: keep the scratch schema instead of dropping it"),
    SP_CFG_STR_OPT("keyring-dir", replay_config_t, keyring_dir, NULL,
                   "verify: the identities' <identity>.pub (default $SPACE_HOME/creds)"),
    SP_CFG_STR_OPT("nats-url", replay_config_t, nats_url, NULL,
                   "verify: the bus, for the checkpoint stream and the event stream's last "
                   "sequence (empty: the checkpoint file only)"),
    SP_BUSID_CFG_OPTS(replay_config_t, identity, creds_dir),
    SP_CFG_STR_OPT("checkpoint-file", replay_config_t, checkpoint_file, NULL,
                   "verify: the event log's checkpoint file (default "
                   "$SPACE_HOME/" SP_CKPT_FILE_DEFAULT " when it exists)"),
    SP_CFG_INT_OPT("wait-s", replay_config_t, wait_s, 0, 3600, "10",
                   "verify: how long to wait for the log to store what the stream holds"),
    SP_CFG_BOOL_OPT("decrypt", replay_config_t, decrypt, "false",
                    "timeline, export: show sealed command output as text (needs the master "
                    "key, docs/audit.md)"),
    SP_CFG_STR_OPT("master-key-file", replay_config_t, master_key_file, NULL,
                   "--decrypt: the master key (default $SPACE_HOME/credstore/master.key)"),
    SP_CFG_INT_OPT("tail-max", replay_config_t, tail_max, 0, 10000000, "10000",
                   "verify: rows past the last checkpoint compared with the stream's messages"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static void usage(FILE *out)
{
    fprintf(out,
            "usage: space-replay [options] verify [--json] [--checkpoint-file F] [--nats-url U]\n"
            "       space-replay [options] timeline --sandbox ID [--json]\n"
            "       space-replay [options] export [--since SEQ] [--until SEQ] [--tenant T]\n"
            "                                     [--sandbox ID] [--type TYPE]\n"
            "       space-replay [options] state (--at TIME | --at-seq SEQ) [--tenant T]\n"
            "                                    [--sandbox ID] [--all] [--json]\n"
            "       space-replay [options] rebuild [--schema NAME] [--keep] [--json]\n"
            "       space-replay [options] forget (--sandbox ID | --tenant T)\n"
            "       (timeline and export take --decrypt [--master-key-file F])\n"
            "exit: 0 ok, 1 usage or database error, 2 the log disagrees with itself,\n"
            "      3 rebuild found differences\n\n");
    sp_config_usage(out, "space-replay", options, N_OPTIONS);
}

static const struct {
    const char *name;
    int (*run)(PGconn *db, const replay_config_t *cfg);
    int (*check)(const replay_config_t *cfg); /* NULL: nothing to check before connecting */
} commands[] = {
    {"verify", replay_verify, NULL},
    {"timeline", replay_timeline, NULL},
    {"export", replay_export, replay_check_filters},
    {"state", replay_state, replay_state_check},
    {"rebuild", replay_rebuild, replay_rebuild_check},
    {"forget", replay_forget, replay_forget_check},
};

/* The first option given that cmd does not use: silently ignoring --since on state would
 * answer another question than the one asked. */
static const char *unused_option(const char *cmd, const replay_config_t *c)
{
    int export = strcmp(cmd, "export") == 0, state = strcmp(cmd, "state") == 0;
    int forget = strcmp(cmd, "forget") == 0, timeline = strcmp(cmd, "timeline") == 0;
    if (c->sandbox[0] && !export && !state && !timeline && !forget)
        return "sandbox";
    if (c->tenant[0] && !export && !state && !forget)
        return "tenant";
    if ((c->decrypt || c->master_key_file[0]) && !export && !timeline)
        return c->decrypt ? "decrypt" : "master-key-file";
    if ((c->since || c->until || c->type[0]) && !export)
        return c->since ? "since" : c->until ? "until" : "type";
    if ((c->at[0] || c->at_seq || c->all) && !state)
        return c->at[0] ? "at" : c->at_seq ? "at-seq" : "all";
    if ((c->schema[0] || c->keep) && strcmp(cmd, "rebuild") != 0)
        return c->schema[0] ? "schema" : "keep";
    if (c->keyring_dir[0] && strcmp(cmd, "verify") != 0)
        return "keyring-dir";
    return NULL;
}

int main(int argc, char **argv)
{
    replay_config_t cfg = {0};
    char *err = NULL;
    int argi = 0;
    int code = 1;
    PGconn *db = NULL;
    const char *cmd;
    int (*run)(PGconn *, const replay_config_t *) = NULL;
    int (*check)(const replay_config_t *) = NULL;

    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout); /* the subcommands too, not the options alone */
            return 0;
        }
    /* Options may stand before and after the subcommand: find it, then parse every other
     * argument as options in one pass. */
    int rc = sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err);
    if (rc < 0)
        goto bad;
    if (argi < 0) {
        code = 0;
        goto out;
    }
    if (argi >= argc) {
        usage(stderr);
        goto out;
    }
    cmd = argv[argi];
    if (argi + 1 < argc) {
        char **merged = sp_xcalloc((size_t)argc, sizeof(char *));
        int n = 0, rest = 0;
        for (int i = 0; i < argc; i++)
            if (i != argi)
                merged[n++] = argv[i];
        sp_config_dispose(options, N_OPTIONS, &cfg);
        memset(&cfg, 0, sizeof(cfg));
        rc = sp_config_load(options, N_OPTIONS, &cfg, n, merged, &rest, &err);
        if (rc >= 0 && rest >= 0 && rest < n)
            fprintf(stderr, "space-replay: unexpected argument '%s'\n", merged[rest]);
        free(merged);
        if (rc < 0)
            goto bad;
        if (rest < 0) {
            code = 0;
            goto out;
        }
        if (rest < n)
            goto out;
    }
    sp_log_init("space-replay", SP_LOG_WARN, SP_LOG_KV);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(cmd, commands[i].name) == 0) {
            run = commands[i].run;
            check = commands[i].check;
        }
    if (!run) {
        fprintf(stderr, "space-replay: unknown command '%s'\n", cmd);
        usage(stderr);
        goto out;
    }
    const char *unused = unused_option(cmd, &cfg);
    if (unused) {
        fprintf(stderr, "space-replay: %s does not take --%s\n", cmd, unused);
        goto out;
    }
    if (check && check(&cfg) != 0)
        goto out;
    if ((rc = sp_db_connect(cfg.pg_url, "space-replay", 5000, &db)) < 0) {
        fprintf(stderr, "space-replay: cannot connect to PostgreSQL: %s\n", sp_strerror(rc));
        goto out;
    }
    code = run(db, &cfg);
    goto out;
bad:
    fprintf(stderr, "space-replay: %s\n", err ? err : sp_strerror(rc));
out:
    PQfinish(db);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return code;
}
