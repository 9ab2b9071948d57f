/* The agent's way back (worker.h, wk_box_listen). A sandbox's first agent channel is the pair
 * of pipes runsc create gave its init. When that channel is gone while the sandbox lives (this
 * worker restarted and adopted the sandbox, or closed the channel on a protocol violation),
 * the agent connects every 250 ms to a Unix socket in the sandbox's bundle directory, which
 * runsc mounts read-only at /.space/chan (runsc --host-uds=open lets the sandbox connect to
 * it). Here one thread per such sandbox listens on that socket, takes the first connection
 * that opens with a valid Hello as the new channel, follows the commands the Hello lists as
 * still running, and records AgentChannelRestored.
 *
 * The socket is reachable from inside the sandbox only, and nothing that comes through it is
 * trusted more than the pipes were: a guest process that connects first and says nothing is
 * dropped after HELLO_TIMEOUT_MS; one that speaks the protocol is only ever the agent of its
 * own sandbox.
 *
 * While it listens the thread also checks, every LIVENESS_MS, that the sandbox still runs: a
 * sandbox whose init ended (killed from inside, or crashed) is failed ("exited") and
 * released, so it does not stay "running" in the log. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "worker.h"
#include "xmalloc.h"

#define POLL_MS          200
#define HELLO_TIMEOUT_MS 2000
#define LIVENESS_MS      2000

static int listen_on(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(a.sun_path))
        return -ENAMETOOLONG;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    (void)unlink(path); /* a previous worker's */
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || chmod(path, 0600) < 0 ||
        listen(fd, 8) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

static bool box_gone(wk_box_t *b)
{
    pthread_mutex_lock(&b->mu);
    bool gone = b->gone;
    pthread_mutex_unlock(&b->mu);
    return gone || sp_daemon_stopping;
}

/* The sandbox's init ended: failed ("exited") and released, like a sandbox lost at start. */
static void fail_exited(wk_box_t *b, const char *why)
{
    wk_t *w = b->w;
    char detail[WK_ERR_MAX + 96], err[WK_ERR_MAX] = "";
    /* gVisor has no OOM killer of its own: over memory_mb the host's memory cgroup kills the
     * Sentry, and with it every process and the whole sandbox (docs/faults.md, "Limits").
     * The cgroup's count says so, and the failure is "oom" rather than "exited". */
    int ooms = wk_sandbox_oom_kills(w->host, b->id);
    if (ooms > 0)
        snprintf(detail, sizeof(detail),
                 "out of memory: the sandbox used its whole memory_mb (%u MiB) and the host "
                 "ended it, with every process in it",
                 b->memory_mb);
    else
        snprintf(detail, sizeof(detail), "the sandbox's init (space-agent) ended: %s", why);
    sp_log(SP_LOG_WARN, ooms > 0 ? "sandbox out of memory" : "sandbox exited",
           SP_KS("sandbox", b->id), SP_KS("why", why), SP_KI("oom_kills", ooms));
    wk_box_t *owned = wk_owned_remove(w, b->id);
    if (owned) {
        const char *msg = ooms > 0 ? "the sandbox ran out of memory" : "the sandbox exited";
        wk_box_fail_commands(owned, msg);
        wk_box_fail_files(owned, msg);
        wk_box_put(owned);
    }
    if (wk_sandbox_destroy(w->host, b->id, err) < 0)
        sp_log(SP_LOG_ERROR, "cannot release an exited sandbox", SP_KS("sandbox", b->id),
               SP_KS("error", err));
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__SandboxFailed failed = SPACE__V1__SANDBOX_FAILED__INIT;
    failed.reason = ooms > 0 ? "oom" : "exited";
    failed.detail = detail;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_FAILED;
    env.sandbox_failed = &failed;
    wk_publish_box_event(b, &env, NULL);
}

