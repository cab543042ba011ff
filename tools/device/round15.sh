#!/usr/bin/env bash
# Session 5, call 6 (the last) on the two-GPU machine, main as submitted:
#   GPU 0: the whole suite with CUDA, then bench.scan_layers on the host CPU (accy, scan and
#          unrolled, 12 and 48 layers);
#   GPU 1: python -m bench.gpt2 --device cuda --dtype f32 (accy with attention written out,
#          JAX, PyTorch; TF32 off in all three).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(
  export CUDA_VISIBLE_DEVICES=0
  JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache taskset -c 0-15 timeout 170 \
    python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
  taskset -c 0-15 timeout 120 python3 -m bench.scan_layers --device cpu --layers 12,48 \
    --systems accy --repeat 3 --timeout 100 > "$OUT/scan-layers-cpu.txt" 2>&1
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  taskset -c 16-31 timeout 230 python3 -m bench.gpt2 --device cuda --dtype f32 --steps 5 \
    --json "$OUT/gpt2-cuda-f32.json" > "$OUT/gpt2-f32.txt" 2>&1
) &
second=$!
wait $first $second
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
echo "== scan_layers cpu"; cat "$OUT/scan-layers-cpu.txt" | tail -6
echo "== gpt2 f32"; tail -n 5 "$OUT/gpt2-f32.txt"
