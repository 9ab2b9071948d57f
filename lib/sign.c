/* Ed25519 keys, keyring and signed envelopes (sign.h), OpenSSL 3.
 *
 * Verification builds no EVP_PKEY per message: each keyring entry keeps its own, made once
 * at load. An EVP_MD_CTX per call keeps sp_keyring_verify thread-safe (OpenSSL allows one
 * EVP_PKEY to be used by many threads at once for verification).
 */
#include "sign.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "contract.h"
#include "error.h"
#include "ids.h"
#include "xmalloc.h"

#define TENANTS_MAX 1024

struct sp_sign_key {
    EVP_PKEY *pkey;
};

typedef struct {
    char name[SP_IDENTITY_MAX + 1];
    EVP_PKEY *pkey;
    char **tenants;
    size_t n_tenants;
} kr_entry_t;

struct sp_keyring {
    kr_entry_t *e; /* sorted by name */
    size_t n;
};

int sp_sign_keygen(const char *priv_path, const char *pub_path)
{
    EVP_PKEY *k = NULL;
    FILE *f = NULL;
    int fd = -1, rc = SP_ECONFIG;
    char *tmp = NULL;

    if (!priv_path || !pub_path)
        return -EINVAL;
    k = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    if (!k)
        goto out;
    fd = open(priv_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    f = fdopen(fd, "w");
    if (!f) {
        rc = -errno;
        close(fd);
        unlink(priv_path);
        goto out;
    }
    if (!PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL)) {
        fclose(f);
        unlink(priv_path);
        goto out;
    }
    if (fclose(f) != 0) {
        rc = -EIO;
        unlink(priv_path);
        goto out;
    }
    /* The public key is replaced atomically: a keyring being read sees the old or the new. */
    tmp = sp_xasprintf("%s.tmp", pub_path);
    f = fopen(tmp, "we");
    if (!f) {
        rc = -errno;
        goto out;
    }
    if (!PEM_write_PUBKEY(f, k) || (fclose(f) != 0)) {
        unlink(tmp);
        rc = -EIO;
        goto out;
    }
    chmod(tmp, 0644);
    if (rename(tmp, pub_path) < 0) {
        rc = -errno;
        unlink(tmp);
        goto out;
    }
    rc = 0;
out:
    free(tmp);
    EVP_PKEY_free(k); /* OpenSSL clears key material when it frees it */
    return rc;
}

static sp_sign_key_t *key_wrap(EVP_PKEY *pkey)
{
    sp_sign_key_t *k = sp_xcalloc(1, sizeof(*k));
    k->pkey = pkey;
    return k;
}

int sp_sign_key_load(const char *priv_path, sp_sign_key_t **ret_key)
{
    struct stat st;
    EVP_PKEY *pkey;
    FILE *f;
    int fd;

    if (!priv_path || !ret_key)
        return -EINVAL;
    fd = open(priv_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0 || (st.st_mode & 077)) {
        close(fd);
        return -EPERM;
    }
    f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return -errno;
    }
    pkey = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!pkey)
        return SP_ECONFIG;
    if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_ED25519) {
        EVP_PKEY_free(pkey);
        return SP_ECONFIG;
    }
    *ret_key = key_wrap(pkey);
    return 0;
}

int sp_sign_key_from_raw(const uint8_t priv[32], sp_sign_key_t **ret_key)
{
    EVP_PKEY *pkey = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, priv, 32);
    if (!pkey)
        return SP_ECONFIG;
    *ret_key = key_wrap(pkey);
    return 0;
}

void sp_sign_key_free(sp_sign_key_t *key)
{
    if (!key)
        return;
    EVP_PKEY_free(key->pkey);
    free(key);
}

int sp_sign_key_public(const sp_sign_key_t *key, uint8_t out[SP_PUBKEY_LEN])
{
    size_t n = SP_PUBKEY_LEN;
    if (!key || EVP_PKEY_get_raw_public_key(key->pkey, out, &n) != 1 || n != SP_PUBKEY_LEN)
        return SP_ECONFIG;
    return 0;
}

int sp_sign(const sp_sign_key_t *key, const void *data, size_t len, uint8_t sig[SP_SIG_LEN])
{
    EVP_MD_CTX *ctx;
    size_t n = SP_SIG_LEN;
    int ok;

    if (!key || (!data && len))
        return -EINVAL;
    ctx = EVP_MD_CTX_new();
    if (!ctx)
        return -ENOMEM;
    ok = EVP_DigestSignInit(ctx, NULL, NULL, NULL, key->pkey) == 1 &&
         EVP_DigestSign(ctx, sig, &n, data, len) == 1 && n == SP_SIG_LEN;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : SP_ECONFIG;
}

