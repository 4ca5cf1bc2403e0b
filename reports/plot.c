/* plot.c - writes a gnuplot script for one chart and runs gnuplot to produce PNG and SVG
 * (see plot.h).  PNG uses the cairo terminal when this gnuplot has it, else the libgd one. */
#include "plot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void copy_text(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

ar_plot_series *ar_plot_add(ar_plot *plot, const char *title, const char *csv,
                            const char *using_cols, const char *style)
{
    if (plot->num_series >= AR_PLOT_MAX_SERIES) return NULL;
    ar_plot_series *s = &plot->series[plot->num_series++];
    memset(s, 0, sizeof *s);
    copy_text(s->title, sizeof s->title, title);
    copy_text(s->csv, sizeof s->csv, csv);
    copy_text(s->using_cols, sizeof s->using_cols, using_cols);
    copy_text(s->style, sizeof s->style, style);
    return s;
}

ar_plot_series *ar_plot_add_function(ar_plot *plot, const char *title, const char *function,
                                     const char *style)
{
    ar_plot_series *s = ar_plot_add(plot, title, "", "", style);
    if (s) copy_text(s->function, sizeof s->function, function);
    return s;
}

int ar_plot_add_vline(ar_plot *plot, double x, int linetype, const char *title)
{
    if (plot->num_vlines >= AR_PLOT_MAX_SERIES) return -1;
    int i = plot->num_vlines++;
    plot->vline_x[i] = x;
    plot->vline_linetype[i] = linetype;
    copy_text(plot->vline_title[i], sizeof plot->vline_title[i], title);
    return 0;
}

/* Writes text as a gnuplot single-quoted string ('' stands for one quote inside). */
static void put_quoted(FILE *f, const char *text)
{
    fputc('\'', f);
    for (const char *p = text; *p; p++) {
        if (*p == '\'') fputc('\'', f);
        if (*p == '\n' || *p == '\r') { fputc(' ', f); continue; }
        fputc(*p, f);
    }
    fputc('\'', f);
}

static int write_script(FILE *f, const ar_plot *plot)
{
    fprintf(f, "# %s.gp - written by attnreplay report; run `gnuplot %s.gp` in this directory.\n",
            plot->name, plot->name);
    fputs("set encoding utf8\n"
          "set datafile separator ','\n"
          "set datafile missing 'NaN'\n"
          "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
          "  set terminal pngcairo noenhanced size 1100,700 font 'Sans,10'\n"
          "} else {\n"
          "  set terminal png noenhanced size 1100,700\n"
          "}\n", f);
    fprintf(f, "set output '%s.png'\n", plot->name);
    fputs("set title ", f);  put_quoted(f, plot->title);  fputc('\n', f);
    fputs("set xlabel ", f); put_quoted(f, plot->xlabel); fputc('\n', f);
    fputs("set ylabel ", f); put_quoted(f, plot->ylabel); fputc('\n', f);
    /* Matplotlib's tab10 colours: distinct, and none too pale on white. */
    static const char *const palette[10] = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                             "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf" };
    for (int i = 0; i < 10; i++) fprintf(f, "set linetype %d lc rgb '%s'\n", i + 1, palette[i]);
    fputs("set linetype cycle 10\n", f);
    /* the legend under the plot, two entries a row, so the plot keeps the full width */
    fputs("set grid xtics ytics mxtics mytics lc rgb '#dddddd'\n"
          "set key below center horizontal Left reverse maxcols 2 spacing 1.1 width 1 height 1\n"
          "set samples 400\n", f);
    if (plot->logx) fputs("set logscale x\n", f);
    if (plot->logy) fputs("set logscale y\n", f);
    /* a log axis reaching below 1e-3 reads 1e-5, not 0.000010 */
    const char *xformat = plot->xformat[0] ? plot->xformat
                        : plot->logx && plot->xmin > 0 && plot->xmin < plot->xmax && plot->xmin < 1e-3 ? "%.0te%T" : "";
    const char *yformat = plot->yformat[0] ? plot->yformat
                        : plot->logy && plot->ymin > 0 && plot->ymin < plot->ymax && plot->ymin < 1e-3 ? "%.0te%T" : "";
    if (xformat[0]) { fputs("set format x ", f); put_quoted(f, xformat); fputc('\n', f); }
    if (plot->xtics[0]) fprintf(f, "set xtics %s\n", plot->xtics);
    if (yformat[0]) { fputs("set format y ", f); put_quoted(f, yformat); fputc('\n', f); }
    /* autoscaled axes get a margin, so no point sits on the border */
    fputs("set offsets graph 0.02, graph 0.02, graph 0.04, graph 0.04\n", f);
    if (plot->xmin < plot->xmax) fprintf(f, "set xrange [%.9g:%.9g]\n", plot->xmin, plot->xmax);
    if (plot->ymin < plot->ymax) fprintf(f, "set yrange [%.9g:%.9g]\n", plot->ymin, plot->ymax);
    for (int i = 0; i < plot->num_vlines; i++)
        fprintf(f, "set arrow %d from %.9g, graph 0 to %.9g, graph 1 nohead lt %d lw 1.5 dt 3\n", i + 1,
                plot->vline_x[i], plot->vline_x[i], plot->vline_linetype[i]);
    fputs("plot ", f);
    for (int i = 0; i < plot->num_series; i++) {
        const ar_plot_series *s = &plot->series[i];
        if (i) fputs(", \\\n     ", f);
        if (s->csv[0]) {
            put_quoted(f, s->csv);
            fprintf(f, " using %s", s->using_cols[0] ? s->using_cols : "1:2");
        } else {
            fputs(s->function, f);
        }
        fprintf(f, " with %s title ", s->style[0] ? s->style : "points");
        put_quoted(f, s->title);
    }
    /* legend entries of the markers, last, so the series keep linetypes 1, 2, ... */
    for (int i = 0; i < plot->num_vlines; i++) {
        fprintf(f, ", \\\n     NaN with lines lt %d lw 1.5 dt 3 title ", plot->vline_linetype[i]);
        put_quoted(f, plot->vline_title[i]);
    }
    fputc('\n', f);
    fputs("set terminal svg noenhanced size 1100,700 font 'Sans,10' background '#ffffff'\n", f);
    fprintf(f, "set output '%s.svg'\n", plot->name);
    fputs("replot\nunset output\n", f);
    return ferror(f) ? -1 : 0;
}

