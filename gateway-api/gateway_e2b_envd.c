/* E2B's in-sandbox API ("envd", ../../shared/e2b-compat.md section 3) on the API's port, so
 * E2B_SANDBOX_URL can point here:
 *
 *   POST /process.Process/{Start,Connect}            Connect streaming (application/connect+json)
 *   POST /process.Process/{List,SendInput,SendSignal,CloseStdin,Update}   Connect unary (JSON)
 *   POST /filesystem.Filesystem/{Stat,MakeDir,Move,ListDir,Remove}        Connect unary (JSON)
 *   POST /filesystem.Filesystem/WatchDir             Connect streaming
 *   POST /filesystem.Filesystem/{CreateWatcher,GetWatcherEvents,RemoveWatcher}  Connect unary
 *   GET  /files?path=&username=     download;   POST /files   upload (multipart or raw)
 *        with &signature=v1_...[&signature_expiration=] and no header: a signed URL
 *   GET  /health
 *
 * Which sandbox: the E2b-Sandbox-Id header, else the sandbox part of X-Access-Token, else the
 * Host header "<port>-<id>.<domain>". Who asks: X-Access-Token, the sandbox's own access token
 * (gateway_auth.c; valid for the sandbox it names only), else X-API-KEY, an API key of the
 * sandbox's tenant, like on every other route. A token naming another sandbox than
 * E2b-Sandbox-Id is refused. /files without either may carry the SDK's signature instead
 * (downloadUrl, uploadUrl): gateway_signed.c finds its sandbox and token.
 *
 * Each call becomes one of our own operations and nothing more:
 * - Start translates its request into our command body (argv = cmd + args, envs, cwd, the
 *   user of Authorization: Basic, pty, stdin) and runs it through gw_command_run_body as a
 *   background command (no default timeout; Connect-Timeout-Ms bounds it, as envd does) whose
 *   output streams back as ProcessEvents in Connect envelopes (gateway_commands.c). A client
 *   that goes away does not stop the process.
 * - Connect, SendInput, SendSignal, CloseStdin and Update name a process by pid: the worker's
 *   command list finds its command (gw_ctl_run), then attach, stdin, signal or resize.
 * - Filesystem calls and /files are gw_files_start with E2B's answers; WatchDir is
 *   gw_watch_start (gateway_watch.c), whose stream speaks E2B's WatchDirResponse; the polling
 *   watcher calls are the same watch without a stream (gw_watcher_*, gateway_watch.c).
 * Errors: Connect's JSON error (unary) or end-stream error (streams), /files E2B's
 * {code, message}, all through gw_respond_error's dialects.
 *
 * Input is hostile: one envelope per streaming request (flags 0, the length exactly the rest
 * of the body), strict JSON with small limits, every field type checked. */
#include "gateway.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#include "b64.h"
#include "db.h"
#include "fspath.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define ENVD_PORT       "49983"
#define STDIN_CHUNK_MAX (512 * 1024)
#define CMD_TIMEOUT_MAX (24 * 3600)
#define KEY_MAX         256
#define GUNZIP_MAX      (64u << 20) /* decoded bytes of a gzip upload, held in the heap */

/* ---- requests: sandbox, key, user, messages ---- */

/* Finds the sandbox and the key; false when the request names neither consistently (answered
 * with 401). signed: a /files request, which may come without a credential header and carry
 * a signature in its query instead (gateway_signed.c): then *signed stays true and path_id holds
 * the sandbox the request names, if any. */
static bool target(gw_req_t *rq, bool *signed_url)
{
    const h2o_iovec_t *sid = gw_req_header(rq, "e2b-sandbox-id", NULL);
    const h2o_iovec_t *tok = gw_req_header(rq, "x-access-token", NULL);
    const h2o_iovec_t *key = gw_req_header(rq, "x-api-key", NULL);
    h2o_iovec_t tok_sbx = {NULL, 0}, id = {NULL, 0};

    if (tok) {
        const char *dot = memchr(tok->base, '.', tok->len);
        if (!dot || dot == tok->base || (size_t)(dot - tok->base) > SP_ID_MAX ||
            tok->len - (size_t)(dot - tok->base) - 1 > KEY_MAX) {
            gw_respond_error(rq, 401, "unauthorized", NULL, "the access token is not valid");
            return false;
        }
        tok_sbx = h2o_iovec_init(tok->base, (size_t)(dot - tok->base));
        /* The whole token authenticates, for its own sandbox only (gateway_auth.c). */
        rq->auth_key = *tok;
        rq->auth_token = true;
    } else if (key) {
        rq->auth_key = *key;
    }
    if (sid)
        id = *sid;
    else if (tok)
        id = tok_sbx;
    else if (rq->req->authority.len > sizeof(ENVD_PORT) &&
             memcmp(rq->req->authority.base, ENVD_PORT "-", sizeof(ENVD_PORT)) == 0) {
        /* Host: 49983-<id>.<domain> */
        const char *s = rq->req->authority.base + sizeof(ENVD_PORT);
        size_t n = rq->req->authority.len - sizeof(ENVD_PORT);
        const char *dot = memchr(s, '.', n);
        id = h2o_iovec_init(s, dot ? (size_t)(dot - s) : n);
    }
    if (tok && sid && !h2o_memis(sid->base, sid->len, tok_sbx.base, tok_sbx.len)) {
        gw_respond_error(rq, 401, "unauthorized", NULL,
                         "the access token belongs to another sandbox");
        return false;
    }
    if (!rq->auth_key.base && !signed_url) {
        gw_respond_error(rq, 401, "unauthorized", NULL,
                         "send X-Access-Token (the sandbox's envdAccessToken) or X-API-KEY");
        return false;
    }
    if (signed_url)
        *signed_url = !rq->auth_key.base;
    /* A malformed id reads as an unknown sandbox (checked after authentication). */
    size_t n = id.len < SP_ID_MAX ? id.len : SP_ID_MAX;
    memcpy(rq->path_id, id.base ? id.base : "", n);
    rq->path_id[n] = '\0';
    return true;
}

