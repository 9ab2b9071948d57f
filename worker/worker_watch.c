/* Directory watches: the worker's side of the data plane (proto/dataplane.proto, WatchCall ->
 * WatchReply on space.io.wkr.<id>.watch; WatchBatch and WatchEnd on
 * space.io.watch.<watch_id>.ev|end) and of the agent channel's watch transfers
 * (worker_agent.h, FILE_OP_WATCH).
 *
 * start: the call is checked (ids, a canonical path, the sandbox is ours and the tenant's, at
 * most WK_WATCH_MAX watches in the sandbox: too_many_watches beyond), becomes a FILE_OP_WATCH
 * on a transfer of the sandbox's channel, and is answered once the agent opened or refused it.
 * From then on each WatchEvents frame becomes one WatchBatch, numbered 1, 2, ... so the gateway
 * can tell a lost one. What the agent sends is checked again here: every path must be canonical
 * and at or under the watched directory (else the event is dropped and counted), and events go
 * through a token bucket of RATE per second per watch (BURST at once), above what the agent's
 * own bucket lets through: a guest that floods loses events, and the loss is an "overflow"
 * event in the batch.
 *
 * A watch ends when the gateway stops it, when its lease runs out (the gateway renews it every
 * few seconds while its client listens: a gateway that died leaves nothing behind for longer
 * than LEASE_MS), when the agent ends it (its directory went away: WatchEnd), or with the
 * channel or the sandbox (wk_box_fail_watches: WatchEnd "agent_unavailable"). A watch stopped
 * before the agent answered its start is closed when that answer comes, so the agent never
 * keeps a watch nobody follows.
 *
 * Threads: calls on a cnats thread, agent callbacks on the box's reader thread (the only one
 * that publishes batches, so they leave in order), lease expiry on the files reaper; a box's
 * watches are guarded by its mutex; replies and publishes happen outside it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"
#include "dataplane.pb-c.h"
#include "error.h"
#include "fspath.h"
#include "ids.h"
#include "log.h"
#include "reduce.h"
#include "worker.h"
#include "xmalloc.h"

#define CALL_MAX     (SP_FSPATH_MAX + 1024)
#define LEASE_MS     60000  /* the gateway renews every 15 s (gateway_watch.c) */
#define STUCK_MS     30000  /* a start the agent leaves unanswered */
#define RATE         5000.0 /* events per second per watch (the agent's own: 2000) */
#define BURST        10000.0
#define REPLY_TO_MAX 256
#define DETAIL_MAX   256

typedef Space__Io__V1__WatchCall call_t;

struct wk_watch {
    char id[SP_ID_MAX + 1];
    uint64_t xfer;
    bool started;                /* the agent opened it */
    bool stop_owed;              /* stopped before it started: close it when it does */
    char reply_to[REPLY_TO_MAX]; /* the start's reply, "" once sent */
    char root[SP_FSPATH_MAX + 1];
    bool recursive;
    char corr[129];
    int64_t lease_ns, call_ns;
    uint64_t seq;
    double tokens;
    int64_t refill_ns;
    uint64_t dropped, refused; /* over the rate; paths outside root */
    wk_watch_t *next;
};

/* ---- the box's watches (box->mu held) ---- */

static wk_watch_t *by_id(wk_box_t *b, const char *id)
{
    for (wk_watch_t *x = b->watches; x; x = x->next)
        if (strcmp(x->id, id) == 0 && !x->stop_owed)
            return x;
    return NULL;
}

static wk_watch_t *by_xfer(wk_box_t *b, uint64_t xfer)
{
    for (wk_watch_t *x = b->watches; x; x = x->next)
        if (x->xfer == xfer)
            return x;
    return NULL;
}

static void unlink_watch(wk_box_t *b, wk_watch_t *x)
{
    for (wk_watch_t **pp = &b->watches; *pp; pp = &(*pp)->next) {
        if (*pp == x) {
            *pp = x->next;
            b->n_watches--;
            return;
        }
    }
}

/* ---- replies and publishing ---- */

