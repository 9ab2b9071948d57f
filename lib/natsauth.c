/* NKey credentials and the generated nats-server authorization block (natsauth.h).
 *
 * JetStream permissions (nats-server 2.9): the API is request/reply on $JS.API.>, so what an
 * identity may do is what it may publish there, and replies reach it on its inbox.
 *   - publishing to the stream: publish on the event subject; the ack comes to the inbox.
 *   - a pull consumer: $JS.API.CONSUMER.INFO.<stream>.<durable> (bind),
 *     $JS.API.CONSUMER.MSG.NEXT.<stream>.<durable> (fetch), $JS.ACK.<stream>.<durable>.>
 *     (acks are publishes to the message's reply subject).
 *   - a pushed durable (the event log's, sp_bus_consumer_push): delivered into the reader's
 *     own inbox, which only it may subscribe to; it answers flow control on
 *     $JS.FC.<stream>.<durable>.>.
 *   - creating a durable: cnats 3.4.1 sends $JS.API.CONSUMER.DURABLE.CREATE.<stream>.<durable>
 *     (seen in tests/unit/lib/test_natsauth.c), which carries no filter: whoever may send it
 *     may give its durable any filter, so it is granted only where the filter is the whole
 *     stream anyway (the event log). Every other durable is created by the operator (`space
 *     up`) and only bound by its reader. The 2.9 form that puts the filter into the subject,
 *     $JS.API.CONSUMER.CREATE.<stream>.<durable>.<filter>, which the server checks against the
 *     request, is granted too, for a client that uses it.
 *   - deleting a durable (sp_bus_consumer_open recreates): $JS.API.CONSUMER.DELETE....
 *   - reading stored messages: $JS.API.STREAM.MSG.GET.<stream>, $JS.API.DIRECT.GET.<stream>.
 * Stream creation, update, purge and deletion ($JS.API.STREAM.*) are the operator's alone;
 * every other identity has them in its deny list too, which wins over any allow. Consumers'
 * filters are not checked against subscribe permissions by nats-server 2.9 (nats-server
 * issue #3295), which is why the durables are fixed per identity here.
 */
#include "natsauth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bus.h"
#include "checkpoint.h"
#include "error.h"
#include "ids.h"
#include "sign.h"
#include "xmalloc.h"

#define NKEY_PREFIX_SEED (18 << 3) /* 'S' */
#define NKEY_PREFIX_USER (20 << 3) /* 'U' */
#define RULES_MAX        128
#define RULE_MAX         256

/* CRC-16/XMODEM (polynomial 0x1021, initial 0), which NKeys append little-endian. */
static uint16_t crc16(const uint8_t *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

/* RFC 4648 base32, upper case, no padding. */
static void base32(const uint8_t *in, size_t n, char *out)
{
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        acc = (acc << 8) | in[i];
        bits += 8;
        while (bits >= 5) {
            out[o++] = alpha[(acc >> (bits - 5)) & 31];
            bits -= 5;
        }
    }
    if (bits > 0)
        out[o++] = alpha[(acc << (5 - bits)) & 31];
    out[o] = '\0';
}

void sp_nkey_encode(const uint8_t seed[32], char pub[SP_NKEY_PUB_LEN + 1],
                    char seed_text[SP_NKEY_SEED_LEN + 1])
{
    uint8_t raw[2 + 32 + 2], pk[32];
    size_t pklen = sizeof(pk);
    EVP_PKEY *k;
    uint16_t c;

    raw[0] = NKEY_PREFIX_SEED | (NKEY_PREFIX_USER >> 5);
    raw[1] = (NKEY_PREFIX_USER & 31) << 3;
    memcpy(raw + 2, seed, 32);
    c = crc16(raw, 34);
    raw[34] = (uint8_t)(c & 0xff);
    raw[35] = (uint8_t)(c >> 8);
    base32(raw, 36, seed_text);
    explicit_bzero(raw, sizeof(raw));

    k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32);
    if (!k || EVP_PKEY_get_raw_public_key(k, pk, &pklen) != 1)
        abort(); /* only out of memory makes OpenSSL fail here */
    EVP_PKEY_free(k);
    raw[0] = NKEY_PREFIX_USER;
    memcpy(raw + 1, pk, 32);
    c = crc16(raw, 33);
    raw[33] = (uint8_t)(c & 0xff);
    raw[34] = (uint8_t)(c >> 8);
    base32(raw, 35, pub);
}

