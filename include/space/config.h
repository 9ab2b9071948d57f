/* Table-driven configuration: each daemon describes its options once, and sp_config_load fills
 * one config struct from, in this precedence:
 *   1. command-line flags      --nats-url=URL or --nats-url URL
 *   2. environment             SPACE_NATS_URL   (upper case, '-' -> '_', prefix SPACE_)
 *   3. a config file           nats-url = URL   (path from --config or SPACE_CONFIG; '#' comments)
 *   4. the table's default
 * Every integer is range-checked against [min, max]; a bad value is an error naming the option
 * and where it came from, never a silent clamp.
 */
#ifndef SPACE_CONFIG_H
#define SPACE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    SP_CFG_STR = 1, /* char * (heap, owned by the struct; freed by sp_config_dispose) */
    SP_CFG_INT,     /* int64_t */
    SP_CFG_BOOL,    /* bool: true/false/1/0/yes/no/on/off; a bare flag --x means true */
} sp_cfg_type_t;

typedef struct {
    const char *name; /* "nats-url": flag --nats-url, env SPACE_NATS_URL, file key nats-url */
    sp_cfg_type_t type;
    size_t offset;    /* offsetof(daemon_config, field) */
    int64_t min, max; /* SP_CFG_INT only: inclusive range */
    const char *def;  /* default as text; NULL = empty string / 0 / false */
    const char *help;
} sp_cfg_opt_t;

#define SP_CFG_STR_OPT(n, st, f, d, h)                                                             \
    {                                                                                              \
        (n), SP_CFG_STR, offsetof(st, f), 0, 0, (d), (h)                                           \
    }
#define SP_CFG_INT_OPT(n, st, f, lo, hi, d, h)                                                     \
    {                                                                                              \
        (n), SP_CFG_INT, offsetof(st, f), (lo), (hi), (d), (h)                                     \
    }
#define SP_CFG_BOOL_OPT(n, st, f, d, h)                                                            \
    {                                                                                              \
        (n), SP_CFG_BOOL, offsetof(st, f), 0, 0, (d), (h)                                          \
    }

/* Loads cfg (which must be zeroed) from the sources above. Parsing stops at the first
 * argument that is not an option, or after "--"; *ret_argi (optional) gets that index, so
 * subcommands and positional arguments can follow. "--help" sets *ret_argi to -1 after printing
 * the usage to stdout, and leaves cfg as it was. On error returns -EINVAL and *ret_err
 * (optional, caller frees) says what is wrong, naming the option and where the value came from;
 * cfg then holds partial values and must still be disposed.
 *
 * "--config" and "--help" are built in; a table must not use those names. A bare "--x" for a
 * BOOL never takes the next argument. Unknown flags and unknown or repeated keys in the file
 * are errors. In the file, '#' starts a comment only as the first non-blank character of a line,
 * so values may contain '#'. A STR option always ends up as a heap string, never NULL. */
int sp_config_load(const sp_cfg_opt_t *table, size_t n, void *cfg, int argc, char **argv,
                   int *ret_argi, char **ret_err);
void sp_config_usage(FILE *out, const char *prog, const sp_cfg_opt_t *table, size_t n);
/* Frees the strings that sp_config_load allocated. */
void sp_config_dispose(const sp_cfg_opt_t *table, size_t n, void *cfg);

/* space.env files (written by `space up`): KEY=VALUE lines, VALUE optionally in single quotes,
 * '#' comments. sp_env_file_each calls fn for every pair (borrowed strings, valid during the
 * call) and stops at fn's first negative return; -errno when the file cannot be read. */
int sp_env_file_each(const char *path, int (*fn)(const char *key, const char *value, void *arg),
                     void *arg);
/* setenv()s every pair, replacing what the environment had. */
int sp_env_file_export(const char *path);
/* The value of key (heap, caller frees); SP_ENOTFOUND when absent. */
int sp_env_file_get(const char *path, const char *key, char **ret_value);

#endif
