#!/usr/bin/env bash
# Session 10, only the one-GPU machine lent: the multi-GPU machinery on a mesh of ONE GPU (NCCL
# with one rank: its steps captured in the CUDA graph, buckets on the second stream, donation),
# which no GPU had run before; and the data-parallel GPT-2 step's cost over the plain step at
# one GPU (what 2-GPU scaling cannot recover). ~7 min.
source tools/device/common.sh
JAX_PLATFORMS=cpu timeout 90 python3 -m pytest -p no:cacheprovider -p no:benchmark -q -rfE \
  tests/backends/test_cuda_vectors.py > "$OUT/vectors.txt" 2>&1
echo "== test_cuda_vectors (rc $?)"; grep -E "passed|failed" "$OUT/vectors.txt" | tail -1
grep -E "^(FAILED|ERROR)" "$OUT/vectors.txt" | head -8
timeout 200 python3 -m accy.launch --gpus 1 tests/mesh/nccl_worker.py > "$OUT/nccl-1.txt" 2>&1
echo "== nccl_worker on 1 GPU (rc $?)"; grep -E "rank 0|Error|error" "$OUT/nccl-1.txt" | head -12
timeout 120 python3 -m accy.launch --gpus 1 bench/mesh.py --json "$OUT/mesh-1gpu.json" \
  > "$OUT/mesh.txt" 2>&1
echo "== bench/mesh.py (1 GPU, rc $?)"; tail -n 8 "$OUT/mesh.txt"
timeout -k 5 120 python3 -m bench.gpt2 --gpus 1 --steps 20 --dtype bf16 --timeout 110 \
  --json "$OUT/gpt2-dp-1gpu.json" > "$OUT/gpt2-dp-1.txt" 2>&1
echo "== gpt2 bf16 data-parallel, 1 GPU (rc $?)"; tail -n 6 "$OUT/gpt2-dp-1.txt"
timeout 90 python3 -m bench.gpt2 --device cuda --dtype bf16 --steps 20 \
  --systems accy --json "$OUT/gpt2-1gpu.json" > "$OUT/gpt2-1gpu.txt" 2>&1
echo "== gpt2 bf16, one GPU, the plain step (rc $?)"; tail -n 3 "$OUT/gpt2-1gpu.txt"
timeout -k 5 150 torchrun --standalone --nproc-per-node 1 bench/ddp_torch.py --dtype bf16 \
  --compile --json "$OUT/gpt2-ddp-torch-1gpu.json" > "$OUT/ddp.txt" 2>&1
echo "== PyTorch DDP bf16, 1 GPU (rc $?)"; tail -n 4 "$OUT/ddp.txt"
