/* PostgreSQL's binary COPY format (pgcopy.h). */
#include "pgcopy.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include "ids.h"

/* "PGCOPY\n\377\r\n\0": the signature that tells binary COPY data from text (and catches
 * newline translation on the way). */
static const uint8_t signature[11] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xff, '\r', '\n', 0};

static void put_be(sp_buf_t *b, uint64_t v, size_t n)
{
    uint8_t out[8];
    for (size_t i = 0; i < n; i++)
        out[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    sp_buf_append(b, out, n);
}

void sp_pgcopy_header(sp_buf_t *b)
{
    sp_buf_append(b, signature, sizeof(signature));
    put_be(b, 0, 4); /* flags: no OIDs */
    put_be(b, 0, 4); /* header extension length */
}

void sp_pgcopy_trailer(sp_buf_t *b)
{
    put_be(b, 0xffff, 2);
}

void sp_pgcopy_tuple(sp_buf_t *b, uint16_t nfields)
{
    put_be(b, nfields, 2);
}

void sp_pgcopy_null(sp_buf_t *b)
{
    put_be(b, 0xffffffffu, 4);
}

int sp_pgcopy_bytes(sp_buf_t *b, const void *data, size_t len)
{
    if (len > INT32_MAX)
        return -E2BIG;
    put_be(b, len, 4);
    if (len)
        sp_buf_append(b, data, len);
    return 0;
}

int sp_pgcopy_text(sp_buf_t *b, const char *s)
{
    if (!s) {
        sp_pgcopy_null(b);
        return 0;
    }
    return sp_pgcopy_bytes(b, s, strlen(s));
}

void sp_pgcopy_int2(sp_buf_t *b, int16_t v)
{
    put_be(b, 2, 4);
    put_be(b, (uint16_t)v, 2);
}

void sp_pgcopy_int4(sp_buf_t *b, int32_t v)
{
    put_be(b, 4, 4);
    put_be(b, (uint32_t)v, 4);
}

void sp_pgcopy_int8(sp_buf_t *b, int64_t v)
{
    put_be(b, 8, 4);
    put_be(b, (uint64_t)v, 8);
}

void sp_pgcopy_timestamptz_us(sp_buf_t *b, int64_t unix_us)
{
    /* PostgreSQL stores timestamptz as int64 microseconds since 2000-01-01 UTC (integer
     * datetimes, the only kind since PostgreSQL 10). Unsigned arithmetic: no overflow for any
     * input; a value out of PostgreSQL's range is refused by it. */
    put_be(b, 8, 4);
    put_be(b, (uint64_t)unix_us - (uint64_t)SP_PGCOPY_EPOCH_US, 8);
}

int sp_pgcopy_uuid(sp_buf_t *b, const char *s)
{
    uint8_t raw[16];
    if (!s) {
        sp_pgcopy_null(b);
        return 0;
    }
    if (sp_uuid_parse(s, raw) < 0)
        return -EINVAL;
    return sp_pgcopy_bytes(b, raw, sizeof(raw));
}
