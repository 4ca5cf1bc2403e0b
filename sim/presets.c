/* presets.c - engine presets for the simulator: model dimensions (from each model's published
 * config.json) and device numbers (datasheets), plus KV-cache sizing and parameter counts.
 *
 * Models (Hugging Face config.json of each):
 *   llama-3.1-8b   32 layers, 32 q / 8 kv heads, head 128, hidden 4096, MLP 14336, vocab 128256
 *   llama-3.1-70b  80 layers, 64 q / 8 kv heads, head 128, hidden 8192, MLP 28672, vocab 128256
 *   qwen3-32b      64 layers, 64 q / 8 kv heads, head 128, hidden 5120, MLP 25600, vocab 151936
 *   deepseek-v3    61 layers, 128 heads, MLA (kv_lora 512, rope 64, nope 128, v 128, q_lora
 *                  1536), hidden 7168, 3 dense layers (MLP 18432) then MoE: 256 routed experts,
 *                  8 active, 1 shared, expert MLP 2048; vocab 129280; softmax scale
 *                  192^-0.5 * mscale^2 = 0.1352338 (semantics section 7.2).
 * Block size 16 for all: vLLM's default, kept by FLASH_ATTN and FLASH_ATTN_MLA on SM90. */
#include "sim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const ar_model_preset presets[] = {
    {
        .name = "llama-3.1-8b",
        .model = {.name = "llama-3.1-8b", .attention = AR_ATTN_MHA, .num_layers = 32, .num_q_heads = 32,
                  .num_kv_heads = 8, .head_size = 128, .v_head_dim = 128, .scale = 0.08838834764831845},
        .hidden = 4096, .intermediate = 14336, .vocab = 128256, .default_block_size = 16,
    },
    {
        .name = "llama-3.1-70b",
        .model = {.name = "llama-3.1-70b", .attention = AR_ATTN_MHA, .num_layers = 80, .num_q_heads = 64,
                  .num_kv_heads = 8, .head_size = 128, .v_head_dim = 128, .scale = 0.08838834764831845},
        .hidden = 8192, .intermediate = 28672, .vocab = 128256, .default_block_size = 16,
    },
    {
        .name = "qwen3-32b",
        .model = {.name = "qwen3-32b", .attention = AR_ATTN_MHA, .num_layers = 64, .num_q_heads = 64,
                  .num_kv_heads = 8, .head_size = 128, .v_head_dim = 128, .scale = 0.08838834764831845},
        .hidden = 5120, .intermediate = 25600, .vocab = 151936, .default_block_size = 16,
    },
    {
        .name = "deepseek-v3",
        .model = {.name = "deepseek-v3", .attention = AR_ATTN_MLA, .num_layers = 61, .num_q_heads = 128,
                  .num_kv_heads = 1, .head_size = 576, .kv_lora_rank = 512, .qk_rope_head_dim = 64,
                  .qk_nope_head_dim = 128, .v_head_dim = 128, .scale = 0.1352338},
        .hidden = 7168, .intermediate = 18432, .vocab = 129280, .q_lora_rank = 1536,
        .num_experts = 256, .active_experts = 8, .shared_experts = 1, .moe_intermediate = 2048,
        .first_dense_layers = 3, .default_block_size = 16,
    },
};

