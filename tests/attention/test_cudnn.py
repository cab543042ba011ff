"""`nn.attention` through cuDNN's fused attention (bf16, f16) on CUDA: the layout mapping and
its declines (here, without a GPU), and on a GPU with `cudnn` importable: values and gradients
against the composition in float64 on the same rounded inputs, that cuDNN really ran (a library
step in the schedule), and a nonzero cotangent of the logsumexp."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import accy
from accy import bf16, f16, f32, f64, spec
from accy.attention import cuda as cudnn_attention
from accy.attention.records import records_for
from accy.attention.signature import Signature, check, packed_type
from accy.kernel import toolchain

from ..executors import cuda_device_or_skip
from .programs import output_and_lse_loss

EXTENTS = {"batch": 2, "head": 3, "token": 96, "key": 96, "dim": 64}
LAYOUTS = {
    "bhsd": (("batch", "head", "token", "dim"), ("batch", "head", "key", "dim")),
    "bshd": (("batch", "token", "head", "dim"), ("batch", "key", "head", "dim")),
    "hbsd-mixed": (("head", "batch", "token", "dim"), ("batch", "key", "head", "dim")),
}
TOLERANCE = {"bf16": 3e-2, "f16": 5e-3}  # of the largest expected magnitude: ~8 and ~10 ulps


# -- the layout mapping (no GPU) ----------------------------------------------------------------


def _signature(q, k, v=None, bias=None, causal=False):
    return Signature(q, k, v or k, bias, causal=causal)


def _spec(dtype, axes, **extents):
    return accy.spec(dtype, {a: {**EXTENTS, **extents}[a] for a in axes})


def test_describe_reads_every_layout_in_place():
    q_axes, k_axes = LAYOUTS["hbsd-mixed"]
    s = _signature(q_axes, k_axes, causal=True)
    types = [_spec(bf16, q_axes), _spec(bf16, k_axes), _spec(bf16, k_axes)]
    p = cudnn_attention.describe(s, "forward", types)
    # (b, h) follow the query's batch order: b = head (3), h = batch (2).
    assert (p.b, p.h, p.tokens, p.keys, p.dim) == (3, 2, 96, 96, 64)
    assert p.q == (2 * 96 * 64, 96 * 64, 64, 1)
    assert p.k == (64, 96 * 3 * 64, 3 * 64, 1)  # k is (batch, key, head, dim)
    # The results, in place: O in rows of dim + 8 (the logsumexp's hi, lo, zeros after it);
    # per batch entry, rows [dQ; dK; dV] of dim.
    assert p.o == (2 * 96 * 72, 96 * 72, 72, 1) and p.packed_row == 72
    assert p.grads == (2 * 288 * 64, 288 * 64, 64, 1)
    assert p.gradient_offsets() == (0, 96 * 64, 192 * 64)
    assert p.causal and p.scale == pytest.approx(1 / 8)


def test_describe_merges_three_batch_axes_where_adjacent():
    q = ("batch", "group", "head", "token", "dim")
    k = ("batch", "group", "head", "key", "dim")
    s = _signature(q, k)
    types = [_spec(f16, q, group=4), _spec(f16, k, group=4), _spec(f16, k, group=4)]
    p = cudnn_attention.describe(s, "backward", types)
    assert (p.b, p.h) == (2, 4 * 3)
    assert p.q == (4 * 3 * 96 * 64, 96 * 64, 64, 1)


def test_describe_maps_a_bias_with_broadcast_batch_axes():
    q_axes, k_axes = LAYOUTS["bhsd"]
    bias_axes = ("key", "head", "token")
    s = _signature(q_axes, k_axes, bias=bias_axes)
    types = [_spec(bf16, a) for a in (q_axes, k_axes, k_axes, bias_axes)]
    p = cudnn_attention.describe(s, "forward", types)
    assert p.bias == ((1, 0), (3, 96), (96, 1), (96, 3 * 96))


def _strided(flat: np.ndarray, dims, strides, offset: int = 0) -> np.ndarray:
    """The (b, h, s, d) view cuDNN sees of `flat` at element `offset` with `strides`."""
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[offset:], shape=dims, strides=[x * item for x in strides]
    )


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "hbsd-mixed", "sd"])
def test_the_problem_maps_the_results_where_the_records_keep_them(layout):
    """Without a GPU: cuDNN played by NumPy through the problem's dims, strides and offsets
    (O written into the forward's result, Stats split into hi and lo by rows as
    `split_stats` does; O, dO and hi + lo read back, dQ, dK, dV written into the backward's
    result), against the records' references."""
    from accy.attention.composition import numpy_backward, numpy_forward

    q_axes, k_axes = {**LAYOUTS, "sd": (("token", "dim"), ("key", "dim"))}[layout]
    s = _signature(q_axes, k_axes, causal=True)
    extents = {"batch": 2, "head": 3, "token": 24, "key": 24, "dim": 16}
    types = [accy.spec(bf16, {a: extents[a] for a in axes}) for axes in (q_axes, k_axes, k_axes)]
    q, k, v = _inputs(types, bf16, seed=8)
    fwd = cudnn_attention.describe(s, "forward", types)
    bwd = cudnn_attention.describe(s, "backward", types)
    dims_q, dims_k = (fwd.b, fwd.h, fwd.tokens, fwd.dim), (fwd.b, fwd.h, fwd.keys, fwd.dim)
    qs, ks, vs = (
        _strided(x.reshape(-1).astype(np.float64), d, st)
        for x, d, st in ((q, dims_q, fwd.q), (k, dims_k, fwd.k), (v, dims_k, fwd.v))
    )
    scores = np.einsum("bhsd,bhtd->bhst", qs, ks) * fwd.scale
    scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
    stats = np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1)) + scores.max(-1)
    probabilities = np.exp(scores - stats[..., None])
    packed_t = packed_type(s, check(s, *types))
    packed = np.zeros(packed_t.size, np.float64)
    _strided(packed, dims_q, fwd.o)[...] = np.einsum("bhst,bhtd->bhsd", probabilities, vs)
    rows = packed.reshape(fwd.rows, fwd.packed_row)  # split_stats: row r = (b h s)
    rows[:, fwd.dim] = stats.reshape(-1).astype(bf16.numpy).astype(np.float64)
    rows[:, fwd.dim + 1] = stats.reshape(-1) - rows[:, fwd.dim]
    packed = packed.astype(bf16.numpy).reshape(packed_t.extents)
    expected = numpy_forward(s, q, k, v).astype(np.float64)
    _close(packed.astype(np.float64), expected, bf16, "packed")

    dpacked = _inputs([packed_t], bf16, seed=9)[0]
    dpacked[..., fwd.dim :] = 0  # no cotangent of the logsumexp
    flat_o = packed.reshape(-1).astype(np.float64)
    o, do = (_strided(x, dims_q, bwd.o) for x in (flat_o, dpacked.reshape(-1).astype(np.float64)))
    lse = flat_o.reshape(bwd.rows, bwd.packed_row)[:, bwd.dim : bwd.dim + 2].sum(-1)
    p = np.exp(scores - lse.reshape(stats.shape)[..., None])  # prepare_backward: hi + lo
    ds = p * (np.einsum("bhsd,bhtd->bhst", do, vs) - (do * o).sum(-1)[..., None])
    grads = {
        "dq": np.einsum("bhst,bhtd->bhsd", ds, ks) * bwd.scale,
        "dk": np.einsum("bhst,bhsd->bhtd", ds, qs) * bwd.scale,
        "dv": np.einsum("bhst,bhsd->bhtd", p, do),
    }
    result_t = accy.attention.signature.backward_type(s, check(s, *types))
    result = np.zeros(result_t.size, np.float64)
    for value, offset in zip(grads.values(), bwd.gradient_offsets(), strict=True):
        _strided(result, value.shape, bwd.grads, offset)[...] = value
    expected = numpy_backward(s, q, k, v, packed, dpacked).astype(np.float64)
    _close(result.reshape(result_t.extents), expected, bf16, "[dQ; dK; dV]")


