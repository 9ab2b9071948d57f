/* The bus over cnats / JetStream (bus.h).
 *
 * Acknowledgement: consumers use AckPolicy explicit, not AckAll. sp_bus_batch_ack sends a
 * plain ack (a publish, no reply awaited) for every message but the last and a synchronous
 * ack for the last one: the acks leave in one write, and the server handles one connection's
 * acks in order, so the reply to the last one means every ack of the batch was applied. One
 * round trip per batch, as with AckAll, but a batch freed without acking is still redelivered
 * even after a later batch was acked, which AckAll would silently ack along with it.
 *
 * Fetch: one pull request with no_wait and expires. nats-server 2.9 treats that pair as a
 * one-shot request: it waits up to expires for the first message, then returns what is
 * available at once (status 408 ends it) instead of holding the request until the batch is
 * full. That is what natsSubscription_Fetch sends too; natsSubscription_FetchRequest is used
 * to add max_bytes, so a batch of large messages stays bounded in memory.
 */
#include "bus.h"
#include "bus_int.h"
#include "checkpoint.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nats/nats.h>

#include "error.h"
#include "ids.h"
#include "log.h"
#include "natsauth.h"
#include "sign.h"
#include "xmalloc.h"

#define DEFAULT_TIMEOUT_MS    5000
#define DEFAULT_DUP_WINDOW_MS ((int64_t)2 * 60 * 1000)
#define DEFAULT_ACK_WAIT_MS   30000
#define RECONNECT_WAIT_MS     250
#define RECONNECT_BUF_BYTES   (8 * 1024 * 1024)
#define CONNECT_RETRY_MS      100
#define BUS_ERR_LOG_EVERY_MS  1000
#define NKEY_AUTH_RETRIES     3
#define ASYNC_MAX_PENDING     4096
/* The wait for the server's answer to a batch's last ack. An answer lost across a nats-server
 * restart (a known JetStream behaviour, nats-server#6392) would otherwise hold the caller for
 * the bus's whole timeout: the event log stored nothing for 30 s after each restart and ignored
 * SIGTERM that long. An ack not answered in time is the caller's warning; the messages come
 * again and are filtered by the caller (the event log's head). */
#define ACK_REPLY_WAIT_MS 2000
/* A batch is at most this many messages and bytes, so one fetch has a bounded footprint; the
 * consumer's MaxAckPending is set above it so a full batch is never held back. */
#define FETCH_MAX_MSGS    4096
#define FETCH_MAX_BYTES   ((int64_t)64 * 1024 * 1024)
#define MAX_ACK_PENDING   20000
#define FETCH_MIN_WAIT_MS 20
/* A pushed durable (sp_bus_consumer_push): its idle heartbeat, which flow control requires and
 * which also carries a flow-control answer the server still waits for. */
#define PUSH_HEARTBEAT_MS 5000

struct sp_bus_consumer {
    sp_bus_t *bus;
    natsSubscription *sub;
    int ack_wait_ms; /* the durable's, as the server has it */
    bool push;       /* delivered into our inbox, acknowledged as a prefix (ack policy all) */
    /* Batches not yet freed: their messages need the subscription to be acked, so a consumer
     * freed before them is only unsubscribed and is destroyed with its last batch. */
    size_t live_batches;
    bool freed;
    /* Pushed: the ack sp_bus_batch_ack_deferred holds back (the reply subject of the last
     * message of the newest stored batch; NULL: none), the messages it covers and when the
     * first of them was held. */
    char *ack_reply;
    size_t ack_msgs;
    int64_t ack_since_ms;
};

/* The public view of a message beside the cnats message it borrows from. */
typedef struct {
    sp_bus_msg_t pub;
    natsMsg *msg;
} batch_entry_t;

struct sp_bus_batch {
    sp_bus_consumer_t *consumer;
    batch_entry_t *e;
    size_t n;
    uint64_t pending; /* the server's count after the last message (sp_bus_batch_pending) */
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Maps a cnats status (and the JetStream error code, when the server sent one) to our codes
 * and logs the cnats error text at debug. cnats error texts carry neither the URL nor the
 * credentials, and nothing here logs the options. */
int sp__bus_status(natsStatus s, jsErrCode jerr, const char *what)
{
    int rc;

    if (s == NATS_OK)
        return 0;
    if (jerr == JSStreamNotFoundErr || jerr == JSConsumerNotFoundErr ||
        jerr == JSNoMessageFoundErr || s == NATS_NOT_FOUND)
        rc = SP_ENOTFOUND;
    else if (s == NATS_TIMEOUT)
        rc = SP_ETIMEOUT;
    else if (s == NATS_NO_MEMORY)
        rc = -ENOMEM;
    else if (s == NATS_INVALID_ARG || s == NATS_INVALID_SUBJECT || s == NATS_INVALID_TIMEOUT)
        rc = -EINVAL;
    else if (s == NATS_MAX_PAYLOAD)
        rc = SP_ETOOBIG;
    else
        rc = SP_EBUS;
    sp_log(SP_LOG_DEBUG, "bus call failed", SP_KS("call", what),
           SP_KS("status", natsStatus_GetText(s)), SP_KI("js_err", jerr),
           SP_KS("error", nats_GetLastError(NULL)));
    return rc;
}

/* Runs on a cnats thread for every async publish the server refused (or that had no
 * responder); cnats destroys pae->Msg afterwards. */
static void on_async_pub_err(jsCtx *js, jsPubAckErr *pae, void *closure)
{
    sp_bus_t *bus = closure;

    atomic_fetch_add(&bus->async_failed, 1);
    sp_log(SP_LOG_DEBUG, "bus async publish failed",
           SP_KS("subject", pae->Msg ? natsMsg_GetSubject(pae->Msg) : NULL),
           SP_KS("status", natsStatus_GetText(pae->Err)), SP_KI("js_err", pae->ErrCode),
           SP_KS("error", pae->ErrText));
}

/* What the server reported about this process's connections, process-wide: cnats calls
 * on_async_error on its own thread, possibly after the sp_bus_t it came from is freed. */
static atomic_uint_fast64_t bus_refusals;
static pthread_mutex_t bus_err_mu = PTHREAD_MUTEX_INITIALIZER;
static char bus_last_refusal[256];
static int64_t bus_err_logged_ms = -BUS_ERR_LOG_EVERY_MS;
static uint64_t bus_err_quiet; /* not logged since the last line */

/* A permission refusal (a publish or subscription outside the identity's permissions), a
 * slow consumer (messages dropped for a subscription that did not keep up) or another
 * asynchronous error: counted, logged at most once a second. Without it cnats drops them
 * silently, and a refused request looks like a timeout. */
static void on_async_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    (void)closure;
    const char *last = NULL;
    char text[256];
    (void)natsConnection_GetLastError(nc, &last);
    snprintf(text, sizeof(text), "%s", last ? last : ""); /* cnats may write it again */
    const char *subject = sub ? natsSubscription_GetSubject(sub) : NULL;
    pthread_mutex_lock(&bus_err_mu);
    if (err == NATS_NOT_PERMITTED) {
        atomic_fetch_add(&bus_refusals, 1);
        snprintf(bus_last_refusal, sizeof(bus_last_refusal), "%s", text);
    }
    int64_t now = mono_ms();
    bool log = now - bus_err_logged_ms >= BUS_ERR_LOG_EVERY_MS;
    uint64_t quiet = bus_err_quiet;
    if (log) {
        bus_err_logged_ms = now;
        bus_err_quiet = 0;
    } else {
        bus_err_quiet++;
    }
    pthread_mutex_unlock(&bus_err_mu);
    if (log)
        sp_log(SP_LOG_WARN,
               err == NATS_NOT_PERMITTED   ? "the NATS server refused a publish or subscription"
               : err == NATS_SLOW_CONSUMER ? "a NATS subscription fell behind: messages dropped"
                                           : "NATS reported an error",
               SP_KS("status", natsStatus_GetText(err)), SP_KS("error", text),
               SP_KS("subscription", subject), SP_KU("unlogged_before", quiet));
}

