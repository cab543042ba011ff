#!/usr/bin/env bash
# One GPU call: this tree against an older one (OLD, a checkout; default .old): the CUDA tests
# of the vector loops (this tree; or TESTS, test files), the GPT-2 bf16 step's profile by action
# in each tree (tools/gpt2_profile.py, compared by tools/gpu_actions_diff.py), the host part of each
# tree's step (tools/gpu_step_host.py), while CALL_SECONDS (default 150) last. Wheels in .whl
# are installed first; logs go to $OUT. A short summary last.
set -uo pipefail
source tools/gpu_env.sh
export JAX_PLATFORMS=cpu
OLD="${OLD:-.old}"
left() { echo $((${CALL_SECONDS:-150} - (SECONDS - T0))); }
TESTS="${TESTS:-tests/backends/test_cuda_vectors.py tests/backends/test_piecewise_concatenate.py \
  tests/backends/test_cuda_half_intermediates.py tests/backends/test_cuda_batching.py \
  tests/backends/test_cuda_donation.py}"
# shellcheck disable=SC2086
ACCY_CACHE_DIR=/tmp/cache-tests timeout "${TEST_SECONDS:-45}" python3 -m pytest -p no:cacheprovider \
  -p no:benchmark -n 15 -rfE $TESTS > "$OUT/tests.txt" 2>&1
echo "== tests rc $? ($((SECONDS - T0)) s)"
for tree in new old; do
  dir=.; [ "$tree" = old ] && dir="$OLD"
  t=$(left); [ "$t" -gt 45 ] && t=45
  [ "$t" -lt 15 ] && break
  (cd "$dir" && ACCY_CACHE_DIR=/tmp/cache-$tree timeout "$t" python3 tools/gpt2_profile.py \
    --dtype bf16 --attention fused --top 12 --dump "/tmp/profile-$tree") > "$OUT/profile-$tree.txt" 2>&1
  echo "== profile $tree rc $? ($((SECONDS - T0)) s)"
  cp "/tmp/profile-$tree/actions.tsv" "$OUT/actions-$tree.tsv" 2>/dev/null
done
for tree in new old; do
  dir=.; [ "$tree" = old ] && dir="$OLD"
  t=$(left); [ "$t" -gt 25 ] && t=25
  [ "$t" -lt 10 ] && break
  (cd "$dir" && ACCY_CACHE_DIR=/tmp/cache-$tree timeout "$t" python3 tools/gpu_step_host.py \
    --profile 0) > "$OUT/host-$tree.txt" 2>&1
  echo "== host $tree rc $? ($((SECONDS - T0)) s)"
done
echo "-- tests"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.txt" | tail -12
for tree in new old; do echo "-- $tree"; grep -E "whole step|^  (gemm|kernel|library)" "$OUT/profile-$tree.txt"; grep "^gpt2" "$OUT/host-$tree.txt" 2>/dev/null; done
[ -f "$OUT/actions-old.tsv" ] && [ -f "$OUT/actions-new.tsv" ] && \
  python3 tools/gpu_actions_diff.py "$OUT/actions-old.tsv" "$OUT/actions-new.tsv" --top 16