@pytest.mark.parametrize(
    "dtype, layouts, bias_axes, why",
    [
        (f32, LAYOUTS["bhsd"], None, "needs bf16 or f16"),
        (bf16, (("batch", "head", "dim", "token"), LAYOUTS["bhsd"][1]), None, "innermost"),
        (bf16, LAYOUTS["bhsd"], ("head", "token"), "lacks the query or the key axis"),
        (
            bf16,
            (("batch", "group", "token", "head", "dim"), ("group", "key", "batch", "head", "dim")),
            None,
            "cannot be merged",
        ),
    ],
)
def test_describe_declines_what_cudnn_cannot_read(dtype, layouts, bias_axes, why):
    q_axes, k_axes = layouts
    s = _signature(q_axes, k_axes, bias=bias_axes)
    axes = [q_axes, k_axes, k_axes] + ([bias_axes] if bias_axes else [])
    types = [_spec(dtype, a, group=4) for a in axes]
    with pytest.raises(cudnn_attention.Decline, match=why):
        cudnn_attention.describe(s, "forward", types)


def test_switched_off_declines_and_says_why(configure):
    configure(cudnn_attention=False)
    q_axes, k_axes = LAYOUTS["bhsd"]
    s = _signature(q_axes, k_axes)
    kv = _spec(bf16, k_axes, key=40)
    types = [_spec(bf16, q_axes, token=40), kv, kv]
    result = packed_type(s, check(s, *types))
    assert cudnn_attention.kernel_factory(s, "forward")(types, result) is None
    reasons = cudnn_attention.decline_reasons()
    assert any("ACCY_CUDNN_ATTENTION=0" in why for why in reasons.values())


# -- on a GPU -----------------------------------------------------------------------------------


def _cudnn_or_skip():
    cuda_device_or_skip()
    pytest.importorskip("cudnn", reason="cuDNN attention: nvidia-cudnn-frontend is not installed")


def _program(dtype, layouts, *, causal, bias_axes=None, loss=False, keys=None):
    q_axes, k_axes = layouts
    extents = {**EXTENTS, "key": keys or EXTENTS["key"]}
    axes = [q_axes, k_axes, k_axes] + ([bias_axes] if bias_axes else [])
    specs = [accy.spec(dtype, {a: extents[a] for a in names}) for names in axes]

    def body(b, args):
        bias = args[3] if bias_axes else None
        out = accy.nn.attention(*args[:3], causal=causal, bias=bias)
        out = out.transpose("batch", "head", "token", "dim")
        if not loss:
            return out
        weights = np.linspace(-1, 1, out.ty.size).reshape(out.ty.extents)
        w = b.constant(weights, accy.spec(f32, dict(out.ty.named_extents)))
        return (out.convert(f32) * w).sum(("batch", "head", "token", "dim"))

    return accy.trace.define("attend", specs, body), specs


def _inputs(specs, dtype, seed=0):
    """Random operands of `dtype` (ml_dtypes.bfloat16, float16 or float32 arrays)."""
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=t.extents).astype(np.float32) for t in specs]
    return [x.astype(dtype.numpy) for x in arrays]


def _as_f64_program(program_maker, *args, **options):
    p, _ = program_maker(f64, *args, **options)
    return p


def _host(x) -> np.ndarray:
    import cupy

    return np.asarray(cupy.asnumpy(x)).astype(np.float64)


def _close(got, expected, dtype, what):
    tolerance = TOLERANCE[dtype.name] * max(float(np.max(np.abs(expected))), 1e-3)
    error = float(np.max(np.abs(got - expected)))
    assert error <= tolerance, f"{what}: max error {error:.3g} above {tolerance:.3g}"


