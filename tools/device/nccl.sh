#!/usr/bin/env bash
# Collectives inside the step's CUDA graph, and overlap (issue 21, session 4), on a machine with
# 2 GPUs, from the repo root, after tools/gpu_validate.sh's setup (PYTHONPATH=src:/tmp/site
# exported). Full log: $OUT/nccl.log; results: $OUT/nccl.json; a short summary on stdout.
#   a. the GPUs, their links, CuPy and NCCL versions
#   b. tests/mesh/test_nccl.py on 2 GPUs: every collective (f32, bf16, bool, i32) and DP/FSDP
#      gradients against NumPy, run 4 ways: one CUDA graph per program with NCCL steps inside
#      (25 MiB buckets; 4 KiB buckets, several per step; no buckets) and the segmented fallback
#   c. bench/mesh.py on 2 GPUs: 256 MB all-reduce busbw (accy psum vs raw NCCL), the MLP-block
#      data-parallel step in each mode (graph, graph-4mib, graph-nobuckets, segments)
#   d. bench.gpt2 --gpus 2 --dtype bf16: one graph per step (default)
#   e. bench/mesh.py on 1 GPU (graph, segments): the scaling baseline
#   f. bench.gpt2 --gpus 1 --dtype bf16: the scaling baseline
#   g. bench.gpt2 --gpus 2 --dtype bf16 with ACCY_NCCL_GRAPH=0: the old path (segments)
# Steps run in that order of priority; each has a timeout and the whole stays under BUDGET s.
set -uo pipefail
OUT=${OUT:-/tmp/out}
LOG="$OUT/nccl.log"
RES=$(mktemp -d /tmp/nccl-results.XXXXXX) # per-step JSON; only $OUT/nccl.json comes back
mkdir -p "$OUT"
: >"$LOG"
export PYTHONPATH=${PYTHONPATH:-src}
export NCCL_NVLS_ENABLE=0 # never NVLink multicast on these machines
BUDGET=${BUDGET:-210}
STATUS=()

step() { # step NAME TIMEOUT COMMAND...: run with a timeout (cut to what the budget leaves)
  local name=$1 limit=$2
  if [ -n "${NCCL_STEPS:-}" ] && [[ " $NCCL_STEPS " != *" $name "* ]]; then return; fi
  shift 2
  local left=$((BUDGET - SECONDS))
  if ((left < 15)); then
    STATUS+=("$name: skipped (budget spent)")
    echo "=== $name: skipped, ${SECONDS}s used of ${BUDGET}s" >>"$LOG"
    return
  fi
  ((limit > left)) && limit=$left
  echo "=== $name (timeout ${limit}s) at ${SECONDS}s: $*" >>"$LOG"
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local took=$((SECONDS - start))
  local verdict=ok
  ((rc == 124 || rc == 137)) && verdict="TIMEOUT"
  ((rc != 0 && rc != 124 && rc != 137)) && verdict="FAILED rc=$rc"
  STATUS+=("$name: $verdict (${took}s)")
  echo "=== $name: $verdict after ${took}s" >>"$LOG"
}

MODES=graph,graph-4mib,graph-nobuckets,segments
step topo 15 bash -c 'nvidia-smi -L; nvidia-smi topo -m; python3 -c "import cupy, cupy.cuda.nccl as n; print(\"cupy\", cupy.__version__, \"nccl\", n.get_version())"'
step nccl_tests 70 env NCCL_DEBUG=WARN python3 -m pytest tests/mesh/test_nccl.py -rs -s -p no:cacheprovider
step mesh_2gpu 55 python3 -m accy.launch --gpus 2 bench/mesh.py --repeat 10 --modes "$MODES" --json "$RES/mesh-2gpu.json"
step gpt2_2gpu_graph 60 python3 -m bench.gpt2 --gpus 2 --steps 8 --dtype bf16 --json "$RES/gpt2-2gpu-graph.json"
step mesh_1gpu 35 python3 -m accy.launch --gpus 1 bench/mesh.py --repeat 10 --modes graph,segments --json "$RES/mesh-1gpu.json"
step gpt2_1gpu 45 python3 -m bench.gpt2 --gpus 1 --steps 8 --dtype bf16 --json "$RES/gpt2-1gpu.json"
step gpt2_2gpu_segments 50 env ACCY_NCCL_GRAPH=0 python3 -m bench.gpt2 --gpus 2 --steps 8 --dtype bf16 --json "$RES/gpt2-2gpu-segments.json"

