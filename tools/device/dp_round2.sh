#!/usr/bin/env bash
# Session 10, call 3 (one GPU): the whole suite with CUDA (kernels now read flat views at an
# offset through table pointers), the NCCL checks on one GPU, dp_profile.py with the host
# breakdown, and PyTorch DDP with gradient_as_bucket_view.
source tools/device/common.sh
suite 260
timeout 200 python3 -m accy.launch --gpus 1 tests/mesh/nccl_worker.py > "$OUT/nccl-1.txt" 2>&1
echo "== nccl_worker on 1 GPU (rc $?)"; grep -E "rank 0|Error" "$OUT/nccl-1.txt" | head -8
timeout -k 5 240 python3 -m accy.launch --gpus 1 tools/device/dp_profile.py --out "$OUT/profile" \
  > "$OUT/dp-profile.txt" 2>&1
echo "== dp_profile (rc $?)"; grep -E "step|actions" "$OUT/dp-profile.txt" | tail -n 12
timeout -k 5 120 torchrun --standalone --nproc-per-node 1 bench/ddp_torch.py --dtype bf16 \
  --compile --steps 30 > "$OUT/ddp.txt" 2>&1
echo "== PyTorch DDP bf16, 1 GPU, bucket views (rc $?)"; grep '^{' "$OUT/ddp.txt" | cut -c1-700
