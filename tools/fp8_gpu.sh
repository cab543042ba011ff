#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one call of at most FP8_TOTAL_S seconds
# (default 560: a 10-minute call; at 235 s the gemms section took most of the bench's 100 s):
# what bench/results/fp8-h200-bf16.md reports. The cuBLASLt probe (tools/fp8_cublaslt_probe.py);
# where accy's FP8 step runs, bench.fp8's gemms and step sections alone, then
# tests/nn/test_fp8.py beside the demo section (its losses do not depend on time), then the step
# with the head alone in FP8 if time is left. Logs and JSON in $OUT.
set -uo pipefail
source tools/gpu_env.sh
export JAX_PLATFORMS=cpu
TOTAL="${FP8_TOTAL_S:-560}"

run() {  # run NAME SECONDS COMMAND...: output to $OUT/NAME.txt, within what is left of TOTAL
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  local left=$((TOTAL - (SECONDS - T0) - 5))
  ((limit > left)) && limit=$left
  if ((limit < 15)); then
    echo "== $name: skipped ($left s left)"
    return 1
  fi
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s (limit $limit s)"
  return "$rc"
}
shown() { grep -v -i -E "nanobind|leak" "$1" | tail -n "$2"; }

run probe 40 python3 tools/fp8_cublaslt_probe.py
shown "$OUT/probe.txt" 60
if grep -q "accy step float8_e4m3fn x float8_e4m3fn -> bf16: runs" "$OUT/probe.txt"; then
  run bench 240 python3 -m bench.fp8 --device cuda --sections gemms,step \
    --json "$OUT/fp8-h200-bf16.json"
  shown "$OUT/bench.txt" 8
  run demo 200 python3 -m bench.fp8 --device cuda --sections demo --steps 100 \
    --json "$OUT/fp8-demo-h200-bf16.json" &
  demo=$!
  run pytest 90 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 6 -q tests/nn/test_fp8.py
  grep -E "passed|failed|FAILED|Error" "$OUT/pytest.txt" | tail -12
  wait "$demo"
  shown "$OUT/demo.txt" 4
  run step-head 100 python3 -m bench.fp8 --device cuda --sections step --fp8 head \
    --json "$OUT/fp8-head-h200-bf16.json"
  shown "$OUT/step-head.txt" 3
fi
echo "== total $((SECONDS - T0)) s"
