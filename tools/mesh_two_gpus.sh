#!/usr/bin/env bash
# Several GPUs, on a machine with 2 GPUs, from the repo root, after
# tools/gpu_validate.sh's setup (PYTHONPATH=src:/tmp/site exported). Full log: $OUT/mesh-two-gpus.log;
# JSON results: $OUT/mesh-two-gpus/*.json; a short summary on stdout at the end.
#   a. the GPUs and their links (nvidia-smi topo -m)
#   b. tests/mesh/test_nccl.py: every collective (f32, bf16, bool, i32) and DP/FSDP gradients
#      through NCCL on 2 GPUs, against NumPy (NCCL_DEBUG=INFO in the log)
#   c. bench/mesh.py on 2 and 1 GPUs: 256 MB all-reduce bus bandwidth (accy psum vs raw NCCL),
#      data-parallel MLP-block step tokens/s
#   d. bench.gpt2 --gpus 2 and 1 (accy data-parallel GPT-2 small, batch 8 x 1024 per GPU)
#   e. bench/ddp_torch.py (PyTorch DDP, same model and per-GPU batch) on 2 and 1 GPUs
#   f. accy demo --gpus 2 --device cuda and on 1 GPU: held-out accuracy of both
# Steps run in that order of priority; each has a timeout and the whole stays under BUDGET s.
set -uo pipefail
OUT=${OUT:-/tmp/out}
RES="$OUT/mesh-two-gpus"
LOG="$OUT/mesh-two-gpus.log"
mkdir -p "$RES"
: >"$LOG"
export PYTHONPATH=${PYTHONPATH:-src}
export NCCL_NVLS_ENABLE=0 # never NVLink multicast on these machines
BUDGET=${BUDGET:-340}
STATUS=()

