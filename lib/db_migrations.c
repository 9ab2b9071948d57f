/* Schema migrations, in order. A released migration is never edited: add a new one (db.h). */
#include "db_migrations.h"

#include "db.h"

#include <stddef.h>

static const char m1_events[] =
    /* The event log: one row per message of SPACE_EVENTS, in stream order, hash-chained.
     * Rejected messages are rows too (status 'rejected', with the reason): nothing read from
     * the stream is dropped, and the chain covers every stored message. */
    "CREATE TABLE events ("
    "  stream_seq     bigint PRIMARY KEY,"
    "  event_id       uuid,"
    "  subject        text NOT NULL,"
    "  type           text,"
    "  aggregate_kind text,"
    "  aggregate_id   text,"
    "  tenant         text,"
    "  actor          text,"
    "  occurred_at    timestamptz,"
    "  published_at   timestamptz NOT NULL,"
    "  stored_at      timestamptz NOT NULL DEFAULT clock_timestamp(),"
    "  correlation_id text,"
    "  causation_id   uuid,"
    "  schema_version integer,"
    "  status         text NOT NULL CHECK (status IN ('accepted', 'rejected')),"
    "  reject_reason  text,"
    "  payload        bytea NOT NULL,"
    "  prev_hash      bytea NOT NULL CHECK (length(prev_hash) = 32),"
    "  hash           bytea NOT NULL CHECK (length(hash) = 32)"
    ");"
    /* An event id is stored once as accepted; a different message reusing it is rejected. */
    "CREATE UNIQUE INDEX events_event_id_accepted ON events (event_id) WHERE status = 'accepted';"
    "CREATE INDEX events_aggregate ON events (aggregate_kind, aggregate_id, stream_seq);"
    "CREATE INDEX events_tenant ON events (tenant, stream_seq);"
    "CREATE INDEX events_correlation ON events (correlation_id) WHERE correlation_id <> '';"
    /* Projections: rebuilt from events by the reducers in lib/reduce.c (replay does the same). */
    "CREATE TABLE sandboxes ("
    "  id             text PRIMARY KEY,"
    "  tenant         text NOT NULL,"
    "  template       text NOT NULL,"
    "  state          text NOT NULL,"
    "  worker         text NOT NULL DEFAULT '',"
    "  timeout_s      integer NOT NULL DEFAULT 0,"
    "  vcpu           integer NOT NULL DEFAULT 0,"
    "  memory_mb      integer NOT NULL DEFAULT 0,"
    "  metadata       jsonb NOT NULL DEFAULT '{}',"
    "  env_names      jsonb NOT NULL DEFAULT '[]',"
    "  failure_reason text NOT NULL DEFAULT '',"
    "  created_at     timestamptz,"
    "  started_at     timestamptz,"
    "  updated_at     timestamptz,"
    "  deleted_at     timestamptz,"
    "  version        integer NOT NULL,"
    "  last_seq       bigint NOT NULL"
    ");"
    "CREATE INDEX sandboxes_tenant_state ON sandboxes (tenant, state);"
    "CREATE TABLE workers ("
    "  id                text PRIMARY KEY,"
    "  host              text NOT NULL DEFAULT '',"
    "  state             text NOT NULL,"
    "  vcpu_total        integer NOT NULL DEFAULT 0,"
    "  vcpu_used         integer NOT NULL DEFAULT 0,"
    "  memory_mb_total   bigint NOT NULL DEFAULT 0,"
    "  memory_mb_used    bigint NOT NULL DEFAULT 0,"
    "  sandboxes_running integer NOT NULL DEFAULT 0,"
    "  templates         jsonb NOT NULL DEFAULT '[]',"
    "  runtimes          jsonb NOT NULL DEFAULT '[]',"
    "  interval_ms       integer NOT NULL DEFAULT 0,"
    "  version_string    text NOT NULL DEFAULT '',"
    "  last_heartbeat_at timestamptz,"
    "  version           integer NOT NULL,"
    "  last_seq          bigint NOT NULL"
    ");";

static const char m2_keys[] =
    /* API keys: the secret is never stored, only SHA-256 of the whole key (apikey.h). */
    "CREATE TABLE api_keys ("
    "  id         text PRIMARY KEY,"
    "  tenant     text NOT NULL,"
    "  hash       bytea NOT NULL CHECK (length(hash) = 32),"
    "  name       text NOT NULL DEFAULT '',"
    "  created_at timestamptz NOT NULL DEFAULT now(),"
    "  revoked_at timestamptz"
    ");"
    /* Idempotency-Key of a create: a retried request gets the same sandbox. */
    "CREATE TABLE idempotency_keys ("
    "  tenant     text NOT NULL,"
    "  key        text NOT NULL,"
    "  sandbox_id text NOT NULL,"
    "  request_sha256 bytea NOT NULL,"
    "  created_at timestamptz NOT NULL DEFAULT now(),"
    "  PRIMARY KEY (tenant, key)"
    ");";

