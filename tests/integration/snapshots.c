/* Named snapshots through HTTP on a real stack (eventlog, scheduler, worker with runsc,
 * gateway; docs/snapshots.md): a snapshot of a running sandbox leaves it running; what was on
 * its disk and in its memory before the snapshot is in every sandbox made from it, what it
 * wrote after is in none; two sandboxes from one snapshot are apart from each other; another
 * tenant neither sees nor uses nor deletes it; a delete (its sandbox suspended meanwhile)
 * removes its artifacts and a later create from it is refused with a clear error. */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "apikey.h"
#include "buf.h"
#include "db.h"
#include "envelope.h"
#include "harness.h"
#include "json.h"
#include "xmalloc.h"

static int port;
static const char *key;
static char *key2; /* another tenant's */
static char src[64], snap[64];

static int setup(void **state)
{
    (void)state;
    sp_test_stack_load();
    port = sp_test_api_port();
    key = sp_test_env("SPACE_API_KEY");
    PGconn *db = sp_test_db();
    char key_id[SP_APIKEY_ID_LEN + 1];
    if (sp_apikey_create(db, "snapshots-other", "snapshots test", &key2, key_id) < 0)
        fail_msg("cannot make the other tenant's key");
    PQfinish(db);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (key2) {
        explicit_bzero(key2, strlen(key2));
        free(key2);
    }
    return 0;
}

/* stdout of cmd in sandbox id ("" when it failed), into out. */
static int run(const char *id, const char *cmd, char *out, size_t len)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_puts(&b, "{\"cmd\":");
    sp_buf_json_str(&b, cmd);
    sp_buf_putc(&b, '}');
    sp_test_cmd_t r = sp_test_run(port, key, id, b.data);
    sp_buf_dispose(&b);
    int status = r.status;
    int64_t code = r.exit_code;
    snprintf(out, len, "%s", r.status == 200 && r.stdout_s ? r.stdout_s : "");
    size_t n = strlen(out);
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r'))
        out[--n] = '\0';
    sp_test_cmd_free(&r);
    return status == 200 ? (int)code : -status;
}

static int http(const char *method, const char *path, const char *k, const char *body,
                sp_test_http_resp_t *r)
{
    sp_test_http(port, method, path, k, body ? "Content-Type: application/json\r\n" : NULL, body,
                 body ? strlen(body) : 0, r);
    print_message("%s %s: %d %.300s\n", method, path, r->status, r->body ? r->body : "");
    return r->status;
}

static const char *err_code(const sp_test_http_resp_t *r, char *out, size_t len)
{
    sp_json_doc_t *doc = sp_test_json(r);
    const sp_json_t *e = sp_json_get(sp_json_root(doc), "error");
    const char *c = sp_json_str(sp_json_get(e ? e : sp_json_root(doc), "code"), NULL);
    snprintf(out, len, "%s", c ? c : "");
    sp_json_doc_free(doc);
    return out;
}

static void test_take(void **state)
{
    (void)state;
    char out[256];
    sp_test_create_sandbox(port, key, "tiny", src);
    assert_int_equal(run(src, "echo before > /root/disk && echo mem > /tmp/mem", out, sizeof(out)),
                     0);
    sp_test_http_resp_t r;
    char path[256];
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/snapshots", src);
    assert_int_equal(http("POST", path, key, "{\"name\":\"first one\"}", &r), 201);
    sp_json_doc_t *doc = sp_test_json(&r);
    const char *id = sp_json_str(sp_json_get(sp_json_root(doc), "snapshot_id"), NULL);
    assert_non_null(id);
    snprintf(snap, sizeof(snap), "%s", id);
    assert_string_equal(sp_json_str(sp_json_get(sp_json_root(doc), "name"), NULL), "first one");
    assert_string_equal(sp_json_str(sp_json_get(sp_json_root(doc), "sandbox_id"), NULL), src);
    assert_string_equal(sp_json_str(sp_json_get(sp_json_root(doc), "template"), NULL), "tiny");
    sp_json_doc_free(doc);
    sp_test_http_free(&r);
    print_message("snapshot %s of %s\n", snap, src);

    /* The sandbox runs on, with what it had. */
    assert_int_equal(run(src, "cat /root/disk /tmp/mem", out, sizeof(out)), 0);
    assert_string_equal(out, "before\nmem");
    assert_int_equal(
        run(src, "echo after > /root/after && echo after > /tmp/after", out, sizeof(out)), 0);
    /* Its artifacts are in the store. */
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/snapshots/named/%s/checkpoint.img.zst",
             sp_test_env("SPACE_HOME"), snap);
    assert_int_equal(access(dir, R_OK), 0);

    /* Only running sandboxes: a name that is not one is refused before anything happens. */
    assert_int_equal(http("POST", path, key, "{\"name\":\"\"}", &r), 400);
    sp_test_http_free(&r);
    assert_int_equal(http("POST", "/v1/sandboxes/sbx_nosuch/snapshots", key, NULL, &r), 404);
    sp_test_http_free(&r);
}

