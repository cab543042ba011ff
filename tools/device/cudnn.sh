#!/usr/bin/env bash
# On the GPU machine, from the repo root, after the lead installed .whl/*.whl into /tmp/site
# (PYTHONPATH=src:/tmp/site): cuDNN's version, a logged smoke run of cuDNN attention at GPT-2
# small's shape (with a profile), the CUDA-gated cuDNN attention tests, and the fused-attention
# benchmark (accy, the unfused composition, JAX, PyTorch; bf16, causal, fwd+bwd). Full log in
# $OUT/cudnn.log; a summary of at most ~40 lines at the end.
set -uo pipefail
OUT="${OUT:-/tmp}"
LOG="$OUT/cudnn.log"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}" PYTHONUNBUFFERED=1 ACCY_CACHE_DIR="$OUT/accy-cache"
: > "$LOG"
step() {  # step NAME SECONDS COMMAND...: run, log everything, keep going on failure
  local name="$1" seconds="$2"; shift 2
  echo "===== $name: $*" >> "$LOG"
  local start=$SECONDS
  timeout "$seconds" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "===== $name: exit $rc after $((SECONDS - start)) s" >> "$LOG"
  echo "$name: exit $rc ($((SECONDS - start)) s)" >> "$OUT/cudnn-steps.txt"
}
: > "$OUT/cudnn-steps.txt"
step versions 30 python3 -c "import cudnn, cupy; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version(), 'cupy', cupy.__version__)"
step smoke 90 python3 tools/device/cudnn_smoke.py
step tests 120 python3 -m pytest -p no:cacheprovider -rs -rfE --log-level=INFO tests/attention/test_cudnn.py
step bench 110 env PYTHONPATH="$PYTHONPATH:." python3 -m bench.flash_attention --device cuda --dtype bf16 \
  --batch 8 --heads 12 --tokens 1024 --dim 64 --causal --seconds 2 --systems accy,accy-composition,jax,torch

echo "== cudnn.sh summary (full log: $LOG)"
cat "$OUT/cudnn-steps.txt"
grep -E "^cudnn frontend|compiled in|library steps|^declined|first call|max \|accy|graph step|^profile|^  +[0-9.]+ ms" "$LOG" | head -22
grep -E "passed|failed|error" "$LOG" | grep -E "^[0-9]+ (passed|failed)|^FAILED|^ERROR" | head -8
grep -E '^\{"system"' "$LOG" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(f\"{r['system']:>17}: {r.get('step_ms', '-'):>8} ms  {r.get('tflops', '-'):>7} TFLOP/s  {r['status'][:60]}\")
"