uint64_t sp_bus_refusals(char *last, size_t len)
{
    pthread_mutex_lock(&bus_err_mu);
    uint64_t n = atomic_load(&bus_refusals);
    if (last && len)
        snprintf(last, len, "%s", bus_last_refusal);
    pthread_mutex_unlock(&bus_err_mu);
    return n;
}

/* Runs on a cnats thread after each reconnection. */
static void on_reconnected(natsConnection *nc, void *closure)
{
    sp_bus_t *bus = closure;

    (void)nc;
    atomic_fetch_add(&bus->reconnects, 1);
}

uint64_t sp_bus_reconnects(sp_bus_t *bus)
{
    return bus ? atomic_load(&bus->reconnects) : 0;
}

/* Signs the server's nonce with the NKey seed through OpenSSL (sign.h), so the seed file is
 * read by one parser of ours, which refuses a file others can read, and is in memory only
 * for the signature. Runs on the connecting thread; cnats frees *ret_sig. */
static natsStatus sign_nonce(char **ret_err, unsigned char **ret_sig, int *ret_len,
                             const char *nonce, void *closure)
{
    sp_bus_t *bus = closure;
    sp_sign_key_t *k = NULL;
    uint8_t seed[32];
    unsigned char *sig;
    int rc;

    (void)ret_err;
    rc = sp_nkey_seed_load(bus->nkey_seed_file, seed);
    if (rc == 0)
        rc = sp_sign_key_from_raw(seed, &k);
    explicit_bzero(seed, sizeof(seed));
    if (rc < 0)
        return NATS_ERR;
    sig = malloc(SP_SIG_LEN);
    if (!sig || sp_sign(k, nonce, strlen(nonce), sig) < 0) {
        free(sig);
        sp_sign_key_free(k);
        return NATS_ERR;
    }
    sp_sign_key_free(k);
    *ret_sig = sig;
    *ret_len = SP_SIG_LEN;
    return NATS_OK;
}

/* A comma-separated URL list becomes the server list (natsOptions_SetURL takes one URL). */
static natsStatus set_servers(natsOptions *o, const char *urls)
{
    char *copy = sp_xstrdup(urls);
    const char **list = NULL;
    int n = 0;
    natsStatus s;

    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (*tok == '\0')
            continue;
        list = sp_xreallocarray(list, (size_t)n + 1, sizeof(*list));
        list[n++] = tok;
    }
    s = n > 0 ? natsOptions_SetServers(o, list, n) : NATS_INVALID_ARG;
    free(list);
    free(copy);
    return s;
}

int sp_bus_connect(const sp_bus_opts_t *opts, sp_bus_t **ret_bus)
{
    natsOptions *no = NULL;
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    sp_bus_t *bus = NULL;
    jsOptions jo;
    int64_t deadline;
    natsStatus s;
    int rc;

    if (!opts || !opts->url || !ret_bus || opts->timeout_ms < 0 || opts->dup_window_ms < 0 ||
        opts->stream_replicas < 0 || opts->stream_replicas > SP_BUS_REPLICAS_MAX)
        return -EINVAL;

    bus = sp_xcalloc(1, sizeof(*bus));
    bus->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
    bus->dup_window_ms = opts->dup_window_ms > 0 ? opts->dup_window_ms : DEFAULT_DUP_WINDOW_MS;
    bus->stream_max_age_s =
        opts->stream_max_age_s != 0 ? opts->stream_max_age_s : SP_BUS_STREAM_MAX_AGE_S;
    bus->stream_max_bytes =
        opts->stream_max_bytes != 0 ? opts->stream_max_bytes : SP_BUS_STREAM_MAX_BYTES;
    bus->stream_replicas = opts->stream_replicas > 0 ? opts->stream_replicas : 1;
    atomic_init(&bus->async_failed, 0);
    atomic_init(&bus->reconnects, 0);

    s = natsOptions_Create(&no);
    if (s == NATS_OK)
        s = set_servers(no, opts->url);
    if (s == NATS_OK && opts->name)
        s = natsOptions_SetName(no, opts->name);
    if (s == NATS_OK && opts->user)
        s = natsOptions_SetUserInfo(no, opts->user, opts->password);
    if (s == NATS_OK && opts->nkey && opts->nkey_seed_file) {
        bus->nkey_seed_file = sp_xstrdup(opts->nkey_seed_file);
        s = natsOptions_SetNKey(no, opts->nkey, sign_nonce, bus);
    }
    if (s == NATS_OK && opts->inbox_prefix)
        s = natsOptions_SetCustomInboxPrefix(no, opts->inbox_prefix);
    bus->inbox_prefix = sp_xstrdup(opts->inbox_prefix ? opts->inbox_prefix : "_INBOX");
    /* Reconnect forever: the daemons outlive a nats-server restart. */
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(no, -1);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(no, RECONNECT_WAIT_MS);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectBufSize(no, RECONNECT_BUF_BYTES);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(no, on_reconnected, bus);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(no, on_async_error, NULL);
    if (s == NATS_OK && opts->send_asap)
        s = natsOptions_SetSendAsap(no, true);
    if (s != NATS_OK) {
        rc = sp__bus_status(s, 0, "natsOptions");
        goto out;
    }

    /* The initial connect is retried: at boot nats-server may not be listening yet. Each
     * attempt gets what is left of the budget, so the whole call ends near timeout_ms. */
    deadline = mono_ms() + bus->timeout_ms;
    int auth_retries = opts->nkey ? NKEY_AUTH_RETRIES : 0;
    for (;;) {
        int64_t left = deadline - mono_ms();
        natsOptions_SetTimeout(no, left > 0 ? left : 1);
        s = natsConnection_Connect(&nc, no);
        if (s == NATS_OK)
            break;
        bool transient = s == NATS_NO_SERVER || s == NATS_TIMEOUT || s == NATS_IO_ERROR ||
                         s == NATS_CONNECTION_CLOSED || s == NATS_STALE_CONNECTION;
        /* cnats 3.4.1 against nats-server 2.9.10 sends, about once in a hundred NKey
         * connects, a CONNECT without the nonce signature (seen in the server's trace in
         * tests/unit/lib/test_natsauth.c), which the server refuses: asked again, a few times,
         * before a refusal counts as one. */
        if (s == NATS_CONNECTION_AUTH_FAILED && auth_retries > 0) {
            auth_retries--;
            transient = true;
        }
        if (!transient || mono_ms() + CONNECT_RETRY_MS >= deadline) {
            rc = sp__bus_status(s, 0, "natsConnection_Connect");
            if (transient)
                rc = SP_ETIMEOUT;
            goto out;
        }
        nanosleep(&(struct timespec){.tv_nsec = CONNECT_RETRY_MS * 1000000L}, NULL);
    }

    jsOptions_Init(&jo);
    jo.Wait = bus->timeout_ms;
    /* Bounded pipelining: past MaxPending in flight, a publish waits (up to StallWait) for
     * acks instead of queueing without limit. */
    jo.PublishAsync.MaxPending = ASYNC_MAX_PENDING;
    jo.PublishAsync.StallWait = bus->timeout_ms;
    jo.PublishAsync.ErrHandler = on_async_pub_err;
    jo.PublishAsync.ErrHandlerClosure = bus;
    s = natsConnection_JetStream(&js, nc, &jo);
    if (s != NATS_OK) {
        rc = sp__bus_status(s, 0, "natsConnection_JetStream");
        goto out;
    }

    bus->nc = nc;
    bus->js = js;
    nc = NULL;
    js = NULL;
    *ret_bus = bus;
    bus = NULL;
    rc = 0;
out:
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(no);
    if (bus) {
        free(bus->nkey_seed_file);
        free(bus->inbox_prefix);
    }
    free(bus);
    return rc;
}

