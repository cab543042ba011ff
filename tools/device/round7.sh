#!/usr/bin/env bash
# Session 4, call 4 on the two-GPU machine: NCCL inside the CUDA graph (tools/device/nccl.sh, both
# GPUs), then side by side: gpt2 bf16 for the three systems, the step's profile and the bf16
# block workload (GPU 0); the whole suite with CUDA and the attention benchmark (GPU 1).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p /tmp/nccl-out
OUT=/tmp/nccl-out BUDGET=170 bash tools/device/nccl.sh > "$OUT/nccl-summary.txt" 2>&1
cp /tmp/nccl-out/nccl.json "$OUT/" 2>/dev/null
(
  export CUDA_VISIBLE_DEVICES=0
  taskset -c 0-15 timeout 190 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 \
    --timeout 120 --json "$OUT/gpt2-bf16.json" > "$OUT/gpt2.txt" 2>&1
  taskset -c 0-15 timeout 45 python3 tools/gpt2_profile.py --dtype bf16 --attention fused \
    --top 30 > "$OUT/profile.txt" 2>&1
  taskset -c 0-15 timeout 100 python3 -m bench --device cuda --dtype bf16 --workloads block \
    --worker-timeout 90 --quick --json "$OUT/block-bf16.json" > "$OUT/block.txt" 2>&1
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache taskset -c 16-31 timeout 150 \
    python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
  taskset -c 16-31 timeout 60 python3 -m bench.flash_attention --device cuda --preset gpt2 \
    --seconds 1 --timeout 25 --json "$OUT/attention-gpt2.json" >> "$OUT/gpt2.txt" 2>&1
) &
second=$!
wait $first $second
echo "== nccl"; tail -n 30 "$OUT/nccl-summary.txt"
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -15
echo "== gpt2 + attention"; grep -E "^(system|accy|jax|torch|gpt2)" "$OUT/gpt2.txt" | head -12
echo "== profile"; head -24 "$OUT/profile.txt"
echo "== block"; grep -E "block" "$OUT/block.txt" | head -4
