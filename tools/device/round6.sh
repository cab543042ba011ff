#!/usr/bin/env bash
# Session 4, call 3 on the two-GPU machine, after merging attn4, nccl, conv and cold: the whole
# suite with CUDA, then the cold-start script on GPU 0; the attention probe, then the conv
# script on GPU 1. Under 560 s. At most 8 files come back: the suite log, each script's log
# and JSON.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(
  export CUDA_VISIBLE_DEVICES=0
  JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache taskset -c 0-15 timeout 200 \
    python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
  OUT=/tmp/cold-out taskset -c 0-15 timeout $((545 - SECONDS)) bash tools/device/cold.sh \
    > /tmp/cold-summary.txt 2>&1
  cp /tmp/cold-out/cold.log /tmp/cold-out/cold.json "$OUT/" 2>/dev/null
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  OUT=/tmp/attn-out taskset -c 16-31 timeout 260 bash tools/device/attn4.sh \
    > /tmp/attn4-summary.txt 2>&1
  cp /tmp/attn-out/attn4.log /tmp/attn-out/attn4.json "$OUT/" 2>/dev/null
  OUT=/tmp/conv-out taskset -c 16-31 timeout $((545 - SECONDS)) bash tools/device/conv.sh \
    > /tmp/conv-summary.txt 2>&1
  cp /tmp/conv-out/conv.log "$OUT/" 2>/dev/null
) &
second=$!
wait $first $second
cat /tmp/cold-summary.txt /tmp/attn4-summary.txt /tmp/conv-summary.txt > "$OUT/summaries.txt"
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -25
echo "== cold"; tail -n 30 /tmp/cold-summary.txt
echo "== attn4"; tail -n 40 /tmp/attn4-summary.txt
echo "== conv"; tail -n 30 /tmp/conv-summary.txt
