/* A private PostgreSQL 15 cluster for the local stack: initdb on first use, then `postgres`
 * itself (no pg_ctl, so the pid we record is the postmaster's), unix socket only.
 *
 * PostgreSQL refuses to run as root (runtime-notes.md). When `space` runs as root, initdb and
 * the server run as an unprivileged OS user (SPACE_PG_OS_USER, default "postgres", which
 * Debian's package creates), the cluster directory belongs to that user, and every directory
 * above it must let that user through. Run as anyone else, they run as the caller. */
#include "space_stack.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "space_proc.h"
#include "xmalloc.h"

#define PG_COMM             "postgres"
#define PG_START_TIMEOUT_MS 60000
#define PG_STOP_TIMEOUT_MS  30000
#define INITDB_TIMEOUT_MS   120000

typedef struct {
    char *dir;            /* home/pg */
    char *data;           /* home/pg/data */
    char *sock;           /* home/pg/run: the unix socket directory */
    char *log;            /* home/log/postgres.log */
    char *pidfile;        /* home/run/postgres.pid */
    char *postmaster_pid; /* home/pg/data/postmaster.pid, written by the server itself */
} pg_paths_t;

static void paths_init(const sp_stack_t *st, pg_paths_t *p)
{
    p->dir = sp__stack_path(st, "pg");
    p->data = sp__stack_path(st, "pg/data");
    p->sock = sp__stack_path(st, "pg/run");
    p->log = sp__stack_path(st, "log/postgres.log");
    p->pidfile = sp__stack_path(st, "run/postgres.pid");
    p->postmaster_pid = sp__stack_path(st, "pg/data/postmaster.pid");
}

static void paths_dispose(pg_paths_t *p)
{
    free(p->dir);
    free(p->data);
    free(p->sock);
    free(p->log);
    free(p->pidfile);
    free(p->postmaster_pid);
}

/* Percent-encodes everything but RFC 3986 unreserved characters and '/', for a libpq URI. */
static char *uri_encode(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    char *out = sp_xmalloc(strlen(s) * 3 + 1), *o = out;

    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (isalnum(*c) || strchr("-._~/", *c)) {
            *o++ = (char)*c;
        } else {
            *o++ = '%';
            *o++ = hex[*c >> 4];
            *o++ = hex[*c & 15];
        }
    }
    *o = '\0';
    return out;
}

static char *pg_url(const sp_stack_t *st, const pg_paths_t *p, int port)
{
    char *host = uri_encode(p->sock), *url;

    url = sp_xasprintf("postgresql:///%s?host=%s&port=%d&user=%s", st->cfg->pg_db, host, port,
                       st->cfg->pg_user);
    free(host);
    return url;
}

/* The port a running server uses: line 4 of postmaster.pid (it may have been started with
 * another SPACE_PG_PORT than the one configured now). */
static int running_port(const sp_stack_t *st, const pg_paths_t *p)
{
    char line[PATH_MAX + 64], *end;
    int port = (int)st->cfg->pg_port;
    FILE *f;
    long v;

    f = fopen(p->postmaster_pid, "re");
    if (!f)
        return port;
    for (int i = 1; fgets(line, sizeof(line), f); i++) {
        if (i == 4) {
            v = strtol(line, &end, 10);
            if (end != line && v >= 1 && v <= 65535)
                port = (int)v;
            break;
        }
    }
    fclose(f);
    return port;
}

static int find_running(const pg_paths_t *p, pid_t *ret_pid)
{
    if (sp_proc_pidfile_check(p->pidfile, PG_COMM, ret_pid) == 1)
        return 1;
    /* Our pid file may be gone while the server runs; its own lock file still names it. */
    return sp_proc_pidfile_check(p->postmaster_pid, PG_COMM, ret_pid) == 1;
}

/* Fills *ret_user and returns 1 when the server must run as another user (we are root), 0 when
 * it runs as the caller, -1 after printing why neither works. */
