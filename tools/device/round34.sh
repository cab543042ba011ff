#!/usr/bin/env bash
# Session 9, call 1 (one H200): the register-tiled f32 FlashAttention kernels: their tests, the
# kernels alone against PyTorch's SDPA (tools/device/flash_f32.py), and, if the tests pass,
# bench.gpt2 in f32 against JAX and PyTorch. Each part prints its summary as soon as it ends.
source tools/device/common.sh
flash_tests
timeout 60 python3 tools/device/flash_f32.py > "$OUT/flash.txt" 2>&1
echo "== flash f32 kernels"; grep -v Warning "$OUT/flash.txt" | tail -6
if grep -qE "[0-9]+ passed" "$OUT/flash-tests.txt" && ! grep -qE "failed|error" "$OUT/flash-tests.txt"; then
  timeout 220 python3 -m bench.gpt2 --device cuda --dtype f32 --steps 5 \
    --json "$OUT/gpt2-cuda-f32.json" > "$OUT/gpt2.txt" 2>&1
  echo "== gpt2 f32"; tail -n 5 "$OUT/gpt2.txt"
fi
