/* Base64, RFC 4648 section 4 with padding: what the API uses for bytes that are not text. */
#ifndef SPACE_B64_H
#define SPACE_B64_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/* Appends the encoding of p[0..n) to out. */
void sp_b64_encode(sp_buf_t *out, const uint8_t *p, size_t n);
/* Strict: a multiple of 4 characters of the alphabet, padding only at the end, the unused bits
 * of the last group zero (one encoding per byte string). A new heap buffer (freed by the
 * caller) or -EINVAL. */
int sp_b64_decode(const char *s, size_t n, uint8_t **ret, size_t *ret_len);

/* The same with the URL and file name safe alphabet (RFC 4648 section 5: '-' and '_'),
 * padded: what NATS object stores use for object names and digests. */
void sp_b64url_encode(sp_buf_t *out, const uint8_t *p, size_t n);
int sp_b64url_decode(const char *s, size_t n, uint8_t **ret, size_t *ret_len);

#endif
