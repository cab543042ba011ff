"""Every kind in bf16 and f16, on the native CPU backend against the reference evaluator, with
tolerances derived from the formats.

Each f32 program of `kind_programs` (which together cover every kind and every step of the
plan) is retyped to the 16-bit float (`promote_floats`), so that every float operation runs in
bf16 or f16: computed in float32, rounded once per operation, sums accumulated in float32.

The tolerance. Both sides round at exactly the same places, so an elementwise result is equal
bit for bit. Only float32 sums (reductions, contractions, scatter-adds) may differ, in their
last float32 bits, with the order of addition; such a difference changes the 16-bit result only
where it crosses a rounding boundary, and then by one unit in the last place: 2^-7 relative for
bf16 (8 significant bits: unit roundoff 2^-8, ulp 2^-7) and 2^-10 for f16 (11 bits). The
programs chain at most four operations after a sum, each well conditioned on these inputs (an
operation of condition number c carries a relative difference d into c * d plus its own
rounding, which both sides share), so `rtol = 4 ulp`: 2^-5 for bf16, 2^-8 for f16; `atol` is
the same multiple of an ulp at 1 (the scale of the inputs), for results that cancel to near
zero. This is derived, not loosened until green: a missing rounding or a sum in 16 bits
(errors of sqrt(n) ulps and more) fails it.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import accy
from accy import bf16, f16, f32
from accy.transforms.retype import promote_floats

from ..halves import comparable
from .kind_programs import CASES

ULP = {bf16: 2.0**-7, f16: 2.0**-10}
CHAIN = 4  # operations after a sum whose rounding may differ (see the module doc)


def _float32_cases():
    for case in CASES:
        program = case.build()
        types = (*program.parameter_types, *program.output_types)
        if any(t.dtype == f32 for t in types) and all(
            t.dtype in (f32,) or not t.dtype.is_float for t in types
        ):
            yield case


CASES_F32 = list(_float32_cases())


@pytest.mark.parametrize("dtype", [bf16, f16], ids=str)
@pytest.mark.parametrize("case", CASES_F32, ids=lambda case: case.name)
def test_every_kind_in_half_precision_matches_the_reference_on_the_cpu(native_cpu, case, dtype):
    program = promote_floats(case.build(), dtype)
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    with np.errstate(over="ignore"):
        inputs = [
            np.asarray(x).astype(t.dtype.numpy)
            for x, t in zip(case.inputs(rng, case.build()), program.parameter_types, strict=True)
        ]
    expected = accy.reference.run(program, inputs)
    got = accy.compile(program, device="cpu")(*inputs)
    tolerance = CHAIN * ULP[dtype]
    for position, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype == program.output_types[position].dtype.numpy
        np.testing.assert_allclose(
            comparable(g),
            comparable(e),
            rtol=tolerance,
            atol=tolerance,
            equal_nan=True,
            err_msg=f"output {position}",
        )
