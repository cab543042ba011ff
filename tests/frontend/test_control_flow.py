"""Control flow in the front end: closures in bodies and branches, the one value type, and
`accy.scan`/`cond`/`switch`/`while_loop`/`fori_loop`/`map` over trees, eager and traced.

Expected values come from NumPy on the same inputs (and JAX, in tests/peers)."""

import dataclasses
import functools
import re
from pathlib import Path

import numpy as np
import pytest

import accy
from accy.core.value import ArrayOps

R = "reference"


def arr(values, axes):
    return accy.named(np.asarray(values, np.float32), axes, device=R)


def test_one_value_type_shares_every_method():
    assert issubclass(accy.NamedArray, ArrayOps) and issubclass(accy.Value, ArrayOps)
    for name in ("sum", "contract", "__add__", "__getitem__", "rename", "axes", "shape"):
        assert getattr(accy.NamedArray, name) is getattr(ArrayOps, name)
        assert getattr(accy.Value, name) is getattr(ArrayOps, name)
    # what only a concrete array has: its data and device
    data_only = {"to", "item", "device", "__float__", "__int__", "__weakref__"}
    data_only |= {"__complex__", "__index__", "block_until_ready"}
    data_only |= {"__dlpack__", "__dlpack_device__"}
    assert set(dir(accy.NamedArray)) - set(dir(accy.Value)) <= data_only
    assert not set(vars(accy.NamedArray)) & (
        set(vars(ArrayOps)) - {"__doc__", "__module__", "__slots__"}
    )


def test_index_by_name_inside_builder_bodies():
    x = arr([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], ("Height", "Width"))

    def f(x):
        b = x.builder
        picked = b.cond(
            x.sum() > 0.0,
            lambda b, v: v[0]["Width", 2],
            lambda b, v: v[0]["Width", 0],
            [x],
        )
        (total,), _ = b.scan(
            lambda b, a: (a[0] + a[1]["Width", 1:].sum(),),
            carries=[x.sum() * 0.0],
            xs=[x],
            axis="Height",
        )
        (count,) = b.while_loop(
            lambda b, c: c[0]["Width", 0] < 10.0, lambda b, c: [c[0] * 2.0], [x["Height", 0]]
        )
        return picked, total, count

    picked, total, count = accy.jit(f)(x)
    assert picked.array.tolist() == [3.0, 6.0]
    # a NumPy scalar on the left defers to the value's operator, traced or not
    scaled = accy.jit(lambda x: accy.map(lambda row: np.float32(2.0) * row, x, axis="Height"))(x)
    assert scaled.array.tolist() == (2.0 * x.array).tolist()
    assert total.item() == 16.0
    assert count.array.tolist() == [16.0, 32.0, 48.0]


# -- closures in builder bodies (the Program API under the function transforms) ---------------

W = accy.named(np.array([3.0, 4.0], np.float32), "lane", device=R)
BIG = accy.named(np.linspace(0.0, 1.0, 100, dtype=np.float32), "big", device=R)


def _branches_reading_closures(x):
    b = x.builder
    return b.cond(
        x.sum() > 0.0,
        lambda b, v: v[0] * W + BIG.sum(),  # module-level arrays: a small and a large one
        lambda b, v: -v[0] * x,  # the jitted function's argument
        [x],
    )


def test_builder_cond_branches_read_module_arrays_and_arguments():
    x = arr([1.0, 2.0], "lane")
    expected = np.array([3.0, 8.0]) + np.linspace(0.0, 1.0, 100, dtype=np.float32).sum()
    np.testing.assert_allclose(accy.jit(_branches_reading_closures)(x).array, expected, rtol=1e-6)
    np.testing.assert_allclose(accy.jit(_branches_reading_closures)(-x).array, [-1.0, -4.0])
    g = accy.grad(lambda x: _branches_reading_closures(x).sum())(x)
    np.testing.assert_allclose(g.array, [3.0, 4.0])
    g = accy.grad(lambda x: _branches_reading_closures(x).sum())(-x)  # -(v * x): -2x
    np.testing.assert_allclose(g.array, [2.0, 4.0])


