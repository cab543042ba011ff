#!/usr/bin/env bash
# Branch hfuse on one GPU: batched launches of identical kernels (issue 20). Runs the batching
# tests with CUDA (multi-tensor AdamW against NumPy, bit for bit the unbatched schedule), the
# CUDA backend's quick tests, the GPT-2 bf16 step and its per-action profile.
#   OUT=... bash tools/device/hfuse.sh
set -uo pipefail
OUT="${OUT:-/tmp/hfuse-out}"
mkdir -p "$OUT"
LOG="$OUT/hfuse.log"
: >"$LOG"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site:.}"
step() {  # step NAME SECONDS COMMAND...: run, log everything, remember the status
  local name=$1 seconds=$2
  shift 2
  echo "== $name: $*" >>"$LOG"
  timeout "$seconds" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name rc=$rc" >>"$LOG"
  printf '%-10s rc=%s\n' "$name" "$rc" >>"$OUT/summary.txt"
}
: >"$OUT/summary.txt"
PYTEST=(python3 -m pytest -p no:benchmark -p no:cacheprovider -q -x)
JAX_PLATFORMS=cpu step batching 60 "${PYTEST[@]}" tests/backends/test_cuda_batching.py -rs
JAX_PLATFORMS=cpu step cuda-quick 60 "${PYTEST[@]}" tests/backends -k cuda
step bench 100 python3 -m bench.gpt2 --device cuda --dtype bf16 --systems accy --steps 10 --timeout 80
step profile 60 python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 15
{
  echo "--- hfuse summary (full log: $LOG)"
  cat "$OUT/summary.txt"
  grep -E "passed|failed|skipped|error" "$LOG" | grep -v "^==" | tail -4
  grep -E "accy .*ms|step|tokens/s" "$LOG" | grep -iv "^==\|warn" | grep -i "accy" | tail -4
  sed -n '/^== gpt2 /,/-- slowest/p' "$LOG" | head -6
  grep -A6 -- "-- slowest actions" "$LOG" | tail -6
} | head -30
