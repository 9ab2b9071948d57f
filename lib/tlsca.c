/* Deployment CA and leaf certificates (tlsca.h), OpenSSL 3. */
#include "tlsca.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "netpolicy.h"
#include "xmalloc.h"

#define CA_DAYS (3650)

struct sp_ca {
    X509 *cert;
    EVP_PKEY *key;
};

static int fail(char *err, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, int rc, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err, SP_CA_ERR_MAX, fmt, ap);
        va_end(ap);
        unsigned long e = ERR_peek_last_error();
        if (e && n > 0 && (size_t)n < SP_CA_ERR_MAX - 2) {
            err[n] = ':';
            err[n + 1] = ' ';
            ERR_error_string_n(e, err + n + 2, SP_CA_ERR_MAX - (size_t)n - 2);
        }
    }
    ERR_clear_error();
    return rc;
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!ext)
        return -1;
    int ok = X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    return ok ? 0 : -1;
}

static int random_serial(X509 *cert)
{
    unsigned char b[16];
    if (RAND_bytes(b, sizeof(b)) != 1)
        return -1;
    b[0] &= 0x7f; /* positive (RFC 5280 4.1.2.2) */
    BIGNUM *bn = BN_bin2bn(b, sizeof(b), NULL);
    int ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert)) != NULL;
    BN_free(bn);
    return ok ? 0 : -1;
}

/* Subject/issuer, validity, serial: the parts every certificate here has. */
static X509 *cert_start(EVP_PKEY *key, const char *cn, long days)
{
    X509 *c = X509_new();
    if (!c || !X509_set_version(c, 2) || random_serial(c) < 0 ||
        !X509_gmtime_adj(X509_getm_notBefore(c), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(c), days * 24 * 3600) || !X509_set_pubkey(c, key)) {
        X509_free(c);
        return NULL;
    }
    X509_NAME *n = X509_get_subject_name(c);
    if (!X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0)) {
        X509_free(c);
        return NULL;
    }
    return c;
}

static int write_file(const char *path, int mode, int (*emit)(FILE *, void *), void *obj)
{
    char *tmp = sp_xasprintf("%s.tmp", path);
    int rc = 0;
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        rc = -errno;
        if (fd >= 0)
            close(fd);
    } else {
        if (!emit(f, obj))
            rc = -EIO;
        if (fclose(f) != 0 && rc == 0)
            rc = -errno;
        if (rc == 0 && rename(tmp, path) < 0)
            rc = -errno;
    }
    if (rc < 0)
        unlink(tmp);
    free(tmp);
    return rc;
}

static int emit_key(FILE *f, void *k)
{
    return PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);
}

static int emit_cert(FILE *f, void *c)
{
    return PEM_write_X509(f, c);
}

int sp_ca_ensure(const char *dir, const char *common_name, char err[SP_CA_ERR_MAX])
{
    char *cert_path = sp_xasprintf("%s/" SP_CA_CERT_FILE, dir);
    char *key_path = sp_xasprintf("%s/" SP_CA_KEY_FILE, dir);
    EVP_PKEY *key = NULL;
    X509 *cert = NULL;
    int rc = 0;
    if (access(cert_path, F_OK) == 0 && access(key_path, F_OK) == 0) {
        sp_ca_t *ca = NULL;
        rc = sp_ca_load(cert_path, key_path, &ca, err);
        sp_ca_free(ca);
        goto out;
    }
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        rc = fail(err, -errno, "mkdir %s: %s", dir, strerror(errno));
        goto out;
    }
    key = EVP_EC_gen("P-256");
    cert = key ? cert_start(key, common_name, CA_DAYS) : NULL;
    if (!cert || !X509_set_issuer_name(cert, X509_get_subject_name(cert)) ||
        add_ext(cert, cert, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") < 0 ||
        add_ext(cert, cert, NID_key_usage, "critical,keyCertSign,cRLSign") < 0 ||
        add_ext(cert, cert, NID_subject_key_identifier, "hash") < 0 ||
        !X509_sign(cert, key, EVP_sha256())) {
        rc = fail(err, -EIO, "make the CA certificate");
        goto out;
    }
    if ((rc = write_file(key_path, 0600, emit_key, key)) < 0 ||
        (rc = write_file(cert_path, 0644, emit_cert, cert)) < 0) {
        rc = fail(err, rc, "write %s: %s", dir, strerror(-rc));
        goto out;
    }
out:
    X509_free(cert);
    EVP_PKEY_free(key);
    free(cert_path);
    free(key_path);
    return rc;
}

int sp_ca_load(const char *cert_path, const char *key_path, sp_ca_t **ret_ca,
               char err[SP_CA_ERR_MAX])
{
    FILE *f = fopen(cert_path, "re");
    if (!f)
        return fail(err, -errno, "open %s: %s", cert_path, strerror(errno));
    X509 *cert = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    f = fopen(key_path, "re");
    if (!f) {
        X509_free(cert);
        return fail(err, -errno, "open %s: %s", key_path, strerror(errno));
    }
    EVP_PKEY *key = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!cert || !key || X509_check_private_key(cert, key) != 1 || X509_check_ca(cert) < 1) {
        X509_free(cert);
        EVP_PKEY_free(key);
        return fail(err, SP_ECONFIG, "%s and %s are not a CA certificate and its key", cert_path,
                    key_path);
    }
    sp_ca_t *ca = sp_xcalloc(1, sizeof(*ca));
    ca->cert = cert;
    ca->key = key;
    *ret_ca = ca;
    return 0;
}

void sp_ca_free(sp_ca_t *ca)
{
    if (!ca)
        return;
    X509_free(ca->cert);
    EVP_PKEY_free(ca->key); /* OpenSSL clears key material when it frees it */
    free(ca);
}

X509 *sp_ca_cert(const sp_ca_t *ca)
{
    return ca->cert;
}

int sp_ca_mint(sp_ca_t *ca, const char *name, unsigned days, X509 **ret_cert, EVP_PKEY **ret_key,
               char err[SP_CA_ERR_MAX])
{
    if (!sp_dns_name_valid(name, false))
        return fail(err, -EINVAL, "not a DNS name");
    if (days < 1 || days > 397)
        return fail(err, -EINVAL, "days must be 1..397");
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *cert = key ? cert_start(key, name, (long)days) : NULL;
    char *san = sp_xasprintf("DNS:%s", name);
    int ok = cert && X509_set_issuer_name(cert, X509_get_subject_name(ca->cert)) &&
             add_ext(cert, ca->cert, NID_basic_constraints, "critical,CA:FALSE") == 0 &&
             add_ext(cert, ca->cert, NID_key_usage, "critical,digitalSignature") == 0 &&
             add_ext(cert, ca->cert, NID_ext_key_usage, "serverAuth") == 0 &&
             add_ext(cert, ca->cert, NID_subject_alt_name, san) == 0 &&
             add_ext(cert, ca->cert, NID_authority_key_identifier, "keyid:always") == 0 &&
             X509_sign(cert, ca->key, EVP_sha256());
    free(san);
    if (!ok) {
        X509_free(cert);
        EVP_PKEY_free(key);
        return fail(err, -EIO, "mint a certificate for %s", name);
    }
    *ret_cert = cert;
    *ret_key = key;
    return 0;
}
