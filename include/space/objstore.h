/* A NATS JetStream object store over the bus's connection, in the layout every NATS client
 * shares (ADR-20): bucket B is the stream OBJ_B; an object's bytes are messages on
 * $O.B.C.<nuid> (chunks of SP_OBJ_CHUNK_BYTES), its description one JSON ObjectInfo on
 * $O.B.M.<base64url(name)>, rolled up (Nats-Rollup: sub) so only the newest stays. What this
 * writes `nats object get` and the official clients read, and the reverse.
 *
 * What the server hands back is untrusted: an ObjectInfo is parsed strictly and bounded, and
 * a read checks the bytes against the ObjectInfo's size and SHA-256 before it succeeds.
 *
 * Calls are synchronous (one JetStream round trip per chunk) and may run on several threads
 * at once, as bus.h allows. Errors: SP_ENOTFOUND (no such bucket or object, or a deleted one),
 * -EINVAL (a bad bucket or object name), -EBADMSG (the stored bytes do not match their
 * ObjectInfo, or the ObjectInfo is malformed), SP_ETOOBIG (larger than the caller allows),
 * negative errno from reading or writing the file descriptor, bus errors otherwise. */
#ifndef SPACE_OBJSTORE_H
#define SPACE_OBJSTORE_H

#include <stdbool.h>
#include <stdint.h>

#include "bus.h"
#include "hash.h"

#define SP_OBJ_CHUNK_BYTES (256 * 1024)
#define SP_OBJ_NAME_MAX    512
#define SP_OBJ_NUID_LEN    22

typedef struct {
    uint64_t size;
    uint32_t chunks;
    uint8_t sha256[SP_SHA256_LEN];
    char nuid[SP_OBJ_NUID_LEN + 1];
} sp_obj_info_t;

/* A bucket name: 1-64 of A-Z a-z 0-9 - _ (ADR-6 restricted-term). */
bool sp_obj_bucket_valid(const char *bucket);

/* Makes bucket's stream if it is missing (file storage, rollups and direct gets allowed,
 * discard new); an existing stream is left as it is. */
int sp_obj_bucket_ensure(sp_bus_t *bus, const char *bucket);

/* Stores what fd reads up to its end as object name (replacing an older object of that name,
 * whose chunks are purged once the new ObjectInfo is stored; a failed put leaves the older
 * object as it was). *ret_info (optional) describes what was stored. */
int sp_obj_put(sp_bus_t *bus, const char *bucket, const char *name, int fd,
               sp_obj_info_t *ret_info);

/* The ObjectInfo of name; SP_ENOTFOUND when there is none or it was deleted. */
int sp_obj_stat(sp_bus_t *bus, const char *bucket, const char *name, sp_obj_info_t *ret_info);

/* Writes object name to fd (from where fd is) after refusing one larger than max_size
 * (SP_ETOOBIG); -EBADMSG when a chunk is missing or the bytes do not match the ObjectInfo's
 * size and SHA-256 (fd then holds a prefix: the caller discards it). */
int sp_obj_get(sp_bus_t *bus, const char *bucket, const char *name, uint64_t max_size, int fd,
               sp_obj_info_t *ret_info);

/* Calls cb with the name of every object in bucket that is not deleted (from the stream's
 * per-subject state: one request; names that do not decode are skipped). cb returns 0 to go
 * on. The names are borrowed for the call. */
typedef int (*sp_obj_list_cb)(void *arg, const char *name);
int sp_obj_list(sp_bus_t *bus, const char *bucket, sp_obj_list_cb cb, void *arg);

/* Marks name deleted (an ObjectInfo with deleted: true) and purges its chunks. SP_ENOTFOUND
 * when there is no such object. */
int sp_obj_delete(sp_bus_t *bus, const char *bucket, const char *name);

#endif
