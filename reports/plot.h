/* plot.h - renders one chart through gnuplot into NAME.png and NAME.svg in an output
 * directory.  The caller writes the data as CSV files (one per series, '#' header line)
 * relative to that directory; this module writes NAME.gp, runs `gnuplot NAME.gp` with the
 * directory as working directory, checks gnuplot's exit status and that both images exist
 * and are non-empty.  Text is drawn without gnuplot's "enhanced" markup so run labels with
 * underscores print as written. */
#ifndef AR_PLOT_H
#define AR_PLOT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_PLOT_MAX_SERIES 32

/* One curve: either data from a CSV file or a gnuplot function of x. */
typedef struct {
    char title[160];          /* legend entry */
    char csv[160];            /* data file relative to the output directory; "" for function */
    char using_cols[64];      /* gnuplot `using` spec for csv, e.g. "1:2" */
    char function[256];       /* gnuplot expression in x when csv is "" */
    char style[96];           /* e.g. "points pt 7 ps 0.6", "lines lw 2" */
} ar_plot_series;

typedef struct {
    char name[64];            /* file stem: NAME.png, NAME.svg, NAME.gp */
    char title[200];
    char xlabel[120];         /* with units, e.g. "batch tokens (tokens)" */
    char ylabel[120];
    bool logx, logy;
    char xformat[32], yformat[32];   /* gnuplot tic formats ("" = gnuplot's own), e.g. "%.0te%T" */
    char xtics[256];                 /* explicit x tics, e.g. "(0.5, 1, 2, 4)"; "" = gnuplot's */
    /* Optional explicit ranges (used when min < max). */
    double xmin, xmax, ymin, ymax;
    ar_plot_series series[AR_PLOT_MAX_SERIES];
    int num_series;
    /* vertical markers at x (e.g. an answer on the x axis), dashed, in a series' colour */
    double vline_x[AR_PLOT_MAX_SERIES];
    int vline_linetype[AR_PLOT_MAX_SERIES];   /* 1-based, as the series' order */
    char vline_title[AR_PLOT_MAX_SERIES][160];
    int num_vlines;
} ar_plot;

/* Adds a series; returns it (NULL when full). */
ar_plot_series *ar_plot_add(ar_plot *plot, const char *title, const char *csv,
                            const char *using_cols, const char *style);
ar_plot_series *ar_plot_add_function(ar_plot *plot, const char *title, const char *function,
                                     const char *style);
/* Adds a dashed vertical line at x in the colour of linetype (1-based) with a legend entry;
 * returns 0, or -1 when full. */
int ar_plot_add_vline(ar_plot *plot, double x, int linetype, const char *title);

/* Writes NAME.gp into out_dir, runs gnuplot there, and checks NAME.png and NAME.svg.
 * Returns 0, or -1 with a message (gnuplot's own error output included) in err. */
int ar_plot_render(const char *out_dir, const ar_plot *plot, char *err, size_t err_len);

/* True when a gnuplot executable is on PATH. */
bool ar_plot_have_gnuplot(void);

#ifdef __cplusplus
}
#endif
#endif
