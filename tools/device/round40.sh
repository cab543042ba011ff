#!/usr/bin/env bash
# Session 9, call 8 (one H200): the f32 attention kernels' tests (the split backward), then
# `python -m bench --device cuda --workloads gpt2` (f32, then bf16; accy, JAX and PyTorch).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v "already exists" | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JAX_PLATFORMS=cpu timeout 90 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -rfE \
  tests/attention/test_flash_cuda.py > "$OUT/flash-tests.txt" 2>&1
echo "== flash tests (rc $?)"; grep -E "passed|failed" "$OUT/flash-tests.txt" | tail -1
grep -E "^(FAILED|ERROR)|max error" "$OUT/flash-tests.txt" | head -12
timeout 480 python3 -m bench --device cuda --workloads gpt2 > "$OUT/bench.txt" 2>&1
echo "== python -m bench --device cuda --workloads gpt2 (rc $?)"
grep -E "^(gpt2 on|system|accy|jax|torch)" "$OUT/bench.txt"
cp bench/results/gpt2-cuda.json bench/results/gpt2-cuda-bf16.json "$OUT/" 2>/dev/null
