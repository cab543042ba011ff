"""The benchmark's half-precision side, without timing and without JAX or PyTorch: the bf16
workloads against float64 NumPy formulas, the FLOP counts against hand counts and against the
contractions of the differentiated programs, the bf16 tolerance rule, and the command line's
errors."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import accy
from bench import cli
from bench.compare import normwise_error, tolerance
from bench.runner import Options, SystemResult, WorkloadRun
from bench.worker import save_outputs
from bench.workloads import WORKLOADS, supporting
from tests.bench.test_bench_workloads import FORMULAS, executors

HALF = ("mlp", "attention", "block")
BF16 = np.dtype(ml_dtypes.bfloat16)


def contraction_flops(program: accy.Program) -> int:
    """2 x the multiply-adds of every dot_general in `program`: all of the left operand's
    elements times the right operand's free (neither contracted nor batch) extents."""
    total = 0
    for op in program.operations:
        if op.kind != "dot_general":
            continue
        left, right = (program.type_of(v) for v in op.operands)
        shared = set(op.attrs["rhs_contracting"]) | set(op.attrs["rhs_batch"])
        free = [n for i, n in enumerate(right.extents) if i not in shared]
        total += 2 * math.prod(left.extents) * math.prod(free)
    return total


def test_the_bf16_workloads_are_mlp_attention_block_and_conv():
    # conv's bf16 version is checked against JAX in tests/backends/test_conv_backends.py.
    assert supporting("bf16") == [*HALF, "conv"]
    assert supporting("f32") == list(WORKLOADS)


@pytest.mark.parametrize("name", HALF)
def test_bf16_inputs_are_the_f32_inputs_rounded(name):
    workload = WORKLOADS[name]
    single, half = workload.make_inputs("check", 5), workload.make_inputs("check", 5, "bf16")
    for a, b, t in zip(single, half, workload.types("check", "bf16"), strict=True):
        assert b.dtype == t.dtype.numpy == BF16
        np.testing.assert_array_equal(b, a.astype(BF16))


@pytest.mark.slow
@pytest.mark.parametrize("run", executors())
@pytest.mark.parametrize("name", HALF)
def test_accy_bf16_workload_matches_numpy_in_float64_within_the_bf16_tolerance(name, run):
    """The bf16 program against the float64 formula of the same (bf16) inputs: the loss is
    f32 (summed from f32 contractions), the gradients bf16."""
    workload = WORKLOADS[name]
    inputs = workload.make_inputs("check", seed=3, dtype="bf16")
    outputs = run(workload.value_and_grad("check", "bf16"), inputs)
    expected = FORMULAS[name](*[np.asarray(a, np.float64) for a in inputs])
    assert np.asarray(outputs[0]).dtype == np.float32
    for output_name, actual, wanted in zip(workload.output_names, outputs, expected, strict=True):
        if output_name != "loss":
            assert np.asarray(actual).dtype == BF16, output_name
        error = normwise_error(actual, wanted)
        assert error <= tolerance("bf16"), f"{name} {output_name}: {error:.2e}"


def test_a_workload_without_a_bf16_version_says_which_have_one():
    with pytest.raises(ValueError, match="'tiny' has no bf16 version.*mlp, attention, block"):
        WORKLOADS["tiny"].make_inputs("check", 0, "bf16")
    with pytest.raises(ValueError, match="unknown dtype 'f64'"):
        WORKLOADS["mlp"].types("check", "f64")


def test_flops_match_a_hand_count_at_the_check_scale():
    # mlp {batch 4, in 6, hidden 5, out 3}: x.w1 and the gradient of w1 (4*6*5 each), h.w2,
    # the gradients of w2 and h (4*5*3 each), 2 FLOPs per multiply-add.
    assert WORKLOADS["mlp"].flops_per_step("check") == 2 * (2 * 4 * 6 * 5 + 3 * 4 * 5 * 3) == 840
    # block {row 3, embed 4, ff 6}: six products of 3*4*6 multiply-adds.
    assert WORKLOADS["block"].flops_per_step("check") == 2 * 6 * 3 * 4 * 6 == 864
    # attention {token 5, channel 3}: FlashAttention's count, 2 products forward, 5 backward.
    assert WORKLOADS["attention"].flops_per_step("check") == 2 * 7 * 5 * 5 * 3 == 1050
    for name in ("tiny", "embedding", "elementwise"):
        assert WORKLOADS[name].flops_per_step("check") is None


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", ["mlp", "block"])
@pytest.mark.parametrize("scale", ["check", "cpu", "cuda"])
def test_flops_are_those_of_the_differentiated_programs_contractions(name, scale, dtype):
    workload = WORKLOADS[name]
    program = workload.value_and_grad(scale, dtype)
    assert contraction_flops(program) == workload.flops_per_step(scale)


