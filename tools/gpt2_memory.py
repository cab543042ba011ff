"""What holds device memory in a training step? Plans `bench.gpt2`'s step (or, with `--workload
llama1b`, `bench.llama1b`'s, traced from the model's types alone) for CUDA (no GPU needed: the
plan and the schedule are made on the host) and reports, in MiB:

- the arguments (parameters, AdamW state, ids, targets) and the outputs the step cannot write
  into a donated argument (`accy.lower.buffers.donation_aliases`, as `donate_argnums=(0, 1)`);
- the fragment's memory: the plan's workspace (intermediates and the steps' scratch, a scan
  body's workspace among them), the large constants, the fragment's own scratch (cuDNN's,
  only where cuDNN is: else the plan alone is made, and these read -1);
- the peak of the workspace's live bytes over the steps (values only, no scratch), the step
  where it is reached, and the largest buffers alive there: what wrote each (step number and
  kind) and which step reads it last;
- for each scan (a stack of layers, forward and backward), what one of its steps runs: its
  steps, the generated kernels among them (not cuBLAS or cuDNN) and the bytes they move.

    PYTHONPATH=src python3 tools/gpt2_memory.py                     # GPT-2 small, bf16
    PYTHONPATH=src python3 tools/gpt2_memory.py --dtype f32 --attention composition
    PYTHONPATH=src python3 tools/gpt2_memory.py --scale check --json out.json
    PYTHONPATH=src:. python3 tools/gpt2_memory.py --workload llama1b   # the 1B Llama, bf16

On the GPU the device memory of one step is about arguments + outputs not donated + fragment
(+ cuBLAS's workspace and CuPy's pool rounding). `--gpu donate` or `--gpu plain` measures it:
it runs the workload's step a few times with parameters and state donated (as the bench does)
or not, and reports CuPy's pool afterwards (its total: every block it ever held; the bytes in
use) and the most bytes it handed out at once.

    PYTHONPATH=src python3 tools/gpt2_memory.py --gpu donate --steps 3
    PYTHONPATH=src:. python3 tools/gpt2_memory.py --workload llama1b --gpu donate --steps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

sys.path.insert(0, ".")

MIB = 2**20


def step_program(scale_name: str, dtype: str, fused: bool):
    """The training step's program (traced, differentiated, simplified) and its donated inputs."""
    from accy.demo.gpt2 import training_step
    from accy.frontend.tracing import Staged, flatten
    from bench.gpt2 import SCALES
    from tools.cold_start import fake_inputs

    scale = SCALES[scale_name]
    step = training_step(scale, "cuda", dtype, fused)
    leaves, treedef = flatten((fake_inputs(scale, dtype), {}))
    staged = Staged(lambda leaves, treedef: step._build((), leaves, treedef), "cuda")
    entry = staged.entry(leaves, treedef, ("signature",))
    return entry.program, entry.donate


def llama1b_program(scale_name: str, dtype: str):
    """`bench.llama1b`'s training step program and its donated inputs, traced from the model's
    and the AdamW state's types alone (no weights in memory)."""
    import accy
    from accy.core.types import i32
    from accy.frontend.lowered import abstract_inputs
    from accy.frontend.tracing import Staged, flatten
    from bench.llama1b import SCALES, abstract_model, accy_training_step

    scale = SCALES[scale_name]
    model = abstract_model(scale)
    step, optimizer = accy_training_step(model, "cuda", dtype)
    state = accy.eval_shape(optimizer.init, flatten(model)[0])
    ids = accy.spec(i32, batch=scale.batch, token=scale.tokens)
    leaves, treedef = flatten(((model, *abstract_inputs((state, ids, ids))), {}))
    staged = Staged(lambda leaves, treedef: step._build((), leaves, treedef), "cuda")
    entry = staged.entry(leaves, treedef, ("signature",))
    return entry.program, entry.donate


