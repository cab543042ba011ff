"""Interpreter framework: the walker, semantics layers, `bind(handler)`, `Graph` re-emission,
`Emitter`, `builder.call` inlining and `scan` bodies."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.core import SYNTHETIC_ID, parse
from accy.interpret import Emitter, Graph, Layer, attach, bind, run
from accy.trace import Builder

from .core_helpers import assert_same, evaluate, evaluate_one, random_array, trace

f32, i32 = accy.f32, accy.i32
spec = accy.spec


def elementwise_loss():
    return accy.trace.define(
        "grad_elementwise", [spec(f32, lane=4)] * 2, lambda b, a: (a[0] * a[1]).sum("lane")
    )


def graph(name="copy"):
    return Graph(Builder(name))


# ---------------------------------------------------------------------------------------------
# the walker


def test_run_visits_operations_in_order_and_finishes_with_the_outputs():
    class Record:
        def __init__(self):
            self.seen = []

        def bind(self, op, args):
            self.seen.append((op.kind, tuple(args)))
            return len(self.seen) - 1  # each value is its operation's position

        def finish(self, outputs):
            return ("finished", outputs)

    record = Record()
    assert run(elementwise_loss(), record) == ("finished", [4])
    assert record.seen == [
        ("parameter", ()),
        ("parameter", ()),
        ("mul", (0, 1)),
        ("constant", ()),
        ("reduce", (2, 3)),
    ]


def test_run_with_abstract_values_computes_types_through_the_rules():
    class Types:
        """An abstract interpretation: values are TensorTypes, computed by the type rules."""

        def bind(self, op, args):
            return accy.core.rule_for(op.kind).infer(tuple(args), op.attrs)

        def finish(self, outputs):
            return outputs

    program = trace(
        [spec(f32, a=2, b=3), spec(f32, b=3, c=4)], lambda b, a: (a[0].contract(a[1], "b"), a[0])
    )
    assert run(program, Types()) == list(program.output_types)


def test_run_unpacks_operations_with_several_results():
    body = accy.trace.define("body", [spec(f32, c=2)] * 2, lambda b, a: (a[0] + a[1], a[1]))
    program = trace(
        [spec(f32, c=2), spec(f32, t=3, c=2)],
        lambda b, a: b.scan(body, carries=[a[0]], xs=[a[1]], axis="t")[0] + (a[0],),
    )
    copy = run(program, graph("test"))
    assert copy.output_types == (spec(f32, c=2), spec(f32, c=2))
    assert str(copy) == str(program)


def test_reference_evaluation_is_a_semantics(rng):
    program = elementwise_loss()
    x, y = random_array(rng, spec(f32, lane=4)), random_array(rng, spec(f32, lane=4))
    (value,) = run(program, accy.reference.Evaluate([x, y]))
    np.testing.assert_allclose(value, (x * y).sum(), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Graph re-emission


def test_a_semantics_that_drops_dead_values_holds_only_the_live_ones():
    # A chain of 12 operations: the walker lets each result go after its last reader (and a
    # result nobody reads at once), so at most the operands of the next operation are alive.
    import weakref

    class Box:
        pass

    class Counting:
        drops_dead_values = True

        def __init__(self):
            self.made, self.most_alive = [], 0

        def bind(self, op, args):
            alive = sum(ref() is not None for ref in self.made)
            self.most_alive = max(self.most_alive, alive)
            box = Box()
            self.made.append(weakref.ref(box))
            return box

        def finish(self, outputs):
            return outputs

    def body(b, a):
        x = a[0]
        for _ in range(6):
            x = (x * 2.0).exp()
        return x

    semantics = Counting()
    (out,) = run(accy.trace.define("chain", [spec(f32, lane=4)], body), semantics)
    assert isinstance(out, Box) and len(semantics.made) > 12
    assert semantics.most_alive <= 3  # the two operands of a mul, and a constant


def test_reference_evaluation_lets_each_intermediate_go_after_its_last_use(rng):
    program = accy.trace.define(
        "chain", [spec(f32, lane=64)], lambda b, a: ((a[0] * 2.0).exp() * 3.0).tanh().sum("lane")
    )
    x = random_array(rng, spec(f32, lane=64))
    (got,) = accy.reference.run(program, [x])
    np.testing.assert_allclose(got, np.tanh(np.exp(x * 2.0) * 3.0).sum(), rtol=1e-5)


def test_graph_re_emits_the_same_program_with_the_same_ids():
    program = elementwise_loss()
    copy = run(program, graph("grad_elementwise"))
    assert str(copy) == str(program)
    assert [op.id for op in copy.operations] == [op.id for op in program.operations]


def test_graph_preserves_ids_that_differ_from_positions():
    text = str(elementwise_loss())
    text = text.replace(": f32[lane=4]\n  %3", ": f32[lane=4] @40\n  %3").replace(
        "op=sum} : f32[]", "op=sum} : f32[] @synthetic"
    )
    program = parse(text)
    assert [op.id for op in program.operations] == [0, 1, 40, 3, SYNTHETIC_ID]
    copy = run(program, graph("grad_elementwise"))
    assert [op.id for op in copy.operations] == [0, 1, 40, 3, SYNTHETIC_ID]
    assert str(copy) == text


def test_traced_operations_have_their_own_ids_and_synthetic_id_is_minus_one():
    assert accy.SYNTHETIC_ID == accy.core.SYNTHETIC_ID == accy.interpret.SYNTHETIC_ID == -1
    program = elementwise_loss()
    assert [op.id for op in program.operations] == list(range(5))
    assert not any(op.is_synthetic for op in program.operations)


# ---------------------------------------------------------------------------------------------
# bind(handler): per-kind methods, a catch-all, ctx.default(), ctx.builder_handle()


class DoubleProducts:
    """Replaces every mul by twice the product; counts what it saw."""

    def __init__(self):
        self.muls = 0

    def mul(self, ctx):
        self.muls += 1
        assert ctx.op.kind == "mul" and len(ctx.args) == 2
        product = ctx.default()
        return ctx.builder_handle().mul(product, 2.0)


def test_bound_handler_method_replaces_its_kind(rng):
    handler = DoubleProducts()
    doubled = run(elementwise_loss(), bind(handler).attach(graph()))
    assert handler.muls == 1
    assert doubled.count("mul") == 2
    x, y = random_array(rng, spec(f32, lane=4)), random_array(rng, spec(f32, lane=4))
    np.testing.assert_allclose(evaluate_one(doubled, x, y), 2 * (x * y).sum(), rtol=1e-6)


def test_context_default_is_what_the_layers_below_give():
    results = {}

    class Spy:
        def reduce(self, ctx):
            results["default"] = ctx.default()
            return results["default"]

    below = graph()
    copy = run(elementwise_loss(), bind(Spy()).attach(below))
    assert isinstance(results["default"], accy.Value)
    assert results["default"].builder is below.builder
    assert results["default"].ty == spec(f32)
    assert copy.count("reduce") == 1


def test_builder_handle_is_the_builder_at_the_bottom_of_the_stack():
    builder = Builder("bottom")
    handles = []

    class Handle:
        def constant(self, ctx):
            handles.append(ctx.builder_handle())
            return ctx.default()

    stack = bind(Handle()).attach(bind(object()).attach(Graph(builder)))
    assert stack.builder_handle() is builder
    run(elementwise_loss(), stack)
    assert handles == [builder]


def test_catch_all_bind_sees_every_kind_that_has_no_method():
    class CatchAll:
        def __init__(self):
            self.caught, self.muls = [], 0

        def mul(self, ctx):
            self.muls += 1
            return ctx.default()

        def bind(self, ctx):
            self.caught.append(ctx.op.kind)
            return ctx.default()

    handler = CatchAll()
    copy = run(elementwise_loss(), bind(handler).attach(graph()))
    assert handler.caught == ["parameter", "parameter", "constant", "reduce"]
    assert handler.muls == 1
    assert copy.count("mul") == 1


def test_handler_without_a_method_for_a_kind_passes_it_down():
    copy = run(elementwise_loss(), bind(object()).attach(graph("grad_elementwise")))
    assert str(copy) == str(elementwise_loss())


def test_layers_see_operations_outermost_first():
    calls = []

    class Named:
        def __init__(self, name):
            self.name = name

        def mul(self, ctx):
            calls.append(f"{self.name} before")
            result = ctx.default()
            calls.append(f"{self.name} after")
            return result

    stack = bind(Named("outer")).attach(bind(Named("inner")).attach(graph()))
    run(elementwise_loss(), stack)
    assert calls == ["outer before", "inner before", "inner after", "outer after"]


def test_operations_emitted_on_the_builder_handle_skip_the_layers():
    class CountConstants:
        def __init__(self):
            self.count = 0

        def constant(self, ctx):
            self.count += 1
            return ctx.default()

    outer, inner = CountConstants(), CountConstants()
    stack = bind(outer).attach(bind(DoubleProducts()).attach(bind(inner).attach(graph())))
    doubled = run(elementwise_loss(), stack)
    # The 2.0 that DoubleProducts emits goes straight to the builder: no layer sees it.
    assert doubled.count("constant") == 2
    assert (outer.count, inner.count) == (1, 1)


def test_emitter_sends_generated_operations_through_the_layers_as_synthetic():
    class Counter:
        def __init__(self):
            self.synthetic, self.traced = [], []

        def bind(self, ctx):
            (self.synthetic if ctx.op.id == SYNTHETIC_ID else self.traced).append(ctx.op.kind)
            return ctx.default()

    counter = Counter()
    builder = Builder("generated")
    stack = bind(counter).attach(Graph(builder))
    emit = Emitter(stack)
    x = builder.parameter(spec(f32, lane=4))
    y = emit.mul(emit.unary("exp", x), 3.0)
    program = builder.build(emit.sum(y, "lane"))
    assert counter.traced == []
    assert counter.synthetic == [
        "unary",
        "constant",
        "broadcast_in_dim",
        "mul",
        "constant",
        "reduce",
    ]
    assert [op.id for op in program.operations][1:] == [SYNTHETIC_ID] * 6
    assert emit.builder_handle() is builder
    xs = np.array([0.0, 1.0, -1.0, 2.0], np.float32)
    np.testing.assert_allclose(evaluate_one(program, xs), 3 * np.exp(xs).sum(), rtol=1e-6)


def test_layer_subclass_and_attach_compose_semantics():
    class RenameOutputs(Layer):
        def finish(self, outputs):
            program = self.next.finish(outputs)
            return program.name

    assert attach(None, "next") == "next"
    assert run(elementwise_loss(), attach(RenameOutputs, graph("named"))) == "named"
    handled = attach(DoubleProducts(), graph())
    assert run(elementwise_loss(), handled).count("mul") == 2
    assert run(elementwise_loss(), attach(bind(DoubleProducts()), graph())).count("mul") == 2


# ---------------------------------------------------------------------------------------------
# builder.call inlines another program


def test_call_inlines_a_program_and_composes_with_traced_code(rng):
    square_sum = trace([spec(f32, lane=4)], lambda b, a: (a[0] * a[0]).sum("lane"), name="sq")
    program = trace(
        [spec(f32, lane=4)], lambda b, a: b.call(square_sum, [a[0] + 1.0]) * 0.5, name="caller"
    )
    assert program.count("parameter") == 1
    assert program.count("reduce") == 1
    x = random_array(rng, spec(f32, lane=4))
    np.testing.assert_allclose(evaluate_one(program, x), 0.5 * ((x + 1) ** 2).sum(), rtol=1e-6)


def test_call_returns_a_tuple_for_several_outputs_and_inlines_scans(rng):
    body = accy.trace.define("body", [spec(f32, c=2)] * 2, lambda b, a: (a[0] + a[1], a[0]))
    callee = trace(
        [spec(f32, c=2), spec(f32, t=3, c=2)],
        lambda b, a: b.scan(body, carries=[a[0]], xs=[a[1]], axis="t")[0] + (a[0],),
        name="callee",
    )

    def caller(b, a):
        total, start = b.call(callee, [a[0], a[1]])
        return total - start

    program = trace([spec(f32, c=2), spec(f32, t=3, c=2)], caller)
    assert program.contains_scan()
    init, xs = random_array(rng, spec(f32, c=2)), random_array(rng, spec(f32, t=3, c=2))
    assert_same(evaluate_one(program, init, xs), (init + xs.sum(axis=0)) - init, rtol=1e-6)


def test_call_lays_out_an_argument_with_the_same_axes_in_another_order(rng):
    callee = trace([spec(f32, a=2, b=3)], lambda b, a: a[0].slice("b", 0, 1), name="first_col")
    program = trace([spec(f32, b=3, a=2)], lambda b, a: b.call(callee, [a[0]]))
    x = random_array(rng, spec(f32, b=3, a=2))
    assert_same(evaluate_one(program, x), x.T[:, 0:1])


def test_a_called_program_can_be_called_twice_and_nested():
    double = trace([spec(i32, n=2)], lambda b, a: a[0] * 2, name="double")
    quadruple = trace([spec(i32, n=2)], lambda b, a: b.call(double, [b.call(double, a)]))
    program = trace([spec(i32, n=2)], lambda b, a: b.call(quadruple, a) + b.call(double, a))
    assert program.count("mul") == 3
    assert_same(evaluate_one(program, np.array([1, -3], np.int32)), np.array([6, -18], np.int32))


# ---------------------------------------------------------------------------------------------
# scan with a body program


def test_scan_with_a_body_program_matches_a_numpy_loop(rng):
    """h' = tanh(h @ w + x); y = sum of h'. w is a const, h a carry, x the scanned slices."""
    f64 = accy.f64
    w_t, h_t, xs_t = spec(f64, i=3, o=3), spec(f64, i=3), spec(f64, t=6, o=3)

    def step(b, a):
        w, h, x = a
        new_h = (h.contract(w, "i") + x).tanh().rename("o", "i")
        return new_h, new_h.sum("i")

    body = accy.trace.define("rnn_step", [w_t, h_t, spec(f64, o=3)], step)

    def rnn(b, a):
        carries, ys = b.scan(body, consts=[a[0]], carries=[a[1]], xs=[a[2]], axis="t")
        return carries + ys

    program = trace([w_t, h_t, xs_t], rnn)
    assert program.output_types == (h_t, spec(f64, t=6))
    w, h0, xs = random_array(rng, w_t), random_array(rng, h_t), random_array(rng, xs_t)
    h, expected_ys = h0, []
    for t in range(6):
        h = np.tanh(h @ w + xs[t])
        expected_ys.append(h.sum())
    final, ys = evaluate(program, w, h0, xs)
    assert_same(final, h, rtol=1e-12)
    assert_same(ys, np.array(expected_ys), rtol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_over_a_middle_axis_with_consts_carries_and_several_xs(rng, reverse):
    xs_t, zs_t = spec(f32, c=2, t=4), spec(i32, t=4)

    def step(b, a):
        scale, carry, x, z = a
        new_carry = carry * scale + x * z.convert(f32)
        return new_carry, new_carry.max("c"), z + 1

    body = accy.trace.define("step", [spec(f32), spec(f32, c=2), spec(f32, c=2), spec(i32)], step)

    def scanned(b, a):
        carries, ys = b.scan(
            body, consts=[a[0]], carries=[a[1]], xs=[a[2], a[3]], axis="t", reverse=reverse
        )
        return carries + ys

    program = trace([spec(f32), spec(f32, c=2), xs_t, zs_t], scanned)
    assert program.output_types == (spec(f32, c=2), spec(f32, t=4), spec(i32, t=4))
    scale, carry0 = np.float32(0.5), random_array(rng, spec(f32, c=2))
    xs, zs = random_array(rng, xs_t), random_array(rng, zs_t)
    carry, maxima, bumped = carry0, np.zeros(4, np.float32), np.zeros(4, np.int32)
    for t in reversed(range(4)) if reverse else range(4):
        carry = carry * scale + xs[:, t] * np.float32(zs[t])
        maxima[t], bumped[t] = carry.max(), zs[t] + 1
    final, got_maxima, got_bumped = evaluate(program, scale, carry0, xs, zs)
    assert_same(final, carry, rtol=1e-6)
    assert_same(got_maxima, maxima, rtol=1e-6)
    assert_same(got_bumped, bumped)


def test_scan_over_an_empty_axis_returns_the_initial_carries_and_empty_ys():
    body = accy.trace.define("body", [spec(f32, c=2)] * 2, lambda b, a: (a[0] + a[1], a[1]))

    def scanned(b, a):
        carries, ys = b.scan(body, carries=[a[0]], xs=[a[1]], axis="t")
        return carries + ys

    program = trace([spec(f32, c=2), spec(f32, t=0, c=2)], scanned)
    init = np.array([1.0, 2.0], np.float32)
    final, ys = evaluate(program, init, np.zeros((0, 2), np.float32))
    assert_same(final, init)
    assert_same(ys, np.zeros((0, 2), np.float32))
