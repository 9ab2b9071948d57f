/* A process's identity on the bus (busid.h). */
#include "busid.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "publish.h"
#include "xmalloc.h"

int sp_busid_setup(const char *creds_dir, const char *identity, const char *def_identity,
                   sp_busid_t *ret, sp_bus_opts_t *bo, char err[SP_BUSID_ERR_MAX])
{
    const char *name = identity && *identity ? identity : def_identity;
    sp_identity_t id;
    uint8_t seed[32];
    char *keyfile = NULL;
    int rc;

    memset(ret, 0, sizeof(*ret));
    err[0] = '\0';
    if (!creds_dir || !*creds_dir)
        return 0;
    if (!name || sp_identity_parse(name, &id) < 0) {
        snprintf(err, SP_BUSID_ERR_MAX, "'%.100s' is not an identity (docs/trust.md)",
                 name ? name : "");
        return -EINVAL;
    }
    if ((rc = sp_natsauth_nkey_public(creds_dir, id.name, ret->nkey)) < 0) {
        snprintf(err, SP_BUSID_ERR_MAX, "%.120s/%s.nkpub: %s", creds_dir, id.name, sp_strerror(rc));
        goto fail;
    }
    ret->seed_file = sp_xasprintf("%s/%s.nk", creds_dir, id.name);
    /* Read once now so that a missing or exposed seed fails at startup, not at each connect. */
    rc = sp_nkey_seed_load(ret->seed_file, seed);
    explicit_bzero(seed, sizeof(seed));
    if (rc < 0) {
        snprintf(err, SP_BUSID_ERR_MAX, "%.160s: %s", ret->seed_file,
                 rc == -EPERM ? "readable by group or others (chmod 0600)" : sp_strerror(rc));
        goto fail;
    }
    keyfile = sp_xasprintf("%s/%s.key", creds_dir, id.name);
    if ((rc = sp_sign_key_load(keyfile, &ret->key)) < 0) {
        snprintf(err, SP_BUSID_ERR_MAX, "%.160s: %s", keyfile,
                 rc == -EPERM ? "readable by group or others (chmod 0600)" : sp_strerror(rc));
        goto fail;
    }
    free(keyfile);
    memcpy(ret->name, id.name, sizeof(ret->name));
    sp_natsauth_inbox(ret->name, ret->inbox);
    bo->nkey = ret->nkey;
    bo->nkey_seed_file = ret->seed_file;
    bo->inbox_prefix = ret->inbox;
    sp_publish_signer_set(ret->name, ret->key);
    return 0;
fail:
    free(keyfile);
    sp_busid_dispose(ret);
    return rc;
}

void sp_busid_dispose(sp_busid_t *id)
{
    if (!id)
        return;
    if (id->key && sp_publish_signer() == id->name)
        sp_publish_signer_set(NULL, NULL);
    sp_sign_key_free(id->key);
    free(id->seed_file);
    memset(id, 0, sizeof(*id));
}
