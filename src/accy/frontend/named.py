"""`NamedArray`: an array with axis names, whose operations run eagerly, one op at a time.

`accy.named(array, ("batch", "channel"))` wraps a NumPy or CuPy array (or any DLPack producer).
A NamedArray has the methods and operators of a traced `accy.Value` (`contract`, `sum`,
`rename`, `gather`, `+`, `*`, ...); outside `accy.jit` each of them runs at once as a one-op
program, compiled for the array's device the first time its signature (kind, attributes,
operand types) is seen and cached after that. Inside a traced function the same code records
operations instead, so a model can be debugged eagerly and then jitted unchanged.

Devices (`accy.devices()`): the CPU (NumPy arrays, native code), each CUDA GPU ("cuda:N",
CuPy arrays in its memory) and the reference (NumPy arrays, the NumPy evaluator: no C compiler
involved, handy in tests); wherever a device is asked for, a `Device` or its name.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..api import compile as compile_program
from ..backends.arguments import python_values
from ..backends.base import array_call
from ..backends.devices import CPU, Device, as_device, current_default, holding
from ..backends.dlpack import export_array, host_from_dlpack
from ..caches import Group, Table
from ..core import Attrs, Value, check_operation
from ..core.arrays import is_array
from ..core.builder import Builder
from ..core.indexing import index_by_name
from ..core.operations import OpsApi
from ..core.types import DType, TensorType, bf16, bool_, dtype_of_numpy, f32, i32, i64, u8
from ..core.value import ArrayOps
from ..errors import AccyError, AxisError, DTypeError, InvalidInput
from ..reference import run as reference_run
from ..trace import define
from .errors import DeviceMismatch


def _host_array(array: Any) -> np.ndarray:
    """`array` as a NumPy array (a GPU's arrays are copied to the host)."""
    if isinstance(array, np.ndarray):
        return array
    held = holding(array)
    if held.is_cuda:
        return held.host(array)
    if hasattr(array, "__dlpack__") and not isinstance(array, np.generic):
        return host_from_dlpack(array, "named")  # bfloat16 producers too
    return np.asarray(array)


check_device = as_device  # the one conversion at the door: a Device, or its name


_INTERNED = Table("interned types", "interned_types_max_entries")
_identity = id  # `emit` has a parameter named id


def intern(ty: TensorType) -> TensorType:
    """The one shared TensorType object equal to `ty`: NamedArrays hold interned types, so
    that caches can key on their identity (hashing a TensorType by value is slow). Past its
    bound the oldest are forgotten: an equal type made later is another object, which only
    misses the identity-keyed tables (they keep the types they key on alive)."""
    found = _INTERNED.get(ty)
    return _INTERNED.put(ty, ty) if found is None else found


class NamedArray(ArrayOps):
    """An array whose axes have names: the concrete counterpart of a traced `accy.Value`,
    with the same methods and operators (`accy.core.value.ArrayOps`).

    - `.axes`: the axis names in layout order; `.shape`: a dict from axis name to extent (in
      layout order); `.dtype`: an accy dtype; `.ty`: the `TensorType` (dtype and named axes).
    - `.array`: the underlying NumPy or CuPy array, axes in layout order; `np.asarray(x)` gives
      a NumPy array; `.device` is its `accy.Device` (`accy.device("cpu")`, "cuda:0", ...);
      `.to(device)` moves it.
    - Operations (`x + y`, `x.sum("token")`, `q.contract(k, "channel")`, ...) broadcast by
      name and run eagerly; `x["token", 1:]` and `x["batch", 0]` slice and index by name.

    >>> import accy, numpy as np
    >>> x = accy.named(np.arange(6, dtype=np.float32).reshape(2, 3), ("batch", "channel"))
    >>> x.shape
    {'batch': 2, 'channel': 3}
    >>> x.sum("channel").array.tolist()
    [3.0, 12.0]
    >>> x["channel", 1:].axes, x["batch", 0].array.tolist()
    (('batch', 'channel'), [0.0, 1.0, 2.0])
    """

    __slots__ = ("array", "ty", "device", "__weakref__")

    def __init__(self, array: Any, ty: TensorType, device: Device):
        self.array = array
        self.ty = ty
        self.device = device

    @property
    def builder(self) -> EagerOps:
        """The eager operation library of this array's device (the `ArrayOps` methods call it)."""
        try:
            return EAGER[self.device]
        except KeyError:  # a GPU's first eager operation
            return eager_ops(self.device)

    def to(self, device: str | Device) -> NamedArray:
        """This array on `device` (a Device or its name: "cpu", "cuda:1", "reference"), copied
        there if needed."""
        device = as_device(device)
        if device is self.device:
            return self
        if device.is_cuda and self.device.is_cuda:  # GPU to GPU: no trip through the host
            return NamedArray(device.put(self.array), self.ty, device)
        return NamedArray(device.put(_host_array(self.array)), self.ty, device)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **rest: Any) -> Any:
        """This array's DLPack capsule (`torch.from_dlpack(x)`, `jax.numpy.from_dlpack(x)`)."""
        is_bf16 = self.dtype == bf16
        return export_array(self.array, is_bf16, stream, max_version, rest.get("copy"))

    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack device of this array: its GPU's, or the host (kDLCPU, 0)."""
        if self.device.is_cuda:
            return self.array.__dlpack_device__()
        return (1, 0)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        host = _host_array(self.array)
        return host if dtype is None else host.astype(dtype)

    def block_until_ready(self) -> NamedArray:
        """This array, once the work that computes it has finished (`jax.Array`'s method): a
        GPU call returns when its kernels are queued.

        >>> import accy, numpy as np
        >>> x = accy.named(np.ones(2, np.float32), "i")
        >>> x.block_until_ready() is x
        True
        """
        self.device.synchronize()
        return self

    def item(self) -> Any:
        """The one element of a scalar (rank-0) array, as a Python number."""
        if self.ty.rank != 0:
            raise AxisError(f"item() needs a scalar, but this array has axes {self.ty}")
        return _host_array(self.array).item()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    def __index__(self) -> int:
        """A scalar integer array as a Python index (list indexing, range(), hex())."""
        if self.ty.rank != 0 or self.ty.dtype not in (i32, i64, u8):
            raise DTypeError(
                f"only a scalar integer array is a Python index, but this one is {self.ty}; "
                "convert it with x.convert(accy.i32) or read it with int(x.item())"
            )
        return int(self.item())

    def __bool__(self) -> bool:
        if self.ty.rank != 0:
            raise AxisError(
                f"the truth value of an array with axes ({self.ty}) is ambiguous; reduce it "
                "first: (x > 0).min() is all of it, (x > 0).max() any of it"
            )
        return bool(self.item())

    # Comparisons are elementwise and return bool arrays, as NumPy's and JAX's do (so a
    # NamedArray is not hashable either); an eager scalar's result converts with bool().
    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return self.builder.compare("eq", self, other)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return self.builder.compare("ne", self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"NamedArray({self.ty}, {_host_array(self.array)!r}, device='{self.device}')"

    def __format__(self, spec: str) -> str:
        """The repr, or with a format spec (`f"{loss:.4f}"`) a scalar's value so formatted.

        >>> import accy, numpy as np
        >>> f"{accy.named(np.float32(0.5), ()):.3f}"
        '0.500'
        """
        if not spec:
            return repr(self)
        if self.ty.rank != 0:
            raise AxisError(
                f"the format spec {spec!r} formats a scalar, but the array has axes ({self.ty}); "
                "index or reduce it to a scalar first, or format it with {} (no spec)"
            )
        return format(self.item(), spec)


def named(array: Any, axes: Sequence[str], device: str | Device | None = None) -> NamedArray:
    """Wrap `array` (NumPy, CuPy, a DLPack producer, nested lists or a scalar) as a NamedArray
    with one name per axis, in layout order. `device` defaults to the array's own (the default
    device, `accy.default_device`, for host arrays; its GPU for CuPy); "reference" runs its
    operations on the NumPy evaluator.

    >>> import accy, numpy as np
    >>> w = accy.named(np.ones((2, 3), np.float32), ("input", "output"))
    >>> w
    NamedArray(f32[input=2, output=3], array([[1., 1., 1.],
           [1., 1., 1.]], dtype=float32), device='cpu')
    >>> accy.named(np.ones(3), ("a", "b"))
    Traceback (most recent call last):
    accy.errors.AxisError: named: the array has 1 axis (shape (3,)) but 2 names were ...
    """
    if isinstance(axes, str):
        axes = (axes,)
    axes = tuple(axes)
    if isinstance(array, NamedArray):
        array = array.array
    if isinstance(array, np.ma.MaskedArray):
        raise InvalidInput(
            "named: NumPy masked arrays are not supported (their mask would be dropped); pass "
            "array.filled(value) for the values, and the mask as an array of its own"
        )
    own = holding(array)
    if own.is_host and not isinstance(array, np.ndarray):
        array = _host_array(array) if hasattr(array, "__dlpack__") else np.asarray(array)
    if array.ndim != len(axes):
        raise AxisError(
            f"named: the array has {array.ndim} {'axis' if array.ndim == 1 else 'axes'} "
            f"(shape {tuple(array.shape)}) but {len(axes)} "
            f"{'name was' if len(axes) == 1 else 'names were'} given {axes}; give one name "
            "per axis, in layout order"
        )
    ty = intern(
        TensorType(
            dtype_of_numpy(np.dtype(array.dtype)), tuple(zip(axes, array.shape, strict=True))
        )
    )

    # Host data goes to the default device (accy.default_device); CuPy data stays on its GPU.
    default = None if device is not None else current_default() if own.is_host else own
    device = default or as_device(device)
    if device is not own:
        array = device.put(array if own.is_host else own.host(array))
    return NamedArray(array, ty, device)


def scalar_dtype(value: Any) -> DType:
    """The dtype a Python or NumPy scalar becomes in a traced function: its NumPy dtype, or f32
    for Python floats, i32 for ints and bool for bools (accy promotes nothing silently, so the
    32-bit defaults match the usual parameters)."""
    if isinstance(value, np.generic | np.ndarray):
        return dtype_of_numpy(value.dtype)
    if isinstance(value, bool):
        return bool_
    return i32 if isinstance(value, int) else f32


def named_scalar(value: Any, device: Device = CPU, where: str = "a scalar") -> NamedArray:
    """A rank-0 NamedArray holding the Python or NumPy scalar `value` (see `scalar_dtype`); a
    Python int outside i32 is an `InvalidInput` naming `where`, the value and the range.

    >>> named_scalar(2**40, where="argument[1]")
    Traceback (most recent call last):
    accy.errors.InvalidInput: argument[1]: 1099511627776 has an int that i32[] does not hold ...
    """
    dtype = scalar_dtype(value)
    if isinstance(value, int) and not isinstance(value, bool):  # the one argument rule
        host = python_values(value, TensorType(dtype), where)
    else:
        host = np.asarray(value, dtype.numpy)
    return NamedArray(device.put(host), intern(TensorType(dtype)), device)


# -- eager execution ---------------------------------------------------------------------------


EAGER_TABLES = Group("eager operations", "eager_operations_max_entries")


class EagerOps(OpsApi):
    """The named-axis operation library over NamedArrays of one device: `emit` runs each
    operation at once, as a one-op program compiled (and cached) per signature."""

    def __init__(self, device: Device):
        self.device = device
        # (kind, attrs, ids of the operand types) -> (a weak reference to the call, result
        # types, several, the operand types, kept so that their ids stay theirs); the
        # executables cache owns the calls (`accy.caches`)
        self._by_id: Table = EAGER_TABLES.table()
        self._cache: Table = EAGER_TABLES.table()
        self._created: Table = EAGER_TABLES.table()  # scalar constants, by attributes
        self._scalars: Table = EAGER_TABLES.table()

    def scalar(self, dtype: DType, value: Any):
        """A rank-0 constant; the ones reductions and arithmetic use repeat, so they are kept
        by (dtype, value)."""
        key = (dtype.name, type(value), value, type(value) is float and _is_negative_zero(value))
        try:
            found = self._scalars.get(key)
        except TypeError:  # an unhashable value: the operation library reports it
            return super().scalar(dtype, value)
        if found is None:
            found = self._scalars.put(key, super().scalar(dtype, value))
        return found

    def align(self, kind: str, *values):
        """Operands of one type need no broadcast: skip building the target types."""
        first = values[0].ty
        for v in values:  # a loop, not all(...): a generator costs more than the whole check
            if v.ty is not first:
                return super().align(kind, *values)
        return list(values)

    def emit(self, kind: str, operands: Sequence[Any], attrs=None, id: int | None = None):
        """Run one operation of `kind` on NamedArrays now; returns its NamedArray result(s).

        An operand that is a traced Value sends the operation to that value's trace instead.
        """
        device = self.device
        arrays, key = [], [kind, _attrs_key(attrs)]
        for operand in operands:
            if type(operand) is not NamedArray or operand.device is not device:
                return self._emit_other(kind, operands, attrs)
            arrays.append(operand.array)
            key.append(_identity(operand.ty))
        if not operands:
            created = self._created.get(tuple(key)) if key[1] is not None else None
            if created is None:
                created = self._create(kind, attrs if isinstance(attrs, Attrs) else Attrs(attrs))
                if created.ty.rank == 0 and key[1] is not None:  # splat scalars repeat a lot
                    self._created.put(tuple(key), created)
            return created
        entry = self._by_id.get(tuple(key)) if key[1] is not None else None
        call = None if entry is None else entry[0]()
        if call is None:  # not compiled yet, or released by the executables cache
            entry = self._lookup(kind, attrs, operands, tuple(key))
            call = entry[0]()
        _, result_types, several, _ = entry
        outputs = call(*arrays)
        if not several:
            return NamedArray(outputs[0], result_types[0], device)
        return tuple(NamedArray(o, t, device) for o, t in zip(outputs, result_types, strict=True))

    def _lookup(self, kind: str, attrs: Any, operands: Sequence[Any], fast: tuple) -> tuple:
        """The compiled operation for these operand types: by value, then remembered by the
        identity of the (interned) types for the next call."""
        attrs = attrs if isinstance(attrs, Attrs) else (Attrs(attrs) if attrs else _NO_ATTRS)
        types = tuple(operand.ty for operand in operands)
        entry = self._cache.get((kind, attrs, types))
        if entry is None or entry[0]() is None:
            entry = self._cache.put((kind, attrs, types), self._compile(kind, attrs, types))
        entry = (*entry, types)
        if fast[1] is not None:
            self._by_id.put(fast, entry)
        return entry

    def _emit_other(self, kind: str, operands: Sequence[Any], attrs: Any) -> Any:
        """Operands that are traced values (the operation then belongs to the innermost of
        their traces), or misuse: a non-array operand, or one on another device."""
        traced = [o for o in operands if isinstance(o, Value)]
        if traced:
            inner = max(traced, key=lambda v: getattr(v.builder, "depth", -1))
            return inner.builder.emit(kind, operands, attrs)
        for position, operand in enumerate(operands):
            if not isinstance(operand, NamedArray):
                raise AccyError(f"{kind}: operand {position} ({operand!r}) is not a NamedArray")
            if operand.device != self.device:
                raise DeviceMismatch(
                    f"{kind}: operand {position} is on '{operand.device}' but the operation "
                    f"runs on '{self.device}'; move it with .to('{self.device}')"
                )
        raise AccyError(f"{kind}: internal: unexpected operands {operands!r}")  # unreachable

    def _compile(self, kind: str, attrs: Attrs, types: tuple[TensorType, ...]):
        rule, attrs, result_types = check_operation(kind, types, attrs)
        builder = Builder(f"eager_{kind}")
        parameters = [builder.parameter(t) for t in types]
        result = builder.emit(kind, parameters, attrs)
        program = builder.build(result)
        results = tuple(intern(t) for t in result_types)
        # The executable's call, held weakly: the executables cache decides how long it lives.
        call = array_call(compile_program(program, self.device))
        return weakref.ref(call), results, rule.multiple_results

    def _create(self, kind: str, attrs: Attrs) -> NamedArray:
        """Creation kinds (constants, iota) are evaluated with NumPy, not compiled: their
        attributes hold values, and one compiled program per value would be wasteful."""
        _, attrs, (ty,) = check_operation(kind, (), attrs)
        if kind == "constant" and not is_array(attrs["value"]):
            host = np.full(ty.extents, attrs["value"], ty.dtype.numpy)
        else:
            builder = Builder(f"eager_{kind}")
            host = reference_run(builder.build(builder.emit(kind, [], attrs)), [])[0]
        return NamedArray(self.device.put(host), intern(ty), self.device)

    def subprogram(self, name: str, specs: Sequence[TensorType], body):
        return define(name, specs, body)


_NO_ATTRS = Attrs()


def _attrs_key(attrs: Any) -> Any:
    """A cheap hashable stand-in for `attrs` (a dict of plain values, as the operation library
    passes them), or None when its values do not hash (lists): then `Attrs` normalizes them."""
    if not attrs:
        return ()  # hashed in C (an `Attrs` hashes in Python)
    if type(attrs) is not dict and isinstance(attrs, Attrs):  # (an ABC's isinstance is slow)
        return attrs
    key = tuple(attrs.items())
    try:
        hash(key)
    except TypeError:
        return None
    for _, value in key:  # a loop, not any(...): every eager operation passes here
        if type(value) is float and _is_negative_zero(value):
            return (*key, "-0.0")  # -0.0 == 0.0 in Python; as a constant it is another number
    return key


def _is_negative_zero(value: Any) -> bool:
    """Whether `value` is the float -0.0 (which compares and hashes equal to 0.0)."""
    return type(value) is float and value == 0.0 and math.copysign(1.0, value) < 0


EAGER: dict[Device, EagerOps] = {}


def eager_ops(device: Device) -> EagerOps:
    """The eager operation library of `device` (made on first use: one per GPU too)."""
    return EAGER.setdefault(device, EagerOps(device))


__all__ = [
    "EAGER",
    "EagerOps",
    "NamedArray",
    "check_device",
    "index_by_name",
    "named",
    "named_scalar",
]
