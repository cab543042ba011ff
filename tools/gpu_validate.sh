#!/usr/bin/env bash
# On the GPU machine: the whole suite with CUDA, short CUDA demos (f32 and bf16), accy's bench
# steps at an older tree (OLD, default .old) against this one, interleaved, and the gpt2 bench.
# Wheels in .whl (packages the machine lacks) are installed first. Prints a short table last.
set -uo pipefail
OUT="${OUT:-/tmp}"
# The kernel cache stays off $OUT: only a few files come back from the device machine.
export PYTHONPATH=src PYTHONUNBUFFERED=1 ACCY_CACHE_DIR="${ACCY_CACHE_DIR:-/tmp/accy-cache}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH="src:/tmp/site"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# On every core (-n); the host's pytest-benchmark plugin refuses xdist, and JAX stays on the CPU
# for the front end's comparisons. The tests marked slow too (on an H200 host with 15 workers
# the default selection takes about 90 s, the slow ones about 140 s).
JAX_PLATFORMS=cpu timeout "${PYTEST_SECONDS:-420}" python3 -m pytest -p no:cacheprovider -p no:benchmark -n "${PYTEST_WORKERS:-12}" -m "slow or not slow" -rfE "${@}" 2>&1 \
  > "$OUT/pytest.txt"
for dtype in f32 bf16; do
  python3 -m accy demo --device cuda --dtype "$dtype" --steps 400 --out "/tmp/demo-$dtype" 2>&1 \
    | tr '\r' '\n' | grep -E 'compiled|final training loss|accuracy' > "$OUT/demo-$dtype.txt"
done
if [ -d "${OLD:-.old}" ]; then
  python3 tools/compare_commits.py "${OLD:-.old}" . --device cuda --rounds 1 > "$OUT/bench.txt" 2>&1
fi
PYTHONPATH="$PYTHONPATH:." timeout "${GPT2_SECONDS:-150}" python3 -m bench.gpt2 --device cuda --dtype "${GPT2_DTYPE:-bf16}" --systems "${GPT2_SYSTEMS:-accy,jax,torch}" \
  --json "$OUT/gpt2-cuda.json" > "$OUT/gpt2.txt" 2>&1
echo "== pytest"; tail -60 "$OUT/pytest.txt"
for dtype in f32 bf16; do echo "== demo $dtype"; cat "$OUT/demo-$dtype.txt"; done
echo "== bench"; cat "$OUT/bench.txt" 2>/dev/null; echo "== gpt2"; tail -15 "$OUT/gpt2.txt"
