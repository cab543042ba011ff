#!/usr/bin/env bash
# On the GPU machine, from the repository root (after tools/gpu_validate.sh's wheel install, so
# PYTHONPATH=src:/tmp/site): the front end's CUDA tests, its JAX comparison tests, and the call
# overhead benchmark on cuda and on cpu. The full log goes to $OUT/frontend-cuda.log; a summary of
# at most ~40 lines is printed last. Each step has its own timeout and runs whatever the
# previous ones did; the timeouts add up to 4 minutes.
set -uo pipefail
OUT="${OUT:-/tmp}"
LOG="$OUT/frontend-cuda.log"
export PYTHONPATH="${PYTHONPATH:-src:/tmp/site}" PYTHONUNBUFFERED=1
export ACCY_CACHE_DIR="${ACCY_CACHE_DIR:-$OUT/accy-cache-frontend-cuda}"
: > "$LOG"
SUMMARY=()

step() {  # step NAME SECONDS COMMAND...: run it, log everything, remember its status
  local name="$1" seconds="$2"
  shift 2
  echo "=== $name: $*" >> "$LOG"
  local start=$SECONDS
  timeout "$seconds" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start)) s" >> "$LOG"
  SUMMARY+=("$name: exit $rc ($((SECONDS - start)) s)")
  return 0
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$LOG" 2>&1
python3 -c "import jax, cupy; print('jax', jax.__version__, jax.devices()); print('cupy', cupy.__version__)" >> "$LOG" 2>&1

# 1. the CUDA tests must run, not skip: -rs lists any skip with its gate
step "pytest tests/frontend/test_cuda.py" 90 \
  python3 -m pytest -p no:cacheprovider -rfEs tests/frontend/test_cuda.py
# 2. the JAX comparison, the misuse table and the rest of the front end's tests (CPU paths;
#    JAX kept on its CPU, where the float64 comparisons were written)
step "pytest tests/frontend" 80 env JAX_PLATFORMS=cpu \
  python3 -m pytest -p no:cacheprovider -rfE tests/frontend src/accy/frontend \
  --ignore=tests/frontend/test_cuda.py
# 3. the call overhead, on the GPU and on the host (JAX on its GPU and on its CPU)
# (FRONTEND2_QUICK=1: a smoke run of the script itself, not a measurement)
SIZE=(--number 1000 --rounds 15)
[ "${FRONTEND2_QUICK:-0}" = 1 ] && SIZE=(--quick)
for device in cuda cpu; do
  step "bench $device" 35 python3 -m bench.frontend_overhead --device "$device" "${SIZE[@]}" \
    --json "$OUT/frontend-cuda-overhead-$device.json"
done

echo "== frontend-cuda summary (full log: $LOG)"
printf '%s\n' "${SUMMARY[@]}"
echo "== pytest summaries"
grep -E "^(SKIPPED|FAILED|ERROR)|[0-9]+ (passed|failed|skipped)" "$LOG" | head -12
echo "== overhead: claims (ratios of medians; all medians in the log and the JSON files)"
grep -E "^device |x \(<= [0-9.]+x\) (holds|does NOT hold)$" "$LOG" | head -16
