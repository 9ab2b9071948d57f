/* `space up|down|status|env`: the stack directory, the command lock, the environment file and
 * the SPACE daemons. nats-server and PostgreSQL have their own files (space_nats.c,
 * space_pg.c). Layout and contract in space_stack.h. */
#include "space_stack.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "checkpoint.h"
#include "contract.h"
#include "error.h"
#include "log.h"
#include "reduce.h" /* SP_ID_MAX */
#include "space_proc.h"
#include "cred.h"
#include "tlsca.h"
#include "metrics.h"
#include "xmalloc.h"

#define MARKER                 ".space-home"
#define ENV_FILE               "space.env"
#define DAEMON_SETTLE_MS       300 /* a daemon still alive after this did not die at startup */
#define DAEMON_STOP_TIMEOUT_MS 10000
#define LOG_TAIL_BYTES         2048

extern char **environ;

/* The SPACE daemons `space up` starts, in start order (stopped in reverse), after nats-server
 * and PostgreSQL. Each is a program in the bin directory; its name is also its process name,
 * pid file (run/<name>.pid) and log (log/<name>.log). One line per daemon: gateway, scheduler
 * and worker go here when they exist. A program that is not built is skipped. */
/* In start order (stopped in reverse). Each gets SPACE_NATS_URL, SPACE_PG_URL, SPACE_HOME,
 * SPACE_LOG_FORMAT, SPACE_CREDS_DIR and its SPACE_IDENTITY (its kind; worker and egressd with
 * the worker id) in its environment, plus the arguments daemon_args gives it. */
static const struct daemon_def {
    const char *name;
    sp_kind_t kind;
} daemons[] = {
    {"space-eventlog", SP_KIND_EVENTLOG},
    {"space-scheduler", SP_KIND_SCHEDULER},
    {"space-worker", SP_KIND_WORKER},
    /* Its ports and upstream resolver come from SPACE_EGRESS_PROXY_PORT,
     * SPACE_EGRESS_DNS_PORT (read by the worker too, so both agree) and SPACE_UPSTREAM_DNS. */
    /* Before egressd, which asks it for credentials (fail closed until it answers). Its master
     * key is $SPACE_HOME/credstore/master.key (credstore_key_up). */
    {"space-credstore", SP_KIND_CREDSTORE},
    {"space-egressd", SP_KIND_EGRESSD},
    {"space-gateway", SP_KIND_GATEWAY},
};
#define N_DAEMONS (sizeof(daemons) / sizeof(daemons[0]))

char *sp__stack_path(const sp_stack_t *st, const char *rel)
{
    return sp_xasprintf("%s/%s", st->home, rel);
}

int sp__stack_mkdir(const char *dir, mode_t mode)
{
    struct stat sb;

    if (mkdir(dir, mode) == 0)
        return 0;
    if (errno != EEXIST)
        return -errno;
    if (stat(dir, &sb) < 0)
        return -errno;
    return S_ISDIR(sb.st_mode) ? 0 : -ENOTDIR;
}

int sp__stack_replicas(const sp_stack_config_t *cfg)
{
    if (cfg->stream_replicas > 0)
        return (int)cfg->stream_replicas;
    return cfg->nats_nodes >= 3 ? 3 : cfg->nats_nodes > 1 ? (int)cfg->nats_nodes : 1;
}

void sp__stack_report(const char *name, const char *state, const sp_stack_part_t *part)
{
    if (part && part->pid > 0 && part->url)
        printf("%-*s %-8s pid %-7d %s\n", SP_STACK_PART_WIDTH, name, state, (int)part->pid,
               part->url);
    else if (part && part->pid > 0)
        printf("%-*s %-8s pid %d\n", SP_STACK_PART_WIDTH, name, state, (int)part->pid);
    else
        printf("%-*s %s\n", SP_STACK_PART_WIDTH, name, state);
    fflush(stdout);
}

void sp__stack_fail_log(const char *msg, const char *log_path)
{
    fflush(stdout);
    fprintf(stderr, "space: %s; last lines of %s:\n", msg, log_path);
    sp_proc_log_tail(log_path, LOG_TAIL_BYTES, stderr);
}

void sp__stack_part_dispose(sp_stack_part_t *part)
{
    free(part->url);
    part->url = NULL;
}

/* Characters a stack path may hold: the path goes unquoted into space.env (sourced by shells),
 * quoted into nats.conf, and into PostgreSQL's comma-separated unix_socket_directories. */
static bool path_chars_ok(const char *s)
{
    for (; *s; s++) {
        if (!isalnum((unsigned char)*s) && !strchr("/._+:@=-", *s))
            return false;
    }
    return true;
}

static bool home_chars_ok(const char *home)
{
    if (path_chars_ok(home))
        return true;
    fprintf(stderr, "space: SPACE_HOME %s may only hold letters, digits and / . _ + : @ = -\n",
            home);
    return false;
}

/* A PostgreSQL role or database name that needs no quoting anywhere (URI, SQL, shell). */
static bool pg_name_ok(const char *s)
{
    size_t len = strlen(s);

    if (len == 0 || len > 63 || isdigit((unsigned char)*s))
        return false;
    for (; *s; s++) {
        if (!isalnum((unsigned char)*s) && *s != '_')
            return false;
    }
    return true;
}

static bool host_ok(const char *s)
{
    size_t len = strlen(s);

    if (len == 0 || len > 253)
        return false;
    for (; *s; s++) {
        if (!isalnum((unsigned char)*s) && !strchr(".:-_", *s))
            return false;
    }
    return true;
}

