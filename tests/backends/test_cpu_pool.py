"""The windowed kinds (reduce_window and its derivatives' select_and_gather_add /
select_and_scatter_add) on the native CPU's one-pass loops and as compositions, against JAX's
lax.reduce_window (values, gradients, forward mode, second order) and the reference
evaluator: windows, strides, padding (negative too) and dilation, ties, -inf and NaN, bf16 and
integers, vmap over a batch axis. Cases in the manner of JAX's lax_test / lax_autodiff_test
reduce_window cases."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bf16, f32, i32, spec
from accy.core.kinds.pooling import WINDOW_KINDS
from accy.lower.expand import expand_compositions
from accy.lower.plan import build_plan
from tests.executors import native_cpu

jax = pytest.importorskip("jax")
jnp = jax.numpy

# (window, stride, padding pairs, dilation) over the axes h, w of an [n, h, w, c] input.
CASES = [
    ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # ResNet's stem
    ((3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # "same", stride 1
    ((2, 3), (1, 2), ((0, 0), (2, 1)), (1, 1)),
    ((2, 2), (1, 1), ((1, 1), (0, 1)), (2, 1)),  # a dilated window
    ((3, 2), (2, 1), ((-1, 2), (1, 0)), (1, 2)),  # a negative padding crops
    ((2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1)),  # tiling: the cnn workload's pools
]
INIT = {"max": -np.inf, "min": np.inf, "sum": 0.0}
LAX = {"max": jax.lax.max, "min": jax.lax.min, "sum": jax.lax.add}


def _jax_window(op, x, case):
    window, stride, pairs, dilation = case
    padding = ((0, 0), *pairs, (0, 0))
    ones = (1, *window, 1), (1, *stride, 1)
    init = jnp.array(INIT[op], x.dtype) if x.dtype != jnp.int32 else _int_init(op)
    return jax.lax.reduce_window(
        x, init, LAX[op], *ones, padding, window_dilation=(1, *dilation, 1)
    )


def _int_init(op):
    info = np.iinfo(np.int32)
    return {"max": info.min, "min": info.max, "sum": 0}[op]


def _numpy_gradient(op, x, weights, case):
    """The gradient of sum(reduce_window(x) * weights) by explicit windows: each window's
    weight to its first extreme (the first NaN, else the first max/min; a padded position
    holds the identity and takes nothing), or to all its elements for a sum."""
    window, stride, pairs, dilation = case
    grad = np.zeros(x.shape, np.float64)
    for n, i, j, c in np.ndindex(weights.shape):
        candidates = []  # (value, position or None) in row-major window order
        for a in range(window[0]):
            for b in range(window[1]):
                h = i * stride[0] + a * dilation[0] - pairs[0][0]
                w = j * stride[1] + b * dilation[1] - pairs[1][0]
                inside = 0 <= h < x.shape[1] and 0 <= w < x.shape[2]
                value = x[n, h, w, c] if inside else INIT[op]
                candidates.append((value, (n, h, w, c) if inside else None))
        if op == "sum":
            for _, where in candidates:
                if where is not None:
                    grad[where] += weights[n, i, j, c]
            continue
        values = np.array([v for v, _ in candidates])
        best = (np.argmax if op == "max" else np.argmin)(values)  # the first NaN, else extreme
        if candidates[best][1] is not None:
            grad[candidates[best][1]] += weights[n, i, j, c]
    return grad


def _pooled(op, case):
    window, stride, pairs, dilation = case
    return lambda value: value.reduce_window(
        op,
        dict(zip("hw", window, strict=True)),
        dict(zip("hw", stride, strict=True)),
        pairs,
        dict(zip("hw", dilation, strict=True)),
    )


def _loss_program(op, case, x_shape, dtype=f32):
    """sum(reduce_window(x) * weights), the weights in f32 over the pooled shape."""
    pool = _pooled(op, case)
    n, h, w, c = x_shape
    x_type = spec(dtype, n=n, h=h, w=w, c=c)
    pooled = accy.trace.define("p", [x_type], lambda b, a: pool(a[0])).output_types[0]
    weights = pooled.with_dtype(f32)
    return accy.trace.define(
        "loss", [x_type, weights], lambda b, a: (pool(a[0]).convert(f32) * a[1]).sum()
    )


def _tied(shape, seed):
    """Small integers: ties in every window."""
    return np.random.default_rng(seed).integers(0, 3, shape).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("op", ["max", "min", "sum"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_cpu_values_and_gradients_match_jax(op, case):
    x = _tied((2, 7, 6, 3), seed=1)
    program = accy.value_and_grad(_loss_program(op, case, x.shape))
    weights = np.random.default_rng(2).integers(1, 5, program.parameter_types[1].extents)
    weights = weights.astype(np.float32)
    value, grad = native_cpu(program, [x, weights])

    def loss(a):
        return (_jax_window(op, a, case) * weights).sum()

    np.testing.assert_allclose(value, loss(jnp.asarray(x)), rtol=1e-6)
    np.testing.assert_allclose(grad, _numpy_gradient(op, x, weights, case), rtol=1e-6)
    if case[3] == (1, 1) or op == "sum":  # JAX has no max/min VJP with a window dilation
        np.testing.assert_allclose(grad, jax.grad(loss)(jnp.asarray(x)), rtol=1e-6)
    assert accy.reference.run(program, [x, weights])[1].tolist() == grad.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES[:3], ids=str)
def test_forward_mode_and_second_order_match_jax(case):
    """The JVP picks each window's first maximum's tangent (select_and_gather_add); the
    gradient's own JVP (a Hessian-vector product of sum(max_pool(x) ** 2)) runs through
    select_and_scatter_add's rules."""
    x = np.random.default_rng(3).standard_normal((1, 6, 5, 2)).astype(np.float32)
    tangent = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    pool = _pooled("max", case)
    x_type = spec(f32, n=1, h=6, w=5, c=2)
    squares = accy.trace.define("s", [x_type], lambda b, a: (pool(a[0]) ** 2).sum())
    _, tangent_out = native_cpu(accy.jvp(squares), [x, tangent])
    _, hvp = native_cpu(accy.jvp(accy.grad(squares)), [x, tangent])

    def jax_squares(a):
        return (_jax_window("max", a, case) ** 2).sum()

    _, want = jax.jvp(jax_squares, (jnp.asarray(x),), (jnp.asarray(tangent),))
    _, want_hvp = jax.jvp(jax.grad(jax_squares), (jnp.asarray(x),), (jnp.asarray(tangent),))
    np.testing.assert_allclose(tangent_out, want, rtol=1e-5)
    np.testing.assert_allclose(hvp, np.asarray(want_hvp), rtol=1e-5, atol=1e-6)


