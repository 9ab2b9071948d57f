/* Files: the worker's side of the data plane (proto/dataplane.proto, FileCall -> FileReply on
 * space.io.wkr.<id>.file) and of the agent channel's file frames (worker_agent.h).
 *
 * A call is checked (sizes, ids, canonical paths, the sandbox is ours and the tenant's), then
 * becomes an agent request on a transfer id of the sandbox's channel. The reply to the caller
 * is sent when the agent has answered, from the channel's reader thread; a call never waits
 * on a cnats thread for the guest, except for room in the agent's pipe (back-pressure).
 *
 * Writes: each WRITE call (<= 256 KiB) is forwarded as 64 KiB frames and answered at once while
 * at most WINDOW bytes are forwarded but not yet acknowledged by the agent, else when the acks
 * catch up: the gateway's next chunk travels while the agent writes the previous one, and the
 * worker never holds more than one call's bytes. Size and SHA-256 are computed here over the
 * bytes forwarded; the agent's own count only has to agree. COMMIT renames the temporary file
 * onto the path (the agent handles frames in order, so it follows the last write) and records
 * FileWritten. Reads: each READ call asks the agent for <= 256 KiB and is answered with them.
 *
 * Long operations: a single operation (stat, list, mkdir, move, remove) the agent has not
 * finished within file-call-ms is answered `pending`, and the caller asks again (WAIT) until the
 * answer comes: no request waits longer than file-call-ms, whatever the operation takes (a
 * recursive remove of 100,000 files takes ~15 s in gVisor). The operation itself is bounded by
 * file-op-max-s (remove, move: they walk or copy what the guest made) or STUCK_MS (the others).
 * Its event is published when the agent answers, whether or not anyone still asks; an answer
 * nobody has asked for yet is kept for the next WAIT, and dropped after IDLE_MS.
 *
 * Bounds: XFERS_PER_BOX operations per sandbox at once (too_many_transfers beyond), one call
 * at a time per transfer, a transfer idle for IDLE_MS is closed (its client is gone), a call on
 * a transfer the agent leaves unanswered for STUCK_MS is failed. List replies stop at
 * LIST_REPLY_MAX bytes (truncated). Events carry paths the gateway resolved, sizes and digests
 * computed here; never content.
 *
 * Threads: calls on cnats threads (WK_FILE_SUBS subscriptions in one queue group), agent
 * callbacks on the box's reader thread, the reaper on its own; a box's transfers are guarded
 * by its mutex; replies and events are published outside it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"
#include "dataplane.pb-c.h"
#include "datakey.h"
#include "envelope.h"
#include "error.h"
#include "fspath.h"
#include "hash.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "daemon.h"
#include "worker.h"
#include "xmalloc.h"

#define CALL_DATA_MAX  (256 * 1024)
#define CALL_MAX       (CALL_DATA_MAX + 4 * SP_FSPATH_MAX + 4096)
#define WINDOW         (1024 * 1024)
#define XFERS_PER_BOX  16
#define IDLE_MS        60000
#define STUCK_MS       30000
#define LIST_REPLY_MAX (900 * 1024)
#define DEPTH_MAX      16
#define USER_UID       1000
#define REPLY_TO_MAX   256
#define DETAIL_MAX     256

typedef Space__Io__V1__FileCall call_t;
typedef Space__Io__V1__FileReply reply_t;
typedef Space__Io__V1__FileInfo info_t;

struct wk_xfer {
    uint64_t id; /* the channel's transfer id */
    int op;      /* the call in progress (FileCallOp), 0 = idle */
    bool open;   /* a write or read the agent holds */
    bool write;
    char reply_to[REPLY_TO_MAX]; /* "" when no reply is owed */
    int64_t last_ns, call_ns;
    int64_t op_ns; /* when the single operation began */
    bool pended;   /* a single operation answered pending: its answer waits for a WAIT */
    uint8_t *done; /* that answer, packed, once the agent gave it (the op is over) */
    size_t done_len;
    char path[SP_FSPATH_MAX + 1];
    char to[SP_FSPATH_MAX + 1];
    char user[8];
    uint32_t mode;
    bool recursive;
    char corr[129];
    /* write */
    sp_sha256_ctx_t *sha;
    uint64_t forwarded, acked;
    bool failed; /* the agent dropped it: the next call hears why */
    char fail_code[32];
    char fail_detail[DETAIL_MAX];
    /* read */
    uint8_t *buf;
    size_t buf_len;
    /* list */
    info_t **entries;
    size_t n_entries, cap_entries, entries_bytes;
    bool truncated;
    wk_xfer_t *next;
};

/* ---- transfers (box->mu held) ---- */

static wk_xfer_t *xfer_find(wk_box_t *b, uint64_t id)
{
    for (wk_xfer_t *x = b->xfers; x; x = x->next)
        if (x->id == id)
            return x;
    return NULL;
}

static void xfer_unlink(wk_box_t *b, wk_xfer_t *x)
{
    for (wk_xfer_t **pp = &b->xfers; *pp; pp = &(*pp)->next) {
        if (*pp == x) {
            *pp = x->next;
            b->n_xfers--;
            return;
        }
    }
}

static void info_free(info_t *in)
{
    if (!in)
        return;
    free(in->path);
    free(in->type);
    free(in->target);
    free(in);
}

