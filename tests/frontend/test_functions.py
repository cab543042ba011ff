"""Function transforms over trees (accy.jit, grad, value_and_grad, jvp, vjp, linearize).

Expected values are NumPy computations, hand derivations and central finite differences in
float64, never accy's own outputs.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import optree
import pytest

import accy

R = "reference"
rng = np.random.default_rng(0)


def arr(values, axes, device=R):
    return accy.named(np.asarray(values, np.float64), axes, device=device)


def numeric_grad(f, x: np.ndarray, eps=1e-6) -> np.ndarray:
    """Central differences of the scalar NumPy function f at x."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        g[i] = (f(x + step) - f(x - step)) / (2 * eps)
    return g


def mlp_loss_np(w1, b1, w2, x, y):
    hidden = np.tanh(x @ w1 + b1)
    return float(((hidden @ w2 - y) ** 2).mean())


def mlp_loss(params, batch):
    hidden = (batch["x"].contract(params["w1"], "input") + params["b1"]).tanh()
    error = hidden.contract(params["w2"], "hidden") - batch["y"]
    return (error * error).mean()


@pytest.fixture
def mlp():
    w1, b1, w2 = rng.normal(size=(3, 4)), rng.normal(size=4), rng.normal(size=4)
    x, y = rng.normal(size=(5, 3)), rng.normal(size=5)
    params = {
        "w1": arr(w1, ("input", "hidden")),
        "b1": arr(b1, ("hidden",)),
        "w2": arr(w2, ("hidden",)),
    }
    batch = {"x": arr(x, ("batch", "input")), "y": arr(y, ("batch",))}
    return params, batch, (w1, b1, w2, x, y)


def test_grad_of_a_tree_has_the_tree_structure_and_matches_finite_differences(mlp):
    params, batch, (w1, b1, w2, x, y) = mlp
    grads = accy.grad(mlp_loss)(params, batch)
    assert set(grads) == {"w1", "b1", "w2"}
    expected = {
        "w1": numeric_grad(lambda w: mlp_loss_np(w, b1, w2, x, y), w1),
        "b1": numeric_grad(lambda b: mlp_loss_np(w1, b, w2, x, y), b1),
        "w2": numeric_grad(lambda w: mlp_loss_np(w1, b1, w, x, y), w2),
    }
    for name, value in expected.items():
        assert grads[name].axes == params[name].axes
        np.testing.assert_allclose(grads[name].array, value, rtol=1e-6, atol=1e-8)


def test_value_and_grad_and_argnums_tuple(mlp):
    params, batch, (w1, b1, w2, x, y) = mlp
    value, (g_params, g_batch) = accy.value_and_grad(mlp_loss, argnums=(0, 1))(params, batch)
    assert value.item() == pytest.approx(mlp_loss_np(w1, b1, w2, x, y), rel=1e-12)
    expected_x = numeric_grad(lambda v: mlp_loss_np(w1, b1, w2, v, y), x)
    np.testing.assert_allclose(g_batch["x"].array, expected_x, rtol=1e-6, atol=1e-8)
    assert set(g_params) == {"w1", "b1", "w2"}


def test_grad_takes_argnums_and_has_aux_positionally_as_jax_does():
    jax = pytest.importorskip("jax")
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, -1.0], np.float32)

    def loss(x, y):
        return (x * y * y).sum(), (x * y).sum()

    x, y = (accy.named(v, ("lane",), device="reference") for v in (a, b))
    got = accy.grad(loss, 1, True)(x, y)
    expected = jax.grad(loss, 1, True)(a, b)
    np.testing.assert_allclose(got[0].array, expected[0], rtol=1e-6)
    np.testing.assert_allclose(got[1].item(), expected[1], rtol=1e-6)
    value, g = accy.value_and_grad(lambda x, y: loss(x, y)[0], (0, 1))(x, y)
    j_value, j_g = jax.value_and_grad(lambda x, y: loss(x, y)[0], (0, 1))(a, b)
    np.testing.assert_allclose(
        [value.item(), *g[0].array, *g[1].array], [j_value, *j_g[0], *j_g[1]]
    )
    with pytest.raises(accy.TransformError, match="takes argnums= and has_aux= only"):
        accy.grad(loss, 0, argnums=1)  # both ways at once: which is meant is unclear


