/* space-bench lifecycle: pause, resume, suspend and resume from suspend of one sandbox
 * through the HTTP API (each answered once the projection shows the outcome), round after
 * round, with the snapshot sizes, the resume's wait from its placement to its restore, and the
 * delete of a new sandbox; and beside them, in the same run, the raw runsc pause /
 * resume / checkpoint / restore / delete of a bare container over the same template rootfs (no
 * network, no agent, no disk delta, no store, no events): what the platform adds.
 *
 * With the NATS object store as the snapshot store (SPACE_SNAPSHOT_STORE=nats, bench/run.sh
 * lifecycle-nats), each round also suspends once more and empties the worker's cache before
 * the resume (the artifacts come from the bucket), and then moves the sandbox to another
 * worker: a second space-worker started here with its own state directory, btrfs volume and
 * cache; the sandbox is suspended, the worker it ran on is stopped (a host gone), the resume
 * lands on the other worker and is timed, the stopped one is started again. */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "xmalloc.h"

static double api_op(bench_ctx_t *c, const char *id, const char *op, const char *want)
{
    char path[160];
    sp_httpc_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/%s", id, op);
    int64_t t0 = sp_mono_ns();
    int rc = bench_http(c, "POST", path, NULL, NULL, &r);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    char needle[64];
    snprintf(needle, sizeof(needle), "\"state\":\"%s\"", want);
    if (rc < 0 || r.status != 200 || !strstr(r.body, needle)) {
        fprintf(stderr, "space-bench: %s failed: %s %d %s\n", op, sp_strerror(rc), r.status,
                r.body ? r.body : "");
        exit(1);
    }
    sp_httpc_resp_free(&r);
    return ms;
}

/* Bytes of the sandbox's newest snapshot artifacts, from its SandboxSuspended (whatever
 * store or worker cache holds them). */
static void snapshot_sizes(bench_ctx_t *c, const char *id, double *image, double *rootfs)
{
    sp_envelope_t *ev = NULL;
    *image = *rootfs = 0;
    if (sp_db_last_sandbox_event(c->db, id, "SandboxSuspended", &ev) == 0 &&
        ev->payload_case == SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SUSPENDED) {
        for (size_t i = 0; i < ev->sandbox_suspended->n_artifacts; i++) {
            const Space__V1__SnapshotArtifact *a = ev->sandbox_suspended->artifacts[i];
            if (strcmp(a->name, "checkpoint.img.zst") == 0)
                *image = (double)a->size;
            else if (strcmp(a->name, "rootfs.btrfs.zst") == 0)
                *rootfs = (double)a->size;
        }
    }
    sp_envelope_free(ev);
}

/* ---- a second worker, for resumes on another host ---- */

#define W2_ID "bench-w2"

static pid_t w2_start(bench_ctx_t *c)
{
    /* Its own identity on the bus (docs/trust.md): credentials, nats.conf reloaded, durable. */
    char *space = sp_xasprintf("%s/space", getenv("SPACE_BIN_DIR"));
    char *add[] = {space, "identity", "add", "worker", W2_ID, NULL};
    bench_run_quiet(add);
    free(space);
    char *bin = sp_xasprintf("%s/space-worker", getenv("SPACE_BIN_DIR"));
    char *state = sp_xasprintf("%s/worker2", c->home);
    char *log = sp_xasprintf("%s/log/space-worker-2.log", c->home);
    char *argv[] = {bin,    "--id",           W2_ID, "--state-dir", state, "--snapshot-store",
                    "nats", "--heartbeat-ms", "500", NULL};
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(bin, argv);
        _exit(127);
    }
    free(log);
    free(state);
    free(bin);
    return pid;
}

/* Whether worker id is live as the scheduler sees it (3 heartbeat intervals). */
static bool live(bench_ctx_t *c, const char *id)
{
    const char *p[1] = {id};
    PGresult *r = PQexecParams(c->db,
                               "SELECT count(*) FROM workers WHERE id = $1 AND state = 'up' AND "
                               "templates ? 'tiny' AND last_heartbeat_at > now() - interval_ms "
                               "* 3 * interval '1 millisecond'",
                               1, NULL, p, NULL, NULL, 0);
    bool yes = PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "1") == 0;
    PQclear(r);
    return yes;
}

