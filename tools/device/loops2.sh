#!/usr/bin/env bash
# On the GPU machine, from the repo root (after tools/gpu_validate.sh's wheel setup): the CUDA
# tests of cond / while_loop / scan gradients, then the loop benchmarks against JAX on CUDA and
# on the machine's CPU. Full log: $OUT/loops2.log; a summary (at most ~40 lines) is printed last.
# Every step has its own timeout (about 5 minutes in all) and the script goes on when one fails.
set -uo pipefail
OUT="${OUT:-/tmp}"
LOG="$OUT/loops2.log"
SUMMARY="$OUT/loops2-summary.txt"
export PYTHONPATH="${PYTHONPATH:-src}:." PYTHONUNBUFFERED=1
export ACCY_CACHE_DIR="$OUT/accy-cache-loops2"
: > "$LOG"
: > "$SUMMARY"

step() {  # step NAME SECONDS COMMAND...: run with a timeout, log everything, note the status
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  echo "===== $name: $*" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$LOG" >> "$SUMMARY"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$SUMMARY" 2>&1
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" >> "$SUMMARY" 2>&1

# 1. CUDA tests: graph conditional nodes (cond: IF nodes, while_loop: a WHILE node), the branch
#    not taken never running, scan gradients (weight cotangents contracted after the loop).
step tests 70 python3 -m pytest -p no:cacheprovider -q -rfE \
  tests/backends/test_control_flow.py tests/autodiff/test_scan_weight_gradients.py \
  tests/autodiff/test_scan_gradients.py tests/backends/test_cpu_matrix_vector.py

# 2. The tanh RNN's gradient (carry 256, input 256) on CUDA, accy and JAX's lax.scan.
step rnn-cuda 70 python3 -m bench.scan_rnn --device cuda --steps 64,1024,16384 --repeat 5 \
  --timeout 40 --json "$OUT/scan_rnn-cuda.json"

# 3. The same on the CPU (16 cores), accy and JAX.
step rnn-cpu 40 python3 -m bench.scan_rnn --device cpu --steps 64,1024,16384 --repeat 3 \
  --timeout 30 --json "$OUT/scan_rnn-cpu.json"

# 4. One loop as a scan (kernels recorded per step) and as a while_loop (a WHILE node):
#    1024 short steps and 48 heavy ones (2048 x 2048 GEMMs), on CUDA.
step loops-cuda 40 python3 -m bench.loop_kinds --device cuda --json "$OUT/loop_kinds-cuda.json"

# 5. The demo model's layers as one scan against unrolled, 12 and 48 layers, with JAX.
if [ -f bench/scan_layers.py ]; then
  step layers-cuda 50 python3 -m bench.scan_layers --device cuda --layers 12,48 --timeout 40 \
    --json "$OUT/scan_layers-cuda.json"
  step layers-cpu 40 python3 -m bench.scan_layers --device cpu --layers 12,48 --timeout 30 \
    --json "$OUT/scan_layers-cpu.json"
fi

{
  echo "----- tests (summary line and failures)"
  grep -E "passed|failed|error" "$LOG" | grep -E "^[0-9]+ (passed|failed)|FAILED|ERROR" | head -12
  echo "----- rnn / layers (compile+first call, step, peak memory)"
  grep -E "^(accy|jax|loop) " "$LOG" | head -40
} >> "$SUMMARY"
tail -n 60 "$SUMMARY"