def test_program_api_bodies_read_named_arrays_as_constants():
    p = accy.trace.define(
        "f",
        [accy.spec(accy.f32, lane=2)],
        lambda b, a: b.cond(a[0].sum() > 0.0, lambda b, v: v[0] * W, lambda b, v: -v[0], [a[0]]),
    )
    assert accy.reference.run(p, [[1.0, 2.0]])[0].tolist() == [3.0, 8.0]


def test_transforms_called_inside_a_loop_body_close_over_its_values():
    x = arr([1.0, 2.0], "lane")

    def f(x):
        def body(b, c):
            scaled = accy.jit(lambda w: w * c[0])(W)  # concrete argument, traced closure
            slope = accy.grad(lambda w: (w * c[0]).sum())(W)
            return [scaled * 0.5 + slope * 0.5]

        return x.builder.while_loop(lambda b, c: c[0].sum() < 50.0, body, [x])[0]

    # each step: c -> 0.5 * W * c + 0.5 * c = c * (W + 1) / 2 = c * [2, 2.5]
    assert accy.jit(f)(x).array.tolist() == [16.0, 78.125]


def test_jvp_of_a_function_whose_inner_jit_closes_over_its_argument():
    x = arr([1.0, 2.0], "lane")
    y, dy = accy.jvp(lambda x: accy.jit(lambda w: w * x)(W), (x,), (arr([1.0, 0.0], "lane"),))
    assert y.array.tolist() == [3.0, 8.0] and dy.array.tolist() == [3.0, 0.0]


# -- accy.scan and friends over trees ------------------------------------------------------------

XS = np.arange(12, dtype=np.float32).reshape(6, 2) / 10.0
WEIGHTS = np.array([[0.5, 0.1], [0.2, 0.3]], np.float32)


@dataclasses.dataclass
class Cell:
    weights: accy.NamedArray
    bias: accy.NamedArray


CELL = Cell(arr(WEIGHTS, ("lane", "out")), arr([0.1, -0.2], "out"))


def rnn(cell, h0, xs, **options):
    """A tanh RNN whose step closes over `cell` and whose carry is a dict."""

    def step(carry, x):
        h = (carry["h"].contract(cell.weights, "lane") + cell.bias).rename("out", "lane")
        h = (h + x["in"]).tanh()
        return {"h": h, "steps": carry["steps"] + 1}, {"h": h, "total": h.sum()}

    return accy.scan(step, {"h": h0, "steps": 0}, {"in": xs}, axis="time", **options)


def rnn_numpy(h0, reverse=False):
    h, hs = np.asarray(h0, np.float64), []
    for t in reversed(range(6)) if reverse else range(6):
        h = np.tanh(h @ WEIGHTS + [0.1, -0.2] + XS[t])
        hs.append(h)
    return h, np.array(hs[::-1] if reverse else hs)


@pytest.mark.parametrize("options", [{}, {"reverse": True}, {"unroll": 4}, {"unroll": True}])
def test_scan_over_trees_eager_and_jitted_match_numpy(options):
    h0, xs = arr([0.5, -0.5], "lane"), arr(XS, ("time", "lane"))
    final_h, hs = rnn_numpy(h0.array, options.get("reverse", False))
    with_options = functools.partial(rnn, **options)
    for run in (with_options, accy.jit(with_options)):
        carry, ys = run(CELL, h0, xs)
        np.testing.assert_allclose(carry["h"].array, final_h, rtol=1e-5)
        assert carry["steps"].item() == 6 and carry["steps"].dtype == accy.i32
        assert ys["h"].axes == ("time", "lane") and ys["total"].axes == ("time",)
        np.testing.assert_allclose(ys["h"].array, hs, rtol=1e-5)
        np.testing.assert_allclose(ys["total"].array, hs.sum(1), rtol=1e-5)