static void test_create_from(void **state)
{
    (void)state;
    char body[128], a[64], b[64], out[256], host_a[128], host_b[128], host_src[128];
    snprintf(body, sizeof(body), "{\"snapshot\":\"%s\"}", snap);
    sp_test_create_sandbox_body(port, key, body, a);
    sp_test_create_sandbox_body(port, key, body, b);
    assert_string_not_equal(a, b);
    assert_string_not_equal(a, src);
    const char *ids[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        /* Disk and memory of the moment of the snapshot; nothing written after. */
        assert_int_equal(run(ids[i], "cat /root/disk /tmp/mem", out, sizeof(out)), 0);
        assert_string_equal(out, "before\nmem");
        assert_int_not_equal(run(ids[i], "cat /root/after", out, sizeof(out)), 0);
        assert_int_not_equal(run(ids[i], "cat /tmp/after", out, sizeof(out)), 0);
    }
    /* They go apart: what one writes, the other and the source do not see. */
    assert_int_equal(
        run(a, "echo only-a > /root/mine && echo only-a > /tmp/mine", out, sizeof(out)), 0);
    assert_int_not_equal(run(b, "cat /root/mine", out, sizeof(out)), 0);
    assert_int_not_equal(run(b, "cat /tmp/mine", out, sizeof(out)), 0);
    assert_int_not_equal(run(src, "cat /root/mine", out, sizeof(out)), 0);
    assert_int_equal(run(a, "cat /root/mine", out, sizeof(out)), 0);
    assert_string_equal(out, "only-a");
    /* Each its own hostname, its id: the restored kernel had the source's (docs/snapshots.md). */
    assert_int_equal(run(src, "hostname", host_src, sizeof(host_src)), 0);
    assert_int_equal(run(a, "hostname", host_a, sizeof(host_a)), 0);
    assert_int_equal(run(b, "hostname", host_b, sizeof(host_b)), 0);
    print_message("hostnames: source %s, copies %s and %s\n", host_src, host_a, host_b);
    assert_string_equal(host_src, src);
    assert_string_equal(host_a, a);
    assert_string_equal(host_b, b);
    /* The agent sets it with CAP_SYS_ADMIN, which it keeps to itself: root in a copy has it in
     * no set, cannot set the hostname, and cannot reach into the agent (ptrace's access rules,
     * the agent is not dumpable). */
    assert_int_equal(
        run(a, "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status", out, sizeof(out)), 0);
    print_message("a root command's capabilities:\n%s\n", out);
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        const char *hex = strchr(line, ':');
        assert_non_null(hex);
        unsigned long long caps = strtoull(hex + 1, NULL, 16);
        if (strncmp(line, "CapBnd", 6) == 0)
            assert_true(caps & (1ULL << 0)); /* CAP_CHOWN, which root has: parsed right */
        assert_false(caps & (1ULL << 21));   /* CAP_SYS_ADMIN */
    }
    assert_int_not_equal(run(a, "hostname evil", out, sizeof(out)), 0);
    assert_int_equal(run(a, "hostname", out, sizeof(out)), 0);
    assert_string_equal(out, a);
    sp_test_put_program(port, key, a, "reach-probe", "/root/reach-probe");
    char probe[512];
    assert_int_equal(run(a, "/root/reach-probe 1", probe, sizeof(probe)), 0);
    print_message("root in a copy, at its agent:\n%s\n", probe);
    /* (this runsc has no process_vm_readv/writev: ENOSYS) */
    static const char *const denied[] = {"ptrace_attach", "ptrace_seize", "process_vm_readv",
                                         "process_vm_writev", "open_mem"};
    for (size_t i = 0; i < sizeof(denied) / sizeof(denied[0]); i++) {
        char ok[64];
        snprintf(ok, sizeof(ok), "%s: ok", denied[i]);
        if (!strstr(probe, denied[i]) || strstr(probe, ok))
            fail_msg("%s: not refused", denied[i]);
    }
    /* The probe can tell: at a child of its own, the same calls succeed. */
    assert_int_equal(run(a, "/root/reach-probe 0", probe, sizeof(probe)), 0);
    print_message("root at its own child:\n%s\n", probe);
    assert_non_null(strstr(probe, "ptrace_attach: ok"));
    assert_non_null(strstr(probe, "open_mem: ok"));

    /* Each has a network of its own: its own SandboxStarted address. */
    PGconn *db = sp_test_db();
    char sql[512];
    snprintf(sql, sizeof(sql),
             "SELECT count(DISTINCT aggregate_id) FROM events WHERE type = 'SandboxStarted' AND "
             "status = 'accepted' AND aggregate_id IN ('%s', '%s')",
             a, b);
    assert_int_equal(sp_test_db_scalar(db, sql), 2);
    PQfinish(db);

    /* Resources come from the snapshot; a template that is not its own is refused. */
    sp_test_http_resp_t r;
    snprintf(body, sizeof(body), "{\"snapshot\":\"%s\",\"template\":\"base\"}", snap);
    assert_int_equal(http("POST", "/v1/sandboxes", key, body, &r), 400);
    sp_test_http_free(&r);
    for (int i = 0; i < 2; i++) {
        char path[128];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", ids[i]);
        assert_int_equal(http("DELETE", path, key, NULL, &r), 204);
        sp_test_http_free(&r);
    }
}

