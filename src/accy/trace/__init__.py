"""Tracing: run user Python on traced values and record a Program.

`define(name, specs, body)` is the entry point; `Builder` and `Value` are the tracer's objects;
`OpsApi` is the named-axis operation library they share with the transformations.
"""

from .api import OpsApi, axis_tuple
from .builder import Builder, Value, define

__all__ = ["Builder", "OpsApi", "Value", "axis_tuple", "define"]
