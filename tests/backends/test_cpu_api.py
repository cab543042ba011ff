"""The execution API over the native CPU backend: grad.zig's tests that run natively, through
the fragment API (`accy.compat`), then buffers, bad input at the boundary, and `accy.compile`."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import accy
import accy.compat
from accy import f32, i32, spec
from accy.backends.dlpack import KDL_BFLOAT, DLManagedTensor
from accy.compat.executable import invoke, load_fragment, prepare_invocation
from accy.compat.gpu.cpu import State
from accy.compat.lower import FragmentCompilerOptions, compile_fragment


def elementwise_loss(b, args):
    return (args[0] * args[1]).sum("lane")


def lane_specs(count):
    return [spec(f32, lane=4)] * count


# -- grad.zig's native tests ----------------------------------------------------------------------


def test_grad_of_a_plain_sum_runs_natively(native_cpu):
    source = accy.trace.define("grad_plain_sum", lane_specs(1), lambda b, a: a[0].sum("lane"))
    differentiated = accy.grad(source, wrt=(0,))
    gradient = np.zeros(4, np.float32)
    x = np.array([1, 2, 3, 4], np.float32)
    accy.compat.execute.run_cpu(differentiated, [x.tobytes()], [gradient])
    assert gradient.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_grad_executes_with_an_unused_parameter(native_cpu):
    def embedding_loss(b, args):
        return args[0].gather(args[1], "vocab").sum(("token", "channel"))

    source = accy.trace.define(
        "grad_unused_parameter_cpu",
        [spec(f32, vocab=4, channel=2), spec(i32, token=3)],
        embedding_loss,
    )
    differentiated = accy.grad(source, wrt=(0,))
    table = np.array([0.5, -1.0, 2.0, 0.25, 3.0, -2.0, 1.5, 0.75], np.float32)
    indices = np.array([2, 0, 2], np.int32)
    table_grad = bytearray(np.full(8, -1.0, np.float32).tobytes())
    accy.compat.execute.run_cpu(differentiated, [table, memoryview(indices)], [table_grad])
    expected = [1.0, 1.0, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0]
    assert np.frombuffer(table_grad, np.float32).tolist() == expected


def test_value_and_grad_computes_loss_and_gradients_in_one_launch(native_cpu):
    source = accy.trace.define("value_and_grad_numeric", lane_specs(2), elementwise_loss)
    combined = accy.value_and_grad(source, wrt=(0, 1))
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    y = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    loss, x_grad, y_grad = (
        np.zeros((), np.float32),
        np.zeros(4, np.float32),
        np.zeros(4, np.float32),
    )
    accy.compat.execute.run_cpu(combined, [x, y], [loss, x_grad, y_grad])
    assert loss == pytest.approx(5.5)
    assert x_grad.tolist() == y.tolist()
    assert y_grad.tolist() == x.tolist()


def test_batched_dot_general_gradients_through_compile_fragment(native_cpu):
    def loss(b, args):
        return (args[0].contract(args[1], "k") * args[2]).sum(("b", "m", "n"))

    types = [spec(f32, b=2, m=2, k=3), spec(f32, b=2, k=3, n=2), spec(f32, b=2, m=2, n=2)]
    source = accy.trace.define("grad_batched_dot_general_cpu", types, loss)
    differentiated = accy.grad(source, wrt=(0, 1))
    state = State()
    options = FragmentCompilerOptions(artifact_format="cpu_object")
    compiled = compile_fragment(state.handle(), differentiated, options)
    fragment = load_fragment(state.handle(), compiled, options)
    lhs = np.array([1, 2, 3, 4, 5, 6, -1, 0.5, 2, 3, -2, 1], np.float32).reshape(2, 2, 3)
    rhs = np.array([7, 8, 9, 10, 11, 12, 0.25, -1, 2, -3, 4, 0.5], np.float32).reshape(2, 3, 2)
    weights = np.array([1, -0.5, 0.25, 2, -1.5, 0.75, 3, -2], np.float32).reshape(2, 2, 2)
    lhs_grad, rhs_grad = np.zeros_like(lhs), np.zeros_like(rhs)
    invoke(fragment, [lhs, rhs, weights], [lhs_grad, rhs_grad])
    assert fragment.output_count() == 2
    np.testing.assert_allclose(lhs_grad, weights @ rhs.transpose(0, 2, 1), atol=1e-6)
    np.testing.assert_allclose(rhs_grad, lhs.transpose(0, 2, 1) @ weights, atol=1e-6)


def test_noncanonical_dot_general_gradients(native_cpu):
    def loss(b, args):
        return b.dot_general(args[0], args[1], (0,), (0,)).sum(("m", "n"))

    types = [spec(f32, k=3, m=2), spec(f32, k=3, n=2)]
    differentiated = accy.grad(accy.trace.define("grad_noncanonical_dot_cpu", types, loss), (0, 1))
    lhs = np.array([1, 2, 3, 4, 5, 6], np.float32)
    rhs = np.array([0.5, -1.0, 2.0, 0.25, -0.75, 1.5], np.float32)
    lhs_grad, rhs_grad = np.zeros(6, np.float32), np.zeros(6, np.float32)
    accy.compat.execute.run_cpu(differentiated, [lhs, rhs], [lhs_grad, rhs_grad])
    rhs_rows, lhs_rows = rhs.reshape(3, 2).sum(1), lhs.reshape(3, 2).sum(1)
    np.testing.assert_allclose(lhs_grad.reshape(3, 2), np.repeat(rhs_rows[:, None], 2, 1))
    np.testing.assert_allclose(rhs_grad.reshape(3, 2), np.repeat(lhs_rows[:, None], 2, 1))


def causal_attention_loss(b, args):
    queries, keys, values, mask = args
    scores = queries.contract(keys.rename("token", "key"), "channel")
    masked = scores + mask
    centered = masked - masked.max("key")
    weights = centered.exp()
    probs = weights / weights.sum("key")
    mixed = probs.contract(values.rename("token", "key"), "key")
    return (mixed * mixed).sum(("token", "channel"))


def test_value_and_grad_matches_finite_differences_through_causal_attention(native_cpu):
    types = [spec(f32, token=4, channel=3)] * 3 + [spec(f32, token=4, key=4)]
    source = accy.trace.define("grad_causal_attention_fd", types, causal_attention_loss)
    combined = accy.value_and_grad(source, wrt=(0, 1, 2))
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, (4, 3)).astype(np.float32) for _ in range(3)]
    mask = np.where(np.tril(np.ones((4, 4))) > 0, 0.0, -30.0).astype(np.float32)
    outputs = [np.zeros((), np.float32)] + [np.zeros((4, 3), np.float32) for _ in range(3)]
    accy.compat.execute.run_cpu(combined, [*inputs, mask], outputs)
    loss_executor = accy.compat.execute.Cpu(source)
    step = 0.01
    for tensor in range(3):
        for element in range(12):
            probes = []
            for offset in (step, -step):
                perturbed = [x.copy() for x in inputs]
                perturbed[tensor].reshape(-1)[element] += offset
                probe = np.zeros((), np.float32)
                loss_executor.launch([*perturbed, mask], [probe])
                probes.append(float(probe))
            numeric = (probes[0] - probes[1]) / (2 * step)
            analytic = outputs[1 + tensor].reshape(-1)[element]
            assert abs(numeric - analytic) <= 0.002 + 0.02 * abs(numeric)


def test_prepare_invocation_binds_inputs_then_launches_and_reads(native_cpu):
    source = accy.trace.define("doubled_sum", lane_specs(1), lambda b, a: (a[0] * 2.0).sum("lane"))
    differentiated = accy.grad(source, wrt=(0,))
    fragment = load_fragment(None, compile_fragment(State().handle(), differentiated))
    bindings = prepare_invocation(fragment, [np.array([1, 2, 3, 4], np.float32).tobytes()])
    bindings.launch()
    gradient = np.full(4, -1.0, np.float32)
    bindings.read_output(0, gradient)
    assert gradient.tolist() == [2.0, 2.0, 2.0, 2.0]


# -- one native call per invocation ------------------------------------------------------------


def test_one_invocation_is_one_native_call(native_cpu):
    source = accy.trace.define(
        "attention_calls",
        [spec(f32, token=4, channel=3)] * 3 + [spec(f32, token=4, key=4)],
        causal_attention_loss,
    )
    combined = accy.value_and_grad(source, wrt=(0, 1, 2))
    fragment = load_fragment(None, compile_fragment(None, combined))
    assert len(accy.lower.build_plan(combined).steps) > 5  # many fused loops and GEMMs...
    calls = []
    for name in ("native_entry", "native_arrays_entry"):  # by addresses, or by NumPy arrays
        native = getattr(fragment, name)

        def counting(*arguments, native=native):
            calls.append(arguments)
            return native(*arguments)

        setattr(fragment, name, counting)
    inputs = [np.ones((4, 3), np.float32)] * 3 + [np.zeros((4, 4), np.float32)]
    outputs = [np.zeros((), np.float32)] + [np.zeros((4, 3), np.float32) for _ in range(3)]
    invoke(fragment, inputs, outputs)
    assert len(calls) == 1  # ...and still one call from Python
    invoke(fragment, [a.tobytes() for a in inputs], outputs)
    assert len(calls) == 2


# -- buffers and bad input at the boundary -------------------------------------------------------


@pytest.fixture
def scaled(native_cpu):
    program = accy.trace.define(
        "scaled", [spec(f32, lane=4), spec(i32, lane=4)], lambda b, a: (a[0] * 2.0, a[1] + 1)
    )
    return load_fragment(None, compile_fragment(None, program))


def test_any_buffer_object_is_accepted(scaled):
    x = np.array([1, 2, 3, 4], np.float32)
    n = np.array([1, 2, 3, 4], np.int32)
    for inputs in (
        [x, n],
        [x.tobytes(), bytearray(n.tobytes())],
        [memoryview(x), n.view(np.uint8)],
    ):
        out0, out1 = bytearray(16), np.zeros(4, np.int32)
        invoke(scaled, inputs, [out0, out1])
        assert np.frombuffer(out0, np.float32).tolist() == [2, 4, 6, 8]
        assert out1.tolist() == [2, 3, 4, 5]


BAD_INPUTS = {
    "wrong byte size": (
        lambda x, n: ([x[:3], n], [np.zeros(4, np.float32), np.zeros(4, np.int32)]),
        "input 0: the buffer has 12 bytes, but f32\\[lane=4\\] takes 16",
    ),
    "too few inputs": (
        lambda x, n: ([x], [np.zeros(4, np.float32), np.zeros(4, np.int32)]),
        "takes 2 inputs .* got 1",
    ),
    "too many outputs": (
        lambda x, n: ([x, n], [np.zeros(4, np.float32)] * 2 + [np.zeros(4, np.int32)]),
        "takes 2 outputs .* got 3",
    ),
    "read-only output": (
        lambda x, n: ([x, n], [bytes(16), np.zeros(4, np.int32)]),
        "output 0: the buffer is read-only",
    ),
    "non-contiguous array": (
        lambda x, n: ([np.zeros(8, np.float32)[::2], n], [np.zeros(4, np.float32)] * 2),
        "input 0: the array is not contiguous",
    ),
    "wrong dtype": (
        lambda x, n: ([x.astype(np.float64)[:2], n], [np.zeros(4, np.float32)] * 2),
        "input 0: an array of dtype float64 was given for f32\\[lane=4\\]",
    ),
    "not a buffer": (
        lambda x, n: ([x, [1, 2, 3, 4]], [np.zeros(4, np.float32)] * 2),
        "input 1: list is not a buffer",
    ),
    "output overlapping an input": (
        lambda x, n: ([x, n], [x, np.zeros(4, np.int32)]),
        "output 0 overlaps input 0",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=str)
def test_bad_buffers_are_refused_before_anything_runs(scaled, case):
    make, message = BAD_INPUTS[case]
    x, n = np.array([1, 2, 3, 4], np.float32), np.array([1, 2, 3, 4], np.int32)
    inputs, outputs = make(x, n)
    untouched = [np.frombuffer(o, np.uint8).copy() for o in outputs]
    with pytest.raises(accy.InvalidInput, match=message):
        invoke(scaled, inputs, outputs)
    for output, before in zip(outputs, untouched, strict=True):
        assert np.array_equal(np.frombuffer(output, np.uint8), before)


def test_read_output_checks_its_buffer_and_order(scaled):
    bindings = prepare_invocation(scaled, [np.ones(4, np.float32), np.ones(4, np.int32)])
    with pytest.raises(accy.AccyError, match="call launch\\(\\) first"):
        bindings.read_output(0, bytearray(16))
    bindings.launch()
    with pytest.raises(accy.InvalidInput, match="output 2 does not exist"):
        bindings.read_output(2, bytearray(16))
    with pytest.raises(accy.InvalidInput, match="the buffer has 8 bytes"):
        bindings.read_output(0, bytearray(8))


# -- accy.compile and accy.run ----------------------------------------------------------------


class Producer:
    """A DLPack producer that is not a NumPy array (as a CPU tensor of another library is)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_compile_takes_arrays_lists_and_dlpack_and_returns_arrays(native_cpu):
    program = accy.trace.define("dot", [spec(f32, k=3)] * 2, lambda b, a: a[0].contract(a[1], "k"))
    compiled = accy.compile(program, device="cpu")
    x = np.array([1, 2, 3], np.float32)
    assert compiled(x, [1.0, 1.0, 1.0])[0].item() == 6.0
    assert compiled(Producer(x), Producer(x))[0].item() == 14.0
    assert accy.run(program, x, x, device="reference")[0].item() == 14.0


