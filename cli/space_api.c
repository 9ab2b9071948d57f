/* The API's door in `space up`: the gateway's URL and the operator's API key in space.env.
 *
 * That key is the deployment's admin key (apikey.h: it manages every tenant's keys through
 * /v1/keys and `space keys`), of tenant SP_STACK_TENANT. `space up` keeps the key space.env
 * holds as long as it is live, so running it again mints nothing; a live key of space.env that
 * is not an admin key (made before keys had roles) is made one. A new key is minted only when
 * space.env has none or it was revoked: the way back for an operator who revoked the last admin
 * key. This is the one place keys are made without the API: it runs where PostgreSQL is, as
 * its superuser. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apikey.h"
#include "config.h"
#include "db.h"
#include "error.h"
#include "space_proc.h"
#include "space_stack.h"
#include "xmalloc.h"

/* The gateway writes its bound port once it listens. */
static int read_port(const sp_stack_t *st, int timeout_ms)
{
    char *path = sp_xasprintf("%s/%s", st->run_dir, SP_STACK_GATEWAY_PORT_FILE);
    char *pidfile = sp_xasprintf("%s/space-gateway.pid", st->run_dir);
    int port = -1;
    pid_t pid;

    for (int waited = 0; waited <= timeout_ms && port < 0; waited += 50) {
        if (sp_proc_pidfile_check(pidfile, "space-gateway", &pid) != 1)
            break;
        FILE *f = fopen(path, "re");
        if (f) {
            char line[16];
            if (fgets(line, sizeof(line), f)) {
                long v = strtol(line, NULL, 10);
                if (v > 0 && v < 65536)
                    port = (int)v;
            }
            fclose(f);
        }
        if (port < 0)
            sp_proc_sleep_ms(50);
    }
    free(path);
    free(pidfile);
    return port;
}

int sp__api_up(const sp_stack_t *st, const char *pg_url, char **ret_api_url, char **ret_api_key)
{
    char *env_path = sp__stack_path(st, "space.env"), *old = NULL;
    char id[SP_APIKEY_ID_LEN + 1];
    sp_apikey_t k;
    PGconn *db = NULL;
    int r = -1, rc;

    *ret_api_url = NULL;
    *ret_api_key = NULL;
    int port = read_port(st, 10000);
    if (port < 0) {
        r = 0; /* no gateway: nothing to write */
        goto out;
    }
    *ret_api_url = sp_xasprintf("http://127.0.0.1:%d", port);
    if ((rc = sp_db_connect(pg_url, "space-cli", 10000, &db)) < 0 || (rc = sp_db_migrate(db)) < 0) {
        fprintf(stderr, "space: cannot prepare the API key: %s\n", sp_strerror(rc));
        goto out;
    }
    if (sp_env_file_get(env_path, "SPACE_API_KEY", &old) == 0 &&
        sp_apikey_check(db, old, &k) == 0) {
        if (!k.admin && (rc = sp_apikey_set_admin(db, k.id)) < 0) {
            fprintf(stderr, "space: cannot make key %s an admin key: %s\n", k.id, sp_strerror(rc));
            goto out;
        }
        printf("%-*s %s  key %s for tenant %s (admin)\n", SP_STACK_PART_WIDTH, "api key",
               k.admin ? "kept   " : "admin  ", k.id, k.tenant);
        *ret_api_key = old;
        old = NULL;
        r = 0;
        goto out;
    }
    if ((rc = sp_apikey_mint(db, SP_STACK_TENANT, "space up", true, ret_api_key, id)) < 0) {
        fprintf(stderr, "space: cannot create an API key: %s\n", sp_strerror(rc));
        goto out;
    }
    printf("%-*s created  key %s for tenant %s (admin)\n", SP_STACK_PART_WIDTH, "api key", id,
           SP_STACK_TENANT);
    r = 0;
out:
    if (old) {
        explicit_bzero(old, strlen(old));
        free(old);
    }
    free(env_path);
    PQfinish(db);
    return r;
}
