#!/usr/bin/env bash
# Session 7, call 9 (one H200): main with chains merged. The whole suite with CUDA (three
# more runs of the simulated-NCCL test that failed once in call 8); bench.gpt2 bf16 against
# JAX and PyTorch; the demo model's 12-layer scan against unrolled on the host's 16 cores,
# twice, nothing running beside it.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 100 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 \
  --json "$OUT/gpt2-cuda-bf16.json" > "$OUT/gpt2.txt" 2>&1
for round in 1 2; do
  timeout 40 python3 -m bench.scan_layers --layers 12 --systems accy --repeat 20 \
    --timeout 35 --json "$OUT/scan-$round.json" > "$OUT/scan-$round.txt" 2>&1
done
JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout 110 \
  python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
for round in 1 2 3; do
  JAX_PLATFORMS=cpu timeout 15 python3 -m pytest -p no:cacheprovider -p no:benchmark -q \
    tests/mesh/test_nccl_simulated.py 2>&1 | tail -1
done > "$OUT/nccl.txt"
echo "== gpt2 bf16"; tail -n 4 "$OUT/gpt2.txt"
echo "== scan layers 12 (CPU, 16 cores)"; grep -h "layers=" "$OUT"/scan-*.txt
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
echo "== simulated NCCL x3"; cat "$OUT/nccl.txt"
