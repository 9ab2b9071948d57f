/* The deployment CA (tlsca.h): made once, reloaded, and leaves that verify against it for
 * exactly their name. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/x509v3.h>

#include "tlsca.h"

static char dir[64];

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/test-tlsca-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char p[128];
    snprintf(p, sizeof(p), "%s/ca/" SP_CA_CERT_FILE, dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/ca/" SP_CA_KEY_FILE, dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/ca", dir);
    rmdir(p);
    rmdir(dir);
    return 0;
}

static int verify(X509 *ca, X509 *leaf, const char *host)
{
    X509_STORE *store = X509_STORE_new();
    X509_STORE_add_cert(store, ca);
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    X509_STORE_CTX_init(ctx, store, leaf, NULL);
    X509_VERIFY_PARAM_set1_host(X509_STORE_CTX_get0_param(ctx), host, 0);
    X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_SERVER);
    int ok = X509_verify_cert(ctx);
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    return ok;
}

static void test_ca(void **state)
{
    char cadir[96], cert[128], key[128], err[SP_CA_ERR_MAX] = "";
    snprintf(cadir, sizeof(cadir), "%s/ca", dir);
    snprintf(cert, sizeof(cert), "%s/" SP_CA_CERT_FILE, cadir);
    snprintf(key, sizeof(key), "%s/" SP_CA_KEY_FILE, cadir);
    assert_int_equal(sp_ca_ensure(cadir, "SPACE test CA", err), 0);
    struct stat st;
    assert_int_equal(stat(key, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    time_t made = st.st_mtime;
    /* Again: kept, not remade. */
    assert_int_equal(sp_ca_ensure(cadir, "SPACE test CA", err), 0);
    assert_int_equal(stat(key, &st), 0);
    assert_int_equal(st.st_mtime, made);

    sp_ca_t *ca = NULL;
    assert_int_equal(sp_ca_load(cert, key, &ca, err), 0);
    X509 *leaf = NULL;
    EVP_PKEY *lkey = NULL;
    assert_int_equal(sp_ca_mint(ca, "api.example.com", 7, &leaf, &lkey, err), 0);
    assert_int_equal(X509_check_private_key(leaf, lkey), 1);
    assert_int_equal(verify(sp_ca_cert(ca), leaf, "api.example.com"), 1);
    assert_int_not_equal(verify(sp_ca_cert(ca), leaf, "other.example.com"), 1);
    assert_int_equal(X509_check_ca(leaf), 0);
    X509_free(leaf);
    EVP_PKEY_free(lkey);

    assert_int_not_equal(sp_ca_mint(ca, "not a name", 7, &leaf, &lkey, err), 0);
    assert_int_not_equal(sp_ca_mint(ca, "a.example", 398, &leaf, &lkey, err), 0);
    sp_ca_free(ca);

    /* A certificate with a key that is not its own. */
    char other[96];
    snprintf(other, sizeof(other), "%s/other", dir);
    assert_int_equal(sp_ca_ensure(other, "other", err), 0);
    char okey[128];
    snprintf(okey, sizeof(okey), "%s/" SP_CA_KEY_FILE, other);
    assert_int_not_equal(sp_ca_load(cert, okey, &ca, err), 0);
    assert_true(strlen(err) > 0);
    char p[128];
    snprintf(p, sizeof(p), "%s/" SP_CA_CERT_FILE, other);
    unlink(p);
    unlink(okey);
    rmdir(other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ca)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
