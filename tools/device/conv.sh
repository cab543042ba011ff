#!/usr/bin/env bash
# On the GPU machine, from the repo root, after the lead installed .whl/*.whl into /tmp/site
# (PYTHONPATH=src:/tmp/site): the conv kind on CUDA. cuDNN's version; a smoke run of the conv
# workload's loss and gradients at the CUDA scale with cuDNN and with the composition
# (ACCY_CUDNN_CONV=0), f32 and bf16 (cuDNN steps, declines, agreement, step times); the conv
# tests with CUDA; `python -m bench --device cuda --workloads conv --quick` in f32 and bf16
# (accy, JAX, PyTorch). Full log in $OUT/conv.log; a summary of at most ~40 lines at the end.
set -uo pipefail
OUT="${OUT:-/tmp}"
mkdir -p "$OUT"
LOG="$OUT/conv.log"
STEPS="$(mktemp)"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}:." PYTHONUNBUFFERED=1
export ACCY_CACHE_DIR="$(mktemp -d)"
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
step versions 20 python3 -c "import cudnn, cupy; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version(), 'cupy', cupy.__version__)"
step smoke 40 python3 tools/device/conv_smoke.py
step tests 45 python3 -m pytest -p no:cacheprovider -rs -rfE -x \
  tests/backends/test_conv_backends.py tests/backends/test_cuda_kinds.py -k "conv"
step bench-f32 45 python3 -m bench --device cuda --workloads conv --quick --json /tmp/conv-cuda.json
step bench-bf16 70 python3 -m bench --device cuda --workloads conv --quick --dtype bf16 --json /tmp/conv-cuda-bf16.json

{
  echo "== conv.sh summary (full log: $LOG)"
  cat "$STEPS"
  grep -E "^cudnn frontend|^conv (f32|bf16)|^declined" "$LOG" | head -12
  grep -E "[0-9]+ (passed|failed)|^FAILED|^ERROR|^SKIPPED" "$LOG" | head -6
  grep -E "^│ conv" "$LOG" | cut -c1-200 | head -4
  python3 - <<'PY'
import json
for path in ("/tmp/conv-cuda.json", "/tmp/conv-cuda-bf16.json"):
    try:
        workloads = json.load(open(path))["workloads"]
    except Exception as error:
        print(f"{path}: {error}")
        continue
    for w in workloads:
        print(f"{w['name']} {w['dtype']} {w['status']} ratios {w.get('ratios')} {w.get('message') or ''}"[:200])
        for name, r in (w.get("systems") or {}).items():
            step = (r.get("step") or {}).get("median_s")
            ms = "-" if step is None else f"{step * 1e3:.3f} ms"
            print(f"  {name:>6}: step {ms}, {r.get('tflops_per_s')} TFLOP/s, first {r.get('first_call_s')} s, {(str(r.get('error') or '').strip().splitlines() or [''])[-1][:100]}")
PY
} | tee -a "$LOG" | head -40
