/* Bus jobs: blocking NATS calls on libuv's thread pool, bounded by bus-threads (gateway.h). */
#include "gateway.h"

static void bus_start(gw_t *gw, gw_bus_job_t *job);

static void work_cb(uv_work_t *w)
{
    gw_bus_job_t *job = w->data;
    job->run(job);
}

static void after_cb(uv_work_t *w, int status)
{
    gw_bus_job_t *job = w->data;
    gw_t *gw = job->gw;

    (void)status; /* never cancelled */
    gw->bus_running--;
    while (gw->bus_head && gw->bus_running < (size_t)gw->cfg->bus_threads) {
        gw_bus_job_t *next = gw->bus_head;
        gw->bus_head = next->next;
        if (!gw->bus_head)
            gw->bus_tail = NULL;
        bus_start(gw, next);
    }
    job->done(job);
}

static void bus_start(gw_t *gw, gw_bus_job_t *job)
{
    gw->bus_running++;
    job->next = NULL;
    job->work.data = job;
    uv_queue_work(gw->loop, &job->work, work_cb, after_cb);
}

/* The FIFO is bounded by its users: one job per command at a time, one per control request. */
void gw_bus_submit(gw_t *gw, gw_bus_job_t *job)
{
    job->gw = gw;
    if (gw->bus_running < (size_t)gw->cfg->bus_threads && !gw->bus_head) {
        bus_start(gw, job);
        return;
    }
    job->next = NULL;
    if (gw->bus_tail)
        gw->bus_tail->next = job;
    else
        gw->bus_head = job;
    gw->bus_tail = job;
}