static void xfer_free(wk_xfer_t *x)
{
    if (!x)
        return;
    if (x->sha) {
        uint8_t junk[SP_SHA256_LEN];
        sp_sha256_final(x->sha, junk);
    }
    free(x->buf);
    free(x->done);
    for (size_t i = 0; i < x->n_entries; i++)
        info_free(x->entries[i]);
    free(x->entries);
    free(x);
}

/* Stat, list, mkdir, move, remove: one call (and its WAITs), not an open transfer. */
static bool single_op(int op)
{
    return op >= SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_STAT &&
           op <= SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_REMOVE;
}

/* How long the agent may take over op: a remove or a move walks or copies what the guest
 * made (any amount); the rest is one system call or a bounded listing. */
static int64_t op_bound_ns(const wk_t *w, int op)
{
    if (op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_REMOVE ||
        op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MOVE)
        return w->cfg->file_op_max_s * 1000000000;
    return (int64_t)STUCK_MS * 1000000;
}

/* ---- replies and events ---- */

static void send_reply(wk_t *w, const char *to, const reply_t *r)
{
    if (!to || !to[0])
        return;
    size_t len = space__io__v1__file_reply__get_packed_size(r);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    space__io__v1__file_reply__pack(r, buf);
    int rc = sp_bus_publish_core(w->bus, to, buf, len);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "file reply not sent", SP_KS("error", sp_strerror(rc)));
    free(buf);
}

static void reply_error(wk_t *w, const char *to, const char *error, const char *detail)
{
    reply_t r = SPACE__IO__V1__FILE_REPLY__INIT;
    r.error = (char *)error;
    r.detail = (char *)(detail ? detail : "");
    send_reply(w, to, &r);
}

/* box->mu held. x (unlinked by the caller) answered pending and nobody asks right now: its
 * answer r is kept, under x's id, for the WAIT that comes next (or dropped after IDLE_MS). */
static void keep_answer(wk_box_t *b, const wk_xfer_t *x, const reply_t *r)
{
    wk_xfer_t *k = sp_xcalloc(1, sizeof(*k));
    k->id = x->id;
    k->pended = true;
    k->last_ns = sp_mono_ns();
    snprintf(k->path, sizeof(k->path), "%s", x->path);
    snprintf(k->corr, sizeof(k->corr), "%s", x->corr);
    k->done_len = space__io__v1__file_reply__get_packed_size(r);
    k->done = sp_xmalloc(k->done_len ? k->done_len : 1);
    space__io__v1__file_reply__pack(r, k->done);
    k->next = b->xfers;
    b->xfers = k;
    b->n_xfers++;
}

static const char *type_name(Space__Agent__V1__FileType t)
{
    switch (t) {
    case SPACE__AGENT__V1__FILE_TYPE__FILE_TYPE_FILE:
        return "file";
    case SPACE__AGENT__V1__FILE_TYPE__FILE_TYPE_DIR:
        return "dir";
    case SPACE__AGENT__V1__FILE_TYPE__FILE_TYPE_SYMLINK:
        return "symlink";
    default:
        return "other";
    }
}

/* A heap copy of an agent FileInfo for the data plane. */
static info_t *info_copy(const Space__Agent__V1__FileInfo *a)
{
    info_t *in = sp_xmalloc(sizeof(*in));
    space__io__v1__file_info__init(in);
    in->path = sp_xstrdup(a->path);
    in->type = sp_xstrdup(type_name(a->type));
    in->size = a->size;
    in->mode = a->mode & 07777;
    in->mtime_us = a->mtime_us;
    in->target = sp_xstrdup(a->target);
    in->uid = a->uid;
    in->gid = a->gid;
    return in;
}

/* With --seal-output the event's paths go sealed under the sandbox's data key (docs/audit.md,
 * "Sealed file paths"), from the key the box holds: file_call asked for it before the
 * operation, and this runs on the box's reader, which must not wait on the bus. No key (not
 * given, or the sandbox forgotten): the event is not recorded, as output is not. */
static int seal_paths(wk_box_t *b, sp_envelope_t *env, Space__V1__SealedPaths *sealed,
                      uint8_t **ret_ct)
{
    sp_file_paths_t fp;
    sp_cred_key_t dk;
    size_t ct_len = 0;

    if (!sp_envelope_file_paths(env, &fp))
        return -EINVAL;
    int rc = wk_datakey_cached(b, &dk);
    if (rc == 0)
        rc = sp_paths_seal(&dk, b->id, sp_event_type_name(env->payload_case), *fp.path,
                           fp.to ? *fp.to : NULL, sealed->nonce.data, ret_ct, &ct_len);
    if (rc == 0) {
        sealed->ciphertext.data = *ret_ct;
        sealed->ciphertext.len = ct_len;
        sealed->nonce.len = SP_CRED_NONCE_LEN;
        memcpy(sealed->key_id, dk.id, SP_CRED_KEY_ID_LEN + 1);
        *fp.sealed = sealed;
        *fp.path = "";
        if (fp.to)
            *fp.to = "";
    }
    sp_cred_key_wipe(&dk);
    return rc;
}

/* 0, or < 0 when the bus did not take the fact within SP_PUBLISH_FACT_BUDGET_MS. A fact the
 * data key is missing for is not recorded, and that is not a failure (logged). */
