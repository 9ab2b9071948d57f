/* HTTP front end: h2o on the libuv loop, routing, request contexts, responses, the query
 * string, and the JSON form of the errors h2o produces by itself.
 *
 * h2o 2.2 reads a request's whole body before it calls the handler, and stops reading the
 * connection until the response is complete: a request therefore stays alive while a job or a
 * wait runs for it, and only an SSE stream can see its client vanish (the generator's stop).
 * The request context (gw_req_t) is still a heap object tied to the request's pool, so a job
 * that finishes after the request is gone finds rq->req == NULL instead of freed memory. */
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"
#include "text.h"

typedef struct {
    h2o_handler_t super;
    gw_t *gw;
} gw_handler_t;

typedef struct {
    h2o_filter_t super;
    gw_t *gw;
} gw_filter_t;

/* An accepted connection: the uv handle h2o uses, and who to tell when it closes. */
typedef struct {
    uv_tcp_t tcp;
    gw_t *gw;
    gw_gate_t *gate;
} gw_conn_t;

static size_t n_connections;

/* ---- small helpers ---- */

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 204:
        return "No Content";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 412:
        return "Precondition Failed";
    case 413:
        return "Payload Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 417:
        return "Expectation Failed";
    case 431:
        return "Request Header Fields Too Large";
    case 429:
        return "Too Many Requests";
    case 501:
        return "Not Implemented";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 507:
        return "Insufficient Storage";
    default:
        return "Unknown";
    }
}

bool gw_text_ok(const char *s, size_t max)
{
    return sp_text_valid(s, max, 0);
}

int gw_bad(gw_verr_t *e, const char *code, const char *fmt, ...)
{
    va_list ap;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, GW_ERR_MSG_MAX, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* A client's X-Request-Id is echoed only if it is a plain token: it goes into logs, events and
 * a response header. */
static bool request_id_ok(const char *s, size_t len)
{
    if (len == 0 || len > GW_REQUEST_ID_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

static void pick_request_id(h2o_req_t *req, char out[GW_REQUEST_ID_MAX + 1])
{
    ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-request-id"), -1);
    if (i >= 0) {
        const h2o_iovec_t *v = &req->headers.entries[i].value;
        if (request_id_ok(v->base, v->len)) {
            memcpy(out, v->base, v->len);
            out[v->len] = '\0';
            return;
        }
    }
    sp_uuid7_str(out);
}

static void copy_iovec(char *dst, size_t cap, h2o_iovec_t v)
{
    size_t n = v.len < cap - 1 ? v.len : cap - 1;
    if (n)
        memcpy(dst, v.base, n);
    dst[n] = '\0';
}

/* Whether a query key (raw, percent-encoded or not) decodes to "signature". */
static bool is_signature_key(const char *k, size_t n)
{
    static const char want[] = "signature";
    size_t o = 0;
    for (size_t i = 0; i < n; i++, o++) {
        int c = (unsigned char)k[i];
        if (c == '%' && i + 2 < n && sp_hex_digit(k[i + 1]) >= 0 && sp_hex_digit(k[i + 2]) >= 0) {
            c = sp_hex_digit(k[i + 1]) * 16 + sp_hex_digit(k[i + 2]);
            i += 2;
        }
        if (o >= sizeof(want) - 1 || c != want[o])
            return false;
    }
    return o == sizeof(want) - 1;
}

void gw_log_path(char *dst, size_t cap, h2o_iovec_t path)
{
    /* A signed E2B URL's signature is a credential (gateway_signed.c): the log keeps the
     * parameter, not its value. */
    const char *q = memchr(path.base, '?', path.len);
    size_t o = 0;
    if (!q) {
        copy_iovec(dst, cap, path);
        return;
    }
    size_t head = (size_t)(q - path.base) + 1;
    if (head > cap - 1)
        head = cap - 1;
    memcpy(dst, path.base, head);
    o = head;
    const char *p = q + 1, *end = path.base + path.len;
    while (p < end && o < cap - 1) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *seg_end = amp ? amp + 1 : end;
        const char *eq = memchr(p, '=', (size_t)(seg_end - p));
        const char *keep_end = seg_end;
        static const char mask[] = "REDACTED";
        bool redact = eq && is_signature_key(p, (size_t)(eq - p));
        if (redact)
            keep_end = eq + 1;
        size_t n = (size_t)(keep_end - p);
        if (n > cap - 1 - o)
            n = cap - 1 - o;
        memcpy(dst + o, p, n);
        o += n;
        if (redact) {
            size_t m = sizeof(mask) - 1 < cap - 1 - o ? sizeof(mask) - 1 : cap - 1 - o;
            memcpy(dst + o, mask, m);
            o += m;
            if (amp && o < cap - 1)
                dst[o++] = '&';
        }
        p = seg_end;
    }
    dst[o] = '\0';
}

int gw_req_fd(h2o_req_t *req)
{
    if (!req->conn || !req->conn->callbacks->get_socket)
        return -1;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    return sock ? h2o_socket_get_fd(sock) : -1;
}

/* ---- request contexts ---- */

void gw_req_ref(gw_req_t *rq)
{
    rq->refs++;
}

void gw_req_unref(gw_req_t *rq)
{
    if (!rq || --rq->refs > 0)
        return;
    free(rq);
}

bool gw_req_live(const gw_req_t *rq)
{
    return rq && rq->req && !rq->responded;
}

static void in_flight_done(gw_req_t *rq)
{
    if (rq->counted_in_flight) {
        rq->counted_in_flight = false;
        rq->gw->metrics.in_flight--;
    }
}

void gw_req_mark_streaming(gw_req_t *rq)
{
    rq->responded = true;
    in_flight_done(rq);
}

/* h2o clears the pool when the request ends (answered, or its connection closed). */
static void on_pool_dispose(void *p)
{
    gw_req_t *rq = *(gw_req_t **)p;
    if (!rq->responded && rq->req) {
        /* Ended without an answer from us (connection closed under a stream, shutdown). */
        in_flight_done(rq);
    }
    rq->req = NULL;
    if (rq->gate) {
        gw_gate_request_done(rq->gate);
        rq->gate = NULL;
    }
    gw_req_unref(rq);
}

static gw_req_t *req_new(gw_t *gw, h2o_req_t *req)
{
    gw_req_t *rq = sp_xcalloc(1, sizeof(*rq));
    rq->gw = gw;
    rq->req = req;
    rq->refs = 1; /* the pool's */
    rq->route = GW_R_OTHER;
    rq->body_limit = gw->cfg->max_body_bytes;
    rq->start_ns = sp_mono_ns();
    pick_request_id(req, rq->request_id);
    copy_iovec(rq->method, sizeof(rq->method), req->method);
    gw_log_path(rq->path, sizeof(rq->path), req->path);
    gw_req_t **link = h2o_mem_alloc_shared(&req->pool, sizeof(gw_req_t *), on_pool_dispose);
    *link = rq;
    rq->counted_in_flight = true;
    gw->metrics.in_flight++;
    return rq;
}

const h2o_iovec_t *gw_req_header(const gw_req_t *rq, const char *name, bool *ret_dup)
{
    const h2o_headers_t *h = &rq->req->headers;
    ssize_t i = h2o_find_header_by_str(h, name, strlen(name), -1);
    if (ret_dup)
        *ret_dup = i >= 0 && h2o_find_header_by_str(h, name, strlen(name), i) >= 0;
    return i >= 0 ? &h->entries[i].value : NULL;
}

/* ---- responses ---- */

void gw_log_request(gw_req_t *rq, int status)
{
    double ms = (double)(sp_mono_ns() - rq->start_ns) / 1e6;
    sp_log(SP_LOG_INFO, "request", SP_KS("method", rq->method), SP_KS("path", rq->path),
           SP_KI("status", status), SP_KF("duration_ms", ms), SP_KS("request_id", rq->request_id),
           SP_KS("tenant", rq->tenant));
}

void gw_add_common_headers(gw_req_t *rq, const char *content_type)
{
    h2o_req_t *req = rq->req;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, content_type,
                   strlen(content_type));
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-request-id"), 0, NULL,
                          rq->request_id, strlen(rq->request_id));
    /* API answers are never stored; a handler that set its own policy (the console's static
     * files: no-cache) keeps it. */
    if (h2o_find_header(&req->res.headers, H2O_TOKEN_CACHE_CONTROL, -1) < 0)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                       H2O_STRLIT("no-store"));
}

