/* Server-sent events (the WHATWG event-stream format), both ways.
 *
 * Writing (the gateway's streams): a record is begun, its data appended, and ended.
 *
 * Reading (the tools): feed the bytes of a text/event-stream body as they come, get one
 * callback per event. Lines are bounded (SP_SSE_LINE_MAX): a longer one is an error, not a
 * reason to grow without end. */
#ifndef SPACE_SSE_H
#define SPACE_SSE_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

#define SP_SSE_LINE_MAX (64u * 1024 * 1024)

/* A comment record: readers skip it; it keeps an idle connection's proxies from timing out. */
#define SP_SSE_KEEPALIVE ": keepalive\n\n"

/* Appends "id: <id>\n" (none when id is 0: ids start at 1), "event: <event>\n" and "data: ".
 * What the caller appends next is the data: one line (JSON text, whose strings escape line
 * ends). sp_sse_record_end closes the record. */
void sp_sse_record_begin(sp_buf_t *b, uint64_t id, const char *event);
void sp_sse_record_end(sp_buf_t *b);

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
