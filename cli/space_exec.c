/* `space exec ID [options] [--] CMD [ARG...]`: a command in a sandbox as if it ran here. The
 * output is the SSE of POST /v1/sandboxes/{id}/commands, written as it comes; the exit status
 * is the command's (128 + signal when killed).
 *
 * stdin: unless it is a terminal (or -n), the command is started with stdin_open and, once its
 * `start` event names it, a thread copies our stdin to POST .../commands/{cid}/stdin in chunks
 * of at most CHUNK bytes (base64), in order (one request at a time), then sends eof: so
 * `echo data | space exec ID -- cat` prints data. A command that ends before reading it all
 * answers 409; the rest is dropped quietly, as a local pipe would.
 *
 * -t: the command runs on a pty of the local terminal's size (TIOCGWINSZ), the local terminal
 * in raw mode (restored at exit) so keys go through as typed; SIGWINCH is waited for by a
 * thread of its own (blocked everywhere else) that sends the new size to .../resize.
 *
 * SIGINT, SIGTERM and SIGHUP go on to the command (.../signal, its process group), as they
 * would to a local one; a second one, or one before the command started, ends this program
 * (128 + signal) and leaves the command to the sandbox. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "b64.h"
#include "buf.h"
#include "error.h"
#include "httpc.h"
#include "json.h"
#include "space_stack.h"
#include "sse.h"
#include "xmalloc.h"

#define CHUNK           (256 * 1024) /* stdin bytes per request (the API takes 512 KiB) */
#define CTL_TIMEOUT_MS  30000
#define DEFAULT_TIMEOUT 86400

typedef struct {
    const sp_api_t *api;
    char *sandbox;
    bool forward_stdin, pty;
    char cmd_id[64];
    bool started; /* cmd_id is known (atomic: the signal thread reads it) */
    bool exited;
    int64_t exit_code, signal;
    bool timed_out;
    char error[256];
    bool bad; /* an event that could not be read */
} exec_t;

static struct termios saved_tio;
static bool raw_mode;

static void restore_tty(void)
{
    if (raw_mode) {
        (void)tcsetattr(0, TCSADRAIN, &saved_tio);
        raw_mode = false;
    }
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* a closed pipe: the output has nowhere to go */
        p += w;
        n -= (size_t)w;
    }
}

/* POST .../commands/{cid}/<what> with body: the HTTP status, or < 0. */
static int ctl(const exec_t *x, const char *what, const char *body, size_t len)
{
    char *path = sp_xasprintf("/v1/sandboxes/%s/commands/%s/%s", x->sandbox, x->cmd_id, what);
    sp_httpc_resp_t r;
    int rc = sp__api_call(x->api, "POST", path, NULL, body, len, CTL_TIMEOUT_MS, &r);
    free(path);
    if (rc < 0)
        return rc;
    rc = r.status;
    sp_httpc_resp_free(&r);
    return rc;
}

/* Reads what stdin has, up to cap: blocks for the first bytes, then takes only what is already
 * there (an interactive line goes at once, a pipe in big chunks). 0 at EOF, < 0 on error. */
static ssize_t read_some(char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = read(0, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return n ? (ssize_t)n : -errno;
        if (r == 0)
            return (ssize_t)n;
        n += (size_t)r;
        struct pollfd p = {.fd = 0, .events = POLLIN};
        if (n == cap || poll(&p, 1, 0) <= 0)
            return (ssize_t)n;
    }
}

static void *stdin_thread(void *arg)
{
    exec_t *x = arg;
    char *buf = sp_xmalloc(CHUNK);
    sp_buf_t body;
    sp_buf_init(&body);
    for (;;) {
        ssize_t n = read_some(buf, CHUNK);
        sp_buf_reset(&body);
        if (n <= 0) {
            sp_buf_puts(&body, "{\"eof\":true}");
        } else {
            sp_buf_puts(&body, "{\"data_b64\":\"");
            sp_b64_encode(&body, (const uint8_t *)buf, (size_t)n);
            sp_buf_puts(&body, "\"}");
        }
        int st = ctl(x, "stdin", body.data, body.len);
        if (n <= 0 || st != 200)
            break; /* EOF sent, or the command no longer reads (409) */
    }
    explicit_bzero(buf, CHUNK);
    if (body.data)
        explicit_bzero(body.data, body.len);
    sp_buf_dispose(&body);
    free(buf);
    return NULL;
}

static bool term_size(unsigned *rows, unsigned *cols)
{
    struct winsize ws;
    for (int fd = 0; fd <= 2; fd++)
        if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
            *rows = ws.ws_row;
            *cols = ws.ws_col;
            return true;
        }
    return false;
}

/* The signals this program takes over while a command runs: SIGWINCH with -t, and those that
 * would end it, which go on to the command instead (a second one ends this program). */
