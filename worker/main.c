/* space-worker: one per host, root. Owns its sandboxes (worker_runtime.h does the host work),
 * consumes its own subjects (worker_events.c), reconciles with the host at start
 * (worker_reconcile.c) and publishes heartbeats with its capacity. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "busid.h"
#include "config.h"
#include "daemon.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "worker.h"
#include "tlsca.h"
#include "tmplstat.h"
#include "xmalloc.h"

static const sp_cfg_opt_t options[] = {
    SP_CFG_STR_OPT("id", wk_config_t, id, "worker-1", "this worker's id (unique per host)"),
    SP_BUSID_CFG_OPTS(wk_config_t, identity, creds_dir),
    SP_VERIFIER_CFG_OPTS(wk_config_t, verify_signatures, keyring_dir),
    SP_CFG_STR_OPT("nats-url", wk_config_t, nats_url, "nats://127.0.0.1:4222", "NATS URL(s)"),
    SP_CFG_STR_OPT("pg-url", wk_config_t, pg_url, "postgresql:///space", "PostgreSQL URI"),
    SP_CFG_STR_OPT("state-dir", wk_config_t, state_dir, "./var/worker",
                   "runsc root, bundles, the volume image"),
    SP_CFG_STR_OPT("volume-dir", wk_config_t, volume_dir, NULL,
                   "btrfs mount for templates and disks (default: <state-dir>/volumes)"),
    SP_CFG_INT_OPT("image-mb", wk_config_t, image_mb, 256, 16 * 1024 * 1024, "20480",
                   "size of the sparse btrfs image when volume-dir is not btrfs"),
    SP_CFG_STR_OPT("runsc", wk_config_t, runsc, "runsc", "runsc program"),
    SP_CFG_STR_OPT("agent", wk_config_t, agent, NULL,
                   "the static space-agent binary put into every sandbox (default: next to "
                   "space-worker)"),
    SP_CFG_STR_OPT("ca-cert", wk_config_t, ca_cert, NULL,
                   "the deployment CA certificate every sandbox trusts (default: "
                   "$SPACE_HOME/ca/ca.crt when it exists; certificates only)"),
    SP_CFG_STR_OPT("runsc-platform", wk_config_t, runsc_platform, "ptrace", "ptrace or kvm"),
    SP_CFG_STR_OPT("net-prefix", wk_config_t, net_prefix, "10.200",
                   "first two octets of the sandbox address pool (a /16 inside netns only)"),
    SP_CFG_INT_OPT("egress-proxy-port", wk_config_t, egress_proxy_port, 0, 65535, "15001",
                   "space-egressd's transparent TCP port: every sandbox TCP connection is "
                   "redirected there (0: TCP from sandboxes is dropped)"),
    SP_CFG_INT_OPT("egress-dns-port", wk_config_t, egress_dns_port, 0, 65535, "15053",
                   "space-egressd's DNS port: every sandbox DNS query (UDP 53, to any address) "
                   "goes there (0: dropped)"),
    SP_CFG_STR_OPT("snapshot-store", wk_config_t, snapshot_store, "dir",
                   "where suspended sandboxes go: dir (snapshot-dir, shared by the workers) or "
                   "nats (the JetStream object store, for workers on several hosts)"),
    SP_CFG_STR_OPT("snapshot-dir", wk_config_t, snapshot_dir, NULL,
                   "dir store: the store, a directory every worker that may resume this one's "
                   "sandboxes can read; nats store: this worker's cache of the bucket "
                   "(default: <state-dir>/snapshots)"),
    SP_CFG_STR_OPT("snapshot-bucket", wk_config_t, snapshot_bucket, "space-snapshots",
                   "nats store: the object-store bucket (stream OBJ_<bucket>)"),
    SP_CFG_INT_OPT("snapshot-sweep-s", wk_config_t, snapshot_sweep_s, 1, 86400, "300",
                   "how often snapshots of deleted sandboxes (and stale cache) are removed"),
    SP_CFG_INT_OPT("kept-disk-s", wk_config_t, kept_disk_s, 0, 2592000, "900",
                   "how long a suspended sandbox's disk stays on its host, for a resume there "
                   "to start from it (0: not kept; removed at the first snapshot sweep after)"),
    SP_CFG_STR_OPT("templates", wk_config_t, templates, "tiny",
                   "templates to prepare at start, comma-separated (base takes minutes); their "
                   "progress is in <state-dir>/templates.status"),
    SP_CFG_STR_OPT("template-defs", wk_config_t, template_defs, NULL,
                   "where template definitions <name>.sh are (default: the worker's own)"),
    SP_CFG_STR_OPT("template-cache", wk_config_t, template_cache, "/var/cache/space/templates",
                   "the host's template cache, shared by every worker of this host: a template "
                   "another home made is received from it instead of built (\"\": none)"),
    SP_CFG_INT_OPT("vcpu-total", wk_config_t, vcpu_total, 0, 4096, "0", "0: the host's CPUs"),
    SP_CFG_INT_OPT("memory-mb-total", wk_config_t, memory_mb_total, 0, 1LL << 32, "0",
                   "0: the host's memory"),
    SP_CFG_INT_OPT("disk-mb-default", wk_config_t, disk_mb_default, 16, 1LL << 30, "2048",
                   "MiB a sandbox may write beyond its template when its create names no "
                   "resources.disk_mb (btrfs qgroup limit)"),
    SP_CFG_INT_OPT("disk-reserve-mb", wk_config_t, disk_reserve_mb, 0, 1LL << 30, "1024",
                   "MiB of the volume kept free: a create that could leave less (free minus its "
                   "disk_mb) is refused (no_capacity)"),
    SP_CFG_BOOL_OPT("disk-quota", wk_config_t, disk_quota, "true",
                    "btrfs quotas on the volume and a disk_mb limit per sandbox (false: none, "
                    "sandboxes share the volume; for comparisons)"),
    SP_CFG_INT_OPT("pids-default", wk_config_t, pids_default, 16, 1 << 22, "1024",
                   "processes per user id inside a sandbox (RLIMIT_NPROC)"),
    SP_CFG_INT_OPT("file-call-ms", wk_config_t, file_call_ms, 200, 25000, "10000",
                   "a file call the agent has not finished within this is answered pending "
                   "(the gateway asks again): below the gateway's 35 s request timeout"),
    SP_CFG_INT_OPT("file-op-max-s", wk_config_t, file_op_max_s, 10, 86400, "900",
                   "a recursive remove or a move the agent has not finished by then fails "
                   "(agent_error); stat, list and mkdir fail after 30 s"),
    SP_CFG_INT_OPT("heartbeat-ms", wk_config_t, heartbeat_ms, 100, 600000, "2000",
                   "heartbeat interval"),
    SP_CFG_INT_OPT("sample-ms", wk_config_t, sample_ms, 100, 600000, "5000",
                   "each running sandbox's CPU, memory and disk are sampled this often for "
                   "GET /v1/sandboxes/{id}/metrics (an hour's worth kept per sandbox at 5 s)"),
    SP_CFG_INT_OPT("ack-wait-ms", wk_config_t, ack_wait_ms, 3000, 3600000, "15000",
                   "redelivery of an event this worker died handling, for a durable this worker "
                   "creates; one `space up` made keeps the contract's 15 s (logged at start)"),
    SP_CFG_INT_OPT("batch-max", wk_config_t, batch_max, 1, 1000, "64", "events per fetch"),
    SP_CFG_INT_OPT("parallel", wk_config_t, parallel, 1, 256, "16",
                   "sandboxes created or deleted at once"),
    SP_CFG_INT_OPT("pool-size", wk_config_t, pool_size, 0, 64, "2",
                   "warm pool: sandboxes of each template created ahead, claimed by a create in "
                   "milliseconds (0: pools off; docs/pools.md)"),
    SP_CFG_INT_OPT("pool-refill-ms", wk_config_t, pool_refill_ms, 0, 600000, "250",
                   "warm pool: pause after each refill create (one at a time), the bound on "
                   "the refill rate"),
    SP_CFG_INT_OPT("agent-lost-grace-ms", wk_config_t, agent_lost_grace_ms, 100, 600000, "5000",
                   "how long the commands of a broken agent channel wait for the agent to "
                   "connect back before they end as lost"),
    SP_CFG_INT_OPT("pool-max-age-s", wk_config_t, pool_max_age_s, 1, 30 * 86400, "3600",
                   "warm pool: a pooled sandbox older than this is destroyed and made again"),
    SP_CFG_BOOL_OPT("teardown", wk_config_t, teardown, "false",
                    "destroy every sandbox of this worker, unmount its volume and exit"),
    SP_CFG_INT_OPT("audit-cap", wk_config_t, audit_cap, 0, 64 * 1024 * 1024, "1048576",
                   "bytes of each command's output recorded in the log (CommandOutput); 0: none"),
    SP_CFG_BOOL_OPT("seal-output", wk_config_t, seal_output, "false",
                    "seal recorded output under the sandbox's data key from space-credstore; "
                    "no key, no output recorded (docs/audit.md)"),
    SP_CFG_INT_OPT("datakey-timeout-ms", wk_config_t, datakey_timeout_ms, 50, 60000, "2000",
                   "how long an exec waits for space-credstore's data key"),
    SP_CFG_STR_OPT("log-level", wk_config_t, log_level, "info", "debug|info|warn|error"),
    SP_CFG_STR_OPT("log-format", wk_config_t, log_format, "kv", "kv|json"),
    SP_METRICS_CFG_OPTS(wk_config_t, metrics_addr, metrics_port_file),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* The process's identity on the bus: lives as long as the process publishes. */
