/* libFuzzer target for the worker's reading of the agent channel (worker/worker_agent.c):
 * the bytes a guest can write to its agent's stdout. The input is the channel's byte stream:
 * frames of a 4-byte big-endian length and an AgentFrame, cut and checked as the reader
 * thread does (the size before any decode, then the protobuf, then handle() against the
 * channel's state), against a channel that has two commands running and three transfers
 * open (a write, a read, a watch), so that every kind of frame has something to name. Built
 * with -DSPACE_FUZZ=ON and clang (tests/fuzz/CMakeLists.txt); scripts/test.sh runs it.
 *
 * Beyond "no crash, no leak, no undefined behaviour": a violation always carries a reason,
 * and the channel's tables stay within their limits. */
#include "../../worker/worker_agent.c" /* NOLINT(bugprone-suspicious-include) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void add_cmd(wk_agent_t *a, const char *id)
{
    cmd_t *c = calloc(1, sizeof(*c));
    snprintf(c->id, sizeof(c->id), "%s", id);
    a->cmds[a->n_cmds++] = c;
}

static void add_xfer(wk_agent_t *a, uint64_t id, bool write, bool reading, bool watch)
{
    xfer_t *x = calloc(1, sizeof(*x));
    x->id = id;
    x->open = !watch;
    x->write = write;
    x->watch = watch;
    x->sent = write ? 1 << 20 : 0;
    x->reading = reading;
    x->read_left = reading ? 1 << 20 : 0;
    a->xfers[a->n_xfers++] = x;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wk_agent_t *a = calloc(1, sizeof(*a));
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->wmu, NULL);
    pthread_cond_init(&a->cond, NULL);
    a->to_fd = a->from_fd = a->wake_fd = -1;
    a->opened = true;
    a->tokens = 1e9; /* no throttling: the reader's pace is not under test */
    a->refill_us = now_us();
    add_cmd(a, "cmd_a");
    add_cmd(a, "cmd_b");
    add_xfer(a, 1, true, false, false);
    add_xfer(a, 2, false, true, false);
    add_xfer(a, 3, false, false, true);
    a->next_xfer = 4;

    char why[WHY_MAX];
    size_t off = 0;
    verdict_t v = FRAME_OK;
    while (v == FRAME_OK && size - off >= 4) {
        const uint8_t *q = data + off;
        uint32_t flen = (uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | q[3];
        why[0] = '\0';
        if (flen > WK_AGENT_FRAME_MAX)
            break; /* the reader's first check: nothing of such a frame is decoded */
        if (size - off - 4 < flen)
            break;
        frame_t *f = space__agent__v1__agent_frame__unpack(NULL, flen, q + 4);
        if (!f)
            break;
        v = handle(a, f, why);
        space__agent__v1__agent_frame__free_unpacked(f, NULL);
        if (v != FRAME_OK && why[0] == '\0' && a->state != ST_LOST)
            abort(); /* a violation names itself */
        off += 4 + (size_t)flen;
    }
    if (a->n_cmds > WK_AGENT_MAX_COMMANDS || a->n_xfers > WK_AGENT_MAX_XFERS)
        abort();
    for (size_t i = 0; i < a->n_cmds; i++)
        free(a->cmds[i]);
    for (size_t i = 0; i < a->n_xfers; i++)
        free(a->xfers[i]);
    free(a->running);
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->wmu);
    pthread_mutex_destroy(&a->mu);
    free(a);
    return 0;
}
