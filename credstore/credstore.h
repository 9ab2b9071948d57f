/* space-credstore internals (docs/credentials.md).
 *
 *   main.c               config, master key, start and stop
 *   credstore_store.c    the credentials: PostgreSQL rows, the in-memory table, sealing
 *   credstore_admin.c    space.io.cred.admin: create, list, get, rotate, delete (gateway)
 *   credstore_datakey.c  space.io.cred.datakey: a sandbox's data key (worker, docs/audit.md)
 *   credstore_lookup.c   space.io.cred.lookup: what a request may carry (egressd), and the
 *                        one function that decides who may ask (cs_caller_allowed)
 *
 * Threads: the two subscriptions' callbacks run on cnats threads (one message at a time per
 * subscription); the table and the database connection are shared under cs_t.mu. There is
 * no loop: the main thread waits for a stop. One credstore instance owns the table (a second
 * one would not see the first one's writes until it restarts). */
#ifndef SPACE_CREDSTORE_H
#define SPACE_CREDSTORE_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "cred.h"
#include "credstore.pb-c.h"
#include "envelope.h"
#include "metrics.h"
#include "request.h"
#include "verifier.h"

#ifndef SP_ID_MAX
#define SP_ID_MAX 64
#endif

typedef struct {
    char *nats_url;
    char *identity; /* busid.h */
    char *creds_dir;
    char *verify_signatures; /* verifier.h */
    char *keyring_dir;
    char *pg_url;
    char *master_key_file;
    char *previous_master_key_file;
    char *log_level;
    char *log_format;
    char *metrics_addr; /* metrics.h */
    char *metrics_port_file;
} cs_config_t;

typedef struct {
    char id[SP_ID_MAX + 1];
    char tenant[SP_ID_MAX + 1];
    char name[SP_CRED_NAME_MAX + 1];
    char scope_kind[8];
    char scope_id[SP_ID_MAX + 1];
    char **hosts;
    sp_cred_host_t *parsed;
    size_t n_hosts;
    sp_cred_inject_t inject;
    char inject_name[65];
    char inject_user[257];
    uint32_t rate_per_minute;
    int64_t expires_at_us; /* 0: never */
    uint32_t version;
    char key_id[SP_CRED_KEY_ID_LEN + 1];
    uint8_t nonce[SP_CRED_NONCE_LEN];
    uint8_t *ct;
    size_t ct_len;
    int64_t created_at_us, rotated_at_us;
} cs_cred_t;

typedef struct {
    const cs_config_t *cfg;
    sp_bus_t *bus;
    PGconn *db;
    sp_cred_key_t key;      /* what seals; rows name theirs by key_id */
    sp_cred_key_t previous; /* while a live re-wrap runs (have_previous): opens the rest */
    bool have_previous;
    pthread_mutex_t mu; /* the table, db, key, previous */
    cs_cred_t **creds;
    size_t n_creds, cap_creds;
    sp_bus_sub_t *admin_sub, *lookup_sub, *datakey_sub;
    uint64_t lookups, denied_callers;
    /* Requests are signed (request.h): who asks is proven, not inferred. */
    sp_verifier_t *verifier;
    sp_request_guard_t *guard;
    sp_metric_t *m_lookups, *m_refused, *m_credentials; /* credstore_metrics.c */
} cs_t;

/* ---- metrics (credstore_metrics.c, docs/metrics.md) ---- */
typedef enum {
    CS_LOOKUP_GRANTED,
    CS_LOOKUP_NONE,
    CS_LOOKUP_FORBIDDEN,
    CS_LOOKUP_INVALID,
    CS_LOOKUP_MALFORMED,
    CS_LOOKUP_NOT_PLACED,  /* the sandbox is not on the asking egressd's host */
    CS_LOOKUP_UNAVAILABLE, /* the placement could not be read (database) */
    CS_LOOKUP_OUTCOMES,
} cs_lookup_outcome_t;
/* The families in reg, and the collect callback (which takes mu); -1 on a programming error. */
int cs_metrics_init(cs_t *cs, sp_metrics_t *reg);
/* Any thread, with or without mu. */
void cs_metrics_lookup(cs_t *cs, cs_lookup_outcome_t o);

