"""The six reference workloads of WORKLOADS.md: sizes, seeded inputs and the accy loss.

A workload is a scalar loss over named-axis inputs and the inputs it is differentiated with
respect to. Its sizes come in three scales: `check` (a few elements per axis: the reference
evaluator and the tests run it), `cpu` (the sizes of WORKLOADS.md) and `cuda` (the GPU scale:
batch, token and row times 8, vocab 131072).

Precision: every workload runs in float32 (`dtype="f32"`); `mlp`, `attention` and `block` also
in bfloat16 (`dtype="bf16"`): every float input is the float32 input rounded to bf16 (an
`ml_dtypes.bfloat16` array), the same values for every system, and each loss keeps bf16
activations, sums every contraction in f32 and gives an f32 loss (see each module).

The peers' versions of each loss are in `bench.systems.jax_system` and
`bench.systems.torch_system`; nothing here imports JAX or PyTorch.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

import accy
from accy import Builder, DType, Program, TensorType, Value

Extents = Mapping[str, int]
SCALES = ("check", "cpu", "cuda")
GPU_SCALED_AXES = ("batch", "token", "row")
GPU_VOCAB = 131072
DTYPES = ("f32", "bf16")  # the precisions of `--dtype`; f32 is every workload's, bf16 some's


@dataclass(frozen=True)
class Workload:
    """One benchmark workload.

    `specs(extents)` gives the accy input types, `inputs(extents, rng)` the float32 (or int32)
    NumPy inputs in the same layout, `loss(builder, args)` the accy loss, and `wrt` the indices
    of the inputs whose gradients are computed. Every system returns [loss, *gradients].
    `dtypes` are the precisions it runs in (f32, and bf16 where its loss is written for it);
    `flops(extents)` counts the multiply-adds of its contractions in one loss and gradient
    (2 FLOPs each; None: it has none, so no TFLOP/s), `flops_formula` says how.
    """

    name: str
    input_names: tuple[str, ...]
    cpu_extents: Extents
    check_extents: Extents
    specs: Callable[[Extents], list[TensorType]]
    inputs: Callable[[Extents, np.random.Generator], list[np.ndarray]]
    loss: Callable[[Builder, list[Value]], Value]
    wrt: tuple[int, ...]
    dtypes: tuple[str, ...] = ("f32",)
    flops: Callable[[Extents], float] | None = None
    flops_formula: str | None = None

    @property
    def output_names(self) -> tuple[str, ...]:
        """ "loss", then "d/dw" for each input w that the gradient is taken with respect to."""
        return ("loss", *(f"d/d{self.input_names[i]}" for i in self.wrt))

    def extents(self, scale: str) -> dict[str, int]:
        """The axis extents at `scale` ("check", "cpu" or "cuda")."""
        if scale == "check":
            return dict(self.check_extents)
        if scale == "cpu":
            return dict(self.cpu_extents)
        if scale == "cuda":
            return gpu_extents(self.cpu_extents)
        raise ValueError(f"unknown scale {scale!r}; expected one of {', '.join(SCALES)}")

    def check_dtype(self, dtype: str) -> None:
        """Raise ValueError unless this workload runs in `dtype` ("f32" or "bf16")."""
        accy_dtype(dtype)  # an unknown name is an error of its own
        if dtype not in self.dtypes:
            raise ValueError(
                f"workload {self.name!r} has no {dtype} version (it runs in "
                f"{', '.join(self.dtypes)}); {dtype} runs {', '.join(supporting(dtype))}"
            )

    def types(self, scale: str, dtype: str = "f32") -> list[TensorType]:
        """The accy input types at `scale`, float inputs in `dtype`."""
        self.check_dtype(dtype)
        wanted = accy_dtype(dtype)
        return [
            t.with_dtype(wanted) if t.dtype.is_float else t for t in self.specs(self.extents(scale))
        ]

    def program(self, scale: str, dtype: str = "f32") -> Program:
        """The accy loss program at `scale` (not yet differentiated)."""
        return accy.trace.define(self.name, self.types(scale, dtype), self.loss)

    def value_and_grad(self, scale: str, dtype: str = "f32") -> Program:
        """The accy program returning the loss, then one gradient per `wrt` input."""
        return accy.value_and_grad(self.program(scale, dtype), wrt=self.wrt)

    def make_inputs(self, scale: str, seed: int = 0, dtype: str = "f32") -> list[np.ndarray]:
        """The seeded inputs at `scale`: the same arrays for every system and every process
        (in bf16, the float32 inputs rounded to `ml_dtypes.bfloat16`)."""
        self.check_dtype(dtype)
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])
        arrays = self.inputs(self.extents(scale), rng)
        held = accy_dtype(dtype).numpy
        return [a.astype(held) if a.dtype.kind == "f" else a for a in arrays]

    def flops_per_step(self, scale: str) -> float | None:
        """FLOPs of one loss and gradient at `scale` (`flops`), or None."""
        return None if self.flops is None else float(self.flops(self.extents(scale)))


def accy_dtype(name: str) -> DType:
    """The accy dtype of a `--dtype` name ("f32" or "bf16")."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return accy.bf16 if name == "bf16" else accy.f32


def is_half(dtype: DType) -> bool:
    """True for the 16-bit floats, whose sums the workloads keep in f32."""
    return dtype in (accy.bf16, accy.f16)


def wide(value: Value) -> DType | None:
    """The `accumulate` of a contraction whose result the loss wants in f32: f32 for 16-bit
    operands (the f32 sum, not rounded back), None (the operands' own dtype) otherwise."""
    return accy.f32 if is_half(value.dtype) else None


def in_f32(value: Value) -> Value:
    """`value` converted to f32 when it is a 16-bit float (the loss's final sums), else itself."""
    return value.convert(accy.f32) if is_half(value.dtype) else value


def supporting(dtype: str) -> list[str]:
    """The workloads that run in `dtype`."""
    return [name for name, w in WORKLOADS.items() if dtype in w.dtypes]


def gpu_extents(cpu: Extents) -> dict[str, int]:
    """The GPU scale: batch, token and row axes times 8, a vocab axis of 131072."""
    scaled = {
        axis: extent * 8 if axis in GPU_SCALED_AXES else extent for axis, extent in cpu.items()
    }
    if "vocab" in scaled:
        scaled["vocab"] = GPU_VOCAB
    return scaled


def normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Float32 samples of a normal distribution with standard deviation `scale`."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _registry() -> dict[str, Workload]:
    from . import attention, block, conv, elementwise, embedding, mlp, pool, tiny

    modules = (tiny, mlp, attention, embedding, elementwise, block, conv, pool)
    return {module.WORKLOAD.name: module.WORKLOAD for module in modules}


WORKLOADS: dict[str, Workload] = _registry()
