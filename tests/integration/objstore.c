/* The NATS object store (objstore.h) against a real nats-server: round trips of sizes around
 * the chunk size, the ADR-20 layout on the wire (stream, subjects, ObjectInfo JSON, digest,
 * rollup), replacing and deleting (old chunks purged), reading an object another client wrote
 * with other chunk sizes, and a store that lies (wrong digest, missing chunks, oversized,
 * garbage) refused with the right error. Raw reads and writes go through cnats directly, as a
 * foreign client would. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>
#include <nats/nats.h>

#include "b64.h"
#include "buf.h"
#include "error.h"
#include "harness.h"
#include "hash.h"
#include "json.h"
#include "natsauth.h"
#include "objstore.h"
#include "xmalloc.h"

#define BUCKET "it-objects"

static sp_bus_t *bus;
static natsConnection *nc;
static jsCtx *js;

static int setup(void **state)
{
    sp_test_stack_load();
    bus = sp_test_bus();
    /* A plain cnats connection, as another NATS client would use the store: with the test
     * identity's NKey (no anonymous connection is accepted). */
    const char *id = sp_test_env("SPACE_TEST_IDENTITY"), *creds = sp_test_env("SPACE_CREDS_DIR");
    char pub[SP_NKEY_PUB_LEN + 1], seed[600];
    assert_int_equal(sp_natsauth_nkey_public(creds, id, pub), 0);
    snprintf(seed, sizeof(seed), "%s/%s.nk", creds, id);
    natsOptions *o = NULL;
    assert_int_equal(natsOptions_Create(&o), NATS_OK);
    assert_int_equal(natsOptions_SetURL(o, sp_test_env("SPACE_NATS_URL")), NATS_OK);
    assert_int_equal(natsOptions_SetNKeyFromSeed(o, pub, seed), NATS_OK);
    natsStatus s = NATS_ERR;
    /* Retried on a refusal as sp_bus_connect does (bus.c: cnats 3.4.1 now and then sends a
     * CONNECT without the nonce signature). */
    for (int i = 0; i < 4 && s != NATS_OK; i++)
        s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    assert_int_equal(s, NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(sp_obj_bucket_ensure(bus, BUCKET), 0);
    assert_int_equal(sp_obj_bucket_ensure(bus, BUCKET), 0); /* idempotent */
    return 0;
}

static int teardown(void **state)
{
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    sp_bus_free(bus);
    return 0;
}

/* A memory file holding len pseudo-random bytes (seeded), positioned at 0. */
static int memfile(size_t len, unsigned seed)
{
    int fd = memfd_create("obj", MFD_CLOEXEC);
    assert_true(fd >= 0);
    uint8_t *p = sp_xmalloc(len ? len : 1);
    uint32_t x = seed * 2654435761u + 1; /* xorshift: repeatable bytes, no libc rand() */
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)(x >> 11);
    }
    assert_int_equal(write(fd, p, len), (ssize_t)len);
    free(p);
    lseek(fd, 0, SEEK_SET);
    return fd;
}

/* The whole content of fd (heap) and its length. */
static uint8_t *slurp(int fd, size_t *ret_len)
{
    off_t end = lseek(fd, 0, SEEK_END);
    uint8_t *p = sp_xmalloc((size_t)end + 1);
    assert_int_equal(pread(fd, p, (size_t)end, 0), end);
    *ret_len = (size_t)end;
    return p;
}

static char *meta_subject(const char *name)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "$O." BUCKET ".M.");
    sp_b64url_encode(&b, (const uint8_t *)name, strlen(name));
    return sp_buf_take(&b);
}

