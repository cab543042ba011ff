"""Haliax's tests/test_hof.py (stanford-crfm/haliax), case by case, in accy.

Haliax's `hax.scan(f, axis)(init, *args)` is `accy.scan(f, init, xs, axis=...)`: arguments
without the axis (Haliax broadcasts them) are closures, and `hax.fold` is a scan that returns
no ys. The inputs are the peer's (`jax.random.uniform(PRNGKey(0), ...)`, what
`hax.random.uniform` draws); the expected values come from the oracle the Haliax assertions
use, jax.numpy on the same arrays. Haliax itself does not import under this JAX.

Haliax's 21 cases: all translated, each test tagged with `@translates` (cases that differ only
by Axis object versus name are one test), as 19 tests, 20 once parametrized, all passing. Where
Haliax's init is a bare jnp array without names (test_scan_doesnt_scan_init), the accy init is
named: accy has no positional arrays.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy
from tests.peers.ledger import translates

R = "reference"
HEIGHT, WIDTH, DEPTH, BATCH = 10, 3, 4, 10


def uniform(*named_extents):
    """hax.random.uniform(PRNGKey(0), axes): the same draw, with the axis names."""
    names = tuple(n for n, _ in named_extents)
    shape = tuple(e for _, e in named_extents)
    array = np.asarray(jax.random.uniform(jax.random.PRNGKey(0), shape), np.float32)
    return accy.named(array, names, device=R)


def named1():
    return uniform(("Height", HEIGHT), ("Width", WIDTH), ("Depth", DEPTH))


def scan_fun(acc, x):
    return acc + x.sum(), x["Width", 2]


@pytest.mark.slow
@translates("test_scan", "test_scan_str_arg")
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_scan(jitted):
    """test_scan and test_scan_str_arg: an axis name either way (accy has no Axis objects)."""
    x = named1()
    run = functools.partial(accy.scan, scan_fun, axis="Height")
    total, selected = (accy.jit(run) if jitted else run)(0.0, x)
    np.testing.assert_allclose(total.item(), jnp.sum(x.array, axis=(0, 1, 2)), rtol=1e-6)
    assert selected.axes == ("Height", "Depth")
    np.testing.assert_array_equal(selected.array, jnp.take(x.array, 2, axis=1))


@translates("test_scan_not_0th_axis")
def test_scan_not_0th_axis():
    x = named1()
    total, selected = accy.scan(scan_fun, 0.0, x, axis="Depth")
    np.testing.assert_allclose(total.item(), jnp.sum(x.array, axis=(0, 1, 2)), rtol=1e-6)
    # Haliax stacks along the scanned axis first too: (Depth, Height)
    assert selected.axes == ("Depth", "Height")
    np.testing.assert_array_equal(selected.array, jnp.take(x.array, 2, axis=1).T)


@translates("test_scan_static_args")
def test_scan_static_args():
    def scan_fun(acc, x, static1, *, static2):
        assert static1 is True
        assert static2 is False
        return acc + x.sum(), x["Width", 2]

    x = named1()
    body = functools.partial(scan_fun, static1=True, static2=False)
    total, selected = accy.jit(lambda x: accy.scan(body, 0.0, x, axis="Depth"))(x)
    np.testing.assert_allclose(total.item(), jnp.sum(x.array), rtol=1e-6)
    np.testing.assert_array_equal(selected.array, jnp.take(x.array, 2, axis=1).T)


@translates("test_scan_doesnt_scan_scalars")
def test_scan_doesnt_scan_scalars():
    x = uniform(("Height", HEIGHT))
    total, selected = accy.scan(lambda acc, v: (acc + 4.0 * v, v * 4.0), 0.0, x, axis="Height")
    np.testing.assert_allclose(total.item(), jnp.sum(x.array * 4.0), rtol=1e-6)
    np.testing.assert_array_equal(selected.array, x.array * 4.0)


@translates("test_scan_doesnt_scan_init")
def test_scan_doesnt_scan_init():
    x = uniform(("Height", HEIGHT))
    init = np.arange(HEIGHT, dtype=np.float32)

    def scan_fun(acc, z, v):
        return acc + z * v, v * z

    body = functools.partial(scan_fun, z=4.0)
    total, _ = accy.scan(
        lambda acc, v: body(acc, v=v), accy.named(init, "Height", R), x, axis="Height"
    )
    np.testing.assert_allclose(total.array, init + jnp.sum(x.array * 4.0), rtol=1e-6)
    # fold: the same loop without ys
    total, ys = accy.scan(
        lambda acc, v: (acc + 4.0 * v, None), accy.named(init, "Height", R), x, axis="Height"
    )
    assert ys is None
    np.testing.assert_allclose(total.array, init + jnp.sum(x.array * 4.0), rtol=1e-6)


@translates("test_scan_hierarchical")
def test_scan_hierarchical():
    """ScanCheckpointPolicy(nested_remat=True): accy's remat gives the same values and
    gradients."""
    x = named1()
    total, selected = accy.scan(scan_fun, 0.0, x, axis="Height")
    total_blocked, selected_blocked = accy.scan(scan_fun, 0.0, x, axis="Height", remat=True)
    assert total.item() == total_blocked.item()
    np.testing.assert_array_equal(selected.array, selected_blocked.array)

    def loss(x, remat):
        def step(acc, v):
            return (acc * v.sin().mean()).tanh() + 0.5, v["Width", 2] * acc

        acc, ys = accy.scan(step, 0.3, x, axis="Height", remat=remat)
        return acc + ys.sum()

    plain = accy.grad(functools.partial(loss, remat=False))(x)
    blocked = accy.grad(functools.partial(loss, remat=True))(x)
    np.testing.assert_allclose(blocked.array, plain.array, rtol=1e-6)


def fold(f, axis):
    """hax.fold(f, axis)(init, xs): the carry of a scan whose body returns no ys."""
    return lambda init, xs: accy.scan(lambda c, x: (f(c, x), None), init, xs, axis=axis)[0]


@translates("test_fold", "test_fold_str_args")
def test_fold():
    """test_fold and test_fold_str_args."""
    x = named1()
    acc = accy.named(np.zeros((HEIGHT, WIDTH), np.float32), ("Height", "Width"), R)
    total = fold(lambda a, y: a + y, "Depth")(acc, x)
    assert total.axes == ("Height", "Width")
    np.testing.assert_allclose(total.array, jnp.sum(x.array, axis=2), rtol=1e-6)


@translates("test_fold_static_args")
def test_fold_static_args():
    def fold_fun(acc, x, static1, *, static2):
        assert static1 is True
        assert static2 is False
        return acc + x

    x = named1()
    acc = accy.named(np.zeros((HEIGHT, WIDTH), np.float32), ("Height", "Width"), R)
    total = fold(functools.partial(fold_fun, static1=True, static2=False), "Depth")(acc, x)
    np.testing.assert_allclose(total.array, jnp.sum(x.array, axis=2), rtol=1e-6)


@translates("test_fold_doesnt_reduce_scalars")
def test_fold_doesnt_reduce_scalars():
    x = uniform(("Height", HEIGHT))
    acc = accy.named(np.zeros(HEIGHT, np.float32), "Height", R)
    total = fold(lambda a, y: a + 4.0 * y, "Height")(acc, x)
    np.testing.assert_allclose(total.array, np.full(HEIGHT, jnp.sum(x.array * 4.0)), rtol=1e-6)


@translates("test_vmap_unmapped_args")
def test_vmap_unmapped_args():
    """hax.vmap(f, Axis("Batch", 10)) on an argument without Batch: the extent is size=."""
    x = uniform(("Width", WIDTH), ("Depth", DEPTH))
    selected = accy.vmap(lambda v: v["Width", 2], "Batch", size=BATCH)(x)
    expected = jnp.array([jnp.take(x.array, 2, axis=0) for _ in range(BATCH)])
    assert selected.axes == ("Batch", "Depth")
    np.testing.assert_array_equal(selected.array, expected)


@dataclasses.dataclass
class Foo:
    field: accy.NamedArray
    flag: bool = False


@translates("test_vmap_non_static_bool_fields")
def test_vmap_non_static_bool_fields():
    """A vmapped constructor: the array field gains Batch. Haliax keeps `flag` a Python True
    (a non-array leaf); accy's transformed functions return arrays, so it is a bool array of
    True per example."""
    x = uniform(("Width", WIDTH), ("Depth", DEPTH))
    foo = accy.vmap(lambda: Foo(x, True), "Batch", size=BATCH)()
    assert foo.field.axes == ("Batch", "Width", "Depth")
    assert foo.flag.axes == ("Batch",) and foo.flag.array.all()


@translates("test_vmap_mapped_args")
def test_vmap_mapped_args():
    x = uniform(("Batch", BATCH), ("Width", WIDTH), ("Depth", DEPTH))
    selected = accy.vmap(lambda v: v.sum("Width"), "Batch")(x)
    assert selected.axes == ("Batch", "Depth")
    np.testing.assert_allclose(selected.array, jnp.sum(x.array, axis=1), rtol=1e-6)


@translates("test_vmap_str_args")
def test_vmap_returning_a_non_haliax_array():
    """The axis named by a string, then a function that returns a bare array: in accy a
    traced value has no array to return, and the error says so."""
    x = uniform(("Batch", BATCH), ("Width", WIDTH), ("Depth", DEPTH))
    selected = accy.vmap(lambda v: v.sum("Width"), "Batch")(x)
    expected = jnp.array([jnp.sum(x.array[i], axis=0) for i in range(BATCH)])
    assert selected.axes == ("Batch", "Depth")
    np.testing.assert_allclose(selected.array, expected, rtol=1e-6)
    with pytest.raises(accy.AccyError, match="traced value has no data"):
        accy.vmap(lambda v: v.sum("Width").array, "Batch")(x)


@translates("test_vmap_mapped_kwarg")
def test_vmap_mapped_kwarg():
    x = uniform(("Batch", BATCH), ("Width", WIDTH), ("Depth", DEPTH))
    selected = accy.vmap(lambda x: x.sum("Width"), "Batch")(x=x)
    assert selected.axes == ("Batch", "Depth")
    np.testing.assert_allclose(selected.array, jnp.sum(x.array, axis=1), rtol=1e-6)


@translates("test_vmap_static_args")
def test_vmap_static_args():
    x = uniform(("Batch", BATCH), ("Width", WIDTH), ("Depth", DEPTH))
    selected = accy.vmap(lambda x, y: x.sum("Width") if y else x, "Batch")(x, True)
    expected = x.sum("Width")
    assert selected.axes == expected.axes
    np.testing.assert_array_equal(selected.array, expected.array)


@dataclasses.dataclass
class Summer:
    """A module holding an axis name; Haliax's test forgets to mark it static."""

    field: str

    def __call__(self, x):
        return x.sum(self.field)


