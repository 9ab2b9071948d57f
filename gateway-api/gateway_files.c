/* The files API: /v1/sandboxes/{id}/files[...] (gateway-api/README.md, proto/dataplane.proto).
 *
 * Every route is a short conversation with the sandbox's worker on the data plane
 * (space.io.wkr.<worker>.file, FileCall -> FileReply), each call a blocking NATS request on
 * libuv's thread pool (at most file-threads at once; the rest wait in a FIFO), its answer
 * handled on the loop:
 * - stat, list, mkdir, move, remove: one call, one JSON answer. An operation the agent takes
 *   long over (a recursive remove of many files) is answered `pending` by the worker within
 *   its file-call-ms; the gateway asks again (WAIT) until the answer comes, so no request
 *   outlasts CALL_TIMEOUT however long the operation is (the worker bounds that);
 * - upload (PUT): per file, WRITE_OPEN, then WRITE calls of at most CHUNK bytes taken straight
 *   from the request body, then COMMIT, which answers with the size and SHA-256 the worker
 *   computed. A raw body is one file at ?path=; a multipart/form-data body holds one or more
 *   file parts written to ?path=/<filename>;
 * - download (GET): READ_OPEN gives the size (Content-Length), then READ calls of CHUNK bytes,
 *   one fetched ahead while h2o writes the previous one (pull: h2o's proceed asks for more),
 *   then CLOSE. A client that goes away stops the fetching; the worker's transfer is closed.
 *
 * Memory: h2o 2.2 reads the whole request body before the handler runs. gw_files_init makes
 * socket buffers over SPILL_BYTES live in an unlinked temporary file under tmp-dir, mapped
 * MAP_SHARED: a large body is file-backed pages, not heap. While the body is sent on, the
 * pages already sent are dropped from the process (MADV_DONTNEED on page-aligned consumed
 * ranges; the file keeps the bytes), so the resident set does not hold the whole body twice
 * over. A download holds at most two chunks per request.
 *
 * The tenant check is the commands route's: the sandbox must be the key's tenant's and
 * running; its worker comes from the projection. */
#include "contract.h"
#include "request.h"
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "db.h"
#include "error.h"
#include "fspath.h"
#include "ids.h"
#include "log.h"
#include "text.h"
#include "xmalloc.h"

#define CHUNK         (256 * 1024) /* data bytes of one WRITE or READ call */
#define CALL_TIMEOUT  35000        /* ms; the worker answers within its file-call-ms (<= 25 s) */
#define REPLY_MAX     (CHUNK + 1024 * 1024)
#define SPILL_BYTES   (4u << 20)
#define SCAN_WINDOW   (8u << 20)
#define PARTS_MAX     64
#define PART_HEAD_MAX 8192
#define BOUNDARY_MAX  70 /* RFC 2046 section 5.1.1 */
#define DEPTH_MAX     16

typedef gw_fop_t kind_t;
#define K_STAT     GW_FOP_STAT
#define K_LIST     GW_FOP_LIST
#define K_MKDIR    GW_FOP_MKDIR
#define K_MOVE     GW_FOP_MOVE
#define K_REMOVE   GW_FOP_REMOVE
#define K_UPLOAD   GW_FOP_UPLOAD
#define K_DOWNLOAD GW_FOP_DOWNLOAD

typedef struct {
    const uint8_t *p;
    size_t len;
    char path[SP_FSPATH_MAX + 1];
} part_t;

typedef Space__Io__V1__FileCall call_t;
typedef Space__Io__V1__FileReply reply_t;

struct gw_file {
    h2o_generator_t gen; /* first member: h2o hands it back to proceed and stop */
    gw_t *gw;
    gw_req_t *rq;   /* holds a reference */
    h2o_req_t *req; /* NULL once h2o disposed the request */
    kind_t kind;
    uint32_t mode;
    uint32_t depth;
    bool recursive;
    char user[8];
    char sandbox[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char worker[SP_ID_MAX + 1];
    char request_id[GW_REQUEST_ID_MAX + 1];
    char path[SP_FSPATH_MAX + 1];
    char to[SP_FSPATH_MAX + 1];

    /* The one call in flight. The loop fills call (strings owned here, data borrowed from the
     * body), the pool thread packs and sends it and stores the answer. */
    gw_bus_job_t job;
    void (*job_done)(gw_file_t *f);
    call_t call;
    reply_t *reply;
    int job_rc;

    bool job_busy;
    bool answered;    /* the response is complete or started (download) */
    bool closing;     /* the transfer's CLOSE is on its way */
    bool body_mapped; /* the body is in a file-backed h2o buffer: consumed pages may go */
    bool multipart;
    bool restat;               /* E2B move: the stat of the destination is under way */
    bool h2o_busy, final_sent; /* download */
    uint64_t xfer;             /* an open worker transfer, 0 = none */

    /* upload */
    part_t *parts;
    size_t n_parts, part_i;
    uint64_t offset;
    const uint8_t *body;
    size_t body_len;
    uint8_t *owned_body; /* a body decoded by the caller (E2B gzip), else NULL */
    uintptr_t advised;
    sp_buf_t results;

    /* download */
    uint64_t size, fetch_off, sent_off;
    uint8_t *sending, *ready;
    size_t ready_len;

    gw_file_t *prev, *next;
};

static void close_xfer(gw_file_t *f);

/* ---- lifetime ---- */

static void file_free(gw_file_t *f)
{
    gw_t *gw = f->gw;
    if (f->prev)
        f->prev->next = f->next;
    else
        gw->files = f->next;
    if (f->next)
        f->next->prev = f->prev;
    gw->n_files--;
    if (f->reply)
        space__io__v1__file_reply__free_unpacked(f->reply, NULL);
    free(f->parts);
    free(f->owned_body);
    free(f->sending);
    free(f->ready);
    sp_buf_dispose(&f->results);
    gw_req_unref(f->rq);
    free(f);
}

/* Frees once h2o is done with the request and no call is in flight; an open transfer is
 * closed first. */
static void maybe_free(gw_file_t *f)
{
    if (f->req || f->job_busy)
        return;
    if (f->xfer && !f->closing) {
        close_xfer(f);
        return;
    }
    if (!f->xfer)
        file_free(f);
}

static void on_pool_gone(void *p)
{
    gw_file_t *f = *(gw_file_t **)p;
    f->req = NULL;
    maybe_free(f);
}

/* ---- calls ---- */

static void job_work(gw_bus_job_t *job)
{
    gw_file_t *f = job->arg;
    char subject[128];
    uint8_t *rep = NULL;
    size_t rep_len = 0;
    size_t len = space__io__v1__file_call__get_packed_size(&f->call);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    space__io__v1__file_call__pack(&f->call, buf);
    f->job_rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_FILE, f->worker, NULL, NULL);
    if (f->job_rc >= 0)
        f->job_rc = sp_request_send(f->gw->bus, subject, buf, len, CALL_TIMEOUT, &rep, &rep_len);
    free(buf);
    if (f->job_rc < 0)
        return;
    /* The reply is untrusted: size first, then decode. */
    f->reply = rep_len <= REPLY_MAX ? space__io__v1__file_reply__unpack(NULL, rep_len, rep) : NULL;
    if (!f->reply)
        f->job_rc = SP_EDECODE;
    free(rep);
}

