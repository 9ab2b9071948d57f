/* Commands: the worker's side of the data plane (proto/dataplane.proto). An ExecRequest on
 * space.io.wkr.<id>.exec (from a gateway, which has already published the CommandRequested
 * intent) is checked, handed to the sandbox's agent, and answered with an ExecReply. What the
 * agent then reports becomes, per command:
 *   live output  -> IoChunk on space.io.cmd.<cmd_id>.out (seq 1, 2, ...), up to LIVE_CAP bytes;
 *                   the newest KEEP_CAP bytes of it are also kept, for clients that (re)attach;
 *   audit        -> CommandOutput events in 16 KiB chunks up to --audit-cap bytes (0: none),
 *                   then a marker: the output with the command's environment values replaced
 *                   by [redacted:NAME] (datakey.h), sealed under the sandbox's data key when
 *                   --seal-output is on (docs/audit.md); offsets count the redacted bytes;
 *   the end      -> IoExit on space.io.cmd.<cmd_id>.exit and a CommandExited event with the byte
 *                   counts and SHA-256 of everything the command wrote (also beyond the caps).
 * Environment values and stdin exist only in the request and the agent frame: never in an
 * event or a log line.
 *
 * Control (space.io.wkr.<id>.ctl, CtlRequest): list the sandbox's commands, attach to one
 * (the kept chunks after a seq, and its exit when it has ended), write its stdin, signal its
 * process group, resize its pty. An ended command stays listed and attachable for DONE_TTL_S,
 * at most DONE_KEEP per sandbox, while its sandbox lives on this worker (not across a worker
 * restart).
 *
 * Threads: requests arrive on a cnats thread, agent callbacks on the box's reader thread; a
 * box's command list is guarded by its mutex. Publishing happens outside that mutex. Command
 * facts go through the worker's queue (worker_factq.c): the reader thread never waits for the
 * stream, and a short command's facts are recorded together after its IoExit. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "contract.h"
#include "credstore.pb-c.h"
#include "dataplane.pb-c.h"
#include "datakey.h"
#include "db.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "reduce.h"
#include "worker.h"
#include "xmalloc.h"

#define REQUEST_MAX       (2 * 1024 * 1024)
#define STDIN_MAX         (1024 * 1024)
#define DEFAULT_TIMEOUT_S 60
#define LIVE_CAP          ((uint64_t)1 << 30) /* bytes of live output per command */
#define HELLO_TIMEOUT_MS  10000
#define USER_UID          1000
#define KEEP_CAP          (512 * 1024) /* bytes of output kept per command for attaching */
#define DONE_KEEP         32           /* ended commands kept per sandbox */
#define DONE_TTL_S        600
#define CMDLINE_MAX       512
/* CommandInfo.argv: what a list shows of a command's argv (E2B's Process.List answers the
 * program and its arguments); the same bounds as what the agent reports after a reconnection. */
#define ARGV_KEPT_N     WK_AGENT_ARGV_KEPT_N
#define ARGV_KEPT_BYTES WK_AGENT_ARGV_KEPT_BYTES
#define CWD_KEPT_MAX    4096
#define CTL_MAX         (1024 * 1024)
#define CTL_STDIN_MAX   (512 * 1024)
/* ExecRequest.reply_wait_ms: the longest wait honoured, and the output a waiting command may
 * write before it is answered as running (the answer carries it all; KEEP_CAP keeps more). */
#define REPLY_WAIT_MAX_MS 1000
#define QUIET_CAP         (256 * 1024)
/* A requester answered as running attaches for the output after its answer: until it has (at
 * most PIN_WAIT_MS), that output stays kept whatever KEEP_CAP says, up to PIN_CAP bytes (an
 * attach's answer stays within SP_BUS_MAX_MSG); beyond, the box's reader waits for it, which
 * back-pressures the command through the agent's pipe. */
#define PIN_CAP     (768 * 1024)
#define PIN_WAIT_MS 5000

/* Output of a command whose start is not recorded yet (box->mu): redacted bytes of stream at
 * offset, or the audit cap's marker. */
typedef struct deferred deferred_t;
struct deferred {
    deferred_t *next;
    uint32_t stream;
    uint64_t offset;
    bool truncated;
    size_t len;
    uint8_t data[];
};

typedef struct kept kept_t;
struct kept {
    kept_t *next;
    uint64_t seq;
    uint32_t stream;
    size_t len;
    uint8_t data[];
};

struct wk_cmd {
    char id[65];
    char intent_id[37];
    char corr[129];
    char cmdline[CMDLINE_MAX + 1];
    char argv[ARGV_KEPT_BYTES]; /* the argv kept for lists: n_argv strings, NUL-terminated */
    size_t n_argv;
    char cwd[CWD_KEPT_MAX + 1];
    int64_t t0_ns, started_at_us, ended_ns;
    uint32_t pid;
    bool background, pty, stdin_open;
    bool outage;     /* the agent channel was down while it ran: output of that time is lost */
    bool publishing; /* ended, on the done list, its end not published yet: not pruned */
    bool quiet;      /* see waiter */
    bool deferring;  /* see def_head */
    uint64_t seq;
    uint64_t bytes[3]; /* by stream; [0] unused */
    sp_sha256_ctx_t *sha[3];
    uint64_t audit_bytes;
    bool audit_truncated;
    sp_redactor_t *red[3]; /* by stream: the command's environment values */
    uint64_t audit_off[3]; /* by stream: redacted bytes recorded so far */
    int seal;              /* 0 plaintext (--seal-output off), 1 sealed under dk, -1 no key */
    sp_cred_key_t dk;
    /* The command line sealed under dk (seal 1), for its CommandStarted; taken (NULL) when
     * that is published. */
    uint8_t *line_ct;
    size_t line_ct_len;
    uint8_t line_nonce[SP_CRED_NONCE_LEN];
    bool live_truncated;
    kept_t *kept_head, *kept_tail; /* the newest live chunks, KEEP_CAP bytes at most */
    size_t kept_bytes;
    /* ExecRequest.reply_wait_ms: the requester's reply subject until it is answered (NULL
     * after); quiet: its output stays off space.io.cmd (until it is answered as running, or
     * someone attaches). */
    char *waiter;
    /* Answered as running with its output up to pin_seq: what came after stays kept until the
     * requester attaches for it or pin_until_ns (0: not pinned); pin_bytes of it so far. */
    uint64_t pin_seq;
    int64_t pin_until_ns;
    size_t pin_bytes;
    /* A short command in one fact (docs/architecture.md): while deferring, its CommandStarted
     * (pid, line_ct) and CommandOutput wait here to go out inside its CommandExited, until it
     * has run WK_FACT_HOLD_MS or its output is more than that fact carries; then they are
     * recorded as their own facts (record_deferred). */
    deferred_t *def_head, *def_tail;
    size_t n_def, def_bytes; /* def_bytes: as carried (sealed: with the tags) */
    /* Once ended (on the box's done list). */
    int exit_code;
    uint32_t signal;
    bool timed_out;
    uint32_t duration_ms;
    char error[WK_ERR_MAX];
    wk_cmd_t *next;
    wk_cmd_t *more; /* a list of the caller's, apart from next */
};

static void free_kept(kept_t *k)
{
    while (k) {
        kept_t *n = k->next;
        free(k);
        k = n;
    }
}

static void free_deferred(deferred_t *d)
{
    while (d) {
        deferred_t *n = d->next;
        explicit_bzero(d->data, d->len);
        free(d);
        d = n;
    }
}

static void cmd_free(wk_cmd_t *c)
{
    free_deferred(c->def_head);
    sp_redactor_free(c->red[1]);
    sp_redactor_free(c->red[2]);
    sp_cred_key_wipe(&c->dk);
    free(c->line_ct);
    free(c->waiter);
    free_kept(c->kept_head);
    free(c);
}

/* A copy of the chunks kept after from_seq (box->mu held), and how many. */
static kept_t *copy_kept(const wk_cmd_t *c, uint64_t from_seq, size_t *ret_n)
{
    kept_t *copies = NULL, **tail = &copies;
    size_t n = 0;
    for (const kept_t *k = c->kept_head; k; k = k->next) {
        if (k->seq <= from_seq)
            continue;
        kept_t *d = sp_xmalloc(sizeof(*d) + k->len);
        memcpy(d, k, sizeof(*d) + k->len);
        d->next = NULL;
        *tail = d;
        tail = &d->next;
        n++;
    }
    *ret_n = n;
    return copies;
}

/* The requester attached, or PIN_WAIT_MS passed (box->mu held): KEEP_CAP applies again. */
static void unpin(wk_box_t *b, wk_cmd_t *c)
{
    c->pin_until_ns = 0;
    c->pin_bytes = 0;
    pthread_cond_broadcast(&b->pin_cv);
}

/* Keeps a live chunk (box->mu held), dropping the oldest beyond KEEP_CAP (but none a requester
 * is about to attach for). */
static void keep_chunk(wk_cmd_t *c, uint64_t seq, int stream, const uint8_t *data, size_t len)
{
    kept_t *k = sp_xmalloc(sizeof(*k) + len);
    k->next = NULL;
    k->seq = seq;
    k->stream = (uint32_t)stream;
    k->len = len;
    memcpy(k->data, data, len);
    if (c->kept_tail)
        c->kept_tail->next = k;
    else
        c->kept_head = k;
    c->kept_tail = k;
    c->kept_bytes += len;
    if (c->pin_until_ns)
        c->pin_bytes += len;
    while (c->kept_bytes > KEEP_CAP && c->kept_head != c->kept_tail) {
        if (c->pin_until_ns && c->kept_head->seq > c->pin_seq)
            break;
        kept_t *old = c->kept_head;
        c->kept_head = old->next;
        c->kept_bytes -= old->len;
        free(old);
    }
}

