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
from ..core.kinds.control import custom_call_jvp, custom_call_primal
from ..core.kinds.registry import Zero, rule_for
from ..errors import AccyError, NotDifferentiable
from ..interpret import Emitter, Graph, Inline, attach, run
from ..trace import define
from .scan_split import Roles, Source, carry_fixpoint, dependents, emit_scan, inline_cond, split
from .simplify import simplify


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
    """`wrt` as a tuple of distinct float parameter indices, or NotDifferentiable. Linear in
    the number of parameters and of indices (a training step may differentiate 10^4 arrays).

    >>> from accy import f32, i32, spec
    >>> from accy.trace import define
    >>> program = define("f", [spec(f32), spec(i32)], lambda b, args: args[0])
    >>> check_wrt(program, 0)
    (0,)
    """
    wrt = (wrt,) if isinstance(wrt, int) else tuple(wrt)
    types = source.parameter_types  # one tuple, built once: not once per index
    for index in wrt:
        if not isinstance(index, int) or not 0 <= index < len(types):
            raise NotDifferentiable(
                f"wrt={_shortened(wrt)}: {index!r} is not a parameter index of {source.name!r}, "
                f"which has {len(types)} parameters ({_shortened(types)})"
            )
        if not types[index].dtype.is_float:
            raise NotDifferentiable(
                f"wrt={_shortened(wrt)}: parameter {index} of {source.name!r} is "
                f"{types[index]}; only floating-point parameters can be differentiated"
            )
    if len(set(wrt)) != len(wrt):
        raise NotDifferentiable(f"wrt={_shortened(wrt)} names a parameter twice")
    return wrt


def _shortened(items: tuple, shown: int = 8) -> str:
    """`items` for a message: the first `shown`, then how many more."""
    text = ", ".join(map(str, items[:shown]))
    more = f", ... ({len(items) - shown} more)" if len(items) > shown else ""
    return f"({text}{more})"


class JvpSemantics:
    """Semantics on `Dual` values; emits primal and tangent operations into `next`."""

    def __init__(
        self, source: Program, next: Any, wrt: tuple[int, ...], reverse: bool = False
    ) -> None:
        self.next = next
        self.emit = Emitter(next)
        self.parameter_count = len(source.parameters)
        self.wrt = wrt
        self.tangent_position = {index: position for position, index in enumerate(wrt)}
        self.reverse = reverse
        self.jvp_rules: Any = None  # the user's layer, also used inside scan bodies
        self.source = source
        self._tangent_free: set[int] | None = None

    def bind(self, op: Operation, args: list[Dual]) -> Any:
        primals = [a.primal for a in args]
        tangents = [a.tangent for a in args]
        zero = all(isinstance(t, Zero) for t in tangents)
        if op.kind in LOOP_JVPS and not zero:
            if not self._tangent_reaches_outputs(op):
                zero = True  # e.g. a while_loop under stop_gradient: its primal loop only
            else:
                return LOOP_JVPS[op.kind](self, op, primals, tangents)
        outputs = self._primal(op, primals, tangents, perturbed=not zero)
        if op.kind == "parameter":
            return Dual(outputs, self._tangent_parameter(op))
        rule = rule_for(op.kind)
        if zero:
            tangent = (
                tuple(Zero(t) for t in op.result_types) if rule.multiple_results else Zero(op.type)
            )
        elif rule.jvp is None:
            raise AccyError(f"{op.kind} has no JVP rule")
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

    def _primal(self, op: Operation, primals: list, tangents: list, *, perturbed: bool) -> Any:
        # In reverse mode a differentiated custom call's result may come from its record's
        # forward rule (a custom_vjp's fwd), as JAX runs fwd under differentiation.
        if op.kind == "custom_call" and self.reverse and perturbed:
            flags = [not isinstance(t, Zero) for t in tangents]
            result = custom_call_primal(self.emit, op, primals, flags)
            if result is not None:
                return result
        return self.next.bind(op, primals)

    def _tangent_reaches_outputs(self, op: Operation) -> bool:
        """In reverse mode, whether a tangent of `op`'s results can reach an output (not only
        through stop_gradient): a loop whose tangents cannot is run for its primal values."""
        if not self.reverse:
            return True
        if self._tangent_free is None:
            self._tangent_free = _tangent_free_operations(self.source)
        return id(op) not in self._tangent_free

    def _tangent_parameter(self, op: Operation) -> Any:
        position = self.tangent_position.get(op.attrs["index"])
        if position is None:
            return Zero(op.type)
        position += self.parameter_count
        return self.emit.emit("parameter", [], {"index": position, "type": op.type})

    def finish(self, outputs: list[Any]) -> Any:
        duals = [_as_dual(d) for d in outputs]
        primals = [d.primal for d in duals]
        tangents = [self.emit.instantiate(d.tangent) for d in duals]
        return self.next.finish(primals + tangents)

    def builder_handle(self) -> Builder:
        return self.next.builder_handle()