static void job_after(gw_bus_job_t *job)
{
    gw_file_t *f = job->arg;
    f->job_busy = false;
    f->job_done(f);
}

/* Sends f->call (op and its fields set by the caller); done runs on the loop with f->job_rc
 * and f->reply. */
static void call(gw_file_t *f, Space__Io__V1__FileCallOp op, void (*done)(gw_file_t *))
{
    gw_t *gw = f->gw;
    if (f->reply) {
        space__io__v1__file_reply__free_unpacked(f->reply, NULL);
        f->reply = NULL;
    }
    f->call.sandbox = f->sandbox;
    f->call.tenant = f->tenant;
    f->call.correlation_id = f->request_id;
    f->call.user = f->user;
    f->call.op = op;
    f->job_rc = 0;
    f->job_done = done;
    f->job_busy = true;
    f->job.arg = f;
    f->job.run = job_work;
    f->job.done = job_after;
    gw_bus_submit(gw, &gw->file_lane, &f->job);
}

static void closed(gw_file_t *f)
{
    f->xfer = 0;
    maybe_free(f);
}

/* Ends the worker's transfer (best effort: the worker's idle timeout is the backstop). */
static void close_xfer(gw_file_t *f)
{
    if (!f->xfer || f->closing || f->job_busy)
        return;
    f->closing = true;
    f->call.xfer = f->xfer;
    f->call.data = (ProtobufCBinaryData){0, NULL};
    call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_CLOSE, closed);
}

/* ---- answers ---- */

/* A failed call as an HTTP error (when the response has not started). */
static void respond_failure(gw_file_t *f)
{
    gw_req_t *rq = f->rq;
    f->answered = true;
    if (f->job_rc == SP_ENOTFOUND || f->job_rc == SP_ETIMEOUT) {
        gw_respond_error(rq, 503, "worker_unavailable", NULL, "worker %s did not answer (%s)",
                         f->worker, sp_strerror(f->job_rc));
        return;
    }
    if (f->job_rc < 0) {
        gw_respond_error(rq, 503, "bus_unavailable", NULL, "the data plane failed: %s",
                         sp_strerror(f->job_rc));
        return;
    }
    const char *e = f->reply->error;
    const char *d = f->reply->detail;
    static const struct {
        const char *error;
        int status;
    } map[] = {{"not_found", 404},
               {"exists", 409},
               {"is_directory", 409},
               {"not_directory", 409},
               {"not_empty", 409},
               {"permission", 403},
               {"bad_path", 400},
               {"no_space", 507},
               {"io", 500},
               {"agent_unavailable", 503},
               {"agent_error", 502},
               {"too_many_transfers", 429},
               {"sandbox_not_running", 409},
               {"bus_unavailable", 503}};
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        if (strcmp(e, map[i].error) == 0) {
            gw_respond_error(rq, map[i].status, map[i].error, NULL, "%s", d);
            return;
        }
    }
    sp_log(SP_LOG_WARN, "worker refused a file call", SP_KS("worker", f->worker), SP_KS("error", e),
           SP_KS("detail", d), SP_KS("request_id", f->request_id));
    gw_respond_error(rq, 500, "worker_error", NULL, "the worker refused: %s", d);
}

static bool call_ok(const gw_file_t *f)
{
    return f->job_rc == 0 && f->reply && f->reply->ok;
}

static void json_mode(sp_buf_t *b, uint32_t mode)
{
    sp_buf_printf(b, "\"0%03o\"", mode & 07777);
}

/* Text from the guest (a file name may be any bytes): safe UTF-8 in a JSON string. */
static void json_guest_str(sp_buf_t *b, const char *s)
{
    sp_buf_t safe;
    sp_buf_init(&safe);
    sp_buf_safe_text(&safe, s, SP_FSPATH_MAX * 4);
    sp_buf_json_str(b, safe.data ? safe.data : "");
    sp_buf_dispose(&safe);
}