/* Takes c's waiting requester to answer it as running (box->mu held), with a copy of the output
 * so far (*ret_kept, to free); what comes after stays kept until it attaches for it. */
static char *hand_off(wk_cmd_t *c, kept_t **ret_kept)
{
    char *waiter = c->waiter;
    size_t n;
    c->waiter = NULL;
    c->quiet = false;
    *ret_kept = copy_kept(c, 0, &n);
    c->pin_seq = c->seq;
    c->pin_until_ns = sp_mono_ns() + (int64_t)PIN_WAIT_MS * 1000000;
    c->pin_bytes = 0;
    return waiter;
}

/* Drops ended commands beyond DONE_KEEP or older than DONE_TTL_S (box->mu held). */
static void prune_done(wk_box_t *b)
{
    int64_t now = sp_mono_ns();
    size_t n = 0;
    for (wk_cmd_t **pp = &b->done; *pp;) {
        wk_cmd_t *c = *pp;
        if (!c->publishing &&
            (++n > DONE_KEEP || now - c->ended_ns > (int64_t)DONE_TTL_S * 1000000000)) {
            *pp = c->next;
            cmd_free(c);
            continue;
        }
        pp = &c->next;
    }
}

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
            pthread_cond_broadcast(&b->pin_cv); /* a reader waiting for it finds it gone */
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

static wk_cmd_t *find_done(wk_box_t *b, const char *cmd_id)
{
    for (wk_cmd_t *c = b->done; c; c = c->next)
        if (strcmp(c->id, cmd_id) == 0)
            return c;
    return NULL;
}

int wk_datakey_cached(wk_box_t *b, sp_cred_key_t *ret)
{
    pthread_mutex_lock(&b->mu);
    int state = b->dk_state;
    if (state == 1)
        *ret = b->dk;
    pthread_mutex_unlock(&b->mu);
    return state == 1 ? 0 : state == 2 ? -ENOKEY : -EAGAIN;
}

int wk_datakey_get(wk_box_t *b, sp_cred_key_t *ret)
{
    int held = wk_datakey_cached(b, ret);
    if (held != -EAGAIN)
        return held;
    Space__Cred__V1__DataKeyRequest q = SPACE__CRED__V1__DATA_KEY_REQUEST__INIT;
    q.tenant = b->tenant;
    q.sandbox = b->id;
    q.worker = (char *)b->w->cfg->id;
    uint8_t buf[256];
    size_t len = space__cred__v1__data_key_request__get_packed_size(&q);
    if (len > sizeof(buf))
        return -EINVAL;
    space__cred__v1__data_key_request__pack(&q, buf);
    uint8_t *data = NULL;
    size_t dlen = 0;
    int rc = sp_request_send(b->w->bus, SP_CRED_SUBJECT_DATAKEY, buf, len,
                             (int)b->w->cfg->datakey_timeout_ms, &data, &dlen);
    Space__Cred__V1__DataKeyReply *r = NULL;
    if (rc == 0 && dlen <= 1024)
        r = space__cred__v1__data_key_reply__unpack(NULL, dlen, data);
    if (data) {
        explicit_bzero(data, dlen);
        free(data);
    }
    rc = -EIO;
    if (r && r->ok && r->key.len == SP_CRED_KEY_LEN && strlen(r->key_id) == SP_CRED_KEY_ID_LEN) {
        memcpy(ret->k, r->key.data, SP_CRED_KEY_LEN);
        memcpy(ret->id, r->key_id, SP_CRED_KEY_ID_LEN + 1);
        rc = 0;
    } else if (r && strcmp(r->error, "forgotten") == 0) {
        rc = -ENOKEY;
    }
    sp_log(rc == 0 ? SP_LOG_DEBUG : SP_LOG_WARN,
           rc == 0      ? "data key held"
           : rc == -EIO ? "no data key from space-credstore: output not recorded"
                        : "sandbox forgotten: output not recorded",
           SP_KS("sandbox", b->id), SP_KS("error", r ? r->error : "no answer"));
    if (r) {
        if (r->key.data)
            explicit_bzero(r->key.data, r->key.len);
        space__cred__v1__data_key_reply__free_unpacked(r, NULL);
    }
    if (rc == 0 || rc == -ENOKEY) {
        pthread_mutex_lock(&b->mu);
        b->dk_state = rc == 0 ? 1 : 2;
        if (rc == 0)
            b->dk = *ret;
        pthread_mutex_unlock(&b->mu);
    }
    return rc;
}

/* A command event for box (tenant, aggregate) answering the command's intent, queued for the
 * stream (worker_factq.c) to go out within hold_ms. */
static int publish_command_event(wk_box_t *b, const wk_cmd_t *c, sp_envelope_t *env,
                                 const char *what, uint64_t n, int hold_ms)
{
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    char msg_id[WK_FACT_MSG_ID_MAX];
    agg.kind = "sandbox";
    agg.id = b->id;
    env->aggregate = &agg;
    env->tenant = b->tenant;
    env->actor = "svc:worker";
    env->correlation_id = (char *)c->corr;
    env->causation_id = (char *)c->intent_id;
    snprintf(msg_id, sizeof(msg_id), "%s:%s:%llu", what, c->id, (unsigned long long)n);
    int rc = wk_factq_push(b->w->facts, env, msg_id, hold_ms);
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
    int rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_CMD, cmd_id, kind, NULL);
    if (rc >= 0)
        rc = sp_bus_publish_core(b->w->bus, subject, buf, len);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "data plane publish failed", SP_KS("cmd", cmd_id),
               SP_KS("error", sp_strerror(rc)));
    free(buf);
}

/* c, just taken off the running list (box->mu held), ends: its exit is recorded and it goes to
 * the done list in the same step, so a client attaching meanwhile finds it running or ended,
 * never missing. finish() then publishes the end. */
static void retire_locked(wk_box_t *b, wk_cmd_t *c, int exit_code, int sig, bool timed_out,
                          const char *error)
{
    if (!error && c->outage)
        error = "output was lost while the agent channel was down";
    c->exit_code = exit_code;
    c->signal = (uint32_t)sig;
    c->timed_out = timed_out;
    c->duration_ms = (uint32_t)((sp_mono_ns() - c->t0_ns) / 1000000);
    c->stdin_open = false;
    snprintf(c->error, sizeof(c->error), "%.*s", (int)sizeof(c->error) - 1, error ? error : "");
    c->ended_ns = sp_mono_ns();
    c->publishing = true;
    c->next = b->done;
    b->done = c;
}

/* Publishes the end of a retired command: CommandExited is queued first (journaled: a worker
 * killed right after still records it at its next start, worker_factq.c), then the waiting
 * requester's answer and/or IoExit, which the gateway answers from, so no answer lacks its fact;
 * the fact's short hold takes the command's held facts with it and lets IoExit leave first. */
static void audit_flush(wk_box_t *b, wk_cmd_t *c, int stream);

/* Answers a waiting requester (ExecRequest.reply_wait_ms) with kept, the command's output so
 * far (all of it: the answer comes before QUIET_CAP), and ex, its end (NULL: it runs on). */
static void reply_output(wk_t *w, const char *to, const char *cmd_id, const kept_t *kept,
                         const Space__Io__V1__IoExit *ex, uint32_t pid)
{
    Space__Io__V1__ExecReply r = SPACE__IO__V1__EXEC_REPLY__INIT;
    size_t n = 0;
    for (const kept_t *k = kept; k; k = k->next)
        n++;
    Space__Io__V1__IoChunk *chunks = sp_xcalloc(n ? n : 1, sizeof(*chunks));
    Space__Io__V1__IoChunk **ptrs = sp_xcalloc(n ? n : 1, sizeof(Space__Io__V1__IoChunk *));
    size_t i = 0;
    for (const kept_t *k = kept; k; k = k->next, i++) {
        space__io__v1__io_chunk__init(&chunks[i]);
        chunks[i].cmd_id = (char *)cmd_id;
        chunks[i].seq = k->seq;
        chunks[i].stream = k->stream;
        chunks[i].data = (ProtobufCBinaryData){k->len, (uint8_t *)k->data};
        ptrs[i] = &chunks[i];
    }
    r.accepted = true;
    r.error = r.detail = "";
    r.exit = (Space__Io__V1__IoExit *)ex;
    r.replay = ptrs;
    r.n_replay = n;
    r.pid = pid;
    size_t len = space__io__v1__exec_reply__get_packed_size(&r);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    space__io__v1__exec_reply__pack(&r, buf);
    int rc = sp_bus_publish_core(w->bus, to, buf, len);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot answer a command's requester", SP_KS("cmd", cmd_id),
               SP_KS("error", sp_strerror(rc)));
    free(buf);
    free(chunks);
    free(ptrs);
}

/* A short command's start and output inside its CommandExited (merge_deferred). */
typedef struct {
    Space__V1__CommandStarted st;
    Space__V1__CommandOutput out[SP_COMMAND_EXITED_OUTPUT_MAX];
    Space__V1__CommandOutput *ptrs[SP_COMMAND_EXITED_OUTPUT_MAX];
    uint8_t nonce[SP_COMMAND_EXITED_OUTPUT_MAX][SP_CRED_NONCE_LEN];
    uint8_t *ct[SP_COMMAND_EXITED_OUTPUT_MAX];
    uint8_t *line_ct;
    deferred_t *defs;
} merged_t;
static void merge_deferred(wk_box_t *b, wk_cmd_t *c, Space__V1__CommandExited *done, merged_t *m);
static void merged_dispose(merged_t *m);
static void record_deferred(wk_box_t *b, wk_cmd_t *c, int hold_ms);

