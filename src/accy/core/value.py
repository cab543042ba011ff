"""`Value`: a traced tensor, an SSA value of one `Builder`, with its named-axis type.

Its methods and Python operators forward to the builder's named-axis operations (`OpsApi`), so
`x * 2.0`, `x.sum("token")` and `q.contract(k, "channel")` record operations while tracing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import AccyError
from .operations import is_axis_argument
from .types import DType, TensorType

if TYPE_CHECKING:
    from .builder import Builder


class Value:
    """A traced tensor: an SSA value of one Builder, with its named-axis type `ty`.

    Methods and Python operators record operations; elementwise ones broadcast by axis name
    and accept Python scalars (`x * 2.0`, `1.0 - x`).
    """

    __slots__ = ("builder", "index", "ty")

    def __init__(self, builder: Builder, index: int, ty: TensorType):
        self.builder = builder
        self.index = index
        self.ty = ty

    def __repr__(self) -> str:
        return f"<Value %{self.index}: {self.ty}>"

    @property
    def dtype(self) -> DType:
        return self.ty.dtype

    @property
    def axes(self) -> tuple[str, ...]:
        return self.ty.axes

    @property
    def shape(self) -> dict[str, int]:
        return self.ty.shape

    def __bool__(self) -> bool:
        raise AccyError(
            "a traced value has no truth value while tracing; use select(predicate, a, b) "
            "instead of Python's if/and/or"
        )

    # elementwise arithmetic
    def add(self, other):
        return self.builder.add(self, other)

    def sub(self, other):
        return self.builder.sub(self, other)

    def mul(self, other):
        return self.builder.mul(self, other)

    def div(self, other):
        return self.builder.div(self, other)

    def pow(self, other):
        return self.builder.pow(self, other)

    def max(self, other_or_axes=None):
        """Elementwise maximum with a value, or the maximum over axes (names or None: all)."""
        if other_or_axes is None or is_axis_argument(other_or_axes):
            return self.builder.reduce_max(self, other_or_axes)
        return self.builder.maximum(self, other_or_axes)

    def min(self, other_or_axes=None):
        """Elementwise minimum with a value, or the minimum over axes (names or None: all)."""
        if other_or_axes is None or is_axis_argument(other_or_axes):
            return self.builder.reduce_min(self, other_or_axes)
        return self.builder.minimum(self, other_or_axes)

    __add__ = add
    __sub__ = sub
    __mul__ = mul
    __truediv__ = div
    __pow__ = pow

    def __radd__(self, other):
        return self.builder.add(other, self)

    def __rsub__(self, other):
        return self.builder.sub(other, self)

    def __rmul__(self, other):
        return self.builder.mul(other, self)

    def __rtruediv__(self, other):
        return self.builder.div(other, self)

    def __rpow__(self, other):
        return self.builder.pow(other, self)

    def __neg__(self):
        return self.builder.neg(self)

    def __lt__(self, other):
        return self.builder.compare("lt", self, other)

    def __le__(self, other):
        return self.builder.compare("le", self, other)

    def __gt__(self, other):
        return self.builder.compare("gt", self, other)

    def __ge__(self, other):
        return self.builder.compare("ge", self, other)

    def eq(self, other):
        """Elementwise equality (`==` keeps Python's identity meaning for traced values)."""
        return self.builder.compare("eq", self, other)

    def ne(self, other):
        return self.builder.compare("ne", self, other)

    # unary math
    def _unary(self, op: str):
        return self.builder.unary(op, self)

    def neg(self):
        return self._unary("neg")

    def exp(self):
        return self._unary("exp")

    def log(self):
        return self._unary("log")

    def log1p(self):
        return self._unary("log1p")

    def expm1(self):
        return self._unary("expm1")

    def sin(self):
        return self._unary("sin")

    def cos(self):
        return self._unary("cos")

    def tan(self):
        return self._unary("tan")

    def tanh(self):
        return self._unary("tanh")

    def logistic(self):
        return self._unary("logistic")

    def sqrt(self):
        return self._unary("sqrt")

    def rsqrt(self):
        return self._unary("rsqrt")

    def abs(self):
        """|x|, with derivative sign(x): 0 at x = 0.

        PyTorch agrees; JAX gives 1 at 0 (select(x >= 0, g, -g)). accy keeps 0 because it is
        what abs(x) = max(x, -x) gives under max's even tie split, and it is symmetric
        (abs(x) and abs(-x) have the same derivative at 0).

        >>> import accy
        >>> p = accy.trace.define(
        ...     "a", [accy.spec(accy.f32, n=3)], lambda b, x: x[0].abs().sum("n"))
        >>> accy.reference.run(accy.grad(p), [[-2.0, 0.0, 3.0]])[0].tolist()
        [-1.0, 0.0, 1.0]
        """
        return self._unary("abs")

    def sign(self):
        return self._unary("sign")

    def floor(self):
        return self._unary("floor")

    def ceil(self):
        return self._unary("ceil")

    def round(self):
        return self._unary("round")

    def logical_not(self):
        return self._unary("not")

    def convert(self, dtype: DType):
        return self.builder.convert(self, dtype)

    # reductions
    def sum(self, axes=None, accumulate: DType | None = None):
        """Sum over one axis name or several (all when None); `accumulate` as `OpsApi.sum`."""
        return self.builder.sum(self, axes, accumulate)

    def prod(self, axes=None):
        return self.builder.prod(self, axes)

    def mean(self, axes=None, accumulate: DType | None = None):
        return self.builder.mean(self, axes, accumulate)

    def reduce(self, init, op: str, axes=None):
        """Reduce `axes` with `op` (sum, max, min, prod) starting from the scalar `init`."""
        return self.builder.reduce(self, init, op, axes)

    # layout and indexing
    def rename(self, old: str, new: str):
        return self.builder.rename(self, old, new)

    def transpose(self, *order: str):
        return self.builder.transpose(
            self, order[0] if len(order) == 1 and not isinstance(order[0], str) else order
        )

    def broadcast_to(self, target: TensorType):
        return self.builder.broadcast_to(self, target)

    def merge(self, axes: Sequence[str], into: str):
        return self.builder.merge(self, axes, into)

    def split(self, axis: str, **parts: int):
        return self.builder.split(self, axis, parts)

    def slice(self, axis: str, start: int = 0, stop: int | None = None, step: int = 1):
        return self.builder.slice(self, axis, start, stop, step)

    def pad(self, axis: str, low: int = 0, high: int = 0, value=0, interior: int = 0):
        return self.builder.pad(self, axis, low, high, value, interior)

    def gather(self, indices: Value, axis: str):
        return self.builder.gather(self, indices, axis)

    def scatter_add(self, indices: Value, updates: Value, axis: str):
        return self.builder.scatter_add(self, indices, updates, axis)

    def contract(self, other: Value, axes, accumulate: DType | None = None):
        """Sum of products over `axes`; `accumulate` as `OpsApi.contract`."""
        return self.builder.contract(self, other, axes, accumulate)