static int resolve_user(const sp_stack_t *st, sp_proc_user_t *ret_user)
{
    int r;

    if (geteuid() != 0)
        return 0;
    r = sp_proc_user_lookup(st->cfg->pg_os_user, ret_user);
    if (r < 0) {
        fprintf(stderr,
                "space: PostgreSQL refuses to run as root, and there is no OS user '%s' to run "
                "it as (%s): install the Debian package 'postgresql-15' (it creates the user "
                "'postgres') or set SPACE_PG_OS_USER\n",
                st->cfg->pg_os_user, strerror(-r));
        return -1;
    }
    if (ret_user->uid == 0) {
        fprintf(stderr, "space: SPACE_PG_OS_USER=%s is root; PostgreSQL refuses to run as root\n",
                st->cfg->pg_os_user);
        return -1;
    }
    return 1;
}

static int add_other_x(const char *dir)
{
    struct stat sb;

    if (stat(dir, &sb) < 0)
        return -errno;
    if (!(sb.st_mode & S_IXOTH) && chmod(dir, (sb.st_mode & 07777) | S_IXOTH) < 0)
        return -errno;
    return 0;
}

/* Creates pg/, pg/run and pg/data with the owners and modes the server needs. Only the
 * directories SPACE owns ($SPACE_HOME and pg/) are opened for others to traverse. */
static int prepare_dirs(const sp_stack_t *st, const pg_paths_t *p, const sp_proc_user_t *as)
{
    char *version = sp_xasprintf("%s/PG_VERSION", p->data);
    uid_t owner = as ? as->uid : geteuid();
    const char *what = p->dir;
    struct stat sb;
    int r;

    if ((r = sp__stack_mkdir(p->dir, 0755)) < 0)
        goto fail;
    what = p->sock;
    if ((r = sp__stack_mkdir(p->sock, 0750)) < 0)
        goto fail;
    what = p->data;
    if ((r = sp__stack_mkdir(p->data, 0700)) < 0)
        goto fail;
    if (as) {
        what = st->home;
        if ((r = add_other_x(st->home)) < 0)
            goto fail;
        what = p->dir;
        if ((r = add_other_x(p->dir)) < 0)
            goto fail;
        what = p->sock;
        if (chown(p->sock, as->uid, as->gid) < 0 || chmod(p->sock, 0750) < 0) {
            r = -errno;
            goto fail;
        }
    }
    what = p->data;
    if (stat(version, &sb) < 0) {
        /* Not initialized yet: the directory is ours to hand over. */
        if (as && chown(p->data, as->uid, as->gid) < 0) {
            r = -errno;
            goto fail;
        }
    } else if (stat(p->data, &sb) == 0 && sb.st_uid != owner) {
        fprintf(stderr,
                "space: %s belongs to uid %u, but PostgreSQL would run as uid %u; "
                "`space down --purge` starts over\n",
                p->data, (unsigned)sb.st_uid, (unsigned)owner);
        free(version);
        return -1;
    }
    free(version);
    return 0;
fail:
    fprintf(stderr, "space: cannot prepare %s: %s\n", what, strerror(-r));
    free(version);
    return -1;
}

/* Checks, as the user the server will run as, that it can reach its data and socket
 * directories. A forked child switches identity and walks the path with access(2), which also
 * honours ACLs; it sends back the first path it cannot use. */