def test_has_aux_returns_the_aux_tree_unchanged():
    x = arr([1.0, 2.0, 3.0], ("lane",))

    def loss(x):
        squares = x * x
        return squares.sum(), {"squares": squares, "count": x.sum()}

    g, aux = accy.grad(loss, has_aux=True)(x)
    np.testing.assert_allclose(g.array, [2.0, 4.0, 6.0])
    np.testing.assert_allclose(aux["squares"].array, [1.0, 4.0, 9.0])
    assert aux["count"].item() == 6.0
    (value, aux2), g2 = accy.value_and_grad(loss, has_aux=True)(x)
    assert value.item() == 14.0 and aux2["count"].item() == 6.0
    np.testing.assert_allclose(g2.array, [2.0, 4.0, 6.0])


def test_nested_transforms_grad_of_grad_and_jit_of_grad():
    x = arr([0.5, -1.0, 2.0], ("lane",))
    cube = lambda x: (x * x * x).sum()  # noqa: E731
    # d/dx sum(x^3) = 3x^2; d/dx sum(3x^2) = 6x
    np.testing.assert_allclose(accy.jit(accy.grad(cube))(x).array, 3 * x.array**2)
    second = accy.grad(lambda x: accy.grad(cube)(x).sum())(x)
    np.testing.assert_allclose(second.array, 6 * x.array)


def test_closure_over_an_outer_traced_value():
    x = arr([1.0, 2.0, 3.0], ("lane",))

    def outer(x):
        # d/dy sum(x y^2) at y = x is 2 x^2; d/dx sum(2 x^2) = 4x
        return accy.grad(lambda y: (x * y * y).sum())(x).sum()

    np.testing.assert_allclose(accy.grad(outer)(x).array, 4 * x.array)


def test_trees_of_named_tuples_dataclasses_and_lists():
    @dataclasses.dataclass
    class Layer:
        w: object
        b: object

    class Pair(NamedTuple):
        first: object
        second: object

    x = arr([1.0, 2.0], ("lane",))
    params = Pair(Layer(x, arr(3.0, ())), [x, arr([5.0, 7.0], ("lane",))])

    def loss(p):
        return (p.first.w * p.second[1]).sum() * p.first.b

    g = accy.grad(loss)(params)
    assert isinstance(g, Pair) and isinstance(g.first, Layer) and isinstance(g.second, list)
    np.testing.assert_allclose(g.first.w.array, [15.0, 21.0])  # b * second[1]
    assert g.first.b.item() == 19.0  # sum(w * second[1])
    np.testing.assert_allclose(g.second[0].array, [0.0, 0.0])
    np.testing.assert_allclose(g.second[1].array, [3.0, 6.0])


def test_dataclass_fields_that_are_strings_or_declared_static_are_structure():
    @dataclasses.dataclass
    class Scaled:
        w: object
        name: str  # a string: static
        power: int = dataclasses.field(default=2, metadata={"static": True})
        cached: object = dataclasses.field(default=None, init=False)

    x = arr([1.0, 2.0], ("lane",))
    model = Scaled(x, "first", 3)
    model.cached = "kept"

    seen = []

    @accy.jit
    def loss(m):
        seen.append((type(m.power), m.name, m.cached))
        return (m.w**m.power).sum()

    assert loss(model).item() == 9.0
    g = accy.grad(lambda m: (m.w**m.power).sum())(model)
    assert (g.name, g.power, g.cached) == ("first", 3, "kept")
    np.testing.assert_allclose(g.w.array, [3.0, 12.0])
    loss(Scaled(x, "second", 3))  # another static value: another trace
    assert loss.traces == 2
    assert seen == [(int, "first", "kept"), (int, "second", None)]