static void finish(wk_box_t *b, wk_cmd_t *c)
{
    for (int s = 1; s <= 2; s++)
        audit_flush(b, c, s);
    uint8_t digest[3][SP_SHA256_LEN];
    for (int s = 1; s <= 2; s++)
        sp_sha256_final(c->sha[s], digest[s]);
    c->sha[1] = c->sha[2] = NULL;

    Space__Io__V1__IoExit ex = SPACE__IO__V1__IO_EXIT__INIT;
    ex.cmd_id = c->id;
    ex.exit_code = c->exit_code;
    ex.signal = c->signal;
    ex.timed_out = c->timed_out;
    ex.error = c->error;
    ex.stdout_bytes = c->bytes[1];
    ex.stderr_bytes = c->bytes[2];
    ex.truncated = c->live_truncated;
    ex.last_seq = c->seq;
    ex.duration_ms = c->duration_ms;
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__CommandExited done = SPACE__V1__COMMAND_EXITED__INIT;
    done.cmd_id = c->id;
    done.exit_code = c->exit_code;
    done.signal = c->signal;
    done.timed_out = c->timed_out;
    done.error = c->error;
    done.stdout_bytes = c->bytes[1];
    done.stderr_bytes = c->bytes[2];
    done.stdout_sha256 = (ProtobufCBinaryData){SP_SHA256_LEN, digest[1]};
    done.stderr_sha256 = (ProtobufCBinaryData){SP_SHA256_LEN, digest[2]};
    done.duration_ms = c->duration_ms;
    done.output_truncated = c->live_truncated;
    merged_t merged;
    merge_deferred(b, c, &done, &merged);
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED;
    env.command_exited = &done;
    publish_command_event(b, c, &env, "exited", 0, WK_FACT_END_MS);
    merged_dispose(&merged);
    pthread_mutex_lock(&b->mu);
    char *waiter = c->waiter;
    c->waiter = NULL;
    bool quiet = c->quiet;
    uint32_t pid = c->pid;
    pthread_mutex_unlock(&b->mu);
    /* c is retired and being published: its kept chunks no longer change. */
    if (waiter)
        reply_output(b->w, waiter, c->id, c->kept_head, &ex, pid);
    if (!quiet)
        publish_io(b, c->id, "exit", &ex.base);
    free(waiter);
    sp_log(SP_LOG_INFO, "command done", SP_KS("sandbox", b->id), SP_KS("cmd", c->id),
           SP_KI("exit_code", c->exit_code), SP_KU("signal", c->signal),
           SP_KU("ms", c->duration_ms), SP_KU("us", (uint64_t)(c->ended_ns - c->t0_ns) / 1000),
           SP_KS("error", c->error), SP_KS("corr", c->corr));

    pthread_mutex_lock(&b->mu);
    c->publishing = false;
    prune_done(b);
    pthread_mutex_unlock(&b->mu);
}

/* Takes cmd_id off the running list and ends it: 1 when it was running. */
static int end_cmd(wk_box_t *b, const char *cmd_id, int exit_code, int sig, bool timed_out,
                   const char *error)
{
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = take_cmd(b, cmd_id);
    if (c)
        retire_locked(b, c, exit_code, sig, timed_out, error);
    pthread_mutex_unlock(&b->mu);
    if (c)
        finish(b, c);
    return c != NULL;
}

void wk_box_free_commands(wk_box_t *b)
{
    wk_box_fail_commands(b, "sandbox released");
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *list = b->done;
    b->done = NULL;
    pthread_mutex_unlock(&b->mu);
    while (list) {
        wk_cmd_t *next = list->next;
        cmd_free(list);
        list = next;
    }
}

void wk_box_forget_commands(wk_box_t *b)
{
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *list = b->cmds;
    b->cmds = NULL;
    b->n_cmds = 0;
    pthread_cond_broadcast(&b->pin_cv); /* a reader waiting for one finds it gone */
    pthread_mutex_unlock(&b->mu);
    while (list) {
        wk_cmd_t *next = list->next;
        /* It runs on, followed again after the resume: its start is recorded now. */
        pthread_mutex_lock(&b->mu);
        record_deferred(b, list, 0);
        pthread_mutex_unlock(&b->mu);
        for (int s = 1; s <= 2; s++)
            sp_sha256_final(list->sha[s], (uint8_t[SP_SHA256_LEN]){0});
        /* A waiting requester hears "running" with what it wrote so far, as when its wait is
         * over; its attach then finds no command here, and it follows what comes live. */
        if (list->waiter)
            reply_output(b->w, list->waiter, list->id, list->kept_head, NULL, 0);
        cmd_free(list);
        list = next;
    }
}

void wk_box_fail_commands(wk_box_t *b, const char *error)
{
    for (;;) {
        char id[sizeof(((wk_cmd_t *)0)->id)];
        pthread_mutex_lock(&b->mu);
        bool any = b->cmds != NULL;
        if (any)
            snprintf(id, sizeof(id), "%s", b->cmds->id);
        pthread_mutex_unlock(&b->mu);
        if (!any || !end_cmd(b, id, -1, 0, false, error))
            return;
    }
}

/* ---- agent callbacks (the box's reader thread) ---- */

/* What a timer of the waits' thread is for: a waiting requester's answer, or a command's start
 * that waited for its end (record_deferred). */
enum { WAIT_REPLY, WAIT_FACTS };
/* false once the waits' thread has stopped (the worker stops). */
static bool waits_add(wk_waits_t *ws, const char *sandbox, const char *cmd_id, uint32_t wait_ms,
                      int kind);

/* Fills st, c's CommandStarted, with its sealed command line line_ct when there is one. */
static void started_fill(const wk_cmd_t *c, uint8_t *line_ct, const char *line_key_id,
                         Space__V1__CommandStarted *st)
{
    space__v1__command_started__init(st);
    st->cmd_id = (char *)c->id;
    st->pid = c->pid;
    /* The sealed command line (docs/audit.md): the gateway's intent does not carry it. */
    if (line_ct) {
        st->cmdline_ciphertext = (ProtobufCBinaryData){c->line_ct_len, line_ct};
        st->cmdline_nonce = (ProtobufCBinaryData){SP_CRED_NONCE_LEN, (uint8_t *)c->line_nonce};
        st->cmdline_key_id = (char *)line_key_id;
    }
}

/* Fills out, a CommandOutput of c: n redacted bytes of stream at offset, or the audit cap's
 * marker; sealed into ct (n plus the tag) and nonce when c seals. -1 when sealing failed
 * (logged: the chunk is not recorded). */
static int output_fill(const wk_box_t *b, const wk_cmd_t *c, uint32_t stream, uint64_t offset,
                       const uint8_t *data, size_t n, bool truncated, uint8_t *ct,
                       uint8_t nonce[SP_CRED_NONCE_LEN], Space__V1__CommandOutput *out)
{
    space__v1__command_output__init(out);
    out->cmd_id = (char *)c->id;
    out->stream = stream;
    out->offset = offset;
    out->truncated = truncated;
    if (truncated)
        return 0;
    if (c->seal > 0) {
        if (sp_output_seal(&c->dk, b->id, c->id, stream, offset, data, n, nonce, ct) < 0) {
            sp_log(SP_LOG_ERROR, "cannot seal output: not recorded", SP_KS("cmd", c->id));
            return -1;
        }
        out->ciphertext = (ProtobufCBinaryData){n + SP_CRED_TAG_LEN, ct};
        out->nonce = (ProtobufCBinaryData){SP_CRED_NONCE_LEN, nonce};
        out->key_id = (char *)c->dk.id;
    } else {
        out->data = (ProtobufCBinaryData){n, (uint8_t *)data};
    }
    return 0;
}

/* Queues one CommandOutput fact of c (see output_fill). */
static void output_record(wk_box_t *b, const wk_cmd_t *c, uint32_t stream, uint64_t offset,
                          const uint8_t *data, size_t n, bool truncated, uint8_t *ct, int hold_ms)
{
    uint8_t nonce[SP_CRED_NONCE_LEN];
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__CommandOutput out;
    if (output_fill(b, c, stream, offset, data, n, truncated, ct, nonce, &out) < 0)
        return;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT;
    env.command_output = &out;
    publish_command_event(b, c, &env,
                          truncated     ? "truncated"
                          : stream == 1 ? "out"
                                        : "err",
                          truncated ? 0 : offset, hold_ms);
}

/* c's start and the output that waited with it go out as facts of their own (box->mu held,
 * so that nothing else of c is queued before them): it runs on past WK_FACT_HOLD_MS, wrote
 * more than one fact carries, or the worker lets go of it. */
static void record_deferred(wk_box_t *b, wk_cmd_t *c, int hold_ms)
{
    if (!c->deferring)
        return;
    c->deferring = false;
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__CommandStarted st;
    started_fill(c, c->line_ct, c->dk.id, &st);
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED;
    env.command_started = &st;
    publish_command_event(b, c, &env, "started", 0, hold_ms);
    free(c->line_ct);
    c->line_ct = NULL;
    uint8_t *ct = c->seal > 0 ? sp_xmalloc(SP_COMMAND_OUTPUT_CHUNK_MAX + SP_CRED_TAG_LEN) : NULL;
    for (const deferred_t *d = c->def_head; d; d = d->next)
        output_record(b, c, d->stream, d->offset, d->data, d->len, d->truncated, ct, hold_ms);
    free(ct);
    free_deferred(c->def_head);
    c->def_head = c->def_tail = NULL;
    c->n_def = c->def_bytes = 0;
}

