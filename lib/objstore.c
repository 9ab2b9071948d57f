/* The NATS object store (objstore.h), ADR-20 layout.
 *
 * Put: the chunks go to a fresh $O.B.C.<nuid>, then the ObjectInfo to $O.B.M.<name> with
 * Nats-Rollup: sub, which makes the server drop every older ObjectInfo of that name in the
 * same write; only then are the older object's chunks purged. A reader therefore always finds
 * an ObjectInfo whose chunks are all stored, and a put that fails half-way leaves the older
 * object readable (its partial chunks are purged, best effort).
 *
 * Get: the ObjectInfo by direct get of the last message on its subject, then the chunks one
 * direct get each (the next message on $O.B.C.<nuid> after the previous one's sequence), so a
 * read holds one chunk in memory and needs no consumer on the server.
 */
#include "objstore.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "b64.h"
#include "buf.h"
#include "bus_int.h"
#include "error.h"
#include "fdio.h"
#include "json.h"
#include "xmalloc.h"

#define INFO_MAX_BYTES (64 * 1024)
#define DIGEST_PREFIX  "SHA-256="

bool sp_obj_bucket_valid(const char *bucket)
{
    size_t n = bucket ? strlen(bucket) : 0;
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = bucket[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return false;
    }
    return true;
}

/* Names are free-form in ADR-20; ours are also log-safe: printable ASCII only. */
static bool name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > SP_OBJ_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x21 || (unsigned char)name[i] > 0x7e)
            return false;
    return true;
}

static char *stream_name(const char *bucket)
{
    return sp_xasprintf("OBJ_%s", bucket);
}

static char *meta_subject(const char *bucket, const char *name)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_printf(&b, "$O.%s.M.", bucket);
    sp_b64url_encode(&b, (const uint8_t *)name, strlen(name));
    return sp_buf_take(&b);
}

static char *chunk_subject(const char *bucket, const char *nuid)
{
    return sp_xasprintf("$O.%s.C.%s", bucket, nuid);
}