static int publish_file_event(wk_box_t *b, const char *corr, sp_envelope_t *env)
{
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SealedPaths sealed = SPACE__V1__SEALED_PATHS__INIT;
    uint8_t nonce[SP_CRED_NONCE_LEN], *ct = NULL;
    char key_id[SP_CRED_KEY_ID_LEN + 1] = "";
    char id[37];
    int rc;
    agg.kind = "sandbox";
    agg.id = b->id;
    env->aggregate = &agg;
    env->tenant = b->tenant;
    env->actor = "svc:worker";
    env->correlation_id = (char *)corr;
    sealed.nonce.data = nonce;
    sealed.key_id = key_id;
    if (b->w->cfg->seal_output && (rc = seal_paths(b, env, &sealed, &ct)) < 0) {
        sp_log(SP_LOG_WARN, "no data key for the file event's paths: not recorded",
               SP_KS("type", sp_event_type_name(env->payload_case)), SP_KS("sandbox", b->id),
               SP_KS("error", sp_strerror(rc)), SP_KS("corr", corr));
        return 0;
    }
    rc = sp_publish_event_retry(b->w->bus, env, id, b->w->cfg->id, NULL, SP_PUBLISH_FACT_BUDGET_MS);
    free(ct);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot record file event", SP_KS("type", env->type),
               SP_KS("sandbox", b->id), SP_KS("error", sp_strerror(rc)), SP_KS("corr", corr));
    return rc;
}

/* ---- agent callbacks (the box's reader thread) ---- */

static void on_file_result(void *arg, uint64_t id, const Space__Agent__V1__FileResult *r)
{
    wk_box_t *b = arg;
    wk_t *w = b->w;
    reply_t rep = SPACE__IO__V1__FILE_REPLY__INIT;
    char to[REPLY_TO_MAX];
    uint8_t digest[SP_SHA256_LEN];
    info_t *info = NULL;
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__FileWritten fw = SPACE__V1__FILE_WRITTEN__INIT;
    Space__V1__FileRemoved fr = SPACE__V1__FILE_REMOVED__INIT;
    Space__V1__FileMoved fm = SPACE__V1__FILE_MOVED__INIT;
    Space__V1__DirCreated dc = SPACE__V1__DIR_CREATED__INIT;
    bool event = false, terminal = true;

    pthread_mutex_lock(&b->mu);
    wk_xfer_t *x = xfer_find(b, id);
    if (!x || !x->op) {
        pthread_mutex_unlock(&b->mu);
        return;
    }
    snprintf(to, sizeof(to), "%s", x->reply_to);
    x->reply_to[0] = '\0';
    int op = x->op;
    x->op = 0;
    x->last_ns = sp_mono_ns();
    rep.ok = true;
    rep.xfer = id;
    if (r->info)
        info = info_copy(r->info);
    switch (op) {
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_STAT:
        rep.info = info;
        break;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_LIST:
        rep.entries = x->entries;
        rep.n_entries = x->n_entries;
        rep.truncated = x->truncated || r->truncated;
        break;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MKDIR:
        rep.info = info;
        rep.existed = r->existed;
        if (!r->existed) {
            dc.path = x->path;
            dc.user = x->user;
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_DIR_CREATED;
            env.dir_created = &dc;
            event = true;
        }
        break;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MOVE:
        fm.from = x->path;
        fm.to = x->to;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_FILE_MOVED;
        env.file_moved = &fm;
        event = true;
        break;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_REMOVE:
        fr.path = x->path;
        fr.recursive = x->recursive;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_FILE_REMOVED;
        env.file_removed = &fr;
        event = true;
        break;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE_OPEN:
        x->open = true;
        x->write = true;
        terminal = false;
        break;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ_OPEN:
        x->open = true;
        x->write = false;
        rep.info = info;
        terminal = false;
        break;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_COMMIT:
        sp_sha256_final(x->sha, digest);
        x->sha = NULL;
        if (!r->info || r->info->size != x->forwarded) {
            /* The guest's file is not what was sent: no FileWritten for it. */
            rep.ok = false;
            rep.error = "agent_error";
            rep.detail = "the written file's size differs from the bytes sent";
            sp_log(SP_LOG_WARN, "file size mismatch after commit", SP_KS("sandbox", b->id),
                   SP_KS("path", x->path), SP_KU("sent", x->forwarded),
                   SP_KU("agent_size", r->info ? r->info->size : 0));
            break;
        }
        rep.size = x->forwarded;
        rep.sha256 = (ProtobufCBinaryData){SP_SHA256_LEN, digest};
        rep.info = info;
        fw.path = x->path;
        fw.size = x->forwarded;
        fw.sha256 = rep.sha256;
        fw.mode = x->mode;
        fw.user = x->user;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_FILE_WRITTEN;
        env.file_written = &fw;
        event = true;
        break;
    default: /* close */
        break;
    }
    if (terminal) {
        xfer_unlink(b, x);
        if (!to[0] && x->pended)
            keep_answer(b, x, &rep);
    } else {
        x = NULL;
    }
    pthread_mutex_unlock(&b->mu);

    /* The fact first: a change answered 2xx is one the log has (tests/integration/cluster.c).
     * A kept answer (its caller not back yet) was made above and says ok either way. */
    if (event && publish_file_event(b, x->corr, &env) < 0 && rep.ok) {
        rep.ok = false;
        rep.error = "bus_unavailable";
        rep.detail = "the change was made but could not be recorded; retry";
    }
    send_reply(w, to, &rep);
    if (op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_COMMIT && rep.ok)
        sp_log(SP_LOG_INFO, "file written", SP_KS("sandbox", b->id), SP_KS("path", x->path),
               SP_KU("size", x->forwarded), SP_KS("corr", x->corr));
    info_free(info);
    xfer_free(x);
}

