"""Finding where a NaN came from: every operation a traced function records keeps the user's
source line (`user_location`), and with `accy.config.debug_nans` (or `ACCY_DEBUG_NANS=1`) a
call whose floating-point outputs hold a NaN or an infinity is run again on the reference
evaluator, operation by operation, to name the first operation that made one from finite
operands: its kind, its axes and the line that traced it (`check_outputs`).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..core import Operation, Program
from ..core.ir import SYNTHETIC_ID
from ..errors import is_accys_code
from ..interpret import run as interpret
from ..reference import Evaluate
from .errors import NonFiniteValue


def user_location(skip: int = 2) -> str | None:
    """`file:line` of the innermost frame outside accy (the user's code that is being traced:
    `accy.errors.is_accys_code`), or None.

    >>> user_location(1).split(":")[0].endswith(".py") or user_location(1).startswith("<")
    True
    """
    frame = sys._getframe(skip)
    while frame is not None:
        if not is_accys_code(frame.f_code):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _host(array: Any) -> np.ndarray:
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else array


def _non_finite(array: Any) -> str | None:
    host = np.asarray(_host(array))
    if host.dtype.kind != "f" and host.dtype.name != "bfloat16":
        return None
    values = host.astype(np.float32) if host.dtype.itemsize < 4 else host
    if np.isnan(values).any():
        return "NaN"
    if np.isinf(values).any():
        return "inf"
    return None


class _KeepingIds:
    """Emits a program's operations into a builder with their ids (so that the user's source
    lines, kept by id, still name them), its parameters bound to `args`."""

    def __init__(self, builder: Any, args: list[Any]):
        self.builder = builder
        self.args = args

    def bind(self, op: Operation, args: list[Any]) -> Any:
        if op.kind == "parameter":
            return self.args[op.attrs["index"]]
        return self.builder.emit(op.kind, args, op.attrs, id=op.id)

    def finish(self, outputs: list[Any]) -> list[Any]:
        return outputs


def call_keeping_ids(builder: Any, program: Program, args: list[Any]) -> Any:
    """`builder.call(program, args)`, the inlined operations keeping their ids.

    >>> import accy
    >>> inner = accy.trace.define("f", [accy.spec(accy.f32)], lambda b, a: a[0].exp())
    >>> outer = accy.trace.define(
    ...     "g", [accy.spec(accy.f32)] * 2, lambda b, a: call_keeping_ids(b, inner, [a[1]]))
    >>> [op.id for op in outer.operations if op.kind == "unary"]
    [1]
    """
    outputs = interpret(program, _KeepingIds(builder, list(args)))
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


class _Checking(Evaluate):
    """The reference evaluator, stopping at the first operation whose result is not finite
    while its operands are."""

    def __init__(self, inputs: list, describe: Any):
        super().__init__(inputs)
        self.describe = describe

    def bind(self, op: Operation, args: list) -> Any:
        result = super().bind(op, args)
        if op.kind == "parameter":
            return result
        results = result if isinstance(result, tuple) else (result,)
        made = next((k for k in map(_non_finite, results) if k), None)
        if made and not any(_non_finite(a) for a in args if isinstance(a, np.ndarray)):
            raise NonFiniteValue(self.describe(op, made))
        return result


def check_outputs(entry: Any, inputs: list, outputs: list) -> None:
    """With debug_nans: if a floating-point output of `entry`'s program holds a NaN or an
    infinity, raise `NonFiniteValue` naming the first operation that made one."""
    if not any(_non_finite(o) for o in outputs):
        return
    program: Program = entry.program
    locations: dict[int, str] = getattr(entry, "locations", {}) or {}

    producers = {result: op for op in program.operations for result in op.results}

    def traced_near(op: Operation) -> str | None:
        """The source line of the nearest traced operation `op` reads, through generated ones
        (a derivative reads the values of the operations it differentiates)."""
        frontier, seen = list(op.operands), set()
        while frontier:
            value = frontier.pop(0)
            producer = producers.get(value)
            if producer is None or value in seen:
                continue
            seen.add(value)
            if producer.id != SYNTHETIC_ID and producer.id in locations:
                return locations[producer.id]
            frontier.extend(producer.operands)
        return None

    def describe(op: Operation, made: str) -> str:
        what = op.kind + (f" {op.attrs['op']}" if op.kind == "unary" else "")
        where = locations.get(op.id) if op.id != SYNTHETIC_ID else None
        if where is None:
            near = traced_near(op)
            where = (
                "an operation accy generated (a derivative, or a rewrite of the program "
                f"{program.name!r})"
                + (f", from the values of the operation traced at {near}" if near else "")
            )
        operands = ", ".join(str(t) for t in op.operand_types) or "none"
        value = "a NaN" if made == "NaN" else "an infinity"
        return (
            f"debug_nans: {what} made {value} in {op.type} (operands {operands}) at {where}; "
            "turn the check off with accy.config.update('debug_nans', False)"
        )

    hosts = [np.asarray(_host(a)) for a in inputs]
    interpret(program, _Checking(hosts, describe))
    raise NonFiniteValue(
        f"debug_nans: the outputs of {program.name!r} hold a NaN or an infinity, but no "
        "operation made one from finite operands: the inputs hold them"
    )


__all__ = ["NonFiniteValue", "check_outputs", "user_location"]
