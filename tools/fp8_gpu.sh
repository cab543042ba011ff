#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one call: what bench/results/fp8-h200-bf16.md
# reports. The cuBLASLt probe (tools/fp8_cublaslt_probe.py), tests/nn/test_fp8.py and, where
# accy's FP8 step runs, the demo section beside the tests (its losses do not depend on time),
# then bench.fp8's gemms and step sections alone, and the step with the head alone in FP8. Logs and JSON in $OUT; at most ~300 s.
set -uo pipefail
source tools/gpu_env.sh
export JAX_PLATFORMS=cpu

run() {  # run NAME SECONDS COMMAND...: output to $OUT/NAME.txt, with a timeout
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s"
  return "$rc"
}
shown() { grep -v -i -E "nanobind|leaked|leak" "$1" | tail -n "$2"; }

run probe 45 python3 tools/fp8_cublaslt_probe.py
shown "$OUT/probe.txt" 40
demo=""
if grep -q "accy step float8_e4m3fn x float8_e4m3fn -> bf16: runs" "$OUT/probe.txt"; then
  run demo 130 python3 -m bench.fp8 --device cuda --sections demo --steps 100 \
    --json "$OUT/fp8-demo-h200-bf16.json" &
  demo=$!
fi
run pytest 100 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 6 -q tests/nn/test_fp8.py
grep -E "passed|failed|FAILED|Error" "$OUT/pytest.txt" | tail -15
if [ -n "$demo" ]; then
  wait "$demo"
  shown "$OUT/demo.txt" 6
  run bench 110 python3 -m bench.fp8 --device cuda --sections gemms,step \
    --json "$OUT/fp8-h200-bf16.json"
  shown "$OUT/bench.txt" 12
  run step-head 60 python3 -m bench.fp8 --device cuda --sections step --fp8 head \
    --json "$OUT/fp8-head-h200-bf16.json"
  shown "$OUT/step-head.txt" 3
fi
echo "== total $((SECONDS - T0)) s"