static int check_reachable(const pg_paths_t *p, const sp_proc_user_t *as)
{
    char bad[PATH_MAX] = "";
    int pfd[2], status;
    ssize_t n;
    pid_t pid;

    if (pipe2(pfd, O_CLOEXEC) < 0)
        return -1;
    pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        const char *targets[] = {p->data, p->sock};
        char prefix[PATH_MAX];

        close(pfd[0]);
        if (sp_proc_become(as) < 0)
            _exit(2);
        for (size_t t = 0; t < 2; t++) {
            const char *path = targets[t];

            for (const char *s = strchr(path + 1, '/');; s = strchr(s + 1, '/')) {
                size_t len = s ? (size_t)(s - path) : strlen(path);

                memcpy(prefix, path, len);
                prefix[len] = '\0';
                if (access(prefix, X_OK) < 0 || (!s && access(prefix, W_OK) < 0)) {
                    (void)!write(pfd[1], prefix, len);
                    _exit(1);
                }
                if (!s)
                    break;
            }
        }
        _exit(0);
    }
    close(pfd[1]);
    do
        n = read(pfd[0], bad, sizeof(bad) - 1);
    while (n < 0 && errno == EINTR);
    close(pfd[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (n > 0) {
        struct stat sb;

        bad[n] = '\0';
        if (stat(bad, &sb) < 0)
            memset(&sb, 0, sizeof(sb));
        fprintf(stderr,
                "space: PostgreSQL runs as uid %u, which cannot get through %s (mode %04o, owner "
                "uid %u). Put SPACE_HOME somewhere that user can reach (for example under /var/tmp "
                "or /srv, not under a private /root), or open that directory: chmod o+x %s\n",
                (unsigned)as->uid, bad, (unsigned)(sb.st_mode & 07777), (unsigned)sb.st_uid, bad);
    } else {
        fprintf(stderr, "space: cannot switch to uid %u to check the PostgreSQL directories\n",
                (unsigned)as->uid);
    }
    return -1;
}

static int run_initdb(const sp_stack_t *st, const pg_paths_t *p, const sp_proc_user_t *as)
{
    char *prog = sp_xasprintf("%s/initdb", st->cfg->pg_bin_dir);
    char *log = sp__stack_path(st, "log/initdb.log");
    char *user = sp_xasprintf("-U%s", st->cfg->pg_user);
    /* clang-format off */
    char *argv[] = {"initdb", "-D", p->data, user,
                    "--auth-local=trust", "--auth-host=scram-sha-256",
                    "-E", "UTF8", "--no-locale", NULL};
    /* clang-format on */
    sp_proc_spec_t spec = {.path = prog, .argv = argv, .cwd = p->dir, .log_path = log, .as = as};
    int r = -1, e, status;
    pid_t pid;

    printf("%-*s initdb   %s (log %s)\n", SP_STACK_PART_WIDTH, "postgres", p->data, log);
    fflush(stdout);
    if ((e = sp_proc_spawn(&spec, &pid)) < 0) {
        fprintf(stderr, "space: cannot run %s: %s%s\n", prog, strerror(-e),
                e == -ENOENT ? " (install the Debian package 'postgresql-15' or set "
                               "SPACE_PG_BIN_DIR)"
                             : "");
        goto out;
    }
    if (sp_proc_wait_exit(pid, INITDB_TIMEOUT_MS, &status) < 0) {
        kill(pid, SIGKILL);
        sp_proc_wait_exit(pid, -1, NULL);
        sp__stack_fail_log("initdb did not finish in time", log);
        goto out;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        sp__stack_fail_log("initdb failed", log);
        goto out;
    }
    r = 0;
out:
    free(prog);
    free(log);
    free(user);
    return r;
}

/* Polls until the server answers a connection, or dies, or the time is up. */
static int wait_ready(const sp_stack_t *st, const pg_paths_t *p, pid_t pid, bool child, int port)
{
    long long deadline = sp_proc_now_ms() + PG_START_TIMEOUT_MS;
    char port_s[16];
    const char *keys[] = {"host", "port", "dbname", "user", "connect_timeout", NULL};
    const char *vals[] = {p->sock, port_s, "postgres", st->cfg->pg_user, "2", NULL};
    int status;

    snprintf(port_s, sizeof(port_s), "%d", port);
    for (;;) {
        if (child ? sp_proc_reap(pid, &status) == 1 : !sp_proc_alive(pid, PG_COMM)) {
            sp__stack_fail_log("postgres exited during startup", p->log);
            return -1;
        }
        switch (PQpingParams(keys, vals, 0)) {
        case PQPING_OK:
            return 0;
        case PQPING_NO_ATTEMPT:
            fprintf(stderr, "space: bad PostgreSQL connection parameters (socket %s)\n", p->sock);
            return -1;
        default: /* starting up (REJECT) or socket not there yet (NO_RESPONSE) */
            break;
        }
        if (sp_proc_now_ms() >= deadline) {
            sp__stack_fail_log("postgres did not accept connections in time", p->log);
            return -1;
        }
        sp_proc_sleep_ms(20);
    }
}

/* Creates SPACE_PG_DB unless it exists (connected to the "postgres" database). */
static int ensure_database(const sp_stack_t *st, const pg_paths_t *p, int port)
{
    char port_s[16], *ident = NULL, *sql = NULL;
    const char *keys[] = {"host", "port", "dbname", "user", NULL};
    const char *vals[] = {p->sock, port_s, "postgres", st->cfg->pg_user, NULL};
    const char *params[] = {st->cfg->pg_db};
    PGresult *res = NULL;
    PGconn *conn;
    int r = -1;

    snprintf(port_s, sizeof(port_s), "%d", port);
    conn = PQconnectdbParams(keys, vals, 0);
    if (PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "space: cannot connect to PostgreSQL at %s: %s", p->sock,
                PQerrorMessage(conn));
        goto out;
    }
    res = PQexecParams(conn, "SELECT 1 FROM pg_database WHERE datname = $1", 1, NULL, params, NULL,
                       NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        fprintf(stderr, "space: cannot list databases: %s", PQerrorMessage(conn));
        goto out;
    }
    if (PQntuples(res) == 1) {
        r = 0;
        goto out;
    }
    PQclear(res);
    ident = PQescapeIdentifier(conn, st->cfg->pg_db, strlen(st->cfg->pg_db));
    if (!ident) {
        res = NULL;
        fprintf(stderr, "space: bad database name: %s", PQerrorMessage(conn));
        goto out;
    }
    sql = sp_xasprintf("CREATE DATABASE %s", ident);
    res = PQexec(conn, sql);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

        /* 42P04 duplicate_database: someone else created it meanwhile, which is fine. */
        if (!state || strcmp(state, "42P04") != 0) {
            fprintf(stderr, "space: cannot create database %s: %s", st->cfg->pg_db,
                    PQerrorMessage(conn));
            goto out;
        }
    }
    r = 0;
