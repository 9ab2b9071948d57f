/* `space up` waits for the worker's templates: from the worker's status file
 * ($SPACE_HOME/worker/templates.status, tmplstat.h) and the API (GET /v1/templates lists a
 * template once the worker's heartbeat offering it reached the projection: what a create
 * needs). A line every PROGRESS_MS while one builds; a failed build, or the worker gone, ends
 * the wait with the reason. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "httpc.h"
#include "ids.h"
#include "json.h"
#include "space_proc.h"
#include "space_stack.h"
#include "tmplstat.h"
#include "xmalloc.h"

#define POLL_MS     250
#define PROGRESS_MS 5000
/* The worker bounds one build at 30 minutes (WK_TEMPLATE_TIMEOUT_MS); several build in turn. */
#define WAIT_MS (2LL * 60 * 60 * 1000)

static char *status_path(const sp_stack_t *st)
{
    return sp_xasprintf("%s/worker/" SP_TMPLSTAT_FILE, st->home);
}

/* The running worker's pid, 0 if none. */
static pid_t worker_pid(const sp_stack_t *st)
{
    char *pidfile = sp_xasprintf("%s/space-worker.pid", st->run_dir);
    pid_t pid = 0;
    if (sp_proc_pidfile_check(pidfile, "space-worker", &pid) != 1)
        pid = 0;
    free(pidfile);
    return pid;
}

/* The status the running worker wrote; 0 when there is one of that worker. */
static int read_status(const sp_stack_t *st, pid_t pid, sp_tmplstat_t *t, size_t *ret_n)
{
    char *path = status_path(st);
    int wpid = 0;
    int rc = sp_tmplstat_read(path, &wpid, t, SP_TMPLSTAT_MAX, ret_n);
    free(path);
    if (rc == 0 && (pid == 0 || wpid != (int)pid))
        rc = -ESRCH; /* another (earlier) worker's */
    return rc;
}