/* The run-as user: Authorization: Basic base64("<user>:"), else E2B's default "user". */
static const char *basic_user(const gw_req_t *rq, bool *bad)
{
    const h2o_iovec_t *h = gw_req_header(rq, "authorization", NULL);
    uint8_t *dec = NULL;
    size_t n = 0;
    const char *user = "user";
    *bad = false;
    if (!h || h->len <= 6 || strncasecmp(h->base, "basic ", 6) != 0)
        return user;
    if (sp_b64_decode(h->base + 6, h->len - 6, &dec, &n) < 0) {
        *bad = true;
        return NULL;
    }
    if (n >= 4 && memcmp(dec, "root", 4) == 0 && (n == 4 || dec[4] == ':'))
        user = "root";
    else if (n >= 4 && memcmp(dec, "user", 4) == 0 && (n == 4 || dec[4] == ':'))
        user = "user";
    else if (n > 0 && dec[0] != ':')
        *bad = true;
    free(dec);
    return *bad ? NULL : user;
}

/* The request's message: the JSON body (unary) or the one envelope of a streaming request.
 * Answers the error itself and returns NULL. */
static sp_json_doc_t *message(gw_req_t *rq, bool stream)
{
    h2o_req_t *req = rq->req;
    const char *body = req->entity.base ? req->entity.base : "";
    size_t len = req->entity.base ? req->entity.len : 0;
    const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
    const char *want = stream ? "application/connect+json" : "application/json";
    char jerr[SP_JSON_ERR_MAX];
    sp_json_doc_t *doc = NULL;

    if (!ct || ct->len < strlen(want) || strncasecmp(ct->base, want, strlen(want)) != 0) {
        gw_respond_error(rq, 415, "unsupported_media_type", NULL, "send %s (the JSON codec)", want);
        return NULL;
    }
    if (len > (size_t)rq->gw->cfg->max_body_bytes) {
        gw_respond_error(rq, 413, "body_too_large", NULL, "the message exceeds %lld bytes",
                         (long long)rq->gw->cfg->max_body_bytes);
        return NULL;
    }
    if (stream) {
        /* [flags][length u32 BE][message]: exactly one, uncompressed. */
        const uint8_t *p = (const uint8_t *)body;
        if (len < 5) {
            gw_respond_error(rq, 400, "invalid_envelope", NULL, "the body is not an envelope");
            return NULL;
        }
        uint32_t n = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
        if (p[0] != 0) {
            gw_respond_error(rq, 400, "invalid_envelope", NULL,
                             "envelope flags %u: compression and end-stream are not accepted",
                             p[0]);
            return NULL;
        }
        if ((size_t)n != len - 5) {
            gw_respond_error(rq, 400, "invalid_envelope", NULL,
                             "the envelope says %" PRIu32 " bytes, the body holds %zu", n, len - 5);
            return NULL;
        }
        body += 5;
        len -= 5;
    }
    sp_json_limits_t lim = {
        .max_bytes = len + 1, .max_depth = 5, .max_nodes = 1024, .max_string = len + 1};
    if (sp_json_parse(len ? body : "{}", len ? len : 2, &lim, &doc, jerr) < 0 ||
        sp_json_type(sp_json_root(doc)) != SP_JSON_OBJECT) {
        gw_respond_error(rq, 400, "invalid_json", NULL, "the message must be a JSON object%s%s",
                         doc ? "" : ": ", doc ? "" : jerr);
        sp_json_doc_free(doc);
        return NULL;
    }
    return doc;
}

static const sp_json_t *member(const sp_json_t *o, const char *k)
{
    return sp_json_type(o) == SP_JSON_OBJECT ? sp_json_get(o, k) : NULL;
}

/* A uint32 given as a number or a string (ProtoJSON accepts both). */
static int get_u32(const sp_json_t *v, uint32_t max, uint32_t *ret)
{
    int64_t x;
    const char *s;
    if (sp_json_int(v, 0, max, &x) == 0) {
        *ret = (uint32_t)x;
        return 0;
    }
    if ((s = sp_json_str(v, NULL)) != NULL && s[0] && strlen(s) <= 10) {
        char *end = NULL;
        unsigned long long y = strtoull(s, &end, 10);
        if (*end == '\0' && s[0] >= '0' && s[0] <= '9' && y <= max) {
            *ret = (uint32_t)y;
            return 0;
        }
    }
    return -EINVAL;
}

/* process.pid of a selector; 0 (answered) when missing or bad. */
static uint32_t selector_pid(gw_req_t *rq, const sp_json_t *root)
{
    const sp_json_t *proc = member(root, "process");
    uint32_t pid = 0;
    if (member(proc, "tag")) {
        gw_respond_error(rq, 404, "not_found", NULL, "processes are not tagged here; use the pid");
        return 0;
    }
    if (get_u32(member(proc, "pid"), UINT32_MAX, &pid) < 0 || pid == 0) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "process.pid must be a process id");
        return 0;
    }
    return pid;
}

