#!/usr/bin/env bash
# Session 6, call 9 (one H200): the piecewise concatenate (branch piecewise): the CUDA tests of
# tests/backends, and the bf16 attention workload against JAX and PyTorch.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout 100 python3 -m pytest \
  -p no:cacheprovider -p no:benchmark -n 14 -rfE tests/backends tests/attention \
  > "$OUT/tests.txt" 2>&1
timeout 110 python3 -m bench --device cuda --dtype bf16 --quick --workloads attention \
  --worker-timeout 60 --json "$OUT/attention-cuda-bf16.json" > "$OUT/attention.txt" 2>&1
echo "== tests"; grep -E "passed|failed" "$OUT/tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -10
echo "== attention workload"; grep -E "^│ attention" "$OUT/attention.txt" | head -2