/* c ended (retired: only its finish uses it): when its start still waits, it and its output
 * go inside done, its CommandExited, as one fact. */
static void merge_deferred(wk_box_t *b, wk_cmd_t *c, Space__V1__CommandExited *done, merged_t *m)
{
    memset(m, 0, sizeof(*m));
    pthread_mutex_lock(&b->mu);
    bool merge = c->deferring;
    if (merge) {
        c->deferring = false;
        m->line_ct = c->line_ct;
        m->defs = c->def_head;
        c->line_ct = NULL;
        c->def_head = c->def_tail = NULL;
        c->n_def = c->def_bytes = 0;
    }
    pthread_mutex_unlock(&b->mu);
    if (!merge)
        return;
    started_fill(c, m->line_ct, c->dk.id, &m->st);
    done->started = &m->st;
    size_t n = 0;
    for (const deferred_t *d = m->defs; d && n < SP_COMMAND_EXITED_OUTPUT_MAX; d = d->next) {
        m->ct[n] = c->seal > 0 && !d->truncated ? sp_xmalloc(d->len + SP_CRED_TAG_LEN) : NULL;
        if (output_fill(b, c, d->stream, d->offset, d->data, d->len, d->truncated, m->ct[n],
                        m->nonce[n], &m->out[n]) < 0) {
            free(m->ct[n]);
            m->ct[n] = NULL;
            continue;
        }
        m->ptrs[n] = &m->out[n];
        n++;
    }
    done->output = m->ptrs;
    done->n_output = n;
}

static void merged_dispose(merged_t *m)
{
    for (size_t i = 0; i < SP_COMMAND_EXITED_OUTPUT_MAX; i++)
        free(m->ct[i]);
    free(m->line_ct);
    free_deferred(m->defs);
}

/* Appends one waiting output entry to c (box->mu held). */
static void defer_add(wk_cmd_t *c, int stream, uint64_t offset, const uint8_t *data, size_t len,
                      bool marker)
{
    deferred_t *d = sp_xmalloc(sizeof(*d) + len);
    d->next = NULL;
    d->stream = (uint32_t)stream;
    d->offset = offset;
    d->truncated = marker;
    d->len = len;
    if (len)
        memcpy(d->data, data, len);
    if (c->def_tail)
        c->def_tail->next = d;
    else
        c->def_head = d;
    c->def_tail = d;
    c->n_def++;
}

/* Keeps n redacted bytes of stream at offset (then the marker, when truncated) for c's
 * CommandExited when that still carries them (box->mu held); false when it does not. */
static bool defer_output(wk_cmd_t *c, int stream, uint64_t offset, const uint8_t *data, size_t n,
                         bool truncated)
{
    size_t pieces = (n + SP_COMMAND_OUTPUT_CHUNK_MAX - 1) / SP_COMMAND_OUTPUT_CHUNK_MAX;
    size_t carried = n + (c->seal > 0 ? pieces * SP_CRED_TAG_LEN : 0);
    if (c->n_def + pieces + (truncated ? 1 : 0) > SP_COMMAND_EXITED_OUTPUT_MAX ||
        c->line_ct_len + c->def_bytes + carried > SP_COMMAND_EXITED_CARRY_MAX)
        return false;
    for (size_t at = 0; at < n; at += SP_COMMAND_OUTPUT_CHUNK_MAX)
        defer_add(c, stream, offset + at, data + at,
                  n - at < SP_COMMAND_OUTPUT_CHUNK_MAX ? n - at : SP_COMMAND_OUTPUT_CHUNK_MAX,
                  false);
    if (truncated)
        defer_add(c, stream, offset + n, NULL, 0, true);
    c->def_bytes += carried;
    return true;
}

static void on_started(void *arg, const char *cmd_id, uint32_t pid)
{
    wk_box_t *b = arg;
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = find_cmd(b, cmd_id);
    wk_cmd_t copy;
    uint8_t *line_ct = NULL;
    char line_key_id[SP_CRED_KEY_ID_LEN + 1] = "";
    bool defer = false;
    if (c) {
        c->pid = pid;
        /* Its start waits for its end (a timer of the waits' thread ends the wait), unless
         * the command line alone is more than that end may carry. */
        defer = b->w->waits && c->line_ct_len <= SP_COMMAND_EXITED_CARRY_MAX;
        c->deferring = defer;
        if (!defer) {
            line_ct = c->line_ct; /* this event's own: not left behind in c for the copy */
            c->line_ct = NULL;
        }
        memcpy(line_key_id, c->dk.id, sizeof(line_key_id));
        copy = *c;
        sp_cred_key_wipe(&copy.dk); /* not needed here: no copy of the key on this stack */
    }
    pthread_mutex_unlock(&b->mu);
    if (!c)
        return;
    Space__Io__V1__IoStart io = SPACE__IO__V1__IO_START__INIT;
    io.cmd_id = copy.id;
    io.pid = pid;
    if (!copy.quiet)
        publish_io(b, copy.id, "start", &io.base);
    if (defer && waits_add(b->w->waits, b->id, copy.id, WK_FACT_HOLD_MS, WAIT_FACTS))
        return;
    if (defer) { /* no timer any more (the worker stops): recorded now */
        pthread_mutex_lock(&b->mu);
        if ((c = find_cmd(b, cmd_id)))
            record_deferred(b, c, 0);
        pthread_mutex_unlock(&b->mu);
        return;
    }
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__CommandStarted st;
    started_fill(&copy, line_ct, line_key_id, &st);
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED;
    env.command_started = &st;
    publish_command_event(b, &copy, &env, "started", 0, WK_FACT_HOLD_MS);
    free(line_ct);
}

/* Records len redacted bytes of stream as CommandOutput chunks at the command's audit offset,
 * within the cap, then the marker once the cap is reached: kept for its CommandExited while
 * its start waits and they fit, else queued as facts. Called with box->mu held, which it
 * releases after the accounting: the events go out from a copy of *c. */
static void audit_record(wk_box_t *b, wk_cmd_t *c, int stream, const uint8_t *data, size_t len)
{
    size_t audit_len = 0;
    bool mark_truncated = false;
    uint64_t audit_from = c->audit_off[stream];
    if (!c->audit_truncated) {
        uint64_t cap = (uint64_t)b->w->cfg->audit_cap;
        size_t room = cap > c->audit_bytes ? (size_t)(cap - c->audit_bytes) : 0;
        /* No key for a sealed sandbox (credstore unavailable, or forgotten): nothing of the
         * output is recorded, only the marker. */
        if (c->seal < 0)
            room = 0;
        audit_len = len < room ? len : room;
        c->audit_bytes += audit_len;
        c->audit_off[stream] += audit_len;
        if (audit_len < len) {
            c->audit_truncated = true;
            mark_truncated = true;
        }
    }
    if (c->deferring) {
        if (defer_output(c, stream, audit_from, data, audit_len, mark_truncated)) {
            pthread_mutex_unlock(&b->mu);
            return;
        }
        record_deferred(b, c, WK_FACT_HOLD_MS);
    }
    wk_cmd_t copy = *c;
    pthread_mutex_unlock(&b->mu);
    /* Audit chunks: the reader thread is this command's only writer of events and the queue
     * keeps its order, so their order in the log is the output's order. */
    uint8_t *ct = copy.seal > 0 ? sp_xmalloc(SP_COMMAND_OUTPUT_CHUNK_MAX + SP_CRED_TAG_LEN) : NULL;
    for (size_t at = 0; at < audit_len; at += SP_COMMAND_OUTPUT_CHUNK_MAX) {
        size_t n = audit_len - at < SP_COMMAND_OUTPUT_CHUNK_MAX ? audit_len - at
                                                                : SP_COMMAND_OUTPUT_CHUNK_MAX;
        output_record(b, &copy, (uint32_t)stream, audit_from + at, data + at, n, false, ct,
                      WK_FACT_HOLD_MS);
    }
    free(ct);
    if (mark_truncated)
        output_record(b, &copy, (uint32_t)stream, audit_from + audit_len, NULL, 0, true, NULL,
                      WK_FACT_HOLD_MS);
    sp_cred_key_wipe(&copy.dk);
}

/* Records the redacted bytes in red (when there are any) and releases box->mu, which the caller
 * holds; red, which may hold a secret's first bytes, is wiped. */
static void record_unlock(wk_box_t *b, wk_cmd_t *c, int stream, sp_buf_t *red)
{
    if (red->len)
        audit_record(b, c, stream, (const uint8_t *)red->data, red->len);
    else
        pthread_mutex_unlock(&b->mu);
    if (red->data)
        explicit_bzero(red->data, red->cap);
    sp_buf_dispose(red);
}

/* The end of a command's stream: what its redactor held back is recorded. */
static void audit_flush(wk_box_t *b, wk_cmd_t *c, int stream)
{
    if (!c->red[stream])
        return;
    sp_buf_t red;
    sp_buf_init(&red);
    pthread_mutex_lock(&b->mu);
    sp_redactor_flush(c->red[stream], &red);
    record_unlock(b, c, stream, &red);
}

