/* The metrics registry and its text writer (metrics.h). The exposition format is Prometheus'
 * text format 0.0.4: "# HELP name text", "# TYPE name type", then one sample per line,
 * name{label="value",...} value. In HELP text backslash and newline are escaped; in label
 * values backslash, double quote and newline. */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "xmalloc.h"

struct sp_series {
    struct sp_series *next;
    char *values[SP_METRICS_LABELS_MAX];
    /* Counters and gauges: the double's bits, so that updates are lock-free. */
    _Atomic uint64_t bits;
    /* Histograms: buckets[n_bounds + 1] (the last is +Inf), not cumulative; under mu. */
    pthread_mutex_t mu;
    uint64_t *buckets;
    const double *bounds; /* the family's */
    size_t n_bounds;
    double sum;
    uint64_t count;
};

struct sp_metric {
    struct sp_metric *next;
    sp_metric_type_t type;
    char *name, *help;
    size_t n_labels;
    char *labels[SP_METRICS_LABELS_MAX];
    double *bounds;
    size_t n_bounds, max_series;
    pthread_mutex_t mu; /* the series list */
    sp_series_t *series, *last;
    size_t n_series;
};

typedef struct collector {
    struct collector *next;
    sp_metrics_collect_fn fn;
    void *arg;
} collector_t;

struct sp_metrics {
    pthread_mutex_t mu; /* the family and collector lists */
    pthread_mutex_t scrape_mu;
    sp_metric_t *families, *last;
    collector_t *collectors, *last_collector;
};

static uint64_t to_bits(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof(b));
    return b;
}

static double from_bits(uint64_t b)
{
    double v;
    memcpy(&v, &b, sizeof(v));
    return v;
}

sp_metrics_t *sp_metrics_new(void)
{
    sp_metrics_t *r = sp_xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->scrape_mu, NULL);
    return r;
}

static void series_free(sp_series_t *s, size_t n_labels)
{
    for (size_t i = 0; i < n_labels; i++)
        free(s->values[i]);
    free(s->buckets);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void metric_free(sp_metric_t *m)
{
    sp_series_t *s = m->series;
    while (s) {
        sp_series_t *next = s->next;
        series_free(s, m->n_labels);
        s = next;
    }
    for (size_t i = 0; i < m->n_labels; i++)
        free(m->labels[i]);
    free(m->name);
    free(m->help);
    free(m->bounds);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void sp_metrics_free(sp_metrics_t *r)
{
    if (!r)
        return;
    sp_metric_t *m = r->families;
    while (m) {
        sp_metric_t *next = m->next;
        metric_free(m);
        m = next;
    }
    collector_t *c = r->collectors;
    while (c) {
        collector_t *next = c->next;
        free(c);
        c = next;
    }
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->scrape_mu);
    free(r);
}

/* [a-zA-Z_:][a-zA-Z0-9_:]* for metric names; label names without ':' and not "__"-prefixed
 * (reserved), nor "le" (the histogram's). */
static bool valid_name(const char *s, size_t len, bool label)
{
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (!label && c == ':') || (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    if (label &&
        ((len >= 2 && s[0] == '_' && s[1] == '_') || (len == 2 && memcmp(s, "le", 2) == 0)))
        return false;
    return true;
}

/* Valid UTF-8 (no overlongs, no surrogates), non-empty, at most SP_METRICS_VALUE_MAX bytes. */
static bool valid_value(const char *s)
{
    size_t len = s ? strlen(s) : 0;
    if (len == 0 || len > SP_METRICS_VALUE_MAX)
        return false;
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        unsigned c = *p;
        size_t n;
        unsigned cp;
        if (c < 0x80) {
            p++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            n = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if ((size_t)(end - p) <= n)
            return false;
        for (size_t i = 1; i <= n; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        p += n + 1;
    }
    return true;
}

sp_metric_t *sp_metrics_add(sp_metrics_t *r, sp_metric_type_t type, const char *name,
                            const char *help, const char *labels, const double *bounds,
                            size_t n_bounds, size_t max_series)
{
    if (!r || !name || !valid_name(name, strlen(name), false) || !help || max_series == 0)
        return NULL;
    if (type != SP_METRIC_COUNTER && type != SP_METRIC_GAUGE && type != SP_METRIC_HISTOGRAM)
        return NULL;
    if (type == SP_METRIC_HISTOGRAM) {
        if (!bounds || n_bounds == 0 || n_bounds > SP_METRICS_BUCKETS_MAX)
            return NULL;
        for (size_t i = 0; i < n_bounds; i++)
            if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1]))
                return NULL;
    } else if (n_bounds) {
        return NULL;
    }
    sp_metric_t *m = sp_xcalloc(1, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
    m->type = type;
    m->name = sp_xstrdup(name);
    m->help = sp_xstrdup(help);
    m->max_series = max_series;
    for (const char *p = labels; p && *p;) {
        size_t k = strcspn(p, ",");
        if (m->n_labels == SP_METRICS_LABELS_MAX || !valid_name(p, k, true)) {
            metric_free(m);
            return NULL;
        }
        m->labels[m->n_labels++] = sp_xstrndup(p, k);
        p += k;
        p += *p == ',';
    }
    if (type == SP_METRIC_HISTOGRAM) {
        m->bounds = sp_xcalloc(n_bounds, sizeof(double));
        memcpy(m->bounds, bounds, n_bounds * sizeof(double));
        m->n_bounds = n_bounds;
    }
    if (m->n_labels == 0 && !sp_metric_series(m, NULL)) {
        metric_free(m);
        return NULL;
    }
    pthread_mutex_lock(&r->mu);
    if (r->last)
        r->last->next = m;
    else
        r->families = m;
    r->last = m;
    pthread_mutex_unlock(&r->mu);
    return m;
}

static bool series_is(const sp_series_t *s, size_t n, const char *const *values)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s->values[i], values[i]) != 0)
            return false;
    return true;
}

