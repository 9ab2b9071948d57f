/* Text from untrusted sources: what may go into an event, a log line, JSON or a terminal. */
#ifndef SPACE_TEXT_H
#define SPACE_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* Newlines, tabs and carriage returns are allowed too (scripts, command lines). */
#define SP_TEXT_SPACE_CONTROLS 1u

/* True when s is valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past
 * U+10FFFF) of at most max bytes without control characters (C0 and DEL; with
 * SP_TEXT_SPACE_CONTROLS, \n \t \r are accepted). */
bool sp_text_valid(const char *s, size_t max, unsigned flags);

#endif
