#!/usr/bin/env bash
# Session 6, call 2 (one H200): the bf16 GELU kernels in variants (tools/device/gelu_variants.py),
# the bf16 GPT-2 step with GELU outputs kept (accy alone; JAX and PyTorch were measured in call 1
# of session 5 and are re-measured in the last call), and bench.scan_layers on the host's CPU.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=src:/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 120 python3 tools/device/gelu_variants.py > "$OUT/gelu.txt" 2>&1
timeout 150 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 10 --systems accy \
  --json "$OUT/gpt2-bf16-accy.json" > "$OUT/gpt2.txt" 2>&1
timeout 200 python3 -m bench.scan_layers --device cpu --layers 12,48 --systems accy \
  --repeat 5 --timeout 90 > "$OUT/scan-layers-cpu.txt" 2>&1
echo "== gelu variants"; tail -n 20 "$OUT/gelu.txt"
echo "== gpt2 bf16 accy"; tail -n 4 "$OUT/gpt2.txt"
echo "== scan_layers cpu (16 cores)"; tail -n 6 "$OUT/scan-layers-cpu.txt"
