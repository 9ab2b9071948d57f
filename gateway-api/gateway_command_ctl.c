/* The commands of a sandbox, by id: GET /v1/sandboxes/{id}/commands (list) and
 * POST /v1/sandboxes/{id}/commands/{cid}/stdin|signal|resize. Each is a lookup of where the
 * sandbox runs (a pool job), then one CtlRequest to that worker on space.io.wkr.<worker>.ctl
 * (a bus job), then the answer. Stdin bytes travel only in the request to the worker: they are
 * not logged and not recorded as events (the command's intent said stdin_open). */
#include "contract.h"
#include "request.h"
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "b64.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define CTL_TIMEOUT_MS 10000
#define CTL_STDIN_MAX  (512 * 1024) /* bytes per stdin request (worker: CTL_STDIN_MAX) */
#define DETAIL_MAX     256

typedef gw_ctl_op_t op_t;
#define OP_LIST   GW_CTL_LIST
#define OP_STDIN  GW_CTL_STDIN
#define OP_SIGNAL GW_CTL_SIGNAL
#define OP_RESIZE GW_CTL_RESIZE

typedef struct {
    gw_job_t job; /* first: the pool job */
    gw_bus_job_t bus;
    gw_req_t *rq; /* holds a reference */
    op_t op;
    char sandbox[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char cmd_id[SP_ID_MAX + 1];
    gw_sandbox_loc_t loc;
    /* The request. */
    uint8_t *data;
    size_t data_len;
    bool eof;
    uint32_t signal, rows, cols;
    uint32_t pid; /* E2B: find the command by its process id first */
    void (*answer)(gw_req_t *rq, const Space__Io__V1__CtlReply *r, const char *cmd_id);
    /* The answer. */
    int rc;
    Space__Io__V1__CtlReply *reply;
} ctl_t;

static void ctl_free(ctl_t *x)
{
    if (x->data) {
        explicit_bzero(x->data, x->data_len);
        free(x->data);
    }
    if (x->reply)
        space__io__v1__ctl_reply__free_unpacked(x->reply, NULL);
    gw_req_unref(x->rq);
    free(x);
}

/* ---- bodies ---- */

static const struct {
    const char *name;
    int sig;
} SIGNALS[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT},   {"KILL", SIGKILL},
               {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM},   {"CONT", SIGCONT},
               {"STOP", SIGSTOP}, {"TSTP", SIGTSTP}, {"WINCH", SIGWINCH}, {"ALRM", SIGALRM},
               {"PIPE", SIGPIPE}, {"ABRT", SIGABRT}};

/* "TERM", "SIGTERM" or 15. */
static int parse_signal(const sp_json_t *v, uint32_t *ret)
{
    int64_t n;
    if (sp_json_int(v, 1, 64, &n) == 0) {
        *ret = (uint32_t)n;
        return 0;
    }
    const char *s = sp_json_str(v, NULL);
    if (!s)
        return -EINVAL;
    if (strncasecmp(s, "SIG", 3) == 0)
        s += 3;
    for (size_t i = 0; i < sizeof(SIGNALS) / sizeof(SIGNALS[0]); i++) {
        if (strcasecmp(s, SIGNALS[i].name) == 0) {
            *ret = (uint32_t)SIGNALS[i].sig;
            return 0;
        }
    }
    return -EINVAL;
}