def _library_steps(executable) -> list[str]:
    from accy.backends.cuda.schedule import Library

    compiled = getattr(executable, "compiled", None)
    assert compiled is not None, f"not a CUDA executable: {executable!r}"
    return [a.symbol for a in compiled.schedule.actions if isinstance(a, Library)]


CASES = [
    pytest.param(dtype, layout, causal, bias, id=f"{dtype.name}-{layout}-{c}-{b}")
    for dtype in (bf16, f16)
    for layout in LAYOUTS
    for causal, c in ((False, "full"), (True, "causal"))
    for bias, b in ((None, "nobias"), (("head", "token", "key"), "bias"))
    if not (bias and layout != "bhsd")  # bias cases on one layout keep the run short
]


@pytest.mark.parametrize("dtype, layout, causal, bias_axes", CASES)
def test_cudnn_forward_matches_the_composition(dtype, layout, causal, bias_axes):
    _cudnn_or_skip()
    p, specs = _program(dtype, LAYOUTS[layout], causal=causal, bias_axes=bias_axes)
    inputs = _inputs(specs, dtype)
    executable = accy.compile(p, device="cuda")
    assert _library_steps(executable), cudnn_attention.decline_reasons()
    (out,) = executable(*inputs)
    reference = _as_f64_program(_program, LAYOUTS[layout], causal=causal, bias_axes=bias_axes)
    (expected,) = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    _close(_host(out), np.asarray(expected), dtype, "output")


@pytest.mark.parametrize("dtype, layout, causal, bias_axes", CASES)
def test_cudnn_gradients_match_the_composition(dtype, layout, causal, bias_axes):
    _cudnn_or_skip()
    options = dict(causal=causal, bias_axes=bias_axes, loss=True)
    p, specs = _program(dtype, LAYOUTS[layout], **options)
    inputs = _inputs(specs, dtype, seed=1)
    wrt = tuple(range(len(specs)))
    executable = accy.compile(accy.value_and_grad(p, wrt=wrt), device="cuda")
    steps = _library_steps(executable)
    assert any("forward" in s for s in steps), cudnn_attention.decline_reasons()
    assert any("backward" in s for s in steps), cudnn_attention.decline_reasons()
    got = executable(*inputs)
    reference = accy.value_and_grad(_as_f64_program(_program, LAYOUTS[layout], **options), wrt=wrt)
    expected = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    names = ["loss", "dq", "dk", "dv", "dbias"][: len(expected)]
    for name, g, e in zip(names, got, expected, strict=True):
        _close(_host(g), np.asarray(e), dtype, name)


def test_cudnn_unequal_extents_without_causal():
    _cudnn_or_skip()
    p, specs = _program(bf16, LAYOUTS["bshd"], causal=False, loss=True, keys=64)
    inputs = _inputs(specs, bf16, seed=2)
    executable = accy.compile(accy.value_and_grad(p, wrt=(0, 1, 2)), device="cuda")
    assert len(_library_steps(executable)) == 2, cudnn_attention.decline_reasons()
    reference = accy.value_and_grad(
        _as_f64_program(_program, LAYOUTS["bshd"], causal=False, loss=True, keys=64), wrt=(0, 1, 2)
    )
    expected = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    for g, e in zip(executable(*inputs), expected, strict=True):
        _close(_host(g), np.asarray(e), bf16, "value_and_grad")


def test_cudnn_backward_takes_a_cotangent_of_the_logsumexp():
    """A loss over the forward record's output and logsumexp (hi + lo) sends a nonzero dlse to
    the backward record, which the CUDA step folds into O (and puts O back after)."""
    _cudnn_or_skip()
    q_axes, k_axes = LAYOUTS["bhsd"]
    s = Signature(q_axes, k_axes, k_axes, causal=True)

    def make(dtype):
        specs = [accy.spec(dtype, {a: EXTENTS[a] for a in axes}) for axes in (q_axes, k_axes)]
        specs.append(specs[1])
        return output_and_lse_loss(s, specs), specs

    program, specs = make(bf16)
    inputs = _inputs(specs, bf16, seed=3)
    executable = accy.compile(program, device="cuda")
    assert len(_library_steps(executable)) == 2, cudnn_attention.decline_reasons()
    reference, _ = make(f64)
    expected = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    for name, g, e in zip(["loss", "dq", "dk", "dv"], executable(*inputs), expected, strict=True):
        _close(_host(g), np.asarray(e), bf16, name)


def test_unsupported_layouts_run_the_composition_on_cuda():
    cuda_device_or_skip()
    q_axes = LAYOUTS["bhsd"][0][::-1]  # dim outermost: cuDNN reads no such layout
    k_axes = tuple("key" if a == "token" else a for a in q_axes)
    p, specs = _program(bf16, (q_axes, k_axes), causal=True)
    inputs = _inputs(specs, bf16)
    executable = accy.compile(p, device="cuda")
    assert not _library_steps(executable)
    (out,) = executable(*inputs)
    reference = _as_f64_program(_program, (q_axes, k_axes), causal=True)
    (expected,) = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    _close(_host(out), np.asarray(expected), bf16, f"bf16 {q_axes}")


