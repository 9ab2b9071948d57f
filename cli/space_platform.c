/* `space platform` (docs/platforms.md): the door for internal platforms, run by an operator on
 * the host.
 *   add NAME --tenants T1,T2   identity platform-NAME (space identity add platform NAME) and its
 *                              tenants file, which the event log and the trust check read
 *   ls                         the platforms and their tenants
 *   publish NAME --tenant T create TEMPLATE [--timeout S] | delete ID   [--wait-s N]
 *                              a signed intent, published as the platform would, then its
 *                              outcome: the sandbox running (deleted), or the refusal
 *
 * How publish follows the outcome: a platform has no read permission on the stream (subjects
 * carry no tenant, so NATS cannot limit a reader to one tenant's events); this tool runs on the
 * host and reads the event log in PostgreSQL instead, as the gateway's SSE does for a
 * platform with an API key. The first of these decides: the log refused the intent (its
 * rejected row), a SandboxRequestRejected caused by it (the scheduler's refusal), the
 * sandbox's projection reaching running / deleted / failed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "busid.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "publish.h"
#include "space_stack.h"
#include "xmalloc.h"

#define TENANTS_MAX     1024 /* as the keyring reads (sign.c) */
#define WAIT_DEFAULT_S  30
#define WAIT_MAX_S      3600
#define POLL_MS         200
#define TIMEOUT_DEFAULT 300 /* the HTTP API's default */

int sp__platform_tenants_parse(const char *list, char ***ret_tenants, size_t *ret_n)
{
    char *copy = sp_xstrdup(list ? list : ""), *save = NULL, **out = NULL;
    size_t n = 0;
    int r = 0;

    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        bool dup = false;
        if (!sp_id_valid(t)) {
            fprintf(stderr,
                    "space platform: tenant '%s' is not an id ([a-z0-9][a-z0-9_-], 1..64 "
                    "chars)\n",
                    t);
            r = -EINVAL;
            break;
        }
        for (size_t i = 0; i < n && !dup; i++)
            dup = strcmp(out[i], t) == 0;
        if (dup)
            continue;
        if (n >= TENANTS_MAX) {
            fprintf(stderr, "space platform: more than %d tenants\n", TENANTS_MAX);
            r = -E2BIG;
            break;
        }
        out = sp_xreallocarray(out, n + 1, sizeof(*out));
        out[n++] = sp_xstrdup(t);
    }
    if (r == 0 && n == 0) {
        fprintf(stderr, "space platform: --tenants names no tenant (T1,T2,...)\n");
        r = -EINVAL;
    }
    free(copy);
    if (r < 0) {
        sp__platform_tenants_free(out, n);
        return r;
    }
    *ret_tenants = out;
    *ret_n = n;
    return 0;
}

void sp__platform_tenants_free(char **tenants, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(tenants[i]);
    free(tenants);
}

int sp__platform_tenants_write(const char *dir, const char *identity, char **tenants, size_t n)
{
    char *path = sp_xasprintf("%s/%s.tenants", dir, identity);
    char *tmp = sp_xasprintf("%s.tmp", path);
    FILE *f = fopen(tmp, "we");
    int r = 0;

    if (!f) {
        r = -errno;
        goto out;
    }
    fprintf(f, "# tenants of %s, written by space platform add; one id a line\n", identity);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s\n", tenants[i]);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        r = -errno;
    if (fclose(f) != 0 && r == 0)
        r = -errno;
    /* By rename: a reader sees the old list or the new one, and a new inode, which is how the
     * event log's keyring notices the change (sp_keyring_stale). */
    if (r == 0 && (chmod(tmp, 0644) < 0 || rename(tmp, path) < 0))
        r = -errno;
    if (r < 0)
        unlink(tmp);
out:
    if (r < 0)
        fprintf(stderr, "space platform: cannot write %s: %s\n", path, strerror(-r));
    else
        printf("%s may act for %zu tenant%s (%s)\n", identity, n, n == 1 ? "" : "s", path);
    free(tmp);
    free(path);
    return r;
}

