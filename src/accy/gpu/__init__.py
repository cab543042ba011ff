"""Device states: `cpu.State()` for the native CPU backend, `cuda.State.init_device(0)` for a
GPU (neither imports CuPy)."""

from . import cpu, cuda

__all__ = ["cpu", "cuda"]
