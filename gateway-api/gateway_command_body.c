/* The body of POST /v1/sandboxes/{id}/commands, checked field by field, and the two messages
 * made from it: the CommandRequested intent (for the event log) and the ExecRequest (for the
 * worker, on the data plane). The limits are those lib/envelope.c's validate_command enforces on
 * the bus, so a body that passes here is an event the log accepts.
 *
 * What goes where: the event carries environment NAMES, the size of stdin and its SHA-256; the
 * values and the stdin bytes go only into the ExecRequest, which is never stored (DESIGN.md:
 * the event log is kept forever and shown to auditors). The heap copies made here of those
 * values (stdin, the "NAME=value" strings, the packed request) are wiped before they are
 * freed. */
#include "gateway.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "b64.h"
#include "envelope.h"
#include "error.h"
#include "ids.h"
#include "json.h"
#include "xmalloc.h"
#include "text.h"

#define ARGV_MAX          256
#define ARG_MAX_BYTES     4096
#define CMD_MAX_BYTES     16384
#define CWD_MAX_BYTES     1024
#define CMD_TIMEOUT_MAX_S (24 * 3600)

/* ---- the body ---- */

static int parse_argv(const sp_json_t *v, gw_cmd_spec_t *s, gw_verr_t *e)
{
    if (sp_json_type(v) != SP_JSON_ARRAY)
        return gw_bad(e, "invalid_field", "argv must be an array of strings");
    size_t n = sp_json_len(v);
    if (n == 0 || n > ARGV_MAX)
        return gw_bad(e, "invalid_field", "argv must have 1..%d entries", ARGV_MAX);
    s->argv = sp_xcalloc(n, sizeof(*s->argv));
    for (size_t i = 0; i < n; i++) {
        const char *a = sp_json_str(sp_json_at(v, i), NULL);
        if (!a)
            return gw_bad(e, "invalid_field", "argv[%zu] must be a string", i);
        if (!sp_text_valid(a, ARG_MAX_BYTES, SP_TEXT_SPACE_CONTROLS))
            return gw_bad(e, "invalid_field",
                          "argv[%zu] must be at most %d bytes of UTF-8 without control characters "
                          "other than newline, tab and carriage return",
                          i, ARG_MAX_BYTES);
        s->argv[i] = a;
    }
    if (!s->argv[0][0])
        return gw_bad(e, "invalid_field", "argv[0] must not be empty");
    s->n_argv = n;
    return 0;
}

