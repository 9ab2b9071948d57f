/* Pieces the benchmarks share (bench.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "buf.h"
#include "json.h"
#include "xmalloc.h"

int bench_http(bench_ctx_t *c, const char *method, const char *path, const char *extra,
               const char *body, sp_httpc_resp_t *r)
{
    sp_httpc_req_t req = {.host = c->api_host,
                          .port = c->api_port,
                          .method = method,
                          .path = path,
                          .key = c->api_key,
                          .extra_headers = extra,
                          .body = body,
                          .body_len = body ? strlen(body) : 0,
                          .timeout_ms = c->timeout_ms};
    return sp_httpc_do(&req, r);
}

int bench_create_sandbox(bench_ctx_t *c, char id[80])
{
    sp_httpc_resp_t r;
    const char *body = "{\"template\":\"tiny\"}";
    id[0] = '\0';
    if (bench_http(c, "POST", "/v1/sandboxes", NULL, body, &r) < 0)
        return -1;
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (r.status == 201 && sp_json_parse(r.body, r.body_len, NULL, &doc, err) == 0)
        snprintf(id, 80, "%s", sp_json_str(sp_json_get(sp_json_root(doc), "id"), NULL));
    sp_json_doc_free(doc);
    sp_httpc_resp_free(&r);
    return id[0] ? 0 : -1;
}

char *bench_make_bundle(const char *rootfs, const char *args_json)
{
    char *dir = sp_xstrdup("/tmp/space-bench-bundle.XXXXXX");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "space-bench: mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_printf(&b,
                  "{\"ociVersion\":\"1.0.0\",\"process\":{\"terminal\":false,\"user\":{\"uid\":0,"
                  "\"gid\":0},\"args\":%s,\"env\":[\"PATH=/bin\"],\"cwd\":\"/\"},"
                  "\"root\":{\"path\":",
                  args_json);
    sp_buf_json_str(&b, rootfs);
    sp_buf_puts(&b, ",\"readonly\":true},\"hostname\":\"bench\",\"linux\":{\"namespaces\":["
                    "{\"type\":\"pid\"},{\"type\":\"ipc\"},{\"type\":\"uts\"},{\"type\":\"mount\"}"
                    "]}}");
    char *path = sp_xasprintf("%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || fwrite(b.data, 1, b.len, f) != b.len || fclose(f) != 0) {
        fprintf(stderr, "space-bench: cannot write %s\n", path);
        exit(1);
    }
    free(path);
    sp_buf_dispose(&b);
    return dir;
}

int bench_run_quiet(char *const argv[])
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_RDWR);
        dup2(fd, 0);
        dup2(fd, 1);
        if (!getenv("SPACE_BENCH_DEBUG")) /* the tool's own complaints, when asked */
            dup2(fd, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void bench_row(const char *name, double *v, size_t n)
{
    printf("  %-48s %9.1f %9.1f %9.1f\n", name, bench_pct(v, n, 50), bench_pct(v, n, 90),
           bench_pct(v, n, 99));
}

/* ---- CPU time of the stack's processes, from /proc ---- */

long long bench_proc_ticks(long pid, long *ret_ppid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* After the command name's closing parenthesis, fields 3 on: state, ppid (4), ...,
     * utime (14), stime (15). */
    const char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    long long field[16] = {0};
    p += 2;
    for (int k = 3; k <= 15 && *p; k++) {
        char *end;
        field[k] = k == 3 ? 0 : strtoll(p, &end, 10);
        if (k != 3 && end == p)
            return 0;
        p = strchr(p, ' ');
        if (!p)
            break;
        p++;
    }
    if (ret_ppid)
        *ret_ppid = (long)field[4];
    return field[14] + field[15];
}

long bench_pid_file(const char *home, const char *name)
{
    return bench_run_file(home, name, ".pid");
}

long bench_run_file(const char *home, const char *name, const char *suffix)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/run/%s%s", home, name, suffix);
    FILE *f = fopen(path, "re");
    char line[32] = "";
    if (f) {
        if (!fgets(line, sizeof(line), f))
            line[0] = '\0';
        fclose(f);
    }
    return strtol(line, NULL, 10);
}

long long bench_daemon_ticks(const char *home, const char *name, long except)
{
    long pid = bench_pid_file(home, name);
    if (pid <= 0)
        return 0;
    long long t = bench_proc_ticks(pid, NULL);
    if (strcmp(name, "postgres") != 0)
        return t;
    /* PostgreSQL's work is done in its backends, the postmaster's children. */
    DIR *d = opendir("/proc");
    for (struct dirent *e; d && (e = readdir(d));) {
        char *end;
        long child = strtol(e->d_name, &end, 10), ppid = 0;
        if (*end || child <= 0 || child == except)
            continue;
        long long ct = bench_proc_ticks(child, &ppid);
        if (ppid == pid)
            t += ct;
    }
    if (d)
        closedir(d);
    return t;
}

/* ---- restarting the stack's daemons from a build ---- */

/* The stack's own SPACE_BIN_DIR, as the bench found it (NULL: unset). */
static char *own_bin_dir;
static bool own_bin_dir_read;

/* SIGTERM to pid, then up to 30 s until it is gone (or a zombie). */
static void stop_pid(long pid)
{
    if (pid <= 0 || kill((pid_t)pid, SIGTERM) != 0)
        return;
    for (int i = 0; i < 3000 && kill((pid_t)pid, 0) == 0; i++) {
        char path[64], st = 'Z';
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "re");
        if (f) {
            if (fscanf(f, "%*d %*s %c", &st) != 1)
                st = 'Z';
            fclose(f);
        }
        if (st == 'Z')
            break;
        nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    }
}

void bench_stop_daemon(bench_ctx_t *c, const char *name)
{
    stop_pid(bench_pid_file(c->home, name));
}

int bench_restart_daemons(bench_ctx_t *c, const char *const *names, size_t n, const char *bin_dir)
{
    char exe[4096];
    for (size_t i = 0; i < n; i++)
        stop_pid(bench_pid_file(c->home, names[i]));
    setenv("SPACE_HOME", c->home, 1);
    if (!own_bin_dir_read) {
        const char *own = getenv("SPACE_BIN_DIR");
        own_bin_dir = own ? sp_xstrdup(own) : NULL;
        own_bin_dir_read = true;
    }
    /* space up starts what is not running (here the daemons stopped) from SPACE_BIN_DIR. */
    if (bin_dir)
        setenv("SPACE_BIN_DIR", bin_dir, 1);
    else if (own_bin_dir)
        setenv("SPACE_BIN_DIR", own_bin_dir, 1);
    else
        unsetenv("SPACE_BIN_DIR");
    ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[el > 0 ? el : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    char *cmd = sp_xasprintf("'%s/space' up >/dev/null", exe);
    /* A loaded machine can time out one of space up's JetStream calls (docs/machine-notes.md):
     * try again before giving the whole invocation up. */
    int rc = -1;
    for (int attempt = 0; attempt < 6 && rc != 0; attempt++) {
        if (attempt) {
            fprintf(stderr, "space-bench: space up failed; trying again\n");
            sleep(5);
        }
        rc = system(cmd); /* NOLINT(cert-env33-c): the stack's own CLI */
    }
    free(cmd);
    return rc == 0 ? 0 : -1;
}
