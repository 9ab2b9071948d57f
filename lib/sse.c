/* Server-sent events: the record writer and the reader (sse.h). */
#include "sse.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

void sp_sse_record_begin(sp_buf_t *b, uint64_t id, const char *event)
{
    if (id)
        sp_buf_printf(b, "id: %" PRIu64 "\n", id);
    sp_buf_printf(b, "event: %s\ndata: ", event);
}

void sp_sse_record_end(sp_buf_t *b)
{
    sp_buf_puts(b, "\n\n");
}

void sp_sse_init(sp_sse_reader_t *r, sp_sse_fn fn, void *arg)
{
    memset(r, 0, sizeof(*r));
    sp_buf_init(&r->line);
    sp_buf_init(&r->data);
    sp_buf_init(&r->event);
    r->fn = fn;
    r->arg = arg;
}

void sp_sse_dispose(sp_sse_reader_t *r)
{
    sp_buf_dispose(&r->line);
    sp_buf_dispose(&r->data);
    sp_buf_dispose(&r->event);
}

/* One complete line (without its end). */
static int line(sp_sse_reader_t *r)
{
    const char *l = r->line.data ? r->line.data : "";
    size_t n = r->line.len;
    int rc = 0;

    if (n == 0) {
        /* Dispatch: an event with no data lines is dropped, as browsers do. */
        if (r->data.len > 0) {
            sp_sse_event_t ev = {
                .id = r->id,
                .event = r->event.len ? r->event.data : "message",
                .data = r->data.data,
                .data_len = r->data.len - 1, /* the last '\n' */
            };
            r->data.data[r->data.len - 1] = '\0';
            rc = r->fn(r->arg, &ev);
        }
        sp_buf_reset(&r->data);
        sp_buf_reset(&r->event);
        return rc;
    }
    if (l[0] == ':')
        return 0; /* a comment: keepalives */
    const char *colon = memchr(l, ':', n);
    size_t flen = colon ? (size_t)(colon - l) : n;
    const char *v = colon ? colon + 1 : l + n;
    if (colon && v < l + n && *v == ' ')
        v++;
    size_t vlen = (size_t)(l + n - v);
    if (flen == 4 && memcmp(l, "data", 4) == 0) {
        sp_buf_append(&r->data, v, vlen);
        sp_buf_putc(&r->data, '\n');
    } else if (flen == 5 && memcmp(l, "event", 5) == 0) {
        sp_buf_reset(&r->event);
        sp_buf_append(&r->event, v, vlen);
    } else if (flen == 2 && memcmp(l, "id", 2) == 0 && !memchr(v, '\0', vlen)) {
        snprintf(r->id, sizeof(r->id), "%.*s", (int)vlen, v);
    }
    return 0; /* retry: and unknown fields are ignored */
}

int sp_sse_feed(sp_sse_reader_t *r, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\n' && r->cr) {
            r->cr = 0;
            continue;
        }
        r->cr = c == '\r';
        if (c == '\n' || c == '\r') {
            int rc = line(r);
            sp_buf_reset(&r->line);
            if (rc)
                return rc;
            continue;
        }
        if (r->line.len >= SP_SSE_LINE_MAX)
            return SP_ETOOBIG;
        sp_buf_putc(&r->line, c);
    }
    return 0;
}
