/* space-gateway internals, shared by gateway-api/ files only (never by another daemon).
 *
 * Threads and ownership, in one place:
 * - Everything named here runs on the libuv loop thread unless it says otherwise: h2o, the
 *   request contexts, the waiters, the SSE streams, the metrics, the API key cache.
 * - gw_job_t.run runs on a libuv thread-pool thread with a PostgreSQL connection of the pool
 *   to itself; it may call sp_bus_publish (the bus is thread-safe for publishing) and must not
 *   touch loop state. gw_job_t.done runs on the loop afterwards.
 * - The LISTEN thread (gw_listener_t) only stores the newest head sequence in an atomic and
 *   wakes the loop with uv_async_send.
 * - A command's bus jobs run on a pool thread without a connection (blocking NATS calls); its
 *   data-plane callback runs on a cnats thread and touches only the command's mutex-protected
 *   queue and its uv_async_t (gateway_commands.c).
 */
#ifndef SPACE_GATEWAY_H
#define SPACE_GATEWAY_H

#define H2O_USE_LIBUV 1
#include <h2o.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "buf.h"
#include "bus.h"
#include "contract.h"
#include "dataplane.pb-c.h"
#include "envelope.h"
#include "hash.h"
#include "intent.h"
#include "json.h"
#include "reduce.h"
#include "sign.h"

#define GW_DAEMON         "space-gateway"
#define GW_REQUEST_ID_MAX 64
#define GW_IDEM_KEY_MAX   128
#define GW_PATH_MAX       2048 /* request target, query included: longer is 414 */
#define GW_QUERY_MAX      32   /* query parameters: more is 400 */
#define GW_EVENT_ID_LEN   36

/* One immutable config, filled from the table in main.c. */
/* The keyring that checks E2B access tokens made before a rotation of the gateway's key
 * (gateway_auth.c). */
typedef struct gw_token_ring gw_token_ring_t;
gw_token_ring_t *gw_token_ring_new(const char *dir, const char *identity);
void gw_token_ring_free(gw_token_ring_t *r);

typedef struct {
    char *listen_host;
    int64_t port;
    char *port_file;
    char *nats_url;
    char *identity; /* busid.h */
    char *creds_dir;
    char *nats_user;
    char *nats_password;
    char *pg_url;
    int64_t pg_pool;
    int64_t queue_max;
    int64_t create_timeout_s;
    int64_t delete_timeout_s;
    int64_t sse_keepalive_s;
    int64_t sse_max_lag_bytes;
    int64_t sse_write_timeout_s;
    int64_t max_streams;
    int64_t max_body_bytes;
    int64_t stop_timeout_s;
    int64_t max_commands;
    int64_t command_grace_s;
    int64_t command_buffer_bytes;
    int64_t command_reply_wait_ms;
    int64_t bus_threads;
    int64_t max_file_bytes;
    int64_t max_file_transfers;
    int64_t file_threads;
    int64_t watcher_idle_s;
    int64_t signed_url_index;        /* tokens indexed: the most candidates one request hashes */
    int64_t signed_url_fail_per_s;   /* failed signed-URL lookups a client may make a second */
    int64_t signed_url_fail_burst;   /* and at once */
    int64_t signed_url_global_per_s; /* the same for the gateway as a whole */
    int64_t signed_url_global_burst;
    char *tmp_dir;
    char *network_default; /* policy mode of a create without "network" (netpolicy.h) */
    bool seal_output;      /* command lines sealed by the workers, not in the intent */
    char *log_level;
    char *log_format;
} gw_config_t;

typedef struct gw gw_t;

/* ---- metrics (gateway_metrics.c) ---- */

typedef enum {
    GW_R_HEALTHZ = 0,
    GW_R_METRICS,
    GW_R_SANDBOX_CREATE,
    GW_R_SANDBOX_LIST,
    GW_R_SANDBOX_GET,
    GW_R_SANDBOX_DELETE,
    GW_R_SANDBOX_EVENTS,
    GW_R_EVENTS,
    GW_R_TEMPLATES,
    GW_R_SANDBOX_COMMANDS,
    GW_R_COMMAND_LIST,
    GW_R_COMMAND_STREAM,
    GW_R_COMMAND_CTL,
    GW_R_SANDBOX_FILES,
    GW_R_SANDBOX_NETWORK,
    GW_R_SANDBOX_LIFECYCLE,
    GW_R_SNAPSHOTS,       /* named snapshots (gateway_snapshots.c) */
    GW_R_SANDBOX_METRICS, /* GET /v1/sandboxes/{id}/metrics (gateway_samples.c) */
    GW_R_CREDENTIALS,     /* /v1/credentials[/{id}] (gateway_credentials.c) */
    GW_R_KEYS,            /* /v1/keys[/{id}] (gateway_keys.c) */
    GW_R_OPENAPI,         /* GET /v1/openapi.json */
    GW_R_CONSOLE,         /* the web console's static files (gateway_console.c) */
    GW_R_E2B_API,         /* the E2B control plane (gateway_e2b.c) */
    GW_R_E2B_ENVD,        /* the E2B in-sandbox API: Connect RPC, /files, /health */
    GW_R_OTHER, /* unknown routes and responses h2o itself produced (413 while reading a body) */
    GW_R_COUNT
} gw_route_t;

#define GW_CREATE_BUCKETS 14
#define GW_EXEC_BUCKETS   14

/* How a command request ended up: accepted by the worker, or why not. */
typedef enum {
    GW_CMD_ACCEPTED = 0,
    GW_CMD_WORKER_UNAVAILABLE, /* nobody answered on the worker's exec subject */
    GW_CMD_SANDBOX_NOT_RUNNING,
    GW_CMD_AGENT_UNAVAILABLE,
    GW_CMD_TOO_MANY,
    GW_CMD_WORKER_ERROR, /* refused for another reason, or an unreadable reply */
    GW_CMD_BUS_ERROR,    /* subscribe, flush or the intent's publish failed */
    GW_CMD_NOT_FOUND,    /* attach: the worker knows no such command */
    GW_CMD_OUTCOMES
} gw_cmd_outcome_t;

/* How an accepted command's response ended. */
typedef enum {
    GW_CMD_END_EXIT = 0, /* the worker's IoExit */
    GW_CMD_END_TIMEOUT,  /* no IoExit within timeout_s + 30 s */
    GW_CMD_END_CLIENT,   /* the SSE client went away */
    GW_CMD_END_SHUTDOWN, /* the gateway stopped */
    GW_CMD_ENDS
} gw_cmd_end_t;

typedef struct {
    uint64_t requests[GW_R_COUNT][600]; /* by status code 100..599 (index = code) */
    int64_t in_flight;
    int64_t streams;
    uint64_t publish_failures;
    uint64_t streams_closed_slow;
    uint64_t create_buckets[GW_CREATE_BUCKETS + 1]; /* the last is +Inf */
    double create_sum;
    uint64_t create_count;
    uint64_t commands[GW_CMD_OUTCOMES];
    uint64_t command_ends[GW_CMD_ENDS];
    int64_t commands_running;
    uint64_t commands_output_lost;
    uint64_t commands_truncated;
    uint64_t exec_buckets[GW_EXEC_BUCKETS + 1];
    double exec_sum;
    uint64_t exec_count;
} gw_metrics_t;

