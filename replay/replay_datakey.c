/* Sealed command output and command lines (docs/audit.md, datakey.h): what timeline and
 * export show of a CommandOutput and of a CommandStarted's sealed line, and `space-replay
 * forget`.
 *
 * Without --decrypt a sealed chunk reads "<encrypted N bytes>". With --decrypt the master key
 * file (--master-key-file, default $SPACE_HOME/credstore/master.key, as space-credstore) unwraps
 * each sandbox's data key from data_keys and the chunk reads as its (redacted) text; a
 * forgotten sandbox's chunk reads "<forgotten: N bytes>", one that does not open (another
 * master key, a tampered row) "<does not open: N bytes>". The chain covers the ciphertext, so
 * verify never needs a key.
 *
 * forget --sandbox ID | --tenant T drops the wrapped data keys (nonce and wrapped set NULL,
 * forgotten_at now; the row stays, so space-credstore never makes a new key for a forgotten
 * sandbox). Nothing is written to the log: the event log is the only writer of events and a
 * forget is an operator's act on a mutable table (its output on stdout is the record). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datakey.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "replay.h"
#include "xmalloc.h"

#define KEYS_CACHED 64

typedef struct {
    char sandbox[65];
    int state; /* 1 key, 2 forgotten, 3 none, 4 does not open */
    sp_cred_key_t dk;
} cached_t;

struct replay_keys {
    PGconn *db;
    sp_cred_key_t master;
    cached_t cache[KEYS_CACHED];
    size_t n, next;
};

int replay_keys_open(PGconn *db, const replay_config_t *cfg, replay_keys_t **ret)
{
    *ret = NULL;
    if (!cfg->decrypt)
        return 0;
    const char *home = getenv("SPACE_HOME");
    char *path = cfg->master_key_file[0] ? sp_xstrdup(cfg->master_key_file)
                 : home && home[0]       ? sp_xasprintf("%s/credstore/master.key", home)
                                         : NULL;
    if (!path) {
        fprintf(stderr, "space-replay: --decrypt needs --master-key-file or SPACE_HOME\n");
        return -1;
    }
    replay_keys_t *k = sp_xcalloc(1, sizeof(*k));
    int rc = sp_cred_key_load(path, &k->master);
    if (rc < 0) {
        fprintf(stderr, "space-replay: master key file %s: %s\n", path,
                rc == -EPERM    ? "readable by others than its owner (want mode 0600)"
                : rc == -EINVAL ? "not a file of 32 bytes"
                                : sp_strerror(rc));
        free(path);
        free(k);
        return -1;
    }
    free(path);
    k->db = db;
    *ret = k;
    return 0;
}

void replay_keys_close(replay_keys_t *k)
{
    if (!k)
        return;
    explicit_bzero(k, sizeof(*k));
    free(k);
}

static cached_t *key_of(replay_keys_t *k, const char *sandbox)
{
    for (size_t i = 0; i < k->n; i++)
        if (strcmp(k->cache[i].sandbox, sandbox) == 0)
            return &k->cache[i];
    cached_t *c = &k->cache[k->n < KEYS_CACHED ? k->n++ : k->next++ % KEYS_CACHED];
    explicit_bzero(c, sizeof(*c));
    snprintf(c->sandbox, sizeof(c->sandbox), "%s", sandbox);
    const char *p[1] = {sandbox};
    PGresult *r = PQexecParams(k->db,
                               "SELECT master_key_id, nonce, wrapped, forgotten_at IS NOT NULL "
                               "FROM data_keys WHERE sandbox_id = $1",
                               1, NULL, p, NULL, NULL, 1);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0 || PQntuples(r) != 1)
        c->state = 3;
    else if (*PQgetvalue(r, 0, 3))
        c->state = 2;
    else if (PQgetlength(r, 0, 1) != SP_CRED_NONCE_LEN ||
             sp_datakey_unwrap(&k->master, sandbox, (const uint8_t *)PQgetvalue(r, 0, 1),
                               (const uint8_t *)PQgetvalue(r, 0, 2), (size_t)PQgetlength(r, 0, 2),
                               &c->dk) < 0)
        c->state = 4;
    else
        c->state = 1;
    PQclear(r);
    return c;
}

/* The sandbox's data key if it is the one (key_id) a sealed field names; else NULL after
 * appending the note that says why it is not shown ("<encrypted N bytes>" without keys). */
