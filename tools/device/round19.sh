#!/usr/bin/env bash
# Session 6, call 4 (one H200): main with one-kernel column reductions (colred) and sibling row
# reductions (sibred): the whole suite with CUDA; the column-reduction sweep; every
# bench.kernel_bandwidth case in bf16; the GPT-2 bf16 step's profile; bench.gpt2 bf16, accy.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout 200 \
  python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
timeout 60 python3 tools/device/colred_sweep.py > "$OUT/sweep.txt" 2>&1
timeout 60 python3 -m bench.kernel_bandwidth --dtypes bf16 > "$OUT/bandwidth.txt" 2>&1
timeout 90 python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 25 \
  --dump "$OUT/gpt2" > "$OUT/profile.txt" 2>&1
timeout 150 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 --systems accy \
  --json "$OUT/gpt2-bf16-accy.json" > "$OUT/gpt2.txt" 2>&1
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -15
echo "== sweep"; tail -n 16 "$OUT/sweep.txt"
echo "== bandwidth"; grep -E "^[a-z_0-9]+ +bf16" "$OUT/bandwidth.txt"
echo "== profile"; head -n 8 "$OUT/profile.txt"
echo "== gpt2 bf16 accy"; tail -n 2 "$OUT/gpt2.txt"
