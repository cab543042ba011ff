#!/usr/bin/env bash
# Branch `vec` (issues 15, 20): vector loads/stores in the generated CUDA kernels.
# One GPU, ~3 minutes. Run from the repo root: OUT=/some/dir bash tools/device/vec.sh
#   1. the CUDA tests under tests/backends (every kind in every dtype, the vector tests);
#   2. python -m bench.kernel_bandwidth (GB/s of elementwise, row reduction, cross-entropy,
#      LayerNorm, bf16 and f32);
#   3. per-action profiles: the GPT-2 step (bf16, fused attention) and the `block` workload.
# Full log: $OUT/vec.log; a short summary on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/vec.log"
: > "$LOG"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site:.}" PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run with a timeout, log everything, never stop the script
  local name=$1 seconds=$2
  shift 2
  echo "=== $name" >> "$LOG"
  local start=$SECONDS
  timeout -k 5 "$seconds" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - start)) s" >> "$LOG"
  echo "$name: rc=$rc ($((SECONDS - start)) s)"
}

step tests 110 env JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/vec-cache python3 -m pytest \
  -p no:benchmark -p no:cacheprovider -n 12 -rfE tests/backends -k cuda
step bandwidth 80 python3 -m bench.kernel_bandwidth --json "$OUT/kernel_bandwidth.json"
step gpt2_profile 90 python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 20
step block_profile 60 python3 tools/gpt2_profile.py --workload block --dtype bf16 --top 15

echo "== summary (full log: $LOG)"
grep -E "^[0-9]+ (passed|failed)|passed|failed" "$LOG" | grep -E "passed|failed" | tail -2
grep -E "^(FAILED|ERROR)" "$LOG" | head -6
sed -n '/^=== bandwidth$/,/^=== bandwidth:/p' "$LOG" | grep -E "^(case|elementwise|row_sum|cross_ent|layer_norm)" | head -10
grep -E "^== |^  (gemm|kernel|library) " "$LOG" | head -8
sed -n '/^=== gpt2_profile$/,/^=== gpt2_profile:/p' "$LOG" | grep -A5 "slowest actions" | tail -5