static void on_output(void *arg, const char *cmd_id, int stream, const uint8_t *data, size_t len)
{
    wk_box_t *b = arg;
    uint64_t seq = 0;
    bool live = false;
    char *waiter = NULL;
    kept_t *so_far = NULL;
    sp_buf_t red;
    sp_buf_init(&red);

    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = find_cmd(b, cmd_id);
    /* Its requester is about to attach for what is pinned, and that is full: wait for it. */
    while (c && c->pin_until_ns && c->pin_bytes + len > PIN_CAP) {
        if (sp_mono_ns() >= c->pin_until_ns) {
            unpin(b, c);
            break;
        }
        struct timespec ts = {.tv_sec = c->pin_until_ns / 1000000000,
                              .tv_nsec = c->pin_until_ns % 1000000000};
        pthread_cond_timedwait(&b->pin_cv, &b->mu, &ts);
        c = find_cmd(b, cmd_id); /* forgotten meanwhile (a suspend) */
    }
    if (!c) {
        pthread_mutex_unlock(&b->mu);
        return;
    }
    c->bytes[stream] += len;
    sp_sha256_update(c->sha[stream], data, len);
    if (!c->live_truncated && c->bytes[1] + c->bytes[2] <= LIVE_CAP) {
        seq = ++c->seq;
        keep_chunk(c, seq, stream, data, len);
        /* More than an answer carries (also when someone attached meanwhile): the requester
         * follows it from here. */
        if (c->waiter && c->kept_bytes > QUIET_CAP)
            waiter = hand_off(c, &so_far);
        live = !c->quiet;
    } else {
        c->live_truncated = true;
    }
    if (!c->audit_truncated) {
        if (c->red[stream])
            sp_redactor_feed(c->red[stream], data, len, &red);
        else
            sp_buf_append(&red, data, len);
    }
    char id[sizeof(c->id)];
    snprintf(id, sizeof(id), "%s", c->id);
    /* c stays valid after b->mu is released: only this reader thread retires it. */
    record_unlock(b, c, stream, &red);
    if (waiter) {
        reply_output(b->w, waiter, id, so_far, NULL, 0);
        free(waiter);
        free_kept(so_far);
    }

    if (live) {
        Space__Io__V1__IoChunk ch = SPACE__IO__V1__IO_CHUNK__INIT;
        ch.cmd_id = id;
        ch.seq = seq;
        ch.stream = (uint32_t)stream;
        ch.data = (ProtobufCBinaryData){len, (uint8_t *)data};
        publish_io(b, id, "out", &ch.base);
    }
}

static void on_exited(void *arg, const char *cmd_id, int exit_code, int sig, bool timed_out,
                      const char *oom)
{
    /* Killed by the memory guard: the command's error says so (IoExit, CommandExited). */
    (void)end_cmd(arg, cmd_id, exit_code, sig, timed_out, oom[0] ? oom : NULL);
}

static void on_error(void *arg, const char *cmd_id, const char *message)
{
    (void)end_cmd(arg, cmd_id, -1, 0, false, message);
}

/* The channel is gone: the commands keep running in the sandbox; the agent connects back
 * (worker_chan.c), and whatever it then does not list as running is ended there. */
static void on_lost(void *arg, const char *why)
{
    wk_box_t *b = arg;
    bool violation = strstr(why, "protocol violation") != NULL;
    sp_log(SP_LOG_WARN, "agent channel lost", SP_KS("sandbox", b->id), SP_KS("why", why));
    pthread_mutex_lock(&b->mu);
    b->agent_lost = true;
    b->lost_at_ns = sp_mono_ns();
    snprintf(b->lost_why, sizeof(b->lost_why), "%s", why);
    for (wk_cmd_t *c = b->cmds; c; c = c->next)
        c->outage = true;
    bool gone = b->gone;
    pthread_mutex_unlock(&b->mu);
    /* Transfers live in one channel (their ids are its own): they end with it. */
    char error[WK_ERR_MAX + 32];
    snprintf(error, sizeof(error), "agent channel lost: %s", why);
    wk_box_fail_files(b, error);
    if (gone)
        return; /* deleted: the channel closed because the sandbox went */
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__AgentChannelLost lost = SPACE__V1__AGENT_CHANNEL_LOST__INIT;
    lost.reason = violation ? "protocol_violation" : "closed";
    lost.detail = (char *)why;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_AGENT_CHANNEL_LOST;
    env.agent_channel_lost = &lost;
    wk_publish_box_event(b, &env, NULL);
    wk_box_listen(b);
}

int wk_box_open_agent(wk_box_t *b, int to_fd, int from_fd, int hello_timeout_ms, wk_agent_t **ret)
{
    static const wk_agent_callbacks_t cb_template = {
        .on_started = on_started,
        .on_output = on_output,
        .on_exited = on_exited,
        .on_error = on_error,
        .on_lost = on_lost,
    };
    wk_agent_callbacks_t cb = cb_template;
    wk_files_callbacks(&cb);
    wk_watch_callbacks(&cb);
    cb.arg = b;
    return wk_agent_open(to_fd, from_fd, b->id, &cb, hello_timeout_ms, ret);
}

int wk_box_attach_agent(wk_box_t *b, int to_fd, int from_fd)
{
    if (to_fd < 0 || from_fd < 0)
        return -EINVAL;
    wk_agent_t *a = NULL;
    int rc = wk_box_open_agent(b, to_fd, from_fd, HELLO_TIMEOUT_MS, &a);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&b->mu);
    b->agent = a;
    pthread_mutex_unlock(&b->mu);
    return 0;
}

/* The command line of the argv kept (a command followed again after a reconnection), or a
 * word that says why there is none. */
static void cmdline_of_argv(wk_cmd_t *c)
{
    size_t at = 0;
    c->cmdline[0] = '\0';
    for (size_t i = 0, off = 0; i < c->n_argv && at + 1 < sizeof(c->cmdline); i++) {
        int w =
            snprintf(c->cmdline + at, sizeof(c->cmdline) - at, "%s%s", i ? " " : "", c->argv + off);
        if (w < 0)
            break;
        at += (size_t)w;
        off += strlen(c->argv + off) + 1;
    }
    if (!c->n_argv)
        snprintf(c->cmdline, sizeof(c->cmdline), "(followed again after the agent reconnected)");
}