static void exec_signals(sigset_t *set, bool pty)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
    if (pty)
        sigaddset(set, SIGWINCH);
}

/* Started before the request, so an interrupt before the command started still ends us. */
static void *signal_thread(void *arg)
{
    exec_t *x = arg;
    sigset_t set;
    bool forwarded = false;
    exec_signals(&set, x->pty);
    for (;;) {
        int sig;
        if (sigwait(&set, &sig) != 0)
            return NULL;
        bool started = __atomic_load_n(&x->started, __ATOMIC_ACQUIRE);
        if (sig == SIGWINCH) {
            unsigned rows, cols;
            if (!started || !term_size(&rows, &cols))
                continue;
            char body[64];
            int n = snprintf(body, sizeof(body), "{\"rows\":%u,\"cols\":%u}", rows, cols);
            (void)ctl(x, "resize", body, (size_t)n);
            continue;
        }
        if (!started || forwarded) {
            restore_tty();
            _exit(128 + sig);
        }
        char body[32];
        int n = snprintf(body, sizeof(body), "{\"signal\":%d}", sig);
        forwarded = ctl(x, "signal", body, (size_t)n) == 200;
    }
}

static void start_stdin(exec_t *x)
{
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (x->forward_stdin && pthread_create(&t, &a, stdin_thread, x) != 0)
        fprintf(stderr, "space exec: cannot forward stdin\n");
    pthread_attr_destroy(&a);
}

static int on_event(void *arg, const sp_sse_event_t *ev)
{
    exec_t *x = arg;
    bool out = strcmp(ev->event, "stdout") == 0, err = strcmp(ev->event, "stderr") == 0;
    bool exit_ev = strcmp(ev->event, "exit") == 0, start = strcmp(ev->event, "start") == 0;
    if (!out && !err && !exit_ev && !start)
        return 0; /* whatever a newer gateway adds */
    sp_json_doc_t *doc = NULL;
    char jerr[SP_JSON_ERR_MAX];
    sp_json_limits_t lim = {.max_bytes = ev->data_len + 1, .max_string = ev->data_len + 1};
    if (sp_json_parse(ev->data, ev->data_len, &lim, &doc, jerr) < 0) {
        x->bad = true;
        return 0;
    }
    const sp_json_t *root = sp_json_root(doc);
    if (start) {
        const char *id = sp_json_str(sp_json_get(root, "cmd_id"), NULL);
        if (id && strlen(id) < sizeof(x->cmd_id) && !x->started) {
            snprintf(x->cmd_id, sizeof(x->cmd_id), "%s", id);
            __atomic_store_n(&x->started, true, __ATOMIC_RELEASE); /* cmd_id is set */
            start_stdin(x);
        }
    } else if (exit_ev) {
        x->exited = true;
        sp_json_int(sp_json_get(root, "exit_code"), -1, 255, &x->exit_code);
        sp_json_int(sp_json_get(root, "signal"), 0, 127, &x->signal);
        sp_json_bool(sp_json_get(root, "timed_out"), &x->timed_out);
        const char *e = sp_json_str(sp_json_get(root, "error"), NULL);
        snprintf(x->error, sizeof(x->error), "%s", e ? e : "");
        bool lost = false, truncated = false;
        sp_json_bool(sp_json_get(root, "output_lost"), &lost);
        sp_json_bool(sp_json_get(root, "truncated"), &truncated);
        if (lost || truncated)
            fprintf(stderr, "space exec: output %s\n", lost ? "lost in part" : "truncated");
    } else {
        size_t n = 0;
        const char *text = sp_json_str(sp_json_get(root, "text"), &n);
        const char *b64 = sp_json_str(sp_json_get(root, "b64"), &n);
        uint8_t *bytes = NULL;
        if (text) {
            write_all(out ? 1 : 2, text, n);
        } else if (b64 && sp_b64_decode(b64, n, &bytes, &n) == 0) {
            write_all(out ? 1 : 2, (const char *)bytes, n);
            free(bytes);
        } else {
            x->bad = true;
        }
    }
    sp_json_doc_free(doc);
    return 0;
}

static int usage(void)
{
    sp_client_usage("exec", stderr);
    return SP_STACK_EXIT_USAGE;
}

