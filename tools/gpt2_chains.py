"""The GPT-2 training step's row-reduction chains (`accy.lower.grouping.reduction_chains`),
counted on the plan for a target without running anything: the step program is traced from
`accy.demo.gpt2.training_step` on CPU arrays of the GPU scale (bench.gpt2's `SCALES["cuda"]`)
and planned for the GPU target with chains on and off.

    PYTHONPATH=src python tools/gpt2_chains.py --dtype bf16
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import replace

sys.path.insert(0, ".")

from accy.frontend.tracing import flatten  # noqa: E402
from accy.lower import build_plan  # noqa: E402
from accy.lower.target import GPU  # noqa: E402
from bench.gpt2 import SCALES, accy_inputs, accy_step  # noqa: E402


def step_program(dtype: str, fused: bool, scale_name: str = "cuda"):
    """The jitted step's program, traced (not run) on CPU arrays of a scale (the GPU's)."""
    scale = SCALES[scale_name]
    step = accy_step(scale, "cpu", dtype, fused)
    leaves, treedef = flatten((accy_inputs(scale, "cpu", dtype=dtype), {}))
    return step._build((), leaves, treedef).program


def describe(chain) -> str:
    phases = []
    for phase in chain.members:
        if phase.kind == "loop":
            phases.append(f"loop {phase.op.kind}")
            continue
        ops = "+".join(m.op.attrs["op"] for m in phase.members or (phase,))
        phases.append(ops + (f" ({len(phase.epilogue)} epilogue)" if phase.epilogue else ""))
    return f"{' -> '.join(phases)} over {chain.detail.input}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    parser.add_argument("--attention", default="fused", choices=["fused", "composed"])
    args = parser.parse_args()
    start = time.perf_counter()
    program = step_program(args.dtype, args.attention == "fused")
    print(f"traced {len(program.operations)} operations in {time.perf_counter() - start:.1f} s")
    chained = build_plan(program, GPU)
    apart = build_plan(program, replace(GPU, chains_reductions=False))
    chains = [s for s in chained.steps if s.kind == "chain"]
    print(f"steps: {len(apart.steps)} without chains, {len(chained.steps)} with chains")
    mib = [plan.workspace_bytes / 2**20 for plan in (apart, chained)]
    print(f"workspace: {mib[0]:.1f} MiB without chains, {mib[1]:.1f} MiB with chains")
    phases = sum(len(c.members) for c in chains)
    print(f"chains: {len(chains)} ({phases} phases, {phases - len(chains)} launches fewer)")
    for what, count in Counter(describe(c) for c in chains).most_common():
        print(f"  {count:>3} x {what}")


if __name__ == "__main__":
    main()