/* The raw ObjectInfo message of name, as any client reads it. */
static sp_json_doc_t *raw_info(const char *name)
{
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    char *subject = meta_subject(name);
    assert_int_equal(js_GetLastMsg(&m, js, "OBJ_" BUCKET, subject, NULL, &jerr), NATS_OK);
    const char *rollup = NULL;
    assert_int_equal(natsMsgHeader_Get(m, "Nats-Rollup", &rollup), NATS_OK);
    assert_string_equal(rollup, "sub");
    sp_json_doc_t *doc = NULL;
    char err[SP_JSON_ERR_MAX];
    assert_int_equal(
        sp_json_parse(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), NULL, &doc, err), 0);
    natsMsg_Destroy(m);
    free(subject);
    return doc;
}

/* Messages stored on subject. */
static uint64_t stored_on(const char *subject)
{
    jsStreamInfo *si = NULL;
    jsOptions o;
    jsErrCode jerr = 0;
    jsOptions_Init(&o);
    o.Stream.Info.SubjectsFilter = subject;
    assert_int_equal(js_GetStreamInfo(&si, js, "OBJ_" BUCKET, &o, &jerr), NATS_OK);
    uint64_t n = 0;
    if (si->State.Subjects)
        for (int i = 0; i < si->State.Subjects->Count; i++)
            n += si->State.Subjects->List[i].Msgs;
    jsStreamInfo_Destroy(si);
    return n;
}

static void raw_publish(const char *subject, const void *data, size_t len)
{
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    assert_int_equal(js_Publish(&pa, js, subject, data, (int)len, NULL, &jerr), NATS_OK);
    jsPubAck_Destroy(pa);
}

static void test_round_trips(void **state)
{
    const size_t sizes[] = {0,
                            1,
                            SP_OBJ_CHUNK_BYTES - 1,
                            SP_OBJ_CHUNK_BYTES,
                            SP_OBJ_CHUNK_BYTES + 1,
                            3 * 1024 * 1024 + 17};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        char name[64];
        snprintf(name, sizeof(name), "round/%zu.bin", sizes[k]);
        int in = memfile(sizes[k], (unsigned)k + 1), out = memfd_create("out", MFD_CLOEXEC);
        sp_obj_info_t put, got;
        assert_int_equal(sp_obj_put(bus, BUCKET, name, in, &put), 0);
        assert_int_equal(put.size, sizes[k]);
        assert_int_equal(put.chunks, (sizes[k] + SP_OBJ_CHUNK_BYTES - 1) / SP_OBJ_CHUNK_BYTES);
        assert_int_equal(sp_obj_get(bus, BUCKET, name, UINT64_MAX, out, &got), 0);
        size_t a_len, b_len;
        uint8_t *a = slurp(in, &a_len), *b = slurp(out, &b_len);
        assert_int_equal(a_len, b_len);
        assert_memory_equal(a, b, a_len);
        uint8_t sha[SP_SHA256_LEN];
        sp_sha256(a, a_len, sha);
        assert_memory_equal(sha, got.sha256, SP_SHA256_LEN);
        free(a);
        free(b);
        close(in);
        close(out);
    }
}

/* What another client sees: the ADR-20 names and fields. */
static void test_layout(void **state)
{
    int in = memfile(600 * 1024, 7);
    sp_obj_info_t put;
    const char *name = "sbx/snap/checkpoint.img.zst";
    assert_int_equal(sp_obj_put(bus, BUCKET, name, in, &put), 0);
    sp_json_doc_t *doc = raw_info(name);
    const sp_json_t *root = sp_json_root(doc);
    assert_string_equal(sp_json_str(sp_json_get(root, "name"), NULL), name);
    assert_string_equal(sp_json_str(sp_json_get(root, "bucket"), NULL), BUCKET);
    assert_string_equal(sp_json_str(sp_json_get(root, "nuid"), NULL), put.nuid);
    int64_t v = 0;
    assert_int_equal(sp_json_int(sp_json_get(root, "size"), 0, INT64_MAX, &v), 0);
    assert_int_equal(v, 600 * 1024);
    assert_int_equal(sp_json_int(sp_json_get(root, "chunks"), 0, INT64_MAX, &v), 0);
    assert_int_equal(v, 3);
    size_t a_len;
    uint8_t *a = slurp(in, &a_len), sha[SP_SHA256_LEN];
    sp_sha256(a, a_len, sha);
    sp_buf_t want;
    sp_buf_init(&want);
    sp_buf_puts(&want, "SHA-256=");
    sp_b64url_encode(&want, sha, SP_SHA256_LEN);
    sp_buf_putc(&want, '\0');
    assert_string_equal(sp_json_str(sp_json_get(root, "digest"), NULL), want.data);
    sp_buf_dispose(&want);
    free(a);
    sp_json_doc_free(doc);
    char chunks[128];
    snprintf(chunks, sizeof(chunks), "$O." BUCKET ".C.%s", put.nuid);
    assert_int_equal(stored_on(chunks), 3);
    close(in);
}

