"""The CUDA backend: generated kernels (NVRTC), cuBLAS, one CUDA graph per invocation.

Code generation (`compile_program`) needs neither a GPU nor CuPy; loading and running
(`runtime`) import CuPy, and only then.
"""

from .compile import CompiledFragment, compile_program
from .device import open_device, platform_supported
from .executable import CudaBackend, CudaExecutable

__all__ = [
    "CompiledFragment",
    "CudaBackend",
    "CudaExecutable",
    "compile_program",
    "open_device",
    "platform_supported",
]
