"""`NamedArray`: an array with axis names, whose operations run eagerly, one op at a time.

`accy.named(array, ("batch", "channel"))` wraps a NumPy or CuPy array (or any DLPack producer).
A NamedArray has the methods and operators of a traced `accy.Value` (`contract`, `sum`,
`rename`, `gather`, `+`, `*`, ...); outside `accy.jit` each of them runs at once as a one-op
program, compiled for the array's device the first time its signature (kind, attributes,
operand types) is seen and cached after that. Inside a traced function the same code records
operations instead, so a model can be debugged eagerly and then jitted unchanged.

Devices: "cpu" (NumPy arrays, native code), "cuda" (CuPy arrays) and "reference" (NumPy
arrays, the NumPy evaluator: no C compiler involved, handy in tests).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..api import compile as compile_program
from ..backends.dlpack import host_from_dlpack
from ..core import Attrs, Value, check_operation
from ..core.arrays import is_array
from ..core.builder import Builder
from ..core.operations import OpsApi
from ..core.types import DType, TensorType, bool_, dtype_of_numpy, f32, i32
from ..errors import AccyError, AxisError, RuntimeUnavailable
from .errors import DeviceMismatch

DEVICES = ("cpu", "cuda", "reference")


def _device_of(array: Any) -> str:
    return "cuda" if type(array).__module__.split(".")[0] == "cupy" else "cpu"


def _host_array(array: Any) -> np.ndarray:
    """`array` as a NumPy array (CuPy arrays are copied to the host)."""
    if isinstance(array, np.ndarray):
        return array
    if _device_of(array) == "cuda":
        return array.get()
    if hasattr(array, "__dlpack__") and not isinstance(array, np.generic):
        return host_from_dlpack(array, "named")  # bfloat16 producers too
    return np.asarray(array)


def _on_device(array: np.ndarray, device: str) -> Any:
    if device == "cuda":
        try:
            import cupy  # an optional dependency: accy[cuda]
        except ImportError:
            raise RuntimeUnavailable(
                "device 'cuda' needs CuPy (pip install 'accy[cuda]'), which is not installed"
            ) from None
        return cupy.asarray(array)
    return array


def check_device(device: str) -> str:
    """`device`, checked, as the one string object of DEVICES: the eager and jit fast paths
    compare devices by identity, and a device name built at run time (read from a command
    line) is an equal but distinct object."""
    if device not in DEVICES:
        raise AccyError(f"unknown device {device!r}; the devices are {', '.join(DEVICES)}")
    return DEVICES[DEVICES.index(device)]


_INTERNED: dict[TensorType, TensorType] = {}
_identity = id  # `emit` has a parameter named id


def intern(ty: TensorType) -> TensorType:
    """The one shared TensorType object equal to `ty`: NamedArrays hold interned types, so
    that caches can key on their identity (hashing a TensorType by value is slow)."""
    return _INTERNED.setdefault(ty, ty)


class NamedArray:
    """An array whose axes have names: the concrete counterpart of a traced `accy.Value`.

    - `.axes`: the axis names in layout order; `.shape`: a dict from axis name to extent (in
      layout order); `.dtype`: an accy dtype; `.ty`: the `TensorType` (dtype and named axes).
    - `.array`: the underlying NumPy or CuPy array, axes in layout order; `np.asarray(x)` gives
      a NumPy array; `.device` is "cpu", "cuda" or "reference"; `.to(device)` moves it.
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
    __array_priority__ = 100  # so that `np.float32(2) * x` defers to NamedArray.__rmul__

    def __init__(self, array: Any, ty: TensorType, device: str):
        self.array = array
        self.ty = ty
        self.device = device

    @property
    def builder(self) -> EagerOps:
        """The eager operation library of this array's device (the `Value` methods call it)."""
        return EAGER[self.device]

    @property
    def dtype(self) -> DType:
        """The accy dtype of the elements (accy.f32, accy.i32, ...)."""
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

    def to(self, device: str) -> NamedArray:
        """This array on `device` ("cpu", "cuda" or "reference"), copied there if needed."""
        device = check_device(device)
        if device is self.device:
            return self
        return NamedArray(_on_device(_host_array(self.array), device), self.ty, device)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        host = _host_array(self.array)
        return host if dtype is None else host.astype(dtype)

    def item(self) -> Any:
        """The one element of a scalar (rank-0) array, as a Python number."""
        if self.ty.rank != 0:
            raise AxisError(f"item() needs a scalar, but this array has axes {self.ty}")
        return _host_array(self.array).item()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
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
        return f"NamedArray({self.ty}, {_host_array(self.array)!r}, device={self.device!r})"

    def __getitem__(self, key: Any) -> NamedArray:
        return index_by_name(self.builder, self, key)


