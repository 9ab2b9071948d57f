/* The bus: NATS + JetStream (cnats 3.4.1, nats-server 2.9).
 *
 * One JetStream stream, SPACE_EVENTS, over "space.ev.>", file storage, a duplicate window
 * (Nats-Msg-Id = event_id makes a retried publish idempotent). Consumers are pull consumers
 * with explicit acknowledgement.
 *
 * Threads: a sp_bus_t may be used from several threads for publishing; a consumer and the
 * batches it returns belong to the one thread that fetches. cnats runs its own threads for
 * I/O and reconnects (reconnect is automatic and unbounded); no callback of this API runs on
 * them.
 */
#ifndef SPACE_BUS_H
#define SPACE_BUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SP_BUS_STREAM   "SPACE_EVENTS"
#define SP_BUS_SUBJECTS "space.ev.>"
#define SP_BUS_MAX_MSG                                                                             \
    (1024 * 1024) /* server max_payload we configure; envelopes are far smaller */
/* SP_BUS_STREAM's limits when the opts say 0 (docs/audit.md, "Bounds"): the oldest messages go
 * first, long stored by the event log; a log behind by more than this loses what it had not
 * stored yet, and says so in the chain. 35 days: past the longest sandbox timeout (30 days),
 * as egressd rebuilds its policies from the stream. */
#define SP_BUS_REPLICAS_MAX     5 /* JetStream's limit */
#define SP_BUS_STREAM_MAX_AGE_S ((int64_t)35 * 24 * 3600)
#define SP_BUS_STREAM_MAX_BYTES ((int64_t)4 << 30)

typedef struct sp_bus sp_bus_t;
typedef struct sp_bus_consumer sp_bus_consumer_t;
typedef struct sp_bus_batch sp_bus_batch_t;

typedef struct {
    const char *url;            /* "nats://127.0.0.1:4222"; comma-separated list for a cluster */
    const char *name;           /* connection name shown by the server, e.g. "space-eventlog" */
    const char *user;           /* optional */
    const char *password;       /* optional; never logged */
    const char *nkey;           /* optional: the identity's public NKey (natsauth.h) ... */
    const char *nkey_seed_file; /* ... and the file of its seed (mode 0600); never logged */
    const char *inbox_prefix;   /* optional: "_INBOX.<identity>" (sp_natsauth_inbox), the only
                                   inboxes the generated permissions let it subscribe to */
    int timeout_ms;             /* connect and JetStream API timeout; 0 = 5000 */
    int64_t dup_window_ms;      /* duplicate window of the stream when sp_bus_ensure_stream creates
                                   it; 0 = 2 minutes */
    int64_t stream_max_age_s;   /* SP_BUS_STREAM's limits when created or applied: 0 = the
                                   defaults above, < 0 = none */
    int64_t stream_max_bytes;
    int stream_replicas; /* copies of each stream sp_bus_ensure_stream, the checkpoint stream and
                            the object stores keep on a NATS cluster: 0 = 1; at most
                            SP_BUS_REPLICAS_MAX (docs/operations.md) */
    bool send_asap;      /* write each message to the socket from the publishing thread, not
                            through cnats' flusher thread: one thread hop less per message
                            (~0.5 ms off an exec round trip on a busy 2-core host), one write
                            per message (less throughput for bursts). For request paths. */
} sp_bus_opts_t;

/* Connects (retrying the initial connect for up to timeout_ms) and gets a JetStream context. */
int sp_bus_connect(const sp_bus_opts_t *opts, sp_bus_t **ret_bus);
/* Flushes pending async publishes (bounded wait) and closes. Accepts NULL. */
void sp_bus_free(sp_bus_t *bus);

/* Creates SPACE_EVENTS if missing (idempotent; an existing stream is left as it is), with
 * deny_delete and deny_purge: no message can be deleted and the stream cannot be purged, by
 * anyone (deleting the whole stream is left to NATS permissions: the operator's alone), and the
 * limits of the opts (the oldest messages are dropped past them). */
int sp_bus_ensure_stream(sp_bus_t *bus);
/* Gives an existing SPACE_EVENTS the opts' limits and replicas, and deny_delete and deny_purge
 * if it was made without them (the operator's: `space up`); *ret_changed says whether it had
 * other settings. Stored messages stay. */
