#!/usr/bin/env bash
# Session 7, call 3 (one H200): CudaFragment.profile replaying each action as a graph of its
# own (no host issue cost). Its tests; then the bf16 attention workload (composition, and cuDNN
# with min_blocks 0), bench.flash_attention's GPT-2 preset and the GPT-2 bf16 step, each with
# the whole step's graph time first.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" /tmp/dumps
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
JAX_PLATFORMS=cpu timeout 100 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -rfE \
  tests/backends/test_cuda_api.py tests/backends/test_control_flow.py > "$OUT/tests.txt" 2>&1
P="timeout 100 python3 tools/gpt2_profile.py --dtype bf16"
$P --workload attention --top 40 --dump /tmp/dumps/attention > "$OUT/p-attention.txt" 2>&1
$P --workload attention --top 25 --cudnn-min-blocks 0 --dump /tmp/dumps/attention-cudnn \
  > "$OUT/p-attention-cudnn.txt" 2>&1
$P --workload attention-gpt2 --attention fused --top 20 > "$OUT/p-attention-gpt2.txt" 2>&1
$P --attention fused --top 60 --dump /tmp/dumps/gpt2 > "$OUT/p-gpt2.txt" 2>&1
tar czf "$OUT/dumps.tgz" -C /tmp dumps
echo "== tests"; grep -E "passed|failed" "$OUT/tests.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -5
for f in attention attention-cudnn attention-gpt2; do echo "== $f"; head -n 30 "$OUT/p-$f.txt"; done
echo "== gpt2"; head -n 12 "$OUT/p-gpt2.txt"
