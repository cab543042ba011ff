"""The front end on the CUDA device: `accy.jit`, `grad`, `vmap`, the optimizers and eager
NamedArray operations on CuPy arrays, checked against NumPy in float64 and against the same
calls on the CPU. Skipped without a GPU, the skip naming the closed gate (as every CUDA test)."""

from __future__ import annotations

import numpy as np
import pytest

import accy

from ..executors import cuda_device_or_skip


@pytest.fixture(scope="module")
def cupy():
    cuda_device_or_skip()
    import cupy

    return cupy


def loss(params, x, y):
    hidden = (x.contract(params["w1"], "input") + params["b1"]).tanh()
    error = hidden.contract(params["w2"], "hidden") - y
    return (error * error).mean()


def numpy_loss(w1, b1, w2, x, y):
    return float(((np.tanh(x @ w1 + b1) @ w2 - y) ** 2).mean())


def numpy_grads(w1, b1, w2, x, y):
    """The MLP's gradients by hand (float64): what accy must compute on the GPU."""
    hidden = np.tanh(x @ w1 + b1)
    d_out = 2 * (hidden @ w2 - y) / y.size
    d_pre = np.outer(d_out, w2) * (1 - hidden**2)
    return {"w1": x.T @ d_pre, "b1": d_pre.sum(0), "w2": hidden.T @ d_out}


def problem(dtype):
    rng = np.random.default_rng(4)
    values = {
        "w1": rng.normal(size=(3, 8)),
        "b1": rng.normal(size=8),
        "w2": rng.normal(size=8),
        "x": rng.normal(size=(16, 3)),
        "y": rng.normal(size=16),
    }
    axes = {
        "w1": ("input", "hidden"),
        "b1": ("hidden",),
        "w2": ("hidden",),
        "x": ("batch", "input"),
        "y": ("batch",),
    }
    return values, {k: (v.astype(dtype), axes[k]) for k, v in values.items()}


def on_cuda(cupy, pairs):
    return {k: accy.named(cupy.asarray(v), axes) for k, (v, axes) in pairs.items()}


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-5), (np.float64, 1e-11)])
def test_jit_value_and_grad_on_cupy_arrays(cupy, dtype, rtol):
    values, pairs = problem(dtype)
    arrays = on_cuda(cupy, pairs)
    assert all(a.device is accy.device("cuda") for a in arrays.values())
    params = {k: arrays[k] for k in ("w1", "b1", "w2")}
    step = accy.jit(accy.value_and_grad(loss))
    value, grads = step(params, arrays["x"], arrays["y"])
    assert value.device is accy.device("cuda") and isinstance(value.array, cupy.ndarray)
    assert value.item() == pytest.approx(numpy_loss(*values.values()), rel=rtol)
    expected = numpy_grads(*values.values())
    for name, grad in grads.items():
        assert isinstance(grad.array, cupy.ndarray) and grad.axes == params[name].axes
        np.testing.assert_allclose(cupy.asnumpy(grad.array), expected[name], rtol=rtol, atol=rtol)
    step(params, arrays["x"], arrays["y"])
    assert step.traces == 1  # the second call hit the cache


def test_per_example_gradients_through_vmap_on_cuda(cupy):
    values, pairs = problem(np.float64)
    arrays = on_cuda(cupy, pairs)
    params = {k: arrays[k] for k in ("w1", "b1", "w2")}
    per_example = accy.jit(accy.vmap(accy.grad(loss), "batch"))(params, arrays["x"], arrays["y"])
    assert per_example["w1"].axes == ("batch", "input", "hidden")
    for e in (0, 7, 15):
        one = numpy_grads(
            values["w1"], values["b1"], values["w2"], values["x"][e : e + 1], values["y"][e : e + 1]
        )
        for name, grad in per_example.items():
            np.testing.assert_allclose(cupy.asnumpy(grad.array[e]), one[name], rtol=1e-11)


def test_eager_operations_on_cuda_agree_with_the_cpu(cupy):
    rng = np.random.default_rng(9)
    a_np, b_np = rng.normal(size=(4, 5)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    for device in ("cuda", "cpu"):
        a = accy.named(a_np, ("row", "col"), device=device)
        b = accy.named(b_np, ("col",), device=device)
        result = {
            "arith": (a * b + 1.0).tanh(),
            "sum": a.sum("col"),
            "contract": a.contract(b, "col"),
            "softmax": accy.nn.softmax(a, "col"),
            "slice": a["col", 1:]["row", -1],
        }
        if device == "cuda":
            on_gpu = result
            assert all(isinstance(r.array, cupy.ndarray) for r in on_gpu.values())
            assert all(r.device is accy.device("cuda") for r in on_gpu.values())
            jitted = accy.jit(lambda a, b: (a * b + 1.0).tanh())(a, b)
            np.testing.assert_allclose(
                cupy.asnumpy(jitted.array), cupy.asnumpy(result["arith"].array), rtol=1e-6
            )
        else:
            for name, r in result.items():
                np.testing.assert_allclose(np.asarray(on_gpu[name]), r.array, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(on_gpu["contract"]), a_np @ b_np, rtol=1e-5)


def test_devices_moves_and_the_optimizer_on_cuda(cupy):
    host = accy.named(np.arange(6.0).reshape(2, 3), ("row", "col"))
    gpu = host.to("cuda")
    assert gpu.device is accy.device("cuda") and isinstance(gpu.array, cupy.ndarray)
    np.testing.assert_array_equal(np.asarray(gpu), host.array)
    assert gpu.to("cpu").device is accy.device("cpu")
    # jit(device="cuda") moves NumPy inputs to the GPU; the result stays there
    doubled = accy.jit(lambda x: x * 2.0, device="cuda")(host)
    assert doubled.device is accy.device("cuda")
    np.testing.assert_array_equal(cupy.asnumpy(doubled.array), 2 * host.array)
    with pytest.raises(accy.DeviceMismatch, match="different devices"):
        accy.jit(lambda a, b: a + b)(host, gpu)
    # Adam over a tree of CuPy parameters, inside one jitted step, against the same on the CPU
    values, pairs = problem(np.float32)
    adam = accy.optim.Adam(learning_rate=0.05)

    @accy.jit
    def train_step(params, state, x, y):
        grads = accy.grad(loss)(params, x, y)
        return adam.apply(params, grads, state)

    finals = {}
    for device in ("cuda", "cpu"):
        arrays = {k: accy.named(v, axes, device=device) for k, (v, axes) in pairs.items()}
        params = {k: arrays[k] for k in ("w1", "b1", "w2")}
        state = adam.init(params)
        for _ in range(5):
            params, state = train_step(params, state, arrays["x"], arrays["y"])
        finals[device] = params
    for name in ("w1", "b1", "w2"):
        np.testing.assert_allclose(
            np.asarray(finals["cuda"][name]), finals["cpu"][name].array, rtol=1e-4, atol=1e-5
        )
