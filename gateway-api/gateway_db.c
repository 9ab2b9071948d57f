/* PostgreSQL for the gateway: a pool of connections used by jobs on libuv's thread pool, and a
 * dedicated connection that LISTENs for the event log's head (SP_EVENTLOG_CHANNEL).
 *
 * The pool is owned by the loop: a job gets a connection before it is handed to
 * uv_queue_work, and gives it back in the after-work callback, so a connection is used by one
 * thread at a time and no thread-pool thread ever waits for one (jobs that find every
 * connection busy wait in a FIFO on the loop, bounded by queue-max). */
#include "gateway.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "apikey.h"
#include "db.h"
#include "error.h"
#include "ids.h"
#include "log.h"
#include "xmalloc.h"

#define STATEMENT_TIMEOUT_SQL "SET statement_timeout = 15000"
#define LISTEN_CONNECT_MS     2000
#define LISTEN_BACKOFF_MAX_MS 2000

static int session_setup(PGconn *db)
{
    return sp_db_exec(db, STATEMENT_TIMEOUT_SQL);
}

int gw_pool_open(gw_pool_t *p, const char *url, size_t n, size_t queue_max, int timeout_ms)
{
    int rc;

    memset(p, 0, sizeof(*p));
    p->url = sp_xstrdup(url);
    p->conns = sp_xcalloc(n, sizeof(PGconn *));
    p->free_list = sp_xcalloc(n, sizeof(*p->free_list));
    p->queue_max = queue_max;
    for (size_t i = 0; i < n; i++) {
        if ((rc = sp_db_connect(url, GW_DAEMON, timeout_ms, &p->conns[i])) < 0) {
            sp_log(SP_LOG_ERROR, "cannot connect to PostgreSQL", SP_KS("error", sp_strerror(rc)));
            return rc;
        }
        p->n++;
        if (i == 0 && (rc = sp_db_migrate(p->conns[0])) < 0) {
            sp_log(SP_LOG_ERROR, "schema migration failed",
                   SP_KS("error", PQerrorMessage(p->conns[0])));
            return rc;
        }
        if ((rc = session_setup(p->conns[i])) < 0) {
            sp_log(SP_LOG_ERROR, "cannot set up a session", SP_KS("error", sp_strerror(rc)));
            return rc;
        }
        p->free_list[p->n_free++] = i;
    }
    return 0;
}

void gw_pool_close(gw_pool_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        PQfinish(p->conns[i]);
    free(p->conns);
    free(p->free_list);
    free(p->url);
    memset(p, 0, sizeof(*p));
}

static void work_cb(uv_work_t *w)
{
    gw_job_t *job = (gw_job_t *)w;

    /* A connection the server dropped (restart, idle kill) is reset before use; the job then
     * fails on its own if PostgreSQL is still away, and says so to its client. */
    if (PQstatus(job->db) != CONNECTION_OK) {
        PQreset(job->db);
        if (PQstatus(job->db) == CONNECTION_OK)
            session_setup(job->db);
    }
    job->run(job, job->db);
    if (PQstatus(job->db) == CONNECTION_OK && PQtransactionStatus(job->db) != PQTRANS_IDLE)
        sp_db_exec(job->db, "ROLLBACK");
}

static void start_job(gw_t *gw, gw_job_t *job);

static void after_work_cb(uv_work_t *w, int status)
{
    gw_job_t *job = (gw_job_t *)w;
    gw_t *gw = job->gw;
    gw_pool_t *p = &gw->pool;

    (void)status; /* jobs are never cancelled */
    p->free_list[p->n_free++] = job->conn_index;
    p->running--;
    job->db = NULL;
    while (p->n_free > 0 && p->head) {
        gw_job_t *next = p->head;
        p->head = next->next;
        if (!p->head)
            p->tail = NULL;
        p->queued--;
        start_job(gw, next);
    }
    job->done(job);
}

static void start_job(gw_t *gw, gw_job_t *job)
{
    gw_pool_t *p = &gw->pool;
    job->conn_index = p->free_list[--p->n_free];
    job->db = p->conns[job->conn_index];
    job->next = NULL;
    p->running++;
    uv_queue_work(gw->loop, &job->work, work_cb, after_work_cb);
}

int gw_job_submit(gw_t *gw, gw_job_t *job)
{
    gw_pool_t *p = &gw->pool;

    job->gw = gw;
    if (p->n_free > 0 && !p->head) {
        start_job(gw, job);
        return 0;
    }
    if (p->queued >= p->queue_max)
        return -EBUSY;
    job->next = NULL;
    if (p->tail)
        p->tail->next = job;
    else
        p->head = job;
    p->tail = job;
    p->queued++;
    return 0;
}

/* ---- LISTEN ---- */

static void store_head(gw_listener_t *l, uint64_t seq)
{
    uint64_t cur = atomic_load(&l->head);
    while (seq > cur && !atomic_compare_exchange_weak(&l->head, &cur, seq))
        ;
}

static int connect_and_listen(gw_listener_t *l, PGconn **ret_db)
{
    PGconn *db = NULL;
    int rc = sp_db_connect(l->url, GW_DAEMON "-listen", LISTEN_CONNECT_MS, &db);
    if (rc < 0)
        return rc;
    /* LISTEN first, then read the head: a commit in between is seen by one or the other. */
    if ((rc = sp_db_exec(db, "LISTEN " SP_EVENTLOG_CHANNEL "; LISTEN " SP_APIKEY_CHANNEL
                             "; LISTEN " SP_SANDBOX_CHANNEL)) < 0) {
        PQfinish(db);
        return rc;
    }
    uint64_t head = 0;
    if (sp_db_log_head(db, &head) == 0)
        store_head(l, head);
    *ret_db = db;
    return 0;
}

