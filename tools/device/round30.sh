#!/usr/bin/env bash
# Session 7, call 9 (one H200): main with chains merged. bench.gpt2 bf16 against JAX and
# PyTorch; the whole suite with CUDA; the demo model's 12-layer scan against unrolled on the
# host's 16 cores, twice, nothing running beside it; three more runs of the simulated-NCCL
# test that failed once in call 8. Each part prints its summary as soon as it ends.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 120 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 \
  --json "$OUT/gpt2-cuda-bf16.json" > "$OUT/gpt2.txt" 2>&1
echo "== gpt2 bf16"; tail -n 4 "$OUT/gpt2.txt"
JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout 105 \
  python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
for round in 1 2; do
  timeout 30 python3 -m bench.scan_layers --layers 12 --systems accy --repeat 20 \
    --timeout 28 --json "$OUT/scan-$round.json" > "$OUT/scan-$round.txt" 2>&1
  echo "== scan layers 12 (CPU, 16 cores), round $round"; grep -h "layers=" "$OUT/scan-$round.txt"
done
echo "== simulated NCCL"
for round in 1 2 3; do
  JAX_PLATFORMS=cpu timeout 12 python3 -m pytest -p no:cacheprovider -p no:benchmark -q \
    tests/mesh/test_nccl_simulated.py 2>&1 | tail -1
done
