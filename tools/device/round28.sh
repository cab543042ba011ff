#!/usr/bin/env bash
# Session 7, call 7 (one H200): query chunks for one long head (cuDNN), identity-checked
# donated arguments. CUDA tests of attention, donation and the fragment cache; the host
# overhead probe; the bf16 attention workload and bench.gpt2 bf16 against JAX and PyTorch.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout 100 python3 -m pytest \
  -p no:cacheprovider -p no:benchmark -n 14 -rfE tests/attention \
  tests/backends/test_cuda_donation.py tests/backends/test_cuda_fragment_cache.py \
  > "$OUT/tests.txt" 2>&1
timeout 60 python3 tools/device/step_overhead.py > "$OUT/overhead.txt" 2>&1
timeout 130 python3 -m bench --device cuda --dtype bf16 --quick --workloads attention \
  --worker-timeout 60 --json "$OUT/attention-cuda-bf16.json" > "$OUT/attention.txt" 2>&1
timeout 200 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 \
  --json "$OUT/gpt2-cuda-bf16.json" > "$OUT/gpt2.txt" 2>&1
echo "== tests"; grep -E "passed|failed" "$OUT/tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -8
echo "== overhead"; head -n 3 "$OUT/overhead.txt"
echo "== attention workload"; grep -E "attention" "$OUT/attention.txt" | tail -3
echo "== gpt2 bf16"; tail -n 6 "$OUT/gpt2.txt"
