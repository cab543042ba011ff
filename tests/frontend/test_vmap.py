"""accy.vmap: batching rules per kind, checked against NumPy and against a Python loop over
examples on the reference evaluator (the oracle), and per-example gradients against hand
derivations."""

from __future__ import annotations

import numpy as np
import pytest

import accy

R = "reference"
rng = np.random.default_rng(2)


def arr(values, axes, dtype=np.float64):
    return accy.named(np.asarray(values, dtype), axes, device=R)


def looped(fn, axis, *args):
    """fn applied to each example separately (slicing `axis` off the arguments that have it),
    stacked along `axis` first: what vmap must equal."""
    extent = next(a.shape[axis] for a in args if axis in a.axes)
    results = []
    for i in range(extent):
        example = [a[axis, i] if axis in a.axes else a for a in args]
        results.append(np.asarray(accy.jit(fn)(*example)))
    return np.stack(results)


def check(fn, axis, *args):
    batched = accy.vmap(fn, axis)(*args)
    assert batched.axes[0] == axis
    np.testing.assert_allclose(np.asarray(batched), looped(fn, axis, *args), rtol=1e-12)


def test_per_example_gradients_of_logistic_regression():
    w, b = rng.normal(size=3), 0.3
    xs, ys = rng.normal(size=(5, 3)), rng.integers(0, 2, 5).astype(np.float64)

    def loss(params, x, y):
        p = (x.contract(params["w"], "feature") + params["b"]).logistic()
        return -(y * p.log() + (1.0 - y) * (1.0 - p).log())

    params = {"w": arr(w, ("feature",)), "b": arr(b, ())}
    grads = accy.vmap(accy.grad(loss), "example")(
        params, arr(xs, ("example", "feature")), arr(ys, ("example",))
    )
    p = 1 / (1 + np.exp(-(xs @ w + b)))
    # d/dw of the cross-entropy of a logistic: (p - y) x; d/db: p - y
    np.testing.assert_allclose(grads["w"].array, (p - ys)[:, None] * xs, rtol=1e-10)
    np.testing.assert_allclose(grads["b"].array, p - ys, rtol=1e-10)
    assert grads["w"].axes == ("example", "feature")


def test_per_example_gradients_through_an_embedding_gather():
    table = rng.normal(size=(6, 2))
    ids = np.array([[0, 3], [3, 3], [5, 1]], np.int32)

    def loss(table, ids):
        rows = table.gather(ids, "vocab")  # token, dim
        return (rows * rows).sum()

    grads = accy.vmap(accy.grad(loss), "example")(
        arr(table, ("vocab", "dim")), accy.named(ids, ("example", "token"), device=R)
    )
    expected = np.zeros((3, 6, 2))
    for e in range(3):
        for t in ids[e]:
            expected[e, t] += 2 * table[t]
    np.testing.assert_allclose(grads.array, expected, rtol=1e-12)


def test_gather_and_scatter_with_both_operands_batched():
    tables = rng.normal(size=(4, 5, 3))
    ids = np.array([[0, 4], [2, 2], [9, -1], [1, 3]], np.int32)  # out of range: clamped
    t = arr(tables, ("example", "vocab", "dim"))
    i = accy.named(ids, ("example", "token"), device=R)
    check(lambda t, i: t.gather(i, "vocab"), "example", t, i)
    updates = arr(rng.normal(size=(4, 2, 3)), ("example", "token", "dim"))
    check(lambda t, i, u: t.scatter_add(i, u, "vocab"), "example", t, i, updates)
    shared = arr(tables[0], ("vocab", "dim"))
    check(lambda t, i, u: t.scatter_add(i, u, "vocab"), "example", shared, i, updates)


def test_contractions_with_one_or_both_operands_batched():
    a = arr(rng.normal(size=(4, 3, 2)), ("example", "row", "k"))
    b = arr(rng.normal(size=(2, 5)), ("k", "col"))
    bb = arr(rng.normal(size=(4, 2, 5)), ("example", "k", "col"))
    h = arr(rng.normal(size=(3, 2, 7)), ("row", "k", "head"))
    check(lambda a, b: a.contract(b, "k"), "example", a, b)
    check(lambda a, b: a.contract(b, "k"), "example", a, bb)
    check(lambda b, a: b.contract(a, "k"), "example", b, a)
    check(lambda a, h: a.contract(h, "k"), "example", a, h)  # row is a batch axis
    check(lambda h, a: h.contract(a, "k"), "example", h, a)
    np.testing.assert_allclose(
        accy.vmap(lambda a, b: a.contract(b, "k"), "example")(a, b).array,
        np.einsum("erk,kc->erc", a.array, b.array),
    )


