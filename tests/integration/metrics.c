/* Metrics on every daemon (issue 20 part 4, docs/metrics.md): every daemon's /metrics, found
 * through its port file ($SPACE_HOME/run/<daemon>.metrics; the gateway's on its API port),
 * parses with a strict Prometheus text (0.0.4) parser, and with promtool when it is installed;
 * a sandbox's CPU seconds and disk bytes grow while it works, its memory is there, and its
 * series go with it; no env value given to a sandbox appears in any scrape; the listener answers
 * 404/405 and goes on serving, and a client that connects and sends nothing delays no scrape.
 * Stack: eventlog, scheduler, worker, credstore, egressd, gateway, started by `space up`. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "buf.h"
#include "harness.h"
#include "xmalloc.h"

static int api_port;
static const char *key;

/* ---- a strict parser of the text format, version 0.0.4 ---- */

typedef struct {
    char name[128];
    char labels[1024]; /* canonical: a="x",b="y" as written (unescaped values re-escaped) */
    char le[64];       /* histogram buckets: the le label, kept apart */
    double value;
} sample_t;

typedef struct {
    char name[128];
    char type[16];
    bool help;
} family_t;

typedef struct {
    sample_t *s;
    size_t n, cap;
    family_t f[512];
    size_t nf;
    family_t *cur; /* the family whose lines come now: every sample must be of it */
} scrape_t;

static void scrape_free(scrape_t *sc)
{
    free(sc->s);
    memset(sc, 0, sizeof(*sc));
}

static bool name_char(char c, bool first, bool metric)
{
    return isalpha((unsigned char)c) || c == '_' || (metric && c == ':') ||
           (!first && isdigit((unsigned char)c));
}

/* A metric or label name at *p; advances; false when there is none. */
static bool take_name(const char **p, char *out, size_t cap, bool metric)
{
    size_t n = 0;
    while (name_char((*p)[n], n == 0, metric)) {
        if (n + 1 >= cap)
            return false;
        out[n] = (*p)[n];
        n++;
    }
    out[n] = '\0';
    *p += n;
    return n > 0;
}

/* A sample value: a Go ParseFloat number, or NaN, +Inf, -Inf. */
static bool take_value(const char *s, double *ret)
{
    if (strcmp(s, "NaN") == 0) {
        *ret = NAN;
        return true;
    }
    if (strcmp(s, "+Inf") == 0 || strcmp(s, "-Inf") == 0) {
        *ret = s[0] == '+' ? INFINITY : -INFINITY;
        return true;
    }
    for (const char *q = s; *q; q++)
        if (!isdigit((unsigned char)*q) && !strchr("+-.eE", *q))
            return false;
    char *end;
    errno = 0;
    *ret = strtod(s, &end);
    return *s && *end == '\0' && errno == 0;
}

static family_t *family(scrape_t *sc, const char *name)
{
    for (size_t i = 0; i < sc->nf; i++)
        if (strcmp(sc->f[i].name, name) == 0)
            return &sc->f[i];
    return NULL;
}

/* The family a sample name belongs to: itself, or a histogram's _bucket/_sum/_count. */
static family_t *family_of(scrape_t *sc, const char *name, const char **ret_suffix)
{
    family_t *f = family(sc, name);
    *ret_suffix = "";
    if (f)
        return f;
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(name), k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0) {
            char base[128];
            snprintf(base, sizeof(base), "%.*s", (int)(n - k), name);
            f = family(sc, base);
            if (f && strcmp(f->type, "histogram") == 0) {
                *ret_suffix = suffixes[i];
                return f;
            }
        }
    }
    return NULL;
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        snprintf(why, 256, __VA_ARGS__);                                                           \
        return false;                                                                              \
    } while (0)

