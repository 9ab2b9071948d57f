/* The worker's template status file, <state-dir>/templates.status: how far the templates it was
 * told to prepare are. The worker writes it (whole, atomically: a temporary file renamed over
 * it) whenever a template changes state; `space up` reads it to wait for the templates, show
 * their progress and report a failed build.
 *
 * Format, text: a first line "pid <pid>" (the worker that wrote it), then one line per template
 * in the order configured, "<name> <state> <since_ms> <took_ms> <detail>": state one of queued,
 * building, ready, failed; since_ms the wall-clock time (ms since the epoch) the state began;
 * took_ms how long the build or restore took (ready, failed; else 0); detail the rest of the
 * line: where a ready template came from (present, built, cache), the build log while building,
 * the error of a failed one (newlines replaced). */
#ifndef SPACE_TMPLSTAT_H
#define SPACE_TMPLSTAT_H

#include <stddef.h>
#include <stdint.h>

#include "reduce.h" /* SP_ID_MAX */

#define SP_TMPLSTAT_FILE       "templates.status"
#define SP_TMPLSTAT_DETAIL_MAX 512
#define SP_TMPLSTAT_MAX        64 /* templates in one file */

typedef enum {
    SP_TMPL_QUEUED,
    SP_TMPL_BUILDING,
    SP_TMPL_READY,
    SP_TMPL_FAILED,
} sp_tmpl_state_t;

typedef struct {
    char name[SP_ID_MAX + 1];
    sp_tmpl_state_t state;
    int64_t since_ms;
    int64_t took_ms;
    char detail[SP_TMPLSTAT_DETAIL_MAX];
} sp_tmplstat_t;

const char *sp_tmpl_state_name(sp_tmpl_state_t s);

/* Writes the file at path for process pid: n (<= SP_TMPLSTAT_MAX) entries. 0 or -errno. */
int sp_tmplstat_write(const char *path, int pid, const sp_tmplstat_t *t, size_t n);

/* Reads it: the writer's pid and up to max entries into t (*ret_n of them). -ENOENT when there
 * is no file, -EBADMSG when a line does not parse, else -errno. */
int sp_tmplstat_read(const char *path, int *ret_pid, sp_tmplstat_t *t, size_t max, size_t *ret_n);

#endif
