/* Identities on the bus (docs/trust.md) for `space up` and `space identity`: the credentials
 * under $SPACE_HOME/creds, the authorization block of nats.conf made from them, and the
 * JetStream objects only the operator may create (the stream, the durables of the contract,
 * the snapshot bucket). */
#include "space_stack.h"
#include "space_proc.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "busid.h"
#include "contract.h"
#include "error.h"
#include "ids.h"
#include "natsauth.h"
#include "objstore.h"
#include "publish.h"
#include "sign.h"
#include "xmalloc.h"

#define CREDS_DIR      "creds"
#define IDENTITIES_MAX 4096

char *sp__identity_dir(const char *home)
{
    return sp_xasprintf("%s/" CREDS_DIR, home);
}

/* The directory, 0700 whether it is new or not: it holds the secrets of every identity. */
static int creds_dir_make(const char *dir)
{
    int r = sp__stack_mkdir(dir, 0700);

    if (r == 0 && chmod(dir, 0700) < 0)
        r = -errno;
    if (r < 0)
        fprintf(stderr, "space: cannot create %s: %s\n", dir, strerror(-r));
    return r;
}

/* Makes the credentials of name in dir unless it has them. 1 made, 0 kept, -1 after printing. */
static int creds_ensure(const char *dir, const char *name)
{
    int r = sp_natsauth_creds_create(dir, name);

    if (r == -EEXIST)
        return 0;
    if (r < 0) {
        fprintf(stderr, "space: cannot make the credentials of %s in %s: %s\n", name, dir,
                sp_strerror(r));
        return -1;
    }
    return 1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int sp__identity_names(const char *dir, char ***ret_names, size_t *ret_n)
{
    char **names = NULL;
    size_t n = 0;
    struct dirent *de;
    DIR *d = opendir(dir);

    if (!d)
        return -errno;
    while ((de = readdir(d)) && n < IDENTITIES_MAX) {
        size_t len = strlen(de->d_name);
        sp_identity_t id;
        char name[SP_IDENTITY_MAX + 1];

        if (len <= 6 || len - 6 > SP_IDENTITY_MAX || strcmp(de->d_name + len - 6, ".nkpub") != 0)
            continue;
        memcpy(name, de->d_name, len - 6);
        name[len - 6] = '\0';
        if (sp_identity_parse(name, &id) < 0)
            continue;
        names = sp_xreallocarray(names, n + 1, sizeof(*names));
        names[n++] = sp_xstrdup(name);
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof(*names), cmp_str);
    *ret_names = names;
    *ret_n = n;
    return 0;
}

void sp__identity_names_free(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

int sp__identity_conf(const char *dir, sp_buf_t *out)
{
    char **names = NULL, (*keys)[SP_NKEY_PUB_LEN + 1] = NULL;
    sp_natsauth_user_t *users = NULL;
    size_t n = 0;
    int r;

    if ((r = sp__identity_names(dir, &names, &n)) < 0)
        return r;
    users = sp_xcalloc(n ? n : 1, sizeof(*users));
    keys = sp_xcalloc(n ? n : 1, sizeof(*keys));
    for (size_t i = 0; i < n; i++) {
        if ((r = sp_natsauth_nkey_public(dir, names[i], keys[i])) < 0)
            goto out;
        users[i].identity = names[i];
        users[i].nkey = keys[i];
    }
    r = sp_natsauth_write(out, users, n);
out:
    free(users);
    free(keys);
    sp__identity_names_free(names, n);
    return r;
}

int sp__identity_up(const sp_stack_t *st, const char *worker_id)
{
    char *dir = sp__identity_dir(st->home);
    static const sp_kind_t kinds[] = {SP_KIND_OPERATOR,  SP_KIND_EVENTLOG, SP_KIND_SCHEDULER,
                                      SP_KIND_GATEWAY,   SP_KIND_WORKER,   SP_KIND_EGRESSD,
                                      SP_KIND_CREDSTORE, SP_KIND_READER};
    int made = 0, r = -1;

    if (creds_dir_make(dir) < 0)
        goto out;
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        bool per_worker = kinds[i] == SP_KIND_WORKER || kinds[i] == SP_KIND_EGRESSD;
        sp_identity_t id;
        int e;

        if (sp_identity_format(kinds[i], per_worker ? worker_id : NULL, &id) < 0) {
            fprintf(stderr,
                    "space: SPACE_ID '%s' cannot name an identity (an id: letters, digits, "
                    "'-', '_')\n",
                    worker_id);
            goto out;
        }
        if ((e = creds_ensure(dir, id.name)) < 0)
            goto out;
        made += e;
    }
    printf("%-*s ready    %s%s\n", SP_STACK_PART_WIDTH, "identities", dir,
           made ? " (new credentials made)" : "");
    r = 0;
out:
    free(dir);
    return r;
}

/* "{worker}" in a durable name or filter of the contract -> instance. */
static void expand(char *out, size_t len, const char *s, const char *instance)
{
    const char *p = strstr(s, "{worker}");

    if (!p)
        snprintf(out, len, "%s", s);
    else
        snprintf(out, len, "%.*s%s%s", (int)(p - s), s, instance, p + 8);
}

/* Right after `up` restarted a cluster node (one that led a stream, or the meta leader),
 * JetStream API calls time out or fail at once while the cluster elects and the node catches
 * up (both seen in integration.cluster). Whether to try again the call that failed with e:
 * such failures for up to SETTLE_MS since *start_ns (0: the first failure), a second apart;
 * any other error fails at once. */
#define SETTLE_MS 20000
static bool js_settling(int e, int64_t *start_ns)
{
    if (e != SP_ETIMEOUT && e != SP_EBUS)
        return false;
    if (!*start_ns)
        *start_ns = sp_mono_ns();
    if (sp_mono_ns() - *start_ns > (int64_t)SETTLE_MS * 1000000)
        return false;
    if (e == SP_EBUS)
        sp_proc_sleep_ms(1000);
    return true;
}

/* The durables of the contract for identity name, made by the operator's connection. */
static int durables_for(sp_bus_t *op, const char *name)
{
    const sp_consumer_def_t *defs;
    sp_identity_t id;
    size_t n;

    if (sp_identity_parse(name, &id) < 0)
        return 0;
    defs = sp_contract_consumers(&n);
    for (size_t i = 0; i < n; i++) {
        char durable[160], filter[160];
        sp_bus_consumer_t *c = NULL;
        int r;

        /* Its daemon deletes and recreates it at each start and after each failure (the
         * event log when PostgreSQL comes back): made here too, it would race that. */
        if (defs[i].kind != id.kind || defs[i].recreated)
            continue;
        expand(durable, sizeof(durable), defs[i].durable, id.instance);
        expand(filter, sizeof(filter), defs[i].filter, id.instance);
        /* Bind: created when missing, an existing one (with its delivery state) is kept. */
        int64_t settle = 0;
        do
            r = sp_bus_consumer_bind(op, durable, filter, defs[i].ack_wait_ms, &c);
        while (r < 0 && js_settling(r, &settle));
        if (r < 0) {
            fprintf(stderr, "space: cannot create the durable %s (%s) as operator: %s\n", durable,
                    filter, r == -EEXIST ? "it exists with another filter" : sp_strerror(r));
            return -1;
        }
        sp_bus_consumer_free(c);
    }
    return 0;
}

/* Connects as identity name of dir, for the operator's work and for checks. Right after a
 * reload (SIGHUP) nats-server may refuse connections for a moment while it swaps its users,
 * so refusals are retried for a few seconds. */
static int connect_as(const char *dir, const char *name, const char *url,
                      const sp_stack_config_t *cfg, sp_busid_t *busid, sp_bus_t **ret_bus)
{
    sp_bus_opts_t bo = {.url = url,
                        .name = "space",
                        .timeout_ms = 2000,
                        .stream_max_age_s = cfg ? cfg->stream_max_age_s : 0,
                        .stream_max_bytes = cfg ? cfg->stream_max_bytes : 0,
                        .stream_replicas = cfg ? sp__stack_replicas(cfg) : 0};
    char err[SP_BUSID_ERR_MAX];
    int r;

    if ((r = sp_busid_setup(dir, name, NULL, busid, &bo, err)) < 0) {
        fprintf(stderr, "space: identity %s: %s\n", name, err);
        return r;
    }
    /* The process signs nothing with it: its connections are for management and checks. */
    sp_publish_signer_set(NULL, NULL);
    for (int i = 0; i < 20; i++) {
        r = sp_bus_connect(&bo, ret_bus);
        if (r >= 0)
            return r;
        usleep(250 * 1000);
    }
    sp_busid_dispose(busid);
    return r;
}

int sp__identity_js_up(const sp_stack_t *st, const char *nats_url, const char *only)
{
    char *dir = sp__identity_dir(st->home), **names = NULL;
    sp_busid_t busid = {0};
    sp_bus_t *op = NULL;
    size_t n = 0;
    int r = -1, e;

    if ((e = connect_as(dir, "operator", nats_url, st->cfg, &busid, &op)) < 0) {
        fprintf(stderr, "space: cannot connect to NATS as operator: %s\n", sp_strerror(e));
        goto out;
    }
    /* The event log's checkpoints have a stream of their own (docs/audit.md): the operator
     * creates it, the event log only publishes there. */
    int64_t settle = 0;
    do
        if ((e = sp_bus_ensure_stream(op)) >= 0 && (e = sp_bus_ensure_ckpt_stream(op)) >= 0)
            e = sp_obj_bucket_ensure(op, SP_SNAPSHOT_BUCKET);
    while (e < 0 && js_settling(e, &settle));
    if (e < 0) {
        fprintf(stderr, "space: cannot create the streams or the snapshot bucket as operator: %s\n",
                sp_strerror(e));
        goto out;
    }
    /* A stream made before the limits (or with others) gets the configured ones. */
    int changed = 0;
    if (st->cfg && (e = sp_bus_apply_stream_limits(op, &changed)) < 0) {
        fprintf(stderr, "space: cannot set the limits of %s: %s\n", SP_BUS_STREAM, sp_strerror(e));
        goto out;
    }
    if (changed)
        printf("%-*s limits   max age %llds, max bytes %lld\n", SP_STACK_PART_WIDTH, SP_BUS_STREAM,
               (long long)st->cfg->stream_max_age_s, (long long)st->cfg->stream_max_bytes);
    if ((e = sp__identity_names(dir, &names, &n)) < 0) {
        fprintf(stderr, "space: cannot read %s: %s\n", dir, strerror(-e));
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        if ((!only || strcmp(only, names[i]) == 0) && durables_for(op, names[i]) < 0)
            goto out;
    r = 0;
out:
    sp__identity_names_free(names, n);
    sp_bus_free(op);
    sp_busid_dispose(&busid);
    free(dir);
    return r;
}

int sp__identity_check(const sp_stack_t *st, const char *nats_url, const char *name)
{
    char *dir = sp__identity_dir(st->home);
    sp_busid_t busid = {0};
    sp_bus_t *bus = NULL;
    int r;

    r = connect_as(dir, name, nats_url, st->cfg, &busid, &bus);
    sp_bus_free(bus);
    sp_busid_dispose(&busid);
    free(dir);
    return r;
}

int sp__identity_add(const sp_stack_t *st, const char *kind, const char *instance,
                     char ret_name[SP_IDENTITY_MAX + 1])
{
    char *dir = sp__identity_dir(st->home);
    sp_identity_t id;
    int r = -1, made;
    bool found = false;

    for (int k = 0; k < SP_KIND__COUNT; k++) {
        if (strcmp(sp_kind_name((sp_kind_t)k), kind) == 0) {
            found = true;
            if (sp_identity_format((sp_kind_t)k, instance, &id) < 0) {
                fprintf(stderr,
                        "space identity: %s%s%s is not an identity (worker, egressd and platform "
                        "need an INSTANCE: an id of letters, digits, '-', '_')\n",
                        kind, instance ? " " : "", instance ? instance : "");
                goto out;
            }
        }
    }
    if (!found) {
        fprintf(stderr, "space identity: unknown kind '%s' (", kind);
        for (int k = 0; k < SP_KIND__COUNT; k++)
            fprintf(stderr, "%s%s", k ? ", " : "", sp_kind_name((sp_kind_t)k));
        fprintf(stderr, ")\n");
        goto out;
    }
    if (creds_dir_make(dir) < 0 || (made = creds_ensure(dir, id.name)) < 0)
        goto out;
    printf("%s %s: %s/%s.{nk,nkpub,key,pub}\n", id.name, made ? "created" : "exists, kept", dir,
           id.name);
    memcpy(ret_name, id.name, sizeof(id.name));
    r = 0;
out:
    free(dir);
    return r;
}

/* Copies src to dst through dst.tmp and a rename, mode 0644. */
static int copy_public(const char *src, const char *dst)
{
    char buf[4096];
    char *tmp = sp_xasprintf("%s.tmp", dst);
    FILE *in = fopen(src, "re"), *out = NULL;
    size_t n = 0;
    int r = -EIO;

    if (!in) {
        r = -errno;
        goto out;
    }
    n = fread(buf, 1, sizeof(buf), in);
    if (n == 0 || n == sizeof(buf) || !(out = fopen(tmp, "we")))
        goto out;
    if (fwrite(buf, 1, n, out) != n || fflush(out) != 0 || fsync(fileno(out)) != 0)
        goto out;
    if (fclose(out) != 0) {
        out = NULL;
        goto out;
    }
    out = NULL;
    if (chmod(tmp, 0644) < 0 || rename(tmp, dst) < 0) {
        r = -errno;
        goto out;
    }
    r = 0;
out:
    if (in)
        fclose(in);
    if (out)
        fclose(out);
    if (r < 0)
        unlink(tmp);
    free(tmp);
    return r;
}

int sp__identity_rotate(const sp_stack_t *st, const char *name, long long grace_s)
{
    char *dir = sp__identity_dir(st->home);
    char *key = sp_xasprintf("%s/%s.key", dir, name), *pub = sp_xasprintf("%s/%s.pub", dir, name);
    char *next = sp_xasprintf("%s/%s.key.next", dir, name), *retired = NULL;
    long long until = (long long)time(NULL) + grace_s;
    sp_identity_t id;
    struct stat sb;
    int r = -1, e;

    if (sp_identity_parse(name, &id) < 0 || id.kind == SP_KIND_OPERATOR) {
        fprintf(stderr, "space identity rotate: %s is not an identity that signs\n", name);
        goto out;
    }
    if (stat(key, &sb) < 0 || stat(pub, &sb) < 0) {
        fprintf(stderr, "space identity rotate: %s has no key in %s (space identity add)\n", name,
                dir);
        goto out;
    }
    /* Two rotations within one second: each retired key keeps its own file. */
    for (;; until++) {
        free(retired);
        retired = sp_xasprintf("%s/%s@%lld.pub", dir, name, until);
        if (stat(retired, &sb) < 0)
            break;
    }
    /* The old public key first: a verifier reading the directory at any moment finds the old
     * key retired or current, never missing. */
    if ((e = copy_public(pub, retired)) < 0) {
        fprintf(stderr, "space identity rotate: cannot write %s: %s\n", retired, sp_strerror(e));
        goto out;
    }
    unlink(next); /* left by a rotation that was interrupted */
    if ((e = sp_sign_keygen(next, pub)) < 0 || rename(next, key) < 0) {
        e = e < 0 ? e : -errno;
        fprintf(stderr, "space identity rotate: cannot make the new key of %s: %s\n", name,
                sp_strerror(e));
        unlink(next);
        goto out;
    }
    char when[32];
    time_t t = (time_t)until;
    struct tm tm;
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    printf("%s: new signing key %s/%s.{key,pub}\n"
           "%s: the old key is retired as %s: it counts for messages published until %s\n",
           name, dir, name, name, retired, when);
    r = 0;
out:
    free(dir);
    free(key);
    free(pub);
    free(next);
    free(retired);
    return r;
}

int sp__identity_list(const sp_stack_t *st, bool json)
{
    char *dir = sp__identity_dir(st->home), **names = NULL;
    size_t n = 0;
    int r = sp__identity_names(dir, &names, &n);

    if (r < 0)
        fprintf(stderr, "space identity: cannot read %s: %s\n", dir, strerror(-r));
    if (json && r >= 0) {
        sp_buf_t b;
        sp_buf_init(&b);
        sp_buf_puts(&b, "{\"identities\":[");
        for (size_t i = 0; i < n; i++) {
            if (i)
                sp_buf_putc(&b, ',');
            sp_buf_json_str(&b, names[i]);
        }
        sp_buf_puts(&b, "]}");
        printf("%s\n", b.data);
        sp_buf_dispose(&b);
    }
    for (size_t i = 0; !json && i < n; i++)
        printf("%s\n", names[i]);
    sp__identity_names_free(names, n);
    free(dir);
    return r < 0 ? -1 : 0;
}
