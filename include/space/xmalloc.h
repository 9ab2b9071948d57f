/* Allocation that cannot fail: out of memory aborts the process with a message.
 * Every allocation in SPACE goes through this family (STYLE.md: one xmalloc family). */
#ifndef SPACE_XMALLOC_H
#define SPACE_XMALLOC_H

#include <stddef.h>

void *sp_xmalloc(size_t n);
void *sp_xcalloc(size_t nmemb, size_t size);
void *sp_xrealloc(void *p, size_t n);
/* reallocarray with overflow check; aborts on overflow or OOM. */
void *sp_xreallocarray(void *p, size_t nmemb, size_t size);
char *sp_xstrdup(const char *s);
char *sp_xstrndup(const char *s, size_t n);
char *sp_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
