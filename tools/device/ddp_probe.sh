#!/usr/bin/env bash
# Session 10: why PyTorch DDP's GPT-2 step at one GPU (32-36 ms) is so far above the compiled
# model's without DDP (bench.gpt2's torch system: 20.0 ms): the same script with and without
# DDP, each with torch.profiler's kernel time against its wall time.
source tools/device/common.sh
for wrap in none compile-ddp; do
  timeout -k 5 150 torchrun --standalone --nproc-per-node 1 bench/ddp_torch.py --dtype bf16 \
    --compile --wrap $wrap --steps 20 --profile > "$OUT/ddp-$wrap.txt" 2>&1
  echo "== $wrap (rc $?)"; grep -E '^\{' "$OUT/ddp-$wrap.txt" | cut -c1-240
  grep -E "^profile:" "$OUT/ddp-$wrap.txt"
  grep -A 16 "^profile:" "$OUT/ddp-$wrap.txt" | tail -n 13 | cut -c1-160
done
