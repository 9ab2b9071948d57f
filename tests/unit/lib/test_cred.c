/* Credentials (cred.h): sealing (tamper, wrong key and moved ciphertext all fail), the master
 * key file's checks, the syntax of names, values and host entries; and the head rewrite that
 * injects them (egress_parse.h, sp_http_head_rewrite). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cred.h"
#include "egress_parse.h"

static void key_of(sp_cred_key_t *k, uint8_t fill)
{
    memset(k, 0, sizeof(*k));
    memset(k->k, fill, sizeof(k->k));
}

static void test_seal_open(void **state)
{
    (void)state;
    sp_cred_key_t k, other;
    key_of(&k, 1);
    key_of(&other, 2);
    const uint8_t pt[] = "ghp_secretvalue";
    uint8_t aad[96], aad2[96], nonce[SP_CRED_NONCE_LEN], ct[64], out[64];
    size_t al = sp_cred_aad("crd_a", 1, aad);
    assert_int_equal(sp_cred_seal(&k, aad, al, pt, sizeof(pt) - 1, nonce, ct), 0);
    size_t cl = sizeof(pt) - 1 + SP_CRED_TAG_LEN;
    assert_null(memmem(ct, cl, "secret", 6));
    assert_int_equal(sp_cred_open(&k, aad, al, nonce, ct, cl, out), 0);
    assert_memory_equal(out, pt, sizeof(pt) - 1);
    /* Wrong key. */
    assert_int_equal(sp_cred_open(&other, aad, al, nonce, ct, cl, out), -EBADMSG);
    /* Another id, another version: the additional data differs. */
    size_t al2 = sp_cred_aad("crd_b", 1, aad2);
    assert_int_equal(sp_cred_open(&k, aad2, al2, nonce, ct, cl, out), -EBADMSG);
    al2 = sp_cred_aad("crd_a", 2, aad2);
    assert_int_equal(sp_cred_open(&k, aad2, al2, nonce, ct, cl, out), -EBADMSG);
    /* Every bit of ciphertext, tag and nonce matters. */
    for (size_t i = 0; i < cl; i++) {
        ct[i] ^= 0x40;
        assert_int_equal(sp_cred_open(&k, aad, al, nonce, ct, cl, out), -EBADMSG);
        ct[i] ^= 0x40;
    }
    nonce[3] ^= 1;
    assert_int_equal(sp_cred_open(&k, aad, al, nonce, ct, cl, out), -EBADMSG);
    nonce[3] ^= 1;
    assert_int_equal(sp_cred_open(&k, aad, al, nonce, ct, cl - 1, out), -EBADMSG);
    assert_int_equal(sp_cred_open(&k, aad, al, nonce, ct, 3, out), -EBADMSG);
    /* Two seals of the same value differ (fresh nonce). */
    uint8_t nonce2[SP_CRED_NONCE_LEN], ct2[64];
    assert_int_equal(sp_cred_seal(&k, aad, al, pt, sizeof(pt) - 1, nonce2, ct2), 0);
    assert_memory_not_equal(nonce, nonce2, SP_CRED_NONCE_LEN);
}

static void test_key_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_cred_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/master.key", dir);
    assert_int_equal(sp_cred_key_create(path), 0);
    assert_int_equal(sp_cred_key_create(path), -EEXIST);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 32);
    sp_cred_key_t k, k2;
    assert_int_equal(sp_cred_key_load(path, &k), 0);
    assert_int_equal(strlen(k.id), SP_CRED_KEY_ID_LEN);
    assert_int_equal(sp_cred_key_load(path, &k2), 0);
    assert_string_equal(k.id, k2.id);
    chmod(path, 0644);
    assert_int_equal(sp_cred_key_load(path, &k2), -EPERM);
    chmod(path, 0600);
    FILE *f = fopen(path, "a");
    fputc('x', f);
    fclose(f);
    assert_int_equal(sp_cred_key_load(path, &k2), -EINVAL);
    unlink(path);
    assert_int_equal(sp_cred_key_load(path, &k2), -ENOENT);
    rmdir(dir);
}

