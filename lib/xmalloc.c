/* The one allocation family (STYLE.md): out of memory is not an error a caller can handle, so
 * it aborts here with a message instead of spreading NULL checks through every daemon. */
#include "xmalloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The message is built on the stack and written with write(2): stdio may itself need memory. */
static _Noreturn void die(const char *what, size_t nmemb, size_t size)
{
    char msg[128];
    int n = snprintf(msg, sizeof(msg), "space: %s(%zu, %zu): out of memory or size overflow\n",
                     what, nmemb, size);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg));
        (void)w;
    }
    abort();
}

/* malloc(0) and realloc(p, 0) may return NULL or free p; a zero-byte request gets one byte so
 * NULL always means failure and the result is always a pointer the caller frees. */
void *sp_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("sp_xmalloc", 1, n);
    return p;
}

void *sp_xcalloc(size_t nmemb, size_t size)
{
    if (nmemb == 0 || size == 0)
        nmemb = size = 1;
    void *p = calloc(nmemb, size);
    if (!p)
        die("sp_xcalloc", nmemb, size);
    return p;
}

void *sp_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        die("sp_xrealloc", 1, n);
    return q;
}

void *sp_xreallocarray(void *p, size_t nmemb, size_t size)
{
    if (nmemb == 0 || size == 0)
        nmemb = size = 1;
    /* reallocarray fails with ENOMEM when nmemb * size overflows. */
    void *q = reallocarray(p, nmemb, size);
    if (!q)
        die("sp_xreallocarray", nmemb, size);
    return q;
}

char *sp_xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        die("sp_xstrdup", 1, strlen(s) + 1);
    return d;
}

char *sp_xstrndup(const char *s, size_t n)
{
    char *d = strndup(s, n);
    if (!d)
        die("sp_xstrndup", 1, n);
    return d;
}

char *sp_xasprintf(const char *fmt, ...)
{
    char *s;
    va_list ap;

    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        die("sp_xasprintf", 1, 0);
    return s;
}