/* ---- store (credstore_store.c); callers hold mu ---- */
/* Checks the master key against its canary (made on first start), then re-wraps every row
 * sealed under the previous key (previous may be NULL) and loads the live credentials.
 * < 0 with *why a message for the operator (never a value). */
int cs_store_open(cs_t *cs, const sp_cred_key_t *previous, const char **why);
void cs_store_close(cs_t *cs);
/* The master key rotated while serving: next seals from now on (its canary stored first),
 * the current key becomes previous and opens what is still sealed under it; then every row
 * is re-wrapped under next, one at a time under mu (lookups and admin requests go on in
 * between), written back, and previous's canary dropped and previous wiped. Called WITHOUT
 * mu, from the main thread. The number of rows re-wrapped, or < 0 with *why (rows already
 * re-wrapped stay so; both keys stay in memory and a restart with the next key file present
 * completes it). */
int cs_store_rewrap_live(cs_t *cs, const sp_cred_key_t *next, const char **why);
cs_cred_t *cs_store_find(cs_t *cs, const char *tenant, const char *id);
/* Inserts c (its id, version 1, key and times are set here) with value sealed: 0, -EEXIST
 * (a live credential of that name and scope), SP_EDB. On success the table owns c. */
int cs_store_create(cs_t *cs, cs_cred_t *c, const uint8_t *value, size_t len);
/* A new value, version + 1. */
int cs_store_rotate(cs_t *cs, cs_cred_t *c, const uint8_t *value, size_t len);
/* Marks deleted (its ciphertext dropped) and removes it from the table (freed). */
int cs_store_delete(cs_t *cs, cs_cred_t *c);
/* The value, opened into out (SP_CRED_VALUE_MAX bytes) with the key its row names (key or,
 * during a live re-wrap, previous): its length, or -EBADMSG. */
int cs_store_open_value(cs_t *cs, const cs_cred_t *c, uint8_t *out);
void cs_cred_free(cs_cred_t *c);
void cs_cred_meta(const cs_cred_t *c, Space__Cred__V1__CredMeta *m);
/* Whether sandbox is tenant's and, worker not NULL, placed on worker, by the projection's
 * sandboxes table: 1 yes, 0 no, SP_EDB. The one placement check of the data key and lookup
 * paths (a host's worker or egressd asks only for its own host's sandboxes). */
int cs_placed_on(cs_t *cs, const char *tenant, const char *sandbox, const char *worker);

/* ---- admin (credstore_admin.c) and lookup (credstore_lookup.c) ---- */
int cs_admin_start(cs_t *cs);
int cs_lookup_start(cs_t *cs);
/* space.io.cred.datakey (credstore_datakey.c): a sandbox's data key, to its worker. */
int cs_datakey_start(cs_t *cs);
/* Re-wraps every live data key wrapped by from under to (a master key rotation: keys of
 * forgotten sandboxes stay tombstones). lock: take cs->mu per batch (while serving). The count,
 * or < 0 (the rows re-wrapped so far stay so; asked again, it goes on). */
int cs_datakeys_rewrap(cs_t *cs, const sp_cred_key_t *from, const sp_cred_key_t *to, bool lock);

typedef enum { CS_CALLER_GATEWAY = 1, CS_CALLER_EGRESSD, CS_CALLER_WORKER } cs_caller_t;
/* Whether the answer to a request signed by signer (sp_request_open checked that its kind may
 * send on the subject) may go to reply, for a caller of kind: only to the signer's own inbox,
 * _INBOX.<signer>. (which NATS lets only that identity read). Without verification (no
 * creds-dir, verify-signatures=off) every caller is believed, as the log line at start says. */
bool cs_caller_allowed(cs_t *cs, cs_caller_t kind, const char *signer, const char *reply);
/* Opens a signed request (sp_request_open) for on_admin/on_lookup: true when it may be acted
 * on; a refusal is logged and answered (RequestRefused). Dispose rq in every case. */
bool cs_request_open(cs_t *cs, const char *subject, const char *reply, const uint8_t *data,
                     size_t len, sp_request_t *rq);

/* Publishes a credential event (payload set by the caller) on space.ev.cred.<tenant>.<type>. */
int cs_publish(cs_t *cs, Space__V1__Envelope *env, const char *tenant, const char *cred_id,
               const char *actor, const char *correlation_id);

#endif
