#!/usr/bin/env bash
# Session 8, call 6 (one H200): the f32 kernels with the forward's asynchronous copies: their
# tests, the kernels alone (tools/device/flash_f32.py), the whole suite with CUDA, and
# bench.gpt2 in f32 against JAX and PyTorch. Each part prints its summary as soon as it ends.
source tools/device/common.sh
flash_tests
timeout 60 python3 tools/device/flash_f32.py > "$OUT/flash.txt" 2>&1
echo "== flash f32 kernels"; grep -v Warning "$OUT/flash.txt" | tail -7
suite 120
timeout 200 python3 -m bench.gpt2 --device cuda --dtype f32 --steps 5 \
  --json "$OUT/gpt2-cuda-f32.json" > "$OUT/gpt2.txt" 2>&1
echo "== gpt2 f32"; tail -n 5 "$OUT/gpt2.txt"
