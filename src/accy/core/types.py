"""Tensor types with named axes.

A type is a dtype plus an ordered tuple of (axis name, extent). The order is the physical,
row-major layout; it never changes the meaning of a program. Names are identifiers, unique
within a type. Rank 0 is a scalar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..errors import AxisError, DTypeError


@dataclass(frozen=True)
class DType:
    """An element type. `numpy` is the NumPy dtype used by the reference evaluator."""

    name: str
    numpy: np.dtype
    is_float: bool
    itemsize: int

    def __repr__(self) -> str:
        return f"accy.{self.name}"

    def __eq__(self, other: object) -> bool:
        # The dataclass's comparison, after an identity check: every binary operation compares
        # its operands' dtypes, and the comparison builds and compares two tuples of fields.
        if self is other:
            return True
        if type(other) is not DType:
            return NotImplemented
        fields = (self.name, self.numpy, self.is_float, self.itemsize)
        return fields == (other.name, other.numpy, other.is_float, other.itemsize)

    def __ne__(self, other: object) -> bool:
        # Its own, as object's `!=` through `__eq__` costs three times as much.
        if self is other:
            return False
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __reduce__(self) -> tuple:
        # Pickled by name: an unpickled dtype is the module's own object (f32 is f32), and a
        # pickled program or plan does not carry NumPy dtypes along.
        return dtype_named, (self.name,)

    def __str__(self) -> str:
        return self.name


f32 = DType("f32", np.dtype(np.float32), True, 4)
f64 = DType("f64", np.dtype(np.float64), True, 8)
f16 = DType("f16", np.dtype(np.float16), True, 2)
# NumPy has no bfloat16 of its own: bf16 arrays are `ml_dtypes.bfloat16` (the type JAX uses), whose
# 16 bits are the upper half of a float32, so raw buffers and native code read them as they are.
bf16 = DType("bf16", np.dtype(ml_dtypes.bfloat16), True, 2)
i32 = DType("i32", np.dtype(np.int32), False, 4)
i64 = DType("i64", np.dtype(np.int64), False, 8)
u8 = DType("u8", np.dtype(np.uint8), False, 1)
bool_ = DType("bool", np.dtype(np.bool_), False, 1)

DTYPES: dict[str, DType] = {d.name: d for d in (f32, f64, f16, bf16, i32, i64, u8, bool_)}


# The float8 formats of FP8 GEMMs (`accy.nn.fp8_matmul`), named as in JAX and ml_dtypes. They
# are storage formats of that operation's quantised operands, not element types of traced
# values: no other operation takes them (`check_not_float8`), so they stay out of `DTYPES`.
float8_e4m3fn = DType("float8_e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn), True, 1)
float8_e5m2 = DType("float8_e5m2", np.dtype(ml_dtypes.float8_e5m2), True, 1)


@dataclass(frozen=True)
class Float8Format:
    """A float8 format's numbers: its largest finite value, the mantissa bits it keeps and the
    exponent of its smallest normal value (below it, subnormals step by 2^(min_exponent -
    mantissa_bits))."""

    dtype: DType
    max: float
    mantissa_bits: int
    min_exponent: int


FLOAT8: dict[str, Float8Format] = {
    "float8_e4m3fn": Float8Format(float8_e4m3fn, 448.0, 3, -6),
    "float8_e5m2": Float8Format(float8_e5m2, 57344.0, 2, -14),
}


def float8_format(dtype: DType | str) -> Float8Format:
    """The `Float8Format` of a float8 dtype (or its name).

    >>> float8_format(float8_e4m3fn).max, float8_format("float8_e5m2").mantissa_bits
    (448.0, 2)
    """
    name = dtype.name if isinstance(dtype, DType) else dtype
    if name not in FLOAT8:
        raise DTypeError(
            f"{dtype!r} is not a float8 format; the float8 formats are {', '.join(FLOAT8)}"
        )
    return FLOAT8[name]


def saturate_to_float8(x: np.ndarray, dtype: DType | str) -> np.ndarray:
    """`x` rounded to the float8 format `dtype` (to nearest, ties to even), saturating: values
    beyond the largest finite one, infinities included, become it, as cuBLASLt's and
    Transformer Engine's casts do (a plain `astype` makes them NaN); NaN stays NaN.

    >>> saturate_to_float8(np.array([1000.0, -np.inf, 0.3], np.float32), float8_e4m3fn).tolist()
    [448.0, -448.0, 0.3125]
    """
    limit = float8_format(dtype).max
    clipped = np.clip(np.asarray(x, np.float32), -limit, limit)
    return clipped.astype(float8_format(dtype).dtype.numpy)


def check_not_float8(kind: str, types: tuple[TensorType, ...]) -> None:
    """Raise `DTypeError` if one of `types` has a float8 dtype: operation `kind` does not take
    them (only `accy.nn.fp8_matmul` quantises to float8, inside itself).

    >>> try:
    ...     check_not_float8("add", (spec(float8_e4m3fn, n=2),))
    ... except DTypeError as error:
    ...     print(str(error).split(":")[0])
    add does not take float8_e4m3fn[n=2]
    """
    for t in types:  # every checked operation comes here: the itemsize test first, as cheap
        if t.dtype.itemsize == 1 and t.dtype.name in FLOAT8:
            raise DTypeError(_float8_refusal(f"{kind} does not take {t}"))


def _float8_refusal(what: str) -> str:
    return (
        f"{what}: float8 is a storage format of accy.nn.fp8_matmul (FP8 GEMMs with per-tensor "
        "scaling), not a dtype of values; keep values in bf16 or f32 and multiply them with "
        "accy.nn.fp8_matmul(x, w, axes)"
    )


def dtype_named(name: str) -> DType:
    if name in FLOAT8:
        raise DTypeError(_float8_refusal(f"a value of dtype {name}"))
    if name not in DTYPES:
        raise DTypeError(f"unknown dtype {name!r}; the dtypes are {', '.join(DTYPES)}")
    return DTYPES[name]


def dtype_of_numpy(dtype: np.dtype) -> DType:
    """The accy dtype whose arrays NumPy holds as `dtype` (`ml_dtypes.bfloat16` maps to bf16).

    >>> import ml_dtypes, numpy as np
    >>> dtype_of_numpy(np.dtype(ml_dtypes.bfloat16)), dtype_of_numpy(np.dtype(np.float32))
    (accy.bf16, accy.f32)
    """
    for d in DTYPES.values():
        if d.numpy == dtype:
            return d
    raise DTypeError(f"NumPy dtype {dtype} has no accy dtype; use one of {', '.join(DTYPES)}")


MAX_ELEMENTS = 2**60  # so that offsets in bytes of the widest dtype fit in a signed 64-bit int
# Axes already found valid: tracing and transforming a large program make tens of thousands of
# types over a few hundred distinct axes, and checking each again cost a second of GPT-2's
# cold start. Bounded, so that a long-running process cannot grow it without end.
_VALID_AXES: set[tuple] = set()
_VALID_AXES_LIMIT = 65_536


@dataclass(frozen=True, init=False)
class TensorType:
    """A dtype and named axes in layout order: `TensorType(f32, (("token", 4), ("channel", 3)))`."""

    dtype: DType
    named_extents: tuple[tuple[str, int], ...] = ()

    def __init__(self, dtype: DType, named_extents: tuple[tuple[str, int], ...] = ()):
        # Hashed once: types key the caches a call looks up (a training step's few hundred
        # arguments, on every call), and the dataclass's hash walked every axis each time. One
        # update of the instance's dict, not a frozen dataclass's setattr per field: tracing
        # and transforming a GPT-2 step makes some 30,000 types.
        self.__dict__.update(
            dtype=dtype, named_extents=named_extents, _hash=hash((dtype, named_extents))
        )
        # 2.0 and True equal 2 and 1, so a hit counts only where every extent is an int.
        if named_extents in _VALID_AXES and all(type(extent) is int for _, extent in named_extents):
            return
        self._check_axes()

    def _check_axes(self) -> None:
        names = [name for name, _ in self.named_extents]
        for name, extent in self.named_extents:
            if not isinstance(name, str) or not (name.isascii() and name.isidentifier()):
                raise AxisError(
                    f"axis name {name!r} is not an identifier (ASCII letters, digits and _, "
                    "not starting with a digit)"
                )
            if not isinstance(extent, int | np.integer) or isinstance(extent, bool) or extent < 0:
                raise AxisError(f"axis {name!r} has extent {extent!r}; extents are ints >= 0")
        elements = 1
        for _, extent in self.named_extents:
            elements *= int(extent)
        if elements > MAX_ELEMENTS:
            raise AxisError(
                f"a tensor of {elements} elements ({dict(self.named_extents)}) is too large: "
                f"byte offsets must fit in 64 bits (at most {MAX_ELEMENTS} elements)"
            )
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise AxisError(
                f"axis names must be unique within a type, but {', '.join(duplicates)} "
                f"appears more than once in {names}"
            )
        if len(_VALID_AXES) < _VALID_AXES_LIMIT:
            _VALID_AXES.add(self.named_extents)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        # Rebuilt through __init__ when unpickled, so the hash is the new process's own
        # (a string's hash differs between processes).
        return (TensorType, (self.dtype, self.named_extents))

    @property
    def axes(self) -> tuple[str, ...]:
        """Axis names in layout order."""
        return tuple(name for name, _ in self.named_extents)

    @property
    def extents(self) -> tuple[int, ...]:
        """Extents in layout order (NumPy's `shape`)."""
        return tuple(int(extent) for _, extent in self.named_extents)

    @property
    def shape(self) -> dict[str, int]:
        """Axis name to extent."""
        return {name: int(extent) for name, extent in self.named_extents}

    @property
    def rank(self) -> int:
        return len(self.named_extents)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.extents)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def extent(self, axis: str) -> int:
        return self.shape[axis]

    def position(self, axis: str) -> int:
        return self.axes.index(axis)

    def has(self, axis: str) -> bool:
        return axis in self.axes

    def axes_not_in(self, other: TensorType) -> tuple[str, ...]:
        """This type's axes that `other` lacks, in this type's order."""
        return tuple(a for a in self.axes if not other.has(a))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.named_extents)

    def with_axes(self, named_extents) -> TensorType:
        return TensorType(self.dtype, tuple((n, int(e)) for n, e in named_extents))

    def without(self, axes) -> TensorType:
        drop = set(axes)
        return self.with_axes((n, e) for n, e in self.named_extents if n not in drop)

    def __str__(self) -> str:
        inner = ", ".join(f"{name}={extent}" for name, extent in self.named_extents)
        return f"{self.dtype.name}[{inner}]"

    def __repr__(self) -> str:
        return f"<{self}>"


