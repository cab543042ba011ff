"""The text form of a Program: the printer, the parser, and print -> parse -> print.

Every program built by any test is also round-tripped by the autouse fixture in
tests/conftest.py; the tests here pin the format itself, the cases that are easy to get wrong
(quoting, special floats, nested programs, operation ids) and the parser's errors.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accy
from accy.core import SYNTHETIC_ID, parse
from accy.core.types import DTYPES, TensorType
from tests import conftest

from .core_helpers import evaluate, random_array, trace

f32, i32 = accy.f32, accy.i32
spec = accy.spec


def elementwise_loss():
    return accy.trace.define(
        "grad_elementwise", [spec(f32, lane=4)] * 2, lambda b, a: (a[0] * a[1]).sum("lane")
    )


ELEMENTWISE_TEXT = """\
program grad_elementwise {
  %0 = parameter() {index=0} : f32[lane=4]
  %1 = parameter() {index=1} : f32[lane=4]
  %2 = mul(%0, %1) : f32[lane=4]
  %3 = constant() {value=0.0} : f32[]
  %4 = reduce(%2, %3) {axes=[lane], op=sum} : f32[]
  return %4
}
"""


def assert_round_trips(program: accy.Program) -> accy.Program:
    text = str(program)
    parsed = parse(text)
    assert str(parsed) == text
    return parsed


# ---------------------------------------------------------------------------------------------
# the format


def test_program_prints_as_the_golden_listing():
    assert str(elementwise_loss()) == ELEMENTWISE_TEXT


def test_parsing_the_golden_listing_gives_the_same_program():
    parsed = parse(ELEMENTWISE_TEXT)
    assert parsed.name == "grad_elementwise"
    assert parsed.parameter_types == (spec(f32, lane=4),) * 2
    assert parsed.output_types == (spec(f32),)
    assert [op.kind for op in parsed.operations] == [
        "parameter",
        "parameter",
        "mul",
        "constant",
        "reduce",
    ]
    assert parsed == elementwise_loss()


def test_parsed_program_evaluates_like_the_original(rng):
    program = trace(
        [spec(f32, token=3, channel=2), spec(i32, pick=2)],
        lambda b, a: (a[0].gather(a[1], "token").logistic() * 3.0).max("channel"),
    )
    parsed = assert_round_trips(program)
    inputs = [random_array(rng, program.parameter_types[0]), np.array([2, 0], np.int32)]
    np.testing.assert_array_equal(evaluate(parsed, *inputs)[0], evaluate(program, *inputs)[0])


def test_comments_and_blank_space_are_ignored():
    text = ELEMENTWISE_TEXT.replace("{\n", "{  # the body\n\n", 1).replace("  %2", "\t%2")
    assert str(parse(text)) == ELEMENTWISE_TEXT


def test_every_attribute_form_round_trips():
    body = accy.trace.define(
        "body", [spec(f32, c=2), spec(f32, c=2)], lambda b, a: (a[0] + a[1], a[0] * a[1])
    )

    def everything(b, a):
        x, idx = a
        values = [
            x.slice("c", 0, 2, 1).pad("t", 1, 2, -0.5, 1),  # int lists, negative float
            b.iota(spec(i32, q=3), "q"),  # type attribute, bare name
            b.constant([[1.5, -2.0]], spec(f32, one=1, c=2)),  # flat value list
            b.constant([True, False], spec(accy.bool_, q=2)),  # bools
            b.full(spec(accy.i64, q=1), 2**62),  # big int
            x.merge(["t", "c"], "tc"),  # named-extent lists
            b.custom_call("vendor.op-v2", 7, [x], spec(f32, out=1)),  # quoted target
            b.scan(body, carries=[b.zeros(spec(f32, c=2))], xs=[x], axis="t", reverse=True)[1][0],
            b.dot_general(x, x.rename("t", "s"), [1], [1], [], []),
            b.compare("ge", x, x),
            x.convert(accy.bf16),
            x.gather(idx, "t"),
        ]
        return tuple(values)

    program = trace([spec(f32, t=4, c=2), spec(i32, k=3)], everything)
    assert_round_trips(program)


@pytest.mark.parametrize(
    "value, printed",
    [
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (float("-inf"), "-inf"),
        (-0.0, "-0.0"),
        (1e-30, "1e-30"),
        (-3.4e38, "-3.4e+38"),
        (0.1, "0.1"),
        (5e-324, "5e-324"),
    ],
)
def test_special_floats_print_and_parse_exactly(value, printed):
    program = trace([], lambda b, a: b.scalar(accy.f64, value))
    text = str(program)
    assert f"{{value={printed}}}" in text
    parsed = assert_round_trips(program)
    got = parsed.operations[0].attrs["value"]
    assert (np.isnan(got) and np.isnan(value)) or (got == value and str(got) == str(value))


@pytest.mark.parametrize(
    "name, printed",
    [
        ("plain_name", "plain_name"),
        ("with space", '"with space"'),
        ("return", '"return"'),
        ("program", '"program"'),
        ("true", '"true"'),
        ("nan", '"nan"'),
        ('quote"and\\slash', '"quote\\"and\\\\slash"'),
        ("line\nbreak", '"line\\nbreak"'),
        ("ünïcode", '"ünïcode"'),
        ("9lives", '"9lives"'),
    ],
)
def test_names_that_are_not_plain_identifiers_are_quoted(name, printed):
    builder = accy.trace.Builder(name)
    x = builder.parameter(spec(f32, lane=2))
    program = builder.build(builder.custom_call(name, 1, [x], x.ty))
    text = str(program)
    assert text.startswith(f"program {printed} {{")
    assert f"target={printed}" in text
    parsed = assert_round_trips(program)
    assert parsed.name == name
    assert parsed.operations[1].attrs["target"] == name


def test_reserved_words_work_as_axis_names():
    program = trace(
        [spec(f32, program=2, inf=3, true=1)],
        lambda b, a: a[0].sum(["inf", "program"]).rename("true", "return"),
    )
    assert_round_trips(program)


def test_operations_with_other_ids_print_them_and_synthetic_ones_are_marked():
    source = elementwise_loss()
    builder = accy.trace.Builder("renumbered")
    graph = accy.interpret.Graph(builder)

    class Shift:
        """Re-emit with shifted ids, and add a generated (synthetic) negation of the loss."""

        def bind(self, op, args):
            if op.kind == "reduce":
                total = builder.emit(op.kind, args, op.attrs, id=op.id + 10)
                return builder.emit("unary", [total], {"op": "neg"}, id=SYNTHETIC_ID)
            return builder.emit(op.kind, args, op.attrs, id=op.id)

        def finish(self, outputs):
            return graph.finish(outputs)

    program = accy.interpret.run(source, Shift())
    text = str(program)
    assert "%4 = reduce(%2, %3) {axes=[lane], op=sum} : f32[] @14\n" in text
    assert "%5 = unary(%4) {op=neg} : f32[] @synthetic\n" in text
    parsed = assert_round_trips(program)
    assert [op.id for op in parsed.operations] == [0, 1, 2, 3, 14, SYNTHETIC_ID]


def test_programs_with_no_parameters_or_several_outputs_round_trip():
    program = trace([], lambda b, a: (b.scalar(f32, 1.0), b.iota(spec(i32, a=2), "a")))
    assert str(program).endswith("  return %0, %1\n}\n")
    assert_round_trips(program)
    builder = accy.trace.Builder("nothing")
    assert str(builder.build([])) == "program nothing {\n  return\n}\n"
    assert_round_trips(builder.build([]))


# ---------------------------------------------------------------------------------------------
# properties


axis_names = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
tensor_types = st.builds(
    lambda dtype, named: TensorType(dtype, tuple(named.items())),
    st.sampled_from(sorted(DTYPES.values(), key=lambda d: d.name)),
    st.dictionaries(axis_names, st.integers(0, 5), max_size=4),
)


@settings(max_examples=40, deadline=None)
@given(t=tensor_types)
def test_any_tensor_type_round_trips_through_a_parameter(t):
    builder = accy.trace.Builder("p")
    program = builder.build(builder.parameter(t))
    assert parse(str(program)).parameter_types == (t,)


@settings(max_examples=40, deadline=None)
@given(value=st.floats(allow_nan=False) | st.sampled_from([float("inf"), float("-inf")]))
def test_any_float_constant_round_trips_bit_exactly(value):
    program = trace([], lambda b, a: b.scalar(accy.f64, value))
    parsed = parse(str(program))
    assert np.float64(parsed.operations[0].attrs["value"]).tobytes() == np.float64(value).tobytes()


@settings(max_examples=40, deadline=None)
@given(name=st.text(min_size=1, max_size=8))
def test_any_program_name_and_target_round_trip(name):
    builder = accy.trace.Builder(name)
    x = builder.parameter(spec(f32, a=1))
    program = builder.build(builder.custom_call(name, 0, [x], x.ty))
    parsed = parse(str(program))
    assert parsed.name == name
    assert parsed.operations[1].attrs["target"] == name


# ---------------------------------------------------------------------------------------------
# parse errors: a ParseError with the line and column of the problem, never another exception


def _mutated(old: str, new: str) -> str:
    assert old in ELEMENTWISE_TEXT
    return ELEMENTWISE_TEXT.replace(old, new, 1)


def _position(text: str, marker: str) -> tuple[int, int]:
    """1-based line and column of the first occurrence of `marker` in `text`."""
    offset = text.index(marker)
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


PARSE_ERRORS = {
    "unknown kind": (
        _mutated("mul(%0, %1)", "mull(%0, %1)"),
        "mull(",
        "unknown operation kind 'mull'",
    ),
    "undefined value": (
        _mutated("mul(%0, %1)", "mul(%0, %7)"),
        "%7",
        "value %7 is used before it is defined",
    ),
    "unknown dtype": (
        _mutated("%2 = mul(%0, %1) : f32[lane=4]", "%2 = mul(%0, %1) : f33[lane=4]"),
        "f33",
        "unknown dtype 'f33'; the dtypes are f32",
    ),
    "extent that is not an integer": (
        _mutated(
            "%1 = parameter() {index=1} : f32[lane=4]", "%1 = parameter() {index=1} : f32[lane=x]"
        ),
        "x]",
        "expected an extent \\(an integer\\), found 'x'",
    ),
    "negative extent": (
        _mutated("{index=1} : f32[lane=4]", "{index=1} : f32[lane=-4]"),
        "f32[lane=-4]",
        "axis 'lane' has extent -4",
    ),
    "duplicate axis": (
        _mutated("{index=1} : f32[lane=4]", "{index=1} : f32[lane=4, lane=4]"),
        "f32[lane=4, lane=4]",
        "axis names must be unique",
    ),
    "missing return": (
        _mutated("  return %4\n", ""),
        "}\n",
        "expected a result such as %0, or 'return', found '}'",
    ),
    "missing return and brace": (
        _mutated("  return %4\n}\n", ""),
        None,
        "the program has no 'return'",
    ),
    "duplicate attribute": (
        _mutated("{axes=[lane], op=sum}", "{axes=[lane], op=sum, axes=[lane]}"),
        "axes=[lane]}",
        "attribute 'axes' is given twice",
    ),
    "declared type differs from the inferred one": (
        _mutated("%2 = mul(%0, %1) : f32[lane=4]", "%2 = mul(%0, %1) : f32[lane=5]"),
        "mul(",
        "%2 is declared f32\\[lane=5\\] but mul gives f32\\[lane=4\\]",
    ),
    "declared dtype differs": (
        _mutated("%2 = mul(%0, %1) : f32[lane=4]", "%2 = mul(%0, %1) : f64[lane=4]"),
        "mul(",
        "%2 is declared f64\\[lane=4\\] but mul gives f32\\[lane=4\\]",
    ),
    "trailing garbage": (
        ELEMENTWISE_TEXT + "extra\n",
        "extra",
        "unexpected 'extra' after the program's closing brace",
    ),
    "operand types the rule rejects": (
        _mutated("reduce(%2, %3)", "reduce(%3, %2)"),
        "reduce(",
        "reduce sum: axis 'lane' is not on the operand f32\\[\\]; its axes are \\(none",
    ),
    "missing attribute": (
        _mutated("{axes=[lane], op=sum}", "{op=sum}"),
        "reduce(",
        "reduce needs the attribute 'axes'",
    ),
    "value defined twice": (
        _mutated("%3 = constant()", "%2 = constant()"),
        "%2 = constant",
        "value %2 is defined twice",
    ),
    "more results than types": (
        _mutated("%2 = mul", "%2, %9 = mul"),
        "%2, %9",
        "2 results but 1 types are declared",
    ),
    "unexpected character": (
        _mutated("mul(%0, %1)", "mul(%0; %1)"),
        ";",
        "unexpected character ';'",
    ),
    "unterminated string": (
        _mutated("program grad_elementwise", 'program "grad_elementwise'),
        '"grad',
        "unexpected character '\"'",
    ),
    "wrong number of operands": (
        _mutated("mul(%0, %1)", "mul(%0)"),
        "mul(",
        "mul takes 2 operands, got 1 \\(operand 0: f32\\[lane=4\\]\\)",
    ),
    "empty text": ("", None, "expected 'program', found end of text"),
    "bad operation id": (
        _mutated("{value=0.0} : f32[]", "{value=0.0} : f32[] @x"),
        "x\n",
        "expected an operation id \\(an integer\\), found 'x'",
    ),
}


@pytest.mark.parametrize("case", sorted(PARSE_ERRORS))
def test_malformed_text_raises_parse_error_at_its_line_and_column(case):
    text, marker, message = PARSE_ERRORS[case]
    with pytest.raises(accy.ParseError, match=message) as caught:
        parse(text)
    if marker is None:  # the error is at the end of the text
        lines = text.split("\n")
        line, column = len(lines), len(lines[-1]) + 1
    else:
        line, column = _position(text, marker)
    assert (caught.value.line, caught.value.column) == (line, column)
    assert str(caught.value).startswith(f"line {line}, column {column}: ")


def test_parse_needs_text():
    with pytest.raises(accy.ParseError, match="expected program text \\(a str\\), got bytes"):
        parse(ELEMENTWISE_TEXT.encode())


def test_bad_nested_body_reports_its_own_line():
    body = accy.trace.define("body", [spec(f32, c=2), spec(f32, c=2)], lambda b, a: (a[0], a[1]))
    program = trace(
        [spec(f32, t=3, c=2)],
        lambda b, a: b.scan(body, carries=[b.zeros(spec(f32, c=2))], xs=[a[0]], axis="t")[1][0],
    )
    text = str(program).replace("      return %0, %1", "      return %0, %5")
    with pytest.raises(accy.ParseError, match="value %5 is used before it is defined") as caught:
        parse(text)
    assert caught.value.line == _position(text, "%5")[0]


def test_scan_body_that_is_not_a_program_is_a_parse_error():
    text = (
        "program p {\n"
        "  %0 = parameter() {index=0} : f32[t=3, c=2]\n"
        "  %1 = constant() {value=0.0} : f32[c=2]\n"
        "  %2, %3 = scan(%1, %0) {axis=t, body=5, length=3, num_carry=1, num_consts=0,"
        " reverse=false} : f32[c=2], f32[t=3, c=2]\n"
        "  return %3\n"
        "}\n"
    )
    with pytest.raises(accy.ParseError, match="scan: attribute 'body' must be a program, got 5"):
        parse(text)


def _fuzz_sources() -> list[str]:
    body = accy.trace.define(
        "body", [spec(f32, c=2), spec(f32, c=2)], lambda b, a: (a[0] + a[1], a[1])
    )
    rich = trace(
        [spec(f32, t=3, c=2), spec(i32, k=2)],
        lambda b, a: (
            a[0].gather(a[1], "t").sum("k").pad("c", 1, 0, 0.5),
            b.scan(body, carries=[b.zeros(spec(f32, c=2))], xs=[a[0]], axis="t")[1][0],
            b.custom_call("x.y", 2, [a[0]], spec(f32, o=1)),
            b.constant([1, 2], spec(i32, q=2)).convert(f32).slice("q", 0, 2, 2),
        ),
    )
    return [ELEMENTWISE_TEXT, str(rich)]


def test_random_token_mutations_raise_only_parse_errors():
    """Deleting, replacing or inserting tokens never raises anything but ParseError; a mutant that
    parses prints back to text that parses to the same program."""
    rng = random.Random(7)
    tokenize = accy.core.text._tokenize
    for source in _fuzz_sources():
        tokens = [t for t in tokenize(source) if t.kind != "end"]
        starts = [source.split("\n")[: t.line - 1] for t in tokens]
        offsets = [
            sum(len(x) + 1 for x in s) + t.column - 1 for s, t in zip(starts, tokens, strict=True)
        ]
        for _ in range(400):
            i = rng.randrange(len(tokens))
            start, end = offsets[i], offsets[i] + len(tokens[i].text)
            other = rng.choice(tokens).text
            mutant = rng.choice(
                [
                    source[:start] + source[end:],
                    source[:start] + other + source[end:],
                    source[:start] + other + " " + source[start:],
                ]
            )
            try:
                program = parse(mutant)
            except accy.ParseError:
                continue
            assert str(parse(str(program))) == str(program)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_arbitrary_character_edits_raise_only_parse_errors(data):
    source = data.draw(st.sampled_from(_fuzz_sources()), label="source")
    position = data.draw(st.integers(0, len(source)), label="position")
    removed = data.draw(st.integers(0, 3), label="removed")
    inserted = data.draw(st.text(alphabet='%[]{}(),=:@-.0123456789aefx" \n', max_size=3))
    mutant = source[:position] + inserted + source[position + removed :]
    try:
        parse(mutant)
    except accy.ParseError as error:
        assert error.line >= 1 and error.column >= 1


# ---------------------------------------------------------------------------------------------
# the autouse round-trip check of tests/conftest.py


def test_every_built_program_is_round_tripped_by_the_conftest_fixture(
    round_trip_every_built_program, monkeypatch
):
    failures = round_trip_every_built_program
    elementwise_loss()
    assert failures == []

    parsed = []
    with monkeypatch.context() as patch:  # a text that round-tripped once is not parsed again
        patch.setattr(accy.core, "parse", parsed.append)
        elementwise_loss()
    assert parsed == [] and failures == []
    monkeypatch.setattr(conftest, "_round_tripped", set())  # from here on, every text is new

    def lossy_parse(text):  # a parser that loses the program's name
        return accy.trace.Builder("renamed").build([])

    with monkeypatch.context() as patch:
        patch.setattr(accy.core, "parse", lossy_parse)
        elementwise_loss()
    assert len(failures) == 1
    assert "program 'grad_elementwise' prints differently after parsing" in failures[0]

    def crashing_parse(text):
        raise ValueError("parser bug")

    with monkeypatch.context() as patch:
        patch.setattr(accy.core, "parse", crashing_parse)
        elementwise_loss()
    assert len(failures) == 2
    assert "does not parse back (ValueError): parser bug" in failures[1]
    failures.clear()  # the failures were planted: do not fail this test at teardown
