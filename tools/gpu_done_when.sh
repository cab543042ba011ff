#!/usr/bin/env bash
# One call of the GPU machine: `python -m bench --device cuda --workloads gpt2,llama1b` (GPT-2
# small bf16 at 8 and 64 x 1024, the 1B Llama; accy, JAX, torch.compile, each in its own
# process), then `tools/gpu_step_host.py` (host and GPU part of accy's step) while time is left.
# Wheels in .whl are installed first; the JSONs and logs go to $OUT. A short summary last.
set -uo pipefail
source tools/gpu_env.sh
timeout "${BENCH_SECONDS:-480}" python3 -m bench --device cuda --workloads gpt2,llama1b \
  > "$OUT/bench.txt" 2>&1
echo "== bench rc $? ($((SECONDS - T0)) s)"
cp bench/results/gpt2-cuda-bf16.json bench/results/gpt2-cuda-bf16-b64.json \
  bench/results/llama1b-cuda-bf16.json "$OUT/" 2>/dev/null
LEFT=$((${CALL_SECONDS:-570} - (SECONDS - T0)))
if [ "$LEFT" -gt 30 ]; then
  timeout "$LEFT" python3 tools/gpu_step_host.py > "$OUT/host.txt" 2>&1
  echo "== host rc $? ($((SECONDS - T0)) s)"
fi
grep -v '^\s*$' "$OUT/bench.txt" | grep -v "^warning" | tail -20
head -30 "$OUT/host.txt" 2>/dev/null
