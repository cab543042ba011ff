"""The reference evaluator: every kind evaluated with NumPy, operation by operation.

It is the oracle the other backends are tested against, not the fast path. Each kind's NumPy
evaluation lives with its other rules in `accy.core.kinds`; this module walks the program.

bf16 values are `ml_dtypes.bfloat16` arrays, f16 values NumPy's float16. Every backend
computes a 16-bit float operation in float32 and rounds its result once, so the evaluator does
exactly that: a kind's evaluation sees its 16-bit operands widened to float32 (exactly), and its
result is rounded to the result's dtype (to nearest, ties to even). Sums (reduce, dot_general)
thus accumulate in float32 and round once. The one exception is an f16 scatter_add, which every
backend rounds after each addition, in index order (as NumPy's float16 `add.at` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..core import Operation, Program
from ..core.kinds.control import custom_call_record
from ..core.kinds.registry import rule_for
from ..core.types import TensorType, bf16, f16, f32
from ..custom import define_reference
from ..errors import AccyError, InvalidInput
from ..interpret import run as interpret

CustomCalls = Mapping[Any, Callable[..., np.ndarray]]


def register_custom_call(target: str, version: int, implementation: Callable[..., np.ndarray]):
    """Make `implementation(*arrays) -> array` the reference evaluation of a custom call: the
    `reference` of its `accy.CustomCall` record, which is registered if there is none."""
    define_reference(target, version, implementation)


HALVES = (np.dtype(bf16.numpy), np.dtype(f16.numpy))


def widened(array: np.ndarray) -> np.ndarray:
    """16-bit float values as the float32 they are computed in (exact); others as they are.

    >>> import ml_dtypes
    >>> widened(np.array([1.5], ml_dtypes.bfloat16)).dtype
    dtype('float32')
    """
    return array.astype(f32.numpy) if array.dtype in HALVES else array


class Evaluate:
    """Semantics that computes NumPy arrays (each let go after its last use)."""

    drops_dead_values = True

    def __init__(self, inputs: Sequence[np.ndarray], custom_calls: CustomCalls | None = None):
        self.inputs = list(inputs)
        self.custom_calls = dict(custom_calls or {})
        self.operand_types: tuple[TensorType, ...] = ()
        self.result_types: tuple[TensorType, ...] = ()

    def bind(self, op: Operation, args: list[np.ndarray]) -> Any:
        rule = rule_for(op.kind)
        self.operand_types, self.result_types = op.operand_types, op.result_types
        if op.kind not in KEEPS_HALVES and not (
            op.kind in ("scatter_add", "scatter") and op.type.dtype == f16
        ):
            args = [widened(a) if isinstance(a, np.ndarray) else a for a in args]
        result = rule.evaluate(op.attrs, args, self)
        if rule.multiple_results:
            return tuple(_conform(r, t) for r, t in zip(result, op.result_types, strict=True))
        return _conform(result, op.type)

    def finish(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        return outputs

    def parameter(self, index: int) -> np.ndarray:
        return self.inputs[index]

    def custom_call(self, attrs, args: list[np.ndarray]) -> np.ndarray:
        target, version = attrs["target"], attrs["version"]
        if attrs.get("linearized", False):
            raise AccyError(
                f"custom_call {target!r} version {version} is linearized for its VJP rule: it "
                "only exists inside reverse-mode differentiation and cannot be evaluated"
            )
        # Per-call overrides first, then the registered record (accy.CustomCall).
        implementation = self.custom_calls.get((target, version)) or self.custom_calls.get(target)
        if implementation is None:
            implementation = getattr(custom_call_record(attrs), "reference", None)
        if implementation is None:
            raise AccyError(
                f"custom_call {target!r} version {version} has no reference implementation; "
                f"declare one with accy.CustomCall({target!r}, version={version}, "
                f"reference=...), or pass custom_calls={{({target!r}, {version}): function}} "
                "to accy.reference.run"
            )
        result = np.asarray(implementation(*args))
        expected = self.result_types[0]
        if result.shape != expected.extents:
            raise InvalidInput(
                f"custom_call {attrs['target']!r} version {attrs['version']}: its reference "
                f"implementation returned an array of shape {result.shape}, but the call's "
                f"result type is {expected} (shape {expected.extents})"
            )
        return result

    def run_program(self, program: Program, args: list[np.ndarray]) -> list[np.ndarray]:
        return interpret(program, Evaluate(args, self.custom_calls))


KEEPS_HALVES = frozenset({"scan", "cond", "while_loop", "custom_call"})
"""Kinds whose operands reach a nested program or user code with their own types: not widened."""


def _conform(result: Any, t: TensorType) -> np.ndarray:
    array = np.asarray(result)
    if array.dtype != t.dtype.numpy:
        with np.errstate(over="ignore"):
            array = array.astype(t.dtype.numpy)  # bf16: rounded to nearest, ties to even
    if array.shape != t.extents:
        raise AccyError(f"internal: evaluation produced shape {array.shape}, expected {t}")
    return array


def run(
    program: Program, inputs: Sequence[Any], custom_calls: CustomCalls | None = None
) -> list[np.ndarray]:
    """Evaluate `program` on NumPy arrays (one per parameter, axes in layout order), taken by
    the one argument rule of every device (`accy.backends.arguments`: dtypes exactly, Python
    values only without loss).

    >>> import accy, numpy as np
    >>> p = accy.trace.define("scale", [accy.spec(accy.f32, lane=3)], lambda b, a: a[0] * 2.0)
    >>> accy.reference.run(p, [np.array([1.0, 2.0, 3.0], np.float32)])[0].tolist()
    [2.0, 4.0, 6.0]
    """
    # The one argument rule of every device (deferred: the backends import this evaluator).
    from ..backends.arguments import check_count, host_array, where

    types = program.parameter_types
    check_count(program.name, types, len(inputs))
    arrays = [
        host_array(x, t, where(program.name, i))
        for i, (x, t) in enumerate(zip(inputs, types, strict=True))
    ]
    return interpret(program, Evaluate(arrays, custom_calls))


__all__ = ["Evaluate", "register_custom_call", "run"]