def test_a_library_step_is_scheduled_with_fixed_addresses_and_its_scratch():
    """The CUDA backend's side of a `LibraryStep` (no GPU: the schedule only): operands that
    are the invocation's inputs are copied into scratch first, the result out of it after, and
    the step gets its own scratch."""
    from dataclasses import dataclass

    from accy.backends.cuda.compile import compile_program
    from accy.backends.cuda.schedule import Launch, Library
    from accy.kernel.call import KernelCall, KernelCallRegistry

    @dataclass(frozen=True)
    class Step:
        scratch_bytes: int = 5000

        def load(self, ordinal):  # never called here: nothing is loaded
            raise AssertionError("not loaded in a schedule test")

    q_axes, k_axes = LAYOUTS["bhsd"]
    s = _signature(q_axes, k_axes)
    specs = [_spec(bf16, q_axes), _spec(bf16, k_axes), _spec(bf16, k_axes)]
    result = packed_type(s, check(s, *specs))
    record = records_for(s).register().forward
    program = accy.trace.define("p", specs, lambda b, args: record.call(b, *args))
    parameters = [("dst", result), *zip("qkv", specs, strict=True)]
    call = KernelCall(
        target=record.target,
        version=1,
        symbol="fake_library",
        kernel_name="fake_library",
        parameters=tuple((n, t.dtype) for n, t in parameters),
        written=("dst",),
        extents=tuple((n, t.size) for n, t in parameters),
        c_source="",
        cuda_source="",
        format="cuda_ptx",
        c_signature="fake",
        library=Step(),
    )
    compiled = compile_program(program, KernelCallRegistry([call]))
    kinds = [type(a).__name__ for a in compiled.schedule.actions]
    assert kinds == ["Launch"] * 3 + ["Library", "Launch"], kinds
    (library,) = [a for a in compiled.schedule.actions if isinstance(a, Library)]
    addresses = (*library.operands, library.result, library.scratch)
    assert all(address.fixed for address in addresses)
    starts = sorted(a.offset for a in addresses)
    assert len(set(starts)) == len(starts)  # copies, result and the step's scratch are apart
    assert compiled.workspace_bytes - compiled.scratch_offset >= library.scratch.offset + 5000
    assert compiled.externals["fake_library"] is call
    assert all(isinstance(a, Launch) for a in compiled.schedule.actions if a is not library)


def test_the_steps_read_and_write_the_16_bit_results_in_place(monkeypatch):
    """value_and_grad's schedule on CUDA (compiled without a GPU: cuDNN's graphs faked): the
    two library steps' results are bf16 (no f32 staging); the backward step reads the forward
    step's result where the forward wrote it (no conversion between them); and what launches
    between and after them is only the loss's own work (the cotangent, the gradients' slices),
    counted so that a helper kernel coming back shows."""
    from accy.backends.base import backend_for, compile_artifact
    from accy.backends.cuda.cudnn import Built
    from accy.backends.cuda.schedule import Launch, Library

    # A fresh cache of kernels: the fake steps must not outlive the test.
    monkeypatch.setattr(cudnn_attention, "planned", lambda problem: Built(None, {}, 0))
    monkeypatch.setattr(
        cudnn_attention, "_kernel", functools.cache(cudnn_attention._kernel.__wrapped__)
    )
    extents = {"batch": 2, "head": 2, "token": 80, "key": 80, "dim": 64}
    axes = LAYOUTS["bshd"]
    specs = [accy.spec(bf16, {a: extents[a] for a in names}) for names in (*axes, axes[1])]

    def body(b, args):
        out = accy.nn.attention(*args, causal=True).convert(f32)
        return (out * out).sum(tuple(out.ty.axes))

    gradient = accy.value_and_grad(accy.trace.define("p", specs, body), wrt=(0, 1, 2))
    compiled = compile_artifact(backend_for("cuda"), gradient, None)
    actions = compiled.schedule.actions
    forward, backward = (a for a in actions if isinstance(a, Library))
    for step in (forward, backward):
        call = compiled.externals[step.symbol]
        assert call.library.problem.dtype == "bf16"
        assert dict(call.parameters)["dst"] == bf16, call.parameters
    assert forward.result in backward.operands[3:]  # packed, read where cuDNN wrote it
    kinds = [type(a).__name__ for a in actions]
    first, second = kinds.index("Library"), len(kinds) - 1 - kinds[::-1].index("Library")
    # Before: copies of the three inputs to fixed addresses, made once for both steps;
    # between: the loss's reduction and its cotangent [dO | 0]; after: the gradients' slices.
    assert kinds[:first] == ["Launch"] * 3, kinds
    between = [a for a in actions[first + 1 : second] if isinstance(a, Launch)]
    assert len(between) == 3, kinds
    assert kinds[second + 1 :] == ["Launch"] * 3, kinds


@pytest.mark.slow
@pytest.mark.skipif(
    toolchain.nvcc() is None, reason="cuda gate: nvcc is not on PATH (nor in $CUDA_HOME/bin)"
)
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_the_helper_kernels_compile_after_the_cuda_dialect_prelude(dtype):
    source = cudnn_attention.helper_source(dtype)
    ptx = toolchain.ptx_with_nvcc(source, f"cuDNN attention helpers ({dtype})", arch="compute_90")
    for kernel in ("split_stats", "prepare_backward", "restore_output"):
        assert f".entry {kernel}(" in ptx


# -- settings (the alternatives bench/attention_probe.py compares) ----------------------------


@pytest.fixture
def restored_settings():
    """The module's settings and accy.compile's executables are restored after the test."""
    from accy.backends.base import CACHE

    previous = cudnn_attention.settings()
    yield
    cudnn_attention.configure(previous)
    CACHE.clear()


@pytest.mark.parametrize(
    "changes, why",
    [
        ({"mask": "causal"}, "mask 'causal' is not one of causal_mask, band"),
        ({"plan": "best"}, "plan 'best' is not one of heuristic, fastest"),
        ({"heuristics": ("A", "C")}, "non-empty tuple of A, B, FALLBACK"),
        ({"heuristics": ()}, "non-empty tuple"),
        ({"deterministic": 1}, "deterministic must be True or False"),
        ({"min_blocks": -1}, "min_blocks must be a whole number of thread blocks"),
        ({"min_blocks": 2.5}, "min_blocks must be a whole number"),
    ],
)
def test_configure_rejects_unknown_settings(changes, why, restored_settings):
    before = cudnn_attention.settings()
    with pytest.raises(accy.AccyError, match=why):
        cudnn_attention.configure(cudnn_attention.Settings(**changes))
    with pytest.raises(accy.AccyError, match="must be an accy.attention.cuda.Settings"):
        cudnn_attention.configure({"plan": "fastest"})
    assert cudnn_attention.settings() is before


