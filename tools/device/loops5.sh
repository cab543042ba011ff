#!/usr/bin/env bash
# On the GPU machine, from the repo root (after the wheel setup of tools/gpu_validate.sh, with
# PYTHONPATH=src:/tmp/site:. exported): loops at scale on CUDA (branch loops5, issue 17).
#   1. tests: cuBLAS inside conditional nodes (both ways, in the file), WHILE-node scans,
#      cond/while_loop, scan gradients; then the loop tests again with
#      ACCY_CUDA_CUBLAS_IN_CONDITIONALS=0 (the old path: kernels inside conditional nodes).
#   2. tools/device/loops5_probe.py: which cuBLAS GEMM shapes instantiate inside an IF node, a
#      WHILE-node scan and a while_loop ("loops5-probe" lines: ran + max error, or FAILED).
#   3. bench.loop_kinds on CUDA, cuBLAS inside nodes (default) and, heavy case only, off.
#   4. bench.scan_rnn on CUDA, 64 / 1024 / 16384 steps, accy and JAX (remat off; 16384 is a
#      WHILE node running 8 scan iterations per node iteration), then 1024 steps forced into a
#      WHILE node (loops4: 18.3 ms, against 8.8 unrolled; the rows without "jax").
#   5. bench.scan_layers on CUDA, 12 and 48 layers, accy and JAX in the same run.
#   6. bench.scan_rnn on this host's CPU, 64 and 16384 steps, remat on and off, accy and JAX.
# Full log: $OUT/loops5.log; every benchmark's rows: $OUT/loops5.json. A summary of at most
# ~30 lines is printed last. Each step has its own timeout (~4 minutes at most in all; usually
# less) and the script goes on when one fails.
set -uo pipefail
OUT="${OUT:-/tmp}"
mkdir -p "$OUT"
LOG="$OUT/loops5.log"
WORK="$(mktemp -d)"
SUMMARY="$WORK/summary.txt"
export PYTHONPATH="${PYTHONPATH:-src}:." PYTHONUNBUFFERED=1
export ACCY_CACHE_DIR="$WORK/accy-cache"
: > "$LOG"
: > "$SUMMARY"

step() {  # step NAME SECONDS COMMAND...: run with a timeout, log everything, note the status
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  echo "===== $name: $*" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s" >> "$LOG"
  if [ "$rc" -ne 0 ]; then echo "== $name: exit $rc after $((SECONDS - start)) s" >> "$SUMMARY"; fi
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$SUMMARY" 2>&1

step tests 55 python3 -m pytest -p no:cacheprovider -p no:benchmark -rfE -n 8 \
  tests/backends/test_cuda_cublas_in_conditionals.py tests/backends/test_cuda_scan_while_node.py \
  tests/backends/test_control_flow.py tests/autodiff/test_scan_weight_gradients.py \
  tests/autodiff/test_scan_gradients.py
step tests-kernels-inside 30 env ACCY_CUDA_CUBLAS_IN_CONDITIONALS=0 ACCY_CACHE_DIR="$WORK/accy-cache-off" python3 -m pytest \
  -p no:cacheprovider -p no:benchmark -rfE -n 8 tests/backends/test_cuda_scan_while_node.py \
  tests/backends/test_control_flow.py
step probe 25 python3 tools/device/loops5_probe.py
step loops-cuda 25 python3 -m bench.loop_kinds --device cuda --repeat 3 \
  --json "$WORK/loops-cuda.json"
step loops-cuda-kernels 15 env ACCY_CUDA_CUBLAS_IN_CONDITIONALS=0 ACCY_CACHE_DIR="$WORK/accy-cache-off" python3 -m bench.loop_kinds \
  --device cuda --cases heavy --repeat 2 --json "$WORK/loops-cuda-kernels.json"
step rnn-cuda 50 python3 -m bench.scan_rnn --device cuda --steps 64,1024,16384 --repeat 3 \
  --remat off --timeout 20 --json "$WORK/rnn-cuda.json"
step rnn-cuda-node 20 python3 -m bench.scan_rnn --device cuda --steps 1024 --remat off \
  --systems accy --repeat 3 --timeout 15 --unrolled-nodes 0 --json "$WORK/rnn-cuda-node.json"
step layers-cuda 45 python3 -m bench.scan_layers --device cuda --layers 12,48 --repeat 3 \
  --timeout 20 --json "$WORK/layers-cuda.json"
step rnn-cpu 40 python3 -m bench.scan_rnn --device cpu --steps 64,16384 --repeat 2 \
  --timeout 15 --json "$WORK/rnn-cpu.json"

python3 - "$WORK" "$OUT/loops5.json" >> "$LOG" 2>&1 <<'EOF'
import json, pathlib, sys
rows = {}
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        rows[path.stem] = json.loads(path.read_text())
    except ValueError as error:
        rows[path.stem] = {"error": str(error)}
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
EOF

{
  echo "----- tests (summary line and failures)"
  grep -E "^[0-9]+ (passed|failed)|FAILED|ERROR" "$LOG" | head -3
  echo "----- probe: $(grep -c "^loops5-probe .*: ran" "$LOG") ran; failures and errors:"
  grep -E "^loops5-probe .*(FAILED|not run)" "$LOG" | cut -c1-200 | head -6
  echo "----- loops / rnn / layers"
  grep -E "^(accy|jax|loop ) " "$LOG" | cut -c1-200 | head -26
} >> "$SUMMARY"
tail -n 40 "$SUMMARY"
rm -rf "$WORK"