int sp_bus_apply_stream_limits(sp_bus_t *bus, int *ret_changed);
/* Creates the event log's checkpoint stream (checkpoint.h) if missing: SP_CKPT_STREAM over
 * SP_CKPT_SUBJECTS, deny_delete and deny_purge, no limits. Only the operator may create it;
 * for anyone else it checks that it exists (SP_ENOTFOUND or a refusal otherwise). */
int sp_bus_ensure_ckpt_stream(sp_bus_t *bus);
typedef struct {
    uint64_t first_seq, last_seq, msgs;
    int64_t max_age_s, max_bytes; /* 0, -1: none */
} sp_bus_stream_state_t;
/* The state of any stream; SP_ENOTFOUND when it does not exist. */
int sp_bus_stream_state(sp_bus_t *bus, const char *stream, sp_bus_stream_state_t *ret);
/* Last sequence stored in SPACE_EVENTS and the number of messages. */
int sp_bus_stream_info(sp_bus_t *bus, uint64_t *ret_last_seq, uint64_t *ret_msgs);

/* Publishes and waits for the stream's ack. msg_id (optional) goes into Nats-Msg-Id.
 * *ret_seq (optional) gets the stream sequence; *ret_duplicate (optional) is set to 1 when the
 * server recognised msg_id as a duplicate (then *ret_seq is the original's sequence). */
int sp_bus_publish(sp_bus_t *bus, const char *subject, const void *data, size_t len,
                   const char *msg_id, uint64_t *ret_seq, int *ret_duplicate);

/* A publish must not fail for a moment without the bus: when the NATS node a connection is
 * on dies it reconnects to another, and JetStream publishes fail at once meanwhile (measured
 * 0.2-7 s on a 3-node cluster; docs/operations.md, "Faults one after another").
 * sp_bus_publish_retry is sp_bus_publish that, on SP_EBUS or SP_ETIMEOUT, sends the same bytes
 * with the same msg_id again (the stream keeps one copy), waiting 50 ms doubling to 1 s between
 * tries, for at most budget_ms. msg_id is required. Other errors, and the last failure, are
 * returned. Budgets (publish.h): SP_PUBLISH_FACT_BUDGET_MS for facts, which must not be lost,
 * SP_PUBLISH_INTENT_BUDGET_MS for a caller that answers a client meanwhile. */
int sp_bus_publish_retry(sp_bus_t *bus, const char *subject, const void *data, size_t len,
                         const char *msg_id, int budget_ms, uint64_t *ret_seq);
/* Publishes without waiting for the ack (pipelined; at most 4096 in flight, then it blocks
 * until acks make room, for up to timeout_ms of the connection, then SP_ETIMEOUT).
 * Use sp_bus_publish_async_complete to wait for every ack. */
int sp_bus_publish_async(sp_bus_t *bus, const char *subject, const void *data, size_t len,
                         const char *msg_id);
/* Waits up to timeout_ms (<= 0: the connection's timeout_ms) for all pending async
 * publishes; returns the number that failed since the last call that returned a count (>= 0),
 * or SP_ETIMEOUT, after which nothing is pending any more (the caller publishes again what it
 * needs). Each async publish also fails by itself when its ack is not back within the
 * connection's timeout_ms. */
int sp_bus_publish_async_complete(sp_bus_t *bus, int timeout_ms);

/* Core NATS (not stored in the stream): the data plane, space.io.>. */
int sp_bus_publish_core(sp_bus_t *bus, const char *subject, const void *data, size_t len);

/* Core NATS subscriptions (the data plane). cb runs on a cnats thread, one message at a time
 * per subscription, with subject, reply (NULL if none) and data borrowed for the call: copy
 * what you keep and hand work to your own loop. queue (optional) makes a queue group. A
 * subscriber that falls behind by 64k messages or 256 MiB loses messages (NATS slow
 * consumer): data-plane messages carry sequence numbers so readers can tell. */
typedef struct sp_bus_sub sp_bus_sub_t;
typedef void (*sp_bus_msg_cb)(void *arg, const char *subject, const char *reply,
                              const uint8_t *data, size_t len);
int sp_bus_subscribe(sp_bus_t *bus, const char *subject, const char *queue, sp_bus_msg_cb cb,
                     void *arg, sp_bus_sub_t **ret_sub);