static void *listen_main(void *arg)
{
    wk_box_t *b = arg;
    wk_t *w = b->w;
    pthread_mutex_lock(&b->mu);
    char *path = wk_sandbox_chan_socket(w->host, b->host_id[0] ? b->host_id : b->id);
    pthread_mutex_unlock(&b->mu);
    int lfd = -1;

    /* The broken channel's reader has returned from on_lost (or there was none). */
    pthread_mutex_lock(&b->mu);
    wk_agent_t *old = b->agent;
    b->agent = NULL;
    pthread_mutex_unlock(&b->mu);
    wk_agent_close(old);

    /* A sandbox being restored gets its bundle directory while this thread already runs. */
    for (int i = 0; path && i < 1500 && !box_gone(b); i++) {
        if ((lfd = listen_on(path)) != -ENOENT)
            break;
        usleep(20 * 1000);
    }
    if (!path || lfd < 0) {
        sp_log(SP_LOG_ERROR, "cannot listen for the agent", SP_KS("sandbox", b->id),
               SP_KS("error", sp_strerror(lfd < 0 ? lfd : -ENOENT)));
        goto out;
    }
    int64_t next_check = sp_mono_ns() + 100 * 1000000LL; /* an init that ended: soon */
    bool graced = false;
    while (!box_gone(b)) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, POLL_MS) <= 0) {
            pthread_mutex_lock(&b->mu);
            bool over = !graced &&
                        sp_mono_ns() - b->lost_at_ns > b->w->cfg->agent_lost_grace_ms * 1000000LL;
            char why[WK_ERR_MAX + 32];
            snprintf(why, sizeof(why), "agent channel lost: %s", b->lost_why);
            pthread_mutex_unlock(&b->mu);
            if (over) {
                graced = true;
                wk_box_fail_commands(b, why);
            }
            if (sp_mono_ns() < next_check)
                continue;
            next_check = sp_mono_ns() + LIVENESS_MS * 1000000LL;
            pthread_mutex_lock(&b->mu);
            bool restoring = b->restoring;
            pthread_mutex_unlock(&b->mu);
            if (!restoring && wk_sandbox_running(w->host, b->id) == 0 && !box_gone(b)) {
                fail_exited(b, b->lost_why[0] ? b->lost_why : "the sandbox is not running");
                break;
            }
            continue;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        int to = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (to < 0) {
            close(fd);
            continue;
        }
        wk_agent_t *a = NULL;
        int rc = wk_box_open_agent(b, to, fd, HELLO_TIMEOUT_MS, &a);
        if (rc < 0) {
            sp_log(SP_LOG_WARN, "a connection on the agent socket did not say Hello",
                   SP_KS("sandbox", b->id), SP_KS("error", sp_strerror(rc)));
            continue;
        }
        size_t n = wk_box_adopt_channel(b, a);
        sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
        Space__V1__AgentChannelRestored rs = SPACE__V1__AGENT_CHANNEL_RESTORED__INIT;
        rs.running_commands = (uint32_t)n;
        rs.agent_version = "";
        env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_AGENT_CHANNEL_RESTORED;
        env.agent_channel_restored = &rs;
        wk_publish_box_event(b, &env, NULL);
        sp_log(SP_LOG_INFO, "agent channel restored", SP_KS("sandbox", b->id),
               SP_KU("running_commands", n));
        break;
    }
out:
    if (lfd >= 0)
        close(lfd);
    if (path)
        (void)unlink(path);
    free(path);
    pthread_mutex_lock(&b->mu);
    b->listening = false;
    pthread_mutex_unlock(&b->mu);
    wk_t *owner = b->w;
    wk_box_put(b);
    atomic_fetch_sub(&owner->listeners, 1);
    return NULL;
}

void wk_box_listen(wk_box_t *b)
{
    pthread_mutex_lock(&b->mu);
    bool start = !b->listening && !b->gone;
    if (start)
        b->listening = true;
    pthread_mutex_unlock(&b->mu);
    if (!start)
        return;
    wk_box_t *ref = wk_owned_get(b->w, b->id); /* the thread's own reference */
    pthread_t t;
    atomic_fetch_add(&b->w->listeners, 1);
    if (!ref || pthread_create(&t, NULL, listen_main, ref) != 0) {
        atomic_fetch_sub(&b->w->listeners, 1);
        pthread_mutex_lock(&b->mu);
        b->listening = false;
        pthread_mutex_unlock(&b->mu);
        wk_box_put(ref);
        return;
    }
    pthread_detach(t);
}