def test_an_operation_of_a_traced_value_and_a_scan_body_value_is_recorded_in_the_body():
    # `scale * h` with `scale` of the jitted function and `h` of the scan body: the body
    # records it, capturing `scale` (the enclosing trace must not lift the body's value).
    stacked = accy.nn.Stacked.stack([accy.nn.LayerNorm.init({"lane": 2}, device="reference")] * 2)
    x = accy.named(np.array([1.0, 3.0], np.float32), "lane", device="reference")
    scale = accy.named(np.float32(2.0), (), device="reference")

    def run(s, x, scale):
        return s.scan(lambda layer, h: (scale * layer(h), ()), x)[0]

    np.testing.assert_allclose(accy.jit(run)(stacked, x, scale).array, run(stacked, x, scale).array)


def test_jit_retraces_per_signature_and_hits_the_cache_on_a_repeat():
    calls = []

    @accy.jit
    def f(x):
        calls.append(1)
        return (x * 2.0).sum()

    a, b = arr([1.0, 2.0], ("lane",)), arr([3.0, 4.0], ("lane",))
    assert f(a).item() == 6.0 and f(b).item() == 14.0
    assert f.traces == 1 and len(calls) == 1
    assert f(arr([1.0, 2.0, 3.0], ("lane",))).item() == 12.0  # a new extent
    assert f(arr([1.0, 2.0], ("other",))).item() == 6.0  # a new axis name
    assert f(accy.named(np.ones(2, np.float32), ("lane",), device=R)).item() == 4.0  # dtype
    assert f.traces == 4 and len(calls) == 4
    f(b)
    assert f.traces == 4


def test_jit_static_argnames_allow_python_control_flow():
    @accy.jit
    def plain(x):
        return x

    def power(x, n):
        y = x
        for _ in range(n - 1):
            y = y * x
        return y

    jitted = accy.jit(power, static_argnames="n")
    x = arr([2.0, 3.0], ("lane",))
    np.testing.assert_allclose(jitted(x, 3).array, [8.0, 27.0])
    np.testing.assert_allclose(jitted(x, n=2).array, [4.0, 9.0])
    np.testing.assert_allclose(jitted(x, 3).array, [8.0, 27.0])
    assert jitted.traces == 2
    np.testing.assert_allclose(plain(x).array, x.array)


def test_jit_closes_over_small_and_large_arrays():
    small = arr([1.0, 2.0], ("lane",))
    large = arr(np.arange(200.0).reshape(10, 20), ("a", "b"))
    f = accy.jit(lambda x: (x * small).sum() + large.sum())
    assert f(arr([3.0, 4.0], ("lane",))).item() == 11.0 + np.arange(200.0).sum()


def test_jit_on_the_native_cpu_backend():
    x = accy.named(np.arange(6, dtype=np.float32).reshape(2, 3), ("row", "col"))
    f = accy.jit(lambda x: x.sum("col") * 2.0)
    result = f(x)
    assert result.device is accy.device("cpu") and result.axes == ("row",)
    np.testing.assert_allclose(result.array, [6.0, 24.0])


def test_python_scalar_arguments():
    x = arr([1.0, 2.0], ("lane",))
    # jit traces Python floats as f32 scalars; grad keeps them static outside argnums
    f32x = accy.named(np.array([1.0, 2.0], np.float32), ("lane",), device=R)
    assert accy.jit(lambda x, s: (x * s).sum())(f32x, 3.0).item() == 9.0
    g = accy.grad(lambda x, n: (x * x).sum() * float(n))(x, 3)
    np.testing.assert_allclose(g.array, [6.0, 12.0])