int sp__platform_list(const char *dir, bool json)
{
    char **names = NULL;
    size_t n = 0, shown = 0;
    int r = sp__identity_names(dir, &names, &n);
    sp_buf_t out; /* the whole answer, one printf: {"platforms":[{"name","tenants":[]}]} */

    if (r < 0) {
        fprintf(stderr, "space platform: cannot read %s: %s\n", dir, strerror(-r));
        return -1;
    }
    sp_buf_init(&out);
    sp_buf_puts(&out, json ? "{\"platforms\":[" : "");
    for (size_t i = 0; i < n; i++) {
        sp_identity_t id;
        char *path, line[128];
        FILE *f;
        bool first = true;

        if (sp_identity_parse(names[i], &id) < 0 || id.kind != SP_KIND_PLATFORM)
            continue;
        if (json) {
            sp_buf_puts(&out, shown ? ",{\"name\":" : "{\"name\":");
            sp_buf_json_str(&out, id.instance);
            sp_buf_puts(&out, ",\"tenants\":[");
        } else {
            sp_buf_puts(&out, id.instance);
        }
        shown++;
        path = sp_xasprintf("%s/%s.tenants", dir, names[i]);
        f = fopen(path, "re");
        free(path);
        while (f && fgets(line, sizeof(line), f)) {
            line[strcspn(line, "\r\n")] = '\0';
            if (!line[0] || line[0] == '#')
                continue;
            if (json) {
                if (!first)
                    sp_buf_putc(&out, ',');
                sp_buf_json_str(&out, line);
            } else {
                sp_buf_printf(&out, "%s%s", first ? "  tenants " : ",", line);
            }
            first = false;
        }
        if (f)
            fclose(f);
        if (json)
            sp_buf_puts(&out, "]}");
        else
            sp_buf_printf(&out, "%s\n", first ? "  (no tenants: every intent is refused)" : "");
    }
    if (json)
        sp_buf_puts(&out, "]}\n");
    if (out.len)
        fputs(out.data, stdout);
    sp_buf_dispose(&out);
    sp__identity_names_free(names, n);
    return 0;
}

/* ---- publish ---- */

/* What a platform may publish (docs/platforms.md), and the state each one ends in. */
typedef enum { OP_CREATE, OP_DELETE, OP_PAUSE, OP_RESUME, OP_SUSPEND, OP_TIMEOUT, OP__COUNT } op_t;
static const struct {
    const char *name;
    const char *ends_in; /* the sandbox's state when it is done; NULL: the timeout set */
} ops[OP__COUNT] = {
    {"create", "running"}, {"delete", "deleted"},    {"pause", "paused"},
    {"resume", "running"}, {"suspend", "suspended"}, {"timeout", NULL},
};

typedef struct {
    const char *tenant;
    const char *op_name;
    op_t op;
    const char *arg;
    uint32_t timeout_s;
    int wait_s;
} pub_args_t;

static int parse_uint(const char *flag, const char *v, unsigned long max, unsigned long *ret)
{
    char *end = NULL;
    unsigned long x;

    errno = 0;
    x = v && *v && *v != '-' ? strtoul(v, &end, 10) : 0;
    if (!v || !*v || *v == '-' || errno || *end || x > max) {
        fprintf(stderr, "space platform: %s wants a number 0..%lu\n", flag, max);
        return -1;
    }
    *ret = x;
    return 0;
}