static void test_replace_and_delete(void **state)
{
    const char *name = "replaced";
    int first = memfile(400 * 1024, 11), second = memfile(1000, 12);
    sp_obj_info_t a, b;
    assert_int_equal(sp_obj_put(bus, BUCKET, name, first, &a), 0);
    assert_int_equal(sp_obj_put(bus, BUCKET, name, second, &b), 0);
    assert_string_not_equal(a.nuid, b.nuid);
    char old_chunks[128], new_chunks[128], *meta = meta_subject(name);
    snprintf(old_chunks, sizeof(old_chunks), "$O." BUCKET ".C.%s", a.nuid);
    snprintf(new_chunks, sizeof(new_chunks), "$O." BUCKET ".C.%s", b.nuid);
    assert_int_equal(stored_on(old_chunks), 0); /* purged */
    assert_int_equal(stored_on(new_chunks), 1);
    assert_int_equal(stored_on(meta), 1); /* rolled up */
    int out = memfd_create("out", MFD_CLOEXEC);
    assert_int_equal(sp_obj_get(bus, BUCKET, name, UINT64_MAX, out, NULL), 0);
    assert_int_equal(lseek(out, 0, SEEK_END), 1000);
    close(out);

    assert_int_equal(sp_obj_delete(bus, BUCKET, name), 0);
    assert_int_equal(sp_obj_stat(bus, BUCKET, name, NULL), SP_ENOTFOUND);
    out = memfd_create("out", MFD_CLOEXEC);
    assert_int_equal(sp_obj_get(bus, BUCKET, name, UINT64_MAX, out, NULL), SP_ENOTFOUND);
    close(out);
    assert_int_equal(sp_obj_delete(bus, BUCKET, name), SP_ENOTFOUND);
    assert_int_equal(stored_on(new_chunks), 0);
    sp_json_doc_t *doc = raw_info(name);
    bool deleted = false;
    assert_int_equal(sp_json_bool(sp_json_get(sp_json_root(doc), "deleted"), &deleted), 0);
    assert_true(deleted);
    sp_json_doc_free(doc);
    free(meta);
    close(first);
    close(second);
}

/* An object as another client writes it: 100-byte chunks, its own nuid, no options. */
static void foreign_put(const char *name, const char *nuid, const uint8_t *data, size_t len,
                        const char *digest_override, int chunks_override)
{
    char chunk_subject[128];
    snprintf(chunk_subject, sizeof(chunk_subject), "$O." BUCKET ".C.%s", nuid);
    int chunks = 0;
    for (size_t off = 0; off < len; off += 100, chunks++)
        raw_publish(chunk_subject, data + off, len - off < 100 ? len - off : 100);
    uint8_t sha[SP_SHA256_LEN];
    sp_sha256(data, len, sha);
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_printf(&b,
                  "{\"name\":\"%s\",\"bucket\":\"" BUCKET "\",\"nuid\":\"%s\",\"size\":%zu,"
                  "\"chunks\":%d,\"digest\":\"",
                  name, nuid, len, chunks_override >= 0 ? chunks_override : chunks);
    if (digest_override)
        sp_buf_puts(&b, digest_override);
    else {
        sp_buf_puts(&b, "SHA-256=");
        sp_b64url_encode(&b, sha, SP_SHA256_LEN);
    }
    sp_buf_puts(&b, "\"}");
    char *meta = meta_subject(name);
    raw_publish(meta, b.data, b.len);
    free(meta);
    sp_buf_dispose(&b);
}