def test_grad_through_scan_matches_finite_differences():
    h0, xs = arr([0.5, -0.5], "lane"), arr(XS, ("time", "lane"))

    def loss(cell, h0):
        _, ys = rnn(cell, h0, xs)
        return (ys["total"] * ys["total"]).sum()

    grads = accy.grad(loss, argnums=(0, 1))(CELL, h0)
    assert isinstance(grads[0], Cell)

    def numeric(weights, h):
        h, total = np.asarray(h, np.float64), 0.0
        for t in range(6):
            h = np.tanh(h @ weights + [0.1, -0.2] + XS[t])
            total += h.sum() ** 2
        return total

    eps = 1e-4
    for i, j in [(0, 0), (1, 0), (1, 1)]:
        bump = np.zeros((2, 2))
        bump[i, j] = eps
        expected = (numeric(WEIGHTS + bump, h0.array) - numeric(WEIGHTS - bump, h0.array)) / (
            2 * eps
        )
        np.testing.assert_allclose(grads[0].weights.array[i, j], expected, rtol=2e-3)
    bump = np.array([eps, 0.0])
    expected = (numeric(WEIGHTS, h0.array + bump) - numeric(WEIGHTS, h0.array - bump)) / (2 * eps)
    np.testing.assert_allclose(grads[1].array[0], expected, rtol=2e-3)


def test_nested_scans_read_the_enclosing_body_and_module_arrays():
    grid = arr(np.arange(6, dtype=np.float32).reshape(2, 3), ("row", "col"))

    def f(grid):
        def outer(total, row):
            def inner(acc, v):
                return acc + v * row.sum() + W.sum(), None  # enclosing body and module values

            acc, _ = accy.scan(inner, 0.0, row, axis="col")
            return total + acc, acc

        return accy.scan(outer, 0.0, grid, axis="row")

    g = np.arange(6, dtype=np.float32).reshape(2, 3)
    per_row = (g * g.sum(1, keepdims=True)).sum(1) + 3 * 7.0
    for run in (f, accy.jit(f)):
        total, accs = run(grid)
        np.testing.assert_allclose(accs.array, per_row)
        np.testing.assert_allclose(total.item(), per_row.sum())


def test_scan_without_xs_takes_length_and_map_stacks():
    carry, ys = accy.jit(lambda: accy.scan(lambda c, _: (c * 2.0, c), 1.0, length=4, axis="t"))()
    assert carry.item() == 16.0 and ys.axes == ("t",) and ys.array.tolist() == [1, 2, 4, 8]
    xs = arr(XS, ("time", "lane"))
    expected = (XS * XS).sum(1)
    for run in (accy.map, accy.jit(accy.map, static_argnames=("f", "axis"))):
        np.testing.assert_allclose(
            run(f=lambda x: (x * x).sum(), xs=xs, axis="time").array, expected
        )


def test_cond_and_switch_over_trees_with_closures():
    x = {"a": arr([1.0, -2.0], "lane"), "b": arr(3.0, ())}

    def f(x, flag, index):
        small = accy.cond(
            flag,
            lambda t: {"a": t["a"] * W, "b": t["b"] + 1.0},
            lambda t: {"a": -t["a"], "b": t["b"] * x["b"]},  # closes over the argument
            x,
        )
        picked = accy.switch(
            index, [lambda v: v * 0.0, lambda v: v + W, lambda v: v * 10.0], small["a"]
        )
        return small, picked

    for run in (f, accy.jit(f)):
        for flag in (True, False):
            for index in (-3, 0, 1, 2, 9):
                small, picked = run(x, arr(flag, ()) > 0.5, accy.named(np.int32(index), (), R))
                a = np.array([1.0, -2.0]) * ([3.0, 4.0] if flag else -1.0)
                assert small["a"].array.tolist() == a.tolist()
                assert small["b"].item() == (4.0 if flag else 9.0)
                which = min(max(index, 0), 2)
                assert picked.array.tolist() == [a * 0.0, a + [3.0, 4.0], a * 10.0][which].tolist()