def test_nan_and_infinities_agree_with_the_reference_and_jax_values():
    """A window with a NaN pools to NaN and sends its cotangent to its first NaN; windows of
    -inf pick their first element (the padding first where it comes first)."""
    x = np.full((1, 5, 4, 2), -np.inf, np.float32)
    x[0, 1, 1, 0], x[0, 3, 2, 0], x[0, 3, 3, 0] = np.nan, 1.0, np.nan
    x[0, :, :, 1] = [[-np.inf, 1, 1, np.inf], [2, np.inf, np.nan, 0]] + [[0, 0, 0, 0]] * 3
    case = CASES[0]
    program = accy.value_and_grad(_loss_program("max", case, x.shape), wrt=0)
    weights = np.arange(1, 1 + program.parameter_types[1].size, dtype=np.float32)
    weights = weights.reshape(program.parameter_types[1].extents)
    got = native_cpu(program, [x, weights])
    want = accy.reference.run(program, [x, weights])
    np.testing.assert_array_equal(got[1], want[1])
    pooled = accy.trace.define(
        "m", [program.parameter_types[0]], lambda b, a: _pooled("max", case)(a[0])
    )
    np.testing.assert_array_equal(
        native_cpu(pooled, [x])[0], _jax_window("max", jnp.asarray(x), case)
    )
    np.testing.assert_array_equal(got[1], _numpy_gradient("max", x, weights, case))
    # The NaN at (1, 1) is the first NaN of the four windows that hold it.
    assert got[1][0, 1, 1, 0] == weights[0, :2, :2, 0].sum()