void sp_bus_free(sp_bus_t *bus)
{
    jsPubOptions po;
    bool drained;

    if (!bus)
        return;
    jsPubOptions_Init(&po);
    po.MaxWait = bus->timeout_ms;
    drained = js_PublishAsyncComplete(bus->js, &po) == NATS_OK;
    if (!drained)
        sp_log(SP_LOG_DEBUG, "bus closed with async publishes unacknowledged");
    natsConnection_FlushTimeout(bus->nc, bus->timeout_ms);
    jsCtx_Destroy(bus->js);
    natsConnection_Close(bus->nc);
    natsConnection_Destroy(bus->nc);
    /* With publishes still pending, a late ack may be in on_async_pub_err on a cnats thread
     * while the connection closes, and cnats offers no way to wait for that thread: the few
     * bytes of bus are left to it rather than freed under it. */
    if (drained) {
        free(bus->nkey_seed_file);
        free(bus->inbox_prefix);
        free(bus);
    }
}

/* A stream the platform's integrity rests on: file storage, deny_delete and deny_purge (no
 * identity, the operator included, can remove a message through the JetStream API), limits as
 * given (0 / -1: none). */
typedef struct {
    const char *name, *subjects;
    int64_t max_age_s, max_bytes;
} stream_def_t;

static void stream_config(const sp_bus_t *bus, const stream_def_t *d, const char **subjects,
                          jsStreamConfig *cfg)
{
    jsStreamConfig_Init(cfg);
    subjects[0] = d->subjects;
    cfg->Name = d->name;
    cfg->Subjects = subjects;
    cfg->SubjectsLen = 1;
    cfg->Storage = js_FileStorage;
    cfg->Replicas = bus->stream_replicas;
    cfg->Retention = js_LimitsPolicy;
    /* Limits drop the oldest messages, which the event log stored long before (docs/audit.md:
     * a log behind by more than the limits loses what it had not stored, and records it); a
     * stream without limits refuses new messages rather than drop any should a server limit
     * be reached. */
    cfg->MaxAge = d->max_age_s > 0 ? d->max_age_s * 1000000000LL : 0;
    cfg->MaxMsgs = -1;
    cfg->MaxBytes = d->max_bytes > 0 ? d->max_bytes : -1;
    cfg->Discard = d->max_age_s > 0 || d->max_bytes > 0 ? js_DiscardOld : js_DiscardNew;
    cfg->MaxMsgSize = SP_BUS_MAX_MSG;
    cfg->Duplicates = bus->dup_window_ms * 1000000; /* nanoseconds */
    cfg->DenyDelete = true;
    cfg->DenyPurge = true;
}

static int ensure_stream_once(sp_bus_t *bus, const stream_def_t *d)
{
    jsStreamInfo *si = NULL;
    jsStreamConfig cfg;
    jsErrCode jerr = 0;
    const char *subjects[1];
    natsStatus s;

    s = js_GetStreamInfo(&si, bus->js, d->name, NULL, &jerr);
    jsStreamInfo_Destroy(si);
    si = NULL;
    if (s == NATS_OK)
        return 0;
    if (s != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr)
        return sp__bus_status(s, jerr, "js_GetStreamInfo");

    stream_config(bus, d, subjects, &cfg);
    jerr = 0;
    s = js_AddStream(&si, bus->js, &cfg, NULL, &jerr);
    jsStreamInfo_Destroy(si);
    /* Another daemon may have created it between our two calls. */
    if (s != NATS_OK && jerr == JSStreamNameExistErr)
        return 0;
    return sp__bus_status(s, jerr, "js_AddStream");
}

/* A daemon started together with nats-server can ask before JetStream answers (seen as a bus
 * failure at start-up, once in a few hundred starts here): asked again until the connection's
 * timeout. */
static int ensure_stream(sp_bus_t *bus, const stream_def_t *d)
{
    int64_t deadline = mono_ms() + bus->timeout_ms;
    int rc;
    while ((rc = ensure_stream_once(bus, d)) < 0 && (rc == SP_EBUS || rc == SP_ETIMEOUT) &&
           mono_ms() < deadline)
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    return rc;
}

static stream_def_t events_def(const sp_bus_t *bus)
{
    return (stream_def_t){.name = SP_BUS_STREAM,
                          .subjects = SP_BUS_SUBJECTS,
                          .max_age_s = bus->stream_max_age_s,
                          .max_bytes = bus->stream_max_bytes};
}

int sp_bus_ensure_stream(sp_bus_t *bus)
{
    stream_def_t d = events_def(bus);
    return ensure_stream(bus, &d);
}

int sp_bus_ensure_ckpt_stream(sp_bus_t *bus)
{
    /* The anchor: no limits. One line per checkpoint (~330 bytes, at most one per
     * checkpoint-ms while the log moves: ~6 MB a day at the 5 s default). */
    stream_def_t d = {.name = SP_CKPT_STREAM, .subjects = SP_CKPT_SUBJECTS};
    return ensure_stream(bus, &d);
}