def live_bytes(plan: Any) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Bytes of the workspace in use at each step (buffers sharing memory counted once), and
    each workspace buffer's (first, last) step."""
    spans: dict[int, tuple[int, int]] = {}
    for index, step in enumerate(plan.steps):
        for value in (*step.writes, *step.reads):
            slot = plan.slots.get(value)
            if slot is None or slot.storage != "workspace":
                continue
            first, _ = spans.get(value, (index, index))
            spans[value] = (first, index)
    # (offset, bytes) -> the spans of the values placed there. Spans that overlap or touch are
    # one buffer written in place of another (the result's first step is the source's last),
    # counted once; disjoint ones are buffers that reused the memory later, counted each in its
    # own span (not as one buffer alive from the first one's start to the last one's end).
    placed: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for value, span in spans.items():
        slot = plan.slots[value]
        placed.setdefault((slot.index, slot.type.nbytes), []).append(span)
    live = [0] * len(plan.steps)
    for (_, nbytes), intervals in placed.items():
        for first, last in _merged(intervals):
            for index in range(first, last + 1):
                live[index] += nbytes
    return live, spans


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive step intervals with those that overlap or touch joined."""
    joined: list[tuple[int, int]] = []
    for first, last in sorted(intervals):
        if joined and first <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(joined[-1][1], last))
        else:
            joined.append((first, last))
    return joined


def describe(plan: Any, value: int) -> str:
    op = plan.producers.get(value)
    return "input" if op is None else op.kind


LIBRARY_STEPS = ("dot", "custom_call")
"""Steps a library runs (cuBLAS, cuDNN); the others are generated kernels."""


def generated_bytes(plan: Any) -> int:
    """Bytes the generated kernels of one call of `plan` read and write (each stored value once
    a step), a scan's body counted once per step of the scan."""
    moved = 0
    for step in plan.steps:
        if step.kind == "scan":
            moved += step.op.attrs["length"] * generated_bytes(step.body)
        elif step.kind not in LIBRARY_STEPS:
            values = set(step.reads) | set(step.writes)
            moved += sum(plan.program.type_of(v).nbytes for v in values)
    return moved


def scan_body(body: Any) -> dict:
    """What one step of a scan (a layer) runs: its steps (each a launch before batching), the
    generated ones among them, and the bytes those move (`generated_bytes`)."""
    return {
        "steps": len(body.steps),
        "generated_steps": sum(step.kind not in LIBRARY_STEPS for step in body.steps),
        "generated_MiB_moved": round(generated_bytes(body) / MIB, 1),
    }


def report(program, donated, plan, scratch_bytes: int, constant_bytes: int, top: int) -> dict:
    from accy.lower.buffers import donation_aliases

    aliases = donation_aliases(plan, donated)
    inputs = program.parameter_types
    outputs = program.output_types
    live, spans = live_bytes(plan)
    peak_step = max(range(len(live)), key=live.__getitem__) if live else 0
    alive = sorted(
        (v for v, (a, b) in spans.items() if a <= peak_step <= b),
        key=lambda v: -plan.slots[v].type.nbytes,
    )
    writer = {}
    for index, step in enumerate(plan.steps):
        for value in step.writes:
            writer.setdefault(value, index)
    largest = [
        {
            "MiB": round(plan.slots[v].type.nbytes / MIB, 1),
            "type": str(plan.slots[v].type),
            "written": f"step {writer.get(v)} ({plan.steps[writer[v]].kind})"
            if v in writer
            else "",
            "producer": describe(plan, v),
            "last read": spans[v][1],
        }
        for v in alive[:top]
    ]
    donated_bytes = sum(inputs[i].nbytes for i in donated)
    return {
        "steps": len(plan.steps),
        "arguments_MiB": round(sum(t.nbytes for t in inputs) / MIB, 1),
        "donated_MiB": round(donated_bytes / MIB, 1),
        "outputs_into_donated": f"{len(aliases)} of {len(outputs)}",
        "donated_not_taken": [i for i in donated if i not in aliases.values()],
        "outputs_not_donated_MiB": round(
            sum(t.nbytes for k, t in enumerate(outputs) if k not in aliases) / MIB, 1
        ),
        "outputs_without_donation_MiB": round(sum(t.nbytes for t in outputs) / MIB, 1),
        "workspace_MiB": round(plan.workspace_bytes / MIB, 1),
        "constants_MiB": round(constant_bytes / MIB, 1),
        "scratch_MiB": round(scratch_bytes / MIB, 1),
        "peak_live_MiB": round(max(live, default=0) / MIB, 1),
        "peak_step": f"{peak_step} of {len(plan.steps)} ({plan.steps[peak_step].kind})",
        "largest_alive_at_peak": largest,
        "live_MiB_every_10th_step": [round(b / MIB) for b in live[::10]],
        "generated_MiB_moved": round(generated_bytes(plan) / MIB),
        "scan_bodies": [scan_body(step.body) for step in plan.steps if step.kind == "scan"],
    }


