#!/usr/bin/env bash
# On the GPU machine, from the repo root (PYTHONPATH=src:/tmp/site already exported): the
# CUDA-gated tests of the ops2 branch (gather with batch axes and modes, scatter modes, the sort
# kind: every catalog case against the reference, long rows, gradients), then the conv workload
# (ResNet basic block) on cuda in f32 against JAX and PyTorch, and in bf16 if the harness takes
# --dtype and the workload has a bf16 version. Full log in $OUT/ops2.log; summary at the end.
set -uo pipefail
OUT="${OUT:-/tmp}"
LOG="$OUT/ops2.log"
STEPS="$OUT/ops2-steps.txt"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}" PYTHONUNBUFFERED=1 ACCY_CACHE_DIR="$OUT/accy-cache"
: > "$LOG"
: > "$STEPS"
step() {  # step NAME SECONDS COMMAND...: run, log everything, keep going on failure
  local name="$1" seconds="$2"; shift 2
  echo "===== $name: $*" >> "$LOG"
  local start=$SECONDS
  timeout "$seconds" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "===== $name: exit $rc after $((SECONDS - start)) s" >> "$LOG"
  echo "$name: exit $rc ($((SECONDS - start)) s)" >> "$STEPS"
}
step versions 20 python3 -c "import cupy, jax, torch; print('cupy', cupy.__version__, 'jax', jax.__version__, jax.devices(), 'torch', torch.__version__)"
step tests 110 python3 -m pytest -p no:cacheprovider -rs -rfE \
  tests/backends/test_cuda_kinds.py -k "scatter or sort or indexing" \
  tests/backends/test_sort_backends.py
step conv-f32 85 env PYTHONPATH="$PYTHONPATH:." python3 -m bench --device cuda --workloads conv \
  --quick --json "$OUT/conv-cuda-f32.json"
if env PYTHONPATH="$PYTHONPATH:." python3 -m bench --help 2>/dev/null | grep -q -- "--dtype"; then
  step conv-bf16 45 env PYTHONPATH="$PYTHONPATH:." python3 -m bench --device cuda --workloads conv \
    --quick --dtype bf16 --json "$OUT/conv-cuda-bf16.json"
else
  echo "conv-bf16: skipped (this harness has no --dtype)" >> "$STEPS"
fi

echo "== ops2.sh summary (full log: $LOG)"
cat "$STEPS"
echo "-- tests"
grep -E "^[0-9]+ (passed|failed)|[0-9]+ passed|^FAILED|^ERROR|^SKIPPED" "$LOG" | head -14
echo "-- conv workload (lines of the bench tables)"
grep -E "conv|accy|jax|torch|ratio|error|Error" "$LOG" | grep -vE "^=====|pytest|tests/" | head -16
