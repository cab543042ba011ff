"""Layout order is physical, never meaning: permuting the axes of the inputs (and transposing the
NumPy inputs to match) must not change any named result."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accy

from .core_helpers import evaluate, in_axis_order, random_array

f64, i32 = accy.f64, accy.i32
spec = accy.spec


@dataclass(frozen=True)
class NamedProgram:
    specs: tuple[accy.TensorType, ...]
    body: object
    index_bounds: tuple[int, int] = (0, 4)  # for integer inputs (gather/scatter indices)


def _softmax(b, a):
    (x,) = a
    e = (x - x.max("k")).exp()
    return e / e.sum("k")


def _scan_decay(b, a):
    (xs,) = a
    carries, ys = b.scan(
        lambda bb, args: (args[0] * 0.5 + args[1], args[0] - args[1]),
        carries=[b.zeros(xs.ty.without(["t"]))],
        xs=[xs],
        axis="t",
    )
    return carries + ys


PROGRAMS = {
    "broadcast": NamedProgram(
        (spec(f64, a=2, b=3), spec(f64, b=3, c=4)), lambda b, a: a[0] * a[1] + 1.0
    ),
    "contract": NamedProgram(
        (spec(f64, a=2, b=3, k=4), spec(f64, k=4, b=3, c=2)),
        lambda b, a: a[0].contract(a[1], "k"),
    ),
    "reductions": NamedProgram(
        (spec(f64, a=2, b=3, c=4),), lambda b, a: a[0].max("b") - a[0].mean("c")
    ),
    "softmax": NamedProgram((spec(f64, t=3, k=5),), _softmax),
    "gather": NamedProgram(
        (spec(f64, v=5, c=3), spec(i32, t=2, s=3)),
        lambda b, a: a[0].gather(a[1], "v"),
        (-1, 6),
    ),
    "scatter_add": NamedProgram(
        (spec(f64, v=4, c=3), spec(i32, t=5), spec(f64, t=5, c=3)),
        lambda b, a: a[0].scatter_add(a[1], a[2], "v"),
    ),
    "concatenate": NamedProgram(
        (spec(f64, a=2, b=3), spec(f64, a=1, b=3)),
        lambda b, a: b.concatenate([a[0], a[1]], "a"),
    ),
    "slice_pad": NamedProgram(
        (spec(f64, a=2, b=4),),
        lambda b, a: a[0].slice("b", 1, 4, 2).pad("a", low=1, high=0, value=-1.0, interior=1),
    ),
    "select": NamedProgram(
        (spec(f64, a=3, b=2), spec(f64, b=2, c=2)),
        lambda b, a: b.select(a[0] > a[1], a[0], a[1] * 2.0),
    ),
    "merge_split": NamedProgram(
        (spec(f64, a=2, b=3, c=2),),
        lambda b, a: a[0].merge(["b", "a"], "ba").split("ba", hi=3, lo=2),
    ),
    "scan": NamedProgram((spec(f64, t=4, c=3, d=2),), _scan_decay),
}


def _inputs(program: NamedProgram, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        random_array(rng, t, *(program.index_bounds if t.dtype == i32 else (None, None)))
        for t in program.specs
    ]


def _named_results(specs, body, inputs) -> list[tuple[tuple, np.ndarray]]:
    """Outputs as (sorted named extents, array laid out in sorted axis order)."""
    program = accy.trace.define("layout", list(specs), body)
    results = []
    for t, array in zip(program.output_types, evaluate(program, *inputs), strict=True):
        order = sorted(t.axes)
        results.append((tuple(sorted(t.named_extents)), in_axis_order(array, t.axes, order)))
    return results


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_permuting_input_layouts_does_not_change_named_results(name, data):
    program = PROGRAMS[name]
    canonical_inputs = _inputs(program, seed=len(name))
    expected = _named_results(program.specs, program.body, canonical_inputs)

    specs, inputs = [], []
    for t, array in zip(program.specs, canonical_inputs, strict=True):
        order = data.draw(st.permutations(t.axes), label=f"layout of {t}")
        specs.append(t.with_axes((axis, t.extent(axis)) for axis in order))
        inputs.append(in_axis_order(array, t.axes, order))
    actual = _named_results(specs, program.body, inputs)

    assert len(actual) == len(expected)
    for (got_type, got), (want_type, want) in zip(actual, expected, strict=True):
        assert got_type == want_type
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
