#!/usr/bin/env bash
# Session 5, helper donate (issue 20: donation on CUDA, the training step's peak memory), one
# H200, about 3 minutes:
# 1. the donation tests with CUDA (tests/backends/test_cuda_donation.py; the CPU ones and the
#    gpt2 workload's tests too);
# 2. the peak-memory readout of the accy bf16 GPT-2 step, donated and not (tools/gpt2_memory.py
#    --gpu: CuPy's pool after 3 steps, the bench's "peak MB"), and the plan's own account
#    (workspace, what is alive at its peak; no GPU needed);
# 3. python -m bench.gpt2 --device cuda --dtype bf16 --steps 10 (accy, JAX, PyTorch; the
#    "peak MB" column).
# Full log: $OUT/donate.log; a summary of at most ~30 lines on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/donate.log"
: > "$LOG"
export PYTHONUNBUFFERED=1
START=$SECONDS
budget() {  # seconds left for a step: its own limit, or what remains of 190 s
  local left=$((190 - (SECONDS - START)))
  ((left < $1)) && echo $((left > 5 ? left : 5)) || echo "$1"
}
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit; limit=$(budget "$2"); shift 2
  echo "== $name (limit ${limit}s, at $((SECONDS - START))s)" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  echo "== $name: exit $? after $((SECONDS - START))s" >> "$LOG"
}
JAX_PLATFORMS=cpu step tests 50 python3 -m pytest -p no:benchmark -p no:cacheprovider -rfE \
  tests/backends/test_cuda_donation.py tests/backends/test_donation.py tests/bench/test_gpt2.py
step memory-donated 35 python3 tools/gpt2_memory.py --gpu donate --steps 3
step memory-plain 35 python3 tools/gpt2_memory.py --gpu plain --steps 3
step plan 20 python3 tools/gpt2_memory.py --top 6 --json "$OUT/donate-plan.json"
step bench 110 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 --timeout 90 \
  --json "$OUT/gpt2-cuda-bf16.json"
echo "== donate summary ($((SECONDS - START)) s; full log $LOG)"
grep -E "^== .*exit" "$LOG"
grep -E "^[0-9]+ (passed|failed)|^FAILED|^ERROR|passed|failed" "$LOG" | grep -vE "^==" | head -6
grep -E '^\{"donated"' "$LOG" | head -2
python3 - "$OUT/donate-plan.json" <<'PY' || echo "no plan JSON"
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r[k] for k in ("arguments_MiB", "outputs_into_donated", "workspace_MiB", "constants_MiB",
                         "scratch_MiB", "peak_live_MiB", "peak_step")})
for b in r["largest_alive_at_peak"][:4]:
    print("  at peak:", b)
PY
grep -A6 "^system | step ms" "$LOG" | head -6