static int verify_pkey(EVP_PKEY *pkey, const void *data, size_t len, const uint8_t sig[SP_SIG_LEN])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok;

    if (!ctx)
        return -ENOMEM;
    ok = EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, pkey) == 1 &&
         EVP_DigestVerify(ctx, sig, SP_SIG_LEN, data, len) == 1;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : SP_ESIGNATURE;
}

int sp_verify_raw(const uint8_t pub[SP_PUBKEY_LEN], const void *data, size_t len,
                  const uint8_t sig[SP_SIG_LEN])
{
    EVP_PKEY *pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, SP_PUBKEY_LEN);
    int rc;

    if (!pkey)
        return SP_ESIGNATURE;
    rc = verify_pkey(pkey, data, len, sig);
    EVP_PKEY_free(pkey);
    return rc;
}

/* ---- keyring ---- */

int sp_keyring_new(sp_keyring_t **ret_kr)
{
    if (!ret_kr)
        return -EINVAL;
    *ret_kr = sp_xcalloc(1, sizeof(**ret_kr));
    return 0;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const kr_entry_t *)a)->name, ((const kr_entry_t *)b)->name);
}

static kr_entry_t *find(const sp_keyring_t *kr, const char *identity)
{
    kr_entry_t key;

    if (!kr || !identity || strlen(identity) > SP_IDENTITY_MAX || kr->n == 0)
        return NULL;
    memcpy(key.name, identity, strlen(identity) + 1);
    return bsearch(&key, kr->e, kr->n, sizeof(*kr->e), entry_cmp);
}

static void entry_dispose(kr_entry_t *e)
{
    EVP_PKEY_free(e->pkey);
    for (size_t i = 0; i < e->n_tenants; i++)
        free(e->tenants[i]);
    free(e->tenants);
}

static int add_pkey(sp_keyring_t *kr, const char *identity, EVP_PKEY *pkey)
{
    sp_identity_t id;
    kr_entry_t *e;

    if (!kr || sp_identity_parse(identity, &id) < 0) {
        EVP_PKEY_free(pkey);
        return -EINVAL;
    }
    e = find(kr, identity);
    if (e) {
        EVP_PKEY_free(e->pkey);
        e->pkey = pkey;
        return 0;
    }
    kr->e = sp_xreallocarray(kr->e, kr->n + 1, sizeof(*kr->e));
    e = &kr->e[kr->n++];
    memset(e, 0, sizeof(*e));
    memcpy(e->name, id.name, strlen(id.name) + 1);
    e->pkey = pkey;
    qsort(kr->e, kr->n, sizeof(*kr->e), entry_cmp);
    return 0;
}

int sp_keyring_add(sp_keyring_t *kr, const char *identity, const uint8_t pub[SP_PUBKEY_LEN])
{
    EVP_PKEY *pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, SP_PUBKEY_LEN);
    if (!pkey)
        return SP_ECONFIG;
    return add_pkey(kr, identity, pkey);
}

int sp_keyring_add_tenant(sp_keyring_t *kr, const char *identity, const char *tenant)
{
    kr_entry_t *e = find(kr, identity);

    if (!e || !tenant || !sp_id_valid(tenant))
        return -EINVAL;
    if (e->n_tenants >= TENANTS_MAX)
        return SP_ETOOBIG;
    if (sp_keyring_has_tenant(kr, identity, tenant))
        return 0;
    e->tenants = sp_xreallocarray(e->tenants, e->n_tenants + 1, sizeof(*e->tenants));
    e->tenants[e->n_tenants++] = sp_xstrdup(tenant);
    return 0;
}

bool sp_keyring_has(const sp_keyring_t *kr, const char *identity)
{
    return find(kr, identity) != NULL;
}

bool sp_keyring_has_tenant(const sp_keyring_t *kr, const char *identity, const char *tenant)
{
    const kr_entry_t *e = find(kr, identity);

    if (!e || !tenant)
        return false;
    for (size_t i = 0; i < e->n_tenants; i++)
        if (strcmp(e->tenants[i], tenant) == 0)
            return true;
    return false;
}

int sp_keyring_verify(const sp_keyring_t *kr, const char *identity, const void *data, size_t len,
                      const uint8_t sig[SP_SIG_LEN])
{
    const kr_entry_t *e = find(kr, identity);
    if (!e)
        return SP_ESIGNER;
    return verify_pkey(e->pkey, data, len, sig);
}