size_t wk_box_adopt_channel(wk_box_t *b, wk_agent_t *a)
{
    const wk_agent_running_t *run = NULL;
    size_t n = wk_agent_running(a, &run);
    wk_cmd_t *ended = NULL;
    char why[WK_ERR_MAX + 32];

    pthread_mutex_lock(&b->mu);
    snprintf(why, sizeof(why), "agent channel lost: %s", b->lost_why);
    /* Followed before and not listed now: ended while nobody could hear it. */
    for (wk_cmd_t **pp = &b->cmds; *pp;) {
        wk_cmd_t *c = *pp;
        bool listed = false;
        for (size_t i = 0; i < n && !listed; i++)
            listed = strcmp(run[i].id, c->id) == 0;
        if (listed) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        b->n_cmds--;
        retire_locked(b, c, -1, 0, false, why);
        c->more = ended; /* published below, outside the lock */
        ended = c;
    }
    /* Listed and not known: started under an earlier worker process. */
    for (size_t i = 0; i < n; i++) {
        if (find_cmd(b, run[i].id))
            continue;
        wk_cmd_t *c = sp_xcalloc(1, sizeof(*c));
        snprintf(c->id, sizeof(c->id), "%s", run[i].id);
        /* The agent's word for what it runs (its Hello): the argv of its Exec. */
        memcpy(c->argv, run[i].argv, sizeof(c->argv));
        c->n_argv = run[i].n_argv;
        snprintf(c->cwd, sizeof(c->cwd), "%s", run[i].cwd);
        cmdline_of_argv(c);
        c->t0_ns = sp_mono_ns();
        c->started_at_us = sp_now_us();
        c->pid = run[i].pid;
        c->pty = run[i].pty;
        c->stdin_open = run[i].stdin_open;
        c->background = true;
        c->outage = true;
        c->sha[1] = sp_sha256_new();
        c->sha[2] = sp_sha256_new();
        c->next = b->cmds;
        b->cmds = c;
        b->n_cmds++;
    }
    b->agent = a;
    b->agent_lost = false;
    b->lost_why[0] = '\0';
    pthread_mutex_unlock(&b->mu);
    while (ended) {
        wk_cmd_t *next = ended->more;
        finish(b, ended);
        ended = next;
    }
    return n;
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

/* ---- waiting requesters (ExecRequest.reply_wait_ms) ---- */

/* A requester waiting for its command's end, due an answer at due_ns. Entries whose command
 * ended first are dropped when due (the end took the waiter): at most one per command started
 * in the last REPLY_WAIT_MAX_MS. */
typedef struct wait_entry wait_entry_t;
struct wait_entry {
    wait_entry_t *next;
    int64_t due_ns;
    int kind; /* WAIT_REPLY, WAIT_FACTS */
    char sandbox[SP_ID_MAX + 1];
    char cmd_id[sizeof(((wk_cmd_t *)0)->id)];
};

struct wk_waits {
    wk_t *w;
    pthread_mutex_t mu;
    pthread_cond_t cv;  /* CLOCK_MONOTONIC */
    wait_entry_t *head; /* by due_ns */
    bool stop;
    pthread_t thread;
};

static bool waits_add(wk_waits_t *ws, const char *sandbox, const char *cmd_id, uint32_t wait_ms,
                      int kind)
{
    wait_entry_t *e = sp_xcalloc(1, sizeof(*e));
    e->due_ns = sp_mono_ns() + (int64_t)wait_ms * 1000000;
    e->kind = kind;
    snprintf(e->sandbox, sizeof(e->sandbox), "%s", sandbox);
    snprintf(e->cmd_id, sizeof(e->cmd_id), "%s", cmd_id);
    pthread_mutex_lock(&ws->mu);
    if (ws->stop) {
        pthread_mutex_unlock(&ws->mu);
        free(e);
        return false;
    }
    wait_entry_t **pp = &ws->head;
    while (*pp && (*pp)->due_ns <= e->due_ns)
        pp = &(*pp)->next;
    e->next = *pp;
    *pp = e;
    if (ws->head == e)
        pthread_cond_signal(&ws->cv);
    pthread_mutex_unlock(&ws->mu);
    return true;
}

/* The wait is over and the command still runs: answer "accepted" (no exit) with its output so
 * far, which goes out live from now on; the requester attaches for what came in between. */
static void wait_due(wk_t *w, const wait_entry_t *e)
{
    wk_box_t *b = wk_owned_get(w, e->sandbox);
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = find_cmd(b, e->cmd_id);
    char *waiter = NULL;
    kept_t *so_far = NULL;
    if (c && e->kind == WAIT_FACTS)
        record_deferred(b, c, 0); /* it runs on: its start is recorded now */
    else if (c && c->waiter)
        waiter = hand_off(c, &so_far);
    pthread_mutex_unlock(&b->mu);
    if (waiter)
        reply_output(w, waiter, e->cmd_id, so_far, NULL, 0);
    free(waiter);
    free_kept(so_far);
    wk_box_put(b);
}

static void *waits_main(void *arg)
{
    wk_waits_t *ws = arg;
    pthread_mutex_lock(&ws->mu);
    while (!ws->stop) {
        wait_entry_t *e = ws->head;
        if (e && e->due_ns <= sp_mono_ns()) {
            ws->head = e->next;
            pthread_mutex_unlock(&ws->mu);
            wait_due(ws->w, e);
            free(e);
            pthread_mutex_lock(&ws->mu);
            continue;
        }
        if (!e) {
            pthread_cond_wait(&ws->cv, &ws->mu);
            continue;
        }
        struct timespec ts = {.tv_sec = e->due_ns / 1000000000, .tv_nsec = e->due_ns % 1000000000};
        pthread_cond_timedwait(&ws->cv, &ws->mu, &ts);
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

static int waits_start(wk_t *w)
{
    wk_waits_t *ws = sp_xcalloc(1, sizeof(*ws));
    pthread_condattr_t ca;
    ws->w = w;
    pthread_mutex_init(&ws->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ws->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&ws->thread, NULL, waits_main, ws);
    if (rc != 0) {
        pthread_cond_destroy(&ws->cv);
        pthread_mutex_destroy(&ws->mu);
        free(ws);
        return -rc;
    }
    w->waits = ws;
    return 0;
}

/* After the exec subscription is gone: answers every waiter still due one (their commands
 * keep running and keep their output for an attach). */
static void waits_stop(wk_t *w)
{
    wk_waits_t *ws = w->waits;
    if (!ws)
        return;
    pthread_mutex_lock(&ws->mu);
    ws->stop = true;
    pthread_cond_signal(&ws->cv);
    pthread_mutex_unlock(&ws->mu);
    pthread_join(ws->thread, NULL);
    /* Stays allocated until wk_commands_free: reader threads still ask it (and are refused). */
    pthread_mutex_lock(&ws->mu);
    wait_entry_t *list = ws->head;
    ws->head = NULL;
    pthread_mutex_unlock(&ws->mu);
    for (wait_entry_t *e = list; e;) {
        wait_entry_t *next = e->next;
        wait_due(w, e);
        free(e);
        e = next;
    }
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
    if ((q->pty_rows == 0) != (q->pty_cols == 0) || q->pty_rows > WK_AGENT_PTY_MAX ||
        q->pty_cols > WK_AGENT_PTY_MAX) {
        snprintf(detail, dlen, "pty rows and cols: both 1..%d, or neither", WK_AGENT_PTY_MAX);
        return "bad_request";
    }
    return NULL;
}

/* What a list shows of the command: the shell string, or argv joined by spaces, cut. */
static void cmdline(char *out, size_t len, const Space__Io__V1__ExecRequest *q)
{
    if (q->cmd[0]) {
        snprintf(out, len, "%s", q->cmd);
        return;
    }
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < q->n_argv && at + 1 < len; i++) {
        int w = snprintf(out + at, len - at, "%s%s", i ? " " : "", q->argv[i]);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

/* What a list shows of argv and cwd: as many whole arguments as fit ARGV_KEPT_N and
 * ARGV_KEPT_BYTES (a shell string is /bin/sh -c cmd, as the agent runs it). */
static void argv_keep(wk_cmd_t *c, const Space__Io__V1__ExecRequest *q)
{
    const char *sh[3] = {"/bin/sh", "-c", q->cmd};
    char *const *argv = q->cmd[0] ? (char *const *)sh : q->argv;
    size_t n = q->cmd[0] ? 3 : q->n_argv, at = 0;
    c->n_argv = 0;
    for (size_t i = 0; i < n && c->n_argv < ARGV_KEPT_N; i++) {
        size_t len = strlen(argv[i]) + 1;
        if (at + len > sizeof(c->argv))
            break;
        memcpy(c->argv + at, argv[i], len);
        at += len;
        c->n_argv++;
    }
    snprintf(c->cwd, sizeof(c->cwd), "%s", q->cwd ? q->cwd : "");
}

static void exec_request(void *arg, const char *subject, const char *reply_to, const uint8_t *data,
                         size_t len)
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
    /* Only a command nobody else feeds or follows waits (no stdin, pty or background). */
    uint32_t wait_ms = 0;
    if (q->reply_wait_ms && reply_to && w->waits && !q->background && !q->stdin_open &&
        !q->pty_rows)
        wait_ms = q->reply_wait_ms < REPLY_WAIT_MAX_MS ? q->reply_wait_ms : REPLY_WAIT_MAX_MS;
    wk_box_t *b = refusal ? NULL : wk_owned_get(w, q->sandbox);
    if (!refusal && (!b || strcmp(b->tenant, q->tenant) != 0)) {
        refusal = "sandbox_not_running";
        snprintf(detail, sizeof(detail), "no running sandbox %s on worker %s", q->sandbox,
                 w->cfg->id);
    }
    /* The data key, asked for before the command starts (docs/audit.md): without it nothing
     * of the output is recorded (seal -1), the command still runs. */
    int seal = 0;
    sp_cred_key_t dk = {0};
    if (!refusal && w->cfg->seal_output)
        seal = wk_datakey_get(b, &dk) == 0 ? 1 : -1;
    /* And the command line, for CommandStarted: without a key it is recorded nowhere. */
    uint8_t *line_ct = NULL, line_nonce[SP_CRED_NONCE_LEN] = {0};
    size_t line_ct_len = 0;
    if (seal > 0 && sp_cmdline_seal(&dk, q->sandbox, q->cmd_id, q->argv, q->n_argv, q->cmd,
                                    line_nonce, &line_ct, &line_ct_len) < 0)
        sp_log(SP_LOG_ERROR, "cannot seal the command line: not recorded", SP_KS("cmd", q->cmd_id));
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
            c->started_at_us = sp_now_us();
            c->background = q->background;
            c->pty = q->pty_rows > 0;
            c->stdin_open = q->stdin_open || c->pty;
            cmdline(c->cmdline, sizeof(c->cmdline), q);
            argv_keep(c, q);
            c->sha[1] = sp_sha256_new();
            c->sha[2] = sp_sha256_new();
            c->seal = seal;
            c->dk = dk;
            c->line_ct = line_ct;
            c->line_ct_len = line_ct_len;
            memcpy(c->line_nonce, line_nonce, sizeof(line_nonce));
            line_ct = NULL;
            /* The values this command was given (the sandbox's env among them) never reach
             * the log: each stream's redactor replaces them, also across chunks. */
            for (int s = 1; s <= 2; s++) {
                c->red[s] = sp_redactor_new();
                sp_redactor_add_env(c->red[s], q->env, q->n_env);
            }
            if (wait_ms) {
                c->waiter = sp_xstrdup(reply_to);
                c->quiet = true;
            }
            c->next = b->cmds;
            b->cmds = c;
            b->n_cmds++;
        }
        pthread_mutex_unlock(&b->mu);
    }
    sp_cred_key_wipe(&dk);
    free(line_ct); /* refused: not taken by a command */
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
    /* The caller's environment, plus what points TLS clients at the deployment CA unless the
     * caller set those names itself (egressd terminates TLS with leaves from that CA). */
    const char *const *trust = NULL;
    size_t n_trust = wk_host_trust_env(w->host, &trust);
    char **env = sp_xcalloc(q->n_env + n_trust + 1, sizeof(char *));
    size_t n_env = 0;
    for (size_t i = 0; i < q->n_env; i++)
        env[n_env++] = q->env[i];
    for (size_t k = 0; k < n_trust; k++) {
        size_t name = (size_t)(strchr(trust[k], '=') - trust[k]) + 1;
        bool given = false;
        for (size_t i = 0; i < q->n_env && !given; i++)
            given = strncmp(q->env[i], trust[k], name) == 0;
        if (!given)
            env[n_env++] = (char *)trust[k];
    }
    ex.env = env;
    ex.n_env = n_env;
    ex.cwd = q->cwd;
    if (strcmp(q->user, "user") == 0)
        ex.uid = ex.gid = USER_UID;
    /* A background command runs until it ends, unless it was given a timeout. */
    ex.timeout_ms = (q->timeout_s ? q->timeout_s : q->background ? 0 : DEFAULT_TIMEOUT_S) * 1000;
    ex.stdin_data = q->stdin;
    ex.stdin_open = q->stdin_open;
    ex.pty = q->pty_rows > 0;
    ex.rows = q->pty_rows;
    ex.cols = q->pty_cols;
    pthread_mutex_lock(&b->mu);
    wk_agent_t *agent = b->agent;
    pthread_mutex_unlock(&b->mu);
    int rc = wk_agent_exec(agent, &ex);
    free(env);
    if (rc < 0) {
        pthread_mutex_lock(&b->mu);
        c = take_cmd(b, q->cmd_id);
        pthread_mutex_unlock(&b->mu);
        if (c) {
            sp_sha256_final(c->sha[1], (uint8_t[SP_SHA256_LEN]){0});
            sp_sha256_final(c->sha[2], (uint8_t[SP_SHA256_LEN]){0});
            cmd_free(c);
        }
        reply(w, reply_to, false, rc == -EBUSY ? "too_many_commands" : "agent_unavailable",
              sp_strerror(rc));
    } else {
        /* A waiting requester is answered when the command ends, or by the waits' thread. */
        if (wait_ms)
            (void)waits_add(w->waits, q->sandbox, q->cmd_id, wait_ms, WAIT_REPLY);
        else
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

/* The subscription's callback: acts only on a request that wk_request_open lets through. */
static void on_exec_request(void *arg, const char *subject, const char *reply_to,
                            const uint8_t *data, size_t len)
{
    sp_request_t rq;
    if (wk_request_open(arg, subject, reply_to, data, len, &rq))
        exec_request(arg, subject, reply_to, rq.body, rq.len);
    sp_request_dispose(&rq);
}

/* ---- control (a cnats thread) ---- */

typedef struct {
    Space__Io__V1__CtlReply r;
    Space__Io__V1__CommandInfo *infos;
    Space__Io__V1__CommandInfo **info_ptrs;
    Space__Io__V1__IoChunk *chunks;
    Space__Io__V1__IoChunk **chunk_ptrs;
    Space__Io__V1__IoExit exit;
    char *strings; /* copies of what the infos point to (the box may change after) */
    char **argvs;  /* the infos' argv pointers, ARGV_KEPT_N each (into strings) */
} ctl_reply_t;

static void ctl_send(wk_t *w, const char *to, const Space__Io__V1__CtlReply *r)
{
    if (!to)
        return;
    size_t len = space__io__v1__ctl_reply__get_packed_size(r);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    space__io__v1__ctl_reply__pack(r, buf);
    int rc = sp_bus_publish_core(w->bus, to, buf, len);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "control reply not sent", SP_KS("error", sp_strerror(rc)));
    free(buf);
}

static void ctl_refuse(wk_t *w, const char *to, const char *error, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void ctl_refuse(wk_t *w, const char *to, const char *error, const char *fmt, ...)
{
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    Space__Io__V1__CtlReply r = SPACE__IO__V1__CTL_REPLY__INIT;
    r.error = (char *)error;
    r.detail = detail;
    ctl_send(w, to, &r);
}

/* Fills info from c (box->mu held); the strings are copied into *pool, argv's pointers into
 * argv_pool (ARGV_KEPT_N of them; both freed by the caller). */
static void info_of(Space__Io__V1__CommandInfo *info, const wk_cmd_t *c, bool running, char **pool,
                    size_t *at, char **argv_pool)
{
    space__io__v1__command_info__init(info);
    memcpy(*pool + *at, c->argv, sizeof(c->argv));
    for (size_t i = 0, off = 0; i < c->n_argv; i++) {
        argv_pool[i] = *pool + *at + off;
        off += strlen(c->argv + off) + 1;
    }
    info->argv = argv_pool;
    info->n_argv = c->n_argv;
    *at += sizeof(c->argv);
    info->cwd = *pool + *at;
    *at += (size_t)sprintf(*pool + *at, "%s", c->cwd) + 1;
    info->cmd_id = *pool + *at;
    *at += (size_t)sprintf(*pool + *at, "%s", c->id) + 1;
    info->cmd = *pool + *at;
    *at += (size_t)sprintf(*pool + *at, "%s", c->cmdline) + 1;
    info->error = *pool + *at;
    *at += (size_t)sprintf(*pool + *at, "%s", running ? "" : c->error) + 1;
    info->pid = c->pid;
    info->running = running;
    info->exit_code = running ? 0 : c->exit_code;
    info->signal = running ? 0 : c->signal;
    info->started_at_us = c->started_at_us;
    info->background = c->background;
    info->pty = c->pty;
    info->stdin_open = c->stdin_open;
    info->last_seq = c->seq;
}
#define INFO_STRINGS                                                                               \
    (sizeof(((wk_cmd_t *)0)->id) + CMDLINE_MAX + 1 + WK_ERR_MAX + ARGV_KEPT_BYTES + CWD_KEPT_MAX + \
     1)

static void ctl_list(wk_box_t *b, const char *to)
{
    ctl_reply_t x;
    memset(&x, 0, sizeof(x));
    space__io__v1__ctl_reply__init(&x.r);
    pthread_mutex_lock(&b->mu);
    prune_done(b);
    size_t n = b->n_cmds;
    for (wk_cmd_t *c = b->done; c; c = c->next)
        n++;
    x.infos = sp_xcalloc(n ? n : 1, sizeof(*x.infos));
    x.info_ptrs = sp_xcalloc(n ? n : 1, sizeof(Space__Io__V1__CommandInfo *));
    x.strings = sp_xmalloc(n * INFO_STRINGS + 1);
    x.argvs = sp_xcalloc(n ? n * ARGV_KEPT_N : 1, sizeof(char *));
    size_t k = 0, at = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (wk_cmd_t *c = pass ? b->done : b->cmds; c; c = c->next) {
            info_of(&x.infos[k], c, pass == 0, &x.strings, &at, x.argvs + k * ARGV_KEPT_N);
            x.info_ptrs[k] = &x.infos[k];
            k++;
        }
    }
    pthread_mutex_unlock(&b->mu);
    x.r.ok = true;
    x.r.commands = x.info_ptrs;
    x.r.n_commands = k;
    ctl_send(b->w, to, &x.r);
    free(x.infos);
    free(x.info_ptrs);
    free(x.strings);
    free(x.argvs);
}

/* The command's info, its kept chunks after from_seq and, once it has ended, its exit. */
static void ctl_attach(wk_box_t *b, const char *to, const char *cmd_id, uint64_t from_seq)
{
    ctl_reply_t x;
    memset(&x, 0, sizeof(x));
    space__io__v1__ctl_reply__init(&x.r);
    space__io__v1__io_exit__init(&x.exit);
    Space__Io__V1__CommandInfo info;
    Space__Io__V1__CommandInfo *info_ptr = &info;
    kept_t *copies = NULL;
    size_t n = 0;
    char *strings = sp_xmalloc(INFO_STRINGS + 1);
    size_t at = 0;

    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = find_cmd(b, cmd_id);
    bool running = c != NULL;
    if (!c)
        c = find_done(b, cmd_id);
    if (!c) {
        pthread_mutex_unlock(&b->mu);
        free(strings);
        ctl_refuse(b->w, to, "not_found", "no command %s in sandbox %s (ended ones are kept %d s)",
                   cmd_id, b->id, DONE_TTL_S);
        return;
    }
    /* Someone follows it now: its output goes out live from here (after what this answer
     * replays; repeats drop out by seq). */
    c->quiet = false;
    /* The requester answered as running, attaching for what came after its answer. */
    if (c->pin_until_ns && from_seq >= c->pin_seq)
        unpin(b, c);
    char *argv_pool[ARGV_KEPT_N];
    info_of(&info, c, running, &strings, &at, argv_pool);
    x.r.first_kept_seq = c->kept_head ? c->kept_head->seq : 0;
    copies = copy_kept(c, from_seq, &n);
    if (!running) {
        x.exit.cmd_id = info.cmd_id;
        x.exit.exit_code = c->exit_code;
        x.exit.signal = c->signal;
        x.exit.timed_out = c->timed_out;
        x.exit.error = info.error;
        x.exit.stdout_bytes = c->bytes[1];
        x.exit.stderr_bytes = c->bytes[2];
        x.exit.truncated = c->live_truncated;
        x.exit.last_seq = c->seq;
        x.exit.duration_ms = c->duration_ms;
        x.r.exit = &x.exit;
    }
    pthread_mutex_unlock(&b->mu);

    x.chunks = sp_xcalloc(n ? n : 1, sizeof(*x.chunks));
    x.chunk_ptrs = sp_xcalloc(n ? n : 1, sizeof(Space__Io__V1__IoChunk *));
    size_t i = 0;
    for (kept_t *k = copies; k; k = k->next, i++) {
        space__io__v1__io_chunk__init(&x.chunks[i]);
        x.chunks[i].cmd_id = info.cmd_id;
        x.chunks[i].seq = k->seq;
        x.chunks[i].stream = k->stream;
        x.chunks[i].data = (ProtobufCBinaryData){k->len, k->data};
        x.chunk_ptrs[i] = &x.chunks[i];
    }
    x.r.ok = true;
    x.r.commands = &info_ptr;
    x.r.n_commands = 1;
    x.r.replay = x.chunk_ptrs;
    x.r.n_replay = n;
    ctl_send(b->w, to, &x.r);
    free_kept(copies);
    free(x.chunks);
    free(x.chunk_ptrs);
    free(strings);
}

/* stdin, signal, resize: to a running command through the agent. */
static void ctl_command(wk_box_t *b, const char *to, const Space__Io__V1__CtlRequest *q)
{
    pthread_mutex_lock(&b->mu);
    wk_cmd_t *c = find_cmd(b, q->cmd_id);
    bool done = !c && find_done(b, q->cmd_id);
    bool stdin_open = c && c->stdin_open, pty = c && c->pty;
    wk_agent_t *agent = b->agent_lost ? NULL : b->agent;
    if (c && strcmp(q->op, "stdin") == 0 && q->eof)
        c->stdin_open = false; /* only one writer gets to close it */
    pthread_mutex_unlock(&b->mu);

    if (!c) {
        ctl_refuse(b->w, to, done ? "not_running" : "not_found", "command %s %s", q->cmd_id,
                   done ? "has ended" : "is not known in this sandbox");
        return;
    }
    if (!agent) {
        ctl_refuse(b->w, to, "agent_unavailable", "the sandbox's agent channel is not available");
        return;
    }
    int rc;
    if (strcmp(q->op, "stdin") == 0) {
        if (!stdin_open) {
            ctl_refuse(b->w, to, "stdin_closed",
                       "the command's stdin is closed (start it with stdin_open, or it was "
                       "closed by eof)");
            return;
        }
        if (q->data.len > CTL_STDIN_MAX) {
            ctl_refuse(b->w, to, "bad_request", "stdin data over %d bytes", CTL_STDIN_MAX);
            return;
        }
        rc = wk_agent_stdin(agent, q->cmd_id, q->data.data, q->data.len, q->eof);
    } else if (strcmp(q->op, "signal") == 0) {
        if (q->signal == 0 || q->signal > 64) {
            ctl_refuse(b->w, to, "bad_request", "signal must be 1..64");
            return;
        }
        rc = wk_agent_signal(agent, q->cmd_id, (int)q->signal);
    } else {
        if (!pty) {
            ctl_refuse(b->w, to, "not_a_pty", "command %s does not run on a pty", q->cmd_id);
            return;
        }
        if (q->rows == 0 || q->cols == 0 || q->rows > WK_AGENT_PTY_MAX ||
            q->cols > WK_AGENT_PTY_MAX) {
            ctl_refuse(b->w, to, "bad_request", "rows and cols must be 1..%d", WK_AGENT_PTY_MAX);
            return;
        }
        rc = wk_agent_resize(agent, q->cmd_id, q->rows, q->cols);
    }
    if (rc == -ENOENT) {
        ctl_refuse(b->w, to, "not_running", "command %s has ended", q->cmd_id);
        return;
    }
    if (rc < 0) {
        ctl_refuse(b->w, to, "agent_unavailable", "%s", sp_strerror(rc));
        return;
    }
    Space__Io__V1__CtlReply r = SPACE__IO__V1__CTL_REPLY__INIT;
    r.ok = true;
    ctl_send(b->w, to, &r);
}

static void ctl_request(void *arg, const char *subject, const char *reply_to, const uint8_t *data,
                        size_t len)
{
    wk_t *w = arg;
    (void)subject;
    Space__Io__V1__CtlRequest *q =
        len <= CTL_MAX ? space__io__v1__ctl_request__unpack(NULL, len, data) : NULL;
    if (!q) {
        ctl_refuse(w, reply_to, "bad_request", "not a CtlRequest");
        return;
    }
    bool list = strcmp(q->op, "list") == 0;
    bool known = list || strcmp(q->op, "attach") == 0 || strcmp(q->op, "stdin") == 0 ||
                 strcmp(q->op, "signal") == 0 || strcmp(q->op, "resize") == 0;
    wk_box_t *b = NULL;
    if (!known || !sp_id_valid(q->sandbox) || !sp_id_valid(q->tenant) ||
        (!list && !sp_id_valid(q->cmd_id))) {
        ctl_refuse(w, reply_to, "bad_request", "op, sandbox, tenant or cmd_id is not valid");
    } else if (!(b = wk_owned_get(w, q->sandbox)) || strcmp(b->tenant, q->tenant) != 0) {
        ctl_refuse(w, reply_to, "sandbox_not_running", "no running sandbox %s on worker %s",
                   q->sandbox, w->cfg->id);
    } else if (list) {
        ctl_list(b, reply_to);
    } else if (strcmp(q->op, "attach") == 0) {
        ctl_attach(b, reply_to, q->cmd_id, q->from_seq);
    } else {
        ctl_command(b, reply_to, q);
    }
    wk_box_put(b);
    if (q->data.data)
        explicit_bzero(q->data.data, q->data.len);
    space__io__v1__ctl_request__free_unpacked(q, NULL);
}

/* The subscription's callback: acts only on a request that wk_request_open lets through. */
static void on_ctl_request(void *arg, const char *subject, const char *reply_to,
                           const uint8_t *data, size_t len)
{
    sp_request_t rq;
    if (wk_request_open(arg, subject, reply_to, data, len, &rq))
        ctl_request(arg, subject, reply_to, rq.body, rq.len);
    sp_request_dispose(&rq);
}

int wk_commands_start(wk_t *w)
{
    char subject[128];
    int rc = waits_start(w);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "no thread for waiting requesters: every command answers at once",
               SP_KS("error", sp_strerror(rc)));
    rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_EXEC, w->cfg->id, NULL, NULL);
    if (rc >= 0)
        rc = sp_bus_subscribe(w->bus, subject, NULL, on_exec_request, w, &w->exec_sub);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot subscribe to exec requests", SP_KS("error", sp_strerror(rc)));
        return rc;
    }
    rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_CTL, w->cfg->id, NULL, NULL);
    if (rc >= 0)
        rc = sp_bus_subscribe(w->bus, subject, NULL, on_ctl_request, w, &w->ctl_sub);
    if (rc < 0)
        sp_log(SP_LOG_ERROR, "cannot subscribe to control requests",
               SP_KS("error", sp_strerror(rc)));
    return rc;
}