static void test_syntax(void **state)
{
    (void)state;
    assert_true(sp_cred_name_valid("github", 6));
    assert_true(sp_cred_name_valid("GH_token.v2-x", 13));
    assert_false(sp_cred_name_valid("", 0));
    assert_false(sp_cred_name_valid("-x", 2));
    assert_false(sp_cred_name_valid("a b", 3));
    assert_false(sp_cred_name_valid("a:b", 3));
    assert_true(sp_cred_value_valid((const uint8_t *)"abc def", 7));
    assert_false(sp_cred_value_valid((const uint8_t *)"abc\r\nX-Evil: 1", 15));
    assert_false(sp_cred_value_valid((const uint8_t *)"abc\n", 4));
    assert_false(sp_cred_value_valid((const uint8_t *)"a\0b", 3));
    assert_false(sp_cred_value_valid((const uint8_t *)" a", 2));
    assert_false(sp_cred_value_valid((const uint8_t *)"\xc3\xa9", 2));
    assert_true(sp_cred_header_name_valid("X-Api-Key"));
    assert_false(sp_cred_header_name_valid("X Api"));
    assert_false(sp_cred_header_name_valid("X:Api"));
    assert_true(sp_cred_user_valid("alice"));
    assert_false(sp_cred_user_valid("al:ice"));

    sp_cred_host_t h;
    assert_int_equal(sp_cred_host_parse("api.test", &h), 0);
    assert_true(sp_cred_host_covers(&h, "api.test"));
    assert_false(sp_cred_host_covers(&h, "x.api.test"));
    assert_true(sp_cred_host_allows(&h, "DELETE", "/", 1));
    assert_int_equal(sp_cred_host_parse("*.api.test", &h), 0);
    assert_true(sp_cred_host_covers(&h, "x.api.test"));
    assert_false(sp_cred_host_covers(&h, "api.test"));
    assert_false(sp_cred_host_covers(&h, "xapi.test"));
    assert_int_equal(sp_cred_host_parse("GET,POST api.test/v1/", &h), 0);
    assert_int_equal(h.n_methods, 2);
    assert_true(sp_cred_host_allows(&h, "POST", "/v1/x", 5));
    assert_false(sp_cred_host_allows(&h, "PUT", "/v1/x", 5));
    assert_false(sp_cred_host_allows(&h, "GET", "/v2/x", 5));
    assert_int_equal(sp_cred_host_parse("get api.test", &h), -EINVAL);
    assert_int_equal(sp_cred_host_parse("GET, api.test", &h), -EINVAL);
    assert_int_equal(sp_cred_host_parse("API.test", &h), -EINVAL);
    assert_int_equal(sp_cred_host_parse("api.test/x?y", &h), -EINVAL);
    assert_int_equal(sp_cred_host_parse("", &h), -EINVAL);
    assert_int_equal(sp_cred_host_parse("*.", &h), -EINVAL);
    assert_int_equal(sp_cred_scope_rank("sandbox"), 0);
    assert_int_equal(sp_cred_scope_rank("tenant"), 2);
    assert_int_equal(sp_cred_scope_rank("x"), -1);
}

/* Parses head, rewrites it, returns the result (static) or NULL when refused. */
static const char *rewrite(const char *head, const sp_head_edit_t *e, size_t ne,
                           const sp_head_subst_t *s, size_t ns, uint32_t *used)
{
    static char out[4096];
    sp_http_head_t hh;
    const char *why = NULL;
    assert_int_equal(sp_http_request_head((const uint8_t *)head, strlen(head), &hh, &why), 0);
    long n = sp_http_head_rewrite((const uint8_t *)head, &hh, e, ne, s, ns, (uint8_t *)out, 4, used,
                                  &why);
    if (n < 0) {
        assert_string_equal(why, "credential_scope");
        return NULL;
    }
    assert_true(n > 4); /* too small a buffer: the length needed */
    long m = sp_http_head_rewrite((const uint8_t *)head, &hh, e, ne, s, ns, (uint8_t *)out,
                                  sizeof(out) - 1, used, &why);
    assert_int_equal(m, n);
    out[m] = '\0';
    /* The result is itself a valid head. */
    sp_http_head_t h2;
    assert_int_equal(sp_http_request_head((const uint8_t *)out, (size_t)m, &h2, &why), 0);
    return out;
}

