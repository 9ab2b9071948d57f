/* The egress tests' "internet" (test_internet.h). */
#include "test_internet.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/pem.h>

#include "buf.h"
#include "harness.h"
#include "json.h"
#include "tlsca.h"
#include "xmalloc.h"

const char *const sp_inet_private[SP_INET_N_PRIVATE] = {"10.99.0.10", "172.16.99.10",
                                                        "192.168.99.10", "100.64.99.10"};

static char ns_name[32], veth_name[32], stats_path[128], certs_dir[256];
static pid_t inet_pid;
static bool routes_added;

int sp_inet_sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    /* clang-tidy 14 sees an uninitialised va_list here (docs/machine-notes.md: such va_list
     * reports are false); va_start is right above. */
    vsnprintf(cmd, sizeof(cmd), fmt, ap); /* NOLINT(clang-analyzer-valist.Uninitialized) */
    va_end(ap);
    int st = system(cmd); /* NOLINT(cert-env33-c): ip(8) builds the test internet */
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void sp_inet_down(void)
{
    if (inet_pid > 0) {
        kill(inet_pid, SIGKILL);
        waitpid(inet_pid, NULL, 0);
        inet_pid = 0;
    }
    if (!veth_name[0])
        return;
    if (routes_added) {
        sp_inet_sh("ip route del " SP_INET_META "/32 via 198.18.0.2 dev %s 2>/dev/null", veth_name);
        for (size_t i = 0; i < SP_INET_N_PRIVATE; i++)
            sp_inet_sh("ip route del %s/32 via 198.18.0.2 dev %s 2>/dev/null", sp_inet_private[i],
                       veth_name);
    }
    routes_added = false;
    sp_inet_sh("ip link del %s 2>/dev/null; ip netns del %s 2>/dev/null", veth_name, ns_name);
    if (stats_path[0]) {
        char log[160];
        snprintf(log, sizeof(log), "%s.log", stats_path);
        unlink(stats_path);
        unlink(log);
    }
}