static bool parse_sample(scrape_t *sc, const char *line, char *why)
{
    sample_t smp = {0};
    const char *p = line;
    if (!take_name(&p, smp.name, sizeof(smp.name), true))
        BAD("no metric name");
    const char *suffix;
    family_t *f = family_of(sc, smp.name, &suffix);
    if (!f)
        BAD("%.60s: no TYPE line before it", smp.name);
    if (f != sc->cur)
        BAD("%.60s: a sample of %.60s after family %.60s began", smp.name, f->name, sc->cur->name);
    sp_buf_t lb;
    sp_buf_init(&lb);
    if (*p == '{') {
        p++;
        while (*p != '}') {
            char ln[128];
            if (!take_name(&p, ln, sizeof(ln), false) || *p++ != '=' || *p++ != '"') {
                sp_buf_dispose(&lb);
                BAD("%.60s: bad label", smp.name);
            }
            sp_buf_t v;
            sp_buf_init(&v);
            while (*p != '"') {
                if (*p == '\0' || *p == '\n') {
                    sp_buf_dispose(&v);
                    sp_buf_dispose(&lb);
                    BAD("%.60s: unterminated label value", smp.name);
                }
                if (*p == '\\') {
                    p++;
                    if (*p != '\\' && *p != '"' && *p != 'n') {
                        sp_buf_dispose(&v);
                        sp_buf_dispose(&lb);
                        BAD("%.60s: bad escape \\%c", smp.name, *p);
                    }
                    if (*p == 'n')
                        sp_buf_putc(&v, '\n');
                    else
                        sp_buf_putc(&v, *p);
                    p++;
                    continue;
                }
                sp_buf_putc(&v, *p++);
            }
            p++;
            if (strcmp(ln, "le") == 0 && strcmp(suffix, "_bucket") == 0) {
                snprintf(smp.le, sizeof(smp.le), "%s", v.data ? v.data : "");
            } else {
                if (lb.len)
                    sp_buf_putc(&lb, ',');
                sp_buf_printf(&lb, "%s=\"", ln);
                for (const char *q = v.data ? v.data : ""; *q; q++) {
                    if (*q == '\\')
                        sp_buf_puts(&lb, "\\\\");
                    else if (*q == '"')
                        sp_buf_puts(&lb, "\\\"");
                    else if (*q == '\n')
                        sp_buf_puts(&lb, "\\n");
                    else
                        sp_buf_putc(&lb, *q);
                }
                sp_buf_putc(&lb, '"');
            }
            sp_buf_dispose(&v);
            if (*p == ',')
                p++;
            else if (*p != '}') {
                sp_buf_dispose(&lb);
                BAD("%.60s: expected , or }", smp.name);
            }
        }
        p++;
    }
    snprintf(smp.labels, sizeof(smp.labels), "%s", lb.data ? lb.data : "");
    sp_buf_dispose(&lb);
    if (strcmp(suffix, "_bucket") == 0 && !smp.le[0])
        BAD("%.60s: a bucket without le", smp.name);
    if (*p++ != ' ')
        BAD("%.60s: no space before the value", smp.name);
    char val[64];
    size_t k = strcspn(p, " ");
    if (k == 0 || k >= sizeof(val))
        BAD("%.60s: no value", smp.name);
    memcpy(val, p, k);
    val[k] = '\0';
    if (!take_value(val, &smp.value))
        BAD("%.60s: bad value '%.60s'", smp.name, val);
    p += k;
    if (*p == ' ') { /* a timestamp: an integer */
        p++;
        if (*p == '-')
            p++;
        if (!isdigit((unsigned char)*p))
            BAD("%.60s: bad timestamp", smp.name);
        while (isdigit((unsigned char)*p))
            p++;
    }
    if (*p)
        BAD("%.60s: junk after the value", smp.name);
    if ((strcmp(f->type, "counter") == 0 || strcmp(suffix, "_count") == 0 ||
         strcmp(suffix, "_bucket") == 0) &&
        !(smp.value >= 0))
        BAD("%.60s: a negative count", smp.name);
    for (size_t i = 0; i < sc->n; i++)
        if (strcmp(sc->s[i].name, smp.name) == 0 && strcmp(sc->s[i].labels, smp.labels) == 0 &&
            strcmp(sc->s[i].le, smp.le) == 0)
            BAD("%.60s{%.60s}: twice", smp.name, smp.labels);
    if (sc->n == sc->cap) {
        sc->cap = sc->cap ? sc->cap * 2 : 256;
        sc->s = sp_xreallocarray(sc->s, sc->cap, sizeof(*sc->s));
    }
    sc->s[sc->n++] = smp;
    return true;
}

