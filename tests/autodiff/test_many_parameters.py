"""Differentiating with respect to many parameter arrays (a model's every weight) costs time
linear in their number: 10^4 parameters trace and differentiate in seconds."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.core import Program
from accy.trace import define


def weighted_sum(count: int) -> Program:
    """sum_i sum_a (i + 1) * p_i[a] over `count` parameters of two elements each."""

    def body(b, args):
        total = args[0].sum("a")
        for i, p in enumerate(args[1:], start=1):
            total = total + (p * float(i + 1)).sum("a")
        return total

    return define("weighted_sum", [spec(f32, a=2)] * count, body)


def type_lookups(monkeypatch, program: Program) -> int:
    """How many times differentiating `program` with respect to all its parameters looks up a
    value's type."""
    calls = 0
    looked_up = Program.type_of

    def counting(self, value):
        nonlocal calls
        calls += 1
        return looked_up(self, value)

    monkeypatch.setattr(Program, "type_of", counting)
    accy.grad(program, wrt=tuple(range(len(program.parameters))))
    monkeypatch.setattr(Program, "type_of", looked_up)
    return calls


@pytest.mark.slow
def test_the_work_of_differentiating_grows_linearly_with_the_parameters(monkeypatch):
    small, large = weighted_sum(30), weighted_sum(120)
    ratio = type_lookups(monkeypatch, large) / type_lookups(monkeypatch, small)
    assert ratio < 6, f"4x the parameters, {ratio:.1f}x the type lookups"


@pytest.mark.slow
def test_ten_thousand_parameters_trace_and_differentiate():
    count = 10_000
    program = weighted_sum(count)
    gradients = accy.reference.run(
        accy.grad(program, wrt=tuple(range(count))), [np.ones(2, np.float32)] * count
    )
    expected = np.repeat(np.arange(1, count + 1, dtype=np.float32)[:, None], 2, axis=1)
    np.testing.assert_array_equal(np.stack(gradients), expected)