int sp_bus_apply_stream_limits(sp_bus_t *bus, int *ret_changed)
{
    jsStreamInfo *si = NULL, *out = NULL;
    jsStreamConfig cfg;
    jsErrCode jerr = 0;
    const char *subjects[1];
    stream_def_t d = events_def(bus);
    natsStatus s;

    *ret_changed = 0;
    s = js_GetStreamInfo(&si, bus->js, SP_BUS_STREAM, NULL, &jerr);
    if (s != NATS_OK)
        return sp__bus_status(s, jerr, "js_GetStreamInfo");
    stream_config(bus, &d, subjects, &cfg);
    /* A stream made before deny_delete/deny_purge (docs/trust.md, "Upgrading a deployment
     * without credentials") gets them with the same update. */
    bool same = si->Config->MaxAge == cfg.MaxAge && si->Config->MaxBytes == cfg.MaxBytes &&
                si->Config->Discard == cfg.Discard && si->Config->Replicas == cfg.Replicas &&
                si->Config->DenyDelete && si->Config->DenyPurge;
    /* Keep what the stream was made with but the limits (an update cannot change storage). */
    cfg.Duplicates = si->Config->Duplicates;
    cfg.MaxMsgSize = si->Config->MaxMsgSize;
    jsStreamInfo_Destroy(si);
    if (same)
        return 0;
    jerr = 0;
    s = js_UpdateStream(&out, bus->js, &cfg, NULL, &jerr);
    jsStreamInfo_Destroy(out);
    if (s == NATS_OK)
        *ret_changed = 1;
    return sp__bus_status(s, jerr, "js_UpdateStream");
}

int sp_bus_stream_state(sp_bus_t *bus, const char *stream, sp_bus_stream_state_t *ret)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s;

    s = js_GetStreamInfo(&si, bus->js, stream, NULL, &jerr);
    if (s != NATS_OK)
        return sp__bus_status(s, jerr, "js_GetStreamInfo");
    ret->first_seq = si->State.FirstSeq;
    ret->last_seq = si->State.LastSeq;
    ret->msgs = si->State.Msgs;
    ret->max_age_s = si->Config->MaxAge / 1000000000LL;
    ret->max_bytes = si->Config->MaxBytes;
    jsStreamInfo_Destroy(si);
    return 0;
}

int sp_bus_stream_info(sp_bus_t *bus, uint64_t *ret_last_seq, uint64_t *ret_msgs)
{
    sp_bus_stream_state_t st = {0};
    int rc = sp_bus_stream_state(bus, SP_BUS_STREAM, &st);

    if (rc < 0)
        return rc;
    if (ret_last_seq)
        *ret_last_seq = st.last_seq;
    if (ret_msgs)
        *ret_msgs = st.msgs;
    return 0;
}

static int new_msg(const char *subject, const void *data, size_t len, natsMsg **ret_msg)
{
    natsStatus s;

    if (!subject)
        return -EINVAL;
    if (len > (size_t)SP_BUS_MAX_MSG)
        return SP_ETOOBIG;
    s = natsMsg_Create(ret_msg, subject, NULL, data, (int)len);
    return sp__bus_status(s, 0, "natsMsg_Create");
}

int sp_bus_publish(sp_bus_t *bus, const char *subject, const void *data, size_t len,
                   const char *msg_id, uint64_t *ret_seq, int *ret_duplicate)
{
    natsMsg *msg = NULL;
    jsPubAck *pa = NULL;
    jsPubOptions po;
    jsErrCode jerr = 0;
    natsStatus s;
    int rc;

    rc = new_msg(subject, data, len, &msg);
    if (rc < 0)
        return rc;
    jsPubOptions_Init(&po);
    po.MsgId = msg_id;
    s = js_PublishMsg(&pa, bus->js, msg, &po, &jerr);
    rc = sp__bus_status(s, jerr, "js_PublishMsg");
    if (rc == 0) {
        if (ret_seq)
            *ret_seq = pa->Sequence;
        if (ret_duplicate)
            *ret_duplicate = pa->Duplicate ? 1 : 0;
    }
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(msg);
    return rc;
}

int sp_bus_publish_retry(sp_bus_t *bus, const char *subject, const void *data, size_t len,
                         const char *msg_id, int budget_ms, uint64_t *ret_seq)
{
    int64_t wait_ms = 50, deadline = mono_ms() + (budget_ms > 0 ? budget_ms : 0);
    int rc, tries = 0;

    if (!msg_id || !*msg_id)
        return -EINVAL;
    for (;;) {
        rc = sp_bus_publish(bus, subject, data, len, msg_id, ret_seq, NULL);
        tries++;
        if (rc == 0 || (rc != SP_EBUS && rc != SP_ETIMEOUT) || mono_ms() + wait_ms > deadline)
            break;
        if (tries == 1)
            sp_log(SP_LOG_WARN, "the bus failed a publish; trying again", SP_KS("subject", subject),
                   SP_KS("msg_id", msg_id), SP_KS("error", sp_strerror(rc)));
        nanosleep(&(struct timespec){.tv_sec = wait_ms / 1000,
                                     .tv_nsec = (long)(wait_ms % 1000) * 1000000},
                  NULL);
        wait_ms = wait_ms * 2 > 1000 ? 1000 : wait_ms * 2;
    }
    if (tries > 1)
        sp_log(rc == 0 ? SP_LOG_INFO : SP_LOG_WARN,
               rc == 0 ? "published after the bus came back" : "the bus stayed away: not published",
               SP_KS("subject", subject), SP_KS("msg_id", msg_id), SP_KI("tries", tries));
    return rc;
}

int sp_bus_publish_async(sp_bus_t *bus, const char *subject, const void *data, size_t len,
                         const char *msg_id)
{
    natsMsg *msg = NULL;
    jsPubOptions po;
    natsStatus s;
    int rc;

    rc = new_msg(subject, data, len, &msg);
    if (rc < 0)
        return rc;
    jsPubOptions_Init(&po);
    po.MsgId = msg_id;
    /* Its own ack timeout: an ack lost with a dropped connection fails it (the error handler
     * counts it) instead of staying pending forever. */
    po.MaxWait = bus->timeout_ms;
    s = js_PublishMsgAsync(bus->js, &msg, &po);
    /* On success cnats owns the message and has set msg to NULL. */
    natsMsg_Destroy(msg);
    return sp__bus_status(s, 0, "js_PublishMsgAsync");
}

int sp_bus_publish_async_complete(sp_bus_t *bus, int timeout_ms)
{
    jsPubOptions po;
    natsStatus s;

    jsPubOptions_Init(&po);
    po.MaxWait = timeout_ms > 0 ? timeout_ms : bus->timeout_ms;
    s = js_PublishAsyncComplete(bus->js, &po);
    if (s != NATS_OK) {
        /* Given up: what is still pending is dropped, so that it cannot hold up the next
         * wait; the caller publishes it again (with its message id, so the stream keeps one
         * copy). Before, publishes whose acks were lost in a reconnection stayed pending, and
         * every later wait timed out: a worker's command facts never reached the log. */
        natsMsgList pending = {0};
        if (js_PublishAsyncGetPendingList(&pending, bus->js) == NATS_OK)
            natsMsgList_Destroy(&pending);
        (void)atomic_exchange(&bus->async_failed, 0);
        return sp__bus_status(s, 0, "js_PublishAsyncComplete");
    }
    return atomic_exchange(&bus->async_failed, 0);
}

