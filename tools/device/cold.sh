#!/usr/bin/env bash
# On the GPU machine, from the repo root (PYTHONPATH=src:/tmp/site, .whl installed): the GPT-2
# step's cold start phase by phase (tools/cold_start.py, empty NVRTC/accy disk caches, then the
# same caches warm), the CUDA backend's tests (relocated kernels must compute what they did),
# bench.gpt2 for accy in bf16 (step time, cold and warm first step with phases), and the
# step's per-action profile (tools/gpt2_profile.py). Full log in $OUT/cold.log, bench.gpt2's
# JSON in $OUT/cold.json; a summary of at most ~40 lines at the end. About 2.5 minutes
# (at most 235 s when every step hits its timeout).
set -uo pipefail
OUT="${OUT:-/tmp}"
mkdir -p "$OUT"
LOG="$OUT/cold.log"
STEPS="$(mktemp)"
CACHE="$(mktemp -d)"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}:." PYTHONUNBUFFERED=1
: > "$LOG"
step() {  # step NAME SECONDS COMMAND...: run, log everything, keep going on failure
  local name="$1" seconds="$2"; shift 2
  echo "===== $name: $*" >> "$LOG"
  local start=$SECONDS
  timeout "$seconds" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "===== $name: exit $rc after $((SECONDS - start)) s" >> "$LOG"
  echo "$name: exit $rc ($((SECONDS - start)) s)" >> "$STEPS"
}
step cold-start 45 python3 tools/cold_start.py --gpu --cache-dir "$CACHE/step"
step warm-start 25 python3 tools/cold_start.py --gpu --cache-dir "$CACHE/step"
step cuda-tests 50 python3 -m pytest -p no:cacheprovider -p no:benchmark -x -rfE -n 8 tests/backends/test_cuda_relocation.py \
  tests/backends/test_cuda_kinds.py tests/backends/test_cuda_api.py tests/backends/test_control_flow.py \
  tests/backends/test_half_precision.py
step bench-gpt2 75 python3 -m bench.gpt2 --device cuda --dtype bf16 --systems accy --steps 10 \
  --timeout 40 --json "$OUT/cold.json"
step profile 40 python3 tools/gpt2_profile.py --dtype bf16 --top 12

echo "== cold.sh summary (full log: $LOG)"
cat "$STEPS"
python3 - "$LOG" "$OUT/cold.json" <<'PY'
import json, re, sys
log = open(sys.argv[1]).read()
blocks = re.findall(r"===== (cold-start|warm-start): .*?\n(.*?)===== \1: exit", log, re.S)
for name, text in blocks:  # the cold start in full, the warm one in short
    lines = [l for l in text.splitlines() if l.startswith(("cold start of", "  "))]
    if name == "warm-start":
        lines = [l for l in lines if not l.startswith(("  generated", "  launches", "  units"))]
    print(f"[{name}]", *lines[:13], sep="\n")
tests = re.findall(r"^(?:\d+ (?:passed|failed).*|FAILED .*|ERROR .*)$", log, re.M)
print("[cuda tests]", *(tests[:3] or ["no pytest summary (see the log)"]))
for line in re.findall(r"^(?:system \||accy \|).*$", log, re.M)[:2]:
    print(line)
try:
    for r in json.load(open(sys.argv[2]))["results"]:
        for key in ("first_step_phases_s", "warm_first_step_phases_s"):
            phases = r.get(key) or {}
            print(key, " ".join(f"{k}={v:.2f}" for k, v in phases.items()))
except (OSError, ValueError, KeyError) as error:
    print("bench json:", error)
for line in re.findall(r"^(?:compile \+ load.*|== gpt2.*|  (?:gemm|kernel|library) .*)$", log, re.M)[:5]:
    print(line)
PY
rm -rf "$CACHE" "$STEPS"