def spec(dtype: DType, shape: dict[str, int] | None = None, /, **axes: int) -> TensorType:
    """A tensor type from a dtype and named extents, in layout order.

    >>> import accy
    >>> accy.spec(accy.f32, token=4, channel=3)
    <f32[token=4, channel=3]>
    >>> accy.spec(accy.i32, {"token": 4}).extents
    (4,)
    """
    if not isinstance(dtype, DType):
        raise DTypeError(f"spec needs an accy dtype such as accy.f32 first, got {dtype!r}")
    if shape is not None and not isinstance(shape, dict):
        raise AxisError(
            f"spec takes its extents by axis name (a dict or keywords: spec(f32, token=4)), "
            f"got {shape!r}"
        )
    named = dict(shape or {})
    for name, extent in axes.items():
        if name in named:
            raise AxisError(f"axis {name!r} is given twice to spec")
        named[name] = extent
    return TensorType(dtype, tuple(named.items()))


HALF_FLOATS = (f16, bf16)
"""The 16-bit floats: stored in 16 bits, computed in float32 (`compute_dtype`)."""


def compute_dtype(dtype: DType) -> DType:
    """The dtype arithmetic on `dtype` is carried out in: f32 for f16 and bf16, else itself.

    Every backend computes a half-precision operation in float32 and rounds its result once
    (the reference evaluator included), so the compute dtype is part of the semantics.

    >>> compute_dtype(bf16), compute_dtype(f64)
    (accy.f32, accy.f64)
    """
    return f32 if dtype in HALF_FLOATS else dtype


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept in float32.

    The same rounding as `x.astype(ml_dtypes.bfloat16)`, for code that keeps float32 arrays.

    >>> round_to_bf16(np.array([1 + 2**-9, 257.0], np.float32)).tolist()
    [1.0, 256.0]
    """
    # ascontiguousarray makes 0-d arrays 1-d: keep the shape of `x`.
    shape = np.shape(x)
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    rounded = np.where(
        np.isnan(bits.view(np.float32)), bits, (bits + rounding) & np.uint32(0xFFFF0000)
    )
    return rounded.astype(np.uint32).view(np.float32).reshape(shape)
