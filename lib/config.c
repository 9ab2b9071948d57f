/* Table-driven configuration: flags > environment > config file > default.
 *
 * Everything is collected first and converted once per option, from the one source that wins,
 * so a bad value is reported with the place it came from, and a value that is overridden is
 * never looked at. Integers are strict base-10 and range-checked; nothing is clamped.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "xmalloc.h"

/* A config file line longer than this is an error, not something to allocate for. */
#define FILE_LINE_MAX 4096

typedef enum { SRC_FLAG, SRC_ENV, SRC_FILE, SRC_DEFAULT } source_t;

/* What was collected before conversion. flag[] points into argv; file[] is owned. */
typedef struct {
    const char **flag;
    char **file;
    unsigned *file_line;
    const char *file_path;
} collected_t;

static int fail(char **ret_err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(char **ret_err, const char *fmt, ...)
{
    if (ret_err) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        *ret_err = sp_xstrdup(msg);
    }
    return -EINVAL;
}

static long find_opt(const sp_cfg_opt_t *table, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(table[i].name) == len && memcmp(table[i].name, name, len) == 0)
            return (long)i;
    return -1;
}

/* "nats-url" -> "SPACE_NATS_URL". */
static char *env_name(const char *name)
{
    char *s = sp_xasprintf("SPACE_%s", name);

    for (char *p = s + 6; *p; p++)
        *p = (char)(*p == '-' ? '_' : toupper((unsigned char)*p));
    return s;
}

static const char *type_name(sp_cfg_type_t type)
{
    switch (type) {
    case SP_CFG_STR:
        return "STR";
    case SP_CFG_INT:
        return "INT";
    case SP_CFG_BOOL:
        return "BOOL";
    }
    return "?";
}

/* Strict base 10: an optional '-', digits, nothing else (strtoll alone would accept leading
 * spaces, a '+', and stop silently at trailing junk). */
static int parse_int(const char *s, int64_t *ret_v)
{
    char *end;
    long long v;

    if (!(*s == '-' || isdigit((unsigned char)*s)))
        return -EINVAL;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (end == s || *end != '\0')
        return -EINVAL;
    if (errno == ERANGE)
        return -ERANGE;
    *ret_v = v;
    return 0;
}

static int parse_bool(const char *s, bool *ret_v)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};

    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *ret_v = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *ret_v = false;
            return 0;
        }
    }
    return -EINVAL;
}

/* Converts val into the field; on error writes the reason into why. */
static int set_value(const sp_cfg_opt_t *o, void *cfg, const char *val, char *why, size_t whylen)
{
    char *field = (char *)cfg + o->offset;
    int64_t i;
    bool b;
    int r;

    switch (o->type) {
    case SP_CFG_STR: {
        char **p = (char **)(void *)field;
        free(*p);
        *p = sp_xstrdup(val ? val : "");
        return 0;
    }
    case SP_CFG_INT:
        r = parse_int(val ? val : "0", &i);
        if (r == -ERANGE) {
            snprintf(why, whylen, "does not fit in 64 bits");
            return r;
        }
        if (r < 0) {
            snprintf(why, whylen, "is not a base-10 integer");
            return r;
        }
        if (i < o->min || i > o->max) {
            snprintf(why, whylen, "is out of range [%lld, %lld]", (long long)o->min,
                     (long long)o->max);
            return -ERANGE;
        }
        *(int64_t *)(void *)field = i;
        return 0;
    case SP_CFG_BOOL:
        if (parse_bool(val ? val : "false", &b) < 0) {
            snprintf(why, whylen, "is not a boolean (true/false, 1/0, yes/no, on/off)");
            return -EINVAL;
        }
        *(bool *)(void *)field = b;
        return 0;
    }
    snprintf(why, whylen, "has an unknown type in the option table");
    return -EINVAL;
}

static char *trim(char *s)
{
    char *e;

    while (isspace((unsigned char)*s))
        s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        e--;
    *e = '\0';
    return s;
}

/* "name = value" lines; blank lines and lines whose first non-blank character is '#' are
 * skipped. A '#' later in a line is part of the value (URLs and passwords contain them). */
