/* Data keys, sealed output and redaction (datakey.h, docs/audit.md). */
#include "datakey.h"

#include <errno.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "hash.h"
#include "space.pb-c.h"
#include "xmalloc.h"

static size_t datakey_aad(const char *sandbox, uint8_t *out, size_t cap)
{
    int n = snprintf((char *)out, cap, "space-datakey:v1:%.64s", sandbox);
    return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}

/* A data key's id: the first bytes of its SHA-256, in hex (names it without revealing it). */
static void set_key_id(sp_cred_key_t *dk)
{
    uint8_t h[SP_SHA256_LEN];
    sp_sha256(dk->k, SP_CRED_KEY_LEN, h);
    for (int i = 0; i < SP_CRED_KEY_ID_LEN / 2; i++)
        snprintf(dk->id + 2 * i, 3, "%02x", h[i]);
    explicit_bzero(h, sizeof(h));
}

int sp_datakey_generate(sp_cred_key_t *ret_dk)
{
    if (RAND_bytes(ret_dk->k, SP_CRED_KEY_LEN) != 1)
        return -EIO;
    set_key_id(ret_dk);
    return 0;
}

int sp_datakey_wrap(const sp_cred_key_t *master, const char *sandbox, const sp_cred_key_t *dk,
                    uint8_t ret_nonce[SP_CRED_NONCE_LEN],
                    uint8_t ret_wrapped[SP_DATAKEY_WRAPPED_LEN])
{
    uint8_t aad[96];
    size_t al = datakey_aad(sandbox, aad, sizeof(aad));
    return sp_cred_seal(master, aad, al, dk->k, SP_CRED_KEY_LEN, ret_nonce, ret_wrapped);
}

int sp_datakey_unwrap(const sp_cred_key_t *master, const char *sandbox,
                      const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *wrapped, size_t len,
                      sp_cred_key_t *ret_dk)
{
    memset(ret_dk, 0, sizeof(*ret_dk));
    if (len != SP_DATAKEY_WRAPPED_LEN)
        return -EBADMSG;
    uint8_t aad[96];
    size_t al = datakey_aad(sandbox, aad, sizeof(aad));
    int rc = sp_cred_open(master, aad, al, nonce, wrapped, len, ret_dk->k);
    if (rc < 0) {
        explicit_bzero(ret_dk, sizeof(*ret_dk));
        return rc;
    }
    set_key_id(ret_dk);
    return 0;
}

static size_t output_aad(const char *sandbox, const char *cmd_id, uint32_t stream, uint64_t offset,
                         uint8_t *out)
{
    int n = snprintf((char *)out, SP_OUTPUT_AAD_MAX, "space-out:v1:%.64s:%.64s:%u:%llu", sandbox,
                     cmd_id, stream, (unsigned long long)offset);
    return n < 0 ? 0 : (size_t)n >= SP_OUTPUT_AAD_MAX ? SP_OUTPUT_AAD_MAX - 1 : (size_t)n;
}

int sp_output_seal(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                   uint32_t stream, uint64_t offset, const uint8_t *pt, size_t len,
                   uint8_t ret_nonce[SP_CRED_NONCE_LEN], uint8_t *ret_ct)
{
    uint8_t aad[SP_OUTPUT_AAD_MAX];
    size_t al = output_aad(sandbox, cmd_id, stream, offset, aad);
    return sp_cred_seal(dk, aad, al, pt, len, ret_nonce, ret_ct);
}

int sp_output_open(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                   uint32_t stream, uint64_t offset, const uint8_t nonce[SP_CRED_NONCE_LEN],
                   const uint8_t *ct, size_t ct_len, uint8_t *ret_pt)
{
    uint8_t aad[SP_OUTPUT_AAD_MAX];
    size_t al = output_aad(sandbox, cmd_id, stream, offset, aad);
    return sp_cred_open(dk, aad, al, nonce, ct, ct_len, ret_pt);
}

/* ---- command lines and file paths: packed messages, sealed ---- */

/* Packs m (at most max bytes: -EINVAL beyond) and seals it under dk with aad. */
static int seal_msg(const sp_cred_key_t *dk, const uint8_t *aad, size_t al,
                    const ProtobufCMessage *m, size_t max, uint8_t ret_nonce[SP_CRED_NONCE_LEN],
                    uint8_t **ret_ct, size_t *ret_ct_len)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    if (len > max)
        return -EINVAL;
    uint8_t *pt = sp_xmalloc(len ? len : 1);
    protobuf_c_message_pack(m, pt);
    uint8_t *ct = sp_xmalloc(len + SP_CRED_TAG_LEN);
    int rc = sp_cred_seal(dk, aad, al, pt, len, ret_nonce, ct);
    explicit_bzero(pt, len);
    free(pt);
    if (rc < 0) {
        free(ct);
        return rc;
    }
    *ret_ct = ct;
    *ret_ct_len = len + SP_CRED_TAG_LEN;
    return 0;
}