static void test_other_tenant(void **state)
{
    (void)state;
    sp_test_http_resp_t r;
    char body[128], path[128], code[64];
    assert_int_equal(http("GET", "/v1/snapshots", key2, NULL, &r), 200);
    assert_null(strstr(r.body, snap));
    sp_test_http_free(&r);
    snprintf(body, sizeof(body), "{\"snapshot\":\"%s\"}", snap);
    assert_int_equal(http("POST", "/v1/sandboxes", key2, body, &r), 404);
    assert_string_equal(err_code(&r, code, sizeof(code)), "snapshot_not_found");
    sp_test_http_free(&r);
    snprintf(path, sizeof(path), "/v1/snapshots/%s", snap);
    assert_int_equal(http("DELETE", path, key2, NULL, &r), 404);
    sp_test_http_free(&r);
    /* Nor may it snapshot the first tenant's sandbox. */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/snapshots", src);
    assert_int_equal(http("POST", path, key2, NULL, &r), 404);
    sp_test_http_free(&r);
    /* The owner sees it. */
    assert_int_equal(http("GET", "/v1/snapshots", key, NULL, &r), 200);
    assert_non_null(strstr(r.body, snap));
    assert_non_null(strstr(r.body, "first one"));
    sp_test_http_free(&r);
}

static void test_delete(void **state)
{
    (void)state;
    sp_test_http_resp_t r;
    char path[128], body[128], code[64], dir[512], state_s[64];
    /* Its sandbox is suspended first: placed on no worker now, and the worker that took the
     * snapshot still removes it and says so (docs/snapshots.md, "Delete"). */
    assert_int_equal(sp_test_lifecycle(port, key, src, "suspend", "", state_s, sizeof(state_s)),
                     200);
    assert_string_equal(state_s, "suspended");
    snprintf(path, sizeof(path), "/v1/snapshots/%s", snap);
    assert_int_equal(http("DELETE", path, key, NULL, &r), 204);
    sp_test_http_free(&r);
    snprintf(dir, sizeof(dir), "%s/snapshots/named/%s", sp_test_env("SPACE_HOME"), snap);
    struct stat st;
    assert_int_not_equal(stat(dir, &st), 0);
    assert_int_equal(http("GET", "/v1/snapshots", key, NULL, &r), 200);
    assert_null(strstr(r.body, snap));
    sp_test_http_free(&r);
    snprintf(body, sizeof(body), "{\"snapshot\":\"%s\"}", snap);
    assert_int_equal(http("POST", "/v1/sandboxes", key, body, &r), 404);
    assert_string_equal(err_code(&r, code, sizeof(code)), "snapshot_not_found");
    sp_test_http_free(&r);
    assert_int_equal(http("DELETE", path, key, NULL, &r), 404);
    sp_test_http_free(&r);
}

/* The address a sandbox started with (SandboxStarted), into out. */
static void started_address(PGconn *db, const char *id, char *out, size_t len)
{
    sp_envelope_t *ev = NULL;
    assert_int_equal(sp_db_last_sandbox_event(db, id, "SandboxStarted", &ev), 0);
    snprintf(out, len, "%s", ev->sandbox_started->address);
    sp_envelope_free(ev);
}

