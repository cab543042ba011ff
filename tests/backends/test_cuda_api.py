"""The CUDA backend through its public entry points, on a GPU: the fragment API (`accy.compat`) over
host and device buffers, `accy.compile` over CuPy, PyTorch and JAX arrays, one graph launch per
call, bad input, the TF32 compile option."""

from __future__ import annotations

import numpy as np
import pytest

import accy
import accy.compat
from accy import f32, i32, spec
from accy.backends.cuda import runtime

from ..executors import cuda_device_or_skip


@pytest.fixture(scope="module")
def cupy():
    cuda_device_or_skip()
    import cupy

    return cupy


def _affine():
    def body(b, args):
        x, w = args
        return x.contract(w, "k").tanh(), (x * x).sum()

    return accy.trace.define("affine", [spec(f32, n=6, k=5), spec(f32, k=5, m=4)], body)


def _expected(x, w):
    return [np.tanh(x.astype(np.float64) @ w), (x.astype(np.float64) ** 2).sum()]


def _fragment(program, registry=None):
    handle = accy.compat.gpu.cuda.State.init_device(0).handle()
    options = accy.compat.lower.FragmentCompilerOptions("cuda_c", registry)
    compiled = accy.compat.lower.compile_fragment(handle, program, options)
    return accy.compat.executable.load_fragment(handle, compiled, options)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(
        np.float32
    )


def test_invoke_takes_host_and_device_buffers_in_any_mix(cupy):
    fragment = _fragment(_affine())
    x, w = _inputs()
    host_out = [np.full((6, 4), -1, np.float32), np.full((), -1, np.float32)]
    accy.compat.executable.invoke(fragment, [x.tobytes(), cupy.asarray(w)], host_out)
    device_out = [cupy.full((6, 4), -1, cupy.float32), cupy.full((), -1, cupy.float32)]
    accy.compat.executable.invoke(fragment, [cupy.asarray(x), w], device_out)
    for got in (host_out, [cupy.asnumpy(d) for d in device_out]):
        for value, expected in zip(got, _expected(x, w), strict=True):
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)


def test_prepared_bindings_launch_again_and_read_outputs_to_host_or_device(cupy):
    fragment = _fragment(_affine())
    x, w = _inputs(1)
    bindings = accy.compat.executable.prepare_invocation(fragment, [x, cupy.asarray(w)])
    with pytest.raises(accy.AccyError, match="launch"):
        bindings.read_output(0, np.zeros((6, 4), np.float32))
    for _ in range(3):
        bindings.launch()
    host = bytearray(6 * 4 * 4)
    bindings.read_output(0, host)
    device = cupy.zeros((), cupy.float32)
    bindings.read_output(1, device)
    expected = _expected(x, w)
    np.testing.assert_allclose(np.frombuffer(host, np.float32).reshape(6, 4), expected[0], 1e-5)
    np.testing.assert_allclose(float(device), expected[1], rtol=1e-5)
    with pytest.raises(accy.InvalidInput, match="output 2 does not exist"):
        bindings.read_output(2, host)


def test_bad_buffers_are_refused_before_anything_runs(cupy):
    fragment = _fragment(_affine())
    x, w = _inputs()
    out = [cupy.zeros((6, 4), cupy.float32), cupy.zeros((), cupy.float32)]
    with pytest.raises(accy.InvalidInput, match="input 1: .* 40 bytes"):
        accy.compat.executable.invoke(fragment, [x, cupy.zeros(10, cupy.float32)], out)
    with pytest.raises(accy.InvalidInput, match="dtype int32"):
        accy.compat.executable.invoke(fragment, [cupy.zeros((6, 5), cupy.int32), w], out)
    with pytest.raises(accy.InvalidInput, match="takes 2 inputs"):
        accy.compat.executable.invoke(fragment, [x], out)
    with pytest.raises(accy.InvalidInput, match="overlaps"):
        shared = cupy.asarray(x)
        accy.compat.executable.invoke(fragment, [shared, w], [shared.ravel()[:24], out[1]])


