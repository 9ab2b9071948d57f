/* Ed25519 keys, keyring, batch signatures and signed envelopes (sign.h), OpenSSL 3.
 *
 * Verification builds no EVP_PKEY per message: each keyring entry keeps its own, made once
 * at load. An EVP_MD_CTX per call keeps sp_keyring_verify thread-safe (OpenSSL allows one
 * EVP_PKEY to be used by many threads at once for verification).
 *
 * The Ed25519 arithmetic itself is libsodium's: OpenSSL 3.0 parses and stores the keys (PEM),
 * libsodium signs and verifies, 1.5-2x faster on these hosts (docs/trust.md, "The cost").
 * Signatures are the same bytes (Ed25519 is deterministic); libsodium's verification is the
 * stricter one (it also refuses small-order keys and R, and a non-canonical S or key).
 *
 * Batches: Ed25519 verification costs ~180 us on the 2-core VM this was measured on, SHA-256
 * of an envelope ~1 us; one signature per batch of envelopes, each member proving its way to
 * the root with log2(n) hashes, makes the event log's cost per event mostly hashing.
 */
#include "sign.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "contract.h"
#include "error.h"
#include "hash.h"
#include "ids.h"
#include "xmalloc.h"

#define TENANTS_MAX 1024

struct sp_sign_key {
    EVP_PKEY *pkey;
    /* libsodium's form of the same key: the seed, then the public key. Cleared at free. */
    uint8_t sk[crypto_sign_SECRETKEYBYTES];
};

static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;

static void sodium_start(void)
{
    /* Only fails where the library cannot work at all (no entropy source for its own random
     * numbers, which signing and verifying do not use). */
    if (sodium_init() < 0)
        abort();
}

static void sodium_ready(void)
{
    pthread_once(&sodium_once, sodium_start);
}

/* A retired key (`space identity rotate`): valid for messages published before until_ns. */
typedef struct {
    uint8_t pub[SP_PUBKEY_LEN];
    int64_t until_ns;
} kr_retired_t;

typedef struct {
    char name[SP_IDENTITY_MAX + 1];
    bool has_key;               /* a current key; false when the identity has retired ones only */
    uint8_t pub[SP_PUBKEY_LEN]; /* the current key, raw */
    kr_retired_t *retired;
    size_t n_retired;
    char **tenants;
    size_t n_tenants;
    /* The .tenants file read (platforms): present, and its stat, for sp_keyring_stale. */
    bool tenants_file;
    struct stat tenants_st;
} kr_entry_t;

struct sp_keyring {
    kr_entry_t *e; /* sorted by name */
    size_t n;
    char *dir;          /* sp_keyring_load's directory, else NULL */
    struct stat dir_st; /* the directory as it was read (its mtime: files made or renamed) */
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

/* Takes pkey; NULL (pkey freed) when it has no Ed25519 private key to give. */
static sp_sign_key_t *key_wrap(EVP_PKEY *pkey)
{
    uint8_t seed[crypto_sign_SEEDBYTES], pub[crypto_sign_PUBLICKEYBYTES];
    size_t n = sizeof(seed);
    if (EVP_PKEY_get_raw_private_key(pkey, seed, &n) != 1 || n != sizeof(seed)) {
        EVP_PKEY_free(pkey);
        return NULL;
    }
    sodium_ready();
    sp_sign_key_t *k = sp_xcalloc(1, sizeof(*k));
    k->pkey = pkey;
    crypto_sign_seed_keypair(pub, k->sk, seed);
    sodium_memzero(seed, sizeof(seed));
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
    return *ret_key ? 0 : SP_ECONFIG;
}

int sp_sign_key_from_raw(const uint8_t priv[32], sp_sign_key_t **ret_key)
{
    EVP_PKEY *pkey = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, priv, 32);
    if (!pkey)
        return SP_ECONFIG;
    *ret_key = key_wrap(pkey);
    return *ret_key ? 0 : SP_ECONFIG;
}

void sp_sign_key_free(sp_sign_key_t *key)
{
    if (!key)
        return;
    EVP_PKEY_free(key->pkey);
    sodium_memzero(key->sk, sizeof(key->sk));
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
    if (!key || (!data && len))
        return -EINVAL;
    return crypto_sign_detached(sig, NULL, data ? data : (const void *)"", len, key->sk) == 0
               ? 0
               : SP_ECONFIG;
}

static int verify_pub(const uint8_t pub[SP_PUBKEY_LEN], const void *data, size_t len,
                      const uint8_t sig[SP_SIG_LEN])
{
    if (!data && len)
        return -EINVAL;
    sodium_ready();
    return crypto_sign_verify_detached(sig, data ? data : (const void *)"", len, pub) == 0
               ? 0
               : SP_ESIGNATURE;
}

int sp_verify_raw(const uint8_t pub[SP_PUBKEY_LEN], const void *data, size_t len,
                  const uint8_t sig[SP_SIG_LEN])
{
    return verify_pub(pub, data, len, sig);
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
    free(e->retired);
    for (size_t i = 0; i < e->n_tenants; i++)
        free(e->tenants[i]);
    free(e->tenants);
}

/* identity's entry, made (with no key) when absent; NULL when identity is not an identity. */
static kr_entry_t *entry_get(sp_keyring_t *kr, const char *identity)
{
    sp_identity_t id;
    kr_entry_t *e;

    if (!kr || sp_identity_parse(identity, &id) < 0)
        return NULL;
    if ((e = find(kr, identity)))
        return e;
    kr->e = sp_xreallocarray(kr->e, kr->n + 1, sizeof(*kr->e));
    e = &kr->e[kr->n++];
    memset(e, 0, sizeof(*e));
    memcpy(e->name, id.name, strlen(id.name) + 1);
    qsort(kr->e, kr->n, sizeof(*kr->e), entry_cmp);
    return find(kr, identity);
}

