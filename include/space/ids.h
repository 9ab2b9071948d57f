/* Identifiers. */
#ifndef SPACE_IDS_H
#define SPACE_IDS_H

#include <stddef.h>
#include <stdint.h>

#define SP_UUID_STR_LEN 36 /* without the terminating NUL */

/* UUIDv7 (RFC 9562 section 5.7): 48-bit Unix ms timestamp, version 7, variant 10, and a
 * 12-bit + 62-bit random part. Within one process ids are strictly increasing (the random
 * part is a counter seeded randomly each millisecond), so they sort by creation time. */
void sp_uuid7(uint8_t out[16]);
/* Lower-case 8-4-4-4-12 text form into out (37 bytes with NUL). */
void sp_uuid_format(const uint8_t uuid[16], char out[SP_UUID_STR_LEN + 1]);
void sp_uuid7_str(char out[SP_UUID_STR_LEN + 1]);
/* Strict parse of the 36-char text form (either case); -EINVAL otherwise. */
int sp_uuid_parse(const char *s, uint8_t out[16]);
/* Milliseconds since the Unix epoch embedded in a UUIDv7; -EINVAL if the version is not 7 or the
 * variant is not RFC 9562's. */
int sp_uuid7_time_ms(const uint8_t uuid[16], int64_t *ret_ms);

/* Sandbox ids: "sbx_" + 26 lower-case base32 chars of a UUIDv7: fixed length (runsc matches
 * container ids by prefix, runtime-notes.md) and sortable. The alphabet is RFC 4648's "base32hex"
 * (section 7, [0-9a-v], no padding), whose ASCII order matches the order of the bits. */
#define SP_SANDBOX_ID_LEN 30
void sp_sandbox_id_new(char out[SP_SANDBOX_ID_LEN + 1]);
/* Returns 1 for ids made of [a-z0-9_-], 1..64 chars, starting with [a-z0-9], else 0: the shape
 * every aggregate id must have so it is safe in a NATS subject token (never the "_" placeholder),
 * a path component and a runsc container id (never read as an option). */
int sp_id_valid(const char *s);

/* len bytes of the kernel's CSPRNG (getrandom), for unguessable tokens; its failure aborts the
 * process, like out of memory. */
void sp_random_bytes(void *buf, size_t len);

/* Current wall-clock time in microseconds since the epoch; monotonic clock in nanoseconds. */
int64_t sp_now_us(void);
int64_t sp_mono_ns(void);

#endif
