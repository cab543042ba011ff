"""Unrolling: replace each `scan` by its body inlined once per step.

The seed differentiates scans by unrolling them first (`unroll.apply`). Each step slices its x
inputs, runs the body on the carries, and the y slices are stacked back along the scanned axis.
"""

from __future__ import annotations

from typing import Any

from ..core import Operation, Program
from ..core.builder import Builder
from ..interpret import Emitter, Graph, Inline, Layer, run


class _Unroll(Layer):
    def __init__(self, next: Any):
        super().__init__(next)
        self.emit = Emitter(self)

    def bind(self, op: Operation, args: list[Any]) -> Any:
        if op.kind != "scan":
            return self.next.bind(op, args)
        attrs = op.attrs
        num_consts, num_carry = attrs["num_consts"], attrs["num_carry"]
        consts = args[:num_consts]
        carries = list(args[num_consts : num_consts + num_carry])
        xs = args[num_consts + num_carry :]
        axis, length = attrs["axis"], attrs["length"]
        steps = range(length)
        ys_per_step: list[list[Any]] = []
        for step in reversed(steps) if attrs["reverse"] else steps:
            slices = [self._step_slice(x, axis, step) for x in xs]
            outputs = run(
                attrs["body"], Inline(self.emit, consts + carries + slices, attrs["body"])
            )
            carries = list(outputs[:num_carry])
            ys_per_step.append(list(outputs[num_carry:]))
        if attrs["reverse"]:
            ys_per_step.reverse()
        stacked = []
        for i, y_type in enumerate(op.result_types[num_carry:]):
            if not ys_per_step:
                stacked.append(self.emit.zeros(y_type))
                continue
            pieces = [self._add_axis(y[i], axis) for y in ys_per_step]
            stacked.append(self.emit.concatenate(pieces, axis) if len(pieces) > 1 else pieces[0])
        return tuple(carries + stacked)

    def _step_slice(self, x: Any, axis: str, step: int) -> Any:
        piece = self.emit.slice(x, axis, step, step + 1)
        return self.emit.reshape(piece, [(a, e) for a, e in piece.ty.named_extents if a != axis])

    def _add_axis(self, y: Any, axis: str) -> Any:
        return self.emit.reshape(y, [(axis, 1), *y.ty.named_extents])


def apply(program: Program) -> Program:
    """`program` with every scan (nested ones too) unrolled into straight-line operations.

    >>> import accy
    >>> def body(b, args):
    ...     carry, x = args
    ...     return carry + x, carry * x
    >>> def loop(b, args):
    ...     (final,), (ys,) = b.scan(body, carries=[args[0]], xs=[args[1]], axis="step")
    ...     return final, ys
    >>> p = accy.trace.define("loop", [accy.spec(accy.f32), accy.spec(accy.f32, step=3)], loop)
    >>> accy.transforms.unroll.apply(p).contains_scan()
    False
    """
    if not program.contains_scan():
        return program
    return run(program, _Unroll(Graph(Builder(program.name))))