/* RFC 4648 base32 decode (upper case, no padding) of exactly n bytes; -1 if malformed. */
static int unbase32(const char *in, uint8_t *out, size_t n)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;

    for (const char *p = in; *p && o < n; p++) {
        int v;
        if (*p >= 'A' && *p <= 'Z')
            v = *p - 'A';
        else if (*p >= '2' && *p <= '7')
            v = *p - '2' + 26;
        else
            return -1;
        acc = (acc << 5) | (uint32_t)v;
        bits += 5;
        if (bits >= 8) {
            out[o++] = (uint8_t)(acc >> (bits - 8));
            bits -= 8;
        }
    }
    return o == n ? 0 : -1;
}

int sp_nkey_seed_load(const char *seed_file, uint8_t seed[32])
{
    char text[SP_NKEY_SEED_LEN + 8];
    uint8_t raw[36];
    struct stat st;
    ssize_t n;
    int fd, rc = SP_ECONFIG;

    fd = open(seed_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0 || (st.st_mode & 077)) {
        close(fd);
        return -EPERM;
    }
    n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n < SP_NKEY_SEED_LEN)
        goto out;
    text[n] = '\0';
    text[strcspn(text, "\r\n")] = '\0';
    if (strlen(text) != SP_NKEY_SEED_LEN || unbase32(text, raw, sizeof(raw)) < 0)
        goto out;
    if (raw[0] != (NKEY_PREFIX_SEED | (NKEY_PREFIX_USER >> 5)) ||
        raw[1] != ((NKEY_PREFIX_USER & 31) << 3) ||
        crc16(raw, 34) != (uint16_t)(raw[34] | (raw[35] << 8)))
        goto out;
    memcpy(seed, raw + 2, 32);
    rc = 0;
out:
    explicit_bzero(text, sizeof(text));
    explicit_bzero(raw, sizeof(raw));
    return rc;
}

static int write_file(const char *path, const char *data, mode_t mode, bool exclusive)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC), mode);
    size_t n = strlen(data);
    ssize_t w;

    if (fd < 0)
        return -errno;
    w = write(fd, data, n);
    if (w < 0 || (size_t)w != n || close(fd) != 0) {
        unlink(path);
        return w < 0 ? -errno : -EIO;
    }
    return 0;
}

int sp_natsauth_creds_create(const char *dir, const char *identity)
{
    char pub[SP_NKEY_PUB_LEN + 1], seed_text[SP_NKEY_SEED_LEN + 1];
    char pub_line[SP_NKEY_PUB_LEN + 2], seed_line[SP_NKEY_SEED_LEN + 2];
    uint8_t seed[32];
    sp_identity_t id;
    char *nk, *nkpub, *key, *kpub;
    int rc;

    if (!dir || sp_identity_parse(identity, &id) < 0)
        return -EINVAL;
    nk = sp_xasprintf("%s/%s.nk", dir, identity);
    nkpub = sp_xasprintf("%s/%s.nkpub", dir, identity);
    key = sp_xasprintf("%s/%s.key", dir, identity);
    kpub = sp_xasprintf("%s/%s.pub", dir, identity);
    if (access(nk, F_OK) == 0 || access(key, F_OK) == 0) {
        rc = -EEXIST;
        goto out;
    }
    sp_random_bytes(seed, sizeof(seed));
    sp_nkey_encode(seed, pub, seed_text);
    explicit_bzero(seed, sizeof(seed));
    snprintf(seed_line, sizeof(seed_line), "%s\n", seed_text);
    snprintf(pub_line, sizeof(pub_line), "%s\n", pub);
    explicit_bzero(seed_text, sizeof(seed_text));
    rc = write_file(nk, seed_line, 0600, true);
    explicit_bzero(seed_line, sizeof(seed_line));
    if (rc == 0)
        rc = write_file(nkpub, pub_line, 0644, false);
    if (rc == 0)
        rc = sp_sign_keygen(key, kpub);
    if (rc < 0) {
        unlink(nk);
        unlink(nkpub);
    }
out:
    free(nk);
    free(nkpub);
    free(key);
    free(kpub);
    return rc;
}