def test_grad_through_cond_matches_numpy():
    def loss(w, x):
        return accy.cond(x.sum() > 0.0, lambda w: (w * x).sin().sum(), lambda w: (w * w).sum(), w)

    w = arr([0.3, 0.7], "lane")
    positive, negative = arr([1.0, 2.0], "lane"), arr([-1.0, -2.0], "lane")
    np.testing.assert_allclose(
        accy.grad(loss)(w, positive).array, np.cos(w.array * [1, 2]) * [1, 2], rtol=1e-6
    )
    np.testing.assert_allclose(accy.grad(loss)(w, negative).array, 2 * w.array, rtol=1e-6)


def test_while_and_fori_loops_over_trees():
    def collatz(n):
        return accy.while_loop(
            lambda c: c["n"] > 1,
            lambda c: {
                "n": accy.cond((c["n"] % 2).eq(0), lambda n: n // 2, lambda n: n * 3 + 1, c["n"]),
                "steps": c["steps"] + 1,
            },
            {"n": n, "steps": 0},
        )

    for run in (collatz, accy.jit(collatz)):
        assert run(accy.named(np.int32(27), (), R))["steps"].item() == 111
    x = arr([1.0, 2.0], "lane")

    def powers(x, upper):
        return accy.fori_loop(0, upper, lambda i, c: c * x + i.convert(accy.f32), x)

    expected = x.array.copy()
    for i in range(4):
        expected = expected * x.array + i
    for upper in (4, accy.named(np.int32(4), (), R)):
        np.testing.assert_allclose(powers(x, upper).array, expected)
        np.testing.assert_allclose(accy.jit(powers)(x, upper).array, expected)
    # static bounds: a scan, which reverse mode differentiates
    g = accy.grad(lambda x: powers(x, 2).sum())(x)
    np.testing.assert_allclose(g.array, 3 * x.array**2)  # d/dx (x^3 + 1)
    assert powers(x, 0) is x


def test_jvp_through_while_loop():
    def f(x):
        return accy.while_loop(lambda c: c.sum() < 20.0, lambda c: c * c, x)

    x = arr([1.5, 2.0], "lane")
    y, dy = accy.jvp(f, (x,), (arr([1.0, 0.0], "lane"),))
    np.testing.assert_allclose(y.array, x.array**4)
    np.testing.assert_allclose(dy.array, [4 * 1.5**3, 0.0])


# -- misuse -------------------------------------------------------------------------------------


def test_carries_that_change_structure_or_type_are_errors():
    x = arr([1.0, 2.0], "lane")
    for run in (lambda f: f(x), lambda f: accy.jit(f)(x)):
        with pytest.raises(accy.TransformError, match=r"the carry\['a'\] has type f32\[\], but"):
            run(
                lambda x: accy.scan(
                    lambda c, v: ({"a": c["a"].sum()}, None), {"a": x}, x, axis="lane"
                )
            )
        with pytest.raises(accy.TransformError, match="must have its initial value's structure"):
            run(lambda x: accy.while_loop(lambda c: c[0].sum() < 5.0, lambda c: (c[0], c[0]), (x,)))
        with pytest.raises(accy.TransformError, match=r"must return a pair \(carry, y\)"):
            run(lambda x: accy.scan(lambda c, v: c, x, x, axis="lane"))
        with pytest.raises(accy.TransformError, match="cond_fn must return a bool scalar"):
            run(lambda x: accy.while_loop(lambda c: c, lambda c: c, x))


def test_scan_axis_and_branch_mismatches_are_errors():
    x = arr([1.0, 2.0], "lane")
    with pytest.raises(accy.AxisError, match=r"xs\[1\] \(f32\[lane=2\]\) has no axis 'time'"):
        accy.scan(lambda c, v: (c, None), 0.0, (arr(XS, ("time", "lane")), x), axis="time")
    with pytest.raises(accy.AxisError, match="disagree"):
        accy.scan(lambda c, v: (c, None), 0.0, x, axis="lane", length=3)
    with pytest.raises(accy.TransformError, match="give the number of steps as length="):
        accy.scan(lambda c, v: (c, None), 0.0, axis="lane")
    with pytest.raises(accy.TransformError, match="must have the true branch's structure"):
        accy.jit(lambda x: accy.cond(x.sum() > 0.0, lambda v: (v, v), lambda v: v, x))(x)
    with pytest.raises(accy.TransformError, match=r"output has type f32\[lane=2\], but the true"):
        accy.jit(lambda x: accy.cond(x.sum() > 0.0, lambda v: v.sum(), lambda v: v, x))(x)
    with pytest.raises(accy.AxisError, match="the predicate must be a scalar"):
        accy.cond(x > 0.0, lambda v: v, lambda v: v, x)
    with pytest.raises(accy.TransformError, match="the index must be an integer scalar"):
        accy.switch(x.sum(), [lambda v: v, lambda v: v], x)
    with pytest.raises(accy.TransformError, match="true_fn must be a function"):
        accy.cond(True, 1.0, lambda: 0.0)
    with pytest.raises(accy.TransformError, match="axis must be an axis name"):
        accy.scan(lambda c, v: (c, None), 0.0, x, axis=0)


# -- vmap of control flow and custom calls ------------------------------------------------------

ROWS = np.array([[1.0, -2.0], [-3.0, 4.0], [5.0, 6.0]], np.float32)


def test_vmap_of_cond_selects_per_example_or_stays_a_cond():
    xs = arr(ROWS, ("batch", "lane"))

    def f(x, p):
        return accy.cond(p, lambda v: v * 2.0, lambda v: -v, x)

    per_example = accy.vmap(lambda x: f(x, x.sum() > 0.0), "batch")(xs)
    expected = np.where(ROWS.sum(1, keepdims=True) > 0, ROWS * 2, -ROWS)
    np.testing.assert_array_equal(per_example.array, expected)
    shared = accy.vmap(f, "batch")(xs, arr(-1.0, ()) > 0.0)
    np.testing.assert_array_equal(shared.array, -ROWS)
    program = accy.trace.define(
        "f",
        [accy.spec(accy.f32, lane=2), accy.spec(accy.bool_)],
        lambda b, a: b.cond(a[1], lambda b, v: v[0] * 2.0, lambda b, v: -v[0], [a[0]]),
    )
    one_predicate = accy.vmap(program, "batch", in_axes=[True, False], size=3)
    assert one_predicate.count("cond") == 1 and one_predicate.count("select") == 0
    per_example = accy.vmap(program, "batch", in_axes=[True, True], size=3)
    # both branches run, each on operands differentiable only where it is taken, then select
    assert per_example.count("cond") == 0 and per_example.count("select") == 3


def test_work_on_enclosing_values_inside_a_branch_runs_in_the_branch():
    x = arr([0.0, 4.0], "lane")

    def safe_sqrt(x):  # sqrt's derivative at 0 is infinite: only the taken branch may count
        return accy.cond(x.sum() < 1e-3, lambda: x * 0.0, lambda: x.sqrt()).sum()

    jitted = accy.jit(safe_sqrt)
    assert jitted(x).item() == 2.0
    program = next(iter(jitted._staged[()].cache.values())).program
    assert program.count("cond") == 1 and program.count("unary") == 0  # sqrt: in the branch
    zeros = arr([0.0, 0.0], "lane")
    assert accy.grad(safe_sqrt)(zeros).array.tolist() == [0.0, 0.0]
    per_example = accy.vmap(accy.grad(lambda v: safe_sqrt(v)), "batch")
    grads = per_example(arr([[0.0, 0.0], [4.0, 1.0]], ("batch", "lane")))
    np.testing.assert_allclose(grads.array, [[0.0, 0.0], [0.25, 0.5]])
    through_vmap = accy.grad(lambda v: accy.vmap(safe_sqrt, "batch")(v).sum())
    grads = through_vmap(arr([[0.0, 0.0], [4.0, 1.0]], ("batch", "lane")))
    np.testing.assert_allclose(grads.array, [[0.0, 0.0], [0.25, 0.5]])


def test_vmap_of_while_loop_runs_each_example_to_its_own_end():
    xs = arr(ROWS, ("batch", "lane"))

    def f(x):
        return accy.while_loop(
            lambda c: c["x"].sum() < 20.0,
            lambda c: {"x": c["x"] * 2.0 + 1.0, "n": c["n"] + 1},
            {"x": x, "n": 0},
        )

    out = accy.vmap(f, "batch")(xs)
    for row, got, steps in zip(ROWS, out["x"].array, out["n"].array, strict=True):
        c, n = row.copy(), 0
        while c.sum() < 20.0:
            c, n = c * 2 + 1, n + 1
        assert got.tolist() == c.tolist() and steps == n


def test_vmap_of_scan_and_per_example_gradients_through_it():
    xs = arr(np.stack([XS, XS[::-1] * 0.5, XS * -1.0]), ("example", "time", "lane"))
    h0 = arr([0.5, -0.5], "lane")

    def loss(cell, x):
        _, ys = rnn(cell, h0, x)
        return (ys["total"] * ys["total"]).sum()

    per_example = accy.vmap(accy.grad(loss), "example")(CELL, xs)
    assert per_example.weights.axes == ("example", "lane", "out")
    for e in range(3):
        one = accy.grad(loss)(CELL, xs["example", e])
        np.testing.assert_allclose(per_example.weights.array[e], one.weights.array, rtol=1e-5)
        np.testing.assert_allclose(per_example.bias.array[e], one.bias.array, rtol=1e-5)


def test_vmap_of_custom_calls_loops_or_uses_the_batch_rule():
    xs = arr(ROWS, ("batch", "lane"))
    scale = arr([10.0, 100.0], "lane")
    loop = accy.CustomCall(
        "test.flow.scaled", 1, result_type=lambda x, s: x, reference=lambda x, s: x * s
    )
    ruled = accy.CustomCall(
        "test.flow.scaled_batched",
        1,
        result_type=lambda x, s: x,
        reference=lambda x, s: x * s,
        batch=lambda e, args, batched, axis: loop.call(
            e, args[0], e.broadcast_to(args[1], args[0].ty)
        ),
    )
    try:
        for record in (loop, ruled):
            got = accy.vmap(lambda x, s, r=record: r(x, s) + 1.0, "batch")(xs, scale)
            np.testing.assert_allclose(got.array, ROWS * [10.0, 100.0] + 1.0)
        for record, scans in ((ruled, 0), (loop, 1)):  # the rule's: one call on the batch
            program = accy.trace.define(
                "f", [accy.spec(accy.f32, lane=2)] * 2, lambda b, a, r=record: r(a[0], a[1])
            )
            batched = accy.vmap(program, "batch", in_axes=[True, False], size=3)
            assert batched.count("scan") == scans and batched.count("custom_call") == 1 - scans
        wrong = accy.CustomCall(
            "test.flow.wrong_batch",
            1,
            result_type=lambda x: x,
            reference=lambda x: x,
            batch=lambda e, args, batched, axis: e.sum(args[0], axis),
        )
        with pytest.raises(accy.CustomCallError, match="the batch rule returned f32.lane=2."):
            accy.vmap(lambda x: wrong(x), "batch")(xs)
        wrong.unregister()
    finally:
        loop.unregister()
        ruled.unregister()


def test_vmap_over_several_axes_at_once():
    grid = arr(np.arange(24, dtype=np.float32).reshape(2, 3, 4), ("batch", "head", "lane"))
    w = arr(np.linspace(-1.0, 1.0, 4, dtype=np.float32), "lane")

    def f(x, w):  # one (batch, head) example: x has only "lane"
        return accy.cond(x.sum() > 20.0, lambda v: (v * w).sum(), lambda v: v.max("lane"), x)

    out = accy.vmap(f, ("batch", "head"))(grid, w)
    assert out.axes == ("batch", "head")
    g = np.asarray(grid)
    expected = np.where(g.sum(-1) > 20.0, (g * np.asarray(w)).sum(-1), g.max(-1))
    np.testing.assert_allclose(out.array, expected, rtol=1e-6)
    assert accy.vmap(f, ("head", "batch"))(grid, w).axes == ("head", "batch")
    with pytest.raises(accy.TransformError, match="in_axes entries can be True"):
        accy.vmap(f, ("batch", "head"), in_axes=(0, None))(grid, w)
    with pytest.raises(accy.TransformError, match="must be distinct names"):
        accy.vmap(f, ("batch", "batch"))


def test_the_control_flow_example_of_docs_frontend_runs(capsys):
    doc = Path(__file__).resolve().parents[2] / "docs" / "frontend.md"
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S) if "accy.scan" in b
    ]
    scope: dict = {}
    exec(compile(block, f"{doc}:control flow", "exec"), scope)
    assert capsys.readouterr().out.strip() == "('time',)"
    h = np.zeros(3)
    for _ in range(5):
        h = np.tanh(h @ np.full((3, 3), 0.1) + 1.0)
    np.testing.assert_allclose(scope["h"].array, h, rtol=1e-6)