def test_settings_are_part_of_the_problem_and_its_kernel(restored_settings):
    q_axes, k_axes = LAYOUTS["bhsd"]
    s = _signature(q_axes, k_axes, causal=True)
    types = [_spec(bf16, q_axes), _spec(bf16, k_axes), _spec(bf16, k_axes)]
    default = cudnn_attention.describe(s, "forward", types)
    chosen = cudnn_attention.Settings(mask="band", plan="fastest", heuristics=("A",))
    cudnn_attention.configure(chosen)
    now = cudnn_attention.describe(s, "forward", types)
    assert default.settings == cudnn_attention.Settings() and now.settings == chosen
    assert now != default and hash(now) != hash(default)
    assert cudnn_attention.describe(s, "forward", types, default.settings) == default


def test_the_mask_is_spelled_as_the_settings_say():
    class Alignment:
        TOP_LEFT = "top-left"

    class Cudnn:  # the one name _mask_options reads from the frontend
        diagonal_alignment = Alignment

    q_axes, k_axes = LAYOUTS["bhsd"]
    types = [_spec(bf16, q_axes), _spec(bf16, k_axes), _spec(bf16, k_axes)]
    for causal in (False, True):
        s = _signature(q_axes, k_axes, causal=causal)
        for mask, expected in (
            ("causal_mask", {"use_causal_mask": True}),
            ("band", {"diagonal_alignment": "top-left", "diagonal_band_right_bound": 0}),
        ):
            chosen = cudnn_attention.Settings(mask=mask)
            p = cudnn_attention.describe(s, "backward", types, chosen)
            assert cudnn_attention._mask_options(p, Cudnn) == (expected if causal else {})


SETTINGS_CASES = [
    pytest.param(cudnn_attention.Settings(plan="fastest"), id="fastest-plan"),
    pytest.param(cudnn_attention.Settings(mask="band", heuristics=("A",)), id="band-heuristic-A"),
    pytest.param(cudnn_attention.Settings(deterministic=True), id="deterministic"),
]