static long counter(const char *id)
{
    char out[64];
    /* `echo $n > /tmp/c` truncates before it writes: a read in between finds the file empty,
     * which is not a count (as sp_test_counter): read again. */
    for (int i = 0; i < 20; i++) {
        if (run(id, "cat /tmp/c", out, sizeof(out)) != 0)
            return -1;
        if (out[0])
            break;
        usleep(20 * 1000);
    }
    return strtol(out, NULL, 10);
}

/* Fork of a sandbox running a counter loop: every copy counts on, on its own; each has its
 * own id and address, and the source's network policy; the anonymous snapshot is gone
 * afterwards. */
static void test_fork(void **state)
{
    (void)state;
    char fsrc[64], out[256], path[128];
    sp_test_create_sandbox_body(port, key,
                                "{\"template\":\"tiny\",\"network\":{\"mode\":\"allowlist\","
                                "\"allow\":[\"fork-allowed.test\"]}}",
                                fsrc);
    sp_test_cmd_t c = sp_test_run(port, key, fsrc,
                                  "{\"cmd\":\"n=0; while [ ! -e /tmp/stop ]; do n=$((n+1)); "
                                  "echo $n > /tmp/c; sleep 0.2; done\",\"background\":true}");
    sp_test_cmd_free(&c);
    usleep(600 * 1000);
    assert_true(counter(fsrc) > 0);
    sp_test_http_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/fork", fsrc);
    assert_int_equal(http("POST", path, key, "{\"count\":0}", &r), 400);
    sp_test_http_free(&r);
    assert_int_equal(http("POST", path, key, "{\"count\":17}", &r), 400);
    sp_test_http_free(&r);
    assert_int_equal(http("POST", path, key, "{\"count\":3}", &r), 201);
    sp_json_doc_t *doc = sp_test_json(&r);
    const sp_json_t *arr = sp_json_get(sp_json_root(doc), "sandbox_ids");
    assert_int_equal(sp_json_len(arr), 3);
    char ids[3][64];
    for (size_t i = 0; i < 3; i++)
        snprintf(ids[i], sizeof(ids[i]), "%s", sp_json_str(sp_json_at(arr, i), NULL));
    char fsnap[64];
    snprintf(fsnap, sizeof(fsnap), "%s",
             sp_json_str(sp_json_get(sp_json_root(doc), "snapshot_id"), NULL));
    sp_json_doc_free(doc);
    sp_test_http_free(&r);

    /* Each counts on from where the source was. */
    long before[3], after[3];
    for (int i = 0; i < 3; i++)
        assert_true((before[i] = counter(ids[i])) > 0);
    /* One copy's counter stopped: the others and the source count on. */
    assert_int_equal(run(ids[0], "touch /tmp/stop", out, sizeof(out)), 0);
    usleep(500 * 1000);
    before[0] = counter(ids[0]);
    long src_before = counter(fsrc);
    sleep(2);
    for (int i = 0; i < 3; i++)
        after[i] = counter(ids[i]);
    long src_after = counter(fsrc);
    print_message("fork counters: %ld->%ld (stopped), %ld->%ld, %ld->%ld; source %ld->%ld\n",
                  before[0], after[0], before[1], after[1], before[2], after[2], src_before,
                  src_after);
    assert_true(after[1] > before[1]);
    assert_true(after[2] > before[2]);
    assert_true(src_after > src_before);
    assert_true(after[0] == before[0]);

    /* Own addresses, own hostnames (measured). */
    PGconn *db = sp_test_db();
    char addr[3][32], host[3][128];
    for (int i = 0; i < 3; i++) {
        started_address(db, ids[i], addr[i], sizeof(addr[i]));
        run(ids[i], "hostname", host[i], sizeof(host[i]));
        print_message("copy %s: address %s, hostname %s\n", ids[i], addr[i], host[i]);
    }
    assert_string_not_equal(addr[0], addr[1]);
    assert_string_not_equal(addr[0], addr[2]);
    assert_string_not_equal(addr[1], addr[2]);
    /* The copies were created with the source's allowlist, not the gateway's default (what
     * egressd enforces for each: it reads the policy from the create). */
    for (int i = 0; i < 3; i++) {
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM events WHERE aggregate_id = '%.63s' AND type = "
                 "'SandboxCreateRequested' AND status = 'accepted' AND position(convert_to("
                 "'fork-allowed.test', 'UTF8') in payload) > 0 AND position(convert_to("
                 "'allowlist', 'UTF8') in payload) > 0",
                 ids[i]);
        assert_int_equal(sp_test_db_scalar(db, sql), 1);
    }
    PQfinish(db);

    /* The anonymous snapshot is deleted once the copies run. */
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/snapshots/named/%s", sp_test_env("SPACE_HOME"), fsnap);
    struct stat st;
    for (int i = 0; i < 100 && stat(dir, &st) == 0; i++)
        usleep(50 * 1000);
    assert_int_not_equal(stat(dir, &st), 0);
    assert_int_equal(http("GET", "/v1/snapshots", key, NULL, &r), 200);
    assert_null(strstr(r.body, fsnap));
    sp_test_http_free(&r);
    /* Another tenant cannot fork it. */
    assert_int_equal(http("POST", path, key2, "{\"count\":1}", &r), 404);
    sp_test_http_free(&r);
}