/* Buckets of each histogram series: le increasing, counts cumulative, the last +Inf and equal
 * to _count, and a _sum. */
static bool check_histograms(scrape_t *sc, char *why)
{
    for (size_t fi = 0; fi < sc->nf; fi++) {
        family_t *f = &sc->f[fi];
        if (strcmp(f->type, "histogram") != 0)
            continue;
        char bucket[160], count[160], sum[160];
        snprintf(bucket, sizeof(bucket), "%s_bucket", f->name);
        snprintf(count, sizeof(count), "%s_count", f->name);
        snprintf(sum, sizeof(sum), "%s_sum", f->name);
        for (size_t i = 0; i < sc->n; i++) {
            if (strcmp(sc->s[i].name, count) != 0)
                continue;
            const char *labels = sc->s[i].labels;
            double last_le = -INFINITY, last = 0;
            bool inf = false, has_sum = false;
            size_t nb = 0;
            for (size_t j = 0; j < sc->n; j++) {
                sample_t *b = &sc->s[j];
                if (strcmp(b->labels, labels) != 0)
                    continue;
                if (strcmp(b->name, sum) == 0)
                    has_sum = true;
                if (strcmp(b->name, bucket) != 0)
                    continue;
                double le;
                if (!take_value(b->le, &le) || !(le > last_le) || inf)
                    BAD("%.60s{%.60s}: le %.60s out of order", f->name, labels, b->le);
                if (b->value < last)
                    BAD("%.60s{%.60s}: buckets not cumulative at le %.60s", f->name, labels, b->le);
                last_le = le;
                last = b->value;
                inf = isinf(le) && le > 0;
                nb++;
            }
            if (!nb || !inf)
                BAD("%.60s{%.60s}: no +Inf bucket", f->name, labels);
            if (last != sc->s[i].value)
                BAD("%.60s{%.60s}: +Inf bucket %g != _count %g", f->name, labels, last,
                    sc->s[i].value);
            if (!has_sum)
                BAD("%.60s{%.60s}: no _sum", f->name, labels);
        }
    }
    return true;
}

static bool parse(const char *text, scrape_t *sc, char *why)
{
    memset(sc, 0, sizeof(*sc));
    size_t len = strlen(text);
    if (len == 0 || text[len - 1] != '\n')
        BAD("the text does not end with a newline");
    char *copy = sp_xstrdup(text), *save = NULL, *line;
    bool ok = true;
    for (line = strtok_r(copy, "\n", &save); line && ok; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0) {
            bool type = line[2] == 'T';
            const char *p = line + 7;
            char name[128];
            if (!take_name(&p, name, sizeof(name), true) || *p++ != ' ') {
                snprintf(why, 256, "bad %.60s line: %.80s", type ? "TYPE" : "HELP", line);
                ok = false;
                break;
            }
            family_t *f = family(sc, name);
            if (f && ((type && f->type[0]) || (!type && f->help))) {
                snprintf(why, 256, "%.60s: a second %.60s line", name, type ? "TYPE" : "HELP");
                ok = false;
                break;
            }
            if (f && f != sc->cur) {
                snprintf(why, 256, "%.60s: HELP or TYPE apart from the family's other lines", name);
                ok = false;
                break;
            }
            if (!f) {
                if (sc->nf == sizeof(sc->f) / sizeof(sc->f[0])) {
                    snprintf(why, 256, "too many families");
                    ok = false;
                    break;
                }
                f = &sc->f[sc->nf++];
                memset(f, 0, sizeof(*f));
                snprintf(f->name, sizeof(f->name), "%s", name);
                sc->cur = f; /* a new family: the earlier ones are over */
            }
            if (type) {
                static const char *const types[] = {"counter", "gauge", "histogram", "summary",
                                                    "untyped"};
                bool known = false;
                for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
                    known = known || strcmp(p, types[t]) == 0;
                if (!known) {
                    snprintf(why, 256, "%.60s: unknown type %.60s", name, p);
                    ok = false;
                    break;
                }
                snprintf(f->type, sizeof(f->type), "%s", p);
            } else {
                for (const char *q = p; *q; q++)
                    if (*q == '\\' && q[1] != '\\' && q[1] != 'n') {
                        snprintf(why, 256, "%.60s: bad escape in HELP", name);
                        ok = false;
                        break;
                    } else if (*q == '\\') {
                        q++;
                    }
                f->help = true;
            }
            continue;
        }
        if (line[0] == '#') {
            snprintf(why, 256, "a comment that is neither HELP nor TYPE: %.80s", line);
            ok = false;
            break;
        }
        /* Untyped families would be allowed by the format; ours always say their type. */
        ok = parse_sample(sc, line, why);
    }
    free(copy);
    for (size_t i = 0; ok && i < sc->nf; i++)
        if (!sc->f[i].type[0] || !sc->f[i].help) {
            snprintf(why, 256, "%.60s: no TYPE or no HELP", sc->f[i].name);
            ok = false;
        }
    if (ok)
        ok = check_histograms(sc, why);
    if (!ok)
        scrape_free(sc);
    return ok;
}

