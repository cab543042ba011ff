#!/usr/bin/env bash
# Session 9, calls 6 and 8 (one H200): the f32 attention kernels' tests, then
# `python -m bench --device cuda --workloads gpt2` (f32, then bf16; accy, JAX and PyTorch).
source tools/device/common.sh
flash_tests
timeout 480 python3 -m bench --device cuda --workloads gpt2 > "$OUT/bench.txt" 2>&1
echo "== python -m bench --device cuda --workloads gpt2 (rc $?)"
grep -E "^(gpt2 on|system|accy|jax|torch)" "$OUT/bench.txt"
cp bench/results/gpt2-cuda.json bench/results/gpt2-cuda-bf16.json "$OUT/" 2>/dev/null