def gpu_step(workload: str, scale_name: str, dtype: str, fused: bool):
    """(the workload's jitted step, its parameters, its state, ids, targets) on the GPU."""
    import accy

    if workload == "llama1b":
        from bench import llama1b

        scale = llama1b.SCALES[scale_name]
        step, params, state = llama1b.accy_step(scale, "cuda", dtype)
        ids, targets = (
            accy.named(a, ("batch", "token"), device="cuda") for a in llama1b.batch(scale)
        )
        return step, params, state, ids, targets
    from bench.gpt2 import SCALES, accy_inputs, accy_step

    scale = SCALES[scale_name]
    params, state, ids, targets = accy_inputs(scale, "cuda", dtype=dtype)
    return accy_step(scale, "cuda", dtype, fused), params, state, ids, targets


def measure_on_gpu(
    workload: str, scale_name: str, dtype: str, fused: bool, donate: bool, steps: int
) -> dict:
    """Run the step `steps` times on the GPU; CuPy's pool after (bytes held, bytes in use)
    and the most bytes it handed out at once (a memory hook installed before the inputs are
    made: what PyTorch's `max_memory_allocated` counts)."""
    import cupy
    import numpy as np

    from accy import jit
    from bench.systems.cupy_memory import CupyPoolPeak

    tracker = CupyPoolPeak()
    step, params, state, ids, targets = gpu_step(workload, scale_name, dtype, fused)
    if not donate:
        step = jit(step.fn)  # the same step, nothing donated
    pool = cupy.get_default_memory_pool()
    losses = []
    for _ in range(steps):
        loss, params, state = step(params, state, ids, targets)
        losses.append(float(np.asarray(loss.array.get())))
    cupy.cuda.get_current_stream().synchronize()
    return {
        "workload": workload,
        "donated": donate,
        "steps": steps,
        "losses": [round(x, 4) for x in losses],
        "pool_total_MiB": round(pool.total_bytes() / MIB, 1),
        "pool_used_MiB": round(pool.used_bytes() / MIB, 1),
        "peak_allocated_MiB": round(tracker.peak_bytes() / MIB, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt2", choices=("gpt2", "llama1b"))
    parser.add_argument(
        "--scale", default="cuda", help="a scale of the workload's bench (cuda, cpu, check)"
    )
    parser.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    parser.add_argument("--attention", default="fused", choices=("fused", "composition"))
    parser.add_argument("--top", type=int, default=12, help="buffers listed at the peak")
    parser.add_argument("--json", default=None, help="write the report here too")
    parser.add_argument("--gpu", default=None, choices=("donate", "plain"), help="measure on a GPU")
    parser.add_argument("--steps", type=int, default=3, help="steps run with --gpu")
    args = parser.parse_args(argv)
    if args.gpu:
        fused = args.attention == "fused"
        donate = args.gpu == "donate"
        result = measure_on_gpu(args.workload, args.scale, args.dtype, fused, donate, args.steps)
        print(json.dumps(result))
        return 0
    from accy.backends.cuda import cudnn_conv
    from accy.backends.cuda.compile import compile_program
    from accy.errors import AccyError
    from accy.lower.plan import build_plan
    from accy.lower.target import GPU

    start = time.perf_counter()
    if args.workload == "llama1b":
        program, donated = llama1b_program(args.scale, args.dtype)
    else:
        program, donated = step_program(args.scale, args.dtype, args.attention == "fused")
    traced = time.perf_counter()
    try:
        compiled = compile_program(program)
        plan = compiled.plan
        constant_bytes = sum(data.nbytes for _, data in compiled.constants)
        scratch = compiled.workspace_bytes - compiled.scratch_offset
    except AccyError as error:  # cuDNN's attention kernels are linked only where cuDNN is
        print(f"(planned only: {str(error)[:100]}...)", file=sys.stderr)
        plan = build_plan(program, dataclasses.replace(GPU, keep=cudnn_conv.layout_for))
        constant_bytes = scratch = -MIB
    done = time.perf_counter()
    result = {
        "workload": args.workload,
        "scale": args.scale,
        "dtype": args.dtype,
        "attention": args.attention,
        "build_s": round(traced - start, 2),
        "compile_s": round(done - traced, 2),
        **report(program, donated, plan, scratch, constant_bytes, args.top),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
