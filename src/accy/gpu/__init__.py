"""Device states, kept for compatibility (see `accy.compat.seed`): `cpu.State()` and
`cuda.State.init_device(0)`, whose `handle()` names a device."""

from . import cpu, cuda

__all__ = ["cpu", "cuda"]
