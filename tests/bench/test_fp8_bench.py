"""`bench.fp8` at a small scale on the CPU: its GEMM section's products against NumPy, its
training-step section's losses FP8 against bf16, and the JSON it writes (no timing is checked)."""

from __future__ import annotations

import json

import pytest

from bench import fp8


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(fp8, "TOKENS", 32)
    monkeypatch.setattr(fp8, "GEMMS", {"gpt2": {"mlp_up": (32, 64), "head": (32, 48)}})
    monkeypatch.setattr(fp8, "REPLICAS", 2)
    config = fp8.models.gpt2.Config(vocab=64, positions=16, embed=32, layers=1, heads=2)
    monkeypatch.setattr(fp8, "gpt2_config", lambda: config)


@pytest.mark.slow
def test_gemm_section_products_are_right(small):
    rows = fp8.gemm_section("cpu", repeats=2)
    assert sorted(rows) == ["head", "mlp_up"]
    for row in rows.values():
        assert row["bf16"]["relative_error"] < 0.01  # bf16 operands and result
        assert row["fp8"]["relative_error"] < 0.08  # E4M3 operands, per-tensor scales
        assert row["fp8"]["median_ms"] > 0 and row["speedup"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2", "llama1b"])
def test_step_section_trains_alike_with_fp8_on(small, monkeypatch, model):
    import dataclasses

    from bench import llama1b

    tiny = dataclasses.replace(llama1b.SCALES["check"], batch=2, tokens=16)
    monkeypatch.setitem(llama1b.SCALES, "cuda", tiny)  # 32 tokens a step, as TOKENS
    result = fp8.step_section("cpu", steps=2, model=model)
    assert result["model"] == model and result["groups"] == ["mlp", "head"]
    bf16, with_fp8 = result["bf16"]["losses"], result["fp8"]["losses"]
    assert len(bf16) == len(with_fp8) == 3
    assert all(abs(a - b) < 0.02 * a for a, b in zip(bf16, with_fp8, strict=True))


def test_main_writes_the_sections_it_ran(small, tmp_path):
    out = tmp_path / "fp8.json"
    assert fp8.main(["--sections", "gemms", "--repeats", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and "gemms" in report and "step" not in report
    assert report["machine_before"]["load_average"] is not None