int sp_bus_publish_core(sp_bus_t *bus, const char *subject, const void *data, size_t len)
{
    natsStatus s;

    if (!subject)
        return -EINVAL;
    if (len > (size_t)SP_BUS_MAX_MSG)
        return SP_ETOOBIG;
    s = natsConnection_Publish(bus->nc, subject, data, (int)len);
    return sp__bus_status(s, 0, "natsConnection_Publish");
}

struct sp_bus_sub {
    natsSubscription *sub;
    sp_bus_msg_cb cb;
    void *arg;
};

static void on_core_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    sp_bus_sub_t *s = closure;
    (void)nc;
    (void)sub;
    s->cb(s->arg, natsMsg_GetSubject(msg), natsMsg_GetReply(msg),
          (const uint8_t *)natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg));
    natsMsg_Destroy(msg);
}

int sp_bus_subscribe(sp_bus_t *bus, const char *subject, const char *queue, sp_bus_msg_cb cb,
                     void *arg, sp_bus_sub_t **ret_sub)
{
    natsStatus s;
    if (!subject || !cb || !ret_sub)
        return -EINVAL;
    sp_bus_sub_t *sb = sp_xcalloc(1, sizeof(*sb));
    sb->cb = cb;
    sb->arg = arg;
    if (queue && *queue)
        s = natsConnection_QueueSubscribe(&sb->sub, bus->nc, subject, queue, on_core_msg, sb);
    else
        s = natsConnection_Subscribe(&sb->sub, bus->nc, subject, on_core_msg, sb);
    if (s == NATS_OK) {
        /* Bounded: a subscriber that cannot keep up loses messages (NATS slow consumer) rather
         * than growing without limit; data-plane users detect the gap by sequence numbers. */
        s = natsSubscription_SetPendingLimits(sb->sub, 65536, 256 * 1024 * 1024);
    }
    if (s != NATS_OK) {
        natsSubscription_Destroy(sb->sub);
        free(sb);
        return sp__bus_status(s, 0, "natsConnection_Subscribe");
    }
    *ret_sub = sb;
    return 0;
}

void sp_bus_unsubscribe(sp_bus_sub_t *s)
{
    if (!s)
        return;
    /* Drain: no new messages, the pending ones are handed to the callback, then the
     * subscription closes; waiting for that means no callback of it runs any more. If the
     * drain cannot start (connection closed), unsubscribing is all there is to do. */
    if (natsSubscription_Drain(s->sub) == NATS_OK)
        natsSubscription_WaitForDrainCompletion(s->sub, 5000);
    else
        natsSubscription_Unsubscribe(s->sub);
    natsSubscription_Destroy(s->sub);
    free(s);
}

int sp_bus_flush(sp_bus_t *bus, int timeout_ms)
{
    return sp__bus_status(natsConnection_FlushTimeout(bus->nc, timeout_ms > 0 ? timeout_ms : 5000),
                          0, "natsConnection_Flush");
}

int sp_bus_request(sp_bus_t *bus, const char *subject, const void *data, size_t len, int timeout_ms,
                   uint8_t **ret_data, size_t *ret_len)
{
    natsMsg *reply = NULL;
    if (!subject || !ret_data || !ret_len)
        return -EINVAL;
    if (len > (size_t)SP_BUS_MAX_MSG)
        return SP_ETOOBIG;
    natsStatus s = natsConnection_Request(&reply, bus->nc, subject, data, (int)len,
                                          timeout_ms > 0 ? timeout_ms : bus->timeout_ms);
    if (s != NATS_OK)
        return s == NATS_NO_RESPONDERS ? SP_ENOTFOUND
                                       : sp__bus_status(s, 0, "natsConnection_Request");
    size_t n = (size_t)natsMsg_GetDataLength(reply);
    uint8_t *copy = sp_xmalloc(n ? n : 1);
    if (n)
        memcpy(copy, natsMsg_GetData(reply), n);
    /* A reply may carry a secret (space-credstore's lookup): cnats' copy is wiped; the
     * caller wipes its own. */
    if (n)
        explicit_bzero((void *)natsMsg_GetData(reply), n);
    natsMsg_Destroy(reply);
    *ret_data = copy;
    *ret_len = n;
    return 0;
}

int sp_bus_consumer_delete(sp_bus_t *bus, const char *durable)
{
    jsErrCode jerr = 0;
    natsStatus s;

    if (!durable)
        return -EINVAL;
    s = js_DeleteConsumer(bus->js, SP_BUS_STREAM, durable, NULL, &jerr);
    return sp__bus_status(s, jerr, "js_DeleteConsumer");
}

/* Creates the durable through $JS.API.CONSUMER.CREATE.<stream>.<durable>.<filter>, the form
 * nats-server (2.9) checks against the request: the config's filter must be the subject's, so
 * a NATS permission on that subject (natsauth.c) lets an identity create its own durable and
 * no other one. cnats 3.4.1's js_AddConsumer sends $JS.API.CONSUMER.DURABLE.CREATE.<stream>.
 * <durable>, which carries no filter and is therefore granted to nobody but the event log and
 * the operator. The server accepts an identical configuration twice. */
/* deliver: NULL for a pull durable (acknowledged one by one), else the subject a pushed one
 * delivers to (acknowledged as a prefix, flow-controlled, at most max_inflight unacked). */
static int consumer_create(sp_bus_t *bus, const char *durable, const char *filter,
                           uint64_t start_seq, int ack_wait_ms, const char *deliver_to,
                           int max_inflight)
{
    char subject[512], *req, deliver[96] = "\"deliver_policy\":\"all\"", mode[320];
    natsMsg *reply = NULL;
    natsStatus s;
    int rc = 0;

    /* Both come from the contract (contract.c) or the caller's configuration: no quote,
     * backslash or space, which would break the JSON below or the subject. */
    if (strpbrk(durable, "\"\\ .*>") || strpbrk(filter, "\"\\ ") ||
        (deliver_to && strpbrk(deliver_to, "\"\\ *>")))
        return -EINVAL;
    if (deliver_to)
        snprintf(mode, sizeof(mode),
                 "\"deliver_subject\":\"%s\",\"ack_policy\":\"all\",\"flow_control\":true,"
                 "\"idle_heartbeat\":%lld",
                 deliver_to, (long long)PUSH_HEARTBEAT_MS * 1000000);
    else
        snprintf(mode, sizeof(mode), "\"ack_policy\":\"explicit\"");
    if ((size_t)snprintf(subject, sizeof(subject), "$JS.API.CONSUMER.CREATE.%s.%s.%s",
                         SP_BUS_STREAM, durable, filter) >= sizeof(subject))
        return -EINVAL;
    if (start_seq > 0)
        snprintf(deliver, sizeof(deliver),
                 "\"deliver_policy\":\"by_start_sequence\",\"opt_start_seq\":%llu",
                 (unsigned long long)start_seq);
    req = sp_xasprintf("{\"stream_name\":\"%s\",\"config\":{\"durable_name\":\"%s\","
                       "\"name\":\"%s\",\"filter_subject\":\"%s\",%s,%s,\"ack_wait\":%lld,"
                       "\"max_ack_pending\":%d,\"replay_policy\":\"instant\"}}",
                       SP_BUS_STREAM, durable, durable, filter, deliver, mode,
                       (long long)(ack_wait_ms > 0 ? ack_wait_ms : DEFAULT_ACK_WAIT_MS) * 1000000,
                       max_inflight);
    s = natsConnection_Request(&reply, bus->nc, subject, req, (int)strlen(req),
                               (int64_t)bus->timeout_ms);
    free(req);
    if (s != NATS_OK)
        return sp__bus_status(s, 0, "consumer create");
    /* {"type":"...consumer_create_response", "error":{"code":..,"err_code":..,...}} on failure;
     * a permission violation comes as an -ERR to the connection and a timeout here. */
    const char *data = natsMsg_GetData(reply);
    int n = natsMsg_GetDataLength(reply);
    if (!data || n <= 0 || memmem(data, (size_t)n, "\"error\"", 7)) {
        sp_log(SP_LOG_DEBUG, "consumer create refused", SP_KS("durable", durable),
               SP_KS("reply", data ? data : ""));
        rc = SP_EBUS;
    }
    natsMsg_Destroy(reply);
    return rc;
}