static const sp_cred_key_t *key_for(replay_keys_t *k, const char *sandbox, const char *key_id,
                                    size_t n, sp_buf_t *out)
{
    char note[96];
    if (!k) {
        snprintf(note, sizeof(note), "<encrypted %zu bytes>", n);
        sp_buf_json_str(out, note);
        return NULL;
    }
    cached_t *c = key_of(k, sandbox);
    if (c->state == 1 && strcmp(c->dk.id, key_id) == 0)
        return &c->dk;
    snprintf(note, sizeof(note), "<%s: %zu bytes>",
             c->state == 2   ? "forgotten"
             : c->state == 3 ? "no data key"
                             : "does not open",
             n);
    sp_buf_json_str(out, note);
    return NULL;
}

static void does_not_open(size_t n, sp_buf_t *out)
{
    char note[96];
    snprintf(note, sizeof(note), "<does not open: %zu bytes>", n);
    sp_buf_json_str(out, note);
}

/* A sealed command line (CommandStarted): argv as a JSON array, a cmd as a string. */
static void cmdline_text(replay_keys_t *k, const char *sandbox, const Space__V1__CommandStarted *st,
                         sp_buf_t *out)
{
    size_t ct_len = st->cmdline_ciphertext.len;
    size_t n = ct_len - (ct_len >= SP_CRED_TAG_LEN ? SP_CRED_TAG_LEN : 0);
    const sp_cred_key_t *dk = key_for(k, sandbox, st->cmdline_key_id, n, out);
    if (!dk)
        return;
    Space__V1__CommandLine *line = NULL;
    if (st->cmdline_nonce.len != SP_CRED_NONCE_LEN ||
        sp_cmdline_open(dk, sandbox, st->cmd_id, st->cmdline_nonce.data,
                        st->cmdline_ciphertext.data, ct_len, &line) < 0) {
        does_not_open(n, out);
        return;
    }
    if (line->n_argv) {
        sp_buf_putc(out, '[');
        for (size_t i = 0; i < line->n_argv; i++) {
            if (i)
                sp_buf_putc(out, ',');
            sp_buf_json_str(out, line->argv[i]);
        }
        if (line->truncated)
            sp_buf_puts(out, ",\"<truncated>\"");
        sp_buf_putc(out, ']');
    } else {
        sp_buf_json_str(out, line->cmd);
    }
    space__v1__command_line__free_unpacked(line, NULL);
}

/* A file event's sealed paths: {"path": ...} and, for a move, "to". */
static void paths_text(replay_keys_t *k, const char *sandbox, const sp_envelope_t *e,
                       const Space__V1__SealedPaths *sp, sp_buf_t *out)
{
    size_t ct_len = sp->ciphertext.len;
    size_t n = ct_len - (ct_len >= SP_CRED_TAG_LEN ? SP_CRED_TAG_LEN : 0);
    const sp_cred_key_t *dk = key_for(k, sandbox, sp->key_id, n, out);
    if (!dk)
        return;
    Space__V1__FilePaths *fp = NULL;
    if (sp->nonce.len != SP_CRED_NONCE_LEN ||
        sp_paths_open(dk, sandbox, sp_event_type_name(e->payload_case), sp->nonce.data,
                      sp->ciphertext.data, ct_len, &fp) < 0) {
        does_not_open(n, out);
        return;
    }
    sp_buf_puts(out, "{\"path\":");
    sp_buf_json_str(out, fp->path);
    if (fp->to[0]) {
        sp_buf_puts(out, ",\"to\":");
        sp_buf_json_str(out, fp->to);
    }
    sp_buf_putc(out, '}');
    space__v1__file_paths__free_unpacked(fp, NULL);
}

/* A CommandOutput's text: its data, or its ciphertext opened. */
static void output_text(replay_keys_t *k, const char *sandbox, const Space__V1__CommandOutput *o,
                        sp_buf_t *out)
{
    if (!o->ciphertext.len) {
        sp_buf_json_strn(out, o->data.data, o->data.len);
        return;
    }
    size_t n = o->ciphertext.len - (o->ciphertext.len >= SP_CRED_TAG_LEN ? SP_CRED_TAG_LEN : 0);
    const sp_cred_key_t *dk = key_for(k, sandbox, o->key_id, n, out);
    if (!dk)
        return;
    uint8_t *pt = sp_xmalloc(n ? n : 1);
    int rc = o->nonce.len == SP_CRED_NONCE_LEN
                 ? sp_output_open(dk, sandbox, o->cmd_id, o->stream, o->offset, o->nonce.data,
                                  o->ciphertext.data, o->ciphertext.len, pt)
                 : -EBADMSG;
    if (rc == 0)
        sp_buf_json_strn(out, pt, n);
    else
        does_not_open(n, out);
    explicit_bzero(pt, n);
    free(pt);
}