/* The last line of the build log a building template's detail names ("log <path>"). */
static void log_line(const char *detail, char *out, size_t len)
{
    out[0] = '\0';
    if (strncmp(detail, "log ", 4) != 0)
        return;
    FILE *f = fopen(detail + 4, "re");
    if (!f)
        return;
    char buf[1024];
    if (fseek(f, 0, SEEK_END) == 0) {
        long end = ftell(f);
        (void)fseek(f, end > (long)sizeof(buf) - 1 ? end - (long)sizeof(buf) + 1 : 0, SEEK_SET);
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    const char *l = strrchr(buf, '\n');
    l = l ? l + 1 : buf;
    size_t k = 0;
    for (; *l && k + 1 < len; l++) {
        char c = *l;
        if (c < 0x20 || c == 0x7f)
            c = '?';
        out[k++] = c;
    }
    out[k] = '\0';
}

/* Whether GET /v1/templates names every template in t. */
static bool api_lists(const char *api_url, const char *api_key, const sp_tmplstat_t *t, size_t n)
{
    char host[64];
    int port;
    if (sp_httpc_parse_url(api_url, host, sizeof(host), &port) < 0)
        return false;
    sp_httpc_req_t req = {.host = host,
                          .port = port,
                          .method = "GET",
                          .path = "/v1/templates",
                          .key = api_key,
                          .timeout_ms = 5000};
    sp_httpc_resp_t r;
    if (sp_httpc_do(&req, &r) < 0)
        return false;
    bool all = false;
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    sp_json_limits_t lim = {.max_bytes = 1u << 20};
    if (r.status == 200 && sp_json_parse(r.body, r.body_len, &lim, &doc, err) == 0) {
        const sp_json_t *list = sp_json_get(sp_json_root(doc), "templates");
        all = true;
        for (size_t i = 0; i < n && all; i++) {
            bool found = false;
            for (size_t j = 0; j < sp_json_len(list) && !found; j++) {
                const char *name = sp_json_str(sp_json_get(sp_json_at(list, j), "name"), NULL);
                found = name && strcmp(name, t[i].name) == 0;
            }
            all = found;
        }
        sp_json_doc_free(doc);
    }
    sp_httpc_resp_free(&r);
    return all;
}

int sp__templates_wait(const sp_stack_t *st, const char *api_url, const char *api_key)
{
    static sp_tmplstat_t t[SP_TMPLSTAT_MAX];
    long long t0 = sp_proc_now_ms(), report_at = t0 + PROGRESS_MS;
    for (;;) {
        long long now = sp_proc_now_ms();
        pid_t pid = worker_pid(st);
        size_t n = 0;
        if (pid == 0) {
            char *log = sp_xasprintf("%s/space-worker.log", st->log_dir);
            sp__stack_fail_log("space-worker exited while its templates were being made", log);
            free(log);
            return -1;
        }
        int rc = read_status(st, pid, t, &n);
        bool ready = rc == 0;
        for (size_t i = 0; rc == 0 && i < n; i++) {
            if (t[i].state == SP_TMPL_FAILED) {
                fprintf(stderr, "space up: template %s failed: %s\n", t[i].name, t[i].detail);
                return -1;
            }
            ready = ready && t[i].state == SP_TMPL_READY;
        }
        if (ready && (!api_url || api_lists(api_url, api_key, t, n))) {
            sp_buf_t b;
            sp_buf_init(&b);
            for (size_t i = 0; i < n; i++)
                sp_buf_printf(&b, "%s%s (%s, %.1f s)", i ? ", " : "", t[i].name, t[i].detail,
                              (double)t[i].took_ms / 1000.0);
            printf("%-*s ready    %s\n", SP_STACK_PART_WIDTH, "templates",
                   n ? b.data : "(none configured)");
            sp_buf_dispose(&b);
            return 0;
        }
        if (now >= report_at) {
            report_at = now + PROGRESS_MS;
            int64_t wall_ms = sp_now_us() / 1000;
            for (size_t i = 0; rc == 0 && i < n; i++) {
                char line[160];
                if (t[i].state == SP_TMPL_READY)
                    continue;
                log_line(t[i].detail, line, sizeof(line));
                printf("%-*s %-8s %s %.0f s%s%s\n", SP_STACK_PART_WIDTH, "templates",
                       sp_tmpl_state_name(t[i].state), t[i].name,
                       (double)(wall_ms - t[i].since_ms) / 1000.0, line[0] ? ": " : "", line);
            }
            if (rc != 0 || ready)
                printf("%-*s waiting  for the worker to offer them (%.0f s)\n", SP_STACK_PART_WIDTH,
                       "templates", (double)(now - t0) / 1000.0);
            fflush(stdout);
        }
        if (now - t0 > WAIT_MS) {
            fprintf(stderr, "space up: the templates were not ready after %lld min\n",
                    WAIT_MS / 60000);
            return -1;
        }
        sp_proc_sleep_ms(POLL_MS);
    }
}

bool sp__templates_failed(const sp_stack_t *st, char *name, size_t len)
{
    static sp_tmplstat_t t[SP_TMPLSTAT_MAX];
    size_t n = 0;
    pid_t pid = worker_pid(st);
    if (pid == 0 || read_status(st, pid, t, &n) < 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (t[i].state == SP_TMPL_FAILED) {
            snprintf(name, len, "%s", t[i].name);
            return true;
        }
    }
    return false;
}

void sp__templates_report(const sp_stack_t *st)
{
    static sp_tmplstat_t t[SP_TMPLSTAT_MAX];
    size_t n = 0;
    pid_t pid = worker_pid(st);
    if (pid == 0 || read_status(st, pid, t, &n) < 0)
        return;
    for (size_t i = 0; i < n; i++)
        printf("%-*s %-8s %s (%s)\n", SP_STACK_PART_WIDTH, "template",
               sp_tmpl_state_name(t[i].state), t[i].name, t[i].detail);
}