static void wait_live(bench_ctx_t *c, const char *id, bool want)
{
    for (int i = 0; i < 600 && live(c, id) != want; i++)
        usleep(50 * 1000);
    if (live(c, id) != want) {
        fprintf(stderr, "space-bench: worker %s did not become %s\n", id, want ? "live" : "dead");
        exit(1);
    }
}

/* The worker sandbox id runs on. */
static void worker_of(bench_ctx_t *c, const char *id, char out[80])
{
    const char *p[1] = {id};
    PGresult *r = PQexecParams(c->db, "SELECT coalesce(worker, '') FROM sandboxes WHERE id = $1", 1,
                               NULL, p, NULL, NULL, 0);
    snprintf(out, 80, "%s",
             PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
}

/* The stack's worker (space up made it; its pid is in run/). */
static void w1_stop(bench_ctx_t *c)
{
    char *pidfile = sp_xasprintf("%s/run/space-worker.pid", c->home);
    FILE *f = fopen(pidfile, "r");
    int pid = 0;
    if (f && fscanf(f, "%d", &pid) == 1 && pid > 0) /* NOLINT(cert-err34-c): our own file */
        kill(pid, SIGTERM);
    if (f)
        fclose(f);
    for (int i = 0; pid > 0 && i < 600 && kill(pid, 0) == 0; i++)
        usleep(20 * 1000);
    free(pidfile);
}

/* A stamp (column occurred_at or stored_at, in us since the epoch, on this host's clock) of
 * the sandbox's newest accepted event of that type in the log; the bench ends without one. */
static int64_t last_event_us(bench_ctx_t *c, const char *id, const char *type, bool stored)
{
    const char *p[2] = {id, type};
    PGresult *r = PQexecParams(
        c->db,
        stored ? "SELECT (extract(epoch FROM stored_at) * 1000000)::int8 FROM events WHERE "
                 "aggregate_kind = 'sandbox' AND aggregate_id = $1 AND type = $2 AND status = "
                 "'accepted' ORDER BY stream_seq DESC LIMIT 1"
               : "SELECT (extract(epoch FROM occurred_at) * 1000000)::int8 FROM events WHERE "
                 "aggregate_kind = 'sandbox' AND aggregate_id = $1 AND type = $2 AND status = "
                 "'accepted' ORDER BY stream_seq DESC LIMIT 1",
        2, NULL, p, NULL, NULL, 0);
    if (sp_db_check(r, PGRES_TUPLES_OK) < 0 || PQntuples(r) != 1) {
        fprintf(stderr, "space-bench: no %s of %s in the log\n", type, id);
        exit(1);
    }
    int64_t us = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return us;
}

/* The time from the sandbox's newest placement to its worker's SandboxResuming: a resume's
 * wait before its restore begins. */
static double placed_to_resuming(bench_ctx_t *c, const char *id)
{
    return (double)(last_event_us(c, id, "SandboxResuming", false) -
                    last_event_us(c, id, "SandboxPlaced", false)) /
           1000;
}

/* Where the newest suspend of a sandbox went, from the log's stamps and the wall clock of the
 * HTTP call around it (t0_us, t1_us): the request to the worker's SandboxSuspending (gateway,
 * bus, the worker taking it), SandboxSuspending to SandboxSuspended (the worker's checkpoint,
 * disk and store), SandboxSuspended published to stored (the event log), stored to the answer
 * (the gateway seeing it). */
static void suspend_phases(bench_ctx_t *c, const char *id, int64_t t0_us, int64_t t1_us,
                           double out[4])
{
    int64_t suspending = last_event_us(c, id, "SandboxSuspending", false);
    int64_t suspended = last_event_us(c, id, "SandboxSuspended", false);
    int64_t stored = last_event_us(c, id, "SandboxSuspended", true);
    out[0] = (double)(suspending - t0_us) / 1000;
    out[1] = (double)(suspended - suspending) / 1000;
    out[2] = (double)(stored - suspended) / 1000;
    out[3] = (double)(t1_us - stored) / 1000;
}

/* A new sandbox (a warm pool's, when ready: the refill of the one before may still run), then
 * its DELETE, timed: answered once the log has it deleted. */
static double create_delete(bench_ctx_t *c)
{
    char id[80], path[160];
    sp_httpc_resp_t r;
    if (bench_create_sandbox(c, id) < 0) {
        fprintf(stderr, "space-bench: create failed\n");
        exit(1);
    }
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    int64_t t0 = sp_mono_ns();
    int rc = bench_http(c, "DELETE", path, NULL, NULL, &r);
    double ms = (double)(sp_mono_ns() - t0) / 1e6;
    if (rc < 0 || r.status >= 300) {
        fprintf(stderr, "space-bench: delete failed: %s %d %s\n", sp_strerror(rc), r.status,
                r.body ? r.body : "");
        exit(1);
    }
    sp_httpc_resp_free(&r);
    return ms;
}

/* Processes the bare container runs before its second checkpoint of a round. */
#define EXECS_PER_ROUND 20

static double timed(char *const argv[], const char *what)
{
    int64_t t0 = sp_mono_ns();
    int rc = bench_run_quiet(argv);
    if (rc != 0) {
        fprintf(stderr, "space-bench: %s failed (%d)\n", what, rc);
        exit(1);
    }
    return (double)(sp_mono_ns() - t0) / 1e6;
}

int bench_lifecycle(bench_ctx_t *c)
{
    size_t n = c->rounds;
    enum { V_N = 20 };
    double *v[V_N];
    const char *store = getenv("SPACE_SNAPSHOT_STORE");
    bool remote = store && strcmp(store, "nats") == 0;
    for (int i = 0; i < V_N; i++)
        v[i] = sp_xcalloc(n, sizeof(double));
    pid_t w2 = remote ? w2_start(c) : 0;
    char w1_id[80] = "";
    if (remote) {
        const char *sid = getenv("SPACE_ID");
        snprintf(w1_id, sizeof(w1_id), "%s", sid && sid[0] ? sid : "worker-1");
        wait_live(c, W2_ID, true);
    }
    char id[80];
    if (bench_create_sandbox(c, id) < 0) {
        fprintf(stderr, "space-bench: create failed\n");
        return 1;
    }
    /* Something alive inside, as in real use: a process that writes now and then. With shell
     * builtins only (a fifo nobody writes is the clock): with runsc 2022-12 every process a
     * sandbox has ever run adds ~3 ms to each later checkpoint (the row "after EXECS_PER_ROUND
     * runsc exec" below; docs/machine-notes.md), so a `date; sleep 1` loop made the suspend of
     * round 20 ~3.5x that of round 1, while the bare container it is compared with ran
     * nothing. */
    char path[200];
    sp_httpc_resp_t r;
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/commands", id);
    if (bench_http(c, "POST", path, NULL,
                   "{\"cmd\":\"mkfifo /tmp/.tick; exec 3<>/tmp/.tick; n=0; while true; do "
                   "n=$((n+1)); echo $n > /tmp/now; read -t 1 x <&3; done\","
                   "\"background\":true}",
                   &r) == 0)
        sp_httpc_resp_free(&r);

    char *rootfs = sp_xasprintf("%s/worker/volumes/templates/tiny", c->home);
    char *bundle =
        bench_make_bundle(rootfs, "[\"/bin/sh\",\"-c\",\"while true; do sleep 1; done\"]");
    char *root = sp_xasprintf("%s/runsc", bundle);
    char *img = sp_xasprintf("%s/img", bundle);

    printf("lifecycle: %zu rounds of pause, resume, suspend, resume through HTTP; beside each, "
           "raw runsc pause/resume/checkpoint/restore of a bare container\n",
           n);
    for (size_t i = 0; i < n; i++) {
        v[0][i] = api_op(c, id, "pause", "paused");
        v[1][i] = api_op(c, id, "resume", "running");
        int64_t t0_us = sp_now_us();
        v[2][i] = api_op(c, id, "suspend", "suspended");
        double ph[4];
        suspend_phases(c, id, t0_us, sp_now_us(), ph);
        for (int k = 0; k < 4; k++)
            v[16 + k][i] = ph[k];
        snapshot_sizes(c, id, &v[8][i], &v[9][i]);
        v[3][i] = api_op(c, id, "resume", "running");
        v[12][i] = placed_to_resuming(c, id);
        if (remote) {
            (void)api_op(c, id, "suspend", "suspended");
            char *cache = sp_xasprintf("%s/snapshots/%s", c->home, id);
            char *evict[] = {"rm", "-rf", cache, NULL};
            bench_run_quiet(evict);
            free(cache);
            v[10][i] = api_op(c, id, "resume", "running");
            /* To the other worker: suspended here, this host gone, resumed there. */
            char from[80];
            worker_of(c, id, from);
            bool from_w2 = strcmp(from, W2_ID) == 0;
            (void)api_op(c, id, "suspend", "suspended");
            if (from_w2) {
                kill(w2, SIGTERM);
                waitpid(w2, NULL, 0);
            } else {
                w1_stop(c);
            }
            wait_live(c, from, false);
            v[11][i] = api_op(c, id, "resume", "running");
            char to[80];
            worker_of(c, id, to);
            if (strcmp(to, from) == 0) {
                fprintf(stderr, "space-bench: the resume stayed on %s\n", from);
                exit(1);
            }
            if (from_w2) {
                w2 = w2_start(c);
            } else {
                char *bin = sp_xasprintf("%s/space", getenv("SPACE_BIN_DIR"));
                char *up[] = {bin, "up", NULL};
                bench_run_quiet(up);
                free(bin);
            }
            wait_live(c, from, true);
        }

        char cid[64];
        snprintf(cid, sizeof(cid), "bench-lc-%06zu", i);
        /* A root per round: a restored sandbox's control socket outlives `delete` briefly
         * and the next `run` in the same root would collide with it. */
        free(root);
        root = sp_xasprintf("%s/runsc-%06zu", bundle, i);
        char *run[] = {"runsc", "--root", root, "--network=none", "run", "--detach", "--bundle",
                       bundle,  cid,      NULL};
        char *pause[] = {"runsc", "--root", root, "pause", cid, NULL};
        char *resume[] = {"runsc", "--root", root, "resume", cid, NULL};
        char *ipath = sp_xasprintf("--image-path=%s", img);
        char *ckpt[] = {"runsc", "--root", root, "checkpoint", ipath, cid, NULL};
        char *del[] = {"runsc", "--root", root, "delete", "--force", cid, NULL};
        char *restore[] = {"runsc",   "--root",   root,  "--network=none",
                           "restore", "--detach", ipath, "--bundle",
                           bundle,    cid,        NULL};
        timed(run, "runsc run");
        v[4][i] = timed(pause, "runsc pause");
        v[5][i] = timed(resume, "runsc resume");
        v[6][i] = timed(ckpt, "runsc checkpoint");
        bench_run_quiet(del);
        v[7][i] = timed(restore, "runsc restore");
        v[14][i] = timed(del, "runsc delete");
        char *rm[] = {"rm", "-rf", img, NULL}; /* checkpoint writes into an empty directory */
        bench_run_quiet(rm);
        /* The same bare container once it has run EXECS_PER_ROUND processes: what each process
         * a sandbox ever ran adds to its checkpoints. */
        char cid2[72];
        snprintf(cid2, sizeof(cid2), "%s-x", cid);
        char *run2[] = {"runsc", "--root", root, "--network=none", "run", "--detach", "--bundle",
                        bundle,  cid2,     NULL};
        char *exec2[] = {"runsc", "--root", root, "exec", cid2, "/bin/true", NULL};
        char *ckpt2[] = {"runsc", "--root", root, "checkpoint", ipath, cid2, NULL};
        char *del2[] = {"runsc", "--root", root, "delete", "--force", cid2, NULL};
        timed(run2, "runsc run");
        for (int e = 0; e < EXECS_PER_ROUND; e++)
            timed(exec2, "runsc exec");
        v[15][i] = timed(ckpt2, "runsc checkpoint");
        bench_run_quiet(del2);
        bench_run_quiet(rm);
        free(ipath);
    }
    /* Apart from the rounds: each create takes a warm pool's sandbox, and the pool's refill
     * (a runsc run) would weigh on the next round's steps and baselines. */
    for (size_t i = 0; i < n; i++)
        v[13][i] = create_delete(c);
    printf("\n  %-48s %9s %9s %9s\n", "", "p50 ms", "p90 ms", "p99 ms");
    bench_row("pause (HTTP, until paused in the log)", v[0], n);
    bench_row("resume from paused (HTTP)", v[1], n);
    bench_row("suspend (HTTP: checkpoint + disk delta + store)", v[2], n);
    bench_row("  of which the request to SandboxSuspending", v[16], n);
    bench_row("  of which SandboxSuspending to Suspended (worker)", v[17], n);
    bench_row("  of which SandboxSuspended to stored (log)", v[18], n);
    bench_row("  of which stored to the answer (gateway)", v[19], n);
    bench_row(remote ? "resume from suspended, cached (HTTP)"
                     : "resume from suspended, same host (HTTP)",
              v[3], n);
    if (remote) {
        bench_row("resume from suspended, fetched from the bucket (HTTP)", v[10], n);
        bench_row("resume from suspended on another worker (HTTP)", v[11], n);
    }
    bench_row("  of which placed to resuming (log)", v[12], n);
    bench_row("delete (HTTP, until deleted in the log)", v[13], n);
    bench_row("runsc pause (baseline)", v[4], n);
    bench_row("runsc resume (baseline)", v[5], n);
    bench_row("runsc checkpoint (baseline)", v[6], n);
    char row[80];
    snprintf(row, sizeof(row), "runsc checkpoint after %d runsc exec (baseline)", EXECS_PER_ROUND);
    bench_row(row, v[15], n);
    bench_row("runsc restore --detach (baseline)", v[7], n);
    bench_row("runsc delete --force, running (baseline)", v[14], n);
    double img50 = bench_pct(v[8], n, 50), root50 = bench_pct(v[9], n, 50);
    printf("\n  snapshot p50: checkpoint.img.zst %.0f KiB, rootfs.btrfs.zst %.0f KiB\n",
           img50 / 1024, root50 / 1024);
    double per_exec = (bench_pct(v[15], n, 50) - bench_pct(v[6], n, 50)) / EXECS_PER_ROUND;
    printf("  each process a sandbox has run adds %.2f ms to its checkpoints (p50s)\n", per_exec);
    printf("\nJSON "
           "{\"bench\":\"lifecycle\",\"store\":\"%s\",\"n\":%zu,\"pause_ms_p50\":%.1f,\"resume_ms_"
           "p50\":%.1f,"
           "\"suspend_ms_p50\":%.1f,\"suspend_ms_p90\":%.1f,\"resume_suspended_ms_p50\":%.1f,"
           "\"resume_suspended_ms_p90\":%.1f,\"runsc_checkpoint_ms_p50\":%.1f,"
           "\"runsc_restore_ms_p50\":%.1f,\"image_kib_p50\":%.0f,\"rootfs_kib_p50\":%.0f,"
           "\"resume_fetched_ms_p50\":%.1f,\"resume_fetched_ms_p90\":%.1f,"
           "\"resume_other_worker_ms_p50\":%.1f,\"resume_other_worker_ms_p90\":%.1f,"
           "\"placed_to_resuming_ms_p50\":%.1f,\"delete_ms_p50\":%.1f,\"delete_ms_p90\":%.1f,"
           "\"runsc_delete_ms_p50\":%.1f,\"runsc_checkpoint_after_execs_ms_p50\":%.1f,"
           "\"checkpoint_ms_per_process\":%.2f}\n",
           remote ? "nats" : "dir", n, bench_pct(v[0], n, 50), bench_pct(v[1], n, 50),
           bench_pct(v[2], n, 50), bench_pct(v[2], n, 90), bench_pct(v[3], n, 50),
           bench_pct(v[3], n, 90), bench_pct(v[6], n, 50), bench_pct(v[7], n, 50), img50 / 1024,
           root50 / 1024, remote ? bench_pct(v[10], n, 50) : 0.0,
           remote ? bench_pct(v[10], n, 90) : 0.0, remote ? bench_pct(v[11], n, 50) : 0.0,
           remote ? bench_pct(v[11], n, 90) : 0.0, bench_pct(v[12], n, 50), bench_pct(v[13], n, 50),
           bench_pct(v[13], n, 90), bench_pct(v[14], n, 50), bench_pct(v[15], n, 50), per_exec);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    if (bench_http(c, "DELETE", path, NULL, NULL, &r) == 0)
        sp_httpc_resp_free(&r);
    char *rm[] = {"rm", "-rf", bundle, NULL};
    bench_run_quiet(rm);
    if (w2 > 0) {
        /* The second worker releases what it holds (its volume) before the stack goes. */
        kill(w2, SIGTERM);
        waitpid(w2, NULL, 0);
        char *bin = sp_xasprintf("%s/space-worker", getenv("SPACE_BIN_DIR"));
        char *state = sp_xasprintf("%s/worker2", c->home);
        char *down[] = {bin, "--id", W2_ID, "--state-dir", state, "--teardown", NULL};
        bench_run_quiet(down);
        free(state);
        free(bin);
    }
    for (int i = 0; i < V_N; i++)
        free(v[i]);
    free(img);
    free(root);
    free(bundle);
    free(rootfs);
    return 0;
}
