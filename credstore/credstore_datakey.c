/* space.io.cred.datakey: a worker asks for the data key that seals a sandbox's captured
 * output (docs/audit.md, datakey.h). The first ask makes it (32 random bytes), wraps it under
 * the master key (the additional data names the sandbox) and stores it in data_keys; later
 * asks unwrap the stored one. A forgotten sandbox (space-replay forget) has a tombstone row:
 * no key is ever made again for it, the answer is "forgotten" and its worker records its
 * output unsealed-and-empty (worker_commands.c).
 *
 * Who may ask: a worker identity, answered on its own inbox only (cs_caller_allowed), for a
 * sandbox of the tenant it names that the sandboxes table places on that very worker (a
 * worker cannot fetch another host's keys). The reply is wiped once sent. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "contract.h"
#include "credstore.h"
#include "datakey.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "log.h"

#define DATAKEY_REQUEST_MAX 1024

static void answer(cs_t *cs, const char *reply, Space__Cred__V1__DataKeyReply *rep)
{
    uint8_t buf[256];
    size_t plen = space__cred__v1__data_key_reply__get_packed_size(rep);
    if (plen <= sizeof(buf)) {
        space__cred__v1__data_key_reply__pack(rep, buf);
        (void)sp_bus_publish_core(cs->bus, reply, buf, plen);
    }
    explicit_bzero(buf, sizeof(buf));
}

/* The sandbox's data key, made and stored on first use: 0, -ENOKEY (forgotten), -EBADMSG (a
 * row that does not open), SP_EDB. Holds mu. */
