#!/usr/bin/env bash
# Branch `tpack` (issue 20): GEMM operands packed by a transposing copy go tile by tile through
# shared memory (accy.backends.cuda.tiles). One GPU, about 3-4 minutes. From the repo root:
#   OUT=/some/dir bash tools/device/tpack.sh
#   1. tests/backends/test_cuda_transpose_packs.py (packs of every float dtype against NumPy),
#      then tests/backends -k cuda -x;
#   2. python -m bench.kernel_bandwidth --cases transpose_pack,plain_pack (GB/s of the pack
#      kernel alone: GPT-2's [8, 12, 1024, 64 of 72] attention output packed for the weight
#      gradient, and for comparison the plain pack of the same tensor), bf16 and f32;
#   3. the same transpose_pack case with the tiles switched off (the old kernel, patched in
#      for this run only): the before;
#   4. the GPT-2 bf16 step's profile (fused attention): every pack action's time, and the total.
# Full log: $OUT/tpack.log; a short summary on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/tpack.log"
: > "$LOG"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}:." PYTHONUNBUFFERED=1

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

section() {  # the lines of the log between "=== NAME" and "=== NAME: rc=..."
  sed -n "/^=== $1\$/,/^=== $1: rc=/p" "$LOG"
}

PYTEST=(env JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/tpack-cache python3 -m pytest
  -p no:benchmark -p no:cacheprovider -rfE)
step tpack_tests 60 "${PYTEST[@]}" -n 8 tests/backends/test_cuda_transpose_packs.py
step cuda_tests 110 "${PYTEST[@]}" -n 12 -x tests/backends -k cuda
step bandwidth 40 python3 -m bench.kernel_bandwidth --cases transpose_pack,plain_pack \
  --dtypes bf16,f32 --json "$OUT/tpack_bandwidth.json"
step untiled 30 python3 -c "
import sys
import accy.backends.cuda.steps.dot as dot
from bench import kernel_bandwidth
dot.transposed_axes = lambda *args: None  # every pack the old element-by-element kernel
sys.exit(kernel_bandwidth.main(['--cases', 'transpose_pack', '--dtypes', 'bf16,f32']))
"
if [ "$SECONDS" -lt 140 ]; then
  step gpt2_profile 75 python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 12 \
    --dump "$OUT/tpack-gpt2"
else
  echo "gpt2_profile: skipped (the steps before took $SECONDS s)"
fi

echo "== summary (full log: $LOG)"
section tpack_tests | grep -E "passed|failed" | tail -1
section cuda_tests | grep -E "passed|failed" | tail -1
grep -E "^(FAILED|ERROR)" "$LOG" | head -6
echo "-- pack kernels alone (bytes: one read + one write of 8x12x1024x64 values)"
section bandwidth | grep -E "^(case|transpose_pack|plain_pack)"
echo "-- before (no tiles)"
section untiled | grep -E "^transpose_pack"
if [ -f "$OUT/tpack-gpt2/actions.tsv" ]; then
  echo "-- gpt2 bf16 step: pack actions (us), was 12 x 104 + 12 x 17 = 1454 us"
  awk -F'\t' '/\(pack / { n[$3] += 1; t[$3] += $2; all += $2 }
    END { for (k in n) printf "  %3d x %7.1f us  %s\n", n[k], t[k] / n[k], k; printf "  total %.1f us\n", all }' \
    "$OUT/tpack-gpt2/actions.tsv"
  section gpt2_profile | grep -E "^== gpt2|^  (kernel|gemm|library)" | head -5
fi
