"""`Value`: a value computed in a kernel, and its ops (rows of `accy.kernel.ops.OPS`)."""

from __future__ import annotations

from typing import Protocol

from ...core.types import DType

Number = int | float | bool


class Scope(Protocol):
    """What a value's ops ask of the scope they run in (`accy.kernel.logical.scope.Scope`, which
    builds on this module, has it)."""

    kind: str
    label: str

    def apply(self, op: str, *operands: Value | Number) -> Value: ...

    def cast(self, value: Value, dtype: DType) -> Value: ...


class Value:
    """A value computed in a kernel: one C variable of `dtype`.

    Every op names the scope it runs in (the `inner` of the current `each`); operands may be
    Values or Python numbers, which take the other operand's dtype. The methods below are the
    rows of `accy.kernel.ops.OPS`; `apply` reaches any of them by name.

    >>> import numpy as np
    >>> import accy
    >>> from accy.kernel.examples import map_kernel, run_on_cpu
    >>> def softplus(inner, x):
    ...     return x.exp(inner).log1p(inner)
    >>> kernel = map_kernel("softplus", accy.f64, [accy.f64], softplus, 2)
    >>> run_on_cpu(kernel, np.array([0.0, 1.0])).round(6).tolist()
    [0.693147, 1.313262]
    """

    def __init__(self, var: str, dtype: DType, scope: Scope):
        self.var = var
        self.dtype = dtype
        self.scope = scope

    def __repr__(self) -> str:
        return f"<kernel value {self.var}: {self.dtype.name}>"

    def apply(self, inner: Scope, op: str, *others: Value | Number) -> Value:
        """`op(self, *others)` for any op of `accy.kernel.ops.OPS`, by name."""
        return inner.apply(op, self, *others)

    # arithmetic

    def add(self, inner: Scope, other: Value | Number) -> Value:
        """`self + other`."""
        return inner.apply("add", self, other)

    def sub(self, inner: Scope, other: Value | Number) -> Value:
        """`self - other`."""
        return inner.apply("sub", self, other)

    def mul(self, inner: Scope, other: Value | Number) -> Value:
        """`self * other`."""
        return inner.apply("mul", self, other)

    def div(self, inner: Scope, other: Value | Number) -> Value:
        """`self / other` (integers truncate; a zero divisor gives 0)."""
        return inner.apply("div", self, other)

    def pow(self, inner: Scope, other: Value | Number) -> Value:
        """`self ** other` (floats)."""
        return inner.apply("pow", self, other)

    def max(self, inner: Scope, other: Value | Number) -> Value:
        """The larger of `self` and `other` (NaN wins, as in NumPy)."""
        return inner.apply("max", self, other)

    def min(self, inner: Scope, other: Value | Number) -> Value:
        """The smaller of `self` and `other` (NaN wins)."""
        return inner.apply("min", self, other)

    # unary math

    def neg(self, inner: Scope) -> Value:
        """`-self` (integers wrap)."""
        return inner.apply("neg", self)

    def abs(self, inner: Scope) -> Value:
        """`|self|`."""
        return inner.apply("abs", self)

    def sign(self, inner: Scope) -> Value:
        """-1, 0 or 1 by the sign of `self` (NaN and zeros unchanged)."""
        return inner.apply("sign", self)

    def exp(self, inner: Scope) -> Value:
        """e ** `self`."""
        return inner.apply("exp", self)

    def log(self, inner: Scope) -> Value:
        """The natural logarithm."""
        return inner.apply("log", self)

    def log1p(self, inner: Scope) -> Value:
        """log(1 + `self`), exact near 0."""
        return inner.apply("log1p", self)

    def expm1(self, inner: Scope) -> Value:
        """e ** `self` - 1, exact near 0."""
        return inner.apply("expm1", self)

    def sin(self, inner: Scope) -> Value:
        """The sine."""
        return inner.apply("sin", self)

    def cos(self, inner: Scope) -> Value:
        """The cosine."""
        return inner.apply("cos", self)

    def tan(self, inner: Scope) -> Value:
        """The tangent."""
        return inner.apply("tan", self)

    def tanh(self, inner: Scope) -> Value:
        """The hyperbolic tangent."""
        return inner.apply("tanh", self)

    def logistic(self, inner: Scope) -> Value:
        """1 / (1 + e ** -`self`), without overflow."""
        return inner.apply("logistic", self)

    def sqrt(self, inner: Scope) -> Value:
        """The square root."""
        return inner.apply("sqrt", self)

    def rsqrt(self, inner: Scope) -> Value:
        """1 / sqrt(`self`)."""
        return inner.apply("rsqrt", self)

    def floor(self, inner: Scope) -> Value:
        """Rounded down."""
        return inner.apply("floor", self)

    def ceil(self, inner: Scope) -> Value:
        """Rounded up."""
        return inner.apply("ceil", self)

    def round(self, inner: Scope) -> Value:
        """Rounded to the nearest integer, halves to even."""
        return inner.apply("round", self)

    def logical_not(self, inner: Scope) -> Value:
        """Not `self` (a bool value)."""
        return inner.apply("not", self)

    # comparisons: bool values

    def eq(self, inner: Scope, other: Value | Number) -> Value:
        """`self == other`, as a bool value."""
        return inner.apply("eq", self, other)

    def ne(self, inner: Scope, other: Value | Number) -> Value:
        """`self != other`, as a bool value."""
        return inner.apply("ne", self, other)

    def lt(self, inner: Scope, other: Value | Number) -> Value:
        """`self < other`, as a bool value."""
        return inner.apply("lt", self, other)

    def le(self, inner: Scope, other: Value | Number) -> Value:
        """`self <= other`, as a bool value."""
        return inner.apply("le", self, other)

    def gt(self, inner: Scope, other: Value | Number) -> Value:
        """`self > other`, as a bool value."""
        return inner.apply("gt", self, other)

    def ge(self, inner: Scope, other: Value | Number) -> Value:
        """`self >= other`, as a bool value."""
        return inner.apply("ge", self, other)

    def select(self, inner: Scope, if_true: Value | Number, if_false: Value | Number) -> Value:
        """`if_true` where this bool value holds, else `if_false`."""
        return inner.apply("select", self, if_true, if_false)

    def cast(self, inner: Scope, dtype: DType) -> Value:
        """This value converted to `dtype` as NumPy's `astype` would (floats to ints saturate)."""
        return inner.cast(self, dtype)