static void json_info(sp_buf_t *b, const Space__Io__V1__FileInfo *in)
{
    sp_buf_puts(b, "{\"path\":");
    json_guest_str(b, in->path);
    sp_buf_puts(b, ",\"type\":");
    json_guest_str(b, in->type);
    sp_buf_printf(b, ",\"size\":%" PRIu64 ",\"mode\":", in->size);
    json_mode(b, in->mode);
    sp_buf_puts(b, ",\"mtime\":");
    gw_json_time(b, in->mtime_us);
    sp_buf_printf(b, ",\"uid\":%u,\"gid\":%u", in->uid, in->gid);
    if (in->target[0]) {
        sp_buf_puts(b, ",\"target\":");
        json_guest_str(b, in->target);
    }
    sp_buf_putc(b, '}');
}

/* ---- single calls: stat, list, mkdir, move, remove ---- */

static void single_done(gw_file_t *f)
{
    sp_buf_t b;
    if (call_ok(f) && f->reply->pending) {
        /* Not done yet: ask again, unless the client is gone (the worker still records the
         * operation's event when the agent finishes). */
        if (!f->req) {
            maybe_free(f);
            return;
        }
        f->call.xfer = f->reply->xfer;
        call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WAIT, single_done);
        return;
    }
    if (!call_ok(f) && f->rq->dialect != GW_DIALECT_V1 && f->kind == K_REMOVE && f->job_rc == 0 &&
        f->reply && strcmp(f->reply->error, "not_found") == 0) {
        /* envd removes with os.RemoveAll: a missing path is success. */
        f->answered = true;
        gw_respond(f->rq, 200, "application/json", "{}", 2);
        maybe_free(f);
        return;
    }
    if (!call_ok(f)) {
        respond_failure(f);
        maybe_free(f);
        return;
    }
    const reply_t *r = f->reply;
    if (f->rq->dialect != GW_DIALECT_V1 && f->kind == K_MOVE && !f->restat &&
        (!r->info || !r->info->type[0])) {
        /* E2B answers a move with the entry where it landed: one stat more. */
        f->restat = true;
        f->call.path = f->to;
        call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_STAT, single_done);
        return;
    }
    if (f->rq->dialect != GW_DIALECT_V1) {
        f->answered = true;
        gw_e2b_files_answer(f->rq, f->kind, r, f->path, f->to);
        maybe_free(f);
        return;
    }
    sp_buf_init(&b);
    int status = 200;
    switch (f->kind) {
    case K_STAT:
        if (r->info)
            json_info(&b, r->info);
        else
            sp_buf_puts(&b, "{}");
        break;
    case K_LIST:
        sp_buf_puts(&b, "{\"path\":");
        sp_buf_json_str(&b, f->path);
        sp_buf_puts(&b, ",\"entries\":[");
        for (size_t i = 0; i < r->n_entries; i++) {
            if (i)
                sp_buf_putc(&b, ',');
            json_info(&b, r->entries[i]);
        }
        sp_buf_printf(&b, "],\"truncated\":%s}", r->truncated ? "true" : "false");
        break;
    case K_MKDIR:
        status = r->existed ? 200 : 201;
        sp_buf_puts(&b, "{\"path\":");
        sp_buf_json_str(&b, f->path);
        sp_buf_printf(&b, ",\"created\":%s}", r->existed ? "false" : "true");
        break;
    case K_MOVE:
        sp_buf_puts(&b, "{\"from\":");
        sp_buf_json_str(&b, f->path);
        sp_buf_puts(&b, ",\"to\":");
        sp_buf_json_str(&b, f->to);
        sp_buf_putc(&b, '}');
        break;
    default: /* remove */
        f->answered = true;
        gw_respond(f->rq, 204, "application/json", "", 0);
        sp_buf_dispose(&b);
        maybe_free(f);
        return;
    }
    f->answered = true;
    gw_respond_json(f->rq, status, &b);
    sp_buf_dispose(&b);
    maybe_free(f);
}

/* ---- upload ---- */

/* Drops the body's pages below end from the process (they are in the spill file). */
static void advise_consumed(gw_file_t *f, const uint8_t *end)
{
    if (!f->body_mapped)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)f->body + page - 1) & ~(page - 1);
    if (f->advised > lo)
        lo = f->advised;
    uintptr_t hi = (uintptr_t)end & ~(page - 1);
    if (hi <= lo)
        return;
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    f->advised = hi;
}

static void upload_next(gw_file_t *f);

static void upload_failed(gw_file_t *f)
{
    respond_failure(f);
    maybe_free(f); /* closes the transfer first, if one is open */
}

static void upload_committed(gw_file_t *f)
{
    part_t *p = &f->parts[f->part_i];
    const reply_t *r = f->reply;
    f->xfer = 0; /* committed: nothing left open */
    if (!call_ok(f)) {
        upload_failed(f);
        return;
    }
    char hex[SP_SHA256_HEX_LEN + 1] = "";
    if (r->sha256.len == SP_SHA256_LEN)
        sp_hex_encode(r->sha256.data, SP_SHA256_LEN, hex);
    if (f->results.len)
        sp_buf_putc(&f->results, ',');
    sp_buf_puts(&f->results, "{\"path\":");
    sp_buf_json_str(&f->results, p->path);
    sp_buf_printf(&f->results, ",\"size\":%" PRIu64 ",\"sha256\":\"%s\"}", r->size, hex);
    f->part_i++;
    upload_next(f);
}

static void upload_write(gw_file_t *f);

static void upload_written(gw_file_t *f)
{
    part_t *p = &f->parts[f->part_i];
    if (!call_ok(f)) {
        upload_failed(f);
        return;
    }
    f->offset += f->call.data.len;
    advise_consumed(f, p->p + f->offset);
    upload_write(f);
}

static void upload_write(gw_file_t *f)
{
    part_t *p = &f->parts[f->part_i];
    if (!f->req) { /* the client is gone (shutdown): stop here */
        maybe_free(f);
        return;
    }
    f->call.xfer = f->xfer;
    if (f->offset == p->len) {
        f->call.data = (ProtobufCBinaryData){0, NULL};
        call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_COMMIT, upload_committed);
        return;
    }
    size_t n = p->len - f->offset < CHUNK ? p->len - f->offset : CHUNK;
    f->call.offset = f->offset;
    f->call.data = (ProtobufCBinaryData){n, (uint8_t *)p->p + f->offset};
    call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE, upload_written);
}