static void on_file_failed(void *arg, uint64_t id, const char *code, const char *message)
{
    wk_box_t *b = arg;
    char to[REPLY_TO_MAX] = "";
    pthread_mutex_lock(&b->mu);
    wk_xfer_t *x = xfer_find(b, id);
    if (!x) {
        pthread_mutex_unlock(&b->mu);
        return;
    }
    x->open = false; /* the agent holds nothing for it now */
    if (x->reply_to[0]) {
        snprintf(to, sizeof(to), "%s", x->reply_to);
        xfer_unlink(b, x);
    } else if (x->pended) {
        reply_t r = SPACE__IO__V1__FILE_REPLY__INIT;
        r.error = (char *)code;
        r.detail = (char *)message;
        xfer_unlink(b, x);
        keep_answer(b, x, &r);
    } else {
        /* A write failed between calls: the next call hears it. */
        x->failed = true;
        snprintf(x->fail_code, sizeof(x->fail_code), "%s", code);
        snprintf(x->fail_detail, sizeof(x->fail_detail), "%s", message);
        x = NULL;
    }
    pthread_mutex_unlock(&b->mu);
    if (x) {
        reply_error(b->w, to, code, message);
        xfer_free(x);
    }
}

static void on_file_ack(void *arg, uint64_t id, uint64_t acked)
{
    wk_box_t *b = arg;
    char to[REPLY_TO_MAX] = "";
    pthread_mutex_lock(&b->mu);
    wk_xfer_t *x = xfer_find(b, id);
    if (x) {
        x->acked = acked;
        if (x->op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE && x->reply_to[0] &&
            x->forwarded - x->acked <= WINDOW) {
            snprintf(to, sizeof(to), "%s", x->reply_to);
            x->reply_to[0] = '\0';
            x->op = 0;
        }
    }
    pthread_mutex_unlock(&b->mu);
    if (to[0]) {
        reply_t r = SPACE__IO__V1__FILE_REPLY__INIT;
        r.ok = true;
        r.xfer = id;
        send_reply(b->w, to, &r);
    }
}

static void on_file_data(void *arg, uint64_t id, uint64_t offset, const uint8_t *data, size_t len,
                         bool eof, bool done)
{
    wk_box_t *b = arg;
    char to[REPLY_TO_MAX] = "";
    uint8_t *buf = NULL;
    size_t buf_len = 0;
    (void)offset;
    pthread_mutex_lock(&b->mu);
    wk_xfer_t *x = xfer_find(b, id);
    if (x && x->op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ && x->buf) {
        /* The channel checked offset and length against the read: it fits. */
        if (x->buf_len + len <= WK_AGENT_READ_MAX) {
            memcpy(x->buf + x->buf_len, data, len);
            x->buf_len += len;
        }
        if (done) {
            snprintf(to, sizeof(to), "%s", x->reply_to);
            x->reply_to[0] = '\0';
            x->op = 0;
            x->last_ns = sp_mono_ns();
            buf = x->buf; /* handed over for the reply; a new one for the next read */
            buf_len = x->buf_len;
            x->buf = NULL;
            x->buf_len = 0;
        }
    }
    pthread_mutex_unlock(&b->mu);
    if (buf) {
        reply_t r = SPACE__IO__V1__FILE_REPLY__INIT;
        r.ok = true;
        r.xfer = id;
        r.data = (ProtobufCBinaryData){buf_len, buf};
        r.eof = eof;
        send_reply(b->w, to, &r);
        free(buf);
    }
}

static void on_file_entries(void *arg, uint64_t id, Space__Agent__V1__FileInfo **entries, size_t n)
{
    wk_box_t *b = arg;
    pthread_mutex_lock(&b->mu);
    wk_xfer_t *x = xfer_find(b, id);
    for (size_t i = 0; x && i < n && !x->truncated; i++) {
        size_t sz = strlen(entries[i]->path) + strlen(entries[i]->target) + 64;
        if (x->entries_bytes + sz > LIST_REPLY_MAX) {
            x->truncated = true;
            break;
        }
        if (x->n_entries == x->cap_entries) {
            x->cap_entries = x->cap_entries ? 2 * x->cap_entries : 64;
            x->entries = sp_xrealloc(x->entries, x->cap_entries * sizeof(info_t *));
        }
        x->entries[x->n_entries++] = info_copy(entries[i]);
        x->entries_bytes += sz;
    }
    pthread_mutex_unlock(&b->mu);
}

void wk_files_callbacks(wk_agent_callbacks_t *cb)
{
    cb->on_file_result = on_file_result;
    cb->on_file_failed = on_file_failed;
    cb->on_file_ack = on_file_ack;
    cb->on_file_data = on_file_data;
    cb->on_file_entries = on_file_entries;
}

void wk_box_fail_files(wk_box_t *b, const char *error)
{
    pthread_mutex_lock(&b->mu);
    wk_xfer_t *list = b->xfers;
    b->xfers = NULL;
    b->n_xfers = 0;
    pthread_mutex_unlock(&b->mu);
    while (list) {
        wk_xfer_t *next = list->next;
        if (list->reply_to[0])
            reply_error(b->w, list->reply_to, "agent_unavailable", error);
        xfer_free(list);
        list = next;
    }
    wk_box_fail_watches(b, error);
}

