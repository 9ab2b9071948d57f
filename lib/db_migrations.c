/* Schema migrations, in order. A released migration is never edited: add a new one (db.h). */
#include "db_migrations.h"

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

const sp_db_migration_t sp_db_migrations[] = {
    {1, "events, sandboxes, workers", m1_events},       {2, "api_keys, idempotency_keys", m2_keys},
    {3, "sandbox timeouts and idleness", m3_timeouts},  {4, "sandbox_env", m4_sandbox_env},
    {5, "credentials, credstore_keys", m5_credentials},
};
const size_t sp_db_n_migrations = sizeof(sp_db_migrations) / sizeof(sp_db_migrations[0]);
