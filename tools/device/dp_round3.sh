#!/usr/bin/env bash
# Session 10, call 5 (one GPU): the NCCL test as the suite runs it (now on one GPU too), the
# CUDA vector and donation tests, dp_profile after the donation fix, and the GPT-2
# data-parallel command at one GPU against the plain step.
source tools/device/common.sh
JAX_PLATFORMS=cpu timeout 200 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 4 -rfE \
  tests/mesh/test_nccl.py tests/backends/test_cuda_vectors.py tests/backends/test_cuda_donation.py \
  tests/backends/test_donation.py > "$OUT/tests.txt" 2>&1
echo "== tests (rc $?)"; grep -E "passed|failed" "$OUT/tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -8
timeout -k 5 200 python3 -m accy.launch --gpus 1 tools/device/dp_profile.py --no-actions \
  > "$OUT/dp-profile.txt" 2>&1
echo "== dp_profile (rc $?)"; grep -E "step" "$OUT/dp-profile.txt" | head -n 8
grep -E "check_donated_apart" "$OUT/dp-profile.txt" | head -3
timeout -k 5 120 python3 -m bench.gpt2 --gpus 1 --steps 20 --dtype bf16 --timeout 110 \
  --json "$OUT/gpt2-dp-1gpu.json" > "$OUT/gpt2-dp-1.txt" 2>&1
echo "== gpt2 bf16 data-parallel, 1 GPU (rc $?)"; grep -E '"(step_ms|tokens_per_s|first_step_s|setup_s|peak_device_bytes|mode)"' "$OUT/gpt2-dp-1gpu.json"
timeout 90 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 20 \
  --systems accy --json "$OUT/gpt2-1gpu.json" > "$OUT/gpt2-1gpu.txt" 2>&1
echo "== gpt2 bf16, one GPU, the plain step (rc $?)"; tail -n 2 "$OUT/gpt2-1gpu.txt"