int sp__client_exec(const sp_api_t *api, int argc, char **argv)
{
    const char *cwd = NULL, *user = NULL, *timeout = NULL, *v;
    char **env = sp_xcalloc((size_t)argc + 1, sizeof(char *));
    size_t nenv = 0;
    bool tty = false, no_stdin = false;
    int i = 0, code = SP_STACK_EXIT_USAGE;
    sp_buf_t body;
    sp_buf_init(&body);

    if (argc < 1 || argv[0][0] == '-')
        goto usage;
    /* ID, then options up to "--" or the first argument that is none: the command line. */
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (argv[i][0] != '-')
            break;
        if ((v = sp__opt_value(argc, argv, &i, "--env")))
            env[nenv++] = (char *)v;
        else if ((v = sp__opt_value(argc, argv, &i, "--cwd")))
            cwd = v;
        else if ((v = sp__opt_value(argc, argv, &i, "--user")))
            user = v;
        else if ((v = sp__opt_value(argc, argv, &i, "--timeout")))
            timeout = v;
        else if (strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "--tty") == 0)
            tty = true;
        else if (strcmp(argv[i], "-n") == 0 || strcmp(argv[i], "--no-stdin") == 0)
            no_stdin = true;
        else {
            fprintf(stderr, "space exec: unknown option '%s'\n", argv[i]);
            goto usage;
        }
    }
    if (i >= argc) {
        fprintf(stderr, "space exec: no command given\n");
        goto usage;
    }
    char *end = NULL;
    long long t = timeout ? strtoll(timeout, &end, 10) : DEFAULT_TIMEOUT;
    if (timeout && (!*timeout || *end || t < 1 || t > DEFAULT_TIMEOUT)) {
        fprintf(stderr, "space exec: --timeout takes 1..%d seconds\n", DEFAULT_TIMEOUT);
        goto usage;
    }
    /* Static: the detached threads may still look at it while the process exits. */
    static exec_t x;
    x = (exec_t){.api = api,
                 .sandbox = argv[0],
                 .pty = tty,
                 .forward_stdin = !no_stdin && (tty || !isatty(0)),
                 .exit_code = -1};

    sp_buf_puts(&body, "{\"argv\":[");
    for (int k = i; k < argc; k++) {
        if (k > i)
            sp_buf_putc(&body, ',');
        sp_buf_json_str(&body, argv[k]);
    }
    sp_buf_printf(&body, "],\"timeout_s\":%lld", t);
    if (sp__put_map(&body, "env", env, nenv, true) < 0) {
        fprintf(stderr, "space exec: --env takes NAME=VALUE or NAME\n");
        goto usage;
    }
    if (cwd) {
        sp_buf_puts(&body, ",\"cwd\":");
        sp_buf_json_str(&body, cwd);
    }
    if (user) {
        sp_buf_puts(&body, ",\"user\":");
        sp_buf_json_str(&body, user);
    }
    if (x.forward_stdin)
        sp_buf_puts(&body, ",\"stdin_open\":true");
    if (tty) {
        unsigned rows = 24, cols = 80;
        (void)term_size(&rows, &cols);
        sp_buf_printf(&body, ",\"pty\":{\"rows\":%u,\"cols\":%u}", rows, cols);
        if (isatty(0) && tcgetattr(0, &saved_tio) == 0) {
            struct termios raw = saved_tio;
            cfmakeraw(&raw);
            if (tcsetattr(0, TCSADRAIN, &raw) == 0) {
                raw_mode = true;
                atexit(restore_tty);
            }
        }
    }
    sp_buf_putc(&body, '}');

    /* The signals go to the signal thread only: blocked here, before any thread is made. */
    sigset_t set;
    pthread_t sig_thread;
    exec_signals(&set, tty);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (pthread_create(&sig_thread, NULL, signal_thread, &x) == 0)
        pthread_detach(sig_thread);
    char *path = sp_xasprintf("/v1/sandboxes/%s/commands", x.sandbox);
    sp_httpc_resp_t r;
    int rc = sp__api_sse(api, "POST", path, body.data, body.len, 0, on_event, &x, &r);
    free(path);
    restore_tty();

    if (r.headers && (r.status < 200 || r.status > 299)) {
        code = sp__api_error("space exec", &r);
    } else if (rc < 0 || !x.exited) {
        fprintf(stderr, "space exec: the stream ended before the command did%s%s\n",
                rc < 0 ? ": " : "", rc < 0 ? sp_strerror(rc) : "");
        code = SP_STACK_EXIT_FAIL;
    } else {
        if (x.timed_out)
            fprintf(stderr, "space exec: timed out after %lld s\n", t);
        if (x.error[0])
            fprintf(stderr, "space exec: %s\n", x.error);
        if (x.bad)
            fprintf(stderr, "space exec: some output could not be decoded\n");
        code = x.signal           ? 128 + (int)x.signal
               : x.exit_code >= 0 ? (int)x.exit_code
                                  : SP_STACK_EXIT_FAIL;
    }
    sp_httpc_resp_free(&r);
    goto out;
usage:
    code = usage();
out:
    if (body.data)
        explicit_bzero(body.data, body.len); /* env values */
    sp_buf_dispose(&body);
    free(env);
    return code;
}
