#!/usr/bin/env bash
# Session 6, call 1 on the two-GPU machine (or one GPU, in turn), main with the scanlayers merge:
#   GPU 0: the whole suite with CUDA, then where the bf16 GPT-2 step's time goes, every action
#          and the kernels' source (tools/gpt2_profile.py --dump);
#   GPU 1: python -m bench.gpt2 --device cuda --dtype f32 (accy with attention written out,
#          JAX, PyTorch; TF32 off in all three), then the block workload's actions and source.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(
  export CUDA_VISIBLE_DEVICES=0
  JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache taskset -c 0-15 timeout 170 \
    python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
  taskset -c 0-15 timeout 100 python3 tools/gpt2_profile.py --dtype bf16 --attention fused \
    --top 40 --dump "$OUT/gpt2" > "$OUT/profile.txt" 2>&1
) &
first=$!
# On a one-GPU machine the second half waits for the first and shares its GPU.
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -lt 2 ]; then wait $first; fi
(
  if [ "$gpus" -ge 2 ]; then export CUDA_VISIBLE_DEVICES=1; fi
  taskset -c $([ "$gpus" -ge 2 ] && echo 16-31 || echo 0-15) timeout 200 python3 -m bench.gpt2 --device cuda --dtype f32 --steps 5 \
    --json "$OUT/gpt2-cuda-f32.json" > "$OUT/gpt2-f32.txt" 2>&1
  taskset -c $([ "$gpus" -ge 2 ] && echo 16-31 || echo 0-15) timeout 60 python3 tools/gpt2_profile.py --workload block --dtype bf16 \
    --top 5 --dump "$OUT/block" >> "$OUT/gpt2-f32.txt" 2>&1
) &
second=$!
wait $first $second
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
echo "== gpt2 bf16 profile"; head -n 30 "$OUT/profile.txt"
echo "== gpt2 f32 + block profile"; tail -n 16 "$OUT/gpt2-f32.txt"
