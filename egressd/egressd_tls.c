/* TLS for the proxy (docs/egress.md): the deployment CA, leaf certificates minted per name
 * and cached, the server context a sandbox's TLS is terminated with, and the client context
 * egressd's own upstream connections verify the real site with.
 *
 * Keys: the CA key is loaded once from ca_key (0600, $SPACE_HOME/ca by default) and lives in
 * this process only; leaf keys live in the cache until they are evicted. Nothing here logs a
 * key, a certificate body or a secret; the log gets names, counts and OpenSSL's reasons.
 *
 * The upstream bundle (upstream_ca_file, or OpenSSL's default paths when empty) is re-read when
 * its modification time changes, checked before each upstream handshake: an operator (or a
 * test) can replace it without restarting egressd, and a bundle that does not load yet fails
 * closed (no upstream TLS) instead of falling back to anything else. */
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "egressd.h"
#include "error.h"
#include "log.h"
#include "tlsca.h"
#include "xmalloc.h"

typedef struct {
    char name[254];
    X509 *cert;
    EVP_PKEY *key;
    int64_t refresh_ms; /* minted again after this (a day before it expires) */
} leaf_t;

struct eg_tls {
    sp_ca_t *ca;
    SSL_CTX *server;
    SSL_CTX *upstream;
    struct timespec upstream_mtime;
    leaf_t *leaves;
    size_t n_leaves;
    uint64_t minted, hits;
};

/* RFC 7301: the only protocol the request parser understands. A client that offers ALPN
 * without http/1.1 (h2 only, or something else) gets no_application_protocol. */
