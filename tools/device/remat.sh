#!/usr/bin/env bash
# Session 5, helper remat (issue 20: rematerialization, the training step's peak memory), one
# H200, about 2.5 minutes:
# 1. the plan's account of the bf16 GPT-2 step for CUDA (tools/gpt2_memory.py: workspace, peak
#    of live bytes and what is alive there; no GPU needed), with the rewrite and without it;
# 2. the step run on the GPU, parameters and state donated, with the rewrite and without it
#    (`accy.lower.target.GPU.rematerialize_after` 64 and 0): CuPy's pool after 3 steps (the
#    bench's "peak MB") and the losses, which must be bit for bit the same;
# 3. python -m bench.gpt2 --device cuda --dtype bf16 --systems accy,torch --steps 10: peak MB
#    and step ms of accy against torch.compile;
# 4. tests/backends/test_remat.py (CPU).
# Full log: $OUT/remat.log; a summary of at most ~30 lines on stdout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/remat.log"
: > "$LOG"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:-src:.}"
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
# remat_switch.py: tools/gpt2_memory.py with the GPU target's rematerialization set to $1 operations
# (0: off), passing the other arguments on.
# (0: off), passing the other arguments on; with --gpu, runs the donated bf16 step 3 times and
# prints CuPy's pool, the losses in full and a hash of the parameters after.
cat > "$OUT/remat_switch.py" <<'PY'
import dataclasses, hashlib, json, sys
sys.path.insert(0, ".")
import accy.backends.cuda.compile as cuda_compile
import accy.lower.target as target
distance = int(sys.argv[1])
target.GPU = cuda_compile.GPU = dataclasses.replace(target.GPU, rematerialize_after=distance)
print(f"rematerialize_after={distance}", flush=True)
if sys.argv[2:3] != ["--gpu"]:
    from tools.gpt2_memory import main
    raise SystemExit(main(sys.argv[2:]))
import cupy
import numpy as np
from bench.gpt2 import SCALES, accy_inputs, accy_step
scale = SCALES["cuda"]
params, state, ids, targets = accy_inputs(scale, "cuda", dtype="bf16")
step = accy_step(scale, "cuda", "bf16", True)
losses = []
for _ in range(3):
    loss, params, state = step(params, state, ids, targets)
    losses.append(repr(float(np.asarray(loss.array.get()))))
digest = hashlib.sha256()
for group in sorted(params):
    for name in sorted(params[group]):
        digest.update(np.ascontiguousarray(params[group][name].array.get()).tobytes())
pool = cupy.get_default_memory_pool()
print(json.dumps({"remat": distance, "losses": losses, "params_sha256": digest.hexdigest()[:16],
                  "pool_total_MiB": round(pool.total_bytes() / 2**20, 1),
                  "pool_used_MiB": round(pool.used_bytes() / 2**20, 1)}))
PY
step plan-on 30 python3 "$OUT/remat_switch.py" 64 --top 8 --json "$OUT/remat-plan-on.json"
step plan-off 30 python3 "$OUT/remat_switch.py" 0 --top 8 --json "$OUT/remat-plan-off.json"
step gpu-on 40 python3 "$OUT/remat_switch.py" 64 --gpu
step gpu-off 40 python3 "$OUT/remat_switch.py" 0 --gpu
step bench 100 python3 -m bench.gpt2 --device cuda --dtype bf16 --systems accy,torch --steps 10 \
  --timeout 90 --json "$OUT/remat-gpt2-cuda-bf16.json"
JAX_PLATFORMS=cpu step tests 40 python3 -m pytest -p no:benchmark -p no:cacheprovider -rfE \
  tests/backends/test_remat.py
echo "== remat summary ($((SECONDS - START)) s; full log $LOG)"
grep -E "^== .*exit" "$LOG"
grep -E "^[0-9]+ (passed|failed)|^FAILED|^ERROR" "$LOG" | head -4
for mode in on off; do
  python3 - "$OUT/remat-plan-$mode.json" "$mode" <<'PY' || echo "no plan JSON ($mode)"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"plan remat {sys.argv[2]:3}: {r['steps']} steps, workspace {r['workspace_MiB']} MiB, "
      f"peak live {r['peak_live_MiB']} MiB at step {r['peak_step']}")
for b in r["largest_alive_at_peak"][:3]:
    print(f"   {b['MiB']} MiB {b['type']} ({b['producer']}, {b['written']}, last read {b['last read']})")
PY
done
python3 - "$LOG" <<'PY' || echo "no GPU runs"
import json, sys
runs = {}
for line in open(sys.argv[1]):
    if line.startswith('{"remat"'):
        r = json.loads(line)
        runs[r["remat"]] = r
        print(f"gpu remat={r['remat']}: pool {r['pool_total_MiB']} MiB (used {r['pool_used_MiB']}), "
              f"losses {r['losses']}, params {r['params_sha256']}")
if 64 in runs and 0 in runs:
    same = all(runs[64][k] == runs[0][k] for k in ("losses", "params_sha256"))
    print("losses and parameters bit-identical with and without remat:", same)
PY
grep -A3 "^system | step ms" "$LOG" | grep -v "^==" | head -4
