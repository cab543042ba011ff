"""Tracing: run user Python on traced values and record a Program.

`define(name, specs, body)` is the entry point: it gives `body(builder, args)` one traced
`Value` per spec and builds the Program from what it returns. `Builder` records operations;
`Value` is a traced tensor whose methods and operators are the named-axis operations of
`OpsApi`, shared with the transformations. These live in `accy.core`; this module is their
user-facing name.

>>> import accy
>>> p = accy.trace.define("sq", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * a[0])
>>> p.count("mul")
1
"""

from .core.builder import Builder, define
from .core.operations import OpsApi, axis_tuple
from .core.value import Value

__all__ = ["Builder", "OpsApi", "Value", "axis_tuple", "define"]
