#!/usr/bin/env bash
# Session 5, call 5 on the two-GPU machine:
#   A (both GPUs): gpt2 bf16 data-parallel on 2 GPUs and on 1 (fused attention, one CUDA graph
#     per step), then PyTorch DDP (torch.compile, bf16 autocast) on 2 GPUs;
#   B: where the f32 GPT-2 step's time goes (tools/gpt2_profile.py --dtype f32), with the
#     recomputation of cheap values (GPU 0) and without it (GPU 1).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
{
  for gpus in 2 1; do
    echo "=== gpt2 bf16 data-parallel on $gpus GPU(s), fused attention"
    timeout -k 5 110 python3 -m bench.gpt2 --gpus $gpus --steps 10 --dtype bf16 \
      --accy-attention fused --timeout 100 --json "$OUT/gpt2-dp$gpus.json"
  done
  echo "=== PyTorch DDP, torch.compile, bf16, 2 GPUs"
  timeout -k 5 150 torchrun --standalone --nproc-per-node 2 bench/ddp_torch.py --dtype bf16 \
    --compile --json "$OUT/ddp-torch.json"
} > "$OUT/dp.log" 2>&1
PROFILE="import dataclasses, runpy, sys, accy.backends.cuda.compile as c
c.GPU = dataclasses.replace(c.GPU, rematerialize_after=int(sys.argv[1]))
sys.argv = ['gpt2_profile.py', '--dtype', 'f32', '--top', '25']
runpy.run_path('tools/gpt2_profile.py', run_name='__main__')"
( CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -c "$PROFILE" 64 > "$OUT/f32-remat.txt" 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -c "$PROFILE" 0 > "$OUT/f32-plain.txt" 2>&1 ) &
wait
echo "== dp"; grep -E "\"tokens_per_s\"|\"step_ms\"|\"mode\"|failed|Error|Traceback|torch DDP|Timeout" \
  "$OUT/dp.log" | cut -c1-220 | head -20
for f in remat plain; do echo "== f32 profile ($f)"; grep -E "^==|^  (gemm|kernel|library) " "$OUT/f32-$f.txt"; done
echo "== f32 slowest (remat)"; sed -n '/-- slowest/,$p' "$OUT/f32-remat.txt" | head -26
