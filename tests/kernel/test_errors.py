"""Every error the kernel DSL raises, each with the words that say what went wrong."""

from __future__ import annotations

import re

import numpy as np
import pytest

import accy
from accy.core.types import bool_, f32, f64, i32
from accy.kernel import (
    Index1D,
    KernelCallMismatch,
    KernelCallNotFound,
    KernelCallRegistry,
    KernelError,
    KernelLimitExceeded,
    Limits,
    dynamic_buffer,
    toolchain,
)
from accy.kernel.examples import CUSTOM_DOUBLE_TARGET, custom_double_kernel
from accy.kernel.logical import Program, schedule

from .catalog import map_kernel

F32 = {"dst": dynamic_buffer(f32), "x": dynamic_buffer(f32)}


def kernel(each, parameters=F32, extent=4, name="k") -> Program:
    """A one-loop kernel whose loop body is `each`."""

    def body(k, args):
        k.for_each_1d("e", extent, args, each)

    return Program(name=name, parameters=parameters, body=body)


def copy_each(inner, index, args):
    args.param("dst").store(inner, args.param("x").load(inner, index), index)


def double_call(format="cpu_object"):
    artifact = custom_double_kernel().create_kernel_call_artifact(
        Limits.testing, None, target=CUSTOM_DOUBLE_TARGET, version=1, format=format
    )
    return artifact.call


# ---------------------------------------------------------------------------------------------
# Limits, enforced when the kernel is built


def test_too_many_threads_per_block():
    program = kernel(copy_each).with_schedule(schedule.thread_blocks(x=512))
    with pytest.raises(KernelLimitExceeded, match=r"thread_blocks\(x=512\).*allow 256"):
        program.create_kernel_call_artifact(Limits.testing, None, target="t", version=1)


def test_extent_too_large_for_the_schedule():
    program = kernel(copy_each, extent=1000).with_schedule(schedule.thread_blocks(x=8))
    with pytest.raises(KernelLimitExceeded, match=r"loop 'e' covers 1000 elements.*125 blocks.*64"):
        program.create_kernel_call_artifact(
            Limits.testing, None, target="t", version=1, format="cuda_ptx"
        )


def test_extent_too_large_for_any_loop():
    program = kernel(copy_each, extent=1 << 17)
    with pytest.raises(KernelLimitExceeded, match="131072 elements, but the limits allow 65536"):
        program.launch(Limits.testing)


def test_reduction_too_long_for_one_thread():
    def each(inner, index, args):
        total = inner.reduce_1d("r", 5000, args, lambda i2, r, a: a.param("x").load(i2, r))
        args.param("dst").store(inner, total, index)

    with pytest.raises(KernelLimitExceeded, match="reduction 'r' runs 5000 steps"):
        kernel(each).launch(Limits.testing)


def test_too_many_parameters():
    parameters = {"dst": dynamic_buffer(f32)} | {f"x{n}": dynamic_buffer(f32) for n in range(8)}
    program = map_kernel("wide", f32, [f32] * 8, lambda inner, *xs: xs[0])
    assert len(parameters) == len(program.parameters)
    with pytest.raises(KernelLimitExceeded, match="9 parameters, but the limits allow 8"):
        program.launch(Limits.testing)


def test_limits_must_be_positive():
    with pytest.raises(KernelLimitExceeded, match="max_blocks must be a positive int"):
        Limits(max_blocks=0)


def test_cuda_needs_a_schedule():
    with pytest.raises(KernelError, match=r"no schedule.*with_schedule"):
        kernel(copy_each).create_kernel_call_artifact(
            Limits.testing, None, target="t", version=1, format="cuda_ptx"
        )


# ---------------------------------------------------------------------------------------------
# binding a call to its kernel: check_call names the target


def test_operand_dtype_mismatch():
    with pytest.raises(
        KernelCallMismatch,
        match=r"'accy.custom.double'.*operand 0 is bound to parameter 'x' of dtype f32.*f64",
    ):
        double_call().check_call([accy.spec(f64, lane=4)], accy.spec(f32, lane=4))


def test_result_dtype_mismatch():
    with pytest.raises(KernelCallMismatch, match="the result is bound to parameter 'dst'"):
        double_call().check_call([accy.spec(f32, lane=4)], accy.spec(i32, lane=4))


def test_operand_smaller_than_the_kernel_reads():
    with pytest.raises(
        KernelCallMismatch, match=r"accesses 4 elements of parameter 'x'.*has only 3"
    ):
        double_call().check_call([accy.spec(f32, lane=3)], accy.spec(f32, lane=4))


