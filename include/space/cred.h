/* Credentials (docs/credentials.md): what space-credstore, space-egressd and the gateway
 * share. Sealing under the master key (AES-256-GCM, OpenSSL EVP), the master key file, the
 * syntax of a credential's names, hosts and values, and the subjects credstore answers on.
 *
 * Nothing here logs; no function puts a value into an error string. Buffers that held a
 * value are wiped (explicit_bzero) by whoever owns them. */
#ifndef SPACE_CRED_H
#define SPACE_CRED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The subjects (proto/credstore.proto), built only here so that the bus-trust work can put
 * permissions on them: admin (gateway -> credstore), lookup (egressd -> credstore),
 * changed (credstore -> egressd), and the events' space.ev.cred.<tenant>.<type>. */
#define SP_CRED_SUBJECT_ADMIN   "space.io.cred.admin"
#define SP_CRED_SUBJECT_LOOKUP  "space.io.cred.lookup"
#define SP_CRED_SUBJECT_CHANGED "space.io.cred.changed"
#define SP_CRED_SUBJECT_DATAKEY "space.io.cred.datakey" /* worker -> credstore (datakey.h) */
#define SP_CRED_QUEUE           "credstore"

#define SP_CRED_KEY_LEN     32
#define SP_CRED_NONCE_LEN   12
#define SP_CRED_TAG_LEN     16
#define SP_CRED_VALUE_MAX   4096
#define SP_CRED_NAME_MAX    64
#define SP_CRED_HOSTS_MAX   32
#define SP_CRED_HOST_MAX    300
#define SP_CRED_RATE_MAX    1000000 /* requests per minute */
#define SP_CRED_PLACEHOLDER "space-cred:"
#define SP_CRED_KEY_ID_LEN  16 /* hex characters */

/* A master key and its fingerprint (the first 8 bytes of SHA-256 of the key, hex), which
 * names it in rows and events without revealing it. */
typedef struct {
    uint8_t k[SP_CRED_KEY_LEN];
    char id[SP_CRED_KEY_ID_LEN + 1];
} sp_cred_key_t;

/* Reads a master key file: exactly 32 bytes, a regular file, mode 0600 or stricter (readable
 * by nobody but its owner). -EPERM (mode), -EINVAL (size), -errno. */
int sp_cred_key_load(const char *path, sp_cred_key_t *ret_key);
/* Creates path with 32 random bytes, mode 0600, failing if it exists (-EEXIST). */
int sp_cred_key_create(const char *path);
/* Wipes the key. */
void sp_cred_key_wipe(sp_cred_key_t *key);

/* The additional data a credential's value is sealed with: its id and version, so a
 * ciphertext moved to another row or replayed as an older version does not open. out holds
 * at least 96 bytes; returns the length. */
size_t sp_cred_aad(const char *id, uint32_t version, uint8_t *out);

/* AES-256-GCM with a fresh random 96-bit nonce: ret_ct gets len + SP_CRED_TAG_LEN bytes
 * (ciphertext, then the tag). 0, or -EIO (OpenSSL failed). */
int sp_cred_seal(const sp_cred_key_t *key, const uint8_t *aad, size_t aad_len, const uint8_t *pt,
                 size_t len, uint8_t ret_nonce[SP_CRED_NONCE_LEN], uint8_t *ret_ct);
/* The reverse: ret_pt gets ct_len - SP_CRED_TAG_LEN bytes. -EBADMSG when the tag does not
 * verify (tampered, another key, another id or version); then ret_pt is wiped. */
int sp_cred_open(const sp_cred_key_t *key, const uint8_t *aad, size_t aad_len,
                 const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *ct, size_t ct_len,
                 uint8_t *ret_pt);

/* A credential's name (and what follows "space-cred:" in a placeholder): 1..64 of
 * [A-Za-z0-9_.-], starting with a letter or digit. */
bool sp_cred_name_valid(const char *s, size_t len);
/* A value that can go into a header or a query string as it is: 1..SP_CRED_VALUE_MAX bytes
 * of visible ASCII and spaces (0x20..0x7e), no leading or trailing space. So no CR, LF or
 * NUL: an injected value can never add a header line (RFC 9110 5.5). */
bool sp_cred_value_valid(const uint8_t *v, size_t len);
/* A header name (RFC 9110 5.1 token), at most 64 bytes; a query parameter name: 1..64 of
 * [A-Za-z0-9_.-]; a basic-auth user: like a value, without ':' (RFC 7617 2). */
bool sp_cred_header_name_valid(const char *s);
bool sp_cred_param_name_valid(const char *s);
bool sp_cred_user_valid(const char *s);

/* A host entry: "[METHOD[,METHOD...] ]name[/path-prefix]", e.g. "api.example.com",
 * "*.example.com" (strictly below), "GET,POST api.example.com/v1/". */
#define SP_CRED_METHODS_MAX 8
typedef struct {
    char name[254]; /* lowercase; for a wildcard, the suffix after "*." */
    bool wildcard;
    char path[256]; /* "" = any path; else a prefix starting with '/' */
    char methods[SP_CRED_METHODS_MAX][16];
    size_t n_methods; /* 0 = any method */
} sp_cred_host_t;

/* 0 or -EINVAL. */
int sp_cred_host_parse(const char *s, sp_cred_host_t *ret);
/* Whether the entry's name covers host (lowercase). */
bool sp_cred_host_covers(const sp_cred_host_t *h, const char *host);
/* Whether the entry allows method and path (the path of the request target, without its
 * query string). */
bool sp_cred_host_allows(const sp_cred_host_t *h, const char *method, const char *path,
                         size_t path_len);

typedef enum {
    SP_CRED_HEADER = 1,
    SP_CRED_BEARER,
    SP_CRED_BASIC,
    SP_CRED_QUERY,
} sp_cred_inject_t;

/* "header", "bearer", "basic", "query" -> the type; 0 when unknown. */
sp_cred_inject_t sp_cred_inject_parse(const char *s);
const char *sp_cred_inject_name(sp_cred_inject_t t);

/* Scopes, nearest first: a sandbox's credential beats its project's, which beats its
 * tenant's. Ranks 0 (sandbox), 1 (project), 2 (tenant); -1 for anything else. */
int sp_cred_scope_rank(const char *kind);

#endif