void gw_respond(gw_req_t *rq, int status, const char *content_type, const char *body, size_t len)
{
    static h2o_generator_t generator = {NULL, NULL};

    if (!gw_req_live(rq))
        return;
    h2o_req_t *req = rq->req;
    if (rq->head_only && rq->gate)
        gw_gate_answering(rq->gate);
    rq->responded = true;
    rq->status = status;
    req->res.status = status;
    req->res.reason = reason_phrase(status);
    gw_add_common_headers(rq, content_type);
    req->res.content_length = len;
    h2o_iovec_t buf = h2o_strdup(&req->pool, body ? body : "", len);
    h2o_start_response(req, &generator);
    h2o_send(req, &buf, 1, H2O_SEND_STATE_FINAL);
    gw_metrics_request(&rq->gw->metrics, rq->route, status);
    in_flight_done(rq);
    gw_log_request(rq, status);
}

void gw_respond_json(gw_req_t *rq, int status, const sp_buf_t *body)
{
    gw_respond(rq, status, "application/json", body->data, body->len);
}

void gw_respond_error(gw_req_t *rq, int status, const char *code, const char *extra_json,
                      const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    sp_buf_t b;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* Messages may quote client input: keep them valid UTF-8 before escaping. */
    sp_buf_t safe;
    sp_buf_init(&safe);
    sp_buf_safe_text(&safe, msg, sizeof(msg));
    const char *text = safe.data ? safe.data : "";
    sp_buf_init(&b);
    switch (rq->dialect) {
    case GW_DIALECT_E2B:
        /* E2B's clients read the numeric code (404 = not found, 409 = already paused). */
        sp_buf_printf(&b, "{\"code\":%d,\"message\":", status);
        sp_buf_json_str(&b, text);
        sp_buf_putc(&b, '}');
        gw_respond_json(rq, status, &b);
        break;
    case GW_DIALECT_CONNECT:
    case GW_DIALECT_CONNECT_STREAM: {
        int cstatus;
        const char *ccode = gw_connect_code(status, code, &cstatus);
        sp_buf_puts(&b, "{\"code\":");
        sp_buf_json_str(&b, ccode);
        sp_buf_puts(&b, ",\"message\":");
        sp_buf_json_str(&b, text);
        sp_buf_putc(&b, '}');
        if (rq->dialect == GW_DIALECT_CONNECT) {
            gw_respond_json(rq, cstatus, &b);
            break;
        }
        /* A stream's error is its end-stream message, after a 200 (Connect protocol). */
        sp_buf_t env;
        sp_buf_init(&env);
        sp_buf_puts(&env, "{\"error\":");
        sp_buf_append(&env, b.data, b.len);
        sp_buf_putc(&env, '}');
        sp_buf_reset(&b);
        gw_connect_envelope(&b, GW_CONNECT_END_STREAM, env.data, env.len);
        sp_buf_dispose(&env);
        gw_respond(rq, 200, "application/connect+json", b.data, b.len);
        break;
    }
    default:
        sp_buf_puts(&b, "{\"code\":");
        sp_buf_json_str(&b, code);
        sp_buf_puts(&b, ",\"message\":");
        sp_buf_json_str(&b, text);
        if (extra_json) {
            sp_buf_putc(&b, ',');
            sp_buf_puts(&b, extra_json);
        }
        sp_buf_putc(&b, '}');
        gw_respond_json(rq, status, &b);
        break;
    }
    sp_buf_dispose(&safe);
    sp_buf_dispose(&b);
}

