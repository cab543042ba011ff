#!/usr/bin/env bash
# Session 7, call 1 (one H200): where the two attention benchmarks' time goes. Profiles of the
# bf16 attention workload (GPU scale: one head of 2048 tokens, the composition) and of
# bench.flash_attention's GPT-2 preset (cuDNN), then both benchmarks against JAX and PyTorch,
# the attention workload once more with cuDNN forced (ACCY_CUDNN_MIN_BLOCKS=0), and a profile
# of the GPT-2 bf16 step (dumps tarred into one file).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" /tmp/dumps
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 60 python3 tools/gpt2_profile.py --workload attention --dtype bf16 --top 30 \
  --dump /tmp/dumps/attention > "$OUT/profile-attention.txt" 2>&1
timeout 60 python3 tools/gpt2_profile.py --workload attention-gpt2 --attention fused \
  --dtype bf16 --top 20 --dump /tmp/dumps/attention-gpt2 > "$OUT/profile-attention-gpt2.txt" 2>&1
timeout 120 python3 -m bench.flash_attention --device cuda --preset gpt2 \
  --json "$OUT/attention-gpt2.json" > "$OUT/flash.txt" 2>&1
timeout 110 python3 -m bench --device cuda --dtype bf16 --quick --workloads attention \
  --worker-timeout 60 --json "$OUT/attention-cuda-bf16.json" > "$OUT/attention.txt" 2>&1
ACCY_CUDNN_MIN_BLOCKS=0 timeout 60 python3 -m bench --device cuda --dtype bf16 --quick \
  --workloads attention --systems accy --worker-timeout 50 > "$OUT/attention-cudnn.txt" 2>&1
timeout 60 python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 40 \
  --dump /tmp/dumps/gpt2 > "$OUT/profile-gpt2.txt" 2>&1
tar czf "$OUT/dumps.tgz" -C /tmp dumps
echo "== attention workload profile"; head -n 40 "$OUT/profile-attention.txt"
echo "== attention-gpt2 profile"; head -n 30 "$OUT/profile-attention-gpt2.txt"
echo "== flash_attention gpt2"; tail -n 8 "$OUT/flash.txt"
echo "== attention workload"; grep -E "attention" "$OUT/attention.txt" | tail -3
echo "== attention workload, cuDNN forced"; grep -E "attention" "$OUT/attention-cudnn.txt" | tail -2
echo "== gpt2 profile"; head -n 8 "$OUT/profile-gpt2.txt"