def _copy_value_methods() -> None:
    """Give NamedArray the operations of `Value`: they only use `self.builder` and `self.ty`,
    and a NamedArray's builder (`EagerOps`) runs each operation as it is asked for."""
    skipped = {"__init__", "__repr__", "__bool__", "__slots__", "__module__", "__doc__"}
    for name, member in vars(Value).items():
        if name in skipped or name in vars(NamedArray) or name in Value.__slots__:
            continue
        if callable(member) or isinstance(member, property):
            setattr(NamedArray, name, member)


def named(array: Any, axes: Sequence[str], device: str | None = None) -> NamedArray:
    """Wrap `array` (NumPy, CuPy, a DLPack producer, nested lists or a scalar) as a NamedArray
    with one name per axis, in layout order. `device` defaults to the array's own ("cpu" for
    host arrays, "cuda" for CuPy); "reference" runs its operations on the NumPy evaluator.

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
    own = _device_of(array)
    if own != "cuda" and not isinstance(array, np.ndarray):
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

    device = check_device(device or own)
    if device == "cuda" and own != "cuda":
        array = _on_device(array, device)
    elif device != "cuda" and own == "cuda":
        array = _host_array(array)
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


def named_scalar(value: Any, device: str = "cpu") -> NamedArray:
    """A rank-0 NamedArray holding the Python or NumPy scalar `value` (see `scalar_dtype`)."""
    dtype = scalar_dtype(value)
    host = np.asarray(value, dtype.numpy)
    return NamedArray(_on_device(host, device), intern(TensorType(dtype)), device)


# -- eager execution ---------------------------------------------------------------------------


class EagerOps(OpsApi):
    """The named-axis operation library over NamedArrays of one device: `emit` runs each
    operation at once, as a one-op program compiled (and cached) per signature."""

    def __init__(self, device: str):
        self.device = device
        # (kind, attrs, ids of the operand types) -> (call, result types, several, the
        # operand types, kept so that their ids stay theirs)
        self._by_id: dict[tuple, tuple[Any, tuple[TensorType, ...], bool, tuple]] = {}
        self._cache: dict[tuple, tuple[Any, tuple[TensorType, ...], bool]] = {}
        self._created: dict[tuple, NamedArray] = {}  # scalar constants, by attributes
        self._scalars: dict[tuple, NamedArray] = {}

    def scalar(self, dtype: DType, value: Any):
        """A rank-0 constant; the ones reductions and arithmetic use repeat, so they are kept
        by (dtype, value)."""
        key = (dtype.name, type(value), value, _is_negative_zero(value))
        try:
            found = self._scalars.get(key)
        except TypeError:  # an unhashable value: the operation library reports it
            return super().scalar(dtype, value)
        if found is None:
            found = super().scalar(dtype, value)
            if len(self._scalars) > 4096:
                self._scalars.clear()
            self._scalars[key] = found
        return found

    def align(self, kind: str, *values):
        """Operands of one type need no broadcast: skip building the target types."""
        first = values[0].ty
        if all(v.ty is first for v in values):
            return list(values)
        return super().align(kind, *values)

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
                    if len(self._created) > 4096:  # many distinct values: start afresh
                        self._created.clear()
                    self._created[tuple(key)] = created
            return created
        entry = self._by_id.get(tuple(key)) if key[1] is not None else None
        if entry is None:
            entry = self._lookup(kind, attrs, operands, tuple(key))
        call, result_types, several, _ = entry
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
        if entry is None:
            entry = self._cache[(kind, attrs, types)] = self._compile(kind, attrs, types)
        entry = (*entry, types)
        if fast[1] is not None:
            self._by_id[fast] = entry
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
                    f"{kind}: operand {position} is on {operand.device!r} but the operation "
                    f"runs on {self.device!r}; move it with .to({self.device!r})"
                )
        raise AccyError(f"{kind}: internal: unexpected operands {operands!r}")  # unreachable

    def _compile(self, kind: str, attrs: Attrs, types: tuple[TensorType, ...]):
        rule, attrs, result_types = check_operation(kind, types, attrs)
        builder = Builder(f"eager_{kind}")
        parameters = [builder.parameter(t) for t in types]
        result = builder.emit(kind, parameters, attrs)
        program = builder.build(result)
        results = tuple(intern(t) for t in result_types)
        return compile_program(program, self.device), results, rule.multiple_results

    def _create(self, kind: str, attrs: Attrs) -> NamedArray:
        """Creation kinds (constants, iota) are evaluated with NumPy, not compiled: their
        attributes hold values, and one compiled program per value would be wasteful."""
        _, attrs, (ty,) = check_operation(kind, (), attrs)
        if kind == "constant" and not is_array(attrs["value"]):
            host = np.full(ty.extents, attrs["value"], ty.dtype.numpy)
        else:
            from ..reference import run as reference_run

            builder = Builder(f"eager_{kind}")
            host = reference_run(builder.build(builder.emit(kind, [], attrs)), [])[0]
        return NamedArray(_on_device(host, self.device), intern(ty), self.device)

    def subprogram(self, name: str, specs: Sequence[TensorType], body):
        from ..core.builder import define

        return define(name, specs, body)


_NO_ATTRS = Attrs()


def _attrs_key(attrs: Any) -> Any:
    """A cheap hashable stand-in for `attrs` (a dict of plain values, as the operation library
    passes them), or None when its values do not hash (lists): then `Attrs` normalizes them."""
    if not attrs:
        return _NO_ATTRS
    if isinstance(attrs, Attrs):
        return attrs
    key = tuple(attrs.items())
    try:
        hash(key)
    except TypeError:
        return None
    if any(_is_negative_zero(value) for _, value in key):
        return (*key, "-0.0")  # -0.0 == 0.0 in Python; as a constant it is another number
    return key


def _is_negative_zero(value: Any) -> bool:
    """Whether `value` is the float -0.0 (which compares and hashes equal to 0.0)."""
    return type(value) is float and value == 0.0 and math.copysign(1.0, value) < 0


EAGER: dict[str, EagerOps] = {device: EagerOps(device) for device in DEVICES}


# -- indexing by name --------------------------------------------------------------------------


def _index_pairs(x: Any, key: Any) -> list[tuple[str, Any]]:
    """`x["token", 1:]`, `x["token", 1:, "batch", 0]` or `x[{"token": slice(1, None)}]` as
    (axis, index) pairs."""
    if isinstance(key, Mapping):
        return list(key.items())
    if (
        not isinstance(key, tuple)
        or len(key) % 2
        or not all(isinstance(name, str) for name in key[::2])
    ):
        raise AxisError(
            f"index {key!r}: index by axis name, as x['token', 1:], x['batch', 0], "
            f"x['token', 1:, 'batch', 0] or x[{{'token': slice(1, None)}}]; the axes of {x.ty} "
            f"are {', '.join(x.ty.axes) or '(none, it is a scalar)'}"
        )
    return list(zip(key[::2], key[1::2], strict=True))


def index_by_name(ops: OpsApi, x: Any, key: Any) -> Any:
    """Slice (`start:stop:step`) or index (an int, which removes the axis) `x` along named axes.

    >>> import accy, numpy as np
    >>> x = accy.named(np.arange(12).reshape(3, 4).astype(np.float32), ("row", "col"))
    >>> x["col", ::2, "row", -1].array.tolist()
    [8.0, 10.0]
    """
    for axis, index in _index_pairs(x, key):
        if not x.ty.has(axis):
            raise AxisError(
                f"index: axis {axis!r} is not on {x.ty}; its axes are "
                f"{', '.join(x.ty.axes) or '(none, it is a scalar)'}"
            )
        extent = x.ty.extent(axis)
        if isinstance(index, slice):
            start, stop, step = index.indices(extent)
            if step < 0:
                raise AxisError(f"index: axis {axis!r}: negative steps are not supported")
            x = ops.slice(x, axis, start, max(start, stop), step)
        elif isinstance(index, int | np.integer) and not isinstance(index, bool):
            position = int(index) + extent if index < 0 else int(index)
            if not 0 <= position < extent:
                raise AxisError(
                    f"index: {int(index)} is out of range for axis {axis!r} of extent {extent}"
                )
            x = ops.slice(x, axis, position, position + 1)
            x = ops.reshape(x, x.ty.without([axis]).named_extents)
        else:
            raise AxisError(
                f"index: axis {axis!r} takes an int or a slice, got {index!r}; gather with "
                "x.gather(indices, axis) picks rows by an index array"
            )
    return x


_copy_value_methods()

__all__ = [
    "EAGER",
    "EagerOps",
    "NamedArray",
    "check_device",
    "index_by_name",
    "named",
    "named_scalar",
]
