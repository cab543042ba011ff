"""Collectives: evaluation on simulated meshes of 1, 2, 4 and 8 devices against NumPy, type
errors, JVP and transpose against finite differences, batching, the text form."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, f64, spec
from accy.core.text import parse
from accy.errors import AccyError, AxisError, DTypeError, MeshError, TypeRuleError
from accy.mesh import Mesh, run
from accy.transforms.batch import batch

SIZES = (1, 2, 4, 8)


def collective(kind: str, size: int, **attrs):
    """A one-operation program: `kind` over mesh axis "data" of `size` devices, on f64[n, m]."""
    attrs = {"mesh_axis": "data", "size": size, **attrs}
    t = spec(f64, n=4 * size, m=2 * size)
    return accy.trace.define(kind, [t], lambda b, a: b.emit(kind, [a[0]], attrs))


def device_inputs(program, devices: int, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        [rng.standard_normal(t.extents) for t in program.parameter_types] for _ in range(devices)
    ]


def expected(kind: str, xs: list[np.ndarray], rank: int, **attrs) -> np.ndarray:
    """Each collective worked out with plain NumPy over every device's operand."""
    size = len(xs)
    if kind == "psum":
        return sum(xs)
    if kind == "all_gather":
        return np.concatenate(xs, axis=0)
    if kind == "reduce_scatter":
        return np.split(sum(xs), size, axis=0)[rank]
    if kind == "all_to_all":  # split "n" (axis 0), concatenate along "m" (axis 1)
        return np.concatenate([np.split(x, size, axis=0)[rank] for x in xs], axis=1)
    if kind == "ppermute":  # a shift by one
        return xs[(rank - 1) % size]
    raise AssertionError(kind)


CASES = {
    "psum": {},
    "all_gather": {"axis": "n"},
    "reduce_scatter": {"axis": "n"},
    "all_to_all": {"split_axis": "n", "concat_axis": "m"},
    "ppermute": {},
}


def attrs_for(kind: str, size: int) -> dict:
    if kind == "ppermute":
        return {"perm": tuple((i, (i + 1) % size) for i in range(size))}
    return CASES[kind]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", sorted(CASES))
def test_collective_on_simulated_mesh(kind, size):
    program = collective(kind, size, **attrs_for(kind, size))
    inputs = device_inputs(program, size)
    outputs = run(program, Mesh(range(size), "data"), inputs)
    xs = [x[0] for x in inputs]
    for rank in range(size):
        np.testing.assert_allclose(outputs[rank][0], expected(kind, xs, rank), rtol=1e-12)


def test_collectives_on_a_two_axis_mesh_meet_within_their_group():
    mesh = Mesh(np.arange(8).reshape(2, 4), ("data", "model"))
    program = accy.trace.define(
        "two",
        [spec(f64, n=3)],
        lambda b, a: [
            b.emit("psum", [a[0]], {"mesh_axis": "model", "size": 4}),
            b.emit("axis_index", [], {"mesh_axis": "data", "size": 2}),
        ],
    )
    inputs = [[np.full(3, float(rank))] for rank in range(8)]
    outputs = run(program, mesh, inputs)
    for rank in range(8):
        group = mesh.group(rank, "model")  # same "data" position
        np.testing.assert_allclose(outputs[rank][0], np.full(3, float(sum(group))))
        assert outputs[rank][1] == mesh.coordinates(rank)["data"]


