#!/usr/bin/env bash
# Session 9, call 4 (one H200): variants of the f32 attention kernels
# (tools/device/flash_f32.py) and the whole suite with CUDA. (The call also ran
# tools/device/loop_pairs.py, removed since with the paired loops it measured: no gain.)
source tools/device/common.sh
timeout 120 python3 tools/device/flash_f32.py > "$OUT/flash.txt" 2>&1
echo "== flash f32 kernels"; grep -v Warning "$OUT/flash.txt" | tail -8
JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout 200 \
  python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
