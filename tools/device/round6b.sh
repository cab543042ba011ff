#!/usr/bin/env bash
# Session 4, call 3b (round6.sh's second half, whose scripts needed their $OUT to exist): the
# cold-start script on GPU 0, the conv script on GPU 1.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p /tmp/cold-out /tmp/conv-out
(CUDA_VISIBLE_DEVICES=0 OUT=/tmp/cold-out taskset -c 0-15 timeout 280 bash tools/device/cold.sh \
  > "$OUT/cold-summary.txt" 2>&1; cp /tmp/cold-out/cold.log /tmp/cold-out/cold.json "$OUT/") &
first=$!
(CUDA_VISIBLE_DEVICES=1 OUT=/tmp/conv-out taskset -c 16-31 timeout 280 bash tools/device/conv.sh \
  > "$OUT/conv-summary.txt" 2>&1; cp /tmp/conv-out/conv.log "$OUT/") &
second=$!
wait $first $second
echo "== cold"; tail -n 40 "$OUT/cold-summary.txt"
echo "== conv"; tail -n 40 "$OUT/conv-summary.txt"