int sp_natsauth_nkey_public(const char *dir, const char *identity, char pub[SP_NKEY_PUB_LEN + 1])
{
    char buf[SP_NKEY_PUB_LEN + 8];
    char *path;
    ssize_t n;
    int fd;

    if (!dir || !identity || !pub)
        return -EINVAL;
    path = sp_xasprintf("%s/%s.nkpub", dir, identity);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    if (fd < 0)
        return -errno;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n < SP_NKEY_PUB_LEN || buf[0] != 'U')
        return SP_ECONFIG;
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    if (strlen(buf) != SP_NKEY_PUB_LEN)
        return SP_ECONFIG;
    memcpy(pub, buf, SP_NKEY_PUB_LEN + 1);
    return 0;
}

void sp_natsauth_inbox(const char *identity, char out[SP_INBOX_MAX + 1])
{
    snprintf(out, SP_INBOX_MAX + 1, "_INBOX.%s", identity);
}

/* ---- permissions ---- */

typedef struct {
    char r[RULES_MAX][RULE_MAX];
    size_t n;
} rules_t;

static void add(rules_t *rs, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(rules_t *rs, const char *fmt, ...)
{
    char rule[RULE_MAX];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(rule, sizeof(rule), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(rule) || rs->n >= RULES_MAX)
        abort(); /* the tables are ours: a rule this long or this many is a bug */
    for (size_t i = 0; i < rs->n; i++)
        if (strcmp(rs->r[i], rule) == 0)
            return;
    memcpy(rs->r[rs->n++], rule, (size_t)n + 1);
}

/* A pattern with {worker} -> worker, {type} -> type (when given) and every other placeholder
 * -> "*". */
static void fill(char *out, size_t len, const char *pattern, const char *worker, const char *type)
{
    size_t o = 0;

    for (const char *p = pattern; *p && o + 1 < len;) {
        if (*p == '{') {
            const char *end = strchr(p, '}');
            const char *v = "*";
            if (strncmp(p, "{worker}", 8) == 0 && worker)
                v = worker;
            else if (strncmp(p, "{type}", 6) == 0 && type)
                v = type;
            o += (size_t)snprintf(out + o, len - o, "%s", v);
            p = end + 1;
        } else {
            out[o++] = *p++;
        }
    }
    out[o < len ? o : len - 1] = '\0';
}

/* Replaces "{worker}" in a durable name or filter by the instance. */
static void expand(char *out, size_t len, const char *s, const char *instance)
{
    fill(out, len, s, instance, NULL);
}

static void perms_for(const sp_identity_t *id, rules_t *pub, rules_t *sub, rules_t *deny,
                      bool *ret_responses)
{
    unsigned bit = SP_KIND_BIT(id->kind);
    const ProtobufCMessageDescriptor *d = &space__v1__envelope__descriptor;
    const char *own = id->instance[0] ? id->instance : NULL;
    char inbox[SP_INBOX_MAX + 1], s[RULE_MAX];
    const sp_consumer_def_t *cons;
    size_t ncons;

    *ret_responses = false;
    sp_natsauth_inbox(id->name, inbox);
    add(sub, "%s.>", inbox);

    /* Events: one rule per type the kind may emit, so a subject's type token (the last) is as
     * much a permission as its worker token. */
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        sp_event_type_t t = (sp_event_type_t)f->id;
        sp_subject_id_t sid;

        if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) || !(sp_event_emitters(t) & bit))
            continue;
        sid = sp_event_subject_id(t);
        /* A worker on its own subjects only; a platform only on the scheduler's ("_"), so its
         * intents meet the scheduler's checks before any worker sees them (contract.c). */
        fill(s, sizeof(s), sp_subject(sid)->pattern,
             id->kind == SP_KIND_WORKER     ? own
             : id->kind == SP_KIND_PLATFORM ? "_"
                                            : NULL,
             sp_event_type_name(t));
        add(pub, "%s", s);
    }
    /* The data plane. */
    for (unsigned i = 0; i < SP_SUBJ__COUNT; i++) {
        const sp_subject_t *sj = sp_subject((sp_subject_id_t)i);
        if (sj->stream)
            continue;
        if (sj->pub_any & bit) {
            fill(s, sizeof(s), sj->pattern, NULL, NULL);
            add(pub, "%s", s);
        } else if ((sj->pub_own & bit) && own) {
            fill(s, sizeof(s), sj->pattern, own, NULL);
            add(pub, "%s", s);
        }
        if (sj->sub_any & bit) {
            fill(s, sizeof(s), sj->pattern, NULL, NULL);
            add(sub, "%s", s);
        } else if ((sj->sub_own & bit) && own) {
            fill(s, sizeof(s), sj->pattern, own, NULL);
            add(sub, "%s", s);
        }
        if (sj->request && ((sj->sub_any | sj->sub_own) & bit))
            *ret_responses = true;
    }
    /* JetStream: every daemon checks that the stream exists (sp_bus_ensure_stream). */
    add(pub, "$JS.API.STREAM.INFO.%s", SP_BUS_STREAM);
    cons = sp_contract_consumers(&ncons);
    for (size_t i = 0; i < ncons; i++) {
        char dur[RULE_MAX], filt[RULE_MAX];
        if (cons[i].kind != id->kind)
            continue;
        expand(dur, sizeof(dur), cons[i].durable, own);
        expand(filt, sizeof(filt), cons[i].filter, own);
        add(pub, "$JS.API.CONSUMER.INFO.%s.%s", SP_BUS_STREAM, dur);
        /* Pull: the fetch. Kept for a pushed one too, which the server refuses fetches for
         * anyway, so that an event log of a build before it was pushed runs under this
         * configuration (a rolling upgrade; bench/run.sh --baseline-bin). Pushed: the answer
         * to the server's flow control. */
        add(pub, "$JS.API.CONSUMER.MSG.NEXT.%s.%s", SP_BUS_STREAM, dur);
        if (cons[i].pushed)
            add(pub, "$JS.FC.%s.%s.>", SP_BUS_STREAM, dur);
        add(pub, "$JS.ACK.%s.%s.>", SP_BUS_STREAM, dur);
        add(pub, "$JS.API.CONSUMER.CREATE.%s.%s.%s", SP_BUS_STREAM, dur, filt);
        if (strcmp(filt, SP_BUS_SUBJECTS) == 0)
            add(pub, "$JS.API.CONSUMER.DURABLE.CREATE.%s.%s", SP_BUS_STREAM, dur);
        if (cons[i].recreated)
            add(pub, "$JS.API.CONSUMER.DELETE.%s.%s", SP_BUS_STREAM, dur);
    }
    /* Checkpoints (docs/audit.md): the event log publishes them (SP_SUBJ_CKPT, above) and
     * checks their stream exists; readers (space-replay verify) read them back. */
    if (id->kind == SP_KIND_EVENTLOG || id->kind == SP_KIND_READER)
        add(pub, "$JS.API.STREAM.INFO.%s", SP_CKPT_STREAM);
    if (id->kind == SP_KIND_READER) {
        add(pub, "$JS.API.STREAM.MSG.GET.%s", SP_CKPT_STREAM);
        add(pub, "$JS.API.DIRECT.GET.%s", SP_CKPT_STREAM);
        add(pub, "$JS.API.DIRECT.GET.%s.>", SP_CKPT_STREAM);
    }
    if (id->kind == SP_KIND_GATEWAY || id->kind == SP_KIND_READER) {
        add(pub, "$JS.API.STREAM.MSG.GET.%s", SP_BUS_STREAM);
        add(pub, "$JS.API.DIRECT.GET.%s", SP_BUS_STREAM);
        add(pub, "$JS.API.DIRECT.GET.%s.>", SP_BUS_STREAM);
    }
    /* Snapshots (worker_snapstore.c): the shared bucket, which the operator creates. Chunks of
     * a replaced or deleted object are purged by subject, so workers need the bucket's purge,
     * which the deny list below must then leave out for them. */
    if (id->kind == SP_KIND_WORKER) {
        add(pub, "$O.%s.>", SP_SNAPSHOT_BUCKET);
        add(pub, "$JS.API.STREAM.INFO.OBJ_%s", SP_SNAPSHOT_BUCKET);
        add(pub, "$JS.API.STREAM.PURGE.OBJ_%s", SP_SNAPSHOT_BUCKET);
        add(pub, "$JS.API.STREAM.MSG.GET.OBJ_%s", SP_SNAPSHOT_BUCKET);
        add(pub, "$JS.API.DIRECT.GET.OBJ_%s", SP_SNAPSHOT_BUCKET);
        add(pub, "$JS.API.DIRECT.GET.OBJ_%s.>", SP_SNAPSHOT_BUCKET);
    }
    static const char *const mgmt[] = {"CREATE",     "UPDATE",   "DELETE", "PURGE",
                                       "MSG.DELETE", "SNAPSHOT", "RESTORE"};
    for (size_t i = 0; i < sizeof(mgmt) / sizeof(mgmt[0]); i++) {
        /* A worker's deny list names the event stream (and its other management calls are
         * refused anyway: nothing in its allow list grants them); everyone else's names all
         * streams. */
        if (id->kind == SP_KIND_WORKER && strcmp(mgmt[i], "PURGE") == 0)
            add(deny, "$JS.API.STREAM.%s.%s", mgmt[i], SP_BUS_STREAM);
        else
            add(deny, "$JS.API.STREAM.%s.>", mgmt[i]);
    }
}

