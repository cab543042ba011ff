"""float32 contractions with a bf16 operand, rewritten as bf16 contractions with the same result.

Mixed-precision programs contract an f32 value with a bf16 one that was widened to f32: the
transpose of a contraction with `accumulate=f32` meets the f32 cotangent with the other
operand converted to f32 (`core/kinds/contraction.py`). As written that is an f32 GEMM, which a
GPU runs without tensor cores at about a tenth of its bf16 rate (0.7 ms against 0.06 ms for
16384 x 2048 x 512 on an H200). The rewrite keeps the result exact:

- Both operands widened from bf16: products of bf16 numbers are exact in f32, so the bf16
  contraction with `accumulate=f32` computes the same sums.
- One operand `x` in f32: `x = x1 + x2 + x3` exactly, with each `xi` in bf16 (each rounding to
  bf16 keeps 8 of f32's 24 significant bits; the remainder of the last is representable). The
  contraction of `x` with the bf16 operand `w` is then the sum of three bf16 contractions with
  f32 accumulation (`x1·w + x2·w + x3·w`), or one contraction of the three parts laid side by
  side along the contracted axis against `w` repeated three times along it: whichever needs
  less extra memory (`w` three times, or three f32 results).

Only bf16 qualifies: f16's narrower exponent range cannot hold the parts of every f32 number.
Sums are rounded in another order than one f32 GEMM's, as any GEMM library's blocking does. A
value within about 2^-100 of zero may lose bits of its last part to bf16's subnormals, and an
infinite element gives NaN in its row of the result instead of an infinity.
"""

from __future__ import annotations

import math
from typing import Any

from ..config import config
from ..core import Operation, Program, bf16, f32
from ..core.builder import Builder
from ..interpret import Emitter, Graph, Layer, run
from ..transforms.simplify import eliminate_dead_code

# Below `accy.config.lower_smallest_split` multiply-adds a contraction stays as it is: the
# rewrite adds kernels, which only pay for themselves on a contraction big enough to be bound
# by arithmetic.


def split_widened_gemms(program: Program) -> Program:
    """`program` with each large f32 contraction of an operand widened from bf16 computed by
    bf16 contractions that sum in f32 (see the module's docstring); the same program if none.

    >>> import accy
    >>> types = [accy.spec(accy.f32, row=256, k=128), accy.spec(accy.bf16, k=128, col=256)]
    >>> p = accy.trace.define(
    ...     "g", types, lambda b, a: a[0].contract(a[1].convert(accy.f32), "k"))
    >>> split = split_widened_gemms(p)
    >>> [op.operand_types[0].dtype.name for op in split.operations if op.kind == "dot_general"]
    ['bf16']
    """
    widened = {op.results[0] for op in program.operations if _is_widening(op)}
    if not any(_qualifies(op, op.operands, widened) for op in program.operations):
        return program
    rewritten = run(program, _SplitWidened(Graph(Builder(program.name))))
    return eliminate_dead_code(rewritten)


def _qualifies(op: Operation, operands: Any, widened: Any) -> bool:
    """Whether `op` is a large f32 dot_general that contracts axes and has an operand (a value
    index in `operands`) among the `widened` ones."""
    if op.kind != "dot_general" or op.type.dtype != f32 or "accumulate" in op.attrs:
        return False
    if not op.attrs["lhs_contracting"] or _multiply_adds(op) < config.lower_smallest_split:
        return False
    return any(i in widened for i in operands)


def _multiply_adds(op: Operation) -> int:
    lhs = op.operand_types[0]
    contracted = [lhs.extents[d] for d in op.attrs["lhs_contracting"]]
    return math.prod(op.type.extents) * math.prod(contracted)


def _is_widening(op: Operation) -> bool:
    return op.kind == "convert" and op.operand_types[0].dtype == bf16 and op.type.dtype == f32


class _SplitWidened(Layer):
    def __init__(self, next: Any):
        super().__init__(next)
        self.emit = Emitter(next)  # what this layer emits goes straight down
        self.narrow: dict[int, Any] = {}  # index of an f32 value widened from bf16 -> the bf16

    def bind(self, op: Operation, args: list[Any]) -> Any:
        if _qualifies(op, [a.index for a in args], self.narrow):
            return self._contract(op, args)
        result = self.next.bind(op, args)
        if _is_widening(op):
            self.narrow[result.index] = args[0]
        return result

    def _contract(self, op: Operation, args: list[Any]) -> Any:
        lhs, rhs = (self.narrow.get(a.index, a) for a in args)
        a = op.attrs
        dims = (a["lhs_contracting"], a["rhs_contracting"], a["lhs_batch"], a["rhs_batch"])
        if lhs.ty.dtype == bf16 and rhs.ty.dtype == bf16:
            return self.emit.dot_general(lhs, rhs, *dims, accumulate=f32)
        split_left = lhs.ty.dtype == f32
        wide, narrow = (lhs, rhs) if split_left else (rhs, lhs)
        parts = self._parts(wide)
        if _tiling_is_smaller(narrow, op):
            return self._side_by_side(parts, narrow, dims, split_left)
        products = [
            self.emit.dot_general(
                *((p, narrow) if split_left else (narrow, p)), *dims, accumulate=f32
            )
            for p in parts
        ]
        return self.emit.add(self.emit.add(products[2], products[1]), products[0])

    def _parts(self, x: Any) -> list[Any]:
        """Three bf16 values whose f32 sum is `x`, largest first."""
        e = self.emit
        parts = [e.convert(x, bf16)]
        for _ in range(2):  # each remainder is exact in f32; the third is exact in bf16
            x = e.sub(x, e.convert(parts[-1], f32))
            parts.append(e.convert(x, bf16))
        return parts

    def _side_by_side(self, parts: list[Any], narrow: Any, dims: tuple, split_left: bool) -> Any:
        """One contraction of the parts laid end to end along the first contracted axis, with
        `narrow` repeated three times along its partner."""
        lhs_contracting, rhs_contracting = dims[0], dims[1]
        wide_dim, narrow_dim = (
            (lhs_contracting[0], rhs_contracting[0])
            if split_left
            else (rhs_contracting[0], lhs_contracting[0])
        )
        joined = self.emit.concatenate(parts, parts[0].ty.axes[wide_dim])
        repeated = self.emit.concatenate([narrow] * 3, narrow.ty.axes[narrow_dim])
        operands = (joined, repeated) if split_left else (repeated, joined)
        return self.emit.dot_general(*operands, *dims, accumulate=f32)


def _tiling_is_smaller(narrow: Any, op: Operation) -> bool:
    """Three copies of the bf16 operand take fewer bytes than three f32 results."""
    return 3 * 2 * math.prod(narrow.ty.extents) <= 3 * 4 * math.prod(op.type.extents)
