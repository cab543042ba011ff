"""A Hypothesis generator of random well-typed named-axis programs.

A program is drawn as a *recipe*: parameter axis sets plus a list of steps, each naming the
values it uses by position and the axes it acts on by name. Because a recipe never mentions
layout, it can be traced again with every parameter's axes in another order: the named results
must not change. Steps draw from every kind of the closed set (compositions keep values finite
and away from the poles of log, div and sqrt).

Axis names come from a pool with one extent per name, so broadcasting by name always works;
steps that change an axis' extent (slice, pad, concatenate, gather) give it a fresh name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import permutations

import numpy as np
from hypothesis import strategies as st

import accy
from accy import f32, f64, i32, spec
from accy.trace import define

POOL = ("a", "b", "c", "d")

UNARY = {
    "sin": lambda x: x.sin(),
    "cos": lambda x: x.cos(),
    "tanh": lambda x: x.tanh(),
    "logistic": lambda x: x.logistic(),
    "neg": lambda x: -x,
    "exp": lambda x: x.tanh().exp(),
    "log": lambda x: (x * x + 1.0).log(),
    "sqrt": lambda x: (x * x + 1.0).sqrt(),
    "rsqrt": lambda x: (x * x + 1.0).rsqrt(),
    "abs": lambda x: x.abs(),
    "expm1": lambda x: x.tanh().expm1(),
    "log1p": lambda x: (x * x).log1p(),
}

BINARY = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / (y * y + 1.0),
    "max": lambda x, y: x.max(y),
    "min": lambda x, y: x.min(y),
    "pow": lambda x, y: (x.abs() + 0.5) ** y.tanh(),
}


@dataclass
class Recipe:
    extents: dict[str, int]
    parameters: list[tuple[str, ...]]
    steps: list[tuple] = field(default_factory=list)
    seed: int = 0

    def specs(self, orders: list[tuple[str, ...]] | None = None) -> list[accy.TensorType]:
        orders = orders or self.parameters
        return [spec(f32, {a: self.extents[a] for a in order}) for order in orders]

    def trace(self, orders=None, name="random_program") -> accy.Program:
        return define(name, self.specs(orders), lambda b, args: replay(self, b, list(args)))

    def inputs(self, orders=None) -> list[np.ndarray]:
        """Random inputs in the canonical layout, transposed into `orders`."""
        rng = np.random.default_rng(self.seed)
        arrays = []
        for canonical, order in zip(self.parameters, orders or self.parameters, strict=True):
            value = rng.standard_normal([self.extents[a] for a in canonical]).astype(np.float32)
            arrays.append(np.transpose(value, [canonical.index(a) for a in order]))
        return arrays


def replay(recipe: Recipe, b, values: list) -> object:
    for step in recipe.steps:
        values.append(APPLY[step[0]](b, values, *step[1:]))
    return values[-1]


def _fresh(b, x, axis, tag):
    return x.rename(axis, f"{axis}_{tag}")


def _gather_indices(b, extent, count, seed):
    rng = np.random.default_rng(seed)
    # One index past each end on purpose: gather and scatter_add clamp into range.
    values = rng.integers(-1, extent + 1, count).astype(np.int32)
    return values


def _apply_gather(b, v, i, axis, count, seed, tag):
    indices = _gather_indices(b, v[i].ty.extent(axis), count, seed)
    ids = b.constant(indices, spec(i32, {f"g_{tag}": count}))
    return v[i].gather(ids, axis)


def _apply_scatter(b, v, i, axis, count, seed, tag):
    indices = _gather_indices(b, v[i].ty.extent(axis), count, seed)
    ids = b.constant(indices, spec(i32, {f"g_{tag}": count}))
    updates = v[i].gather(ids, axis).sin()
    return v[i].scatter_add(ids, updates, axis)


def _apply_scan(b, v, i, axis, reverse):
    x = v[i]

    def body(bb, args):
        carry, piece = args
        new = carry * 0.5 + piece
        return new, new.tanh()

    carry = b.zeros(x.ty.without([axis]))
    (final,), (ys,) = b.scan(body, carries=[carry], xs=[x], axis=axis, reverse=reverse)
    return ys + final


def _apply_iota(b, v, i, axis):
    positions = b.iota(v[i].ty, axis)
    return v[i] + positions * 0.25


def _apply_constant(b, v, i, seed):
    # Drawn in a canonical (sorted) axis order, so that the constant means the same named
    # tensor whatever layout the traced value has.
    t = v[i].ty
    canonical = sorted(t.axes)
    values = np.random.default_rng(seed).standard_normal([t.extent(a) for a in canonical])
    laid_out = np.transpose(values, [canonical.index(a) for a in t.axes]).astype(np.float32)
    return v[i] * b.constant(laid_out, t)


CUSTOM_TRIPLE = "accy.test.triple"


def _apply_custom_call(b, v, i):
    # The version is the element count, so that each size links its own fixed-extent kernel.
    x = v[i]
    return b.custom_call(CUSTOM_TRIPLE, x.ty.size, [x], x.ty)


def triple_kernels(program: accy.Program, format: str = "cpu_object"):
    """A kernel registry implementing every `accy.test.triple` call of `program` (x * 3), built
    as `format` ("cpu_object" for the CPU backend, "cuda_ptx" for CUDA)."""
    from accy.kernel.examples import map_kernel

    registries = []
    for size in sorted(
        {op.attrs["version"] for op in program.operations if op.kind == "custom_call"}
    ):
        kernel = map_kernel(f"triple_{size}", f32, [f32], lambda inner, x: x.mul(inner, 3.0), size)
        artifact = kernel.create_kernel_call_artifact(
            accy.kernel.Limits.default, None, target=CUSTOM_TRIPLE, version=size, format=format
        )
        registries.append(artifact.registry())
    return accy.kernel.KernelCallRegistry.combine(*registries) if registries else None


REFERENCE_CUSTOM_CALLS = {CUSTOM_TRIPLE: lambda x: x * np.float32(3.0)}


APPLY = {
    "unary": lambda b, v, i, op: UNARY[op](v[i]),
    "binary": lambda b, v, i, j, op: BINARY[op](v[i], v[j]),
    "reduce": lambda b, v, i, op, axes: {"sum": v[i].sum, "max": v[i].max, "min": v[i].min}[op](
        axes
    ),
    "contract": lambda b, v, i, j, axes: v[i].contract(v[j], axes),
    "select": lambda b, v, i, j, k: b.select(v[i] > v[j], v[j], v[k]),
    "transpose": lambda b, v, i, order: v[i].transpose(*order),
    "merge": lambda b, v, i, axes, tag: v[i].merge(axes, f"m_{tag}"),
    "split": lambda b, v, i, axis, tag: v[i].split(
        axis, **{f"s1_{tag}": 2, f"s2_{tag}": v[i].ty.extent(axis) // 2}
    ),
    "slice": lambda b, v, i, axis, start, stop, step, tag: _fresh(
        b, v[i].slice(axis, start, stop, step), axis, tag
    ),
    "pad": lambda b, v, i, axis, low, high, interior, tag: _fresh(
        b, v[i].pad(axis, low, high, 0.5, interior), axis, tag
    ),
    "concatenate": lambda b, v, i, axis, tag: _fresh(
        b, b.concatenate([v[i], v[i].cos()], axis), axis, tag
    ),
    "gather": _apply_gather,
    "scatter_add": _apply_scatter,
    "scan": _apply_scan,
    "convert": lambda b, v, i: (v[i].convert(f64) * 1.5).convert(f32),
    "iota": _apply_iota,
    "constant": _apply_constant,
    "custom_call": _apply_custom_call,
}


@st.composite
def recipes(draw, max_steps: int = 6) -> Recipe:
    """Draw a random program recipe (see the module docstring)."""
    extents = {name: draw(st.integers(1, 4)) for name in POOL}
    parameter_count = draw(st.integers(1, 3))
    parameters = []
    for _ in range(parameter_count):
        axes = draw(st.lists(st.sampled_from(POOL), min_size=0, max_size=3, unique=True))
        parameters.append(tuple(axes))
    recipe = Recipe(extents, parameters, seed=draw(st.integers(0, 2**31 - 1)))
    b = accy.trace.Builder("draft")
    values = [b.parameter(t) for t in recipe.specs()]
    for tag in range(draw(st.integers(1, max_steps))):
        step = draw(_step(values, tag))
        values.append(APPLY[step[0]](b, values, *step[1:]))
        recipe.steps.append(step)
    return recipe


def _step(values, tag):
    def pick(kind_choices):
        return st.sampled_from(kind_choices)

    ranked = [i for i, x in enumerate(values) if x.ty.rank > 0]
    choices = ["unary", "binary", "select", "convert", "constant", "custom_call"]
    if ranked:
        choices += [
            "reduce",
            "transpose",
            "slice",
            "pad",
            "concatenate",
            "gather",
            "scatter_add",
            "scan",
            "iota",
            "merge",
            "split",
        ]
    if any(set(values[i].ty.axes) & set(values[j].ty.axes) for i in ranked for j in ranked):
        choices.append("contract")
    return pick(choices).flatmap(lambda kind: _STEP_DRAWS[kind](values, tag))


def _index(values, predicate=lambda x: True):
    return st.sampled_from([i for i, x in enumerate(values) if predicate(x)])


def _ranked(values):
    return _index(values, lambda x: x.ty.rank > 0)


def _with_axis(values, build):
    return _ranked(values).flatmap(
        lambda i: st.sampled_from(values[i].ty.axes).flatmap(lambda axis: build(i, axis))
    )


def _contract_draw(values, tag):
    pairs = [
        (i, j)
        for i, x in enumerate(values)
        for j, y in enumerate(values)
        if set(x.ty.axes) & set(y.ty.axes)
    ]

    def axes_for(pair):
        i, j = pair
        shared = [a for a in values[i].ty.axes if values[j].ty.has(a)]
        return st.lists(st.sampled_from(shared), min_size=1, unique=True).map(
            lambda axes: ("contract", i, j, tuple(axes))
        )

    return st.sampled_from(pairs).flatmap(axes_for)


def _slice_draw(values, tag):
    def build(i, axis):
        extent = values[i].ty.extent(axis)
        return st.tuples(st.integers(0, extent), st.integers(0, extent), st.integers(1, 3)).map(
            lambda t: ("slice", i, axis, min(t[0], t[1]), max(t[0], t[1]), t[2], tag)
        )

    return _with_axis(values, build)


def _merge_draw(values, tag):
    candidates = [i for i, x in enumerate(values) if x.ty.rank >= 2]
    if not candidates:
        return _STEP_DRAWS["unary"](values, tag)
    return st.sampled_from(candidates).flatmap(
        lambda i: st.sampled_from(list(permutations(values[i].ty.axes, 2))).map(
            lambda axes: ("merge", i, axes, tag)
        )
    )


def _split_draw(values, tag):
    candidates = [
        (i, a)
        for i, x in enumerate(values)
        for a in x.ty.axes
        if x.ty.extent(a) % 2 == 0 and x.ty.extent(a) > 0
    ]
    if not candidates:
        return _STEP_DRAWS["unary"](values, tag)
    return st.sampled_from(candidates).map(lambda c: ("split", c[0], c[1], tag))


_STEP_DRAWS = {
    "unary": lambda v, tag: st.tuples(_index(v), st.sampled_from(sorted(UNARY))).map(
        lambda t: ("unary", *t)
    ),
    "binary": lambda v, tag: st.tuples(_index(v), _index(v), st.sampled_from(sorted(BINARY))).map(
        lambda t: ("binary", *t)
    ),
    "select": lambda v, tag: st.tuples(_index(v), _index(v), _index(v)).map(
        lambda t: ("select", *t)
    ),
    "convert": lambda v, tag: _index(v).map(lambda i: ("convert", i)),
    "custom_call": lambda v, tag: (
        _index(v, lambda x: x.ty.size > 0).map(lambda i: ("custom_call", i))
        if any(x.ty.size > 0 for x in v)
        else _STEP_DRAWS["unary"](v, tag)
    ),
    "constant": lambda v, tag: st.tuples(_index(v), st.integers(0, 2**16)).map(
        lambda t: ("constant", *t)
    ),
    "reduce": lambda v, tag: _ranked(v).flatmap(
        lambda i: st.tuples(
            st.sampled_from(["sum", "max", "min"]),
            st.lists(st.sampled_from(v[i].ty.axes), min_size=1, unique=True).map(tuple),
        ).map(lambda t: ("reduce", i, *t))
    ),
    "transpose": lambda v, tag: _ranked(v).flatmap(
        lambda i: st.permutations(v[i].ty.axes).map(lambda order: ("transpose", i, tuple(order)))
    ),
    "slice": _slice_draw,
    "pad": lambda v, tag: _with_axis(
        v,
        lambda i, axis: st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 1)).map(
            lambda t: ("pad", i, axis, *t, tag)
        ),
    ),
    "concatenate": lambda v, tag: _with_axis(
        v, lambda i, axis: st.just(("concatenate", i, axis, tag))
    ),
    "gather": lambda v, tag: _with_axis(
        v,
        lambda i, axis: st.tuples(st.integers(1, 3), st.integers(0, 2**16)).map(
            lambda t: ("gather", i, axis, *t, tag)
        ),
    ),
    "scatter_add": lambda v, tag: _with_axis(
        v,
        lambda i, axis: st.tuples(st.integers(1, 3), st.integers(0, 2**16)).map(
            lambda t: ("scatter_add", i, axis, *t, tag)
        ),
    ),
    "scan": lambda v, tag: _with_axis(
        v, lambda i, axis: st.booleans().map(lambda r: ("scan", i, axis, r))
    ),
    "iota": lambda v, tag: _with_axis(v, lambda i, axis: st.just(("iota", i, axis))),
    "merge": _merge_draw,
    "split": _split_draw,
    "contract": _contract_draw,
}


def scalarized(program: accy.Program, seed: int) -> accy.Program:
    """sum(output * a random projection): a scalar loss whose gradient tests every output."""
    out_type = program.output_types[0]
    projection = np.random.default_rng(seed).standard_normal(out_type.extents)

    def body(b, args):
        out = b.call(program, args)
        return (out * b.constant(projection.astype(np.float32), out_type)).sum()

    return define(f"{program.name}_loss", list(program.parameter_types), body)
