/* The intent check (intent.h): one definition of a valid create or delete for the HTTP API and
 * for internal platforms on the bus, and the door's rule that platforms give no environment. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "intent.h"

typedef struct {
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxCreateRequested create;
    Space__V1__SandboxDeleteRequested del;
    Space__V1__Resources res;
    char *env_names[1];
    char id[37];
} fixture_t;

static void make_create(fixture_t *f, const char *signer)
{
    memset(f, 0, sizeof(*f));
    space__v1__envelope__init(&f->env);
    space__v1__aggregate__init(&f->agg);
    space__v1__sandbox_create_requested__init(&f->create);
    space__v1__resources__init(&f->res);
    f->agg.kind = "sandbox";
    f->agg.id = "sbx_intent01";
    f->res.vcpu = 1;
    f->res.memory_mb = 512;
    f->create.template_ = "tiny";
    f->create.timeout_s = 300;
    f->create.resources = &f->res;
    f->env.aggregate = &f->agg;
    f->env.tenant = "t-acme";
    f->env.actor = (char *)signer;
    f->env.signer = (char *)signer;
    f->env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED;
    f->env.sandbox_create_requested = &f->create;
    sp_envelope_stamp(&f->env, f->id);
}

/* Refused by the intent check with code and a reason naming needle; when wire_ok, the bus's
 * schema alone lets it through (so it is stored, then refused in the open by the scheduler). */
static void expect_refused(fixture_t *f, int want, const char *code, const char *needle,
                           bool wire_ok)
{
    char reason[SP_REASON_MAX] = "", why[SP_REASON_MAX];
    const char *got = NULL;

    assert_int_equal(sp_intent_check(&f->env, reason, &got), want);
    assert_non_null(got);
    assert_string_equal(got, code);
    if (!strstr(reason, needle))
        fail_msg("reason '%s' lacks '%s'", reason, needle);
    assert_int_equal(sp_envelope_validate(&f->env, why) == 0, wire_ok);
}

static void test_valid(void **state)
{
    char reason[SP_REASON_MAX];
    const char *code = "untouched";
    fixture_t f;

    (void)state;
    make_create(&f, "platform-acme");
    assert_int_equal(sp_intent_check(&f.env, reason, &code), 0);
    assert_string_equal(code, "untouched"); /* written only on a refusal */

    /* The limits themselves pass; 0 means the default. */
    f.create.timeout_s = SP_INTENT_TIMEOUT_MAX_S;
    f.create.idle_suspend_s = SP_INTENT_TIMEOUT_MAX_S;
    f.create.on_timeout = "suspend";
    f.create.project = "proj.1";
    f.res.vcpu = SP_INTENT_VCPU_MAX;
    f.res.memory_mb = SP_INTENT_MEMORY_MB_MAX;
    f.res.disk_mb = SP_INTENT_DISK_MB_MAX;
    assert_int_equal(sp_intent_check(&f.env, reason, NULL), 0);
    f.res.disk_mb = SP_INTENT_DISK_MB_MIN;
    assert_int_equal(sp_intent_check(&f.env, reason, NULL), 0);
    f.res.vcpu = 0;
    f.create.resources = NULL;
    assert_int_equal(sp_intent_check(&f.env, NULL, NULL), 0);
}

static void test_values(void **state)
{
    fixture_t f;

    (void)state;
    make_create(&f, "platform-acme");
    f.create.template_ = "Not A Template";
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "template", true);

    make_create(&f, "gateway");
    f.create.template_ = "../etc";
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "template", true);

    make_create(&f, "platform-acme");
    f.create.timeout_s = SP_INTENT_TIMEOUT_MAX_S + 1;
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "timeout_s: 2592001 is over", true);

    make_create(&f, "platform-acme");
    f.create.idle_suspend_s = 99999999;
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "idle_suspend_s", true);

    make_create(&f, "platform-acme");
    f.create.on_timeout = "never";
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "on_timeout", true);

    make_create(&f, "platform-acme");
    f.res.vcpu = SP_INTENT_VCPU_MAX + 1;
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "resources.vcpu", true);

    make_create(&f, "platform-acme");
    f.res.memory_mb = SP_INTENT_MEMORY_MB_MAX + 1;
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "resources.memory_mb", true);

    make_create(&f, "platform-acme");
    f.res.disk_mb = SP_INTENT_DISK_MB_MAX + 1;
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "resources.disk_mb", true);
    make_create(&f, "platform-acme");
    f.res.disk_mb = SP_INTENT_DISK_MB_MIN - 1;
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "resources.disk_mb: 15 is outside", true);

    make_create(&f, "platform-acme");
    f.create.project = "-starts-badly";
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "project", true);
}

