#!/usr/bin/env bash
# One call on the two-GPU machine (session 3, call 3): the whole suite with CUDA on GPU 0 while
# the half-precision benchmarks run on GPU 1; then the two-GPU checks that failed in call 2.
# Results that should come back are packed into $OUT/results.tgz (at most 8 files return).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(CUDA_VISIBLE_DEVICES=0 JAX_PLATFORMS=cpu ACCY_CACHE_DIR="$OUT/suite-cache" taskset -c 0-15 \
  timeout 330 python3 -m pytest -p no:cacheprovider -n 12 -rfE > "$OUT/suite.txt" 2>&1) &
suite=$!
(CUDA_VISIBLE_DEVICES=1 HALFBENCH_STEPS="versions bench-bf16 attention-gpt2 gpt2-bf16 gpt2-bf16-accy-fused" \
  taskset -c 16-31 bash tools/device/halfbench.sh > "$OUT/halfbench-summary.txt" 2>&1) &
half=$!
wait $suite $half
MESH2_STEPS="nccl_tests mesh_bench_2gpu gpt2_dp_2gpu gpt2_dp_1gpu demo_2gpu demo_1gpu" BUDGET=200 \
  bash tools/device/mesh2.sh > "$OUT/mesh2-summary.txt" 2>&1
(cd "$OUT" && tar czf results.tgz --exclude='*cache*' --exclude='*.npz' --exclude='*.png' \
  $(ls -d mesh2 *.json 2>/dev/null) 2>/dev/null)
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -3; grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -20
echo "== halfbench"; cat "$OUT/halfbench-summary.txt"
echo "== mesh2"; cat "$OUT/mesh2-summary.txt"