void gw_connect_envelope(sp_buf_t *b, unsigned flags, const char *json, size_t len)
{
    uint8_t head[5] = {(uint8_t)flags, (uint8_t)(len >> 24), (uint8_t)(len >> 16),
                       (uint8_t)(len >> 8), (uint8_t)len};
    sp_buf_append(b, head, sizeof(head));
    sp_buf_append(b, json, len);
}

const char *gw_connect_code(int status, const char *code, int *ret_status)
{
    /* Our codes that say more than their status (the SDKs act on these). */
    static const struct {
        const char *ours, *connect;
        int status;
    } BY_CODE[] = {
        {"exists", "already_exists", 409},
        {"sandbox_not_running", "failed_precondition", 412},
        {"command_not_running", "not_found", 404},
        {"stdin_closed", "failed_precondition", 412},
        {"not_a_pty", "failed_precondition", 412},
        {"is_directory", "invalid_argument", 400},
        {"not_directory", "invalid_argument", 400},
        {"not_empty", "failed_precondition", 412},
        {"timeout", "deadline_exceeded", 504},
        {"unimplemented", "unimplemented", 501},
    };
    for (size_t i = 0; code && i < sizeof(BY_CODE) / sizeof(BY_CODE[0]); i++) {
        if (strcmp(code, BY_CODE[i].ours) == 0) {
            *ret_status = BY_CODE[i].status;
            return BY_CODE[i].connect;
        }
    }
    /* Otherwise by status (connectrpc.com/docs/protocol, "Error Codes"). */
    const char *c;
    switch (status) {
    case 400:
    case 413:
    case 414:
    case 415:
        c = "invalid_argument", *ret_status = 400;
        break;
    case 401:
        c = "unauthenticated", *ret_status = 401;
        break;
    case 403:
        c = "permission_denied", *ret_status = 403;
        break;
    case 404:
        c = "not_found", *ret_status = 404;
        break;
    case 405:
    case 501:
        c = "unimplemented", *ret_status = 501;
        break;
    case 409:
        c = "aborted", *ret_status = 409;
        break;
    case 429:
    case 507:
        c = "resource_exhausted", *ret_status = 429;
        break;
    case 502:
    case 503:
        c = "unavailable", *ret_status = 503;
        break;
    case 504:
        c = "deadline_exceeded", *ret_status = 504;
        break;
    default:
        c = "internal", *ret_status = 500;
        break;
    }
    return c;
}

/* ---- query strings ---- */

/* application/x-www-form-urlencoded decoding (WHATWG URL, section 5.1): '+' is a space. A
 * decoded NUL is refused: values become C strings. */
