#!/usr/bin/env bash
# On the GPU machine, from the repo root (PYTHONPATH=src:/tmp/site, .whl installed), helper
# warmcache (issue 20: a warm first step of the GPT-2 step under 2 s). Steps:
# 1. the fragment-cache tests (a fragment read back loads and runs on the GPU as compiled,
#    donation included) and the CUDA tests that compile through the cache (cuDNN attention,
#    cuDNN conv, donation);
# 2. tools/cold_start.py twice on one cache folder: cold, then warm (phases; warm should show
#    "fragment key" + "cached fragment" and no "plan" / "emit kernels");
# 3. python3 -m bench.gpt2 --device cuda --dtype bf16 --systems accy --steps 3: cold and warm
#    first step (a second process on the filled caches) with their phases.
# Full log in $OUT/warmcache.log, bench.gpt2's JSON in $OUT/warmcache-gpt2.json; a summary of
# at most ~40 lines at the end, the phase table last. At most ~220 s when every step times out.
set -uo pipefail
OUT="${OUT:-/tmp}"
mkdir -p "$OUT"
LOG="$OUT/warmcache.log"
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
nvidia-smi -L >> "$LOG" 2>&1 || echo "no nvidia-smi (no GPU?)" >> "$LOG"
step tests 70 env JAX_PLATFORMS=cpu python3 -m pytest -p no:cacheprovider -p no:benchmark -rfEs \
  -n 8 tests/backends/test_cuda_fragment_cache.py tests/backends/test_cuda_donation.py \
  tests/attention/test_cudnn.py tests/backends/test_conv_backends.py tests/bench/test_cold_start.py
step cold-start 40 python3 tools/cold_start.py --gpu --cache-dir "$CACHE/step"
step warm-start 25 python3 tools/cold_start.py --gpu --cache-dir "$CACHE/step"
step bench-gpt2 80 python3 -m bench.gpt2 --device cuda --dtype bf16 --systems accy --steps 3 \
  --timeout 35 --json "$OUT/warmcache-gpt2.json"

echo "== warmcache.sh summary (full log: $LOG)"
cat "$STEPS"
python3 - "$LOG" "$OUT/warmcache-gpt2.json" <<'PY'
import json, re, sys
log = open(sys.argv[1]).read()
tests = re.findall(r"^(?:=* ?\d+ (?:passed|failed).*|FAILED .*|ERROR .*)$", log, re.M)
print("[tests]", *(tests[:4] or ["no pytest summary (see the log)"]), sep="\n  ")
skips = re.findall(r"^SKIPPED .*test_cuda_fragment_cache.*$", log, re.M)
print("[fragment-cache GPU test skipped]" if skips else "[fragment-cache GPU test ran]", *skips[:1])
blocks = re.findall(r"===== (cold-start|warm-start): .*?\n(.*?)===== \1: exit", log, re.S)
for name, text in blocks:
    lines = [l for l in text.splitlines() if l.startswith(("cold start of", "  "))]
    lines = [l for l in lines if not l.startswith(("  generated", "  launches", "  units"))]
    print(f"[{name}]", *lines[:12], sep="\n")
for line in re.findall(r"^(?:system \||accy \|).*$", log, re.M)[:2]:
    print(line)
try:
    (r,) = json.load(open(sys.argv[2]))["results"]
    cold, warm = r.get("first_step_phases_s") or {}, r.get("warm_first_step_phases_s") or {}
    print(f"first step: cold {r.get('first_step_s')} s, warm {r.get('warm_first_step_s')} s"
          " (bar: cold < 10 s, warm < 2 s)")
    print(f"{'phase':24} {'cold s':>8} {'warm s':>8}")
    for phase in dict.fromkeys([*cold, *warm]):
        c, w = cold.get(phase), warm.get(phase)
        print(f"{phase:24} {'-' if c is None else f'{c:8.3f}':>8} {'-' if w is None else f'{w:8.3f}':>8}")
    print(f"{'sum':24} {sum(cold.values()):8.3f} {sum(warm.values()):8.3f}")
except (OSError, ValueError, KeyError) as error:
    print("bench json:", error, r.get("error") if "r" in dir() else "")
PY
rm -rf "$CACHE" "$STEPS"
