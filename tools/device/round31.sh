#!/usr/bin/env bash
# Session 8, call 1 (one H200): the reduction chains' A/B (tools/device/chains.sh), then where
# the f32 step's time goes: accy's actions (tools/gpt2_profile.py --dtype f32, dump of every
# action) and PyTorch's kernels by family, SDPA alone, torch.matmul per GEMM shape
# (tools/device/f32_probe.py).
source tools/device/common.sh
OUT="$OUT" bash tools/device/chains.sh > "$OUT/chains-summary.txt" 2>&1
echo "== chains"; cat "$OUT/chains-summary.txt" | head -60
timeout 90 python3 tools/gpt2_profile.py --dtype f32 --top 40 --dump "$OUT/f32" > "$OUT/f32-profile.txt" 2>&1
echo "== accy f32 profile"; head -60 "$OUT/f32-profile.txt"
rm -f "$OUT/f32/kernels.cu"
timeout 200 python3 tools/device/f32_probe.py > "$OUT/f32-probe.txt" 2>&1
echo "== torch f32 probe"; cat "$OUT/f32-probe.txt" | grep -v Warning | head -70
