#!/usr/bin/env bash
# On the GPU machine: the whole suite with CUDA, a short CUDA demo, and accy's bench steps at
# an older tree (OLD, default .old) against this one, interleaved. Prints a short table last.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 ACCY_CACHE_DIR="${OUT:-/tmp}/accy-cache"
OUT="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pytest -p no:cacheprovider -q -rfE 2>&1 | tail -40 > "$OUT/pytest.txt"
python3 -m accy demo --device cuda --steps 400 --out "$OUT/demo" 2>&1 | tr '\r' '\n' \
  | grep -v '^ *[0-9]*%|' | tail -6 > "$OUT/demo.txt"
if [ -d "${OLD:-.old}" ]; then
  python3 tools/compare_commits.py "${OLD:-.old}" . --device cuda --rounds 1 > "$OUT/bench.txt" 2>&1
fi
echo "== pytest"; tail -25 "$OUT/pytest.txt"; echo "== demo"; cat "$OUT/demo.txt"; echo "== bench"
cat "$OUT/bench.txt" 2>/dev/null
