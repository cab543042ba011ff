"""Donation on the cpu: outputs written into donated inputs' arrays (results checked against the
same program without donation and NumPy), what is refused, and `accy.jit(donate_argnums=)`."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.lower import build_plan
from accy.lower.buffers import donation_aliases

T = spec(f32, a=3, b=4)
RNG = np.random.default_rng(5)


def _arrays(n, shape=(3, 4)):
    return [RNG.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _adam(b, args):
    p, m, v, g = args
    m2 = m * 0.9 + g * 0.1
    v2 = v * 0.95 + g * g * 0.05
    p2 = p - (m2 / ((v2 + 1e-8).sqrt())) * 0.01 - p * 0.001
    return p2, m2, v2, (g * g).sum()


ADAM = accy.trace.define("adam", [T] * 4, _adam)


def test_an_adam_update_overwrites_its_donated_state_in_place():
    p, m, v, g = _arrays(4)
    expected = [np.asarray(o).copy() for o in accy.compile(ADAM, device="cpu")(p, m, v, g)]
    update = accy.compile(ADAM, device="cpu", donate=(0, 1, 2))
    assert update.aliases == {0: 0, 1: 1, 2: 2}
    donated = [p.copy(), m.copy(), v.copy()]
    outputs = update(*donated, g)
    assert all(out is arr for out, arr in zip(outputs, donated, strict=False))  # memory reused
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    m2 = m * 0.9 + g * 0.1  # and NumPy agrees
    np.testing.assert_allclose(outputs[1], m2, rtol=1e-6)


@pytest.mark.parametrize(
    "name, body, aliased",
    [
        # each element of p read before its own element is stored: in place
        ("both", lambda b, a: (a[0] + 1.0, a[0] * 2.0), True),
        # p read again by a later step (a reduction): the output cannot take its memory early
        ("later", lambda b, a: (a[0] + 1.0, (a[0] * a[1]).sum()), None),
        # a transposed read: element (i, j) is stored over (j, i) before that one is read
        ("transposed", lambda b, a: (_transposed(a[0]) + 1.0,), False),
    ],
)
def test_donation_aliases_only_where_reading_cannot_see_the_writes(name, body, aliased):
    square = spec(f32, a=4, b=4)
    program = accy.trace.define(name, [square, square], body)
    x, y = _arrays(2, (4, 4))
    expected = [np.asarray(o).copy() for o in accy.reference.run(program, [x, y])]
    update = accy.compile(program, device="cpu", donate=(0,))
    if aliased is not None:
        assert (0 in update.aliases) == aliased
    outputs = update(x.copy(), y)
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _transposed(x):
    swapped = x.rename("a", "t").rename("b", "a").rename("t", "b")  # axes (b, a), values x.T
    return swapped.transpose("a", "b")


def test_an_update_takes_its_own_donated_input_before_an_earlier_output_of_its_type():
    # (loss, count + 1): the loss, a scalar like the count and first among the outputs, is
    # written after the count's last read, so it could take the count's buffer; then the new
    # count would need a new buffer on every call (and a loop feeding it back would pass a new
    # address each time). The update in place is matched first.
    def counted(b, a):
        count = a[0] + 1.0
        return (a[1] * a[1]).sum() + count, count  # the loss reads the new count: it comes after

    program = accy.trace.define("counted", [spec(f32), T], counted)
    plan = build_plan(program)
    count_step = next(i for i, s in enumerate(plan.steps) if program.parameters[0] in s.reads)
    loss_step = next(i for i, s in enumerate(plan.steps) if program.outputs[0] in s.writes)
    assert count_step < loss_step  # so the loss alone could have taken the count's buffer
    assert donation_aliases(plan, [0]) == {1: 0}
    count, x = np.float32(3.0), _arrays(1)[0]
    loss, new_count = accy.compile(program, device="cpu", donate=(0,))(np.array(count), x)
    np.testing.assert_allclose(loss, (x * x).sum() + 4.0, rtol=1e-5)
    assert float(new_count) == 4.0


def test_an_output_of_another_type_does_not_take_the_donated_memory():
    program = accy.trace.define("sum", [T], lambda b, a: a[0].sum("b"))
    assert donation_aliases(build_plan(program), [0]) == {}
    (x,) = _arrays(1)
    (out,) = accy.compile(program, device="cpu", donate=(0,))(x.copy())
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-6)


@pytest.mark.parametrize(
    "argument, message",
    [
        ([[0.0] * 4] * 3, "must be a writable, C-contiguous NumPy array .* got a list"),
        (np.zeros((3, 4), np.float64), "of dtype float32 .* got a float64"),
        (np.zeros((4, 3), np.float32).T, "not C-contiguous"),
        (np.zeros((6, 4), np.float32)[:3], "a view of another array"),
    ],
)
def test_a_donated_argument_that_cannot_be_overwritten_is_refused(argument, message):
    update = accy.compile(ADAM, device="cpu", donate=(0,))
    with pytest.raises(accy.DonationError, match=message):
        update(argument, *_arrays(3))


def test_read_only_twice_donated_and_unknown_donations_are_refused():
    read_only = np.zeros((3, 4), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(accy.DonationError, match="read-only"):
        accy.compile(ADAM, device="cpu", donate=(0,))(read_only, *_arrays(3))
    shared = np.zeros((3, 4), np.float32)
    with pytest.raises(accy.DonationError, match="input 0 is donated, but its memory is also"):
        accy.compile(ADAM, device="cpu", donate=(0, 1))(shared, shared, *_arrays(2))
    with pytest.raises(accy.DonationError, match=r"names input 7, but its inputs are 0..3"):
        accy.compile(ADAM, device="cpu", donate=(7,))
    with pytest.raises(accy.DonationError, match="implemented on the cpu and cuda devices"):
        accy.compile(ADAM, device="reference", donate=(0,))


def test_a_donated_array_also_passed_undonated_is_refused_before_anything_runs():
    # Donating p while the gradient argument is p itself would write p's update over the
    # gradient the same loop reads: refused, and p keeps its values.
    p, m, v = _arrays(3)
    kept = p.copy()
    with pytest.raises(
        accy.DonationError, match="input 0 is donated, but its memory is also input 3"
    ):
        accy.compile(ADAM, device="cpu", donate=(0,))(p, m, v, p)
    np.testing.assert_array_equal(p, kept)
    donated = np.zeros((3, 4), np.float32)  # another argument a view of the donated array
    with pytest.raises(
        accy.DonationError, match="input 1 is donated, but its memory is also input 0"
    ):
        accy.compile(ADAM, device="cpu", donate=(1,))(donated.view(), donated, *_arrays(2))


def test_jit_donate_argnums_updates_a_tree_of_parameters_in_place():
    def sgd(params, grads):
        return {k: params[k] - grads[k] * 0.5 for k in params}

    step = accy.jit(sgd, donate_argnums=0)
    names = ("w", "b")
    params = {n: accy.named(np.ones((3, 2), np.float32), ("i", "o")) for n in names}
    grads = {n: accy.named(np.full((3, 2), 2.0, np.float32), ("i", "o")) for n in names}
    before = {n: params[n].array for n in names}
    new = step(params, grads)
    for n in names:
        assert new[n].array is before[n]
        np.testing.assert_array_equal(new[n].array, np.zeros((3, 2), np.float32))
    newer = step(new, grads)  # the fast path (cached program) donates as well
    assert newer["w"].array is before["w"] and float(newer["w"].array[0, 0]) == -1.0


def test_jit_returns_the_donated_named_arrays_of_a_tree_it_wrote_into():
    # An output written into a donated argument's array, of its type, is that argument's
    # NamedArray; an output of another type, or not donated, is a new one.
    def step(params, scale):
        updated = {k: params[k] * scale for k in params}
        return updated, params["w"].sum("i"), scale + 1.0

    jitted = accy.jit(step, donate_argnums=0)
    w, b = np.arange(6, dtype=np.float32).reshape(3, 2), np.ones((3, 2), np.float32)
    params = {"w": accy.named(w.copy(), ("i", "o")), "b": accy.named(b.copy(), ("i", "o"))}
    scale = accy.named(np.float32(3.0), ())
    for call in range(2):  # the first call (traced and compiled) and the cached one
        expected = {"w": w * 3.0 ** (call + 1), "b": b * 3.0 ** (call + 1)}
        arguments = dict(params)
        params, total, bumped = jitted(params, scale)
        assert params["w"] is arguments["w"] and params["b"] is arguments["b"]
        assert bumped is not scale and float(bumped.array) == 4.0
        assert total.axes == ("o",)
        for k in params:
            np.testing.assert_array_equal(params[k].array, expected[k])
        np.testing.assert_array_equal(total.array, (w * 3.0**call).sum(0))


def test_owned_arrays_take_the_short_call_and_views_the_checked_one(monkeypatch):
    # Arrays that own their memory pass with a few comparisons each (the native code reads
    # their addresses); an undonated view of other memory is checked and converted argument
    # by argument, and both give the undonated program's values.
    p, m, v, g = _arrays(4)
    expected = [np.asarray(o).copy() for o in accy.compile(ADAM, device="cpu")(p, m, v, g)]
    update = accy.compile(ADAM, device="cpu", donate=(0, 1, 2))
    checked = type(update)._checked_call
    calls = []

    def counted(self, arrays):
        calls.append(len(arrays))
        return checked(self, arrays)

    monkeypatch.setattr(type(update), "_checked_call", counted)
    for got, want in zip(update(p.copy(), m.copy(), v.copy(), g), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert calls == []
    wide = np.zeros((3, 8), np.float32)
    wide[:, :4] = g
    strided = wide[:, :4]
    assert strided.base is wide
    for got, want in zip(update(p.copy(), m.copy(), v.copy(), strided), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert calls == [4]
