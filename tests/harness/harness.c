/* Integration test harness (harness.h). */
#include "harness.h"

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "busid.h"
#include "config.h"
#include "db.h"
#include "contract.h"
#include "error.h"
#include "eventgen.h"
#include "hash.h"
#include "natsauth.h"
#include "publish.h"
#include "sign.h"
#include "xmalloc.h"

/* SP_TEST_FILTER=pattern runs only the tests whose names match (cmocka's wildcards), e.g.
 * SP_TEST_FILTER=test_kill9_mid_suspend: one case of a long test, alone, while debugging. */
__attribute__((constructor)) static void test_filter(void)
{
    const char *f = getenv("SP_TEST_FILTER");
    if (f && f[0])
        cmocka_set_test_filter(f);
}

void sp_test_stack_load(void)
{
    const char *home = getenv("SPACE_HOME");
    char path[4096];

    if (!home || !home[0])
        fail_msg("SPACE_HOME is not set: run this test through ctest (the stack fixture)");
    snprintf(path, sizeof(path), "%s/space.env", home);
    int rc = sp_env_file_export(path);
    if (rc < 0)
        fail_msg("cannot read %s (%s): did `space up` (the fixture) succeed?", path,
                 sp_strerror(rc));
    if (!getenv("SPACE_NATS_URL") || !getenv("SPACE_PG_URL"))
        fail_msg("%s lacks SPACE_NATS_URL or SPACE_PG_URL", path);
}

const char *sp_test_env(const char *name)
{
    const char *v = getenv(name);
    if (!v)
        fail_msg("environment variable %s is not set", name);
    return v;
}

sp_bus_t *sp_test_bus(void)
{
    /* The identity the fixture gives tests (SPACE_TEST_IDENTITY, tests/CMakeLists.txt): they
     * publish hostile events onto any subject, so it is the operator. Not registered as a
     * signer: what tests forge goes out unsigned. */
    static sp_busid_t id;
    sp_bus_t *bus = NULL;
    sp_bus_opts_t o = {
        .url = sp_test_env("SPACE_NATS_URL"), .name = "space-test", .timeout_ms = 10000};
    char err[SP_BUSID_ERR_MAX];
    if (!id.name[0]) {
        int rc = sp_busid_setup(sp_test_env("SPACE_CREDS_DIR"), sp_test_env("SPACE_TEST_IDENTITY"),
                                NULL, &id, &o, err);
        if (rc < 0)
            fail_msg("test identity: %s", err);
        sp_publish_signer_set(NULL, NULL);
    } else {
        o.nkey = id.nkey;
        o.nkey_seed_file = id.seed_file;
        o.inbox_prefix = id.inbox;
    }
    int rc = sp_bus_connect(&o, &bus);
    if (rc < 0)
        fail_msg("cannot connect to NATS at %s: %s", o.url, sp_strerror(rc));
    rc = sp_bus_ensure_stream(bus);
    if (rc < 0)
        fail_msg("cannot ensure the stream: %s", sp_strerror(rc));
    return bus;
}