def test_result_larger_than_the_kernel_writes():
    with pytest.raises(
        KernelCallMismatch, match=r"writes 4 elements of 'dst'.*has 8; the rest would be left"
    ):
        double_call().check_call([accy.spec(f32, lane=8)], accy.spec(f32, lane=8))


def test_result_smaller_than_the_kernel_writes():
    with pytest.raises(KernelCallMismatch, match=r"accesses 4 elements of parameter 'dst'"):
        double_call().check_call([accy.spec(f32, lane=4)], accy.spec(f32, lane=2))


def test_wrong_operand_count():
    with pytest.raises(KernelCallMismatch, match=r"takes 1 operands \(x\), but the call gives 2"):
        double_call().check_call([accy.spec(f32, lane=4)] * 2, accy.spec(f32, lane=4))


def test_run_on_cpu_rejects_an_array_of_another_dtype():
    with pytest.raises(KernelCallMismatch, match="parameter 'x' is f32, but the array is float64"):
        double_call().run_on_cpu([np.ones(4)])


# ---------------------------------------------------------------------------------------------
# the registry


def test_missing_target():
    registry = KernelCallRegistry([double_call()])
    message = (
        "custom_call 'accy.custom.triple' (version 1) has no kernel; "
        "the registry has 'accy.custom.double' v1"
    )
    with pytest.raises(KernelCallNotFound, match=re.escape(message)):
        registry.require("accy.custom.triple", 1)


def test_missing_version():
    registry = KernelCallRegistry([double_call()])
    with pytest.raises(
        KernelCallNotFound, match=r"'accy.custom.double': no kernel for version 2; .* versions 1"
    ):
        registry.require(CUSTOM_DOUBLE_TARGET, 2)


def test_empty_registry_says_so():
    with pytest.raises(KernelCallNotFound, match="the registry has no kernels"):
        KernelCallRegistry().require("t", 1)


def test_one_key_two_kernels():
    other = kernel(copy_each, name="other").create_kernel_call_artifact(
        Limits.testing, None, target=CUSTOM_DOUBLE_TARGET, version=1
    )
    with pytest.raises(KernelError, match="registered twice, with kernels"):
        KernelCallRegistry([double_call()]).merged(other.registry())


def test_one_symbol_two_targets():
    again = custom_double_kernel().create_kernel_call_artifact(
        Limits.testing, None, target="accy.custom.twice", version=1
    )
    with pytest.raises(KernelError, match="its C symbol must be unique"):
        KernelCallRegistry.combine(KernelCallRegistry([double_call()]), again.registry())


# ---------------------------------------------------------------------------------------------
# the DSL


def test_store_of_the_wrong_dtype():
    def each(inner, index, args):
        x = args.param("x").load(inner, index)
        args.param("dst").store(inner, x.cast(inner, f64), index)

    with pytest.raises(
        KernelError, match=r"store to 'dst': the value is f64 but 'dst' holds f32.*cast"
    ):
        kernel(each)


def test_unknown_parameter():
    def each(inner, index, args):
        args.param("y")

    with pytest.raises(
        KernelError, match="kernel 'k': has no parameter 'y'; its parameters are dst, x"
    ):
        kernel(each)


def test_load_of_the_result():
    def each(inner, index, args):
        args.param("dst").load(inner, index)

    with pytest.raises(KernelError, match="'dst' is the call's result and write-only"):
        kernel(each)


def test_store_to_an_operand():
    def each(inner, index, args):
        args.param("x").store(inner, 1.0, index)

    with pytest.raises(KernelError, match="only 'dst' .* may be written; 'x' is an operand"):
        kernel(each)


def test_store_twice():
    def each(inner, index, args):
        args.param("dst").store(inner, 1.0, index)
        args.param("dst").store(inner, 2.0, index)

    with pytest.raises(KernelError, match="already stored once"):
        kernel(each)


def test_store_at_a_partial_index_of_a_2d_loop():
    def each(inner, index, args):
        args.param("dst").store(inner, 1.0, index.row)

    def body(k, args):
        k.for_each_2d("g", (2, 3), args, each)

    with pytest.raises(KernelError, match="stores use the loop's own index"):
        Program(name="k", parameters=F32, body=body)


def test_store_inside_a_reduction():
    def each(inner, index, args):
        def term(inner2, r, args2):
            args2.param("dst").store(inner2, 0.0, index)
            return args2.param("x").load(inner2, r)

        inner.reduce_1d("r", 4, args, term)

    with pytest.raises(KernelError, match="belongs in a for_each loop's body, not in reduce 'r'"):
        kernel(each)


