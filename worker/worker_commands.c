/* Commands: the worker's side of the data plane (proto/dataplane.proto). An ExecRequest on
 * space.io.wkr.<id>.exec (from a gateway, which has already published the CommandRequested
 * intent) is checked, handed to the sandbox's agent, and answered with an ExecReply. What the
 * agent then reports becomes, per command:
 *   live output  -> IoChunk on space.io.cmd.<cmd_id>.out (seq 1, 2, ...), up to LIVE_CAP bytes;
 *   audit        -> CommandOutput events in 16 KiB chunks up to AUDIT_CAP bytes, then a marker;
 *   the end      -> IoExit on space.io.cmd.<cmd_id>.exit and a CommandExited event with the byte
 *                   counts and SHA-256 of everything the command wrote (also beyond the caps).
 * Environment values and stdin exist only in the request and the agent frame: never in an
 * event or a log line.
 *
 * Threads: requests arrive on a cnats thread, agent callbacks on the box's reader thread; a
 * box's command list is guarded by its mutex. Publishing happens outside that mutex. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane.pb-c.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "worker.h"
#include "xmalloc.h"

#define REQUEST_MAX       (2 * 1024 * 1024)
#define STDIN_MAX         (1024 * 1024)
#define DEFAULT_TIMEOUT_S 60
#define LIVE_CAP          ((uint64_t)1 << 30) /* bytes of live output per command */
#define AUDIT_CAP         (1024 * 1024)       /* bytes of output recorded in the log */
#define HELLO_TIMEOUT_MS  10000
#define USER_UID          1000

struct wk_cmd {
    char id[65];
    char intent_id[37];
    char corr[129];
    int64_t t0_ns;
    uint64_t seq;
    uint64_t bytes[3]; /* by stream; [0] unused */
    sp_sha256_ctx_t *sha[3];
    uint64_t audit_bytes;
    bool audit_truncated;
    bool live_truncated;
    wk_cmd_t *next;
};

static bool env_entry_ok(const char *e)
{
    const char *eq = strchr(e, '=');
    if (!eq || eq == e || eq - e > 128 || (e[0] >= '0' && e[0] <= '9'))
        return false;
    for (const char *p = e; p < eq; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
              *p == '_'))
            return false;
    return true;
}

/* Takes cmd out of the box's list (box->mu held); NULL if not there. */
static wk_cmd_t *take_cmd(wk_box_t *b, const char *cmd_id)
{
    for (wk_cmd_t **pp = &b->cmds; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->id, cmd_id) == 0) {
            wk_cmd_t *c = *pp;
            *pp = c->next;
            b->n_cmds--;
            return c;
        }
    }
    return NULL;
}

static wk_cmd_t *find_cmd(wk_box_t *b, const char *cmd_id)
{
    for (wk_cmd_t *c = b->cmds; c; c = c->next)
        if (strcmp(c->id, cmd_id) == 0)
            return c;
    return NULL;
}

/* A command event for box (tenant, aggregate) answering the command's intent. */
static int publish_command_event(wk_box_t *b, const wk_cmd_t *c, sp_envelope_t *env,
                                 const char *what, uint64_t n)
{
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    char id[37], msg_id[160];
    agg.kind = "sandbox";
    agg.id = b->id;
    env->aggregate = &agg;
    env->tenant = b->tenant;
    env->actor = "svc:worker";
    env->correlation_id = (char *)c->corr;
    env->causation_id = (char *)c->intent_id;
    snprintf(msg_id, sizeof(msg_id), "%s:%s:%llu", what, c->id, (unsigned long long)n);
    int rc = sp_publish_event(b->w->bus, env, id, b->w->cfg->id, msg_id, NULL);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot record command event", SP_KS("type", env->type),
               SP_KS("cmd", c->id), SP_KS("error", sp_strerror(rc)), SP_KS("corr", c->corr));
    return rc;
}