static void nuid_new(char out[SP_OBJ_NUID_LEN + 1])
{
    static const char digits[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    uint8_t r[SP_OBJ_NUID_LEN];
    size_t got = 0;
    while (got < sizeof(r)) {
        ssize_t n = getrandom(r + got, sizeof(r) - got, 0);
        if (n > 0)
            got += (size_t)n;
        else if (n < 0 && errno != EINTR)
            abort(); /* no kernel randomness: nothing sensible to go on with */
    }
    for (size_t i = 0; i < SP_OBJ_NUID_LEN; i++)
        out[i] = digits[r[i] % 62];
    out[SP_OBJ_NUID_LEN] = '\0';
}

int sp_obj_bucket_ensure(sp_bus_t *bus, const char *bucket)
{
    if (!sp_obj_bucket_valid(bucket))
        return -EINVAL;
    char *stream = stream_name(bucket);
    char *chunks = sp_xasprintf("$O.%s.C.>", bucket), *metas = sp_xasprintf("$O.%s.M.>", bucket);
    const char *subjects[2] = {chunks, metas};
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    int rc;
    natsStatus s = js_GetStreamInfo(&si, bus->js, stream, NULL, &jerr);
    jsStreamInfo_Destroy(si);
    si = NULL;
    if (s == NATS_OK) {
        rc = 0;
        goto out;
    }
    if (s != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr) {
        rc = sp__bus_status(s, jerr, "js_GetStreamInfo");
        goto out;
    }
    jsStreamConfig cfg;
    jsStreamConfig_Init(&cfg);
    cfg.Name = stream;
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 2;
    cfg.Storage = js_FileStorage;
    cfg.Replicas = bus->stream_replicas;
    cfg.Discard = js_DiscardNew;
    cfg.AllowRollup = true;
    cfg.AllowDirect = true;
    jerr = 0;
    s = js_AddStream(&si, bus->js, &cfg, NULL, &jerr);
    jsStreamInfo_Destroy(si);
    rc = s != NATS_OK && jerr == JSStreamNameExistErr ? 0 : sp__bus_status(s, jerr, "js_AddStream");
out:
    free(stream);
    free(chunks);
    free(metas);
    return rc;
}

static int purge_subject(sp_bus_t *bus, const char *stream, const char *subject)
{
    jsOptions o;
    jsErrCode jerr = 0;
    jsOptions_Init(&o);
    o.Stream.Purge.Subject = subject;
    return sp__bus_status(js_PurgeStream(bus->js, stream, &o, &jerr), jerr, "js_PurgeStream");
}

/* An ObjectInfo from the server: strict, bounded, and describing name. */
static int parse_info(const char *data, size_t len, const char *name, sp_obj_info_t *info,
                      bool *ret_deleted)
{
    sp_json_limits_t lim = {.max_bytes = INFO_MAX_BYTES, .max_depth = 8, .max_nodes = 1000};
    sp_json_doc_t *doc = NULL;
    char jerr[SP_JSON_ERR_MAX];
    if (sp_json_parse(data, len, &lim, &doc, jerr) < 0)
        return -EBADMSG;
    const sp_json_t *root = sp_json_root(doc);
    const char *got_name = sp_json_str(sp_json_get(root, "name"), NULL);
    size_t nuid_len = 0, digest_len = 0;
    const char *nuid = sp_json_str(sp_json_get(root, "nuid"), &nuid_len);
    const char *digest = sp_json_str(sp_json_get(root, "digest"), &digest_len);
    int64_t size = 0, chunks = 0;
    bool deleted = false;
    int rc = -EBADMSG;
    const sp_json_t *d = sp_json_get(root, "deleted");
    if (d && sp_json_bool(d, &deleted) < 0)
        goto out;
    if (!got_name || strcmp(got_name, name) != 0 || !nuid || nuid_len == 0 ||
        nuid_len > SP_OBJ_NUID_LEN * 2 || nuid_len >= sizeof(info->nuid) ||
        sp_json_int(sp_json_get(root, "size"), 0, INT64_MAX, &size) < 0 ||
        sp_json_int(sp_json_get(root, "chunks"), 0, UINT32_MAX, &chunks) < 0)
        goto out;
    for (size_t i = 0; i < nuid_len; i++)
        if (!((nuid[i] >= '0' && nuid[i] <= '9') || (nuid[i] >= 'A' && nuid[i] <= 'Z') ||
              (nuid[i] >= 'a' && nuid[i] <= 'z')))
            goto out;
    memset(info, 0, sizeof(*info));
    memcpy(info->nuid, nuid, nuid_len);
    info->size = (uint64_t)size;
    info->chunks = (uint32_t)chunks;
    if (!deleted) {
        size_t plen = strlen(DIGEST_PREFIX);
        uint8_t *sha = NULL;
        size_t sha_len = 0;
        if (!digest || digest_len <= plen || strncmp(digest, DIGEST_PREFIX, plen) != 0 ||
            sp_b64url_decode(digest + plen, digest_len - plen, &sha, &sha_len) < 0)
            goto out;
        if (sha_len == SP_SHA256_LEN)
            memcpy(info->sha256, sha, SP_SHA256_LEN);
        free(sha);
        if (sha_len != SP_SHA256_LEN)
            goto out;
    }
    *ret_deleted = deleted;
    rc = 0;
out:
    sp_json_doc_free(doc);
    return rc;
}

/* The newest ObjectInfo of name, deleted ones included (*ret_deleted). */
static int stat_any(sp_bus_t *bus, const char *bucket, const char *name, sp_obj_info_t *ret_info,
                    bool *ret_deleted)
{
    if (!sp_obj_bucket_valid(bucket) || !name_valid(name))
        return -EINVAL;
    char *stream = stream_name(bucket), *subject = meta_subject(bucket, name);
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetLastMsg(&m, bus->js, stream, subject, NULL, &jerr);
    int rc = sp__bus_status(s, jerr, "js_GetLastMsg");
    if (rc == 0) {
        int len = natsMsg_GetDataLength(m);
        rc = len < 0 || len > INFO_MAX_BYTES
                 ? -EBADMSG
                 : parse_info(natsMsg_GetData(m), (size_t)len, name, ret_info, ret_deleted);
    }
    natsMsg_Destroy(m);
    free(stream);
    free(subject);
    return rc;
}

int sp_obj_stat(sp_bus_t *bus, const char *bucket, const char *name, sp_obj_info_t *ret_info)
{
    sp_obj_info_t info;
    bool deleted = false;
    int rc = stat_any(bus, bucket, name, &info, &deleted);
    if (rc < 0)
        return rc;
    if (deleted)
        return SP_ENOTFOUND;
    if (ret_info)
        *ret_info = info;
    return 0;
}

/* Publishes an ObjectInfo that replaces every older one of its name. */
static int publish_info(sp_bus_t *bus, const char *bucket, const char *name,
                        const sp_obj_info_t *info, bool deleted)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"name\":");
    sp_buf_json_str(&b, name);
    sp_buf_printf(&b, ",\"bucket\":\"%s\",\"nuid\":\"%s\",\"size\":%llu,\"chunks\":%u", bucket,
                  info->nuid, (unsigned long long)info->size, info->chunks);
    if (deleted) {
        sp_buf_puts(&b, ",\"deleted\":true}");
    } else {
        sp_buf_printf(&b, ",\"digest\":\"" DIGEST_PREFIX);
        sp_b64url_encode(&b, info->sha256, SP_SHA256_LEN);
        sp_buf_printf(&b, "\",\"options\":{\"max_chunk_size\":%d}}", SP_OBJ_CHUNK_BYTES);
    }
    char *subject = meta_subject(bucket, name);
    natsMsg *m = NULL;
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    natsStatus s = natsMsg_Create(&m, subject, NULL, b.data, (int)b.len);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Nats-Rollup", "sub");
    if (s == NATS_OK)
        s = js_PublishMsg(&pa, bus->js, m, NULL, &jerr);
    int rc = sp__bus_status(s, jerr, "js_PublishMsg");
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
    free(subject);
    sp_buf_dispose(&b);
    return rc;
}