static void reply(wk_t *w, const char *to, const char *error, const char *detail)
{
    Space__Io__V1__WatchReply r = SPACE__IO__V1__WATCH_REPLY__INIT;
    uint8_t buf[1024];
    r.ok = error == NULL;
    r.error = (char *)(error ? error : "");
    r.detail = (char *)(detail ? detail : "");
    size_t len = space__io__v1__watch_reply__get_packed_size(&r);
    if (!to || !to[0] || len > sizeof(buf))
        return;
    space__io__v1__watch_reply__pack(&r, buf);
    int rc = sp_bus_publish_core(w->bus, to, buf, len);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "watch reply not sent", SP_KS("error", sp_strerror(rc)));
}

static void publish(wk_t *w, const char *id, const char *kind, const ProtobufCMessage *m)
{
    char subject[128];
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = sp_xmalloc(len ? len : 1);
    protobuf_c_message_pack(m, buf);
    int rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_WATCH_EV, id, kind, NULL);
    if (rc >= 0)
        rc = sp_bus_publish_core(w->bus, subject, buf, len);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "data plane publish failed", SP_KS("watch", id),
               SP_KS("error", sp_strerror(rc)));
    free(buf);
}

static void publish_end(wk_t *w, const wk_watch_t *x, const char *error, const char *detail)
{
    Space__Io__V1__WatchEnd e = SPACE__IO__V1__WATCH_END__INIT;
    e.watch_id = (char *)x->id;
    e.error = (char *)error;
    e.detail = (char *)detail;
    e.last_seq = x->seq;
    publish(w, x->id, "end", &e.base);
}

/* The reply code of an agent refusal (agent.proto FileFailed codes). */
static const char *refusal(const char *code)
{
    static const char *const same[] = {"not_found", "not_directory", "permission", "bad_path"};
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++)
        if (strcmp(code, same[i]) == 0)
            return same[i];
    return strcmp(code, "busy") == 0 ? "too_many_watches" : "agent_error";
}

/* Asks the agent to close x's transfer; forgets it when that cannot be sent. */
static void close_on_agent(wk_agent_t *agent, uint64_t xfer)
{
    Space__Agent__V1__FileRequest r = SPACE__AGENT__V1__FILE_REQUEST__INIT;
    r.xfer_id = xfer;
    r.op = SPACE__AGENT__V1__FILE_OP__FILE_OP_CLOSE;
    r.path = "";
    r.to = "";
    if (wk_agent_file_request(agent, &r) < 0)
        wk_agent_file_release(agent, xfer);
}

/* ---- agent callbacks (the box's reader thread) ---- */

static void on_watch_started(void *arg, uint64_t xfer)
{
    wk_box_t *b = arg;
    char to[REPLY_TO_MAX] = "";
    pthread_mutex_lock(&b->mu);
    wk_watch_t *x = by_xfer(b, xfer);
    wk_agent_t *agent = b->agent;
    bool close = x && x->stop_owed;
    if (x) {
        x->started = true;
        snprintf(to, sizeof(to), "%s", x->reply_to);
        x->reply_to[0] = '\0';
        if (close)
            unlink_watch(b, x);
    }
    pthread_mutex_unlock(&b->mu);
    if (close) {
        close_on_agent(agent, xfer);
        free(x);
        return;
    }
    if (to[0])
        reply(b->w, to, NULL, NULL);
}

static void on_watch_ended(void *arg, uint64_t xfer, const char *code, const char *message)
{
    wk_box_t *b = arg;
    char to[REPLY_TO_MAX] = "";
    pthread_mutex_lock(&b->mu);
    wk_watch_t *x = by_xfer(b, xfer);
    if (x) {
        unlink_watch(b, x);
        snprintf(to, sizeof(to), "%s", x->reply_to);
    }
    pthread_mutex_unlock(&b->mu);
    if (!x)
        return;
    if (to[0])
        reply(b->w, to, refusal(code), message);
    else if (!x->stop_owed)
        publish_end(b->w, x, strcmp(code, "not_found") == 0 ? "not_found" : "agent_error", message);
    if (x->started)
        sp_log(SP_LOG_INFO, "watch ended by the agent", SP_KS("sandbox", b->id),
               SP_KS("watch", x->id), SP_KS("error", message), SP_KS("corr", x->corr));
    free(x);
}

static const char *type_name(Space__Agent__V1__WatchEventType t)
{
    switch (t) {
    case SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_CREATE:
        return "create";
    case SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_WRITE:
        return "write";
    case SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_REMOVE:
        return "remove";
    case SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_RENAME:
        return "rename";
    case SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_CHMOD:
        return "chmod";
    default:
        return "overflow";
    }
}

