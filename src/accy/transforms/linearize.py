"""Forward mode: interpret a program on dual values (primal, tangent).

The JVP semantics re-emits every primal operation (with its source id) and asks the kind's JVP
rule for the tangent, which it emits as new operations marked `SYNTHETIC_ID`. Tangents that are
known to be zero stay symbolic (`Zero`): no operation is emitted for them, and a rule is not
called when all its input tangents are zero. The result is one program that computes the primal
outputs and, linearly in the tangent parameters, the tangent outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import Operation, Program
from ..core.builder import Builder
from ..core.kinds.control import custom_call_jvp
from ..core.kinds.registry import Zero, rule_for
from ..errors import AccyError, NotDifferentiable
from ..interpret import Emitter, Graph, attach, run


@dataclass(frozen=True)
class Dual:
    """A primal value and its tangent (a traced value or `Zero`)."""

    primal: Any
    tangent: Any


@dataclass(frozen=True)
class Linearized:
    """A JVP program and how to read it.

    `program` takes the primal parameters, then one tangent per `wrt` input; it returns the
    primal outputs, then one tangent per output. Ops that depend on a tangent parameter are the
    linear part; the others compute primal outputs and residuals.
    """

    program: Program
    primal_parameter_count: int
    primal_output_count: int
    wrt: tuple[int, ...]


def check_wrt(source: Program, wrt) -> tuple[int, ...]:
    """`wrt` as a tuple of distinct float parameter indices, or NotDifferentiable."""
    wrt = (wrt,) if isinstance(wrt, int) else tuple(wrt)
    count = len(source.parameters)
    for index in wrt:
        if not isinstance(index, int) or not 0 <= index < count:
            raise NotDifferentiable(
                f"wrt={wrt}: {index!r} is not a parameter index of {source.name!r}, which has "
                f"{count} parameters ({', '.join(map(str, source.parameter_types))})"
            )
        if not source.parameter_types[index].dtype.is_float:
            kind = source.parameter_types[index]
            raise NotDifferentiable(
                f"wrt={wrt}: parameter {index} of {source.name!r} is {kind}; only "
                "floating-point parameters can be differentiated"
            )
    if len(set(wrt)) != len(wrt):
        raise NotDifferentiable(f"wrt={wrt} names a parameter twice")
    return wrt


class JvpSemantics:
    """Semantics on `Dual` values; emits primal and tangent operations into `next`."""

    def __init__(
        self, source: Program, next: Any, wrt: tuple[int, ...], reverse: bool = False
    ) -> None:
        self.next = next
        self.emit = Emitter(next)
        self.parameter_count = len(source.parameters)
        self.wrt = wrt
        self.reverse = reverse

    def bind(self, op: Operation, args: list[Dual]) -> Any:
        primals = [a.primal for a in args]
        outputs = self.next.bind(op, primals)
        if op.kind == "parameter":
            return Dual(outputs, self._tangent_parameter(op))
        tangents = [a.tangent for a in args]
        rule = rule_for(op.kind)
        if all(isinstance(t, Zero) for t in tangents):
            tangent = (
                tuple(Zero(t) for t in op.result_types) if rule.multiple_results else Zero(op.type)
            )
        elif rule.jvp is None:
            raise AccyError(
                f"{op.kind} has no JVP rule; programs with scan are unrolled before "
                "differentiation (accy.transforms.unroll.apply)"
            )
        elif op.kind == "custom_call":
            # The record's rules: in reverse mode a VJP rule is preferred to a JVP rule.
            tangent = custom_call_jvp(
                self.emit, op, primals, tangents, outputs, reverse=self.reverse
            )
        else:
            tangent = rule.jvp(self.emit, op, primals, tangents, outputs)
        if rule.multiple_results:
            return tuple(Dual(p, t) for p, t in zip(outputs, tangent, strict=True))
        return Dual(outputs, tangent)

    def _tangent_parameter(self, op: Operation) -> Any:
        index = op.attrs["index"]
        if index not in self.wrt:
            return Zero(op.type)
        position = self.parameter_count + self.wrt.index(index)
        return self.emit.emit("parameter", [], {"index": position, "type": op.type})

    def finish(self, outputs: list[Any]) -> Any:
        duals = [_as_dual(d) for d in outputs]
        primals = [d.primal for d in duals]
        tangents = [self.emit.instantiate(d.tangent) for d in duals]
        return self.next.finish(primals + tangents)

    def builder_handle(self) -> Builder:
        return self.next.builder_handle()


def _as_dual(value: Any) -> Dual:
    if isinstance(value, Dual):
        return value
    if hasattr(value, "primal") and hasattr(value, "tangent"):
        return Dual(value.primal, value.tangent)
    if isinstance(value, tuple) and len(value) == 2:
        return Dual(*value)
    raise AccyError(f"a JVP rule must return a Dual(primal, tangent), got {value!r}")


class _DualResults:
    """Normalizes what a user JVP rule returns (Dual, object with primal/tangent, or a pair)."""

    def __init__(self, next: Any):
        self.next = next

    def bind(self, op: Operation, args: list[Any]) -> Any:
        result = self.next.bind(op, args)
        return (
            tuple(map(_as_dual, result))
            if isinstance(result, tuple) and (result and isinstance(result[0], Dual))
            else _as_dual(result)
        )

    def finish(self, outputs: list[Any]) -> Any:
        return self.next.finish(outputs)


def linearize(
    source: Program,
    wrt=(0,),
    *,
    linearize_hook: Any = None,
    jvp_rules: Any = None,
    reverse: bool = False,
) -> Linearized:
    """Forward-mode linearization of `source` with respect to the parameters `wrt`.

    `linearize_hook` is a semantics layer over the graph of this phase (it sees every emitted
    operation); `jvp_rules` is a layer over the dual semantics (`accy.interpret.bind(rules)` or
    an object with methods named after kinds), which is how custom calls get derivatives
    besides their `accy.CustomCall` records. `reverse=True` says the result will be transposed
    (`pullback`): custom calls with a VJP rule are then linearized into calls that only that
    rule can transpose, so the program cannot be evaluated in forward mode.

    >>> import accy
    >>> p = accy.trace.define("sq", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * a[0])
    >>> lin = accy.linearize(p, wrt=(0,))
    >>> len(lin.program.parameters), len(lin.program.outputs)
    (2, 2)
    """
    wrt = check_wrt(source, wrt)
    graph = attach(linearize_hook, Graph(Builder(source.name)))
    semantics = _DualResults(attach(jvp_rules, JvpSemantics(source, graph, wrt, reverse)))
    program = run(source, semantics)
    return Linearized(program, len(source.parameters), len(source.outputs), wrt)
