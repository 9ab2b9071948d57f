/* The worker's template status file (tmplstat.h). */
#include "tmplstat.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "xmalloc.h"

static const char *const STATES[] = {"queued", "building", "ready", "failed"};

const char *sp_tmpl_state_name(sp_tmpl_state_t s)
{
    return (unsigned)s < sizeof(STATES) / sizeof(STATES[0]) ? STATES[s] : "?";
}

int sp_tmplstat_write(const char *path, int pid, const sp_tmplstat_t *t, size_t n)
{
    if (n > SP_TMPLSTAT_MAX)
        return -EINVAL;
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_printf(&b, "pid %d\n", pid);
    for (size_t i = 0; i < n; i++) {
        sp_buf_printf(&b, "%s %s %lld %lld ", t[i].name, sp_tmpl_state_name(t[i].state),
                      (long long)t[i].since_ms, (long long)t[i].took_ms);
        for (const char *d = t[i].detail; *d; d++) {
            char c = *d;
            if (c == '\n' || c == '\r')
                c = ' ';
            sp_buf_putc(&b, c);
        }
        sp_buf_putc(&b, '\n');
    }
    char *tmp = sp_xasprintf("%s.tmp", path);
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    for (size_t off = 0; off < b.len;) {
        ssize_t k = write(fd, b.data + off, b.len - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            rc = -errno;
            break;
        }
        off += (size_t)k;
    }
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0)
        (void)unlink(tmp);
out:
    free(tmp);
    sp_buf_dispose(&b);
    return rc;
}

static int parse_line(char *line, sp_tmplstat_t *t)
{
    char *save = NULL;
    const char *name = strtok_r(line, " ", &save);
    const char *state = strtok_r(NULL, " ", &save);
    const char *since = strtok_r(NULL, " ", &save);
    const char *took = strtok_r(NULL, " ", &save);
    const char *detail = strtok_r(NULL, "", &save);
    if (!name || !state || !since || !took || strlen(name) > SP_ID_MAX)
        return -EBADMSG;
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    size_t k = 0;
    while (k < sizeof(STATES) / sizeof(STATES[0]) && strcmp(state, STATES[k]) != 0)
        k++;
    if (k == sizeof(STATES) / sizeof(STATES[0]))
        return -EBADMSG;
    t->state = (sp_tmpl_state_t)k;
    char *e1 = NULL, *e2 = NULL;
    t->since_ms = strtoll(since, &e1, 10);
    t->took_ms = strtoll(took, &e2, 10);
    if (*e1 || *e2)
        return -EBADMSG;
    snprintf(t->detail, sizeof(t->detail), "%s", detail ? detail : "");
    return 0;
}

int sp_tmplstat_read(const char *path, int *ret_pid, sp_tmplstat_t *t, size_t max, size_t *ret_n)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    char line[SP_TMPLSTAT_DETAIL_MAX + SP_ID_MAX + 128];
    int rc = 0, pid = 0;
    size_t n = 0;
    char *end = NULL;
    if (fgets(line, sizeof(line), f) && strncmp(line, "pid ", 4) == 0) {
        long v = strtol(line + 4, &end, 10);
        pid = v > 0 && v <= INT32_MAX && *end == '\n' ? (int)v : 0;
    }
    if (pid == 0)
        rc = -EBADMSG;
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') {
            rc = -EBADMSG;
            break;
        }
        line[len - 1] = '\0';
        if (n == max)
            break;
        rc = parse_line(line, &t[n]);
        if (rc == 0)
            n++;
    }
    fclose(f);
    if (rc < 0)
        return rc;
    *ret_pid = pid;
    *ret_n = n;
    return 0;
}