/* ---- calls (cnats threads) ---- */

static const char *check(const call_t *q, char *detail, size_t dlen)
{
    if (!sp_id_valid(q->sandbox) || !sp_id_valid(q->tenant)) {
        snprintf(detail, dlen, "sandbox and tenant must be ids");
        return "bad_request";
    }
    if (strlen(q->correlation_id) > 128) {
        snprintf(detail, dlen, "correlation_id too long");
        return "bad_request";
    }
    if (!sp_fspath_home(q->user)) {
        snprintf(detail, dlen, "user must be root or user");
        return "bad_request";
    }
    switch (q->op) {
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MOVE:
        if (!sp_fspath_canonical(q->to)) {
            snprintf(detail, dlen, "to: not an absolute normalised path");
            return "bad_path";
        }
        /* fall through */
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_STAT:
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_LIST:
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MKDIR:
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_REMOVE:
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE_OPEN:
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ_OPEN:
        if (!sp_fspath_canonical(q->path)) {
            snprintf(detail, dlen, "path: not an absolute normalised path");
            return "bad_path";
        }
        if (q->mode > 07777 || q->depth > DEPTH_MAX) {
            snprintf(detail, dlen, "mode or depth out of range");
            return "bad_request";
        }
        return NULL;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE:
        if (q->data.len == 0 || q->data.len > CALL_DATA_MAX) {
            snprintf(detail, dlen, "write: 1..%d bytes", CALL_DATA_MAX);
            return "bad_request";
        }
        return NULL;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ:
        if (q->length == 0 || q->length > WK_AGENT_READ_MAX) {
            snprintf(detail, dlen, "read: 1..%d bytes", WK_AGENT_READ_MAX);
            return "bad_request";
        }
        return NULL;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_COMMIT:
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_CLOSE:
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WAIT:
        return NULL;
    default:
        snprintf(detail, dlen, "unknown op %d", (int)q->op);
        return "bad_request";
    }
}

static Space__Agent__V1__FileOp agent_op(int op)
{
    switch (op) {
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_STAT:
        return SPACE__AGENT__V1__FILE_OP__FILE_OP_STAT;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_LIST:
        return SPACE__AGENT__V1__FILE_OP__FILE_OP_LIST;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MKDIR:
        return SPACE__AGENT__V1__FILE_OP__FILE_OP_MKDIR;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MOVE:
        return SPACE__AGENT__V1__FILE_OP__FILE_OP_MOVE;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_REMOVE:
        return SPACE__AGENT__V1__FILE_OP__FILE_OP_REMOVE;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE_OPEN:
        return SPACE__AGENT__V1__FILE_OP__FILE_OP_WRITE_OPEN;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ_OPEN:
        return SPACE__AGENT__V1__FILE_OP__FILE_OP_READ_OPEN;
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_COMMIT:
        return SPACE__AGENT__V1__FILE_OP__FILE_OP_COMMIT;
    default:
        return SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE;
    }
}

/* A new operation (stat, list, mkdir, move, remove, write_open, read_open). */
static void call_new(wk_box_t *b, wk_agent_t *agent, const call_t *q, const char *reply_to)
{
    wk_t *w = b->w;
    uint64_t id = 0;
    const char *err = NULL;
    char detail[DETAIL_MAX] = "";

    pthread_mutex_lock(&b->mu);
    if (b->n_xfers >= XFERS_PER_BOX) {
        err = "too_many_transfers";
        snprintf(detail, sizeof(detail), "%d file operations already run in this sandbox",
                 XFERS_PER_BOX);
    } else {
        int rc = wk_agent_file_reserve(agent, &id);
        if (rc < 0) {
            err = rc == -EBUSY ? "too_many_transfers" : "agent_unavailable";
            snprintf(detail, sizeof(detail), "%s", sp_strerror(rc));
        }
    }
    if (!err) {
        wk_xfer_t *x = sp_xcalloc(1, sizeof(*x));
        x->id = id;
        x->op = (int)q->op;
        x->last_ns = x->call_ns = x->op_ns = sp_mono_ns();
        snprintf(x->reply_to, sizeof(x->reply_to), "%s", reply_to);
        snprintf(x->path, sizeof(x->path), "%s", q->path);
        snprintf(x->to, sizeof(x->to), "%s", q->to);
        snprintf(x->user, sizeof(x->user), "%s", q->user[0] ? q->user : "root");
        x->mode = q->mode ? q->mode
                          : (q->op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MKDIR ? 0755 : 0644);
        x->recursive = q->recursive;
        snprintf(x->corr, sizeof(x->corr), "%s", q->correlation_id);
        if (q->op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE_OPEN)
            x->sha = sp_sha256_new();
        x->next = b->xfers;
        b->xfers = x;
        b->n_xfers++;
    }
    pthread_mutex_unlock(&b->mu);
    if (err) {
        reply_error(w, reply_to, err, detail);
        return;
    }

    Space__Agent__V1__FileRequest r = SPACE__AGENT__V1__FILE_REQUEST__INIT;
    bool user = strcmp(q->user, "user") == 0;
    r.xfer_id = id;
    r.op = agent_op((int)q->op);
    r.path = q->path;
    r.to = q->to;
    r.mode =
        q->mode ? q->mode : (q->op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_MKDIR ? 0755 : 0644);
    r.uid = r.gid = user ? USER_UID : 0;
    r.recursive = q->recursive;
    r.depth = q->depth ? q->depth : 1;
    r.max_entries = WK_AGENT_LIST_MAX;
    int rc = wk_agent_file_request(agent, &r);
    if (rc < 0) {
        pthread_mutex_lock(&b->mu);
        wk_xfer_t *x = xfer_find(b, id);
        if (x)
            xfer_unlink(b, x);
        pthread_mutex_unlock(&b->mu);
        wk_agent_file_release(agent, id);
        if (x) {
            reply_error(w, reply_to, "agent_unavailable", sp_strerror(rc));
            xfer_free(x);
        }
    }
}

