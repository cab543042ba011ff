"""Run programs on the native CPU over raw buffers (the seed's `execute` module).

`run_cpu(program, inputs, outputs)` compiles (once per program object, then from memory) and
runs; `Cpu(program)` compiles up front and `launch(inputs, outputs)` runs it again and again.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from .core import Program
from .executable import Fragment, invoke, load_fragment
from .gpu.cpu import State
from .lower.fragment import FragmentCompilerOptions, compile_fragment

# (id of program, id of registry) -> (weak program, registry, fragment); the registry is held so
# that its id cannot be reused by another while the entry exists.
_fragments: dict[tuple[int, int], tuple[weakref.ref, Any, Fragment]] = {}
_lock = threading.Lock()


def fragment_for(program: Program, options: FragmentCompilerOptions | None = None) -> Fragment:
    """The loaded fragment of `program`, compiled on first use and remembered while the program
    object lives."""
    options = options or FragmentCompilerOptions()
    key = (id(program), id(options.kernel_call_registry))
    with _lock:
        entry = _fragments.get(key)
        if entry is not None and entry[0]() is program:
            return entry[2]
    handle = State().handle()
    fragment = load_fragment(handle, compile_fragment(handle, program, options), options)
    with _lock:
        reference = weakref.ref(program, _forgetter(key))
        _fragments[key] = (reference, options.kernel_call_registry, fragment)
    return fragment


def _forgetter(key: tuple[int, int]):
    table = _fragments  # held here: module globals may already be gone at interpreter exit

    def forget(reference: weakref.ref) -> None:
        entry = table.get(key)
        if entry is not None and entry[0] is reference:
            del table[key]

    return forget


def run_cpu(program: Program, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """Run `program` natively: `inputs` and `outputs` are buffers, one per parameter/output.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> out = bytearray(8)
    >>> accy.execute.run_cpu(p, [np.array([1, 2], np.float32).tobytes()], [out])
    >>> np.frombuffer(out, np.float32).tolist()
    [2.0, 4.0]
    """
    invoke(fragment_for(program), inputs, outputs)


class Cpu:
    """A program compiled for the native CPU, launched any number of times.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> executor, out = accy.execute.Cpu(p), np.zeros(2, np.float32)
    >>> executor.launch([np.array([3, 4], np.float32)], [out])
    >>> out.tolist()
    [6.0, 8.0]
    """

    def __init__(self, program: Program, options: FragmentCompilerOptions | None = None):
        self.program = program
        self.fragment = fragment_for(program, options)

    def launch(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        invoke(self.fragment, inputs, outputs)


__all__ = ["Cpu", "fragment_for", "run_cpu"]