static sp_busid_t busid;

/* Stale qgroups (docs/faults.md, "Limits"): at start with a rescan for those the kernel
 * refuses, then with every snapshot sweep. */
static void qgroup_sweep(wk_t *w, bool rescan)
{
    char err[WK_ERR_MAX] = "";
    unsigned removed = 0, left = 0;
    int64_t t0 = sp_mono_ns();
    int rc = wk_host_qgroup_sweep(w->host, rescan, &removed, &left, err);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "stale qgroups not swept", SP_KS("error", err));
    else if (removed || left)
        sp_log(SP_LOG_INFO, "stale qgroups swept", SP_KU("removed", removed), SP_KU("left", left),
               SP_KF("ms", (double)(sp_mono_ns() - t0) / 1e6));
}

static void *heartbeat_main(void *arg)
{
    wk_t *w = arg;
    int64_t swept_at = sp_mono_ns();
    while (!sp_daemon_stopping) {
        int rc = wk_heartbeat(w);
        if (rc < 0)
            sp_log(SP_LOG_WARN, "heartbeat failed", SP_KS("error", sp_strerror(rc)));
        if (sp_mono_ns() - swept_at > (int64_t)w->cfg->snapshot_sweep_s * 1000000000) {
            PGconn *db = NULL;
            if (sp_db_idle_take(w->db, 5000, &db) == 0)
                wk_snap_sweep(w, db);
            sp_db_idle_give(w->db, db);
            qgroup_sweep(w, false);
            swept_at = sp_mono_ns();
        }
        sp_daemon_sleep_ms((int)w->cfg->heartbeat_ms);
    }
    return NULL;
}

