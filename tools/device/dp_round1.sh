#!/usr/bin/env bash
# Session 10, call 2 (one GPU): where the data-parallel step's extra time goes at one GPU
# (tools/device/dp_profile.py: GPU graph alone vs a training loop's wall time; each action
# alone), and which PyTorch DDP arrangement is fastest (the baseline issue 21 compares with).
source tools/device/common.sh
timeout -k 5 240 python3 -m accy.launch --gpus 1 tools/device/dp_profile.py --out "$OUT/profile" \
  > "$OUT/dp-profile.txt" 2>&1
echo "== dp_profile (rc $?)"; grep -v "^\s*$" "$OUT/dp-profile.txt" | grep -iv warn | tail -n 12
for wrap in compile-ddp ddp-compile; do
  timeout -k 5 120 torchrun --standalone --nproc-per-node 1 bench/ddp_torch.py --dtype bf16 \
    --compile --wrap $wrap --steps 30 > "$OUT/ddp-$wrap.txt" 2>&1
  echo "== PyTorch DDP bf16, 1 GPU, $wrap (rc $?)"; grep '^{' "$OUT/ddp-$wrap.txt" | cut -c1-600
done
