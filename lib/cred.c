/* Credentials: sealing, the master key file, and the syntax shared by the gateway (which
 * validates what a client sends), space-credstore (which matches hosts) and space-egressd
 * (which checks methods and paths). docs/credentials.md. */
#include "cred.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash.h"

int sp_cred_key_load(const char *path, sp_cred_key_t *ret_key)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = 0;
    uint8_t buf[SP_CRED_KEY_LEN + 1];
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode) || st.st_size != SP_CRED_KEY_LEN) {
        rc = -EINVAL;
        goto out;
    }
    /* Readable by its owner only: a key any local user can read protects nothing. */
    if (st.st_mode & 077) {
        rc = -EPERM;
        goto out;
    }
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n != SP_CRED_KEY_LEN) {
        rc = n < 0 ? -errno : -EINVAL;
        goto out;
    }
    memcpy(ret_key->k, buf, SP_CRED_KEY_LEN);
    uint8_t h[SP_SHA256_LEN];
    sp_sha256(buf, SP_CRED_KEY_LEN, h);
    for (int i = 0; i < SP_CRED_KEY_ID_LEN / 2; i++)
        snprintf(ret_key->id + 2 * i, 3, "%02x", h[i]);
    explicit_bzero(h, sizeof(h));
out:
    explicit_bzero(buf, sizeof(buf));
    close(fd);
    return rc;
}

int sp_cred_key_create(const char *path)
{
    uint8_t k[SP_CRED_KEY_LEN];
    if (RAND_bytes(k, sizeof(k)) != 1)
        return -EIO;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        explicit_bzero(k, sizeof(k));
        return -errno;
    }
    int rc = 0;
    if (fchmod(fd, 0600) < 0 || write(fd, k, sizeof(k)) != (ssize_t)sizeof(k) || fsync(fd) < 0)
        rc = errno ? -errno : -EIO;
    explicit_bzero(k, sizeof(k));
    close(fd);
    if (rc < 0)
        unlink(path);
    return rc;
}

void sp_cred_key_wipe(sp_cred_key_t *key)
{
    explicit_bzero(key, sizeof(*key));
}

size_t sp_cred_aad(const char *id, uint32_t version, uint8_t *out)
{
    int n = snprintf((char *)out, 96, "space-cred:v1:%.64s:%u", id, version);
    return n < 0 ? 0 : (size_t)n >= 96 ? 95 : (size_t)n;
}

int sp_cred_seal(const sp_cred_key_t *key, const uint8_t *aad, size_t aad_len, const uint8_t *pt,
                 size_t len, uint8_t ret_nonce[SP_CRED_NONCE_LEN], uint8_t *ret_ct)
{
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int rc = -EIO, n = 0;
    if (!ctx || RAND_bytes(ret_nonce, SP_CRED_NONCE_LEN) != 1)
        goto out;
    if (EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, SP_CRED_NONCE_LEN, NULL) != 1 ||
        EVP_EncryptInit_ex(ctx, NULL, NULL, key->k, ret_nonce) != 1 ||
        EVP_EncryptUpdate(ctx, NULL, &n, aad, (int)aad_len) != 1 ||
        EVP_EncryptUpdate(ctx, ret_ct, &n, pt, (int)len) != 1 ||
        EVP_EncryptFinal_ex(ctx, ret_ct + n, &n) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, SP_CRED_TAG_LEN, ret_ct + len) != 1)
        goto out;
    rc = 0;
out:
    EVP_CIPHER_CTX_free(ctx); /* cleans the key schedule */
    return rc;
}

int sp_cred_open(const sp_cred_key_t *key, const uint8_t *aad, size_t aad_len,
                 const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *ct, size_t ct_len,
                 uint8_t *ret_pt)
{
    if (ct_len < SP_CRED_TAG_LEN)
        return -EBADMSG;
    size_t len = ct_len - SP_CRED_TAG_LEN;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int rc = -EBADMSG, n = 0;
    uint8_t tag[SP_CRED_TAG_LEN];
    memcpy(tag, ct + len, SP_CRED_TAG_LEN);
    if (!ctx)
        goto out;
    if (EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, SP_CRED_NONCE_LEN, NULL) != 1 ||
        EVP_DecryptInit_ex(ctx, NULL, NULL, key->k, nonce) != 1 ||
        EVP_DecryptUpdate(ctx, NULL, &n, aad, (int)aad_len) != 1 ||
        EVP_DecryptUpdate(ctx, ret_pt, &n, ct, (int)len) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, SP_CRED_TAG_LEN, tag) != 1)
        goto out;
    if (EVP_DecryptFinal_ex(ctx, ret_pt + n, &n) != 1)
        goto out;
    rc = 0;
out:
    if (rc < 0 && len)
        explicit_bzero(ret_pt, len);
    EVP_CIPHER_CTX_free(ctx);
    return rc;
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

bool sp_cred_name_valid(const char *s, size_t len)
{
    if (!s || len == 0 || len > SP_CRED_NAME_MAX || s[0] == '.' || s[0] == '-' || s[0] == '_')
        return false;
    for (size_t i = 0; i < len; i++)
        if (!name_char(s[i]))
            return false;
    return true;
}