static void upload_opened(gw_file_t *f)
{
    if (!call_ok(f)) {
        upload_failed(f);
        return;
    }
    f->xfer = f->reply->xfer;
    f->offset = 0;
    upload_write(f);
}

static void upload_next(gw_file_t *f)
{
    if (f->part_i == f->n_parts) {
        sp_buf_t b;
        sp_buf_init(&b);
        if (f->rq->dialect != GW_DIALECT_V1) {
            const char **paths = sp_xcalloc(f->n_parts, sizeof(*paths));
            for (size_t i = 0; i < f->n_parts; i++)
                paths[i] = f->parts[i].path;
            f->answered = true;
            gw_e2b_upload_answer(f->rq, paths, f->n_parts);
            free(paths);
            sp_buf_dispose(&b);
            maybe_free(f);
            return;
        }
        if (f->multipart)
            sp_buf_printf(&b, "{\"files\":[%s]}", f->results.data ? f->results.data : "");
        else
            sp_buf_append(&b, f->results.data, f->results.len);
        f->answered = true;
        gw_respond_json(f->rq, 200, &b);
        sp_buf_dispose(&b);
        maybe_free(f);
        return;
    }
    if (!f->req) {
        maybe_free(f);
        return;
    }
    part_t *p = &f->parts[f->part_i];
    f->call.path = p->path;
    f->call.mode = f->mode;
    call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE_OPEN, upload_opened);
}

/* ---- download ---- */

static void download_pump(gw_file_t *f);

static void download_abort(gw_file_t *f, const char *why)
{
    sp_log(SP_LOG_WARN, "download cut short", SP_KS("sandbox", f->sandbox), SP_KS("path", f->path),
           SP_KS("why", why), SP_KS("request_id", f->request_id));
    if (f->req) {
        int fd = gw_req_fd(f->req);
        if (fd >= 0)
            shutdown(fd, SHUT_RDWR); /* Content-Length cannot be kept: the client must see it */
    }
}

static void download_fetched(gw_file_t *f)
{
    if (!f->req) {
        maybe_free(f);
        return;
    }
    if (!call_ok(f)) {
        download_abort(f, f->job_rc < 0 ? sp_strerror(f->job_rc) : f->reply->error);
        maybe_free(f);
        return;
    }
    const reply_t *r = f->reply;
    uint64_t want = f->size - f->fetch_off < CHUNK ? f->size - f->fetch_off : CHUNK;
    if (r->data.len != want) {
        download_abort(f, "the file changed size while being read");
        maybe_free(f);
        return;
    }
    f->ready = sp_xmalloc(r->data.len);
    memcpy(f->ready, r->data.data, r->data.len);
    f->ready_len = r->data.len;
    f->fetch_off += r->data.len;
    download_pump(f);
}

static void download_fetch(gw_file_t *f)
{
    uint64_t want = f->size - f->fetch_off < CHUNK ? f->size - f->fetch_off : CHUNK;
    f->call.xfer = f->xfer;
    f->call.offset = f->fetch_off;
    f->call.length = (uint32_t)want;
    call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ, download_fetched);
}

