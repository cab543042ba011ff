"""Donation on CUDA (`accy.compile(..., device="cuda", donate=)`, `accy.jit(donate_argnums=)`):
outputs written into the donated CuPy arrays' memory (the returned array IS the donated one, at
its address), results equal to the same program without donation and to NumPy, the graph not
recaptured for donated pointers, and every refused donation, refused before anything runs.
Skipped without a GPU, the skip naming the closed gate. The plan-side rule the CUDA backend
shares with the CPU (`donation_aliases` on the plan made for CUDA) is checked without a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.backends.cuda.compile import compile_program
from accy.lower.buffers import donation_aliases

from ..executors import cuda_device_or_skip

T = spec(f32, a=3, b=4)
RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def cupy():
    cuda_device_or_skip()
    import cupy

    return cupy


def _adam(b, args):
    p, m, v, g = args
    m2 = m * 0.9 + g * 0.1
    v2 = v * 0.95 + g * g * 0.05
    p2 = p - (m2 / ((v2 + 1e-8).sqrt())) * 0.01 - p * 0.001
    return p2, m2, v2, (g * g).sum()


ADAM = accy.trace.define("adam", [T] * 4, _adam)


def _host_arrays(n, shape=(3, 4)):
    return [RNG.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _numpy_adam(p, m, v, g):
    m2 = m * 0.9 + g * 0.1
    v2 = v * 0.95 + g * g * 0.05
    return p - m2 / np.sqrt(v2 + 1e-8) * 0.01 - p * 0.001, m2, v2, (g * g).sum()


def test_the_plan_made_for_cuda_lets_adams_outputs_take_the_donated_state():
    # No GPU needed: the CUDA backend decides by the rule the CPU uses, on its own plan.
    plan = compile_program(ADAM).plan
    assert donation_aliases(plan, (0, 1, 2)) == {0: 0, 1: 1, 2: 2}
    assert donation_aliases(plan, (3,)) == {}  # g is read by the later sum: it cannot


def test_an_adam_update_is_written_into_the_donated_device_memory(cupy):
    p, m, v, g = _host_arrays(4)
    v = np.abs(v)  # a second moment: its square root is taken
    plain = accy.compile(ADAM, device="cuda")
    expected = [cupy.asnumpy(o) for o in plain(*(cupy.asarray(a) for a in (p, m, v, g)))]
    update = accy.compile(ADAM, device="cuda", donate=(0, 1, 2))
    assert update.aliases == {0: 0, 1: 1, 2: 2}
    donated = [cupy.asarray(a) for a in (p, m, v)]
    addresses = [a.data.ptr for a in donated]
    outputs = update(*donated, cupy.asarray(g))
    for out, array, address in zip(outputs, donated, addresses, strict=False):
        assert out is array and out.data.ptr == address  # the donated memory, not a copy
    assert outputs[3].data.ptr not in addresses  # the sum has no donated input to take
    for got, want, numpy_value in zip(outputs, expected, _numpy_adam(p, m, v, g), strict=True):
        np.testing.assert_array_equal(cupy.asnumpy(got), want)
        np.testing.assert_allclose(cupy.asnumpy(got), numpy_value, rtol=1e-5, atol=1e-6)


def test_repeated_donating_calls_reuse_the_graph_and_stay_right(cupy):
    # Ten steps updating the same memory, against ten steps in NumPy; between them, calls of
    # the same executable without donation on other arrays. The two slots' graphs are captured
    # once each: a donated address is a pointer-pool entry like any other.
    update = accy.compile(ADAM, device="cuda", donate=(0, 1, 2))
    p, m, v = (np.zeros((3, 4), np.float32) + 0.5 for _ in range(3))
    state = [cupy.asarray(a) for a in (p, m, v)]
    addresses = [a.data.ptr for a in state]
    expected = [p, m, v]
    fragment = update.executable.fragment
    graphs = None
    for step in range(10):
        g = _host_arrays(1)[0]
        *state, _ = update(*state, cupy.asarray(g))
        expected = list(_numpy_adam(*expected, g)[:3])
        update.executable(*(cupy.asarray(a) for a in _host_arrays(4)))  # not donated
        if step == 1:
            graphs = [dict(slot.graphs) for slot in fragment._slots]
    assert [a.data.ptr for a in state] == addresses
    assert [dict(slot.graphs) for slot in fragment._slots] == graphs  # no recapture
    assert all(graphs)  # each slot captured (the plan-order graph only if donation needed it)
    for got, want in zip(state, expected, strict=True):
        np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name, body, aliased",
    [
        ("both", lambda b, a: (a[0] + 1.0, a[0] * 2.0), True),
        ("later", lambda b, a: (a[0] + 1.0, (a[0] * a[1]).sum()), False),
        ("transposed", lambda b, a: (_transposed(a[0]) + 1.0,), False),
    ],
)
def test_donation_on_cuda_aliases_only_where_reading_cannot_see_the_writes(
    cupy, name, body, aliased
):
    square = spec(f32, a=4, b=4)
    program = accy.trace.define(name, [square, square], body)
    x, y = _host_arrays(2, (4, 4))
    expected = accy.reference.run(program, [x, y])
    update = accy.compile(program, device="cuda", donate=(0,))
    assert (0 in update.aliases) == aliased
    outputs = update(cupy.asarray(x), cupy.asarray(y))
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(cupy.asnumpy(got), np.asarray(want), rtol=1e-6)


def _transposed(x):
    swapped = x.rename("a", "t").rename("b", "a").rename("t", "b")  # axes (b, a), values x.T
    return swapped.transpose("a", "b")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda cp: cp.zeros((6, 4), cp.float32)[:3], "a view of another array"),
        (lambda cp: cp.zeros((4, 3), cp.float32).T, "not C-contiguous"),
        (lambda cp: cp.zeros((3, 4), cp.float64), r"of dtype float32 .* got a float64\[3, 4\]"),
        (lambda cp: cp.zeros((4, 3), cp.float32), r"shape \(3, 4\) .* got a float32\[4, 3\]"),
        (lambda cp: np.zeros((3, 4), np.float32), "NumPy array \\(host memory\\)"),
        (lambda cp: [[0.0] * 4] * 3, "CuPy array on the device .* got a list"),
    ],
)
def test_a_donated_argument_that_cannot_be_overwritten_is_refused(cupy, make, message):
    update = accy.compile(ADAM, device="cuda", donate=(1,))
    p, v, g = (cupy.asarray(a) for a in _host_arrays(3))
    kept = cupy.asnumpy(p)
    with pytest.raises(accy.DonationError, match=message):
        update(p, make(cupy), v, g)
    np.testing.assert_array_equal(cupy.asnumpy(p), kept)  # nothing ran


def test_arguments_passed_again_are_trusted_only_where_they_are_the_same_arrays(cupy):
    """A call that passes back last call's arrays skips their checks; a different array in a
    donated position is checked again (and refused), and one array in two places is refused
    even after both were accepted apart."""
    update = accy.compile(ADAM, device="cuda", donate=(0, 1))
    host = _host_arrays(4)
    host[2] = np.abs(host[2])  # a second moment
    p, m, v, g = (cupy.asarray(a) for a in host)
    for _ in range(3):  # p and m updated in place and passed back as themselves
        outputs = update(p, m, v, g)
        host[:2] = _numpy_adam(*host)[:2]
    assert outputs[0] is p and outputs[1] is m
    for got, expected in zip((p, m), host[:2], strict=True):
        np.testing.assert_allclose(cupy.asnumpy(got), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(accy.DonationError, match="a view of another array"):
        update(p, cupy.zeros((6, 4), cupy.float32)[:3], v, g)
    with pytest.raises(accy.DonationError, match="input 0 is donated, but its memory is also"):
        update(p, p, v, g)


def test_an_array_donated_twice_or_also_passed_undonated_is_refused_before_anything_runs(cupy):
    m, v, g = (cupy.asarray(a) for a in _host_arrays(3))
    kept = cupy.asnumpy(m)
    with pytest.raises(accy.DonationError, match="input 0 is donated, but its memory is also"):
        accy.compile(ADAM, device="cuda", donate=(0, 1))(m, m, v, g)
    with pytest.raises(accy.DonationError, match="input 1 is donated, but .* also input 3's"):
        accy.compile(ADAM, device="cuda", donate=(1,))(v, m, v.copy(), m)
    np.testing.assert_array_equal(cupy.asnumpy(m), kept)
    with pytest.raises(accy.DonationError, match=r"names input 4, but its inputs are 0..3"):
        accy.compile(ADAM, device="cuda", donate=(4,))


def test_jit_donate_argnums_on_cuda_updates_a_tree_in_place(cupy):
    def sgd(params, grads):
        return {k: params[k] - grads[k] * 0.5 for k in params}

    step = accy.jit(sgd, donate_argnums=0)
    names = ("w", "b")
    params = {n: accy.named(np.ones((3, 2), np.float32), ("i", "o"), device="cuda") for n in names}
    grads = {
        n: accy.named(np.full((3, 2), 2.0, np.float32), ("i", "o"), device="cuda") for n in names
    }
    before = {n: params[n].array for n in names}
    new = step(params, grads)
    for n in names:
        assert new[n].array is before[n]
        np.testing.assert_array_equal(cupy.asnumpy(new[n].array), np.zeros((3, 2), np.float32))
    # Documented: a donated argument is invalid after the call; its array now holds the output.
    np.testing.assert_array_equal(np.asarray(params["w"]), np.zeros((3, 2), np.float32))
    newer = step(new, grads)  # the fast path (the cached program) donates as well
    assert newer["w"].array is before["w"]
    assert float(cupy.asnumpy(newer["w"].array)[0, 0]) == -1.0


def test_the_gpt2_training_step_on_cuda_donates_and_matches_the_step_without(cupy):
    from accy.frontend.tracing import flatten, unflatten
    from bench import gpt2

    s = gpt2.SCALES["check"]
    step = gpt2.accy_step(s, "cuda")
    params, state, ids, targets = gpt2.accy_inputs(s, "cuda")
    leaves, treedef = flatten((params, state))
    copies = unflatten(treedef, [accy.named(a.array.copy(), a.axes, device="cuda") for a in leaves])
    addresses = [a.array.data.ptr for a in leaves]
    loss, new_params, new_state = step(params, state, ids, targets)
    new_leaves, _ = flatten((new_params, new_state))
    assert [a.array.data.ptr for a in new_leaves] == addresses  # every one updated in place
    plain = accy.jit(step.fn)  # the same step, nothing donated
    loss_again, expected, expected_state = plain(*copies, ids, targets)
    np.testing.assert_allclose(float(loss.array), float(loss_again.array), rtol=1e-6)
    want, _ = flatten((expected, expected_state))
    for got, value in zip(new_leaves, want, strict=True):
        np.testing.assert_allclose(
            cupy.asnumpy(got.array), cupy.asnumpy(value.array), rtol=1e-5, atol=1e-6
        )
    assert abs(float(loss.array) - math.log(s.vocab)) < 0.1