def test_vmap_size_gives_the_extent_no_argument_carries():
    x = arr([1.0, 2.0], "lane")
    out = accy.vmap(lambda v: v * 2.0, "batch", size=3)(x)
    assert out.axes == ("batch", "lane") and out.array.tolist() == [[2.0, 4.0]] * 3
    with pytest.raises(accy.AxisError, match=r"disagree on its extent \(\[2, 3\]\)"):
        accy.vmap(lambda v: v, "lane", size=3)(x)
    with pytest.raises(accy.TransformError, match="give its extent as size="):
        accy.vmap(lambda v: v, "batch")(x)
    with pytest.raises(accy.TransformError, match="size must be an int >= 0"):
        accy.vmap(lambda v: v, "batch", size=-1)


def test_batched_control_flow_runs_on_the_native_cpu_backend():
    xs = accy.named(ROWS, ("batch", "lane"))  # cpu

    def f(x):
        grown = accy.while_loop(lambda c: c.sum() < 20.0, lambda c: c * 2.0 + 1.0, x)
        return accy.cond(x.sum() > 0.0, lambda v: v * 2.0, lambda v: -v, grown)

    out = accy.jit(accy.vmap(f, "batch"))(xs)
    assert out.device is accy.device("cpu")
    for row, got in zip(ROWS, out.array, strict=True):
        c = row.copy()
        while c.sum() < 20.0:
            c = c * 2 + 1
        np.testing.assert_array_equal(got, c * 2 if row.sum() > 0 else -c)