static void publish_io(wk_box_t *b, const char *cmd_id, const char *kind, const ProtobufCMessage *m)
{
    char subject[128];
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    protobuf_c_message_pack(m, buf);
    snprintf(subject, sizeof(subject), "space.io.cmd.%s.%s", cmd_id, kind);
    int rc = sp_bus_publish_core(b->w->bus, subject, buf, len);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "data plane publish failed", SP_KS("cmd", cmd_id),
               SP_KS("error", sp_strerror(rc)));
    free(buf);
}

/* Ends c: IoExit and CommandExited. Frees c. */
static void finish(wk_box_t *b, wk_cmd_t *c, int exit_code, int sig, bool timed_out,
                   const char *error)
{
    uint8_t digest[3][SP_SHA256_LEN];
    for (int s = 1; s <= 2; s++)
        sp_sha256_final(c->sha[s], digest[s]);
    uint32_t ms = (uint32_t)((sp_mono_ns() - c->t0_ns) / 1000000);

    Space__Io__V1__IoExit ex = SPACE__IO__V1__IO_EXIT__INIT;
    ex.cmd_id = c->id;
    ex.exit_code = exit_code;
    ex.signal = (uint32_t)sig;
    ex.timed_out = timed_out;
    ex.error = (char *)(error ? error : "");
    ex.stdout_bytes = c->bytes[1];
    ex.stderr_bytes = c->bytes[2];
    ex.truncated = c->live_truncated;
    ex.last_seq = c->seq;
    ex.duration_ms = ms;
    publish_io(b, c->id, "exit", &ex.base);

    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__CommandExited done = SPACE__V1__COMMAND_EXITED__INIT;
    done.cmd_id = c->id;
    done.exit_code = exit_code;
    done.signal = (uint32_t)sig;
    done.timed_out = timed_out;
    done.error = ex.error;
    done.stdout_bytes = c->bytes[1];
    done.stderr_bytes = c->bytes[2];
    done.stdout_sha256 = (ProtobufCBinaryData){SP_SHA256_LEN, digest[1]};
    done.stderr_sha256 = (ProtobufCBinaryData){SP_SHA256_LEN, digest[2]};
    done.duration_ms = ms;
    done.output_truncated = c->live_truncated;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED;
    env.command_exited = &done;
    publish_command_event(b, c, &env, "exited", 0);
    sp_log(SP_LOG_INFO, "command done", SP_KS("sandbox", b->id), SP_KS("cmd", c->id),
           SP_KI("exit_code", exit_code), SP_KI("signal", sig), SP_KU("ms", ms),
           SP_KS("error", error ? error : ""), SP_KS("corr", c->corr));
    free(c);
}

void wk_box_fail_commands(wk_box_t *b, const char *error)
{
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *list = b->cmds;
    b->cmds = NULL;
    b->n_cmds = 0;
    pthread_mutex_unlock(&b->mu);
    while (list) {
        wk_cmd_t *next = list->next;
        finish(b, list, -1, 0, false, error);
        list = next;
    }
}

/* ---- agent callbacks (the box's reader thread) ---- */

static void on_started(void *arg, const char *cmd_id, uint32_t pid)
{
    wk_box_t *b = arg;
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = find_cmd(b, cmd_id);
    wk_cmd_t copy;
    if (c)
        copy = *c;
    pthread_mutex_unlock(&b->mu);
    if (!c)
        return;
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__CommandStarted st = SPACE__V1__COMMAND_STARTED__INIT;
    st.cmd_id = copy.id;
    st.pid = pid;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED;
    env.command_started = &st;
    publish_command_event(b, &copy, &env, "started", 0);
}

