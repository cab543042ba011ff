#!/usr/bin/env bash
# Session 6, the last call (one H200), main as submitted: the whole suite with CUDA; then, in
# one run each against JAX and PyTorch: python -m bench.gpt2 --device cuda --dtype bf16, and
# the bf16 mlp/attention/block workloads; the demo on CUDA in f32 and bf16 (600 steps); then
# where the GPT-2 step's time goes.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout 150 \
  python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
timeout 170 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 \
  --json "$OUT/gpt2-cuda-bf16.json" > "$OUT/gpt2.txt" 2>&1
timeout 170 python3 -m bench --device cuda --dtype bf16 --quick --workloads mlp,attention,block \
  --worker-timeout 70 --json "$OUT/cuda-bf16.json" > "$OUT/workloads.txt" 2>&1
for dtype in f32 bf16; do
  timeout 60 python3 -m accy demo --device cuda --dtype $dtype --steps 600 --out /tmp/demo-$dtype \
    > "$OUT/demo-$dtype.txt" 2>&1
done
timeout 50 python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 12 \
  > "$OUT/profile.txt" 2>&1
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
echo "== gpt2 bf16"; tail -n 5 "$OUT/gpt2.txt"
echo "== bf16 workloads"; tail -n 14 "$OUT/workloads.txt"
echo "== demo (600 steps)"; for dtype in f32 bf16; do echo "$dtype: $(grep -iE "held-out" "$OUT/demo-$dtype.txt" | tail -1)"; done
echo "== profile"; head -n 6 "$OUT/profile.txt"