static void respond_empty(gw_req_t *rq)
{
    gw_respond(rq, 200, "application/json", "{}", 2);
}

/* ---- process.Process ---- */

static void proc_start(gw_req_t *rq, const sp_json_t *root)
{
    const sp_json_t *proc = member(root, "process");
    const sp_json_t *cmd = member(proc, "cmd"), *args = member(proc, "args");
    const sp_json_t *envs = member(proc, "envs"), *cwd = member(proc, "cwd");
    const sp_json_t *pty = member(root, "pty"), *in = member(root, "stdin");
    const h2o_iovec_t *tmo = gw_req_header(rq, "connect-timeout-ms", NULL);
    bool bad = false, stdin_open = true;
    const char *user = basic_user(rq, &bad);
    sp_buf_t b;

    if (bad) {
        gw_respond_error(rq, 400, "invalid_field", NULL,
                         "the user (Authorization: Basic) must be root or user");
        return;
    }
    if (!sp_json_str(cmd, NULL) || (args && sp_json_type(args) != SP_JSON_ARRAY) ||
        (envs && sp_json_type(envs) != SP_JSON_OBJECT) || (cwd && !sp_json_str(cwd, NULL)) ||
        (in && sp_json_bool(in, &stdin_open) < 0) || (pty && sp_json_type(pty) != SP_JSON_OBJECT)) {
        gw_respond_error(rq, 400, "invalid_field", NULL,
                         "want {process: {cmd, args[], envs{}, cwd}, pty?, stdin?}");
        return;
    }
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"argv\":[");
    sp_buf_json_str(&b, sp_json_str(cmd, NULL));
    for (size_t i = 0; args && i < sp_json_len(args); i++) {
        size_t n = 0;
        const char *a = sp_json_str(sp_json_at(args, i), &n);
        if (!a) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "process.args holds strings");
            goto out;
        }
        sp_buf_putc(&b, ',');
        sp_buf_json_strn(&b, a, n);
    }
    sp_buf_puts(&b, "],\"env\":{");
    for (size_t i = 0; envs && i < sp_json_len(envs); i++) {
        size_t n = 0;
        const char *v = sp_json_str(sp_json_at(envs, i), &n);
        if (!v) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "process.envs holds strings");
            goto out;
        }
        sp_buf_puts(&b, i ? "," : "");
        sp_buf_json_str(&b, sp_json_key_at(envs, i));
        sp_buf_putc(&b, ':');
        sp_buf_json_strn(&b, v, n);
    }
    sp_buf_puts(&b, "},\"user\":");
    sp_buf_json_str(&b, user);
    /* envd's default directory is the user's home (the agent's too, said explicitly). */
    const char *dir = cwd ? sp_json_str(cwd, NULL) : "";
    sp_buf_puts(&b, ",\"cwd\":");
    sp_buf_json_str(&b, dir[0] ? dir : sp_fspath_home(user));
    sp_buf_puts(&b, ",\"background\":true");
    if (pty) {
        const sp_json_t *size = member(pty, "size");
        uint32_t rows = GW_PTY_DEFAULT_ROWS, cols = GW_PTY_DEFAULT_COLS;
        if ((member(size, "rows") && get_u32(member(size, "rows"), GW_PTY_MAX, &rows) < 0) ||
            (member(size, "cols") && get_u32(member(size, "cols"), GW_PTY_MAX, &cols) < 0) ||
            rows == 0 || cols == 0) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "pty.size needs rows and cols");
            goto out;
        }
        sp_buf_printf(&b, ",\"pty\":{\"rows\":%" PRIu32 ",\"cols\":%" PRIu32 "}", rows, cols);
    } else if (stdin_open) {
        sp_buf_puts(&b, ",\"stdin_open\":true");
    }
    if (tmo) {
        /* The SDK's command timeout: the process ends with it (envd does the same). */
        uint64_t ms = 0;
        bool ok = tmo->len > 0 && tmo->len <= 10;
        for (size_t i = 0; ok && i < tmo->len; i++) {
            ok = tmo->base[i] >= '0' && tmo->base[i] <= '9';
            ms = ms * 10 + (uint64_t)(tmo->base[i] - '0');
        }
        if (!ok) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "Connect-Timeout-Ms: 1..10 digits");
            goto out;
        }
        uint64_t s = (ms + 999) / 1000;
        if (s > 0)
            sp_buf_printf(&b, ",\"timeout_s\":%" PRIu64, s > CMD_TIMEOUT_MAX ? CMD_TIMEOUT_MAX : s);
    }
    sp_buf_putc(&b, '}');
    gw_command_run_body(rq, b.data, b.len);
out:
    if (b.data)
        explicit_bzero(b.data, b.len); /* environment values */
    sp_buf_dispose(&b);
}

/* Connect: the list found the command of the pid; follow it from now on. */
static void connect_found(gw_req_t *rq, const Space__Io__V1__CtlReply *r, const char *unused)
{
    (void)unused;
    uint32_t pid = (uint32_t)strtoul(rq->path_sub_id, NULL, 10);
    const Space__Io__V1__CommandInfo *hit = NULL;
    for (size_t i = 0; i < r->n_commands; i++) {
        const Space__Io__V1__CommandInfo *c = r->commands[i];
        if (c->pid == pid && sp_id_valid(c->cmd_id) && (!hit || c->running))
            hit = c;
    }
    if (!hit) {
        gw_respond_error(rq, 404, "not_found", NULL, "process with pid %" PRIu32 " not found", pid);
        return;
    }
    gw_command_attach_from(rq, hit->cmd_id, hit->last_seq, hit->pty);
}