def test_attention_flops_are_seven_sixths_of_its_contractions():
    """The composition computes 6 products (2 forward, 4 backward); FlashAttention's count
    adds the scores recomputed in the backward pass."""
    extents = WORKLOADS["attention"].extents("cuda")
    products = 6 * 2 * extents["token"] ** 2 * extents["channel"]
    assert WORKLOADS["attention"].flops_per_step("cuda") == products * 7 / 6


def test_the_bf16_tolerance_is_16_unit_roundoffs():
    assert tolerance("bf16") == 16 * 2.0**-8 == tolerance(BF16)
    assert tolerance(np.dtype(np.float16)) == 16 * 2.0**-11
    assert tolerance("f32") == tolerance(np.dtype(np.float32)) == pytest.approx(4 * 2.0**-11.5)


def test_the_bf16_tolerance_accepts_bf16_rounding_and_rejects_a_wrong_result():
    rng = np.random.default_rng(0)
    exact = rng.standard_normal(1000)
    rounded = exact
    for _ in range(8):  # eight roundings to bf16, each of a slightly changed value
        rounded = (rounded * (1 + 1e-3)).astype(BF16).astype(np.float64) / (1 + 1e-3)
    assert normwise_error(rounded, exact) <= tolerance("bf16")
    assert normwise_error(exact * 1.1, exact) > tolerance("bf16")  # 10% off: a bug
    assert normwise_error(rounded, exact) > tolerance("f32")  # not f32's accuracy


def test_bf16_outputs_are_saved_as_float32(tmp_path):
    values = np.array([1.0, 2.0**-8, -3.5], BF16)
    save_outputs(tmp_path / "o.npz", [values, np.arange(3, dtype=np.int32)])
    with np.load(tmp_path / "o.npz") as saved:
        assert saved["arr_0"].dtype == np.float32 and saved["arr_1"].dtype == np.int32
        np.testing.assert_array_equal(saved["arr_0"], values.astype(np.float32))


def _fake_check(tmp_path, workload, dtype: str, jax_scale: float) -> WorkloadRun:
    """A run whose accy and JAX check outputs are accy's reference, JAX's gradient of the
    second input multiplied by `jax_scale`."""
    options = Options(dtype=dtype, scale="check")
    run = WorkloadRun(workload, ["accy", "jax"], options, scratch=tmp_path)
    program, inputs = (
        workload.value_and_grad("check", dtype),
        workload.make_inputs("check", 0, dtype),
    )
    correct = accy.reference.run(program, inputs)
    for system, scale in (("accy", 1.0), ("jax", jax_scale)):
        run.result.systems[system] = SystemResult(system, backend="test")
        (tmp_path / system / "check").mkdir(parents=True)
        changed = [*correct[:2], np.asarray(correct[2], np.float32) * scale, *correct[3:]]
        save_outputs(tmp_path / system / "check" / "outputs.npz", changed)
        save_outputs(tmp_path / system / "check" / "check_outputs.npz", correct)
    return run


def test_a_bf16_run_checks_against_the_bf16_tolerance(tmp_path):
    mlp = WORKLOADS["mlp"]
    assert _fake_check(tmp_path / "close", mlp, "bf16", 1.03).systems_agree()  # 3%: rounding
    wrong = _fake_check(tmp_path / "wrong", mlp, "bf16", 1.5)
    assert not wrong.systems_agree()
    assert "on d/dw2: normwise error 3.33e-01 > tolerance 6.25e-02" in wrong.result.message
    strict = _fake_check(tmp_path / "f32", mlp, "f32", 1.03)  # 3% is far off in f32
    assert not strict.systems_agree()


