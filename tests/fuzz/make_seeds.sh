#!/usr/bin/env bash
# make_seeds.sh OUT_DIR - builds the seed corpora for the fuzz harnesses in OUT_DIR/{trace,workload,cli}.
#
# trace:    the sample traces as they are (gzip) and decompressed (plain), and small edge cases.
# workload: one seed per importer: the first rows of each public workload in
#           ../shared/traces-public (read here at run time, never committed), small generated
#           rows that the harness also simulates, and synthetic specs.  Each seed starts with the
#           harness's 4 control bytes (importer, block size, limit, flags; see fuzz_workload.c).
# cli:      typical command lines, one argument per line after a command byte (see fuzz_cli.c).
set -euo pipefail
out=${1:?usage: make_seeds.sh OUT_DIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
pub="$src/../shared/traces-public"
rm -rf "$out"
mkdir -p "$out/trace" "$out/workload" "$out/cli"

# ---- trace ----
for f in "$src"/traces/samples/*.trace.jsonl.gz; do
  b=$(basename "$f" .trace.jsonl.gz)
  cp "$f" "$out/trace/$b.gz"
  gzip -dc "$f" | awk 'NR <= 40' >"$out/trace/$b.jsonl"   # awk reads to the end: no SIGPIPE for gzip
done
hdr=$(gzip -dc "$src/traces/samples/mixed.trace.jsonl.gz" | awk 'NR == 1')
printf '%s\n' "$hdr" >"$out/trace/header-only.jsonl"
printf '' >"$out/trace/empty.jsonl"
printf '%s\n\n   \n{"step":0,"time":0,"new":[],"cached":[],"num_scheduled_tokens":{},"num_common_prefix_blocks":0,"finished":[],"preempted":[]}\n' \
  "$hdr" >"$out/trace/empty-step.jsonl"

# ---- workload: 4 control bytes then the body ----
seed() {   # seed NAME KIND BLOCKSIZE_INDEX LIMIT FLAGS < body
  { printf "\\x$(printf %02x "$2")\\x$(printf %02x "$3")\\x$(printf %02x "$4")\\x$(printf %02x "$5")"; cat; } \
    >"$out/workload/$1"
}
if [ -d "$pub" ]; then
  head -n 12 "$pub/mooncake-fast25/synthetic_trace.jsonl" | seed mooncake-public 0 1 0 0
  head -n 12 "$pub/azure-llm-2023/AzureLLMInferenceTrace_code.csv" | seed azure-code-public 1 1 0 0
  head -n 12 "$pub/azure-llm-2023/AzureLLMInferenceTrace_conv.csv" | seed azure-conv-public 1 2 5 0
  head -n 8 "$pub/vllm-runs-llmservingsim/RTX4090-Llama-3.1-8B/requests.jsonl" | seed vllm-public 2 1 0 0
fi
printf '%s\n' '{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}' \
  '{"timestamp": 10, "input_length": 1100, "output_length": 9, "hash_ids": [1, 2, 3]}' \
  '{"timestamp": 10, "input_length": 300, "output_length": 3, "hash_ids": [4]}' | seed mooncake-small-sim 0 1 0 9
printf '%s\n' 'TIMESTAMP,ContextTokens,GeneratedTokens' '2023-11-16 18:15:46.6805900,374,44' \
  '2023-11-16 18:15:50.9951690,396,9' '2023-11-16 18:15:51.0000000,12,1' | seed azure-small-sim 1 1 0 5
printf '%s\n' '{"request_id": "a", "input_toks": 40, "output_toks": 7, "arrival_time": 100.5}' \
  '{"request_id": "b", "input_toks": 33, "output_toks": 2, "arrival_time": 100.75}' | seed vllm-small-sim 2 2 0 13
printf 'groups=2,prompts=3,system=64,question=20,output=4,rate=50,seed=3' | seed synthetic-groups 3 1 0 1
printf 'n=5,input=100,output=6,arrival=gamma,cv=3' | seed synthetic-n 3 0 0 7
printf 'n=4,input=17,output=2,rate=1e3' | seed synthetic-tiny 3 6 0 3

# ---- cli: command byte, then one argument per line (see fuzz_cli.c for @ names) ----
cli() {   # cli NAME CMD ARGS...
  local name=$1 cmd=$2; shift 2
  { printf "\\x$(printf %02x "$cmd")"; printf '%s\n' "$@"; } >"$out/cli/$name"
}
cli replay-basic 0 @T --db @D --backend cpu --steps 0:2 --threads 1
cli replay-verify 0 @T --db @D --backend cpu --verify sample:2 --steps 1:3 --layers 2 --threads 1
cli replay-inject 0 @T --db @D --backend cpu --inject wrong-slot --steps 0:1 --cascade on --threads 1
cli replay-off 0 @S --db @D --backend cpu --verify off --steps 0:1 --dtype fp16 --kv-dtype fp8_e4m3 --kv-scale 0.5 --threads 1
cli replay-resume 0 @T --db @D --resume --steps :1 --threads 1
cli sim-syn 1 --workload synthetic:n=3,input=40,output=3 --model llama-3.1-8b --out @O --num-blocks 64 --quiet
cli sim-moon 1 --workload mooncake:@W --model qwen3-32b --out @O.gz --block-size 32 --kv-mem 1GiB --step-time roofline:h200,overhead=0.001 --quiet --limit 2
cli sim-lin 1 --workload synthetic:groups=1,prompts=2,system=32,question=8,output=2 --model deepseek-v3 --out @O --metrics @O.csv --step-time linear:0.01,1e-5,1e-4,1e-7 --max-num-seqs 2
cli report 2 @R --out @O --run 1
cli diff 3 @R 1 1 --threshold 5%
cli diff-err 3 @R 1 2 --error-growth 2
cli backends 4 --trace @T
cli plan 5 --workload synthetic:n=3,input=40,output=3 --model llama-3.1-8b --device h200 --rates 1,2 --kv-blocks 64
echo "seeds in $out: $(ls "$out/trace" | wc -l) trace, $(ls "$out/workload" | wc -l) workload, $(ls "$out/cli" | wc -l) cli"