static void proc_connect(gw_req_t *rq, const sp_json_t *root)
{
    uint32_t pid = selector_pid(rq, root);
    if (!pid)
        return;
    /* The pid rides in path_sub_id to the list's answer. */
    snprintf(rq->path_sub_id, sizeof(rq->path_sub_id), "%" PRIu32, pid);
    gw_ctl_spec_t spec = {.op = GW_CTL_LIST, .answer = connect_found};
    gw_ctl_run(rq, &spec);
}

/* Text the worker reports (from the request, but through the guest's channel for a command
 * followed again): safe UTF-8 as a JSON string; scratch is reused. */
static void guest_str(sp_buf_t *b, sp_buf_t *scratch, const char *s)
{
    sp_buf_reset(scratch);
    sp_buf_safe_text(scratch, s ? s : "", 4096);
    sp_buf_json_str(b, scratch->data ? scratch->data : "");
}

static void list_answer(gw_req_t *rq, const Space__Io__V1__CtlReply *r, const char *unused)
{
    (void)unused;
    sp_buf_t b, safe;
    size_t n = 0;
    sp_buf_init(&b);
    sp_buf_init(&safe);
    sp_buf_puts(&b, "{\"processes\":[");
    for (size_t i = 0; i < r->n_commands; i++) {
        const Space__Io__V1__CommandInfo *c = r->commands[i];
        if (!c->running || !c->pid)
            continue;
        /* cmd the program, args its arguments, as Start was given them (the worker's argv;
         * the command line when it has none, after a reconnection). envs stays empty: env
         * values may be secrets and are answered nowhere. */
        sp_buf_puts(&b, n++ ? "," : "");
        sp_buf_puts(&b, "{\"config\":{\"cmd\":");
        guest_str(&b, &safe, c->n_argv ? c->argv[0] : c->cmd);
        sp_buf_puts(&b, ",\"args\":[");
        for (size_t k = 1; k < c->n_argv; k++) {
            sp_buf_puts(&b, k > 1 ? "," : "");
            guest_str(&b, &safe, c->argv[k]);
        }
        sp_buf_puts(&b, "],\"envs\":{}");
        if (c->cwd && c->cwd[0]) {
            sp_buf_puts(&b, ",\"cwd\":");
            guest_str(&b, &safe, c->cwd);
        }
        sp_buf_printf(&b, "},\"pid\":%" PRIu32 "}", c->pid);
    }
    sp_buf_puts(&b, "]}");
    gw_respond_json(rq, 200, &b);
    sp_buf_dispose(&b);
    sp_buf_dispose(&safe);
}

static void ok_answer(gw_req_t *rq, const Space__Io__V1__CtlReply *r, const char *unused)
{
    (void)r;
    (void)unused;
    respond_empty(rq);
}

static void proc_ctl(gw_req_t *rq, const char *method, const sp_json_t *root)
{
    gw_ctl_spec_t spec = {.answer = ok_answer};
    if (strcmp(method, "List") == 0) {
        spec.op = GW_CTL_LIST;
        spec.answer = list_answer;
        gw_ctl_run(rq, &spec);
        return;
    }
    if (strcmp(method, "SendSignal") != 0 && strcmp(method, "CloseStdin") != 0 &&
        strcmp(method, "SendInput") != 0 && strcmp(method, "Update") != 0) {
        gw_respond_error(rq, 501, "unimplemented", NULL, "process.Process/%s is not served",
                         method);
        return;
    }
    if (!(spec.pid = selector_pid(rq, root)))
        return;
    if (strcmp(method, "SendSignal") == 0) {
        const char *s = sp_json_str(member(root, "signal"), NULL);
        spec.op = GW_CTL_SIGNAL;
        if (s && strcmp(s, "SIGNAL_SIGKILL") == 0)
            spec.signal = SIGKILL;
        else if (s && strcmp(s, "SIGNAL_SIGTERM") == 0)
            spec.signal = SIGTERM;
        else {
            gw_respond_error(rq, 400, "invalid_field", NULL,
                             "signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL");
            return;
        }
    } else if (strcmp(method, "CloseStdin") == 0) {
        spec.op = GW_CTL_STDIN;
        spec.eof = true;
    } else if (strcmp(method, "SendInput") == 0) {
        const sp_json_t *input = member(root, "input");
        const sp_json_t *v = member(input, "stdin");
        size_t n = 0;
        const char *s;
        if (!v)
            v = member(input, "pty");
        if (!(s = sp_json_str(v, &n)) || n > (STDIN_CHUNK_MAX + 2) / 3 * 4 + 4 ||
            sp_b64_decode(s, n, &spec.data, &spec.data_len) < 0) {
            gw_respond_error(rq, 400, "invalid_field", NULL,
                             "input.stdin or input.pty: base64 of at most %d bytes",
                             STDIN_CHUNK_MAX);
            return;
        }
        spec.op = GW_CTL_STDIN;
    } else {
        const sp_json_t *size = member(member(root, "pty"), "size");
        spec.op = GW_CTL_RESIZE;
        if (get_u32(member(size, "rows"), GW_PTY_MAX, &spec.rows) < 0 ||
            get_u32(member(size, "cols"), GW_PTY_MAX, &spec.cols) < 0 || !spec.rows || !spec.cols) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "pty.size needs rows and cols");
            return;
        }
    }
    gw_ctl_run(rq, &spec);
    if (spec.data) {
        explicit_bzero(spec.data, spec.data_len);
        free(spec.data);
    }
}

