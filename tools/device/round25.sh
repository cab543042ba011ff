#!/usr/bin/env bash
# Session 7, call 2 (one H200): the bf16 attention workload (one head of 2048 tokens, a bias)
# through cuDNN (min_blocks 0), with cuDNN's heuristic plan and with the fastest plan.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for plan in heuristic fastest; do
  timeout 100 python3 tools/gpt2_profile.py --workload attention --dtype bf16 --top 30 \
    --cudnn-min-blocks 0 --cudnn-plan $plan --dump /tmp/dumps/attention-cudnn-$plan \
    > "$OUT/profile-$plan.txt" 2>&1
  echo "== $plan"; head -n 40 "$OUT/profile-$plan.txt"
done
