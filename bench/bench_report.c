/* The numbers of a bench as a person and a program read them: percentiles, the table per
 * operation, every sample as JSON, and the SVG plot (bench.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "buf.h"
#include "xmalloc.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_pct(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    /* Nearest rank (the value at or above the p-th percent of the sample). */
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return v[k == 0 ? 0 : k - 1];
}

void bench_op_stats(const char *op, const bench_sample_t *s, size_t n, double wall_s,
                    bench_op_stats_t *ret)
{
    double *v = sp_xcalloc(n ? n : 1, sizeof(double));
    size_t k = 0;
    memset(ret, 0, sizeof(*ret));
    for (size_t i = 0; i < n; i++) {
        if (strcmp(s[i].op, op) != 0)
            continue;
        ret->n++;
        if (s[i].error)
            ret->errors++;
        else
            v[k++] = s[i].latency_ms;
    }
    /* Percentiles of the operations that succeeded: a fast refusal is not a fast operation. */
    ret->p50 = bench_pct(v, k, 50);
    ret->p90 = bench_pct(v, k, 90);
    ret->p99 = bench_pct(v, k, 99);
    ret->max = bench_pct(v, k, 100);
    ret->rate = wall_s > 0 ? (double)ret->n / wall_s : 0;
    free(v);
}

void bench_report_table(FILE *out, const char *const *ops, size_t n_ops, const bench_sample_t *s,
                        size_t n, double wall_s)
{
    fprintf(out, "  %-18s %6s %6s %9s %9s %9s %9s %8s\n", "operation", "n", "errors", "p50 ms",
            "p90 ms", "p99 ms", "max ms", "rate/s");
    for (size_t o = 0; o < n_ops; o++) {
        bench_op_stats_t st;
        bench_op_stats(ops[o], s, n, wall_s, &st);
        if (st.n == 0)
            continue;
        if (st.n == st.errors) /* no latency to show */
            fprintf(out, "  %-18s %6zu %6zu %9s %9s %9s %9s %8.2f\n", ops[o], st.n, st.errors, "-",
                    "-", "-", "-", st.rate);
        else
            fprintf(out, "  %-18s %6zu %6zu %9.1f %9.1f %9.1f %9.1f %8.2f\n", ops[o], st.n,
                    st.errors, st.p50, st.p90, st.p99, st.max, st.rate);
    }
    /* Errors per operation and status, each once. */
    bool header = false;
    for (size_t i = 0; i < n; i++) {
        if (!s[i].error)
            continue;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = s[j].error && strcmp(s[j].op, s[i].op) == 0 && s[j].status == s[i].status &&
                   strcmp(s[j].error, s[i].error) == 0;
        if (seen)
            continue;
        size_t count = 0;
        for (size_t j = i; j < n; j++)
            count += s[j].error && strcmp(s[j].op, s[i].op) == 0 && s[j].status == s[i].status &&
                     strcmp(s[j].error, s[i].error) == 0;
        if (!header)
            fprintf(out, "\n  errors (operation, HTTP status or 0 for no answer, reason):\n");
        header = true;
        fprintf(out, "  %-18s %6d %-24s %6zu\n", s[i].op, s[i].status, s[i].error, count);
    }
}

/* b into a new file at path: 0, or -1. */
static int write_file(const char *path, const sp_buf_t *b)
{
    FILE *f = fopen(path, "w");
    int rc = 0;
    if (!f || fwrite(b->data, 1, b->len, f) != b->len)
        rc = -1;
    if (f && fclose(f) != 0)
        rc = -1;
    return rc;
}

/* A number JSON can hold: NaN (no sample) is null. */
static void json_num(sp_buf_t *b, double v)
{
    if (isnan(v))
        sp_buf_puts(b, "null");
    else
        sp_buf_printf(b, "%.3f", v);
}

int bench_report_json(const char *path, const char *run_json, const char *const *ops, size_t n_ops,
                      const bench_sample_t *s, size_t n, double wall_s)
{
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_printf(&b, "{\"run\":%s,\"wall_s\":%.3f,\"summary\":{", run_json, wall_s);
    bool first = true;
    for (size_t o = 0; o < n_ops; o++) {
        bench_op_stats_t st;
        bench_op_stats(ops[o], s, n, wall_s, &st);
        if (st.n == 0)
            continue;
        sp_buf_printf(&b, "%s", first ? "" : ",");
        first = false;
        sp_buf_json_str(&b, ops[o]);
        sp_buf_printf(&b, ":{\"n\":%zu,\"errors\":%zu,\"p50_ms\":", st.n, st.errors);
        json_num(&b, st.p50);
        sp_buf_puts(&b, ",\"p90_ms\":");
        json_num(&b, st.p90);
        sp_buf_puts(&b, ",\"p99_ms\":");
        json_num(&b, st.p99);
        sp_buf_puts(&b, ",\"max_ms\":");
        json_num(&b, st.max);
        sp_buf_printf(&b, ",\"rate_per_s\":%.3f}", st.rate);
    }
    sp_buf_puts(&b, "},\"samples\":[");
    for (size_t i = 0; i < n; i++) {
        sp_buf_printf(&b, "%s{\"op\":", i ? ",\n" : "\n");
        sp_buf_json_str(&b, s[i].op);
        sp_buf_printf(&b,
                      ",\"iteration\":%zu,\"start_ms\":%.3f,\"latency_ms\":%.3f,\"queued_ms\":%.3f,"
                      "\"status\":%d,\"error\":",
                      s[i].iteration, s[i].start_ms, s[i].latency_ms, s[i].queued_ms, s[i].status);
        sp_buf_json_str(&b, s[i].error); /* NULL: null */
        sp_buf_putc(&b, '}');
    }
    sp_buf_puts(&b, "\n]}\n");
    int rc = write_file(path, &b);
    sp_buf_dispose(&b);
    return rc;
}