static int validate(const sp_stack_config_t *cfg)
{
    sp_log_format_t fmt;

    if (!cfg->home || !*cfg->home) {
        fprintf(stderr, "space: SPACE_HOME is empty\n");
        return -1;
    }
    if (!host_ok(cfg->nats_host)) {
        fprintf(stderr, "space: SPACE_NATS_HOST '%s' is not a host name or address\n",
                cfg->nats_host);
        return -1;
    }
    if (cfg->stream_replicas > cfg->nats_nodes) {
        fprintf(stderr,
                "space: SPACE_STREAM_REPLICAS %lld needs as many nats-server nodes "
                "(SPACE_NATS_NODES is %lld)\n",
                (long long)cfg->stream_replicas, (long long)cfg->nats_nodes);
        return -1;
    }
    if (!pg_name_ok(cfg->pg_user) || !pg_name_ok(cfg->pg_db)) {
        fprintf(stderr,
                "space: SPACE_PG_USER '%s' and SPACE_PG_DB '%s' must be 1-63 letters, "
                "digits or '_', not starting with a digit\n",
                cfg->pg_user, cfg->pg_db);
        return -1;
    }
    if (!cfg->nats_server || !*cfg->nats_server || !cfg->pg_bin_dir || !*cfg->pg_bin_dir ||
        !cfg->pg_os_user || !*cfg->pg_os_user) {
        fprintf(stderr, "space: SPACE_NATS_SERVER, SPACE_PG_BIN_DIR and SPACE_PG_OS_USER must "
                        "not be empty\n");
        return -1;
    }
    if (sp_log_format_parse(cfg->log_format ? cfg->log_format : "", &fmt) < 0) {
        fprintf(stderr, "space: SPACE_LOG_FORMAT '%s' is neither kv nor json\n",
                cfg->log_format ? cfg->log_format : "");
        return -1;
    }
    return 0;
}

static char *absolute(const char *path)
{
    char cwd[PATH_MAX];

    if (path[0] == '/')
        return sp_xstrdup(path);
    if (!getcwd(cwd, sizeof(cwd)))
        return NULL;
    return sp_xasprintf("%s/%s", cwd, path);
}

static int mkdir_p(const char *path, mode_t mode)
{
    char *copy = sp_xstrdup(path);
    int r = 0;

    for (char *s = strchr(copy + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        r = sp__stack_mkdir(copy, mode);
        *s = '/';
        if (r < 0)
            goto out;
    }
    r = sp__stack_mkdir(copy, mode);
out:
    free(copy);
    return r;
}

/* True when dir holds nothing, or only what `space up` makes. */
static bool created_by_space(const char *home)
{
    char *marker = sp_xasprintf("%s/" MARKER, home), *env = sp_xasprintf("%s/" ENV_FILE, home);
    bool yes = access(marker, F_OK) == 0 || access(env, F_OK) == 0;

    free(marker);
    free(env);
    return yes;
}

static bool dir_empty(const char *dir)
{
    struct dirent *de;
    bool empty = true;
    DIR *d = opendir(dir);

    if (!d)
        return false;
    while (empty && (de = readdir(d)))
        empty = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0;
    closedir(d);
    return empty;
}

static void stack_dispose(sp_stack_t *st)
{
    free(st->home);
    free(st->run_dir);
    free(st->log_dir);
}

/* Resolves $SPACE_HOME into st. With create, makes it (and run/, log/, the marker) and refuses
 * a non-empty directory that `space up` did not create: `space down --purge` deletes what holds
 * the marker, so the marker must never land in someone's own directory. Returns 1 when the
 * directory exists, 0 when it does not (st->home is then the absolute path as given), -1 after
 * printing an error. */
static int stack_open(const sp_stack_config_t *cfg, bool create, sp_stack_t *st)
{
    char resolved[PATH_MAX], *abs, *marker;
    struct stat sb;
    int r, fd;

    *st = (sp_stack_t){.cfg = cfg};
    abs = absolute(cfg->home);
    if (!abs) {
        fprintf(stderr, "space: cannot tell the current directory: %s\n", strerror(errno));
        return -1;
    }
    if (create) {
        if (!home_chars_ok(abs)) {
            free(abs);
            return -1;
        }
        if (stat(abs, &sb) == 0 && S_ISDIR(sb.st_mode) && !created_by_space(abs) &&
            !dir_empty(abs)) {
            fprintf(stderr,
                    "space: %s is not empty and was not made by `space up` (no " MARKER
                    "): choose a new or empty SPACE_HOME\n",
                    abs);
            free(abs);
            return -1;
        }
        if ((r = mkdir_p(abs, 0755)) < 0) {
            fprintf(stderr, "space: cannot create %s: %s\n", abs, strerror(-r));
            free(abs);
            return -1;
        }
    }
    if (!realpath(abs, resolved)) {
        if (errno == ENOENT && !create) {
            st->home = abs;
            return 0;
        }
        fprintf(stderr, "space: cannot resolve %s: %s\n", abs, strerror(errno));
        free(abs);
        return -1;
    }
    free(abs);
    if (!home_chars_ok(resolved))
        return -1;
    st->home = sp_xstrdup(resolved);
    st->run_dir = sp__stack_path(st, "run");
    st->log_dir = sp__stack_path(st, "log");
    if (!create)
        return 1;

    marker = sp__stack_path(st, MARKER);
    fd = open(marker, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    r = fd < 0 ? -errno : 0;
    if (fd >= 0)
        close(fd);
    free(marker);
    if (r == 0)
        r = sp__stack_mkdir(st->run_dir, 0755);
    if (r == 0)
        r = sp__stack_mkdir(st->log_dir, 0755);
    if (r < 0) {
        fprintf(stderr, "space: cannot set up %s: %s\n", st->home, strerror(-r));
        stack_dispose(st);
        return -1;
    }
    return 1;
}

/* Serializes space commands on one home (two `space up` at once would both start servers).
 * Returns the lock's descriptor (close-on-exec, so no daemon inherits it) or -1. */
static int stack_lock(const sp_stack_t *st)
{
    char *path = sp__stack_path(st, "run/space.lock");
    int fd;

    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        fprintf(stderr, "space: cannot open %s: %s\n", path, strerror(errno));
        goto out;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        fprintf(stderr, "space: waiting for another space command on %s\n", st->home);
        if (flock(fd, LOCK_EX) < 0) {
            fprintf(stderr, "space: cannot lock %s: %s\n", path, strerror(errno));
            close(fd);
            fd = -1;
        }
    }
out:
    free(path);
    return fd;
}

static int write_env_file(const sp_stack_t *st, const char *nats_url, const char *pg_url,
                          const char *api_url, const char *api_key)
{
    char *path = sp__stack_path(st, ENV_FILE), *tmp = sp__stack_path(st, ENV_FILE ".tmp");
    /* Single quotes because the PostgreSQL URI holds '&'; no value can hold a quote (paths
     * and names are checked in validate and stack_open; keys and URLs are made here). */
    char *api = api_url && api_key
                    ? sp_xasprintf("SPACE_API_URL='%s'\nSPACE_API_KEY='%s'\n", api_url, api_key)
                    : sp_xstrdup("");
    char *creds = sp__identity_dir(st->home);
    /* SPACE_CREDS_DIR: where tools find their identity's credentials (busid.h); which identity
     * a tool is, is its own business (space-replay: reader, tests: SPACE_TEST_IDENTITY). */
    char *text = sp_xasprintf("# Written by `space up`. In a shell: set -a; . %s; set +a\n"
                              "SPACE_HOME='%s'\nSPACE_NATS_URL='%s'\nSPACE_PG_URL='%s'\n"
                              "SPACE_CREDS_DIR='%s'\n%s",
                              path, st->home, nats_url, pg_url, creds, api);
    free(creds);
    explicit_bzero(api, strlen(api));
    free(api);
    size_t len = strlen(text);
    int fd, r = 0;

    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || fchmod(fd, 0600) < 0 || write(fd, text, len) != (ssize_t)len) {
        r = errno ? -errno : -EIO;
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        goto out;
    }
    if (close(fd) < 0 || rename(tmp, path) < 0) {
        r = -errno;
        unlink(tmp);
    }
out:
    if (r < 0)
        fprintf(stderr, "space: cannot write %s: %s\n", path, strerror(-r));
    free(path);
    free(tmp);
    explicit_bzero(text, strlen(text));
    free(text);
    return r;
}