int sp_obj_put(sp_bus_t *bus, const char *bucket, const char *name, int fd, sp_obj_info_t *ret_info)
{
    sp_obj_info_t old, info = {0};
    bool old_deleted = false;
    int rc = stat_any(bus, bucket, name, &old, &old_deleted);
    bool had_old = rc == 0;
    if (rc < 0 && rc != SP_ENOTFOUND)
        return rc;
    nuid_new(info.nuid);
    char *stream = stream_name(bucket), *subject = chunk_subject(bucket, info.nuid);
    uint8_t *buf = sp_xmalloc(SP_OBJ_CHUNK_BYTES);
    sp_sha256_ctx_t *sha = sp_sha256_new();
    rc = 0;
    for (;;) {
        ssize_t n = sp_read_full(fd, buf, SP_OBJ_CHUNK_BYTES);
        if (n < 0) {
            rc = (int)n;
            break;
        }
        if (n == 0)
            break;
        jsPubAck *pa = NULL;
        jsErrCode jerr = 0;
        natsStatus s = js_Publish(&pa, bus->js, subject, buf, (int)n, NULL, &jerr);
        jsPubAck_Destroy(pa);
        if ((rc = sp__bus_status(s, jerr, "js_Publish")) < 0)
            break;
        sp_sha256_update(sha, buf, (size_t)n);
        info.size += (uint64_t)n;
        info.chunks++;
        if (n < SP_OBJ_CHUNK_BYTES)
            break;
    }
    sp_sha256_final(sha, info.sha256);
    free(buf);
    if (rc == 0)
        rc = publish_info(bus, bucket, name, &info, false);
    if (rc < 0)
        (void)purge_subject(bus, stream, subject); /* the partial object, best effort */
    else if (had_old && strcmp(old.nuid, info.nuid) != 0) {
        char *old_subject = chunk_subject(bucket, old.nuid);
        (void)purge_subject(bus, stream, old_subject); /* unreachable already: best effort */
        free(old_subject);
    }
    if (rc == 0 && ret_info)
        *ret_info = info;
    free(stream);
    free(subject);
    return rc;
}

