"""Gradients: linearize (JVP), then pullback (transpose), then seed the cotangent with 1.0.

`grad`, `value_and_grad`, `jvp`, `vjp` and `linear_transpose` take a Program and return
ordinary Programs: they print, run on every backend, and can be
differentiated again.

Hooks (`grad_with`): a mapping (or object) with any of
- `linearize`, `pullback`, `seed`: semantics layers (e.g. `accy.interpret.bind(handler)`) over
  the graph of that phase; they see every operation the phase emits, generated ones marked
  `SYNTHETIC_ID`;
- `jvp`: a layer over the dual-number semantics (custom JVP rules: a handler's `custom_call(ctx)`
  or `bind(ctx)` gets `ctx.op`, `ctx.args[i].primal/.tangent`, `ctx.builder_handle()`,
  `ctx.default()` and returns `accy.Dual(primal, tangent)`);
- `vjp`: an object whose `custom_call(ctx)` transposes custom calls (`ctx.custom.target`,
  `ctx.cotangent`, `ctx.operand_is_active(i)`, `ctx.contribute(i, value)`).

Custom calls are differentiated by the rules of their `accy.CustomCall` records (forward mode:
the JVP rule, else the fallback; reverse mode: the VJP rule, else the transposed JVP rule, else
the fallback); the `jvp` and `vjp` hooks above are consulted before the record.

Derivative conventions: ties in max/min (binary and reductions) split the derivative evenly
among the tied operands; select sends the cotangent to the branch that was taken and an exact
zero to the other (so a NaN in the untaken branch's derivative still poisons nothing unless it
is multiplied in, as in JAX); abs has derivative sign(x), which is 0 at 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .core import Operation, Program
from .core.builder import Builder
from .errors import GradientRequiresScalarOutput
from .interpret import Emitter, Graph, attach
from .interpret import run as interpret_run
from .transforms.linearize import Linearized, check_wrt
from .transforms.linearize import linearize as _linearize
from .transforms.pullback import Pullback, pullback
from .transforms.simplify import simplify

Wrt = int | tuple[int, ...] | list[int]


def _hook(hooks: Any, name: str) -> Any:
    if hooks is None:
        return None
    if isinstance(hooks, Mapping):
        return hooks.get(name)
    return getattr(hooks, name, None)


def validate(source: Program, wrt: Wrt = (0,)) -> None:
    """Check that `source` can be differentiated by `grad` with respect to `wrt`."""
    if len(source.outputs) != 1 or source.type_of(source.outputs[0]).rank != 0:
        shown = ", ".join(map(str, source.output_types)) or "none"
        raise GradientRequiresScalarOutput(
            f"grad needs a program with one scalar (rank 0) output; {source.name!r} returns "
            f"({shown}). Reduce it to a scalar (e.g. .sum()), or use accy.vjp with an explicit "
            "cotangent"
        )
    check_wrt(source, wrt)


class SeedSemantics:
    """Replaces the cotangent parameter of a scalar output by the constant 1.0."""

    def __init__(self, next: Any, seed_parameter: int):
        self.next = next
        self.seed_parameter = seed_parameter

    def bind(self, op: Operation, args: list[Any]) -> Any:
        if op.kind == "parameter" and op.attrs["index"] == self.seed_parameter:
            return Emitter(self.next).full(op.type, 1.0)
        return self.next.bind(op, args)

    def finish(self, outputs: list[Any]) -> Any:
        return self.next.finish(outputs)

    def builder_handle(self) -> Builder:
        return self.next.builder_handle()


def _seed_into(transposed: Pullback, semantics: Any) -> Any:
    if transposed.seed_parameter_count != 1:
        raise GradientRequiresScalarOutput(
            f"grad needs exactly one scalar output, got {transposed.seed_parameter_count} outputs"
        )
    return interpret_run(
        transposed.program, SeedSemantics(semantics, transposed.primal_parameter_count)
    )


def _prepare(source: Program, wrt: Wrt) -> tuple[Program, tuple[int, ...]]:
    validate(source, wrt)
    return source, check_wrt(source, wrt)


def grad(source: Program, wrt: Wrt = (0,)) -> Program:
    """The gradient program of a scalar-output program with respect to parameters `wrt`.

    It takes the same parameters as `source` and returns one gradient per `wrt` index, each
    with the type of its parameter.

    >>> import accy
    >>> loss = accy.trace.define("loss", [accy.spec(accy.f32, lane=4)] * 2,
    ...                          lambda b, a: (a[0] * a[1]).sum("lane"))
    >>> g = accy.grad(loss, wrt=(0, 1))
    >>> [x.tolist() for x in accy.reference.run(g, [[1, 2, 3, 4], [5, 6, 7, 8]])]
    [[5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0]]
    """
    source, wrt = _prepare(source, wrt)
    transposed = pullback(_linearize(source, wrt, reverse=True))
    return simplify(_seed_into(transposed, Graph(Builder(source.name))))


def value_and_grad(source: Program, wrt: Wrt = (0,)) -> Program:
    """Like `grad`, with the loss as the first output, ahead of the gradients.

    >>> import accy
    >>> loss = accy.trace.define("loss", [accy.spec(accy.f32, lane=2)],
    ...                          lambda b, a: (a[0] * a[0]).sum("lane"))
    >>> [x.tolist() for x in accy.reference.run(accy.value_and_grad(loss), [[1, 2]])]
    [5.0, [2.0, 4.0]]
    """
    source, wrt = _prepare(source, wrt)
    transposed = pullback(_linearize(source, wrt, reverse=True), keep_primal_outputs=True)
    return simplify(_seed_into(transposed, Graph(Builder(source.name))))


def _linearize_with(source: Program, wrt, hooks: Any) -> Linearized:
    return _linearize(
        source,
        wrt,
        linearize_hook=_hook(hooks, "linearize"),
        jvp_rules=_hook(hooks, "jvp"),
        reverse=True,
    )


def _pullback_with(linearized: Linearized, hooks: Any, keep: bool = False) -> Pullback:
    semantics = attach(_hook(hooks, "pullback"), Graph(Builder(linearized.program.name)))
    return pullback(
        linearized, keep_primal_outputs=keep, semantics=semantics, vjp_rules=_hook(hooks, "vjp")
    )


def grad_with(source: Program, wrt: Wrt = (0,), hooks: Any = None) -> Program:
    """`grad` with user hooks on each phase and user rules for custom calls (module docstring).

    >>> import accy
    >>> class CountMuls:
    ...     seen = 0
    ...     def mul(self, ctx):
    ...         self.seen += ctx.op.id == accy.SYNTHETIC_ID
    ...         return ctx.default()
    >>> counter = CountMuls()
    >>> loss = accy.trace.define("loss", [accy.spec(accy.f32, lane=4)] * 2,
    ...                          lambda b, a: (a[0] * a[1]).sum("lane"))
    >>> _ = accy.grad_with(loss, (0, 1), {"linearize": accy.interpret.bind(counter)})
    >>> counter.seen
    2
    """
    source, wrt = _prepare(source, wrt)
    transposed = _pullback_with(_linearize_with(source, wrt, hooks), hooks)
    seeded = _seed_into(
        transposed, attach(_hook(hooks, "seed"), Graph(Builder(transposed.program.name)))
    )
    return simplify(seeded)


def grad_with_rules(
    source: Program, wrt: Wrt = (0,), jvp_rules: Any = None, vjp_rules: Any = None
) -> Program:
    """`grad` with custom JVP and VJP rules (objects with methods named after kinds).

    The rules are consulted first, then the custom call's `accy.CustomCall` record. A custom
    call without either raises `CustomCallRequiresJvpContract` or
    `CustomCallRequiresVjpContract`, naming its target.

    Without rules it is `grad` (a custom call's rules: `tests/autodiff/test_grad_zig.py`):

    >>> import accy, numpy as np
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, n=2)], lambda b, a: a[0].sin().sum())
    >>> accy.reference.run(accy.grad_with_rules(p), [np.zeros(2, np.float32)])[-1].tolist()
    [1.0, 1.0]
    """
    return grad_with(source, wrt, {"jvp": jvp_rules, "vjp": vjp_rules})


def interpret_with(source: Program, wrt: Wrt, hooks: Any, initial: Any) -> Any:
    """Differentiate `source` and interpret the gradient with the semantics `initial`.

    When `initial` is a layer factory (has `attach`), the seed phase runs directly into it
    (over a Graph), so it observes the gradient as it is built; otherwise the finished gradient
    program is run with `initial` (for example a reference evaluator).
    """
    if hasattr(initial, "attach"):
        source, wrt = _prepare(source, wrt)
        transposed = _pullback_with(_linearize_with(source, wrt, hooks), hooks)
        graph = Graph(Builder(transposed.program.name))
        return _seed_into(transposed, attach(_hook(hooks, "seed"), initial.attach(graph)))
    return interpret_run(grad_with(source, wrt, hooks), initial)


def interpret(source: Program, wrt: Wrt, initial: Any) -> Any:
    """`interpret_with` without hooks."""
    return interpret_with(source, wrt, None, initial)


def linearize(source: Program, wrt: Wrt = (0,)) -> Linearized:
    """The JVP program of `source` and how to read it (see `Linearized`)."""
    return _linearize(source, wrt)


def jvp(source: Program, wrt: Wrt = (0,)) -> Program:
    """Forward mode as a program: parameters (primals..., tangents per wrt...), outputs
    (outputs..., tangent per output...).

    >>> import accy
    >>> p = accy.trace.define("sq", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * a[0])
    >>> [x.tolist() for x in accy.reference.run(accy.jvp(p), [[1, 2], [1, 0]])]
    [[1.0, 4.0], [2.0, 0.0]]
    """
    return simplify(linearize(source, wrt).program)


def vjp(source: Program, wrt: Wrt = (0,)) -> Program:
    """Reverse mode for any outputs: parameters (primals..., one cotangent per output...),
    outputs (outputs..., one cotangent per wrt parameter...).

    >>> import accy
    >>> p = accy.trace.define("sq", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * a[0])
    >>> [x.tolist() for x in accy.reference.run(accy.vjp(p), [[1, 2], [1, 1]])]
    [[1.0, 4.0], [2.0, 4.0]]
    """
    check_wrt(source, wrt)
    transposed = pullback(_linearize(source, wrt, reverse=True), keep_primal_outputs=True)
    return simplify(transposed.program)


def linear_transpose(source: Program) -> Program:
    """The transpose of a program that is linear in all its parameters: it takes one cotangent
    per output and returns one cotangent per parameter.

    >>> import accy
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> [x.tolist() for x in accy.reference.run(accy.linear_transpose(p), [[1, 3]])]
    [[2.0, 6.0]]
    """
    wrt = check_wrt(source, tuple(range(len(source.parameters))))
    linearized = Linearized(source, 0, 0, wrt)
    return simplify(pullback(linearized).program)


def checkpoint(function: Any) -> Any:
    """`function(builder, args)` as a checkpointed region: reverse mode keeps only its
    arguments and recomputes its intermediates in the backward pass, trading compute for
    memory (`jax.checkpoint`). Use it while tracing: `accy.checkpoint(layer)(builder, args)`,
    the same as `builder.checkpoint(layer, args)`.

    >>> import accy
    >>> layer = accy.checkpoint(lambda b, a: (a[0] * a[1]).tanh())
    >>> p = accy.trace.define("loss", [accy.spec(accy.f32, lane=2)] * 2,
    ...                       lambda b, a: layer(b, a).sum("lane"))
    >>> p.count("scan"), [x.shape for x in accy.reference.run(accy.grad(p, (0, 1)), [[1, 2]] * 2)]
    (1, [(2,), (2,)])
    """

    def checkpointed(builder: Any, args: Any) -> Any:
        return builder.checkpoint(function, list(args))

    return checkpointed


__all__ = [
    "checkpoint",
    "grad",
    "grad_with",
    "grad_with_rules",
    "interpret",
    "interpret_with",
    "jvp",
    "linear_transpose",
    "linearize",
    "validate",
    "value_and_grad",
    "vjp",
]
