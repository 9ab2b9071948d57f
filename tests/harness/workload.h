/* A bounded workload of API calls in threads, for the fault tests (issue 17, 18: a daemon, a
 * NATS node, PostgreSQL or a host is lost while it runs). Every call is recorded with its
 * answer; afterwards sp_test_workload_check asserts what a user relies on: every answer was
 * clear (2xx, or a refusal with the API's JSON error that is not a 500, none past the client's
 * deadline, no dropped connection) and every 2xx has its fact in the log.
 *
 * Each thread cycles through the kinds of call cfg.ops allows, in an order shifted by its
 * number: create (a sandbox of its own), command and file write (to one of cfg.busy, the
 * sandboxes the test keeps running; a command to its own sandbox when it has no busy ones),
 * suspend and resume (its own sandbox), delete (its own). A kind that needs its own sandbox
 * when the thread has none creates one instead; a suspend of a suspended sandbox resumes it. */
#ifndef SPACE_TEST_WORKLOAD_H
#define SPACE_TEST_WORKLOAD_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum {
    SP_TEST_OP_CREATE,
    SP_TEST_OP_COMMAND,
    SP_TEST_OP_WRITE,
    SP_TEST_OP_SUSPEND,
    SP_TEST_OP_RESUME,
    SP_TEST_OP_DELETE,
    SP_TEST_OP__COUNT
} sp_test_op_t;

#define SP_TEST_OP_BIT(op) (1u << (op))
#define SP_TEST_OPS_BASIC                                                                          \
    (SP_TEST_OP_BIT(SP_TEST_OP_CREATE) | SP_TEST_OP_BIT(SP_TEST_OP_COMMAND) |                      \
     SP_TEST_OP_BIT(SP_TEST_OP_WRITE) | SP_TEST_OP_BIT(SP_TEST_OP_DELETE))

typedef struct {
    int port;
    const char *key;
    int threads;             /* 1..16 */
    int min_calls;           /* each thread makes at least these, whatever happens */
    int max_calls;           /* and at most these (<= 64); between the two, until stopped */
    unsigned ops;            /* SP_TEST_OP_BIT()s */
    const char *busy[2];     /* running sandboxes for commands and writes (NULL: none) */
    const char *command;     /* the shell text of a command ("echo w<thread>-<call>" when NULL) */
    const char *template_id; /* of creates ("tiny" when NULL) */
    int pause_ms;            /* between two calls of a thread */
    int client_ms;           /* a call's deadline (60 s when 0): no answer may take longer */
} sp_test_workload_cfg_t;

typedef struct {
    sp_test_op_t op;
    int rc; /* sp_httpc_do's: < 0 when the exchange itself failed */
    int status;
    int64_t ms;
    bool json_error; /* a non-2xx answer carried the API's {"code", "message"} */
    char id[64];     /* the sandbox (create, write, suspend, resume, delete) or the cmd_id */
    char path[64];   /* a write's path */
    char body[1024]; /* the answer's first bytes */
} sp_test_call_t;

typedef struct sp_test_workload sp_test_workload_t;

/* Starts the threads; fails the test when it cannot. */
sp_test_workload_t *sp_test_workload_start(const sp_test_workload_cfg_t *cfg);
/* Tells the threads to stop once they made min_calls, and waits for them. */
void sp_test_workload_stop(sp_test_workload_t *w);
/* The recorded calls of every thread (after stop), in no particular order across threads. */
size_t sp_test_workload_calls(sp_test_workload_t *w, const sp_test_call_t *const **ret);
/* How sp_test_workload_check judges the answers that are not 2xx. */
typedef enum {
    SP_TEST_ANSWERS_STRICT, /* a refusal with the API's JSON error that is not a 5xx */
    SP_TEST_ANSWERS_OUTAGE, /* the same, and 503 with the JSON error (a dependency is away) */
    SP_TEST_ANSWERS_ANY,    /* any answer or none (a daemon killed mid-call): counted only */
} sp_test_answers_t;

/* Prints calls and answers per kind (stderr), then fails the test when an answer was not
 * clear as answers says (and, unless SP_TEST_ANSWERS_ANY, when an exchange failed or took
 * longer than the client's deadline) or when a 2xx has no accepted fact in db within
 * timeout_ms: SandboxStarted for a 201 create, CommandExited for a command's 200 (whose
 * answer must never be the gateway's "timeout waiting for the worker"), FileWritten for a
 * write's 200, SandboxSuspended / SandboxResumed, SandboxDeleted for a 204. Returns the
 * number of 2xx answers. */
int sp_test_workload_check(sp_test_workload_t *w, PGconn *db, sp_test_answers_t answers,
                           int timeout_ms);
/* The sandboxes the threads created and did not delete (for the test's own cleanup). */
size_t sp_test_workload_own(sp_test_workload_t *w, const char *const **ret);
void sp_test_workload_free(sp_test_workload_t *w);

#endif
