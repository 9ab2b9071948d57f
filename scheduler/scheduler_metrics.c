/* The scheduler's metrics (docs/metrics.md): what it decided about each intent, and what its
 * controller asked for. Label values come from the fixed lists below, never from an event. */
#include <string.h>

#include "intent.h"
#include "scheduler.h"

/* Outcomes of a placement: placed (a create), placed_resume, or the refusal's code. */
static const char *const outcomes[] = {
    "placed",
    "placed_resume",
    "no_capacity",
    "unknown_template",
    "illegal_transition",
    SP_INTENT_INVALID,
    SP_INTENT_ENV_REFUSED,
    SP_INTENT_NOT_AN_INTENT,
    "other",
};
#define N_OUTCOMES (sizeof(outcomes) / sizeof(outcomes[0]))

static const char *const actions[] = {
    "timeout_delete", "timeout_suspend", "idle_suspend",
    "worker_lost",    "sandbox_lost",    "resume_lost",
};
#define N_ACTIONS (sizeof(actions) / sizeof(actions[0]))

int sched_metrics_init(sched_t *s, sp_metrics_t *reg)
{
    s->m_placements = sp_metrics_add(
        reg, SP_METRIC_COUNTER, "space_scheduler_placements_total",
        "Create and resume intents decided, by outcome: placed, placed_resume, or the refusal's "
        "code (SandboxRequestRejected.reason).",
        "outcome", NULL, 0, N_OUTCOMES);
    s->m_actions = sp_metrics_add(
        reg, SP_METRIC_COUNTER, "space_scheduler_controller_actions_total",
        "Requests the controller published: deletes and suspends at a timeout or idleness, "
        "workers declared lost, sandboxes failed or resumes given up with them. A request asked "
        "again on a later tick (not yet acted on) counts again; the bus drops the duplicate.",
        "action", NULL, 0, N_ACTIONS);
    if (!s->m_placements || !s->m_actions)
        return -1;
    /* Every series from the start, at 0: a rate over a series that appears late is wrong. */
    for (size_t i = 0; i < N_OUTCOMES; i++)
        (void)sp_metric_series1(s->m_placements, outcomes[i]);
    for (size_t i = 0; i < N_ACTIONS; i++)
        (void)sp_metric_series1(s->m_actions, actions[i]);
    return 0;
}

void sched_metrics_placement(sched_t *s, const char *outcome)
{
    const char *v = "other";
    for (size_t i = 0; i < N_OUTCOMES; i++)
        if (strcmp(outcome, outcomes[i]) == 0)
            v = outcomes[i];
    sp_series_inc(sp_metric_series1(s->m_placements, v));
}

void sched_metrics_action(sched_t *s, const char *action)
{
    sp_series_inc(sp_metric_series1(s->m_actions, action));
}
