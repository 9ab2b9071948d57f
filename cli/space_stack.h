/* The local stack behind `space up|down|status|env`: nats-server with JetStream, a private
 * PostgreSQL cluster and the SPACE daemons, all under one directory ($SPACE_HOME):
 *
 *   $SPACE_HOME/.space-home          marker: this directory was created by `space up`
 *   $SPACE_HOME/space.env            SPACE_HOME, SPACE_NATS_URL, SPACE_PG_URL (mode 0600)
 *   $SPACE_HOME/run/                 pid files, nats-server's ports file, the command lock
 *   $SPACE_HOME/log/                 one log per process (nats.log, postgres.log, <daemon>.log)
 *   $SPACE_HOME/nats/                nats.conf (generated) and the JetStream store
 *   $SPACE_HOME/pg/data, pg/run      the cluster and its unix socket directory
 *
 * Everything here prints for people: progress on stdout, errors (with the log tail of a process
 * that died) on stderr. The sp_stack_* entry points return the process exit code.
 */
#ifndef SPACE_CLI_STACK_H
#define SPACE_CLI_STACK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "buf.h"
#include "contract.h"

enum {
    SP_STACK_EXIT_OK = 0,
    SP_STACK_EXIT_FAIL = 1,    /* something could not be started, stopped or read */
    SP_STACK_EXIT_USAGE = 2,   /* bad command line or configuration value */
    SP_STACK_EXIT_NOT_ALL = 3, /* status: at least one component is not running */
};

/* Filled by sp_config_load from the table in main.c (flags, SPACE_* environment, file). */
typedef struct {
    char *home;
    char *nats_host;
    int64_t nats_port; /* 0: nats-server picks a free port, read back from its ports file */
    char *nats_server;
    int64_t pg_port; /* names the socket file .s.PGSQL.<port>; PostgreSQL listens on no TCP */
    char *pg_user;
    char *pg_db;
    char *pg_bin_dir;
    char *pg_os_user;
    char *bin_dir; /* empty: the directory of the running `space` binary */
    char *log_format;
    char *daemons;    /* comma-separated names `up` starts; `down` stops every one */
    int64_t api_port; /* space-gateway's port; 0: any free one, read back from its port file */
    char *worker_id;  /* SPACE_ID: the id of the worker (and egressd) `up` runs */
} sp_stack_config_t;

#define SP_STACK_GATEWAY_PORT_FILE "space-gateway.port"
#define SP_STACK_TENANT            "default" /* tenant of the first API key */

int sp_stack_up(const sp_stack_config_t *cfg);
int sp_stack_down(const sp_stack_config_t *cfg, bool purge);
int sp_stack_status(const sp_stack_config_t *cfg);
int sp_stack_env(const sp_stack_config_t *cfg);
/* Publishes a demo sandbox's events and shows the log with space-replay from bin. */
int sp_stack_demo(const sp_stack_config_t *cfg, const char *bin);
/* create | ls | rm | exec through the API; returns the exit code (exec: the command's). */
int sp_client_main(const sp_stack_config_t *cfg, const char *cmd, int argc, char **argv);
/* space cp (space_cp.c), with the API's address and key. */
int sp__client_cp(const char *host, int port, const char *key, int argc, char **argv);
/* `space events [--follow] [ID]` (space_events.c). */
int sp__client_events(const char *host, int port, const char *key, int argc, char **argv);
/* `space creds add|ls|rm|rotate` (space_creds.c): values from stdin, never argv. */
int sp__client_creds(const char *host, int port, const char *key, int argc, char **argv);
/* The directory of the SPACE programs: cfg->bin_dir, else that of the running program (heap). */
char *sp_stack_bin_dir(const sp_stack_config_t *cfg);

/* Internals shared by space_stack.c, space_nats.c and space_pg.c. */

typedef struct {
    const sp_stack_config_t *cfg;
    char *home;    /* absolute, symlinks resolved */
    char *run_dir; /* home/run */
    char *log_dir; /* home/log */
} sp_stack_t;