/* Stops the subscription; when it returns, no callback of it runs any more. Accepts NULL. */
void sp_bus_unsubscribe(sp_bus_sub_t *s);
/* Waits until the server has processed everything published so far (e.g. a subscription made
 * just before a request that will cause messages on it). */
int sp_bus_flush(sp_bus_t *bus, int timeout_ms);
/* Request/reply over core NATS: sends data and waits up to timeout_ms (0: the bus timeout)
 * for one reply (heap copy, caller frees). SP_ENOTFOUND when nobody listens, SP_ETIMEOUT. */
int sp_bus_request(sp_bus_t *bus, const char *subject, const void *data, size_t len, int timeout_ms,
                   uint8_t **ret_data, size_t *ret_len);

/* A pull consumer on SP_BUS_STREAM.
 * durable: the consumer's durable name. filter: subject filter (one: nats-server 2.9).
 * start_seq: 0 = deliver everything still in the stream; else the first stream sequence to
 * deliver. The durable is (re)created with that start: whatever delivery state it had is
 * discarded, so the caller, which keeps its own position (the event log keeps it in
 * PostgreSQL, atomically with the data), gets messages in stream order with nothing pending.
 * ack_wait_ms: redelivery timeout for unacked messages (0 = 30 s). */
int sp_bus_consumer_open(sp_bus_t *bus, const char *durable, const char *filter, uint64_t start_seq,
                         int ack_wait_ms, sp_bus_consumer_t **ret_consumer);
/* The same durable (recreated from start_seq the same way), pushed: the server sends its
 * messages as they are stored, into this connection's inbox, with no fetch request per batch
 * and no status answer to one, at most max_inflight (<= 20000) unacknowledged and flow-
 * controlled by bytes. Acknowledging a batch acknowledges it and every message before it
 * (ack policy all) with one message and no wait: for a reader that handles messages strictly
 * in stream order, as the event log does (docs/architecture.md, "The event log's consumer is
 * pushed"). sp_bus_batch_ack_one, _nak_one and _in_progress refuse its batches (-EINVAL). */
int sp_bus_consumer_push(sp_bus_t *bus, const char *durable, const char *filter, uint64_t start_seq,
                         int ack_wait_ms, size_t max_inflight, sp_bus_consumer_t **ret_consumer);
/* How many times the connection has reconnected since sp_bus_connect. A message the server
 * delivered to a pull fetch just before the connection dropped never arrives, yet counts as
 * delivered: it comes again only after the consumer's ack wait. A reader that sees this number
 * change can get it sooner: the event log reopens its consumer from its own position, the
 * worker takes its placements from the log (worker_events.c). */
uint64_t sp_bus_reconnects(sp_bus_t *bus);
/* Publishes and subscriptions the NATS server refused to this process's connections (outside
 * their identity's permissions), and the server's text of the last one, which names the
 * subject, into last (NULL: not wanted). The server says so asynchronously: a refused request
 * itself still ends by its timeout. Each is also logged (WARN, at most one line a second). */
uint64_t sp_bus_refusals(char *last, size_t len);
/* A shared, long-lived pull consumer: binds to the durable if it exists (keeping its delivery
 * state, so messages a crashed instance never acknowledged are redelivered), else creates it
 * to deliver everything in the stream under filter. Several processes may bind the same
 * durable: each message then goes to one of them (a work queue). -EEXIST if a durable of
 * that name exists with another filter. */
int sp_bus_consumer_bind(sp_bus_t *bus, const char *durable, const char *filter, int ack_wait_ms,
                         sp_bus_consumer_t **ret_consumer);
/* The durable's redelivery timeout as the server has it: for a bound durable that existed,
 * the one it was created with, which ack_wait_ms does not change. */
int sp_bus_consumer_ack_wait_ms(const sp_bus_consumer_t *c);
/* Unsubscribes (keeps the durable on the server). Accepts NULL. Batches still held stay
 * valid (and can be acked) until freed. */
void sp_bus_consumer_free(sp_bus_consumer_t *c);
/* Deletes the durable on the server. */
int sp_bus_consumer_delete(sp_bus_t *bus, const char *durable);