static void on_watch_events(void *arg, uint64_t xfer, Space__Agent__V1__WatchEvent **events,
                            size_t n)
{
    wk_box_t *b = arg;
    Space__Io__V1__WatchEvent *evs = sp_xcalloc(n + 1, sizeof(*evs));
    Space__Io__V1__WatchEvent **ptrs = sp_xcalloc(n + 1, sizeof(Space__Io__V1__WatchEvent *));
    Space__Io__V1__WatchBatch batch = SPACE__IO__V1__WATCH_BATCH__INIT;
    char id[SP_ID_MAX + 1], root[SP_FSPATH_MAX + 1];
    size_t k = 0;

    pthread_mutex_lock(&b->mu);
    wk_watch_t *x = by_xfer(b, xfer);
    if (!x || !x->started || x->stop_owed) {
        pthread_mutex_unlock(&b->mu);
        goto out;
    }
    int64_t now = sp_mono_ns();
    x->tokens += (double)(now - x->refill_ns) * RATE / 1e9;
    if (x->tokens > BURST)
        x->tokens = BURST;
    x->refill_ns = now;
    snprintf(id, sizeof(id), "%s", x->id);
    snprintf(root, sizeof(root), "%s", x->root);
    for (size_t i = 0; i < n; i++) {
        bool overflow = events[i]->type == SPACE__AGENT__V1__WATCH_EVENT_TYPE__WATCH_EVENT_OVERFLOW;
        if (!overflow &&
            (!sp_fspath_canonical(events[i]->path) || !sp_fspath_within(events[i]->path, root))) {
            x->refused++;
            continue;
        }
        if (!overflow && x->tokens < 1.0) {
            x->dropped++;
            overflow = true;
        } else if (!overflow) {
            x->tokens -= 1.0;
        }
        if (overflow && k > 0 && strcmp(evs[k - 1].type, "overflow") == 0)
            continue; /* one per run of losses */
        space__io__v1__watch_event__init(&evs[k]);
        evs[k].path = overflow ? root : events[i]->path;
        evs[k].type = (char *)(overflow ? "overflow" : type_name(events[i]->type));
        ptrs[k] = &evs[k];
        k++;
    }
    if (k > 0)
        batch.seq = ++x->seq;
    pthread_mutex_unlock(&b->mu);
    if (k == 0)
        goto out;
    batch.watch_id = id;
    batch.events = ptrs;
    batch.n_events = k;
    publish(b->w, id, "ev", &batch.base);
out:
    free(evs);
    free(ptrs);
}

void wk_watch_callbacks(wk_agent_callbacks_t *cb)
{
    cb->on_watch_started = on_watch_started;
    cb->on_watch_events = on_watch_events;
    cb->on_watch_ended = on_watch_ended;
}

void wk_box_fail_watches(wk_box_t *b, const char *error)
{
    pthread_mutex_lock(&b->mu);
    wk_watch_t *list = b->watches;
    b->watches = NULL;
    b->n_watches = 0;
    pthread_mutex_unlock(&b->mu);
    while (list) {
        wk_watch_t *next = list->next;
        if (list->reply_to[0])
            reply(b->w, list->reply_to, "agent_unavailable", error);
        else if (!list->stop_owed)
            publish_end(b->w, list, "agent_unavailable", error);
        free(list);
        list = next;
    }
}

void wk_box_reap_watches(wk_box_t *b)
{
    int64_t now = sp_mono_ns();
    wk_watch_t *expired = NULL;
    pthread_mutex_lock(&b->mu);
    wk_agent_t *agent = b->agent_lost ? NULL : b->agent;
    for (wk_watch_t **pp = &b->watches; *pp;) {
        wk_watch_t *x = *pp;
        if (x->started && !x->stop_owed && now > x->lease_ns) {
            *pp = x->next;
            b->n_watches--;
            x->next = expired;
            expired = x;
            continue;
        }
        if (!x->started && x->reply_to[0] && now - x->call_ns > (int64_t)STUCK_MS * 1000000) {
            /* Answered now; closed if the agent opens it after all. */
            reply(b->w, x->reply_to, "agent_error", "the agent did not answer in time");
            x->reply_to[0] = '\0';
            x->stop_owed = true;
        }
        pp = &x->next;
    }
    pthread_mutex_unlock(&b->mu);
    while (expired) {
        wk_watch_t *next = expired->next;
        sp_log(SP_LOG_INFO, "watch lease expired", SP_KS("sandbox", b->id),
               SP_KS("watch", expired->id), SP_KS("corr", expired->corr));
        if (agent)
            close_on_agent(agent, expired->xfer);
        publish_end(b->w, expired, "expired", "the watch was not renewed");
        free(expired);
        expired = next;
    }
}