/* True when space.env exists and its value for key is not value. */
static bool env_file_differs(const sp_stack_t *st, const char *key, const char *value)
{
    char *path = sp__stack_path(st, ENV_FILE), *old = NULL;
    bool differs = sp_env_file_get(path, key, &old) == 0 && strcmp(old, value) != 0;

    free(old);
    free(path);
    return differs;
}

char *sp_stack_bin_dir(const sp_stack_config_t *cfg)
{
    char exe[PATH_MAX], *slash;
    ssize_t n;

    if (cfg->bin_dir && *cfg->bin_dir)
        return sp_xstrdup(cfg->bin_dir);
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return sp_xstrdup(".");
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    return sp_xstrdup(exe[0] ? exe : "/");
}

#define DAEMON_ENV_OURS 6

/* The caller's environment with the stack's variables set (replacing any inherited ones),
 * identity included. The array and its DAEMON_ENV_OURS new strings are heap; free with
 * free_env. */
static char **daemon_env(const sp_stack_t *st, const char *nats_url, const char *pg_url,
                         const char *identity)
{
    static const char *const ours[DAEMON_ENV_OURS] = {
        "SPACE_HOME=",       "SPACE_NATS_URL=",  "SPACE_PG_URL=",
        "SPACE_LOG_FORMAT=", "SPACE_CREDS_DIR=", "SPACE_IDENTITY="};
    size_t n = 0, k = 0;
    char **env, *creds = sp__identity_dir(st->home);

    while (environ[n])
        n++;
    env = sp_xcalloc(n + DAEMON_ENV_OURS + 1, sizeof(*env));
    for (size_t i = 0; i < n; i++) {
        bool skip = false;

        for (size_t j = 0; j < DAEMON_ENV_OURS; j++)
            skip = skip || strncmp(environ[i], ours[j], strlen(ours[j])) == 0;
        if (!skip)
            env[k++] = environ[i];
    }
    env[k++] = sp_xasprintf("SPACE_HOME=%s", st->home);
    env[k++] = sp_xasprintf("SPACE_NATS_URL=%s", nats_url);
    env[k++] = sp_xasprintf("SPACE_PG_URL=%s", pg_url);
    env[k++] = sp_xasprintf("SPACE_LOG_FORMAT=%s", st->cfg->log_format);
    env[k++] = sp_xasprintf("SPACE_CREDS_DIR=%s", creds);
    env[k++] = sp_xasprintf("SPACE_IDENTITY=%s", identity);
    env[k] = NULL;
    free(creds);
    return env;
}

static void free_env(char **env)
{
    size_t n = 0;

    while (env[n])
        n++;
    for (size_t i = n - DAEMON_ENV_OURS; i < n; i++)
        free(env[i]);
    free(env);
}

static int daemon_down(const sp_stack_t *st, const char *name)
{
    char *pidfile = sp_xasprintf("%s/%s.pid", st->run_dir, name);
    int r = 0, s;
    pid_t pid;

    if (sp_proc_pidfile_check(pidfile, name, &pid) == 1) {
        s = sp_proc_stop(pid, name, SIGTERM, DAEMON_STOP_TIMEOUT_MS);
        if (s < 0) {
            fprintf(stderr, "space: cannot stop %s (pid %d): %s\n", name, (int)pid, strerror(-s));
            r = -1;
            goto out;
        }
        printf("%-*s stopped  pid %d%s\n", SP_STACK_PART_WIDTH, name, (int)pid,
               s == 1 ? " (killed after 10 s)" : "");
    }
    unlink(pidfile);
    /* A daemon removes its metrics port file when it stops; one killed leaves it behind. */
    char *mfile = sp_xasprintf("%s/%s" SP_METRICS_PORT_SUFFIX, st->run_dir, name);
    unlink(mfile);
    free(mfile);
out:
    free(pidfile);
    return r;
}