/* ---- filesystem.Filesystem ---- */

static void fs_call(gw_req_t *rq, const char *method, const sp_json_t *root)
{
    bool bad = false;
    const char *user = basic_user(rq, &bad);
    gw_files_spec_t spec = {.user = user};
    const char *path = sp_json_str(member(root, "path"), NULL);

    if (bad) {
        gw_respond_error(rq, 400, "invalid_field", NULL,
                         "the user (Authorization: Basic) must be root or user");
        return;
    }
    if (strcmp(method, "Stat") == 0) {
        spec.op = GW_FOP_STAT;
    } else if (strcmp(method, "MakeDir") == 0) {
        spec.op = GW_FOP_MKDIR;
    } else if (strcmp(method, "Remove") == 0) {
        spec.op = GW_FOP_REMOVE;
        spec.recursive = true; /* envd removes directories with their contents */
    } else if (strcmp(method, "ListDir") == 0) {
        const sp_json_t *d = member(root, "depth");
        spec.op = GW_FOP_LIST;
        spec.depth = 1;
        if (d && (get_u32(d, 16, &spec.depth) < 0)) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "depth must be 1..16");
            return;
        }
        if (spec.depth == 0)
            spec.depth = 1;
    } else if (strcmp(method, "Move") == 0) {
        spec.op = GW_FOP_MOVE;
        path = sp_json_str(member(root, "source"), NULL);
        spec.to = sp_json_str(member(root, "destination"), NULL);
        if (!spec.to) {
            gw_respond_error(rq, 400, "invalid_field", NULL, "source and destination are paths");
            return;
        }
    } else {
        gw_respond_error(rq, 501, "unimplemented", NULL, "filesystem.Filesystem/%s is not served",
                         method);
        return;
    }
    if (!path) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "path must be a string");
        return;
    }
    spec.path = path;
    gw_files_start(rq, &spec);
}

/* WatchDir and CreateWatcher {path, recursive}: the user of Authorization: Basic resolves a
 * relative path. The SDK's includeEntry and allowNetworkMounts are accepted and have no effect
 * (events carry no entry; there are no network mounts). */
static void watch_dir(gw_req_t *rq, const sp_json_t *root, bool polling)
{
    bool bad = false, recursive = false;
    const char *user = basic_user(rq, &bad);
    const char *path = sp_json_str(member(root, "path"), NULL);
    const sp_json_t *rec = member(root, "recursive");
    if (bad) {
        gw_respond_error(rq, 400, "invalid_field", NULL,
                         "the user (Authorization: Basic) must be root or user");
        return;
    }
    if (!path || (rec && sp_json_bool(rec, &recursive) < 0)) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "want {path, recursive?}");
        return;
    }
    if (polling)
        gw_watcher_create(rq, path, user, recursive);
    else
        gw_watch_start(rq, path, user, recursive);
}

/* GetWatcherEvents and RemoveWatcher {watcherId}. */
static void watcher_call(gw_req_t *rq, const char *method, const sp_json_t *root)
{
    const char *id = sp_json_str(member(root, "watcherId"), NULL);
    if (!id) {
        gw_respond_error(rq, 400, "invalid_field", NULL, "watcherId must be a string");
        return;
    }
    if (strcmp(method, "GetWatcherEvents") == 0)
        gw_watcher_events(rq, id);
    else
        gw_watcher_remove(rq, id);
}