/* Opens ct (at most max + tag bytes) and unpacks a message of desc: -EBADMSG otherwise. */
static int open_msg(const sp_cred_key_t *dk, const uint8_t *aad, size_t al,
                    const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *ct, size_t ct_len,
                    size_t max, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **ret)
{
    if (ct_len < SP_CRED_TAG_LEN || ct_len > max + SP_CRED_TAG_LEN)
        return -EBADMSG;
    size_t len = ct_len - SP_CRED_TAG_LEN;
    uint8_t *pt = sp_xmalloc(len ? len : 1);
    int rc = sp_cred_open(dk, aad, al, nonce, ct, ct_len, pt);
    ProtobufCMessage *m = NULL;
    if (rc == 0)
        m = protobuf_c_message_unpack(desc, NULL, len, pt);
    explicit_bzero(pt, len);
    free(pt);
    if (rc < 0 || !m)
        return -EBADMSG;
    *ret = m;
    return 0;
}

static size_t sealed_aad(const char *what, const char *sandbox, const char *name, uint8_t *out)
{
    int n = snprintf((char *)out, SP_OUTPUT_AAD_MAX, "%s:v1:%.64s:%.64s", what, sandbox, name);
    return n < 0 ? 0 : (size_t)n >= SP_OUTPUT_AAD_MAX ? SP_OUTPUT_AAD_MAX - 1 : (size_t)n;
}

int sp_cmdline_seal(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                    char *const *argv, size_t n_argv, const char *cmd,
                    uint8_t ret_nonce[SP_CRED_NONCE_LEN], uint8_t **ret_ct, size_t *ret_ct_len)
{
    Space__V1__CommandLine line = SPACE__V1__COMMAND_LINE__INIT;
    uint8_t aad[SP_OUTPUT_AAD_MAX];

    if ((n_argv == 0) == (!cmd || !cmd[0]))
        return -EINVAL;
    line.argv = (char **)argv;
    line.n_argv = n_argv;
    line.cmd = (char *)(n_argv ? "" : cmd);
    /* Cut at an entry until it fits; a cmd is at most 16 KiB (envelope.c), so it always does. */
    while (space__v1__command_line__get_packed_size(&line) > SP_COMMAND_LINE_SEALED_MAX &&
           line.n_argv > 1) {
        line.n_argv--;
        line.truncated = true;
    }
    size_t al = sealed_aad("space-cmd", sandbox, cmd_id, aad);
    return seal_msg(dk, aad, al, &line.base, SP_COMMAND_LINE_SEALED_MAX, ret_nonce, ret_ct,
                    ret_ct_len);
}

int sp_cmdline_open(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                    const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *ct, size_t ct_len,
                    Space__V1__CommandLine **ret_line)
{
    uint8_t aad[SP_OUTPUT_AAD_MAX];
    size_t al = sealed_aad("space-cmd", sandbox, cmd_id, aad);
    return open_msg(dk, aad, al, nonce, ct, ct_len, SP_COMMAND_LINE_SEALED_MAX,
                    &space__v1__command_line__descriptor, (ProtobufCMessage **)ret_line);
}

int sp_paths_seal(const sp_cred_key_t *dk, const char *sandbox, const char *type, const char *path,
                  const char *to, uint8_t ret_nonce[SP_CRED_NONCE_LEN], uint8_t **ret_ct,
                  size_t *ret_ct_len)
{
    Space__V1__FilePaths fp = SPACE__V1__FILE_PATHS__INIT;
    uint8_t aad[SP_OUTPUT_AAD_MAX];

    if (!path || !path[0])
        return -EINVAL;
    fp.path = (char *)path;
    fp.to = (char *)(to ? to : "");
    size_t al = sealed_aad("space-path", sandbox, type, aad);
    return seal_msg(dk, aad, al, &fp.base, SP_FILE_PATHS_SEALED_MAX, ret_nonce, ret_ct, ret_ct_len);
}

int sp_paths_open(const sp_cred_key_t *dk, const char *sandbox, const char *type,
                  const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *ct, size_t ct_len,
                  Space__V1__FilePaths **ret_paths)
{
    uint8_t aad[SP_OUTPUT_AAD_MAX];
    size_t al = sealed_aad("space-path", sandbox, type, aad);
    return open_msg(dk, aad, al, nonce, ct, ct_len, SP_FILE_PATHS_SEALED_MAX,
                    &space__v1__file_paths__descriptor, (ProtobufCMessage **)ret_paths);
}

