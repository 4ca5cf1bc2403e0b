/* backends_cmd.c - `attnreplay backends [--trace T]`: the backend table.
 *
 * For each registered backend (selector priority order) it prints the capabilities and the
 * verdict of its check() for the trace's configuration (or a default Llama-like config), so a
 * user sees which backend `--backend auto` would take and why the others were passed over. */
#include <stdio.h>
#include <string.h>

#include "registry.h"
#include "replay.h"

static void default_config(ar_run_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->model.name, sizeof c->model.name, "llama-3.1-8b");
    c->model.attention = AR_ATTN_MHA;
    c->model.num_layers = 32;
    c->model.num_q_heads = 32;
    c->model.num_kv_heads = 8;
    c->model.head_size = 128;
    c->model.v_head_dim = 128;
    c->model.scale = 0.08838834764831845;
    c->block_size = 16;
    c->num_blocks = 4096;
    c->dtype = AR_BF16;
    c->kv_dtype = AR_BF16;
    c->kv_scale = 1.0;
    c->num_layers = 1;
    c->repeat = 1;
    c->cascade_mode = 1;
}

static void backends_usage(FILE *f)
{
    fputs("usage: attnreplay backends [--trace TRACE]\n"
          "  Lists the backends in selector order with their capabilities and whether each can run\n"
          "  the trace's configuration (a Llama-3.1-8B-like default without --trace), and why not.\n"
          "  Exit status: 0 listed, 2 usage error or a bad trace, 3 the list could not be written.\n", f);
}

int ar_backends_main(int argc, char **argv)
{
    const char *trace = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            backends_usage(stdout);
            return 0;
        }
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--trace") == 0 && i + 1 < argc) trace = argv[++i];
        else {
            backends_usage(stderr);
            return 2;
        }
    }
    ar_run_config cfg;
    char err[AR_ERR_MAX + 64];
    if (trace) {
        ar_trace_reader *r = ar_trace_open(trace, err, sizeof err);
        if (!r) {
            fprintf(stderr, "attnreplay backends: %s\n", err);
            return 2;
        }
        int rc = ar_run_config_from_header(ar_trace_header_of(r), NULL, NULL, 1.0, &cfg, err, sizeof err);
        ar_trace_close(r);
        if (rc != 0) {
            fprintf(stderr, "attnreplay backends: %s\n", err);
            return 2;
        }
    } else {
        default_config(&cfg);
    }
    ar_selection sel;
    ar_backend_select(&cfg, "auto", &sel);
    printf("config: %s%s, %s, %d q / %d kv heads, head %d, block %d, kv %s\n\n",
           trace ? "trace " : "default ", trace ? trace : cfg.model.name,
           ar_dtype_name(cfg.dtype), cfg.model.num_q_heads, cfg.model.num_kv_heads,
           cfg.model.head_size, cfg.block_size, ar_dtype_name(cfg.kv_dtype));
    printf("%-3s %-10s %-4s %-8s %s\n", "#", "backend", "gpu", "verdict", "reason / capabilities");
    for (int i = 0; i < sel.count; i++) {
        const ar_selection_entry *e = &sel.entries[i];
        printf("%-3d %-10s %-4s %-8s %s\n", i + 1, e->backend->name, e->backend->needs_gpu ? "yes" : "no",
               e->chosen ? "CHOSEN" : e->ok ? "ok" : "no", e->why);
        printf("    %-10s %s\n", "", e->backend->summary);
        printf("    %-10s %s\n", "", e->backend->capabilities);
    }
    return 0;
}