/* E2B's EntryInfo for one of our FileInfos. */
static void entry_json(sp_buf_t *b, const Space__Io__V1__FileInfo *in, const char *fallback)
{
    const char *path = in && in->path[0] ? in->path : fallback;
    const char *slash = strrchr(path, '/');
    const char *type = !in                                ? "FILE_TYPE_UNSPECIFIED"
                       : strcmp(in->type, "dir") == 0     ? "FILE_TYPE_DIRECTORY"
                       : strcmp(in->type, "symlink") == 0 ? "FILE_TYPE_SYMLINK"
                       : strcmp(in->type, "file") == 0    ? "FILE_TYPE_FILE"
                                                          : "FILE_TYPE_UNSPECIFIED";
    sp_buf_t safe;
    sp_buf_init(&safe);
    sp_buf_puts(b, "{\"name\":");
    sp_buf_safe_text(&safe, slash && slash[1] ? slash + 1 : path, SP_FSPATH_MAX * 4);
    sp_buf_json_str(b, safe.data ? safe.data : "");
    sp_buf_puts(b, ",\"type\":");
    sp_buf_json_str(b, type);
    sp_buf_puts(b, ",\"path\":");
    sp_buf_reset(&safe);
    sp_buf_safe_text(&safe, path, SP_FSPATH_MAX * 4);
    sp_buf_json_str(b, safe.data ? safe.data : "");
    if (in) {
        char perm[11];
        uint32_t m = in->mode & 0777;
        perm[0] = (char)(type[10] == 'D' ? 'd' : type[10] == 'S' ? 'l' : '-');
        for (int i = 0; i < 9; i++)
            perm[1 + i] = (char)((m >> (8 - i)) & 1 ? "rwxrwxrwx"[i] : '-');
        perm[10] = '\0';
        sp_buf_printf(b, ",\"size\":\"%" PRIu64 "\",\"mode\":%" PRIu32 ",\"permissions\":\"%s\"",
                      in->size, in->mode & 07777, perm);
        sp_buf_puts(b, ",\"owner\":");
        if (in->uid == 0)
            sp_buf_puts(b, "\"root\"");
        else if (in->uid == 1000)
            sp_buf_puts(b, "\"user\"");
        else
            sp_buf_printf(b, "\"%" PRIu32 "\"", in->uid);
        sp_buf_puts(b, ",\"group\":");
        if (in->gid == 0)
            sp_buf_puts(b, "\"root\"");
        else if (in->gid == 1000)
            sp_buf_puts(b, "\"user\"");
        else
            sp_buf_printf(b, "\"%" PRIu32 "\"", in->gid);
        sp_buf_puts(b, ",\"modifiedTime\":");
        gw_json_time(b, in->mtime_us);
        if (in->target[0]) {
            /* envd answers the absolute target: a relative one is resolved from the link's
             * directory (lexically: the guest's own symlinks stay the guest's business). */
            char dir[SP_FSPATH_MAX + 1], abs_target[SP_FSPATH_MAX + 1];
            size_t dn = slash ? (size_t)(slash - path) : 0;
            const char *target = in->target;
            if (target[0] != '/' && path[0] == '/' && dn < sizeof(dir)) {
                if (dn == 0)
                    dn = 1; /* a link in "/" */
                memcpy(dir, path, dn);
                dir[dn] = '\0';
                if (sp_fspath_resolve(target, dir, abs_target) == 0)
                    target = abs_target;
            }
            sp_buf_puts(b, ",\"symlinkTarget\":");
            sp_buf_reset(&safe);
            sp_buf_safe_text(&safe, target, SP_FSPATH_MAX * 4);
            sp_buf_json_str(b, safe.data ? safe.data : "");
        }
    }
    sp_buf_putc(b, '}');
    sp_buf_dispose(&safe);
}

static int by_path(const void *a, const void *b)
{
    const Space__Io__V1__FileInfo *x = *(const Space__Io__V1__FileInfo *const *)a;
    const Space__Io__V1__FileInfo *y = *(const Space__Io__V1__FileInfo *const *)b;
    return strcmp(x->path, y->path);
}

void gw_e2b_files_answer(gw_req_t *rq, gw_fop_t op, const Space__Io__V1__FileReply *r,
                         const char *path, const char *to)
{
    sp_buf_t b;
    sp_buf_init(&b);
    switch (op) {
    case GW_FOP_STAT:
        sp_buf_puts(&b, "{\"entry\":");
        entry_json(&b, r->info, path);
        sp_buf_putc(&b, '}');
        break;
    case GW_FOP_LIST: {
        /* envd lists in name order (Go's os.ReadDir); the agent in the directory's own. */
        typedef const Space__Io__V1__FileInfo *entry_ptr_t;
        entry_ptr_t *sorted = sp_xcalloc(r->n_entries + 1, sizeof(entry_ptr_t));
        for (size_t i = 0; i < r->n_entries; i++)
            sorted[i] = r->entries[i];
        qsort(sorted, r->n_entries, sizeof(entry_ptr_t), by_path);
        sp_buf_puts(&b, "{\"entries\":[");
        for (size_t i = 0; i < r->n_entries; i++) {
            if (i)
                sp_buf_putc(&b, ',');
            entry_json(&b, sorted[i], path);
        }
        sp_buf_puts(&b, "]}");
        free(sorted);
        break;
    }
    case GW_FOP_MKDIR:
        if (r->existed) {
            gw_respond_error(rq, 409, "exists", NULL, "%s already exists", path);
            sp_buf_dispose(&b);
            return;
        }
        sp_buf_puts(&b, "{\"entry\":");
        entry_json(&b, r->info, path);
        sp_buf_putc(&b, '}');
        break;
    case GW_FOP_MOVE:
        sp_buf_puts(&b, "{\"entry\":");
        entry_json(&b, r->info, to);
        sp_buf_putc(&b, '}');
        break;
    default:
        sp_buf_puts(&b, "{}");
        break;
    }
    gw_respond_json(rq, 200, &b);
    sp_buf_dispose(&b);
}

void gw_e2b_upload_answer(gw_req_t *rq, const char *const *paths, size_t n)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_putc(&b, '[');
    for (size_t i = 0; i < n; i++) {
        const char *slash = strrchr(paths[i], '/');
        /* Exactly these three keys: Python's model refuses others. */
        sp_buf_puts(&b, i ? ",{\"name\":" : "{\"name\":");
        sp_buf_json_str(&b, slash && slash[1] ? slash + 1 : paths[i]);
        sp_buf_puts(&b, ",\"type\":\"file\",\"path\":");
        sp_buf_json_str(&b, paths[i]);
        sp_buf_putc(&b, '}');
    }
    sp_buf_putc(&b, ']');
    gw_respond_json(rq, 200, &b);
    sp_buf_dispose(&b);
}

/* ---- /files, /health ---- */

/* Inflates a gzip body (RFC 1952) into a heap buffer of at most max bytes: 0, -EINVAL (not
 * gzip, or truncated), -EFBIG (it inflates past max). */