@pytest.mark.parametrize("op", ["max", "sum"])
def test_bf16_pools_sum_in_f32_and_round_once_as_the_reference(op):
    x = (np.random.default_rng(5).standard_normal((2, 6, 6, 5)) * 3).astype(bf16.numpy)
    case = CASES[1]  # overlapping windows: each input's gradient sums nine cotangents
    program = accy.value_and_grad(_loss_program(op, case, x.shape, bf16))
    weights = np.random.default_rng(6).standard_normal(program.parameter_types[1].extents)
    inputs = [x, weights.astype(np.float32)]
    got, want = native_cpu(program, inputs), accy.reference.run(program, inputs)
    assert got[1].dtype == bf16.numpy
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(got[1], np.float32), np.asarray(want[1], np.float32), rtol=2**-8, atol=1e-6
    )


@pytest.mark.parametrize("op", ["max", "min", "sum"])
def test_integer_pools_match_jax(op):
    x = np.random.default_rng(7).integers(-50, 50, (2, 7, 6, 3)).astype(np.int32)
    case = CASES[2]
    program = accy.trace.define(
        "m", [spec(i32, n=2, h=7, w=6, c=3)], lambda b, a: _pooled(op, case)(a[0])
    )
    np.testing.assert_array_equal(
        native_cpu(program, [x])[0], _jax_window(op, jnp.asarray(x), case)
    )


@pytest.mark.slow
def test_vmap_over_a_batch_axis_pools_each_example():
    x = np.random.default_rng(8).standard_normal((3, 6, 5, 2)).astype(np.float32)
    case = CASES[0]

    def per_example(b, a):
        return accy.vmap(lambda v: (_pooled("max", case)(v) ** 2).sum(), "n")(a[0]).sum()

    program = accy.grad(accy.trace.define("v", [spec(f32, n=3, h=6, w=5, c=2)], per_example))
    got = native_cpu(program, [x])[0]
    want = jax.grad(lambda a: (_jax_window("max", a, case) ** 2).sum())(jnp.asarray(x))
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6)


def test_the_cpu_runs_the_kinds_in_one_pass_or_as_compositions_when_switched_off(configure):
    """Kept, the gradient's plan gathers no windows (no concatenate, nothing larger than the
    input); switched off, the compositions (the CUDA backend's) give the same values."""
    case = CASES[0]
    x = _tied((2, 7, 6, 3), seed=9)
    program = accy.value_and_grad(_loss_program("max", case, x.shape))
    weights = np.ones(program.parameter_types[1].extents, np.float32)
    plan = build_plan(program)
    pools = sorted(s.op.kind for s in plan.steps if s.kind == "pool")
    assert pools == ["reduce_window", "select_and_scatter_add"]
    assert plan.program.count("concatenate") == 0
    assert max(op.type.size for op in plan.program.operations) <= x.size
    kept = native_cpu(program, [x, weights])
    configure(cpu_pool=False)
    composed = build_plan(program).program
    assert composed.count("reduce_window") == composed.count("select_and_scatter_add") == 0
    for a, b in zip(native_cpu(program, [x, weights]), kept, strict=True):
        np.testing.assert_array_equal(a, b)


def test_reduce_window_errors_name_the_axis_and_the_fix():
    x_type = [spec(f32, h=3, w=3)]
    with pytest.raises(accy.AxisError, match="axis 'z' is not on"):
        accy.trace.define("e", x_type, lambda b, a: a[0].reduce_window("max", {"z": 2}))
    with pytest.raises(accy.AxisError, match="window 2, stride 0 and dilation 1 of 'h'"):
        accy.trace.define("e", x_type, lambda b, a: a[0].reduce_window("sum", {"h": 2}, 0))
    with pytest.raises(accy.AxisError, match="spans 5 elements; the padded axis has 4"):
        accy.trace.define(
            "e", x_type, lambda b, a: a[0].reduce_window("max", {"h": 3}, 1, [(1, 0)], 2)
        )


@pytest.mark.parametrize(
    "axes", [("h", "c", "w", "d"), ("c", "d", "h", "w"), ("w", "h", "c", "d")], ids=str
)
def test_windows_between_and_after_other_axes_and_in_either_order(axes):
    """Axes between the window axes, a run of several axes after them or none (NCHW), and
    window axes in the other order (their offsets are then row-major in that order)."""
    extents = {"h": 6, "w": 5, "c": 2, "d": 3}
    x_type = spec(f32, **{a: extents[a] for a in axes})
    x = _tied(x_type.extents, seed=10)

    def loss(b, a):
        pooled = a[0].reduce_window("max", {"h": 3, "w": 2}, {"h": 2, "w": 1}, "same")
        return (pooled * pooled.ty.size**-1 * b.iota(pooled.ty, "c").convert(f32)).sum()

    program = accy.value_and_grad(accy.trace.define("l", [x_type], loss))
    got = native_cpu(program, [x])
    want = accy.reference.run(program, [x])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert np.count_nonzero(got[1]) > 0


