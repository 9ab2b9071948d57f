/* Key rotation (docs/trust.md, "Rotating a key"): `space identity rotate scheduler --grace 4`
 * on a running stack with credentials. What an operator would check:
 *   - the scheduler starts again with a new key, and what it signs now is acted on: a create
 *     is placed and runs (every verifier, holding the old key only, reads the directory again
 *     when the new signature does not verify);
 *   - a daemon elsewhere still signing with the old key (the test, holding a copy of it, as
 *     the scheduler on another host would) is acted on while the grace runs: its delete of a
 *     sandbox is accepted and the sandbox goes;
 *   - past the grace, the same old key signs for nothing: a delete signed with it is stored
 *     rejected (bad_signature) and its sandbox keeps running;
 *   - space-replay verify still verifies the whole log, the rows signed with the old key
 *     included (judged at the time the stream took them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "apikey.h"
#include "eventgen.h"
#include "harness.h"
#include "sign.h"
#include "xmalloc.h"

#define GRACE_S 4

static sp_bus_t *bus; /* the operator's: may publish anything, signs nothing */
static PGconn *db;
static char *key, worker[80];
static int port;

static char *creds_path(const char *file)
{
    return sp_xasprintf("%s/%s", sp_test_env("SPACE_CREDS_DIR"), file);
}

static sp_sign_key_t *load_key(const char *file)
{
    char *path = creds_path(file);
    sp_sign_key_t *k = NULL;
    if (sp_sign_key_load(path, &k) < 0)
        fail_msg("cannot load %s", path);
    free(path);
    return k;
}

/* A SandboxDeleteRequested of id signed "scheduler" with k (what its timeout controller
 * publishes), on the sandbox's worker's subject. Its stream sequence. */
static uint64_t delete_as_scheduler(const char *id, const sp_sign_key_t *k)
{
    sp_eventgen_msg_t m;
    sp_eventgen_msg_t *one[1] = {&m};
    uint64_t seq = 0;
    assert_int_equal(sp_eventgen_sandbox(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED,
                                         "t1", id, worker, &m),
                     0);
    assert_int_equal(sp_eventgen_sign(one, 1, "scheduler", k), 0);
    assert_int_equal(sp_bus_publish(bus, m.subject, m.data, m.len, m.event_id, &seq, NULL), 0);
    sp_eventgen_msg_dispose(&m);
    return seq;
}

static long long state_is(const char *id, const char *state)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM sandboxes WHERE id = '%s' AND state = '%s'",
             id, state);
    return sp_test_db_wait_scalar(db, sql, 1, 15000);
}

static void assert_answers(const char *id)
{
    sp_test_cmd_t r = sp_test_run(port, key, id, "{\"cmd\":\"echo alive\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.stdout_s, "alive\n");
    sp_test_cmd_free(&r);
}

static int setup(void **state)
{
    char key_id[SP_APIKEY_ID_LEN + 1];
    (void)state;
    sp_test_stack_load();
    bus = sp_test_bus();
    db = sp_test_db();
    port = sp_test_api_port();
    snprintf(worker, sizeof(worker), "%s", sp_test_env("SPACE_ID"));
    assert_int_equal(sp_apikey_create(db, "t1", "rotation test", &key, key_id), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(key);
    PQfinish(db);
    sp_bus_free(bus);
    return 0;
}

static void test_rotate_scheduler(void **state)
{
    (void)state;
    char a[64], b[64], c[64], sql[256];
    uint8_t pub_old[SP_PUBKEY_LEN], pub_new[SP_PUBKEY_LEN];

    sp_test_create_sandbox(port, key, "tiny", a);
    sp_test_create_sandbox(port, key, "tiny", b);
    sp_sign_key_t *k_old = load_key("scheduler.key");
    assert_int_equal(sp_sign_key_public(k_old, pub_old), 0);

    char *args = sp_xasprintf("identity rotate scheduler --grace %d", GRACE_S);
    time_t rotated = time(NULL);
    assert_int_equal(sp_test_space(args), 0);
    free(args);

    /* A new key, and the old public key kept as scheduler@<until>.pub. */
    sp_sign_key_t *k_new = load_key("scheduler.key");
    assert_int_equal(sp_sign_key_public(k_new, pub_new), 0);
    assert_memory_not_equal(pub_old, pub_new, SP_PUBKEY_LEN);
    sp_sign_key_free(k_new);
    int found = 0;
    for (time_t u = rotated + GRACE_S; u <= rotated + GRACE_S + 3 && !found; u++) {
        char name[96];
        struct stat sb;
        snprintf(name, sizeof(name), "scheduler@%lld.pub", (long long)u);
        char *p = creds_path(name);
        found = stat(p, &sb) == 0;
        free(p);
    }
    assert_true(found);
    assert_int_equal(sp_test_space("identity rotate scheduler --grace -1"), 2);
    assert_int_equal(sp_test_space("identity rotate nobody"), 1);

    /* The scheduler runs with the new key: its placement is accepted and acted on. */
    sp_test_create_sandbox(port, key, "tiny", c);
    assert_answers(c);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%s' AND type = 'SandboxPlaced'"
             " AND status = 'accepted'",
             c);
    assert_int_equal(sp_test_db_scalar(db, sql), 1);

    /* Within the grace, the old key still counts: a delete signed with it is acted on. */
    uint64_t s1 = delete_as_scheduler(a, k_old);
    sp_test_expect_row(db, s1, "accepted", "", true);
    assert_int_equal(state_is(a, "deleted"), 1);

    /* Past it, the old key counts for nothing: stored rejected, the sandbox keeps running. */
    while (time(NULL) <= rotated + GRACE_S + 1)
        nanosleep(&(struct timespec){.tv_nsec = 200000000}, NULL);
    uint64_t s2 = delete_as_scheduler(b, k_old);
    sp_test_expect_row(db, s2, "rejected", "bad_signature", true);
    nanosleep(&(struct timespec){.tv_sec = 2}, NULL); /* time for the worker to act, if it would */
    assert_int_equal(state_is(b, "running"), 1);
    assert_answers(b);
    sp_sign_key_free(k_old);

    /* The whole log verifies, the old key's rows at the time the stream took them. */
    char out[4096];
    assert_int_equal(sp_test_replay("verify --json", out, sizeof(out)), 0);
    if (!strstr(out, "\"ok\":true") || !strstr(out, "\"bad\":0"))
        fail_msg("space-replay verify: %s", out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotate_scheduler),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
