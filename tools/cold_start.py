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
- on a GPU only: nvrtc + module load (`runtime.load_kernels`; CuPy's disk cache may hold the
  binaries: see `--cold`), fragment load (workspace, libraries), graph capture, and the first
  run (the rest of the first call, up to the loss on the host).

Then the size of the generated source: kernels, bytes, translation units.

    PYTHONPATH=src python3 tools/cold_start.py                  # no GPU: up to the CUDA C
    PYTHONPATH=src python3 tools/cold_start.py --gpu --cold     # a GPU, empty caches
    PYTHONPATH=src python3 tools/cold_start.py --scale check --json out.json

`--cold` points `$CUPY_CACHE_DIR` and `$ACCY_CACHE_DIR` at fresh folders before CuPy is
imported, so NVRTC compiles everything; without it the caches already there are used (a warm
start when a previous run filled them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

sys.path.insert(0, ".")


class Phases:
    """Exclusive wall time per phase: a phase entered inside another pauses it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list[Any]] = []  # [phase, started]

    def enter(self, phase: str) -> None:
        now = time.perf_counter()
        if self._stack:
            outer = self._stack[-1]
            self.seconds[outer[0]] += now - outer[1]
        self._stack.append([phase, now])
        self.calls[phase] += 1

    def leave(self) -> None:
        now = time.perf_counter()
        phase, started = self._stack.pop()
        self.seconds[phase] += now - started
        if self._stack:
            self._stack[-1][1] = now

    def timed(self, phase: str, fn: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.enter(phase)
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()

        return wrapper

    def patch(self, owner: Any, name: str, phase: str) -> None:
        """Time every call of `owner.name` (a module's function or a class's method), where
        it exists (so that the tool also measures older checkouts)."""
        if hasattr(owner, name):
            setattr(owner, name, self.timed(phase, getattr(owner, name)))


def instrument(phases: Phases, gpu: bool) -> None:
    """Wrap the functions of each phase where their callers look them up."""
    import accy.gradient
    from accy.backends.cuda import compile as cuda_compile
    from accy.backends.cuda import executable
    from accy.core.ir import Program
    from accy.frontend import functions

    phases.patch(functions, "trace", "trace")
    phases.patch(accy.gradient, "value_and_grad", "differentiate")
    phases.patch(functions, "simplify", "simplify")
    digest = Program.digest.func  # a cached_property: time its first computation
    Program.digest.func = phases.timed("digest", digest)
    phases.patch(cuda_compile, "build_plan", "plan")
    phases.patch(cuda_compile, "emit_plan", "emit kernels")
    phases.patch(cuda_compile, "translation_units", "units")
    phases.patch(executable, "compile_program", "compile (other)")
    if gpu:
        from accy.backends.cuda import runtime

        phases.patch(runtime, "load_kernels", "nvrtc + module load")
        phases.patch(runtime.CudaFragment, "__init__", "fragment load (other)")
        phases.patch(runtime.CudaFragment, "_capture", "graph capture")


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


def build_without_gpu(scale, dtype: str, phases: Phases):
    """Trace, differentiate, simplify and compile the step for CUDA (no GPU needed); the
    compiled fragment."""
    from accy.backends.base import backend_for, compile_artifact
    from accy.backends.cuda import executable
    from accy.demo.gpt2 import training_step
    from accy.frontend.tracing import flatten

    step = training_step(scale, "cuda", dtype)
    leaves, treedef = flatten((fake_inputs(scale, dtype), {}))
    phases.enter("first call (other)")
    try:
        entry = step._build((), leaves, treedef)
        entry.program.digest  # noqa: B018 (the executable cache's key, as a call computes it)
        compiled = compile_artifact(executable.CudaBackend(), entry.program, None)
    finally:
        phases.leave()
    assert backend_for("cuda") is not None
    return compiled


def run_on_gpu(scale, dtype: str, phases: Phases):
    """The first call of the step on the GPU (as bench.gpt2 makes it); its compiled fragment."""
    import numpy as np

    from bench.gpt2 import accy_inputs, accy_step

    inputs = accy_inputs(scale, "cuda", dtype=dtype)
    step = accy_step(scale, "cuda", dtype)
    phases.enter("first call (other)")
    try:
        loss, _, _ = step(*inputs)
        first = float(np.asarray(loss.array.get()))
    finally:
        phases.leave()
    (staged,) = step._staged.values()
    (entry,) = staged.cache.values()
    (executable,) = entry.compiled.values()
    return getattr(executable, "compiled", None), first


ORDER = (
    "trace",
    "differentiate",
    "simplify",
    "digest",
    "plan",
    "emit kernels",
    "units",
    "compile (other)",
    "nvrtc + module load",
    "fragment load (other)",
    "graph capture",
    "first call (other)",
)


def report(phases: Phases, compiled, wall: float, extra: dict) -> dict:
    result: dict[str, Any] = {
        "phases_s": {p: round(phases.seconds[p], 4) for p in ORDER if p in phases.seconds},
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
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cuda", help="a scale of bench.gpt2 (cuda, cpu, check)")
    parser.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    parser.add_argument("--gpu", action="store_true", help="load and run the step on a GPU")
    parser.add_argument("--cold", action="store_true", help="empty NVRTC and accy disk caches")
    parser.add_argument("--json", default=None, help="write the breakdown here too")
    args = parser.parse_args(argv)
    if args.cold:  # before CuPy or accy read them
        folder = tempfile.mkdtemp(prefix="accy-cold-")
        os.environ["CUPY_CACHE_DIR"] = os.path.join(folder, "cupy")
        os.environ["ACCY_CACHE_DIR"] = os.path.join(folder, "accy")
    started = time.perf_counter()
    from bench.gpt2 import SCALES

    imported = time.perf_counter() - started
    scale = SCALES[args.scale]
    phases = Phases()
    instrument(phases, args.gpu)
    start = time.perf_counter()
    extra: dict[str, Any] = {"scale": args.scale, "dtype": args.dtype, "gpu": args.gpu}
    extra |= {"cold_caches": args.cold, "import_s": round(imported, 4)}
    if args.gpu:
        compiled, loss = run_on_gpu(scale, args.dtype, phases)
        extra["first_loss"] = loss
    else:
        compiled = build_without_gpu(scale, args.dtype, phases)
    result = report(phases, compiled, time.perf_counter() - start, extra)
    print(f"cold start of the gpt2 step ({args.scale} scale, {args.dtype}, gpu={args.gpu}, "
          f"cold caches={args.cold}): {result['total_s']:.2f} s after imports "
          f"({imported:.2f} s)")  # fmt: skip
    for phase, seconds in result["phases_s"].items():
        print(f"  {phase:24s} {seconds:8.3f} s  ({phases.calls[phase]} calls)")
    if compiled is not None:
        print(
            f"  generated: {result['kernels']} kernels, {result['source_bytes']:,} bytes of CUDA C "
            f"in {result['units']} units (largest {result['largest_unit_bytes']:,}); "
            f"{result['operations']} operations, {result['actions']} actions, "
            f"{result['pool_entries']} pool entries"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