char *gw_url_decode(h2o_mem_pool_t *pool, const char *s, size_t len)
{
    char *out = h2o_mem_alloc_pool(pool, len + 1);
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '%') {
            int hi, lo;
            if (i + 2 >= len)
                return NULL;
            hi = sp_hex_digit(s[i + 1]);
            lo = sp_hex_digit(s[i + 2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return NULL;
            out[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else if (s[i] == '+') {
            out[o++] = ' ';
        } else {
            out[o++] = s[i];
        }
    }
    out[o] = '\0';
    return out;
}

int gw_query_parse(h2o_req_t *req, gw_query_t *q)
{
    q->n = 0;
    if (req->query_at == SIZE_MAX)
        return 0;
    const char *p = req->path.base + req->query_at + 1;
    const char *end = req->path.base + req->path.len;
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *seg_end = amp ? amp : end;
        if (seg_end > p) {
            if (q->n == GW_QUERY_MAX)
                return -E2BIG;
            const char *eq = memchr(p, '=', (size_t)(seg_end - p));
            const char *kend = eq ? eq : seg_end;
            char *k = gw_url_decode(&req->pool, p, (size_t)(kend - p));
            char *v = eq ? gw_url_decode(&req->pool, eq + 1, (size_t)(seg_end - eq - 1))
                         : gw_url_decode(&req->pool, "", 0);
            if (!k || !v)
                return -EINVAL;
            q->p[q->n].key = k;
            q->p[q->n].value = v;
            q->n++;
        }
        p = seg_end + 1;
    }
    return 0;
}

/* ---- routing ---- */

static void metrics_page(gw_req_t *rq)
{
    sp_buf_t b;
    sp_buf_init(&b);
    gw_metrics_render(&rq->gw->metrics, &b);
    gw_metrics_render_locs(&rq->gw->notify.locs, &b);
    sp_buf_printf(&b,
                  "# HELP space_gateway_signed_url_failures_total E2B signed /files requests "
                  "refused: no indexed token matched their signature.\n"
                  "# TYPE space_gateway_signed_url_failures_total counter\n"
                  "space_gateway_signed_url_failures_total %" PRIu64 "\n"
                  "# HELP space_gateway_signed_url_limited_total E2B signed /files requests "
                  "answered 429: their client failed too many lookups.\n"
                  "# TYPE space_gateway_signed_url_limited_total counter\n"
                  "space_gateway_signed_url_limited_total %" PRIu64 "\n",
                  rq->gw->signed_urls.failures, rq->gw->signed_urls.limited);
    gw_respond(rq, 200, "text/plain; version=0.0.4", b.data, b.len);
    sp_buf_dispose(&b);
}

static void method_not_allowed(gw_req_t *rq, const char *allow)
{
    h2o_add_header(&rq->req->pool, &rq->req->res.headers, H2O_TOKEN_ALLOW, NULL, allow,
                   strlen(allow));
    gw_respond_error(rq, 405, "method_not_allowed", NULL, "%s is not allowed here; use %s",
                     rq->method, allow);
}

static bool is_method(const h2o_req_t *req, const char *m)
{
    return h2o_memis(req->method.base, req->method.len, m, strlen(m));
}

void gw__req_authed(gw_req_t *rq)
{
    if (rq->head_only && rq->gate)
        gw_gate_allowed(rq->gate, rq);
    else
        rq->after_auth(rq);
}

static void events_all(gw_req_t *rq)
{
    gw_events_open(rq, false);
}

static void events_sandbox(gw_req_t *rq)
{
    gw_events_open(rq, true);
}

static void files_root(gw_req_t *rq)
{
    gw_files_run(rq, GW_FILES_ROOT);
}

static void files_stat(gw_req_t *rq)
{
    gw_files_run(rq, GW_FILES_STAT);
}

static void files_list(gw_req_t *rq)
{
    gw_files_run(rq, GW_FILES_LIST);
}

static void files_mkdir(gw_req_t *rq)
{
    gw_files_run(rq, GW_FILES_MKDIR);
}

static void files_move(gw_req_t *rq)
{
    gw_files_run(rq, GW_FILES_MOVE);
}

static void openapi_document(gw_req_t *rq)
{
    gw_respond(rq, 200, "application/json", (const char *)gw_openapi_json, gw_openapi_json_len);
}

/* Our rows of the route table (gateway.h: gw_route_def_t): every /v1 route, /healthz, /metrics
 * and the web console's files (gateway_console.c). route() matches requests against them
 * (then E2B's rows), `space-gateway --list-routes` prints them, and tests/openapi checks
 * api/openapi.json against that list (both ways). A route served but not here does not
 * exist. {id} and {cid} are checked by the handler after authentication, so a malformed id
 * reads as unknown. Rows of one path are listed together, in the order the Allow header of a
 * 405 names them. */
/* clang-format off */
#define V1(m, path, metric, fn) {m, path, GW_DIALECT_V1, GW_AUTH_KEY, metric, fn, 0, NULL}
#define V1_PUBLIC(m, path, metric, fn) \
    {m, path, GW_DIALECT_V1, GW_AUTH_PUBLIC, metric, fn, 0, NULL}
/* clang-format on */

const gw_route_def_t gw_routes[] = {
    V1_PUBLIC("GET", "/healthz", GW_R_HEALTHZ, gw_health),
    V1_PUBLIC("GET", "/metrics", GW_R_METRICS, metrics_page),
    V1_PUBLIC("GET", "/v1/openapi.json", GW_R_OPENAPI, openapi_document),
    V1_PUBLIC("GET", "/", GW_R_CONSOLE, gw_console),
    V1_PUBLIC("GET", "/console/", GW_R_CONSOLE, gw_console),
    V1_PUBLIC("GET", "/console/{file}", GW_R_CONSOLE, gw_console),
    V1("GET", "/v1/sandboxes", GW_R_SANDBOX_LIST, gw_sandbox_list),
    V1("POST", "/v1/sandboxes", GW_R_SANDBOX_CREATE, gw_sandbox_create),
    V1("GET", "/v1/templates", GW_R_TEMPLATES, gw_templates),
    V1("GET", "/v1/events", GW_R_EVENTS, events_all),
    V1("GET", "/v1/credentials", GW_R_CREDENTIALS, gw_credentials),
    V1("POST", "/v1/credentials", GW_R_CREDENTIALS, gw_credentials),
    V1("GET", "/v1/credentials/{id}", GW_R_CREDENTIALS, gw_credentials),
    V1("PUT", "/v1/credentials/{id}", GW_R_CREDENTIALS, gw_credentials),
    V1("DELETE", "/v1/credentials/{id}", GW_R_CREDENTIALS, gw_credentials),
    V1("GET", "/v1/keys", GW_R_KEYS, gw_keys),
    V1("POST", "/v1/keys", GW_R_KEYS, gw_keys),
    V1("DELETE", "/v1/keys/{id}", GW_R_KEYS, gw_keys),
    V1("GET", "/v1/sandboxes/{id}", GW_R_SANDBOX_GET, gw_sandbox_get),
    V1("DELETE", "/v1/sandboxes/{id}", GW_R_SANDBOX_DELETE, gw_sandbox_delete),
    V1("GET", "/v1/sandboxes/{id}/events", GW_R_SANDBOX_EVENTS, events_sandbox),
    V1("PUT", "/v1/sandboxes/{id}/network", GW_R_SANDBOX_NETWORK, gw_sandbox_network_put),
    {"POST", "/v1/sandboxes/{id}/pause", GW_DIALECT_V1, GW_AUTH_KEY, GW_R_SANDBOX_LIFECYCLE,
     gw_sandbox_lifecycle, 0, "pause"},
    {"POST", "/v1/sandboxes/{id}/resume", GW_DIALECT_V1, GW_AUTH_KEY, GW_R_SANDBOX_LIFECYCLE,
     gw_sandbox_lifecycle, 0, "resume"},
    {"POST", "/v1/sandboxes/{id}/suspend", GW_DIALECT_V1, GW_AUTH_KEY, GW_R_SANDBOX_LIFECYCLE,
     gw_sandbox_lifecycle, 0, "suspend"},
    {"POST", "/v1/sandboxes/{id}/timeout", GW_DIALECT_V1, GW_AUTH_KEY, GW_R_SANDBOX_LIFECYCLE,
     gw_sandbox_lifecycle, 0, "timeout"},
    V1("POST", "/v1/sandboxes/{id}/snapshots", GW_R_SNAPSHOTS, gw_snapshot_take),
    V1("POST", "/v1/sandboxes/{id}/fork", GW_R_SNAPSHOTS, gw_sandbox_fork),
    V1("GET", "/v1/snapshots", GW_R_SNAPSHOTS, gw_snapshot_list),
    V1("DELETE", "/v1/snapshots/{id}", GW_R_SNAPSHOTS, gw_snapshot_delete),
    V1("GET", "/v1/sandboxes/{id}/metrics", GW_R_SANDBOX_METRICS, gw_sandbox_metrics),
    V1("GET", "/v1/sandboxes/{id}/commands", GW_R_COMMAND_LIST, gw_command_list),
    V1("POST", "/v1/sandboxes/{id}/commands", GW_R_SANDBOX_COMMANDS, gw_command_run),
    {"GET", "/v1/sandboxes/{id}/commands/{cid}/stream", GW_DIALECT_V1, GW_AUTH_KEY,
     GW_R_COMMAND_STREAM, gw_command_attach, 0, "stream"},
    {"POST", "/v1/sandboxes/{id}/commands/{cid}/stdin", GW_DIALECT_V1, GW_AUTH_KEY,
     GW_R_COMMAND_CTL, gw_command_ctl, 0, "stdin"},
    {"POST", "/v1/sandboxes/{id}/commands/{cid}/signal", GW_DIALECT_V1, GW_AUTH_KEY,
     GW_R_COMMAND_CTL, gw_command_ctl, 0, "signal"},
    {"POST", "/v1/sandboxes/{id}/commands/{cid}/resize", GW_DIALECT_V1, GW_AUTH_KEY,
     GW_R_COMMAND_CTL, gw_command_ctl, 0, "resize"},
    V1("GET", "/v1/sandboxes/{id}/files", GW_R_SANDBOX_FILES, files_root),
    {"PUT", "/v1/sandboxes/{id}/files", GW_DIALECT_V1, GW_AUTH_KEY, GW_R_SANDBOX_FILES, files_root,
     GW_ROUTE_FILE_BODY, NULL},
    V1("DELETE", "/v1/sandboxes/{id}/files", GW_R_SANDBOX_FILES, files_root),
    V1("GET", "/v1/sandboxes/{id}/files/stat", GW_R_SANDBOX_FILES, files_stat),
    V1("GET", "/v1/sandboxes/{id}/files/list", GW_R_SANDBOX_FILES, files_list),
    V1("POST", "/v1/sandboxes/{id}/files/mkdir", GW_R_SANDBOX_FILES, files_mkdir),
    V1("POST", "/v1/sandboxes/{id}/files/move", GW_R_SANDBOX_FILES, files_move),
    V1("GET", "/v1/sandboxes/{id}/files/watch", GW_R_SANDBOX_FILES, gw_watch_run),
};
const size_t gw_n_routes = sizeof(gw_routes) / sizeof(gw_routes[0]);

void gw_routes_print(FILE *out)
{
    for (size_t i = 0; i < gw_n_routes; i++)
        fprintf(out, "%s %s\n", gw_routes[i].method, gw_routes[i].path);
}

/* The tables the matcher scans, in this order, as one list of rows. */
static const struct {
    const gw_route_def_t *rows;
    const size_t *n;
} route_tables[] = {
    {gw_routes, &gw_n_routes},
    {gw_e2b_routes, &gw_n_e2b_routes},
    {gw_envd_routes, &gw_n_envd_routes},
};

/* The parameters a path gave a pattern, kept apart until a row is chosen. */
typedef struct {
    char id[SP_ID_MAX + 1];
    char cid[SP_ID_MAX + 1];
} route_params_t;

/* Does path (len bytes, no query) have pattern's shape (gateway.h, gw_route_def_t)? */
static bool route_match(const char *pattern, const char *path, size_t len, route_params_t *p)
{
    const char *end = path + len;
    while (*pattern) {
        if (pattern[0] == '/' && pattern[1] == '*' && pattern[2] == '\0')
            return path == end || *path == '/';
        if (*pattern != '/' || path == end || *path != '/')
            return false;
        pattern++;
        path++;
        const char *pseg_end = strchr(pattern, '/');
        size_t plen = pseg_end ? (size_t)(pseg_end - pattern) : strlen(pattern);
        const char *seg_end = memchr(path, '/', (size_t)(end - path));
        size_t slen = seg_end ? (size_t)(seg_end - path) : (size_t)(end - path);
        if (plen > 2 && pattern[0] == '{' && pattern[plen - 1] == '}') {
            char *dst = NULL;
            if (h2o_memis(pattern, plen, H2O_STRLIT("{cid}")))
                dst = p->cid;
            else if (h2o_memis(pattern, plen, H2O_STRLIT("{id}")) ||
                     h2o_memis(pattern, plen, H2O_STRLIT("{file}")))
                dst = p->id;
            if (slen == 0 || slen > SP_ID_MAX)
                return false;
            if (dst) {
                memcpy(dst, path, slen);
                dst[slen] = '\0';
            }
        } else if (!h2o_memis(pattern, plen, path, slen)) {
            return false;
        }
        pattern += plen;
        path += slen;
    }
    return path == end;
}

static bool row_matches(const gw_route_def_t *r, const char *path, size_t len, route_params_t *p)
{
    if (!route_match(r->path, path, len, p))
        return false;
    return !(r->flags & GW_ROUTE_SNAPSHOT) || strncmp(p->id, "snp_", 4) == 0;
}

/* Runs the row's authentication, then its handler (gw__req_authed). */
static void authenticate(gw_req_t *rq, const gw_route_def_t *r)
{
    rq->after_auth = r->fn;
    switch (r->auth) {
    case GW_AUTH_PUBLIC:
        r->fn(rq);
        return;
    case GW_AUTH_E2B_KEY: {
        const h2o_iovec_t *k = gw_req_header(rq, "x-api-key", NULL);
        if (k)
            rq->auth_key = *k;
        gw_auth(rq);
        return;
    }
    case GW_AUTH_ENVD:
    case GW_AUTH_ENVD_SIGNED:
        gw_e2b_envd_auth(rq, r->auth == GW_AUTH_ENVD_SIGNED);
        return;
    case GW_AUTH_KEY:
    default:
        gw_auth(rq);
        return;
    }
}

/* Appends m to the Allow list unless it is there already (rows of one method may repeat a
 * path, e.g. envd's streaming procedures before the unary ones). */
static void allow_add(char *allow, size_t cap, size_t *n, const char *m)
{
    size_t ml = strlen(m);
    for (const char *s = allow; *s;) {
        size_t l = strcspn(s, ",");
        if (l == ml && memcmp(s, m, ml) == 0)
            return;
        s += l;
        s += strspn(s, ", ");
    }
    int w = snprintf(allow + *n, cap - *n, "%s%s", *n ? ", " : "", m);
    if (w > 0 && (size_t)w < cap - *n)
        *n += (size_t)w;
}

/* Answers a request a row has: true, or false when no row has its path. */
static bool route_table(gw_req_t *rq, const char *path, size_t len)
{
    const gw_route_def_t *shape = NULL;
    char allow[64] = "";
    size_t n = 0;
    for (size_t t = 0; t < sizeof(route_tables) / sizeof(route_tables[0]); t++) {
        for (size_t i = 0; i < *route_tables[t].n; i++) {
            const gw_route_def_t *r = &route_tables[t].rows[i];
            bool any = r->method[0] == '*';
            route_params_t p = {0};
            if (!row_matches(r, path, len, &p))
                continue;
            if (any && shape)
                goto not_allowed;
            if (!shape)
                shape = r;
            if (!any && !is_method(rq->req, r->method)) {
                allow_add(allow, sizeof(allow), &n, r->method);
                continue;
            }
            rq->route = r->metric;
            rq->dialect = r->dialect;
            memcpy(rq->path_id, p.id, sizeof(p.id));
            memcpy(rq->path_sub_id, p.cid, sizeof(p.cid));
            if (r->action)
                snprintf(rq->path_action, sizeof(rq->path_action), "%s", r->action);
            if (r->flags & GW_ROUTE_FILE_BODY)
                rq->body_limit = rq->gw->cfg->max_file_bytes;
            authenticate(rq, r);
            return true;
        }
    }
    if (!shape)
        return false;
not_allowed:
    rq->route = shape->metric;
    rq->dialect = shape->dialect;
    method_not_allowed(rq, allow);
    return true;
}

static void route(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    size_t len = req->query_at == SIZE_MAX ? req->path.len : req->query_at;
    const char *path = req->path.base;

    if (rq->gw->stopping) {
        req->http1_is_persistent = 0;
        gw_respond_error(rq, 503, "shutting_down", NULL, "the gateway is stopping");
        return;
    }
    if (req->path.len > GW_PATH_MAX) {
        gw_respond_error(rq, 414, "uri_too_long", NULL, "the request target exceeds %d bytes",
                         GW_PATH_MAX);
        return;
    }
    if (route_table(rq, path, len))
        return;
    /* Outside /v1 the clients are E2B's SDKs: their error shape, {"code": 404, "message"}. */
    if (len < 4 || memcmp(path, "/v1/", 4) != 0)
        rq->dialect = GW_DIALECT_E2B;
    gw_respond_error(rq, 404, "not_found", NULL, "no such route");
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    gw_t *gw = ((gw_handler_t *)self)->gw;
    gw_gate_t *g = gw_gate_of(req);
    const char *bad = NULL;
    if (g) {
        gw_req_t *held = gw_gate_dispatched(g, &bad);
        if (held) {
            /* Routed and authenticated while its body waited; the body is here now. */
            held->head_only = false;
            if (gw_req_live(held))
                held->after_auth(held);
            return 0;
        }
    }
    gw_req_t *rq = req_new(gw, req);
    rq->gate = g;
    if (bad) {
        req->http1_is_persistent = 0;
        gw_respond_error(rq, 400, "bad_request", NULL, "%s", bad);
        return 0;
    }
    route(rq);
    return 0;
}

void gw__route_head(gw_t *gw, h2o_req_t *req, gw_gate_t *g)
{
    gw_req_t *rq = req_new(gw, req);
    rq->gate = g;
    rq->head_only = true;
    gw_gate_set_req(g, rq);
    route(rq);
}

struct find_req {
    h2o_socket_t *sock;
    h2o_req_t *found;
};

static int find_req_cb(h2o_req_t *req, void *arg)
{
    struct find_req *f = arg;
    if (req->conn && req->conn->callbacks->get_socket &&
        req->conn->callbacks->get_socket(req->conn) == f->sock) {
        f->found = req;
        return 1;
    }
    return 0;
}

h2o_req_t *gw__find_req(gw_t *gw, h2o_socket_t *sock)
{
    struct find_req f = {sock, NULL};
    if (gw->h2o_config.http1.callbacks.foreach_request)
        gw->h2o_config.http1.callbacks.foreach_request(&gw->h2o_ctx, find_req_cb, &f);
    return f.found;
}

/* ---- h2o's own error responses ----
 *
 * h2o answers some requests before any handler runs: a body over max_request_entity_size
 * (413, whether announced by Content-Length or found while decoding chunks), broken chunked
 * encoding (400), an unknown Expect (417). Those responses pass through this filter, which
 * gives them the API's shape: a JSON error, X-Request-Id, and a log line. */

typedef struct {
    h2o_ostream_t super;
    h2o_iovec_t body;
    bool sent;
} rewrite_ostream_t;

static void rewrite_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t bufcnt,
                         h2o_send_state_t state)
{
    rewrite_ostream_t *o = (rewrite_ostream_t *)self;
    (void)bufs;
    (void)bufcnt;
    if (!o->sent) {
        o->sent = true;
        h2o_ostream_send_next(&o->super, req, &o->body, 1, state);
    } else {
        h2o_ostream_send_next(&o->super, req, NULL, 0, state);
    }
}