static void test_rewrite(void **state)
{
    (void)state;
    const uint8_t tok[] = "Bearer T0K";
    sp_head_edit_t auth = {.header = "Authorization", .value = tok, .value_len = 10};
    uint32_t used = 0;
    /* The guest's own Authorization (any case, twice) is dropped, ours added. */
    const char *r = rewrite("GET /x HTTP/1.1\r\nHost: api.test\r\nauthorization: mine\r\n"
                            "AUTHORIZATION: again\r\nAccept: */*\r\n\r\n",
                            &auth, 1, NULL, 0, &used);
    assert_string_equal(r, "GET /x HTTP/1.1\r\nHost: api.test\r\nAccept: */*\r\n"
                           "Authorization: Bearer T0K\r\n\r\n");
    /* A query parameter: the guest's of that name dropped, ours appended, encoded. */
    const uint8_t qv[] = "a b&c";
    sp_head_edit_t q = {.param = "key", .value = qv, .value_len = 5};
    r = rewrite("GET /p?key=guest&x=1&keyx=2 HTTP/1.1\r\nHost: api.test\r\n\r\n", &q, 1, NULL, 0,
                &used);
    assert_string_equal(r, "GET /p?x=1&keyx=2&key=a%20b%26c HTTP/1.1\r\nHost: api.test\r\n\r\n");
    r = rewrite("GET / HTTP/1.1\r\nHost: api.test\r\n\r\n", &q, 1, NULL, 0, &used);
    assert_string_equal(r, "GET /?key=a%20b%26c HTTP/1.1\r\nHost: api.test\r\n\r\n");
    /* Absolute-form becomes origin-form. */
    r = rewrite("GET http://api.test/a?b=1 HTTP/1.1\r\nHost: api.test\r\n\r\n", &q, 1, NULL, 0,
                &used);
    assert_string_equal(r, "GET /a?b=1&key=a%20b%26c HTTP/1.1\r\nHost: api.test\r\n\r\n");
    /* Placeholders: in a header value (raw) and in the query (encoded, either spelling). */
    const uint8_t v[] = "s3cr=t";
    sp_head_subst_t s[2] = {{.name = "gh", .value = v, .value_len = 6},
                            {.name = "other", .value = v, .value_len = 6}};
    r = rewrite("GET /?t=space-cred:gh&u=space-cred%3agh HTTP/1.1\r\nHost: api.test\r\n"
                "X-Token: pre space-cred:gh post\r\n\r\n",
                NULL, 0, s, 2, &used);
    assert_string_equal(r, "GET /?t=s3cr%3Dt&u=s3cr%3Dt HTTP/1.1\r\nHost: api.test\r\n"
                           "X-Token: pre s3cr=t post\r\n\r\n");
    assert_int_equal(used, 1);
    /* A placeholder nobody substitutes, in any case or place: refused. */
    assert_null(rewrite("GET / HTTP/1.1\r\nHost: api.test\r\nX: space-cred:nope\r\n\r\n", NULL, 0,
                        s, 2, &used));
    assert_null(rewrite("GET / HTTP/1.1\r\nHost: api.test\r\nX: SPACE-CRED:gh\r\n\r\n", NULL, 0, s,
                        2, &used));
    assert_null(
        rewrite("GET /space-cred:gh HTTP/1.1\r\nHost: api.test\r\n\r\n", NULL, 0, s, 2, &used));
    assert_null(rewrite("GET /?a=SPACE-CRED%3Agh HTTP/1.1\r\nHost: api.test\r\n\r\n", NULL, 0, NULL,
                        0, &used));
    assert_null(rewrite("GET / HTTP/1.1\r\nHost: api.test\r\nCookie: a=space-cred:gh\r\n\r\n", NULL,
                        0, NULL, 0, &used));
    assert_true(sp_http_head_has_placeholder((const uint8_t *)"X: Space-Cred%3Ax", 17));
    assert_false(sp_http_head_has_placeholder((const uint8_t *)"X: space-cred", 13));
    /* Nothing to do: the head as it came. */
    const char *plain = "POST /u HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\n\r\n";
    r = rewrite(plain, NULL, 0, NULL, 0, &used);
    assert_string_equal(r, plain);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seal_open),
        cmocka_unit_test(test_key_file),
        cmocka_unit_test(test_syntax),
        cmocka_unit_test(test_rewrite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
