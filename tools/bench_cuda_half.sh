#!/usr/bin/env bash
# On the GPU machine, from the repo root (after .whl/*.whl went into /tmp/site, as
# tools/gpu_validate.sh's first lines do; done here too if it was not): the half-precision
# benchmarks (bf16 workloads, attention at GPT-2 shape, the GPT-2 step), each step under a timeout (about 7 minutes in all):
#   1. python -m bench --device cuda --dtype bf16: mlp, attention, block in accy, JAX, PyTorch
#      (checked against accy's reference, then timed; --quick: no memory phase);
#   2. attention at GPT-2 small's shape (8 x 12 heads x 1024 tokens x dim 64, causal, bf16,
#      forward + backward): accy nn.attention, the composition, JAX (XLA, cuDNN), PyTorch SDPA;
#   3. the gpt2 training step in bf16 and f32 (accy, JAX, PyTorch), and accy bf16 with
#      nn.attention.
# JSON into $OUT (bench-cuda-bf16.json, attention-gpt2.json, gpt2-bf16.json, gpt2-f32.json,
# gpt2-bf16-accy-fused.json), the full log in $OUT/bench-cuda-half.log, a summary of ~40 lines last
# (tools/bench_cuda_half_summary.py, which reads those JSON files).
set -uo pipefail
OUT="${OUT:-/tmp/bench-cuda-half}"
mkdir -p "$OUT"
LOG="$OUT/bench-cuda-half.log"
STEPS="$OUT/bench-cuda-half-steps.txt"
if [ ! -d /tmp/site ] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}:." PYTHONUNBUFFERED=1
export ACCY_CACHE_DIR="$OUT/accy-cache"
: > "$LOG"
: > "$STEPS"
step() {  # step NAME SECONDS COMMAND...: run under a timeout, log everything, keep going
  local name="$1" seconds="$2"
  # HALFBENCH_STEPS="a b ...": run only the steps named there
  if [ -n "${HALFBENCH_STEPS:-}" ] && [[ " $HALFBENCH_STEPS " != *" $name "* ]]; then return; fi
  shift 2
  echo "===== $name: $*" >> "$LOG"
  local start=$SECONDS
  timeout --kill-after=10 "$seconds" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "===== $name: exit $rc after $((SECONDS - start)) s" >> "$LOG"
  echo "$name: exit $rc ($((SECONDS - start)) s of $seconds)" >> "$STEPS"
}

step versions 20 python3 -c "import torch, jax, cupy; print('torch', torch.__version__, \
'jax', jax.__version__, 'cupy', cupy.__version__, torch.cuda.get_device_name())"
step bench-bf16 160 python3 -m bench --device cuda --dtype bf16 --quick --worker-timeout 100 \
  --json "$OUT/bench-cuda-bf16.json"
step attention-gpt2 55 python3 -m bench.flash_attention --device cuda --preset gpt2 \
  --seconds 1 --timeout 25 --json "$OUT/attention-gpt2.json"
step gpt2-bf16 95 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 --timeout 45 \
  --json "$OUT/gpt2-bf16.json"
step gpt2-f32 85 python3 -m bench.gpt2 --device cuda --dtype f32 --steps 5 --timeout 45 \
  --json "$OUT/gpt2-f32.json"
step gpt2-bf16-accy-fused 25 python3 -m bench.gpt2 --device cuda --dtype bf16 --systems accy \
  --accy-attention fused --steps 10 --timeout 20 --json "$OUT/gpt2-bf16-accy-fused.json"

echo "== bench-cuda-half summary (full log: $LOG)"
cat "$STEPS"
python3 tools/bench_cuda_half_summary.py "$OUT"