static void on_setup_ostream(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    gw_t *gw = ((gw_filter_t *)self)->gw;
    const char *code, *message;

    if (req->res.status < 400 || req->res.content_length == SIZE_MAX ||
        h2o_find_header_by_str(&req->res.headers, H2O_STRLIT("x-request-id"), -1) >= 0) {
        h2o_setup_next_ostream(req, slot);
        return;
    }
    switch (req->res.status) {
    case 413:
        code = "body_too_large";
        message = "the request body exceeds the limit";
        break;
    case 400:
        code = "bad_request";
        message = "malformed request (body encoding)";
        break;
    case 417:
        code = "expectation_failed";
        message = "unsupported Expect header";
        break;
    default:
        code = "http_error";
        message = req->res.reason ? req->res.reason : "error";
        break;
    }
    char rid[GW_REQUEST_ID_MAX + 1];
    pick_request_id(req, rid);
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"code\":");
    sp_buf_json_str(&b, code);
    sp_buf_puts(&b, ",\"message\":");
    sp_buf_json_str(&b, message);
    sp_buf_putc(&b, '}');
    h2o_iovec_t body = h2o_strdup(&req->pool, b.data, b.len);
    sp_buf_dispose(&b);

    ssize_t ct = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    if (ct >= 0)
        req->res.headers.entries[ct].value = h2o_iovec_init(H2O_STRLIT("application/json"));
    else
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                       H2O_STRLIT("application/json"));
    h2o_iovec_t rid_v = h2o_strdup(&req->pool, rid, strlen(rid));
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-request-id"), 0, NULL,
                          rid_v.base, rid_v.len);
    req->res.content_length = body.len;

    rewrite_ostream_t *o = (rewrite_ostream_t *)h2o_add_ostream(req, sizeof(*o), slot);
    o->super.do_send = rewrite_send;
    o->body = body;
    o->sent = false;
    slot = &o->super.next;

    char method[16], path[512];
    copy_iovec(method, sizeof(method), req->input.method);
    gw_log_path(path, sizeof(path), req->input.path);
    gw_metrics_request(&gw->metrics, GW_R_OTHER, req->res.status);
    sp_log(SP_LOG_INFO, "request", SP_KS("method", method), SP_KS("path", path),
           SP_KI("status", req->res.status), SP_KF("duration_ms", 0.0), SP_KS("request_id", rid),
           SP_KS("tenant", ""));
    h2o_setup_next_ostream(req, slot);
}

