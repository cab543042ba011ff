#!/usr/bin/env bash
# On a GPU machine (the device tool's H200): the whole test suite with CUDA enabled, then a short
# demo run on CUDA. Run from the repository root; uses the machine's own Python and CuPy.
set -uo pipefail
export PYTHONPATH=src ACCY_CACHE_DIR="${OUT:-/tmp}/accy-cache"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pytest -p no:cacheprovider -p no:benchmark -rs 2>&1 | tail -25 | tee "${OUT:-/tmp}/pytest.txt"
python3 -m accy demo --device cuda --steps 400 --out "${OUT:-/tmp}/demo" 2>&1 | tr '\r' '\n' \
  | grep -v '^ *[0-9]*%|' | tail -9