/* ---- redaction ---- */

typedef struct {
    char name[65];
    uint8_t *v;
    size_t len;
} rvalue_t;

struct sp_redactor {
    rvalue_t *vals;
    size_t n;
    size_t longest;
    sp_buf_t hold; /* bytes fed but not yet out: they may begin a value */
};

sp_redactor_t *sp_redactor_new(void)
{
    sp_redactor_t *r = sp_xcalloc(1, sizeof(*r));
    sp_buf_init(&r->hold);
    return r;
}

bool sp_redactor_add(sp_redactor_t *r, const char *name, const void *value, size_t len)
{
    if (len < SP_REDACT_MIN || len > SP_REDACT_VALUE_MAX || r->n >= SP_REDACT_VALUES_MAX)
        return false;
    for (size_t i = 0; i < r->n; i++)
        if (r->vals[i].len == len && memcmp(r->vals[i].v, value, len) == 0)
            return true;
    r->vals = sp_xrealloc(r->vals, (r->n + 1) * sizeof(*r->vals));
    rvalue_t *v = &r->vals[r->n++];
    size_t k = 0;
    for (; name && name[k] && k < sizeof(v->name) - 1; k++) {
        char c = name[k];
        bool ok =
            (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
        v->name[k] = c;
        if (!ok)
            v->name[k] = '_';
    }
    v->name[k] = 0;
    v->v = sp_xmalloc(len);
    memcpy(v->v, value, len);
    v->len = len;
    if (len > r->longest)
        r->longest = len;
    return true;
}

void sp_redactor_add_env(sp_redactor_t *r, char *const *env, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *eq = env[i] ? strchr(env[i], '=') : NULL;
        if (!eq)
            continue;
        char name[65];
        size_t nl = (size_t)(eq - env[i]);
        snprintf(name, sizeof(name), "%.*s", (int)(nl < 64 ? nl : 64), env[i]);
        (void)sp_redactor_add(r, name, eq + 1, strlen(eq + 1));
    }
}

/* At p (avail bytes): the longest value matching whole (its index), -1 if none; *partial
 * says whether the avail bytes are a proper prefix of a longer value. */
static long match_at(const sp_redactor_t *r, const uint8_t *p, size_t avail, bool *partial)
{
    long best = -1;
    *partial = false;
    for (size_t i = 0; i < r->n; i++) {
        const rvalue_t *v = &r->vals[i];
        if (v->len <= avail) {
            if (memcmp(p, v->v, v->len) == 0 && (best < 0 || v->len > r->vals[best].len))
                best = (long)i;
        } else if (memcmp(p, v->v, avail) == 0) {
            *partial = true;
        }
    }
    return best;
}

static void scan(sp_redactor_t *r, sp_buf_t *out, bool final)
{
    const uint8_t *d = (const uint8_t *)r->hold.data;
    size_t len = r->hold.len, i = 0, from = 0;
    while (i < len) {
        bool partial;
        long m = match_at(r, d + i, len - i, &partial);
        /* A longer value may still complete here: wait for more bytes. */
        if (partial && !final)
            break;
        if (m >= 0) {
            sp_buf_append(out, d + from, i - from);
            sp_buf_printf(out, "[redacted:%s]", r->vals[m].name);
            i += r->vals[m].len;
            from = i;
            continue;
        }
        i++;
    }
    sp_buf_append(out, d + from, i - from);
    size_t rest = len - i;
    if (rest && i)
        memmove(r->hold.data, r->hold.data + i, rest);
    if (i)
        explicit_bzero(r->hold.data + rest, i);
    r->hold.len = rest;
}

void sp_redactor_feed(sp_redactor_t *r, const void *data, size_t len, sp_buf_t *out)
{
    if (r->n == 0) {
        sp_buf_append(out, data, len);
        return;
    }
    sp_buf_append(&r->hold, data, len);
    scan(r, out, false);
}

void sp_redactor_flush(sp_redactor_t *r, sp_buf_t *out)
{
    scan(r, out, true);
}

size_t sp_redactor_held(const sp_redactor_t *r)
{
    return r->hold.len;
}

void sp_redactor_free(sp_redactor_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        explicit_bzero(r->vals[i].v, r->vals[i].len);
        free(r->vals[i].v);
    }
    free(r->vals);
    if (r->hold.data)
        explicit_bzero(r->hold.data, r->hold.cap);
    sp_buf_dispose(&r->hold);
    free(r);
}
