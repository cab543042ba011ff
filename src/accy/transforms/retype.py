"""Retyping: the same program computed in another floating-point dtype (used by check_grads
to take finite differences in float64)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core import Attrs, Operation, Program
from ..core.arrays import ConstantArray
from ..core.builder import Builder
from ..core.types import DType, TensorType
from ..interpret import Graph, Layer, run


class _Retype(Layer):
    def __init__(self, next: Any, dtype: DType):
        super().__init__(next)
        self.dtype = dtype

    def bind(self, op: Operation, args: list[Any]) -> Any:
        attrs = {key: self._convert(value) for key, value in op.attrs.items()}
        if op.kind == "convert" and _float_name(attrs["dtype"]):
            attrs["dtype"] = self.dtype.name
        if op.kind == "dot_general" and "accumulate" in attrs:
            del attrs["accumulate"]  # every float is now `dtype`: nothing else to sum in
        return self.next.bind(dataclasses.replace(op, attrs=Attrs(attrs)), args)

    def _convert(self, value: Any) -> Any:
        if isinstance(value, TensorType) and value.dtype.is_float:
            return value.with_dtype(self.dtype)
        if isinstance(value, Program):
            return promote_floats(value, self.dtype)
        if isinstance(value, ConstantArray) and value.dtype.is_float:
            return ConstantArray.of(value.array, self.dtype, value.shape)
        return value


def _float_name(name: str) -> bool:
    return name in ("f16", "bf16", "f32", "f64")


def promote_floats(program: Program, dtype: DType) -> Program:
    """`program` with every floating-point type changed to `dtype`."""
    return run(program, _Retype(Graph(Builder(program.name)), dtype))
