/* Text from untrusted sources: what may go into an event, a log line, JSON or a terminal. */
#ifndef SPACE_TEXT_H
#define SPACE_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Newlines, tabs and carriage returns are allowed too (scripts, command lines). */
#define SP_TEXT_SPACE_CONTROLS 1u

/* Length (1..4) of the well-formed UTF-8 sequence at p (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), reading at most avail bytes; 0 if there is none. When
 * the bytes are a valid start cut short by avail, *ret_partial (optional) is set. A NUL byte
 * ends any multi-byte sequence, so a NUL-terminated string may be passed with avail 4. */
size_t sp_utf8_seq(const uint8_t *p, size_t avail, bool *ret_partial);

/* True when s is valid UTF-8 of at most max bytes without control characters (C0 and DEL;
 * with SP_TEXT_SPACE_CONTROLS, \n \t \r are accepted). */
bool sp_text_valid(const char *s, size_t max, unsigned flags);

/* Value of a hex digit (either case), -1 for anything else. */
int sp_hex_digit(char c);

/* Parses an RFC 3339 time, "2026-01-02T03:04:05Z", with an optional fraction (digits past
 * microseconds are dropped) and a Z or +hh:mm / -hh:mm offset, into microseconds since the
 * epoch (after 1970). -EINVAL for anything else. */
int sp_time_parse(const char *s, int64_t *ret_us);

#endif