/* Parses the body of stdin, signal or resize into x; answers a 400/415 itself. */
static int parse_body(ctl_t *x, gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
    const char *body = req->entity.base ? req->entity.base : "";
    size_t len = req->entity.base ? req->entity.len : 0;
    char jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;
    int rc = -EINVAL;

    if (ct && !gw_json_content_type(ct)) {
        gw_respond_error(rq, 415, "unsupported_media_type", NULL,
                         "send the body as application/json");
        return -EINVAL;
    }
    if (len > (size_t)CTL_STDIN_MAX * 2 + 1024) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %d bytes",
                         CTL_STDIN_MAX * 2 + 1024);
        return -EINVAL;
    }
    sp_json_limits_t lim = {
        .max_bytes = len + 1, .max_depth = 2, .max_nodes = 16, .max_string = len + 1};
    if (len == 0 || sp_json_parse(body, len, &lim, &doc, jerr) < 0 ||
        sp_json_type(sp_json_root(doc)) != SP_JSON_OBJECT) {
        gw_respond_error(rq, 400, "invalid_json", NULL, "the body must be a JSON object%s%s",
                         len ? ": " : "", len ? jerr : "");
        goto out;
    }
    const sp_json_t *root = sp_json_root(doc);
    bool have = false;
    for (size_t i = 0; i < sp_json_len(root); i++) {
        const char *k = sp_json_key_at(root, i);
        const sp_json_t *v = sp_json_at(root, i);
        if (x->op == OP_STDIN && (strcmp(k, "data") == 0 || strcmp(k, "data_b64") == 0)) {
            size_t n;
            const char *s = sp_json_str(v, &n);
            if (!s || have) {
                gw_respond_error(rq, 400, "invalid_field", NULL,
                                 "give one of data (a string) and data_b64 (base64)");
                goto out;
            }
            have = true;
            if (k[4] == '_') {
                if (sp_b64_decode(s, n, &x->data, &x->data_len) < 0) {
                    gw_respond_error(rq, 400, "invalid_field", NULL,
                                     "data_b64 is not base64 (RFC 4648, padded)");
                    goto out;
                }
            } else {
                x->data = sp_xmalloc(n ? n : 1);
                memcpy(x->data, s, n);
                x->data_len = n;
            }
            if (x->data_len > CTL_STDIN_MAX) {
                gw_respond_error(rq, 413, "body_too_large", NULL,
                                 "at most %d bytes of stdin per request", CTL_STDIN_MAX);
                goto out;
            }
        } else if (x->op == OP_STDIN && strcmp(k, "eof") == 0) {
            if (sp_json_bool(v, &x->eof) < 0) {
                gw_respond_error(rq, 400, "invalid_field", NULL, "eof must be a boolean");
                goto out;
            }
        } else if (x->op == OP_SIGNAL && strcmp(k, "signal") == 0) {
            if (parse_signal(v, &x->signal) < 0) {
                gw_respond_error(rq, 400, "invalid_field", NULL,
                                 "signal must be 1..64 or a name such as \"TERM\" or \"SIGKILL\"");
                goto out;
            }
            have = true;
        } else if (x->op == OP_RESIZE && (strcmp(k, "rows") == 0 || strcmp(k, "cols") == 0)) {
            int64_t n;
            if (sp_json_int(v, 1, GW_PTY_MAX, &n) < 0) {
                gw_respond_error(rq, 400, "invalid_field", NULL,
                                 "%s must be an integer within 1..%d", k, GW_PTY_MAX);
                goto out;
            }
            *(k[0] == 'r' ? &x->rows : &x->cols) = (uint32_t)n;
        } else {
            gw_respond_error(rq, 400, "unknown_field", NULL, "unknown field %s", k);
            goto out;
        }
    }
    if (x->op == OP_STDIN && !have && !x->eof) {
        gw_respond_error(rq, 400, "missing_field", NULL, "give data, data_b64 or eof");
        goto out;
    }
    if (x->op == OP_SIGNAL && !have) {
        gw_respond_error(rq, 400, "missing_field", NULL, "give signal");
        goto out;
    }
    if (x->op == OP_RESIZE && (!x->rows || !x->cols)) {
        gw_respond_error(rq, 400, "missing_field", NULL, "give rows and cols");
        goto out;
    }
    rc = 0;
out:
    sp_json_doc_free(doc);
    return rc;
}

/* ---- answers ---- */

static void answer_list(gw_req_t *rq, const Space__Io__V1__CtlReply *r)
{
    sp_buf_t b, safe;
    sp_buf_init(&b);
    sp_buf_init(&safe);
    sp_buf_puts(&b, "{\"commands\":[");
    for (size_t i = 0; i < r->n_commands; i++) {
        const Space__Io__V1__CommandInfo *c = r->commands[i];
        if (!sp_id_valid(c->cmd_id))
            continue; /* untrusted: not shown rather than shown wrong */
        sp_buf_puts(&b, i ? ",{\"cmd_id\":" : "{\"cmd_id\":");
        sp_buf_json_str(&b, c->cmd_id);
        sp_buf_puts(&b, ",\"cmd\":");
        sp_buf_reset(&safe);
        sp_buf_safe_text(&safe, c->cmd, 1024);
        sp_buf_json_str(&b, safe.data ? safe.data : "");
        sp_buf_printf(&b, ",\"pid\":%" PRIu32 ",\"running\":%s", c->pid,
                      c->running ? "true" : "false");
        if (c->running) {
            sp_buf_puts(&b, ",\"exit_code\":null,\"signal\":null,\"error\":null");
        } else {
            sp_buf_printf(&b, ",\"exit_code\":%" PRId32 ",\"signal\":%" PRIu32 ",\"error\":",
                          c->exit_code, c->signal);
            sp_buf_reset(&safe);
            sp_buf_safe_text(&safe, c->error, DETAIL_MAX);
            if (safe.len)
                sp_buf_json_str(&b, safe.data);
            else
                sp_buf_puts(&b, "null");
        }
        sp_buf_printf(&b,
                      ",\"started_at_us\":%" PRId64
                      ",\"background\":%s,\"pty\":%s,\"stdin_open\":%s,\"last_seq\":%" PRIu64 "}",
                      c->started_at_us, c->background ? "true" : "false", c->pty ? "true" : "false",
                      c->stdin_open ? "true" : "false", c->last_seq);
    }
    sp_buf_puts(&b, "]}");
    gw_respond_json(rq, 200, &b);
    sp_buf_dispose(&b);
    sp_buf_dispose(&safe);
}

