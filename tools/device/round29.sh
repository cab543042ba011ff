#!/usr/bin/env bash
# Session 7, call 8 (one H200): main with scanperf merged. In one run each: the bf16 mlp,
# attention and block workloads against JAX and PyTorch (issue 15); the whole suite with
# CUDA; the demo model's scan-layers step against the unrolled one on the host's 16 cores
# (issue 17).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 230 python3 -m bench --device cuda --dtype bf16 --quick --workloads mlp,attention,block \
  --worker-timeout 90 --json "$OUT/cuda-bf16.json" > "$OUT/workloads.txt" 2>&1
JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout 140 \
  python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
timeout 150 python3 -m bench.scan_layers --layers 12,48 --systems accy --repeat 20 \
  --timeout 120 --json "$OUT/scan-layers-cpu.json" > "$OUT/scan.txt" 2>&1
echo "== bf16 workloads"; grep -E "^│ (mlp|attention|block)" "$OUT/workloads.txt" | head -8
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
echo "== scan layers (CPU, 16 cores)"; tail -n 12 "$OUT/scan.txt"