/* ---- calls (a cnats thread) ---- */

static void call_start(wk_box_t *b, wk_agent_t *agent, const call_t *q, const char *reply_to)
{
    const char *err = NULL;
    char detail[DETAIL_MAX] = "";
    uint64_t xfer = 0;

    pthread_mutex_lock(&b->mu);
    if (by_id(b, q->watch_id)) {
        err = "bad_request";
        snprintf(detail, sizeof(detail), "watch %s exists", q->watch_id);
    } else if (b->n_watches >= WK_WATCH_MAX) {
        err = "too_many_watches";
        snprintf(detail, sizeof(detail), "%d directories are watched in this sandbox already",
                 WK_WATCH_MAX);
    } else {
        int rc = wk_agent_file_reserve(agent, &xfer);
        if (rc < 0) {
            err = rc == -EBUSY ? "too_many_watches" : "agent_unavailable";
            snprintf(detail, sizeof(detail), "%s", sp_strerror(rc));
        }
    }
    if (!err) {
        wk_watch_t *x = sp_xcalloc(1, sizeof(*x));
        snprintf(x->id, sizeof(x->id), "%s", q->watch_id);
        x->xfer = xfer;
        snprintf(x->reply_to, sizeof(x->reply_to), "%s", reply_to);
        snprintf(x->root, sizeof(x->root), "%s", q->path);
        x->recursive = q->recursive;
        snprintf(x->corr, sizeof(x->corr), "%s", q->correlation_id);
        x->call_ns = x->refill_ns = sp_mono_ns();
        x->lease_ns = x->call_ns + (int64_t)LEASE_MS * 1000000;
        x->tokens = BURST;
        x->next = b->watches;
        b->watches = x;
        b->n_watches++;
    }
    pthread_mutex_unlock(&b->mu);
    if (err) {
        reply(b->w, reply_to, err, detail);
        return;
    }
    Space__Agent__V1__FileRequest r = SPACE__AGENT__V1__FILE_REQUEST__INIT;
    r.xfer_id = xfer;
    r.op = SPACE__AGENT__V1__FILE_OP__FILE_OP_WATCH;
    r.path = q->path;
    r.to = "";
    r.recursive = q->recursive;
    int rc = wk_agent_file_request(agent, &r);
    if (rc < 0) {
        pthread_mutex_lock(&b->mu);
        wk_watch_t *x = by_xfer(b, xfer);
        if (x && x->reply_to[0])
            unlink_watch(b, x);
        else
            x = NULL; /* answered meanwhile (the channel was lost) */
        pthread_mutex_unlock(&b->mu);
        wk_agent_file_release(agent, xfer);
        if (x) {
            reply(b->w, reply_to, "agent_unavailable", sp_strerror(rc));
            free(x);
        }
        return;
    }
    sp_log(SP_LOG_INFO, "watch requested", SP_KS("sandbox", b->id), SP_KS("watch", q->watch_id),
           SP_KS("path", q->path), SP_KI("recursive", q->recursive),
           SP_KS("corr", q->correlation_id));
}

static void call_stop(wk_box_t *b, wk_agent_t *agent, const call_t *q, const char *reply_to)
{
    char start_to[REPLY_TO_MAX] = "";
    uint64_t xfer = 0;
    pthread_mutex_lock(&b->mu);
    wk_watch_t *x = by_id(b, q->watch_id);
    if (x && x->started) {
        unlink_watch(b, x);
        xfer = x->xfer;
    } else if (x) {
        /* The agent has not answered its start: closed when it does. */
        x->stop_owed = true;
        snprintf(start_to, sizeof(start_to), "%s", x->reply_to);
        x->reply_to[0] = '\0';
        x = NULL;
    }
    pthread_mutex_unlock(&b->mu);
    if (start_to[0])
        reply(b->w, start_to, "unknown_watch", "stopped before it started");
    if (x) {
        close_on_agent(agent, xfer);
        free(x);
    }
    reply(b->w, reply_to, NULL, NULL);
}

