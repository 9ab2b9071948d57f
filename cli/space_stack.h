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
#include <stdio.h>
#include <sys/types.h>

#include "buf.h"
#include "contract.h"
#include "httpc.h"
#include "sse.h"

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
    int64_t stream_max_age_s, stream_max_bytes; /* SPACE_EVENTS's limits; -1: none */
    int64_t nats_nodes;      /* nats-server nodes `up` runs as one cluster (1: no cluster) */
    int64_t stream_replicas; /* copies of each stream; 0: min(3, nats_nodes) */
} sp_stack_config_t;

#define SP_STACK_GATEWAY_PORT_FILE "space-gateway.port"
#define SP_STACK_TENANT            "default" /* tenant of the first API key */

int sp_stack_up(const sp_stack_config_t *cfg);
int sp_stack_down(const sp_stack_config_t *cfg, bool purge);
int sp_stack_status(const sp_stack_config_t *cfg);
int sp_stack_env(const sp_stack_config_t *cfg);
/* Publishes a demo sandbox's events and shows the log with space-replay from bin. */
int sp_stack_demo(const sp_stack_config_t *cfg, const char *bin);
/* create | ls | rm | exec | cp | events | creds | keys through the API; returns the exit code
 * (exec: the command's). argv starts after the command's name; each command parses its own
 * options and prints its own usage for --help. */
int sp_client_main(const sp_stack_config_t *cfg, const char *cmd, int argc, char **argv);
/* The usage of one client command on out (NULL if cmd is not one). */
bool sp_client_usage(const char *cmd, FILE *out);

/* The API the client commands talk to (space_client.c): from $SPACE_API_URL and
 * $SPACE_API_KEY, else $SPACE_HOME/space.env. key is borrowed from the environment. */
typedef struct {
    char host[64];
    int port;
    const char *key;
} sp_api_t;

/* One request, the answer in r (sp_httpc_resp_free it). accept, body: NULL for none;
 * timeout_ms 0: a day (transfers, commands). A transport failure is printed as
 * "space: METHOD PATH: error" and returned (< 0); r is then untouched. */
int sp__api_call(const sp_api_t *api, const char *method, const char *path, const char *accept,
                 const char *body, size_t body_len, int timeout_ms, sp_httpc_resp_t *r);
/* An SSE request (Accept: text/event-stream): fn gets each event as it arrives. idle_ms: the
 * longest quiet between reads (0: none). Returns as sp_httpc_stream, r as there (a non-2xx
 * answer's body collected). */
int sp__api_sse(const sp_api_t *api, const char *method, const char *path, const char *body,
                size_t body_len, int idle_ms, sp_sse_fn fn, void *arg, sp_httpc_resp_t *r);
/* Prints "<who>: HTTP <status>: <message>" (the API's JSON message, else the body) and returns
 * SP_STACK_EXIT_FAIL. */
int sp__api_error(const char *who, const sp_httpc_resp_t *r);
/* "--name V" / "--name=V" at argv[*i]: V (argv[*i] advanced past it), or NULL. */
const char *sp__opt_value(int argc, char **argv, int *i, const char *name);

/* Appends ,"name":{"K":"V",...} for the n K=V arguments of list; with from_env, a bare K takes
 * the value of K in this environment (docker's --env K). -1 (printed) for an empty K, or a bare
 * K without from_env or not set. */
int sp__put_map(sp_buf_t *b, const char *name, char **list, size_t n, bool from_env);

/* Prints nrows rows of ncols cells (cells[row * ncols + col]; row 0 the heads; NULL = "-"),
 * each column as wide as its widest cell, two spaces apart (space_table.c). */
#define SP_TABLE_MAX_COLS 16
void sp__table_print(FILE *out, const char *const *cells, size_t nrows, size_t ncols);

/* space exec (space_exec.c). */
int sp__client_exec(const sp_api_t *api, int argc, char **argv);
/* space cp (space_cp.c). */
int sp__client_cp(const sp_api_t *api, int argc, char **argv);
/* `space events [--follow] [ID]` (space_events.c). */
int sp__client_events(const sp_api_t *api, int argc, char **argv);
/* `space creds add|ls|rm|rotate` (space_creds.c): values from stdin, never argv. */
int sp__client_creds(const sp_api_t *api, int argc, char **argv);
/* `space keys create|ls|revoke` (space_keys.c): /v1/keys with the admin key. */
int sp__client_keys(const sp_api_t *api, int argc, char **argv);
/* `space creds rotate-master`: a new master key for home's credstore (space_creds.c). */
int sp__creds_rotate_master(const char *home);
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

