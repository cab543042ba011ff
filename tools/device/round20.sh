#!/usr/bin/env bash
# Session 6, call 5 (one H200): why does accy's bf16 GPT-2 loss fall more slowly than JAX's?
# The losses of 10 steps: accy as compiled, accy with CUDA rounding every bf16 operation, JAX;
# tools/gpt2_check.py (bf16 gradients, composition and fused attention, against f32); the
# column-reduction tests.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for variant in as-is round-each jax; do
  ACCY_CACHE_DIR=/tmp/cache-$variant timeout 120 python3 tools/device/loss_trace.py \
    --variant $variant >> "$OUT/losses.txt" 2>&1
done
timeout 150 python3 tools/gpt2_check.py --device cuda --scale cuda --top 8 > "$OUT/check.txt" 2>&1
JAX_PLATFORMS=cpu timeout 60 python3 -m pytest -p no:cacheprovider -p no:benchmark -q -n 8 \
  tests/backends/test_cuda_columns.py tests/backends/test_sibling_reductions.py \
  > "$OUT/tests.txt" 2>&1
echo "== losses"; grep -E "^(as-is|round-each|jax) " "$OUT/losses.txt"; grep -iE "error|Traceback" "$OUT/losses.txt" | head -5
echo "== gradients"; tail -n 4 "$OUT/check.txt"
echo "== tests"; tail -n 3 "$OUT/tests.txt"
