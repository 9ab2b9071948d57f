/* The deployment CA (docs/egress.md): an ECDSA P-256 key and a self-signed CA certificate that
 * `space up` makes once per stack, and leaf certificates minted from it for one DNS name at a
 * time, which space-egressd will present when it terminates a sandbox's TLS. OpenSSL 3 API
 * only (no `openssl` process). Library code: nothing here logs; errors carry a one-line reason
 * in err (SP_CA_ERR_MAX). The CA key never leaves the process that loaded it. */
#ifndef SPACE_TLSCA_H
#define SPACE_TLSCA_H

#include <openssl/evp.h>
#include <openssl/x509.h>

#define SP_CA_ERR_MAX   256
#define SP_CA_CERT_FILE "ca.crt" /* PEM, 0644: what templates and clients trust */
#define SP_CA_KEY_FILE  "ca.key" /* PEM, 0600 */

/* Makes dir/ca.key and dir/ca.crt unless both exist (then only checks they load and match).
 * Each file is written under a temporary name and renamed, the key first. 0 or < 0. */
int sp_ca_ensure(const char *dir, const char *common_name, char err[SP_CA_ERR_MAX]);

typedef struct sp_ca sp_ca_t;
/* Loads a CA certificate and its key (they must match, and the certificate must be a CA). */
int sp_ca_load(const char *cert_path, const char *key_path, sp_ca_t **ret_ca,
               char err[SP_CA_ERR_MAX]);
/* Wipes and frees; accepts NULL. */
void sp_ca_free(sp_ca_t *ca);
/* The CA certificate (borrowed: lives as long as ca). */
X509 *sp_ca_cert(const sp_ca_t *ca);

/* A leaf for name (a DNS name, netpolicy.h): fresh P-256 key, subjectAltName DNS:name, CN name,
 * serverAuth, valid from an hour ago for `days` days (1..397), a random 128-bit serial, signed
 * by the CA. The caller owns *ret_cert and *ret_key. */
int sp_ca_mint(sp_ca_t *ca, const char *name, unsigned days, X509 **ret_cert, EVP_PKEY **ret_key,
               char err[SP_CA_ERR_MAX]);

#endif
