#!/usr/bin/env bash
# Session 7, helper scanperf (issue 17: the demo model with --scan-layers within 1.1x of the
# unrolled model's step time on the CPU). Runs on the GPU machine's host CPU (16 cores),
# about 3 minutes:
# 1. bench.scan_layers, accy only, 12 and 48 layers, scan and unrolled, median of 20 steps
#    (each (layers, layout) in a fresh process with a fresh cache): the ratio to confirm;
# 2. at 12 layers, the same with JAX's lax.scan and unrolled model beside it (median of 10),
#    for context;
# 3. the CPU loop-nest tests and the CUDA kinds' unary tests (accy_expf is in the CUDA prelude
#    too, as plain expf).
# Full log: $OUT/scanperf.log; a summary of at most ~40 lines on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/scanperf.log"
: > "$LOG"
export PYTHONUNBUFFERED=1
START=$SECONDS
budget() {  # seconds left for a step: its own limit, or what remains of 225 s
  local left=$((225 - (SECONDS - START)))
  ((left < $1)) && echo $((left > 5 ? left : 5)) || echo "$1"
}
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit; limit=$(budget "$2"); shift 2
  echo "== $name (limit ${limit}s, at $((SECONDS - START))s)" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  echo "== $name: exit $? after $((SECONDS - START))s" >> "$LOG"
}
nproc >> "$LOG" 2>&1
step accy 130 python3 -m bench.scan_layers --layers 12,48 --systems accy --repeat 20 \
  --timeout 110 --json "$OUT/scanperf-accy.json"
step tests 30 env JAX_PLATFORMS=cpu python3 -m pytest tests/backends/test_cpu_loop_nests.py \
  tests/backends/test_cuda_kinds.py -k "loop or exp or elementwise or softmax" -p no:benchmark \
  -p no:cacheprovider -rfEs
step with_jax 60 python3 -m bench.scan_layers --layers 12 --repeat 10 --timeout 40 \
  --json "$OUT/scanperf-all.json"

echo "== scanperf summary ($((SECONDS - START)) s; full log $LOG)"
grep -E "^== .*exit" "$LOG"
ratios() {  # ratios FILE: scan/unrolled step time per system and depth
  python3 - "$1" <<'PY'
import json, sys
try:
    rows = [r for r in json.load(open(sys.argv[1])) if not r.get("error")]
except (OSError, ValueError) as e:
    sys.exit(f"  no results ({e})")
by = {(r["system"], r["layers"], r["layout"]): r for r in rows}
for (system, layers, layout), r in sorted(by.items()):
    if layout != "scan" or (system, layers, "unrolled") not in by:
        continue
    u = by[system, layers, "unrolled"]
    print(f"  {system:5} layers={layers:3} step scan/unrolled {r['step_s'] / u['step_s']:.3f}"
          f" ({r['step_s'] * 1e3:.1f} / {u['step_s'] * 1e3:.1f} ms)  compile scan"
          f" {r['compile_s']:.1f} s, unrolled {u['compile_s']:.1f} s")
PY
}
echo "-- accy only, median of 20 (goal: scan/unrolled <= 1.1, here hoped <= 1.05):"
grep -E "^accy +layers" "$LOG" | head -4
ratios "$OUT/scanperf-accy.json"
echo "-- tests:"
grep -E "[0-9]+ (passed|failed)|^FAILED|^ERROR" "$LOG" | cut -c1-200 | head -6
echo "-- 12 layers with JAX (median of 10):"
sed -n '/== with_jax (/,/== with_jax:/p' "$LOG" | grep -E "layers=" | head -8
ratios "$OUT/scanperf-all.json"