def test_index_outside_its_loop():
    escaped = []

    def body(k, args):
        k.for_each_1d(
            "e",
            4,
            args,
            lambda inner, index, a: (escaped.append(index), copy_each(inner, index, a)),
        )
        k.for_each_1d("f", 8, args, lambda inner, index, a: a.param("x").load(inner, escaped[0]))

    with pytest.raises(KernelError, match="index 'e' is used outside its loop"):
        Program(name="k", parameters=F32, body=body)


def test_a_made_up_index():
    def each(inner, index, args):
        args.param("x").load(inner, Index1D("fake", 100, "i9"))

    with pytest.raises(KernelError, match="index 'fake' is used outside its loop"):
        kernel(each)


def test_the_outer_scope_inside_a_loop():
    def body(k, args):
        k.for_each_1d("e", 4, args, lambda inner, index, a: a.param("x").load(k, index))

    with pytest.raises(KernelError, match="innermost open scope is for_each 'e'; pass the `inner`"):
        Program(name="k", parameters=F32, body=body)


def test_a_scope_after_its_loop():
    kept = []

    def body(k, args):
        k.for_each_1d(
            "e", 4, args, lambda inner, index, a: (kept.append(inner), copy_each(inner, index, a))
        )
        kept[0].constant(1.0, f32)

    with pytest.raises(KernelError, match="the scope of for_each 'e' has ended"):
        Program(name="k", parameters=F32, body=body)


def test_a_value_from_another_loop():
    kept = []

    def body(k, args):
        def first(inner, index, a):
            kept.append(a.param("x").load(inner, index))
            copy_each(inner, index, a)

        k.for_each_1d("e", 4, args, first)
        k.for_each_1d("f", 4, args, lambda inner, index, a: kept[0].add(inner, 1.0))

    with pytest.raises(KernelError, match=r"value v\d+ comes from for_each 'e', which has ended"):
        Program(name="k", parameters=F32, body=body)


def test_parallel_loop_inside_a_loop():
    def each(inner, index, args):
        inner.for_each_1d("nested", 4, args, copy_each)

    with pytest.raises(KernelError, match="called on the kernel scope `k`, not inside loop 'e'"):
        kernel(each)


def test_reduction_outside_a_loop():
    def body(k, args):
        k.reduce_1d("r", 4, args, lambda inner, r, a: a.param("x").load(inner, r))

    with pytest.raises(KernelError, match="reduce_1d 'r' belongs inside a for_each loop"):
        Program(name="k", parameters=F32, body=body)


def test_reduction_of_something_that_is_not_a_value():
    def each(inner, index, args):
        inner.reduce_1d("r", 4, args, lambda inner2, r, a: 1.0)

    with pytest.raises(KernelError, match="the result of reduce_1d 'r' must be a kernel value"):
        kernel(each)


def test_unknown_reduction():
    def each(inner, index, args):
        inner.reduce_1d("r", 4, args, lambda i2, r, a: a.param("x").load(i2, r), combine="avg")

    with pytest.raises(KernelError, match="unknown reduction 'avg'; use one of add, mul, max, min"):
        kernel(each)


def test_sum_of_bools():
    parameters = {"dst": dynamic_buffer(bool_), "x": dynamic_buffer(bool_)}

    def each(inner, index, args):
        inner.reduce_1d("r", 4, args, lambda i2, r, a: a.param("x").load(i2, r))

    with pytest.raises(KernelError, match="add does not apply to bool values"):
        kernel(each, parameters)


def test_loop_that_stores_nothing():
    def body(k, args):
        k.for_each_1d("e", 4, args, copy_each)
        k.for_each_1d("idle", 4, args, lambda inner, index, a: a.param("x").load(inner, index))

    with pytest.raises(KernelError, match="loop 'idle' stores nothing"):
        Program(name="k", parameters=F32, body=body)


def test_kernel_that_never_stores_the_result():
    with pytest.raises(KernelError, match="never stores 'dst'"):
        Program(name="k", parameters=F32, body=lambda k, args: None)


# ops and their types


def test_float_op_on_integers():
    with pytest.raises(
        KernelError, match=r"exp does not apply to i32 values; it takes f32, f64, f16, bf16"
    ):
        map_kernel("k", i32, [i32], lambda inner, x: x.exp(inner))


def test_mixed_dtypes():
    with pytest.raises(KernelError, match="add needs operands of one dtype, got f32, i32"):
        map_kernel("k", f32, [f32, i32], lambda inner, x, n: x.add(inner, n))


def test_select_needs_a_bool():
    with pytest.raises(KernelError, match="select needs a bool condition, got f32"):
        map_kernel("k", f32, [f32], lambda inner, x: x.select(inner, x, x))


def test_unknown_op():
    with pytest.raises(KernelError, match="unknown op 'erf'"):
        map_kernel("k", f32, [f32], lambda inner, x: x.apply(inner, "erf"))


