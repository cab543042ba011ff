#!/usr/bin/env bash
# On the two-GPU machine: the link between the GPUs, NCCL through accy (tests/mesh/test_nccl.py),
# and bench/mesh.py (256 MB all-reduce bus bandwidth; data-parallel scaling) on 1 and 2 GPUs.
set -uo pipefail
OUT="${OUT:-/tmp}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
timeout 240 python3 -m pytest -p no:cacheprovider -rfEs tests/mesh/test_nccl.py > "$OUT/nccl-tests.txt" 2>&1
for n in 2 1; do
  timeout 150 python3 -m accy.launch --gpus "$n" bench/mesh.py --json "$OUT/mesh-${n}gpu.json" \
    > "$OUT/mesh-${n}gpu.txt" 2>&1
done
echo "== topo"; cat "$OUT/topo.txt"
echo "== nccl tests"; tail -25 "$OUT/nccl-tests.txt"
for n in 2 1; do echo "== mesh $n gpu"; tail -20 "$OUT/mesh-${n}gpu.txt"; done
