#!/usr/bin/env bash
# Session 4, helper attn4 (issue 16, fused attention speed), one H200, about 3.5 minutes:
# 1. bench.attention_probe at GPT-2 small's shape: PyTorch SDPA per backend, cuDNN graphs built
#    directly in one variant per configuration difference, every cuDNN plan, accy's step under
#    each accy.attention.cuda.Settings (JSON: $OUT/attn4.json);
# 2. tests/attention on CUDA (cuDNN forward/backward against the f64 composition);
# 3. bench.flash_attention --device cuda --preset gpt2 (accy, JAX cuDNN, PyTorch).
# Full log: $OUT/attn4.log; a summary of at most ~40 lines on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/attn4.log"
: > "$LOG"
export PYTHONUNBUFFERED=1
START=$SECONDS
budget() {  # seconds left for a step: its own limit, or what remains of 200 s
  local left=$((200 - (SECONDS - START)))
  ((left < $1)) && echo $((left > 5 ? left : 5)) || echo "$1"
}
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit; limit=$(budget "$2"); shift 2
  echo "== $name (limit ${limit}s, at $((SECONDS - START))s)" >> "$LOG"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  echo "== $name: exit $? after $((SECONDS - START))s" >> "$LOG"
}
step probe 110 python3 -m bench.attention_probe --sections cudnn,accy,torch,plans --repeats 50 --inner 10 --json "$OUT/attn4.json"
step tests 60 python3 -m pytest tests/attention -q -p no:cacheprovider -rfE
step flash_attention 40 python3 -m bench.flash_attention --device cuda --preset gpt2 \
  --seconds 1 --systems accy,jax-cudnn,torch
echo "== attn4 summary ($((SECONDS - START)) s; full log $LOG)"
grep -E "^== .*exit" "$LOG"
python3 - "$OUT/attn4.json" <<'PY' || echo "no probe JSON"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
def f(r, k, digits=3):
    v = r.get(k)
    return "-" if not isinstance(v, float) else f"{v:.{digits}g}" if k == "max_error" else f"{v:.{digits}f}"
for r in [r for r in rows if r["section"] != "plans"]:
    print(f"{r['variant'][:30]:30} fwd {f(r, 'fwd_ms')} bwd {f(r, 'bwd_ms')} both {f(r, 'both_ms')} "
          f"TF {r.get('tflops', '-')} err {f(r, 'max_error', 2)} | {str(r.get('plans', ''))[:44]} "
          f"| {r.get('status', '')[:40]}")
plans = [r for r in rows if r["section"] == "plans"]
print(f"plans: {len(plans)} listed; the fastest three of each part:")
for part, key in (("forward", "fwd_ms"), ("backward", "bwd_ms")):
    timed = sorted((r for r in plans if r["variant"].startswith(part) and r.get(key)), key=lambda r: r[key])
    for r in timed[:3]:
        print(f"  {r['variant']:18} {f(r, key)} ms err {f(r, 'max_error', 2)} {str(r.get('plans'))[:50]}")
for r in rows:
    for what, t in r.get("profile", [])[:6]:
        print(f"  profile: {t} ms {what[:70]}")
PY
grep -E "passed|failed|error" "$LOG" | grep -E "^[0-9]+ (passed|failed)|^FAILED|^ERROR" | head -6
grep -A8 "^system | step ms" "$LOG" | head -8
