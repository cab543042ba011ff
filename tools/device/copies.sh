#!/usr/bin/env bash
# Helper copies (session 6): layout copies at memory speed. Runs from the repo root on the GPU
# machine after tools/gpu_validate.sh's first lines (PYTHONPATH=src:/tmp/site, wheels in /tmp/site).
#   1. tests/backends/test_cuda_copies.py (qkv split / gradient / plain packs against the
#      reference and NumPy) and tests/backends/test_cuda_transpose_packs.py (packs)
#   2. python -m bench.kernel_bandwidth: qkv_split, qkv_gradient, plain_pack, transpose_pack (GB/s)
#   3. tests/backends -k cuda -x (every CUDA backend test)
#   4. tools/gpt2_profile.py bf16 fused: the whole step, loop and pack totals, slowest actions
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/copies.log"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}:." PYTHONUNBUFFERED=1 JAX_PLATFORMS=cpu
: > "$LOG"
step() {  # step NAME SECONDS COMMAND...: run, log, never stop the script
  local name=$1 seconds=$2
  shift 2
  echo "===== $name" >> "$LOG"
  local start=$SECONDS
  timeout "$seconds" "$@" > "$OUT/copies-$name.txt" 2>&1
  local rc=$?
  cat "$OUT/copies-$name.txt" >> "$LOG"
  echo "===== $name: rc=$rc in $((SECONDS - start)) s" >> "$LOG"
  echo "$name rc=$rc $((SECONDS - start))s" >> "$OUT/copies-steps.txt"
}
: > "$OUT/copies-steps.txt"
step copies-tests 80 python3 -m pytest -p no:cacheprovider -n 8 -rfE \
  tests/backends/test_cuda_copies.py tests/backends/test_cuda_transpose_packs.py
step bandwidth 50 python3 -m bench.kernel_bandwidth \
  --cases qkv_split,qkv_gradient,plain_pack,transpose_pack --dtypes bf16,f32 --top 3
step backend-tests 120 python3 -m pytest -p no:cacheprovider -n 12 -rfE -x tests/backends -k cuda
# The real step only while the script stays under about 4 minutes.
if [ "$SECONDS" -lt 160 ]; then
  step gpt2-profile $((235 - SECONDS)) python3 tools/gpt2_profile.py --dtype bf16 \
    --attention fused --top 20 --dump "$OUT/copies-gpt2"
else
  echo "gpt2-profile skipped: ${SECONDS}s used" >> "$OUT/copies-steps.txt"
fi

echo "== copies summary (full log: $LOG)"
cat "$OUT/copies-steps.txt"
for t in copies-tests backend-tests; do
  echo "-- $t:"; grep -E "passed|failed|error" "$OUT/copies-$t.txt" | tail -1
  grep -E "^(FAILED|ERROR)" "$OUT/copies-$t.txt" | head -4
done
echo "-- bandwidth (GB/s = least bytes / kernel time; before: qkv copies ~1.4 TB/s, gradient ~0.9):"
grep -E "^(case|qkv|plain|transpose)" "$OUT/copies-bandwidth.txt" | head -9
echo "-- gpt2 bf16 step (before: 27.4 ms; loop 8687 us, dot (pack lhs) 1454 us):"
grep -E "^(== |  (gemm|kernel|library))" "$OUT/copies-gpt2-profile.txt" 2>/dev/null | head -4
if [ -f "$OUT/copies-gpt2/actions.tsv" ]; then
  awk -F'\t' '/: loop/ {l += $2; n++} /dot \(pack lhs\)/ {p += $2; m++}
    END {printf "  loop %.0f us in %d actions; dot (pack lhs) %.0f us in %d\n", l, n, p, m}' \
    "$OUT/copies-gpt2/actions.tsv"
  echo "  lines clamping an index per element: $(grep -c 'ACCY_CLAMP(i' "$OUT/copies-gpt2/kernels.cu")"
  grep -E "^-- slowest" -A8 "$OUT/copies-gpt2-profile.txt" | tail -8
fi
