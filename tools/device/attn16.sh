#!/usr/bin/env bash
# Session 5, helper attn16 (issue 16: the attention records' results in 16 bits, cuDNN writing
# them in place), one H200, about 3 minutes:
# 1. tests/attention on CUDA (cuDNN forward/backward against the f64 composition, the lse
#    cotangent folded into O and restored, the schedule without f32 staging);
# 2. bench.flash_attention --device cuda --preset gpt2: accy vs JAX cuDNN vs PyTorch (GPT-2
#    small's shape, causal, bf16, fwd+bwd), ms and TFLOP/s;
# 3. python -m bench --workloads attention --quick in bf16 (the workload with a mask bias);
# 4. tools/gpt2_profile.py --workload attention: what accy runs there, per action.
# Full log: $OUT/attn16.log; a summary of at most ~30 lines on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/attn16.log"
: > "$LOG"
export PYTHONUNBUFFERED=1
START=$SECONDS
budget() {  # seconds left for a step: its own limit, or what remains of 185 s
  local left=$((185 - (SECONDS - START)))
  ((left < $1)) && echo $((left > 5 ? left : 5)) || echo "$1"
}
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit; limit=$(budget "$2"); shift 2
  echo "== $name (limit ${limit}s, at $((SECONDS - START))s)" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  echo "== $name: exit $? after $((SECONDS - START))s" >> "$LOG"
}
nvidia-smi -L >> "$LOG" 2>&1 || echo "no nvidia-smi (no GPU?)" >> "$LOG"
step tests 75 env JAX_PLATFORMS=cpu python3 -m pytest tests/attention -p no:benchmark \
  -p no:cacheprovider -rfEs
step flash_attention 45 python3 -m bench.flash_attention --device cuda --preset gpt2 \
  --seconds 1 --systems accy,jax-cudnn,torch --json "$OUT/attn16-gpt2.json"
step bench_attention 35 python3 -m bench --device cuda --dtype bf16 --workloads attention --quick \
  --json "$OUT/attn16-attention-workload.json"
step profile 30 python3 tools/gpt2_profile.py --workload attention --dtype bf16 --top 15

echo "== attn16 summary ($((SECONDS - START)) s; full log $LOG)"
grep -E "^== .*exit" "$LOG"
echo "-- tests (CUDA ones skip without a GPU or cudnn):"
grep -E "[0-9]+ (passed|failed)|^FAILED|^ERROR|^SKIPPED" "$LOG" | cut -c1-200 | head -8
grep -E "declin|above .* max error|max error .* above" "$LOG" | head -4
echo "-- GPT-2 shape, fwd+bwd (goal: accy at or below jax-cudnn and torch):"
grep -A5 "^system | step ms" "$LOG" | head -6
echo "-- attention workload (bf16, mask bias):"
grep -E "workload +┃|│ attention" "$LOG" | cut -c1-240 | head -4
echo "-- profile of the attention workload (top actions):"
sed -n '/== profile (/,/== profile:/p' "$LOG" | grep -vE "^==" | tail -10
