#!/usr/bin/env bash
# Session 5, final call on the two-GPU machine, main after every merge:
#   A (both GPUs): gpt2 bf16 data-parallel on 2 GPUs and on 1 (fused attention, one CUDA graph
#     per step), then PyTorch DDP on 2 GPUs (bench/ddp_torch.py);
#   B, GPU 0: python -m bench --device cuda --workloads gpt2 in bf16 (accy, JAX, PyTorch);
#   B, GPU 1: the bf16 mlp/attention/block workloads against JAX and PyTorch, then gpt2 in f32.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
{
  for gpus in 2 1; do
    echo "=== gpt2 bf16 data-parallel on $gpus GPUs (fused attention)"
    timeout -k 5 100 python3 -m bench.gpt2 --gpus $gpus --steps 10 --dtype bf16 \
      --accy-attention fused --timeout 90 --json /tmp/dp$gpus.json
  done
  echo "=== PyTorch DDP on 2 GPUs"
  timeout -k 5 150 torchrun --standalone --nproc-per-node 2 bench/ddp_torch.py --dtype bf16 \
    --compile
} > "$OUT/dp.log" 2>&1
cp /tmp/dp2.json "$OUT/dp2.json" 2>/dev/null
(
  export CUDA_VISIBLE_DEVICES=0
  taskset -c 0-15 timeout 280 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 \
    --json "$OUT/gpt2-bf16.json" > "$OUT/gpt2.txt" 2>&1
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  taskset -c 16-31 timeout 200 python3 -m bench --device cuda --dtype bf16 \
    --workloads mlp,attention,block --quick --worker-timeout 60 > "$OUT/bench.txt" 2>&1
  taskset -c 16-31 timeout 200 python3 -m bench.gpt2 --device cuda --dtype f32 --steps 5 \
    --json /tmp/gpt2-f32.json >> "$OUT/bench.txt" 2>&1
) &
second=$!
wait $first $second
echo "== dp"; grep -E "tokens_per_s\"|step_ms|\"mode\"|failed|Error|Traceback|torch DDP" "$OUT/dp.log" | cut -c1-300 | head -20
echo "== gpt2 bf16"; tail -n 12 "$OUT/gpt2.txt"
echo "== bf16 workloads + gpt2 f32"; tail -n 30 "$OUT/bench.txt"