@pytest.mark.parametrize(
    "case", [*CASES, ((2, 3), (2, 3), ((1, 0), (0, 0)), (1, 1))], ids=str
)  # the last: tiling windows, padded before on h, the odd element of w left out
@pytest.mark.parametrize("op", ["max", "sum"])
def test_the_compositions_compute_what_the_kinds_do(op, case):
    """What backends without loops for the kinds run (the CUDA backend's): each kind replaced
    by its composition, on the reference evaluator, with NaNs, for values, gradients and the
    forward mode."""
    x = _tied((2, 7, 6, 3), seed=11)
    x[0, 2, 3, 1] = x[1, 0, 0, 0] = np.nan
    loss = _loss_program(op, case, x.shape)
    rng = np.random.default_rng(12)
    for program in (accy.value_and_grad(loss), accy.jvp(loss)):
        inputs = [x] + [
            rng.standard_normal(t.extents).astype(np.float32) for t in program.parameter_types[1:]
        ]
        composed = expand_compositions(program)
        assert not set(WINDOW_KINDS) & {op.kind for op in composed.operations}
        for a, b in zip(
            accy.reference.run(composed, inputs), accy.reference.run(program, inputs), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_prod_and_bool_windows_are_compositions_with_the_reductions_derivatives():
    """prod (no kind: its windows gathered and multiplied; each element's derivative the
    product of the others in each of its windows) and bool max (an "any" over each window)."""
    prod = accy.trace.define(
        "p", [spec(f32, h=4)], lambda b, a: a[0].reduce_window("prod", {"h": 2}, 1).sum()
    )
    assert prod.count("reduce_window") == 0
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    for run in (accy.reference.run, native_cpu):  # windows [1, 2], [2, 3], [3, 4]
        np.testing.assert_array_equal(run(accy.grad(prod), [x])[0], [2.0, 1 + 3, 2 + 4, 3])
    flags = accy.trace.define(
        "f", [spec(accy.bool_, h=4)], lambda b, a: a[0].reduce_window("max", {"h": 2}, 1)
    )
    bits = np.array([False, True, False, False])
    np.testing.assert_array_equal(native_cpu(flags, [bits])[0], [True, True, False])


def test_window_offsets_nest_in_the_order_of_the_kinds_axes_not_the_layout():
    """Emitted with axes (w, h) over an {h, w, c} input, the first extreme is the first in
    (w, h) order: the CPU's loops and the reference agree on which of two ties wins."""
    attrs = {
        "op": "max",
        "axes": ("w", "h"),
        "window": (2, 2),
        "stride": (1, 1),
        "low": (0, 0),
        "high": (0, 0),
        "dilation": (1, 1),
    }
    x_type = spec(f32, h=2, w=2, c=1)
    program = accy.grad(
        accy.trace.define("o", [x_type], lambda b, a: b.emit("reduce_window", a, attrs).sum())
    )
    x = np.array([[0, 1], [1, 0]], np.float32)[:, :, None]  # (h, w) = (0, 1) and (1, 0) tie
    got = native_cpu(program, [x])[0]
    np.testing.assert_array_equal(got, accy.reference.run(program, [x])[0])
    np.testing.assert_array_equal(got[:, :, 0], [[0, 0], [1, 0]])  # (w, h) order: w = 0 first


def test_the_cuda_backend_runs_the_compositions():
    """The CUDA backend has no loops of its own for the windowed kinds: its plan composes them
    (checked against the kinds above), and its C is generated (no GPU needed here)."""
    from accy.backends.cuda import compile_program
    from accy.backends.cuda.compile import cuda_plan

    program = accy.value_and_grad(_loss_program("max", CASES[0], (2, 7, 6, 3)))
    assert program.count("select_and_scatter_add") == 1
    assert not set(WINDOW_KINDS) & {op.kind for op in cuda_plan(program).program.operations}
    assert "accy" in compile_program(program).source