/* A call on an open transfer: write, commit, read, close. */
static void call_on(wk_box_t *b, wk_agent_t *agent, const call_t *q, const char *reply_to)
{
    wk_t *w = b->w;
    const char *err = NULL;
    char detail[DETAIL_MAX] = "";
    wk_xfer_t *gone = NULL;
    int op = (int)q->op;
    bool want_write = op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE ||
                      op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_COMMIT;

    pthread_mutex_lock(&b->mu);
    wk_xfer_t *x = xfer_find(b, q->xfer);
    if (!x || (!x->open && !x->failed)) {
        err = "unknown_transfer";
        snprintf(detail, sizeof(detail), "no open transfer %llu", (unsigned long long)q->xfer);
    } else if (x->op) {
        err = "bad_request";
        snprintf(detail, sizeof(detail), "transfer %llu has a call in progress",
                 (unsigned long long)q->xfer);
    } else if (x->failed) {
        /* The agent already gave up on it: this call hears why, and it is over. */
        err = op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_CLOSE ? NULL : "agent_error";
        snprintf(detail, sizeof(detail), "%s: %.200s", x->fail_code, x->fail_detail);
        xfer_unlink(b, x);
        gone = x;
    } else if (op != SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_CLOSE && want_write != x->write) {
        err = "bad_request";
        snprintf(detail, sizeof(detail), "transfer %llu is a %s", (unsigned long long)q->xfer,
                 x->write ? "write" : "read");
    } else if (op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE && q->offset != x->forwarded) {
        err = "bad_request";
        snprintf(detail, sizeof(detail), "write at %llu, expected %llu",
                 (unsigned long long)q->offset, (unsigned long long)x->forwarded);
    } else {
        x->op = op;
        x->last_ns = x->call_ns = sp_mono_ns();
        if (op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE) {
            sp_sha256_update(x->sha, q->data.data, q->data.len);
            x->forwarded += q->data.len;
        } else {
            snprintf(x->reply_to, sizeof(x->reply_to), "%s", reply_to);
            if (op == SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ && !x->buf)
                x->buf = sp_xmalloc(WK_AGENT_READ_MAX);
        }
    }
    pthread_mutex_unlock(&b->mu);
    if (gone) {
        wk_agent_file_release(agent, gone->id);
        xfer_free(gone);
        if (!err) {
            reply_t r = SPACE__IO__V1__FILE_REPLY__INIT;
            r.ok = true;
            r.xfer = q->xfer;
            send_reply(w, reply_to, &r);
            return;
        }
    }
    if (err) {
        reply_error(w, reply_to, err, detail);
        return;
    }

    int rc;
    switch (op) {
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE: {
        rc = wk_agent_file_write(agent, q->xfer, q->offset, q->data.data, q->data.len);
        char to[REPLY_TO_MAX] = "";
        pthread_mutex_lock(&b->mu);
        x = xfer_find(b, q->xfer);
        if (rc == 0 && x && !x->failed) {
            if (x->forwarded - x->acked <= WINDOW) {
                x->op = 0;
                snprintf(to, sizeof(to), "%s", reply_to);
            } else {
                /* on_file_ack answers once the agent caught up. */
                snprintf(x->reply_to, sizeof(x->reply_to), "%s", reply_to);
            }
        } else if (x) {
            /* The agent failed it (on_file_failed) or the channel broke: the transfer is over. */
            x->op = 0;
            if (!x->failed) {
                x->failed = true;
                snprintf(x->fail_code, sizeof(x->fail_code), "agent_unavailable");
                snprintf(x->fail_detail, sizeof(x->fail_detail), "%s", sp_strerror(rc));
            }
            snprintf(detail, sizeof(detail), "%s", x->fail_detail);
            err = x->fail_code;
            xfer_unlink(b, x);
            gone = x;
        } else {
            err = "agent_unavailable";
            snprintf(detail, sizeof(detail), "the transfer is gone");
        }
        if (err)
            reply_error(w, reply_to, err, detail); /* under mu: err may point into x */
        pthread_mutex_unlock(&b->mu);
        if (to[0]) {
            reply_t r = SPACE__IO__V1__FILE_REPLY__INIT;
            r.ok = true;
            r.xfer = q->xfer;
            send_reply(w, to, &r);
        }
        if (gone)
            wk_agent_file_release(agent, gone->id);
        xfer_free(gone);
        return;
    }
    case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ:
        rc = wk_agent_file_read(agent, q->xfer, q->offset, q->length);
        break;
    default: {
        Space__Agent__V1__FileRequest r = SPACE__AGENT__V1__FILE_REQUEST__INIT;
        r.xfer_id = q->xfer;
        r.op = agent_op(op);
        r.path = "";
        r.to = "";
        rc = wk_agent_file_request(agent, &r);
        break;
    }
    }
    if (rc < 0) {
        pthread_mutex_lock(&b->mu);
        x = xfer_find(b, q->xfer);
        if (x && x->reply_to[0])
            xfer_unlink(b, x);
        else
            x = NULL;
        pthread_mutex_unlock(&b->mu);
        if (x) {
            wk_agent_file_release(agent, q->xfer);
            reply_error(w, reply_to, "agent_unavailable", sp_strerror(rc));
            xfer_free(x);
        }
    }
}