/* ---- the plot ---- */

#define SVG_W      960
#define PANEL_H    220
#define MARGIN_L   80
#define MARGIN_R   170
#define MARGIN_TOP 70
#define PANEL_GAP  60
#define PLOT_W     (SVG_W - MARGIN_L - MARGIN_R)
#define PLOT_H     (PANEL_H - 40)
#define TICKS      5

/* Text for an SVG text node or attribute: the five XML specials escaped. */
static void xml_text(sp_buf_t *b, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&':
            sp_buf_puts(b, "&amp;");
            break;
        case '<':
            sp_buf_puts(b, "&lt;");
            break;
        case '>':
            sp_buf_puts(b, "&gt;");
            break;
        case '"':
            sp_buf_puts(b, "&quot;");
            break;
        case '\'':
            sp_buf_puts(b, "&apos;");
            break;
        default:
            if ((unsigned char)*s >= 0x20)
                sp_buf_putc(b, *s);
        }
    }
}

/* A tick step of 1, 2 or 5 times a power of ten that cuts [0, max] into about TICKS parts. */
static double nice_step(double max)
{
    if (!(max > 0))
        return 1;
    double raw = max / TICKS, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

static void svg_panel(sp_buf_t *b, int top, const char *op, const bench_sample_t *s, size_t n,
                      double wall_s)
{
    bench_op_stats_t st;
    bench_op_stats(op, s, n, wall_s, &st);
    double ymax = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].op, op) == 0 && s[i].latency_ms > ymax)
            ymax = s[i].latency_ms;
    ymax *= 1.05; /* the slowest point below the frame, not on it */
    double ystep = nice_step(ymax), xstep = nice_step(wall_s);
    ymax = ystep * ceil(ymax / ystep);
    double xmax = xstep * ceil(wall_s / xstep);
    if (!(ymax > 0))
        ymax = ystep;
    if (!(xmax > 0))
        xmax = xstep;
    int y0 = top + 30; /* the plot area's top */

    sp_buf_printf(b, "<g class=\"op\" id=\"op-");
    xml_text(b, op);
    sp_buf_printf(b, "\">\n<text x=\"%d\" y=\"%d\" class=\"h\">", MARGIN_L, top + 18);
    xml_text(b, op);
    sp_buf_printf(b,
                  "</text><text x=\"%d\" y=\"%d\" class=\"s\">n %zu, errors %zu, %.2f/s</text>\n",
                  MARGIN_L + 20 + 10 * (int)strlen(op), top + 18, st.n, st.errors, st.rate);
    /* Frame, grid and the axes' numbers. */
    sp_buf_printf(b,
                  "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" "
                  "stroke=\"#888\"/>\n",
                  MARGIN_L, y0, PLOT_W, PLOT_H);
    for (int t = 0; t * ystep <= ymax + ystep / 2; t++) {
        double v = t * ystep, y = y0 + PLOT_H - v / ymax * PLOT_H;
        sp_buf_printf(b,
                      "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" class=\"g\"/><text "
                      "x=\"%d\" y=\"%.1f\" class=\"ty\">%g</text>\n",
                      MARGIN_L, MARGIN_L + PLOT_W, y, y, MARGIN_L - 6, y + 4, v);
    }
    for (int t = 0; t * xstep <= xmax + xstep / 2; t++) {
        double v = t * xstep, x = MARGIN_L + v / xmax * PLOT_W;
        sp_buf_printf(b,
                      "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" class=\"g\"/><text "
                      "x=\"%.1f\" y=\"%d\" class=\"tx\">%g</text>\n",
                      x, x, y0, y0 + PLOT_H, x, y0 + PLOT_H + 16, v);
    }
    sp_buf_printf(b,
                  "<text x=\"%d\" y=\"%d\" class=\"a\">seconds since the run started "
                  "(operation start)</text>\n",
                  MARGIN_L + PLOT_W / 2, y0 + PLOT_H + 32);
    sp_buf_printf(b,
                  "<text transform=\"translate(%d,%d) rotate(-90)\" class=\"a\">latency "
                  "(ms)</text>\n",
                  MARGIN_L - 52, y0 + PLOT_H / 2);
    /* The percentile lines, labelled right of the plot. */
    static const char *const names[3] = {"p50", "p90", "p99"};
    static const char *const colors[3] = {"#2a9d3a", "#e08a00", "#c0392b"};
    double pv[3] = {st.p50, st.p90, st.p99};
    double label_y[3] = {1e9, 1e9, 1e9}; /* none yet: nothing to keep apart from */
    for (int k = 0; k < 3; k++) {
        if (isnan(pv[k]))
            continue;
        double y = y0 + PLOT_H - pv[k] / ymax * PLOT_H;
        /* Labels at least 14 px apart, p99 on top. */
        label_y[k] = y + 4;
        for (int j = 0; j < k; j++)
            if (label_y[k] > label_y[j] - 14)
                label_y[k] = label_y[j] - 14;
        sp_buf_printf(b,
                      "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                      "stroke-width=\"1.5\" stroke-dasharray=\"6 3\"/><text x=\"%d\" y=\"%.1f\" "
                      "fill=\"%s\" class=\"l\">%s %.1f ms</text>\n",
                      MARGIN_L, MARGIN_L + PLOT_W, y, y, colors[k], MARGIN_L + PLOT_W + 8,
                      label_y[k], colors[k], names[k], pv[k]);
    }
    /* The samples over the lines: one point each, errors as red crosses. */
    for (size_t i = 0; i < n; i++) {
        if (strcmp(s[i].op, op) != 0)
            continue;
        double x = MARGIN_L + s[i].start_ms / 1000.0 / xmax * PLOT_W;
        double y = y0 + PLOT_H - s[i].latency_ms / ymax * PLOT_H;
        if (s[i].error)
            sp_buf_printf(b, "<path d=\"M%.1f %.1fl6 6m0 -6l-6 6\" class=\"e\"/>\n", x - 3, y - 3);
        else
            sp_buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" class=\"p\"/>\n", x, y);
    }
    if (st.n == st.errors)
        sp_buf_printf(b, "<text x=\"%d\" y=\"%d\" class=\"s\">no operation succeeded</text>\n",
                      MARGIN_L + 10, y0 + 20);
    sp_buf_puts(b, "</g>\n");
}