static const unsigned char ALPN_HTTP11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    unsigned char *sel = NULL;
    if (SSL_select_next_proto(&sel, outlen, ALPN_HTTP11, sizeof(ALPN_HTTP11), in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

static SSL_CTX *server_ctx(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx)
        return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* No renegotiation (a second handshake could change what was checked), no session
     * tickets or cache: each connection is checked from its own ClientHello. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
    return ctx;
}

static SSL_CTX *upstream_ctx(const char *ca_file, char *why, size_t why_len)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(why, why_len, "SSL_CTX_new failed");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    int ok = ca_file[0] ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
                        : SSL_CTX_set_default_verify_paths(ctx);
    if (ok != 1) {
        unsigned long e = ERR_peek_last_error();
        snprintf(why, why_len, "cannot load %s: %s", ca_file[0] ? ca_file : "the default paths",
                 e ? ERR_reason_error_string(e) : "unknown");
        ERR_clear_error();
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* The upstream context, (re)built when the bundle's mtime changed. NULL: no upstream TLS. */
static SSL_CTX *upstream_current(eg_t *eg)
{
    eg_tls_t *t = eg->tls;
    const char *file = eg->cfg->upstream_ca_file;
    struct timespec mt = {0};
    if (file[0]) {
        struct stat st;
        if (stat(file, &st) < 0) {
            if (t->upstream) {
                sp_log(SP_LOG_WARN, "upstream CA bundle gone: upstream TLS refused",
                       SP_KS("file", file), SP_KS("error", strerror(errno)));
                SSL_CTX_free(t->upstream);
                t->upstream = NULL;
            }
            return NULL;
        }
        mt = st.st_mtim;
        if (t->upstream && mt.tv_sec == t->upstream_mtime.tv_sec &&
            mt.tv_nsec == t->upstream_mtime.tv_nsec)
            return t->upstream;
    } else if (t->upstream) {
        return t->upstream;
    }
    char why[256] = "";
    SSL_CTX *ctx = upstream_ctx(file, why, sizeof(why));
    if (!ctx) {
        sp_log(SP_LOG_WARN, "upstream CA bundle does not load: upstream TLS refused",
               SP_KS("error", why));
        return t->upstream; /* the previous bundle, if any, stays in force */
    }
    SSL_CTX_free(t->upstream);
    t->upstream = ctx;
    t->upstream_mtime = mt;
    sp_log(SP_LOG_INFO, "upstream CA bundle loaded", SP_KS("file", file[0] ? file : "default"));
    return ctx;
}

int eg_tls_start(eg_t *eg)
{
    const eg_config_t *cfg = eg->cfg;
    eg_tls_t *t = sp_xcalloc(1, sizeof(*t));
    eg->tls = t;
    t->server = server_ctx();
    if (!t->server)
        return -ENOMEM;
    if (cfg->ca_cert[0]) {
        char err[SP_CA_ERR_MAX] = "";
        int rc = sp_ca_load(cfg->ca_cert, cfg->ca_key, &t->ca, err);
        if (rc < 0) {
            sp_log(SP_LOG_ERROR, "cannot load the deployment CA", SP_KS("error", err));
            return rc;
        }
    } else {
        sp_log(SP_LOG_WARN, "no deployment CA (ca-cert empty, no SPACE_HOME): every TLS "
                            "connection is refused (no_ca)");
    }
    (void)upstream_current(eg); /* reports a bad bundle at start; retried per connection */
    return 0;
}

void eg_tls_stop(eg_t *eg)
{
    eg_tls_t *t = eg->tls;
    if (!t)
        return;
    for (size_t i = 0; i < t->n_leaves; i++) {
        X509_free(t->leaves[i].cert);
        EVP_PKEY_free(t->leaves[i].key);
    }
    free(t->leaves);
    SSL_CTX_free(t->server);
    SSL_CTX_free(t->upstream);
    sp_ca_free(t->ca);
    sp_log(SP_LOG_INFO, "tls stats", SP_KU("leaves_minted", t->minted),
           SP_KU("leaf_hits", t->hits));
    free(t);
    eg->tls = NULL;
}

bool eg_tls_can_terminate(const eg_t *eg)
{
    return eg->tls && eg->tls->ca;
}

/* The cached leaf for name, minted when missing or due. NULL on failure (why set). */
static leaf_t *leaf_for(eg_t *eg, const char *name, const char **why)
{
    eg_tls_t *t = eg->tls;
    int64_t now = eg_now_ms();
    leaf_t *slot = NULL;
    for (size_t i = 0; i < t->n_leaves; i++) {
        if (strcmp(t->leaves[i].name, name) == 0) {
            if (t->leaves[i].refresh_ms > now) {
                t->hits++;
                return &t->leaves[i];
            }
            slot = &t->leaves[i];
            break;
        }
    }
    if (!slot) {
        if (t->n_leaves < (size_t)eg->cfg->leaf_cache_max) {
            if (!t->leaves)
                t->leaves = sp_xcalloc((size_t)eg->cfg->leaf_cache_max, sizeof(*t->leaves));
            slot = &t->leaves[t->n_leaves++];
        } else {
            /* Full: the entry due soonest makes room (it would be minted again first anyway). */
            slot = &t->leaves[0];
            for (size_t i = 1; i < t->n_leaves; i++)
                if (t->leaves[i].refresh_ms < slot->refresh_ms)
                    slot = &t->leaves[i];
        }
    }
    X509 *cert = NULL;
    EVP_PKEY *key = NULL;
    char err[SP_CA_ERR_MAX] = "";
    unsigned days = (unsigned)eg->cfg->leaf_days;
    if (sp_ca_mint(t->ca, name, days, &cert, &key, err) < 0) {
        sp_log(SP_LOG_WARN, "cannot mint a leaf", SP_KS("name", name), SP_KS("error", err));
        *why = "leaf_mint_failed";
        if (slot->cert == NULL) { /* a new slot that stays empty: give it back */
            slot->name[0] = '\0';
            slot->refresh_ms = 0;
        }
        return NULL;
    }
    X509_free(slot->cert);
    EVP_PKEY_free(slot->key);
    snprintf(slot->name, sizeof(slot->name), "%s", name);
    slot->cert = cert;
    slot->key = key;
    /* sp_ca_mint backdates by an hour; mint again a day before the end (or halfway through a
     * one-day leaf). */
    int64_t life = (int64_t)days * 86400 * 1000;
    slot->refresh_ms = now + (days > 1 ? life - 86400 * 1000 : life / 2);
    t->minted++;
    return slot;
}

SSL *eg_tls_server_new(eg_t *eg, const char *name, const char **why)
{
    *why = "no_ca";
    if (!eg_tls_can_terminate(eg))
        return NULL;
    leaf_t *l = leaf_for(eg, name, why);
    if (!l)
        return NULL;
    SSL *ssl = SSL_new(eg->tls->server);
    if (!ssl || SSL_use_certificate(ssl, l->cert) != 1 || SSL_use_PrivateKey(ssl, l->key) != 1) {
        ERR_clear_error();
        SSL_free(ssl);
        *why = "tls_setup_failed";
        return NULL;
    }
    SSL_set_accept_state(ssl);
    return ssl;
}

SSL *eg_tls_upstream_new(eg_t *eg, const char *name, const char **why)
{
    SSL_CTX *ctx = upstream_current(eg);
    if (!ctx) {
        *why = "upstream_ca_unavailable";
        return NULL;
    }
    SSL *ssl = SSL_new(ctx);
    /* RFC 6125 via SSL_set1_host: the certificate must name exactly this host (no partial
     * wildcards, no IP literal); the SNI is the same name. */
    if (!ssl || SSL_set_tlsext_host_name(ssl, name) != 1 || SSL_set1_host(ssl, name) != 1 ||
        SSL_set_alpn_protos(ssl, ALPN_HTTP11, sizeof(ALPN_HTTP11)) != 0) {
        ERR_clear_error();
        SSL_free(ssl);
        *why = "tls_setup_failed";
        return NULL;
    }
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    SSL_set_connect_state(ssl);
    return ssl;
}
