"""Scans run in blocks of steps on the CPU: per-step outer products summed by one GEMM a block.

A scan whose carry sums a product of two per-step vectors at every step (the weight gradient
of a rematerialised RNN's reverse scan: `dW += h_t ⊗ g_t`, a 256 x 256 matrix read and written
per step) is memory-bound: each step streams the whole accumulator through the cache for a
rank-1 update. On the CPU such a scan becomes a scan over blocks of `K` steps whose body is
the original scan over the block's `K` steps:

- the inner scan stacks the product's per-step factors (`h_t`, `g_t`: `K` vectors) as extra
  outputs, and after it one `K`-deep GEMM adds the block's products to the accumulator, which
  the inner loop no longer carries;
- the inner scan's contractions of its xs with consts (a remat body's `x_t U`) run before its
  loop as one GEMM over the block (`transforms.scan_split.emit_scan`), and its stacked outputs that
  are contractions of other stacked outputs with consts (`g_t U^T`) after it
  (`emit_scan_sinking`).

The memory this adds is a block's factors and contractions, `K` vectors each: the scan's
memory stays its carries plus about one step's intermediates (what `remat=True` promises).
The results are the same up to float rounding (sums in another order). Only the CPU does this:
on CUDA a scan holding a scan cannot be one graph WHILE node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...core import Operation, Program
from ...core.kinds.registry import rule_for
from ...core.types import TensorType
from ...trace import define
from ...transforms.scan_split import (
    Product,
    Roles,
    dependents,
    emit_scan_sinking,
    invariant_values,
    stepwise_contractions,
    sum_terms,
    summed_product,
)
from ...transforms.simplify import eliminate_dead_code

BLOCK_STEPS = 64  # the largest block: a 64-deep GEMM is near BLAS's speed; factors stay small
MIN_BLOCK_STEPS = 8  # below this, a block's GEMMs would not pay for the extra loop


@dataclass(frozen=True)
class Outer:
    """An outer product `lhs ⊗ rhs` (of two values without common axes) laid out as `type`:
    how reverse mode writes a per-step weight gradient (`mul` of two `broadcast_in_dim`s)."""

    lhs: int
    rhs: int
    type: TensorType


@dataclass(frozen=True)
class SummedCarry:
    """A carry (at position `carry` among the carries) whose new value is the sum of `rest`
    (body values, the carry itself among them) and of `products` (`Product`s and `Outer`s),
    which are summed a block at a time instead."""

    carry: int
    rest: tuple[int, ...]
    products: tuple[Product | Outer, ...]

    def only_sums(self, body: Program, roles: Roles) -> bool:
        """Whether the carry's only per-step term is itself: then the inner loop drops it."""
        return self.rest == (body.parameters[roles.carries[self.carry]],)

    @property
    def factors(self) -> tuple[int, ...]:
        """The per-step values its products multiply."""
        pairs = (
            p.dot.operands if isinstance(p, Product) else (p.lhs, p.rhs) for p in self.products
        )
        return tuple(v for pair in pairs for v in pair)


@dataclass(frozen=True)
class Blocking:
    """How one scan is blocked: `size` steps a block; its accumulators."""

    size: int
    accumulators: tuple[SummedCarry, ...]


def block_size(length: int) -> int | None:
    """The block: the largest divisor of `length` of at most `BLOCK_STEPS` steps, or None when
    that is below `MIN_BLOCK_STEPS` (then the scan runs as it is).

    >>> block_size(16384), block_size(48), block_size(5), block_size(1021)
    (64, 48, None, None)
    """
    for size in range(min(BLOCK_STEPS, length), MIN_BLOCK_STEPS - 1, -1):
        if length % size == 0:
            return size
    return None


def _product(body: Program, roles: Roles, producer: dict, term: int, chain: tuple, varying) -> Any:
    """The term `term` (then its layout `chain`) as a `Product` or an `Outer` of two values
    `varying` accepts (they change with the step and do not depend on the accumulator) and
    that are small next to it, or None."""
    op = producer.get(term)
    if op is None or not op.type.dtype.is_float:
        return None
    if op.kind == "dot_general":
        factors = op.operands
        found: Any = Product(op, chain)
    elif op.kind == "mul" and not chain:
        broadcasts = [producer.get(v) for v in op.operands]
        if any(b is None or b.kind != "broadcast_in_dim" for b in broadcasts):
            return None
        factors = tuple(b.operands[0] for b in broadcasts)
        lhs, rhs = (body.type_of(v) for v in factors)
        if set(lhs.axes) & set(rhs.axes) or set(lhs.axes) | set(rhs.axes) != set(op.type.axes):
            return None
        extents = set(op.type.named_extents)
        if not (set(lhs.named_extents) | set(rhs.named_extents)) <= extents:
            return None  # a broadcast that also stretches an axis of extent 1
        if any(t.dtype != op.type.dtype for t in (lhs, rhs)):
            return None
        found = Outer(factors[0], factors[1], op.type)
    else:
        return None
    # Each factor not already stacked (an x) is stacked for a block: small next to the sum.
    xs = set(body.parameters[i] for i in roles.xs)
    small = 2 * sum(body.type_of(v).size for v in factors if v not in xs) <= op.type.size
    return found if small and all(varying(v) for v in factors) else None