{
  echo "== nccl summary (${SECONDS}s; log $LOG) =="
  printf '%s\n' "${STATUS[@]}"
  grep -E "[0-9]+ (passed|failed|skipped)|^SKIPPED|^FAILED" "$LOG" | head -3
  grep -E "^rank [0-9]+: .*(matches|got|Error|ran as segments)|graph=.*bucket_bytes=" "$LOG" | head -6
  python3 - "$RES" "$OUT/nccl.json" <<'PY'
import json, sys
from pathlib import Path
res, out = Path(sys.argv[1]), Path(sys.argv[2])
def load(name):
    try:
        return json.loads((res / name).read_text())
    except Exception as error:
        return {"missing": str(error)[:80]}
every = {n: load(n) for n in ("mesh-2gpu.json", "mesh-1gpu.json", "gpt2-2gpu-graph.json", "gpt2-1gpu.json", "gpt2-2gpu-segments.json")}
out.write_text(json.dumps(every, indent=2))
m2, m1 = every["mesh-2gpu.json"], every["mesh-1gpu.json"]
ar = m2.get("all_reduce", {})
if "bytes" in ar:
    for k in ("accy_psum_back_to_back", "nccl_allreduce_back_to_back"):
        v = ar.get(k, {})
        print(f"all-reduce {ar['bytes']/2**20:.0f} MiB {k}: busbw {v.get('busbw_GBps', 0):.1f} GB/s ({v.get('seconds', 0)*1e3:.3f} ms)")
else:
    print("all-reduce:", str(ar or m2)[:150])
modes2, modes1 = m2.get("data_parallel_modes", {}), m1.get("data_parallel_modes", {})
for mode in ("graph", "graph-4mib", "graph-nobuckets", "segments"):
    a, b = modes2.get(mode, {}), modes1.get(mode, {})
    if "tokens_per_second" in a:
        scale = f", 1 GPU {b['tokens_per_second']:,.0f}, scaling {a['tokens_per_second']/b['tokens_per_second']:.2f}x" if "tokens_per_second" in b else ""
        print(f"MLP DP {mode:15s}: 2 GPUs {a['tokens_per_second']:,.0f} tok/s ({a['step_seconds']*1e3:.2f} ms, {a['mode']}, buckets {a['buckets']}){scale}")
    else:
        print(f"MLP DP {mode}: {str(a)[:150]}")
g2, g1, gs = every["gpt2-2gpu-graph.json"], every["gpt2-1gpu.json"], every["gpt2-2gpu-segments.json"]
for name, r in (("gpt2 bf16 1 GPU", g1), ("gpt2 bf16 2 GPUs graph", g2), ("gpt2 bf16 2 GPUs segments", gs)):
    if "tokens_per_s" in r:
        buckets = r.get("buckets") or []
        print(f"{name}: {r['tokens_per_s']:,.0f} tok/s, step {r['step_ms']:.1f} ms, first {r['first_step_s']:.1f} s, mode {r.get('mode')} ({len(buckets)} buckets, {sum(buckets)/2**20:.0f} MiB), loss {r['loss_first']:.3f}->{r['loss_last']:.3f}")
        if r.get("mode_reason"):
            print(f"  {name} ran segments because: {r['mode_reason']}")
    else:
        print(f"{name}: {str(r)[:150]}")
for name, r in (("graph", g2), ("segments", gs)):
    if "tokens_per_s" in r and "tokens_per_s" in g1:
        print(f"gpt2 scaling 2/1 GPUs ({name}): {r['tokens_per_s']/g1['tokens_per_s']:.2f}x (bar 1.9x)")
PY
} 2>&1 | tee -a "$LOG" | head -40
rm -rf "$RES"
