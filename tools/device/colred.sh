#!/usr/bin/env bash
# Helper colred (session 6): column reductions in one kernel. Runs from the repo root on the GPU
# machine after tools/gpu_validate.sh's first lines (PYTHONPATH=src:/tmp/site, wheels in /tmp/site).
#   1. tests/backends/test_cuda_columns.py (the new kernel against NumPy, replays, views)
#   2. tests/backends -k cuda -x (every CUDA backend test)
#   3. python -m bench.kernel_bandwidth: column sums and the gain gradient (GB/s), layer_norm
#   4. tools/device/colred_sweep.py: the cut's constants against their neighbours
#   5. tools/gpt2_profile.py bf16: the "reduce (columns)"/"(combine)" totals of the real step
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/colred.log"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}:." PYTHONUNBUFFERED=1 JAX_PLATFORMS=cpu
: > "$LOG"
step() {  # step NAME SECONDS COMMAND...: run, log, never stop the script
  local name=$1 seconds=$2
  shift 2
  echo "===== $name" >> "$LOG"
  local start=$SECONDS
  timeout "$seconds" "$@" > "$OUT/colred-$name.txt" 2>&1
  local rc=$?
  cat "$OUT/colred-$name.txt" >> "$LOG"
  echo "===== $name: rc=$rc in $((SECONDS - start)) s" >> "$LOG"
  echo "$name rc=$rc $((SECONDS - start))s" >> "$OUT/colred-steps.txt"
}
: > "$OUT/colred-steps.txt"
step columns-tests 80 python3 -m pytest -p no:cacheprovider -n 8 -rfE tests/backends/test_cuda_columns.py
step bandwidth 45 python3 -m bench.kernel_bandwidth --cases column_sum,column_sum_3072,gain_gradient,layer_norm --dtypes bf16,f32 --top 2
step sweep 60 python3 tools/device/colred_sweep.py
step backend-tests 120 python3 -m pytest -p no:cacheprovider -n 12 -rfE -x tests/backends -k cuda
# The real step only while the script stays under about 4 minutes.
if [ "$SECONDS" -lt 150 ]; then
  step gpt2-profile $((235 - SECONDS)) python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 10 --dump "$OUT/colred-gpt2"
else
  echo "gpt2-profile skipped: ${SECONDS}s used" >> "$OUT/colred-steps.txt"
fi

echo "== colred summary (full log: $LOG)"
cat "$OUT/colred-steps.txt"
echo "-- columns tests:"; grep -E "passed|failed|error" "$OUT/colred-columns-tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/colred-columns-tests.txt" | head -5
echo "-- backend tests:"; grep -E "passed|failed|error" "$OUT/colred-backend-tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/colred-backend-tests.txt" | head -5
echo "-- bandwidth:"; grep -E "^(case|column|gain|layer)" "$OUT/colred-bandwidth.txt" | head -10
echo "-- sweep (us and GB/s per shape; * = defaults):"; head -n 18 "$OUT/colred-sweep.txt"
echo "-- gpt2 bf16 step:"; grep -E "^== " "$OUT/colred-gpt2-profile.txt" 2>/dev/null | head -1
if [ -f "$OUT/colred-gpt2/actions.tsv" ]; then
  awk -F'\t' '/reduce \(columns\)/ {c += $2; n++} /reduce \(combine\)/ {d += $2; m++}
    END {printf "  reduce (columns) %.0f us in %d actions; reduce (combine) %.0f us in %d\n", c, n, d, m}' \
    "$OUT/colred-gpt2/actions.tsv"
fi