/* Hands a ready chunk to h2o when it is not writing, and keeps one fetch ahead. */
static void download_pump(gw_file_t *f)
{
    if (!f->req)
        return;
    if (!f->h2o_busy && f->ready) {
        free(f->sending);
        f->sending = f->ready;
        h2o_iovec_t buf = h2o_iovec_init(f->sending, f->ready_len);
        f->sent_off += f->ready_len;
        f->ready = NULL;
        f->ready_len = 0;
        f->final_sent = f->sent_off == f->size;
        f->h2o_busy = true;
        h2o_send(f->req, &buf, 1,
                 f->final_sent ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
        if (f->final_sent) {
            gw_metrics_request(&f->gw->metrics, f->rq->route, 200);
            gw_log_request(f->rq, 200);
        }
    }
    if (f->final_sent) {
        close_xfer(f);
        return;
    }
    if (!f->job_busy && !f->ready && f->fetch_off < f->size)
        download_fetch(f);
}

static void on_proceed(h2o_generator_t *g, h2o_req_t *req)
{
    gw_file_t *f = (gw_file_t *)g;
    (void)req;
    f->h2o_busy = false;
    download_pump(f);
}

static void on_stop(h2o_generator_t *g, h2o_req_t *req)
{
    gw_file_t *f = (gw_file_t *)g;
    (void)req;
    /* The client is gone; the pool's dispose follows and frees what is left. */
    f->h2o_busy = false;
}

static void download_opened(gw_file_t *f)
{
    if (!call_ok(f)) {
        respond_failure(f);
        maybe_free(f);
        return;
    }
    f->xfer = f->reply->xfer;
    f->size = f->reply->info ? f->reply->info->size : 0;
    if (!gw_req_live(f->rq)) {
        maybe_free(f);
        return;
    }
    h2o_req_t *req = f->req;
    f->answered = true;
    req->res.status = 200;
    req->res.reason = "OK";
    req->res.content_length = f->size;
    gw_add_common_headers(f->rq, "application/octet-stream");
    f->gen.proceed = on_proceed;
    f->gen.stop = on_stop;
    h2o_start_response(req, &f->gen);
    gw_req_mark_streaming(f->rq);
    if (f->size == 0) {
        f->final_sent = true;
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
        gw_metrics_request(&f->gw->metrics, f->rq->route, 200);
        gw_log_request(f->rq, 200);
        close_xfer(f);
        return;
    }
    download_fetch(f);
}

/* ---- the sandbox ---- */

typedef struct {
    gw_job_t job;
    gw_file_t *f;
    gw_sandbox_loc_t loc;
} lookup_job_t;

static void lookup_run(gw_job_t *job, PGconn *db)
{
    (void)db;
    lookup_job_t *l = (lookup_job_t *)job;
    gw_sandbox_locate(job, l->f->sandbox, l->f->tenant, &l->loc);
}

static void lookup_done(gw_job_t *job)
{
    lookup_job_t *l = (lookup_job_t *)job;
    gw_file_t *f = l->f;
    gw_req_t *rq = f->rq;

    f->job_busy = false;
    if (f->gw->stopping) {
        gw_respond_error(rq, 503, "shutting_down", NULL, "the gateway is stopping");
    } else if (l->loc.failed) {
        gw_respond_error(rq, 503, "unavailable", NULL, "the database is not available; retry");
    } else if (!l->loc.found) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
    } else if (strcmp(l->loc.state, "running") != 0) {
        sp_buf_t extra;
        sp_buf_init(&extra);
        sp_buf_puts(&extra, "\"state\":");
        sp_buf_json_str(&extra, l->loc.state);
        gw_respond_error(rq, 409, "sandbox_not_running", extra.data,
                         "the sandbox is %s; files are reached only in a running sandbox",
                         l->loc.state);
        sp_buf_dispose(&extra);
    } else if (!sp_id_valid(l->loc.worker)) {
        gw_respond_error(rq, 503, "worker_unavailable", NULL, "the sandbox has no worker");
    } else if (!f->req) {
        /* gone meanwhile */
    } else {
        snprintf(f->worker, sizeof(f->worker), "%s", l->loc.worker);
        free(l);
        f->call.path = f->path;
        f->call.to = f->to;
        f->call.mode = f->mode;
        f->call.recursive = f->recursive;
        f->call.depth = f->depth;
        switch (f->kind) {
        case K_STAT:
            call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_STAT, single_done);
            break;
        case K_LIST:
            call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_LIST, single_done);
            break;
        case K_MKDIR:
            call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MKDIR, single_done);
            break;
        case K_MOVE:
            call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MOVE, single_done);
            break;
        case K_REMOVE:
            call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_REMOVE, single_done);
            break;
        case K_UPLOAD:
            upload_next(f);
            break;
        default:
            call(f, SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ_OPEN, download_opened);
            break;
        }
        return;
    }
    free(l);
    f->answered = true;
    maybe_free(f);
}

/* ---- parsing the request ---- */

/* Resolves a client path for user into out; a 400 on failure. */
static bool resolve(gw_req_t *rq, const char *what, const char *path, const char *user,
                    char out[SP_FSPATH_MAX + 1])
{
    int rc = sp_fspath_resolve(path, sp_fspath_home(user), out);
    if (rc == -ENAMETOOLONG) {
        gw_respond_error(rq, 400, "bad_path", NULL, "%s: longer than %d bytes", what,
                         SP_FSPATH_MAX);
        return false;
    }
    if (rc < 0) {
        gw_respond_error(rq, 400, "bad_path", NULL,
                         "%s: a non-empty absolute or home-relative path of UTF-8 text", what);
        return false;
    }
    return true;
}

/* "boundary" of a multipart/form-data Content-Type, or NULL (then the type is not it). *bad
 * when it is multipart but without a usable boundary. */
static bool multipart_boundary(const h2o_iovec_t *ct, char out[BOUNDARY_MAX + 1], bool *bad)
{
    static const char mp[] = "multipart/form-data";
    *bad = false;
    if (!ct || ct->len < sizeof(mp) - 1 || strncasecmp(ct->base, mp, sizeof(mp) - 1) != 0)
        return false;
    *bad = true;
    const char *p = ct->base + sizeof(mp) - 1, *end = ct->base + ct->len;
    while (p < end) {
        while (p < end && (*p == ';' || *p == ' ' || *p == '\t'))
            p++;
        if ((size_t)(end - p) > 9 && strncasecmp(p, "boundary=", 9) == 0) {
            p += 9;
            bool quoted = p < end && *p == '"';
            p += quoted;
            size_t n = 0;
            while (p + n < end && (quoted ? p[n] != '"' : (p[n] != ';' && p[n] != ' ')))
                n++;
            if (n == 0 || n > BOUNDARY_MAX || (quoted && p + n >= end))
                return true;
            memcpy(out, p, n);
            out[n] = '\0';
            *bad = false;
            return true;
        }
        while (p < end && *p != ';')
            p++;
    }
    return true;
}

/* memmem in windows, dropping the scanned pages of a file-backed body behind the window. */
static const uint8_t *scan(gw_file_t *f, const uint8_t *p, const uint8_t *end, const char *needle,
                           size_t n)
{
    while (p < end) {
        size_t left = (size_t)(end - p);
        size_t span = left < SCAN_WINDOW + n ? left : SCAN_WINDOW + n;
        const uint8_t *q = memmem(p, span, needle, n);
        if (q || span == left)
            return q;
        p += SCAN_WINDOW;
        advise_consumed(f, p);
    }
    return NULL;
}

/* The value of a parameter (filename="...", name="...") in a Content-Disposition; strict:
 * a quoted string without escapes. */
static bool disposition_param(const char *line, size_t len, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i + nl + 2 < len; i++) {
        if ((i == 0 || line[i - 1] == ' ' || line[i - 1] == ';') &&
            strncasecmp(line + i, name, nl) == 0 && line[i + nl] == '=' &&
            line[i + nl + 1] == '"') {
            const char *v = line + i + nl + 2;
            const char *q = memchr(v, '"', len - (size_t)(v - line));
            if (!q || (size_t)(q - v) >= cap || memchr(v, '\\', (size_t)(q - v)))
                return false;
            memcpy(out, v, (size_t)(q - v));
            out[q - v] = '\0';
            return true;
        }
    }
    return false;
}

