"""Just enough of the CUDA driver API (through ctypes) to load PTX and launch a KernelCall.

The CUDA backend is another package's job; this lets the kernel tests check, where a GPU is
present, that the PTX they generate computes what the C does, without depending on it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from accy.core.types import TensorType
from accy.kernel import KernelCall
from accy.kernel.cpu import _from_storage, _tensor_type, _to_storage, storage_numpy
from accy.kernel.logical import RESULT


class DriverUnavailable(Exception):
    """No driver library, no device, or the driver cannot load this PTX (the reason says)."""


class Driver:
    """One context on device 0, and helpers to run a KernelCall's PTX in it."""

    def __init__(self):
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise DriverUnavailable(f"libcuda.so.1 cannot be loaded ({error})") from error
        self._check(self._cuda.cuInit(0), "cuInit", unavailable=True)
        count = ctypes.c_int()
        self._check(self._cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount", True)
        if count.value == 0:
            raise DriverUnavailable("the CUDA driver sees no device")
        device, self._context = ctypes.c_int(), ctypes.c_void_p()
        self._check(self._cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        retain = self._cuda.cuDevicePrimaryCtxRetain
        self._check(retain(ctypes.byref(self._context), device), "cuDevicePrimaryCtxRetain")
        self._check(self._cuda.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
        version = ctypes.c_int()
        self._cuda.cuDriverGetVersion(ctypes.byref(version))
        self.version = version.value

    def _check(self, status: int, what: str, unavailable: bool = False) -> None:
        if status == 0:
            return
        text = ctypes.c_char_p()
        self._cuda.cuGetErrorString(status, ctypes.byref(text))
        message = f"{what} failed: error {status} ({(text.value or b'?').decode()})"
        raise (DriverUnavailable if unavailable else RuntimeError)(message)

    def load(self, ptx: str) -> ctypes.c_void_p:
        module = ctypes.c_void_p()
        status = self._cuda.cuModuleLoadData(ctypes.byref(module), ptx.encode() + b"\0")
        # 222: CUDA_ERROR_UNSUPPORTED_PTX_VERSION, a driver older than the compiler.
        self._check(status, f"cuModuleLoadData (driver {self.version})", unavailable=status == 222)
        return module

    def run(
        self,
        module: ctypes.c_void_p,
        call: KernelCall,
        operands: Sequence[np.ndarray],
    ) -> np.ndarray:
        """`call` launched on `operands` with its own grid and block; the result, 1-D."""
        types = [
            _tensor_type(call, name, dtype, np.asarray(a))
            for (name, dtype), a in zip(call.operand_parameters, operands, strict=True)
        ]
        result_type = TensorType(call.result_dtype, (("element", call.extent_of(RESULT)),))
        call.check_call(types, result_type)
        hosts = {
            name: _to_storage(np.asarray(a), t)
            for (name, _), a, t in zip(call.operand_parameters, operands, types, strict=True)
        }
        hosts[RESULT] = np.zeros(result_type.size, storage_numpy(result_type.dtype))
        devices = {name: self._upload(host) for name, host in hosts.items()}
        try:
            self._launch(module, call, [devices[name] for name, _ in call.parameters])
            self._download(devices[RESULT], hosts[RESULT])
        finally:
            for pointer in devices.values():
                self._cuda.cuMemFree_v2(pointer)
        return _from_storage(hosts[RESULT], result_type.dtype)

    def _upload(self, host: np.ndarray) -> ctypes.c_uint64:
        pointer = ctypes.c_uint64()
        self._check(self._cuda.cuMemAlloc_v2(ctypes.byref(pointer), max(1, host.nbytes)), "alloc")
        source = host.ctypes.data_as(ctypes.c_void_p)
        self._check(self._cuda.cuMemcpyHtoD_v2(pointer, source, host.nbytes), "copy to device")
        return pointer

    def _download(self, pointer: ctypes.c_uint64, host: np.ndarray) -> None:
        target = host.ctypes.data_as(ctypes.c_void_p)
        self._check(self._cuda.cuMemcpyDtoH_v2(target, pointer, host.nbytes), "copy to host")

    def _launch(self, module, call: KernelCall, pointers: list[ctypes.c_uint64]) -> None:
        function = ctypes.c_void_p()
        name = call.kernel_name.encode()
        self._check(self._cuda.cuModuleGetFunction(ctypes.byref(function), module, name), name)
        arguments = (ctypes.c_void_p * len(pointers))(
            *(ctypes.cast(ctypes.byref(p), ctypes.c_void_p) for p in pointers)
        )
        grid, block = call.grid, call.block
        status = self._cuda.cuLaunchKernel(function, *grid, *block, 0, None, arguments, None)
        self._check(status, f"cuLaunchKernel {call.kernel_name}")
        self._check(self._cuda.cuCtxSynchronize(), f"running {call.kernel_name}")