def accumulators(body: Program, roles: Roles) -> tuple[SummedCarry, ...]:
    """The carries of `body` that add, at every step, products of two values that change with
    the step and do not depend on that carry, and that no other output reads."""
    invariant = invariant_values(body, roles.consts)
    producer = {r: op for op in body.operations for r in op.results}
    found = []
    for j, position in enumerate(roles.carries):
        if not body.output_types[j].dtype.is_float:
            continue
        reading = dependents(body, {position})
        if any(v in reading for k, v in enumerate(body.outputs) if k != j):
            continue
        rest, products = [], []

        def varying(v: int, reading: set[int] = reading) -> bool:
            return v not in invariant and v not in reading

        for term, chain in sum_terms(body, body.outputs[j]):
            product = _product(body, roles, producer, term, chain, varying)
            if product is None:
                rest.append(chain[-1].results[0] if chain else term)
            else:
                products.append(product)
        if products:
            found.append(SummedCarry(j, tuple(rest), tuple(products)))
    return tuple(found)


def _summed(b: Any, product: Product | Outer, stacked: dict, axis: str) -> Any:
    """The sum of `product` over a block's steps: one contraction over the stacked factors."""
    if isinstance(product, Product):
        return summed_product(b, product, stacked, axis)
    lhs, rhs = stacked[product.lhs], stacked[product.rhs]
    dims = {
        "lhs_batch": [],
        "lhs_contracting": [lhs.ty.position(axis)],
        "rhs_batch": [],
        "rhs_contracting": [rhs.ty.position(axis)],
    }
    return b.transpose(b.emit("dot_general", [lhs, rhs], dims), product.type.axes)


def blocking(op: Operation) -> Blocking | None:
    """How the CPU blocks the scan `op`, or None when it runs as it is: its length has no
    block size, or its body neither accumulates products nor contracts its xs with consts."""
    attrs = op.attrs
    size = block_size(attrs["length"])
    if size is None or not attrs["num_consts"]:
        return None
    body: Program = attrs["body"]
    roles = Roles.of(attrs, len(op.operands))
    found = accumulators(body, roles)
    if not found and not stepwise_contractions(body, roles):
        return None
    return Blocking(size, found)


def block_scans(program: Program, outputs_as_blocks: bool = False) -> Program:
    """`program` with its (top-level) scans that `blocking` accepts run in blocks of steps.

    With `outputs_as_blocks`, an output that is a blocked scan's stacked output is left laid
    out as blocks (`[t_blocks, t, ...]` for `[t, ...]`): the same bytes in the same order, so
    the CPU backend writes it straight into the caller's array of the original shape, where
    the reshape back would be a copy (a second output-sized buffer in the workspace).

    >>> import accy
    >>> def rnn(b, a):  # h' = tanh(h W + x U), remat: W's gradient accumulates per step
    ...     step = lambda b, v: [(v[0].contract(a[0], "h") + v[1].contract(a[1], "i"))
    ...                          .rename("o", "h").tanh()]
    ...     (h,), _ = b.scan(step, carries=[a[2]], xs=[a[3]], axis="t", remat=True)
    ...     return h.sum()
    >>> p = accy.trace.define("rnn", [accy.spec(accy.f32, h=3, o=3), accy.spec(accy.f32, i=2, o=3),
    ...     accy.spec(accy.f32, h=3), accy.spec(accy.f32, t=128, i=2)], rnn)
    >>> blocked = block_scans(accy.grad(p, (0, 1)))  # 2 blocks of 64 steps, each way
    >>> [(op.attrs["length"], [inner.attrs["length"] for inner in op.attrs["body"].operations
    ...   if inner.kind == "scan"]) for op in blocked.operations if op.kind == "scan"]
    [(2, [64]), (2, [64])]
    """
    plans = {n: blocking(op) for n, op in enumerate(program.operations) if op.kind == "scan"}
    if not any(plans.values()):
        return program

    blocks_of: dict[int, Any] = {}  # id of a reshaped stacked output -> it laid out as blocks

    def rebuild(b, args):
        env = dict(zip(program.parameters, args, strict=True))
        for n, op in enumerate(program.operations):
            if op.kind == "parameter":
                continue
            operands = [env[v] for v in op.operands]
            plan = plans.get(n)
            if plan is not None:
                results = _emit_blocked(b, op, operands, plan, blocks_of)
            else:
                result = b.emit(op.kind, operands, op.attrs, id=op.id)
                results = result if rule_for(op.kind).multiple_results else (result,)
            env.update(zip(op.results, results, strict=True))
        outputs = [env[v] for v in program.outputs]
        if outputs_as_blocks:
            outputs = [blocks_of.get(id(v), v) for v in outputs]
        return outputs

    return define(program.name, list(program.parameter_types), rebuild)