def test_compile_takes_and_gives_bf16_as_ml_dtypes_arrays(native_cpu):
    program = accy.trace.define("bf16_scale", [spec(accy.bf16, n=3)], lambda b, a: a[0] * 3.0)
    x = np.array([1.0, 1.01, -2.5], ml_dtypes.bfloat16)
    (result,) = accy.compile(program)(x)
    assert result.dtype == ml_dtypes.bfloat16
    # 1.01 is 1.0078125 in bf16; times 3 is 3.0234375, which rounds to 3.03125 (8 bits).
    assert result.tolist() == [3.0, 3.03125, -7.5]


class Bfloat16Producer:
    """A DLPack producer of a bf16 host tensor, as a PyTorch bf16 CPU tensor is: NumPy's export
    of the uint16 bits, with the capsule's dtype code changed to kDLBfloat."""

    def __init__(self, bits: np.ndarray):
        self.bits = bits

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **ignored):
        capsule = self.bits.__dlpack__()
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        managed = DLManagedTensor.from_address(get(capsule, b"dltensor"))
        managed.dl_tensor.dtype.code = KDL_BFLOAT
        return capsule


@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "strided"])
def test_bf16_dlpack_producers_are_read(native_cpu, transposed):
    program = accy.trace.define(
        "bf16_rows", [spec(accy.bf16, r=2, c=3)], lambda b, a: a[0].sum("c")
    )
    values = np.array([[1.0, 2.0, 3.5], [-1.0, 0.5, 8.0]], ml_dtypes.bfloat16)
    bits = values.view(np.uint16)
    if transposed:  # the producer's tensor has strides (3, 1) read through a transposed view
        bits = np.ascontiguousarray(bits.T).T
    for device in ("cpu", "reference"):
        (rows,) = accy.compile(program, device=device)(Bfloat16Producer(bits))
        assert rows.dtype == ml_dtypes.bfloat16 and rows.tolist() == [6.5, 7.5]


def test_compile_refuses_dtype_and_shape_mismatches(native_cpu):
    program = accy.trace.define("twice", [spec(f32, row=2, col=3)], lambda b, a: a[0] * 2.0)
    compiled = accy.compile(program)
    with pytest.raises(accy.InvalidInput, match="dtype float64 .* needs float32"):
        compiled(np.zeros((2, 3)))
    with pytest.raises(accy.InvalidInput, match="shape \\(3, 2\\) .* has shape \\(2, 3\\)"):
        compiled(np.zeros((3, 2), np.float32))
    with pytest.raises(accy.InvalidInput, match="takes 1 arrays"):
        compiled()
    with pytest.raises(accy.AccyError, match="unknown device 'tpu'"):
        accy.compile(program, device="tpu")


def test_compile_copies_non_contiguous_arrays(native_cpu):
    program = accy.trace.define("twice", [spec(f32, row=2, col=3)], lambda b, a: a[0] * 2.0)
    x = np.arange(6, dtype=np.float32).reshape(3, 2).T
    np.testing.assert_array_equal(accy.compile(program)(x)[0], 2 * x)