/* WAIT: the answer of a single operation that answered pending; now if the agent gave it,
 * else when it does (or at the next pending). */
static void call_wait(wk_box_t *b, const call_t *q, const char *reply_to)
{
    const char *err = NULL;
    char detail[DETAIL_MAX] = "";
    wk_xfer_t *done = NULL;
    pthread_mutex_lock(&b->mu);
    wk_xfer_t *x = xfer_find(b, q->xfer);
    if (!x || !x->pended) {
        err = "unknown_transfer";
        snprintf(detail, sizeof(detail), "no pending operation %llu", (unsigned long long)q->xfer);
    } else if (x->done) {
        xfer_unlink(b, x);
        done = x;
    } else if (x->reply_to[0]) {
        err = "bad_request";
        snprintf(detail, sizeof(detail), "operation %llu is being waited for",
                 (unsigned long long)q->xfer);
    } else {
        snprintf(x->reply_to, sizeof(x->reply_to), "%s", reply_to);
        x->last_ns = x->call_ns = sp_mono_ns();
    }
    pthread_mutex_unlock(&b->mu);
    if (done) {
        int rc = sp_bus_publish_core(b->w->bus, reply_to, done->done, done->done_len);
        if (rc < 0)
            sp_log(SP_LOG_WARN, "file reply not sent", SP_KS("error", sp_strerror(rc)));
        xfer_free(done);
    } else if (err) {
        reply_error(b->w, reply_to, err, detail);
    }
}

static void file_call(void *arg, const char *subject, const char *reply_to, const uint8_t *data,
                      size_t len)
{
    wk_t *w = arg;
    char detail[DETAIL_MAX] = "";
    (void)subject;

    if (!reply_to || !reply_to[0] || strlen(reply_to) >= REPLY_TO_MAX)
        return; /* nobody to answer */
    if (len > CALL_MAX) {
        reply_error(w, reply_to, "bad_request", "call too large");
        return;
    }
    call_t *q = space__io__v1__file_call__unpack(NULL, len, data);
    if (!q) {
        reply_error(w, reply_to, "bad_request", "not a FileCall");
        return;
    }
    const char *refusal = check(q, detail, sizeof(detail));
    wk_box_t *b = refusal ? NULL : wk_owned_get(w, q->sandbox);
    if (!refusal && (!b || strcmp(b->tenant, q->tenant) != 0)) {
        refusal = "sandbox_not_running";
        snprintf(detail, sizeof(detail), "no running sandbox %s on worker %s", q->sandbox,
                 w->cfg->id);
    }
    wk_agent_t *agent = NULL;
    if (!refusal) {
        pthread_mutex_lock(&b->mu);
        if (!b->agent || b->agent_lost) {
            refusal = "agent_unavailable";
            snprintf(detail, sizeof(detail), "%s",
                     b->agent_lost ? "the agent channel was lost" : "no agent channel");
        } else {
            agent = b->agent;
        }
        pthread_mutex_unlock(&b->mu);
    }
    if (refusal) {
        reply_error(w, reply_to, refusal, detail);
    } else {
        switch (q->op) {
        case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WRITE:
        case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_COMMIT:
        case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_READ:
        case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_CLOSE:
            call_on(b, agent, q, reply_to);
            break;
        case SPACE__IO__V1__FILE_CALL_OP__FILE_CALL_WAIT:
            call_wait(b, q, reply_to);
            break;
        default:
            /* The data key its event's paths will be sealed with, asked for now (once per
             * sandbox): the event goes out from the box's reader, which does not ask. */
            if (w->cfg->seal_output) {
                sp_cred_key_t dk;
                (void)wk_datakey_get(b, &dk);
                sp_cred_key_wipe(&dk);
            }
            call_new(b, agent, q, reply_to);
            break;
        }
    }
    wk_box_put(b);
    space__io__v1__file_call__free_unpacked(q, NULL);
}

/* The subscription's callback: acts only on a request that wk_request_open lets through. */
static void on_file_call(void *arg, const char *subject, const char *reply_to, const uint8_t *data,
                         size_t len)
{
    sp_request_t rq;
    if (wk_request_open(arg, subject, reply_to, data, len, &rq))
        file_call(arg, subject, reply_to, rq.body, rq.len);
    sp_request_dispose(&rq);
}

/* ---- idle transfers ---- */

/* Closes transfers nobody called for IDLE_MS (a client or gateway that vanished), answers
 * pending the single operations that ran file-call-ms since they were asked, and fails calls
 * the agent left unanswered past their bound (op_bound_ns for single operations, STUCK_MS for
 * calls on a transfer). */