/* Command line of a daemon (heap strings, NULL-terminated; free with free_args). */
static char **daemon_args(const sp_stack_t *st, const char *name)
{
    char **a = sp_xcalloc(16, sizeof(char *));
    size_t n = 0;
    a[n++] = sp_xstrdup(name);
    if (strcmp(name, "space-gateway") == 0) {
        a[n++] = sp_xstrdup("--port");
        a[n++] = sp_xasprintf("%lld", (long long)st->cfg->api_port);
        a[n++] = sp_xstrdup("--port-file");
        a[n++] = sp_xasprintf("%s/%s", st->run_dir, SP_STACK_GATEWAY_PORT_FILE);
        /* Large request bodies (file uploads) spill here, not into the heap or /tmp. */
        char *gwdir = sp_xasprintf("%s/gateway", st->home);
        a[n++] = sp_xstrdup("--tmp-dir");
        a[n++] = sp_xasprintf("%s/tmp", gwdir);
        (void)mkdir_p(a[n - 1], 0700);
        free(gwdir);
    } else if (strcmp(name, "space-eventlog") == 0) {
        /* The witness copy of the checkpoints (docs/audit.md); space-replay verify reads it
         * there by default. */
        a[n++] = sp_xstrdup("--checkpoint-file");
        a[n++] = sp_xasprintf("%s/" SP_CKPT_FILE_DEFAULT, st->home);
    } else if (strcmp(name, "space-worker") == 0) {
        a[n++] = sp_xstrdup("--state-dir");
        a[n++] = sp_xasprintf("%s/worker", st->home);
        /* The snapshot store: one per stack, so every worker of it can resume any sandbox. */
        a[n++] = sp_xstrdup("--snapshot-dir");
        a[n++] = sp_xasprintf("%s/snapshots", st->home);
    }
    return a;
}

/* Whether `up` should start name (the daemons option lists it). */
static bool requested(const sp_stack_config_t *cfg, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = cfg->daemons; p && *p;) {
        size_t k = strcspn(p, ",");
        if (k == n && strncmp(p, name, n) == 0)
            return true;
        p += k;
        p += *p == ',';
    }
    return false;
}

/* Whether the worker program exists (`up` skips a daemon that is not built). */
static bool worker_built(const sp_stack_t *st)
{
    char *dir = sp_stack_bin_dir(st->cfg), *prog = sp_xasprintf("%s/space-worker", dir);
    bool ok = access(prog, X_OK) == 0;
    free(prog);
    free(dir);
    return ok;
}

static void free_args(char **a)
{
    for (size_t i = 0; a[i]; i++)
        free(a[i]);
    free(a);
}

/* The deployment CA (tlsca.h) under ca/: made on the first `up`, kept afterwards. Its
 * certificate is what sandboxes will trust once space-egressd terminates TLS with leaves
 * minted from it (docs/egress.md). */
static int ca_up(const sp_stack_t *st)
{
    char err[SP_CA_ERR_MAX] = "", host[128] = "localhost";
    char *dir = sp__stack_path(st, "ca");
    gethostname(host, sizeof(host) - 1);
    char *cn = sp_xasprintf("SPACE deployment CA (%.100s)", host);
    int r = sp_ca_ensure(dir, cn, err);
    if (r < 0)
        fprintf(stderr, "space: deployment CA in %s: %s\n", dir, err);
    else
        printf("%-*s ready    %s/" SP_CA_CERT_FILE "\n", SP_STACK_PART_WIDTH, "deployment CA", dir);
    free(cn);
    free(dir);
    return r < 0 ? -1 : 0;
}

/* space-credstore's master key (docs/credentials.md): 32 random bytes, mode 0600, made on the
 * first `up` and kept afterwards (the credentials are sealed under it). */
static int credstore_key_up(const sp_stack_t *st)
{
    char *dir = sp__stack_path(st, "credstore"), *path = sp__stack_path(st, "credstore/master.key");
    int r = sp__stack_mkdir(dir, 0700);
    if (r == 0) {
        r = sp_cred_key_create(path);
        if (r == -EEXIST)
            r = 0;
    }
    if (r < 0)
        fprintf(stderr, "space: credstore master key %s: %s\n", path, strerror(-r));
    free(dir);
    free(path);
    return r < 0 ? -1 : 0;
}

/* Starts the daemons that are not running. restart: the NATS or PostgreSQL URL changed (a
 * server was restarted on another ephemeral port), so running daemons are stopped first and
 * started again with the new environment. */
