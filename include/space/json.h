/* A strict JSON parser (RFC 8259) for untrusted input: HTTP bodies, agent replies.
 *
 * Strict: no trailing commas, no comments, no leading zeros, no NaN/Infinity, only the escapes
 * the RFC lists, \u escapes must form valid UTF-16 (paired surrogates), the text must be valid
 * UTF-8, no "\u0000" (strings are handed out NUL-terminated), no duplicate keys in an object,
 * nothing but whitespace after the value. Every dimension is limited (sp_json_limits_t); a
 * violation is an error with the byte offset and a reason, never a crash or a partial result.
 *
 * A parsed document owns all its nodes (one allocation arena); nodes and strings are borrowed
 * from it and live until sp_json_doc_free. Not thread-safe per document; documents are
 * independent.
 *
 * Writing JSON: use sp_buf_json_str (buf.h) and sp_buf_printf.
 */
#ifndef SPACE_JSON_H
#define SPACE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SP_JSON_ERR_MAX 160

typedef enum {
    SP_JSON_NULL = 1,
    SP_JSON_BOOL,
    SP_JSON_NUMBER,
    SP_JSON_STRING,
    SP_JSON_ARRAY,
    SP_JSON_OBJECT,
} sp_json_type_t;

typedef struct sp_json sp_json_t;         /* a node */
typedef struct sp_json_doc sp_json_doc_t; /* a parsed document */

typedef struct {
    size_t max_bytes;  /* input length; 0 = 1 MiB */
    size_t max_depth;  /* nesting of arrays/objects; 0 = 32 */
    size_t max_nodes;  /* values in the document; 0 = 100000 */
    size_t max_string; /* bytes of one decoded string or key; 0 = 64 KiB */
} sp_json_limits_t;

/* Parses text[0..len) (need not be NUL-terminated). limits may be NULL (defaults).
 * Returns 0 and the document, or -EINVAL (syntax, UTF-8, duplicate key) / SP_ETOOBIG (a
 * limit) with err filled: "offset 17: expected ':' after object key". */
int sp_json_parse(const char *text, size_t len, const sp_json_limits_t *limits,
                  sp_json_doc_t **ret_doc, char err[SP_JSON_ERR_MAX]);
void sp_json_doc_free(sp_json_doc_t *doc);
const sp_json_t *sp_json_root(const sp_json_doc_t *doc);

/* Accessors accept NULL nodes and then answer "absent" (NULL, 0, false), so lookups chain:
 * sp_json_get(sp_json_get(root, "resources"), "vcpu"). */
sp_json_type_t sp_json_type(const sp_json_t *v); /* 0 for NULL */
/* Object member by key (exact bytes), NULL if absent or v is not an object. */
const sp_json_t *sp_json_get(const sp_json_t *v, const char *key);
/* Number of elements (array) or members (object); 0 otherwise. */
size_t sp_json_len(const sp_json_t *v);
/* Array element i or object member value i, in document order; NULL if out of range. */
const sp_json_t *sp_json_at(const sp_json_t *v, size_t i);
/* Object member key i; NULL if out of range or not an object. */
const char *sp_json_key_at(const sp_json_t *v, size_t i);
/* The decoded string (NUL-terminated, valid UTF-8) and its length; NULL if not a string. */
const char *sp_json_str(const sp_json_t *v, size_t *ret_len);
/* An integral number within [min, max] (no fraction, no exponent that leaves a fraction):
 * 0 and *ret; -EINVAL if not an integer, -ERANGE if outside. */
int sp_json_int(const sp_json_t *v, int64_t min, int64_t max, int64_t *ret);
/* Any number as a double; -EINVAL if not a number. */
int sp_json_double(const sp_json_t *v, double *ret);
/* -EINVAL if not a boolean. */
int sp_json_bool(const sp_json_t *v, bool *ret);

#endif