/* The value of name{labels} (labels as the parser writes them), or NAN when absent. */
static double value_of(const scrape_t *sc, const char *name, const char *labels)
{
    for (size_t i = 0; i < sc->n; i++)
        if (strcmp(sc->s[i].name, name) == 0 && strcmp(sc->s[i].labels, labels) == 0 &&
            !sc->s[i].le[0])
            return sc->s[i].value;
    return NAN;
}

/* The sum of every series of name. */
static double sum_of(const scrape_t *sc, const char *name)
{
    double v = 0;
    for (size_t i = 0; i < sc->n; i++)
        if (strcmp(sc->s[i].name, name) == 0)
            v += sc->s[i].value;
    return v;
}

static bool has_family(const scrape_t *sc, const char *name)
{
    for (size_t i = 0; i < sc->nf; i++)
        if (strcmp(sc->f[i].name, name) == 0)
            return true;
    return false;
}

/* ---- scraping ---- */

static const char *const daemons[] = {"space-eventlog", "space-scheduler", "space-worker",
                                      "space-credstore", "space-egressd"};
#define N_DAEMONS (sizeof(daemons) / sizeof(daemons[0]))
static int ports[N_DAEMONS];

/* GET path from 127.0.0.1:port; the status, the body into *ret (heap). */
static int get(int port, const char *method, const char *path, char **ret)
{
    sp_test_http_resp_t r;
    sp_test_http(port, method, path, NULL, NULL, NULL, 0, &r);
    int status = r.status;
    *ret = sp_xstrndup(r.body ? r.body : "", r.body_len);
    sp_test_http_free(&r);
    return status;
}

/* Scrapes and parses; fails the test, quoting the parser, when the text is not strict 0.0.4. */
static char *scrape(int port, const char *who, scrape_t *sc)
{
    char *body = NULL, why[256] = "";
    int status = get(port, "GET", "/metrics", &body);
    if (status != 200)
        fail_msg("%s: GET /metrics answered %d: %.200s", who, status, body);
    if (!parse(body, sc, why))
        fail_msg("%s: /metrics does not parse: %s", who, why);
    return body;
}

/* promtool (Debian's prometheus package) on the text, when it is installed: its verdict on
 * the format (it also lints names: a counter must end in _total, units in the name). */
static void promtool(const char *who, const char *text)
{
    if (access("/usr/bin/promtool", X_OK) != 0)
        return;
    char path[] = "/tmp/space-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "/usr/bin/promtool check metrics < %s 2>&1", path);
    FILE *p = popen(cmd, "r"); /* NOLINT(cert-env33-c): the test's own tool on its own file */
    char out[4096] = "";
    size_t n = p ? fread(out, 1, sizeof(out) - 1, p) : 0;
    out[n] = '\0';
    int st = p ? pclose(p) : -1;
    unlink(path);
    if (st != 0)
        fail_msg("%s: promtool check metrics: %s", who, out);
}

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    api_port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    for (size_t i = 0; i < N_DAEMONS; i++)
        ports[i] = sp_test_metrics_port(daemons[i]);
    return 0;
}