/* A pull subscription bound to the existing durable: cnats neither creates nor, on
 * unsubscribe, deletes it. cnats requires the subject to equal the consumer's filter. */
static int subscribe_bound(sp_bus_t *bus, const char *durable, const char *filter, int ack_wait_ms,
                           sp_bus_consumer_t **ret_consumer)
{
    jsSubOptions so;
    jsErrCode jerr = 0;
    natsSubscription *sub = NULL;
    natsStatus s;

    jsSubOptions_Init(&so);
    so.Stream = SP_BUS_STREAM;
    so.Consumer = durable;
    so.ManualAck = true;
    s = js_PullSubscribe(&sub, bus->js, filter, durable, NULL, &so, &jerr);
    if (s != NATS_OK)
        return sp__bus_status(s, jerr, "js_PullSubscribe");
    /* Each fetch is bounded (FETCH_MAX_MSGS, FETCH_MAX_BYTES); the default pending limits of
     * the subscription would only add a second, lossy bound (slow consumer drops). */
    natsSubscription_SetPendingLimits(sub, -1, -1);

    sp_bus_consumer_t *c = sp_xcalloc(1, sizeof(*c));
    c->bus = bus;
    c->sub = sub;
    c->ack_wait_ms = ack_wait_ms > 0 ? ack_wait_ms : DEFAULT_ACK_WAIT_MS;
    *ret_consumer = c;
    return 0;
}

int sp_bus_consumer_open(sp_bus_t *bus, const char *durable, const char *filter, uint64_t start_seq,
                         int ack_wait_ms, sp_bus_consumer_t **ret_consumer)
{
    int rc;

    if (!durable || !*durable || !ret_consumer || ack_wait_ms < 0)
        return -EINVAL;
    if (!filter || !*filter)
        filter = SP_BUS_SUBJECTS;

    /* Recreate rather than update: the caller's stored position is the truth, and whatever
     * the old durable had delivered or left pending must not leak into the new run. */
    rc = sp_bus_consumer_delete(bus, durable);
    if (rc < 0 && rc != SP_ENOTFOUND)
        return rc;

    if ((rc = consumer_create(bus, durable, filter, start_seq, ack_wait_ms, NULL,
                              MAX_ACK_PENDING)) < 0)
        return rc;
    return subscribe_bound(bus, durable, filter, ack_wait_ms, ret_consumer);
}

int sp_bus_consumer_push(sp_bus_t *bus, const char *durable, const char *filter, uint64_t start_seq,
                         int ack_wait_ms, size_t max_inflight, sp_bus_consumer_t **ret_consumer)
{
    natsSubscription *sub = NULL;
    char deliver[256], token[SP_UUID_STR_LEN + 1];
    natsStatus s;
    int rc;

    if (!durable || !*durable || !ret_consumer || ack_wait_ms < 0 || max_inflight == 0 ||
        max_inflight > MAX_ACK_PENDING)
        return -EINVAL;
    if (!filter || !*filter)
        filter = SP_BUS_SUBJECTS;
    /* In this identity's inbox, which only it may read (natsauth.c); a fresh name per open, so
     * a message pushed to the consumer this one replaces cannot land in this subscription. */
    sp_uuid7_str(token);
    if ((size_t)snprintf(deliver, sizeof(deliver), "%s.%s.%s", bus->inbox_prefix, durable, token) >=
        sizeof(deliver))
        return -EINVAL;
    /* Subscribed first: a durable with no interest does not deliver, so nothing is pushed
     * before anyone listens, and nothing pushed after is missed. */
    s = natsConnection_SubscribeSync(&sub, bus->nc, deliver);
    if (s != NATS_OK)
        return sp__bus_status(s, 0, "natsConnection_SubscribeSync");
    /* Bounded by the server instead: max_inflight unacknowledged messages and flow control's
     * bytes in flight; the client's own limit would only drop (a slow consumer). */
    natsSubscription_SetPendingLimits(sub, -1, -1);
    rc = sp_bus_consumer_delete(bus, durable);
    if (rc >= 0 || rc == SP_ENOTFOUND)
        rc = consumer_create(bus, durable, filter, start_seq, ack_wait_ms, deliver,
                             (int)max_inflight);
    if (rc < 0) {
        natsSubscription_Destroy(sub);
        return rc;
    }
    sp_bus_consumer_t *c = sp_xcalloc(1, sizeof(*c));
    c->bus = bus;
    c->sub = sub;
    c->push = true;
    c->ack_wait_ms = ack_wait_ms > 0 ? ack_wait_ms : DEFAULT_ACK_WAIT_MS;
    *ret_consumer = c;
    return 0;
}

int sp_bus_consumer_bind(sp_bus_t *bus, const char *durable, const char *filter, int ack_wait_ms,
                         sp_bus_consumer_t **ret_consumer)
{
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    natsStatus s;

    if (!durable || !*durable || !ret_consumer || ack_wait_ms < 0)
        return -EINVAL;
    if (!filter || !*filter)
        filter = SP_BUS_SUBJECTS;

    /* Deleted between the lookup and the subscription (by an operator, or by a daemon that
     * recreates its own): looked up again, a few times. */
    int rc = SP_ENOTFOUND;
    for (int attempt = 0; attempt < 3 && rc == SP_ENOTFOUND; attempt++) {
        jerr = 0;
        s = js_GetConsumerInfo(&ci, bus->js, SP_BUS_STREAM, durable, NULL, &jerr);
        if (s == NATS_OK) {
            int same = ci->Config && ci->Config->FilterSubject &&
                       strcmp(ci->Config->FilterSubject, filter) == 0;
            /* Its ack wait is the one it was created with (by the operator, contract.c), which
             * may not be the caller's: the caller learns it (sp_bus_consumer_ack_wait_ms). */
            int64_t has_ms = same ? ci->Config->AckWait / 1000000 : 0;
            jsConsumerInfo_Destroy(ci);
            ci = NULL;
            if (!same)
                return -EEXIST;
            rc = subscribe_bound(bus, durable, filter, (int)has_ms, ret_consumer);
            continue;
        }
        if ((rc = sp__bus_status(s, jerr, "js_GetConsumerInfo")) != SP_ENOTFOUND)
            return rc;
        /* Another instance may create it at the same moment: the server accepts an identical
         * configuration twice, so both then bind to the one consumer. */
        if ((rc = consumer_create(bus, durable, filter, 0, ack_wait_ms, NULL, MAX_ACK_PENDING)) < 0)
            return rc;
        rc = subscribe_bound(bus, durable, filter, ack_wait_ms, ret_consumer);
    }
    return rc;
}

