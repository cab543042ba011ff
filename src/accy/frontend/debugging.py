"""Finding where a NaN came from: every operation a traced function records keeps the user's
source line (`user_location`), and with `accy.config.debug_nans` (or `ACCY_DEBUG_NANS=1`) a
call whose floating-point outputs hold a NaN or an infinity is run again on the reference
evaluator, operation by operation, to name the first operation that made one from finite
operands: its kind, its axes and the line that traced it (`check_outputs`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from ..core import Operation, Program
from ..core.ir import SYNTHETIC_ID
from ..errors import _PACKAGE_DIR
from ..interpret import run as interpret
from ..reference import Evaluate
from .errors import NonFiniteValue

_INSIDE: dict[Any, bool] = {}  # code object -> whether it is accy's


def user_location(skip: int = 2) -> str | None:
    """`file:line` of the innermost frame outside accy (the user's code that is being traced),
    or None. Cheap: each code object is classified once.

    >>> user_location(1).split(":")[0].endswith(".py") or user_location(1).startswith("<")
    True
    """
    frame = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        inside = _INSIDE.get(code)
        if inside is None:
            filename = os.path.abspath(code.co_filename)
            inside = _INSIDE[code] = filename.startswith(_PACKAGE_DIR + os.sep)
        if not inside:
            return f"{code.co_filename}:{frame.f_lineno}"
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

    def describe(op: Operation, made: str) -> str:
        what = op.kind + (f" {op.attrs['op']}" if op.kind == "unary" else "")
        where = locations.get(op.id) if op.id != SYNTHETIC_ID else None
        if where is None:
            where = (
                "an operation accy generated (a derivative, or a rewrite of the program "
                f"{program.name!r}), not one line of the function"
            )
        operands = ", ".join(str(t) for t in op.operand_types) or "none"
        return (
            f"debug_nans: {what} made a {made} in {op.type} (operands {operands}) at {where}; "
            "turn the check off with accy.config.update('debug_nans', False)"
        )

    hosts = [np.asarray(_host(a)) for a in inputs]
    interpret(program, _Checking(hosts, describe))
    raise NonFiniteValue(
        f"debug_nans: the outputs of {program.name!r} hold a NaN or an infinity, but no "
        "operation made one from finite operands: the inputs hold them"
    )


__all__ = ["NonFiniteValue", "check_outputs", "user_location"]
