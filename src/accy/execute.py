"""Run programs on the native CPU over raw buffers (kept for compatibility; see
`accy.compat.seed`): `run_cpu(program, inputs, outputs)`, `Cpu(program).launch(...)`."""

from .compat.seed import Cpu, fragment_for, run_cpu

__all__ = ["Cpu", "fragment_for", "run_cpu"]