def test_a_run_refuses_a_workload_without_the_dtype(tmp_path):
    with pytest.raises(ValueError, match="'embedding' has no bf16 version"):
        WorkloadRun(WORKLOADS["embedding"], ["accy"], Options(dtype="bf16"), scratch=tmp_path)


def test_cli_bf16_defaults_to_the_bf16_workloads_and_refuses_the_others():
    assert cli.chosen_workloads(None, "bf16") == [*HALF, "conv"]
    assert cli.chosen_workloads(None, "f32") == list(WORKLOADS)
    assert cli.chosen_workloads("block,mlp", "bf16") == ["block", "mlp"]
    message = "--dtype bf16: tiny, embedding have no bf16 version; the bf16 workloads are mlp"
    with pytest.raises(SystemExit, match=message):
        cli.chosen_workloads("tiny,mlp,embedding", "bf16")
    with pytest.raises(SystemExit, match="unknown workload mpl"):
        cli.chosen_workloads("mpl", "bf16")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--dtype", "f16"], "argument --dtype: invalid choice: 'f16'"),
        (["--scale", "huge"], "argument --scale: invalid choice: 'huge'"),
        (["--dtype", "bf16", "--workloads", "elementwise"], "elementwise has no bf16 version"),
        (["--workloads", "tiny", "--worker-timeout", "0"], "--worker-timeout must be positive"),
    ],
)
def test_cli_argument_errors_exit_before_running(argv, said, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert said in str(stopped.value.code) + capsys.readouterr().err


def test_the_default_json_names_the_dtype_and_a_scale_other_than_the_devices():
    assert cli.default_json("cuda", "f32", None).name == "cuda.json"
    assert cli.default_json("cuda", "bf16", None).name == "cuda-bf16.json"
    assert cli.default_json("cpu", "bf16", "check").name == "cpu-bf16-check.json"
    assert cli.default_json("cpu", "f32", "cpu").name == "cpu.json"


def test_the_gpt2_attention_preset_and_its_flops():
    from bench import flash_attention

    a = flash_attention.parse_args(["--device", "cuda", "--preset", "gpt2"])
    assert (a.batch, a.heads, a.tokens, a.dim, a.causal, a.dtype) == (8, 12, 1024, 64, True, "bf16")
    assert flash_attention.chosen_systems(a) == list(flash_attention.SYSTEMS)
    # 4·b·h·t²·d·(1 + 2.5), halved when causal: 8·12·1024²·64·7 = 45.1 GFLOP.
    assert flash_attention.flops(8, 12, 1024, 64, True) == 8 * 12 * 1024**2 * 64 * 7
    given = flash_attention.parse_args(["--preset", "gpt2", "--tokens", "128", "--no-causal"])
    assert (given.tokens, given.causal, given.heads) == (128, False, 12)
    assert "jax-cudnn" not in flash_attention.chosen_systems(given)  # cuda only
    with pytest.raises(SystemExit, match="unknown system jx; known: accy"):
        flash_attention.chosen_systems(flash_attention.parse_args(["--systems", "accy,jx"]))


def test_attention_outputs_are_checked_against_the_first_system(tmp_path):
    from bench import flash_attention

    rng = np.random.default_rng(0)
    outputs = [np.float32(3.0)] + [rng.standard_normal((2, 3)).astype(np.float32)] * 3
    saved = {name: tmp_path / f"{name}.npz" for name in ("accy", "jax", "torch")}
    np.savez(saved["accy"], *outputs)
    np.savez(saved["jax"], *[o * np.float32(1.01) for o in outputs])  # bf16 rounding
    np.savez(saved["torch"], *outputs[:3], -outputs[3])  # a wrong dv
    rows = [{"system": name, "status": "ok"} for name in saved]
    flash_attention.check_outputs(rows, saved, "bf16")
    assert "max_error" not in rows[0] and rows[1]["agrees"] and rows[1]["error_vs"] == "accy"
    assert not rows[2]["agrees"] and rows[2]["max_error_output"] == "d/dv"
    assert rows[2]["max_error"] == 2.0
