/* A growable byte buffer, and JSON text built into it.
 *
 * sp_buf_t is embedded by its owner: sp_buf_init / sp_buf_dispose. data is always
 * NUL-terminated (not counted in len) so text can be passed to C string APIs.
 */
#ifndef SPACE_BUF_H
#define SPACE_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} sp_buf_t;

void sp_buf_init(sp_buf_t *b);
void sp_buf_dispose(sp_buf_t *b);
void sp_buf_reset(sp_buf_t *b);
void sp_buf_append(sp_buf_t *b, const void *data, size_t len);
void sp_buf_puts(sp_buf_t *b, const char *s);
void sp_buf_putc(sp_buf_t *b, char c);
void sp_buf_printf(sp_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the heap string to the caller and leaves b empty. */
char *sp_buf_take(sp_buf_t *b);

/* Appends s as a JSON string literal (RFC 8259 section 7): quotes, backslash and control
 * characters escaped; bytes >= 0x80 are copied (callers pass UTF-8). NULL appends null. */
void sp_buf_json_str(sp_buf_t *b, const char *s);
/* The same for n bytes that may contain NUL (written as \u0000): e.g. command output. */
void sp_buf_json_strn(sp_buf_t *b, const void *data, size_t n);
/* Appends at most max bytes of s as text that is always valid UTF-8 without control
 * characters: valid UTF-8 sequences are copied, every other byte (a control character, a
 * stray or overlong sequence) becomes "\xNN". For bytes from the network that must be stored
 * or shown (a NATS subject, an error quoting one). */
void sp_buf_safe_text(sp_buf_t *b, const char *s, size_t max);
/* Appends bytes as lower-case hex. */
void sp_buf_hex(sp_buf_t *b, const uint8_t *data, size_t len);

#endif