/* ---- listener ---- */

static void on_conn_close(uv_handle_t *h)
{
    gw_conn_t *c = (gw_conn_t *)h;
    n_connections--;
    gw_gate_free(c->gate);
    free(c);
}

static void on_accept(uv_stream_t *listener, int status)
{
    gw_t *gw = listener->data;
    if (status != 0)
        return;
    gw_conn_t *c = sp_xcalloc(1, sizeof(*c));
    c->gw = gw;
    uv_tcp_init(listener->loop, &c->tcp);
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        n_connections++;
        uv_close((uv_handle_t *)&c->tcp, on_conn_close);
        return;
    }
    n_connections++;
    uv_tcp_nodelay(&c->tcp, 1);
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, on_conn_close);
    h2o_accept(&gw->accept_ctx, sock);
    c->gate = gw_gate_attach(gw, sock);
    if (!c->gate) {
        /* Fail closed: no connection is served without its head checked. */
        sp_log(SP_LOG_ERROR, "cannot check requests on a connection; closing it");
        int fd = h2o_socket_get_fd(sock);
        if (fd >= 0)
            shutdown(fd, SHUT_RDWR);
    }
}

static int bind_listener(gw_t *gw)
{
    struct sockaddr_storage ss;
    int rc;

    memset(&ss, 0, sizeof(ss));
    if (uv_ip4_addr(gw->cfg->listen_host, (int)gw->cfg->port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(gw->cfg->listen_host, (int)gw->cfg->port, (struct sockaddr_in6 *)&ss) != 0) {
        sp_log(SP_LOG_ERROR, "listen-host is not an IP address",
               SP_KS("listen_host", gw->cfg->listen_host));
        return -EINVAL;
    }
    uv_tcp_init(gw->loop, &gw->listener);
    gw->listener.data = gw;
    gw->listener_open = true;
    if ((rc = uv_tcp_bind(&gw->listener, (struct sockaddr *)&ss, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&gw->listener, 511, on_accept)) != 0) {
        sp_log(SP_LOG_ERROR, "cannot listen", SP_KS("listen_host", gw->cfg->listen_host),
               SP_KI("port", gw->cfg->port), SP_KS("error", uv_strerror(rc)));
        return rc;
    }
    return 0;
}

size_t gw_http_connections(gw_t *gw)
{
    (void)gw;
    return n_connections;
}

static int shut_reads(h2o_req_t *req, void *arg)
{
    (void)arg;
    int fd = gw_req_fd(req);
    if (fd >= 0)
        shutdown(fd, SHUT_RD);
    return 0;
}

void gw_http_shutdown_reads(gw_t *gw)
{
    if (gw->h2o_config.http1.callbacks.foreach_request)
        gw->h2o_config.http1.callbacks.foreach_request(&gw->h2o_ctx, shut_reads, NULL);
}

int gw_http_init(gw_t *gw)
{
    h2o_config_init(&gw->h2o_config);
    gw->h2o_config.server_name = h2o_iovec_init(H2O_STRLIT(GW_DAEMON));
    /* h2o 2.2 has one body limit for every route, checked before any handler could have
     * authenticated the request. The gate (gateway_gate.c) holds each body until the route
     * and the key allow it and applies the route's own limit (max-body-bytes, max-file-bytes
     * for uploads) to announced and chunked lengths, after the key: h2o's own check would
     * answer 413 before a 401, so it is out of the way (every connection has its gate, or is
     * closed). Bodies over 4 MiB wait in a file-backed buffer, not the heap (gw_files_init). */
    gw->h2o_config.max_request_entity_size = SIZE_MAX / 2;
    /* HTTP/1.1 only: no cleartext h2c upgrade (its streams could end under a running job). */
    gw->h2o_config.http1.upgrade_to_http2 = 0;
    h2o_hostconf_t *host =
        h2o_config_register_host(&gw->h2o_config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *root = h2o_config_register_path(host, "/", 0);
    gw_handler_t *h = (gw_handler_t *)h2o_create_handler(root, sizeof(*h));
    h->super.on_req = on_req;
    h->gw = gw;
    h2o_pathconf_t *paths[] = {root, &host->fallback_path};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        gw_filter_t *f = (gw_filter_t *)h2o_create_filter(paths[i], sizeof(*f));
        f->super.on_setup_ostream = on_setup_ostream;
        f->gw = gw;
    }
    h2o_context_init(&gw->h2o_ctx, gw->loop, &gw->h2o_config);
    gw->accept_ctx.ctx = &gw->h2o_ctx;
    gw->accept_ctx.hosts = gw->h2o_config.hosts;
    return bind_listener(gw);
}

void gw_http_dispose(gw_t *gw)
{
    gw_gate_dispose();
    h2o_context_dispose(&gw->h2o_ctx);
}
