"""debug_nans names the first operation that made a NaN or an infinity, with its axes and the
user's line; traced operations keep their source lines; errors point at the user's line."""

import inspect

import numpy as np
import pytest

import accy
from accy.config import Config


def line_of(marker: str) -> int:
    source = inspect.getsource(inspect.getmodule(line_of)).splitlines()
    return next(i for i, text in enumerate(source, 1) if marker in text and "line_of" not in text)


def loss(x):
    y = x * 2.0
    z = (y - 4.0).log()  # makes the NaN
    return z.sum()


def test_debug_nans_names_the_operation_and_the_line():
    x = accy.named(np.array([1.0, 3.0], np.float32), "n")
    assert np.isnan(accy.jit(loss)(x).item())  # off: no check
    with accy.config.override(debug_nans=True):
        with pytest.raises(accy.NonFiniteValue) as caught:
            accy.jit(loss)(x)
        message = str(caught.value)
        assert "unary log made a NaN in f32[n=2]" in message
        assert f"test_debugging.py:{line_of('makes the NaN')}" in message
        fine = accy.named(np.array([3.0, 4.0], np.float32), "n")
        np.testing.assert_allclose(accy.jit(loss)(fine).item(), np.log(2.0) + np.log(4.0))


def test_debug_nans_in_the_backward_pass_and_in_inputs():
    x = accy.named(np.array([0.0, 1.0], np.float32), "n", device="reference")
    with accy.config.override(debug_nans=True):
        with pytest.raises(accy.NonFiniteValue, match="made an infinity.*generated") as caught:
            accy.grad(lambda x: x.sqrt().sum())(x)  # the square root
        assert f"traced at {__file__}:{line_of('the square root')}" in str(caught.value)
        nan_in = accy.named(np.array([np.nan, 1.0], np.float32), "n", device="reference")
        with pytest.raises(accy.NonFiniteValue, match="the inputs hold them"):
            accy.jit(lambda x: x * 2.0)(nan_in)


def test_the_setting_is_read_from_its_variable(monkeypatch):
    monkeypatch.setenv("ACCY_DEBUG_NANS", "1")
    assert Config().debug_nans is True
    monkeypatch.setenv("ACCY_DEBUG_NANS", "0")
    assert Config().debug_nans is False


def test_traced_operations_keep_the_users_line():
    x = accy.named(np.ones(2, np.float32), "n")
    traced = accy.frontend.tracing.trace(loss, [x], accy.frontend.tracing.structure(((x,), {})))
    logs = [op for op in traced.program.operations if op.kind == "unary"]
    assert traced.locations[logs[0].id].endswith(f":{line_of('makes the NaN')}")


def test_errors_inside_traced_code_point_at_the_users_line():
    x = accy.named(np.ones(2, np.float32), "n")
    with pytest.raises(accy.AxisError) as caught:
        accy.jit(lambda x: x.sum("missing"))(x)  # the bad axis
    assert f"test_debugging.py:{line_of('the bad axis')}" in str(caught.value)


def test_debug_print_inside_jit_prints_on_every_run(capsys):
    @accy.jit
    def inner(x):
        accy.debug_print("inner {x}", x=x.sum())
        return x * 2.0

    @accy.jit
    def outer(x):
        y = inner(x)
        accy.debug_print("y[0]={} n={}", y["n", 0], 2)
        return y.sum()

    x = accy.named(np.array([1.0, 2.0], np.float32), "n", device="reference")
    assert outer(x).item() == 6.0
    outer(x * 2.0)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].startswith("inner NamedArray(f32[], array(3.")
    assert "y[0]=NamedArray(f32[], array(4." in lines[3] and lines[3].endswith("n=2")
    accy.debug_print("eager {}", 1.5)
    assert capsys.readouterr().out == "eager 1.5\n"
