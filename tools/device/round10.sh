#!/usr/bin/env bash
# Session 5, call 2 on the two-GPU machine, main after merging hfuse, donate and loops5 and the
# split bf16 GEMMs:
#   A (both GPUs): gpt2 bf16 data-parallel on 2 GPUs, fused attention, one graph per step;
#   B, GPU 0: tools/device/hfuse.sh's tests, tools/device/donate.sh, block's profile;
#   B, GPU 1: tools/device/loops5.sh.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
{
  echo "=== gpt2 2 GPUs graph fused"
  NCCL_DEBUG=WARN timeout -k 5 100 python3 -m bench.gpt2 --gpus 2 --steps 8 --dtype bf16 \
    --accy-attention fused --timeout 90 --json /tmp/dp2.json
} > "$OUT/dp.log" 2>&1
(
  export CUDA_VISIBLE_DEVICES=0
  PYTEST=(python3 -m pytest -p no:benchmark -p no:cacheprovider -q -rfE)
  {
    JAX_PLATFORMS=cpu timeout 60 "${PYTEST[@]}" tests/backends/test_cuda_batching.py \
      tests/backends/test_split_gemms.py
    JAX_PLATFORMS=cpu timeout 90 "${PYTEST[@]}" -n 8 tests/backends -k cuda
    timeout 60 python3 tools/gpt2_profile.py --workload block --dtype bf16 --top 12
  } > "$OUT/gpu0.log" 2>&1
  mkdir -p /tmp/donate-out
  OUT=/tmp/donate-out taskset -c 0-15 timeout 300 bash tools/device/donate.sh > "$OUT/donate.txt" 2>&1
  cp /tmp/donate-out/donate.log "$OUT/" 2>/dev/null
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  mkdir -p /tmp/loops-out
  OUT=/tmp/loops-out taskset -c 16-31 timeout 290 bash tools/device/loops5.sh > "$OUT/loops5.txt" 2>&1
  cp /tmp/loops-out/loops5.log "$OUT/" 2>/dev/null
) &
second=$!
wait $first $second
echo "== dp"; grep -E "tokens_per_s\"|step_ms|\"mode\"|failed|Error|Traceback" "$OUT/dp.log" | cut -c1-200 | head -12
echo "== gpu0"; grep -E "passed|failed|^FAILED|^ERROR|^==|^  (gemm|kernel)" "$OUT/gpu0.log" | head -20
echo "== donate"; tail -n 25 "$OUT/donate.txt"
echo "== loops5"; tail -n 32 "$OUT/loops5.txt"
