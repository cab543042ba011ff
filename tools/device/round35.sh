#!/usr/bin/env bash
# Session 9, call 2 (one H200): variants of the register-tiled f32 kernels
# (tools/device/flash_f32.py), and where the f32 and bf16 GPT-2 steps spend their time
# (tools/gpt2_profile.py, every action's time dumped under $OUT/profile-<dtype>).
source tools/device/common.sh
timeout 90 python3 tools/device/flash_f32.py > "$OUT/flash.txt" 2>&1
echo "== flash f32 kernels"; grep -v Warning "$OUT/flash.txt" | tail -6
for dtype in f32 bf16; do
  timeout 150 python3 tools/gpt2_profile.py --dtype $dtype --attention fused --top 12 \
    --dump "$OUT/profile-$dtype" > "$OUT/profile-$dtype.txt" 2>&1
  echo "== profile $dtype"; grep -v Warning "$OUT/profile-$dtype.txt" | tail -22
done