void gw_metrics_request(gw_metrics_t *m, gw_route_t route, int status);
void gw_metrics_create_latency(gw_metrics_t *m, double seconds);
/* ExecRequest sent to ExecReply received (or no responder), as the bus thread measured it. */
void gw_metrics_exec_latency(gw_metrics_t *m, double seconds);
void gw_metrics_render(const gw_metrics_t *m, sp_buf_t *out);
typedef struct gw_loc_cache gw_loc_cache_t;
/* The location cache's counters (atomics: any thread). */
void gw_metrics_render_locs(gw_loc_cache_t *c, sp_buf_t *out);

/* ---- bus jobs (gateway_bus.c) ----
 * Blocking NATS calls (request/reply, subscribe + flush, drain) run on libuv's thread pool
 * without a database connection: at most bus-threads at once, the others wait in a FIFO, so
 * with UV_THREADPOOL_SIZE = pg-pool + 1 + bus-threads a database job never waits behind a
 * blocked NATS call. run must not touch loop state; done runs on the loop afterwards. */
typedef struct gw_bus_job gw_bus_job_t;
typedef struct gw_bus_lane gw_bus_lane_t;
struct gw_bus_job {
    uv_work_t work;
    gw_t *gw;
    gw_bus_lane_t *lane;
    void *arg;
    void (*run)(gw_bus_job_t *job);
    void (*done)(gw_bus_job_t *job);
    gw_bus_job_t *next;
};
/* A lane: at most max jobs at once, the others wait in a FIFO. Commands and control requests
 * share one (bus-threads), file transfers have their own (file-threads), so long transfers
 * never hold up a command. */
struct gw_bus_lane {
    size_t running;
    int64_t max;
    gw_bus_job_t *head, *tail;
};
void gw_bus_submit(gw_t *gw, gw_bus_lane_t *lane, gw_bus_job_t *job);

/* ---- PostgreSQL pool and jobs (gateway_db.c) ---- */

typedef struct gw_job gw_job_t;
struct gw_job {
    uv_work_t work;
    gw_t *gw;
    PGconn *db;
    size_t conn_index;
    /* Runs on a pool thread with db to itself. */
    void (*run)(gw_job_t *job, PGconn *db);
    /* Runs on the loop once run returned; owns the job (frees it). */
    void (*done)(gw_job_t *job);
    gw_job_t *next; /* queue link while waiting for a connection */
};

typedef struct {
    char *url;
    PGconn **conns;
    size_t *free_list;
    size_t n, n_free;
    gw_job_t *head, *tail; /* jobs waiting for a connection, FIFO */
    size_t queued, queue_max;
    size_t running;
} gw_pool_t;

/* Opens n connections (retrying while PostgreSQL starts, up to timeout_ms) and applies the
 * schema migrations on the first. */
int gw_pool_open(gw_pool_t *p, const char *url, size_t n, size_t queue_max, int timeout_ms);
/* Closes the connections; no job may be queued or running. Accepts a zeroed pool. */
void gw_pool_close(gw_pool_t *p);
/* Runs job->run on a pool thread as soon as a connection is free, then job->done on the loop.
 * -EBUSY (and nothing runs) when queue_max jobs already wait. */
int gw_job_submit(gw_t *gw, gw_job_t *job);

/* Where running sandboxes are (gateway_locate.c): id -> tenant, worker, whether a create-time
 * environment is stored. Filled by lookups on pool threads, emptied by the LISTEN thread: an
 * entry at SP_SANDBOX_CHANNEL's word for its id, all of them whenever that connection is lost
 * (notifications may be missed), and nothing is cached while it is down (live false). */
#define GW_LOC_BUCKETS 4096
#define GW_LOC_MAX     65536
typedef struct gw_loc_entry gw_loc_entry_t;
struct gw_loc_cache {
    pthread_mutex_t mu;
    gw_loc_entry_t *buckets[GW_LOC_BUCKETS];
    size_t n;
    uint64_t epoch; /* bumped by every drop: a lookup that saw another epoch caches nothing */
    bool live;
    _Atomic uint64_t hits, misses, drops;
};
void gw_loc_cache_init(gw_loc_cache_t *c);
/* Empties it and keeps it off (lookups still work, uncached); safe to call twice. */
void gw_loc_cache_dispose(gw_loc_cache_t *c);
/* Forgets sandbox (NULL: every entry); live says whether entries may be added from now on. */
void gw_loc_cache_drop(gw_loc_cache_t *c, const char *sandbox, bool live);

/* The LISTEN side: one dedicated connection and thread; see gateway_db.c. */
typedef struct {
    pthread_t thread;
    bool started;
    int wake_fd;
    char *url;
    uv_async_t async;
    _Atomic uint64_t head;
    /* Counts API key revocations heard (SP_APIKEY_CHANNEL) and reconnects, after which the
     * loop empties the auth cache (gateway_auth.c). */
    _Atomic uint64_t keys_gen;
    atomic_bool stop;
    gw_loc_cache_t locs;
} gw_listener_t;

/* Starts the thread; async (initialised on the loop by the caller) is sent at every
 * notification and after every (re)connect. */
int gw_listener_start(gw_listener_t *l, const char *url);
void gw_listener_stop(gw_listener_t *l);

/* ---- requests (gateway_http.c) ---- */

/* Which API a request speaks, which decides the shape of its errors (gw_respond_error):
 * ours {"code": "snake_case", ...}; E2B's control plane and envd's /files {"code": <status>,
 * "message"}; Connect unary (a Connect code string, its HTTP status); Connect streaming (HTTP
 * 200 and one end-stream envelope carrying the error). */
typedef enum {
    GW_DIALECT_V1 = 0,
    GW_DIALECT_E2B,
    GW_DIALECT_CONNECT,
    GW_DIALECT_CONNECT_STREAM
} gw_dialect_t;