out:
    PQclear(res);
    PQfreemem(ident);
    free(sql);
    PQfinish(conn);
    return r;
}

static int start_server(const sp_stack_t *st, const pg_paths_t *p, const sp_proc_user_t *as,
                        pid_t *ret_pid)
{
    char *prog = sp_xasprintf("%s/postgres", st->cfg->pg_bin_dir);
    char *sockdir = sp_xasprintf("unix_socket_directories=%s", p->sock);
    char *port = sp_xasprintf("port=%d", (int)st->cfg->pg_port);
    /* A development box: durable (fsync on), small, reachable through the socket only. The
     * socket directory is 0750 and the socket 0770, so local trust authentication is open to
     * root and the server's group only. */
    /* clang-format off */
    char *argv[] = {"postgres", "-D", p->data,
                    "-c", "listen_addresses=",
                    "-c", sockdir,
                    "-c", "unix_socket_permissions=0770",
                    "-c", port,
                    "-c", "fsync=on",
                    "-c", "shared_buffers=128MB",
                    "-c", "max_connections=100",
                    NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    /* clang-format on */
    /* Measurement only (bench/run.sh exec with SPACE_PG_STAT_STATEMENTS=1): what each
     * statement costs per command, docs/machine-notes.md "exec, fourth pass". */
    const char *pgss = getenv("SPACE_PG_STAT_STATEMENTS");
    if (pgss && strcmp(pgss, "1") == 0) {
        size_t n = sizeof(argv) / sizeof(argv[0]) - 7;
        argv[n++] = "-c";
        argv[n++] = "shared_preload_libraries=pg_stat_statements";
        argv[n++] = "-c";
        argv[n++] = "pg_stat_statements.track=all";
        argv[n++] = "-c";
        argv[n] = "pg_stat_statements.track_planning=on";
    }
    sp_proc_spec_t spec = {
        .path = prog, .argv = argv, .cwd = p->data, .log_path = p->log, .as = as, .detach = true};
    int r;

    r = sp_proc_spawn(&spec, ret_pid);
    if (r < 0)
        fprintf(stderr, "space: cannot start %s: %s\n", prog, strerror(-r));
    else
        /* Fails only when the server died at once, which wait_ready reports with its log. */
        (void)sp_proc_pidfile_write(p->pidfile, *ret_pid);
    free(prog);
    free(sockdir);
    free(port);
    return r < 0 ? -1 : 0;
}

/* Everything that can be checked before anything starts: socket path length, the identity the
 * server runs as, its directories and whether that identity can reach them. Fills *ret_as
 * (NULL or user). */
static int preflight(const sp_stack_t *st, const pg_paths_t *p, sp_proc_user_t *user,
                     const sp_proc_user_t **ret_as)
{
    struct sockaddr_un sun;

    /* The socket path must fit sockaddr_un; postgres would only say so in its log. */
    if (strlen(p->sock) + strlen("/.s.PGSQL.65535") >= sizeof(sun.sun_path)) {
        fprintf(stderr,
                "space: %s is too long for a unix socket directory (socket paths are limited "
                "to %zu bytes): choose a shorter SPACE_HOME\n",
                p->sock, sizeof(sun.sun_path) - 1);
        return -1;
    }
    switch (resolve_user(st, user)) {
    case 1:
        *ret_as = user;
        break;
    case 0:
        *ret_as = NULL;
        break;
    default:
        return -1;
    }
    if (prepare_dirs(st, p, *ret_as) < 0 || (*ret_as && check_reachable(p, *ret_as) < 0))
        return -1;
    return 0;
}

int sp__pg_preflight(const sp_stack_t *st)
{
    const sp_proc_user_t *as;
    sp_proc_user_t user;
    pg_paths_t p;
    pid_t pid;
    int r = 0;

    paths_init(st, &p);
    if (find_running(&p, &pid) != 1)
        r = preflight(st, &p, &user, &as);
    paths_dispose(&p);
    return r;
}

int sp__pg_up(const sp_stack_t *st, sp_stack_part_t *ret_part)
{
    sp_stack_part_t part = {0};
    const sp_proc_user_t *as;
    sp_proc_user_t user;
    char *version = NULL;
    pg_paths_t p;
    int r = -1, port;
    pid_t pid;

    paths_init(st, &p);
    if (find_running(&p, &pid) == 1) {
        port = running_port(st, &p);
        if (wait_ready(st, &p, pid, false, port) < 0)
            goto out;
        (void)sp_proc_pidfile_write(p.pidfile, pid);
    } else {
        if (preflight(st, &p, &user, &as) < 0)
            goto out;
        version = sp_xasprintf("%s/PG_VERSION", p.data);
        if (access(version, F_OK) < 0 && run_initdb(st, &p, as) < 0)
            goto out;
        if (start_server(st, &p, as, &pid) < 0)
            goto out;
        port = (int)st->cfg->pg_port;
        if (wait_ready(st, &p, pid, true, port) < 0) {
            sp_proc_stop(pid, PG_COMM, SIGINT, 5000);
            unlink(p.pidfile);
            goto out;
        }
        part.started = true;
    }
    if (ensure_database(st, &p, port) < 0)
        goto out;
    part.pid = pid;
    part.port = port;
    part.url = pg_url(st, &p, port);
    sp__stack_report("postgres", part.started ? "started" : "running", &part);
    *ret_part = part;
    r = 0;
out:
    free(version);
    paths_dispose(&p);
    return r;
}

void sp__pg_probe(const sp_stack_t *st, sp_stack_part_t *ret_part)
{
    sp_stack_part_t part = {0};
    pg_paths_t p;
    pid_t pid;

    paths_init(st, &p);
    if (find_running(&p, &pid) == 1) {
        part.pid = pid;
        part.port = running_port(st, &p);
        part.url = pg_url(st, &p, part.port);
    }
    paths_dispose(&p);
    *ret_part = part;
}

int sp__pg_down(const sp_stack_t *st)
{
    pg_paths_t p;
    int r = 0, s;
    pid_t pid;

    paths_init(st, &p);
    if (find_running(&p, &pid) == 1) {
        /* SIGINT is the "fast" shutdown (pg_ctl stop -m fast): clients are disconnected, the
         * server checkpoints and exits. */
        s = sp_proc_stop(pid, PG_COMM, SIGINT, PG_STOP_TIMEOUT_MS);
        if (s < 0) {
            fprintf(stderr, "space: cannot stop postgres (pid %d): %s\n", (int)pid, strerror(-s));
            r = -1;
            goto out;
        }
        printf("%-*s stopped  pid %d%s\n", SP_STACK_PART_WIDTH, "postgres", (int)pid,
               s == 1 ? " (killed after 30 s)" : "");
    }
    unlink(p.pidfile);
out:
    paths_dispose(&p);
    return r;
}