/* Flags anywhere ("--x v" or "--x=v"), then OP ARG. */
static int parse_publish(int argc, char **argv, pub_args_t *a)
{
    const char *pos[2] = {NULL, NULL};
    size_t npos = 0;
    unsigned long x;

    *a = (pub_args_t){.timeout_s = TIMEOUT_DEFAULT, .wait_s = WAIT_DEFAULT_S};
    for (int i = 0; i < argc; i++) {
        const char *flag = argv[i], *eq = strchr(flag, '='), *v;
        size_t fl = eq ? (size_t)(eq - flag) : strlen(flag);

        if (strncmp(flag, "--", 2) != 0) {
            if (npos >= 2) {
                fprintf(stderr, "space platform: unexpected argument '%s'\n", flag);
                return -1;
            }
            pos[npos++] = flag;
            continue;
        }
        v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (fl == 8 && strncmp(flag, "--tenant", fl) == 0) {
            a->tenant = v;
        } else if (fl == 9 && strncmp(flag, "--timeout", fl) == 0) {
            if (parse_uint("--timeout", v, UINT32_MAX, &x) < 0)
                return -1;
            a->timeout_s = (uint32_t)x; /* the scheduler's check decides what is too long */
        } else if (fl == 8 && strncmp(flag, "--wait-s", fl) == 0) {
            if (parse_uint("--wait-s", v, WAIT_MAX_S, &x) < 0)
                return -1;
            a->wait_s = (int)x;
        } else {
            fprintf(stderr, "space platform: unknown option %.*s\n", (int)fl, flag);
            return -1;
        }
    }
    a->op_name = pos[0];
    a->arg = pos[1];
    a->op = OP__COUNT;
    for (int o = 0; a->op_name && o < OP__COUNT; o++)
        if (strcmp(a->op_name, ops[o].name) == 0)
            a->op = (op_t)o;
    if (!a->tenant || a->op == OP__COUNT || !a->arg) {
        fprintf(stderr, "usage: space platform publish NAME --tenant T create TEMPLATE "
                        "[--timeout S] | delete ID | pause ID | resume ID | suspend ID | "
                        "timeout ID --timeout S  [--wait-s N]\n");
        return -1;
    }
    return 0;
}

static int64_t mono_ms(void)
{
    return sp_mono_ns() / 1000000;
}

typedef enum { OUT_NONE, OUT_DONE, OUT_REFUSED, OUT_FAILED, OUT_ERROR } outcome_t;

/* A SandboxRequestRejected caused by the intent (the scheduler's intent check, placement):
 * printed, OUT_REFUSED; OUT_NONE when there is none (yet). */
static outcome_t refusal(PGconn *db, const char *const p[2])
{
    outcome_t out = OUT_NONE;
    PGresult *r = PQexecParams(db,
                               "SELECT payload FROM events WHERE causation_id = $1::uuid AND "
                               "aggregate_id = $2 AND type = 'SandboxRequestRejected' ORDER BY "
                               "stream_seq LIMIT 1",
                               2, NULL, p, NULL, NULL, 1);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        PQclear(r);
        return OUT_ERROR;
    }
    if (PQntuples(r) == 1) {
        sp_envelope_t *rej = NULL;
        char why[SP_REASON_MAX];
        if (sp_envelope_decode((const uint8_t *)PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0),
                               &rej, why) == 0 &&
            rej->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_REQUEST_REJECTED)
            fprintf(stderr, "space platform: refused by %s: %s: %s\n",
                    rej->signer[0] ? rej->signer : rej->actor,
                    rej->sandbox_request_rejected->reason, rej->sandbox_request_rejected->detail);
        else
            fprintf(stderr, "space platform: refused (SandboxRequestRejected, unreadable: %s)\n",
                    why);
        sp_envelope_free(rej);
        out = OUT_REFUSED;
    }
    PQclear(r);
    return out;
}