def test_layout_and_reduction_kinds():
    x = arr(rng.normal(size=(3, 4, 5)), ("example", "row", "col"))
    check(lambda x: x.transpose("col", "row"), "example", x)
    check(lambda x: x.merge(("row", "col"), "flat"), "example", x)
    check(lambda x: x.split("col", a=5, b=1), "example", x)
    check(lambda x: x["col", 1:4:2], "example", x)
    check(lambda x: x.pad("row", 1, 2, 0.5, interior=1), "example", x)
    check(lambda x: x.builder.concatenate([x, x * 2.0], "row"), "example", x)
    check(lambda x: x.max("col") + x.min("row").sum() - x.prod(), "example", x)
    check(lambda x: accy.nn.softmax(x, "col"), "example", x)
    # a per-example init and a per-example padding value
    check(lambda x: x.reduce(x.sum(), "max", "row"), "example", x)
    check(lambda x: x.pad("col", 1, 0, x["col", 0]["row", 0]), "example", x)


def test_scan_inside_vmap():
    xs = arr(rng.normal(size=(3, 4, 2)), ("example", "step", "d"))
    c0 = arr(rng.normal(size=2), ("d",))

    def run(c0, xs):
        def body(b, args):
            c, x = args
            new = (c * 0.5 + x).tanh()
            return new, new.sum()

        (c,), (ys,) = xs.builder.scan(body, carries=[c0], xs=[xs], axis="step")
        return c.sum() + ys.sum()

    check(run, "example", c0, xs)


def test_in_axes_out_axes_and_programs():
    x = arr(rng.normal(size=(3, 2)), ("example", "d"))
    y = arr(rng.normal(size=(2, 3)), ("d", "example"))  # the mapped axis need not be first
    out = accy.vmap(lambda x, y: x * y, "example", out_axes=1)(x, y)
    assert out.axes == ("d", "example")
    np.testing.assert_allclose(out.array, (x.array * y.array.T).T)
    # in_axes=(True, False): y is shared, its "example" axis is an ordinary axis then
    shared = accy.vmap(lambda x, y: x.contract(y, "d"), "example", in_axes=(True, False))
    z = arr(rng.normal(size=(2, 4)), ("d", "other"))
    np.testing.assert_allclose(shared(x, z).array, x.array @ z.array)
    program = accy.trace.define(
        "dot", [accy.spec(accy.f64, d=2)] * 2, lambda b, a: a[0].contract(a[1], "d")
    )
    batched = accy.vmap(program, "example", in_axes=(True, False), size=3)
    (result,) = accy.reference.run(batched, [x.array, z.array[:, 0]])
    np.testing.assert_allclose(result, x.array @ z.array[:, 0])


def test_vmap_misuse():
    x = arr(rng.normal(size=(3, 2)), ("example", "d"))
    with pytest.raises(accy.TransformError, match="no argument has an axis 'sample'"):
        accy.vmap(lambda x: x, "sample")(x)
    with pytest.raises(accy.AxisError, match="disagree on its extent"):
        accy.vmap(lambda x, y: x + y, "example")(x, arr(np.ones((4, 2)), ("example", "d")))
    with pytest.raises(accy.AxisError, match=r"in_axes maps args\[1\]"):
        accy.vmap(lambda x, y: x + y, "example", in_axes=(True, True))(x, arr([1.0, 2.0], ("d",)))
    with pytest.raises(accy.AxisError, match="already has an axis named 'example'"):
        inner = arr(np.ones(3), ("example",))
        accy.vmap(lambda x: (x.sum() * inner).sum(), "example")(x)
    with pytest.raises(accy.TransformError, match="size="):
        accy.vmap(accy.trace.define("p", [accy.spec(accy.f32)], lambda b, a: a[0]), "e")


def test_a_custom_call_without_a_batch_rule_is_vmapped_as_a_loop():
    program = accy.trace.define(
        "p",
        [accy.spec(accy.f32, d=2)],
        lambda b, a: b.custom_call("my.kernel", 1, [a[0]], accy.spec(accy.f32, d=2)),
    )
    batched = accy.vmap(program, "example", size=3)
    assert batched.count("scan") == 1 and batched.count("custom_call") == 0
    assert str(batched.output_types[0]) == "f32[example=3, d=2]"


def test_every_kind_with_operands_has_a_batching_rule():
    # Kinds without operands are never batched; a custom call's rule is its record's, or a
    # loop over the examples.
    without_operands = {"parameter", "constant", "iota", "axis_index"}
    missing = {kind for kind, rule in accy.core.RULES.items() if rule.batch is None}
    assert missing == without_operands