int sp_test_sign(const char *subject, uint8_t **data, size_t *len)
{
    char reason[SP_REASON_MAX], worker[SP_INSTANCE_MAX + 1] = "", who[SP_IDENTITY_MAX + 1];
    sp_envelope_t *env = NULL;
    if (sp_envelope_decode(*data, *len, &env, reason) < 0)
        return -EINVAL;
    const sp_subject_id_t ids[] = {SP_SUBJ_EV_SBX, SP_SUBJ_EV_IO, SP_SUBJ_EV_WKR};
    for (size_t i = 0; i < 3 && !worker[0]; i++)
        (void)sp_subject_match(ids[i], subject, worker);
    /* The worker of the subject for its facts; an unplaced sandbox's events are the gateway's
     * (intents) or the scheduler's (its refusals and controllers). */
    unsigned may = sp_event_emitters(env->payload_case);
    bool placed = worker[0] && strcmp(worker, "_") != 0;
    if (placed && (may & SP_KIND_BIT(SP_KIND_WORKER)))
        snprintf(who, sizeof(who), "worker-%s", worker);
    else if (may & SP_KIND_BIT(SP_KIND_GATEWAY))
        snprintf(who, sizeof(who), "gateway");
    else if (may & SP_KIND_BIT(SP_KIND_SCHEDULER))
        snprintf(who, sizeof(who), "scheduler");
    else
        sp_eventgen_signer(env->payload_case, worker, who, sizeof(who));
    const char *dir = sp_test_env("SPACE_CREDS_DIR");
    char *path = sp_xasprintf("%s/%s.key", dir, who);
    if (access(path, F_OK) != 0 && sp_natsauth_creds_create(dir, who) < 0)
        fail_msg("cannot make the identity %s in %s", who, dir);
    sp_sign_key_t *key = NULL;
    if (sp_sign_key_load(path, &key) < 0)
        fail_msg("cannot load %s", path);
    free(path);
    uint8_t *out = NULL;
    size_t n = 0;
    /* Signing points the envelope's signature fields at its own buffers: the unpacker's go
     * back before it frees them (as sp_eventgen_sign does). */
    sp_envelope_t saved = *env;
    int rc = sp_envelope_encode_signed(env, who, key, &out, &n);
    *env = saved;
    sp_sign_key_free(key);
    sp_envelope_free(env);
    if (rc < 0)
        return rc;
    free(*data);
    *data = out;
    *len = n;
    return 0;
}

void sp_test_expect_row(PGconn *db, uint64_t seq, const char *status, const char *needle,
                        bool prefix)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM events WHERE stream_seq = %llu",
             (unsigned long long)seq);
    assert_int_equal(sp_test_db_wait_scalar(db, sql, 1, 20000), 1);
    snprintf(sql, sizeof(sql),
             "SELECT status, coalesce(reject_reason, '') FROM events WHERE stream_seq = %llu",
             (unsigned long long)seq);
    PGresult *r = PQexec(db, sql);
    assert_int_equal(PQntuples(r), 1);
    const char *got = PQgetvalue(r, 0, 1);
    bool ok = prefix ? strncmp(got, needle, strlen(needle)) == 0 : strstr(got, needle) != NULL;
    if (strcmp(PQgetvalue(r, 0, 0), status) != 0 || !ok)
        fail_msg("seq %llu: status %s reason '%s'; expected %s with '%s'", (unsigned long long)seq,
                 PQgetvalue(r, 0, 0), got, status, needle);
    print_message("seq %llu %s: %s\n", (unsigned long long)seq, status, got);
    PQclear(r);
}

PGconn *sp_test_db(void)
{
    PGconn *db = NULL;
    int rc = sp_db_connect(sp_test_env("SPACE_PG_URL"), "space-test", 10000, &db);
    if (rc < 0)
        fail_msg("cannot connect to PostgreSQL: %s", sp_strerror(rc));
    return db;
}

