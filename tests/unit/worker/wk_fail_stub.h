/* worker_runtime.c's wk__fail, for the worker's unit tests, which include one module's .c and
 * do not link the runtime. Include it after that .c. */
#ifndef SPACE_TEST_WK_FAIL_STUB_H
#define SPACE_TEST_WK_FAIL_STUB_H

#include <stdarg.h>
#include <stdio.h>

int wk__fail(char *err, int rc, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, WK_ERR_MAX, fmt, ap);
        va_end(ap);
    }
    return rc;
}

#endif
