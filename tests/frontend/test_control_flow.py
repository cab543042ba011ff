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
