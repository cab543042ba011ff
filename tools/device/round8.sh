#!/usr/bin/env bash
# Session 4, call 5 on the two-GPU machine, after merging loops4: GPT-2's gradients in bf16 with
# fused attention and with the composition against f32 (tools/gpt2_check.py) and the accy step's
# loss over 20 steps both ways (GPU 0); the whole suite with CUDA, then tools/device/loops4.sh
# (GPU 1).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(
  export CUDA_VISIBLE_DEVICES=0
  taskset -c 0-15 timeout 120 python3 tools/gpt2_check.py > "$OUT/check.txt" 2>&1
  for attention in composition fused; do
    taskset -c 0-15 timeout 60 python3 -m bench.gpt2 --device cuda --dtype bf16 --systems accy \
      --steps 20 --timeout 55 --accy-attention $attention --json "/tmp/gpt2-$attention.json" \
      >> "$OUT/check.txt" 2>&1
    python3 -c "import json; r=json.load(open('/tmp/gpt2-$attention.json'))['results'][0]; \
print('$attention losses', [round(x, 3) for x in r.get('losses', [])])" >> "$OUT/check.txt" 2>&1
  done
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache taskset -c 16-31 timeout 150 \
    python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
  mkdir -p /tmp/loops-out
  OUT=/tmp/loops-out taskset -c 16-31 timeout 230 bash tools/device/loops4.sh \
    > "$OUT/loops4-summary.txt" 2>&1
  cp /tmp/loops-out/loops4.log /tmp/loops-out/loops4.json "$OUT/" 2>/dev/null
) &
second=$!
wait $first $second
echo "== check"; grep -vE "^\s*$" "$OUT/check.txt" | grep -E "loss|composition|fused|accy \|" | head -12
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -15
echo "== loops4"; tail -n 40 "$OUT/loops4-summary.txt"
