/* space-credstore: owns the credentials (docs/credentials.md). Values sealed at rest under a
 * master key (AES-256-GCM); answers the gateway's administration and egressd's lookups over
 * NATS request/reply (proto/credstore.proto, subjects in include/space/cred.h); records
 * CredentialCreated / Rotated / Deleted on space.ev.cred.<tenant>.<type>. A wrong master key
 * stops it at start with a message; a value is never logged. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "busid.h"
#include "config.h"
#include "credstore.h"
#include "daemon.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "publish.h"
#include "xmalloc.h"

/* The process's identity on the bus: lives as long as the process publishes. */
static sp_busid_t busid;

static const sp_cfg_opt_t options[] = {
    SP_CFG_STR_OPT("nats-url", cs_config_t, nats_url, "nats://127.0.0.1:4222", "NATS URL(s)"),
    SP_BUSID_CFG_OPTS(cs_config_t, identity, creds_dir),
    SP_VERIFIER_CFG_OPTS(cs_config_t, verify_signatures, keyring_dir),
    SP_CFG_STR_OPT("pg-url", cs_config_t, pg_url, "postgresql:///space", "PostgreSQL URI"),
    SP_CFG_STR_OPT("master-key-file", cs_config_t, master_key_file, NULL,
                   "32 random bytes, mode 0600 (default: $SPACE_HOME/credstore/master.key, "
                   "which `space up` makes)"),
    SP_CFG_STR_OPT("previous-master-key-file", cs_config_t, previous_master_key_file, "",
                   "the key the credentials were sealed under before: they are re-wrapped "
                   "under master-key-file at start"),
    SP_CFG_STR_OPT("log-level", cs_config_t, log_level, "info", "debug|info|warn|error"),
    SP_CFG_STR_OPT("log-format", cs_config_t, log_format, "kv", "kv|json"),
    SP_METRICS_CFG_OPTS(cs_config_t, metrics_addr, metrics_port_file),
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

int cs_publish(cs_t *cs, Space__V1__Envelope *env, const char *tenant, const char *cred_id,
               const char *actor, const char *correlation_id)
{
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    agg.kind = "credential";
    agg.id = (char *)cred_id;
    env->aggregate = &agg;
    env->tenant = (char *)tenant;
    env->actor = (char *)(actor && actor[0] ? actor : "svc:credstore");
    env->correlation_id = (char *)(correlation_id ? correlation_id : "");
    char id[37], subject[192];
    uint8_t *data = NULL;
    size_t len = 0;
    sp_envelope_stamp(env, id);
    int rc = sp_envelope_subject(env, NULL, subject, sizeof(subject));
    if (rc >= 0)
        rc = sp_publish_pack(env, &data, &len);
    if (rc >= 0)
        rc = sp_bus_publish(cs->bus, subject, data, len, id, NULL, NULL);
    free(data);
    if (rc < 0)
        sp_log(SP_LOG_WARN, "credential event not published", SP_KS("credential", cred_id),
               SP_KS("type", env->type), SP_KS("error", sp_strerror(rc)));
    env->aggregate = NULL;
    return rc;
}

static const char *key_error(int rc)
{
    switch (rc) {
    case -EPERM:
        return "its mode lets others read it (chmod 600)";
    case -EINVAL:
        return "it is not a regular file of exactly 32 bytes";
    case -ENOENT:
        return "it does not exist (`space up` makes it)";
    default:
        return sp_strerror(rc);
    }
}

/* The directory entry of path made durable (a rename in it). */
static int fsync_dir_of(const char *path)
{
    char *dir = sp_xstrdup(path), *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    int fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = fd < 0 || fsync(fd) < 0 ? -errno : 0;
    if (fd >= 0)
        close(fd);
    free(dir);
    return rc;
}

/* `space creds rotate-master` put the next key beside the current one (<key>.next, 32 random
 * bytes, mode 0600): re-wrapped under it while serving, then it becomes the key file (an atomic
 * rename). 0: nothing to do or done; < 0: tried again on the next call (the rows re-wrapped so
 * far stay so; a restart with the file present completes it). */
static int rotate_live(cs_t *cs, const char *key_path, const char *next_path, unsigned *failures)
{
    sp_cred_key_t next;
    char old_id[SP_CRED_KEY_ID_LEN + 1];
    const char *why = NULL;
    int rc = sp_cred_key_load(next_path, &next);
    if (rc == -ENOENT)
        return 0;
    snprintf(old_id, sizeof(old_id), "%s", cs->have_previous ? cs->previous.id : cs->key.id);
    if (rc < 0)
        why = key_error(rc);
    else if ((rc = cs_store_rewrap_live(cs, &next, &why)) >= 0) {
        int count = rc;
        rc = rename(next_path, key_path) < 0 ? -errno : fsync_dir_of(key_path);
        if (rc < 0)
            why = "the next key file could not replace the key file";
        else
            sp_log(SP_LOG_INFO, "master key rotated while serving", SP_KS("from", old_id),
                   SP_KS("key_id", next.id), SP_KI("rewrapped", count), SP_KS("path", key_path));
    }
    sp_cred_key_wipe(&next);
    if (rc < 0 && (*failures)++ % 60 == 0)
        sp_log(SP_LOG_ERROR, "cannot rotate the master key (tried again every 500 ms)",
               SP_KS("path", next_path), SP_KS("why", why ? why : sp_strerror(rc)));
    if (rc >= 0)
        *failures = 0;
    return rc;
}

int main(int argc, char **argv)
{
    sp_daemon_no_core(); /* before any secret is read */
    cs_config_t cfg = {0};
    cs_t cs = {.cfg = &cfg};
    sp_cred_key_t previous;
    bool have_previous = false;
    char *err = NULL, *key_path = NULL, *next_path = NULL;
    int argi = 0, code = 1, rc;
    sp_log_level_t level;
    sp_log_format_t format;
    sp_metrics_t *reg = sp_metrics_new();
    sp_metrics_server_t *msrv = NULL;

    pthread_mutex_init(&cs.mu, NULL);
    if (sp_config_load(options, N_OPTIONS, &cfg, argc, argv, &argi, &err) < 0) {
        fprintf(stderr, "space-credstore: %s\n", err ? err : "bad options");
        goto out;
    }
    if (argi < 0) {
        code = 0;
        goto out;
    }
    if (argi < argc || sp_log_level_parse(cfg.log_level, &level) < 0 ||
        sp_log_format_parse(cfg.log_format, &format) < 0) {
        fprintf(stderr, "space-credstore: bad arguments (see --help)\n");
        goto out;
    }
    sp_log_init("space-credstore", level, format);
    sp_daemon_signals();
    const char *home = getenv("SPACE_HOME");
    if (cfg.master_key_file[0]) {
        key_path = sp_xstrdup(cfg.master_key_file);
    } else if (home && home[0]) {
        key_path = sp_xasprintf("%s/credstore/master.key", home);
    } else {
        sp_log(SP_LOG_ERROR, "no master key: give --master-key-file or set SPACE_HOME");
        goto out;
    }
    if ((rc = sp_cred_key_load(key_path, &cs.key)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot use the master key file", SP_KS("path", key_path),
               SP_KS("why", key_error(rc)));
        goto out;
    }
    /* A rotation that did not finish (credstore stopped meanwhile): the next key seals, the
     * key file's key is the previous one, and the start re-wraps the rest. */
    next_path = sp_xasprintf("%s.next", key_path);
    if (access(next_path, F_OK) == 0) {
        if (cfg.previous_master_key_file[0]) {
            sp_log(SP_LOG_ERROR, "refusing to start",
                   SP_KS("why", "a rotation is not finished (the next key file exists) and "
                                "--previous-master-key-file is given: give one or the other"),
                   SP_KS("path", next_path));
            goto out;
        }
        previous = cs.key;
        have_previous = true;
        if ((rc = sp_cred_key_load(next_path, &cs.key)) < 0) {
            sp_log(SP_LOG_ERROR, "cannot use the next master key file", SP_KS("path", next_path),
                   SP_KS("why", key_error(rc)));
            goto out;
        }
        sp_log(SP_LOG_INFO, "finishing a rotation of the master key", SP_KS("from", previous.id),
               SP_KS("key_id", cs.key.id));
    } else if (cfg.previous_master_key_file[0]) {
        if ((rc = sp_cred_key_load(cfg.previous_master_key_file, &previous)) < 0) {
            sp_log(SP_LOG_ERROR, "cannot use the previous master key file",
                   SP_KS("path", cfg.previous_master_key_file), SP_KS("why", key_error(rc)));
            goto out;
        }
        have_previous = true;
    }
    sp_bus_opts_t bo = {
        .url = cfg.nats_url, .name = "space-credstore", .timeout_ms = 30000, .send_asap = true};
    char iderr[SP_BUSID_ERR_MAX];
    if (sp_busid_setup(cfg.creds_dir, cfg.identity, "credstore", &busid, &bo, iderr) < 0) {
        sp_log(SP_LOG_ERROR, "bad identity", SP_KS("error", iderr));
        goto out;
    }
    char verr[SP_VERIFIER_ERR_MAX];
    if (sp_verifier_new(cfg.verify_signatures, cfg.keyring_dir, cfg.creds_dir, 0, &cs.verifier,
                        verr) < 0) {
        sp_log(SP_LOG_ERROR, "cannot check signatures", SP_KS("error", verr));
        goto out;
    }
    sp_log(sp_verifier_mode(cs.verifier) == SP_VERIFY_ON ? SP_LOG_INFO : SP_LOG_WARN,
           sp_verifier_summary(cs.verifier), SP_KS("keyring_dir", sp_verifier_dir(cs.verifier)));
    sp_request_guard_new(cs.verifier, &cs.guard);
    if ((rc = sp_bus_connect(&bo, &cs.bus)) < 0 || (rc = sp_bus_ensure_stream(cs.bus)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot reach NATS", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    if ((rc = sp_db_connect(cfg.pg_url, "space-credstore", 30000, &cs.db)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot reach PostgreSQL", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    if ((rc = sp_db_migrate(cs.db)) < 0) {
        sp_log(SP_LOG_ERROR, "schema migration failed", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    const char *why = NULL;
    if ((rc = cs_store_open(&cs, have_previous ? &previous : NULL, &why)) < 0) {
        sp_log(SP_LOG_ERROR, "refusing to start", SP_KS("why", why ? why : sp_strerror(rc)),
               SP_KS("key_id", cs.key.id), SP_KS("path", key_path));
        goto out;
    }
    if (have_previous && access(next_path, F_OK) == 0) {
        rc = rename(next_path, key_path) < 0 ? -errno : fsync_dir_of(key_path);
        if (rc < 0) {
            sp_log(SP_LOG_ERROR, "refusing to start",
                   SP_KS("why", "the next key file could not replace the key file"),
                   SP_KS("error", sp_strerror(rc)), SP_KS("path", key_path));
            goto out;
        }
    }
    char merr[SP_METRICS_ERR_MAX] = "bad metric families";
    if (cs_metrics_init(&cs, reg) < 0 || sp_metrics_serve(reg, "space-credstore", cfg.metrics_addr,
                                                          cfg.metrics_port_file, &msrv, merr) < 0) {
        sp_log(SP_LOG_ERROR, "cannot serve metrics", SP_KS("error", merr));
        goto out;
    }
    if ((rc = cs_admin_start(&cs)) < 0 || (rc = cs_lookup_start(&cs)) < 0 ||
        (rc = cs_datakey_start(&cs)) < 0) {
        sp_log(SP_LOG_ERROR, "cannot subscribe", SP_KS("error", sp_strerror(rc)));
        goto out;
    }
    sp_log(SP_LOG_INFO, "serving", SP_KU("credentials", cs.n_creds), SP_KS("key_id", cs.key.id),
           SP_KS("admin", SP_CRED_SUBJECT_ADMIN), SP_KS("lookup", SP_CRED_SUBJECT_LOOKUP));
    unsigned failures = 0;
    while (!sp_daemon_stopping) {
        sp_daemon_sleep_ms(500);
        (void)rotate_live(&cs, key_path, next_path, &failures);
    }
    code = 0;
out:
    sp_metrics_server_free(msrv); /* its scrapes take mu */
    sp_metrics_free(reg);
    sp_bus_unsubscribe(cs.admin_sub);
    sp_bus_unsubscribe(cs.lookup_sub);
    sp_bus_unsubscribe(cs.datakey_sub);
    pthread_mutex_lock(&cs.mu);
    cs_store_close(&cs);
    pthread_mutex_unlock(&cs.mu);
    PQfinish(cs.db);
    sp_bus_free(cs.bus);
    sp_request_guard_free(cs.guard);
    sp_verifier_free(cs.verifier);
    sp_busid_dispose(&busid);
    sp_cred_key_wipe(&cs.key);
    if (have_previous)
        sp_cred_key_wipe(&previous);
    if (cs.have_previous)
        sp_cred_key_wipe(&cs.previous);
    pthread_mutex_destroy(&cs.mu);
    sp_config_dispose(options, N_OPTIONS, &cfg);
    free(key_path);
    free(next_path);
    free(err);
    return code;
}