static const char m3_timeouts[] =
    /* Deadlines and idleness, maintained by the reducer, watched by the scheduler. */
    "ALTER TABLE sandboxes ADD COLUMN timeout_at timestamptz,"
    "  ADD COLUMN on_timeout text NOT NULL DEFAULT 'delete',"
    "  ADD COLUMN idle_suspend_s integer NOT NULL DEFAULT 0,"
    "  ADD COLUMN last_activity_at timestamptz;"
    "CREATE INDEX sandboxes_timeout_at ON sandboxes (timeout_at) WHERE timeout_at IS NOT NULL;";
static const char m4_sandbox_env[] =
    /* Environment values given at create: never events (the log keeps names only), read by
     * the gateway for every command of the sandbox and sent to its worker on the data plane. */
    "CREATE TABLE sandbox_env ("
    "  sandbox_id text PRIMARY KEY,"
    "  tenant     text NOT NULL,"
    "  env        jsonb NOT NULL,"
    "  created_at timestamptz NOT NULL DEFAULT now()"
    ");";

static const char m5_credentials[] =
    /* space-credstore's credentials (docs/credentials.md): the value only sealed (AES-256-GCM
     * under the master key named by key_id; the additional data binds id and version). A
     * deleted credential keeps its row (deleted_at) and loses its ciphertext. */
    "CREATE TABLE credentials ("
    "  id              text PRIMARY KEY,"
    "  tenant          text NOT NULL,"
    "  name            text NOT NULL,"
    "  scope_kind      text NOT NULL CHECK (scope_kind IN ('tenant', 'project', 'sandbox')),"
    "  scope_id        text NOT NULL DEFAULT '',"
    "  hosts           jsonb NOT NULL,"
    "  inject_type     text NOT NULL CHECK (inject_type IN ('header', 'bearer', 'basic', 'query')),"
    "  inject_name     text NOT NULL DEFAULT '',"
    "  inject_user     text NOT NULL DEFAULT '',"
    "  rate_per_minute integer NOT NULL DEFAULT 0,"
    "  expires_at      timestamptz,"
    "  version         integer NOT NULL,"
    "  key_id          text NOT NULL,"
    "  nonce           bytea CHECK (nonce IS NULL OR length(nonce) = 12),"
    "  ciphertext      bytea,"
    "  created_at      timestamptz NOT NULL DEFAULT now(),"
    "  rotated_at      timestamptz,"
    "  deleted_at      timestamptz"
    ");"
    /* One live credential per name and scope of a tenant. */
    "CREATE UNIQUE INDEX credentials_live_name ON credentials (tenant, scope_kind, scope_id, name)"
    "  WHERE deleted_at IS NULL;"
    /* A canary per master key: a known text sealed under it, so a wrong key is found at start
     * instead of at the first request. */
    "CREATE TABLE credstore_keys ("
    "  key_id     text PRIMARY KEY,"
    "  nonce      bytea NOT NULL,"
    "  canary     bytea NOT NULL,"
    "  created_at timestamptz NOT NULL DEFAULT now()"
    ");";

static const char m6_key_roles[] =
    /* Key management through the API (apikey.h): an admin key manages the keys of every
     * tenant. last_used_at is written at most every 10 s per key and gateway (a cache miss of
     * its auth cache), so it tells "in use lately", not the last request. A revocation is
     * announced to every gateway (channel space_api_keys = SP_APIKEY_CHANNEL, payload the key id),
     * which drops the key from its cache at once: the trigger covers every writer, an UPDATE by
     * hand included. */
    "ALTER TABLE api_keys ADD COLUMN admin boolean NOT NULL DEFAULT false,"
    "  ADD COLUMN last_used_at timestamptz;"
    "CREATE INDEX api_keys_tenant ON api_keys (tenant, created_at);"
    "CREATE FUNCTION api_keys_notify_revoked() RETURNS trigger LANGUAGE plpgsql AS $$"
    "BEGIN"
    "  PERFORM pg_notify('space_api_keys', NEW.id);"
    "  RETURN NULL;"
    "END $$;"
    "CREATE TRIGGER api_keys_revoked AFTER UPDATE OF revoked_at ON api_keys FOR EACH ROW"
    "  WHEN (NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL)"
    "  EXECUTE FUNCTION api_keys_notify_revoked();";

