#!/usr/bin/env bash
# On the GPU machine, from the repo root (PYTHONPATH=src:/tmp/site, .whl installed), helper
# chains (issue 20: a row reduction reading an earlier one's per-row result runs in the same
# kernel). Steps:
# 1. the CUDA tests of chains, sibling reductions, epilogues and column reductions;
# 2. tools/device/chains_ab.py: GPT-2-sized cross-entropy and LayerNorm fwd+bwd, ms per call
#    chained and apart (CHAIN_WINDOW = 0), and whether both give the same bits (session 7's
#    third variant, the grid capped so that the rows in flight fit L2, went in session 8);
# 3. tools/device/chains_step.py: the GPT-2 bf16 step's whole graph, ms: chained, chained
#    without loops after the last reduction, apart (compiled in one process, timed
#    alternately twice);
# 4. tools/gpt2_profile.py --dtype bf16 --attention fused --top 25 (its 2nd line: the whole
#    step's graph time), first 35 lines.
# Full log in $OUT/chains.log; the summary at the end. At most ~190 s.
set -uo pipefail
OUT="${OUT:-/tmp}"
mkdir -p "$OUT"
LOG="$OUT/chains.log"
STEPS="$(mktemp)"
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
step tests 40 env JAX_PLATFORMS=cpu python3 -m pytest -p no:cacheprovider -p no:benchmark -rfEs \
  -n 8 tests/backends/test_reduction_chains.py tests/backends/test_sibling_reductions.py \
  tests/backends/test_reduction_epilogues.py tests/backends/test_cuda_columns.py
step chains-ab 25 python3 tools/device/chains_ab.py
step chains-step 75 python3 tools/device/chains_step.py
step profile 50 python3 tools/gpt2_profile.py --dtype bf16 --attention fused --top 25

echo "== chains.sh summary (full log: $LOG)"
cat "$STEPS"
python3 - "$LOG" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
tests = re.findall(r"^(?:=* ?\d+ (?:passed|failed).*|FAILED .*|ERROR .*)$", log, re.M)
print("[tests]", *(tests[:6] or ["no pytest summary (see the log)"]), sep="\n  ")
skipped = re.findall(r"^SKIPPED .*$", log, re.M)
print(f"[skipped] {len(skipped)}", *skipped[:1], sep="\n  ")
print("[chains-ab]", *re.findall(r"^.* chained .* apart .*$", log, re.M), sep="\n  ")
print("[chains-step]", *re.findall(r"^(?:GPT-2 bf16 step .*|compiled .*)$", log, re.M), sep="\n  ")
PY
echo "[profile] first 35 lines"
sed -n '/===== profile: /,/===== profile: exit/p' "$LOG" | sed '1d;$d' | head -35