@pytest.mark.parametrize("chosen", SETTINGS_CASES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_cudnn_settings_match_the_composition(chosen, layout, restored_settings):
    """Every setting the probe compares gives the composition's values and gradients, and the
    library steps really were built with it."""
    from accy.backends.base import CACHE

    _cudnn_or_skip()
    cudnn_attention.configure(chosen)
    CACHE.clear()  # an executable compiled earlier keeps the settings it was built with
    options = dict(causal=True, loss=True)
    p, specs = _program(bf16, LAYOUTS[layout], **options)
    inputs = _inputs(specs, bf16, seed=4)
    executable = accy.compile(accy.value_and_grad(p, wrt=(0, 1, 2)), device="cuda")
    symbols = _library_steps(executable)
    assert len(symbols) == 2, cudnn_attention.decline_reasons()
    for symbol in symbols:
        assert executable.compiled.externals[symbol].library.problem.settings == chosen
    reference = accy.value_and_grad(
        _as_f64_program(_program, LAYOUTS[layout], **options), wrt=(0, 1, 2)
    )
    expected = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    for name, g, e in zip(["loss", "dq", "dk", "dv"], executable(*inputs), expected, strict=True):
        _close(_host(g), np.asarray(e), bf16, f"{name} with {chosen}")


def test_a_long_sequence_over_few_heads_is_composed_when_asked(restored_settings):
    """One head of 2,048 tokens (the `attention` workload at its GPU scale) makes 16 of cuDNN's
    128-row blocks on a GPU of 132 SMs: cuDNN takes it by default (faster than the
    composition on the H200), and with `min_blocks=64` it is composed, the decline saying
    why. Many heads (GPT-2 small) or short sequences stay with cuDNN either way."""
    s = Signature(("token", "dim"), ("key", "dim"), ("key", "dim"), causal=True)
    q, kv = spec(bf16, token=2048, dim=64), spec(bf16, key=2048, dim=64)
    assert cudnn_attention.describe(s, "forward", [q, kv, kv]).b == 1
    cudnn_attention.configure(cudnn_attention.Settings(min_blocks=64))
    with pytest.raises(cudnn_attention.Decline, match="16 blocks of 128 rows, fewer than"):
        cudnn_attention.describe(s, "forward", [q, kv, kv])
    wide = Signature(*(("batch", "head", ax, "dim") for ax in ("token", "key", "key")))
    many = [spec(bf16, batch=8, head=12, **{ax: 1024}, dim=64) for ax in ("token", "key", "key")]
    assert cudnn_attention.describe(wide, "forward", many).h == 12
    short = [
        spec(bf16, token=512, dim=64),
        spec(bf16, key=512, dim=64),
        spec(bf16, key=512, dim=64),
    ]
    assert cudnn_attention.describe(s, "forward", short).q[-1] == 1


def test_one_long_head_is_cut_into_query_chunks_without_a_causal_mask():
    """A single head of 2,048 queries runs as 16 query heads of 128 rows sharing the key and
    value head; the graph's tensors view the same memory (the chunks are consecutive rows)."""
    q, kv = spec(bf16, token=2048, dim=64), spec(bf16, key=2048, dim=64)
    bias = spec(bf16, token=2048, key=2048)
    s = Signature(("token", "dim"), ("key", "dim"), ("key", "dim"), ("token", "key"))
    p = cudnn_attention.describe(s, "backward", [q, kv, kv, bias])
    assert p.chunks == 16
    dims = p.graph_dims()
    assert dims["q"] == ([1, 16, 128, 64], [p.q[0], 128 * 64, 64, 1])
    assert dims["k"][0] == [1, 1, 2048, 64]
    assert dims["bias"] == ([1, 16, 128, 2048], [p.bias[0][1], 128 * 2048, 2048, 1])
    assert dims["stats"] == ([1, 16, 128, 1], [2048, 128, 1, 1])
    causal = Signature(("token", "dim"), ("key", "dim"), ("key", "dim"), causal=True)
    assert cudnn_attention.describe(causal, "backward", [q, kv, kv]).chunks == 1


@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_query_chunks_match_the_composition(with_bias):
    """Forward and gradients of one head of 512 tokens (4 query chunks) against float64."""
    _cudnn_or_skip()
    q, kv = spec(bf16, token=512, dim=64), spec(bf16, key=512, dim=64)
    specs = [q, kv, kv] + ([spec(bf16, token=512, key=512)] if with_bias else [])

    def program(dtype):
        typed = [t.with_dtype(dtype) for t in specs]

        def body(b, args):
            out = accy.nn.attention(*args[:3], bias=args[3] if with_bias else None)
            weights = np.linspace(-1, 1, out.ty.size).reshape(out.ty.extents)
            w = b.constant(weights, accy.spec(f32, dict(out.ty.named_extents)))
            return (out.convert(f32) * w).sum(("token", "dim"))

        return accy.value_and_grad(accy.trace.define("chunks", typed, body), wrt=(0, 1, 2))

    inputs = _inputs(specs, bf16, seed=5)
    executable = accy.compile(program(bf16), device="cuda")
    steps = _library_steps(executable)
    assert len(steps) == 2, cudnn_attention.decline_reasons()
    for symbol in steps:
        assert executable.compiled.externals[symbol].library.problem.chunks == 4
    expected = accy.reference.run(program(f64), [x.astype(np.float64) for x in inputs])
    for name, g, e in zip(["loss", "dq", "dk", "dv"], executable(*inputs), expected, strict=True):
        _close(_host(g), np.asarray(e), bf16, name)


# -- one stacked q/k/v operand (`nn.attention_qkv`) ----------------------------------------------

QKV_LAYOUTS = {
    "btphd": ("batch", "token", "part", "head", "dim"),  # a fused projection's output (GPT-2)
    "pbhtd": ("part", "batch", "head", "token", "dim"),
}


def _qkv_spec(dtype, layout, **extents):
    sizes = {**EXTENTS, "part": 3, **extents}
    return accy.spec(dtype, {a: sizes[a] for a in QKV_LAYOUTS[layout]})


def test_describe_reads_q_k_v_from_the_stacked_operand_in_place():
    from accy.attention.qkv import QkvSignature

    s = QkvSignature(QKV_LAYOUTS["btphd"], causal=True)
    qkv = _qkv_spec(bf16, "btphd")
    t, h, d = EXTENTS["token"], EXTENTS["head"], EXTENTS["dim"]
    for part in ("forward", "backward"):
        p = cudnn_attention.describe(s, part, [qkv])
        assert (p.b, p.h, p.tokens, p.keys, p.dim) == (2, 3, t, t, d)
        # q, k and v: rows 3 h d apart, heads d apart, entries h d apart along the part axis.
        assert p.q == p.k == p.v == (t * 3 * h * d, d, 3 * h * d, 1)
        assert p.part_stride == h * d
        assert p.operand_names == ["qkv"]
        pointers = {"q": 1000, "k": 1000 + 2 * h * d, "v": 1000 + 4 * h * d}  # bytes
        assert p.operand_pointers([1000]) == pointers
    # The backward writes dQ, dK and dV into d(qkv) as q, k and v lie in qkv.
    assert p.grads == p.q and p.gradient_offsets() == (0, h * d, 2 * h * d)
    assert p.o == (h * t * 72, t * 72, 72, 1)  # the forward's result as nn.attention's


def _fake_cudnn(monkeypatch):
    from accy.backends.cuda.cudnn import Built

    # A fresh cache of kernels: the fake steps must not outlive the test.
    monkeypatch.setattr(cudnn_attention, "planned", lambda problem: Built(None, {}, 0))
    monkeypatch.setattr(
        cudnn_attention, "_kernel", functools.cache(cudnn_attention._kernel.__wrapped__)
    )


def test_the_stacked_operand_is_neither_sliced_nor_assembled(monkeypatch):
    """value_and_grad of attention over a computed qkv on CUDA (compiled without a GPU, cuDNN's
    graphs faked): the forward step reads qkv where its producer wrote it, and the backward
    step's result is d(qkv) itself: neither the three slices before the forward that
    `nn.attention` on slices needs, nor the concatenation of dQ, dK and dV into d(qkv)."""
    from accy.backends.base import backend_for, compile_artifact
    from accy.backends.cuda.schedule import Library

    _fake_cudnn(monkeypatch)
    spec = _qkv_spec(bf16, "btphd", token=80, head=2)

    def program(stacked):
        def body(b, args):
            qkv = args[0] * args[0]  # computed: not the invocation's input
            if stacked:
                out = accy.nn.attention_qkv(qkv, causal=True)
            else:
                q, k, v = (qkv.slice("part", j, j + 1, 1).sum("part") for j in range(3))
                k, v = k.rename("token", "key"), v.rename("token", "key")
                out = accy.nn.attention(q, k, v, causal=True)
            out = out.convert(f32)
            return (out * out).sum(tuple(out.ty.axes))

        return accy.value_and_grad(accy.trace.define("p", [spec], body), wrt=(0,))

    def launched_before_the_forward(compiled) -> int:
        kinds = [type(a).__name__ for a in compiled.schedule.actions]
        return kinds.index("Library")

    def concatenates(compiled) -> int:
        ops = [op for step in compiled.plan.steps for op in (step.op, *step.fused) if op]
        return sum(op.kind == "concatenate" for op in ops)

    stacked, sliced = (compile_artifact(backend_for("cuda"), program(x), None) for x in (1, 0))
    forward, backward = (a for a in stacked.schedule.actions if isinstance(a, Library))
    assert stacked.externals[forward.symbol].library.problem.part_stride > 0
    assert forward.operands[0] in backward.operands  # qkv, read in place by both
    assert launched_before_the_forward(stacked) == 1  # x * x, written where cuDNN reads it
    assert launched_before_the_forward(sliced) == 4  # x * x, then q, k and v copied out
    assert concatenates(stacked) == 0 and concatenates(sliced) == 1


@pytest.mark.parametrize("dtype", [bf16, f16], ids=["bf16", "f16"])
@pytest.mark.parametrize("layout", list(QKV_LAYOUTS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cudnn_stacked_qkv_matches_the_composition(dtype, layout, causal):
    """Forward and d(qkv) through cuDNN reading the stacked operand in place, against the
    float64 composition on the same rounded inputs."""
    _cudnn_or_skip()
    spec = _qkv_spec(dtype, layout)

    def program(dt):
        def body(b, args):
            out = accy.nn.attention_qkv(args[0], causal=causal)
            out = out.transpose("batch", "head", "token", "dim")
            weights = np.linspace(-1, 1, out.ty.size).reshape(out.ty.extents)
            w = b.constant(weights, accy.spec(f32, dict(out.ty.named_extents)))
            return (out.convert(f32) * w).sum(("batch", "head", "token", "dim"))

        typed = spec.with_dtype(dt)
        return accy.value_and_grad(accy.trace.define("qkv", [typed], body), wrt=(0,))

    (x,) = _inputs([spec], dtype, seed=6)
    executable = accy.compile(program(dtype), device="cuda")
    steps = _library_steps(executable)
    assert len(steps) == 2, cudnn_attention.decline_reasons()
    for symbol in steps:
        assert executable.compiled.externals[symbol].library.problem.part_stride > 0
    expected = accy.reference.run(program(f64), [x.astype(np.float64)])
    for name, g, e in zip(["loss", "dqkv"], executable(x), expected, strict=True):
        _close(_host(g), np.asarray(e), dtype, name)


# -- grouped-query attention (`group_axes`) ------------------------------------------------------

GROUPED = {
    "bshgd": (("batch", "token", "head", "group", "dim"), ("batch", "key", "head", "dim")),
    "bhgsd": (("batch", "head", "group", "token", "dim"), ("batch", "head", "key", "dim")),
}


def _grouped_specs(dtype, layout, group=4):
    q_axes, k_axes = GROUPED[layout]
    sizes = {**EXTENTS, "head": 2, "group": group}
    return [accy.spec(dtype, {a: sizes[a] for a in axes}) for axes in (q_axes, k_axes, k_axes)]


def test_describe_reads_fewer_key_value_heads_in_place():
    from accy.attention.grouped import GroupedSignature, backward_type

    q_axes, k_axes = GROUPED["bshgd"]
    s = GroupedSignature(q_axes, k_axes, k_axes, ("group",), causal=True)
    q, k, v = _grouped_specs(bf16, "bshgd")
    t, d = EXTENTS["token"], EXTENTS["dim"]
    p = cudnn_attention.describe(s, "backward", [q, k, v])
    assert (p.b, p.h, p.kv_heads, p.key_heads) == (2, 8, 2, 2)  # query heads (head, group)
    assert p.q == (t * 8 * d, d, 8 * d, 1) and p.k == p.v == (t * 2 * d, d, 2 * d, 1)
    # dQ, dK and dV one after another in each batch entry's block of the result.
    block = (q.size + k.size + v.size) // 2
    assert backward_type(s, q, k, v).named_extents == (("batch", 2), ("dim", block))
    assert p.gradient_layout == (
        (0, (block, d, 8 * d, 1)),
        (t * 8 * d, (block, d, 2 * d, 1)),
        (t * 8 * d + t * 2 * d, (block, d, 2 * d, 1)),
    )
    assert p.result_size == 2 * block
    dims = p.graph_dims()
    assert dims["k"][0] == [2, 2, t, d] and dims["dv"] == ([2, 2, t, d], [block, d, 2 * d, 1])


def test_describe_declines_groups_outside_the_query_heads():
    """cuDNN shares a key/value head among consecutive query heads: the group axes must be
    the innermost of the query's head dims."""
    from accy.attention.grouped import GroupedSignature

    q_axes = ("batch", "token", "group", "head", "dim")
    k_axes = ("batch", "key", "head", "dim")
    s = GroupedSignature(q_axes, k_axes, k_axes, ("group",))
    sizes = {**EXTENTS, "group": 4}
    types = [accy.spec(bf16, {a: sizes[a] for a in axes}) for axes in (q_axes, k_axes, k_axes)]
    with pytest.raises(cudnn_attention.Decline, match="not the innermost of the query's head"):
        cudnn_attention.describe(s, "forward", types)


@pytest.mark.parametrize("dtype", [bf16, f16], ids=["bf16", "f16"])
@pytest.mark.parametrize("layout", list(GROUPED))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cudnn_grouped_query_attention_matches_the_composition(dtype, layout, causal):
    """Forward, dQ and the per-key/value-head dK and dV through cuDNN's grouped-query
    attention, against the float64 composition of the broadcast operands."""
    _cudnn_or_skip()
    specs = _grouped_specs(dtype, layout)

    def program(dt):
        def body(b, args):
            out = accy.nn.attention(*args, causal=causal, group_axes="group")
            out = out.transpose("batch", "head", "group", "token", "dim")
            weights = np.linspace(-1, 1, out.ty.size).reshape(out.ty.extents)
            w = b.constant(weights, accy.spec(f32, dict(out.ty.named_extents)))
            return (out.convert(f32) * w).sum(tuple(out.ty.axes))

        typed = [t.with_dtype(dt) for t in specs]
        return accy.value_and_grad(accy.trace.define("gqa", typed, body), wrt=(0, 1, 2))

    inputs = _inputs(specs, dtype, seed=7)
    executable = accy.compile(program(dtype), device="cuda")
    steps = _library_steps(executable)
    assert len(steps) == 2, cudnn_attention.decline_reasons()
    for symbol in steps:
        assert executable.compiled.externals[symbol].library.problem.kv_heads == 2
    expected = accy.reference.run(program(f64), [x.astype(np.float64) for x in inputs])
    for name, g, e in zip(["loss", "dq", "dk", "dv"], executable(*inputs), expected, strict=True):
        _close(_host(g), np.asarray(e), dtype, name)


def _play_cudnn(p, operands: list[np.ndarray], packed_size: int, result_size: int, dpacked):
    """cuDNN played by NumPy through what `Issuer.issue` gives it: the graph's dims and
    strides (`Problem.graph_dims`), the operands' addresses (`Problem.operand_pointers`) and
    the gradients' offsets; query head j shares key/value head j // (h / h_kv). Returns the
    forward's result (O and hi, lo as `split_stats` writes them) and the backward's."""
    base = 1 << 40  # operand i's address: (i + 1) << 40, so that its index can be read back
    pointers = p.operand_pointers([(i + 1) * base for i in range(len(operands))])
    dims = p.graph_dims()

    def view(name, flat, address=None):
        address = pointers[name] if address is None else address
        shape, strides = dims[name]
        return _strided(flat, shape, strides, (address % base) // 2)

    flat = {n: operands[pointers[n] // base - 1].reshape(-1).astype(np.float64) for n in "qkv"}
    q, k, v = (view(n, flat[n]) for n in "qkv")
    share = p.h // p.key_heads
    k, v = (np.repeat(x, share, axis=1) for x in (k, v))
    scores = np.einsum("bhsd,bhtd->bhst", q, k) * p.scale
    if p.causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    stats = np.log(np.exp(scores - top).sum(-1)) + top[..., 0]
    probabilities = np.exp(scores - stats[..., None])
    packed = np.zeros(packed_size, np.float64)
    view("o", packed, 0)[...] = np.einsum("bhst,bhtd->bhsd", probabilities, v)
    rows = packed.reshape(p.rows, p.packed_row)
    rows[:, p.dim] = stats.reshape(-1).astype(bf16.numpy).astype(np.float64)
    rows[:, p.dim + 1] = stats.reshape(-1) - rows[:, p.dim]
    packed = packed.astype(bf16.numpy)
    o = view("o", packed.astype(np.float64), 0)
    do = view("o", dpacked.reshape(-1).astype(np.float64), 0)
    lse = packed.astype(np.float64).reshape(p.rows, p.packed_row)[:, p.dim : p.dim + 2].sum(-1)
    prob = np.exp(scores - lse.reshape(stats.shape)[..., None])
    ds = prob * (np.einsum("bhsd,bhtd->bhst", do, v) - (do * o).sum(-1)[..., None])
    grads = {
        "dq": np.einsum("bhst,bhtd->bhsd", ds, k) * p.scale,
        "dk": np.einsum("bhst,bhsd->bhtd", ds, q) * p.scale,
        "dv": np.einsum("bhst,bhsd->bhtd", prob, do),
    }
    for name in ("dk", "dv"):  # summed over the query heads sharing each key/value head
        b, _, t, d = grads[name].shape
        grads[name] = grads[name].reshape(b, p.key_heads, share, t, d).sum(2)
    result = np.zeros(result_size, np.float64)
    for (name, value), offset in zip(grads.items(), p.gradient_offsets(), strict=True):
        shape, strides = dims[name]
        _strided(result, shape, strides, offset)[...] = value
    return packed, result


def _grouped_case(layout):
    from accy.attention.grouped import GroupedSignature, grouped_records_for

    q_axes, k_axes = GROUPED[layout]
    s = GroupedSignature(q_axes, k_axes, k_axes, ("group",), causal=True)
    sizes = {"batch": 2, "head": 2, "group": 3, "token": 24, "key": 24, "dim": 16}
    types = [accy.spec(bf16, {a: sizes[a] for a in axes}) for axes in (q_axes, k_axes, k_axes)]
    return s, types, grouped_records_for(s)


def _stacked_case(layout):
    from accy.attention.qkv import QkvSignature, qkv_records_for

    s = QkvSignature(QKV_LAYOUTS[layout], causal=True)
    sizes = {"batch": 2, "head": 3, "part": 3, "token": 24, "dim": 16}
    return s, [accy.spec(bf16, {a: sizes[a] for a in QKV_LAYOUTS[layout]})], qkv_records_for(s)


@pytest.mark.parametrize(
    "case", [("grouped", x) for x in GROUPED] + [("stacked", x) for x in QKV_LAYOUTS], ids=str
)
def test_grouped_and_stacked_problems_map_the_results_where_the_records_keep_them(case):
    """Without a GPU: cuDNN played by NumPy through the grouped and stacked problems' dims,
    strides and offsets, against the records' references (as for `nn.attention`'s above)."""
    kind, layout = case
    s, types, records = (_grouped_case if kind == "grouped" else _stacked_case)(layout)
    operands = _inputs(types, bf16, seed=10)
    fwd = cudnn_attention.describe(s, "forward", types)
    bwd = cudnn_attention.describe(s, "backward", types)
    assert fwd.chunks == 1 and (kind == "stacked") == (fwd.part_stride > 0)
    assert (kind == "grouped") == (fwd.kv_heads > 0)
    forward_type = records.forward.result_type(*types)
    expected = records.forward.reference(*operands)
    dpacked = _inputs([forward_type], bf16, seed=11)[0]
    dpacked[..., fwd.dim :] = 0  # no cotangent of the logsumexp
    result_type = records.backward.result_type(*types, forward_type, forward_type)
    packed, result = _play_cudnn(bwd, operands, forward_type.size, result_type.size, dpacked)
    packed = packed.reshape(forward_type.extents)
    _close(packed.astype(np.float64), expected.astype(np.float64), bf16, "packed")
    reference = records.backward.reference(*operands, packed, dpacked)
    got = result.reshape(result_type.extents)
    _close(got, np.asarray(reference).astype(np.float64), bf16, "gradients")
