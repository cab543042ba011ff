"""Control flow in the front end: closures in bodies and branches, the one value type, and
`accy.scan`/`cond`/`switch`/`while_loop`/`fori_loop`/`map` over trees, eager and traced.

Expected values come from NumPy on the same inputs (and JAX, in tests/peers)."""

import numpy as np

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
