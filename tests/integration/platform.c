/* The door for internal platforms (docs/platforms.md), through the real CLI against the real
 * stack: `space platform add acme --tenants t-acme` makes the identity and its tenants file;
 * `space platform publish acme ...` signs intents as platform-acme on the bus and reports the
 * outcome. A create runs and a delete deletes; a tenant the platform does not have is refused
 * (the event log's tenant_not_allowed; after the scheduler's trust check, also its
 * SandboxRequestRejected) and leaves no sandbox; values the intent check refuses come back as
 * the scheduler's SandboxRequestRejected with the check's reason; tenants given again take
 * effect in the running event log. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "apikey.h"
#include "harness.h"
#include "xmalloc.h"

#define OUT_MAX 8192

static PGconn *db;

/* Runs `space <args>` with stdout and stderr into out; its exit status. */
static int space(const char *args, char out[OUT_MAX])
{
    const char *bin = getenv("SPACE_BIN_DIR");
    char *cmd = sp_xasprintf("'%s/space' %s 2>&1", bin ? bin : ".", args);
    FILE *p = popen(cmd, "r"); /* NOLINT(cert-env33-c): the CLI as an operator runs it */
    size_t n = 0;

    free(cmd);
    assert_non_null(p);
    while (n + 1 < OUT_MAX) {
        size_t got = fread(out + n, 1, OUT_MAX - 1 - n, p);
        if (got == 0)
            break;
        n += got;
    }
    out[n] = '\0';
    int st = pclose(p);
    print_message("$ space %s\n%s", args, out);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_in(const char *out, const char *needle)
{
    if (!strstr(out, needle))
        fail_msg("output lacks '%s':\n%s", needle, out);
}

/* The sandbox id of a publish's first line ("... : sandbox <id>"). */
static void published_id(const char *out, char id[64])
{
    const char *p = strstr(out, ": sandbox ");
    assert_non_null(p);
    p += strlen(": sandbox ");
    size_t n = strcspn(p, " \n");
    assert_true(n > 0 && n < 64);
    memcpy(id, p, n);
    id[n] = '\0';
}

/* A scalar of SQL made with sp_xasprintf (taken and freed). */
static long long scalar_take(char *sql)
{
    long long v = sp_test_db_scalar(db, sql);
    free(sql);
    return v;
}
#define scalar(fmt, a, b) scalar_take(sp_xasprintf(fmt, a, b))

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    db = sp_test_db();
    /* A create needs a live worker with the template. */
    assert_int_equal(sp_test_db_wait_scalar(db,
                                            "SELECT count(*) FROM workers WHERE state = 'up' "
                                            "AND templates ? 'tiny'",
                                            1, 60000),
                     1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    PQfinish(db);
    return 0;
}

static void test_add(void **state)
{
    char out[OUT_MAX];

    (void)state;
    assert_int_equal(space("platform add acme --tenants t-acme", out), 0);
    expect_in(out, "platform-acme created");
    expect_in(out, "platform-acme.{nk,nkpub}");
    expect_in(out, "platform-acme.key");
    expect_in(out, "may act for 1 tenant");
    expect_in(out, "platform-acme connects to");
    assert_int_equal(space("platform ls", out), 0);
    expect_in(out, "acme  tenants t-acme");

    /* Usage: no tenants, a tenant that is no id. */
    assert_int_equal(space("platform add acme", out), 2);
    assert_int_equal(space("platform add acme --tenants 'Not One'", out), 2);
    expect_in(out, "is not an id");
}

static void test_create_and_delete(void **state)
{
    char out[OUT_MAX], id[64];

    (void)state;
    assert_int_equal(space("platform publish acme --tenant t-acme create tiny --timeout 300", out),
                     0);
    expect_in(out, "published SandboxCreateRequested");
    expect_in(out, "as platform-acme for tenant t-acme");
    published_id(out, id);
    expect_in(out, " running on ");
    assert_int_equal(scalar("SELECT count(*) FROM sandboxes WHERE id = '%s' AND tenant = '%s' "
                            "AND state = 'running'",
                            id, "t-acme"),
                     1);
    /* The log holds the intent as the platform's. */
    assert_int_equal(scalar("SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = "
                            "'SandboxCreateRequested' AND status = 'accepted' AND actor = '%s'",
                            id, "platform-acme"),
                     1);

    char *args = sp_xasprintf("platform publish acme --tenant t-acme delete %s", id);
    assert_int_equal(space(args, out), 0);
    free(args);
    expect_in(out, "published SandboxDeleteRequested");
    expect_in(out, "deleted");
    assert_int_equal(
        scalar("SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = '%s'", id, "deleted"),
        1);
}

/* `space platform publish OP ID` as platform-acme for t-acme; its exit status, output in out. */
static int publish_op(const char *op, const char *id, const char *more, char out[OUT_MAX])
{
    char *args = sp_xasprintf("platform publish acme --tenant t-acme %s %s %s", op, id, more);
    int rc = space(args, out);
    free(args);
    return rc;
}

/* Pause, resume, suspend, resume from suspended and a new timeout, each published by the
 * platform on the scheduler's subject: each ends in its state, and the scheduler forwarded
 * what the worker does in an intent it signed itself. */
static void test_lifecycle(void **state)
{
    static const struct {
        const char *op, *state;
    } steps[] = {{"pause", "paused"},
                 {"resume", "running"},
                 {"suspend", "suspended"},
                 {"resume", "running"}};
    char out[OUT_MAX], id[64], want[128];

    (void)state;
    assert_int_equal(space("platform publish acme --tenant t-acme create tiny --timeout 300", out),
                     0);
    published_id(out, id);
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        assert_int_equal(publish_op(steps[i].op, id, "", out), 0);
        snprintf(want, sizeof(want), "sandbox %s %s", id, steps[i].state);
        expect_in(out, want);
        assert_int_equal(scalar("SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = '%s'",
                                id, steps[i].state),
                         1);
    }
    assert_int_equal(scalar("SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = "
                            "'%s' AND status = 'accepted' AND causation_id IS NOT NULL AND actor "
                            "= 'platform-acme'",
                            id, "SandboxPauseRequested"),
                     1); /* the scheduler's forward, caused by the platform's intent */
    assert_int_equal(publish_op("timeout", id, "--timeout 1234", out), 0);
    expect_in(out, "timeout 1234 s");
    assert_int_equal(
        scalar("SELECT count(*) FROM sandboxes WHERE id = '%s' AND timeout_s = %s", id, "1234"), 1);
    /* A timeout the schema refuses (our encoder already: a platform's own would meet the
     * event log's schema check), and a pause of a sandbox that is not running. */
    assert_int_equal(publish_op("timeout", id, "--timeout 0", out), 1);
    expect_in(out, "does not match the schema");
    assert_int_equal(publish_op("delete", id, "", out), 0);
    assert_int_equal(publish_op("pause", id, "", out), 1);
    expect_in(out, "refused");
}

