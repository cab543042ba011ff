"""`ArrayOps`, the one set of array methods, and `Value`, a traced tensor.

`ArrayOps` holds every method and Python operator of an array with named axes (`x * 2.0`,
`x.sum("token")`, `q.contract(k, "channel")`, `x["token", 1:]`, ...), each forwarding to the
object's `builder` (an `OpsApi`). A `Value` (an SSA value of one `Builder`) records operations
with them; the front end's `NamedArray` runs them eagerly through the same methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import AccyError
from .indexing import index_by_name
from .operations import OpsApi, is_axis_argument
from .types import DType, TensorType


class ArrayOps:
    """The methods and operators of an array with named axes, over `self.builder` (the
    operation library that carries them out) and `self.ty` (its `TensorType`).

    Elementwise ones broadcast by axis name and accept Python scalars (`x * 2.0`, `1.0 - x`);
    `x["token", 1:]` and `x["batch", 0]` slice and index by name.

    >>> import accy
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, n=3)], lambda b, a: a[0]["n", 1:] * 2.0)
    >>> accy.reference.run(p, [[1.0, 2.0, 3.0]])[0].tolist()
    [4.0, 6.0]
    """

    __slots__ = ()
    __array_priority__ = 100  # so that `np.float32(2) * x` defers to `x.__rmul__`
    builder: Any
    ty: TensorType

    @property
    def dtype(self) -> DType:
        """The dtype of the elements (accy.f32, accy.i32, ...)."""
        return self.ty.dtype

    @property
    def axes(self) -> tuple[str, ...]:
        """The axis names, in layout order."""
        return self.ty.axes

    @property
    def shape(self) -> dict[str, int]:
        """A dict from axis name to extent, in layout order (`{"batch": 2, "channel": 3}`)."""
        return self.ty.shape

    @property
    def size(self) -> int:
        """The number of elements."""
        return self.ty.size

    def __getitem__(self, key: Any):
        """Slice (`x["token", 1:]`) or index (`x["batch", 0]`, which removes the axis) by name."""
        return index_by_name(self.builder, self, key)

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

    # more unary math (rows of accy.core.kinds.elementwise.UNARY)
    def asin(self):
        """Elementwise arcsin."""
        return self._unary("asin")

    def acos(self):
        """Elementwise arccos."""
        return self._unary("acos")

    def atan(self):
        """Elementwise arctan."""
        return self._unary("atan")

    def sinh(self):
        """Elementwise hyperbolic sine."""
        return self._unary("sinh")

    def cosh(self):
        """Elementwise hyperbolic cosine."""
        return self._unary("cosh")

    def asinh(self):
        """Elementwise inverse hyperbolic sine."""
        return self._unary("asinh")

    def acosh(self):
        """Elementwise inverse hyperbolic cosine."""
        return self._unary("acosh")

    def atanh(self):
        """Elementwise inverse hyperbolic tangent."""
        return self._unary("atanh")

    def erf(self):
        """Elementwise the error function."""
        return self._unary("erf")

    def erfc(self):
        """Elementwise 1 - erf(x), accurate in the tails."""
        return self._unary("erfc")

    def erf_inv(self):
        """Elementwise the inverse of erf on [-1, 1] (+-inf at +-1)."""
        return self._unary("erf_inv")

    def lgamma(self):
        """Elementwise log |Gamma(x)| (inf at the poles)."""
        return self._unary("lgamma")

    def digamma(self):
        """Elementwise d/dx lgamma(x) (NaN at the poles 0, -1, -2, ...)."""
        return self._unary("digamma")

    # more binary math and integer bit operations (rows of BINARY)
    def atan2(self, other):
        """Elementwise arctan(self / other) in the quadrant of (other, self)."""
        return self.builder.binary("atan2", self, other)

    def rem(self, other):
        """The remainder of truncated division, with the sign of `self` (C's fmod, lax.rem);
        `%` is NumPy's remainder (the divisor's sign)."""
        return self.builder.binary("rem", self, other)

    def copysign(self, other):
        """|self| with the sign of `other`."""
        return self.builder.binary("copysign", self, other)

    def floor_divide(self, other):
        """The quotient rounded toward -inf, as NumPy's `//`."""
        return self.builder.floor_divide(self, other)

    def remainder(self, other):
        """NumPy's `%`: the remainder with the sign of the divisor."""
        return self.builder.remainder(self, other)

    def shift_left(self, bits):
        """Bits shifted left; shifting by the width or more (or a negative amount) gives 0."""
        return self.builder.binary("shift_left", self, bits)

    def shift_right_logical(self, bits):
        """Bits shifted right, filling with zeros."""
        return self.builder.binary("shift_right_logical", self, bits)

    def shift_right_arithmetic(self, bits):
        """Bits shifted right, filling with the sign bit."""
        return self.builder.binary("shift_right_arithmetic", self, bits)

    def bitcast_convert(self, dtype: DType):
        """The same bits read as `dtype` of the same width (f32 <-> i32, f64 <-> i64)."""
        return self.builder.bitcast_convert(self, dtype)

    def __and__(self, other):
        return self.builder.binary("and", self, other)

    def __or__(self, other):
        return self.builder.binary("or", self, other)

    def __xor__(self, other):
        return self.builder.binary("xor", self, other)

    def __rand__(self, other):
        return self.builder.binary("and", other, self)

    def __ror__(self, other):
        return self.builder.binary("or", other, self)

    def __rxor__(self, other):
        return self.builder.binary("xor", other, self)

    def __invert__(self):
        """Bitwise not of integers, logical not of bools."""
        return self._unary("not")

    def __lshift__(self, bits):
        return self.shift_left(bits)

    def __rshift__(self, bits):
        """Arithmetic for signed integers, logical for unsigned ones (as NumPy's `>>`)."""
        if self.ty.dtype.name == "u8":
            return self.shift_right_logical(bits)
        return self.shift_right_arithmetic(bits)

    __floordiv__ = floor_divide
    __mod__ = remainder

    def __rfloordiv__(self, other):
        return self.builder.floor_divide(other, self)

    def __rmod__(self, other):
        return self.builder.remainder(other, self)

    def logical_not(self):
        return self._unary("not")

    def convert(self, dtype: DType):
        return self.builder.convert(self, dtype)

    # reductions
    def sum(self, axes=None, accumulate: DType | None = None, where=None):
        """Sum over one axis name or several (all when None); `accumulate` as `OpsApi.sum`;
        with the bool mask `where` (its axes among this value's), only where it holds."""
        return self.builder.sum(self, axes, accumulate, where)

    def prod(self, axes=None, where=None):
        """The product over axes (all when None), only where the mask `where` holds if given."""
        return self.builder.prod(self, axes, where)

    def mean(self, axes=None, accumulate: DType | None = None, where=None):
        """The mean over axes (all when None); with the bool mask `where`, the mean of the
        elements where it holds (broadcast by name, as `jnp.mean(x, where=mask)`).

        >>> import accy, numpy as np
        >>> x = accy.named(np.array([[1.0, 2.0], [3.0, 6.0]], np.float32), ("row", "col"))
        >>> x.mean("col", where=x > 1.5).array.tolist()
        [2.0, 4.5]
        """
        return self.builder.mean(self, axes, accumulate, where)

    def trace(self, axis1: str, axis2: str, offset: int = 0):
        """The sum of the diagonal over two axes (`np.trace`, Haliax's `hax.trace(x, a1, a2)`):
        the elements whose position along `axis2` minus that along `axis1` is `offset`, summed
        over both axes, which the result loses. A method rather than a function because
        `accy.trace` names the tracing module.

        >>> import accy, numpy as np
        >>> x = accy.named(np.arange(6.0, dtype=np.float32).reshape(2, 3), ("row", "col"))
        >>> x.trace("row", "col").item(), x.trace("row", "col", offset=1).item()
        (4.0, 6.0)
        """
        return self.builder.trace(self, axis1, axis2, offset)

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

    def broadcast_to(self, target: Any):
        return self.builder.broadcast_to(self, target)

    def merge(self, axes: Sequence[str], into: str):
        return self.builder.merge(self, axes, into)

    def split(self, axis: str, **parts: int):
        return self.builder.split(self, axis, parts)

    def slice(self, axis: str, start: int = 0, stop: int | None = None, step: int = 1):
        return self.builder.slice(self, axis, start, stop, step)

    def pad(
        self,
        axis: str,
        low: int = 0,
        high: int = 0,
        value=0,
        interior: int = 0,
        mode: str = "constant",
    ):
        """Pad `axis`: `mode` "constant" (with `value`; negative widths remove elements),
        "reflect", "symmetric", "edge" or "wrap" (as np.pad)."""
        return self.builder.pad(self, axis, low, high, value, interior, mode)

    # compositions (accy.core.compositions)
    def flip(self, axis: str):
        """The elements along `axis` in reverse order."""
        return self.builder.flip(self, axis)

    def roll(self, shift, axis: str):
        """Elements moved `shift` places along `axis`, wrapping around (np.roll); `shift` is an
        int or an integer scalar array."""
        return self.builder.roll(self, shift, axis)

    def tril(self, rows: str, columns: str, k: int = 0):
        """Zero where column - row > k (np.tril over the axes `rows`, `columns`)."""
        return self.builder.tril(self, rows, columns, k)

    def triu(self, rows: str, columns: str, k: int = 0):
        """Zero where column - row < k (np.triu over the axes `rows`, `columns`)."""
        return self.builder.triu(self, rows, columns, k)

    def cumsum(self, axis: str, reverse: bool = False):
        """Inclusive cumulative sum along `axis` (from the end when `reverse`).

        >>> import accy
        >>> p = accy.trace.define("c", [accy.spec(accy.f32, n=4)], lambda b, a: a[0].cumsum("n"))
        >>> accy.reference.run(p, [[1.0, 2.0, 3.0, 4.0]])[0].tolist()
        [1.0, 3.0, 6.0, 10.0]
        """
        return self.builder.cumulative(self, "sum", axis, reverse)

    def cumprod(self, axis: str, reverse: bool = False):
        """Inclusive cumulative product along `axis`."""
        return self.builder.cumulative(self, "prod", axis, reverse)

    def cummax(self, axis: str, reverse: bool = False):
        """Inclusive cumulative maximum along `axis`."""
        return self.builder.cumulative(self, "max", axis, reverse)

    def cummin(self, axis: str, reverse: bool = False):
        """Inclusive cumulative minimum along `axis`."""
        return self.builder.cumulative(self, "min", axis, reverse)

    def argmax(self, axis: str):
        """The i32 index of the largest element along `axis` (the first of ties, or of NaNs).

        >>> import accy
        >>> p = accy.trace.define("a", [accy.spec(accy.f32, n=4)], lambda b, a: a[0].argmax("n"))
        >>> int(accy.reference.run(p, [[1.0, 3.0, 3.0, 0.0]])[0])
        1
        """
        return self.builder.argmax(self, axis)

    def argmin(self, axis: str):
        """The i32 index of the smallest element along `axis` (the first of ties, or of NaNs)."""
        return self.builder.argmin(self, axis)

    def conv(
        self,
        kernel: ArrayOps,
        spatial: Sequence[str],
        in_axis: str,
        out_axis: str,
        stride=1,
        padding="valid",
        dilation=1,
        groups: int = 1,
        lhs_dilation=1,
    ):
        """Convolution with `kernel` over the named `spatial` axes (the kind `conv`, see
        accy.core.windows): stride, padding ("valid", "same" or (low, high) pairs), dilation
        (of the kernel) and lhs_dilation (of the input: a transposed convolution) per spatial
        axis, and groups.

        >>> import accy, numpy as np
        >>> def body(b, a):
        ...     return a[0].conv(a[1], ["w"], "c", "o", padding="same")
        >>> p = accy.trace.define("c", [accy.spec(accy.f32, w=4, c=1),
        ...                             accy.spec(accy.f32, w=3, c=1, o=1)], body)
        >>> x, k = np.arange(4.0, dtype=np.float32).reshape(4, 1), np.ones((3, 1, 1), np.float32)
        >>> accy.reference.run(p, [x, k])[0][:, 0].tolist()
        [1.0, 3.0, 6.0, 5.0]
        """
        return self.builder.conv(
            self,
            kernel,
            spatial,
            in_axis,
            out_axis,
            stride,
            padding,
            dilation,
            groups,
            lhs_dilation,
        )

    def reduce_window(self, op: str, window: dict, stride=None, padding="valid", dilation=1):
        """Reduce `op` over windows (`window`: axis -> extent; stride defaults to the window)."""
        return self.builder.reduce_window(self, op, window, stride, padding, dilation)

    def sort(self, axis: str, descending: bool = False):
        """The elements sorted along `axis` (stable; NaN last). `builder.sort` carries other
        operands along.

        >>> import accy
        >>> p = accy.trace.define("s", [accy.spec(accy.f32, n=4)], lambda b, a: a[0].sort("n"))
        >>> accy.reference.run(p, [[3.0, 1.0, 2.0, 0.0]])[0].tolist()
        [0.0, 1.0, 2.0, 3.0]
        """
        return self.builder.sort([self], axis, descending)[0]

    def argsort(self, axis: str, descending: bool = False):
        """The i32 positions that sort this value along `axis` (stable)."""
        return self.builder.argsort(self, axis, descending)

    def top_k(self, k: int, axis: str):
        """(the k largest along `axis`, descending; their i32 positions)."""
        return self.builder.top_k(self, k, axis)

    def dynamic_slice(self, starts: dict, sizes: dict):
        """The block of `sizes` (axis -> extent) at traced `starts` (axis -> integer scalar),
        starts clamped so that the block lies inside (as JAX).

        >>> import accy
        >>> p = accy.trace.define("d", [accy.spec(accy.f32, n=5), accy.spec(accy.i32)],
        ...                       lambda b, a: a[0].dynamic_slice({"n": a[1]}, {"n": 2}))
        >>> accy.reference.run(p, [[0.0, 1.0, 2.0, 3.0, 4.0], 4])[0].tolist()  # start 4 -> 3
        [3.0, 4.0]
        """
        return self.builder.dynamic_slice(self, starts, sizes)

    def dynamic_update_slice(self, update: ArrayOps, starts: dict):
        """This value with `update` written at traced `starts`, clamped as `dynamic_slice`."""
        return self.builder.dynamic_update_slice(self, update, starts)

    def gather(self, indices: ArrayOps, axis: str, mode: str = "clip", fill_value=None):
        """Rows along `axis` picked by `indices` (shared axes are batch axes); see
        `OpsApi.gather`."""
        return self.builder.gather(self, indices, axis, mode, fill_value)

    def scatter_add(self, indices: ArrayOps, updates: ArrayOps, axis: str, mode: str = "clip"):
        return self.builder.scatter_add(self, indices, updates, axis, mode)

    def scatter(
        self,
        indices: ArrayOps,
        updates: ArrayOps,
        axis: str,
        combine: str = "add",
        mode: str = "clip",
    ):
        """This value with `updates` combined (add, multiply, max, min, set) at `indices`
        along `axis`; see `OpsApi.scatter`."""
        return self.builder.scatter(self, indices, updates, axis, combine, mode)

    def contract(self, other: ArrayOps, axes, accumulate: DType | None = None):
        """Sum of products over `axes`; `accumulate` as `OpsApi.contract`."""
        return self.builder.contract(self, other, axes, accumulate)


class Value(ArrayOps):
    """A traced tensor: an SSA value of one Builder, with its named-axis type `ty`; its
    methods and operators (those of `ArrayOps`) record operations."""

    __slots__ = ("builder", "index", "ty")

    def __init__(self, builder: OpsApi, index: int, ty: TensorType):
        self.builder = builder
        self.index = index
        self.ty = ty

    def __repr__(self) -> str:
        return f"<Value %{self.index}: {self.ty}>"

    def __bool__(self) -> bool:
        raise AccyError(
            "a traced value has no truth value while tracing; use select(predicate, a, b) "
            "(or accy.cond) instead of Python's if/and/or"
        )

    @property
    def array(self):
        raise AccyError(
            "a traced value has no data while its function is being traced (inside accy.jit, "
            "accy.grad, accy.vmap, a loop body, ...); return it from the function to see its value"
        )

    def __array__(self, dtype=None, copy=None):
        raise AccyError(
            "cannot turn a traced value into a NumPy array while its function is being traced "
            "(inside accy.jit, accy.grad, a loop body, ...); use accy operations on it, or "
            "return it"
        )