def test_jvp_vjp_linearize_on_functions():
    x, t = arr([0.5, 1.0], ("lane",)), arr([1.0, -2.0], ("lane",))
    y, dy = accy.jvp(lambda x: x.sin() * x, (x,), (t,))
    np.testing.assert_allclose(y.array, np.sin(x.array) * x.array)
    np.testing.assert_allclose(dy.array, (np.cos(x.array) * x.array + np.sin(x.array)) * t.array)
    y, back = accy.vjp(lambda a, b: {"p": a * b, "s": (a * a).sum()}, x, t)
    ct = {"p": arr([1.0, 1.0], ("lane",)), "s": arr(2.0, ())}
    ga, gb = back(ct)
    np.testing.assert_allclose(ga.array, t.array + 4 * x.array)
    np.testing.assert_allclose(gb.array, x.array)
    y, f_jvp = accy.linearize(lambda x: x.exp(), x)
    np.testing.assert_allclose(f_jvp(t).array, np.exp(x.array) * t.array)


def test_programs_keep_the_gradient_module_behaviour():
    loss = accy.trace.define(
        "loss", [accy.spec(accy.f32, lane=2)] * 2, lambda b, a: (a[0] * a[1]).sum("lane")
    )
    g = accy.grad(loss, wrt=(0, 1))
    assert isinstance(g, accy.Program)
    assert [x.tolist() for x in accy.reference.run(g, [[1, 2], [3, 4]])] == [[3, 4], [1, 2]]
    assert isinstance(accy.value_and_grad(loss), accy.Program)
    assert isinstance(accy.jvp(loss, (0,)), accy.Program)
    assert isinstance(accy.vjp(loss, (0,)), accy.Program)


# -- misuse ------------------------------------------------------------------------------------


def test_a_non_array_leaf_names_its_path():
    f = accy.jit(lambda p: p["w"])
    with pytest.raises(accy.NonArrayLeaf, match=r"args\[0\]\['name'\] is str 'hello'"):
        f({"w": arr([1.0], ("a",)), "name": "hello"})
    with pytest.raises(accy.NonArrayLeaf, match=r"accy.named\(array, \('axis0', 'axis1'\)\)"):
        f({"w": np.ones((2, 2))})


def test_a_missing_axis_lists_the_axes_there():
    f = accy.jit(lambda x: x.sum("tokn"))
    with pytest.raises(accy.AxisError, match="'tokn' is not on .*token"):
        f(arr([1.0], ("token",)))


def test_an_unhashable_static_argument():
    f = accy.jit(lambda x, sizes: x, static_argnames="sizes")
    with pytest.raises(accy.StaticArgumentError, match="'sizes' is list .*unhashable"):
        f(arr([1.0], ("a",)), [1, 2])
    with pytest.raises(accy.StaticArgumentError, match="no parameter 'n'"):
        accy.jit(lambda x: x, static_argnames="n")


def test_grad_of_a_non_scalar_and_other_grad_misuse():
    x = arr([1.0, 2.0], ("lane",))
    with pytest.raises(accy.GradientRequiresScalarOutput, match="f64\\[lane=2\\].*sum"):
        accy.grad(lambda x: x * x)(x)
    with pytest.raises(accy.TransformError, match="must return a pair"):
        accy.grad(lambda x: x.sum(), has_aux=True)(x)
    with pytest.raises(accy.TransformError, match="argnums=3"):
        accy.grad(lambda x: x.sum(), argnums=3)(x)
    ints = accy.named(np.array([1, 2], np.int32), ("lane",), device=R)
    with pytest.raises(accy.TransformError, match=r"args\[0\] \(i32\[lane=2\]\).*not floating"):
        accy.grad(lambda x: x.convert(accy.f64).sum())(ints)
    with pytest.raises(accy.TransformError, match="wrt= is for Programs"):
        accy.grad(lambda x: x.sum(), wrt=(0,))
    with pytest.raises(accy.TransformError, match="needs a function"):
        accy.grad(3)


def test_traced_values_refuse_python_control_flow_and_numpy():
    x = arr([1.0, 2.0], ("lane",))
    with pytest.raises(accy.AccyError, match="no truth value"):
        accy.jit(lambda x: x if x.sum() > 0 else -x)(x)
    with pytest.raises(accy.AccyError, match="cannot turn a traced value into a NumPy"):
        accy.jit(lambda x: np.asarray(x))(x)