static void wait_wake(gw_listener_t *l, int ms)
{
    struct pollfd pfd = {.fd = l->wake_fd, .events = POLLIN};
    poll(&pfd, 1, ms);
}

static void *listen_main(void *arg)
{
    gw_listener_t *l = arg;
    PGconn *db = NULL;
    int backoff_ms = 100;
    bool lost = false;

    while (!atomic_load(&l->stop)) {
        if (!db) {
            if (connect_and_listen(l, &db) < 0) {
                if (!lost)
                    sp_log(SP_LOG_WARN, "LISTEN connection unavailable; retrying");
                lost = true;
                wait_wake(l, backoff_ms);
                backoff_ms =
                    backoff_ms * 2 > LISTEN_BACKOFF_MAX_MS ? LISTEN_BACKOFF_MAX_MS : backoff_ms * 2;
                continue;
            }
            if (lost)
                sp_log(SP_LOG_INFO, "LISTEN connection restored");
            lost = false;
            backoff_ms = 100;
            /* Notifications may have been missed while away: waiters re-check now, the
             * auth cache forgets every key (one may have been revoked meanwhile), and the
             * location cache starts empty. */
            atomic_fetch_add(&l->keys_gen, 1);
            gw_loc_cache_drop(&l->locs, NULL, true);
            uv_async_send(&l->async);
        }
        struct pollfd fds[2] = {{.fd = PQsocket(db), .events = POLLIN},
                                {.fd = l->wake_fd, .events = POLLIN}};
        int n = poll(fds, 2, 5000);
        if (n < 0 && errno != EINTR)
            break;
        if (fds[1].revents)
            break;
        if (n <= 0 || !fds[0].revents)
            continue;
        if (!PQconsumeInput(db)) {
            sp_log(SP_LOG_WARN, "LISTEN connection lost", SP_KS("error", PQerrorMessage(db)));
            gw_loc_cache_drop(&l->locs, NULL, false);
            lost = true;
            PQfinish(db);
            db = NULL;
            continue;
        }
        bool any = false;
        PGnotify *nt;
        while ((nt = PQnotifies(db)) != NULL) {
            if (strcmp(nt->relname, SP_SANDBOX_CHANNEL) == 0) {
                gw_loc_cache_drop(&l->locs, nt->extra ? nt->extra : "", true);
                PQfreemem(nt);
                continue;
            }
            if (strcmp(nt->relname, SP_APIKEY_CHANNEL) == 0) {
                atomic_fetch_add(&l->keys_gen, 1);
                PQfreemem(nt);
                any = true;
                continue;
            }
            char *end = NULL;
            unsigned long long seq = strtoull(nt->extra ? nt->extra : "", &end, 10);
            if (end && *end == '\0')
                store_head(l, seq);
            PQfreemem(nt);
            any = true;
        }
        if (any)
            uv_async_send(&l->async);
    }
    PQfinish(db);
    return NULL;
}

int gw_listener_start(gw_listener_t *l, const char *url)
{
    gw_loc_cache_init(&l->locs);
    l->url = sp_xstrdup(url);
    l->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->wake_fd < 0)
        return -errno;
    atomic_store(&l->stop, false);
    int rc = pthread_create(&l->thread, NULL, listen_main, l);
    if (rc != 0)
        return -rc;
    l->started = true;
    return 0;
}

void gw_listener_stop(gw_listener_t *l)
{
    if (l->started) {
        uint64_t one = 1;
        atomic_store(&l->stop, true);
        if (write(l->wake_fd, &one, sizeof(one)) < 0)
            sp_log(SP_LOG_WARN, "cannot wake the LISTEN thread");
        pthread_join(l->thread, NULL);
        l->started = false;
    }
    if (l->wake_fd >= 0)
        close(l->wake_fd);
    l->wake_fd = -1;
    gw_loc_cache_dispose(&l->locs);
    free(l->url);
    l->url = NULL;
}

bool gw_sandbox_loc_ok(gw_req_t *rq, const gw_sandbox_loc_t *loc)
{
    if (rq->gw->stopping) {
        gw_respond_error(rq, 503, "shutting_down", NULL, "the gateway is stopping");
    } else if (loc->failed) {
        gw_respond_error(rq, 503, "unavailable", NULL, "the database is not available; retry");
    } else if (!loc->found) {
        gw_respond_error(rq, 404, "not_found", NULL, "no such sandbox");
    } else if (strcmp(loc->state, "running") != 0) {
        sp_buf_t extra;
        sp_buf_init(&extra);
        sp_buf_puts(&extra, "\"state\":");
        sp_buf_json_str(&extra, loc->state);
        gw_respond_error(rq, 409, "sandbox_not_running", extra.data,
                         "the sandbox is %s; commands run only in a running sandbox", loc->state);
        sp_buf_dispose(&extra);
    } else if (!sp_id_valid(loc->worker)) {
        gw_respond_error(rq, 503, "worker_unavailable", NULL, "the sandbox has no worker");
    } else {
        return true;
    }
    return false;
}
