#!/usr/bin/env bash
# Session 6, call 7 (one H200): the bf16 block workload against JAX and PyTorch (it did not fit
# in call 6's budget), and where the bf16 attention workload's time goes.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 200 python3 -m bench --device cuda --dtype bf16 --quick --workloads block \
  --worker-timeout 90 --json "$OUT/block-cuda-bf16.json" > "$OUT/block.txt" 2>&1
timeout 45 python3 tools/gpt2_profile.py --workload attention --dtype bf16 --top 14 \
  > "$OUT/attention-profile.txt" 2>&1
echo "== block"; tail -n 8 "$OUT/block.txt"
echo "== attention workload profile"; cat "$OUT/attention-profile.txt" | tail -n 20
