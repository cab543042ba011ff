"""The front end's transforms against JAX on the same computations, in float64.

Each test writes one computation twice, with named axes in accy and with positional axes in
JAX, runs the same transform on both over trees of parameters (dicts, lists, tuples, named
tuples, dataclasses), and compares the results leaf by leaf, tree structure included. JAX is a
test dependency (the `test` extra), imported here unconditionally so that these tests never
skip silently. Most run on the reference device (no C compiler) to stay fast; the native CPU
backend has its own test.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy
from accy.frontend.tracing import flatten, unflatten

R = "reference"
# The expected values come from jitted JAX functions: JAX's eager mode compiles each primitive
# it meets, which would make these tests slow, and gives the same numbers.
J = jax.jit
RTOL, ATOL = 1e-10, 1e-12


@pytest.fixture(autouse=True)
def x64():
    """JAX in float64 for the test (restored after), so that both sides agree to ~1e-12."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


class Dense(NamedTuple):
    w: Any
    b: Any


@dataclasses.dataclass
class Model:
    layers: list
    scale: Any


jax.tree_util.register_dataclass(Model, data_fields=["layers", "scale"], meta_fields=[])


# -- trees on both sides -----------------------------------------------------------------------


def to_jax(tree: Any) -> Any:
    """The accy tree with each NamedArray replaced by a JAX array of its data (same layout)."""
    leaves, treedef = flatten(tree)
    return unflatten(treedef, [jnp.asarray(np.asarray(leaf)) for leaf in leaves])