/* A program installed next to this one (heap path). */
static char *sibling_program(const char *name)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return sp_xstrdup(name);
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    return sp_xasprintf("%s/%s", exe, name);
}

/* The configured templates: those already on the volume are listed at once; the others are
 * made by their own thread (from the host's cache or built) while the worker serves, each
 * offered in the heartbeat once ready. A template that fails is logged and not offered; the
 * worker goes on with the rest. templates.status says how far each is (tmplstat.h). */
static struct {
    sp_tmplstat_t t[SP_TMPLSTAT_MAX];
    size_t n;
    char *path;
    pthread_t thread;
    /* The thread is detached, and says here when it is done: joined only at the stop, a
     * thread that ended long before looked leaked to TSan in every forked child that exits
     * (the reapers of runsc calls). */
    pthread_mutex_t mu;
    pthread_cond_t done;
    bool running;
} prep = {.mu = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static int64_t wall_ms(void)
{
    return sp_now_us() / 1000;
}

static void prep_write(void)
{
    int rc = sp_tmplstat_write(prep.path, (int)getpid(), prep.t, prep.n);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "cannot write the template status", SP_KS("path", prep.path),
               SP_KS("error", strerror(-rc)));
}

static void prep_offer(wk_t *w)
{
    char **names = NULL;
    size_t n = 0;
    if (wk_template_list(w->host, &names, &n) < 0)
        return;
    pthread_mutex_lock(&w->mu);
    wk_strv_free(w->templates, w->n_templates);
    w->templates = names;
    w->n_templates = n;
    pthread_mutex_unlock(&w->mu);
}

