/* Integration test harness: every scenario runs against a real stack that `space up` started
 * into $SPACE_HOME (a CTest fixture). sp_test_stack_load reads $SPACE_HOME/space.env and
 * exports its variables (SPACE_NATS_URL, SPACE_PG_URL, ...) into the environment. */
#ifndef SPACE_TEST_HARNESS_H
#define SPACE_TEST_HARNESS_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "envelope.h"
#include "httpc.h"
#include "json.h"
#include "sign.h"

/* Fails the test (cmocka fail_msg) when the stack is not there. */
void sp_test_stack_load(void);
const char *sp_test_env(const char *name);
/* Connections to the stack; fail the test on error. The bus connection is the identity
 * SPACE_TEST_IDENTITY (the fixture sets it: operator) with the credentials in SPACE_CREDS_DIR
 * (space.env), publishing unsigned. */
sp_bus_t *sp_test_bus(void);
/* The test plays the daemon whose role it is to emit the envelope in *data (the rule of
 * sp_eventgen_signer: the worker of its subject for worker facts, else the gateway or the
 * scheduler): *data is replaced by the same envelope signed with that identity's key in
 * SPACE_CREDS_DIR, made there when the stack has none (the event log reads new keys when an
 * unknown signer appears). -EINVAL, *data untouched, when it is no envelope: hostile bytes go
 * out as they are. */
int sp_test_sign(const char *subject, uint8_t **data, size_t *len);
/* Waits (20 s at most) for the events row of stream sequence seq and checks its status, and
 * that its reject reason starts with needle (prefix) or contains it; fails the test with both
 * otherwise. */
void sp_test_expect_row(PGconn *db, uint64_t seq, const char *status, const char *needle,
                        bool prefix);
PGconn *sp_test_db(void);
/* What a database superuser who knows the chain's formulas (hash.h) does after editing rows:
 * recomputes prev_hash and hash of every row of events (in db's search_path) from stream_seq
 * from on, v1 and v2 rows each by their own formula. Fails the test on a database error. */
void sp_test_rehash(PGconn *db, uint64_t from);
/* Row seq's stored envelope, decoded (sp_envelope_free): what a superuser edits. */
sp_envelope_t *sp_test_stored_envelope(PGconn *db, uint64_t seq);
/* Packs env as it is (signature fields kept), stores it as row seq's payload and recomputes
 * the chain from there (sp_test_rehash): a rewrite no hash shows. */
void sp_test_rewrite_row(PGconn *db, uint64_t seq, const sp_envelope_t *env);
/* A fresh Ed25519 key pair for identity in dir (<identity>.key and .pub, an old one
 * replaced), loaded (sp_sign_key_free). */
sp_sign_key_t *sp_test_identity(const char *dir, const char *identity);
/* Waits for the acks of bus's asynchronous publishes; the stream's last sequence. */
uint64_t sp_test_stream_last(sp_bus_t *bus);
/* Runs `space <args>` (the CLI next to the test binaries, $SPACE_BIN_DIR/space) and returns
 * its exit status. */
int sp_test_space(const char *args);
/* Polls a scalar SQL query until it returns want, up to timeout_ms. Returns the last value. */
long long sp_test_db_wait_scalar(PGconn *db, const char *sql, long long want, int timeout_ms);
long long sp_test_db_scalar(PGconn *db, const char *sql);
/* How many events of type the log holds for sandbox, whose payload (as text) contains needle
 * (NULL: any). */
long long sp_test_events(PGconn *db, const char *sandbox, const char *type, const char *needle);

/* Waits (15 s at most) for a daemon started with --port-file path to write its port there and
 * returns it; fails the test, naming log_file, when none comes. */
int sp_test_port_file(const char *path, const char *log_file);

/* Pid of a daemon that `space up` started ($SPACE_HOME/run/<name>.pid), 0 if none. */
int sp_test_daemon_pid(const char *name);
/* SIGKILLs that daemon and waits until it is gone. Fails the test if it was not running. */
void sp_test_daemon_kill9(const char *name);
/* The same with signal sig (SIGTERM: a clean stop), waiting up to 30 s. */
void sp_test_daemon_stop(const char *name, int sig);
/* Whether anything of sandbox id is on the host of the worker whose state directory is
 * state_dir: runsc container, bundle (and its agent socket), disk, netns, cgroup. */
bool sp_test_sandbox_held(const char *state_dir, const char *id);
/* How many kept disks of suspended sandbox id (worker_runtime.h, keep_snap) that host has. */
int sp_test_kept_disks(const char *state_dir, const char *id);
/* Whether the nftables table of the worker whose tag is tag (`inet space_<tag>`, worker_nft.c)
 * is still on the host; if so it says so on stderr and deletes it, for the next runs. A test
 * that opened a worker host itself checks this after its teardown (every such table hooks
 * every packet of the host, docs/machine-notes.md). */
