"""Kinds that a backend lowers as a composition of other kinds, rewritten before planning.

`conv` becomes its im2col composition (`core/windows.py`, `conv_by_windows`: pad, strided
slices, one contraction): on the CPU that contraction is one BLAS GEMM, which is what a
direct convolution would call too; a backend with a convolution library (cuDNN) names the
operations it keeps whole in `keep`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import Operation, Program
from ..core.builder import Builder
from ..interpret import Emitter, Graph, Layer, run

COMPOSED: dict[str, Callable[[Any, Operation, list[Any]], Any]] = {
    "conv": lambda e, op, args: e.conv_by_windows(args[0], args[1], op.attrs),
}


class _Expand(Layer):
    def __init__(self, next: Any, keep: Callable[[Operation], bool]):
        super().__init__(next)
        self.emit = Emitter(self)
        self.keep = keep

    def bind(self, op: Operation, args: list[Any]) -> Any:
        compose = COMPOSED.get(op.kind)
        if compose is None or self.keep(op):
            return self.next.bind(op, args)
        return compose(self.emit, op, args)


def expand_compositions(
    program: Program, keep: Callable[[Operation], bool] = lambda op: False
) -> Program:
    """`program` with every operation of a `COMPOSED` kind (but those `keep` accepts)
    replaced by its composition; the same program when it has none.

    >>> import accy
    >>> types = [accy.spec(accy.f32, w=5, c=2), accy.spec(accy.f32, w=3, c=2, o=4)]
    >>> p = accy.trace.define("c", types, lambda b, a: a[0].conv(a[1], ["w"], "c", "o"))
    >>> expanded = expand_compositions(p)
    >>> expanded.count("conv"), expanded.count("dot_general")
    (0, 1)
    """
    if not any(op.kind in COMPOSED and not keep(op) for op in program.operations):
        return program
    return run(program, _Expand(Graph(Builder(program.name)), keep))