def _tangent_free_operations(program: Program) -> set[int]:
    """The ids of `program`'s operations whose results reach its outputs only through
    stop_gradient, or not at all: their tangents are zero wherever they are used."""
    needed = set(program.outputs)
    free = set()
    for op in reversed(program.operations):
        if not any(r in needed for r in op.results):
            free.add(id(op))
        elif not (op.kind == "unary" and op.attrs.get("op") == "stop_gradient"):
            needed.update(op.operands)
    return free


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
    dual = JvpSemantics(source, graph, wrt, reverse)
    dual.jvp_rules = jvp_rules
    semantics = _DualResults(attach(jvp_rules, dual))
    program = run(source, semantics)
    return Linearized(program, len(source.parameters), len(source.outputs), wrt)


# -- scan: differentiated as a scan ------------------------------------------------------------


def _scan_jvp(s: JvpSemantics, op: Operation, primals: list, tangents: list) -> tuple:
    """The JVP of a scan, as scans (never unrolled).

    Forward mode emits one scan over primal and tangent carries together. For reverse mode
    (`s.reverse`), that JVP body is split (`loops.split`) into a primal scan, which also
    stacks the residuals the tangents need, and a linear scan over the tangents, which
    `pullback` transposes into a reverse scan (JAX's `_scan_linearize`).
    """
    attrs = op.attrs
    body: Program = attrs["body"]
    roles = Roles.of(attrs, len(op.operands))
    operand_types = op.operand_types
    nonzero = [
        not isinstance(t, Zero) and operand_types[i].dtype.is_float for i, t in enumerate(tangents)
    ]
    nonzero = carry_fixpoint(body, roles, nonzero, floats_only=True)
    wrt = tuple(i for i, flag in enumerate(nonzero) if flag)
    found = dependents(body, set(wrt))
    num_carry = roles.num_carry
    y_nonzero = [
        v in found and t.dtype.is_float
        for v, t in zip(body.outputs[num_carry:], body.output_types[num_carry:], strict=True)
    ]
    jvp_body = _jvp_body(body, roles, nonzero, y_nonzero, wrt, s)
    groups = (roles.consts, roles.carries, roles.xs)
    operands = []
    for group in groups:
        operands += [primals[i] for i in group]
        operands += [s.emit.instantiate(tangents[i]) for i in group if nonzero[i]]
    counts = [len(g) + sum(nonzero[i] for i in g) for g in groups]
    jvp_attrs = attrs.replace(body=jvp_body, num_consts=counts[0], num_carry=counts[1])
    tangent_carries = [j for j, i in enumerate(roles.carries) if nonzero[i]]
    tangent_ys = [k for k, flag in enumerate(y_nonzero) if flag]
    if not s.reverse:
        results = s.emit.emit("scan", operands, jvp_attrs, id=op.id)
    else:
        results = _emit_split(s, op, jvp_body, Roles.of(jvp_attrs, len(operands)), operands, wrt)
    # The JVP body's outputs: carries, tangent carries, ys, tangent ys.
    carries = list(results[:num_carry])
    carry_tangents = dict(zip(tangent_carries, results[num_carry : counts[1]], strict=True))
    rest = results[counts[1] :]
    ys = list(rest[: len(y_nonzero)])
    y_tangents = dict(zip(tangent_ys, rest[len(y_nonzero) :], strict=True))
    duals = [Dual(c, carry_tangents.get(j, Zero(c.ty))) for j, c in enumerate(carries)]
    duals += [Dual(y, y_tangents.get(k, Zero(y.ty))) for k, y in enumerate(ys)]
    return tuple(duals)