/* What the log says about the intent so far; prints the outcome once there is one. */
static outcome_t look(PGconn *db, const sp_envelope_t *env, op_t op)
{
    bool create = op == OP_CREATE;
    const char *sbx = env->aggregate->id, *tenant = env->tenant;
    const char *p[2] = {env->event_id, sbx};
    PGresult *r;
    int rows = 0;
    outcome_t out = OUT_NONE;

    /* 1. The log's verdict on the first copy it stored. */
    r = PQexecParams(db,
                     "SELECT status, coalesce(reject_reason, '') FROM events WHERE event_id = "
                     "$1::uuid ORDER BY stream_seq LIMIT 1",
                     1, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        PQclear(r);
        return OUT_ERROR;
    }
    if (PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "rejected") == 0) {
        fprintf(stderr, "space platform: refused by the event log: %s\n", PQgetvalue(r, 0, 1));
        out = OUT_REFUSED;
    }
    rows = PQntuples(r);
    PQclear(r);
    if (out != OUT_NONE || rows == 0)
        return out; /* not stored yet: nothing else can have happened */

    /* 2. A refusal caused by it, stored or not. */
    if ((out = refusal(db, p)) != OUT_NONE)
        return out;

    /* 3. The sandbox as the projection has it. */
    const char *q[2] = {sbx, tenant};
    r = PQexecParams(db,
                     "SELECT state, coalesce(worker, ''), coalesce(failure_reason, ''), "
                     "timeout_s FROM sandboxes WHERE id = $1 AND tenant = $2",
                     2, NULL, q, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0) {
        PQclear(r);
        return OUT_ERROR;
    }
    if (PQntuples(r) == 1) {
        const char *state = PQgetvalue(r, 0, 0);
        if (op == OP_TIMEOUT &&
            strtoul(PQgetvalue(r, 0, 3), NULL, 10) == env->sandbox_timeout_requested->timeout_s) {
            printf("sandbox %s %s, timeout %s s\n", sbx, state, PQgetvalue(r, 0, 3));
            out = OUT_DONE;
        } else if (ops[op].ends_in && strcmp(state, ops[op].ends_in) == 0) {
            if (strcmp(state, "running") == 0)
                printf("sandbox %s %s on %s\n", sbx, state, PQgetvalue(r, 0, 1));
            else
                printf("sandbox %s %s\n", sbx, state);
            out = OUT_DONE;
        } else if (strcmp(state, "failed") == 0 || (create && strcmp(state, "deleted") == 0)) {
            /* The refusal and the failure it caused are committed together: one that was not
             * visible in step 2 may be now, and it says more. */
            if ((out = refusal(db, p)) != OUT_NONE) {
                PQclear(r);
                return out;
            }
            fprintf(stderr, "space platform: sandbox %s %s%s%s\n", sbx, state,
                    PQgetvalue(r, 0, 2)[0] ? ": " : "", PQgetvalue(r, 0, 2));
            out = OUT_FAILED;
        }
    }
    PQclear(r);
    return out;
}