static int daemons_up(const sp_stack_t *st, const char *nats_url, const char *pg_url, bool restart)
{
    pid_t started[N_DAEMONS] = {0};
    char *dir = sp_stack_bin_dir(st->cfg);
    bool any = false;
    int r = 0, e, status;

    /* With a credstore to hold the data keys, the workers seal captured output and command
     * lines, the gateway leaves command lines out of its intents and the event log refuses
     * them in plaintext (docs/audit.md, Sealing), unless SPACE_SEAL_OUTPUT says otherwise. */
    if (requested(st->cfg, "space-credstore"))
        (void)setenv("SPACE_SEAL_OUTPUT", "true", 0);
    /* Every daemon serves its metrics on a loopback port of its own, written to
     * run/<name>.metrics (docs/metrics.md), unless SPACE_METRICS_ADDR says otherwise ("off"). The
     * gateway's are on its API port. */
    (void)setenv("SPACE_METRICS_ADDR", "127.0.0.1:0", 0);

    for (size_t i = 0; i < N_DAEMONS; i++) {
        const char *name = daemons[i].name;
        char *prog = sp_xasprintf("%s/%s", dir, name);
        char *pidfile = sp_xasprintf("%s/%s.pid", st->run_dir, name);
        char *log = sp_xasprintf("%s/%s.log", st->log_dir, name);
        char **argv = daemon_args(st, name);
        bool per_worker = daemons[i].kind == SP_KIND_WORKER || daemons[i].kind == SP_KIND_EGRESSD;
        sp_identity_t id;
        /* sp__identity_up made these names: they parse. */
        (void)sp_identity_format(daemons[i].kind, per_worker ? st->cfg->worker_id : NULL, &id);
        char **env = daemon_env(st, nats_url, pg_url, id.name);
        sp_proc_spec_t spec = {.path = prog,
                               .argv = argv,
                               .envp = env,
                               .cwd = st->home,
                               .log_path = log,
                               .detach = true};
        sp_stack_part_t part = {0};

        if (!requested(st->cfg, name)) {
            free(prog);
            free(pidfile);
            free(log);
            free_args(argv);
            free_env(env);
            continue;
        }
        char failed[SP_ID_MAX + 1];
        if (restart && sp_proc_pidfile_check(pidfile, name, &part.pid) == 1) {
            printf("%-*s restart  (the NATS or PostgreSQL URL changed)\n", SP_STACK_PART_WIDTH,
                   name);
            if (daemon_down(st, name) < 0)
                r = -1;
        } else if (daemons[i].kind == SP_KIND_WORKER &&
                   sp__templates_failed(st, failed, sizeof(failed))) {
            /* Its templates are made at its start: a new one tries the failed one again. */
            printf("%-*s restart  (template %s failed: made again)\n", SP_STACK_PART_WIDTH, name,
                   failed);
            if (daemon_down(st, name) < 0)
                r = -1;
        }
        if (sp_proc_pidfile_check(pidfile, name, &part.pid) == 1) {
            if (!restart)
                sp__stack_report(name, "running", &part);
        } else if (access(prog, X_OK) < 0) {
            printf("%-*s skipped  (%s is not built)\n", SP_STACK_PART_WIDTH, name, prog);
        } else if ((e = sp_proc_spawn(&spec, &started[i])) < 0) {
            fprintf(stderr, "space: cannot start %s: %s\n", prog, strerror(-e));
            r = -1;
        } else {
            (void)sp_proc_pidfile_write(pidfile, started[i]);
            any = true;
        }
        free(prog);
        free(pidfile);
        free(log);
        free_args(argv);
        free_env(env);
    }

    /* One settle period for all of them: a daemon that cannot reach NATS or PostgreSQL, or
     * rejects its configuration, exits right away. */
    if (any)
        sp_proc_sleep_ms(DAEMON_SETTLE_MS);
    for (size_t i = 0; i < N_DAEMONS; i++) {
        const char *name = daemons[i].name;
        sp_stack_part_t part = {.pid = started[i], .started = true};

        if (!started[i])
            continue;
        if (sp_proc_reap(started[i], &status) == 1) {
            char *log = sp_xasprintf("%s/%s.log", st->log_dir, name);
            char *pidfile = sp_xasprintf("%s/%s.pid", st->run_dir, name);
            char msg[128];

            if (WIFEXITED(status))
                snprintf(msg, sizeof(msg), "%s exited at startup with status %d", name,
                         WEXITSTATUS(status));
            else
                snprintf(msg, sizeof(msg), "%s was killed at startup by signal %d", name,
                         WTERMSIG(status));
            sp__stack_fail_log(msg, log);
            unlink(pidfile);
            free(log);
            free(pidfile);
            r = -1;
            continue;
        }
        sp__stack_report(name, "started", &part);
    }
    free(dir);
    return r;
}