int bench_report_svg(const char *path, const char *title, const char *const *ops, size_t n_ops,
                     const bench_sample_t *s, size_t n, double wall_s)
{
    size_t shown = 0;
    for (size_t o = 0; o < n_ops; o++) {
        bench_op_stats_t st;
        bench_op_stats(ops[o], s, n, wall_s, &st);
        shown += st.n > 0;
    }
    int h = MARGIN_TOP + (int)(shown ? shown : 1) * (PANEL_H + PANEL_GAP);
    sp_buf_t b;
    sp_buf_init(&b);
    sp_buf_printf(&b,
                  "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                  "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
                  "<style>.h{font-size:16px;font-weight:bold}.s{font-size:13px;fill:#444}"
                  ".t{font-size:16px;font-weight:bold}.a{font-size:12px;fill:#333;"
                  "text-anchor:middle}.tx{font-size:11px;text-anchor:middle;fill:#333}"
                  ".ty{font-size:11px;text-anchor:end;fill:#333}.l{font-size:12px}"
                  ".g{stroke:#e4e4e4}.p{fill:#1f5fa8;fill-opacity:0.65}"
                  ".e{stroke:#d62020;stroke-width:2;fill:none}</style>\n"
                  "<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\"/>\n"
                  "<text x=\"%d\" y=\"28\" class=\"t\">",
                  SVG_W, h, SVG_W, h, MARGIN_L);
    xml_text(&b, title);
    sp_buf_printf(&b,
                  "</text>\n<text x=\"%d\" y=\"52\" class=\"s\">each point one operation (x: "
                  "its start, y: its latency); red crosses: errors; dashed: p50/p90/p99 of the "
                  "successful ones</text>\n",
                  MARGIN_L);
    int top = MARGIN_TOP;
    for (size_t o = 0; o < n_ops; o++) {
        bench_op_stats_t st;
        bench_op_stats(ops[o], s, n, wall_s, &st);
        if (st.n == 0)
            continue;
        svg_panel(&b, top, ops[o], s, n, wall_s);
        top += PANEL_H + PANEL_GAP;
    }
    if (!shown)
        sp_buf_printf(&b, "<text x=\"%d\" y=\"%d\" class=\"h\">no samples</text>\n", MARGIN_L,
                      MARGIN_TOP + 40);
    sp_buf_puts(&b, "</svg>\n");
    int rc = write_file(path, &b);
    sp_buf_dispose(&b);
    return rc;
}
