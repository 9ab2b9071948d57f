/* The egress tests' "internet" (internet.py in a network namespace the test creates: a
 * resolver, two web sites, a fake metadata service, private-range sites, a UDP sink, TCP echo
 * ports), shared by tests/integration/egress.c and credstore.c. Every address below is routed
 * on the host into that namespace BEFORE the servers start, and checked with `ip route get`:
 * even a failing test sends nothing off this machine. Cleanup: sp_inet_down (idempotent).
 * Not thread-safe: one internet per test process. */
#ifndef SPACE_TEST_INTERNET_H
#define SPACE_TEST_INTERNET_H

#include <stddef.h>

#define SP_INET_META      "169.254.169.254"
#define SP_INET_ALLOWED   "198.18.1.10"
#define SP_INET_FORBIDDEN "198.18.1.20"
#define SP_INET_ECHO      "198.18.1.30"
#define SP_INET_RESOLVER  "198.18.53.53"
/* Private-range test sites (RFC 1918 and CGNAT), routed into the namespace like the rest. */
extern const char *const sp_inet_private[4];
#define SP_INET_N_PRIVATE 4

/* Runs a shell command (ip(8), nft(8)); its exit status, -1 if it did not exit. */
int sp_inet_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The test's "public" CA (the file egressd trusts for upstreams: SPACE_UPSTREAM_CA_FILE) and
 * its leaves for the test sites, a rogue CA and its leaf for allowed.test; the directory they
 * are in (internet.py's second argument). */
void sp_inet_make_certs(void);
const char *sp_inet_certs_dir(void);
/* The namespace ns with its host veth end veth, its addresses, the host routes into it, then
 * internet.py (SPACE_EGRESS_INTERNET) with its counters in /tmp/<tag>-it-stats-<pid>.json. */
void sp_inet_up(const char *ns, const char *veth, const char *tag);
void sp_inet_down(void);
/* The JSON file internet.py keeps its counters (and what it saw) in. */
const char *sp_inet_stats_path(void);
/* A counter from the internet's stats: "dns", "udp", "http.<addr>", "echo.<port>". */
long long sp_inet_stat(const char *what);

/* Runs cmd (sh -c, printf-style) as root in sandbox id through the stack's commands API at
 * port with API key; stdout+stderr into out. Returns the exit code. */
int sp_inet_run(int port, const char *key, const char *id, char *out, size_t len, const char *fmt,
                ...) __attribute__((format(printf, 6, 7)));
/* egress-probe (SPACE_BIN_DIR) into /root/probe of sandbox id, through the files API. */
void sp_inet_put_probe(int port, const char *key, const char *id);

#endif