bool sp_cred_value_valid(const uint8_t *v, size_t len)
{
    if (!v || len == 0 || len > SP_CRED_VALUE_MAX || v[0] == ' ' || v[len - 1] == ' ')
        return false;
    for (size_t i = 0; i < len; i++)
        if (v[i] < 0x20 || v[i] > 0x7e)
            return false;
    return true;
}

bool sp_cred_header_name_valid(const char *s)
{
    static const char tchar[] = "!#$%&'*+-.^_`|~";
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr(tchar, c)))
            return false;
    }
    return true;
}

bool sp_cred_param_name_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!name_char(s[i]))
            return false;
    return true;
}

bool sp_cred_user_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n > 256 || !sp_cred_value_valid((const uint8_t *)s, n))
        return false;
    return strchr(s, ':') == NULL;
}

static bool dns_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 253 || s[0] == '.' || s[n - 1] == '.' || s[0] == '-')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_'))
            return false;
        if (c == '.' && s[i + 1] == '.')
            return false;
    }
    return true;
}

int sp_cred_host_parse(const char *s, sp_cred_host_t *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (!s || strlen(s) > SP_CRED_HOST_MAX)
        return -EINVAL;
    const char *sp = strchr(s, ' ');
    if (sp) {
        /* Methods: upper-case tokens separated by commas. */
        const char *m = s;
        while (m < sp) {
            const char *end = memchr(m, ',', (size_t)(sp - m));
            if (!end)
                end = sp;
            size_t n = (size_t)(end - m);
            if (n == 0 || n >= sizeof(ret->methods[0]) || ret->n_methods == SP_CRED_METHODS_MAX)
                return -EINVAL;
            for (size_t i = 0; i < n; i++)
                if (m[i] < 'A' || m[i] > 'Z')
                    return -EINVAL;
            memcpy(ret->methods[ret->n_methods], m, n);
            ret->methods[ret->n_methods++][n] = '\0';
            m = end + (end < sp);
            if (end < sp && m == sp)
                return -EINVAL; /* a trailing comma */
        }
        s = sp + 1;
        if (strchr(s, ' '))
            return -EINVAL;
    }
    const char *slash = strchr(s, '/');
    size_t nlen = slash ? (size_t)(slash - s) : strlen(s);
    if (nlen > 2 && s[0] == '*' && s[1] == '.') {
        ret->wildcard = true;
        s += 2;
        nlen -= 2;
    }
    if (!dns_name_ok(s, nlen) || nlen >= sizeof(ret->name))
        return -EINVAL;
    memcpy(ret->name, s, nlen);
    if (slash) {
        size_t plen = strlen(slash);
        if (plen >= sizeof(ret->path))
            return -EINVAL;
        for (size_t i = 0; i < plen; i++)
            if (slash[i] <= 0x20 || slash[i] > 0x7e || slash[i] == '?' || slash[i] == '#')
                return -EINVAL;
        memcpy(ret->path, slash, plen);
    }
    return 0;
}

bool sp_cred_host_covers(const sp_cred_host_t *h, const char *host)
{
    if (!h->wildcard)
        return strcmp(h->name, host) == 0;
    size_t hl = strlen(host), nl = strlen(h->name);
    return hl > nl + 1 && host[hl - nl - 1] == '.' && strcmp(host + hl - nl, h->name) == 0;
}

bool sp_cred_host_allows(const sp_cred_host_t *h, const char *method, const char *path,
                         size_t path_len)
{
    if (h->n_methods) {
        bool any = false;
        for (size_t i = 0; i < h->n_methods && !any; i++)
            any = strcmp(h->methods[i], method) == 0;
        if (!any)
            return false;
    }
    size_t pl = strlen(h->path);
    return pl == 0 || (path_len >= pl && memcmp(path, h->path, pl) == 0);
}

sp_cred_inject_t sp_cred_inject_parse(const char *s)
{
    if (!s)
        return 0;
    if (strcmp(s, "header") == 0)
        return SP_CRED_HEADER;
    if (strcmp(s, "bearer") == 0)
        return SP_CRED_BEARER;
    if (strcmp(s, "basic") == 0)
        return SP_CRED_BASIC;
    if (strcmp(s, "query") == 0)
        return SP_CRED_QUERY;
    return 0;
}

const char *sp_cred_inject_name(sp_cred_inject_t t)
{
    switch (t) {
    case SP_CRED_HEADER:
        return "header";
    case SP_CRED_BEARER:
        return "bearer";
    case SP_CRED_BASIC:
        return "basic";
    case SP_CRED_QUERY:
        return "query";
    }
    return "";
}

int sp_cred_scope_rank(const char *kind)
{
    if (!kind)
        return -1;
    if (strcmp(kind, "sandbox") == 0)
        return 0;
    if (strcmp(kind, "project") == 0)
        return 1;
    if (strcmp(kind, "tenant") == 0)
        return 2;
    return -1;
}