int sp_test_space(const char *args)
{
    const char *bin = getenv("SPACE_BIN_DIR");
    char *cmd = sp_xasprintf("'%s/space' %s", bin ? bin : ".", args);
    int st = system(cmd); /* NOLINT(cert-env33-c): tests run the CLI as a user would */
    free(cmd);
    if (st == -1 || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

long long sp_test_db_scalar(PGconn *db, const char *sql)
{
    PGresult *r = PQexec(db, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        fail_msg("query failed: %s: %s", sql, PQerrorMessage(db));
    long long v = PQgetisnull(r, 0, 0) ? -1 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

long long sp_test_events(PGconn *db, const char *sandbox, const char *type, const char *needle)
{
    const char *p[3] = {sandbox, type, needle ? needle : ""};
    PGresult *r = PQexecParams(db,
                               "SELECT count(*) FROM events WHERE aggregate_id = $1 AND type = $2 "
                               "AND position($3 in encode(payload, 'escape')) > 0",
                               3, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        fail_msg("counting %s events: %s", type, PQerrorMessage(db));
    long long v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

long long sp_test_db_wait_scalar(PGconn *db, const char *sql, long long want, int timeout_ms)
{
    long long v = -1;
    for (int waited = 0; waited <= timeout_ms; waited += 50) {
        /* The schema may not exist yet right after start; treat errors as "not yet". */
        PGresult *r = PQexec(db, sql);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
            v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
        if (v == want)
            return v;
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    /* Said, because a caller that goes on after the wait ran out (the value was not exactly
     * want, yet what it checks holds) pays the whole timeout silently: pg_restart paid 60 s a
     * case that way. */
    if (timeout_ms > 0)
        fprintf(stderr, "harness: waited %d ms for %.160s to be %lld: it is %lld\n", timeout_ms,
                sql, want, v);
    return v;
}

int sp_test_daemon_pid(const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/run/%s.pid", sp_test_env("SPACE_HOME"), name);
    FILE *f = fopen(path, "r");
    char line[32];
    int pid = 0;
    if (!f)
        return 0;
    if (fgets(line, sizeof(line), f))
        pid = (int)strtol(line, NULL, 10);
    fclose(f);
    if (pid > 0 && kill(pid, 0) < 0)
        pid = 0;
    return pid;
}

void sp_test_daemon_kill9(const char *name)
{
    sp_test_daemon_stop(name, SIGKILL);
}

void sp_test_daemon_stop(const char *name, int sig)
{
    int pid = sp_test_daemon_pid(name);
    if (pid <= 0)
        fail_msg("%s is not running", name);
    kill(pid, sig);
    for (int i = 0; i < 3000 && kill(pid, 0) == 0; i++) {
        /* Not our child: wait until the process is gone (or a zombie of its reaper). */
        char stat[64];
        snprintf(stat, sizeof(stat), "/proc/%d/stat", pid);
        FILE *f = fopen(stat, "r");
        char st = 'Z';
        if (f) {
            if (fscanf(f, "%*d %*s %c", &st) != 1)
                st = 'Z';
            fclose(f);
        }
        if (st == 'Z')
            break;
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
}

void sp_test_rehash(PGconn *db, uint64_t from)
{
    char *sql = sp_xasprintf(
        "DO $$ DECLARE prev bytea; r record; h bytea; BEGIN"
        " SELECT hash INTO prev FROM events WHERE stream_seq < %llu ORDER BY stream_seq DESC"
        "  LIMIT 1;"
        " IF prev IS NULL THEN prev := decode(repeat('00', 32), 'hex'); END IF;"
        " FOR r IN SELECT stream_seq, subject, status, reject_reason, payload, payload_size,"
        "  payload_sha256, chain_v FROM events WHERE stream_seq >= %llu ORDER BY stream_seq LOOP"
        "  IF r.chain_v = 1 THEN h := sha256(prev || r.payload);"
        "  ELSE h := sha256(convert_to('SPACE-C chain v2', 'UTF8') || '\\x00'::bytea || prev"
        "   || int8send(r.stream_seq) || int4send(octet_length(convert_to(r.subject, 'UTF8')))"
        "   || convert_to(r.subject, 'UTF8')"
        "   || int8send(coalesce(r.payload_size, octet_length(r.payload)::bigint))"
        "   || coalesce(r.payload_sha256, sha256(r.payload))"
        "   || (CASE WHEN r.status = 'accepted' THEN '\\x01' ELSE '\\x00' END)::bytea"
        "   || (CASE WHEN r.reject_reason IS NULL THEN '\\x00' ELSE '\\x01' END)::bytea"
        "   || int4send(coalesce(octet_length(convert_to(r.reject_reason, 'UTF8')), 0))"
        "   || coalesce(convert_to(r.reject_reason, 'UTF8'), ''::bytea));"
        "  END IF;"
        "  UPDATE events SET prev_hash = prev, hash = h WHERE stream_seq = r.stream_seq;"
        "  prev := h;"
        " END LOOP; END $$",
        (unsigned long long)from, (unsigned long long)from);
    PGresult *r = PQexec(db, sql);
    free(sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        fail_msg("rehash: %s", PQerrorMessage(db));
    PQclear(r);
}

sp_envelope_t *sp_test_stored_envelope(PGconn *db, uint64_t seq)
{
    char sql[128], reason[SP_REASON_MAX];
    sp_envelope_t *e = NULL;
    snprintf(sql, sizeof(sql), "SELECT payload FROM events WHERE stream_seq = %llu",
             (unsigned long long)seq);
    PGresult *r = PQexecParams(db, sql, 0, NULL, NULL, NULL, NULL, 1);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        fail_msg("no row at seq %llu: %s", (unsigned long long)seq, PQerrorMessage(db));
    if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0), &e,
                           reason) < 0)
        fail_msg("row %llu: %s", (unsigned long long)seq, reason);
    PQclear(r);
    return e;
}

void sp_test_rewrite_row(PGconn *db, uint64_t seq, const sp_envelope_t *env)
{
    size_t len = space__v1__envelope__get_packed_size(env);
    uint8_t *data = sp_xmalloc(len);
    space__v1__envelope__pack(env, data);
    char *hex = sp_xmalloc(2 * len + 1);
    sp_hex_encode(data, len, hex);
    char *update = sp_xasprintf("UPDATE events SET payload = '\\x%s' WHERE stream_seq = %llu", hex,
                                (unsigned long long)seq);
    PGresult *r = PQexec(db, update);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        fail_msg("rewrite of row %llu: %s", (unsigned long long)seq, PQerrorMessage(db));
    PQclear(r);
    free(update);
    free(hex);
    free(data);
    sp_test_rehash(db, seq);
}

sp_sign_key_t *sp_test_identity(const char *dir, const char *identity)
{
    char *priv = sp_xasprintf("%s/%s.key", dir, identity);
    char *pub = sp_xasprintf("%s/%s.pub", dir, identity);
    sp_sign_key_t *k = NULL;
    unlink(priv);
    if (sp_sign_keygen(priv, pub) < 0 || sp_sign_key_load(priv, &k) < 0)
        fail_msg("cannot make the key of %s in %s", identity, dir);
    free(priv);
    free(pub);
    return k;
}

uint64_t sp_test_stream_last(sp_bus_t *bus)
{
    uint64_t last = 0, msgs = 0;
    if (sp_bus_publish_async_complete(bus, 10000) != 0 || sp_bus_stream_info(bus, &last, &msgs) < 0)
        fail_msg("publishes not acknowledged, or no stream info");
    return last;
}

int sp_test_replay(const char *args, char *out, size_t outlen)
{
    const char *bin = getenv("SPACE_BIN_DIR");
    char *cmd = sp_xasprintf("'%s/space-replay' --pg-url '%s' %s", bin ? bin : ".",
                             sp_test_env("SPACE_PG_URL"), args);
    FILE *p = popen(cmd, "r"); /* NOLINT(cert-env33-c): as a user would run it */
    free(cmd);
    if (!p)
        fail_msg("cannot run space-replay");
    size_t n = 0;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), p)) > 0) {
        if (out && n + 1 < outlen) {
            size_t take = got < outlen - 1 - n ? got : outlen - 1 - n;
            memcpy(out + n, buf, take);
            n += take;
        }
    }
    if (out && outlen)
        out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int sp_test_port_file(const char *path, const char *log_file)
{
    int port = 0;
    for (int i = 0; i < 300 && port == 0; i++) {
        FILE *f = fopen(path, "re");
        if (f) {
            char line[16] = "";
            port = fgets(line, sizeof(line), f) ? (int)strtol(line, NULL, 10) : 0;
            fclose(f);
        }
        if (port == 0)
            nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    if (port <= 0)
        fail_msg("the daemon wrote no port file %s; see %s", path, log_file);
    return port;
}
