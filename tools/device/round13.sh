#!/usr/bin/env bash
# Session 5, call 4 on the two-GPU machine, main after every merge and fix:
#   GPU 0: the whole suite with CUDA; `python -m bench.gpt2 --device cuda --dtype bf16`
#          (accy, JAX, PyTorch); scan_layers at 48 layers, accy scan and unrolled;
#   GPU 1: the bf16 mlp/attention/block workloads against JAX and PyTorch, then the attention
#          workload composed (ACCY_CUDNN_ATTENTION=0) and through cuDNN (ACCY_CUDNN_MIN_BLOCKS=0),
#          accy alone; then gpt2 in f32 (accy, JAX, PyTorch).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(
  export CUDA_VISIBLE_DEVICES=0
  JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache taskset -c 0-15 timeout 170 \
    python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
  taskset -c 0-15 timeout 150 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 \
    --json "$OUT/gpt2-cuda-bf16.json" > "$OUT/gpt2.txt" 2>&1
  taskset -c 0-15 timeout 90 python3 -m bench.scan_layers --device cuda --layers 48 \
    --systems accy --repeat 3 --timeout 80 >> "$OUT/gpt2.txt" 2>&1
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  taskset -c 16-31 timeout 220 python3 -m bench --device cuda --dtype bf16 --quick \
    --workloads mlp,attention,block --worker-timeout 80 --json "$OUT/cuda-bf16.json" \
    > "$OUT/workloads.txt" 2>&1
  for how in ACCY_CUDNN_ATTENTION=0 ACCY_CUDNN_MIN_BLOCKS=0; do
    echo "=== attention workload, accy, $how" >> "$OUT/workloads.txt"
    env $how taskset -c 16-31 timeout 40 python3 tools/gpt2_profile.py --workload attention \
      --dtype bf16 --top 3 >> "$OUT/workloads.txt" 2>&1
  done
  taskset -c 16-31 timeout 170 python3 -m bench.gpt2 --device cuda --dtype f32 --steps 5 \
    --json "$OUT/gpt2-cuda-f32.json" > "$OUT/gpt2-f32.txt" 2>&1
) &
second=$!
wait $first $second
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
echo "== gpt2 bf16 + scan_layers 48"; grep -vE "^\s*$|warning" "$OUT/gpt2.txt" | tail -n 9
echo "== bf16 workloads"; tail -n 30 "$OUT/workloads.txt"
echo "== gpt2 f32"; tail -n 6 "$OUT/gpt2-f32.txt"