static void test_foreign_object(void **state)
{
    uint8_t data[1234];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7);
    foreign_put("foreign", "ForeignNuid0000000001", data, sizeof(data), NULL, -1);
    int out = memfd_create("out", MFD_CLOEXEC);
    sp_obj_info_t info;
    assert_int_equal(sp_obj_get(bus, BUCKET, "foreign", UINT64_MAX, out, &info), 0);
    assert_int_equal(info.chunks, 13);
    size_t len;
    uint8_t *got = slurp(out, &len);
    assert_int_equal(len, sizeof(data));
    assert_memory_equal(got, data, len);
    free(got);
    close(out);
}

static void test_lying_store(void **state)
{
    uint8_t data[1000];
    memset(data, 'x', sizeof(data));
    int out = memfd_create("out", MFD_CLOEXEC);
    /* The digest of other bytes. */
    foreign_put("lie-digest", "LieNuid00000000000001", data, sizeof(data),
                "SHA-256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU=", -1);
    assert_int_equal(sp_obj_get(bus, BUCKET, "lie-digest", UINT64_MAX, out, NULL), -EBADMSG);
    /* More chunks promised than stored. */
    foreign_put("lie-chunks", "LieNuid00000000000002", data, sizeof(data), NULL, 11);
    assert_int_equal(sp_obj_get(bus, BUCKET, "lie-chunks", UINT64_MAX, out, NULL), -EBADMSG);
    /* Larger than the caller takes: refused before a byte is read. */
    foreign_put("too-big", "LieNuid00000000000003", data, sizeof(data), NULL, -1);
    off_t before = lseek(out, 0, SEEK_END);
    assert_int_equal(sp_obj_get(bus, BUCKET, "too-big", 999, out, NULL), SP_ETOOBIG);
    assert_int_equal(lseek(out, 0, SEEK_END), before);
    /* Not JSON, a digest that is not SHA-256, a name that is not the object's. */
    const char *bad[] = {
        "{not json",
        "{\"name\":\"garbage\",\"nuid\":\"N1\",\"size\":1,\"chunks\":1,\"digest\":\"MD5=abc\"}",
        "{\"name\":\"other\",\"nuid\":\"N1\",\"size\":1,\"chunks\":1,\"digest\":\"SHA-256="
        "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU=\"}",
        "{\"name\":\"garbage\",\"nuid\":\"../x\",\"size\":1,\"chunks\":1,\"digest\":\"SHA-256="
        "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU=\"}",
        "{\"name\":\"garbage\",\"nuid\":\"N1\",\"size\":-1,\"chunks\":1,\"digest\":\"SHA-256="
        "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU=\"}",
    };
    char *meta = meta_subject("garbage");
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        raw_publish(meta, bad[i], strlen(bad[i]));
        assert_int_equal(sp_obj_stat(bus, BUCKET, "garbage", NULL), -EBADMSG);
    }
    free(meta);
    /* Names and buckets we refuse to form subjects from. */
    assert_int_equal(sp_obj_stat(bus, "bad.bucket", "x", NULL), -EINVAL);
    assert_int_equal(sp_obj_stat(bus, BUCKET, "", NULL), -EINVAL);
    assert_int_equal(sp_obj_stat(bus, BUCKET, "with space", NULL), -EINVAL);
    assert_int_equal(sp_obj_bucket_ensure(bus, "a*b"), -EINVAL);
    assert_int_equal(sp_obj_stat(bus, BUCKET, "never-stored", NULL), SP_ENOTFOUND);
    close(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_replace_and_delete), cmocka_unit_test(test_foreign_object),
        cmocka_unit_test(test_lying_store),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
