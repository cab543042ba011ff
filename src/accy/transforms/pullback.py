"""Reverse mode: transpose the linear part of a linearized program.

The walk is JAX's backward pass. Values that depend on a tangent parameter are linear; every
other operation (primal outputs, residuals) is re-emitted in a forward sweep. Then the linear
operations are visited backwards: each kind's transpose rule turns the cotangent of its result
into cotangents of its linear operands, which accumulate by addition. Custom calls are
transposed by user VJP rules (`vjp_rules`), else by the VJP rule of their `accy.CustomCall`
record.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..core import Operation, Program
from ..core.builder import Builder
from ..core.ir import Attrs, permute_parameters
from ..core.kinds.registry import Linear, rule_for
from ..errors import AccyError
from ..interpret import Emitter, Graph, Inline, run
from ..trace import define
from .linearize import Linearized
from .scan_split import (
    Roles,
    Source,
    carry_fixpoint,
    emit_scan,
    emit_scan_sinking,
    invariant_values,
    replay,
    split,
    step_products,
    sum_terms,
    summed_product,
)
from .simplify import eliminate_dead_code, simplify


@dataclass(frozen=True)
class Pullback:
    """A transposed program: it takes the primal parameters, then one cotangent (seed) per
    output; it returns the primal outputs (when kept), then one cotangent per `wrt` input."""

    program: Program
    primal_parameter_count: int
    seed_parameter_count: int
    keep_primal_outputs: bool


class VjpContext:
    """What a user VJP rule receives for one operation being transposed."""

    def __init__(self, backward: _Backward, op: Operation, cotangent: Any, operands: list[Any]):
        self.op = op
        self.custom = SimpleNamespace(**dict(op.attrs))
        self.cotangent = cotangent
        self.operands = operands
        self._backward = backward

    def operand_is_active(self, index: int) -> bool:
        """Whether operand `index` is linear (needs a cotangent)."""
        return isinstance(self.operands[index], Linear)

    def contribute(self, index: int, value: Any) -> None:
        """Add `value` to the cotangent of operand `index`."""
        if not self.operand_is_active(index):
            raise AccyError(f"{self.op.kind}: operand {index} is not active; it takes no cotangent")
        expected = self.operands[index].type
        if value.ty != expected:
            raise AccyError(
                f"{self.op.kind} {self.op.attrs.get('target', '')}: the VJP rule contributed "
                f"{value.ty} to operand {index}, whose type is {expected}"
            )
        self._backward.accumulate(self.op.operands[index], value)

    def builder_handle(self) -> Builder:
        return self._backward.semantics.builder_handle()


class _Backward:
    def __init__(self, semantics: Any, vjp_rules: Any):
        self.semantics = semantics
        self.emit = Emitter(semantics)
        self.vjp_rules = vjp_rules
        self.cotangents: dict[int, Any] = {}

    def accumulate(self, value: int, cotangent: Any) -> None:
        previous = self.cotangents.get(value)
        self.cotangents[value] = (
            cotangent if previous is None else self.emit.add(previous, cotangent)
        )

    def transpose(self, op: Operation, cotangent: Any, operands: list[Any]) -> None:
        user_rule = getattr(self.vjp_rules, op.kind, None) if self.vjp_rules is not None else None
        if user_rule is not None:
            user_rule(VjpContext(self, op, cotangent, operands))
            return
        rule = rule_for(op.kind)
        if rule.transpose is None:
            raise AccyError(f"{op.kind} is not linear in its tangent operands: no transpose rule")
        # A custom call's transpose rule asks its record (accy.CustomCall) for the VJP rule.
        contributions = rule.transpose(self.emit, op, cotangent, operands)
        for value, operand, contribution in zip(op.operands, operands, contributions, strict=True):
            if contribution is not None and isinstance(operand, Linear):
                self.accumulate(value, contribution)


class _PrimalSweep:
    """Re-emits the non-linear operations (primal outputs and residuals) on demand, in program
    order, so that the transposed program holds only the primal work it needs."""

    def __init__(self, source: Program, semantics: Any, linear: set[int], first_tangent: int):
        self.semantics = semantics
        self.env: dict[int, Any] = {}
        self.producer: dict[int, tuple[int, Operation]] = {}
        for position, op in enumerate(source.operations):
            for result in op.results:
                self.producer[result] = (position, op)
        self.linear = linear
        # Every primal parameter stays a parameter, used or not, so the signature is kept.
        for op in source.operations:
            if op.kind == "parameter" and op.attrs["index"] < first_tangent:
                self.env[op.results[0]] = semantics.bind(op, [])

    def value(self, value: int) -> Any:
        if value not in self.env:
            for op in self._missing_operations(value):
                args = [self.env[v] for v in op.operands]
                result = self.semantics.bind(op, args)
                results = result if rule_for(op.kind).multiple_results else (result,)
                self.env.update(zip(op.results, results, strict=True))
        return self.env[value]

    def _missing_operations(self, value: int) -> list[Operation]:
        needed: dict[int, Operation] = {}
        stack = [value]
        while stack:
            v = stack.pop()
            position, op = self.producer[v]
            if v in self.env or position in needed:
                continue
            if v in self.linear:
                raise AccyError(f"internal: the linear value %{v} was needed as a residual")
            needed[position] = op
            stack.extend(op.operands)
        return [needed[p] for p in sorted(needed)]


def linear_values(program: Program, first_linear_parameter: int) -> set[int]:
    """Values that depend on a parameter whose index is >= first_linear_parameter."""
    linear = set(program.parameters[first_linear_parameter:])
    for op in program.operations:
        if any(v in linear for v in op.operands):
            linear.update(op.results)
    return linear


def pullback(
    linearized: Linearized,
    *,
    keep_primal_outputs: bool = False,
    semantics: Any = None,
    vjp_rules: Any = None,
) -> Pullback:
    """Transpose `linearized` into a program from output cotangents to input cotangents.

    `semantics` is what the transposed program is emitted into (a `Graph` by default, or hook
    layers over one); `vjp_rules` is an object whose method `custom_call(ctx)` transposes custom
    calls (see `VjpContext`).
    """
    source = linearized.program
    n = linearized.primal_parameter_count
    outputs_kept = linearized.primal_output_count
    semantics = semantics or Graph(Builder(source.name))
    backward = _Backward(semantics, vjp_rules)
    linear = linear_values(source, n)

    primal = _PrimalSweep(source, semantics, linear, n)

    tangent_outputs = source.outputs[outputs_kept:]
    for position, value in enumerate(tangent_outputs):
        seed = backward.emit.emit(
            "parameter", [], {"index": n + position, "type": source.type_of(value)}
        )
        if value in linear:
            backward.accumulate(value, seed)

    for op in reversed(source.operations):
        if op.kind == "parameter" or op.results[0] not in linear:
            continue
        if op.kind in LOOP_TRANSPOSES:
            cotangents = [backward.cotangents.pop(r, None) for r in op.results]
            if all(c is None for c in cotangents):
                continue
            operands = [
                Linear(t) if v in linear else primal.value(v)
                for v, t in zip(op.operands, op.operand_types, strict=True)
            ]
            contributions = LOOP_TRANSPOSES[op.kind](backward, op, cotangents, operands)
            for value, operand, contribution in zip(
                op.operands, operands, contributions, strict=True
            ):
                if contribution is not None and isinstance(operand, Linear):
                    backward.accumulate(value, contribution)
            continue
        if len(op.results) != 1:
            raise AccyError(f"{op.kind} with several results has no transpose rule")
        cotangent = backward.cotangents.pop(op.results[0], None)
        if cotangent is None:
            continue
        operands = [
            Linear(t) if v in linear else primal.value(v)
            for v, t in zip(op.operands, op.operand_types, strict=True)
        ]
        backward.transpose(op, cotangent, operands)

    gradients = []
    for parameter in source.parameters[n:]:
        cotangent = backward.cotangents.get(parameter)
        if cotangent is None:
            cotangent = backward.emit.zeros(source.type_of(parameter))
        gradients.append(cotangent)
    kept = [primal.value(v) for v in source.outputs[:outputs_kept]] if keep_primal_outputs else []
    program = semantics.finish(kept + gradients)
    if isinstance(program, Program):
        # Residual operands are materialized for every transposed operation; drop those that
        # no transpose rule used (a reduce's init, say).
        program = eliminate_dead_code(program)
    return Pullback(program, n, len(tangent_outputs), keep_primal_outputs)


# -- scan: transposed into a scan running the other way ----------------------------------------


def _transpose_scan(backward: _Backward, op: Operation, cotangents: list, operands: list) -> list:
    """The cotangents of a scan's linear operands, from a scan that runs the other way.

    A scan whose carries are all linear is transposed directly: the reverse scan's body is the
    pullback of the scan's body (primal work in the body is recomputed there, which is what
    `remat=True` asks for). A scan with primal carries is first split (`loops.split`) into a
    primal scan, emitted here to stack the residuals, and a linear scan, transposed as above.
    The reverse scan carries the cotangents of the carries and accumulates those of the linear
    consts (closures included: summed over the steps); the cotangents of the linear xs come out
    as its ys (JAX's `_scan_transpose`).
    """
    emit = backward.emit
    attrs = op.attrs
    body: Program = attrs["body"]
    roles = Roles.of(attrs, len(op.operands))
    linear = carry_fixpoint(
        body, roles, [isinstance(o, Linear) for o in operands], floats_only=False
    )
    if all(linear[i] for i in roles.carries):
        return _transpose_linear_scan(backward, attrs, body, roles, linear, cotangents, operands)
    parts = split(body, roles, linear, remat=bool(attrs.get("remat", False)))
    hoisted: list = []
    if parts.hoist is not None:
        values = [operands[i] for i in parts.hoist_operands]
        hoisted = run(parts.hoist, Inline(emit, values, parts.hoist))
    residuals: list = []
    if parts.residual_count:
        primal_attrs = attrs.replace(
            body=parts.primal_body,
            num_consts=parts.primal_num_consts,
            num_carry=parts.primal_num_carry,
        )
        primal_operands = [operands[i] for i in parts.primal_operands]
        if attrs.get("remat", False):  # only the carries are stacked: nothing else
            results = emit.emit("scan", primal_operands, primal_attrs)
        else:
            results = emit_scan(emit, primal_operands, primal_attrs)
        residuals = list(results[len(parts.primal_outputs) :])

    def source(src: Source) -> Any:
        if src.where == "operand":
            return operands[src.index]
        return hoisted[src.index] if src.where == "hoisted" else residuals[src.index]

    consts = [source(c) for c in parts.linear_consts]
    xs = [source(x) for x in parts.linear_xs]
    inner_operands = consts + [operands[i] for i in parts.linear_carries] + xs
    inner_roles = Roles(len(consts), len(parts.linear_carries), len(inner_operands))
    inner_linear = [isinstance(o, Linear) for o in inner_operands]
    for i in inner_roles.carries:
        inner_linear[i] = True
    inner_cotangents = [cotangents[o] for o in parts.linear_outputs]
    inner_attrs = attrs.replace(
        body=parts.linear_body, num_consts=len(consts), num_carry=len(parts.linear_carries)
    )
    inner = _transpose_linear_scan(
        backward,
        inner_attrs,
        parts.linear_body,
        inner_roles,
        inner_linear,
        inner_cotangents,
        inner_operands,
    )
    # Back to the original operands: linear consts, carries and xs are original operands.
    contributions: list = [None] * len(operands)
    sources = (
        list(parts.linear_consts)
        + [Source("operand", i) for i in parts.linear_carries]
        + list(parts.linear_xs)
    )
    for src, contribution in zip(sources, inner, strict=True):
        if contribution is not None and src.where == "operand":
            contributions[src.index] = contribution
    return contributions


def _transpose_linear_scan(
    backward: _Backward,
    attrs: Any,
    body: Program,
    roles: Roles,
    linear: list[bool],
    cotangents: list,
    operands: list,
) -> list:
    """Transpose a scan whose carries are all linear (`linear`: one flag per operand)."""
    emit = backward.emit
    primal_consts = [i for i in roles.consts if not linear[i]]
    primal_xs = [i for i in roles.xs if not linear[i]]
    linear_consts = [i for i in roles.consts if linear[i]]
    linear_xs = [i for i in roles.xs if linear[i]]
    carries = list(roles.carries)
    num_carry = roles.num_carry
    order = primal_consts + primal_xs + linear_consts + carries + linear_xs
    reordered = permute_parameters(body, order)
    first_linear = len(primal_consts) + len(primal_xs)
    transposed = pullback(
        Linearized(reordered, first_linear, 0, ()), vjp_rules=backward.vjp_rules
    ).program
    # transposed: (primal consts, primal x slices, seeds per body output) ->
    #             (cotangents of linear consts, of carries, of linear x slices)
    body_types = body.parameter_types
    outputs = body.output_types
    given_ys = [k for k in range(len(outputs) - num_carry) if cotangents[num_carry + k] is not None]
    n_pc, n_px, n_lc = len(primal_consts), len(primal_xs), len(linear_consts)
    operand_types = [o.type if isinstance(o, Linear) else o.ty for o in operands]
    axis = attrs["axis"]

    # What the reverse scan reads stacked already: primal xs and the given ys' cotangents.
    parameters = transposed.parameters
    stacked_operands = {parameters[n_pc + j]: operands[i] for j, i in enumerate(primal_xs)}
    for k in given_ys:
        stacked_operands[parameters[n_pc + n_px + num_carry + k]] = cotangents[num_carry + k]
    # A const's per-step cotangent: contractions summed after the loop, the rest in a carry.
    invariant = invariant_values(transposed, range(n_pc))
    factors: dict[int, None] = {}  # per-step values to stack as extra ys
    # Under remat the memory bar is the carries plus one step's intermediates: stacked factors
    # (one vector per step and product) would break it, so every term accumulates in a carry.
    splits = [(_added_terms(transposed, transposed.outputs[k]), []) for k in range(n_lc)]
    for _ in range(0 if attrs.get("remat", False) else 2):
        # Again, with the first pass's factors free (several products share one).
        free = set(stacked_operands) | set(factors)
        splits = [
            step_products(transposed, transposed.outputs[k], invariant, free) for k in range(n_lc)
        ]
        factors = {
            v: None
            for _, products in splits
            for product in products
            for v in product.dot.operands
            if v not in stacked_operands
        }
    accumulated = [k for k in range(n_lc) if splits[k][0]]

    def reverse_body(b, args):
        pc = args[:n_pc]
        at = n_pc
        accumulators = args[at : at + len(accumulated)]
        at += len(accumulated)
        carry_cts = args[at : at + num_carry]
        px = args[at + num_carry : at + num_carry + n_px]
        y_cts = dict(zip(given_ys, args[at + num_carry + n_px :], strict=True))
        seeds = list(carry_cts) + [
            y_cts[k] if k in y_cts else b.zeros(outputs[num_carry + k])
            for k in range(len(outputs) - num_carry)
        ]
        env = replay(b, transposed, list(pc) + list(px) + seeds)
        results = [env[v] for v in transposed.outputs]
        sums = []
        for accumulator, k in zip(accumulators, accumulated, strict=True):
            total = accumulator
            for term in splits[k][0]:
                total = b.add(total, _term(b, transposed, term, env))
            sums.append(total)
        new_carry_cts = results[n_lc : n_lc + num_carry]
        x_cts = results[n_lc + num_carry :]
        return sums + list(new_carry_cts) + list(x_cts) + [env[v] for v in factors]

    types = (
        [body_types[i] for i in primal_consts]
        + [body_types[linear_consts[k]] for k in accumulated]
        + [body_types[i] for i in carries]
        + [body_types[i] for i in primal_xs]
        + [outputs[num_carry + k] for k in given_ys]
    )
    reverse_program = simplify(define(body.name + "_transposed", types, reverse_body))
    scan_operands = (
        [operands[i] for i in primal_consts]
        + [emit.zeros(operand_types[linear_consts[k]]) for k in accumulated]
        + [
            cotangents[j] if cotangents[j] is not None else emit.zeros(outputs[j])
            for j in range(num_carry)
        ]
        + [operands[i] for i in primal_xs]
        + [cotangents[num_carry + k] for k in given_ys]
    )
    reverse_attrs = Attrs(
        {
            "body": reverse_program,
            "axis": axis,
            "length": attrs["length"],
            "num_consts": len(primal_consts),
            "num_carry": len(accumulated) + num_carry,
            "reverse": not attrs["reverse"],
            # A checkpointed region's reverse scan is checkpointed too, so that differentiating
            # it again (a second derivative) recomputes its primal work rather than storing it.
            **({"remat": True} if attrs.get("remat", False) else {}),
        }
    )
    results = _emit_reverse_scan(emit, scan_operands, reverse_attrs, len(primal_consts))
    carried = len(accumulated) + num_carry
    stacked_operands.update(zip(factors, results[carried + len(linear_xs) :], strict=True))
    contributions: list = [None] * len(operands)
    for k, i in enumerate(linear_consts):
        terms = [results[accumulated.index(k)]] if k in accumulated else []
        terms += [summed_product(emit, p, stacked_operands, axis) for p in splits[k][1]]
        contributions[i] = terms[0] if len(terms) == 1 else _add_all(emit, terms)
    for j, i in enumerate(carries):
        if linear[i] and isinstance(operands[i], Linear):
            contributions[i] = results[len(accumulated) + j]
    stacked = results[carried : carried + len(linear_xs)]
    for position, i in enumerate(linear_xs):
        wanted = operand_types[i].axes
        value = stacked[position]
        contributions[i] = value if value.ty.axes == wanted else emit.transpose(value, wanted)
    return contributions


def _added_terms(program: Program, value: int) -> list[int]:
    """`value` as the terms an `add` tree sums (each with its layout chain applied)."""
    return [chain[-1].results[0] if chain else term for term, chain in sum_terms(program, value)]


def _term(b: Any, program: Program, term: int, env: dict) -> Any:
    """A per-step term added into an accumulator, as emitted into `b` (`env`: `program`'s
    values there). An outer product (a dot_general contracting nothing) becomes a product of
    broadcasts: elementwise, so it fuses with the addition into one loop over the
    accumulator, where a dot would write the product out and the add read it back."""
    op = next((op for op in program.operations if term in op.results), None)
    if op is None or op.kind != "dot_general":
        return env[term]
    contracts = any(
        op.attrs[f"{side}_{what}"] for side in ("lhs", "rhs") for what in ("batch", "contracting")
    )
    if contracts or any(t.dtype != op.type.dtype for t in op.operand_types):
        return env[term]
    lhs, rhs = (b.broadcast_to(env[v], op.type) for v in op.operands)
    return b.mul(lhs, rhs)


def _emit_reverse_scan(emit: Any, operands: list, attrs: Any, num_consts: int) -> tuple:
    """Emit the reverse scan; its results (`loops.emit_scan_sinking`: stacked outputs that are
    contractions of other stacked outputs with consts, an RNN's `g_t U^T`, after the loop)."""
    return emit_scan_sinking(emit, operands, attrs, num_consts)


def _add_all(emit: Any, terms: list) -> Any:
    total = terms[0]
    for term in terms[1:]:
        total = emit.emit("add", [total, term])
    return total


def _transpose_cond(backward: _Backward, op: Operation, cotangents: list, operands: list) -> list:
    """The cotangents of a cond's linear operands (a cond on tangents: a custom JVP rule that
    branches). The cond is transposed as reverse mode differentiates one: both branches
    computed and each result selected by the predicate, then the pullback of that program,
    inlined here (the select gives the branch not taken a zero cotangent)."""
    emit = backward.emit
    attrs = op.attrs

    def both(b: Any, args: list) -> list:
        predicate, values = args[0], list(args[1:])
        on_true = run(attrs["true_body"], Inline(b, values, attrs["true_body"]))
        on_false = run(attrs["false_body"], Inline(b, values, attrs["false_body"]))
        return [b.select(predicate, t, f) for t, f in zip(on_true, on_false, strict=True)]

    inlined = define("cond_transposed", list(op.operand_types), both)
    primal = [i for i, o in enumerate(operands) if not isinstance(o, Linear)]
    linear = [i for i, o in enumerate(operands) if isinstance(o, Linear)]
    transposed = pullback(
        Linearized(permute_parameters(inlined, primal + linear), len(primal), 0, ()),
        vjp_rules=backward.vjp_rules,
    ).program
    seeds = [
        c if c is not None else emit.zeros(t)
        for c, t in zip(cotangents, op.result_types, strict=True)
    ]
    results = run(transposed, Inline(emit, [operands[i] for i in primal] + seeds, transposed))
    contributions: list = [None] * len(operands)
    for i, contribution in zip(linear, results, strict=True):
        contributions[i] = contribution
    return contributions


LOOP_TRANSPOSES = {"scan": _transpose_scan, "cond": _transpose_cond}
"""Transpose rules of the kinds with sub-programs (they call `pullback` on their bodies)."""