static void on_output(void *arg, const char *cmd_id, int stream, const uint8_t *data, size_t len)
{
    wk_box_t *b = arg;
    uint64_t seq = 0, audit_from = 0;
    size_t audit_len = 0;
    bool live = false, mark_truncated = false;
    wk_cmd_t copy;

    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = find_cmd(b, cmd_id);
    if (!c) {
        pthread_mutex_unlock(&b->mu);
        return;
    }
    uint64_t offset = c->bytes[stream];
    c->bytes[stream] += len;
    sp_sha256_update(c->sha[stream], data, len);
    if (!c->live_truncated && c->bytes[1] + c->bytes[2] <= LIVE_CAP) {
        seq = ++c->seq;
        live = true;
    } else {
        c->live_truncated = true;
    }
    if (!c->audit_truncated) {
        size_t room = AUDIT_CAP - (size_t)c->audit_bytes;
        audit_len = len < room ? len : room;
        audit_from = offset;
        c->audit_bytes += audit_len;
        if (audit_len < len) {
            c->audit_truncated = true;
            mark_truncated = true;
        }
    }
    copy = *c;
    pthread_mutex_unlock(&b->mu);

    if (live) {
        Space__Io__V1__IoChunk ch = SPACE__IO__V1__IO_CHUNK__INIT;
        ch.cmd_id = (char *)cmd_id;
        ch.seq = seq;
        ch.stream = (uint32_t)stream;
        ch.data = (ProtobufCBinaryData){len, (uint8_t *)data};
        publish_io(b, cmd_id, "out", &ch.base);
    }
    /* Audit chunks: the reader thread is this command's only writer of events, so their
     * order in the log is the output's order. */
    for (size_t at = 0; at < audit_len; at += SP_COMMAND_OUTPUT_CHUNK_MAX) {
        size_t n = audit_len - at < SP_COMMAND_OUTPUT_CHUNK_MAX ? audit_len - at
                                                                : SP_COMMAND_OUTPUT_CHUNK_MAX;
        sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
        Space__V1__CommandOutput out = SPACE__V1__COMMAND_OUTPUT__INIT;
        out.cmd_id = copy.id;
        out.stream = (uint32_t)stream;
        out.offset = audit_from + at;
        out.data = (ProtobufCBinaryData){n, (uint8_t *)data + at};
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT;
        env.command_output = &out;
        publish_command_event(b, &copy, &env, stream == 1 ? "out" : "err", out.offset);
    }
    if (mark_truncated) {
        sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
        Space__V1__CommandOutput out = SPACE__V1__COMMAND_OUTPUT__INIT;
        out.cmd_id = copy.id;
        out.stream = (uint32_t)stream;
        out.offset = audit_from + audit_len;
        out.truncated = true;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT;
        env.command_output = &out;
        publish_command_event(b, &copy, &env, "truncated", 0);
    }
}

static void on_exited(void *arg, const char *cmd_id, int exit_code, int sig, bool timed_out)
{
    wk_box_t *b = arg;
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = take_cmd(b, cmd_id);
    pthread_mutex_unlock(&b->mu);
    if (c)
        finish(b, c, exit_code, sig, timed_out, NULL);
}

static void on_error(void *arg, const char *cmd_id, const char *message)
{
    wk_box_t *b = arg;
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = take_cmd(b, cmd_id);
    pthread_mutex_unlock(&b->mu);
    if (c)
        finish(b, c, -1, 0, false, message);
}

static void on_lost(void *arg, const char *why)
{
    wk_box_t *b = arg;
    char error[WK_ERR_MAX];
    snprintf(error, sizeof(error), "agent channel lost: %s", why);
    sp_log(SP_LOG_WARN, "agent channel lost", SP_KS("sandbox", b->id), SP_KS("why", why));
    pthread_mutex_lock(&b->mu);
    b->agent_lost = true;
    pthread_mutex_unlock(&b->mu);
    wk_box_fail_commands(b, error);
    wk_box_fail_files(b, error);
}

