/* space-replay: the security team's view of the event log.
 *
 *   space-replay verify                  walk the hash chain, report the first broken link
 *   space-replay timeline --sandbox ID   what happened to one sandbox, and the state after
 *                                        each event (--json: one JSON object per line)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "db.h"
#include "error.h"
#include "log.h"
#include "xmalloc.h"
#include "replay.h"

static const sp_cfg_opt_t options[] = {
    SP_CFG_STR_OPT("pg-url", replay_config_t, pg_url, "postgresql:///space", "PostgreSQL URI"),
    SP_CFG_BOOL_OPT("json", replay_config_t, json, "false", "JSON lines output"),
    SP_CFG_STR_OPT("sandbox", replay_config_t, sandbox, NULL, "sandbox id (timeline)"),
    SP_CFG_INT_OPT("page", replay_config_t, page, 10, 1000000, "5000",
                   "rows fetched per query while walking the log"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static void usage(FILE *out)
{
    fprintf(out, "usage: space-replay [options] verify\n"
                 "       space-replay [options] timeline --sandbox ID [--json]\n\n");
    sp_config_usage(out, "space-replay", options, N_OPTIONS);
}

int main(int argc, char **argv)
{
    replay_config_t cfg = {0};
    char *err = NULL;
    int argi = 0;
    int code = 1;
    PGconn *db = NULL;
    const char *cmd;

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
    if (strcmp(cmd, "verify") != 0 && strcmp(cmd, "timeline") != 0) {
        fprintf(stderr, "space-replay: unknown command '%s'\n", cmd);
        usage(stderr);
        goto out;
    }
    if ((rc = sp_db_connect(cfg.pg_url, "space-replay", 5000, &db)) < 0) {
        fprintf(stderr, "space-replay: cannot connect to PostgreSQL: %s\n", sp_strerror(rc));
        goto out;
    }
    if (strcmp(cmd, "verify") == 0)
        code = replay_verify(db, &cfg);
    else
        code = replay_timeline(db, &cfg);
    goto out;
bad:
    fprintf(stderr, "space-replay: %s\n", err ? err : sp_strerror(rc));
out:
    PQfinish(db);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return code;
}
