#!/usr/bin/env bash
# Helper sibred (sibling row reductions in one pass), on one GPU, from the repository root:
#   1. tests/backends/test_sibling_reductions.py with CUDA (merged kernels against NumPy and the
#      reference; gradients of cross_entropy and layer_norm against finite differences);
#   2. tests/backends -k cuda;
#   3. tools/gpt2_profile.py --dtype bf16 --attention fused --top 20 (--dump: every action), and
#      the time of the kernels by step kind: `reductions` are the merged ones (compare with
#      reduce (rows) 1767 us, and accy_k11396 196 us + accy_k11487 190 us for the
#      cross-entropy's max and pick, which are now one kernel).
# Log: $OUT/sibred.log; a short summary on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/sibred.log"
: > "$LOG"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}:." PYTHONUNBUFFERED=1
export ACCY_CACHE_DIR=/tmp/sibred-cache

echo "== 1. sibling reduction tests (CUDA)" >> "$LOG"
timeout 150 python3 -m pytest -p no:cacheprovider -x -rfEs tests/backends/test_sibling_reductions.py \
  > "$OUT/sibred-tests.txt" 2>&1
echo "rc=$?" >> "$OUT/sibred-tests.txt"
cat "$OUT/sibred-tests.txt" >> "$LOG"

echo "== 2. tests/backends -k cuda" >> "$LOG"
JAX_PLATFORMS=cpu timeout 170 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 12 -x -rfE \
  tests/backends -k cuda > "$OUT/sibred-cuda.txt" 2>&1
echo "rc=$?" >> "$OUT/sibred-cuda.txt"
cat "$OUT/sibred-cuda.txt" >> "$LOG"

echo "== 3. gpt2 bf16 profile" >> "$LOG"
timeout 120 python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 20 \
  --dump "$OUT/sibred-gpt2" > "$OUT/sibred-profile.txt" 2>&1
echo "rc=$?" >> "$OUT/sibred-profile.txt"
cat "$OUT/sibred-profile.txt" >> "$LOG"
# Kernel time by step kind (the comment after "step N:"), from every action of the step.
if [ -f "$OUT/sibred-gpt2/actions.tsv" ]; then
  awk -F'\t' 'NR > 1 && $3 ~ /step [0-9]+: / {
      kind = $3; sub(/^.*step [0-9]+: /, "", kind); us[kind] += $2; n[kind]++ }
    END { for (k in us) printf "%9.1f us in %4d launches: %s\n", us[k], n[k], k }' \
    "$OUT/sibred-gpt2/actions.tsv" | sort -nr > "$OUT/sibred-kinds.txt"
  # The merged kernels, slowest first.
  awk -F'\t' 'NR > 1 && $3 ~ /: reductions/ { printf "  %8.1f us  %s\n", $2, $3 }' \
    "$OUT/sibred-gpt2/actions.tsv" | sort -nr | head -8 > "$OUT/sibred-merged.txt"
  { echo "-- by step kind"; cat "$OUT/sibred-kinds.txt"; echo "-- slowest reductions kernels";
    cat "$OUT/sibred-merged.txt"; } >> "$LOG"
fi

echo "== sibred summary"
echo "-- 1. sibling reduction tests:"; grep -E "passed|failed|error" "$OUT/sibred-tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/sibred-tests.txt" | head -5
echo "-- 2. tests/backends -k cuda:"; grep -E "passed|failed|error" "$OUT/sibred-cuda.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/sibred-cuda.txt" | head -5
echo "-- 3. gpt2 bf16 profile (before: 27.4 ms step; kernels 16.35 ms in 671 launches):"
grep -E "^== |^  (kernel|gemm|library) " "$OUT/sibred-profile.txt" | head -5
tail -n 3 "$OUT/sibred-profile.txt" | grep -E "Error|rc=" | head -2
echo "-- kernel time by step kind:"; head -8 "$OUT/sibred-kinds.txt" 2>/dev/null
echo "-- slowest merged (reductions) kernels:"; head -4 "$OUT/sibred-merged.txt" 2>/dev/null
echo "(full log: $LOG)"
