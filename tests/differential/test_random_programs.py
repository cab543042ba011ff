"""Random programs: backends agree, gradients match finite differences, layout does not matter.

Example counts come from the Hypothesis profile (tests/differential/conftest.py): bounded and
derandomized in CI, more with ACCY_PROPERTY_EXAMPLES=N.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

import accy
from accy.testing import check_grads

from ..executors import available_backends
from .programs import REFERENCE_CUSTOM_CALLS, recipes, scalarized, triple_kernels

# Every example compiles a program natively (about half a second), so this property runs fewer
# examples than the reference-only ones unless ACCY_PROPERTY_EXAMPLES asks for more.
KERNEL_FORMATS = {"cpu": "cpu_object", "cuda": "cuda_ptx"}
OTHER_BACKENDS = [
    (name, {"native_cpu": "cpu", "native_cuda": "cuda"}[name])
    for name, _ in available_backends()
    if name != "reference"
]


def _backend_examples() -> int:
    return int(os.environ.get("ACCY_PROPERTY_EXAMPLES", "12"))


def _as_common_layout(array, axes, order):
    return np.transpose(array, [axes.index(a) for a in order])


@pytest.mark.slow
@given(recipes(), st.randoms(use_true_random=False))
def test_permuting_input_layouts_does_not_change_named_results(recipe, random):
    program = recipe.trace()
    note(str(program))
    (expected,) = accy.reference.run(program, recipe.inputs(), REFERENCE_CUSTOM_CALLS)
    orders = [tuple(random.sample(axes, len(axes))) for axes in recipe.parameters]
    permuted = recipe.trace(orders)
    (got,) = accy.reference.run(permuted, recipe.inputs(orders), REFERENCE_CUSTOM_CALLS)
    out_axes = program.output_types[0].axes
    got = _as_common_layout(got, permuted.output_types[0].axes, out_axes)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.slow
@given(recipes(max_steps=5))
def test_gradients_of_random_programs_match_finite_differences(recipe):
    program = recipe.trace()
    # Custom calls are opaque: they differentiate only through user rules (tests/autodiff).
    assume(program.count("custom_call") == 0)
    loss = scalarized(program, recipe.seed)
    note(str(loss))
    # Finite differences mean nothing where the loss is not finite (max over an empty axis).
    assume(np.isfinite(accy.reference.run(loss, recipe.inputs())[0]))
    wrt = tuple(range(len(loss.parameters)))
    check_grads(loss, recipe.inputs(), wrt=wrt, order=1, eps=1e-6, atol=1e-5, rtol=1e-4)


@given(recipes(max_steps=5))
@settings(max_examples=_backend_examples())
def test_random_programs_agree_on_every_backend(recipe):
    program = recipe.trace()
    note(str(program))
    inputs = recipe.inputs()
    (expected,) = accy.reference.run(program, inputs, REFERENCE_CUSTOM_CALLS)
    for name, device in OTHER_BACKENDS:
        registry = triple_kernels(program, KERNEL_FORMATS[device])
        (got,) = accy.compile(program, device=device, kernel_call_registry=registry)(*inputs)
        got = got.get() if hasattr(got, "get") else got  # CuPy arrays come back from CUDA
        note(f"{name}: {got!r}")
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
