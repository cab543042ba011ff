"""The reference evaluator as a backend (device "reference"): NumPy, operation by operation.

Arguments pass the same conversion rule as on every device (`accy.backends.arguments`), then
`accy.reference.Evaluate` walks the program; raw buffers are viewed as arrays of their
parameters' types (bf16 bit patterns are `ml_dtypes.bfloat16` elements as they are) and the
results written back raw.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import Program
from ..core.types import TensorType
from ..interpret import run as interpret
from ..reference import Evaluate
from .arguments import check_count, host_array, where
from .base import CompileOptions, Executable, register_backend
from .devices import REFERENCE


def _from_raw(buffer: np.ndarray, t: TensorType) -> np.ndarray:
    return buffer.reshape(-1).view(t.dtype.numpy).reshape(t.extents)


def _to_raw(values: np.ndarray, t: TensorType, buffer: np.ndarray) -> None:
    buffer.reshape(-1).view(np.uint8)[...] = np.ascontiguousarray(values).reshape(-1).view(np.uint8)


class ReferenceExecutable(Executable):
    """A program evaluated by the reference evaluator.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, n=2)], lambda b, a: a[0] * 2.0)
    >>> accy.compile(p, device="reference")(np.array([1, 2], np.float32))[0].tolist()
    [2.0, 4.0]
    """

    device = REFERENCE

    def __init__(self, program: Program, custom_calls: Any = None):
        super().__init__(program)
        self.custom_calls = custom_calls

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        name, types = self.program.name, self.parameter_types
        check_count(name, types, len(arrays))
        inputs = [
            host_array(value, t, where(name, position))
            for position, (value, t) in enumerate(zip(arrays, types, strict=True))
        ]
        return self.evaluate(inputs)

    def evaluate(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Evaluate on checked arrays."""
        return interpret(self.program, Evaluate(inputs, self.custom_calls))

    def run_checked(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        arrays = [_from_raw(b, t) for b, t in zip(inputs, self.parameter_types, strict=True)]
        results = self.evaluate(arrays)
        for result, t, buffer in zip(results, self.output_types, outputs, strict=True):
            _to_raw(result, t, buffer)


class ReferenceBackend:
    """Makes `ReferenceExecutable`s; `options.custom_calls` gives custom calls' NumPy code."""

    device = "reference"

    def compile(
        self, program: Program, options: CompileOptions, ordinal: int = 0
    ) -> ReferenceExecutable:
        return ReferenceExecutable(program, options.custom_calls)


register_backend(ReferenceBackend())

__all__ = ["ReferenceBackend", "ReferenceExecutable"]
