"""Device states: `cpu.State()` for the native CPU backend (a CUDA state lives beside it)."""

from . import cpu

__all__ = ["cpu"]
