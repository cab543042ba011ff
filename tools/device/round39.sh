#!/usr/bin/env bash
# Session 9, call 7 (one H200): the f32 attention kernels (tiles of 4 or 8 rows; the split backward):
# their tests (as shipped), and every variant of tools/device/flash_f32.py.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v "already exists" | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JAX_PLATFORMS=cpu timeout 90 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -rfE \
  tests/attention/test_flash_cuda.py > "$OUT/flash-tests.txt" 2>&1
echo "== flash tests (rc $?)"; grep -E "passed|failed" "$OUT/flash-tests.txt" | tail -1
grep -E "^(FAILED|ERROR)|max error" "$OUT/flash-tests.txt" | head -12
timeout 150 python3 tools/device/flash_f32.py > "$OUT/flash.txt" 2>&1
echo "== flash f32 kernels"; grep -v Warning "$OUT/flash.txt" | tail -8
