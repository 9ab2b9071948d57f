/* Allocation that cannot fail: out of memory aborts the process with a message.
 * Every allocation in SPACE goes through this family (STYLE.md: one xmalloc family). */
#ifndef SPACE_XMALLOC_H
#define SPACE_XMALLOC_H

#include <stddef.h>

/* Never NULL: tell the compiler and the static analyzer. */
#define SP_NONNULL_RET __attribute__((returns_nonnull, warn_unused_result))

void *sp_xmalloc(size_t n) SP_NONNULL_RET;
void *sp_xcalloc(size_t nmemb, size_t size) SP_NONNULL_RET;
void *sp_xrealloc(void *p, size_t n) SP_NONNULL_RET;
/* reallocarray with overflow check; aborts on overflow or OOM. */
void *sp_xreallocarray(void *p, size_t nmemb, size_t size) SP_NONNULL_RET;
char *sp_xstrdup(const char *s) SP_NONNULL_RET;
char *sp_xstrndup(const char *s, size_t n) SP_NONNULL_RET;
char *sp_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2))) SP_NONNULL_RET;

#endif