def test_compile_takes_cupy_arrays_and_returns_cupy_arrays(cupy):
    program = _affine()
    run = accy.compile(program, device="cuda")
    x, w = _inputs(2)
    results = run(cupy.asarray(x), cupy.asarray(w))
    assert all(isinstance(r, cupy.ndarray) for r in results)
    assert results[0].shape == (6, 4) and results[1].shape == ()
    for value, expected in zip(results, _expected(x, w), strict=True):
        np.testing.assert_allclose(cupy.asnumpy(value), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(accy.InvalidInput, match="dtype float64"):
        run(cupy.asarray(x, cupy.float64), w)
    with pytest.raises(accy.InvalidInput, match="shape"):
        run(cupy.asarray(x.T), w)
    with pytest.raises(accy.InvalidInput, match="takes 2 arrays"):
        run(x)


def test_one_call_is_one_graph_launch(cupy, monkeypatch):
    program = _affine()
    run = accy.compile(program, device="cuda")
    x, w = (cupy.asarray(a) for a in _inputs(3))
    run(x, w)
    run(x, w)  # both slots captured
    launches = []
    original = cupy.cuda.runtime.graphLaunch
    monkeypatch.setattr(
        cupy.cuda.runtime, "graphLaunch", lambda *a: (launches.append(a), original(*a))[1]
    )
    kernels = []
    monkeypatch.setitem(runtime.ISSUERS, runtime.Launch, lambda *a: kernels.append(a))
    for _ in range(5):
        run(x, w)
    assert len(launches) == 5 and kernels == []


def test_calls_in_flight_each_see_their_own_buffers(cupy):
    program = _affine()
    run = accy.compile(program, device="cuda")
    pairs = [_inputs(seed) for seed in range(8)]
    results = [run(cupy.asarray(x), cupy.asarray(w)) for x, w in pairs]  # no sync in between
    cupy.cuda.get_current_stream().synchronize()
    for (x, w), result in zip(pairs, results, strict=True):
        np.testing.assert_allclose(cupy.asnumpy(result[0]), _expected(x, w)[0], 1e-5, 1e-5)


def test_pytorch_cuda_tensors_go_in_without_a_copy(cupy):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    program = _affine()
    x, w = _inputs(4)
    results = accy.compile(program, device="cuda")(torch.from_numpy(x).cuda(), torch.tensor(w))
    np.testing.assert_allclose(cupy.asnumpy(results[0]), _expected(x, w)[0], 1e-5, 1e-5)


def test_jax_gpu_arrays_go_in_through_dlpack(cupy):
    jax = pytest.importorskip("jax")
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU here")
    program = _affine()
    x, w = _inputs(5)
    arguments = [jax.device_put(a, device) for a in (x, w)]
    results = accy.compile(program, device="cuda")(*arguments)
    np.testing.assert_allclose(cupy.asnumpy(results[0]), _expected(x, w)[0], 1e-5, 1e-5)


def _matmul():
    types = [spec(f32, m=256, k=512), spec(f32, k=512, n=256)]
    return accy.trace.define("tf32", types, lambda b, a: a[0].contract(a[1], "k"))


def _relative_error(cupy, program, precision="f32"):
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal(t.extents).astype(np.float32) for t in program.parameter_types)
    compiled = accy.compile(program, device="cuda", precision=precision)
    (got,) = compiled(cupy.asarray(a), cupy.asarray(b))
    exact = a.astype(np.float64) @ b
    return np.linalg.norm(cupy.asnumpy(got) - exact) / np.linalg.norm(exact)


def test_f32_contractions_are_true_float32_unless_compiled_for_tf32(cupy):
    assert _relative_error(cupy, _matmul()) < 1e-6
    error = _relative_error(cupy, _matmul(), precision="tf32")  # the same program, another key
    assert 1e-5 < error < 1e-2


def test_gathers_with_integer_indices_from_device_arrays(cupy):
    program = accy.trace.define(
        "lookup",
        [spec(f32, v=4, c=2), spec(i32, t=3)],
        lambda b, a: a[0].gather(a[1], "v"),
    )
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    (got,) = accy.compile(program, device="cuda")(table, cupy.asarray([3, -1, 9], cupy.int32))
    np.testing.assert_array_equal(cupy.asnumpy(got), table[[3, 0, 3]])


def test_profile_times_every_action_and_leaves_the_results_right(cupy):
    program = _affine()
    fragment = runtime.load(accy.backends.cuda.compile.compile_program(program))
    x, w = (cupy.asarray(a) for a in _inputs(4))
    outputs = [cupy.empty(t.extents, np.float32) for t in program.output_types]
    addresses = [a.data.ptr for a in (x, w, *outputs)]
    actions = fragment.profile(addresses, repeats=3)
    assert len(actions) == len(fragment.compiled.schedule.actions)
    assert any(what.startswith("gemm 4x6x5") for what, _ in actions)
    assert all(t > 0 for _, t in actions)
    for got, want in zip(outputs, _expected(*_inputs(4)), strict=True):
        np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-5, atol=1e-6)
    fragment.run(addresses)  # the graph path still works after a profile
    cupy.cuda.get_current_stream().synchronize()


def test_short_contraction_kernel_matches_numpy(cupy):
    # k=10 into a 2048 x 512 result goes to a generated kernel rather than cuBLAS.
    def body(b, args):
        d, w = args
        return (d.contract(w, "out"),)

    program = accy.trace.define(
        "short", [spec(f32, b=2048, out=10), spec(f32, h=512, out=10)], body
    )
    rng = np.random.default_rng(5)
    d, w = (rng.standard_normal(t.extents).astype(np.float32) for t in program.parameter_types)
    (got,) = accy.compile(program, device="cuda")(cupy.asarray(d), cupy.asarray(w))
    want = d.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-5, atol=1e-5)