/* Splits a multipart/form-data body (RFC 7578) into file parts under dir. Strict: the body
 * starts with the first delimiter; each part has a Content-Disposition form-data with a
 * filename that is a plain name (no '/', not "." or ".."), at most a Content-Type besides;
 * the close delimiter ends it. 0, or -EINVAL with the message in err. */
static int multipart_parse(gw_file_t *f, const char *boundary, const char *dir, bool name_is_path,
                           char *err, size_t errlen)
{
    char delim[BOUNDARY_MAX + 5];
    int dn = snprintf(delim, sizeof(delim), "\r\n--%s", boundary);
    const uint8_t *p = f->body, *end = f->body + f->body_len;
    /* The first delimiter has no CRLF before it. */
    if (f->body_len < (size_t)dn || memcmp(p, delim + 2, (size_t)dn - 2) != 0) {
        snprintf(err, errlen, "the body does not start with the boundary");
        return -EINVAL;
    }
    p += dn - 2;
    f->parts = sp_xcalloc(PARTS_MAX, sizeof(*f->parts));
    for (;;) {
        if (end - p >= 2 && p[0] == '-' && p[1] == '-')
            break; /* the close delimiter: an epilogue, if any, is ignored */
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n') {
            snprintf(err, errlen, "malformed delimiter line");
            return -EINVAL;
        }
        p += 2;
        if (f->n_parts == PARTS_MAX) {
            snprintf(err, errlen, "more than %d parts", PARTS_MAX);
            return -EINVAL;
        }
        size_t hspan = (size_t)(end - p) < PART_HEAD_MAX ? (size_t)(end - p) : PART_HEAD_MAX;
        const uint8_t *hend = memmem(p, hspan, "\r\n\r\n", 4);
        if (!hend) {
            snprintf(err, errlen, "part %zu: headers missing or over %d bytes", f->n_parts + 1,
                     PART_HEAD_MAX);
            return -EINVAL;
        }
        char filename[SP_FSPATH_MAX + 1] = "";
        bool have_cd = false;
        for (const uint8_t *line = p; line < hend + 2;) {
            const uint8_t *eol = memmem(line, (size_t)(hend + 2 - line), "\r\n", 2);
            size_t ll = (size_t)(eol - line);
            const char *l = (const char *)line;
            if (ll > 20 && strncasecmp(l, "content-disposition:", 20) == 0) {
                const char *v = l + 20;
                size_t vl = ll - 20;
                while (vl && *v == ' ') {
                    v++;
                    vl--;
                }
                if (have_cd || vl < 9 || strncasecmp(v, "form-data", 9) != 0 ||
                    !disposition_param(v, vl, "filename", filename, sizeof(filename))) {
                    snprintf(err, errlen,
                             "part %zu: want one Content-Disposition: form-data "
                             "with a filename",
                             f->n_parts + 1);
                    return -EINVAL;
                }
                have_cd = true;
            } else if (!(ll > 13 && strncasecmp(l, "content-type:", 13) == 0)) {
                snprintf(err, errlen, "part %zu: unexpected header", f->n_parts + 1);
                return -EINVAL;
            }
            line = eol + 2;
        }
        part_t *part = &f->parts[f->n_parts];
        char joined[SP_FSPATH_MAX + 300];
        if (name_is_path) {
            /* E2B: the filename is the destination, absolute or relative to the user's home;
             * a single part goes to ?path= when that is given (dir). */
            if (!have_cd || !filename[0] || !sp_text_valid(filename, sizeof(filename), 0)) {
                snprintf(err, errlen, "part %zu: the filename must be a path", f->n_parts + 1);
                return -EINVAL;
            }
            snprintf(joined, sizeof(joined), "%s", filename);
        } else {
            if (!have_cd || !filename[0] || strchr(filename, '/') || strcmp(filename, ".") == 0 ||
                strcmp(filename, "..") == 0 || !sp_text_valid(filename, sizeof(filename), 0)) {
                snprintf(err, errlen, "part %zu: the filename must be a plain file name",
                         f->n_parts + 1);
                return -EINVAL;
            }
            snprintf(joined, sizeof(joined), "%s/%s", dir, filename);
        }
        if (sp_fspath_resolve(joined, name_is_path ? sp_fspath_home(f->user) : "/", part->path) <
            0) {
            snprintf(err, errlen, "part %zu: the path is too long", f->n_parts + 1);
            return -EINVAL;
        }
        part->p = hend + 4;
        const uint8_t *next = scan(f, part->p, end, delim, (size_t)dn);
        if (!next) {
            snprintf(err, errlen, "part %zu: no closing boundary", f->n_parts + 1);
            return -EINVAL;
        }
        part->len = (size_t)(next - part->p);
        f->n_parts++;
        p = next + dn;
    }
    if (f->n_parts == 0) {
        snprintf(err, errlen, "no file part");
        return -EINVAL;
    }
    if (name_is_path && dir && f->n_parts == 1)
        snprintf(f->parts[0].path, sizeof(f->parts[0].path), "%s", dir);
    return 0;
}

/* Whether the body is in h2o's file-backed socket buffer (then its consumed pages may be
 * dropped). Reaches into h2o_buffer_t's _fd, which h2o 2.2 sets for a mapped buffer. */
static bool body_is_mapped(h2o_req_t *req)
{
    if (!req->entity.base || !req->conn || !req->conn->callbacks->get_socket)
        return false;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    h2o_buffer_t *in = sock ? sock->input : NULL;
    return in && in->_fd >= 0 && req->entity.base >= in->bytes &&
           req->entity.base + req->entity.len <= in->bytes + in->size;
}

