"""Host arrays from DLPack producers, bfloat16 included.

`numpy.from_dlpack` reads every DLPack dtype NumPy has, but not bfloat16 (DLPack's `kDLBfloat`),
which is what a PyTorch or JAX bf16 CPU tensor exports. For those, `host_from_dlpack` reads the
producer's `DLManagedTensor` itself and copies the elements into an `ml_dtypes.bfloat16` array
(then releases the producer's tensor, as a consumer must). Everything else goes through NumPy
without a copy. Every failure is an `InvalidInput` naming the argument.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..core.types import bf16
from ..errors import InvalidInput

KDL_CPU, KDL_CUDA_HOST = 1, 3
KDL_BFLOAT = 4
CAPSULE, USED_CAPSULE = b"dltensor", b"used_dltensor"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]


def _capi(name: str, restype):
    """A function of CPython's capsule API, taking (capsule, name)."""
    function = getattr(ctypes.pythonapi, name)
    function.restype, function.argtypes = restype, [ctypes.py_object, ctypes.c_char_p]
    return function


_capsule_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p)
_capsule_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int)
_capsule_rename = _capi("PyCapsule_SetName", ctypes.c_int)


def host_from_dlpack(value: Any, at: str) -> np.ndarray:
    """A DLPack producer's host array as NumPy: without a copy through `numpy.from_dlpack`, or,
    for bfloat16 (which NumPy cannot import), copied into an `ml_dtypes.bfloat16` array.

    >>> host_from_dlpack(np.arange(3.0), "x").tolist()
    [0.0, 1.0, 2.0]
    """
    try:
        return np.from_dlpack(value)
    except (TypeError, RuntimeError, BufferError, ValueError) as error:
        numpy_error = error
    copied = _bfloat16_copy(value, at)
    if copied is None:
        raise InvalidInput(f"{at}: cannot read this DLPack array on the CPU ({numpy_error})")
    return copied


def _bfloat16_copy(value: Any, at: str) -> np.ndarray | None:
    """The producer's bfloat16 host tensor copied into NumPy, or None if it is not one."""
    try:
        capsule = value.__dlpack__()
    except (TypeError, RuntimeError, BufferError, ValueError):
        return None
    if not _capsule_is_valid(capsule, CAPSULE):
        return None
    managed = DLManagedTensor.from_address(_capsule_pointer(capsule, CAPSULE))
    tensor = managed.dl_tensor
    dtype = tensor.dtype
    if (dtype.code, dtype.bits, dtype.lanes) != (KDL_BFLOAT, 16, 1):
        return None  # the capsule is released by its destructor, unconsumed
    if tensor.device.device_type not in (KDL_CPU, KDL_CUDA_HOST):
        raise InvalidInput(f"{at}: this bfloat16 DLPack array is not in host memory")
    try:
        return _elements(tensor)
    finally:
        # Consumed: the capsule's destructor must no longer free it, and we are done with it.
        _capsule_rename(capsule, USED_CAPSULE)
        if managed.deleter:
            managed.deleter(ctypes.pointer(managed))


def _elements(tensor: DLTensor) -> np.ndarray:
    """A copy of a 16-bit tensor's elements (strided as DLPack says), as bfloat16."""
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    if tensor.strides:
        strides = tuple(tensor.strides[i] for i in range(tensor.ndim))
    else:  # no strides: row-major
        strides = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
    if 0 in shape:
        return np.zeros(shape, bf16.numpy)
    low = sum(s * (e - 1) for s, e in zip(strides, shape, strict=True) if s < 0)
    high = sum(s * (e - 1) for s, e in zip(strides, shape, strict=True) if s > 0)
    start = tensor.data + tensor.byte_offset + 2 * low
    span = (ctypes.c_uint16 * (high - low + 1)).from_address(start)
    flat = np.ctypeslib.as_array(span)
    view = np.lib.stride_tricks.as_strided(
        flat[-low:], shape, tuple(2 * s for s in strides), writeable=False
    )
    return view.copy().view(bf16.numpy)


__all__ = ["host_from_dlpack"]


def export_array(
    array: Any, is_bf16: bool, stream: Any = None, max_version: Any = None, copy: Any = None
) -> Any:
    """The DLPack capsule of `array` (what a NamedArray's `__dlpack__()` returns). NumPy exports
    no bfloat16 (it has no such dtype), so a bf16 array (`is_bf16`) is exported as its 16-bit
    words with the capsule's dtype set to the standard's bfloat16 code (`kDLBfloat`); other
    dtypes pass through the array library's own DLPack without a copy.

    >>> import accy, numpy as np
    >>> x = accy.named(np.arange(3, dtype=np.float32), "n")
    >>> np.from_dlpack(x).tolist()
    [0.0, 1.0, 2.0]
    """
    if not is_bf16:
        options: dict[str, Any] = {}
        if stream is not None:
            options["stream"] = stream
        if max_version is not None:
            options["max_version"] = max_version
        if copy is not None:
            options["copy"] = copy
        return array.__dlpack__(**options)
    words = array.view(np.uint16) if isinstance(array, np.ndarray) else array.view("uint16")
    # The unversioned capsule (a consumer asking for a newer one still reads it), whose dtype
    # is rewritten in place: the capsule is ours until the consumer takes it.
    capsule = words.__dlpack__() if stream is None else words.__dlpack__(stream=stream)
    if not _capsule_is_valid(capsule, CAPSULE):
        raise InvalidInput("__dlpack__: the array library gave no DLPack capsule to rewrite")
    managed = DLManagedTensor.from_address(_capsule_pointer(capsule, CAPSULE))
    managed.dl_tensor.dtype.code = KDL_BFLOAT
    return capsule