/* A platform names one of its own tenants but another tenant's sandbox: nothing happens to
 * that sandbox, whatever the intent (its signature is valid; the tenant is not its owner). */
static void test_other_tenants_sandbox(void **state)
{
    char out[OUT_MAX], victim[64], key_id[SP_APIKEY_ID_LEN + 1], *key = NULL;
    static const char *const ops[] = {"pause", "suspend", "delete"};
    int port = sp_test_api_port();

    (void)state;
    assert_int_equal(sp_apikey_create(db, "t-victim", "platform test", &key, key_id), 0);
    sp_test_create_sandbox(port, key, "tiny", victim);
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        assert_int_equal(publish_op(ops[i], victim, "--wait-s 5", out), 1);
        expect_in(out, "refused");
    }
    assert_int_equal(publish_op("timeout", victim, "--timeout 60 --wait-s 5", out), 1);
    nanosleep(&(struct timespec){.tv_sec = 2}, NULL); /* time for a worker to act, if it would */
    assert_int_equal(scalar("SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = '%s'",
                            victim, "running"),
                     1);
    assert_int_equal(scalar("SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type IN "
                            "('SandboxPaused', 'SandboxSuspending', 'SandboxDeleted') AND tenant "
                            "<> '%s'",
                            victim, "t-victim"),
                     0);
    assert_int_equal(scalar("SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type IN "
                            "('SandboxPaused', 'SandboxSuspending', 'SandboxDeleted') AND tenant "
                            "= '%s'",
                            victim, "t-victim"),
                     0);
    sp_test_cmd_t r = sp_test_run(port, key, victim, "{\"cmd\":\"echo mine\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.stdout_s, "mine\n");
    sp_test_cmd_free(&r);
    free(key);
}