static bool parse_bool(const char *v, bool *out)
{
    if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
        *out = true;
    else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
        *out = false;
    else
        return false;
    return true;
}

/* Octal permission bits: 1..4 octal digits (e.g. 644, 0755). */
static bool parse_mode(const char *v, uint32_t *out)
{
    size_t n = strlen(v);
    uint32_t m = 0;
    if (n == 0 || n > 5)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '7')
            return false;
        m = m * 8 + (uint32_t)(v[i] - '0');
    }
    if (m > 07777)
        return false;
    *out = m;
    return true;
}

void gw_files_run(gw_req_t *rq, gw_files_sub_t sub)
{
    gw_t *gw = rq->gw;
    h2o_req_t *req = rq->req;
    gw_query_t q;
    const char *qpath = NULL, *quser = NULL;
    bool recursive = false;
    uint32_t mode = 0, depth = 1;
    kind_t kind;
    bool is_get = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET"));
    bool is_put = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("PUT"));

    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        return;
    }
    switch (sub) {
    case GW_FILES_STAT:
        kind = K_STAT;
        break;
    case GW_FILES_LIST:
        kind = K_LIST;
        break;
    case GW_FILES_MKDIR:
        kind = K_MKDIR;
        break;
    case GW_FILES_MOVE:
        kind = K_MOVE;
        break;
    default:
        kind = is_get ? K_DOWNLOAD : is_put ? K_UPLOAD : K_REMOVE;
        break;
    }
    size_t body_len = req->entity.base ? req->entity.len : 0;
    if (kind != K_UPLOAD && body_len > (size_t)gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)gw->cfg->max_body_bytes);
        return;
    }
    if (gw_query_parse(req, &q) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "malformed query string");
        return;
    }
    for (size_t i = 0; i < q.n; i++) {
        const char *k = q.p[i].key, *v = q.p[i].value;
        bool ok = true;
        if (strcmp(k, "path") == 0 && !qpath)
            qpath = v;
        else if (strcmp(k, "user") == 0 && !quser)
            quser = v;
        else if (strcmp(k, "mode") == 0 && kind == K_UPLOAD)
            ok = parse_mode(v, &mode);
        else if (strcmp(k, "recursive") == 0 && kind == K_REMOVE)
            ok = parse_bool(v, &recursive);
        else if (strcmp(k, "depth") == 0 && kind == K_LIST) {
            char *e = NULL;
            long d = strtol(v, &e, 10);
            ok = v[0] >= '1' && v[0] <= '9' && *e == '\0' && d >= 1 && d <= DEPTH_MAX;
            depth = (uint32_t)d;
        } else {
            gw_respond_error(rq, 400, "invalid_query", NULL, "unexpected query parameter %.64s", k);
            return;
        }
        if (!ok) {
            gw_respond_error(rq, 400, "invalid_query", NULL, "bad value for %.64s", k);
            return;
        }
    }

    /* mkdir and move take a JSON body instead of the query. */
    sp_json_doc_t *doc = NULL;
    const char *from = NULL, *to = NULL;
    if (kind == K_MKDIR || kind == K_MOVE) {
        const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
        char jerr[SP_JSON_ERR_MAX];
        if (ct && !gw_json_content_type(ct)) {
            gw_respond_error(rq, 415, "unsupported_media_type", NULL,
                             "send the body as application/json");
            return;
        }
        sp_json_limits_t lim = {.max_bytes = 64 * 1024,
                                .max_depth = 2,
                                .max_nodes = 16,
                                .max_string = SP_FSPATH_MAX * 2};
        if (sp_json_parse(req->entity.base ? req->entity.base : "", body_len, &lim, &doc, jerr) <
            0) {
            gw_respond_error(rq, 400, "invalid_json", NULL, "%s", jerr);
            return;
        }
        const sp_json_t *root = sp_json_root(doc);
        const char *bad = NULL;
        if (sp_json_type(root) != SP_JSON_OBJECT)
            bad = "the body must be an object";
        for (size_t i = 0; !bad && i < sp_json_len(root); i++) {
            const char *k = sp_json_key_at(root, i);
            const sp_json_t *v = sp_json_at(root, i);
            bool known = strcmp(k, "user") == 0 ||
                         (kind == K_MKDIR ? strcmp(k, "path") == 0
                                          : strcmp(k, "from") == 0 || strcmp(k, "to") == 0);
            if (!known)
                bad = "unknown field";
            else if (sp_json_type(v) != SP_JSON_STRING)
                bad = "fields are strings";
        }
        if (bad) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "%s", bad);
            sp_json_doc_free(doc);
            return;
        }
        quser = sp_json_str(sp_json_get(root, "user"), NULL);
        if (kind == K_MKDIR) {
            qpath = sp_json_str(sp_json_get(root, "path"), NULL);
        } else {
            from = sp_json_str(sp_json_get(root, "from"), NULL);
            to = sp_json_str(sp_json_get(root, "to"), NULL);
            qpath = from;
            if (!from || !to) {
                gw_respond_error(rq, 400, "missing_field", NULL, "from and to are required");
                sp_json_doc_free(doc);
                return;
            }
        }
    }
    if (!qpath) {
        gw_respond_error(rq, 400, "missing_field", NULL, "path is required");
        sp_json_doc_free(doc);
        return;
    }
    if (quser && !sp_fspath_home(quser)) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "user must be root or user");
        sp_json_doc_free(doc);
        return;
    }
    gw_files_spec_t spec = {.op = kind,
                            .path = qpath,
                            .to = to,
                            .user = quser,
                            .mode = mode,
                            .depth = depth,
                            .recursive = recursive};
    gw_files_start(rq, &spec);
    sp_json_doc_free(doc);
}