void wk_commands_stop(wk_t *w)
{
    sp_bus_unsubscribe(w->exec_sub);
    w->exec_sub = NULL;
    sp_bus_unsubscribe(w->ctl_sub);
    w->ctl_sub = NULL;
    waits_stop(w);
}

void wk_commands_free(wk_t *w)
{
    wk_waits_t *ws = w->waits;
    if (!ws)
        return;
    w->waits = NULL;
    pthread_cond_destroy(&ws->cv);
    pthread_mutex_destroy(&ws->mu);
    free(ws);
}

/* One command of the log without its end. */
typedef struct {
    char cmd_id[65];
    char intent[37];
    char corr[129];
    bool ended;
} open_cmd_t;

int wk_commands_reconcile(wk_t *w, PGconn *db, const char *tenant, const char *sbx)
{
    const char *params[1] = {sbx};
    PGresult *r = PQexecParams(db,
                               "SELECT payload FROM events WHERE aggregate_kind = 'sandbox' AND "
                               "aggregate_id = $1 AND status = 'accepted' AND type IN "
                               "('CommandRequested', 'CommandStarted', 'CommandExited') ORDER BY "
                               "stream_seq",
                               1, NULL, params, NULL, NULL, 1);
    int rc = sp_db_check(r, PGRES_TUPLES_OK);
    if (rc < 0) {
        PQclear(r);
        return rc;
    }
    open_cmd_t *cmds = sp_xcalloc((size_t)PQntuples(r) + 1, sizeof(*cmds));
    size_t n = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        sp_envelope_t *env = NULL;
        char reason[SP_REASON_MAX];
        if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, i, 0), (size_t)PQgetlength(r, i, 0),
                               &env, reason) < 0)
            continue;
        const char *id = env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED
                             ? env->command_requested->cmd_id
                         : env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED
                             ? env->command_started->cmd_id
                             : env->command_exited->cmd_id;
        size_t k = 0;
        while (k < n && strcmp(cmds[k].cmd_id, id) != 0)
            k++;
        if (k == n) {
            snprintf(cmds[n].cmd_id, sizeof(cmds[n].cmd_id), "%s", id);
            n++;
        }
        if (env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED) {
            snprintf(cmds[k].intent, sizeof(cmds[k].intent), "%s", env->event_id);
            snprintf(cmds[k].corr, sizeof(cmds[k].corr), "%s", env->correlation_id);
        }
        cmds[k].ended |= env->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED;
        sp_envelope_free(env);
    }
    PQclear(r);
    size_t ended = 0;
    for (size_t k = 0; k < n; k++) {
        if (cmds[k].ended || !cmds[k].intent[0])
            continue;
        /* Its end was never seen: the previous worker died while it ran (or before it
         * started). The same message id as the end it would have had: if the journal's copy
         * of that end is on its way, the stream keeps that one. */
        wk_box_t b = {.w = w};
        wk_cmd_t c = {0};
        snprintf(b.id, sizeof(b.id), "%s", sbx);
        snprintf(b.tenant, sizeof(b.tenant), "%s", tenant);
        snprintf(c.id, sizeof(c.id), "%s", cmds[k].cmd_id);
        snprintf(c.intent_id, sizeof(c.intent_id), "%s", cmds[k].intent);
        snprintf(c.corr, sizeof(c.corr), "%s", cmds[k].corr);
        sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
        Space__V1__CommandExited done = SPACE__V1__COMMAND_EXITED__INIT;
        done.cmd_id = c.id;
        done.exit_code = -1;
        done.error = "worker_restarted: the worker stopped while the command ran; its end "
                     "was not seen";
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED;
        env.command_exited = &done;
        if (publish_command_event(&b, &c, &env, "exited", 0, 0) == 0)
            ended++;
        /* A gateway still following it answers now, not at the command's deadline. */
        Space__Io__V1__IoExit ex = SPACE__IO__V1__IO_EXIT__INIT;
        ex.cmd_id = c.id;
        ex.exit_code = -1;
        ex.error = done.error;
        publish_io(&b, c.id, "exit", &ex.base);
    }
    free(cmds);
    if (ended)
        sp_log(SP_LOG_INFO, "commands of the previous worker ended", SP_KS("sandbox", sbx),
               SP_KU("commands", ended));
    return 0;
}