def _jvp_body(body, roles, nonzero, y_nonzero, wrt, s) -> Program:
    """The body of the JVP scan: parameters (consts, their tangents, carries, their tangents,
    x slices, their tangents), outputs (carries, their tangents, ys, their tangents)."""
    inner = linearize(body, wrt, jvp_rules=s.jvp_rules, reverse=s.reverse).program
    count = len(body.parameters)
    tangent_of = {index: count + position for position, index in enumerate(wrt)}
    order = []
    for group in (roles.consts, roles.carries, roles.xs):
        order += list(group)
        order += [tangent_of[i] for i in group if nonzero[i]]
    outputs = len(body.outputs)
    num_carry = roles.num_carry

    def fn(b, args):
        bound: list[Any] = [None] * len(order)
        for slot, position in enumerate(order):
            bound[position] = args[slot]
        results = run(inner, Inline(b, bound, inner))
        primal, tangent = results[:outputs], results[outputs:]
        carry_tangents = [tangent[j] for j, i in enumerate(roles.carries) if nonzero[i]]
        y_tangents = [tangent[num_carry + k] for k, flag in enumerate(y_nonzero) if flag]
        return primal[:num_carry] + carry_tangents + primal[num_carry:] + y_tangents

    types = [inner.parameter_types[p] for p in order]
    return simplify(define(body.name + "_jvp", types, fn))


def _emit_split(s: JvpSemantics, op: Operation, body: Program, roles, operands, wrt) -> list:
    """Emit the JVP scan as a primal scan (with stacked residuals) and a linear scan; return
    the JVP scan's results (the primal scan's and the linear scan's, in the body's order)."""
    attrs = op.attrs
    linear = [False] * roles.count
    # The tangent parameters of the JVP body: those after each group's primal parameters.
    for group, original in zip(
        (roles.consts, roles.carries, roles.xs),
        (
            range(attrs["num_consts"]),
            range(attrs["num_carry"]),
            range(attrs["num_consts"] + attrs["num_carry"], len(op.operands)),
        ),
        strict=True,
    ):
        for i in list(group)[len(original) :]:
            linear[i] = True
    parts = split(body, roles, linear, remat=bool(attrs.get("remat", False)))
    outputs: dict[int, Any] = {}
    hoisted: list = []
    if parts.hoist is not None:
        hoisted = run(
            parts.hoist, Inline(s.emit, [operands[i] for i in parts.hoist_operands], parts.hoist)
        )
    residuals: list = []
    if parts.needs_primal_scan:
        primal_attrs = attrs.replace(
            body=parts.primal_body,
            num_consts=parts.primal_num_consts,
            num_carry=parts.primal_num_carry,
        )
        primal_operands = [operands[i] for i in parts.primal_operands]
        if attrs.get("remat", False):  # only the carries are stacked: nothing else
            results = s.emit.emit("scan", primal_operands, primal_attrs, id=op.id)
        else:  # the xs' contractions with consts done once, before the loop
            results = emit_scan(s.emit, primal_operands, primal_attrs, id=op.id)
        outputs.update(zip(parts.primal_outputs, results, strict=False))
        residuals = list(results[len(parts.primal_outputs) :])

    def source(src: Source) -> Any:
        if src.where == "operand":
            return operands[src.index]
        return hoisted[src.index] if src.where == "hoisted" else residuals[src.index]

    if parts.linear_outputs:
        consts = [source(c) for c in parts.linear_consts]
        linear_operands = (
            consts
            + [operands[i] for i in parts.linear_carries]
            + [source(x) for x in parts.linear_xs]
        )
        linear_attrs = attrs.replace(
            body=parts.linear_body, num_consts=len(consts), num_carry=len(parts.linear_carries)
        )
        results = s.emit.emit("scan", linear_operands, linear_attrs)
        outputs.update(zip(parts.linear_outputs, results, strict=True))
    return [outputs[i] for i in range(len(body.outputs))]