sp_series_t *sp_metric_series(sp_metric_t *m, const char *const *values)
{
    if (!m)
        return NULL;
    size_t nl = m->n_labels; /* fixed at sp_metrics_add */
    if (nl && !values)
        return NULL;
    for (size_t i = 0; i < nl; i++)
        if (!valid_value(values[i]))
            return NULL;
    sp_series_t *s;
    pthread_mutex_lock(&m->mu);
    for (s = m->series; s; s = s->next)
        if (series_is(s, nl, values))
            goto out;
    if (m->n_series == m->max_series)
        goto out; /* s is NULL */
    s = sp_xcalloc(1, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    for (size_t i = 0; i < nl; i++)
        s->values[i] = sp_xstrdup(values[i]);
    atomic_init(&s->bits, to_bits(0));
    if (m->type == SP_METRIC_HISTOGRAM) {
        s->buckets = sp_xcalloc(m->n_bounds + 1, sizeof(uint64_t));
        s->bounds = m->bounds;
        s->n_bounds = m->n_bounds;
    }
    if (m->last)
        m->last->next = s;
    else
        m->series = s;
    m->last = s;
    m->n_series++;
out:
    pthread_mutex_unlock(&m->mu);
    return s;
}

sp_series_t *sp_metric_series1(sp_metric_t *m, const char *value)
{
    const char *v[1] = {value};
    return m && m->n_labels == 1 ? sp_metric_series(m, v) : NULL;
}

sp_series_t *sp_metric_only(sp_metric_t *m)
{
    return m && m->n_labels == 0 ? sp_metric_series(m, NULL) : NULL;
}

void sp_metric_reset(sp_metric_t *m)
{
    if (!m || m->n_labels == 0)
        return;
    pthread_mutex_lock(&m->mu);
    sp_series_t *s = m->series;
    m->series = m->last = NULL;
    m->n_series = 0;
    pthread_mutex_unlock(&m->mu);
    while (s) {
        sp_series_t *next = s->next;
        series_free(s, m->n_labels);
        s = next;
    }
}

void sp_metric_remove(sp_metric_t *m, const char *const *values)
{
    if (!m || m->n_labels == 0 || !values)
        return;
    sp_series_t *found = NULL, *prev = NULL;
    pthread_mutex_lock(&m->mu);
    for (sp_series_t *s = m->series; s; prev = s, s = s->next) {
        if (series_is(s, m->n_labels, values)) {
            found = s;
            if (prev)
                prev->next = s->next;
            else
                m->series = s->next;
            if (m->last == s)
                m->last = prev;
            m->n_series--;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (found)
        series_free(found, m->n_labels);
}

void sp_series_add(sp_series_t *s, double v)
{
    if (!s || !(v >= 0))
        return;
    uint64_t old = atomic_load(&s->bits);
    while (!atomic_compare_exchange_weak(&s->bits, &old, to_bits(from_bits(old) + v)))
        ;
}

void sp_series_inc(sp_series_t *s)
{
    sp_series_add(s, 1);
}

void sp_series_set(sp_series_t *s, double v)
{
    if (s)
        atomic_store(&s->bits, to_bits(v));
}

double sp_series_value(const sp_series_t *s)
{
    return s ? from_bits(atomic_load(&((sp_series_t *)s)->bits)) : 0;
}

void sp_series_observe(sp_series_t *s, double v)
{
    if (!s || !s->buckets || isnan(v))
        return;
    /* The first bucket whose upper bound is >= v ("le": less or equal); else +Inf. */
    size_t i = 0;
    while (i < s->n_bounds && v > s->bounds[i])
        i++;
    pthread_mutex_lock(&s->mu);
    s->buckets[i]++;
    s->sum += v;
    s->count++;
    pthread_mutex_unlock(&s->mu);
}

void sp_metrics_on_collect(sp_metrics_t *r, sp_metrics_collect_fn fn, void *arg)
{
    if (!r || !fn)
        return;
    collector_t *c = sp_xcalloc(1, sizeof(*c));
    c->fn = fn;
    c->arg = arg;
    pthread_mutex_lock(&r->mu);
    if (r->last_collector)
        r->last_collector->next = c;
    else
        r->collectors = c;
    r->last_collector = c;
    pthread_mutex_unlock(&r->mu);
}

void sp_metrics_escape(sp_buf_t *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            sp_buf_puts(out, "\\\\");
        else if (*s == '"')
            sp_buf_puts(out, "\\\"");
        else if (*s == '\n')
            sp_buf_puts(out, "\\n");
        else
            sp_buf_putc(out, *s);
    }
}

/* HELP text: backslash and newline escaped (the format's rule for docstrings). */
static void escape_help(sp_buf_t *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            sp_buf_puts(out, "\\\\");
        else if (*s == '\n')
            sp_buf_puts(out, "\\n");
        else
            sp_buf_putc(out, *s);
    }
}

/* Integers exactly (below 2^53), other values with 15 significant digits, and the format's
 * spellings of the non-finite ones. No libm: the library does not link it (at -O0 floor() and
 * fabs() are calls, not builtins). */
static void put_value(sp_buf_t *out, double v)
{
    if (isnan(v))
        sp_buf_puts(out, "NaN");
    else if (isinf(v))
        sp_buf_puts(out, v > 0 ? "+Inf" : "-Inf");
    else if (v > -9007199254740992.0 && v < 9007199254740992.0 && v == (double)(int64_t)v)
        sp_buf_printf(out, "%.0f", v);
    else
        sp_buf_printf(out, "%.15g", v);
}

/* name{a="x",b="y"[,le="..."]} */
static void put_name(sp_buf_t *out, const sp_metric_t *m, const sp_series_t *s, const char *suffix,
                     const char *le)
{
    sp_buf_puts(out, m->name);
    sp_buf_puts(out, suffix);
    if (m->n_labels == 0 && !le)
        return;
    sp_buf_putc(out, '{');
    for (size_t i = 0; i < m->n_labels; i++) {
        sp_buf_printf(out, "%s%s=\"", i ? "," : "", m->labels[i]);
        sp_metrics_escape(out, s->values[i]);
        sp_buf_putc(out, '"');
    }
    if (le)
        sp_buf_printf(out, "%sle=\"%s\"", m->n_labels ? "," : "", le);
    sp_buf_putc(out, '}');
}

static void write_histogram(sp_buf_t *out, const sp_metric_t *m, sp_series_t *s)
{
    uint64_t buckets[SP_METRICS_BUCKETS_MAX + 1], count;
    double sum;
    pthread_mutex_lock(&s->mu);
    memcpy(buckets, s->buckets, (m->n_bounds + 1) * sizeof(uint64_t));
    sum = s->sum;
    count = s->count;
    pthread_mutex_unlock(&s->mu);
    uint64_t cum = 0;
    for (size_t i = 0; i <= m->n_bounds; i++) {
        char le[32];
        cum += buckets[i];
        if (i < m->n_bounds)
            snprintf(le, sizeof(le), "%g", m->bounds[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        put_name(out, m, s, "_bucket", le);
        sp_buf_printf(out, " %llu\n", (unsigned long long)cum);
    }
    put_name(out, m, s, "_sum", NULL);
    sp_buf_putc(out, ' ');
    put_value(out, sum);
    sp_buf_putc(out, '\n');
    put_name(out, m, s, "_count", NULL);
    sp_buf_printf(out, " %llu\n", (unsigned long long)count);
}

static const char *type_name(sp_metric_type_t t)
{
    return t == SP_METRIC_COUNTER ? "counter" : t == SP_METRIC_GAUGE ? "gauge" : "histogram";
}

void sp_metrics_write(sp_metrics_t *r, sp_buf_t *out)
{
    pthread_mutex_lock(&r->mu);
    sp_metric_t *first = r->families;
    pthread_mutex_unlock(&r->mu);
    /* Families are only appended, never removed before sp_metrics_free: the list from first
     * on is stable without the lock (next pointers are written before last moves, under mu;
     * taken again per family below). */
    for (sp_metric_t *m = first; m;) {
        sp_buf_printf(out, "# HELP %s ", m->name);
        escape_help(out, m->help);
        sp_buf_printf(out, "\n# TYPE %s %s\n", m->name, type_name(m->type));
        pthread_mutex_lock(&m->mu);
        for (sp_series_t *s = m->series; s; s = s->next) {
            if (m->type == SP_METRIC_HISTOGRAM) {
                write_histogram(out, m, s);
                continue;
            }
            put_name(out, m, s, "", NULL);
            sp_buf_putc(out, ' ');
            put_value(out, from_bits(atomic_load(&s->bits)));
            sp_buf_putc(out, '\n');
        }
        pthread_mutex_unlock(&m->mu);
        pthread_mutex_lock(&r->mu);
        m = m->next;
        pthread_mutex_unlock(&r->mu);
    }
}

void sp_metrics_scrape(sp_metrics_t *r, sp_buf_t *out)
{
    pthread_mutex_lock(&r->scrape_mu);
    pthread_mutex_lock(&r->mu);
    collector_t *c = r->collectors;
    pthread_mutex_unlock(&r->mu);
    while (c) {
        c->fn(r, c->arg);
        pthread_mutex_lock(&r->mu);
        c = c->next;
        pthread_mutex_unlock(&r->mu);
    }
    sp_metrics_write(r, out);
    pthread_mutex_unlock(&r->scrape_mu);
}