def test_more_misuse_is_reported():
    x = arr([1.0, 2.0], "lane")
    with pytest.raises(accy.TransformError, match="branches must be a non-empty sequence"):
        accy.switch(accy.named(np.int32(0), ()), [], x)
    with pytest.raises(accy.TransformError, match=r"branches\[1\] must be a function"):
        accy.switch(0, [lambda v: v, "not a function"], x)
    with pytest.raises(accy.TransformError, match="upper must be an integer scalar"):
        accy.fori_loop(0, arr(3.0, ()), lambda i, c: c, x)
    with pytest.raises(accy.TransformError, match="f must be a function"):
        accy.map(None, x, axis="lane")
    with pytest.raises(accy.TransformError, match="body_fn must be a function"):
        accy.while_loop(lambda c: c.sum() < 3.0, [], x)
    with pytest.raises(accy.NonArrayLeaf, match=r"accy.scan: init\['name'\] is str"):
        accy.scan(lambda c, v: (c, None), {"name": "text"}, x, axis="lane")


def test_reverse_mode_through_while_loop_points_to_scan():
    x = arr(1.5, ())
    with pytest.raises(accy.NotDifferentiable, match="accy.fori_loop with int bounds"):
        accy.grad(lambda x: accy.while_loop(lambda c: c < 10.0, lambda c: c * c, x))(x)