static void reap_box(wk_box_t *b)
{
    const wk_t *w = b->w;
    int64_t now = sp_mono_ns();
    int64_t call_ns = w->cfg->file_call_ms * 1000000;
    wk_xfer_t *idle = NULL, *stuck = NULL;
    struct {
        uint64_t id;
        char to[REPLY_TO_MAX];
    } due[XFERS_PER_BOX];
    size_t n_due = 0;
    pthread_mutex_lock(&b->mu);
    wk_agent_t *agent = b->agent;
    for (wk_xfer_t **pp = &b->xfers; *pp;) {
        wk_xfer_t *x = *pp;
        bool single = single_op(x->op);
        bool is_idle = !x->op && now - x->last_ns > (int64_t)IDLE_MS * 1000000;
        bool is_stuck = x->op && (single ? now - x->op_ns > op_bound_ns(w, x->op)
                                         : now - x->call_ns > (int64_t)STUCK_MS * 1000000);
        if (is_idle || is_stuck) {
            *pp = x->next;
            b->n_xfers--;
            if (is_idle) {
                x->next = idle;
                idle = x;
            } else {
                x->next = stuck;
                stuck = x;
            }
            continue;
        }
        if (single && x->reply_to[0] && now - x->call_ns > call_ns && n_due < XFERS_PER_BOX) {
            if (!x->pended)
                sp_log(SP_LOG_INFO, "file operation still running: answered pending",
                       SP_KS("sandbox", b->id), SP_KS("path", x->path), SP_KS("corr", x->corr));
            due[n_due].id = x->id;
            snprintf(due[n_due++].to, REPLY_TO_MAX, "%s", x->reply_to);
            x->reply_to[0] = '\0';
            x->pended = true;
            x->last_ns = now;
        }
        pp = &x->next;
    }
    pthread_mutex_unlock(&b->mu);
    for (size_t i = 0; i < n_due; i++) {
        reply_t r = SPACE__IO__V1__FILE_REPLY__INIT;
        r.ok = true;
        r.pending = true;
        r.xfer = due[i].id;
        send_reply(b->w, due[i].to, &r);
    }
    while (idle) {
        wk_xfer_t *next = idle->next;
        sp_log(SP_LOG_INFO,
               idle->done ? "an operation's answer was not asked for" : "idle file transfer closed",
               SP_KS("sandbox", b->id), SP_KS("path", idle->path), SP_KS("corr", idle->corr));
        Space__Agent__V1__FileRequest r = SPACE__AGENT__V1__FILE_REQUEST__INIT;
        r.xfer_id = idle->id;
        r.op = SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE;
        r.path = "";
        r.to = "";
        /* Its result finds no transfer in the box and is dropped; the channel forgets it. */
        if (!idle->open || wk_agent_file_request(agent, &r) < 0)
            wk_agent_file_release(agent, idle->id);
        xfer_free(idle);
        idle = next;
    }
    while (stuck) {
        wk_xfer_t *next = stuck->next;
        char detail[DETAIL_MAX];
        snprintf(detail, sizeof(detail), "the agent did not answer in %lld s",
                 (long long)((now - (single_op(stuck->op) ? stuck->op_ns : stuck->call_ns)) /
                             1000000000));
        sp_log(SP_LOG_WARN, "file call unanswered by the agent", SP_KS("sandbox", b->id),
               SP_KS("path", stuck->path), SP_KS("detail", detail), SP_KS("corr", stuck->corr));
        wk_agent_file_release(agent, stuck->id);
        if (stuck->reply_to[0]) {
            reply_error(b->w, stuck->reply_to, "agent_error", detail);
        } else if (stuck->pended) {
            reply_t r = SPACE__IO__V1__FILE_REPLY__INIT;
            r.error = "agent_error";
            r.detail = detail;
            pthread_mutex_lock(&b->mu);
            keep_answer(b, stuck, &r);
            pthread_mutex_unlock(&b->mu);
        }
        xfer_free(stuck);
        stuck = next;
    }
}

static void *reaper_main(void *arg)
{
    wk_t *w = arg;
    while (!sp_daemon_stopping) {
        sp_daemon_sleep_ms(1000);
        pthread_mutex_lock(&w->mu);
        size_t n = w->n_owned;
        wk_box_t **boxes = sp_xcalloc(n ? n : 1, sizeof(wk_box_t *));
        for (size_t i = 0; i < n; i++) {
            boxes[i] = w->owned[i];
            boxes[i]->refs++;
        }
        pthread_mutex_unlock(&w->mu);
        for (size_t i = 0; i < n; i++) {
            reap_box(boxes[i]);
            wk_box_reap_watches(boxes[i]);
            wk_box_put(boxes[i]);
        }
        free(boxes);
    }
    return NULL;
}

int wk_files_start(wk_t *w)
{
    char subject[128];
    int brc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_FILE, w->cfg->id, NULL, NULL);
    if (brc < 0)
        return brc;
    for (int i = 0; i < WK_FILE_SUBS; i++) {
        int rc = sp_bus_subscribe(w->bus, subject, "files", on_file_call, w, &w->file_subs[i]);
        if (rc < 0) {
            sp_log(SP_LOG_ERROR, "cannot subscribe to file calls", SP_KS("error", sp_strerror(rc)));
            return rc;
        }
    }
    if (pthread_create(&w->files_reaper, NULL, reaper_main, w) == 0)
        w->files_reaper_started = true;
    return 0;
}

void wk_files_stop(wk_t *w)
{
    for (int i = 0; i < WK_FILE_SUBS; i++) {
        sp_bus_unsubscribe(w->file_subs[i]);
        w->file_subs[i] = NULL;
    }
    if (w->files_reaper_started) {
        pthread_join(w->files_reaper, NULL);
        w->files_reaper_started = false;
    }
}
