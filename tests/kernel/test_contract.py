"""The contract the backends link against: KernelCall's fields, check_call, the registry."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.codegen.c.dialect import GCC
from accy.core.types import f32, i32
from accy.kernel import KernelCallRegistry, Limits, dynamic_buffer, toolchain
from accy.kernel.examples import CUSTOM_DOUBLE_TARGET, custom_double_kernel
from accy.kernel.logical import Program


def _build(program, target="t", version=1, format="cpu_object"):
    return program.create_kernel_call_artifact(
        Limits.testing, None, target=target, version=version, format=format
    ).call


def _scale_by_index_kernel() -> Program:
    """`dst[i] = x[i] * n[i]`, with `dst` declared between its operands."""

    def body(k, args):
        def each(inner, index, a):
            x = a.param("x").load(inner, index)
            n = a.param("n").load(inner, index).cast(inner, f32)
            a.param("dst").store(inner, x.mul(inner, n), index)

        k.for_each_1d("e", 3, args, each)

    parameters = {
        "x": dynamic_buffer(f32),
        "dst": dynamic_buffer(f32),
        "n": dynamic_buffer(i32),
    }
    return Program(name="scale_by", parameters=parameters, body=body)


def test_the_double_kernel_call_has_every_field_of_the_contract():
    call = _build(custom_double_kernel(), CUSTOM_DOUBLE_TARGET)
    assert (call.target, call.version) == (CUSTOM_DOUBLE_TARGET, 1)
    assert call.symbol == call.kernel_name == "accy_kernel_accy_custom_double_4_f32"
    assert call.parameters == (("dst", f32), ("x", f32))
    assert call.operand_parameters == (("x", f32),)
    assert call.written == ("dst",)
    signature = "void accy_kernel_accy_custom_double_4_f32(float* p_dst, const float* p_x)"
    assert call.c_signature == signature
    assert call.c_signature + " {" in call.c_source
    assert "__global__ " + signature in call.cuda_source
    assert (call.block, call.grid, call.ptx, call.format) == (
        (4, 1, 1),
        (1, 1, 1),
        None,
        "cpu_object",
    )


def test_pointers_follow_declaration_order_wherever_dst_is():
    call = _build(_scale_by_index_kernel())
    assert call.c_signature == (
        "void accy_kernel_scale_by(const float* p_x, float* p_dst, const int32_t* p_n)"
    )
    assert call.operand_parameters == (("x", f32), ("n", i32))
    assert (call.block, call.grid) == (None, None)  # no schedule: fine for the CPU
    x = np.array([1.5, -2.0, 4.0], np.float32)
    n = np.array([2, 3, -1], np.int32)
    np.testing.assert_array_equal(call.run_on_cpu([x, n]), x * n)


def test_c_source_stands_alone_and_matches_its_signature():
    call = _build(_scale_by_index_kernel())
    toolchain.check_c_source(call.c_source, "contract", strict=True)
    # A backend may declare the prototype first (after the dialect's prelude, which names the
    # element types), then include the definition.
    prototype = GCC.prelude + call.c_signature + ";\n"
    toolchain.check_c_source(prototype + call.c_source, "contract", strict=True)


def test_kernels_share_one_translation_unit():
    double, scale = _build(custom_double_kernel()), _build(_scale_by_index_kernel())
    source = double.c_source + scale.c_source
    assert source.count("#define ACCY_PRELUDE") == 2  # guarded: only the first counts
    toolchain.check_c_source(source, "two kernels", strict=True)


def test_check_call_accepts_a_fitting_call_of_any_rank():
    call = _build(_scale_by_index_kernel())
    call.check_call([accy.spec(f32, a=3), accy.spec(i32, a=1, b=3)], accy.spec(f32, row=1, col=3))
    # Operands may be larger than what the kernel reads (it reads the first elements).
    call.check_call([accy.spec(f32, a=5), accy.spec(i32, a=3)], accy.spec(f32, a=3))


def test_the_cuda_source_guards_every_thread():
    source = custom_double_kernel().cuda_source()
    assert "if (accy_thread < 4LL) {" in source


def test_registry_lookup_merge_and_combine():
    double = _build(custom_double_kernel(), CUSTOM_DOUBLE_TARGET)
    scale = _build(_scale_by_index_kernel(), "accy.custom.scale", 2)
    registry = KernelCallRegistry([double]).merged(KernelCallRegistry([scale]))
    assert registry.lookup(CUSTOM_DOUBLE_TARGET, 1) is double
    assert registry.lookup(CUSTOM_DOUBLE_TARGET, 2) is None
    assert registry.require("accy.custom.scale", 2) is scale
    assert (CUSTOM_DOUBLE_TARGET, 1) in registry and len(registry) == 2
    assert registry.keys() == [(CUSTOM_DOUBLE_TARGET, 1), ("accy.custom.scale", 2)]
    # The same kernel registered twice under one key is no conflict.
    combined = KernelCallRegistry.combine(registry, KernelCallRegistry([double]))
    assert sorted(call.symbol for call in combined) == [
        "accy_kernel_accy_custom_double_4_f32",
        "accy_kernel_scale_by",
    ]
    assert "'accy.custom.double' v1" in repr(combined)


def test_a_kernel_is_traced_once_and_shared_by_its_schedules():
    traced = []

    def body(k, args):
        traced.append(1)
        k.for_each_1d("e", 4, args, lambda inner, i, a: a.param("dst").store(inner, 1.0, i))

    program = Program(name="ones", parameters={"dst": dynamic_buffer(f32)}, body=body)
    scheduled = program.with_schedule(accy.kernel.logical.schedule.thread_blocks(x=2))
    assert traced == [1] and scheduled.traced is program.traced
    assert scheduled.launch(Limits.testing).grid == (2, 1, 1)
    assert program.schedule is None


@pytest.mark.parametrize("format", accy.kernel.FORMATS)
def test_the_handle_is_kept_untouched(format):
    if format == "cuda_ptx" and toolchain.nvcc() is None:
        pytest.skip("cuda gate: nvcc is not on PATH")
    handle = object()
    artifact = custom_double_kernel().create_kernel_call_artifact(
        Limits.testing, handle, target=CUSTOM_DOUBLE_TARGET, version=1, format=format
    )
    assert artifact.handle is handle and artifact.call.format == format
