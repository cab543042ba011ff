"""cond (only the selected branch runs, on every backend; reverse mode differentiates both
branches and a select) and while_loop (forward mode only). tests/backends/test_control_flow.py
runs both on the native backends."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bool_, f32, spec


def _cond_program():
    def f(b, args):
        x, w = args

        def on_true(b, v):
            return (v[0] * w).sin(), v[0] * 2.0

        def on_false(b, v):
            return v[0].tanh() * w, -v[0]

        first, second = b.cond(x.sum("lane") > 0.0, on_true, on_false, [x])
        return (first * second).sum("lane")

    return accy.trace.define("cond", [spec(f32, lane=3)] * 2, f)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_value_and_gradients(sign):
    program = _cond_program()
    x = sign * np.array([0.3, 0.5, 0.7], np.float32)
    w = np.array([1.5, -0.5, 0.25], np.float32)
    accy.testing.check_grads(program, [x, w], wrt=(0, 1), order=2, atol=1e-4, rtol=1e-4)
    forward = accy.jvp(program, (0, 1))
    assert forward.count("cond") == 1  # forward mode keeps the branch structure
    gradient = accy.value_and_grad(program, (0, 1))
    want = accy.reference.run(gradient, [x, w])
    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")
    for got, expected in zip(accy.compile(gradient, device="cpu")(x, w), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    for got, expected in zip(
        accy.compile(program, device="cpu")(x, w), accy.reference.run(program, [x, w]), strict=True
    ):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_cond_inside_a_scan_body_is_differentiated():
    def f(b, args):
        h0, xs = args

        def step(b, a):
            h, x = a
            new = b.cond(
                x > 0.0, lambda b, v: (v[0] * v[1]).tanh(), lambda b, v: v[0] - v[1], [h, x]
            )
            return new, new * new

        (final,), (ys,) = b.scan(step, carries=[h0], xs=[xs], axis="t")
        return final + ys.sum("t")

    program = accy.trace.define("scan_cond", [spec(f32), spec(f32, t=4)], f)
    inputs = [np.float32(0.5), np.array([0.3, -0.2, 0.9, -1.1], np.float32)]
    accy.testing.check_grads(program, inputs, wrt=(0, 1), order=1, atol=1e-4, rtol=1e-4)


def test_cond_type_errors():
    with pytest.raises(accy.AccyError, match="predicate must be a bool scalar"):
        accy.trace.define(
            "bad",
            [spec(f32, lane=2)],
            lambda b, a: b.cond(a[0], lambda b, v: v[0], lambda b, v: v[0], [a[0]]),
        )
    with pytest.raises(accy.AccyError, match="branches return different types"):
        accy.trace.define(
            "bad",
            [spec(bool_), spec(f32, lane=2)],
            lambda b, a: b.cond(a[0], lambda b, v: v[0], lambda b, v: v[0].sum("lane"), [a[1]]),
        )


def _while_program():
    def f(b, args):
        x, scale = args
        (value, count) = b.while_loop(
            lambda b, c: c[0].sum("lane") < 100.0,
            lambda b, c: [c[0] * scale + 1.0, c[1] + 1.0],
            [x, b.scalar(f32, 0.0)],
        )
        return value.sum("lane") + count

    return accy.trace.define("loop", [spec(f32, lane=2), spec(f32)], f)


def test_while_loop_runs_and_differentiates_in_forward_mode():
    program = _while_program()
    x, scale = np.array([1.0, 2.0], np.float32), np.float32(1.5)
    value = accy.reference.run(program, [x, scale])[0]
    v, count = x.astype(np.float64), 0
    while v.sum() < 100.0:
        v, count = v * 1.5 + 1.0, count + 1
    np.testing.assert_allclose(value, v.sum() + count, rtol=1e-5)
    accy.testing.check_grads(program, [x, scale], wrt=(0, 1), order=2, modes=("fwd",))
    assert accy.jvp(program, (0, 1)).count("while_loop") == 1


def test_while_loop_in_reverse_mode_names_scan():
    with pytest.raises(accy.NotDifferentiable, match="Use builder.scan"):
        accy.grad(_while_program(), (0, 1))


def test_while_loop_type_errors():
    with pytest.raises(accy.AccyError, match="cond_body must return one bool scalar"):
        accy.trace.define(
            "bad",
            [spec(f32)],
            lambda b, a: b.while_loop(lambda b, c: c[0], lambda b, c: [c[0]], a)[0],
        )
    with pytest.raises(accy.AccyError, match="the body must return the carries' types"):
        accy.trace.define(
            "bad",
            [spec(f32)],
            lambda b, a: b.while_loop(
                lambda b, c: c[0] < 1.0, lambda b, c: [b.scalar(accy.i32, 0)], a
            )[0],
        )
