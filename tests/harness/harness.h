/* Integration test harness: every scenario runs against a real stack that `space up` started
 * into $SPACE_HOME (a CTest fixture). sp_test_stack_load reads $SPACE_HOME/space.env and
 * exports its variables (SPACE_NATS_URL, SPACE_PG_URL, ...) into the environment. */
#ifndef SPACE_TEST_HARNESS_H
#define SPACE_TEST_HARNESS_H

#include <libpq-fe.h>

#include "bus.h"

/* Fails the test (cmocka fail_msg) when the stack is not there. */
void sp_test_stack_load(void);
const char *sp_test_env(const char *name);
/* Connections to the stack; fail the test on error. */
sp_bus_t *sp_test_bus(void);
PGconn *sp_test_db(void);
/* Runs `space <args>` (the CLI next to the test binaries, $SPACE_BIN_DIR/space) and returns
 * its exit status. */
int sp_test_space(const char *args);
/* Polls a scalar SQL query until it returns want, up to timeout_ms. Returns the last value. */
long long sp_test_db_wait_scalar(PGconn *db, const char *sql, long long want, int timeout_ms);
long long sp_test_db_scalar(PGconn *db, const char *sql);

/* Pid of a daemon that `space up` started ($SPACE_HOME/run/<name>.pid), 0 if none. */
int sp_test_daemon_pid(const char *name);
/* SIGKILLs that daemon and waits until it is gone. Fails the test if it was not running. */
void sp_test_daemon_kill9(const char *name);
/* Runs space-replay (next to the test binaries) with args, captures stdout into out (may be
 * NULL) and returns its exit status. */
int sp_test_replay(const char *args, char *out, size_t outlen);

#endif