static void *templates_main(void *arg)
{
    wk_t *w = arg;
    for (size_t i = 0; i < prep.n && !sp_daemon_stopping; i++) {
        sp_tmplstat_t *t = &prep.t[i];
        if (t->state != SP_TMPL_QUEUED)
            continue;
        char err[WK_ERR_MAX] = "";
        int64_t t0 = sp_mono_ns();
        t->state = SP_TMPL_BUILDING;
        t->since_ms = wall_ms();
        char name[sizeof(t->name)]; /* not t->name itself: gcc -O0's -Wrestrict, one object */
        memcpy(name, t->name, sizeof(name));
        snprintf(t->detail, sizeof(t->detail), "log %s/template-%s.log", w->cfg->state_dir, name);
        prep_write();
        sp_log(SP_LOG_INFO, "template being made", SP_KS("template", t->name));
        int rc = wk_template_ensure(w->host, t->name, err);
        if (rc == -ECANCELED)
            break;
        t->took_ms = (sp_mono_ns() - t0) / 1000000;
        t->since_ms = wall_ms();
        if (rc < 0) {
            t->state = SP_TMPL_FAILED;
            snprintf(t->detail, sizeof(t->detail), "%s", err);
            sp_log(SP_LOG_ERROR, "template not ready", SP_KS("template", t->name),
                   SP_KS("error", err));
        } else {
            const char *how = rc == WK_TEMPLATE_CACHED  ? "cache"
                              : rc == WK_TEMPLATE_BUILT ? "built"
                                                        : "present";
            t->state = SP_TMPL_READY;
            snprintf(t->detail, sizeof(t->detail), "%s", how);
            sp_log(SP_LOG_INFO, "template ready", SP_KS("template", t->name), SP_KS("source", how),
                   SP_KI("ms", t->took_ms));
            prep_offer(w);
        }
        prep_write();
    }
    pthread_mutex_lock(&prep.mu);
    prep.running = false;
    pthread_cond_broadcast(&prep.done);
    pthread_mutex_unlock(&prep.mu);
    return NULL;
}

static int prepare_templates(wk_t *w)
{
    char *list = sp_xstrdup(w->cfg->templates), *save = NULL;
    int rc = 0;
    bool todo = false;
    char **names = NULL; /* what the volume has */
    size_t n_names = 0;
    prep.path = sp_xasprintf("%s/" SP_TMPLSTAT_FILE, w->cfg->state_dir);
    if (wk_template_list(w->host, &names, &n_names) < 0)
        n_names = 0;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!sp_id_valid(t) || prep.n == SP_TMPLSTAT_MAX) {
            sp_log(SP_LOG_ERROR, "bad templates option (at most 64 template names)",
                   SP_KS("template", t));
            rc = SP_ECONFIG;
            break;
        }
        sp_tmplstat_t *s = &prep.t[prep.n++];
        memset(s, 0, sizeof(*s));
        snprintf(s->name, sizeof(s->name), "%s", t);
        s->since_ms = wall_ms();
        s->state = SP_TMPL_QUEUED;
        for (size_t i = 0; i < n_names; i++) {
            if (strcmp(names[i], t) == 0) {
                s->state = SP_TMPL_READY;
                snprintf(s->detail, sizeof(s->detail), "present");
            }
        }
        todo |= s->state == SP_TMPL_QUEUED;
    }
    wk_strv_free(names, n_names);
    free(list);
    if (rc < 0)
        return rc;
    prep_write();
    prep_offer(w);
    if (todo) {
        prep.running = true;
        if (pthread_create(&prep.thread, NULL, templates_main, w) != 0) {
            prep.running = false;
            return -EAGAIN;
        }
        pthread_detach(prep.thread);
    }
    return 0;
}