int wk_box_attach_agent(wk_box_t *b, int to_fd, int from_fd)
{
    static const wk_agent_callbacks_t cb_template = {
        .on_started = on_started,
        .on_output = on_output,
        .on_exited = on_exited,
        .on_error = on_error,
        .on_lost = on_lost,
    };
    if (to_fd < 0 || from_fd < 0)
        return -EINVAL;
    wk_agent_callbacks_t cb = cb_template;
    wk_files_callbacks(&cb);
    cb.arg = b;
    wk_agent_t *a = NULL;
    int rc = wk_agent_open(to_fd, from_fd, b->id, &cb, HELLO_TIMEOUT_MS, &a);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&b->mu);
    b->agent = a;
    pthread_mutex_unlock(&b->mu);
    return 0;
}

/* ---- requests (a cnats thread) ---- */

static void reply(wk_t *w, const char *to, bool accepted, const char *error, const char *detail)
{
    Space__Io__V1__ExecReply r = SPACE__IO__V1__EXEC_REPLY__INIT;
    r.accepted = accepted;
    r.error = (char *)(error ? error : "");
    r.detail = (char *)(detail ? detail : "");
    uint8_t buf[1024];
    size_t len = space__io__v1__exec_reply__get_packed_size(&r);
    if (len > sizeof(buf) || !to)
        return;
    space__io__v1__exec_reply__pack(&r, buf);
    sp_bus_publish_core(w->bus, to, buf, len);
}

/* Checks a request; returns NULL or the machine-readable refusal, with detail. */
static const char *check(const Space__Io__V1__ExecRequest *q, char *detail, size_t dlen)
{
    if (!sp_id_valid(q->sandbox) || !sp_id_valid(q->cmd_id) || !sp_id_valid(q->tenant)) {
        snprintf(detail, dlen, "sandbox, tenant and cmd_id must be ids");
        return "bad_request";
    }
    if ((q->n_argv == 0) == (q->cmd[0] == '\0')) {
        snprintf(detail, dlen, "exactly one of argv and cmd");
        return "bad_request";
    }
    if (q->n_argv > 256 || strlen(q->cmd) > 16384 || q->n_env > 256 || strlen(q->cwd) > 1024 ||
        q->stdin.len > STDIN_MAX || q->timeout_s > 24 * 3600) {
        snprintf(detail, dlen, "a field is over its limit");
        return "bad_request";
    }
    for (size_t i = 0; i < q->n_env; i++) {
        if (!env_entry_ok(q->env[i])) {
            snprintf(detail, dlen, "env[%zu] is not NAME=value", i);
            return "bad_request";
        }
    }
    if (q->user[0] && strcmp(q->user, "root") != 0 && strcmp(q->user, "user") != 0) {
        snprintf(detail, dlen, "user must be root or user");
        return "bad_request";
    }
    return NULL;
}