size_t sp_keyring_size(const sp_keyring_t *kr)
{
    return kr ? kr->n : 0;
}

void sp_keyring_free(sp_keyring_t *kr)
{
    if (!kr)
        return;
    for (size_t i = 0; i < kr->n; i++)
        entry_dispose(&kr->e[i]);
    free(kr->e);
    free(kr);
}

/* Reads "<dir>/<identity>.tenants": one tenant id per line; blank lines and "#" comments are
 * skipped. A missing file means no tenants. */
static int load_tenants(sp_keyring_t *kr, const char *dir, const char *identity)
{
    char *path = sp_xasprintf("%s/%s.tenants", dir, identity);
    char line[128];
    int rc = 0;
    FILE *f = fopen(path, "re");

    free(path);
    if (!f)
        return errno == ENOENT ? 0 : -errno;
    while (fgets(line, sizeof(line), f)) {
        size_t n = strcspn(line, "\r\n");
        if (line[n] == '\0' && !feof(f)) {
            rc = SP_ECONFIG; /* longer than any id */
            break;
        }
        line[n] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        if ((rc = sp_keyring_add_tenant(kr, identity, line)) < 0) {
            rc = SP_ECONFIG;
            break;
        }
    }
    fclose(f);
    return rc;
}

int sp_keyring_load(const char *dir, sp_keyring_t **ret_kr)
{
    sp_keyring_t *kr = NULL;
    struct dirent *de;
    DIR *d;
    int rc = 0;

    if (!dir || !ret_kr)
        return -EINVAL;
    d = opendir(dir);
    if (!d)
        return -errno;
    sp_keyring_new(&kr);
    while ((de = readdir(d))) {
        char name[SP_IDENTITY_MAX + 1];
        size_t len = strlen(de->d_name);
        sp_identity_t id;
        EVP_PKEY *pkey;
        FILE *f;

        if (len <= 4 || strcmp(de->d_name + len - 4, ".pub") != 0 || len - 4 > SP_IDENTITY_MAX)
            continue;
        memcpy(name, de->d_name, len - 4);
        name[len - 4] = '\0';
        if (sp_identity_parse(name, &id) < 0)
            continue;
        char *path = sp_xasprintf("%s/%s", dir, de->d_name);
        f = fopen(path, "re");
        free(path);
        if (!f) {
            rc = -errno;
            break;
        }
        pkey = PEM_read_PUBKEY(f, NULL, NULL, NULL);
        fclose(f);
        if (!pkey || EVP_PKEY_get_base_id(pkey) != EVP_PKEY_ED25519) {
            EVP_PKEY_free(pkey);
            rc = SP_ECONFIG;
            break;
        }
        if ((rc = add_pkey(kr, name, pkey)) < 0)
            break;
        if (id.kind == SP_KIND_PLATFORM && (rc = load_tenants(kr, dir, name)) < 0)
            break;
    }
    closedir(d);
    if (rc < 0) {
        sp_keyring_free(kr);
        return rc;
    }
    *ret_kr = kr;
    return 0;
}

/* ---- envelopes ---- */

int sp_envelope_encode_signed(sp_envelope_t *env, const char *signer, const sp_sign_key_t *key,
                              uint8_t **ret_buf, size_t *ret_len)
{
    uint8_t *buf = NULL, sig[SP_SIG_LEN];
    size_t len = 0;
    int rc;

    if (!env || !signer || !key || !ret_buf || !ret_len)
        return -EINVAL;
    /* The generated struct has no const; the envelope never writes through it. */
    env->signer = (char *)signer;
    env->signature.data = NULL;
    env->signature.len = 0;
    rc = sp_envelope_encode(env, &buf, &len);
    if (rc < 0)
        return rc;
    if (len + SP_SIG_FIELD_LEN > SP_ENVELOPE_MAX) {
        free(buf);
        return SP_ETOOBIG;
    }
    rc = sp_sign(key, buf, len, sig);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    /* Field 11, wire type 2 (length-delimited): protobuf allows fields in any order, so the
     * signature goes last and the bytes before it are exactly the canonical bytes. */
    buf = sp_xrealloc(buf, len + SP_SIG_FIELD_LEN);
    buf[len] = (11 << 3) | 2;
    buf[len + 1] = SP_SIG_LEN;
    memcpy(buf + len + 2, sig, SP_SIG_LEN);
    *ret_buf = buf;
    *ret_len = len + SP_SIG_FIELD_LEN;
    return 0;
}
