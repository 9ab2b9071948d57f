/* Bus jobs: blocking NATS calls on libuv's thread pool, bounded per lane (gateway.h). */
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
    gw_bus_lane_t *lane = job->lane;

    (void)status; /* never cancelled */
    lane->running--;
    while (lane->head && lane->running < (size_t)lane->max) {
        gw_bus_job_t *next = lane->head;
        lane->head = next->next;
        if (!lane->head)
            lane->tail = NULL;
        bus_start(next->gw, next);
    }
    job->done(job);
}

static void bus_start(gw_t *gw, gw_bus_job_t *job)
{
    job->lane->running++;
    job->next = NULL;
    job->work.data = job;
    uv_queue_work(gw->loop, &job->work, work_cb, after_cb);
}

/* The FIFOs are bounded by their users: one job per command, control request or file request
 * at a time. */
void gw_bus_submit(gw_t *gw, gw_bus_lane_t *lane, gw_bus_job_t *job)
{
    job->gw = gw;
    job->lane = lane;
    if (lane->running < (size_t)lane->max && !lane->head) {
        bus_start(gw, job);
        return;
    }
    job->next = NULL;
    if (lane->tail)
        lane->tail->next = job;
    else
        lane->head = job;
    lane->tail = job;
}
