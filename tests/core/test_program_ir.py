"""The Program IR records: `Program`, `Operation`, `Attrs`, and what the Builder records."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.core import SYNTHETIC_ID, Attrs, Operation, Program

from .core_helpers import assert_same, evaluate, trace

f32, i32 = accy.f32, accy.i32
spec = accy.spec


def test_program_lists_parameters_operations_outputs_and_types():
    program = trace(
        [spec(f32, lane=4), spec(i32, token=3)],
        lambda b, a: (a[0].sum("lane"), a[1]),
        name="two",
    )
    assert program.name == "two"
    assert program.parameters == (0, 1)
    assert program.parameter_types == (spec(f32, lane=4), spec(i32, token=3))
    assert program.outputs == (3, 1)
    assert program.output_types == (spec(f32), spec(i32, token=3))
    assert program.type_of(2) == spec(f32)  # the sum's init constant
    assert program.count("reduce") == 1 and program.count("scan") == 0
    assert not program.contains_scan()
    assert repr(program) == "<Program two: 4 operations>"


def test_parameters_are_ordered_by_index_not_by_position():
    builder = accy.trace.Builder("swapped")
    second = builder.parameter(spec(i32, b=2), index=1)
    first = builder.parameter(spec(f32, a=3), index=0)
    program = builder.build([second, first])
    assert program.parameters == (1, 0)
    assert program.parameter_types == (spec(f32, a=3), spec(i32, b=2))
    a, b = np.arange(3, dtype=np.float32), np.array([7, 8], np.int32)
    got_b, got_a = evaluate(program, a, b)
    assert_same(got_a, a)
    assert_same(got_b, b)


def test_parameter_indices_must_be_zero_to_n_minus_one():
    builder = accy.trace.Builder("gap")
    builder.parameter(spec(f32), index=1)
    with pytest.raises(accy.AccyError, match=r"parameter indices \[1\] are not 0..n-1"):
        builder.build([])


def test_operations_record_operands_results_and_their_types():
    program = trace([spec(f32, a=2), spec(f32, a=2)], lambda b, a: a[0] * a[1])
    mul = program.operations[2]
    assert isinstance(mul, Operation)
    assert (mul.id, mul.kind, mul.operands, mul.results) == (2, "mul", (0, 1), (2,))
    assert mul.type == spec(f32, a=2)
    assert mul.operand_types == (spec(f32, a=2), spec(f32, a=2))
    assert mul.attrs == {}
    assert not mul.is_synthetic


def test_programs_compare_by_their_text():
    def make(name):
        return trace([spec(f32, a=2)], lambda b, a: -a[0], name=name)

    assert make("p") == make("p")
    assert hash(make("p")) == hash(make("p"))
    assert make("p") != make("q")
    assert isinstance(make("p"), Program)


def test_contains_scan_finds_a_scan():
    body = accy.trace.define("body", [spec(f32, c=2)] * 2, lambda b, a: (a[0] + a[1], a[1]))
    program = trace(
        [spec(f32, c=2), spec(f32, t=3, c=2)],
        lambda b, a: b.scan(body, carries=[a[0]], xs=[a[1]], axis="t")[0],
    )
    assert program.contains_scan()
    (scan,) = [op for op in program.operations if op.kind == "scan"]
    assert scan.attrs["body"] == body
    assert len(scan.results) == 2


def test_attrs_are_sorted_frozen_and_hashable():
    attrs = Attrs({"op": "sum", "axes": ("lane",)}, init=0)
    assert list(attrs) == ["axes", "init", "op"]
    assert attrs["op"] == "sum" and len(attrs) == 3
    assert attrs == {"axes": ("lane",), "init": 0, "op": "sum"}
    assert hash(attrs) == hash(Attrs(op="sum", axes=("lane",), init=0))
    assert attrs.replace(op="max")["op"] == "max" and attrs["op"] == "sum"
    with pytest.raises(KeyError):
        attrs["missing"]


def test_attrs_freeze_lists_and_numpy_scalars():
    attrs = Attrs(axes=["a", "b"], shape=[["a", 2]], value=np.float32(1.5), flag=np.bool_(True))
    assert attrs == {"axes": ("a", "b"), "shape": (("a", 2),), "value": 1.5, "flag": True}
    assert type(attrs["value"]) is float and type(attrs["flag"]) is bool
    hash(attrs)


def test_operations_emitted_with_list_and_numpy_attributes_print_and_parse():
    builder = accy.trace.Builder("raw")
    x = builder.parameter(spec(f32, a=2, b=3))
    init = builder.emit("constant", [], {"type": spec(f32), "value": np.float32(0.5)})
    total = builder.emit("reduce", [x, init], {"op": "sum", "axes": ["b", "a"]})
    program = builder.build([total])
    assert "{axes=[b, a], op=sum}" in str(program)
    assert str(accy.core.parse(str(program))) == str(program)


def test_synthetic_id_marks_generated_operations():
    builder = accy.trace.Builder("ids")
    x = builder.parameter(spec(f32, a=2))
    y = builder.emit("unary", [x], {"op": "neg"}, id=SYNTHETIC_ID)
    program = builder.build([y])
    assert program.operations[1].is_synthetic
    assert program.operations[1].id == SYNTHETIC_ID == -1


def test_values_know_their_builder_type_and_axes():
    builder = accy.trace.Builder("values")
    x = builder.parameter(spec(f32, token=4, channel=3))
    assert x.builder is builder
    assert x.ty == spec(f32, token=4, channel=3)
    assert x.dtype == f32 and x.axes == ("token", "channel")
    assert x.shape == {"token": 4, "channel": 3}
    assert repr(x) == "<Value %0: f32[token=4, channel=3]>"


def test_attributes_remember_their_last_check_but_other_operand_types_are_checked_again():
    from accy.core import check_operation
    from accy.errors import AccyError

    attrs = Attrs({"axes": ("lane",), "op": "max"})
    lanes = spec(f32, lane=4, row=2)
    _, same, (first,) = check_operation("reduce", (lanes, spec(f32)), attrs)
    assert same is attrs and attrs.checked == ("reduce", (lanes, spec(f32)), (first,))
    _, _, (again,) = check_operation("reduce", (lanes, spec(f32)), attrs)  # remembered
    assert again == first == spec(f32, row=2)
    with pytest.raises(AccyError, match="lane"):  # the rule runs for other operand types
        check_operation("reduce", (spec(f32, row=2), spec(f32)), attrs)
    _, _, (wider,) = check_operation("reduce", (spec(accy.f64, lane=3), spec(accy.f64)), attrs)
    assert wider == spec(accy.f64)