step() { # step NAME TIMEOUT COMMAND...: run with a timeout (cut to what the budget leaves)
  local name=$1 limit=$2
  # MESH2_STEPS="a b ...": run only the steps named there
  if [ -n "${MESH2_STEPS:-}" ] && [[ " $MESH2_STEPS " != *" $name "* ]]; then return; fi
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

step topo 20 bash -c 'nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; python3 -c "import cupy, cupy.cuda.nccl as n; print(\"cupy\", cupy.__version__, \"nccl\", n.get_version(), \"build\", n.get_build_version())"; env | grep -E "^(NCCL|CUDA)_" || true'
step nccl_tests 100 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT python3 -m pytest tests/mesh/test_nccl.py -rs -p no:cacheprovider
step mesh_bench_2gpu 70 python3 -m accy.launch --gpus 2 bench/mesh.py --json "$RES/mesh-2gpu.json"
step mesh_bench_1gpu 45 python3 -m accy.launch --gpus 1 bench/mesh.py --json "$RES/mesh-1gpu.json"
GPT2_DTYPE=()
python3 -m bench.gpt2 --help 2>/dev/null | grep -q -- "--dtype" && GPT2_DTYPE=(--dtype bf16)
step gpt2_dp_2gpu 90 python3 -m bench.gpt2 --gpus 2 --steps 8 "${GPT2_DTYPE[@]}" --json "$RES/gpt2-dp-2gpu.json"
step gpt2_dp_1gpu 60 python3 -m bench.gpt2 --gpus 1 --steps 8 "${GPT2_DTYPE[@]}" --json "$RES/gpt2-dp-1gpu.json"
DDP_DTYPE=f32
((${#GPT2_DTYPE[@]})) && DDP_DTYPE=bf16
step ddp_eager_2gpu 60 python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/ddp_torch.py --steps 8 --dtype "$DDP_DTYPE" --json "$RES/ddp-eager-2gpu.json"
step ddp_eager_1gpu 45 python3 -m torch.distributed.run --standalone --nproc-per-node 1 bench/ddp_torch.py --steps 8 --dtype "$DDP_DTYPE" --json "$RES/ddp-eager-1gpu.json"
step demo_2gpu 60 python3 -m accy demo --gpus 2 --device cuda --steps 1000 --out "$RES/demo-2gpu"
step demo_1gpu 45 python3 -m accy demo --device cuda --steps 1000 --out "$RES/demo-1gpu"
step ddp_compiled_2gpu 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/ddp_torch.py --steps 8 --compile --dtype "$DDP_DTYPE" --json "$RES/ddp-compiled-2gpu.json"

{
  echo "== mesh-two-gpus summary (${SECONDS}s; log $LOG) =="
  printf '%s\n' "${STATUS[@]}"
  grep -E "[0-9]+ (passed|failed|skipped)|^SKIPPED|^FAILED" "$LOG" | head -3
  grep -E "^rank [0-9]+: .*(matches|got|Error)" "$LOG" | head -4
  python3 - "$RES" "$LOG" <<'PY'
import json, re, sys
from pathlib import Path
res, log = Path(sys.argv[1]), Path(sys.argv[2]).read_text(errors="replace")
def load(name):
    try:
        return json.loads((res / name).read_text())
    except Exception as error:
        return {"missing": str(error)[:80]}
m2, m1 = load("mesh-2gpu.json"), load("mesh-1gpu.json")
ar = m2.get("all_reduce", {})
if "bytes" in ar:
    for k in ("accy_psum_back_to_back", "nccl_allreduce_back_to_back", "accy_psum_synchronized", "nccl_allreduce_synchronized"):
        v = ar.get(k, {})
        print(f"all-reduce {ar['bytes']/2**20:.0f} MiB {k}: busbw {v.get('busbw_GBps', 0):.1f} GB/s ({v.get('seconds', 0)*1e3:.3f} ms)")
    print(f"all-reduce correct: {ar.get('correct')}; accy/raw NCCL busbw (back to back): {ar['accy_psum_back_to_back']['busbw_GBps']/ar['nccl_allreduce_back_to_back']['busbw_GBps']:.3f}")
else:
    print("all-reduce:", ar or m2)
dp2, dp1 = m2.get("data_parallel", {}), m1.get("data_parallel", {})
if "tokens_per_second" in dp2 and "tokens_per_second" in dp1:
    print(f"MLP block DP: 1 GPU {dp1['tokens_per_second']:,.0f} tok/s, 2 GPUs {dp2['tokens_per_second']:,.0f} tok/s, scaling {dp2['tokens_per_second']/dp1['tokens_per_second']:.2f}x (segments {dp2.get('segments')}, psums {dp2.get('psums')})")
else:
    print("MLP block DP:", dp1, dp2)
g2, g1 = load("gpt2-dp-2gpu.json"), load("gpt2-dp-1gpu.json")
d2, d1 = load("ddp-eager-2gpu.json"), load("ddp-eager-1gpu.json")
dc = load("ddp-compiled-2gpu.json")
for name, r in (("accy gpt2 DP 1 GPU", g1), ("accy gpt2 DP 2 GPUs", g2), ("torch DDP eager 1", d1), ("torch DDP eager 2", d2), ("torch DDP compiled 2", dc)):
    if "tokens_per_s" in r:
        print(f"{name}: {r['tokens_per_s']:,.0f} tok/s, step {r['step_ms']:.1f} ms, first step {r['first_step_s']:.1f} s, dtype {r.get('dtype')}, loss {r['loss_first']:.3f}->{r['loss_last']:.3f}")
    else:
        print(f"{name}: {r}")
if "tokens_per_s" in g1 and "tokens_per_s" in g2:
    print(f"accy gpt2 scaling 2/1 GPUs: {g2['tokens_per_s']/g1['tokens_per_s']:.2f}x (bar 1.9x)")
for name, r in (("eager", d2), ("compiled", dc)):
    if "tokens_per_s" in g2 and "tokens_per_s" in r:
        print(f"accy / torch DDP {name} on 2 GPUs: {g2['tokens_per_s']/r['tokens_per_s']:.2f}")
sections = {part.split(" ", 1)[0]: part for part in log.split("\n=== ")}
for d in ("demo_2gpu", "demo_1gpu"):
    hits = re.findall(r"held-out accuracy: ([0-9.]+)% of sorted digits, ([0-9.]+)% of whole", sections.get(d, ""))
    losses = re.findall(r"final training loss ([0-9.]+)", sections.get(d, ""))
    print(f"{d}: " + (f"held-out {hits[0][0]}% of digits, {hits[0][1]}% of sequences; final loss {losses[0] if losses else '?'}" if hits else "no accuracy line"))
PY
} 2>&1 | tee -a "$LOG" | head -45
