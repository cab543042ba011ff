#!/usr/bin/env bash
# On the GPU machine's host CPU (no GPU used), from the repo root with PYTHONPATH=src:/tmp/site:.
# exported: the CPU step time of rematerialised scans (branch cpuremat, issue 17).
#   1. bench.scan_rnn --device cpu, 64 / 1024 / 16384 steps, remat off and on, accy and JAX,
#      all cores (the brief's command; session 5 before this branch: accy remat 4.01 ms at 64
#      steps and 760 ms at 16384, JAX remat 3.46 and 719 ms).
#   2. the same at 1024 and 16384 steps on ONE core for both systems (taskset, one OpenMP
#      thread): the per-step work without thread effects.
#   3. tests: blocked CPU scans, scan gradients (unrolled oracle, finite differences), scan
#      memory, control flow (JAX_PLATFORMS=cpu).
# Full log: $OUT/cpuremat.log; the benchmark rows: $OUT/cpuremat-all.json, $OUT/cpuremat-one.json.
# A summary of at most ~30 lines is printed last; read "remat/plain" (bar: about 2x or less)
# and "accy/jax" (bar: at most 1.0) per steps and remat. Each step has its own timeout.
set -uo pipefail
OUT="${OUT:-/tmp}"
mkdir -p "$OUT"
LOG="$OUT/cpuremat.log"
export PYTHONPATH="${PYTHONPATH:-src}:." PYTHONUNBUFFERED=1 JAX_PLATFORMS=cpu
: > "$LOG"
START=$SECONDS

step() {  # step NAME SECONDS COMMAND...: run with a timeout, log everything, note the status
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s, at $((SECONDS - START))s)" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  echo "== $name: exit $? after $((SECONDS - START))s" >> "$LOG"
}

step bench-all-cores 80 python3 -m bench.scan_rnn --device cpu --steps 64,1024,16384 \
  --repeat 2 --timeout 30 --json "$OUT/cpuremat-all.json"
step bench-one-core 60 env OMP_NUM_THREADS=1 taskset -c 0 python3 -m bench.scan_rnn \
  --device cpu --steps 1024,16384 --repeat 2 --timeout 25 --json "$OUT/cpuremat-one.json"
step tests 60 python3 -m pytest -rfE -p no:benchmark -p no:cacheprovider -x \
  tests/backends/test_cpu_scan_blocks.py tests/autodiff/test_scan_memory.py \
  tests/autodiff/test_scan_gradients.py tests/autodiff/test_scan_weight_gradients.py \
  tests/backends/test_control_flow.py

echo "== cpuremat summary ($((SECONDS - START)) s; full log $LOG)"
grep -E "^== .*exit" "$LOG"
for which in all one; do
  python3 - "$OUT/cpuremat-$which.json" "$which" <<'PY' || echo "no $which-core JSON"
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if "step_s" in r]
print(f"-- {sys.argv[2]} core(s): step ms (peak RSS MiB) | remat/plain | accy/jax")
at = {(r["system"], r["steps"], r["remat"]): r for r in rows}
for steps in sorted({r["steps"] for r in rows}):
    for remat in (False, True):
        cells, ratio = [], ""
        for system in ("accy", "jax"):
            r = at.get((system, steps, remat))
            cells.append(f"{system} {r['step_s'] * 1e3:8.2f} ({r['peak_rss_mib']:6.1f})" if r else f"{system} -")
        a, j, p = at.get(("accy", steps, remat)), at.get(("jax", steps, remat)), at.get(("accy", steps, False))
        if remat and a and p:
            ratio += f" remat/plain {a['step_s'] / p['step_s']:.2f}"
        if a and j:
            ratio += f" accy/jax {a['step_s'] / j['step_s']:.2f}"
        print(f"{steps:6} remat={remat!s:5} " + " | ".join(cells) + " |" + ratio)
PY
done
grep -E "^[0-9]+ (passed|failed)|^FAILED|^ERROR" "$LOG" | head -6
