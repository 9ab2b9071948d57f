/* Structured logging: one line per event on stderr, `key=value` (default) or JSON.
 *
 *   sp_log(SP_LOG_INFO, "batch stored", SP_KU("n", n), SP_KS("corr", corr_id));
 *
 * prints
 *   ts=2026-11-29T23:59:01.123Z level=info daemon=space-eventlog msg="batch stored" n=42 corr=...
 * or with SP_LOG_JSON
 *   {"ts":"...","level":"info","daemon":"space-eventlog","msg":"batch stored","n":42,"corr":"..."}
 *
 * String values are escaped (quotes, backslashes, control bytes as \xNN / \u00NN), so a user
 * string cannot forge a field or a line. Thread-safe: a line is written with one write(2).
 * Library code logs at debug only (STYLE.md); daemons log once, with context.
 */
#ifndef SPACE_LOG_H
#define SPACE_LOG_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SP_LOG_DEBUG = 0, SP_LOG_INFO, SP_LOG_WARN, SP_LOG_ERROR } sp_log_level_t;
typedef enum { SP_LOG_KV = 0, SP_LOG_JSON } sp_log_format_t;

typedef enum { SP_KV_STR = 1, SP_KV_I64, SP_KV_U64, SP_KV_F64 } sp_kv_type_t;
typedef struct {
    const char *key;
    sp_kv_type_t type;
    union {
        const char *s;
        int64_t i;
        uint64_t u;
        double d;
    } v;
} sp_kv_t;

#define SP_KS(k, val) ((sp_kv_t){.key = (k), .type = SP_KV_STR, .v.s = (val)})
#define SP_KI(k, val) ((sp_kv_t){.key = (k), .type = SP_KV_I64, .v.i = (int64_t)(val)})
#define SP_KU(k, val) ((sp_kv_t){.key = (k), .type = SP_KV_U64, .v.u = (uint64_t)(val)})
#define SP_KF(k, val) ((sp_kv_t){.key = (k), .type = SP_KV_F64, .v.d = (double)(val)})

/* Sets the daemon name (borrowed: must outlive logging), minimum level and format. */
void sp_log_init(const char *daemon, sp_log_level_t min_level, sp_log_format_t format);
/* Parses "debug|info|warn|error" and "kv|json"; -EINVAL when unknown. */
int sp_log_level_parse(const char *s, sp_log_level_t *ret_level);
int sp_log_format_parse(const char *s, sp_log_format_t *ret_format);
int sp_log_enabled(sp_log_level_t level);

void sp_log_kv(sp_log_level_t level, const char *msg, const sp_kv_t *kv, size_t nkv);

/* A NULL string value prints as an empty string (kv) or null (JSON). */
#define sp_log(level, msg, ...)                                                                    \
    do {                                                                                           \
        if (sp_log_enabled(level)) {                                                               \
            const sp_kv_t sp_kv__[] = {{0}, ##__VA_ARGS__};                                        \
            sp_log_kv((level), (msg), sp_kv__ + 1, sizeof(sp_kv__) / sizeof(sp_kv__[0]) - 1);      \
        }                                                                                          \
    } while (0)

/* Longest line, '\n' included. A longer line is cut at a character boundary, its open string
 * closed and a final field truncated=true (kv) / "truncated":true (JSON) added. */
#define SP_LOG_LINE_MAX 8192

/* Writes the rendered line, '\n' included, into buf (for tests); returns the length it needed
 * (at most SP_LOG_LINE_MAX), like snprintf. A NULL daemon or msg prints as an empty string. */
size_t sp_log_format_line(char *buf, size_t len, sp_log_format_t format, const char *daemon,
                          sp_log_level_t level, const char *msg, const sp_kv_t *kv, size_t nkv);

#endif