/* Dense bf16 tensor-core peaks with fp32 accumulation (no sparsity), memory bandwidth, the
 * tensor-parallel interconnect, and each device's efficiency table (the roofline's defaults).
 *
 * Interconnect: link_bw is what one device moves each way at once during a ring all-reduce.
 * NVLink 4 (H100/H200 SXM): 900 GB/s bidirectional per GPU = 450 GB/s each way (datasheets);
 * NCCL's all-reduce reaches ~80% of it on 8 GPUs (nccl-tests bus bandwidth ~360 GB/s), taken as
 * 360 GB/s, latency 10 us (a small-message all-reduce: vLLM's custom one-shot all-reduce or NCCL's
 * LL protocol).  PCIe: 4.0 x16 carries 31.5 GB/s each way, 5.0 x16 63 GB/s (PCI-SIG); GeForce
 * cards have no peer-to-peer, so NCCL stages through host memory: RTX 4090 taken as 20 GB/s and
 * 30 us, RTX PRO 6000 (peer-to-peer over PCIe 5.0) as 50 GB/s and 20 us.  The PCIe figures are
 * estimates from the link rates, not measurements; give link_bw= / link_lat= to replace them.
 *
 * Efficiency tables: H200 from `attnreplay calibrate` on the project's H200 (cuBLAS bf16 GEMM
 * 763.5 of 989 TFLOP/s = 0.77; device copy 4233 of 4800 GB/s = 0.88; BENCHMARKS.md "Device
 * ceilings"); H100 shares the H200's SM90 core and takes its table (not measured).  The RTX
 * cards' GEMM efficiency is a published measurement, not the project's: PyTorch 2.7 (CUDA 12.8)
 * bf16 matmul of 8192 x 8192 square matrices, from the public collection
 * github.com/zzc0721/torch-performance-test-data (issue #78: GeForce RTX 4090, 160.17 TFLOP/s of
 * 165.2 = 0.97; issue #160: RTX PRO 6000 Blackwell Workstation Edition, 350.31 of 503.8 = 0.695;
 * 8192 is the median of the 2048 / 4096 / 8192 results on both: 164.8 / 151.5 / 160.2 and
 * 288.7 / 368.4 / 350.3).  One contributor's card each, so a spread of ~10% between cards and
 * editions is to be expected (the PRO 6000 Server Edition measured 417 at 8192, issue #162).
 * Their bandwidth efficiency is a published read+write stream over buffers far larger than L2, as
 * the H200's device copy is (bytes read plus bytes written over time, of the data-sheet bandwidth):
 * RTX 4090 921.85 of 1008 GB/s = 0.915, a CUDA copy kernel (float4 loads and stores, 2^28 floats:
 * github.com/xytpai/nvbench, README "global_memory_bandwidth", standard/global_memory_bandwidth.cu;
 * an OpenCL read kernel on another 4090 gives the same, 921.3 GB/s, github.com/krrishnarraj/clpeak
 * issue #106); RTX PRO 6000 Blackwell Workstation Edition 1.472 TB/s of 1792 GB/s = 0.82, CUB's
 * device-wide exclusive scan of 2^28 int8 values (2^28 bytes read and 2^28 written in 364.7 us;
 * 2^32 values: 5.846 ms, 1.469 TB/s), nvbench on that card (github.com/NVIDIA/cccl pull request
 * #8658).  No plain copy of the Workstation Edition is published; cross-checks: the same scan on
 * the Server Edition (1.6 TB/s data sheet) moves 1.452 TB/s (cccl issue #8682, nvbench's 90.9% of
 * that card's peak), and the GeForce RTX 5090, the same GB202 die with the same 1792 GB/s GDDR7,
 * streams 1.52-1.57 TB/s in CUB's BabelStream-style transforms at 2^28 elements (0.85-0.87; cccl
 * pull requests #9881 and #9764).  The scan is a lower bound on the card's copy rate, so 0.82 may
 * be up to ~5% low.  Their attention entry is the generic 0.5 (no measurement).
 *
 * Their kv_eff (attention's paged KV reads) is a published measurement of vLLM 0.19's own decode
 * attention on each card: the per-layer profiles of Llama-3.1-8B bf16 (TP 1, block 16, the
 * attention backend vLLM picks by default, kernel time of vLLM's Attention module per call, KV
 * write included, eager) in github.com/casys-kaist/LLMServingSim at commit 5daddb2,
 * profiler/perf/{RTX4090,RTXPRO6000}/meta-llama/Llama-3.1-8B/bf16/tp1/attention.csv (profiled
 * 2026-08-17 on a GeForce RTX 4090 and 2026-04-24 on an RTX PRO 6000 Blackwell Server Edition;
 * the same repository's vLLM runs are the fidelity runs, its own simulator models that card at
 * 1597 GB/s).  Every decode-only row (n_decode 1..256 requests x kv_decode 16..16384 tokens: 99 and
 * 171 rows) fitted as time = a + KV bytes / rate (bytes = n x kv x 2 x 8 heads x 128 x 2),
 * least squares of the relative error, the form and the error measure the step-time model and
 * its fit use: RTX 4090 a = 12.7 us, 873.2 GB/s = 0.866 of 1008; RTX PRO 6000 a = 12.4 us,
 * 1397.9 GB/s = 0.780 of 1792 (0.875 of the Server Edition's 1597).  The largest shape (256 x
 * 16384) streams 954 / 1529 GB/s; the rate is below that at the short contexts that dominate
 * serving.  The rate is the card's own, so the preset holds it as a fraction of the preset's
 * data-sheet bandwidth.  H200 and H100: none (kv_eff = bw_eff).
 *
 * A candidate linear-layer table (linear_gemm_eff, linear_bw_eff), not the default: vLLM 0.19's own
 * linear layers on each card, from the same profiles (dense.csv: the CUDA kernel time per call of
 * each module of one layer at 152 token counts from 1 to 2048; per_sequence.csv: the LM head at
 * 1..256 sequences).  A layer's linear time T(n) = qkv_proj + o_proj + gate_up_proj + down_proj at
 * n tokens; its FLOPs 2 n x 218,103,808 parameters, its bytes the roofline's (2 per weight + each
 * GEMM's input and output rows).  The rule, fixed before any simulation: gemm_eff from the
 * compute-bound rows n >= 1024 (65 rows; the runs' prefill chunks are 2048 tokens), T = FLOPs /
 * rate, least squares of the relative error; bw_eff from the weight stream of a decode step of
 * n <= 16 sequences (16 rows: 32 x T(n) + the LM head at n sequences, against 32 layers' and the LM
 * head's bytes), the same fit.  RTX 4090: 158.8 TFLOP/s = 0.961 of 165.2 (rows 146.7..165.2),
 * 916.7 GB/s = 0.909 of 1008.  RTX PRO 6000 Server Edition: 379.9 TFLOP/s = 0.754 of 503.8 (rows
 * 340.5..415.4; 395.7 at 2048 tokens), 1450.6 GB/s = 0.809 of 1792.  The weight streams agree with
 * the copy figures above within 1.3%, the RTX 4090's GEMMs with its matmul figure within 1%; the
 * RTX PRO 6000's GEMMs do not match its own run: the run's step timings put them at 0.62 of the
 * peak (`make fidelity`, stage 1: gemm_scale 0.82 x 0.754, or 0.89 x 0.695), and with 0.754 pinned
 * its stage-1 loss is 0.021 against 0.0091.  A burst of profiled kernels may run at clocks the
 * sustained serving run does not hold; that is not measured, so the default stays. */