static void on_exec_request(void *arg, const char *subject, const char *reply_to,
                            const uint8_t *data, size_t len)
{
    wk_t *w = arg;
    char detail[256] = "";
    (void)subject;

    if (len > REQUEST_MAX) {
        reply(w, reply_to, false, "bad_request", "request too large");
        return;
    }
    Space__Io__V1__ExecRequest *q = space__io__v1__exec_request__unpack(NULL, len, data);
    if (!q) {
        reply(w, reply_to, false, "bad_request", "not an ExecRequest");
        return;
    }
    const char *refusal = check(q, detail, sizeof(detail));
    wk_box_t *b = refusal ? NULL : wk_owned_get(w, q->sandbox);
    if (!refusal && (!b || strcmp(b->tenant, q->tenant) != 0)) {
        refusal = "sandbox_not_running";
        snprintf(detail, sizeof(detail), "no running sandbox %s on worker %s", q->sandbox,
                 w->cfg->id);
    }
    wk_cmd_t *c = NULL;
    if (!refusal) {
        pthread_mutex_lock(&b->mu);
        if (!b->agent || b->agent_lost) {
            refusal = "agent_unavailable";
            snprintf(detail, sizeof(detail), "%s",
                     b->agent_lost ? "the agent channel was lost"
                                   : "no agent channel (the "
                                     "sandbox predates this worker "
                                     "process)");
        } else if (b->n_cmds >= WK_AGENT_MAX_COMMANDS) {
            refusal = "too_many_commands";
            snprintf(detail, sizeof(detail), "%d commands already run", WK_AGENT_MAX_COMMANDS);
        } else if (find_cmd(b, q->cmd_id)) {
            refusal = "bad_request";
            snprintf(detail, sizeof(detail), "cmd_id %s is running", q->cmd_id);
        } else {
            c = sp_xcalloc(1, sizeof(*c));
            snprintf(c->id, sizeof(c->id), "%s", q->cmd_id);
            snprintf(c->intent_id, sizeof(c->intent_id), "%s", q->intent_event_id);
            snprintf(c->corr, sizeof(c->corr), "%s", q->correlation_id);
            c->t0_ns = sp_mono_ns();
            c->sha[1] = sp_sha256_new();
            c->sha[2] = sp_sha256_new();
            c->next = b->cmds;
            b->cmds = c;
            b->n_cmds++;
        }
        pthread_mutex_unlock(&b->mu);
    }
    if (refusal) {
        reply(w, reply_to, false, refusal, detail);
        wk_box_put(b);
        space__io__v1__exec_request__free_unpacked(q, NULL);
        return;
    }

    Space__Agent__V1__Exec ex = SPACE__AGENT__V1__EXEC__INIT;
    char *shell[] = {"/bin/sh", "-c", q->cmd, NULL};
    ex.cmd_id = q->cmd_id;
    if (q->n_argv) {
        ex.argv = q->argv;
        ex.n_argv = q->n_argv;
    } else {
        ex.argv = shell;
        ex.n_argv = 3;
    }
    ex.env = q->env;
    ex.n_env = q->n_env;
    ex.cwd = q->cwd;
    if (strcmp(q->user, "user") == 0)
        ex.uid = ex.gid = USER_UID;
    ex.timeout_ms = (q->timeout_s ? q->timeout_s : DEFAULT_TIMEOUT_S) * 1000;
    ex.stdin_data = q->stdin;
    pthread_mutex_lock(&b->mu);
    wk_agent_t *agent = b->agent;
    pthread_mutex_unlock(&b->mu);
    int rc = wk_agent_exec(agent, &ex);
    if (rc < 0) {
        pthread_mutex_lock(&b->mu);
        c = take_cmd(b, q->cmd_id);
        pthread_mutex_unlock(&b->mu);
        if (c) {
            sp_sha256_final(c->sha[1], (uint8_t[SP_SHA256_LEN]){0});
            sp_sha256_final(c->sha[2], (uint8_t[SP_SHA256_LEN]){0});
            free(c);
        }
        reply(w, reply_to, false, rc == -EBUSY ? "too_many_commands" : "agent_unavailable",
              sp_strerror(rc));
    } else {
        reply(w, reply_to, true, NULL, NULL);
        sp_log(SP_LOG_INFO, "command accepted", SP_KS("sandbox", q->sandbox),
               SP_KS("cmd", q->cmd_id), SP_KS("corr", q->correlation_id));
    }
    wk_box_put(b);
    /* The request held the environment values and stdin. */
    for (size_t i = 0; i < q->n_env; i++)
        explicit_bzero(q->env[i], strlen(q->env[i]));
    if (q->stdin.data)
        explicit_bzero(q->stdin.data, q->stdin.len);
    space__io__v1__exec_request__free_unpacked(q, NULL);
}

int wk_commands_start(wk_t *w)
{
    char subject[128];
    snprintf(subject, sizeof(subject), "space.io.wkr.%s.exec", w->cfg->id);
    int rc = sp_bus_subscribe(w->bus, subject, NULL, on_exec_request, w, &w->exec_sub);
    if (rc < 0)
        sp_log(SP_LOG_ERROR, "cannot subscribe to exec requests", SP_KS("error", sp_strerror(rc)));
    return rc;
}

void wk_commands_stop(wk_t *w)
{
    sp_bus_unsubscribe(w->exec_sub);
    w->exec_sub = NULL;
}