def test_arrays_on_different_devices_are_refused():
    f = accy.jit(lambda a, b: a + b)
    with pytest.raises(accy.DeviceMismatch, match="different devices"):
        f(arr([1.0], ("a",), device="cpu"), arr([1.0], ("a",), device=R))


def test_mismatched_tangents_and_cotangents():
    x = arr([1.0, 2.0], ("lane",))
    with pytest.raises(accy.TransformError, match="tangents must have the structure"):
        accy.jvp(lambda x: x, (x,), ([x],))
    _, back = accy.vjp(lambda x: x * 2.0, x)
    with pytest.raises(accy.TransformError, match="cotangents leaf 0 has type"):
        back(arr([1.0, 2.0, 3.0], ("lane",)))


def test_keyword_array_arguments_and_an_explicit_device():
    x = accy.named(np.array([1.0, 2.0], np.float32), ("lane",), device=R)
    f = accy.jit(lambda x, *, scale: (x * scale).sum())
    assert f(x, scale=accy.named(np.float32(3.0), (), device=R)).item() == 9.0
    on_reference = accy.jit(lambda x: x * 2.0, device=R)
    doubled = on_reference(accy.named(np.array([1.0], np.float32), ("lane",)))  # a cpu array
    assert doubled.device is accy.device(R) and doubled.array.tolist() == [2.0]


def test_a_leaked_traced_value_is_refused():
    leaked = []

    def f(x):
        leaked.append(x)
        return x

    x = arr([1.0], ("a",))
    accy.jit(f)(x)
    with pytest.raises(accy.AccyError, match="used after its function returned"):
        leaked[0] + 1.0


def test_grad_differentiates_python_floats_inside_a_tree_and_refuses_ints():
    def loss(p, scale):
        return p["a"] * p["b"] * scale

    b = accy.named(np.float32(3.0), (), device=R)
    g = accy.grad(loss)({"a": 2.0, "b": b}, 5.0)  # d/da = b * scale, d/db = a * scale
    assert g["a"].item() == 15.0 and g["b"].item() == 10.0
    assert g["a"].dtype == accy.f32  # the float was differentiated as an f32 scalar
    with pytest.raises(accy.AccyError, match="Python int 2; gradients need floating-point"):
        accy.grad(loss)({"a": 2, "b": b}, 5.0)
    assert accy.grad(loss, argnums=1)({"a": 2, "b": b}, 5.0).item() == 6.0  # int outside


class Pair(NamedTuple):
    first: accy.NamedArray
    second: accy.NamedArray


@pytest.mark.parametrize(
    "shape",
    [
        lambda a, b: ((a, [b]), a * b),  # tuples and lists: a wrapper written out
        lambda a, b: {"sum": a + b, "pair": (a, b)},  # a dict: optree's unflatten
        lambda a, b: Pair(a, b * 2.0),  # a named tuple, likewise
    ],
)
def test_jit_outputs_keep_their_structure_on_every_call(shape):
    a_np, b_np = np.array([1.0, 2.0], np.float32), np.array([3.0, 5.0], np.float32)
    a, b = (accy.named(v, ("n",), device=R) for v in (a_np, b_np))
    f = accy.jit(lambda a, b: shape(a, b))
    expected = shape(a_np, b_np)
    for _ in range(3):  # the first call traces; the others take the fast path
        got = f(a, b)
        assert type(got) is type(expected)
        structures = (optree.tree_structure(t, namespace="accy") for t in (got, expected))
        assert next(structures) == next(structures)
        flat_got = optree.tree_leaves(got, namespace="accy")
        flat_expected = optree.tree_leaves(expected, namespace="accy")
        assert [x.device for x in flat_got] == [a.device] * len(flat_expected)
        for x, want in zip(flat_got, flat_expected, strict=True):
            np.testing.assert_array_equal(x.array, want)
    assert f.traces == 1