def test_axis_index_and_ppermute_with_missing_receivers():
    program = accy.trace.define(
        "shift",
        [spec(f32, n=2)],
        lambda b, a: [
            b.emit("ppermute", [a[0]], {"mesh_axis": "d", "size": 3, "perm": ((0, 1),)}),
            b.emit("axis_index", [], {"mesh_axis": "d", "size": 3}),
        ],
    )
    inputs = [[np.full(2, r + 1.0, np.float32)] for r in range(3)]
    outputs = run(program, Mesh(["a", "b", "c"], "d"), inputs)
    assert [o[0].tolist() for o in outputs] == [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    assert [int(o[1]) for o in outputs] == [0, 1, 2]


def test_type_rules_and_their_errors():
    x = spec(f32, n=6)
    assert str(collective("all_gather", 2, axis="n").output_types[0]) == "f64[n=16, m=4]"
    with pytest.raises(AxisError, match="cannot split evenly"):
        accy.trace.define(
            "rs",
            [x],
            lambda b, a: b.emit(
                "reduce_scatter", [a[0]], {"mesh_axis": "d", "size": 4, "axis": "n"}
            ),
        )
    with pytest.raises(AxisError, match="axis 'k' is not on"):
        accy.trace.define(
            "ag",
            [x],
            lambda b, a: b.emit("all_gather", [a[0]], {"mesh_axis": "d", "size": 2, "axis": "k"}),
        )
    with pytest.raises(TypeRuleError, match="names a destination twice"):
        perm = ((0, 1), (1, 1))
        accy.trace.define(
            "pp",
            [x],
            lambda b, a: b.emit("ppermute", [a[0]], {"mesh_axis": "d", "size": 2, "perm": perm}),
        )
    with pytest.raises(TypeRuleError, match="size"):
        accy.trace.define(
            "ps", [x], lambda b, a: b.emit("psum", [a[0]], {"mesh_axis": "d", "size": 0})
        )
    with pytest.raises(DTypeError, match="bool"):
        accy.trace.define(
            "pb",
            [spec(accy.bool_, n=2)],
            lambda b, a: b.emit("psum", [a[0]], {"mesh_axis": "d", "size": 2}),
        )


def test_plain_evaluator_runs_one_device_axes_only():
    one = collective("psum", 1)
    x = np.ones((4, 2))
    np.testing.assert_array_equal(accy.reference.run(one, [x])[0], x)
    with pytest.raises(AccyError, match="needs every device's program"):
        accy.reference.run(collective("psum", 2), [np.ones((8, 4))])


def test_mesh_that_does_not_fit_the_program_is_refused():
    program = collective("psum", 4)
    with pytest.raises(MeshError, match="made for 4 devices"):
        run(program, Mesh(range(2), "data"), device_inputs(program, 2))
    with pytest.raises(MeshError, match="mesh axis 'data' is not on the mesh"):
        run(program, Mesh(range(4), "model"), device_inputs(program, 4))
    with pytest.raises(MeshError, match="2 input lists"):
        run(program, Mesh(range(4), "data"), device_inputs(program, 2))


def test_devices_that_diverge_are_an_error_not_a_hang():
    def body(b, a):
        rank = b.emit("axis_index", [], {"mesh_axis": "d", "size": 2})
        first = b.compare("eq", rank, b.scalar(accy.i32, 0))

        def talk(bb, args):
            return bb.emit("psum", [args[0]], {"mesh_axis": "d", "size": 2})

        return b.cond(first, talk, lambda bb, args: args[0], [a[0]])

    program = accy.trace.define("diverge", [spec(f32, n=2)], body)
    with pytest.raises(MeshError, match="diverged"):
        run(program, Mesh(range(2), "d"), [[np.ones(2, np.float32)]] * 2)


def test_text_form_round_trips():
    for kind in sorted(CASES):
        program = collective(kind, 4, **attrs_for(kind, 4))
        assert parse(str(program)) == program


def global_value(program, devices, inputs):
    """sum over devices of sum(weights_d * output_d): a scalar of every device's inputs."""
    outputs = run(program, Mesh(range(devices), "data"), inputs)
    return sum(float(np.sum(o[0])) for o in outputs)


@pytest.mark.parametrize("size", (1, 2, 4))
@pytest.mark.parametrize("kind", sorted(CASES))
def test_transpose_against_finite_differences(kind, size):
    """The per-device gradient program (collectives transposed) gives the gradient of the sum
    over devices of every device's loss, each device's input a variable of its own."""
    attrs = {"mesh_axis": "data", "size": size, **attrs_for(kind, size)}
    t = spec(f64, n=4 * size, m=2 * size)

    def loss(b, a):
        y = b.emit(kind, [a[0]], attrs)
        return (y * y.sin()).sum()

    program = accy.trace.define("loss", [t], loss)
    gradient = accy.gradient.grad(program)
    inputs = device_inputs(program, size, seed=1)
    grads = [g[0] for g in run(gradient, Mesh(range(size), "data"), inputs)]
    rng = np.random.default_rng(2)
    direction = [rng.standard_normal(t.extents) for _ in range(size)]
    eps = 1e-6
    plus = [[x[0] + eps * d] for x, d in zip(inputs, direction, strict=True)]
    minus = [[x[0] - eps * d] for x, d in zip(inputs, direction, strict=True)]
    numeric = (global_value(program, size, plus) - global_value(program, size, minus)) / (2 * eps)
    analytic = sum(float(np.sum(g * d)) for g, d in zip(grads, direction, strict=True))
    assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_jvp_against_finite_differences(kind):
    size = 4
    program = collective(kind, size, **attrs_for(kind, size))
    forward = accy.gradient.jvp(program)
    inputs = device_inputs(program, size, seed=3)
    directions = device_inputs(program, size, seed=4)
    mesh = Mesh(range(size), "data")
    tangents = run(forward, mesh, [x + d for x, d in zip(inputs, directions, strict=True)])
    eps = 1e-6
    shifted = [[x[0] + eps * d[0]] for x, d in zip(inputs, directions, strict=True)]
    base, moved = run(program, mesh, inputs), run(program, mesh, shifted)
    for rank in range(size):
        numeric = (moved[rank][0] - base[rank][0]) / eps
        np.testing.assert_allclose(tangents[rank][1], numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_batching_maps_each_example(kind):
    """vmap of a collective equals the collective of each example."""
    size = 2
    program = collective(kind, size, **attrs_for(kind, size))
    mapped = batch(program, "example", 3, [True])
    rng = np.random.default_rng(5)
    inputs = [[rng.standard_normal((3, 8, 4))] for _ in range(size)]
    mesh = Mesh(range(size), "data")
    outputs = run(mapped, mesh, inputs)
    for example in range(3):
        one = run(program, mesh, [[x[0][example]] for x in inputs])
        for rank in range(size):
            np.testing.assert_allclose(outputs[rank][0][example], one[rank][0])
