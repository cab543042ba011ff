"""Where does the GPT-2 step's cold start go? Builds the training step of `bench.gpt2` (the
GPU scale by default: GPT-2 small, 8 x 1024, bf16 policy) and times each phase from the
Python function to the end of the first step, each phase's own time (a phase inside another
is not counted twice):

- trace: running the Python function on traced values (`accy.frontend.tracing.trace`);
- differentiate: `value_and_grad`'s Program transform (`accy.gradient.value_and_grad`);
- simplify: `accy.transforms.simplify` of the traced and differentiated programs;
- digest: the program's content hash (the executable cache's key);
- plan, emit kernels, units: `accy.lower.plan.build_plan`, the CUDA C of every step, cutting
  it into translation units; compile (other): the schedule and what else `compile_program`
  does;
- on a GPU only: nvrtc + module load (`runtime.load_kernels`; accy's disk cache may hold the
  binaries: see `--cold`), fragment load (workspace, libraries), graph capture, and the first
  run (the rest of the first call, up to the loss on the host).

Imports that load new modules and Python's cyclic garbage collections are charged to phases of
their own wherever they happen ("imports", "garbage collection", "full garbage collection"); on a
GPU, building cuDNN's attention graphs too ("cudnn graphs"). Attention is cuDNN's fused kernels
(`nn.attention`), as `python -m bench.gpt2` runs the step (`--attention composition` writes the
scores out instead; without a GPU cuDNN declines and the composition is compiled).

Then the size of the generated source: kernels, bytes, translation units.

    PYTHONPATH=src python3 tools/cold_start.py                  # no GPU: up to the CUDA C
    PYTHONPATH=src python3 tools/cold_start.py --gpu --cold     # a GPU, empty caches
    PYTHONPATH=src python3 tools/cold_start.py --scale check --json out.json

`--cold` points `$CUPY_CACHE_DIR` and `$ACCY_CACHE_DIR` at fresh folders before CuPy is
imported, so NVRTC compiles everything; `--cache-dir DIR` keeps them under DIR (cold the first
time, warm the next); with neither the caches already there are used.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, ".")
from bench.cold_phases import Phases, instrument, summary  # noqa: E402


def fake_inputs(scale, dtype: str):
    """The step's arguments as host NamedArrays of the right types that hold no memory (only
    their types matter to tracing)."""
    import numpy as np

    from accy.core.types import TensorType, f32, i32
    from accy.demo.gpt2 import decayed, parameter_shapes
    from accy.frontend.named import NamedArray, intern
    from accy.optim import OptState

    def fake(axes, dtype=f32):
        array = np.broadcast_to(np.zeros((), dtype.numpy), tuple(n for _, n in axes))
        return NamedArray(array, intern(TensorType(dtype, tuple(axes))), "cpu")

    groups: dict[str, dict] = {"decay": {}, "plain": {}}
    for name, axes in parameter_shapes(scale).items():
        groups["decay" if decayed(name, axes) else "plain"][name] = fake(axes)
    state = {g: OptState(fake(()), (dict(v), dict(v))) for g, v in groups.items()}
    ids = fake((("batch", scale.batch), ("token", scale.tokens)), i32)
    return groups, state, ids, ids


def build_without_gpu(scale, dtype: str, phases: Phases, fused: bool = True):
    """Trace, differentiate, simplify and compile the step for CUDA (no GPU needed); the
    compiled fragment."""
    from accy.backends.base import compile_artifact
    from accy.backends.cuda import executable
    from accy.demo.gpt2 import training_step
    from accy.frontend import tracing
    from accy.frontend.tracing import Staged, flatten

    # (an older checkout, measured for comparison, collects garbage throughout)
    without_collection = getattr(tracing, "without_collection", contextlib.nullcontext)

    step = training_step(scale, "cuda", dtype, fused)
    leaves, treedef = flatten((fake_inputs(scale, dtype), {}))
    # As the first call does: `Staged.entry` builds the program, `Staged.run_concrete`
    # compiles it (the executable cache keyed by its digest), both without cyclic collection.
    staged = Staged(functools.partial(step._build, ()), "cuda")
    with phases.measuring("first call (other)"):
        entry = staged.entry(leaves, treedef, ("signature",))
        with without_collection():
            entry.program.digest  # noqa: B018
            compiled = compile_artifact(executable.CudaBackend(), entry.program, None)
    return compiled


def run_on_gpu(scale, dtype: str, phases: Phases, extra: dict, fused: bool = True):
    """The first call of the step on the GPU (as bench.gpt2 makes it, its inputs made first,
    outside the phases: `inputs_s`); its compiled fragment."""
    import numpy as np

    from bench.gpt2 import accy_inputs, accy_step

    start = time.perf_counter()
    inputs = accy_inputs(scale, "cuda", dtype=dtype)
    step = accy_step(scale, "cuda", dtype, fused)
    extra["inputs_s"] = round(time.perf_counter() - start, 4)
    phases.seconds.clear()  # whatever making the inputs compiled is not the first call's
    phases.calls.clear()
    # Other Python threads alive now would share the GIL with the first call.
    extra["threads"] = sorted(thread.name for thread in threading.enumerate())
    with phases.measuring("first call (other)"):
        loss, _, _ = step(*inputs)
        first = float(np.asarray(loss.array.get()))
    (staged,) = step._staged.values()
    (entry,) = staged.cache.values()
    (executable,) = entry.compiled.values()
    extra["first_loss"] = first
    return getattr(executable, "compiled", None)


def report(phases: Phases, compiled, wall: float, extra: dict) -> dict:
    result: dict[str, Any] = {
        "phases_s": summary(phases),
        "total_s": round(wall, 4),
        **extra,
    }
    if compiled is not None:
        result |= {
            "kernels": len(compiled.kernels),
            "source_bytes": len(compiled.source),
            "units": len(getattr(compiled, "units", ())),
            "largest_unit_bytes": max(
                (len(u.source) for u in getattr(compiled, "units", ())),
                default=len(compiled.source),
            ),
            "operations": len(compiled.program.operations),
            "actions": len(compiled.schedule.actions),
            "pool_entries": len(compiled.schedule.pool),
            "launches_by_kind": launches_by_kind(compiled),
        }
    return result


def launches_by_kind(compiled) -> dict[str, int]:
    """Kernel launches of one step per kind of plan step (from the kernels' comments: "step
    12: reduce (combine)" counts as "reduce (combine)"), most first; GEMMs as "gemm"."""
    from collections import Counter

    from accy.backends.cuda.schedule import Gemm, Launch

    counts: Counter[str] = Counter()
    for action in compiled.schedule.actions:
        if isinstance(action, Launch):
            comment = compiled.kernel_comments.get(action.kernel, "")
            counts[comment.split(": ", 1)[-1] or "kernel"] += 1
        elif isinstance(action, Gemm):
            counts["gemm"] += 1
    return dict(counts.most_common())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cuda", help="a scale of bench.gpt2 (cuda, cpu, check)")
    parser.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    parser.add_argument("--gpu", action="store_true", help="load and run the step on a GPU")
    parser.add_argument(
        "--attention",
        default="fused",
        choices=("fused", "composition"),
        help="nn.attention's kernels (as bench.gpt2 runs it) or the composition",
    )
    parser.add_argument("--cold", action="store_true", help="empty NVRTC and accy disk caches")
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="keep both disk caches under this folder (run twice: cold, then warm)",
    )
    parser.add_argument("--json", default=None, help="write the breakdown here too")
    args = parser.parse_args(argv)
    if args.cold or args.cache_dir:  # before CuPy or accy read them
        folder = args.cache_dir or tempfile.mkdtemp(prefix="accy-cold-")
        os.environ["CUPY_CACHE_DIR"] = os.path.join(folder, "cupy")
        os.environ["ACCY_CACHE_DIR"] = os.path.join(folder, "accy")
        args.cold = not os.path.isdir(os.environ["CUPY_CACHE_DIR"])
    started = time.perf_counter()
    from bench.gpt2 import SCALES

    imported = time.perf_counter() - started
    scale = SCALES[args.scale]
    phases = Phases()
    instrument(phases, args.gpu)
    fused = args.attention == "fused"
    extra: dict[str, Any] = {"scale": args.scale, "dtype": args.dtype, "gpu": args.gpu}
    extra["attention"] = args.attention
    extra |= {"cold_caches": args.cold, "import_s": round(imported, 4)}
    if args.gpu:
        compiled = run_on_gpu(scale, args.dtype, phases, extra, fused)
    else:
        compiled = build_without_gpu(scale, args.dtype, phases, fused)
    result = report(phases, compiled, sum(phases.seconds.values()), extra)
    print(f"cold start of the gpt2 step ({args.scale} scale, {args.dtype}, {args.attention} "
          f"attention, gpu={args.gpu}, "
          f"cold caches={args.cold}): first call {result['total_s']:.2f} s (imports "
          f"{imported:.2f} s, inputs {extra.get('inputs_s', 0):.2f} s before it)")  # fmt: skip
    if "threads" in extra:
        print(f"  threads at the first call: {', '.join(extra['threads'])}")
    for phase, seconds in result["phases_s"].items():
        print(f"  {phase:24s} {seconds:8.3f} s  ({phases.calls[phase]} calls)")
    if compiled is not None:
        print(
            f"  generated: {result['kernels']} kernels, {result['source_bytes']:,} bytes of CUDA C "
            f"in {result['units']} units (largest {result['largest_unit_bytes']:,}); "
            f"{result['operations']} operations, {result['actions']} actions, "
            f"{result['pool_entries']} pool entries"
        )
        kinds = ", ".join(f"{k} {n}" for k, n in result["launches_by_kind"].items())
        print(f"  launches a step: {kinds}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