int sp_bus_consumer_ack_wait_ms(const sp_bus_consumer_t *c)
{
    return c->ack_wait_ms;
}

static void consumer_destroy(sp_bus_consumer_t *c)
{
    natsSubscription_Destroy(c->sub);
    free(c->ack_reply);
    free(c);
}

void sp_bus_consumer_free(sp_bus_consumer_t *c)
{
    if (!c)
        return;
    /* Unsubscribing a bound pull subscription keeps the durable on the server. */
    natsSubscription_Unsubscribe(c->sub);
    c->freed = true;
    if (c->live_batches == 0)
        consumer_destroy(c);
}

/* The stream message's place in the batch; false (m untouched) when it is not one. */
static bool batch_put(sp_bus_batch_t *b, natsMsg *m)
{
    jsMsgMetaData *meta = NULL;

    if (natsMsg_GetMetaData(&meta, m) != NATS_OK) {
        sp_log(SP_LOG_DEBUG, "bus fetch skipped a non-stream message",
               SP_KS("subject", natsMsg_GetSubject(m)));
        return false;
    }
    sp_bus_msg_t *it = &b->e[b->n].pub;
    it->subject = natsMsg_GetSubject(m);
    it->len = (size_t)natsMsg_GetDataLength(m);
    it->data = it->len ? (const uint8_t *)natsMsg_GetData(m) : NULL;
    it->stream_seq = meta->Sequence.Stream;
    it->delivered = meta->NumDelivered;
    it->published_ns = meta->Timestamp;
    b->pending = meta->NumPending;
    b->e[b->n++].msg = m;
    jsMsgMetaData_Destroy(meta);
    return true;
}

/* A pushed durable's control messages, answered as they are taken, that is once everything
 * the server sent before them has been taken too: flow control (the server pauses past some
 * bytes in flight until answered) and an idle heartbeat, which names an answer the server
 * still waits for ("Nats-Consumer-Stalled") after one was lost. True when m was one. */
static bool push_control(const sp_bus_consumer_t *c, natsMsg *m)
{
    const char *reply = natsMsg_GetReply(m), *stalled = NULL;

    if (reply && strncmp(reply, "$JS.ACK.", 8) == 0)
        return false;
    if (reply && strncmp(reply, "$JS.FC.", 7) == 0)
        (void)natsConnection_Publish(c->bus->nc, reply, NULL, 0);
    else if (natsMsgHeader_Get(m, "Nats-Consumer-Stalled", &stalled) == NATS_OK && stalled &&
             strncmp(stalled, "$JS.FC.", 7) == 0)
        (void)natsConnection_Publish(c->bus->nc, stalled, NULL, 0);
    return true;
}

/* What the server pushed: waits up to timeout_ms for the first message, then takes what has
 * arrived, up to max messages and FETCH_MAX_BYTES. */
static int fetch_pushed(sp_bus_consumer_t *c, size_t max, int timeout_ms, sp_bus_batch_t *b)
{
    const int64_t deadline = mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    size_t cap = 0, bytes = 0;

    while (b->n < max && bytes < (size_t)FETCH_MAX_BYTES) {
        natsMsg *m = NULL;
        int queued = 0;
        int64_t wait = 0;
        if (natsSubscription_GetPending(c->sub, &queued, NULL) != NATS_OK)
            queued = 0;
        if (queued <= 0) {
            if (b->n > 0 || (wait = deadline - mono_ms()) <= 0)
                break;
        }
        /* With messages queued the call returns at once; cnats waits only for none. */
        natsStatus s = natsSubscription_NextMsg(&m, c->sub, wait > 0 ? wait : 1);
        if (s == NATS_TIMEOUT)
            break;
        if (s != NATS_OK)
            return b->n > 0 ? 0 : sp__bus_status(s, 0, "natsSubscription_NextMsg");
        if (push_control(c, m)) {
            natsMsg_Destroy(m);
            continue;
        }
        if (b->n == cap) {
            cap = cap ? cap * 2 : 16;
            b->e = sp_xreallocarray(b->e, cap, sizeof(*b->e));
        }
        if (!batch_put(b, m)) {
            natsMsg_Destroy(m);
            continue;
        }
        bytes += b->e[b->n - 1].pub.len;
    }
    /* Waiting: what the server has not sent yet, and what it sent that is still queued here. */
    int queued = 0;
    if (b->n > 0 && natsSubscription_GetPending(c->sub, &queued, NULL) == NATS_OK && queued > 0)
        b->pending += (uint64_t)queued;
    return 0;
}

int sp_bus_fetch(sp_bus_consumer_t *c, size_t max, int timeout_ms, sp_bus_batch_t **ret_batch)
{
    sp_bus_batch_t *b;
    jsFetchRequest req;
    natsMsgList list;
    natsStatus s;

    if (!c || c->freed || max == 0 || !ret_batch)
        return -EINVAL;
    if (max > FETCH_MAX_MSGS)
        max = FETCH_MAX_MSGS;
    if (c->push) {
        b = sp_xcalloc(1, sizeof(*b));
        b->consumer = c;
        int rc = fetch_pushed(c, max, timeout_ms, b);
        if (rc < 0) {
            for (size_t i = 0; i < b->n; i++)
                natsMsg_Destroy(b->e[i].msg);
            free(b->e);
            free(b);
            return rc;
        }
        c->live_batches++;
        *ret_batch = b;
        return 0;
    }
    /* cnats 3.4 asks the server to expire the request 10 ms before its own wait ends, but only
     * for waits of 20 ms and more; a shorter one gives up when the server's answer is due, and
     * the server still serves a request nobody waits for. Measured on the event log: such
     * fetches were followed by fetches held ~1 s (docs/machine-notes.md, "A fetch held to its
     * expiry"). The server answers an empty wait after 10 ms all the same. */
    if (timeout_ms < FETCH_MIN_WAIT_MS)
        timeout_ms = FETCH_MIN_WAIT_MS;

    jsFetchRequest_Init(&req);
    req.Batch = (int)max;
    req.MaxBytes = FETCH_MAX_BYTES;
    req.NoWait = true;
    req.Expires = (int64_t)timeout_ms * 1000000;
    memset(&list, 0, sizeof(list));
    s = natsSubscription_FetchRequest(&list, c->sub, &req);
    /* No message before expiry (408 from the server or our own deadline) or none at all
     * (404) is the normal empty result, not an error. */
    if (s == NATS_TIMEOUT || s == NATS_NOT_FOUND)
        s = NATS_OK;
    if (s != NATS_OK)
        return sp__bus_status(s, 0, "natsSubscription_FetchRequest");

    b = sp_xcalloc(1, sizeof(*b));
    b->consumer = c;
    if (list.Count > 0)
        b->e = sp_xreallocarray(NULL, (size_t)list.Count, sizeof(*b->e));
    /* cnats filters status messages (404/408/409, no data, a Status header); anything else
     * that is not a stream message has no metadata and is dropped here too. */
    for (int i = 0; i < list.Count; i++)
        if (batch_put(b, list.Msgs[i]))
            list.Msgs[i] = NULL;
    natsMsgList_Destroy(&list);
    c->live_batches++;
    *ret_batch = b;
    return 0;
}