def assert_trees_close(ours: Any, theirs: Any, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Same tree structure (containers, keys, node types) and leaves equal within tolerance."""
    our_leaves, our_def = flatten(ours)
    their_leaves, their_def = flatten(theirs)
    assert our_def == their_def, f"tree structures differ:\n  accy {our_def}\n  jax  {their_def}"
    for ours_leaf, theirs_leaf in zip(our_leaves, their_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(ours_leaf), np.asarray(theirs_leaf), rtol, atol)


def tree_sum_of_squares(tree: Any) -> Any:
    """sum over the leaves of sum(leaf^2): works for accy values and JAX arrays alike."""
    leaves, _ = flatten(tree)
    total = (leaves[0] * leaves[0]).sum()
    for leaf in leaves[1:]:
        total = total + (leaf * leaf).sum()
    return total


# -- one model, written for each ---------------------------------------------------------------

AXES = ("d0", "d1", "d2")


def accy_mlp(params, x):
    h = x
    for i, layer in enumerate(params["model"].layers):
        h = (h.contract(layer.w, AXES[i]) + layer.b).tanh()
    return h * params["model"].scale


def jax_mlp(params, x):
    h = x
    for layer in params["model"].layers:
        h = jnp.tanh(h @ layer.w + layer.b)
    return h * params["model"].scale


def accy_loss(params, x, y):
    error = accy_mlp(params, x) - y
    shift, _ = params["extra"]
    return (error * error).sum() + (shift * shift).sum() * 0.1


def jax_loss(params, x, y):
    error = jax_mlp(params, x) - y
    shift, _ = params["extra"]
    return (error * error).sum() + (shift * shift).sum() * 0.1


@pytest.fixture
def problem():
    """(accy params, x, y; the same for JAX): a batch of 5, sizes d0=3, d1=4, d2=2."""
    rng = np.random.default_rng(18)

    def a(shape, axes):
        return accy.named(rng.normal(size=shape), axes, device=R)

    params = {
        "model": Model(
            layers=[
                Dense(a((3, 4), ("d0", "d1")), a((4,), ("d1",))),
                Dense(a((4, 2), ("d1", "d2")), a((2,), ("d2",))),
            ],
            scale=a((), ()),
        ),
        "extra": (a((2,), ("d2",)), a((4,), ("d1",))),
    }
    x, y = a((5, 3), ("batch", "d0")), a((5, 2), ("batch", "d2"))
    return (params, x, y), (to_jax(params), to_jax(x), to_jax(y))


# -- gradients ---------------------------------------------------------------------------------


def test_grad_and_value_and_grad_over_a_tree(problem):
    ours, theirs = problem
    grads = accy.grad(accy_loss)(*ours)
    assert isinstance(grads["model"], Model) and isinstance(grads["model"].layers[0], Dense)
    assert grads["model"].layers[1].w.axes == ("d1", "d2")
    results = (
        grads,
        accy.value_and_grad(accy_loss, argnums=(0, 1))(*ours),
        accy.grad(accy_loss, argnums=-1)(*ours),  # from the end, as in JAX
    )
    expected = J(
        lambda *a: (
            jax.grad(jax_loss)(*a),
            jax.value_and_grad(jax_loss, argnums=(0, 1))(*a),
            jax.grad(jax_loss, -1)(*a),
        )
    )(*theirs)
    assert_trees_close(results, expected)


def test_has_aux(problem):
    ours, theirs = problem

    def accy_with_aux(params, x, y):
        out = accy_mlp(params, x)
        return accy_loss(params, x, y), {"out": out, "stats": [out.mean(), out.max()]}

    def jax_with_aux(params, x, y):
        out = jax_mlp(params, x)
        return jax_loss(params, x, y), {"out": out, "stats": [out.mean(), out.max()]}

    results = (
        accy.grad(accy_with_aux, has_aux=True)(*ours),
        accy.value_and_grad(accy_with_aux, argnums=(0, 2), has_aux=True)(*ours),
    )
    expected = J(
        lambda *a: (
            jax.grad(jax_with_aux, has_aux=True)(*a),
            jax.value_and_grad(jax_with_aux, argnums=(0, 2), has_aux=True)(*a),
        )
    )(*theirs)
    assert_trees_close(results, expected)


def test_per_example_gradients_through_vmap(problem):
    (params, x, y), (j_params, j_x, j_y) = problem
    per_example = accy.vmap(accy.grad(accy_loss), "batch")(params, x, y)
    expected = J(jax.vmap(jax.grad(jax_loss), in_axes=(None, 0, 0)))(j_params, j_x, j_y)
    assert per_example["model"].layers[0].w.axes == ("batch", "d0", "d1")
    assert_trees_close(per_example, expected)
    # in_axes given explicitly, as a tree prefix
    explicit = accy.vmap(accy.grad(accy_loss), "batch", in_axes=(None, True, "batch"))
    assert_trees_close(explicit(params, x, y), expected)
    as_in_jax = accy.vmap(accy.grad(accy_loss), "batch", in_axes=(None, 0, 0))  # positions
    assert_trees_close(as_in_jax(params, x, y), expected)


def test_vmap_in_axes_and_out_axes_tree_prefixes(problem):
    (params, x, y), (j_params, j_x, j_y) = problem
    rng = np.random.default_rng(3)
    shifts = rng.normal(size=(5, 2))
    # a per-example shift inside the parameter tree (mapped along another name, "example"),
    # the rest of the tree shared: in_axes is a tree prefix of the arguments, as JAX's
    params = {
        **params,
        "extra": (accy.named(shifts, ("example", "d2"), device=R), params["extra"][1]),
    }
    j_params = {**j_params, "extra": (jnp.asarray(shifts), j_params["extra"][1])}

    def accy_f(params, x, y):
        return {
            "loss": accy_loss(params, x, y),
            "scale": params["model"].scale * 2.0,
            "out": accy_mlp(params, x),
        }

    def jax_f(params, x, y):
        return {
            "loss": jax_loss(params, x, y),
            "scale": params["model"].scale * 2.0,
            "out": jax_mlp(params, x),
        }

    ours = accy.vmap(
        accy_f,
        "batch",
        in_axes=({"model": None, "extra": ("example", None)}, True, True),
        out_axes={"loss": 0, "scale": None, "out": 1},
    )(params, x, y)
    theirs = J(
        jax.vmap(
            jax_f,
            in_axes=({"model": None, "extra": (0, None)}, 0, 0),
            out_axes={"loss": 0, "scale": None, "out": 1},
        )
    )(j_params, j_x, j_y)
    assert ours["out"].axes == ("d2", "batch") and ours["scale"].axes == ()
    assert_trees_close(ours, theirs)


# -- nested transforms -------------------------------------------------------------------------


@pytest.mark.slow
def test_grad_of_grad_jit_of_grad_and_grad_of_jit(problem):
    ours, theirs = problem
    # the gradient of the squared gradient norm: a Hessian-vector product, reverse over reverse
    accy_norm = lambda p, x, y: tree_sum_of_squares(accy.grad(accy_loss)(p, x, y))  # noqa: E731
    jax_norm = lambda p, x, y: tree_sum_of_squares(jax.grad(jax_loss)(p, x, y))  # noqa: E731
    # and a third derivative of a scalar function of a scalar
    x = accy.named(np.float64(0.7), (), device=R)
    f = lambda x: (x * x * x).sin()  # noqa: E731
    g = lambda x: jnp.sin(x * x * x)  # noqa: E731
    results = (
        accy.grad(accy_norm)(*ours),
        accy.jit(accy.grad(accy_loss))(*ours),
        accy.grad(accy.jit(accy_loss))(*ours),
        accy.grad(accy.grad(accy.grad(f)))(x),
    )
    expected = J(
        lambda p, x, y, scalar: (
            jax.grad(jax_norm)(p, x, y),
            jax.jit(jax.grad(jax_loss))(p, x, y),
            jax.grad(jax.jit(jax_loss))(p, x, y),
            jax.grad(jax.grad(jax.grad(g)))(scalar),
        )
    )(*theirs, 0.7)
    assert_trees_close(results, expected, rtol=1e-9)


def test_vmap_of_grad_under_jit_and_jvp_of_grad(problem):
    (params, x, y), (j_params, j_x, j_y) = problem
    per_example = accy.jit(accy.vmap(accy.grad(accy_loss, argnums=1), "batch"))(params, x, y)
    assert per_example.axes == ("batch", "d0")
    # forward over reverse: a Hessian-vector product in the direction of the parameters
    hvp = accy.jvp(lambda p: accy.grad(accy_loss)(p, x, y), (params,), (params,))
    expected = J(
        lambda p, x, y: (
            jax.jit(jax.vmap(jax.grad(jax_loss, argnums=1), in_axes=(None, 0, 0)))(p, x, y),
            jax.jvp(lambda p: jax.grad(jax_loss)(p, x, y), (p,), (p,)),
        )
    )(j_params, j_x, j_y)
    assert_trees_close((per_example, hvp), expected, rtol=1e-9)


# -- jvp, vjp, linearize -----------------------------------------------------------------------


def accy_two_outputs(params, x):
    out = accy_mlp(params, x)
    return {"out": out, "norm": (out * out).sum()}


def jax_two_outputs(params, x):
    out = jax_mlp(params, x)
    return {"out": out, "norm": (out * out).sum()}


def test_jvp_vjp_linearize_over_trees(problem):
    (params, x, _), (j_params, j_x, _) = problem
    rng = np.random.default_rng(7)
    leaves, treedef = flatten(params)
    tangent = unflatten(
        treedef,
        [
            accy.named(rng.normal(size=tuple(leaf.shape.values())), leaf.axes, device=R)
            for leaf in leaves
        ],
    )
    x_tangent = accy.named(rng.normal(size=(5, 3)), ("batch", "d0"), device=R)
    cotangent = {
        "out": accy.named(rng.normal(size=(5, 2)), ("batch", "d2"), device=R),
        "norm": accy.named(np.float64(1.5), (), device=R),
    }
    out, back = accy.vjp(accy_two_outputs, params, x)
    linear_out, f_jvp = accy.linearize(accy_two_outputs, params, x)
    results = (
        accy.jvp(accy_two_outputs, (params, x), (tangent, x_tangent)),
        (out, back(cotangent)),
        (linear_out, f_jvp(tangent, x_tangent)),
    )

    def jax_side(p, x, t, tx, ct):
        out, back = jax.vjp(jax_two_outputs, p, x)
        linear_out, f_jvp = jax.linearize(jax_two_outputs, p, x)
        return (
            jax.jvp(jax_two_outputs, (p, x), (t, tx)),
            (out, back(ct)),
            (linear_out, f_jvp(t, tx)),
        )

    expected = J(jax_side)(j_params, j_x, to_jax(tangent), to_jax(x_tangent), to_jax(cotangent))
    assert_trees_close(results, expected)


def test_jvp_and_vjp_with_aux(problem):
    (params, x, _), (j_params, j_x, _) = problem

    def accy_f(params, x):
        out = accy_mlp(params, x)
        return (out * out).sum("d2"), {"mean": out.mean(), "layers": len(params["model"].layers)}

    def jax_f(params, x):
        out = jax_mlp(params, x)
        return (out * out).sum(1), {"mean": out.mean(), "layers": len(params["model"].layers)}

    x_tangent = accy.named(np.ones((5, 3)), ("batch", "d0"), device=R)
    cotangent = accy.named(np.arange(5.0), ("batch",), device=R)
    out, back, aux = accy.vjp(accy_f, params, x, has_aux=True)
    results = (
        accy.jvp(accy_f, (params, x), (params, x_tangent), has_aux=True),
        (out, back(cotangent), aux),
    )

    def jax_side(p, x, tx, ct):
        out, back, aux = jax.vjp(jax_f, p, x, has_aux=True)
        return jax.jvp(jax_f, (p, x), (p, tx), has_aux=True), (out, back(ct), aux)

    expected = J(jax_side)(j_params, j_x, to_jax(x_tangent), to_jax(cotangent))
    assert_trees_close(results, expected)


# -- the trace cache ---------------------------------------------------------------------------


def test_retracing_on_a_new_signature_and_cache_hits_on_a_repeat():
    traces = {"accy": 0, "jax": 0}

    def accy_f(tree, n):
        traces["accy"] += 1
        total = tree["a"].sum()
        for leaf in tree.get("more", []):
            total = total + leaf.sum()
        return total * float(n)

    def jax_f(tree, n):
        traces["jax"] += 1
        total = tree["a"].sum()
        for leaf in tree.get("more", []):
            total = total + leaf.sum()
        return total * float(n)

    ours = accy.jit(accy_f, static_argnames="n")
    theirs = jax.jit(jax_f, static_argnames="n")

    def a(values, dtype=np.float64):
        return accy.named(np.asarray(values, dtype), ("lane",), device=R)

    calls = [
        ({"a": a([1.0, 2.0])}, 1),  # first: a trace
        ({"a": a([3.0, 4.0])}, 1),  # same signature, new values: a cache hit
        ({"a": a([1.0, 2.0, 3.0])}, 1),  # a new extent
        ({"a": a([1.0, 2.0], np.float32)}, 1),  # a new dtype
        ({"a": a([1.0, 2.0]), "more": [a([5.0])]}, 1),  # a new tree structure
        ({"a": a([1.0, 2.0])}, 3),  # a new static value
        ({"a": a([9.0, 9.0])}, 3),  # all seen before: hits
        ({"a": a([1.0, 2.0]), "more": [a([7.0])]}, 1),
    ]
    for tree, n in calls:
        ours_value = ours(tree, n)
        theirs_value = theirs(to_jax(tree), n)
        np.testing.assert_allclose(np.asarray(ours_value), np.asarray(theirs_value), rtol=1e-6)
        assert traces["accy"] == traces["jax"], (tree, n)
    assert traces["accy"] == ours.traces == 5
    # accy's signatures include the axis names, which JAX does not have
    ours({"a": accy.named(np.ones(2), ("other",), device=R)}, 1)
    assert ours.traces == 6
    # grad caches its trace per signature too (JAX's grad traces at every call)
    grad = accy.grad(lambda t: accy_f(t, 2))
    for values in ([1.0, 2.0], [3.0, 5.0]):
        g = grad({"a": a(values)})
        np.testing.assert_allclose(g["a"].array, [2.0, 2.0])
    assert grad.staged.traces == 1 and accy.grad(grad.fn) is grad


# -- closures and static arguments -------------------------------------------------------------


def test_closures_over_small_and_large_arrays():
    rng = np.random.default_rng(5)
    small_np, large_np = rng.normal(size=(3,)), rng.normal(size=(3, 40))  # 3 and 120 elements
    small = accy.named(small_np, ("d",), device=R)
    large = accy.named(large_np, ("d", "k"), device=R)

    def accy_f(x):  # x: (d,)
        return ((x * small).contract(large, "d").tanh()).sum()

    def jax_f(x):
        return jnp.tanh((x * small_np) @ large_np).sum()

    x_np = rng.normal(size=3)
    x = accy.named(x_np, ("d",), device=R)
    # and a closure over a traced value of an enclosing transform
    accy_outer = lambda x: accy.grad(lambda y: (x * y * y).sum().sin())(x).sum()  # noqa: E731
    jax_outer = lambda x: jax.grad(lambda y: jnp.sin((x * y * y).sum()))(x).sum()  # noqa: E731
    results = (
        accy.jit(accy_f)(x),
        accy.grad(accy_f)(x),
        accy.jit(accy.grad(accy_f))(x),
        accy.grad(accy_outer)(x),
    )
    expected = J(
        lambda x: (
            jax_f(x),
            jax.grad(jax_f)(x),
            jax.jit(jax.grad(jax_f))(x),
            jax.grad(jax_outer)(x),
        )
    )(x_np)
    assert_trees_close(results, expected)


def test_static_arguments_drive_python_control_flow():
    def accy_f(x, depth, activation):
        for _ in range(depth):
            x = x.tanh() if activation == "tanh" else x.logistic()
        return x.sum()

    def jax_f(x, depth, activation):
        for _ in range(depth):
            x = jnp.tanh(x) if activation == "tanh" else jax.nn.sigmoid(x)
        return x.sum()

    ours = accy.jit(accy_f, static_argnames=("depth", "activation"))
    # JAX's side: the value, and the gradient with the Python values passed through grad
    theirs = jax.jit(
        lambda x, depth, activation: (
            jax_f(x, depth, activation),
            jax.grad(jax_f)(x, depth, activation),
        ),
        static_argnames=("depth", "activation"),
    )
    x_np = np.array([0.3, -1.2, 2.0])
    x = accy.named(x_np, ("lane",), device=R)
    for depth, activation in [(1, "tanh"), (3, "tanh"), (2, "logistic"), (3, "tanh")]:
        results = (
            ours(x, depth, activation=activation),
            # under grad, Python values outside argnums stay Python values (as JAX's)
            accy.grad(accy_f)(x, depth, activation),
        )
        assert_trees_close(results, theirs(x_np, depth, activation))
    assert ours.traces == 3


# -- the native CPU backend, and eager operations ----------------------------------------------


@pytest.mark.slow
def test_on_the_native_cpu_backend(problem):
    (params, x, y), theirs = problem
    on_cpu = [
        unflatten(d, [leaf.to("cpu") for leaf in leaves])
        for leaves, d in (flatten(params), flatten(x), flatten(y))
    ]
    value, grads = accy.jit(accy.value_and_grad(accy_loss))(*on_cpu)
    assert value.device is accy.device("cpu")
    per_example = accy.jit(accy.vmap(accy.grad(accy_loss), "batch"))(*on_cpu)
    expected = J(
        lambda *a: (
            jax.value_and_grad(jax_loss)(*a),
            jax.vmap(jax.grad(jax_loss), (None, 0, 0))(*a),
        )
    )(*theirs)
    assert_trees_close(((value, grads), per_example), expected)


EAGER_CASES = {
    # name: (accy operation on named arrays, the same in JAX on positional (2, 3) and (3,) arrays)
    "broadcast arithmetic": (
        lambda a, b: (a * b - a / (b * b + 1.0)) ** 2.0,
        lambda a, b: (a * b - a / (b * b + 1.0)) ** 2.0,
    ),
    "unary chain": (
        lambda a, b: (a.tanh() + a.exp() - (a * a + 1.0).log()).logistic(),
        lambda a, b: jax.nn.sigmoid(jnp.tanh(a) + jnp.exp(a) - jnp.log(a * a + 1.0)),
    ),
    "reductions": (
        lambda a, b: a.sum("col") + a.max("col") - a.mean(),
        lambda a, b: a.sum(1) + a.max(1) - a.mean(),
    ),
    "contraction": (lambda a, b: a.contract(b, "col"), lambda a, b: a @ b),
    "softmax": (lambda a, b: accy.nn.softmax(a, "col"), lambda a, b: jax.nn.softmax(a, axis=1)),
    "slicing by name": (lambda a, b: a["col", 1:]["row", 0], lambda a, b: a[0, 1:]),
    "transpose": (lambda a, b: a.transpose("col", "row"), lambda a, b: a.T),
    "comparison and select": (
        lambda a, b: a.max(b),
        lambda a, b: jnp.maximum(a, b),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", R])
@pytest.mark.parametrize("case", list(EAGER_CASES))
def test_eager_operations_agree_with_jit_and_jax(case, device):
    accy_op, jax_op = EAGER_CASES[case]
    rng = np.random.default_rng(11)
    a_np, b_np = rng.normal(size=(2, 3)), rng.normal(size=3)
    a = accy.named(a_np, ("row", "col"), device=device)
    b = accy.named(b_np, ("col",), device=device)
    eager = accy_op(a, b)
    jitted = accy.jit(accy_op)(a, b)
    assert eager.device is jitted.device is accy.device(device) and eager.axes == jitted.axes
    np.testing.assert_allclose(eager.array, jitted.array, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(eager.array, J(jax_op)(a_np, b_np), RTOL, ATOL)
