/* The deployment CA in a sandbox's rootfs (worker/worker_trust.c): what is written where, that
 * an existing bundle is appended to, and that a PEM holding a key is refused before anything
 * could reach a guest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../../worker/worker_trust.c" /* NOLINT(bugprone-suspicious-include) */

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wk_fail_stub.h"

static const char CERT[] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static void test_load_refuses_keys(void **state)
{
    (void)state;
    char dir[] = "/tmp/test-trust-XXXXXX", path[128], err[WK_ERR_MAX] = "";
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ca.pem", dir);
    char *pem = NULL;

    write_text(path, CERT);
    assert_int_equal(wk__trust_load(path, &pem, err), 0);
    assert_string_equal(pem, CERT);
    free(pem);
    pem = NULL;

    /* The CA's key next to its certificate (ca.key passed by mistake, or concatenated). */
    char both[512];
    snprintf(both, sizeof(both), "%s-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n",
             CERT);
    write_text(path, both);
    assert_true(wk__trust_load(path, &pem, err) < 0);
    assert_null(pem);
    write_text(path, "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n");
    assert_true(wk__trust_load(path, &pem, err) < 0);
    write_text(path, "not PEM at all\n");
    assert_true(wk__trust_load(path, &pem, err) < 0);
    assert_null(pem);

    unlink(path);
    rmdir(dir);
}

static void test_install(void **state)
{
    (void)state;
    char dir[] = "/tmp/test-trust-XXXXXX", p[256], err[WK_ERR_MAX] = "";
    assert_non_null(mkdtemp(dir));
    /* A template with a system bundle (no final newline) and update-ca-certificates' dir. */
    snprintf(p, sizeof(p), "mkdir -p %s/etc/ssl/certs %s/usr/local/share/ca-certificates", dir,
             dir);
    assert_int_equal(system(p), 0); /* NOLINT(cert-env33-c) */
    snprintf(p, sizeof(p), "%s/etc/ssl/certs/ca-certificates.crt", dir);
    write_text(p, "-----BEGIN CERTIFICATE-----\nSYS\n-----END CERTIFICATE-----");

    wk_host_t h = {0};
    h.ca_pem = (char *)CERT;
    assert_int_equal(wk__trust_install(&h, dir, err), 0);

    char *t = read_text(p);
    assert_non_null(t);
    assert_non_null(strstr(t, "SYS\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nMIIB"));
    snprintf(p, sizeof(p), "%s" WK_TRUST_CA, dir);
    assert_string_equal(read_text(p), CERT);
    snprintf(p, sizeof(p), "%s/usr/local/share/ca-certificates/space-deployment-ca.crt", dir);
    assert_string_equal(read_text(p), CERT);
    snprintf(p, sizeof(p), "%s/etc/profile.d/space-ca.sh", dir);
    t = read_text(p);
    assert_non_null(t);
    assert_non_null(strstr(t, "export SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt\n"));
    assert_non_null(strstr(t, "export NODE_EXTRA_CA_CERTS=" WK_TRUST_CA "\n"));
    char link[256];
    snprintf(p, sizeof(p), "%s/usr/lib/ssl/cert.pem", dir);
    ssize_t n = readlink(p, link, sizeof(link) - 1);
    assert_true(n > 0);
    link[n] = '\0';
    assert_string_equal(link, WK_TRUST_BUNDLE);

    /* No CA configured: nothing is written. */
    char dir2[] = "/tmp/test-trust-XXXXXX";
    assert_non_null(mkdtemp(dir2));
    wk_host_t none = {0};
    assert_int_equal(wk__trust_install(&none, dir2, err), 0);
    snprintf(p, sizeof(p), "%s/etc", dir2);
    assert_int_equal(access(p, F_OK), -1);

    snprintf(p, sizeof(p), "rm -rf %s %s", dir, dir2);
    assert_int_equal(system(p), 0); /* NOLINT(cert-env33-c) */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_refuses_keys),
        cmocka_unit_test(test_install),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