void gw_files_start(gw_req_t *rq, gw_files_spec_t *spec)
{
    gw_t *gw = rq->gw;
    h2o_req_t *req = rq->req;
    kind_t kind = spec->op;
    const char *qpath = spec->path, *to = spec->to, *quser = spec->user;
    uint32_t mode = spec->mode, depth = spec->depth ? spec->depth : 1;
    bool recursive = spec->recursive;
    size_t body_len = req->entity.base ? req->entity.len : 0;
    uint8_t *owned = spec->body;

    spec->body = NULL;
    if (owned)
        body_len = spec->body_len;
    if (!sp_id_valid(rq->path_id)) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
        free(owned);
        return;
    }
    if (kind != K_UPLOAD && body_len > (size_t)gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the body exceeds %lld bytes",
                         (long long)gw->cfg->max_body_bytes);
        free(owned);
        return;
    }
    gw_file_t *f = sp_xcalloc(1, sizeof(*f));
    f->owned_body = owned;
    f->gw = gw;
    f->rq = rq;
    gw_req_ref(rq);
    f->kind = kind;
    snprintf(f->sandbox, sizeof(f->sandbox), "%s", rq->path_id);
    snprintf(f->tenant, sizeof(f->tenant), "%s", rq->tenant);
    snprintf(f->request_id, sizeof(f->request_id), "%s", rq->request_id);
    snprintf(f->user, sizeof(f->user), "%s", quser && quser[0] ? quser : "root");
    f->mode = mode;
    f->recursive = recursive;
    f->depth = depth;
    space__io__v1__file_call__init(&f->call);
    sp_buf_init(&f->results);
    bool ok = (spec->multipart_paths && !qpath) ||
              (resolve(rq, kind == K_MOVE ? "from" : "path", qpath, f->user, f->path) &&
               (kind != K_MOVE || resolve(rq, "to", to, f->user, f->to)));
    if (!ok) {
        gw_req_unref(rq);
        sp_buf_dispose(&f->results);
        free(f->owned_body);
        free(f);
        return;
    }
    if (kind == K_UPLOAD) {
        char boundary[BOUNDARY_MAX + 1], err[256];
        bool bad;
        const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
        f->body = owned ? owned : (const uint8_t *)(req->entity.base ? req->entity.base : "");
        f->body_len = body_len;
        f->body_mapped = !owned && body_is_mapped(req);
        if (multipart_boundary(ct, boundary, &bad)) {
            f->multipart = true;
            if (bad || multipart_parse(f, boundary, qpath ? f->path : NULL, spec->multipart_paths,
                                       err, sizeof(err)) < 0) {
                gw_respond_error(rq, 400, "invalid_multipart", NULL, "%s",
                                 bad ? "multipart/form-data needs a boundary of 1..70 chars" : err);
                gw_req_unref(rq);
                sp_buf_dispose(&f->results);
                free(f->parts);
                free(f->owned_body);
                free(f);
                return;
            }
        } else {
            f->parts = sp_xcalloc(1, sizeof(*f->parts));
            f->parts[0].p = f->body;
            f->parts[0].len = f->body_len;
            snprintf(f->parts[0].path, sizeof(f->parts[0].path), "%s", f->path);
            f->n_parts = 1;
            f->mode = mode ? mode : 0644;
        }
        if (!f->mode)
            f->mode = 0644;
    }
    if (gw->n_files >= (size_t)gw->cfg->max_file_transfers) {
        gw_respond_error(rq, 429, "too_many_transfers", NULL,
                         "this gateway handles at most %lld file requests at once; retry later",
                         (long long)gw->cfg->max_file_transfers);
        gw_req_unref(rq);
        sp_buf_dispose(&f->results);
        free(f->parts);
        free(f->owned_body);
        free(f);
        return;
    }
    f->req = req;
    gw_file_t **slot = h2o_mem_alloc_shared(&req->pool, sizeof(gw_file_t *), on_pool_gone);
    *slot = f;
    f->next = gw->files;
    if (gw->files)
        gw->files->prev = f;
    gw->files = f;
    gw->n_files++;

    lookup_job_t *l = sp_xcalloc(1, sizeof(*l));
    l->f = f;
    l->job.run = lookup_run;
    l->job.done = lookup_done;
    f->job_busy = true;
    if (gw_job_submit(gw, &l->job) < 0) {
        free(l);
        f->job_busy = false;
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
    }
}

int gw_files_init(gw_t *gw)
{
    int n = snprintf(h2o_socket_buffer_mmap_settings.fn_template,
                     sizeof(h2o_socket_buffer_mmap_settings.fn_template),
                     "%s/space-gateway.body.XXXXXX", gw->cfg->tmp_dir);
    if (n < 0 || (size_t)n >= sizeof(h2o_socket_buffer_mmap_settings.fn_template)) {
        sp_log(SP_LOG_ERROR, "tmp-dir is too long", SP_KS("tmp_dir", gw->cfg->tmp_dir));
        return -ENAMETOOLONG;
    }
    if (access(gw->cfg->tmp_dir, W_OK | X_OK) < 0) {
        int e = errno;
        sp_log(SP_LOG_ERROR, "tmp-dir is not writable", SP_KS("tmp_dir", gw->cfg->tmp_dir),
               SP_KS("error", strerror(e)));
        return -e;
    }
    h2o_socket_buffer_mmap_settings.threshold = SPILL_BYTES;
    return 0;
}

void gw_files_close_all(gw_t *gw)
{
    /* Downloads in progress end now (a client cannot resume them anyway); everything else
     * finishes its current call and stops (f->req is checked between calls). */
    for (gw_file_t *f = gw->files; f; f = f->next) {
        if (f->kind == K_DOWNLOAD && f->answered && !f->final_sent && f->req) {
            int fd = gw_req_fd(f->req);
            if (fd >= 0)
                shutdown(fd, SHUT_RDWR);
        }
    }
}
