"""accy.NamedArray: construction, eager operations (checked against NumPy and against the same
code under accy.jit), slicing by name, and misuse."""

from __future__ import annotations

import numpy as np
import pytest

import accy

rng = np.random.default_rng(1)


def model(params, x):
    """A small attention-like computation that touches many kinds."""
    scores = x.contract(params["w"], "channel")  # batch, head
    weights = accy.nn.softmax(scores, "head")
    mixed = weights.contract(params["v"], "head")  # batch, out
    return accy.nn.layer_norm(mixed, "out")["batch", 1:]


def test_eager_operations_agree_with_the_jitted_function_and_numpy():
    w, v, x = rng.normal(size=(3, 4)), rng.normal(size=(4, 5)), rng.normal(size=(6, 3))
    params = {
        "w": accy.named(w, ("channel", "head"), device="reference"),
        "v": accy.named(v, ("head", "out"), device="reference"),
    }
    xs = accy.named(x, ("batch", "channel"), device="reference")
    eager = model(params, xs)
    jitted = accy.jit(model)(params, xs)
    assert eager.axes == jitted.axes == ("batch", "out")
    np.testing.assert_allclose(eager.array, jitted.array, rtol=1e-12)
    scores = x @ w
    weights = np.exp(scores - scores.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    mixed = weights @ v
    centered = mixed - mixed.mean(1, keepdims=True)
    normed = centered / np.sqrt((centered**2).mean(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(eager.array, normed[1:], rtol=1e-10)


def test_eager_on_the_native_cpu_backend():
    a = accy.named(np.arange(6, dtype=np.float32).reshape(2, 3), ("row", "col"))
    b = accy.named(np.ones(3, np.float32), ("col",))
    total = (a * b + 1.0).sum("col")
    assert total.device is accy.device("cpu")
    np.testing.assert_allclose(total.array, [6.0, 15.0])


def test_properties_and_conversions():
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = accy.named(data, ("batch", "channel"))
    assert x.axes == ("batch", "channel") and x.shape == {"batch": 2, "channel": 3}
    assert x.dtype == accy.f32 and x.size == 6 and x.device is accy.device("cpu")
    np.testing.assert_array_equal(np.asarray(x), data)
    assert x.to("reference").device is accy.device("reference")
    assert float(x.sum()) == 15.0


def test_slicing_and_indexing_by_name():
    data = np.arange(12.0).reshape(3, 4)
    x = accy.named(data, ("row", "col"), device="reference")
    np.testing.assert_array_equal(x["col", 1:].array, data[:, 1:])
    np.testing.assert_array_equal(x["row", 0].array, data[0])
    np.testing.assert_array_equal(x["row", -1, "col", ::2].array, data[-1, ::2])
    np.testing.assert_array_equal(x[{"col": slice(1, 3)}].array, data[:, 1:3])
    assert x["row", 0].axes == ("col",)
    jitted = accy.jit(lambda x: x["col", 1:3]["row", 2])(x)
    np.testing.assert_array_equal(jitted.array, data[2, 1:3])


def test_indexing_by_a_traced_integer():
    data = np.arange(12.0).reshape(3, 4)
    x = accy.named(data, ("row", "col"), device="reference")
    pick = accy.jit(lambda x, i: x["col", i])
    # JAX's x[:, i] with a traced i: negative positions count from the end, others are clamped
    for i, expected in [(1, 1), (-1, 3), (9, 3), (-9, 0)]:
        got = pick(x, np.int32(i))
        assert got.axes == ("row",)
        np.testing.assert_array_equal(got.array, data[:, expected])
    with pytest.raises(accy.AxisError, match="an integer scalar array or a slice"):
        accy.jit(lambda x, i: x["col", i])(x, 1.0)


def test_mixed_eager_and_traced_operands():
    w = accy.named(np.array([1.0, 2.0]), ("lane",), device="reference")
    x = accy.named(np.array([3.0, 4.0]), ("lane",), device="reference")
    # the NamedArray is on the left: the operation still goes to the trace
    assert accy.jit(lambda x: (w * x).sum())(x).item() == 11.0
    assert accy.grad(lambda x: w.contract(x, "lane"))(x).array.tolist() == [1.0, 2.0]


def test_misuse():
    x = accy.named(np.ones((2, 3)), ("row", "col"), device="reference")
    with pytest.raises(accy.AxisError, match="has 2 axes .* but 1 name"):
        accy.named(np.ones((2, 3)), ("row",))
    with pytest.raises(accy.AxisError, match="'colum' is not on .*row, col"):
        x.sum("colum")
    with pytest.raises(accy.AxisError, match="index by axis name"):
        x[0]
    with pytest.raises(accy.AxisError, match="out of range for axis 'row'"):
        x["row", 5]
    with pytest.raises(accy.DeviceMismatch, match="move it with"):
        x + accy.named(np.ones((2, 3)), ("row", "col"))
    with pytest.raises(accy.AxisError, match="extent 2 on one operand and 3"):
        x + accy.named(np.ones(3), ("row",), device="reference")
    with pytest.raises(accy.AccyError, match="unknown device"):
        x.to("tpu")


def test_moving_to_cuda_without_cupy_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)  # as if CuPy were not installed
    x = accy.named(np.ones(2, np.float32), ("a",))
    with pytest.raises(accy.RuntimeUnavailable, match="needs CuPy"):
        x.to("cuda")


def test_a_device_name_built_at_run_time_works_like_the_literal():
    # The fast paths compare devices by identity: a name read from a command line is an equal
    # but distinct string, and must still dispatch (it once raised an internal error).
    device = "".join(["c", "p", "u"])
    x = accy.named(np.array([1.0, 2.0], np.float32), ("lane",), device=device)
    assert x.device is accy.device("cpu") is accy.devices()[0]
    y = x.to("reference").to(device)
    np.testing.assert_allclose((x * y).sum("lane").item(), 5.0)
    jitted = accy.jit(lambda x: x * 2.0, device="".join(["c", "p", "u"]))
    np.testing.assert_allclose((jitted(x) + x).array, [3.0, 6.0])
    with pytest.raises(accy.AccyError, match="unknown device 'gpu'"):
        accy.jit(lambda x: x, device="gpu")
