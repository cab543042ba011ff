#!/usr/bin/env bash
# Session 8, call 7 (one H200): after the chain grid change and the revert of the forward's
# asynchronous copies: the chain, reduction and f32 attention tests on the GPU, then bench.gpt2
# in bf16, accy against PyTorch.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v "already exists" | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JAX_PLATFORMS=cpu timeout 50 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 12 -rfE \
  tests/backends/test_reduction_chains.py tests/backends/test_sibling_reductions.py \
  tests/backends/test_reduction_epilogues.py tests/attention/test_flash_cuda.py > "$OUT/tests.txt" 2>&1
echo "== tests"; grep -E "passed|failed" "$OUT/tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -8
timeout 110 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 --systems accy,torch \
  --json "$OUT/gpt2-cuda-bf16.json" > "$OUT/gpt2.txt" 2>&1
echo "== gpt2 bf16"; tail -n 3 "$OUT/gpt2.txt"