static int gunzip(const uint8_t *in, size_t len, size_t max, uint8_t **ret, size_t *ret_len)
{
    z_stream z;
    size_t cap = len * 4 < 65536 ? 65536 : len * 4, n = 0;
    int rc, out = -EINVAL;
    uint8_t *buf;

    memset(&z, 0, sizeof(z));
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        return -ENOMEM;
    if (cap > max + 1)
        cap = max + 1;
    buf = sp_xmalloc(cap);
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)(len > UINT32_MAX ? UINT32_MAX : len);
    for (;;) {
        if (n == cap) {
            if (cap > max) {
                out = -EFBIG;
                break;
            }
            cap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            buf = sp_xrealloc(buf, cap);
        }
        z.next_out = buf + n;
        z.avail_out = (uInt)(cap - n);
        rc = inflate(&z, Z_NO_FLUSH);
        n = cap - z.avail_out;
        if (rc == Z_STREAM_END) {
            /* One member, nothing after it. */
            out = z.avail_in == 0 && n <= max ? 0 : n > max ? -EFBIG : -EINVAL;
            break;
        }
        if (rc != Z_OK || (z.avail_in == 0 && z.avail_out != 0)) {
            out = -EINVAL;
            break;
        }
    }
    inflateEnd(&z);
    if (out < 0) {
        free(buf);
        return out;
    }
    *ret = buf;
    *ret_len = n;
    return 0;
}

static void files_http(gw_req_t *rq)
{
    h2o_req_t *req = rq->req;
    bool get = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET"));
    gw_query_t q;
    const char *path = NULL, *user = NULL;
    bool bad = false;

    if (gw_query_parse(req, &q) < 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "malformed query string");
        return;
    }
    for (size_t i = 0; i < q.n; i++) {
        if (strcmp(q.p[i].key, "path") == 0 && !path)
            path = q.p[i].value;
        else if (strcmp(q.p[i].key, "username") == 0 && !user)
            user = q.p[i].value;
    }
    if (user && user[0] && strcmp(user, "root") != 0 && strcmp(user, "user") != 0) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "username must be root or user");
        return;
    }
    if (!user || !user[0])
        user = basic_user(rq, &bad);
    if (bad) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "the user must be root or user");
        return;
    }
    gw_files_spec_t spec = {
        .op = get ? GW_FOP_DOWNLOAD : GW_FOP_UPLOAD, .path = path, .user = user};
    if (!get) {
        const h2o_iovec_t *ct = gw_req_header(rq, "content-type", NULL);
        const h2o_iovec_t *ce = gw_req_header(rq, "content-encoding", NULL);
        bool gz = ce && h2o_memis(ce->base, ce->len, H2O_STRLIT("gzip"));
        spec.multipart_paths =
            ct && ct->len >= 19 && strncasecmp(ct->base, "multipart/form-data", 19) == 0;
        if ((ce && !gz && !h2o_memis(ce->base, ce->len, H2O_STRLIT("identity"))) ||
            (gz && spec.multipart_paths)) {
            gw_respond_error(rq, 415, "unsupported_encoding", NULL,
                             "Content-Encoding: gzip (raw uploads) or identity only");
            return;
        }
        if (gz && path) {
            size_t max = (size_t)rq->gw->cfg->max_file_bytes < GUNZIP_MAX
                             ? (size_t)rq->gw->cfg->max_file_bytes
                             : GUNZIP_MAX;
            int rc =
                gunzip((const uint8_t *)(req->entity.base ? req->entity.base : ""),
                       req->entity.base ? req->entity.len : 0, max, &spec.body, &spec.body_len);
            if (rc == -EFBIG) {
                gw_respond_error(rq, 413, "body_too_large", NULL,
                                 "a gzip upload inflates to at most %zu bytes", max);
                return;
            }
            if (rc < 0) {
                gw_respond_error(rq, 400, "invalid_encoding", NULL,
                                 "the body is not one complete gzip stream");
                return;
            }
        }
    }
    if (!path && !spec.multipart_paths) {
        gw_respond_error(rq, 400, "invalid_query", NULL, "path is required");
        return;
    }
    gw_files_start(rq, &spec);
}

typedef struct {
    gw_job_t job;
    gw_req_t *rq;
    gw_sandbox_loc_t loc;
    bool deleting;
} health_job_t;

static void health_run(gw_job_t *job, PGconn *db)
{
    health_job_t *h = (health_job_t *)job;
    gw_sandbox_locate(job, h->rq->path_id, h->rq->tenant, &h->loc);
    if (h->loc.failed || !h->loc.found || strcmp(h->loc.state, "running") != 0)
        return;
    /* A sandbox whose delete is in the log is gone for E2B (its VM dies at the kill) even while
     * the worker still tears it down: the SDK asks right after its stream was cut. */
    const char *p[2] = {h->rq->path_id, h->rq->tenant};
    PGresult *r = PQexecParams(db,
                               "SELECT 1 FROM events WHERE aggregate_kind = 'sandbox' AND "
                               "aggregate_id = $1 AND tenant = $2 AND type = "
                               "'SandboxDeleteRequested' AND status = 'accepted' LIMIT 1",
                               2, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0)
        h->loc.failed = true;
    else if (PQntuples(r) > 0)
        h->deleting = true;
    PQclear(r);
}

static void health_done(gw_job_t *job)
{
    health_job_t *h = (health_job_t *)job;
    if (h->loc.failed)
        gw_respond_error(h->rq, 503, "unavailable", NULL, "the database is not available");
    else if (h->loc.found && strcmp(h->loc.state, "running") == 0 && !h->deleting)
        gw_respond(h->rq, 204, "application/json", NULL, 0);
    else
        gw_respond_error(h->rq, 502, "sandbox_not_running", NULL, "the sandbox is not running");
    gw_req_unref(h->rq);
    free(h);
}

