"""`ConstantArray`: the elements of a non-splat constant, held as one read-only NumPy array.

A constant operation holds either one Python scalar (a splat: every element equal) or a
`ConstantArray`. The array is C-contiguous, read-only and already rounded to the constant's
dtype, and it is hashed and compared by content (dtype, shape and bytes), so that two traces of
the same function give equal attributes and passes that re-emit a program copy one reference,
never one Python object per element.

Its text form (`text`) is exact and parses back to the same bytes: a flat list of literals when
the array is small (readable in golden tests), else `base64"..."`, the little-endian bytes of
the elements (compact: a 1024 x 1024 f32 mask is 5.6 MB of text, not 20).
"""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any

import numpy as np

from ..errors import DTypeError
from .types import DType, bf16, bool_, round_to_bf16

LIST_LIMIT = 16
"""Arrays of at most this many elements print as a list of literals; larger ones as base64."""


class ConstantArray:
    """The elements of a constant of `dtype` (see the module doc).

    >>> import numpy as np, accy
    >>> a = ConstantArray.of([[1, 2], [3, 4]], accy.f32, (2, 2))
    >>> a.array.flags.writeable, a == ConstantArray.of(np.arange(1, 5), accy.f32, (2, 2))
    (False, True)
    >>> a.text()
    '[1.0, 2.0, 3.0, 4.0]'
    """

    __slots__ = ("array", "dtype", "_digest")

    def __init__(self, array: np.ndarray, dtype: DType):
        if array.flags.writeable or not array.flags.c_contiguous:
            raise ValueError("internal: a ConstantArray holds a read-only C-contiguous array")
        self.array = array
        self.dtype = dtype
        self._digest: bytes | None = None

    @classmethod
    def of(cls, values: Any, dtype: DType, shape: tuple[int, ...]) -> ConstantArray:
        """`values` (an array, nested lists or a flat sequence of `prod(shape)` elements) as a
        constant of `dtype`: floats rounded to `dtype` (beyond its range: ±inf, as NumPy casts),
        integers checked to be whole and in range.

        >>> import accy
        >>> ConstantArray.of([1e39], accy.f32, (1,)).array.tolist()
        [inf]
        >>> ConstantArray.of([300], accy.u8, (1,))
        Traceback (most recent call last):
        accy.errors.DTypeError: constant values [300, 300] do not fit in u8
        """
        source = np.asarray(values)
        if source.dtype == object:
            raise DTypeError(f"a constant's values must be numbers, got {values!r:.80}")
        if source.size != math.prod(shape):
            raise DTypeError(
                f"constant: {source.size} values given for shape {shape}, "
                f"which has {math.prod(shape)} elements"
            )
        _check_fits(source, dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            if dtype == bf16:  # through f32, as bf16 literals and the reference round
                held = round_to_bf16(source.astype(np.float32)).astype(dtype.numpy)
            else:
                held = source.astype(dtype.numpy)  # always a copy: the caller keeps its array
        held = np.ascontiguousarray(held).reshape(shape)
        held.flags.writeable = False
        return cls(held, dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def size(self) -> int:
        return self.array.size

    @property
    def digest(self) -> bytes:
        """A blake2b digest of dtype, shape and bytes, computed once (what equality compares)."""
        if self._digest is None:
            h = hashlib.blake2b(digest_size=20)
            h.update(f"{self.dtype.name}{self.shape}".encode())
            h.update(self.array.reshape(-1).view(np.uint8))  # bytes as they are (bf16 too)
            self._digest = h.digest()
        return self._digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstantArray) and self.digest == other.digest

    def __repr__(self) -> str:
        return f"ConstantArray({self.dtype.name}{list(self.shape)}, {self.digest.hex()[:12]})"

    def raw_bytes(self) -> bytes:
        """The elements' little-endian bytes, in row-major order."""
        return self.array.astype(self.array.dtype.newbyteorder("<"), copy=False).tobytes()

    @classmethod
    def from_bytes(cls, payload: bytes, dtype: DType, shape: tuple[int, ...]) -> ConstantArray:
        """The inverse of `raw_bytes` (the base64 text form)."""
        expected = math.prod(shape) * dtype.numpy.itemsize
        if len(payload) != expected:
            raise DTypeError(
                f"constant: {len(payload)} bytes given for {dtype.name}{list(shape)}, "
                f"which needs {expected}"
            )
        array = np.frombuffer(payload, dtype.numpy.newbyteorder("<")).astype(dtype.numpy)
        return cls.of(array, dtype, shape)

    def text(self) -> str:
        """The exact text form: `[literal, ...]` up to `LIST_LIMIT` elements, else base64."""
        if self.size > LIST_LIMIT:
            return 'base64"' + base64.b64encode(self.raw_bytes()).decode("ascii") + '"'
        return "[" + ", ".join(_literal(x, self.dtype) for x in self.array.ravel()) + "]"


def _check_fits(source: np.ndarray, dtype: DType) -> None:
    """Integer and bool constants must hold whole numbers in range (floats round instead)."""
    if dtype.is_float or source.size == 0:
        return
    whole = np.isfinite(source) & (source == np.round(source)) if source.dtype.kind == "f" else None
    if whole is not None and not whole.all():
        bad = source[~whole].ravel()[0].item()
        raise DTypeError(f"constant {bad!r} is not an integer but the dtype is {dtype}")
    if dtype == bool_:
        return
    info = np.iinfo(dtype.numpy)
    low, high = source.min(), source.max()
    if low < info.min or high > info.max:
        raise DTypeError(
            f"constant values [{low.item()}, {high.item()}] do not fit in {dtype.name}"
        )


def _literal(x: np.generic, dtype: DType) -> str:
    """One element as the text form's literal, exact for `dtype`: the shortest decimal that
    reads back to the same value when it does, else the float's full repr."""
    if dtype == bool_:
        return "true" if x else "false"
    if not dtype.is_float:
        return str(int(x))
    value = float(x)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    short = repr(float(str(x))) if dtype != bf16 else repr(value)
    return short if float(np.array(float(short)).astype(dtype.numpy)) == value else repr(value)


def is_array(value: Any) -> bool:
    """Whether a constant's `value` attribute is an array (not a splat scalar).

    >>> import accy
    >>> is_array(1.0), is_array(ConstantArray.of([1, 2], accy.i32, (2,)))
    (False, True)
    """
    return isinstance(value, ConstantArray)
