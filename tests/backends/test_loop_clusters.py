"""Flat loops over the same elements that other steps separate run next to each other where
the dependences allow (`accy.lower.plan._cluster_loops`, the GPU's `clusters_loops`), so that
grouping makes them one pass: SwiGLU's backward reads its activations once, and the reordered
plan computes the reference's values."""

from __future__ import annotations

import dataclasses

import numpy as np

import accy
from accy.backends.cpu import compile as cpu_compile
from accy.backends.cpu.executable import CpuExecutable
from accy.lower import build_plan
from accy.lower.target import CPU, GPU

CLUSTERING_CPU = dataclasses.replace(CPU, clusters_loops=True)


def swiglu_gradient(layers=2, batch=8, embed=16, hidden=32):
    """value_and_grad of sum(x * x) after a scan over residual SwiGLU layers, x + (silu(x wg) *
    (x wu)) wd, by the first x and the stacked weights. The backward scan computes silu(g) * u
    again for wd's gradient (it is not stacked), then, after the GEMM giving its gradient dp,
    dp * silu(g) and dp * u * silu'(g)."""
    types = [
        accy.spec(accy.f32, batch=batch, embed=embed),
        accy.spec(accy.f32, layer=layers, embed=embed, hidden=hidden),
        accy.spec(accy.f32, layer=layers, embed=embed, hidden=hidden),
        accy.spec(accy.f32, layer=layers, hidden=hidden, out=embed),
    ]

    def layer(b, a):
        x, wg, wu, wd = a
        g, u = x.contract(wg, "embed"), x.contract(wu, "embed")
        return [x + (g * g.logistic() * u).contract(wd, "hidden").rename("out", "embed")]

    def body(b, a):
        (x,), _ = b.scan(layer, carries=[a[0]], xs=list(a[1:]), axis="layer")
        return (x * x).sum()

    loss = accy.trace.define("swiglu", types, body)
    return accy.value_and_grad(loss, wrt=(0, 1, 2, 3))


def hidden_wide_passes(plan) -> list[int]:
    """For each flat step of the backward scan's body writing values over (batch, hidden): how
    many it writes."""
    body = [step.body for step in plan.steps if step.kind == "scan"][-1]
    passes = []
    for step in body.steps:
        wide = [v for v in step.writes if body.program.type_of(v).has("hidden")]
        if step.kind in ("loop", "group") and wide and body.program.type_of(wide[0]).has("batch"):
            passes.append(len(wide))
    return passes


def test_swiglu_backward_reads_its_activations_in_one_pass():
    program = swiglu_gradient()
    # Without clusters: silu(g) * u (and logistic(g), which the CPU stores) for wd's gradient,
    # then, after dp's GEMM, dp * silu(g) and dp * u * silu'(g).
    assert len(hidden_wide_passes(build_plan(program, CPU))) == 2
    assert hidden_wide_passes(build_plan(program, GPU)) == [3]


def test_the_reordered_plan_computes_the_reference_values(native_cpu, monkeypatch):
    program = swiglu_gradient()
    monkeypatch.setattr(cpu_compile, "build_plan", lambda p: build_plan(p, CLUSTERING_CPU))
    compiled = cpu_compile.compile_program(program)
    assert len(hidden_wide_passes(compiled.plan)) == 1
    rng = np.random.default_rng(0)
    types = program.parameter_types
    inputs = [(rng.standard_normal(t.extents) * 0.3).astype(np.float32) for t in types]
    got = CpuExecutable(compiled)(*inputs)
    want = accy.reference.run(program, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)
