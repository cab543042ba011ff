"""Programs that cover every kind, every step of the plan and every way the native backends
share work among threads: each with inputs and a tolerance against the reference evaluator.

Many operations share one program, so that the suite pays for few compiles; inputs come in
several layouts (operands whose axes are in another order, transposed and sliced views).

`test_cpu_kinds` runs them on the native CPU backend; `test_cuda_kinds` runs them on a GPU;
`test_cuda_codegen` compiles all of their CUDA C with `nvcc -ptx` (CI has nvcc and no GPU), so a
syntax error in generated code fails CI.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import accy
from accy import bf16, bool_, f16, f32, f64, i32, i64, spec, u8
from accy.core.kinds.elementwise import UNARY

Inputs = Callable[[np.random.Generator, accy.Program], list[np.ndarray]]
POSITIVE_ONLY = {"log", "log1p", "sqrt", "rsqrt"}
UNIT_INTERVAL = {"asin", "acos", "atanh", "erf_inv"}  # applied to x * 0.3, mostly inside (-1, 1)
DTYPES = [f32, f64, f16, bf16, i32, i64, u8, bool_]


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], accy.Program]
    inputs: Inputs
    rtol: float = 1e-5
    atol: float = 1e-6
    cpu_tolerance: tuple[float, float] | None = None  # (rtol, atol) on the CPU, if tighter

    def tolerance(self, backend: str) -> tuple[float, float]:
        """(rtol, atol) on `backend` ("cpu" or "cuda")."""
        if backend == "cpu" and self.cpu_tolerance is not None:
            return self.cpu_tolerance
        return self.rtol, self.atol


def held(values, t) -> np.ndarray:
    """Values as the reference holds them for type `t` (16-bit floats rounded)."""
    return np.asarray(values).astype(t.dtype.numpy)


def normal(rng, program, scale=1.0) -> list[np.ndarray]:
    return [held(rng.standard_normal(t.extents) * scale, t) for t in program.parameter_types]


def define(name, types, body) -> Callable[[], accy.Program]:
    return lambda: accy.trace.define(name, types, body)


# elementwise ---------------------------------------------------------------------------------


def _float_elementwise(b, args):
    x, positive, y = args
    outputs = [b.unary(op, _argument(op, x, positive)) for op in UNARY if op != "not"]
    outputs += [x + y, x - y, x * y, x / y, positive**y, x.max(y), x.min(y)]
    outputs += [x.atan2(y), x.rem(y), x.copysign(y), x // y, x % y]
    outputs += [b.compare(d, x, y).convert(x.dtype) for d in ("eq", "ne", "lt", "le", "gt", "ge")]
    outputs.append(b.select(x > y, x, y))
    return tuple(outputs)


def _argument(op, x, positive):
    if op in POSITIVE_ONLY:
        return positive
    if op in UNIT_INTERVAL:
        return x * 0.3
    return positive + 1.0 if op == "acosh" else x


def _float_inputs(rng, program):
    x = rng.uniform(-3, 3, (3, 5))
    x[0, :5] = [0.5, -2.5, 1.5, np.nan, 40.0]  # halves (round), NaN, a large logistic input
    y = rng.uniform(-3, 3, (5, 3))
    y[0, 0] = 0.5  # a tie with x[0, 0]
    positive = rng.uniform(0.1, 3, (3, 5))
    return [held(v, t) for v, t in zip((x, positive, y), program.parameter_types, strict=True)]


def _elementwise_case(dtype) -> Case:
    types = [spec(dtype, row=3, col=5), spec(dtype, row=3, col=5), spec(dtype, col=5, row=3)]
    tolerance = {f16: (2e-3, 2e-3), bf16: (1e-2, 1e-2)}.get(dtype, (2e-6, 1e-6))
    return Case(
        f"elementwise_{dtype}",
        define(f"elementwise_{dtype}", types, _float_elementwise),
        _float_inputs,
        *tolerance,
    )


def _integer_kinds(b, args):
    x, y = args
    outputs = [b.unary(op, x) for op in ("neg", "abs", "sign")]
    outputs += [x + y, x - y, x * y, x / y, x.max(y), x.min(y)]
    outputs += [x.rem(y), x // y, x % y, x & y, x | y, x ^ y, ~x]
    outputs += [x.shift_left(y), x.shift_right_logical(y), x.shift_right_arithmetic(y)]
    outputs += [b.compare(d, x, y) for d in ("eq", "lt", "ge")]
    outputs += [b.select(x > y, x, y), x.sum("n"), x.max("n"), x.min("n"), x.prod("n")]
    return tuple(outputs)


def _integer_case(dtype) -> Case:
    def inputs(rng, program):
        info = np.iinfo(dtype.numpy)
        signed = dtype != u8
        x = [info.min, info.max, -7 if signed else 7, 7, 0, 5, -5 if signed else 250, 9, 100, 3]
        y = [-1 if signed else 1, 2, 2, -2 if signed else 200, 0, 0, 3, -4 if signed else 4, 7, 3]
        # The last two shift by 40 (past i32's width) and by 31 or 7 (the top bit).
        x += [1, 2, -9 if signed else 9, -100 if signed else 200]
        y += [1, 0, 40, 31 if signed else 7]
        return [np.array(x, dtype.numpy), np.array(y, dtype.numpy)]

    return Case(
        f"integers_{dtype}",
        define(f"integers_{dtype}", [spec(dtype, n=14)] * 2, _integer_kinds),
        inputs,
    )


def _conversion_inputs(rng, program):
    floats = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 255.7, -0.5, 1.5, 7e4, 0.0])
    integers = np.array([-1, 0, 1, 127, 128, 255, 256, 70000, -70000, 2**31 - 1])
    inputs = []
    for t in program.parameter_types:
        if t.dtype == bool_:
            values = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 0], bool)
        elif t.dtype.is_float:
            with np.errstate(over="ignore"):
                values = floats.astype(np.float32 if t.dtype == bf16 else t.dtype.numpy)
        else:
            values = integers.astype(t.dtype.numpy)
        inputs.append(held(values, t))
    return inputs


def _convert_all(b, args):
    return tuple(x.convert(d) for x in args for d in DTYPES if d != x.dtype)


def _bitcasts(b, args):
    x, y, n, m = args  # f32, f64, i32, i64
    return (
        x.bitcast_convert(i32),
        y.bitcast_convert(i64),
        n.bitcast_convert(f32),
        m.bitcast_convert(f64),
        (x * 2.0).bitcast_convert(i32).bitcast_convert(f32),
        b.unary("not", x.bitcast_convert(i32)) & n,
        x.ne(x) | (x > 0.0),
        (x > 0.0) ^ (y.convert(f32) > 1.0),
    )


# layouts -------------------------------------------------------------------------------------


def _layouts(b, args):
    x, y = args  # x: [a, b, c]; y: [c, a]
    e = x.exp()
    constant = np.arange(12, dtype=np.float32).reshape(3, 4)
    return (
        e.transpose("c", "a", "b"),
        x.transpose("c", "a", "b"),
        b.broadcast_to(y, spec(f32, b=4, c=5, a=3)),
        b.broadcast_to(y.tanh(), spec(f32, b=4, c=5, a=3)),
        x.merge(("a", "b"), "ab"),
        e.merge(("b", "c"), "bc"),
        e.transpose("c", "b", "a").merge(("c", "b"), "cb"),
        x.transpose("c", "b", "a").merge(("c", "b"), "cb"),
        e.split("c", c1=1, c2=5),
        x.slice("b", 1, 4, 2),
        e.slice("c", 0, 5, 3),
        x.pad("b", 1, 2, value=-1.0, interior=1),
        e.pad("c", 2, 0, value=0.5),
        b.concatenate([x, e, x], "b"),
        b.concatenate([y, y.exp()], "a"),
        b.iota(spec(f32, a=3, b=4), "b"),
        b.iota(spec(i32, q=6), "q"),
        b.constant(constant, spec(f32, a=3, b=4)) * x.sum("c"),
        b.constant(np.array([np.inf, -np.inf, 1.0], np.float32), spec(f32, a=3)) + y.sum("c"),
    )


# reductions ----------------------------------------------------------------------------------


def _reductions(b, args):
    x, y = args  # x: [a, b, c]; y: [c, a]
    e = x.exp()
    return (
        x.sum("b"),  # kept innermost: accumulates in the result ("columns")
        x.sum(("a", "c")),
        e.max("a"),
        e.min("c"),
        x.prod("c"),
        x.sum(),
        x.max(("a", "b", "c")),
        e.sum("a").exp(),
        y.sum("c"),
        y.max("a"),
        b.reduce(x, b.scalar(f32, 2.5), "sum", ()),
        b.reduce(x, y.sum(), "max", "b"),  # an init that is itself computed
    )


def _reduction_inputs(rng, program):
    inputs = normal(rng, program)
    inputs[0][0, 0, 0] = np.nan  # max and min propagate NaN, as NumPy's do
    return inputs


def _other_reductions(dtype) -> Case:
    def reduce_all(b, args):
        ops = ("max", "min") if dtype == bool_ else ("sum", "max", "min", "prod")
        methods = {"max": b.reduce_max, "min": b.reduce_min, "sum": b.sum, "prod": b.prod}
        return tuple(methods[op](args[0], axes) for op in ops for axes in ("a", "b", None))

    def inputs(rng, program):
        if dtype == bool_:
            return [rng.random((6, 7)) > 0.5]
        if dtype == i32:
            return [rng.integers(-3, 4, (6, 7)).astype(np.int32)]
        return [held(rng.uniform(0.5, 1.5, (6, 7)), program.parameter_types[0])]

    return Case(
        f"reductions_{dtype}",
        define(f"reductions_{dtype}", [spec(dtype, a=6, b=7)], reduce_all),
        inputs,
        1e-2,
        1e-2,
    )


def _large_reductions(b, args):
    x, m, tall = args  # x: [n]; m: [row, col]; tall: [step, few]
    wave = x.tanh() * (-x * x).exp() + x.abs()
    return (
        wave.sum(),  # one result: blocks over chunks, then a second pass
        wave,
        x.max(),
        m.sum("col"),  # rows of 4096: a warp per row
        m.exp().max("row"),  # columns: a thread per result
        tall.sum("step"),  # few results over a long axis: chunked, then combined
        tall.max("step"),
        m.sum(),
    )


def _large_inputs(rng, program):
    inputs = normal(rng, program)
    inputs[2][5, 1] = np.nan
    return inputs


# large constants: data loaded with the code (CPU read-only section, CUDA workspace) ----------

BIG = np.random.default_rng(7).standard_normal((24, 40)).astype(np.float32)  # 960 elements


def _large_constants(b, args):
    x, h = args  # x: [row=24, col=40]; h: [col=40]
    t = spec(f32, row=24, col=40)
    table = b.constant(
        np.arange(960, dtype=np.int32).reshape(24, 40) % 7 - 3, spec(i32, row=24, col=40)
    )
    return (
        x * b.constant(BIG, t) + b.constant(BIG, t).exp(),  # one copy of the same content
        table.convert(f32) * x,
        b.constant(BIG.astype(np.float16), spec(f16, row=24, col=40)).convert(f32) - x,
        b.select(b.constant(BIG > 0, spec(bool_, row=24, col=40)), x, -x),
        # a scan body that reads a large constant: its place must not move with the body
        b.scan(
            lambda inner, a: (
                (a[0] * inner.constant(BIG[0] + 2.0, spec(f32, col=40)) + a[1]).tanh(),
            ),
            carries=[h],
            xs=[x],
            axis="row",
        )[0][0],
    )


# contractions --------------------------------------------------------------------------------


def _contractions(b, args):
    x, y, z, w = args  # x: [b, m, k]; y: [k, b, n]; z: [m, k, q]; w: [k]
    computed = x.exp() if x.dtype.is_float else x * x
    return (
        x.contract(y, "k"),  # batched; the right operand's batch axis is not leading
        b.dot_general(x, x.rename("m", "r"), (2,), (2,), (0,), (0,)),  # x @ x^T per batch
        z.contract(y, "k"),  # free axes around the contracted one: packed for BLAS
        computed.contract(y, "k"),
        x.transpose("k", "m", "b").contract(y, "k"),  # a transposed view, no copy
        w.contract(w, "k"),
        b.dot_general(z, z.rename("q", "s"), (0, 1), (0, 1)),  # two contracted axes
    )


def _contraction_case(dtype, extents=(2, 3, 4, 5, 2)) -> Case:
    nb, m, k, n, q = extents
    types = [
        spec(dtype, b=nb, m=m, k=k),
        spec(dtype, k=k, b=nb, n=n),
        spec(dtype, m=m, k=k, q=q),
        spec(dtype, k=k),
    ]

    def inputs(rng, program):
        if dtype.is_float:
            return normal(rng, program)
        return [rng.integers(-5, 5, t.extents).astype(dtype.numpy) for t in types]

    tolerance = (1e-2, 1e-2) if dtype == f16 else (1e-4, 1e-4)
    cpu_tolerance = None if dtype == f16 else (1e-5, 1e-5)
    name = f"contractions_{dtype}_{m}"
    return Case(name, define(name, types, _contractions), inputs, *tolerance, cpu_tolerance)


def _mlp_loss(b, args):
    x, w1, w2, y = args
    hidden = x.contract(w1, "in").tanh()
    logits = hidden.contract(w2, "hidden")
    top = logits.max("out")
    shifted = logits - top
    lse = shifted.exp().sum("out").log() + top
    return (lse - (logits * y).sum("out")).sum("batch")


def _mlp() -> accy.Program:
    types = [
        spec(f32, batch=64, **{"in": 96}),
        spec(f32, hidden=80, **{"in": 96}),
        spec(f32, hidden=80, out=10),
        spec(f32, batch=64, out=10),
    ]
    loss = accy.trace.define("mlp", types, _mlp_loss)
    return accy.value_and_grad(loss, wrt=(1, 2))


# indexing ------------------------------------------------------------------------------------


def _indexing(b, args):
    table, ids, ids2, updates = args  # table: [v, c]; ids: [t]; ids2: [p, q]; updates: [t, c]
    return (
        table.gather(ids, "v"),
        table.exp().gather(ids2, "v"),
        table.transpose("c", "v").gather(ids, "v"),
        table.scatter_add(ids, updates, "v"),
        b.zeros(table.ty).scatter_add(ids, updates.exp(), "v"),
        table.gather(ids, "v").sum("t"),
    )


def _indexing_inputs(rng, program):
    return [
        rng.standard_normal((5, 3)).astype(np.float32),
        np.array([0, -3, 4, 9], np.int32),  # below and beyond the table; 4 twice after clamping
        np.array([[1, 7], [-1, 2]], np.int64),
        rng.standard_normal((4, 3)).astype(np.float32),
    ]


def _scatter_case(dtype) -> Case:
    def body(b, args):
        table, ids, updates = args
        return table.scatter_add(ids, updates, "v"), table.gather(ids, "v")

    types = [spec(dtype, v=3, c=2), spec(i32, t=6), spec(dtype, t=6, c=2)]

    def inputs(rng, program):
        if dtype == bool_:
            values = [rng.random(t.extents) > 0.5 for t in types]
        elif not dtype.is_float:
            values = [rng.integers(-5, 5, t.extents).astype(dtype.numpy) for t in types]
        else:
            values = [held(rng.uniform(-1, 1, t.extents), t) for t in types]
        values[1] = np.array([0, 0, 0, 1, 1, 2], np.int32)
        return values

    exact = dtype in (f16, bf16, i32, i64, u8, bool_)  # bit for bit
    tolerance = (0.0, 0.0) if exact else (1e-6, 1e-6)
    name = f"scatter_{dtype}"
    return Case(name, define(name, types, body), inputs, *tolerance)


def _scatter_modes_case(dtype) -> Case:
    """The kind `scatter` (mul, max, min), scatter-set, dropped indices and batch axes."""
    combines = ["max", "min", "set"] + ([] if dtype == bool_ else ["multiply", "add"])

    def body(b, args):
        table, ids, updates, rows = args  # table [r, v, c]; ids [t]; updates [t, c]; rows [r, t]
        flat = b.reshape(table.slice("r", 0, 1), [("v", 3), ("c", 2)])
        results = [flat.scatter(ids, updates, "v", combine=c) for c in combines]
        results += [flat.scatter(ids, updates, "v", combine=c, mode="drop") for c in combines]
        batch_updates = b.broadcast_to(updates, spec(dtype, r=2, t=6, c=2))
        results.append(table.scatter(rows, batch_updates, "v", combine=combines[0], mode="drop"))
        results.append(table.gather(rows, "v", mode="fill"))
        return tuple(results)

    types = [spec(dtype, r=2, v=3, c=2), spec(i32, t=6), spec(dtype, t=6, c=2), spec(i32, r=2, t=6)]

    def inputs(rng, program):
        if dtype == bool_:
            values = [rng.random(t.extents) > 0.5 for t in types[:3]]
        elif not dtype.is_float:
            values = [rng.integers(-5, 5, t.extents).astype(dtype.numpy) for t in types[:3]]
        else:
            values = [held(rng.uniform(-2, 2, t.extents), t) for t in types[:3]]
        values[1] = np.array([0, 2, 0, -1, 1, 9], np.int32)
        return [*values, np.array([[0, 2, 2, 5, 1, -1], [1, 1, 0, 0, 3, 2]], np.int32)]

    name = f"scatter_modes_{dtype}"
    return Case(name, define(name, types, body), inputs, 0.0, 0.0)


def _scatter_modes_grad() -> accy.Program:
    def loss(b, args):
        table, ids, updates, rows = args
        total = table.gather(rows, "v", mode="fill", fill_value=0.0).sum()
        for combine in ("multiply", "max", "min", "set"):
            s = table.scatter(rows, updates, "v", combine=combine, mode="drop")
            total = total + (s * s.sin()).sum()
        return total

    types = [
        spec(f32, r=2, v=3, c=2),
        spec(i32, t=6),
        spec(f32, r=2, t=6, c=2),
        spec(i32, r=2, t=6),
    ]
    return accy.value_and_grad(accy.trace.define("scatter_modes_loss", types, loss), wrt=(0, 2))


def _scatter_grad_inputs(rng, program):
    values = rng.permutation(np.linspace(0.3, 2.0, 36)).astype(np.float32)
    rows = np.array([[0, 2, 2, 5, 1, -1], [1, 1, 0, 0, 3, 2]], np.int32)
    return [values[:12].reshape(2, 3, 2), np.zeros(6, np.int32), values[12:].reshape(2, 6, 2), rows]


def _sort_case(dtype, n: int = 1000) -> Case:
    """The kind sort: both directions, carried operands (another dtype, a fused one), argsort
    and top_k, along an inner and an outer axis; many ties, NaN and -0.0 among floats."""

    def body(b, args):
        keys, other = args  # keys [r, n]; other [n, r] (i32)
        values, carried = b.sort([keys, other], "n")
        return (
            values,
            carried,
            keys.argsort("n", descending=True),
            *keys.top_k(min(5, n), "n"),
            keys.sort("r"),
            b.sort([keys, (other * 3).convert(f32)], "n", descending=True)[1],
        )

    types = [spec(dtype, r=3, n=n), spec(i32, n=n, r=3)]

    def inputs(rng, program):
        if dtype == bool_:
            keys = rng.random((3, n)) < 0.5
        elif dtype.is_float:
            keys = held(rng.integers(-40, 40, (3, n)) * 0.5, types[0])
            keys[0, ::13] = np.nan
            keys[1, ::7] = -0.0
        else:
            keys = rng.integers(0, 50, (3, n)).astype(dtype.numpy)
        return [keys, rng.integers(-99, 99, (n, 3)).astype(np.int32)]

    name = f"sort_{dtype}_{n}"
    return Case(name, define(name, types, body), inputs, 0.0, 0.0)


def _sort_grad() -> accy.Program:
    def loss(b, args):
        x, y = args
        values, carried = b.sort([x, y], "n", descending=True)
        top, _ = x.top_k(4, "n")
        weights = b.iota(spec(f32, n=300), "n").convert(f32) * 0.01
        return (values * weights).sum() + (carried * carried * weights).sum() + top.sum()

    types = [spec(f32, r=2, n=300), spec(f32, r=2, n=300)]
    return accy.value_and_grad(accy.trace.define("sort_loss", types, loss), wrt=(0, 1))


def _embedding(b, args):
    table, ids = args
    g = table.gather(ids, "vocab")
    return (g * g).sum()


def _embedding_grad() -> accy.Program:
    types = [spec(f32, vocab=1000, channel=64), spec(i32, token=4096)]
    return accy.value_and_grad(accy.trace.define("embedding", types, _embedding), wrt=(0,))


def _embedding_inputs(rng, program):
    return [
        rng.standard_normal((1000, 64)).astype(np.float32),
        rng.integers(-10, 1010, 4096).astype(np.int32),
    ]


# scans, empty tensors ------------------------------------------------------------------------


def _scans(b, args):
    w, h0, xs, xt = args  # xs: [step, c] (axis outermost); xt: [c, step] (axis inside)

    def cell(_, values):
        w, h, x, y = values
        new = (h * w + x).tanh() + y
        return new, new.sum("c"), h

    forward = b.scan(cell, consts=[w], carries=[h0], xs=[xs, xt], axis="step")
    backward = b.scan(cell, consts=[w], carries=[h0], xs=[xs, xt], axis="step", reverse=True)
    return (*forward[0], *forward[1], *backward[0], *backward[1])


def _scan_zero(b, args):
    def cell(_, values):
        return values[0] + values[1], values[0] * 2.0

    carries, ys = b.scan(cell, carries=[args[0]], xs=[args[1]], axis="s")
    return (*carries, *ys)


def _scan_matmul(b, args):
    w, h0, xs = args  # a recurrence whose body has a GEMM on its carry

    def cell(_, values):
        w, h, x = values
        new = (h.contract(w, "i").rename("o", "i") + x).tanh()
        return new, new.sum("i")

    carries, ys = b.scan(cell, consts=[w], carries=[h0], xs=[xs], axis="step")
    return (*carries, *ys)


def _empty(b, args):
    x, empty, no_ids = args
    return (
        empty.sum(),
        empty.max(),
        b.concatenate([x, empty.rename("m", "n")], "n"),
        x.gather(no_ids, "n"),
        empty.exp(),
        b.broadcast_to(x, spec(f32, n=3, z=0)).sum("z"),
        x.contract(b.zeros(spec(f32, n=3, k=0)), "n"),
    )


def _empty_inputs(rng, program):
    return [np.ones(3, np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32)]


def _elementwise_grad() -> accy.Program:
    def loss(b, args):
        x = args[0]
        return (x.tanh() * (-x * x).exp() + x.abs()).sum()

    program = accy.trace.define("elementwise_loss", [spec(f32, n=300_001)], loss)
    return accy.value_and_grad(program, wrt=(0,))


def _compositions(b, args):
    x, start = args  # x: [n, m]; start: i32 scalar
    return (
        x.flip("n"),
        x.roll(2, "m"),
        x.tril("n", "m", 1),
        x.cumsum("n"),
        x.cumprod("m", reverse=True),
        x.cummax("n"),
        x.pad("n", 2, 3, mode="reflect"),
        x.pad("m", -1, 2, value=0.5),
        x.argmax("n"),
        x.argmin("m"),
        x.dynamic_slice({"n": start}, {"n": 3}),
        x.dynamic_update_slice(x.slice("n", 0, 2).exp(), {"n": start}),
        accy.nn.gelu(x),
        accy.nn.softplus(x * 20.0),
        accy.nn.mish(x),
        accy.nn.rms_norm(x, "m"),
        *b.sort([x, x.exp()], "n"),
        *x.top_k(2, "m"),
    )


def _compositions_grad() -> accy.Program:
    def loss(b, args):
        x, start = args
        window = x.dynamic_slice({"n": start}, {"n": 2})
        y = accy.nn.logaddexp(x.cumsum("n"), x.flip("m")) + x.pad("n", 1, 1, mode="edge").slice(
            "n", 1, 7
        )
        top, _ = x.top_k(3, "n")
        extra = accy.nn.silu(x).cummax("m").sum() + (x.sort("m") * top.sum()).sum()
        return (y * y).sum() + (window * window).sum() + extra

    types = [spec(f32, n=6, m=5), spec(i32)]
    return accy.value_and_grad(accy.trace.define("compositions_loss", types, loss), wrt=(0,))


def _composition_inputs(rng, program):
    return [rng.standard_normal((6, 5)).astype(np.float32), np.array(4, np.int32)]


def _random(b, args):
    first, second, third = accy.random.split(args[0], 3)
    t = spec(f32, row=64, col=100)
    return (
        accy.random.bits(first, spec(i32, n=1000)),
        accy.random.uniform(second, t, -1.0, 3.0),
        accy.random.uniform(second, spec(f64, n=100)),
        accy.random.normal(third, t),
        accy.nn.dropout(first, accy.random.uniform(third, t), 0.5),
    )


def _conv_block() -> accy.Program:
    """A small ResNet basic block (two 3x3 convolutions, a strided one, grouped, pooled):
    loss and gradients."""

    def loss(b, args):
        x, k1, k2 = args
        spatial = ("h", "w")
        y = accy.nn.relu(x.conv(k1, spatial, "c", "o", padding="same"))
        y = y.rename("o", "c").conv(k2, spatial, "c", "o", stride=2, padding="same", groups=2)
        pooled = accy.nn.max_pool(y, {"h": 2, "w": 2}) + accy.nn.avg_pool(y, {"h": 2, "w": 2})
        return (pooled * pooled).sum()

    types = [spec(f32, n=2, h=8, w=8, c=4), spec(f32, h=3, w=3, c=4, o=4)]
    types.append(spec(f32, h=3, w=3, c=2, o=4))
    return accy.value_and_grad(accy.trace.define("conv_block", types, loss), wrt=(0, 1, 2))


def _outputs_that_are_inputs(b, args):
    x, y = args
    return x, x, y * 2.0, y * 2.0


CASES = [
    *(_elementwise_case(d) for d in (f32, f64, f16, bf16)),
    *(_integer_case(d) for d in (i32, i64, u8)),
    Case(
        "conversions",
        define("conversions", [spec(d, n=10) for d in DTYPES], _convert_all),
        _conversion_inputs,
        1e-2,
        1e-2,
    ),
    Case(
        "bitcasts",
        define("bitcasts", [spec(d, n=10) for d in (f32, f64, i32, i64)], _bitcasts),
        _conversion_inputs,
        0.0,
        0.0,
    ),
    Case(
        "layouts",
        define("layouts", [spec(f32, a=3, b=4, c=5), spec(f32, c=5, a=3)], _layouts),
        normal,
    ),
    Case(
        "reductions",
        define("reductions", [spec(f32, a=3, b=4, c=5), spec(f32, c=5, a=3)], _reductions),
        _reduction_inputs,
    ),
    *(_other_reductions(d) for d in (f16, bf16, i32, bool_)),
    Case(
        "large_reductions",
        define(
            "large_reductions",
            [spec(f32, n=1_000_003), spec(f32, row=300, col=4096), spec(f32, step=50_000, few=3)],
            _large_reductions,
        ),
        _large_inputs,
        1e-4,
        1e-3,
    ),
    Case(
        "large_constants",
        define("large_constants", [spec(f32, row=24, col=40), spec(f32, col=40)], _large_constants),
        normal,
        1e-4,
        1e-4,
    ),
    *(_contraction_case(d) for d in (f32, f64, i32, f16)),
    _contraction_case(f32, (3, 64, 96, 48, 5)),
    Case("mlp_value_and_grad", _mlp, lambda rng, p: normal(rng, p, 0.3), 1e-4, 1e-4),
    Case(
        "indexing",
        define(
            "indexing",
            [spec(f32, v=5, c=3), spec(i32, t=4), spec(i64, p=2, q=2), spec(f32, t=4, c=3)],
            _indexing,
        ),
        _indexing_inputs,
    ),
    *(_scatter_case(d) for d in (f32, f64, f16, bf16, i32, i64, u8, bool_)),
    *(_scatter_modes_case(d) for d in (f32, f16, bf16, i32, u8, bool_)),
    Case("scatter_modes_grad", _scatter_modes_grad, _scatter_grad_inputs, 1e-5, 1e-5),
    *(_sort_case(d) for d in (f32, f64, f16, bf16, i32, i64, u8, bool_)),
    _sort_case(f32, 4096),  # the longest row CUDA sorts
    _sort_case(i32, 1),
    Case("sort_value_and_grad", _sort_grad, lambda rng, p: normal(rng, p), 1e-5, 1e-5),
    Case("embedding_value_and_grad", _embedding_grad, _embedding_inputs, 1e-4, 1e-3),
    Case(
        "scans",
        define(
            "scans",
            [spec(f32, c=3), spec(f32, c=3), spec(f32, step=4, c=3), spec(f32, c=3, step=4)],
            _scans,
        ),
        normal,
    ),
    Case(
        "scan_zero",
        define("scan_zero", [spec(f32, c=2), spec(f32, s=0, c=2)], _scan_zero),
        lambda rng, p: [np.ones(2, np.float32), np.zeros((0, 2), np.float32)],
    ),
    Case(
        "scan_matmul",
        define(
            "scan_matmul",
            [spec(f32, i=8, o=8), spec(f32, i=8), spec(f32, step=5, i=8)],
            _scan_matmul,
        ),
        lambda rng, p: normal(rng, p, 0.5),
        1e-5,
        1e-5,
    ),
    Case(
        "empty",
        define("empty", [spec(f32, n=3), spec(f32, m=0), spec(i32, t=0)], _empty),
        _empty_inputs,
    ),
    Case("elementwise_value_and_grad", _elementwise_grad, normal, 1e-4, 1e-4),
    Case(
        "compositions",
        define("compositions", [spec(f32, n=6, m=5), spec(i32)], _compositions),
        _composition_inputs,
        1e-5,
        1e-5,
    ),
    Case("compositions_value_and_grad", _compositions_grad, _composition_inputs, 1e-5, 1e-5),
    # Bit for bit on the CPU; normal's erf_inv uses the target's erf and exp (last-bit slack).
    Case(
        "random",
        define("random", [accy.random.KEY], _random),
        lambda rng, p: [accy.random.key(2026)],
        1e-6,
        1e-6,
        (0.0, 0.0),
    ),
    Case("conv_block_value_and_grad", _conv_block, normal, 1e-4, 1e-4),
    Case(
        "outputs_that_are_inputs",
        define(
            "outputs_that_are_inputs", [spec(f32, n=5), spec(f16, n=3)], _outputs_that_are_inputs
        ),
        normal,
    ),
]