/* --teardown: releases what every identity recorded in the state directory made (each worker
 * records its id, tag and volume directory there before it makes anything), so `space down
 * --purge` releases exactly what `space up` made whatever SPACE_ID or SPACE_VOLUME_DIR its
 * caller has. A state directory from before the record: this process's own id, as before. The
 * worker's own daemon is stopped (space down does that first): nothing races. */
static int teardown(const wk_host_config_t *base)
{
    char herr[WK_ERR_MAX] = "";
    wk_host_identity_t *ids = NULL;
    size_t n = 0;
    int rc = wk_host_identities(base->state_dir, &ids, &n, herr);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "teardown: no record of what this state directory made",
               SP_KS("error", herr), SP_KS("code", sp_strerror(rc)));
        return rc;
    }
    for (size_t i = 0; i < (n ? n : 1) && rc == 0; i++) {
        wk_host_config_t hc = *base;
        if (n) {
            hc.worker_id = ids[i].worker_id;
            hc.volume_dir = ids[i].volume_dir;
        }
        wk_host_t *h = NULL;
        if ((rc = wk_host_open(&hc, &h, herr)) == 0)
            rc = wk_host_teardown(h, herr);
        if (rc == 0 && n && strcmp(wk_host_tag(h), ids[i].tag) != 0) {
            /* The tag comes from the id and the state directory's path: the directory moved,
             * and what the recorded tag names is left for the operator (the error stops the
             * purge). */
            snprintf(herr, sizeof(herr), "recorded tag %s, but this state directory gives %s",
                     ids[i].tag, wk_host_tag(h));
            rc = SP_ECONFIG;
        }
        if (rc < 0)
            sp_log(SP_LOG_ERROR, "teardown failed", SP_KS("worker", hc.worker_id),
                   SP_KS("error", herr), SP_KS("code", sp_strerror(rc)));
        else
            sp_log(SP_LOG_INFO, "host torn down", SP_KS("worker", hc.worker_id),
                   SP_KS("tag", wk_host_tag(h)), SP_KS("state_dir", hc.state_dir));
        wk_host_close(h);
    }
    wk_host_identities_free(ids, n);
    return rc;
}

/* The CA `space up` made ($SPACE_HOME/ca/ca.crt), if there is one (heap path or NULL). */
static char *default_ca(void)
{
    const char *home = getenv("SPACE_HOME");
    if (!home || !home[0])
        return NULL;
    char *p = sp_xasprintf("%s/ca/" SP_CA_CERT_FILE, home);
    if (access(p, R_OK) == 0)
        return p;
    free(p);
    return NULL;
}

