"""The systems compared: accy, JAX and PyTorch, each a module with the same functions.

Every system module provides:

- `backend(device, dtype="f32") -> str`: what runs the steps ("native", "reference", "xla",
  "eager", "inductor");
- `device_inputs(workload, arrays, device) -> list`: the inputs resident on the device
  (`arrays` are float32, int32 or `ml_dtypes.bfloat16` NumPy arrays);
- `build(workload, scale, device, dtype="f32") -> Step`: everything a first call pays for
  before running (trace, differentiate, compile); the Step maps device inputs to
  [loss, *gradients] with every output ready (computed, synchronized) when it returns;
- `to_numpy(outputs) -> list[np.ndarray]` (bf16 outputs as `ml_dtypes.bfloat16` arrays);
- `device_memory() -> DeviceMemory | None`: a way to read the device's peak allocation (GPU).

Only the worker process (`bench.worker`) imports a system module, one system per process.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

SYSTEMS = ("accy", "jax", "torch")
LABELS = {"accy": "accy", "jax": "JAX", "torch": "PyTorch"}
PACKAGES = {"accy": "accy", "jax": "jax", "torch": "torch"}


def missing(name: str) -> str | None:
    """Why system `name` cannot run here (its package is not installed), or None if it can."""
    if importlib.util.find_spec(PACKAGES[name]) is None:
        return f"{PACKAGES[name]} is not installed (pip install -e '.[bench]')"
    return None


def load(name: str) -> ModuleType:
    """The module of system `name` ("accy", "jax" or "torch")."""
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; expected one of {', '.join(SYSTEMS)}")
    return importlib.import_module(f"bench.systems.{name}_system")
