/* A process's identity on the bus (docs/trust.md): which NATS user it connects as and which
 * key signs what it publishes. Every daemon and tool has the same two options (one table
 * entry each, SP_BUSID_CFG_OPTS): `identity` and `creds-dir` (env SPACE_IDENTITY,
 * SPACE_CREDS_DIR; `space up` sets both). The credentials are the files
 * sp_natsauth_creds_create made in creds-dir (natsauth.h):
 *   <identity>.nkpub, <identity>.nk   the NATS login (NKey), the seed read on each connect
 *   <identity>.key                    the Ed25519 key every published envelope is signed with
 * An empty creds-dir means no identity: the connection is anonymous (refused by a nats-server
 * that `space up` configured) and envelopes go out unsigned.
 */
#ifndef SPACE_BUSID_H
#define SPACE_BUSID_H

#include "bus.h"
#include "config.h"
#include "contract.h"
#include "natsauth.h"
#include "sign.h"

#define SP_BUSID_ERR_MAX 256

/* The two options, for a daemon's table; st is its config struct, fi and fc its char * fields
 * of the identity and the credentials directory. */
#define SP_BUSID_CFG_OPTS(st, fi, fc)                                                              \
    SP_CFG_STR_OPT("identity", st, fi, NULL,                                                       \
                   "identity on the bus (docs/trust.md); empty: this program's own (gateway, "     \
                   "worker-<id>, ...)"),                                                           \
        SP_CFG_STR_OPT("creds-dir", st, fc, NULL,                                                  \
                       "directory of the identity's credentials ($SPACE_HOME/creds); empty: "      \
                       "connect without any (anonymous, unsigned)")

typedef struct {
    char name[SP_IDENTITY_MAX + 1]; /* "" when there is no identity */
    char nkey[SP_NKEY_PUB_LEN + 1];
    char inbox[SP_INBOX_MAX + 1];
    char *seed_file;    /* heap */
    sp_sign_key_t *key; /* the signing key */
} sp_busid_t;

/* Loads the identity (identity, or def_identity when identity is NULL or empty) from
 * creds_dir, points bo's nkey, nkey_seed_file and inbox_prefix at it, and registers it as the
 * process's signer (sp_publish_signer_set). With creds_dir NULL or empty: nothing is loaded,
 * ret->name is "" and bo is unchanged. ret must outlive the bus and every publish. On failure
 * (bad identity name, missing or unreadable files, a secret file readable by others) a
 * negative code and a message in err (which names files, never secrets). */
int sp_busid_setup(const char *creds_dir, const char *identity, const char *def_identity,
                   sp_busid_t *ret, sp_bus_opts_t *bo, char err[SP_BUSID_ERR_MAX]);
/* Unregisters the signer (if it is this one) and frees. Accepts a zeroed struct. */
void sp_busid_dispose(sp_busid_t *id);

#endif
