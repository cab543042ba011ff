#!/usr/bin/env bash
# For the next session on the two-GPU machine (nvidia-h200-x2), written in session 8 without
# one: everything issue 21's "Done when" measures, in one call (~6 min), each part's summary
# printed as soon as it ends, the JSON under $OUT.
# 1. the NCCL test on both GPUs (tests/mesh/test_nccl.py: every collective, DP/FSDP programs,
#    one graph and segments, and session 8's donation check);
# 2. bench/mesh.py on 2 GPUs: the 256 MB all-reduce's bus bandwidth (bar: 80% of NCCL's own);
# 3. GPT-2 bf16 data-parallel (fused attention, parameters and state donated) on 2 GPUs and on
#    1 through the same path, and the plain one-GPU step, for the scaling (bar: 1.9x);
# 4. PyTorch DDP (torch.compile, bf16 autocast, gradient_as_bucket_view) on 2 GPUs (bar: match
#    or beat it), and the compiled model without DDP on one (session 10: DDP is host-bound);
# 5. tools/device/dp_profile.py on 2 GPUs: the sharded graph alone against the plain one, and
#    the training loop's wall and host time (session 10: on one GPU, 19.51 against 18.94 ms);
# 6. GPT-2 on 2 GPUs again with NCCL_MAX_CTAS=8 (fewer SMs taken from the backward pass while
#    the buckets all-reduce).
source tools/device/common.sh
dp_summary() {  # the data-parallel JSON's main fields
  grep -E '"(step_ms|tokens_per_s|first_step_s|setup_s|peak_device_bytes|mode|loss_last)"' "$1"
}
JAX_PLATFORMS=cpu timeout 150 python3 -m pytest -p no:cacheprovider -p no:benchmark -rfE \
  tests/mesh/test_nccl.py > "$OUT/nccl-test.txt" 2>&1
echo "== NCCL test (2 GPUs, rc $?)"; grep -E "passed|failed|skipped" "$OUT/nccl-test.txt" | tail -2
timeout 150 python3 -m accy.launch --gpus 2 bench/mesh.py --json "$OUT/mesh-2gpu.json" \
  > "$OUT/mesh.txt" 2>&1
echo "== bench/mesh.py (2 GPUs, rc $?)"; grep -E "busbw|algbw|\"mode\"|step_seconds|correct" "$OUT/mesh.txt" | head -14
for gpus in 2 1; do
  timeout -k 5 120 python3 -m bench.gpt2 --gpus $gpus --steps 20 --dtype bf16 --timeout 110 \
    --json "$OUT/gpt2-dp-${gpus}gpu.json" > "$OUT/gpt2-dp-$gpus.txt" 2>&1
  echo "== gpt2 bf16 data-parallel, $gpus GPU(s) (rc $?)"; dp_summary "$OUT/gpt2-dp-${gpus}gpu.json"
done
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 20 \
  --systems accy --json "$OUT/gpt2-1gpu.json" > "$OUT/gpt2-1gpu.txt" 2>&1
echo "== gpt2 bf16, one GPU, the plain step (rc $?)"; tail -n 2 "$OUT/gpt2-1gpu.txt"
timeout -k 5 150 torchrun --standalone --nproc-per-node 2 bench/ddp_torch.py --dtype bf16 \
  --compile --steps 30 --json "$OUT/gpt2-ddp-torch-2gpu.json" > "$OUT/ddp.txt" 2>&1
echo "== PyTorch DDP bf16, 2 GPUs (rc $?)"; grep '^{' "$OUT/ddp.txt" | cut -c1-400
CUDA_VISIBLE_DEVICES=0 timeout -k 5 120 torchrun --standalone --nproc-per-node 1 \
  bench/ddp_torch.py --dtype bf16 --compile --wrap none --steps 20 > "$OUT/torch-1.txt" 2>&1
echo "== PyTorch without DDP, 1 GPU (rc $?)"; grep '^{' "$OUT/torch-1.txt" | cut -c1-300
timeout -k 5 200 python3 -m accy.launch --gpus 2 tools/device/dp_profile.py --no-actions \
  > "$OUT/dp-profile-2.txt" 2>&1
echo "== dp_profile, 2 GPUs (rc $?)"; grep -E "step" "$OUT/dp-profile-2.txt" | head -n 8
NCCL_MAX_CTAS=8 timeout -k 5 120 python3 -m bench.gpt2 --gpus 2 --steps 20 --dtype bf16 \
  --timeout 110 --json "$OUT/gpt2-dp-2gpu-ctas8.json" > "$OUT/gpt2-dp-2-ctas8.txt" 2>&1
echo "== gpt2 bf16 data-parallel, 2 GPUs, NCCL_MAX_CTAS=8 (rc $?)"
dp_summary "$OUT/gpt2-dp-2gpu-ctas8.json"