int sp_obj_get(sp_bus_t *bus, const char *bucket, const char *name, uint64_t max_size, int fd,
               sp_obj_info_t *ret_info)
{
    sp_obj_info_t info;
    int rc = sp_obj_stat(bus, bucket, name, &info);
    if (rc < 0)
        return rc;
    if (info.size > max_size)
        return SP_ETOOBIG;
    char *stream = stream_name(bucket), *subject = chunk_subject(bucket, info.nuid);
    sp_sha256_ctx_t *sha = sp_sha256_new();
    uint64_t got = 0, seq = 1;
    for (uint32_t i = 0; i < info.chunks && rc == 0; i++) {
        jsDirectGetMsgOptions dg;
        jsDirectGetMsgOptions_Init(&dg);
        dg.Sequence = seq;
        dg.NextBySubject = subject;
        natsMsg *m = NULL;
        natsStatus s = js_DirectGetMsg(&m, bus->js, stream, NULL, &dg);
        rc = sp__bus_status(s, 0, "js_DirectGetMsg");
        if (rc == SP_ENOTFOUND)
            rc = -EBADMSG; /* the ObjectInfo promises more chunks than are stored */
        const char *seq_s = NULL;
        if (rc == 0 && (natsMsgHeader_Get(m, "Nats-Sequence", &seq_s) != NATS_OK || !seq_s))
            rc = -EBADMSG;
        if (rc == 0) {
            char *end = NULL;
            unsigned long long at = strtoull(seq_s, &end, 10);
            int len = natsMsg_GetDataLength(m);
            if (!end || *end || at < seq || len < 0 || (uint64_t)len > info.size - got)
                rc = -EBADMSG;
            else {
                seq = (uint64_t)at + 1;
                got += (uint64_t)len;
                sp_sha256_update(sha, natsMsg_GetData(m), (size_t)len);
                rc = sp_write_all(fd, natsMsg_GetData(m), (size_t)len);
            }
        }
        natsMsg_Destroy(m);
    }
    uint8_t digest[SP_SHA256_LEN];
    sp_sha256_final(sha, digest);
    if (rc == 0 && (got != info.size || memcmp(digest, info.sha256, SP_SHA256_LEN) != 0))
        rc = -EBADMSG;
    if (rc == 0 && ret_info)
        *ret_info = info;
    free(stream);
    free(subject);
    return rc;
}

int sp_obj_delete(sp_bus_t *bus, const char *bucket, const char *name)
{
    sp_obj_info_t info;
    int rc = sp_obj_stat(bus, bucket, name, &info);
    if (rc < 0)
        return rc;
    sp_obj_info_t gone = {0};
    memcpy(gone.nuid, info.nuid, sizeof(gone.nuid));
    if ((rc = publish_info(bus, bucket, name, &gone, true)) < 0)
        return rc;
    char *stream = stream_name(bucket), *subject = chunk_subject(bucket, info.nuid);
    rc = purge_subject(bus, stream, subject);
    free(stream);
    free(subject);
    return rc;
}

int sp_obj_list(sp_bus_t *bus, const char *bucket, sp_obj_list_cb cb, void *arg)
{
    if (!sp_obj_bucket_valid(bucket))
        return -EINVAL;
    char *stream = stream_name(bucket), *filter = sp_xasprintf("$O.%s.M.>", bucket);
    size_t prefix = strlen(filter) - 1;
    jsStreamInfo *si = NULL;
    jsOptions o;
    jsErrCode jerr = 0;
    jsOptions_Init(&o);
    o.Stream.Info.SubjectsFilter = filter;
    int rc =
        sp__bus_status(js_GetStreamInfo(&si, bus->js, stream, &o, &jerr), jerr, "js_GetStreamInfo");
    const jsStreamStateSubjects *subs = rc == 0 ? si->State.Subjects : NULL;
    for (int i = 0; subs && i < subs->Count && rc == 0; i++) {
        const char *enc = subs->List[i].Subject;
        uint8_t *name = NULL;
        size_t len = 0;
        if (strlen(enc) <= prefix ||
            sp_b64url_decode(enc + prefix, strlen(enc + prefix), &name, &len) < 0)
            continue;
        char *z = sp_xmalloc(len + 1);
        memcpy(z, name, len);
        z[len] = '\0';
        free(name);
        if (strlen(z) == len && name_valid(z) && sp_obj_stat(bus, bucket, z, NULL) == 0)
            rc = cb(arg, z);
        free(z);
    }
    jsStreamInfo_Destroy(si);
    free(filter);
    free(stream);
    return rc;
}