/* `,"name":` (json) or `  name=` before a field's value. */
static void field_name(bool json, const char *name, sp_buf_t *out)
{
    sp_buf_printf(out, json ? ",\"%s\":" : "  %s=", name);
}

void replay_sealed_append(replay_keys_t *k, const char *sandbox, const sp_envelope_t *e, bool json,
                          sp_buf_t *out)
{
    sp_file_paths_t fp;
    const Space__V1__CommandStarted *st = NULL;
    if (sp_envelope_file_paths((sp_envelope_t *)e, &fp)) {
        if (*fp.sealed) {
            field_name(json, "paths", out);
            paths_text(k, sandbox, e, *fp.sealed, out);
        }
        return;
    }
    switch (e->payload_case) {
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT:
        field_name(json, "output", out);
        output_text(k, sandbox, e->command_output, out);
        return;
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED:
        st = e->command_started;
        break;
    case SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED:
        /* A short command's: its start and output are inside (docs/architecture.md). */
        st = e->command_exited->started;
        break;
    default:
        return;
    }
    if (st && st->cmdline_ciphertext.len) {
        field_name(json, "cmdline", out);
        cmdline_text(k, sandbox, st, out);
    }
    if (e->payload_case != SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED ||
        !e->command_exited->n_output)
        return;
    field_name(json, "output", out);
    sp_buf_putc(out, '[');
    for (size_t i = 0; i < e->command_exited->n_output; i++) {
        if (i)
            sp_buf_putc(out, ',');
        output_text(k, sandbox, e->command_exited->output[i], out);
    }
    sp_buf_putc(out, ']');
}

int replay_forget_check(const replay_config_t *cfg)
{
    bool sbx = cfg->sandbox[0], ten = cfg->tenant[0];
    if (sbx == ten) {
        fprintf(stderr, "space-replay: forget needs --sandbox ID or --tenant T (one of them)\n");
        return 1;
    }
    if (!sp_id_valid(sbx ? cfg->sandbox : cfg->tenant)) {
        fprintf(stderr, "space-replay: forget: not a valid id\n");
        return 1;
    }
    return 0;
}

int replay_forget(PGconn *db, const replay_config_t *cfg)
{
    bool sbx = cfg->sandbox[0];
    const char *p[1] = {sbx ? cfg->sandbox : cfg->tenant};
    /* A sandbox without a key yet gets its tombstone too: none is ever made for it. Its
     * tenant is unknown here when it has none; the sandboxes row names it. */
    PGresult *r = PQexecParams(
        db,
        sbx ? "WITH t AS (INSERT INTO data_keys (sandbox_id, tenant, key_id, master_key_id, "
              "forgotten_at) SELECT id, tenant, '', '', now() FROM sandboxes WHERE id = $1 "
              "ON CONFLICT (sandbox_id) DO UPDATE SET nonce = NULL, wrapped = NULL, "
              "forgotten_at = coalesce(data_keys.forgotten_at, now()) RETURNING sandbox_id) "
              "SELECT sandbox_id FROM t ORDER BY 1"
            : "WITH t AS (UPDATE data_keys SET nonce = NULL, wrapped = NULL, forgotten_at = "
              "coalesce(forgotten_at, now()) WHERE tenant = $1 RETURNING sandbox_id) "
              "SELECT sandbox_id FROM t ORDER BY 1",
        1, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        fprintf(stderr, "space-replay: forget: %s", PQerrorMessage(db));
        PQclear(r);
        return REPLAY_EUSAGE;
    }
    int n = PQntuples(r);
    for (int i = 0; i < n; i++)
        printf("forgotten %s\n", PQgetvalue(r, i, 0));
    PQclear(r);
    if (n == 0) {
        fprintf(stderr, "space-replay: forget: no %s %s\n", sbx ? "sandbox" : "data keys of tenant",
                p[0]);
        return REPLAY_EUSAGE;
    }
    return REPLAY_OK;
}
