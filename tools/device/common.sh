# Sourced by the device scripts (tools/device/round34.sh and later), from the repo root on the
# GPU machine: $OUT for what comes back, the carried wheels (.whl/: optree and
# nvidia-cudnn-frontend) installed into /tmp/site, and the environment accy runs in there.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 \
  | grep -v "already exists" | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0

flash_tests() {  # the f32 attention kernels' tests on the GPU; summary to stdout
  JAX_PLATFORMS=cpu timeout 90 python3 -m pytest -p no:cacheprovider -p no:benchmark -n 8 -rfE \
    tests/attention/test_flash_cuda.py > "$OUT/flash-tests.txt" 2>&1
  echo "== flash tests (rc $?)"; grep -E "passed|failed" "$OUT/flash-tests.txt" | tail -1
  grep -E "^(FAILED|ERROR)|max error" "$OUT/flash-tests.txt" | head -12
}

suite() {  # the whole test suite with CUDA on the GPU machine; summary to stdout
  JAX_PLATFORMS=cpu ACCY_CACHE_DIR=/tmp/suite-cache timeout "${1:-200}" \
    python3 -m pytest -p no:cacheprovider -p no:benchmark -n 14 -rfE > "$OUT/suite.txt" 2>&1
  echo "== suite"; grep -E "passed|failed" "$OUT/suite.txt" | tail -1
  grep -E "^(FAILED|ERROR)" "$OUT/suite.txt" | head -12
}
