"""Interpreters: one walker, composable semantics layers.

`run(program, semantics)` visits the operations in order, asks `semantics.bind(op, args)` for
each result and ends with `semantics.finish(outputs)`. A semantics is any object with those two
methods (and `builder_handle()` when it builds a program). Layers hold the next semantics and
pass down what they do not handle, so behaviours compose:

- `Graph(builder)` re-emits every operation into a Builder (a transformation is a layer over it);
- `bind(handler)` turns an object with methods named after kinds (`mul`, `constant`,
  `broadcast_in_dim`, ...) or a catch-all `bind` into a layer; each method gets a `Context`.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..core.builder import Builder, check_operation
from ..core.ir import SYNTHETIC_ID, Operation, Program
from ..core.operations import OpsApi
from ..core.walk import Inline, run
from ..trace import define


class Semantics(Protocol):
    def bind(self, op: Operation, args: list[Any]) -> Any: ...

    def finish(self, outputs: list[Any]) -> Any: ...


class Layer:
    """A semantics that passes everything to `next`; subclasses override what they change."""

    def __init__(self, next: Any):
        self.next = next

    def bind(self, op: Operation, args: list[Any]) -> Any:
        return self.next.bind(op, args)

    def finish(self, outputs: list[Any]) -> Any:
        return self.next.finish(outputs)

    def builder_handle(self) -> Builder:
        return self.next.builder_handle()


class Graph:
    """Re-emits each operation, with its id, into `builder`; finishing builds the Program."""

    def __init__(self, builder: Builder):
        self.builder = builder

    def bind(self, op: Operation, args: list[Any]) -> Any:
        return self.builder.emit(op.kind, args, op.attrs, id=op.id)

    def finish(self, outputs: list[Any]) -> Program:
        return self.builder.build(outputs)

    def builder_handle(self) -> Builder:
        return self.builder


class Emitter(OpsApi):
    """Builds operations through a semantics stack (so hooks see them), marked SYNTHETIC_ID."""

    def __init__(self, semantics: Any):
        self.semantics = semantics

    def emit(self, kind: str, operands, attrs=None, id: int | None = None):
        operands = list(operands)
        operand_types = tuple(v.ty for v in operands)
        _, attrs, result_types = check_operation(kind, operand_types, attrs)
        op = Operation(
            SYNTHETIC_ID if id is None else id,
            kind,
            tuple(getattr(v, "index", -1) for v in operands),
            (),
            result_types,
            attrs,
            operand_types,
        )
        return self.semantics.bind(op, operands)

    def builder_handle(self) -> Builder:
        return self.semantics.builder_handle()

    def subprogram(self, name: str, specs, body) -> Program:
        return define(name, specs, body)


class Context:
    """What a handler method of a `bind(...)` layer receives."""

    def __init__(self, layer: Any, op: Operation, args: list[Any]):
        self.op = op
        self.args = args
        self._layer = layer

    def builder_handle(self) -> Builder:
        """The Builder at the bottom of the stack (operations emitted on it skip the layers)."""
        return self._layer.next.builder_handle()

    def default(self) -> Any:
        """What the layers below would do with this operation."""
        return self._layer.next.bind(self.op, self.args)


class HandlerLayer(Layer):
    def __init__(self, handler: Any, next: Any):
        super().__init__(next)
        self.handler = handler

    def bind(self, op: Operation, args: list[Any]) -> Any:
        method = getattr(self.handler, op.kind, None) or getattr(self.handler, "bind", None)
        if method is None:
            return self.next.bind(op, args)
        return method(Context(self, op, args))


class Bound:
    """A handler waiting for the semantics it will sit on: `bind(handler).attach(next)`."""

    def __init__(self, handler: Any):
        self.handler = handler

    def attach(self, next: Any) -> HandlerLayer:
        return HandlerLayer(self.handler, next)


def bind(handler: Any) -> Bound:
    """Make a semantics layer from an object whose methods are named after kinds.

    >>> import accy
    >>> class CountMuls:
    ...     count = 0
    ...     def mul(self, ctx):
    ...         self.count += 1
    ...         return ctx.default()
    >>> counter = CountMuls()
    >>> p = accy.trace.define("sq", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * a[0])
    >>> _ = accy.interpret.run(p, accy.interpret.bind(counter).attach(
    ...     accy.interpret.Graph(accy.trace.Builder("copy"))))
    >>> counter.count
    1
    """
    return Bound(handler)


def attach(layer: Any, next: Any) -> Any:
    """Put `layer` (a `bind(...)` result, a Layer class, or None) on top of `next`."""
    if layer is None:
        return next
    if hasattr(layer, "attach"):
        return layer.attach(next)
    if isinstance(layer, type):
        return layer(next)
    return HandlerLayer(layer, next)


__all__ = [
    "SYNTHETIC_ID",
    "Bound",
    "Context",
    "Emitter",
    "Graph",
    "HandlerLayer",
    "Inline",
    "Layer",
    "Semantics",
    "attach",
    "bind",
    "run",
]
