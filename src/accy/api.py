"""`accy.compile` and `accy.run`: programs as functions of arrays, on a chosen device.

Arrays go in (NumPy, or any DLPack producer such as a CPU tensor of PyTorch or JAX, without a
copy when it is contiguous), fresh arrays come out, one per output, axes in layout order. Every
device takes and refuses the same arguments (`accy.backends.arguments`): an array must have the
parameter's dtype and extents; Python lists and scalars are converted only where nothing is
lost. bf16 arrays are `ml_dtypes.bfloat16` arrays on both sides, f16 arrays `numpy.float16`.

Devices are `accy.devices()` (`accy.backends.devices`): "cpu" (native code), "cuda:N" (GPU N;
"cuda" is GPU 0: CuPy arrays come out) and "reference" (the NumPy evaluator). Compiled
programs are kept in one cache keyed by the program's content, so compiling or running a
program traced again costs a lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .backends.base import CACHE, CompileOptions, Executable, executable_for
from .backends.devices import Device
from .core import Program

CompiledProgram = Executable
"""The type `accy.compile` returns (another name of `Executable`)."""


def compile(
    program: Program,
    device: str | Device = "cpu",
    *,
    kernel_call_registry: Any = None,
    custom_calls: Any = None,
    precision: str = "f32",
    donate: Sequence[int] = (),
) -> Executable:
    """Compile `program` for `device` (a `Device` or its name: "cpu", "cuda", "cuda:1",
    "reference"); returns a callable on
    arrays (which also runs on raw buffers: `run_buffers(inputs, outputs)`).

    `kernel_call_registry` gives native code its custom-call kernels, `custom_calls` the
    reference evaluator their NumPy implementations. `precision="tf32"` lets f32 GEMMs on a GPU
    use TF32 tensor cores (about 1e-3 relative error); the default, "f32", is exact float32.
    f16 and bf16 GEMMs always accumulate in float32.

    `donate` lists inputs the call may overwrite, as JAX's `donate_argnums`: an output that
    can take a donated input's memory is written there, and the array returned for it IS the
    donated array (a training step updating parameters and optimizer state in place). Do not
    use a donated array after the call. On "cpu" and "cuda" (`DonationError` on
    "reference"); see `accy.backends.cpu.DonatingExecutable` and
    `accy.backends.cuda.executable.DonatingCudaExecutable` for what a donated array must be
    (an array that owns its memory, of exactly the parameter's dtype and extents, used by no
    other argument of the call).

    >>> import accy, numpy as np
    >>> p = accy.trace.define("dot", [accy.spec(accy.f32, k=2)] * 2,
    ...                       lambda b, a: a[0].contract(a[1], "k"))
    >>> accy.compile(p, device="cpu")(np.ones(2, np.float32), np.ones(2, np.float32))[0]
    array(2., dtype=float32)
    """
    options = CompileOptions(kernel_call_registry, custom_calls, precision)
    executable = executable_for(program, device, options)
    if not donate:
        return executable
    donated = tuple(donate)
    return CACHE.derived(
        executable, ("donate", donated), lambda: executable.device.donating(executable, donated)
    )


def run(
    program: Program,
    *arrays: Any,
    device: str | Device = "cpu",
    kernel_call_registry: Any = None,
    custom_calls: Any = None,
) -> list[Any]:
    """Run `program` once on `arrays`; its compilation is cached by the program's content.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("total", [accy.spec(accy.f32, lane=3)], lambda b, a: a[0].sum())
    >>> accy.run(p, np.array([1, 2, 3], np.float32))[0].item()
    6.0
    """
    compiled = compile(
        program, device, kernel_call_registry=kernel_call_registry, custom_calls=custom_calls
    )
    return compiled(*arrays)


__all__ = ["CompiledProgram", "compile", "run"]