@translates("test_vmap_error_for_incorrectly_specified_args")
def test_vmap_error_for_incorrectly_specified_args():
    """hax.vmap(lambda a: Module(a), Batch)(Width): a module built from an axis name (a Python
    value, not marked static) comes back unchanged, as in Haliax; with something mapped, the
    module's axis name reaches every example."""
    made = accy.vmap(lambda a: Summer(a), "Batch", size=BATCH)("Width")
    assert made == Summer("Width")

    x = uniform(("Batch", BATCH), ("Width", WIDTH), ("Depth", DEPTH))
    out = accy.vmap(lambda m, x: m(x), "Batch")(Summer("Width"), x)
    np.testing.assert_allclose(out.array, jnp.sum(x.array, axis=1), rtol=1e-6)


@pytest.mark.slow
@translates("test_vmap_multiple_axes")
def test_vmap_multiple_axes():
    x = uniform(("Batch1", 4), ("Batch2", 3), ("Width", 2), ("Depth", 5))
    selected = accy.vmap(lambda v: v.sum("Width"), ("Batch1", "Batch2"))(x)
    assert selected.axes == ("Batch1", "Batch2", "Depth")
    np.testing.assert_allclose(selected.array, jnp.sum(x.array, axis=2), rtol=1e-6)


@translates("test_scan_reports_mismatched_unnamed_array")
def test_scan_reports_mismatched_unnamed_array():
    """hax.scan(f, Height)(0, good, y=bad): accy's scan takes one xs tree, and the error names
    the path of the leaf whose extent differs."""
    good = accy.named(np.zeros((2, 3), np.float32), ("Height", "w"), R)
    bad = accy.named(np.zeros((1, 3), np.float32), ("Height", "w"), R)
    with pytest.raises(accy.AxisError, match=r"disagree: xs\[0\]: 2, xs\[1\]\['y'\]: 1"):
        accy.scan(lambda c, xs: (c, xs[0] + xs[1]["y"]), 0.0, (good, {"y": bad}), axis="Height")


@dataclasses.dataclass
class ArrayHolder:
    my_array: accy.NamedArray


@translates("test_scan_reports_eqx_module_field_path")
def test_scan_reports_eqx_module_field_path():
    foo = ArrayHolder(accy.named(np.zeros((1, 3), np.float32), ("Height", "w"), R))
    with pytest.raises(accy.AxisError, match=r"xs\['my_array'\]: 1, length=2"):
        accy.scan(lambda c, foo: (c, foo.my_array), 0.0, foo, axis="Height", length=2)
