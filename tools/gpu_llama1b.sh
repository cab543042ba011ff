#!/usr/bin/env bash
# One call of the GPU machine: the CUDA tests of the lane width and the batched launches, the
# llama1b workload (accy, JAX, torch.compile), the GPT-2 bf16 step (accy, torch.compile) and
# the GPT-2 step's profile by action. Wheels in .whl are installed first; what it writes goes
# to $OUT (at most 8 files come back). Prints a short summary last.
set -uo pipefail
source tools/gpu_env.sh
JAX_PLATFORMS=cpu timeout 70 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -q \
  tests/backends/test_cuda_vectors.py tests/backends/test_cuda_batching.py \
  tests/backends/test_cuda_donation.py > "$OUT/tests.txt" 2>&1
echo "== tests rc $? ($((SECONDS - T0)) s)"
timeout "${LLAMA_SECONDS:-330}" python3 -m bench.llama1b --device cuda --steps 10 --timeout 200 \
  --json "$OUT/llama1b-h200-bf16.json" > "$OUT/llama1b.txt" 2>&1
echo "== llama1b rc $? ($((SECONDS - T0)) s)"
timeout "${GPT2_SECONDS:-120}" python3 -m bench.gpt2 --device cuda --dtype bf16 --systems accy,torch \
  --steps 20 --json "$OUT/gpt2-h200-bf16.json" > "$OUT/gpt2.txt" 2>&1
echo "== gpt2 rc $? ($((SECONDS - T0)) s)"
LEFT=$((575 - (SECONDS - T0)))
if [ "$LEFT" -gt 40 ]; then
  timeout "$LEFT" python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 30 \
    --dump /tmp/profile > "$OUT/profile.txt" 2>&1
  echo "== profile rc $? ($((SECONDS - T0)) s)"
  cp /tmp/profile/actions.tsv "$OUT/" 2>/dev/null
fi
echo "-- tests"; tail -3 "$OUT/tests.txt"
echo "-- llama1b"; grep -v '^\s*$' "$OUT/llama1b.txt" | tail -8
echo "-- gpt2"; tail -4 "$OUT/gpt2.txt"
echo "-- profile"; head -12 "$OUT/profile.txt" 2>/dev/null
grep -i -A12 "slowest" "$OUT/profile.txt" 2>/dev/null | head -14
