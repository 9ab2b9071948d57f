/* The event envelope (proto/space.proto): encode, decode with limits, validate, subjects.
 *
 * Everything read from the bus is untrusted: sp_envelope_decode checks the size before
 * unpacking and validates every field after; a failure comes back with a reason string fit for
 * a "...Rejected" record.
 */
#ifndef SPACE_ENVELOPE_H
#define SPACE_ENVELOPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "space.pb-c.h"

typedef Space__V1__Envelope sp_envelope_t;
typedef Space__V1__Envelope__PayloadCase sp_event_type_t;

#define SP_ENVELOPE_MAX   (64 * 1024)
#define SP_SCHEMA_VERSION 1
#define SP_REASON_MAX     256
/* Largest data of one CommandOutput audit event. */
#define SP_COMMAND_OUTPUT_CHUNK_MAX (16 * 1024)
/* A short command's CommandExited carrying its start and output (space.proto): at most this
 * many CommandOutput, and this many bytes of sealed command line and output together. */
#define SP_COMMAND_EXITED_OUTPUT_MAX 4
#define SP_COMMAND_EXITED_CARRY_MAX  (32 * 1024)
/* Largest packed CommandLine sealed into a CommandStarted (docs/audit.md): longer argv lists
 * are cut at an entry and marked truncated, so the event stays under SP_ENVELOPE_MAX. */
#define SP_COMMAND_LINE_SEALED_MAX (48 * 1024)
/* Largest packed FilePaths sealed into a file event: two paths of SP_FSPATH_MAX and their
 * tags. */
#define SP_FILE_PATHS_SEALED_MAX (2 * 4096 + 16)

/* Type name of a payload case ("SandboxPlaced"); NULL for an unknown case. */
const char *sp_event_type_name(sp_event_type_t t);
/* Payload case for a type name; SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET when unknown. */
sp_event_type_t sp_event_type_from_name(const char *name);

/* Whether an event type is about a worker (else about a sandbox). */
int sp_event_is_worker(sp_event_type_t t);
/* egressd's facts (NetworkPolicyChanged, EgressAllowed, EgressDenied): about a sandbox, on
 * space.ev.egress.<sandbox>.<type>, so no worker's consumer has to skip them. */
int sp_event_is_egress(sp_event_type_t t);
/* Credentials (CredentialCreated, ...Rotated, ...Deleted, ...Used, ...Denied): aggregate kind
 * "credential", on space.ev.cred.<tenant>.<type>; no projection follows them (the log keeps
 * them). */
int sp_event_is_cred(sp_event_type_t t);
/* What happens inside a running sandbox (Command*, File*, DirCreated): on
 * space.ev.io.<worker|_>.<sandbox>.<type>, so that the consumers of a worker's sandbox
 * subjects (the worker, its egressd) do not receive and acknowledge four events per command
 * that none of them acts on. The event log takes everything. */
int sp_event_is_io(sp_event_type_t t);

/* Fills the envelope's generated fields: a fresh UUIDv7 event_id (stored in id_buf, which the
 * envelope then borrows), occurred_at now, schema_version, and type from the payload case. */
void sp_envelope_stamp(sp_envelope_t *env, char id_buf[37]);

/* Encodes into a heap buffer (caller frees). -E2BIG (SP_ETOOBIG) if over SP_ENVELOPE_MAX;
 * SP_ESCHEMA if the envelope would not pass sp_envelope_validate. */
int sp_envelope_encode(const sp_envelope_t *env, uint8_t **ret_buf, size_t *ret_len);

/* Size check, unpack, validate. On failure returns SP_ETOOBIG / SP_EDECODE / SP_ESCHEMA /
 * SP_ETYPE / SP_EVERSION and writes a one-line reason into reason (SP_REASON_MAX bytes). On
 * success *ret_env must be freed with sp_envelope_free. */
int sp_envelope_decode(const uint8_t *buf, size_t len, sp_envelope_t **ret_env,
                       char reason[SP_REASON_MAX]);
void sp_envelope_free(sp_envelope_t *env);

/* Checks the wire form of a message that protobuf-c has unpacked: no field numbered 0 or
 * above 2^29-1, no string field holding a NUL byte, messages nested at most 32 deep. These
 * are what protobuf-c accepts but cannot pack back to the same meaning. SP_EDECODE and a
 * reason naming the message and field, or 0. */
int sp_proto_wire_check(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                        char reason[SP_REASON_MAX]);

/* Schema validation of a decoded envelope: ids, lengths, type matches the payload case,
 * aggregate kind matches the type, payload fields within limits. */
int sp_envelope_validate(const sp_envelope_t *env, char reason[SP_REASON_MAX]);

/* With sealing required (docs/audit.md, the event log's seal-output): what of a valid
 * envelope is user content in plaintext that should have been sealed ("command output": a
 * CommandOutput with data; "command line": a CommandRequested that is not sealed; "file
 * path": a file event with its path in the clear), or NULL. */
const char *sp_envelope_plaintext_content(const sp_envelope_t *env);

/* The paths of a file event (FileWritten, FileRemoved, FileMoved, DirCreated): where its
 * path (FileMoved: from), its destination (FileMoved: to, else NULL) and its sealed form are,
 * so that one sealing and one reading serve the four types. false for other events. */
typedef struct {
    char **path;
    char **to;
    Space__V1__SealedPaths **sealed;
} sp_file_paths_t;
bool sp_envelope_file_paths(sp_envelope_t *env, sp_file_paths_t *ret);

/* The subject an envelope is published on (proto/README.md). worker may be NULL or "" for "_".
 * Returns the length, or SP_ESCHEMA if a token is not a valid id. */
int sp_envelope_subject(const sp_envelope_t *env, const char *worker, char *buf, size_t len);

/* Checks that the subject a message arrived on agrees with its envelope (kind, ids, type), so a
 * publisher cannot smuggle an event for one sandbox onto another's subject. */
int sp_envelope_check_subject(const sp_envelope_t *env, const char *subject,
                              char reason[SP_REASON_MAX]);

/* The canonical bytes of an encoded envelope, which its signature covers: raw exactly as
 * received, with every record of fields 11-14 (signature, sig_proof, sig_index, sig_count: what
 * signing adds, sign.h) removed and every other record, unknown
 * ones included, kept in place. Verifying over the received bytes rather than a re-encoding
 * means that fields this build does not know (added by a newer producer) stay signed, and
 * that nothing depends on protobuf-c packing the same way as the signer's (it drops unknown
 * fields when it packs). out must hold len bytes; *ret_len gets the canonical length.
 * SP_EDECODE when raw is not a sequence of well-formed protobuf records. */
int sp_envelope_canonical(const uint8_t *raw, size_t len, uint8_t *out, size_t *ret_len);

/* Appends the envelope as one JSON object: proto field names, 64-bit integers as numbers,
 * bytes as hex, only the payload case that is set. */
void sp_envelope_to_json(const sp_envelope_t *env, sp_buf_t *out);

#endif