static int parse_env(const sp_json_t *v, gw_cmd_spec_t *s, gw_verr_t *e)
{
    if (sp_json_type(v) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_field", "env must be an object of strings");
    size_t n = sp_json_len(v);
    if (n > GW_ENV_MAX)
        return gw_bad(e, "invalid_field", "env has %zu entries, at most %d", n, GW_ENV_MAX);
    for (size_t i = 0; i < n; i++) {
        const char *k = sp_json_key_at(v, i);
        size_t vlen = 0;
        const char *val = sp_json_str(sp_json_at(v, i), &vlen);
        if (!k || !sp_intent_env_name_ok(k))
            return gw_bad(e, "invalid_field",
                          "env names must match [A-Za-z_][A-Za-z0-9_]* (at most %d chars)",
                          SP_INTENT_ENV_NAME_MAX);
        if (!val)
            return gw_bad(e, "invalid_field", "env.%s must be a string", k);
        if (vlen > GW_ENV_VALUE_MAX)
            return gw_bad(e, "invalid_field", "env.%s is over %d bytes", k, GW_ENV_VALUE_MAX);
        s->env_names[i] = k;
        s->env_values[i] = val;
    }
    s->n_env = n;
    return 0;
}

static int parse_stdin(const sp_json_t *v, bool b64, gw_cmd_spec_t *s, gw_verr_t *e)
{
    const char *name = b64 ? "stdin_b64" : "stdin";
    size_t len = 0;
    const char *str = sp_json_str(v, &len);

    if (s->has_stdin)
        return gw_bad(e, "invalid_field", "give at most one of stdin and stdin_b64");
    if (!str)
        return gw_bad(e, "invalid_field", "%s must be a string", name);
    if (b64) {
        if (len > (GW_STDIN_MAX + 2) / 3 * 4)
            return gw_bad(e, "invalid_field", "stdin_b64 decodes to more than %d bytes",
                          GW_STDIN_MAX);
        if (sp_b64_decode(str, len, &s->stdin_data, &s->stdin_len) < 0)
            return gw_bad(e, "invalid_field", "stdin_b64 is not base64 (RFC 4648, padded)");
        if (s->stdin_len > GW_STDIN_MAX)
            return gw_bad(e, "invalid_field", "stdin_b64 decodes to more than %d bytes",
                          GW_STDIN_MAX);
    } else {
        if (len > GW_STDIN_MAX)
            return gw_bad(e, "invalid_field", "stdin is over %d bytes", GW_STDIN_MAX);
        s->stdin_data = sp_xmalloc(len ? len : 1);
        memcpy(s->stdin_data, str, len);
        s->stdin_len = len;
    }
    s->has_stdin = true;
    sp_sha256(s->stdin_data, s->stdin_len, s->stdin_sha256);
    return 0;
}

/* "pty": true (80x24), false, or {"rows": R, "cols": C}. */
static int parse_pty(const sp_json_t *v, gw_cmd_spec_t *s, gw_verr_t *e)
{
    bool on;
    if (sp_json_bool(v, &on) == 0) {
        s->pty_rows = on ? GW_PTY_DEFAULT_ROWS : 0;
        s->pty_cols = on ? GW_PTY_DEFAULT_COLS : 0;
        return 0;
    }
    if (sp_json_type(v) != SP_JSON_OBJECT)
        return gw_bad(e, "invalid_field", "pty must be a boolean or {\"rows\": R, \"cols\": C}");
    s->pty_rows = GW_PTY_DEFAULT_ROWS;
    s->pty_cols = GW_PTY_DEFAULT_COLS;
    for (size_t i = 0; i < sp_json_len(v); i++) {
        const char *k = sp_json_key_at(v, i);
        int64_t x;
        bool rows = strcmp(k, "rows") == 0;
        if (!rows && strcmp(k, "cols") != 0)
            return gw_bad(e, "unknown_field", "unknown field pty.%s", k);
        if (sp_json_int(sp_json_at(v, i), 1, GW_PTY_MAX, &x) < 0)
            return gw_bad(e, "invalid_field", "pty.%s must be an integer within 1..%d", k,
                          GW_PTY_MAX);
        if (rows)
            s->pty_rows = (uint32_t)x;
        else
            s->pty_cols = (uint32_t)x;
    }
    return 0;
}

static int parse_field(const char *k, const sp_json_t *v, gw_cmd_spec_t *s, gw_verr_t *e)
{
    if (strcmp(k, "cmd") == 0) {
        s->cmd = sp_json_str(v, NULL);
        if (!s->cmd)
            return gw_bad(e, "invalid_field", "cmd must be a string");
        if (!s->cmd[0] || !sp_text_valid(s->cmd, CMD_MAX_BYTES, SP_TEXT_SPACE_CONTROLS))
            return gw_bad(e, "invalid_field",
                          "cmd must be 1..%d bytes of UTF-8 without control characters other than "
                          "newline, tab and carriage return",
                          CMD_MAX_BYTES);
        return 0;
    }
    if (strcmp(k, "argv") == 0)
        return parse_argv(v, s, e);
    if (strcmp(k, "env") == 0)
        return parse_env(v, s, e);
    if (strcmp(k, "cwd") == 0) {
        s->cwd = sp_json_str(v, NULL);
        if (!s->cwd || !gw_text_ok(s->cwd, CWD_MAX_BYTES))
            return gw_bad(e, "invalid_field",
                          "cwd must be a string of at most %d bytes without control characters",
                          CWD_MAX_BYTES);
        return 0;
    }
    if (strcmp(k, "user") == 0) {
        s->user = sp_json_str(v, NULL);
        if (!s->user || (strcmp(s->user, "root") != 0 && strcmp(s->user, "user") != 0))
            return gw_bad(e, "invalid_field", "user must be \"root\" or \"user\"");
        return 0;
    }
    if (strcmp(k, "timeout_s") == 0) {
        int64_t x;
        int rc = sp_json_int(v, 0, CMD_TIMEOUT_MAX_S, &x);
        if (rc < 0)
            return gw_bad(e, "invalid_field", "timeout_s must be an integer within 0..%d",
                          CMD_TIMEOUT_MAX_S);
        s->timeout_s = (uint32_t)x;
        return 0;
    }
    if (strcmp(k, "stdin") == 0)
        return parse_stdin(v, false, s, e);
    if (strcmp(k, "stdin_b64") == 0)
        return parse_stdin(v, true, s, e);
    if (strcmp(k, "background") == 0) {
        if (sp_json_bool(v, &s->background) < 0)
            return gw_bad(e, "invalid_field", "background must be a boolean");
        return 0;
    }
    if (strcmp(k, "stdin_open") == 0) {
        if (sp_json_bool(v, &s->stdin_open) < 0)
            return gw_bad(e, "invalid_field", "stdin_open must be a boolean");
        return 0;
    }
    if (strcmp(k, "pty") == 0)
        return parse_pty(v, s, e);
    return gw_bad(e, "unknown_field", "unknown field %s", k);
}

void gw_cmd_spec_dispose(gw_cmd_spec_t *s)
{
    if (!s)
        return;
    if (s->stdin_data) {
        explicit_bzero(s->stdin_data, s->stdin_len);
        free(s->stdin_data);
    }
    free(s->argv);
    sp_json_doc_free(s->doc);
    memset(s, 0, sizeof(*s));
}

int gw_cmd_spec_parse(const char *body, size_t len, gw_cmd_spec_t *s, const char **ret_code,
                      char err[GW_ERR_MSG_MAX])
{
    gw_verr_t e = {.code = NULL, .msg = err};
    char jerr[SP_JSON_ERR_MAX];
    int rc = 0;

    memset(s, 0, sizeof(*s));
    /* Strings as long as the body: stdin may be most of it (the body limit bounds them all). */
    sp_json_limits_t lim = {
        .max_bytes = len + 1, .max_depth = 3, .max_nodes = 1024, .max_string = len + 1};
    if (len == 0) {
        rc = gw_bad(&e, "invalid_json", "the body is empty; expected a JSON object");
        goto out;
    }
    if (sp_json_parse(body, len, &lim, &s->doc, jerr) < 0) {
        rc = gw_bad(&e, "invalid_json", "the body is not valid JSON: %s", jerr);
        goto out;
    }
    const sp_json_t *root = sp_json_root(s->doc);
    if (sp_json_type(root) != SP_JSON_OBJECT) {
        rc = gw_bad(&e, "invalid_json", "the body must be a JSON object");
        goto out;
    }
    for (size_t i = 0; i < sp_json_len(root) && rc == 0; i++)
        rc = parse_field(sp_json_key_at(root, i), sp_json_at(root, i), s, &e);
    if (rc < 0)
        goto out;
    if ((s->cmd != NULL) == (s->n_argv > 0)) {
        rc = gw_bad(&e, s->cmd ? "invalid_field" : "missing_field",
                    "give exactly one of cmd (run as /bin/sh -c) and argv");
        goto out;
    }
out:
    *ret_code = e.code ? e.code : "invalid_json";
    return rc;
}

/* ---- the messages ---- */

void gw_cmd_intent_init(gw_cmd_intent_t *in, const gw_cmd_spec_t *s, const char *sandbox,
                        const char *tenant, const char *actor, const char *correlation,
                        const char *cmd_id, bool sealed)
{
    space__v1__envelope__init(&in->env);
    space__v1__aggregate__init(&in->agg);
    space__v1__command_requested__init(&in->cr);
    in->agg.kind = "sandbox";
    in->agg.id = (char *)sandbox;
    /* The generated structs have no const; nothing writes through these pointers. */
    in->cr.cmd_id = (char *)cmd_id;
    in->cr.sealed = sealed;
    in->cr.argv = sealed ? NULL : (char **)s->argv;
    in->cr.n_argv = sealed ? 0 : s->n_argv;
    in->cr.cmd = (char *)(s->cmd && !sealed ? s->cmd : "");
    in->cr.env_names = (char **)s->env_names;
    in->cr.n_env_names = s->n_env;
    in->cr.cwd = (char *)(s->cwd ? s->cwd : "");
    in->cr.user = (char *)(s->user ? s->user : "");
    in->cr.timeout_s = s->timeout_s;
    in->cr.background = s->background;
    in->cr.pty = s->pty_rows > 0;
    in->cr.stdin_open = s->stdin_open;
    in->cr.stdin_bytes = s->stdin_len;
    if (s->has_stdin) {
        in->cr.stdin_sha256.data = (uint8_t *)s->stdin_sha256;
        in->cr.stdin_sha256.len = SP_SHA256_LEN;
    }
    in->env.aggregate = &in->agg;
    in->env.tenant = (char *)tenant;
    in->env.actor = (char *)actor;
    in->env.correlation_id = (char *)correlation;
    in->env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED;
    in->env.command_requested = &in->cr;
}

int gw_cmd_exec_pack(const gw_cmd_spec_t *s, const char *sandbox, const char *tenant,
                     const char *cmd_id, const char *intent_event_id, const char *correlation,
                     uint32_t reply_wait_ms, uint8_t **ret_buf, size_t *ret_len)
{
    Space__Io__V1__ExecRequest req = SPACE__IO__V1__EXEC_REQUEST__INIT;
    char *env[GW_ENV_MAX];
    size_t env_len[GW_ENV_MAX];
    int rc = 0;

    req.sandbox = (char *)sandbox;
    req.tenant = (char *)tenant;
    req.cmd_id = (char *)cmd_id;
    req.intent_event_id = (char *)intent_event_id;
    req.correlation_id = (char *)correlation;
    req.argv = (char **)s->argv;
    req.n_argv = s->n_argv;
    req.cmd = (char *)(s->cmd ? s->cmd : "");
    for (size_t i = 0; i < s->n_env; i++) {
        env[i] = sp_xasprintf("%s=%s", s->env_names[i], s->env_values[i]);
        env_len[i] = strlen(env[i]);
    }
    req.env = env;
    req.n_env = s->n_env;
    req.cwd = (char *)(s->cwd ? s->cwd : "");
    req.user = (char *)(s->user ? s->user : "root");
    req.timeout_s = s->timeout_s;
    req.stdin.data = s->stdin_data;
    req.stdin.len = s->stdin_len;
    req.background = s->background;
    req.stdin_open = s->stdin_open;
    req.pty_rows = s->pty_rows;
    req.pty_cols = s->pty_cols;
    req.reply_wait_ms = reply_wait_ms;

    size_t n = space__io__v1__exec_request__get_packed_size(&req);
    if (n > (size_t)SP_BUS_MAX_MSG) {
        rc = SP_ETOOBIG;
    } else {
        uint8_t *buf = sp_xmalloc(n ? n : 1);
        space__io__v1__exec_request__pack(&req, buf);
        *ret_buf = buf;
        *ret_len = n;
    }
    for (size_t i = 0; i < s->n_env; i++) {
        explicit_bzero(env[i], env_len[i]);
        free(env[i]);
    }
    return rc;
}
