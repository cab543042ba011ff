#!/usr/bin/env bash
# Session 7, call 5 (one H200): main with faster many-argument calls, inputs staged once for
# library steps, cuDNN for few-block attention, and the fragment disk cache (warmcache): the
# whole suite with CUDA; the GPT-2 step's host overhead probe; the bf16 attention workload and
# bench.flash_attention's GPT-2 preset against JAX and PyTorch.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout 170 \
  python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
timeout 90 python3 tools/device/step_overhead.py > "$OUT/overhead.txt" 2>&1
timeout 130 python3 -m bench --device cuda --dtype bf16 --quick --workloads attention \
  --worker-timeout 60 --json "$OUT/attention-cuda-bf16.json" > "$OUT/attention.txt" 2>&1
timeout 120 python3 -m bench.flash_attention --device cuda --preset gpt2 \
  --json "$OUT/attention-gpt2.json" > "$OUT/flash.txt" 2>&1
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
echo "== overhead"; head -n 7 "$OUT/overhead.txt"
echo "== attention workload"; grep -E "attention" "$OUT/attention.txt" | tail -3
echo "== flash_attention gpt2"; tail -n 6 "$OUT/flash.txt"
