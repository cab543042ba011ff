"""`bench/attention_probe.py`'s pure-Python parts (FLOP counts, options, the table); its GPU
parts need PyTorch with CUDA and say so without one."""

from __future__ import annotations

import pytest

from bench import attention_probe as probe
from bench.flash_attention import flops


def test_flop_counts_split_the_issue_formula_into_forward_and_backward():
    for causal in (False, True):
        forward, backward = probe.flop_counts(8, 12, 1024, 64, causal)
        assert forward + backward == pytest.approx(flops(8, 12, 1024, 64, causal))
        assert backward == pytest.approx(2.5 * forward)
        assert forward == pytest.approx(4 * 8 * 12 * 1024**2 * 64 / (2 if causal else 1))
    assert probe.tflops(1e12, 1.0) == 1000.0 and probe.tflops(1e12, None) is None


def test_defaults_are_gpt2_small_and_every_section_and_variant():
    a = probe.parse_args([])
    shape = (a.batch, a.heads, a.tokens, a.dim, a.causal, a.dtype)
    assert shape == (8, 12, 1024, 64, True, "bf16")
    assert a.sections == probe.SECTIONS
    assert a.variants == tuple(v.name for v in probe.VARIANTS)
    assert a.repeats >= probe.MIN_REPEATS


@pytest.mark.parametrize(
    "argv, why",
    [
        (["--sections", "torch,jax"], "unknown section jax; known: torch, cudnn, plans, accy"),
        (["--variants", "accy,fast"], "unknown variant fast"),
        (["--sections", ","], r"unknown section \(none given\)"),
    ],
)
def test_unknown_names_are_refused_with_the_known_ones(argv, why):
    with pytest.raises(SystemExit, match=why):
        probe.parse_args(argv)


@pytest.mark.parametrize("argv", [["--repeats", "10"], ["--inner", "0"], ["--tokens", "0"]])
def test_too_few_repeats_or_empty_shapes_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        probe.parse_args(argv)
    assert "must be" in capsys.readouterr().err


def test_each_variant_differs_from_accys_configuration_and_names_are_unique():
    baseline, *others = probe.VARIANTS
    assert baseline.name == "accy"
    fields = ("layout", "mask", "heuristics", "replay_statement", "deterministic")
    for variant in others:
        assert any(getattr(variant, f) != getattr(baseline, f) for f in fields), variant.name
    assert len({v.name for v in probe.VARIANTS}) == len(probe.VARIANTS)


def test_accy_settings_of_the_probe_are_valid_settings():
    from dataclasses import asdict

    from accy.attention import cuda

    for _, changes in probe.ACCY_SETTINGS:
        cuda._check_settings(cuda.Settings(**{**asdict(cuda.Settings()), **changes}))


def test_strides_describe_bhsd_and_bshd_memory_orders():
    b, h, s, d = 2, 3, 5, 4
    assert probe._strides("bhsd", b, h, s, d) == [h * s * d, s * d, d, 1]
    bshd = probe._strides("bshd", b, h, s, d)
    # element (b, h, s, d) of a (b, s, h, d) row-major array
    assert bshd == [s * h * d, d, h * d, 1]


def test_finish_and_table_report_tflops_of_what_each_row_timed():
    a = probe.parse_args([])
    forward, backward = probe.flop_counts(8, 12, 1024, 64, True)
    rows = probe.finish(
        [
            {"variant": "both", "fwd_ms": 0.1, "bwd_ms": 0.3, "both_ms": 0.5},
            {"variant": "parts", "fwd_ms": 0.1, "bwd_ms": 0.3},
            {"variant": "backward plan 0", "bwd_ms": 0.3},
            {"variant": "failed", "status": "failed: no cudnn"},
        ],
        a,
    )
    assert rows[0]["tflops"] == probe.tflops(forward + backward, 0.5)
    assert rows[1]["tflops"] == probe.tflops(forward + backward, 0.4)
    assert rows[2]["tflops"] == probe.tflops(backward, 0.3)
    assert "tflops" not in rows[3]
    lines = probe.table(rows).splitlines()
    assert lines[0].startswith("variant | fwd ms | bwd ms | fwd+bwd ms | TFLOP/s")
    assert lines[4] == "failed | - | - | - | - | - | - | failed: no cudnn"


def test_without_a_gpu_the_probe_says_what_it_needs(capsys):
    # Without PyTorch (the test extra has none) or without a CUDA device, the probe says so.
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        pytest.skip("cuda gate: a CUDA device is present, so the probe would run")
    assert probe.main(["--sections", "torch"]) == 1
    assert "needs PyTorch with a CUDA device" in capsys.readouterr().out
