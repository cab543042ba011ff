"""The six reference workloads of WORKLOADS.md: sizes, seeded inputs and the accy loss.

A workload is a scalar loss over named-axis inputs and the inputs it is differentiated with
respect to. Its sizes come in three scales: `check` (a few elements per axis: the reference
evaluator and the tests run it), `cpu` (the sizes of WORKLOADS.md) and `cuda` (the GPU scale:
batch, token and row times 8, vocab 131072).

The peers' versions of each loss are in `bench.systems.jax_system` and
`bench.systems.torch_system`; nothing here imports JAX or PyTorch.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

import accy
from accy import Builder, Program, TensorType, Value

Extents = Mapping[str, int]
SCALES = ("check", "cpu", "cuda")
GPU_SCALED_AXES = ("batch", "token", "row")
GPU_VOCAB = 131072


@dataclass(frozen=True)
class Workload:
    """One benchmark workload.

    `specs(extents)` gives the accy input types, `inputs(extents, rng)` the float32 (or int32)
    NumPy inputs in the same layout, `loss(builder, args)` the accy loss, and `wrt` the indices
    of the inputs whose gradients are computed. Every system returns [loss, *gradients].
    """

    name: str
    input_names: tuple[str, ...]
    cpu_extents: Extents
    check_extents: Extents
    specs: Callable[[Extents], list[TensorType]]
    inputs: Callable[[Extents, np.random.Generator], list[np.ndarray]]
    loss: Callable[[Builder, list[Value]], Value]
    wrt: tuple[int, ...]

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

    def program(self, scale: str) -> Program:
        """The accy loss program at `scale` (not yet differentiated)."""
        return accy.trace.define(self.name, self.specs(self.extents(scale)), self.loss)

    def value_and_grad(self, scale: str) -> Program:
        """The accy program returning the loss, then one gradient per `wrt` input."""
        return accy.value_and_grad(self.program(scale), wrt=self.wrt)

    def make_inputs(self, scale: str, seed: int = 0) -> list[np.ndarray]:
        """The seeded inputs at `scale`: the same arrays for every system and every process."""
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])
        return self.inputs(self.extents(scale), rng)


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
    from . import attention, block, conv, elementwise, embedding, mlp, tiny

    modules = (tiny, mlp, attention, embedding, elementwise, block, conv)
    return {module.WORKLOAD.name: module.WORKLOAD for module in modules}


WORKLOADS: dict[str, Workload] = _registry()
