#!/usr/bin/env bash
# Session 4, call 2 on the two-GPU machine: issue 15's bf16 `block` workload with room for JAX's
# and PyTorch's compilation (GPU 0); the GPT-2 step's profile with fused attention and the gpt2
# workload in bf16 for all three systems (GPU 1). Under 420 s.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(
  export CUDA_VISIBLE_DEVICES=0
  taskset -c 0-15 timeout 400 python3 -m bench --device cuda --dtype bf16 --workloads block \
    --worker-timeout 300 --quick --json "$OUT/block-bf16.json" > "$OUT/block-bf16.txt" 2>&1
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  taskset -c 16-31 timeout 100 python3 tools/gpt2_profile.py --dtype bf16 --attention fused \
    --top 40 > "$OUT/profile-fused.txt" 2>&1
  taskset -c 16-31 timeout 290 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 \
    --timeout 140 --json "$OUT/gpt2-bf16.json" > "$OUT/gpt2-bf16.txt" 2>&1
) &
second=$!
wait $first $second
echo "== block bf16"; tail -15 "$OUT/block-bf16.txt"
echo "== profile fused"; head -50 "$OUT/profile-fused.txt"
echo "== gpt2 bf16"; tail -15 "$OUT/gpt2-bf16.txt"