/* Templates (space_templates.c). Waits until every template the running worker was told to
 * prepare is ready and, when api_url is not NULL, listed by GET /v1/templates; prints a line
 * every few seconds while one is made. -1 after printing why: a build failed (its name and
 * error), the worker exited (its log), or hours passed. */
int sp__templates_wait(const sp_stack_t *st, const char *api_url, const char *api_key);
/* Whether the running worker reports a failed template (its name into name). */
bool sp__templates_failed(const sp_stack_t *st, char *name, size_t len);
/* One line per template of the running worker's status (`space status`). */
void sp__templates_report(const sp_stack_t *st);

/* The replicas of the streams: cfg's, or min(3, nodes). */
int sp__stack_replicas(const sp_stack_config_t *cfg);
/* Each returns 0 after printing its report line, or -1 after printing why it failed. */
int sp__nats_up(const sp_stack_t *st, sp_stack_part_t *ret_part);
int sp__nats_down(const sp_stack_t *st);
/* Fills part (pid 0 when not running; url: every running node's, comma-separated); never
 * fails. */
void sp__nats_probe(const sp_stack_t *st, sp_stack_part_t *ret_part);
/* `space status`'s lines of the nodes (a cluster's say which leads JetStream and
 * SPACE_EVENTS); whether all run. exists: the home exists. */
bool sp__nats_status(const sp_stack_t *st, bool exists);

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
int sp__identity_list(const sp_stack_t *st, bool json);
/* `space identity rotate NAME --grace S` (docs/trust.md, "Rotating a key"): NAME's .pub kept
 * as NAME@<now + S>.pub, a new NAME.key and NAME.pub. 0, or -1 after printing why. */
int sp__identity_rotate(const sp_stack_t *st, const char *name, long long grace_s);
/* The identities that have credentials in dir (<name>.nkpub), sorted; heap array of heap
 * strings (free with sp__identity_names_free). -errno when dir cannot be read. */
int sp__identity_names(const char *dir, char ***ret_names, size_t *ret_n);
void sp__identity_names_free(char **names, size_t n);

/* Internal platforms (space_platform.c, docs/platforms.md). */
/* "T1,T2,..." -> distinct tenant ids (heap; free with sp__platform_tenants_free). -EINVAL or
 * -E2BIG after printing why. */
int sp__platform_tenants_parse(const char *list, char ***ret_tenants, size_t *ret_n);
void sp__platform_tenants_free(char **tenants, size_t n);
/* Replaces dir/<identity>.tenants (by rename) with tenants and prints it. -errno after
 * printing why. */
int sp__platform_tenants_write(const char *dir, const char *identity, char **tenants, size_t n);
/* `space platform ls`: each platform of dir and its tenants. 0, or -1 after printing why. */
int sp__platform_list(const char *dir, bool json);
/* `space platform publish NAME ...` (argv: what follows NAME): the exit code. */
int sp__platform_publish(const char *creds_dir, const char *nats_url, const char *pg_url,
                         const char *name, int argc, char **argv);
/* `space platform add|ls|publish` (space_stack.c). */
int sp_stack_platform(const sp_stack_config_t *cfg, int argc, char **argv);
#define SP_STACK_PLATFORM_USAGE                                                                    \
    "usage: space platform add NAME --tenants T1,T2 | ls [--json]\n"                               \
    "       space platform publish NAME --tenant T create TEMPLATE [--timeout S] [--wait-s N]\n"   \
    "       space platform publish NAME --tenant T delete|pause|resume|suspend ID [--wait-s N]\n"  \
    "       space platform publish NAME --tenant T timeout ID --timeout S [--wait-s N]\n"
#define SP_STACK_IDENTITY_USAGE                                                                    \
    "usage: space identity add KIND [INSTANCE] | ls [--json] | conf\n"                             \
    "       space identity rotate NAME [--grace SECONDS]\n"
/* `space identity add|ls|conf` (space_stack.c). */
int sp_stack_identity(const sp_stack_config_t *cfg, int argc, char **argv);
/* Rewrites nats.conf of a running nats-server (with its current port) and has it reload
 * (SIGHUP). 0 when it runs and was told, 1 when none runs, -1 after printing why. */
int sp__nats_reload(const sp_stack_t *st);
int sp__pg_down(const sp_stack_t *st);
void sp__pg_probe(const sp_stack_t *st, sp_stack_part_t *ret_part);

#endif