bool ar_plot_have_gnuplot(void)
{
    const char *path = getenv("PATH");
    if (!path) return false;
    char *copy = strdup(path);
    if (!copy) return false;
    bool found = false;
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
        char candidate[4096];
        snprintf(candidate, sizeof candidate, "%s/gnuplot", *dir ? dir : ".");
        found = access(candidate, X_OK) == 0;
    }
    free(copy);
    return found;
}

static long file_size(const char *dir, const char *name, const char *ext)
{
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* Appends up to the last ~600 bytes of gnuplot's log to err. */
static void append_log(const char *log_path, char *err, size_t err_len)
{
    FILE *f = fopen(log_path, "rb");
    if (!f) return;
    char buf[601];
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, n > 600 ? n - 600 : 0, SEEK_SET);
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    buf[got] = 0;
    fclose(f);
    size_t used = strlen(err);
    if (got && used + 1 < err_len) snprintf(err + used, err_len - used, "; gnuplot said: %s", buf);
}

int ar_plot_render(const char *out_dir, const ar_plot *plot, char *err, size_t err_len)
{
    char script_path[4096], log_path[4096];
    snprintf(script_path, sizeof script_path, "%s/%s.gp", out_dir, plot->name);
    snprintf(log_path, sizeof log_path, "%s/%s.log", out_dir, plot->name);
    if (plot->num_series == 0) {
        snprintf(err, err_len, "plot %s: nothing to draw", plot->name);
        return -1;
    }
    FILE *f = fopen(script_path, "w");
    if (!f) {
        snprintf(err, err_len, "%s: cannot write: %s", script_path, strerror(errno));
        return -1;
    }
    int wrote = write_script(f, plot);
    if (fclose(f) != 0 || wrote != 0) {
        snprintf(err, err_len, "%s: write failed", script_path);
        return -1;
    }
    /* Remove stale images so a failed run cannot pass the size check. */
    char stale[4096];
    snprintf(stale, sizeof stale, "%s/%s.png", out_dir, plot->name);
    unlink(stale);
    snprintf(stale, sizeof stale, "%s/%s.svg", out_dir, plot->name);
    unlink(stale);

    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, err_len, "plot %s: fork failed: %s", plot->name, strerror(errno));
        return -1;
    }
    if (pid == 0) {
        int log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (log_fd >= 0) {
            dup2(log_fd, STDOUT_FILENO);
            dup2(log_fd, STDERR_FILENO);
            close(log_fd);
        }
        if (chdir(out_dir) != 0) _exit(126);
        char script_name[96];
        snprintf(script_name, sizeof script_name, "%s.gp", plot->name);
        execlp("gnuplot", "gnuplot", script_name, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            snprintf(err, err_len, "plot %s: waitpid failed: %s", plot->name, strerror(errno));
            return -1;
        }
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0) {
        if (code == 127)
            snprintf(err, err_len, "plot %s: gnuplot not found on PATH (install gnuplot-nox)",
                     plot->name);
        else
            snprintf(err, err_len, "plot %s: gnuplot exited with status %d (script %s)",
                     plot->name, code, script_path);
        append_log(log_path, err, err_len);
        return -1;
    }
    long png = file_size(out_dir, plot->name, "png");
    long svg = file_size(out_dir, plot->name, "svg");
    if (png <= 0 || svg <= 0) {
        snprintf(err, err_len, "plot %s: gnuplot succeeded but %s.png is %ld bytes and %s.svg "
                 "%ld bytes", plot->name, plot->name, png, plot->name, svg);
        append_log(log_path, err, err_len);
        return -1;
    }
    /* Keep gnuplot's log only when it said something (warnings). */
    struct stat sb;
    if (stat(log_path, &sb) == 0 && sb.st_size == 0) unlink(log_path);
    return 0;
}