static void put_list(sp_buf_t *b, const char *name, const rules_t *rs)
{
    sp_buf_printf(b, "%s: [", name);
    for (size_t i = 0; i < rs->n; i++) {
        sp_buf_puts(b, i ? ", " : "");
        /* Quoted: an unquoted $ starts a variable in nats-server's configuration syntax. The
         * rules hold no quote or backslash (they are made of ids and our literals). */
        sp_buf_printf(b, "\"%s\"", rs->r[i]);
    }
    sp_buf_puts(b, "]");
}

static bool nkey_ok(const char *k)
{
    if (!k || strlen(k) != SP_NKEY_PUB_LEN || k[0] != 'U')
        return false;
    for (const char *p = k; *p; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= '2' && *p <= '7')))
            return false;
    return true;
}

int sp_natsauth_write(sp_buf_t *out, const sp_natsauth_user_t *users, size_t n)
{
    sp_identity_t id;

    if (!out || (!users && n))
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (sp_identity_parse(users[i].identity, &id) < 0 || !nkey_ok(users[i].nkey))
            return -EINVAL;

    rules_t *pub = sp_xmalloc(sizeof(*pub)), *sub = sp_xmalloc(sizeof(*sub)),
            *deny = sp_xmalloc(sizeof(*deny));
    sp_buf_puts(out, "# Generated from the bus contract (lib/contract.c): edits are lost.\n"
                     "authorization {\n  users = [\n");
    for (size_t i = 0; i < n; i++) {
        bool responses = false;

        sp_identity_parse(users[i].identity, &id);
        sp_buf_printf(out, "    # %s\n    { nkey: \"%s\"\n      permissions: {\n", id.name,
                      users[i].nkey);
        if (id.kind == SP_KIND_OPERATOR) {
            sp_buf_puts(out, "        publish: { allow: [\">\"] }\n"
                             "        subscribe: { allow: [\">\"] }\n");
        } else {
            pub->n = sub->n = deny->n = 0;
            perms_for(&id, pub, sub, deny, &responses);
            sp_buf_puts(out, "        publish: { ");
            put_list(out, "allow", pub);
            sp_buf_puts(out, ", ");
            put_list(out, "deny", deny);
            sp_buf_puts(out, " }\n        subscribe: { ");
            put_list(out, "allow", sub);
            sp_buf_puts(out, " }\n");
            /* Answering a request: one reply to the reply subject of each message received,
             * within 2 minutes (nats-server's defaults for `true`, written out so that they
             * hold whatever the server's defaults become), instead of publish rights on every
             * inbox. Our longest answer comes within the requester's ~11 s. */
            if (responses)
                sp_buf_puts(out, "        allow_responses: { max: 1, expires: \"2m\" }\n");
        }
        sp_buf_puts(out, "      }\n    }\n");
    }
    sp_buf_puts(out, "  ]\n}\n");
    free(pub);
    free(sub);
    free(deny);
    return 0;
}