def _cond_jvp(s: JvpSemantics, op: Operation, primals: list, tangents: list) -> tuple:
    """Forward mode: a cond over the branches' JVP programs (only the taken branch runs).
    Reverse mode: both branches inlined and their results selected by the predicate, which
    `pullback` transposes like any select (the untaken branch gets a zero cotangent)."""
    if s.reverse:
        selected = inline_cond(op.attrs, op.operand_types)
        return tuple(
            run(selected, _Bound(s, [Dual(p, t) for p, t in zip(primals, tangents, strict=True)]))
        )
    args = list(range(1, len(primals)))
    wrt = tuple(
        i - 1
        for i in args
        if not isinstance(tangents[i], Zero) and op.operand_types[i].dtype.is_float
    )
    bodies = []
    for role in ("true_body", "false_body"):
        inner = linearize(op.attrs[role], wrt, jvp_rules=s.jvp_rules).program
        bodies.append(simplify(inner))
    operands = list(primals) + [s.emit.instantiate(tangents[i + 1]) for i in wrt]
    attrs = op.attrs.replace(true_body=bodies[0], false_body=bodies[1])
    results = s.emit.emit("cond", operands, attrs, id=op.id)
    results = results if isinstance(results, tuple) else (results,)
    count = len(op.results)
    return tuple(Dual(results[k], results[count + k]) for k in range(count))


def _while_jvp(s: JvpSemantics, op: Operation, primals: list, tangents: list) -> tuple:
    """Forward mode: one while_loop over primal and tangent carries. Reverse mode is refused:
    the number of steps is only known at run time, so no residuals can be stacked for it."""
    if s.reverse:
        raise NotDifferentiable(
            "while_loop cannot be differentiated in reverse mode (grad, vjp): its number of "
            "steps is only known when it runs. Use builder.scan (or accy.scan, or "
            "accy.fori_loop with int bounds) over a fixed number of steps (a select stops "
            "early) for gradients; forward mode (accy.jvp) works"
        )
    attrs = op.attrs
    num_consts = attrs["num_consts"]
    count = len(op.operands)
    roles = Roles(num_consts, count - num_consts, count)
    body: Program = attrs["body"]
    nonzero = [
        not isinstance(t, Zero) and op.operand_types[i].dtype.is_float
        for i, t in enumerate(tangents)
    ]
    nonzero = carry_fixpoint(body, roles, nonzero, floats_only=True)
    wrt = tuple(i for i, flag in enumerate(nonzero) if flag)
    inner = linearize(body, wrt, jvp_rules=s.jvp_rules).program
    tangent_of = {index: count + position for position, index in enumerate(wrt)}
    order = []
    for group in (roles.consts, roles.carries):
        order += list(group)
        order += [tangent_of[i] for i in group if nonzero[i]]
    tangent_carries = [j for j, i in enumerate(roles.carries) if nonzero[i]]
    carries = roles.num_carry

    def jvp_body(b, args):
        bound: list[Any] = [None] * len(order)
        for slot, position in enumerate(order):
            bound[position] = args[slot]
        results = run(inner, Inline(b, bound, inner))
        return results[:carries] + [results[carries + j] for j in tangent_carries]

    def condition(b, args):
        primal = [args[slot] for slot, position in enumerate(order) if position < count]
        return run(attrs["cond_body"], Inline(b, primal, attrs["cond_body"]))

    types = [inner.parameter_types[p] for p in order]
    operands = []
    for group in (roles.consts, roles.carries):
        operands += [primals[i] for i in group]
        operands += [s.emit.instantiate(tangents[i]) for i in group if nonzero[i]]
    new_consts = num_consts + sum(nonzero[i] for i in roles.consts)
    new_attrs = attrs.replace(
        body=simplify(define(body.name + "_jvp", types, jvp_body)),
        cond_body=define(attrs["cond_body"].name + "_jvp", types, condition),
        num_consts=new_consts,
    )
    results = s.emit.emit("while_loop", operands, new_attrs, id=op.id)
    results = results if isinstance(results, tuple) else (results,)
    carry_tangents = dict(zip(tangent_carries, results[carries:], strict=True))
    return tuple(
        Dual(results[j], carry_tangents.get(j, Zero(results[j].ty))) for j in range(carries)
    )


class _Bound:
    """Runs a program's operations through `semantics`, its parameters bound to `args`."""

    def __init__(self, semantics: Any, args: list):
        self.semantics = semantics
        self.args = args

    def bind(self, op: Operation, args: list) -> Any:
        if op.kind == "parameter":
            return self.args[op.attrs["index"]]
        return self.semantics.bind(op, args)

    def finish(self, outputs: list) -> list:
        return outputs


LOOP_JVPS = {"scan": _scan_jvp, "cond": _cond_jvp, "while_loop": _while_jvp}
"""JVP rules of the kinds with sub-programs: they linearize their bodies with `linearize`
itself, which the kind table (in `accy.core`, below the transforms) cannot call."""
