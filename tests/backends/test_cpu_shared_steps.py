"""Steps of a CPU program that differ only in their buffers (a model's layers) are one C
function called with each step's pointers (`accy.backends.cpu.source.Translation`); steps that
compute something else (another constant) keep functions of their own, and the
program computes what NumPy does."""

import re

import numpy as np

import accy
from accy.backends.cpu.compile import compile_program
from accy.backends.cpu.executable import CpuExecutable
from accy.backends.cpu.source import in_order_of_use
from accy.codegen.c.expressions import numbered_locally


def layers(scales: tuple[float, ...], width: int = 32, squared: bool = False):
    """Per scale s_k, a layer x <- centred(tanh(s_k * x.w_k)), each a GEMM then loops: the same
    steps on other buffers when the scales are equal; `squared`: the sum of x's squares."""
    types = [accy.spec(accy.f32, row=8, embed=width)]
    types += [accy.spec(accy.f32, embed=width, hidden=width)] * len(scales)

    def stack(builder, args):
        x, *weights = args
        for scale, w in zip(scales, weights, strict=True):
            x = (x.contract(w, "embed") * scale).tanh().rename("hidden", "embed")
            x = x - x.mean("embed")
        return (x * x).sum() if squared else x

    return accy.trace.define("layers", types, stack)


def step_functions(source: str) -> list[str]:
    return re.findall(r"ACCY_PART == \d\nACCY_STEP void (\w+)\(", source)


def calls(source: str) -> list[str]:
    run = source[source.index("void accy_run(") :]
    return re.findall(r"^  (accy_step\d+)\(", run, flags=re.M)


def numpy_layers(x, weights, scales):
    x = x.astype(np.float64)
    for scale, w in zip(scales, weights, strict=True):
        x = np.tanh(scale * (x @ w))
        x = x - x.mean(1, keepdims=True)
    return x


def inputs(seed: int, layers: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 32), np.float32)
    return x, [(rng.standard_normal((32, 32)) / 6).astype(np.float32) for _ in range(layers)]


def test_layers_that_differ_only_in_buffers_share_functions():
    scales = (0.5, 0.5, 0.5)
    compiled = compile_program(layers(scales))
    called = calls(compiled.source)
    # each function defined once, and the three layers' steps are fewer than half as many
    assert sorted(step_functions(compiled.source)) == sorted(set(called))
    assert len(set(called)) <= len(called) // 2
    x, weights = inputs(0, 3)
    (out,) = CpuExecutable(compiled)(x, *weights)
    np.testing.assert_allclose(out, numpy_layers(x, weights, scales), rtol=1e-4, atol=1e-5)


def test_steps_with_other_constants_keep_their_own_functions():
    same = calls(compile_program(layers((0.5, 0.5, 0.5))).source)
    compiled = compile_program(layers((0.5, 2.0, 0.5)))
    other = calls(compiled.source)
    assert len(set(other)) > len(set(same))  # the middle layer scales by its own constant
    assert other[0] == same[0]  # the first layer's steps are still the shared ones
    x, weights = inputs(1, 3)
    (out,) = CpuExecutable(compiled)(x, *weights)
    expected = numpy_layers(x, weights, (0.5, 2.0, 0.5))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_a_gradient_with_shared_steps_matches_the_reference():
    program = accy.value_and_grad(layers((0.5, 0.5, 0.5), squared=True), wrt=(1, 2, 3))
    compiled = compile_program(program)
    assert len(step_functions(compiled.source)) < len(calls(compiled.source))
    x, weights = inputs(2, 3)
    native = CpuExecutable(compiled)(x, *weights)
    reference = accy.reference.run(program, [x, *weights])
    for a, b in zip(native, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_local_names_are_numbered_per_family_in_order_of_first_use():
    text = "float *restrict v9, const float *restrict v3) {\n  const float t40 = v3[i] + t7;"
    assert numbered_locally(text) == (
        "float *restrict v0, const float *restrict v1) {\n  const float t0 = v1[i] + t1;"
    )
    # file-scope names (the unit's prefix) and library functions keep theirs
    assert numbered_locally("accy_constant12[j4] + expm1(t3) + log1p(t3)") == (
        "accy_constant12[j0] + expm1(t0) + log1p(t0)"
    )


def test_parameters_are_ordered_by_first_use():
    params = [("const float *restrict v2", "x"), ("float *restrict v1", "y"), ("int *v12", "z")]
    body = "  v1[i] = v2[i] + v1[i];\n"  # v12 unused: last; v1 is not a prefix match of v12
    assert in_order_of_use(params, body) == [params[1], params[0], params[2]]