def _block_axis(op: Operation) -> str:
    """A name for the axis of blocks that no operand or result of `op` uses."""
    used = {a for t in (*op.operand_types, *op.result_types) for a in t.axes}
    name = op.attrs["axis"] + "_blocks"
    while name in used:
        name += "_"
    return name


def _emit_blocked(
    b: Any, op: Operation, operands: Sequence[Any], plan: Blocking, blocks_of: dict
) -> list:
    """The scan `op` as a scan over blocks whose body scans a block's steps (module docstring)."""
    attrs = op.attrs
    roles = Roles.of(attrs, len(operands))
    axis, size = attrs["axis"], plan.size
    count = attrs["length"] // size
    outer_axis = _block_axis(op)
    blocks = []
    for i in roles.xs:
        x = operands[i]
        rest = x.ty.without([axis])
        x = b.transpose(x, (axis, *rest.axes))
        blocks.append(b.reshape(x, ((outer_axis, count), (axis, size), *rest.named_extents)))
    outer_body = _outer_body(attrs, roles, plan, [v.ty.without([outer_axis]) for v in blocks])
    outer_attrs = attrs.replace(body=outer_body, axis=outer_axis, length=count)
    outer_operands = [*operands[: roles.num_consts + roles.num_carry], *blocks]
    results = b.emit("scan", outer_operands, outer_attrs)
    results = list(results) if isinstance(results, tuple) else [results]
    for k in range(roles.num_carry, len(results)):
        y = results[k]
        rest = y.ty.without([outer_axis, axis])
        results[k] = b.reshape(y, ((axis, count * size), *rest.named_extents))
        blocks_of[id(results[k])] = y
    return results


def _outer_body(attrs: Any, roles: Roles, plan: Blocking, block_types: list) -> Program:
    """The body of the scan over blocks: (consts, carries, a block of each x) -> (carries, a
    block of each y)."""
    body: Program = attrs["body"]
    summed = {a.carry: a for a in plan.accumulators}
    dropped = {a.carry for a in plan.accumulators if a.only_sums(body, roles)}
    inner_carries = [j for j in range(roles.num_carry) if j not in dropped]
    x_parameters = [body.parameters[i] for i in roles.xs]
    factors = list(
        dict.fromkeys(v for a in plan.accumulators for v in a.factors if v not in x_parameters)
    )
    inner = _inner_body(body, roles, summed, inner_carries, factors)
    inner_attrs = attrs.replace(body=inner, length=plan.size, num_carry=len(inner_carries))
    num_ys = len(body.outputs) - roles.num_carry
    types = [*body.parameter_types[: roles.num_consts + roles.num_carry], *block_types]

    def outer(b, args):
        consts = list(args[: roles.num_consts])
        carries = list(args[roles.num_consts : roles.num_consts + roles.num_carry])
        xs = list(args[roles.num_consts + roles.num_carry :])
        operands = consts + [carries[j] for j in inner_carries] + xs
        results = emit_scan_sinking(b, operands, inner_attrs, roles.num_consts, hoist=True)
        new_carries = list(carries)
        for position, j in enumerate(inner_carries):
            new_carries[j] = results[position]
        ys = list(results[len(inner_carries) : len(inner_carries) + num_ys])
        stacked = dict(zip(factors, results[len(inner_carries) + num_ys :], strict=True))
        stacked.update(zip(x_parameters, xs, strict=True))
        for j, accumulator in summed.items():
            total = new_carries[j]
            for product in accumulator.products:
                total = b.add(total, _summed(b, product, stacked, attrs["axis"]))
            new_carries[j] = total
        return new_carries + ys

    return define(body.name + "_blocks", types, outer)


def _inner_body(
    body: Program, roles: Roles, summed: dict, inner_carries: list[int], factors: list[int]
) -> Program:
    """`body` for a block's steps: the accumulators' products left out (their factors are
    extra stacked outputs, after the ys), the accumulators that only sum them dropped."""
    kept = [
        *roles.consts,
        *(roles.carries[j] for j in inner_carries),
        *roles.xs,
    ]
    parameters = [body.parameters[i] for i in kept]

    def step(b, args):
        env = dict(zip(parameters, args, strict=True))
        for op in body.operations:
            # Work that reads a dropped accumulator is its sum, which the block's GEMM does.
            if op.kind == "parameter" or not all(v in env for v in op.operands):
                continue
            result = b.emit(op.kind, [env[v] for v in op.operands], op.attrs)
            results = result if rule_for(op.kind).multiple_results else (result,)
            env.update(zip(op.results, results, strict=True))
        carries = []
        for j in inner_carries:
            if j in summed:
                terms = [env[v] for v in summed[j].rest]
                total = terms[0]
                for term in terms[1:]:
                    total = b.add(total, term)
                carries.append(total)
            else:
                carries.append(env[body.outputs[j]])
        ys = [env[v] for v in body.outputs[roles.num_carry :]]
        return carries + ys + [env[v] for v in factors]

    types = [body.type_of(v) for v in parameters]
    return eliminate_dead_code(define(body.name + "_block", types, step))