size_t sp_bus_batch_len(const sp_bus_batch_t *b)
{
    return b ? b->n : 0;
}

uint64_t sp_bus_batch_pending(const sp_bus_batch_t *b)
{
    return b && b->n ? b->pending : 0;
}

const sp_bus_msg_t *sp_bus_batch_msg(const sp_bus_batch_t *b, size_t i)
{
    return b && i < b->n ? &b->e[i].pub : NULL;
}

int sp_bus_batch_merge(sp_bus_batch_t *into, sp_bus_batch_t **from)
{
    sp_bus_batch_t *f = from ? *from : NULL;

    if (!into || !f || f == into || f->consumer != into->consumer)
        return -EINVAL;
    if (f->n > 0) {
        into->e = sp_xreallocarray(into->e, into->n + f->n, sizeof(*into->e));
        memcpy(into->e + into->n, f->e, f->n * sizeof(*f->e));
        into->n += f->n;
        into->pending = f->pending;
        f->n = 0;
    }
    *from = NULL;
    sp_bus_batch_free(f); /* the consumer outlives it: into still counts as a live batch */
    return 0;
}

int sp_bus_batch_ack(sp_bus_batch_t *b)
{
    jsOptions jo;
    jsErrCode jerr = 0;
    natsStatus s = NATS_OK;

    if (!b)
        return -EINVAL;
    if (b->n == 0)
        return 0;
    /* Pushed: the last message's ack acknowledges the batch and everything before it. Not
     * waited for: one lost only brings the messages again, which the reader filters. */
    if (b->consumer->push)
        return sp__bus_status(natsConnection_PublishString(b->consumer->bus->nc,
                                                           natsMsg_GetReply(b->e[b->n - 1].msg),
                                                           "+ACK"),
                              0, "ack");
    for (size_t i = 0; i + 1 < b->n && s == NATS_OK; i++)
        s = natsMsg_Ack(b->e[i].msg, NULL);
    if (s != NATS_OK)
        return sp__bus_status(s, 0, "natsMsg_Ack");
    jsOptions_Init(&jo);
    jo.Wait = b->consumer->bus->timeout_ms < ACK_REPLY_WAIT_MS ? b->consumer->bus->timeout_ms
                                                               : ACK_REPLY_WAIT_MS;
    s = natsMsg_AckSync(b->e[b->n - 1].msg, &jo, &jerr);
    return sp__bus_status(s, jerr, "natsMsg_AckSync");
}

int sp_bus_consumer_ack_flush(sp_bus_consumer_t *c)
{
    if (!c || !c->ack_reply)
        return 0;
    natsStatus s = natsConnection_PublishString(c->bus->nc, c->ack_reply, "+ACK");
    free(c->ack_reply);
    c->ack_reply = NULL;
    c->ack_msgs = 0;
    return sp__bus_status(s, 0, "ack");
}

int sp_bus_batch_ack_deferred(sp_bus_batch_t *b, int max_ms, size_t max_msgs)
{
    if (!b)
        return -EINVAL;
    sp_bus_consumer_t *c = b->consumer;
    if (!c->push)
        return sp_bus_batch_ack(b);
    if (b->n == 0)
        return 0;
    /* Ack policy all: this batch's last ack covers every batch held before it. */
    const char *reply = natsMsg_GetReply(b->e[b->n - 1].msg);
    if (!reply)
        return -EINVAL;
    if (!c->ack_reply)
        c->ack_since_ms = mono_ms();
    free(c->ack_reply);
    c->ack_reply = sp_xstrdup(reply);
    c->ack_msgs += b->n;
    if (c->ack_msgs >= max_msgs || mono_ms() - c->ack_since_ms >= max_ms)
        return sp_bus_consumer_ack_flush(c);
    return 0;
}

int sp_bus_batch_ack_one(sp_bus_batch_t *b, size_t i)
{
    if (!b || i >= b->n || b->consumer->push)
        return -EINVAL;
    return sp__bus_status(natsMsg_Ack(b->e[i].msg, NULL), 0, "natsMsg_Ack");
}

int sp_bus_batch_nak_one(sp_bus_batch_t *b, size_t i)
{
    if (!b || i >= b->n || b->consumer->push)
        return -EINVAL;
    return sp__bus_status(natsMsg_Nak(b->e[i].msg, NULL), 0, "natsMsg_Nak");
}

int sp_bus_batch_in_progress(sp_bus_batch_t *b, size_t i)
{
    if (!b || i >= b->n || b->consumer->push)
        return -EINVAL;
    return sp__bus_status(natsMsg_InProgress(b->e[i].msg, NULL), 0, "natsMsg_InProgress");
}

void sp_bus_batch_free(sp_bus_batch_t *b)
{
    sp_bus_consumer_t *c;

    if (!b)
        return;
    for (size_t i = 0; i < b->n; i++)
        natsMsg_Destroy(b->e[i].msg);
    free(b->e);
    c = b->consumer;
    free(b);
    if (--c->live_batches == 0 && c->freed)
        consumer_destroy(c);
}

int sp_bus_get_stream_msg(sp_bus_t *bus, const char *stream, uint64_t seq, char **ret_subject,
                          uint8_t **ret_data, size_t *ret_len, int64_t *ret_published_ns)
{
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s;

    if (seq == 0)
        return -EINVAL;
    s = js_GetMsg(&m, bus->js, stream, seq, NULL, &jerr);
    if (s != NATS_OK)
        return sp__bus_status(s, jerr, "js_GetMsg");

    size_t len = (size_t)natsMsg_GetDataLength(m);
    if (ret_subject)
        *ret_subject = sp_xstrdup(natsMsg_GetSubject(m));
    if (ret_data) {
        *ret_data = sp_xmalloc(len);
        if (len)
            memcpy(*ret_data, natsMsg_GetData(m), len);
    }
    if (ret_len)
        *ret_len = len;
    if (ret_published_ns)
        *ret_published_ns = natsMsg_GetTime(m);
    natsMsg_Destroy(m);
    return 0;
}

int sp_bus_get_msg(sp_bus_t *bus, uint64_t seq, char **ret_subject, uint8_t **ret_data,
                   size_t *ret_len, int64_t *ret_published_ns)
{
    return sp_bus_get_stream_msg(bus, SP_BUS_STREAM, seq, ret_subject, ret_data, ret_len,
                                 ret_published_ns);
}