static void test_other_tenant_refused(void **state)
{
    char out[OUT_MAX], id[64];

    (void)state;
    assert_int_equal(space("platform publish acme --tenant t-other create tiny --timeout 60", out),
                     1);
    published_id(out, id);
    expect_in(out, "refused");
    expect_in(out, "tenant_not_allowed");
    expect_in(out, "platform-acme may not act for tenant t-other");
    assert_int_equal(
        scalar("SELECT count(*) FROM sandboxes WHERE tenant = '%s' OR id = '%s'", "t-other", id),
        0);

    /* Nothing about it is accepted, and the scheduler, checking the signer's tenants too,
     * places nothing: no placement at all, nothing on the host. */
    assert_int_equal(scalar("SELECT count(*) FROM events WHERE aggregate_id = '%s' AND status = "
                            "'%s'",
                            id, "accepted"),
                     0);
    nanosleep(&(struct timespec){.tv_sec = 2}, NULL);
    assert_int_equal(scalar("SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = "
                            "'%s'",
                            id, "SandboxPlaced"),
                     0);
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/worker", sp_test_env("SPACE_HOME"));
    assert_false(sp_test_sandbox_held(dir, id));

    /* A delete for another tenant's sandbox is no better. */
    assert_int_equal(space("platform publish acme --tenant t-other delete sbx_not_theirs", out), 1);
    expect_in(out, "tenant_not_allowed");
}

/* Values the intent check refuses: stored (the bus's schema takes them), then refused by the
 * scheduler as SandboxRequestRejected with the check's reason, and the sandbox failed. */
static void test_values_refused(void **state)
{
    char out[OUT_MAX], id[64];

    (void)state;
    assert_int_equal(space("platform publish acme --tenant t-acme create Bad.Template", out), 1);
    published_id(out, id);
    expect_in(out, "refused by scheduler: invalid_field: template: not a template name");
    assert_int_equal(scalar("SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = 'failed' "
                            "AND failure_reason = '%s'",
                            id, "invalid_field"),
                     1);

    assert_int_equal(
        space("platform publish acme --tenant t-acme create tiny --timeout 2592001", out), 1);
    expect_in(out, "refused by scheduler: invalid_field: timeout_s: 2592001 is over 2592000");

    /* The CLI's own bounds. */
    assert_int_equal(space("platform publish acme --tenant t-acme create tiny --timeout -1", out),
                     2);
    assert_int_equal(space("platform publish acme create tiny", out), 2);
}

/* Tenants given again replace the old ones, and the running event log follows. */
static void test_tenants_change(void **state)
{
    char out[OUT_MAX], id[64];

    (void)state;
    assert_int_equal(space("platform add acme --tenants t-beta,t-beta", out), 0);
    expect_in(out, "platform-acme exists, kept");
    expect_in(out, "may act for 1 tenant");
    assert_int_equal(space("platform ls", out), 0);
    expect_in(out, "acme  tenants t-beta\n");

    assert_int_equal(space("platform publish acme --tenant t-beta create tiny --timeout 300", out),
                     0);
    published_id(out, id);
    expect_in(out, " running on ");
    char *args = sp_xasprintf("platform publish acme --tenant t-beta delete %s", id);
    assert_int_equal(space(args, out), 0);
    free(args);

    assert_int_equal(space("platform publish acme --tenant t-acme create tiny", out), 1);
    expect_in(out, "tenant_not_allowed");
}

/* examples/platform_create.c, as a platform team would run it with its credentials. */
static void test_example_program(void **state)
{
    char out[OUT_MAX], id[64];
    const char *bin = getenv("SPACE_BIN_DIR");

    (void)state;
    char *cmd = sp_xasprintf("'%s/platform_create' '%s' '%s' acme t-beta tiny 2>&1", bin,
                             sp_test_env("SPACE_NATS_URL"), sp_test_env("SPACE_CREDS_DIR"));
    FILE *p = popen(cmd, "r"); /* NOLINT(cert-env33-c) */
    free(cmd);
    assert_non_null(p);
    size_t n = fread(out, 1, OUT_MAX - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    print_message("platform_create:\n%s", out);
    assert_int_equal(sscanf(out, "sandbox %63s", id), 1);
    char *sql = sp_xasprintf("SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = "
                             "'running'",
                             id);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 1, 30000), 1);
    free(sql);
    char *args = sp_xasprintf("platform publish acme --tenant t-beta delete %s", id);
    assert_int_equal(space(args, out), 0);
    free(args);

    /* Its own check refuses a bad template before anything is sent. */
    cmd = sp_xasprintf("'%s/platform_create' '%s' '%s' acme t-beta Bad.Template >/dev/null 2>&1",
                       bin, sp_test_env("SPACE_NATS_URL"), sp_test_env("SPACE_CREDS_DIR"));
    int st = system(cmd); /* NOLINT(cert-env33-c) */
    free(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_create_and_delete),
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_other_tenants_sandbox),
        cmocka_unit_test(test_other_tenant_refused),
        cmocka_unit_test(test_values_refused),
        cmocka_unit_test(test_tenants_change),
        cmocka_unit_test(test_example_program),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
