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

from ..errors import AccyError
from ..ops.registry import rule_for
from ..program import SYNTHETIC_ID, Attrs, Operation, Program
from ..trace.api import OpsApi
from ..trace.builder import Builder


class Semantics(Protocol):
    def bind(self, op: Operation, args: list[Any]) -> Any: ...

    def finish(self, outputs: list[Any]) -> Any: ...


def run(program: Program, semantics: Any) -> Any:
    """Interpret `program` with `semantics`; returns `semantics.finish(outputs)`.

    >>> import accy
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> copy = accy.interpret.run(p, accy.interpret.Graph(accy.trace.Builder("copy")))
    >>> copy.count("mul")
    1
    """
    env: dict[int, Any] = {}
    for op in program.operations:
        result = semantics.bind(op, [env[v] for v in op.operands])
        if len(op.results) == 1:
            env[op.results[0]] = result
        else:
            env.update(zip(op.results, result, strict=True))
    return semantics.finish([env[v] for v in program.outputs])


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


class Inline(Layer):
    """Emits a program's operations into another emitter, its parameters bound to `args`."""

    def __init__(self, emitter: OpsApi, args: list[Any], program: Program):
        if len(args) != len(program.parameters):
            given = ", ".join(str(getattr(arg, "ty", repr(arg))) for arg in args) or "none"
            raise AccyError(
                f"call {program.name!r}: it takes {len(program.parameters)} arguments "
                f"({', '.join(map(str, program.parameter_types))}), got {len(args)} ({given})"
            )
        for position, (arg, expected) in enumerate(zip(args, program.parameter_types, strict=True)):
            if arg.ty != expected:
                raise AccyError(
                    f"call {program.name!r}: argument {position} has type {arg.ty} but the "
                    f"program's parameter {position} has type {expected}"
                )
        super().__init__(None)
        self.emitter = emitter
        self.args = args

    def bind(self, op: Operation, args: list[Any]) -> Any:
        if op.kind == "parameter":
            return self.args[op.attrs["index"]]
        return self.emitter.emit(op.kind, args, op.attrs)

    def finish(self, outputs: list[Any]) -> list[Any]:
        return outputs


class Emitter(OpsApi):
    """Builds operations through a semantics stack (so hooks see them), marked SYNTHETIC_ID."""

    def __init__(self, semantics: Any):
        self.semantics = semantics

    def emit(self, kind: str, operands, attrs=None, id: int | None = None):
        rule = rule_for(kind)
        operands = list(operands)
        attrs = attrs if isinstance(attrs, Attrs) else Attrs(attrs or {})
        operand_types = tuple(v.ty for v in operands)
        inferred = rule.infer(operand_types, attrs)
        result_types = inferred if rule.multiple_results else (inferred,)
        op = Operation(
            SYNTHETIC_ID if id is None else id,
            kind,
            tuple(getattr(v, "index", -1) for v in operands),
            (),
            tuple(result_types),
            attrs,
            operand_types,
        )
        return self.semantics.bind(op, operands)

    def builder_handle(self) -> Builder:
        return self.semantics.builder_handle()


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
