/* space-gateway: the HTTP/JSON API (DESIGN.md, gateway-api/). It authenticates, validates,
 * turns each mutation into an intent event on the bus, waits until the PostgreSQL projection
 * shows the outcome, serves reads from the projections and streams the event log as SSE. It
 * reads only PostgreSQL and writes only intents; commands go to their worker on the data plane
 * (core NATS) and stream their output back. Stateless: run as many as needed.
 *
 * Concurrency: one libuv loop runs h2o and every piece of request state. Nothing on the loop
 * blocks:
 * - libpq and sp_bus_publish are blocking calls, so they run as jobs on libuv's thread pool
 *   (uv_queue_work), each with a PostgreSQL connection of a small pool (pg-pool) handed to it
 *   by the loop; jobs that find every connection busy wait in a bounded FIFO on the loop. This
 *   was chosen over libpq's async API with uv_poll because the library calls we reuse
 *   (sp_apikey_verify, sp_db_*) are synchronous, the queries are short, and one code path per
 *   query is easier to get right than a state machine per query.
 * - Read-your-writes uses one more connection, in its own thread, that LISTENs on the event
 *   log's channel (SP_EVENTLOG_CHANNEL): it blocks in poll() on PQsocket, and on each NOTIFY
 *   stores the new head and wakes the loop with uv_async_send. The loop then re-checks the
 *   requests waiting for an outcome and lets live SSE streams read what is new.
 * - cnats runs its own threads. Blocking NATS calls run on libuv's thread pool: intents are
 *   published from database jobs; a command's subscribe, publish and exec request/reply, and
 *   the drain of its subscription, are "bus jobs" without a database connection, at most
 *   bus-threads at once (the pool has pg-pool + 1 + bus-threads threads, so database jobs never
 *   wait behind them). Data-plane callbacks run on cnats threads: they only fill a command's
 *   mutex-protected queue and wake the loop with its uv_async_t (gateway_commands.c).
 *
 * SIGTERM or SIGINT: stop accepting, answer waiting requests with 503, end streams, half-close
 * idle connections, let running jobs finish, exit 0; stop-timeout-s bounds it all. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "busid.h"
#include "config.h"
#include "daemon.h"
#include "error.h"
#include "gateway.h"
#include "ids.h"
#include "log.h"
#include "netpolicy.h"

static const sp_cfg_opt_t options[] = {
    SP_CFG_STR_OPT("listen-host", gw_config_t, listen_host, "127.0.0.1",
                   "address to listen on (IPv4 or IPv6 literal)"),
    SP_CFG_INT_OPT("port", gw_config_t, port, 0, 65535, "8080",
                   "TCP port; 0 picks a free one (see --port-file)"),
    SP_CFG_STR_OPT("port-file", gw_config_t, port_file, NULL,
                   "write the bound port here (decimal), e.g. $SPACE_HOME/run/space-gateway.port"),
    SP_BUSID_CFG_OPTS(gw_config_t, identity, creds_dir),
    SP_CFG_STR_OPT("nats-url", gw_config_t, nats_url, "nats://127.0.0.1:4222",
                   "NATS server URL(s)"),
    SP_CFG_STR_OPT("nats-user", gw_config_t, nats_user, NULL, "NATS user"),
    SP_CFG_STR_OPT("nats-password", gw_config_t, nats_password, NULL, "NATS password"),
    SP_CFG_STR_OPT("pg-url", gw_config_t, pg_url, "postgresql:///space", "PostgreSQL URI"),
    SP_CFG_INT_OPT("pg-pool", gw_config_t, pg_pool, 1, 64, "4",
                   "PostgreSQL connections for queries (plus one for LISTEN)"),
    SP_CFG_INT_OPT("queue-max", gw_config_t, queue_max, 1, 1000000, "10000",
                   "queries waiting for a connection before requests get 503"),
    SP_CFG_INT_OPT("create-timeout-s", gw_config_t, create_timeout_s, 1, 3600, "60",
                   "longest wait for a created sandbox to run (then 504)"),
    SP_CFG_INT_OPT("delete-timeout-s", gw_config_t, delete_timeout_s, 1, 3600, "60",
                   "longest wait for a deleted sandbox to be gone (then 504)"),
    SP_CFG_INT_OPT("sse-keepalive-s", gw_config_t, sse_keepalive_s, 1, 3600, "15",
                   "seconds between keepalive comments on an idle event stream"),
    SP_CFG_INT_OPT("sse-max-lag-bytes", gw_config_t, sse_max_lag_bytes, 1048576, 1073741824,
                   "4194304", "unsent bytes after which a slow stream is closed"),
    SP_CFG_INT_OPT("sse-write-timeout-s", gw_config_t, sse_write_timeout_s, 1, 3600, "60",
                   "a stream whose write does not complete in this time is closed"),
    SP_CFG_INT_OPT("max-streams", gw_config_t, max_streams, 0, 100000, "1000",
                   "concurrent event streams (429 beyond)"),
    SP_CFG_INT_OPT("max-body-bytes", gw_config_t, max_body_bytes, 1024, 67108864, "1048576",
                   "largest request body (413 beyond, chunked or not)"),
    SP_CFG_INT_OPT("stop-timeout-s", gw_config_t, stop_timeout_s, 1, 60, "5",
                   "longest graceful stop before the process exits anyway"),
    SP_CFG_INT_OPT("command-grace-s", gw_config_t, command_grace_s, 1, 3600, "30",
                   "a command whose end has not come timeout_s plus this after it started is "
                   "answered exit -1, \"timeout waiting for the worker\""),
    SP_CFG_INT_OPT("max-commands", gw_config_t, max_commands, 0, 100000, "128",
                   "commands handled at once (429 beyond); each may hold 32 MiB in JSON mode"),
    SP_CFG_INT_OPT("command-buffer-bytes", gw_config_t, command_buffer_bytes, 1048576, 1073741824,
                   "8388608",
                   "output buffered for a slow SSE client per command; beyond it is dropped"),
    SP_CFG_INT_OPT("command-reply-wait-ms", gw_config_t, command_reply_wait_ms, 0, 1000, "25",
                   "a JSON-answered command's worker answers when it ends within this, with all "
                   "its output (no live output to subscribe to); 0: always live"),
    SP_CFG_INT_OPT("bus-threads", gw_config_t, bus_threads, 1, 256, "8",
                   "threads for blocking NATS calls of commands (exec request/reply)"),
    SP_CFG_INT_OPT("max-file-bytes", gw_config_t, max_file_bytes, 1048576, 68719476736LL,
                   "1073741824",
                   "largest file upload (413 beyond); bodies over 4 MiB spill to tmp-dir"),
    SP_CFG_INT_OPT("max-file-transfers", gw_config_t, max_file_transfers, 1, 100000, "64",
                   "file requests handled at once (429 beyond)"),
    SP_CFG_INT_OPT("file-threads", gw_config_t, file_threads, 1, 256, "4",
                   "threads for the blocking NATS calls of file transfers"),
    SP_CFG_INT_OPT("watcher-idle-s", gw_config_t, watcher_idle_s, 1, 3600, "60",
                   "an E2B polling watcher (CreateWatcher) not polled for this long is removed"),
    SP_CFG_INT_OPT("signed-url-index", gw_config_t, signed_url_index, 16, 1048576, "1024",
                   "E2B signed URLs: tokens indexed to find a URL's sandbox, the most one "
                   "request hashes (~0.3 us each)"),
    SP_CFG_INT_OPT("signed-url-fail-per-s", gw_config_t, signed_url_fail_per_s, 1, 100000, "10",
                   "failed signed-URL checks a client address may make a second (429 beyond)"),
    SP_CFG_INT_OPT("signed-url-fail-burst", gw_config_t, signed_url_fail_burst, 1, 100000, "20",
                   "failed signed-URL checks a client address may make at once"),
    SP_CFG_INT_OPT("signed-url-global-per-s", gw_config_t, signed_url_global_per_s, 1, 1000000,
                   "100", "failed signed-URL checks the gateway allows a second, all clients"),
    SP_CFG_INT_OPT("signed-url-global-burst", gw_config_t, signed_url_global_burst, 1, 1000000,
                   "200", "failed signed-URL checks the gateway allows at once, all clients"),
    SP_CFG_STR_OPT("tmp-dir", gw_config_t, tmp_dir, "/tmp",
                   "where request bodies over 4 MiB spill (unlinked temporary files)"),
    SP_CFG_STR_OPT("network-default", gw_config_t, network_default, "deny_all",
                   "network policy mode of sandboxes created without one: deny_all, allow_all "
                   "or allowlist (an empty allowlist)"),
    SP_CFG_BOOL_OPT("seal-output", gw_config_t, seal_output, "false",
                    "leave command lines out of CommandRequested: the workers record them "
                    "sealed under the sandbox's data key (docs/audit.md; space up: with "
                    "space-credstore)"),
    SP_CFG_STR_OPT("log-level", gw_config_t, log_level, "info", "debug|info|warn|error"),
    SP_CFG_STR_OPT("log-format", gw_config_t, log_format, "kv", "kv|json"),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* The process's identity on the bus: lives as long as the process publishes. */
