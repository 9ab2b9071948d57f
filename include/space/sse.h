/* A server-sent events reader (the WHATWG event-stream format) for the tools: feed it the
 * bytes of a text/event-stream body as they come, get one callback per event. Lines are
 * bounded (SP_SSE_LINE_MAX): a longer one is an error, not a reason to grow without end. */
#ifndef SPACE_SSE_H
#define SPACE_SSE_H

#include <stddef.h>

#include "buf.h"

#define SP_SSE_LINE_MAX (64u * 1024 * 1024)

typedef struct {
    const char *id;    /* the last id: seen so far ("" when none) */
    const char *event; /* "message" when the event named none */
    const char *data;  /* data: lines joined with '\n' */
    size_t data_len;
} sp_sse_event_t;

/* Returns nonzero to stop reading (sp_sse_feed then returns it). */
typedef int (*sp_sse_fn)(void *arg, const sp_sse_event_t *ev);

typedef struct {
    sp_buf_t line, data, event;
    char id[256];
    int cr; /* the last byte was a CR: a following LF belongs to it */
    sp_sse_fn fn;
    void *arg;
} sp_sse_reader_t;

void sp_sse_init(sp_sse_reader_t *r, sp_sse_fn fn, void *arg);
/* 0, the callback's nonzero return, or SP_ETOOBIG for an over-long line. */
int sp_sse_feed(sp_sse_reader_t *r, const char *p, size_t n);
void sp_sse_dispose(sp_sse_reader_t *r);

#endif
