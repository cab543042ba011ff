#!/usr/bin/env bash
# One call on the two-GPU machine (session 3, call 2): the CPU bench old vs new pinned to two
# cores for the whole call; first the two-GPU checks (mesh2.sh), then on GPU 0 the cuDNN
# attention checks and on GPU 1 the CUDA bench old vs new. Summaries of each at the end.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(TOKENS="" ROUNDS=2 bash tools/device/lead-cpu.sh > "$OUT/laneC.txt" 2>&1) &
cpu=$!
BUDGET=${MESH_BUDGET:-300} taskset -c 2-31 bash tools/device/mesh2.sh > "$OUT/mesh2-summary.txt" 2>&1
(CUDA_VISIBLE_DEVICES=0 taskset -c 2-16 timeout 230 bash tools/device/cudnn.sh > "$OUT/cudnn-summary.txt" 2>&1) &
gpu0=$!
(CUDA_VISIBLE_DEVICES=1 taskset -c 17-31 timeout 200 python3 tools/compare_commits.py .old . --device cuda --rounds 1 \
  > "$OUT/cuda-compare.txt" 2>&1) &
gpu1=$!
wait $gpu0 $gpu1
echo "== mesh2"; cat "$OUT/mesh2-summary.txt"
echo "== cudnn"; cat "$OUT/cudnn-summary.txt"
echo "== cuda compare (old .old vs new)"; cat "$OUT/cuda-compare.txt"
wait $cpu
echo "== cpu compare"; tail -8 "$OUT/laneC.txt"