/* What the schema refuses comes through the same call with the same code. */
static void test_schema_included(void **state)
{
    fixture_t f;

    (void)state;
    make_create(&f, "gateway");
    f.env_names[0] = "1BAD=NAME";
    f.create.env_names = f.env_names;
    f.create.n_env_names = 1;
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "env_names", false);

    make_create(&f, "gateway");
    f.create.template_ = "";
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "template", false);

    make_create(&f, "gateway");
    f.agg.id = "Bad Id";
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "aggregate", false);
}

/* Environment values travel only on the data plane: a platform has none, the gateway does. */
static void test_platform_env(void **state)
{
    char reason[SP_REASON_MAX];
    fixture_t f;

    (void)state;
    make_create(&f, "platform-acme");
    f.env_names[0] = "API_URL";
    f.create.env_names = f.env_names;
    f.create.n_env_names = 1;
    expect_refused(&f, SP_ENOTALLOWED, SP_INTENT_ENV_REFUSED, "platform-acme", true);

    f.env.signer = "gateway";
    assert_int_equal(sp_intent_check(&f.env, reason, NULL), 0);
    /* Unsigned (a test, an old producer): no door's rule applies here; the trust check
     * decides whether an unsigned envelope is acted on at all. */
    f.env.signer = "";
    assert_int_equal(sp_intent_check(&f.env, reason, NULL), 0);
}

static void test_delete_and_other_types(void **state)
{
    char reason[SP_REASON_MAX];
    const char *code = NULL;
    fixture_t f;

    (void)state;
    make_create(&f, "platform-acme");
    space__v1__sandbox_delete_requested__init(&f.del);
    f.del.reason = "done";
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED;
    f.env.sandbox_create_requested = NULL;
    f.env.sandbox_delete_requested = &f.del;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_intent_check(&f.env, reason, &code), 0);

    f.del.reason = "bad\x01control";
    expect_refused(&f, SP_ESCHEMA, SP_INTENT_INVALID, "reason", false);

    /* A fact is no intent. */
    Space__V1__SandboxPaused paused = SPACE__V1__SANDBOX_PAUSED__INIT;
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSED;
    f.env.sandbox_paused = &paused;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_intent_check(&f.env, reason, &code), SP_ETYPE);
    assert_string_equal(code, SP_INTENT_NOT_AN_INTENT);
    assert_int_equal(sp_intent_check(NULL, reason, &code), SP_ETYPE);
}

/* A worker builds the sandbox from SandboxPlaced's request: its schema includes the values. */
static void test_placed_carries_checked_request(void **state)
{
    char reason[SP_REASON_MAX];
    Space__V1__SandboxPlaced placed = SPACE__V1__SANDBOX_PLACED__INIT;
    fixture_t f;

    (void)state;
    make_create(&f, "scheduler");
    placed.worker = "w1";
    placed.scheduler = "scheduler";
    placed.request = &f.create;
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED;
    f.env.sandbox_create_requested = NULL;
    f.env.sandbox_placed = &placed;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    f.create.timeout_s = SP_INTENT_TIMEOUT_MAX_S + 1;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "timeout_s"));
    f.create.timeout_s = 1;
    f.create.template_ = "UPPER";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "template"));
}

static void test_names(void **state)
{
    (void)state;
    assert_true(sp_intent_env_name_ok("_A1"));
    assert_false(sp_intent_env_name_ok("1A"));
    assert_false(sp_intent_env_name_ok(""));
    assert_false(sp_intent_env_name_ok(NULL));
    assert_false(sp_intent_env_name_ok("A-B"));
    char longname[SP_INTENT_ENV_NAME_MAX + 2];
    memset(longname, 'A', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_false(sp_intent_env_name_ok(longname));
    longname[SP_INTENT_ENV_NAME_MAX] = '\0';
    assert_true(sp_intent_env_name_ok(longname));
    assert_true(sp_intent_on_timeout_ok("delete"));
    assert_false(sp_intent_on_timeout_ok(""));
    assert_false(sp_intent_on_timeout_ok(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_schema_included),
        cmocka_unit_test(test_platform_env),
        cmocka_unit_test(test_delete_and_other_types),
        cmocka_unit_test(test_placed_carries_checked_request),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