/* identity's current key (retired: until_ns > 0, one of its retired keys). */
static int add_pub_until(sp_keyring_t *kr, const char *identity, const uint8_t pub[SP_PUBKEY_LEN],
                         int64_t until_ns)
{
    kr_entry_t *e;

    if (!pub || !(e = entry_get(kr, identity)))
        return -EINVAL;
    if (until_ns <= 0) {
        e->has_key = true;
        memcpy(e->pub, pub, SP_PUBKEY_LEN);
        return 0;
    }
    if (e->n_retired == SP_KEYRING_RETIRED_MAX)
        return SP_ETOOBIG;
    /* Kept in the order of their until (retired_valid). */
    e->retired = sp_xreallocarray(e->retired, e->n_retired + 1, sizeof(*e->retired));
    size_t at = e->n_retired++;
    while (at > 0 && e->retired[at - 1].until_ns > until_ns) {
        e->retired[at] = e->retired[at - 1];
        at--;
    }
    kr_retired_t *r = &e->retired[at];
    memcpy(r->pub, pub, SP_PUBKEY_LEN);
    r->until_ns = until_ns;
    return 0;
}

int sp_keyring_add_retired(sp_keyring_t *kr, const char *identity, const uint8_t pub[SP_PUBKEY_LEN],
                           int64_t until_ns)
{
    if (until_ns <= 0)
        return -EINVAL;
    return add_pub_until(kr, identity, pub, until_ns);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int sp_keyring_add(sp_keyring_t *kr, const char *identity, const uint8_t pub[SP_PUBKEY_LEN])
{
    return add_pub_until(kr, identity, pub, 0);
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

bool sp_keyring_has_retired(const sp_keyring_t *kr, const char *identity)
{
    const kr_entry_t *e = find(kr, identity);
    int64_t now = now_ns();
    for (size_t i = 0; e && i < e->n_retired; i++)
        if (e->retired[i].until_ns > now)
            return true;
    return false;
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

int sp_keyring_verify_at(const sp_keyring_t *kr, const char *identity, const void *data, size_t len,
                         const uint8_t sig[SP_SIG_LEN], int64_t at_ns)
{
    const kr_entry_t *e = find(kr, identity);
    int rc = SP_ESIGNATURE;

    if (!e)
        return SP_ESIGNER;
    if (e->has_key && (rc = verify_pub(e->pub, data, len, sig)) != SP_ESIGNATURE)
        return rc;
    if (!at_ns)
        at_ns = now_ns();
    for (size_t i = 0; i < e->n_retired; i++)
        if (e->retired[i].until_ns > at_ns &&
            (rc = verify_pub(e->retired[i].pub, data, len, sig)) != SP_ESIGNATURE)
            return rc;
    return SP_ESIGNATURE;
}

int sp_keyring_verify(const sp_keyring_t *kr, const char *identity, const void *data, size_t len,
                      const uint8_t sig[SP_SIG_LEN])
{
    return sp_keyring_verify_at(kr, identity, data, len, sig, 0);
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
    free(kr->dir);
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
    kr_entry_t *e = find(kr, identity);

    free(path);
    if (!f)
        return errno == ENOENT ? 0 : -errno;
    /* The file as opened: what was read, whatever replaces it meanwhile. */
    if (e && fstat(fileno(f), &e->tenants_st) == 0)
        e->tenants_file = true;
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
    /* The directory before its entries are read: a change made while they are cannot be missed
     * by sp_keyring_stale. */
    if (fstat(dirfd(d), &kr->dir_st) < 0)
        memset(&kr->dir_st, 0, sizeof(kr->dir_st));
    while ((de = readdir(d))) {
        char name[SP_IDENTITY_MAX + 1 + 1 + 20];
        size_t len = strlen(de->d_name);
        sp_identity_t id;
        EVP_PKEY *pkey;
        FILE *f;
        int64_t until_ns = 0;

        if (len <= 4 || strcmp(de->d_name + len - 4, ".pub") != 0 || len - 4 >= sizeof(name))
            continue;
        memcpy(name, de->d_name, len - 4);
        name[len - 4] = '\0';
        /* "<identity>@<until>": a retired key, valid for messages published before <until>. */
        char *at = strchr(name, '@');
        if (at) {
            char *end;
            errno = 0;
            long long until = strtoll(at + 1, &end, 10);
            if (at[1] < '1' || at[1] > '9' || *end || errno || until > INT64_MAX / 1000000000LL)
                continue;
            *at = '\0';
            until_ns = until * 1000000000LL;
        }
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
        uint8_t pub[SP_PUBKEY_LEN];
        size_t publen = SP_PUBKEY_LEN;
        rc = EVP_PKEY_get_raw_public_key(pkey, pub, &publen) == 1 && publen == SP_PUBKEY_LEN
                 ? add_pub_until(kr, name, pub, until_ns)
                 : SP_ECONFIG;
        EVP_PKEY_free(pkey);
        if (rc < 0)
            break;
        if (!until_ns && id.kind == SP_KIND_PLATFORM && (rc = load_tenants(kr, dir, name)) < 0)
            break;
    }
    closedir(d);
    if (rc < 0) {
        sp_keyring_free(kr);
        return rc;
    }
    kr->dir = sp_xstrdup(dir);
    *ret_kr = kr;
    return 0;
}

static bool same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

bool sp_keyring_stale(const sp_keyring_t *kr)
{
    struct stat dst;

    if (!kr || !kr->dir)
        return false;
    if (stat(kr->dir, &dst) == 0 && !same_file(&dst, &kr->dir_st))
        return true;
    for (size_t i = 0; i < kr->n; i++) {
        const kr_entry_t *e = &kr->e[i];
        sp_identity_t id;
        struct stat st;
        char path[4096];
        bool present;

        if (sp_identity_parse(e->name, &id) < 0 || id.kind != SP_KIND_PLATFORM)
            continue;
        snprintf(path, sizeof(path), "%s/%s.tenants", kr->dir, e->name);
        present = stat(path, &st) == 0;
        if (!present && errno != ENOENT)
            continue; /* unreadable now: reading it again would fail the same way */
        if (present != e->tenants_file || (present && !same_file(&st, &e->tenants_st)))
            return true;
    }
    return false;
}

/* ---- batch signatures ---- */

static const uint8_t sig_domain[15] = "SPACE-C sig v1"; /* and its NUL */

static void node_hash(const uint8_t left[SP_SIG_HASH_LEN], const uint8_t right[SP_SIG_HASH_LEN],
                      uint8_t out[SP_SIG_HASH_LEN])
{
    uint8_t b[1 + 2 * SP_SIG_HASH_LEN];
    b[0] = 0x01;
    memcpy(b + 1, left, SP_SIG_HASH_LEN);
    memcpy(b + 1 + SP_SIG_HASH_LEN, right, SP_SIG_HASH_LEN);
    sp_sha256(b, sizeof(b), out);
}

void sp_sig_leaf(const uint8_t *canonical, size_t len, uint8_t leaf[SP_SIG_HASH_LEN])
{
    sp_sha256_ctx_t *c = sp_sha256_new();
    const uint8_t zero = 0x00;
    sp_sha256_update(c, &zero, 1);
    sp_sha256_update(c, canonical, len);
    sp_sha256_final(c, leaf);
}

/* Called after each proof hash with the node reached, the walk's state (fn, sn) and the proof
 * bytes consumed: what is left of the walk is a function of exactly (node, fn, sn, the rest of
 * the proof). true stops the walk (the caller knows where that leads). */
typedef bool (*walk_step_fn)(void *arg, const uint8_t node[SP_SIG_HASH_LEN], uint32_t fn,
                             uint32_t sn, size_t off);

/* RFC 9162 2.1.3.2, verifying an inclusion proof: fn walks the leaf's index up the tree, sn
 * the last index; a level where the node is the last and has no right sibling (RFC 6962's
 * unbalanced right edge) consumes no proof hash. 1 when step stopped it (root not written). */
static int proof_walk(const uint8_t leaf[SP_SIG_HASH_LEN], uint32_t index, uint32_t count,
                      const uint8_t *proof, size_t plen, uint8_t root[SP_SIG_HASH_LEN],
                      walk_step_fn step, void *arg)
{
    uint8_t r[SP_SIG_HASH_LEN];
    uint32_t fn = index, sn;

    if (count == 0 || count > SP_SIG_BATCH_MAX || index >= count || plen > SP_SIG_PROOF_MAX ||
        plen % SP_SIG_HASH_LEN != 0 || (!proof && plen))
        return SP_ESIGNATURE;
    sn = count - 1;
    memcpy(r, leaf, SP_SIG_HASH_LEN);
    for (size_t off = 0; off < plen; off += SP_SIG_HASH_LEN) {
        const uint8_t *p = proof + off;
        if (sn == 0)
            return SP_ESIGNATURE; /* proof longer than the path */
        if ((fn & 1) || fn == sn) {
            node_hash(p, r, r);
            while (!(fn & 1) && fn != 0) {
                fn >>= 1;
                sn >>= 1;
            }
        } else {
            node_hash(r, p, r);
        }
        fn >>= 1;
        sn >>= 1;
        if (step && step(arg, r, fn, sn, off + SP_SIG_HASH_LEN))
            return 1;
    }
    if (sn != 0)
        return SP_ESIGNATURE; /* proof shorter than the path */
    memcpy(root, r, SP_SIG_HASH_LEN);
    return 0;
}

int sp_sig_proof_root(const uint8_t leaf[SP_SIG_HASH_LEN], uint32_t index, uint32_t count,
                      const uint8_t *proof, size_t plen, uint8_t root[SP_SIG_HASH_LEN])
{
    return proof_walk(leaf, index, count, proof, plen, root, NULL, NULL);
}

void sp_sig_message(uint32_t count, const uint8_t root[SP_SIG_HASH_LEN],
                    uint8_t msg[SP_SIG_MSG_LEN])
{
    memcpy(msg, sig_domain, sizeof(sig_domain));
    msg[15] = (uint8_t)(count >> 24);
    msg[16] = (uint8_t)(count >> 16);
    msg[17] = (uint8_t)(count >> 8);
    msg[18] = (uint8_t)count;
    memcpy(msg + 19, root, SP_SIG_HASH_LEN);
}

static const uint8_t list_domain[15] = "SPACE-C lst v1"; /* and its NUL */

void sp_sig_list_message(const uint8_t *leaves, uint32_t count, uint8_t msg[SP_SIG_MSG_LEN])
{
    memcpy(msg, list_domain, sizeof(list_domain));
    msg[15] = (uint8_t)(count >> 24);
    msg[16] = (uint8_t)(count >> 16);
    msg[17] = (uint8_t)(count >> 8);
    msg[18] = (uint8_t)count;
    sp_sha256(leaves, (size_t)count * SP_SIG_HASH_LEN, msg + 19);
}

int sp_envelope_leaf(const uint8_t *raw, size_t len, uint8_t leaf[SP_SIG_HASH_LEN])
{
    uint8_t *canon;
    size_t clen;
    int rc;

    if ((!raw && len) || len > SP_ENVELOPE_MAX)
        return len > SP_ENVELOPE_MAX ? SP_ETOOBIG : -EINVAL;
    /* The leaf's 0x00 prefix goes in front of the canonical bytes: one hash call. */
    canon = sp_xmalloc(len + 1);
    canon[0] = 0x00;
    rc = sp_envelope_canonical(raw, len, canon + 1, &clen);
    if (rc == 0)
        sp_sha256(canon, clen + 1, leaf);
    free(canon);
    return rc < 0 ? SP_EDECODE : 0;
}

void sp_sig_head_id(const sp_envelope_t *env, char out[37])
{
    out[0] = '\0';
    if (env && env->sig_head.len == 16)
        sp_uuid_format(env->sig_head.data, out);
}

int sp_sig_member_check(const sp_envelope_t *head, const sp_envelope_t *env,
                        const uint8_t leaf[SP_SIG_HASH_LEN])
{
    uint32_t n;

    if (!head || !env || !leaf)
        return -EINVAL;
    n = (uint32_t)(head->sig_leaves.len / SP_SIG_HASH_LEN);
    uint8_t head_id[16];
    if (n < 2 || env->sig_head.len != 16 || sp_uuid_parse(head->event_id, head_id) < 0 ||
        memcmp(env->sig_head.data, head_id, 16) != 0 || strcmp(env->signer, head->signer) != 0 ||
        env->sig_count != n || env->sig_index == 0 || env->sig_index >= n)
        return SP_ESIGNATURE;
    if (memcmp(head->sig_leaves.data + (size_t)env->sig_index * SP_SIG_HASH_LEN, leaf,
               SP_SIG_HASH_LEN) != 0)
        return SP_ESIGNATURE;
    return 0;
}

/* The tree, level by level: level 0 the leaves; a level's last node without a right sibling
 * moves up unchanged, which gives RFC 6962's Merkle Tree Hash (split at the largest power of
 * two below n) without recursion. */
typedef struct {
    uint8_t (*node)[SP_SIG_HASH_LEN]; /* all levels, level 0 first */
    size_t off[14], len[14];
    size_t levels;
} tree_t;

static void tree_build(tree_t *t, const uint8_t (*leaves)[SP_SIG_HASH_LEN], size_t n)
{
    size_t total = 0, m = n;

    t->levels = 0;
    for (;;) {
        t->off[t->levels] = total;
        t->len[t->levels] = m;
        t->levels++;
        total += m;
        if (m == 1)
            break;
        m = (m + 1) / 2;
    }
    t->node = sp_xcalloc(total, SP_SIG_HASH_LEN);
    memcpy(t->node, leaves, n * SP_SIG_HASH_LEN);
    for (size_t l = 1; l < t->levels; l++) {
        uint8_t(*below)[SP_SIG_HASH_LEN] = t->node + t->off[l - 1];
        uint8_t(*here)[SP_SIG_HASH_LEN] = t->node + t->off[l];
        for (size_t j = 0; j < t->len[l]; j++) {
            if (2 * j + 1 < t->len[l - 1])
                node_hash(below[2 * j], below[2 * j + 1], here[j]);
            else
                memcpy(here[j], below[2 * j], SP_SIG_HASH_LEN);
        }
    }
}

/* The inclusion path of leaf i (RFC 9162 2.1.3.1): the sibling at each level that has one. */
static size_t tree_proof(const tree_t *t, size_t i, uint8_t *out)
{
    size_t n = 0;
    for (size_t l = 0; l + 1 < t->levels; l++, i >>= 1) {
        size_t sib = i ^ 1;
        if (sib < t->len[l]) {
            memcpy(out + n, t->node[t->off[l] + sib], SP_SIG_HASH_LEN);
            n += SP_SIG_HASH_LEN;
        }
    }
    return n;
}

static const uint8_t *tree_root(const tree_t *t)
{
    return t->node[t->off[t->levels - 1]];
}

/* ---- signature cache ---- */

typedef struct {
    uint8_t key[SP_SHA256_LEN]; /* verified */
    bool used;
} cache_slot_t;

/* Keys being verified by one thread, which the others wait for: a set of their own, not the
 * slots, so that a signature that fails never evicts one that verified, and two keys of one
 * slot verified at once are both shared (with one pending key per slot, the second was
 * verified by every thread that met it: the pool test counted one Ed25519 too many, under
 * load). Full: a plain miss. */
#define CACHE_PENDING_MAX 128

/* An interior node a verified member's walk went through (the memo of verified nodes): the
 * node, the walk's state there, and the rest of that member's proof, under one signer key,
 * count and signature. Another member of the batch whose walk reaches the same node in the
 * same state with the same rest of proof would compute the same root, so its walk stops
 * there: ~2 node hashes per member instead of log2(count), and the acceptance is exactly the
 * full walk's (a member with any other proof bytes walks on and is judged by its own root). */
typedef struct {
    uint8_t node[SP_SIG_HASH_LEN];
    uint8_t pub[SP_PUBKEY_LEN];
    uint8_t sig[SP_SIG_LEN];
    uint32_t count, fn, sn;
    uint16_t rest_len;
    uint8_t rest[SP_SIG_PROOF_MAX];
    bool used;
} memo_slot_t;

#define MEMO_SLOTS_MAX 4096 /* ~0.5 KB each */

struct sp_sigcache {
    pthread_mutex_t mu;
    pthread_cond_t settled; /* a pending slot was settled */
    cache_slot_t *slot;
    size_t n;
    uint8_t pending[CACHE_PENDING_MAX][SP_SHA256_LEN];
    size_t n_pending;
    memo_slot_t *memo;
    size_t n_memo;
    uint64_t hits, verified;
};

int sp_sigcache_new(size_t slots, sp_sigcache_t **ret_cache)
{
    sp_sigcache_t *c;

    if (slots == 0 || slots > 65536 || !ret_cache)
        return -EINVAL;
    c = sp_xcalloc(1, sizeof(*c));
    c->slot = sp_xcalloc(slots, sizeof(*c->slot));
    c->n = slots;
    c->n_memo = slots < MEMO_SLOTS_MAX ? slots : MEMO_SLOTS_MAX;
    c->memo = sp_xcalloc(c->n_memo, sizeof(*c->memo));
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->settled, NULL);
    *ret_cache = c;
    return 0;
}

void sp_sigcache_free(sp_sigcache_t *c)
{
    if (!c)
        return;
    pthread_cond_destroy(&c->settled);
    pthread_mutex_destroy(&c->mu);
    free(c->memo);
    free(c->slot);
    free(c);
}

void sp_sigcache_stats(const sp_sigcache_t *c, uint64_t *ret_hits, uint64_t *ret_verified)
{
    /* Read without the lock: counters for logs, a torn read is harmless. */
    if (ret_hits)
        *ret_hits = c ? c->hits : 0;
    if (ret_verified)
        *ret_verified = c ? c->verified : 0;
}

/* The entry's key: one hash over everything the verification depended on. */
static void cache_key(const uint8_t pub[SP_PUBKEY_LEN], const uint8_t msg[SP_SIG_MSG_LEN],
                      const uint8_t sig[SP_SIG_LEN], uint8_t key[SP_SHA256_LEN])
{
    uint8_t b[SP_PUBKEY_LEN + SP_SIG_MSG_LEN + SP_SIG_LEN];
    memcpy(b, pub, SP_PUBKEY_LEN);
    memcpy(b + SP_PUBKEY_LEN, msg, SP_SIG_MSG_LEN);
    memcpy(b + SP_PUBKEY_LEN + SP_SIG_MSG_LEN, sig, SP_SIG_LEN);
    sp_sha256(b, sizeof(b), key);
}

static size_t cache_index(const sp_sigcache_t *c, const uint8_t key[SP_SHA256_LEN])
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | key[i];
    return (size_t)(v % c->n);
}

typedef enum { CACHE_HIT, CACHE_CLAIMED, CACHE_MISS } cache_result_t;

/* A hit, or the right to verify key and settle it (CACHE_CLAIMED), or, when the slot is being
 * verified for another key, a plain miss. A key another thread is verifying is waited for:
 * the members of one batch verified on several threads at once cost one Ed25519 between
 * them. When that verification fails, the waiter verifies again itself (and fails too): only
 * successes are ever shared. */
/* Under mu: where key is in the pending set, or n_pending. */
static size_t pending_find(const sp_sigcache_t *c, const uint8_t key[SP_SHA256_LEN])
{
    size_t i = 0;
    while (i < c->n_pending && memcmp(c->pending[i], key, SP_SHA256_LEN) != 0)
        i++;
    return i;
}

static cache_result_t cache_lookup(sp_sigcache_t *c, const uint8_t key[SP_SHA256_LEN])
{
    cache_slot_t *s = &c->slot[cache_index(c, key)];
    cache_result_t r;

    pthread_mutex_lock(&c->mu);
    while (pending_find(c, key) < c->n_pending)
        pthread_cond_wait(&c->settled, &c->mu);
    if (s->used && memcmp(s->key, key, SP_SHA256_LEN) == 0) {
        c->hits++;
        r = CACHE_HIT;
    } else if (c->n_pending == CACHE_PENDING_MAX) {
        r = CACHE_MISS;
    } else {
        memcpy(c->pending[c->n_pending++], key, SP_SHA256_LEN);
        r = CACHE_CLAIMED;
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* Whether key is cached, without waiting for a claim or making one (a retired key's
 * signature: looked for before the current key is tried, so that the members of a batch
 * signed with it cost no failed verification by the current key each). */
static bool cache_peek(sp_sigcache_t *c, const uint8_t key[SP_SHA256_LEN])
{
    const cache_slot_t *s = &c->slot[cache_index(c, key)];
    bool hit;

    pthread_mutex_lock(&c->mu);
    hit = s->used && memcmp(s->key, key, SP_SHA256_LEN) == 0;
    if (hit)
        c->hits++;
    pthread_mutex_unlock(&c->mu);
    return hit;
}

/* The end of a verification of key, claimed (r) or not: a success goes into its slot, and a
 * claim is released either way. */
static void cache_settle(sp_sigcache_t *c, const uint8_t key[SP_SHA256_LEN], cache_result_t r,
                         bool ok)
{
    cache_slot_t *s = &c->slot[cache_index(c, key)];

    pthread_mutex_lock(&c->mu);
    if (ok) {
        memcpy(s->key, key, SP_SHA256_LEN);
        s->used = true;
        c->verified++;
    }
    if (r == CACHE_CLAIMED) {
        size_t i = pending_find(c, key);
        if (i < c->n_pending && i != --c->n_pending)
            memcpy(c->pending[i], c->pending[c->n_pending], SP_SHA256_LEN);
        pthread_cond_broadcast(&c->settled);
    }
    pthread_mutex_unlock(&c->mu);
}

/* A member's walk as the memo sees it: the steps it computed, to be remembered once the member
 * is verified. */
typedef struct {
    sp_sigcache_t *c;
    const uint8_t *pub, *sig, *proof;
    size_t plen;
    uint32_t count;
    size_t n_steps;
    struct {
        uint8_t node[SP_SIG_HASH_LEN];
        uint32_t fn, sn;
        size_t off;
    } step[SP_SIG_PROOF_MAX / SP_SIG_HASH_LEN];
} memo_walk_t;

static memo_slot_t *memo_slot(const sp_sigcache_t *c, const uint8_t node[SP_SIG_HASH_LEN])
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | node[i];
    return &c->memo[v % c->n_memo];
}

static bool memo_step(void *arg, const uint8_t node[SP_SIG_HASH_LEN], uint32_t fn, uint32_t sn,
                      size_t off)
{
    memo_walk_t *w = arg;
    const memo_slot_t *m = memo_slot(w->c, node);
    size_t rest = w->plen - off;
    bool hit;

    pthread_mutex_lock(&w->c->mu);
    hit = m->used && m->fn == fn && m->sn == sn && m->count == w->count && m->rest_len == rest &&
          memcmp(m->node, node, SP_SIG_HASH_LEN) == 0 &&
          memcmp(m->pub, w->pub, SP_PUBKEY_LEN) == 0 && memcmp(m->sig, w->sig, SP_SIG_LEN) == 0 &&
          memcmp(m->rest, w->proof + off, rest) == 0;
    if (hit)
        w->c->hits++;
    pthread_mutex_unlock(&w->c->mu);
    if (!hit && w->n_steps < sizeof(w->step) / sizeof(w->step[0])) {
        memcpy(w->step[w->n_steps].node, node, SP_SIG_HASH_LEN);
        w->step[w->n_steps].fn = fn;
        w->step[w->n_steps].sn = sn;
        w->step[w->n_steps].off = off;
        w->n_steps++;
    }
    return hit;
}

/* The verified member's steps into the memo. The root itself (sn == 0) is not remembered: a
 * walk that gets there has no proof left to compare and goes to the signature cache. */
static void memo_remember(const memo_walk_t *w)
{
    pthread_mutex_lock(&w->c->mu);
    for (size_t i = 0; i < w->n_steps; i++) {
        memo_slot_t *m = memo_slot(w->c, w->step[i].node);
        size_t rest = w->plen - w->step[i].off;
        if (w->step[i].sn == 0)
            continue;
        memcpy(m->node, w->step[i].node, SP_SIG_HASH_LEN);
        memcpy(m->pub, w->pub, SP_PUBKEY_LEN);
        memcpy(m->sig, w->sig, SP_SIG_LEN);
        m->count = w->count;
        m->fn = w->step[i].fn;
        m->sn = w->step[i].sn;
        m->rest_len = (uint16_t)rest;
        memcpy(m->rest, w->proof + w->step[i].off, rest);
        m->used = true;
    }
    pthread_mutex_unlock(&w->c->mu);
}

/* ---- envelopes ---- */

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* env as signer will sign it: its signer set, every signature field (11-16) cleared. The
 * generated struct has no const; the envelope never writes through signer. */
static void unsigned_as(sp_envelope_t *env, const char *signer)
{
    env->signer = (char *)signer;
    env->signature.data = NULL;
    env->signature.len = 0;
    env->sig_proof.data = NULL;
    env->sig_proof.len = 0;
    env->sig_index = 0;
    env->sig_count = 0;
    env->sig_leaves.data = NULL;
    env->sig_leaves.len = 0;
    env->sig_head.data = NULL;
    env->sig_head.len = 0;
}

/* The end of a batch encoder: on success (rc 0) the n encodings are handed to ret_bufs and
 * ret_lens, otherwise freed (bufs[i] not yet made are NULL); the arrays go either way. */
static void encoded_finish(uint8_t **bufs, size_t *lens, size_t n, int rc, uint8_t **ret_bufs,
                           size_t *ret_lens)
{
    for (size_t i = 0; i < n; i++) {
        if (rc == 0) {
            ret_bufs[i] = bufs[i];
            ret_lens[i] = lens[i];
        } else {
            free(bufs[i]);
        }
    }
    free(bufs);
    free(lens);
}

/* Most that a headed batch of n adds to member i: the head's signature, count and list; a
 * member's index, count and head id (keys, lengths and varints included). */
static size_t headed_trailer_max(size_t i, size_t n)
{
    return i == 0 ? SP_SIG_FIELD_LEN + 6 + 1 + 5 + n * SP_SIG_HASH_LEN : 6 + 6 + 3 + 16;
}

int sp_envelope_encode_signed_batch(sp_envelope_t *const *envs, size_t n, const char *signer,
                                    const sp_sign_key_t *key, uint8_t **ret_bufs, size_t *ret_lens)
{
    uint8_t(*leaves)[SP_SIG_HASH_LEN] = NULL;
    uint8_t msg[SP_SIG_MSG_LEN], sig[SP_SIG_LEN], proof[SP_SIG_PROOF_MAX];
    uint8_t **bufs = NULL;
    size_t *lens = NULL;
    tree_t tree = {0};
    int rc = 0;

    if (!envs || n == 0 || n > SP_SIG_BATCH_MAX || !signer || !key || !ret_bufs || !ret_lens)
        return -EINVAL;
    bufs = sp_xcalloc(n, sizeof(*bufs));
    lens = sp_xcalloc(n, sizeof(*lens));
    leaves = sp_xcalloc(n, sizeof(*leaves));
    for (size_t i = 0; i < n; i++) {
        sp_envelope_t *env = envs[i];
        if (!env) {
            rc = -EINVAL;
            goto out;
        }
        unsigned_as(env, signer);
        if ((rc = sp_envelope_encode(env, &bufs[i], &lens[i])) < 0)
            goto out;
        if (lens[i] + (n == 1 ? SP_SIG_FIELD_LEN : SP_SIG_TRAILER_MAX) > SP_ENVELOPE_MAX) {
            rc = SP_ETOOBIG;
            goto out;
        }
        /* The encoding is the canonical bytes: nothing of fields 11-14 is in it. */
        sp_sig_leaf(bufs[i], lens[i], leaves[i]);
    }
    tree_build(&tree, (const uint8_t(*)[SP_SIG_HASH_LEN])leaves, n);
    sp_sig_message((uint32_t)n, tree_root(&tree), msg);
    if ((rc = sp_sign(key, msg, sizeof(msg), sig)) < 0)
        goto out;

    /* Fields 11-14 go last (protobuf allows any order), so the bytes before them are exactly
     * the canonical bytes. */
    for (size_t i = 0; i < n; i++) {
        size_t plen = tree_proof(&tree, i, proof), k = lens[i];
        uint8_t *b = sp_xrealloc(bufs[i], k + SP_SIG_TRAILER_MAX);

        b[k++] = (11 << 3) | 2;
        b[k++] = SP_SIG_LEN;
        memcpy(b + k, sig, SP_SIG_LEN);
        k += SP_SIG_LEN;
        if (n > 1) {
            b[k++] = (12 << 3) | 2;
            k += put_varint(b + k, plen);
            memcpy(b + k, proof, plen);
            k += plen;
            if (i > 0) {
                b[k++] = (13 << 3) | 0;
                k += put_varint(b + k, i);
            }
            b[k++] = (14 << 3) | 0;
            k += put_varint(b + k, n);
        }
        bufs[i] = b;
        lens[i] = k;
    }
out:
    encoded_finish(bufs, lens, n, rc, ret_bufs, ret_lens);
    free(leaves);
    free(tree.node);
    return rc;
}

int sp_envelope_encode_signed(sp_envelope_t *env, const char *signer, const sp_sign_key_t *key,
                              uint8_t **ret_buf, size_t *ret_len)
{
    if (!env || !ret_buf || !ret_len)
        return -EINVAL;
    return sp_envelope_encode_signed_batch(&env, 1, signer, key, ret_buf, ret_len);
}

int sp_envelope_encode_signed_headed(sp_envelope_t *const *envs, size_t n, const char *signer,
                                     const sp_sign_key_t *key, uint8_t **ret_bufs, size_t *ret_lens)
{
    uint8_t(*leaves)[SP_SIG_HASH_LEN] = NULL;
    uint8_t msg[SP_SIG_MSG_LEN], sig[SP_SIG_LEN];
    uint8_t **bufs = NULL;
    size_t *lens = NULL;
    uint8_t head_uuid[16];
    int rc = 0;

    if (!envs || n < 2 || n > SP_SIG_BATCH_MAX || !signer || !key || !ret_bufs || !ret_lens ||
        !envs[0] || !envs[0]->event_id || strlen(envs[0]->event_id) != 36)
        return -EINVAL;
    if (sp_uuid_parse(envs[0]->event_id, head_uuid) < 0)
        return -EINVAL;
    bufs = sp_xcalloc(n, sizeof(*bufs));
    lens = sp_xcalloc(n, sizeof(*lens));
    leaves = sp_xcalloc(n, sizeof(*leaves));
    for (size_t i = 0; i < n; i++) {
        sp_envelope_t *env = envs[i];
        if (!env) {
            rc = -EINVAL;
            goto out;
        }
        unsigned_as(env, signer);
        if ((rc = sp_envelope_encode(env, &bufs[i], &lens[i])) < 0)
            goto out;
        if (lens[i] + headed_trailer_max(i, n) > SP_ENVELOPE_MAX) {
            rc = SP_ETOOBIG;
            goto out;
        }
        sp_sig_leaf(bufs[i], lens[i], leaves[i]);
    }
    sp_sig_list_message((const uint8_t *)leaves, (uint32_t)n, msg);
    if ((rc = sp_sign(key, msg, sizeof(msg), sig)) < 0)
        goto out;
    /* Fields 11-16 go last, after the canonical bytes (as in a Merkle batch). */
    for (size_t i = 0; i < n; i++) {
        size_t k = lens[i];
        uint8_t *b = sp_xrealloc(bufs[i], k + headed_trailer_max(i, n));
        if (i == 0) {
            b[k++] = (11 << 3) | 2;
            b[k++] = SP_SIG_LEN;
            memcpy(b + k, sig, SP_SIG_LEN);
            k += SP_SIG_LEN;
            b[k++] = (14 << 3) | 0;
            k += put_varint(b + k, n);
            b[k++] = (15 << 3) | 2;
            k += put_varint(b + k, n * SP_SIG_HASH_LEN);
            memcpy(b + k, leaves, n * SP_SIG_HASH_LEN);
            k += n * SP_SIG_HASH_LEN;
        } else {
            b[k++] = (13 << 3) | 0;
            k += put_varint(b + k, i);
            b[k++] = (14 << 3) | 0;
            k += put_varint(b + k, n);
            k += put_varint(b + k, (16 << 3) | 2); /* two bytes: field 16 */
            b[k++] = 16;
            memcpy(b + k, head_uuid, 16);
            k += 16;
        }
        bufs[i] = b;
        lens[i] = k;
    }
out:
    encoded_finish(bufs, lens, n, rc, ret_bufs, ret_lens);
    free(leaves);
    return rc;
}

/* One key's Ed25519 verification of msg through the cache: a hit, or a verification that
 * settles its claim on every path (other threads may be waiting for it). */
static int verify_cached(sp_sigcache_t *cache, const uint8_t pub[SP_PUBKEY_LEN],
                         const uint8_t msg[SP_SIG_MSG_LEN], const uint8_t sig[SP_SIG_LEN])
{
    uint8_t ckey[SP_SHA256_LEN];
    cache_result_t cr = CACHE_MISS;
    int rc;

    if (cache) {
        cache_key(pub, msg, sig, ckey);
        if ((cr = cache_lookup(cache, ckey)) == CACHE_HIT)
            return 0;
    }
    rc = verify_pub(pub, msg, SP_SIG_MSG_LEN, sig);
    if (cache)
        cache_settle(cache, ckey, cr, rc == 0);
    return rc;
}

/* The signer's retired keys that count for a message published at at_ns, at most max of them:
 * first the one retired next after at_ns (the key that was current then), then later ones. */
static size_t retired_valid(const kr_entry_t *e, int64_t at_ns, const kr_retired_t **out,
                            size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < e->n_retired && n < max; i++)
        if (e->retired[i].until_ns > at_ns)
            out[n++] = &e->retired[i];
    return n;
}

/* Ed25519 of msg by e's keys that count at at_ns: a retired key's verdict already cached, then
 * the current key, then the retired ones (sp_envelope_verify). 1: verified by the current key,
 * 0: by a retired one, < 0 (SP_ESIGNATURE, -ENOMEM) otherwise. */
static int verify_message(const kr_entry_t *e, sp_sigcache_t *cache,
                          const uint8_t msg[SP_SIG_MSG_LEN], const uint8_t sig[SP_SIG_LEN],
                          int64_t at_ns)
{
    /* Most retired keys tried for one message, those retired soonest after it first: the key
     * that signed a message is the one retired next after it was published, unless the
     * signer's daemon ran on with an older one through several rotations. */
    const kr_retired_t *old[8];
    uint8_t ckey[SP_SHA256_LEN];
    size_t n_old = retired_valid(e, at_ns ? at_ns : now_ns(), old, sizeof(old) / sizeof(old[0]));
    int rc;

    for (size_t i = 0; cache && i < n_old; i++) {
        cache_key(old[i]->pub, msg, sig, ckey);
        if (cache_peek(cache, ckey))
            return 0;
    }
    rc = SP_ESIGNATURE;
    if (e->has_key && (rc = verify_cached(cache, e->pub, msg, sig)) == 0)
        return 1;
    for (size_t i = 0; rc == SP_ESIGNATURE && i < n_old; i++)
        rc = verify_cached(cache, old[i]->pub, msg, sig);
    if (rc < 0)
        return rc == -ENOMEM ? rc : SP_ESIGNATURE;
    return 0;
}

int sp_envelope_verify(const sp_keyring_t *kr, sp_sigcache_t *cache, const sp_envelope_t *env,
                       const uint8_t *raw, size_t len, int64_t at_ns)
{
    uint8_t leaf[SP_SIG_HASH_LEN], root[SP_SIG_HASH_LEN], msg[SP_SIG_MSG_LEN];
    const kr_entry_t *e;
    uint32_t count;
    int rc;

    if (!env || (!raw && len))
        return -EINVAL;
    if (!env->signer || !env->signer[0] || (env->signature.len == 0 && env->sig_head.len == 0))
        return SP_EUNSIGNED;
    if (!(e = find(kr, env->signer)))
        return SP_ESIGNER;
    if (env->signature.len == 0)
        return SP_EHEADED; /* only its head can say (sp_sig_member_check) */
    if (env->signature.len != SP_SIG_LEN)
        return SP_ESIGNATURE;
    if ((rc = sp_envelope_leaf(raw, len, leaf)) < 0)
        return rc == SP_ETOOBIG ? rc : SP_EDECODE;
    count = env->sig_count ? env->sig_count : 1;
    if (env->sig_leaves.len) {
        /* A headed batch's head: its own leaf first in the list it signs. */
        if (env->sig_leaves.len != (size_t)count * SP_SIG_HASH_LEN || count < 2 ||
            env->sig_index != 0 || env->sig_proof.len ||
            memcmp(env->sig_leaves.data, leaf, SP_SIG_HASH_LEN) != 0)
            return SP_ESIGNATURE;
        sp_sig_list_message(env->sig_leaves.data, count, msg);
        rc = verify_message(e, cache, msg, env->signature.data, at_ns);
        return rc < 0 ? rc : 0;
    }
    /* The memo holds walks verified under the current key only. */
    memo_walk_t w = {.c = cache,
                     .pub = e->pub,
                     .sig = env->signature.data,
                     .proof = env->sig_proof.data,
                     .plen = env->sig_proof.len,
                     .count = count};
    rc = proof_walk(leaf, env->sig_index, count, env->sig_proof.data, env->sig_proof.len, root,
                    cache && count > 1 && e->has_key ? memo_step : NULL, &w);
    if (rc < 0)
        return SP_ESIGNATURE;
    if (rc == 1) {
        memo_remember(&w); /* the nodes below the one it stopped at */
        return 0;
    }
    sp_sig_message(count, root, msg);
    rc = verify_message(e, cache, msg, env->signature.data, at_ns);
    if (rc == 1 && cache && count > 1)
        memo_remember(&w);
    return rc < 0 ? rc : 0;
}
