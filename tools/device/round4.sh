#!/usr/bin/env bash
# Session 4, call 1 on the two-GPU machine: the whole suite with CUDA on GPU 0, then the loop
# benchmarks (issue 17); on GPU 1 the GPT-2 step's profile (issue 20), then the gpt2-small
# preset for the rest of the call (issue 20's 1.5 nats/byte bar). Everything under 580 s.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(
  export CUDA_VISIBLE_DEVICES=0
  JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache taskset -c 0-15 timeout 300 \
    python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
  taskset -c 0-15 timeout $((560 - SECONDS)) bash tools/device/loops2.sh > /dev/null 2>&1
) &
first=$!
(
  export CUDA_VISIBLE_DEVICES=1
  for attention in composition fused; do
    taskset -c 16-31 timeout 100 python3 tools/gpt2_profile.py --dtype bf16 \
      --attention $attention > "$OUT/profile-$attention.txt" 2>&1
  done
  PRESET_TOTAL_S=$((570 - SECONDS)) taskset -c 16-31 bash tools/device/preset.sh > /dev/null 2>&1
) &
second=$!
wait $first $second
(cd "$OUT" && tar czf results.tgz --exclude='*cache*' --exclude='*.npz' \
  $(ls *.log *.json *.png *summary* 2>/dev/null) 2>/dev/null)
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -2
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -20
echo "== profile"; head -12 "$OUT/profile-composition.txt"; head -12 "$OUT/profile-fused.txt"
echo "== loops2"; tail -n 30 "$OUT/loops2-summary.txt"
echo "== preset"; tail -n 25 "$OUT/preset-summary.txt"; grep -E "held-out" "$OUT/preset.log" | tail -5