typedef struct gw_req gw_req_t;
typedef struct gw_gate gw_gate_t;
struct gw_req {
    gw_t *gw;
    h2o_req_t *req; /* NULL once h2o disposed the request: then nothing may be sent */
    int refs;
    gw_route_t route;
    bool responded;
    bool counted_in_flight;
    int status;
    int64_t start_ns;
    char request_id[GW_REQUEST_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char key_id[SP_ID_MAX + 1];
    bool admin;                      /* the key may manage keys (apikey.h) */
    char path_id[SP_ID_MAX + 1];     /* {id} of /v1/sandboxes/{id}[/events|/commands] */
    char path_sub_id[SP_ID_MAX + 1]; /* {cid} of .../commands/{cid}/{action} */
    char path_action[16];            /* {action}: stream, stdin, signal, resize */
    char method[16];                 /* copies for the log line, which may outlive the request */
    char path[512];
    gw_dialect_t dialect;
    /* The API key to check instead of Authorization: Bearer (E2B: X-API-KEY, or the key part
     * of an envd access token). Borrowed from the request's headers or pool. */
    h2o_iovec_t auth_key;
    /* auth_key is an E2B envd access token, valid only for sandbox path_id (gateway_auth.c). */
    bool auth_token;
    char e2b_template[SP_ID_MAX + 1]; /* E2B create: the answer names the template */
    /* What to do once the API key is verified. */
    void (*after_auth)(gw_req_t *rq);
    /* The largest body this route takes: max-body-bytes, max-file-bytes for an upload. */
    int64_t body_limit;
    /* The connection's gate (gateway_gate.c), NULL once the request ended. head_only: routed
     * and being authenticated while its body waits unread; an answer now closes the
     * connection. */
    gw_gate_t *gate;
    bool head_only;
};

void gw_req_ref(gw_req_t *rq);
void gw_req_unref(gw_req_t *rq);
/* Whether a response can still be sent (the client's request is alive and unanswered). */
bool gw_req_live(const gw_req_t *rq);
/* The value of a request header (lower-case name) or NULL; *ret_dup set when it repeats. */
const h2o_iovec_t *gw_req_header(const gw_req_t *rq, const char *name, bool *ret_dup);

/* Sends a complete response (body copied into the request's pool), logs the request line and
 * counts it. No-op when the request is gone or already answered. */
void gw_respond(gw_req_t *rq, int status, const char *content_type, const char *body, size_t len);
void gw_respond_json(gw_req_t *rq, int status, const sp_buf_t *body);
/* {"code": code, "message": ...}; extra (may be NULL) is appended as more members. */
void gw_respond_error(gw_req_t *rq, int status, const char *code, const char *extra_json,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Connect protocol framing (connectrpc.com/docs/protocol): [flags u8][length u32 BE][JSON]. */
#define GW_CONNECT_END_STREAM 0x02
void gw_connect_envelope(sp_buf_t *b, unsigned flags, const char *json, size_t len);
/* The Connect error code for one of our errors (code, else the HTTP status), and the HTTP
 * status a unary Connect answer carries with it. */
const char *gw_connect_code(int status, const char *code, int *ret_status);
/* A stream took over the response: gw_respond no longer applies and the request stops
 * counting as in flight (it counts as a stream). */
void gw_req_mark_streaming(gw_req_t *rq);
/* The request target as the log shows it: at most cap - 1 bytes, a signature's value in the
 * query replaced by REDACTED. */
void gw_log_path(char *dst, size_t cap, h2o_iovec_t path);
/* The request line for the log, at the end of a request or a stream. */
void gw_log_request(gw_req_t *rq, int status);
/* Adds the headers every response carries (X-Request-Id, Content-Type, Cache-Control). */
void gw_add_common_headers(gw_req_t *rq, const char *content_type);

/* The query string, decoded (application/x-www-form-urlencoded) into the request's pool. */
typedef struct {
    size_t n;
    struct {
        char *key, *value;
    } p[GW_QUERY_MAX];
} gw_query_t;
/* 0, or -EINVAL (bad escape) / -E2BIG (too many parameters). Strings live in req->pool. */
int gw_query_parse(h2o_req_t *req, gw_query_t *q);
/* application/x-www-form-urlencoded decoding of s into pool; NULL on a bad escape or a NUL. */
char *gw_url_decode(h2o_mem_pool_t *pool, const char *s, size_t len);

/* Valid UTF-8 of at most max bytes without control characters (what an event may carry). */
bool gw_text_ok(const char *s, size_t max);

/* A validation failure of a request body: a machine-readable code and a message written into
 * msg (GW_ERR_MSG_MAX bytes, owned by the caller). */
typedef struct {
    const char *code;
    char *msg;
} gw_verr_t;
/* Records code and the formatted message in e; returns -EINVAL. */
int gw_bad(gw_verr_t *e, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- API keys (gateway_auth.c) ---- */

#define GW_AUTH_CACHE_SLOTS 1024
#define GW_AUTH_TTL_NS      (10LL * 1000 * 1000 * 1000)

typedef struct {
    struct {
        uint8_t hash[SP_SHA256_LEN];
        int64_t expires_ns;        /* 0 = empty */
        char scope[SP_ID_MAX + 1]; /* an access token's sandbox; "" for an API key */
        char tenant[SP_ID_MAX + 1];
        char key_id[SP_ID_MAX + 1];
        bool admin;
    } slot[GW_AUTH_CACHE_SLOTS];
    uint64_t epoch; /* +1 at every flush: a check begun before it is not cached */
} gw_auth_cache_t;

/* Verifies the request's bearer key (or, with rq->auth_token, the access token for sandbox
 * rq->path_id), then calls rq->after_auth (maybe before returning), or answers 401/503 itself.
 * Sets rq->tenant, rq->key_id and rq->admin. */
void gw_auth(gw_req_t *rq);
/* Empties the cache when the LISTEN thread heard of a revocation (or reconnected, and may have
 * missed one) since the last call. Loop thread; gw_auth calls it first. */
void gw_auth_sync(gw_t *gw);
/* Empties the cache now (this gateway revoked a key). Loop thread. */
void gw_auth_flush(gw_t *gw);
/* Appends the E2B envd access token of sandbox for the key key_id of tenant (gateway_auth.c).
 * Any thread. */
int gw_access_token(const gw_t *gw, const char *sandbox, const char *tenant, const char *key_id,
                    sp_buf_t *out);

/* ---- E2B signed /files URLs (gateway_signed.c, docs/e2b-signed-urls.md) ---- */

#define GW_SIGNED_TOKEN_MAX 160 /* "<sandbox>.<key id>.<88 base64url>" fits */
#define GW_SIGNED_CLIENTS   256 /* buckets of failed lookups, by remote address */

/* The access tokens this gateway computed, to find a signed URL's sandbox, and the rates of
 * failed lookups. The entries are under mu (any thread: answers on pool threads note tokens);
 * the buckets and the fill state belong to the loop thread. */
typedef struct {
    char sandbox[SP_ID_MAX + 1];
    char token[GW_SIGNED_TOKEN_MAX];
    size_t len;
    uint64_t stamp; /* 0: empty; the largest is the newest */
} gw_signed_entry_t;
typedef struct {
    pthread_mutex_t mu;
    gw_signed_entry_t *e; /* n entries (signed-url-index), owned */
    size_t n;
    uint64_t clock;
    /* The failure rates' buckets: tokens a second and at most (signed-url-fail-*,
     * signed-url-global-*). */
    double fail_per_s, fail_burst, global_per_s, global_burst;
    struct {
        double tokens;
        int64_t at_ns;
    } client[GW_SIGNED_CLIENTS], global;
    bool filling;          /* a fill of the newest sandboxes is running */
    int64_t fill_after_ns; /* and the next may start then */
    uint64_t failures, limited;
} gw_signed_t;

/* Sizes the index and the rates from cfg. */
void gw_signed_init(gw_signed_t *s, const gw_config_t *cfg);
/* Wipes the tokens and frees the index. */
void gw_signed_dispose(gw_signed_t *s);
/* Indexes sandbox's token (len bytes, copied); the oldest entry makes room. Any thread. */
void gw_signed_note(gw_signed_t *s, const char *sandbox, const char *token, size_t len);
/* Drops the entries of a sandbox (deleted). Any thread. */
void gw_signed_forget(gw_signed_t *s, const char *sandbox);
/* A /files request with no credential header: checks its signature (named: the sandbox the
 * request names, "" or NULL when none) and, when it matches, authenticates it with the
 * sandbox's token and calls serve (rq->path_id set); otherwise answers 400/401/429/503. */
void gw_signed_files(gw_req_t *rq, const char *named, void (*serve)(gw_req_t *rq));

/* ---- API keys through the API (gateway_keys.c) ---- */

/* POST/GET /v1/keys, DELETE /v1/keys/{id} (rq->path_id): admin keys only (403 otherwise). */
void gw_keys(gw_req_t *rq);
/* The key is good: rq->after_auth, or, while the body waits (head_only), the gate's check of
 * the announced length before the body is read (gateway_http.c). */
void gw__req_authed(gw_req_t *rq);

/* ---- sandboxes (gateway_sandboxes.c, gateway_create.c) ---- */

void gw_sandbox_create(gw_req_t *rq);
void gw_sandbox_list(gw_req_t *rq);
void gw_sandbox_get(gw_req_t *rq);
void gw_sandbox_delete(gw_req_t *rq);
/* POST /v1/sandboxes/{id}/pause|resume|suspend|timeout (rq->path_action), gateway_lifecycle.c.
 * Also E2B's pause (path_action "suspend") and connect (path_action "resume"), answered in E2B's
 * shape when rq->dialect says so: 204 once suspended, 201 with the sandbox once running again,
 * 200 with it when it ran already. */
void gw_sandbox_lifecycle(gw_req_t *rq);
/* The timeout route without a body to read: a new deadline timeout_s (1..2592000) from now. */
void gw_sandbox_set_timeout(gw_req_t *rq, uint32_t timeout_s);
/* E2B's connect {"timeout": timeout_s}: a paused or suspended sandbox resumes (201); a running
 * one gets the deadline timeout_s from now when that is later than its own (0: unchanged) and
 * is answered 200 with the sandbox. rq->path_action must be "resume". */
void gw_sandbox_connect(gw_req_t *rq, uint32_t timeout_s);
void gw_templates(gw_req_t *rq);

/* ---- credentials (gateway_credentials.c) ---- */

/* POST/GET /v1/credentials, GET/PUT/DELETE /v1/credentials/{id} (rq->path_id): answered by
 * space-credstore over the bus; a value is never in an answer. */
void gw_credentials(gw_req_t *rq);

/* ---- network policies (gateway_network.c) ---- */

/* A policy as the event carries it; allow/deny arrays are heap, their strings borrowed from
 * the parsed JSON document (which must outlive it). */
typedef struct {
    Space__V1__NetworkPolicy msg;
} gw_netpol_t;
/* Parses the "network" member strictly; on failure nothing is left to dispose. */
int gw_network_parse(const sp_json_t *v, gw_netpol_t *p, gw_verr_t *e);
/* The configured default (mode only). */
void gw_network_default(const gw_t *gw, gw_netpol_t *p);
void gw_network_dispose(gw_netpol_t *p);
/* PUT /v1/sandboxes/{id}/network */
void gw_sandbox_network_put(gw_req_t *rq);
/* The same with a policy body of ours (len bytes, not yet checked beyond its size), for
 * rq->path_id: what E2B's PUT /sandboxes/{id}/network calls after translating its body. */
void gw_sandbox_network_put_body(gw_req_t *rq, const char *body, size_t len);
/* GET /v1/sandboxes/{id}/metrics and, with rq->dialect GW_DIALECT_E2B, E2B's
 * GET /sandboxes/{id}/metrics: the usage samples the sandbox's worker keeps (gateway_samples.c). */
void gw_sandbox_metrics(gw_req_t *rq);
void gw_health(gw_req_t *rq);
/* GET /, /console/ and /console/{file}: the web console's files, compiled in from
 * gateway-api/console/ (gateway_console.c); public, the page sends the key on its API calls. */
void gw_console(gw_req_t *rq);

/* The column list every sandbox read selects, and its rendering as the API's sandbox JSON
 * (pool thread side: reads a PGresult in text format). */
#define GW_SBX_COLUMNS                                                                             \
    "id, tenant, template, state, worker, timeout_s, vcpu, memory_mb, metadata::text, "            \
    "env_names::text, failure_reason, (extract(epoch FROM created_at) * 1000000)::int8, "          \
    "(extract(epoch FROM started_at) * 1000000)::int8, "                                           \
    "(extract(epoch FROM timeout_at) * 1000000)::int8, on_timeout, idle_suspend_s, "               \
    "(extract(epoch FROM last_activity_at) * 1000000)::int8, disk_mb"
#define GW_SBX_NCOLUMNS 18
void gw_sandbox_json(const PGresult *r, int row, sp_buf_t *out);
/* A named snapshot's API JSON from its SandboxSnapshotted (gateway_snapshots.c). */
void gw_snapshot_json(const sp_envelope_t *snapshotted, int64_t at_us, sp_buf_t *out);
/* The same as E2B's SnapshotInfo: {"snapshotID", "names": [name]}. */
void gw_snapshot_json_e2b(const sp_envelope_t *snapshotted, sp_buf_t *out);
/* POST /v1/sandboxes/{id}/snapshots, GET /v1/snapshots, DELETE /v1/snapshots/{id}
 * (gateway_snapshots.c, docs/snapshots.md). */
void gw_snapshot_take(gw_req_t *rq);
void gw_snapshot_list(gw_req_t *rq);
void gw_snapshot_delete(gw_req_t *rq);
/* POST /v1/sandboxes/{id}/fork {"count"} (gateway_snapshots.c): one anonymous snapshot, count
 * sandboxes restored from it, the snapshot deleted; 201 with the copies. */
void gw_sandbox_fork(gw_req_t *rq);
/* E2B's Sandbox of sandbox_id with an access token for rq's key (gateway_e2b.c): a bearer
 * secret in b, which the caller wipes. */
void gw_e2b_sandbox_json(const gw_req_t *rq, const char *sandbox_id, const char *template_,
                         sp_buf_t *b);

/* Waiting for the projection to show the outcome of an intent (read-your-writes). */
typedef enum {
    GW_WAIT_CREATE = 1,
    GW_WAIT_DELETE,
    GW_WAIT_PAUSE,           /* until paused */
    GW_WAIT_RESUME,          /* until running */
    GW_WAIT_SUSPEND,         /* until suspended */
    GW_WAIT_STORED,          /* until the event log stored the intent (accepted or rejected) */
    GW_WAIT_SNAPSHOT,        /* until SandboxSnapshotted (or a refusal) answers the intent */
    GW_WAIT_SNAPSHOT_DELETE, /* until SnapshotDeleted answers the intent */
} gw_wait_kind_t;

typedef struct gw_waiter gw_waiter_t;
struct gw_waiter {
    gw_req_t *rq; /* holds a reference */
    gw_wait_kind_t kind;
    char sandbox_id[SP_ID_MAX + 1];
    char event_id[GW_EVENT_ID_LEN + 1]; /* the intent: a refusal names it as causation */
    int64_t deadline_ns;
    gw_waiter_t *prev, *next;
};

/* Registers a waiter and schedules a check (the outcome may already be there). */
void gw_wait_register(gw_t *gw, gw_req_t *rq, gw_wait_kind_t kind, const char *sandbox_id,
                      const char *event_id, int timeout_s);
/* Re-reads the rows of every waiter (after a NOTIFY, a registration, or the safety tick). */
void gw_waiters_check(gw_t *gw);
/* Answers waiters past their deadline with 504. */
void gw_waiters_expire(gw_t *gw);
/* Answers every waiter with 503 (shutdown). */
void gw_waiters_abort_all(gw_t *gw);

/* Sandboxes this gateway knows are gone before the event log may say so: it published their
 * delete, or a worker ended a command with sandbox_deleted. E2B's /health reads it first: the
 * SDK probes right after a cut stream, when the log may not have stored the delete yet. The
 * newest GW_GONE_MAX are kept (a deleted sandbox never comes back). Loop thread only. */
#define GW_GONE_MAX 512
void gw_gone_note(gw_t *gw, const char *sandbox_id);
bool gw_gone_known(const gw_t *gw, const char *sandbox_id);

/* Whether a Content-Type names application/json (parameters allowed). */
bool gw_json_content_type(const h2o_iovec_t *ct);

/* Body of POST /v1/sandboxes, validated (gateway_create.c). */
#define GW_METADATA_MAX  SP_INTENT_METADATA_MAX /* intent.h: the limits of every intent */
#define GW_ENV_MAX       SP_INTENT_ENV_MAX
#define GW_ENV_VALUE_MAX (32 * 1024)
#define GW_ERR_MSG_MAX   256
/* Validates the body and builds the SandboxCreateRequested intent for sandbox_id: the encoded
 * envelope (heap, caller frees), its subject and event id. On a client error returns -EINVAL
 * with an error code and message for a 400. The event carries env names only; the values come
 * back as a JSON object in *ret_env_json (heap, NULL without env; the caller wipes and frees
 * it). */
/* A create from a named snapshot (docs/snapshots.md): the body's "snapshot" as the log has it
 * for the tenant. Without base, a body naming a snapshot returns 1 with its id in
 * base_wanted (nothing built): the caller looks it up and builds again with it. */
typedef struct {
    char snapshot_id[SP_SNAPSHOT_ID_LEN + 1];
    char template_[SP_ID_MAX + 1];
    uint32_t vcpu, memory_mb, disk_mb;
    /* The network policy of a create without "network" (a fork's copies: the source's);
     * NULL: the gateway's default. */
    const Space__V1__NetworkPolicy *network;
} gw_create_base_t;
int gw_create_build(const gw_req_t *rq, const char *body, size_t len, const char *sandbox_id,
                    const char *idempotency_key, const gw_create_base_t *base,
                    char base_wanted[SP_SNAPSHOT_ID_LEN + 1], uint8_t **ret_buf, size_t *ret_len,
                    char ret_subject[192], char ret_event_id[GW_EVENT_ID_LEN + 1],
                    char **ret_env_json, const char **ret_code, char err[GW_ERR_MSG_MAX]);
/* POST /v1/sandboxes with a body in our shape, already checked for size and type: what the
 * E2B create calls after translating its body (no Idempotency-Key). */
void gw_sandbox_create_body(gw_req_t *rq, const char *body, size_t len);

/* ---- commands (gateway_commands.c, gateway_command_body.c) ---- */

#define GW_STDIN_MAX (1024 * 1024)

/* A validated command body. Strings borrow from doc; stdin_data is a heap copy (wiped by
 * dispose). */
typedef struct {
    sp_json_doc_t *doc;
    const char *cmd; /* NULL when argv is given */
    const char **argv;
    size_t n_argv;
    const char *env_names[GW_ENV_MAX];
    const char *env_values[GW_ENV_MAX];
    size_t n_env;
    const char *cwd;  /* NULL: the agent's default */
    const char *user; /* NULL: root */
    uint32_t timeout_s;
    bool has_stdin;
    uint8_t *stdin_data;
    size_t stdin_len;
    uint8_t stdin_sha256[SP_SHA256_LEN];
    bool background;
    bool stdin_open;
    uint32_t pty_rows, pty_cols; /* 0: no pty */
} gw_cmd_spec_t;
#define GW_PTY_DEFAULT_ROWS 24
#define GW_PTY_DEFAULT_COLS 80
#define GW_PTY_MAX          10000 /* worker_agent.h WK_AGENT_PTY_MAX */

/* Parses and checks the body; on a client error returns -EINVAL with an error code and message
 * for a 400 (s is then to be disposed all the same). */
int gw_cmd_spec_parse(const char *body, size_t len, gw_cmd_spec_t *s, const char **ret_code,
                      char err[GW_ERR_MSG_MAX]);
/* Wipes stdin and frees. Accepts NULL and a zeroed spec. */
void gw_cmd_spec_dispose(gw_cmd_spec_t *s);

/* The CommandRequested intent, built in place; every string is borrowed from s and the
 * arguments, which must outlive it. The caller stamps and publishes env (sp_publish_event).
 * sealed: without the command line (argv, cmd), which the worker records sealed. */
typedef struct {
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__CommandRequested cr;
} gw_cmd_intent_t;
void gw_cmd_intent_init(gw_cmd_intent_t *in, const gw_cmd_spec_t *s, const char *sandbox,
                        const char *tenant, const char *actor, const char *correlation,
                        const char *cmd_id, bool sealed);
/* The ExecRequest, packed into a heap buffer the caller wipes and frees; SP_ETOOBIG when it
 * would not fit in one NATS message (SP_BUS_MAX_MSG). */
int gw_cmd_exec_pack(const gw_cmd_spec_t *s, const char *sandbox, const char *tenant,
                     const char *cmd_id, const char *intent_event_id, const char *correlation,
                     uint32_t reply_wait_ms, uint8_t **ret_buf, size_t *ret_len);

/* Where a sandbox runs, read by a pool job (gateway_locate.c). */
typedef struct {
    bool failed, found;
    char state[32];
    char worker[SP_ID_MAX + 1];
} gw_sandbox_loc_t;
/* On a pool thread, with the job's connection: a running sandbox from the cache
 * (gw_loc_cache_t), anything else from PostgreSQL. */
void gw_sandbox_locate(gw_job_t *job, const char *sandbox, const char *tenant,
                       gw_sandbox_loc_t *loc);
/* The same, and the environment values a create stored for the sandbox: a JSON object text
 * (heap, the caller wipes and frees) or NULL, in *ret_env_json. The values themselves are
 * never cached: a sandbox that has some costs one query for them. */
void gw_sandbox_locate_env(gw_job_t *job, const char *sandbox, const char *tenant,
                           gw_sandbox_loc_t *loc, char **ret_env_json);
/* On the loop: answers rq with the error and returns false unless the sandbox is running on a
 * worker. */
bool gw_sandbox_loc_ok(gw_req_t *rq, const gw_sandbox_loc_t *loc);

typedef struct gw_cmd gw_cmd_t;

/* POST /v1/sandboxes/{id}/commands: run (SSE, JSON, or 202 for background). */
void gw_command_run(gw_req_t *rq);
/* The same with a body in our shape, already checked for size and type, for rq->path_id: what
 * E2B's Process.Start calls after translating its request. With rq->dialect
 * GW_DIALECT_CONNECT_STREAM the output is a Connect stream of E2B ProcessEvents (and a
 * background command streams too). */
void gw_command_run_body(gw_req_t *rq, const char *body, size_t len);
/* Follows command cmd_id of rq->path_id from after from_seq (E2B's Process.Connect); pty: the
 * command runs in a pty, whose output E2B calls "pty". */
void gw_command_attach_from(gw_req_t *rq, const char *cmd_id, uint64_t from_seq, bool pty);
/* GET /v1/sandboxes/{id}/commands/{cid}/stream: (re)attach to a command's output (SSE or JSON);
 * Last-Event-ID or ?from_seq= resumes after that seq. */
void gw_command_attach(gw_req_t *rq);
/* One control request about a command of rq->path_id (gateway_command_ctl.c), after the tenant
 * and state check. cmd_id names the command, or pid does (E2B: the worker's list is asked
 * first). On success answer (if set) responds, else our JSON; errors go through
 * gw_respond_error. data is taken (wiped and freed). */
typedef enum { GW_CTL_LIST = 0, GW_CTL_STDIN, GW_CTL_SIGNAL, GW_CTL_RESIZE } gw_ctl_op_t;
typedef struct {
    gw_ctl_op_t op;
    const char *cmd_id;
    uint32_t pid;
    uint8_t *data;
    size_t data_len;
    bool eof;
    uint32_t signal, rows, cols;
    void (*answer)(gw_req_t *rq, const Space__Io__V1__CtlReply *r, const char *cmd_id);
} gw_ctl_spec_t;
void gw_ctl_run(gw_req_t *rq, gw_ctl_spec_t *spec);
/* GET /v1/sandboxes/{id}/commands (gateway_command_ctl.c). */
void gw_command_list(gw_req_t *rq);
/* POST /v1/sandboxes/{id}/commands/{cid}/stdin|signal|resize (rq->path_action says which). */
void gw_command_ctl(gw_req_t *rq);
/* Deadlines, keepalives and write timeouts, once a second. */
void gw_commands_tick(gw_t *gw);
/* Ends every command's response (shutdown); the commands keep running in their sandboxes. With
 * force, responses stuck in a write end now. */
void gw_commands_close_all(gw_t *gw, bool force);

/* ---- files (gateway_files.c) ---- */

/* Which files route: PUT/GET/DELETE .../files, GET .../files/stat, GET .../files/list,
 * POST .../files/mkdir, POST .../files/move. */
typedef enum {
    GW_FILES_ROOT = 1,
    GW_FILES_STAT,
    GW_FILES_LIST,
    GW_FILES_MKDIR,
    GW_FILES_MOVE
} gw_files_sub_t;

typedef struct gw_file gw_file_t;

/* One file operation, whoever asked (our routes, E2B's envd): paths as the client gave them,
 * resolved against user's home; an upload's bytes are the request body (raw, or multipart). */
typedef enum {
    GW_FOP_STAT = 1,
    GW_FOP_LIST,
    GW_FOP_MKDIR,
    GW_FOP_MOVE,
    GW_FOP_REMOVE,
    GW_FOP_UPLOAD,
    GW_FOP_DOWNLOAD
} gw_fop_t;
typedef struct {
    gw_fop_t op;
    const char *path;     /* may be NULL for an E2B multipart upload (parts name their paths) */
    const char *to;       /* move */
    const char *user;     /* NULL: root */
    uint32_t mode;        /* upload: permission bits, 0 = 0644 */
    uint32_t depth;       /* list: 1..16, 0 = 1 */
    bool recursive;       /* remove */
    bool multipart_paths; /* E2B: a part's filename is its path, not a name under path */
    uint8_t *body;        /* upload: these bytes (heap, taken) instead of the request body */
    size_t body_len;
} gw_files_spec_t;
/* Starts the operation for rq->path_id (tenant and state checked first); the answer is ours or,
 * for an E2B dialect, gw_e2b_files_answer's. */
void gw_files_start(gw_req_t *rq, gw_files_spec_t *spec);

/* Makes request bodies over 4 MiB spill to an unlinked temporary file under tmp-dir (h2o's
 * mmap-backed socket buffers) instead of the heap. Before the first connection. */
int gw_files_init(gw_t *gw);
void gw_files_run(gw_req_t *rq, gw_files_sub_t sub);
/* Ends every file request's response (shutdown). */
void gw_files_close_all(gw_t *gw);

/* ---- directory watches (gateway_watch.c) ---- */

typedef struct gw_watch gw_watch_t;
/* GET /v1/sandboxes/{id}/files/watch?path=&recursive=&user=: an SSE stream of the directory's
 * events until the client goes away. */
void gw_watch_run(gw_req_t *rq);
/* Watches path (resolved against user's home) of rq->path_id: SSE, or with
 * GW_DIALECT_CONNECT_STREAM E2B's WatchDir stream. */
void gw_watch_start(gw_req_t *rq, const char *path, const char *user, bool recursive);
/* E2B's polling watcher, answered as unary Connect calls. CreateWatcher: the watch of
 * gw_watch_start without a response, {watcherId} once the worker started it (refusals as
 * WatchDir's). GetWatcherEvents: {events:[{name, type}]} buffered since the last poll.
 * RemoveWatcher: {}. An id of another sandbox or tenant, removed, expired (watcher-idle-s
 * without a poll) or ended is not_found (404). Loop thread; rq->path_id and rq->tenant must
 * be set (after authentication). */
void gw_watcher_create(gw_req_t *rq, const char *path, const char *user, bool recursive);
void gw_watcher_events(gw_req_t *rq, const char *watcher_id);
void gw_watcher_remove(gw_req_t *rq, const char *watcher_id);
/* Keepalives, write timeouts and lease renewals, once a second. */
void gw_watches_tick(gw_t *gw);
/* Ends every watch's response (shutdown); with force, responses stuck in a write end now. */
void gw_watches_close_all(gw_t *gw, bool force);

/* ---- E2B compatibility (gateway_e2b.c: control plane, gateway_e2b_envd.c: envd) ---- */

/* E2B's Sandbox JSON (create, connect), with the access token for the presented key. */
void gw_e2b_answer_sandbox(gw_req_t *rq, int status, const char *sandbox_id, const char *template_);
/* A file operation's success in E2B's shapes (Connect messages; /files upload list). */
void gw_e2b_files_answer(gw_req_t *rq, gw_fop_t op, const Space__Io__V1__FileReply *r,
                         const char *path, const char *to);
void gw_e2b_upload_answer(gw_req_t *rq, const char *const *paths, size_t n);

/* ---- streamed responses (gateway_sse.c) ----
 * The writer every long-lived response shares: the event log's SSE (gateway_events.c), a
 * command's output (gateway_commands.c), a directory watch (gateway_watch.c); SSE, or E2B's
 * Connect streams, whose records the owner frames itself. The owner embeds a gw_sse_t
 * (gw_sse_init / gw_sse_dispose), starts the response with gw_sse_start, appends whole records
 * to pending and calls gw_sse_flush. h2o allows one h2o_send in flight: records queued
 * meanwhile wait in pending and leave together once h2o proceeds. What waits is the client's
 * lag (gw_sse_backlog); each owner bounds it its own way. Loop thread only.
 *
 * The response ends once (then ops->closed): when the writer ends it (gw_sse_end,
 * gw_sse_close, gw_sse_abort) or when h2o says the client is gone. A call that can end it
 * returns false when it did: the owner may have freed itself in closed, so the caller must not
 * touch it (or the writer) after that. */
typedef struct gw_sse gw_sse_t;
typedef struct {
    /* Appends a keepalive record to pending; NULL: the SSE comment (SP_SSE_KEEPALIVE). */
    void (*keepalive)(gw_sse_t *w);
    /* Adds the owner's headers after the ones every response carries; may be NULL. */
    void (*headers)(gw_sse_t *w, h2o_req_t *req);
    /* A write completed and the next, if any, is under way; may be NULL. */
    void (*written)(gw_sse_t *w);
    /* The response is over (w->req is NULL). Runs once; the owner may free itself here. */
    void (*closed)(gw_sse_t *w);
    /* Look for a hang-up at every tick: for clients that send nothing after their request, as
     * h2o reads nothing more of a request whose response streams and would hear of it only at
     * the next write. */
    bool poll_hangup;
} gw_sse_ops_t;

struct gw_sse {
    h2o_generator_t gen; /* first member: h2o hands it back to proceed and stop */
    const gw_sse_ops_t *ops;
    gw_req_t *rq;   /* borrowed: the owner holds a reference */
    h2o_req_t *req; /* while the response is open, else NULL */
    bool sending;   /* an h2o_send is in flight: wait for proceed */
    bool ending;    /* end once pending is written */
    bool closing;   /* end after the write in flight; pending is dropped */
    int64_t sending_since_ns, last_write_ns;
    sp_buf_t pending;  /* records not yet handed to h2o: the owner appends here */
    sp_buf_t inflight; /* records h2o is writing (valid until proceed) */
};

void gw_sse_init(gw_sse_t *w);
void gw_sse_dispose(gw_sse_t *w);
/* Starts rq's 200 response (gw_req_live(rq) must hold) with content_type and the headers every
 * response carries, and counts it as a stream until it ends. ops must outlive the response. */
void gw_sse_start(gw_sse_t *w, gw_req_t *rq, const char *content_type, const gw_sse_ops_t *ops);
/* Hands pending to h2o unless a write is in flight (then proceed does). False once the
 * response ended (here, or before). */
bool gw_sse_flush(gw_sse_t *w);
/* Ends the response once everything queued is written. */
bool gw_sse_end(gw_sse_t *w);
/* Ends the response after the write in flight; what is not yet handed to h2o is dropped. */
bool gw_sse_close(gw_sse_t *w);
/* Ends the response now, logging why: with a write in flight, by shutting the socket down,
 * which fails the write, and h2o then closes the connection and calls stop. */
void gw_sse_abort(gw_sse_t *w, const char *why);
/* Drops the response as a broken connection would, logging why: no clean end of the body
 * (no last chunk), the connection closed. What is pending is dropped. */
void gw_sse_cut(gw_sse_t *w, const char *why);
/* Bytes queued or being written: how far the client lags behind. */
size_t gw_sse_backlog(const gw_sse_t *w);
/* Once a second: a write stuck for sse-write-timeout-s aborts the response (counted as closed
 * slow), a response idle for sse-keepalive-s gets a keepalive, a hung-up client (poll_hangup)
 * is made to fail its next write. False once the response ended. */
bool gw_sse_tick(gw_sse_t *w, int64_t now_ns);

/* ---- the event log's stream (gateway_events.c) ---- */

void gw_events_open(gw_req_t *rq, bool per_sandbox);
/* The head moved: streams that are live fetch what is new. */
void gw_events_notify(gw_t *gw);
/* Keepalives and write timeouts, once a second. */
void gw_events_tick(gw_t *gw);
/* Ends every stream (shutdown): idle ones now, busy ones after their write (or at once with
 * force, by shutting the socket down). */
void gw_events_close_all(gw_t *gw, bool force);

typedef struct gw_stream gw_stream_t;

/* ---- the daemon ---- */

struct gw {
    const gw_config_t *cfg;
    uv_loop_t *loop;
    h2o_globalconf_t h2o_config;
    h2o_context_t h2o_ctx;
    h2o_accept_ctx_t accept_ctx;
    uv_tcp_t listener;
    bool listener_open;
    sp_bus_t *bus;
    gw_pool_t pool;
    gw_listener_t notify;
    uint64_t head_seq; /* newest stream_seq the event log announced */
    gw_metrics_t metrics;
    gw_auth_cache_t auth;
    uint64_t keys_gen;        /* notify.keys_gen the cache was last flushed for */
    sp_sign_key_t *token_key; /* signs E2B access tokens: the identity's key (borrowed) */
    /* Tokens made with a key since rotated (docs/trust.md, "Rotating a key"): the identity's
     * retired keys, from its keyring directory; NULL without an identity. */
    gw_token_ring_t *token_ring;
    /* Waiters and the one check job that may be in flight for them. */
    gw_waiter_t *waiters;
    size_t n_waiters;
    bool check_running, check_again;
    /* SSE streams. */
    gw_stream_t *streams;
    size_t n_streams;
    size_t n_stream_opening;
    /* Commands: every one from validation to the close of its async handle. */
    gw_cmd_t *commands;
    size_t n_commands;
    uint64_t bus_reconnects; /* sp_bus_reconnects when the commands last looked */
    /* Bus jobs (blocking NATS calls without a database connection), in two lanes. */
    gw_bus_lane_t bus_lane;  /* commands and their control: bus-threads */
    gw_bus_lane_t file_lane; /* file calls: file-threads */
    /* File requests: every one from validation to its free. */
    gw_file_t *files;
    size_t n_files;
    /* Directory watches: every one from validation to the close of its async handle. */
    gw_watch_t *watches;
    size_t n_watches;
    /* gw_gone_note's ring: the newest gone sandboxes. */
    char gone[GW_GONE_MAX][SP_ID_MAX + 1];
    size_t gone_next;
    /* E2B signed URLs: the token index and the failure rates (gateway_signed.c). */
    gw_signed_t signed_urls;
    bool stopping;
};

/* ---- request heads (gateway_head.c) and the gate (gateway_gate.c) ---- */

#define GW_HEAD_MAX        65536 /* a longer request head is 431 */
#define GW_HEAD_FIELDS_MAX 100   /* h2o 2.2's H2O_MAX_HEADERS */

/* Where a head ends, found incrementally: zero it for each request, call with all the bytes
 * so far. 1 when the head is complete (scanned = its length, leading empty lines included),
 * 0 when more is needed, -EINVAL (*ret_why, a static string) on a bare LF or CR. */
typedef struct {
    size_t scanned, line_start, lines;
} gw_head_scan_t;
int gw_head_scan(gw_head_scan_t *s, const char *p, size_t n, const char **ret_why);

/* A head read strictly (RFC 9112): one framing at most (one Content-Length of digits, or
 * Transfer-Encoding: chunked alone, never both), no obs-fold, no whitespace before a colon,
 * no control characters, exactly one Host in HTTP/1.1, at most GW_HEAD_FIELDS_MAX fields. */
typedef struct {
    size_t len;             /* of the head, final CRLF included */
    int minor;              /* HTTP/1.<minor> */
    int64_t content_length; /* -1 when absent */
    bool chunked;
    bool has_body;
    bool expect_continue, expect_other;
    size_t expect_at; /* offset of the Expect field's name, SIZE_MAX when absent */
    size_t fields;
    bool too_large; /* refused for its number of fields (431) */
} gw_head_t;
/* p[0..n) is a complete head (gw_head_scan). 0, or -EINVAL with *ret_why (static). */
int gw_head_parse(const char *p, size_t n, gw_head_t *h, const char **ret_why);

/* Puts the gate in front of a connection h2o just accepted; NULL when it cannot (left to
 * h2o). Freed with gw_gate_free once the connection's handle is closed. */
gw_gate_t *gw_gate_attach(gw_t *gw, h2o_socket_t *sock);
void gw_gate_free(gw_gate_t *g);
/* At exit, before the loop's handles are walked. */
void gw_gate_dispose(void);
/* The gate of the connection a request came on, or NULL. */
gw_gate_t *gw_gate_of(h2o_req_t *req);
/* h2o dispatches the request: the context made while its body waited, if any (authenticated
 * and allowed); else NULL, with *ret_bad a reason when the head must be refused. */
gw_req_t *gw_gate_dispatched(gw_gate_t *g, const char **ret_bad);
/* The held request's key is good: 413 when the announced length is over rq->body_limit,
 * else the body is read (after a 100 Continue when one was asked for). */
void gw_gate_allowed(gw_gate_t *g, gw_req_t *rq);
/* An answer goes out while the body is unread: the connection closes after it, lingering. */
void gw_gate_answering(gw_gate_t *g);
void gw_gate_set_req(gw_gate_t *g, gw_req_t *rq);
/* The request ended (its pool is cleared): the next one starts at its head. */
void gw_gate_request_done(gw_gate_t *g);
/* gateway_http.c, for the gate: h2o's request of the connection on sock, and the routing of
 * a held request (a context, then the router with head_only set). */
h2o_req_t *gw__find_req(gw_t *gw, h2o_socket_t *sock);
void gw__route_head(gw_t *gw, h2o_req_t *req, gw_gate_t *g);

/* A connection's file descriptor, for shutdown(2) when a stream must end now. -1 if unknown. */
int gw_req_fd(h2o_req_t *req);

/* ---- routes (gateway_http.c) ----
 *
 * One row type and one matcher for every API the gateway speaks: ours (/v1, /healthz,
 * /metrics, the console), E2B's control plane and envd's in-sandbox API. The rows live in
 * three tables (gateway_http.c, gateway_e2b.c, gateway_e2b_envd.c, so each file's handlers
 * stay static) that the matcher scans in that order as one list. */

/* How a row's caller proves who it is, checked before the handler runs. */
typedef enum {
    GW_AUTH_PUBLIC = 0, /* nobody: the handler runs at once */
    GW_AUTH_KEY,        /* our API key, Authorization: Bearer */
    GW_AUTH_E2B_KEY,    /* E2B's X-API-KEY (else Authorization: Bearer) */
    /* envd: X-Access-Token (the sandbox's envdAccessToken, good for that sandbox only) or
     * X-API-KEY; the sandbox from E2b-Sandbox-Id, the token or the Host name. */
    GW_AUTH_ENVD,
    GW_AUTH_ENVD_SIGNED /* GW_AUTH_ENVD, else a signed URL (gateway_signed.c) */
} gw_auth_kind_t;

#define GW_ROUTE_FILE_BODY 1u /* the body may be max-file-bytes, not max-body-bytes */
#define GW_ROUTE_SNAPSHOT  2u /* the {id} is a snapshot's: it begins with "snp_" */

/* One route: method ("*": any, see below) and path pattern, the dialect its answers and
 * errors speak (set on the request as soon as the row is chosen, so authentication's errors
 * speak it too), how it authenticates, the metrics label, the handler and, for a handler of
 * several routes, the action it reads from rq->path_action.
 *
 * Patterns: literal segments compare exactly; a {name} segment takes 1..SP_ID_MAX bytes
 * without '/' ({cid} goes to rq->path_sub_id, {id} and {file} to rq->path_id, other names
 * are matched only: the handler reads them from the path); a last segment "*" takes the rest
 * of the path, nothing included (so "/templates" then "*" matches "/templates" and
 * "/templates/a/b").
 *
 * The first row whose pattern and method match answers. A row of method "*" is a fallback:
 * when an earlier row had the path but not the method, the answer is 405 naming the methods
 * of those rows (Allow), in the path's dialect; with no row at all, 404 (E2B's shape outside
 * /v1). */
typedef struct {
    const char *method;
    const char *path;
    gw_dialect_t dialect;
    gw_auth_kind_t auth;
    gw_route_t metric;
    void (*fn)(gw_req_t *rq);
    unsigned flags;
    const char *action;
} gw_route_def_t;

/* Our rows (every /v1 route, /healthz, /metrics, the console's files). */
extern const gw_route_def_t gw_routes[];
extern const size_t gw_n_routes;
/* E2B's control plane (gateway_e2b.c) and envd (gateway_e2b_envd.c). */
extern const gw_route_def_t gw_e2b_routes[];
extern const size_t gw_n_e2b_routes;
extern const gw_route_def_t gw_envd_routes[];
extern const size_t gw_n_envd_routes;

/* GW_AUTH_ENVD[_SIGNED] (gateway_e2b_envd.c): finds the sandbox and the credential, then
 * runs rq->after_auth once verified, or answers 401 itself. */
void gw_e2b_envd_auth(gw_req_t *rq, bool signed_ok);

/* "METHOD PATH" per line, the table's order: `space-gateway --list-routes`. */
void gw_routes_print(FILE *out);

/* api/openapi.json, embedded at build time (gateway-api/CMakeLists.txt). */
extern const unsigned char gw_openapi_json[];
extern const size_t gw_openapi_json_len;

int gw_http_init(gw_t *gw);
void gw_http_dispose(gw_t *gw);
/* Number of open HTTP connections. */
size_t gw_http_connections(gw_t *gw);
/* Half-closes every connection for reading: idle ones end now, busy ones after answering. */
void gw_http_shutdown_reads(gw_t *gw);

/* RFC 3339 UTC with milliseconds ("2026-01-02T03:04:05.678Z") of microseconds since the
 * epoch, or null when us is 0 or negative. Appends a JSON value. */
void gw_json_time(sp_buf_t *b, int64_t us);

#endif
