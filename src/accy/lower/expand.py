"""Kinds that a backend lowers as a composition of other kinds, rewritten before planning.

`conv` becomes its im2col composition (`core/windows.py`, `conv_by_windows`: pad, strided
slices, one contraction) unless the backend keeps it. A backend with a convolution kernel
(cuDNN; the CPU's tiled implicit GEMM, `accy.lower.convolution`) passes `keep`: for each conv
it can run, the axis orders its operands must have (channels last, or first for a kernel
gradient's contracted batch); the conv is then kept, its operands transposed to those orders
(copies where the order differs: the planner stores them contiguously) and its result
transposed back. `keep` returns None for the others, which are composed. The windowed
reductions (`reduce_window` and its derivatives' kinds) compose as pad, strided slices and
reductions (`core/windows.py`) where the backend has no loops of its own for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core import Operation, Program
from ..core.builder import Builder
from ..interpret import Emitter, Graph, Layer, run

Orders = tuple[Sequence[str], ...]
Keep = Callable[[Operation], Orders | None]

COMPOSED: dict[str, Callable[[Any, Operation, list[Any]], Any]] = {
    "conv": lambda e, op, args: e.conv_by_windows(args[0], args[1], op.attrs),
    "reduce_window": lambda e, op, args: e.reduce_window_by_windows(args[0], op.attrs),
    "select_and_gather_add": lambda e, op, args: e.select_and_gather_by_windows(*args, op.attrs),
    "select_and_scatter_add": lambda e, op, args: e.select_and_scatter_by_windows(*args, op.attrs),
}


def compose_all(op: Operation) -> None:
    """The `keep` of a backend without libraries for these kinds: compose every one."""
    return None


class _Expand(Layer):
    def __init__(self, next: Any, keep: Keep):
        super().__init__(next)
        self.emit = Emitter(self)
        self.keep = keep
        self.whole = Emitter(next)  # emits below this layer: a kept operation stays whole

    def bind(self, op: Operation, args: list[Any]) -> Any:
        compose = COMPOSED.get(op.kind)
        if compose is None:
            return self.next.bind(op, args)
        orders = self.keep(op)
        if orders is None:
            return compose(self.emit, op, args)
        return self._laid_out(op, args, orders)

    def _laid_out(self, op: Operation, args: list[Any], orders: Orders) -> Any:
        """`op` on its operands transposed to `orders`, its result transposed back."""
        operands = [self.emit.transpose(a, order) for a, order in zip(args, orders, strict=True)]
        result = self.whole.emit(op.kind, operands, op.attrs, id=op.id)
        return self.emit.transpose(result, op.type.axes)


def expand_compositions(program: Program, keep: Keep = compose_all) -> Program:
    """`program` with every operation of a `COMPOSED` kind replaced by its composition, or
    laid out as `keep` asks; the same program when it has none.

    >>> import accy
    >>> types = [accy.spec(accy.f32, w=5, c=2), accy.spec(accy.f32, w=3, c=2, o=4)]
    >>> p = accy.trace.define("c", types, lambda b, a: a[0].conv(a[1], ["w"], "c", "o"))
    >>> expanded = expand_compositions(p)
    >>> expanded.count("conv"), expanded.count("dot_general")
    (0, 1)
    >>> kept = expand_compositions(p, lambda op: (("c", "w"), ("o", "w", "c")))
    >>> kept.count("conv"), kept.count("transpose")
    (1, 3)
    """
    if not any(op.kind in COMPOSED for op in program.operations):
        return program
    return run(program, _Expand(Graph(Builder(program.name)), keep))
