#!/usr/bin/env bash
# On the GPU machine, from the repo root (after the wheel setup of tools/gpu_validate.sh, with
# PYTHONPATH=src:/tmp/site exported): loops at scale on CUDA (branch loops4).
#   1. CUDA tests: cond / while_loop, scans as one graph WHILE node, scan gradients and memory.
#   2. The RNN gradient's schedule: actions per step (no GPU needed; unrolled vs WHILE node).
#   3. bench.scan_rnn on CUDA, 64 / 1024 / 16384 steps: accy and JAX without remat, accy with.
#   4. bench.scan_rnn on CUDA at 1024 steps with every scan a WHILE node (vs 3's unrolled).
#   5. bench.loop_kinds on CUDA: scan unrolled, scan as a WHILE node, while_loop.
#   6. bench.scan_layers on CUDA, 12 and 48 layers, accy (JAX's are in session 4's brief).
#   7. Why cuBLAS failed inside conditional bodies: node types of a captured GEMM; a cond with
#      cuBLAS GEMMs in its branches (tools/device/loops4_cublas_probe.py).
#   8. bench.scan_rnn on this host's CPU, 64 and 16384 steps, accy and JAX (peak RSS, quiet host).
# Full log: $OUT/loops4.log; one JSON of every benchmark's rows: $OUT/loops4.json. A summary of
# at most ~40 lines is printed last. Each step has its own timeout (~3.5 minutes in all) and the
# script goes on when one fails.
set -uo pipefail
OUT="${OUT:-/tmp}"
LOG="$OUT/loops4.log"
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

step tests 60 python3 -m pytest -p no:cacheprovider -p no:benchmark -rfE -n 8 \
  tests/backends/test_cuda_scan_while_node.py tests/backends/test_control_flow.py \
  tests/autodiff/test_scan_weight_gradients.py tests/autodiff/test_scan_memory.py \
  tests/autodiff/test_scan_gradients.py

step schedule 15 python3 - <<'EOF'
import accy
from accy.backends.cuda.compile import compile_program
from accy.backends.cuda.schedule import Conditional
from accy.backends.cuda.steps import scan
from bench.scan_rnn import accy_program

def count(actions):
    return sum(1 + (count(a.body) if isinstance(a, Conditional) else 0) for a in actions)

for nodes in (scan.UNROLLED_NODES, 0):
    scan.UNROLLED_NODES = nodes
    counts = []
    for steps, remat in ((64, False), (64, True), (16384, False)):
        c = compile_program(accy.grad(accy_program(steps, remat), (0, 1, 2, 3)))
        counts.append(f"{steps} steps remat={remat}: {count(c.schedule.actions)}")
    print(f"schedule actions (unrolled_nodes={nodes}): " + ", ".join(counts))
EOF

step rnn-cuda 60 python3 -m bench.scan_rnn --device cuda --steps 64,1024,16384 --repeat 3 \
  --remat off --timeout 25 --json "$WORK/rnn-cuda.json"
step rnn-cuda-remat 30 python3 -m bench.scan_rnn --device cuda --steps 64,1024,16384 \
  --repeat 3 --remat on --systems accy --timeout 15 --json "$WORK/rnn-cuda-remat.json"
step rnn-cuda-node 20 python3 -m bench.scan_rnn --device cuda --steps 1024 --remat off \
  --systems accy --repeat 3 --timeout 20 --unrolled-nodes 0 --json "$WORK/rnn-cuda-node.json"
step loops-cuda 25 python3 -m bench.loop_kinds --device cuda --repeat 3 \
  --json "$WORK/loops-cuda.json"
step layers-cuda 30 python3 -m bench.scan_layers --device cuda --layers 12,48 --repeat 3 \
  --systems accy --timeout 15 --json "$WORK/layers-cuda.json"
step cublas-probe 15 python3 tools/device/loops4_cublas_probe.py
step rnn-cpu 45 python3 -m bench.scan_rnn --device cpu --steps 64,16384 --repeat 2 \
  --timeout 15 --json "$WORK/rnn-cpu.json"

python3 - "$WORK" "$OUT/loops4.json" >> "$LOG" 2>&1 <<'EOF'
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
  echo "----- schedule / rnn / loops / layers"
  grep -E "^(schedule|accy|jax|loop .*steps=|cublas-probe) " "$LOG" | cut -c1-240 | head -36
} >> "$SUMMARY"
tail -n 40 "$SUMMARY"
rm -rf "$WORK"