int sp_stack_up(const sp_stack_config_t *cfg)
{
    sp_stack_part_t nats = {0}, pg = {0};
    long long t0 = sp_proc_now_ms();
    char *env_path = NULL, *api_url = NULL, *api_key = NULL;
    char *old_api_url = NULL, *old_api_key = NULL;
    int r = SP_STACK_EXIT_FAIL, lock = -1;
    bool moved;
    sp_stack_t st;

    if (validate(cfg) < 0)
        return SP_STACK_EXIT_USAGE;
    if (stack_open(cfg, true, &st) < 0)
        return SP_STACK_EXIT_FAIL;
    lock = stack_lock(&st);
    if (lock < 0)
        goto out;
    printf("space up: %s\n", st.home);
    fflush(stdout);
    /* Credentials first: nats.conf lists their users, and no connection is anonymous. */
    if (sp__pg_preflight(&st) < 0 || sp__identity_up(&st, cfg->worker_id) < 0 ||
        sp__nats_up(&st, &nats) < 0 || sp__pg_up(&st, &pg) < 0)
        goto fail;
    /* What only the operator may create, before any daemon binds to it. */
    if (sp__identity_js_up(&st, nats.url, NULL) < 0)
        goto fail;
    moved = env_file_differs(&st, "SPACE_NATS_URL", nats.url) ||
            env_file_differs(&st, "SPACE_PG_URL", pg.url);
    /* The new URLs now (the daemons read them from here), the API lines kept as they are:
     * whoever reads space.env while `up` runs finds SPACE_API_URL and SPACE_API_KEY in it
     * (each write is a whole new file renamed over the old one), and sp__api_up finds the key
     * to keep. */
    env_path = sp__stack_path(&st, ENV_FILE);
    if (sp_env_file_get(env_path, "SPACE_API_URL", &old_api_url) < 0 ||
        sp_env_file_get(env_path, "SPACE_API_KEY", &old_api_key) < 0) {
        free(old_api_url);
        old_api_url = NULL;
    }
    if (write_env_file(&st, nats.url, pg.url, old_api_url, old_api_key) < 0)
        goto fail;
    if (ca_up(&st) < 0 || credstore_key_up(&st) < 0 || daemons_up(&st, nats.url, pg.url, moved) < 0)
        goto fail;
    if (sp__api_up(&st, pg.url, &api_url, &api_key) < 0 ||
        write_env_file(&st, nats.url, pg.url, api_url, api_key) < 0)
        goto fail;
    if (api_url)
        printf("SPACE_API_URL='%s'\nSPACE_API_KEY is in %s/space.env\n", api_url, st.home);
    fflush(stdout);
    /* Ready means a create of any configured template can be placed. */
    if (requested(cfg, "space-worker") && worker_built(&st) &&
        sp__templates_wait(&st, api_url, api_key) < 0)
        goto fail;

    printf("space up: ready in %.2f s\n"
           "SPACE_NATS_URL='%s'\n"
           "SPACE_PG_URL='%s'\n"
           "environment: %s (set -a; . %s; set +a)\n",
           (double)(sp_proc_now_ms() - t0) / 1000.0, nats.url, pg.url, env_path, env_path);
    r = SP_STACK_EXIT_OK;
    goto out;
fail:
    fprintf(stderr,
            "space up: failed; `space status` shows what runs, `space down` stops it; logs are "
            "in %s\n",
            st.log_dir);
out:
    if (lock >= 0)
        close(lock);
    free(env_path);
    free(api_url);
    free(old_api_url);
    if (api_key) {
        explicit_bzero(api_key, strlen(api_key));
        free(api_key);
    }
    if (old_api_key) {
        explicit_bzero(old_api_key, strlen(old_api_key));
        free(old_api_key);
    }
    sp__stack_part_dispose(&nats);
    sp__stack_part_dispose(&pg);
    stack_dispose(&st);
    return r;
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    if (remove(path) < 0) {
        fprintf(stderr, "space: cannot delete %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Deletes the stack directory. Only one that `space up` made (marker or environment file), never
 * "/", never across a mount point (FTW_MOUNT), never following a symlink (FTW_PHYS). */
static int purge(const sp_stack_t *st)
{
    if (strcmp(st->home, "/") == 0 || !created_by_space(st->home)) {
        fprintf(stderr,
                "space: refusing to delete %s: it holds no " MARKER " or " ENV_FILE
                ", so `space up` did not make it\n",
                st->home);
        return -1;
    }
    if (nftw(st->home, remove_entry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
        return -1;
    printf("space down: deleted %s\n", st->home);
    return 0;
}

/* Runs `space-worker --teardown` on the stack's worker state, if there is one. */
static int worker_teardown(const sp_stack_t *st)
{
    char *state = sp_xasprintf("%s/worker", st->home);
    char *dir = sp_stack_bin_dir(st->cfg), *prog = sp_xasprintf("%s/space-worker", dir);
    char *log = sp_xasprintf("%s/space-worker-teardown.log", st->log_dir);
    char *argv[] = {"space-worker", "--teardown", "--state-dir", state, NULL};
    struct stat sb;
    pid_t pid;
    int r = 0, status = 0;

    if (stat(state, &sb) == 0 && access(prog, X_OK) == 0) {
        sp_proc_spec_t spec = {.path = prog,
                               .argv = argv,
                               .envp = environ,
                               .cwd = st->home,
                               .log_path = log,
                               .detach = false};
        if (sp_proc_spawn(&spec, &pid) < 0 || sp_proc_wait_exit(pid, 120000, &status) < 0 ||
            !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            sp__stack_fail_log("space-worker --teardown failed", log);
            r = -1;
        } else {
            printf("%-*s released its sandboxes and volume\n", SP_STACK_PART_WIDTH, "space-worker");
        }
    }
    free(state);
    free(dir);
    free(prog);
    free(log);
    return r;
}

int sp_stack_down(const sp_stack_config_t *cfg, bool purge_home)
{
    int r = SP_STACK_EXIT_OK, lock = -1, exists;
    struct stat sb;
    sp_stack_t st;

    if (validate(cfg) < 0)
        return SP_STACK_EXIT_USAGE;
    exists = stack_open(cfg, false, &st);
    if (exists < 0)
        return SP_STACK_EXIT_FAIL;
    if (exists == 0) {
        printf("space down: nothing at %s\n", st.home);
        goto out;
    }
    if (stat(st.run_dir, &sb) == 0) {
        lock = stack_lock(&st);
        if (lock < 0) {
            r = SP_STACK_EXIT_FAIL;
            goto out;
        }
    }
    for (size_t i = N_DAEMONS; i-- > 0;) {
        if (daemon_down(&st, daemons[i].name) < 0)
            r = SP_STACK_EXIT_FAIL;
    }
    if (sp__pg_down(&st) < 0)
        r = SP_STACK_EXIT_FAIL;
    if (sp__nats_down(&st) < 0)
        r = SP_STACK_EXIT_FAIL;
    if (r != SP_STACK_EXIT_OK) {
        fprintf(stderr, "space down: something is still running%s\n",
                purge_home ? "; not deleting anything" : "");
        goto out;
    }
    /* Sandboxes outlive a stopped worker (the next one adopts them); a purge must release
     * them and the worker's volume mount before anything can be deleted. */
    if (purge_home && worker_teardown(&st) < 0) {
        fprintf(stderr, "space down: the worker's sandboxes could not all be released; "
                        "not deleting anything\n");
        r = SP_STACK_EXIT_FAIL;
        goto out;
    }
    printf("space down: everything under %s is stopped\n", st.home);
    if (purge_home && purge(&st) < 0)
        r = SP_STACK_EXIT_FAIL;
out:
    if (lock >= 0)
        close(lock);
    stack_dispose(&st);
    return r;
}

/* The port in run/<name>.metrics (the daemon's metrics listener, docs/metrics.md), or 0. */
static int metrics_port(const sp_stack_t *st, const char *name)
{
    char *path = sp_xasprintf("%s/%s" SP_METRICS_PORT_SUFFIX, st->run_dir, name);
    FILE *f = fopen(path, "re");
    char line[16] = "";
    long port = 0;
    free(path);
    if (!f)
        return 0;
    if (fgets(line, sizeof(line), f) && line[0] >= '1' && line[0] <= '9') {
        char *end;
        port = strtol(line, &end, 10);
        if (strcmp(end, "\n") != 0 || port > 65535)
            port = 0;
    }
    fclose(f);
    return (int)port;
}

int sp_stack_status(const sp_stack_config_t *cfg)
{
    sp_stack_part_t pg = {0};
    bool all = true;
    char *dir = NULL;
    sp_stack_t st;
    int exists;

    if (validate(cfg) < 0)
        return SP_STACK_EXIT_USAGE;
    exists = stack_open(cfg, false, &st);
    if (exists < 0)
        return SP_STACK_EXIT_FAIL;
    if (exists == 1)
        sp__pg_probe(&st, &pg);
    all = sp__nats_status(&st, exists == 1);
    sp__stack_report("postgres", pg.pid ? "running" : "stopped", &pg);
    all = all && pg.pid;

    dir = sp_stack_bin_dir(cfg);
    for (size_t i = 0; i < N_DAEMONS; i++) {
        const char *name = daemons[i].name;
        char *pidfile = exists == 1 ? sp_xasprintf("%s/%s.pid", st.run_dir, name) : NULL;
        char *prog = sp_xasprintf("%s/%s", dir, name);
        sp_stack_part_t part = {0};

        if (pidfile && sp_proc_pidfile_check(pidfile, name, &part.pid) == 1) {
            int mport = metrics_port(&st, name);
            if (mport)
                part.url = sp_xasprintf("metrics on port %d", mport);
            sp__stack_report(name, "running", &part);
            sp__stack_part_dispose(&part);
        } else if (access(prog, X_OK) < 0) {
            /* Not built: `space up` skips it, so it does not make the stack incomplete. */
            printf("%-*s absent   (%s is not built)\n", SP_STACK_PART_WIDTH, name, prog);
        } else {
            sp__stack_report(name, "stopped", NULL);
            all = false;
        }
        free(pidfile);
        free(prog);
    }
    free(dir);
    if (exists == 1)
        sp__templates_report(&st);
    sp__stack_part_dispose(&pg);
    stack_dispose(&st);
    return all ? SP_STACK_EXIT_OK : SP_STACK_EXIT_NOT_ALL;
}

int sp_stack_env(const sp_stack_config_t *cfg)
{
    char buf[4096], *path;
    int r = SP_STACK_EXIT_OK, exists;
    sp_stack_t st;
    size_t n;
    FILE *f;

    if (validate(cfg) < 0)
        return SP_STACK_EXIT_USAGE;
    exists = stack_open(cfg, false, &st);
    if (exists < 0)
        return SP_STACK_EXIT_FAIL;
    path = sp__stack_path(&st, ENV_FILE);
    f = fopen(path, "re");
    if (!f) {
        fprintf(stderr, "space: cannot read %s: %s%s\n", path, strerror(errno),
                errno == ENOENT ? " (run `space up` first)" : "");
        r = SP_STACK_EXIT_FAIL;
        goto out;
    }
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, stdout);
    fclose(f);
out:
    free(path);
    stack_dispose(&st);
    return r;
}

/* `space identity add KIND [INSTANCE] | ls | conf` (docs/trust.md). add makes the credentials
 * under $SPACE_HOME/creds (kept when they exist); when this home's nats-server runs, it also
 * rewrites nats.conf, has the server reload it, creates the identity's durables as operator
 * and checks that the identity connects. conf prints the authorization block of every
 * identity in creds/, for the nats.conf of servers `space up` does not run (a cluster). */
/* After an identity's credentials are made: with this home's nats-server running, nats.conf
 * is rewritten and reloaded, the identity must connect, and its durables are made. 0, or -1
 * after printing why. */
static int identity_activate(sp_stack_t *st, const char *name)
{
    sp_stack_part_t nats = {0};
    int rl = sp__nats_reload(st), e;

    if (rl < 0)
        return -1;
    if (rl != 0) {
        printf("no nats-server of %s runs: add the output of `space identity conf` to the "
               "cluster's nats.conf and reload it (docs/trust.md)\n",
               st->home);
        return 0;
    }
    sp__nats_probe(st, &nats);
    /* The new identity connecting shows the reload took effect. */
    e = nats.url ? sp__identity_check(st, nats.url, name) : -ENOTCONN;
    if (e >= 0 && sp__identity_js_up(st, nats.url, name) < 0) {
        sp__stack_part_dispose(&nats);
        return -1;
    }
    if (e < 0)
        fprintf(stderr, "space identity: %s cannot connect to %s: %s\n", name, nats.url,
                sp_strerror(e));
    else
        printf("%s connects to %s\n", name, nats.url);
    sp__stack_part_dispose(&nats);
    return e < 0 ? -1 : 0;
}

/* Stops the daemons of this stack that run as identity name: how many ran. */
static int daemons_down_as(const sp_stack_t *st, const char *name)
{
    int n = 0;
    for (size_t i = 0; i < N_DAEMONS; i++) {
        bool per_worker = daemons[i].kind == SP_KIND_WORKER || daemons[i].kind == SP_KIND_EGRESSD;
        char *pidfile = sp_xasprintf("%s/%s.pid", st->run_dir, daemons[i].name);
        sp_identity_t id;
        pid_t pid;
        if (sp_identity_format(daemons[i].kind, per_worker ? st->cfg->worker_id : NULL, &id) == 0 &&
            strcmp(id.name, name) == 0 &&
            sp_proc_pidfile_check(pidfile, daemons[i].name, &pid) == 1 &&
            daemon_down(st, daemons[i].name) == 0)
            n++;
        free(pidfile);
    }
    return n;
}

/* --grace SECONDS of `space identity rotate`: 0 to ten years; 3600 when absent. */
static int grace_arg(int argc, char **argv, long long *ret)
{
    char *end;
    *ret = 3600;
    if (argc == 2)
        return 0;
    if (argc != 4 || strcmp(argv[2], "--grace") != 0)
        return -1;
    errno = 0;
    *ret = strtoll(argv[3], &end, 10);
    return argv[3][0] >= '0' && argv[3][0] <= '9' && !*end && !errno && *ret <= 315360000LL ? 0
                                                                                            : -1;
}

int sp_stack_identity(const sp_stack_config_t *cfg, int argc, char **argv)
{
    const char *sub = argc > 0 ? argv[0] : "";
    char name[SP_IDENTITY_MAX + 1];
    int r = SP_STACK_EXIT_FAIL, lock = -1, exists, stopped = 0;
    long long grace = 0;
    sp_stack_t st = {0};

    if (validate(cfg) < 0)
        return SP_STACK_EXIT_USAGE;
    if (!((strcmp(sub, "add") == 0 && (argc == 2 || argc == 3)) ||
          ((strcmp(sub, "ls") == 0 || strcmp(sub, "conf") == 0) && argc == 1) ||
          (strcmp(sub, "ls") == 0 && argc == 2 && strcmp(argv[1], "--json") == 0) ||
          (strcmp(sub, "rotate") == 0 && grace_arg(argc, argv, &grace) == 0))) {
        fputs(SP_STACK_IDENTITY_USAGE, stderr);
        return SP_STACK_EXIT_USAGE;
    }
    exists = stack_open(cfg, strcmp(sub, "add") == 0, &st);
    if (exists < 0)
        return SP_STACK_EXIT_FAIL;
    if (exists == 0) {
        fprintf(stderr, "space identity: nothing at %s\n", st.home);
        goto out;
    }
    lock = stack_lock(&st);
    if (lock < 0)
        goto out;
    if (strcmp(sub, "ls") == 0) {
        r = sp__identity_list(&st, argc == 2) < 0 ? SP_STACK_EXIT_FAIL : SP_STACK_EXIT_OK;
        goto out;
    }
    if (strcmp(sub, "rotate") == 0) {
        if (sp__identity_rotate(&st, argv[1], grace) < 0)
            goto out;
        /* This stack's daemons that sign as argv[1] start again with the new key; elsewhere
         * (more hosts) the operator copies the files and restarts them within the grace. */
        stopped = daemons_down_as(&st, argv[1]);
        if (stopped == 0)
            printf("%s: no daemon of %s runs as it: restart those that do (other hosts: copy "
                   "the new files there first, docs/trust.md) before the old key's time ends\n",
                   argv[1], st.home);
        r = SP_STACK_EXIT_OK;
        goto out;
    }
    if (strcmp(sub, "conf") == 0) {
        char *dir = sp__identity_dir(st.home);
        sp_buf_t b;
        int e;

        sp_buf_init(&b);
        if ((e = sp__identity_conf(dir, &b)) < 0)
            fprintf(stderr, "space identity: cannot read %s: %s\n", dir, sp_strerror(e));
        else
            fputs(b.data, stdout);
        sp_buf_dispose(&b);
        free(dir);
        r = e < 0 ? SP_STACK_EXIT_FAIL : SP_STACK_EXIT_OK;
        goto out;
    }
    if (sp__identity_add(&st, argv[1], argc == 3 ? argv[2] : NULL, name) < 0) {
        r = SP_STACK_EXIT_USAGE;
        goto out;
    }
    if (identity_activate(&st, name) < 0)
        goto out;
    r = SP_STACK_EXIT_OK;
out:
    if (lock >= 0)
        close(lock);
    stack_dispose(&st);
    /* After the lock: `up` takes it, and starts what was stopped (with the new key). */
    if (stopped > 0 && r == SP_STACK_EXIT_OK)
        r = sp_stack_up(cfg);
    return r;
}

/* `space platform add|ls|publish` (space_platform.c does the work). add is `space identity add
 * platform NAME` plus the tenants file; publish takes no stack lock (it may wait for an
 * outcome for a while, and changes nothing of the stack). */
int sp_stack_platform(const sp_stack_config_t *cfg, int argc, char **argv)
{
    const char *sub = argc > 0 ? argv[0] : "";
    char name[SP_IDENTITY_MAX + 1], **tenants = NULL, *dir = NULL;
    const char *list = NULL;
    size_t n_tenants = 0;
    int r = SP_STACK_EXIT_FAIL, lock = -1, exists;
    sp_stack_t st = {0};

    if (validate(cfg) < 0)
        return SP_STACK_EXIT_USAGE;
    if (strcmp(sub, "add") == 0 && argc >= 3) {
        for (int i = 2; i < argc; i++) {
            if (strncmp(argv[i], "--tenants=", 10) == 0)
                list = argv[i] + 10;
            else if (strcmp(argv[i], "--tenants") == 0 && i + 1 < argc)
                list = argv[++i];
            else
                list = NULL, i = argc; /* anything else: usage */
        }
    }
    bool json = strcmp(sub, "ls") == 0 && argc == 2 && strcmp(argv[1], "--json") == 0;
    if (!((strcmp(sub, "add") == 0 && list) || (strcmp(sub, "ls") == 0 && argc == 1) || json ||
          (strcmp(sub, "publish") == 0 && argc >= 2))) {
        fputs(SP_STACK_PLATFORM_USAGE, stderr);
        return SP_STACK_EXIT_USAGE;
    }
    if (list && sp__platform_tenants_parse(list, &tenants, &n_tenants) < 0)
        return SP_STACK_EXIT_USAGE;
    exists = stack_open(cfg, false, &st);
    if (exists < 0)
        goto out;
    if (exists == 0) {
        fprintf(stderr, "space platform: nothing at %s (space up first)\n", st.home);
        goto out;
    }
    dir = sp__identity_dir(st.home);
    if (strcmp(sub, "publish") == 0) {
        sp_stack_part_t nats = {0}, pg = {0};
        sp__nats_probe(&st, &nats);
        sp__pg_probe(&st, &pg);
        if (!nats.url)
            fprintf(stderr, "space platform: the nats-server of %s does not run\n", st.home);
        else
            r = sp__platform_publish(dir, nats.url, pg.url, argv[1], argc - 2, argv + 2);
        sp__stack_part_dispose(&nats);
        sp__stack_part_dispose(&pg);
        goto out;
    }
    lock = stack_lock(&st);
    if (lock < 0)
        goto out;
    if (strcmp(sub, "ls") == 0) {
        r = sp__platform_list(dir, json) < 0 ? SP_STACK_EXIT_FAIL : SP_STACK_EXIT_OK;
        goto out;
    }
    /* The identity first (its .pub is what the keyring needs to know the platform at all),
     * then its tenants, then nats.conf: from the reload on, it can publish. */
    if (sp__identity_add(&st, "platform", argv[1], name) < 0) {
        r = SP_STACK_EXIT_USAGE;
        goto out;
    }
    if (sp__platform_tenants_write(dir, name, tenants, n_tenants) < 0 ||
        identity_activate(&st, name) < 0)
        goto out;
    printf("give the platform %s/%s.{nk,nkpub} (its NATS login) and %s/%s.key (its signing "
           "key); docs/platforms.md\n",
           dir, name, dir, name);
    r = SP_STACK_EXIT_OK;
out:
    if (lock >= 0)
        close(lock);
    sp__platform_tenants_free(tenants, n_tenants);
    free(dir);
    stack_dispose(&st);
    return r;
}
