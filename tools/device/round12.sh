#!/usr/bin/env bash
# Session 5, call 3 on the two-GPU machine, main after merging every helper's branch: the
# helpers' own device scripts, two at a time.
#   GPU 0: tools/device/vec.sh (CUDA tests, kernel bandwidth, gpt2 and block profiles), then
#          tools/device/cpuremat.sh (CPU scan gradients against JAX);
#   GPU 1: tools/device/attn16.sh (attention tests and benchmarks), then tools/device/remat.sh
#          (GPT-2's memory with and without recomputation, accy against torch).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
run() {  # run NAME CORES LIMIT: tools/device/NAME.sh with its own OUT, summary and log back
  local name=$1 cores=$2 limit=$3
  mkdir -p "/tmp/$name-out"
  OUT="/tmp/$name-out" taskset -c "$cores" timeout "$limit" bash "tools/device/$name.sh" \
    > "$OUT/$name.txt" 2>&1
  cp "/tmp/$name-out/$name.log" "$OUT/" 2>/dev/null
}
( export CUDA_VISIBLE_DEVICES=0; run vec 0-15 330; run cpuremat 0-15 200 ) &
first=$!
( export CUDA_VISIBLE_DEVICES=1; run attn16 16-31 200; run remat 16-31 300 ) &
second=$!
wait $first $second
for name in vec attn16 remat cpuremat; do echo "=== $name"; tail -n 28 "$OUT/$name.txt"; done
