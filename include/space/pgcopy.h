/* PostgreSQL's binary COPY format, written into an sp_buf_t (PostgreSQL docs, COPY, "Binary
 * Format"; each value in its type's send/recv form).
 *
 * A COPY ... FROM STDIN WITH (FORMAT binary) stream is sp_pgcopy_header, then per row
 * sp_pgcopy_tuple with the number of fields followed by exactly that many field writers in the
 * statement's column order, then sp_pgcopy_trailer. The writers append in network byte order;
 * nothing is escaped (bytea and text travel as their bytes, not as hex). PostgreSQL still
 * checks each value on arrival (text must be valid in the server encoding, ranges of
 * timestamptz), so a value the text format would refuse is refused here too.
 *
 * The writers that can fail return 0 or a negative errno and then append nothing: a caller
 * that stops at the first error leaves a buffer that PostgreSQL would refuse as a whole (the
 * tuple is short), never one that stores other values. Not thread-safe per buffer. */
#ifndef SPACE_PGCOPY_H
#define SPACE_PGCOPY_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/* Microseconds between 1970-01-01 and 2000-01-01, PostgreSQL's timestamp epoch. */
#define SP_PGCOPY_EPOCH_US 946684800000000LL

/* The 11-byte signature, flags (0: no OIDs) and an empty header extension. */
void sp_pgcopy_header(sp_buf_t *b);
/* The end of the data: a field count of -1. */
void sp_pgcopy_trailer(sp_buf_t *b);
/* A row of nfields fields. */
void sp_pgcopy_tuple(sp_buf_t *b, uint16_t nfields);

/* A NULL field (length -1). */
void sp_pgcopy_null(sp_buf_t *b);
/* bytea (or any type whose binary form is its bytes): -E2BIG over INT32_MAX bytes. */
int sp_pgcopy_bytes(sp_buf_t *b, const void *data, size_t len);
/* text: s's bytes without its NUL; s NULL writes NULL. -E2BIG over INT32_MAX bytes. */
int sp_pgcopy_text(sp_buf_t *b, const char *s);
void sp_pgcopy_int2(sp_buf_t *b, int16_t v);
void sp_pgcopy_int4(sp_buf_t *b, int32_t v);
void sp_pgcopy_int8(sp_buf_t *b, int64_t v);
/* timestamptz from microseconds since the Unix epoch (UTC). */
void sp_pgcopy_timestamptz_us(sp_buf_t *b, int64_t unix_us);
/* uuid from its canonical text (8-4-4-4-12 hex digits, either case); s NULL writes NULL.
 * -EINVAL when s is not one. */
int sp_pgcopy_uuid(sp_buf_t *b, const char *s);

#endif