void sp_inet_up(const char *ns, const char *veth, const char *tag)
{
    snprintf(ns_name, sizeof(ns_name), "%s", ns);
    snprintf(veth_name, sizeof(veth_name), "%s", veth);
    sp_inet_down();
    const char *n = ns_name, *v = veth_name;
    if (sp_inet_sh("set -e; ip netns add %s; ip link add %s type veth peer name eth0 netns %s;"
                   "ip addr add 198.18.0.1/24 dev %s; ip link set %s up;"
                   "ip -n %s link set lo up; ip -n %s addr add 198.18.0.2/24 dev eth0;"
                   "for a in " SP_INET_ALLOWED " " SP_INET_FORBIDDEN " " SP_INET_ECHO
                   " " SP_INET_RESOLVER " " SP_INET_META "; do ip -n %s addr add $a/32 dev eth0; "
                   "done;"
                   /* No default route inside: the namespace answers 198.18.0.1 (the host end,
                    * where egressd's connections come from) and nothing else. */
                   "ip -n %s link set eth0 up;"
                   "ip route add 198.18.1.0/24 via 198.18.0.2 dev %s;"
                   "ip route add 198.18.53.0/24 via 198.18.0.2 dev %s",
                   n, v, n, v, v, n, n, n, n, v, v) != 0)
        fail_msg("cannot build the test internet");
    if (sp_inet_sh("ip route add " SP_INET_META "/32 via 198.18.0.2 dev %s", v) != 0)
        fail_msg("cannot route " SP_INET_META " into the test namespace: refusing to probe it");
    routes_added = true;
    for (size_t i = 0; i < SP_INET_N_PRIVATE; i++)
        if (sp_inet_sh("ip -n %s addr add %s/32 dev eth0 && ip route add %s/32 via 198.18.0.2 "
                       "dev %s",
                       n, sp_inet_private[i], sp_inet_private[i], v) != 0)
            fail_msg("cannot route %s into the test namespace: refusing to probe it",
                     sp_inet_private[i]);
    /* Belt and braces: what the host would do with each probed address now. */
    const char *probe[] = {SP_INET_ALLOWED, SP_INET_FORBIDDEN, SP_INET_ECHO, SP_INET_RESOLVER,
                           SP_INET_META};
    for (size_t i = 0; i < 5 + SP_INET_N_PRIVATE; i++) {
        const char *a = i < 5 ? probe[i] : sp_inet_private[i - 5];
        if (sp_inet_sh("ip route get %s | grep -q 'dev %s'", a, v) != 0)
            fail_msg("%s is not routed into the test namespace", a);
    }
    setenv("EGRESS_PRIVATE", "1", 1); /* internet.py serves the private sites */

    snprintf(stats_path, sizeof(stats_path), "/tmp/%s-it-stats-%d.json", tag, (int)getpid());
    unlink(stats_path);
    char log[160];
    snprintf(log, sizeof(log), "%s.log", stats_path);
    const char *script = sp_test_env("SPACE_EGRESS_INTERNET");
    inet_pid = fork();
    if (inet_pid == 0) {
        FILE *lf = freopen(log, "w", stderr);
        (void)lf;
        execl("/usr/sbin/ip", "ip", "netns", "exec", n, "/usr/bin/python3", script, stats_path,
              certs_dir, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100 && access(stats_path, F_OK) != 0; i++)
        usleep(50 * 1000);
    if (access(stats_path, F_OK) != 0) {
        int st = 0;
        pid_t w = waitpid(inet_pid, &st, WNOHANG);
        fprintf(stderr, "internet.py: pid %d waited %d status 0x%x\n", (int)inet_pid, (int)w, st);
        sp_inet_sh("cat %s >&2", log);
        fail_msg("the test internet did not start (log above)");
    }
}

/* Writes a leaf for name, signed by the CA in dir, as out/<name>.crt and .key. */
static void mint_to(const char *ca_dir, const char *name, const char *out)
{
    char err[SP_CA_ERR_MAX] = "", crt[512], kpath[512];
    snprintf(crt, sizeof(crt), "%s/" SP_CA_CERT_FILE, ca_dir);
    snprintf(kpath, sizeof(kpath), "%s/" SP_CA_KEY_FILE, ca_dir);
    sp_ca_t *ca = NULL;
    X509 *cert = NULL;
    EVP_PKEY *pk = NULL;
    if (sp_ca_load(crt, kpath, &ca, err) < 0 || sp_ca_mint(ca, name, 30, &cert, &pk, err) < 0)
        fail_msg("mint %s: %s", name, err);
    snprintf(crt, sizeof(crt), "%s/%s.crt", out, name);
    snprintf(kpath, sizeof(kpath), "%s/%s.key", out, name);
    FILE *f = fopen(crt, "w");
    FILE *g = fopen(kpath, "w");
    if (!f || !g || !PEM_write_X509(f, cert) ||
        !PEM_write_PrivateKey(g, pk, NULL, NULL, 0, NULL, NULL))
        fail_msg("write %s", crt);
    fclose(f);
    fclose(g);
    X509_free(cert);
    EVP_PKEY_free(pk);
    sp_ca_free(ca);
}

/* The test's "public" CA (the file egressd trusts for upstreams: SPACE_UPSTREAM_CA_FILE) and
 * its leaves for the test sites; a rogue CA and its leaf for allowed.test. */
void sp_inet_make_certs(void)
{
    const char *ca_file = sp_test_env("SPACE_UPSTREAM_CA_FILE");
    const char *slash = strrchr(ca_file, '/');
    if (!slash)
        fail_msg("SPACE_UPSTREAM_CA_FILE is not a path: %s", ca_file);
    snprintf(certs_dir, sizeof(certs_dir), "%.*s", (int)(slash - ca_file), ca_file);
    char err[SP_CA_ERR_MAX] = "", rogue[300];
    if (sp_ca_ensure(certs_dir, "SPACE test public CA", err) < 0)
        fail_msg("test public CA: %s", err);
    snprintf(rogue, sizeof(rogue), "%s/rogue", certs_dir);
    if (sp_ca_ensure(rogue, "SPACE test rogue CA", err) < 0)
        fail_msg("rogue CA: %s", err);
    const char *names[] = {"allowed.test", "www.wild.test", "forbidden.test"};
    for (size_t i = 0; i < 3; i++)
        mint_to(certs_dir, names[i], certs_dir);
    mint_to(rogue, "allowed.test", rogue);
}

/* A counter from the internet's stats: "dns", "udp", "http.<addr>", "echo.<port>". */
long long sp_inet_stat(const char *what)
{
    FILE *f = fopen(stats_path, "r");
    if (!f)
        fail_msg("no stats");
    static char buf[8 << 20]; /* the counters grow with every request of a run */
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    if (sp_json_parse(buf, n, NULL, &doc, err) < 0)
        fail_msg("stats: %s", err);
    const sp_json_t *v = sp_json_root(doc);
    char path[64];
    snprintf(path, sizeof(path), "%s", what);
    char *dot = strchr(path, '.');
    if (dot) {
        *dot = '\0';
        v = sp_json_get(sp_json_get(v, path), dot + 1);
    } else {
        v = sp_json_get(v, path);
    }
    int64_t x = 0;
    if (v)
        sp_json_int(v, 0, INT64_MAX, &x);
    sp_json_doc_free(doc);
    return x;
}

const char *sp_inet_certs_dir(void)
{
    return certs_dir;
}

const char *sp_inet_stats_path(void)
{
    return stats_path;
}

/* Runs cmd (sh -c) as root in sandbox id; stdout+stderr into out. Returns the exit code. */
int sp_inet_run(int port, const char *key, const char *id, char *out, size_t len, const char *fmt,
                ...)
{
    char cmd[1024], path[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap); /* NOLINT(clang-analyzer-valist.Uninitialized) */
    va_end(ap);
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_printf(&b, "{\"cmd\":");
    char *full = sp_xasprintf("(%s) 2>&1", cmd);
    sp_buf_json_str(&b, full);
    free(full);
    sp_buf_printf(&b, ",\"user\":\"root\",\"timeout_s\":30}");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    sp_test_http_resp_t r;
    sp_test_http(port, "POST", path, key, "Accept: application/json\r\n", b.data, b.len, &r);
    sp_buf_dispose(&b);
    if (r.status != 200)
        fail_msg("command in %s: %d %s", id, r.status, r.body);
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    sp_json_limits_t lim = {.max_bytes = 64u << 20, .max_string = 32u << 20};
    if (sp_json_parse(r.body, r.body_len, &lim, &doc, err) < 0)
        fail_msg("not JSON (%s): %.300s", err, r.body);
    const char *s = sp_json_str(sp_json_get(sp_json_root(doc), "stdout"), NULL);
    snprintf(out, len, "%s", s ? s : "");
    int64_t code = -1;
    sp_json_int(sp_json_get(sp_json_root(doc), "exit_code"), -1000, 1000, &code);
    sp_json_doc_free(doc);
    sp_test_http_free(&r);
    return (int)code;
}

/* egress-probe into /root/probe of sandbox id, through the files API. */
void sp_inet_put_probe(int port, const char *key, const char *id)
{
    sp_test_put_program(port, key, id, "egress-probe", "/root/probe");
}
