#!/usr/bin/env bash
# Session 8, call 2 (one H200): accy's f32 FlashAttention kernels. Their tests and the other
# attention tests on the GPU; the kernels alone at GPT-2's shape in several configurations
# against PyTorch's SDPA (tools/device/flash_f32.py); the f32 GPT-2 step through them
# (bench.gpt2, accy only) and its profile.
source tools/device/common.sh
JAX_PLATFORMS=cpu timeout 120 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q -rfE \
  tests/attention/test_flash_cuda.py tests/attention/test_attention.py > "$OUT/tests.txt" 2>&1
echo "== attention tests"; grep -E "passed|failed" "$OUT/tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -12
timeout 90 python3 tools/device/flash_f32.py > "$OUT/flash.txt" 2>&1
echo "== flash f32 kernels"; grep -v Warning "$OUT/flash.txt" | tail -20
timeout 90 python3 -m bench.gpt2 --device cuda --dtype f32 --steps 5 --systems accy \
  --json "$OUT/gpt2-cuda-f32.json" > "$OUT/gpt2.txt" 2>&1
echo "== gpt2 f32 (accy)"; tail -n 4 "$OUT/gpt2.txt"
timeout 60 python3 tools/gpt2_profile.py --dtype f32 --attention fused --top 12 > "$OUT/profile.txt" 2>&1
echo "== profile f32 fused"; head -22 "$OUT/profile.txt"