static sp_busid_t busid;
static sp_sign_key_t *own_token_key;

#define TICK_MS          1000
#define STOP_TICK_MS     100
#define FORCE_STREAMS_NS (2LL * 1000 * 1000 * 1000)

static gw_t gw;
static uv_timer_t tick_timer, stop_timer;
static uv_signal_t sig_term, sig_int;
static int64_t stop_started_ns;
static bool finished;

static void on_notify(uv_async_t *a)
{
    (void)a;
    uint64_t head = atomic_load(&gw.notify.head);
    gw_auth_sync(&gw);
    if (head > gw.head_seq)
        gw.head_seq = head;
    gw_waiters_check(&gw);
    gw_events_notify(&gw);
}

static void on_tick(uv_timer_t *t)
{
    (void)t;
    gw_waiters_expire(&gw);
    /* A safety net under NOTIFY (a notification lost with its connection). */
    gw_waiters_check(&gw);
    gw_events_tick(&gw);
    gw_commands_tick(&gw);
    gw_watches_tick(&gw);
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void close_walked(uv_handle_t *h, void *arg)
{
    (void)arg;
    close_handle(h);
}

static void finish(void)
{
    finished = true;
    uv_timer_stop(&stop_timer);
    close_handle((uv_handle_t *)&stop_timer);
    close_handle((uv_handle_t *)&tick_timer);
    close_handle((uv_handle_t *)&sig_term);
    close_handle((uv_handle_t *)&sig_int);
    gw_listener_stop(&gw.notify);
    close_handle((uv_handle_t *)&gw.notify.async);
    /* h2o's own handles (its queue) keep the loop alive: main disposes the context once
     * uv_run has returned (h2o_context_dispose runs the loop itself, which a callback must
     * not do). */
    uv_stop(gw.loop);
}

static void on_stop_tick(uv_timer_t *t)
{
    (void)t;
    int64_t elapsed = sp_mono_ns() - stop_started_ns;

    if (elapsed > FORCE_STREAMS_NS) {
        gw_events_close_all(&gw, true);
        gw_commands_close_all(&gw, true);
        gw_watches_close_all(&gw, true);
        gw_files_close_all(&gw);
    }
    if (gw_http_connections(&gw) == 0 && gw.pool.running == 0 && gw.pool.queued == 0 &&
        gw.n_streams == 0 && gw.n_commands == 0 && gw.n_files == 0 && gw.n_watches == 0) {
        sp_log(SP_LOG_INFO, "stopped", SP_KF("took_ms", (double)elapsed / 1e6));
        finish();
        return;
    }
    if (elapsed > gw.cfg->stop_timeout_s * 1000000000LL) {
        sp_log(SP_LOG_WARN, "stop timeout: exiting with work in progress",
               SP_KU("connections", gw_http_connections(&gw)), SP_KU("jobs", gw.pool.running),
               SP_KU("streams", gw.n_streams), SP_KU("commands", gw.n_commands));
        if (gw.cfg->port_file[0])
            unlink(gw.cfg->port_file);
        _exit(0);
    }
}

static void begin_stop(void)
{
    if (gw.stopping)
        return;
    gw.stopping = true;
    stop_started_ns = sp_mono_ns();
    sp_log(SP_LOG_INFO, "stopping", SP_KU("connections", gw_http_connections(&gw)),
           SP_KU("streams", gw.n_streams), SP_KU("waiting", gw.n_waiters));
    if (gw.listener_open) {
        close_handle((uv_handle_t *)&gw.listener);
        gw.listener_open = false;
    }
    /* New requests on open connections get "Connection: close". Not
     * h2o_context_request_shutdown: its HTTP/2 part arms a one-second timer that would still
     * be pending when the context is disposed (h2o 2.2 asserts there), for connections this
     * HTTP/1.1-only server never has. */
    gw.h2o_ctx.shutdown_requested = 1;
    gw_waiters_abort_all(&gw);
    gw_events_close_all(&gw, false);
    gw_commands_close_all(&gw, false);
    gw_watches_close_all(&gw, false);
    gw_files_close_all(&gw);
    gw_http_shutdown_reads(&gw);
    uv_timer_stop(&tick_timer);
    uv_timer_start(&stop_timer, on_stop_tick, 0, STOP_TICK_MS);
}

static void on_signal(uv_signal_t *s, int signum)
{
    (void)s;
    (void)signum;
    begin_stop();
}

static int write_port_file(const char *path, int port)
{
    char tmp[4096];
    char text[16];
    int n = snprintf(text, sizeof(text), "%d\n", port);
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    if (write(fd, text, (size_t)n) != n || fsync(fd) < 0) {
        int e = errno ? -errno : -EIO;
        close(fd);
        unlink(tmp);
        return e;
    }
    close(fd);
    /* Readers never see a partial file. */
    if (rename(tmp, path) < 0) {
        int e = -errno;
        unlink(tmp);
        return e;
    }
    return 0;
}

static int bound_port(void)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getsockname(&gw.listener, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

int main(int argc, char **argv)
{
    sp_daemon_no_core(); /* before any secret is read */
    gw_config_t cfg = {0};
    uv_loop_t loop;
    bool loop_ready = false;
    char *err = NULL;
    int argi = 0, exit_code = 1, rc;
    sp_log_level_t level;
    sp_log_format_t format;

    gw.notify.wake_fd = -1;
    /* The routes this binary serves, for tests/openapi (checked against api/openapi.json). */
    if (argc == 2 && strcmp(argv[1], "--list-routes") == 0) {
        gw_routes_print(stdout);
        return 0;
    }
    rc = sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err);
    if (rc < 0) {
        fprintf(stderr, GW_DAEMON ": %s\n", err ? err : sp_strerror(rc));
        goto out;
    }
    if (argi < 0) {
        exit_code = 0;
        goto out;
    }
    if (argi < argc) {
        fprintf(stderr, GW_DAEMON ": unexpected argument '%s'\n", argv[argi]);
        goto out;
    }
    if (sp_log_level_parse(cfg.log_level, &level) < 0 ||
        sp_log_format_parse(cfg.log_format, &format) < 0) {
        fprintf(stderr, GW_DAEMON ": bad --log-level or --log-format\n");
        goto out;
    }
    sp_netmode_t netmode;
    if (sp_netmode_parse(cfg.network_default, &netmode) < 0) {
        fprintf(stderr, GW_DAEMON ": --network-default must be deny_all, allow_all or allowlist\n");
        goto out;
    }
    sp_log_init(GW_DAEMON, level, format);
    signal(SIGPIPE, SIG_IGN);

    /* libuv sizes its thread pool at the first job: one thread per pooled connection and per
     * bus job, so a job never waits for a thread while holding a connection. */
    char pool_threads[24];
    snprintf(pool_threads, sizeof(pool_threads), "%lld",
             (long long)cfg.pg_pool + 1 + (long long)cfg.bus_threads + (long long)cfg.file_threads);
    setenv("UV_THREADPOOL_SIZE", pool_threads, 1);

    gw.cfg = &cfg;
    gw_signed_init(&gw.signed_urls, &cfg);
    sp_bus_opts_t bo = {.url = cfg.nats_url,
                        .name = GW_DAEMON,
                        .user = cfg.nats_user[0] ? cfg.nats_user : NULL,
                        .password = cfg.nats_password[0] ? cfg.nats_password : NULL,
                        .timeout_ms = 5000,
                        /* Requests to workers and the intents are on the API's latency. */
                        .send_asap = true};
    char iderr[SP_BUSID_ERR_MAX];
    if (sp_busid_setup(cfg.creds_dir, cfg.identity, "gateway", &busid, &bo, iderr) < 0) {
        sp_log(SP_LOG_ERROR, "bad identity", SP_KS("error", iderr));
        goto out;
    }
    /* E2B access tokens are signed with the identity's key, which every gateway of the
     * deployment shares; without one (no creds-dir) a key of this process's own, so its tokens
     * end with it. */
    gw.token_key = busid.key;
    if (gw.token_key)
        gw.token_ring = gw_token_ring_new(cfg.creds_dir, busid.name);
    if (!gw.token_key) {
        uint8_t raw[32];
        sp_random_bytes(raw, sizeof(raw));
        rc = sp_sign_key_from_raw(raw, &own_token_key);
        explicit_bzero(raw, sizeof(raw));
        if (rc < 0) {
            sp_log(SP_LOG_ERROR, "cannot make a token key", SP_KS("error", sp_strerror(rc)));
            goto out;
        }
        gw.token_key = own_token_key;
        sp_log(SP_LOG_WARN, "no identity: E2B access tokens are valid only while this process "
                            "runs");
    }
    if ((rc = sp_bus_connect(&bo, &gw.bus)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot connect to NATS", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    if ((rc = sp_bus_ensure_stream(gw.bus)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot set up the stream", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    if (gw_pool_open(&gw.pool, cfg.pg_url, (size_t)cfg.pg_pool, (size_t)cfg.queue_max, 30000) < 0)
        goto out;

    uv_loop_init(&loop);
    loop_ready = true;
    gw.loop = &loop;
    gw.bus_lane.max = cfg.bus_threads;
    gw.file_lane.max = cfg.file_threads;
    uv_async_init(&loop, &gw.notify.async, on_notify);
    if ((rc = gw_listener_start(&gw.notify, cfg.pg_url)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot start the LISTEN thread", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    if (gw_files_init(&gw) < 0 || gw_http_init(&gw) < 0)
        goto out;
    int port = bound_port();
    if (cfg.port_file[0] && (rc = write_port_file(cfg.port_file, port)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot write the port file", SP_KS("path", cfg.port_file),
               SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    uv_timer_init(&loop, &tick_timer);
    uv_timer_init(&loop, &stop_timer);
    uv_timer_start(&tick_timer, on_tick, TICK_MS, TICK_MS);
    uv_signal_init(&loop, &sig_term);
    uv_signal_init(&loop, &sig_int);
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    sp_log(SP_LOG_INFO, "listening", SP_KS("host", cfg.listen_host), SP_KI("port", port),
           SP_KI("pg_pool", cfg.pg_pool), SP_KI("max_body_bytes", cfg.max_body_bytes));

    uv_run(&loop, UV_RUN_DEFAULT);
    if (finished) {
        gw_http_dispose(&gw);
        uv_walk(&loop, close_walked, NULL);
        uv_run(&loop, UV_RUN_DEFAULT);
    }
    uv_loop_close(&loop);
    h2o_config_dispose(&gw.h2o_config);
    loop_ready = false;
    exit_code = finished ? 0 : 1;
out:
    if (loop_ready) {
        /* Startup failed with the loop half set up: the process ends now, so only the thread
         * is stopped; the kernel reclaims the rest. */
        gw_listener_stop(&gw.notify);
    }
    if (cfg.port_file && cfg.port_file[0] && exit_code == 0)
        unlink(cfg.port_file);
    gw_pool_close(&gw.pool);
    sp_bus_free(gw.bus);
    sp_busid_dispose(&busid);
    sp_sign_key_free(own_token_key);
    gw_token_ring_free(gw.token_ring);
    gw_signed_dispose(&gw.signed_urls);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return exit_code;
}