typedef struct {
    const char *subject; /* borrowed: valid until the batch is freed */
    const uint8_t *data; /* borrowed: valid until the batch is freed; may be NULL when len 0 */
    size_t len;
    uint64_t stream_seq;
    uint64_t delivered;   /* delivery count, 1 on first delivery */
    int64_t published_ns; /* the stream's timestamp, ns since the epoch */
} sp_bus_msg_t;

/* Fetches up to max messages (at most 4096 and 64 MiB per batch), waiting up to timeout_ms for
 * the first one and returning what is available once one came. On timeout returns 0 with an
 * empty batch (never NULL). Pull: timeout_ms below 20 is taken as 20, the server is asked to
 * end the wait 10 ms before the client does (lib/bus.c). Pushed: takes from what the server
 * has sent, which involves no request; timeout_ms 0 takes only what has arrived. */
int sp_bus_fetch(sp_bus_consumer_t *c, size_t max, int timeout_ms, sp_bus_batch_t **ret_batch);
size_t sp_bus_batch_len(const sp_bus_batch_t *b);
/* How many messages of the consumer were still to be delivered when the server sent the
 * batch's last one (its metadata's pending count; 0 for an empty batch). More may have come
 * since. A consumer that knows a backlog waits asks for exactly it: a fetch for more than is
 * there can be held by the server up to its expiry (docs/machine-notes.md, "A fetch held to
 * its expiry"). */
uint64_t sp_bus_batch_pending(const sp_bus_batch_t *b);
const sp_bus_msg_t *sp_bus_batch_msg(const sp_bus_batch_t *b, size_t i);
/* Moves every message of *from (fetched from the same consumer) to the end of into, in order,
 * and frees *from (set to NULL). Pointers from sp_bus_batch_msg(into, ...) taken before are
 * invalid after. -EINVAL (nothing moved) for batches of two consumers. */
int sp_bus_batch_merge(sp_bus_batch_t *into, sp_bus_batch_t **from);
/* Acknowledges every message of the batch. Pull: waits (at most the bus's timeout, and 2 s)
 * for the server to confirm the last: an error says it did not, and the messages may come
 * again. Pushed: one ack, not waited for (a lost one also brings the messages again). */
int sp_bus_batch_ack(sp_bus_batch_t *b);
/* Pushed consumers: acknowledges the batch, and every one held before it, once the held
 * messages number max_msgs or the first of them was held max_ms ago; until then the ack is
 * held (the consumer keeps it after the batch is freed). For a reader that stores in stream
 * order and filters redeliveries, whose ack only spares the server a redelivery: each ack is
 * a message, and nats-server rewrites the durable's state file for each. Keep max_msgs
 * below the durable's max_ack_pending, or deliveries stop. Pull consumers: sp_bus_batch_ack. */
int sp_bus_batch_ack_deferred(sp_bus_batch_t *b, int max_ms, size_t max_msgs);
/* Sends the ack sp_bus_batch_ack_deferred holds, if any (when the reader goes idle). */
int sp_bus_consumer_ack_flush(sp_bus_consumer_t *c);
/* One message: acknowledge, negatively acknowledge (redeliver now), or tell the server it is
 * still being worked on (restarts its ack_wait). Safe from any thread while the batch lives. */
int sp_bus_batch_ack_one(sp_bus_batch_t *b, size_t i);
int sp_bus_batch_nak_one(sp_bus_batch_t *b, size_t i);
int sp_bus_batch_in_progress(sp_bus_batch_t *b, size_t i);
/* Frees without acking (the messages are redelivered after ack_wait). Accepts NULL. */
void sp_bus_batch_free(sp_bus_batch_t *b);

/* Reads one stored message by stream sequence (for SSE replay and tools). *ret_subject and
 * *ret_data are heap, caller frees; any output may be NULL; SP_ENOTFOUND if that sequence is
 * gone. */
int sp_bus_get_msg(sp_bus_t *bus, uint64_t seq, char **ret_subject, uint8_t **ret_data,
                   size_t *ret_len, int64_t *ret_published_ns);
/* The same from any stream. */
int sp_bus_get_stream_msg(sp_bus_t *bus, const char *stream, uint64_t seq, char **ret_subject,
                          uint8_t **ret_data, size_t *ret_len, int64_t *ret_published_ns);

#endif