/* The parser itself: it takes a good text and refuses each way of being wrong, so that the
 * daemons' scrapes passing it means something. */
static void test_parser_refuses(void **state)
{
    (void)state;
    static const char good[] = "# HELP a_total A.\n# TYPE a_total counter\n"
                               "a_total{x=\"q\\\"\\\\\\n\"} 1\n"
                               "# HELP h_seconds H.\n# TYPE h_seconds histogram\n"
                               "h_seconds_bucket{le=\"1\"} 1\nh_seconds_bucket{le=\"+Inf\"} 2\n"
                               "h_seconds_sum 3.5\nh_seconds_count 2\n";
    /* Some entries are two literals on two lines, on purpose. */
    /* NOLINTBEGIN(bugprone-suspicious-missing-comma) */
    static const char *const bad[] = {
        "a_total 1\n",                                                     /* no TYPE */
        "# HELP a A.\n# TYPE a gauge\na 1",                                /* no newline */
        "# HELP a A.\n# TYPE a gauge\na{x=\"\\t\"} 1\n",                   /* bad escape */
        "# HELP a A.\n# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n",       /* twice */
        "# HELP a A.\n# TYPE a gauge\na 1x\n",                             /* bad value */
        "# HELP a A.\n# TYPE a gauge\n# HELP b B.\n# TYPE b gauge\na 1\n", /* apart */
        "# HELP a A.\n# TYPE a gauge\n# just a comment\na 1\n",
        "# HELP a_total A.\n# TYPE a_total counter\na_total -1\n",
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
        "h_sum 1\nh_count 1\n", /* not cumulative */
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\n"
        "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n", /* le out of order */
    };
    /* NOLINTEND(bugprone-suspicious-missing-comma) */
    scrape_t sc;
    char why[256] = "";
    if (!parse(good, &sc, why))
        fail_msg("the good text: %s", why);
    assert_true(value_of(&sc, "a_total", "x=\"q\\\"\\\\\\n\"") == 1);
    scrape_free(&sc);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (parse(bad[i], &sc, why))
            fail_msg("bad text %zu parsed: %s", i, bad[i]);
}

/* Every daemon's scrape parses, with the families docs/metrics.md names for it. */
static void test_every_daemon_parses(void **state)
{
    (void)state;
    static const char *const want[N_DAEMONS][3] = {
        {"space_eventlog_events_total", "space_eventlog_store_seconds",
         "space_eventlog_lag_events"},
        {"space_scheduler_placements_total", "space_scheduler_controller_actions_total", NULL},
        {"space_worker_sandboxes", "space_worker_runsc_seconds", "space_worker_volume_bytes"},
        {"space_credstore_lookups_total", "space_credstore_credentials", NULL},
        {"space_egressd_requests_total", "space_egressd_bytes_total", NULL},
    };
    for (size_t i = 0; i < N_DAEMONS; i++) {
        scrape_t sc;
        char *text = scrape(ports[i], daemons[i], &sc);
        for (size_t k = 0; k < 3 && want[i][k]; k++)
            if (!has_family(&sc, want[i][k]))
                fail_msg("%s: no family %s", daemons[i], want[i][k]);
        promtool(daemons[i], text);
        scrape_free(&sc);
        free(text);
    }
    scrape_t sc;
    char *text = scrape(api_port, "space-gateway", &sc);
    assert_true(has_family(&sc, "space_gateway_requests_total"));
    promtool("space-gateway", text);
    scrape_free(&sc);
    free(text);
}

static int worker_port(void)
{
    return ports[2];
}

/* A sandbox's series in a fresh worker scrape. */
static void sandbox_values(const char *id, double *cpu, double *mem, double *disk)
{
    scrape_t sc;
    char labels[128];
    snprintf(labels, sizeof(labels), "sandbox=\"%s\"", id);
    char *text = scrape(worker_port(), "space-worker", &sc);
    *cpu = value_of(&sc, "space_worker_sandbox_cpu_seconds_total", labels);
    *mem = value_of(&sc, "space_worker_sandbox_memory_bytes", labels);
    *disk = value_of(&sc, "space_worker_sandbox_disk_bytes", labels);
    scrape_free(&sc);
    free(text);
}

