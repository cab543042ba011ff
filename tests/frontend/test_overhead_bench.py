"""bench/frontend_overhead.py runs and reports every row and claim (a smoke run of a few calls:
speed is measured by the benchmark itself, never here)."""

from __future__ import annotations

import json

import pytest

import accy


def test_the_overhead_benchmark_reports_every_call_and_claim(capsys, tmp_path):
    from bench import frontend_overhead

    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")
    out = tmp_path / "overhead.json"
    assert frontend_overhead.main(["--number", "3", "--rounds", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert set(report["median_us"]) == set(report["best_us"]) == {name for name, *_ in _rows()}
    assert [c["claim"] for c in report["claims"]] == [c[0] for c in frontend_overhead.CLAIMS]
    for claim in report["claims"]:
        assert claim["claim"] in printed and claim["ratio"] > 0


def _rows():
    from bench import frontend_overhead

    return [(ours,) for _, ours, _, _ in frontend_overhead.CLAIMS] + [
        (theirs,) for _, _, theirs, _ in frontend_overhead.CLAIMS
    ]