int sp__platform_publish(const char *creds_dir, const char *nats_url, const char *pg_url,
                         const char *name, int argc, char **argv)
{
    sp_bus_opts_t bo = {.url = nats_url, .name = "space-platform", .timeout_ms = 5000};
    char err[SP_BUSID_ERR_MAX], event_id[37], sandbox[SP_SANDBOX_ID_LEN + 1],
        corr[SP_UUID_STR_LEN + 1];
    sp_busid_t busid = {0};
    sp_identity_t id;
    sp_bus_t *bus = NULL;
    PGconn *db = NULL;
    pub_args_t a;
    uint64_t seq = 0;
    int rc, exit_code = SP_STACK_EXIT_FAIL;

    if (parse_publish(argc, argv, &a) < 0)
        return SP_STACK_EXIT_USAGE;
    if (sp_identity_format(SP_KIND_PLATFORM, name, &id) < 0) {
        fprintf(stderr, "space platform: '%s' cannot name a platform (an id)\n", name);
        return SP_STACK_EXIT_USAGE;
    }
    /* The platform's own credentials: its NATS user and its signing key (sp_publish_pack signs
     * every envelope with it from here on). */
    if (sp_busid_setup(creds_dir, id.name, NULL, &busid, &bo, err) < 0) {
        fprintf(stderr, "space platform: %s (space platform add %s --tenants ...?)\n", err, name);
        return SP_STACK_EXIT_FAIL;
    }
    if ((rc = sp_bus_connect(&bo, &bus)) < 0) {
        fprintf(stderr, "space platform: %s cannot connect to %s: %s\n", id.name, nats_url,
                sp_strerror(rc));
        goto out;
    }

    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SandboxCreateRequested create = SPACE__V1__SANDBOX_CREATE_REQUESTED__INIT;
    Space__V1__SandboxDeleteRequested del = SPACE__V1__SANDBOX_DELETE_REQUESTED__INIT;
    Space__V1__SandboxPauseRequested pause = SPACE__V1__SANDBOX_PAUSE_REQUESTED__INIT;
    Space__V1__SandboxResumeRequested resume = SPACE__V1__SANDBOX_RESUME_REQUESTED__INIT;
    Space__V1__SandboxSuspendRequested suspend = SPACE__V1__SANDBOX_SUSPEND_REQUESTED__INIT;
    Space__V1__SandboxTimeoutRequested timeout = SPACE__V1__SANDBOX_TIMEOUT_REQUESTED__INIT;
    Space__V1__Resources res = SPACE__V1__RESOURCES__INIT;
    bool is_create = a.op == OP_CREATE;

    agg.kind = "sandbox";
    if (is_create) {
        sp_sandbox_id_new(sandbox);
        agg.id = sandbox;
        create.template_ = (char *)a.arg;
        create.timeout_s = a.timeout_s;
        create.on_timeout = "delete";
        res.vcpu = 1;
        res.memory_mb = 512;
        create.resources = &res;
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED;
        env.sandbox_create_requested = &create;
    } else {
        agg.id = (char *)a.arg;
        switch (a.op) {
        case OP_PAUSE:
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PAUSE_REQUESTED;
            env.sandbox_pause_requested = &pause;
            break;
        case OP_RESUME:
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_RESUME_REQUESTED;
            env.sandbox_resume_requested = &resume;
            break;
        case OP_SUSPEND:
            suspend.reason = "api";
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPEND_REQUESTED;
            env.sandbox_suspend_requested = &suspend;
            break;
        case OP_TIMEOUT:
            timeout.timeout_s = a.timeout_s;
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_TIMEOUT_REQUESTED;
            env.sandbox_timeout_requested = &timeout;
            break;
        default:
            del.reason = "platform";
            env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETE_REQUESTED;
            env.sandbox_delete_requested = &del;
            break;
        }
    }
    sp_uuid7_str(corr); /* a platform passes its own request id: it follows the intent */
    env.aggregate = &agg;
    env.tenant = (char *)a.tenant;
    env.actor = id.name;
    env.correlation_id = corr;
    /* No check here on purpose: this tool shows what the platform's side says. The example
     * program (examples/platform_create.c) checks with sp_intent_check before it publishes. */
    rc = sp_publish_event(bus, &env, event_id, NULL, NULL, &seq);
    if (rc < 0) {
        fprintf(stderr,
                "space platform: %s could not publish %s for %s: %s (a malformed value, or "
                "NATS refused the subject)\n",
                id.name, sp_event_type_name(env.payload_case), agg.id, sp_strerror(rc));
        goto out;
    }
    printf("published %s %s (stream seq %llu) as %s for tenant %s: sandbox %s\n", env.type,
           event_id, (unsigned long long)seq, id.name, a.tenant, agg.id);
    fflush(stdout);

    if (a.wait_s == 0) {
        exit_code = SP_STACK_EXIT_OK;
        goto out;
    }
    if (!pg_url || (rc = sp_db_connect(pg_url, "space-platform", 5000, &db)) < 0) {
        fprintf(stderr, "space platform: cannot read the event log: %s\n",
                pg_url ? sp_strerror(rc) : "PostgreSQL of this home does not run");
        goto out;
    }
    int64_t deadline = mono_ms() + (int64_t)a.wait_s * 1000;
    outcome_t o = OUT_NONE;
    for (;;) {
        o = look(db, &env, a.op);
        if (o != OUT_NONE || mono_ms() >= deadline)
            break;
        usleep(POLL_MS * 1000);
    }
    switch (o) {
    case OUT_DONE:
        exit_code = SP_STACK_EXIT_OK;
        break;
    case OUT_NONE:
        fprintf(stderr,
                "space platform: no outcome within %d s; the intent is at stream seq %llu "
                "(space events %s)\n",
                a.wait_s, (unsigned long long)seq, agg.id);
        break;
    case OUT_ERROR:
        fprintf(stderr, "space platform: cannot read the event log: %s\n", PQerrorMessage(db));
        break;
    default:
        break;
    }
out:
    if (db)
        PQfinish(db);
    sp_bus_free(bus);
    sp_busid_dispose(&busid);
    return exit_code;
}