static const ar_device_spec devices[] = {
    {"rtx4090", 165.2e12, 1008e9, 128,
     "NVIDIA Ada Lovelace architecture whitepaper (RTX 4090): 165.2 dense BF16 TFLOP/s with FP32 "
     "accumulate (330.3 with sparsity), 1008 GB/s GDDR6X, 128 SMs",
     "pcie", 20e9, 30e-6, "PCIe 4.0 x16 (31.5 GB/s each way), no peer-to-peer: estimate 20 GB/s, 30 us",
     0.97, 0.5, 0.915, 0.866, 0.961, 0.909,
     "GEMM: published PyTorch bf16 matmul 8192^3, 160.2 of 165.2 TFLOP/s (torch-performance-test-data "
     "#78); bandwidth: published CUDA copy kernel, 921.85 of 1008 GB/s (xytpai/nvbench); KV reads: vLLM 0.19 decode "
     "attention, 873.2 of 1008 GB/s (LLMServingSim profile, fitted over its decode grid); attention generic (not measured)"},
    {"rtxpro6000", 503.8e12, 1792e9, 188,
     "NVIDIA RTX PRO 6000 Blackwell Workstation Edition datasheet / RTX Blackwell whitepaper: about "
     "504 dense BF16 TFLOP/s with FP32 accumulate (about 1008 with sparsity), 1792 GB/s GDDR7, 188 SMs; "
     "the TFLOP/s figure is derived from the 4 PFLOP sparse FP4 headline, not measured",
     "pcie", 50e9, 20e-6, "PCIe 5.0 x16 (63 GB/s each way), peer-to-peer: estimate 50 GB/s, 20 us",
     0.695, 0.5, 0.82, 0.780, 0.754, 0.809,
     "GEMM: published PyTorch bf16 matmul 8192^3 on the Workstation Edition, 350.3 of 503.8 TFLOP/s "
     "(torch-performance-test-data #160); bandwidth: published CUB int8 scan on the Workstation Edition, 2^28 bytes "
     "read and written at 1.472 of 1792 GB/s (NVIDIA/cccl #8658); KV reads: vLLM 0.19 decode attention on the "
     "Server Edition, 1397.9 GB/s = 0.780 of 1792 (LLMServingSim profile, fitted over its decode grid); attention "
     "generic (not measured)"},
    {"h200", 989e12, 4.8e12, 132,
     "NVIDIA H200 SXM datasheet: 989 dense BF16 TFLOP/s, 4.8 TB/s HBM3e, 132 SMs "
     "(measured on the project H200: ~790 TFLOP/s GEMM, ~4.3 TB/s copy)",
     "nvlink", 360e9, 10e-6, "NVLink 4, 450 GB/s each way; all-reduce at ~80%: 360 GB/s, 10 us",
     0.77, 0.5, 0.88, 0, 0, 0, "attnreplay calibrate on the project H200: GEMM 763.5 TFLOP/s, copy 4233 GB/s"},
    {"h100", 989e12, 3.35e12, 132, "NVIDIA H100 SXM datasheet: 989 dense BF16 TFLOP/s, 3.35 TB/s, 132 SMs",
     "nvlink", 360e9, 10e-6, "NVLink 4, 450 GB/s each way; all-reduce at ~80%: 360 GB/s, 10 us",
     0.77, 0.5, 0.88, 0, 0, 0, "the H200's table (same SM90 core; not measured on an H100)"},
};

