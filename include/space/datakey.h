/* Data keys and captured output (docs/audit.md, "Nothing secret in the log"): every sandbox
 * has its own AES-256-GCM data key, wrapped by the deployment master key (cred.h) and kept in
 * the mutable table data_keys, never in an event, so destroying the row ("forget") makes the
 * sandbox's captured output unreadable while the chain, which hashes the ciphertext, still
 * verifies. Before a chunk of output is sealed, the known secret values (the command's
 * environment values) are replaced by "[redacted:NAME]", also when a value is split across
 * chunks (sp_redactor_t holds back the bytes that may start one).
 *
 * Nothing here logs; no function puts a key or a value into an error string. */
#ifndef SPACE_DATAKEY_H
#define SPACE_DATAKEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "cred.h"

#define SP_DATAKEY_WRAPPED_LEN (SP_CRED_KEY_LEN + SP_CRED_TAG_LEN)
#define SP_OUTPUT_AAD_MAX      256
#define SP_REDACT_MIN          4 /* shorter values are not redacted (they would match anything) */
#define SP_REDACT_VALUE_MAX    4096
#define SP_REDACT_VALUES_MAX   256

/* A fresh random data key (its id is its fingerprint, as for a master key). 0 or -EIO. */
int sp_datakey_generate(sp_cred_key_t *ret_dk);
/* Wraps dk under master for sandbox (the additional data names the sandbox, so a wrapped key
 * moved to another sandbox's row does not open): ret_wrapped gets SP_DATAKEY_WRAPPED_LEN. */
int sp_datakey_wrap(const sp_cred_key_t *master, const char *sandbox, const sp_cred_key_t *dk,
                    uint8_t ret_nonce[SP_CRED_NONCE_LEN],
                    uint8_t ret_wrapped[SP_DATAKEY_WRAPPED_LEN]);
/* -EBADMSG (another key, another sandbox, tampered, wrong length); then ret_dk is wiped. */
int sp_datakey_unwrap(const sp_cred_key_t *master, const char *sandbox,
                      const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *wrapped, size_t len,
                      sp_cred_key_t *ret_dk);

/* Captured output: sealed with the additional data "space-out:v1:<sandbox>:<cmd>:<stream>:
 * <offset>", so a chunk moved to another command, stream or place does not open. ret_ct gets
 * len + SP_CRED_TAG_LEN bytes. */
int sp_output_seal(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                   uint32_t stream, uint64_t offset, const uint8_t *pt, size_t len,
                   uint8_t ret_nonce[SP_CRED_NONCE_LEN], uint8_t *ret_ct);
/* ret_pt gets ct_len - SP_CRED_TAG_LEN bytes; -EBADMSG. */
int sp_output_open(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                   uint32_t stream, uint64_t offset, const uint8_t nonce[SP_CRED_NONCE_LEN],
                   const uint8_t *ct, size_t ct_len, uint8_t *ret_pt);

/* Command lines (docs/audit.md, "Sealed command lines"): a packed CommandLine (space.proto)
 * sealed with the additional data "space-cmd:v1:<sandbox>:<cmd>". Exactly one of argv (n > 0)
 * and cmd; argv entries past SP_COMMAND_LINE_SEALED_MAX packed bytes are left out and the line
 * marked truncated. *ret_ct is the caller's (free), *ret_ct_len bytes with the tag. 0, -EINVAL
 * or -EIO. The packed plaintext is wiped before it is freed. */
int sp_cmdline_seal(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                    char *const *argv, size_t n_argv, const char *cmd,
                    uint8_t ret_nonce[SP_CRED_NONCE_LEN], uint8_t **ret_ct, size_t *ret_ct_len);
/* Opens and unpacks: *ret_line is freed with space__v1__command_line__free_unpacked. -EBADMSG
 * (another key, sandbox or command, tampered, or not a CommandLine). */
struct Space__V1__CommandLine;
int sp_cmdline_open(const sp_cred_key_t *dk, const char *sandbox, const char *cmd_id,
                    const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *ct, size_t ct_len,
                    struct Space__V1__CommandLine **ret_line);

/* File paths (docs/audit.md, "Sealed file paths"): a packed FilePaths {path, to} sealed with
 * the additional data "space-path:v1:<sandbox>:<event type>"; to may be NULL (only FileMoved
 * has one). Same returns as sp_cmdline_seal; *ret_paths is freed with
 * space__v1__file_paths__free_unpacked. */
int sp_paths_seal(const sp_cred_key_t *dk, const char *sandbox, const char *type, const char *path,
                  const char *to, uint8_t ret_nonce[SP_CRED_NONCE_LEN], uint8_t **ret_ct,
                  size_t *ret_ct_len);
struct Space__V1__FilePaths;
int sp_paths_open(const sp_cred_key_t *dk, const char *sandbox, const char *type,
                  const uint8_t nonce[SP_CRED_NONCE_LEN], const uint8_t *ct, size_t ct_len,
                  struct Space__V1__FilePaths **ret_paths);

/* Redaction of known values from a stream of output. Values of fewer than SP_REDACT_MIN bytes
 * are ignored; the longest value matching at a place wins. */
typedef struct sp_redactor sp_redactor_t;
sp_redactor_t *sp_redactor_new(void);
/* Adds value (len bytes) under name (shown in the marker; [A-Za-z0-9_] is kept, anything else
 * becomes '_'). Returns false when it was ignored (too short, too long, too many). */
bool sp_redactor_add(sp_redactor_t *r, const char *name, const void *value, size_t len);
/* Adds every "NAME=VALUE" of env. */
void sp_redactor_add_env(sp_redactor_t *r, char *const *env, size_t n);
/* Feeds len bytes and appends to out what can no longer be part of a value: the bytes that
 * may begin a value are held back until the next feed or the flush. */
void sp_redactor_feed(sp_redactor_t *r, const void *data, size_t len, sp_buf_t *out);
/* The end of the stream: what was held back goes out (redacted where it holds a value). */
void sp_redactor_flush(sp_redactor_t *r, sp_buf_t *out);
/* Bytes currently held back. */
size_t sp_redactor_held(const sp_redactor_t *r);
/* Wipes the values and what is held, and frees. NULL is fine. */
void sp_redactor_free(sp_redactor_t *r);

#endif