static void call_renew(wk_box_t *b, const call_t *q, const char *reply_to)
{
    pthread_mutex_lock(&b->mu);
    wk_watch_t *x = by_id(b, q->watch_id);
    if (x)
        x->lease_ns = sp_mono_ns() + (int64_t)LEASE_MS * 1000000;
    pthread_mutex_unlock(&b->mu);
    if (x)
        reply(b->w, reply_to, NULL, NULL);
    else
        reply(b->w, reply_to, "unknown_watch", "no such watch (it ended)");
}

static const char *check(const call_t *q, char *detail, size_t dlen)
{
    if (!sp_id_valid(q->sandbox) || !sp_id_valid(q->tenant) || !sp_id_valid(q->watch_id)) {
        snprintf(detail, dlen, "sandbox, tenant and watch_id must be ids");
        return "bad_request";
    }
    if (strlen(q->correlation_id) > 128) {
        snprintf(detail, dlen, "correlation_id too long");
        return "bad_request";
    }
    if (strcmp(q->op, "start") == 0) {
        if (!sp_fspath_canonical(q->path)) {
            snprintf(detail, dlen, "path: not an absolute normalised path");
            return "bad_path";
        }
        return NULL;
    }
    if (strcmp(q->op, "stop") == 0 || strcmp(q->op, "renew") == 0)
        return NULL;
    snprintf(detail, dlen, "op must be start, stop or renew");
    return "bad_request";
}

static void watch_call(void *arg, const char *subject, const char *reply_to, const uint8_t *data,
                       size_t len)
{
    wk_t *w = arg;
    char detail[DETAIL_MAX] = "";
    (void)subject;

    if (!reply_to || !reply_to[0] || strlen(reply_to) >= REPLY_TO_MAX)
        return;
    call_t *q = len <= CALL_MAX ? space__io__v1__watch_call__unpack(NULL, len, data) : NULL;
    if (!q) {
        reply(w, reply_to, "bad_request", "not a WatchCall");
        return;
    }
    const char *err = check(q, detail, sizeof(detail));
    wk_box_t *b = err ? NULL : wk_owned_get(w, q->sandbox);
    if (!err && (!b || strcmp(b->tenant, q->tenant) != 0)) {
        err = "sandbox_not_running";
        snprintf(detail, sizeof(detail), "no running sandbox %s on worker %s", q->sandbox,
                 w->cfg->id);
    }
    wk_agent_t *agent = NULL;
    if (!err) {
        pthread_mutex_lock(&b->mu);
        if (!b->agent || b->agent_lost) {
            err = "agent_unavailable";
            snprintf(detail, sizeof(detail), "%s",
                     b->agent_lost ? "the agent channel was lost" : "no agent channel");
        } else {
            agent = b->agent;
        }
        pthread_mutex_unlock(&b->mu);
    }
    if (err)
        reply(w, reply_to, err, detail);
    else if (strcmp(q->op, "start") == 0)
        call_start(b, agent, q, reply_to);
    else if (strcmp(q->op, "stop") == 0)
        call_stop(b, agent, q, reply_to);
    else
        call_renew(b, q, reply_to);
    wk_box_put(b);
    space__io__v1__watch_call__free_unpacked(q, NULL);
}

/* The subscription's callback: acts only on a request that wk_request_open lets through. */
static void on_watch_call(void *arg, const char *subject, const char *reply_to, const uint8_t *data,
                          size_t len)
{
    sp_request_t rq;
    if (wk_request_open(arg, subject, reply_to, data, len, &rq))
        watch_call(arg, subject, reply_to, rq.body, rq.len);
    sp_request_dispose(&rq);
}

int wk_watches_start(wk_t *w)
{
    char subject[128];
    int rc = sp_subject_build(subject, sizeof(subject), SP_SUBJ_IO_WATCH, w->cfg->id, NULL, NULL);
    if (rc >= 0)
        rc = sp_bus_subscribe(w->bus, subject, NULL, on_watch_call, w, &w->watch_sub);
    if (rc < 0)
        sp_log(SP_LOG_ERROR, "cannot subscribe to watch calls", SP_KS("error", sp_strerror(rc)));
    return rc;
}

void wk_watches_stop(wk_t *w)
{
    sp_bus_unsubscribe(w->watch_sub);
    w->watch_sub = NULL;
}