static void answer_refusal(ctl_t *x)
{
    const Space__Io__V1__CtlReply *r = x->reply;
    sp_buf_t detail;
    sp_buf_init(&detail);
    sp_buf_safe_text(&detail, r->detail, DETAIL_MAX);
    const char *d = detail.data ? detail.data : "";
    const char *e = r->error;
    if (strcmp(e, "not_found") == 0)
        gw_respond_error(x->rq, 404, "not_found", NULL, "%s", d);
    else if (strcmp(e, "not_running") == 0)
        gw_respond_error(x->rq, 409, "command_not_running", NULL, "%s", d);
    else if (strcmp(e, "stdin_closed") == 0)
        gw_respond_error(x->rq, 409, "stdin_closed", NULL, "%s", d);
    else if (strcmp(e, "not_a_pty") == 0)
        gw_respond_error(x->rq, 409, "not_a_pty", NULL, "%s", d);
    else if (strcmp(e, "sandbox_not_running") == 0)
        gw_respond_error(x->rq, 409, "sandbox_not_running", NULL, "%s", d);
    else if (strcmp(e, "agent_unavailable") == 0)
        gw_respond_error(x->rq, 503, "agent_unavailable", NULL, "%s", d);
    else if (strcmp(e, "bad_request") == 0)
        gw_respond_error(x->rq, 400, "invalid_request", NULL, "%s", d);
    else
        gw_respond_error(x->rq, 500, "worker_error", NULL, "the worker refused: %s", d);
    sp_buf_dispose(&detail);
}

/* ---- the jobs ---- */

/* One CtlRequest to the sandbox's worker; the reply (decoded, untrusted) in x->reply. */
static void ctl_request(ctl_t *x, op_t op)
{
    static const char *const OPS[] = {"list", "stdin", "signal", "resize"};
    Space__Io__V1__CtlRequest q = SPACE__IO__V1__CTL_REQUEST__INIT;
    char subject[160];
    uint8_t *reply = NULL;
    size_t reply_len = 0;

    if (x->reply) {
        space__io__v1__ctl_reply__free_unpacked(x->reply, NULL);
        x->reply = NULL;
    }
    q.sandbox = x->sandbox;
    q.tenant = x->tenant;
    q.op = (char *)OPS[op];
    q.cmd_id = op == OP_LIST ? "" : x->cmd_id;
    q.data = (ProtobufCBinaryData){x->data_len, x->data};
    q.eof = x->eof;
    q.signal = x->signal;
    q.rows = x->rows;
    q.cols = x->cols;
    size_t len = space__io__v1__ctl_request__get_packed_size(&q);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    space__io__v1__ctl_request__pack(&q, buf);
    x->rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_CTL, x->loc.worker, NULL, NULL);
    if (x->rc >= 0)
        x->rc =
            sp_request_send(x->rq->gw->bus, subject, buf, len, CTL_TIMEOUT_MS, &reply, &reply_len);
    explicit_bzero(buf, len);
    free(buf);
    if (x->rc == 0) {
        x->reply = reply_len <= SP_BUS_MAX_MSG
                       ? space__io__v1__ctl_reply__unpack(NULL, reply_len, reply)
                       : NULL;
        if (!x->reply)
            x->rc = -EPROTO;
    }
    free(reply);
}

static void bus_run(gw_bus_job_t *job)
{
    ctl_t *x = job->arg;
    if (x->pid && x->op != OP_LIST) {
        /* A process id names the command: the running one with it, else the newest. */
        ctl_request(x, OP_LIST);
        if (x->rc < 0 || !x->reply->ok)
            return;
        const Space__Io__V1__CommandInfo *hit = NULL;
        for (size_t i = 0; i < x->reply->n_commands; i++) {
            const Space__Io__V1__CommandInfo *c = x->reply->commands[i];
            if (c->pid == x->pid && sp_id_valid(c->cmd_id) && (!hit || c->running))
                hit = c;
        }
        if (!hit) {
            /* An ok list leaves error and detail at protobuf-c's static default, which
             * free_unpacked does not free; heap copies in their place are freed with it. */
            x->reply->ok = false;
            x->reply->error = sp_xstrdup("not_found");
            x->reply->detail = sp_xstrdup("no process with this pid");
            return;
        }
        snprintf(x->cmd_id, sizeof(x->cmd_id), "%s", hit->cmd_id);
    }
    ctl_request(x, x->op);
}

