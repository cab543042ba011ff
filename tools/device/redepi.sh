#!/usr/bin/env bash
# Helper redepi (elementwise work on a row reduction's results inside its kernel: epilogues),
# on one GPU, from the repository root:
#   1. tests/backends/test_reduction_epilogues.py with CUDA (LayerNorm, chained epilogues,
#      integers, logsumexp, the gradients of LayerNorm, softmax and cross-entropy against the
#      reference; rows of 8200 with a block per row);
#   2. tools/gpt2_profile.py --dtype bf16 --attention fused --top 20 (--dump: every action):
#      the "kernel" line gives the kernel actions (before: 659) and their total (11.79 ms);
#      the launches left over 8192 elements (before: about a hundred, 4-12 us each);
#   3. tests/backends -k cuda (the other CUDA tests still pass).
# Log: $OUT/redepi.log; a short summary on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/redepi.log"
: > "$LOG"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}:." PYTHONUNBUFFERED=1
export ACCY_CACHE_DIR=/tmp/redepi-cache

echo "== 1. epilogue tests (CUDA)" >> "$LOG"
timeout 60 python3 -m pytest -p no:cacheprovider -x -rfEs tests/backends/test_reduction_epilogues.py \
  > "$OUT/redepi-tests.txt" 2>&1
echo "rc=$?" >> "$OUT/redepi-tests.txt"
cat "$OUT/redepi-tests.txt" >> "$LOG"

echo "== 2. gpt2 bf16 profile" >> "$LOG"
timeout 100 python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 20 \
  --dump "$OUT/redepi-gpt2" > "$OUT/redepi-profile.txt" 2>&1
echo "rc=$?" >> "$OUT/redepi-profile.txt"
cat "$OUT/redepi-profile.txt" >> "$LOG"
if [ -f "$OUT/redepi-gpt2/actions.tsv" ]; then
  # Kernel time by step kind (the comment after "step N:").
  awk -F'\t' 'NR > 1 && $3 ~ /step [0-9]+: / {
      kind = $3; sub(/^.*step [0-9]+: /, "", kind); us[kind] += $2; n[kind]++ }
    END { for (k in us) printf "%9.1f us in %4d launches: %s\n", us[k], n[k], k }' \
    "$OUT/redepi-gpt2/actions.tsv" | sort -nr > "$OUT/redepi-kinds.txt"
  # Kernels whose loop runs over exactly 8192 elements (the row scalars of 8 x 1024 tokens).
  if [ -f "$OUT/redepi-gpt2/kernels.cu" ]; then
    awk '/^extern "C" __global__/ { match($0, /accy_k[0-9a-z_]+/); name = substr($0, RSTART, RLENGTH) }
         / < 8192LL; i \+= / { print name }' "$OUT/redepi-gpt2/kernels.cu" | sort -u \
      > "$OUT/redepi-small.txt"
    small=0
    while read -r k; do
      n=$(awk -F'\t' -v k="$k" 'NR > 1 && $3 ~ ("^" k " ") { c++ } END { print c + 0 }' \
        "$OUT/redepi-gpt2/actions.tsv")
      small=$((small + n))
    done < "$OUT/redepi-small.txt"
    echo "launches of kernels over 8192 elements: $small ($(wc -l < "$OUT/redepi-small.txt") kernels)" \
      > "$OUT/redepi-small-count.txt"
  fi
  { echo "-- by step kind"; cat "$OUT/redepi-kinds.txt"; cat "$OUT/redepi-small-count.txt" 2>/dev/null; } >> "$LOG"
fi

echo "== 3. tests/backends -k cuda" >> "$LOG"
JAX_PLATFORMS=cpu timeout 75 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 12 -x -rfE \
  tests/backends -k cuda > "$OUT/redepi-cuda.txt" 2>&1
echo "rc=$?" >> "$OUT/redepi-cuda.txt"
cat "$OUT/redepi-cuda.txt" >> "$LOG"

echo "== redepi summary"
echo "-- 1. epilogue tests:"; grep -E "passed|failed|error" "$OUT/redepi-tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/redepi-tests.txt" | head -5
echo "-- 2. gpt2 bf16 profile (before: kernel 11.79 ms in 659 actions):"
grep -E "^== |^  (kernel|gemm|library) " "$OUT/redepi-profile.txt" | head -5
tail -n 3 "$OUT/redepi-profile.txt" | grep -E "Error|rc=" | head -2
cat "$OUT/redepi-small-count.txt" 2>/dev/null
echo "-- kernel time by step kind:"; head -8 "$OUT/redepi-kinds.txt" 2>/dev/null
echo "-- 3. tests/backends -k cuda:"; grep -E "passed|failed|error" "$OUT/redepi-cuda.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/redepi-cuda.txt" | head -5
echo "(full log: $LOG)"