static void expect_no_secret_anywhere(const char *secret)
{
    for (size_t i = 0; i <= N_DAEMONS; i++) {
        char *body = NULL;
        int port = i < N_DAEMONS ? ports[i] : api_port;
        assert_int_equal(get(port, "GET", "/metrics", &body), 200);
        if (strstr(body, secret))
            fail_msg("%s: the env value %s is in its metrics",
                     i < N_DAEMONS ? daemons[i] : "space-gateway", secret);
        free(body);
    }
}

/* One series of daemon i's scrape, or the sum of a family's when labels is NULL. */
static double one(size_t i, const char *name, const char *labels)
{
    scrape_t sc;
    char *text = scrape(ports[i], daemons[i], &sc);
    double v = labels ? value_of(&sc, name, labels) : sum_of(&sc, name);
    scrape_free(&sc);
    free(text);
    return v;
}

/* The per-sandbox series move when the sandbox works, and go when it does; the counters of
 * the daemons that decided its creation move with it. */
static void test_sandbox_series(void **state)
{
    (void)state;
    char secret[64], body[256], id[64];
    snprintf(secret, sizeof(secret), "metrics-secret-%ld-%d", (long)time(NULL), (int)getpid());
    snprintf(body, sizeof(body), "{\"template\":\"tiny\",\"env\":{\"PROBE_VALUE\":\"%s\"}}",
             secret);
    double placed0 = one(1, "space_scheduler_placements_total", "outcome=\"placed\"");
    double stored0 = one(0, "space_eventlog_events_total", "outcome=\"accepted\"");
    sp_test_create_sandbox_body(api_port, key, body, id);
    double placed1 = one(1, "space_scheduler_placements_total", "outcome=\"placed\"");
    if (!(placed1 >= placed0 + 1))
        fail_msg("placements{outcome=placed} %g -> %g after a create", placed0, placed1);
    /* The create's intent, placement and start at least, stored by the time it answered. */
    double stored1 = one(0, "space_eventlog_events_total", "outcome=\"accepted\"");
    if (!(stored1 >= stored0 + 3))
        fail_msg("events{outcome=accepted} %g -> %g after a create", stored0, stored1);
    if (!(one(2, "space_worker_runsc_seconds_count", NULL) > 0))
        fail_msg("the worker timed no runsc call");
    /* The env reaches the sandbox (so not finding it below means something). */
    sp_test_cmd_t r = sp_test_run(api_port, key, id, "{\"cmd\":\"echo $PROBE_VALUE\"}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.stdout_s ? r.stdout_s : "", secret));
    sp_test_cmd_free(&r);

    double cpu0 = NAN, mem0 = NAN, disk0 = NAN;
    for (int i = 0; i < 100 && (isnan(cpu0) || isnan(mem0) || isnan(disk0)); i++) {
        sandbox_values(id, &cpu0, &mem0, &disk0);
        if (isnan(cpu0) || isnan(mem0) || isnan(disk0))
            usleep(100 * 1000);
    }
    if (isnan(cpu0) || isnan(mem0) || isnan(disk0))
        fail_msg("sandbox %s: cpu %g memory %g disk %g: a series is missing", id, cpu0, mem0,
                 disk0);
    assert_true(mem0 > 0);

    /* About 2 s of busy shell, then 8 MiB onto its disk (/root is the sandbox's subvolume); the
     * command has an env value of its own, which no scrape may show either. */
    char work[512];
    snprintf(work, sizeof(work),
             "{\"cmd\":\"end=$(($(date +%%s)+2)); while [ $(date +%%s) -lt $end ]; do "
             "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; done; "
             "dd if=/dev/urandom of=/root/metrics.bin bs=1024 count=8192 2>/dev/null; "
             "sync; echo done\",\"env\":{\"CMD_PROBE\":\"cmd-%s\"}}",
             secret);
    r = sp_test_run(api_port, key, id, work);
    assert_int_equal(r.status, 200);
    if (!strstr(r.stdout_s ? r.stdout_s : "", "done"))
        fail_msg("the work did not finish: %s %s", r.stdout_s, r.stderr_s);
    sp_test_cmd_free(&r);

    /* CPU at once; disk once btrfs commits its transaction (every 30 s by default, which
     * this test waited for): committed here, from the host, as `btrfs filesystem sync` does. */
    assert_int_equal(sp_test_sh("btrfs filesystem sync '%s/worker/volumes' >/dev/null",
                                sp_test_env("SPACE_HOME")),
                     0);
    double cpu1 = NAN, mem1 = NAN, disk1 = NAN;
    for (int i = 0; i < 90; i++) {
        sandbox_values(id, &cpu1, &mem1, &disk1);
        if (cpu1 >= cpu0 + 1.0 && disk1 >= disk0 + 4 * 1024 * 1024)
            break;
        sleep(1);
    }
    if (!(cpu1 >= cpu0 + 1.0))
        fail_msg("sandbox %s: cpu seconds %g -> %g after 2 s of busy loop", id, cpu0, cpu1);
    if (!(disk1 >= disk0 + 4 * 1024 * 1024))
        fail_msg("sandbox %s: disk bytes %g -> %g after writing 8 MiB", id, disk0, disk1);
    assert_false(isnan(mem1));

    /* A DNS query from the sandbox: egressd decides it (whatever the verdict, nothing leaves
     * the host: the stack has no upstream resolver) and counts it. */
    scrape_t sc;
    char *text = scrape(ports[4], "space-egressd", &sc);
    double dns0 = sum_of(&sc, "space_egressd_dns_queries_total");
    scrape_free(&sc);
    free(text);
    r = sp_test_run(api_port, key, id, "{\"cmd\":\"nslookup metrics-probe.test; true\"}");
    assert_int_equal(r.status, 200);
    sp_test_cmd_free(&r);
    double dns1 = dns0;
    for (int i = 0; i < 50 && dns1 <= dns0; i++) {
        text = scrape(ports[4], "space-egressd", &sc);
        dns1 = sum_of(&sc, "space_egressd_dns_queries_total");
        scrape_free(&sc);
        free(text);
        if (dns1 <= dns0)
            usleep(100 * 1000);
    }
    if (!(dns1 > dns0))
        fail_msg("space_egressd_dns_queries_total stayed at %g after a query", dns0);

    expect_no_secret_anywhere(secret);

    char path[128];
    sp_test_http_resp_t d;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    sp_test_http(api_port, "DELETE", path, key, NULL, NULL, 0, &d);
    assert_true(d.status == 200 || d.status == 202 || d.status == 204);
    sp_test_http_free(&d);
    bool gone = false;
    for (int i = 0; i < 300 && !gone; i++) {
        char *all = NULL;
        assert_int_equal(get(worker_port(), "GET", "/metrics", &all), 200);
        gone = !strstr(all, id);
        free(all);
        if (!gone)
            usleep(100 * 1000);
    }
    if (!gone)
        fail_msg("sandbox %s: its series are still in the worker's metrics 30 s after delete", id);
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The listener of each daemon against clients that are not Prometheus. */
static void test_hostile_clients(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_DAEMONS; i++) {
        char *body = NULL;
        assert_int_equal(get(ports[i], "POST", "/metrics", &body), 405);
        free(body);
        assert_int_equal(get(ports[i], "GET", "/", &body), 404);
        free(body);
        assert_int_equal(get(ports[i], "GET", "/metrics/../metrics", &body), 404);
        free(body);
        /* A client that connects and says nothing, one that stops half way: the next scrape
         * is answered at once. */
        int idle = dial(ports[i]), half = dial(ports[i]);
        assert_int_equal(send(half, "GET /metr", 9, MSG_NOSIGNAL), 9);
        double t0 = now_s();
        scrape_t sc;
        char *text = scrape(ports[i], daemons[i], &sc);
        double took = now_s() - t0;
        scrape_free(&sc);
        free(text);
        if (took > 1.5)
            fail_msg("%s: a scrape beside an idle client took %.2f s", daemons[i], took);
        close(idle);
        close(half);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parser_refuses),
        cmocka_unit_test(test_every_daemon_parses),
        cmocka_unit_test(test_sandbox_series),
        cmocka_unit_test(test_hostile_clients),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