int main(int argc, char **argv)
{
    sp_daemon_no_core(); /* before any secret is read */
    wk_config_t cfg = {0};
    wk_t w = {.cfg = &cfg};
    char *err = NULL, *volume_dir = NULL, *agent_path = NULL, *ca_path = NULL;
    char herr[WK_ERR_MAX] = "";
    int argi = 0, code = 1, rc;
    sp_log_level_t level;
    sp_log_format_t format;
    PGconn *db = NULL;
    pthread_t hb;
    int hb_started = 0;
    sp_metrics_t *reg = sp_metrics_new();
    sp_metrics_server_t *msrv = NULL;
    char merr[SP_METRICS_ERR_MAX] = "bad metric families";

    pthread_mutex_init(&w.mu, NULL);
    if (sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err) < 0) {
        fprintf(stderr, "space-worker: %s\n", err ? err : "bad options");
        goto out;
    }
    if (argi < 0) {
        code = 0;
        goto out;
    }
    if (argi < argc || sp_log_level_parse(cfg.log_level, &level) < 0 ||
        sp_log_format_parse(cfg.log_format, &format) < 0 || !sp_id_valid(cfg.id)) {
        fprintf(stderr, "space-worker: bad arguments (see --help)\n");
        goto out;
    }
    sp_log_init("space-worker", level, format);
    sp_daemon_signals();
    if (wk_metrics_init(&w, reg) < 0) {
        sp_log(SP_LOG_ERROR, "cannot serve metrics", SP_KS("error", merr));
        goto out;
    }

    gethostname(w.hostname, sizeof(w.hostname) - 1);
    struct sysinfo si;
    sysinfo(&si);
    w.vcpu_total = cfg.vcpu_total ? (uint32_t)cfg.vcpu_total : (uint32_t)get_nprocs();
    w.memory_mb_total = cfg.memory_mb_total ? (uint64_t)cfg.memory_mb_total
                                            : (uint64_t)si.totalram * si.mem_unit / (1024 * 1024);

    volume_dir =
        cfg.volume_dir[0] ? sp_xstrdup(cfg.volume_dir) : sp_xasprintf("%s/volumes", cfg.state_dir);
    if (!cfg.snapshot_dir[0]) {
        free(cfg.snapshot_dir);
        cfg.snapshot_dir = sp_xasprintf("%s/snapshots", cfg.state_dir);
    }
    if (wk_mkdir_p(cfg.snapshot_dir) < 0) {
        sp_log(SP_LOG_ERROR, "cannot make the snapshot store", SP_KS("dir", cfg.snapshot_dir),
               SP_KS("error", strerror(errno)));
        goto out;
    }
    agent_path = cfg.agent[0] ? sp_xstrdup(cfg.agent) : sibling_program("space-agent");
    ca_path = cfg.ca_cert[0] ? sp_xstrdup(cfg.ca_cert) : default_ca();
    wk_host_config_t hc = {
        .worker_id = cfg.id,
        .state_dir = cfg.state_dir,
        .volume_dir = volume_dir,
        .image_bytes = (uint64_t)cfg.image_mb * 1024 * 1024,
        .runsc = cfg.runsc,
        .runsc_platform = cfg.runsc_platform,
        .net_prefix = cfg.net_prefix,
        .agent_path = agent_path,
        .egress_proxy_port = (uint16_t)cfg.egress_proxy_port,
        .egress_dns_port = (uint16_t)cfg.egress_dns_port,
        .ca_cert_path = ca_path,
        .disk_mb_default = (uint32_t)cfg.disk_mb_default,
        .disk_reserve_mb = (uint32_t)cfg.disk_reserve_mb,
        .disk_quota_off = !cfg.disk_quota,
        .pids_default = (uint32_t)cfg.pids_default,
        .template_defs = cfg.template_defs[0] ? cfg.template_defs : NULL,
        .template_cache = cfg.template_cache,
        .cancel = &sp_daemon_stopping,
        .runsc_seconds = w.metrics.runsc,
    };
    if (cfg.teardown) {
        code = teardown(&hc) < 0 ? 1 : 0;
        goto out;
    }
    if ((rc = wk_host_open(&hc, &w.host, herr)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot prepare the host", SP_KS("error", herr),
               SP_KS("code", sp_strerror(rc)));
        goto out;
    }
    qgroup_sweep(&w, true);
    if (prepare_templates(&w) < 0)
        goto out;
    /* send_asap: the worker is on the exec path both ways (the ExecRequest's reply, IoChunk and
     * IoExit). */
    sp_bus_opts_t bo = {
        .url = cfg.nats_url, .name = "space-worker", .timeout_ms = 30000, .send_asap = true};
    char def_id[SP_IDENTITY_MAX + 1], iderr[SP_BUSID_ERR_MAX];
    snprintf(def_id, sizeof(def_id), "worker-%s", cfg.id);
    if (sp_busid_setup(cfg.creds_dir, cfg.identity, def_id, &busid, &bo, iderr) < 0) {
        sp_log(SP_LOG_ERROR, "bad identity", SP_KS("error", iderr));
        goto out;
    }
    char verr[SP_VERIFIER_ERR_MAX];
    if (sp_verifier_new(cfg.verify_signatures, cfg.keyring_dir, cfg.creds_dir, 0, &w.verifier,
                        verr) < 0) {
        sp_log(SP_LOG_ERROR, "cannot check signatures", SP_KS("error", verr));
        goto out;
    }
    sp_log(sp_verifier_mode(w.verifier) == SP_VERIFY_ON ? SP_LOG_INFO : SP_LOG_WARN,
           sp_verifier_summary(w.verifier), SP_KS("keyring_dir", sp_verifier_dir(w.verifier)));
    sp_request_guard_new(w.verifier, &w.guard);
    if ((rc = sp_bus_connect(&bo, &w.bus)) < 0 || (rc = sp_bus_ensure_stream(w.bus)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot reach NATS", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    char *journal = sp_xasprintf("%s/facts.journal", cfg.state_dir);
    rc = wk_factq_new(w.bus, cfg.id, journal, &w.facts);
    free(journal);
    if (rc < 0) {
        sp_log(SP_LOG_ERROR, "cannot start the command facts queue",
               SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    if (wk_snap_open(&w) < 0)
        goto out;
    w.db = sp_db_idle_new(cfg.pg_url, "space-worker", WK_DB_IDLE_KEEP);
    if ((rc = sp_db_idle_take(w.db, 30000, &db)) < 0 || (rc = sp_db_migrate(db)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot reach PostgreSQL", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    /* Before the first heartbeat: the scheduler must not place here before we know what we
     * own. */
    if (wk_reconcile(&w, db) < 0)
        goto out;
    wk_snap_sweep(&w, db);
    if (wk_commands_start(&w) < 0 || wk_files_start(&w) < 0 || wk_watches_start(&w) < 0 ||
        wk_samples_start(&w) < 0 || wk_take_placements(&w, db) < 0)
        goto out;
    sp_db_idle_give(w.db, db);
    db = NULL;
    /* After the reconciliation released a previous process's pooled sandboxes. */
    if (wk_pool_start(&w) < 0)
        goto out;
    /* Now that the owned table, the pool and the host are what scrapes read. */
    wk_metrics_serve_collect(&w, reg);
    if (sp_metrics_serve(reg, "space-worker", cfg.metrics_addr, cfg.metrics_port_file, &msrv,
                         merr) < 0) {
        sp_log(SP_LOG_ERROR, "cannot serve metrics", SP_KS("error", merr));
        goto out;
    }
    if (pthread_create(&hb, NULL, heartbeat_main, &w) == 0)
        hb_started = 1;
    wk_serve(&w);
    code = 0;
out:
    sp_daemon_stop();
    /* First: its scrapes read the owned table, the pool and the host. */
    sp_metrics_server_free(msrv);
    msrv = NULL;
    if (hb_started)
        pthread_join(hb, NULL);
    /* A build in progress is stopped (cancel): wait for its thread to say so. */
    pthread_mutex_lock(&prep.mu);
    while (prep.running)
        pthread_cond_wait(&prep.done, &prep.mu);
    pthread_mutex_unlock(&prep.mu);
    wk_pool_stop(&w);
    PQfinish(db);
    wk_files_stop(&w); /* joins the reaper, which may still reply on the bus */
    wk_watches_stop(&w);
    wk_samples_stop(&w);
    wk_commands_stop(&w);
    /* The sandboxes go on without us (the next worker adopts them and their agents connect
     * back): their commands are dropped, not ended. Listener threads notice the stop within
     * their poll period and drop their references; the bus outlives them all. */
    for (size_t i = 0; i < w.n_owned; i++) {
        wk_box_forget_commands(w.owned[i]);
        wk_box_put(w.owned[i]);
    }
    for (int i = 0; i < 200 && atomic_load(&w.listeners) > 0; i++)
        usleep(10 * 1000);
    wk_commands_free(&w);
    wk_factq_free(w.facts);
    sp_bus_free(w.bus);
    sp_db_idle_free(w.db);
    sp_request_guard_free(w.guard);
    sp_verifier_free(w.verifier);
    sp_busid_dispose(&busid);
    wk_host_close(w.host);
    wk_strv_free(w.templates, w.n_templates);
    free(w.owned);
    free(volume_dir);
    free(agent_path);
    free(ca_path);
    free(prep.path);
    pthread_mutex_destroy(&w.mu);
    sp_metrics_free(reg);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(err);
    return code;
}