/* 204 while the sandbox runs, 502 otherwise (E2B's "sandbox gone"): isRunning() reads it. */
static void health(gw_req_t *rq)
{
    if (gw_gone_known(rq->gw, rq->path_id)) {
        gw_respond_error(rq, 502, "sandbox_not_running", NULL, "the sandbox is not running");
        return;
    }
    health_job_t *h = sp_xcalloc(1, sizeof(*h));
    h->rq = rq;
    h->job.run = health_run;
    h->job.done = health_done;
    gw_req_ref(rq);
    if (gw_job_submit(rq->gw, &h->job) < 0) {
        gw_req_unref(rq);
        free(h);
        gw_respond_error(rq, 503, "overloaded", NULL, "too many requests are waiting");
    }
}

/* ---- Connect RPC dispatch ---- */

static void rpc(gw_req_t *rq)
{
    const char *path = rq->path; /* a copy of the request path (the route matched its shape) */
    bool process = strncmp(path, "/process.Process/", 17) == 0;
    const char *method = path + (process ? 17 : 23);
    char m[32];
    size_t n = strcspn(method, "?");
    if (n >= sizeof(m))
        n = sizeof(m) - 1;
    memcpy(m, method, n);
    m[n] = '\0';
    /* The route's row chose the dialect: Start, Connect and WatchDir stream. */
    bool stream = rq->dialect == GW_DIALECT_CONNECT_STREAM;
    sp_json_doc_t *doc = message(rq, stream);
    if (!doc)
        return;
    const sp_json_t *root = sp_json_root(doc);
    if (!process && stream)
        watch_dir(rq, root, false);
    else if (!process && strcmp(m, "CreateWatcher") == 0)
        watch_dir(rq, root, true);
    else if (!process && (strcmp(m, "GetWatcherEvents") == 0 || strcmp(m, "RemoveWatcher") == 0))
        watcher_call(rq, m, root);
    else if (!process)
        fs_call(rq, m, root);
    else if (strcmp(m, "Start") == 0)
        proc_start(rq, root);
    else if (strcmp(m, "Connect") == 0)
        proc_connect(rq, root);
    else
        proc_ctl(rq, m, root);
    sp_json_doc_free(doc);
}

void gw_e2b_envd_auth(gw_req_t *rq, bool signed_ok)
{
    bool signed_url = false;
    if (!target(rq, signed_ok ? &signed_url : NULL))
        return;
    if (signed_url) {
        char named[SP_ID_MAX + 1];
        snprintf(named, sizeof(named), "%s", rq->path_id);
        rq->path_id[0] = '\0';
        gw_signed_files(rq, named, rq->after_auth);
        return;
    }
    gw_auth(rq);
}

/* /health without a sandbox or key: the gateway answers for itself. */
static void envd_health(gw_req_t *rq)
{
    if (!gw_req_header(rq, "e2b-sandbox-id", NULL) && !gw_req_header(rq, "x-access-token", NULL)) {
        gw_respond(rq, 204, "application/json", NULL, 0);
        return;
    }
    rq->after_auth = health;
    gw_e2b_envd_auth(rq, false);
}

static void no_procedure(gw_req_t *rq)
{
    gw_respond_error(rq, 404, "not_found", NULL, "no such procedure");
}

/* clang-format off */
#define ENVD_RPC(path, dialect) {"POST", path, dialect, GW_AUTH_ENVD, GW_R_E2B_ENVD, rpc, 0, NULL}
/* clang-format on */

/* envd's API (port 49983 of a sandbox), rows of the one route table (gateway.h). The
 * streaming procedures come before the unary ones their {procedure} row would take too. */
const gw_route_def_t gw_envd_routes[] = {
    ENVD_RPC("/process.Process/Start", GW_DIALECT_CONNECT_STREAM),
    ENVD_RPC("/process.Process/Connect", GW_DIALECT_CONNECT_STREAM),
    ENVD_RPC("/filesystem.Filesystem/WatchDir", GW_DIALECT_CONNECT_STREAM),
    ENVD_RPC("/process.Process/{procedure}", GW_DIALECT_CONNECT),
    ENVD_RPC("/filesystem.Filesystem/{procedure}", GW_DIALECT_CONNECT),
    {"*", "/process.Process/*", GW_DIALECT_CONNECT, GW_AUTH_PUBLIC, GW_R_E2B_ENVD, no_procedure, 0,
     NULL},
    {"*", "/filesystem.Filesystem/*", GW_DIALECT_CONNECT, GW_AUTH_PUBLIC, GW_R_E2B_ENVD,
     no_procedure, 0, NULL},
    {"GET", "/files", GW_DIALECT_E2B, GW_AUTH_ENVD_SIGNED, GW_R_E2B_ENVD, files_http, 0, NULL},
    {"POST", "/files", GW_DIALECT_E2B, GW_AUTH_ENVD_SIGNED, GW_R_E2B_ENVD, files_http,
     GW_ROUTE_FILE_BODY, NULL},
    {"GET", "/health", GW_DIALECT_E2B, GW_AUTH_PUBLIC, GW_R_E2B_ENVD, envd_health, 0, NULL},
};
const size_t gw_n_envd_routes = sizeof(gw_envd_routes) / sizeof(gw_envd_routes[0]);