static int load_file(const sp_cfg_opt_t *table, size_t n, collected_t *c, char **ret_err)
{
    FILE *f;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned lineno = 0;
    int r = 0;

    f = fopen(c->file_path, "re");
    if (!f)
        return fail(ret_err, "config file %s: %s", c->file_path, strerror(errno));
    while ((len = getline(&line, &cap, f)) >= 0) {
        char *s, *eq, *name, *value;
        long k;

        lineno++;
        if ((size_t)len > FILE_LINE_MAX) {
            r = fail(ret_err, "%s:%u: line longer than %d bytes", c->file_path, lineno,
                     FILE_LINE_MAX);
            goto out;
        }
        if (strlen(line) != (size_t)len) {
            r = fail(ret_err, "%s:%u: NUL byte in line", c->file_path, lineno);
            goto out;
        }
        s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        eq = strchr(s, '=');
        if (!eq) {
            r = fail(ret_err, "%s:%u: expected 'name = value'", c->file_path, lineno);
            goto out;
        }
        *eq = '\0';
        name = trim(s);
        value = trim(eq + 1);
        k = find_opt(table, n, name, strlen(name));
        if (k < 0) {
            r = fail(ret_err, "%s:%u: unknown option '%.64s'", c->file_path, lineno, name);
            goto out;
        }
        if (c->file[k]) {
            r = fail(ret_err, "%s:%u: '%s' is already set on line %u", c->file_path, lineno, name,
                     c->file_line[k]);
            goto out;
        }
        c->file[k] = sp_xstrdup(value);
        c->file_line[k] = lineno;
    }
    if (ferror(f))
        r = fail(ret_err, "config file %s: read error: %s", c->file_path, strerror(errno));
out:
    free(line);
    fclose(f);
    return r;
}

int sp_config_load(const sp_cfg_opt_t *table, size_t n, void *cfg, int argc, char **argv,
                   int *ret_argi, char **ret_err)
{
    collected_t c = {0};
    const char *prog = argc > 0 && argv[0] ? argv[0] : "space";
    const char *config_flag = NULL;
    int i, r = 0;

    c.flag = sp_xcalloc(n, sizeof(*c.flag));
    c.file = sp_xcalloc(n, sizeof(*c.file));
    c.file_line = sp_xcalloc(n, sizeof(*c.file_line));

    /* argv[0] is the program. Options are long only: --name=value, --name value, and for a
     * BOOL a bare --name (which never takes the next argument, so "--verbose run" works). */
    for (i = argc > 0 ? 1 : 0; i < argc; i++) {
        const char *a = argv[i], *name, *eq, *val;
        size_t nlen;
        long k;

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break;
        if (a[1] != '-') {
            r = fail(ret_err, "unknown option '%.64s' (options are --name or --name=value)", a);
            goto out;
        }
        name = a + 2;
        eq = strchr(name, '=');
        nlen = eq ? (size_t)(eq - name) : strlen(name);
        val = eq ? eq + 1 : NULL;
        if (nlen == 4 && memcmp(name, "help", 4) == 0) {
            if (val) {
                r = fail(ret_err, "option '--help' takes no value");
                goto out;
            }
            sp_config_usage(stdout, prog, table, n);
            if (ret_argi)
                *ret_argi = -1;
            goto out;
        }
        k = find_opt(table, n, name, nlen);
        if (k < 0 && !(nlen == 6 && memcmp(name, "config", 6) == 0)) {
            r = fail(ret_err, "unknown option '--%.*s' (see --help)", (int)(nlen < 64 ? nlen : 64),
                     name);
            goto out;
        }
        if (!val) {
            if (k >= 0 && table[k].type == SP_CFG_BOOL) {
                val = "true";
            } else if (i + 1 < argc) {
                val = argv[++i];
            } else {
                r = fail(ret_err, "option '--%.*s' needs a value", (int)nlen, name);
                goto out;
            }
        }
        if (k < 0)
            config_flag = val;
        else
            c.flag[k] = val;
    }

    if (config_flag && !*config_flag) {
        r = fail(ret_err, "option '--config' needs a file name");
        goto out;
    }
    c.file_path = config_flag ? config_flag : getenv("SPACE_CONFIG");
    if (c.file_path && *c.file_path) {
        r = load_file(table, n, &c, ret_err);
        if (r < 0)
            goto out;
    }

    for (size_t k = 0; k < n; k++) {
        const sp_cfg_opt_t *o = &table[k];
        char *env = env_name(o->name);
        const char *val;
        source_t src;
        char why[128];

        if (c.flag[k]) {
            val = c.flag[k];
            src = SRC_FLAG;
        } else if ((val = getenv(env))) {
            src = SRC_ENV;
        } else if (c.file[k]) {
            val = c.file[k];
            src = SRC_FILE;
        } else {
            val = o->def;
            src = SRC_DEFAULT;
        }
        if (set_value(o, cfg, val, why, sizeof(why)) < 0) {
            const char *shown = val ? val : "";
            switch (src) {
            case SRC_FLAG:
                r = fail(ret_err, "option --%s: '%.128s' %s", o->name, shown, why);
                break;
            case SRC_ENV:
                r = fail(ret_err, "option %s: '%.128s' from environment %s %s", o->name, shown, env,
                         why);
                break;
            case SRC_FILE:
                r = fail(ret_err, "option %s: '%.128s' from %s:%u %s", o->name, shown, c.file_path,
                         c.file_line[k], why);
                break;
            case SRC_DEFAULT:
                r = fail(ret_err, "option %s: default '%.128s' %s", o->name, shown, why);
                break;
            }
            free(env);
            goto out;
        }
        free(env);
    }
    if (ret_argi)
        *ret_argi = i;
out:
    for (size_t k = 0; k < n; k++)
        free(c.file[k]);
    free(c.flag);
    free(c.file);
    free(c.file_line);
    return r;
}

