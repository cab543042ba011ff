"""Tracing: run user Python on traced values and record a Program.

`define(name, specs, body)` is the entry point: it gives `body(builder, args)` one traced
`Value` per spec and builds the Program from what it returns. `Builder` records operations
(`accy.core.builder`); `Value` is a traced tensor whose methods and operators are the
named-axis operations of `OpsApi`, shared with the transformations.

>>> import accy
>>> p = accy.trace.define("sq", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * a[0])
>>> p.count("mul")
1
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .core.builder import Builder, trace_into
from .core.ir import Program
from .core.operations import OpsApi, axis_tuple
from .core.types import TensorType
from .core.value import Value


def define(
    name: str,
    specs: Sequence[TensorType],
    body: Callable[[Builder, list[Value]], Any],
) -> Program:
    """Trace `body(builder, args)` with one traced Value per spec and return the Program.

    >>> import accy
    >>> p = accy.trace.define("loss", [accy.spec(accy.f32, lane=4)] * 2,
    ...                       lambda b, args: (args[0] * args[1]).sum("lane"))
    >>> [float(v) for v in accy.reference.run(p, [[1, 2, 3, 4], [1, 1, 1, 1]])]
    [10.0]
    """
    program, _ = trace_into(Builder(name), specs, body)
    return program


__all__ = ["Builder", "OpsApi", "Value", "axis_tuple", "define"]
