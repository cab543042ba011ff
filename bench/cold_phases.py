"""Where a cold start's time goes: exclusive wall time per phase of building and first running
a jitted step (tracing, differentiation, simplification, planning; on a GPU CUDA C, NVRTC,
cuDNN's graphs, graph capture, and with a warm disk cache "cached fragment": the compiled
fragment read back instead of planning and writing CUDA C; on the CPU the C source, gcc (both
units and the link where it compiles in parts) and loading the library), by wrapping the
functions of each phase where their callers look them up. Two phases are charged wherever they
happen inside another: imports that load new modules ("imports") and Python's cyclic garbage
collections ("garbage collection", "full garbage collection" for the oldest generation's), both
on the main thread. Used by `bench.gpt2` (the `cold_phases_s` of accy's results) and
`tools/cold_start.py`.

>>> phases = Phases()
>>> phases.enter("outer"); phases.enter("inner"); phases.leave(); phases.leave()
>>> sorted(phases.seconds) == ["inner", "outer"] and phases.calls["inner"] == 1
True
"""

from __future__ import annotations

import builtins
import gc
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


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

    def charge(self, phase: str, seconds: float) -> None:
        """Count `seconds` just spent (inside the current phase, if any) as `phase` instead."""
        self.seconds[phase] += seconds
        self.calls[phase] += 1
        if self._stack:
            self._stack[-1][1] += seconds

    @property
    def inside(self) -> bool:
        """Whether a phase is being measured now."""
        return bool(self._stack)

    @contextmanager
    def measuring(self, phase: str) -> Iterator[None]:
        """Count the block's time (less the phases inside it) as `phase`."""
        self.enter(phase)
        try:
            yield
        finally:
            self.leave()

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
    """Wrap the functions of each phase where their callers look them up; count imports and
    garbage collections inside the phases (`count_imports`, `count_collections`)."""
    import accy.gradient
    from accy.backends import fragments
    from accy.backends.cuda import compile as cuda_compile
    from accy.backends.cuda import executable
    from accy.core.ir import Program
    from accy.frontend import functions

    phases.patch(functions, "trace", "trace")
    phases.patch(accy.gradient, "value_and_grad", "differentiate")
    phases.patch(functions, "simplify", "simplify")
    digest = Program.digest.func  # a cached_property: time its first computation
    Program.digest.func = phases.timed("digest", digest)
    phases.patch(cuda_compile, "fragment_key", "fragment key")
    phases.patch(fragments, "loads", "cached fragment")
    phases.patch(cuda_compile, "build_plan", "plan")
    phases.patch(cuda_compile, "emit_plan", "emit kernels")
    phases.patch(cuda_compile, "translation_units", "units")
    phases.patch(executable, "compile_program", "compile (other)")
    if not gpu:
        from accy.backends.cpu import compile as cpu_compile
        from accy.backends.cpu import toolchain

        phases.patch(cpu_compile, "build_plan", "plan")
        phases.patch(cpu_compile, "translation", "C source")
        phases.patch(toolchain, "_run_compiler", "gcc")
        phases.patch(cpu_compile.CompiledFragment, "load", "load")
    if gpu:
        from accy.backends.cuda import runtime

        # (the wait for NVRTC's threads, after the rest of the fragment has loaded meanwhile)
        phases.patch(runtime.KernelsLoading, "wait", "nvrtc + module load")
        phases.patch(runtime, "load_kernels", "nvrtc + module load")
        phases.patch(runtime.CudaFragment, "__init__", "fragment load (other)")
        phases.patch(runtime.CudaFragment, "_capture", "graph capture")
        from accy.backends.cuda import cudnn

        phases.patch(cudnn.Graphs, "built", "cudnn graphs")
    count_imports(phases)
    count_collections(phases)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def count_imports(phases: Phases) -> None:
    """Charge each import statement that loads new modules, inside a phase on the main thread,
    to "imports" (by wrapping `builtins.__import__`; `uninstrument` puts it back). An import
    inside an import is the outer one's; a collection during an import is not an import's."""
    original = getattr(builtins.__import__, "original", builtins.__import__)
    depth = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        if depth[0] or not phases.inside or not _on_main_thread():
            return original(*args, **kwargs)
        loaded, collecting = len(sys.modules), _collecting(phases)
        started = time.perf_counter()
        depth[0] += 1
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1
            if len(sys.modules) != loaded:
                elapsed = time.perf_counter() - started
                phases.charge("imports", elapsed - (_collecting(phases) - collecting))

    counted.original = original  # type: ignore[attr-defined]
    builtins.__import__ = counted


def _collecting(phases: Phases) -> float:
    return phases.seconds.get("garbage collection", 0.0) + phases.seconds.get(
        "full garbage collection", 0.0
    )


def count_collections(phases: Phases) -> None:
    """Charge each cyclic garbage collection inside a phase on the main thread to "garbage
    collection" (or "full garbage collection": the oldest generation's), by a `gc.callbacks`
    entry (`uninstrument` removes it)."""
    started: list[float] = []

    def collected(stage: str, info: dict[str, int]) -> None:
        if not _on_main_thread():
            return
        if stage == "start":
            started.append(time.perf_counter())
            return
        if started:
            seconds = time.perf_counter() - started.pop()
            if phases.inside:
                full = info.get("generation") == 2
                phases.charge("full garbage collection" if full else "garbage collection", seconds)

    collected.counts_phases = True  # type: ignore[attr-defined]
    uninstrument_collections()
    gc.callbacks.append(collected)


def uninstrument_collections() -> None:
    gc.callbacks[:] = [c for c in gc.callbacks if not getattr(c, "counts_phases", False)]


def uninstrument() -> None:
    """Undo `count_imports` and `count_collections` (the wrapped functions stay wrapped)."""
    builtins.__import__ = getattr(builtins.__import__, "original", builtins.__import__)
    uninstrument_collections()


ORDER = (
    "trace",
    "differentiate",
    "simplify",
    "digest",
    "fragment key",
    "cached fragment",
    "plan",
    "emit kernels",
    "units",
    "C source",
    "gcc",
    "load",
    "compile (other)",
    "nvrtc + module load",
    "cudnn graphs",
    "fragment load (other)",
    "graph capture",
    "imports",
    "garbage collection",
    "full garbage collection",
    "first call (other)",
)


def summary(phases: Phases) -> dict[str, float]:
    """Seconds per phase, in pipeline order (phases never entered left out)."""
    return {p: round(phases.seconds[p], 4) for p in ORDER if p in phases.seconds}