const ar_model_preset *ar_model_preset_find(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    return NULL;
}

const ar_device_spec *ar_device_find(const char *name)
{
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++)
        if (strcmp(devices[i].name, name) == 0) return &devices[i];
    return NULL;
}

const char *ar_model_preset_names(void)
{
    return "llama-3.1-8b, llama-3.1-70b, qwen3-32b, deepseek-v3";
}

const char *ar_device_names(void)
{
    return "rtx4090, rtxpro6000, h200, h100";
}

int64_t ar_kv_bytes_per_block(const ar_model *m, int block_size, ar_dtype kv_dtype)
{
    int64_t per_token_layer = m->attention == AR_ATTN_MLA
                                  ? (int64_t)(m->kv_lora_rank + m->qk_rope_head_dim)
                                  : (int64_t)2 * m->num_kv_heads * m->head_size;
    return per_token_layer * ar_dtype_size(kv_dtype) * block_size * m->num_layers;
}

/* Attention projection parameters of one layer. */
static double attn_params(const ar_model_preset *p)
{
    const ar_model *m = &p->model;
    double h = p->hidden;
    if (m->attention == AR_ATTN_MLA) {
        double qk = m->qk_nope_head_dim + m->qk_rope_head_dim;
        return h * p->q_lora_rank + (double)p->q_lora_rank * m->num_q_heads * qk +
               h * (m->kv_lora_rank + m->qk_rope_head_dim) +
               (double)m->kv_lora_rank * m->num_q_heads * (m->qk_nope_head_dim + m->v_head_dim) +
               (double)m->num_q_heads * m->v_head_dim * h;
    }
    double q_dim = (double)m->num_q_heads * m->head_size, kv_dim = (double)m->num_kv_heads * m->head_size;
    return h * (q_dim + 2 * kv_dim) + q_dim * h;
}

double ar_preset_active_params(const ar_model_preset *p)
{
    double h = p->hidden, total = 0;
    for (int l = 0; l < p->model.num_layers; l++) {
        total += attn_params(p);
        if (p->num_experts > 0 && l >= p->first_dense_layers)
            total += 3.0 * h * p->moe_intermediate * (p->active_experts + p->shared_experts) + h * p->num_experts;
        else
            total += 3.0 * h * p->intermediate;
    }
    return total;
}

double ar_preset_total_params(const ar_model_preset *p)
{
    double h = p->hidden, total = 2.0 * h * p->vocab;  /* embedding + untied LM head */
    for (int l = 0; l < p->model.num_layers; l++) {
        total += attn_params(p);
        if (p->num_experts > 0 && l >= p->first_dense_layers)
            total += 3.0 * h * p->moe_intermediate * (p->num_experts + p->shared_experts) + h * p->num_experts;
        else
            total += 3.0 * h * p->intermediate;
    }
    return total;
}

const ar_device_spec *ar_device_match(const char *gpu_name)
{
    static const struct { const char *pattern, *preset; } names[] = {
        {"H200", "h200"}, {"H100", "h100"}, {"RTX PRO 6000", "rtxpro6000"}, {"4090", "rtx4090"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasestr(gpu_name, names[i].pattern)) return ar_device_find(names[i].preset);
    return ar_device_find(gpu_name);
}
