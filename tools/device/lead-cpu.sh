#!/usr/bin/env bash
# On the GPU machine's CPU, pinned to two cores (the CI machine's count) so that timings are
# quiet: accy's bench steps at the old tree (.old) against this one, and the fused CPU attention
# against the composition and JAX/PyTorch at several token counts (the crossover).
set -uo pipefail
OUT="${OUT:-/tmp}"
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2 PYTHONUNBUFFERED=1
PIN="taskset -c 0,1"
$PIN timeout 300 python3 tools/compare_commits.py .old . --device cpu --rounds "${ROUNDS:-2}" \
  --workloads "${WORKLOADS:-tiny,mlp,attention,embedding,elementwise,block}" > "$OUT/cpu-compare.txt" 2>&1
for tokens in ${TOKENS-256 512 1024 2048}; do
  $PIN timeout 100 python3 -m bench.flash_attention --tokens "$tokens" --seconds 1 \
    --systems accy,accy-composition,jax,torch > "$OUT/flash-$tokens.txt" 2>&1
done
echo "== cpu compare (2 cores)"; cat "$OUT/cpu-compare.txt"
for tokens in ${TOKENS-256 512 1024 2048}; do echo "== flash $tokens"; tail -6 "$OUT/flash-$tokens.txt"; done