static const char m7_chain_v2[] =
    /* Chain v2 (hash.h, docs/audit.md): rows written from now on hash their stream sequence,
     * subject, size and digest of the whole message, status and reject reason, so that a status
     * flipped or a row renumbered breaks the chain by itself. chain_v says which formula a row
     * used: the rows already stored keep 1 (SHA-256(prev_hash || payload)) and verify as before.
     * A rejected message larger than 64 KiB keeps its first 64 KiB in payload, its size and its
     * SHA-256 beside them (NULL when payload is the whole message). */
    "ALTER TABLE events ADD COLUMN chain_v smallint NOT NULL DEFAULT 1 CHECK (chain_v IN (1, 2)),"
    "  ADD COLUMN payload_size bigint,"
    "  ADD COLUMN payload_sha256 bytea CHECK (payload_sha256 IS NULL OR length(payload_sha256) = "
    "32);";

static const char m8_disk[] =
    /* Disk-aware placement: the limit each sandbox got, each worker's volume (docs/faults.md). */
    "ALTER TABLE sandboxes ADD COLUMN disk_mb integer NOT NULL DEFAULT 0;"
    "ALTER TABLE workers ADD COLUMN disk_mb_total bigint NOT NULL DEFAULT 0,"
    "  ADD COLUMN disk_mb_free bigint NOT NULL DEFAULT 0,"
    "  ADD COLUMN disk_mb_reserve bigint NOT NULL DEFAULT 0,"
    "  ADD COLUMN disk_mb_default integer NOT NULL DEFAULT 0;";

static const char m9_pools[] =
    /* Warm pools (docs/pools.md): per template, sandboxes a worker has ready to claim, from its
     * last heartbeat; the scheduler prefers a worker that has one. */
    "ALTER TABLE workers ADD COLUMN pools jsonb NOT NULL DEFAULT '{}';";

static const char m10_data_keys[] =
    /* Per-sandbox data keys of captured output (docs/audit.md): the key only wrapped by the
     * master key named by master_key_id (AES-256-GCM, the additional data names the sandbox).
     * A mutable table, never an event, so that forgetting is possible: space-replay forget
     * drops nonce and wrapped and sets forgotten_at; the row stays as a tombstone so that no
     * new key is ever made for a forgotten sandbox. */
    "CREATE TABLE data_keys ("
    "  sandbox_id    text PRIMARY KEY,"
    "  tenant        text NOT NULL,"
    "  key_id        text NOT NULL,"
    "  master_key_id text NOT NULL,"
    "  nonce         bytea,"
    "  wrapped       bytea,"
    "  created_at    timestamptz NOT NULL DEFAULT now(),"
    "  forgotten_at  timestamptz,"
    "  CHECK ((forgotten_at IS NULL) = (wrapped IS NOT NULL))"
    ");"
    "CREATE INDEX data_keys_tenant ON data_keys (tenant);";

static const char m11_sandbox_moved[] =
    /* Every change of a sandbox's state or worker, and its row's removal, is announced on
     * SP_SANDBOX_CHANNEL (payload the sandbox id): the gateways cache where running sandboxes
     * are (gateway_locate.c) and drop an entry when this is heard. The trigger covers every
     * writer, the reducer and an UPDATE by hand alike. */
    "CREATE FUNCTION sandboxes_notify_moved() RETURNS trigger LANGUAGE plpgsql AS $$"
    "BEGIN"
    "  PERFORM pg_notify('" SP_SANDBOX_CHANNEL "',"
    "                    CASE TG_OP WHEN 'DELETE' THEN OLD.id ELSE NEW.id END);"
    "  RETURN NULL;"
    "END $$;"
    "CREATE TRIGGER sandboxes_moved AFTER UPDATE OF state, worker ON sandboxes FOR EACH ROW"
    "  WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.worker IS DISTINCT FROM NEW.worker)"
    "  EXECUTE FUNCTION sandboxes_notify_moved();"
    "CREATE TRIGGER sandboxes_gone AFTER DELETE ON sandboxes FOR EACH ROW"
    "  EXECUTE FUNCTION sandboxes_notify_moved();";

const sp_db_migration_t sp_db_migrations[] = {
    {1, "events, sandboxes, workers", m1_events},
    {2, "api_keys, idempotency_keys", m2_keys},
    {3, "sandbox timeouts and idleness", m3_timeouts},
    {4, "sandbox_env", m4_sandbox_env},
    {5, "credentials, credstore_keys", m5_credentials},
    {6, "api key roles", m6_key_roles},
    {7, "events chain v2", m7_chain_v2},
    {8, "disk of sandboxes and workers", m8_disk},
    {9, "worker pool levels", m9_pools},
    {10, "data_keys", m10_data_keys},
    {11, "sandbox moves announced", m11_sandbox_moved},
};
const size_t sp_db_n_migrations = sizeof(sp_db_migrations) / sizeof(sp_db_migrations[0]);