static int data_key(cs_t *cs, const char *tenant, const char *sandbox, sp_cred_key_t *ret)
{
    const char *p[1] = {sandbox};
    for (int attempt = 0; attempt < 2; attempt++) {
        PGresult *r = PQexecParams(cs->db,
                                   "SELECT master_key_id, nonce, wrapped, forgotten_at IS NOT NULL "
                                   "FROM data_keys WHERE sandbox_id = $1",
                                   1, NULL, p, NULL, NULL, 1);
        int rc = sp_db_check(r, PGRES_TUPLES_OK);
        if (rc < 0) {
            PQclear(r);
            return rc;
        }
        if (PQntuples(r) == 1) {
            if (*PQgetvalue(r, 0, 3)) {
                PQclear(r);
                return -ENOKEY;
            }
            const char *mk = PQgetvalue(r, 0, 0);
            const sp_cred_key_t *k = strcmp(mk, cs->key.id) == 0 ? &cs->key
                                     : cs->have_previous && strcmp(mk, cs->previous.id) == 0
                                         ? &cs->previous
                                         : NULL;
            rc = !k || PQgetlength(r, 0, 1) != SP_CRED_NONCE_LEN
                     ? -EBADMSG
                     : sp_datakey_unwrap(k, sandbox, (const uint8_t *)PQgetvalue(r, 0, 1),
                                         (const uint8_t *)PQgetvalue(r, 0, 2),
                                         (size_t)PQgetlength(r, 0, 2), ret);
            PQclear(r);
            return rc;
        }
        PQclear(r);
        sp_cred_key_t dk;
        uint8_t nonce[SP_CRED_NONCE_LEN], wrapped[SP_DATAKEY_WRAPPED_LEN];
        if (sp_datakey_generate(&dk) < 0 ||
            sp_datakey_wrap(&cs->key, sandbox, &dk, nonce, wrapped) < 0) {
            sp_cred_key_wipe(&dk);
            return -EIO;
        }
        const char *v[6] = {
            sandbox, tenant, dk.id, cs->key.id, (const char *)nonce, (const char *)wrapped};
        int lens[6] = {0, 0, 0, 0, SP_CRED_NONCE_LEN, SP_DATAKEY_WRAPPED_LEN};
        int fmts[6] = {0, 0, 0, 0, 1, 1};
        r = PQexecParams(cs->db,
                         "INSERT INTO data_keys (sandbox_id, tenant, key_id, master_key_id, nonce, "
                         "wrapped) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                         6, NULL, v, lens, fmts, 0);
        rc = sp_db_check(r, PGRES_COMMAND_OK);
        bool inserted = rc == 0 && strcmp(PQcmdTuples(r), "1") == 0;
        PQclear(r);
        if (rc < 0) {
            sp_cred_key_wipe(&dk);
            return rc;
        }
        if (inserted) {
            *ret = dk;
            sp_cred_key_wipe(&dk);
            sp_log(SP_LOG_INFO, "data key made", SP_KS("sandbox", sandbox),
                   SP_KS("key_id", ret->id));
            return 0;
        }
        sp_cred_key_wipe(&dk); /* another ask made it first: read that one */
    }
    return -EAGAIN;
}

int cs_datakeys_rewrap(cs_t *cs, const sp_cred_key_t *from, const sp_cred_key_t *to, bool lock)
{
    const char *p[1] = {from->id};
    int count = 0;
    for (;;) {
        /* A batch per hold of mu: a data key asked for meanwhile waits for one batch at most. */
        if (lock)
            pthread_mutex_lock(&cs->mu);
        PGresult *r = PQexecParams(cs->db,
                                   "SELECT sandbox_id, nonce, wrapped FROM data_keys "
                                   "WHERE master_key_id = $1 AND wrapped IS NOT NULL LIMIT 64",
                                   1, NULL, p, NULL, NULL, 1);
        int rc = sp_db_check(r, PGRES_TUPLES_OK), n = rc == 0 ? PQntuples(r) : 0;
        for (int i = 0; i < n && rc == 0; i++) {
            char sandbox[SP_ID_MAX + 1];
            snprintf(sandbox, sizeof(sandbox), "%.*s", PQgetlength(r, i, 0), PQgetvalue(r, i, 0));
            sp_cred_key_t dk;
            uint8_t nonce[SP_CRED_NONCE_LEN], wrapped[SP_DATAKEY_WRAPPED_LEN];
            rc = PQgetlength(r, i, 1) != SP_CRED_NONCE_LEN
                     ? -EBADMSG
                     : sp_datakey_unwrap(from, sandbox, (const uint8_t *)PQgetvalue(r, i, 1),
                                         (const uint8_t *)PQgetvalue(r, i, 2),
                                         (size_t)PQgetlength(r, i, 2), &dk);
            if (rc == 0) {
                rc = sp_datakey_wrap(to, sandbox, &dk, nonce, wrapped) < 0 ? -EIO : 0;
                sp_cred_key_wipe(&dk);
            }
            if (rc < 0) {
                sp_log(SP_LOG_ERROR, "a data key cannot be re-wrapped", SP_KS("sandbox", sandbox),
                       SP_KS("error", sp_strerror(rc)));
                break;
            }
            const char *v[4] = {sandbox, to->id, (const char *)nonce, (const char *)wrapped};
            int lens[4] = {0, 0, SP_CRED_NONCE_LEN, SP_DATAKEY_WRAPPED_LEN};
            int fmts[4] = {0, 0, 1, 1};
            PGresult *u = PQexecParams(cs->db,
                                       "UPDATE data_keys SET master_key_id = $2, nonce = $3, "
                                       "wrapped = $4 WHERE sandbox_id = $1 AND wrapped IS NOT NULL",
                                       4, NULL, v, lens, fmts, 0);
            rc = sp_db_check(u, PGRES_COMMAND_OK);
            PQclear(u);
            explicit_bzero(wrapped, sizeof(wrapped));
            if (rc == 0)
                count++;
        }
        PQclear(r);
        if (lock)
            pthread_mutex_unlock(&cs->mu);
        if (rc < 0)
            return rc;
        if (n == 0)
            break;
    }
    if (count)
        sp_log(SP_LOG_INFO, "data keys re-wrapped under the master key", SP_KI("count", count),
               SP_KS("key_id", to->id));
    return count;
}

static void on_datakey(void *arg, const char *subject, const char *reply, const uint8_t *data,
                       size_t len)
{
    cs_t *cs = arg;
    sp_request_t rq;
    if (!cs_request_open(cs, subject, reply, data, len, &rq)) {
        sp_request_dispose(&rq);
        return;
    }
    Space__Cred__V1__DataKeyReply rep = SPACE__CRED__V1__DATA_KEY_REPLY__INIT;
    Space__Cred__V1__DataKeyRequest *q = NULL;
    if (!reply || !cs_caller_allowed(cs, CS_CALLER_WORKER, rq.signer, reply)) {
        sp_log(SP_LOG_WARN, "data key refused: not a worker's own inbox",
               SP_KS("signer", rq.signer));
        pthread_mutex_lock(&cs->mu);
        cs->denied_callers++;
        pthread_mutex_unlock(&cs->mu);
        goto out;
    }
    if (rq.len <= DATAKEY_REQUEST_MAX)
        q = space__cred__v1__data_key_request__unpack(NULL, rq.len, rq.body);
    if (!q || !sp_id_valid(q->tenant) || !sp_id_valid(q->sandbox)) {
        rep.error = "invalid";
        answer(cs, reply, &rep);
        goto out;
    }
    /* With verification on, the signer's instance is the asking worker's id. */
    sp_identity_t id;
    const char *worker = NULL;
    if (sp_verifier_mode(cs->verifier) != SP_VERIFY_OFF && rq.signer[0] &&
        sp_identity_parse(rq.signer, &id) == 0)
        worker = id.instance;
    sp_cred_key_t dk;
    pthread_mutex_lock(&cs->mu);
    int rc = cs_placed_on(cs, q->tenant, q->sandbox, worker);
    if (rc == 1)
        rc = data_key(cs, q->tenant, q->sandbox, &dk);
    else if (rc == 0)
        rc = -EPERM;
    pthread_mutex_unlock(&cs->mu);
    if (rc < 0) {
        rep.error = rc == -ENOKEY  ? "forgotten"
                    : rc == -EPERM ? "not_placed"
                    : rc == SP_EDB ? "db_unavailable"
                                   : "unavailable";
        sp_log(rc == -ENOKEY ? SP_LOG_INFO : SP_LOG_WARN, "data key not given",
               SP_KS("sandbox", q->sandbox), SP_KS("error", rep.error));
        answer(cs, reply, &rep);
        goto out;
    }
    rep.ok = true;
    rep.key = (ProtobufCBinaryData){SP_CRED_KEY_LEN, dk.k};
    rep.key_id = dk.id;
    answer(cs, reply, &rep);
    sp_cred_key_wipe(&dk);
out:
    if (q)
        space__cred__v1__data_key_request__free_unpacked(q, NULL);
    sp_request_dispose(&rq);
}

int cs_datakey_start(cs_t *cs)
{
    return sp_bus_subscribe(cs->bus, SP_CRED_SUBJECT_DATAKEY, SP_CRED_QUEUE, on_datakey, cs,
                            &cs->datakey_sub);
}
