#!/usr/bin/env bash
# Session 5, call 1 on the two-GPU machine: main as session 4 left it.
#   A (both GPUs): gpt2 bf16 data-parallel on 2 GPUs with fused attention (a hang dumps every
#     thread's stack after --timeout), then on 1 GPU through the same path (the baseline);
#   B, GPU 0: the whole suite with CUDA (the session-4 review commits were never run on a GPU);
#   B, GPU 1: per-action profiles of gpt2 (fused), block and attention in bf16, then the bf16
#     mlp/attention/block workloads against JAX and PyTorch.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
{
  echo "=== gpt2 2 GPUs graph fused"
  NCCL_DEBUG=WARN timeout -k 5 100 python3 -m bench.gpt2 --gpus 2 --steps 8 --dtype bf16 \
    --accy-attention fused --timeout 80 --json /tmp/dp2.json
  echo "=== gpt2 1 GPU fused (DP path)"
  timeout -k 5 60 python3 -m bench.gpt2 --gpus 1 --steps 8 --dtype bf16 \
    --accy-attention fused --timeout 50 --json /tmp/dp1.json
} > "$OUT/dp.log" 2>&1
(
  export CUDA_VISIBLE_DEVICES=0
  JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache taskset -c 0-15 timeout 170 \
    python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  for w in gpt2 block attention; do
    taskset -c 16-31 timeout 90 python3 tools/gpt2_profile.py --workload $w --dtype bf16 \
      --attention fused --top 30
  done > "$OUT/profile.txt" 2>&1
  taskset -c 16-31 timeout 150 python3 -m bench --device cuda --dtype bf16 \
    --workloads mlp,attention,block --quick --worker-timeout 60 > "$OUT/bench.txt" 2>&1
) &
second=$!
wait $first $second
echo "== dp"; grep -E "tokens_per_s\"|step_ms|mode|failed|Error|Timeout|Thread|File" "$OUT/dp.log" | head -30
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -15
echo "== profile"; grep -E "^==|^  (gemm|kernel|library) " "$OUT/profile.txt"
echo "== bench"; tail -n 25 "$OUT/bench.txt"
