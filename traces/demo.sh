#!/usr/bin/env bash
# demo.sh - what `make demo` runs once bin/attnreplay is built: the main job on a real workload,
# small enough for a CPU.
#   1. simulate the first 200 requests of the public Azure LLM conversation trace (2023; read
#      from ../shared/traces-public beside the checkout, never copied) as Llama-3.1-8B served by
#      vLLM V1's scheduler on an H200 (roofline step time), arrivals 4x faster than recorded;
#   2. show the trace (`info`), and pick 8 consecutive steps from its second half that hold at
#      least one prefill chunk and at most DEMO_PAIRS causal query-key pairs (`info --steps`);
#   3. replay those steps, layer 0, on the best backend here (`--backend auto`: CUDA on a GPU,
#      else the CPU backend), every step verified against the float64 reference;
#   4. write the HTML report and say where to look.
# Without ../shared/traces-public it says so and replays a shipped sample trace instead.
# Usage: traces/demo.sh [DIR] (default demo/, emptied first); AR_BIN picks the binary, AR_PUBLIC
# another directory of public traces.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-demo}
BIN=${AR_BIN:-bin/attnreplay}
PUBLIC=${AR_PUBLIC:-../shared/traces-public}/azure-llm-2023/AzureLLMInferenceTrace_conv.csv
DEMO_PAIRS=${DEMO_PAIRS:-300000}   # ~4 GFLOP per layer at 32 q heads x 128: seconds on a CPU
rm -rf "$DIR"
mkdir -p "$DIR"
start=$SECONDS
stage() { echo; echo "== $1"; }

if [ -f "$PUBLIC" ]; then
    TRACE=$DIR/azure-conv-llama8b.trace.jsonl.gz
    stage "1/4 simulate: 200 requests of the Azure LLM conversation trace (2023), 4x faster, as Llama-3.1-8B on an H200"
    echo "$BIN sim --workload azure:$PUBLIC --model llama-3.1-8b --limit 200 --time-scale 0.25" \
         "--num-blocks 4096 --step-time roofline:h200 --out $TRACE --metrics $DIR/requests.csv"
    "$BIN" sim --workload "azure:$PUBLIC" --model llama-3.1-8b --limit 200 --time-scale 0.25 --num-blocks 4096 \
        --step-time roofline:h200 --out "$TRACE" --metrics "$DIR/requests.csv"
    LAYERS="--layers 1"
else
    TRACE=traces/samples/mixed.trace.jsonl.gz
    stage "1/4 no simulation: $PUBLIC is not there (../shared/traces-public beside the checkout"
    echo "holds the public traces); the demo replays the shipped sample $TRACE (a toy: 8 heads,"
    echo "head size 64) instead"
    LAYERS=""
fi

stage "2/4 the trace: $BIN info $TRACE"
"$BIN" info "$TRACE"
# 8 consecutive steps from the second half: the first window with a prefill chunk within the
# work budget, else the cheapest window there
STEPS=$("$BIN" info "$TRACE" --steps | awk -v budget="$DEMO_PAIRS" -v width=8 '
    /^#/ { next }
    { step[n] = $1; prefill[n] = $5; pairs[n] = $8; n++ }
    END {
        if (n <= width) { print "0:" (n - 1); exit }
        best = -1; pick = -1
        for (i = int(n / 2); i + width <= n; i++) {
            sum = 0; mixed = 0
            for (k = i; k < i + width; k++) { sum += pairs[k]; if (prefill[k] > 0) mixed = 1 }
            if (sum <= budget && mixed) { pick = i; break }
            if (best < 0 || sum < best_sum) { best = i; best_sum = sum }
        }
        if (pick < 0) pick = best
        print step[pick] ":" step[pick + width - 1]
    }')
echo "picked steps $STEPS; their rows of the step table ($BIN info $TRACE --steps):"
"$BIN" info "$TRACE" --steps | awk -v a="${STEPS%:*}" -v b="${STEPS#*:}" 'NR == 1 || ($1 >= a && $1 <= b)'

stage "3/4 replay steps $STEPS${LAYERS:+ (layer 0 only)} on the best backend here, every step verified"
echo "against the float64 reference"
replay_start=$SECONDS
# shellcheck disable=SC2086
"$BIN" replay "$TRACE" --db "$DIR/demo.db" --backend auto --steps "$STEPS" $LAYERS
replay_s=$((SECONDS - replay_start))

stage "4/4 report: $BIN report $DIR/demo.db --out $DIR/report"
"$BIN" report "$DIR/demo.db" --out "$DIR/report"

echo
echo "demo: done in $((SECONDS - start)) s after the build (replay ${replay_s} s). Where to look:"
echo "  $DIR/report/index.html   the report: runs table, time and error plots (open it in a browser)"
echo "  $DIR/report/summary.md   the same tables as Markdown"
echo "  $DIR/demo.db             every replayed step; e.g."
echo "      sqlite3 $DIR/demo.db 'SELECT step, num_reqs, num_tokens, time_us, max_abs, pass FROM steps'"
if [ -f "$DIR/requests.csv" ]; then
    echo "  $TRACE   the simulated trace ($BIN info $TRACE --steps lists its steps)"
    echo "  $DIR/requests.csv        per-request queueing, TTFT, TPOT and E2E of the simulation"
fi
echo "Next: README.md, \"A first run\"."