bool sp_test_nft_table_left(const char *tag);
/* The port in $SPACE_HOME/run/<daemon>.metrics (a worker writes it once its start is over:
 * up to 60 s); fails the test when none comes. */
int sp_test_metrics_port(const char *daemon);
/* The value of one sample of that daemon's /metrics, named with its labels as the text has it
 * (`space_x_total{outcome="clean"}`); -1 when there is no such sample. */
double sp_test_metric(const char *daemon, const char *sample);
/* Whether the log file at path has a line with both needles. */
bool sp_test_log_has(const char *path, const char *a, const char *b);
/* Runs a shell command line (printf-style); its exit status, -1 when it did not exit. */
int sp_test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The worker the log places sandbox id on ("" when none); fails the test when there is no such
 * sandbox. Free the result. */
char *sp_test_worker_of(PGconn *db, const char *id);
/* The store keys of the sandbox's newest snapshot (its checkpoint image, then its disk), from
 * its last SandboxSuspended. */
void sp_test_snapshot_keys(PGconn *db, const char *id, char keys[2][256]);
/* Runs space-replay (next to the test binaries) with args, captures stdout into out (may be
 * NULL) and returns its exit status. */
int sp_test_replay(const char *args, char *out, size_t outlen);

/* A minimal HTTP/1.1 client for tests: one request per connection (Connection: close) to
 * 127.0.0.1:port, body de-chunked. */
typedef sp_httpc_resp_t sp_test_http_resp_t;

/* Sends method path with optional bearer key and body (JSON); returns 0 or fails the test
 * when the exchange itself fails. extra_headers: "Name: value\r\n..." or NULL. */
int sp_test_http(int port, const char *method, const char *path, const char *key,
                 const char *extra_headers, const char *body, size_t body_len,
                 sp_test_http_resp_t *ret);
void sp_test_http_free(sp_test_http_resp_t *r);
/* The value of header name in r (case-insensitive), copied into out; 0 if found. */
int sp_test_http_header(const sp_test_http_resp_t *r, const char *name, char *out, size_t len);
/* The port of SPACE_API_URL (http://127.0.0.1:PORT). */
int sp_test_api_port(void);

/* ---- API calls (harness_api.c) ---- */

/* A response body as JSON (fails the test otherwise); free with sp_json_doc_free. */
sp_json_doc_t *sp_test_json(const sp_test_http_resp_t *r);
/* POST /v1/sandboxes {template}, retrying while no worker offers it yet; the id into out. */
void sp_test_create_sandbox(int port, const char *key, const char *tmpl, char out[64]);
/* The same with a whole create body (JSON). */
void sp_test_create_sandbox_body(int port, const char *key, const char *body, char out[64]);
/* A command's JSON answer (Accept: application/json). */
typedef struct {
    int status;
    char *stdout_s, *stderr_s, *error; /* error: the answer's error, or the body when not 200 */
    int64_t exit_code, signal;
    bool timed_out, truncated, output_lost;
} sp_test_cmd_t;
sp_test_cmd_t sp_test_run(int port, const char *key, const char *id, const char *body);
/* The build's program name (from SPACE_BIN_DIR) into guest_path of sandbox id, mode 0755,
 * through the files API (for the tiny template, which has few tools). */
void sp_test_put_program(int port, const char *key, const char *id, const char *name,
                         const char *guest_path);
void sp_test_cmd_free(sp_test_cmd_t *r);
/* A process in sandbox id that counts ten times a second into /tmp/count (gVisor's /tmp is
 * memory: the count survives only with the sandbox's memory), and "kept" in /root/file (the
 * disk). sp_test_counter reads the count. */
void sp_test_start_counter(int port, const char *key, const char *id);
long sp_test_counter(int port, const char *key, const char *id);
/* The counter across a stop (a pause, a suspend, a host gone): it went on from where it was
 * (not restarted) and ticked only while the sandbox could run, at most once per 0.1 s. A
 * fixed bound ("fewer than 8 ticks") failed on a slow CI machine; this one is measured:
 * begin reads the count, held marks the stop answered, ending marks the resume asked for,
 * and check reads the count again and asserts it. */
typedef struct {
    long before;
    double t_read, t_held, t_ending; /* CLOCK_MONOTONIC, seconds */
} sp_test_stop_t;
void sp_test_stop_begin(sp_test_stop_t *s, int port, const char *key, const char *id);
void sp_test_stop_held(sp_test_stop_t *s);
void sp_test_stop_ending(sp_test_stop_t *s);
long sp_test_stop_check(const sp_test_stop_t *s, int port, const char *key, const char *id);
/* POST /v1/sandboxes/{id}/{op}{query} (pause, resume, suspend): the status, and the sandbox's
 * state (200) or the error code into out. */
int sp_test_lifecycle(int port, const char *key, const char *id, const char *op, const char *query,
                      char *out, size_t len);

#endif