def test_constant_that_does_not_fit():
    with pytest.raises(KernelError, match=r"constant 0.5 is not an integer, so it cannot be a i32"):
        map_kernel("k", i32, [i32], lambda inner, x: x.add(inner, 0.5))
    with pytest.raises(KernelError, match=r"constant 300 is outside the range of u8 \[0, 255\]"):
        map_kernel("k", accy.u8, [accy.u8], lambda inner, x: x.add(inner, 300))


def test_op_of_numbers_alone():
    with pytest.raises(KernelError, match="add needs at least one kernel value"):
        map_kernel("k", f32, [], lambda inner: inner.apply("add", 1.0, 2.0))


# declarations


@pytest.mark.parametrize(
    ("name", "parameters", "message"),
    [
        ("my-kernel", F32, "must be an ASCII identifier"),
        ("k", {"x": dynamic_buffer(f32)}, "needs a parameter named 'dst'"),
        ("k", {"dst": f32}, r"must be a buffer such as accy.kernel.dynamic_buffer\(accy.f32\)"),
        ("k", {"dst": dynamic_buffer(f32), 3: dynamic_buffer(f32)}, "must be an ASCII identifier"),
        ("k", {}, "parameters must be a dict"),
    ],
)
def test_bad_declaration(name, parameters, message):
    with pytest.raises(KernelError, match=message):
        Program(name=name, parameters=parameters, body=lambda k, args: None)


def test_names_the_c_library_uses_are_fine():
    # Generated C prefixes kernel and parameter names, so these cannot clash with anything.
    names = {"dst": dynamic_buffer(f32), "int": dynamic_buffer(f32)}
    program = kernel(
        lambda inner, i, a: a.param("dst").store(inner, a.param("int").load(inner, i), i),
        names,
        name="exp",
    )
    call = program.create_kernel_call_artifact(Limits.testing, None, target="t", version=1).call
    np.testing.assert_array_equal(call.run_on_cpu([np.ones(4, np.float32)]), np.ones(4))


def test_bad_extent_and_label():
    with pytest.raises(KernelError, match="loop 'e' needs a positive int extent, got 0"):
        kernel(copy_each, extent=0)
    with pytest.raises(KernelError, match=r"for_each_2d 'g' needs extents \(rows, cols\)"):
        Program(name="k", parameters=F32, body=lambda k, a: k.for_each_2d("g", 4, a, copy_each))
    with pytest.raises(KernelError, match="a loop label must be an identifier"):
        Program(name="k", parameters=F32, body=lambda k, a: k.for_each_1d("a b", 4, a, copy_each))


def test_bad_schedule():
    with pytest.raises(KernelError, match=r"thread_blocks\(x=...\) needs a positive int, got 0"):
        schedule.thread_blocks(x=0)
    with pytest.raises(KernelError, match="with_schedule takes schedule.thread_blocks"):
        kernel(copy_each).with_schedule(4)


def test_bad_artifact_requests():
    program = kernel(copy_each)
    with pytest.raises(KernelError, match="unknown kernel format 'cubin'"):
        program.create_kernel_call_artifact(
            Limits.testing, None, target="t", version=1, format="cubin"
        )
    with pytest.raises(KernelError, match="target must be a non-empty string"):
        program.create_kernel_call_artifact(Limits.testing, None, target="", version=1)
    with pytest.raises(KernelError, match="version must be an int"):
        program.create_kernel_call_artifact(Limits.testing, None, target="t", version="1")
    with pytest.raises(KernelError, match="limits must be accy.kernel.Limits"):
        program.create_kernel_call_artifact({"max_blocks": 4}, None, target="t", version=1)


# the compilers


def test_c_that_does_not_compile_names_the_source():
    with pytest.raises(accy.CompileError, match=r"kernel 'broken'.*source kept at .*\.c"):
        toolchain.check_c_source("void broken(void) { return 1 }\n", "kernel 'broken'")


def test_missing_c_compiler(monkeypatch):
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", "")
    with pytest.raises(accy.RuntimeUnavailable, match="no C compiler found"):
        toolchain.find_compiler("accy.kernel")


def test_a_parameter_in_another_kernels_scope():
    # Another kernel's parameter would record its reads there, leaving them unchecked here.
    foreign = []

    def first(k, args):
        foreign.append(args.param("x"))
        k.for_each_1d("e", 4, args, copy_each)

    Program(name="first", parameters=F32, body=first)

    def each(inner, index, args):
        args.param("dst").store(inner, foreign[0].load(inner, index), index)

    with pytest.raises(KernelError, match="load of 'x' needs a scope of this kernel"):
        kernel(each, name="second")