void sp_config_usage(FILE *out, const char *prog, const sp_cfg_opt_t *table, size_t n)
{
    int width = (int)strlen("--config=FILE");
    const char *slash = prog ? strrchr(prog, '/') : NULL;

    prog = slash ? slash + 1 : prog ? prog : "space";
    for (size_t k = 0; k < n; k++) {
        int w = (int)(strlen(table[k].name) + strlen(type_name(table[k].type)) + 3);
        if (table[k].type == SP_CFG_BOOL)
            w += 2;
        if (w > width && w <= 40)
            width = w;
    }
    fprintf(out, "Usage: %s [OPTIONS] [--] [ARGS]...\n\n", prog);
    fprintf(out, "Each option is also read from the environment (SPACE_NAME, upper case, '-' as "
                 "'_')\nand from the config file (\"name = value\"); flags win over the "
                 "environment,\nwhich wins over the file.\n\n");
    for (size_t k = 0; k < n; k++) {
        const sp_cfg_opt_t *o = &table[k];
        char *env = env_name(o->name);
        char *spec = o->type == SP_CFG_BOOL ? sp_xasprintf("--%s[=BOOL]", o->name)
                                            : sp_xasprintf("--%s=%s", o->name, type_name(o->type));

        fprintf(out, "  %-*s  %s", width, spec, o->help ? o->help : "");
        if (o->type == SP_CFG_INT)
            fprintf(out, " [%lld..%lld]", (long long)o->min, (long long)o->max);
        if (o->def && *o->def)
            fprintf(out, " (default: %s)", o->def);
        fprintf(out, " [%s]\n", env);
        free(spec);
        free(env);
    }
    fprintf(out, "  %-*s  %s\n", width, "--config=FILE", "read options from FILE [SPACE_CONFIG]");
    fprintf(out, "  %-*s  %s\n", width, "--help", "print this help and exit");
}

void sp_config_dispose(const sp_cfg_opt_t *table, size_t n, void *cfg)
{
    if (!cfg)
        return;
    for (size_t k = 0; k < n; k++) {
        if (table[k].type == SP_CFG_STR) {
            char **p = (char **)(void *)((char *)cfg + table[k].offset);
            free(*p);
            *p = NULL;
        }
    }
}

/* space.env files: KEY=VALUE lines where VALUE may be wrapped in single quotes (the writer
 * never puts a quote inside), blank lines and '#' comments. */
int sp_env_file_each(const char *path, int (*fn)(const char *key, const char *value, void *arg),
                     void *arg)
{
    FILE *f = fopen(path, "re");
    char line[8192];
    int rc = 0;

    if (!f)
        return -errno;
    while (rc >= 0 && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *eq = strchr(line, '=');
        if (line[0] == '#' || !eq || eq == line)
            continue;
        *eq = '\0';
        char *v = eq + 1;
        size_t vlen = strlen(v);
        if (vlen >= 2 && v[0] == '\'' && v[vlen - 1] == '\'') {
            v[vlen - 1] = '\0';
            v++;
        }
        rc = fn(line, v, arg);
    }
    fclose(f);
    return rc < 0 ? rc : 0;
}

static int export_one(const char *key, const char *value, void *arg)
{
    (void)arg;
    return setenv(key, value, 1) < 0 ? -errno : 0;
}

int sp_env_file_export(const char *path)
{
    return sp_env_file_each(path, export_one, NULL);
}

typedef struct {
    const char *key;
    char *value;
} env_get_t;

static int get_one(const char *key, const char *value, void *arg)
{
    env_get_t *g = arg;
    if (strcmp(key, g->key) != 0)
        return 0;
    free(g->value);
    g->value = sp_xstrdup(value);
    return 0;
}

int sp_env_file_get(const char *path, const char *key, char **ret_value)
{
    env_get_t g = {key, NULL};
    int rc = sp_env_file_each(path, get_one, &g);
    if (rc < 0)
        return rc;
    if (!g.value)
        return SP_ENOTFOUND;
    *ret_value = g.value;
    return 0;
}