/* What one component looks like after up or a status probe. */
typedef struct {
    pid_t pid;    /* 0: not running */
    bool started; /* started by this command (not found running) */
    int port;
    char *url; /* heap; NULL when not running */
} sp_stack_part_t;

#define SP_STACK_PART_WIDTH 15 /* name column of the one-line reports */

/* "home/rel" (heap). */
char *sp__stack_path(const sp_stack_t *st, const char *rel);
/* Creates dir with mode if missing (the mode is applied only when it creates it). -errno. */
int sp__stack_mkdir(const char *dir, mode_t mode);
/* Prints "<name> <state> pid <pid> <url>" for a report. */
void sp__stack_report(const char *name, const char *state, const sp_stack_part_t *part);
/* Prints msg for a process that died or failed, then the tail of its log. */
void sp__stack_fail_log(const char *msg, const char *log_path);
void sp__stack_part_dispose(sp_stack_part_t *part);

/* After the daemons are up: the gateway's URL (NULL when it does not run) and an API key for
 * tenant SP_STACK_TENANT: the one space.env already holds if it is still valid, else a new
 * one. Returns 0, or -1 after printing why. */
int sp__api_up(const sp_stack_t *st, const char *pg_url, char **ret_api_url, char **ret_api_key);

/* Each returns 0 after printing its report line, or -1 after printing why it failed. */
int sp__nats_up(const sp_stack_t *st, sp_stack_part_t *ret_part);
int sp__nats_down(const sp_stack_t *st);
/* Fills part (pid 0 when not running); never fails. */
void sp__nats_probe(const sp_stack_t *st, sp_stack_part_t *ret_part);

/* Checks (and prepares) what PostgreSQL needs before anything is started, so that a SPACE_HOME
 * it cannot use fails up front; does nothing when it runs already. */
int sp__pg_preflight(const sp_stack_t *st);
int sp__pg_up(const sp_stack_t *st, sp_stack_part_t *ret_part);

/* Identities (space_identity.c, docs/trust.md). */
/* home/creds (heap). */
char *sp__identity_dir(const char *home);
/* Makes the credentials of every identity the stack runs (operator, eventlog, scheduler,
 * gateway, worker-<worker_id>, egressd-<worker_id>, reader) that are not there yet; existing
 * ones are kept. 0, or -1 after printing why. */
int sp__identity_up(const sp_stack_t *st, const char *worker_id);
/* Appends nats.conf's authorization block for every identity with credentials in dir.
 * Negative errno / SP_ECONFIG (a malformed .nkpub). */
int sp__identity_conf(const char *dir, sp_buf_t *out);
/* As the operator: the stream (deny_delete, deny_purge), the snapshot bucket and the durables
 * of the contract of every identity in the creds directory (only that one when only is not
 * NULL). Existing ones are kept. 0, or -1 after printing why. */
int sp__identity_js_up(const sp_stack_t *st, const char *nats_url, const char *only);
/* Whether identity name can connect (retried for a few seconds: a reload takes a moment). */
int sp__identity_check(const sp_stack_t *st, const char *nats_url, const char *name);
/* `space identity add KIND [INSTANCE]`: makes (or keeps) its credentials; its name into
 * ret_name. 0, or -1 after printing why. */
int sp__identity_add(const sp_stack_t *st, const char *kind, const char *instance,
                     char ret_name[SP_IDENTITY_MAX + 1]);
/* Prints the identities that have credentials, one a line. */
int sp__identity_list(const sp_stack_t *st);
/* `space identity add|ls|conf` (space_stack.c). */
int sp_stack_identity(const sp_stack_config_t *cfg, int argc, char **argv);
/* Rewrites nats.conf of a running nats-server (with its current port) and has it reload
 * (SIGHUP). 0 when it runs and was told, 1 when none runs, -1 after printing why. */
int sp__nats_reload(const sp_stack_t *st);
int sp__pg_down(const sp_stack_t *st);
void sp__pg_probe(const sp_stack_t *st, sp_stack_part_t *ret_part);

#endif