typedef struct {
    char path[128];
    int status;
} snap_call_t;

static void *snap_main(void *arg)
{
    snap_call_t *c = arg;
    sp_test_http_resp_t r;
    c->status = http("POST", c->path, key, "{}", &r);
    sp_test_http_free(&r);
    return NULL;
}

/* A checkpoint of a named snapshot that has written its image: the staging directory (the
 * worker's own layout, docs/snapshots.md) holds runsc's exit status. */
static bool checkpoint_written(const char *staging_root)
{
    DIR *d = opendir(staging_root);
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        if (strncmp(e->d_name, "named-", 6) != 0)
            continue;
        char p[1024];
        snprintf(p, sizeof(p), "%s/%s/image/rc", staging_root, e->d_name);
        found = access(p, F_OK) == 0;
    }
    if (d)
        closedir(d);
    return found;
}

/* The worker killed after a snapshot's checkpoint stopped the sandbox and before the sandbox
 * ran again: the restarted worker restores it from that checkpoint, in place, with its
 * memory (the counter goes on from where it was), and leaves no staging behind. Last: it
 * restarts the worker. */
static void test_worker_killed_mid_snapshot(void **state)
{
    (void)state;
    char id[64], out[256], staging[512];
    sp_test_create_sandbox(port, key, "tiny", id);
    sp_test_cmd_t c = sp_test_run(port, key, id,
                                  "{\"cmd\":\"n=0; while :; do n=$((n+1)); echo $n > /tmp/c; "
                                  "sleep 0.2; done\",\"background\":true}");
    sp_test_cmd_free(&c);
    usleep(600 * 1000);
    long before = counter(id);
    assert_true(before > 0);
    snprintf(staging, sizeof(staging), "%s/snapshots/.staging", sp_test_env("SPACE_HOME"));

    snap_call_t call = {.status = 0};
    snprintf(call.path, sizeof(call.path), "/v1/sandboxes/%s/snapshots", id);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, snap_main, &call), 0);
    bool written = false;
    for (int i = 0; i < 6000 && !written; i++) {
        written = checkpoint_written(staging);
        if (!written)
            usleep(2000);
    }
    assert_true(written);
    sp_test_daemon_kill9("space-worker");
    assert_int_equal(sp_test_space("up >/dev/null"), 0);
    pthread_join(t, NULL);
    print_message("snapshot call answered %d after the worker was killed\n", call.status);

    /* The sandbox runs again with what it had in memory, and counts on. */
    long after = -1;
    for (int i = 0; i < 150 && after <= before; i++) {
        after = counter(id);
        if (after <= before)
            usleep(200 * 1000);
    }
    print_message("counter %ld before the snapshot, %ld after the restart\n", before, after);
    assert_true(after > before);
    assert_int_equal(run(id, "echo back", out, sizeof(out)), 0);
    assert_string_equal(out, "back");
    PGconn *db = sp_test_db();
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM events WHERE aggregate_id = '%.63s' AND type IN "
             "('SandboxFailed') AND status = 'accepted'",
             id);
    assert_int_equal(sp_test_db_scalar(db, sql), 0);
    PQfinish(db);
    /* Nothing of the interrupted snapshot is left in staging (a redelivered intent may have
     * taken it again since: that one finishes and cleans up after itself). */
    for (int i = 0; i < 100 && checkpoint_written(staging); i++)
        usleep(100 * 1000);
    assert_false(checkpoint_written(staging));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_take),         cmocka_unit_test(test_create_from),
        cmocka_unit_test(test_other_tenant), cmocka_unit_test(test_delete),
        cmocka_unit_test(test_fork),         cmocka_unit_test(test_worker_killed_mid_snapshot),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