static void bus_done(gw_bus_job_t *job)
{
    ctl_t *x = job->arg;
    gw_req_t *rq = x->rq;

    if (x->rc == SP_ENOTFOUND || x->rc == SP_ETIMEOUT) {
        gw_respond_error(rq, 503, "worker_unavailable", NULL, "worker %s did not answer",
                         x->loc.worker);
    } else if (x->rc == -EPROTO) {
        gw_respond_error(rq, 500, "worker_error", NULL, "the worker's reply is unreadable");
    } else if (x->rc < 0) {
        gw_respond_error(rq, 503, "bus_unavailable", NULL, "the bus did not take the request");
    } else if (!x->reply->ok) {
        answer_refusal(x);
    } else if (x->answer) {
        x->answer(rq, x->reply, x->cmd_id);
    } else if (x->op == OP_LIST) {
        answer_list(rq, x->reply);
    } else {
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_puts(&b, "{\"cmd_id\":");
        sp_buf_json_str(&b, x->cmd_id);
        sp_buf_puts(&b, ",\"ok\":true}");
        gw_respond_json(rq, 200, &b);
        sp_buf_dispose(&b);
    }
    ctl_free(x);
}

static void lookup_run(gw_job_t *job, PGconn *db)
{
    (void)db;
    ctl_t *x = (ctl_t *)job;
    gw_sandbox_locate(job, x->sandbox, x->tenant, &x->loc);
}

static void lookup_done(gw_job_t *job)
{
    ctl_t *x = (ctl_t *)job;
    if (!gw_sandbox_loc_ok(x->rq, &x->loc) || !gw_req_live(x->rq)) {
        ctl_free(x);
        return;
    }
    x->bus.arg = x;
    x->bus.run = bus_run;
    x->bus.done = bus_done;
    gw_bus_submit(x->rq->gw, &x->rq->gw->bus_lane, &x->bus);
}

static void start(gw_req_t *rq, op_t op)
{
    if (!sp_id_valid(rq->path_id) || (op != OP_LIST && !sp_id_valid(rq->path_sub_id))) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox or command");
        return;
    }
    ctl_t *x = sp_xcalloc(1, sizeof(*x));
    x->rq = rq;
    gw_req_ref(rq);
    x->op = op;
    snprintf(x->sandbox, sizeof(x->sandbox), "%s", rq->path_id);
    snprintf(x->tenant, sizeof(x->tenant), "%s", rq->tenant);
    if (op != OP_LIST)
        snprintf(x->cmd_id, sizeof(x->cmd_id), "%s", rq->path_sub_id);
    if (op != OP_LIST && parse_body(x, rq) < 0) {
        ctl_free(x);
        return;
    }
    x->job.run = lookup_run;
    x->job.done = lookup_done;
    if (gw_job_submit(rq->gw, &x->job) < 0) {
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
        ctl_free(x);
    }
}

void gw_ctl_run(gw_req_t *rq, gw_ctl_spec_t *spec)
{
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    ctl_t *x = sp_xcalloc(1, sizeof(*x));
    x->rq = rq;
    gw_req_ref(rq);
    x->op = spec->op;
    x->pid = spec->pid;
    x->answer = spec->answer;
    snprintf(x->sandbox, sizeof(x->sandbox), "%s", rq->path_id);
    snprintf(x->tenant, sizeof(x->tenant), "%s", rq->tenant);
    snprintf(x->cmd_id, sizeof(x->cmd_id), "%s", spec->cmd_id ? spec->cmd_id : "");
    x->data = spec->data;
    x->data_len = spec->data_len;
    spec->data = NULL;
    x->eof = spec->eof;
    x->signal = spec->signal;
    x->rows = spec->rows;
    x->cols = spec->cols;
    x->job.run = lookup_run;
    x->job.done = lookup_done;
    if (gw_job_submit(rq->gw, &x->job) < 0) {
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
        ctl_free(x);
    }
}

void gw_command_list(gw_req_t *rq)
{
    start(rq, OP_LIST);
}

void gw_command_ctl(gw_req_t *rq)
{
    if (strcmp(rq->path_action, "stdin") == 0)
        start(rq, OP_STDIN);
    else if (strcmp(rq->path_action, "signal") == 0)
        start(rq, OP_SIGNAL);
    else
        start(rq, OP_RESIZE);
}
